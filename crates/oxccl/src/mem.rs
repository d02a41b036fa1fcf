//! Shared host memory: allocations that same-host peers can map, so collectives on them move
//! no byte they do not have to (the zero-copy direct path).
//!
//! Each allocation is its own memory file: a header page, then the data (page-aligned). The
//! process keeps a registry of its live allocations, so a communicator can tell whether a
//! buffer lies in one (and where), and its service can hand a peer the file to map.
//!
//! Rules:
//! 1. An allocation's id is unique in the process and never reused.
//! 2. The header's `freed` flag is set before the owner unmaps; peers that mapped the file
//!    check it to drop stale mappings (the memory itself lives until the last mapping goes).
//! 3. Only the owner writes the header; `freed` is the only field that changes after creation.

use crate::error::{Error, Result};
use crate::sys::shm::ShmRegion;
use oxccl_core::{Element, Rank};
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Bytes before the data: the header page.
pub const HEADER_BYTES: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"OXMEM001");

#[repr(C)]
struct Header {
    magic: AtomicU64,
    id: AtomicU64,
    data_len: AtomicU64,
    freed: AtomicU32,
}

/// One shared allocation.
struct Alloc {
    id: u64,
    region: ShmRegion,
}

impl Alloc {
    fn header(&self) -> &Header {
        // SAFETY: the region is at least HEADER_BYTES long, page-aligned, and Header's fields
        // are atomics, so a shared reference is sound while peers map the region too.
        unsafe { &*(self.region.ptr() as *const Header) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES is within the region (its size is HEADER_BYTES + data_len).
        unsafe { self.region.ptr().add(HEADER_BYTES) }
    }
}

impl Drop for Alloc {
    fn drop(&mut self) {
        self.header().freed.store(1, Ordering::Release);
        lock().remove(&(self.data() as usize));
    }
}

struct Entry {
    id: u64,
    len: usize,
    fd: Arc<OwnedFd>,
}

fn registry() -> &'static Mutex<BTreeMap<usize, Entry>> {
    static R: OnceLock<Mutex<BTreeMap<usize, Entry>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(BTreeMap::new()))
}

fn lock() -> std::sync::MutexGuard<'static, BTreeMap<usize, Entry>> {
    registry().lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a byte range lies in this process's shared allocations: `(id, offset)`.
pub(crate) fn lookup(ptr: *const u8, len: usize) -> Option<(u64, usize)> {
    let a = ptr as usize;
    let r = lock();
    let (start, e) = r.range(..=a).next_back()?;
    let off = a - start;
    (off.checked_add(len)? <= e.len).then_some((e.id, off))
}

/// A duplicate of allocation `id`'s file, for a peer to map.
pub(crate) fn fd_of(id: u64) -> Option<OwnedFd> {
    let r = lock();
    r.values().find(|e| e.id == id).and_then(|e| e.fd.try_clone().ok())
}

fn alloc_bytes(bytes: usize) -> Result<Arc<Alloc>> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let region = ShmRegion::create(&format!("oxccl-buf-{id}"), HEADER_BYTES + bytes.max(1))
        .map_err(|e| Error::io(Rank(0), "allocate shared memory", None, e))?;
    let fd =
        Arc::new(region.try_clone_fd().map_err(|e| Error::io(Rank(0), "allocate shared memory", None, e))?);
    let a = Arc::new(Alloc { id, region });
    let h = a.header();
    h.id.store(id, Ordering::Relaxed);
    h.data_len.store(bytes as u64, Ordering::Relaxed);
    h.magic.store(MAGIC, Ordering::Release);
    lock().insert(a.data() as usize, Entry { id, len: bytes, fd });
    Ok(a)
}

