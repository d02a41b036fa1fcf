//! Ranks as threads of one process on one device: collectives on device buffers, enqueued on
//! each rank's stream, the data moved by the reduce-copy kernels reading and writing the other
//! ranks' buffers directly (one context, so no IPC mapping is needed).
//!
//! AllReduce: rank r reduces slice r of every rank's input and writes it into slice r of every
//! rank's output, so each input byte is read once and each output byte written once (the
//! bound the issue sets). One launch per rank and call, and one meeting of the host threads:
//! - the threads meet once to exchange buffer addresses and check that the calls agree (a
//!   mismatch makes every rank refuse, and none launches);
//! - each rank's kernel then meets the same call's kernels of the other ranks on the GPU
//!   (`Bar` in kernels.cu): at its start it waits until every rank's stream has reached the
//!   call (every input written, every output free), and at its end until every block of every
//!   rank has finished, so work ordered after the call on any rank's stream sees the whole
//!   result and may overwrite the input. Nothing on the host waits for the GPU.
//!
//! The GPU meeting needs every block of the p kernels resident at once: each rank launches at
//! most `blocks_per_sm * SMs / p` blocks, `blocks_per_sm` no more than the multiprocessor holds
//! (the occupancy the driver reports). A kernel that waits longer than the group's timeout
//! gives up, records which rank it waited for (in host-mapped memory, read by the next call
//! without touching the stream), and every later call of the group fails with that culprit.
//! A rank's calls run in order even across streams: switching streams makes the new one wait
//! for the old (the GPU meeting counts calls, so two calls of one rank must not overlap).

use super::driver::CuDevicePtr;
use super::kernels::{Bar, Kernels, BLOCK_THREADS, MAX_SOURCES};
use super::{CudaError, DevBuf, Device, Event, Stream};
use oxccl_core::{DataType, ReduceOp};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct Entry {
    send: CuDevicePtr,
    recv: CuDevicePtr,
    count: usize,
    t: u8,
    op: u8,
    /// Why this rank refuses the call: [`REFUSE_UNSUPPORTED`], [`REFUSE_FAILED`] (0: it does not).
    refuse: u8,
}

/// A rank has no device kernel for the call's type and operator.
const REFUSE_UNSUPPORTED: u8 = 1;
/// A rank saw the group's GPU meeting fail.
const REFUSE_FAILED: u8 = 2;

#[derive(Default)]
struct Round {
    generation: u64,
    arrived: usize,
    present: Vec<bool>,
    vals: Vec<Entry>,
    out: Arc<Vec<Entry>>,
    /// Set when a rank gave up waiting at a meeting: the group is unusable from then on.
    broken: Option<String>,
}

/// How long a rank spins for the others at a meeting before it sleeps.
const MEET_SPIN: Duration = Duration::from_micros(50);

/// Bytes of device memory for the GPU meeting: `arr[8]` at 0, `dep` at 128, `fail` at 192.
const BAR_BYTES: usize = 256;

