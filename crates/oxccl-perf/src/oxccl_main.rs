//! `oxccl`: tools around the library, one subcommand each, on clap (`oxccl --help`,
//! `oxccl SUBCOMMAND --help`; unknown options and missing arguments are errors, exit 2).
//!
//! - `oxccl analyze DUMP...` merges the ranks' flight recorder dumps and prints the verdict:
//!   which rank stopped first, at which call, who waited for whom, and the first error.
//! - `oxccl topo [--topo FILE] [--channels N] [--svg FILE] [--dump FILE]` prints this host's
//!   topology (or a topology file's) as `nvidia-smi topo -m` does, then the rings and trees
//!   built over it; `--svg` draws it, `--dump` writes the topology file.
//! - `oxccl explain COLLECTIVE --ranks N` prints, for sizes 8 B .. 4 GiB, the predicted time
//!   of every algorithm × protocol and the choice for N CPU ranks on this host; with
//!   `--topo FILE` for a topology file's GPUs (`--ranks` then defaults to all of them).
//!   `NCCL_ALGO`, `NCCL_PROTO`, `NCCL_MIN/MAX_NCHANNELS` apply.
//! - `oxccl sim --cluster FILE --ranks N,... [-b 8 -e 64M -f 8] [--algo ring,tree]` simulates
//!   oxccl's own all-reduce plans on a cluster file and prints nccl-tests tables, the ring
//!   against the tree, and the tuner's pick; `oxccl sim --bootstrap` prices the bootstrap
//!   (see `simcmd`).
//!
//! A failing command prints `oxccl COMMAND: why` on stderr and exits 1; a closed stdout ends
//! the process quietly (`sigpipe`).

#[cfg(test)]
oxccl_testkit::test_scope!();

#[allow(dead_code)]
mod plot;
#[allow(dead_code)]
mod report;
mod sigpipe;
mod simcmd;
mod sizes;
mod suggest;

use clap::{Args, Parser, Subcommand};
use oxccl_core::topo::{graphs, Topo};
use oxccl_core::tuner::{explain_sizes, Model, RingColl};
use std::path::{Path, PathBuf};

/// Tools around oxccl: flight recorder dumps, topology, the tuner's reasoning, the simulator.
#[derive(Parser, Debug)]
#[command(name = "oxccl", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Merge the ranks' flight recorder dumps and say which rank stopped first
    ///
    /// The verdict: which rank stopped first, at which call, who waited for whom, and the
    /// first error.
    Analyze(AnalyzeArgs),
    /// Print the topology, then the rings and trees built over it
    ///
    /// This host's topology (or a topology file's) as `nvidia-smi topo -m` prints it: the path
    /// types between GPUs and NICs, CPU and NUMA affinity; then the rings and trees of each
    /// channel and where ranks bind their progress threads.
    Topo(TopoArgs),
    /// Print the tuner's predicted times and its choice, size by size
    ///
    /// For sizes 8 B .. 4 GiB, the predicted time of every algorithm × protocol and the
    /// choice, for N CPU ranks on this host or, with --topo, a topology file's GPUs.
    /// NCCL_ALGO, NCCL_PROTO and NCCL_MIN/MAX_NCHANNELS apply.
    Explain(ExplainArgs),
    /// Simulate oxccl's all-reduce plans on a cluster file, or price the bootstrap
    ///
    /// Prints nccl-tests tables per rank count and algorithm, ring against tree, and the
    /// tuner's pick per size; with --bootstrap, the bootstrap's cost model, dense against
    /// sparse.
    Sim(simcmd::SimArgs),
    /// Print every environment variable oxccl reads, its value here, default and meaning
    ///
    /// The one table of oxccl's NCCL_* and OXCCL_* variables (settings, launcher, topology, caches),
    /// with this process's values; then whether the settings parse (exit 1 naming the
    /// variable if one does not).
    Env,
}

#[derive(Args, Debug)]
struct AnalyzeArgs {
    /// Flight recorder dumps (oxccl-flight-*.json), one per rank
    #[arg(required = true, value_name = "DUMP.json")]
    dumps: Vec<PathBuf>,
}

