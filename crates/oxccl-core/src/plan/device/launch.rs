//! Launch planning for the device path, pure: how many blocks each launch of a group takes,
//! whether a group's sends and receives ride in its last collective launch, and the counters
//! the GPU meeting keeps between calls. The runtime's device group (`oxccl::cuda::group`)
//! turns each [`Planned`] into its kernels' meeting arguments, adding addresses.
//!
//! Rules:
//! 1. Every rank computes the same collective launches, block counts and call numbers from the
//!    same calls: block counts of collective launches come from global arguments only (the
//!    most bytes any rank moves, [`Launch::work`]), never from this rank's own tasks; that is
//!    what lets the ranks' kernels meet.
//! 2. A collective launch's meeting number (`seq`) counts this rank's collective launches; its
//!    departure target (`depart`) counts every rank's blocks of collective launches so far.
//!    An LL all-reduce meets through its flags instead and takes an LL call number (from 1,
//!    never 0: the LL buffer starts zeroed).
//! 3. Sends and receives: the group's first send/receive launch publishes every send and
//!    waits for every send it receives; the last, once its copies are done, publishes its
//!    receives and waits until the peers have received this rank's sends. Counts are
//!    cumulative per peer over the communicator's life.
//! 4. Merging ([`merges`]) is all ranks or none, decided from what every rank told the host
//!    meeting: a launch that waits for a peer's sends at its start deadlocks if that peer
//!    publishes them only in a later launch.
//! 5. The kernels take a launch's meeting relative to a record each rank keeps in device
//!    memory and the kernels advance ([`resolve`]): every count is the record's plus the
//!    launch's own (0 stays 0); sends and receives advance the record only by the group's last
//!    send/receive launch (its `send_done`, `recv_done`). So the same launches, replayed (a
//!    CUDA graph), meet with fresh numbers, and eager launches between replays keep counting.

use super::MAX_RANKS;

/// One launch as planning sees it.
pub trait Launch {
    /// Whether it holds collectives (and so meets every rank).
    fn collective(&self) -> bool;
    /// The most bytes any rank reads and writes in its collectives (the same on every rank).
    fn work(&self) -> usize;
    /// Bytes this rank's own tasks read and write.
    fn own_bytes(&self) -> usize;
    /// The most tasks any rank's part of its collectives has (the same on every rank).
    fn nominal_tasks(&self, p: usize) -> usize;
}

/// The GPU meeting's arithmetic one rank keeps between calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Collective launches so far (the GPU meeting's `seq` of the last one).
    pub seq: u64,
    /// Blocks of collective launches so far by every rank (the departure target).
    pub depart: u64,
    /// This rank's blocks of launches that publish receives, so far.
    pub mydepart: u64,
    /// LL all-reduces so far.
    pub ll_seq: u32,
    /// Sends to, and receives from, each peer so far.
    pub sent: [u64; MAX_RANKS],
    pub received: [u64; MAX_RANKS],
}

/// A launch's meeting: the counts its kernel publishes and waits for (0: nothing to do).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meeting {
    /// This rank's count of collective launches including this one; 0: none in this launch.
    pub seq: u64,
    /// Blocks of every rank over all collective launches up to this one.
    pub depart: u64,
    /// This rank's blocks over all its launches that publish receives, this one included.
    pub mydepart: u64,
    /// Per peer, at the start: publish this rank's count of sends to it.
    pub send_to: [u64; MAX_RANKS],
    /// Per peer, at the start: wait until it has published this many sends to this rank.
    pub recv_from: [u64; MAX_RANKS],
    /// Per peer, at the end: publish this many receives.
    pub recv_done: [u64; MAX_RANKS],
    /// Per peer, at the end: wait until it has received this many of this rank's sends.
    pub send_done: [u64; MAX_RANKS],
}

/// One launch as planned: its blocks and its meeting, or, for an LL all-reduce, its LL call
/// number; `rel`: the meeting relative to the rank's device record (rule 5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub blocks: u32,
    pub meeting: Meeting,
    pub rel: Meeting,
    pub ll: Option<u32>,
}

