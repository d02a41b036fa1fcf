//! Waiting with a deadline and an abort flag, and saying what is awaited: [`Waiter`] bounds
//! every blocking step of bootstrap, transports and engine; a wait stuck long enough asks its
//! peers where they are ([`Probe`]) and fails naming the culprit.
//!
//! Rules:
//! 1. This module sits below bootstrap and every layer that waits: what a wait heeds about
//!    its peers comes through two traits the bootstrap implements, [`Watch`] (who is gone or
//!    left, and where: the mailbox) and [`Ask`] (where a peer's call stands: the control
//!    connections). It names no module above it.
//! 2. A wait fails at once when aborted or when a peer it waits on is gone; stuck only on live
//!    peers while another is gone, after `GONE_GRACE_MS`; past its deadline, with the peers'
//!    answers (asked just before it) in the error.
//! 3. Waits at init say on stderr, every `wait_notice`, what they still wait for.

use crate::error::{Error, Result};
use oxccl_core::contract::{CallKind, Sig};
use oxccl_core::tuning::MAX_SLEEP_MS;
use oxccl_core::Rank;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A wait stuck this long asks the peers it waits for where their calls stand.
pub const PROBE_AFTER_MS: u64 = 200;
/// How often a stuck wait asks again.
pub const PROBE_EVERY_MS: u64 = 1000;
/// How long a probe waits for its answer.
pub const PROBE_ANSWER_MS: u64 = 200;
/// How long a wait may stay stuck on a peer that destroyed its communicator in order before
/// it fails (data the peer sent before it left may still be in flight on a slow link).
pub const LEFT_GRACE_MS: u64 = 5000;
/// The most a timeout's report waits for the peers' answers (all asked at once).
pub const REPORT_ANSWER_MS: u64 = 1000;
/// How long a wait stuck only on live peers keeps waiting once another peer is gone.
pub const GONE_GRACE_MS: u64 = 300;

/// The most collectives after a group's first that a probe answer lists.
pub const MAX_REST: usize = 64;

/// What a wait heeds about its peers (the bootstrap's mailbox).
pub trait Watch: Send + Sync + std::fmt::Debug {
    /// The host of rank `r`, "?" before the peer table is known.
    fn host_of(&self, r: Rank) -> String;
    /// The first of `ranks` known to be gone.
    fn gone_among(&self, ranks: &[Rank]) -> Option<Rank>;
    /// Any peer known to be gone.
    fn first_gone(&self) -> Option<Rank>;
    /// The error a wait on gone `peer` fails with.
    fn gone_error(&self, me: Rank, what: &str, peer: Rank) -> Error;
    /// Whether rank `r` destroyed its communicator in order.
    fn has_left(&self, r: Rank) -> bool;
    /// Waits up to `wait` for word that `peer` is gone; whether it came.
    fn await_word(&self, peer: Rank, wait: Duration) -> bool;
    /// The later collectives of this rank's own group, as its peers see them.
    fn group_rest(&self) -> Vec<Sig>;
}

/// Whom a stuck wait asks where its peers' calls stand (the bootstrap's control connections).
pub trait Ask: Send + Sync {
    /// The communicator's size.
    fn size(&self) -> usize;
    /// Asks `peer`, waiting up to `wait` for its answer.
    fn probe(&self, peer: Rank, wait: Duration) -> Probed;
    /// Asks all of `peers` at once, waiting until `until` for their answers.
    fn probe_all(&self, peers: &[Rank], until: Instant) -> Vec<Probed>;
}

/// What a probe learned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probed {
    Answer(PeerState),
    /// No answer in time (or no connection to ask on).
    NoAnswer,
    /// The peer's end of the connection is closed.
    Gone,
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
    /// Messages it has numbered for the rank that asked (sends planned to it, in all).
    pub sent: u64,
}

