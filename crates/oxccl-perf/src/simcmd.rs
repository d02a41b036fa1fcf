//! `oxccl sim`: oxccl's own plans simulated on a cluster file (`oxccl_core::netsim`), printed
//! as nccl-tests tables, with the tuner's choice beside the simulator's.
//!
//! ```text
//! oxccl sim --cluster fixtures/clusters/summit.json --ranks 96,1536,24576 -b 8 -e 64M -f 8
//! oxccl sim --cluster local --ranks 4 --algo ring --protos Simple --channels 1 --chunk 1M
//!           [--algo ring,tree] [--protos LL,Simple] [--channels 2] [--chunk 512K]
//!           [--exact] [--json FILE] [--plot FILE.svg]
//! oxccl sim --bootstrap --cluster FILE [--ranks 64,10000,100000] [--join-us 40]
//!           [--connect-us 50] [--boot-gbs G] [--roots R]
//! ```
//! The command line is [`SimArgs`] (clap: `oxccl sim --help`); the sweep's options and the
//! bootstrap model's exclude each other. `--bootstrap` prints the bootstrap's cost model
//! (`oxccl_core::netsim::bootstrap`), dense against sparse, one root against R (`--roots`, else
//! the count the model finds fastest per rank count), with the table's size and decode
//! cost measured here from the real codec and the bootstrap interface's bandwidth from the
//! cluster file's network (or `--boot-gbs`).
//! Per rank count and algorithm, each size runs in the protocol the tuner's model of the
//! cluster prices cheapest for that algorithm (among `--protos`). Rings of 4096 ranks or more
//! are simulated periodically (`Spec::period`: 96 of the ranks) when the count, rounded to
//! the nearest multiple of ranks × channels (so every ring segment holds data), changes by at
//! most 15 % (the output says by how much), unless `--exact`; the time reported is the
//! rounded call's, the bandwidths the call's size over it.

use crate::plot::Series;
use crate::report::float_str;
use crate::sizes::{parse_size, SIZE_FORMS};
use crate::suggest::did_you_mean;
use clap::Args;
use oxccl_core::json::{self, finite};
use oxccl_core::netsim::{model_of, simulate, Cluster, Spec};
use oxccl_core::tuner::{Algo, Enabled, Proto, RingColl};
use serde::{Deserialize, Serialize};

/// One simulated point.
#[derive(Clone, Debug)]
pub struct Point {
    pub ranks: usize,
    pub algo: Algo,
    pub proto: Proto,
    pub bytes: usize,
    pub us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// How it was simulated ("exact", or "periodic q, +n elements").
    pub how: String,
    pub wall_s: f64,
}

/// The simulation of one all-reduce, periodic where that is exact enough (see the module).
pub fn run_one(
    c: &Cluster,
    ranks: usize,
    algo: Algo,
    proto: Proto,
    bytes: usize,
    o: &Opts,
) -> Result<Point, String> {
    let mut spec = Spec {
        algo,
        proto,
        bytes,
        nranks: ranks,
        nchannels: o.channels,
        chunk_bytes: o.chunk,
        slots: 8,
        period: None,
    };
    let mut how = "exact".to_string();
    let count = (bytes / 4).max(1);
    let unit = ranks * o.channels;
    if algo == Algo::Ring && !o.exact && ranks >= 4096 && count >= unit {
        // The nearest count every ring segment of every loop holds data for (a multiple of
        // ranks x channels), when it is within 15 % of the call's.
        let (down, up) = (count / unit * unit, count.div_ceil(unit) * unit);
        let near = if count - down <= up - count { down } else { up };
        let q =
            [96usize, 6 * 16, 8 * 16, 64].into_iter().find(|q| ranks % q == 0 && q % c.gpus_per_node == 0);
        if let Some(q) = q.filter(|_| near.abs_diff(count) * 100 <= 15 * count) {
            spec.period = Some(q);
            spec.bytes = near * 4;
            let d = near as i64 - count as i64;
            how = format!(
                "periodic {q} of {ranks}, {d:+} elements ({:+.1} %)",
                d as f64 * 100.0 / count as f64
            );
        }
    }
    let t = std::time::Instant::now();
    let out = simulate(c, &spec)?;
    let algbw = bytes as f64 / (out.time_us * 1e3);
    let busbw = algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64;
    Ok(Point {
        ranks,
        algo,
        proto,
        bytes,
        us: out.time_us,
        algbw,
        busbw,
        how,
        wall_s: t.elapsed().as_secs_f64(),
    })
}

