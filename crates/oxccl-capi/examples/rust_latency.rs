//! The Rust-API twin of `bench/allreduce_latency.c`: the same loop of 8-byte float
//! all-reduces through `Communicator::all_reduce`, one process per rank, so the two can run
//! side by side (see docs/capi.md).
//!
//! Usage: rust_latency DIR NRANKS RANK [ITERS [ROUNDS]]
use oxccl::{Communicator, Config, Rank, ReduceOp, UniqueId};
use std::time::{Duration, Instant};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (dir, p, r) =
        (std::path::PathBuf::from(&a[1]), a[2].parse::<usize>().unwrap(), a[3].parse::<usize>().unwrap());
    let iters: usize = a.get(4).map_or(20000, |v| v.parse().unwrap());
    let rounds: usize = a.get(5).map_or(5, |v| v.parse().unwrap());
    let path = dir.join("rust-id");
    let id = if r == 0 {
        let id = oxccl::new_unique_id(&Config::default()).unwrap();
        std::fs::write(dir.join("rust-id.tmp"), id.to_string()).unwrap();
        std::fs::rename(dir.join("rust-id.tmp"), &path).unwrap();
        id
    } else {
        let t = Instant::now();
        loop {
            if let Some(id) = std::fs::read_to_string(&path).ok().and_then(|s| s.parse::<UniqueId>().ok()) {
                break id;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "no unique id at {}", path.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let comm = Communicator::init(&id, p, Rank::new(r), Config::default()).unwrap();
    let s = [1.0f32, 2.0];
    let mut d = [0.0f32; 2];
    for _ in 0..1000 {
        comm.all_reduce(&s, &mut d, ReduceOp::Sum).unwrap();
    }
    let mut t = Vec::new();
    for k in 0..rounds {
        let t0 = Instant::now();
        for _ in 0..iters {
            comm.all_reduce(&s, &mut d, ReduceOp::Sum).unwrap();
        }
        t.push(t0.elapsed().as_secs_f64() * 1e6 / iters as f64);
        assert_eq!(d, [p as f32, 2.0 * p as f32]);
        if r == 0 {
            println!("round {k}: {:.3} us", t[k]);
        }
    }
    t.sort_by(|a, b| a.total_cmp(b));
    if r == 0 {
        println!("rust median {:.3} us per 8-byte all-reduce ({p} ranks, {rounds} x {iters})", t[rounds / 2]);
    }
}
