//! The discrete-event engine: every rank's lanes, as `plan::plan_group` makes them for the
//! engine, executed step by step over the cluster's modeled links.
//!
//! Model (what is exact, what is approximated):
//! - exact: the plan — every lane, step, chunk length, connection and dependency the runtime
//!   would run (ring: 2(P − 1) steps per slice loop; tree: up and down lanes per part), and
//!   each connection's capacity (`slots` chunks in flight, as the runtime's slot rings);
//! - a step takes no GPU time; it starts when its lane is free, its input chunk has arrived and
//!   its output connection has room;
//! - a chunk's transfer holds every link of its path (in the sender's order of time) for its
//!   wire bytes over that link's bandwidth (LL doubles the bytes, LL128 adds 1/15), and arrives
//!   one hop latency (the cluster's per algorithm and protocol, plus the switches crossed)
//!   after its last byte left: links are shared first come, first served, so contention on
//!   NICs and switch uplinks shows;
//! - switches are aggregated per group and tier (a group's uplink is one resource of the
//!   group's capacity over its oversubscription); no routing collisions inside a tier;
//! - inside a node every GPU pair has its own link of the intra class's bandwidth;
//! - the call's base latency (the cluster's `base_us`) is added once;
//! - a rank's phases (the hierarchical plans') run in order: a phase's lanes start when the
//!   rank's last lane of the phase before has finished.

use super::cluster::Cluster;
use crate::contract::Seqs;
use crate::dtype::{DataType, ReduceOp};
use crate::plan::{plan_group_signed, BufId, ConnClass, Geometry, Input, Loc, OpSpec, Step};
use crate::tuner::{Algo, Proto, Selector};
use crate::types::Rank;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

/// What to simulate: one all-reduce.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub algo: Algo,
    pub proto: Proto,
    /// nccl-tests' size: bytes of each rank's buffer.
    pub bytes: usize,
    pub nranks: usize,
    /// Rings (or tree channels) the call is striped over.
    pub nchannels: usize,
    /// A connection slot's bytes (the protocol's capacity of it is the chunk).
    pub chunk_bytes: usize,
    /// Chunks a connection holds.
    pub slots: usize,
    /// Rings only: simulate ranks `0..q` of the `nranks`-rank ring, whose rank `q − 1` sends
    /// to rank 0 as if it were rank `q` (and rank 0 receives from rank `q − 1` as if from rank
    /// `nranks − 1`): exact when every q ranks of the ring see the same links (nodes, rails,
    /// switch crossings alike), an approximation otherwise. `q` divides `nranks`. `None`: all
    /// ranks.
    pub period: Option<usize>,
}

/// What a simulation found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The call's time, µs (the last rank's last step, plus the base latency).
    pub time_us: f64,
    /// Steps executed, over all ranks.
    pub steps: u64,
    pub lanes: usize,
    /// The busiest link: (what it is, µs it carried data).
    pub busiest: (String, f64),
}

/// One rank's lane in the simulation.
struct Lane {
    steps: Box<dyn Iterator<Item = Step> + Send>,
    pending: Option<Step>,
    free_at: f64,
    ins: Vec<u32>,
    outs: Vec<u32>,
    /// Its rank (of the simulated `0..q`) and phase.
    rank: u32,
    phase: u32,
    done: bool,
}

/// Where each simulated rank is in its phases: the phase running, its lanes not yet done,
/// and the lanes of later phases that asked to run (woken when theirs starts).
struct Phases {
    now: Vec<u32>,
    left: Vec<Vec<u32>>,
    parked: Vec<Vec<u32>>,
}

/// One unidirectional connection.
struct Conn {
    from: u32,
    to: u32,
    rail: u32,
    /// The lanes that send and receive on it, in phase order (a connection may serve a
    /// rank's lanes of several phases, one at a time).
    senders: Vec<u32>,
    receivers: Vec<u32>,
    queue: VecDeque<(f64, u32)>,
    inflight: u32,
    recv_waiting: bool,
    send_waiting: bool,
    /// Index of its path (computed at first use).
    path: u32,
}

/// A path: the links it holds and the latency it adds.
struct Path {
    links: Vec<u32>,
    latency_us: f64,
}

/// The links of a cluster, by index: intra pairs, NIC up and down, then per tier each
/// group's uplink and downlink.
struct Links {
    bw: Vec<f64>,
    free_at: Vec<f64>,
    busy: Vec<f64>,
    g: usize,
    nics: usize,
    nodes: usize,
    nic_up: usize,
    nic_down: usize,
    /// Per tier: (first uplink index, first downlink index, groups per rail, rails).
    tiers: Vec<(usize, usize, usize, usize)>,
}