impl PeerState {
    /// Every collective the peer is in, with its call number: `sig` and `rest`.
    pub fn calls(&self) -> impl Iterator<Item = &Sig> {
        std::iter::once(&self.sig).chain(&self.rest)
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

/// When a blocking step gives up, and the flag that interrupts it.
#[derive(Clone, Debug)]
pub struct Waiter {
    pub rank: Rank,
    /// How long the wait may last (`None`: forever).
    timeout: Option<Duration>,
    pub abort: Arc<AtomicBool>,
    /// When the wait began: read at construction, or for a [`Waiter::lazy`] one at its first
    /// check, and only when there is a timeout (reading the clock costs).
    started: std::cell::Cell<Option<Instant>>,
    /// Whose word on gone peers to heed (a wait on a gone rank fails at once).
    pub mailbox: Option<Arc<dyn Watch>>,
    /// When this wait, stuck on live peers, first saw another peer gone.
    pub gone_seen: std::cell::Cell<Option<Instant>>,
    /// Whom to ask, once stuck, where the awaited peers' calls stand.
    pub probe: Option<Probe>,
    /// Set while the caller holds the control connections (a bounded write or connect on
    /// one of them): the peers are not probed then, since a probe writes on those same
    /// connections (and would wait for the lock this thread holds).
    held: std::cell::Cell<bool>,
    /// When this wait, stuck on a peer that destroyed its communicator in order, first saw it so.
    left_seen: std::cell::Cell<Option<Instant>>,
    /// Set for waits at init: say on stderr, this often, what the wait is still waiting for.
    notice: Option<Notice>,
}

/// A long wait's periodic word on stderr ([`Waiter::announcing`]).
#[derive(Clone, Debug)]
struct Notice {
    every: Duration,
    started: Instant,
    next: std::cell::Cell<Instant>,
}

/// A stuck wait's questions to its peers: the communicator's control connections, this
/// rank's call, and when to ask next.
#[derive(Clone)]
pub struct Probe {
    pub boot: Arc<dyn Ask>,
    /// This rank's call (its first collective, for a group).
    pub mine: Sig,
    /// Whether calls are checked against the answers (the contract check is on).
    pub check: bool,
    next: std::cell::Cell<Option<Instant>>,
    /// The peers' answers gathered just before the deadline, for the timeout's message.
    report: std::cell::RefCell<Option<String>>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").field("mine", &self.mine).finish_non_exhaustive()
    }
}

impl Probe {
    fn new(boot: Arc<dyn Ask>, mine: Sig, check: bool) -> Probe {
        Probe { boot, mine, check, next: std::cell::Cell::new(None), report: std::cell::RefCell::new(None) }
    }

    /// The mismatch a peer's answer shows: it is in a collective with the number of one of
    /// this call's (`mine`, or a later collective of its group: `rest`, from this rank's own
    /// progress; both lists hold collectives only) and another signature.
    fn breach(&self, me: Rank, what: &str, peer: Rank, st: &PeerState, rest: &[Sig]) -> Option<Error> {
        let coll = |s: &Sig| s.checked() && s.kind != CallKind::P2p;
        if !(self.check && coll(&self.mine) && st.busy && coll(&st.sig)) {
            return None;
        }
        let mine = std::iter::once(&self.mine).chain(rest);
        mine.flat_map(|m| st.calls().map(move |t| (m, t)))
            .find(|(m, t)| t.seq == m.seq && t != m)
            .map(|(m, t)| Error::CallMismatch { rank: me, op: what.to_string(), peer, mine: *m, theirs: *t })
    }

    /// Every peer's state, as the timeout's message gives it: who arrived at this call,
    /// who did not, and where those stand.
    fn report(&self, me: Rank, mailbox: Option<&dyn Watch>, until: Instant) -> String {
        let n = self.boot.size();
        let mut arrived = Vec::new();
        let mut missing = Vec::new();
        let peers: Vec<Rank> = (0..n).map(Rank::new).filter(|r| *r != me).take(64).collect();
        for (r, answer) in peers.iter().zip(self.boot.probe_all(&peers, until)) {
            let r = *r;
            let host = mailbox.map(|m| m.host_of(r)).unwrap_or_else(|| "?".into());
            match answer {
                Probed::Answer(st) => {
                    // In this call, or was (and left it failing), or finished it.
                    let here = self.mine.kind != CallKind::P2p
                        && ((st.sig.seq == self.mine.seq && st.sig.kind == self.mine.kind)
                            || st.done > self.mine.seq);
                    if here {
                        arrived.push(r.0);
                    } else {
                        missing.push(format!("rank {r} (host {host}): {st}"));
                    }
                }
                Probed::NoAnswer => missing.push(format!("rank {r} (host {host}): no answer")),
                Probed::Gone if mailbox.is_some_and(|m| m.has_left(r)) => {
                    missing.push(format!("rank {r} (host {host}): destroyed its communicator in order"))
                }
                Probed::Gone => missing.push(format!("rank {r} (host {host}): its process has ended")),
            }
        }
        let mut out = String::new();
        if self.mine.checked() {
            out += &format!("; this rank is in {}", self.mine);
        }
        if self.mine.kind != CallKind::P2p {
            out += &format!("; arrived: ranks {arrived:?}");
        }
        if !missing.is_empty() {
            out += &format!("; not in this call: {}", missing.join("; "));
        }
        out
    }
}

impl Waiter {
    /// A waiter for `rank` that gives up after `timeout` (never if `None`).
    pub fn new(rank: Rank, timeout: Option<Duration>, abort: Arc<AtomicBool>) -> Waiter {
        let w = Waiter::lazy(rank, timeout, abort);
        w.started.set(timeout.map(|_| Instant::now()));
        w
    }

