//! Bootstrap: from a unique id to every rank knowing every peer's address.
//!
//! 1. The unique id's creator runs the rendezvous root ([`root`]) on the id's address.
//! 2. Every rank starts its own service ([`service`]): a TCP listener and an abstract Unix
//!    socket, served by one thread that authenticates connections by the communicator's secret
//!    and files what arrives in a mailbox (control messages, incoming data connections,
//!    shared-memory offers).
//! 3. Every rank joins the root with its rank, world size and [`PeerInfo`]; the root checks
//!    them all (secret, world size against rank 0's, duplicates) and answers with the whole
//!    table, or with the reason it refuses.
//! 4. From then on ranks talk directly: [`Bootstrap`] sends control messages to peers'
//!    services; transports set up data connections through the same services.
//!
//! Frames on every bootstrap socket: `[len: u32 LE][kind: u8][0; 3][payload: len bytes]`,
//! `len` bounded by [`MAX_BOOTSTRAP_FRAME_BYTES`]; reads take exactly one frame, never bytes
//! of what follows (a data connection's stream starts right after its hello).

mod greet;
pub mod root;
pub mod service;

use crate::error::{Error, RejectReason, Result};
use oxccl_core::contract::{CallKind, Sig};
use oxccl_core::plan::ConnClass;
use oxccl_core::tuning::{CONNECT_RETRY_MS, MAX_BOOTSTRAP_FRAME_BYTES, MAX_SLEEP_MS};
use oxccl_core::wire::{Reader, Writer};
use oxccl_core::{ChannelId, CoreError, Rank};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) use greet::{greeting, join_root, show_bytes};
pub use service::{Incoming, Mailbox, PeerState, Service, Word};

/// Protocol version of every bootstrap message.
pub const PROTOCOL_VERSION: u32 = 8;

/// Frame kinds.
pub(crate) mod kind {
    pub const JOIN: u8 = 1;
    pub const TABLE: u8 = 2;
    pub const REJECT: u8 = 3;
    /// Root → joined ranks while the rendezvous is incomplete: who is still missing.
    pub const STATUS: u8 = 4;
    /// Root → each rank once all joined, before any table: how the table reaches it
    /// ([`super::Route`]).
    pub const ROUTE: u8 = 5;
    /// Root → every connection, as it is accepted: "an oxccl root, of this protocol version"
    /// ([`super::greeting`]).
    pub const GREET: u8 = 6;
    pub const HELLO: u8 = 10;
    pub const MSG: u8 = 11;
    /// The last frame of a control connection closed in order.
    pub const BYE: u8 = 12;
    /// The sender's communicator failed; the payload says why (UTF-8, bounded).
    pub const FAIL: u8 = 13;
    /// "Where do your calls stand?" (payload: a nonce), on a control connection.
    pub const PROBE: u8 = 14;
    /// The answer, back on the same connection: the nonce and a [`service::PeerState`].
    pub const STATE: u8 = 15;
    /// "Rank r is gone" (payload: r as u32): the sender saw r's connection end, so the
    /// receiver need not find out by itself.
    pub const GONE: u8 = 16;
    /// "Rank r failed, for this reason" (payload: r as u32, then the reason), passed on by a
    /// sparse communicator's rank that was not r's lifeline.
    pub const FAILED_BY: u8 = 17;
    /// "Rank r is gone" (payload: r as u32), passed on by a sparse communicator's herald:
    /// unlike [`GONE`], the sender has not failed.
    pub const PASS_GONE: u8 = 18;
}

/// A rank waiting this long for its relayed table looks whether its parent still listens,
/// and again this often.
const RELAY_LOOK_AFTER_MS: u64 = 500;
const RELAY_LOOK_EVERY_MS: u64 = 500;

/// A wait stuck this long asks the peers it waits for where their calls stand.
pub const PROBE_AFTER_MS: u64 = 200;
/// How often a stuck wait asks again.
pub const PROBE_EVERY_MS: u64 = 1000;
/// How long a probe waits for its answer.
pub const PROBE_ANSWER_MS: u64 = 200;
/// The largest probe answer (`STATE` frame) accepted: a peer state with a group's
/// [`service::MAX_REST`] later calls.
const MAX_STATE_FRAME: usize = 64 + 24 * service::MAX_REST;
/// How long a closing rank waits, over all its control connections together, for the peers
/// to close their ends after its goodbye.
pub const CLOSE_DRAIN_MS: u64 = 1000;
/// How long a wait may stay stuck on a peer that destroyed its communicator in order before
/// it fails (data the peer sent before it left may still be in flight on a slow link).
pub const LEFT_GRACE_MS: u64 = 5000;
/// The most a timeout's report waits for the peers' answers (all asked at once).
pub const REPORT_ANSWER_MS: u64 = 1000;

/// The most bytes of a failure's reason sent to peers.
pub const MAX_FAIL_REASON_BYTES: usize = 2048;

/// `reason`, cut to at most [`MAX_FAIL_REASON_BYTES`] on a character boundary.
fn bounded(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_FAIL_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// The tag of the peer table relayed from a rank to its children in the relay tree.
pub(crate) const TAG_TABLE: u64 = 0xB0 << 56;

/// The tag of the word a rank sends each lifeline once it has connected to all of them.
const TAG_CONNECTED: u64 = 0xB1 << 56;

const JOIN_MAGIC: u32 = u32::from_le_bytes(*b"OXJN");
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"OXHL");

/// How long a wait stuck only on live peers keeps waiting once another peer is gone.
const GONE_GRACE_MS: u64 = 300;

/// What a rank tells the others about itself.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerInfo {
    pub rank: Rank,
    pub pid: u32,
    pub host_id: u64,
    pub hostname: String,
    /// The rank's service listener.
    pub addr: SocketAddr,
    /// The abstract name of the rank's Unix socket.
    pub unix_name: [u8; 16],
    /// The calibration of the rank's host (the tuner uses rank 0's on every rank).
    pub costs: oxccl_core::tuner::CpuCosts,
    /// The rank's CUDA device ordinal ([`Config::cuda_device`](oxccl_core::config::Config)),
    /// -1 when not known.
    pub cuda_device: i32,
}

fn put_addr(w: &mut Writer, a: &SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            w.u8(4).raw(&ip.octets()).raw(&[0u8; 12]);
        }
        IpAddr::V6(ip) => {
            w.u8(6).raw(&ip.octets());
        }
    }
    w.u16(a.port());
}

fn get_addr(r: &mut Reader<'_>) -> Result<SocketAddr, CoreError> {
    let fam = r.u8()?;
    let b: [u8; 16] = r.fixed()?;
    let port = r.u16()?;
    let ip = match fam {
        4 => IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])),
        6 => IpAddr::V6(Ipv6Addr::from(b)),
        f => {
            return Err(CoreError::Malformed { what: "peer address", reason: format!("address family {f}") })
        }
    };
    Ok(SocketAddr::new(ip, port))
}

impl PeerInfo {
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u32(self.rank.0).u32(self.pid).u64(self.host_id).str(&self.hostname);
        put_addr(w, &self.addr);
        w.raw(&self.unix_name);
        let c = &self.costs;
        w.u64(c.copy_gbs.to_bits())
            .u64(c.hop_us.to_bits())
            .u64(c.tcp_us.to_bits())
            .u64(c.tcp_gbs.to_bits())
            .u64(c.ll_gbs.to_bits())
            .u64(c.ll128_gbs.to_bits())
            .u8(c.measured as u8);
        w.u32(self.cuda_device as u32);
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<PeerInfo, CoreError> {
        Ok(PeerInfo {
            rank: Rank(r.u32()?),
            pid: r.u32()?,
            host_id: r.u64()?,
            hostname: r.str()?.to_string(),
            addr: get_addr(r)?,
            unix_name: r.fixed()?,
            costs: {
                let mut f = || -> Result<f64, CoreError> {
                    let v = f64::from_bits(r.u64()?);
                    if v.is_finite() && v > 0.0 {
                        Ok(v)
                    } else {
                        Err(CoreError::Malformed { what: "peer calibration", reason: format!("{v}") })
                    }
                };
                let (copy_gbs, hop_us, tcp_us, tcp_gbs) = (f()?, f()?, f()?, f()?);
                let (ll_gbs, ll128_gbs) = (f()?, f()?);
                oxccl_core::tuner::CpuCosts {
                    copy_gbs,
                    hop_us,
                    tcp_us,
                    tcp_gbs,
                    ll_gbs,
                    ll128_gbs,
                    measured: r.u8()? != 0,
                }
            },
            cuda_device: match r.u32()? as i32 {
                d if d >= -1 => d,
                d => return Err(CoreError::Malformed { what: "peer CUDA device", reason: format!("{d}") }),
            },
        })
    }

