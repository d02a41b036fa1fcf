//! The cost model that picks algorithm × protocol × channels for each call, and explains it.
//!
//! For a call of `n` bytes on `P` ranks over `N` hosts (`L = P / N` ranks per host), every
//! candidate is priced as
//!
//! ```text
//! time(µs) = base[algo][proto] + Σ hops · hop_latency[class][algo][proto]
//!          + n / (1000 · algbw(GB/s))
//! algbw    = busbw · ratio,   busbw = min(channels · per_channel, path limit) · efficiencies
//! ```
//!
//! - Ring: AllReduce takes `2(P−1)` steps (`2(N−1)` of them between hosts), ReduceScatter and
//!   AllGather `P−1` (`N−1`), Broadcast and Reduce a pipelined chain of `P−1` hops; `ratio` is
//!   `P / steps` for the first three and 1 for the chains.
//! - Tree (AllReduce only): a double binary tree over hosts with a chain inside each host:
//!   `2((L−1) intra hops + ⌈log2 N⌉ network hops)`; each tree carries half the data (`ratio`
//!   ½) at `tree_efficiency` of the ring's bus bandwidth (0.92 where the chain runs over NVLink,
//!   ⅔ on PCIe-only hosts, where the chain shares the PCIe links with the NIC).
//! - Direct (AllReduce, at most [`DIRECT_MAX_RANKS`] ranks): one exchange step; every rank
//!   moves `(P−1) · n`.
//! - Protocols: Simple moves bulk chunks (full bandwidth, the highest latency); LL carries 4
//!   bytes of data per 8-byte store (¼ of the bandwidth once flag checks are counted, the lowest
//!   latency); LL128 carries 120 of every 128 bytes (0.92), only on paths that keep 128-byte
//!   stores in order ([`Model::ll128`]).
//! - Channels: 1, 2, 4, … up to the communicator's maximum, each carrying at least one
//!   [`MIN_CHANNEL_BYTES`] chunk; the fewest channels among equal times.
//!
//! The per-path constants ([`PathCost`]) for NVLink, PCIe and the network are NCCL's
//! published tuning latencies; the CPU classes (shared memory, TCP) are measured at init by the
//! runtime (a bounded probe, cached per host). `NCCL_ALGO` / `NCCL_PROTO` ([`Enabled`]) and
//! `NCCL_MIN/MAX_NCHANNELS` restrict the candidates; a collective left with none is an error
//! that says why.

use crate::topo::graphs::{ring_bottleneck, ring_order};
use crate::topo::{PathType, Topo};
use std::fmt;

mod algo;
mod enabled;
pub use algo::{Algo, ALGOS};
pub use enabled::Enabled;

pub use crate::proto::{Proto, PROTOS};

pub use crate::coll::RingColl;

/// The most ranks a direct (one-step) call serves.
pub const DIRECT_MAX_RANKS: usize = 8;
/// The least data a channel is given (one chunk).
pub const MIN_CHANNEL_BYTES: usize = 64 << 10;

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one class of path costs: per-hop latency by algorithm (tree, ring/direct) and protocol,
/// what one channel moves, and what the path moves at most.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathCost {
    /// µs per hop: `[tree, ring][LL, LL128, Simple]`.
    pub hop_us: [[f64; 3]; 2],
    /// GB/s one channel moves.
    pub channel_gbs: f64,
    /// GB/s the path moves with every channel (per rank, each direction).
    pub limit_gbs: f64,
}

impl PathCost {
    /// NVLink (NCCL's published per-hop latencies).
    pub fn nvlink(limit_gbs: f64) -> PathCost {
        PathCost { hop_us: [[0.52, 1.2, 28.0], [0.47, 1.9, 3.4]], channel_gbs: 25.0, limit_gbs }
    }
    /// PCIe between GPUs.
    pub fn pci(limit_gbs: f64) -> PathCost {
        PathCost { hop_us: [[1.0, 1.9, 28.0], [1.0, 2.5, 5.7]], channel_gbs: 12.0, limit_gbs }
    }
    /// The network between hosts (InfiniBand/RoCE class).
    pub fn net(limit_gbs: f64) -> PathCost {
        PathCost { hop_us: [[5.0, 8.5, 50.0], [2.7, 4.0, 9.6]], channel_gbs: 12.5, limit_gbs }
    }

    pub fn hop(&self, a: Algo, p: Proto) -> f64 {
        self.hop_us[usize::from(a != Algo::Tree)][p as usize]
    }
}