/// A zero-filled buffer of `T` in shared host memory (like `Vec<T>` of fixed length).
///
/// Collectives on these buffers between ranks of one host read and write peers' memory
/// directly. Any other memory works too, through shared-memory staging.
pub struct SharedBuf<T: Element> {
    alloc: Arc<Alloc>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Element> SharedBuf<T> {
    /// `len` zeroed elements.
    pub fn zeroed(len: usize) -> Result<SharedBuf<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::InvalidUsage(format!("{len} elements overflow")))?;
        Ok(SharedBuf { alloc: alloc_bytes(bytes)?, len, _t: PhantomData })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[T]) -> Result<SharedBuf<T>> {
        let mut b = SharedBuf::zeroed(data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    }
}

impl<T: Element> Deref for SharedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the data area holds `len` elements of T (page-aligned, so aligned for any
        // T), zero-initialized (valid for Pod), and lives as long as `alloc`. Peers only touch
        // it inside collectives that borrow this buffer.
        unsafe { std::slice::from_raw_parts(self.alloc.data() as *const T, self.len) }
    }
}

impl<T: Element> DerefMut for SharedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.alloc.data() as *mut T, self.len) }
    }
}

impl<T: Element + std::fmt::Debug> std::fmt::Debug for SharedBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuf").field("id", &self.alloc.id).field("len", &self.len).finish()
    }
}

/// A peer's allocation, mapped here.
pub(crate) struct PeerAlloc {
    region: ShmRegion,
    data_len: usize,
}

impl PeerAlloc {
    /// The bytes of the peer's allocation this mapping shows.
    pub fn data_len(&self) -> usize {
        self.data_len
    }

    /// Maps a peer's allocation file, checking its header.
    pub fn map(fd: OwnedFd, id: u64) -> std::io::Result<PeerAlloc> {
        let region = ShmRegion::open(fd, HEADER_BYTES)?;
        // SAFETY: the region has at least HEADER_BYTES bytes; the header fields are atomics.
        let h = unsafe { &*(region.ptr() as *const Header) };
        let data_len = h.data_len.load(Ordering::Relaxed) as usize;
        if h.magic.load(Ordering::Acquire) != MAGIC
            || h.id.load(Ordering::Relaxed) != id
            || HEADER_BYTES + data_len > region.len()
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "shared allocation header does not match",
            ));
        }
        Ok(PeerAlloc { region, data_len })
    }

    /// Whether the owner freed it.
    pub fn freed(&self) -> bool {
        // SAFETY: as in `map`.
        let h = unsafe { &*(self.region.ptr() as *const Header) };
        h.freed.load(Ordering::Acquire) != 0
    }

    /// The data at `off..off + len`, if in bounds.
    pub fn range(&self, off: usize, len: usize) -> Option<*mut u8> {
        // SAFETY: bounds checked against data_len, which fits the mapping (checked in map).
        (off.checked_add(len)? <= self.data_len).then(|| unsafe { self.region.ptr().add(HEADER_BYTES + off) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_finds_ranges_and_forgets_freed() {
        let mut b = SharedBuf::<u32>::zeroed(1000).unwrap();
        b[10] = 7;
        assert_eq!(b[10], 7);
        let p = b.as_ptr() as *const u8;
        let (id, off) = lookup(p, 4000).unwrap();
        assert_eq!(off, 0);
        // SAFETY: test only: offsets within the buffer.
        let inner = unsafe { p.add(400) };
        assert_eq!(lookup(inner, 100), Some((id, 400)));
        assert_eq!(lookup(inner, 4000), None, "range past the end");
        let fd = fd_of(id).unwrap();
        let peer = PeerAlloc::map(fd, id).unwrap();
        let q = peer.range(40, 4).unwrap();
        // SAFETY: in-bounds read of the peer mapping of the same memory.
        assert_eq!(unsafe { std::ptr::read(q as *const u32) }, 7);
        assert!(!peer.freed());
        drop(b);
        assert!(peer.freed());
        assert_eq!(lookup(p, 4), None);
        let v = [1u8; 10];
        assert_eq!(lookup(v.as_ptr(), 10), None, "heap memory is not shared");
    }
}
