//! Algorithm selection at run time: NCCL_ALGO / NCCL_PROTO force or forbid algorithms; the
//! double binary tree all-reduce over (simulated) hosts gives exact results; settings that
//! leave a collective nothing to run fail that call, naming why, and the communicator goes on.

use oxccl::{Communicator, Config, Error, Rank, ReduceOp};
use oxccl_core::tuner::Enabled;
use oxccl_testkit::threads;
use std::time::Duration;

oxccl_testkit::test_scope!();

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
fn one_shot_over_sockets_is_exact_up_to_its_bound_and_beyond() {
    // Over sockets (ranks on separate hosts, or shared memory off) the one-shot exchange serves
    // all-reduce up to tuning::ONE_SHOT_NET_MAX_BYTES (hosts of one rank, of two: shared memory
    // inside, sockets between; one host with shared memory off); the counts straddle both bounds.
    let bound = oxccl_core::tuning::ONE_SHOT_NET_MAX_BYTES / 4;
    let counts = [1usize, 1024, 1025, bound - 1, bound, bound + 1];
    let off = Config::default().with_timeout(Some(Duration::from_secs(60))).with_shm_disabled(true);
    for (n, per_host, config) in
        [(4usize, 1usize, with_algo(None, None)), (6, 2, with_algo(None, None)), (3, 3, off)]
    {
        let out = threads(n, per_host, config, move |c| {
            let r = c.rank().idx() as u32;
            counts
                .iter()
                .map(|&count| {
                    let send: Vec<u32> = (0..count as u32).map(|i| (i % 977) * (r + 1)).collect();
                    let mut sum = vec![0u32; count];
                    c.all_reduce(&send, &mut sum, ReduceOp::Sum).unwrap();
                    let mut max = send.clone();
                    c.all_reduce_in_place(&mut max, ReduceOp::Max).unwrap();
                    (sum, max)
                })
                .collect::<Vec<_>>()
        });
        let p = n as u32;
        for (rank, results) in out.iter().enumerate() {
            for (&count, (sum, max)) in counts.iter().zip(results) {
                for i in 0..count {
                    let base = (i as u32) % 977;
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
                .contains("NCCL_ALGO=tree leaves all_gather nothing that can run: Tree runs only all-reduce"),
            "{e}"
        );
        assert_eq!(v, vec![6; 8]);
    }
    // Tree needs 3 ranks; a setting that leaves a collective no protocol names it.
    let out = threads(2, 1, with_algo(Some("tree"), None), |c| {
        let mut v = vec![1u32; 4];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap_err().to_string()
    });
    assert!(out.iter().all(|e| e.contains("Tree needs at least 3 ranks")), "{out:?}");
    let out = threads(2, 2, with_algo(None, Some("LL;allgather:^LL,LL128,Simple")), |c| {
        let send = vec![1u32; 8];
        let mut recv = vec![0u32; 16];
        let e = c.all_gather(&send, &mut recv).unwrap_err().to_string();
        let mut v = vec![1u32; 4];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        (e, v)
    });
    for (e, v) in out {
        assert!(e.contains("enables no protocol for all_gather"), "{e}");
        assert_eq!(v, vec![2; 4]);
    }
}

/// Every protocol over shared memory and TCP, forced alone and mixed on one connection (each
/// collective its own protocol, one after another), with chunks smaller and larger than a
/// flagged slot carries: exact results.
#[test]
fn every_protocol_carries_every_collective_exactly_over_shm_and_tcp() {
    let settings = [
        (Some("ring"), "LL"),
        (Some("ring"), "LL128"),
        (Some("ring;allreduce:tree"), "LL"),
        (Some("ring;allreduce:tree"), "LL128"),
        (Some("ring"), "allreduce:LL;allgather:LL128;broadcast:Simple;reduce:LL128;reducescatter:LL"),
    ];
    for (algo, proto) in settings {
        for (n, per_host) in [(3usize, 3usize), (4, 2)] {
            let cfg = with_algo(algo, Some(proto)).with_direct(false).with_channels(2);
            let out = threads(n, per_host, cfg, move |c| {
                let r = c.rank().idx() as u32;
                let p = c.size() as u32;
                let mut bad = Vec::new();
                for count in [1usize, 7, 2039, 2041, 15_331, 70_001] {
                    let send: Vec<u32> = (0..count as u32).map(|i| (i % 1013) * (r + 1)).collect();
                    let mut sum = vec![0u32; count];
                    c.all_reduce(&send, &mut sum, ReduceOp::Sum).unwrap();
                    let mut gathered = vec![0u32; count * p as usize];
                    c.all_gather(&send, &mut gathered).unwrap();
                    let mut b: Vec<u32> = if r == 1 { send.clone() } else { vec![0; count] };
                    c.broadcast_in_place(&mut b, Rank(1)).unwrap();
                    let mut red = vec![0u32; count];
                    c.reduce(&send, &mut red, ReduceOp::Max, Rank(0)).unwrap();
                    let big: Vec<u32> = (0..count as u32 * p).map(|i| i % 977 + r).collect();
                    let mut rs = vec![0u32; count];
                    c.reduce_scatter(&big, &mut rs, ReduceOp::Sum).unwrap();
                    for i in 0..count {
                        let base = (i as u32) % 1013;
                        let ok = sum[i] == base * p * (p + 1) / 2
                            && (0..p).all(|q| gathered[q as usize * count + i] == base * (q + 1))
                            && b[i] == base * 2
                            && (r != 0 || red[i] == base * p)
                            && rs[i] == ((r * count as u32 + i as u32) % 977) * p + p * (p - 1) / 2;
                        if !ok {
                            bad.push((count, i));
                            break;
                        }
                    }
                }
                bad
            });
            for (rank, bad) in out.iter().enumerate() {
                assert!(
                    bad.is_empty(),
                    "{algo:?} NCCL_PROTO={proto} n={n} per_host={per_host} rank {rank}: wrong at {bad:?}"
                );
            }
        }
    }
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

/// A float input whose sums depend on the order they are added in.
fn fx(r: usize, i: usize) -> f32 {
    let h = (r as u64 * 0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = (h ^ (h >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10f32.powi((h % 7) as i32 - 3)
}

#[test]
fn deterministic_mode_gives_the_same_bits_for_every_size_algorithm_and_channel_count() {
    let seed = std::env::var("OXCCL_DET_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261202u64);
    let mut rng = oxccl_testkit::Rng::new(seed);
    let algos = [None, Some("ring"), Some("tree"), Some("direct"), Some("ring,tree"), Some("^direct")];
    let p = 4usize;
    let mut seen = std::collections::BTreeSet::new();
    for trial in 0..20 {
        let n = 1 + rng.below(if trial % 4 == 0 { 3_000_000 } else { 200_000 }) as usize;
        let algo = algos[rng.below(algos.len() as u64) as usize];
        let proto = [None, Some("Simple"), Some("LL"), Some("LL128")][rng.below(4) as usize];
        let channels = 1 + rng.below(4) as usize;
        let buffsize = [64usize << 10, 1 << 20, 4 << 20][rng.below(3) as usize];
        let per_host = if rng.below(3) == 0 { 2 } else { 4 };
        let direct = rng.below(4) != 0;
        let shared = rng.below(2) == 0;
        let what = format!(
            "trial {trial} (seed {seed}): n={n} NCCL_ALGO={algo:?} NCCL_PROTO={proto:?} channels={channels} buffsize={buffsize} per_host={per_host} direct={direct} shared={shared}"
        );
        let mut cfg =
            with_algo(algo, proto).with_channels(channels).with_buffsize(buffsize).with_direct(direct);
        cfg.deterministic = true;
        let id = oxccl::new_unique_id(&cfg).unwrap();
        let hs: Vec<_> = (0..p)
            .map(|r| {
                let cfg = cfg.clone().with_host_id(&format!("host{}", r / per_host));
                std::thread::spawn(move || {
                    let c = Communicator::init(&id, p, Rank::new(r), cfg).unwrap();
                    let x: Vec<f32> = (0..n).map(|i| fx(r, i)).collect();
                    if shared {
                        let mut b = oxccl::mem::SharedBuf::from_slice(&x).unwrap();
                        c.all_reduce_in_place(&mut b, ReduceOp::Sum).map(|_| b.to_vec())
                    } else {
                        let mut out = vec![0f32; n];
                        c.all_reduce(&x, &mut out, ReduceOp::Sum).map(|_| out)
                    }
                })
            })
            .collect();
        for (r, h) in hs.into_iter().enumerate() {
            let got = h.join().unwrap().unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
            for (i, v) in got.iter().enumerate() {
                let want = (1..p).fold(fx(0, i), |a, q| a + fx(q, i));
                assert_eq!(v.to_bits(), want.to_bits(), "{what}: rank {r} element {i}: {v} vs {want}");
            }
        }
        seen.insert(format!("{algo:?}/{per_host}"));
    }
    assert!(seen.len() >= 4, "too few distinct configurations: {seen:?}");
    // Control: without the mode, the ring's order differs, which these inputs show.
    let n = 100_000;
    let out = threads(p, p, with_algo(Some("ring"), None), move |c| {
        let x: Vec<f32> = (0..n).map(|i| fx(c.rank().idx(), i)).collect();
        let mut out = vec![0f32; n];
        c.all_reduce(&x, &mut out, ReduceOp::Sum).unwrap();
        out
    });
    let differ = (0..n)
        .filter(|&i| out[0][i].to_bits() != (1..p).fold(fx(0, i), |a, q| a + fx(q, i)).to_bits())
        .count();
    assert!(differ > 0, "the ring folded in rank order everywhere");
}
