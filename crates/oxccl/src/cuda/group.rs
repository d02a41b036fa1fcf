//! Ranks as threads of one process on one device: every collective and send/receive on device
//! buffers, enqueued on each rank's stream, the data moved by the reduce-copy kernels reading
//! and writing the other ranks' buffers directly (one context, so no IPC mapping is needed),
//! with the work split by oxccl-core's `plan::device` (each input byte read once, each output
//! byte written once).
//!
//! A lone small all-reduce (a group of one call, LL) skips the host meeting: see
//! `Member::run_lone_ll` and `Shared::wait_issued`. Other groups of calls (a single call
//! is a group of one):
//! - collectives: the threads meet once on the host (`Shared::exchange`) to hand every rank
//!   the same table of buffers and call descriptions; a mismatch or a refusal makes every rank
//!   refuse, and none launches. Each rank then launches its collective tasks, packed into as
//!   few launches as kernels allow (`call::collective_units`), and each launch meets the same
//!   launch of the other ranks on the GPU (`Sync` in kernels.cu): at its start it waits until
//!   every rank's stream has reached it (inputs written, outputs free), at its end until every
//!   block of every rank has finished (so work after the call may use the result and reuse
//!   the input). Nothing on the host waits for the GPU.
//! - sends and receives: a sender posts its buffer in the pair's mailbox and never waits on
//!   the host; a receiver takes the matching post (waiting for the sender's call if need be)
//!   and copies out of the sender's buffer. On the GPU, the sender's launch publishes its
//!   count of sends to that peer; the receiver's launch waits for it before copying and then
//!   publishes its count of receives, which the sender's launch waits for before it ends.
//!
//! The GPU meeting needs every block of the p kernels resident at once: each rank launches at
//! most `blocks_per_sm * SMs / p` blocks, `blocks_per_sm` no more than the multiprocessor holds
//! (the occupancy the driver reports). A kernel that waits longer than the group's timeout
//! gives up, records which rank it waited for (in host-mapped memory, read by the next call
//! without touching the stream), and every later call of the group fails with that culprit.
//! A rank's launches run in order even across streams: switching streams makes the new one
//! wait for the old (the GPU meeting counts launches, so two launches of one rank must never
//! overlap).

use super::call::{self, DevCall, What};
use super::kernels::{Kernels, Kop, LineProto, Sync, BLOCK_THREADS};
use super::{CudaError, DevBuf, Device, Event, Stream};
use oxccl_core::plan::device::{self, Bufs, Task, MAX_RANKS};
use oxccl_core::{DataType, ReduceOp};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What one rank brings to a meeting: its collectives and stream, or why it refuses the group.
#[derive(Clone, Default, Debug)]
struct Entry {
    calls: Vec<DevCall>,
    refuse: Option<String>,
    stream: usize,
    /// Its receives with bytes to copy (see `merges`).
    recv_tasks: usize,
}

/// `CU_STREAM_LEGACY` (and the null stream, which means it): one stream for every thread of
/// the context, which also waits for every blocking stream.
fn legacy(stream: usize) -> bool {
    stream <= 1
}

#[derive(Default)]
struct Round {
    generation: u64,
    arrived: usize,
    present: Vec<bool>,
    vals: Vec<Entry>,
    out: Arc<Vec<Entry>>,
}

/// A send posted for its receiver.
#[derive(Clone, Copy, Debug)]
struct Post {
    buf: u64,
    t: DataType,
    count: usize,
}

/// How long a rank spins for the others at a meeting before it sleeps.
const MEET_SPIN: Duration = Duration::from_micros(50);

/// Device memory of the GPU meeting (see kernels.cu's `Sync`): `arr[8]` at 0, `dep` at 128,
/// `fail` at 192, `mydep[8]` at 256, `pready[64]` at 512, `pdone[64]` at 1024.
const BAR_BYTES: usize = 2048;

/// All-reduces of at most this many bytes run as LL (one flag exchange, no meeting) unless
/// `NCCL_PROTO` leaves LL out or `OXCCL_DEVICE_LL=0`.
pub const LL_MAX_BYTES: usize = 16 << 10;
/// LL data lines per slot: 8 payload bytes each (each slot has one more, the signature's).
const LL_LINES: usize = LL_MAX_BYTES / 8;

/// All-reduces above [`LL_MAX_BYTES`] and up to this run as LL128 unless `NCCL_PROTO` leaves
/// LL128 out or `OXCCL_DEVICE_LL128=0`.
pub const LL128_MAX_BYTES: usize = 256 << 10;
/// LL128 data lines per slot: 120 payload bytes each (each slot has one more, the
/// signature's).
const LL128_LINES: usize = LL128_MAX_BYTES.div_ceil(120);

// The slots hold the largest call of each protocol, and the LL128 buffer stays small (p = 8:
// under 40 MB).
const _: () = {
    assert!(LL_LINES * 8 >= LL_MAX_BYTES);
    assert!(LL128_LINES * 120 >= LL128_MAX_BYTES && (LL128_LINES - 1) * 120 < LL128_MAX_BYTES);
    assert!(8 * 2 * 8 * (LL128_LINES + 1) * 128 < 40 << 20);
};

/// What one rank announces about its collective calls (numbered from 1, every rank alike),
/// on a cache line of its own: the other ranks read it at every call.
#[repr(align(64))]
#[derive(Default)]
struct Announced {
    /// Its latest collective call made alone as LL, without the host meeting.
    fast: AtomicU64,
    /// Its latest collective call that came to the host meeting.
    meet: AtomicU64,
    /// Its latest stream (0: none yet), to refuse a stream two ranks share.
    stream: AtomicUsize,
    /// Its latest collective call whose launches are all enqueued (or that it refused).
    issued: AtomicU64,
}

/// Says rank `.1` has enqueued collective call `.2` when dropped: on every way out of a call.
struct IssuedOnDrop<'a>(&'a Shared, usize, u64);

impl Drop for IssuedOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_issued(self.1, self.2);
    }
}

/// Whether the settings allow the LL protocol on device buffers: `OXCCL_DEVICE_LL=0`
/// forbids it, and so does an `NCCL_PROTO` that leaves `LL` out for all-reduce (`Simple`, `^LL`).
pub fn ll_allowed() -> bool {
    crate::env::device().ll
}

/// Whether the settings allow LL128 on device buffers: `OXCCL_DEVICE_LL128=0` forbids it,
/// and so does an `NCCL_PROTO` that leaves `LL128` out for all-reduce.
pub fn ll128_allowed() -> bool {
    crate::env::device().ll128
}

struct Shared {
    p: usize,
    /// `Round::generation`, readable without the lock (for the spin).
    generation: AtomicU64,
    round: Mutex<Round>,
    cv: Condvar,
    /// Sends posted and not yet taken, per (sender, receiver), in order.
    mail: Mutex<HashMap<(usize, usize), VecDeque<Post>>>,
    mail_cv: Condvar,
    /// Set when a rank gave up waiting on the host: the group is unusable from then on.
    broken: Mutex<Option<String>>,
    /// Longest wait at a meeting, on the host and on the GPU; `None`: forever.
    timeout: Option<Duration>,
    /// The GPU meeting's counters (zeroed at creation).
    bar: Option<DevBuf>,
    /// Host address and device address of the host-mapped failure record `u32[4]`.
    fail_host: usize,
    fail_dev: u64,
    /// For synchronising before the counters are freed.
    dev: Option<Device>,
    /// The device every member uses, and the kernels loaded on it.
    ordinal: i32,
    kernels: Option<Arc<Kernels>>,
    /// Which ranks have joined (by [`join`]).
    joined: Mutex<Vec<bool>>,
    /// Per rank: how its latest collective calls went, and its latest stream.
    announced: Vec<Announced>,
    /// Ranks asleep in `wait_issued`, and where they sleep (woken by `set_issued`).
    issued_sleepers: AtomicUsize,
    issued_mx: Mutex<()>,
    issued_cv: Condvar,
    /// The LL buffer: `p * 2 * p * (LL_LINES + 1)` lines of 16 bytes (zeroed at creation).
    ll: Option<DevBuf>,
    /// The LL128 buffer: `p * 2 * p * (LL128_LINES + 1)` lines of 128 bytes (zeroed).
    ll128: Option<DevBuf>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Kernels still queued read the counters: let them finish before the memory goes.
        if let Some(d) = &self.dev {
            if d.make_current().is_ok() {
                // SAFETY: no arguments; waits for the context's work.
                let _ = unsafe { (d.d.ctx_synchronize)() };
            }
        }
    }
}

impl Shared {
    fn new(p: usize, timeout: Option<Duration>) -> Shared {
        Shared {
            p,
            generation: Default::default(),
            round: Mutex::new(Round::default()),
            cv: Condvar::new(),
            mail: Mutex::new(HashMap::new()),
            mail_cv: Condvar::new(),
            broken: Mutex::new(None),
            timeout,
            bar: None,
            fail_host: 0,
            fail_dev: 0,
            dev: None,
            ordinal: 0,
            kernels: None,
            joined: Mutex::new(vec![false; p]),
            announced: (0..p).map(|_| Announced::default()).collect(),
            issued_sleepers: AtomicUsize::new(0),
            issued_mx: Mutex::new(()),
            issued_cv: Condvar::new(),
            ll: None,
            ll128: None,
        }
    }

