//! Ranks as threads of one process: quick checks of the whole stack.

use oxccl::{Communicator, Config, Rank, ReduceOp};
use std::time::Duration;

oxccl_testkit::test_scope!();

fn with_ranks(n: usize, config: Config, f: impl Fn(Communicator) + Send + Sync + Copy + 'static) {
    let id = oxccl::new_unique_id(&config).unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let config = config.clone();
            std::thread::spawn(move || {
                let c = Communicator::init(&id, n, Rank::new(r), config).unwrap();
                f(c);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn all_reduce_threads_shm_and_tcp() {
    for shm_off in [false, true] {
        let cfg = Config::default()
            .with_log(oxccl::LogLevel::Trace)
            .with_shm_disabled(shm_off)
            .with_timeout(Some(Duration::from_secs(30)));
        with_ranks(4, cfg, |c| {
            for n in [0usize, 1, 7, 100_003] {
                let send: Vec<u32> = (0..n).map(|i| (i as u32) * (c.rank().0 + 1)).collect();
                let mut recv = vec![0u32; n];
                c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                for (i, v) in recv.iter().enumerate() {
                    assert_eq!(*v, (i as u32).wrapping_mul(10));
                }
            }
        });
    }
}

/// Large jobs over shared memory, repeated: each size class's first four jobs alternate
/// between ordinary and streaming stores into the slots (`engine::stores`), so jobs 2 and 4
/// of every size here write with streaming stores; every result must be exact either way.
#[test]
fn large_jobs_exact_with_either_kind_of_store() {
    let cfg = Config::default().with_timeout(Some(Duration::from_secs(60)));
    for p in [2usize, 3] {
        with_ranks(p, cfg.clone(), move |c| {
            let (me, p) = (c.rank().0, c.size());
            for n in [(1 << 18) + 3 * 7, (9 << 18) + 3 * 5] {
                let n = n / p * p;
                for job in 0..6u32 {
                    let send: Vec<u32> = (0..n).map(|i| (i as u32) ^ (me + job)).collect();
                    let want =
                        |i: usize| (0..p as u32).fold(0u32, |a, r| a.wrapping_add((i as u32) ^ (r + job)));
                    let mut recv = vec![0u32; n];
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                    assert!(
                        recv.iter().enumerate().all(|(i, v)| *v == want(i)),
                        "all_reduce n {n} job {job}"
                    );
                    let m = n / p;
                    let mut block = vec![0u32; m];
                    let mut g = c.group();
                    g.reduce_scatter(&send, &mut block, ReduceOp::Sum).unwrap();
                    g.end().unwrap();
                    let base = me as usize * m;
                    assert!(
                        block.iter().enumerate().all(|(i, v)| *v == want(base + i)),
                        "reduce_scatter n {n} job {job}"
                    );
                    let mut all = vec![0u32; n];
                    let mut g = c.group();
                    g.all_gather(&block, &mut all).unwrap();
                    g.end().unwrap();
                    assert!(all.iter().enumerate().all(|(i, v)| *v == want(i)), "all_gather n {n} job {job}");
                    let mut b = if me == 1 { send.clone() } else { vec![0u32; n] };
                    let root_send = b.clone();
                    let mut g = c.group();
                    g.broadcast(&root_send, &mut b, Rank::new(1)).unwrap();
                    g.end().unwrap();
                    assert!(
                        b.iter().enumerate().all(|(i, v)| *v == (i as u32) ^ (1 + job)),
                        "broadcast n {n} job {job}"
                    );
                }
            }
        });
    }
}

#[test]
fn tcp_two_ranks_big() {
    let cfg = Config::default().with_shm_disabled(true).with_timeout(Some(Duration::from_secs(10)));
    with_ranks(2, cfg, |c| {
        for n in [100_003usize, 100_003] {
            let send: Vec<u32> = (0..n).map(|i| (i as u32) * (c.rank().0 + 1)).collect();
            let mut recv = vec![0u32; n];
            let r = c.all_reduce(&send, &mut recv, ReduceOp::Sum);
            eprintln!("rank {} n {n}: {r:?}", c.rank());
            r.unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
    });
}

/// Sets a flag when dropped: stands for the references a binding hands `launch_detached`.
struct Flag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn detached_calls_complete_in_order_and_drop_their_keep_after_completion() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cfg = Config::default().with_timeout(Some(Duration::from_secs(30)));
    with_ranks(3, cfg, |c| {
        let n = 300_007usize;
        let me = c.rank().0;
        // The input's ownership moves into the keep-alive, as a Python object's would; the
        // output stays here to be checked.
        let send: Box<[u32]> = (0..n as u32).map(|i| i.wrapping_mul(me + 1)).collect();
        let mut recv = vec![0u32; n];
        let (sp, rp) = (send.as_ptr(), recv.as_mut_ptr());
        let dropped = Arc::new(AtomicBool::new(false));
        let keep: Box<dyn Send> = Box::new((send, Flag(dropped.clone())));
        let mut g = c.group();
        // SAFETY: `send` is owned by `keep`, which the call drops only once complete; `recv`
        // is not touched here until the call is complete (checked below before reading it).
        let (s, r) = unsafe { (std::slice::from_raw_parts(sp, n), std::slice::from_raw_parts_mut(rp, n)) };
        g.all_reduce(s, r, ReduceOp::Sum).unwrap();
        // SAFETY: as above.
        let w = unsafe { g.launch_detached(keep) }.unwrap();
        // A blocking call after it runs after it (calls run in issue order).
        let mut x = [me + 1];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x[0], 6);
        assert!(
            w.test(),
            "rank {me}: the detached call was not complete when a later blocking call returned"
        );
        assert!(dropped.load(Ordering::SeqCst), "rank {me}: keep not dropped after completion");
        w.wait().unwrap();
        for (i, v) in recv.iter().enumerate() {
            assert_eq!(*v, (i as u32).wrapping_mul(6), "rank {me}: element {i}");
        }
        // An empty group completes at once, dropping its keep.
        let d2 = Arc::new(AtomicBool::new(false));
        // SAFETY: no buffers.
        let w2 = unsafe { c.group().launch_detached(Box::new(Flag(d2.clone()))) }.unwrap();
        assert!(w2.test() && d2.load(Ordering::SeqCst));
        w2.wait().unwrap();
    });
}

/// Inline calls (contributions up to 64 KiB on heap buffers) whose contributions are copied
/// in with streaming stores (all-reduce and broadcast from 16 KiB, `engine::direct`), repeated
/// so that both inline areas are reused: every result exact, in place and out of place.
#[test]
fn inline_calls_exact_with_streamed_contributions() {
    let cfg = Config::default().with_timeout(Some(Duration::from_secs(60)));
    for p in [2usize, 3] {
        with_ranks(p, cfg.clone(), move |c| {
            let (me, p) = (c.rank().idx() as u32, c.size() as u32);
            for n in [4096usize, 4097, 10_001, 16_384] {
                for job in 0..5u32 {
                    let x = |r: u32, i: usize| (i as u32).wrapping_mul(2_654_435_761) ^ (r << 20) ^ job;
                    let want = |i: usize| (0..p).fold(0u32, |a, r| a.wrapping_add(x(r, i)));
                    let send: Vec<u32> = (0..n).map(|i| x(me, i)).collect();
                    let mut recv = vec![0u32; n];
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                    assert!(
                        recv.iter().enumerate().all(|(i, v)| *v == want(i)),
                        "all_reduce n {n} job {job}"
                    );
                    let mut buf = send.clone();
                    c.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                    assert_eq!(buf, recv, "all_reduce in place n {n} job {job}");
                    let root = job % p;
                    let mut b = if me == root { send.clone() } else { vec![0u32; n] };
                    c.broadcast_in_place(&mut b, Rank::new(root as usize)).unwrap();
                    assert!(b.iter().enumerate().all(|(i, v)| *v == x(root, i)), "broadcast n {n} job {job}");
                }
            }
        });
    }
}