/// Base latency of a call, µs: `[tree, ring, direct, hier][LL, LL128, Simple]`.
pub const BASE_US: [[f64; 3]; 4] = [[4.4, 4.4, 0.0], [3.6, 10.0, 8.4], [3.6, 10.0, 8.4], [3.6, 10.0, 8.4]];

/// Everything the model knows about a communicator.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub nranks: usize,
    pub nhosts: usize,
    /// Between ranks of one host (the ring's worst hop).
    pub intra: PathCost,
    /// What the intra-host class is called in explanations ("NVL", "PIX", "SHM", …).
    pub intra_name: String,
    /// Between hosts (per rank: the host's NIC bandwidth shared by its ranks).
    pub net: PathCost,
    pub base_us: [[f64; 3]; 4],
    /// Every host holds the same number of ranks (what [`Algo::Hier`] needs).
    pub hosts_uniform: bool,
    pub max_channels: usize,
    pub min_channels: usize,
    /// LL128 is safe on every path (ordered 128-byte stores).
    pub ll128: bool,
    /// Tree bus bandwidth relative to the ring's.
    pub tree_efficiency: f64,
    /// Bandwidth of each protocol (`[LL, LL128, Simple]`) relative to Simple's.
    pub proto_eff: [f64; 3],
    /// Algorithms and protocols the runtime can run at all (others are priced but never picked).
    pub runnable_algos: Vec<Algo>,
    pub runnable_protos: Vec<Proto>,
    /// Direct through shared memory (one host): its bandwidth, GB/s; `None`: Direct is the
    /// one-shot exchange over connections.
    pub direct_gbs: Option<f64>,
    /// The largest call Direct serves.
    pub direct_max_bytes: usize,
    /// What each message of an exchange between hosts costs the cores of the host it crosses,
    /// µs (the engine's step and the kernel's TCP work; 0 where not modeled): the one-shot of
    /// all `N` ranks puts `k(N − k)` messages through each host, the hierarchical one `H − 1`.
    pub msg_us: f64,
}

/// One priced candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub algo: Algo,
    pub proto: Proto,
    pub channels: usize,
    pub us: f64,
}

/// Why a call has no candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoCandidate(pub String);

impl fmt::Display for NoCandidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn log2_ceil(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }
}

impl Model {
    fn local(&self) -> usize {
        self.nranks.div_ceil(self.nhosts.max(1))
    }

    /// Why (algo, proto) cannot run `c` here, if it cannot.
    pub fn unavailable(&self, c: RingColl, a: Algo, p: Proto) -> Option<String> {
        if !a.runs(c) {
            return Some(match a {
                Algo::Hier => format!("{a} runs only all-reduce, all-gather and reduce-scatter"),
                _ => format!("{a} runs only all-reduce"),
            });
        }
        if a == Algo::Hier && (self.nhosts < 2 || !self.hosts_uniform || self.local() < 2) {
            return Some(
                "Hier needs several hosts with the same number (at least 2) of ranks on each".into(),
            );
        }
        if a == Algo::Direct && self.direct_gbs.is_none() && self.nranks > DIRECT_MAX_RANKS {
            return Some(format!("Direct serves at most {DIRECT_MAX_RANKS} ranks"));
        }
        if a == Algo::Direct && p != Proto::Simple && self.direct_gbs.is_some() {
            return Some("the direct path copies between ranks' buffers without connection slots: no protocol applies (listed as Simple)".into());
        }
        if a == Algo::Tree && self.nranks < 3 {
            return Some("Tree needs at least 3 ranks (on 2 it is the ring)".into());
        }
        if p == Proto::LL128 && !self.ll128 {
            return Some("LL128 needs paths that keep 128-byte stores in order".into());
        }
        if !self.runnable_algos.contains(&a) {
            return Some(format!("{a} is not implemented on this communicator's devices yet"));
        }
        if !self.runnable_protos.contains(&p) {
            return Some(format!("{p} is not implemented on this communicator's devices yet"));
        }
        None
    }

