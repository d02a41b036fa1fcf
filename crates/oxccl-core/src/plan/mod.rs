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

mod det;
pub mod device;
mod direct;
pub mod exec;
pub mod hostdirect;
mod oneshot;
mod ring;
pub mod sim;
pub mod tree;

use crate::coll::{Collective, RingColl};
use crate::contract::{Seqs, Sig};
use crate::dtype::{DataType, ReduceOp};
use crate::error::CoreError;
use crate::reduce::ReduceCtx;
use crate::tuner::Proto;
use crate::types::{ChannelId, Rank};
use std::sync::Arc;

pub use direct::{alltoallv_bytes, p2p_checked, DirectStream};

pub use ring::RingCollective;

/// Which of an operation's buffers a location refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(pub u16);

impl BufId {
    /// The engine's scratch buffer (of [`Job::scratch_bytes`]), not a user buffer.
    pub const SCRATCH: BufId = BufId(u16::MAX);
}

/// A byte position in one of an operation's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    pub buf: BufId,
    pub off: usize,
}

impl Loc {
    /// The start of buffer `buf`.
    pub const fn start(buf: BufId) -> Loc {
        Loc { buf, off: 0 }
    }

    /// `self` advanced by `bytes`.
    pub const fn at(self, bytes: usize) -> Loc {
        Loc { buf: self.buf, off: self.off + bytes }
    }
}

/// The kind of traffic a connection carries: collectives' rings, collectives' direct exchanges,
/// or user point-to-point messages. One unidirectional connection exists per (peer pair, class).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConnClass {
    Ring(ChannelId),
    Direct,
    P2p,
    /// One of the two trees of a tree all-reduce (child → parent: up, parent → child: down).
    Tree(u8),
    /// One-sided calls (`oxccl::rma`): puts and signals from the connecting rank, applied by a
    /// thread of the accepting rank. Never part of a plan.
    Rma,
}

/// One end of a unidirectional connection, as seen from this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    pub peer: Rank,
    pub class: ConnClass,
}

/// An index into a lane's inbound or outbound connection list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port(pub u8);

/// Where a step's data comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// A local buffer.
    Src(Loc),
    /// The next chunk of an inbound connection.
    Recv(Port),
    /// The next chunk of an inbound connection, reduced with a local buffer.
    RecvReduce(Port, Loc),
    /// Two local buffers reduced (the first in the role of the received operand).
    Local2(Loc, Loc),
}

/// One chunk's worth of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub input: Input,
    /// Local destination of the result (skipped when it is the input location itself).
    pub dst: Option<Loc>,
    /// Outbound connection that receives the result.
    pub send: Option<Port>,
    /// Apply the reduction's final transform (Avg's division) before writing the result.
    pub finalize: bool,
    /// Bytes in the chunk.
    pub len: usize,
    /// Which of its lane's signatures the chunk belongs to (0: [`Lane::sig`]; `i`:
    /// `Lane::more_sigs[i - 1]`, for lanes carrying several messages).
    pub tag: u16,
}

/// A sequence of steps with the connections it uses.
pub struct Lane {
    pub inbound: Vec<ConnKey>,
    pub outbound: Vec<ConnKey>,
    pub reduce: Option<ReduceCtx>,
    pub steps: Box<dyn Iterator<Item = Step> + Send>,
    /// The signature of the call the lane's chunks belong to (steps tagged 0), checked on
    /// every chunk received and carried by every chunk sent ([`crate::contract`]).
    pub sig: Sig,
    /// Signatures of steps tagged 1, 2, … (a point-to-point lane's later messages).
    pub more_sigs: Vec<Sig>,
    /// The protocol its chunks travel in (their size fits it: [`crate::proto::chunk_capacity`]).
    pub proto: Proto,
}

impl Lane {
    /// A lane without signatures (stamped later by [`plan_group_signed`]).
    pub fn new(
        inbound: Vec<ConnKey>,
        outbound: Vec<ConnKey>,
        reduce: Option<ReduceCtx>,
        steps: Box<dyn Iterator<Item = Step> + Send>,
    ) -> Lane {
        Lane { inbound, outbound, reduce, steps, sig: Sig::NONE, more_sigs: Vec::new(), proto: Proto::Simple }
    }

    /// The signature of a step tagged `tag`.
    #[inline]
    pub fn sig_of(&self, tag: u16) -> Sig {
        match tag {
            0 => self.sig,
            t => self.more_sigs.get(t as usize - 1).copied().unwrap_or(Sig::NONE),
        }
    }
}

impl core::fmt::Debug for Lane {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Lane")
            .field("inbound", &self.inbound)
            .field("outbound", &self.outbound)
            .field("reduce", &self.reduce)
            .finish_non_exhaustive()
    }
}