/// The protocol the tuner's model of the cluster prices cheapest for `algo` at `bytes`.
pub fn protocol(
    c: &Cluster,
    ranks: usize,
    algo: Algo,
    bytes: usize,
    allowed: &[Proto],
    channels: usize,
) -> Proto {
    let m = model_of(c, ranks);
    *allowed
        .iter()
        .min_by(|&&a, &&b| {
            let t = |p| m.estimate(RingColl::AllReduce, bytes, algo, p, channels).unwrap_or(f64::INFINITY);
            t(a).total_cmp(&t(b))
        })
        .unwrap_or(&Proto::Simple)
}

/// The algorithm the tuner picks for the cluster (among Ring and Tree, `allowed` protocols).
pub fn tuner_pick(c: &Cluster, ranks: usize, bytes: usize, allowed: &[Proto]) -> Algo {
    let m = model_of(c, ranks);
    let protos: Vec<&str> = allowed.iter().map(|p| p.name()).collect();
    let en = Enabled::parse(Some("ring,tree"), Some(&protos.join(","))).unwrap_or_default();
    m.choose(RingColl::AllReduce, bytes, &en).map_or(Algo::Ring, |e| e.algo)
}

/// `oxccl sim`'s command line.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    oxccl sim --cluster fixtures/clusters/summit.json --ranks 96,1536,24576 -b 8 -e 64M -f 8\n  \
    oxccl sim --cluster local --ranks 4 --algo ring --protos Simple --channels 1 --chunk 1M\n  \
    oxccl sim --bootstrap --cluster fixtures/clusters/summit.json --ranks 1024,10000,100000")]