impl Links {
    fn new(c: &Cluster, nodes: usize) -> Links {
        let (g, nics) = (c.gpus_per_node, c.nics_per_node);
        let mut bw = vec![c.intra.gbs; nodes * g * g];
        let nic_up = bw.len();
        bw.extend(std::iter::repeat_n(c.net.gbs, nodes * nics));
        let nic_down = bw.len();
        bw.extend(std::iter::repeat_n(c.net.gbs, nodes * nics));
        let mut tiers = Vec::new();
        for t in &c.tiers {
            let groups = nodes.div_ceil(t.nodes);
            let rails = if c.rail_optimized { nics } else { 1 };
            let per_rail = if c.rail_optimized { 1 } else { nics };
            let cap = t.nodes.min(nodes) as f64 * per_rail as f64 * c.net.gbs / t.oversubscription;
            let up = bw.len();
            bw.extend(std::iter::repeat_n(cap, groups * rails));
            let down = bw.len();
            bw.extend(std::iter::repeat_n(cap, groups * rails));
            tiers.push((up, down, groups, rails));
        }
        let free_at = vec![0.0; bw.len()];
        let busy = vec![0.0; bw.len()];
        Links { bw, free_at, busy, g, nics, nodes, nic_up, nic_down, tiers }
    }

    /// What link `l` is, in words.
    fn describe(&self, l: usize) -> String {
        if l < self.nic_up {
            let (n, rest) = (l / (self.g * self.g), l % (self.g * self.g));
            return format!("node {n} GPU {} -> GPU {}", rest / self.g, rest % self.g);
        }
        if l < self.nic_down {
            let i = l - self.nic_up;
            return format!("node {} NIC {} out", i / self.nics, i % self.nics);
        }
        if l < self.nic_down + self.nodes * self.nics {
            let i = l - self.nic_down;
            return format!("node {} NIC {} in", i / self.nics, i % self.nics);
        }
        for (t, &(up, down, groups, rails)) in self.tiers.iter().enumerate() {
            let n = groups * rails;
            if l >= up && l < up + n {
                return format!("tier {t} group {} rail {} uplink", (l - up) % groups, (l - up) / groups);
            }
            if l >= down && l < down + n {
                return format!(
                    "tier {t} group {} rail {} downlink",
                    (l - down) % groups,
                    (l - down) / groups
                );
            }
        }
        format!("link {l}")
    }

    /// The path from rank `a` to rank `b` on rail `rail`.
    fn path(&self, c: &Cluster, a: usize, b: usize, rail: usize, algo: Algo, proto: Proto) -> Path {
        let (na, nb) = (a / self.g, b / self.g);
        if na == nb {
            let (la, lb) = (a % self.g, b % self.g);
            return Path {
                links: vec![(na * self.g * self.g + la * self.g + lb) as u32],
                latency_us: c.intra.hop_us(algo, proto),
            };
        }
        let rail = rail % self.nics;
        let mut links = vec![(self.nic_up + na * self.nics + rail) as u32];
        let top = c.meeting_tier(na, nb).unwrap_or(0);
        for (i, t) in c.tiers.iter().enumerate().take(top) {
            let (up, _, groups, rails) = self.tiers[i];
            let r = if rails > 1 { rail } else { 0 };
            links.push((up + r * groups + na / t.nodes) as u32);
        }
        for (i, t) in c.tiers.iter().enumerate().take(top) {
            let (_, down, groups, rails) = self.tiers[i];
            let r = if rails > 1 { rail } else { 0 };
            links.push((down + r * groups + nb / t.nodes) as u32);
        }
        links.push((self.nic_down + nb * self.nics + rail) as u32);
        debug_assert!(nb < self.nodes);
        Path { links, latency_us: c.net.hop_us(algo, proto) + c.switch_us(na, nb) }
    }

    /// Sends `wire` bytes along `p` no earlier than `t`; returns the arrival time. Cut-through:
    /// the message enters each link of its path once that link is free and no earlier than it
    /// entered the link before; each link is held for the message's bytes over its bandwidth
    /// from then on, and the message arrives when it has left the last link it waited for,
    /// plus the path's latency.
    fn transfer(&mut self, p: &Path, t: f64, wire: f64) -> f64 {
        let (mut start, mut done) = (t, t);
        for &l in &p.links {
            let l = l as usize;
            start = start.max(self.free_at[l]);
            let d = wire / (self.bw[l] * 1e3);
            self.free_at[l] = start + d;
            self.busy[l] += d;
            done = done.max(start + d);
        }
        done + p.latency_us
    }
}

