//! A cluster as the simulator sees it: nodes of GPUs joined by an intra-node fabric, NICs,
//! and a fat tree (or rail-optimised fat tree) of switch tiers; per link class a bandwidth and
//! a per-hop latency for each algorithm and protocol. Read from JSON (`fixtures/clusters/`),
//! where every number carries its unit in its name and the file lists its sources.
//!
//! ```json
//! { "name": "…", "sources": ["…"],
//!   "gpus_per_node": 6, "nics_per_node": 2, "rail_optimized": false,
//!   "intra": { "gbs": 50, "ring_us": [0.47, 1.9, 3.4], "tree_us": [0.52, 1.25, 28] },
//!   "net":   { "gbs": 12.5, "ring_us": [2.7, 4.0, 14.0], "tree_us": [5.0, 8.5, 28] },
//!   "base_us": { "ring": [6.6, 14.0, 8.4], "tree": [6.8, 14.0, 0.0] },
//!   "tiers": [ { "name": "leaf", "nodes": 18, "switch_us": 0.09, "oversubscription": 1 }, … ] }
//! ```
//! Latencies are `[LL, LL128, Simple]`; `gbs` is GB/s per direction (intra: between two GPUs;
//! net: one NIC). `tiers[i].nodes` is how many nodes one switch group of tier i spans (the
//! last tier spans the cluster); a tier's uplink carries `nodes × NICs × net gbs /
//! oversubscription` (per rail when rail-optimised).

use crate::json::Json;
use crate::tuner::{Algo, Proto};

/// A link class: bandwidth and per-hop latency by algorithm and protocol.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkClass {
    /// GB/s per direction.
    pub gbs: f64,
    /// µs per hop, `[LL, LL128, Simple]`, for ring-like steps and for tree steps.
    pub ring_us: [f64; 3],
    pub tree_us: [f64; 3],
}

impl LinkClass {
    /// The hop latency of a step of `algo` in `proto`.
    pub fn hop_us(&self, algo: Algo, proto: Proto) -> f64 {
        let t = if algo == Algo::Tree { &self.tree_us } else { &self.ring_us };
        t[proto as usize]
    }
}

/// One tier of switches.
#[derive(Clone, Debug, PartialEq)]
pub struct Tier {
    pub name: String,
    /// Nodes below one switch group of this tier.
    pub nodes: usize,
    /// µs a message spends crossing one switch of this tier.
    pub switch_us: f64,
    /// Downlink to uplink bandwidth ratio (1: non-blocking).
    pub oversubscription: f64,
}

/// A cluster description.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub sources: Vec<String>,
    pub gpus_per_node: usize,
    pub nics_per_node: usize,
    /// Each NIC of a node on its own rail (leaf switches per rail).
    pub rail_optimized: bool,
    pub intra: LinkClass,
    pub net: LinkClass,
    /// Fixed cost of a call, µs, `[LL, LL128, Simple]`, by algorithm.
    pub base_ring_us: [f64; 3],
    pub base_tree_us: [f64; 3],
    pub tiers: Vec<Tier>,
}

fn num(j: &Json, k: &str) -> Result<f64, String> {
    j.get(k).and_then(Json::num).ok_or_else(|| format!("cluster: \"{k}\" must be a number"))
}

fn triple(j: &Json, k: &str) -> Result<[f64; 3], String> {
    let a = j.get(k).map(Json::arr).unwrap_or(&[]);
    match a {
        [x, y, z] => match (x.num(), y.num(), z.num()) {
            (Some(x), Some(y), Some(z)) if [x, y, z].iter().all(|v| v.is_finite() && *v >= 0.0) => {
                Ok([x, y, z])
            }
            _ => Err(format!("cluster: \"{k}\" must be three non-negative numbers [LL, LL128, Simple]")),
        },
        _ => Err(format!("cluster: \"{k}\" must be three numbers [LL, LL128, Simple]")),
    }
}

fn link(j: &Json, k: &str) -> Result<LinkClass, String> {
    let l = j.get(k).ok_or_else(|| format!("cluster: \"{k}\" is missing"))?;
    let gbs = num(l, "gbs")?;
    if gbs.is_nan() || gbs <= 0.0 {
        return Err(format!("cluster: {k}.gbs must be positive"));
    }
    Ok(LinkClass { gbs, ring_us: triple(l, "ring_us")?, tree_us: triple(l, "tree_us")? })
}

