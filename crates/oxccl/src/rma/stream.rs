//! One-sided calls over a TCP stream: the wire format, the origin's writes, and the thread
//! of the target's communicator that applies them (the target makes no call for a put).
//!
//! One stream per (origin, target) pair, opened by the origin at its first message with a
//! `HELLO` of class `ConnClass::Rma` to the target's service (authenticated by the secret,
//! like every data connection), which files it for the target's RMA thread.
//!
//! Frames: a 32-byte header `["OXRM", kind u8, ctx u8, sig u8, 0, window u64, offset u64,
//! length u64]` (little-endian), then `length` bytes of data for a `PUT`. Kinds: `PUT`
//! (data, then one signal on (ctx, sig)) and `SIGNAL` (no data, no window).
//!
//! Rules:
//! 1. Frames of one stream are applied in order; each ends with its signal counted and
//!    `applied[origin]` bumped (the block's rules 1 and 3), so an origin whose `applied` count
//!    equals what it sent knows its stream has drained.
//! 2. The target checks every header against its own window table (the window is registered,
//!    host memory, and holds `offset + length` bytes) and writes the data straight into the
//!    window, re-checking under the table's lock for each piece: a window deregistered
//!    meanwhile is never written. A put that cannot be applied is read and dropped, its
//!    signal is not counted, and the reason is kept: the target's next wait fails with it.
//! 3. The thread never blocks on a peer: sockets are non-blocking, a round reads at most
//!    `ROUND_BYTES` from one stream before serving the others.

use super::block::Block;
use super::{LocalWin, CONTEXTS, SIGNALS};
use crate::bootstrap::service::Incoming;
use crate::bootstrap::{kind, write_frame_within, Hello, Mailbox, PeerInfo};
use crate::error::{Error, Result};
use crate::log::Logger;
use crate::sys::fd::{self, EventFd};
use crate::wait::Waiter;
use oxccl_core::plan::ConnClass;
use oxccl_core::Rank;
use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) const HDR: usize = 32;
const MAGIC: u32 = u32::from_le_bytes(*b"OXRM");
pub(crate) const PUT: u8 = 1;
pub(crate) const SIGNAL: u8 = 2;
/// The most one stream is read in one round before the others get their turn.
const ROUND_BYTES: usize = 8 << 20;

/// One frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: u8,
    pub ctx: u8,
    pub sig: u8,
    pub win: u64,
    pub off: u64,
    pub len: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind;
        b[5] = self.ctx;
        b[6] = self.sig;
        b[8..16].copy_from_slice(&self.win.to_le_bytes());
        b[16..24].copy_from_slice(&self.off.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HDR]) -> std::result::Result<Header, String> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if b[..4] != MAGIC.to_le_bytes() || b[7] != 0 {
            return Err(format!("not a one-sided frame header (starts {:02x?})", &b[..8]));
        }
        let h = Header { kind: b[4], ctx: b[5], sig: b[6], win: u64_at(8), off: u64_at(16), len: u64_at(24) };
        match h.kind {
            PUT => Ok(h),
            SIGNAL if h.len == 0 && h.win == 0 && h.off == 0 => Ok(h),
            k => Err(format!("frame kind {k} with window {} offset {} length {}", h.win, h.off, h.len)),
        }
    }
}

/// Opens the origin's stream to `peer` (its hello sent); non-blocking.
pub(crate) fn connect(me: Rank, peer: &PeerInfo, secret: [u8; 32], w: &Waiter) -> Result<TcpStream> {
    let what = "one-sided call: connecting to the target";
    let mut s = crate::bootstrap::connect_retry(peer.addr, w, what, &[peer.rank])?;
    let hello = Hello { secret, from: me, to: peer.rank, data: Some(ConnClass::Rma) };
    write_frame_within(&mut s, kind::HELLO, &hello.encode(), w, what, peer.rank)?;
    s.set_nonblocking(true).map_err(|e| Error::io(me, "one-sided stream", Some(peer.rank), e))?;
    Ok(s)
}

