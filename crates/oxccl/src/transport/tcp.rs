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

use crate::bootstrap::{connect_retry, kind, write_frame, Hello, PeerInfo, Waiter};
use crate::error::{Error, Result};
use crate::sys::fd;
use oxccl_core::plan::ConnClass;
use oxccl_core::Rank;
use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

const FRAME_HEADER: usize = 8;

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
    slots: Vec<Box<[u8]>>,
    /// Committed frames not yet fully written: (payload, len).
    queue: VecDeque<(Payload, usize)>,
    head: u64,
    /// Bytes of the front frame (header included) already written.
    written: usize,
}

impl TcpSend {
    /// Connects to `peer`'s service and announces a data connection of `class`.
    pub(crate) fn connect(
        me: Rank,
        secret: &[u8; 32],
        peer: &PeerInfo,
        class: ConnClass,
        slots: usize,
        slot_bytes: usize,
        w: &Waiter,
    ) -> Result<TcpSend> {
        let mut s = connect_retry(peer.addr, w, "connection setup: TCP connect", &[peer.rank])?;
        let hello = Hello { secret: *secret, from: me, to: peer.rank, data: Some(class) };
        write_frame(&mut s, kind::HELLO, &hello.encode())
            .map_err(|e| Error::io(me, "TCP connection hello", Some(peer.rank), e))?;
        s.set_nonblocking(true).map_err(|e| Error::io(me, "TCP connection setup", Some(peer.rank), e))?;
        let _ = s.set_nodelay(true);
        Ok(TcpSend {
            fd: s.as_raw_fd(),
            s,
            me,
            peer: peer.rank,
            slots: staging(slots, slot_bytes),
            queue: VecDeque::new(),
            head: 0,
            written: 0,
        })
    }

    /// Whether a staging slot is free.
    #[inline]
    pub fn ready(&mut self) -> bool {
        self.queue.len() < self.slots.len()
    }

    /// The free slot and its capacity.
    #[inline]
    pub fn slot(&mut self) -> (*mut u8, usize) {
        let i = (self.head % self.slots.len() as u64) as usize;
        let s = &mut self.slots[i];
        (s.as_mut_ptr(), s.len())
    }

    /// Queues the slot's `len` bytes and starts writing them.
    pub fn commit(&mut self, len: usize) -> Result<()> {
        let i = (self.head % self.slots.len() as u64) as usize;
        self.queue.push_back((Payload::Slot(i), len));
        self.head += 1;
        self.pump()?;
        Ok(())
    }

    /// Queues `len` bytes at `ptr`, sent from where they are (no staging copy).
    ///
    /// # Safety
    /// `ptr` must stay valid for `len` reads, and unchanged, until [`flushed`](Self::flushed).
    pub unsafe fn commit_external(&mut self, ptr: *const u8, len: usize) -> Result<()> {
        self.queue.push_back((Payload::External(ptr), len));
        self.pump()?;
        Ok(())
    }

