//! A rank's service: one thread that accepts and authenticates every connection to the rank
//! and files what arrives in the rank's [`Mailbox`].
//!
//! Rules:
//! 1. Every TCP connection must open with a [`Hello`] frame carrying the communicator's secret
//!    and this rank as destination, within `HELLO_DEADLINE_MS`; anything else is dropped (and
//!    logged at WARN). At most `MAX_PENDING_CONNECTIONS` unauthenticated connections are held.
//! 2. A control connection then carries `MSG` frames (`tag: u64`, payload), filed by
//!    (sender, tag), and ends with `BYE` when the sender closes in order. One that ends without
//!    it means the sender is gone (died or aborted): the mailbox records it and rings the
//!    doorbell, and every wait stuck on that rank fails naming it. A data connection is handed, as a blocking socket positioned right after
//!    its hello, to whoever waits for (sender, class).
//! 3. The Unix socket takes shared-memory offers: a message with the secret, the sender, the
//!    connection class and the ring geometry, plus two descriptors (the region and the
//!    sender's doorbell). The service answers with this rank's doorbell and files the offer.
//! 4. The thread never blocks on a peer: sockets are non-blocking and reads take only the
//!    bytes of the frame in progress.

use super::{kind, Hello, Waiter};
use crate::error::{Error, Result};
use crate::log::Logger;
use crate::sys::fd::{self, EventFd};
use crate::sys::unix::{SeqListener, SeqSocket};
use crate::transport::hostmem::Ctl;
use oxccl_core::contract::Sig;
use oxccl_core::plan::ConnClass;
use oxccl_core::tuning::{HELLO_DEADLINE_MS, MAX_BOOTSTRAP_FRAME_BYTES, MAX_PENDING_CONNECTIONS};
use oxccl_core::wire::{Reader, Writer};
use oxccl_core::{CoreError, Rank};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SHM_OFFER_MAGIC: u32 = u32::from_le_bytes(*b"OXSH");
const SHM_ACCEPT_MAGIC: u32 = u32::from_le_bytes(*b"OXSA");
const SHM_REJECT_MAGIC: u32 = u32::from_le_bytes(*b"OXSR");
const ARENA_MAGIC: u32 = u32::from_le_bytes(*b"OXAR");
const MAP_MAGIC: u32 = u32::from_le_bytes(*b"OXMR");
const MAX_HELLO_BYTES: usize = 1024;

/// A shared-memory connection offered by a peer.
#[derive(Debug)]
pub struct ShmOffer {
    pub region: OwnedFd,
    pub doorbell: OwnedFd,
    pub slots: u32,
    pub slot_bytes: u32,
}

/// A data connection that arrived for this rank.
#[derive(Debug)]
pub enum Incoming {
    Tcp(TcpStream),
    Shm(ShmOffer),
}

/// The shared-memory offer message (bytes; the descriptors travel beside it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmOfferMsg {
    pub secret: [u8; 32],
    pub from: Rank,
    pub to: Rank,
    pub class: ConnClass,
    pub slots: u32,
    pub slot_bytes: u32,
}

impl ShmOfferMsg {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(SHM_OFFER_MAGIC).u32(super::PROTOCOL_VERSION).raw(&self.secret).u32(self.from.0).u32(self.to.0);
        super::encode_class(&mut w, self.class);
        w.u32(self.slots).u32(self.slot_bytes);
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<ShmOfferMsg, CoreError> {
        let mut r = Reader::new(b, "shared-memory offer");
        if r.u32()? != SHM_OFFER_MAGIC || r.u32()? != super::PROTOCOL_VERSION {
            return Err(CoreError::Malformed {
                what: "shared-memory offer",
                reason: "bad magic or version".into(),
            });
        }
        let m = ShmOfferMsg {
            secret: r.fixed()?,
            from: Rank(r.u32()?),
            to: Rank(r.u32()?),
            class: super::decode_class(&mut r)?,
            slots: r.u32()?,
            slot_bytes: r.u32()?,
        };
        r.finish()?;
        Ok(m)
    }
}

/// A request over a rank's Unix socket other than a connection offer: an exchange of
/// host-memory control blocks (with doorbells), or a request for a shared allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostRequest {
    Arena { secret: [u8; 32], from: Rank, to: Rank },
    Map { secret: [u8; 32], from: Rank, to: Rank, alloc: u64 },
}

impl HostRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            HostRequest::Arena { secret, from, to } => {
                w.u32(ARENA_MAGIC).u32(super::PROTOCOL_VERSION).raw(secret).u32(from.0).u32(to.0);
            }
            HostRequest::Map { secret, from, to, alloc } => {
                w.u32(MAP_MAGIC).u32(super::PROTOCOL_VERSION).raw(secret).u32(from.0).u32(to.0).u64(*alloc);
            }
        }
        w.finish()
    }

    fn decode(b: &[u8]) -> Result<HostRequest, CoreError> {
        let mut r = Reader::new(b, "host-memory request");
        let magic = r.u32()?;
        if r.u32()? != super::PROTOCOL_VERSION {
            return Err(CoreError::Malformed { what: "host-memory request", reason: "version".into() });
        }
        let (secret, from, to) = (r.fixed()?, Rank(r.u32()?), Rank(r.u32()?));
        let req = match magic {
            ARENA_MAGIC => HostRequest::Arena { secret, from, to },
            MAP_MAGIC => HostRequest::Map { secret, from, to, alloc: r.u64()? },
            _ => return Err(CoreError::Malformed { what: "host-memory request", reason: "magic".into() }),
        };
        r.finish()?;
        Ok(req)
    }
}

