//! Collective and point-to-point calls: argument checks, group queues and execution.
//!
//! A call is checked completely when it is made (so its error comes back from the call that
//! was wrong, naming the argument), then either runs at once (outside a group) or joins this
//! thread's group queue. `ncclGroupEnd` runs the queue: one oxccl group per communicator, all
//! communicators concurrently (one thread may drive several ranks, as with
//! `ncclCommInitAll`), and queued inits and splits likewise.
//!
//! Memory kinds: a call on host memory completes before it returns, whatever the stream. A
//! call with device buffers (found by asking the CUDA driver, when the process has loaded
//! it) runs staged: its inputs are copied into pinned host mirrors on the caller's stream,
//! the collective runs on the mirrors, and the outputs go back on the same stream. The call
//! returns once they are enqueued: the communicator's proxy thread runs the collective when
//! the inputs have landed, and the stream waits for it before the outputs go back (see
//! [`staged`] and [`crate::proxy`]). `OXCCL_ASYNC_STREAMS=0` makes it return only once the
//! outputs have landed.

use crate::handle::{invalid, lock, usage, CommState, Fail, PreMul, Scalar, Tomb, R};
use crate::premul;
use oxccl::{Communicator, DataType, Group, Rank, ReduceOp};
use oxccl_core::coll::elems;
use std::cell::RefCell;

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

/// One checked call. Pointers are the caller's; they stay valid until the call (or the
/// group holding it) has completed, as nccl.h requires.
pub struct Call {
    pub func: &'static str,
    kind: Kind,
    dtype: DataType,
    send: *const u8,
    recv: *mut u8,
    /// Bytes of `send` and `recv` this rank uses (0: not used here).
    send_len: usize,
    recv_len: usize,
    in_place: bool,
    /// NCCL's count argument.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    count: usize,
    premul: Option<Box<PreMul>>,
    /// The caller's stream (used to order device copies).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    stream: usize,
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
    fn premul_input(&self) -> Option<Vec<u8>> {
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

    fn send_slice(&self) -> &[u8] {
        if self.send_len == 0 {
            return &[];
        }
        // SAFETY: checked non-NULL; the caller provides `send_len` readable bytes (nccl.h's
        // count rules) until the call completes.
        unsafe { std::slice::from_raw_parts(self.send, self.send_len) }
    }

    #[allow(clippy::mut_from_ref)]
    fn recv_slice(&self) -> &mut [u8] {
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
    fn in_place_slice(&self) -> &mut [u8] {
        let (s, r) = (self.send as usize, self.recv as usize);
        let (start, len) =
            if self.send_len >= self.recv_len { (s, self.send_len) } else { (r, self.recv_len) };
        debug_assert!(start <= s.min(r));
        // SAFETY: an in-place call's smaller range lies inside its larger one (the layouts
        // checked in `check`), which the caller provides writable until completion.
        unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) }
    }

    /// Adds the call to `g`; `scaled` holds the PreMulSum input when there is one.
    fn add<'a>(&'a self, g: &mut Group<'a>, scaled: Option<&'a [u8]>) -> oxccl::Result<()> {
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

/// Runs `calls` on `comm` (whose state is `st`) as one oxccl group (a single call is a
/// group of one). Calls on host memory run now, after any stream-ordered ones still queued
/// on the communicator's proxy (the order every rank made them in).
pub fn run(st: &CommState, comm: &Communicator, calls: &[Call]) -> R<()> {
    #[cfg(feature = "cuda")]
    if let Some(r) = staged::run_if_device(st, comm, calls) {
        return r;
    }
    if st.proxy.pending() > 0 {
        st.proxy.drain();
    }
    st.proxy.check()?;
    run_host(comm, calls)
}

/// Runs `calls`, every buffer of which is host memory.
fn run_host(comm: &Communicator, calls: &[Call]) -> R<()> {
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

/// A queued management job (a communicator init or split made inside a group).
pub type Job = Box<dyn FnOnce() -> R<()> + Send>;

/// A thread's open group. Calls are queued by their communicator's tomb, unpinned: each is
/// pinned again when the group ends (a communicator destroyed meanwhile is refused then).
#[derive(Default)]
struct GroupState {
    depth: u32,
    calls: Vec<(&'static Tomb, Call)>,
    jobs: Vec<Job>,
    /// The first error a call inside the group returned: `ncclGroupEnd` returns it too and
    /// runs nothing.
    error: Option<Fail>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

pub fn group_start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Notes a call's failure inside a group (the group fails as a whole).
pub fn group_failed(f: &Fail) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(f.clone());
        }
    })
}

