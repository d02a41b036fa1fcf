//! Communicator handles: each one's state ([`CommState`]), the registry that maps a handle to
//! its tomb, the communicator the running entry point works on, and the last-error record.
//!
//! A `ncclComm_t` is the address of a [`Tomb`] that is never freed, so an address is never
//! reused: a handle that was destroyed stays recognisable (and is refused by name) instead of
//! aliasing a newer communicator. The registry maps that address to the tomb, and the tomb to
//! the communicator's state while it lives; calls reach the state through a [`Pin`], and
//! ending the communicator frees it (see [`crate::tomb`] and [`crate::life`]).
//!
//! Rule: below every module that runs calls; it names only [`crate::fail`], [`crate::tomb`]
//! and [`crate::proxy`] (a state's parts).

use crate::fail::{invalid, lock, usage, Fail, INTERNAL_ERROR, R};
use crate::proxy::Proxy;
use crate::tomb::{self, phase};
use oxccl::Communicator;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::atomic::AtomicI32;
use std::sync::{Condvar, Mutex, OnceLock, RwLock};

/// A communicator's tomb (see [`crate::tomb`]), over its state.
pub type Tomb = tomb::Tomb<CommState>;
/// A pin on a communicator's state (see [`crate::tomb`]).
pub type Pin = tomb::Pin<CommState>;

/// What a registration handle stands for (`CommState::regs`; see [`crate::mem`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegKind {
    Buffer,
    Window,
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

/// One `ncclComm_t`'s state, reached through a [`Pin`] and freed when the communicator ends
/// (with its [`Communicator`]: connections, threads, memory); its [`Tomb`] stays.
pub struct CommState {
    pub handle: usize,
    /// The handle's tomb: its phase (one of [`phase`]'s values; READY only once `comm` is
    /// set) and pins.
    pub tomb: &'static Tomb,
    pub comm: OnceLock<Communicator>,
    pub failure: OnceLock<Fail>,
    /// Signalled when init ends (`wait_init`).
    init_lock: Mutex<()>,
    init_cv: Condvar,
    /// The CUDA device reported by `ncclCommCuDevice` (-1: a host-memory communicator).
    pub device: i32,
    pub name: Option<String>,
    /// `config->blocking` (children inherit it when their config is NULL).
    pub blocking: bool,
    pub last_error: Mutex<Option<String>>,
    pub premul: Mutex<HashMap<i32, PreMul>>,
    pub next_op: AtomicI32,
    /// `config->numRmaCtx`: one-sided calls name contexts `0..num_rma_ctx` (NCCL's default 1).
    pub num_rma_ctx: AtomicI32,
    /// The grow id `ncclCommGetUniqueId` made and no `ncclCommGrow` consumed yet.
    pub grow_id: Mutex<Option<[u8; 128]>>,
    /// Registered buffers (`ncclCommRegister`) and windows, by handle: `(address, bytes, kind)`.
    pub regs: Mutex<HashMap<usize, (usize, usize, RegKind)>>,
    /// Runs the communicator's stream-ordered calls (device buffers) after they returned.
    pub proxy: Proxy,
    /// The device engine of the communicator's calls on device buffers, made at the first,
    /// released at `ncclCommDestroy` / `ncclCommAbort`.
    #[cfg(feature = "cuda")]
    pub dev: Mutex<DevSlot>,
}

/// A communicator's device engine (`CommState::dev`).
#[cfg(feature = "cuda")]
#[derive(Default)]
pub enum DevSlot {
    /// No call on device buffers yet.
    #[default]
    Unmade,
    /// Shared with the calls running on it: the last one out drops it.
    Made(std::sync::Arc<oxccl::cuda::DevComm<'static>>),
    Failed(Fail),
    /// Given back when the communicator was destroyed.
    Released,
}

#[cfg(feature = "cuda")]
impl CommState {
    /// The device engine, made by `make` at the first call; `Err` if making it failed (or
    /// the communicator was destroyed, which calls check before they get here).
    pub fn dev_engine(
        &self,
        make: impl FnOnce() -> R<oxccl::cuda::DevComm<'static>>,
    ) -> R<std::sync::Arc<oxccl::cuda::DevComm<'static>>> {
        let mut slot = lock(&self.dev);
        if let DevSlot::Unmade = *slot {
            *slot = match make() {
                Ok(d) => DevSlot::Made(std::sync::Arc::new(d)),
                Err(f) => DevSlot::Failed(f),
            };
        }
        match &*slot {
            DevSlot::Made(d) => Ok(d.clone()),
            DevSlot::Failed(f) => Err(f.clone()),
            DevSlot::Released | DevSlot::Unmade => {
                Err(usage(format!("communicator {:#x} was destroyed", self.handle)))
            }
        }
    }

    /// Gives the device engine back (its device memory, events and meeting state): at
    /// destroy or abort (which first tells kernels waiting on the GPU to give up), after the
    /// proxy has drained. A call still running on it keeps it until it returns.
    pub fn release_dev(&self, abort: bool) {
        let old = std::mem::replace(&mut *lock(&self.dev), DevSlot::Released);
        if let (DevSlot::Made(d), true) = (&old, abort) {
            d.abort();
        }
        drop(old);
    }
}

