//! Call signatures: what a call is, as every peer taking part in it must also see it.
//!
//! Every chunk a rank sends carries the signature of the call it belongs to (three words in the
//! transport's chunk header), and every chunk received is compared with the signature the
//! receiving step expects. Ranks whose calls differ (another collective, data type, count,
//! operator, root, or calls in another order) therefore fail with both signatures in hand
//! instead of hanging or computing a wrong result. Point-to-point messages carry a per-peer
//! message number with their type and count, so a send and its receive are checked too.
//!
//! A signature of kind [`CallKind::None`] (all zero words) is not checked: the check is off,
//! or the lane was not planned for a call (tests, the simulator).

use crate::coll::Collective;
use crate::dtype::{DataType, ReduceOp};
use crate::plan::OpSpec;
use crate::types::Rank;

/// The transport form of a signature.
pub type SigWords = [u64; 3];

/// What a call is, for the contract check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum CallKind {
    /// No signature: nothing is checked.
    #[default]
    None = 0,
    AllReduce = 1,
    Broadcast = 2,
    Reduce = 3,
    AllGather = 4,
    ReduceScatter = 5,
    AllToAll = 6,
    AllToAllV = 7,
    Gather = 8,
    Scatter = 9,
    /// A point-to-point message (a send, as its receiver expects it).
    P2p = 10,
}

impl CallKind {
    const ALL: [CallKind; 11] = [
        CallKind::None,
        CallKind::AllReduce,
        CallKind::Broadcast,
        CallKind::Reduce,
        CallKind::AllGather,
        CallKind::ReduceScatter,
        CallKind::AllToAll,
        CallKind::AllToAllV,
        CallKind::Gather,
        CallKind::Scatter,
        CallKind::P2p,
    ];

    /// The kind of wire code `code`, if one.
    pub fn from_u8(code: u8) -> Option<CallKind> {
        CallKind::ALL.get(code as usize).copied()
    }

    /// The collective's name ([`Collective::name`]), "unchecked" or "send/recv".
    pub const fn name(self) -> &'static str {
        match self.collective() {
            Some(c) => c.name(),
            None if matches!(self, CallKind::P2p) => "send/recv",
            None => "unchecked",
        }
    }

    /// The collective it checks (none for an unchecked call or a point-to-point message).
    pub const fn collective(self) -> Option<Collective> {
        Some(match self {
            CallKind::None | CallKind::P2p => return None,
            CallKind::AllReduce => Collective::AllReduce,
            CallKind::Broadcast => Collective::Broadcast,
            CallKind::Reduce => Collective::Reduce,
            CallKind::AllGather => Collective::AllGather,
            CallKind::ReduceScatter => Collective::ReduceScatter,
            CallKind::AllToAll => Collective::AllToAll,
            CallKind::AllToAllV => Collective::AllToAllV,
            CallKind::Gather => Collective::Gather,
            CallKind::Scatter => Collective::Scatter,
        })
    }
}

impl From<Collective> for CallKind {
    /// The wire code a call of `c` is checked under (point-to-point: a message).
    fn from(c: Collective) -> CallKind {
        match c {
            Collective::AllReduce => CallKind::AllReduce,
            Collective::Broadcast => CallKind::Broadcast,
            Collective::Reduce => CallKind::Reduce,
            Collective::AllGather => CallKind::AllGather,
            Collective::ReduceScatter => CallKind::ReduceScatter,
            Collective::AllToAll => CallKind::AllToAll,
            Collective::AllToAllV => CallKind::AllToAllV,
            Collective::Gather => CallKind::Gather,
            Collective::Scatter => CallKind::Scatter,
            Collective::Send | Collective::Recv => CallKind::P2p,
        }
    }
}

/// No root (the field's value when the call has none).
const NO_ROOT: u32 = u32::MAX;
/// The count of an all-to-allv (its counts differ per pair and are checked chunk by chunk).
const VARIABLE: u64 = u64::MAX;

