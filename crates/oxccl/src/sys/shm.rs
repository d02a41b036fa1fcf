//! Shared memory regions: anonymous memory files (`memfd_create`) mapped `MAP_SHARED`.
//!
//! A region is created by one process and shared by sending its descriptor over a Unix socket
//! (see [`super::unix`]); it needs no name in `/dev/shm`, is freed by the kernel when the last
//! mapping and descriptor go, and is not limited by the size of a container's `/dev/shm`
//! mount.

use super::{cvt, last_error};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A mapped shared memory region.
#[derive(Debug)]
pub struct ShmRegion {
    ptr: *mut u8,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the region is plain memory; every access through `ptr` is synchronized by the
// protocol of whoever uses it (atomics in the connection header), never by this type.
unsafe impl Send for ShmRegion {}
// SAFETY: as above; `&ShmRegion` only hands out the raw pointer.
unsafe impl Sync for ShmRegion {}

impl ShmRegion {
    /// Creates and maps a zero-filled region of `len` bytes.
    pub fn create(name: &str, len: usize) -> io::Result<ShmRegion> {
        let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call.
        let fd = cvt(unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) })?;
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on a descriptor we own.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot size a {len}-byte shared memory region: {e}"))
        })?;
        Self::map(fd, len)
    }

    /// Maps a region received from a peer, checking that it holds at least `min_len` bytes.
    pub fn open(fd: OwnedFd, min_len: usize) -> io::Result<ShmRegion> {
        // SAFETY: a zeroed `stat` is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes into `st`, which is live and exclusive.
        cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        let len = st.st_size as usize;
        if len < min_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared region has {len} bytes, needs {min_len}"),
            ));
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<ShmRegion> {
        // SAFETY: maps `len` bytes of a descriptor we own; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = last_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot map a {len}-byte shared memory region: {e}"),
            ));
        }
        Ok(ShmRegion { ptr: ptr.cast(), len, fd })
    }

    /// The start of the mapping (page-aligned).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A duplicate of the descriptor, to send to a peer.
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value created; nothing refers to it after
        // drop (users hold the region for as long as they use its memory).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
