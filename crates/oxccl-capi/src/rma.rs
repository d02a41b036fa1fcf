//! NCCL 2.29+'s one-sided calls: `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`, over
//! `oxccl::rma` (windows: [`crate::win`]).
//!
//! Rules:
//! 1. Every argument is checked when the call is made (inside a group too), each refusal
//!    naming the argument: `ncclInvalidArgument` for bad values, `ncclInvalidUsage` for
//!    memory no path serves (device memory: no engine writes a peer's device memory).
//! 2. Outside a group a call runs at once and completes before it returns, whatever the
//!    stream (host memory), after the communicator's queued stream-ordered calls.
//! 3. Inside a group, a communicator's one-sided calls and window (de)registrations join one
//!    batch, which `ncclGroupEnd` runs as one job, in program order, before the group's
//!    collectives (jobs of several communicators run concurrently, so one thread may drive
//!    several ranks); a group that fails runs nothing. NCCL's word: operations to one peer and
//!    context take effect in program order, and `ncclGroupEnd` returns once all completed.
//! 4. `ctx` is below `config->numRmaCtx` (NCCL's default 1; 0 turns the calls off) and below
//!    oxccl's `CONTEXTS`; `sigIdx` is below oxccl's `SIGNALS` (NCCL 2.30 takes only 0 for
//!    both); `flags` must be 0; `opCnt` and `nDesc` at least 1 (as NCCL checks).

use crate::handle::{self, invalid, lock, usage, CommState, Fail, R, SUCCESS};
use crate::life::{Pin, Tomb};
use crate::win::{self, WinState};
use oxccl::rma::{WaitDesc, Window, CONTEXTS, SIGNALS};
use oxccl::{Communicator, Rank};
use std::cell::RefCell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclWaitSignalDesc {
    pub op_cnt: c_int,
    pub peer: c_int,
    pub sig_idx: c_int,
    pub ctx: c_int,
}

/// A checked one-sided call or window (de)registration, ready to run.
pub(crate) enum Op {
    Register {
        h: usize,
        base: usize,
        len: usize,
        device: bool,
        state: Arc<Mutex<WinState>>,
    },
    Deregister {
        state: Arc<Mutex<WinState>>,
    },
    Put {
        src: usize,
        bytes: usize,
        peer: Rank,
        h: usize,
        state: Arc<Mutex<WinState>>,
        off: usize,
        at: (usize, usize),
    },
    Signal {
        peer: Rank,
        at: (usize, usize),
    },
    Wait {
        descs: Vec<WaitDesc>,
    },
}

// SAFETY: an Op is addresses and sizes; nccl.h makes the caller keep `src` valid and unchanged
// until the call (or its group) has completed, and the window memory registered until it is
// deregistered, on whichever thread runs the op.
unsafe impl Send for Op {}

impl Op {
    fn func(&self) -> &'static str {
        match self {
            Op::Register { .. } => "ncclCommWindowRegister",
            Op::Deregister { .. } => "ncclCommWindowDeregister",
            Op::Put { .. } => "ncclPutSignal",
            Op::Signal { .. } => "ncclSignal",
            Op::Wait { .. } => "ncclWaitSignal",
        }
    }

    fn run(self, st: &CommState, c: &Communicator) -> R<()> {
        match self {
            Op::Register { h, base, len, device, state } => {
                // SAFETY: the caller registers memory it keeps valid until it deregisters the
                // window (nccl.h's contract for ncclCommWindowRegister).
                let r = unsafe { c.register_window(base as *mut u8, len, device) };
                match r {
                    Ok(w) => {
                        *lock(&state) = WinState::Ready(w);
                        Ok(())
                    }
                    Err(e) => {
                        let f = Fail::from(e);
                        *lock(&state) = WinState::Failed(f.msg.clone());
                        win::forget(st, h);
                        Err(f)
                    }
                }
            }
            Op::Deregister { state } => {
                let w = std::mem::replace(&mut *lock(&state), WinState::Gone);
                match w {
                    WinState::Ready(w) => c.deregister_window(w).map_err(Fail::from),
                    // Its registration failed (and said so): nothing was registered.
                    _ => Ok(()),
                }
            }
            Op::Put { src, bytes, peer, h, state, off, at } => {
                let w = ready_window(&state, h, "peerWin")?;
                let data: &[u8] = if bytes == 0 {
                    &[]
                } else {
                    // SAFETY: checked non-NULL with `bytes` > 0; the caller keeps `bytes`
                    // bytes at `src` valid until the call completes.
                    unsafe { std::slice::from_raw_parts(src as *const u8, bytes) }
                };
                c.put_signal(data, peer, &w, off, at.0, at.1).map_err(Fail::from)
            }
            Op::Signal { peer, at } => c.signal(peer, at.0, at.1).map_err(Fail::from),
            Op::Wait { descs } => c.wait_signal(&descs).map_err(Fail::from),
        }
    }
}

