//! Direct algorithms: each pair of ranks exchanges its data over its own connection.
//!
//! AlltoAll(v), Gather and Scatter use the `Direct` connection class, one lane per peer and
//! direction; user send/recv use the `P2p` class, one lane per peer and direction carrying the
//! group's messages to that peer in issue order. A rank's data for itself is a local copy lane.

use super::geometry::Geometry;
use super::lane::{ConnClass, ConnKey, Input, Lane, Port, Step};
use super::op::{Loc, OpSpec};
use crate::contract::{Seqs, Sig};
use crate::dtype::DataType;
use crate::error::CoreError;
use crate::types::Rank;

/// What a stream of chunks does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StreamKind {
    Send,
    Recv,
    Copy,
}

/// A message cut into chunks: sent, received, or copied locally.
#[derive(Clone, Debug)]
pub struct DirectStream {
    kind: StreamKind,
    src: Loc,
    dst: Loc,
    total: usize,
    chunk: usize,
    done: usize,
    tag: u16,
}

impl DirectStream {
    pub(super) fn new(kind: StreamKind, src: Loc, dst: Loc, bytes: usize, chunk: usize) -> Self {
        DirectStream { kind, src, dst, total: bytes, chunk: chunk.max(1), done: 0, tag: 0 }
    }

    /// The same stream with its steps tagged `tag` (see [`Step::tag`]).
    fn tagged(self, tag: u16) -> Self {
        DirectStream { tag, ..self }
    }
}

impl Iterator for DirectStream {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        if self.done >= self.total {
            return None;
        }
        let len = self.chunk.min(self.total - self.done);
        let off = self.done;
        self.done += len;
        let tag = self.tag;
        Some(match self.kind {
            StreamKind::Send => Step {
                input: Input::Src(self.src.at(off)),
                dst: None,
                send: Some(Port(0)),
                finalize: false,
                len,
                tag,
            },
            StreamKind::Recv => Step {
                input: Input::Recv(Port(0)),
                dst: Some(self.dst.at(off)),
                send: None,
                finalize: false,
                len,
                tag,
            },
            StreamKind::Copy => Step {
                input: Input::Src(self.src.at(off)),
                dst: Some(self.dst.at(off)),
                send: None,
                finalize: false,
                len,
                tag,
            },
        })
    }
}

fn chunk_for(g: &Geometry, dtype: DataType) -> usize {
    let es = dtype.size_bytes();
    (g.chunk_bytes / es).max(1) * es
}

fn send_lane(peer: Rank, class: ConnClass, steps: Box<dyn Iterator<Item = Step> + Send>) -> Lane {
    Lane::new(vec![], vec![ConnKey { peer, class }], None, steps)
}

fn recv_lane(peer: Rank, class: ConnClass, steps: Box<dyn Iterator<Item = Step> + Send>) -> Lane {
    Lane::new(vec![ConnKey { peer, class }], vec![], None, steps)
}

fn copy_lane(src: Loc, dst: Loc, bytes: usize, chunk: usize) -> Lane {
    Lane::new(vec![], vec![], None, Box::new(DirectStream::new(StreamKind::Copy, src, dst, bytes, chunk)))
}

