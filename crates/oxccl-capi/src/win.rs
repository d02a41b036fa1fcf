//! Windows: `ncclCommWindowRegister` / `Deregister` (collective, as in NCCL), the window
//! queries `ncclWinGetUserPtr`, `ncclGetPeerDevicePointer`, `ncclGetLsaDevicePointer` and
//! `ncclGetLsaMultimemDevicePointer`. The table of windows and the registrations' runs are
//! [`crate::winops`]'s (shared with the one-sided calls of [`crate::rma`]; neither of the two
//! names the other).
//!
//! Rules:
//! 1. A window handle is unique in the process and never reused (the registration handles of
//!    [`crate::mem`]); a process-wide table maps it to its communicator, its memory and its
//!    state, since the device-pointer queries name no communicator.
//! 2. Registration is collective (`oxccl::rma`: every rank registers its windows in the same
//!    order, the k-th of each forming one window) and may be queued in a group (the handle is
//!    returned at once, the exchange runs at `ncclGroupEnd`, [`crate::rma`]'s rule 3). A
//!    registration that fails forgets its handle. Deregistration is collective too; the handle
//!    is refused by every later call at once.
//! 3. Device memory (CUDA pointers) is registered like host memory, so the order stays
//!    aligned; one-sided calls into it are refused (`ncclInvalidUsage`).
//! 4. oxccl has no device API: the device-pointer queries check their arguments as NCCL does
//!    and answer NULL with `ncclSuccess`, NCCL's answer where no device mapping exists.

use crate::fail::{invalid, R, SUCCESS};
use crate::handle::{self, Pin, RegKind};
use crate::mem;
use crate::ptr::put;
use crate::winops::{lookup, submit, table, Op, WinRec, WinState};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// The state (pinned, its communicator ready) and base address behind a window the caller
/// names `arg`.
fn window_only(h: usize, arg: &str) -> R<(Pin, usize)> {
    if h == 0 {
        return Err(invalid(arg, "NULL window"));
    }
    let (comm, base) = match table().get(&h) {
        Some(w) => (w.comm, w.base),
        None => {
            return Err(invalid(arg, format!("{h:#x} is not a registered window (or it was deregistered)")))
        }
    };
    let st = handle::ready(comm as *const c_void)?;
    Ok((st, base))
}

#[cfg(feature = "cuda")]
fn on_device(p: usize) -> bool {
    !matches!(oxccl::cuda::stage::classify(p as *const u8), oxccl::cuda::stage::MemKind::Host)
}

#[cfg(not(feature = "cuda"))]
fn on_device(_p: usize) -> bool {
    false
}

crate::entry! {
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: *mut c_void, buff: *mut c_void, size: usize, win: *mut *mut c_void, win_flags: c_int
    ) {
        if win.is_null() {
            return Err(invalid("win", "NULL pointer"));
        }
        // NCCL's answer until a window exists.
        // SAFETY: nccl.h: `win` points to the ncclWindow_t the call fills (checked non-NULL).
        unsafe { put(win, "win", std::ptr::null_mut()) }?;
        if win_flags & !3 != 0 {
            return Err(invalid(
                "winFlags",
                format!("{win_flags:#x} (NCCL_WIN_DEFAULT, NCCL_WIN_COLL_SYMMETRIC, NCCL_WIN_STRICT_ORDERING)"),
            ));
        }
        let st = handle::ready(comm)?;
        let h = mem::register(&st, RegKind::Window, buff as usize, size)?;
        let state = Arc::new(Mutex::new(WinState::Pending));
        table().insert(h, WinRec { comm: st.handle, base: buff as usize, state: state.clone() });
        let device = on_device(buff as usize);
        submit(&st, Op::Register { h, base: buff as usize, len: size, device, state })?;
        // SAFETY: as above: the caller's ncclWindow_t.
        unsafe { put(win, "win", h as *mut c_void) }?;
        Ok(SUCCESS)
    }

    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: *mut c_void, win: *mut c_void) {
        let st = handle::ready(comm)?;
        let h = win as usize;
        if h == 0 {
            return Err(invalid("win", "NULL window"));
        }
        mem::deregister(&st, RegKind::Window, h, "win")?;
        let rec = table().remove(&h);
        match rec {
            Some(r) => submit(&st, Op::Deregister { state: r.state })?,
            None => return Err(invalid("win", format!("{h:#x} is not a registered window"))),
        }
        Ok(SUCCESS)
    }

    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: *mut c_void, win: *mut c_void, out_user_ptr: *mut *mut c_void) {
        if out_user_ptr.is_null() {
            return Err(invalid("outUserPtr", "NULL pointer"));
        }
        let st = handle::ready(comm)?;
        lookup(&st, win as usize, "win")?;
        let base = table().get(&(win as usize)).map_or(0, |w| w.base);
        // SAFETY: nccl.h: `outUserPtr` points to the void* the call fills (checked non-NULL).
        unsafe { put(out_user_ptr, "outUserPtr", base as *mut c_void) }?;
        Ok(SUCCESS)
    }

    fn ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(
        window: *mut c_void, offset: usize, peer: c_int, out_ptr: *mut *mut c_void
    ) {
        let _ = offset;
        if out_ptr.is_null() {
            return Err(invalid("outPtr", "NULL pointer"));
        }
        let (st, _) = window_only(window as usize, "window")?;
        let c = st.ready()?;
        if peer < 0 || peer as usize >= c.size() {
            return Err(invalid("peer", format!("{peer} is not a rank of this {}-rank communicator", c.size())));
        }
        // SAFETY: nccl.h: `outPtr` points to the void* the call fills (checked non-NULL).
        unsafe { put(out_ptr, "outPtr", std::ptr::null_mut()) }?;
        Ok(SUCCESS)
    }

    fn ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(
        window: *mut c_void, offset: usize, lsa_rank: c_int, out_ptr: *mut *mut c_void
    ) {
        let _ = offset;
        if out_ptr.is_null() {
            return Err(invalid("outPtr", "NULL pointer"));
        }
        let (st, _) = window_only(window as usize, "window")?;
        let c = st.ready()?;
        // The load/store team: this rank's host (all of it, shared memory on).
        let me = &c.peers()[c.rank().idx()];
        let lsa = if c.config().shm_disable { 1 } else { c.peers().iter().filter(|p| p.host_id == me.host_id).count() };
        if lsa_rank < 0 || lsa_rank as usize >= lsa {
            return Err(invalid("lsaRank", format!("{lsa_rank} is outside 0..{lsa} (this rank's load/store team: the ranks of its host)")));
        }
        // SAFETY: nccl.h: `outPtr` points to the void* the call fills (checked non-NULL).
        unsafe { put(out_ptr, "outPtr", std::ptr::null_mut()) }?;
        Ok(SUCCESS)
    }

    fn ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(
        window: *mut c_void, offset: usize, out_ptr: *mut *mut c_void
    ) {
        let _ = offset;
        if out_ptr.is_null() {
            return Err(invalid("outPtr", "NULL pointer"));
        }
        window_only(window as usize, "window")?;
        // SAFETY: nccl.h: `outPtr` points to the void* the call fills (checked non-NULL).
        unsafe { put(out_ptr, "outPtr", std::ptr::null_mut()) }?;
        Ok(SUCCESS)
    }
}
