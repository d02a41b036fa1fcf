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
