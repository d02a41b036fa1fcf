//! Topology discovery: this host's NUMA nodes and CPUs, NICs and GPUs with the PCIe tree
//! between them (from sysfs), and NVLinks (from NVML, loaded at run time), as an
//! [`oxccl_core::topo::Topo`]. `NCCL_TOPO_FILE` replaces discovery with a file;
//! `NCCL_TOPO_DUMP_FILE` writes what was found.
//!
//! PCIe switches appear in sysfs as chains of bridges (root port, upstream port, downstream
//! ports); a bridge becomes a `pci` vertex only where devices below it branch, so two GPUs
//! under one switch are `PIX` to each other, as `nvidia-smi topo -m` says.

use crate::sys::nvml::{self, GpuInfo};
use oxccl_core::topo::{HostTopo, Link, LinkKind, Node, NodeKind, Topo};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// PCIe bandwidth assumed where sysfs does not say (GB/s, each direction).
const DEFAULT_PCI_GBS: f64 = 16.0;
/// Bandwidth assumed between CPU sockets (GB/s).
const DEFAULT_SMP_GBS: f64 = 40.0;
/// Bandwidth of one NVLink lane (GB/s each direction; NVLink 3 and 4).
const NVLINK_LANE_GBS: f64 = 25.0;

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

/// GB/s of the PCIe link above the device at `dir` (its `current_link_speed` × width).
fn link_gbs(dir: &Path) -> f64 {
    let speed = read(dir.join("current_link_speed"))
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse::<f64>().ok()));
    let width = read(dir.join("current_link_width")).and_then(|s| s.parse::<f64>().ok());
    match (speed, width) {
        (Some(s), Some(w)) if s > 0.0 && w > 0.0 => s * w * (128.0 / 130.0) / 8.0,
        _ => DEFAULT_PCI_GBS,
    }
}

/// A device to place in the PCIe tree.
struct Dev {
    node: Node,
    /// The chain of PCI addresses from the root port down to the device itself (full paths).
    chain: Vec<PathBuf>,
    numa: u32,
}

/// Discovers this host (sysfs under `/sys`, GPUs from NVML).
pub fn discover() -> Topo {
    let host = crate::sys::host::hostname();
    Topo { hosts: vec![discover_at(Path::new("/sys"), &nvml::gpus(), &host)] }
}

