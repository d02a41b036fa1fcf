//! `ncclMemAlloc`, buffer registration and windows.
//!
//! `ncclMemAlloc` returns device memory, as NVIDIA's does, when the process uses CUDA (the
//! driver is loaded and a context is current: `cuMemAlloc` in it, so the device engines can
//! export it by CUDA IPC; nccl-tests allocates its buffers this way). Otherwise it returns
//! oxccl shared host memory ([`oxccl::mem::SharedBuf`]): same-host peers map it, so
//! collectives on it take the zero-copy direct path with no registration step.
//! Registrations are recorded per communicator (so deregistering checks the handle) and
//! change nothing else; windows are recorded here too, and registered with the peers by
//! [`crate::win`].
//!
//! Rule: names only [`crate::fail`] and [`crate::handle`] (a registration is a record in the
//! communicator's state).

use crate::fail::{invalid, lock, R};
use crate::handle::{CommState, RegKind};
use oxccl::mem::SharedBuf;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Kept only to own the allocation until `free`.
struct Owned(#[allow(dead_code)] SharedBuf<u8>);

// SAFETY: the allocation is plain shared memory owned by this entry; it is only created and
// dropped under the registry lock, and its bytes are touched only through C pointers.
unsafe impl Send for Owned {}

fn allocs() -> std::sync::MutexGuard<'static, HashMap<usize, Owned>> {
    static A: OnceLock<Mutex<HashMap<usize, Owned>>> = OnceLock::new();
    lock(A.get_or_init(Default::default))
}

/// Device memory `alloc` made: address → the context it was made in.
#[cfg(feature = "cuda")]
fn dev_allocs() -> std::sync::MutexGuard<'static, HashMap<usize, usize>> {
    static A: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    lock(A.get_or_init(Default::default))
}

#[cfg(feature = "cuda")]
fn cuda_fail(what: String, e: oxccl::cuda::CudaError) -> crate::fail::Fail {
    crate::fail::Fail { code: crate::fail::UNHANDLED_CUDA_ERROR, msg: format!("{what}: {e}") }
}

/// `size` bytes of device memory in the current context, if the process uses CUDA (the
/// driver is loaded and a context is current); `None` otherwise.
#[cfg(feature = "cuda")]
fn alloc_device(size: usize) -> R<Option<usize>> {
    match oxccl::cuda::alloc_in_current(size) {
        Ok(Some((p, ctx))) => {
            dev_allocs().insert(p as usize, ctx);
            Ok(Some(p as usize))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(cuda_fail(format!("ncclMemAlloc of {size} bytes on the current device"), e)),
    }
}

/// Frees device memory `alloc` made, in the context it was made in; false if `p` is not such.
#[cfg(feature = "cuda")]
fn free_device(p: usize) -> R<bool> {
    let Some(ctx) = dev_allocs().remove(&p) else { return Ok(false) };
    oxccl::cuda::free_in(ctx, p as u64).map_err(|e| cuda_fail(format!("ncclMemFree of {p:#x}"), e))?;
    Ok(true)
}

/// Allocates `size` bytes: device memory when the process uses CUDA, else shared host
/// memory (see the module doc); returns its address.
pub fn alloc(size: usize) -> R<usize> {
    if size == 0 {
        return Err(invalid("size", "0 bytes"));
    }
    #[cfg(feature = "cuda")]
    if let Some(p) = alloc_device(size)? {
        return Ok(p);
    }
    let mut b = SharedBuf::<u8>::zeroed(size)?;
    let p = b.as_mut_ptr() as usize;
    allocs().insert(p, Owned(b));
    Ok(p)
}

/// Frees what [`alloc`] returned.
pub fn free(p: usize) -> R<()> {
    if allocs().remove(&p).is_some() {
        return Ok(());
    }
    #[cfg(feature = "cuda")]
    if free_device(p)? {
        return Ok(());
    }
    Err(invalid("ptr", format!("{p:#x} was not returned by ncclMemAlloc (or was freed already)")))
}

/// Registration handles: unique, never dereferenced, never reused.
fn next_handle() -> usize {
    static N: AtomicUsize = AtomicUsize::new(1);
    N.fetch_add(1, Ordering::Relaxed) << 4
}

/// Records `[buff, buff + size)` on `st`; returns the handle.
pub fn register(st: &CommState, kind: RegKind, buff: usize, size: usize) -> R<usize> {
    if buff == 0 {
        return Err(invalid("buff", "NULL pointer"));
    }
    if size == 0 {
        return Err(invalid("size", "0 bytes"));
    }
    if buff.checked_add(size).is_none() {
        return Err(invalid("size", format!("{size} bytes from {buff:#x} wrap around the address space")));
    }
    let h = next_handle();
    lock(&st.regs).insert(h, (buff, size, kind));
    Ok(h)
}

/// Drops the registration `h` of `kind` from `st` (the argument is named `arg`).
pub fn deregister(st: &CommState, kind: RegKind, h: usize, arg: &str) -> R<()> {
    let mut regs = lock(&st.regs);
    match regs.get(&h) {
        Some((_, _, k)) if *k == kind => {
            regs.remove(&h);
            Ok(())
        }
        Some((_, _, k)) => Err(invalid(arg, format!("{h:#x} is a {k:?} registration, not a {kind:?} one"))),
        None => {
            Err(invalid(arg, format!("{h:#x} is not registered on this communicator (or was deregistered)")))
        }
    }
}
