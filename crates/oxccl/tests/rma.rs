//! One-sided calls through the Rust API, ranks as threads of this process: every transport
//! (direct writes between threads, the stream with shared memory off or hosts told apart),
//! windows on heap and shared memory, exact bytes and signal counts over several rounds, bad
//! arguments, a wait that times out naming what it waits for, one whose peer left, and one
//! ended by an abort.

use oxccl::mem::SharedBuf;
use oxccl::rma::{WaitDesc, Window};
use oxccl::{Communicator, Config, Error, Rank};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

fn with_ranks(n: usize, config: Config, f: impl Fn(Communicator) + Send + Sync + Copy + 'static) {
    let id = oxccl::new_unique_id(&config).unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            // Ranks of "another host" when the test asks hosts told apart.
            let config = match config.host_id.as_deref() {
                Some("split") => config.clone().with_host_id(&format!("host-{}", r % 2)),
                _ => config.clone(),
            };
            std::thread::spawn(move || f(Communicator::init(&id, n, Rank::new(r), config).unwrap()))
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

fn byte(round: usize, from: usize, to: usize, i: usize) -> u8 {
    ((round * 131 + from * 31 + to * 17 + i * 7) % 251) as u8
}

const SLOT: usize = 300_001;
const ROUNDS: usize = 4;

/// Every rank puts to every rank (itself too) `ROUNDS` times into the heap window and the
/// shared one alternately, waits for its data signals, checks every byte, then acknowledges.
fn all_to_all_rounds(c: Communicator) {
    let (me, p) = (c.rank().idx(), c.size());
    let mut heap = vec![0u8; p * SLOT];
    let mut shared = SharedBuf::<u8>::zeroed(p * SLOT).unwrap();
    // SAFETY: both buffers outlive the windows (deregistered below) and are read only after
    // the wait for the puts that write them.
    let wins: [Window; 2] = unsafe {
        [
            c.register_window(heap.as_mut_ptr(), heap.len(), false).unwrap(),
            c.register_window(shared.as_mut_ptr(), shared.len(), false).unwrap(),
        ]
    };
    assert_eq!((wins[0].index(), wins[1].index()), (0, 1));
    let data = |round: usize, to: usize| -> Vec<u8> {
        let len = SLOT - (round * 977 + to) % 1000;
        (0..len).map(|i| byte(round, me, to, i)).collect()
    };
    let from_all = |ctx, sig| -> Vec<WaitDesc> {
        (0..p).map(|q| WaitDesc { peer: Rank::new(q), count: 1, ctx, sig }).collect()
    };
    for round in 0..ROUNDS {
        let w = &wins[round % 2];
        for to in 0..p {
            c.put_signal(&data(round, to), Rank::new(to), w, me * SLOT, 1, 3).unwrap();
        }
        c.wait_signal(&from_all(1, 3)).unwrap();
        let mem: &[u8] = if round % 2 == 0 { &heap } else { &shared };
        for from in 0..p {
            let len = SLOT - (round * 977 + me) % 1000;
            let got = &mem[from * SLOT..from * SLOT + len];
            if let Some(i) = (0..len).find(|&i| got[i] != byte(round, from, me, i)) {
                panic!(
                    "rank {me} round {round}: byte {i} from rank {from} is {} not {}",
                    got[i],
                    byte(round, from, me, i)
                );
            }
        }
        for to in 0..p {
            c.signal(Rank::new(to), 0, 0).unwrap();
        }
        c.wait_signal(&from_all(0, 0)).unwrap();
    }
    // Counts add up: two signals from one peer, asked for by two descriptors of one wait.
    let next = (me + 1) % p;
    c.signal(Rank::new(next), 2, 7).unwrap();
    c.signal(Rank::new(next), 2, 7).unwrap();
    let prev = Rank::new((me + p - 1) % p);
    c.wait_signal(&[WaitDesc { peer: prev, count: 1, ctx: 2, sig: 7 }; 2]).unwrap();
    for w in wins {
        c.deregister_window(w).unwrap();
    }
    drop(shared);
}

#[test]
fn puts_land_exactly_over_every_transport() {
    let base = Config::default().with_timeout(Some(Duration::from_secs(60)));
    for (what, cfg) in [
        ("threads, direct writes", base.clone()),
        ("threads, shared memory off: streams", base.clone().with_shm_disabled(true)),
        ("threads on two hosts: streams between them", base.clone().with_host_id("split")),
    ] {
        let t = Instant::now();
        with_ranks(4, cfg, all_to_all_rounds);
        println!("{what}: {:?}", t.elapsed());
    }
}

#[test]
fn bad_arguments_are_refused_by_name_and_leave_the_communicator_usable() {
    let cfg = Config::default().with_timeout(Some(Duration::from_secs(30)));
    with_ranks(2, cfg, |c| {
        let mut a = vec![0u32; 16];
        let arg = |e: Error| match e {
            Error::Invalid(e) => e.to_string(),
            other => panic!("not an invalid argument: {other}"),
        };
        // SAFETY: `a` outlives the window.
        let w = unsafe { c.register_window(a.as_mut_ptr().cast(), 64, false) }.unwrap();
        let src = [1u32; 4];
        assert!(arg(c.put_signal(&src, Rank(1), &w, 60, 0, 0).unwrap_err()).contains("peerWinOffset"));
        assert!(arg(c.put_signal(&src, Rank(1), &w, usize::MAX, 0, 0).unwrap_err()).contains("peerWinOffset"));
        assert!(arg(c.put_signal(&src, Rank(2), &w, 0, 0, 0).unwrap_err()).contains("peer"));
        assert!(arg(c.put_signal(&src, Rank(1), &w, 0, 4, 0).unwrap_err()).contains("ctx"));
        assert!(arg(c.put_signal(&src, Rank(1), &w, 0, 0, 8).unwrap_err()).contains("sigIdx"));
        assert!(arg(c.signal(Rank(5), 0, 0).unwrap_err()).contains("peer"));
        let d = WaitDesc { peer: Rank(0), count: 1, ctx: 9, sig: 0 };
        assert!(arg(c.wait_signal(&[d]).unwrap_err()).contains("ctx"));
        // SAFETY: refused before anything is registered.
        let null = unsafe { c.register_window(std::ptr::null_mut(), 8, false) };
        assert!(arg(null.unwrap_err()).contains("buff"));
        // A put of exactly the window, then the window goes: puts into it are refused.
        c.put_signal(&[7u32; 16], c.rank(), &w, 0, 0, 0).unwrap();
        c.wait_signal(&[WaitDesc { peer: c.rank(), count: 1, ctx: 0, sig: 0 }]).unwrap();
        assert_eq!(a, vec![7u32; 16]);
        c.deregister_window(w).unwrap();
        assert!(arg(c.put_signal(&src, Rank(1), &w, 0, 0, 0).unwrap_err()).contains("not registered"));
        assert!(arg(c.deregister_window(w).unwrap_err()).contains("not registered"));
        // A device window is registered (order kept) but never written.
        let mut b = vec![0u8; 64];
        // SAFETY: `b` outlives the window; nothing writes it.
        let dev = unsafe { c.register_window(b.as_mut_ptr(), 64, true) }.unwrap();
        match c.put_signal(&[1u8], Rank(1), &dev, 0, 0, 0) {
            Err(Error::InvalidUsage(m)) => assert!(m.contains("device memory"), "{m}"),
            other => panic!("{other:?}"),
        }
        c.deregister_window(dev).unwrap();
        // Still usable.
        let mut r = [0u32; 1];
        c.all_reduce(&[1u32], &mut r, oxccl::ReduceOp::Sum).unwrap();
        assert_eq!(r[0], 2);
    });
}

#[test]
fn windows_of_another_communicator_are_refused() {
    let cfg = Config::default().with_timeout(Some(Duration::from_secs(30)));
    with_ranks(2, cfg, |c| {
        let other = c.split(Some(0), 0).unwrap().unwrap();
        let mut a = vec![0u8; 64];
        // SAFETY: `a` outlives the window.
        let w = unsafe { other.register_window(a.as_mut_ptr(), 64, false) }.unwrap();
        let mut b = vec![0u8; 64];
        // SAFETY: `b` outlives the window.
        let mine = unsafe { c.register_window(b.as_mut_ptr(), 64, false) }.unwrap();
        match c.put_signal(&[1u8], Rank(1), &w, 0, 0, 0) {
            Err(Error::Invalid(e)) => assert!(e.to_string().contains("another communicator"), "{e}"),
            other => panic!("{other:?}"),
        }
        c.deregister_window(mine).unwrap();
        other.deregister_window(w).unwrap();
    });
}

#[test]
fn a_wait_that_never_completes_times_out_fails_on_a_departed_peer_and_abort_ends_one() {
    let cfg = Config::default().with_timeout(Some(Duration::from_secs(2)));
    with_ranks(2, cfg, |c| {
        if c.rank() == Rank(0) {
            let t = Instant::now();
            let e = c.wait_signal(&[WaitDesc { peer: Rank(1), count: 3, ctx: 1, sig: 5 }]).unwrap_err();
            let m = e.to_string();
            assert!(matches!(e, Error::Timeout { .. }), "{m}");
            assert!(m.contains("3 signal(s) from rank 1 on sigIdx 5 ctx 1 (0 arrived)"), "{m}");
            assert!(t.elapsed() < Duration::from_secs(10));
        } else {
            // Outlives rank 0's wait without a word.
            std::thread::sleep(Duration::from_secs(3));
        }
    });
    // A peer that destroyed its communicator in order owes nothing more: after a grace for
    // frames still on their way, the wait fails naming it.
    let cfg = Config::default().with_timeout(None);
    with_ranks(2, cfg, |c| {
        if c.rank() == Rank(0) {
            let t = Instant::now();
            let e = c.wait_signal(&[WaitDesc { peer: Rank(1), count: 1, ctx: 0, sig: 0 }]).unwrap_err();
            let m = e.to_string();
            assert!(matches!(e, Error::PeerClosed { .. }) && m.contains("in order"), "{m}");
            assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
        } else {
            c.destroy().unwrap();
        }
    });
    let cfg = Config::default().with_timeout(None);
    with_ranks(2, cfg, |c| {
        if c.rank() == Rank(0) {
            let c = std::sync::Arc::new(c);
            let c2 = c.clone();
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                c2.abort();
            });
            let t = Instant::now();
            let e = c.wait_signal(&[WaitDesc { peer: Rank(1), count: 1, ctx: 0, sig: 0 }]).unwrap_err();
            assert!(matches!(e, Error::Aborted { .. }), "{e}");
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            aborter.join().unwrap();
        } else {
            std::thread::sleep(Duration::from_secs(1));
        }
    });
}

/// NCCL's barrier: every rank signals every rank and waits for one signal from each, with no
/// window registered anywhere (signals then go by stream, behind nothing), several rounds.
#[test]
fn signals_alone_make_a_barrier_without_any_window() {
    for shm_off in [false, true] {
        let cfg = Config::default().with_shm_disabled(shm_off).with_timeout(Some(Duration::from_secs(30)));
        with_ranks(3, cfg, |c| {
            let all: Vec<WaitDesc> =
                (0..c.size()).map(|q| WaitDesc { peer: Rank::new(q), count: 1, ctx: 0, sig: 0 }).collect();
            for _ in 0..5 {
                for q in 0..c.size() {
                    c.signal(Rank::new(q), 0, 0).unwrap();
                }
                c.wait_signal(&all).unwrap();
            }
        });
    }
}
