//! Algorithm selection at run time: NCCL_ALGO / NCCL_PROTO force or forbid algorithms; the
//! double binary tree all-reduce over (simulated) hosts gives exact results; settings that
//! leave a collective nothing to run fail that call, naming why, and the communicator goes on.

use oxccl::{Communicator, Config, Error, Rank, ReduceOp};
use oxccl_core::tuner::Enabled;
use std::time::Duration;

/// Runs `f` on `n` ranks as threads, rank `r` on host `r / per_host`.
fn threads<T: Send + 'static>(
    n: usize,
    per_host: usize,
    config: Config,
    f: impl Fn(Communicator) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    let id = oxccl::new_unique_id(&config).unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let config = config.clone().with_host_id(&format!("host{}", r / per_host));
            std::thread::spawn(move || f(Communicator::init(&id, n, Rank::new(r), config).unwrap()))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn with_algo(algo: Option<&str>, proto: Option<&str>) -> Config {
    let mut c = Config::default().with_timeout(Some(Duration::from_secs(60)));
    c.enabled = Enabled::parse(algo, proto).unwrap();
    c
}

#[test]
fn forced_tree_all_reduce_is_exact_across_hosts() {
    // 6 ranks on 3 hosts of 2 (shared memory inside a host, TCP between), and 5 ranks each on
    // its own host.
    for (n, per_host) in [(6usize, 2usize), (5, 1)] {
        let out = threads(n, per_host, with_algo(Some("tree"), None), move |c| {
            let r = c.rank().idx() as u32;
            let mut results = Vec::new();
            for count in [1usize, 2, 1000, 300_001] {
                let send: Vec<u32> = (0..count as u32).map(|i| (i % 1013) * (r + 1)).collect();
                let mut sum = vec![0u32; count];
                c.all_reduce(&send, &mut sum, ReduceOp::Sum).unwrap();
                let mut max = send.clone();
                c.all_reduce_in_place(&mut max, ReduceOp::Max).unwrap();
                results.push((count, sum, max));
            }
            results
        });
        let p = n as u32;
        for (rank, results) in out.iter().enumerate() {
            for (count, sum, max) in results {
                for i in 0..*count {
                    let base = (i as u32) % 1013;
                    assert_eq!(sum[i], base * p * (p + 1) / 2, "n={n} rank {rank} count {count} elem {i}");
                    assert_eq!(max[i], base * p, "n={n} rank {rank} count {count} elem {i}");
                }
            }
        }
    }
}

#[test]
fn settings_that_leave_a_collective_nothing_fail_that_call_and_only_that_call() {
    let out = threads(3, 3, with_algo(Some("tree"), None), |c| {
        let send = vec![1u32; 8];
        let mut recv = vec![0u32; 24];
        let e = c.all_gather(&send, &mut recv).unwrap_err();
        // The communicator is fine: the all-reduce the setting allows still runs.
        let mut v = vec![c.rank().0 + 1; 8];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        (e, v)
    });
    for (e, v) in out {
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        assert!(
            e.to_string()
                .contains("NCCL_ALGO=tree leaves allgather nothing that can run: Tree runs only all-reduce"),
            "{e}"
        );
        assert_eq!(v, vec![6; 8]);
    }
    // Tree needs 3 ranks; LL is not on CPU connections yet.
    let out = threads(2, 1, with_algo(Some("tree"), None), |c| {
        let mut v = vec![1u32; 4];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap_err().to_string()
    });
    assert!(out.iter().all(|e| e.contains("Tree needs at least 3 ranks")), "{out:?}");
    let out = threads(2, 2, with_algo(None, Some("LL")), |c| {
        let mut v = vec![1u32; 4];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap_err().to_string()
    });
    assert!(out.iter().all(|e| e.contains("NCCL_PROTO=LL") && e.contains("Simple protocol only")), "{out:?}");
}

#[test]
fn forced_ring_skips_the_direct_path_and_stays_exact() {
    let out = threads(4, 4, with_algo(Some("ring"), None), |c| {
        let r = c.rank().0;
        let mut v: Vec<u64> = (0..5000u64).map(|i| i + r as u64).collect();
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        let mut b = vec![r; 100];
        c.broadcast_in_place(&mut b, Rank(2)).unwrap();
        (v, b)
    });
    for (v, b) in out {
        assert!(v.iter().enumerate().all(|(i, x)| *x == 4 * i as u64 + 6));
        assert_eq!(b, vec![2; 100]);
    }
}

#[test]
fn a_malformed_setting_fails_init_naming_the_variable() {
    let e = Config::from_lookup(|k| (k == "NCCL_ALGO").then(|| "rign".to_string())).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("NCCL_ALGO") && s.contains("rign") && s.contains("unknown name"), "{s}");
    let e = Config::from_lookup(|k| (k == "NCCL_PROTO").then(|| "LL;tree:LL".to_string())).unwrap_err();
    assert!(e.to_string().contains("NCCL_PROTO"), "{e}");
}

#[test]
fn log_lines_follow_nccl_debug_subsys_and_go_to_nccl_debug_file() {
    if let Some(_ctx) = oxccl_testkit::child("log") {
        let c = Communicator::from_env().unwrap();
        let mut v = vec![1u32; 1000];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v[0], 3);
        return;
    }
    let dir = oxccl_testkit::Launch::scratch().join("logs");
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("nccl.%h.%p.log");
    let l =
        oxccl_testkit::Launch::new("log_lines_follow_nccl_debug_subsys_and_go_to_nccl_debug_file", "log", 3)
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "GRAPH")
            .env("NCCL_DEBUG_FILE", pattern.to_str().unwrap())
            .env("OXCCL_DIRECT", "0")
            .env("OXCCL_UNIQUE_ID_FILE", dir.join("unique-id").to_str().unwrap());
    let done = l.run().unwrap_or_else(|e| panic!("{e}"));
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let pid = name.split('.').nth(2).unwrap();
        for line in text.lines() {
            assert!(line.contains(&format!(":{pid}:")) && line.contains(" NCCL INFO "), "{name}: {line}");
        }
        assert!(text.contains("NCCL INFO Channel 00/01 : 0 1 2"), "{name}: {text}");
        assert!(text.contains("NCCL INFO Trees [0]"), "{name}: {text}");
        // INIT-only lines (connections, buffering) are not in GRAPH.
        assert!(!text.contains("via SHM") && !text.contains("buffering"), "{name}: {text}");
    }
    // Nothing went to stderr.
    for d in &done {
        assert!(!d.stderr.contains("NCCL INFO"), "rank {}: {}", d.rank, d.stderr);
    }
}
