//! TCP connections: between hosts, and between same-host peers when shared memory is off.
//!
//! The engine sees the same slot interface as shared memory: the sender fills a local staging
//! slot and commits it, the receiver reads a chunk from a local slot and releases it. Staged
//! chunks cross the socket as frames `[len: u32 LE][0: u32][len bytes]`, written and read
//! without blocking whenever the engine pumps the connection.
//!
//! Rules:
//! 1. A sender slot is free again only when its whole frame is in the kernel; an operation is
//!    complete only when every frame it committed is (`flushed`).
//! 2. The receiver reads one frame header, then exactly that frame's bytes into a free slot;
//!    it reads nothing while all its slots hold unreleased chunks (back-pressure through the
//!    socket). A frame longer than a slot is a protocol error, never an overflow.
//! 3. End of stream or a socket error while a chunk is expected is reported with the peer's
//!    rank.

use crate::bootstrap::{connect_retry, kind, write_frame, Hello, PeerInfo};
use crate::error::{Error, Result};
use crate::sys::fd;
use crate::wait::Waiter;
use oxccl_core::contract::SigWords;
use oxccl_core::plan::ConnClass;
use oxccl_core::Rank;
use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

/// A frame's header: `[len u32][0 u32][signature 3 × u64]` (the chunk's call signature).
const FRAME_HEADER: usize = 32;

fn staging(slots: usize, slot_bytes: usize) -> Vec<Box<[u8]>> {
    (0..slots).map(|_| vec![0u8; slot_bytes].into_boxed_slice()).collect()
}

/// Where a committed frame's payload is: a staging slot, or memory the engine guarantees
/// stays valid and unchanged until the connection is flushed (the job's user buffers).
#[derive(Clone, Copy, Debug)]
enum Payload {
    Slot(usize),
    External(*const u8),
}

// SAFETY: an external payload points into a job's buffers, which the engine keeps valid and
// unaliased by writers until every frame is flushed, on whatever thread runs the job.
unsafe impl Send for Payload {}

/// The sending end of a TCP connection.
pub struct TcpSend {
    s: TcpStream,
    fd: RawFd,
    me: Rank,
    peer: Rank,
    host: String,
    slots: Vec<Box<[u8]>>,
    /// Free staging slots, the most recently freed (warmest in cache) last.
    free: Vec<usize>,
    /// Committed frames not yet fully written: (payload, len).
    queue: VecDeque<(Payload, usize, SigWords)>,
    /// Bytes of the front frame (header included) already written.
    written: usize,
}

/// The rail a connection of `class` travels on, of `rails` (rings and trees spread channel by
/// channel, as NCCL spreads channels over NICs; everything else on rail 0).
pub fn rail_of(class: ConnClass, rails: usize) -> usize {
    let n = match class {
        ConnClass::Ring(c) => c.0 as usize,
        ConnClass::Tree(t) => t as usize,
        _ => 0,
    };
    n % rails.max(1)
}

/// Where a rank with `mine` rails reaches `peer` for a connection of `class`: the peer's
/// service port on the address of the connection's rail (of the rails both have), or its
/// service's address when either has fewer than two.
pub fn rail_addr(mine: usize, peer: &PeerInfo, class: ConnClass) -> std::net::SocketAddr {
    let n = mine.min(peer.rails.len());
    match peer.rails.get(rail_of(class, n)) {
        Some(ip) if n > 1 => std::net::SocketAddr::new(*ip, peer.addr.port()),
        _ => peer.addr,
    }
}