/// What a plan needs to know about the communicator.
#[derive(Clone, Debug)]
pub struct Geometry {
    pub rank: Rank,
    pub size: usize,
    /// The ring order (a permutation of all ranks), the same on every rank.
    pub ring: Arc<[Rank]>,
    /// Parallel rings a ring collective is striped over.
    pub nchannels: usize,
    /// The largest chunk a step may carry, in bytes.
    pub chunk_bytes: usize,
    /// The least data (bytes of the call's count) a collective puts on each ring; smaller
    /// calls use fewer rings (0: always all `nchannels`).
    pub channel_min_bytes: usize,
    /// The largest all-reduce the one-shot plan takes ([`crate::tuning::one_shot_max_bytes`]).
    pub one_shot_max_bytes: usize,
    /// Each rank's host, as a small index (ranks with equal values share a host).
    pub hosts: Arc<[u32]>,
    /// The algorithm each all-reduce takes, by size (`None`: the built-in rules — one-shot for
    /// small calls, else the ring).
    pub select: Option<Arc<crate::tuner::Selector>>,
    /// `OXCCL_DETERMINISTIC`: every reduction folds the ranks' inputs in rank order
    /// (`plan/det.rs`), whatever the size and algorithm.
    pub deterministic: bool,
    /// What every rank's plans derive from `ring` and `hosts` alone, computed once
    /// ([`Geometry::cached`]); `None`: computed by each plan that needs it.
    pub cache: Option<Arc<GeometryCache>>,
}

/// Derived from a geometry's ring and hosts, the same for all its ranks.
#[derive(Debug)]
pub struct GeometryCache {
    /// Each rank's position in the ring.
    pub ring_pos: Vec<u32>,
    /// The tree all-reduce's two rank-level trees ([`tree::places`]).
    pub tree: [Vec<tree::Place>; 2],
}

impl Geometry {
    /// A geometry with the ring in rank order.
    pub fn simple(rank: Rank, size: usize, nchannels: usize, chunk_bytes: usize) -> Geometry {
        Geometry {
            rank,
            size,
            ring: (0..size).map(Rank::new).collect::<Vec<_>>().into(),
            nchannels,
            chunk_bytes,
            channel_min_bytes: 0,
            one_shot_max_bytes: crate::tuning::ONE_SHOT_MAX_BYTES,
            hosts: vec![0; size].into(),
            select: None,
            deterministic: false,
            cache: None,
        }
    }

    /// This geometry with its [`GeometryCache`] (for every rank of a communicator: clone it
    /// and set `rank`). Plans are the same with or without it.
    pub fn cached(mut self) -> Geometry {
        self.cache = None;
        let mut ring_pos = vec![0u32; self.size];
        for (i, r) in self.ring.iter().enumerate() {
            if let Some(x) = ring_pos.get_mut(r.idx()) {
                *x = i as u32;
            }
        }
        let tree = tree::places(&self);
        self.cache = Some(Arc::new(GeometryCache { ring_pos, tree }));
        self
    }

    /// This geometry with rank `r` on host `host_of(r)`.
    pub fn with_hosts(mut self, host_of: impl Fn(usize) -> u32) -> Geometry {
        self.hosts = (0..self.size).map(host_of).collect::<Vec<_>>().into();
        self.cache = None;
        self
    }

    fn ring_pos(&self, r: Rank) -> usize {
        if let Some(c) = &self.cache {
            return c.ring_pos.get(r.idx()).map_or(0, |&p| p as usize);
        }
        self.ring.iter().position(|x| *x == r).unwrap_or(0)
    }

    fn chunk_elems(&self, dtype: DataType) -> usize {
        (self.chunk_bytes / dtype.size_bytes()).max(1)
    }
}

/// One operation of a rank, with its buffers' locations; counts in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpSpec {
    AllReduce {
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        src: Loc,
        dst: Loc,
    },
    Broadcast {
        count: usize,
        dtype: DataType,
        root: Rank,
        src: Loc,
        dst: Loc,
    },
    Reduce {
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: Rank,
        src: Loc,
        dst: Loc,
    },
    /// `count` elements per rank.
    AllGather {
        count: usize,
        dtype: DataType,
        src: Loc,
        dst: Loc,
    },
    /// `count` elements per rank (the output size).
    ReduceScatter {
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        src: Loc,
        dst: Loc,
    },
    /// `count` elements per peer.
    AllToAll {
        count: usize,
        dtype: DataType,
        src: Loc,
        dst: Loc,
    },
    /// Per-peer counts and displacements, in elements.
    AllToAllV {
        dtype: DataType,
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
        src: Loc,
        dst: Loc,
    },
    /// `count` elements per rank.
    Gather {
        count: usize,
        dtype: DataType,
        root: Rank,
        src: Loc,
        dst: Loc,
    },
    /// `count` elements per rank.
    Scatter {
        count: usize,
        dtype: DataType,
        root: Rank,
        src: Loc,
        dst: Loc,
    },
    Send {
        count: usize,
        dtype: DataType,
        peer: Rank,
        src: Loc,
    },
    Recv {
        count: usize,
        dtype: DataType,
        peer: Rank,
        dst: Loc,
    },
}