/// What a launch with a device record does to it (kernels/sync.cu's `sync_resolve` and
/// `ll_resolve`, rule 5): turns its relative meeting `rel` (or, for an LL launch, its next
/// call number) into absolute counts and advances `base` past the launch. The CPU models of
/// the device protocol run launches through it, replayed as a CUDA graph replays them.
pub fn resolve(rel: &Meeting, ll: bool, base: &mut Counters) -> (Meeting, Option<u32>) {
    if ll {
        return (Meeting::default(), Some(next_ll_seq(base)));
    }
    let m = shifted(rel, base, |v, b| v + b);
    base.seq += rel.seq;
    base.depart += rel.depart;
    base.mydepart += rel.mydepart;
    for q in 0..MAX_RANKS {
        base.sent[q] += rel.send_done[q];
        base.received[q] += rel.recv_done[q];
    }
    (m, None)
}

/// Every count of `m` but 0 combined by `f` with its counter of `c` (collective launches,
/// departure target, own receiving blocks; sends to, and receives from, each peer).
fn shifted(m: &Meeting, c: &Counters, f: impl Fn(u64, u64) -> u64) -> Meeting {
    let g = |v: u64, b: u64| if v == 0 { 0 } else { f(v, b) };
    let mut r = Meeting {
        seq: g(m.seq, c.seq),
        depart: g(m.depart, c.depart),
        mydepart: g(m.mydepart, c.mydepart),
        ..Meeting::default()
    };
    for q in 0..MAX_RANKS {
        r.send_to[q] = g(m.send_to[q], c.sent[q]);
        r.send_done[q] = g(m.send_done[q], c.sent[q]);
        r.recv_from[q] = g(m.recv_from[q], c.received[q]);
        r.recv_done[q] = g(m.recv_done[q], c.received[q]);
    }
    r
}

impl Planned {
    /// Whether the launch meets other ranks' launches through the counters.
    pub fn meets(&self) -> bool {
        let m = &self.meeting;
        self.ll.is_none()
            && (m.seq != 0
                || [&m.send_to, &m.recv_from, &m.recv_done, &m.send_done]
                    .iter()
                    .any(|a| a.iter().any(|&n| n > 0)))
    }
}

/// Blocks for `bytes` of work, two passes of `pass_bytes` a block, at least 1 and at most
/// `cap` (at least 1).
pub fn blocks_for(bytes: usize, cap: u32, pass_bytes: usize) -> u32 {
    (bytes.div_ceil(2 * pass_bytes.max(1)) as u32).clamp(1, cap.max(1))
}

/// Whether every rank's sends and receives of a group ride in its last collective launch
/// (one launch fewer): the group has collectives, the last collective launch is not LL, and
/// every rank's receive copies (`recv_tasks`, as each told the host meeting) fit beside its
/// collective tasks within `max_tasks` (counted as packing counts them, alike everywhere).
/// Copies run in any kernel, and the launch keeps the collective's block count, so every
/// rank counts the same collective blocks (rule 4).
pub fn merges<U: Launch>(
    units: &[U],
    recv_tasks: &[usize],
    p: usize,
    max_tasks: usize,
    ll: impl Fn(&U) -> bool,
) -> bool {
    match units.last() {
        Some(u) => !ll(u) && recv_tasks.iter().all(|&n| u.nominal_tasks(p) + n <= max_tasks),
        None => false,
    }
}

/// How a group's launches are shaped beyond their calls: `caps[i]` the most blocks launch i
/// of the collective then send/receive launches may take, and the bytes of one block's pass.
#[derive(Clone, Copy, Debug)]
pub struct Shape<'a> {
    pub caps: &'a [u32],
    pub pass_bytes: usize,
}

