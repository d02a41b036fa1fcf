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
//!
//! Rules 1, 3 and 4 are written as step functions over the block's atomics (`crate::sync`):
//! [`Post::publish`] and [`Post::posted`], [`Header::finish`] and [`Header::finished`]
//! (`done`), [`Header::finish_first`] and [`Header::finished_first`] (`mid`),
//! [`Header::sleep_announce`], [`publisher_fence`] and [`Header::asleep`]. The direct path
//! calls them on the mapped blocks (a [`Ctl`] dereferences to its [`Header`]);
//! the model check (`--features model`, the `model` tests below) calls them on blocks in
//! ordinary memory, one thread a rank.

use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};
use crate::sys::shm::ShmRegion;
use oxccl_core::tuning::DIRECT_INLINE_BYTES;

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

impl Post {
    /// Owner, rule 1: publishes call `s` in this post, its flags and signature stored
    /// (relaxed) after the meta and inline data already written, then `seq = s` (release).
    #[inline]
    pub fn publish(&self, s: u64, flags: u32, sig: &[u64; 3]) {
        let h = &self.head.0;
        h.flags.store(flags, Ordering::Relaxed);
        for (k, x) in sig.iter().enumerate() {
            h.sig[k].store(*x, Ordering::Relaxed);
        }
        h.seq.store(s, Ordering::Release);
    }

    /// Peer, rule 1: whether the owner posted call `s` here (acquire: then what the owner
    /// wrote before, meta and inline data, is visible).
    #[inline]
    pub fn posted(&self, s: u64) -> bool {
        self.head.0.seq.load(Ordering::Acquire) == s
    }

    /// Peer, once [`posted`](Self::posted): the call's flags.
    #[inline]
    pub fn flags(&self) -> u32 {
        self.head.0.flags.load(Ordering::Relaxed)
    }

    /// Peer, once [`posted`](Self::posted): the call's signature.
    #[inline]
    pub fn sig(&self) -> [u64; 3] {
        [0, 1, 2].map(|k| self.head.0.sig[k].load(Ordering::Relaxed))
    }
}

/// A control block's fields; a [`Ctl`] dereferences to its mapped one.
#[repr(C)]
pub struct Header {
    magic: Line<AtomicU64>,
    done: Line<AtomicU64>,
    sleeping: Line<AtomicU32>,
    probe: Line<[AtomicU64; 2]>,
    posts: [Post; 2],
    mid: Line<AtomicU64>,
    cpu: Line<AtomicU32>,
}

const _: () = assert!(std::mem::size_of::<Header>() <= INLINE_AT);
// The layout above (loom's atomics, `--features model`, are all of a word, so not there).
#[cfg(not(feature = "model"))]
const _: () = {
    assert!(std::mem::size_of::<Head>() == 64 && std::mem::size_of::<Meta>() == 64);
    assert!(std::mem::offset_of!(Header, posts) == 256 && std::mem::size_of::<Post>() == 128);
    assert!(std::mem::offset_of!(Header, mid) == 512);
    assert!(std::mem::offset_of!(Header, cpu) == 576);
};

/// Flag: this rank's buffers are shared allocations (zero-copy capable).
pub const FLAG_SHARED: u32 = 1;
/// Flag: this rank copied its contribution into its inline area.
pub const FLAG_INLINE: u32 = 2;
/// Flag: this rank may read every peer's memory (process_vm_readv) and posted its buffers'
/// addresses for that.
pub const FLAG_CMA: u32 = 4;

/// Rule 4, a rank that published (after its last store, before it looks at its peers'
/// [`Ctl::asleep`]): a sleeping peer then either sees the publication when it checks again
/// or is seen asleep.
#[inline]
pub fn publisher_fence() {
    fence(Ordering::SeqCst);
}

const PROBE_NONCE_AT: usize = std::mem::offset_of!(Header, probe) + 8;

