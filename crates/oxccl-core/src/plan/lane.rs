//! What a plan is made of: connections ([`ConnKey`]), steps ([`Step`]), the lanes that run
//! them in order ([`Lane`]), and a group's whole work for one rank ([`Job`]).
//!
//! Rule: the plans' vocabulary, below every planner (`ring`, `tree`, `direct`, `oneshot`,
//! `det`), the planning entry points (`plan/mod.rs`) and the executors (`sim`, the runtime's
//! engine); it names the operations' locations ([`super::op`]) and the call signatures
//! ([`crate::contract`]) a lane carries, nothing that plans.

use super::op::Loc;
use crate::contract::Sig;
use crate::proto::Proto;
use crate::reduce::ReduceCtx;
use crate::types::{ChannelId, Rank};

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
    /// A lane without signatures (stamped later by [`plan_group_signed`](super::plan_group_signed)).
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

/// A group's work for one rank: point-to-point lanes that run throughout, and the collectives'
/// lanes as phases that run one after another, in issue order.
#[derive(Debug, Default)]
pub struct Job {
    pub p2p: Vec<Lane>,
    pub phases: Vec<Vec<Lane>>,
    /// Bytes of scratch the job's steps address through [`BufId::SCRATCH`].
    pub scratch_bytes: usize,
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
