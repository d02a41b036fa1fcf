//! The machine as one graph: hosts, and in each host its CPUs (NUMA nodes), PCIe switches,
//! GPUs, NICs and NVSwitches, joined by links with a bandwidth; and the path between every
//! pair of devices, classified with NCCL's path types ([`PathType`]).
//!
//! A [`Topo`] comes from discovery (the runtime's `oxccl::topo`, which reads sysfs and NVML) or
//! from a file ([`Topo::parse`], `NCCL_TOPO_FILE`); [`Topo::to_json`] writes the file format
//! back (`NCCL_TOPO_DUMP_FILE`). The format is JSON (its serde types: `file.rs`):
//!
//! ```text
//! {"oxccl_topo": 1,
//!  "hosts": [{"name": "dgx", "repeat": 16,            // optional: 16 identical hosts dgx-0..15
//!             "nodes": [{"id": "cpu0", "kind": "cpu", "numa": 0, "cpus": "0-55"},
//!                       {"id": "gpu0", "kind": "gpu", "dev": 0, "model": "H100", "numa": 0},
//!                       {"id": "nic0", "kind": "nic", "name": "mlx5_0", "gbps": 400, "numa": 0},
//!                       {"id": "sw0", "kind": "pci"}, {"id": "nvs", "kind": "nvswitch"}],
//!             "links": [{"a": "gpu0", "b": "nvs", "kind": "nvlink", "gbs": 450, "count": 18},
//!                       {"a": "gpu0", "b": "sw0", "kind": "pci", "gbs": 64},
//!                       {"a": "cpu0", "b": "cpu1", "kind": "smp", "gbs": 40}]}]}
//! ```
//!
//! Bandwidths (`gbs`) are GB/s in each direction; NIC speeds (`gbps`) Gbit/s as the NIC reports.

mod file;
pub mod graphs;

use std::fmt;

/// The kind of a vertex of a host's graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeKind {
    /// A CPU socket / NUMA node (its host bridge).
    Cpu,
    /// A PCIe switch (or bridge).
    Pci,
    Gpu,
    Nic,
    /// An NVSwitch (or several acting as one crossbar).
    NvSwitch,
}

impl NodeKind {
    fn name(self) -> &'static str {
        match self {
            NodeKind::Cpu => "cpu",
            NodeKind::Pci => "pci",
            NodeKind::Gpu => "gpu",
            NodeKind::Nic => "nic",
            NodeKind::NvSwitch => "nvswitch",
        }
    }

    fn parse(s: &str) -> Option<NodeKind> {
        [NodeKind::Cpu, NodeKind::Pci, NodeKind::Gpu, NodeKind::Nic, NodeKind::NvSwitch]
            .into_iter()
            .find(|k| k.name() == s)
    }
}

/// One vertex.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub id: String,
    pub kind: NodeKind,
    /// NUMA node (CPUs: their own; devices: the one their PCIe root belongs to).
    pub numa: Option<u32>,
    /// GPUs: the device index.
    pub dev: Option<u32>,
    /// GPUs: the model; NICs: the interface or device name.
    pub name: String,
    /// NICs: link speed, Gbit/s.
    pub gbps: f64,
    /// CPUs: the CPU list of the NUMA node (`0-55,112-167`).
    pub cpus: String,
}

/// The kind of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    NvLink,
    Pci,
    /// Between CPU sockets (UPI, Infinity Fabric).
    Smp,
}

impl LinkKind {
    fn name(self) -> &'static str {
        match self {
            LinkKind::NvLink => "nvlink",
            LinkKind::Pci => "pci",
            LinkKind::Smp => "smp",
        }
    }

    fn parse(s: &str) -> Option<LinkKind> {
        [LinkKind::NvLink, LinkKind::Pci, LinkKind::Smp].into_iter().find(|k| k.name() == s)
    }
}

/// An undirected link between two vertices of one host.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub a: usize,
    pub b: usize,
    pub kind: LinkKind,
    /// GB/s in each direction.
    pub gbs: f64,
    /// NVLinks: how many lanes the link bundles.
    pub count: u32,
}

/// One host's graph.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTopo {
    pub name: String,
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
}

/// NCCL's path types, nearest first (the classes `nvidia-smi topo -m` prints).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathType {
    /// The same device.
    Loc,
    /// NVLink, directly or through NVSwitches.
    Nvl,
    /// Through at most one PCIe switch.
    Pix,
    /// Through several PCIe switches, not the host bridge.
    Pxb,
    /// Through a CPU's PCIe host bridge.
    Phb,
    /// Across the link between CPU sockets.
    Sys,
    /// Between hosts, over the network.
    Net,
}

