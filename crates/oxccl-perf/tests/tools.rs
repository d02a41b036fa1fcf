//! The `oxccl topo`, `oxccl explain`, `oxccl sim --bootstrap` and `oxccl env` commands, run as a user runs them.

use std::process::Command;

oxccl_testkit::test_scope!();

fn fixture(name: &str) -> String {
    format!("{}/../../fixtures/topo/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn oxccl(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oxccl"));
    c.args(args).env_remove("NCCL_ALGO").env_remove("NCCL_PROTO").env_remove("NCCL_TOPO_FILE");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn topo_prints_the_matrix_rings_and_trees_and_draws_and_dumps() {
    let dir = std::env::temp_dir().join(format!("oxccl-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("dgx.svg");
    let dump = dir.join("dgx.json");
    let (rc, out, err) = oxccl(
        &[
            "topo",
            "--topo",
            &fixture("dgx-h100.json"),
            "--svg",
            svg.to_str().unwrap(),
            "--dump",
            dump.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("GPU0     X     NV18"), "{out}");
    assert!(out.contains("channel 0 ring: 0 → 1 → 2 → 3 → 4 → 5 → 6 → 7"), "{out}");
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    // The dump, loaded through NCCL_TOPO_FILE, prints the same matrix.
    let (rc, again, err) = oxccl(&["topo"], &[("NCCL_TOPO_FILE", dump.to_str().unwrap())]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(again.lines().take(10).collect::<Vec<_>>(), out.lines().take(10).collect::<Vec<_>>());
    // This machine's own topology prints too (no GPUs here is fine).
    let (rc, _, err) = oxccl(&["topo"], &[]);
    assert_eq!(rc, 0, "{err}");
    let (rc, _, err) = oxccl(&["topo", "--topo", "/nonexistent.json"], &[]);
    assert_eq!(rc, 1);
    assert!(err.contains("/nonexistent.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `oxccl topo --ranks N --hosts H [--rails R]`: the interfaces between hosts with their
/// speed and where it comes from, then the hierarchy: the rings inside and between hosts and
/// the rail of each channel; `oxccl explain --rails` prices the rails and shows the same.
#[test]
fn topo_and_explain_show_the_hierarchy_and_the_rail_of_each_channel() {
    let (rc, out, err) =
        oxccl(&["topo", "--ranks", "8", "--hosts", "4", "--rails", "2"], &[("OXCCL_NET_GBIT", "25")]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("between hosts: rail 0: ") && out.contains("25 Gbit/s (OXCCL_NET_GBIT)"), "{out}");
    assert!(
        out.contains("hierarchy (Hier): 4 hosts × 2 ranks, 2 channel(s) between hosts over 2 rail(s)"),
        "{out}"
    );
    assert!(out.contains("index 0: 0 2 4 6 | index 1: 1 3 5 7"), "{out}");
    assert!(out.contains("channel 0: rail 0 | channel 1: rail 1"), "{out}");
    let (rc, out, err) = oxccl(&["topo", "--ranks", "4", "--hosts", "4"], &[]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("hierarchy: none (4 host(s) × 1 rank(s)"), "{out}");
    for (args, want) in [
        (vec!["topo", "--ranks", "7", "--hosts", "2"], "must be a multiple of the hosts"),
        (vec!["topo", "--ranks", "8"], "--hosts"),
        (vec!["topo", "--ranks", "8", "--hosts", "2", "--rails", "9"], "not a rail count (1 to 8)"),
        (vec!["explain", "allreduce", "--ranks", "8", "--hosts", "2", "--rails", "2"], "--link-gbit"),
    ] {
        let (rc, _, err) = oxccl(&args, &[]);
        assert_ne!(rc, 0, "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let (rc, out, err) = oxccl(
        &["explain", "allreduce", "--ranks", "8", "--hosts", "4", "--link-gbit", "1", "--rails", "2"],
        &[],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("0.125 GB/s per stream, 0.250 GB/s per host"), "{out}");
    assert!(out.contains("channel 0: rail 0 | channel 1: rail 1") && out.contains("Hier/Simple ×"), "{out}");
}

#[test]
fn explain_prints_every_candidate_and_honours_overrides() {
    let dgx16 = fixture("dgx-h100-x16.json");
    let (rc, out, err) = oxccl(&["explain", "all_reduce", "--ranks", "128", "--topo", &dgx16], &[]);
    assert_eq!(rc, 0, "{err}");
    let choice = |bytes: &str| -> String {
        let line = out.lines().find(|l| l.split_whitespace().next() == Some(bytes)).unwrap();
        line.split("   ").last().unwrap().to_string()
    };
    assert!(choice("8").starts_with("Tree/"), "{out}");
    assert!(choice("268435456").starts_with("Ring/"), "{out}");
    assert_eq!(out.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).count(), 30);
    let (rc, out, _) = oxccl(&["explain", "allgather", "--topo", &dgx16], &[("NCCL_ALGO", "tree")]);
    assert_eq!(rc, 0);
    assert!(out.contains("none: NCCL_ALGO=tree leaves all_gather nothing that can run here: Tree/LL: Tree runs only all-reduce"), "{out}");
    let (rc, out, _) = oxccl(&["explain", "allreduce", "--topo", &dgx16], &[("NCCL_PROTO", "Simple")]);
    assert_eq!(rc, 0);
    assert!(out.lines().skip(3).all(|l| l.contains("/Simple ×")), "{out}");
    let (rc, _, err) = oxccl(&["explain", "allreduce", "--topo", &dgx16], &[("NCCL_ALGO", "rign")]);
    assert_eq!(rc, 1);
    assert!(err.contains("unknown name \"rign\""), "{err}");
    // Without a topology: this host's CPU ranks, priced from its calibration.
    let (rc, out, err) = oxccl(&["explain", "allreduce", "--ranks", "4"], &[]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("on 4 ranks, 1 host(s)") && out.contains("Direct/Simple ×"), "{out}");
    let (rc, out, err) = oxccl(&["explain", "allreduce", "--ranks", "4"], &[("OXCCL_DIRECT", "0")]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("Ring/Simple ×"), "{out}");
    let (rc, _, err) = oxccl(&["explain", "allreduce", "--ranks", "999", "--topo", &dgx16], &[]);
    assert_eq!(rc, 1);
    assert!(err.contains("the topology has 128 GPUs"), "{err}");
}

/// `oxccl sim --bootstrap`: the model's table, sparse rounds growing as log N (2 + depth + 11)
/// and dense as N, the dense root sending N tables; beside one root, the root count the model
/// finds fastest (two more rounds: the roots' reports and tables), which brings 100,000 ranks
/// under 1 s (issue 40's target).
#[test]
fn sim_bootstrap_prints_the_model_dense_against_sparse() {
    let cluster = format!("{}/../../fixtures/clusters/summit.json", env!("CARGO_MANIFEST_DIR"));
    let (rc, out, err) = oxccl(&["sim", "--bootstrap", "--cluster", &cluster, "--ranks", "1024,100000"], &[]);
    assert_eq!(rc, 0, "{err}");
    // ranks mode roots rounds messages root0-out (value unit) conns/rank joins roots table decode conn total
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .filter(|r: &Vec<&str>| r.len() >= 14)
        .collect();
    assert_eq!(rows.len(), 8, "{out}");
    let one = |n: &str, mode: &str| {
        rows.iter().find(|r| r[0] == n && r[1] == mode && r[2] == "1").expect(mode).clone()
    };
    let many = |n: &str, mode: &str| {
        rows.iter().find(|r| r[0] == n && r[1] == mode && r[2] != "1").expect(mode).clone()
    };
    assert_eq!(one("1024", "sparse")[3], "23"); // 2 + 10 + 11
    assert_eq!(one("100000", "sparse")[3], "29"); // 2 + 16 + 11
    assert_eq!(one("100000", "dense")[3], "100001");
    assert_eq!(many("100000", "sparse")[3], "31");
    // N tables of N entries of 134 bytes (the measured codec: protocol 12's entry, CUDA device,
    // rails, machine and link speed included).
    assert_eq!(one("100000", "dense")[5..7], ["1.34", "TB"]);
    let total = |r: Vec<&str>| r.last().unwrap().parse::<f64>().unwrap();
    assert!(total(one("100000", "sparse")) < total(one("100000", "dense")) / 10.0, "{out}");
    assert!(total(many("100000", "sparse")) <= 1.0, "{out}");
    let (rc, _, err) = oxccl(&["sim", "--bootstrap", "--cluster", &cluster, "--join-us", "-1"], &[]);
    assert_ne!(rc, 0);
    assert!(err.contains("--join-us"), "{err}");
}

/// A file from outside that is not what it should be (a topology with a number written "+1",
/// a cluster cut short, a dump with a lone surrogate): the command fails with one line naming
/// the file, the line and column, and what was wrong; never a panic.
#[test]
fn malformed_files_are_refused_naming_the_file_and_the_place() {
    let dir = std::env::temp_dir().join(format!("oxccl-tools-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let put = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let topo = put("topo.json", "{\"oxccl_topo\": 1,\n \"hosts\": [{\"name\": \"h\", \"repeat\": +2}]}");
    let (rc, _, err) = oxccl(&["topo", "--topo", &topo], &[]);
    assert_eq!(rc, 1);
    assert_eq!(err, format!("oxccl topo: {topo}: topology file: expected value at line 2 column 36\n"));
    let (rc, _, err) = oxccl(&["topo"], &[("NCCL_TOPO_FILE", &topo)]);
    assert_eq!(rc, 1);
    assert_eq!(
        err,
        format!("oxccl topo: NCCL_TOPO_FILE={topo}: topology file: expected value at line 2 column 36\n")
    );
    let cluster = put("cluster.json", "{\"name\": \"c\",\n \"gpus_per_node\": 4,\n \"intra\": {\"gbs\": ");
    let (rc, _, err) = oxccl(&["sim", "--bootstrap", "--cluster", &cluster], &[]);
    assert_ne!(rc, 0);
    assert!(
        err.contains(&format!("{cluster}: cluster: EOF while parsing a value at line 3 column 18")),
        "{err}"
    );
    let dump = put("dump.json", "{\"oxccl_flight_recorder\": 1, \"reason\": \"\\ud800\"}");
    let (rc, _, err) = oxccl(&["analyze", &dump], &[]);
    assert_eq!(rc, 1);
    assert_eq!(err, format!("oxccl analyze: {dump}: unexpected end of hex escape at line 1 column 47\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn env_prints_every_variable_with_its_value_and_refuses_a_bad_setting() {
    let (rc, out, err) = oxccl(&["env"], &[("NCCL_BUFFSIZE", "2097152")]);
    assert_eq!(rc, 0, "{err}");
    for v in oxccl_core::variables::ALL {
        let line = out.lines().find(|l| l.split_whitespace().next() == Some(v.name));
        let line = line.unwrap_or_else(|| panic!("{} missing:\n{out}", v.name));
        if v.name == "NCCL_BUFFSIZE" {
            assert!(line.ends_with("\"2097152\""), "{line}");
        } else if std::env::var_os(v.name).is_none() {
            assert!(line.contains(&format!("unset (default: {})", v.default)), "{line}");
        }
        assert!(out.contains(v.meaning), "{}'s meaning missing", v.name);
    }
    assert!(out.ends_with("# the settings parse\n"), "{out}");
    let (rc, _, err) = oxccl(&["env"], &[("NCCL_BUFFSIZE", "3")]);
    assert_eq!(rc, 1);
    assert_eq!(err, "oxccl env: setting NCCL_BUFFSIZE=\"3\": must be within 4096..=1073741824 bytes\n");
}
