//! Hierarchical collectives for communicators over several hosts with the same number `k ≥ 2`
//! of ranks on each ([`HostGroups`]): the ranks of a host reduce, gather and scatter among
//! themselves (over shared memory), and only their shares cross the network, every rank of a
//! host sending its share at once on its own rings, so that each byte crosses a host's NIC as
//! few times as the collective allows.
//!
//! - All-reduce (per channel's part of the buffer, cut into `k` shards): a reduce-scatter
//!   inside the host leaves rank `l` with its host's sum of shard `l` (in the output); the `k`
//!   ranks of local index `l` (one per host) all-reduce that shard between hosts on a ring;
//!   an all-gather inside the host spreads the shards. A host's NIC carries `2(H−1)/H` of the
//!   buffer each way, where a flat ring over all `N` ranks carries `2(N−1)/N`.
//! - All-gather: the ranks of local index `l` all-gather their blocks between hosts, then each
//!   host's ranks all-gather what they hold (`H` blocks each) among themselves.
//! - Reduce-scatter: inside each host, a reduce-scatter of every host's share leaves rank `l`
//!   the host's partial sums of the blocks of local index `l` of all hosts (in scratch); the
//!   ranks of local index `l` then reduce-scatter those between hosts.
//!
//! Broadcast and reduce keep the flat chain: it already crosses each host's NIC once.
//!
//! Rules: the planners' vocabulary only (geometry, lanes, the ring generator); the phases run
//! in order on each rank, each phase's lanes on connections of class `Ring(channel)`: inside
//! the host to the host-ring neighbours, between hosts to the cross-ring neighbours, never the
//! same peer in both roles (they are on different hosts). Every length depends only on the
//! call's arguments and the groups, so both ends of a connection agree (plan rule 1).

use super::geometry::{Geometry, HostGroups};
use super::lane::{ConnClass, ConnKey, Input, Lane, Port, Step};
use super::op::{BufId, Loc};
use super::ring::RingCollective;
use crate::coll::RingColl;
use crate::dtype::{DataType, ReduceOp};
use crate::error::CoreError;
use crate::reduce::ReduceCtx;
use crate::types::{ChannelId, Rank};
use std::sync::Arc;

/// The host groups of `g` where a hierarchical plan applies: several hosts, the same number
/// of ranks (at least two) on each.
pub fn groups(g: &Geometry) -> Option<Arc<HostGroups>> {
    let grp = match &g.cache {
        Some(c) => c.groups.clone()?,
        None => Arc::new(HostGroups::of(g)?),
    };
    (grp.hosts() >= 2 && grp.local() >= 2).then_some(grp)
}

/// Where one segment of a host ring's half lies: element offsets in the source and the
/// destination, and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg {
    src: usize,
    dst: usize,
    len: usize,
}

type SegFn = Arc<dyn Fn(usize, usize) -> Seg + Send + Sync>;

/// A plan's phases, in order.
type Phases = Vec<Vec<Lane>>;

/// Which half of a ring collective a [`HostHalf`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half {
    /// Position `x` ends with the reduction of segment `x` of every position's source, in its
    /// destination (never finalized: the rings between hosts finish the reduction).
    Reduce,
    /// Position `x`'s segment `x` (in its destination) reaches every position's destination.
    Gather,
}

/// One half of a ring collective over a host's `p` ranks, in `rounds` rounds of `p` segments
/// each (`seg(round, x)`), chunked; zero-length chunks are skipped on both ends alike.
struct HostHalf {
    half: Half,
    p: usize,
    pos: usize,
    es: usize,
    chunk: usize,
    rounds: usize,
    seg: SegFn,
    src: Loc,
    dst: Loc,
    round: usize,
    /// Chunks of the current round (of its longest segment).
    tmax: usize,
    t: usize,
    s: usize,
}

impl HostHalf {
    #[allow(clippy::too_many_arguments)]
    fn new(
        half: Half,
        p: usize,
        pos: usize,
        es: usize,
        chunk: usize,
        rounds: usize,
        seg: SegFn,
        src: Loc,
        dst: Loc,
    ) -> Self {
        let mut h = HostHalf {
            half,
            p,
            pos,
            es,
            chunk: chunk.max(1),
            rounds,
            seg,
            src,
            dst,
            round: 0,
            tmax: 0,
            t: 0,
            s: 0,
        };
        h.start_round();
        h
    }

