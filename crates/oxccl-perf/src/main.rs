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

#[cfg(test)]
oxccl_testkit::test_scope!();

mod args;
mod bench;
mod colls;
mod launcher;
mod plot;
mod report;
mod sigpipe;
mod sizes;
mod stamp;
mod suggest;

use args::{Bench, Opts};
use oxccl::{Communicator, Rank};
use std::time::Duration;

/// Writes an SVG of this run's JSON results plus `extra` JSON files, titled `title` (or, when
/// none is given, by the first file's name).
pub fn plot_files(svg: &str, ours: &[String], extra: &[String], title: Option<&str>) {
    let mut series = Vec::new();
    for f in ours.iter().chain(extra) {
        match plot::read(f) {
            Ok(s) => series.extend(s),
            Err(e) => eprintln!("oxccl-perf: --plot: {e}"),
        }
    }
    let title = match title {
        Some(t) => t.to_string(),
        None => format!("oxccl-perf: {}", ours.first().or(extra.first()).cloned().unwrap_or_default()),
    };
    match std::fs::write(svg, plot::svg(&series, &title)) {
        Ok(()) => println!("# Wrote plot {svg} ({} series)", series.len()),
        Err(e) => eprintln!("oxccl-perf: cannot write {svg}: {e}"),
    }
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
    // A process no launcher started is a world of one; one a launcher started is a rank of
    // its job, or an error that says why it cannot meet the others (never a world of one).
    let launched = match oxccl::env::launch() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("oxccl-perf: {e}");
            return 2;
        }
    };
    // A root outside the job is refused before the rendezvous, by rank 0 alone: every rank has
    // the same command line. The others end without a word a moment later, so that a launcher
    // that stops the job at its first failure lets rank 0 say why.
    let (ranks, job) = args::job(None, launched.as_ref().map(|l| (l.launcher, l.size)), o.nthreads);
    if let Err(e) = args::check_root(&o, ranks, &job) {
        if launched.as_ref().is_none_or(|l| l.rank == 0) {
            eprintln!("oxccl-perf: {e}");
        } else {
            std::thread::sleep(Duration::from_millis(500));
        }
        return 2;
    }
    let (prank, psize, local, id) = match &launched {
        Some(l) => match oxccl::rendezvous::unique_id(l, &config) {
            Ok(id) => (l.rank, l.size, l.local_rank.unwrap_or(0), id),
            Err(e) => {
                eprintln!("oxccl-perf: communicator init failed: {e}");
                return 2;
            }
        },
        None => match oxccl::new_unique_id(&config) {
            Ok(id) => (0, 1, 0, id),
            Err(e) => {
                eprintln!("oxccl-perf: cannot create a unique id: {e}");
                return 2;
            }
        },
    };
    // -t N: this process's N ranks are threads, ranks prank * N .. prank * N + N - 1.
    let t = o.nthreads;
    if t == 1 {
        config.cuda_device = device_for(&o, local);
        return match Communicator::init(&id, psize, Rank::new(prank), config) {
            Ok(c) => run_one(&c, o, local),
            Err(e) => {
                eprintln!("oxccl-perf: communicator init failed: {e}");
                2
            }
        };
    }
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
            eprintln!("oxccl-perf: --plot needs the SVG file to write: --plot <file.svg> [--title <text>] <json...>");
            std::process::exit(2);
        };
        let (title, files) = match argv.get(3).map(|s| s.as_str()) {
            Some("--title") => match argv.get(4) {
                Some(t) => (Some(t.as_str()), &argv[5..]),
                None => {
                    eprintln!("oxccl-perf: --plot: --title needs a text\n{}", args::SEE_HELP);
                    std::process::exit(2);
                }
            },
            _ => (None, &argv[3..]),
        };
        plot_files(svg, &[], files, title);
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
            eprintln!("oxccl-perf: {e}");
            std::process::exit(2);
        }
    };
    let code = if o.np.is_some() && std::env::var_os(launcher::CHILD_ENV).is_none() {
        // Under another launcher every process is already a rank of its job: -np would start
        // a separate job from each of them.
        if let Ok(Some(l)) = oxccl::env::launch() {
            eprintln!(
                "oxccl-perf: {} started this process as rank {} of {}: leave -np out (each process it starts is one rank)",
                l.launcher, l.rank, l.size
            );
            std::process::exit(2);
        }
        launcher::launch(&o, rest)
    } else {
        run_rank(o)
    };
    std::process::exit(code);
}
