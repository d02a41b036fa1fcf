//! `oxccl-perf`: nccl-tests' benchmarks on oxccl, with nccl-tests' flags and output layout,
//! and a local launcher (`-np N`).
//!
//! ```text
//! oxccl-perf all_reduce_perf -np 4 -b 8 -e 64M -f 4
//! oxccl-perf --plot out.svg oxccl.json openmpi.json     (overlay JSON results)
//! ```
//! Run as `all_reduce_perf` (a link named after the benchmark), the first argument may be
//! omitted. Without `-np`, every process a launcher started (mpirun, srun, torchrun) is one
//! rank; a process started alone is a world of one.

mod args;
mod bench;
mod colls;
mod plot;
mod report;
mod sigpipe;
mod sizes;

use args::{Bench, Opts};
use oxccl::{Communicator, Config, Rank};
use std::process::Command;
use std::time::Duration;

const CHILD_ENV: &str = "OXCCL_PERF_CHILD";

/// Writes an SVG of this run's JSON results plus `extra` JSON files.
pub fn plot_files(svg: &str, ours: &[String], extra: &[String]) {
    let mut series = Vec::new();
    for f in ours.iter().chain(extra) {
        match plot::read(f) {
            Ok(s) => series.extend(s),
            Err(e) => eprintln!("oxccl-perf: --plot: {e}"),
        }
    }
    let title = ours.first().or(extra.first()).cloned().unwrap_or_default();
    match std::fs::write(svg, plot::svg(&series, &format!("oxccl-perf: {title}"))) {
        Ok(()) => println!("# Wrote plot {svg} ({} series)", series.len()),
        Err(e) => eprintln!("oxccl-perf: cannot write {svg}: {e}"),
    }
}

/// `-np N`: starts N copies of this program as ranks and waits for them.
fn launch(o: &Opts, args: &[String]) -> i32 {
    let np = o.np.unwrap_or(1);
    let id = match oxccl::new_unique_id(&Config::default()) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("oxccl-perf: cannot create a unique id: {e}");
            return 2;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("oxccl-perf: {e}");
            return 2;
        }
    };
    // The children get the same flags without -np, and the benchmark's name first.
    let mut child_args = vec![o.bench.program().to_string()];
    let mut i = 0;
    while i < args.len() {
        if args[i] == "-np" {
            i += 2;
            continue;
        }
        if Bench::parse(&args[i]).is_none() || i > 0 {
            child_args.push(args[i].clone());
        }
        i += 1;
    }
    let mut kids = Vec::new();
    for r in 0..np {
        let c = Command::new(&exe)
            .args(&child_args)
            .env(CHILD_ENV, "1")
            .env("OXCCL_RANK", r.to_string())
            .env("OXCCL_WORLD_SIZE", np.to_string())
            .env("OXCCL_LOCAL_RANK", r.to_string())
            .env("OXCCL_UNIQUE_ID", id.to_string())
            .spawn();
        match c {
            Ok(c) => kids.push(c),
            Err(e) => {
                eprintln!("oxccl-perf: cannot start rank {r}: {e}");
                for mut k in kids {
                    let _ = k.kill();
                }
                return 2;
            }
        }
    }
    let mut code = 0;
    let mut done = vec![false; np];
    let mut failed_at: Option<std::time::Instant> = None;
    while done.iter().any(|d| !d) {
        for (r, k) in kids.iter_mut().enumerate() {
            if done[r] {
                continue;
            }
            if let Ok(Some(s)) = k.try_wait() {
                done[r] = true;
                let c = s.code().unwrap_or(2);
                if c != 0 {
                    if code == 0 {
                        code = c;
                    }
                    failed_at.get_or_insert_with(std::time::Instant::now);
                }
            }
        }
        // A failed rank leaves the others waiting for it: end them after a grace period.
        if failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
            for (r, k) in kids.iter_mut().enumerate() {
                if !done[r] {
                    eprintln!("oxccl-perf: rank {r} still running after another rank failed; killing it");
                    let _ = k.kill();
                    let _ = k.wait();
                    done[r] = true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    code
}

fn run_rank(o: Opts) -> i32 {
    let mut config = match oxccl::env::config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oxccl-perf: {e}");
            return 2;
        }
    };
    if let Some(t) = o.timeout_s {
        config = config.with_timeout(Some(Duration::from_secs_f64(t)));
    }
    let launched = oxccl::env::launch();
    let t = o.nthreads;
    if t == 1 {
        let local = launched.as_ref().map_or(0, |l| l.local_rank.unwrap_or(0));
        config.cuda_device = device_for(&o, local);
        let comm = match &launched {
            Ok(l) => Communicator::from_env_with(config).map(|c| (c, l.local_rank.unwrap_or(0))),
            Err(_) => oxccl::new_unique_id(&config)
                .and_then(|id| Communicator::init(&id, 1, Rank(0), config))
                .map(|c| (c, 0)),
        };
        return match comm {
            Ok((c, local)) => run_one(&c, o, local),
            Err(e) => {
                eprintln!("oxccl-perf: communicator init failed: {e}");
                2
            }
        };
    }
    // -t N: this process's N ranks are threads, ranks prank * N .. prank * N + N - 1.
    let (prank, psize, local, id) = match launched {
        Ok(l) => match l.rendezvous {
            oxccl_core::launch::Rendezvous::Id(id) => (l.rank, l.size, l.local_rank.unwrap_or(0), id),
            _ => {
                eprintln!("oxccl-perf: -t > 1 needs -np or OXCCL_UNIQUE_ID (a launcher's own rendezvous serves one rank per process)");
                return 2;
            }
        },
        Err(_) => match oxccl::new_unique_id(&config) {
            Ok(id) => (0, 1, 0, id),
            Err(e) => {
                eprintln!("oxccl-perf: cannot create a unique id: {e}");
                return 2;
            }
        },
    };
    let codes: Vec<i32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..t)
            .map(|i| {
                let (o, mut config) = (o.clone(), config.clone());
                config.cuda_device = device_for(&o, local * t + i);
                s.spawn(move || match Communicator::init(&id, psize * t, Rank::new(prank * t + i), config) {
                    Ok(c) => run_one(&c, o, local * t + i),
                    Err(e) => {
                        eprintln!("oxccl-perf: rank {} init failed: {e}", prank * t + i);
                        2
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(2)).collect()
    });
    codes.into_iter().max().unwrap_or(0)
}

/// Runs one rank's benchmark; `local` is its index among the ranks of this host (its device
/// is `local % devices` with `--mem device`).
fn run_one(comm: &Communicator, o: Opts, local: usize) -> i32 {
    let dev = if o.device {
        match device_side(comm, local) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("oxccl-perf: rank {}: --mem device: {e}", comm.rank());
                return 2;
            }
        }
    } else {
        None
    };
    bench::Runner::new(comm, o, 0, dev).run()
}

