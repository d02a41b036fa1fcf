//! Abstract-namespace `SOCK_SEQPACKET` Unix sockets that carry descriptors (`SCM_RIGHTS`).
//!
//! Same-host ranks use them to hand each other shared-memory regions and eventfds. Abstract
//! names live in the network namespace, which is part of oxccl's host identity, so any two
//! ranks that choose shared memory can reach each other's sockets. Sequenced packets keep one
//! request (bytes plus descriptors) in one message.

use super::{cvt, cvt_size, last_error};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 4;

fn addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: a zeroed sockaddr_un is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > a.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "unix socket name too long"));
    }
    // Leading NUL: abstract namespace.
    for (i, b) in name.iter().enumerate() {
        a.sun_path[i + 1] = *b as libc::c_char;
    }
    let base = std::mem::offset_of!(libc::sockaddr_un, sun_path);
    Ok((a, (base + 1 + name.len()) as libc::socklen_t))
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the result is checked.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) })?;
    Ok(())
}

/// A listening abstract Unix socket (non-blocking).
#[derive(Debug)]
pub struct SeqListener {
    fd: OwnedFd,
}

impl SeqListener {
    /// Binds `\0name` and listens.
    pub fn bind_abstract(name: &[u8]) -> io::Result<SeqListener> {
        let fd = socket()?;
        let (a, len) = addr(name)?;
        // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
        cvt(unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) })?;
        // SAFETY: listen on a bound socket we own.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 256) })?;
        set_nonblocking(fd.as_raw_fd(), true)?;
        Ok(SeqListener { fd })
    }

    /// Accepts one pending connection, if any.
    pub fn accept(&self) -> io::Result<Option<SeqSocket>> {
        // SAFETY: accept4 without address output, on a listener we own.
        let r = unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if r < 0 {
            let e = last_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: `r` is a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(r) };
        Ok(Some(SeqSocket { fd }))
    }
}

impl AsRawFd for SeqListener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A connected sequenced-packet socket.
#[derive(Debug)]
pub struct SeqSocket {
    fd: OwnedFd,
}

impl SeqSocket {
    /// Connects to `\0name` (blocking), with send and receive timeouts of `timeout`.
    pub fn connect_abstract(name: &[u8], timeout: Duration) -> io::Result<SeqSocket> {
        let fd = socket()?;
        let (a, len) = addr(name)?;
        let s = SeqSocket { fd };
        s.set_timeouts(timeout)?;
        // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
        cvt(unsafe { libc::connect(s.fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) })?;
        Ok(s)
    }

    /// Sets send and receive timeouts (blocking mode).
    pub fn set_timeouts(&self, t: Duration) -> io::Result<()> {
        let tv = libc::timeval {
            tv_sec: t.as_secs() as libc::time_t,
            tv_usec: t.subsec_micros() as libc::suseconds_t,
        };
        for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
            // SAFETY: passes a live timeval of the right size.
            cvt(unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            })?;
        }
        Ok(())
    }

    /// Switches blocking mode.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        set_nonblocking(self.fd.as_raw_fd(), on)
    }

    /// Sends one message with up to [`MAX_FDS`] descriptors.
    pub fn send(&self, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
        assert!(fds.len() <= MAX_FDS);
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        let mut cbuf = [0u64; 16];
        // SAFETY: a zeroed msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let payload = std::mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
            debug_assert!(space <= std::mem::size_of_val(&cbuf));
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points at `space` zeroed, 8-aligned bytes, enough for one
            // header carrying `fds`; CMSG_FIRSTHDR/CMSG_DATA stay inside that buffer.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(payload) as _;
                std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
            }
        }
        let n = loop {
            // SAFETY: `msg` refers to live buffers for the duration of the call.
            match cvt_size(unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) }) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        if n != data.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short unix socket send"));
        }
        Ok(())
    }

    /// Receives one message: `Ok(None)` when none is there (non-blocking mode), otherwise the
    /// byte count and the descriptors that came with it. A message larger than `buf` is an
    /// error, not a silent truncation.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut cbuf = [0u64; 16];
        // SAFETY: a zeroed msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // A signal with a handler installed without SA_RESTART (Python's, torch's) interrupts
        // a blocking receive: it is retried, not taken for "no message" (which only a
        // non-blocking socket answers, with EAGAIN).
        let r = loop {
            // SAFETY: `msg` refers to live, exclusive buffers for the duration of the call.
            let r = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if r >= 0 {
                break r;
            }
            let e = last_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        };
        let mut fds = Vec::new();
        // SAFETY: walks the control headers the kernel wrote into `cbuf`, bounded by
        // msg_controllen; each SCM_RIGHTS payload holds whole descriptors that are now ours.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    let hdr = libc::CMSG_LEN(0) as usize;
                    let n = ((*c).cmsg_len as usize - hdr) / std::mem::size_of::<RawFd>();
                    for i in 0..n {
                        fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "oversized unix socket message"));
        }
        Ok(Some((r as usize, fds)))
    }
}

impl AsRawFd for SeqSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::fd::EventFd;

    #[test]
    fn passes_descriptors() {
        let name = format!("oxccl-test-{}", std::process::id());
        let l = SeqListener::bind_abstract(name.as_bytes()).unwrap();
        let c = SeqSocket::connect_abstract(name.as_bytes(), Duration::from_secs(5)).unwrap();
        let s = loop {
            if let Some(s) = l.accept().unwrap() {
                break s;
            }
        };
        let e = EventFd::new().unwrap();
        c.send(b"hello", &[e.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = loop {
            if let Some(m) = s.recv(&mut buf).unwrap() {
                break m;
            }
        };
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        let e2 = EventFd::from_owned(fds.into_iter().next().unwrap());
        e2.notify();
        assert!(e.drain());
        assert!(!e.drain());
    }

    extern "C" fn on_signal(_: libc::c_int) {}

    #[test]
    fn a_blocking_receive_interrupted_by_a_signal_waits_on() {
        // A handler installed without SA_RESTART, as Python installs its own.
        // SAFETY: a zeroed sigaction with a valid handler; SIGUSR2 is not used elsewhere in
        // this test binary.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        }
        let name = format!("oxccl-test-eintr-{}", std::process::id());
        let l = SeqListener::bind_abstract(name.as_bytes()).unwrap();
        let c = SeqSocket::connect_abstract(name.as_bytes(), Duration::from_secs(5)).unwrap();
        let s = loop {
            if let Some(s) = l.accept().unwrap() {
                break s;
            }
        };
        s.set_nonblocking(false).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let mut buf = [0u8; 16];
            s.recv(&mut buf).unwrap().map(|(n, _)| buf[..n].to_vec())
        });
        let th = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // SAFETY: the thread is alive (it waits for the message sent below).
        unsafe { libc::pthread_kill(th, libc::SIGUSR2) };
        std::thread::sleep(Duration::from_millis(100));
        c.send(b"after", &[]).unwrap();
        assert_eq!(t.join().unwrap().as_deref(), Some(&b"after"[..]), "the interrupted receive gave up");
    }
}
