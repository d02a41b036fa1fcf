//! Every OS call oxccl makes, in small modules with their `unsafe` documented.
//!
//! Nothing above this layer calls `libc` directly.

pub mod affinity;
pub mod cma;
pub mod dl;
pub mod fd;
pub mod futex;
pub mod host;
pub mod ifaces;
pub mod limits;
pub mod nvml;
pub mod pmix;
pub mod shm;
pub mod signal;
pub mod ticks;
pub mod unix;

use std::io;

/// The calling thread's last OS error.
pub fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// Converts a `-1`-on-error return value.
pub fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(last_error())
    } else {
        Ok(r)
    }
}

/// Converts a `-1`-on-error `ssize_t` return value.
pub fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(last_error())
    } else {
        Ok(r as usize)
    }
}
