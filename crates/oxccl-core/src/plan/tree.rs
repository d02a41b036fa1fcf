//! The double binary tree all-reduce: two complementary binary trees over hosts
//! ([`crate::topo::graphs::double_btree`]) with a chain through the ranks of each host, each
//! tree carrying half of the data, one lane per tree.
//!
//! Inside a host the ranks (in ring order) form a chain from the host's first rank, its *head*;
//! heads are joined by the host tree. Per chunk, a rank reduces its children's partial results
//! into its own input and sends the sum to its parent (*up*); the root finalizes the chunk and
//! sends it to its children, and it flows on down to every rank (*down*).
//!
//! A non-root rank runs two lanes per tree, one up and one down, so chunks pipeline in both
//! directions at once; up-lanes wait only on children's up-lanes and down-lanes only on the
//! parent's, so no capacity of the connections can deadlock them. The two lanes touch the
//! same output chunk (the up-lane as an accumulator when a rank has several children, the
//! down-lane with the final value) only in causal order: chunk `k` comes down only after this
//! rank sent its chunk `k` up. The root runs one lane: its last reduction of a chunk is
//! finalized, written and sent down.
//!
//! Channels stripe a call over the pair of trees: with `c` channels the data is cut into `2c`
//! parts, part `p` runs on tree `p % 2` over connections `ConnClass::Tree(p)` (as the ring
//! stripes over rings; small calls use fewer channels, by the same rule as the ring).
//! Child → parent carries up-traffic, parent → child down-traffic, so each direction of a
//! tree edge of a part belongs to one lane.

use super::geometry::Geometry;
use super::lane::{ConnClass, ConnKey, Input, Lane, Port, Step};
use super::op::Loc;
use crate::dtype::{DataType, ReduceOp};
use crate::error::CoreError;
use crate::reduce::ReduceCtx;
use crate::types::Rank;
use std::sync::Arc;

/// The rank-level trees are the geometry's (every rank derives them from it alone); here too
/// under their old path.
pub use super::geometry::{places, Place};

/// Most channels a tree call is striped over (connection classes `Tree(0..2 × this)`).
pub const MAX_TREE_CHANNELS: usize = crate::tuning::MAX_CHANNELS;

/// The lanes of a tree all-reduce for rank `g.rank`.
pub fn all_reduce(
    g: &Geometry,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    src: Loc,
    dst: Loc,
) -> Result<Vec<Lane>, CoreError> {
    let ctx = ReduceCtx::new(dtype, op, g.size as u32)?;
    let es = dtype.size_bytes();
    let chunk = (g.chunk_bytes / es).max(1);
    let computed;
    let trees = match &g.cache {
        Some(c) => &c.tree,
        None => {
            computed = places(g);
            &computed
        }
    };
    let by_size = (count * es).checked_div(g.channel_min_bytes).unwrap_or(usize::MAX).max(1);
    let parts = 2 * g.nchannels.clamp(1, MAX_TREE_CHANNELS).min(by_size);
    let mut lanes = Vec::new();
    for part in 0..parts {
        let beg = count * part / parts;
        let end = count * (part + 1) / parts;
        if beg == end {
            continue;
        }
        let me = &trees[part % 2][g.rank.idx()];
        let class = ConnClass::Tree(part as u8);
        let key = |peer: Rank| ConnKey { peer, class };
        let children: Vec<ConnKey> = me.children.iter().map(|&c| key(c)).collect();
        let sched = Arc::new(Sched {
            nchildren: me.children.len(),
            root: me.parent.is_none(),
            es,
            beg,
            end,
            chunk,
            src,
            dst,
        });
        let chunks = (end - beg).div_ceil(chunk);
        let up = sched.clone();
        let up_steps = (0..chunks).flat_map(move |k| up.up(k));
        match me.parent {
            None => lanes.push(Lane::new(children.clone(), children, Some(ctx), Box::new(up_steps))),
            Some(p) => {
                lanes.push(Lane::new(children.clone(), vec![key(p)], Some(ctx), Box::new(up_steps)));
                let down_steps = (0..chunks).flat_map(move |k| sched.down(k));
                lanes.push(Lane::new(vec![key(p)], children, None, Box::new(down_steps)));
            }
        }
    }
    Ok(lanes)
}

struct Sched {
    nchildren: usize,
    root: bool,
    es: usize,
    beg: usize,
    end: usize,
    chunk: usize,
    src: Loc,
    dst: Loc,
}

impl Sched {
    fn chunk_at(&self, k: usize) -> (usize, Loc, Loc) {
        let lo = self.beg + k * self.chunk;
        let n = self.chunk.min(self.end - lo);
        let off = lo * self.es;
        (n * self.es, self.src.at(off), self.dst.at(off))
    }

    /// Chunk `k` going up: reduce the children's partial sums into this rank's input, one
    /// child per step, and send the result to the parent (inbound ports: the children;
    /// outbound: the parent at 0). At the root, the last reduction is finalized, written and
    /// sent to the first child, then copied to the others (outbound ports: the children).
    fn up(&self, k: usize) -> Vec<Step> {
        let (len, s, d) = self.chunk_at(k);
        let m = self.nchildren;
        let step = |input, dst, send, finalize| Step { input, dst, send, finalize, len, tag: 0 };
        if m == 0 {
            return vec![if self.root {
                step(Input::Src(s), Some(d), None, true)
            } else {
                step(Input::Src(s), None, Some(Port(0)), false)
            }];
        }
        let mut v = Vec::with_capacity(2 * m);
        for j in 0..m {
            let input = Input::RecvReduce(Port(j as u8), if j == 0 { s } else { d });
            v.push(match (j + 1 == m, self.root) {
                (true, false) => step(input, None, Some(Port(0)), false),
                (true, true) => step(input, Some(d), Some(Port(0)), true),
                (false, _) => step(input, Some(d), None, false),
            });
        }
        if self.root {
            for j in 1..m {
                v.push(step(Input::Src(d), None, Some(Port(j as u8)), false));
            }
        }
        v
    }

    /// Chunk `k` coming down (non-root ranks): receive the final value from the parent
    /// (inbound port 0), write it, and pass it to every child (outbound ports: the children).
    fn down(&self, k: usize) -> Vec<Step> {
        let (len, _, d) = self.chunk_at(k);
        let step = |input, dst, send| Step { input, dst, send, finalize: false, len, tag: 0 };
        let mut v = vec![step(Input::Recv(Port(0)), Some(d), (self.nchildren > 0).then_some(Port(0)))];
        for j in 1..self.nchildren {
            v.push(step(Input::Src(d), None, Some(Port(j as u8))));
        }
        v
    }
}
