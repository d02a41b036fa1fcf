//! Growing a communicator and giving back its memory, through the Rust API (ranks as threads).

use oxccl::{Communicator, Config, Error, Rank, ReduceOp, UniqueId};
use std::sync::mpsc;
use std::time::Duration;

oxccl_testkit::test_scope!();

fn config() -> Config {
    Config::default().with_timeout(Some(Duration::from_secs(30)))
}

/// Every rank's all-reduce of `(rank + 1) * (i % 7 + 1)`, checked exactly.
fn check_sum(c: &Communicator, n: usize) {
    let send: Vec<i64> = (0..n).map(|i| (c.rank().0 as i64 + 1) * (i as i64 % 7 + 1)).collect();
    let mut recv = vec![0i64; n];
    c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
    let p = c.size() as i64;
    for (i, v) in recv.iter().enumerate() {
        assert_eq!(*v, p * (p + 1) / 2 * (i as i64 % 7 + 1), "rank {} of {p}, element {i}", c.rank());
    }
}

#[test]
fn two_ranks_grow_to_four_and_memory_is_given_back_and_rebuilt() {
    let id = oxccl::new_unique_id(&config()).unwrap();
    let (tx, rx) = mpsc::channel::<UniqueId>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        let mut joins = Vec::new();
        for r in 0..2usize {
            let tx = tx.clone();
            joins.push(s.spawn(move || {
                let c = Communicator::init(&id, 2, Rank::new(r), config()).unwrap();
                check_sum(&c, 1000);
                // Growing to no more ranks is refused, naming the argument.
                let e = c.grow(2, None).err().expect("refused");
                assert!(matches!(e, Error::Invalid(_)) && e.to_string().contains("size"), "{e}");
                let grow_id = (r == 0).then(|| oxccl::new_unique_id(&config()).unwrap());
                if let Some(g) = &grow_id {
                    tx.send(*g).unwrap();
                    tx.send(*g).unwrap();
                }
                let big = c.grow(4, grow_id.as_ref()).unwrap();
                assert_eq!((big.rank(), big.size()), (Rank::new(r), 4));
                check_sum(&big, 70001);
                big
            }));
        }
        for r in 2..4usize {
            let rx = &rx;
            joins.push(s.spawn(move || {
                let g = rx.lock().unwrap().recv().unwrap();
                let big = Communicator::init(&g, 4, Rank::new(r), config()).unwrap();
                check_sum(&big, 70001);
                big
            }));
        }
        let bigs: Vec<Communicator> = joins.into_iter().map(|j| j.join().unwrap()).collect();
        std::thread::scope(|s| {
            for big in &bigs {
                s.spawn(move || {
                    let before = big.memory();
                    assert!(before.releasable > 0 && before.connections > 0, "{before:?}");
                    big.release_memory().unwrap();
                    let after = big.memory();
                    assert_eq!((after.releasable, after.connections), (0, before.connections));
                    check_sum(big, 70001);
                    assert!(big.memory().releasable > 0, "calls rebuild their working memory");
                });
            }
        });
    });
}

#[test]
fn a_grow_without_an_id_or_with_two_fails_on_every_rank_alike() {
    let id = oxccl::new_unique_id(&config()).unwrap();
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..2usize)
            .map(|r| {
                s.spawn(move || {
                    let c = Communicator::init(&id, 2, Rank::new(r), config()).unwrap();
                    let none = c.grow(3, None).err().expect("no id: refused");
                    assert!(none.to_string().contains("no existing rank passed"), "{none}");
                    let mine = oxccl::new_unique_id(&config()).unwrap();
                    let two = c.grow(3, Some(&mine)).err().expect("two ids: refused");
                    assert!(two.to_string().contains("ranks [0, 1] each passed"), "{two}");
                    check_sum(&c, 13);
                })
            })
            .collect();
        for j in joins {
            j.join().unwrap();
        }
    });
}
