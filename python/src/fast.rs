//! The C entry points the torch backend's compiled fast path (`oxccl/csrc/fast.cpp`) calls for
//! the common call (one contiguous CPU tensor, in place) without going through Python.
//!
//! Rules: a handle is a `Box<Arc<oxccl::Communicator>>` made by `Communicator._fast_handle`
//! and freed by `oxccl_fast_release`, so it outlives a `close()` of the Python object (calls
//! then fail as on a closed communicator, naming it); every entry point catches panics and
//! reports failures as (kind, message) into the caller's buffer, never unwinding into C++.

use oxccl::{DataType, ReduceOp};
use std::ffi::c_void;
use std::sync::Arc;

pub type Handle = Arc<oxccl::Communicator>;

/// Writes `msg` (NUL-terminated, truncated to fit) and the error kind's number into the
/// caller's buffers; returns 1.
///
/// # Safety
/// `err` holds `err_len` writable bytes; `kind` and `ranks` (this rank, the peer) are
/// writable.
unsafe fn fail(e: &oxccl::Error, err: *mut u8, err_len: usize, kind: *mut i32, ranks: *mut i64) -> i32 {
    let (k, r, p) = crate::errors::kind_of(e);
    let msg = e.to_string();
    let n = msg.len().min(err_len.saturating_sub(1));
    // SAFETY: the caller's buffers, within their sizes.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err, n);
        *err.add(n) = 0;
        *kind = k;
        *ranks = r.map(|r| r as i64).unwrap_or(-1);
        *ranks.add(1) = p.map(|p| p as i64).unwrap_or(-1);
    }
    1
}

/// In-place all-reduce of `bytes` bytes at `buf` (host memory) of NCCL type `dtype` with NCCL
/// operator `op`. 0: done; 1: failed (see `fail`: `ranks` holds two numbers, this rank and the
/// peer the error names, -1 for none); 2: not a type or operator oxccl has.
///
/// # Safety
/// `h` is a live handle; `buf` holds `bytes` bytes no one else touches during the call; the
/// error buffers as in `fail`.
#[no_mangle]
pub unsafe extern "C" fn oxccl_fast_all_reduce(
    h: *const c_void,
    buf: *mut c_void,
    bytes: usize,
    dtype: i32,
    op: i32,
    err: *mut u8,
    err_len: usize,
    kind: *mut i32,
    ranks: *mut i64,
) -> i32 {
    let (Some(t), Some(op)) = (DataType::from_nccl(dtype), ReduceOp::from_nccl(op)) else { return 2 };
    // SAFETY: a live handle (the caller's promise).
    let comm: &Handle = unsafe { &*(h as *const Handle) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let s: &mut [u8] = if bytes == 0 {
            &mut []
        } else {
            // SAFETY: the caller's promise on `buf`.
            unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, bytes) }
        };
        let mut g = comm.group();
        g.all_reduce_in_place_raw(t, s, op)?;
        g.end()
    }));
    match r {
        Ok(Ok(())) => 0,
        // SAFETY: the caller's buffers.
        Ok(Err(e)) => unsafe { fail(&e, err, err_len, kind, ranks) },
        Err(_) => {
            let e = oxccl::Error::Internal("panic in the all-reduce fast path".into());
            // SAFETY: the caller's buffers.
            unsafe { fail(&e, err, err_len, kind, ranks) }
        }
    }
}

/// Frees a handle.
///
/// # Safety
/// `h` came from `Communicator._fast_handle` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn oxccl_fast_release(h: *mut c_void) {
    if !h.is_null() {
        // SAFETY: the caller's promise: a Box made by `_fast_handle`, released once.
        drop(unsafe { Box::from_raw(h as *mut Handle) });
    }
}

/// The entry points' addresses, for the compiled fast path.
pub fn addresses() -> Vec<(&'static str, usize)> {
    vec![
        ("all_reduce", oxccl_fast_all_reduce as *const () as usize),
        ("release", oxccl_fast_release as *const () as usize),
    ]
}
