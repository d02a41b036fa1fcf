//! An in-memory executor of plans: every rank's job over bounded FIFOs, one thread, no sockets.
//!
//! It runs the same [`exec::apply`](super::exec::apply) as the engine, detects deadlock (a full
//! pass in which no lane of any rank can move while some are unfinished), checks that every
//! received chunk has the length its step expects, and that no connection holds chunks at the
//! end. Tests run every algorithm through it for many world sizes and counts.

use super::exec::{apply, StepData};
use super::lane::{ConnClass, Input, Job, Lane, Step};
use super::op::{BufId, Loc};
use crate::contract::{Sig, SigWords};
use crate::error::CoreError;
use crate::types::Rank;
use std::collections::{HashMap, VecDeque};

/// Why a simulated run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("deadlock: no lane can progress; blocked: {0}")]
    Deadlock(String),
    #[error("rank {rank}: received a chunk of {got} bytes from rank {from} where the step expects {want}")]
    LengthMismatch { rank: usize, from: usize, got: usize, want: usize },
    #[error("rank {rank}: step touches bytes {off}..{end} of buffer {buf}, which has {len}")]
    OutOfBounds { rank: usize, buf: u16, off: usize, end: usize, len: usize },
    #[error("rank {rank}: received a chunk of {got} from rank {from} where the step expects {want}")]
    SigMismatch { rank: usize, from: usize, got: Sig, want: Sig },
    #[error("{0} chunk(s) left unreceived on connections at the end")]
    Leftover(usize),
    #[error(transparent)]
    Step(#[from] CoreError),
}

/// Counters of a run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SimStats {
    pub steps: usize,
    pub passes: usize,
    pub max_depth: usize,
}

type Fifo = VecDeque<(Vec<u8>, SigWords)>;

struct RankState {
    p2p: Vec<LaneState>,
    phases: VecDeque<Vec<LaneState>>,
}

struct LaneState {
    lane: Lane,
    pending: Option<Step>,
    done: bool,
}

impl LaneState {
    fn new(mut lane: Lane) -> Self {
        let pending = lane.steps.next();
        LaneState { done: pending.is_none(), lane, pending }
    }
}

fn slice(bufs: &[Vec<u8>], rank: usize, loc: Loc, len: usize) -> Result<&[u8], SimError> {
    let b = &bufs[index(bufs.len(), loc)];
    b.get(loc.off..loc.off + len).ok_or(SimError::OutOfBounds {
        rank,
        buf: loc.buf.0,
        off: loc.off,
        end: loc.off + len,
        len: b.len(),
    })
}

/// The index of a location's buffer: the scratch buffer is appended after the user buffers.
fn index(bufs_len: usize, loc: Loc) -> usize {
    if loc.buf == BufId::SCRATCH {
        bufs_len - 1
    } else {
        loc.buf.0 as usize
    }
}

fn slice_mut(bufs: &mut [Vec<u8>], rank: usize, loc: Loc, len: usize) -> Result<&mut [u8], SimError> {
    let i = index(bufs.len(), loc);
    let b = &mut bufs[i];
    let blen = b.len();
    b.get_mut(loc.off..loc.off + len).ok_or(SimError::OutOfBounds {
        rank,
        buf: loc.buf.0,
        off: loc.off,
        end: loc.off + len,
        len: blen,
    })
}