impl OpSpec {
    /// Whether the op is point-to-point (planned into the group's concurrent p2p lanes).
    pub fn is_p2p(&self) -> bool {
        self.collective().is_p2p()
    }

    /// The collective (or point-to-point operation) it is.
    pub fn collective(&self) -> Collective {
        match self {
            OpSpec::AllReduce { .. } => Collective::AllReduce,
            OpSpec::Broadcast { .. } => Collective::Broadcast,
            OpSpec::Reduce { .. } => Collective::Reduce,
            OpSpec::AllGather { .. } => Collective::AllGather,
            OpSpec::ReduceScatter { .. } => Collective::ReduceScatter,
            OpSpec::AllToAll { .. } => Collective::AllToAll,
            OpSpec::AllToAllV { .. } => Collective::AllToAllV,
            OpSpec::Gather { .. } => Collective::Gather,
            OpSpec::Scatter { .. } => Collective::Scatter,
            OpSpec::Send { .. } => Collective::Send,
            OpSpec::Recv { .. } => Collective::Recv,
        }
    }

    /// Where the op writes (every op but a send writes from there on).
    pub fn dst(&self) -> Option<Loc> {
        match *self {
            OpSpec::AllReduce { dst, .. }
            | OpSpec::Broadcast { dst, .. }
            | OpSpec::Reduce { dst, .. }
            | OpSpec::AllGather { dst, .. }
            | OpSpec::ReduceScatter { dst, .. }
            | OpSpec::AllToAll { dst, .. }
            | OpSpec::AllToAllV { dst, .. }
            | OpSpec::Gather { dst, .. }
            | OpSpec::Scatter { dst, .. }
            | OpSpec::Recv { dst, .. } => Some(dst),
            OpSpec::Send { .. } => None,
        }
    }
}

fn ring_lanes(g: &Geometry, kind: RingColl, args: RingArgs) -> Result<Vec<Lane>, CoreError> {
    let reduce = match args.op {
        Some(op) => Some(ReduceCtx::new(args.dtype, op, g.size as u32)?),
        None => None,
    };
    let pos = g.ring_pos(g.rank);
    let prev = g.ring[(pos + g.size - 1) % g.size];
    let next = g.ring[(pos + 1) % g.size];
    // Small calls use fewer rings: below `channel_min_bytes` a ring only adds a round of
    // wake-ups per step. Every rank computes the same count from the call.
    let bytes = args.count * args.dtype.size_bytes();
    let by_size = bytes.checked_div(g.channel_min_bytes).unwrap_or(usize::MAX).max(1);
    let channels = g.nchannels.max(1).min(args.count.max(1)).min(by_size);
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

impl OpSpec {
    /// The collective the tuner knows this op as (none for all-to-all, gather, scatter and
    /// point-to-point, which have one algorithm).
    pub fn tuned(&self) -> Option<RingColl> {
        RingColl::try_from(self.collective()).ok()
    }
}

impl OpSpec {
    /// The size the tuner prices a tuned collective at: the larger of its input and output in
    /// bytes (nccl-tests' "size").
    pub fn tuned_bytes(&self, nranks: usize) -> Option<usize> {
        Some(match *self {
            OpSpec::AllReduce { count, dtype, .. }
            | OpSpec::Broadcast { count, dtype, .. }
            | OpSpec::Reduce { count, dtype, .. } => count * dtype.size_bytes(),
            OpSpec::AllGather { count, dtype, .. } | OpSpec::ReduceScatter { count, dtype, .. } => {
                count * nranks * dtype.size_bytes()
            }
            _ => return None,
        })
    }
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

/// A group's work for one rank: point-to-point lanes that run throughout, and the collectives'
/// lanes as phases that run one after another, in issue order.
#[derive(Debug, Default)]
pub struct Job {
    pub p2p: Vec<Lane>,
    pub phases: Vec<Vec<Lane>>,
    /// Bytes of scratch the job's steps address through [`BufId::SCRATCH`].
    pub scratch_bytes: usize,
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

/// Every connection a job uses: (key, is_outbound), deduplicated.
pub fn job_connections(job: &Job) -> Vec<(ConnKey, bool)> {
    let mut v: Vec<(ConnKey, bool)> = Vec::new();
    let lanes = job.p2p.iter().chain(job.phases.iter().flatten());
    for lane in lanes {
        v.extend(lane.inbound.iter().map(|k| (*k, false)));
        v.extend(lane.outbound.iter().map(|k| (*k, true)));
    }
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod cache_tests {
    use super::*;

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
