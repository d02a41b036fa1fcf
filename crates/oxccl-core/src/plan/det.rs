//! Deterministic reductions (`OXCCL_DETERMINISTIC=1`): every element's result is the left
//! fold of the ranks' inputs in rank order, `((x0 ⊕ x1) ⊕ x2) ⊕ …`, whatever the message
//! size, algorithm, protocol or channel count — the same order the direct path and the
//! one-shot all-reduce use, so every path gives the same bits.
//!
//! All-reduce, per round of at most [`ROUND_BYTES`]: each rank owns a segment; every rank
//! sends each owner its input segment (direct connections) and the owner keeps them in
//! scratch slots by source rank (*exchange*); the owner folds its slots in rank order into its
//! output segment (*fold*); owners send their finished segments to every rank (*gather*).
//! Each rank sends and receives `(P − 1)/P` of the data twice, as the ring does, in two
//! network latencies per round. Reduce-scatter stops after the fold; reduce sends everything
//! to the root, which folds. An all-reduce the one-shot plan takes (`oneshot::applies`) runs
//! one-shot instead: the same fold after one exchange.
//!
//! [`plan`] is the one place the mode decides a plan: in deterministic mode every all-reduce,
//! reduce-scatter and reduce is planned here, whatever the selector (`NCCL_ALGO`, `NCCL_PROTO`,
//! the tuner) chose for its size; the selector still picks the protocol of the chunks.

use super::direct::{DirectStream, StreamKind};
use super::geometry::Geometry;
use super::lane::{ConnClass, ConnKey, Lane};
use super::oneshot::{self, fold_lane};
use super::op::{BufId, Loc, OpSpec};
use crate::dtype::{DataType, ReduceOp};
use crate::error::CoreError;
use crate::reduce::ReduceCtx;
use crate::types::Rank;

/// The most data (all ranks' segments together) one round moves; at most
/// [`ROUND_CHUNKS`] chunks of the connections' size.
pub const ROUND_BYTES: usize = 8 << 20;
pub const ROUND_CHUNKS: usize = 64;

fn round_bytes(g: &Geometry) -> usize {
    ROUND_BYTES.min(ROUND_CHUNKS * g.chunk_bytes)
}

fn key(q: usize) -> ConnKey {
    ConnKey { peer: Rank::new(q), class: ConnClass::Direct }
}

fn stream(kind: StreamKind, src: Loc, dst: Loc, bytes: usize, chunk: usize) -> Box<DirectStream> {
    Box::new(DirectStream::new(kind, src, dst, bytes, chunk))
}

/// Segment `q` of `[a, b)` split `p` ways: (first element, elements).
fn seg(a: usize, b: usize, p: usize, q: usize) -> (usize, usize) {
    let lo = a + (b - a) * q / p;
    let hi = a + (b - a) * (q + 1) / p;
    (lo, hi - lo)
}

struct Ctx {
    p: usize,
    me: usize,
    es: usize,
    chunk: usize,
    ctx: ReduceCtx,
}

impl Ctx {
    fn new(g: &Geometry, dtype: DataType, op: ReduceOp) -> Result<Ctx, CoreError> {
        let es = dtype.size_bytes();
        Ok(Ctx {
            p: g.size,
            me: g.rank.idx(),
            es,
            chunk: (g.chunk_bytes / es).max(1) * es,
            ctx: ReduceCtx::new(dtype, op, g.size as u32)?,
        })
    }

    fn slot(&self, q: usize, slot_bytes: usize) -> Loc {
        Loc { buf: BufId::SCRATCH, off: q * slot_bytes }
    }

    /// Folds slots 0..p (each `bytes` long) in rank order into `out`, finalizing.
    fn fold(&self, slot_bytes: usize, bytes: usize, out: Loc) -> Lane {
        fold_lane(self.ctx, self.p, |q| self.slot(q, slot_bytes), out, bytes, self.chunk)
    }
}

/// Phases and scratch bytes of a plan.
type Planned = (Vec<Vec<Lane>>, usize);

/// In deterministic mode (`g.deterministic`), the rank-order plan of a reducing collective:
/// one-shot for the all-reduces it takes, else this module's exchange and fold. `None` when the
/// mode is off or `op` does not reduce.
pub(super) fn plan(g: &Geometry, op: &OpSpec) -> Result<Option<Planned>, CoreError> {
    if !g.deterministic {
        return Ok(None);
    }
    Ok(Some(match *op {
        OpSpec::AllReduce { count, dtype, op, src, dst } if oneshot::applies(g, count, dtype) => {
            oneshot::all_reduce(g, count, dtype, op, src, dst)?
        }
        OpSpec::AllReduce { count, dtype, op, src, dst } => {
            reduce_scatter_like(g, count, None, dtype, op, src, dst)?
        }
        OpSpec::ReduceScatter { count, dtype, op, src, dst } => {
            reduce_scatter_like(g, count * g.size, Some(count), dtype, op, src, dst)?
        }
        OpSpec::Reduce { count, dtype, op, root, src, dst } => reduce(g, count, dtype, op, root, src, dst)?,
        _ => return Ok(None),
    }))
}

