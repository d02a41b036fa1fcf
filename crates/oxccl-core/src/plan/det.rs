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
//! to the root, which folds.

use super::direct::StreamKind;
use super::{BufId, ConnClass, ConnKey, DirectStream, Geometry, Input, Lane, Loc, Step};
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

/// The rank-order fold `out = ((slot(0) ⊕ slot(1)) ⊕ slot(2)) ⊕ …` over `bytes`, in steps of
/// at most `chunk`, finalized: the one order the one-shot plan and deterministic mode share
/// (and the direct path's), so all give the same bits.
pub(super) fn fold_lane(
    ctx: ReduceCtx,
    p: usize,
    slot: impl Fn(usize) -> Loc,
    out: Loc,
    bytes: usize,
    chunk: usize,
) -> Lane {
    let mut steps = Vec::new();
    let mut off = 0;
    while off < bytes {
        let len = chunk.max(1).min(bytes - off);
        let at = |q: usize| slot(q).at(off);
        let step =
            |input, finalize| Step { input, dst: Some(out.at(off)), send: None, finalize, len, tag: 0 };
        if p == 1 {
            steps.push(step(Input::Src(at(0)), true));
        } else {
            steps.push(step(Input::Local2(at(0), at(1)), p == 2));
            for q in 2..p {
                steps.push(step(Input::Local2(at(q), out.at(off)), q == p - 1));
            }
        }
        off += len;
    }
    Lane::new(vec![], vec![], Some(ctx), Box::new(steps.into_iter()))
}

/// The phases and scratch bytes of a deterministic all-reduce (`block` = `None`) or
/// reduce-scatter (`block` = `Some(count per rank)`, `count` = the input's total).
pub fn reduce_scatter_like(
    g: &Geometry,
    count: usize,
    block: Option<usize>,
    dtype: DataType,
    op: ReduceOp,
    src: Loc,
    dst: Loc,
) -> Result<(Vec<Vec<Lane>>, usize), CoreError> {
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
pub fn reduce(
    g: &Geometry,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    root: Rank,
    src: Loc,
    dst: Loc,
) -> Result<(Vec<Vec<Lane>>, usize), CoreError> {
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