/// Discovery over a sysfs tree rooted at `sys`, with the GPUs given (tests pass both).
pub fn discover_at(sys: &Path, gpus: &[GpuInfo], name: &str) -> HostTopo {
    let mut nodes = Vec::new();
    let mut links = Vec::new();
    // CPUs: one vertex per NUMA node.
    let mut numas: Vec<(u32, String)> = std::fs::read_dir(sys.join("devices/system/node"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().strip_prefix("node")?.parse::<u32>().ok()?;
            Some((n, read(e.path().join("cpulist")).unwrap_or_default()))
        })
        .collect();
    numas.sort();
    if numas.is_empty() {
        numas.push((0, read(sys.join("devices/system/cpu/online")).unwrap_or_default()));
    }
    for (n, cpus) in &numas {
        nodes.push(Node {
            id: format!("cpu{n}"),
            kind: NodeKind::Cpu,
            numa: Some(*n),
            dev: None,
            name: String::new(),
            gbps: 0.0,
            cpus: cpus.clone(),
        });
    }
    for i in 0..numas.len() {
        for j in i + 1..numas.len() {
            links.push(Link { a: i, b: j, kind: LinkKind::Smp, gbs: DEFAULT_SMP_GBS, count: 1 });
        }
    }
    let cpu_of = |numa: u32| numas.iter().position(|(n, _)| *n == numa).unwrap_or(0);
    // Devices: GPUs (from NVML) and NICs (network interfaces backed by a device).
    let mut devs: Vec<Dev> = Vec::new();
    let chain_of = |real: &Path| -> Vec<PathBuf> {
        let mut v = Vec::new();
        let mut p = PathBuf::new();
        for c in real.components() {
            p.push(c);
            if is_bdf(&c.as_os_str().to_string_lossy()) {
                v.push(p.clone());
            }
        }
        v
    };
    let numa_of = |chain: &[PathBuf]| {
        chain
            .last()
            .and_then(|d| read(d.join("numa_node")))
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|&n| n >= 0)
            .map(|n| n as u32)
            .unwrap_or(numas[0].0)
    };
    for g in gpus {
        let real = std::fs::canonicalize(sys.join("bus/pci/devices").join(&g.bus_id)).unwrap_or_default();
        let chain = chain_of(&real);
        let numa = numa_of(&chain);
        devs.push(Dev {
            node: Node {
                id: format!("gpu{}", g.index),
                kind: NodeKind::Gpu,
                numa: Some(numa),
                dev: Some(g.index),
                name: g.name.clone(),
                gbps: 0.0,
                cpus: String::new(),
            },
            chain,
            numa,
        });
    }
    let mut ifaces: Vec<String> = std::fs::read_dir(sys.join("class/net"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo")
        .collect();
    ifaces.sort();
    for (k, ifname) in ifaces.iter().enumerate() {
        let dir = sys.join("class/net").join(ifname);
        let Ok(real) = std::fs::canonicalize(dir.join("device")) else { continue };
        let chain = chain_of(&real);
        if chain.is_empty() {
            continue;
        }
        let numa = numa_of(&chain);
        let mbps = read(dir.join("speed")).and_then(|s| s.parse::<f64>().ok()).filter(|&s| s > 0.0);
        devs.push(Dev {
            node: Node {
                id: format!("nic{k}"),
                kind: NodeKind::Nic,
                numa: Some(numa),
                dev: None,
                name: ifname.clone(),
                gbps: mbps.map(|m| m / 1000.0).unwrap_or(0.0),
                cpus: String::new(),
            },
            chain,
            numa,
        });
    }
    // Bridges where devices branch become switch vertices.
    let mut below: BTreeMap<PathBuf, BTreeSet<usize>> = BTreeMap::new();
    for (i, d) in devs.iter().enumerate() {
        for b in d.chain.iter().take(d.chain.len().saturating_sub(1)) {
            below.entry(b.clone()).or_default().insert(i);
        }
    }
    let kept: BTreeSet<PathBuf> = below
        .iter()
        .filter(|(b, set)| {
            set.len() >= 2 && !below.iter().any(|(c, cs)| c.parent() == Some(b.as_path()) && cs == *set)
        })
        .map(|(b, _)| b.clone())
        .collect();
    let mut bridge_idx: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (k, b) in kept.iter().enumerate() {
        bridge_idx.insert(b.clone(), nodes.len());
        let numa = devs.iter().find(|d| d.chain.contains(b)).map(|d| d.numa);
        nodes.push(Node {
            id: format!("pci{k}"),
            kind: NodeKind::Pci,
            numa,
            dev: None,
            name: b.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
            gbps: 0.0,
            cpus: String::new(),
        });
    }
    // Each kept bridge hangs from its nearest kept ancestor, or from its CPU.
    for b in &kept {
        let numa = devs.iter().find(|d| d.chain.contains(b)).map(|d| d.numa).unwrap_or(0);
        let up = b.ancestors().skip(1).find_map(|a| bridge_idx.get(a).copied()).unwrap_or(cpu_of(numa));
        links.push(Link { a: bridge_idx[b], b: up, kind: LinkKind::Pci, gbs: link_gbs(b), count: 1 });
    }
    let mut dev_idx: BTreeMap<String, usize> = BTreeMap::new();
    for d in devs {
        let at = nodes.len();
        let up =
            d.chain.iter().rev().skip(1).find_map(|a| bridge_idx.get(a).copied()).unwrap_or(cpu_of(d.numa));
        let gbs = d.chain.last().map(|p| link_gbs(p)).unwrap_or(DEFAULT_PCI_GBS);
        if let Some(last) = d.chain.last() {
            dev_idx
                .insert(last.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(), at);
        }
        nodes.push(d.node);
        links.push(Link { a: at, b: up, kind: LinkKind::Pci, gbs, count: 1 });
    }
    // NVLinks: to another GPU directly, or into the NVSwitch fabric (one crossbar vertex).
    let mut nvs: Option<usize> = None;
    let mut pairs: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    for g in gpus {
        let Some(&me) = dev_idx.get(&g.bus_id) else { continue };
        for r in &g.nvlinks {
            let other = match dev_idx.get(r) {
                Some(&o) if nodes[o].kind == NodeKind::Gpu => {
                    if o < me {
                        continue; // counted from the other end
                    }
                    o
                }
                _ => *nvs.get_or_insert_with(|| {
                    nodes.push(Node {
                        id: "nvs".into(),
                        kind: NodeKind::NvSwitch,
                        numa: None,
                        dev: None,
                        name: "NVSwitch".into(),
                        gbps: 0.0,
                        cpus: String::new(),
                    });
                    nodes.len() - 1
                }),
            };
            *pairs.entry((me, other)).or_default() += 1;
        }
    }
    for ((a, b), count) in pairs {
        links.push(Link { a, b, kind: LinkKind::NvLink, gbs: NVLINK_LANE_GBS * count as f64, count });
    }
    HostTopo { name: name.to_string(), nodes, links }
}

/// The topology to use: `NCCL_TOPO_FILE` if set, else discovery; written to
/// `NCCL_TOPO_DUMP_FILE` when that is set.
pub fn system(get: impl Fn(&str) -> Option<String>) -> Result<Topo, String> {
    let t = match get("NCCL_TOPO_FILE") {
        Some(f) => {
            let text = std::fs::read_to_string(&f).map_err(|e| format!("NCCL_TOPO_FILE={f}: {e}"))?;
            Topo::parse(&text).map_err(|e| format!("NCCL_TOPO_FILE={f}: {e}"))?
        }
        None => discover(),
    };
    if let Some(f) = get("NCCL_TOPO_DUMP_FILE") {
        std::fs::write(&f, t.to_json()).map_err(|e| format!("NCCL_TOPO_DUMP_FILE={f}: {e}"))?;
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::topo::PathType;

    /// A fake sysfs: 2 NUMA nodes; under node 0 a PCIe switch (root port → upstream port → two
    /// downstream ports) with GPU 0 and GPU 1; GPU 2 and a NIC on node 1's root ports; GPU 0
    /// and GPU 1 joined by 4 NVLinks, GPU 2 on an NVSwitch.
    fn fake_sysfs() -> (PathBuf, Vec<GpuInfo>) {
        let root = std::env::temp_dir().join(format!("oxccl-fake-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mk = |p: &str, files: &[(&str, &str)]| {
            let d = root.join(p);
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in files {
                std::fs::write(d.join(f), v).unwrap();
            }
            d
        };
        mk("devices/system/node/node0", &[("cpulist", "0-7")]);
        mk("devices/system/node/node1", &[("cpulist", "8-15")]);
        let sw = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
        let gen4 =
            [("current_link_speed", "16.0 GT/s PCIe"), ("current_link_width", "16"), ("numa_node", "0")];
        let g0 = mk(&format!("{sw}/0000:02:00.0/0000:03:00.0"), &gen4);
        let g1 = mk(&format!("{sw}/0000:02:01.0/0000:04:00.0"), &gen4);
        for b in [
            sw,
            "devices/pci0000:00/0000:00:01.0",
            &format!("{sw}/0000:02:00.0"),
            &format!("{sw}/0000:02:01.0"),
        ] {
            mk(b, &gen4);
        }
        let n1 = [("numa_node", "1")];
        let g2 = mk("devices/pci0000:80/0000:80:01.0/0000:81:00.0", &n1);
        let nic = mk("devices/pci0000:80/0000:80:02.0/0000:82:00.0", &n1);
        mk("devices/pci0000:80/0000:80:02.0/0000:82:00.0/net/ib0", &[]);
        mk("class/net/ib0", &[("speed", "200000")]);
        mk("class/net/lo", &[]);
        mk("bus/pci/devices", &[]);
        std::os::unix::fs::symlink(&nic, root.join("class/net/ib0/device")).unwrap();
        for (bdf, d) in [("0000:03:00.0", &g0), ("0000:04:00.0", &g1), ("0000:81:00.0", &g2)] {
            std::os::unix::fs::symlink(d, root.join("bus/pci/devices").join(bdf)).unwrap();
        }
        let gpu = |i: u32, bus: &str, links: Vec<&str>| GpuInfo {
            index: i,
            name: "Test GPU".into(),
            bus_id: bus.into(),
            nvlinks: links.into_iter().map(String::from).collect(),
        };
        let gpus = vec![
            gpu(0, "0000:03:00.0", vec!["0000:04:00.0"; 4]),
            gpu(1, "0000:04:00.0", vec!["0000:03:00.0"; 4]),
            gpu(2, "0000:81:00.0", vec!["0000:c0:00.0"; 2]),
        ];
        (root, gpus)
    }

    #[test]
    fn sysfs_discovery_finds_switches_numa_nvlinks_and_nics() {
        let (root, gpus) = fake_sysfs();
        let h = discover_at(&root, &gpus, "fake");
        let id = |s: &str| h.find(s).unwrap_or_else(|| panic!("{s} missing: {:?}", h.nodes));
        let k = |a: &str, b: &str| h.path(id(a), id(b)).unwrap().kind;
        assert_eq!(h.gpus().len(), 3);
        assert_eq!(h.nics().len(), 1, "lo is not a NIC");
        assert_eq!(h.of_kind(NodeKind::Pci).len(), 1, "one switch: {:?}", h.nodes);
        assert_eq!(h.nodes[id("nic0")].name, "ib0");
        assert_eq!(h.nodes[id("nic0")].gbps, 200.0);
        assert_eq!(h.numa_of(id("gpu2")), Some(1));
        assert_eq!(h.nodes[id("cpu1")].cpus, "8-15");
        let p01 = h.path(id("gpu0"), id("gpu1")).unwrap();
        assert_eq!((p01.kind, p01.gbs, p01.nvlinks), (PathType::Nvl, 100.0, 4));
        assert_eq!(k("gpu0", "gpu2"), PathType::Sys);
        assert_eq!(k("gpu2", "nic0"), PathType::Phb);
        assert!(h.find("nvs").is_some());
        // Gen4 x16: 16 GT/s × 16 lanes × 128/130 / 8.
        let sw_link =
            h.links.iter().find(|l| h.nodes[l.a].kind == NodeKind::Gpu && l.kind == LinkKind::Pci).unwrap();
        assert!((sw_link.gbs - 31.5).abs() < 0.1, "{}", sw_link.gbs);
        // The dump reads back equal.
        let t = Topo { hosts: vec![h] };
        assert_eq!(Topo::parse(&t.to_json()).unwrap(), t);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn this_machine_is_discovered_without_gpus_or_errors() {
        let t = discover();
        let h = &t.hosts[0];
        assert!(!h.of_kind(NodeKind::Cpu).is_empty());
        assert!(h.nodes.iter().all(|n| n.kind != NodeKind::Gpu) || !nvml::gpus().is_empty());
        let _ = t.matrix(0);
    }
}

/// Where a rank's progress thread runs: CPUs, their NUMA node, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub cpus: Vec<usize>,
    pub numa: Option<u32>,
    pub why: String,
}

/// This host's discovered topology, once per process.
pub fn host() -> &'static Topo {
    static T: std::sync::OnceLock<Topo> = std::sync::OnceLock::new();
    T.get_or_init(discover)
}

/// The binding of a rank whose traffic leaves the host through interface `iface` (when
/// `network`): the CPUs of that NIC's NUMA node among those it was launched on; otherwise (or
/// when that leaves none) the CPUs it was launched on.
pub fn binding(h: &HostTopo, launch: &[usize], iface: Option<&str>, network: bool) -> Binding {
    use crate::sys::affinity::{format_cpulist, parse_cpulist};
    let node_cpus = |n: u32| {
        h.nodes
            .iter()
            .find(|c| c.kind == NodeKind::Cpu && c.numa == Some(n))
            .map(|c| parse_cpulist(&c.cpus))
            .unwrap_or_default()
    };
    if network {
        if let Some(nic) = iface.and_then(|i| h.nodes.iter().find(|n| n.kind == NodeKind::Nic && n.name == i))
        {
            if let Some(n) = nic.numa {
                let cpus: Vec<usize> = node_cpus(n).into_iter().filter(|c| launch.contains(c)).collect();
                if !cpus.is_empty() {
                    return Binding {
                        why: format!("NIC {} is on NUMA node {n} (CPUs {})", nic.name, format_cpulist(&cpus)),
                        cpus,
                        numa: Some(n),
                    };
                }
            }
        }
    }
    // The NUMA node holding most of the launch CPUs.
    let numa = h
        .of_kind(NodeKind::Cpu)
        .into_iter()
        .filter_map(|c| {
            let n = h.nodes[c].numa?;
            Some((parse_cpulist(&h.nodes[c].cpus).iter().filter(|x| launch.contains(x)).count(), n))
        })
        .max()
        .filter(|(k, _)| *k > 0)
        .map(|x| x.1);
    Binding {
        cpus: launch.to_vec(),
        numa,
        why: format!("the CPUs this rank was launched on ({})", format_cpulist(launch)),
    }
}

#[cfg(test)]
mod binding_tests {
    use super::*;
    use oxccl_core::topo::Topo;

    #[test]
    fn network_ranks_bind_to_their_nics_node_and_others_keep_their_launch_cpus() {
        let t = Topo::parse(include_str!("../../../fixtures/topo/pcie-4gpu-2nic.json")).unwrap();
        let h = &t.hosts[0];
        let all: Vec<usize> = (0..64).collect();
        let b = binding(h, &all, Some("mlx5_1"), true);
        assert_eq!((b.cpus.clone(), b.numa), ((32..64).collect::<Vec<_>>(), Some(1)), "{b:?}");
        assert!(b.why.contains("NIC mlx5_1 is on NUMA node 1"), "{b:?}");
        // Launched on node 0 only: the NIC's node has none of those CPUs, so they are kept.
        let b = binding(h, &[0, 1, 2], Some("mlx5_1"), true);
        assert_eq!((b.cpus.clone(), b.numa), (vec![0, 1, 2], Some(0)), "{b:?}");
        let b = binding(h, &[40, 41], None, false);
        assert_eq!((b.cpus.clone(), b.numa), (vec![40, 41], Some(1)), "{b:?}");
        assert!(b.why.contains("launched on (40-41)"), "{b:?}");
    }
}
