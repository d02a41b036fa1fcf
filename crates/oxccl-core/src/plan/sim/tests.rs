//! Every algorithm, every world size 1..=9, many counts, chunk sizes, channel counts and FIFO
//! depths, run in memory and checked element by element.

use super::*;
use crate::contract::{CallKind, Seqs, Sig};
use crate::dtype::{DataType, ReduceOp};
use crate::plan::{plan_group, plan_group_signed, BufId, Geometry, Loc, OpSpec};

const SEND: Loc = Loc::start(BufId(0));
const RECV: Loc = Loc::start(BufId(1));

fn input(r: usize, i: usize) -> u32 {
    (r as u32).wrapping_mul(1_000_003).wrapping_add((i as u32).wrapping_mul(7919)).wrapping_add(13)
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

struct Case {
    p: usize,
    chunk: usize,
    channels: usize,
    cap: usize,
}

const P_MAX: usize = 9;
const COUNTS: [usize; 7] = [0, 1, 2, 7, 31, 100, 257];

fn cases() -> impl Iterator<Item = Case> {
    (1..=P_MAX).flat_map(|p| {
        [4usize, 12, 64].into_iter().flat_map(move |chunk| {
            [1usize, 3].into_iter().flat_map(move |channels| {
                [2usize, 4].into_iter().map(move |cap| Case { p, chunk, channels, cap })
            })
        })
    })
}

/// Runs `make(rank)` on every rank with send buffer `send(rank)` and a receive buffer of
/// `recv_len(rank)` u32s poisoned with 0xdeadbeef; returns every rank's two buffers.
fn run_case(
    c: &Case,
    make: impl Fn(usize) -> Vec<OpSpec>,
    send: impl Fn(usize) -> Vec<u32>,
    recv_len: impl Fn(usize) -> usize,
) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut jobs = Vec::new();
    let mut bufs = Vec::new();
    for r in 0..c.p {
        let g = Geometry::simple(rank(r), c.p, c.channels, c.chunk);
        // Signed as the engine signs them: every chunk's signature must match its receiver's.
        jobs.push(plan_group_signed(&g, &make(r), &mut Seqs::new(c.p), true).unwrap());
        bufs.push(vec![bytes(&send(r)), bytes(&vec![0xdead_beef; recv_len(r)])]);
    }
    run(jobs, &mut bufs, c.cap)
        .unwrap_or_else(|e| panic!("p={} chunk={} ch={} cap={}: {e}", c.p, c.chunk, c.channels, c.cap));
    bufs.iter().map(|b| (u32s(&b[0]), u32s(&b[1]))).collect()
}

fn sum_over(p: usize, f: impl Fn(usize) -> u32) -> u32 {
    (0..p).fold(0u32, |a, r| a.wrapping_add(f(r)))
}

#[test]
fn all_reduce_out_of_place_and_in_place() {
    for c in cases() {
        for n in COUNTS {
            let op = |_| {
                vec![OpSpec::AllReduce {
                    count: n,
                    dtype: DataType::U32,
                    op: ReduceOp::Sum,
                    src: SEND,
                    dst: RECV,
                }]
            };
            let out = run_case(&c, op, |r| (0..n).map(|i| input(r, i)).collect(), |_| n);
            for (r, (_, recv)) in out.iter().enumerate() {
                for (i, v) in recv.iter().enumerate() {
                    assert_eq!(*v, sum_over(c.p, |q| input(q, i)), "rank {r} elem {i} n={n}");
                }
            }
            let op = |_| {
                vec![OpSpec::AllReduce {
                    count: n,
                    dtype: DataType::U32,
                    op: ReduceOp::Max,
                    src: SEND,
                    dst: SEND,
                }]
            };
            let out = run_case(&c, op, |r| (0..n).map(|i| input(r, i)).collect(), |_| 0);
            for (send, _) in &out {
                for (i, v) in send.iter().enumerate() {
                    let want = (0..c.p).map(|q| input(q, i)).max().unwrap();
                    assert_eq!(*v, want);
                }
            }
        }
    }
}