    /// As [`Waiter::new`], but the timeout counts from the first check (or sleep) instead of
    /// now: for the waits of a call, whose clock is then read only by calls that wait long
    /// enough to check (each check follows a spin much shorter than any timeout).
    pub fn lazy(rank: Rank, timeout: Option<Duration>, abort: Arc<AtomicBool>) -> Waiter {
        Waiter {
            rank,
            timeout,
            abort,
            started: std::cell::Cell::new(None),
            mailbox: None,
            gone_seen: std::cell::Cell::new(None),
            probe: None,
            held: std::cell::Cell::new(false),
            left_seen: std::cell::Cell::new(None),
            notice: None,
        }
    }

    /// A call's waiter: [`Waiter::lazy`], also [`watching`](Self::watching) `mailbox` and
    /// [`probing`](Self::probing) through `boot`, built in one piece (the builders move the
    /// whole waiter at each step, which the per-call path would pay for).
    #[allow(clippy::too_many_arguments)]
    pub fn for_call(
        rank: Rank,
        timeout: Option<Duration>,
        abort: Arc<AtomicBool>,
        mailbox: Arc<dyn Watch>,
        boot: Arc<dyn Ask>,
        mine: Sig,
        check: bool,
    ) -> Waiter {
        let mut w = Waiter::lazy(rank, timeout, abort);
        w.mailbox = Some(mailbox);
        w.probe = Some(Probe::new(boot, mine, check));
        w
    }

    /// Also says on stderr, every `every` (if set) while the wait lasts, what it waits for:
    /// waits at init must never be silent.
    pub fn announcing(mut self, every: Option<Duration>) -> Waiter {
        self.notice = every.map(|every| {
            let now = Instant::now();
            Notice { every, started: now, next: std::cell::Cell::new(now + every) }
        });
        self
    }

    /// Also asks, once stuck, where the awaited peers' calls stand: a peer in another call
    /// with this call's number is a mismatch (with `check`), and a timeout says who arrived
    /// and where the others are.
    pub fn probing(mut self, boot: &Arc<impl Ask + 'static>, mine: Sig, check: bool) -> Waiter {
        self.probe = Some(Probe::new(boot.clone(), mine, check));
        self
    }

    /// Also fails, once stuck, when a peer is gone, as `mailbox` learned it.
    pub fn watching(mut self, mailbox: &Arc<impl Watch + 'static>) -> Waiter {
        self.mailbox = Some(mailbox.clone());
        self
    }

    /// (start, deadline) when the wait has a timeout; the start is now if not yet known.
    fn times(&self) -> Option<(Instant, Instant)> {
        let t = self.timeout?;
        let s = match self.started.get() {
            Some(s) => s,
            None => {
                let now = Instant::now();
                self.started.set(Some(now));
                now
            }
        };
        Some((s, s + t))
    }

    /// Runs `f`, which holds the control connections, with probing off (the deadline, abort
    /// and gone peers are still heeded).
    pub(crate) fn holding<T>(&self, f: impl FnOnce() -> T) -> T {
        let was = self.held.replace(true);
        let r = f();
        self.held.set(was);
        r
    }

