use super::*;
use crate::topo::Topo;

const DGX16: &str = include_str!("../../../../fixtures/topo/dgx-h100-x16.json");
const PCIE16: &str = include_str!("../../../../fixtures/topo/pcie-4gpu-2nic-x16.json");
const DGX: &str = include_str!("../../../../fixtures/topo/dgx-h100.json");

fn model(text: &str, ranks: usize) -> Model {
    Model::from_topo(&Topo::parse(text).unwrap(), ranks).unwrap()
}

/// The largest size (power of two) at which all-reduce picks Tree.
fn last_tree(m: &Model) -> usize {
    let en = Enabled::default();
    explain_sizes()
        .into_iter()
        .filter(|&b| m.choose(RingColl::AllReduce, b, &en).unwrap().algo == Algo::Tree)
        .max()
        .unwrap_or(0)
}

#[test]
fn dgx_cluster_picks_tree_for_small_all_reduce_and_ring_from_256_mib() {
    let m = model(DGX16, 128);
    assert_eq!((m.nranks, m.nhosts, m.intra_name.as_str(), m.ll128), (128, 16, "NVL", true));
    let en = Enabled::default();
    for b in explain_sizes() {
        let c = m.choose(RingColl::AllReduce, b, &en).unwrap();
        if b <= 1 << 20 {
            assert_eq!(c.algo, Algo::Tree, "{b} B: {c:?}");
        }
        if b >= 256 << 20 {
            assert_eq!(c.algo, Algo::Ring, "{b} B: {c:?}");
        }
    }
    let last = last_tree(&m);
    assert!((1 << 20..256 << 20).contains(&last), "DGX×16 last Tree size {last}");
    // Small calls use one channel, large ones many.
    assert_eq!(m.choose(RingColl::AllReduce, 8, &en).unwrap().channels, 1);
    assert!(m.choose(RingColl::AllReduce, 1 << 30, &en).unwrap().channels >= 2);
}

#[test]
fn the_pcie_cluster_switches_to_ring_earlier() {
    let d = model(DGX16, 128);
    let p = model(PCIE16, 64);
    assert_eq!((p.nhosts, p.intra_name.as_str(), p.ll128), (16, "SYS", false));
    let en = Enabled::default();
    assert_eq!(p.choose(RingColl::AllReduce, 8, &en).unwrap().algo, Algo::Tree);
    assert!(last_tree(&p) * 8 <= last_tree(&d), "PCIe last tree {} vs DGX {}", last_tree(&p), last_tree(&d));
    // LL128 is never chosen where the NIC sits on the host bridge.
    for b in explain_sizes() {
        assert_ne!(p.choose(RingColl::AllReduce, b, &en).unwrap().proto, Proto::LL128, "{b}");
    }
}

#[test]
fn one_host_prefers_the_ring_for_bandwidth_and_protocols_follow_size() {
    let m = model(DGX, 8);
    let en = Enabled::default();
    let small = m.choose(RingColl::AllReduce, 8, &en).unwrap();
    let large = m.choose(RingColl::AllReduce, 1 << 30, &en).unwrap();
    assert_eq!(small.proto, Proto::LL, "{small:?}");
    assert_eq!((large.algo, large.proto), (Algo::Ring, Proto::Simple), "{large:?}");
    // Only all-reduce has a tree; Hier needs several hosts (the device path runs none yet).
    for c in [RingColl::AllGather, RingColl::ReduceScatter, RingColl::Broadcast, RingColl::Reduce] {
        let cands = m.candidates(c, 1 << 20);
        assert!(
            cands.iter().all(|e| e.algo == Algo::Ring || (e.algo == Algo::Hier && e.us.is_infinite())),
            "{c}"
        );
    }
    let text = m.explain_text(RingColl::AllReduce, &explain_sizes(), &en);
    assert_eq!(text.lines().count(), 3 + 30, "{text}");
    assert!(text.contains("Tree/LL") && text.contains("choice"), "{text}");
}

