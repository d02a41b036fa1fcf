//! The hierarchical plans (`plan/hier.rs`) run in memory for many host layouts (hosts × ranks
//! per host, hosts contiguous or interleaved in rank order), counts, chunk sizes, channel
//! counts and FIFO depths, out of place and in place, checked element by element; and the
//! layouts where they do not apply fall back to the flat plans.

use super::*;
use crate::contract::Seqs;
use crate::dtype::{DataType, ReduceOp};
use crate::plan::{job_connections, plan_group_signed, BufId, Geometry, Job, Loc, OpSpec};
use crate::tuner::{Algo, Selector};
use std::sync::Arc;

const SEND: Loc = Loc::start(BufId(0));
const RECV: Loc = Loc::start(BufId(1));
const COUNTS: [usize; 6] = [0, 1, 3, 17, 100, 257];

fn input(r: usize, i: usize) -> u32 {
    ((r as u32).wrapping_mul(1_000_003).wrapping_add((i as u32).wrapping_mul(7919)).wrapping_add(13))
        % 100_000
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// (hosts, ranks per host, interleaved: rank r on host r mod hosts).
const LAYOUTS: [(usize, usize, bool); 7] =
    [(2, 2, false), (2, 2, true), (3, 2, false), (2, 3, true), (4, 2, false), (2, 4, false), (3, 3, true)];

fn geometry(r: usize, hosts: usize, k: usize, interleaved: bool, channels: usize, chunk: usize) -> Geometry {
    let p = hosts * k;
    let mut g = Geometry::simple(rank(r), p, channels, chunk).with_hosts(|q| {
        if interleaved {
            (q % hosts) as u32
        } else {
            (q / k) as u32
        }
    });
    // Pieces of at least 64 bytes: counts of 17 u32s and more are pipelined in 2..16 pieces.
    g.hier_piece_bytes = 64;
    g.select = Some(Arc::new(Selector::always(Algo::Hier)));
    g.cached()
}

/// Off-host peers a job talks to: a hierarchical plan talks only to its cross-ring neighbours.
fn off_host_peers(g: &Geometry, job: &Job) -> usize {
    let me = g.hosts[g.rank.idx()];
    let mut peers: Vec<usize> =
        job_connections(job).iter().map(|(k, _)| k.peer.idx()).filter(|&q| g.hosts[q] != me).collect();
    peers.sort();
    peers.dedup();
    peers.len()
}

fn each_case(mut f: impl FnMut(usize, usize, bool, usize, usize, usize)) {
    for (hosts, k, inter) in LAYOUTS {
        for (chunk, channels) in [(4usize, 1usize), (12, 3), (64, 2)] {
            // Two slots at least, as every ring needs (a ring of two ranks sends before it
            // receives the chunk it forwards).
            for cap in [2usize, 3] {
                f(hosts, k, inter, chunk, channels, cap);
            }
        }
    }
}

#[test]
fn hierarchical_all_reduce_is_exact_for_every_layout() {
    each_case(|hosts, k, inter, chunk, channels, cap| {
        let p = hosts * k;
        for n in COUNTS {
            for (op, in_place) in
                [(ReduceOp::Sum, false), (ReduceOp::Max, true), (ReduceOp::Avg, false), (ReduceOp::Sum, true)]
            {
                let what = format!("hosts={hosts} k={k} inter={inter} chunk={chunk} ch={channels} cap={cap} n={n} {op:?} in_place={in_place}");
                let mut jobs = Vec::new();
                let mut bufs = Vec::new();
                for r in 0..p {
                    let g = geometry(r, hosts, k, inter, channels, chunk);
                    let dst = if in_place { SEND } else { RECV };
                    let ops = [OpSpec::AllReduce { count: n, dtype: DataType::U32, op, src: SEND, dst }];
                    let job = plan_group_signed(&g, &ops, &mut Seqs::new(p), true).unwrap();
                    // Small calls (one-shot sized among the leaders): only each host's first
                    // rank talks to other hosts, to every other host's first rank.
                    let small = n > 0 && n * 4 <= chunk.min(crate::tuning::ONE_SHOT_MAX_BYTES);
                    let leader = g.cache.as_ref().unwrap().groups.as_ref().unwrap().place[r].1 == 0;
                    let pieces = (n * 4 / 64).clamp(1, crate::tuning::HIER_MAX_PIECES);
                    if small {
                        let want = if leader { hosts - 1 } else { 0 };
                        assert_eq!(off_host_peers(&g, &job), want, "{what}: rank {r}'s peers on other hosts");
                    } else {
                        if n >= k * channels * pieces {
                            // Piece j's reduce-scatter, all-reduce and all-gather in phases j..j+2.
                            assert_eq!(job.phases.len(), pieces + 2, "{what}: phases");
                        }
                        assert!(
                            off_host_peers(&g, &job) <= 2,
                            "{what}: rank {r} talks to more than its cross-ring neighbours"
                        );
                    }
                    jobs.push(job);
                    bufs.push(vec![
                        bytes(&(0..n).map(|i| input(r, i)).collect::<Vec<_>>()),
                        bytes(&vec![0xdead_beef; n]),
                    ]);
                }
                run(jobs, &mut bufs, cap).unwrap_or_else(|e| panic!("{what}: {e}"));
                for (r, b) in bufs.iter().enumerate() {
                    let got = u32s(&b[usize::from(!in_place)]);
                    for (i, v) in got.iter().enumerate() {
                        let xs = (0..p).map(|q| input(q, i));
                        let want = match op {
                            ReduceOp::Sum => xs.sum::<u32>(),
                            ReduceOp::Max => xs.max().unwrap(),
                            _ => xs.sum::<u32>() / p as u32,
                        };
                        assert_eq!(*v, want, "{what}: rank {r} elem {i}");
                    }
                }
            }
        }
    });
}

#[test]
fn hierarchical_all_gather_and_reduce_scatter_are_exact_for_every_layout() {
    each_case(|hosts, k, inter, chunk, channels, cap| {
        let p = hosts * k;
        for n in COUNTS {
            for in_place in [false, true] {
                let what = format!("hosts={hosts} k={k} inter={inter} chunk={chunk} ch={channels} cap={cap} n={n} in_place={in_place}");
                // All-gather: in place, the rank's block of the output holds its input.
                let mut jobs = Vec::new();
                let mut bufs = Vec::new();
                for r in 0..p {
                    let g = geometry(r, hosts, k, inter, channels, chunk);
                    let src = if in_place { RECV.at(r * n * 4) } else { SEND };
                    let ops = [OpSpec::AllGather { count: n, dtype: DataType::U32, src, dst: RECV }];
                    let job = plan_group_signed(&g, &ops, &mut Seqs::new(p), true).unwrap();
                    if n > 0 {
                        assert_eq!(job.phases.len(), 2, "{what}: between hosts, then inside");
                    }
                    assert!(off_host_peers(&g, &job) <= 2, "{what}: all-gather rank {r}");
                    jobs.push(job);
                    let mine: Vec<u32> = (0..n).map(|i| input(r, i)).collect();
                    let mut recv = vec![0xdead_beef; n * p];
                    if in_place {
                        recv[r * n..(r + 1) * n].copy_from_slice(&mine);
                    }
                    bufs.push(vec![bytes(&mine), bytes(&recv)]);
                }
                run(jobs, &mut bufs, cap).unwrap_or_else(|e| panic!("all-gather {what}: {e}"));
                for (r, b) in bufs.iter().enumerate() {
                    let recv = u32s(&b[1]);
                    for q in 0..p {
                        for i in 0..n {
                            assert_eq!(
                                recv[q * n + i],
                                input(q, i),
                                "all-gather {what}: rank {r} block {q} elem {i}"
                            );
                        }
                    }
                }
                // Reduce-scatter (sum and avg): in place, into the rank's block of its input.
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    let mut jobs = Vec::new();
                    let mut bufs = Vec::new();
                    for r in 0..p {
                        let g = geometry(r, hosts, k, inter, channels, chunk);
                        let dst = if in_place { SEND.at(r * n * 4) } else { RECV };
                        let ops =
                            [OpSpec::ReduceScatter { count: n, dtype: DataType::U32, op, src: SEND, dst }];
                        let job = plan_group_signed(&g, &ops, &mut Seqs::new(p), true).unwrap();
                        assert!(off_host_peers(&g, &job) <= 2, "{what}: reduce-scatter rank {r}");
                        jobs.push(job);
                        let mine: Vec<u32> = (0..n * p).map(|i| input(r, i)).collect();
                        bufs.push(vec![bytes(&mine), bytes(&vec![0xdead_beef; n])]);
                    }
                    run(jobs, &mut bufs, cap).unwrap_or_else(|e| panic!("reduce-scatter {op:?} {what}: {e}"));
                    for (r, b) in bufs.iter().enumerate() {
                        let (send, recv) = (u32s(&b[0]), u32s(&b[1]));
                        let got = if in_place { &send[r * n..(r + 1) * n] } else { &recv[..] };
                        for (i, v) in got.iter().enumerate() {
                            let sum: u32 = (0..p).map(|q| input(q, r * n + i)).sum();
                            let want = if op == ReduceOp::Sum { sum } else { sum / p as u32 };
                            assert_eq!(*v, want, "reduce-scatter {op:?} {what}: rank {r} elem {i}");
                        }
                    }
                }
            }
        }
    });
}

