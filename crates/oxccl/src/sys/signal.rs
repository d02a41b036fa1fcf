//! SIGUSR1 as bytes on a pipe: the handler only writes one byte (async-signal-safe), and a
//! thread of the caller's reads them and does the work.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// The pipe's write end, for the handler (-1: none).
static PIPE_W: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_usr1(_: libc::c_int) {
    let fd = PIPE_W.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = 1u8;
        // SAFETY: write(2) is async-signal-safe; one byte from a live local.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
}

/// The read end of the SIGUSR1 pipe.
pub struct Usr1 {
    rd: OwnedFd,
}

/// Installs the SIGUSR1 handler, unless the program has one of its own (then `None`, and its
/// handler stays). Call it once per process.
pub fn usr1_pipe() -> Option<Usr1> {
    let mut fds = [0i32; 2];
    // SAFETY: sigaction reads and writes zeroed, filled-in local structs; pipe2 fills the two
    // descriptors of a local array.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return None;
        }
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return None;
        }
        PIPE_W.store(fds[1], Ordering::Relaxed);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    // SAFETY: fds[0] is the fresh read end that nothing else owns (the write end stays open
    // for the handler for the life of the process).
    Some(Usr1 { rd: unsafe { OwnedFd::from_raw_fd(fds[0]) } })
}

impl Usr1 {
    /// Blocks until SIGUSR1 arrives (`true`) or the pipe fails (`false`).
    pub fn wait(&self) -> bool {
        loop {
            let mut b = [0u8; 64];
            // SAFETY: reads into a live local buffer from the pipe this value owns.
            let n = unsafe { libc::read(self.rd.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
            if n > 0 {
                return true;
            }
            if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return false;
            }
        }
    }
}