/// Queues `call` in the open group.
pub fn queue(tomb: &'static Tomb, call: Call) {
    GROUP.with(|g| g.borrow_mut().calls.push((tomb, call)));
}

/// Queues `job` in the open group, or runs it now.
pub fn submit_job(job: Job) -> R<()> {
    let job = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Some(job);
        }
        g.jobs.push(job);
        None
    });
    match job {
        Some(j) => j(),
        None => Ok(()),
    }
}

/// What `ncclGroupEnd` found to do, per communicator.
pub struct Ended {
    pub jobs: Vec<Job>,
    pub per_comm: Vec<(&'static Tomb, Vec<Call>)>,
}

/// Closes one level of grouping; at the outermost, takes the queue (or its error).
pub fn group_end() -> R<Option<Ended>> {
    let st = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(usage("ncclGroupEnd without a matching ncclGroupStart"));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut *g)))
    })?;
    let Some(st) = st else { return Ok(None) };
    if let Some(e) = st.error {
        return Err(e);
    }
    let mut per_comm: Vec<(&'static Tomb, Vec<Call>)> = Vec::new();
    for (t, call) in st.calls {
        match per_comm.iter_mut().find(|e| std::ptr::eq(e.0, t)) {
            Some(e) => e.1.push(call),
            None => per_comm.push((t, vec![call])),
        }
    }
    Ok(Some(Ended { jobs: st.jobs, per_comm }))
}

/// Runs every unit concurrently (the first on this thread); returns each unit's result.
pub fn run_all<T: Send>(units: Vec<T>, f: impl Fn(T) -> R<()> + Sync) -> Vec<R<()>> {
    let mut units = units.into_iter();
    let Some(first) = units.next() else { return Vec::new() };
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = units.map(|u| s.spawn(move || f(u))).collect();
        let mut out = vec![f(first)];
        for h in hs {
            out.push(h.join().unwrap_or_else(|_| {
                Err(Fail { code: crate::handle::INTERNAL_ERROR, msg: "a group thread panicked".into() })
            }));
        }
        out
    })
}

/// Calls whose buffers are all device memory of one device, on one stream: run by the device
/// engine the communicator's ranks allow (`oxccl::cuda::DevComm`: ranks as threads of this
/// process, or processes of this host by CUDA IPC); anything else is staged.
#[cfg(feature = "cuda")]
mod device {
    use super::{Call, Kind};
    use crate::handle::{code_of, CommState, Fail, PreMul, Scalar, INVALID_USAGE, R, UNHANDLED_CUDA_ERROR};
    use oxccl::cuda::call::DevCall;
    use oxccl::cuda::comm::EngineKind;
    use oxccl::cuda::stage::MemKind;
    use oxccl::cuda::{DevComm, DevError};
    use oxccl::Communicator;
    use oxccl_core::plan::device::Coll;

    fn fail(func: &str, e: DevError) -> Fail {
        let code = match &e {
            DevError::Cuda(oxccl::cuda::CudaError::Invalid(_)) => INVALID_USAGE,
            DevError::Cuda(_) => UNHANDLED_CUDA_ERROR,
            DevError::Comm(c) => code_of(c),
        };
        Fail { code, msg: format!("{func}: {e}") }
    }

