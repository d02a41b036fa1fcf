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
//!   launch of the other ranks on the GPU (`Sync` in kernels/sync.cu): at its start it waits until
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

mod meet;
mod member;
mod plan;
use meet::*;
use plan::*;

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

/// Device memory of the GPU meeting (see kernels/sync.cu's `Sync`): `arr[8]` at 0, `dep` at 128,
/// `fail` at 192, `mydep[8]` at 256, `pready[64]` at 512, `pdone[64]` at 1024, and each
/// rank's record (`base`: `u64[24]`, only that rank's kernels touch it) at
/// `BASE_AT + BASE_BYTES * rank`.
pub(crate) const BAR_BYTES: usize = BASE_AT + BASE_BYTES * MAX_RANKS;
pub(crate) const BASE_AT: usize = 2048;
pub(crate) const BASE_BYTES: usize = 256;

/// All-reduces of at most this many bytes run as LL (one flag exchange, no meeting) unless
/// `NCCL_PROTO` leaves LL out or `OXCCL_DEVICE_LL=0`.
pub const LL_MAX_BYTES: usize = 16 << 10;
/// LL data lines per slot: 8 payload bytes each (each slot has one more, the signature's).
pub(crate) const LL_LINES: usize = LL_MAX_BYTES / 8;

/// All-reduces above [`LL_MAX_BYTES`] and up to this run as LL128 unless `NCCL_PROTO` leaves
/// LL128 out or `OXCCL_DEVICE_LL128=0`.
pub const LL128_MAX_BYTES: usize = 256 << 10;
/// LL128 data lines per slot: 120 payload bytes each (each slot has one more, the
/// signature's).
pub(crate) const LL128_LINES: usize = LL128_MAX_BYTES.div_ceil(120);

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

/// A kernel's longest wait in nanoseconds for `timeout` (0: forever).
pub(crate) fn timeout_ns(timeout: Option<Duration>) -> u64 {
    timeout.map_or(0, |t| t.as_nanos().clamp(1, u64::MAX as u128) as u64)
}

/// Words a failure code of the GPU meeting (kernels/sync.cu's `Sync`).
pub(crate) fn describe_failure(code: u32, seq: u64, timeout: Option<Duration>) -> String {
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
pub(crate) const BLOCK_PASS_BYTES: usize = BLOCK_THREADS as usize * 16 * 8;

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
mod meeting;
#[cfg(test)]
mod tests;
