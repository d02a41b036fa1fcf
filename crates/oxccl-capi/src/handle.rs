//! Communicator handles, result codes and the last-error record.
//!
//! A `ncclComm_t` is the address of a small allocation that is never freed, so an address is
//! never reused: a handle that was destroyed stays recognisable (and is refused by name)
//! instead of aliasing a newer communicator. The registry maps that address to the
//! communicator's state.

use oxccl::{Communicator, Error};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

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
        Error::InvalidUsage(_) | Error::Rejected { .. } | Error::Aborted { .. } => INVALID_USAGE,
        Error::Io { .. } => SYSTEM_ERROR,
        Error::PeerClosed { .. } | Error::Mismatch { .. } | Error::Timeout { .. } | Error::Broken { .. } => {
            REMOTE_ERROR
        }
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

/// Where a communicator stands.
pub enum Init {
    /// A nonblocking init (or one queued in a group) has not finished.
    InProgress,
    Ready(Arc<Communicator>),
    /// Init failed: every call answers this.
    Failed(Fail),
    Destroyed,
}

/// A reduction operator made by `ncclRedOpCreatePreMulSum`.
#[derive(Clone, Debug)]
pub enum Scalar {
    /// Read when the operator was created (`ncclScalarHostImmediate`).
    Value(Vec<u8>),
    /// Read when a call uses the operator (`ncclScalarDevice`: host memory on this path).
    Pointer(usize),
}

#[derive(Clone, Debug)]
pub struct PreMul {
    pub dtype: oxccl::DataType,
    pub scalar: Scalar,
}

/// One `ncclComm_t`'s state.
pub struct CommState {
    pub handle: usize,
    pub init: Mutex<Init>,
    pub init_cv: Condvar,
    pub finalized: AtomicBool,
    /// The CUDA device reported by `ncclCommCuDevice` (-1: a host-memory communicator).
    pub device: i32,
    pub name: Option<String>,
    /// `config->blocking` (children inherit it when their config is NULL).
    pub blocking: bool,
    pub last_error: Mutex<Option<String>>,
    pub premul: Mutex<HashMap<i32, PreMul>>,
    pub next_op: AtomicI32,
    /// Registered buffers (`ncclCommRegister`) and windows, by handle: `(address, bytes)`.
    pub regs: Mutex<HashMap<usize, (usize, usize, crate::mem::RegKind)>>,
}

impl CommState {
    /// The communicator, if it is ready for calls.
    pub fn ready(&self) -> R<Arc<Communicator>> {
        match &*lock(&self.init) {
            Init::Ready(c) if !self.finalized.load(Ordering::Relaxed) => Ok(c.clone()),
            Init::Ready(_) => Err(usage(format!(
                "communicator {:#x} was finalized (only ncclCommDestroy may follow ncclCommFinalize)",
                self.handle
            ))),
            Init::InProgress => Err(usage(format!(
                "communicator {:#x} is still initializing (poll ncclCommGetAsyncError until it returns ncclSuccess)",
                self.handle
            ))),
            Init::Failed(f) => Err(f.clone()),
            Init::Destroyed => Err(usage(format!("communicator {:#x} was destroyed", self.handle))),
        }
    }

    /// Waits until init has finished one way or the other.
    pub fn wait_init(&self) {
        let mut g = lock(&self.init);
        while matches!(*g, Init::InProgress) {
            g = self.init_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub fn set_init(&self, r: R<Communicator>) {
        let mut g = lock(&self.init);
        if matches!(*g, Init::InProgress) {
            *g = match r {
                Ok(c) => Init::Ready(Arc::new(c)),
                Err(f) => Init::Failed(f),
            };
        }
        self.init_cv.notify_all();
    }
}

fn registry() -> MutexGuard<'static, HashMap<usize, Arc<CommState>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<CommState>>>> = OnceLock::new();
    lock(R.get_or_init(Default::default))
}

/// A new handle in state `InProgress`.
pub fn new_comm(device: i32, name: Option<String>, blocking: bool) -> Arc<CommState> {
    // Never freed: the address stays unique for the life of the process (see the module doc).
    let handle = Box::into_raw(Box::new(0u64)) as usize;
    let st = Arc::new(CommState {
        handle,
        init: Mutex::new(Init::InProgress),
        init_cv: Condvar::new(),
        finalized: AtomicBool::new(false),
        device,
        name,
        blocking,
        last_error: Mutex::new(None),
        premul: Mutex::new(HashMap::new()),
        next_op: AtomicI32::new(5),
        regs: Mutex::new(HashMap::new()),
    });
    registry().insert(handle, st.clone());
    st
}

/// The state behind `comm` (which the caller names `arg`).
pub fn state(comm: *const std::ffi::c_void, arg: &str) -> R<Arc<CommState>> {
    if comm.is_null() {
        return Err(invalid(arg, "NULL communicator"));
    }
    registry().get(&(comm as usize)).cloned().ok_or_else(|| {
        invalid(arg, format!("{comm:p} is not a communicator created by this library (oxccl's libnccl)"))
    })
}

/// The ready communicator behind `comm`.
pub fn ready(comm: *const std::ffi::c_void) -> R<(Arc<CommState>, Arc<Communicator>)> {
    let st = state(comm, "comm")?;
    set_current(Some(st.clone()));
    let c = st.ready()?;
    Ok((st, c))
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    /// The communicator the running entry point works on (its failures are recorded there).
    static CURRENT: RefCell<Option<Arc<CommState>>> = const { RefCell::new(None) };
}

pub fn set_current(st: Option<Arc<CommState>>) {
    CURRENT.with(|c| *c.borrow_mut() = st);
}

pub fn take_current() -> Option<Arc<CommState>> {
    CURRENT.with(|c| c.borrow_mut().take())
}

fn to_cstring(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Records a failure of `func` on this thread and, when known, on its communicator.
pub fn record(func: &str, comm: Option<&CommState>, f: &Fail) {
    let who = comm.and_then(|st| match st.init.try_lock().as_deref() {
        Ok(Init::Ready(c)) => Some(format!("rank {} of {}: ", c.rank(), c.size())),
        _ => None,
    });
    let msg = format!("{func}: {}{}", who.unwrap_or_default(), f.msg);
    if let Some(st) = comm {
        *lock(&st.last_error) = Some(msg.clone());
    }
    LAST.with(|l| *l.borrow_mut() = to_cstring(&msg));
}

/// `ncclGetLastError(comm)`: the communicator's last failure, else this thread's. The text
/// lives in a per-thread buffer until this thread's next failure or query.
pub fn last_error(comm: *const std::ffi::c_void) -> *const c_char {
    let from_comm = if comm.is_null() {
        None
    } else {
        registry().get(&(comm as usize)).and_then(|st| lock(&st.last_error).clone())
    };
    LAST.with(|l| {
        if let Some(m) = from_comm {
            *l.borrow_mut() = to_cstring(&m);
        }
        l.borrow().as_ptr()
    })
}
