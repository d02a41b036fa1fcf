//! The cost of the C ABI layer: 8-byte all-reduces through `ncclAllReduce` (the same entry
//! point C programs call) against the Rust API's `Communicator::all_reduce`, side by side.
//!
//! `cargo run --release -p oxccl-capi --example abi_overhead -- [-np N] [-n ITERS] [-r ROUNDS]`
//!
//! N ranks run as threads of this process, each holding two communicators over the same
//! transport (one made by `ncclCommInitRank`, one by `Communicator::init`). Each round times
//! ITERS calls on one, then on the other (the order alternates between rounds); rank 0
//! prints every round and the medians.
use nccl::{ncclAllReduce, ncclCommDestroy, ncclCommInitRank, ncclComm_t, ncclGetUniqueId, ncclUniqueId};
use oxccl::{Communicator, Config, Rank, ReduceOp};
use std::sync::{Arc, Barrier};
use std::time::Instant;

fn arg(args: &[String], flag: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{flag} takes a number")))
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (np, iters, rounds) = (arg(&args, "-np", 2), arg(&args, "-n", 2000), arg(&args, "-r", 11));
    let rust_id = oxccl::new_unique_id(&Config::default()).expect("unique id");
    let mut c_id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut c_id) }, 0);
    let barrier = Arc::new(Barrier::new(np));
    let hs: Vec<_> = (0..np)
        .map(|r| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let rust = Communicator::init(&rust_id, np, Rank::new(r), Config::default()).expect("init");
                let mut comm: ncclComm_t = std::ptr::null_mut();
                // SAFETY: valid out-pointer, id and rank.
                assert_eq!(unsafe { ncclCommInitRank(&mut comm, np as i32, c_id, r as i32) }, 0);
                let send = [1.0f32, 2.0];
                let mut recv = [0.0f32; 2];
                let mut run = |abi: bool| -> f64 {
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..iters {
                        if abi {
                            // SAFETY: two floats each way, a live communicator, host memory.
                            let rc = unsafe {
                                ncclAllReduce(
                                    send.as_ptr().cast(),
                                    recv.as_mut_ptr().cast(),
                                    2,
                                    7,
                                    0,
                                    comm,
                                    std::ptr::null_mut(),
                                )
                            };
                            assert_eq!(rc, 0);
                        } else {
                            rust.all_reduce(&send, &mut recv, ReduceOp::Sum).expect("all_reduce");
                        }
                    }
                    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
                    assert_eq!(recv, [np as f32, 2.0 * np as f32]);
                    us
                };
                run(false);
                run(true);
                let (mut rs, mut cs) = (Vec::new(), Vec::new());
                for round in 0..rounds {
                    let (a, b) = if round % 2 == 0 {
                        let a = run(false);
                        (a, run(true))
                    } else {
                        let b = run(true);
                        (run(false), b)
                    };
                    if r == 0 {
                        println!("round {round:2}: rust {a:7.2} us  c-abi {b:7.2} us  ratio {:.3}", b / a);
                    }
                    rs.push(a);
                    cs.push(b);
                }
                // SAFETY: the communicator made above, destroyed once.
                assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
                (rs, cs)
            })
        })
        .collect();
    let results: Vec<_> = hs.into_iter().map(|h| h.join().expect("rank thread")).collect();
    let (rs, cs) = &results[0];
    let ratios: Vec<f64> = rs.iter().zip(cs).map(|(a, b)| b / a).collect();
    println!(
        "{np} ranks, 8-byte float all-reduce, {iters} calls x {rounds} rounds: median rust {:.2} us, c-abi {:.2} us, median per-round ratio c-abi/rust {:.3} (min {:.3}, max {:.3})",
        median(rs.clone()),
        median(cs.clone()),
        median(ratios.clone()),
        ratios.iter().cloned().fold(f64::INFINITY, f64::min),
        ratios.iter().cloned().fold(0.0, f64::max),
    );
}