    /// A group's shared state on device `ordinal`: counters zeroed, kernels loaded.
    fn create(p: usize, ordinal: i32, timeout: Option<Duration>) -> Result<Shared, CudaError> {
        if !(1..=MAX_RANKS).contains(&p) {
            return Err(CudaError::Invalid(format!("a thread group has 1 to {MAX_RANKS} ranks, not {p}")));
        }
        let dev = Device::open(ordinal)?;
        let bar = DevBuf::new(&dev, BAR_BYTES)?;
        let ll_bytes = p * 2 * p * (LL_LINES + 1) * 16;
        let ll = DevBuf::new(&dev, ll_bytes)?;
        let ll128_bytes = p * 2 * p * (LL128_LINES + 1) * 128;
        let ll128 = DevBuf::new(&dev, ll128_bytes)?;
        let zero = Stream::new(&dev)?;
        zero.fill(bar.ptr, 0, BAR_BYTES)?;
        zero.fill(ll.ptr, 0, ll_bytes)?;
        zero.fill(ll128.ptr, 0, ll128_bytes)?;
        zero.sync()?;
        let (fail_host, fail_dev) = super::stage::stream_flag()?;
        // SAFETY: the flag is 64 bytes of pinned memory, leaked, nothing uses it yet.
        unsafe { std::ptr::write_bytes(fail_host as *mut u8, 0, 16) };
        let mut shared = Shared::new(p, timeout);
        shared.kernels = Some(Arc::new(Kernels::load(&dev, &[])?));
        shared.bar = Some(bar);
        shared.ll = Some(ll);
        shared.ll128 = Some(ll128);
        shared.fail_host = fail_host;
        shared.fail_dev = fail_dev;
        shared.ordinal = ordinal;
        shared.dev = Some(dev);
        Ok(shared)
    }

