//! The CPU model of kernels/sync.cu's GPU meeting (`Sync`, `sync_arrive`, `sync_depart`): its
//! counters as atomics (`crate::sync`) and each step a block takes on them, written line for
//! line after the kernel's. Two checks drive these steps: `Emu` (the tests) steps the blocks
//! of planned launches in random orders, looking for deadlocks in the plans; the model check
//! (`--features model`, the `model` tests below) runs one thread per rank under loom, looking
//! for an interleaving or a stale read that breaks the meeting's promises.
//!
//! Rules (kernels/sync.cu's, for a CPU):
//! 1. `__threadfence()` is a SeqCst fence; `atomicMax`/`atomicAdd` are relaxed
//!    read-modify-writes; `ld_acq` is an acquire load. Each step keeps the kernel's order of
//!    fence, update and wait.
//! 2. Collectives: block 0 of a rank raises `arr[rank]` to the launch's `seq` at its start
//!    (after its stream's earlier work, by the fence); every block waits until each rank's
//!    `arr` reaches `seq`. At its end every block adds one to `dep` (after its writes, by the
//!    fence), and block 0 waits until `dep` reaches `depart` (every rank's blocks of every
//!    collective launch so far) before the launch ends.
//! 3. Sends and receives, per peer: a sender raises `pready[rank·p + q]` at its start, a
//!    receiver waits for `pready[q·p + rank]`; at the end, once all of its launch's blocks
//!    counted themselves in `mydep[rank]`, a receiver raises `pdone[q·p + rank]` and a
//!    sender's block 0 waits for `pdone[rank·p + q]`.

use super::Sync;
use crate::sync::{fence, AtomicU64, Ordering};

/// The meeting's counters of one group of `p` ranks (zero at creation, as on the device).
pub(super) struct Meeting {
    p: usize,
    /// Per rank: its latest collective launch to have started.
    pub(super) arr: Vec<AtomicU64>,
    /// Blocks of collective launches finished, over all ranks and launches.
    pub(super) dep: AtomicU64,
    /// Per rank: its blocks finished in launches that publish receives.
    pub(super) mydep: Vec<AtomicU64>,
    /// Per (sender, receiver): sends published, and receives done.
    pub(super) pready: Vec<AtomicU64>,
    pub(super) pdone: Vec<AtomicU64>,
}

