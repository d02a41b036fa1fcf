//! Cross-memory calls (`OXCCL_CMA=1`, and the default `auto` for the kinds it chooses): heap
//! buffers of more than 64 KiB, and smaller ones that a rank would otherwise copy 8 KiB or more
//! of out of one peer's inline post, read straight from peers with process_vm_readv. Ranks are
//! threads of one process, which reads its own memory the same way. Every collective, in place
//! and out of place, exact; ranks that disagree on the setting take the ring together.

use oxccl::{Communicator, Config, CrossMemory, Rank, ReduceOp};
use std::time::Duration;

oxccl_testkit::test_scope!();

fn with_ranks(
    n: usize,
    cma: impl Fn(usize) -> CrossMemory,
    f: impl Fn(Communicator) + Send + Sync + Copy + 'static,
) {
    let base = Config::default().with_timeout(Some(Duration::from_secs(60)));
    let id = oxccl::new_unique_id(&base).unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let config = base.clone().with_cross_memory(cma(r));
            std::thread::spawn(move || f(Communicator::init(&id, n, Rank::new(r), config).unwrap()))
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// Rank `r`'s input element `i` in round `k` (sums of these never overflow or round).
fn x(r: usize, i: usize, k: u32) -> u32 {
    ((i as u32).wrapping_mul(2654435761) >> 8) ^ ((r as u32 + 1) << 24) ^ k
}

fn every_collective(c: Communicator) {
    let (me, p) = (c.rank().idx(), c.size());
    // Contributions of 8.2 KB and 24 KB (within the inline area, on 2 ranks: all-gather,
    // gather, broadcast and reduce pull at both, all-to-all, scatter and reduce-scatter, whose
    // contribution is P blocks, too, all-reduce at 24 KB), 160 KB and
    // 1.6 MB (several reduction blocks); odd element counts.
    for (k, n) in [(2u32, 2_053usize), (3, 6_007), (0, 40_003), (1, 400_009)] {
        let send: Vec<u32> = (0..n).map(|i| x(me, i, k)).collect();
        let sum = |i: usize| (0..p).fold(0u32, |a, r| a.wrapping_add(x(r, i, k)));
        let ctx = |what: &str| format!("{what} n {n} rank {me} of {p}");

        let mut out = vec![0u32; n];
        c.all_reduce(&send, &mut out, ReduceOp::Sum).unwrap();
        assert!(out.iter().enumerate().all(|(i, v)| *v == sum(i)), "{}", ctx("all_reduce"));
        let mut buf = send.clone();
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf, out, "{}", ctx("all_reduce in place"));
        // Rank 0 in place, the others not: every rank must still take one mode.
        let mut mixed = send.clone();
        if me == 0 {
            c.all_reduce_in_place(&mut mixed, ReduceOp::Sum).unwrap();
        } else {
            let mut o = vec![0u32; n];
            c.all_reduce(&send, &mut o, ReduceOp::Sum).unwrap();
            mixed = o;
        }
        assert_eq!(mixed, out, "{}", ctx("all_reduce, rank 0 in place"));

        for root in [0, p - 1] {
            let mut out = vec![7u32; n];
            c.reduce(&send, &mut out, ReduceOp::Sum, Rank::new(root)).unwrap();
            if me == root {
                assert!(out.iter().enumerate().all(|(i, v)| *v == sum(i)), "{}", ctx("reduce"));
            }
            let mut b = if me == root { send.clone() } else { vec![0u32; n] };
            c.broadcast_in_place(&mut b, Rank::new(root)).unwrap();
            assert!(b.iter().enumerate().all(|(i, v)| *v == x(root, i, k)), "{}", ctx("broadcast"));
        }

        // Blocks of m elements.
        let m = n;
        let big: Vec<u32> = (0..m * p).map(|i| x(me, i, k)).collect();
        let mut block = vec![0u32; m];
        c.reduce_scatter(&big, &mut block, ReduceOp::Sum).unwrap();
        let want_rs = |i: usize| (0..p).fold(0u32, |a, r| a.wrapping_add(x(r, me * m + i, k)));
        assert!(block.iter().enumerate().all(|(i, v)| *v == want_rs(i)), "{}", ctx("reduce_scatter"));
        let mut inplace = big.clone();
        c.reduce_scatter_in_place(&mut inplace, ReduceOp::Sum).unwrap();
        assert_eq!(&inplace[me * m..(me + 1) * m], &block[..], "{}", ctx("reduce_scatter in place"));

        let mut all = vec![0u32; m * p];
        c.all_gather(&send, &mut all).unwrap();
        let want_ag = |i: usize| x(i / m, i % m, k);
        assert!(all.iter().enumerate().all(|(i, v)| *v == want_ag(i)), "{}", ctx("all_gather"));
        let mut all_ip = vec![0u32; m * p];
        all_ip[me * m..(me + 1) * m].copy_from_slice(&send);
        c.all_gather_in_place(&mut all_ip).unwrap();
        assert_eq!(all_ip, all, "{}", ctx("all_gather in place"));

        let mut a2a = vec![0u32; m * p];
        c.all_to_all(&big, &mut a2a).unwrap();
        // Block q of the result is block `me` of rank q's input.
        let want_a2a = |i: usize| x(i / m, me * m + i % m, k);
        assert!(a2a.iter().enumerate().all(|(i, v)| *v == want_a2a(i)), "{}", ctx("all_to_all"));
        // In place, the ranges overlap: the call must still be exact (it takes the ring).
        let mut a2a_ip = big.clone();
        c.all_to_all_in_place(&mut a2a_ip).unwrap();
        assert_eq!(a2a_ip, a2a, "{}", ctx("all_to_all in place"));

        // Uneven all-to-all-v: rank r sends (r + 1) * (q + 1) * unit elements to rank q.
        let unit = if n < 10_000 { 1500 } else { 9000 };
        let cnt = |from: usize, to: usize| (from + 1) * (to + 1) * unit;
        let sc: Vec<usize> = (0..p).map(|q| cnt(me, q)).collect();
        let displs = |c: &[usize]| -> Vec<usize> {
            c.iter().scan(0, |a, n| Some(std::mem::replace(a, *a + n))).collect()
        };
        let sd = displs(&sc);
        let rc: Vec<usize> = (0..p).map(|q| cnt(q, me)).collect();
        let rd = displs(&rc);
        let vsend: Vec<u32> = (0..sc.iter().sum::<usize>()).map(|i| x(me, i, k)).collect();
        let mut vrecv = vec![0u32; rc.iter().sum::<usize>()];
        let mut g = c.group();
        g.all_to_all_v(&vsend, &sc, &sd, &mut vrecv, &rc, &rd).unwrap();
        g.end().unwrap();
        for q in 0..p {
            // Rank q's segment for me starts at its displacement for me.
            let qd: usize = (0..me).map(|t| cnt(q, t)).sum();
            for j in 0..rc[q] {
                assert_eq!(vrecv[rd[q] + j], x(q, qd + j, k), "{} from {q} at {j}", ctx("all_to_all_v"));
            }
        }

        for root in [0, p - 1] {
            let mut gat = vec![0u32; if me == root { m * p } else { 0 }];
            let mut g = c.group();
            g.gather(&send, &mut gat, Rank::new(root)).unwrap();
            g.end().unwrap();
            if me == root {
                assert!(gat.iter().enumerate().all(|(i, v)| *v == want_ag(i)), "{}", ctx("gather"));
            }
            let mut sc_out = vec![0u32; m];
            let src = if me == root { big.clone() } else { Vec::new() };
            let mut g = c.group();
            g.scatter(&src, &mut sc_out, Rank::new(root)).unwrap();
            g.end().unwrap();
            assert!(
                sc_out.iter().enumerate().all(|(i, v)| *v == x(root, me * m + i, k)),
                "{}",
                ctx("scatter")
            );
        }
    }
}

#[test]
fn every_collective_exact_on_heap_buffers_read_across() {
    for p in [2usize, 3] {
        with_ranks(p, |_| CrossMemory::All, every_collective);
    }
}

#[test]
fn every_collective_exact_with_the_default_choice() {
    // Auto: beyond the inline area, all-to-all(v), scatter and all-gather read across,
    // broadcast where ranks do not outnumber cores or at 1.6 MB, the rest take the ring;
    // within it, where ranks do not outnumber cores, the calls named at `every_collective`.
    assert_eq!(Config::default().cma, CrossMemory::Auto);
    for p in [2usize, 3] {
        with_ranks(p, |_| CrossMemory::Auto, every_collective);
    }
}

#[test]
fn ranks_that_disagree_take_the_ring_together() {
    with_ranks(3, |r| if r == 1 { CrossMemory::All } else { CrossMemory::Off }, every_collective);
    with_ranks(3, |r| if r == 2 { CrossMemory::Off } else { CrossMemory::Auto }, every_collective);
}