/// Writes one frame (header, then `data`) on the origin's non-blocking stream, honouring
/// the waiter (deadline, abort, gone peers) while the socket is full.
pub(crate) fn send(s: &TcpStream, h: &Header, data: &[u8], w: &Waiter, peer: Rank) -> Result<()> {
    let hdr = h.encode();
    let total = HDR + data.len();
    let mut sent = 0;
    let what = "one-sided call: sending to the target";
    while sent < total {
        let bufs: [&[u8]; 2] = if sent < HDR { [&hdr[sent..], data] } else { [&data[sent - HDR..], &[]] };
        match fd::send_vectored(s.as_raw_fd(), &bufs) {
            Ok(0) => {
                w.check(what, &[peer])?;
                let mut p = [fd::pollfd(s.as_raw_fd(), fd::POLLOUT)];
                let _ = fd::poll(&mut p, w.slice().max(Duration::from_millis(1)));
            }
            Ok(n) => sent += n,
            Err(e) => return Err(Error::io(w.rank, "one-sided call: sending to the target", Some(peer), e)),
        }
    }
    Ok(())
}

/// What the target's RMA thread shares with its communicator.
pub(crate) struct Served {
    pub me: Rank,
    pub block: Arc<Block>,
    pub local: Arc<Mutex<HashMap<u64, LocalWin>>>,
    /// The first put the thread could not apply, and why (rule 2).
    pub dropped: Arc<Mutex<Option<String>>>,
    pub mailbox: Arc<Mailbox>,
    pub log: Logger,
    pub stop: Arc<EventFd>,
    pub bell: Arc<EventFd>,
}

/// A frame being received.
struct Cur {
    h: Header,
    done: usize,
    /// `None` while the frame can be applied; else why it cannot.
    refused: Option<String>,
}

struct InConn {
    from: Rank,
    s: TcpStream,
    hdr: [u8; HDR],
    got: usize,
    cur: Option<Cur>,
}

/// Starts the thread that applies the frames of every stream to this rank.
pub(crate) fn spawn(sv: Served) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(format!("oxccl-rma-{}", sv.me)).spawn(move || serve(sv))
}

fn serve(sv: Served) {
    let mut conns: Vec<InConn> = Vec::new();
    let mut scratch = vec![0u8; 64 << 10];
    loop {
        for (from, inc) in sv.mailbox.take_conns(ConnClass::Rma) {
            match inc {
                Incoming::Tcp(s) if s.set_nonblocking(true).is_ok() => {
                    conns.push(InConn { from, s, hdr: [0; HDR], got: 0, cur: None })
                }
                _ => sv.log.warn(format_args!("one-sided: unusable connection from rank {from} dropped")),
            }
        }
        let mut pfds =
            vec![fd::pollfd(sv.stop.as_raw_fd(), fd::POLLIN), fd::pollfd(sv.bell.as_raw_fd(), fd::POLLIN)];
        pfds.extend(conns.iter().map(|c| fd::pollfd(c.s.as_raw_fd(), fd::POLLIN)));
        if fd::poll(&mut pfds, Duration::from_millis(500)).is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if pfds[0].revents != 0 {
            return;
        }
        if pfds[1].revents != 0 {
            sv.bell.drain();
        }
        let ready: Vec<bool> = pfds[2..].iter().map(|p| p.revents != 0).collect();
        let mut i = 0;
        conns.retain_mut(|c| {
            let keep = !ready[i] || step(&sv, c, &mut scratch);
            i += 1;
            keep
        });
    }
}