/// The answer to an offer: accepted (the receiver's doorbell travels beside it) or refused.
pub fn encode_offer_reply(accepted: bool, reason: &str) -> Vec<u8> {
    let mut w = Writer::new();
    if accepted {
        w.u32(SHM_ACCEPT_MAGIC);
    } else {
        w.u32(SHM_REJECT_MAGIC).str(reason);
    }
    w.finish()
}

/// Decodes an answer: `Ok(())` if accepted, the reason otherwise.
pub fn decode_offer_reply(b: &[u8]) -> Result<Result<(), String>, CoreError> {
    let mut r = Reader::new(b, "shared-memory offer reply");
    match r.u32()? {
        SHM_ACCEPT_MAGIC => Ok(Ok(())),
        SHM_REJECT_MAGIC => Ok(Err(r.str()?.to_string())),
        _ => Err(CoreError::Malformed { what: "shared-memory offer reply", reason: "bad magic".into() }),
    }
}

/// Compares secrets in time independent of where they differ.
pub(crate) fn same_secret(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Default)]
struct MailState {
    msgs: HashMap<(u32, u64), VecDeque<Vec<u8>>>,
    conns: HashMap<(u32, ConnClass), VecDeque<Incoming>>,
    /// Control blocks (and doorbells) peers offered: (ctl, doorbell).
    arenas: HashMap<u32, (OwnedFd, OwnedFd)>,
    closed: bool,
    /// Peers that said goodbye: they destroyed their communicators in order.
    left: std::collections::HashSet<u32>,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").field("gone", &self.first_gone()).finish_non_exhaustive()
    }
}

/// What has arrived for one rank, and the waits for it.
#[derive(Default)]
pub struct Mailbox {
    st: Mutex<MailState>,
    cv: Condvar,
    gone: Gone,
    /// Where this rank's calls stand, for peers that ask (probes).
    pub progress: Progress,
    /// A sparse communicator's herald: first word of each departure goes here, to be passed
    /// on to this rank's lifelines (a flood over the lifeline graph, each word once per rank).
    herald: Mutex<Option<std::sync::mpsc::Sender<Word>>>,
    /// Rung when a one-sided (`ConnClass::Rma`) connection arrives: the rank's RMA thread
    /// takes it ([`Mailbox::take_conns`]); no call of the rank waits for it.
    rma_bell: std::sync::OnceLock<Arc<EventFd>>,
}

/// Word of a departure, as a sparse communicator's rank passes it on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Word {
    /// The rank is gone (its connection ended without a goodbye).
    Gone(Rank),
    /// The rank's communicator failed, for this reason.
    Failed(Rank, String),
}

/// Where a rank's calls stand: the call it is in (its signature) and how many collective
/// calls it has finished. Written by the rank's engine at each call's start and end (a few
/// relaxed stores), read by its service thread to answer a peer's probe. A group of several
/// collectives also lists the ones after its first (`rest`, under a lock: groups only).
#[derive(Default)]
pub struct Progress {
    sig: [AtomicU64; 3],
    busy: AtomicBool,
    done: AtomicU64,
    rest: Mutex<Vec<Sig>>,
}

/// The most collectives after a group's first that a probe answer lists.
pub const MAX_REST: usize = 64;

impl Progress {
    /// A call with signature `sig` begins.
    #[inline]
    pub fn begin(&self, sig: &Sig) {
        for (a, w) in self.sig.iter().zip(sig.to_words()) {
            a.store(w, Ordering::Relaxed);
        }
        self.busy.store(true, Ordering::Release);
    }

    /// The collectives of the group about to [`begin`](Self::begin) after its first, numbered
    /// on from it. A list belongs to the call whose number precedes its first entry's, so a
    /// single call (never listed) needs no store here: an older list cannot match it.
    pub fn group_rest(&self, rest: impl Iterator<Item = Sig>) {
        let mut r = self.rest.lock().unwrap_or_else(|e| e.into_inner());
        r.clear();
        r.extend(rest.take(MAX_REST));
    }

    /// The call ended; `done` collective calls are finished.
    #[inline]
    pub fn end(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
        self.busy.store(false, Ordering::Release);
    }

    pub fn snapshot(&self) -> PeerState {
        let busy = self.busy.load(Ordering::Acquire);
        let sig = Sig::from_words([0, 1, 2].map(|i| self.sig[i].load(Ordering::Relaxed)));
        let rest = {
            let r = self.rest.lock().unwrap_or_else(|e| e.into_inner());
            let ours = busy && r.first().is_some_and(|f| f.seq == sig.seq.wrapping_add(1));
            if ours {
                r.clone()
            } else {
                Vec::new()
            }
        };
        PeerState { busy, sig, done: self.done.load(Ordering::Relaxed), rest }
    }
}

/// A peer's answer to a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerState {
    /// Whether it is inside a call (`sig`), or idle between calls.
    pub busy: bool,
    /// The call it is in, or was last in.
    pub sig: Sig,
    /// Collective calls it has finished (its last finished one is number `done − 1`).
    pub done: u64,
    /// In a group of several collectives: those after `sig`, in order (at most [`MAX_REST`]).
    pub rest: Vec<Sig>,
}

impl PeerState {
    /// Every collective the peer is in, with its call number: `sig` and `rest`.
    pub fn calls(&self) -> impl Iterator<Item = &Sig> {
        std::iter::once(&self.sig).chain(&self.rest)
    }

