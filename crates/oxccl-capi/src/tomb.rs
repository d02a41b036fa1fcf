//! A communicator's handle, a tombstone that outlives it ([`Tomb`]), its phase ([`phase`]), and
//! the pins that keep its state alive while a call uses it ([`Pin`]); what ends it and frees
//! the state is [`crate::life`].
//!
//! An `ncclComm_t` is the address of a [`Tomb`]: 16 bytes that are never freed, so a handle is
//! never reused and a stale one is refused by name ("communicator 0x... was destroyed")
//! instead of aliasing a newer communicator. The tomb points at the communicator's state
//! ([`crate::handle::CommState`]: the `Communicator` with its connections, threads and
//! memory, the proxy, the registrations...), which is freed when the communicator ends.
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
//! - Layering: this module knows nothing of what it keeps alive (`Tomb<S>`, `Pin<S>`: the
//!   handle module instantiates them with its `CommState`) and names only [`crate::fail`].

use crate::fail::{lock, usage, Fail, INTERNAL_ERROR, R};
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Where a communicator stands ([`Tomb::phase`]).
pub mod phase {
    /// A nonblocking init (or one queued in a group) has not finished.
    pub const INIT: u8 = 0;
    pub const READY: u8 = 1;
    /// Init failed: every call answers `CommState::failure`.
    pub const FAILED: u8 = 2;
    pub const FINALIZED: u8 = 3;
    pub const DESTROYED: u8 = 4;
    /// `ncclCommSuspend`: only queries, `ncclCommResume`, revoke, destroy and abort.
    pub const SUSPENDED: u8 = 5;
    /// `ncclCommRevoke`: the communicator was aborted; only queries, split, shrink, destroy
    /// and abort.
    pub const REVOKED: u8 = 6;
}

/// The phase's bits in [`Tomb::word`].
const PHASE: u64 = 0x7f;
/// Set once the state has been freed (after its drop returned).
const FREED: u64 = 0x80;
/// One pin in [`Tomb::word`].
const PIN: u64 = 0x100;

/// What stays of a communicator for the life of the process; its address is the `ncclComm_t`.
/// `S` is what it keeps alive while the communicator lives (the C ABI's `CommState`).
pub struct Tomb<S> {
    /// The phase (`phase::*`, bits 0..6), FREED (bit 7) and the pin count (bits 8..63: no
    /// process holds 2^56 pins).
    word: AtomicU64,
    /// The state while the communicator lives; null once it was freed.
    state: AtomicPtr<S>,
}

/// Signalled when a state has been freed (what enders waiting for calls of other threads
/// wait on; rare, so one for the process).
static FREES: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

impl<S: 'static> Tomb<S> {
    /// A tomb for a new state in phase INIT, and the first pin on it.
    pub fn make(new: impl FnOnce(&'static Tomb<S>) -> S) -> Pin<S> {
        let tomb: &'static Tomb<S> = Box::leak(Box::new(Tomb {
            word: AtomicU64::new(phase::INIT as u64 | PIN),
            state: AtomicPtr::new(std::ptr::null_mut()),
        }));
        let st = NonNull::from(Box::leak(Box::new(new(tomb))));
        tomb.state.store(st.as_ptr(), Ordering::Release);
        Pin { tomb, st }
    }

    /// The handle: this tomb's address.
    pub fn handle(&self) -> usize {
        self as *const Tomb<S> as usize
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
    pub fn pin(&'static self) -> R<Pin<S>> {
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
pub struct Pin<S: 'static> {
    tomb: &'static Tomb<S>,
    st: NonNull<S>,
}

// SAFETY: a Pin is a shared reference to a state that is Send and Sync (the bound; the C ABI's
// CommState is: its fields are atomics, locks, OnceLocks and Send + Sync values) kept valid by
// the pin count.
unsafe impl<S: Send + Sync + 'static> Send for Pin<S> {}
// SAFETY: as above.
unsafe impl<S: Send + Sync + 'static> Sync for Pin<S> {}

impl<S: 'static> Pin<S> {
    pub fn tomb(&self) -> &'static Tomb<S> {
        self.tomb
    }
}

impl<S: 'static> Deref for Pin<S> {
    type Target = S;

    #[inline]
    fn deref(&self) -> &S {
        // SAFETY: the state is freed only once the pin count of a destroyed tomb reaches zero,
        // and this pin is counted until it is dropped.
        unsafe { self.st.as_ref() }
    }
}

impl<S: 'static> Clone for Pin<S> {
    fn clone(&self) -> Pin<S> {
        // Already pinned: the count is above zero, so the state stays whatever the phase.
        self.tomb.word.fetch_add(PIN, Ordering::Relaxed);
        Pin { tomb: self.tomb, st: self.st }
    }
}

impl<S: 'static> Drop for Pin<S> {
    #[inline]
    fn drop(&mut self) {
        self.tomb.unpin();
    }
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