    fn broken(&self) -> Option<String> {
        self.broken.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn break_with(&self, why: String) {
        let mut b = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_none() {
            *b = Some(why);
        }
        drop(b);
        let _r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
        let _m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        self.mail_cv.notify_all();
        let _i = self.issued_mx.lock().unwrap_or_else(|e| e.into_inner());
        self.issued_cv.notify_all();
    }

    /// Rank `rank` launches its collective call `g` as a lone LL all-reduce: a rank that
    /// came to the host meeting for call `g` instead, if one has. (A rank's meeting number
    /// cannot pass `g` while this rank has not met.)
    fn announce_fast(&self, rank: usize, g: u64) -> Option<usize> {
        let ann = &self.announced;
        ann[rank].fast.store(g, Ordering::SeqCst);
        (0..self.p).find(|&q| q != rank && ann[q].meet.load(Ordering::SeqCst) == g)
    }

    /// Rank `rank` comes to the host meeting for its collective call `g`: a rank that
    /// launched call `g` (or a later one) as a lone LL all-reduce instead, if one has: it
    /// will never come. Of two ranks announcing differently, at least one sees the other
    /// (each stores, then loads; sequentially consistent).
    fn announce_meet(&self, rank: usize, g: u64) -> Option<usize> {
        let ann = &self.announced;
        ann[rank].meet.store(g, Ordering::SeqCst);
        (0..self.p).find(|&q| q != rank && ann[q].fast.load(Ordering::SeqCst) >= g)
    }

    /// Waits until every rank has enqueued the launches of its collective call `g` (or
    /// refused it): a rank's launches of call `g + 1` must not be enqueued before then. Streams
    /// share the GPU's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS), each in order: work
    /// waiting at a queue's head (a launch behind this rank's spinning kernel, a stream's wait
    /// for an event) holds up the work behind it, so a kernel another rank's kernel waits
    /// for must never be enqueued behind it. The host meeting keeps this order by itself;
    /// lone LL calls, which skip it, keep it here (one call behind the slowest rank, where
    /// the meeting would wait for the slowest rank's current call).
    fn wait_issued(&self, rank: usize, g: u64) -> Result<(), CudaError> {
        let behind = |q: &usize| self.announced[*q].issued.load(Ordering::Acquire) < g;
        if g == 0 || !(0..self.p).any(|q| behind(&q)) {
            return Ok(());
        }
        let t = Instant::now();
        while t.elapsed() < MEET_SPIN {
            if !(0..self.p).any(|q| behind(&q)) {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        // Asleep until `set_issued` (or `break_with`) wakes it: it counts itself a sleeper,
        // then checks under the lock; a setter stores, then looks for sleepers, and
        // notifies under the lock, so one of the two sees the other.
        let mut guard = self.issued_mx.lock().unwrap_or_else(|e| e.into_inner());
        self.issued_sleepers.fetch_add(1, Ordering::SeqCst);
        let out = loop {
            let Some(q) = (0..self.p).find(behind) else { break Ok(()) };
            if self.broken().is_some() {
                break Err(self.unusable(rank));
            }
            let waited = t.elapsed();
            let left = match self.timeout {
                Some(limit) if waited > limit => {
                    let why = format!(
                        "rank {rank} waited {limit:?} for rank {q} to make collective call {g}, which it never did"
                    );
                    break Err(CudaError::Invalid(why));
                }
                Some(limit) => limit - waited,
                None => Duration::from_secs(3600),
            };
            guard = self.issued_cv.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0;
        };
        self.issued_sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
        if let Err(CudaError::Invalid(why)) = &out {
            if self.broken().is_none() {
                self.fail_group(rank, why.clone());
            }
        }
        out
    }

    /// Rank `rank` has enqueued the launches of its collective call `g` (or refused it).
    fn set_issued(&self, rank: usize, g: u64) {
        self.announced[rank].issued.store(g, Ordering::SeqCst);
        if self.issued_sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.issued_mx.lock().unwrap_or_else(|e| e.into_inner());
            self.issued_cv.notify_all();
        }
    }

    /// Breaks the group when other ranks' kernels may already wait for this rank's: also
    /// tells those kernels (through the host-mapped failure record, which LL kernels poll)
    /// to give up.
    fn fail_group(&self, rank: usize, why: String) {
        self.break_with(why);
        if self.fail_host != 0 {
            // SAFETY: the failure record is 16 bytes of pinned host memory, aligned, leaked by
            // this group; the GPU writes it only after winning the device-side flag, and a
            // lost race only changes which failure the record names.
            let code = unsafe { AtomicU32::from_ptr(self.fail_host as *mut u32) };
            let _ = code.compare_exchange(
                0,
                1 | ((rank as u32) << 8) | (0xff << 16) | (5 << 24),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    fn unusable(&self, rank: usize) -> CudaError {
        CudaError::Invalid(format!(
            "rank {rank}: the group is unusable: {}",
            self.broken().unwrap_or_default()
        ))
    }

    /// Every rank's `v` for this round, once all have given theirs; an error naming the
    /// missing ranks if they did not come within the timeout (the group is then broken).
    fn exchange(&self, rank: usize, v: Entry) -> Result<Arc<Vec<Entry>>, CudaError> {
        if self.broken().is_some() {
            return Err(self.unusable(rank));
        }
        let mut r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        if r.vals.len() != self.p {
            r.vals = vec![Entry::default(); self.p];
            r.present = vec![false; self.p];
        }
        r.vals[rank] = v;
        r.present[rank] = true;
        r.arrived += 1;
        if r.arrived == self.p {
            r.out = Arc::new(std::mem::take(&mut r.vals));
            r.vals = vec![Entry::default(); self.p];
            r.arrived = 0;
            r.present.iter_mut().for_each(|x| *x = false);
            r.generation += 1;
            self.generation.store(r.generation, Ordering::Release);
            self.cv.notify_all();
            return Ok(r.out.clone());
        }
        let g = r.generation;
        drop(r);
        // `out` stays this round's until every rank (this one too) has given its next value.
        let t = Instant::now();
        while self.generation.load(Ordering::Acquire) == g && t.elapsed() < MEET_SPIN {
            std::hint::spin_loop();
        }
        let mut r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        while r.generation == g {
            if self.broken().is_some() {
                return Err(self.unusable(rank));
            }
            match self.timeout {
                None => r = self.cv.wait(r).unwrap_or_else(|e| e.into_inner()),
                Some(limit) => {
                    let left = limit.saturating_sub(t.elapsed());
                    if left.is_zero() {
                        let missing: Vec<usize> = (0..self.p).filter(|&q| !r.present[q]).collect();
                        let why = format!(
                            "rank {rank} waited {limit:?} at call meeting {} for ranks {missing:?}, which never called",
                            g + 1
                        );
                        drop(r);
                        self.break_with(why.clone());
                        return Err(CudaError::Invalid(why));
                    }
                    r = self.cv.wait_timeout(r, left).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
        Ok(r.out.clone())
    }

    fn post(&self, from: usize, to: usize, p: Post) {
        let mut m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        m.entry((from, to)).or_default().push_back(p);
        self.mail_cv.notify_all();
    }

    /// The oldest post from `from` to `to`, waiting for it up to the timeout.
    fn take(&self, from: usize, to: usize) -> Result<Post, CudaError> {
        let t = Instant::now();
        let mut m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(p) = m.get_mut(&(from, to)).and_then(|q| q.pop_front()) {
                return Ok(p);
            }
            if self.broken().is_some() {
                return Err(self.unusable(to));
            }
            match self.timeout {
                None => m = self.mail_cv.wait(m).unwrap_or_else(|e| e.into_inner()),
                Some(limit) => {
                    let left = limit.saturating_sub(t.elapsed());
                    if left.is_zero() {
                        let why = format!(
                            "rank {to} waited {limit:?} for a send from rank {from}, which never came"
                        );
                        drop(m);
                        self.break_with(why.clone());
                        return Err(CudaError::Invalid(why));
                    }
                    m = self.mail_cv.wait_timeout(m, left).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
    }

    /// The GPU meeting's failure, if a kernel recorded one.
    fn device_failure(&self) -> Option<String> {
        if self.fail_host == 0 {
            return None;
        }
        let h = self.fail_host as *const u32;
        // SAFETY: four u32s of host-mapped memory owned (leaked) by this group; the GPU writes
        // the call number before the code, each followed by a system-wide fence.
        let code = unsafe { h.read_volatile() };
        if code == 0 {
            return None;
        }
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: as above.
        let seq = unsafe { (h.add(2).read_volatile() as u64) | ((h.add(3).read_volatile() as u64) << 32) };
        Some(describe_failure(code, seq, self.timeout))
    }
}

/// Words a failure code of the GPU meeting (kernels.cu's `Sync`).
fn describe_failure(code: u32, seq: u64, timeout: Option<Duration>) -> String {
    let waiter = (code >> 8) & 0xff;
    let missing = (code >> 16) & 0xff;
    let limit = timeout.map_or("forever".to_string(), |t| format!("{t:?}"));
    match (code >> 24) & 0xff {
        0 => format!(
            "at collective launch {seq}, rank {waiter}'s kernel waited {limit} for rank {missing}'s kernel to start (its stream is held up by earlier work)"
        ),
        1 => format!(
            "at collective launch {seq}, rank {waiter}'s kernel waited {limit} for the other ranks' kernels to finish"
        ),
        2 => format!("rank {waiter}'s kernel waited {limit} for rank {missing}'s send to start"),
        4 => format!("rank {waiter}'s kernel waited {limit} for rank {missing}'s data of an LL all-reduce (is rank {missing} making the same calls?)"),
        5 => format!("rank {waiter} gave up on the host while other ranks' kernels might wait for it"),
        6 => format!(
            "calls differ: rank {waiter}'s call is {} but rank {missing}'s is {}",
            super::kernels::describe_ll_signature(seq as u32),
            super::kernels::describe_ll_signature((seq >> 32) as u32)
        ),
        _ if missing == 0xff => format!("rank {waiter}'s kernel waited {limit} for its own receives to finish"),
        _ => format!("rank {waiter}'s kernel waited {limit} for rank {missing} to finish receiving its send"),
    }
}

/// The GPU meeting's arithmetic one rank keeps between calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counters {
    /// Collective launches so far (the GPU meeting's `seq` of the last one).
    seq: u64,
    /// Blocks of collective launches so far by every rank (the departure target).
    depart: u64,
    /// This rank's blocks of launches that publish receives, so far.
    mydepart: u64,
    /// LL all-reduces so far.
    ll_seq: u32,
    /// Sends to, and receives from, each peer so far.
    sent: [u64; MAX_RANKS],
    received: [u64; MAX_RANKS],
}

/// What one rank remembers between calls.
#[derive(Default)]
struct State {
    counters: Counters,
    /// The stream of the last launch, and an event recorded after it on that stream.
    last: Option<usize>,
    done: Option<Event>,
}

/// One launch as planned: its blocks and its meeting (counters; the addresses are the
/// group's), or, for an LL all-reduce, its LL call number.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Planned {
    blocks: u32,
    sync: Sync,
    ll: Option<u32>,
}

impl Planned {
    /// Whether the launch meets other ranks' launches through the counters.
    fn meets(&self) -> bool {
        let s = &self.sync;
        self.ll.is_none()
            && (s.seq != 0
                || [&s.send_to, &s.recv_from, &s.recv_done, &s.send_done]
                    .iter()
                    .any(|a| a.iter().any(|&n| n > 0)))
    }
}

/// Whether every rank's sends and receives of a group ride in its last collective launch
/// (one launch fewer): the group has collectives, the last collective launch is not LL, and
/// every rank's receive copies (`recv_tasks`, as each told the host meeting) fit beside its
/// collective tasks (counted as packing counts them, alike everywhere). Copies run in any
/// kernel, and the launch keeps the collective's block count, so every rank counts the same
/// collective blocks. All ranks or none: a launch that waits for a peer's sends at its
/// start deadlocks if that peer publishes them only in a later launch, which waits behind
/// its collective launch, which waits for this one's blocks (the CPU model found it).
fn merges(units: &[call::Unit], recv_tasks: &[usize], p: usize, ll: impl Fn(&call::Unit) -> bool) -> bool {
    match units.last() {
        Some(u) => !ll(u) && recv_tasks.iter().all(|&n| u.nominal_tasks(p) + n <= super::kernels::MAX_TASKS),
        None => false,
    }
}

/// Plans rank `rank`'s launches of a group (collective launches `units`, then send/receive
/// launches `p2p`; `sent[q]` sends to and `recv[q]` receives from each peer in the group;
/// `caps[i]` the most blocks launch i of `units` then `p2p` may take; `ll(u)` whether a
/// collective launch runs as LL; `merge`: the first send/receive launch rides in the last
/// collective launch, see [`merges`]) and advances `c` past them. Every rank computes the
/// same collective launches, block counts and call numbers from the same calls: that is
/// what lets their kernels meet. One plan per launch made: with `merge`, one fewer than
/// `units` and `p2p`.
#[allow(clippy::too_many_arguments)]
fn plan_launches(
    c: &mut Counters,
    rank: usize,
    p: usize,
    units: &[call::Unit],
    p2p: &[call::Unit],
    (sent, recv): (&[u64; MAX_RANKS], &[u64; MAX_RANKS]),
    caps: &[u32],
    ll: impl Fn(&call::Unit) -> bool,
    timeout_ns: u64,
    merge: bool,
) -> Vec<Planned> {
    let (n_coll, n_p2p) = (units.len(), p2p.len());
    let mut out = Vec::with_capacity(n_coll + n_p2p);
    // The send/receive part of launch j among the group's send/receive launches: the first
    // publishes every send of the group and waits for every send it receives; the last,
    // once all copies are done, says every receive is done and waits until the peers have
    // received this rank's sends.
    let p2p_part = |c: &mut Counters, sync: &mut Sync, j: usize, blocks: u32| {
        for q in 0..p {
            if j == 0 && sent[q] > 0 {
                sync.send_to[q] = c.sent[q] + sent[q];
            }
            if j == 0 && recv[q] > 0 {
                sync.recv_from[q] = c.received[q] + recv[q];
            }
            if j + 1 == n_p2p && recv[q] > 0 {
                sync.recv_done[q] = c.received[q] + recv[q];
            }
            if j + 1 == n_p2p && sent[q] > 0 {
                sync.send_done[q] = c.sent[q] + sent[q];
            }
        }
        if sync.recv_done.iter().any(|&n| n > 0) {
            c.mydepart += blocks as u64;
            sync.mydepart = c.mydepart;
        }
    };
    for (i, u) in units.iter().chain(p2p).enumerate() {
        if merge && i == n_coll {
            continue; // rode in the last collective launch
        }
        let cap = caps.get(i).copied().unwrap_or(1);
        let mut sync = Sync { timeout_ns, rank: rank as i32, p: p as i32, ..Sync::default() };
        if u.collective && ll(u) {
            out.push(Planned { blocks: 0, sync, ll: Some(next_ll_seq(c)) });
            continue;
        }
        let blocks;
        if u.collective {
            // The same number of blocks on every rank: from global arguments only.
            blocks = blocks_for(u.work, cap);
            c.seq += 1;
            c.depart += blocks as u64 * p as u64;
            sync.seq = c.seq;
            sync.depart = c.depart;
            if merge && i + 1 == n_coll {
                p2p_part(c, &mut sync, 0, blocks);
            }
        } else {
            blocks = blocks_for(u.own_bytes(), cap);
            p2p_part(c, &mut sync, i - n_coll, blocks);
        }
        out.push(Planned { blocks, sync, ll: None });
    }
    for q in 0..p {
        c.sent[q] += sent[q];
        c.received[q] += recv[q];
    }
    out
}

/// The next LL call number (from 1; 0 is never a flag, the buffer starts zeroed).
fn next_ll_seq(c: &mut Counters) -> u32 {
    c.ll_seq = if c.ll_seq >= u32::MAX - 1 { 1 } else { c.ll_seq + 1 };
    c.ll_seq
}

/// One rank (thread) of a group made by [`thread_group`]: its device and kernels.
pub struct Member {
    pub rank: usize,
    shared: Arc<Shared>,
    pub dev: Device,
    pub kernels: Arc<Kernels>,
    state: Mutex<State>,
    /// Blocks each multiprocessor gives one launch of the whole group (at most what it holds).
    blocks_per_sm: u32,
    /// Small all-reduces run as LL, mid-sized ones as LL128 (every rank must say the same).
    ll: bool,
    ll128: bool,
    /// A lone small all-reduce skips the host meeting (every rank must say the same).
    ll_alone: bool,
    /// Collective calls (groups holding a collective) made so far, refused ones included.
    coll_calls: AtomicU64,
}

/// Makes `p` members (1 to 8) of one group on device `ordinal`; each is moved to its own
/// thread. `timeout` bounds every wait of a call (at the host meeting and on the GPU).
pub fn thread_group(p: usize, ordinal: i32, timeout: Option<Duration>) -> Result<Vec<Member>, CudaError> {
    let shared = Arc::new(Shared::create(p, ordinal, timeout)?);
    (0..p).map(|rank| Member::new(&shared, rank)).collect()
}

/// Groups being joined, by key (a communicator's hash): each rank's thread calls [`join`].
fn registry() -> std::sync::MutexGuard<'static, HashMap<u64, std::sync::Weak<Shared>>> {
    static R: std::sync::OnceLock<Mutex<HashMap<u64, std::sync::Weak<Shared>>>> = std::sync::OnceLock::new();
    R.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// Rank `rank`'s member of the group of `p` ranks known by `key`, on device `ordinal`: the
/// first rank to join creates it, the others find it (each rank joins once).
pub fn join(
    key: u64,
    p: usize,
    rank: usize,
    ordinal: i32,
    timeout: Option<Duration>,
) -> Result<Member, CudaError> {
    let shared = {
        let mut reg = registry();
        reg.retain(|_, w| w.strong_count() > 0);
        match reg.get(&key).and_then(|w| w.upgrade()) {
            Some(s) => s,
            None => {
                let s = Arc::new(Shared::create(p, ordinal, timeout)?);
                reg.insert(key, Arc::downgrade(&s));
                s
            }
        }
    };
    if shared.p != p || shared.ordinal != ordinal {
        return Err(CudaError::Invalid(format!(
            "rank {rank}: the group's ranks disagree: {p} ranks on device {ordinal} here, {} ranks on device {} for another rank",
            shared.p, shared.ordinal
        )));
    }
    Member::new(&shared, rank)
}

/// Bytes one block moves per pass (threads x 16-byte vectors x unroll 8).
const BLOCK_PASS_BYTES: usize = BLOCK_THREADS as usize * 16 * 8;

/// Blocks for `bytes` read and written: enough for about one pass each, at most `cap`.
fn blocks_for(bytes: usize, cap: u32) -> u32 {
    (bytes.div_ceil(2 * BLOCK_PASS_BYTES) as u32).clamp(1, cap.max(1))
}

impl Member {
    fn new(shared: &Arc<Shared>, rank: usize) -> Result<Member, CudaError> {
        {
            let mut j = shared.joined.lock().unwrap_or_else(|e| e.into_inner());
            if rank >= shared.p || j[rank] {
                return Err(CudaError::Invalid(format!(
                    "rank {rank} cannot join a {}-rank thread group (out of range, or joined already)",
                    shared.p
                )));
            }
            j[rank] = true;
        }
        let kernels =
            shared.kernels.clone().ok_or_else(|| CudaError::Invalid("a group without kernels".into()))?;
        Ok(Member {
            rank,
            shared: shared.clone(),
            kernels,
            dev: Device::open(shared.ordinal)?,
            state: Default::default(),
            blocks_per_sm: 1,
            ll: ll_allowed(),
            ll128: ll128_allowed(),
            ll_alone: crate::env::device().ll_alone,
            coll_calls: AtomicU64::new(0),
        })
    }

    /// Whether small all-reduces run as LL (default: [`ll_allowed`]). Every rank must set the
    /// same, between calls.
    pub fn set_ll(&mut self, on: bool) {
        self.ll = on;
    }

    /// Whether mid-sized all-reduces (above [`LL_MAX_BYTES`], up to [`LL128_MAX_BYTES`]) run
    /// as LL128 (default: [`ll128_allowed`]). Every rank must set the same, between calls.
    pub fn set_ll128(&mut self, on: bool) {
        self.ll128 = on;
    }

    /// Whether a lone small all-reduce skips the host meeting (default: yes, unless
    /// `OXCCL_LL_ALONE=0`). Every rank must set the same, between calls.
    pub fn set_ll_alone(&mut self, on: bool) {
        self.ll_alone = on;
    }

    /// Gives up on the group: every rank's kernels that wait for others end (they poll the
    /// host-mapped record) and every later call fails, naming this rank. For an abort: the
    /// group's memory can then be freed without waiting for kernels that would never end.
    pub fn abort(&self) {
        self.shared.fail_group(self.rank, format!("rank {} aborted the communicator", self.rank));
    }

    pub fn size(&self) -> usize {
        self.shared.p
    }

    /// Blocks each multiprocessor gives one launch of the whole group (1 by default; capped
    /// at what the multiprocessor holds when a call launches). Every rank must set the same.
    pub fn set_blocks_per_sm(&mut self, n: u32) {
        self.blocks_per_sm = n.max(1);
    }

    /// The group's failure, if a kernel gave up waiting (read from host-mapped memory; does
    /// not wait for any stream) or a rank gave up on the host.
    pub fn check(&self) -> Result<(), CudaError> {
        // A reason given on the host says more than the GPU's record of it.
        if self.shared.broken().is_some() {
            return Err(self.shared.unusable(self.rank));
        }
        if let Some(why) = self.shared.device_failure() {
            return Err(CudaError::Invalid(format!("rank {}: the group is unusable: {why}", self.rank)));
        }
        Ok(())
    }

    /// Enqueues an all-reduce of `count` elements of `t` from `send` into `recv` (device
    /// pointers; equal for in place) on `s`, and returns. Every rank must make the same call.
    pub fn all_reduce(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), CudaError> {
        self.run(s, &[DevCall::coll(device::Coll::AllReduce, t, op, count, send, recv)])
    }

    /// Enqueues `calls` (a group: collectives every rank makes alike, in the same order, and
    /// sends and receives matched per pair in order) on `s`, and returns.
    pub fn run(&self, s: &Stream, calls: &[DevCall]) -> Result<(), CudaError> {
        if let [c] = calls {
            if self.lone_ll(c) && self.run_lone_ll(s, c)? {
                return Ok(());
            }
        }
        self.run_met(s, calls)
    }

    /// Whether `c`, alone in its group, runs as LL or LL128 without the host meeting.
    fn lone_ll(&self, c: &DevCall) -> bool {
        self.ll_alone && self.line_proto(c).is_some()
    }

    /// The line protocol an all-reduce runs with, if any: LL up to [`LL_MAX_BYTES`], LL128
    /// up to [`LL128_MAX_BYTES`], as allowed (decided from what every rank has alike).
    fn line_proto(&self, c: &DevCall) -> Option<LineProto> {
        if c.what != What::Coll(device::Coll::AllReduce)
            || c.count == 0
            || call::unsupported(c, self.shared.p).is_some()
        {
            return None;
        }
        match c.bytes() {
            b if b <= LL_MAX_BYTES && self.ll => Some(LineProto::Ll),
            b if b <= LL128_MAX_BYTES && self.ll128 => Some(LineProto::Ll128),
            _ => None,
        }
    }

    /// The group's buffer of `proto` and its data lines per slot.
    fn line_buf(&self, proto: LineProto) -> Option<super::kernels::Ll> {
        let (buf, lines) = match proto {
            LineProto::Ll => (self.shared.ll.as_ref()?, LL_LINES),
            LineProto::Ll128 => (self.shared.ll128.as_ref()?, LL128_LINES),
        };
        let sig = self.shared.ll.as_ref()?;
        Some(super::kernels::Ll {
            buf: buf.ptr,
            seq: 0,
            lines: lines as u32,
            sig_buf: sig.ptr,
            sig_lines: LL_LINES as u32,
        })
    }

    /// A lone small all-reduce, launched as LL without meeting the other ranks on the host:
    /// the kernels exchange the data and compare the calls' signatures (kernels.cu's
    /// `ll_all_reduce`). Ok(false): this rank refuses the call, and takes it to the host
    /// meeting, where every rank refuses alike. A rank that met while another launched (their
    /// calls differ, or one refused) is found by either of them from what each announced
    /// (each announces its call, then reads the others': one of the two sees the other) and
    /// the group is then broken, its waiting kernels told to give up.
    fn run_lone_ll(&self, s: &Stream, c: &DevCall) -> Result<bool, CudaError> {
        let (p, rank, sh) = (self.shared.p, self.rank, s.h as usize);
        let ann = &self.shared.announced;
        if p > 1 && legacy(sh) || (0..p).any(|q| q != rank && ann[q].stream.load(Ordering::Relaxed) == sh) {
            return Ok(false);
        }
        self.check()?;
        let (Some(proto), Some(bar)) = (self.line_proto(c), self.shared.bar.as_ref()) else {
            return Ok(false);
        };
        let Some(mut l) = self.line_buf(proto) else { return Ok(false) };
        let g = self.coll_calls.fetch_add(1, Ordering::Relaxed) + 1;
        ann[rank].stream.store(sh, Ordering::Relaxed);
        if let Some(q) = self.shared.announce_fast(rank, g) {
            let why = format!(
                "rank {rank}: calls differ at collective call {g}: this rank's is an {} alone, which runs as LL without meeting the others, but rank {q} came to the host meeting (its call differs, or it refused it, or its LL setting differs: OXCCL_DEVICE_LL and NCCL_PROTO must be the same on every rank)",
                c.describe()
            );
            self.shared.fail_group(rank, why.clone());
            return Err(CudaError::Invalid(why));
        }
        let _issued = IssuedOnDrop(&self.shared, rank, g);
        self.shared.wait_issued(rank, g - 1)?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.dev.make_current()?;
        if st.last.is_some_and(|h| h != sh) {
            // A rank's launches must not overlap: the new stream waits for the last launch.
            if let Some(ev) = &st.done {
                s.wait(ev)?;
            }
        }
        let seq = next_ll_seq(&mut st.counters);
        let sync = Sync {
            timeout_ns: self.timeout_ns(),
            rank: rank as i32,
            p: p as i32,
            fail: bar.ptr + 192,
            host: self.shared.fail_dev,
            ..Sync::default()
        };
        let div = if c.op == Kop::Op(ReduceOp::Avg) { p as u32 } else { 0 };
        l.seq = seq;
        let io = (c.send, c.recv, c.count);
        if let Err(e) = self.kernels.run_ll(s, proto, c.t, c.op, io, c.scalar, div, l, &sync) {
            self.shared.fail_group(rank, format!("rank {rank} could not launch its part of a call: {e}"));
            return Err(e);
        }
        if st.done.is_none() {
            st.done = Some(Event::sync_only(&self.dev)?);
        }
        if let Some(ev) = &st.done {
            ev.record(s)?;
        }
        st.last = Some(sh);
        Ok(true)
    }

    fn timeout_ns(&self) -> u64 {
        self.shared.timeout.map_or(0, |t| t.as_nanos().clamp(1, u64::MAX as u128) as u64)
    }

    /// A group through the host meeting (collectives) and the mailboxes (sends, receives).
    fn run_met(&self, s: &Stream, calls: &[DevCall]) -> Result<(), CudaError> {
        let p = self.shared.p;
        let rank = self.rank;
        let sh = s.h as usize;
        let ann = &self.shared.announced;
        let colls: Vec<DevCall> = calls.iter().filter(|c| c.collective().is_some()).copied().collect();
        // Ranks' kernels wait for one another, so they must run on streams of their own.
        let shared_with = calls.iter().find_map(|c| match c.what {
            What::Send(q) | What::Recv(q) if q != rank && ann[q].stream.load(Ordering::Relaxed) == sh => {
                Some(q)
            }
            _ => None,
        });
        let local = calls
            .iter()
            .find_map(|c| call::unsupported(c, p).map(|why| format!("this rank's {}: {why}", c.describe())))
            .or_else(|| {
                (p > 1 && legacy(sh)).then(|| {
                    "its stream is the legacy default stream, which every rank's thread shares: give each rank a stream of its own (cuStreamCreate, torch.cuda.Stream)".to_string()
                })
            })
            .or_else(|| {
                shared_with.map(|q| {
                    format!("its stream is rank {q}'s too: ranks' kernels wait for one another, so each rank needs a stream of its own")
                })
            });
        ann[rank].stream.store(sh, Ordering::Relaxed);
        // 1. Collectives: every rank meets, even one that refuses, and every rank decides from
        //    the same table, so either all launch or none does.
        let mut coll_tasks: Vec<(DevCall, Vec<Task>)> = Vec::new();
        let recv_tasks = calls.iter().filter(|c| matches!(c.what, What::Recv(_)) && c.bytes() > 0).count();
        let mut all_recv_tasks = Vec::new();
        let mut _issued = None;
        if !colls.is_empty() {
            let g = self.coll_calls.fetch_add(1, Ordering::Relaxed) + 1;
            _issued = Some(IssuedOnDrop(&self.shared, rank, g));
            // A rank that launched this call as a lone LL all-reduce never comes (see
            // `run_lone_ll`); its kernel waits for this rank's.
            if let Some(q) = self.shared.announce_meet(rank, g) {
                let mine = match &local {
                    Some(why) => format!("this rank refused its call: {why}"),
                    None => format!(
                        "this rank's call is {}",
                        colls.iter().map(|c| c.describe()).collect::<Vec<_>>().join(", ")
                    ),
                };
                let why = format!(
                    "rank {rank}: calls differ at collective call {g}: {mine}, but rank {q} launched it as a lone small all-reduce (LL, without meeting: OXCCL_DEVICE_LL and NCCL_PROTO must be the same on every rank)"
                );
                self.shared.fail_group(rank, why.clone());
                return Err(CudaError::Invalid(why));
            }
            let refuse = local.clone().or_else(|| {
                self.shared.device_failure().map(|why| format!("the group's GPU meeting failed: {why}"))
            });
            let all =
                self.shared.exchange(rank, Entry { calls: colls.clone(), refuse, stream: sh, recv_tasks })?;
            all_recv_tasks = all.iter().map(|e| e.recv_tasks).collect();
            if let Some((q, why)) =
                all.iter().enumerate().find_map(|(q, e)| e.refuse.as_ref().map(|w| (q, w)))
            {
                let whose = if q == rank { String::new() } else { format!("rank {q} refused: ") };
                return Err(CudaError::Invalid(format!("rank {rank}: {whose}{why}")));
            }
            if let Some(msg) = mismatch(rank, &all) {
                return Err(CudaError::Invalid(msg));
            }
            if let Some(q) = (0..p).find(|&q| q != rank && all[q].stream == sh) {
                return Err(CudaError::Invalid(format!(
                    "rank {rank}: its stream is rank {q}'s too: ranks' kernels wait for one another, so each rank needs a stream of its own"
                )));
            }
            for (i, c) in colls.iter().enumerate() {
                let coll = c.collective().expect("collectives only");
                let bufs: Vec<Bufs> =
                    all.iter().map(|e| Bufs { send: e.calls[i].send, recv: e.calls[i].recv }).collect();
                coll_tasks.push((*c, device::tasks(coll, c.count, c.t.size_bytes(), rank, &bufs)));
            }
        } else if let Some(why) = local {
            return Err(CudaError::Invalid(format!("rank {rank}: {why}")));
        }
        self.check()?;
        // 2. Sends are posted (never waiting), then each receive takes its send.
        let mut sent = [0u64; MAX_RANKS];
        let mut recv_from = [0u64; MAX_RANKS];
        let mut p2p_tasks = Vec::new();
        let mut wrong = None;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for c in calls {
            if let What::Send(q) = c.what {
                self.shared.post(rank, q, Post { buf: c.send, t: c.t, count: c.count });
                sent[q] += 1;
            }
        }
        for c in calls {
            if let What::Recv(q) = c.what {
                let post = self.shared.take(q, rank)?;
                recv_from[q] += 1;
                if (post.t, post.count) != (c.t, c.count) {
                    wrong.get_or_insert(format!(
                        "rank {rank}: {}, but rank {q}'s matching send is of {} x {}",
                        c.describe(),
                        post.count,
                        post.t
                    ));
                } else if c.bytes() > 0 {
                    p2p_tasks.push(Task::copy(post.buf, vec![c.recv], c.bytes()));
                }
            }
        }
        let any_p2p = sent.iter().chain(&recv_from).any(|&n| n > 0);
        // 3. Launches: collectives, then sends and receives.
        let mut units = call::collective_units(&coll_tasks, p);
        let p2p = call::p2p_units(p2p_tasks, any_p2p);
        let (n_coll, n_p2p) = (units.len(), p2p.len());
        let merge = !p2p.is_empty() && merges(&units, &all_recv_tasks, p, |u| self.ll_call(u).is_some());
        self.dev.make_current()?;
        if st.last.is_some_and(|h| h != s.h as usize) {
            // A rank's launches must not overlap: the new stream waits for the last launch.
            if let Some(ev) = &st.done {
                s.wait(ev)?;
            }
        }
        let sms = self.dev.sms.max(1) as u32;
        let mut caps = Vec::with_capacity(n_coll + n_p2p);
        for u in units.iter().chain(&p2p) {
            let (t, op) = u.kernel();
            let resident = self.kernels.max_blocks_per_sm(t, op)?;
            if resident == 0 {
                return Err(CudaError::Invalid(format!(
                    "rank {rank}: the {t} {op:?} kernel does not fit a multiprocessor"
                )));
            }
            caps.push((self.blocks_per_sm.min(resident) * sms) / p as u32);
        }
        let timeout_ns = self.timeout_ns();
        let plans = plan_launches(
            &mut st.counters,
            rank,
            p,
            &units,
            &p2p,
            (&sent, &recv_from),
            &caps,
            |u| self.ll_call(u).is_some(),
            timeout_ns,
            merge,
        );
        if merge {
            // The first send/receive launch's copies ride in the last collective launch.
            if let (Some(last), Some(first)) = (units.last_mut(), p2p.first()) {
                last.tasks.extend(first.tasks.iter().cloned());
            }
        }
        for (u, plan) in units.iter().chain(p2p.iter().skip(merge as usize)).zip(plans) {
            let (t, op) = u.kernel();
            let mut sync = plan.sync;
            let bar = self.shared.bar.as_ref().map_or(0, |b| b.ptr);
            sync.fail = bar + 192;
            sync.host = self.shared.fail_dev;
            if plan.meets() {
                sync.arr = bar;
                sync.dep = bar + 128;
                sync.mydep = bar + 256;
                sync.pready = bar + 512;
                sync.pdone = bar + 1024;
            }
            let div = if op == Kop::Op(ReduceOp::Avg) { p as u32 } else { 0 };
            let line = self.ll_call(u).and_then(|(c, proto)| Some((c, proto, self.line_buf(proto)?)));
            let launched = match (plan.ll, line) {
                (Some(seq), Some((c, proto, mut l))) => {
                    // One flag exchange instead of the meeting (see kernels.cu's ll_all_reduce).
                    l.seq = seq;
                    self.kernels.run_ll(s, proto, t, op, (c.send, c.recv, c.count), u.scalar, div, l, &sync)
                }
                _ => self.kernels.run(s, t, op, &u.tasks, u.scalar, div, plan.blocks, &sync),
            };
            if let Err(e) = launched {
                // The other ranks' kernels of this group wait for this one's: nobody may go on.
                self.shared.break_with(format!("rank {rank} could not launch its part of a call: {e}"));
                return Err(e);
            }
        }
        if n_coll + n_p2p > 0 {
            if st.done.is_none() {
                st.done = Some(Event::sync_only(&self.dev)?);
            }
            if let Some(ev) = &st.done {
                // Recorded now (not at a switch) so that a stream the caller destroys after
                // the call is never touched again.
                ev.record(s)?;
            }
            st.last = Some(s.h as usize);
        }
        match wrong {
            Some(w) => Err(CudaError::Invalid(w)),
            None => Ok(()),
        }
    }
}

impl Member {
    /// The all-reduce a collective launch holds, if it is to run as LL or LL128: a single
    /// all-reduce small enough (decided from what every rank has alike).
    fn ll_call(&self, u: &call::Unit) -> Option<(DevCall, LineProto)> {
        match u.calls.as_slice() {
            [c] if u.collective => self.line_proto(c).map(|p| (*c, p)),
            _ => None,
        }
    }
}

/// The first disagreement between the ranks' collectives, in words.
fn mismatch(rank: usize, all: &[Entry]) -> Option<String> {
    let mine = &all[rank].calls;
    for (q, e) in all.iter().enumerate() {
        if e.calls.len() != mine.len() {
            return Some(format!(
                "rank {rank}: calls differ: this rank's group has {} collectives, rank {q}'s has {}",
                mine.len(),
                e.calls.len()
            ));
        }
        if let Some((a, b)) = mine.iter().zip(&e.calls).find(|(a, b)| !a.agrees(b)) {
            return Some(format!(
                "rank {rank}: calls differ: this rank's {} but rank {q}'s {}",
                a.describe(),
                b.describe()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The meeting point hands every rank the same table, round after round.
    #[test]
    fn exchange_gives_every_rank_every_entry_each_round() {
        let shared = Arc::new(Shared::new(4, None));
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let sh = shared.clone();
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        let c = DevCall::send(0, DataType::U8, 0, round * 10 + r as u64);
                        let all = sh
                            .exchange(r, Entry { calls: vec![c], refuse: None, stream: 0, recv_tasks: 0 })
                            .unwrap();
                        for (q, e) in all.iter().enumerate() {
                            assert_eq!(e.calls[0].send, round * 10 + q as u64, "rank {r} round {round}");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }

    /// A rank that never comes: the others give up after the timeout naming it, and the
    /// group refuses every later meeting, the late rank's too.
    #[test]
    fn a_missing_rank_is_named_and_the_group_is_then_unusable() {
        let shared = Arc::new(Shared::new(3, Some(Duration::from_millis(100))));
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let sh = shared.clone();
                std::thread::spawn(move || sh.exchange(r, Entry::default()).err().map(|e| e.to_string()))
            })
            .collect();
        for h in hs {
            let e = h.join().unwrap().expect("rank 2 never came: the meeting must fail");
            assert!(e.contains("[2]"), "{e}");
        }
        let late = shared.exchange(2, Entry::default()).expect_err("the group is broken");
        assert!(late.to_string().contains("rank 2: the group is unusable"), "{late}");
    }

    /// Posts are taken in order per pair; a receive with no send gives up at the timeout
    /// naming the sender.
    #[test]
    fn mail_is_taken_in_order_and_a_missing_send_is_named() {
        let shared = Shared::new(3, Some(Duration::from_millis(100)));
        for i in 0..3 {
            shared.post(0, 1, Post { buf: i, t: DataType::F32, count: i as usize });
        }
        shared.post(2, 1, Post { buf: 99, t: DataType::F32, count: 1 });
        for i in 0..3 {
            assert_eq!(shared.take(0, 1).unwrap().buf, i);
        }
        assert_eq!(shared.take(2, 1).unwrap().buf, 99);
        let e = shared.take(2, 0).expect_err("nothing was sent from 2 to 0");
        assert!(e.to_string().contains("for a send from rank 2"), "{e}");
        assert!(shared.take(0, 1).is_err(), "broken after the timeout");
    }

    /// Ranks' collectives are compared by description; the first difference is named.
    #[test]
    fn mismatched_collectives_are_named() {
        let a = DevCall::coll(device::Coll::AllReduce, DataType::F32, ReduceOp::Sum, 10, 1, 2);
        let b = DevCall::coll(device::Coll::AllReduce, DataType::F32, ReduceOp::Max, 10, 3, 4);
        let all =
            vec![Entry { calls: vec![a], ..Entry::default() }, Entry { calls: vec![b], ..Entry::default() }];
        let m = mismatch(0, &all).unwrap();
        assert!(m.contains("all_reduce of 10 x float (sum)") && m.contains("(max)"), "{m}");
        let same =
            vec![Entry { calls: vec![a], ..Entry::default() }, Entry { calls: vec![a], ..Entry::default() }];
        assert_eq!(mismatch(1, &same), None);
    }

    /// A CPU model of kernels.cu's meeting (`sync_arrive`, `sync_depart`, and the LL flag
    /// exchange): each rank's launches run in stream order, every block of the running launches
    /// is stepped round-robin (the GPU runs them at once: they are all resident). It reports a
    /// deadlock (no block can move), and checks the promises the counters make: a collective
    /// launch works only once every rank's stream reached it and no rank starts the next one
    /// before every block of it is done; a receive copies only after its sender published the
    /// send, and a sender's launch ends only after the copy.
    struct Emu {
        p: usize,
        arr: Vec<u64>,
        dep: u64,
        mydep: Vec<u64>,
        pready: Vec<u64>,
        pdone: Vec<u64>,
        ll: Vec<u32>,
        /// Blocks of each collective launch number that have departed, and how many it has.
        departed: HashMap<u64, (u64, u64)>,
        /// Receives copied: (sender, receiver, message number).
        copied: std::collections::HashSet<(usize, usize, u64)>,
        /// Messages with bytes to copy: (sender, receiver, message number).
        nonempty: Vec<(usize, usize, u64)>,
    }

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum B {
        Start,
        Arrive,
        Work,
        Depart,
        Mine,
        All,
        Sends,
        Done,
    }

    /// One planned launch, what it copies ((sender, message number) per receive task), and
    /// the messages whose buffers the stream may reuse once it ends ((receiver, number)).
    struct L {
        plan: Planned,
        recvs: Vec<(usize, u64)>,
        sends: Vec<(usize, u64)>,
    }

    impl Emu {
        fn new(p: usize) -> Emu {
            Emu {
                p,
                arr: vec![0; p],
                dep: 0,
                mydep: vec![0; p],
                pready: vec![0; p * p],
                pdone: vec![0; p * p],
                ll: vec![0; p],
                departed: HashMap::new(),
                copied: Default::default(),
                nonempty: Vec::new(),
            }
        }

        /// Moves block `b` of `rank`'s launch `l` one state on; whether it moved.
        fn step(&mut self, rank: usize, l: &L, b: usize, st: &mut B) -> bool {
            let (p, s) = (self.p, &l.plan.sync);
            if let Some(n) = l.plan.ll {
                // LL: publish this call's lines, then wait for every rank's.
                return match *st {
                    B::Start => {
                        self.ll[rank] = self.ll[rank].max(n);
                        *st = B::Arrive;
                        true
                    }
                    B::Arrive if self.ll.iter().all(|&x| x >= n) => {
                        *st = B::Done;
                        true
                    }
                    _ => false,
                };
            }
            let next = match *st {
                B::Start => {
                    if b == 0 {
                        if s.seq != 0 {
                            self.arr[rank] = self.arr[rank].max(s.seq);
                        }
                        for q in 0..p {
                            if s.send_to[q] != 0 {
                                let x = &mut self.pready[rank * p + q];
                                *x = (*x).max(s.send_to[q]);
                            }
                        }
                    }
                    B::Arrive
                }
                B::Arrive => {
                    let coll = s.seq == 0 || self.arr.iter().all(|&a| a >= s.seq);
                    let sends =
                        (0..p).all(|q| s.recv_from[q] == 0 || self.pready[q * p + rank] >= s.recv_from[q]);
                    if !(coll && sends) {
                        return false;
                    }
                    B::Work
                }
                B::Work => {
                    if s.seq != 0 {
                        // The previous collective launch is wholly done on every rank.
                        if let Some(&(done, all)) = self.departed.get(&(s.seq - 1)) {
                            assert_eq!(done, all, "rank {rank} works on collective launch {} before every block of the one before departed", s.seq);
                        }
                    }
                    if b == 0 {
                        for &(q, k) in &l.recvs {
                            assert!(
                                self.pready[q * p + rank] >= k,
                                "rank {rank} copies message {k} of rank {q} before it was sent"
                            );
                            self.copied.insert((q, rank, k));
                        }
                    }
                    B::Depart
                }
                B::Depart => {
                    if s.seq != 0 {
                        self.dep += 1;
                        self.departed.entry(s.seq).or_insert((0, 0)).0 += 1;
                    }
                    if s.recv_done.iter().any(|&n| n > 0) {
                        self.mydep[rank] += 1;
                    }
                    if b == 0 {
                        B::Mine
                    } else {
                        B::Done
                    }
                }
                B::Mine => {
                    if s.recv_done.iter().any(|&n| n > 0) {
                        if self.mydep[rank] < s.mydepart {
                            return false;
                        }
                        for q in 0..p {
                            if s.recv_done[q] != 0 {
                                let x = &mut self.pdone[q * p + rank];
                                *x = (*x).max(s.recv_done[q]);
                            }
                        }
                    }
                    B::All
                }
                B::All => {
                    if s.seq != 0 && self.dep < s.depart {
                        return false;
                    }
                    B::Sends
                }
                B::Sends => {
                    for q in 0..p {
                        if s.send_done[q] != 0 && self.pdone[rank * p + q] < s.send_done[q] {
                            return false;
                        }
                    }
                    B::Done
                }
                B::Done => return false,
            };
            *st = next;
            true
        }

        /// Runs every rank's launches to the end, blocks moving in a random order (some held
        /// back each round, as a GPU schedules them); panics naming the stuck launches on a
        /// deadlock.
        fn run(&mut self, mut queues: Vec<VecDeque<L>>, rng: &mut Rng) {
            for q in &queues {
                for l in q {
                    if l.plan.sync.seq != 0 && l.plan.ll.is_none() {
                        self.departed.entry(l.plan.sync.seq).or_insert((0, 0)).1 += l.plan.blocks as u64;
                    }
                }
            }
            let mut running: Vec<Option<(L, Vec<B>)>> = (0..self.p).map(|_| None).collect();
            let mut idle = 0;
            loop {
                let mut moved = false;
                let first = rng.next(self.p as u64) as usize;
                let p = self.p;
                for r in (0..p).map(|i| (i + first) % p) {
                    if running[r].is_none() {
                        if let Some(l) = queues[r].pop_front() {
                            let n = if l.plan.ll.is_some() { 1 } else { l.plan.blocks.max(1) as usize };
                            running[r] = Some((l, vec![B::Start; n]));
                            moved = true;
                        }
                    }
                    if let Some((l, blocks)) = running[r].as_mut() {
                        for (b, st) in blocks.iter_mut().enumerate() {
                            // Held back this round (but never forever: see `idle`).
                            if idle == 0 && rng.next(3) == 0 {
                                continue;
                            }
                            moved |= self.step(r, l, b, st);
                        }
                        if blocks.iter().all(|b| *b == B::Done) {
                            // The stream goes on: work after the launch may use its results
                            // and reuse its buffers.
                            let s = &l.plan.sync;
                            if s.seq != 0 && l.plan.ll.is_none() {
                                let (done, all) = self.departed[&s.seq];
                                assert_eq!(done, all, "rank {r}'s collective launch {} ends while other ranks' blocks still work", s.seq);
                            }
                            for &(q, k) in &l.sends {
                                if self.nonempty.contains(&(r, q, k)) {
                                    assert!(
                                        self.copied.contains(&(r, q, k)),
                                        "rank {r}'s send {k} to rank {q} ends before its copy"
                                    );
                                }
                            }
                            running[r] = None;
                            moved = true;
                        }
                    }
                }
                if running.iter().all(|x| x.is_none()) && queues.iter().all(|q| q.is_empty()) {
                    return;
                }
                if !moved && idle == 0 {
                    // Nothing moved, perhaps only because of the holding back: a full round next.
                    idle = 1;
                    continue;
                }
                idle = 0;
                if !moved {
                    let stuck: Vec<String> = running
                        .iter()
                        .enumerate()
                        .filter_map(|(r, x)| {
                            x.as_ref().map(|(l, b)| format!("rank {r}: {:?} {:?}", l.plan, b))
                        })
                        .collect();
                    panic!("deadlock:\n{}", stuck.join("\n"));
                }
            }
        }
    }

    /// A tiny deterministic generator.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) % n.max(1)
        }
    }

    /// Random groups of collectives (the same on every rank) and sends/receives (random pairs,
    /// self included, some empty), planned by every rank with the engine's own functions
    /// (`call::collective_units`, `call::p2p_units`, `plan_launches`), then run through the
    /// meeting's model: no deadlock, and every promise the counters make holds.
    #[test]
    fn planned_launches_meet_without_deadlock_and_keep_their_promises() {
        use device::Coll;
        let mut rng = Rng(7);
        let mut merged_total = 0;
        for trial in 0..300 {
            let mut merged = 0;
            let p = 2 + rng.next(7) as usize;
            let ll_on = rng.next(2) == 0;
            let mut counters = vec![Counters::default(); p];
            let mut queues: Vec<VecDeque<L>> = (0..p).map(|_| VecDeque::new()).collect();
            let bufs: Vec<Bufs> =
                (0..p).map(|q| Bufs { send: (q as u64 + 1) << 40, recv: (q as u64 + 9) << 40 }).collect();
            let mut nonempty = Vec::new();
            for _group in 0..8 {
                // Collectives every rank makes alike.
                let kinds = [
                    Coll::AllReduce,
                    Coll::AllGather,
                    Coll::AllToAll,
                    Coll::Broadcast(p - 1),
                    Coll::ReduceScatter,
                ];
                let colls: Vec<DevCall> = (0..rng.next(4))
                    .map(|_| {
                        let k = kinds[rng.next(kinds.len() as u64) as usize];
                        let count = [1usize, 4, 1000, 5 << 20][rng.next(4) as usize];
                        let op = [ReduceOp::Sum, ReduceOp::Max][rng.next(2) as usize];
                        DevCall::coll(k, DataType::F32, op, count, 0, 0)
                    })
                    .collect();
                // Messages: per (sender, receiver), how many (their byte counts, some zero).
                let mut msgs: Vec<(usize, usize, usize)> = Vec::new();
                for _ in 0..rng.next(4 * p as u64 + 12) {
                    let (a, b) = (rng.next(p as u64) as usize, rng.next(p as u64) as usize);
                    msgs.push((a, b, [0usize, 8, 1 << 20][rng.next(3) as usize]));
                }
                for r in 0..p {
                    let coll_tasks: Vec<(DevCall, Vec<Task>)> = colls
                        .iter()
                        .map(|c| (*c, device::tasks(c.collective().unwrap(), c.count, 4, r, &bufs)))
                        .collect();
                    let units = call::collective_units(&coll_tasks, p);
                    let mut sent = [0u64; MAX_RANKS];
                    let mut recv = [0u64; MAX_RANKS];
                    let mut tasks = Vec::new();
                    let mut sends = Vec::new();
                    for &(a, b, bytes) in &msgs {
                        if a == r {
                            sent[b] += 1;
                            sends.push((b, counters[r].sent[b] + sent[b]));
                        }
                        if b == r {
                            recv[a] += 1;
                            let k = counters[r].received[a] + recv[a];
                            if bytes > 0 {
                                tasks.push(Task::copy(((a as u64) << 32) | k, vec![1], bytes));
                                nonempty.push((a, r, k));
                            }
                        }
                    }
                    let any = sent.iter().chain(&recv).any(|&n| n > 0);
                    let p2p = call::p2p_units(tasks, any);
                    // Caps: by kernel for collective launches (the occupancy, alike everywhere).
                    let caps: Vec<u32> = units
                        .iter()
                        .map(|u| 1 + (u.kernel().1 == Kop::Op(ReduceOp::Max)) as u32 * 2)
                        .chain(p2p.iter().map(|_| 1 + rng.next(3) as u32))
                        .collect();
                    let ll = |u: &call::Unit| {
                        ll_on
                            && matches!(u.calls.as_slice(), [c] if c.what == What::Coll(Coll::AllReduce) && c.bytes() <= LL_MAX_BYTES)
                    };
                    // Whether sends and receives ride in the last collective launch: decided
                    // alike from every rank's receive count (as the host meeting gives them).
                    let recv_tasks: Vec<usize> =
                        (0..p).map(|q| msgs.iter().filter(|m| m.1 == q && m.2 > 0).count()).collect();
                    let merge = !p2p.is_empty() && merges(&units, &recv_tasks, p, ll);
                    merged += merge as usize;
                    let plans = plan_launches(
                        &mut counters[r],
                        r,
                        p,
                        &units,
                        &p2p,
                        (&sent, &recv),
                        &caps,
                        ll,
                        0,
                        merge,
                    );
                    let n_coll = units.len();
                    let n = plans.len();
                    assert_eq!(n, n_coll + p2p.len() - merge as usize);
                    let copies = |u: &call::Unit| -> Vec<(usize, u64)> {
                        u.tasks
                            .iter()
                            .filter(|t| t.copy)
                            .map(|t| ((t.srcs[0] >> 32) as usize, t.srcs[0] & 0xffff_ffff))
                            .collect()
                    };
                    for (i, plan) in plans.into_iter().enumerate() {
                        // Each receive's copy is in the launch that holds its task.
                        let mine: Vec<(usize, u64)> = match (i + 1).cmp(&n_coll) {
                            std::cmp::Ordering::Less => Vec::new(),
                            std::cmp::Ordering::Equal if merge => copies(&p2p[0]),
                            std::cmp::Ordering::Equal => Vec::new(),
                            std::cmp::Ordering::Greater => copies(&p2p[i - n_coll + merge as usize]),
                        };
                        // The group's sends are done with once its last launch ends.
                        let sends = if i + 1 == n { std::mem::take(&mut sends) } else { Vec::new() };
                        queues[r].push_back(L { plan, recvs: mine, sends });
                    }
                }
            }
            let mut emu = Emu::new(p);
            emu.nonempty = nonempty;
            assert!(trial < 299 || merged_total + merged > 0, "no group merged in any trial");
            merged_total += merged;
            let total: usize = queues.iter().map(|q| q.len()).sum();
            emu.run(queues, &mut rng);
            assert!(total > 0 || trial > 0);
        }
    }

    #[test]
    fn blocks_cover_the_work_within_the_cap() {
        assert_eq!(blocks_for(0, 33), 1);
        assert_eq!(blocks_for(8, 33), 1);
        assert_eq!(blocks_for(2 * BLOCK_PASS_BYTES, 33), 1);
        assert_eq!(blocks_for(2 * BLOCK_PASS_BYTES + 1, 33), 2);
        assert_eq!(blocks_for(1 << 30, 33), 33);
        assert_eq!(blocks_for(1 << 30, 0), 1);
    }

    #[test]
    fn a_device_failure_names_the_waiter_and_the_culprit() {
        let arrival = 1 | (3 << 16); // rank 0 waited for rank 3
        let m = describe_failure(arrival, 7, Some(Duration::from_millis(300)));
        assert_eq!(
            m,
            "at collective launch 7, rank 0's kernel waited 300ms for rank 3's kernel to start (its stream is held up by earlier work)"
        );
        let departure = 1 | (2 << 8) | (0xff << 16) | (1 << 24);
        let m = describe_failure(departure, 9, None);
        assert_eq!(
            m,
            "at collective launch 9, rank 2's kernel waited forever for the other ranks' kernels to finish"
        );
        let send = 1 | (1 << 8) | (2 << 16) | (2 << 24);
        assert_eq!(
            describe_failure(send, 0, None),
            "rank 1's kernel waited forever for rank 2's send to start"
        );
    }

    #[test]
    fn differing_ll_calls_are_named_from_their_signatures() {
        use super::super::kernels::{describe_ll_signature, ll_signature};
        let mine = ll_signature(LineProto::Ll, DataType::F32, Kop::Op(ReduceOp::Sum), 2) as u64;
        let theirs = ll_signature(LineProto::Ll128, DataType::Bf16, Kop::Op(ReduceOp::Max), 100_000) as u64;
        assert_ne!(mine, theirs);
        let code = 1 | (1 << 8) | (3 << 16) | (6 << 24);
        assert_eq!(
            describe_failure(code, mine | (theirs << 32), None),
            "calls differ: rank 1's call is an all-reduce of 2 x float with sum (LL) but rank 3's is an all-reduce of 100000 x bfloat16 with max (LL128)"
        );
        // Every field counts: count (up to LL128's largest, 2^18 bytes of i8), type, operator
        // and protocol; and every type and operator reads back.
        let base = ll_signature(LineProto::Ll, DataType::F16, Kop::PreMulSum, 16384);
        assert_ne!(base, ll_signature(LineProto::Ll, DataType::F16, Kop::PreMulSum, 16383));
        assert_ne!(base, ll_signature(LineProto::Ll, DataType::Bf16, Kop::PreMulSum, 16384));
        assert_ne!(base, ll_signature(LineProto::Ll, DataType::F16, Kop::Op(ReduceOp::Sum), 16384));
        assert_ne!(base, ll_signature(LineProto::Ll128, DataType::F16, Kop::PreMulSum, 16384));
        let big = LL128_MAX_BYTES;
        assert_ne!(
            ll_signature(LineProto::Ll128, DataType::I8, Kop::Op(ReduceOp::Sum), big),
            ll_signature(LineProto::Ll128, DataType::I8, Kop::Op(ReduceOp::Sum), big - 1)
        );
        for t in DataType::ALL {
            for (op, name, _) in super::super::kernels::OPS {
                let d = describe_ll_signature(ll_signature(LineProto::Ll128, t, op, big));
                assert_eq!(d, format!("an all-reduce of {big} x {t} with {name} (LL128)"));
            }
        }
        let gave_up = 1 | (2 << 8) | (0xff << 16) | (5 << 24);
        assert_eq!(
            describe_failure(gave_up, 0, None),
            "rank 2 gave up on the host while other ranks' kernels might wait for it"
        );
    }

    /// A lone LL call waits until every rank has enqueued the call before: at once when all
    /// have, until the last one does, and never forever: a rank that never comes is named
    /// once the timeout passes, and a broken group ends the wait.
    #[test]
    fn a_call_waits_until_every_rank_has_enqueued_the_one_before() {
        let sh = Shared::new(3, Some(Duration::from_millis(300)));
        for r in 0..3 {
            sh.set_issued(r, 4);
        }
        assert!(sh.wait_issued(0, 4).is_ok());
        assert!(sh.wait_issued(0, 0).is_ok());
        // Rank 2 enqueues call 5 a little later.
        let t = Instant::now();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                sh.set_issued(2, 5);
            });
            sh.set_issued(0, 5);
            sh.set_issued(1, 5);
            assert!(sh.wait_issued(0, 5).is_ok());
        });
        // Woken by rank 2's word, not by the 300 ms timeout.
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(20) && took < Duration::from_millis(250), "{took:?}");
        // Rank 1 never makes call 6.
        sh.set_issued(0, 6);
        sh.set_issued(2, 6);
        let e = sh.wait_issued(2, 6).unwrap_err().to_string();
        assert!(e.contains("rank 2 waited 300ms for rank 1 to make collective call 6"), "{e}");
        // The group is now broken: the next wait ends at once, naming why.
        let t = Instant::now();
        let e = sh.wait_issued(0, 7).unwrap_err().to_string();
        assert!(e.contains("unusable") && e.contains("rank 1 to make collective call 6"), "{e}");
        assert!(t.elapsed() < Duration::from_millis(300));
    }

    /// Two ranks reach the same collective call, one launching it alone as LL and one coming
    /// to the host meeting, announcing at the same moment from two threads, many times:
    /// at least one of them must see the other every time (else the meeting rank waits
    /// forever while the other's kernel waits for it).
    #[test]
    fn a_rank_that_launches_alone_and_one_that_meets_see_each_other() {
        let rounds = 20_000u64;
        let shared = Shared::new(3, None);
        let go = std::sync::Barrier::new(2);
        let (seen_fast, seen_meet) = std::thread::scope(|sc| {
            let a = sc.spawn(|| {
                let mut seen = vec![false; rounds as usize + 1];
                for g in 1..=rounds {
                    go.wait();
                    seen[g as usize] = shared.announce_fast(0, g) == Some(2);
                }
                seen
            });
            let b = sc.spawn(|| {
                let mut seen = vec![false; rounds as usize + 1];
                for g in 1..=rounds {
                    go.wait();
                    seen[g as usize] = shared.announce_meet(2, g) == Some(0);
                }
                seen
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        for g in 1..=rounds as usize {
            assert!(seen_fast[g] || seen_meet[g], "call {g}: neither rank saw the other");
        }
        // Ranks that agree see nothing: all three launch call g alone, or all three meet.
        let agree = Shared::new(3, None);
        for g in 1..=100 {
            assert!((0..3).all(|r| agree.announce_fast(r, g).is_none()));
        }
        for g in 101..=200 {
            assert!((0..3).all(|r| agree.announce_meet(r, g).is_none()));
        }
        // A rank whose call g was a lone LL and that ran ahead to g + 5 is still seen by a
        // rank that meets at g.
        let ahead = Shared::new(2, None);
        assert_eq!(ahead.announce_fast(1, 205), None);
        assert_eq!(ahead.announce_meet(0, 201), Some(1));
    }
}
