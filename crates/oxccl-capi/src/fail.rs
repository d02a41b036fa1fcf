//! The result of an entry point: NCCL's result codes ([`ncclResult_t`]), a failure with its
//! message ([`Fail`], [`R`]), the usual failures ([`invalid`], [`usage`], [`code_of`] for
//! oxccl's errors), and [`lock`], which a poisoned lock does not stop.
//!
//! Rule: the bottom of the C ABI: every module may name it, it names none of them.

use oxccl::Error;
use std::sync::{Mutex, MutexGuard};

/// `ncclResult_t` (a C enum: an `int`).
#[allow(non_camel_case_types)]
pub type ncclResult_t = i32;

pub const SUCCESS: ncclResult_t = 0;
pub const UNHANDLED_CUDA_ERROR: ncclResult_t = 1;
pub const SYSTEM_ERROR: ncclResult_t = 2;
pub const INTERNAL_ERROR: ncclResult_t = 3;
pub const INVALID_ARGUMENT: ncclResult_t = 4;
pub const INVALID_USAGE: ncclResult_t = 5;
pub const REMOTE_ERROR: ncclResult_t = 6;
pub const IN_PROGRESS: ncclResult_t = 7;

/// A failed call: its result code and what went wrong.
#[derive(Debug, Clone)]
pub struct Fail {
    pub code: ncclResult_t,
    pub msg: String,
}

pub type R<T> = Result<T, Fail>;

/// A bad argument, named.
pub fn invalid(arg: &str, why: impl std::fmt::Display) -> Fail {
    Fail { code: INVALID_ARGUMENT, msg: format!("invalid argument {arg}: {why}") }
}

/// A call not allowed in the current state.
pub fn usage(why: impl std::fmt::Display) -> Fail {
    Fail { code: INVALID_USAGE, msg: format!("invalid usage: {why}") }
}

/// NCCL's result code for an oxccl error.
pub fn code_of(e: &Error) -> ncclResult_t {
    match e {
        Error::Invalid(_) => INVALID_ARGUMENT,
        Error::InvalidUsage(_)
        | Error::Rejected { .. }
        | Error::Aborted { .. }
        | Error::CallMismatch { .. } => INVALID_USAGE,
        Error::Io { .. } => SYSTEM_ERROR,
        Error::PeerClosed { .. }
        | Error::PeerFailed { .. }
        | Error::Mismatch { .. }
        | Error::Timeout { .. }
        | Error::Broken { .. } => REMOTE_ERROR,
        _ => INTERNAL_ERROR,
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail { code: code_of(&e), msg: e.to_string() }
    }
}

impl From<oxccl_core::CoreError> for Fail {
    fn from(e: oxccl_core::CoreError) -> Fail {
        Fail::from(Error::from(e))
    }
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
