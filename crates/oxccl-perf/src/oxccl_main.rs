//! `oxccl`: tools around the library.
//!
//! - `oxccl analyze DUMP...` merges the ranks' flight recorder dumps and prints the verdict:
//!   which rank stopped first, at which call, who waited for whom, and the first error.
//! - `oxccl topo [--topo FILE] [--channels N] [--svg FILE] [--dump FILE]` prints this host's
//!   topology (or a topology file's) as `nvidia-smi topo -m` does, then the rings and trees
//!   built over it; `--svg` draws it, `--dump` writes the topology file.
//! - `oxccl explain COLLECTIVE --ranks N [--topo FILE]` prints, for sizes 8 B .. 4 GiB, the
//!   predicted time of every algorithm × protocol and the choice (`NCCL_ALGO`, `NCCL_PROTO`,
//!   `NCCL_MIN/MAX_NCHANNELS` apply).
//! - `oxccl sim --cluster FILE --ranks N,... [-b 8 -e 64M -f 8] [--algo ring,tree]` simulates
//!   oxccl's own all-reduce plans on a cluster file and prints nccl-tests tables, the ring
//!   against the tree, and the tuner's pick (see `simcmd`).

#[allow(dead_code)]
mod plot;
#[allow(dead_code)]
mod report;
mod simcmd;
mod sizes;

use oxccl_core::topo::{graphs, Topo};
use oxccl_core::tuner::{explain_sizes, Coll, Model};

fn usage() -> ! {
    eprintln!(
        "usage: oxccl analyze DUMP.json...                      flight recorder dumps, one per rank\n\
         \x20      oxccl topo [--topo FILE] [--channels N] [--svg FILE] [--dump FILE]\n\
         \x20      oxccl explain COLLECTIVE --ranks N [--topo FILE]  (allreduce, allgather, reducescatter, broadcast, reduce;\n\
         \x20                                                      without --topo: N CPU ranks on this host)"
    );
    std::process::exit(2);
}

fn fail(cmd: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("oxccl {cmd}: {e}");
    std::process::exit(1);
}

/// `--name value` options; anything else is positional.
fn options(args: &[String]) -> (Vec<String>, std::collections::BTreeMap<String, String>) {
    let mut pos = Vec::new();
    let mut opts = std::collections::BTreeMap::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(k) = a.strip_prefix("--") {
            match it.next() {
                Some(v) => {
                    opts.insert(k.to_string(), v.clone());
                }
                None => fail("", format!("--{k} needs a value")),
            }
        } else {
            pos.push(a.clone());
        }
    }
    (pos, opts)
}

fn load(cmd: &str, opts: &std::collections::BTreeMap<String, String>) -> Topo {
    match opts.get("topo") {
        Some(f) => {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| fail(cmd, format!("{f}: {e}")));
            Topo::parse(&text).unwrap_or_else(|e| fail(cmd, format!("{f}: {e}")))
        }
        None => oxccl::topo::system(|k| std::env::var(k).ok()).unwrap_or_else(|e| fail(cmd, e)),
    }
}

fn number(cmd: &str, opts: &std::collections::BTreeMap<String, String>, k: &str, default: usize) -> usize {
    match opts.get(k) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| fail(cmd, format!("--{k} {v}: not a number"))),
    }
}

fn topo(args: &[String]) {
    let (pos, opts) = options(args);
    if !pos.is_empty() {
        usage();
    }
    let t = load("topo", &opts);
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
    print!("{}", graphs::describe(&t, number("topo", &opts, "channels", 2)));
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
    if let Some(f) = opts.get("svg") {
        std::fs::write(f, graphs::svg(&t.hosts[0])).unwrap_or_else(|e| fail("topo", format!("{f}: {e}")));
        println!("drawing of host {} written to {f}", t.hosts[0].name);
    }
    if let Some(f) = opts.get("dump") {
        std::fs::write(f, t.to_json()).unwrap_or_else(|e| fail("topo", format!("{f}: {e}")));
        println!("topology written to {f}");
    }
}

fn explain(args: &[String]) {
    let (pos, opts) = options(args);
    let [coll] = pos.as_slice() else { usage() };
    let c = Coll::parse(coll).unwrap_or_else(|| fail("explain", format!("unknown collective {coll:?}")));
    // The library's own reading of the environment (NCCL_ALGO, NCCL_PROTO, channel counts,
    // OXCCL_DIRECT, OXCCL_CALIBRATE, OXCCL_HOST_ID).
    let config = oxccl::Config::from_lookup(|k| std::env::var(k).ok()).unwrap_or_else(|e| fail("explain", e));
    let mut m = if opts.contains_key("topo") {
        let t = load("explain", &opts);
        let ranks = number("explain", &opts, "ranks", t.gpus().len());
        Model::from_topo(&t, ranks).unwrap_or_else(|e| fail("explain", e))
    } else {
        // This host's CPU ranks, from its calibration (measured once, cached).
        let ranks = number("explain", &opts, "ranks", 2);
        if ranks < 1 {
            fail("explain", "--ranks must be at least 1");
        }
        let costs = oxccl::calib::host_costs(
            oxccl::sys::host::host_id(config.host_id.as_deref()),
            config.calibrate.as_deref(),
        );
        Model::cpu(ranks, 1, &costs, config.direct && ranks > 1, 1, 1)
    };
    if std::env::var_os("NCCL_MIN_NCHANNELS").is_some() {
        m.min_channels = config.min_channels;
    }
    if std::env::var_os("NCCL_MAX_NCHANNELS").is_some() {
        m.max_channels = config.max_channels;
    }
    let en = config.enabled;
    print!("{}", m.explain_text(c, &explain_sizes(), &en));
}

fn sim(args: &[String]) {
    // `--name value`, `-b/-e/-f value`, and the flag `--exact`.
    let mut opts = std::collections::BTreeMap::new();
    let mut flags = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let key = match a.as_str() {
            "--exact" | "--bootstrap" => {
                flags.push(a[2..].to_string());
                continue;
            }
            "-b" | "-e" | "-f" => &a[1..],
            k if k.starts_with("--") => &k[2..],
            _ => fail("sim", format!("unexpected argument {a:?}")),
        };
        let v = it.next().unwrap_or_else(|| fail("sim", format!("{a} needs a value")));
        opts.insert(key.to_string(), v.clone());
    }
    if flags.iter().any(|f| f == "bootstrap") {
        if let Err(e) = simcmd::run_bootstrap(&opts) {
            fail("sim", e);
        }
        return;
    }
    let o = simcmd::parse(&opts, &flags).unwrap_or_else(|e| fail("sim", e));
    if let Err(e) = simcmd::run(&o) {
        fail("sim", e);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((cmd, files)) if cmd == "analyze" && !files.is_empty() => {
            match oxccl::flight::analyze_files(files) {
                Ok(v) => print!("{v}"),
                Err(e) => fail("analyze", e),
            }
        }
        Some((cmd, rest)) if cmd == "topo" => topo(rest),
        Some((cmd, rest)) if cmd == "explain" => explain(rest),
        Some((cmd, rest)) if cmd == "sim" => sim(rest),
        _ => usage(),
    }
}
