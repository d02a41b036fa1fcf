//! A rank's mailbox: what its service filed (control messages by sender and tag, data
//! connections by sender and class: TCP streams, or what a same-host request brought), which peers are gone or failed
//! and why, and the rank's progress record that probes read. Waits on it release the lock
//! while they check; `mark` notifies under the lock, so no waiter misses word.

use super::*;
use crate::wait::{PeerState, MAX_REST};

/// A data connection that arrived for this rank: a TCP stream positioned after its hello, or
/// what a same-host request brought, opaque here (`transport::host` files a shared-memory
/// offer; whoever waits for the connection knows what to expect).
pub enum Incoming {
    Tcp(TcpStream),
    Host(Box<dyn std::any::Any + Send>),
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Incoming::Tcp(s) => f.debug_tuple("Tcp").field(s).finish(),
            Incoming::Host(_) => f.write_str("Host(..)"),
        }
    }
}

#[derive(Default)]
pub(super) struct MailState {
    msgs: HashMap<(u32, u64), VecDeque<Vec<u8>>>,
    conns: HashMap<(u32, ConnClass), VecDeque<Incoming>>,
    /// Control blocks (and doorbells) peers offered: (ctl, doorbell).
    pub(super) arenas: HashMap<u32, (OwnedFd, OwnedFd)>,
    closed: bool,
    /// Peers that said goodbye (they destroyed their communicators in order), with the
    /// messages each had numbered for this rank in all.
    left: HashMap<u32, u64>,
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
    pub(super) cv: Condvar,
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
    /// The signatures of the last [`HISTORY`] calls, at their call numbers modulo `HISTORY`:
    /// a mismatch found a call or more late (by a rank whose own part of the odd call could
    /// complete: a broadcast's root, a sender) is told with this rank's call of that number.
    hist: [[AtomicU64; 3]; HISTORY],
    busy: AtomicBool,
    done: AtomicU64,
    rest: Mutex<Vec<Sig>>,
    /// Per peer, how many messages this rank has numbered for it (its sends' pair numbers,
    /// published when a group with sends to that peer is planned): a peer's receive from any
    /// rank compares it with the messages it has taken from this one. Sized at first use.
    sent: std::sync::OnceLock<Box<[AtomicU64]>>,
}

/// How many of a rank's last calls [`Progress`] remembers.
const HISTORY: usize = 4;

