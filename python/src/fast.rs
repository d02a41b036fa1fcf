//! The C entry points the torch backend's compiled fast path (`oxccl/csrc/fast.cpp`) calls for
//! the common calls (contiguous CPU tensors: all-reduce, broadcast, reduce, all-gather and
//! reduce-scatter into one tensor, all-to-all-single, barrier) without going through Python.
//!
//! Rules: a handle is a `Box<Arc<oxccl::Communicator>>` made by `Communicator._fast_handle`
//! and freed by `oxccl_fast_release`, so it outlives a `close()` of the Python object (calls
//! then fail as on a closed communicator, naming it); every entry point catches panics and
//! reports failures as (kind, message) into the caller's buffer, never unwinding into C++. A
//! call whose arguments are wrong is not run here but handed back (2), so that the Python
//! path raises the error it names, exactly as it would have without the fast path.

use crate::buf::{Buf, Elem, Place, Ty};
use crate::ops::{self, Kind, Op};
use oxccl::{DataType, Rank, ReduceOp};
use std::ffi::c_void;
use std::sync::Arc;

pub type Handle = Arc<oxccl::Communicator>;

/// One call, as `fast.cpp` lays it out (`struct OxCall` there: the same fields, in this
/// order). Buffers are byte ranges of host memory; counts are elements per rank.
#[repr(C)]
pub struct FastCall {
    /// A `KIND_*` below.
    pub kind: i32,
    /// NCCL's type number, or [`DTYPE_BOOL`].
    pub dtype: i32,
    /// NCCL's operator number (reductions).
    pub op: i32,
    /// The root (broadcast, reduce).
    pub root: i64,
    pub send: *const c_void,
    pub send_bytes: usize,
    pub recv: *mut c_void,
    pub recv_bytes: usize,
    /// All-to-all with counts: `size` numbers each (elements to / from each rank, packed in
    /// rank order); null otherwise.
    pub send_counts: *const i64,
    pub recv_counts: *const i64,
}

/// The type number of bool (carried as uint8, reduced logically: `buf::Elem::Bool`); NCCL's
/// numbers end at 11.
pub const DTYPE_BOOL: i32 = 100;

/// `send` reduced into `recv` in place (one buffer: `recv`).
pub const KIND_ALL_REDUCE: i32 = 0;
/// `recv` of the root to every rank's `recv`, in place.
pub const KIND_BROADCAST: i32 = 1;
/// Every rank's `recv` reduced into the root's, in place (non-roots' `recv` is input only).
pub const KIND_REDUCE: i32 = 2;
/// `send` of every rank into `recv` (size × send), rank order.
pub const KIND_ALL_GATHER: i32 = 3;
/// Block r of the reduction of every `send` into rank r's `recv`.
pub const KIND_REDUCE_SCATTER: i32 = 4;
/// Block j of `send` to rank j, into its block i of `recv`.
pub const KIND_ALL_TO_ALL: i32 = 5;
/// As all-to-all, with per-rank counts (`send_counts`, `recv_counts`).
pub const KIND_ALL_TO_ALL_V: i32 = 6;
/// Returns once every rank has called it.
pub const KIND_BARRIER: i32 = 7;

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

