//! `oxccl._oxccl`: the Python extension module under the package `oxccl`.
//!
//! Responsibility: turn Python objects (numpy arrays, torch tensors, anything with the buffer
//! protocol) into the addresses, lengths and data types of `oxccl::Communicator` calls, run
//! those calls with the GIL released, and turn `oxccl::Error` into the exception classes of
//! `oxccl.errors`. Rules:
//! - a buffer's address is taken while the GIL is held and the object is referenced for as
//!   long as a call may touch its memory (until a synchronous call returns; until an
//!   asynchronous call is complete, by the reference its completion drops);
//! - no Rust panic crosses into Python (PyO3 turns one into `PanicException`, which we never
//!   rely on: every failure path returns a `PyErr`);
//! - nothing here reads the environment; `oxccl::env` does.

mod buf;
mod comm;
#[cfg(feature = "cuda")]
mod dev;
mod errors;
mod fast;
mod ops;
mod work;

use pyo3::prelude::*;

/// A new unique id (128 bytes): rank 0 makes it, every rank passes it to `Communicator`.
#[pyfunction]
fn unique_id(py: Python<'_>) -> PyResult<Vec<u8>> {
    let cfg = oxccl::env::config().map_err(errors::to_py)?;
    let id = py.detach(|| oxccl::new_unique_id(&cfg)).map_err(errors::to_py)?;
    Ok(id.to_bytes().to_vec())
}

/// The element types every call takes, reductions included, by numpy's and torch's names
/// (bool reduces logically; complex types with "sum" and "avg" only). The calls that only
/// move data (broadcast, gathers, scatters, all-to-all, send/recv) also take any other
/// fixed-size type, as bytes.
#[pyfunction]
fn data_types() -> Vec<&'static str> {
    buf::reducible_names()
}

/// The fast path's C entry points: name → address (for `oxccl/csrc/fast.cpp`), and the
/// error class names by number.
#[pyfunction]
fn _fast_api() -> (Vec<(&'static str, usize)>, Vec<&'static str>) {
    (fast::addresses(), errors::KINDS.to_vec())
}

/// A setting's value in this process's environment (read by `oxccl::env`, the one reader of
/// the environment), for the Python modules' own switches.
#[pyfunction]
fn _setting(key: &str) -> Option<String> {
    oxccl::env::param(key)
}

#[pymodule]
fn _oxccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(data_types, m)?)?;
    m.add_function(wrap_pyfunction!(_fast_api, m)?)?;
    m.add_function(wrap_pyfunction!(_setting, m)?)?;
    m.add_class::<comm::Communicator>()?;
    m.add_class::<comm::GroupCall>()?;
    m.add_class::<work::Work>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