    /// The predicted time of one candidate, µs (`None` where it cannot run).
    pub fn estimate(&self, c: RingColl, bytes: usize, a: Algo, p: Proto, channels: usize) -> Option<f64> {
        if self.unavailable(c, a, p).is_some() || self.nranks < 2 {
            return None;
        }
        let (pr, nh, l) = (self.nranks as f64, self.nhosts.max(1), self.local() as f64);
        let multi = nh > 1;
        let proto_eff = self.proto_eff[p as usize];
        let ch = channels.max(1) as f64;
        let intra_bw = (ch * self.intra.channel_gbs).min(self.intra.limit_gbs);
        let bus =
            if multi { intra_bw.min((ch * self.net.channel_gbs).min(self.net.limit_gbs)) } else { intra_bw };
        let bus = bus * proto_eff;
        // A hop inside a host pays more with LL when the ranks also drive the network.
        let intra_hop = self.intra.hop(a, p) * if multi && p == Proto::LL { 1.8 } else { 1.0 };
        let net_hop = self.net.hop(a, p);
        let base = self.base_us[a as usize][p as usize];
        let n = bytes as f64;
        let (lat, algbw) = match a {
            Algo::Ring => {
                let (steps, inter, ratio) = match c {
                    RingColl::AllReduce => {
                        (2.0 * (pr - 1.0), 2.0 * (nh as f64 - 1.0), pr / (2.0 * (pr - 1.0)))
                    }
                    RingColl::AllGather | RingColl::ReduceScatter => {
                        (pr - 1.0, nh as f64 - 1.0, pr / (pr - 1.0))
                    }
                    RingColl::Broadcast | RingColl::Reduce => (pr - 1.0, nh as f64 - 1.0, 1.0),
                };
                (base + (steps - inter) * intra_hop + inter * net_hop, bus * ratio)
            }
            Algo::Hier => {
                // Inside the host, then between hosts with the host's `l` ranks sending at
                // once (their streams share the NIC), then inside again. All-reduce runs in
                // pieces (`plan/hier.rs`), the host's phases of one piece beside the network's
                // of another: the slower part sets the pace, the faster shows for one piece.
                // All-gather and reduce-scatter run their two parts one after the other.
                let h = nh as f64;
                let twice = if c == RingColl::AllReduce { 2.0 } else { 1.0 };
                let nic = (l * ch * self.net.channel_gbs).min(self.net.limit_gbs) * proto_eff;
                let lat = base + twice * ((l - 1.0) * intra_hop + (h - 1.0) * net_hop);
                let inside = twice * n * (l - 1.0) / l / (1000.0 * intra_bw * proto_eff);
                let between = twice * n * (h - 1.0) / h / (1000.0 * nic);
                let t = if c == RingColl::AllReduce {
                    let pieces =
                        (bytes / crate::tuning::HIER_PIECE_BYTES).clamp(1, crate::tuning::HIER_MAX_PIECES);
                    inside.max(between) + inside.min(between) / pieces as f64
                } else {
                    inside + between
                };
                let small = self.hier_small_estimate(c, bytes, p, channels).unwrap_or(f64::INFINITY);
                return Some(small.min(lat + t));
            }
            Algo::Tree => {
                let lat = base + 2.0 * ((l - 1.0) * intra_hop + log2_ceil(nh) as f64 * net_hop);
                (lat, bus * self.tree_efficiency * 0.5)
            }
            Algo::Direct => {
                if bytes > self.direct_max_bytes {
                    return None;
                }
                match self.direct_gbs {
                    Some(gbs) => (base, gbs),
                    None => {
                        let hop = if multi { net_hop } else { intra_hop };
                        let msgs = if multi { l * (pr - l) * self.msg_us } else { 0.0 };
                        (base + hop + msgs, bus / (pr - 1.0))
                    }
                }
            }
        };
        Some(lat + n / (1000.0 * algbw))
    }

    /// The predicted time of a small hierarchical all-reduce (`hier::all_reduce_small`), µs:
    /// along the host ring to its first rank, one exchange among the hosts' first ranks (each
    /// sends the whole buffer to every other: `H − 1` copies through its NIC), back along the
    /// ring. `None` where it does not apply (not an all-reduce, or larger than one exchange).
    pub fn hier_small_estimate(&self, c: RingColl, bytes: usize, p: Proto, channels: usize) -> Option<f64> {
        let nh = self.nhosts.max(1);
        if c != RingColl::AllReduce
            || bytes > self.direct_max_bytes
            || nh > DIRECT_MAX_RANKS
            || self.unavailable(c, Algo::Hier, p).is_some()
        {
            return None;
        }
        let (h, l, n) = (nh as f64, self.local() as f64, bytes as f64);
        let ch = channels.max(1) as f64;
        let proto_eff = self.proto_eff[p as usize];
        let intra_bw = (ch * self.intra.channel_gbs).min(self.intra.limit_gbs);
        let nic = (ch * self.net.channel_gbs).min(self.net.limit_gbs) * proto_eff;
        let intra_hop = self.intra.hop(Algo::Hier, p) * if p == Proto::LL { 1.8 } else { 1.0 };
        Some(
            self.base_us[Algo::Hier as usize][p as usize]
                + 2.0 * (l - 1.0) * intra_hop
                + self.net.hop(Algo::Hier, p)
                + (h - 1.0) * self.msg_us
                + 2.0 * n * (l - 1.0) / (1000.0 * intra_bw * proto_eff)
                + n * (h - 1.0) / (1000.0 * nic),
        )
    }