    /// `host:pid`, for messages.
    pub fn place(&self) -> String {
        format!("{}:{}", self.hostname, self.pid)
    }
}

pub(crate) fn encode_class(w: &mut Writer, c: ConnClass) {
    match c {
        ConnClass::Ring(ChannelId(ch)) => w.u8(0).u16(ch),
        ConnClass::Direct => w.u8(1).u16(0),
        ConnClass::P2p => w.u8(2).u16(0),
        ConnClass::Tree(t) => w.u8(3).u16(t as u16),
        ConnClass::Rma => w.u8(4).u16(0),
    };
}

pub(crate) fn decode_class(r: &mut Reader<'_>) -> Result<ConnClass, CoreError> {
    let k = r.u8()?;
    let ch = r.u16()?;
    match k {
        0 => Ok(ConnClass::Ring(ChannelId(ch))),
        1 => Ok(ConnClass::Direct),
        2 => Ok(ConnClass::P2p),
        3 if (ch as usize) < 2 * oxccl_core::plan::tree::MAX_TREE_CHANNELS => Ok(ConnClass::Tree(ch as u8)),
        4 => Ok(ConnClass::Rma),
        _ => Err(CoreError::Malformed { what: "connection class", reason: format!("kind {k}") }),
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
    pub mailbox: Option<Arc<Mailbox>>,
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
    pub boot: Arc<Bootstrap>,
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
    fn new(boot: &Arc<Bootstrap>, mine: Sig, check: bool) -> Probe {
        Probe {
            boot: boot.clone(),
            mine,
            check,
            next: std::cell::Cell::new(None),
            report: std::cell::RefCell::new(None),
        }
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
    fn report(&self, me: Rank, mailbox: Option<&Mailbox>, until: Instant) -> String {
        let n = self.boot.peers.len();
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
        mailbox: &Arc<Mailbox>,
        boot: &Arc<Bootstrap>,
        mine: Sig,
        check: bool,
    ) -> Waiter {
        let mut w = Waiter::lazy(rank, timeout, abort);
        w.mailbox = Some(mailbox.clone());
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
    pub fn probing(mut self, boot: &Arc<Bootstrap>, mine: Sig, check: bool) -> Waiter {
        self.probe = Some(Probe::new(boot, mine, check));
        self
    }

    /// Also fails, once stuck, when a peer is gone, as `mailbox` learned it.
    pub fn watching(mut self, mailbox: &Arc<Mailbox>) -> Waiter {
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
                    Some(m) => m.progress.snapshot().rest,
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

/// Writes one frame (blocking).
pub(crate) fn write_frame(s: &mut TcpStream, k: u8, payload: &[u8]) -> io::Result<()> {
    s.write_all(&frame(k, payload))
}

/// One frame's bytes: length (u32 LE), kind, three zero bytes, payload.
pub(crate) fn frame(k: u8, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(8 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&[k, 0, 0, 0]);
    buf.extend_from_slice(payload);
    buf
}

/// Writes one frame, honouring the waiter: the write gives up (with the waiter's error, which
/// names the peer) at its deadline or on abort, instead of blocking on a peer that stopped
/// reading.
pub(crate) fn write_frame_within(
    s: &mut TcpStream,
    k: u8,
    payload: &[u8],
    w: &Waiter,
    what: &str,
    peer: Rank,
) -> Result<()> {
    let buf = frame(k, payload);
    let mut sent = 0;
    while sent < buf.len() {
        w.check(what, &[peer])?;
        s.set_write_timeout(Some(w.slice().max(Duration::from_millis(1))))
            .map_err(|e| Error::io(w.rank, "set socket timeout", Some(peer), e))?;
        match s.write(&buf[sent..]) {
            Ok(0) => {
                return Err(Error::io(
                    w.rank,
                    "bootstrap send",
                    Some(peer),
                    io::Error::new(io::ErrorKind::WriteZero, format!("connection closed during {what}")),
                ))
            }
            Ok(n) => sent += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(Error::io(w.rank, "bootstrap send", Some(peer), e)),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes from a blocking stream, honouring the waiter.
fn read_full(s: &mut TcpStream, buf: &mut [u8], w: &Waiter, what: &str, peer: &[Rank]) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        w.check(what, peer)?;
        s.set_read_timeout(Some(w.slice().max(Duration::from_millis(1))))
            .map_err(|e| Error::io(w.rank, "set socket timeout", None, e))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(Error::io(
                    w.rank,
                    "bootstrap read",
                    peer.first().copied(),
                    io::Error::new(io::ErrorKind::UnexpectedEof, format!("connection closed during {what}")),
                ))
            }
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(Error::io(w.rank, "bootstrap read", peer.first().copied(), e)),
        }
    }
    Ok(())
}

/// Reads one frame from a blocking stream.
pub(crate) fn read_frame(s: &mut TcpStream, w: &Waiter, what: &str, peer: &[Rank]) -> Result<(u8, Vec<u8>)> {
    let mut hdr = [0u8; 8];
    read_full(s, &mut hdr, w, what, peer)?;
    let len = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
    if len > MAX_BOOTSTRAP_FRAME_BYTES {
        return Err(CoreError::Malformed {
            what: "bootstrap frame",
            reason: format!("{len} bytes exceeds the {MAX_BOOTSTRAP_FRAME_BYTES}-byte limit"),
        }
        .into());
    }
    let mut payload = vec![0u8; len];
    read_full(s, &mut payload, w, what, peer)?;
    Ok((hdr[4], payload))
}

/// Connects to `addr`, retrying while nothing listens there yet.
pub(crate) fn connect_retry(addr: SocketAddr, w: &Waiter, what: &str, peer: &[Rank]) -> Result<TcpStream> {
    loop {
        w.check(what, peer)?;
        match TcpStream::connect_timeout(&addr, w.slice().max(Duration::from_millis(10))) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                ) =>
            {
                std::thread::sleep(Duration::from_millis(CONNECT_RETRY_MS));
            }
            Err(e) => return Err(Error::io(w.rank, "connect", peer.first().copied(), e)),
        }
    }
}

/// The join request a rank sends the root.
pub(crate) struct Join {
    pub version: u32,
    pub secret: [u8; 32],
    pub rank: u32,
    pub nranks: u32,
    /// The joining rank's `OXCCL_BOOTSTRAP_SPARSE_FROM` (rank 0's decides).
    pub sparse_from: u32,
    pub info: PeerInfo,
}

impl Join {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(JOIN_MAGIC).u32(self.version).raw(&self.secret).u32(self.rank).u32(self.nranks);
        w.u32(self.sparse_from);
        self.info.encode(&mut w);
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<Join, CoreError> {
        let mut r = Reader::new(b, "join request");
        if r.u32()? != JOIN_MAGIC {
            return Err(CoreError::Malformed { what: "join request", reason: "bad magic".into() });
        }
        let j = Join {
            version: r.u32()?,
            secret: r.fixed()?,
            rank: r.u32()?,
            nranks: r.u32()?,
            sparse_from: r.u32()?,
            info: PeerInfo::decode(&mut r)?,
        };
        r.finish()?;
        Ok(j)
    }
}

pub(crate) fn encode_reject(reason: &RejectReason) -> Vec<u8> {
    let mut w = Writer::new();
    match reason {
        RejectReason::WrongSecret => w.u8(0),
        RejectReason::WorldSizeMismatch { rank, size, root_size } => {
            w.u8(1).u32(*rank).u32(*size).u32(*root_size)
        }
        RejectReason::DuplicateRank { rank, first, second } => w.u8(2).u32(*rank).str(first).str(second),
        RejectReason::RankOutOfRange { rank, size } => w.u8(3).u32(*rank).u32(*size),
        RejectReason::Version { ours, theirs } => w.u8(4).u32(*ours).u32(*theirs),
        RejectReason::RootOutOfDescriptors { joined, limit } => w.u8(5).u32(*joined).u64(*limit),
    };
    w.finish()
}

pub(crate) fn decode_reject(b: &[u8]) -> Result<RejectReason, CoreError> {
    let mut r = Reader::new(b, "rejection");
    Ok(match r.u8()? {
        0 => RejectReason::WrongSecret,
        1 => RejectReason::WorldSizeMismatch { rank: r.u32()?, size: r.u32()?, root_size: r.u32()? },
        2 => RejectReason::DuplicateRank {
            rank: r.u32()?,
            first: r.str()?.to_string(),
            second: r.str()?.to_string(),
        },
        3 => RejectReason::RankOutOfRange { rank: r.u32()?, size: r.u32()? },
        4 => RejectReason::Version { ours: r.u32()?, theirs: r.u32()? },
        5 => RejectReason::RootOutOfDescriptors { joined: r.u32()?, limit: r.u64()? },
        k => return Err(CoreError::Malformed { what: "rejection", reason: format!("code {k}") }),
    })
}

pub(crate) fn encode_table(t: &[PeerInfo]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(t.len() as u32);
    for p in t {
        p.encode(&mut w);
    }
    w.finish()
}

/// The peer table's codec on a synthetic table of `n` entries (IPv4 addresses, 9-character
/// host names, 8 ranks a host): bytes per entry and µs to decode one, best of 3. For the
/// bootstrap model (`oxccl sim --bootstrap`).
pub fn table_codec_probe(n: usize) -> (f64, f64) {
    let n = n.max(1);
    let table: Vec<PeerInfo> = (0..n as u32)
        .map(|r| PeerInfo {
            rank: Rank(r),
            pid: 1000 + r,
            host_id: u64::from(r / 8),
            hostname: format!("node{:05}", r / 8),
            addr: SocketAddr::from(([10, (r >> 16) as u8, (r >> 8) as u8, r as u8], 40000)),
            unix_name: [1; 16],
            costs: Default::default(),
            cuda_device: -1,
        })
        .collect();
    let bytes = encode_table(&table);
    let best = (0..3)
        .map(|_| {
            let t = Instant::now();
            let back = decode_table(&bytes).map(|v| v.len()).unwrap_or(0);
            debug_assert_eq!(back, n);
            t.elapsed()
        })
        .min()
        .unwrap_or_default();
    (bytes.len() as f64 / n as f64, best.as_secs_f64() * 1e6 / n as f64)
}

pub(crate) fn decode_table(b: &[u8]) -> Result<Vec<PeerInfo>, CoreError> {
    let mut r = Reader::new(b, "peer table");
    let n = r.u32()? as usize;
    // Each entry takes at least 40 bytes: refuse counts the message cannot hold.
    if n > b.len() / 40 + 1 {
        return Err(CoreError::Malformed {
            what: "peer table",
            reason: format!("claims {n} entries in {} bytes", b.len()),
        });
    }
    let t = (0..n).map(|_| PeerInfo::decode(&mut r)).collect::<Result<Vec<_>, _>>()?;
    r.finish()?;
    Ok(t)
}

/// How the peer table reaches a rank, as the root tells each rank once all have joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// Rank 0's `OXCCL_BOOTSTRAP_SPARSE_FROM`, which holds for the communicator (0: never).
    pub sparse_from: u32,
    /// Sparse: the table comes down the relay tree, from this rank's parent there (rank 0
    /// gets it from the root), and lifelines go to neighbours only.
    pub sparse: bool,
    /// Sparse, below rank 0: the services of the rank's ancestors in the relay tree, parent
    /// first (at most 32), so a rank whose parent's process ended before it relayed finds
    /// out (a refused connection) and knows whether an ancestor still lives to relay past it.
    pub ancestors: Vec<SocketAddr>,
    /// Sparse: the services of the rank's children in the relay tree (at most 2), so it
    /// forwards the table before decoding it: decoding (0.3 µs an entry) stays off the
    /// path the table travels down.
    pub children: Vec<SocketAddr>,
}

impl Route {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.sparse_from).u8(self.sparse as u8).u8(self.ancestors.len() as u8);
        for a in &self.ancestors {
            put_addr(&mut w, a);
        }
        w.u8(self.children.len() as u8);
        for a in &self.children {
            put_addr(&mut w, a);
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<Route, CoreError> {
        let mut r = Reader::new(b, "route");
        let sparse_from = r.u32()?;
        let sparse = match r.u8()? {
            0 => false,
            1 => true,
            k => return Err(CoreError::Malformed { what: "route", reason: format!("mode {k}") }),
        };
        let n = r.u8()? as usize;
        if n > 32 {
            return Err(CoreError::Malformed { what: "route", reason: format!("{n} ancestors") });
        }
        let ancestors = (0..n).map(|_| get_addr(&mut r)).collect::<Result<Vec<_>, _>>()?;
        let n = r.u8()? as usize;
        if n > 2 {
            return Err(CoreError::Malformed { what: "route", reason: format!("{n} children") });
        }
        let children = (0..n).map(|_| get_addr(&mut r)).collect::<Result<Vec<_>, _>>()?;
        r.finish()?;
        Ok(Route { sparse_from, sparse, ancestors, children })
    }

    /// The ranks above `me` in the relay tree, parent first.
    pub fn ancestors_of(me: Rank) -> Vec<Rank> {
        let mut v = Vec::new();
        let mut r = me.idx();
        while r > 0 {
            r = (r - 1) / 2;
            v.push(Rank::new(r));
        }
        v
    }

    /// Whether a communicator of `size` ranks is sparse under the threshold `sparse_from`.
    pub fn is_sparse(size: usize, sparse_from: usize) -> bool {
        sparse_from != 0 && size >= sparse_from.max(2)
    }
}

/// The relay tree that carries the peer table in a sparse bootstrap: a binary heap over rank
/// numbers (rank 0 at the top, which the root sends the table to): `(parent, children)`.
pub fn relay_links(me: Rank, size: usize) -> (Option<Rank>, Vec<Rank>) {
    let r = me.idx();
    let parent = (r > 0).then(|| Rank::new((r - 1) / 2));
    let children = [2 * r + 1, 2 * r + 2].into_iter().filter(|c| *c < size).map(Rank::new).collect();
    (parent, children)
}

/// What joining gives a rank.
pub(crate) struct Joined {
    /// The peer table, in rank order.
    pub peers: Vec<PeerInfo>,
    pub route: Route,
    /// Control connections opened while joining (a sparse bootstrap's relay to this rank's
    /// children), hello sent: the first of the rank's lifelines.
    pub links: HashMap<u32, TcpStream>,
}

/// Where and how a rank joins: the root's address, the communicator's secret, its size, and this
/// rank's sparse-bootstrap threshold (rank 0's decides).
#[derive(Clone, Copy)]
pub(crate) struct Rendezvous<'a> {
    pub root: SocketAddr,
    pub secret: &'a [u8; 32],
    pub size: usize,
    pub sparse_from: usize,
}