#[derive(Args, Debug)]
struct TopoArgs {
    /// Read this topology file instead of detecting this host's (as NCCL_TOPO_FILE does)
    #[arg(long, value_name = "FILE")]
    topo: Option<PathBuf>,
    /// Channels to build rings and trees for
    #[arg(long, value_name = "N", default_value_t = 2)]
    channels: usize,
    /// Draw the (first) host as SVG
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Write the topology file
    #[arg(long, value_name = "FILE")]
    dump: Option<PathBuf>,
    /// Show the hierarchy of this many CPU ranks over --hosts hosts (rank h·k + l on host h)
    #[arg(long, value_name = "N", requires = "hosts", value_parser = rank_count)]
    ranks: Option<usize>,
    /// Hosts the --ranks are spread over, the same number on each
    #[arg(long, value_name = "H", requires = "ranks", value_parser = rank_count)]
    hosts: Option<usize>,
    /// Rails (interfaces) per host between hosts [default: those NCCL_SOCKET_IFNAME selects here]
    #[arg(long, value_name = "R", requires = "hosts", value_parser = rail_count)]
    rails: Option<usize>,
}

#[derive(Args, Debug)]
struct ExplainArgs {
    /// allreduce, allgather, reducescatter, broadcast or reduce
    #[arg(value_name = "COLLECTIVE", value_parser = collective)]
    collective: RingColl,
    /// Ranks: CPU ranks on this host, or with --topo GPUs of the topology [default with --topo:
    /// all its GPUs]
    #[arg(long, value_name = "N", required_unless_present = "topo", value_parser = rank_count)]
    ranks: Option<usize>,
    /// Price this topology file's GPUs instead of this host's CPU ranks
    #[arg(long, value_name = "FILE")]
    topo: Option<PathBuf>,
    /// CPU ranks spread over this many hosts, the same number on each (the hierarchical plans
    /// need it); between hosts this host's measured TCP, or --link-gbit
    #[arg(long, value_name = "H", default_value_t = 1, value_parser = rank_count, conflicts_with = "topo")]
    hosts: usize,
    /// Each host's link to the others, Gbit/s (e.g. 1, 10, 100): what one TCP stream and the
    /// host's NIC carry [default: this host's measured loopback TCP]
    #[arg(long, value_name = "GBITS", requires = "hosts", conflicts_with = "topo", value_parser = gbits)]
    link_gbit: Option<f64>,
    /// Links (rails) per host, each of --link-gbit: a stream carries one, a host all
    #[arg(long, value_name = "R", default_value_t = 1, requires = "link_gbit", value_parser = rail_count)]
    rails: usize,
}

fn gbits(v: &str) -> Result<f64, String> {
    v.parse()
        .ok()
        .filter(|g: &f64| g.is_finite() && *g > 0.0)
        .ok_or_else(|| "not a positive rate in Gbit/s".into())
}

fn rank_count(v: &str) -> Result<usize, String> {
    v.parse().ok().filter(|&n: &usize| n >= 1).ok_or_else(|| "not a rank count of at least 1".into())
}

fn rail_count(v: &str) -> Result<usize, String> {
    let max = oxccl_core::ifname::MAX_RAILS;
    v.parse()
        .ok()
        .filter(|&n: &usize| (1..=max).contains(&n))
        .ok_or_else(|| format!("not a rail count (1 to {max})"))
}

fn collective(v: &str) -> Result<RingColl, String> {
    const NAMES: [&str; 5] = ["allreduce", "allgather", "reducescatter", "broadcast", "reduce"];
    RingColl::parse(v).ok_or_else(|| {
        format!(
            "the collectives are allreduce, allgather, reducescatter, broadcast and reduce{}",
            suggest::did_you_mean(&v.to_ascii_lowercase(), NAMES)
        )
    })
}

fn fail(cmd: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("oxccl {cmd}: {e}");
    std::process::exit(1);
}

/// The topology file at `path`, or this host's detected topology.
fn load(cmd: &str, path: Option<&Path>) -> Topo {
    match path {
        Some(f) => {
            let text =
                std::fs::read_to_string(f).unwrap_or_else(|e| fail(cmd, format!("{}: {e}", f.display())));
            Topo::parse(&text).unwrap_or_else(|e| fail(cmd, format!("{}: {e}", f.display())))
        }
        None => oxccl::topo::system(|k| std::env::var(k).ok()).unwrap_or_else(|e| fail(cmd, e)),
    }
}