/// A call's signature. Collectives number their calls per communicator (`seq` counts from 0
/// in the order calls are made); a point-to-point message's `seq` counts the messages between
/// one sender and one receiver, as each end sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Sig {
    pub seq: u64,
    pub kind: CallKind,
    /// The data type's NCCL enum value (0 when unused).
    pub dtype: u8,
    /// The operator's value, [`Sig::NO_OP`] when the call reduces nothing.
    pub op: u8,
    pub root: u32,
    pub count: u64,
}

impl Sig {
    /// Nothing to check.
    pub const NONE: Sig = Sig { seq: 0, kind: CallKind::None, dtype: 0, op: 0, root: 0, count: 0 };
    /// The operator field of a call without a reduction.
    pub const NO_OP: u8 = 0xff;

    fn new(
        seq: u64,
        kind: CallKind,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: Option<Rank>,
        count: u64,
    ) -> Sig {
        Sig {
            seq,
            kind,
            dtype: dtype as u8,
            op: op.map_or(Sig::NO_OP, |o| o as u8),
            root: root.map_or(NO_ROOT, |r| r.0),
            count,
        }
    }

    /// The signature of collective `op`, the communicator's call number `seq`.
    pub fn of(op: &OpSpec, seq: u64) -> Sig {
        let s = |dtype, o, root, count: usize| {
            Sig::new(seq, CallKind::from(op.collective()), dtype, o, root, count as u64)
        };
        match *op {
            OpSpec::AllReduce { count, dtype, op, .. } | OpSpec::ReduceScatter { count, dtype, op, .. } => {
                s(dtype, Some(op), None, count)
            }
            OpSpec::Reduce { count, dtype, op, root, .. } => s(dtype, Some(op), Some(root), count),
            OpSpec::Broadcast { count, dtype, root, .. }
            | OpSpec::Gather { count, dtype, root, .. }
            | OpSpec::Scatter { count, dtype, root, .. } => s(dtype, None, Some(root), count),
            OpSpec::AllGather { count, dtype, .. }
            | OpSpec::AllToAll { count, dtype, .. }
            | OpSpec::Send { count, dtype, .. }
            | OpSpec::Recv { count, dtype, .. } => s(dtype, None, None, count),
            OpSpec::AllToAllV { dtype, .. } => Sig { count: VARIABLE, ..s(dtype, None, None, 0) },
        }
    }

    /// The `n`th message between a sender and a receiver.
    pub fn message(n: u64, dtype: DataType, count: usize) -> Sig {
        Sig::new(n, CallKind::P2p, dtype, None, None, count as u64)
    }

    /// Whether the signature is checked at all.
    #[inline]
    pub fn checked(&self) -> bool {
        self.kind != CallKind::None
    }

    /// The three words chunks carry.
    #[inline]
    pub fn to_words(&self) -> SigWords {
        [
            self.seq,
            self.kind as u64 | (self.dtype as u64) << 8 | (self.op as u64) << 16 | (self.root as u64) << 32,
            self.count,
        ]
    }

    /// The signature in `w`; an unknown kind decodes as [`CallKind::None`] with the words kept
    /// visible in `seq`/`count` (so a garbled header still prints something).
    pub fn from_words(w: SigWords) -> Sig {
        let kind = CallKind::from_u8(w[1] as u8).unwrap_or(CallKind::None);
        Sig {
            seq: w[0],
            kind,
            dtype: (w[1] >> 8) as u8,
            op: (w[1] >> 16) as u8,
            root: (w[1] >> 32) as u32,
            count: w[2],
        }
    }

    /// Whether a chunk carrying `got` may be consumed by a step expecting `self`.
    #[inline]
    pub fn accepts(&self, got: &SigWords) -> bool {
        !self.checked() || *got == self.to_words()
    }
}