    fn start_round(&mut self) {
        self.t = 0;
        self.s = 0;
        self.tmax = if self.round < self.rounds {
            (0..self.p).map(|x| (self.seg)(self.round, x).len.div_ceil(self.chunk)).max().unwrap_or(0)
        } else {
            0
        };
    }

    fn step_at(&self) -> Option<Step> {
        let (p, s) = (self.p, self.s);
        let x = match self.half {
            Half::Reduce => (self.pos + 2 * p - 1 - s) % p,
            Half::Gather => (self.pos + p - s) % p,
        };
        let seg = (self.seg)(self.round, x);
        let lo = self.t * self.chunk;
        if lo >= seg.len {
            return None;
        }
        let n = self.chunk.min(seg.len - lo);
        let src = self.src.at((seg.src + lo) * self.es);
        let dst = self.dst.at((seg.dst + lo) * self.es);
        let last = s + 1 == p;
        let step = |input, dst, send: bool| Step {
            input,
            dst,
            send: send.then_some(Port(0)),
            finalize: false,
            len: n * self.es,
            tag: 0,
        };
        Some(match (self.half, s) {
            (Half::Reduce, 0) => step(Input::Src(src), None, true),
            (Half::Reduce, _) if !last => step(Input::RecvReduce(Port(0), src), None, true),
            (Half::Reduce, _) => step(Input::RecvReduce(Port(0), src), Some(dst), false),
            (Half::Gather, 0) => step(Input::Src(dst), None, true),
            (Half::Gather, _) => step(Input::Recv(Port(0)), Some(dst), !last),
        })
    }
}

impl Iterator for HostHalf {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        while self.round < self.rounds {
            if self.t >= self.tmax {
                self.round += 1;
                self.start_round();
                continue;
            }
            let step = self.step_at();
            self.s += 1;
            if self.s == self.p {
                self.s = 0;
                self.t += 1;
            }
            if step.is_some() {
                return step;
            }
        }
        None
    }
}

/// This rank's neighbours on a ring: (previous, next).
fn neighbours(ring: &[Rank], pos: usize) -> (Rank, Rank) {
    let p = ring.len();
    (ring[(pos + p - 1) % p], ring[(pos + 1) % p])
}

fn lane(
    ring: &[Rank],
    pos: usize,
    c: usize,
    reduce: Option<ReduceCtx>,
    steps: Box<dyn Iterator<Item = Step> + Send>,
) -> Lane {
    let (prev, next) = neighbours(ring, pos);
    let class = ConnClass::Ring(ChannelId(c as u16));
    Lane::new(vec![ConnKey { peer: prev, class }], vec![ConnKey { peer: next, class }], reduce, steps)
}

/// Where this rank sits: its host's ranks, its local index, the ranks of its local index on
/// every host, its host's index.
struct Place {
    host: Arc<[Rank]>,
    l: usize,
    cross: Arc<[Rank]>,
    h: usize,
}

fn place(g: &Geometry, grp: &HostGroups) -> Place {
    let (h, l) = grp.place.get(g.rank.idx()).map_or((0, 0), |&(h, l)| (h as usize, l as usize));
    let cross: Vec<Rank> = grp.members.iter().map(|m| m[l]).collect();
    Place { host: grp.members[h].clone(), l, cross: cross.into(), h }
}

/// Element range `[lo, hi)` of part `i` of `n` elements cut `parts` ways.
fn part(n: usize, parts: usize, i: usize) -> (usize, usize) {
    (n * i / parts, n * (i + 1) / parts)
}

