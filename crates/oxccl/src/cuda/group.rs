//! Ranks as threads of one process on one device: collectives on device buffers, enqueued on
//! each rank's stream, the data moved by the reduce-copy kernels reading and writing the other
//! ranks' buffers directly (one context, so no IPC mapping is needed).
//!
//! AllReduce: rank r reduces slice r of every rank's input and writes it into slice r of every
//! rank's output, so each input byte is read once and each output byte written once (the
//! bound the issue sets). Ordering, all on the streams: r's kernel waits for every rank's
//! "ready" event (its input written, its output free), and r's later work waits for every
//! rank's "done" event (every slice of r's output written, every rank finished reading r's
//! input). The host threads meet twice per call to exchange pointers and to know the events
//! are recorded (a stream must not wait on an event before it is recorded); nothing waits for
//! the GPU. Every rank's events live in the group's shared part, so no rank can destroy one
//! while another still enqueues a wait on it.

use super::driver::CuDevicePtr;
use super::kernels::{Kernels, MAX_SOURCES};
use super::{CudaError, Device, Event, Stream};
use oxccl_core::{DataType, ReduceOp};
use std::sync::{Arc, Condvar, Mutex};

#[derive(Clone, Copy, Default)]
struct Entry {
    send: CuDevicePtr,
    recv: CuDevicePtr,
    count: usize,
}

#[derive(Default)]
struct Round {
    generation: u64,
    arrived: usize,
    vals: Vec<Entry>,
    out: Arc<Vec<Entry>>,
}

/// How long a rank spins for the others at a meeting before it sleeps (the meetings are two
/// per call, so a sleep and wake-up at each would be most of a small call's cost).
const MEET_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

struct Shared {
    p: usize,
    /// `Round::generation`, readable without the lock (for the spin).
    generation: std::sync::atomic::AtomicU64,
    round: Mutex<Round>,
    cv: Condvar,
    /// Each rank's (ready, done) events.
    events: Vec<(Event, Event)>,
}

impl Shared {
    /// Every rank's `v` for this round, once all have given theirs.
    fn exchange(&self, rank: usize, v: Entry) -> Arc<Vec<Entry>> {
        let mut r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        if r.vals.len() != self.p {
            r.vals = vec![Entry::default(); self.p];
        }
        r.vals[rank] = v;
        r.arrived += 1;
        if r.arrived == self.p {
            r.out = Arc::new(r.vals.clone());
            r.arrived = 0;
            r.generation += 1;
            self.generation.store(r.generation, std::sync::atomic::Ordering::Release);
            self.cv.notify_all();
            return r.out.clone();
        }
        let g = r.generation;
        drop(r);
        // `out` stays this round's until every rank (this one too) has given its next value.
        let t = std::time::Instant::now();
        while self.generation.load(std::sync::atomic::Ordering::Acquire) == g && t.elapsed() < MEET_SPIN {
            std::hint::spin_loop();
        }
        let mut r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        while r.generation == g {
            r = self.cv.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        r.out.clone()
    }
}

/// One rank (thread) of a group made by [`thread_group`]: its device and kernels.
pub struct Member {
    pub rank: usize,
    shared: Arc<Shared>,
    pub dev: Device,
    pub kernels: Kernels,
}

/// Makes `p` members (2 to 8) of one group; each is moved to its own thread.
pub fn thread_group(p: usize, ordinal: i32) -> Result<Vec<Member>, CudaError> {
    if !(1..=MAX_SOURCES).contains(&p) {
        return Err(CudaError::Invalid(format!("a thread group has 1 to {MAX_SOURCES} ranks, not {p}")));
    }
    let devs: Vec<Device> = (0..p).map(|_| Device::open(ordinal)).collect::<Result<_, _>>()?;
    let events = devs
        .iter()
        .map(|d| Ok((Event::sync_only(d)?, Event::sync_only(d)?)))
        .collect::<Result<Vec<_>, CudaError>>()?;
    let shared = Arc::new(Shared {
        p,
        generation: Default::default(),
        round: Mutex::new(Round::default()),
        cv: Condvar::new(),
        events,
    });
    devs.into_iter()
        .enumerate()
        .map(|(rank, dev)| {
            Ok(Member { rank, shared: shared.clone(), kernels: Kernels::load(&dev, &[])?, dev })
        })
        .collect()
}

/// Elements per slice: a multiple of 16 bytes' worth, so every slice starts 16-byte aligned
/// when the buffers do.
fn slice_len(count: usize, p: usize, elem: usize) -> usize {
    let align = (16 / elem).max(1);
    count.div_ceil(p).div_ceil(align) * align
}

impl Member {
    pub fn size(&self) -> usize {
        self.shared.p
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
        if op == ReduceOp::Avg {
            return Err(CudaError::Invalid("Avg on device buffers is not implemented yet".into()));
        }
        let p = self.shared.p;
        self.dev.make_current()?;
        let ev = &self.shared.events;
        ev[self.rank].0.record(s)?;
        let all = self.shared.exchange(self.rank, Entry { send, recv, count });
        if let Some(q) = all.iter().position(|e| e.count != count) {
            // Every rank sees the same table, so every rank refuses (after the second meeting,
            // so none is left waiting).
            let _ = self.shared.exchange(self.rank, Entry::default());
            return Err(CudaError::Invalid(format!(
                "rank {}: all_reduce of {count} elements, but rank {q} passed {}",
                self.rank, all[q].count
            )));
        }
        for (q, e) in ev.iter().enumerate() {
            if q != self.rank {
                s.wait(&e.0)?;
            }
        }
        let elem = t.size_bytes();
        let per = slice_len(count, p, elem);
        let lo = (self.rank * per).min(count);
        let hi = ((self.rank + 1) * per).min(count);
        if hi > lo {
            let off = (lo * elem) as u64;
            let srcs: Vec<CuDevicePtr> = all.iter().map(|e| e.send + off).collect();
            let dsts: Vec<CuDevicePtr> = all.iter().map(|e| e.recv + off).collect();
            self.kernels.reduce_multi(s, t, op, &srcs, &dsts, hi - lo)?;
        }
        ev[self.rank].1.record(s)?;
        let _ = self.shared.exchange(self.rank, Entry::default());
        for (q, e) in ev.iter().enumerate() {
            if q != self.rank {
                s.wait(&e.1)?;
            }
        }
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
        let shared = Arc::new(Shared {
            p: 4,
            generation: Default::default(),
            round: Mutex::new(Round::default()),
            cv: Condvar::new(),
            events: Vec::new(),
        });
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let sh = shared.clone();
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        let v = Entry { send: round * 10 + r as u64, ..Entry::default() };
                        let all = sh.exchange(r, v);
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
}
