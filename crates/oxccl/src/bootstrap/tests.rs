//! Tests of the bootstrap: codecs, frames, joins, the control mesh, failure word.

use super::*;
use oxccl_core::contract::Sig;

fn info(r: u32, addr: SocketAddr) -> PeerInfo {
    PeerInfo {
        rank: Rank(r),
        pid: 0,
        host_id: 0,
        hostname: "vm".into(),
        addr,
        unix_name: [0; 16],
        costs: Default::default(),
        cuda_device: -1,
        rails: Vec::new(),
        machine: 0,
        nic_gbs: 0.0,
    }
}

/// Each rank's CUDA device travels in the peer table (-1: not known); a device below -1
/// is refused as malformed.
#[test]
fn the_peer_table_carries_each_ranks_cuda_device() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let table: Vec<PeerInfo> = [-1, 0, 7]
        .iter()
        .enumerate()
        .map(|(r, &d)| PeerInfo { cuda_device: d, ..info(r as u32, addr) })
        .collect();
    assert_eq!(decode_table(&encode_table(&table)).unwrap(), table);
    // Rails travel too, v4 and v6, in order.
    let rails = vec!["10.1.0.1".parse().unwrap(), "fd00::2".parse().unwrap()];
    let with =
        vec![PeerInfo { rails: rails.clone(), machine: 7, nic_gbs: 1.25, ..info(0, addr) }, info(1, addr)];
    let back = decode_table(&encode_table(&with)).unwrap();
    assert_eq!((&back[0].rails, back[0].machine, back[1].machine), (&rails, 7, 0));
    assert_eq!((back[0].nic_gbs, back[1].nic_gbs), (1.25, 0.0));
    let bad = encode_table(&[PeerInfo { cuda_device: -2, ..info(0, addr) }]);
    let e = decode_table(&bad).unwrap_err().to_string();
    assert!(e.contains("CUDA device") && e.contains("-2"), "{e}");
    for v in [-1.0, f64::NAN, f64::INFINITY] {
        let e =
            decode_table(&encode_table(&[PeerInfo { nic_gbs: v, ..info(0, addr) }])).unwrap_err().to_string();
        assert!(e.contains("link speed"), "{v}: {e}");
    }
}

/// A sparse rendezvous of 5 ranks (relay tree 0 -> 1, 2; 1 -> 3, 4) where rank 1 joins
/// and is gone before (`early`) or just after (`!early`) rank 0 relays the table to it.
/// Returns each real rank's result and how long its join took.
/// Per rank: its number, what joining gave (table length, sparse) and how long it took.
type JoinOutcome = (u32, Result<(usize, bool)>, Duration);

/// A service's desk for tests that send it no same-host request: refuses everything.
struct NoDesk;

impl service::HostDesk for NoDesk {
    fn answer(&self, _: &service::Visit<'_>, _: &[u8], _: Vec<std::os::fd::OwnedFd>) -> bool {
        false
    }
}

fn relay_with_rank1_gone(early: bool) -> Vec<JoinOutcome> {
    let secret = [9u8; 32];
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let root_addr = listener.local_addr().unwrap();
    let quiet = crate::log::Logger::new(&oxccl_core::config::Config::default(), None);
    root::spawn(listener, secret, quiet).unwrap();
    let n = 5;
    let real = |r: u32| {
        std::thread::spawn(move || {
            let doorbell = Arc::new(crate::sys::fd::EventFd::new().unwrap());
            let ctl = Arc::new(NoDesk);
            let log = crate::log::Logger::new(&oxccl_core::config::Config::default(), Some(r));
            let svc =
                Service::start("127.0.0.1".parse().unwrap(), &[], Rank(r), n, secret, doorbell, ctl, log)
                    .unwrap();
            let me = info(r, svc.addr);
            let w = Waiter::new(Rank(r), Some(Duration::from_secs(30)), Arc::new(AtomicBool::new(false)))
                .watching(&svc.mailbox);
            let t = Instant::now();
            let place = super::roots::Place::single(root_addr, &secret);
            let rv = Rendezvous {
                root: root_addr,
                secret: &secret,
                size: n,
                sparse_from: 2,
                place: &place,
                roots: &[root_addr],
            };
            let got = join(rv, &me, &svc.mailbox, &w, &log);
            // The service lives on (as in a rank whose init went on) until all are done.
            (r, got.map(|j| (j.peers.len(), j.route.sparse)), t.elapsed(), svc)
        })
    };
    let hs: Vec<_> = [0, 2, 3, 4].into_iter().map(real).collect();
    // Rank 1: a listener as its service (closed at once when `early`), joins, hears its
    // route, and (unless early) takes rank 0's relay and is gone.
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = fake.local_addr().unwrap();
    let fake = if early {
        drop(fake);
        None
    } else {
        Some(fake)
    };
    let w1 = Waiter::new(Rank(1), Some(Duration::from_secs(10)), Arc::new(AtomicBool::new(false)));
    let mut s = connect_retry(root_addr, &w1, "test", &[]).unwrap();
    let req = Join {
        version: PROTOCOL_VERSION,
        secret,
        rank: 1,
        nranks: n as u32,
        sparse_from: 2,
        place: super::roots::Place::single(root_addr, &secret),
        info: info(1, fake_addr),
    };
    write_frame(&mut s, kind::JOIN, &req.encode()).unwrap();
    let route = loop {
        let (k, p) = read_frame(&mut s, &w1, "test", &[]).unwrap();
        if k == kind::ROUTE {
            break Route::decode(&p).unwrap();
        }
    };
    assert!(route.sparse && route.ancestors.len() == 1, "{route:?}");
    if let Some(f) = fake {
        // Take the whole relay (hello, then the table) before going: a close before rank 0
        // has written it all would make rank 0 find rank 1 gone and relay past it.
        let (mut relay, _) = f.accept().unwrap();
        let (k, _) = read_frame(&mut relay, &w1, "test: the relay's hello", &[]).unwrap();
        assert_eq!(k, kind::HELLO);
        let (k, _) = read_frame(&mut relay, &w1, "test: the relayed table", &[]).unwrap();
        assert_eq!(k, kind::MSG);
        drop(relay);
    }
    drop(s);
    let all: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    all.into_iter().map(|(r, got, took, _svc)| (r, got, took)).collect()
}