    pub fn encode(&self, nonce: u64) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(nonce).u8(self.busy as u8);
        for x in self.sig.to_words() {
            w.u64(x);
        }
        w.u64(self.done);
        let rest = &self.rest[..self.rest.len().min(MAX_REST)];
        w.u32(rest.len() as u32);
        for s in rest {
            for x in s.to_words() {
                w.u64(x);
            }
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<(u64, PeerState), CoreError> {
        let mut r = Reader::new(b, "probe answer");
        let nonce = r.u64()?;
        let busy = r.u8()? != 0;
        let sig = Sig::from_words([r.u64()?, r.u64()?, r.u64()?]);
        let done = r.u64()?;
        let n = r.u32()? as usize;
        if n > MAX_REST {
            return Err(CoreError::Malformed {
                what: "probe answer",
                reason: format!("{n} calls listed after the first, at most {MAX_REST} expected"),
            });
        }
        let mut rest = Vec::with_capacity(n);
        for _ in 0..n {
            rest.push(Sig::from_words([r.u64()?, r.u64()?, r.u64()?]));
        }
        r.finish()?;
        Ok((nonce, PeerState { busy, sig, done, rest }))
    }
}

impl std::fmt::Display for PeerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.done {
            0 => f.write_str("no call finished")?,
            n => write!(f, "last finished call #{}", n - 1)?,
        }
        if !self.busy
            && self.sig.checked()
            && self.sig.kind != oxccl_core::contract::CallKind::P2p
            && self.sig.seq + 1 > self.done
        {
            write!(f, ", idle after {} ended in failure", self.sig)
        } else if !self.busy {
            f.write_str(", idle")
        } else if self.sig.kind == oxccl_core::contract::CallKind::P2p {
            f.write_str(", in a send/recv group")
        } else if self.sig.checked() {
            write!(f, ", in {}", self.sig)
        } else {
            f.write_str(", in a call")
        }
    }
}

/// Why a peer is known to be gone.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Why {
    /// Its control connection to this rank ended without a goodbye (the process died, or
    /// aborted), or it refused a connection, or a peer said so.
    Closed,
    /// It said its communicator failed, and why.
    Failed(String),
    /// It said another rank is gone (so its own communicator failed because of that one).
    Because(Rank),
}

/// Peers known to be gone, in the order this rank learned it. Read on every wait that is
/// stuck, so the common case is one relaxed load.
#[derive(Default)]
struct Gone {
    any: std::sync::atomic::AtomicBool,
    ranks: Mutex<Vec<(Rank, Why)>>,
    /// Rung when a peer goes, so a sleeping engine wakes and sees it.
    doorbell: std::sync::OnceLock<Arc<EventFd>>,
    /// Peers' host names, for messages.
    hosts: std::sync::OnceLock<Vec<String>>,
}

/// The rank to blame for a departure and what it said (`None`: it said nothing, it closed).
pub type Culprit = (Rank, Option<String>);