/// The rail a connection of `class` uses: ring channel c on rail c; tree part p (tree p mod 2
/// of channel p / 2) on rail p / 2, so both trees use every rail.
fn rail_of(class: ConnClass) -> u32 {
    match class {
        ConnClass::Ring(ch) => ch.0 as u32,
        ConnClass::Tree(part) => part as u32 / 2,
        _ => 0,
    }
}

/// Wire bytes of a chunk of `len` payload bytes in `proto`.
fn wire(proto: Proto, len: usize) -> f64 {
    match proto {
        Proto::LL => 2.0 * len as f64,
        Proto::LL128 => len as f64 * 128.0 / 120.0,
        Proto::Simple => len as f64,
    }
}

/// Every rank's geometry (ranks fill nodes in order; the ring is rank order, so each node's
/// GPUs are adjacent) with the algorithm and protocol forced.
pub fn geometry(c: &Cluster, s: &Spec) -> Geometry {
    let g = c.gpus_per_node;
    let mut sel = Selector::always(s.algo);
    sel.protos[crate::tuner::RingColl::AllReduce as usize] = vec![(usize::MAX, s.proto)];
    let mut geo = Geometry::simple(Rank(0), s.nranks, s.nchannels.max(1), s.chunk_bytes.max(64))
        .with_hosts(|r| (r / g) as u32);
    geo.channel_min_bytes = crate::tuning::RING_MIN_BYTES_PER_CHANNEL;
    geo.select = Some(Arc::new(sel));
    geo.cached()
}

