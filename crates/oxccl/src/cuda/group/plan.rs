//! Launch planning's runtime side: the plans of `oxccl_core::plan::device::launch` (pure,
//! alike on every rank) with the kernels' meeting arguments (`Sync`: the plan's counts
//! relative to the rank's device record, this rank, the timeout), and what a rank remembers
//! between calls (counters, its last stream).

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

impl State {
    /// Before launching on `s`: a rank's launches must not overlap, so a stream other than
    /// the last one waits for the last launch.
    pub(super) fn follow(&self, s: &Stream) -> Result<(), CudaError> {
        if self.last.is_some_and(|h| h != s.h as usize) {
            if let Some(ev) = &self.done {
                s.wait(ev)?;
            }
        }
        Ok(())
    }

    /// After launching on `s`: the event the next launch on another stream waits for,
    /// recorded now (not at a switch) so that a stream the caller destroys after the call is
    /// never touched again.
    pub(super) fn launched(&mut self, dev: &Device, s: &Stream) -> Result<(), CudaError> {
        if self.done.is_none() {
            self.done = Some(Event::sync_only(dev)?);
        }
        if let Some(ev) = &self.done {
            ev.record(s)?;
        }
        self.last = Some(s.h as usize);
        Ok(())
    }
}

/// One launch as planned: its blocks and its meeting's arguments (counts relative to the
/// rank's device record, as the kernels take them; the addresses are the group's), or, for
/// an LL all-reduce, its LL call number (`ll`, absolute, for the CPU models; the kernels take
/// the next one from the record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Planned {
    pub(super) blocks: u32,
    pub(super) sync: Sync,
    pub(super) ll: Option<u32>,
    met: bool,
}

/// `sync` with the counts of `m` (and nothing else changed).
pub(super) fn with_meeting(sync: Sync, m: &launch::Meeting) -> Sync {
    Sync {
        seq: m.seq,
        depart: m.depart,
        mydepart: m.mydepart,
        send_to: m.send_to,
        recv_from: m.recv_from,
        recv_done: m.recv_done,
        send_done: m.send_done,
        ..sync
    }
}

/// The counts of `sync` as a meeting.
#[cfg(test)]
pub(super) fn meeting_of(s: &Sync) -> launch::Meeting {
    launch::Meeting {
        seq: s.seq,
        depart: s.depart,
        mydepart: s.mydepart,
        send_to: s.send_to,
        recv_from: s.recv_from,
        recv_done: s.recv_done,
        send_done: s.send_done,
    }
}

impl Planned {
    /// An LL launch with call number `n` (absolute), as the CPU models take it.
    #[cfg(test)]
    pub(super) fn ll_launch(n: u32) -> Planned {
        Planned { blocks: 0, sync: Sync::default(), ll: Some(n), met: false }
    }

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
            let sync =
                with_meeting(Sync { timeout_ns, rank: rank as i32, p: p as i32, ..Sync::default() }, &pl.rel);
            Planned { blocks: pl.blocks, sync, ll: pl.ll, met: pl.meets() }
        })
        .collect()
}
