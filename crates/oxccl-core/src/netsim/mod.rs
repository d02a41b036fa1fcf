//! The network simulator: oxccl's own plans (the lanes `plan::plan_group` makes for the
//! engine) executed step by step on modeled clusters of up to 100,000 ranks
//! ([`engine::simulate`]), the cluster descriptions it reads ([`cluster::Cluster`]), and the
//! tuner's model of the same cluster ([`model_of`]) so the two can be compared.

pub mod bootstrap;
pub mod cluster;
pub mod engine;

pub use cluster::Cluster;
pub use engine::{simulate, Outcome, Spec};

use crate::tuner::{Algo, Model, PathCost, PROTOS};

/// The tuner's model of `nranks` GPUs of cluster `c` (one rank per GPU, nodes filled in
/// order): per-hop latencies and bandwidths from the cluster file.
pub fn model_of(c: &Cluster, nranks: usize) -> Model {
    let local = nranks.min(c.gpus_per_node);
    let nhosts = nranks.div_ceil(local.max(1));
    let path = |l: &cluster::LinkClass, limit: f64| PathCost {
        hop_us: [l.tree_us, l.ring_us],
        channel_gbs: l.gbs,
        limit_gbs: limit,
    };
    Model {
        nranks,
        nhosts,
        intra: path(&c.intra, c.intra.gbs * local.saturating_sub(1).max(1) as f64),
        intra_name: "NVL".into(),
        // Each rank's share of its node's NICs.
        net: path(&c.net, c.net.gbs * c.nics_per_node as f64),
        base_us: [c.base_tree_us, c.base_ring_us, c.base_ring_us, c.base_ring_us],
        hosts_uniform: nranks % local.max(1) == 0,
        msg_us: 0.0,
        max_channels: 2 * c.nics_per_node,
        min_channels: 1,
        ll128: true,
        tree_efficiency: 0.92,
        proto_eff: [0.5, 120.0 / 128.0, 1.0],
        runnable_algos: vec![Algo::Ring, Algo::Tree, Algo::Hier],
        runnable_protos: PROTOS.to_vec(),
        direct_gbs: None,
        direct_max_bytes: 0,
    }
}
