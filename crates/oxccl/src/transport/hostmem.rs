//! Host-memory control blocks: each rank's small shared region through which the ranks of a
//! single-host communicator post their calls to each other (the direct path, see
//! [`crate::engine::direct`]).
//!
//! Layout of one rank's block (created by that rank, mapped read-only in spirit by its peers):
//!
//! ```text
//! 0       magic
//! 64      done      (u64)  last sequence number whose direct work this rank finished
//! 128     sleeping  (u32)  this rank is (about to be) asleep waiting for peers
//! 192     probe     (2 × u64) the block's address in its owner's process, a nonce: peers
//!                   read the nonce there with process_vm_readv to learn whether they may
//!                   read the owner's memory (written once, before the block is shared)
//! 256     post[0]   head at +0: seq (u64), flags, nbufs, the call's signature (3 × u64), an
//!                   inline contribution of at most 24 bytes (all a small call's peers read, in
//!                   one line); meta at +64: 2 × (alloc id, offset, len), 2 × the buffers'
//!                   addresses in the owner
//! 384     post[1]
//! 512     mid       (u64)  last sequence number whose first phase this rank finished (calls
//!                   whose second phase reads what the first wrote)
//! 576     cpu       (u32)  the CPU this rank ran on when it last began to wait, plus one (0:
//!                   unknown); a hint for peers, which yield their core at once to a rank
//!                   they wait for that shares it, instead of spinning it away
//! 4096    inline[0] INLINE_BYTES
//! 4096 + INLINE_BYTES  inline[1]
//! ```
//!
//! Rules:
//! 1. Only the owner writes its block. A call with sequence number `s` uses post and inline
//!    area `s % 2` (a contribution of at most 24 bytes: the post's head instead of the area):
//!    the owner writes meta and inline data, then publishes with a release store of `seq = s`;
//!    a peer reads them only after an acquire load shows `seq == s`.
//! 2. The owner rewrites post `s % 2` only at call `s + 2`, which it reaches only after every
//!    peer posted `s + 1`, i.e. finished reading call `s`. No end barrier is needed for data
//!    read from posts.
//! 3. `done = s` (release) after the owner's part of a zero-copy or cross-memory call `s`;
//!    nobody returns from such a call before every peer's `done ≥ s`, so no buffer is reused
//!    while a peer may still read or write it. `mid = s` likewise ends a first phase: nobody
//!    reads what a peer wrote in it before that peer's `mid ≥ s`.
//! 4. Sleeping follows the shared-memory connection rule: set `sleeping`, SeqCst fence,
//!    re-check, sleep; a publisher fences after its store and rings the doorbell of every peer
//!    whose `sleeping` is set.
//! 5. `cpu` is a hint, written by the owner at the start of each wait (relaxed) and read by
//!    peers while they poll: a stale or torn view only makes a peer yield once too often or
//!    spin once too long, never decides anything a call's result depends on.

use crate::sys::shm::ShmRegion;
use oxccl_core::tuning::DIRECT_INLINE_BYTES;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of one inline area.
pub const INLINE_BYTES: usize = DIRECT_INLINE_BYTES;
const INLINE_AT: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"OXCTL005");

#[repr(C, align(64))]
pub struct Line<T>(pub T);

/// Bytes of a contribution that travel in the post's first line, next to its sequence
/// number, instead of in the inline area: a peer then fetches one line for the whole post.
pub const SMALL_BYTES: usize = 24;

/// The first line of a post: what every call's peers read.
#[repr(C)]
pub struct Head {
    pub seq: AtomicU64,
    pub flags: AtomicU32,
    pub nbufs: AtomicU32,
    /// The call's signature (the contract check; zeros when it is off).
    pub sig: [AtomicU64; 3],
    /// An inline contribution of at most [`SMALL_BYTES`].
    pub small: [AtomicU64; 3],
}

/// What a post says for zero-copy and cross-memory calls.
#[repr(C)]
pub struct Meta {
    /// (allocation id, offset, length) of the send and receive buffers; id 0: not shared.
    pub desc: [[AtomicU64; 3]; 2],
    /// The send and receive buffers' addresses in the owner's process (cross-memory calls).
    pub addr: [AtomicU64; 2],
}

#[repr(C)]
pub struct Post {
    pub head: Line<Head>,
    pub meta: Line<Meta>,
}

#[repr(C)]
struct Header {
    magic: Line<AtomicU64>,
    done: Line<AtomicU64>,
    sleeping: Line<AtomicU32>,
    probe: Line<[AtomicU64; 2]>,
    posts: [Post; 2],
    mid: Line<AtomicU64>,
    cpu: Line<AtomicU32>,
}