    fn channel_options(&self, bytes: usize) -> impl Iterator<Item = usize> + '_ {
        let lo = self.min_channels.max(1);
        let hi = self.max_channels.max(lo);
        let by_size = (bytes / MIN_CHANNEL_BYTES).max(1);
        std::iter::successors(Some(lo), |&c| Some(c * 2))
            .take_while(move |&c| c <= hi)
            .filter(move |&c| c == lo || c <= by_size)
    }

    /// Every candidate for one call: the best channel count of each (algo, proto), runnable or
    /// not (`us` infinite where it cannot run).
    pub fn candidates(&self, c: RingColl, bytes: usize) -> Vec<Estimate> {
        let mut out = Vec::new();
        for a in ALGOS {
            if !a.runs(c) {
                continue;
            }
            for p in PROTOS {
                let best = self
                    .channel_options(bytes)
                    .filter_map(|ch| self.estimate(c, bytes, a, p, ch).map(|us| (ch, us)))
                    .fold(None, |acc: Option<(usize, f64)>, (ch, us)| match acc {
                        Some((_, b)) if b <= us * (1.0 + 1e-9) => acc,
                        _ => Some((ch, us)),
                    });
                let (channels, us) = best.unwrap_or((0, f64::INFINITY));
                out.push(Estimate { algo: a, proto: p, channels, us });
            }
        }
        out
    }

    /// The cheapest candidate that `en` allows, or why there is none.
    pub fn choose(&self, c: RingColl, bytes: usize, en: &Enabled) -> Result<Estimate, NoCandidate> {
        let cands = self.candidates(c, bytes);
        let best = cands
            .iter()
            .filter(|e| e.us.is_finite() && en.allows(c, e.algo, e.proto))
            .min_by(|x, y| x.us.partial_cmp(&y.us).unwrap_or(std::cmp::Ordering::Equal));
        if let Some(b) = best {
            return Ok(*b);
        }
        let mut why = Vec::new();
        for a in ALGOS {
            for p in PROTOS {
                if en.allows(c, a, p) {
                    let r = self.unavailable(c, a, p).unwrap_or_else(|| "cannot run".into());
                    why.push(format!("{a}/{p}: {r}"));
                }
            }
        }
        let env = en.describe();
        Err(NoCandidate(if why.is_empty() {
            format!("{env} enables no algorithm × protocol for {c}")
        } else {
            format!("{env} leaves {c} nothing that can run here: {}", why.join("; "))
        }))
    }

    /// The explain table: for each size, every candidate and the choice.
    pub fn explain(
        &self,
        c: RingColl,
        sizes: &[usize],
        en: &Enabled,
    ) -> Vec<(usize, Vec<Estimate>, Result<Estimate, NoCandidate>)> {
        sizes.iter().map(|&b| (b, self.candidates(c, b), self.choose(c, b, en))).collect()
    }

    /// The table as text: one row per size, one column per (algo, proto), µs.
    pub fn explain_text(&self, c: RingColl, sizes: &[usize], en: &Enabled) -> String {
        let rows = self.explain(c, sizes, en);
        let mut out = format!(
            "# {c} on {} ranks, {} host(s), {} per host; intra-host path {}; channels {}..{}\n",
            self.nranks,
            self.nhosts,
            self.local(),
            self.intra_name,
            self.min_channels,
            self.max_channels
        );
        out.push_str("# predicted µs per candidate (best channel count in brackets); '-' cannot run here\n");
        let heads: Vec<String> = rows
            .first()
            .map(|r| r.1.iter().map(|e| format!("{}/{}", e.algo, e.proto)).collect())
            .unwrap_or_default();
        out.push_str(&format!("{:>12}", "bytes"));
        for h in &heads {
            out.push_str(&format!(" {h:>16}"));
        }
        out.push_str("   choice\n");
        for (b, cands, choice) in rows {
            out.push_str(&format!("{b:>12}"));
            for e in &cands {
                if e.us.is_finite() {
                    out.push_str(&format!(" {:>11.1} [{:>2}]", e.us, e.channels));
                } else {
                    out.push_str(&format!(" {:>16}", "-"));
                }
            }
            match choice {
                Ok(e) => {
                    out.push_str(&format!("   {}/{} × {} ch, {:.1} µs\n", e.algo, e.proto, e.channels, e.us))
                }
                Err(e) => out.push_str(&format!("   none: {e}\n")),
            }
        }
        out
    }
}

