//! A cluster as the simulator sees it: nodes of GPUs joined by an intra-node fabric, NICs,
//! and a fat tree (or rail-optimised fat tree) of switch tiers; per link class a bandwidth and
//! a per-hop latency for each algorithm and protocol. Read from JSON (`fixtures/clusters/`),
//! where every number carries its unit in its name and the file lists its sources; the file's
//! serde type is `ClusterFile`, checked field by field into a [`Cluster`] (errors name the
//! field, or serde_json's line and column), and [`Cluster::to_json`] writes it back.
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

use crate::json;
use crate::tuner::{Algo, Proto};
use serde::{Deserialize, Serialize};

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

/// The file's shape (module docs); [`Cluster::parse`] checks it into a [`Cluster`].
#[derive(Serialize, Deserialize)]
struct ClusterFile {
    #[serde(default = "default_name")]
    name: String,
    #[serde(default)]
    sources: Vec<String>,
    /// Ranks per node (GPUs; for CPU clusters `ranks_per_node`).
    #[serde(alias = "ranks_per_node")]
    gpus_per_node: u64,
    /// Links per node to the network (NICs; for CPU clusters `rails`).
    #[serde(alias = "rails")]
    nics_per_node: u64,
    #[serde(default)]
    rail_optimized: bool,
    intra: LinkFile,
    net: LinkFile,
    base_us: BaseFile,
    #[serde(default)]
    tiers: Vec<TierFile>,
}

fn default_name() -> String {
    "cluster".into()
}

#[derive(Serialize, Deserialize)]
struct LinkFile {
    gbs: f64,
    ring_us: Vec<f64>,
    tree_us: Vec<f64>,
}

#[derive(Serialize, Deserialize)]
struct BaseFile {
    ring: Vec<f64>,
    tree: Vec<f64>,
}

#[derive(Serialize, Deserialize)]
struct TierFile {
    #[serde(default = "default_tier")]
    name: String,
    nodes: u64,
    switch_us: f64,
    #[serde(default = "one")]
    oversubscription: f64,
}

fn default_tier() -> String {
    "switch".into()
}

fn one() -> f64 {
    1.0
}

fn triple(a: &[f64], k: &str) -> Result<[f64; 3], String> {
    match a {
        &[x, y, z] if a.iter().all(|v| v.is_finite() && *v >= 0.0) => Ok([x, y, z]),
        [_, _, _] => Err(format!("cluster: \"{k}\" must be three non-negative numbers [LL, LL128, Simple]")),
        _ => Err(format!("cluster: \"{k}\" must be three numbers [LL, LL128, Simple]")),
    }
}

fn link(l: &LinkFile, k: &str) -> Result<LinkClass, String> {
    if l.gbs.is_nan() || l.gbs <= 0.0 {
        return Err(format!("cluster: {k}.gbs must be positive"));
    }
    Ok(LinkClass {
        gbs: l.gbs,
        ring_us: triple(&l.ring_us, &format!("{k}.ring_us"))?,
        tree_us: triple(&l.tree_us, &format!("{k}.tree_us"))?,
    })
}

fn link_file(l: &LinkClass) -> LinkFile {
    LinkFile { gbs: l.gbs, ring_us: l.ring_us.to_vec(), tree_us: l.tree_us.to_vec() }
}

impl Cluster {
    /// Parses a cluster file; errors name the field, or the place (line and column) where the
    /// text is not a cluster file.
    pub fn parse(text: &str) -> Result<Cluster, String> {
        let f: ClusterFile = json::parse(text).map_err(|e| format!("cluster: {e}"))?;
        let count = |k: &str, v: u64| -> Result<usize, String> {
            if !(1..=1_000_000).contains(&v) {
                return Err(format!("cluster: \"{k}\" must be a whole number from 1"));
            }
            Ok(v as usize)
        };
        let mut tiers = Vec::new();
        for (i, t) in f.tiers.into_iter().enumerate() {
            let nodes = usize::try_from(t.nodes).unwrap_or(usize::MAX);
            if nodes < 1 {
                return Err(format!("cluster: tiers[{i}].nodes must be a whole number from 1"));
            }
            if t.oversubscription.is_nan() || t.oversubscription < 1.0 {
                return Err(format!("cluster: tiers[{i}].oversubscription must be at least 1"));
            }
            if let Some(prev) = tiers.last().map(|p: &Tier| p.nodes) {
                if nodes % prev != 0 || nodes <= prev {
                    return Err(format!("cluster: tiers[{i}].nodes ({nodes}) must be a larger multiple of the tier below's ({prev})"));
                }
            }
            tiers.push(Tier {
                name: t.name,
                nodes,
                switch_us: t.switch_us,
                oversubscription: t.oversubscription,
            });
        }
        Ok(Cluster {
            name: f.name,
            sources: f.sources,
            gpus_per_node: count("gpus_per_node", f.gpus_per_node)?,
            nics_per_node: count("nics_per_node", f.nics_per_node)?,
            rail_optimized: f.rail_optimized,
            intra: link(&f.intra, "intra")?,
            net: link(&f.net, "net")?,
            base_ring_us: triple(&f.base_us.ring, "base_us.ring")?,
            base_tree_us: triple(&f.base_us.tree, "base_us.tree")?,
            tiers,
        })
    }

