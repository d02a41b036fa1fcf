//! What a plan is asked for: one operation of a rank ([`OpSpec`]) and the places in its
//! buffers it reads and writes ([`Loc`], [`BufId`]).
//!
//! Rule: a leaf of the plans: it names data types, collectives and ranks only, so the call
//! signatures ([`crate::contract`]) and every planner can name an operation without naming
//! each other.

use crate::coll::{Collective, RingColl};
use crate::dtype::{DataType, ReduceOp};
use crate::types::Rank;

/// Which of an operation's buffers a location refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(pub u16);

impl BufId {
    /// The engine's scratch buffer (of [`Job::scratch_bytes`](super::Job::scratch_bytes)), not a user buffer.
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

    /// The collective the tuner knows this op as (none for all-to-all, gather, scatter and
    /// point-to-point, which have one algorithm).
    pub fn tuned(&self) -> Option<RingColl> {
        RingColl::try_from(self.collective()).ok()
    }

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
