//! How every C entry point runs: [`entry!`](crate::entry!) defines `ncclX` and its profiling
//! alias `pncclX`, and [`guard`] runs the body: it catches a panic (answering
//! `ncclInternalError`), records a failure for `ncclGetLastError` and notes it in the open
//! group (which then fails as a whole).
//!
//! Rule: above the handles and the group queue ([`crate::ops`]), below every module that
//! defines entry points (they name it as `crate::entry!`).

use crate::fail::{ncclResult_t, Fail, INTERNAL_ERROR, R};
use crate::handle;
use crate::ops;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Runs an entry point's body: catches panics, records failures, notes them in an open group.
pub(crate) fn guard(func: &'static str, f: impl FnOnce() -> R<ncclResult_t>) -> ncclResult_t {
    handle::set_current(None);
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Fail {
            code: INTERNAL_ERROR,
            msg: format!("internal error: oxccl panicked: {}", panic_text(&*p)),
        })
    });
    match r {
        Ok(code) => code,
        Err(fail) => {
            let cur = handle::take_current();
            handle::record(func, cur.as_deref(), &fail);
            if func != "ncclGroupEnd" && func != "ncclGroupSimulateEnd" {
                ops::group_failed(&fail);
            }
            fail.code
        }
    }
}

/// Defines `ncclX` and its alias `pncclX`, both returning `ncclResult_t` (modules use it as
/// `crate::entry!`). The functions are `unsafe` (nccl.h's contracts on their pointer
/// arguments); the body is not an `unsafe` block: each of its raw-pointer operations is a
/// call of a [`crate::ptr`] helper in a block of its own, with its own `// SAFETY:` reasoning.
macro_rules! entry {
    ($( fn $name:ident / $pname:ident ( $($a:ident : $t:ty),* $(,)? ) $body:block )*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $crate::fail::ncclResult_t {
            $crate::entry::guard(stringify!($name), || $body)
        }

        #[no_mangle]
        pub unsafe extern "C" fn $pname($($a: $t),*) -> $crate::fail::ncclResult_t {
            // SAFETY: the same contract, passed on unchanged.
            unsafe { $name($($a),*) }
        }
    )*};
}

#[allow(unused_imports)] // used by the modules that define entry points
pub(crate) use entry;