#[test]
fn avg_divides_once() {
    for c in cases().filter(|c| c.channels == 1 && c.cap == 4) {
        let n = 37;
        let op = |_| {
            vec![OpSpec::AllReduce {
                count: n,
                dtype: DataType::U32,
                op: ReduceOp::Avg,
                src: SEND,
                dst: RECV,
            }]
        };
        let out = run_case(&c, op, |r| (0..n).map(|i| (r * 10 + i) as u32).collect(), |_| n);
        for (_, recv) in &out {
            for (i, v) in recv.iter().enumerate() {
                let s: usize = (0..c.p).map(|q| q * 10 + i).sum();
                assert_eq!(*v as usize, s / c.p);
            }
        }
    }
}

#[test]
fn broadcast_and_reduce_every_root() {
    for c in cases() {
        for n in [0usize, 1, 7, 100] {
            for root in 0..c.p {
                for in_place in [false, true] {
                    let dst = if in_place { SEND } else { RECV };
                    let bc = |_| {
                        vec![OpSpec::Broadcast {
                            count: n,
                            dtype: DataType::U32,
                            root: rank(root),
                            src: SEND,
                            dst,
                        }]
                    };
                    let send = |r: usize| (0..n).map(|i| input(r, i)).collect();
                    let out = run_case(&c, bc, send, |_| n);
                    for (send, recv) in &out {
                        let got = if in_place { send } else { recv };
                        let want: Vec<u32> = (0..n).map(|i| input(root, i)).collect();
                        assert_eq!(got, &want, "bcast p={} root={root}", c.p);
                    }
                    let rd = |_| {
                        vec![OpSpec::Reduce {
                            count: n,
                            dtype: DataType::U32,
                            op: ReduceOp::Sum,
                            root: rank(root),
                            src: SEND,
                            dst,
                        }]
                    };
                    let out = run_case(&c, rd, send, |_| n);
                    let (s, r) = &out[root];
                    let got = if in_place { s } else { r };
                    let want: Vec<u32> = (0..n).map(|i| sum_over(c.p, |q| input(q, i))).collect();
                    assert_eq!(got, &want, "reduce p={} root={root}", c.p);
                    for (q, (_, recv)) in out.iter().enumerate() {
                        if q != root && !in_place {
                            assert!(recv.iter().all(|v| *v == 0xdead_beef));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn all_gather_and_reduce_scatter() {
    for c in cases() {
        for n in COUNTS {
            let p = c.p;
            for in_place in [false, true] {
                let ag = |r: usize| {
                    let src = if in_place { RECV.at(r * n * 4) } else { SEND };
                    vec![OpSpec::AllGather { count: n, dtype: DataType::U32, src, dst: RECV }]
                };
                // In place, the rank's own block of the receive buffer holds its input.
                let mut jobs = Vec::new();
                let mut bufs = Vec::new();
                for r in 0..p {
                    let g = Geometry::simple(rank(r), p, c.channels, c.chunk);
                    jobs.push(plan_group(&g, &ag(r)).unwrap());
                    let mine: Vec<u32> = (0..n).map(|i| input(r, i)).collect();
                    let mut recv = vec![0xdead_beef; n * p];
                    if in_place {
                        recv[r * n..(r + 1) * n].copy_from_slice(&mine);
                    }
                    bufs.push(vec![bytes(&mine), bytes(&recv)]);
                }
                run(jobs, &mut bufs, c.cap).unwrap();
                for b in &bufs {
                    let recv = u32s(&b[1]);
                    for q in 0..p {
                        for i in 0..n {
                            assert_eq!(recv[q * n + i], input(q, i), "ag p={p} n={n}");
                        }
                    }
                }
                let rs = |r: usize| {
                    let dst = if in_place { SEND.at(r * n * 4) } else { RECV };
                    vec![OpSpec::ReduceScatter {
                        count: n,
                        dtype: DataType::U32,
                        op: ReduceOp::Sum,
                        src: SEND,
                        dst,
                    }]
                };
                let out = run_case(&c, rs, |r| (0..n * p).map(|i| input(r, i)).collect(), |_| n);
                for (r, (send, recv)) in out.iter().enumerate() {
                    let got = if in_place { &send[r * n..(r + 1) * n] } else { &recv[..] };
                    for (i, v) in got.iter().enumerate() {
                        assert_eq!(*v, sum_over(p, |q| input(q, r * n + i)), "rs p={p} n={n}");
                    }
                }
            }
        }
    }
}

#[test]
fn all_to_all_gather_scatter() {
    for c in cases().filter(|c| c.channels == 1) {
        let p = c.p;
        for n in [0usize, 1, 7, 33] {
            let a2a = |_| vec![OpSpec::AllToAll { count: n, dtype: DataType::U32, src: SEND, dst: RECV }];
            let out = run_case(&c, a2a, |r| (0..n * p).map(|i| input(r, i)).collect(), |_| n * p);
            for (r, (_, recv)) in out.iter().enumerate() {
                for q in 0..p {
                    for i in 0..n {
                        assert_eq!(recv[q * n + i], input(q, r * n + i));
                    }
                }
            }
            for root in 0..p {
                let ga = |_| {
                    vec![OpSpec::Gather {
                        count: n,
                        dtype: DataType::U32,
                        root: rank(root),
                        src: SEND,
                        dst: RECV,
                    }]
                };
                let out = run_case(&c, ga, |r| (0..n).map(|i| input(r, i)).collect(), |_| n * p);
                for q in 0..p {
                    for i in 0..n {
                        assert_eq!(out[root].1[q * n + i], input(q, i));
                    }
                }
                let sc = |_| {
                    vec![OpSpec::Scatter {
                        count: n,
                        dtype: DataType::U32,
                        root: rank(root),
                        src: SEND,
                        dst: RECV,
                    }]
                };
                let out = run_case(&c, sc, |r| (0..n * p).map(|i| input(r, i)).collect(), |_| n);
                for (r, (_, recv)) in out.iter().enumerate() {
                    for (i, v) in recv.iter().enumerate() {
                        assert_eq!(*v, input(root, r * n + i));
                    }
                }
            }
        }
    }
}

#[test]
fn all_to_all_v_uneven() {
    for c in cases().filter(|c| c.channels == 1) {
        let p = c.p;
        // Rank s sends cnt(s, d) elements to rank d.
        let cnt = |s: usize, d: usize| (s * 3 + d * 5) % 7;
        let make = |r: usize| {
            let sc: Vec<usize> = (0..p).map(|d| cnt(r, d)).collect();
            let rc: Vec<usize> = (0..p).map(|s| cnt(s, r)).collect();
            // Reverse the placement of segments to exercise displacements.
            let sd: Vec<usize> = (0..p).map(|d| sc[d + 1..].iter().sum()).collect();
            let rd: Vec<usize> = (0..p).map(|s| rc[..s].iter().sum::<usize>() + s).collect();
            (sc, sd, rc, rd)
        };
        let mut jobs = Vec::new();
        let mut bufs = Vec::new();
        for r in 0..p {
            let (sc, sd, rc, rd) = make(r);
            let g = Geometry::simple(rank(r), p, 1, c.chunk);
            let total_s: usize = sc.iter().sum();
            let total_r = rd[p - 1] + rc[p - 1];
            let mut send = vec![0u32; total_s];
            for d in 0..p {
                for i in 0..sc[d] {
                    send[sd[d] + i] = input(r, d * 100 + i);
                }
            }
            jobs.push(
                plan_group(
                    &g,
                    &[OpSpec::AllToAllV {
                        dtype: DataType::U32,
                        send_counts: sc,
                        send_displs: sd,
                        recv_counts: rc,
                        recv_displs: rd,
                        src: SEND,
                        dst: RECV,
                    }],
                )
                .unwrap(),
            );
            bufs.push(vec![bytes(&send), bytes(&vec![0xdead_beef; total_r])]);
        }
        run(jobs, &mut bufs, c.cap).unwrap();
        for (r, b) in bufs.iter().enumerate() {
            let (_, _, rc, rd) = make(r);
            let recv = u32s(&b[1]);
            for s in 0..p {
                for i in 0..rc[s] {
                    assert_eq!(recv[rd[s] + i], input(s, r * 100 + i));
                }
                // The gap before each segment stays untouched.
                if s > 0 {
                    assert_eq!(recv[rd[s] - 1], 0xdead_beef);
                }
            }
        }
    }
}

#[test]
fn grouped_ring_shift_pairwise_and_collectives_do_not_deadlock() {
    for c in cases().filter(|c| c.channels == 1) {
        let p = c.p;
        let n = 29;
        // Buffer 0: send data; 1: recv from prev; 2: recv from next; 3: self copy target;
        // 4: all-reduce output.
        let mut jobs = Vec::new();
        let mut bufs = Vec::new();
        for r in 0..p {
            let g = Geometry::simple(rank(r), p, 1, c.chunk);
            let next = rank((r + 1) % p);
            let prev = rank((r + p - 1) % p);
            let ops = vec![
                OpSpec::Send { count: n, dtype: DataType::U32, peer: next, src: SEND },
                OpSpec::AllReduce {
                    count: n,
                    dtype: DataType::U32,
                    op: ReduceOp::Sum,
                    src: SEND,
                    dst: Loc::start(BufId(4)),
                },
                OpSpec::Recv { count: n, dtype: DataType::U32, peer: prev, dst: RECV },
                OpSpec::Send { count: n, dtype: DataType::U32, peer: prev, src: SEND },
                OpSpec::Recv { count: n, dtype: DataType::U32, peer: next, dst: Loc::start(BufId(2)) },
                OpSpec::Recv { count: n, dtype: DataType::U32, peer: rank(r), dst: Loc::start(BufId(3)) },
                OpSpec::Send { count: n, dtype: DataType::U32, peer: rank(r), src: SEND },
            ];
            jobs.push(plan_group(&g, &ops).unwrap());
            let send: Vec<u32> = (0..n).map(|i| input(r, i)).collect();
            let poison = bytes(&vec![0xdead_beef; n]);
            bufs.push(vec![bytes(&send), poison.clone(), poison.clone(), poison.clone(), poison]);
        }
        run(jobs, &mut bufs, c.cap).unwrap();
        for (r, b) in bufs.iter().enumerate() {
            let want = |q: usize| (0..n).map(|i| input(q, i)).collect::<Vec<u32>>();
            if p == 1 {
                // Sends to self as next and prev pair up with the receives, in order.
                assert_eq!(u32s(&b[1]), want(r));
            } else {
                assert_eq!(u32s(&b[1]), want((r + p - 1) % p));
                assert_eq!(u32s(&b[2]), want((r + 1) % p));
            }
            assert_eq!(u32s(&b[3]), want(r));
            let sums: Vec<u32> = (0..n).map(|i| sum_over(p, |q| input(q, i))).collect();
            assert_eq!(u32s(&b[4]), sums);
        }
    }
}

#[test]
fn unpaired_self_send_is_an_error() {
    let g = Geometry::simple(rank(0), 2, 1, 64);
    let ops = [OpSpec::Send { count: 4, dtype: DataType::U32, peer: rank(0), src: SEND }];
    assert!(plan_group(&g, &ops).is_err());
}

#[test]
fn mismatched_counts_are_detected() {
    let mut jobs = Vec::new();
    let mut bufs = Vec::new();
    for r in 0..2 {
        let g = Geometry::simple(rank(r), 2, 1, 64);
        let ops = if r == 0 {
            [OpSpec::Send { count: 4, dtype: DataType::U32, peer: rank(1), src: SEND }]
        } else {
            [OpSpec::Recv { count: 5, dtype: DataType::U32, peer: rank(0), dst: RECV }]
        };
        jobs.push(plan_group(&g, &ops).unwrap());
        bufs.push(vec![vec![0u8; 16], vec![0u8; 20]]);
    }
    assert!(matches!(run(jobs, &mut bufs, 4), Err(SimError::LengthMismatch { .. })));
}

/// Ranks whose calls differ fail on the first chunk with both signatures, whatever differs;
/// the same calls under other call numbers differ too (calls made in another order).
#[test]
fn differing_calls_fail_with_both_signatures() {
    let ar = |count, op| OpSpec::AllReduce { count, dtype: DataType::U32, op, src: SEND, dst: RECV };
    let bc = |count, root| OpSpec::Broadcast {
        count,
        dtype: DataType::U32,
        root: rank(root),
        src: SEND,
        dst: RECV,
    };
    let cases: Vec<(OpSpec, OpSpec, u64)> = vec![
        (ar(64, ReduceOp::Sum), ar(64, ReduceOp::Max), 0),
        (ar(64, ReduceOp::Sum), bc(64, 0), 0),
        (bc(64, 0), bc(64, 1), 0),
        (ar(64, ReduceOp::Sum), ar(64, ReduceOp::Sum), 1),
        (
            OpSpec::AllGather { count: 16, dtype: DataType::U32, src: SEND, dst: RECV },
            OpSpec::AllGather { count: 16, dtype: DataType::F32, src: SEND, dst: RECV },
            0,
        ),
    ];
    for (a, b, skew) in cases {
        let mut jobs = Vec::new();
        let mut bufs = Vec::new();
        for r in 0..3 {
            let g = Geometry::simple(rank(r), 3, 1, 64);
            let mut seqs = Seqs::new(3);
            // Rank 1's call differs (or is its second call where the others make their first).
            seqs.coll = if r == 1 { skew } else { 0 };
            let op = if r == 1 { b.clone() } else { a.clone() };
            jobs.push(plan_group_signed(&g, &[op], &mut seqs, true).unwrap());
            bufs.push(vec![vec![0u8; 256], vec![0u8; 256]]);
        }
        match run(jobs, &mut bufs, 4) {
            Err(SimError::SigMismatch { rank: r, from, got, want }) => {
                assert!(r == 1 || from == 1, "{a:?} vs {b:?}: rank {r} from {from}");
                assert_ne!(got, want);
                let (a_sig, b_sig) = (Sig::of(&a, 0), Sig::of(&b, skew));
                let pair = if from == 1 { (got, want) } else { (want, got) };
                assert_eq!(pair, (b_sig, a_sig), "{a:?} vs {b:?}");
                assert_ne!(got.kind, CallKind::None);
            }
            other => panic!("{a:?} vs {b:?}: {other:?}"),
        }
    }
    // Unsigned plans (the check off) are not compared.
    let mut jobs = Vec::new();
    let mut bufs = Vec::new();
    for r in 0..2 {
        let g = Geometry::simple(rank(r), 2, 1, 64);
        let op = if r == 0 { ar(16, ReduceOp::Sum) } else { ar(16, ReduceOp::Max) };
        jobs.push(plan_group_signed(&g, &[op], &mut Seqs::new(2), false).unwrap());
        bufs.push(vec![vec![0u8; 64], vec![0u8; 64]]);
    }
    run(jobs, &mut bufs, 4).unwrap();
}

/// A send and its receive must agree on type and count (and on their place among the pair's
/// messages); each message of a group carries its own signature.
#[test]
fn send_and_receive_signatures_are_checked_per_message() {
    let send = |count, dtype| OpSpec::Send { count, dtype, peer: rank(1), src: SEND };
    let recv = |count, dtype| OpSpec::Recv { count, dtype, peer: rank(0), dst: RECV };
    let run2 = |s: Vec<OpSpec>, r: Vec<OpSpec>| {
        let mut jobs = Vec::new();
        let mut bufs = Vec::new();
        for (i, ops) in [s, r].into_iter().enumerate() {
            let g = Geometry::simple(rank(i), 2, 1, 64);
            jobs.push(plan_group_signed(&g, &ops, &mut Seqs::new(2), true).unwrap());
            bufs.push(vec![vec![0u8; 512], vec![0u8; 512]]);
        }
        run(jobs, &mut bufs, 4)
    };
    // Same bytes, other type.
    let e = run2(vec![send(8, DataType::U32)], vec![recv(4, DataType::U64)]).unwrap_err();
    assert!(matches!(e, SimError::SigMismatch { rank: 1, from: 0, .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "rank 1: received a chunk of send/recv message #0 (uint32 × 8) from rank 0 where the step expects send/recv message #0 (uint64 × 4)"
    );
    // Two messages, the second differs.
    let e = run2(
        vec![send(4, DataType::U32), send(4, DataType::U32)],
        vec![recv(4, DataType::U32), recv(5, DataType::U32)],
    )
    .unwrap_err();
    match e {
        SimError::SigMismatch { got, want, .. } => {
            assert_eq!((got.seq, got.count, want.seq, want.count), (1, 4, 1, 5));
        }
        other => panic!("{other}"),
    }
    // Matching messages, several per group (over 64-byte chunks: several chunks each).
    run2(
        vec![send(40, DataType::U32), send(3, DataType::F64), send(0, DataType::U8)],
        vec![recv(40, DataType::U32), recv(3, DataType::F64), recv(0, DataType::U8)],
    )
    .unwrap();
}

#[test]
fn pipelining_keeps_the_fifo_busy() {
    // A large all-reduce with deep FIFOs uses more than one slot: the steps overlap.
    let c = Case { p: 4, chunk: 16, channels: 1, cap: 8 };
    let n = 1000;
    let mut jobs = Vec::new();
    let mut bufs = Vec::new();
    for r in 0..c.p {
        let g = Geometry::simple(rank(r), c.p, 1, c.chunk);
        let ops =
            [OpSpec::AllReduce { count: n, dtype: DataType::U32, op: ReduceOp::Sum, src: SEND, dst: RECV }];
        jobs.push(plan_group(&g, &ops).unwrap());
        bufs.push(vec![vec![1u8; n * 4], vec![0u8; n * 4]]);
    }
    let stats = run(jobs, &mut bufs, c.cap).unwrap();
    assert!(stats.max_depth > 1, "{stats:?}");
}

#[test]
fn one_shot_all_reduce_matches_for_every_rank_and_placement() {
    for p in 2..=8 {
        for n in [1usize, 5, 300, 1024] {
            for in_place in [false, true] {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min] {
                    let c = Case { p, chunk: 4096, channels: 1, cap: 2 };
                    let dst = if in_place { SEND } else { RECV };
                    let mk =
                        |_| vec![OpSpec::AllReduce { count: n, dtype: DataType::U32, op, src: SEND, dst }];
                    let g = Geometry::simple(rank(0), p, 1, 4096);
                    let job = plan_group(&g, &mk(0)).unwrap();
                    assert!(job.scratch_bytes > 0, "one-shot plan expected for p={p} n={n}");
                    let out = run_case(&c, mk, |r| (0..n).map(|i| input(r, i) % 1000).collect(), |_| n);
                    for (send, recv) in &out {
                        let got = if in_place { send } else { recv };
                        for (i, v) in got.iter().enumerate() {
                            let vals: Vec<u32> = (0..p).map(|q| input(q, i) % 1000).collect();
                            let want = match op {
                                ReduceOp::Sum => vals.iter().sum::<u32>(),
                                ReduceOp::Avg => vals.iter().sum::<u32>() / p as u32,
                                _ => *vals.iter().min().unwrap(),
                            };
                            assert_eq!(*v, want, "p={p} n={n} {op} in_place={in_place} elem {i}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn tree_all_reduce_is_exact_for_every_host_layout() {
    use crate::tuner::{Algo, Selector};
    let sel = std::sync::Arc::new(Selector::always(Algo::Tree));
    for p in 3..=P_MAX {
        // One rank per host, two per host, three per host, and all on one host (a chain).
        for per_host in [1usize, 2, 3, p] {
            for (chunk, channels) in [(4usize, 1usize), (12, 1), (64, 1), (4, 3), (64, 2)] {
                for cap in [1usize, 2, 8] {
                    for n in COUNTS {
                        for (op, in_place) in
                            [(ReduceOp::Sum, false), (ReduceOp::Max, true), (ReduceOp::Avg, false)]
                        {
                            let mut jobs = Vec::new();
                            let mut bufs = Vec::new();
                            for r in 0..p {
                                let mut g = Geometry::simple(rank(r), p, channels, chunk)
                                    .with_hosts(|q| (q / per_host) as u32);
                                g.select = Some(sel.clone());
                                let dst = if in_place { SEND } else { RECV };
                                let ops = [OpSpec::AllReduce {
                                    count: n,
                                    dtype: DataType::U32,
                                    op,
                                    src: SEND,
                                    dst,
                                }];
                                let job = plan_group_signed(&g, &ops, &mut Seqs::new(p), true).unwrap();
                                if n > 1 {
                                    // Both trees carry data, each channel's part on its own
                                    // connections.
                                    let classes: std::collections::BTreeSet<_> =
                                        crate::plan::job_connections(&job)
                                            .iter()
                                            .map(|(k, _)| k.class)
                                            .collect();
                                    assert_eq!(
                                        classes.len(),
                                        n.min(2 * channels),
                                        "p={p} per_host={per_host} channels={channels}: {classes:?}"
                                    );
                                }
                                jobs.push(job);
                                let inputs: Vec<u32> = (0..n).map(|i| input(r, i) % 1000).collect();
                                bufs.push(vec![bytes(&inputs), bytes(&vec![0xdead_beef; n])]);
                            }
                            run(jobs, &mut bufs, cap).unwrap_or_else(|e| {
                                panic!("p={p} per_host={per_host} chunk={chunk} channels={channels} cap={cap} n={n} {op:?}: {e}")
                            });
                            for (r, b) in bufs.iter().enumerate() {
                                let got = u32s(&b[usize::from(!in_place)]);
                                for (i, v) in got.iter().enumerate() {
                                    let xs = (0..p).map(|q| input(q, i) % 1000);
                                    let want = match op {
                                        ReduceOp::Sum => xs.sum::<u32>(),
                                        ReduceOp::Max => xs.max().unwrap(),
                                        _ => xs.sum::<u32>() / p as u32,
                                    };
                                    assert_eq!(
                                        *v, want,
                                        "p={p} per_host={per_host} n={n} {op:?} rank {r} elem {i}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn tree_places_follow_the_double_binary_tree_over_hosts() {
    use crate::plan::tree::places;
    // 8 ranks on 4 hosts of 2: heads are ranks 0, 2, 4, 6; each head's chain child is the
    // next rank; every non-root has one parent and the trees differ.
    let g = Geometry::simple(rank(0), 8, 1, 64).with_hosts(|q| (q / 2) as u32);
    let [t0, t1] = places(&g);
    for t in [&t0, &t1] {
        assert_eq!(t.iter().filter(|p| p.parent.is_none()).count(), 1);
        for h in [0usize, 2, 4, 6] {
            assert!(t[h].children.contains(&rank(h + 1)), "{t:?}");
            assert_eq!(t[h + 1].parent, Some(rank(h)));
            assert!(t[h + 1].children.is_empty());
        }
    }
    assert_ne!(t0, t1);
    // Host-level interior vertices are disjoint between the trees (beyond the chain child).
    for h in [0usize, 2, 4, 6] {
        assert!(!(t0[h].children.len() > 1 && t1[h].children.len() > 1), "host head {h}");
    }
}

/// A float input whose sums depend on the order they are added in.
fn fx(r: usize, i: usize) -> f32 {
    let h = (r as u64 * 0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = (h ^ (h >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10f32.powi((h % 7) as i32 - 3)
}

fn fbytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn fvals(b: &[u8]) -> Vec<u32> {
    u32s(b)
}

#[test]
fn deterministic_reductions_fold_in_rank_order_for_every_size_and_chunk() {
    for p in 1..=P_MAX {
        for chunk in [4usize, 12, 64] {
            for n in [1usize, 2, 7, 100, 257, 1000] {
                let want: Vec<u32> =
                    (0..n).map(|i| (1..p).fold(fx(0, i), |a, r| a + fx(r, i)).to_bits()).collect();
                // All-reduce, out of place and in place.
                for in_place in [false, true] {
                    let mut jobs = Vec::new();
                    let mut bufs = Vec::new();
                    for r in 0..p {
                        let mut g = Geometry::simple(rank(r), p, 2, chunk);
                        g.deterministic = true;
                        let dst = if in_place { SEND } else { RECV };
                        let ops = [OpSpec::AllReduce {
                            count: n,
                            dtype: DataType::F32,
                            op: ReduceOp::Sum,
                            src: SEND,
                            dst,
                        }];
                        jobs.push(plan_group_signed(&g, &ops, &mut Seqs::new(p), true).unwrap());
                        let x: Vec<f32> = (0..n).map(|i| fx(r, i)).collect();
                        bufs.push(vec![fbytes(&x), vec![0u8; 4 * n]]);
                    }
                    run(jobs, &mut bufs, 2).unwrap_or_else(|e| panic!("p={p} chunk={chunk} n={n}: {e}"));
                    for (r, b) in bufs.iter().enumerate() {
                        assert_eq!(
                            fvals(&b[usize::from(!in_place)]),
                            want,
                            "all-reduce p={p} chunk={chunk} n={n} rank {r}"
                        );
                    }
                }
                // Reduce-scatter (n per rank) and reduce to the last rank.
                let total = n * p;
                let want_rs: Vec<u32> =
                    (0..total).map(|i| (1..p).fold(fx(0, i), |a, r| a + fx(r, i)).to_bits()).collect();
                let mut jobs = Vec::new();
                let mut bufs = Vec::new();
                for r in 0..p {
                    let mut g = Geometry::simple(rank(r), p, 1, chunk);
                    g.deterministic = true;
                    let ops = [
                        OpSpec::ReduceScatter {
                            count: n,
                            dtype: DataType::F32,
                            op: ReduceOp::Sum,
                            src: SEND,
                            dst: RECV,
                        },
                        OpSpec::Reduce {
                            count: total,
                            dtype: DataType::F32,
                            op: ReduceOp::Sum,
                            root: rank(p - 1),
                            src: SEND,
                            dst: Loc { buf: BufId(1), off: 4 * n },
                        },
                    ];
                    jobs.push(plan_group_signed(&g, &ops, &mut Seqs::new(p), true).unwrap());
                    let x: Vec<f32> = (0..total).map(|i| fx(r, i)).collect();
                    bufs.push(vec![fbytes(&x), vec![0u8; 4 * (n + total)]]);
                }
                run(jobs, &mut bufs, 2).unwrap_or_else(|e| panic!("rs p={p} chunk={chunk} n={n}: {e}"));
                for (r, b) in bufs.iter().enumerate() {
                    let got = fvals(&b[1]);
                    assert_eq!(
                        got[..n],
                        want_rs[r * n..(r + 1) * n],
                        "reduce-scatter p={p} chunk={chunk} n={n} rank {r}"
                    );
                    if r == p - 1 {
                        assert_eq!(got[n..], want_rs[..], "reduce p={p} chunk={chunk} n={n}");
                    }
                }
            }
        }
    }
    // Control: the ring's order differs, so these inputs can tell the orders apart.
    let (p, n) = (4, 1000);
    let mut jobs = Vec::new();
    let mut bufs = Vec::new();
    for r in 0..p {
        let g = Geometry::simple(rank(r), p, 1, 64);
        let ops =
            [OpSpec::AllReduce { count: n, dtype: DataType::F32, op: ReduceOp::Sum, src: SEND, dst: RECV }];
        jobs.push(plan_group(&g, &ops).unwrap());
        bufs.push(vec![fbytes(&(0..n).map(|i| fx(r, i)).collect::<Vec<_>>()), vec![0u8; 4 * n]]);
    }
    run(jobs, &mut bufs, 2).unwrap();
    let want: Vec<u32> = (0..n).map(|i| (1..p).fold(fx(0, i), |a, r| a + fx(r, i)).to_bits()).collect();
    assert_ne!(fvals(&bufs[0][1]), want, "the ring happened to fold in rank order everywhere");
}