/// The registered window behind a handle whose registration may have been queued.
fn ready_window(state: &Mutex<WinState>, h: usize, arg: &str) -> R<Window> {
    match &*lock(state) {
        WinState::Ready(w) => Ok(*w),
        WinState::Pending => Err(Fail {
            code: handle::INTERNAL_ERROR,
            msg: format!("window {h:#x} is used before its registration ran"),
        }),
        WinState::Failed(why) => Err(invalid(arg, format!("{h:#x}: its registration failed: {why}"))),
        WinState::Gone => Err(invalid(arg, format!("{h:#x} was deregistered"))),
    }
}

/// Runs `ops` on `st` in order; the first failure stops them.
fn run(st: &Pin, ops: Vec<Op>) -> R<()> {
    let c = st.ready()?;
    if st.proxy.pending() > 0 {
        st.proxy.drain();
    }
    st.proxy.check()?;
    let mut ops = ops.into_iter();
    while let Some(op) = ops.next() {
        let func = op.func();
        if let Err(f) = op.run(st, c) {
            // Registrations queued after the failure never run: their handles go.
            for later in ops {
                if let Op::Register { h, state, .. } = later {
                    *lock(&state) = WinState::Failed(format!("an earlier call of its group failed ({func})"));
                    win::forget(st, h);
                }
            }
            return Err(Fail { msg: format!("{func}: {}", f.msg), ..f });
        }
    }
    Ok(())
}

/// A communicator's one-sided calls of the open group (rule 3).
struct Batch {
    /// Queued work holds no pin: the group's job pins when it runs.
    tomb: &'static Tomb,
    ops: Vec<Op>,
    /// Set once the batch ran or was dropped: later calls start a new one.
    closed: bool,
}

/// Closes its batch when the group's job is dropped unrun (a failed group).
struct CloseOnDrop(Arc<Mutex<Batch>>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        lock(&self.0).closed = true;
    }
}