impl TcpSend {
    /// Connects to `peer`'s service and announces a data connection of `class`; the stream
    /// carries frames both ways (each end wraps it in a [`TcpSend`] and a [`TcpRecv`]), so
    /// each direction's acknowledgements ride on the other's data.
    pub(crate) fn connect_stream(
        me: Rank,
        secret: &[u8; 32],
        peer: &PeerInfo,
        class: ConnClass,
        my_rails: usize,
        w: &Waiter,
    ) -> Result<TcpStream> {
        let mut s = connect_retry(
            rail_addr(my_rails, peer, class),
            w,
            "connection setup: TCP connect",
            &[peer.rank],
        )?;
        let hello = Hello { secret: *secret, from: me, to: peer.rank, data: Some(class) };
        write_frame(&mut s, kind::HELLO, &hello.encode())
            .map_err(|e| Error::io(me, "TCP connection hello", Some(peer.rank), e))?;
        Ok(s)
    }

    /// The sending end over an established data stream.
    pub(crate) fn over(
        me: Rank,
        peer: &PeerInfo,
        s: TcpStream,
        slots: usize,
        slot_bytes: usize,
    ) -> Result<TcpSend> {
        s.set_nonblocking(true).map_err(|e| Error::io(me, "TCP connection setup", Some(peer.rank), e))?;
        let _ = s.set_nodelay(true);
        Ok(TcpSend {
            fd: s.as_raw_fd(),
            s,
            me,
            peer: peer.rank,
            host: peer.hostname.clone(),
            slots: staging(slots, slot_bytes),
            free: (0..slots).rev().collect(),
            queue: VecDeque::new(),
            written: 0,
        })
    }

    /// Whether a frame can be queued (a staging slot is free; external frames take one too,
    /// which bounds how far a sender runs ahead of its socket).
    #[inline]
    pub fn ready(&mut self) -> bool {
        self.queue.len() < self.slots.len() && !self.free.is_empty()
    }

    /// The free slot and its capacity.
    #[inline]
    pub fn slot(&mut self) -> (*mut u8, usize) {
        match self.free.last() {
            Some(&i) => (self.slots[i].as_mut_ptr(), self.slots[i].len()),
            None => (std::ptr::null_mut(), 0),
        }
    }

    /// Queues the slot's `len` bytes and starts writing them.
    pub fn commit(&mut self, len: usize, sig: &SigWords) -> Result<()> {
        let i = self.free.pop().ok_or_else(|| Error::Internal("TCP commit without a free slot".into()))?;
        self.queue.push_back((Payload::Slot(i), len, *sig));
        self.pump()?;
        Ok(())
    }

    /// Queues `len` bytes at `ptr`, sent from where they are (no staging copy).
    ///
    /// # Safety
    /// `ptr` must stay valid for `len` reads, and unchanged, until [`flushed`](Self::flushed).
    pub unsafe fn commit_external(&mut self, ptr: *const u8, len: usize, sig: &SigWords) -> Result<()> {
        self.queue.push_back((Payload::External(ptr), len, *sig));
        self.pump()?;
        Ok(())
    }

    /// Writes what the socket takes; returns whether anything was written.
    pub fn pump(&mut self) -> Result<bool> {
        let mut progressed = false;
        while let Some(&(pl, len, sig)) = self.queue.front() {
            let hdr = frame_header(len, &sig);
            let total = FRAME_HEADER + len;
            let payload: &[u8] = match pl {
                Payload::Slot(i) => &self.slots[i][..len],
                // SAFETY: commit_external's contract: valid and unchanged until flushed.
                Payload::External(p) => unsafe { std::slice::from_raw_parts(p, len) },
            };
            let n = if self.written < FRAME_HEADER {
                fd::send_vectored(self.fd, &[&hdr[self.written..], payload])
            } else {
                fd::send_vectored(self.fd, &[&payload[self.written - FRAME_HEADER..]])
            }
            .map_err(|e| stream_error(self.me, "TCP send", self.peer, &self.host, e))?;
            if n == 0 {
                break;
            }
            progressed = true;
            self.written += n;
            if self.written == total {
                if let Some((Payload::Slot(i), _, _)) = self.queue.pop_front() {
                    self.free.push(i);
                }
                self.written = 0;
            }
        }
        Ok(progressed)
    }

