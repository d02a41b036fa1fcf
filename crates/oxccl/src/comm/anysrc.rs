//! Receives from any rank (MPI's `MPI_ANY_SOURCE`, torch's `recv` without `src`): the next
//! message any peer sends this rank, and which peer sent it.
//!
//! How: every rank publishes, per peer, how many messages it has numbered for that peer (its
//! sends' pair numbers, set when a group with sends is planned: `Progress::note_sent`), and
//! answers a probe with the count for the rank asking (`PeerState::sent`). A receive from any
//! rank, holding the communicator's turn, asks every peer (over the bootstrap's control
//! connections, answered by their service threads, so a peer blocked inside its send still
//! answers) and compares each answer with the messages it has itself taken from that peer
//! (`Seqs::received`). A peer with more numbered than taken has a message on its way; the
//! receive then runs as an ordinary receive from that peer (pair numbers, the contract check
//! and the transports as for any receive). None yet: it sleeps (20 µs, doubling to 2 ms) and
//! asks again.
//!
//! Rules: peers are taken round-robin from the one after the last chosen, so no sender is
//! starved; only whole receives happen (a message is never split between two calls); the
//! wait heeds the communicator's timeout, abort and gone peers, and says on stderr every
//! `OXCCL_WAIT_NOTICE` seconds what it waits for. Receives from any rank are not part of
//! groups: a group plans its receives with their peers before anything moves.

use super::{Communicator, Detached, Inner};
use crate::engine::RawBuf;
use crate::error::{Error, Result};
use crate::wait::{Probed, Waiter};
use oxccl_core::plan::{BufId, Loc, OpSpec};
use oxccl_core::{CoreError, DataType, Element, Rank};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The first sleep between two rounds of probes, and the longest.
const FIRST_NAP: Duration = Duration::from_micros(20);
const MAX_NAP: Duration = Duration::from_millis(2);
/// How long one round waits for the peers' answers.
const ROUND_ANSWER: Duration = Duration::from_millis(500);

impl Communicator {
    /// Receives `buf.len()` elements from whichever rank sends to this one next; returns that
    /// rank. Blocks until a message has arrived whole.
    pub fn recv_any<T: Element>(&self, buf: &mut [T]) -> Result<Rank> {
        let len = std::mem::size_of_val(buf);
        // SAFETY: `buf` is borrowed mutably for the whole call, which ends before we return.
        unsafe { self.recv_any_ptr(T::DTYPE, buf.as_mut_ptr().cast(), len) }
    }

    /// [`recv_any`](Self::recv_any) on bytes of `dtype`.
    pub fn recv_any_raw(&self, dtype: DataType, buf: &mut [u8]) -> Result<Rank> {
        // SAFETY: as above.
        unsafe { self.recv_any_ptr(dtype, buf.as_mut_ptr(), buf.len()) }
    }

    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes, and not otherwise used, until this
    /// returns.
    unsafe fn recv_any_ptr(&self, dtype: DataType, ptr: *mut u8, len: usize) -> Result<Rank> {
        let count = self.inner.any_count(dtype, len)?;
        self.inner.check_usable()?;
        let _turn = self.inner.take_turn();
        self.inner.recv_any(dtype, count, RawBuf { ptr, len, writable: true })
    }

    /// [`recv_any_raw`](Self::recv_any_raw), queued for the communicator's worker thread
    /// after every call queued before it; the handle's [`Detached::source`] names the sender
    /// once it is complete. `keep` is dropped on the worker thread once the call is complete.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes, and untouched by anything else, until
    /// the call is complete (until `keep` is dropped).
    pub unsafe fn recv_any_detached(
        &self,
        dtype: DataType,
        ptr: *mut u8,
        len: usize,
        keep: Box<dyn Send>,
    ) -> Result<Detached> {
        let count = self.inner.any_count(dtype, len)?;
        let st = Arc::new(super::scope::WorkState::default());
        let from = Arc::new(OnceLock::new());
        let (st2, from2) = (st.clone(), from.clone());
        let buf = SendBuf(RawBuf { ptr, len, writable: true });
        self.queue(Box::new(move |inner: &Inner| {
            let r = inner.check_usable().and_then(|()| inner.recv_any(dtype, count, buf.get()));
            drop(keep);
            st2.complete(r.map(|peer| {
                let _ = from2.set(peer);
            }));
        }))?;
        Ok(Detached::with_source(st, from))
    }
}

