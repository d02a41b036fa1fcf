//! Algorithms as plans: what each rank does, step by step, over which connections.
//!
//! A plan is a set of *lanes*. A lane is a sequence of [`Step`]s executed strictly in order;
//! different lanes are independent and progress concurrently (a ring collective is one lane per
//! channel; a direct all-to-all is one lane per peer and direction). A step moves one chunk: it
//! takes its input from a local buffer, from one inbound connection, or from an inbound
//! connection combined with a local buffer (a reduction), and writes the result to a local
//! buffer, to one outbound connection, or both.
//!
//! Rules the plans obey, which the engine and the simulator rely on:
//! 1. For every connection (a → b, class), the sequence of chunk lengths that a's lanes send on
//!    it equals the sequence b's lanes receive from it, for any world size and count. Both
//!    sides compute lengths from the same global arguments; zero-length chunks are never sent.
//! 2. A lane uses each connection in one direction only, and no two lanes of one op share a
//!    connection. Collectives and point-to-point traffic use different connection classes, so
//!    running p2p lanes concurrently with collective phases cannot reorder either.
//! 3. A chunk is at most the chunk size the plan was made for, and a multiple of the element
//!    size.
//!
//! Nothing here knows which transport carries a connection; [`sim`] executes plans in memory.
//!
//! Layout, lowest first: `op.rs` (what a plan is asked for: [`OpSpec`], [`Loc`]), `lane.rs` (what
//! a plan is made of: [`Step`], [`Lane`], [`Job`]) and `geometry.rs` (what it knows of the
//! communicator: [`Geometry`]); the planners (`ring.rs`, [`tree`], `direct.rs`, `oneshot.rs`,
//! `det.rs`) build on those three, never on this file, which chooses among them
//! ([`plan_op`], [`plan_group_signed`]) and re-exports the vocabulary. The call signatures
//! ([`crate::contract`]) name only `op.rs`, so they sit between the vocabulary and the planners.

mod det;
pub mod device;
mod direct;
pub mod exec;
mod geometry;
pub mod hier;
pub mod hostdirect;
mod lane;
mod oneshot;
mod op;
mod ring;
pub mod sim;
pub mod tree;

use crate::coll::RingColl;
use crate::contract::{Seqs, Sig};
use crate::dtype::{DataType, ReduceOp};
use crate::error::CoreError;
use crate::proto::Proto;
use crate::reduce::ReduceCtx;
use crate::types::{ChannelId, Rank};

pub use direct::{alltoallv_bytes, p2p_checked, DirectStream};
pub use geometry::{Geometry, GeometryCache, HostGroups};
pub use lane::{job_connections, ConnClass, ConnKey, Input, Job, Lane, Port, Step};
pub use op::{BufId, Loc, OpSpec};
pub use ring::RingCollective;

fn ring_lanes(g: &Geometry, kind: RingColl, args: RingArgs) -> Result<Vec<Lane>, CoreError> {
    let reduce = match args.op {
        Some(op) => Some(ReduceCtx::new(args.dtype, op, g.size as u32)?),
        None => None,
    };
    let pos = g.ring_pos(g.rank);
    let prev = g.ring[(pos + g.size - 1) % g.size];
    let next = g.ring[(pos + 1) % g.size];
    let channels = g.channels_for(args.count, args.dtype.size_bytes());
    let mut lanes = Vec::with_capacity(channels);
    for c in 0..channels {
        let beg = args.count * c / channels;
        let end = args.count * (c + 1) / channels;
        if beg == end {
            continue;
        }
        let class = ConnClass::Ring(ChannelId(c as u16));
        let gen = RingCollective::new(
            kind,
            g.ring.clone(),
            pos,
            args.root.map(|r| g.ring_pos(r)).unwrap_or(0),
            args.dtype.size_bytes(),
            args.block,
            args.src,
            args.dst,
            beg,
            end,
            g.chunk_elems(args.dtype),
        );
        let (inbound, outbound) = if g.size == 1 {
            (vec![], vec![])
        } else {
            (vec![ConnKey { peer: prev, class }], vec![ConnKey { peer: next, class }])
        };
        lanes.push(Lane::new(inbound, outbound, reduce, Box::new(gen)));
    }
    Ok(lanes)
}

struct RingArgs {
    count: usize,
    /// Elements per rank block (for block-structured collectives), else `count`.
    block: usize,
    dtype: DataType,
    op: Option<ReduceOp>,
    root: Option<Rank>,
    src: Loc,
    dst: Loc,
}

/// Whether the direct path may serve `op` under the communicator's selector.
pub fn direct_allowed(g: &Geometry, op: &OpSpec) -> bool {
    let Some(s) = &g.select else { return true };
    match (op, op.tuned()) {
        (OpSpec::AllReduce { count, dtype, .. }, _) => {
            matches!(s.all_reduce_algo(count * dtype.size_bytes()), None | Some(crate::tuner::Algo::Direct))
        }
        (_, Some(c)) => s.direct[c as usize],
        (_, None) => true,
    }
}