impl Cluster {
    /// Parses a cluster file; errors name the field.
    pub fn parse(text: &str) -> Result<Cluster, String> {
        let j = Json::parse(text).map_err(|e| format!("cluster: {e}"))?;
        let count = |k: &str| -> Result<usize, String> {
            let v = num(&j, k)?;
            if v < 1.0 || v.fract() != 0.0 || v > 1e6 {
                return Err(format!("cluster: \"{k}\" must be a whole number from 1"));
            }
            Ok(v as usize)
        };
        let base = j.get("base_us").ok_or("cluster: \"base_us\" is missing")?;
        let mut tiers = Vec::new();
        for (i, t) in j.get("tiers").map(Json::arr).unwrap_or(&[]).iter().enumerate() {
            let nodes = num(t, "nodes")?;
            if nodes < 1.0 || nodes.fract() != 0.0 {
                return Err(format!("cluster: tiers[{i}].nodes must be a whole number from 1"));
            }
            let over = t.get("oversubscription").and_then(Json::num).unwrap_or(1.0);
            if over.is_nan() || over < 1.0 {
                return Err(format!("cluster: tiers[{i}].oversubscription must be at least 1"));
            }
            if let Some(prev) = tiers.last().map(|p: &Tier| p.nodes) {
                if (nodes as usize) % prev != 0 || nodes as usize <= prev {
                    return Err(format!("cluster: tiers[{i}].nodes ({nodes}) must be a larger multiple of the tier below's ({prev})"));
                }
            }
            tiers.push(Tier {
                name: t.get("name").and_then(Json::str).unwrap_or("switch").to_string(),
                nodes: nodes as usize,
                switch_us: num(t, "switch_us")?,
                oversubscription: over,
            });
        }
        Ok(Cluster {
            name: j.get("name").and_then(Json::str).unwrap_or("cluster").to_string(),
            sources: j
                .get("sources")
                .map(Json::arr)
                .unwrap_or(&[])
                .iter()
                .filter_map(|s| s.str().map(String::from))
                .collect(),
            gpus_per_node: count("gpus_per_node")?,
            nics_per_node: count("nics_per_node")?,
            rail_optimized: j.get("rail_optimized").and_then(Json::bool).unwrap_or(false),
            intra: link(&j, "intra")?,
            net: link(&j, "net")?,
            base_ring_us: triple(base, "ring")?,
            base_tree_us: triple(base, "tree")?,
            tiers,
        })
    }

    /// This host as the simulator sees it, from the calibration probe's measurements (the
    /// tuner's `Model::cpu` reads the same): `ranks` CPU ranks ("GPUs") per host joined by
    /// shared memory (a chunk is copied into a slot and out again: half the copy bandwidth; a
    /// hop costs the core-to-core hand-off plus the engine's step), hosts by TCP (the
    /// loopback's latency and bandwidth), one NIC per host, one switch tier, no base latency.
    /// Every protocol costs the same here (the CPU engine's flagged formats cost encoding
    /// passes the simulator does not model).
    pub fn from_cpu(c: &crate::tuner::CpuCosts, ranks: usize, hosts: usize) -> Cluster {
        let hop = c.hop_us + crate::tuner::CPU_STEP_US;
        let net = c.tcp_us + crate::tuner::CPU_STEP_US;
        Cluster {
            name: format!(
                "this host ({} calibration): {ranks} CPU ranks per host, shared memory {:.2} GB/s {hop:.2} us per hop, TCP {:.2} GB/s {net:.2} us",
                if c.measured { "measured" } else { "built-in" },
                c.copy_gbs / 2.0,
                c.tcp_gbs
            ),
            sources: vec!["oxccl's calibration probe of this host (~/.cache/oxccl)".into()],
            gpus_per_node: ranks.max(1),
            nics_per_node: 1,
            rail_optimized: false,
            intra: LinkClass { gbs: (c.copy_gbs / 2.0).max(0.01), ring_us: [hop; 3], tree_us: [hop; 3] },
            net: LinkClass { gbs: c.tcp_gbs.max(0.01), ring_us: [net; 3], tree_us: [net; 3] },
            base_ring_us: [0.0; 3],
            base_tree_us: [0.0; 3],
            tiers: vec![Tier { name: "host network".into(), nodes: hosts.max(1), switch_us: 0.0, oversubscription: 1.0 }],
        }
    }

