//! Shared-memory connections between processes (or threads) of one host.
//!
//! A connection is one memory region, created by the sender and handed to the receiver over
//! the receiver's Unix socket with the sender's doorbell; the receiver answers with its own.
//!
//! Layout: a header page, then three regions of `slots` slots each, one per protocol
//! (`oxccl_core::proto`): Simple slots of `slot_bytes`, LL slots of `ll_slot_bytes(slot_bytes)`
//! and LL128 slots of `ll128_slot_bytes(slot_bytes)`. Chunk `n` of the connection, whatever
//! its protocol, uses slot `n % slots` of its protocol's region.
//!
//! ```text
//! [magic][slots, slot_bytes][head][tail][recv_sleeping][send_sleeping][lens[MAX_SLOTS]]
//! [sigs[MAX_SLOTS] × 4 u64] pad → 4096
//! [Simple slot 0]…[Simple slot slots−1][LL slot 0]…[LL slot slots−1][LL128 slot 0]…
//! ```
//!
//! Rules (single producer, single consumer):
//! 1. Only the sender writes `head`, `lens` and `sigs` and the slots; only the receiver writes
//!    `tail` (chunks released). Both count from zero and never wrap in practice (u64).
//! 2. The sender fills chunk `n`'s slot only while `n − tail < slots`; it writes
//!    `lens[n % slots]` (the length, the protocol in its top 2 bits) and `sigs[n % slots]`, then:
//!    - Simple: the data, then a release store of `head = n + 1`;
//!    - LL / LL128: the chunk (head and data) in the protocol's flagged lines, with flag
//!      `flag_of(n)` (LL) or `n + 1` (LL128); `head` is not touched — the lines are the signal.
//! 3. The receiver takes chunk `tail` when an acquire load shows `head > tail` (then `lens`
//!    names its protocol: chunks before a published Simple chunk are complete), or else when
//!    the LL or LL128 slot `tail % slots` holds a complete chunk with `tail`'s flag. A region
//!    holds only its own protocol's lines, and a slot's previous use carried another step's
//!    flag, so stale lines never read as current. It releases with a release store of
//!    `tail + 1`, and never trusts a length beyond its slot.
//! 4. Sleeping (data before flag): a side that is about to sleep stores 1 to its `*_sleeping`
//!    flag, issues a SeqCst fence, and re-checks (the counter, or the flagged lines) before it
//!    sleeps; a side that publishes issues a SeqCst fence after its last store and rings the
//!    peer's doorbell if the peer's flag is set. One of the two always sees the other's
//!    store, so no wake-up is lost.
//! 5. Each header field sits on its own cache line, so the sender's and receiver's writes
//!    never share one.
//!
//! The header's side of rules 2–4 (the counters, `lens`, `sigs` and the sleeping flags) is
//! written as `Header`'s step functions over its atomics (`crate::sync`): the connection
//! calls them on the mapped header, and the model checks (`--features model`, `shm/model.rs`)
//! call them on a header in ordinary memory, one thread a side.

use crate::bootstrap::PeerInfo;
use crate::error::{Error, Result};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};
use crate::sys::fd::EventFd;
use crate::sys::shm::ShmRegion;
use crate::sys::unix::SeqSocket;
use crate::transport::host::{decode_offer_reply, ShmOffer, ShmOfferMsg};
use oxccl_core::contract::SigWords;
use oxccl_core::plan::ConnClass;
use oxccl_core::proto::{self, ChunkHead, Progress, Proto};
use oxccl_core::Rank;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Most slots a connection has.
pub const MAX_SLOTS: usize = 64;
/// Offset of slot 0 from the start of the region.
pub const DATA_OFFSET: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"OXSHM003");
/// `lens` bits that carry the length; the top two name the protocol.
const LEN_MASK: u32 = (1 << 30) - 1;

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