struct Shared {
    p: usize,
    /// `Round::generation`, readable without the lock (for the spin).
    generation: AtomicU64,
    round: Mutex<Round>,
    cv: Condvar,
    /// Longest wait at a meeting, on the host and on the GPU; `None`: forever.
    timeout: Option<Duration>,
    /// The GPU meeting's counters (zeroed at creation).
    bar: Option<DevBuf>,
    /// Host address and device address of the host-mapped failure record `u32[4]`.
    fail_host: usize,
    fail_dev: CuDevicePtr,
    /// For synchronising before the counters are freed.
    dev: Option<Device>,
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
            timeout,
            bar: None,
            fail_host: 0,
            fail_dev: 0,
            dev: None,
        }
    }

    /// Every rank's `v` for this round, once all have given theirs; an error naming the
    /// missing ranks if they did not come within the timeout (the group is then broken).
    fn exchange(&self, rank: usize, v: Entry) -> Result<Arc<Vec<Entry>>, CudaError> {
        let mut r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &r.broken {
            return Err(CudaError::Invalid(format!("rank {rank}: the group is unusable: {why}")));
        }
        if r.vals.len() != self.p {
            r.vals = vec![Entry::default(); self.p];
            r.present = vec![false; self.p];
        }
        r.vals[rank] = v;
        r.present[rank] = true;
        r.arrived += 1;
        if r.arrived == self.p {
            r.out = Arc::new(r.vals.clone());
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
        while r.generation == g && r.broken.is_none() {
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
                        r.broken = Some(why.clone());
                        self.cv.notify_all();
                        return Err(CudaError::Invalid(why));
                    }
                    r = self.cv.wait_timeout(r, left).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
        if r.generation == g {
            let why = r.broken.clone().unwrap_or_default();
            return Err(CudaError::Invalid(format!("rank {rank}: the group is unusable: {why}")));
        }
        Ok(r.out.clone())
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

/// Words a failure code of the GPU meeting (kernels.cu's `Bar`).
fn describe_failure(code: u32, seq: u64, timeout: Option<Duration>) -> String {
    let waiter = (code >> 8) & 0xff;
    let missing = (code >> 16) & 0xff;
    let limit = timeout.map_or("forever".to_string(), |t| format!("{t:?}"));
    if (code >> 24) & 0xff == 0 {
        format!(
            "at call {seq}, rank {waiter}'s kernel waited {limit} for rank {missing}'s kernel to start (its stream is held up by earlier work)"
        )
    } else {
        format!("at call {seq}, rank {waiter}'s kernel waited {limit} for the other ranks' kernels to finish")
    }
}

fn name_t(v: u8) -> String {
    DataType::from_nccl(v as i32).map_or(format!("type {v}"), |t| t.to_string())
}

fn name_op(v: u8) -> String {
    ReduceOp::from_nccl(v as i32).map_or(format!("op {v}"), |o| o.to_string())
}

/// What one rank remembers between calls.
#[derive(Default)]
struct State {
    /// Calls launched so far (the GPU meeting's `seq` of the last one).
    seq: u64,
    /// Blocks launched so far by every rank (the departure target).
    depart: u64,
    /// The stream of the last call, and an event recorded after it on that stream.
    last: Option<usize>,
    done: Option<Event>,
}

/// One rank (thread) of a group made by [`thread_group`]: its device and kernels.
pub struct Member {
    pub rank: usize,
    shared: Arc<Shared>,
    pub dev: Device,
    pub kernels: Kernels,
    state: Mutex<State>,
    /// Blocks each multiprocessor gives one call of the whole group (at most what it holds).
    blocks_per_sm: u32,
}

/// Makes `p` members (1 to 8) of one group on device `ordinal`; each is moved to its own
/// thread. `timeout` bounds every wait of a call (at the host meeting and on the GPU).
pub fn thread_group(p: usize, ordinal: i32, timeout: Option<Duration>) -> Result<Vec<Member>, CudaError> {
    if !(1..=MAX_SOURCES).contains(&p) {
        return Err(CudaError::Invalid(format!("a thread group has 1 to {MAX_SOURCES} ranks, not {p}")));
    }
    let devs: Vec<Device> = (0..p).map(|_| Device::open(ordinal)).collect::<Result<_, _>>()?;
    let bar = DevBuf::new(&devs[0], BAR_BYTES)?;
    let zero = Stream::new(&devs[0])?;
    zero.fill(bar.ptr, 0, BAR_BYTES)?;
    zero.sync()?;
    let (fail_host, fail_dev) = super::stage::stream_flag()?;
    // SAFETY: the flag is 64 bytes of pinned memory, leaked, nothing uses it yet.
    unsafe { std::ptr::write_bytes(fail_host as *mut u8, 0, 16) };
    let mut shared = Shared::new(p, timeout);
    shared.bar = Some(bar);
    shared.fail_host = fail_host;
    shared.fail_dev = fail_dev;
    shared.dev = Some(Device::open(ordinal)?);
    let shared = Arc::new(shared);
    devs.into_iter()
        .enumerate()
        .map(|(rank, dev)| {
            let kernels = Kernels::load(&dev, &[])?;
            Ok(Member {
                rank,
                shared: shared.clone(),
                kernels,
                dev,
                state: Default::default(),
                blocks_per_sm: 1,
            })
        })
        .collect()
}

/// Elements per slice: a multiple of 16 bytes' worth, so every slice starts 16-byte aligned
/// when the buffers do.
fn slice_len(count: usize, p: usize, elem: usize) -> usize {
    let align = (16 / elem).max(1);
    count.div_ceil(p).div_ceil(align) * align
}

/// Bytes one block of the reduce-copy moves per pass (threads x 16-byte vectors x unroll 8).
const BLOCK_PASS_BYTES: usize = BLOCK_THREADS as usize * 16 * 8;

/// Blocks per rank for a slice of `slice_bytes`: enough for one pass each, at most `cap`.
fn blocks_for(slice_bytes: usize, cap: u32) -> u32 {
    (slice_bytes.div_ceil(BLOCK_PASS_BYTES) as u32).clamp(1, cap.max(1))
}

impl Member {
    pub fn size(&self) -> usize {
        self.shared.p
    }

    /// Blocks each multiprocessor gives one call of the whole group (1 by default; capped at
    /// what the multiprocessor holds when a call launches). Every rank must set the same.
    pub fn set_blocks_per_sm(&mut self, n: u32) {
        self.blocks_per_sm = n.max(1);
    }

    /// The group's failure, if a kernel gave up waiting (read from host-mapped memory; does
    /// not wait for any stream).
    pub fn check(&self) -> Result<(), CudaError> {
        match self.shared.device_failure() {
            Some(why) => Err(CudaError::Invalid(format!("rank {}: the group is unusable: {why}", self.rank))),
            None => Ok(()),
        }
    }

    /// Enqueues an all-reduce of `count` elements of `t` from `send` into `recv` (device
    /// pointers; equal for in place) on `s`, and returns. Every rank must make the same call.
    pub fn all_reduce(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        send: CuDevicePtr,
        recv: CuDevicePtr,
        count: usize,
    ) -> Result<(), CudaError> {
        let p = self.shared.p;
        let rank = self.rank;
        let supported = op != ReduceOp::Avg && super::kernels::reduce_name(t, op).is_some();
        let refuse = if !supported {
            REFUSE_UNSUPPORTED
        } else if self.shared.device_failure().is_some() {
            REFUSE_FAILED
        } else {
            0
        };
        // Every rank meets, even one that refuses, and every rank decides from the same table,
        // so either all launch or none does (a rank that launched alone would wait forever).
        let me = Entry { send, recv, count, t: t as u8, op: op as u8, refuse };
        let all = self.shared.exchange(rank, me)?;
        if all.iter().any(|e| e.refuse & REFUSE_FAILED != 0) {
            self.check()?;
        }
        if let Some(q) = all.iter().position(|e| e.refuse & REFUSE_UNSUPPORTED != 0) {
            let whose = if q == rank { "this rank's".to_string() } else { format!("rank {q}'s") };
            return Err(CudaError::Invalid(format!(
                "rank {rank}: all_reduce refused: {whose} call ({} with {}) has no device kernel (Avg and PreMulSum are not implemented on device buffers yet)",
                name_t(all[q].t),
                name_op(all[q].op)
            )));
        }
        if let Some(q) = all.iter().position(|e| (e.count, e.t, e.op) != (count, me.t, me.op)) {
            let e = all[q];
            return Err(CudaError::Invalid(format!(
                "rank {rank}: all_reduce of {count} elements of {t} with {op}, but rank {q} passed {} elements of {} with {}",
                e.count,
                name_t(e.t),
                name_op(e.op)
            )));
        }
        if count == 0 {
            return Ok(());
        }
        self.dev.make_current()?;
        let elem = t.size_bytes();
        let per = slice_len(count, p, elem);
        let sms = self.dev.sms.max(1) as u32;
        let resident = self.kernels.max_blocks_per_sm(t, op)?;
        if resident == 0 {
            return Err(CudaError::Invalid(format!(
                "rank {rank}: the {t:?} {op:?} kernel does not fit a multiprocessor"
            )));
        }
        let cap = (self.blocks_per_sm.min(resident) * sms) / p as u32;
        let g = blocks_for(per * elem, cap);
        let lo = (rank * per).min(count);
        let hi = ((rank + 1) * per).min(count);
        let off = (lo * elem) as u64;
        let srcs: Vec<CuDevicePtr> = all.iter().map(|e| e.send + off).collect();
        let dsts: Vec<CuDevicePtr> = all.iter().map(|e| e.recv + off).collect();
        let bar = self.shared.bar.as_ref().map_or(0, |b| b.ptr);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.last.is_some_and(|h| h != s.h as usize) {
            // Calls of one rank must not overlap: the new stream waits for the last call.
            if let Some(ev) = &st.done {
                s.wait(ev)?;
            }
        }
        let b = Bar {
            arr: bar,
            dep: bar + 128,
            fail: bar + 192,
            host: self.shared.fail_dev,
            seq: st.seq + 1,
            depart: st.depart + g as u64 * p as u64,
            timeout_ns: self.shared.timeout.map_or(0, |t| t.as_nanos().clamp(1, u64::MAX as u128) as u64),
            rank: rank as i32,
            p: p as i32,
        };
        self.kernels.reduce_met(s, t, op, &srcs, &dsts, hi - lo, g, &b)?;
        if st.done.is_none() {
            st.done = Some(Event::sync_only(&self.dev)?);
        }
        if let Some(ev) = &st.done {
            // Recorded now (not at a switch) so that a stream the caller destroys after the
            // call is never touched again.
            ev.record(s)?;
        }
        st.seq = b.seq;
        st.depart = b.depart;
        st.last = Some(s.h as usize);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_buffer_and_start_aligned() {
        for p in 1..=8 {
            for count in [0usize, 1, 2, 7, 64, 1000, 1 << 20, (1 << 20) + 3] {
                for elem in [1usize, 2, 4, 8] {
                    let per = slice_len(count, p, elem);
                    assert_eq!((per * elem) % 16, 0);
                    assert!(per * p >= count, "p={p} count={count}");
                }
            }
        }
    }

    /// The meeting point hands every rank the same table, round after round.
    #[test]
    fn exchange_gives_every_rank_every_entry_each_round() {
        let shared = Arc::new(Shared::new(4, None));
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let sh = shared.clone();
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        let v = Entry { send: round * 10 + r as u64, ..Entry::default() };
                        let all = sh.exchange(r, v).unwrap();
                        for (q, e) in all.iter().enumerate() {
                            assert_eq!(e.send, round * 10 + q as u64, "rank {r} round {round}");
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
            assert!(e.contains("for ranks [2]") || e.contains("unusable"), "{e}");
            assert!(e.contains("[2]"), "{e}");
        }
        let late = shared.exchange(2, Entry::default()).expect_err("the group is broken");
        assert!(late.to_string().contains("rank 2: the group is unusable"), "{late}");
    }

    #[test]
    fn blocks_cover_the_slice_within_the_cap() {
        assert_eq!(blocks_for(0, 33), 1);
        assert_eq!(blocks_for(8, 33), 1);
        assert_eq!(blocks_for(BLOCK_PASS_BYTES, 33), 1);
        assert_eq!(blocks_for(BLOCK_PASS_BYTES + 1, 33), 2);
        assert_eq!(blocks_for(1 << 30, 33), 33);
        assert_eq!(blocks_for(1 << 30, 0), 1);
    }

    #[test]
    fn a_device_failure_names_the_waiter_and_the_culprit() {
        let arrival = 1 | (3 << 16); // rank 0 waited for rank 3
        let m = describe_failure(arrival, 7, Some(Duration::from_millis(300)));
        assert_eq!(
            m,
            "at call 7, rank 0's kernel waited 300ms for rank 3's kernel to start (its stream is held up by earlier work)"
        );
        let departure = 1 | (2 << 8) | (0xff << 16) | (1 << 24);
        let m = describe_failure(departure, 9, None);
        assert_eq!(m, "at call 9, rank 2's kernel waited forever for the other ranks' kernels to finish");
    }
}