/// The phases of a hierarchical all-reduce for rank `g.rank`: the buffer in pieces
/// ([`crate::tuning::HIER_PIECE_BYTES`]), phase `j` running piece `j`'s reduce-scatter inside
/// the host, piece `j − 1`'s all-reduce between hosts and piece `j − 2`'s all-gather inside the
/// host, each after the phase that feeds it. Inside the host the reduce-scatters use the
/// connections of class `Ring(c)` and an all-gather that runs beside one uses `Ring(C + c)`
/// (`C` channels), so no two lanes of a phase share a connection.
pub fn all_reduce(
    g: &Geometry,
    grp: &HostGroups,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    src: Loc,
    dst: Loc,
) -> Result<Vec<Vec<Lane>>, CoreError> {
    let ctx = ReduceCtx::new(dtype, op, g.size as u32)?;
    let (es, chunk, k) = (dtype.size_bytes(), g.chunk_elems(dtype), grp.local());
    let me = place(g, grp);
    let pieces =
        (count * es).checked_div(g.hier_piece_bytes).unwrap_or(1).clamp(1, crate::tuning::HIER_MAX_PIECES);
    let mut phases: Vec<Vec<Lane>> = (0..pieces + 2).map(|_| Vec::new()).collect();
    for piece in 0..pieces {
        let (p0, p1) = part(count, pieces, piece);
        let channels = g.channels_for(p1 - p0, es);
        for c in 0..channels {
            let (b, e) = part(p1 - p0, channels, c);
            let (beg, end) = (p0 + b, p0 + e);
            if beg == end {
                continue;
            }
            let shard = move |_: usize, x: usize| {
                let (lo, hi) = part(end - beg, k, x);
                Seg { src: beg + lo, dst: beg + lo, len: hi - lo }
            };
            let seg: SegFn = Arc::new(shard);
            let half = |h, s, d| Box::new(HostHalf::new(h, k, me.l, es, chunk, 1, seg.clone(), s, d));
            phases[piece].push(lane(&me.host, me.l, c, Some(ctx), half(Half::Reduce, src, dst)));
            // Beside a later piece's reduce-scatter, the all-gather takes the second set.
            let ag_class = if piece + 2 < pieces { g.nchannels.max(1) + c } else { c };
            phases[piece + 2].push(lane(&me.host, me.l, ag_class, None, half(Half::Gather, dst, dst)));
            let mine = shard(0, me.l);
            if mine.len > 0 {
                let gen = RingCollective::new(
                    RingColl::AllReduce,
                    me.cross.clone(),
                    me.h,
                    0,
                    es,
                    count,
                    dst,
                    dst,
                    mine.dst,
                    mine.dst + mine.len,
                    chunk,
                );
                phases[piece + 1].push(lane(&me.cross, me.h, c, Some(ctx), Box::new(gen)));
            }
        }
    }
    Ok(phases.into_iter().filter(|p| !p.is_empty()).collect())
}

/// The phases and scratch bytes of a small hierarchical all-reduce, or `None` where it does
/// not apply (the leaders' exchange is not one-shot sized): the host's ranks reduce into its
/// first rank (its leader) along the host ring, the leaders all-reduce in one exchange
/// (`oneshot`, planned among the `H` leaders and addressed to their ranks), and the leader's
/// result goes back along the host ring. Each host puts `H − 1` messages on the network
/// where the one-shot of all ranks puts `k(N − k)`.
pub fn all_reduce_small(
    g: &Geometry,
    grp: &HostGroups,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    src: Loc,
    dst: Loc,
) -> Result<Option<(Phases, usize)>, CoreError> {
    let (es, chunk, k, nh) = (dtype.size_bytes(), g.chunk_elems(dtype), grp.local(), grp.hosts());
    let me = place(g, grp);
    let mut leaders = Geometry::simple(Rank::new(me.h), nh, 1, g.chunk_bytes);
    leaders.one_shot_max_bytes = g.one_shot_max_bytes;
    if !super::oneshot::applies(&leaders, count, dtype) {
        return Ok(None);
    }
    let ctx = ReduceCtx::new(dtype, op, g.size as u32)?;
    // Segment 0 (the leader's) is the whole buffer; the others are empty.
    let seg: SegFn =
        Arc::new(move |_: usize, x: usize| Seg { src: 0, dst: 0, len: if x == 0 { count } else { 0 } });
    let half = |h, s, d| Box::new(HostHalf::new(h, k, me.l, es, chunk, 1, seg.clone(), s, d));
    let mut phases = vec![vec![lane(&me.host, me.l, 0, Some(ctx), half(Half::Reduce, src, dst))]];
    let mut scratch = 0;
    if me.l == 0 {
        let (mut exchange, bytes) = super::oneshot::all_reduce(&leaders, count, dtype, op, dst, dst)?;
        for lane in exchange.iter_mut().flatten() {
            for key in lane.inbound.iter_mut().chain(lane.outbound.iter_mut()) {
                key.peer = me.cross[key.peer.idx()];
            }
            // Avg divides by the communicator's size, not the leaders' count.
            if lane.reduce.is_some() {
                lane.reduce = Some(ctx);
            }
        }
        phases.extend(exchange);
        scratch = bytes;
    }
    phases.push(vec![lane(&me.host, me.l, 0, None, half(Half::Gather, dst, dst))]);
    Ok(Some((phases, scratch)))
}

