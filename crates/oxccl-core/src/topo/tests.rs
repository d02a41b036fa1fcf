use super::graphs::{ring_bottleneck, ring_order};
use super::*;

pub(crate) const DGX: &str = include_str!("../../../../fixtures/topo/dgx-h100.json");
pub(crate) const DGX16: &str = include_str!("../../../../fixtures/topo/dgx-h100-x16.json");
pub(crate) const PCIE: &str = include_str!("../../../../fixtures/topo/pcie-4gpu-2nic.json");
pub(crate) const PCIE16: &str = include_str!("../../../../fixtures/topo/pcie-4gpu-2nic-x16.json");

fn kind(h: &HostTopo, a: &str, b: &str) -> PathType {
    h.path(h.find(a).unwrap(), h.find(b).unwrap()).unwrap().kind
}

#[test]
fn dgx_paths_are_nccls_classes() {
    let t = Topo::parse(DGX).unwrap();
    let h = &t.hosts[0];
    assert_eq!(h.gpus().len(), 8);
    assert_eq!(h.nics().len(), 8);
    for (a, b, k) in [
        ("gpu0", "gpu0", PathType::Loc),
        ("gpu0", "gpu1", PathType::Nvl),
        ("gpu0", "gpu7", PathType::Nvl),
        ("gpu0", "nic0", PathType::Pix),
        ("gpu0", "nic1", PathType::Pix),
        ("gpu0", "nic2", PathType::Phb),
        ("gpu0", "nic4", PathType::Sys),
        ("nic0", "nic1", PathType::Pix),
        ("nic0", "nic7", PathType::Sys),
    ] {
        assert_eq!(kind(h, a, b), k, "{a}–{b}");
    }
    let p = h.path(h.find("gpu0").unwrap(), h.find("gpu5").unwrap()).unwrap();
    assert_eq!((p.gbs, p.nvlinks, p.hops), (450.0, 18, 2));
    assert_eq!(h.nodes[h.nearest_nic(h.find("gpu5").unwrap()).unwrap()].id, "nic4");
    assert_eq!(h.numa_of(h.find("gpu6").unwrap()), Some(1));
    assert_eq!(h.net_gbs(), 400.0);
    let m = t.matrix(0);
    assert!(m.lines().nth(1).unwrap().starts_with("GPU0     X     NV18   NV18"), "{m}");
    assert!(m.contains("0-55,112-167"), "{m}");
    assert!(m.contains("NIC0 (mlx5_0)"), "{m}");
}

#[test]
fn pcie_paths_and_the_ring_order_keep_switch_pairs_adjacent() {
    let t = Topo::parse(PCIE).unwrap();
    let h = &t.hosts[0];
    for (a, b, k) in [
        ("gpu0", "gpu1", PathType::Pix),
        ("gpu0", "gpu2", PathType::Sys),
        ("gpu1", "gpu3", PathType::Sys),
        ("gpu0", "nic0", PathType::Phb),
        ("gpu0", "nic1", PathType::Sys),
        ("gpu3", "nic1", PathType::Phb),
    ] {
        assert_eq!(kind(h, a, b), k, "{a}–{b}");
    }
    let order: Vec<u32> = ring_order(h).iter().map(|&v| h.nodes[v].dev.unwrap()).collect();
    assert_eq!(order, vec![0, 1, 2, 3]);
    assert_eq!(ring_bottleneck(h, &ring_order(h)), (PathType::Sys, 24.0));
    let d = Topo::parse(DGX).unwrap();
    assert_eq!(ring_bottleneck(&d.hosts[0], &ring_order(&d.hosts[0])), (PathType::Nvl, 450.0));
}

#[test]
fn files_round_trip_and_clusters_repeat_hosts() {
    for text in [DGX, PCIE, DGX16, PCIE16] {
        let t = Topo::parse(text).unwrap();
        assert_eq!(Topo::parse(&t.to_json()).unwrap(), t);
    }
    let c = Topo::parse(DGX16).unwrap();
    assert_eq!(c.hosts.len(), 16);
    assert_eq!(c.hosts[15].name, "dgx-h100-15");
    assert_eq!(c.gpus().len(), 128);
    assert_eq!(Topo::parse(PCIE16).unwrap().gpus().len(), 64);
}

#[test]
fn bad_files_are_refused_by_name() {
    let with = |nodes: &str, links: &str| {
        format!("{{\"oxccl_topo\":1,\"hosts\":[{{\"name\":\"h\",\"nodes\":[{nodes}],\"links\":[{links}]}}]}}")
    };
    let cpu = "{\"id\":\"c\",\"kind\":\"cpu\"}";
    for (text, needle) in [
        ("{}".to_string(), "oxccl_topo"),
        ("{\"oxccl_topo\":1,\"hosts\":[]}".to_string(), "no hosts"),
        (with("{\"id\":\"x\",\"kind\":\"tpu\"}", ""), "kind \"tpu\""),
        (with(&format!("{cpu},{cpu}"), ""), "appears twice"),
        (with(cpu, "{\"a\":\"c\",\"b\":\"z\",\"kind\":\"pci\",\"gbs\":1}"), "unknown node z"),
        (with(cpu, "{\"a\":\"c\",\"b\":\"c\",\"kind\":\"wire\",\"gbs\":1}"), "link kind \"wire\""),
        (with(cpu, "{\"a\":\"c\",\"b\":\"c\",\"kind\":\"pci\"}"), "no bandwidth"),
        ("[".repeat(500), "too deep"),
    ] {
        let e = Topo::parse(&text).unwrap_err();
        assert!(e.contains(needle), "{text}: {e}");
    }
}

#[test]
fn rings_and_trees_are_described_per_channel() {
    let t = Topo::parse(PCIE16).unwrap();
    let d = graphs::describe(&t, 2);
    assert!(d.starts_with("channel 0 ring: 0 → 1 → 2 → 3 → 4 → 5"), "{d}");
    assert!(d.contains("channel 1 ring: 2 → 3 → 0 → 1 → 6"), "{d}");
    assert!(d.contains("tree 0 over 16 host(s): root host 15"), "{d}");
    assert!(d.contains("chain inside each host: GPU0 → GPU1 → GPU2 → GPU3"), "{d}");
    let s = graphs::svg(&Topo::parse(DGX).unwrap().hosts[0]);
    assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    assert_eq!(s.matches("<rect").count(), 2 + 1 + 4 + 8 + 8);
}
