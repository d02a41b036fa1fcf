//! `oxccl.Work`: the handle of an asynchronous call or group.
//!
//! Rules: the call's buffers are held by its completion (see `comm`), not by the Work, so a
//! Work dropped unwaited frees nothing early; `wait()` may be called any number of times (the
//! first takes the result, later ones repeat it); waits release the GIL.

use crate::errors::{raise, to_py};
use oxccl::Detached;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

enum State {
    Pending(Detached),
    Ok,
    Failed(PyErr),
}

/// An asynchronous call: `wait()` blocks until it is complete on this rank (raising its
/// error, if any); `is_completed()` never blocks.
#[pyclass(module = "oxccl._oxccl", frozen)]
pub struct Work {
    st: Mutex<State>,
    /// A receive from any rank's sender, once known.
    from: Option<Arc<OnceLock<oxccl::Rank>>>,
}

impl Work {
    pub fn pending(d: Detached) -> Work {
        Work { from: d.source(), st: Mutex::new(State::Pending(d)) }
    }

    /// A call already complete (device calls: enqueued on the stream, which orders them).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn done() -> Work {
        Work { st: Mutex::new(State::Ok), from: None }
    }
}

#[pymethods]
impl Work {
    /// Blocks until the call is complete on this rank; returns True, or raises the call's
    /// error. `timeout` (seconds): raise oxccl.TimeoutError if it is not complete by then
    /// (the call goes on; wait again later).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = match timeout {
            Some(t) if t.is_finite() && t >= 0.0 => Some(Instant::now() + Duration::from_secs_f64(t)),
            Some(t) => {
                return Err(crate::errors::invalid("timeout", format!("{t} is not a number of seconds ≥ 0")))
            }
            None => None,
        };
        let r = py.detach(|| {
            let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
            if let State::Pending(d) = &*st {
                if let Some(deadline) = deadline {
                    let mut nap = Duration::from_micros(20);
                    while !d.test() {
                        if Instant::now() >= deadline {
                            return Err(timeout.unwrap_or(0.0));
                        }
                        std::thread::sleep(nap);
                        nap = (nap * 2).min(Duration::from_millis(5));
                    }
                }
                let State::Pending(d) = std::mem::replace(&mut *st, State::Ok) else { unreachable!() };
                if let Err(e) = d.wait() {
                    *st = State::Failed(to_py(e));
                }
            }
            Ok(())
        });
        if let Err(t) = r {
            return Err(raise(
                "TimeoutError",
                format!("the asynchronous call is not complete after {t} s"),
                None,
                None,
            ));
        }
        match &*self.st.lock().unwrap_or_else(|e| e.into_inner()) {
            State::Failed(e) => Err(e.clone_ref(py)),
            _ => Ok(true),
        }
    }

    /// For a receive from any rank (`recv(buf, None, async_op=True)`): the rank whose message
    /// it received, once complete; None before, and for every other call.
    #[getter]
    fn source(&self) -> Option<u32> {
        self.from.as_ref().and_then(|f| f.get()).map(|r| r.0)
    }

    /// Whether the call is complete (never blocks).
    fn is_completed(&self) -> bool {
        match &*self.st.lock().unwrap_or_else(|e| e.into_inner()) {
            State::Pending(d) => d.test(),
            _ => true,
        }
    }

    /// The call's error once it is complete (None if it succeeded or is still running).
    fn exception(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if !self.is_completed() {
            return Ok(None);
        }
        match self.wait(py, None) {
            Ok(_) => Ok(None),
            Err(e) => Ok(Some(e.into_value(py).into_any())),
        }
    }

    fn __repr__(&self) -> String {
        format!("<oxccl.Work {}>", if self.is_completed() { "completed" } else { "pending" })
    }
}
