//! The root's tests: rejections on the wire, and its throughput (a benchmark run by hand).

use super::super::{decode_reject, Join};
use super::*;
use std::io::{Read, Write};

#[test]
fn every_rejection_survives_the_wire() {
    let all = [
        RejectReason::WrongSecret,
        RejectReason::WorldSizeMismatch { rank: 3, size: 4, root_size: 5 },
        RejectReason::DuplicateRank { rank: 1, first: "a:1".into(), second: "b:2".into() },
        RejectReason::RankOutOfRange { rank: 9, size: 4 },
        RejectReason::Version { ours: 4, theirs: 3 },
        RejectReason::RootOutOfDescriptors { joined: 1021, limit: 1024 },
        RejectReason::RootRankFailed { rank: 0, reason: "create the control block: oops".into() },
        RejectReason::WrongRoot { rank: 5, root: 1, its_root: 2, nroots: 4 },
        RejectReason::MixedIds { index: 3, by: "rank 7".into(), theirs: "ab".into(), ours: "cd".into() },
        RejectReason::RootFailed { root: 2, addr: "10.0.0.1:5".into(), why: "gone".into() },
    ];
    for r in all {
        assert_eq!(decode_reject(&encode_reject(&r)).unwrap(), r);
    }
}

fn read_frame_raw(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut h = [0u8; 8];
    s.read_exact(&mut h).unwrap();
    let mut b = vec![0u8; u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize];
    s.read_exact(&mut b).unwrap();
    (h[4], b)
}

/// The root alone at sizes a process can hold here (each join is a connection, two
/// descriptors in this one process): how long from the first join to the last rank's
/// answer, dense against sparse. A benchmark, run by hand:
/// `OXCCL_ROOT_BENCH=1000,2000,4000,8000 cargo test --release -p oxccl --lib root_throughput -- --include-ignored --nocapture`
#[test]
#[ignore]
fn root_throughput() {
    let sizes = super::super::tests::bench_sizes("OXCCL_ROOT_BENCH", "1000,2000,4000");
    // The table's codec at 100,000 entries: what each relay hop pays besides the wire.
    let (entry, decode_us) = super::super::table_codec_probe(100_000);
    println!("# table of 100000 entries: {entry:.1} B/entry, decode {decode_us:.3} us/entry");
    println!("# ranks  mode    joins sent (ms)  all answered (ms)  root bytes out  us/join");
    for n in sizes {
        for sparse in [false, true] {
            if !sparse && n > 4000 {
                continue;
            }
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let secret = [7u8; 32];
            let log = Logger::new(&oxccl_core::config::Config::default(), None);
            spawn(listener, secret, log).unwrap();
            let t0 = Instant::now();
            let clients = 2;
            let hs: Vec<_> = (0..clients)
                .map(|c| {
                    std::thread::spawn(move || {
                        let mine: Vec<usize> = (c..n).step_by(clients).collect();
                        let mut socks = Vec::with_capacity(mine.len());
                        for &r in &mine {
                            let mut s = TcpStream::connect(addr).unwrap();
                            let join = Join {
                                version: PROTOCOL_VERSION,
                                secret,
                                rank: r as u32,
                                nranks: n as u32,
                                sparse_from: if sparse { 2 } else { 0 },
                                place: super::super::roots::Place::single(addr, &secret),
                                info: PeerInfo {
                                    rank: Rank(r as u32),
                                    pid: 1000 + r as u32,
                                    host_id: (r / 8) as u64,
                                    hostname: format!("node{:05}", r / 8),
                                    addr: SocketAddr::from(([10, 0, (r >> 8) as u8, r as u8], 40000)),
                                    unix_name: [1; 16],
                                    costs: Default::default(),
                                    cuda_device: -1,
                                    rails: Vec::new(),
                                    machine: 0,
                                    nic_gbs: 0.0,
                                },
                            };
                            s.write_all(&super::super::frame(kind::JOIN, &join.encode())).unwrap();
                            socks.push(s);
                        }
                        let sent = t0.elapsed();
                        let mut bytes = 0usize;
                        for (s, &r) in socks.iter_mut().zip(&mine) {
                            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                            loop {
                                let (k, b) = read_frame_raw(s);
                                bytes += 8 + b.len();
                                if k == kind::TABLE || (k == kind::ROUTE && sparse && r != 0) {
                                    break;
                                }
                            }
                        }
                        (sent, t0.elapsed(), bytes)
                    })
                })
                .collect();
            let res: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            let sent = res.iter().map(|r| r.0).max().unwrap();
            let done = res.iter().map(|r| r.1).max().unwrap();
            let bytes: usize = res.iter().map(|r| r.2).sum();
            println!(
                "  {n:>6}  {:<6}  {:>15.1}  {:>17.1}  {:>14}  {:>7.1}",
                if sparse { "sparse" } else { "dense" },
                sent.as_secs_f64() * 1e3,
                done.as_secs_f64() * 1e3,
                bytes,
                done.as_secs_f64() * 1e6 / n as f64
            );
        }
    }
}
