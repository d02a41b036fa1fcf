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

    /// Asks the kernel to place the region's pages on NUMA node `node` (`MPOL_PREFERRED`: on
    /// another node only when that one is full). Takes effect for pages not yet touched, so
    /// call it right after [`create`](Self::create). Shared memory keeps the policy on the
    /// memory itself, so it holds for the peers' mappings too.
    pub fn prefer_node(&self, node: u32) -> io::Result<()> {
        mbind_preferred(self, node)
    }

    /// The memory policy of the region: (mode, nodes in its mask).
    pub fn mempolicy(&self) -> io::Result<(i32, Vec<u32>)> {
        mempolicy_at(self)
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

/// Most NUMA nodes a policy mask names.
const MAX_NODES: usize = 1024;
const MPOL_PREFERRED: libc::c_int = 1;
const MPOL_F_ADDR: libc::c_int = 2;

/// `mbind(region, MPOL_PREFERRED, {node})`.
fn mbind_preferred(region: &ShmRegion, node: u32) -> io::Result<()> {
    let (ptr, len) = (region.ptr, region.len);
    if node as usize >= MAX_NODES {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("NUMA node {node} ≥ {MAX_NODES}")));
    }
    let mut mask = [0u64; MAX_NODES / 64];
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: mbind reads `mask` (MAX_NODES bits, live for the call) and changes only the
    // memory policy of the caller's mapping [ptr, ptr + len); it never touches the data.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len,
            MPOL_PREFERRED,
            mask.as_ptr(),
            MAX_NODES as libc::c_ulong,
            0u32,
        )
    };
    if r != 0 {
        let e = last_error();
        return Err(io::Error::new(e.kind(), format!("mbind to NUMA node {node}: {e}")));
    }
    Ok(())
}

/// The memory policy of the region's mapping: (mode, nodes in its mask).
fn mempolicy_at(region: &ShmRegion) -> io::Result<(i32, Vec<u32>)> {
    let ptr = region.ptr;
    let mut mode: libc::c_int = 0;
    let mut mask = [0u64; MAX_NODES / 64];
    // SAFETY: get_mempolicy writes `mode` and `mask` (MAX_NODES bits), both live and
    // exclusive; with MPOL_F_ADDR it only looks up the mapping that contains `ptr`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            MAX_NODES as libc::c_ulong,
            ptr,
            MPOL_F_ADDR,
        )
    };
    if r != 0 {
        return Err(last_error());
    }
    let nodes = (0..MAX_NODES as u32).filter(|n| mask[*n as usize / 64] >> (n % 64) & 1 == 1).collect();
    Ok((mode, nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_bound_to_a_node_reports_that_policy() {
        // A node this process may allocate on.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let allowed = status.lines().find_map(|l| l.strip_prefix("Mems_allowed_list:")).unwrap();
        let node = crate::sys::affinity::parse_cpulist(allowed.trim())[0] as u32;
        let r = ShmRegion::create("oxccl-mbind-test", 1 << 20).unwrap();
        let before = r.mempolicy().unwrap();
        assert_eq!(before.0, 0, "a fresh mapping has the default policy: {before:?}");
        r.prefer_node(node).unwrap();
        assert_eq!(r.mempolicy().unwrap(), (MPOL_PREFERRED, vec![node]));
        // A node beyond the mask is refused with a message, not ignored.
        let e = r.prefer_node(5000).unwrap_err();
        assert!(e.to_string().contains("NUMA node 5000"), "{e}");
    }
}
