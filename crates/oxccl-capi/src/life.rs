//! A communicator's life: its handle (a tombstone that outlives it), the pins that keep its
//! state alive while a call uses it, and its end (`ncclCommFinalize`, `ncclCommDestroy`,
//! `ncclCommAbort`), which frees everything the communicator held.
//!
//! An `ncclComm_t` is the address of a [`Tomb`]: 16 bytes that are never freed, so a handle is
//! never reused and a stale one is refused by name ("communicator 0x... was destroyed")
//! instead of aliasing a newer communicator. The tomb points at the communicator's
//! [`CommState`] (the `Communicator` with its connections, threads and memory, the proxy, the
//! registrations...), which is freed when the communicator ends.
//!
//! Rules (what makes freeing the state safe while other threads may hold the handle):
//! - A call reaches the state only through a [`Pin`], taken by [`Tomb::pin`]: one atomic add
//!   to the tomb's word, which holds the phase (low bits) and the pin count (the rest). One
//!   word, so a pin and the move to DESTROYED are ordered by that word's modification order
//!   alone: a pin added before the move is counted by whoever frees, and a pin added after it
//!   sees DESTROYED and leaves at once, never touching the state.
//! - DESTROYED is final: no phase follows it, so once the count of a destroyed tomb reaches
//!   zero no real pin can appear again.
//! - The last pin out of a destroyed tomb frees the state (its unpin sees `DESTROYED` with a
//!   count of one); the pointer swap to null makes exactly one thread free it. The ender holds
//!   a pin while it closes the communicator, so in the usual case (no call in flight
//!   elsewhere) the ender's own unpin frees it, and `ncclCommDestroy` returns with everything
//!   released. Calls still running on other threads delay the free to their return; the ender
//!   waits for that (bounded, saying what it waits for), then leaves it to them.
//! - What outlives a call without a pin (proxy jobs, the device engine) ends before the state
//!   is freed: `CommState`'s drop stops the proxy (running every job, joining its thread) and
//!   releases the device engine first.

use crate::handle::{
    lock, ncclResult_t, phase, set_current, state, usage, CommState, Fail, INTERNAL_ERROR, IN_PROGRESS, R,
    SUCCESS, SYSTEM_ERROR,
};
use crate::ops;
use oxccl::Communicator;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The phase's bits in [`Tomb::word`].
const PHASE: u64 = 0x7f;
/// Set once the state has been freed (after its drop returned).
const FREED: u64 = 0x80;
/// One pin in [`Tomb::word`].
const PIN: u64 = 0x100;

/// What stays of a communicator for the life of the process; its address is the `ncclComm_t`.
pub struct Tomb {
    /// The phase (`phase::*`, bits 0..6), FREED (bit 7) and the pin count (bits 8..63: no
    /// process holds 2^56 pins).
    word: AtomicU64,
    /// The state while the communicator lives; null once it was freed.
    state: AtomicPtr<CommState>,
}

/// Signalled when a state has been freed (what enders waiting for calls of other threads
/// wait on; rare, so one for the process).
static FREES: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