/// Simulates one all-reduce of `s` on cluster `cluster`.
pub fn simulate(cluster: &Cluster, s: &Spec) -> Result<Outcome, String> {
    if s.nranks < 2 {
        return Err("simulate at least 2 ranks".into());
    }
    if !matches!(s.algo, Algo::Ring | Algo::Tree | Algo::Hier) {
        return Err(format!("the simulator runs Ring, Tree and Hier all-reduce, not {:?}", s.algo));
    }
    let q = match s.period {
        None => s.nranks,
        Some(q) if s.algo == Algo::Ring && q >= 2 && s.nranks % q == 0 => q,
        Some(q) => return Err(format!("a period of {q} ranks needs a ring and must divide {}", s.nranks)),
    };
    let nodes = cluster.nodes_for(s.nranks);
    let geo = geometry(cluster, s);
    let count = (s.bytes / 4).max(1);
    let op = OpSpec::AllReduce {
        count,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        src: Loc::start(BufId(0)),
        dst: Loc::start(BufId(1)),
    };
    let mut lanes: Vec<Lane> = Vec::new();
    let mut conns: Vec<Conn> = Vec::new();
    let mut index: HashMap<(u32, u32, ConnClass), u32> = HashMap::new();
    let mut conn_of = |conns: &mut Vec<Conn>, from: u32, to: u32, class: ConnClass| -> u32 {
        *index.entry((from, to, class)).or_insert_with(|| {
            conns.push(Conn {
                from,
                to,
                rail: rail_of(class),
                senders: Vec::new(),
                receivers: Vec::new(),
                queue: VecDeque::new(),
                inflight: 0,
                recv_waiting: false,
                send_waiting: false,
                path: u32::MAX,
            });
            conns.len() as u32 - 1
        })
    };
    let mut phases = Phases { now: vec![0; q], left: vec![Vec::new(); q], parked: vec![Vec::new(); q] };
    for r in 0..q {
        let g = Geometry { rank: Rank::new(r), ..geo.clone() };
        // (No per-peer message numbers: a collective needs none, and a table of P of them
        // per rank would make the set-up quadratic.)
        let job = plan_group_signed(&g, std::slice::from_ref(&op), &mut Seqs::new(0), false)
            .map_err(|e| e.to_string())?;
        phases.left[r] = job.phases.iter().map(|p| p.len() as u32).collect();
        let numbered =
            job.phases.into_iter().enumerate().flat_map(|(i, p)| p.into_iter().map(move |l| (i, l)));
        for (phase, lane) in numbered {
            let id = lanes.len() as u32;
            let ins: Vec<u32> = lane
                .inbound
                .iter()
                .map(|k| {
                    let c = conn_of(&mut conns, k.peer.0 % q as u32, r as u32, k.class);
                    conns[c as usize].receivers.push(id);
                    c
                })
                .collect();
            let outs: Vec<u32> = lane
                .outbound
                .iter()
                .map(|k| {
                    let c = conn_of(&mut conns, r as u32, k.peer.0 % q as u32, k.class);
                    // The path is the real one (to rank q, not its stand-in rank 0).
                    let cn = &mut conns[c as usize];
                    (cn.from, cn.to) = (r as u32, k.peer.0);
                    cn.senders.push(id);
                    c
                })
                .collect();
            lanes.push(Lane {
                steps: lane.steps,
                pending: None,
                free_at: 0.0,
                ins,
                outs,
                rank: r as u32,
                phase: phase as u32,
                done: false,
            });
        }
    }
    let mut links = Links::new(cluster, nodes);
    let mut paths: Vec<Path> = Vec::new();
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> =
        (0..lanes.len() as u32).map(|l| Reverse((0u64, l))).collect();
    let slots = s.slots.max(2) as u32;
    let (mut steps, mut end) = (0u64, 0.0f64);
    while let Some(Reverse((tb, l))) = heap.pop() {
        let t = f64::from_bits(tb);
        let lane = &mut lanes[l as usize];
        let rank = lane.rank as usize;
        if lane.phase > phases.now[rank] {
            phases.parked[rank].push(l);
            continue;
        }
        loop {
            if lane.pending.is_none() {
                lane.pending = lane.steps.next();
            }
            let Some(step) = lane.pending else {
                if !std::mem::replace(&mut lane.done, true) {
                    // The rank's phase ends with its last lane: the next that has lanes
                    // starts now.
                    let now = t.max(lane.free_at);
                    let p = lane.phase as usize;
                    phases.left[rank][p] -= 1;
                    while phases.left[rank].get(phases.now[rank] as usize) == Some(&0) {
                        phases.now[rank] += 1;
                    }
                    if phases.now[rank] as usize > p {
                        for w in std::mem::take(&mut phases.parked[rank]) {
                            heap.push(Reverse((now.to_bits(), w)));
                        }
                    }
                }
                break;
            };
            let now = t.max(lane.free_at);
            // Room on the output connection first, then the input chunk.
            if let Some(port) = step.send {
                let c = &mut conns[lane.outs[port.0 as usize] as usize];
                if c.inflight >= slots {
                    c.send_waiting = true;
                    break;
                }
            }
            let port = match step.input {
                Input::Recv(p) | Input::RecvReduce(p, _) => Some(p),
                Input::Src(_) | Input::Local2(..) => None,
            };
            if let Some(p) = port {
                let ci = lane.ins[p.0 as usize] as usize;
                let c = &mut conns[ci];
                match c.queue.front() {
                    None => {
                        c.recv_waiting = true;
                        break;
                    }
                    Some(&(arrive, _)) if arrive > now => {
                        heap.push(Reverse((arrive.to_bits(), l)));
                        break;
                    }
                    Some(_) => {
                        c.queue.pop_front();
                        c.inflight -= 1;
                        if c.send_waiting {
                            c.send_waiting = false;
                            for &w in &c.senders {
                                heap.push(Reverse((now.to_bits(), w)));
                            }
                        }
                    }
                }
            }
            if let Some(port) = step.send {
                let ci = lane.outs[port.0 as usize] as usize;
                let c = &mut conns[ci];
                if c.path == u32::MAX {
                    paths.push(links.path(
                        cluster,
                        c.from as usize,
                        c.to as usize,
                        c.rail as usize,
                        s.algo,
                        s.proto,
                    ));
                    c.path = paths.len() as u32 - 1;
                }
                let arrive = links.transfer(&paths[c.path as usize], now, wire(s.proto, step.len));
                c.queue.push_back((arrive, step.len as u32));
                c.inflight += 1;
                end = end.max(arrive);
                if c.recv_waiting {
                    c.recv_waiting = false;
                    for &w in &c.receivers {
                        heap.push(Reverse((arrive.to_bits(), w)));
                    }
                }
            }
            lane.free_at = now;
            end = end.max(now);
            lane.pending = None;
            steps += 1;
        }
    }
    if let Some(l) = lanes.iter().position(|l| l.pending.is_some()) {
        return Err(format!(
            "the simulation stalled: lane {l} still has a step it cannot run (a plan or capacity bug)"
        ));
    }
    let (bi, &bt) = links.busy.iter().enumerate().fold((0, &0.0), |a, b| if b.1 > a.1 { b } else { a });
    Ok(Outcome {
        time_us: end + cluster.base_us(s.algo, s.proto),
        steps,
        lanes: lanes.len(),
        busiest: (links.describe(bi), bt),
    })
}
