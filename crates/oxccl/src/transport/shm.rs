//! Shared-memory connections between processes (or threads) of one host.
//!
//! A connection is one memory region, created by the sender and handed to the receiver over
//! the receiver's Unix socket with the sender's doorbell; the receiver answers with its own.
//!
//! Layout: a header page, then `slots` slots of `slot_bytes` each.
//!
//! ```text
//! [magic][slots, slot_bytes][head][tail][recv_sleeping][send_sleeping][lens[MAX_SLOTS]]
//! [sigs[MAX_SLOTS] × 4 u64] pad → 4096
//! [slot 0][slot 1]…[slot slots−1]
//! ```
//!
//! Rules (single producer, single consumer):
//! 1. Only the sender writes `head` (chunks committed) and `lens`; only the receiver writes
//!    `tail` (chunks released). Both count from zero and never wrap in practice (u64).
//! 2. The sender fills slot `head % slots` only while `head − tail < slots`; it writes the data
//!    and `lens[slot]` and `sigs[slot]` (the chunk's call signature), then publishes with a
//!    release store of `head + 1`.
//! 3. The receiver reads slot `tail % slots` only after an acquire load shows `head > tail`,
//!    and releases it with a release store of `tail + 1`; it never trusts `lens` beyond
//!    `slot_bytes`.
//! 4. Sleeping (data before flag): a side that is about to sleep stores 1 to its `*_sleeping`
//!    flag, issues a SeqCst fence, and re-checks the counter before it sleeps; a side that
//!    publishes issues a SeqCst fence after its counter store and rings the peer's doorbell
//!    if the peer's flag is set. One of the two always sees the other's store, so no wake-up
//!    is lost.
//! 5. Each header field sits on its own cache line, so the sender's and receiver's writes
//!    never share one.

use crate::bootstrap::service::{decode_offer_reply, ShmOffer, ShmOfferMsg};
use crate::bootstrap::PeerInfo;
use crate::error::{Error, Result};
use crate::sys::fd::EventFd;
use crate::sys::shm::ShmRegion;
use crate::sys::unix::SeqSocket;
use oxccl_core::contract::SigWords;
use oxccl_core::plan::ConnClass;
use oxccl_core::Rank;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Most slots a connection has.
pub const MAX_SLOTS: usize = 64;
/// Offset of slot 0 from the start of the region.
pub const DATA_OFFSET: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"OXSHM002");

#[repr(C, align(64))]
struct Line<T>(T);

#[repr(C)]
struct Header {
    magic: Line<AtomicU64>,
    geometry: Line<[AtomicU32; 2]>,
    head: Line<AtomicU64>,
    tail: Line<AtomicU64>,
    recv_sleeping: Line<AtomicU32>,
    send_sleeping: Line<AtomicU32>,
    lens: Line<[AtomicU32; MAX_SLOTS]>,
    /// Each slot's chunk signature (three words used, one pad).
    sigs: Line<[[AtomicU64; 4]; MAX_SLOTS]>,
}

const _: () = assert!(std::mem::size_of::<Header>() <= DATA_OFFSET);

/// Bytes a connection's region needs.
pub fn region_bytes(slots: usize, slot_bytes: usize) -> usize {
    DATA_OFFSET + slots * slot_bytes
}

struct Shared {
    region: ShmRegion,
    slots: u64,
    slot_bytes: usize,
    peer: Rank,
    /// The other side's doorbell.
    peer_bell: EventFd,
}

impl Shared {
    fn hdr(&self) -> &Header {
        // SAFETY: the region is at least DATA_OFFSET bytes (checked at creation or open), is
        // page-aligned, and every Header field is an atomic, so shared references to it are
        // sound even while the peer process writes it.
        unsafe { &*(self.region.ptr() as *const Header) }
    }

    fn slot_ptr(&self, n: u64) -> *mut u8 {
        let i = (n % self.slots) as usize;
        // SAFETY: i < slots and the region holds DATA_OFFSET + slots × slot_bytes bytes.
        unsafe { self.region.ptr().add(DATA_OFFSET + i * self.slot_bytes) }
    }
}