impl PathType {
    pub fn name(self) -> &'static str {
        match self {
            PathType::Loc => "LOC",
            PathType::Nvl => "NVL",
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Phb => "PHB",
            PathType::Sys => "SYS",
            PathType::Net => "NET",
        }
    }
}

impl fmt::Display for PathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The best path between two vertices of a host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Path {
    pub kind: PathType,
    /// The narrowest link on the path, GB/s.
    pub gbs: f64,
    pub hops: usize,
    /// NVLink lanes of the path's narrowest NVLink hop (0 when it has none).
    pub nvlinks: u32,
}

/// The whole system: one graph per host.
#[derive(Clone, Debug, PartialEq)]
pub struct Topo {
    pub hosts: Vec<HostTopo>,
}

impl HostTopo {
    /// The index of the vertex named `id`.
    pub fn find(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// Vertices of one kind, in file order (GPUs sorted by device index).
    pub fn of_kind(&self, kind: NodeKind) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].kind == kind).collect();
        if kind == NodeKind::Gpu {
            v.sort_by_key(|&i| self.nodes[i].dev.unwrap_or(u32::MAX));
        }
        v
    }

    /// GPUs, in device order.
    pub fn gpus(&self) -> Vec<usize> {
        self.of_kind(NodeKind::Gpu)
    }

    /// NICs, in file order.
    pub fn nics(&self) -> Vec<usize> {
        self.of_kind(NodeKind::Nic)
    }

    /// The best path from `a` to `b`: the nearest path type, then the widest, then the
    /// shortest. Paths pass only through switches and CPUs (never through another GPU or NIC).
    pub fn path(&self, a: usize, b: usize) -> Option<Path> {
        if a == b {
            return Some(Path { kind: PathType::Loc, gbs: f64::INFINITY, hops: 0, nvlinks: 0 });
        }
        let mut adj: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (i, l) in self.links.iter().enumerate() {
            adj[l.a].push(i);
            adj[l.b].push(i);
        }
        let mut best: Option<Path> = None;
        let mut on = vec![false; self.nodes.len()];
        let mut links = Vec::new();
        self.walk(a, b, &adj, &mut on, &mut links, &mut best);
        best
    }

    fn walk(
        &self,
        at: usize,
        to: usize,
        adj: &[Vec<usize>],
        on: &mut [bool],
        links: &mut Vec<usize>,
        best: &mut Option<Path>,
    ) {
        if links.len() >= 10 {
            return;
        }
        on[at] = true;
        for &li in &adj[at] {
            let l = &self.links[li];
            let next = if l.a == at { l.b } else { l.a };
            if on[next] {
                continue;
            }
            links.push(li);
            if next == to {
                let p = self.classify(links);
                let better = match best {
                    None => true,
                    Some(b) => (p.kind, -p.gbs, p.hops) < (b.kind, -b.gbs, b.hops),
                };
                if better {
                    *best = Some(p);
                }
            } else if matches!(self.nodes[next].kind, NodeKind::Pci | NodeKind::Cpu | NodeKind::NvSwitch) {
                self.walk(next, to, adj, on, links, best);
            }
            links.pop();
        }
        on[at] = false;
    }

    /// The type of a path given as its links, in order.
    fn classify(&self, links: &[usize]) -> Path {
        let gbs = links.iter().map(|&i| self.links[i].gbs).fold(f64::INFINITY, f64::min);
        let nvlinks = links
            .iter()
            .filter(|&&i| self.links[i].kind == LinkKind::NvLink)
            .map(|&i| self.links[i].count)
            .min()
            .unwrap_or(0);
        // The vertices strictly inside the path.
        let mut inner = Vec::new();
        for w in links.windows(2) {
            let (x, y) = (&self.links[w[0]], &self.links[w[1]]);
            let shared = if x.a == y.a || x.a == y.b { x.a } else { x.b };
            inner.push(shared);
        }
        let kind = if links.iter().any(|&i| self.links[i].kind == LinkKind::Smp) {
            PathType::Sys
        } else if inner.iter().any(|&v| self.nodes[v].kind == NodeKind::Cpu) {
            PathType::Phb
        } else if links.iter().all(|&i| self.links[i].kind == LinkKind::NvLink) {
            PathType::Nvl
        } else if inner.iter().filter(|&&v| self.nodes[v].kind == NodeKind::Pci).count() <= 1 {
            PathType::Pix
        } else {
            PathType::Pxb
        };
        Path { kind, gbs, hops: links.len(), nvlinks }
    }

    /// The NUMA node of vertex `v` (its own, or the nearest CPU's).
    pub fn numa_of(&self, v: usize) -> Option<u32> {
        if let Some(n) = self.nodes[v].numa {
            return Some(n);
        }
        self.of_kind(NodeKind::Cpu)
            .into_iter()
            .filter_map(|c| self.path(v, c).map(|p| (p.kind, p.hops, c)))
            .min_by_key(|&(k, h, _)| (k, h))
            .and_then(|(_, _, c)| self.nodes[c].numa)
    }

    /// The NIC nearest to `v` (nearest path type, then widest NIC, then file order).
    pub fn nearest_nic(&self, v: usize) -> Option<usize> {
        self.nics()
            .into_iter()
            .filter_map(|n| self.path(v, n).map(|p| (p, n)))
            .min_by(|(p, n), (q, m)| {
                (p.kind, -self.nodes[*n].gbps, *n).partial_cmp(&(q.kind, -self.nodes[*m].gbps, *m)).unwrap()
            })
            .map(|(_, n)| n)
    }

    /// The host's network bandwidth in GB/s (all NICs together).
    pub fn net_gbs(&self) -> f64 {
        self.nics().iter().map(|&n| self.nodes[n].gbps / 8.0).sum()
    }
}

