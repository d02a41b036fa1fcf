//! `oxccl sim`: oxccl's own plans simulated on a cluster file (`oxccl_core::netsim`), printed
//! as nccl-tests tables, with the tuner's choice beside the simulator's.
//!
//! ```text
//! oxccl sim --cluster fixtures/clusters/summit.json --ranks 96,1536,24576 -b 8 -e 64M -f 8
//! oxccl sim --cluster local --ranks 4 --algo ring --protos Simple --channels 1 --chunk 1M
//!           [--algo ring,tree] [--protos LL,Simple] [--channels 2] [--chunk 512K]
//!           [--exact] [--json FILE] [--plot FILE.svg]
//! oxccl sim --bootstrap --cluster FILE [--ranks 64,10000,100000] [--join-us 40]
//!           [--connect-us 50] [--boot-gbs G]
//! ```
//! `--bootstrap` prints the bootstrap's cost model (`oxccl_core::netsim::bootstrap`), dense
//! against sparse, with the table's size and decode cost measured here from the real codec
//! and the bootstrap interface's bandwidth from the cluster file's network (or `--boot-gbs`).
//! Per rank count and algorithm, each size runs in the protocol the tuner's model of the
//! cluster prices cheapest for that algorithm (among `--protos`). Rings of 4096 ranks or more
//! are simulated periodically (`Spec::period`: 96 of the ranks) when the count, rounded to
//! the nearest multiple of ranks × channels (so every ring segment holds data), changes by at
//! most 15 % (the output says by how much), unless `--exact`; the time reported is the
//! rounded call's, the bandwidths the call's size over it.

use crate::plot::Series;
use crate::report::{float_str, obj, Json};
use crate::sizes::parse_size;
use oxccl_core::netsim::{model_of, simulate, Cluster, Spec};
use oxccl_core::tuner::{Algo, Coll, Enabled, Proto};
use std::collections::BTreeMap;

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

fn list<T>(v: &str, f: impl Fn(&str) -> Option<T>, what: &str) -> Result<Vec<T>, String> {
    v.split(',').map(|x| f(x.trim()).ok_or_else(|| format!("{what}: cannot read {x:?}"))).collect()
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
            let t = |p| m.estimate(Coll::AllReduce, bytes, algo, p, channels).unwrap_or(f64::INFINITY);
            t(a).total_cmp(&t(b))
        })
        .unwrap_or(&Proto::Simple)
}

/// The algorithm the tuner picks for the cluster (among Ring and Tree, `allowed` protocols).
pub fn tuner_pick(c: &Cluster, ranks: usize, bytes: usize, allowed: &[Proto]) -> Algo {
    let m = model_of(c, ranks);
    let protos: Vec<&str> = allowed.iter().map(|p| p.name()).collect();
    let en = Enabled::parse(Some("ring,tree"), Some(&protos.join(","))).unwrap_or_default();
    m.choose(Coll::AllReduce, bytes, &en).map_or(Algo::Ring, |e| e.algo)
}

/// Options of `oxccl sim`.
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