    fn dev_call(c: &Call) -> Option<DevCall> {
        // A buffer this rank does not use (a non-root's send of a broadcast, say) is left out:
        // nccl.h lets it be anything.
        let s = if c.send_len > 0 { c.send as u64 } else { 0 };
        let r = if c.recv_len > 0 { c.recv as u64 } else { 0 };
        let t = c.dtype;
        let n = c.count;
        let scalar = match c.premul.as_deref() {
            None => None,
            Some(PreMul { scalar: Scalar::Value(v), .. }) => {
                let mut b = [0u8; 8];
                b[..v.len().min(8)].copy_from_slice(&v[..v.len().min(8)]);
                Some(u64::from_le_bytes(b))
            }
            // A scalar behind a pointer is read when the call runs: staged.
            Some(_) => return None,
        };
        let coll = |k: Coll, op: oxccl::ReduceOp| match scalar {
            Some(v) => DevCall::premul(k, t, v, n, s, r),
            None => DevCall::coll(k, t, op, n, s, r),
        };
        let sum = oxccl::ReduceOp::Sum;
        Some(match c.kind {
            Kind::AllReduce(op) => coll(Coll::AllReduce, op),
            Kind::Broadcast(root) => coll(Coll::Broadcast(root.idx()), sum),
            Kind::Reduce(op, root) => coll(Coll::Reduce(root.idx()), op),
            Kind::AllGather => coll(Coll::AllGather, sum),
            Kind::ReduceScatter(op) => coll(Coll::ReduceScatter, op),
            Kind::AllToAll => coll(Coll::AllToAll, sum),
            Kind::Gather(root) => coll(Coll::Gather(root.idx()), sum),
            Kind::Scatter(root) => coll(Coll::Scatter(root.idx()), sum),
            Kind::Send(peer) => DevCall::send(peer.idx(), t, n, s),
            Kind::Recv(peer) => DevCall::recv(peer.idx(), t, n, r),
        })
    }

    /// Runs `calls` by the device engine; `None` if they are to be staged.
    pub fn run(
        st: &'static CommState,
        comm: &'static Communicator,
        calls: &[Call],
        kinds: &[(MemKind, MemKind, Option<MemKind>)],
    ) -> Option<R<()>> {
        let stream = calls[0].stream;
        if calls.iter().any(|c| c.stream != stream) {
            return None;
        }
        let mut ordinal = None;
        for (c, &(sk, rk, pk)) in calls.iter().zip(kinds) {
            if pk.is_some() {
                return None;
            }
            for (k, used) in [(sk, c.send_len > 0), (rk, c.recv_len > 0)] {
                match (k, used) {
                    (_, false) => {}
                    (MemKind::Device { ordinal: o }, true) if *ordinal.get_or_insert(o) == o => {}
                    _ => return None,
                }
            }
        }
        let ordinal = ordinal?;
        let dev_calls: Vec<DevCall> = calls.iter().map(dev_call).collect::<Option<_>>()?;
        let func = calls[0].func;
        let dc = match st.dev_engine(|| DevComm::new(comm, ordinal).map_err(|e| fail(func, e))) {
            Ok(d) => d,
            Err(f) => return Some(Err(f)),
        };
        if dc.ordinal() != ordinal || (dc.engine() == EngineKind::Staged) {
            return None;
        }
        if st.proxy.pending() > 0 {
            st.proxy.drain();
        }
        if let Err(e) = st.proxy.check() {
            return Some(Err(e));
        }
        Some(dc.run(stream, &dev_calls).map_err(|e| fail(func, e)))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use oxccl::cuda::call::What;
        use oxccl::cuda::kernels::Kop;
        use oxccl::{DataType, Rank, ReduceOp};

        fn call(kind: Kind, send: usize, recv: usize, lens: (usize, usize), count: usize) -> Call {
            Call {
                func: "test",
                kind,
                dtype: DataType::F32,
                send: send as *const u8,
                recv: recv as *mut u8,
                send_len: lens.0,
                recv_len: lens.1,
                in_place: send == recv,
                count,
                premul: None,
                stream: 0,
            }
        }

        /// nccl.h's calls become the device engines' calls: NCCL's count, the collective and
        /// its root, buffers a rank does not use left out, PreMulSum's immediate scalar by
        /// value (a scalar behind a pointer is staged).
        #[test]
        fn calls_map_to_device_calls() {
            let c = dev_call(&call(Kind::AllReduce(ReduceOp::Max), 0x100, 0x100, (40, 40), 10)).unwrap();
            assert_eq!(
                (c.what, c.op, c.count, c.send, c.recv),
                (What::Coll(Coll::AllReduce), Kop::Op(ReduceOp::Max), 10, 0x100, 0x100)
            );
            // A non-root broadcast's send buffer is not used: left out whatever it points at.
            let c = dev_call(&call(Kind::Broadcast(Rank::new(2)), 0xdead, 0x200, (0, 40), 10)).unwrap();
            assert_eq!((c.what, c.send, c.recv), (What::Coll(Coll::Broadcast(2)), 0, 0x200));
            // A non-root reduce has no output.
            let c = dev_call(&call(Kind::Reduce(ReduceOp::Sum, Rank::new(0)), 0x300, 0xbeef, (40, 0), 10))
                .unwrap();
            assert_eq!((c.what, c.send, c.recv), (What::Coll(Coll::Reduce(0)), 0x300, 0));
            let c = dev_call(&call(Kind::Recv(Rank::new(3)), 0, 0x400, (0, 12), 3)).unwrap();
            assert_eq!((c.what, c.count, c.recv), (What::Recv(3), 3, 0x400));
            let mut pm = call(Kind::ReduceScatter(ReduceOp::Sum), 0x500, 0x600, (160, 40), 10);
            pm.premul = Some(Box::new(PreMul {
                dtype: DataType::F32,
                scalar: Scalar::Value(2.5f32.to_le_bytes().to_vec()),
            }));
            let c = dev_call(&pm).unwrap();
            assert_eq!((c.op, c.scalar), (Kop::PreMulSum, 2.5f32.to_bits() as u64));
            pm.premul = Some(Box::new(PreMul { dtype: DataType::F32, scalar: Scalar::Pointer(0x700) }));
            assert!(dev_call(&pm).is_none(), "a scalar read when the call runs is staged");
        }
    }
}