impl Mailbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, MailState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn deliver_msg(&self, from: Rank, tag: u64, msg: Vec<u8>) {
        self.lock().msgs.entry((from.0, tag)).or_default().push_back(msg);
        self.cv.notify_all();
    }

    fn deliver_conn(&self, from: Rank, class: ConnClass, inc: Incoming) {
        self.lock().conns.entry((from.0, class)).or_default().push_back(inc);
        self.cv.notify_all();
        if class == ConnClass::Rma {
            if let Some(b) = self.rma_bell.get() {
                b.notify();
            }
        }
    }

    /// Rings `bell` whenever a one-sided connection arrives (set once, by the RMA thread's
    /// owner; connections that came before are taken at its first look).
    pub(crate) fn on_rma_conn(&self, bell: Arc<EventFd>) {
        let _ = self.rma_bell.set(bell);
    }

    /// Takes every connection of `class` that has arrived, with its sender.
    pub(crate) fn take_conns(&self, class: ConnClass) -> Vec<(Rank, Incoming)> {
        let mut st = self.lock();
        let mut out = Vec::new();
        for ((from, c), q) in st.conns.iter_mut() {
            if *c == class {
                out.extend(q.drain(..).map(|i| (Rank(*from), i)));
            }
        }
        st.conns.retain(|_, q| !q.is_empty());
        out
    }

    /// Records that `r` said goodbye (it destroyed its communicator in order).
    pub(crate) fn mark_left(&self, r: Rank) {
        self.lock().left.insert(r.0);
        self.cv.notify_all();
    }

    /// Whether `r` said goodbye.
    pub fn has_left(&self, r: Rank) -> bool {
        self.lock().left.contains(&r.0)
    }

    /// Records that `r` is gone and wakes everyone waiting on this rank.
    pub(crate) fn mark_gone(&self, r: Rank) {
        self.mark(r, Why::Closed);
    }

    /// Records that `r`'s communicator failed for `reason` (it told this rank).
    pub(crate) fn mark_failed(&self, r: Rank, reason: String) {
        self.mark(r, Why::Failed(reason));
    }

    /// Records that `r` gave up because `gone` is gone (it told this rank).
    pub(crate) fn mark_because(&self, r: Rank, gone: Rank) {
        self.mark(gone, Why::Closed);
        self.mark(r, Why::Because(gone));
    }

    /// Records that `culprit`'s communicator failed for `reason` (word passed on by a rank
    /// that has not failed itself).
    pub(crate) fn mark_failed_by(&self, culprit: Rank, reason: String) {
        self.mark(culprit, Why::Failed(reason));
    }

    /// Sends the first word of every later departure to `tx` (a sparse communicator's
    /// herald), until the mailbox closes.
    pub(crate) fn set_herald(&self, tx: std::sync::mpsc::Sender<Word>) {
        *self.herald.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    }

    fn mark(&self, r: Rank, why: Why) {
        let news = {
            let mut g = self.gone.ranks.lock().unwrap_or_else(|e| e.into_inner());
            let news = match (&why, g.iter().find(|(x, _)| *x == r).map(|(_, w)| w)) {
                (Why::Closed, None) => Some(Word::Gone(r)),
                (Why::Failed(reason), None | Some(Why::Closed)) => Some(Word::Failed(r, reason.clone())),
                _ => None,
            };
            match g.iter_mut().find(|(x, _)| *x == r) {
                // What a rank said outranks a connection that ended.
                Some((_, w)) => {
                    if *w == Why::Closed {
                        *w = why;
                    }
                }
                None => g.push((r, why)),
            }
            news
        };
        if let Some(word) = news {
            if let Some(tx) = self.herald.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                let _ = tx.send(word);
            }
        }
        self.gone.any.store(true, std::sync::atomic::Ordering::Release);
        if let Some(d) = self.gone.doorbell.get() {
            d.notify();
        }
        // Through the lock, so a waiter between its look at the list and its sleep cannot
        // miss the news.
        drop(self.lock());
        self.cv.notify_all();
    }

    /// Which doorbell to ring, and the peers' host names (set once the peer table is known).
    pub(crate) fn watch(&self, doorbell: Arc<EventFd>, hosts: Vec<String>) {
        let _ = self.gone.doorbell.set(doorbell);
        let _ = self.gone.hosts.set(hosts);
    }

    /// The first of `ranks` known to be gone.
    #[inline]
    pub fn gone_among(&self, ranks: &[Rank]) -> Option<Rank> {
        if !self.gone.any.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        // The earliest known to be gone first: the others may have left because of it.
        let g = self.gone.ranks.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().map(|(r, _)| *r).find(|r| ranks.contains(r))
    }

    /// The first peer known to be gone.
    pub fn first_gone(&self) -> Option<Rank> {
        if !self.gone.any.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.gone.ranks.lock().unwrap_or_else(|e| e.into_inner()).first().map(|(r, _)| *r)
    }

    /// Whom to blame for `peer`'s departure, from what is known now: `peer` itself if it
    /// failed or closed, the rank it said it left because of, or `None` if nothing is known.
    fn blame(g: &[(Rank, Why)], peer: Rank) -> Option<Culprit> {
        let why = |r: Rank| g.iter().find(|(x, _)| *x == r).map(|(_, w)| w);
        match why(peer)? {
            Why::Closed => Some((peer, None)),
            Why::Failed(reason) => Some((peer, Some(reason.clone()))),
            Why::Because(r) => match why(*r) {
                Some(Why::Failed(reason)) => Some((*r, Some(reason.clone()))),
                _ => Some((*r, None)),
            },
        }
    }

    /// Why `peer` closed its connection, if a failure explains it: what `peer` said, or else
    /// the first failure any peer reported (the one that made `peer` give up), waiting up to
    /// `wait` for word to arrive (a peer that fails tells everyone, then may exit at once: its
    /// data connections can end before its word is filed); with no word by then, the first
    /// other rank known gone.
    pub fn root_cause(&self, peer: Rank, wait: Duration) -> Option<Culprit> {
        let until = Instant::now() + wait;
        let mut st = self.lock();
        loop {
            {
                let g = self.gone.ranks.lock().unwrap_or_else(|e| e.into_inner());
                match Self::blame(&g, peer) {
                    Some((r, Some(why))) => return Some((r, Some(why))),
                    Some((r, None)) if r != peer => return Some((r, None)),
                    _ => {}
                }
                if let Some((r, Why::Failed(why))) = g.iter().find(|(_, w)| matches!(w, Why::Failed(_))) {
                    return Some((*r, Some(why.clone())));
                }
                // Word travels before the end of its control connection, on it: a peer known
                // gone without any said nothing.
                if Self::blame(&g, peer).is_some() {
                    return None;
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // No word of `peer`. A rank known to have gone before explains it best: in
                // a sparse communicator `peer` may have told only its own lifelines why.
                let g = self.gone.ranks.lock().unwrap_or_else(|e| e.into_inner());
                return g.iter().find(|(r, w)| *r != peer && *w == Why::Closed).map(|(r, _)| (*r, None));
            }
            st = self.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Waits up to `wait` for word of `peer` (its failure, or the end of its own control
    /// connection to this rank), then records it gone if none came: a probe that found its
    /// end closed may beat its last words, which travel on the other connection.
    /// Returns false, recording nothing, if `peer` said goodbye instead: it ended in order.
    pub fn await_word(&self, peer: Rank, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let mut st = self.lock();
        loop {
            if st.left.contains(&peer.0) {
                return false;
            }
            {
                let g = self.gone.ranks.lock().unwrap_or_else(|e| e.into_inner());
                if Self::blame(&g, peer).is_some() {
                    return true;
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(st);
        // It ended without a word. If another rank is known gone, this one most likely ended
        // because of it (in a sparse communicator its word went to its own lifelines only).
        let before = {
            let g = self.gone.ranks.lock().unwrap_or_else(|e| e.into_inner());
            g.iter().find(|(r, _)| *r != peer).map(|(r, _)| *r)
        };
        match before {
            Some(b) => self.mark(peer, Why::Because(b)),
            None => self.mark_gone(peer),
        }
        true
    }

    /// `e` with the departure behind it named: an error on a connection to a peer that went
    /// away (its end closed, reset or refused) becomes the failure that explains it — what
    /// the peer said, or the rank it left because of — else that the peer is gone.
    pub fn explain(&self, e: Error, wait: Duration) -> Error {
        use std::io::ErrorKind as K;
        let (rank, op, peer) = match &e {
            Error::PeerClosed { rank, op, peer, .. } => (*rank, op.clone(), *peer),
            Error::Io { rank, op, peer: Some(peer), source }
                if matches!(
                    source.kind(),
                    K::ConnectionReset
                        | K::ConnectionRefused
                        | K::BrokenPipe
                        | K::ConnectionAborted
                        | K::UnexpectedEof
                ) =>
            {
                (*rank, format!("{op} ({source})"), *peer)
            }
            _ => return e,
        };
        let cause = self.root_cause(peer, wait);
        self.mark_gone(peer);
        self.culprit_error(rank, &op, cause.unwrap_or((peer, None)))
    }

    /// The error for rank `me`'s `op` that `culprit` explains.
    pub fn culprit_error(&self, me: Rank, op: &str, culprit: Culprit) -> Error {
        let (peer, reason) = culprit;
        let host = self.host_of(peer);
        match reason {
            Some(reason) => Error::PeerFailed { rank: me, op: op.to_string(), peer, host, reason },
            None => Error::PeerClosed { rank: me, op: op.to_string(), peer, host },
        }
    }

    /// The error of a wait (`op`, on rank `me`) that ends because `peer` is gone: what it
    /// said if it said its communicator failed, the rank it left because of, or that its
    /// connection closed.
    pub fn gone_error(&self, me: Rank, op: &str, peer: Rank) -> Error {
        let culprit = {
            let g = self.gone.ranks.lock().unwrap_or_else(|e| e.into_inner());
            Self::blame(&g, peer).unwrap_or((peer, None))
        };
        self.culprit_error(me, op, culprit)
    }

    /// The host name of peer `r` (for messages).
    pub fn host_of(&self, r: Rank) -> String {
        self.gone.hosts.get().and_then(|h| h.get(r.idx()).cloned()).unwrap_or_else(|| "?".into())
    }

    /// Wakes every waiter (after an abort, they see the flag).
    pub fn wake(&self) {
        self.cv.notify_all();
    }

    /// Marks the mailbox closed: waiters fail.
    pub fn close(&self) {
        self.herald.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.lock().closed = true;
        self.cv.notify_all();
    }

    fn wait<T>(
        &self,
        w: &Waiter,
        what: &str,
        from: Rank,
        mut take: impl FnMut(&mut MailState) -> Option<T>,
    ) -> Result<T> {
        let mut st = self.lock();
        loop {
            if let Some(v) = take(&mut st) {
                return Ok(v);
            }
            if st.closed {
                return Err(Error::InvalidUsage(format!("{what}: the communicator was destroyed")));
            }
            // The check may probe peers and wait for their word, which the service files
            // under this lock: let go of it meanwhile.
            drop(st);
            w.check(what, &[from])?;
            st = self.lock();
            if let Some(v) = take(&mut st) {
                return Ok(v);
            }
            let (g, _) = self
                .cv
                .wait_timeout(st, w.slice().max(Duration::from_millis(1)))
                .unwrap_or_else(|e| e.into_inner());
            st = g;
        }
    }

    /// Waits for the message `from` sends under `tag`.
    pub fn wait_msg(&self, from: Rank, tag: u64, w: &Waiter) -> Result<Vec<u8>> {
        self.wait(w, "bootstrap: waiting for a peer's message", from, |st| {
            st.msgs.get_mut(&(from.0, tag)).and_then(|q| q.pop_front())
        })
    }

    /// A message under `tag` from any of `from`, if one comes within `wait`.
    pub fn take_any_within(&self, from: &[Rank], tag: u64, wait: Duration) -> Option<Vec<u8>> {
        let until = Instant::now() + wait;
        let mut st = self.lock();
        loop {
            for f in from {
                if let Some(m) = st.msgs.get_mut(&(f.0, tag)).and_then(|q| q.pop_front()) {
                    return Some(m);
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || st.closed {
                return None;
            }
            st = self.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Waits for the control block `from` offers.
    pub fn wait_arena(&self, from: Rank, w: &Waiter) -> Result<(OwnedFd, OwnedFd)> {
        self.wait(w, "direct path setup: waiting for a peer's control block", from, |st| {
            st.arenas.remove(&from.0)
        })
    }

    /// Waits for the data connection `from` opens for `class`.
    pub fn wait_conn(&self, from: Rank, class: ConnClass, w: &Waiter) -> Result<Incoming> {
        self.wait(w, "connection setup: waiting for a peer to connect", from, |st| {
            st.conns.get_mut(&(from.0, class)).and_then(|q| q.pop_front())
        })
    }
}

/// Identity and state the service thread needs.
struct Ctx {
    me: Rank,
    size: usize,
    secret: [u8; 32],
    doorbell: Arc<EventFd>,
    ctl: Arc<Ctl>,
    mailbox: Arc<Mailbox>,
    log: Logger,
}

/// A rank's running service.
pub struct Service {
    pub mailbox: Arc<Mailbox>,
    pub addr: SocketAddr,
    pub unix_name: [u8; 16],
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Service {
    /// Binds the rank's listeners on `ip` and starts its thread.
    pub(crate) fn start(
        ip: IpAddr,
        me: Rank,
        size: usize,
        secret: [u8; 32],
        doorbell: Arc<EventFd>,
        ctl: Arc<Ctl>,
        log: Logger,
    ) -> Result<Service> {
        let tcp = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::io(me, "bind the service listener", None, e))?;
        // Every peer may connect at once (a dense bootstrap, a flood of departure news).
        crate::sys::fd::widen_backlog(tcp.as_raw_fd())
            .map_err(|e| Error::io(me, "service listener backlog", None, e))?;
        tcp.set_nonblocking(true).map_err(|e| Error::io(me, "service listener", None, e))?;
        let addr = tcp.local_addr().map_err(|e| Error::io(me, "service listener", None, e))?;
        let mut unix_name = [0u8; 16];
        let unix = loop {
            let mut token = [0u8; 8];
            getrandom::getrandom(&mut token).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
            let name = format!("ox{:016x}", u64::from_le_bytes(token));
            unix_name[..name.len().min(16)].copy_from_slice(&name.as_bytes()[..16]);
            match SeqListener::bind_abstract(&unix_name) {
                Ok(l) => break l,
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(Error::io(me, "bind the service unix socket", None, e)),
            }
        };
        let stop = Arc::new(EventFd::new().map_err(|e| Error::io(me, "eventfd", None, e))?);
        let mailbox = Arc::new(Mailbox::default());
        let ctx = Ctx { me, size, secret, doorbell, ctl, mailbox: mailbox.clone(), log };
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-svc-{me}"))
            .spawn(move || serve(ctx, tcp, unix, stop2))
            .map_err(|e| Error::io(me, "spawn the service thread", None, e))?;
        Ok(Service { mailbox, addr, unix_name, stop, thread: Some(thread) })
    }

    /// Stops the thread and closes the listeners.
    pub fn stop(&mut self) {
        self.stop.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.mailbox.close();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A frame being read from a non-blocking socket, never past its end.
struct FrameReader {
    hdr: [u8; 8],
    hdr_got: usize,
    payload: Vec<u8>,
    got: usize,
    max: usize,
}

impl FrameReader {
    fn new(max: usize) -> Self {
        FrameReader { hdr: [0; 8], hdr_got: 0, payload: Vec::new(), got: 0, max }
    }

    /// Reads what is available; a whole frame when complete. End of stream is an error.
    fn poll(&mut self, fd: i32) -> io::Result<Option<(u8, Vec<u8>)>> {
        loop {
            if self.hdr_got < 8 {
                match fd::recv_some(fd, &mut self.hdr[self.hdr_got..])? {
                    None => return Ok(None),
                    Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Some(n) => self.hdr_got += n,
                }
                if self.hdr_got == 8 {
                    let len =
                        u32::from_le_bytes([self.hdr[0], self.hdr[1], self.hdr[2], self.hdr[3]]) as usize;
                    if len > self.max {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("{len}-byte frame exceeds {}", self.max),
                        ));
                    }
                    self.payload = vec![0u8; len];
                    self.got = 0;
                }
                continue;
            }
            if self.got < self.payload.len() {
                match fd::recv_some(fd, &mut self.payload[self.got..])? {
                    None => return Ok(None),
                    Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Some(n) => self.got += n,
                }
                continue;
            }
            let k = self.hdr[4];
            self.hdr_got = 0;
            return Ok(Some((k, std::mem::take(&mut self.payload))));
        }
    }
}

enum ConnState {
    Hello {
        since: Instant,
    },
    /// A control connection; `bye` once the peer said it closes in order.
    Msgs {
        from: Rank,
        bye: bool,
    },
}

struct TcpConn {
    s: TcpStream,
    peer: SocketAddr,
    rd: FrameReader,
    state: ConnState,
}

enum Step {
    Keep,
    Drop,
    Handed,
}

fn serve(ctx: Ctx, tcp: TcpListener, unix: SeqListener, stop: Arc<EventFd>) {
    let mut conns: Vec<TcpConn> = Vec::new();
    let mut unix_pending: Vec<(SeqSocket, Instant)> = Vec::new();
    loop {
        let mut pfds = vec![
            fd::pollfd(stop.as_raw_fd(), crate::sys::fd::POLLIN),
            fd::pollfd(tcp.as_raw_fd(), crate::sys::fd::POLLIN),
            fd::pollfd(unix.as_raw_fd(), crate::sys::fd::POLLIN),
        ];
        pfds.extend(conns.iter().map(|c| fd::pollfd(c.s.as_raw_fd(), crate::sys::fd::POLLIN)));
        pfds.extend(unix_pending.iter().map(|(s, _)| fd::pollfd(s.as_raw_fd(), crate::sys::fd::POLLIN)));
        if fd::poll(&mut pfds, Duration::from_millis(500)).is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if pfds[0].revents != 0 {
            return;
        }
        // New TCP connections.
        while let Ok((s, peer)) = tcp.accept() {
            let pending = conns.iter().filter(|c| matches!(c.state, ConnState::Hello { .. })).count();
            if pending >= MAX_PENDING_CONNECTIONS || s.set_nonblocking(true).is_err() {
                ctx.log.warn(format_args!(
                    "service: dropping connection from {peer}: too many unauthenticated connections"
                ));
                continue;
            }
            let _ = s.set_nodelay(true);
            conns.push(TcpConn {
                s,
                peer,
                rd: FrameReader::new(MAX_HELLO_BYTES),
                state: ConnState::Hello { since: Instant::now() },
            });
        }
        while let Ok(Some(s)) = unix.accept() {
            if unix_pending.len() < MAX_PENDING_CONNECTIONS {
                unix_pending.push((s, Instant::now()));
            }
        }
        let now = Instant::now();
        let deadline = Duration::from_millis(HELLO_DEADLINE_MS);
        conns = conns
            .into_iter()
            .filter_map(|mut c| match tcp_step(&ctx, &mut c, now, deadline) {
                Step::Keep => Some(c),
                Step::Drop | Step::Handed => None,
            })
            .collect();
        unix_pending.retain(|(s, since)| match unix_step(&ctx, s) {
            Step::Keep => now.duration_since(*since) < deadline,
            Step::Drop | Step::Handed => false,
        });
    }
}

fn tcp_step(ctx: &Ctx, c: &mut TcpConn, now: Instant, deadline: Duration) -> Step {
    loop {
        let frame = match c.rd.poll(c.s.as_raw_fd()) {
            Ok(Some(f)) => f,
            Ok(None) => {
                if let ConnState::Hello { since } = c.state {
                    if now.duration_since(since) > deadline {
                        ctx.log.warn(format_args!(
                            "service: dropping connection from {}: no hello within {deadline:?}",
                            c.peer
                        ));
                        return Step::Drop;
                    }
                }
                return Step::Keep;
            }
            Err(e) => {
                if let ConnState::Msgs { from, bye: false } = c.state {
                    // The peer's process ended (or it aborted) without closing in order.
                    ctx.log.warn(format_args!(
                        "service: rank {from}'s control connection ended without a goodbye ({e}): rank {from} is gone"
                    ));
                    ctx.mailbox.mark_gone(from);
                } else if matches!(c.state, ConnState::Hello { .. })
                    || e.kind() != io::ErrorKind::UnexpectedEof
                {
                    ctx.log.info_in(
                        oxccl_core::config::subsys::BOOTSTRAP,
                        format_args!("service: connection from {} closed: {e}", c.peer),
                    );
                }
                return Step::Drop;
            }
        };
        match (&c.state, frame) {
            (ConnState::Hello { .. }, (kind::HELLO, payload)) => {
                let h = match Hello::decode(&payload) {
                    Ok(h) => h,
                    Err(e) => {
                        ctx.log.warn(format_args!("service: dropping connection from {}: {e}", c.peer));
                        return Step::Drop;
                    }
                };
                if !same_secret(&h.secret, &ctx.secret) || h.to != ctx.me || h.from.idx() >= ctx.size {
                    ctx.log.warn(format_args!(
                        "service: dropping connection from {}: wrong secret or ranks (from {} to {})",
                        c.peer, h.from, h.to
                    ));
                    return Step::Drop;
                }
                match h.data {
                    Some(class) => {
                        let s = match c.s.try_clone() {
                            Ok(s) => s,
                            Err(_) => return Step::Drop,
                        };
                        if s.set_nonblocking(false).is_err() {
                            return Step::Drop;
                        }
                        ctx.mailbox.deliver_conn(h.from, class, Incoming::Tcp(s));
                        return Step::Handed;
                    }
                    None => {
                        c.state = ConnState::Msgs { from: h.from, bye: false };
                        c.rd = FrameReader::new(MAX_BOOTSTRAP_FRAME_BYTES);
                    }
                }
            }
            (ConnState::Msgs { from, .. }, (kind::BYE, _)) => {
                ctx.mailbox.mark_left(*from);
                c.state = ConnState::Msgs { from: *from, bye: true };
            }
            (ConnState::Msgs { from, .. }, (kind::PROBE, payload)) => {
                // Answered on the same connection; a probe that finds the socket full gets no
                // answer (the prober gives up after its timeout).
                let nonce =
                    u64::from_le_bytes(payload.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
                let answer = ctx.mailbox.progress.snapshot().encode(nonce);
                if let Err(e) = super::write_frame(&mut c.s, kind::STATE, &answer) {
                    ctx.log.info_in(
                        oxccl_core::config::subsys::BOOTSTRAP,
                        format_args!("service: probe from rank {from} unanswered: {e}"),
                    );
                }
            }
            (ConnState::Msgs { from, .. }, (kind::GONE, payload)) => {
                let r =
                    u32::from_le_bytes(payload.get(..4).and_then(|b| b.try_into().ok()).unwrap_or([0xff; 4]));
                if (r as usize) < ctx.size && Rank(r) != ctx.me {
                    ctx.log.warn(format_args!("service: rank {from} says rank {r} is gone"));
                    // Only a failed communicator sends it: its sender failed because of r.
                    ctx.mailbox.mark_because(*from, Rank(r));
                }
            }
            (ConnState::Msgs { from, .. }, (kind::PASS_GONE, payload)) => {
                let r =
                    u32::from_le_bytes(payload.get(..4).and_then(|b| b.try_into().ok()).unwrap_or([0xff; 4]));
                if (r as usize) < ctx.size && Rank(r) != ctx.me {
                    ctx.log.warn(format_args!("service: rank {from} passes on that rank {r} is gone"));
                    ctx.mailbox.mark_gone(Rank(r));
                }
            }
            (ConnState::Msgs { from, .. }, (kind::FAIL, payload)) => {
                let reason = String::from_utf8_lossy(&payload).into_owned();
                ctx.log.warn(format_args!("service: rank {from} failed: {reason}"));
                ctx.mailbox.mark_failed(*from, reason);
            }
            (ConnState::Msgs { from, .. }, (kind::FAILED_BY, payload)) => {
                let r =
                    u32::from_le_bytes(payload.get(..4).and_then(|b| b.try_into().ok()).unwrap_or([0xff; 4]));
                if (r as usize) < ctx.size && Rank(r) != ctx.me {
                    let reason = String::from_utf8_lossy(&payload[4..]).into_owned();
                    ctx.log
                        .warn(format_args!("service: rank {from} passes on that rank {r} failed: {reason}"));
                    ctx.mailbox.mark_failed_by(Rank(r), reason);
                }
            }
            (ConnState::Msgs { from, .. }, (kind::MSG, payload)) => {
                if payload.len() < 8 {
                    ctx.log.warn(format_args!("service: short message from rank {from}"));
                    return Step::Drop;
                }
                let tag = u64::from_le_bytes(payload[..8].try_into().unwrap_or([0; 8]));
                ctx.mailbox.deliver_msg(*from, tag, payload[8..].to_vec());
            }
            (_, (k, _)) => {
                ctx.log.warn(format_args!(
                    "service: dropping connection from {}: unexpected frame kind {k}",
                    c.peer
                ));
                return Step::Drop;
            }
        }
    }
}

fn unix_step(ctx: &Ctx, s: &SeqSocket) -> Step {
    let mut buf = [0u8; 512];
    let (n, mut fds) = match s.recv(&mut buf) {
        Ok(Some(m)) => m,
        Ok(None) => return Step::Keep,
        Err(e) => {
            ctx.log.warn(format_args!("service: bad unix socket message: {e}"));
            return Step::Drop;
        }
    };
    let refuse = |why: &str| {
        ctx.log.warn(format_args!("service: refusing shared-memory offer: {why}"));
        let _ = s.set_nonblocking(false);
        let _ = s.set_timeouts(Duration::from_secs(1));
        let _ = s.send(&encode_offer_reply(false, why), &[]);
        Step::Drop
    };
    if let Ok(req) = HostRequest::decode(&buf[..n]) {
        return host_request(ctx, s, req, fds);
    }
    let m = match ShmOfferMsg::decode(&buf[..n]) {
        Ok(m) => m,
        Err(e) => return refuse(&e.to_string()),
    };
    if !same_secret(&m.secret, &ctx.secret) || m.to != ctx.me || m.from.idx() >= ctx.size {
        return refuse("wrong secret or ranks");
    }
    if fds.len() != 2 {
        return refuse("expected two descriptors");
    }
    let doorbell = fds.pop();
    let region = fds.pop();
    let (Some(region), Some(doorbell)) = (region, doorbell) else {
        return refuse("expected two descriptors");
    };
    let _ = s.set_nonblocking(false);
    let _ = s.set_timeouts(Duration::from_secs(5));
    if let Err(e) = s.send(&encode_offer_reply(true, ""), &[ctx.doorbell.as_raw_fd()]) {
        ctx.log.warn(format_args!("service: cannot answer rank {}'s offer: {e}", m.from));
        return Step::Drop;
    }
    ctx.mailbox.deliver_conn(
        m.from,
        m.class,
        Incoming::Shm(ShmOffer { region, doorbell, slots: m.slots, slot_bytes: m.slot_bytes }),
    );
    Step::Handed
}

/// Answers a control-block exchange or a request for a shared allocation.
fn host_request(ctx: &Ctx, s: &SeqSocket, req: HostRequest, mut fds: Vec<OwnedFd>) -> Step {
    let _ = s.set_nonblocking(false);
    let _ = s.set_timeouts(Duration::from_secs(5));
    let reply = |ok: bool, why: &str, with: &[i32]| {
        if !ok {
            ctx.log.warn(format_args!("service: refusing a host-memory request: {why}"));
        }
        let _ = s.send(&encode_offer_reply(ok, why), with);
        Step::Drop
    };
    let (secret, from, to) = match &req {
        HostRequest::Arena { secret, from, to } | HostRequest::Map { secret, from, to, .. } => {
            (secret, *from, *to)
        }
    };
    if !same_secret(secret, &ctx.secret) || to != ctx.me || from.idx() >= ctx.size {
        return reply(false, "wrong secret or ranks", &[]);
    }
    match req {
        HostRequest::Arena { .. } => {
            if fds.len() != 2 {
                return reply(false, "expected two descriptors", &[]);
            }
            let (Some(bell), Some(ctl)) = (fds.pop(), fds.pop()) else {
                return reply(false, "expected two descriptors", &[]);
            };
            let Ok(own) = ctx.ctl.try_clone_fd() else {
                return reply(false, "cannot share the control block", &[]);
            };
            if s.send(&encode_offer_reply(true, ""), &[own.as_raw_fd(), ctx.doorbell.as_raw_fd()]).is_err() {
                return Step::Drop;
            }
            ctx.mailbox.lock().arenas.insert(from.0, (ctl, bell));
            ctx.mailbox.cv.notify_all();
            Step::Handed
        }
        HostRequest::Map { alloc, .. } => match crate::mem::fd_of(alloc) {
            Some(fd) => reply(true, "", &[fd.as_raw_fd()]),
            None => reply(false, &format!("no shared allocation {alloc} in this process"), &[]),
        },
    }
}

/// Sends `req` to the rank whose Unix socket is `name` and returns the descriptors of its
/// answer (an error carries the peer's reason).
pub(crate) fn host_call(name: &[u8; 16], req: &HostRequest, fds: &[i32]) -> std::io::Result<Vec<OwnedFd>> {
    let sock = SeqSocket::connect_abstract(name, Duration::from_secs(10))?;
    sock.send(&req.encode(), fds)?;
    let mut buf = [0u8; 512];
    let (n, got) = sock.recv(&mut buf)?.ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer from the peer's service")
    })?;
    match decode_offer_reply(&buf[..n]) {
        Ok(Ok(())) => Ok(got),
        Ok(Err(why)) => Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)),
        Err(e) => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::contract::CallKind;

    fn sig(seq: u64, kind: CallKind) -> Sig {
        Sig { seq, kind, dtype: 7, op: Sig::NO_OP, root: 0, count: 4 }
    }

    #[test]
    fn a_groups_later_calls_go_with_its_probe_answers_only() {
        let p = Progress::default();
        // A group of three collectives, numbered 5, 6, 7.
        p.group_rest([sig(6, CallKind::AllReduce), sig(7, CallKind::Broadcast)].into_iter());
        p.begin(&sig(5, CallKind::AllReduce));
        let st = p.snapshot();
        assert_eq!(st.calls().map(|s| s.seq).collect::<Vec<_>>(), [5, 6, 7]);
        let (nonce, back) = PeerState::decode(&st.encode(99)).unwrap();
        assert_eq!((nonce, &back), (99, &st));
        // Idle, and then in a later single call: the old list is not this call's.
        p.end(8);
        assert!(p.snapshot().rest.is_empty());
        p.begin(&sig(8, CallKind::Gather));
        assert_eq!(p.snapshot().calls().count(), 1);
        // Answers list at most MAX_REST later calls, and a longer list does not decode.
        let long = PeerState { rest: vec![sig(1, CallKind::AllGather); MAX_REST + 3], ..st };
        let (_, cut) = PeerState::decode(&long.encode(1)).unwrap();
        assert_eq!(cut.rest.len(), MAX_REST);
        let mut w = Writer::new();
        w.u64(1).u8(1);
        for x in [0u64; 4] {
            w.u64(x);
        }
        w.u32(MAX_REST as u32 + 1);
        let e = PeerState::decode(&w.finish()).unwrap_err();
        assert!(e.to_string().contains("at most 64"), "{e}");
    }
}
