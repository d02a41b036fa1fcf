//! Short oxccl-perf sweeps of every benchmark, checks on (not timed): the nccl-tests layout,
//! zero wrong elements, exit code 0 — and a corrupted result (the test-only fault hook) makes
//! the run fail.

use std::process::{Command, Output};

oxccl_testkit::test_scope!();

const EXE: &str = env!("CARGO_BIN_EXE_oxccl-perf");

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(EXE);
    c.args(args).env("OXCCL_TIMEOUT", "60");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run oxccl-perf")
}

fn check_layout(bench: &str, out: &str) {
    for needle in [
        &format!("# Collective test starting: {bench}") as &str,
        "# Using devices",
        "#  Rank  0 Group  0 Pid",
        "out-of-place                       in-place",
        "(B)    (elements)",
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : ",
        &format!("# Collective test concluded: {bench}"),
    ] {
        assert!(out.contains(needle), "{bench}: missing {needle:?} in\n{out}");
    }
}

#[test]
fn every_benchmark_sweeps_correctly() {
    let benches = [
        "all_reduce_perf",
        "all_gather_perf",
        "broadcast_perf",
        "reduce_scatter_perf",
        "reduce_perf",
        "alltoall_perf",
        "gather_perf",
        "scatter_perf",
        "sendrecv_perf",
        "hypercube_perf",
    ];
    for (shm_off, np, reg) in [("0", "3", "1"), ("0", "4", "0"), ("1", "2", "1")] {
        for b in benches {
            let np = if b == "hypercube_perf" && np == "3" { "2" } else { np };
            let o = run(
                &[b, "-np", np, "-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1", "-R", reg],
                &[("NCCL_SHM_DISABLE", shm_off)],
            );
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success(),
                "{b} -np {np} NCCL_SHM_DISABLE={shm_off}: exit {:?}\n{out}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
            check_layout(b, &out);
            let rows =
                out.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count();
            assert_eq!(rows, 6, "{b}: expected 6 result rows (8 B .. 256 KiB, ×8)\n{out}");
        }
    }
}

#[test]
fn every_type_and_op_and_root() {
    let o = run(
        &[
            "all_reduce_perf",
            "-np",
            "3",
            "-b",
            "64",
            "-e",
            "8K",
            "-f",
            "16",
            "-n",
            "2",
            "-d",
            "all",
            "-o",
            "all",
        ],
        &[],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    // 12 types; sum/prod/max/min/avg on each (bitwise ops are not in nccl-tests' "all").
    let rows = out.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count();
    assert_eq!(rows, 12 * 5 * 2, "{out}");
    assert!(out.contains("# Out of bounds values : 0 OK"));
    let o = run(
        &[
            "reduce_perf",
            "-np",
            "3",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "2",
            "-r",
            "all",
            "-d",
            "bfloat16",
            "-o",
            "max",
        ],
        &[],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    for root in 0..3 {
        assert!(
            out.lines().any(|l| l.contains("bfloat16")
                && l.contains("max")
                && l.split_whitespace().nth(4) == Some(&root.to_string())),
            "root {root} missing:\n{out}"
        );
    }
}

#[test]
fn a_corrupted_result_fails_the_run() {
    let o = run(
        &["all_reduce_perf", "-np", "2", "-b", "1K", "-e", "1K", "-n", "2"],
        &[("OXCCL_PERF_CORRUPT_RESULT", "1")],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "a corrupted result must fail the run:\n{out}");
    assert!(out.contains("FAILED"), "{out}");
    let row = out.lines().find(|l| l.trim_start().starts_with("1024")).expect("result row");
    let wrong: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(wrong[8], "1", "one wrong element out of place: {row}");
}

#[test]
fn json_and_plot() {
    let dir = std::env::temp_dir().join(format!("oxccl-perf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let svg = dir.join("r.svg");
    let o = run(
        &[
            "all_gather_perf",
            "-np",
            "2",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "2",
            "-J",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(j.contains("\"results\"") && j.contains("\"bus_bw\"") && j.contains("\"out_of_bounds\""), "{j}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.contains("<polyline"), "{s}");
    // Overlay mode reads JSON files back.
    let svg2 = dir.join("overlay.svg");
    let o = Command::new(EXE)
        .args(["--plot", svg2.to_str().unwrap(), json.to_str().unwrap(), json.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(std::fs::read_to_string(&svg2).unwrap().matches("<polyline").count(), 4);
    // A title says what the plot shows instead of the first file's path.
    let svg3 = dir.join("titled.svg");
    let o = Command::new(EXE)
        .args([
            "--plot",
            svg3.to_str().unwrap(),
            "--title",
            "all_reduce, 2 ranks, heap buffers",
            json.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let titled = std::fs::read_to_string(&svg3).unwrap();
    assert!(
        titled.contains("all_reduce, 2 ranks, heap buffers") && !titled.contains(json.to_str().unwrap()),
        "{titled}"
    );
    let o = Command::new(EXE).args(["--plot", svg3.to_str().unwrap(), "--title"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--title needs a text"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_flags_are_reported() {
    let o = run(&["all_reduce_perf", "-b", "64M", "-e", "8"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("minbytes"));
    let o = run(&["all_reduce_perf", "-d", "float", "-o", "bxor", "-b", "8", "-e", "8"], &[]);
    assert!(!o.status.success(), "a bitwise op on floats must fail");
}

/// `-t N`: ranks as threads of one process (and with `-np`, threads of several processes),
/// every benchmark checked; the header says how many threads each process runs.
#[test]
fn ranks_as_threads_sweep_correctly() {
    for b in
        ["all_reduce_perf", "alltoall_perf", "reduce_perf", "sendrecv_perf", "hypercube_perf", "scatter_perf"]
    {
        for (np, t) in [(None, "3"), (Some("2"), "2")] {
            let t = if b == "hypercube_perf" { "2" } else { t };
            let mut args = vec![b, "-t", t, "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1"];
            if let Some(np) = np {
                args.extend(["-np", np]);
            }
            let o = run(&args, &[]);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success(),
                "{b} -t {t} -np {np:?}: exit {:?}\n{out}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
            check_layout(b, &out);
            assert!(out.contains(&format!("# nThread {t} nGpus 1")), "{out}");
            let ranks = t.parse::<usize>().unwrap() * np.map_or(1, |n| n.parse::<usize>().unwrap());
            assert!(out.contains(&format!("#  Rank {:2} Group", ranks - 1)), "{ranks} ranks expected\n{out}");
        }
    }
}

/// `--mem device` without CUDA (CI), or with every GPU hidden (`CUDA_VISIBLE_DEVICES` empty,
/// so a GPU machine runs the test too): a clean error that says so, exit 2, no panic.
#[test]
fn device_buffers_without_cuda_fail_cleanly() {
    for extra in [&[][..], &["-t", "2"][..]] {
        let mut args = vec!["all_reduce_perf", "--mem", "device", "-b", "8", "-e", "8"];
        args.extend_from_slice(extra);
        let o = run(&args, &[("CUDA_VISIBLE_DEVICES", "")]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("--mem device: no CUDA"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
