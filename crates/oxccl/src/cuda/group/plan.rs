//! Launch planning, pure: which calls of a round merge into one launch, and the counters the
//! GPU meeting's arithmetic keeps between calls, alike on every rank.

use super::*;

/// The GPU meeting's arithmetic one rank keeps between calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Counters {
    /// Collective launches so far (the GPU meeting's `seq` of the last one).
    pub(super) seq: u64,
    /// Blocks of collective launches so far by every rank (the departure target).
    pub(super) depart: u64,
    /// This rank's blocks of launches that publish receives, so far.
    pub(super) mydepart: u64,
    /// LL all-reduces so far.
    pub(super) ll_seq: u32,
    /// Sends to, and receives from, each peer so far.
    pub(super) sent: [u64; MAX_RANKS],
    pub(super) received: [u64; MAX_RANKS],
}

/// What one rank remembers between calls.
#[derive(Default)]
pub(super) struct State {
    pub(super) counters: Counters,
    /// The stream of the last launch, and an event recorded after it on that stream.
    pub(super) last: Option<usize>,
    pub(super) done: Option<Event>,
}

/// One launch as planned: its blocks and its meeting (counters; the addresses are the
/// group's), or, for an LL all-reduce, its LL call number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Planned {
    pub(super) blocks: u32,
    pub(super) sync: Sync,
    pub(super) ll: Option<u32>,
}

impl Planned {
    /// Whether the launch meets other ranks' launches through the counters.
    pub(super) fn meets(&self) -> bool {
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
pub(super) fn merges(
    units: &[call::Unit],
    recv_tasks: &[usize],
    p: usize,
    ll: impl Fn(&call::Unit) -> bool,
) -> bool {
    match units.last() {
        Some(u) => {
            !ll(u) && recv_tasks.iter().all(|&n| u.nominal_tasks(p) + n <= crate::cuda::kernels::MAX_TASKS)
        }
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
pub(super) fn plan_launches(
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
pub(super) fn next_ll_seq(c: &mut Counters) -> u32 {
    c.ll_seq = if c.ll_seq >= u32::MAX - 1 { 1 } else { c.ll_seq + 1 };
    c.ll_seq
}