/// A point-to-point lane to or from one peer: its messages in order, each tagged with its
/// place in the lane so that every chunk carries its own message's signature. `first` is the
/// number of the peer's first message in this group; zero-length messages send nothing but
/// keep their numbers.
fn p2p_lane(
    kind: StreamKind,
    peer: Rank,
    msgs: &[(Loc, usize, DataType)],
    g: &Geometry,
    first: Option<u64>,
) -> Option<Lane> {
    let mut sigs = Vec::new();
    let mut streams = Vec::new();
    for (i, &(loc, n, dtype)) in msgs.iter().enumerate() {
        if n == 0 {
            continue;
        }
        // Tags past u16::MAX share the last one, whose signature is then left unchecked
        // (both ends compute the same tags, so they agree on what is checked).
        let k = streams.len();
        let tag = k.min(u16::MAX as usize) as u16;
        if let (Some(f), true) = (first, k < u16::MAX as usize) {
            sigs.push(Sig::message(f + i as u64, dtype, n / dtype.size_bytes()));
        }
        streams.push(DirectStream::new(kind, loc, loc, n, chunk_for(g, dtype)).tagged(tag));
    }
    if streams.is_empty() {
        return None;
    }
    let it: Box<dyn Iterator<Item = Step> + Send> = Box::new(streams.into_iter().flatten());
    let mut lane = match kind {
        StreamKind::Send => send_lane(peer, ConnClass::P2p, it),
        _ => recv_lane(peer, ConnClass::P2p, it),
    };
    let mut sigs = sigs.into_iter();
    lane.sig = sigs.next().unwrap_or(Sig::NONE);
    lane.more_sigs = sigs.collect();
    Some(lane)
}

fn stream(kind: StreamKind, src: Loc, dst: Loc, bytes: usize, chunk: usize) -> Box<DirectStream> {
    Box::new(DirectStream::new(kind, src, dst, bytes, chunk))
}

/// The byte sizes an all-to-all-v needs: (send buffer, receive buffer), each the furthest
/// byte any peer's segment reaches.
pub fn alltoallv_bytes(
    dtype: DataType,
    send_counts: &[usize],
    send_displs: &[usize],
    recv_counts: &[usize],
    recv_displs: &[usize],
) -> (usize, usize) {
    let extent = |c: &[usize], d: &[usize]| {
        c.iter().zip(d).filter(|(c, _)| **c > 0).map(|(c, d)| c + d).max().unwrap_or(0) * dtype.size_bytes()
    };
    (extent(send_counts, send_displs), extent(recv_counts, recv_displs))
}

/// AlltoAll(v): one send lane and one receive lane per peer, a copy lane for itself. Lanes are
/// ordered starting with the next rank so that ranks do not all start on the same peer.
#[allow(clippy::too_many_arguments)]
pub(super) fn alltoallv(
    g: &Geometry,
    dtype: DataType,
    send_counts: &[usize],
    send_displs: &[usize],
    recv_counts: &[usize],
    recv_displs: &[usize],
    src: Loc,
    dst: Loc,
) -> Vec<Lane> {
    let es = dtype.size_bytes();
    let chunk = chunk_for(g, dtype);
    let me = g.rank.idx();
    let mut lanes = Vec::new();
    for i in 0..g.size {
        let peer = (me + i) % g.size;
        let s = src.at(send_displs[peer] * es);
        let d = dst.at(recv_displs[peer] * es);
        if peer == me {
            let n = send_counts[me].min(recv_counts[me]) * es;
            if n > 0 {
                lanes.push(copy_lane(s, d, n, chunk));
            }
            continue;
        }
        let r = Rank::new(peer);
        if send_counts[peer] > 0 {
            let st = stream(StreamKind::Send, s, s, send_counts[peer] * es, chunk);
            lanes.push(send_lane(r, ConnClass::Direct, st));
        }
        if recv_counts[peer] > 0 {
            let st = stream(StreamKind::Recv, d, d, recv_counts[peer] * es, chunk);
            lanes.push(recv_lane(r, ConnClass::Direct, st));
        }
    }
    lanes
}

/// Gather: every rank sends its block to the root, which receives each into place.
pub(super) fn gather(
    g: &Geometry,
    dtype: DataType,
    count: usize,
    root: Rank,
    src: Loc,
    dst: Loc,
) -> Vec<Lane> {
    let es = dtype.size_bytes();
    let bytes = count * es;
    let chunk = chunk_for(g, dtype);
    if bytes == 0 {
        return vec![];
    }
    if g.rank != root {
        let st = stream(StreamKind::Send, src, src, bytes, chunk);
        return vec![send_lane(root, ConnClass::Direct, st)];
    }
    let mut lanes = vec![copy_lane(src, dst.at(root.idx() * bytes), bytes, chunk)];
    for i in 1..g.size {
        let peer = (root.idx() + i) % g.size;
        let d = dst.at(peer * bytes);
        let st = stream(StreamKind::Recv, d, d, bytes, chunk);
        lanes.push(recv_lane(Rank::new(peer), ConnClass::Direct, st));
    }
    lanes
}

