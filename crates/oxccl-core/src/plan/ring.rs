//! Ring algorithms: chunked and pipelined, one lane per channel.
//!
//! Positions are ring positions (`pos` is this rank's index in the ring order); every rank
//! receives from position `pos − 1` and sends to `pos + 1`.
//!
//! - AllReduce: per loop of `P · rc` elements, `P − 1` reduce-scatter steps then `P − 1`
//!   all-gather steps (`2P − 1` steps: send, P−2 × recv-reduce-send, recv-reduce-copy-send,
//!   P−2 × recv-copy-send, recv). The segment that position `q` finalizes starts at `q + 1`.
//! - ReduceScatter / AllGather: the same two halves over per-rank blocks.
//! - Broadcast: a chain from the root's position; Reduce: a chain ending at it.

use super::lane::{Input, Port, Step};
use super::op::Loc;
use crate::coll::RingColl;
use crate::types::Rank;
use std::sync::Arc;

const PREV: Port = Port(0);
const NEXT: Port = Port(0);

/// The step generator of one ring collective on one channel.
#[derive(Clone, Debug)]
pub struct RingCollective {
    kind: RingColl,
    /// Ring position → rank, to address per-rank blocks.
    ring: Arc<[Rank]>,
    p: usize,
    pos: usize,
    root_pos: usize,
    es: usize,
    /// Elements per rank block (ReduceScatter / AllGather), the full count otherwise.
    block: usize,
    src: Loc,
    dst: Loc,
    /// This channel's element range (within a block, for block collectives).
    end: usize,
    chunk: usize,
    // Iteration state.
    base: usize,
    k: usize,
    rc: usize,
}

