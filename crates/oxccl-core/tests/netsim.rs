//! The simulator on the Summit-like cluster file, at 1,024 ranks (and 96 for the other side
//! of the crossover): the shapes NVIDIA published for NCCL's rings and trees, and the tuner's
//! agreement with the simulator where one algorithm clearly wins.

use oxccl_core::netsim::{model_of, simulate, Cluster, Spec};
use oxccl_core::tuner::{Algo, Enabled, Proto, RingColl};

fn summit() -> Cluster {
    let f = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/clusters/summit.json");
    Cluster::parse(&std::fs::read_to_string(f).unwrap()).unwrap()
}

/// The algorithm's time for `bytes` on `ranks`, in the protocol the cluster's model prices
/// cheapest for it (LL or Simple, as NCCL 2.3/2.4 had).
fn time(c: &Cluster, ranks: usize, algo: Algo, bytes: usize) -> f64 {
    let m = model_of(c, ranks);
    let proto = [Proto::LL, Proto::Simple]
        .into_iter()
        .min_by(|&a, &b| {
            let t = |p| m.estimate(RingColl::AllReduce, bytes, algo, p, 2).unwrap_or(f64::INFINITY);
            t(a).total_cmp(&t(b))
        })
        .unwrap();
    let s = Spec {
        algo,
        proto,
        bytes,
        nranks: ranks,
        nchannels: 2,
        chunk_bytes: 512 << 10,
        slots: 8,
        period: None,
    };
    simulate(c, &s).unwrap().time_us
}

#[test]
fn a_thousand_ranks_show_the_ring_and_tree_crossovers_and_the_tuner_agrees() {
    let c = summit();
    let sizes = [8usize, 512, 32 << 10, 2 << 20, 64 << 20];
    let mut ring = Vec::new();
    let mut tree = Vec::new();
    for &b in &sizes {
        ring.push(time(&c, 1024, Algo::Ring, b));
        tree.push(time(&c, 1024, Algo::Tree, b));
    }
    // Small calls: the tree's log-depth latency beats the ring's 2(P - 1) steps many times over.
    for i in 0..3 {
        assert!(ring[i] > 5.0 * tree[i], "{} B: ring {} us, tree {} us", sizes[i], ring[i], tree[i]);
    }
    // The ring's small-call time grows linearly with the rank count (about 1024/96 = 10.7x from
    // 96 ranks), the tree's barely.
    let (r96, t96) = (time(&c, 96, Algo::Ring, 8), time(&c, 96, Algo::Tree, 8));
    let growth = ring[0] / r96;
    assert!(
        (8.0..13.0).contains(&growth),
        "ring 8 B: {r96} us at 96 ranks, {} us at 1024: x{growth}",
        ring[0]
    );
    assert!(tree[0] / t96 < 2.5, "tree 8 B: {t96} us at 96 ranks, {} us at 1024", tree[0]);
    // 64 MB: the ring wins at 96 ranks, the tree at 1024 (the rank-count crossover).
    let (r96m, t96m) = (time(&c, 96, Algo::Ring, 64 << 20), time(&c, 96, Algo::Tree, 64 << 20));
    assert!(r96m < t96m, "64 MB at 96 ranks: ring {r96m} us, tree {t96m} us");
    assert!(tree[4] < ring[4], "64 MB at 1024 ranks: ring {} us, tree {} us", ring[4], tree[4]);
    // Bus bandwidth of 64 MB at 1024 ranks: the tree holds most of the node's 25 GB/s.
    let bus = |us: f64| (64u64 << 20) as f64 * 2.0 * 1023.0 / 1024.0 / (us * 1e3);
    assert!(bus(tree[4]) > 12.0, "tree busbw {} GB/s", bus(tree[4]));
    // The tuner, fed the same cluster, picks the tree wherever the simulator finds it faster by
    // more than 10 %.
    let m = model_of(&c, 1024);
    let en = Enabled::parse(Some("ring,tree"), Some("LL,Simple")).unwrap();
    for (i, &b) in sizes.iter().enumerate() {
        if tree[i] * 1.1 < ring[i] {
            let pick = m.choose(RingColl::AllReduce, b, &en).unwrap().algo;
            assert_eq!(pick, Algo::Tree, "{b} B: simulated ring {} us, tree {} us", ring[i], tree[i]);
        }
    }
}