/// Calls with device buffers, run over host mirrors by the communicator's proxy (see the
/// module's documentation).
#[cfg(feature = "cuda")]
mod staged {
    use super::{run_host, Call};
    use crate::handle::{CommState, Fail, PreMul, Scalar, R, UNHANDLED_CUDA_ERROR};
    use oxccl::cuda::stage::{classify, stream_flag, MemKind, OnDevice, Pinned, StreamEvent};
    use oxccl::cuda::CudaError;
    use oxccl::Communicator;
    use std::sync::atomic::Ordering;

    /// One device range of a call and its host mirror.
    struct Mirror {
        ordinal: i32,
        dev: usize,
        host: Pinned,
        /// Holds an output: copied back after the collective.
        out: bool,
        /// The call's stream and name.
        stream: usize,
        func: &'static str,
    }

    fn cuda_fail(func: &str, what: &str, e: CudaError) -> Fail {
        Fail { code: UNHANDLED_CUDA_ERROR, msg: format!("{func}: {what}: {e}") }
    }

    /// Runs `calls` staged if any buffer of theirs is device memory; `None` if all are host.
    pub fn run_if_device(st: &CommState, comm: &Communicator, calls: &[Call]) -> Option<R<()>> {
        oxccl::cuda::driver::driver_if_loaded()?;
        // SAFETY: the caller holds a pin on `st`, and `comm` is `st`'s communicator; the device
        // engine and the proxy jobs that keep them end before the state is freed (see
        // `CommState::forever`).
        let (st, comm): (&'static CommState, &'static Communicator) =
            unsafe { (st.forever(), &*(comm as *const Communicator)) };
        let kinds: Vec<(MemKind, MemKind, Option<MemKind>)> = calls
            .iter()
            .map(|c| {
                let scalar = match c.premul.as_deref() {
                    Some(PreMul { scalar: Scalar::Pointer(p), .. }) => Some(classify(*p as *const u8)),
                    _ => None,
                };
                let s = if c.send_len > 0 { classify(c.send) } else { MemKind::Host };
                let r = if c.recv_len > 0 { classify(c.recv) } else { MemKind::Host };
                (s, r, scalar)
            })
            .collect();
        let host = |k: &MemKind| *k == MemKind::Host;
        if kinds.iter().all(|(s, r, p)| host(s) && host(r) && p.as_ref().is_none_or(host)) {
            return None;
        }
        if let Some(r) = super::device::run(st, comm, calls, &kinds) {
            return Some(r);
        }
        Some(run_staged(st, comm, calls, &kinds))
    }