/// Scatter: the root sends block i to rank i.
pub(super) fn scatter(
    g: &Geometry,
    dtype: DataType,
    count: usize,
    root: Rank,
    src: Loc,
    dst: Loc,
) -> Vec<Lane> {
    let es = dtype.size_bytes();
    let bytes = count * es;
    let chunk = chunk_for(g, dtype);
    if bytes == 0 {
        return vec![];
    }
    if g.rank != root {
        let st = stream(StreamKind::Recv, dst, dst, bytes, chunk);
        return vec![recv_lane(root, ConnClass::Direct, st)];
    }
    let mut lanes = vec![copy_lane(src.at(root.idx() * bytes), dst, bytes, chunk)];
    for i in 1..g.size {
        let peer = (root.idx() + i) % g.size;
        let s = src.at(peer * bytes);
        let st = stream(StreamKind::Send, s, s, bytes, chunk);
        lanes.push(send_lane(Rank::new(peer), ConnClass::Direct, st));
    }
    lanes
}

/// Point-to-point: the group's sends to each peer form one lane, its receives from each peer
/// another, in issue order. Sends to self are paired with receives from self, in order, as
/// local copies; an unpaired one is an error (it could never complete).
pub fn p2p_checked(
    g: &Geometry,
    ops: &[OpSpec],
    mut seqs: Option<(&mut Seqs, bool)>,
) -> Result<Vec<Lane>, CoreError> {
    let mut sends: Vec<Vec<(Loc, usize, DataType)>> = vec![Vec::new(); g.size];
    let mut recvs: Vec<Vec<(Loc, usize, DataType)>> = vec![Vec::new(); g.size];
    for op in ops {
        match *op {
            OpSpec::Send { count, dtype, peer, src } => {
                sends[peer.idx()].push((src, count * dtype.size_bytes(), dtype))
            }
            OpSpec::Recv { count, dtype, peer, dst } => {
                recvs[peer.idx()].push((dst, count * dtype.size_bytes(), dtype))
            }
            _ => {}
        }
    }
    let me = g.rank.idx();
    let mut lanes = Vec::new();
    let (self_sends, self_recvs) = (&sends[me], &recvs[me]);
    if self_sends.len() != self_recvs.len() {
        return Err(CoreError::invalid(
            "peer",
            format!(
                "rank {me} posts {} send(s) to itself but {} receive(s) from itself in one group",
                self_sends.len(),
                self_recvs.len()
            ),
        ));
    }
    for (i, (s, r)) in self_sends.iter().zip(self_recvs).enumerate() {
        if s.1 != r.1 {
            return Err(CoreError::invalid(
                "count",
                format!("rank {me}: self-message {i} sends {} bytes but receives {} bytes", s.1, r.1),
            ));
        }
        if s.1 > 0 {
            lanes.push(copy_lane(s.0, r.0, s.1, chunk_for(g, s.2)));
        }
    }
    for i in 1..g.size {
        let peer = (me + i) % g.size;
        let r = Rank::new(peer);
        // The numbers of this group's first message to and from the peer (advanced past
        // every message of the group, sent or not).
        let (first_sent, first_received) = match seqs.as_mut() {
            Some((s, stamp)) => {
                let f = (s.sent[peer], s.received[peer]);
                s.sent[peer] += sends[peer].len() as u64;
                s.received[peer] += recvs[peer].len() as u64;
                if *stamp {
                    (Some(f.0), Some(f.1))
                } else {
                    (None, None)
                }
            }
            None => (None, None),
        };
        lanes.extend(p2p_lane(StreamKind::Send, r, &sends[peer], g, first_sent));
        lanes.extend(p2p_lane(StreamKind::Recv, r, &recvs[peer], g, first_received));
    }
    Ok(lanes)
}