    /// Writes what the socket takes; returns whether anything was written.
    pub fn pump(&mut self) -> Result<bool> {
        let mut progressed = false;
        while let Some(&(pl, len)) = self.queue.front() {
            let mut hdr = [0u8; FRAME_HEADER];
            hdr[..4].copy_from_slice(&(len as u32).to_le_bytes());
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
            .map_err(|e| Error::io(self.me, "TCP send", Some(self.peer), e))?;
            if n == 0 {
                break;
            }
            progressed = true;
            self.written += n;
            if self.written == total {
                self.queue.pop_front();
                self.written = 0;
            }
        }
        Ok(progressed)
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

/// The receiving end of a TCP connection.
pub struct TcpRecv {
    s: TcpStream,
    fd: RawFd,
    me: Rank,
    peer: Rank,
    host: String,
    slots: Vec<Box<[u8]>>,
    /// Received chunks not yet released: (slot, len).
    ready: VecDeque<(usize, usize)>,
    /// Chunks received so far (the next one fills slot `filled % slots`).
    filled: u64,
    /// Bytes read from the socket and not yet parsed: `rx[rx_start..rx_end]`.
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    /// A large payload being read straight into its slot: (len, bytes so far).
    direct: Option<(usize, usize)>,
    /// The peer closed its end.
    eof: bool,
}

impl TcpRecv {
    /// Wraps a data connection the service accepted from `peer`.
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
            ready: VecDeque::new(),
            filled: 0,
            rx: vec![0u8; RX_BYTES].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            direct: None,
            eof: false,
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

    fn recv_into(&mut self, which: Option<(usize, usize, usize)>) -> Result<Option<usize>> {
        let buf: &mut [u8] = match which {
            Some((slot, from, to)) => &mut self.slots[slot][from..to],
            None => &mut self.rx[self.rx_end..],
        };
        let r =
            fd::recv_some(self.fd, buf).map_err(|e| Error::io(self.me, "TCP receive", Some(self.peer), e))?;
        if r == Some(0) {
            self.eof = true;
            return Ok(None);
        }
        Ok(r)
    }

    /// Reads what has arrived into free slots; returns whether anything was read.
    pub fn pump(&mut self) -> Result<bool> {
        let mut progressed = false;
        while self.ready.len() < self.slots.len() && !self.eof {
            let i = (self.filled % self.slots.len() as u64) as usize;
            if let Some((len, got)) = self.direct {
                match self.recv_into(Some((i, got, len)))? {
                    None => break,
                    Some(n) => {
                        progressed = true;
                        if got + n == len {
                            self.direct = None;
                            self.ready.push_back((i, len));
                            self.filled += 1;
                        } else {
                            self.direct = Some((len, got + n));
                        }
                    }
                }
                continue;
            }
            let have = self.rx_end - self.rx_start;
            if have >= FRAME_HEADER {
                let h = &self.rx[self.rx_start..self.rx_start + 4];
                let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
                if len > self.slots[i].len() {
                    return Err(Error::InvalidUsage(format!(
                        "rank {}: rank {} sent a {len}-byte frame, larger than the {}-byte slot (different NCCL_BUFFSIZE?)",
                        self.me,
                        self.peer,
                        self.slots[i].len()
                    )));
                }
                let avail = have - FRAME_HEADER;
                let body = self.rx_start + FRAME_HEADER;
                if avail >= len || len > SMALL_FRAME {
                    // The whole frame, or the start of a large one, is buffered: move it to
                    // its slot and read the rest of a large one straight there.
                    let take = avail.min(len);
                    self.slots[i][..take].copy_from_slice(&self.rx[body..body + take]);
                    self.rx_start = body + take;
                    progressed = true;
                    if take == len {
                        self.ready.push_back((i, len));
                        self.filled += 1;
                    } else {
                        self.direct = Some((len, take));
                    }
                    continue;
                }
            }
            // More bytes needed in the receive buffer: compact it, then read.
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

    /// Whether a chunk is waiting (reading the socket if none is).
    #[inline]
    pub fn ready(&mut self) -> Result<bool> {
        if self.ready.is_empty() {
            self.pump()?;
            if self.ready.is_empty() && self.eof {
                return Err(self.closed());
            }
        }
        Ok(!self.ready.is_empty())
    }

    /// The waiting chunk.
    #[inline]
    pub fn chunk(&self) -> (*const u8, usize) {
        match self.ready.front() {
            Some(&(i, len)) => (self.slots[i].as_ptr(), len),
            None => (std::ptr::null(), 0),
        }
    }

    /// Frees the chunk's slot.
    #[inline]
    pub fn release(&mut self) {
        self.ready.pop_front();
    }

    /// Whether the socket should be polled for readability (a slot is free).
    pub fn wants_data(&self) -> bool {
        self.ready.len() < self.slots.len() && !self.eof
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