    /// The file format ([`Cluster::parse`] reads it back equal; numbers that are not finite
    /// are written `null`, which it refuses).
    pub fn to_json(&self) -> String {
        json::to_text(&ClusterFile {
            name: self.name.clone(),
            sources: self.sources.clone(),
            gpus_per_node: self.gpus_per_node as u64,
            nics_per_node: self.nics_per_node as u64,
            rail_optimized: self.rail_optimized,
            intra: link_file(&self.intra),
            net: link_file(&self.net),
            base_us: BaseFile { ring: self.base_ring_us.to_vec(), tree: self.base_tree_us.to_vec() },
            tiers: self
                .tiers
                .iter()
                .map(|t| TierFile {
                    name: t.name.clone(),
                    nodes: t.nodes as u64,
                    switch_us: t.switch_us,
                    oversubscription: t.oversubscription,
                })
                .collect(),
        }) + "\n"
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

    mod file_format {
        use super::*;
        use crate::json::testing::{place, place_end, positive, text};
        use proptest::prelude::*;

        fn us() -> impl Strategy<Value = f64> {
            prop_oneof![Just(0.0), positive()]
        }

        fn triple() -> impl Strategy<Value = [f64; 3]> {
            [us(), us(), us()]
        }

        fn class() -> impl Strategy<Value = LinkClass> {
            (positive(), triple(), triple()).prop_map(|(gbs, ring_us, tree_us)| LinkClass {
                gbs,
                ring_us,
                tree_us,
            })
        }

        fn tiers() -> impl Strategy<Value = Vec<Tier>> {
            let tier = (text(), 2usize..9, prop::num::f64::ANY, 1.0f64..64.0);
            (1usize..100, prop::collection::vec(tier, 0..4)).prop_map(|(first, tiers)| {
                let mut nodes = first;
                tiers
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, times, switch_us, oversubscription))| {
                        nodes *= if i == 0 { 1 } else { times };
                        let switch_us = if switch_us.is_finite() { switch_us } else { 0.0 };
                        Tier { name, nodes, switch_us, oversubscription }
                    })
                    .collect()
            })
        }

        prop_compose! {
            fn cluster()(
                name in text(), sources in prop::collection::vec(text(), 0..3),
                gpus_per_node in 1usize..=1_000_000, nics_per_node in 1usize..=1_000_000,
                rail_optimized in any::<bool>(), intra in class(), net in class(),
                base_ring_us in triple(), base_tree_us in triple(), tiers in tiers(),
            ) -> Cluster {
                Cluster {
                    name, sources, gpus_per_node, nics_per_node, rail_optimized, intra, net,
                    base_ring_us, base_tree_us, tiers,
                }
            }
        }

        proptest! {
            #[test]
            fn any_cluster_round_trips_exactly(c in cluster()) {
                prop_assert_eq!(Cluster::parse(&c.to_json()).unwrap(), c);
            }
        }

        #[test]
        fn the_fixtures_round_trip() {
            for f in ["summit", "summit-nccl-model", "dgx-h100-ib"] {
                let path = format!("{}/../../fixtures/clusters/{f}.json", env!("CARGO_MANIFEST_DIR"));
                let c = Cluster::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
                assert_eq!(Cluster::parse(&c.to_json()).unwrap(), c, "{f}");
            }
        }

        #[test]
        fn escapes_numbers_and_malformed_text() {
            let c =
                Cluster::parse(&TEXT.replace(r#""name": "t""#, r#""name": "\b\f\r\ud83d\ude00""#)).unwrap();
            assert_eq!(c.name, "\u{8}\u{c}\r😀");
            assert!(c.to_json().starts_with(r#"{"name":"\b\f\r😀","sources":["a"],"gpus_per_node":4,"#));
            let plus = TEXT.replace(r#""gpus_per_node": 4"#, r#""gpus_per_node": +4"#);
            let e = Cluster::parse(&plus).unwrap_err();
            assert_eq!(e, format!("cluster: expected value at {}", place(&plus, "+4")));
            // 2^64 does not fit a u64: serde_json reads it as a float, and says so.
            let big = TEXT.replace(r#""gpus_per_node": 4"#, r#""gpus_per_node": 18446744073709551616"#);
            assert_eq!(
                Cluster::parse(&big).unwrap_err(),
                format!(
                    "cluster: invalid type: floating point `1.8446744073709552e+19`, expected u64 at {}",
                    place_end(&big, "18446744073709551616")
                )
            );
            let null = TEXT.replace("\"gbs\": 25", "\"gbs\": null");
            assert_eq!(
                Cluster::parse(&null).unwrap_err(),
                format!("cluster: invalid type: null, expected f64 at {}", place_end(&null, "null"))
            );
            let mut inf = Cluster::parse(TEXT).unwrap();
            inf.net.gbs = f64::INFINITY;
            assert!(inf.to_json().contains(r#""net":{"gbs":null,"#));
            let cut = &TEXT[..TEXT.find("4, 14]").unwrap()];
            assert_eq!(
                Cluster::parse(cut).unwrap_err(),
                format!("cluster: EOF while parsing a value at {}", place_end(TEXT, "[2.7, "))
            );
            let colon = TEXT.replace(r#""net": {"#, r#""net"; {"#);
            assert_eq!(
                Cluster::parse(&colon).unwrap_err(),
                format!("cluster: expected `:` at {}", place(&colon, ";"))
            );
        }
    }
}