#[test]
fn nccl_algo_and_proto_syntax() {
    let e = Enabled::parse(Some("ring;allreduce:tree,ring"), Some("LL,Simple;allreduce:^LL")).unwrap();
    assert!(e.allows(RingColl::AllGather, Algo::Ring, Proto::LL));
    assert!(!e.allows(RingColl::AllGather, Algo::Tree, Proto::Simple));
    assert!(e.allows(RingColl::AllReduce, Algo::Tree, Proto::LL128));
    assert!(!e.allows(RingColl::AllReduce, Algo::Tree, Proto::LL));
    assert!(!e.allows(RingColl::Broadcast, Algo::Ring, Proto::LL128));
    let e = Enabled::parse(Some("^tree"), Some("^LL128")).unwrap();
    assert!(!e.allows(RingColl::AllReduce, Algo::Tree, Proto::Simple));
    assert!(e.allows(RingColl::AllReduce, Algo::Ring, Proto::LL));
    assert!(!e.allows(RingColl::AllReduce, Algo::Ring, Proto::LL128));
    // Case does not matter; NCCL's other algorithm names are accepted (and never run).
    let e = Enabled::parse(Some("RING,NVLS,CollNetDirect,PAT"), Some("simple")).unwrap();
    assert!(e.allows(RingColl::AllReduce, Algo::Ring, Proto::Simple));
    for (a, p, needle) in [
        (Some("trie"), None, "unknown name \"trie\""),
        (None, Some("LL256"), "unknown name \"LL256\""),
        (Some("allreduse:ring"), None, "unknown collective \"allreduse\""),
        (Some("ring;tree"), None, "only the first part"),
    ] {
        let err = Enabled::parse(a, p).unwrap_err();
        assert!(err.contains(needle), "{a:?} {p:?}: {err}");
    }
}

#[test]
fn an_override_that_cannot_apply_says_why() {
    let m = model(DGX, 8);
    let tree = Enabled::parse(Some("tree"), None).unwrap();
    let e = m.choose(RingColl::AllGather, 1 << 20, &tree).unwrap_err().0;
    assert!(e.contains("NCCL_ALGO=tree") && e.contains("Tree runs only all-reduce"), "{e}");
    assert_eq!(m.choose(RingColl::AllReduce, 1 << 20, &tree).unwrap().algo, Algo::Tree);
    let p = model(PCIE16, 64);
    let ll128 = Enabled::parse(None, Some("LL128")).unwrap();
    let e = p.choose(RingColl::AllReduce, 4096, &ll128).unwrap_err().0;
    assert!(e.contains("128-byte stores in order"), "{e}");
    let two = model(DGX, 2);
    let e = two.choose(RingColl::AllReduce, 8, &tree).unwrap_err().0;
    assert!(e.contains("at least 3 ranks"), "{e}");
    let nvls = Enabled::parse(Some("nvls"), None).unwrap();
    let e = m.choose(RingColl::AllReduce, 8, &nvls).unwrap_err().0;
    assert!(e.contains("enables no algorithm"), "{e}");
}

