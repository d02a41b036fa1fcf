//! A closed stdout ends the tools quietly, as it ends `cat`: `oxccl-perf ... | head -1`.
//!
//! Rust programs start with SIGPIPE ignored, so a write to a pipe whose reader has gone fails
//! with `EPIPE` and `println!` panics (exit 101). Each binary (`oxccl-perf`, `oxccl`,
//! `oxccl-gpucheck`) calls [`restore_default`] first thing in `main`, so such a write ends the
//! process by SIGPIPE instead. The library's own sockets send with `MSG_NOSIGNAL` and never
//! raise it.

/// Restores SIGPIPE's default disposition (terminate); call it before any thread starts.
pub fn restore_default() {
    // SAFETY: `signal` with SIG_DFL installs no handler of ours, so nothing runs in signal
    // context; it is called at the top of `main`, before the process starts any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
