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
//! 3. The Unix socket takes same-host requests (shared-memory offers, control-block
//!    exchanges, allocation lookups: `transport::host`): the service reads one message and its
//!    descriptors and hands them to the [`HostDesk`] the layer above gave it at start, which
//!    answers and files what they bring; the service knows none of their formats.
//! 4. The thread never blocks on a peer: sockets are non-blocking and reads take only the
//!    bytes of the frame in progress.

use super::{kind, Hello, Waiter};
use crate::error::{Error, Result};
use crate::log::Logger;
use crate::sys::fd::{self, EventFd};
use crate::sys::unix::{SeqListener, SeqSocket};
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

mod mailbox;
pub use mailbox::*;

const MAX_HELLO_BYTES: usize = 1024;

/// Compares secrets in time independent of where they differ.
pub(crate) fn same_secret(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Identity and state the service thread needs.
struct Ctx {
    me: Rank,
    size: usize,
    secret: [u8; 32],
    doorbell: Arc<EventFd>,
    host: Arc<dyn HostDesk>,
    mailbox: Arc<Mailbox>,
    log: Logger,
}

/// What the service does with a same-host peer's message on the Unix socket. The layer above
/// (`transport::host`) reads it; the service only carries its bytes and descriptors (rule 3).
pub(crate) trait HostDesk: Send + Sync {
    /// `msg`, with `fds` beside it, arrived on `v.sock`: answer on it, file what it brings in
    /// `v.mailbox`. Whether the message was taken (else it was refused).
    fn answer(&self, v: &Visit<'_>, msg: &[u8], fds: Vec<OwnedFd>) -> bool;
}

/// What a [`HostDesk`] sees of the service for one message.
pub(crate) struct Visit<'a> {
    pub sock: &'a SeqSocket,
    pub mailbox: &'a Mailbox,
    pub secret: &'a [u8; 32],
    pub me: Rank,
    pub size: usize,
    /// This rank's doorbell, which an answer may hand the peer.
    pub doorbell: std::os::fd::RawFd,
    pub log: &'a Logger,
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
    /// Binds the rank's listeners on `ip` (on every address, at `ip`'s port as the rank
    /// advertises it, when it has several `rails`: peers reach it on each) and starts its
    /// thread.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        ip: IpAddr,
        rails: &[IpAddr],
        me: Rank,
        size: usize,
        secret: [u8; 32],
        doorbell: Arc<EventFd>,
        host: Arc<dyn HostDesk>,
        log: Logger,
    ) -> Result<Service> {
        let bind = match (rails.len() > 1, ip) {
            (true, IpAddr::V4(_)) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            (true, IpAddr::V6(_)) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            (false, ip) => ip,
        };
        let tcp = TcpListener::bind(SocketAddr::new(bind, 0))
            .map_err(|e| Error::io(me, "bind the service listener", None, e))?;
        // Every peer may connect at once (a dense bootstrap, a flood of departure news).
        crate::sys::fd::widen_backlog(tcp.as_raw_fd())
            .map_err(|e| Error::io(me, "service listener backlog", None, e))?;
        tcp.set_nonblocking(true).map_err(|e| Error::io(me, "service listener", None, e))?;
        let port = tcp.local_addr().map_err(|e| Error::io(me, "service listener", None, e))?.port();
        let addr = SocketAddr::new(ip, port);
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
        let ctx = Ctx { me, size, secret, doorbell, host, mailbox: mailbox.clone(), log };
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
            fd::pollfd(stop.as_raw_fd(), fd::POLLIN),
            fd::pollfd(tcp.as_raw_fd(), fd::POLLIN),
            fd::pollfd(unix.as_raw_fd(), fd::POLLIN),
        ];
        pfds.extend(conns.iter().map(|c| fd::pollfd(c.s.as_raw_fd(), fd::POLLIN)));
        pfds.extend(unix_pending.iter().map(|(s, _)| fd::pollfd(s.as_raw_fd(), fd::POLLIN)));
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
            (ConnState::Msgs { from, .. }, (kind::BYE, payload)) => {
                // The messages it numbered for this rank, in all (see Bootstrap::close).
                let sent =
                    u64::from_le_bytes(payload.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
                ctx.mailbox.mark_left(*from, sent);
                c.state = ConnState::Msgs { from: *from, bye: true };
            }
            (ConnState::Msgs { from, .. }, (kind::PROBE, payload)) => {
                // Answered on the same connection; a probe that finds the socket full gets no
                // answer (the prober gives up after its timeout).
                let nonce =
                    u64::from_le_bytes(payload.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
                let answer = ctx.mailbox.progress.snapshot_for(*from).encode(nonce);
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
    let (n, fds) = match s.recv(&mut buf) {
        Ok(Some(m)) => m,
        Ok(None) => return Step::Keep,
        Err(e) => {
            ctx.log.warn(format_args!("service: bad unix socket message: {e}"));
            return Step::Drop;
        }
    };
    let v = Visit {
        sock: s,
        mailbox: &ctx.mailbox,
        secret: &ctx.secret,
        me: ctx.me,
        size: ctx.size,
        doorbell: ctx.doorbell.as_raw_fd(),
        log: &ctx.log,
    };
    if ctx.host.answer(&v, &buf[..n], fds) {
        Step::Handed
    } else {
        Step::Drop
    }
}

#[cfg(test)]
mod tests;