thread_local! {
    static OPEN: RefCell<Vec<Arc<Mutex<Batch>>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `op` on `st` now, or adds it to the open group's batch for `st` (rule 3).
pub(crate) fn submit(st: &Pin, op: Op) -> R<()> {
    if !crate::ops::in_group() {
        return run(st, vec![op]);
    }
    let open = OPEN.with(|o| {
        let mut o = o.borrow_mut();
        o.retain(|b| !lock(b).closed);
        o.iter().find(|b| lock(b).tomb.handle() == st.handle).cloned()
    });
    if let Some(b) = open {
        lock(&b).ops.push(op);
        return Ok(());
    }
    let tomb = st.tomb();
    let b = Arc::new(Mutex::new(Batch { tomb, ops: vec![op], closed: false }));
    OPEN.with(|o| o.borrow_mut().push(b.clone()));
    let guard = CloseOnDrop(b.clone());
    crate::ops::submit_job(Box::new(move || {
        let ops = {
            let mut g = lock(&guard.0);
            g.closed = true;
            std::mem::take(&mut g.ops)
        };
        let st = tomb.pin()?;
        run(&st, ops).inspect_err(|f| handle::record("ncclGroupEnd", Some(&st), f))
    }))
}

/// The state behind `comm`, pinned, with its communicator ready.
fn comm_of(comm: *mut c_void) -> R<Pin> {
    handle::ready(comm)
}

fn check_peer(arg: &str, peer: c_int, c: &Communicator) -> R<Rank> {
    if peer < 0 || peer as usize >= c.size() {
        return Err(invalid(arg, format!("{peer} is not a rank of this {}-rank communicator", c.size())));
    }
    Ok(Rank::new(peer as usize))
}

/// Checks `(sigIdx, ctx)` (rule 4); the arguments are named `sig_arg`, `ctx_arg`.
fn check_at(st: &CommState, sig: c_int, ctx: c_int, sig_arg: &str, ctx_arg: &str) -> R<(usize, usize)> {
    if sig < 0 || sig as usize >= SIGNALS {
        return Err(invalid(sig_arg, format!("{sig} (oxccl serves signal indices 0..{})", SIGNALS - 1)));
    }
    let n = st.num_rma_ctx.load(Ordering::Relaxed);
    if ctx < 0 || ctx >= n {
        let why = if n == 0 { " (0 turns one-sided calls off)" } else { "" };
        return Err(invalid(ctx_arg, format!("{ctx} is not below config->numRmaCtx = {n}{why}")));
    }
    if ctx as usize >= CONTEXTS {
        return Err(invalid(ctx_arg, format!("{ctx} (oxccl serves contexts 0..{})", CONTEXTS - 1)));
    }
    Ok((ctx as usize, sig as usize))
}

fn check_flags(flags: c_uint) -> R<()> {
    if flags != 0 {
        return Err(invalid("flags", format!("{flags:#x} (reserved: must be 0)")));
    }
    Ok(())
}

/// Refuses device memory at `p` (rule 1).
#[cfg(feature = "cuda")]
fn check_host(p: usize, arg: &str) -> R<()> {
    match oxccl::cuda::stage::classify(p as *const u8) {
        oxccl::cuda::stage::MemKind::Host => Ok(()),
        k => Err(usage(format!(
            "{arg} {p:#x} is CUDA memory ({k:?}): oxccl's one-sided calls serve host memory only (no engine moves device memory for them)"
        ))),
    }
}

#[cfg(not(feature = "cuda"))]
fn check_host(_p: usize, _arg: &str) -> R<()> {
    Ok(())
}

crate::entry! {
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, peer_win: *mut c_void,
        peer_win_offset: usize, sig_idx: c_int, ctx: c_int, flags: c_uint, comm: *mut c_void, stream: *mut c_void
    ) {
        let _ = stream;
        let st = comm_of(comm)?;
        let c = st.ready()?;
        let dtype = crate::ops::dtype_of(datatype)?;
        let bytes = count
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| invalid("count", format!("{count} elements of {dtype} overflow the address space")))?;
        if localbuff.is_null() && bytes > 0 {
            return Err(invalid("localbuff", format!("NULL pointer with count {count}")));
        }
        let peer = check_peer("peer", peer, c)?;
        let (h, state) = win::lookup(&st, peer_win as usize, "peerWin")?;
        let at = check_at(&st, sig_idx, ctx, "sigIdx", "ctx")?;
        check_flags(flags)?;
        let end = peer_win_offset
            .checked_add(bytes)
            .ok_or_else(|| invalid("peerWinOffset", format!("{peer_win_offset} + {bytes} bytes overflow")))?;
        if let WinState::Ready(w) = &*lock(&state) {
            let size = c.window_size(w, peer)?;
            if end > size {
                return Err(invalid(
                    "peerWinOffset",
                    format!("{peer_win_offset} + {bytes} bytes runs past rank {peer}'s window, which holds {size} bytes"),
                ));
            }
        }
        if bytes > 0 {
            check_host(localbuff as usize, "localbuff")?;
        }
        let op = Op::Put { src: localbuff as usize, bytes, peer, h, state, off: peer_win_offset, at };
        submit(&st, op)?;
        Ok(SUCCESS)
    }

    fn ncclSignal / pncclSignal(peer: c_int, sig_idx: c_int, ctx: c_int, flags: c_uint, comm: *mut c_void, stream: *mut c_void) {
        let _ = stream;
        let st = comm_of(comm)?;
        let c = st.ready()?;
        let peer = check_peer("peer", peer, c)?;
        let at = check_at(&st, sig_idx, ctx, "sigIdx", "ctx")?;
        check_flags(flags)?;
        submit(&st, Op::Signal { peer, at })?;
        Ok(SUCCESS)
    }

    fn ncclWaitSignal / pncclWaitSignal(n_desc: c_int, signal_descs: *mut ncclWaitSignalDesc, comm: *mut c_void, stream: *mut c_void) {
        let _ = stream;
        let st = comm_of(comm)?;
        let c = st.ready()?;
        if n_desc < 1 {
            return Err(invalid("nDesc", format!("{n_desc} (at least one descriptor)")));
        }
        if signal_descs.is_null() {
            return Err(invalid("signalDescs", format!("NULL pointer with nDesc {n_desc}")));
        }
        // SAFETY: nccl.h: `signalDescs` is an array of `nDesc` descriptors (checked non-NULL,
        // nDesc ≥ 1), read during the call only.
        let raw = unsafe { crate::ptr::slice(signal_descs, n_desc as usize, "signalDescs") }?;
        let mut descs = Vec::with_capacity(raw.len());
        for (i, d) in raw.iter().enumerate() {
            if d.op_cnt < 1 {
                return Err(invalid(&format!("signalDescs[{i}].opCnt"), format!("{} (at least 1)", d.op_cnt)));
            }
            let peer = check_peer(&format!("signalDescs[{i}].peer"), d.peer, c)?;
            let (ctx, sig) =
                check_at(&st, d.sig_idx, d.ctx, &format!("signalDescs[{i}].sigIdx"), &format!("signalDescs[{i}].ctx"))?;
            descs.push(WaitDesc { peer, count: d.op_cnt as u64, ctx, sig });
        }
        submit(&st, Op::Wait { descs })?;
        Ok(SUCCESS)
    }
}