    /// Fails if aborted or past the deadline; `what` and `waiting_for` describe the wait.
    pub fn check(&self, what: &str, waiting_for: &[Rank]) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(Error::Aborted { rank: self.rank });
        }
        if let Some(n) = &self.notice {
            let now = Instant::now();
            if now >= n.next.get() {
                n.next.set(now + n.every);
                // The peers' hosts once the peer table is known (after the join).
                let hosts: Vec<String> = match &self.mailbox {
                    Some(m) => {
                        waiting_for.iter().take(8).map(|r| m.host_of(*r)).filter(|h| h != "?").collect()
                    }
                    None => Vec::new(),
                };
                let who = match (waiting_for.is_empty(), hosts.is_empty()) {
                    (true, _) => String::new(),
                    (false, true) => format!("; waiting on rank(s) {}", crate::error::rank_list(waiting_for)),
                    (false, false) => format!(
                        "; waiting on rank(s) {} (host(s) {})",
                        crate::error::rank_list(waiting_for),
                        hosts.join(", ")
                    ),
                };
                // Always printed, whatever NCCL_DEBUG says: a silent wait looks like a hang.
                eprintln!(
                    "oxccl: rank {}: still waiting after {} s: {what}{who}",
                    self.rank,
                    n.started.elapsed().as_secs()
                );
            }
        }
        // A wait stuck on a gone peer fails at once. One stuck only on live peers while another
        // peer is gone fails after GONE_GRACE_MS: long enough for a call the gone peer had
        // already done its part of to finish, short enough that a rank waiting on a survivor
        // (who itself waits on the dead one, and will not send) hears it well within 2 s.
        if let Some(m) = &self.mailbox {
            if let Some(peer) = m.gone_among(waiting_for) {
                return Err(m.gone_error(self.rank, what, peer));
            }
            if let Some(peer) = m.first_gone() {
                let seen = *self.gone_seen.get().get_or_insert_with(Instant::now);
                self.gone_seen.set(Some(seen));
                if seen.elapsed() >= Duration::from_millis(GONE_GRACE_MS) {
                    return Err(m.gone_error(self.rank, what, peer));
                }
            }
        }
        if let Some(p) = self.probe.as_ref().filter(|_| !self.held.get()) {
            let now = Instant::now();
            let next = match p.next.get() {
                Some(t) => t,
                None => {
                    let t = now + Duration::from_millis(PROBE_AFTER_MS);
                    p.next.set(Some(t));
                    t
                }
            };
            if now >= next && !waiting_for.is_empty() {
                p.next.set(Some(now + Duration::from_millis(PROBE_EVERY_MS)));
                // The grace for peers that left runs only while the wait is on one of them.
                if self.mailbox.as_ref().is_none_or(|m| !waiting_for.iter().any(|r| m.has_left(*r))) {
                    self.left_seen.set(None);
                }
                // The later collectives of this rank's own group, as its peers see them.
                let rest = match &self.mailbox {
                    Some(m) => m.group_rest(),
                    None => Vec::new(),
                };
                for &peer in waiting_for.iter().take(16) {
                    match p.boot.probe(peer, Duration::from_millis(PROBE_ANSWER_MS)) {
                        Probed::Answer(st) => {
                            if let Some(e) = p.breach(self.rank, what, peer, &st, &rest) {
                                return Err(e);
                            }
                        }
                        // Its end of the connection is closed: the process has ended (it may
                        // have died before its own lifeline to this rank existed).
                        Probed::Gone => {
                            if let Some(m) = &self.mailbox {
                                if m.await_word(peer, Duration::from_millis(PROBE_ANSWER_MS)) {
                                    return Err(m.gone_error(self.rank, what, peer));
                                }
                                // It destroyed its communicator in order. What it sent may
                                // still be on its way (over TCP: that stream's own end then
                                // decides), so the wait goes on; one still stuck on it after
                                // LEFT_GRACE_MS waits for what it will never send.
                                let seen = *self.left_seen.get().get_or_insert_with(Instant::now);
                                self.left_seen.set(Some(seen));
                                if seen.elapsed() >= Duration::from_millis(LEFT_GRACE_MS) {
                                    return Err(Error::PeerClosed {
                                        rank: self.rank,
                                        op: format!(
                                            "{what}: rank {peer} destroyed its communicator in order while this rank still waits on it (did every rank make the same calls?)"
                                        ),
                                        peer,
                                        host: m.host_of(peer),
                                    });
                                }
                            }
                        }
                        Probed::NoAnswer => {}
                    }
                }
            }
        }
        if let Some((s, d)) = self.times() {
            let now = Instant::now();
            // The peers are asked just before the deadline (a slice of the timeout, at most
            // a second), so the call fails at its deadline with their answers in hand.
            if let Some(p) = self.probe.as_ref().filter(|_| !self.held.get()) {
                let budget = (d - s).div_f64(4.0).min(Duration::from_millis(REPORT_ANSWER_MS));
                if now + budget >= d && p.report.borrow().is_none() {
                    let r = p.report(self.rank, self.mailbox.as_deref(), d);
                    *p.report.borrow_mut() = Some(r);
                }
            }
            if Instant::now() >= d {
                let after = s.elapsed();
                let detail = self.probe.as_ref().and_then(|p| p.report.borrow().clone()).unwrap_or_default();
                return Err(Error::Timeout {
                    rank: self.rank,
                    op: what.to_string(),
                    after,
                    waiting_for: waiting_for.to_vec(),
                    detail,
                });
            }
        }
        Ok(())
    }

    /// The longest a single sleep may last.
    pub fn slice(&self) -> Duration {
        let max = Duration::from_millis(if self.gone_seen.get().is_some() {
            GONE_GRACE_MS / 4
        } else {
            MAX_SLEEP_MS
        });
        match self.times() {
            Some((_, d)) => d.saturating_duration_since(Instant::now()).min(max),
            None => max,
        }
    }
}