/// Plans rank `rank`'s launches of a group (collective launches `units`, then send/receive
/// launches `p2p`; `sent[q]` sends to and `recv[q]` receives from each peer in the group;
/// `ll(u)` whether a collective launch runs as LL; `merge`: the first send/receive launch
/// rides in the last collective launch, see [`merges`]) and advances `c` past them. One plan
/// per launch made: with `merge`, one fewer than `units` and `p2p` (rules 1 to 3).
#[allow(clippy::too_many_arguments)]
pub fn plan_launches<U: Launch>(
    c: &mut Counters,
    p: usize,
    units: &[U],
    p2p: &[U],
    (sent, recv): (&[u64; MAX_RANKS], &[u64; MAX_RANKS]),
    shape: Shape<'_>,
    ll: impl Fn(&U) -> bool,
    merge: bool,
) -> Vec<Planned> {
    let (n_coll, n_p2p) = (units.len(), p2p.len());
    let mut out = Vec::with_capacity(n_coll + n_p2p);
    // The device record as the group's launches find it (rule 5).
    let start = c.clone();
    // Launch by launch for the collective counts, at the group's start for sends and receives.
    let relative = |m: &Meeting, before: &Counters| {
        let record = Counters { sent: start.sent, received: start.received, ..before.clone() };
        shifted(m, &record, |v, b| v - b)
    };
    // The send/receive part of launch j among the group's send/receive launches (rule 3).
    let p2p_part = |c: &mut Counters, m: &mut Meeting, j: usize, blocks: u32| {
        for q in 0..p.min(MAX_RANKS) {
            if j == 0 && sent[q] > 0 {
                m.send_to[q] = c.sent[q] + sent[q];
            }
            if j == 0 && recv[q] > 0 {
                m.recv_from[q] = c.received[q] + recv[q];
            }
            if j + 1 == n_p2p && recv[q] > 0 {
                m.recv_done[q] = c.received[q] + recv[q];
            }
            if j + 1 == n_p2p && sent[q] > 0 {
                m.send_done[q] = c.sent[q] + sent[q];
            }
        }
        if m.recv_done.iter().any(|&n| n > 0) {
            c.mydepart += blocks as u64;
            m.mydepart = c.mydepart;
        }
    };
    for (i, u) in units.iter().chain(p2p).enumerate() {
        if merge && i == n_coll {
            continue; // rode in the last collective launch
        }
        let cap = shape.caps.get(i).copied().unwrap_or(1);
        let mut m = Meeting::default();
        if u.collective() && ll(u) {
            out.push(Planned { blocks: 0, meeting: m, rel: m, ll: Some(next_ll_seq(c)) });
            continue;
        }
        let before = c.clone();
        let blocks;
        if u.collective() {
            // The same number of blocks on every rank: from global arguments only (rule 1).
            blocks = blocks_for(u.work(), cap, shape.pass_bytes);
            c.seq += 1;
            c.depart += blocks as u64 * p as u64;
            m.seq = c.seq;
            m.depart = c.depart;
            if merge && i + 1 == n_coll {
                p2p_part(c, &mut m, 0, blocks);
            }
        } else {
            blocks = blocks_for(u.own_bytes(), cap, shape.pass_bytes);
            p2p_part(c, &mut m, i - n_coll, blocks);
        }
        out.push(Planned { blocks, meeting: m, rel: relative(&m, &before), ll: None });
    }
    for q in 0..p.min(MAX_RANKS) {
        c.sent[q] += sent[q];
        c.received[q] += recv[q];
    }
    out
}

