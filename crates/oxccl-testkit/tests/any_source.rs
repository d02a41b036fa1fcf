//! Receives from any rank (`Communicator::recv_any`, MPI's ANY_SOURCE): every message arrives
//! whole and exact with its sender named, over shared memory, over TCP (ranks on different
//! simulated hosts) and from a message large enough for the zero-copy path; interleaved with
//! receives from named peers and collectives; asynchronous receives name their sender; the
//! wait heeds the timeout, and bad calls are refused.

use oxccl::{Communicator, Config, Error, Rank, ReduceOp};
use oxccl_testkit::threads;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

fn quick() -> Config {
    Config::default().with_timeout(Some(Duration::from_secs(60)))
}

/// A message from `from` (its `k`-th to rank 0): values that name both.
fn message(from: usize, k: usize, n: usize) -> Vec<u64> {
    (0..n).map(|i| ((from as u64) << 40) | ((k as u64) << 24) | i as u64).collect()
}

/// Every rank but 0 sends rank 0 `per_peer` messages of `n` elements (the first of them after
/// a collective, the rest at once); rank 0 takes them all from any rank and returns, per
/// sender, how many it got. Each message is checked exactly against its named sender and its
/// order among that sender's messages.
fn fan_in(comm: Communicator, n: usize, per_peer: usize) -> BTreeMap<usize, usize> {
    let (me, p) = (comm.rank().idx(), comm.size());
    let mut got = BTreeMap::new();
    if me == 0 {
        let mut next = vec![0usize; p];
        for _ in 0..per_peer * (p - 1) {
            let mut buf = vec![0u64; n];
            let from = comm.recv_any(&mut buf).unwrap().idx();
            assert!(from != 0 && from < p, "sender {from}");
            assert!(
                buf == message(from, next[from], n),
                "message {} from rank {from} is not exact",
                next[from]
            );
            next[from] += 1;
            *got.entry(from).or_insert(0) += 1;
        }
    } else {
        for k in 0..per_peer {
            comm.send(&message(me, k, n), Rank(0)).unwrap();
        }
    }
    // The communicator is unharmed: a collective after, exact.
    let mut x = vec![1u32; 5];
    comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
    assert_eq!(x, vec![p as u32; 5]);
    got
}

#[test]
fn every_message_arrives_exact_with_its_sender_over_shared_memory() {
    for (p, n, per) in [(2, 1, 3), (4, 7, 4), (3, 300_000, 2)] {
        let out = threads(p, p, quick(), move |c| fan_in(c, n, per));
        let want: BTreeMap<usize, usize> = (1..p).map(|r| (r, per)).collect();
        assert_eq!(out[0], want, "P={p} n={n}: messages per sender");
    }
}

#[test]
fn every_message_arrives_exact_with_its_sender_over_tcp() {
    // One rank per simulated host: every pair talks over TCP.
    let out = oxccl_testkit::threads(3, 1, quick(), |c| fan_in(c, 4096, 3));
    assert_eq!(out[0], BTreeMap::from([(1, 3), (2, 3)]));
}

#[test]
fn any_source_mixes_with_named_receives_and_async_receives_name_their_sender() {
    let out = threads(3, 3, quick(), |comm| {
        let me = comm.rank().idx();
        match me {
            0 => {
                // Rank 2 sends first (to a receive from any rank), then rank 1 twice: the
                // named receive from rank 1 takes rank 1's first message, the one from any
                // rank its second.
                let mut a = vec![0u64; 8];
                assert_eq!(comm.recv_any(&mut a).unwrap(), Rank(2));
                assert_eq!(a, message(2, 0, 8));
                comm.barrier_for_test();
                let mut b = vec![0u64; 8];
                comm.recv(&mut b, Rank(1)).unwrap();
                assert_eq!(b, message(1, 0, 8));
                let mut c = vec![0u64; 8];
                // SAFETY: `c` outlives the receive: we wait for it before reading or dropping.
                let d = unsafe {
                    comm.recv_any_detached(oxccl::DataType::U64, c.as_mut_ptr().cast(), 64, Box::new(()))
                }
                .unwrap();
                let src = d.source().unwrap();
                d.wait().unwrap();
                assert_eq!(src.get(), Some(&Rank(1)));
                assert_eq!(c, message(1, 1, 8));
            }
            1 => {
                comm.barrier_for_test();
                comm.send(&message(1, 0, 8), Rank(0)).unwrap();
                comm.send(&message(1, 1, 8), Rank(0)).unwrap();
            }
            _ => {
                comm.send(&message(2, 0, 8), Rank(0)).unwrap();
                comm.barrier_for_test();
            }
        }
        true
    });
    assert!(out.into_iter().all(|ok| ok));
}

/// A barrier from the library's own calls (a one-element all-reduce).
trait Barrier {
    fn barrier_for_test(&self);
}

impl Barrier for Communicator {
    fn barrier_for_test(&self) {
        let mut one = [0u8];
        self.all_reduce_in_place(&mut one, ReduceOp::Max).unwrap();
    }
}

#[test]
fn a_receive_from_any_rank_that_nobody_answers_times_out_saying_so() {
    let cfg = Config::default().with_timeout(Some(Duration::from_millis(800)));
    let out = threads(2, 2, cfg, |comm| {
        if comm.rank().idx() == 0 {
            let t0 = Instant::now();
            let e = comm.recv_any(&mut [0u8; 4]).unwrap_err();
            Some((e.to_string(), t0.elapsed(), matches!(e, Error::Timeout { .. })))
        } else {
            // Alive, sending nothing, until well after rank 0 gave up.
            std::thread::sleep(Duration::from_secs(2));
            None
        }
    });
    let (msg, took, timeout) = out[0].clone().unwrap();
    assert!(timeout && msg.contains("recv from any rank"), "{msg}");
    assert!(took >= Duration::from_millis(700) && took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn bad_receives_from_any_rank_are_refused() {
    let out = threads(1, 1, quick(), |comm| comm.recv_any(&mut [0u32; 2]).unwrap_err().to_string());
    assert!(out[0].contains("no other rank"), "{}", out[0]);
    let out = threads(2, 2, quick(), |comm| {
        let e = comm.recv_any_raw(oxccl::DataType::F32, &mut [0u8; 6]).unwrap_err().to_string();
        let mut one = [0u8];
        comm.all_reduce_in_place(&mut one, ReduceOp::Max).unwrap();
        e
    });
    assert!(out.iter().all(|e| e.contains("6 bytes is not a whole number")), "{out:?}");
}

#[test]
fn a_message_sent_just_before_its_sender_left_is_received_and_then_none_is_awaited_in_vain() {
    let out = threads(2, 2, quick(), |comm| {
        if comm.rank().idx() == 1 {
            // Small: handed over at once; then this rank destroys its communicator.
            comm.send(&message(1, 0, 3), Rank(0)).unwrap();
            comm.close();
            return None;
        }
        std::thread::sleep(Duration::from_millis(300));
        let mut buf = vec![0u64; 3];
        let from = comm.recv_any(&mut buf).unwrap();
        assert_eq!((from, &buf), (Rank(1), &message(1, 0, 3)));
        let t0 = Instant::now();
        let e = comm.recv_any(&mut buf).unwrap_err().to_string();
        Some((e, t0.elapsed()))
    });
    let (e, took) = out[0].clone().unwrap();
    assert!(e.contains("every other rank has destroyed its communicator"), "{e}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}