/// Joins the root at `rv.root`: the peer table, from the root or (a sparse bootstrap) from this
/// rank's parent in the relay tree, which it forwards to its own children. `mailbox` is this
/// rank's service's, where a relayed table arrives; `w` should watch it, so a parent whose
/// process ends before it relays is named at once.
pub(crate) fn join(
    rv: Rendezvous<'_>,
    info: &PeerInfo,
    mailbox: &Mailbox,
    w: &Waiter,
    log: &crate::log::Logger,
) -> Result<Joined> {
    let Rendezvous { root, secret, size, sparse_from } = rv;
    let what = format!("bootstrap: reaching the rendezvous root at {root} (nothing listens there yet)");
    let req = Join {
        version: PROTOCOL_VERSION,
        secret: *secret,
        rank: info.rank.0,
        nranks: size as u32,
        sparse_from: sparse_from.min(u32::MAX as usize) as u32,
        info: info.clone(),
    };
    let mut s = join_root(root, &req.encode(), w, &what)?;
    // Until the route comes, the root's status frames say who has not joined yet: a timeout
    // names them.
    let mut missing: Vec<Rank> = Vec::new();
    let next = |s: &mut TcpStream, missing: &mut Vec<Rank>| -> Result<(u8, Vec<u8>)> {
        loop {
            let what = if missing.is_empty() {
                format!("bootstrap: waiting for every rank to join at the root {root} (it has not yet said which ranks it misses)")
            } else {
                format!("bootstrap: waiting for the missing ranks to join at the root {root}")
            };
            let (k, payload) = read_frame(s, w, &what, missing).map_err(|e| match e {
                    // The root lives in rank 0's process: a reset or an end of stream before
                    // its answer means that process ended (often after a failed rendezvous,
                    // which the ranks that had joined by then were told).
                    Error::Io { source, .. }
                        if matches!(
                            source.kind(),
                            io::ErrorKind::ConnectionReset
                                | io::ErrorKind::UnexpectedEof
                                | io::ErrorKind::BrokenPipe
                                | io::ErrorKind::ConnectionAborted
                        ) =>
                    {
                        Error::PeerClosed {
                            rank: w.rank,
                            op: "bootstrap: waiting for the rendezvous root's answer (the root runs in rank 0's process, which ended before answering: see rank 0's error)".into(),
                            peer: Rank(0),
                            host: root.to_string(),
                        }
                    }
                    e => e,
                })?;
            match k {
                kind::STATUS => *missing = JoinStatus::decode(&payload)?.missing,
                kind::REJECT => {
                    return Err(Error::Rejected { rank: w.rank, reason: decode_reject(&payload)? })
                }
                _ => return Ok((k, payload)),
            }
        }
    };
    let unexpected = |k: u8| -> Error {
        CoreError::Malformed { what: "root reply", reason: format!("frame kind {k}") }.into()
    };
    let (k, payload) = next(&mut s, &mut missing)?;
    if k != kind::ROUTE {
        return Err(unexpected(k));
    }
    let route = Route::decode(&payload)?;
    let (parent, children) = relay_links(info.rank, size);
    let table = match (route.sparse, parent) {
        (false, _) | (true, None) => match next(&mut s, &mut missing)? {
            (kind::TABLE, t) => t,
            (k, _) => return Err(unexpected(k)),
        },
        (true, Some(_)) => {
            drop(s);
            await_table(info.rank, &route.ancestors, mailbox, w)?
        }
    };
    let decode = |table: &[u8]| -> Result<Vec<PeerInfo>> {
        let peers = decode_table(table)?;
        if peers.len() != size || peers.iter().enumerate().any(|(i, p)| p.rank.idx() != i) {
            return Err(Error::Internal(format!(
                "bootstrap: a peer table of {} entries for world size {size}",
                peers.len()
            )));
        }
        Ok(peers)
    };
    // Relayed first, decoded after: the children's addresses come with the route; the table
    // is decoded early only to find grandchildren past a child that is gone.
    let mut peers: Option<Vec<PeerInfo>> = None;
    let mut links = HashMap::new();
    if route.sparse {
        if route.children.len() != children.len() {
            return Err(CoreError::Malformed {
                what: "route",
                reason: format!(
                    "{} children's addresses for {} children",
                    route.children.len(),
                    children.len()
                ),
            }
            .into());
        }
        let direct: HashMap<Rank, SocketAddr> =
            children.iter().copied().zip(route.children.iter().copied()).collect();
        let mut msg = Writer::new();
        msg.u64(TAG_TABLE).raw(&table);
        let msg = msg.finish();
        // A child that is gone is skipped: its children get the table from this rank (and
        // so on down), so one rank's death costs no other rank its table. Its death is found
        // again (and named, and told) when the lifelines open.
        let mut todo: Vec<Rank> = children;
        while let Some(c) = todo.pop() {
            let op = "bootstrap: relaying the peer table down the relay tree";
            let addr = match direct.get(&c) {
                Some(a) => *a,
                None => {
                    let p = match peers.take() {
                        Some(p) => p,
                        None => decode(&table)?,
                    };
                    let a = p[c.idx()].addr;
                    peers = Some(p);
                    a
                }
            };
            let sent = (|| -> Result<Option<TcpStream>> {
                // The child's service listened before it joined: a refusal means its process
                // has ended.
                let mut cs = match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                    Ok(cs) => cs,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(None),
                    Err(_) => connect_retry(addr, w, op, &[c])?,
                };
                let _ = cs.set_nodelay(true);
                let hello = Hello { secret: *secret, from: info.rank, to: c, data: None };
                let wrote =
                    write_frame_within(&mut cs, kind::HELLO, &hello.encode(), w, "bootstrap hello", c)
                        .and_then(|_| write_frame_within(&mut cs, kind::MSG, &msg, w, op, c));
                match wrote {
                    Ok(()) => Ok(Some(cs)),
                    // Reset or closed under the write: gone.
                    Err(Error::Io { source, .. })
                        if matches!(
                            source.kind(),
                            io::ErrorKind::ConnectionReset
                                | io::ErrorKind::BrokenPipe
                                | io::ErrorKind::WriteZero
                        ) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })()?;
            match sent {
                Some(cs) => {
                    links.insert(c.0, cs);
                }
                None => {
                    log.warn(format_args!(
                        "bootstrap: rank {c} is gone (its service refuses connections); relaying the peer table past it to its children"
                    ));
                    todo.extend(relay_links(c, size).1);
                }
            }
        }
    }
    let peers = match peers {
        Some(p) => p,
        None => decode(&table)?,
    };
    Ok(Joined { peers, route, links })
}

