//! Transports: how a unidirectional connection's chunks travel. Shared memory between ranks
//! of one host ([`shm`]), TCP otherwise ([`tcp`]).
//!
//! Both offer the engine one interface — a sender asks for a free slot, fills it and commits;
//! a receiver asks for the next chunk, reads it and releases it — and neither knows which
//! collective it serves.

pub mod host;
pub mod hostmem;
pub mod shm;
pub mod tcp;

use crate::error::Result;
use crate::sys::fd;
use oxccl_core::contract::SigWords;
use oxccl_core::proto::Proto;
use oxccl_core::Rank;
use shm::{ShmRecv, ShmSend};
use std::net::TcpStream;
use tcp::{TcpRecv, TcpSend};

/// The sending end of a connection.
pub enum SendConn {
    Shm(ShmSend),
    Tcp(TcpSend),
}

/// The receiving end of a connection.
pub enum RecvConn {
    Shm(ShmRecv),
    Tcp(TcpRecv),
}

impl SendConn {
    #[inline]
    pub fn ready(&mut self) -> bool {
        match self {
            SendConn::Shm(c) => c.ready(),
            SendConn::Tcp(c) => c.ready(),
        }
    }

    /// Where to write the next chunk of protocol `p`, and how much fits. Shared memory lays
    /// each protocol out in its own format; a TCP frame's header is its readiness signal, so
    /// TCP carries every protocol's chunks as frames.
    #[inline]
    pub fn slot(&mut self, p: Proto) -> (*mut u8, usize) {
        match self {
            SendConn::Shm(c) => c.slot(p),
            SendConn::Tcp(c) => c.slot(),
        }
    }

    #[inline]
    pub fn commit(&mut self, len: usize, sig: &SigWords, p: Proto) -> Result<()> {
        match self {
            SendConn::Shm(c) => {
                c.commit(len, sig, p);
                Ok(())
            }
            SendConn::Tcp(c) => c.commit(len, sig),
        }
    }

    /// Moves pending bytes along; whether anything moved.
    #[inline]
    pub fn pump(&mut self) -> Result<bool> {
        match self {
            SendConn::Shm(_) => Ok(false),
            SendConn::Tcp(c) => c.pump(),
        }
    }

    /// Whether this connection can send bytes from where they lie (no staging copy).
    #[inline]
    pub fn sends_in_place(&self) -> bool {
        matches!(self, SendConn::Tcp(_))
    }

    /// Queues `len` bytes at `ptr` without copying them (only if [`sends_in_place`]).
    ///
    /// # Safety
    /// `ptr` must stay valid for `len` reads, and unchanged, until the connection is
    /// [`flushed`](Self::flushed).
    ///
    /// [`sends_in_place`]: Self::sends_in_place
    pub unsafe fn commit_external(&mut self, ptr: *const u8, len: usize, sig: &SigWords) -> Result<()> {
        match self {
            // SAFETY: forwarded from the caller's contract.
            SendConn::Tcp(c) => unsafe { c.commit_external(ptr, len, sig) },
            SendConn::Shm(_) => {
                Err(crate::error::Error::Internal("shared-memory connections stage every chunk".into()))
            }
        }
    }

    /// Whether nothing committed is still waiting to leave this process.
    pub fn flushed(&self) -> bool {
        match self {
            SendConn::Shm(_) => true,
            SendConn::Tcp(c) => c.flushed(),
        }
    }

    /// Whether a queued frame that is not yet fully written is sent from memory overlapping
    /// `ptr..ptr + len` (TCP sends from user memory).
    pub fn reads_external(&self, ptr: *const u8, len: usize) -> bool {
        match self {
            SendConn::Tcp(c) => c.reads_external(ptr, len),
            SendConn::Shm(_) => false,
        }
    }

    /// The socket and events to poll before pumping: a TCP connection with frames to write.
    pub fn poll_interest(&self) -> Option<fd::PollFd> {
        match self {
            SendConn::Tcp(c) if !c.flushed() => Some(fd::pollfd(c.poll_fd(), fd::POLLOUT)),
            _ => None,
        }
    }

    /// Prepares to sleep until this connection can make progress: announces it (shared
    /// memory) or adds what to poll (TCP).
    pub fn arm(&self, pfds: &mut Vec<fd::PollFd>) {
        match self {
            SendConn::Shm(c) => c.arm(),
            SendConn::Tcp(c) => pfds.push(fd::pollfd(c.poll_fd(), fd::POLLOUT)),
        }
    }