/// Reads what `c` has; returns false once the stream is over (or unusable).
fn step(sv: &Served, c: &mut InConn, scratch: &mut [u8]) -> bool {
    let fd = c.s.as_raw_fd();
    let from = c.from;
    let mut budget = ROUND_BYTES;
    loop {
        let Some(cur) = &mut c.cur else {
            match fd::recv_some(fd, &mut c.hdr[c.got..]) {
                Ok(None) => return true,
                Ok(Some(0)) => {
                    if c.got != 0 {
                        sv.log.warn(format_args!(
                            "one-sided: rank {from}'s stream ended inside a frame header"
                        ));
                    }
                    return false;
                }
                Ok(Some(n)) => c.got += n,
                Err(e) => {
                    sv.log.warn(format_args!("one-sided: rank {from}'s stream failed: {e}"));
                    return false;
                }
            }
            if c.got < HDR {
                continue;
            }
            c.got = 0;
            match Header::decode(&c.hdr) {
                Ok(h) => c.cur = Some(Cur { h, done: 0, refused: refusal(sv, from, &h) }),
                Err(why) => {
                    note(sv, format!("rank {from}'s one-sided stream carried a bad frame ({why}); the stream was closed"));
                    return false;
                }
            }
            continue;
        };
        let len = cur.h.len as usize;
        if cur.done < len {
            if budget == 0 {
                return true;
            }
            let want = (len - cur.done).min(budget);
            let r = match cur.refused {
                None => {
                    let g = sv.local.lock().unwrap_or_else(|e| e.into_inner());
                    match g.get(&cur.h.win) {
                        Some(w) => {
                            let at = w.base + cur.h.off as usize + cur.done;
                            // SAFETY: the header was checked against this window (registered,
                            // host memory, `off + len` within it) and the window is still
                            // registered: the table's lock, held across the write, keeps
                            // deregistration (which removes it under this lock) from returning
                            // meanwhile. The program leaves the range alone until a wait says
                            // the put landed (NCCL's rules), so this is its only writer now.
                            let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, want) };
                            fd::recv_some(fd, dst)
                        }
                        None => {
                            cur.refused = Some(format!(
                                "rank {from}'s put of {len} bytes into window #{} arrived while this rank deregistered the window: dropped",
                                cur.h.win
                            ));
                            continue;
                        }
                    }
                }
                Some(_) => {
                    let n = want.min(scratch.len());
                    fd::recv_some(fd, &mut scratch[..n])
                }
            };
            match r {
                Ok(None) => return true,
                Ok(Some(0)) => {
                    sv.log.warn(format_args!(
                        "one-sided: rank {from}'s stream ended inside a {len}-byte put ({} bytes arrived)",
                        cur.done
                    ));
                    return false;
                }
                Ok(Some(n)) => {
                    cur.done += n;
                    budget -= n;
                }
                Err(e) => {
                    sv.log.warn(format_args!("one-sided: rank {from}'s stream failed: {e}"));
                    return false;
                }
            }
            continue;
        }
        // The frame is complete: its signal, then the stream's progress (rule 1).
        let cur = c.cur.take().expect("a frame in progress");
        match cur.refused {
            None => sv.block.count(from, cur.h.ctx as usize, cur.h.sig as usize),
            Some(why) => note(sv, why),
        }
        sv.block.applied(from).fetch_add(1, std::sync::atomic::Ordering::Release);
        sv.block.wake_waiters();
    }
}

/// Why frame `h` from `from` cannot be applied here, if it cannot (rule 2).
fn refusal(sv: &Served, from: Rank, h: &Header) -> Option<String> {
    if h.ctx as usize >= CONTEXTS || h.sig as usize >= SIGNALS {
        return Some(format!(
            "rank {from} sent a signal on ctx {} sigIdx {}, outside this build's range",
            h.ctx, h.sig
        ));
    }
    if h.kind != PUT {
        return None;
    }
    let g = sv.local.lock().unwrap_or_else(|e| e.into_inner());
    let what = format!("rank {from}'s put of {} bytes at offset {} into window #{}", h.len, h.off, h.win);
    match g.get(&h.win) {
        None => Some(format!("{what}: this rank has no such window registered (deregistered?): dropped")),
        Some(w) if w.device => Some(format!("{what}: the window is device memory here: dropped")),
        Some(w) if h.off.checked_add(h.len).is_none_or(|end| end > w.len as u64) => {
            Some(format!("{what}: the window holds {} bytes here: dropped", w.len))
        }
        Some(_) => None,
    }
}