/// Rank 1 is gone before rank 0 relays: rank 0 relays past it, so every live rank
/// (its children 3 and 4 too) gets the whole table; no join fails.
#[test]
fn a_relay_tree_routes_around_a_rank_that_is_gone() {
    for (r, got, _) in relay_with_rank1_gone(true) {
        assert_eq!(got.unwrap_or_else(|e| panic!("rank {r}: {e}")), (5, true), "rank {r}");
    }
}

/// Rank 1 took rank 0's relay and is gone before passing it on: its children (3, 4),
/// whose ancestor 0 lives, wait out the orphan grace and fail naming rank 1; ranks 0
/// and 2 have their tables.
#[test]
fn a_relay_parent_that_dies_with_the_table_is_named_by_its_children() {
    for (r, got, took) in relay_with_rank1_gone(false) {
        match r {
            0 | 2 => assert_eq!(got.unwrap_or_else(|e| panic!("rank {r}: {e}")), (5, true)),
            _ => {
                let e = got.expect_err("rank 1 never relayed to this rank");
                assert!(matches!(&e, Error::PeerClosed { peer: Rank(1), .. }), "rank {r}: {e}");
                let grace = Duration::from_millis(ORPHAN_GRACE_MS);
                assert!(took < grace + Duration::from_secs(3), "rank {r}: {took:?}");
            }
        }
    }
}

/// A send to a peer that takes the connection but never reads blocks once the socket's
/// buffers fill. Its waiter probes stuck peers over these same control connections, whose
/// lock the send holds: the send must still end at its deadline with a timeout naming the
/// peer (it once waited forever on its own lock), and a probe meanwhile must not wait on
/// the lock without bound.
#[test]
fn a_send_stuck_on_a_peer_that_never_reads_ends_at_its_deadline() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peers = Arc::new(vec![info(0, "127.0.0.1:9".parse().unwrap()), info(1, l.local_addr().unwrap())]);
    let mailbox = Arc::new(Mailbox::default());
    let boot = Arc::new(Bootstrap::new(Rank(0), [7; 32], peers, mailbox.clone(), None, HashMap::new()));
    // The peer accepts and holds the connection open, reading nothing.
    let holder = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_secs(4));
        drop(s);
    });
    let abort = Arc::new(AtomicBool::new(false));
    let w = Waiter::new(Rank(0), Some(Duration::from_millis(1500)), abort).watching(&mailbox).probing(
        &boot,
        Sig::NONE,
        false,
    );
    let t = Instant::now();
    let big = vec![0u8; 64 << 20];
    let err = boot.send(Rank(1), 5, &big, &w).expect_err("a send nobody reads cannot finish");
    let took = t.elapsed();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("bootstrap send"), "{err}");
    assert!(took < Duration::from_millis(3500), "the send ended {took:?} after it began: {err}");
    // The failed send dropped its half-written connection; a probe while another thread
    // holds the lock gives up at its own bound.
    let guard = boot.out.lock().unwrap();
    let t = Instant::now();
    assert!(matches!(boot.probe(Rank(1), Duration::from_millis(100)), Probed::NoAnswer));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    drop(guard);
    holder.join().unwrap();
}