/// One host, or hosts holding different numbers of ranks: Hier selected, the flat ring runs
/// (exact, and every rank's plan is the ring's).
#[test]
fn layouts_without_a_hierarchy_run_the_flat_ring() {
    for hosts_of in [vec![0u32, 0, 0, 0], vec![0, 0, 0, 1], vec![0, 1, 1, 2, 2]] {
        let p = hosts_of.len();
        let n = 37;
        let mut jobs = Vec::new();
        let mut bufs = Vec::new();
        for r in 0..p {
            let mut g = Geometry::simple(rank(r), p, 2, 8).with_hosts(|q| hosts_of[q]);
            g.select = Some(Arc::new(Selector::always(Algo::Hier)));
            let ops = [OpSpec::AllReduce {
                count: n,
                dtype: DataType::U32,
                op: ReduceOp::Sum,
                src: SEND,
                dst: RECV,
            }];
            let job = plan_group_signed(&g, &ops, &mut Seqs::new(p), true).unwrap();
            assert_eq!(job.phases.len(), 1, "{hosts_of:?}: the ring is one phase");
            jobs.push(job);
            bufs.push(vec![bytes(&(0..n).map(|i| input(r, i)).collect::<Vec<_>>()), bytes(&vec![0; n])]);
        }
        run(jobs, &mut bufs, 2).unwrap();
        for b in &bufs {
            let got = u32s(&b[1]);
            for (i, v) in got.iter().enumerate() {
                assert_eq!(*v, (0..p).map(|q| input(q, i)).sum::<u32>(), "{hosts_of:?} elem {i}");
            }
        }
    }
}