/// The phases and scratch bytes of a deterministic all-reduce (`block` = `None`) or
/// reduce-scatter (`block` = `Some(count per rank)`, `count` = the input's total).
fn reduce_scatter_like(
    g: &Geometry,
    count: usize,
    block: Option<usize>,
    dtype: DataType,
    op: ReduceOp,
    src: Loc,
    dst: Loc,
) -> Result<Planned, CoreError> {
    let c = Ctx::new(g, dtype, op)?;
    let (p, me, es) = (c.p, c.me, c.es);
    // Elements of each rank's segment per round.
    let per = block.unwrap_or(count.div_ceil(p.max(1)));
    let round = (round_bytes(g) / es / p.max(1)).max(1);
    let rounds = per.div_ceil(round).max(1);
    let slot_bytes = round.min(per) * es;
    let mut phases = Vec::new();
    for k in 0..rounds {
        // Segment q of this round: [first, first + n) of the input.
        let part = |q: usize| -> (usize, usize) {
            match block {
                Some(b) => {
                    let lo = (k * round).min(b);
                    let hi = ((k + 1) * round).min(b);
                    (q * b + lo, hi - lo)
                }
                None => {
                    let (a, z) = ((k * round * p).min(count), ((k + 1) * round * p).min(count));
                    seg(a, z, p, q)
                }
            }
        };
        let (mine_at, mine_n) = part(me);
        let mine_bytes = mine_n * es;
        // Where this rank's folded segment goes.
        let out = match block {
            Some(_) => dst.at((mine_at - me * per) * es),
            None => dst.at(mine_at * es),
        };
        let mut exchange = Vec::new();
        if mine_bytes > 0 {
            exchange.push(Lane::new(
                vec![],
                vec![],
                None,
                stream(StreamKind::Copy, src.at(mine_at * es), c.slot(me, slot_bytes), mine_bytes, c.chunk),
            ));
        }
        for i in 1..p {
            let q = (me + i) % p;
            let (at, n) = part(q);
            if n > 0 {
                exchange.push(Lane::new(
                    vec![],
                    vec![key(q)],
                    None,
                    stream(StreamKind::Send, src.at(at * es), src, n * es, c.chunk),
                ));
            }
            if mine_bytes > 0 {
                exchange.push(Lane::new(
                    vec![key(q)],
                    vec![],
                    None,
                    stream(
                        StreamKind::Recv,
                        c.slot(q, slot_bytes),
                        c.slot(q, slot_bytes),
                        mine_bytes,
                        c.chunk,
                    ),
                ));
            }
        }
        if !exchange.is_empty() {
            phases.push(exchange);
        }
        if mine_bytes > 0 {
            phases.push(vec![c.fold(slot_bytes, mine_bytes, out)]);
        }
        if block.is_none() && p > 1 {
            let mut gather = Vec::new();
            for i in 1..p {
                let q = (me + i) % p;
                let (at, n) = part(q);
                if mine_bytes > 0 {
                    gather.push(Lane::new(
                        vec![],
                        vec![key(q)],
                        None,
                        stream(StreamKind::Send, out, out, mine_bytes, c.chunk),
                    ));
                }
                if n > 0 {
                    let d = dst.at(at * es);
                    gather.push(Lane::new(
                        vec![key(q)],
                        vec![],
                        None,
                        stream(StreamKind::Recv, d, d, n * es, c.chunk),
                    ));
                }
            }
            if !gather.is_empty() {
                phases.push(gather);
            }
        }
    }
    Ok((phases, p * slot_bytes))
}

/// The phases and scratch bytes of a deterministic reduce to `root`.
fn reduce(
    g: &Geometry,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    root: Rank,
    src: Loc,
    dst: Loc,
) -> Result<Planned, CoreError> {
    let c = Ctx::new(g, dtype, op)?;
    let (p, me, es) = (c.p, c.me, c.es);
    let round = (round_bytes(g) / es / p.max(1)).max(1);
    let rounds = count.div_ceil(round).max(1);
    let slot_bytes = round.min(count) * es;
    let mut phases = Vec::new();
    for k in 0..rounds {
        let lo = (k * round).min(count);
        let n = ((k + 1) * round).min(count) - lo;
        if n == 0 {
            continue;
        }
        let bytes = n * es;
        if me != root.idx() {
            phases.push(vec![Lane::new(
                vec![],
                vec![key(root.idx())],
                None,
                stream(StreamKind::Send, src.at(lo * es), src, bytes, c.chunk),
            )]);
            continue;
        }
        let mut gather = vec![Lane::new(
            vec![],
            vec![],
            None,
            stream(StreamKind::Copy, src.at(lo * es), c.slot(me, slot_bytes), bytes, c.chunk),
        )];
        for q in (0..p).filter(|&q| q != me) {
            let s = c.slot(q, slot_bytes);
            gather.push(Lane::new(
                vec![key(q)],
                vec![],
                None,
                stream(StreamKind::Recv, s, s, bytes, c.chunk),
            ));
        }
        phases.push(gather);
        phases.push(vec![c.fold(slot_bytes, bytes, dst.at(lo * es))]);
    }
    Ok((phases, if me == root.idx() { p * slot_bytes } else { 0 }))
}