#[test]
fn cpu_models_pick_direct_on_one_host_and_price_the_network_across_hosts() {
    let c = CpuCosts {
        copy_gbs: 8.0,
        hop_us: 0.3,
        tcp_us: 20.0,
        tcp_gbs: 2.4,
        ll_gbs: 1.3,
        ll128_gbs: 5.7,
        measured: true,
    };
    let en = Enabled::default();
    // One host with the direct path: Direct at every size.
    let m = Model::cpu(4, 1, &c, true, 1, 1);
    let s = Selector::tuned(&m, &en, 4096);
    assert_eq!(s.all_reduce, vec![(usize::MAX, Algo::Direct)]);
    // Without it: one-shot for small calls, the ring beyond.
    let m = Model::cpu(4, 1, &c, false, 1, 1);
    let s = Selector::tuned(&m, &en, 4096);
    assert_eq!(s.all_reduce.first().map(|x| x.1), Some(Algo::Direct));
    assert_eq!(s.all_reduce.last().map(|x| x.1), Some(Algo::Ring));
    assert_eq!(s.all_reduce_algo(1 << 20), Some(Algo::Ring));
    // The same host with shared memory off: every hop is a socket's, priced so (the
    // explanation names TCP), and one-shot serves up to the sockets' bound.
    let shm_model = Model::cpu(4, 1, &c, false, 1, 1);
    let m = shm_model.clone().over_sockets();
    assert_eq!((m.intra, m.intra_name.as_str()), (m.net, "TCP"));
    let direct_8k = |m: &Model| m.estimate(RingColl::AllReduce, 8 << 10, Algo::Direct, Proto::Simple, 1);
    assert_eq!(direct_8k(&shm_model), None, "8 KiB is above the shared-memory one-shot bound");
    assert!(direct_8k(&m).unwrap() > c.tcp_us, "{:?}", direct_8k(&m));
    let s = Selector::tuned(&m, &en, crate::tuning::ONE_SHOT_NET_MAX_BYTES);
    assert_eq!(s.all_reduce_algo(crate::tuning::ONE_SHOT_NET_MAX_BYTES), Some(Algo::Direct), "{s:?}");
    assert_eq!(s.all_reduce_algo(crate::tuning::ONE_SHOT_NET_MAX_BYTES + 1), Some(Algo::Ring), "{s:?}");
    // 16 hosts of one rank: one-shot is out (16 ranks), the tree wins small calls on its
    // log-depth latency and the ring wins large ones.
    let m = Model::cpu(16, 16, &c, false, 1, 2);
    let s = Selector::tuned(&m, &en, 4096);
    assert_eq!(s.all_reduce_algo(8), Some(Algo::Tree), "{s:?}");
    assert_eq!(s.all_reduce_algo(1 << 30), Some(Algo::Ring), "{s:?}");
    // NCCL_ALGO restricts the model's choice. Every protocol runs on CPU connections, but LL
    // and LL128 pay their measured encoding on top of the copies at the same hand-off
    // latency, so the tuner takes Simple; NCCL_PROTO forces the others.
    let ring = Enabled::parse(Some("ring"), None).unwrap();
    let tuned = Selector::tuned(&m, &ring, 4096);
    assert_eq!(tuned.all_reduce, vec![(usize::MAX, Algo::Ring)]);
    assert!(
        m.candidates(RingColl::AllReduce, 8)
            .iter()
            .all(|e| e.us.is_finite() || e.algo == Algo::Direct || e.algo == Algo::Hier),
        "{:?}",
        m.candidates(RingColl::AllReduce, 8)
    );
    assert!(m.proto_eff[0] < m.proto_eff[1] && m.proto_eff[1] < 1.0, "{:?}", m.proto_eff);
    for c in RingColl::ALL {
        assert_eq!(tuned.protos[c as usize], vec![(usize::MAX, Proto::Simple)], "{c}");
    }
    let ll = Enabled::parse(Some("ring"), Some("LL;allgather:LL128")).unwrap();
    let forced = Selector::tuned(&m, &ll, 4096);
    assert_eq!(forced.proto_for(RingColl::AllReduce, 1 << 20), Proto::LL);
    assert_eq!(forced.proto_for(RingColl::AllGather, 8), Proto::LL128);
    // The prediction grows with the measured latency.
    let slow = Model::cpu(16, 16, &CpuCosts { tcp_us: 200.0, ..c }, false, 1, 2);
    assert!(
        slow.estimate(RingColl::AllReduce, 8, Algo::Ring, Proto::Simple, 1).unwrap()
            > m.estimate(RingColl::AllReduce, 8, Algo::Ring, Proto::Simple, 1).unwrap() * 5.0
    );
}