impl core::fmt::Display for Sig {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.kind == CallKind::None {
            return write!(f, "an unchecked call (words {:#x}, {:#x})", self.seq, self.count);
        }
        let dtype = DataType::from_nccl(self.dtype as i32)
            .map_or_else(|| format!("type {}", self.dtype), |d| d.name().to_string());
        let what = if self.kind == CallKind::P2p { "message" } else { "call" };
        write!(f, "{} {what} #{} ({dtype} × ", self.kind.name(), self.seq)?;
        if self.count == VARIABLE {
            f.write_str("per-peer counts")?;
        } else {
            write!(f, "{}", self.count)?;
        }
        if self.op != Sig::NO_OP {
            match ReduceOp::from_nccl(self.op as i32) {
                Some(o) => write!(f, ", {o}")?,
                None => write!(f, ", operator {}", self.op)?,
            }
        }
        if self.root != NO_ROOT {
            write!(f, ", root {}", self.root)?;
        }
        f.write_str(")")
    }
}

/// The numbers the next signatures take: the communicator's next collective, and per peer the
/// next message sent to it and received from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seqs {
    pub coll: u64,
    pub sent: Vec<u64>,
    pub received: Vec<u64>,
}

impl Seqs {
    pub fn new(nranks: usize) -> Seqs {
        Seqs { coll: 0, sent: vec![0; nranks], received: vec![0; nranks] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Loc;

    #[test]
    fn words_round_trip_and_every_field_counts() {
        let l = Loc::start(crate::plan::BufId(0));
        let op = OpSpec::Reduce {
            count: 1000,
            dtype: DataType::Bf16,
            op: ReduceOp::Max,
            root: Rank(3),
            src: l,
            dst: l,
        };
        let s = Sig::of(&op, 41);
        assert_eq!(Sig::from_words(s.to_words()), s);
        assert_eq!(s.to_string(), "reduce call #41 (bfloat16 × 1000, max, root 3)");
        let variants = [
            Sig { seq: 42, ..s },
            Sig { kind: CallKind::Broadcast, ..s },
            Sig { dtype: DataType::F16 as u8, ..s },
            Sig { op: ReduceOp::Sum as u8, ..s },
            Sig { root: 2, ..s },
            Sig { count: 999, ..s },
        ];
        for v in variants {
            assert_ne!(v.to_words(), s.to_words(), "{v}");
            assert!(!s.accepts(&v.to_words()), "{v}");
            assert_eq!(Sig::from_words(v.to_words()), v);
        }
        assert!(s.accepts(&s.to_words()));
        // An unchecked step accepts anything; unchecked chunks are all zeros.
        assert!(Sig::NONE.accepts(&s.to_words()));
        assert_eq!(Sig::NONE.to_words(), [0; 3]);
    }

    #[test]
    fn signatures_print_what_the_call_was() {
        let l = Loc::start(crate::plan::BufId(0));
        let ar = OpSpec::AllReduce { count: 7, dtype: DataType::F32, op: ReduceOp::Sum, src: l, dst: l };
        assert_eq!(Sig::of(&ar, 0).to_string(), "all_reduce call #0 (float × 7, sum)");
        let bc = OpSpec::Broadcast { count: 1, dtype: DataType::I8, root: Rank(0), src: l, dst: l };
        assert_eq!(Sig::of(&bc, 5).to_string(), "broadcast call #5 (int8 × 1, root 0)");
        assert_eq!(Sig::message(2, DataType::U64, 9).to_string(), "send/recv message #2 (uint64 × 9)");
        let v = OpSpec::AllToAllV {
            dtype: DataType::I32,
            send_counts: vec![1],
            send_displs: vec![0],
            recv_counts: vec![1],
            recv_displs: vec![0],
            src: l,
            dst: l,
        };
        assert_eq!(Sig::of(&v, 1).to_string(), "all_to_all_v call #1 (int32 × per-peer counts)");
    }
}