pub struct SimArgs {
    /// Cluster file (fixtures/clusters/), or `local`: this host from its calibration
    #[arg(long, value_name = "FILE|local")]
    pub cluster: String,
    /// Rank counts, each at least 2 [default: 96; with --bootstrap: 64,1024,10000,100000]
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = rank_count)]
    pub ranks: Vec<usize>,
    /// Smallest size (8, 64K, 1M, ...)
    #[arg(short = 'b', value_name = "SIZE", default_value = "8", value_parser = size,
          conflicts_with = "sizes", help_heading = SWEEP)]
    pub min_bytes: usize,
    /// Largest size
    #[arg(short = 'e', value_name = "SIZE", default_value = "64M", value_parser = size,
          conflicts_with = "sizes", help_heading = SWEEP)]
    pub max_bytes: usize,
    /// Factor from one size to the next (at least 2)
    #[arg(short = 'f', value_name = "FACTOR", default_value_t = 8, conflicts_with = "sizes",
          help_heading = SWEEP)]
    pub step_factor: usize,
    /// The sizes themselves, instead of -b/-e/-f
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',', value_parser = size, help_heading = SWEEP)]
    pub sizes: Vec<usize>,
    /// Algorithms: ring, tree, hier
    #[arg(long = "algo", value_name = "ALGO,...", value_delimiter = ',', value_parser = algo,
          default_value = "ring,tree", help_heading = SWEEP)]
    pub algos: Vec<Algo>,
    /// Protocols each size may run in (the tuner's model picks among them): LL, LL128, Simple
    #[arg(long, value_name = "PROTO,...", value_delimiter = ',', value_parser = proto,
          default_value = "LL,LL128,Simple", help_heading = SWEEP)]
    pub protos: Vec<Proto>,
    /// Channels
    #[arg(long, value_name = "N", default_value_t = 2, help_heading = SWEEP)]
    pub channels: usize,
    /// Chunk size
    #[arg(long, value_name = "SIZE", default_value = "512K", value_parser = size, help_heading = SWEEP)]
    pub chunk: usize,
    /// Simulate every ring exactly, never periodically (slow beyond 4096 ranks)
    #[arg(long, help_heading = SWEEP)]
    pub exact: bool,
    /// Write the results as JSON
    #[arg(long, value_name = "FILE", help_heading = SWEEP)]
    pub json: Option<String>,
    /// Draw busbw and time against size (SVG)
    #[arg(long, value_name = "FILE.svg", help_heading = SWEEP)]
    pub plot: Option<String>,
    /// Print the bootstrap's cost model, dense against sparse, instead of a sweep
    #[arg(long, conflicts_with_all = ["min_bytes", "max_bytes", "step_factor", "sizes", "algos",
          "protos", "channels", "chunk", "exact", "json", "plot"], help_heading = BOOTSTRAP)]
    pub bootstrap: bool,
    /// The root's time per join (us)
    #[arg(long, value_name = "US", default_value_t = 40.0, value_parser = positive,
          allow_negative_numbers = true, requires = "bootstrap", help_heading = BOOTSTRAP)]
    pub join_us: f64,
    /// Time per connection (us)
    #[arg(long, value_name = "US", default_value_t = 50.0, value_parser = positive,
          allow_negative_numbers = true, requires = "bootstrap", help_heading = BOOTSTRAP)]
    pub connect_us: f64,
    /// The bootstrap interface's bandwidth (GB/s) [default: the cluster's network]
    #[arg(long, value_name = "G", value_parser = positive, allow_negative_numbers = true,
          requires = "bootstrap", help_heading = BOOTSTRAP)]
    pub boot_gbs: Option<f64>,
    /// Rendezvous roots (a scalable init's unique ids), shown beside one root [default: the
    /// count the model finds fastest, a power of two]
    #[arg(long, value_name = "R", value_parser = rank_count_or_one, requires = "bootstrap",
          help_heading = BOOTSTRAP)]
    pub roots: Option<usize>,
}

const SWEEP: &str = "Sweep";
const BOOTSTRAP: &str = "Bootstrap model";

fn rank_count(v: &str) -> Result<usize, String> {
    v.trim().parse().ok().filter(|&n: &usize| n >= 2).ok_or_else(|| "not a rank count of at least 2".into())
}

fn rank_count_or_one(v: &str) -> Result<usize, String> {
    v.trim().parse().ok().filter(|&n: &usize| n >= 1).ok_or_else(|| "not a count of at least 1".into())
}

fn size(v: &str) -> Result<usize, String> {
    parse_size(v).ok_or_else(|| format!("not a size: {SIZE_FORMS}"))
}

fn algo(v: &str) -> Result<Algo, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "ring" => Ok(Algo::Ring),
        "tree" => Ok(Algo::Tree),
        "hier" => Ok(Algo::Hier),
        w => Err(format!(
            "the algorithms are ring, tree and hier{}",
            did_you_mean(w, ["ring", "tree", "hier"])
        )),
    }
}

fn proto(v: &str) -> Result<Proto, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "ll" => Ok(Proto::LL),
        "ll128" => Ok(Proto::LL128),
        "simple" => Ok(Proto::Simple),
        w => Err(format!(
            "the protocols are LL, LL128 and Simple{}",
            did_you_mean(w, ["ll", "ll128", "simple"])
        )),
    }
}

fn positive(v: &str) -> Result<f64, String> {
    v.trim().parse().ok().filter(|x: &f64| *x > 0.0).ok_or_else(|| "not a positive number".into())
}

/// A sweep's options, defaults applied and sizes listed.
#[derive(Clone, Debug)]
pub struct Opts {
    pub cluster: String,
    pub ranks: Vec<usize>,
    pub algos: Vec<Algo>,
    pub protos: Vec<Proto>,
    pub sizes: Vec<usize>,
    pub channels: usize,
    pub chunk: usize,
    pub exact: bool,
    pub json: Option<String>,
    pub plot: Option<String>,
}