impl RingCollective {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        kind: RingColl,
        ring: Arc<[Rank]>,
        pos: usize,
        root_pos: usize,
        es: usize,
        block: usize,
        src: Loc,
        dst: Loc,
        beg: usize,
        end: usize,
        chunk: usize,
    ) -> Self {
        let mut g = RingCollective {
            kind,
            p: ring.len(),
            ring,
            pos,
            root_pos,
            es,
            block,
            src,
            dst,
            end,
            chunk: chunk.max(1),
            base: beg,
            k: 0,
            rc: 0,
        };
        g.start_loop();
        g
    }

    fn start_loop(&mut self) {
        let remaining = self.end.saturating_sub(self.base);
        self.rc = match self.kind {
            RingColl::AllReduce if self.p > 1 => self.chunk.min(remaining.div_ceil(self.p)),
            _ => self.chunk.min(remaining),
        };
    }

    fn steps_per_loop(&self) -> usize {
        if self.p == 1 {
            return 1;
        }
        match self.kind {
            RingColl::AllReduce => 2 * self.p - 1,
            RingColl::ReduceScatter | RingColl::AllGather => self.p,
            RingColl::Broadcast | RingColl::Reduce => 1,
        }
    }

    /// Elements the current loop covers.
    fn loop_elems(&self) -> usize {
        let remaining = self.end - self.base;
        match self.kind {
            RingColl::AllReduce if self.p > 1 => (self.rc * self.p).min(remaining),
            _ => self.rc,
        }
    }

    fn modp(&self, x: usize) -> usize {
        x % self.p
    }

    fn step(&self, input: Input, dst: Option<Loc>, send: bool, finalize: bool, n: usize) -> Step {
        Step { input, dst, send: send.then_some(NEXT), finalize, len: n * self.es, tag: 0 }
    }

    /// Step `k` of the current loop, or `None` when it carries no data.
    fn step_at(&self, k: usize) -> Option<Step> {
        let p = self.p;
        let es = self.es;
        if p == 1 {
            let n = self.loop_elems();
            let off = self.base * es;
            let fin = matches!(self.kind, RingColl::AllReduce | RingColl::ReduceScatter | RingColl::Reduce);
            return Some(self.step(Input::Src(self.src.at(off)), Some(self.dst.at(off)), false, fin, n));
        }
        match self.kind {
            RingColl::AllReduce => {
                let seg = match k {
                    0 => self.modp(self.pos + p - 1),
                    k if k < p - 1 => self.modp(self.pos + p - (k + 1)),
                    k if k == p - 1 => self.pos,
                    k if k < 2 * p - 2 => self.modp(self.pos + p - (k - (p - 1))),
                    _ => self.modp(self.pos + 1),
                };
                let lo = (seg * self.rc).min(self.loop_elems());
                let hi = ((seg + 1) * self.rc).min(self.loop_elems());
                if hi == lo {
                    return None;
                }
                let n = hi - lo;
                let off = (self.base + lo) * es;
                let (s, d) = (self.src.at(off), self.dst.at(off));
                Some(match k {
                    0 => self.step(Input::Src(s), None, true, false, n),
                    k if k < p - 1 => self.step(Input::RecvReduce(PREV, s), None, true, false, n),
                    k if k == p - 1 => self.step(Input::RecvReduce(PREV, s), Some(d), true, true, n),
                    k if k < 2 * p - 2 => self.step(Input::Recv(PREV), Some(d), true, false, n),
                    _ => self.step(Input::Recv(PREV), Some(d), false, false, n),
                })
            }
            RingColl::ReduceScatter => {
                // Block of the rank at ring position `owner`; the owner is the last reducer.
                let owner = match k {
                    0 => self.modp(self.pos + p - 1),
                    k if k < p - 1 => self.modp(self.pos + p - (k + 1)),
                    _ => self.pos,
                };
                let n = self.rc;
                let s = self.src.at((self.ring[owner].idx() * self.block + self.base) * es);
                Some(match k {
                    0 => self.step(Input::Src(s), None, true, false, n),
                    k if k < p - 1 => self.step(Input::RecvReduce(PREV, s), None, true, false, n),
                    _ => self.step(
                        Input::RecvReduce(PREV, s),
                        Some(self.dst.at(self.base * es)),
                        false,
                        true,
                        n,
                    ),
                })
            }
            RingColl::AllGather => {
                let n = self.rc;
                let owner = match k {
                    0 => self.pos,
                    k => self.modp(self.pos + p - k),
                };
                let d = self.dst.at((self.ring[owner].idx() * self.block + self.base) * es);
                Some(match k {
                    0 => self.step(Input::Src(self.src.at(self.base * es)), Some(d), true, false, n),
                    k if k < p - 1 => self.step(Input::Recv(PREV), Some(d), true, false, n),
                    _ => self.step(Input::Recv(PREV), Some(d), false, false, n),
                })
            }
            RingColl::Broadcast => {
                let n = self.rc;
                let off = self.base * es;
                let d = self.modp(self.pos + p - self.root_pos);
                Some(if d == 0 {
                    self.step(Input::Src(self.src.at(off)), Some(self.dst.at(off)), true, false, n)
                } else {
                    self.step(Input::Recv(PREV), Some(self.dst.at(off)), d < p - 1, false, n)
                })
            }
            RingColl::Reduce => {
                let n = self.rc;
                let off = self.base * es;
                let d = self.modp(self.pos + p - self.root_pos);
                let s = self.src.at(off);
                Some(match d {
                    1 => self.step(Input::Src(s), None, true, false, n),
                    0 => self.step(Input::RecvReduce(PREV, s), Some(self.dst.at(off)), false, true, n),
                    _ => self.step(Input::RecvReduce(PREV, s), None, true, false, n),
                })
            }
        }
    }
}

impl RingCollective {
    /// All-reduce: moves `k` to the next step that carries data. Step `k` of a loop handles
    /// segment `(pos − 1 − k) mod P` (both halves), and only segments below
    /// `⌈loop elements / rc⌉` hold data, so the next such step is found at once rather than by
    /// trying each of the loop's `2P − 1` (a small call on many ranks has few).
    fn skip_empty(&mut self) {
        let p = self.p;
        if self.kind != RingColl::AllReduce || p <= 1 || self.rc == 0 {
            return;
        }
        let m = self.loop_elems().div_ceil(self.rc);
        if m >= p || self.k >= 2 * p - 1 {
            return;
        }
        let seg = (self.pos + 2 * p - 1 - self.k) % p;
        if seg >= m {
            self.k += seg - (m - 1);
        }
    }
}

impl Iterator for RingCollective {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        loop {
            if self.base >= self.end || self.rc == 0 {
                return None;
            }
            self.skip_empty();
            if self.k >= self.steps_per_loop() {
                self.k = 0;
                self.base += self.loop_elems();
                self.start_loop();
                continue;
            }
            let step = self.step_at(self.k);
            self.k += 1;
            if self.k == self.steps_per_loop() {
                self.k = 0;
                self.base += self.loop_elems();
                self.start_loop();
            }
            if step.is_some() {
                return step;
            }
        }
    }
}