/// A buffer handed to the worker thread.
struct SendBuf(RawBuf);

impl SendBuf {
    fn get(&self) -> RawBuf {
        self.0
    }
}

// SAFETY: the address is only used by the worker thread while the caller keeps the memory
// valid and untouched (recv_any_detached's contract).
unsafe impl Send for SendBuf {}

impl Inner {
    /// The element count of a receive from any rank into `len` bytes of `dtype`.
    fn any_count(&self, dtype: DataType, len: usize) -> Result<usize> {
        let bad = |reason: String| Error::Invalid(CoreError::InvalidArgument { arg: "buf", reason });
        if len % dtype.size_bytes() != 0 {
            return Err(bad(format!(
                "rank {}: recv from any rank: {len} bytes is not a whole number of {dtype} elements",
                self.rank
            )));
        }
        if self.size < 2 {
            return Err(bad(format!(
                "rank {}: recv from any rank: this communicator has no other rank to send to it (size {})",
                self.rank, self.size
            )));
        }
        Ok(len / dtype.size_bytes())
    }

    /// Waits until some peer has a message numbered for this rank that it has not taken yet,
    /// then receives it (see the module's text). The caller holds the turn.
    pub(super) fn recv_any(&self, dtype: DataType, count: usize, buf: RawBuf) -> Result<Rank> {
        let peers: Vec<Rank> = (0..self.size).map(Rank::new).filter(|r| *r != self.rank).collect();
        let w = Waiter::new(self.rank, self.config.timeout, self.abort.clone())
            .watching(&self.mailbox)
            .announcing(self.config.wait_notice);
        let what = "recv from any rank: no rank has a message on its way to this one yet";
        let mut nap = FIRST_NAP;
        loop {
            let answers = self.boot.probe_all(&peers, Instant::now() + ROUND_ANSWER);
            // Messages each peer has numbered for this rank: its answer, or for one that has
            // left in order, the count its goodbye carried (it may have sent eagerly, then
            // left). A peer gone without a goodbye fails the receive, named.
            let mut sent = Vec::with_capacity(peers.len());
            for (&peer, a) in peers.iter().zip(&answers) {
                sent.push(match a {
                    Probed::Answer(st) => Some(st.sent),
                    Probed::NoAnswer => self.mailbox.left_sent(peer),
                    Probed::Gone => {
                        if self.mailbox.await_word(peer, Duration::from_millis(200)) {
                            let e = self.mailbox.gone_error(self.rank, "recv from any rank", peer);
                            self.fail(&e);
                            return Err(e);
                        }
                        self.mailbox.left_sent(peer)
                    }
                });
            }
            let start = self.any_next.load(Ordering::Relaxed) as usize;
            let pick = {
                // The messages this rank has taken from each peer (the engine's pair numbers).
                let engine = super::lock(&self.engine);
                let taken = &engine.seqs.received;
                (0..peers.len())
                    .map(|k| (start + k) % peers.len())
                    .find(|&i| sent[i].is_some_and(|n| n > taken[peers[i].idx()]))
            };
            if let Some(i) = pick {
                let peer = peers[i];
                self.any_next.store((i + 1) as u32, Ordering::Relaxed);
                let op = OpSpec::Recv { count, dtype, peer, dst: Loc::start(BufId(0)) };
                self.run_job(&[op], &[buf], "recv")?;
                return Ok(peer);
            }
            if peers.iter().all(|p| self.mailbox.has_left(*p)) {
                return Err(Error::InvalidUsage(format!(
                    "rank {}: recv from any rank: every other rank has destroyed its communicator, none with a message left for this one",
                    self.rank
                )));
            }
            w.check(what, &peers)?;
            std::thread::sleep(nap.min(w.slice()));
            nap = (nap * 2).min(MAX_NAP);
        }
    }
}