    fn ordinal(k: MemKind) -> Option<i32> {
        match k {
            MemKind::Device { ordinal } => Some(ordinal),
            _ => None,
        }
    }

    fn any_ordinal(k: MemKind) -> Option<i32> {
        match k {
            MemKind::Device { ordinal } | MemKind::Managed { ordinal } => Some(ordinal),
            MemKind::Host => None,
        }
    }

    /// A device range of a call that gets a host mirror.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) struct Span {
        pub start: usize,
        pub len: usize,
        /// Copied in before the collective / back after it.
        pub input: bool,
        pub output: bool,
        /// Which of the call's pointers lie in it.
        pub send: bool,
        pub recv: bool,
    }

    /// The ranges of `c` to mirror, given which of its buffers are device memory. An in-place
    /// call is one range (the larger of the two, from its lower start, as `in_place_slice`),
    /// copied both ways; otherwise the input is copied in and the output back (every
    /// collective writes the whole of its output range, so nothing of it is copied in).
    pub(super) fn spans(c: &Call, send_dev: bool, recv_dev: bool) -> Vec<Span> {
        let (s, r) = (c.send as usize, c.recv as usize);
        if c.in_place {
            let (start, len) = if c.send_len >= c.recv_len { (s, c.send_len) } else { (r, c.recv_len) };
            return if send_dev {
                vec![Span { start, len, input: true, output: true, send: true, recv: true }]
            } else {
                Vec::new()
            };
        }
        let mut v = Vec::new();
        if send_dev && c.send_len > 0 {
            v.push(Span { start: s, len: c.send_len, input: true, output: false, send: true, recv: false });
        }
        if recv_dev && c.recv_len > 0 {
            v.push(Span { start: r, len: c.recv_len, input: false, output: true, send: false, recv: true });
        }
        v
    }

    /// Calls with device buffers, set up: mirrors with their input copies enqueued, the
    /// calls rewritten onto the mirrors, and each stream's event after its input copies.
    struct Staged {
        proxy: &'static crate::proxy::Proxy,
        mirrors: Vec<Mirror>,
        host_calls: Vec<Call>,
        /// Each distinct stream of the calls, with the device whose context serves it.
        streams: Vec<(usize, i32)>,
        ready: Vec<StreamEvent>,
        done: Vec<StreamEvent>,
    }

    impl Staged {
        fn stream(&mut self, stream: usize, ordinal: i32) {
            if !self.streams.iter().any(|s| s.0 == stream) {
                self.streams.push((stream, ordinal));
            }
        }

        /// A mirror of `[dev, dev + len)` on device `ordinal`, its input copy enqueued if
        /// `input`; returns its host address.
        fn mirror(
            &mut self,
            c: &Call,
            ordinal: i32,
            dev: usize,
            len: usize,
            input: bool,
            out: bool,
        ) -> R<usize> {
            // A new pinned allocation (or a trim of the pool) waits for the whole context, and
            // may hold the driver's context lock meanwhile: it is made only once no job of
            // the communicator is in flight, so no stream waits for the proxy then.
            let mut host = match Pinned::pooled(len) {
                Some(p) => p,
                None => {
                    self.proxy.drain();
                    Pinned::take(len).map_err(|e| cuda_fail(c.func, "pinned host mirror", e))?
                }
            };
            let base = host.as_mut_ptr();
            // Kept before the copy is enqueued, so a failure below still waits for it.
            self.mirrors.push(Mirror { ordinal, dev, host, out, stream: c.stream, func: c.func });
            self.stream(c.stream, ordinal);
            if input {
                let on = OnDevice::push(ordinal).map_err(|e| cuda_fail(c.func, "device context", e))?;
                // SAFETY: the mirror holds `len` bytes and lives in `self` until the copy is
                // known complete (the job waits on the stream's events; failures sync it).
                unsafe { on.download_async(c.stream, base, dev as u64, len) }.map_err(|e| {
                    cuda_fail(c.func, &format!("copying {len} input bytes from the device"), e)
                })?;
            }
            Ok(base as usize)
        }

        /// Waits for every stream (all of them, even after a failure), so nothing enqueued
        /// still uses the mirrors; the first failure, if any.
        fn sync_all(&self, func: &str) -> R<()> {
            let mut first = Ok(());
            for &(s, o) in &self.streams {
                let r = OnDevice::push(o).and_then(|on| on.sync(s));
                if let (Err(e), Ok(())) = (r, &first) {
                    first = Err(cuda_fail(func, "waiting for the stream", e));
                }
            }
            first
        }

        /// On each stream, an event after what is enqueued on it so far.
        fn record(&self) -> R<Vec<StreamEvent>> {
            let mut v = Vec::with_capacity(self.streams.len());
            for &(s, o) in &self.streams {
                let f = |e| cuda_fail(self.host_calls[0].func, "stream event", e);
                let on = OnDevice::push(o).map_err(f)?;
                v.push(on.record(s).map_err(f)?);
            }
            Ok(v)
        }

        /// Enqueues each output's copy back to the device, on its call's stream.
        fn enqueue_outputs(&mut self) -> R<()> {
            for m in self.mirrors.iter_mut().filter(|m| m.out) {
                let on = OnDevice::push(m.ordinal).map_err(|e| cuda_fail(m.func, "device context", e))?;
                let len = m.host.as_mut_slice().len();
                // SAFETY: the mirror lives until the job has waited for the `done` events
                // recorded after these copies.
                unsafe { on.upload_async(m.stream, m.dev as u64, m.host.as_mut_ptr(), len) }.map_err(
                    |e| cuda_fail(m.func, &format!("copying {len} output bytes to the device"), e),
                )?;
            }
            Ok(())
        }

        /// The collective, once the inputs have landed (run by the proxy, or inline).
        fn execute(&self, comm: &Communicator) -> R<()> {
            for ev in &self.ready {
                ev.wait()
                    .map_err(|e| cuda_fail(self.host_calls[0].func, "waiting for the input copies", e))?;
            }
            run_host(comm, &self.host_calls)
        }
    }

    /// Staged calls on device buffers return once enqueued (the proxy runs them), unless
    /// `OXCCL_ASYNC_STREAMS=0`: then once they have completed. Asynchronous by default since
    /// the proxy stopped releasing CUDA objects itself (PyTorch's 4-process check, staged:
    /// 16 of 16 runs passed after that, 2 of 2 hung before, on the lent H200).
    fn blocking() -> bool {
        !oxccl::env::device().async_streams
    }

    /// Stream-ordered calls a communicator keeps in flight before a new one waits.
    const MAX_IN_FLIGHT: usize = 8;

    fn trace() -> bool {
        oxccl::env::device().trace_streams
    }

    /// One trace line to stderr in a single write, so lines of processes that share the
    /// file (a launcher's redirect) do not tear into one another.
    fn trace_line(args: std::fmt::Arguments<'_>) {
        use std::io::Write;
        let line = format!("{args}\n");
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flag(st: &CommState, func: &str) -> R<(usize, u64)> {
        if let Some(f) = st.proxy.flag.get() {
            return Ok(*f);
        }
        let f = stream_flag().map_err(|e| cuda_fail(func, "stream flag", e))?;
        // A racing thread's flag wins; this one is leaked (64 bytes, once).
        Ok(*st.proxy.flag.get_or_init(|| f))
    }

    /// Enqueues `calls` on their streams: input copies, a wait on the communicator's flag,
    /// output copies. The proxy runs the collective once the inputs have landed, then sets
    /// the flag, which releases the output copies and all later work on the streams.
    fn run_staged(
        st: &'static CommState,
        comm: &'static Communicator,
        calls: &[Call],
        kinds: &[(MemKind, MemKind, Option<MemKind>)],
    ) -> R<()> {
        let func = calls[0].func;
        st.proxy.clear_graves();
        st.proxy.check()?;
        let asynchronous = !blocking();
        if asynchronous {
            // Bounded depth: the mirrors of calls in flight are pinned memory.
            st.proxy.wait_below(MAX_IN_FLIGHT);
        }
        let mut sg = Staged {
            proxy: &st.proxy,
            mirrors: Vec::new(),
            host_calls: Vec::new(),
            streams: Vec::new(),
            ready: Vec::new(),
            done: Vec::new(),
        };
        if let Err(f) = prepare(&mut sg, calls, kinds) {
            let _ = sg.sync_all(func);
            return Err(f);
        }
        // Asynchronous: each stream waits for the flag to reach this call's number; a device
        // where that cannot be enqueued makes the call run inline instead.
        let mut set_flag = None;
        let mut all_wait = false;
        let mut seq = 0;
        if asynchronous {
            let (flag_host, flag_dev) = match flag(st, func) {
                Ok(f) => f,
                Err(f) => {
                    let _ = sg.sync_all(func);
                    return Err(f);
                }
            };
            seq = st.proxy.seq.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
            set_flag = Some(move || {
                // SAFETY: the communicator's flag, never freed; only the thread running the
                // communicator's jobs (one at a time, in sequence order) stores to it.
                unsafe { std::ptr::write_volatile(flag_host as *mut u32, seq) };
                std::sync::atomic::fence(Ordering::SeqCst);
            });
            all_wait = sg.streams.iter().all(|&(s, o)| {
                let r = OnDevice::push(o).and_then(|on| on.wait_flag(o, s, flag_dev, seq));
                r.is_ok()
            });
        }
        let queued = all_wait
            && sg.enqueue_outputs().is_ok()
            && match sg.record() {
                Ok(d) => {
                    sg.done = d;
                    true
                }
                Err(_) => false,
            };
        if queued {
            let tr = trace();
            if tr {
                trace_line(format_args!(
                    "oxccl-trace pid {} seq {seq}: enqueued {} stream(s) {:?}",
                    std::process::id(),
                    sg.streams.len(),
                    sg.streams
                ));
            }
            return st.proxy.submit(Box::new(move || {
                let pid = std::process::id();
                if tr {
                    trace_line(format_args!("oxccl-trace pid {pid} seq {seq}: proxy starts"));
                }
                let r = sg.execute(comm);
                if tr {
                    trace_line(format_args!(
                        "oxccl-trace pid {pid} seq {seq}: collective {}",
                        if r.is_ok() { "ok" } else { "FAILED" }
                    ));
                }
                if let Some(set) = set_flag {
                    set();
                }
                for ev in &sg.done {
                    let _ = ev.wait();
                }
                if tr {
                    trace_line(format_args!("oxccl-trace pid {pid} seq {seq}: outputs landed"));
                }
                // Events are destroyed on the next calling thread, not here: cuEventDestroy
                // takes the context lock, which a caller blocked in a synchronous copy on a
                // stream that waits for the next job may hold (seen: 4 PyTorch processes hung).
                let proxy = sg.proxy;
                proxy.bury(Box::new(sg));
                r.inspect_err(|f| crate::handle::record(func, Some(st), f))
            }));
        }
        // Inline: after every queued call, then the outputs copied back and waited for. (No
        // stream wait on this device, or the asynchronous path is off, or enqueueing failed.)
        st.proxy.drain();
        let r = sg.execute(comm);
        // Streams that already wait for this call are released whatever its outcome.
        if let Some(set) = set_flag {
            set();
        }
        let r = r.and_then(|()| sg.enqueue_outputs());
        // Outputs (if any) landed and no copy still uses a mirror.
        let synced = sg.sync_all(func);
        r.and(synced)
    }

    /// Mirrors every device range of `calls` (input copies enqueued), rewrites the calls onto
    /// the mirrors, and records each stream's `ready` event.
    fn prepare(sg: &mut Staged, calls: &[Call], kinds: &[(MemKind, MemKind, Option<MemKind>)]) -> R<()> {
        for (c, &(sk, rk, pk)) in calls.iter().zip(kinds) {
            // Managed memory is used in place, once the stream's earlier work is done (the
            // proxy waits for the stream's `ready` event before it touches anything).
            for k in [sk, rk].into_iter().chain(pk) {
                if let MemKind::Managed { ordinal } = k {
                    sg.stream(c.stream, ordinal);
                }
            }
            let (s, r) = (c.send as usize, c.recv as usize);
            let (mut send, mut recv) = (c.send, c.recv);
            for sp in spans(c, ordinal(sk).is_some(), ordinal(rk).is_some()) {
                let o = if sp.send { ordinal(sk) } else { ordinal(rk) }.unwrap_or(0);
                let base = sg.mirror(c, o, sp.start, sp.len, sp.input, sp.output)?;
                if sp.send {
                    send = (base + (s - sp.start)) as *const u8;
                }
                if sp.recv {
                    recv = (base + (r - sp.start)) as *mut u8;
                }
            }
            let mut premul = c.premul.clone();
            if let (Some(pm), Some(MemKind::Device { ordinal })) = (premul.as_deref_mut(), pk) {
                if let Scalar::Pointer(p) = pm.scalar {
                    let es = pm.dtype.size_bytes();
                    // Read by the proxy after the stream's `ready` event.
                    pm.scalar = Scalar::Pointer(sg.mirror(c, ordinal, p, es, true, false)?);
                }
            }
            if sg.streams.is_empty() {
                // Only a device scalar or managed memory elsewhere: still ordered on the stream.
                if let Some(o) = [sk, rk].into_iter().chain(pk).find_map(any_ordinal) {
                    sg.stream(c.stream, o);
                }
            }
            sg.host_calls.push(Call { send, recv, premul, ..c.shallow() });
        }
        sg.ready = sg.record()?;
        Ok(())
    }

    impl Call {
        /// A copy of the call's description without its PreMulSum operator.
        fn shallow(&self) -> Call {
            Call {
                func: self.func,
                kind: self.kind,
                dtype: self.dtype,
                send: self.send,
                recv: self.recv,
                send_len: self.send_len,
                recv_len: self.recv_len,
                in_place: self.in_place,
                count: self.count,
                premul: None,
                stream: self.stream,
            }
        }
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::staged::*;
    use super::*;

    fn call(kind: Kind, send: usize, recv: usize, send_len: usize, recv_len: usize, in_place: bool) -> Call {
        Call {
            func: "test",
            kind,
            dtype: DataType::F32,
            send: send as *const u8,
            recv: recv as *mut u8,
            send_len,
            recv_len,
            in_place,
            count: 0,
            premul: None,
            stream: 0,
        }
    }

    /// Which device ranges a call mirrors and which way each is copied: in-place layouts are
    /// one range copied both ways (pointers inside it at their offsets), inputs are copied in
    /// only, outputs back only, and host buffers and empty ranges not at all.
    #[test]
    fn device_buffers_are_mirrored_by_range_and_direction() {
        // In-place AllGather, rank 1 of 4, 256 bytes per rank: one 1 KiB range at recvbuff.
        let c = call(Kind::AllGather, 0x1100, 0x1000, 256, 1024, true);
        let v = spans(&c, true, true);
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].start, v[0].len, v[0].input, v[0].output), (0x1000, 1024, true, true));
        assert!(v[0].send && v[0].recv);
        // In-place ReduceScatter: the range is the larger send buffer.
        let c = call(Kind::ReduceScatter(ReduceOp::Sum), 0x2000, 0x2200, 1024, 256, true);
        let v = spans(&c, true, true);
        assert_eq!((v[0].start, v[0].len), (0x2000, 1024));
        // Out of place, both on the device: input in, output back.
        let c = call(Kind::AllReduce(ReduceOp::Max), 0x3000, 0x9000, 64, 64, false);
        let v = spans(&c, true, true);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].start, v[0].input, v[0].output, v[0].send), (0x3000, true, false, true));
        assert_eq!((v[1].start, v[1].input, v[1].output, v[1].recv), (0x9000, false, true, true));
        // Device input, host output: only the input is mirrored.
        let v = spans(&c, true, false);
        assert_eq!(v.len(), 1);
        assert!(v[0].send && !v[0].recv);
        // A non-root Reduce has no output range; a Recv no input range.
        let c = call(Kind::Reduce(ReduceOp::Sum, Rank::new(0)), 0x3000, 0x9000, 64, 0, false);
        assert_eq!(spans(&c, true, true).len(), 1);
        let c = call(Kind::Recv(Rank::new(0)), 0, 0x9000, 0, 64, false);
        let v = spans(&c, true, true);
        assert_eq!(v.len(), 1);
        assert!(v[0].recv && v[0].output && !v[0].input);
        // Host memory everywhere: nothing.
        let c = call(Kind::AllToAll, 0x3000, 0x9000, 64, 64, false);
        assert!(spans(&c, false, false).is_empty());
    }
}