/// Whether the selector runs `op` hierarchically (where the hosts allow).
fn hier_selected(s: &crate::tuner::Selector, op: &OpSpec) -> bool {
    match *op {
        OpSpec::AllReduce { count, dtype, .. } => {
            s.all_reduce_algo(count * dtype.size_bytes()) == Some(crate::tuner::Algo::Hier)
        }
        OpSpec::AllGather { .. } => s.hier[RingColl::AllGather as usize],
        OpSpec::ReduceScatter { .. } => s.hier[RingColl::ReduceScatter as usize],
        _ => false,
    }
}

/// Why the settings forbid `op`, if they do.
pub fn refused<'a>(g: &'a Geometry, op: &OpSpec) -> Option<&'a str> {
    let (s, c) = (g.select.as_ref()?, op.tuned()?);
    s.refuse[c as usize].as_deref()
}

/// The lanes that carry `op` for rank `g.rank`.
pub fn plan_op(g: &Geometry, op: &OpSpec) -> Result<Vec<Lane>, CoreError> {
    let ring = |kind, count, block, dtype, op, root, src, dst| {
        ring_lanes(g, kind, RingArgs { count, block, dtype, op, root, src, dst })
    };
    match *op {
        OpSpec::AllReduce { count, dtype, op, src, dst } => {
            if oneshot::applies(g, count, dtype) && g.select.is_none() {
                return Err(CoreError::malformed("plan", "one-shot all-reduce is planned by plan_group"));
            }
            ring(RingColl::AllReduce, count, count, dtype, Some(op), None, src, dst)
        }
        OpSpec::Broadcast { count, dtype, root, src, dst } => {
            ring(RingColl::Broadcast, count, count, dtype, None, Some(root), src, dst)
        }
        OpSpec::Reduce { count, dtype, op, root, src, dst } => {
            ring(RingColl::Reduce, count, count, dtype, Some(op), Some(root), src, dst)
        }
        OpSpec::AllGather { count, dtype, src, dst } => {
            ring(RingColl::AllGather, count, count, dtype, None, None, src, dst)
        }
        OpSpec::ReduceScatter { count, dtype, op, src, dst } => {
            ring(RingColl::ReduceScatter, count, count, dtype, Some(op), None, src, dst)
        }
        OpSpec::AllToAll { count, dtype, src, dst } => {
            let counts = vec![count; g.size];
            let displs: Vec<usize> = (0..g.size).map(|i| i * count).collect();
            Ok(direct::alltoallv(g, dtype, &counts, &displs, &counts, &displs, src, dst))
        }
        OpSpec::AllToAllV {
            dtype,
            ref send_counts,
            ref send_displs,
            ref recv_counts,
            ref recv_displs,
            src,
            dst,
        } => Ok(direct::alltoallv(g, dtype, send_counts, send_displs, recv_counts, recv_displs, src, dst)),
        OpSpec::Gather { count, dtype, root, src, dst } => {
            Ok(direct::gather(g, dtype, count, root, src, dst))
        }
        OpSpec::Scatter { count, dtype, root, src, dst } => {
            Ok(direct::scatter(g, dtype, count, root, src, dst))
        }
        OpSpec::Send { .. } | OpSpec::Recv { .. } => direct::p2p_checked(g, std::slice::from_ref(op), None),
    }
}

/// Plans a group of operations (a single op is a group of one), without signatures.
pub fn plan_group(g: &Geometry, ops: &[OpSpec]) -> Result<Job, CoreError> {
    plan_group_signed(g, ops, &mut Seqs::new(g.size), false)
}

