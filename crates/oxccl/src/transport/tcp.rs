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

/// The sending end of a TCP connection.
pub struct TcpSend {
    s: TcpStream,
    fd: RawFd,
    me: Rank,
    peer: Rank,
    slots: Vec<Box<[u8]>>,
    /// Committed frames not yet fully written: (slot, len).
    queue: VecDeque<(usize, usize)>,
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
        self.queue.push_back((i, len));
        self.head += 1;
        self.pump()?;
        Ok(())
    }

    /// Writes what the socket takes; returns whether anything was written.
    pub fn pump(&mut self) -> Result<bool> {
        let mut progressed = false;
        while let Some(&(i, len)) = self.queue.front() {
            let mut hdr = [0u8; FRAME_HEADER];
            hdr[..4].copy_from_slice(&(len as u32).to_le_bytes());
            let total = FRAME_HEADER + len;
            let n = if self.written < FRAME_HEADER {
                fd::send_vectored(self.fd, &[&hdr[self.written..], &self.slots[i][..len]])
            } else {
                fd::send_vectored(self.fd, &[&self.slots[i][self.written - FRAME_HEADER..len]])
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
    hdr: [u8; FRAME_HEADER],
    hdr_got: usize,
    body_got: usize,
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
            hdr: [0; FRAME_HEADER],
            hdr_got: 0,
            body_got: 0,
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

    /// Reads what has arrived into free slots; returns whether anything was read.
    pub fn pump(&mut self) -> Result<bool> {
        let mut progressed = false;
        while self.ready.len() < self.slots.len() && !self.eof {
            if self.hdr_got < FRAME_HEADER {
                let r = fd::recv_some(self.fd, &mut self.hdr[self.hdr_got..])
                    .map_err(|e| Error::io(self.me, "TCP receive", Some(self.peer), e))?;
                match r {
                    None => break,
                    Some(0) => {
                        self.eof = true;
                        break;
                    }
                    Some(n) => {
                        self.hdr_got += n;
                        progressed = true;
                    }
                }
                continue;
            }
            let len = u32::from_le_bytes([self.hdr[0], self.hdr[1], self.hdr[2], self.hdr[3]]) as usize;
            let i = (self.filled % self.slots.len() as u64) as usize;
            if len > self.slots[i].len() {
                return Err(Error::InvalidUsage(format!(
                    "rank {}: rank {} sent a {len}-byte frame, larger than the {}-byte slot (different NCCL_BUFFSIZE?)",
                    self.me,
                    self.peer,
                    self.slots[i].len()
                )));
            }
            if self.body_got < len {
                let r = fd::recv_some(self.fd, &mut self.slots[i][self.body_got..len])
                    .map_err(|e| Error::io(self.me, "TCP receive", Some(self.peer), e))?;
                match r {
                    None => break,
                    Some(0) => {
                        self.eof = true;
                        break;
                    }
                    Some(n) => {
                        self.body_got += n;
                        progressed = true;
                    }
                }
                if self.body_got < len {
                    continue;
                }
            }
            self.ready.push_back((i, len));
            self.filled += 1;
            self.hdr_got = 0;
            self.body_got = 0;
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