    /// Whether a queued frame sent from user memory overlaps `ptr..ptr + len`.
    pub fn reads_external(&self, ptr: *const u8, len: usize) -> bool {
        let (a0, a1) = (ptr as usize, ptr as usize + len);
        self.queue.iter().any(|&(pl, n, _)| match pl {
            Payload::External(p) => (p as usize) < a1 && a0 < p as usize + n,
            Payload::Slot(_) => false,
        })
    }

    /// Whether every committed frame is in the kernel.
    pub fn flushed(&self) -> bool {
        self.queue.is_empty()
    }

    /// The socket to poll for writability while frames are pending.
    pub fn poll_fd(&self) -> RawFd {
        self.fd
    }

    pub fn peer(&self) -> Rank {
        self.peer
    }

    /// A handle that can shut the socket down from another thread.
    pub fn shutdown_handle(&self) -> Option<TcpStream> {
        self.s.try_clone().ok()
    }
}

/// Frames up to this many bytes are read through the connection's receive buffer (header and
/// payload in one system call, several frames per call); larger payloads go straight from the
/// socket into their slot.
const SMALL_FRAME: usize = 16 << 10;
const RX_BYTES: usize = 64 << 10;

fn frame_header(len: usize, sig: &SigWords) -> [u8; FRAME_HEADER] {
    let mut h = [0u8; FRAME_HEADER];
    h[..4].copy_from_slice(&(len as u32).to_le_bytes());
    for (i, w) in sig.iter().enumerate() {
        h[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    h
}

fn header_sig(h: &[u8]) -> SigWords {
    let w = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[8 + 8 * i..16 + 8 * i]);
        u64::from_le_bytes(b)
    };
    [w(0), w(1), w(2)]
}

/// A posted receive: where the next frame's payload may go, its length, and the signature the
/// step expects (a frame of another call is never written there).
pub type Post = (*mut u8, usize, SigWords);

/// An error on a data stream. A reset, a broken pipe or an aborted connection means the
/// peer's end is gone (its process died or its host dropped the connection): that is
/// reported as the peer closing, naming it, like an end of stream, rather than as a bare
/// I/O error; anything else stays an I/O error.
fn stream_error(me: Rank, op: &'static str, peer: Rank, host: &str, e: std::io::Error) -> Error {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted => {
            Error::PeerClosed { rank: me, op: format!("{op} ({e})"), peer, host: host.to_string() }
        }
        _ => Error::io(me, op, Some(peer), e),
    }
}

/// The receiving end of a TCP connection.
pub struct TcpRecv {
    s: TcpStream,
    fd: RawFd,
    me: Rank,
    peer: Rank,
    host: String,
    slots: Vec<Box<[u8]>>,
    /// Free slots, the most recently released (warmest in cache) last.
    free: Vec<usize>,
    /// Received chunks not yet released, in arrival order: (where, len, signature).
    ready: VecDeque<(Dest, usize, SigWords)>,
    /// Bytes read from the socket and not yet parsed: `rx[rx_start..rx_end]`.
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    /// A large payload being read straight into its destination: (where, len, bytes so far,
    /// signature).
    direct: Option<(Dest, usize, usize, SigWords)>,
    /// The peer closed its end.
    eof: bool,
    /// The last read took less than it asked for (the socket had nothing more).
    drained: bool,
    /// A job ended while a frame was going to its posted memory: the stream is unusable.
    broken: bool,
}

/// Where a received frame's payload goes: a staging slot, or memory a step posted for it.
#[derive(Clone, Copy, Debug)]
enum Dest {
    Slot(usize),
    User(*mut u8),
}

// SAFETY: a posted destination is job memory that pump_posted's caller keeps valid and
// exclusive while the frame is read, on whatever thread runs the job.
unsafe impl Send for Dest {}