#[cfg(test)]
mod tests {
    use crate::contract::Seqs;
    use crate::dtype::{DataType, ReduceOp};
    use crate::plan::sim::{rank, run};
    use crate::plan::{plan_group_signed, BufId, Geometry, Loc, OpSpec};
    use crate::tuner::{Algo, Proto, Selector};
    use std::sync::Arc;

    fn fx(r: usize, i: usize) -> f32 {
        let h = (r as u64 * 0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let h = (h ^ (h >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10f32.powi((h % 7) as i32 - 3)
    }

    /// Whatever algorithm and protocol the selector picks, deterministic mode plans every
    /// reducing collective as the rank-order fold, at sizes below and above the one-shot
    /// bound and the chunk size, 1 to 3 channels, in place and out of place.
    #[test]
    fn every_selector_plans_reductions_as_the_rank_order_fold() {
        let mut ll = Selector::always(Algo::Ring);
        ll.protos = std::array::from_fn(|_| vec![(usize::MAX, Proto::LL)]);
        let selectors = [
            None,
            Some(Selector::always(Algo::Ring)),
            Some(Selector::always(Algo::Tree)),
            Some(Selector::always(Algo::Direct)),
            Some(ll),
        ];
        let (send, recv) = (Loc::start(BufId(0)), Loc::start(BufId(1)));
        let mut checked = 0;
        for (k, sel) in selectors.iter().enumerate() {
            for p in 2..=6usize {
                for (chunk, channels) in [(64usize, 1usize), (4096, 3), (1 << 16, 2)] {
                    for n in [1usize, 7, 100, 1021, 1500, 5000] {
                        let fold = |i: usize| (1..p).fold(fx(0, i), |a, q| a + fx(q, i)).to_bits();
                        let in_place = n % 2 == 0;
                        let ar_dst = if in_place { send } else { recv };
                        let ops = [
                            OpSpec::AllReduce {
                                count: n,
                                dtype: DataType::F32,
                                op: ReduceOp::Sum,
                                src: send,
                                dst: ar_dst,
                            },
                            OpSpec::ReduceScatter {
                                count: n,
                                dtype: DataType::F32,
                                op: ReduceOp::Sum,
                                src: Loc::start(BufId(2)),
                                dst: Loc::start(BufId(3)),
                            },
                            OpSpec::Reduce {
                                count: n,
                                dtype: DataType::F32,
                                op: ReduceOp::Sum,
                                root: rank(p / 2),
                                src: Loc::start(BufId(4)),
                                dst: Loc::start(BufId(5)),
                            },
                        ];
                        let mut jobs = Vec::new();
                        let mut bufs = Vec::new();
                        for r in 0..p {
                            let mut g =
                                Geometry::simple(rank(r), p, channels, chunk).with_hosts(|q| (q / 2) as u32);
                            g.select = sel.clone().map(Arc::new);
                            g.deterministic = true;
                            jobs.push(plan_group_signed(&g, &ops, &mut Seqs::new(p), true).unwrap());
                            let b = |len: usize| -> Vec<u8> {
                                (0..len).flat_map(|i| fx(r, i).to_ne_bytes()).collect()
                            };
                            bufs.push(vec![
                                b(n),
                                vec![0; 4 * n],
                                b(n * p),
                                vec![0; 4 * n],
                                b(n),
                                vec![0; 4 * n],
                            ]);
                        }
                        let what = format!("selector {k} p={p} chunk={chunk} channels={channels} n={n}");
                        run(jobs, &mut bufs, 2).unwrap_or_else(|e| panic!("{what}: {e}"));
                        let bits = |b: &[u8]| -> Vec<u32> {
                            b.chunks_exact(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect()
                        };
                        let want: Vec<u32> = (0..n).map(fold).collect();
                        for (r, b) in bufs.iter().enumerate() {
                            assert_eq!(bits(&b[usize::from(!in_place)]), want, "all-reduce {what} rank {r}");
                            let rs: Vec<u32> = (0..n).map(|i| fold(r * n + i)).collect();
                            assert_eq!(bits(&b[3]), rs, "reduce-scatter {what} rank {r}");
                            if r == p / 2 {
                                assert_eq!(bits(&b[5]), want, "reduce {what}");
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 5 * 5 * 3 * 6);
    }
}