/// The protocol's steps on the header (rules 2–4), one function per step of a side.
impl Header {
    /// A header in ordinary memory, as `init_header` leaves a fresh region's (the tests).
    #[cfg(all(test, feature = "model"))]
    fn new(slots: usize, slot_bytes: usize) -> Box<Header> {
        let z = || Line(AtomicU32::new(0));
        Box::new(Header {
            magic: Line(AtomicU64::new(MAGIC)),
            geometry: Line([AtomicU32::new(slots as u32), AtomicU32::new(slot_bytes as u32)]),
            head: Line(AtomicU64::new(0)),
            tail: Line(AtomicU64::new(0)),
            recv_sleeping: z(),
            send_sleeping: z(),
            lens: Line(std::array::from_fn(|_| AtomicU32::new(0))),
            sigs: Line(std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0)))),
        })
    }

    /// Sender, rule 2: whether chunk `head` may be written into a ring of `slots`;
    /// `tail_seen` is the receiver's `tail` as last read, read again (acquire) when the ring
    /// looks full.
    #[inline]
    fn room(&self, head: u64, tail_seen: &mut u64, slots: u64) -> bool {
        if head - *tail_seen < slots {
            return true;
        }
        *tail_seen = self.tail.0.load(Ordering::Acquire);
        head - *tail_seen < slots
    }

    /// Sender, rule 2: slot `i`'s length word (the protocol in its top 2 bits) and signature,
    /// relaxed: the chunk's publication (counter or flagged lines) follows.
    #[inline]
    fn describe(&self, i: usize, len_tag: u32, sig: &SigWords) {
        self.lens.0[i].store(len_tag, Ordering::Relaxed);
        for (k, w) in sig.iter().enumerate() {
            self.sigs.0[i][k].store(*w, Ordering::Relaxed);
        }
    }

    /// Sender, rule 2 (Simple): publishes every chunk before `head` (release: the slot's data,
    /// length and signature written before it are visible to whoever sees the count).
    #[inline]
    fn publish(&self, head: u64) {
        self.head.0.store(head, Ordering::Release);
    }

    /// Receiver, rule 3: how many chunks the counter has published (acquire).
    #[inline]
    fn published(&self) -> u64 {
        self.head.0.load(Ordering::Acquire)
    }

    /// Receiver, rule 3: slot `i`'s length word, once its chunk is published.
    #[inline]
    fn len_tag(&self, i: usize) -> u32 {
        self.lens.0[i].load(Ordering::Relaxed)
    }

    /// Receiver, rule 3: slot `i`'s signature, once its chunk is published.
    #[inline]
    fn sig(&self, i: usize) -> SigWords {
        let s = &self.sigs.0[i];
        [s[0].load(Ordering::Relaxed), s[1].load(Ordering::Relaxed), s[2].load(Ordering::Relaxed)]
    }

    /// Receiver, rule 3: frees every chunk before `tail` (release: its reads of them are done).
    #[inline]
    fn free(&self, tail: u64) {
        self.tail.0.store(tail, Ordering::Release);
    }
}

/// Rule 4, the side about to sleep: announces it in its `*_sleeping` flag; it then checks
/// once more before it sleeps.
fn sleep_announce(flag: &AtomicU32) {
    flag.store(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// Rule 4, the side awake again.
fn sleep_end(flag: &AtomicU32) {
    flag.store(0, Ordering::Relaxed);
}

/// Rule 4, the side that published (after its last store): whether the peer announced that
/// it sleeps, so its doorbell must ring.
#[inline]
fn bell_needed(peer_flag: &AtomicU32) -> bool {
    fence(Ordering::SeqCst);
    peer_flag.load(Ordering::Relaxed) != 0
}

/// Bytes a connection's region needs.
pub fn region_bytes(slots: usize, slot_bytes: usize) -> usize {
    DATA_OFFSET
        + slots * (slot_bytes + proto::ll_slot_bytes(slot_bytes) + proto::ll128_slot_bytes(slot_bytes))
}

fn proto_tag(p: Proto) -> u32 {
    match p {
        Proto::Simple => 0,
        Proto::LL => 1,
        Proto::LL128 => 2,
    }
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
        // SAFETY: i < slots and the region holds DATA_OFFSET + slots × slot_bytes bytes first.
        unsafe { self.region.ptr().add(DATA_OFFSET + i * self.slot_bytes) }
    }

    /// Chunk `n`'s slot in the LL or LL128 region, as shared words.
    /// (oxccl-core's flagged lines, `std`'s atomics: not modelled.)
    fn flagged_slot(&self, p: Proto, n: u64) -> &[std::sync::atomic::AtomicU64] {
        let i = (n % self.slots) as usize;
        let simple = self.slots as usize * self.slot_bytes;
        let ll = proto::ll_slot_bytes(self.slot_bytes);
        let (off, bytes) = match p {
            Proto::LL128 => (simple + self.slots as usize * ll, proto::ll128_slot_bytes(self.slot_bytes)),
            _ => (simple, ll),
        };
        // SAFETY: the region holds the three regions (region_bytes); the offset is a multiple
        // of 128 from a page-aligned base, so the words are aligned; both sides access these
        // bytes only as atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.region.ptr().add(DATA_OFFSET + off + i * bytes) as *const std::sync::atomic::AtomicU64,
                bytes / 8,
            )
        }
    }
}