    pub fn disarm(&self) {
        if let SendConn::Shm(c) = self {
            c.disarm();
        }
    }

    pub fn peer(&self) -> Rank {
        match self {
            SendConn::Shm(c) => c.peer(),
            SendConn::Tcp(c) => c.peer(),
        }
    }

    pub fn shutdown_handle(&self) -> Option<TcpStream> {
        match self {
            SendConn::Shm(_) => None,
            SendConn::Tcp(c) => c.shutdown_handle(),
        }
    }
}

impl RecvConn {
    #[inline]
    pub fn ready(&mut self) -> Result<bool> {
        match self {
            RecvConn::Shm(c) => Ok(c.ready()),
            RecvConn::Tcp(c) => c.ready(),
        }
    }

    #[inline]
    pub fn chunk(&self) -> (*const u8, usize) {
        match self {
            RecvConn::Shm(c) => c.chunk(),
            RecvConn::Tcp(c) => c.chunk(),
        }
    }

    /// The waiting chunk's call signature.
    #[inline]
    pub fn sig(&self) -> SigWords {
        match self {
            RecvConn::Shm(c) => c.sig(),
            RecvConn::Tcp(c) => c.sig(),
        }
    }

    #[inline]
    pub fn release(&mut self) {
        match self {
            RecvConn::Shm(c) => c.release(),
            RecvConn::Tcp(c) => c.release(),
        }
    }

    #[inline]
    pub fn pump(&mut self) -> Result<bool> {
        match self {
            RecvConn::Shm(_) => Ok(false),
            RecvConn::Tcp(c) => c.pump(),
        }
    }

    /// The socket and events to poll before pumping: a TCP connection with room for the
    /// next frame (a free slot, or a posted receive).
    pub fn poll_interest(&self, posted: bool) -> Option<fd::PollFd> {
        match self {
            RecvConn::Tcp(c) if c.wants_data(posted) => Some(fd::pollfd(c.poll_fd(), fd::POLLIN)),
            _ => None,
        }
    }

    /// Whether a receive posted now would take this connection's next frame (TCP only).
    pub fn accepts_post(&self) -> bool {
        match self {
            RecvConn::Tcp(c) => c.accepts_post(),
            RecvConn::Shm(_) => false,
        }
    }

    /// Pumps with a posted receive (see [`TcpRecv::pump_posted`]).
    ///
    /// # Safety
    /// As [`TcpRecv::pump_posted`].
    pub unsafe fn pump_posted(&mut self, post: Option<tcp::Post>) -> Result<bool> {
        match self {
            RecvConn::Shm(_) => Ok(false),
            // SAFETY: forwarded contract.
            RecvConn::Tcp(c) => unsafe { c.pump_posted(post) },
        }
    }

    /// Ends a job early (see [`TcpRecv::abandon_posted`]).
    pub fn abandon_posted(&mut self) {
        if let RecvConn::Tcp(c) = self {
            c.abandon_posted();
        }
    }

    /// Moves frames a TCP connection has already read into free slots (no system call).
    #[inline]
    pub fn pump_buffered(&mut self) -> Result<bool> {
        match self {
            RecvConn::Tcp(c) if c.has_buffered() => c.pump_buffered(),
            _ => Ok(false),
        }
    }

    pub fn arm(&self, pfds: &mut Vec<fd::PollFd>, posted: bool) {
        match self {
            RecvConn::Shm(c) => c.arm(),
            RecvConn::Tcp(c) => {
                if c.wants_data(posted) {
                    pfds.push(fd::pollfd(c.poll_fd(), fd::POLLIN));
                }
            }
        }
    }

    pub fn disarm(&self) {
        if let RecvConn::Shm(c) = self {
            c.disarm();
        }
    }

    pub fn peer(&self) -> Rank {
        match self {
            RecvConn::Shm(c) => c.peer(),
            RecvConn::Tcp(c) => c.peer(),
        }
    }

    pub fn shutdown_handle(&self) -> Option<TcpStream> {
        match self {
            RecvConn::Shm(_) => None,
            RecvConn::Tcp(c) => c.shutdown_handle(),
        }
    }
}