    /// The base cost of a call of `algo` in `proto`, µs.
    pub fn base_us(&self, algo: Algo, proto: Proto) -> f64 {
        let t = if algo == Algo::Tree { &self.base_tree_us } else { &self.base_ring_us };
        t[proto as usize]
    }

    /// Nodes `ranks` GPUs fill.
    pub fn nodes_for(&self, ranks: usize) -> usize {
        ranks.div_ceil(self.gpus_per_node)
    }

    /// The lowest tier whose switch group holds both nodes (`tiers.len()`: none does, so the
    /// path crosses the top of the fabric), or `None` for the same node.
    pub fn meeting_tier(&self, a: usize, b: usize) -> Option<usize> {
        if a == b {
            return None;
        }
        Some(self.tiers.iter().position(|t| a / t.nodes == b / t.nodes).unwrap_or(self.tiers.len()))
    }

    /// µs of switches crossed between nodes `a` and `b` (up to their meeting tier and down).
    pub fn switch_us(&self, a: usize, b: usize) -> f64 {
        match self.meeting_tier(a, b) {
            None => 0.0,
            Some(t) => {
                let below: f64 = self.tiers.iter().take(t).map(|x| 2.0 * x.switch_us).sum();
                below + self.tiers.get(t).map_or(0.0, |x| x.switch_us)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"{"name": "t", "sources": ["a"], "gpus_per_node": 4, "nics_per_node": 2,
      "intra": {"gbs": 100, "ring_us": [0.5, 1, 3], "tree_us": [0.5, 1, 28]},
      "net": {"gbs": 25, "ring_us": [2.7, 4, 14], "tree_us": [5, 8.5, 28]},
      "base_us": {"ring": [6.6, 14, 8.4], "tree": [6.8, 14, 0]},
      "tiers": [{"name": "leaf", "nodes": 16, "switch_us": 0.1},
                {"name": "spine", "nodes": 256, "switch_us": 0.2, "oversubscription": 2}]}"#;

    #[test]
    fn a_cluster_file_parses_and_routes_by_tier() {
        let c = Cluster::parse(TEXT).unwrap();
        assert_eq!((c.gpus_per_node, c.nics_per_node, c.tiers.len()), (4, 2, 2));
        assert_eq!(c.net.hop_us(Algo::Tree, Proto::LL), 5.0);
        assert_eq!(c.intra.hop_us(Algo::Ring, Proto::Simple), 3.0);
        assert_eq!(c.meeting_tier(3, 3), None);
        assert_eq!(c.meeting_tier(3, 15), Some(0));
        assert_eq!(c.meeting_tier(3, 16), Some(1));
        assert_eq!(c.meeting_tier(3, 300), Some(2));
        assert!((c.switch_us(3, 15) - 0.1).abs() < 1e-12);
        assert!((c.switch_us(3, 16) - 0.4).abs() < 1e-12);
        assert!((c.switch_us(3, 300) - 0.6).abs() < 1e-12);
        assert_eq!(c.nodes_for(17), 5);
    }

    #[test]
    fn bad_cluster_files_name_the_field() {
        let bad = TEXT.replace("\"gpus_per_node\": 4", "\"gpus_per_node\": 0");
        assert!(Cluster::parse(&bad).unwrap_err().contains("gpus_per_node"));
        let bad = TEXT.replace("\"nodes\": 256", "\"nodes\": 250");
        assert!(Cluster::parse(&bad).unwrap_err().contains("tiers[1].nodes"));
        let bad = TEXT.replace("[2.7, 4, 14]", "[2.7, 4]");
        assert!(Cluster::parse(&bad).unwrap_err().contains("ring_us"));
        let bad = TEXT.replace("\"gbs\": 25", "\"gbs\": 0");
        assert!(Cluster::parse(&bad).unwrap_err().contains("net.gbs"));
    }
}