impl Model {
    /// The model of `nranks` GPUs of a topology (one rank per GPU, hosts filled in order).
    pub fn from_topo(t: &Topo, nranks: usize) -> Result<Model, String> {
        let h0 = &t.hosts[0];
        let per_host = h0.gpus().len();
        if per_host == 0 {
            return Err("the topology has no GPUs (CPU communicators are priced from measured costs)".into());
        }
        let total = t.gpus().len();
        if nranks < 1 || nranks > total {
            return Err(format!("--ranks {nranks}: the topology has {total} GPUs"));
        }
        let local = nranks.min(per_host);
        let nhosts = nranks.div_ceil(local);
        let mut order = ring_order(h0);
        order.truncate(local);
        let (kind, gbs) = if local > 1 { ring_bottleneck(h0, &order) } else { (PathType::Loc, 0.0) };
        let nvl = kind <= PathType::Nvl && local > 1;
        let intra = if nvl {
            PathCost::nvlink(gbs)
        } else {
            PathCost::pci(if gbs.is_finite() && gbs > 0.0 { gbs } else { 24.0 })
        };
        let nic_paths_ok = order
            .iter()
            .all(|&g| h0.nearest_nic(g).and_then(|n| h0.path(g, n)).is_some_and(|p| p.kind <= PathType::Pxb));
        Ok(Model {
            nranks,
            nhosts,
            intra,
            intra_name: if local > 1 { kind.name().to_string() } else { "none".into() },
            net: PathCost::net(h0.net_gbs() / local as f64),
            base_us: BASE_US,
            hosts_uniform: nranks % local == 0,
            msg_us: 0.0,
            max_channels: 32,
            min_channels: 1,
            ll128: (nvl || local == 1) && (nhosts == 1 || nic_paths_ok),
            tree_efficiency: if nvl { 0.92 } else { 2.0 / 3.0 },
            // NCCL's: LL carries 4 of 8 bytes at about half the rate, LL128 120 of 128.
            proto_eff: [0.25, 0.92, 1.0],
            // The device path runs no hierarchical plan yet.
            runnable_algos: vec![Algo::Tree, Algo::Ring, Algo::Direct],
            runnable_protos: PROTOS.to_vec(),
            direct_gbs: None,
            direct_max_bytes: usize::MAX,
        })
    }
}

/// What the calibration probe measured on a host (or the built-in values). Its serde form is
/// the calibration cache file (`oxccl::calib`): these field names, `measured` optional.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CpuCosts {
    /// Single-thread copy bandwidth, GB/s.
    pub copy_gbs: f64,
    /// One-way hand-off latency between two cores, µs.
    pub hop_us: f64,
    /// TCP loopback one-way latency, µs, and bandwidth, GB/s.
    pub tcp_us: f64,
    pub tcp_gbs: f64,
    /// Single-thread throughput of writing and then reading one LL / LL128 chunk in its
    /// flagged format (the protocols' own cost on top of the copies), GB/s.
    pub ll_gbs: f64,
    pub ll128_gbs: f64,
    /// Whether these were measured here (false: built-in values).
    #[serde(default)]
    pub measured: bool,
}

impl Default for CpuCosts {
    fn default() -> Self {
        CpuCosts {
            copy_gbs: 5.0,
            hop_us: 0.5,
            tcp_us: 15.0,
            tcp_gbs: 2.0,
            ll_gbs: 1.0,
            ll128_gbs: 4.0,
            measured: false,
        }
    }
}

/// Fixed costs of the CPU engine around the measured ones, µs: a ring or tree step (slot
/// bookkeeping, a doorbell when the peer sleeps), and a call through the direct path (post,
/// the peers' posts, the end barrier).
pub const CPU_STEP_US: f64 = 1.5;
pub const CPU_DIRECT_US: f64 = 1.0;

