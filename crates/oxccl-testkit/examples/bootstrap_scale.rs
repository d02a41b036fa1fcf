//! Bootstrap at rank counts beyond what processes on this host allow: ranks as threads of one
//! process (TCP only: shared memory and direct copies off, 8 ranks per simulated host), dense
//! and sparse bootstrap side by side.
//!
//! ```text
//! cargo run --release -p oxccl-testkit --example bootstrap_scale -- [--reps 3] [--modes dense,sparse] 64 128 256 512 1024
//! ```
//! Printed per count and mode (median of --reps): init = the last rank's return from
//! `Communicator::init` less the last rank's start of it; first = the first 8-byte all-reduce
//! (which opens the ring's data connections); sockets = TCP sockets the process held after
//! init, per rank; lifelines = the largest count of control connections a rank keeps.
//! Dense at large counts needs many file descriptors (each rank connects to every peer): the
//! example raises its own limit as far as the hard limit allows and skips a count it cannot
//! hold.

use oxccl::{Communicator, Config, ReduceOp};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
    }
    l.rlim_cur
}

struct Run {
    init_ms: f64,
    first_ms: f64,
    sockets: usize,
    lifelines: usize,
}

fn run(n: usize, sparse: bool) -> Result<Run, String> {
    let config = Config::default()
        .with_timeout(Some(Duration::from_secs(300)))
        .with_bootstrap_sparse_from(if sparse { 2 } else { 0 })
        .with_shm_disabled(true)
        .with_direct(false);
    let id = oxccl::new_unique_id(&config).map_err(|e| e.to_string())?;
    let epoch = Instant::now();
    let after_init = Arc::new(Barrier::new(n + 1));
    let counted = Arc::new(Barrier::new(n + 1));
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let config = config.clone().with_host_id(&format!("host{}", r / 8));
            let (after_init, counted) = (after_init.clone(), counted.clone());
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    let t0 = epoch.elapsed();
                    let comm = Communicator::init(&id, n, oxccl::Rank::new(r), config);
                    let t1 = epoch.elapsed();
                    after_init.wait();
                    counted.wait();
                    let comm = comm.map_err(|e| e.to_string())?;
                    let mut x = [1u64];
                    comm.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(|e| e.to_string())?;
                    let t2 = epoch.elapsed();
                    if x[0] != n as u64 {
                        return Err(format!("rank {r}: all-reduce gave {}, not {n}", x[0]));
                    }
                    let lifelines = comm.lifelines().len();
                    comm.destroy().map_err(|e| e.to_string())?;
                    Ok((t0, t1, t2, lifelines))
                })
                .expect("spawn a rank thread")
        })
        .collect();
    after_init.wait();
    let socks = sockets();
    counted.wait();
    let mut out = Vec::with_capacity(n);
    for h in hs {
        out.push(h.join().map_err(|_| "a rank thread panicked".to_string())??);
    }
    let last = |f: fn(&(Duration, Duration, Duration, usize)) -> Duration| {
        out.iter().map(f).max().unwrap_or_default().as_secs_f64() * 1e3
    };
    Ok(Run {
        init_ms: last(|o| o.1) - last(|o| o.0),
        first_ms: last(|o| o.2) - last(|o| o.1),
        sockets: socks,
        lifelines: out.iter().map(|o| o.3).max().unwrap_or(0),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let reps: usize = opt("--reps").and_then(|v| v.parse().ok()).unwrap_or(3);
    let modes = opt("--modes").unwrap_or_else(|| "dense,sparse".into());
    let counts: Vec<usize> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || !args[i - 1].starts_with("--")))
        .filter_map(|(_, a)| a.parse().ok())
        .collect();
    let fds = raise_fd_limit();
    println!(
        "# bootstrap_scale on {} ({} CPUs), ranks as threads, TCP, 8 per host; fd limit {fds}",
        oxccl::sys::host::hostname(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "# {:>5} {:>6} {:>10} {:>10} {:>14} {:>10}",
        "ranks", "mode", "init (ms)", "first (ms)", "sockets/rank", "lifelines"
    );
    for &n in &counts {
        for mode in modes.split(',') {
            let sparse = mode == "sparse";
            // Dense: every rank connects to every other (2 sockets per pair in one process),
            // plus listeners and data connections.
            if !sparse && (n * n + 8 * n) as u64 > fds {
                println!("  {n:>5} {mode:>6} skipped: needs about {} descriptors", n * n + 8 * n);
                continue;
            }
            let mut runs = Vec::new();
            for _ in 0..reps {
                match run(n, sparse) {
                    Ok(r) => runs.push(r),
                    Err(e) => {
                        println!("  {n:>5} {mode:>6} failed: {e}");
                        break;
                    }
                }
            }
            if runs.len() < reps {
                continue;
            }
            let socks = runs.iter().map(|r| r.sockets).max().unwrap_or(0) as f64 / n as f64;
            println!(
                "  {n:>5} {mode:>6} {:>10.1} {:>10.2} {:>14.1} {:>10}",
                median(runs.iter().map(|r| r.init_ms).collect()),
                median(runs.iter().map(|r| r.first_ms).collect()),
                socks,
                runs.iter().map(|r| r.lifelines).max().unwrap_or(0),
            );
        }
    }
}