/// The sweep `a` asks for (not `--bootstrap`).
pub fn parse(a: &SimArgs) -> Result<Opts, String> {
    let sizes = if a.sizes.is_empty() {
        let (b, e, f) = (a.min_bytes, a.max_bytes, a.step_factor);
        if b == 0 || b > e || f < 2 {
            return Err("sizes: need 0 < -b <= -e and -f >= 2".into());
        }
        std::iter::successors(Some(b), |&s| s.checked_mul(f)).take_while(|&s| s <= e).collect()
    } else {
        a.sizes.clone()
    };
    Ok(Opts {
        cluster: a.cluster.clone(),
        ranks: if a.ranks.is_empty() { vec![96] } else { a.ranks.clone() },
        algos: a.algos.clone(),
        protos: a.protos.clone(),
        sizes,
        channels: a.channels,
        chunk: a.chunk,
        exact: a.exact,
        json: a.json.clone(),
        plot: a.plot.clone(),
    })
}

/// Runs `f`, saying on stderr what it simulates if it takes more than a few seconds (and
/// again every 30 s): a long point must not look like a hang.
fn with_progress<T>(label: &str, f: impl FnOnce() -> T) -> T {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let started = std::time::Instant::now();
            let mut next = std::time::Duration::from_secs(5);
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                wait.recv_timeout(next.saturating_sub(started.elapsed()))
            {
                eprintln!("# [oxccl sim] still simulating {label}: {} s so far", started.elapsed().as_secs());
                next += std::time::Duration::from_secs(30);
            }
        });
        let r = f();
        drop(done);
        r
    })
}

