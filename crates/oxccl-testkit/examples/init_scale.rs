//! Bootstrap and connection set-up time against the rank count, on this host.
//!
//! ```text
//! cargo run --release -p oxccl-testkit --example init_scale -- [--tcp] [--reps 3] 2 4 8 16 32 64
//! ```
//! For each rank count, ranks are started as processes; each stamps (microseconds since the
//! epoch) the moment before `Communicator::init`, after it, after a first 8-byte all-reduce
//! (which opens the ring's connections), and after 10 more. Printed per count: init = the last
//! rank's return from init less the last rank's start of it (the rendezvous: every join at the
//! root and the table back), first call, and a later call, in milliseconds (median of --reps).

use oxccl::{Communicator, Config, ReduceOp};
use oxccl_testkit::{child, Launch};
use std::time::Duration;

const SCENARIO: &str = "init_scale";

fn now_us() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros())
}

fn rank_main() {
    let t0 = now_us();
    let comm = Communicator::from_env().unwrap_or_else(|e| {
        eprintln!("init failed: {e}");
        std::process::exit(1)
    });
    let t1 = now_us();
    let mut x = [1.0f32, 2.0];
    comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_or_else(|e| {
        eprintln!("all_reduce failed: {e}");
        std::process::exit(1)
    });
    let t2 = now_us();
    for _ in 0..10 {
        let _ = comm.all_reduce_in_place(&mut x, ReduceOp::Sum);
    }
    let t3 = now_us();
    println!("T {t0} {t1} {t2} {t3}");
    let _ = comm.destroy();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if let Some(_ctx) = child(SCENARIO) {
        return rank_main();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tcp = args.iter().any(|a| a == "--tcp");
    let reps: usize =
        args.iter().position(|a| a == "--reps").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(3);
    let counts: Vec<usize> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--reps"))
        .filter_map(|(_, a)| a.parse().ok())
        .collect();
    println!(
        "# init_scale on {} ({} CPUs), transport {}",
        oxccl::sys::host::hostname(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if tcp { "TCP" } else { "shared memory" }
    );
    println!("# {:>5} {:>10} {:>14} {:>12}", "ranks", "init (ms)", "1st call (ms)", "call (ms)");
    for &n in &counts {
        let (mut init, mut first, mut call) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            let id = oxccl::new_unique_id(&Config::default()).expect("unique id");
            let l = Launch::program(SCENARIO, n, &[])
                .env("OXCCL_UNIQUE_ID", &id.to_string())
                .env("OXCCL_TIMEOUT", "120")
                .env("NCCL_SHM_DISABLE", if tcp { "1" } else { "0" })
                .timeout(Duration::from_secs(300));
            let done = l.run().unwrap_or_else(|e| panic!("{n} ranks: {e}"));
            let stamps: Vec<[u128; 4]> = done
                .iter()
                .filter_map(|d| d.stdout.lines().find_map(|l| l.strip_prefix("T ")))
                .map(|l| {
                    let v: Vec<u128> = l.split(' ').filter_map(|x| x.parse().ok()).collect();
                    [v[0], v[1], v[2], v[3]]
                })
                .collect();
            assert_eq!(stamps.len(), n, "every rank reports");
            let last = |i: usize| stamps.iter().map(|s| s[i]).max().unwrap_or(0) as f64;
            init.push((last(1) - last(0)) / 1e3);
            first.push((last(2) - last(1)) / 1e3);
            call.push((last(3) - last(2)) / 1e3 / 10.0);
        }
        println!("  {n:>5} {:>10.2} {:>14.2} {:>12.3}", median(init), median(first), median(call));
    }
}
