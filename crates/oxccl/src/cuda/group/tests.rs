//! Tests of the thread group: planning, mismatches, and a CPU model of the meetings (`Emu`)
//! run under random interleavings.

use super::meeting::Meeting;
use super::*;
use oxccl_core::plan::device::launch::resolve;

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
    let a = DevCall::coll(device::DeviceColl::AllReduce, DataType::F32, ReduceOp::Sum, 10, 1, 2);
    let b = DevCall::coll(device::DeviceColl::AllReduce, DataType::F32, ReduceOp::Max, 10, 3, 4);
    let all =
        vec![Entry { calls: vec![a], ..Entry::default() }, Entry { calls: vec![b], ..Entry::default() }];
    let m = mismatch(0, &all).unwrap();
    assert!(m.contains("all_reduce of 10 x float (sum)") && m.contains("(max)"), "{m}");
    let same =
        vec![Entry { calls: vec![a], ..Entry::default() }, Entry { calls: vec![a], ..Entry::default() }];
    assert_eq!(mismatch(1, &same), None);
}

/// A CPU model of kernels/sync.cu's meeting (`sync_arrive`, `sync_depart`: the counters and each
/// block's steps on them are `meeting::Meeting`'s; and the LL flag exchange): each rank's
/// launches run in stream order, every block of the running launches is stepped
/// round-robin (the GPU runs them at once: they are all resident). It reports a
/// deadlock (no block can move), and checks the promises the counters make: a collective
/// launch works only once every rank's stream reached it and no rank starts the next one
/// before every block of it is done; a receive copies only after its sender published the
/// send, and a sender's launch ends only after the copy.
///
/// Launches come as the kernels take them: counts relative to each rank's device record,
/// resolved (and the record advanced) when the launch reaches the head of its stream, as
/// kernels/sync.cu's `sync_resolve` does, so a queue may hold the same launches replayed (a CUDA
/// graph). LL lines are modelled per (writer, parity) slot with the flag and the writer's
/// own count of LL launches run: a reader takes a line only when its flag is the call's, and
/// the line must then come from the writer's launch of the same rank (no stale line).
struct Emu {
    p: usize,
    m: Meeting,
    /// Per (writer, parity): the flag and the writer's LL launch count of the line there.
    slots: HashMap<(usize, u32), (u32, u64)>,
    /// Per rank: LL launches it has started.
    ll_runs: Vec<u64>,
    /// Per rank: the device record.
    base: Vec<Counters>,
    /// Resolve with a record (the kernels' way); false: take the counts as absolute, as
    /// kernels captured with absolute numbers would replay them (the model must then fail).
    relative: bool,
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
/// the messages whose buffers the stream may reuse once it ends ((receiver, number));
/// message numbers are relative to the group's start until the launch is resolved.
#[derive(Clone)]
struct L {
    plan: Planned,
    recvs: Vec<(usize, u64)>,
    sends: Vec<(usize, u64)>,
}

impl Emu {
    fn new(p: usize) -> Emu {
        Emu {
            p,
            m: Meeting::new(p),
            slots: HashMap::new(),
            ll_runs: vec![0; p],
            base: vec![Counters::default(); p],
            relative: true,
            departed: HashMap::new(),
            copied: Default::default(),
            nonempty: Vec::new(),
        }
    }