/// Runs the sweep and prints it; returns every point.
pub fn run(o: &Opts) -> Result<Vec<Point>, String> {
    let c = if o.cluster == "local" {
        // This host, from the calibration probe (measured once, cached), as the tuner sees it.
        let config = oxccl::Config::from_lookup(|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
        let costs = oxccl::calib::host_costs(
            oxccl::sys::host::host_id(config.host_id.as_deref()),
            config.calibrate.as_deref(),
            &|w| eprintln!("oxccl sim: {w}"),
        );
        Cluster::from_cpu(&costs, o.ranks.iter().copied().max().unwrap_or(2), 1)
    } else {
        let text = std::fs::read_to_string(&o.cluster).map_err(|e| format!("{}: {e}", o.cluster))?;
        Cluster::parse(&text).map_err(|e| format!("{}: {e}", o.cluster))?
    };
    println!("# oxccl sim: {}", c.name);
    println!(
        "# cluster file {}; {} GPUs per node, {} NICs per node",
        o.cluster, c.gpus_per_node, c.nics_per_node
    );
    let mut points = Vec::new();
    for &ranks in &o.ranks {
        for &algo in &o.algos {
            println!(
                "#\n# {ranks} ranks ({} nodes), all_reduce {algo:?}, {} channels",
                c.nodes_for(ranks),
                o.channels
            );
            println!(
                "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>6}  simulated",
                "size", "count", "type", "redop", "proto", "time", "algbw", "busbw", "#wrong", "wall"
            );
            println!(
                "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>6}",
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(s)"
            );
            for &bytes in &o.sizes {
                let proto = protocol(&c, ranks, algo, bytes, &o.protos, o.channels);
                let label = format!("{ranks} ranks, {algo:?}, {bytes} B");
                let p = with_progress(&label, || run_one(&c, ranks, algo, proto, bytes, o))?;
                println!(
                    "  {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>6.2}  {}",
                    bytes,
                    (bytes / 4).max(1),
                    "float",
                    "sum",
                    proto.name(),
                    float_str(p.us, 7),
                    float_str(p.algbw, 6),
                    float_str(p.busbw, 6),
                    "N/A",
                    p.wall_s,
                    p.how
                );
                points.push(p);
            }
        }
    }
    // The simulator's winner and the tuner's pick, side by side.
    if o.algos.contains(&Algo::Ring) && o.algos.contains(&Algo::Tree) {
        println!("#\n# ring vs tree: time (us), the faster, and the tuner's pick for this cluster");
        println!(
            "# {:>7}  {:>10}  {:>11}  {:>11}  {:>6}  {:>6}",
            "ranks", "size", "ring", "tree", "sim", "tuner"
        );
        for &ranks in &o.ranks {
            for &bytes in &o.sizes {
                let find =
                    |a| points.iter().find(|p| (p.ranks, p.algo, p.bytes) == (ranks, a, bytes)).map(|p| p.us);
                if let (Some(r), Some(t)) = (find(Algo::Ring), find(Algo::Tree)) {
                    let sim = if t < r { "tree" } else { "ring" };
                    let tuner =
                        if tuner_pick(&c, ranks, bytes, &o.protos) == Algo::Tree { "tree" } else { "ring" };
                    println!("  {ranks:>7}  {bytes:>10}  {r:>11.1}  {t:>11.1}  {sim:>6}  {tuner:>6}");
                }
            }
        }
    }
    if let Some(f) = &o.json {
        std::fs::write(f, results_json(&c, &points)).map_err(|e| format!("{f}: {e}"))?;
        println!("# Writing JSON output to {f}");
    }
    if let Some(f) = &o.plot {
        let mut series: Vec<Series> = Vec::new();
        for p in &points {
            let label = format!("{} ranks {:?}", p.ranks, p.algo);
            match series.iter_mut().find(|s| s.label == label) {
                Some(s) => s.points.push((p.bytes as f64, p.busbw, p.us)),
                None => series.push(Series { label, points: vec![(p.bytes as f64, p.busbw, p.us)] }),
            }
        }
        std::fs::write(f, crate::plot::svg(&series, &format!("oxccl sim: {}", c.name)))
            .map_err(|e| format!("{f}: {e}"))?;
        println!("# Wrote plot {f} ({} series)", series.len());
    }
    Ok(points)
}

/// `--json`: the sweep's points, in nccl-tests' names where they have one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SimResults {
    cluster: String,
    results: Vec<SimRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SimRow {
    ranks: u64,
    algo: String,
    proto: String,
    /// Bytes.
    size: u64,
    /// µs; GB/s (`null` where not finite).
    time: Option<f64>,
    alg_bw: Option<f64>,
    bus_bw: Option<f64>,
    /// How it was simulated.
    simulated: String,
}

fn results_json(c: &Cluster, points: &[Point]) -> String {
    let results = points
        .iter()
        .map(|p| SimRow {
            ranks: p.ranks as u64,
            algo: format!("{:?}", p.algo),
            proto: p.proto.name().into(),
            size: p.bytes as u64,
            time: finite(p.us),
            alg_bw: finite(p.algbw),
            bus_bw: finite(p.busbw),
            simulated: p.how.clone(),
        })
        .collect();
    json::to_text(&SimResults { cluster: c.name.clone(), results })
}

/// `oxccl sim --bootstrap`: the bootstrap's cost model, dense against sparse, per rank count.
pub fn run_bootstrap(a: &SimArgs) -> Result<(), String> {
    use oxccl_core::netsim::bootstrap::{best_roots, cost, BootParams};
    let ranks = if a.ranks.is_empty() { vec![64, 1024, 10000, 100000] } else { a.ranks.clone() };
    let cluster = a.cluster.as_str();
    let c = if cluster == "local" {
        let config = oxccl::Config::from_lookup(|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
        let costs = oxccl::calib::host_costs(
            oxccl::sys::host::host_id(config.host_id.as_deref()),
            config.calibrate.as_deref(),
            &|w| eprintln!("oxccl sim: {w}"),
        );
        Cluster::from_cpu(&costs, 2, 1)
    } else {
        let text = std::fs::read_to_string(cluster).map_err(|e| format!("{cluster}: {e}"))?;
        Cluster::parse(&text).map_err(|e| format!("{cluster}: {e}"))?
    };
    let (entry_bytes, decode_us_per_entry) = oxccl::bootstrap::table_codec_probe(20_000);
    let p = BootParams {
        entry_bytes,
        decode_us_per_entry,
        join_us: a.join_us,
        connect_us: a.connect_us,
        gbs: a.boot_gbs.unwrap_or(c.net.gbs),
        sparse_lifelines: 11,
    };
    println!("# oxccl sim --bootstrap: {} ({cluster})", c.name);
    println!(
        "# table {:.1} B/entry, decode {:.3} us/entry (measured here); root {} us/join; connect {} us; bootstrap link {:.2} GB/s",
        p.entry_bytes, p.decode_us_per_entry, p.join_us, p.connect_us, p.gbs
    );
    println!(
        "# {:>7} {:>6} {:>5} {:>7} {:>12} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "ranks",
        "mode",
        "roots",
        "rounds",
        "messages",
        "root0 out",
        "conns/rank",
        "joins s",
        "roots s",
        "table s",
        "decode s",
        "conn s",
        "total s"
    );
    for &n in &ranks {
        for sparse in [false, true] {
            let many = a.roots.unwrap_or_else(|| best_roots(n, sparse, &p)).min(n);
            let counts = if many == 1 { vec![1] } else { vec![1, many] };
            for r in counts {
                let b = cost(n, sparse, r, &p);
                println!(
                    "  {:>7} {:>6} {:>5} {:>7} {:>12} {:>12} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                    n,
                    if sparse { "sparse" } else { "dense" },
                    b.roots,
                    b.rounds,
                    b.messages,
                    human_bytes(b.root_bytes),
                    b.conns_per_rank,
                    b.join_s,
                    b.roots_s,
                    b.table_s,
                    b.decode_s,
                    b.connect_s,
                    b.total_s
                );
            }
        }
    }
    Ok(())
}

fn human_bytes(b: f64) -> String {
    match b {
        b if b >= 1e12 => format!("{:.2} TB", b / 1e12),
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.2} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} KB", b / 1e3),
        b => format!("{b:.0} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn args(line: &str) -> Result<SimArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("sim").chain(line.split_whitespace())).map(|c| c.sim)
    }

    #[test]
    fn a_sweep_parses_with_its_defaults() {
        let o = parse(&args("--cluster x.json --ranks 96,1536 -b 8 -e 512").unwrap()).unwrap();
        assert_eq!(o.cluster, "x.json");
        assert_eq!(o.ranks, vec![96, 1536]);
        assert_eq!(o.sizes, vec![8, 64, 512]);
        assert_eq!(o.algos, vec![Algo::Ring, Algo::Tree]);
        assert_eq!(o.protos, vec![Proto::LL, Proto::LL128, Proto::Simple]);
        assert_eq!((o.channels, o.chunk, o.exact), (2, 512 << 10, false));
        assert_eq!((o.json, o.plot), (None, None));
        let o = parse(&args("--cluster local").unwrap()).unwrap();
        assert_eq!(o.ranks, vec![96]);
        assert_eq!(o.sizes.len(), 8); // 8 B × 8^k up to 64M: 8 .. 16M
        assert_eq!(*o.sizes.last().unwrap(), 16 << 20);
        let line = "--cluster local --algo TREE --protos simple,LL --sizes 1K,3M --chunk 1M --channels 1";
        let o = parse(&args(&format!("{line} --exact")).unwrap()).unwrap();
        assert_eq!((o.algos, o.protos), (vec![Algo::Tree], vec![Proto::Simple, Proto::LL]));
        assert_eq!((o.sizes, o.chunk, o.channels, o.exact), (vec![1024, 3 << 20], 1 << 20, 1, true));
    }

    #[test]
    fn bad_options_name_the_option() {
        let err = |line: &str| args(line).unwrap_err();
        assert_eq!(err("--ranks 4").kind(), ErrorKind::MissingRequiredArgument);
        let e = err("--cluster x --algo bogus").to_string();
        assert!(e.contains("--algo") && e.contains("ring, tree and hier"), "{e}");
        let e = err("--cluster x --ranks 96,1").to_string();
        assert!(e.contains("--ranks") && e.contains("at least 2"), "{e}");
        let e = err("--cluster x --chunk big").to_string();
        assert!(e.contains("--chunk") && e.contains("not a size"), "{e}");
        assert_eq!(err("--cluster x --sizes 8 -b 8").kind(), ErrorKind::ArgumentConflict);
        assert_eq!(err("--cluster x --rnaks 4").kind(), ErrorKind::UnknownArgument);
        let e = parse(&args("--cluster x -b 64 -e 8").unwrap()).unwrap_err();
        assert_eq!(e, "sizes: need 0 < -b <= -e and -f >= 2");
        assert!(parse(&args("--cluster x -f 1").unwrap()).is_err());
    }

    #[test]
    fn bootstrap_options_belong_to_bootstrap() {
        let a = args("--bootstrap --cluster x").unwrap();
        assert!(a.bootstrap && a.ranks.is_empty());
        assert_eq!((a.join_us, a.connect_us, a.boot_gbs), (40.0, 50.0, None));
        let err = |line: &str| args(line).unwrap_err();
        let a = args("--bootstrap --cluster x --roots 8").unwrap();
        assert_eq!(a.roots, Some(8));
        assert!(err("--bootstrap --cluster x --roots 0").to_string().contains("--roots"));
        assert_eq!(err("--cluster x --roots 4").kind(), ErrorKind::MissingRequiredArgument);
        let a = args("--bootstrap --cluster x --join-us 10 --connect-us 5 --boot-gbs 1.5").unwrap();
        assert_eq!((a.join_us, a.connect_us, a.boot_gbs), (10.0, 5.0, Some(1.5)));
        assert_eq!(err("--cluster x --join-us 10").kind(), ErrorKind::MissingRequiredArgument);
        assert_eq!(err("--bootstrap --cluster x --exact").kind(), ErrorKind::ArgumentConflict);
        assert_eq!(err("--bootstrap --cluster x -b 8").kind(), ErrorKind::ArgumentConflict);
        let e = err("--bootstrap --cluster x --join-us -1").to_string();
        assert!(e.contains("--join-us") && e.contains("not a positive number"), "{e}");
    }

    mod results_format {
        use super::*;
        use crate::report::tests::strategies::{measured, text};
        use proptest::prelude::*;

        prop_compose! {
            fn row()(
                ranks in any::<u64>(), algo in text(), proto in text(), size in any::<u64>(),
                time in measured(), alg_bw in measured(), bus_bw in measured(), simulated in text(),
            ) -> SimRow {
                SimRow { ranks, algo, proto, size, time, alg_bw, bus_bw, simulated }
            }
        }

        proptest! {
            #[test]
            fn any_sim_results_round_trip_exactly(cluster in text(), results in prop::collection::vec(row(), 0..4)) {
                let r = SimResults { cluster, results };
                prop_assert_eq!(json::parse::<SimResults>(&json::to_text(&r)).unwrap(), r);
            }
        }

        #[test]
        fn points_are_written_with_null_where_not_finite() {
            let c = Cluster::parse(
                &std::fs::read_to_string(format!(
                    "{}/../../fixtures/clusters/summit.json",
                    env!("CARGO_MANIFEST_DIR")
                ))
                .unwrap(),
            )
            .unwrap();
            let p = Point {
                ranks: 96,
                algo: Algo::Ring,
                proto: Proto::Simple,
                bytes: (1 << 53) + 1,
                us: 0.0,
                algbw: f64::INFINITY,
                busbw: f64::NAN,
                how: "exact".into(),
                wall_s: 0.0,
            };
            assert_eq!(
                results_json(&c, &[p]),
                format!(
                    "{{\"cluster\":{},\"results\":[{{\"ranks\":96,\"algo\":\"Ring\",\"proto\":\"Simple\",\"size\":9007199254740993,\"time\":0.0,\"alg_bw\":null,\"bus_bw\":null,\"simulated\":\"exact\"}}]}}",
                    json::to_text(&c.name)
                )
            );
        }
    }
}