/// The block's steps (rules 1, 3 and 4), called through [`Ctl`] on the mapped block and by
/// the model check on one in ordinary memory.
impl Header {
    /// A block in ordinary memory, as [`Ctl::create`] leaves a fresh one (the model check).
    #[cfg(all(test, feature = "model"))]
    fn new() -> Box<Header> {
        let post = || Post {
            head: Line(Head {
                seq: AtomicU64::new(0),
                flags: AtomicU32::new(0),
                nbufs: AtomicU32::new(0),
                sig: std::array::from_fn(|_| AtomicU64::new(0)),
                small: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
            meta: Line(Meta {
                desc: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
                addr: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        };
        Box::new(Header {
            magic: Line(AtomicU64::new(MAGIC)),
            done: Line(AtomicU64::new(0)),
            sleeping: Line(AtomicU32::new(0)),
            probe: Line([AtomicU64::new(0), AtomicU64::new(0)]),
            posts: [post(), post()],
            mid: Line(AtomicU64::new(0)),
            cpu: Line(AtomicU32::new(0)),
        })
    }

    /// The post of call `seq` (rule 1).
    #[inline]
    pub fn post(&self, seq: u64) -> &Post {
        &self.posts[(seq % 2) as usize]
    }

    /// Owner, rule 3: its part of call `s` is finished (release).
    #[inline]
    pub fn finish(&self, s: u64) {
        self.done.0.store(s, Ordering::Release);
    }

    /// Peer, rule 3: whether the owner finished its part of call `s` (acquire).
    #[inline]
    pub fn finished(&self, s: u64) -> bool {
        self.done.0.load(Ordering::Acquire) >= s
    }

    /// Owner, rule 3: the first phase of call `s` is finished (release).
    #[inline]
    pub fn finish_first(&self, s: u64) {
        self.mid.0.store(s, Ordering::Release);
    }

    /// Peer, rule 3: whether the owner finished the first phase of call `s` (acquire).
    #[inline]
    pub fn finished_first(&self, s: u64) -> bool {
        self.mid.0.load(Ordering::Acquire) >= s
    }

    /// Owner, rule 4: about to sleep (then it checks once more before sleeping).
    #[inline]
    pub fn sleep_announce(&self) {
        self.sleeping.0.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Owner, rule 4: awake again.
    #[inline]
    pub fn sleep_end(&self) {
        self.sleeping.0.store(0, Ordering::Relaxed);
    }

    /// Peer, rule 4 (after [`publisher_fence`]): whether the owner sleeps, or is about to.
    #[inline]
    pub fn asleep(&self) -> bool {
        self.sleeping.0.load(Ordering::Relaxed) != 0
    }
}

impl std::ops::Deref for Ctl {
    type Target = Header;

    /// The block's fields and steps ([`Header`]).
    #[inline]
    fn deref(&self) -> &Header {
        self.hdr()
    }
}

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

    #[inline]
    fn hdr(&self) -> &Header {
        // SAFETY: the region holds CTL_BYTES ≥ size_of::<Header>() bytes, is page-aligned, and
        // every Header field is an atomic (or padding), so shared references are sound while
        // other processes access it.
        unsafe { &*(self.region.ptr() as *const Header) }
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

    /// The CPU hint (the layout's `cpu` line): 0 unknown, else the CPU number plus one.
    pub fn cpu(&self) -> &AtomicU32 {
        &self.hdr().cpu.0
    }

    /// A duplicate of the block's descriptor, for a peer.
    pub fn try_clone_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.region.try_clone_fd()
    }
}

#[cfg(test)]
mod tests {
    /// Model check of the block's rules 1–4 under loom: two ranks, a thread each, with blocks
    /// in ordinary memory, making calls as the direct path makes them (`Direct::run`). The
    /// bytes the path moves with plain copies (inline areas, users' buffers) are loom cells:
    /// one written while another rank may read it, or read before its writer published it,
    /// is a data race that loom reports.
    #[cfg(feature = "model")]
    mod model {
        use super::super::*;
        use crate::sync::{plain_read, plain_write, Plain};
        use loom::sync::{Arc, Notify};
        use loom::thread;

        /// Calls 1 to 3 inline (call 3 reuses post and inline area 1: rule 2), call 4
        /// zero-copy (post 0 again; the end barrier of rule 3).
        const CALLS: u64 = 4;
        const ZERO_COPY: u64 = 4;

        /// One rank: its block, what the direct path writes with plain stores beside it,
        /// and its doorbell.
        struct Rank {
            blk: Box<Header>,
            /// The inline areas (`Ctl::inline`).
            inline: [Plain; 2],
            /// The user's send buffer and, per rank, its part of the receive buffer (a
            /// zero-copy call: each rank writes its share of every rank's output).
            src: Plain,
            dst: [Plain; 2],
            bell: Notify,
        }

        fn sig_of(r: usize, s: u64) -> [u64; 3] {
            [s, r as u64, 0xc0de]
        }
        fn contrib(r: usize, s: u64) -> u64 {
            1000 * s + r as u64
        }

        /// Waits until `ready()`: spinning, or (`sleep`) by rule 4 on the rank's doorbell.
        fn wait(me: &Rank, sleep: bool, ready: impl Fn() -> bool) {
            while !ready() {
                if !sleep {
                    thread::yield_now();
                    continue;
                }
                me.blk.sleep_announce();
                if !ready() {
                    me.bell.wait();
                }
                me.blk.sleep_end();
            }
        }

        /// Rule 4 after a publication (`Direct::wake`).
        fn wake(peer: &Rank) {
            publisher_fence();
            if peer.blk.asleep() {
                peer.bell.notify();
            }
        }

        /// Rank `me`'s calls, as `Direct::run` makes them.
        fn rank(all: &[Rank; 2], me: usize, sleep: bool) {
            let (mine, theirs, peer) = (&all[me], &all[1 - me], 1 - me);
            for s in 1..=CALLS {
                let zc = s == ZERO_COPY;
                // The user's buffer, written before the call.
                plain_write(&mine.src, contrib(me, s));
                if !zc {
                    plain_write(&mine.inline[(s % 2) as usize], contrib(me, s));
                }
                mine.blk.post(s).publish(s, if zc { FLAG_SHARED } else { FLAG_INLINE }, &sig_of(me, s));
                wake(theirs);
                wait(mine, sleep, || theirs.blk.post(s).posted(s));
                let post = theirs.blk.post(s);
                assert_eq!(post.sig(), sig_of(peer, s), "call {s}: rank {peer}'s signature");
                assert_eq!(post.flags(), if zc { FLAG_SHARED } else { FLAG_INLINE }, "call {s}'s flags");
                if !zc {
                    let v = plain_read(&theirs.inline[(s % 2) as usize]);
                    assert_eq!(v, contrib(peer, s), "call {s}: rank {peer}'s inline contribution");
                    continue;
                }
                // Zero-copy: read the peer's buffer, write this rank's share of its output.
                let v = plain_read(&theirs.src);
                assert_eq!(v, contrib(peer, s), "call {s}: rank {peer}'s buffer");
                plain_write(&theirs.dst[me], contrib(me, s) + v);
                mine.blk.finish(s);
                wake(theirs);
                wait(mine, sleep, || theirs.blk.finished(s));
                // Returned: the user reads the result and reuses the buffers.
                let got = plain_read(&mine.dst[peer]);
                assert_eq!(got, contrib(peer, s) + contrib(me, s), "call {s}: rank {peer}'s share");
                plain_write(&mine.src, 0);
            }
        }

        fn run(sleep: bool) {
            let new = || Rank {
                blk: Header::new(),
                inline: [Plain::new(0), Plain::new(0)],
                src: Plain::new(0),
                dst: [Plain::new(0), Plain::new(0)],
                bell: Notify::new(),
            };
            let all = Arc::new([new(), new()]);
            let other = {
                let all = all.clone();
                thread::spawn(move || rank(&all, 1, sleep))
            };
            rank(&all, 0, sleep);
            other.join().unwrap();
        }

        /// Rules 1–3: every peer's post is read as posted (signature, flags, inline data,
        /// buffer), a post or inline area is never rewritten while a peer may read it, and
        /// no buffer is reused while a peer may touch it.
        #[test]
        fn model_direct_posts_and_end_barrier() {
            let n =
                crate::sync::model("direct: 2 ranks, 3 inline calls and 1 zero-copy", None, || run(false));
            assert!(n > 1);
        }

        /// Rule 4 besides: ranks sleep on their doorbells whenever they wait; every sleep
        /// ends (a lost wake-up is a deadlock, which loom reports). Interleavings of at most
        /// 2 preemptions (loom's bound; 3 took 27 s).
        #[test]
        fn model_direct_sleeping_ranks_are_always_woken() {
            let n = crate::sync::model("direct sleep: 2 ranks, 4 calls, ranks sleep", Some(2), || run(true));
            assert!(n > 1);
        }
    }
}