/// How long a rank whose parent in the relay tree is gone waits for an ancestor to relay
/// the table past it before it gives up, naming the parent.
const ORPHAN_GRACE_MS: u64 = 10_000;

/// A sparse bootstrap's wait for the table: from this rank's parent in the relay tree, or
/// from a live ancestor that relays past a parent that is gone. Ends with an error naming
/// the parent once the parent and every ancestor refuse connections (their processes
/// ended), once the parent's connection ends mid-relay, after `ORPHAN_GRACE_MS` without a
/// parent, or at the deadline.
fn await_table(me: Rank, addrs: &[SocketAddr], mailbox: &Mailbox, w: &Waiter) -> Result<Vec<u8>> {
    let chain = Route::ancestors_of(me);
    let parent = chain[0];
    let what = format!(
        "bootstrap: waiting for the peer table from rank {parent}, this rank's parent in the relay tree"
    );
    let mut next_look = Instant::now() + Duration::from_millis(RELAY_LOOK_AFTER_MS);
    // The nearest ancestor not known to be gone, and since when the parent is.
    let (mut k, mut orphan_since) = (0usize, None::<Instant>);
    let gone = |why: String| Error::PeerClosed {
        rank: me,
        op: format!("{what}: {why}"),
        peer: parent,
        host: "?".into(),
    };
    loop {
        if let Some(t) = mailbox.take_any_within(&chain, TAG_TABLE, w.slice().min(Duration::from_millis(50)))
        {
            return Ok(t);
        }
        w.check(&what, &[parent])?;
        if Instant::now() < next_look {
            continue;
        }
        next_look = Instant::now() + Duration::from_millis(RELAY_LOOK_EVERY_MS);
        while let Some(a) = addrs.get(k) {
            match TcpStream::connect_timeout(a, Duration::from_millis(200)) {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => k += 1,
                _ => break,
            }
        }
        if k > 0 && k >= addrs.len().min(chain.len()) {
            // Every rank above fails once the topmost is gone (none of them gets the
            // table): that one is the cause.
            let top = chain[k - 1];
            return Err(Error::PeerClosed {
                rank: me,
                op: format!(
                    "{what}: rank {top} at the top of this rank's branch of the tree is gone (its service refuses connections), so none below it has the table"
                ),
                peer: top,
                host: "?".into(),
            });
        }
        if k > 0 {
            let since = *orphan_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_millis(ORPHAN_GRACE_MS) {
                return Err(gone(format!(
                    "its service refuses connections (its process ended), and rank {} above it did not relay past it within {ORPHAN_GRACE_MS} ms",
                    chain[k]
                )));
            }
        }
    }
}