/// The sending end of a shared-memory connection.
pub struct ShmSend {
    sh: Shared,
    head: u64,
    tail_seen: u64,
}

/// The receiving end of a shared-memory connection.
pub struct ShmRecv {
    sh: Shared,
    tail: u64,
    head_seen: u64,
}

impl ShmSend {
    /// Creates the connection to `peer` and hands it over through the peer's service.
    pub(crate) fn connect(
        me: Rank,
        secret: &[u8; 32],
        peer: &PeerInfo,
        class: ConnClass,
        slots: usize,
        slot_bytes: usize,
        my_bell: &EventFd,
    ) -> Result<ShmSend> {
        let io = |op: &'static str| move |e| Error::io(me, op, Some(peer.rank), e);
        let bytes = region_bytes(slots, slot_bytes);
        let region = ShmRegion::create(&format!("oxccl-{me}-{}", peer.rank), bytes)
            .map_err(io("create a shared-memory connection"))?;
        // SAFETY: fresh region of `bytes` ≥ DATA_OFFSET bytes, page-aligned; fields are atomics.
        let hdr = unsafe { &*(region.ptr() as *const Header) };
        hdr.geometry.0[0].store(slots as u32, Ordering::Relaxed);
        hdr.geometry.0[1].store(slot_bytes as u32, Ordering::Relaxed);
        hdr.magic.0.store(MAGIC, Ordering::Release);
        let sock = SeqSocket::connect_abstract(&peer.unix_name, Duration::from_secs(10))
            .map_err(io("connect to a peer's unix socket"))?;
        let msg = ShmOfferMsg {
            secret: *secret,
            from: me,
            to: peer.rank,
            class,
            slots: slots as u32,
            slot_bytes: slot_bytes as u32,
        };
        let rfd = region.try_clone_fd().map_err(io("share a shared-memory region"))?;
        sock.send(&msg.encode(), &[rfd.as_raw_fd(), my_bell.as_raw_fd()])
            .map_err(io("offer a shared-memory connection"))?;
        let mut buf = [0u8; 512];
        let (n, mut fds) = sock
            .recv(&mut buf)
            .map_err(io("wait for a shared-memory answer"))?
            .ok_or_else(|| Error::Internal("empty unix socket answer".into()))?;
        if let Err(why) = decode_offer_reply(&buf[..n])? {
            return Err(Error::InvalidUsage(format!(
                "rank {} refused the shared-memory connection: {why}",
                peer.rank
            )));
        }
        let bell =
            fds.pop().ok_or_else(|| Error::Internal("shared-memory answer without a doorbell".into()))?;
        Ok(ShmSend {
            sh: Shared {
                region,
                slots: slots as u64,
                slot_bytes,
                peer: peer.rank,
                peer_bell: EventFd::from_owned(bell),
            },
            head: 0,
            tail_seen: 0,
        })
    }

    /// Whether a slot is free.
    #[inline]
    pub fn ready(&mut self) -> bool {
        if self.head - self.tail_seen < self.sh.slots {
            return true;
        }
        self.tail_seen = self.sh.hdr().tail.0.load(Ordering::Acquire);
        self.head - self.tail_seen < self.sh.slots
    }

    /// The free slot (call only when [`ready`](Self::ready)) and its capacity.
    #[inline]
    pub fn slot(&self) -> (*mut u8, usize) {
        (self.sh.slot_ptr(self.head), self.sh.slot_bytes)
    }

    /// Publishes `len` bytes written into the slot.
    #[inline]
    pub fn commit(&mut self, len: usize, sig: &SigWords) {
        let h = self.sh.hdr();
        let i = (self.head % self.sh.slots) as usize;
        h.lens.0[i].store(len as u32, Ordering::Relaxed);
        for (k, w) in sig.iter().enumerate() {
            h.sigs.0[i][k].store(*w, Ordering::Relaxed);
        }
        self.head += 1;
        h.head.0.store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        if h.recv_sleeping.0.load(Ordering::Relaxed) != 0 {
            self.sh.peer_bell.notify();
        }
    }