fn analyze(a: &AnalyzeArgs) {
    match oxccl::flight::analyze_files(&a.dumps) {
        Ok(v) => print!("{v}"),
        Err(e) => fail("analyze", e),
    }
}

fn topo(a: &TopoArgs) {
    let config = oxccl::Config::from_lookup(|k| std::env::var(k).ok()).unwrap_or_else(|e| fail("topo", e));
    // Check the hierarchy's arguments before any detection.
    let layout = match (a.ranks, a.hosts) {
        (Some(n), Some(h)) if n % h != 0 || n < h => fail("topo", format!("--ranks {n} over --hosts {h}: every host holds the same number of ranks, so the ranks must be a multiple of the hosts")),
        (Some(n), Some(h)) => Some((h, n / h)),
        _ => None,
    };
    let t = load("topo", a.topo.as_deref());
    // Hosts that are copies of one another are printed once.
    let mut shown: Vec<usize> = Vec::new();
    for (i, h) in t.hosts.iter().enumerate() {
        if shown.iter().any(|&j| t.hosts[j].nodes == h.nodes && t.hosts[j].links == h.links) {
            continue;
        }
        let same = t.hosts.iter().filter(|o| o.nodes == h.nodes && o.links == h.links).count();
        println!("# host {} ({same} host(s) like it)", h.name);
        print!("{}", t.matrix(i));
        println!();
        shown.push(i);
    }
    print!("{}", graphs::describe(&t, a.channels));
    // Affinity: where ranks started here put their progress threads.
    let launch = oxccl::sys::affinity::current();
    let h = &t.hosts[0];
    let b = oxccl::topo::binding(h, &launch, None, false);
    let node = |b: &oxccl::topo::Binding| {
        b.numa.map_or("no NUMA node known: not bound".into(), |n| format!("NUMA node {n}"))
    };
    println!(
        "affinity: ranks on this host's CPUs bind their progress thread to {}; connection buffers on {}",
        b.why,
        node(&b)
    );
    for n in h.nics() {
        let b = oxccl::topo::binding(h, &launch, Some(&h.nodes[n].name), true);
        println!(
            "affinity: ranks whose traffic leaves through {}: {}; connection buffers on {}",
            h.nodes[n].name,
            b.why,
            node(&b)
        );
    }
    // Between hosts: the interfaces this host's ranks would use, then the hierarchy.
    let links = oxccl::rendezvous::links(&config);
    match &links {
        Ok(links) => {
            for (r, l) in links.iter().enumerate() {
                let speed = match l.gbit {
                    Some((g, true)) => format!("{g} Gbit/s (OXCCL_NET_GBIT)"),
                    Some((g, false)) => format!("{g} Gbit/s (the kernel's; OXCCL_NET_GBIT overrides)"),
                    None => "speed unknown (the cost model takes TCP's here; OXCCL_NET_GBIT sets it)".into(),
                };
                println!("between hosts: rail {r}: {} {}, {speed}", l.name, l.addr);
            }
        }
        Err(e) => println!("between hosts: no interface: {e}"),
    }
    if let Some((h, k)) = layout {
        let rails = a.rails.unwrap_or_else(|| links.as_ref().map_or(1, |l| l.len().max(1)));
        if h < 2 || k < 2 {
            println!("hierarchy: none ({h} host(s) × {k} rank(s): Hier needs several hosts of at least 2 ranks each; the flat rings and trees run)");
        } else {
            let channels = config.channels(true);
            print!("{}", oxccl_core::plan::HostGroups::contiguous(h, k).describe(channels, rails));
        }
    }
    if let Some(f) = &a.svg {
        write("topo", f, graphs::svg(&t.hosts[0]));
        println!("drawing of host {} written to {}", t.hosts[0].name, f.display());
    }
    if let Some(f) = &a.dump {
        write("topo", f, t.to_json());
        println!("topology written to {}", f.display());
    }
}

fn write(cmd: &str, path: &Path, contents: String) {
    std::fs::write(path, contents).unwrap_or_else(|e| fail(cmd, format!("{}: {e}", path.display())));
}