/// Several hosts with two ranks each: large all-reduces, all-gathers and reduce-scatters go
/// hierarchical (a host's NIC carries 2(H−1)/H of the buffer instead of 2(N−1)/N), small
/// all-reduces stay one-shot; NCCL_ALGO=ring keeps the flat ring; hosts holding different
/// numbers of ranks never get Hier.
#[test]
fn several_hosts_of_several_ranks_go_hierarchical() {
    let c = CpuCosts { tcp_us: 40.0, tcp_gbs: 0.125, ..CpuCosts::default() };
    let en = Enabled::default();
    let m = Model::cpu(8, 4, &c, false, 1, 2);
    let s = Selector::tuned(&m, &en, 4096);
    // Small calls too: each host's first rank alone exchanges with the others (3 messages
    // through each host's cores instead of the one-shot's 2 × 6).
    assert_eq!(s.all_reduce_algo(8), Some(Algo::Hier), "{s:?}");
    let direct = m.estimate(RingColl::AllReduce, 8, Algo::Direct, Proto::Simple, 1).unwrap();
    let small = m.estimate(RingColl::AllReduce, 8, Algo::Hier, Proto::Simple, 1).unwrap();
    assert!(small < direct, "hier {small} µs, one-shot {direct} µs");
    // One rank per host: no hierarchy, the one-shot.
    let flat = Model::cpu(4, 4, &c, false, 1, 2);
    assert_eq!(Selector::tuned(&flat, &en, 4096).all_reduce_algo(8), Some(Algo::Direct));
    assert_eq!(s.all_reduce_algo(16 << 20), Some(Algo::Hier), "{s:?}");
    assert!(s.hier[RingColl::AllGather as usize] && s.hier[RingColl::ReduceScatter as usize], "{s:?}");
    assert!(!s.hier[RingColl::Broadcast as usize] && !s.hier[RingColl::Reduce as usize], "{s:?}");
    let hier = m.estimate(RingColl::AllReduce, 16 << 20, Algo::Hier, Proto::Simple, 2).unwrap();
    let ring = m.estimate(RingColl::AllReduce, 16 << 20, Algo::Ring, Proto::Simple, 2).unwrap();
    // The NIC's share: 2(H−1)/H against 2(N−1)/N, 6/7 for 4 hosts × 2, plus the host's part.
    assert!(hier < ring * 0.92, "hier {hier} µs, ring {ring} µs");
    let flat = Selector::tuned(&m, &Enabled::parse(Some("ring"), None).unwrap(), 4096);
    assert_eq!(flat.all_reduce, vec![(usize::MAX, Algo::Ring)]);
    assert!(flat.hier.iter().all(|h| !h), "{flat:?}");
    let forced = Selector::tuned(&m, &Enabled::parse(Some("hier"), None).unwrap(), 4096);
    assert_eq!(forced.all_reduce, vec![(usize::MAX, Algo::Hier)]);
    assert!(forced.refuse[RingColl::Broadcast as usize]
        .as_deref()
        .is_some_and(|r| r.contains("Hier runs only")));
    let uneven = Model { hosts_uniform: false, ..m.clone() };
    let why = uneven.unavailable(RingColl::AllReduce, Algo::Hier, Proto::Simple).unwrap();
    assert!(why.contains("same number"), "{why}");
    assert_ne!(Selector::tuned(&uneven, &en, 4096).all_reduce_algo(16 << 20), Some(Algo::Hier));
    let explained = m.explain_text(RingColl::AllReduce, &explain_sizes(), &en);
    assert!(explained.contains("Hier/Simple"), "{explained}");
}

/// The link between hosts decides where the small hierarchical plan stops and which plan runs
/// mid-size: measured here at 4 hosts × 2 ranks over 1 Gbit/s (tbf), the leaders' exchange puts
/// 3 copies of a 32 KiB buffer through each NIC (788 µs) where the pieces' rings put 1.5
/// (630 µs), and Tree puts 2 (64-128 KiB at 1.33 × the bound) — a model that takes the
/// loopback's TCP for the link picked both.
#[test]
fn the_link_between_hosts_sets_the_small_plan_and_keeps_tree_off() {
    let c = CpuCosts { tcp_us: 20.0, tcp_gbs: 1.2, ..CpuCosts::default() };
    let en = Enabled::default();
    let m = Model::cpu(8, 4, &c, false, 1, 2).with_link(0.125, 1);
    assert_eq!((m.net.channel_gbs, m.net.limit_gbs), (0.125, 0.125));
    let s = Selector::tuned(&m, &en, 32 << 10);
    assert!(s.hier_small_max >= 8 && s.hier_small_max < 32 << 10, "{s:?}");
    for b in [32 << 10, 64 << 10, 128 << 10, 256 << 10, 16 << 20] {
        assert_eq!(s.all_reduce_algo(b), Some(Algo::Hier), "{b}: {s:?}");
    }
    // Two rails: a host carries twice, one stream still one rail.
    let two = Model::cpu(8, 4, &c, false, 1, 2).with_link(0.125, 2);
    assert_eq!((two.net.channel_gbs, two.net.limit_gbs), (0.125, 0.25));
    // No speed known: the model as measured.
    assert_eq!(Model::cpu(8, 4, &c, false, 1, 2).with_link(0.0, 1), Model::cpu(8, 4, &c, false, 1, 2));
    // Two hosts: the leaders' exchange carries one copy, as the rings do; it serves more.
    let m2 = Model::cpu(4, 2, &c, false, 1, 2).with_link(0.125, 1);
    let s2 = Selector::tuned(&m2, &en, 32 << 10);
    assert!(s2.hier_small_max > s.hier_small_max, "{s2:?} against {s:?}");
    // NCCL_ALGO=hier is tuned alike; without the model (OXCCL_TUNER=0) the small plan serves
    // wherever it applies.
    let hier = Enabled::parse(Some("hier"), None).unwrap();
    let tuned = Selector::tuned(&m, &hier, 32 << 10).hier_small_max;
    assert!(tuned >= s.hier_small_max && tuned < 32 << 10, "{tuned}");
    assert_eq!(Selector::forced(&hier, 8, 32 << 10).unwrap().hier_small_max, usize::MAX);
}