/// Tries the pending step of one lane; returns whether it ran.
fn try_step(
    rank: usize,
    ls: &mut LaneState,
    fifos: &mut HashMap<(usize, usize, ConnClass), Fifo>,
    bufs: &mut [Vec<u8>],
    capacity: usize,
) -> Result<bool, SimError> {
    let Some(step) = ls.pending else {
        return Ok(false);
    };
    let recv_key = match step.input {
        Input::Recv(p) | Input::RecvReduce(p, _) => {
            let k = ls.lane.inbound[p.0 as usize];
            Some((k.peer.idx(), rank, k.class))
        }
        Input::Src(_) | Input::Local2(..) => None,
    };
    let send_key = step.send.map(|p| {
        let k = ls.lane.outbound[p.0 as usize];
        (rank, k.peer.idx(), k.class)
    });
    if let Some(k) = recv_key {
        match fifos.get(&k).and_then(|f| f.front()) {
            None => return Ok(false),
            Some((_, w)) if !ls.lane.sig_of(step.tag).accepts(w) => {
                let (got, want) = (Sig::from_words(*w), ls.lane.sig_of(step.tag));
                return Err(SimError::SigMismatch { rank, from: k.0, got, want });
            }
            Some((c, _)) if c.len() != step.len => {
                return Err(SimError::LengthMismatch { rank, from: k.0, got: c.len(), want: step.len })
            }
            Some(_) => {}
        }
    }
    if let Some(k) = send_key {
        if fifos.get(&k).map_or(0, |f| f.len()) >= capacity {
            return Ok(false);
        }
    }
    let received = recv_key.and_then(|k| fifos.get_mut(&k).and_then(|f| f.pop_front())).map(|c| c.0);
    let mut out = send_key.map(|_| vec![0u8; step.len]);
    // Inputs are copied out of the user buffers first so the destination can be borrowed
    // mutably even when it lives in the same buffer.
    let (data_owned, in_place): (Option<Vec<u8>>, bool) = match step.input {
        Input::Src(l) => (Some(slice(bufs, rank, l, step.len)?.to_vec()), step.dst == Some(l)),
        Input::RecvReduce(_, l) => (Some(slice(bufs, rank, l, step.len)?.to_vec()), step.dst == Some(l)),
        Input::Local2(_, b) => (Some(slice(bufs, rank, b, step.len)?.to_vec()), false),
        Input::Recv(_) => (None, false),
    };
    // A local pair's first operand plays the received chunk's part.
    let received = match step.input {
        Input::Local2(a, _) => Some(slice(bufs, rank, a, step.len)?.to_vec()),
        _ => received,
    };
    let recv_ref = received.as_deref();
    let data = match (step.input, recv_ref, data_owned.as_deref()) {
        (Input::Local2(..), Some(r), Some(s)) => StepData::RecvReduce { recv: r, src: s },
        (Input::Src(_), _, Some(s)) => StepData::Src(s),
        (Input::Recv(_), Some(r), _) => StepData::Recv(r),
        (Input::RecvReduce(..), Some(r), _) if in_place => StepData::RecvReduceInPlace { recv: r },
        (Input::RecvReduce(..), Some(r), Some(s)) => StepData::RecvReduce { recv: r, src: s },
        _ => return Err(CoreError::malformed("plan step", "input not available").into()),
    };
    let skip_dst = in_place && matches!(step.input, Input::Src(_));
    let dst = match step.dst {
        Some(l) if !skip_dst => Some(slice_mut(bufs, rank, l, step.len)?),
        _ => None,
    };
    apply(ls.lane.reduce.as_ref(), step.finalize, data, dst, out.as_deref_mut())?;
    if let (Some(k), Some(o)) = (send_key, out) {
        fifos.entry(k).or_default().push_back((o, ls.lane.sig_of(step.tag).to_words()));
    }
    ls.pending = ls.lane.steps.next();
    ls.done = ls.pending.is_none();
    Ok(true)
}

/// Runs one job per rank; `bufs[r]` are rank r's buffers, indexed by [`BufId`](super::BufId).
pub fn run(jobs: Vec<Job>, bufs: &mut [Vec<Vec<u8>>], capacity: usize) -> Result<SimStats, SimError> {
    // Each rank's scratch buffer rides at the end of its buffers for the run.
    for (b, j) in bufs.iter_mut().zip(&jobs) {
        b.push(vec![0u8; j.scratch_bytes]);
    }
    let r = run_jobs(jobs, bufs, capacity);
    for b in bufs.iter_mut() {
        b.pop();
    }
    r
}

fn run_jobs(jobs: Vec<Job>, bufs: &mut [Vec<Vec<u8>>], capacity: usize) -> Result<SimStats, SimError> {
    let mut ranks: Vec<RankState> = jobs
        .into_iter()
        .map(|j| RankState {
            p2p: j.p2p.into_iter().map(LaneState::new).collect(),
            phases: j.phases.into_iter().map(|p| p.into_iter().map(LaneState::new).collect()).collect(),
        })
        .collect();
    let mut fifos: HashMap<(usize, usize, ConnClass), Fifo> = HashMap::new();
    let mut stats = SimStats::default();
    loop {
        stats.passes += 1;
        let mut progressed = false;
        let mut all_done = true;
        for (r, st) in ranks.iter_mut().enumerate() {
            while st.phases.front().is_some_and(|p| p.iter().all(|l| l.done)) {
                st.phases.pop_front();
            }
            let phase = st.phases.front_mut().map(|p| p.as_mut_slice()).unwrap_or(&mut []);
            for ls in st.p2p.iter_mut().chain(phase.iter_mut()) {
                while try_step(r, ls, &mut fifos, &mut bufs[r], capacity)? {
                    stats.steps += 1;
                    progressed = true;
                }
            }
            while st.phases.front().is_some_and(|p| p.iter().all(|l| l.done)) {
                st.phases.pop_front();
            }
            all_done &= st.phases.is_empty() && st.p2p.iter().all(|l| l.done);
            let depth = fifos.values().map(|f| f.len()).max().unwrap_or(0);
            stats.max_depth = stats.max_depth.max(depth);
        }
        if all_done {
            break;
        }
        if !progressed {
            let mut blocked = Vec::new();
            for (r, st) in ranks.iter().enumerate() {
                let lanes = st.p2p.iter().chain(st.phases.front().into_iter().flatten());
                for l in lanes.filter(|l| !l.done) {
                    blocked.push(format!("rank {r} in {:?} out {:?}", l.lane.inbound, l.lane.outbound));
                }
            }
            return Err(SimError::Deadlock(blocked.join("; ")));
        }
    }
    let left: usize = fifos.values().map(|f| f.len()).sum();
    if left > 0 {
        return Err(SimError::Leftover(left));
    }
    Ok(stats)
}

/// Convenience for tests: the rank of index `i`.
pub fn rank(i: usize) -> Rank {
    Rank::new(i)
}

#[cfg(test)]
mod hier_tests;
#[cfg(test)]
mod tests;