/// Plans a group of operations and numbers them: each collective takes the next call number
/// of `seqs`, each message the next number of its peer. With `stamp`, every lane carries its
/// call's signature (the contract check); the numbers advance either way.
pub fn plan_group_signed(
    g: &Geometry,
    ops: &[OpSpec],
    seqs: &mut Seqs,
    stamp: bool,
) -> Result<Job, CoreError> {
    let mut job = Job::default();
    let p2p: Vec<OpSpec> = ops.iter().filter(|o| o.is_p2p()).cloned().collect();
    if !p2p.is_empty() {
        job.p2p = direct::p2p_checked(g, &p2p, Some((&mut *seqs, stamp)))?;
    }
    let g0 = g;
    for op in ops.iter().filter(|o| !o.is_p2p()) {
        let sig = if stamp { Sig::of(op, seqs.coll) } else { Sig::NONE };
        seqs.coll += 1;
        // The protocol of this call's chunks; its chunks are no larger than it carries.
        let proto = match (&g0.select, op.tuned(), op.tuned_bytes(g0.size)) {
            (Some(s), Some(c), Some(b)) => s.proto_for(c, b),
            _ => Proto::Simple,
        };
        let gp;
        let g = if proto == Proto::Simple {
            g0
        } else {
            let cap = crate::proto::chunk_capacity(proto, g0.chunk_bytes).min(g0.chunk_bytes);
            gp = Geometry { chunk_bytes: cap, ..g0.clone() };
            &gp
        };
        let sign = |mut lanes: Vec<Lane>| {
            for l in &mut lanes {
                l.sig = sig;
                l.proto = proto;
            }
            lanes
        };
        // Deterministic mode: every reduction is planned as the rank-order fold, whatever the
        // selector chose for its size (`det::plan`); other collectives plan as usual.
        if let Some((phases, scratch)) = det::plan(g, op)? {
            job.phases.extend(phases.into_iter().map(sign));
            job.scratch_bytes = job.scratch_bytes.max(scratch);
            continue;
        }
        // Hierarchical where selected and the hosts allow it (else the flat plans below).
        if let Some((s, grp)) =
            g.select.as_ref().filter(|s| hier_selected(s, op)).and_then(|s| Some((s, hier::groups(g)?)))
        {
            let (phases, scratch) = match *op {
                OpSpec::AllReduce { count, dtype, op, src, dst } => {
                    let small = match count * dtype.size_bytes() <= s.hier_small_max {
                        true => hier::all_reduce_small(g, &grp, count, dtype, op, src, dst)?,
                        false => None,
                    };
                    match small {
                        Some(small) => small,
                        None => (hier::all_reduce(g, &grp, count, dtype, op, src, dst)?, 0),
                    }
                }
                OpSpec::AllGather { count, dtype, src, dst } => {
                    (hier::all_gather(g, &grp, count, dtype, src, dst), 0)
                }
                OpSpec::ReduceScatter { count, dtype, op, src, dst } => {
                    hier::reduce_scatter(g, &grp, count, dtype, op, src, dst)?
                }
                _ => return Err(CoreError::malformed("plan", "no hierarchical plan for this collective")),
            };
            job.phases.extend(phases.into_iter().map(sign));
            job.scratch_bytes = job.scratch_bytes.max(scratch);
            continue;
        }
        if let OpSpec::AllReduce { count, dtype, op, src, dst } = *op {
            let algo = g.select.as_ref().and_then(|s| s.all_reduce_algo(count * dtype.size_bytes()));
            if algo == Some(crate::tuner::Algo::Tree) && g.size > 2 && count > 0 {
                job.phases.push(sign(tree::all_reduce(g, count, dtype, op, src, dst)?));
                continue;
            }
            if algo != Some(crate::tuner::Algo::Ring) && oneshot::applies(g, count, dtype) {
                let (phases, scratch) = oneshot::all_reduce(g, count, dtype, op, src, dst)?;
                job.phases.extend(phases.into_iter().map(sign));
                job.scratch_bytes = job.scratch_bytes.max(scratch);
                continue;
            }
        }
        let lanes = plan_op(g, op)?;
        if !lanes.is_empty() {
            job.phases.push(sign(lanes));
        }
    }
    Ok(job)
}

#[cfg(test)]
mod cache_tests {
    use super::*;
    use std::sync::Arc;

    /// Every step of every lane, with its connections, for rank `g.rank`.
    fn trace(g: &Geometry, op: &OpSpec) -> Vec<String> {
        let job = plan_group(g, std::slice::from_ref(op)).unwrap();
        let mut out = Vec::new();
        for lane in job.phases.into_iter().flatten() {
            out.push(format!("{:?} {:?}", lane.inbound, lane.outbound));
            out.extend(lane.steps.map(|s| format!("{s:?}")));
        }
        out
    }

    /// The cache only saves work: ring and tree plans are the same step for step, whatever the
    /// ring order and hosts.
    #[test]
    fn cached_geometries_plan_the_same_steps() {
        for (size, per_host) in [(5usize, 2usize), (9, 3), (12, 4), (7, 1)] {
            // A ring order that is not rank order: reversed.
            let ring: Vec<Rank> = (0..size).rev().map(Rank::new).collect();
            for algo in [crate::tuner::Algo::Ring, crate::tuner::Algo::Tree] {
                for rank in 0..size {
                    let mut g = Geometry::simple(Rank::new(rank), size, 2, 4096)
                        .with_hosts(|r| (r / per_host) as u32);
                    g.ring = ring.clone().into();
                    g.select = Some(Arc::new(crate::tuner::Selector::always(algo)));
                    let c = g.clone().cached();
                    let cache = c.cache.as_ref().unwrap();
                    assert_eq!(cache.tree, tree::places(&g));
                    assert_eq!(cache.ring_pos[rank] as usize, g.ring_pos(Rank::new(rank)));
                    for count in [1usize, 100, 5000] {
                        let op = OpSpec::AllReduce {
                            count,
                            dtype: DataType::F32,
                            op: ReduceOp::Sum,
                            src: Loc::start(BufId(0)),
                            dst: Loc::start(BufId(1)),
                        };
                        assert_eq!(
                            trace(&g, &op),
                            trace(&c, &op),
                            "size {size} rank {rank} {algo:?} count {count}"
                        );
                    }
                }
            }
        }
    }
}