    /// Moves block `b` of `rank`'s launch `l` one state on; whether it moved.
    fn step(&mut self, rank: usize, l: &L, b: usize, st: &mut B) -> bool {
        let (p, s) = (self.p, &l.plan.sync);
        if let Some(n) = l.plan.ll {
            // LL: publish this call's lines in slot (rank, parity), then wait until every
            // rank's slot of that parity carries this call's flag.
            let par = n % 2;
            return match *st {
                B::Start => {
                    self.ll_runs[rank] += 1;
                    self.slots.insert((rank, par), (n, self.ll_runs[rank]));
                    *st = B::Arrive;
                    true
                }
                B::Arrive if (0..p).all(|q| self.slots.get(&(q, par)).is_some_and(|x| x.0 == n)) => {
                    for q in 0..p {
                        let (_, run) = self.slots[&(q, par)];
                        assert_eq!(
                            run, self.ll_runs[rank],
                            "rank {rank} takes rank {q}'s line of its LL launch {run} in its own launch {} (flag {n}): a stale line",
                            self.ll_runs[rank]
                        );
                    }
                    *st = B::Done;
                    true
                }
                _ => false,
            };
        }
        let m = &self.m;
        let next = match *st {
            B::Start => {
                if b == 0 {
                    m.arrive(rank, s);
                }
                B::Arrive
            }
            B::Arrive => {
                if !m.arrived(rank, s) {
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
                            m.pready[q * p + rank].load(Ordering::Relaxed) >= k,
                            "rank {rank} copies message {k} of rank {q} before it was sent"
                        );
                        self.copied.insert((q, rank, k));
                    }
                }
                B::Depart
            }
            B::Depart => {
                m.depart(rank, s);
                if s.seq != 0 {
                    self.departed.entry(s.seq).or_insert((0, 0)).0 += 1;
                }
                if b == 0 {
                    B::Mine
                } else {
                    B::Done
                }
            }
            B::Mine => {
                if !m.mine_departed(rank, s) {
                    return false;
                }
                m.received(rank, s);
                B::All
            }
            B::All => {
                if !m.all_departed(s) {
                    return false;
                }
                B::Sends
            }
            B::Sends => {
                if !m.sends_taken(rank, s) {
                    return false;
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
        // Each launch reads its rank's record at the head of its stream; launches of a rank
        // run in order, so resolving them in queue order now is resolving them then.
        for (r, q) in queues.iter_mut().enumerate() {
            for l in q.iter_mut() {
                let before = self.base[r].clone();
                if self.relative {
                    let rel = meeting_of(&l.plan.sync);
                    let (m, ll) = resolve(&rel, l.plan.ll.is_some(), &mut self.base[r]);
                    l.plan.sync = with_meeting(l.plan.sync, &m);
                    l.plan.ll = ll;
                }
                for (q, k) in l.recvs.iter_mut() {
                    *k += before.received[*q];
                    self.nonempty.push((*q, r, *k));
                }
                for (q, k) in l.sends.iter_mut() {
                    *k += before.sent[*q];
                }
            }
        }
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
                            assert_eq!(
                                done, all,
                                "rank {r}'s collective launch {} ends while other ranks' blocks still work",
                                s.seq
                            );
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
                    .filter_map(|(r, x)| x.as_ref().map(|(l, b)| format!("rank {r}: {:?} {:?}", l.plan, b)))
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

/// Every rank's launches of `groups` random groups of collectives (the same on every rank)
/// and sends/receives (random pairs, self included, some empty), planned by every rank with
/// the engine's own functions (`call::collective_units`, `call::p2p_units`, `plan_launches`):
/// per rank, per group, its launches. `p2p`: whether groups have sends and receives; `ll_on`:
/// whether small all-reduces run as LL. Also how many groups merged.
fn random_groups(
    p: usize,
    groups: usize,
    ll_on: bool,
    p2p_on: bool,
    rng: &mut Rng,
) -> (Vec<Vec<Vec<L>>>, usize) {
    use device::DeviceColl;
    let mut merged = 0;
    let mut counters = vec![Counters::default(); p];
    let mut out: Vec<Vec<Vec<L>>> = (0..p).map(|_| Vec::new()).collect();
    let bufs: Vec<Bufs> =
        (0..p).map(|q| Bufs { send: (q as u64 + 1) << 40, recv: (q as u64 + 9) << 40 }).collect();
    for _group in 0..groups {
        // Collectives every rank makes alike.
        let kinds = [
            DeviceColl::AllReduce,
            DeviceColl::AllGather,
            DeviceColl::AllToAll,
            DeviceColl::Broadcast(p - 1),
            DeviceColl::ReduceScatter,
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
        for _ in 0..if p2p_on { rng.next(4 * p as u64 + 12) } else { 0 } {
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
                // Message numbers relative to the group's start (see `Emu::run`).
                if a == r {
                    sent[b] += 1;
                    sends.push((b, sent[b]));
                }
                if b == r {
                    recv[a] += 1;
                    if bytes > 0 {
                        tasks.push(Task::copy(((a as u64) << 32) | recv[a], vec![1], bytes));
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
                    && matches!(u.calls.as_slice(), [c] if c.what == What::Coll(DeviceColl::AllReduce) && c.bytes() <= LL_MAX_BYTES)
            };
            // Whether sends and receives ride in the last collective launch: decided
            // alike from every rank's receive count (as the host meeting gives them).
            let recv_tasks: Vec<usize> =
                (0..p).map(|q| msgs.iter().filter(|m| m.1 == q && m.2 > 0).count()).collect();
            let merge = !p2p.is_empty() && merges(&units, &recv_tasks, p, ll);
            merged += (merge && r == 0) as usize;
            let plans =
                plan_launches(&mut counters[r], r, p, &units, &p2p, (&sent, &recv), &caps, ll, 0, merge);
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
            let mut group = Vec::new();
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
                group.push(L { plan, recvs: mine, sends });
            }
            out[r].push(group);
        }
    }
    (out, merged)
}

/// Random groups run through the meeting's model: no deadlock, and every promise the
/// counters make holds.
#[test]
fn planned_launches_meet_without_deadlock_and_keep_their_promises() {
    let mut rng = Rng(7);
    let mut merged_total = 0;
    for _trial in 0..300 {
        let p = 2 + rng.next(7) as usize;
        let ll_on = rng.next(2) == 0;
        let (groups, merged) = random_groups(p, 8, ll_on, true, &mut rng);
        merged_total += merged;
        let queues: Vec<VecDeque<L>> =
            groups.into_iter().map(|g| g.into_iter().flatten().collect()).collect();
        let total: usize = queues.iter().map(|q| q.len()).sum();
        assert!(total > 0);
        Emu::new(p).run(queues, &mut rng);
    }
    assert!(merged_total > 0, "no group merged in any trial");
}

/// Every rank's stream: the groups before `from` once (eager calls), the groups from `from`
/// to `to` (a CUDA graph's capture) replayed `replays` times, then the rest once.
fn replayed(groups: Vec<Vec<Vec<L>>>, from: usize, to: usize, replays: usize) -> Vec<VecDeque<L>> {
    groups
        .into_iter()
        .map(|g| {
            let mut q: VecDeque<L> = g[..from].iter().flatten().cloned().collect();
            for _ in 0..replays {
                q.extend(g[from..to].iter().flatten().cloned());
            }
            q.extend(g[to..].iter().flatten().cloned());
            q
        })
        .collect()
}

/// Graph replay (issue 28's CPU side): random groups, a random run of them captured and
/// replayed a random number of times between eager groups, every launch resolved against its
/// rank's device record as the kernels do: no deadlock, no promise broken, no stale LL line.
#[test]
fn replayed_launches_meet_with_fresh_numbers() {
    let mut rng = Rng(28);
    let mut replays_total = 0;
    for _trial in 0..200 {
        let p = 2 + rng.next(7) as usize;
        let n = 2 + rng.next(6) as usize;
        let (groups, _) = random_groups(p, n, rng.next(3) != 0, rng.next(4) != 0, &mut rng);
        let from = rng.next(n as u64) as usize;
        let to = from + 1 + rng.next((n - from) as u64) as usize;
        let replays = 1 + rng.next(5) as usize;
        replays_total += replays;
        Emu::new(p).run(replayed(groups, from, to, replays), &mut rng);
    }
    assert!(replays_total > 200);
}

/// The model fails launches replayed with the numbers they were captured with (no record):
/// the check above can fail.
#[test]
fn replaying_captured_numbers_is_caught_by_the_model() {
    for (seed, ll_on) in [(3, true), (4, false)] {
        let mut rng = Rng(seed);
        let (mut groups, _) = random_groups(3, 2, ll_on, false, &mut rng);
        // The numbers of the capture, absolute: what kernels without a record would replay.
        for rank in groups.iter_mut() {
            let mut c = Counters::default();
            for l in rank.iter_mut().flatten() {
                let (m, ll) = resolve(&meeting_of(&l.plan.sync), l.plan.ll.is_some(), &mut c);
                l.plan.sync = with_meeting(l.plan.sync, &m);
                l.plan.ll = ll;
            }
        }
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut emu = Emu::new(3);
            emu.relative = false;
            emu.run(replayed(groups, 0, 2, 3), &mut rng);
        }));
        assert!(caught.is_err(), "replaying absolute numbers went unnoticed (LL {ll_on})");
    }
    // LL alone: a replayed flag would let a reader take the line of an earlier launch.
    let p = 3;
    let lone: Vec<Vec<Vec<L>>> = (0..p)
        .map(|r| {
            let mut c = Counters::default();
            (1..=2u32)
                .map(|n| {
                    assert_eq!(next_ll_seq(&mut c), n, "rank {r}");
                    let plan = Planned::ll_launch(n);
                    vec![L { plan, recvs: Vec::new(), sends: Vec::new() }]
                })
                .collect()
        })
        .collect();
    let mut emu = Emu::new(p);
    emu.relative = false;
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        emu.run(replayed(lone, 0, 2, 2), &mut Rng(5))
    }));
    let why = caught.err().and_then(|e| e.downcast_ref::<String>().cloned()).unwrap_or_default();
    assert!(why.contains("a stale line"), "an LL flag replayed went unnoticed: {why:?}");
}

#[test]
fn blocks_cover_the_work_within_the_cap() {
    let blocks_for = |b, cap| oxccl_core::plan::device::launch::blocks_for(b, cap, BLOCK_PASS_BYTES);
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
    assert_eq!(describe_failure(send, 0, None), "rank 1's kernel waited forever for rank 2's send to start");
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