impl CommState {
    /// The phase now (`phase::*`).
    #[inline]
    pub fn phase(&self) -> u8 {
        self.tomb.phase()
    }

    /// The communicator, if it is ready for calls.
    #[inline]
    pub fn ready(&self) -> R<&Communicator> {
        match self.phase() {
            phase::READY => self.comm.get().ok_or_else(|| self.not_ready(phase::READY)),
            p => Err(self.not_ready(p)),
        }
    }

    /// The communicator, if it is a member of a group that still stands: ready, suspended or
    /// revoked (queries, and shrink or split after a revoke).
    pub fn member(&self) -> R<&Communicator> {
        match self.phase() {
            phase::READY | phase::SUSPENDED | phase::REVOKED => {
                self.comm.get().ok_or_else(|| self.not_ready(phase::READY))
            }
            p => Err(self.not_ready(p)),
        }
    }

    /// This state for `'static`, for what runs after the call that started it: proxy jobs and
    /// the device engine (which borrows the communicator).
    ///
    /// # Safety
    /// The caller holds a pin, and what gets the reference ends before the state is freed:
    /// proxy jobs (the state's drop stops the proxy first: every job run, its thread joined;
    /// a job is submitted only under a pin, and the state is freed only once no pin is left)
    /// and the device engine (released by the state's drop before its communicator).
    #[cfg(feature = "cuda")]
    pub unsafe fn forever(&self) -> &'static CommState {
        // SAFETY: see the function's contract.
        unsafe { &*(self as *const CommState) }
    }

    #[cold]
    fn not_ready(&self, p: u8) -> Fail {
        let h = self.handle;
        match p {
            phase::INIT => usage(format!(
                "communicator {h:#x} is still initializing (poll ncclCommGetAsyncError until it returns ncclSuccess)"
            )),
            phase::FAILED => self.failure.get().cloned().unwrap_or_else(|| usage("init failed")),
            phase::FINALIZED => usage(format!(
                "communicator {h:#x} was finalized (only ncclCommDestroy may follow ncclCommFinalize)"
            )),
            phase::DESTROYED => usage(format!("communicator {h:#x} was destroyed")),
            phase::SUSPENDED => {
                usage(format!("communicator {h:#x} is suspended (ncclCommResume it before this call)"))
            }
            phase::REVOKED => usage(format!(
                "communicator {h:#x} was revoked (only ncclCommShrink, ncclCommSplit, ncclCommDestroy and queries may follow)"
            )),
            _ => Fail { code: INTERNAL_ERROR, msg: format!("communicator {h:#x} in unknown state {p}") },
        }
    }

    /// Waits until init has finished one way or the other.
    pub fn wait_init(&self) {
        let mut g = lock(&self.init_lock);
        while self.phase() == phase::INIT {
            g = self.init_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Ends init with `r` and returns its outcome (see [`set_init`](Self::set_init)).
    pub fn finish_init(&self, r: R<Communicator>) -> R<()> {
        let out = r.as_ref().map(|_| ()).map_err(Fail::clone);
        self.set_init(r);
        out
    }

    /// Ends init with `r`. A communicator that was aborted meanwhile is closed at once.
    pub fn set_init(&self, r: R<Communicator>) {
        let _g = lock(&self.init_lock);
        match r {
            Ok(c) => {
                let fresh = self.comm.set(c).is_ok();
                let won = fresh && self.tomb.advance(phase::INIT, phase::READY);
                if !won {
                    if let Some(c) = self.comm.get() {
                        c.close();
                    }
                }
            }
            Err(f) => {
                let _ = self.failure.set(f);
                let _ = self.tomb.advance(phase::INIT, phase::FAILED);
            }
        }
        self.init_cv.notify_all();
    }

    /// Moves to DESTROYED (for good: the last pin out frees the state); returns the phase it
    /// left.
    pub fn destroy(&self) -> u8 {
        let _g = lock(&self.init_lock);
        let old = self.tomb.end();
        self.init_cv.notify_all();
        old
    }
}

impl Drop for CommState {
    /// What borrows the state ends first: the proxy's jobs (run, its thread joined), then the
    /// device engine; the communicator and the rest go after.
    fn drop(&mut self) {
        self.proxy.stop();
        #[cfg(feature = "cuda")]
        self.release_dev(false);
    }
}

/// Every handle this process made. Read when a thread meets a handle for the first time,
/// written when a communicator is made.
fn registry() -> &'static RwLock<HashMap<usize, &'static Tomb>> {
    static R: OnceLock<RwLock<HashMap<usize, &'static Tomb>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

#[inline]
fn lookup(handle: usize) -> Option<&'static Tomb> {
    // Tombs are never freed (see the module doc), so a handle seen once maps to the same tomb
    // forever: a per-thread cache of recent ones answers without touching the shared lock
    // (whose reader count would bounce between cores of ranks that are threads).
    thread_local! {
        static SEEN: RefCell<Vec<&'static Tomb>> = const { RefCell::new(Vec::new()) };
    }
    if let Some(st) = SEEN.with(|s| s.borrow().iter().copied().find(|t| t.handle() == handle)) {
        return Some(st);
    }
    let st = *registry().read().unwrap_or_else(|e| e.into_inner()).get(&handle)?;
    SEEN.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() >= 8 {
            s.remove(0);
        }
        s.push(st);
    });
    Some(st)
}