impl Model {
    /// The model of a CPU communicator of `nranks` over `nhosts`, from measured costs.
    /// `direct_path`: all ranks share one host and the direct path is on; it then serves
    /// every size (Direct), at the copy bandwidth.
    pub fn cpu(
        nranks: usize,
        nhosts: usize,
        c: &CpuCosts,
        direct_path: bool,
        min_channels: usize,
        max_channels: usize,
    ) -> Model {
        // A chunk through a shared-memory slot is copied in and out: half the copy bandwidth.
        // LL and LL128 chunks are also staged and encoded, then decoded: one more pass at the
        // measured rate of the format.
        let shm_gbs = (c.copy_gbs / 2.0).max(0.01);
        let flagged = |gbs: f64| (1.0 / (2.0 / c.copy_gbs.max(0.01) + 1.0 / gbs.max(0.01))) / shm_gbs;
        let hop = c.hop_us + CPU_STEP_US;
        let shm = PathCost { hop_us: [[hop; 3], [hop; 3]], channel_gbs: shm_gbs, limit_gbs: shm_gbs };
        let net_hop = c.tcp_us + CPU_STEP_US;
        let net = PathCost {
            hop_us: [[net_hop; 3], [net_hop; 3]],
            channel_gbs: c.tcp_gbs.max(0.01),
            limit_gbs: (c.tcp_gbs * 1.5).max(0.01),
        };
        let mut base = [[0.0; 3]; 4];
        base[Algo::Direct as usize] = [CPU_DIRECT_US + 2.0 * c.hop_us; 3];
        Model {
            nranks,
            nhosts,
            intra: shm,
            intra_name: "SHM".into(),
            net,
            base_us: base,
            // A guess from the counts; the runtime sets what its hosts hold.
            hosts_uniform: nranks % nhosts.max(1) == 0,
            msg_us: CPU_STEP_US,
            max_channels: max_channels.max(1),
            min_channels: min_channels.max(1),
            // Shared-memory LL128 lines publish their flag word with a release store, so a line
            // is read whole on any CPU; TCP frames arrive whole.
            ll128: true,
            tree_efficiency: 0.92,
            proto_eff: [flagged(c.ll_gbs).min(1.0), flagged(c.ll128_gbs).min(1.0), 1.0],
            runnable_algos: ALGOS.to_vec(),
            runnable_protos: PROTOS.to_vec(),
            direct_gbs: direct_path.then_some((c.copy_gbs / 2.0).max(0.01)),
            direct_max_bytes: if direct_path {
                usize::MAX
            } else {
                crate::tuning::one_shot_max_bytes(nhosts > 1)
            },
        }
    }

    /// This model with each host's link to the others at `gbs` per rail (GB/s) over `rails`
    /// rails: one TCP stream carries at most a rail's rate, a host at most all its rails'
    /// (each no more than this host's TCP measured). `gbs` not positive: unchanged.
    pub fn with_link(mut self, gbs: f64, rails: usize) -> Model {
        if gbs > 0.0 && gbs.is_finite() {
            self.net.channel_gbs = self.net.channel_gbs.min(gbs);
            self.net.limit_gbs = self.net.limit_gbs.min(gbs * rails.max(1) as f64);
        }
        self
    }

    /// This model for a communicator whose ranks all talk over sockets, those of one host
    /// included (`NCCL_SHM_DISABLE=1`): a hop inside a host costs what one between hosts does,
    /// and the one-shot exchange serves calls up to the sockets' bound.
    pub fn over_sockets(mut self) -> Model {
        self.intra = self.net;
        self.intra_name = "TCP".into();
        if self.direct_gbs.is_none() {
            self.direct_max_bytes = crate::tuning::one_shot_max_bytes(true);
        }
        self
    }
}

/// What a communicator's calls may run, decided once at init, evaluated alike on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    /// All-reduce: (upper size bound in bytes, algorithm), ascending; the first bound ≥ the
    /// call's size applies. Empty: the built-in rules (the direct path or one-shot for small
    /// calls, else the ring).
    pub all_reduce: Vec<(usize, Algo)>,
    /// Per collective ([`RingColl`] order): whether the direct path may serve it.
    pub direct: [bool; 5],
    /// Per collective: whether it runs hierarchically where the hosts allow
    /// ([`crate::plan::hier`]; all-reduce by `all_reduce`'s size rules instead).
    pub hier: [bool; 5],
    /// All-reduce run hierarchically: the largest call (bytes) the small plan serves (the
    /// hosts' first ranks in one exchange, `hier::all_reduce_small`), where it applies at
    /// all; 0: never.
    pub hier_small_max: usize,
    /// Per collective: why it cannot run under the settings, if it cannot.
    pub refuse: [Option<String>; 5],
    /// Per collective: (upper size bound in bytes, protocol), ascending, for its connection
    /// chunks (empty: Simple).
    pub protos: [Vec<(usize, Proto)>; 5],
}