/// The next LL call number (from 1; 0 is never a flag, the buffer starts zeroed).
pub fn next_ll_seq(c: &mut Counters) -> u32 {
    c.ll_seq = if c.ll_seq >= u32::MAX - 1 { 1 } else { c.ll_seq + 1 };
    c.ll_seq
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launch of `work` bytes (collective) or of `own` bytes (sends and receives).
    struct L {
        collective: bool,
        bytes: usize,
        tasks: usize,
    }

    impl Launch for L {
        fn collective(&self) -> bool {
            self.collective
        }
        fn work(&self) -> usize {
            self.bytes
        }
        fn own_bytes(&self) -> usize {
            self.bytes
        }
        fn nominal_tasks(&self, _: usize) -> usize {
            self.tasks
        }
    }

    #[test]
    fn blocks_are_bounded_by_the_pass_and_the_cap() {
        assert_eq!(blocks_for(0, 33, 1024), 1);
        assert_eq!(blocks_for(2048, 33, 1024), 1);
        assert_eq!(blocks_for(2049, 33, 1024), 2);
        assert_eq!(blocks_for(1 << 30, 33, 1024), 33);
        assert_eq!(blocks_for(1 << 30, 0, 1024), 1);
    }

    #[test]
    fn counters_run_on_across_groups_and_merging_saves_a_launch() {
        let coll = |bytes| L { collective: true, bytes, tasks: 1 };
        let pair = L { collective: false, bytes: 100, tasks: 0 };
        let (mut sent, mut recv) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS]);
        (sent[1], recv[1]) = (2, 3);
        let shape = Shape { caps: &[4, 4, 4], pass_bytes: 1024 };
        let mut c = Counters::default();
        // Two collectives and a send/receive launch, not merged, on 2 ranks.
        let units = [coll(10_000), coll(100)];
        let group = |c: &mut Counters, merge| {
            let p2p = std::slice::from_ref(&pair);
            plan_launches(c, 2, &units, p2p, (&sent, &recv), shape, |_| false, merge)
        };
        let plans = group(&mut c, false);
        assert_eq!(plans.iter().map(|p| p.blocks).collect::<Vec<_>>(), [4, 1, 1]);
        assert_eq!((plans[0].meeting.seq, plans[0].meeting.depart), (1, 8));
        assert_eq!((plans[1].meeting.seq, plans[1].meeting.depart), (2, 10));
        let m = &plans[2].meeting;
        assert_eq!((m.seq, m.send_to[1], m.recv_from[1], m.recv_done[1], m.send_done[1]), (0, 2, 3, 3, 2));
        assert_eq!(m.mydepart, 1);
        assert!(plans.iter().all(Planned::meets));
        // The next group, merged: one launch, the counts continue; an LL collective takes a
        // call number and no blocks, and a group ending in one cannot merge.
        assert!(merges(&units, &[1], 2, 8, |_| false));
        assert!(!merges(&units, &[8], 2, 8, |_| false));
        assert!(!merges(&units, &[1], 2, 8, |u| u.bytes == 100));
        let plans = group(&mut c, true);
        assert_eq!(plans.len(), 2);
        let m = &plans[1].meeting;
        assert_eq!((m.seq, m.depart, m.send_to[1], m.recv_done[1], m.mydepart), (4, 20, 4, 6, 2));
        let ll = plan_launches(
            &mut c,
            2,
            &[coll(8)],
            &[],
            (&[0; MAX_RANKS], &[0; MAX_RANKS]),
            shape,
            |_| true,
            false,
        );
        assert_eq!((ll[0].blocks, ll[0].ll, ll[0].meets()), (0, Some(1), false));
        assert_eq!((c.seq, c.ll_seq), (4, 1));
        c.ll_seq = u32::MAX - 1;
        assert_eq!(next_ll_seq(&mut c), 1);
    }

    /// Rule 5: the relative meetings, resolved against a record that only they advance, give
    /// the absolute ones, group after group; replaying a group's launches gives the numbers
    /// planning the same group again would.
    #[test]
    fn relative_meetings_resolve_to_the_absolute_ones_and_replay_as_planned_again() {
        let coll = |bytes| L { collective: true, bytes, tasks: 1 };
        let pair = |bytes| L { collective: false, bytes, tasks: 0 };
        let shape = Shape { caps: &[3, 2, 4, 1], pass_bytes: 1024 };
        let (mut c, mut base) = (Counters::default(), Counters::default());
        let mut planned = Vec::new();
        for g in 0..12u64 {
            let (mut sent, mut recv) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS]);
            (sent[(g % 3) as usize], recv[((g + 1) % 3) as usize]) = (g % 4, (g + 2) % 3);
            let units: Vec<L> = (0..g % 3).map(|k| coll(100 << (4 * k))).collect();
            // Sends or receives take one or two launches (as the runtime's `p2p_units` makes).
            let any = sent.iter().chain(&recv).any(|&n| n > 0);
            let p2p: Vec<L> = (0..if any { 1 + g % 2 } else { 0 }).map(|k| pair(5000 * k as usize)).collect();
            let ll = |u: &L| u.bytes == 100 && g % 2 == 0;
            let merge = g % 5 == 0 && !p2p.is_empty() && merges(&units, &[0], 3, 8, ll);
            let plans = plan_launches(&mut c, 3, &units, &p2p, (&sent, &recv), shape, ll, merge);
            for pl in &plans {
                let (m, ll) = resolve(&pl.rel, pl.ll.is_some(), &mut base);
                assert_eq!(
                    (m, ll),
                    (if pl.ll.is_some() { Meeting::default() } else { pl.meeting }, pl.ll),
                    "group {g}"
                );
            }
            planned.push(plans);
        }
        assert_eq!(base, c, "the record ends where the host's counters do");
        // Replays: the last group again, resolved, is what planning it again would give.
        let last = planned.last().unwrap();
        for _ in 0..3 {
            let mut again = c.clone();
            for pl in last {
                let (m, ll) = resolve(&pl.rel, pl.ll.is_some(), &mut base);
                if let Some(n) = ll {
                    assert_eq!(n, next_ll_seq(&mut again));
                } else {
                    assert!(m.seq == 0 || m.seq > pl.meeting.seq, "a replay meets with fresh numbers");
                }
            }
            c = base.clone();
        }
    }
}
