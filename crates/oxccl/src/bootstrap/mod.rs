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

mod frame;
mod greet;
mod join;
pub mod root;
pub mod roots;
pub mod service;
mod wire;

use crate::error::{Error, RejectReason, Result};
use crate::wait::{Probed, Waiter, MAX_REST};
use oxccl_core::plan::ConnClass;
use oxccl_core::tuning::{CONNECT_RETRY_MS, MAX_BOOTSTRAP_FRAME_BYTES};
use oxccl_core::wire::{Reader, Writer};
use oxccl_core::{ChannelId, CoreError, Rank};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::wait::PeerState;
pub(crate) use frame::*;
pub(crate) use greet::{greeting, join_root, show_bytes};
pub use join::relay_links;
pub(crate) use join::*;
pub use service::{Incoming, Mailbox, Service, Word};
pub use wire::*;

/// Protocol version of every bootstrap message.
pub const PROTOCOL_VERSION: u32 = 12;

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
    /// Root `k > 0` → root 0: its share joined, or it failed ([`super::roots::Report`]).
    pub const ROOT_REPORT: u8 = 7;
    /// Root 0 → root `k > 0`: rank 0's sparse threshold and the whole table.
    pub const ROOT_TABLE: u8 = 8;
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

/// The largest probe answer (`STATE` frame) accepted: a peer state with a group's
/// [`MAX_REST`] later calls.
const MAX_STATE_FRAME: usize = 64 + 24 * MAX_REST;
/// How long a closing rank waits, over all its control connections together, for the peers
/// to close their ends after its goodbye.
pub const CLOSE_DRAIN_MS: u64 = 1000;

/// The most bytes of a failure's reason sent to peers.
pub const MAX_FAIL_REASON_BYTES: usize = 2048;

/// `reason`, cut to at most [`MAX_FAIL_REASON_BYTES`] on a character boundary.
pub(crate) fn bounded(reason: &str) -> &str {
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
    /// peers do not take this rank for gone). Each goodbye carries the messages this rank
    /// numbered for that peer (a receive from any rank there may still be due one of them,
    /// sent eagerly before this rank left); a peer it sent to without holding a control
    /// connection to it (a sparse communicator's) is connected to for its goodbye.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let progress = &self.mailbox.progress;
        for to in progress.sent_to_any() {
            if to != self.me && to.idx() < self.peers.len() && !out.contains_key(&to.0) {
                if let Ok(mut s) =
                    TcpStream::connect_timeout(&self.peers[to.idx()].addr, Duration::from_millis(200))
                {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
                    let hello = Hello { secret: self.secret, from: self.me, to, data: None };
                    if write_frame(&mut s, kind::HELLO, &hello.encode()).is_ok() {
                        out.insert(to.0, s);
                    }
                }
            }
        }
        for (to, s) in out.iter_mut() {
            let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = write_frame(s, kind::BYE, &progress.sent_to(Rank(*to)).to_le_bytes());
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
pub(crate) mod tests;

impl crate::wait::Ask for Bootstrap {
    fn size(&self) -> usize {
        self.peers.len()
    }
    fn probe(&self, peer: Rank, wait: Duration) -> Probed {
        Bootstrap::probe(self, peer, wait)
    }
    fn probe_all(&self, peers: &[Rank], until: Instant) -> Vec<Probed> {
        Bootstrap::probe_all(self, peers, until)
    }
}