/// Keeps the first reason a frame was dropped and wakes the waits, which report it.
fn note(sv: &Served, why: String) {
    sv.log.warn(format_args!("one-sided: {why}"));
    let mut d = sv.dropped.lock().unwrap_or_else(|e| e.into_inner());
    if d.is_none() {
        *d = Some(why);
    }
    drop(d);
    sv.block.wake();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::Ordering;

    /// The target's side of one stream, fed frame by frame: a put lands in its window and
    /// counts, a put into a window this rank does not have (or past its end) is read, dropped
    /// and kept as the reason, and either way the stream's progress counts it (rule 1).
    #[test]
    fn frames_land_in_registered_windows_and_bad_ones_are_dropped_with_the_reason() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut origin = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let s = l.accept().unwrap().0;
        s.set_nonblocking(true).unwrap();
        let mut win = vec![0u8; 1000];
        let local = Arc::new(Mutex::new(HashMap::new()));
        local
            .lock()
            .unwrap()
            .insert(3, LocalWin { base: win.as_mut_ptr() as usize, len: win.len(), device: false });
        let sv = Served {
            me: Rank(0),
            block: Arc::new(Block::create(2).unwrap()),
            local,
            dropped: Arc::new(Mutex::new(None)),
            mailbox: Arc::new(Mailbox::default()),
            log: Logger::new(&oxccl_core::config::Config::default(), Some(0)),
            stop: Arc::new(EventFd::new().unwrap()),
            bell: Arc::new(EventFd::new().unwrap()),
        };
        let mut c = InConn { from: Rank(1), s, hdr: [0; HDR], got: 0, cur: None };
        let mut scratch = vec![0u8; 64];
        let mut feed = |h: Header, data: &[u8]| {
            origin.write_all(&h.encode()).unwrap();
            origin.write_all(data).unwrap();
            let before = sv.block.applied(Rank(1)).load(Ordering::Acquire);
            for _ in 0..1000 {
                assert!(step(&sv, &mut c, &mut scratch));
                if sv.block.applied(Rank(1)).load(Ordering::Acquire) > before {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("frame {h:?} never applied");
        };
        let data: Vec<u8> = (0..300).map(|i| i as u8).collect();
        feed(Header { kind: PUT, ctx: 1, sig: 2, win: 3, off: 700, len: 300 }, &data);
        assert_eq!(&win[700..], &data[..]);
        assert_eq!(sv.block.arrived(Rank(1), 1, 2).load(Ordering::Acquire), 1);
        assert!(sv.dropped.lock().unwrap().is_none());
        // Past the end, and into a window this rank does not have: read, dropped, not counted.
        feed(Header { kind: PUT, ctx: 1, sig: 2, win: 3, off: 800, len: 300 }, &data);
        let why = sv.dropped.lock().unwrap().take().expect("a reason");
        assert!(why.contains("holds 1000 bytes"), "{why}");
        feed(Header { kind: PUT, ctx: 0, sig: 0, win: 9, off: 0, len: 300 }, &data);
        let why = sv.dropped.lock().unwrap().take().expect("a reason");
        assert!(why.contains("no such window"), "{why}");
        assert_eq!(&win[700..], &data[..], "a dropped put wrote the window");
        assert_eq!(sv.block.arrived(Rank(1), 1, 2).load(Ordering::Acquire), 1);
        // A signal without data, then the stream ends at a frame boundary: over, quietly.
        feed(Header { kind: SIGNAL, ctx: 3, sig: 7, win: 0, off: 0, len: 0 }, &[]);
        assert_eq!(sv.block.arrived(Rank(1), 3, 7).load(Ordering::Acquire), 1);
        assert_eq!(sv.block.applied(Rank(1)).load(Ordering::Acquire), 4);
        drop(origin);
        let mut over = false;
        for _ in 0..1000 {
            if !step(&sv, &mut c, &mut scratch) {
                over = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(over && sv.dropped.lock().unwrap().is_none());
    }

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        let h = Header { kind: PUT, ctx: 3, sig: 7, win: 9, off: 1 << 40, len: 12345 };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let s = Header { kind: SIGNAL, ctx: 1, sig: 0, win: 0, off: 0, len: 0 };
        assert_eq!(Header::decode(&s.encode()), Ok(s));
        let mut bad = s.encode();
        bad[24] = 1; // a signal with data
        assert!(Header::decode(&bad).is_err());
        let mut bad = h.encode();
        bad[0] ^= 0xff;
        assert!(Header::decode(&bad).unwrap_err().contains("not a one-sided frame"));
        let mut bad = h.encode();
        bad[4] = 9;
        assert!(Header::decode(&bad).is_err());
    }
}
