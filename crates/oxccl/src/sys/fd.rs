//! Event file descriptors (the engine's doorbell) and `poll`.

use super::{cvt, cvt_size, last_error};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking eventfd: any thread or process holding it can wake whoever polls it.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new eventfd with a zero counter.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory arguments; the result is checked before use.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Wraps a received eventfd descriptor.
    pub fn from_owned(fd: OwnedFd) -> EventFd {
        EventFd { fd }
    }

    /// Adds one to the counter, waking pollers. Never blocks.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to a descriptor we own. EAGAIN (counter at its
        // maximum) still leaves the fd readable, which is all a notification needs.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter; returns whether it was non-zero.
    pub fn drain(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from a descriptor we own (non-blocking).
        let r = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        r == 8 && v > 0
    }

    /// A duplicate of the descriptor, to send to a peer.
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Resizes a listening socket's accept queue to the largest the kernel allows (it clamps to
/// `net.core.somaxconn`). When many peers connect at once, a full queue (the standard
/// library's is 128) drops connection attempts, which TCP retries only after 1 s, then 3 s.
pub fn widen_backlog(fd: RawFd) -> io::Result<()> {
    // SAFETY: listen(2) on a descriptor the caller owns; a second call resizes the queue.
    if unsafe { libc::listen(fd, i32::MAX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What `poll` watches: a descriptor and its events.
pub type PollFd = libc::pollfd;
/// Readable (or closed, or a listener with a connection waiting).
pub const POLLIN: i16 = libc::POLLIN;
/// Writable.
pub const POLLOUT: i16 = libc::POLLOUT;

/// A `pollfd` for `fd` waiting for `events` ([`POLLIN`], [`POLLOUT`]).
pub fn pollfd(fd: RawFd, events: i16) -> PollFd {
    libc::pollfd { fd, events, revents: 0 }
}

/// Waits until one of `fds` is ready or `timeout` passes; returns how many are ready.
/// Interruptions by signals count as a timeout (the caller re-checks its conditions).
pub fn poll(fds: &mut [PollFd], timeout: Duration) -> io::Result<usize> {
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a live, exclusive slice of pollfd structs of the given length.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = last_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

/// Sends gathered buffers on a non-blocking socket without raising SIGPIPE (the library may
/// live in a program that does not ignore it); `Ok(0)` when the socket is full.
pub fn send_vectored(fd: RawFd, bufs: &[&[u8]]) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = bufs
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() })
        .collect();
    if iov.is_empty() {
        return Ok(0);
    }
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: every iovec points into a live slice borrowed for this call; sendmsg only reads.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    match cvt_size(r) {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// Receives into `buf` from a non-blocking socket: `Ok(None)` when nothing is there yet,
/// `Ok(Some(0))` at end of stream.
pub fn recv_some(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    if buf.is_empty() {
        // Nothing can be asked for; callers only read into space they have.
        return Ok(None);
    }
    // SAFETY: `buf` is a live, exclusive byte slice of the given length.
    let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    match cvt_size(r) {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
    }
}

/// An exclusive advisory lock on `path` (created if missing), held until the result is
/// dropped; `None` where the file cannot be opened or the lock is not had within `wait` (the
/// caller goes on unlocked: nothing may wait on another process without a bound).
pub fn lock_file(path: &std::path::Path, wait: std::time::Duration) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).ok()?;
    let until = std::time::Instant::now() + wait;
    loop {
        // SAFETY: flock on a descriptor this function owns; the lock lives as long as the file.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Some(f);
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Makes closing socket `fd` send a reset (a zero linger), as a killed process's close does
/// with unread data: for tests of how peers take it.
pub fn reset_on_close(fd: RawFd) -> io::Result<()> {
    let lin = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt reads a correctly sized linger struct that lives through the call.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&lin as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}