/// A new handle in phase INIT, pinned.
pub fn new_comm(device: i32, name: Option<String>, blocking: bool) -> Pin {
    let st = Tomb::make(|tomb| CommState {
        handle: tomb.handle(),
        tomb,
        comm: OnceLock::new(),
        failure: OnceLock::new(),
        init_lock: Mutex::new(()),
        init_cv: Condvar::new(),
        device,
        name,
        blocking,
        last_error: Mutex::new(None),
        premul: Mutex::new(HashMap::new()),
        next_op: AtomicI32::new(5),
        num_rma_ctx: AtomicI32::new(1),
        grow_id: Mutex::new(None),
        regs: Mutex::new(HashMap::new()),
        proxy: Default::default(),
        #[cfg(feature = "cuda")]
        dev: Mutex::new(DevSlot::Unmade),
    });
    registry().write().unwrap_or_else(|e| e.into_inner()).insert(st.handle, st.tomb());
    st
}

/// The tomb behind `comm` (which the caller names `arg`).
#[inline]
pub fn state(comm: *const std::ffi::c_void, arg: &str) -> R<&'static Tomb> {
    if comm.is_null() {
        return Err(invalid(arg, "NULL communicator"));
    }
    lookup(comm as usize).ok_or_else(|| {
        invalid(arg, format!("{comm:p} is not a communicator created by this library (oxccl's libnccl)"))
    })
}

/// The state behind `comm`, pinned, once `check` passed on it (the handle is the current one).
#[inline]
fn pinned(comm: *const std::ffi::c_void, check: impl FnOnce(&CommState) -> R<&Communicator>) -> R<Pin> {
    let tomb = state(comm, "comm")?;
    CURRENT.with(|c| c.set(tomb.handle()));
    let st = tomb.pin()?;
    check(&st)?;
    Ok(st)
}

/// The state behind `comm`, pinned, if its communicator is ready, suspended or revoked
/// (`st.member()` gives it): for queries, and shrink or split after a revoke.
pub fn member_of(comm: *const std::ffi::c_void) -> R<Pin> {
    pinned(comm, CommState::member)
}

/// The state behind `comm`, pinned, if its communicator is ready (`st.ready()` gives it).
#[inline]
pub fn ready(comm: *const std::ffi::c_void) -> R<Pin> {
    pinned(comm, CommState::ready)
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    /// The handle of the communicator the running entry point works on (0: none); its
    /// failures are recorded there too.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

pub fn set_current(st: Option<&CommState>) {
    set_current_handle(st.map_or(0, |s| s.handle));
}

pub fn set_current_handle(h: usize) {
    CURRENT.with(|c| c.set(h));
}

/// The communicator the running entry point worked on, pinned (`None`: none, or it ended).
pub fn take_current() -> Option<Pin> {
    match CURRENT.with(|c| c.replace(0)) {
        0 => None,
        h => lookup(h)?.pin().ok(),
    }
}

fn to_cstring(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Records a failure of `func` on this thread and, when known, on its communicator.
pub fn record(func: &str, comm: Option<&CommState>, f: &Fail) {
    let who = comm.and_then(|st| st.comm.get()).map(|c| format!("rank {} of {}: ", c.rank(), c.size()));
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
        lookup(comm as usize).and_then(|t| t.pin().ok()).and_then(|st| lock(&st.last_error).clone())
    };
    LAST.with(|l| {
        if let Some(m) = from_comm {
            *l.borrow_mut() = to_cstring(&m);
        }
        l.borrow().as_ptr()
    })
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;
    use crate::fail::{INVALID_USAGE, UNHANDLED_CUDA_ERROR};

    /// The device engine is made once (a failure to make it is kept and answered again
    /// without trying anew) and, once released at destroy, every later ask is refused.
    #[test]
    fn the_device_engine_is_made_once_and_refused_after_release() {
        let st = new_comm(0, None, true);
        let mut tries = 0;
        for _ in 0..3 {
            let e = st
                .dev_engine(|| {
                    tries += 1;
                    Err(Fail { code: UNHANDLED_CUDA_ERROR, msg: "no CUDA here".into() })
                })
                .err()
                .expect("a failure");
            assert_eq!((e.code, e.msg.as_str()), (UNHANDLED_CUDA_ERROR, "no CUDA here"));
        }
        assert_eq!(tries, 1);
        st.release_dev(false);
        let e = st.dev_engine(|| panic!("made after release")).err().expect("refused");
        assert_eq!(e.code, INVALID_USAGE);
        assert!(e.msg.contains("was destroyed"), "{}", e.msg);
        // A communicator destroyed before any device call: released at once, refused after.
        let fresh = new_comm(0, None, true);
        fresh.release_dev(true);
        assert!(fresh.dev_engine(|| panic!("made after release")).is_err());
    }
}