impl Selector {
    /// One algorithm for every all-reduce.
    pub fn always(a: Algo) -> Selector {
        Selector {
            all_reduce: vec![(usize::MAX, a)],
            direct: [a == Algo::Direct; 5],
            hier: [a == Algo::Hier; 5],
            hier_small_max: usize::MAX,
            refuse: Default::default(),
            protos: Default::default(),
        }
    }

    /// The protocol of collective `c`'s chunks in a call of `bytes`.
    pub fn proto_for(&self, c: RingColl, bytes: usize) -> Proto {
        let r = &self.protos[c as usize];
        r.iter().find(|(b, _)| bytes <= *b).or(r.last()).map_or(Proto::Simple, |x| x.1)
    }

    /// The all-reduce algorithm for a call of `bytes` (`None`: the built-in rules).
    pub fn all_reduce_algo(&self, bytes: usize) -> Option<Algo> {
        self.all_reduce.iter().find(|(b, _)| bytes <= *b).or(self.all_reduce.last()).map(|x| x.1)
    }

    /// The selector the model picks for a CPU communicator, within what `NCCL_ALGO` /
    /// `NCCL_PROTO` allow: per size (powers of two), the cheapest all-reduce algorithm.
    pub fn tuned(m: &Model, en: &Enabled, small_bytes: usize) -> Selector {
        let mut sel = Selector::forced(en, m.nranks, small_bytes).unwrap_or(Selector {
            all_reduce: Vec::new(),
            direct: [true; 5],
            hier: [false; 5],
            hier_small_max: usize::MAX,
            refuse: Default::default(),
            protos: Default::default(),
        });
        fn push<T: PartialEq>(rules: &mut Vec<(usize, T)>, b: usize, t: T) {
            match rules.last_mut() {
                Some(last) if last.1 == t => last.0 = b,
                _ => rules.push((b, t)),
            }
        }
        fn close<T>(mut rules: Vec<(usize, T)>) -> Vec<(usize, T)> {
            if let Some(last) = rules.last_mut() {
                last.0 = usize::MAX;
            }
            rules
        }
        for c in RingColl::ALL {
            if sel.refuse[c as usize].is_some() {
                continue;
            }
            let (mut algos, mut protos) = (Vec::new(), Vec::new());
            let mut ok = true;
            // Hier's small plan: the sizes from the smallest up for which it is the cheapest
            // way to run Hier (it grows with the hosts, so the run ends at the first that is not).
            let (mut small_to, mut small_run) = (0, true);
            for b in explain_sizes() {
                // The protocol of the chunks: the best candidate that travels over connections.
                let over_conns = m
                    .candidates(c, b)
                    .into_iter()
                    .filter(|e| e.algo != Algo::Direct && e.us.is_finite() && en.allows(c, e.algo, e.proto))
                    .min_by(|x, y| x.us.total_cmp(&y.us));
                if let Some(e) = over_conns {
                    push(&mut protos, b, e.proto);
                }
                if c == RingColl::AllReduce {
                    match m.choose(c, b, en) {
                        Ok(e) => {
                            push(&mut algos, b, e.algo);
                            // Hier's estimate is already the cheaper of its two plans.
                            small_run &= e.algo == Algo::Hier
                                && m.hier_small_estimate(c, b, e.proto, e.channels).is_some_and(|s| {
                                    Some(s) <= m.estimate(c, b, Algo::Hier, e.proto, e.channels)
                                });
                            if small_run {
                                small_to = b;
                            }
                        }
                        Err(_) => ok = false,
                    }
                }
            }
            sel.protos[c as usize] = close(protos);
            // All-gather and reduce-scatter: hierarchical where the model prices it below the
            // ring at 1 MiB (both scale alike; where Hier can run, it wins at every size).
            if c != RingColl::AllReduce {
                let b = 1 << 20;
                sel.hier[c as usize] = m.choose(c, b, en).is_ok_and(|e| e.algo == Algo::Hier);
            }
            if c == RingColl::AllReduce && ok {
                sel.all_reduce = close(algos);
                sel.hier_small_max = small_to;
            }
        }
        sel
    }

