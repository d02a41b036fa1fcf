//! One collective or point-to-point call, checked completely when it is made ([`Call::check`]:
//! every argument, naming the one that is wrong), and how calls on host memory run
//! ([`run_host`]: one oxccl group).
//!
//! Rule: below the group queue and the execution paths of `ops` (`mod.rs`, `staged.rs`,
//! `device.rs`), which all name it; it names only [`crate::fail`], [`crate::handle`] and
//! [`crate::premul`].

use crate::fail::{invalid, lock, Fail, R};
use crate::handle::{CommState, PreMul, Scalar};
use crate::premul;
use oxccl::{Communicator, DataType, Group, Rank, ReduceOp};
use oxccl_core::coll::{elems, Collective};

/// What a call does.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    AllReduce(ReduceOp),
    Broadcast(Rank),
    Reduce(ReduceOp, Rank),
    AllGather,
    ReduceScatter(ReduceOp),
    AllToAll,
    Gather(Rank),
    Scatter(Rank),
    Send(Rank),
    Recv(Rank),
}

impl Kind {
    /// The library's collective (or point-to-point operation) it is.
    pub fn collective(self) -> Collective {
        match self {
            Kind::AllReduce(_) => Collective::AllReduce,
            Kind::Broadcast(_) => Collective::Broadcast,
            Kind::Reduce(..) => Collective::Reduce,
            Kind::AllGather => Collective::AllGather,
            Kind::ReduceScatter(_) => Collective::ReduceScatter,
            Kind::AllToAll => Collective::AllToAll,
            Kind::Gather(_) => Collective::Gather,
            Kind::Scatter(_) => Collective::Scatter,
            Kind::Send(_) => Collective::Send,
            Kind::Recv(_) => Collective::Recv,
        }
    }

    /// The reduction operator, where the call has one.
    pub fn op(self) -> Option<ReduceOp> {
        match self {
            Kind::AllReduce(op) | Kind::Reduce(op, _) | Kind::ReduceScatter(op) => Some(op),
            _ => None,
        }
    }

    /// The root (or, for point-to-point, the peer), where the call has one.
    pub fn root(self) -> Option<Rank> {
        match self {
            Kind::Broadcast(r) | Kind::Reduce(_, r) | Kind::Gather(r) | Kind::Scatter(r) => Some(r),
            Kind::Send(r) | Kind::Recv(r) => Some(r),
            _ => None,
        }
    }
}

/// One checked call. Pointers are the caller's; they stay valid until the call (or the
/// group holding it) has completed, as nccl.h requires.
pub struct Call {
    pub func: &'static str,
    pub(super) kind: Kind,
    pub(super) dtype: DataType,
    pub(super) send: *const u8,
    pub(super) recv: *mut u8,
    /// Bytes of `send` and `recv` this rank uses (0: not used here).
    pub(super) send_len: usize,
    pub(super) recv_len: usize,
    pub(super) in_place: bool,
    /// NCCL's count argument.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) count: usize,
    pub(super) premul: Option<Box<PreMul>>,
    /// The caller's stream (used to order device copies).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) stream: usize,
}

// SAFETY: a Call is addresses and sizes; nccl.h makes the caller keep the memory valid and
// untouched until the call completes, which is before ncclGroupEnd returns on this path.
unsafe impl Send for Call {}
// SAFETY: shared references to a Call only read its addresses; the memory behind them is
// touched by the one group that runs the call.
unsafe impl Sync for Call {}