impl Tomb {
    /// A tomb for a new state in phase INIT, and the first pin on it.
    pub fn make(new: impl FnOnce(&'static Tomb) -> CommState) -> Pin {
        let tomb: &'static Tomb = Box::leak(Box::new(Tomb {
            word: AtomicU64::new(phase::INIT as u64 | PIN),
            state: AtomicPtr::new(std::ptr::null_mut()),
        }));
        let st = NonNull::from(Box::leak(Box::new(new(tomb))));
        tomb.state.store(st.as_ptr(), Ordering::Release);
        Pin { tomb, st }
    }

    /// The handle: this tomb's address.
    pub fn handle(&self) -> usize {
        self as *const Tomb as usize
    }

    /// The phase now (`phase::*`).
    #[inline]
    pub fn phase(&self) -> u8 {
        (self.word.load(Ordering::Acquire) & PHASE) as u8
    }

    /// Whether the state has been freed (its drop has returned).
    pub fn is_freed(&self) -> bool {
        self.word.load(Ordering::Acquire) & FREED != 0
    }

    /// Pins the state, unless the communicator was destroyed.
    #[inline]
    pub fn pin(&'static self) -> R<Pin> {
        let w = self.word.fetch_add(PIN, Ordering::Acquire);
        let st = self.state.load(Ordering::Acquire);
        match NonNull::new(st) {
            Some(st) if w & PHASE != phase::DESTROYED as u64 => Ok(Pin { tomb: self, st }),
            _ => Err(self.refuse(w)),
        }
    }

    #[cold]
    fn refuse(&'static self, w: u64) -> Fail {
        self.unpin();
        match w & PHASE {
            p if p == phase::DESTROYED as u64 => {
                usage(format!("communicator {:#x} was destroyed", self.handle()))
            }
            p => Fail {
                code: INTERNAL_ERROR,
                msg: format!("communicator {:#x} has no state in phase {p}", self.handle()),
            },
        }
    }

    #[inline]
    fn unpin(&self) {
        let w = self.word.fetch_sub(PIN, Ordering::AcqRel);
        if w & PHASE == phase::DESTROYED as u64 && w >> 8 == 1 {
            self.free();
        }
    }

    /// Frees the state (called by the last pin out of a destroyed tomb: nothing else can
    /// reach the state any more; the swap picks one thread if several saw the count at zero).
    #[cold]
    fn free(&self) {
        let st = self.state.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if st.is_null() {
            return;
        }
        // SAFETY: `st` came from `Box::leak` in `make`, and the swap above gave it to this
        // thread alone; no pin holds it (the count reached zero after DESTROYED, which no pin
        // passes), so nothing else can reach it.
        drop(unsafe { Box::from_raw(st) });
        self.word.fetch_or(FREED, Ordering::Release);
        let _g = lock(&FREES.0);
        FREES.1.notify_all();
    }

    /// Moves `from` → `to`, keeping the pins; false if the phase was not `from`. Never out
    /// of DESTROYED, nor into it ([`end`](Self::end) does that).
    pub fn advance(&self, from: u8, to: u8) -> bool {
        if from == phase::DESTROYED || to == phase::DESTROYED {
            return false;
        }
        self.word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w & PHASE == from as u64).then_some((w & !PHASE) | to as u64)
            })
            .is_ok()
    }

    /// Moves to DESTROYED (final); returns the phase it left.
    pub fn end(&self) -> u8 {
        let w = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some((w & !PHASE) | phase::DESTROYED as u64)
            })
            .unwrap_or_else(|w| w);
        (w & PHASE) as u8
    }

    /// Waits (at most `bound`) until the state has been freed: calls still running on it in
    /// other threads free it as the last of them returns. Says every `notice` what it waits
    /// for, and when it stops waiting. True if it was freed.
    pub fn await_free(&self, func: &str, bound: Duration, notice: Option<Duration>) -> bool {
        let freed = || self.is_freed();
        if freed() {
            return true;
        }
        let t0 = Instant::now();
        let mut next = notice.map(|n| t0 + n);
        let mut g = lock(&FREES.0);
        while !freed() {
            let now = Instant::now();
            let pins = self.word.load(Ordering::Acquire) >> 8;
            if now >= t0 + bound {
                eprintln!(
                    "oxccl: {func}: communicator {:#x}: {pins} call(s) still running on it in other threads after {:.1} s; \
                     returning now: the last of them frees the communicator when it returns",
                    self.handle(),
                    t0.elapsed().as_secs_f64()
                );
                return false;
            }
            if let Some(at) = next.filter(|at| now >= *at) {
                eprintln!(
                    "oxccl: {func}: communicator {:#x}: still waiting after {} s for {pins} call(s) running on it in \
                     other threads to return (waiting at most {} s)",
                    self.handle(),
                    t0.elapsed().as_secs(),
                    bound.as_secs()
                );
                next = notice.map(|n| at + n);
            }
            let until = next.map_or(t0 + bound, |n| n.min(t0 + bound));
            g = FREES
                .1
                .wait_timeout(g, until.saturating_duration_since(now))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// A communicator's state, kept alive while this is held (see the module's rules). Cloning
/// adds a pin; dropping removes one, and frees the state if it was the last one out of a
/// destroyed communicator.
pub struct Pin {
    tomb: &'static Tomb,
    st: NonNull<CommState>,
}

// SAFETY: a Pin is a shared reference to a CommState (which is Send and Sync: its fields are
// atomics, locks, OnceLocks and Send + Sync values) kept valid by the pin count.
unsafe impl Send for Pin {}
// SAFETY: as above.
unsafe impl Sync for Pin {}

impl Pin {
    pub fn tomb(&self) -> &'static Tomb {
        self.tomb
    }
}

impl Deref for Pin {
    type Target = CommState;

    #[inline]
    fn deref(&self) -> &CommState {
        // SAFETY: the state is freed only once the pin count of a destroyed tomb reaches zero,
        // and this pin is counted until it is dropped.
        unsafe { self.st.as_ref() }
    }
}

impl Clone for Pin {
    fn clone(&self) -> Pin {
        // Already pinned: the count is above zero, so the state stays whatever the phase.
        self.tomb.word.fetch_add(PIN, Ordering::Relaxed);
        Pin { tomb: self.tomb, st: self.st }
    }
}

impl Drop for Pin {
    #[inline]
    fn drop(&mut self) {
        self.tomb.unpin();
    }
}

/// Starts `job` for the new communicator `st`: now (blocking), queued (in a group) or on a
/// thread (nonblocking). Returns what the init call answers. A queued init holds no pin: if
/// the communicator is aborted before the group ends, its state is freed and the init skipped;
/// a thread's init keeps its pin, and frees the state itself if it was aborted meanwhile.
pub fn launch_init(
    st: Pin,
    blocking: bool,
    job: impl FnOnce() -> R<Communicator> + Send + 'static,
) -> R<ncclResult_t> {
    if ops::in_group() {
        let tomb = st.tomb();
        drop(st);
        ops::submit_job(Box::new(move || match tomb.pin() {
            Ok(st) => st.finish_init(job()),
            Err(_) => Ok(()),
        }))?;
        return Ok(if blocking { SUCCESS } else { IN_PROGRESS });
    }
    if blocking {
        set_current(Some(&st));
        st.finish_init(job())?;
        return Ok(SUCCESS);
    }
    std::thread::Builder::new()
        .name("oxccl-capi-init".into())
        .spawn(move || {
            let _ = st.finish_init(job());
        })
        .map_err(|e| Fail { code: SYSTEM_ERROR, msg: format!("cannot start the init thread: {e}") })?;
    Ok(IN_PROGRESS)
}

/// A parent communicator for a job that runs later (a split, a shrink): pinned now when the
/// job runs outside a group (at once, or on its own thread: ending the parent then waits for
/// the job), else pinned when the group runs it (queued jobs hold no pin).
pub enum Later {
    Pinned(Pin),
    Queued(&'static Tomb),
}

impl Later {
    pub fn new(st: &Pin) -> Later {
        if ops::in_group() {
            Later::Queued(st.tomb())
        } else {
            Later::Pinned(st.clone())
        }
    }

    /// Runs `f` on the parent's communicator (it was ready when the job was made), pinned.
    pub fn with<T>(self, f: impl FnOnce(&Communicator) -> R<T>) -> R<T> {
        let st = match self {
            Later::Pinned(p) => p,
            Later::Queued(t) => t.pin()?,
        };
        let c = st.comm.get().ok_or_else(|| Fail {
            code: INTERNAL_ERROR,
            msg: format!("communicator {:#x} has no communicator", st.handle),
        })?;
        f(c)
    }
}

/// How long `ncclCommAbort` waits for aborted calls of other threads to return (they return
/// within milliseconds of the abort) before it leaves the free to them.
const ABORT_WAIT: Duration = Duration::from_secs(2);

/// How long `ncclCommDestroy` waits for calls of other threads when the communicator has no
/// timeout (with one, it waits that long: a call still running then has failed).
const DESTROY_WAIT: Duration = Duration::from_secs(60);

/// How long an end waits for calls of other threads (see [`Tomb::await_free`]), and how often
/// it says so.
fn waits(st: &CommState, abort: bool) -> (Duration, Option<Duration>) {
    let c = st.comm.get();
    let bound = match (abort, c.and_then(|c| c.config().timeout)) {
        (true, _) => ABORT_WAIT,
        (false, Some(t)) => t,
        (false, None) => DESTROY_WAIT,
    };
    (bound, c.map_or(Some(Duration::from_secs(5)), |c| c.config().wait_notice))
}

crate::entry! {
    fn ncclCommFinalize / pncclCommFinalize(comm: crate::ncclComm_t) {
        let st = crate::handle::ready(comm)?;
        // Host-memory calls complete before they return; stream-ordered ones finish here.
        st.proxy.drain();
        if !st.tomb.advance(phase::READY, phase::FINALIZED) {
            st.ready()?;
        }
        Ok(SUCCESS)
    }

    fn ncclCommDestroy / pncclCommDestroy(comm: crate::ncclComm_t) {
        if comm.is_null() {
            return Ok(SUCCESS);
        }
        let tomb = state(comm, "comm")?;
        let st = tomb.pin()?;
        set_current(Some(&st));
        st.wait_init();
        end(st, "ncclCommDestroy", false)
    }

    fn ncclCommAbort / pncclCommAbort(comm: crate::ncclComm_t) {
        if comm.is_null() {
            return Ok(SUCCESS);
        }
        let tomb = state(comm, "comm")?;
        let st = tomb.pin()?;
        set_current(Some(&st));
        end(st, "ncclCommAbort", true)
    }
}

/// Ends the communicator of `st` (destroy, or abort): closes it, then frees its state (or
/// leaves that to the last call still running on it in another thread).
fn end(st: Pin, func: &str, abort: bool) -> R<ncclResult_t> {
    let old = st.destroy();
    if old == phase::DESTROYED {
        return Err(usage(format!("communicator {:#x} was already destroyed", st.handle)));
    }
    if let Some(c) = st.comm.get() {
        if abort {
            c.abort();
        }
        // Stream-ordered calls still queued finish first (each releases its stream; after an
        // abort they fail at once).
        st.proxy.drain();
        #[cfg(feature = "cuda")]
        st.release_dev(abort);
        c.close();
    }
    // An init still running (nonblocking, or in another thread) ends on its own: it finds
    // the phase DESTROYED, closes its communicator and, as the last pin out, frees the state.
    let waiting = old != phase::INIT;
    let (bound, notice) = waits(&st, abort);
    let tomb = st.tomb();
    drop(st);
    if waiting {
        tomb.await_free(func, bound, notice);
    }
    Ok(SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::new_comm;

    /// The last pin out of a destroyed communicator frees its state, whichever thread holds
    /// it; pins taken after the end are refused by name and free nothing twice.
    #[test]
    fn the_last_pin_out_frees_the_state_once() {
        let st = new_comm(-1, None, true);
        let tomb = st.tomb();
        let other = st.clone();
        assert_eq!(st.destroy(), phase::INIT);
        assert!(!tomb.is_freed());
        let late = tomb.pin().err().expect("refused after the end");
        assert!(late.msg.contains("was destroyed"), "{}", late.msg);
        drop(st);
        assert!(!tomb.is_freed(), "freed while another thread still holds a pin");
        let t = std::thread::spawn(move || drop(other));
        t.join().unwrap();
        assert!(tomb.is_freed());
        assert!(tomb.await_free("test", Duration::from_secs(1), None));
        assert_eq!(tomb.phase(), phase::DESTROYED);
        assert!(tomb.pin().is_err());
        assert!(!tomb.advance(phase::DESTROYED, phase::READY), "DESTROYED is final");
        assert_eq!(tomb.phase(), phase::DESTROYED);
    }

    /// Threads pinning in a loop while another ends the communicator: every pin either
    /// succeeds (and finds the state whole) or is refused, and the state is freed exactly once
    /// after the last pin is gone.
    #[test]
    fn pins_racing_an_end_never_outlive_the_state() {
        for round in 0..if cfg!(miri) { 3 } else { 50 } {
            let st = new_comm(-1, Some(format!("round {round}")), true);
            let tomb = st.tomb();
            let want = format!("round {round}");
            let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let (want, ended) = (want.clone(), ended.clone());
                    std::thread::spawn(move || {
                        let mut pinned = 0u64;
                        loop {
                            // Set after the end: a pin taken once it is seen must be refused.
                            let after_end = ended.load(Ordering::Acquire);
                            match tomb.pin() {
                                Ok(p) => {
                                    assert!(!after_end, "pinned after the end");
                                    assert_eq!(p.name.as_deref(), Some(want.as_str()));
                                    assert_eq!(p.handle, tomb.handle());
                                    pinned += 1;
                                }
                                Err(f) => {
                                    assert!(f.msg.contains("was destroyed"), "{}", f.msg);
                                    return pinned;
                                }
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_micros(200));
            st.destroy();
            ended.store(true, Ordering::Release);
            drop(st);
            for t in threads {
                t.join().unwrap();
            }
            assert!(tomb.await_free("test", Duration::from_secs(5), None), "round {round}: never freed");
        }
    }
}