/// Writes a fresh region's header (before it is shared).
fn init_header(region: &ShmRegion, slots: usize, slot_bytes: usize) {
    // SAFETY: a fresh region of region_bytes ≥ DATA_OFFSET bytes, page-aligned; fields are atomics.
    let hdr = unsafe { &*(region.ptr() as *const Header) };
    hdr.geometry.0[0].store(slots as u32, Ordering::Relaxed);
    hdr.geometry.0[1].store(slot_bytes as u32, Ordering::Relaxed);
    hdr.magic.0.store(MAGIC, Ordering::Release);
}

/// The staging buffer a flagged chunk is built in or decoded into (the largest LL/LL128 chunk).
fn stage_for(slot_bytes: usize) -> Vec<u8> {
    vec![
        0u8;
        proto::chunk_capacity(Proto::LL, slot_bytes).max(proto::chunk_capacity(Proto::LL128, slot_bytes))
    ]
}

/// The sending end of a shared-memory connection.
pub struct ShmSend {
    sh: Shared,
    /// Chunks committed (of every protocol).
    head: u64,
    tail_seen: u64,
    /// Where an LL/LL128 chunk is built before it is written as flagged lines.
    stage: Vec<u8>,
}

/// The receiving end of a shared-memory connection.
pub struct ShmRecv {
    sh: Shared,
    tail: u64,
    head_seen: u64,
    /// The chunk at `tail` once found: its protocol and, if flagged, the decoding progress
    /// (complete when `done` reaches the head's length).
    cur: Option<(Proto, Progress)>,
    stage: Vec<u8>,
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
        init_header(&region, slots, slot_bytes);
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
        if n == 0 {
            // End of stream: the peer's service closed (its process or communicator ended).
            return Err(io("wait for a shared-memory answer")(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the peer closed its unix socket without answering",
            )));
        }
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
            stage: stage_for(slot_bytes),
        })
    }

    /// Places the region's slots on NUMA node `node` (before any chunk touches them; only
    /// the header page is touched at connect).
    pub fn prefer_node(&self, node: u32) -> std::io::Result<()> {
        self.sh.region.prefer_node(node)
    }

    /// Whether a slot is free.
    #[inline]
    pub fn ready(&mut self) -> bool {
        self.sh.hdr().room(self.head, &mut self.tail_seen, self.sh.slots)
    }

    /// Where to write the next chunk of protocol `p` (call only when [`ready`](Self::ready))
    /// and its capacity: the Simple slot itself, or the staging buffer of a flagged chunk.
    #[inline]
    pub fn slot(&mut self, p: Proto) -> (*mut u8, usize) {
        match p {
            Proto::Simple => (self.sh.slot_ptr(self.head), self.sh.slot_bytes),
            _ => (self.stage.as_mut_ptr(), proto::chunk_capacity(p, self.sh.slot_bytes)),
        }
    }

    /// Publishes the `len` bytes written where [`slot`](Self::slot) said, in protocol `p`.
    #[inline]
    pub fn commit(&mut self, len: usize, sig: &SigWords, p: Proto) {
        let len = len.min(proto::chunk_capacity(p, self.sh.slot_bytes));
        let h = self.sh.hdr();
        let n = self.head;
        let i = (n % self.sh.slots) as usize;
        h.describe(i, len as u32 | (proto_tag(p) << 30), sig);
        self.head += 1;
        let head = ChunkHead { len: len as u32, sig: *sig };
        match p {
            Proto::Simple => h.publish(self.head),
            Proto::LL => {
                proto::ll_write(self.sh.flagged_slot(p, n), &head, &self.stage[..len], proto::flag_of(n))
            }
            Proto::LL128 => proto::ll128_write(self.sh.flagged_slot(p, n), &head, &self.stage[..len], n + 1),
        }
        if bell_needed(&h.recv_sleeping.0) {
            self.sh.peer_bell.notify();
        }
    }

    /// Announces that this side is about to sleep waiting for a free slot.
    pub fn arm(&self) {
        sleep_announce(&self.sh.hdr().send_sleeping.0);
    }

    pub fn disarm(&self) {
        sleep_end(&self.sh.hdr().send_sleeping.0);
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
        let stage = stage_for(slot_bytes);
        Ok(ShmRecv { sh, tail: 0, head_seen: 0, cur: None, stage })
    }

    /// Decodes what has arrived of the flagged chunk at `tail`; whether it is complete.
    fn poll_flagged(&mut self, p: Proto, prog: &mut Progress) -> bool {
        let slot = self.sh.flagged_slot(p, self.tail);
        let cap = proto::chunk_capacity(p, self.sh.slot_bytes);
        match p {
            Proto::LL => proto::ll_poll(slot, proto::flag_of(self.tail), prog, &mut self.stage[..cap]),
            _ => proto::ll128_poll(slot, self.tail + 1, prog, &mut self.stage[..cap]),
        }
    }

    fn complete(cur: &Option<(Proto, Progress)>) -> bool {
        match cur {
            Some((Proto::Simple, _)) => true,
            Some((_, p)) => p.head.is_some_and(|h| p.done >= h.len as usize),
            None => false,
        }
    }

    /// Whether a chunk is waiting (complete, whatever its protocol).
    #[inline]
    pub fn ready(&mut self) -> bool {
        if Self::complete(&self.cur) {
            return true;
        }
        if self.head_seen <= self.tail {
            self.head_seen = self.sh.hdr().published();
        }
        let found = match self.cur {
            Some(c) => Some(c),
            None if self.head_seen > self.tail => {
                let tag = self.sh.hdr().len_tag((self.tail % self.sh.slots) as usize) >> 30;
                let p = match tag {
                    1 => Proto::LL,
                    2 => Proto::LL128,
                    _ => Proto::Simple,
                };
                Some((p, Progress::default()))
            }
            // Not published by a counter: look for flagged lines of this step in either region.
            None => [Proto::LL, Proto::LL128].into_iter().find_map(|p| {
                let mut prog = Progress::default();
                (self.poll_flagged(p, &mut prog) || prog.head.is_some()).then_some((p, prog))
            }),
        };
        let Some((p, mut prog)) = found else { return false };
        // A chunk found by its lines was just polled; one found before (or by the counter) is
        // polled now.
        if p != Proto::Simple
            && !Self::complete(&Some((p, prog)))
            && (self.cur.is_some() || self.head_seen > self.tail)
        {
            self.poll_flagged(p, &mut prog);
        }
        self.cur = Some((p, prog));
        Self::complete(&self.cur)
    }

    /// The waiting chunk (call only when [`ready`](Self::ready)): pointer and length, the
    /// length clamped to the slot.
    #[inline]
    pub fn chunk(&self) -> (*const u8, usize) {
        match self.cur {
            Some((Proto::Simple, _)) | None => {
                let len = self.sh.hdr().len_tag((self.tail % self.sh.slots) as usize) & LEN_MASK;
                (self.sh.slot_ptr(self.tail), (len as usize).min(self.sh.slot_bytes))
            }
            Some((_, p)) => (self.stage.as_ptr(), p.head.map_or(0, |h| h.len as usize)),
        }
    }

    /// The waiting chunk's signature (call only when [`ready`](Self::ready)).
    #[inline]
    pub fn sig(&self) -> SigWords {
        if let Some((_, Progress { head: Some(h), .. })) = self.cur {
            return h.sig;
        }
        self.sh.hdr().sig((self.tail % self.sh.slots) as usize)
    }

    /// Frees the chunk's slot for the sender.
    #[inline]
    pub fn release(&mut self) {
        let h = self.sh.hdr();
        self.cur = None;
        self.tail += 1;
        h.free(self.tail);
        if bell_needed(&h.send_sleeping.0) {
            self.sh.peer_bell.notify();
        }
    }

    /// Announces that this side is about to sleep waiting for a chunk.
    pub fn arm(&self) {
        sleep_announce(&self.sh.hdr().recv_sleeping.0);
    }

    pub fn disarm(&self) {
        sleep_end(&self.sh.hdr().recv_sleeping.0);
    }

    pub fn peer(&self) -> Rank {
        self.sh.peer
    }
}

