//! What a plan knows of its communicator ([`Geometry`]: rank, size, ring order, hosts, chunk
//! size, the selector's choices) and what every rank derives from it alone: ring positions and
//! the tree all-reduce's rank-level trees ([`places`], kept in a [`GeometryCache`]).
//!
//! Rule: below every planner; it names the topology's host-level trees
//! ([`crate::topo::graphs::double_btree`]) and the tuner's selector, nothing that plans.

use crate::dtype::DataType;
use crate::topo::graphs::double_btree;
use crate::types::Rank;
use std::sync::Arc;

/// What a plan needs to know about the communicator.
#[derive(Clone, Debug)]
pub struct Geometry {
    pub rank: Rank,
    pub size: usize,
    /// The ring order (a permutation of all ranks), the same on every rank.
    pub ring: Arc<[Rank]>,
    /// Parallel rings a ring collective is striped over.
    pub nchannels: usize,
    /// The largest chunk a step may carry, in bytes.
    pub chunk_bytes: usize,
    /// The least data (bytes of the call's count) a collective puts on each ring; smaller
    /// calls use fewer rings (0: always all `nchannels`).
    pub channel_min_bytes: usize,
    /// The largest all-reduce the one-shot plan takes ([`crate::tuning::one_shot_max_bytes`]).
    pub one_shot_max_bytes: usize,
    /// The least bytes of a hierarchical all-reduce's pipelined pieces
    /// ([`crate::tuning::HIER_PIECE_BYTES`]).
    pub hier_piece_bytes: usize,
    /// Each rank's host, as a small index (ranks with equal values share a host).
    pub hosts: Arc<[u32]>,
    /// The algorithm each all-reduce takes, by size (`None`: the built-in rules — one-shot for
    /// small calls, else the ring).
    pub select: Option<Arc<crate::tuner::Selector>>,
    /// `OXCCL_DETERMINISTIC`: every reduction folds the ranks' inputs in rank order
    /// (`plan/det.rs`), whatever the size and algorithm.
    pub deterministic: bool,
    /// What every rank's plans derive from `ring` and `hosts` alone, computed once
    /// ([`Geometry::cached`]); `None`: computed by each plan that needs it.
    pub cache: Option<Arc<GeometryCache>>,
}

/// Derived from a geometry's ring and hosts, the same for all its ranks.
#[derive(Debug)]
pub struct GeometryCache {
    /// Each rank's position in the ring.
    pub ring_pos: Vec<u32>,
    /// The tree all-reduce's two rank-level trees ([`places`]).
    pub tree: [Vec<Place>; 2],
    /// The hosts' ranks, where every host has as many ([`HostGroups::of`]).
    pub groups: Option<Arc<HostGroups>>,
}

impl Geometry {
    /// A geometry with the ring in rank order.
    pub fn simple(rank: Rank, size: usize, nchannels: usize, chunk_bytes: usize) -> Geometry {
        Geometry {
            rank,
            size,
            ring: (0..size).map(Rank::new).collect::<Vec<_>>().into(),
            nchannels,
            chunk_bytes,
            channel_min_bytes: 0,
            one_shot_max_bytes: crate::tuning::ONE_SHOT_MAX_BYTES,
            hier_piece_bytes: crate::tuning::HIER_PIECE_BYTES,
            hosts: vec![0; size].into(),
            select: None,
            deterministic: false,
            cache: None,
        }
    }

    /// This geometry with its [`GeometryCache`] (for every rank of a communicator: clone it
    /// and set `rank`). Plans are the same with or without it.
    pub fn cached(mut self) -> Geometry {
        self.cache = None;
        let mut ring_pos = vec![0u32; self.size];
        for (i, r) in self.ring.iter().enumerate() {
            if let Some(x) = ring_pos.get_mut(r.idx()) {
                *x = i as u32;
            }
        }
        let tree = places(&self);
        let groups = HostGroups::of(&self).map(Arc::new);
        self.cache = Some(Arc::new(GeometryCache { ring_pos, tree, groups }));
        self
    }

    /// This geometry with rank `r` on host `host_of(r)`.
    pub fn with_hosts(mut self, host_of: impl Fn(usize) -> u32) -> Geometry {
        self.hosts = (0..self.size).map(host_of).collect::<Vec<_>>().into();
        self.cache = None;
        self
    }

    pub(super) fn ring_pos(&self, r: Rank) -> usize {
        if let Some(c) = &self.cache {
            return c.ring_pos.get(r.idx()).map_or(0, |&p| p as usize);
        }
        self.ring.iter().position(|x| *x == r).unwrap_or(0)
    }

    /// Rings (channels) a collective of `count` elements of `es` bytes is striped over: small
    /// calls use fewer, as each ring adds a round of wake-ups per step; every rank computes the
    /// same from the call.
    pub(super) fn channels_for(&self, count: usize, es: usize) -> usize {
        let by_size = (count * es).checked_div(self.channel_min_bytes).unwrap_or(usize::MAX).max(1);
        self.nchannels.max(1).min(count.max(1)).min(by_size)
    }

    pub(super) fn chunk_elems(&self, dtype: DataType) -> usize {
        (self.chunk_bytes / dtype.size_bytes()).max(1)
    }
}

/// The ranks of each host, where every host has the same number `k` of them: what the
/// hierarchical plans (`plan/hier.rs`) are built on. Hosts are in ring order and each host's
/// ranks in ring order, so every rank derives the same groups from the geometry alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostGroups {
    /// `members[h][l]`: the rank at local index `l` of host `h`.
    pub members: Vec<Arc<[Rank]>>,
    /// Each rank's (host, local index).
    pub place: Vec<(u32, u32)>,
}