impl Topo {
    /// GPUs in the whole system (host-major, device order): (host, vertex).
    pub fn gpus(&self) -> Vec<(usize, usize)> {
        self.hosts.iter().enumerate().flat_map(|(h, t)| t.gpus().into_iter().map(move |g| (h, g))).collect()
    }

    /// The `nvidia-smi topo -m` matrix of one host: GPUs and NICs against each other, then each
    /// GPU's CPU and NUMA affinity and nearest NIC.
    pub fn matrix(&self, host: usize) -> String {
        let h = &self.hosts[host];
        let devs: Vec<usize> = h.gpus().into_iter().chain(h.nics()).collect();
        let label = |v: usize| {
            let n = &h.nodes[v];
            match n.kind {
                NodeKind::Gpu => format!("GPU{}", n.dev.unwrap_or(0)),
                _ => format!("NIC{}", h.nics().iter().position(|&x| x == v).unwrap_or(0)),
            }
        };
        let mut out = String::new();
        out.push_str(&format!("{:<8}", ""));
        for &d in &devs {
            out.push_str(&format!("{:<7}", label(d)));
        }
        out.push_str("CPU Affinity    NUMA Affinity   Nearest NIC\n");
        for &a in &devs {
            out.push_str(&format!("{:<8}", label(a)));
            for &b in &devs {
                let cell = match h.path(a, b) {
                    Some(p) if p.kind == PathType::Loc => " X".to_string(),
                    Some(p) if p.kind == PathType::Nvl && p.nvlinks > 0 => format!("NV{}", p.nvlinks),
                    Some(p) => p.kind.name().to_string(),
                    None => "-".into(),
                };
                out.push_str(&format!("{cell:<7}"));
            }
            let numa = h.numa_of(a);
            let cpus = numa
                .and_then(|n| h.nodes.iter().find(|c| c.kind == NodeKind::Cpu && c.numa == Some(n)))
                .map(|c| c.cpus.clone())
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| "N/A".into());
            let nic = if h.nodes[a].kind == NodeKind::Gpu {
                h.nearest_nic(a).map(|n| format!("{} ({})", label(n), h.nodes[n].name)).unwrap_or("-".into())
            } else {
                h.nodes[a].name.clone()
            };
            out.push_str(&format!(
                "{cpus:<16}{:<16}{nic}\n",
                numa.map(|n| n.to_string()).unwrap_or("N/A".into())
            ));
        }
        let legend = [
            ("X", "the device itself"),
            ("NV#", "NVLink, # lanes (directly or through NVSwitch)"),
            ("PIX", "at most one PCIe switch"),
            ("PXB", "several PCIe switches, no host bridge"),
            ("PHB", "a PCIe host bridge (one CPU)"),
            ("SYS", "the link between CPU sockets"),
        ];
        out.push_str("\nLegend:\n");
        for (k, v) in legend {
            out.push_str(&format!("  {k:<4} = {v}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests;
