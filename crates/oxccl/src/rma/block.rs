//! A rank's signal block: the counters of the signals that arrived at it, which same-host
//! peers map and increment in place (zero-copy signals), and the futex its waits sleep on.
//!
//! Layout (64-bit words; every region starts on its own 64-byte line):
//!
//! ```text
//! word 0       magic                         written once by the owner before sharing
//! word 1       ranks                         written once by the owner before sharing
//! word 8       epoch (low 32 bits: futex)    bumped by whoever wakes the owner
//! word 16      waiting (threads asleep)      written only by the owner's waiting threads
//! word 24…     arrived[origin][ctx][sig]     CONTEXTS × SIGNALS words per origin (one line
//!                                            per context); fetch_add by the origin (zero-copy)
//!                                            or by the owner's RMA thread (stream)
//! then         applied[origin]               stream messages from `origin` the owner's RMA
//!                                            thread has applied; written only by that thread
//! ```
//!
//! Rules:
//! 1. A signal is counted after its data: the writer of the data issues a SeqCst fence, then
//!    a release `fetch_add` of the counter; a waiter reads counters with acquire loads.
//! 2. No lost wake-ups: a waiter increments `waiting`, issues a SeqCst fence, reads `epoch`,
//!    re-checks its counters, and only then sleeps on `epoch` (if it is unchanged). Whoever
//!    counts a signal issues a SeqCst fence after it and, if `waiting` is non-zero, bumps
//!    `epoch` and wakes every sleeper.
//! 3. `applied[o]` is bumped (release) after the owner's thread finished the data and signal of
//!    a stream message from `o`; an origin reads it (acquire) to know its stream has drained.
//! 4. The block lives as long as the owner's one-sided state; peers' mappings keep the pages
//!    alive after it goes (a late increment lands in memory nobody reads).

use super::{CONTEXTS, SIGNALS};
use crate::error::{Error, Result};
use crate::mem::{PeerAlloc, SharedBuf};
use crate::sys::futex;
use oxccl_core::Rank;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

const MAGIC: u64 = u64::from_le_bytes(*b"OXRMASIG");
const EPOCH: usize = 8;
const WAITING: usize = 16;
const ARRIVED: usize = 24;
const PER_ORIGIN: usize = CONTEXTS * SIGNALS;

/// Words a block for `ranks` ranks holds.
fn words(ranks: usize) -> usize {
    ARRIVED + ranks * PER_ORIGIN + ranks.div_ceil(8) * 8
}