/// `oxccl topo`'s layout of the hierarchy: launchers' numbering gives the groups the
/// communicator finds from its host ids, and the description names every ring, the rail of
/// each channel and the NIC's share.
#[test]
fn the_hierarchy_is_described_as_the_plans_run_it() {
    use crate::plan::HostGroups;
    let g = geometry(0, 4, 2, false, 2, 64);
    assert_eq!(HostGroups::of(&g), Some(HostGroups::contiguous(4, 2)));
    let d = HostGroups::contiguous(4, 2).describe(2, 2);
    for want in [
        "4 hosts × 2 ranks, 2 channel(s) between hosts over 2 rail(s)",
        "host 0: 0 1 | host 1: 2 3 | host 2: 4 5 | host 3: 6 7",
        "index 0: 0 2 4 6 | index 1: 1 3 5 7",
        "channel 0: rail 0 | channel 1: rail 1",
        "1.50 S through each host's NIC each way (2(H−1)/H; a flat ring 1.75 S",
    ] {
        assert!(d.contains(want), "{want:?} missing from:\n{d}");
    }
    // One rail: every channel on it; many hosts: the lists are cut, saying how many more.
    assert!(HostGroups::contiguous(2, 2).describe(2, 1).contains("channel 0: rail 0 | channel 1: rail 0"));
    let big = HostGroups::contiguous(100, 8).describe(2, 1);
    assert!(big.contains("host 7: 56 57 58 59 60 61 62 63 | … (92 more)"), "{big}");
}