    /// The selector `NCCL_ALGO` / `NCCL_PROTO` impose on a CPU communicator of `nranks`
    /// (`None` when neither is set). Of the enabled protocols, Simple is taken if enabled,
    /// else LL128, else LL (the tuner refines this by size); Tree needs 3 ranks; Direct
    /// (one-shot) serves at most [`DIRECT_MAX_RANKS`].
    pub fn forced(en: &Enabled, nranks: usize, small_bytes: usize) -> Option<Selector> {
        if en.algo_env.is_none() && en.proto_env.is_none() {
            return None;
        }
        let env = en.describe();
        let mut sel = Selector {
            all_reduce: Vec::new(),
            direct: [true; 5],
            hier: [false; 5],
            hier_small_max: usize::MAX,
            refuse: Default::default(),
            protos: Default::default(),
        };
        let mut ar = Vec::new();
        for c in RingColl::ALL {
            let ci = c as usize;
            sel.direct[ci] = en.algo[ci][Algo::Direct as usize];
            sel.hier[ci] = en.algo[ci][Algo::Hier as usize] && Algo::Hier.runs(c);
            let Some(p) =
                [Proto::Simple, Proto::LL128, Proto::LL].into_iter().find(|p| en.proto[ci][*p as usize])
            else {
                sel.refuse[ci] = Some(format!("{env} enables no protocol for {c}"));
                continue;
            };
            sel.protos[ci] = vec![(usize::MAX, p)];
            let mut why = Vec::new();
            let mut ok = Vec::new();
            for a in ALGOS {
                if !en.algo[ci][a as usize] {
                    continue;
                }
                let r = if !a.runs(c) && a != Algo::Direct {
                    Some(match a {
                        Algo::Hier => format!("{a} runs only all-reduce, all-gather and reduce-scatter"),
                        _ => format!("{a} runs only all-reduce"),
                    })
                } else if a == Algo::Tree && nranks < 3 {
                    Some("Tree needs at least 3 ranks".to_string())
                } else if a == Algo::Direct && c == RingColl::AllReduce && nranks > DIRECT_MAX_RANKS {
                    Some(format!("Direct serves at most {DIRECT_MAX_RANKS} ranks"))
                } else {
                    None
                };
                match r {
                    Some(r) => why.push(r),
                    None => ok.push(a),
                }
            }
            // Other collectives run on the ring or the direct path, all-gather and
            // reduce-scatter also hierarchically (the ring where the hosts do not allow it).
            if c != RingColl::AllReduce && (ok.contains(&Algo::Ring) || ok.contains(&Algo::Hier)) {
                continue;
            }
            if c != RingColl::AllReduce && ok == [Algo::Direct] {
                sel.refuse[ci] =
                    Some(format!("{env}: {c} needs Ring (Direct alone cannot serve every size of it)"));
                continue;
            }
            if ok.is_empty() {
                sel.refuse[ci] = Some(if why.is_empty() {
                    format!("{env} enables no algorithm for {c}")
                } else {
                    format!("{env} leaves {c} nothing that can run: {}", why.join("; "))
                });
                continue;
            }
            if c == RingColl::AllReduce {
                ar = ok;
            }
        }
        let has = |a| ar.contains(&a);
        // The algorithm for large calls: Hier where enabled (the ring where the hosts do not
        // allow it), else Ring, else Tree; Direct (one-shot) below `small_bytes` if enabled.
        let big = [Algo::Hier, Algo::Ring, Algo::Tree].into_iter().find(|&a| has(a));
        sel.all_reduce = match (big, has(Algo::Direct)) {
            (Some(Algo::Ring), true) => Vec::new(),
            (Some(a), true) => vec![(small_bytes, Algo::Direct), (usize::MAX, a)],
            (Some(a), false) => vec![(usize::MAX, a)],
            (None, true) => vec![(usize::MAX, Algo::Direct)],
            (None, false) => Vec::new(),
        };
        Some(sel)
    }
}

/// The sizes `oxccl explain` prices: 8 B to 4 GiB by factors of 2.
pub fn explain_sizes() -> Vec<usize> {
    (3..=32).map(|s| 1usize << s).collect()
}

#[cfg(test)]
mod tests;
