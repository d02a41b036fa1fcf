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
        (
            "{\"oxccl_topo\":1,\"hosts\":".to_string() + &"[".repeat(500),
            "recursion limit exceeded at line 1 column 151",
        ),
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

/// The file format against serde_json's rules: escapes, numbers, malformed text.
mod file_format {
    use super::*;
    use crate::json::testing::{place, place_end, positive, text};
    use proptest::prelude::*;

    fn node() -> impl Strategy<Value = Node> {
        let kind = prop::sample::select(vec![
            NodeKind::Cpu,
            NodeKind::Pci,
            NodeKind::Gpu,
            NodeKind::Nic,
            NodeKind::NvSwitch,
        ]);
        let gbps = prop_oneof![Just(0.0), positive()];
        (text(), kind, any::<Option<u32>>(), any::<Option<u32>>(), text(), gbps, text()).prop_map(
            |(id, kind, numa, dev, name, gbps, cpus)| Node { id, kind, numa, dev, name, gbps, cpus },
        )
    }

    fn host() -> impl Strategy<Value = HostTopo> {
        let kind = prop::sample::select(vec![LinkKind::NvLink, LinkKind::Pci, LinkKind::Smp]);
        let link =
            (any::<prop::sample::Index>(), any::<prop::sample::Index>(), kind, positive(), any::<u32>());
        (text(), prop::collection::vec(node(), 1..6), prop::collection::vec(link, 0..6)).prop_map(
            |(name, mut nodes, links)| {
                // Ids unique in the host: each ends in its own index.
                for (i, n) in nodes.iter_mut().enumerate() {
                    n.id.push_str(&i.to_string());
                }
                let links = links
                    .into_iter()
                    .map(|(a, b, kind, gbs, count)| Link {
                        a: a.index(nodes.len()),
                        b: b.index(nodes.len()),
                        kind,
                        gbs,
                        count,
                    })
                    .collect();
                HostTopo { name, nodes, links }
            },
        )
    }

    proptest! {
        #[test]
        fn any_topology_round_trips_exactly(hosts in prop::collection::vec(host(), 1..4)) {
            let t = Topo { hosts };
            prop_assert_eq!(Topo::parse(&t.to_json()).unwrap(), t);
        }
    }

    fn one_node(node: &str) -> String {
        format!("{{\"oxccl_topo\": 1, \"hosts\": [{{\"name\": \"h\", \"nodes\": [{node}]}}]}}")
    }

    #[test]
    fn escapes_and_non_bmp_characters_read_exactly() {
        let t = Topo::parse(&one_node(
            r#"{"id": "a\b\f\r\t\n\"\\\/z", "kind": "gpu", "model": "H\u00e9 \ud83d\ude00 😀", "numa": 4294967295}"#,
        ))
        .unwrap();
        let n = &t.hosts[0].nodes[0];
        assert_eq!(n.id, "a\u{8}\u{c}\r\t\n\"\\/z");
        assert_eq!(n.name, "Hé 😀 😀");
        assert_eq!(n.numa, Some(u32::MAX));
        let text = t.to_json();
        assert_eq!(
            text,
            "{\"oxccl_topo\":1,\"hosts\":[{\"name\":\"h\",\"nodes\":[{\"id\":\"a\\b\\f\\r\\t\\n\\\"\\\\/z\",\"kind\":\"gpu\",\"numa\":4294967295,\"model\":\"Hé 😀 😀\"}],\"links\":[]}]}\n"
        );
        assert_eq!(Topo::parse(&text).unwrap(), t);
    }

    #[test]
    fn numbers_that_are_not_finite_are_written_null() {
        let mut t = Topo::parse(&one_node(r#"{"id": "n", "kind": "nic", "gbps": 400}"#)).unwrap();
        t.hosts[0].nodes[0].gbps = f64::INFINITY;
        let text = t.to_json();
        assert!(text.contains("{\"id\":\"n\",\"kind\":\"nic\",\"gbps\":null}"), "{text}");
        assert_eq!(Topo::parse(&text).unwrap().hosts[0].nodes[0].gbps, 0.0);
        // A link's bandwidth is required: null is no bandwidth.
        let h = &mut t.hosts[0];
        h.links.push(Link { a: 0, b: 0, kind: LinkKind::Pci, gbs: f64::NAN, count: 1 });
        let text = t.to_json();
        assert!(text.contains("\"gbs\":null"), "{text}");
        assert_eq!(Topo::parse(&text).unwrap_err(), "topology file: host h: link n–n has no bandwidth");
    }

    #[test]
    fn malformed_numbers_and_truncated_files_name_the_place() {
        let plus = one_node(r#"{"id": "g", "kind": "gpu", "dev": +1}"#);
        let e = Topo::parse(&plus).unwrap_err();
        assert_eq!(e, format!("topology file: expected value at {}", place(&plus, "+1")));
        let big = one_node(r#"{"id": "g", "kind": "gpu", "dev": 4294967296}"#);
        assert_eq!(
            Topo::parse(&big).unwrap_err(),
            format!(
                "topology file: invalid value: integer `4294967296`, expected u32 at {}",
                place_end(&big, "4294967296")
            )
        );
        let half = one_node(r#"{"id": "g", "kind": "gpu", "dev": 1.5}"#);
        assert_eq!(
            Topo::parse(&half).unwrap_err(),
            format!(
                "topology file: invalid type: floating point `1.5`, expected u32 at {}",
                place_end(&half, "1.5")
            )
        );
        // A lone high surrogate: serde_json reads on for its low half and finds the quote.
        let lone = one_node(r#"{"id": "g", "kind": "gpu", "model": "\ud83d"}"#);
        assert_eq!(
            Topo::parse(&lone).unwrap_err(),
            format!("topology file: unexpected end of hex escape at {}", place_end(&lone, "\\ud83d\""))
        );
        let no_id = one_node(r#"{"kind": "gpu"}"#);
        assert_eq!(
            Topo::parse(&no_id).unwrap_err(),
            format!("topology file: missing field `id` at {}", place_end(&no_id, "{\"kind\": \"gpu\"}"))
        );
        // Cut anywhere, a fixture is refused at the end of what is left.
        for cut in [1, DGX.len() / 3, DGX.len() / 2, DGX.len() - 3] {
            let text = &DGX[..cut];
            let line = text.lines().count().max(1);
            let column = text.rsplit('\n').next().unwrap().chars().count();
            let e = Topo::parse(text).unwrap_err();
            assert!(e.starts_with("topology file: EOF while parsing"), "{cut}: {e}");
            assert!(e.ends_with(&format!(" at line {line} column {column}")), "{cut}: {e}");
        }
        let trailing = "{\"oxccl_topo\": 1, \"hosts\": []} {}";
        assert_eq!(
            Topo::parse(trailing).unwrap_err(),
            format!("topology file: trailing characters at {}", place_end(trailing, "} {"))
        );
    }
}
