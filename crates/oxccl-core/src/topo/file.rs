//! The topology file format (the module docs of [`super`] show it): its serde types, and
//! [`Topo::parse`] / [`Topo::to_json`] between them and the graph.
//!
//! Rules: the file's shape is fixed by what [`Topo::to_json`] writes and the fixtures hold
//! (keys not known here, such as `"comment"`, are ignored); a reader's error says what and
//! where ([`crate::json`]); a NIC speed that is not finite is written `null` and read as none.

use super::{HostTopo, Link, LinkKind, Node, NodeKind, Topo};
use crate::json::{self, Mark};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct TopoFile {
    oxccl_topo: Mark<1>,
    #[serde(default)]
    hosts: Vec<HostFile>,
}

#[derive(Serialize, Deserialize)]
struct HostFile {
    #[serde(default = "default_host")]
    name: String,
    /// This many identical hosts, named `name-0`, `name-1`, ….
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repeat: Option<u64>,
    #[serde(default)]
    nodes: Vec<NodeFile>,
    #[serde(default)]
    links: Vec<LinkFile>,
}

fn default_host() -> String {
    "host".into()
}

#[derive(Serialize, Deserialize)]
struct NodeFile {
    id: String,
    #[serde(default)]
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    numa: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dev: Option<u32>,
    /// GPUs' name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cpus: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct LinkFile {
    a: String,
    b: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    gbs: Option<f64>,
    #[serde(default = "one")]
    count: u32,
}

fn one() -> u32 {
    1
}

/// The most hosts one `repeat` makes.
const MAX_REPEAT: u64 = 100_000;

fn bad(what: impl Into<String>) -> String {
    format!("topology file: {}", what.into())
}

fn node(n: NodeFile, host: &str, nodes: &[Node]) -> Result<Node, String> {
    let kind = NodeKind::parse(&n.kind).ok_or_else(|| {
        bad(format!("node {}: kind {:?} is not cpu, pci, gpu, nic or nvswitch", n.id, n.kind))
    })?;
    if nodes.iter().any(|x| x.id == n.id) {
        return Err(bad(format!("host {host}: node id {} appears twice", n.id)));
    }
    Ok(Node {
        id: n.id,
        kind,
        numa: n.numa,
        dev: n.dev,
        name: n.model.or(n.name).unwrap_or_default(),
        gbps: n.gbps.unwrap_or(0.0),
        cpus: n.cpus.unwrap_or_default(),
    })
}

fn link(l: LinkFile, host: &HostTopo) -> Result<Link, String> {
    let name = &host.name;
    let end = |id: &str| host.find(id).ok_or_else(|| bad(format!("host {name}: link to unknown node {id}")));
    let (a, b) = (end(&l.a)?, end(&l.b)?);
    let kind = LinkKind::parse(&l.kind)
        .ok_or_else(|| bad(format!("host {name}: link kind {:?} is not nvlink, pci or smp", l.kind)))?;
    let gbs = l.gbs.unwrap_or(0.0);
    if gbs <= 0.0 || !gbs.is_finite() {
        return Err(bad(format!("host {name}: link {}–{} has no bandwidth", l.a, l.b)));
    }
    Ok(Link { a, b, kind, gbs, count: l.count })
}

impl Topo {
    /// Reads the file format (module docs); the error says what was wrong and where.
    pub fn parse(text: &str) -> Result<Topo, String> {
        json::check_mark(text, "oxccl_topo", 1, "an oxccl topology").map_err(bad)?;
        let file: TopoFile = json::parse(text).map_err(bad)?;
        let mut hosts = Vec::new();
        for h in file.hosts {
            let mut nodes = Vec::new();
            for n in h.nodes {
                let n = node(n, &h.name, &nodes)?;
                nodes.push(n);
            }
            let mut host = HostTopo { name: h.name, nodes, links: Vec::new() };
            for l in h.links {
                let l = link(l, &host)?;
                host.links.push(l);
            }
            match h.repeat.unwrap_or(1) {
                1 => hosts.push(host),
                r @ 2..=MAX_REPEAT => hosts
                    .extend((0..r).map(|i| HostTopo { name: format!("{}-{i}", host.name), ..host.clone() })),
                r => {
                    return Err(bad(format!("host {}: repeat {r} out of range 1..={MAX_REPEAT}", host.name)))
                }
            }
        }
        if hosts.is_empty() {
            return Err(bad("no hosts"));
        }
        Ok(Topo { hosts })
    }

    /// The file format (each host written out; [`Topo::parse`] reads it back equal).
    pub fn to_json(&self) -> String {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let hosts = self
            .hosts
            .iter()
            .map(|h| HostFile {
                name: h.name.clone(),
                repeat: None,
                nodes: h
                    .nodes
                    .iter()
                    .map(|n| {
                        let gpu = n.kind == NodeKind::Gpu;
                        NodeFile {
                            id: n.id.clone(),
                            kind: n.kind.name().into(),
                            numa: n.numa,
                            dev: n.dev,
                            model: some(&n.name).filter(|_| gpu),
                            name: some(&n.name).filter(|_| !gpu),
                            gbps: (n.gbps > 0.0).then_some(n.gbps),
                            cpus: some(&n.cpus),
                        }
                    })
                    .collect(),
                links: h
                    .links
                    .iter()
                    .map(|l| LinkFile {
                        a: h.nodes[l.a].id.clone(),
                        b: h.nodes[l.b].id.clone(),
                        kind: l.kind.name().into(),
                        gbs: Some(l.gbs),
                        count: l.count,
                    })
                    .collect(),
            })
            .collect();
        json::to_text(&TopoFile { oxccl_topo: Mark, hosts }) + "\n"
    }
}
