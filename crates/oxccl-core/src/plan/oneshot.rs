//! One-shot all-reduce for small messages: every rank sends its whole input to every peer and
//! reduces all inputs locally, so the call costs one network latency instead of the ring's
//! 2(P − 1).
//!
//! Phase 1 exchanges (direct connections) into scratch slot `q` per rank `q` (this rank's own
//! input is copied into its slot); phase 2 folds the slots in rank order — the same grouping
//! on every rank, so every rank gets the same bits.
//!
//! Rule: [`fold_lane`], the one rank-order fold, is here and deterministic mode (`det`) uses
//! it; this module names no other planner but the direct streams it exchanges with.

use super::direct::{DirectStream, StreamKind};
use super::geometry::Geometry;
use super::lane::{ConnClass, ConnKey, Input, Lane, Step};
use super::op::{BufId, Loc};
use crate::dtype::{DataType, ReduceOp};
use crate::error::CoreError;
use crate::reduce::ReduceCtx;
use crate::tuning::ONE_SHOT_MAX_RANKS;
use crate::types::Rank;

/// Whether an all-reduce of `count` elements takes the one-shot plan.
pub(super) fn applies(g: &Geometry, count: usize, dtype: DataType) -> bool {
    let bytes = count * dtype.size_bytes();
    g.size > 1
        && g.size <= ONE_SHOT_MAX_RANKS
        && bytes > 0
        && bytes <= g.one_shot_max_bytes
        && bytes <= g.chunk_bytes
}

/// The phases and the scratch bytes of a one-shot all-reduce.
pub(super) fn all_reduce(
    g: &Geometry,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    src: Loc,
    dst: Loc,
) -> Result<(Vec<Vec<Lane>>, usize), CoreError> {
    let p = g.size;
    let me = g.rank.idx();
    let n = count * dtype.size_bytes();
    let slot = |q: usize| Loc { buf: BufId::SCRATCH, off: q * n };
    let mut exchange = Vec::with_capacity(2 * p - 1);
    exchange.push(Lane::new(
        vec![],
        vec![],
        None,
        Box::new(DirectStream::new(StreamKind::Copy, src, slot(me), n, n)),
    ));
    for i in 1..p {
        let q = (me + i) % p;
        let key = ConnKey { peer: Rank::new(q), class: ConnClass::Direct };
        exchange.push(Lane::new(
            vec![],
            vec![key],
            None,
            Box::new(DirectStream::new(StreamKind::Send, src, src, n, n)),
        ));
        exchange.push(Lane::new(
            vec![key],
            vec![],
            None,
            Box::new(DirectStream::new(StreamKind::Recv, slot(q), slot(q), n, n)),
        ));
    }
    let ctx = ReduceCtx::new(dtype, op, p as u32)?;
    let fold = fold_lane(ctx, p, slot, dst, n, n);
    Ok((vec![exchange, vec![fold]], p * n))
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