impl HostGroups {
    /// The groups of `g`'s hosts; `None` when the hosts hold different numbers of ranks.
    pub fn of(g: &Geometry) -> Option<HostGroups> {
        let mut members: Vec<Vec<Rank>> = Vec::new();
        let mut index: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
        let mut place = vec![(0u32, 0u32); g.size];
        for &r in g.ring.iter() {
            let h = g.hosts.get(r.idx()).copied().unwrap_or(0);
            let hi = *index.entry(h).or_insert_with(|| {
                members.push(Vec::new());
                members.len() - 1
            });
            *place.get_mut(r.idx())? = (hi as u32, members[hi].len() as u32);
            members[hi].push(r);
        }
        let k = members.first()?.len();
        if members.iter().any(|m| m.len() != k) {
            return None;
        }
        Some(HostGroups { members: members.into_iter().map(Arc::from).collect(), place })
    }

    pub fn hosts(&self) -> usize {
        self.members.len()
    }

    /// Ranks per host.
    pub fn local(&self) -> usize {
        self.members.first().map_or(0, |m| m.len())
    }

    /// `hosts` hosts of `local` ranks each, numbered as launchers number them (rank
    /// `h·local + l` on host `h`).
    pub fn contiguous(hosts: usize, local: usize) -> HostGroups {
        let members = (0..hosts).map(|h| (0..local).map(|l| Rank::new(h * local + l)).collect()).collect();
        let place =
            (0..hosts * local).map(|r| ((r / local.max(1)) as u32, (r % local.max(1)) as u32)).collect();
        HostGroups { members, place }
    }

    /// The hierarchical plans' layout (`plan::hier`), as `oxccl topo` and the INFO log show
    /// it: the rings inside each host and between hosts, the rail of each channel between
    /// hosts (channel `c` on rail `c mod R`), and what a host's NIC carries.
    pub fn describe(&self, channels: usize, rails: usize) -> String {
        const SHOWN: usize = 8;
        let (h, k, rails, channels) = (self.hosts(), self.local(), rails.max(1), channels.max(1));
        let list = |items: Vec<String>| {
            let more = items.len().saturating_sub(SHOWN);
            let mut s = items.into_iter().take(SHOWN).collect::<Vec<_>>().join(" | ");
            if more > 0 {
                s.push_str(&format!(" | … ({more} more)"));
            }
            s
        };
        let ranks =
            |v: &mut dyn Iterator<Item = Rank>| v.map(|r| r.to_string()).collect::<Vec<_>>().join(" ");
        let inside = list(
            self.members
                .iter()
                .enumerate()
                .map(|(i, m)| format!("host {i}: {}", ranks(&mut m.iter().copied())))
                .collect(),
        );
        let between = list(
            (0..k)
                .map(|l| {
                    format!(
                        "index {l}: {}",
                        ranks(&mut self.members.iter().filter_map(|m| m.get(l).copied()))
                    )
                })
                .collect(),
        );
        let chans = list((0..channels).map(|c| format!("channel {c}: rail {}", c % rails)).collect());
        let (hf, nf) = (h as f64, (h * k) as f64);
        format!(
            "hierarchy (Hier): {h} hosts × {k} ranks, {channels} channel(s) between hosts over {rails} rail(s)\n\
             \x20 inside each host, a ring over shared memory: {inside}\n\
             \x20 between hosts, one ring per local index, all at once: {between}\n\
             \x20 {chans} (TCP channel c on rail c mod {rails})\n\
             \x20 an all-reduce of S bytes puts {:.2} S through each host's NIC each way (2(H−1)/H; a flat ring {:.2} S, 2(N−1)/N)\n",
            2.0 * (hf - 1.0) / hf,
            2.0 * (nf - 1.0) / nf,
        )
    }
}

/// One rank's place in one tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub parent: Option<Rank>,
    pub children: Vec<Rank>,
}

/// The rank-level trees: for tree `t` (0 or 1), every rank's parent and children.
pub fn places(g: &Geometry) -> [Vec<Place>; 2] {
    // Hosts in ring order, each with its ranks in ring order.
    let mut hosts: Vec<(u32, Vec<Rank>)> = Vec::new();
    let mut index: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for &r in g.ring.iter() {
        let h = g.hosts.get(r.idx()).copied().unwrap_or(0);
        match index.get(&h) {
            Some(&i) => hosts[i].1.push(r),
            None => {
                index.insert(h, hosts.len());
                hosts.push((h, vec![r]));
            }
        }
    }
    let trees = double_btree(hosts.len());
    trees.map(|t| {
        let mut out = vec![Place { parent: None, children: Vec::new() }; g.size];
        for (hi, (_, ranks)) in hosts.iter().enumerate() {
            for (k, &r) in ranks.iter().enumerate() {
                let p = &mut out[r.idx()];
                if k > 0 {
                    p.parent = Some(ranks[k - 1]);
                } else if let Some(ph) = t.parent[hi] {
                    p.parent = Some(hosts[ph].1[0]);
                }
                if k + 1 < ranks.len() {
                    p.children.push(ranks[k + 1]);
                }
                if k == 0 {
                    p.children.extend(t.children[hi].iter().map(|&ch| hosts[ch].1[0]));
                }
            }
        }
        out
    })
}
