//! NCCL 2.29+'s one-sided calls: `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`, over
//! `oxccl::rma` (windows: [`crate::win`]). Their arguments are checked here; the checked
//! operations run through [`crate::winops`], which windows share (this module and `win`
//! name it, never each other).
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

use crate::fail::{invalid, lock, usage, R, SUCCESS};
use crate::handle::{self, CommState, Pin};
use crate::winops::{self, submit, Op, WinState};
use oxccl::rma::{WaitDesc, CONTEXTS, SIGNALS};
use oxccl::{Communicator, Rank};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclWaitSignalDesc {
    pub op_cnt: c_int,
    pub peer: c_int,
    pub sig_idx: c_int,
    pub ctx: c_int,
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
        let (h, state) = winops::lookup(&st, peer_win as usize, "peerWin")?;
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