const _: () = assert!(std::mem::size_of::<Header>() <= INLINE_AT);
const _: () = assert!(std::mem::size_of::<Head>() == 64 && std::mem::size_of::<Meta>() == 64);
const _: () = assert!(std::mem::offset_of!(Header, posts) == 256 && std::mem::size_of::<Post>() == 128);
const _: () = assert!(std::mem::offset_of!(Header, mid) == 512);
const _: () = assert!(std::mem::offset_of!(Header, cpu) == 576);

/// Flag: this rank's buffers are shared allocations (zero-copy capable).
pub const FLAG_SHARED: u32 = 1;
/// Flag: this rank copied its contribution into its inline area.
pub const FLAG_INLINE: u32 = 2;
/// Flag: this rank may read every peer's memory (process_vm_readv) and posted its buffers'
/// addresses for that.
pub const FLAG_CMA: u32 = 4;

const PROBE_NONCE_AT: usize = std::mem::offset_of!(Header, probe) + 8;

/// Bytes of a control block.
pub const CTL_BYTES: usize = INLINE_AT + 2 * INLINE_BYTES;

/// A control block, own or mapped from a peer.
pub struct Ctl {
    region: ShmRegion,
}

impl Ctl {
    /// Creates this rank's block.
    pub fn create(rank: u32) -> std::io::Result<Ctl> {
        let region = ShmRegion::create(&format!("oxccl-ctl-{rank}"), CTL_BYTES)?;
        let c = Ctl { region };
        let h = c.hdr();
        // Any value unlikely to sit at that address by chance serves as the nonce.
        let nonce =
            crate::sys::ticks::unix_us() ^ (u64::from(std::process::id()) << 40) ^ 0x9e37_79b9_7f4a_7c15;
        h.probe.0[0].store(c.region.ptr() as u64 + PROBE_NONCE_AT as u64, Ordering::Relaxed);
        h.probe.0[1].store(nonce, Ordering::Relaxed);
        h.magic.0.store(MAGIC, Ordering::Release);
        Ok(c)
    }

    /// Maps a peer's block from its descriptor.
    pub fn open(fd: std::os::fd::OwnedFd) -> std::io::Result<Ctl> {
        let region = ShmRegion::open(fd, CTL_BYTES)?;
        let c = Ctl { region };
        if c.hdr().magic.0.load(Ordering::Acquire) != MAGIC {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not an oxccl control block"));
        }
        Ok(c)
    }

    fn hdr(&self) -> &Header {
        // SAFETY: the region holds CTL_BYTES ≥ size_of::<Header>() bytes, is page-aligned, and
        // every Header field is an atomic (or padding), so shared references are sound while
        // other processes access it.
        unsafe { &*(self.region.ptr() as *const Header) }
    }

    pub fn post(&self, seq: u64) -> &Post {
        &self.hdr().posts[(seq % 2) as usize]
    }

    /// Where call `seq`'s inline contributions lie when the largest is `bytes`: the post's
    /// head for at most [`SMALL_BYTES`], else the inline area (every rank decides alike).
    pub fn inline_for(&self, seq: u64, bytes: usize) -> *mut u8 {
        if bytes <= SMALL_BYTES {
            self.post(seq).head.0.small.as_ptr() as *mut u8
        } else {
            self.inline(seq)
        }
    }

    /// The inline area of call `seq`.
    pub fn inline(&self, seq: u64) -> *mut u8 {
        // SAFETY: INLINE_AT + 2 × INLINE_BYTES = CTL_BYTES bytes are mapped.
        unsafe { self.region.ptr().add(INLINE_AT + (seq % 2) as usize * INLINE_BYTES) }
    }

    /// Where, in the owner's process, the probe nonce lies, and the nonce (rule: the block's
    /// `probe` line).
    pub fn probe(&self) -> (u64, u64) {
        let p = &self.hdr().probe.0;
        (p[0].load(Ordering::Relaxed), p[1].load(Ordering::Relaxed))
    }

    pub fn mid(&self) -> &AtomicU64 {
        &self.hdr().mid.0
    }

    pub fn done(&self) -> &AtomicU64 {
        &self.hdr().done.0
    }

    pub fn sleeping(&self) -> &AtomicU32 {
        &self.hdr().sleeping.0
    }

    /// The CPU hint (the layout's `cpu` line): 0 unknown, else the CPU number plus one.
    pub fn cpu(&self) -> &AtomicU32 {
        &self.hdr().cpu.0
    }

    /// A duplicate of the block's descriptor, for a peer.
    pub fn try_clone_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.region.try_clone_fd()
    }
}