#[cfg(all(test, feature = "model"))]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends of one connection in this process (no bootstrap).
    fn pair(slots: usize, slot_bytes: usize) -> (ShmSend, ShmRecv) {
        let region = ShmRegion::create("oxccl-test", region_bytes(slots, slot_bytes)).unwrap();
        init_header(&region, slots, slot_bytes);
        let fd = region.try_clone_fd().unwrap();
        let (to_send, to_recv) = (EventFd::new().unwrap(), EventFd::new().unwrap());
        let offer = ShmOffer {
            region: fd,
            doorbell: to_send.try_clone_fd().unwrap(),
            slots: slots as u32,
            slot_bytes: slot_bytes as u32,
        };
        let recv = ShmRecv::accept(Rank::new(1), Rank::new(0), offer, slots, slot_bytes).unwrap();
        let sh = Shared { region, slots: slots as u64, slot_bytes, peer: Rank::new(1), peer_bell: to_recv };
        (ShmSend { sh, head: 0, tail_seen: 0, stage: stage_for(slot_bytes) }, recv)
    }

    fn chunk_data(n: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u64).wrapping_mul(131).wrapping_add(n * 7) as u8).collect()
    }

    #[test]
    fn chunks_of_every_protocol_interleave_on_one_connection() {
        let slot_bytes = 64 << 10;
        let (mut tx, mut rx) = pair(4, slot_bytes);
        let protos =
            [Proto::LL, Proto::Simple, Proto::LL128, Proto::LL128, Proto::LL, Proto::LL, Proto::Simple];
        let (mut sent, mut got) = (0u64, 0u64);
        let total = 40u64;
        let mut simple_commits = 0u64;
        while got < total {
            // Fill as far as the ring allows, then drain part of it.
            while sent < total && tx.ready() {
                let p = protos[sent as usize % protos.len()];
                let cap = proto::chunk_capacity(p, slot_bytes);
                let len = [0, 1, 13, cap - 1, cap][sent as usize % 5];
                let d = chunk_data(sent, len);
                let (ptr, room) = tx.slot(p);
                assert_eq!(room, cap);
                // SAFETY: the slot (or staging buffer) holds `room` ≥ len bytes.
                unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), ptr, len) };
                tx.commit(len, &[sent, !sent, 3], p);
                if p == Proto::Simple {
                    simple_commits = sent + 1;
                }
                // Flagged chunks never move the head counter: their lines are the signal.
                assert_eq!(tx.sh.hdr().head.0.load(Ordering::Relaxed), simple_commits);
                sent += 1;
            }
            for _ in 0..3 {
                if got == sent {
                    break;
                }
                assert!(rx.ready(), "chunk {got} not ready");
                let p = protos[got as usize % protos.len()];
                let len = [
                    0,
                    1,
                    13,
                    proto::chunk_capacity(p, slot_bytes) - 1,
                    proto::chunk_capacity(p, slot_bytes),
                ][got as usize % 5];
                let (ptr, n) = rx.chunk();
                assert_eq!(n, len, "chunk {got} ({p})");
                // SAFETY: a ready chunk of n bytes.
                let bytes = unsafe { std::slice::from_raw_parts(ptr, n) };
                assert_eq!(bytes, &chunk_data(got, len)[..], "chunk {got} ({p})");
                assert_eq!(rx.sig(), [got, !got, 3]);
                rx.release();
                got += 1;
            }
        }
        assert!(!rx.ready());
    }

    #[test]
    fn a_partly_written_ll_chunk_in_shared_memory_is_not_ready() {
        // The chunk as the sender would write it, built aside, then copied into the
        // connection's slot word by word in the sender's order (LL also in reverse, which its
        // lines allow; LL128 lines need their flag word last).
        for (p, reverse) in [(Proto::LL, false), (Proto::LL, true), (Proto::LL128, false)] {
            let slot_bytes = 8192;
            let (tx, mut rx) = pair(2, slot_bytes);
            let slot = tx.sh.flagged_slot(p, 0);
            let aside: Vec<std::sync::atomic::AtomicU64> =
                (0..slot.len()).map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
            let d = chunk_data(9, 1000);
            let head = ChunkHead { len: 1000, sig: [1, 2, 3] };
            match p {
                Proto::LL => proto::ll_write(&aside, &head, &d, proto::flag_of(0)),
                _ => proto::ll128_write(&aside, &head, &d, 1),
            }
            let mut words: Vec<usize> =
                (0..slot.len()).filter(|&i| aside[i].load(Ordering::Relaxed) != 0).collect();
            if reverse {
                words.reverse();
            }
            for (k, &i) in words.iter().enumerate() {
                assert!(!rx.ready(), "{p}: ready after {k} of {} words", words.len());
                slot[i].store(aside[i].load(Ordering::Relaxed), Ordering::Release);
            }
            assert!(rx.ready(), "{p}");
            let (ptr, n) = rx.chunk();
            // SAFETY: a ready chunk of n bytes.
            assert_eq!(unsafe { std::slice::from_raw_parts(ptr, n) }, &d[..]);
            assert_eq!(rx.sig(), [1, 2, 3]);
        }
    }
}