    /// Announces that this side is about to sleep waiting for a free slot.
    pub fn arm(&self) {
        self.sh.hdr().send_sleeping.0.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    pub fn disarm(&self) {
        self.sh.hdr().send_sleeping.0.store(0, Ordering::Relaxed);
    }

    pub fn peer(&self) -> Rank {
        self.sh.peer
    }
}

impl ShmRecv {
    /// Maps the region a peer offered and checks its geometry.
    pub(crate) fn accept(
        me: Rank,
        peer: Rank,
        offer: ShmOffer,
        slots: usize,
        slot_bytes: usize,
    ) -> Result<ShmRecv> {
        let bad = |why: String| {
            Error::InvalidUsage(format!("rank {me}: shared-memory connection from rank {peer}: {why}"))
        };
        if offer.slots as usize != slots || offer.slot_bytes as usize != slot_bytes {
            return Err(bad(format!(
                "geometry {}×{} bytes differs from this rank's {slots}×{slot_bytes} (different NCCL_BUFFSIZE?)",
                offer.slots, offer.slot_bytes
            )));
        }
        if !(2..=MAX_SLOTS).contains(&slots) {
            return Err(bad(format!("{slots} slots")));
        }
        let region = ShmRegion::open(offer.region, region_bytes(slots, slot_bytes))
            .map_err(|e| Error::io(me, "map a shared-memory connection", Some(peer), e))?;
        let sh = Shared {
            region,
            slots: slots as u64,
            slot_bytes,
            peer,
            peer_bell: EventFd::from_owned(offer.doorbell),
        };
        let h = sh.hdr();
        if h.magic.0.load(Ordering::Acquire) != MAGIC
            || h.geometry.0[0].load(Ordering::Relaxed) as usize != slots
            || h.geometry.0[1].load(Ordering::Relaxed) as usize != slot_bytes
        {
            return Err(bad("header does not match the offer".into()));
        }
        Ok(ShmRecv { sh, tail: 0, head_seen: 0 })
    }

    /// Whether a chunk is waiting.
    #[inline]
    pub fn ready(&mut self) -> bool {
        if self.head_seen > self.tail {
            return true;
        }
        self.head_seen = self.sh.hdr().head.0.load(Ordering::Acquire);
        self.head_seen > self.tail
    }

    /// The waiting chunk (call only when [`ready`](Self::ready)): pointer and length, the
    /// length clamped to the slot.
    #[inline]
    pub fn chunk(&self) -> (*const u8, usize) {
        let len = self.sh.hdr().lens.0[(self.tail % self.sh.slots) as usize].load(Ordering::Relaxed) as usize;
        (self.sh.slot_ptr(self.tail), len.min(self.sh.slot_bytes))
    }

    /// The waiting chunk's signature (call only when [`ready`](Self::ready)).
    #[inline]
    pub fn sig(&self) -> SigWords {
        let s = &self.sh.hdr().sigs.0[(self.tail % self.sh.slots) as usize];
        [s[0].load(Ordering::Relaxed), s[1].load(Ordering::Relaxed), s[2].load(Ordering::Relaxed)]
    }

    /// Frees the chunk's slot for the sender.
    #[inline]
    pub fn release(&mut self) {
        let h = self.sh.hdr();
        self.tail += 1;
        h.tail.0.store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if h.send_sleeping.0.load(Ordering::Relaxed) != 0 {
            self.sh.peer_bell.notify();
        }
    }

    /// Announces that this side is about to sleep waiting for a chunk.
    pub fn arm(&self) {
        self.sh.hdr().recv_sleeping.0.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    pub fn disarm(&self) {
        self.sh.hdr().recv_sleeping.0.store(0, Ordering::Relaxed);
    }

    pub fn peer(&self) -> Rank {
        self.sh.peer
    }
}