/// The root's word on an incomplete rendezvous: the ranks that have not joined (at most
/// [`JoinStatus::MAX_LISTED`] of them, lowest first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JoinStatus {
    pub missing: Vec<Rank>,
}

impl JoinStatus {
    pub const MAX_LISTED: usize = 64;

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        let listed = &self.missing[..self.missing.len().min(Self::MAX_LISTED)];
        w.u32(listed.len() as u32);
        for r in listed {
            w.u32(r.0);
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<JoinStatus, CoreError> {
        let mut r = Reader::new(b, "join status");
        let n = r.u32()? as usize;
        if n > Self::MAX_LISTED {
            return Err(CoreError::Malformed { what: "join status", reason: format!("{n} ranks listed") });
        }
        let missing = (0..n).map(|_| r.u32().map(Rank)).collect::<Result<Vec<_>, _>>()?;
        r.finish()?;
        Ok(JoinStatus { missing })
    }
}

/// The hello that opens every connection to a rank's service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub secret: [u8; 32],
    pub from: Rank,
    pub to: Rank,
    /// `None`: a control-message connection; `Some`: a data connection of that class.
    pub data: Option<ConnClass>,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(HELLO_MAGIC).u32(PROTOCOL_VERSION).raw(&self.secret).u32(self.from.0).u32(self.to.0);
        match self.data {
            None => {
                w.u8(0);
            }
            Some(c) => {
                w.u8(1);
                encode_class(&mut w, c);
            }
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<Hello, CoreError> {
        let mut r = Reader::new(b, "hello");
        if r.u32()? != HELLO_MAGIC || r.u32()? != PROTOCOL_VERSION {
            return Err(CoreError::Malformed { what: "hello", reason: "bad magic or version".into() });
        }
        let secret = r.fixed()?;
        let from = Rank(r.u32()?);
        let to = Rank(r.u32()?);
        let data = match r.u8()? {
            0 => None,
            1 => Some(decode_class(&mut r)?),
            k => return Err(CoreError::Malformed { what: "hello", reason: format!("connection kind {k}") }),
        };
        r.finish()?;
        Ok(Hello { secret, from, to, data })
    }
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

/// Control messages between the ranks of one communicator.
pub struct Bootstrap {
    pub me: Rank,
    secret: [u8; 32],
    peers: Arc<Vec<PeerInfo>>,
    mailbox: Arc<Mailbox>,
    /// The peers this rank keeps control connections to from the start (and tells of a
    /// failure): every other one, or in a sparse communicator its neighbours only.
    lifelines: Vec<Rank>,
    /// Set by [`close`](Self::close): no control connection opens again.
    closed: AtomicBool,
    out: Mutex<HashMap<u32, TcpStream>>,
    /// Bytes of probe answers read but not yet parsed, per peer (locked inside `out`).
    answers: Mutex<HashMap<u32, Vec<u8>>>,
    nonce: std::sync::atomic::AtomicU64,
}

impl Bootstrap {
    /// `lifelines`: the peers to hold control connections to (`None`: all); `links`:
    /// control connections already open (hello sent), by peer.
    pub(crate) fn new(
        me: Rank,
        secret: [u8; 32],
        peers: Arc<Vec<PeerInfo>>,
        mailbox: Arc<Mailbox>,
        lifelines: Option<Vec<Rank>>,
        links: HashMap<u32, TcpStream>,
    ) -> Bootstrap {
        let lifelines = lifelines
            .unwrap_or_else(|| (0..peers.len()).map(Rank::new).collect())
            .into_iter()
            .filter(|r| *r != me && r.idx() < peers.len())
            .collect();
        Bootstrap {
            me,
            secret,
            peers,
            mailbox,
            lifelines,
            closed: AtomicBool::new(false),
            out: Mutex::new(links),
            answers: Mutex::new(HashMap::new()),
            nonce: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// The control connection to `to`, opened (with its hello) if there is none yet.
    fn conn<'a>(
        &self,
        out: &'a mut HashMap<u32, TcpStream>,
        to: Rank,
        w: &Waiter,
    ) -> Result<&'a mut TcpStream> {
        Ok(match out.entry(to.0) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let peer = &self.peers[to.idx()];
                // The peer's service listened before the peer joined (its address is in the
                // table): a refusal now means its process has ended.
                let mut s = match TcpStream::connect_timeout(&peer.addr, Duration::from_secs(2)) {
                    Ok(s) => s,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        let op = "bootstrap: connecting to a peer (connection refused: its process or its communicator has ended)";
                        // It may have ended because of another rank; word of that comes on its
                        // own connections, possibly still in flight: wait for it before
                        // recording the peer as simply gone.
                        let cause = self.mailbox.root_cause(to, Duration::from_millis(200));
                        self.mailbox.mark_gone(to);
                        return Err(match cause {
                            Some(c) => self.mailbox.culprit_error(self.me, op, c),
                            None => Error::PeerClosed {
                                rank: self.me,
                                op: op.into(),
                                peer: to,
                                host: peer.hostname.clone(),
                            },
                        });
                    }
                    Err(_) => connect_retry(peer.addr, w, "bootstrap: connecting to a peer", &[to])?,
                };
                let _ = s.set_nodelay(true);
                let hello = Hello { secret: self.secret, from: self.me, to, data: None };
                write_frame_within(&mut s, kind::HELLO, &hello.encode(), w, "bootstrap hello", to)?;
                v.insert(s)
            }
        })
    }

    /// Opens the control connection to every lifeline peer (every peer, or in a sparse
    /// communicator the neighbours), then waits until every lifeline has done the same. Each
    /// is this rank's lifeline: if it ends without a goodbye, the peer knows this rank is
    /// gone. Others open when first used.
    pub fn connect_all(&self, w: &Waiter) -> Result<()> {
        {
            let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
            w.holding(|| -> Result<()> {
                for &r in &self.lifelines {
                    self.conn(&mut out, r, w)?;
                }
                Ok(())
            })?;
        }
        // Init is collective: no rank may leave it (and end its communicator at once) while a
        // lifeline has yet to connect to it, or that lifeline's init fails on a refused
        // connection. Each rank tells its lifelines it has connected to all of them, then
        // hears the same from each (the lifeline relation is symmetric).
        for &r in &self.lifelines {
            self.send(r, TAG_CONNECTED, &[], w)?;
        }
        for &r in &self.lifelines {
            self.recv(r, TAG_CONNECTED, w)?;
        }
        Ok(())
    }

    /// The peers this rank holds control connections to from the start.
    pub fn lifelines(&self) -> &[Rank] {
        &self.lifelines
    }

    /// Sends `payload` to `to` under `tag`.
    pub fn send(&self, to: Rank, tag: u64, payload: &[u8], w: &Waiter) -> Result<()> {
        if to == self.me {
            self.mailbox.deliver_msg(to, tag, payload.to_vec());
            return Ok(());
        }
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let mut w2 = Writer::new();
        w2.u64(tag).raw(payload);
        // The lock on the control connections is held throughout: `w` must not probe.
        let r = w.holding(|| {
            let s = self.conn(&mut out, to, w)?;
            write_frame_within(s, kind::MSG, &w2.finish(), w, "bootstrap send", to)
        });
        if r.is_err() {
            // A frame may be half written: this connection cannot carry another.
            out.remove(&to.0);
        }
        r
    }

    /// Receives the message `from` sent under `tag`.
    pub fn recv(&self, from: Rank, tag: u64, w: &Waiter) -> Result<Vec<u8>> {
        self.mailbox.wait_msg(from, tag, w)
    }

    /// Every rank's `payload`, in rank order (a collective over the bootstrap network).
    pub fn all_gather(&self, tag: u64, payload: &[u8], w: &Waiter) -> Result<Vec<Vec<u8>>> {
        let n = self.peers.len();
        for i in 1..n {
            let to = Rank::new((self.me.idx() + i) % n);
            self.send(to, tag, payload, w)?;
        }
        (0..n)
            .map(|r| if r == self.me.idx() { Ok(payload.to_vec()) } else { self.recv(Rank::new(r), tag, w) })
            .collect()
    }

    /// Closes outgoing control connections in order: a goodbye, then end of stream (so
    /// peers do not take this rank for gone).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        for s in out.values_mut() {
            let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = write_frame(s, kind::BYE, &[]);
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        // Each peer's service closes its end once it has read the goodbye. Until then this
        // end reads (and drops) what still comes in, such as late answers to probes: a socket
        // closed with unread bytes is reset, and a reset can overtake the goodbye, so the peer
        // would take this rank, which ended in order, for dead. Bounded: a peer that does not
        // close in time is left to the reset.
        // All connections are drained at once (one poll), so a slow peer does not use up
        // the others' time.
        use std::os::fd::AsRawFd;
        let until = Instant::now() + Duration::from_millis(CLOSE_DRAIN_MS);
        let mut open: Vec<&mut TcpStream> =
            out.values_mut().filter(|s| s.set_nonblocking(true).is_ok()).collect();
        let mut buf = [0u8; 512];
        while !open.is_empty() {
            // Read what has come; a connection the peer closed (or reset) is done.
            open.retain_mut(|s| loop {
                match s.read(&mut buf) {
                    Ok(0) => break false,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break false,
                }
            });
            let left = until.saturating_duration_since(Instant::now());
            if open.is_empty() || left.is_zero() {
                break;
            }
            let mut fds: Vec<crate::sys::fd::PollFd> =
                open.iter().map(|s| crate::sys::fd::pollfd(s.as_raw_fd(), crate::sys::fd::POLLIN)).collect();
            if crate::sys::fd::poll(&mut fds, left).is_err() {
                break;
            }
        }
        out.clear();
    }

    /// Tells every peer this rank's communicator failed and why (best effort, bounded: each
    /// write may take at most 100 ms), so their waits on it end at once naming this rank and
    /// the reason instead of at their own deadline. (In a sparse communicator, the lifelines;
    /// their heralds pass it on.)
    pub fn tell_failure(&self, reason: &str) {
        self.tell(kind::FAIL, bounded(reason).as_bytes(), None);
    }

    /// Passes on that `culprit`'s communicator failed for `reason` (a sparse communicator's
    /// herald), to every lifeline but the culprit.
    pub fn tell_failed_by(&self, culprit: Rank, reason: &str) {
        let mut w = Writer::new();
        w.u32(culprit.0).raw(bounded(reason).as_bytes());
        self.tell(kind::FAILED_BY, &w.finish(), Some(culprit));
    }

    /// Tells every other peer that `gone` is gone (best effort, bounded like
    /// [`tell_failure`](Self::tell_failure)).
    pub fn tell_gone(&self, gone: Rank) {
        self.tell(kind::GONE, &gone.0.to_le_bytes(), Some(gone));
    }

    /// Passes on that `gone` is gone (a sparse communicator's herald; this rank has not
    /// failed), to every lifeline but `gone`.
    pub fn pass_gone(&self, gone: Rank) {
        self.tell(kind::PASS_GONE, &gone.0.to_le_bytes(), Some(gone));
    }

    /// Sends one frame on every control connection but `skip`'s, opening the lifelines not
    /// yet open first.
    fn tell(&self, k: u8, payload: &[u8], skip: Option<Rank>) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        self.connect_rest(&mut out);
        let mut broken = Vec::new();
        for (r, s) in out.iter_mut().filter(|(r, _)| Some(Rank(**r)) != skip) {
            let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
            if write_frame(s, k, payload).is_err() {
                broken.push(*r);
            }
            let _ = s.set_write_timeout(None);
        }
        for r in broken {
            out.remove(&r);
        }
    }

    /// Opens the lifelines not yet open (a failure during setup reaches peers this rank had
    /// not connected to yet), giving each little time: peers that cannot be reached quickly
    /// are not told.
    fn connect_rest(&self, out: &mut HashMap<u32, TcpStream>) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        for &r in &self.lifelines {
            if out.contains_key(&r.0) || self.mailbox.gone_among(&[r]).is_some() {
                continue;
            }
            let peer = &self.peers[r.idx()];
            let Ok(mut s) = TcpStream::connect_timeout(&peer.addr, Duration::from_millis(200)) else {
                continue;
            };
            let _ = s.set_nodelay(true);
            let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
            let hello = Hello { secret: self.secret, from: self.me, to: r, data: None };
            if write_frame(&mut s, kind::HELLO, &hello.encode()).is_ok() {
                let _ = s.set_write_timeout(None);
                out.insert(r.0, s);
            }
        }
    }

    /// Asks `peer` where its calls stand, over the control connection (answered by its
    /// service thread, whatever its engine is doing); `None` if no answer came within `wait`
    /// or there is no connection.
    pub fn probe(&self, peer: Rank, wait: Duration) -> Probed {
        let until = Instant::now() + wait;
        match self.ask(peer, wait) {
            Ok(nonce) => self.answer(peer, nonce, until),
            Err(p) => p,
        }
    }

    /// Asks several peers at once and waits for their answers until `until` (one wait for
    /// all, not one each).
    pub fn probe_all(&self, peers: &[Rank], until: Instant) -> Vec<Probed> {
        let wait = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let asked: Vec<Result<u64, Probed>> = peers.iter().map(|r| self.ask(*r, wait)).collect();
        peers
            .iter()
            .zip(asked)
            .map(|(r, a)| match a {
                Ok(nonce) => self.answer(*r, nonce, until),
                Err(p) => p,
            })
            .collect()
    }

    /// Sends `peer` a probe; its nonce, or what the failure to send says.
    fn ask(&self, peer: Rank, wait: Duration) -> Result<u64, Probed> {
        let Some(mut out) = self.out_by(Instant::now() + wait) else {
            return Err(Probed::NoAnswer);
        };
        if !out.contains_key(&peer.0)
            && peer != self.me
            && peer.idx() < self.peers.len()
            && !self.lifelines.contains(&peer)
        {
            // Not a lifeline (a sparse communicator's peer away from this rank): connect now,
            // briefly; a refusal means its process or communicator has ended.
            let addr = self.peers[peer.idx()].addr;
            match TcpStream::connect_timeout(
                &addr,
                wait.clamp(Duration::from_millis(1), Duration::from_millis(200)),
            ) {
                Ok(mut s) => {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                    let hello = Hello { secret: self.secret, from: self.me, to: peer, data: None };
                    if write_frame(&mut s, kind::HELLO, &hello.encode()).is_ok() {
                        out.insert(peer.0, s);
                    }
                }
                // Refused: its process or communicator has ended. If another departure is
                // known, this one is most likely its consequence, whose word is still on its
                // way over the lifelines: no verdict (the known departure ends the wait).
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    return Err(if self.mailbox.first_gone().is_some() {
                        Probed::NoAnswer
                    } else {
                        Probed::Gone
                    })
                }
                Err(_) => {}
            }
        }
        let Some(s) = out.get_mut(&peer.0) else {
            return Err(Probed::NoAnswer);
        };
        let nonce = self.nonce.fetch_add(1, Ordering::Relaxed);
        let _ = s.set_write_timeout(Some(wait.max(Duration::from_millis(1))));
        let sent = write_frame(s, kind::PROBE, &nonce.to_le_bytes());
        let _ = s.set_write_timeout(None);
        match sent {
            Ok(()) => Ok(nonce),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Err(Probed::NoAnswer)
            }
            Err(_) => Err(Probed::Gone),
        }
    }

    /// The control connections, if their lock comes free by `until`. A probe never waits on
    /// the lock without bound: its holder may be a write stuck on a slow peer, or this very
    /// thread.
    fn out_by(&self, until: Instant) -> Option<std::sync::MutexGuard<'_, HashMap<u32, TcpStream>>> {
        loop {
            match self.out.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_micros(500))
                }
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// Waits until `until` for the answer to probe `nonce` of `peer`.
    fn answer(&self, peer: Rank, nonce: u64, until: Instant) -> Probed {
        let Some(mut out) = self.out_by(until) else {
            return Probed::NoAnswer;
        };
        let Some(s) = out.get_mut(&peer.0) else {
            return Probed::NoAnswer;
        };
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let buf = answers.entry(peer.0).or_default();
        let mut tmp = [0u8; 256];
        let mut last_look = false;
        loop {
            // Whole frames first; only STATE frames are expected, older answers are skipped.
            while buf.len() >= 8 {
                let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if len > MAX_STATE_FRAME || buf[4] != kind::STATE {
                    buf.clear();
                    return Probed::NoAnswer;
                }
                if buf.len() < 8 + len {
                    break;
                }
                let frame: Vec<u8> = buf.drain(..8 + len).skip(8).collect();
                if let Ok((n, st)) = PeerState::decode(&frame) {
                    if n == nonce {
                        return Probed::Answer(st);
                    }
                }
            }
            let mut left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // Past the deadline (another peer's answer took the time): what has already
                // arrived still counts.
                if last_look {
                    return Probed::NoAnswer;
                }
                last_look = true;
                left = Duration::from_millis(1);
            }
            let _ = s.set_read_timeout(Some(left));
            match s.read(&mut tmp) {
                // The peer's end closed: its process ended (a live peer never closes a
                // control connection it accepted while this rank keeps its own end open).
                Ok(0) => return Probed::Gone,
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) => {
                    return Probed::Gone
                }
                Err(_) => return Probed::NoAnswer,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
    }

    /// Shuts down outgoing control connections, from any thread (abort).
    pub fn shutdown(&self) {
        if let Ok(out) = self.out.try_lock() {
            for s in out.values() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn info(r: u32, addr: SocketAddr) -> PeerInfo {
        PeerInfo {
            rank: Rank(r),
            pid: 0,
            host_id: 0,
            hostname: "vm".into(),
            addr,
            unix_name: [0; 16],
            costs: Default::default(),
            cuda_device: -1,
        }
    }

    /// Each rank's CUDA device travels in the peer table (-1: not known); a device below -1
    /// is refused as malformed.
    #[test]
    fn the_peer_table_carries_each_ranks_cuda_device() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let table: Vec<PeerInfo> = [-1, 0, 7]
            .iter()
            .enumerate()
            .map(|(r, &d)| PeerInfo { cuda_device: d, ..info(r as u32, addr) })
            .collect();
        assert_eq!(decode_table(&encode_table(&table)).unwrap(), table);
        let bad = encode_table(&[PeerInfo { cuda_device: -2, ..info(0, addr) }]);
        let e = decode_table(&bad).unwrap_err().to_string();
        assert!(e.contains("CUDA device") && e.contains("-2"), "{e}");
    }

    /// A sparse rendezvous of 5 ranks (relay tree 0 -> 1, 2; 1 -> 3, 4) where rank 1 joins
    /// and is gone before (`early`) or just after (`!early`) rank 0 relays the table to it.
    /// Returns each real rank's result and how long its join took.
    /// Per rank: its number, what joining gave (table length, sparse) and how long it took.
    type JoinOutcome = (u32, Result<(usize, bool)>, Duration);

    fn relay_with_rank1_gone(early: bool) -> Vec<JoinOutcome> {
        let secret = [9u8; 32];
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let root_addr = listener.local_addr().unwrap();
        let quiet = crate::log::Logger::new(&oxccl_core::config::Config::default(), None);
        root::spawn(listener, secret, quiet).unwrap();
        let n = 5;
        let real = |r: u32| {
            std::thread::spawn(move || {
                let doorbell = Arc::new(crate::sys::fd::EventFd::new().unwrap());
                let ctl = Arc::new(crate::transport::hostmem::Ctl::create(r).unwrap());
                let log = crate::log::Logger::new(&oxccl_core::config::Config::default(), Some(r));
                let svc =
                    Service::start("127.0.0.1".parse().unwrap(), Rank(r), n, secret, doorbell, ctl, log)
                        .unwrap();
                let me = info(r, svc.addr);
                let w = Waiter::new(Rank(r), Some(Duration::from_secs(30)), Arc::new(AtomicBool::new(false)))
                    .watching(&svc.mailbox);
                let t = Instant::now();
                let rv = Rendezvous { root: root_addr, secret: &secret, size: n, sparse_from: 2 };
                let got = join(rv, &me, &svc.mailbox, &w, &log);
                // The service lives on (as in a rank whose init went on) until all are done.
                (r, got.map(|j| (j.peers.len(), j.route.sparse)), t.elapsed(), svc)
            })
        };
        let hs: Vec<_> = [0, 2, 3, 4].into_iter().map(real).collect();
        // Rank 1: a listener as its service (closed at once when `early`), joins, hears its
        // route, and (unless early) takes rank 0's relay and is gone.
        let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fake_addr = fake.local_addr().unwrap();
        let fake = if early {
            drop(fake);
            None
        } else {
            Some(fake)
        };
        let w1 = Waiter::new(Rank(1), Some(Duration::from_secs(10)), Arc::new(AtomicBool::new(false)));
        let mut s = connect_retry(root_addr, &w1, "test", &[]).unwrap();
        let req = Join {
            version: PROTOCOL_VERSION,
            secret,
            rank: 1,
            nranks: n as u32,
            sparse_from: 2,
            info: info(1, fake_addr),
        };
        write_frame(&mut s, kind::JOIN, &req.encode()).unwrap();
        let route = loop {
            let (k, p) = read_frame(&mut s, &w1, "test", &[]).unwrap();
            if k == kind::ROUTE {
                break Route::decode(&p).unwrap();
            }
        };
        assert!(route.sparse && route.ancestors.len() == 1, "{route:?}");
        if let Some(f) = fake {
            // Take the whole relay (hello, then the table) before going: a close before rank 0
            // has written it all would make rank 0 find rank 1 gone and relay past it.
            let (mut relay, _) = f.accept().unwrap();
            let (k, _) = read_frame(&mut relay, &w1, "test: the relay's hello", &[]).unwrap();
            assert_eq!(k, kind::HELLO);
            let (k, _) = read_frame(&mut relay, &w1, "test: the relayed table", &[]).unwrap();
            assert_eq!(k, kind::MSG);
            drop(relay);
        }
        drop(s);
        let all: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        all.into_iter().map(|(r, got, took, _svc)| (r, got, took)).collect()
    }

    /// Rank 1 is gone before rank 0 relays: rank 0 relays past it, so every live rank
    /// (its children 3 and 4 too) gets the whole table; no join fails.
    #[test]
    fn a_relay_tree_routes_around_a_rank_that_is_gone() {
        for (r, got, _) in relay_with_rank1_gone(true) {
            assert_eq!(got.unwrap_or_else(|e| panic!("rank {r}: {e}")), (5, true), "rank {r}");
        }
    }

    /// Rank 1 took rank 0's relay and is gone before passing it on: its children (3, 4),
    /// whose ancestor 0 lives, wait out the orphan grace and fail naming rank 1; ranks 0
    /// and 2 have their tables.
    #[test]
    fn a_relay_parent_that_dies_with_the_table_is_named_by_its_children() {
        for (r, got, took) in relay_with_rank1_gone(false) {
            match r {
                0 | 2 => assert_eq!(got.unwrap_or_else(|e| panic!("rank {r}: {e}")), (5, true)),
                _ => {
                    let e = got.expect_err("rank 1 never relayed to this rank");
                    assert!(matches!(&e, Error::PeerClosed { peer: Rank(1), .. }), "rank {r}: {e}");
                    let grace = Duration::from_millis(ORPHAN_GRACE_MS);
                    assert!(took < grace + Duration::from_secs(3), "rank {r}: {took:?}");
                }
            }
        }
    }

    /// A send to a peer that takes the connection but never reads blocks once the socket's
    /// buffers fill. Its waiter probes stuck peers over these same control connections, whose
    /// lock the send holds: the send must still end at its deadline with a timeout naming the
    /// peer (it once waited forever on its own lock), and a probe meanwhile must not wait on
    /// the lock without bound.
    #[test]
    fn a_send_stuck_on_a_peer_that_never_reads_ends_at_its_deadline() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peers = Arc::new(vec![info(0, "127.0.0.1:9".parse().unwrap()), info(1, l.local_addr().unwrap())]);
        let mailbox = Arc::new(Mailbox::default());
        let boot = Arc::new(Bootstrap::new(Rank(0), [7; 32], peers, mailbox.clone(), None, HashMap::new()));
        // The peer accepts and holds the connection open, reading nothing.
        let holder = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            std::thread::sleep(Duration::from_secs(4));
            drop(s);
        });
        let abort = Arc::new(AtomicBool::new(false));
        let w = Waiter::new(Rank(0), Some(Duration::from_millis(1500)), abort).watching(&mailbox).probing(
            &boot,
            Sig::NONE,
            false,
        );
        let t = Instant::now();
        let big = vec![0u8; 64 << 20];
        let err = boot.send(Rank(1), 5, &big, &w).expect_err("a send nobody reads cannot finish");
        let took = t.elapsed();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("bootstrap send"), "{err}");
        assert!(took < Duration::from_millis(3500), "the send ended {took:?} after it began: {err}");
        // The failed send dropped its half-written connection; a probe while another thread
        // holds the lock gives up at its own bound.
        let guard = boot.out.lock().unwrap();
        let t = Instant::now();
        assert!(matches!(boot.probe(Rank(1), Duration::from_millis(100)), Probed::NoAnswer));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        drop(guard);
        holder.join().unwrap();
    }

    #[test]
    fn join_status_round_trips_and_bounds_its_list() {
        let s = JoinStatus { missing: vec![Rank(1), Rank(7)] };
        assert_eq!(JoinStatus::decode(&s.encode()).unwrap(), s);
        // More than MAX_LISTED missing ranks: the first MAX_LISTED are sent.
        let many = JoinStatus { missing: (0..100).map(Rank).collect() };
        let back = JoinStatus::decode(&many.encode()).unwrap();
        assert_eq!(back.missing, (0..JoinStatus::MAX_LISTED as u32).map(Rank).collect::<Vec<_>>());
        // A frame claiming more, or with trailing bytes, is refused.
        let mut w = Writer::new();
        w.u32(65);
        assert!(JoinStatus::decode(&w.finish()).is_err());
        let mut b = s.encode();
        b.push(0);
        assert!(JoinStatus::decode(&b).is_err());
    }

    /// A benchmark's sizes: the comma-separated list in `var`, else `default`.
    pub(crate) fn bench_sizes(var: &str, default: &str) -> Vec<usize> {
        std::env::var(var)
            .unwrap_or_else(|_| default.into())
            .split(',')
            .filter_map(|v| v.parse().ok())
            .collect()
    }

    /// Root and relay together: `n` ranks as threads, each with its own service, all join at
    /// once (services started first), dense against sparse; how long until the last rank has
    /// the table. A benchmark, run by hand:
    /// `OXCCL_RELAY_BENCH=256,512,1024,2048 cargo test --release -p oxccl --lib relay_throughput -- --include-ignored --nocapture`
    #[test]
    #[ignore]
    fn relay_throughput() {
        use std::sync::Barrier;
        let sizes = bench_sizes("OXCCL_RELAY_BENCH", "256,512,1024");
        println!("# ranks  mode    all have the table (ms)  depth  slowest rank's join (ms)");
        for n in sizes {
            for sparse_from in [0usize, 2] {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let root_addr = listener.local_addr().unwrap();
                let secret = [5u8; 32];
                let log = crate::log::Logger::new(&oxccl_core::config::Config::default(), None);
                root::spawn(listener, secret, log).unwrap();
                let (ready, go) = (Arc::new(Barrier::new(n + 1)), Arc::new(Barrier::new(n + 1)));
                let hs: Vec<_> = (0..n as u32)
                    .map(|r| {
                        let (ready, go) = (ready.clone(), go.clone());
                        std::thread::Builder::new()
                            .stack_size(512 << 10)
                            .spawn(move || {
                                let doorbell = Arc::new(crate::sys::fd::EventFd::new().unwrap());
                                let ctl = Arc::new(crate::transport::hostmem::Ctl::create(r).unwrap());
                                let log =
                                    crate::log::Logger::new(&oxccl_core::config::Config::default(), Some(r));
                                let ip = "127.0.0.1".parse().unwrap();
                                let svc = Service::start(ip, Rank(r), n, secret, doorbell, ctl, log).unwrap();
                                let me = info(r, svc.addr);
                                let w = Waiter::new(
                                    Rank(r),
                                    Some(Duration::from_secs(120)),
                                    Arc::new(AtomicBool::new(false)),
                                )
                                .watching(&svc.mailbox);
                                ready.wait();
                                let t = Instant::now();
                                let rv =
                                    Rendezvous { root: root_addr, secret: &secret, size: n, sparse_from };
                                let j = join(rv, &me, &svc.mailbox, &w, &log).unwrap();
                                let took = t.elapsed();
                                assert_eq!(j.peers.len(), n);
                                assert!(j.peers.iter().enumerate().all(|(i, p)| p.rank.idx() == i));
                                go.wait();
                                (took, svc, j.links)
                            })
                            .unwrap()
                    })
                    .collect();
                ready.wait();
                let t0 = Instant::now();
                go.wait();
                let all = t0.elapsed();
                let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
                let slowest = out.iter().map(|o| o.0).max().unwrap_or_default();
                if std::env::var_os("OXCCL_RELAY_LEVELS").is_some() && sparse_from != 0 {
                    let mut lv = vec![(0.0f64, 0usize); 32];
                    for (r, o) in out.iter().enumerate() {
                        let l = (usize::BITS - (r + 1).leading_zeros() - 1) as usize;
                        lv[l].0 += o.0.as_secs_f64() * 1e3;
                        lv[l].1 += 1;
                    }
                    let means: Vec<String> =
                        lv.iter().filter(|l| l.1 > 0).map(|l| format!("{:.1}", l.0 / l.1 as f64)).collect();
                    println!("# mean join (ms) by relay level: {}", means.join(" "));
                }
                let depth = usize::BITS - n.leading_zeros() - 1;
                println!(
                    "  {n:>6}  {:<6}  {:>23.1}  {:>5}  {:>24.1}",
                    if sparse_from == 0 { "dense" } else { "sparse" },
                    all.as_secs_f64() * 1e3,
                    if sparse_from == 0 { 0 } else { depth },
                    slowest.as_secs_f64() * 1e3
                );
            }
        }
    }
}