fn explain(a: &ExplainArgs) {
    // The library's own reading of the environment (NCCL_ALGO, NCCL_PROTO, channel counts,
    // OXCCL_DIRECT, OXCCL_CALIBRATE, OXCCL_HOST_ID).
    let config = oxccl::Config::from_lookup(|k| std::env::var(k).ok()).unwrap_or_else(|e| fail("explain", e));
    let mut m = match (&a.topo, a.ranks) {
        (Some(f), ranks) => {
            let t = load("explain", Some(f));
            let ranks = ranks.unwrap_or(t.gpus().len());
            Model::from_topo(&t, ranks).unwrap_or_else(|e| fail("explain", e))
        }
        (None, Some(ranks)) => {
            // This host's CPU ranks, from its calibration (measured once, cached).
            let costs = oxccl::calib::host_costs(
                oxccl::sys::host::host_id(config.host_id.as_deref()),
                config.calibrate.as_deref(),
                &|w| eprintln!("oxccl explain: {w}"),
            );
            let h = a.hosts;
            if ranks % h != 0 || ranks < h {
                fail("explain", format!("--ranks {ranks} over --hosts {h}: every host holds the same number of ranks, so the ranks must be a multiple of the hosts"));
            }
            let costs = match a.link_gbit {
                // One stream carries the link's rate; a link's latency is what TCP's is here.
                Some(g) => oxccl_core::tuner::CpuCosts { tcp_gbs: g / 8.0, ..costs },
                None => costs,
            };
            let direct = h == 1 && config.direct && !config.shm_disable && ranks > 1;
            let mut m = Model::cpu(ranks, h, &costs, direct, 1, 1);
            if let Some(g) = a.link_gbit {
                // What the user says the link is, faster than this host's TCP or not.
                (m.net.channel_gbs, m.net.limit_gbs) = (g / 8.0, g / 8.0 * a.rails as f64);
            }
            if h > 1 {
                println!(
                    "{h} hosts × {} ranks; {:.3} GB/s per stream, {:.3} GB/s per host between hosts",
                    ranks / h,
                    m.net.channel_gbs,
                    m.net.limit_gbs,
                );
                if ranks / h > 1 {
                    let channels = config.channels(true);
                    print!(
                        "{}",
                        oxccl_core::plan::HostGroups::contiguous(h, ranks / h).describe(channels, a.rails)
                    );
                }
            }
            if config.shm_disable {
                m.over_sockets()
            } else {
                m
            }
        }
        (None, None) => unreachable!("clap requires --ranks without --topo"),
    };
    if std::env::var_os("NCCL_MIN_NCHANNELS").is_some() {
        m.min_channels = config.min_channels;
    }
    if std::env::var_os("NCCL_MAX_NCHANNELS").is_some() {
        m.max_channels = config.max_channels;
    }
    let en = config.enabled;
    print!("{}", m.explain_text(a.collective, &explain_sizes(), &en));
}

fn sim(a: &simcmd::SimArgs) {
    let done = if a.bootstrap {
        simcmd::run_bootstrap(a)
    } else {
        simcmd::parse(a).and_then(|o| simcmd::run(&o).map(drop))
    };
    if let Err(e) = done {
        fail("sim", e);
    }
}

/// `oxccl env`: the table, this environment's values, and whether the settings parse.
fn env() {
    use oxccl_core::variables::{Reader, ALL};
    let width = ALL.iter().map(|x| x.name.len()).max().unwrap_or(0);
    for (reader, title) in [
        (Reader::Settings, "settings"),
        (Reader::Launcher, "launcher"),
        (Reader::Topology, "topology"),
        (Reader::Cache, "caches"),
    ] {
        println!("# {title}");
        for x in ALL.iter().filter(|x| x.reader == reader) {
            let value = std::env::var(x.name)
                .map_or_else(|_| format!("unset (default: {})", x.default), |v| format!("{v:?}"));
            println!("{:width$}  {value}\n{:width$}  {}", x.name, "", x.meaning);
        }
    }
    match oxccl::env::config() {
        Ok(_) => println!("# the settings parse"),
        Err(e) => fail("env", e),
    }
}

fn main() {
    sigpipe::restore_default();
    match Cli::parse().command {
        Command::Analyze(a) => analyze(&a),
        Command::Topo(a) => topo(&a),
        Command::Explain(a) => explain(&a),
        Command::Sim(a) => sim(&a),
        Command::Env => env(),
    }
}