/// The raw arguments of a call, as the C entry point received them.
pub struct Args {
    pub func: &'static str,
    pub send: *const u8,
    pub recv: *mut u8,
    pub count: usize,
    pub dtype: i32,
    /// `ncclRedOp_t` for reductions.
    pub op: Option<i32>,
    /// Root or peer, with the argument's name.
    pub rank: Option<(&'static str, i32)>,
    pub stream: usize,
}

#[inline]
pub fn dtype_of(v: i32) -> R<DataType> {
    match v {
        0..=11 => Ok(DataType::ALL[v as usize]),
        _ => Err(bad_dtype(v)),
    }
}

#[cold]
fn bad_dtype(v: i32) -> Fail {
    invalid("datatype", format!("{v} is not an ncclDataType_t (0..=11)"))
}

/// NCCL's built-in operators, by enum value.
const BUILTIN_OPS: [ReduceOp; 5] =
    [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];

#[cold]
fn count_overflow(n: usize, factor: usize, dtype: DataType, arg: &'static str) -> Fail {
    invalid("count", elems(arg, n, factor, dtype).err().map(|e| e.to_string()).unwrap_or_default())
}

fn overlap(a: usize, alen: usize, b: usize, blen: usize) -> bool {
    alen > 0 && blen > 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

impl Call {
    /// Checks `a` for communicator `st`/`comm` and builds the call that `kind_of` describes.
    pub fn check(
        st: &CommState,
        comm: &Communicator,
        a: Args,
        kind_of: impl FnOnce(Option<ReduceOp>, Option<Rank>) -> Kind,
    ) -> R<Call> {
        let dtype = dtype_of(a.dtype)?;
        let (me, p) = (comm.rank(), comm.size());
        let mut premul = None;
        let op = match a.op {
            None => None,
            // Every built-in operator is defined on every type.
            Some(v @ 0..=4) => Some(BUILTIN_OPS[v as usize]),
            Some(v) => {
                let pm = lock(&st.premul).get(&v).cloned().ok_or_else(|| {
                    invalid("op", format!("{v} is neither a built-in ncclRedOp_t (0..=4) nor an operator ncclRedOpCreatePreMulSum made on this communicator"))
                })?;
                if pm.dtype != dtype {
                    return Err(invalid(
                        "op",
                        format!(
                            "operator {v} was created for {} but the call's datatype is {dtype}",
                            pm.dtype
                        ),
                    ));
                }
                premul = Some(Box::new(pm));
                Some(ReduceOp::Sum)
            }
        };
        let rank = match a.rank {
            None => None,
            Some((name, r)) => {
                if r < 0 || r as usize >= p {
                    return Err(invalid(name, format!("{r} is not a rank of this {p}-rank communicator")));
                }
                Some(Rank::new(r as usize))
            }
        };
        let kind = kind_of(op, rank);
        let es = dtype.size_bytes();
        let n = a.count;
        let limit = |b: usize| (b <= isize::MAX as usize).then_some(b);
        let one = n.checked_mul(es).and_then(limit);
        let all = one.and_then(|b| b.checked_mul(p)).and_then(limit);
        let bytes = |factor: usize, arg: &'static str| -> R<usize> {
            match if factor == 1 { one } else { all } {
                Some(b) => Ok(b),
                None => Err(count_overflow(n, factor, dtype, arg)),
            }
        };
        let is_root = |r: Rank| me == r;
        let (send_len, recv_len) = match kind {
            Kind::AllReduce(_) => (bytes(1, "count")?, bytes(1, "count")?),
            Kind::Broadcast(r) => (if is_root(r) { bytes(1, "count")? } else { 0 }, bytes(1, "count")?),
            Kind::Reduce(_, r) => (bytes(1, "count")?, if is_root(r) { bytes(1, "count")? } else { 0 }),
            Kind::AllGather => (bytes(1, "sendcount")?, bytes(p, "sendcount")?),
            Kind::ReduceScatter(_) => (bytes(p, "recvcount")?, bytes(1, "recvcount")?),
            Kind::AllToAll => (bytes(p, "count")?, bytes(p, "count")?),
            Kind::Gather(r) => (bytes(1, "count")?, if is_root(r) { bytes(p, "count")? } else { 0 }),
            Kind::Scatter(r) => (if is_root(r) { bytes(p, "count")? } else { 0 }, bytes(1, "count")?),
            Kind::Send(_) => (bytes(1, "count")?, 0),
            Kind::Recv(_) => (0, bytes(1, "count")?),
        };
        if send_len > 0 && a.send.is_null() {
            return Err(invalid("sendbuff", format!("NULL, but rank {me} sends {send_len} bytes")));
        }
        if recv_len > 0 && a.recv.is_null() {
            return Err(invalid("recvbuff", format!("NULL, but rank {me} receives {recv_len} bytes")));
        }
        let (s, r) = (a.send as usize, a.recv as usize);
        let off = |k: usize| n * es * k;
        let in_place = send_len > 0
            && recv_len > 0
            && match kind {
                Kind::AllReduce(_) | Kind::Broadcast(_) | Kind::Reduce(..) | Kind::AllToAll => s == r,
                Kind::AllGather => s == r.wrapping_add(off(me.idx())),
                Kind::ReduceScatter(_) => r == s.wrapping_add(off(me.idx())),
                Kind::Gather(root) => s == r.wrapping_add(off(root.idx())),
                Kind::Scatter(root) => r == s.wrapping_add(off(root.idx())),
                Kind::Send(_) | Kind::Recv(_) => false,
            };
        if !in_place && overlap(s, send_len, r, recv_len) {
            return Err(invalid(
                "recvbuff",
                format!(
                    "[{r:#x}, +{recv_len}) overlaps sendbuff [{s:#x}, +{send_len}) without being {}'s in-place layout",
                    a.func
                ),
            ));
        }
        if premul.is_some() && !matches!(kind, Kind::AllReduce(_) | Kind::Reduce(..) | Kind::ReduceScatter(_))
        {
            return Err(invalid("op", "a PreMulSum operator serves reductions only"));
        }
        Ok(Call {
            func: a.func,
            kind,
            dtype,
            send: a.send,
            recv: a.recv,
            send_len,
            recv_len,
            in_place,
            count: n,
            premul,
            stream: a.stream,
        })
    }

    /// The scaled input of a PreMulSum call.
    pub(super) fn premul_input(&self) -> Option<Vec<u8>> {
        let pm = self.premul.as_ref()?;
        let es = self.dtype.size_bytes();
        let scalar = match &pm.scalar {
            Scalar::Value(v) => v.clone(),
            // SAFETY: ncclScalarDevice on this path is a host pointer to one element of the
            // operator's type, valid while calls use the operator (nccl.h's contract).
            Scalar::Pointer(p) => unsafe { std::slice::from_raw_parts(*p as *const u8, es) }.to_vec(),
        };
        Some(premul::scaled(self.dtype, &scalar, self.send_slice()))
    }

    pub(super) fn send_slice(&self) -> &[u8] {
        if self.send_len == 0 {
            return &[];
        }
        // SAFETY: checked non-NULL; the caller provides `send_len` readable bytes (nccl.h's
        // count rules) until the call completes.
        unsafe { std::slice::from_raw_parts(self.send, self.send_len) }
    }

    #[allow(clippy::mut_from_ref)]
    pub(super) fn recv_slice(&self) -> &mut [u8] {
        if self.recv_len == 0 {
            return &mut [];
        }
        // SAFETY: checked non-NULL; the caller provides `recv_len` writable bytes, and no
        // other slice of this call covers them unless the call is in place (then only this
        // one is made).
        unsafe { std::slice::from_raw_parts_mut(self.recv, self.recv_len) }
    }

    /// The whole in-place buffer: the larger of the two ranges, from its lower start.
    #[allow(clippy::mut_from_ref)]
    pub(super) fn in_place_slice(&self) -> &mut [u8] {
        let (s, r) = (self.send as usize, self.recv as usize);
        let (start, len) =
            if self.send_len >= self.recv_len { (s, self.send_len) } else { (r, self.recv_len) };
        debug_assert!(start <= s.min(r));
        // SAFETY: an in-place call's smaller range lies inside its larger one (the layouts
        // checked in `check`), which the caller provides writable until completion.
        unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) }
    }

    /// Adds the call to `g`; `scaled` holds the PreMulSum input when there is one.
    pub(super) fn add<'a>(&'a self, g: &mut Group<'a>, scaled: Option<&'a [u8]>) -> oxccl::Result<()> {
        let t = self.dtype;
        match (self.kind, scaled) {
            (Kind::AllReduce(_), Some(s)) => g.all_reduce_raw(t, s, self.recv_slice(), ReduceOp::Sum),
            (Kind::Reduce(_, root), Some(s)) => g.reduce_raw(t, s, self.recv_slice(), ReduceOp::Sum, root),
            (Kind::ReduceScatter(_), Some(s)) => g.reduce_scatter_raw(t, s, self.recv_slice(), ReduceOp::Sum),
            (Kind::AllReduce(op), None) if self.in_place => {
                g.all_reduce_in_place_raw(t, self.in_place_slice(), op)
            }
            (Kind::AllReduce(op), None) => g.all_reduce_raw(t, self.send_slice(), self.recv_slice(), op),
            (Kind::Broadcast(root), _) if self.in_place => {
                g.broadcast_in_place_raw(t, self.in_place_slice(), root)
            }
            (Kind::Broadcast(root), _) => g.broadcast_raw(t, self.send_slice(), self.recv_slice(), root),
            (Kind::Reduce(op, root), None) if self.in_place => {
                g.reduce_in_place_raw(t, self.in_place_slice(), op, root)
            }
            (Kind::Reduce(op, root), None) => g.reduce_raw(t, self.send_slice(), self.recv_slice(), op, root),
            (Kind::AllGather, _) if self.in_place => g.all_gather_in_place_raw(t, self.in_place_slice()),
            (Kind::AllGather, _) => g.all_gather_raw(t, self.send_slice(), self.recv_slice()),
            (Kind::ReduceScatter(op), None) if self.in_place => {
                g.reduce_scatter_in_place_raw(t, self.in_place_slice(), op)
            }
            (Kind::ReduceScatter(op), None) => {
                g.reduce_scatter_raw(t, self.send_slice(), self.recv_slice(), op)
            }
            (Kind::AllToAll, _) if self.in_place => g.all_to_all_in_place_raw(t, self.in_place_slice()),
            (Kind::AllToAll, _) => g.all_to_all_raw(t, self.send_slice(), self.recv_slice()),
            (Kind::Gather(root), _) if self.in_place => g.gather_in_place_raw(t, self.in_place_slice(), root),
            (Kind::Gather(root), _) => g.gather_raw(t, self.send_slice(), self.recv_slice(), root),
            (Kind::Scatter(root), _) if self.in_place => {
                g.scatter_in_place_raw(t, self.in_place_slice(), root)
            }
            (Kind::Scatter(root), _) => g.scatter_raw(t, self.send_slice(), self.recv_slice(), root),
            (Kind::Send(peer), _) => g.send_raw(t, self.send_slice(), peer),
            (Kind::Recv(peer), _) => g.recv_raw(t, self.recv_slice(), peer),
        }
        .map(|_| ())
    }
}

/// Runs `calls`, every buffer of which is host memory.
pub(super) fn run_host(comm: &Communicator, calls: &[Call]) -> R<()> {
    if let [c] = calls {
        if c.premul.is_none() {
            let mut g = comm.group();
            c.add(&mut g, None).map_err(|e| Fail::from(e).with_func(c.func))?;
            return g.end().map_err(Fail::from);
        }
    }
    // The scaled inputs of PreMulSum calls (none in the common case: no allocation).
    let scaled: Vec<Option<Vec<u8>>> = if calls.iter().any(|c| c.premul.is_some()) {
        calls.iter().map(Call::premul_input).collect()
    } else {
        Vec::new()
    };
    let mut g = comm.group();
    for (i, c) in calls.iter().enumerate() {
        let s = scaled.get(i).and_then(|s| s.as_deref());
        c.add(&mut g, s).map_err(|e| Fail::from(e).with_func(c.func))?;
    }
    g.end().map_err(Fail::from)
}

impl Fail {
    fn with_func(mut self, f: &str) -> Fail {
        self.msg = format!("{f}: {}", self.msg);
        self
    }
}