impl Progress {
    /// A call with signature `sig` begins.
    #[inline]
    pub fn begin(&self, sig: &Sig) {
        let words = sig.to_words();
        let at = &self.hist[(sig.seq % HISTORY as u64) as usize];
        for ((a, h), w) in self.sig.iter().zip(at).zip(words) {
            a.store(w, Ordering::Relaxed);
            h.store(w, Ordering::Relaxed);
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

    /// This rank's call numbered `seq`, if among the last few (written by this same thread).
    pub fn earlier(&self, seq: u64) -> Option<Sig> {
        let at = &self.hist[(seq % HISTORY as u64) as usize];
        let s = Sig::from_words([0, 1, 2].map(|i| at[i].load(Ordering::Relaxed)));
        (s.checked() && s.seq == seq).then_some(s)
    }

    /// The pair a mismatch is told with: this rank's `mine` against a peer's `theirs`, or,
    /// when `theirs` is of an earlier call that differed from this rank's call of that
    /// number, that call (the divergence itself, not its consequence).
    pub fn mismatch_with(&self, mine: Sig, theirs: Sig) -> Sig {
        match self.earlier(theirs.seq) {
            Some(e) if theirs.seq < mine.seq && e != theirs => e,
            _ => mine,
        }
    }

    /// This rank has numbered `n` messages for `peer` in all (of `size` ranks).
    #[inline]
    pub fn note_sent(&self, peer: Rank, n: u64, size: usize) {
        let sent = self.sent.get_or_init(|| (0..size).map(|_| AtomicU64::new(0)).collect());
        if let Some(c) = sent.get(peer.idx()) {
            c.store(n, Ordering::Release);
        }
    }

    /// The messages this rank has numbered for `peer` in all.
    pub fn sent_to(&self, peer: Rank) -> u64 {
        self.sent.get().and_then(|s| s.get(peer.idx())).map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// The peers this rank has numbered messages for.
    pub fn sent_to_any(&self) -> Vec<Rank> {
        let Some(s) = self.sent.get() else { return Vec::new() };
        (0..s.len()).filter(|&i| s[i].load(Ordering::Acquire) > 0).map(Rank::new).collect()
    }

    /// The state a probe from `asker` is answered with: [`snapshot`](Self::snapshot), and the
    /// messages this rank has numbered for `asker`.
    pub fn snapshot_for(&self, asker: Rank) -> PeerState {
        PeerState { sent: self.sent_to(asker), ..self.snapshot() }
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
        PeerState { busy, sig, done: self.done.load(Ordering::Relaxed), rest, sent: 0 }
    }
}

impl PeerState {
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
        w.u64(self.sent);
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
        let sent = r.u64()?;
        r.finish()?;
        Ok((nonce, PeerState { busy, sig, done, rest, sent }))
    }
}

/// Why a peer is known to be gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Why {
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
pub(super) struct Gone {
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
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, MailState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn deliver_msg(&self, from: Rank, tag: u64, msg: Vec<u8>) {
        self.lock().msgs.entry((from.0, tag)).or_default().push_back(msg);
        self.cv.notify_all();
    }

    pub(crate) fn deliver_conn(&self, from: Rank, class: ConnClass, inc: Incoming) {
        self.lock().conns.entry((from.0, class)).or_default().push_back(inc);
        self.cv.notify_all();
        if class == ConnClass::Rma {
            if let Some(b) = self.rma_bell.get() {
                b.notify();
            }
        }
    }

    /// Files the control block (and doorbell) `from` handed this rank for the direct path.
    pub(crate) fn deliver_arena(&self, from: Rank, ctl: OwnedFd, bell: OwnedFd) {
        self.lock().arenas.insert(from.0, (ctl, bell));
        self.cv.notify_all();
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
    pub(crate) fn mark_left(&self, r: Rank, sent: u64) {
        self.lock().left.insert(r.0, sent);
        self.cv.notify_all();
    }

    /// Whether `r` said goodbye.
    pub fn has_left(&self, r: Rank) -> bool {
        self.lock().left.contains_key(&r.0)
    }

    /// The messages `r` had numbered for this rank when it said goodbye (None: it has not).
    pub fn left_sent(&self, r: Rank) -> Option<u64> {
        self.lock().left.get(&r.0).copied()
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

    pub(super) fn mark(&self, r: Rank, why: Why) {
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
    pub(super) fn blame(g: &[(Rank, Why)], peer: Rank) -> Option<Culprit> {
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
            if st.left.contains_key(&peer.0) {
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

    pub(super) fn wait<T>(
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

impl crate::wait::Watch for Mailbox {
    fn host_of(&self, r: Rank) -> String {
        Mailbox::host_of(self, r)
    }
    fn gone_among(&self, ranks: &[Rank]) -> Option<Rank> {
        Mailbox::gone_among(self, ranks)
    }
    fn first_gone(&self) -> Option<Rank> {
        Mailbox::first_gone(self)
    }
    fn gone_error(&self, me: Rank, what: &str, peer: Rank) -> Error {
        Mailbox::gone_error(self, me, what, peer)
    }
    fn has_left(&self, r: Rank) -> bool {
        Mailbox::has_left(self, r)
    }
    fn await_word(&self, peer: Rank, wait: Duration) -> bool {
        Mailbox::await_word(self, peer, wait)
    }
    fn group_rest(&self) -> Vec<Sig> {
        self.progress.snapshot().rest
    }
}