fn zeros(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl Meeting {
    pub(super) fn new(p: usize) -> Meeting {
        Meeting {
            p,
            arr: zeros(p),
            dep: AtomicU64::new(0),
            mydep: zeros(p),
            pready: zeros(p * p),
            pdone: zeros(p * p),
        }
    }

    /// Block 0's arrival (`sync_arrive`): after the stream's earlier work, the rank's launch
    /// count and its sends (rules 1–3).
    pub(super) fn arrive(&self, rank: usize, s: &Sync) {
        fence(Ordering::SeqCst);
        if s.seq != 0 {
            self.arr[rank].fetch_max(s.seq, Ordering::Relaxed);
        }
        for q in 0..self.p {
            if s.send_to[q] != 0 {
                self.pready[rank * self.p + q].fetch_max(s.send_to[q], Ordering::Relaxed);
            }
        }
    }

    /// Every block's wait at the start (`sync_arrive`): whether every rank has reached the
    /// launch's collective and every peer has published the sends it receives.
    pub(super) fn arrived(&self, rank: usize, s: &Sync) -> bool {
        let p = self.p;
        (s.seq == 0 || self.arr.iter().all(|a| a.load(Ordering::Acquire) >= s.seq))
            && (0..p).all(|q| {
                s.recv_from[q] == 0 || self.pready[q * p + rank].load(Ordering::Acquire) >= s.recv_from[q]
            })
    }

    /// Every block's departure (`sync_depart`): after its writes, it counts itself.
    pub(super) fn depart(&self, rank: usize, s: &Sync) {
        fence(Ordering::SeqCst);
        if s.seq != 0 {
            self.dep.fetch_add(1, Ordering::Relaxed);
        }
        if receives(s) {
            self.mydep[rank].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Block 0, a launch that receives: whether all of its launch's blocks have departed.
    pub(super) fn mine_departed(&self, rank: usize, s: &Sync) -> bool {
        !receives(s) || self.mydep[rank].load(Ordering::Acquire) >= s.mydepart
    }

    /// Block 0, once [`mine_departed`](Self::mine_departed): says the receives are done.
    pub(super) fn received(&self, rank: usize, s: &Sync) {
        if !receives(s) {
            return;
        }
        fence(Ordering::SeqCst);
        for q in 0..self.p {
            if s.recv_done[q] != 0 {
                self.pdone[q * self.p + rank].fetch_max(s.recv_done[q], Ordering::Relaxed);
            }
        }
    }

    /// Block 0's wait at the end: every block of every collective launch so far departed.
    pub(super) fn all_departed(&self, s: &Sync) -> bool {
        s.seq == 0 || self.dep.load(Ordering::Acquire) >= s.depart
    }

    /// Block 0's last wait: every peer received this rank's sends.
    pub(super) fn sends_taken(&self, rank: usize, s: &Sync) -> bool {
        let p = self.p;
        (0..p).all(|q| {
            s.send_done[q] == 0 || self.pdone[rank * p + q].load(Ordering::Acquire) >= s.send_done[q]
        })
    }
}

/// Whether a launch publishes receives (its blocks count in `mydep`).
fn receives(s: &Sync) -> bool {
    s.recv_done.iter().any(|&n| n > 0)
}

/// Model check of the meeting under loom: a thread per rank (one block a launch) runs two
/// consecutive collective launches, planned by the group's own planner (`plan_launches`),
/// with each block's steps above. Inputs and outputs are loom cells: a rank reading a peer's
/// input before the peer's stream wrote it, a rank writing its next input while a peer may
/// still read it, or a rank reading its result before every peer wrote its share, is a data
/// race that loom reports.
#[cfg(feature = "model")]
mod model {
    use super::super::plan::{meeting_of, plan_launches, with_meeting, Counters};
    use super::super::{call, DevCall};
    use super::*;
    use crate::sync::{plain_read, plain_write, Plain};
    use loom::sync::Arc;
    use loom::thread;
    use oxccl_core::plan::device::launch::resolve;
    use oxccl_core::plan::device::{self, Bufs, DeviceColl, MAX_RANKS};
    use oxccl_core::{DataType, ReduceOp};

    const LAUNCHES: usize = 2;

    /// Rank `r`'s launches: `LAUNCHES` groups of one all-reduce, one block each, their counts
    /// resolved against the rank's device record as the kernels resolve them.
    fn plans(p: usize, r: usize) -> Vec<Sync> {
        let mut base = Counters::default();
        let bufs: Vec<Bufs> =
            (0..p).map(|q| Bufs { send: (q as u64 + 1) << 40, recv: (q as u64 + 9) << 40 }).collect();
        let mut c = Counters::default();
        let none = [0u64; MAX_RANKS];
        (0..LAUNCHES)
            .flat_map(|_| {
                let ar = DevCall::coll(DeviceColl::AllReduce, DataType::F32, ReduceOp::Sum, 1000, 0, 0);
                let tasks = vec![(ar, device::tasks(ar.collective().unwrap(), ar.count, 4, r, &bufs))];
                let units = call::collective_units(&tasks, p);
                let caps = vec![1; units.len()];
                plan_launches(&mut c, r, p, &units, &[], (&none, &none), &caps, |_| false, 0, false)
            })
            .map(|l| {
                assert!(l.ll.is_none() && l.blocks == 1);
                let (m, _) = resolve(&meeting_of(&l.sync), false, &mut base);
                with_meeting(l.sync, &m)
            })
            .collect()
    }

    struct Group {
        m: Meeting,
        /// Per rank: its input; per (rank, writer): the writer's share of the rank's output.
        input: Vec<Plain>,
        output: Vec<Plain>,
    }

    fn val(r: usize, k: usize) -> u64 {
        100 * k as u64 + r as u64
    }

    /// Rank `r`'s stream: before each launch its input is written; the launch's block meets
    /// the others (`sync_arrive`), works (reads every input, writes its share of every
    /// output), departs and waits (`sync_depart`); after it the results are read.
    fn rank(g: &Group, p: usize, r: usize, plans: &[Sync]) {
        let spin = |ready: &dyn Fn() -> bool| {
            while !ready() {
                thread::yield_now();
            }
        };
        for (k, s) in plans.iter().enumerate() {
            assert_eq!(s.seq, k as u64 + 1, "launch {k}'s generation");
            plain_write(&g.input[r], val(r, k));
            g.m.arrive(r, s);
            spin(&|| g.m.arrived(r, s));
            let sum: u64 = (0..p).map(|q| plain_read(&g.input[q])).sum();
            assert_eq!(sum, (0..p).map(|q| val(q, k)).sum::<u64>(), "rank {r}, launch {k}: the inputs");
            for q in 0..p {
                plain_write(&g.output[q * p + r], sum + k as u64);
            }
            g.m.depart(r, s);
            spin(&|| g.m.mine_departed(r, s));
            g.m.received(r, s);
            spin(&|| g.m.all_departed(s));
            spin(&|| g.m.sends_taken(r, s));
            // The stream goes on: its result is read.
            for q in 0..p {
                let v = plain_read(&g.output[r * p + q]);
                assert_eq!(v, sum + k as u64, "rank {r}, launch {k}: rank {q}'s share");
            }
        }
    }

    fn run(p: usize, preemptions: Option<usize>) -> usize {
        let all: Vec<Vec<Sync>> = (0..p).map(|r| plans(p, r)).collect();
        let name = format!("device meeting: {p} ranks, {LAUNCHES} launches");
        crate::sync::model(&name, preemptions, move || {
            let g = Arc::new(Group {
                m: Meeting::new(p),
                input: (0..p).map(|_| Plain::new(0)).collect(),
                output: (0..p * p).map(|_| Plain::new(0)).collect(),
            });
            let others: Vec<_> = (1..p)
                .map(|r| {
                    let (g, plans) = (g.clone(), all[r].clone());
                    thread::spawn(move || rank(&g, p, r, &plans))
                })
                .collect();
            rank(&g, p, 0, &all[0]);
            for t in others {
                t.join().unwrap();
            }
        })
    }

    /// Two ranks, every interleaving.
    #[test]
    fn model_device_meeting_two_ranks() {
        assert!(run(2, None) > 1);
    }

    /// Three ranks, without preemptions: threads switch where one waits or ends (every
    /// value each load may read is still explored); one preemption ran past 200 s.
    #[test]
    fn model_device_meeting_three_ranks() {
        assert!(run(3, Some(0)) > 1);
    }
}
