//! The simulator held to the emulation: all-reduces of 1, 4 and 16 MiB timed on an emulated
//! cluster of 2 hosts × 2 ranks (links shaped to 1 Gbit/s, [`oxccl_testkit::cluster`]), with
//! the hierarchical plan and with the flat ring, each within 15 % of what `oxccl sim` predicts
//! for the same plan on `fixtures/clusters/emulated-1gbit.json` (the cluster file that
//! describes the emulation). A test binary of its own, so no other test shares the cores
//! while it times.

use oxccl_core::netsim::{simulate, Cluster as SimCluster, Spec as SimSpec};
use oxccl_core::tuner::{Algo, Proto};
use oxccl_testkit::cluster::{Cluster, Spec};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

/// 1, 4 and 16 MiB. (1 MiB was once bimodal across launches, 9.4 or 13.1 ms: each emulated
/// cluster measured rank 0's costs anew, and with loopback TCP standing in for the link the
/// model picked Hier or the ring there by a hair; the model now knows the link.)
const SIZES: [usize; 3] = [1 << 20, 4 << 20, 16 << 20];

/// Each size's time per call, printed as `TIME bytes µs`: after a warm-up call, 3 rounds of
/// `m` calls back to back (the link's token bucket then lends its burst to the first call of
/// a round only, as a link busy with a training job would), the least round's mean (the
/// simulator prices the plan over the links, not other programs' use of the cores).
fn time_rank() {
    let comm = oxccl::Communicator::from_env().unwrap_or_else(|e| panic!("init failed: {e}"));
    for bytes in SIZES {
        let n = bytes / 4;
        let send = vec![1.0f32; n];
        let mut recv = vec![0.0f32; n];
        let m = ((8 << 20) / bytes).max(1);
        comm.all_reduce(&send, &mut recv, oxccl::ReduceOp::Sum).unwrap();
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            comm.barrier().unwrap();
            let t0 = Instant::now();
            for _ in 0..m {
                comm.all_reduce(&send, &mut recv, oxccl::ReduceOp::Sum).unwrap();
            }
            best = best.min(t0.elapsed().as_secs_f64() * 1e6 / m as f64);
            assert!(recv.iter().all(|&x| x == 4.0), "all-reduce of {bytes} B not exact");
        }
        println!("TIME {bytes} {best:.1}");
    }
}

#[test]
fn simulated_times_are_within_15_percent_of_the_emulated_cluster() {
    if oxccl_testkit::child("hosts_sim").is_some() {
        return time_rank();
    }
    let spec = Spec { hosts: 2, per_host: 2, rails: 1, rate: Some("1gbit".into()) };
    let c = match Cluster::create(&spec) {
        Ok(c) => c,
        Err(why) => {
            return oxccl_testkit::skip(
                "simulated_times_are_within_15_percent_of_the_emulated_cluster",
                "network namespaces",
                &why,
            )
        }
    };
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/clusters/emulated-1gbit.json");
    let sim =
        SimCluster::parse(&std::fs::read_to_string(file).unwrap()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut report = Vec::new();
    for (algo_env, algo) in [("hier,ring", Algo::Hier), ("ring", Algo::Ring)] {
        // The least time of each size over up to 3 launches: a launch slowed by other work on
        // the cores is measured again; a simulation that is off stays off.
        let mut best = [f64::INFINITY; SIZES.len()];
        let mut lines = Vec::new();
        for attempt in 0..3 {
            let l = c
                .launch("simulated_times_are_within_15_percent_of_the_emulated_cluster", "hosts_sim")
                .env("NCCL_ALGO", algo_env)
                .env("OXCCL_TIMEOUT", "120")
                .timeout(Duration::from_secs(300));
            let done = l.run().unwrap_or_else(|e| panic!("NCCL_ALGO={algo_env}: {e}"));
            for line in done[0].stdout.lines().filter_map(|l| l.find("TIME ").map(|i| &l[i + 5..])) {
                let mut it = line.split_whitespace().map(|x| x.parse::<f64>().unwrap());
                let (bytes, t) = (it.next().unwrap() as usize, it.next().unwrap());
                let i = SIZES.iter().position(|&b| b == bytes).unwrap_or_else(|| panic!("size {bytes}"));
                best[i] = best[i].min(t);
            }
            lines.clear();
            for (i, &bytes) in SIZES.iter().enumerate() {
                // The runtime's settings across hosts: 2 channels, 8 slots of 512 KiB.
                let s = SimSpec {
                    algo,
                    proto: Proto::Simple,
                    bytes,
                    nranks: 4,
                    nchannels: 2,
                    chunk_bytes: 512 << 10,
                    slots: 8,
                    period: None,
                };
                let predicted = simulate(&sim, &s).unwrap().time_us;
                let ratio = predicted / best[i];
                lines.push((ratio, format!(
                    "{algo:?} {bytes} B: emulated {:.0} µs, simulated {predicted:.0} µs, ratio {ratio:.3} ({} launch(es))",
                    best[i],
                    attempt + 1
                )));
            }
            if lines.iter().all(|(r, _)| (0.85..=1.15).contains(r)) {
                break;
            }
        }
        report.extend(lines.iter().map(|(_, l)| l.clone()));
        for (ratio, _) in &lines {
            assert!((0.85..=1.15).contains(ratio), "{}", report.join("\n"));
        }
    }
    assert_eq!(report.len(), 2 * SIZES.len(), "{}", report.join("\n"));
    for r in &report {
        oxccl_testkit::report!("{r}");
    }
}