/// The phases of a hierarchical all-gather (`count` elements per rank) for rank `g.rank`.
pub fn all_gather(
    g: &Geometry,
    grp: &HostGroups,
    count: usize,
    dtype: DataType,
    src: Loc,
    dst: Loc,
) -> Vec<Vec<Lane>> {
    let (es, chunk, k, nh) = (dtype.size_bytes(), g.chunk_elems(dtype), grp.local(), grp.hosts());
    let me = place(g, grp);
    let channels = g.channels_for(count * g.size, es).min(count.max(1));
    let (mut cross, mut host) = (Vec::new(), Vec::new());
    for c in 0..channels {
        let (beg, end) = part(count, channels, c);
        if beg == end {
            continue;
        }
        let gen = RingCollective::new(
            RingColl::AllGather,
            me.cross.clone(),
            me.h,
            0,
            es,
            count,
            src,
            dst,
            beg,
            end,
            chunk,
        );
        cross.push(lane(&me.cross, me.h, c, None, Box::new(gen)));
        let members: Vec<Arc<[Rank]>> = grp.members.clone();
        // Round `h`: position `x` holds (and gives) the block of host `h`'s rank `x`.
        let seg: SegFn = Arc::new(move |h: usize, x: usize| {
            let at = members[h][x].idx() * count + beg;
            Seg { src: at, dst: at, len: end - beg }
        });
        host.push(lane(
            &me.host,
            me.l,
            c,
            None,
            Box::new(HostHalf::new(Half::Gather, k, me.l, es, chunk, nh, seg, dst, dst)),
        ));
    }
    [cross, host].into_iter().filter(|p| !p.is_empty()).collect()
}

/// The phases of a hierarchical reduce-scatter (`count` elements per rank) for rank `g.rank`,
/// and the scratch bytes they use (each rank's host partial sums: `hosts × count` elements).
pub fn reduce_scatter(
    g: &Geometry,
    grp: &HostGroups,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    src: Loc,
    dst: Loc,
) -> Result<(Vec<Vec<Lane>>, usize), CoreError> {
    let ctx = ReduceCtx::new(dtype, op, g.size as u32)?;
    let (es, chunk, k, nh) = (dtype.size_bytes(), g.chunk_elems(dtype), grp.local(), grp.hosts());
    let me = place(g, grp);
    let scratch = Loc::start(BufId::SCRATCH);
    let channels = g.channels_for(count * g.size, es).min(count.max(1));
    // Host positions as ranks: the cross ring's reduce-scatter addresses the partial sums in
    // scratch by host index (block `h` at `h × count`).
    let by_host: Arc<[Rank]> = (0..nh).map(Rank::new).collect::<Vec<_>>().into();
    let (mut host, mut cross) = (Vec::new(), Vec::new());
    for c in 0..channels {
        let (beg, end) = part(count, channels, c);
        if beg == end {
            continue;
        }
        let members: Vec<Arc<[Rank]>> = grp.members.clone();
        // Round `h`: position `x` ends with the host's sum of the block of host `h`'s rank `x`.
        let seg: SegFn = Arc::new(move |h: usize, x: usize| Seg {
            src: members[h][x].idx() * count + beg,
            dst: h * count + beg,
            len: end - beg,
        });
        host.push(lane(
            &me.host,
            me.l,
            c,
            Some(ctx),
            Box::new(HostHalf::new(Half::Reduce, k, me.l, es, chunk, nh, seg, src, scratch)),
        ));
        let gen = RingCollective::new(
            RingColl::ReduceScatter,
            by_host.clone(),
            me.h,
            0,
            es,
            count,
            scratch,
            dst,
            beg,
            end,
            chunk,
        );
        cross.push(lane(&me.cross, me.h, c, Some(ctx), Box::new(gen)));
    }
    Ok(([host, cross].into_iter().filter(|p| !p.is_empty()).collect(), nh * count * es))
}