/// With `--mem device`, the device of the rank with host index `local` (`local % devices`, as
/// [`device_side`] opens), told to init so that every rank knows every rank's device.
fn device_for(o: &Opts, local: usize) -> Option<i32> {
    if !o.device {
        return None;
    }
    let n = oxccl::cuda::driver::driver().ok()?.device_count().ok()?;
    (n > 0).then(|| (local % n as usize) as i32)
}

fn device_side(comm: &Communicator, local: usize) -> Result<bench::Dev<'_>, String> {
    use oxccl::cuda::{DevComm, Device, Stream};
    let d = oxccl::cuda::driver::driver().map_err(|e| e.to_string())?;
    let n = d.device_count().map_err(|e| e.to_string())?;
    if n <= 0 {
        return Err("no CUDA device".into());
    }
    let ordinal = (local % n as usize) as i32;
    let dev = Device::open(ordinal).map_err(|e| e.to_string())?;
    let stream = Stream::new(&dev).map_err(|e| e.to_string())?;
    let dc = DevComm::new(comm, ordinal).map_err(|e| e.to_string())?;
    Ok(bench::Dev { dc, dev, stream })
}

fn main() {
    sigpipe::restore_default();
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(|s| s.as_str()) == Some("--plot") {
        let Some(svg) = argv.get(2) else {
            eprintln!("{}", args::USAGE);
            std::process::exit(2);
        };
        plot_files(svg, &[], &argv[3..]);
        return;
    }
    let from_name = argv.first().and_then(|a| Bench::parse(a));
    let rest = &argv[1..];
    let o = match args::parse(rest, from_name) {
        Ok(o) => o,
        Err(args::ArgsError::Help) => {
            println!("{}", args::USAGE);
            return;
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let code =
        if o.np.is_some() && std::env::var_os(CHILD_ENV).is_none() { launch(&o, rest) } else { run_rank(o) };
    std::process::exit(code);
}
