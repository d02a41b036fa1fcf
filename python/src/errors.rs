//! `oxccl::Error` → the exception classes of `oxccl.errors` (one per kind of failure), with
//! the library's message and the ranks it names.

use oxccl::Error;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let m = MODULE.get_or_try_init(py, || py.import("oxccl.errors").map(|m| m.unbind()))?;
    Ok(m.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// The exception `kind` (a class name of `oxccl.errors`) with `msg`, `rank` and `peer`.
pub fn raise(kind: &str, msg: String, rank: Option<u32>, peer: Option<u32>) -> PyErr {
    Python::attach(|py| match class(py, kind).and_then(|c| c.call1((msg.clone(), rank, peer))) {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    })
}

/// A bad argument: `InvalidArgumentError` naming `arg`.
pub fn invalid(arg: &str, why: impl std::fmt::Display) -> PyErr {
    raise("InvalidArgumentError", format!("{arg}: {why}"), None, None)
}

/// The error classes by number (the fast path's C entry points report the number).
pub const KINDS: [&str; 7] = [
    "Error",
    "InvalidArgumentError",
    "MismatchError",
    "PeerGoneError",
    "TimeoutError",
    "AbortedError",
    "RendezvousError",
];

/// `e`'s class number in [`KINDS`], the rank that raised it and the peer it names.
pub fn kind_of(e: &Error) -> (i32, Option<u32>, Option<u32>) {
    let (kind, rank, peer) = classify(e);
    (KINDS.iter().position(|k| *k == kind).unwrap_or(0) as i32, rank, peer)
}

/// The class for `e`, with the ranks it names.
pub fn to_py(e: Error) -> PyErr {
    let (kind, rank, peer) = classify(&e);
    raise(kind, e.to_string(), rank, peer)
}

fn classify(e: &Error) -> (&'static str, Option<u32>, Option<u32>) {
    match e {
        Error::Invalid(_) | Error::InvalidUsage(_) => ("InvalidArgumentError", None, None),
        Error::Mismatch { rank, peer, .. } | Error::CallMismatch { rank, peer, .. } => {
            ("MismatchError", Some(rank.0), Some(peer.0))
        }
        // The peer found the two calls differ first and said so (its reason names both).
        Error::PeerFailed { rank, peer, reason, .. } if reason.contains("calls differ") => {
            ("MismatchError", Some(rank.0), Some(peer.0))
        }
        Error::PeerClosed { rank, peer, .. } | Error::PeerFailed { rank, peer, .. } => {
            ("PeerGoneError", Some(rank.0), Some(peer.0))
        }
        Error::Timeout { rank, waiting_for, .. } => {
            ("TimeoutError", Some(rank.0), waiting_for.first().map(|r| r.0))
        }
        Error::Aborted { rank } => ("AbortedError", Some(rank.0), None),
        Error::Broken { rank, first } => (broken_kind(first), Some(rank.0), None),
        Error::Rejected { rank, .. }
        | Error::NotARoot { rank, .. }
        | Error::Store { rank, .. }
        | Error::Rendezvous { rank, .. } => ("RendezvousError", Some(rank.0), None),
        Error::Io { rank, peer, .. } => ("Error", Some(rank.0), peer.map(|p| p.0)),
        _ => ("Error", None, None),
    }
}

/// A communicator that failed earlier keeps the kind of its first failure (a peer's failure
/// that was a mismatch it found is a mismatch, as `classify` has it).
fn broken_kind(first: &str) -> &'static str {
    if first.contains("calls differ") || first.contains("the two ranks' calls differ") {
        "MismatchError"
    } else if first.contains("closed its connection") || first.contains(") failed:") {
        "PeerGoneError"
    } else if first.contains("timed out") {
        "TimeoutError"
    } else if first.contains("aborted") {
        "AbortedError"
    } else {
        "Error"
    }
}