/// The op `c` describes, or None where the Python path must take it (a type, operator, root or
/// count this path does not take, or arguments the Python path rejects with an error).
///
/// # Safety
/// `c`'s count arrays, where not null, hold `size` numbers each.
unsafe fn op_of(c: &FastCall, me: usize, size: usize) -> Option<Op> {
    let ty = match c.dtype {
        DTYPE_BOOL => Ty { dtype: DataType::U8, elem: Elem::Bool },
        n => Ty::plain(DataType::from_nccl(n)?),
    };
    let host = |ptr: usize, len: usize| Buf { ptr, len, dtype: ty.dtype, elem: ty.elem, place: Place::Host };
    let send = (c.send_bytes > 0 && !c.send.is_null()).then(|| host(c.send as usize, c.send_bytes));
    let recv = (c.recv_bytes > 0 && !c.recv.is_null()).then(|| host(c.recv as usize, c.recv_bytes));
    let op = || ReduceOp::from_nccl(c.op);
    let root = || (c.root >= 0 && (c.root as u64) < size as u64).then_some(Rank(c.root as u32));
    let one = |kind: Kind| Op::in_place_checked(kind, recv?).ok();
    // Both buffers given and the arguments right, else the Python path (empty tensors
    // included: it knows their rules).
    let two =
        |kind: Kind, at: &dyn Fn(&Buf) -> Option<usize>| Op::checked(kind, Some(send?), Some(recv?), at).ok();
    match c.kind {
        KIND_ALL_REDUCE => one(Kind::AllReduce(op()?)),
        KIND_BROADCAST => one(Kind::Broadcast(root()?)),
        KIND_REDUCE => {
            let (op, root) = (op()?, root()?);
            if root.idx() == me {
                one(Kind::Reduce(op, root))
            } else {
                // A non-root's tensor is input only.
                Op::checked(Kind::Reduce(op, root), Some(recv?), None, |_| None).ok()
            }
        }
        KIND_ALL_GATHER => two(Kind::AllGather, &ops::block_of_output(me, size)),
        KIND_REDUCE_SCATTER => two(Kind::ReduceScatter(op()?), &ops::output_is_block(me)),
        KIND_ALL_TO_ALL => two(Kind::AllToAll, &|_| None),
        KIND_ALL_TO_ALL_V => {
            if c.send_counts.is_null() || c.recv_counts.is_null() {
                return None;
            }
            // SAFETY: the caller's promise: `size` numbers each.
            let (sc, rc) = unsafe {
                (
                    std::slice::from_raw_parts(c.send_counts, size),
                    std::slice::from_raw_parts(c.recv_counts, size),
                )
            };
            let counts =
                |v: &[i64]| v.iter().map(|&n| usize::try_from(n).ok()).collect::<Option<Vec<usize>>>();
            let (send_counts, recv_counts) = (counts(sc)?, counts(rc)?);
            let kind = Kind::AllToAllV {
                send_displs: crate::comm::prefix_sums(&send_counts),
                recv_displs: crate::comm::prefix_sums(&recv_counts),
                send_counts,
                recv_counts,
            };
            two(kind, &|_| None)
        }
        _ => None,
    }
}

/// Runs one call. 0: done; 1: failed (see `fail`: `ranks` holds two numbers, this rank and
/// the peer the error names, -1 for none); 2: not taken (the Python path must run it).
///
/// # Safety
/// `h` is a live handle; `c` points to a valid `FastCall` whose buffers hold their byte
/// counts, untouched by anyone else during the call; the error buffers as in `fail`.
#[no_mangle]
pub unsafe extern "C" fn oxccl_fast_call(
    h: *const c_void,
    c: *const FastCall,
    err: *mut u8,
    err_len: usize,
    kind: *mut i32,
    ranks: *mut i64,
) -> i32 {
    // SAFETY: a live handle and a valid call (the caller's promise).
    let (comm, c): (&Handle, &FastCall) = unsafe { (&*(h as *const Handle), &*c) };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if c.kind == KIND_BARRIER {
            return comm.barrier().map(|()| true);
        }
        // SAFETY: the caller's promise on the count arrays.
        let Some(op) = (unsafe { op_of(c, comm.rank().idx(), comm.size()) }) else { return Ok(false) };
        let mut g = comm.group();
        // SAFETY: the caller's promise on the buffers, for the whole call (the group ends here).
        unsafe { op.add(&mut g)? };
        g.end().map(|()| true)
    }));
    match r {
        Ok(Ok(true)) => 0,
        Ok(Ok(false)) => 2,
        // SAFETY: the caller's buffers.
        Ok(Err(e)) => unsafe { fail(&e, err, err_len, kind, ranks) },
        Err(_) => {
            let e = oxccl::Error::Internal("panic in the torch backend's fast path".into());
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
        ("call", oxccl_fast_call as *const () as usize),
        ("release", oxccl_fast_release as *const () as usize),
    ]
}