impl TcpRecv {
    /// The receiving end over an established data stream (either end's).
    pub(crate) fn accept(
        me: Rank,
        peer: &PeerInfo,
        s: TcpStream,
        slots: usize,
        slot_bytes: usize,
    ) -> Result<TcpRecv> {
        s.set_nonblocking(true).map_err(|e| Error::io(me, "TCP connection setup", Some(peer.rank), e))?;
        let _ = s.set_nodelay(true);
        Ok(TcpRecv {
            fd: s.as_raw_fd(),
            s,
            me,
            peer: peer.rank,
            host: peer.hostname.clone(),
            slots: staging(slots, slot_bytes),
            free: (0..slots).rev().collect(),
            ready: VecDeque::new(),
            rx: vec![0u8; RX_BYTES].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            direct: None,
            eof: false,
            drained: false,
            broken: false,
        })
    }

    fn closed(&self) -> Error {
        Error::PeerClosed {
            rank: self.me,
            op: "TCP receive".into(),
            peer: self.peer,
            host: self.host.clone(),
        }
    }

    fn recv_into(&mut self, which: Option<(Dest, usize, usize)>) -> Result<Option<usize>> {
        let (fd, me, peer) = (self.fd, self.me, self.peer);
        let buf: &mut [u8] = match which {
            Some((d, from, to)) => self.dest_mut(d, from, to),
            None => &mut self.rx[self.rx_end..],
        };
        let asked = buf.len();
        let r = match fd::recv_some(fd, buf) {
            // A reset comes after every byte that arrived before it: like an end of stream,
            // it fails a wait only once what came before is used up.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                self.eof = true;
                return Ok(None);
            }
            r => r.map_err(|e| stream_error(me, "TCP receive", peer, &self.host, e))?,
        };
        // A short read (or none) drained the socket: reading again before it polls readable
        // would only cost a system call that fails.
        self.drained = r.is_none_or(|n| n < asked);
        if r == Some(0) {
            self.eof = true;
            return Ok(None);
        }
        Ok(r)
    }

    /// Reads what has arrived into free slots; returns whether anything was read.
    pub fn pump(&mut self) -> Result<bool> {
        self.pump_with(true, None)
    }

    /// Like [`pump`](Self::pump), with a posted receive: if the next frame to be consumed is
    /// large and exactly `post.1` bytes, its payload goes straight to `post.0` instead of a
    /// slot, and the chunk is reported there.
    ///
    /// # Safety
    /// `post.0` must be valid for `post.1` byte writes, written by no one else, until the
    /// chunk is released or the job that posted it ends ([`abandon_posted`](Self::abandon_posted)
    /// on an early end).
    pub unsafe fn pump_posted(&mut self, post: Option<Post>) -> Result<bool> {
        self.pump_with(true, post)
    }

    /// Moves frames already in the receive buffer into free slots, without system calls.
    pub fn pump_buffered(&mut self) -> Result<bool> {
        self.pump_with(false, None)
    }

    /// Whether the receive buffer holds a frame header (so a slot released since the last
    /// pump may take a frame without reading the socket).
    pub fn has_buffered(&self) -> bool {
        self.direct.is_none() && self.rx_end - self.rx_start >= FRAME_HEADER && !self.free.is_empty()
    }

    /// Whether a posted receive would be used now: nothing is waiting or being read, so the
    /// next frame is the next chunk consumed.
    pub fn accepts_post(&self) -> bool {
        self.ready.is_empty() && self.direct.is_none() && !self.eof
    }

    /// Ends a job early: a frame being read into posted memory can no longer be completed
    /// safely, so the connection is marked broken (its stream position is lost).
    pub fn abandon_posted(&mut self) {
        let posted = |d: &Dest| matches!(d, Dest::User(_));
        if self.direct.as_ref().is_some_and(|(d, ..)| posted(d)) || self.ready.iter().any(|(d, ..)| posted(d))
        {
            self.direct = None;
            self.ready.retain(|(d, ..)| !posted(d));
            self.broken = true;
        }
    }

    fn pump_with(&mut self, read: bool, mut post: Option<Post>) -> Result<bool> {
        let mut progressed = false;
        self.drained = false;
        while !self.eof && !self.broken {
            if let Some((d, len, got, sig)) = self.direct {
                if !read || self.drained {
                    break;
                }
                match self.recv_into(Some((d, got, len)))? {
                    None => break,
                    Some(n) => {
                        progressed = true;
                        if got + n == len {
                            self.direct = None;
                            self.ready.push_back((d, len, sig));
                        } else {
                            self.direct = Some((d, len, got + n, sig));
                        }
                    }
                }
                continue;
            }
            let usable_post = post.filter(|_| self.ready.is_empty());
            if self.free.is_empty() && usable_post.is_none() {
                break;
            }
            let have = self.rx_end - self.rx_start;
            if have >= FRAME_HEADER {
                let h = &self.rx[self.rx_start..self.rx_start + 4];
                let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
                let sig = header_sig(&self.rx[self.rx_start..self.rx_start + FRAME_HEADER]);
                let cap = self.slots[0].len();
                if len > cap {
                    return Err(Error::InvalidUsage(format!(
                        "rank {}: rank {} sent a {len}-byte frame, larger than the {cap}-byte slot (different NCCL_BUFFSIZE?)",
                        self.me, self.peer
                    )));
                }
                let avail = have - FRAME_HEADER;
                let body = self.rx_start + FRAME_HEADER;
                let dest = match usable_post {
                    Some((p, n, want)) if n == len && len > SMALL_FRAME && want == sig => Some(Dest::User(p)),
                    _ => self.free.last().map(|&i| Dest::Slot(i)),
                };
                if let (Some(d), true) = (dest, avail >= len || len > SMALL_FRAME) {
                    // The whole frame, or the start of a large one, is buffered: move it to
                    // its destination and read the rest of a large one straight there.
                    let take = avail.min(len);
                    let from = &self.rx[body..body + take];
                    match d {
                        Dest::Slot(i) => self.slots[i][..take].copy_from_slice(from),
                        // SAFETY: pump_posted's contract (valid, exclusive, ≥ len ≥ take bytes);
                        // the receive buffer is ours, so the ranges are disjoint.
                        Dest::User(p) => unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), p, take) },
                    }
                    self.rx_start = body + take;
                    match d {
                        Dest::Slot(_) => {
                            self.free.pop();
                        }
                        Dest::User(_) => post = None,
                    }
                    progressed = true;
                    if take == len {
                        self.ready.push_back((d, len, sig));
                    } else {
                        self.direct = Some((d, len, take, sig));
                    }
                    continue;
                }
                if dest.is_none() {
                    break;
                }
            }
            // More bytes needed in the receive buffer: compact it, then read.
            if !read || self.drained {
                break;
            }
            if self.rx_start > 0 {
                self.rx.copy_within(self.rx_start..self.rx_end, 0);
                self.rx_end -= self.rx_start;
                self.rx_start = 0;
            }
            match self.recv_into(None)? {
                None => break,
                Some(n) => {
                    self.rx_end += n;
                    progressed = true;
                }
            }
        }
        Ok(progressed)
    }

    /// Bytes `from..to` of a destination.
    fn dest_mut(&mut self, d: Dest, from: usize, to: usize) -> &mut [u8] {
        match d {
            Dest::Slot(i) => &mut self.slots[i][from..to],
            // SAFETY: pump_posted's contract: the posted memory is valid, exclusive and at
            // least the frame's length (the post's length equals it).
            Dest::User(p) => unsafe { std::slice::from_raw_parts_mut(p.add(from), to - from) },
        }
    }

    /// Whether a chunk is waiting. Reads nothing: the engine pumps connections whose sockets
    /// poll readable, so a waiting step costs no system call on a socket another core is
    /// writing into.
    #[inline]
    pub fn ready(&mut self) -> Result<bool> {
        if self.ready.is_empty() && (self.eof || self.broken) {
            return Err(self.closed());
        }
        Ok(!self.ready.is_empty())
    }

    /// The waiting chunk.
    #[inline]
    pub fn chunk(&self) -> (*const u8, usize) {
        match self.ready.front() {
            Some(&(Dest::Slot(i), len, _)) => (self.slots[i].as_ptr(), len),
            Some(&(Dest::User(p), len, _)) => (p as *const u8, len),
            None => (std::ptr::null(), 0),
        }
    }

    /// The waiting chunk's signature.
    #[inline]
    pub fn sig(&self) -> SigWords {
        self.ready.front().map_or([0; 3], |c| c.2)
    }

    /// Frees the chunk's slot.
    #[inline]
    pub fn release(&mut self) {
        if let Some((Dest::Slot(i), ..)) = self.ready.pop_front() {
            self.free.push(i);
        }
    }

    /// Whether the socket should be polled for readability (a frame is being read, a slot
    /// is free, or a posted receive would take the next frame).
    pub fn wants_data(&self, posted: bool) -> bool {
        (self.direct.is_some() || !self.free.is_empty() || (posted && self.ready.is_empty()))
            && !self.eof
            && !self.broken
    }

    pub fn poll_fd(&self) -> RawFd {
        self.fd
    }

    pub fn peer(&self) -> Rank {
        self.peer
    }

    /// A handle that can shut the socket down from another thread.
    pub fn shutdown_handle(&self) -> Option<TcpStream> {
        self.s.try_clone().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair(slot_bytes: usize) -> (TcpStream, TcpRecv) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        let peer = PeerInfo {
            rank: Rank(1),
            pid: 0,
            host_id: 0,
            hostname: "peer".into(),
            addr: l.local_addr().unwrap(),
            unix_name: [0; 16],
            costs: Default::default(),
            cuda_device: -1,
            rails: Vec::new(),
            machine: 0,
            nic_gbs: 0.0,
        };
        (tx, TcpRecv::accept(Rank(0), &peer, rx, 2, slot_bytes).unwrap())
    }

    fn frame(tx: &mut TcpStream, payload: &[u8]) {
        let mut hdr = [0u8; FRAME_HEADER];
        hdr[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        tx.write_all(&hdr).unwrap();
        tx.write_all(payload).unwrap();
    }

    /// Pumps until `n` chunks are waiting (the socket is non-blocking on this side).
    fn wait_ready(r: &mut TcpRecv, post: Option<Post>, n: usize) {
        let t = std::time::Instant::now();
        while r.ready.len() < n {
            // SAFETY: the tests' posted buffers outlive the pumping and nothing else writes them.
            unsafe { r.pump_posted(post).unwrap() };
            assert!(t.elapsed().as_secs() < 10, "frames never arrived");
        }
    }

    #[test]
    fn posted_receive_lands_in_place_and_others_use_slots() {
        let big = SMALL_FRAME * 3 + 5;
        let (mut tx, mut r) = pair(big + 64);
        let a: Vec<u8> = (0..big).map(|i| (i * 7 + 1) as u8).collect();
        let b: Vec<u8> = (0..big).map(|i| (i * 13 + 2) as u8).collect();
        frame(&mut tx, &a);
        frame(&mut tx, &b);
        frame(&mut tx, &[9, 8, 7]);
        let mut dst = vec![0u8; big];
        let post = Some((dst.as_mut_ptr(), big, [0; 3]));
        assert!(r.accepts_post());
        wait_ready(&mut r, post, 1);
        // The first frame went to the posted memory; the chunk points there.
        assert_eq!(r.chunk(), (dst.as_ptr(), big));
        assert!(!r.accepts_post(), "a chunk is waiting: the next frame is not the next consumed");
        wait_ready(&mut r, post, 3);
        assert_eq!(dst, a);
        r.release();
        // The others went to slots, untouched by the (stale) post.
        let (p, n) = r.chunk();
        assert_ne!(p, dst.as_ptr());
        // SAFETY: the waiting chunk's slot is valid for its length until released.
        assert_eq!(unsafe { std::slice::from_raw_parts(p, n) }, &b[..]);
        r.release();
        // SAFETY: as above.
        assert_eq!(unsafe { std::slice::from_raw_parts(r.chunk().0, r.chunk().1) }, &[9, 8, 7]);
        r.release();
        assert_eq!(r.free.len(), 2, "both slots are free again");
    }

    #[test]
    fn a_post_of_another_length_is_ignored() {
        let big = SMALL_FRAME * 2;
        let (mut tx, mut r) = pair(big);
        let a = vec![5u8; big];
        frame(&mut tx, &a);
        let mut dst = vec![0u8; big - 8];
        wait_ready(&mut r, Some((dst.as_mut_ptr(), big - 8, [0; 3])), 1);
        assert_ne!(r.chunk().0, dst.as_ptr());
        assert!(dst.iter().all(|&x| x == 0));
    }

    #[test]
    fn abandoning_a_posted_frame_breaks_the_connection() {
        let big = SMALL_FRAME * 8;
        let (mut tx, mut r) = pair(big);
        // Half a frame: the posted read stays in progress.
        let mut hdr = [0u8; FRAME_HEADER];
        hdr[..4].copy_from_slice(&(big as u32).to_le_bytes());
        tx.write_all(&hdr).unwrap();
        tx.write_all(&vec![1u8; big / 2]).unwrap();
        let mut dst = vec![0u8; big];
        let t = std::time::Instant::now();
        while r.direct.is_none_or(|(_, _, got, _)| got < big / 2) {
            // SAFETY: dst outlives the pumping.
            unsafe { r.pump_posted(Some((dst.as_mut_ptr(), big, [0; 3]))).unwrap() };
            assert!(t.elapsed().as_secs() < 10);
        }
        r.abandon_posted();
        assert!(r.ready().is_err(), "a connection that lost its place in the stream must fail");
        tx.write_all(&vec![2u8; big / 2]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        r.pump().unwrap();
        assert!(dst[big / 2..].iter().all(|&x| x == 0), "nothing more may be written to the old post");
    }
    /// A peer whose process died resets the connection: sending to it then fails with a
    /// reset or broken pipe, which must name the peer as gone, as an end of stream does.
    #[test]
    fn a_reset_connection_names_the_peer_as_closed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = PeerInfo {
            rank: Rank(3),
            pid: 0,
            host_id: 0,
            hostname: "far".into(),
            addr: l.local_addr().unwrap(),
            unix_name: [0; 16],
            costs: Default::default(),
            cuda_device: -1,
            rails: Vec::new(),
            machine: 0,
            nic_gbs: 0.0,
        };
        let tx = TcpStream::connect(peer.addr).unwrap();
        let (rx, _) = l.accept().unwrap();
        let mut s = TcpSend::over(Rank(0), &peer, tx, 2, 1 << 16).unwrap();
        // Unread data plus a zero linger: closing sends a reset, as a killed process's does.
        let mut w = rx.try_clone().unwrap();
        w.write_all(&[1]).unwrap();
        crate::sys::fd::reset_on_close(rx.as_raw_fd()).unwrap();
        drop((rx, w));
        let t = std::time::Instant::now();
        let err = loop {
            if s.ready() {
                let (_, cap) = s.slot();
                if let Err(e) = s.commit(cap, &[0; 3]) {
                    break e;
                }
            } else if let Err(e) = s.pump() {
                break e;
            }
            assert!(t.elapsed().as_secs() < 10, "sending to a reset connection never failed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        match &err {
            Error::PeerClosed { rank, peer, host, .. } => {
                assert_eq!((*rank, *peer, host.as_str()), (Rank(0), Rank(3), "far"), "{err}");
            }
            other => panic!("expected the peer named as closed, got {other}"),
        }
        assert!(err.to_string().contains("peer rank 3 (host far) closed"), "{err}");
    }
}