pub fn parse(opts: &BTreeMap<String, String>, flags: &[String]) -> Result<Opts, String> {
    let get = |k: &str| opts.get(k).map(String::as_str);
    let cluster = get("cluster").ok_or("--cluster FILE is required")?.to_string();
    let ranks =
        list(get("ranks").unwrap_or("96"), |x| x.parse().ok().filter(|&n: &usize| n >= 2), "--ranks")?;
    let algos = list(
        get("algo").unwrap_or("ring,tree"),
        |x| match x.to_ascii_lowercase().as_str() {
            "ring" => Some(Algo::Ring),
            "tree" => Some(Algo::Tree),
            _ => None,
        },
        "--algo (ring, tree)",
    )?;
    let protos = list(
        get("protos").unwrap_or("LL,LL128,Simple"),
        |x| match x.to_ascii_lowercase().as_str() {
            "ll" => Some(Proto::LL),
            "ll128" => Some(Proto::LL128),
            "simple" => Some(Proto::Simple),
            _ => None,
        },
        "--protos (LL, LL128, Simple)",
    )?;
    let sizes = match get("sizes") {
        Some(v) => list(v, parse_size, "--sizes")?,
        None => {
            let b = parse_size(get("b").unwrap_or("8")).ok_or("-b: not a size")?;
            let e = parse_size(get("e").unwrap_or("64M")).ok_or("-e: not a size")?;
            let f: usize = get("f").unwrap_or("8").parse().map_err(|_| "-f: not a number")?;
            if b == 0 || b > e || f < 2 {
                return Err("sizes: need 0 < -b <= -e and -f >= 2".into());
            }
            std::iter::successors(Some(b), |&s| s.checked_mul(f)).take_while(|&s| s <= e).collect()
        }
    };
    Ok(Opts {
        cluster,
        ranks,
        algos,
        protos,
        sizes,
        channels: get("channels").map_or(Ok(2), |v| v.parse().map_err(|_| "--channels: not a number"))?,
        chunk: get("chunk").map_or(Some(512 << 10), parse_size).ok_or("--chunk: not a size")?,
        exact: flags.iter().any(|f| f == "exact"),
        json: get("json").map(String::from),
        plot: get("plot").map(String::from),
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
                let p = run_one(&c, ranks, algo, proto, bytes, o)?;
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
        std::fs::write(f, json(&c, &points).to_text()).map_err(|e| format!("{f}: {e}"))?;
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

fn json(c: &Cluster, points: &[Point]) -> Json {
    let results = points
        .iter()
        .map(|p| {
            obj(vec![
                ("ranks", Json::Num(p.ranks as f64)),
                ("algo", Json::Str(format!("{:?}", p.algo))),
                ("proto", Json::Str(p.proto.name().into())),
                ("size", Json::Num(p.bytes as f64)),
                ("time", Json::Num(p.us)),
                ("alg_bw", Json::Num(p.algbw)),
                ("bus_bw", Json::Num(p.busbw)),
                ("simulated", Json::Str(p.how.clone())),
            ])
        })
        .collect();
    obj(vec![("cluster", Json::Str(c.name.clone())), ("results", Json::Arr(results))])
}

/// `oxccl sim --bootstrap`: the bootstrap's cost model, dense against sparse, per rank count.
pub fn run_bootstrap(opts: &BTreeMap<String, String>) -> Result<(), String> {
    use oxccl_core::netsim::bootstrap::{cost, BootParams};
    let get = |k: &str| opts.get(k).map(String::as_str);
    let num = |k: &str, d: f64| -> Result<f64, String> {
        get(k).map_or(Ok(d), |v| {
            v.parse().ok().filter(|x: &f64| *x > 0.0).ok_or(format!("--{k}: not a positive number"))
        })
    };
    let ranks = list(
        get("ranks").unwrap_or("64,1024,10000,100000"),
        |x| x.parse().ok().filter(|&n: &usize| n >= 2),
        "--ranks",
    )?;
    let cluster = get("cluster").ok_or("--cluster FILE is required")?;
    let c = if cluster == "local" {
        let config = oxccl::Config::from_lookup(|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
        let costs = oxccl::calib::host_costs(
            oxccl::sys::host::host_id(config.host_id.as_deref()),
            config.calibrate.as_deref(),
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
        join_us: num("join-us", 40.0)?,
        connect_us: num("connect-us", 50.0)?,
        gbs: num("boot-gbs", c.net.gbs)?,
        sparse_lifelines: 11,
    };
    println!("# oxccl sim --bootstrap: {} ({cluster})", c.name);
    println!(
        "# table {:.1} B/entry, decode {:.3} us/entry (measured here); root {} us/join; connect {} us; bootstrap link {:.2} GB/s",
        p.entry_bytes, p.decode_us_per_entry, p.join_us, p.connect_us, p.gbs
    );
    println!(
        "# {:>7} {:>6} {:>7} {:>12} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "ranks",
        "mode",
        "rounds",
        "messages",
        "root out",
        "conns/rank",
        "joins s",
        "table s",
        "decode s",
        "conn s",
        "total s"
    );
    for &n in &ranks {
        for sparse in [false, true] {
            let b = cost(n, sparse, &p);
            println!(
                "  {:>7} {:>6} {:>7} {:>12} {:>12} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                n,
                if sparse { "sparse" } else { "dense" },
                b.rounds,
                b.messages,
                human_bytes(b.root_bytes),
                b.conns_per_rank,
                b.join_s,
                b.table_s,
                b.decode_s,
                b.connect_s,
                b.total_s
            );
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

    #[test]
    fn sizes_and_lists_parse() {
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("8"), Some(8));
        let mut o = BTreeMap::new();
        o.insert("cluster".to_string(), "x.json".to_string());
        o.insert("ranks".to_string(), "96,1536".to_string());
        o.insert("b".to_string(), "8".to_string());
        o.insert("e".to_string(), "512".to_string());
        let p = parse(&o, &[]).unwrap();
        assert_eq!(p.ranks, vec![96, 1536]);
        assert_eq!(p.sizes, vec![8, 64, 512]);
        assert_eq!(p.algos, vec![Algo::Ring, Algo::Tree]);
        o.insert("algo".to_string(), "bogus".to_string());
        assert!(parse(&o, &[]).unwrap_err().contains("--algo"));
    }
}