#[test]
fn join_status_round_trips_and_bounds_its_list() {
    let s = JoinStatus { missing: vec![Rank(1), Rank(7)], roots: vec![0, 3] };
    assert_eq!(JoinStatus::decode(&s.encode()).unwrap(), s);
    // More than MAX_LISTED missing ranks: the first MAX_LISTED are sent.
    let many = JoinStatus { missing: (0..100).map(Rank).collect(), roots: (0..100).collect() };
    let back = JoinStatus::decode(&many.encode()).unwrap();
    assert_eq!(back.missing, (0..JoinStatus::MAX_LISTED as u32).map(Rank).collect::<Vec<_>>());
    assert_eq!(back.roots, (0..JoinStatus::MAX_LISTED as u32).collect::<Vec<_>>());
    // A frame claiming more, or with trailing bytes, is refused.
    let mut w = Writer::new();
    w.u32(65);
    assert!(JoinStatus::decode(&w.finish()).is_err());
    let mut b = s.encode();
    b.push(0);
    assert!(JoinStatus::decode(&b).is_err());
}

/// A benchmark's sizes: the comma-separated list in `var`, else `default`.
pub(crate) fn bench_sizes(var: &str, default: &str) -> Vec<usize> {
    std::env::var(var).unwrap_or_else(|_| default.into()).split(',').filter_map(|v| v.parse().ok()).collect()
}

/// Root and relay together: `n` ranks as threads, each with its own service, all join at
/// once (services started first), dense against sparse; how long until the last rank has
/// the table. A benchmark, run by hand:
/// `OXCCL_RELAY_BENCH=256,512,1024,2048 cargo test --release -p oxccl --lib relay_throughput -- --include-ignored --nocapture`
#[test]
#[ignore]
fn relay_throughput() {
    use std::sync::Barrier;
    let sizes = bench_sizes("OXCCL_RELAY_BENCH", "256,512,1024");
    println!("# ranks  mode    all have the table (ms)  depth  slowest rank's join (ms)");
    for n in sizes {
        for sparse_from in [0usize, 2] {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let root_addr = listener.local_addr().unwrap();
            let secret = [5u8; 32];
            let log = crate::log::Logger::new(&oxccl_core::config::Config::default(), None);
            root::spawn(listener, secret, log).unwrap();
            let (ready, go) = (Arc::new(Barrier::new(n + 1)), Arc::new(Barrier::new(n + 1)));
            let hs: Vec<_> = (0..n as u32)
                .map(|r| {
                    let (ready, go) = (ready.clone(), go.clone());
                    std::thread::Builder::new()
                        .stack_size(512 << 10)
                        .spawn(move || {
                            let doorbell = Arc::new(crate::sys::fd::EventFd::new().unwrap());
                            let ctl = Arc::new(NoDesk);
                            let log =
                                crate::log::Logger::new(&oxccl_core::config::Config::default(), Some(r));
                            let ip = "127.0.0.1".parse().unwrap();
                            let svc =
                                Service::start(ip, &[], Rank(r), n, secret, doorbell, ctl, log).unwrap();
                            let me = info(r, svc.addr);
                            let w = Waiter::new(
                                Rank(r),
                                Some(Duration::from_secs(120)),
                                Arc::new(AtomicBool::new(false)),
                            )
                            .watching(&svc.mailbox);
                            ready.wait();
                            let t = Instant::now();
                            let place = super::roots::Place::single(root_addr, &secret);
                            let rv = Rendezvous {
                                root: root_addr,
                                secret: &secret,
                                size: n,
                                sparse_from,
                                place: &place,
                                roots: &[root_addr],
                            };
                            let j = join(rv, &me, &svc.mailbox, &w, &log).unwrap();
                            let took = t.elapsed();
                            assert_eq!(j.peers.len(), n);
                            assert!(j.peers.iter().enumerate().all(|(i, p)| p.rank.idx() == i));
                            go.wait();
                            (took, svc, j.links)
                        })
                        .unwrap()
                })
                .collect();
            ready.wait();
            let t0 = Instant::now();
            go.wait();
            let all = t0.elapsed();
            let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            let slowest = out.iter().map(|o| o.0).max().unwrap_or_default();
            if std::env::var_os("OXCCL_RELAY_LEVELS").is_some() && sparse_from != 0 {
                let mut lv = vec![(0.0f64, 0usize); 32];
                for (r, o) in out.iter().enumerate() {
                    let l = (usize::BITS - (r + 1).leading_zeros() - 1) as usize;
                    lv[l].0 += o.0.as_secs_f64() * 1e3;
                    lv[l].1 += 1;
                }
                let means: Vec<String> =
                    lv.iter().filter(|l| l.1 > 0).map(|l| format!("{:.1}", l.0 / l.1 as f64)).collect();
                println!("# mean join (ms) by relay level: {}", means.join(" "));
            }
            let depth = usize::BITS - n.leading_zeros() - 1;
            println!(
                "  {n:>6}  {:<6}  {:>23.1}  {:>5}  {:>24.1}",
                if sparse_from == 0 { "dense" } else { "sparse" },
                all.as_secs_f64() * 1e3,
                if sparse_from == 0 { 0 } else { depth },
                slowest.as_secs_f64() * 1e3
            );
        }
    }
}
