//! Launch planning's runtime side: the plans of `oxccl_core::plan::device::launch` (pure,
//! alike on every rank) with the kernels' meeting arguments (`Sync`: the plan's counts, this
//! rank, the timeout), and what a rank remembers between calls (counters, its last stream).

use super::*;
use oxccl_core::plan::device::launch::{self, Launch, Shape};
pub(super) use oxccl_core::plan::device::launch::{next_ll_seq, Counters};

/// What one rank remembers between calls.
#[derive(Default)]
pub(super) struct State {
    pub(super) counters: Counters,
    /// The stream of the last launch, and an event recorded after it on that stream.
    pub(super) last: Option<usize>,
    pub(super) done: Option<Event>,
}

/// One launch as planned: its blocks and its meeting's arguments (counters; the addresses are
/// the group's), or, for an LL all-reduce, its LL call number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Planned {
    pub(super) blocks: u32,
    pub(super) sync: Sync,
    pub(super) ll: Option<u32>,
    met: bool,
}

impl Planned {
    /// Whether the launch meets other ranks' launches through the counters.
    pub(super) fn meets(&self) -> bool {
        self.met
    }
}

impl Launch for call::Unit {
    fn collective(&self) -> bool {
        self.collective
    }
    fn work(&self) -> usize {
        self.work
    }
    fn own_bytes(&self) -> usize {
        call::Unit::own_bytes(self)
    }
    fn nominal_tasks(&self, p: usize) -> usize {
        call::Unit::nominal_tasks(self, p)
    }
}

/// [`launch::merges`] within the kernels' task limit (the CPU model found why it must be all
/// ranks or none).
pub(super) fn merges(
    units: &[call::Unit],
    recv_tasks: &[usize],
    p: usize,
    ll: impl Fn(&call::Unit) -> bool,
) -> bool {
    launch::merges(units, recv_tasks, p, crate::cuda::kernels::MAX_TASKS, ll)
}

/// Rank `rank`'s launches of a group, as [`launch::plan_launches`] plans them, with their
/// kernels' meeting arguments (`timeout_ns`: the longest a kernel waits; 0: forever).
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_launches(
    c: &mut Counters,
    rank: usize,
    p: usize,
    units: &[call::Unit],
    p2p: &[call::Unit],
    counts: (&[u64; MAX_RANKS], &[u64; MAX_RANKS]),
    caps: &[u32],
    ll: impl Fn(&call::Unit) -> bool,
    timeout_ns: u64,
    merge: bool,
) -> Vec<Planned> {
    let shape = Shape { caps, pass_bytes: BLOCK_PASS_BYTES };
    launch::plan_launches(c, p, units, p2p, counts, shape, ll, merge)
        .into_iter()
        .map(|pl| {
            let m = pl.meeting;
            let sync = Sync {
                timeout_ns,
                rank: rank as i32,
                p: p as i32,
                seq: m.seq,
                depart: m.depart,
                mydepart: m.mydepart,
                send_to: m.send_to,
                recv_from: m.recv_from,
                recv_done: m.recv_done,
                send_done: m.send_done,
                ..Sync::default()
            };
            Planned { blocks: pl.blocks, sync, ll: pl.ll, met: pl.meets() }
        })
        .collect()
}