/// What keeps a block's memory mapped.
enum Keep {
    Own(#[allow(dead_code)] SharedBuf<u64>),
    Peer(#[allow(dead_code)] PeerAlloc),
}

/// A signal block, this rank's own or a peer's mapped here.
pub(crate) struct Block {
    base: *const AtomicU64,
    ranks: usize,
    _keep: Keep,
}

// SAFETY: the block is shared memory accessed only through atomics (`base` points into a
// mapping `_keep` holds for the block's whole life).
unsafe impl Send for Block {}
// SAFETY: as above: every access is an atomic operation.
unsafe impl Sync for Block {}

impl Block {
    /// This rank's block for a communicator of `ranks` ranks (zeroed, then stamped).
    pub fn create(ranks: usize) -> Result<Block> {
        let buf = SharedBuf::<u64>::zeroed(words(ranks))?;
        let base = buf.as_ptr() as *const AtomicU64;
        let b = Block { base, ranks, _keep: Keep::Own(buf) };
        b.word(1).store(ranks as u64, Ordering::Relaxed);
        b.word(0).store(MAGIC, Ordering::Release);
        Ok(b)
    }

    /// The shared allocation id peers ask this rank's service for (`HostRequest::Map`).
    pub fn alloc_id(&self) -> u64 {
        crate::mem::lookup(self.base as *const u8, 8).map_or(0, |(id, _)| id)
    }

    /// A peer's block, mapped from the file its service handed over; checked.
    pub fn map(a: PeerAlloc, ranks: usize, me: Rank, peer: Rank) -> Result<Block> {
        let bad = |why: String| {
            Error::Internal(format!("rank {me}: rank {peer}'s signal block does not match: {why}"))
        };
        let need = words(ranks) * 8;
        let p = a.range(0, need).ok_or_else(|| bad(format!("shorter than {need} bytes")))?;
        let b = Block { base: p as *const AtomicU64, ranks, _keep: Keep::Peer(a) };
        if b.word(0).load(Ordering::Acquire) != MAGIC || b.word(1).load(Ordering::Relaxed) != ranks as u64 {
            return Err(bad("magic or rank count".into()));
        }
        Ok(b)
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < words(self.ranks));
        // SAFETY: `i` is within the block (every index below is computed from the layout for
        // `ranks`, which the mapping was checked to hold); the memory is 8-byte aligned
        // (page-aligned allocation) and only ever accessed atomically.
        unsafe { &*self.base.add(i) }
    }

    fn epoch(&self) -> &AtomicU32 {
        // SAFETY: the low half of the epoch word (little-endian: its first 4 bytes), aligned
        // for u32; accessed only atomically (as the u32 the futex compares), never as a u64.
        unsafe { &*(self.base.add(EPOCH) as *const AtomicU32) }
    }

    /// The counter of signals from `origin` on (`ctx`, `sig`).
    pub fn arrived(&self, origin: Rank, ctx: usize, sig: usize) -> &AtomicU64 {
        self.word(ARRIVED + origin.idx() * PER_ORIGIN + ctx * SIGNALS + sig)
    }

    /// The count of `origin`'s stream messages this block's owner has applied.
    pub fn applied(&self, origin: Rank) -> &AtomicU64 {
        self.word(ARRIVED + self.ranks * PER_ORIGIN + origin.idx())
    }

    /// Counts one signal from `origin` (after its data: rule 1) and wakes the owner's waits.
    pub fn count(&self, origin: Rank, ctx: usize, sig: usize) {
        fence(Ordering::SeqCst);
        self.arrived(origin, ctx, sig).fetch_add(1, Ordering::Release);
        self.wake_waiters();
    }

    /// Wakes the owner's sleeping waits, if any (rule 2).
    pub fn wake_waiters(&self) {
        fence(Ordering::SeqCst);
        if self.word(WAITING).load(Ordering::Relaxed) != 0 {
            self.wake();
        }
    }

    /// Wakes every sleeping wait unconditionally (an abort).
    pub fn wake(&self) {
        self.epoch().fetch_add(1, Ordering::Release);
        futex::wake_all(self.epoch());
    }

    /// Sleeps up to `max` unless `ready` turns true first (rule 2); returns `ready()`.
    pub fn sleep_unless(&self, max: Duration, ready: impl Fn() -> bool) -> bool {
        let waiting = self.word(WAITING);
        waiting.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let e = self.epoch().load(Ordering::Acquire);
        let done = ready();
        if !done {
            futex::wait(self.epoch(), e, max);
        }
        waiting.fetch_sub(1, Ordering::Relaxed);
        done || ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_block_sees_the_owners_counters_and_wakes_it() {
        let own = std::sync::Arc::new(Block::create(3).unwrap());
        let id = own.alloc_id();
        assert_ne!(id, 0);
        let fd = crate::mem::fd_of(id).unwrap();
        let peer = Block::map(PeerAlloc::map(fd, id).unwrap(), 3, Rank(1), Rank(0)).unwrap();
        assert!(Block::map(PeerAlloc::map(crate::mem::fd_of(id).unwrap(), id).unwrap(), 4, Rank(1), Rank(0))
            .is_err());
        let o = own.clone();
        let waiter = std::thread::spawn(move || {
            let t = std::time::Instant::now();
            while !o.sleep_unless(Duration::from_secs(5), || {
                o.arrived(Rank(2), CONTEXTS - 1, SIGNALS - 1).load(Ordering::Acquire) >= 2
            }) {}
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(30));
        peer.count(Rank(2), CONTEXTS - 1, SIGNALS - 1);
        peer.count(Rank(2), CONTEXTS - 1, SIGNALS - 1);
        assert!(waiter.join().unwrap() < Duration::from_secs(4));
        assert_eq!(own.arrived(Rank(2), CONTEXTS - 1, SIGNALS - 1).load(Ordering::Acquire), 2);
        assert_eq!(own.arrived(Rank(1), 0, 0).load(Ordering::Acquire), 0);
        own.applied(Rank(2)).fetch_add(5, Ordering::Release);
        assert_eq!(peer.applied(Rank(2)).load(Ordering::Acquire), 5);
    }
}
