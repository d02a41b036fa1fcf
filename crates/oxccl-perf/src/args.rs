//! nccl-tests' command line: the same flags, meanings and defaults, plus oxccl's own
//! (`-np`, `--plot`), parsed by hand to keep nccl-tests' syntax exactly (`-b8`, `-b 8`,
//! `-np 4`, `--minbytes=1K`). `-h`/`--help` is an outcome of its own ([`ArgsError::Help`]:
//! the usage on stdout, exit 0), apart from a wrong command line ([`ArgsError::Invalid`]).
//!
//! Rules:
//! 1. A wrong command line is said in a line or two, never the whole usage: what was wrong,
//!    the nearest known option or benchmark when one is near (`suggest`), and where to look
//!    ([`SEE_HELP`]).
//! 2. What can be checked before any rank starts is: the options here, a root (`-r`) against
//!    the job's rank count in [`check_root`] (called by the launcher and by each rank before
//!    its rendezvous).

use crate::sizes::SIZE_FORMS;
use crate::suggest::{did_you_mean, nearest};
use oxccl::{DataType, ReduceOp};
use oxccl_core::coll::Collective;

/// Which benchmark (nccl-tests binary name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bench {
    AllReduce,
    AllGather,
    Broadcast,
    ReduceScatter,
    Reduce,
    AllToAll,
    Gather,
    Scatter,
    SendRecv,
    HyperCube,
}

impl Bench {
    pub const ALL: [Bench; 10] = [
        Bench::AllReduce,
        Bench::AllGather,
        Bench::Broadcast,
        Bench::ReduceScatter,
        Bench::Reduce,
        Bench::AllToAll,
        Bench::Gather,
        Bench::Scatter,
        Bench::SendRecv,
        Bench::HyperCube,
    ];

    /// The nccl-tests program name.
    pub fn program(self) -> &'static str {
        match self {
            Bench::AllReduce => "all_reduce_perf",
            Bench::AllGather => "all_gather_perf",
            Bench::Broadcast => "broadcast_perf",
            Bench::ReduceScatter => "reduce_scatter_perf",
            Bench::Reduce => "reduce_perf",
            Bench::AllToAll => "alltoall_perf",
            Bench::Gather => "gather_perf",
            Bench::Scatter => "scatter_perf",
            Bench::SendRecv => "sendrecv_perf",
            Bench::HyperCube => "hypercube_perf",
        }
    }

    /// Parses a program name (with or without a path, `_perf`, or an `oxccl-` prefix).
    pub fn parse(s: &str) -> Option<Bench> {
        let base = s.rsplit('/').next().unwrap_or(s);
        let base = base.strip_prefix("oxccl-").unwrap_or(base);
        let base = base.strip_suffix("_perf").unwrap_or(base);
        Bench::ALL.into_iter().find(|b| b.program().strip_suffix("_perf") == Some(base))
    }

    /// The library's collective the benchmark times (`None` for the send/recv and hypercube
    /// exchanges).
    pub fn collective(self) -> Option<Collective> {
        Some(match self {
            Bench::AllReduce => Collective::AllReduce,
            Bench::AllGather => Collective::AllGather,
            Bench::Broadcast => Collective::Broadcast,
            Bench::ReduceScatter => Collective::ReduceScatter,
            Bench::Reduce => Collective::Reduce,
            Bench::AllToAll => Collective::AllToAll,
            Bench::Gather => Collective::Gather,
            Bench::Scatter => Collective::Scatter,
            Bench::SendRecv | Bench::HyperCube => return None,
        })
    }

    pub fn reduces(self) -> bool {
        self.collective().is_some_and(Collective::reduces)
    }

    pub fn rooted(self) -> bool {
        self.collective().is_some_and(Collective::rooted)
    }

    /// Whether nccl-tests checks its in-place results (alltoall and sendrecv have none).
    pub fn checks_in_place(self) -> bool {
        !matches!(self, Bench::SendRecv)
    }
}

/// Everything the command line says.
#[derive(Clone, Debug)]
pub struct Opts {
    pub bench: Bench,
    pub nthreads: usize,
    pub ngpus: usize,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub step_bytes: usize,
    pub step_factor: usize,
    pub iters: usize,
    pub warmup: usize,
    pub agg: usize,
    pub cycles: usize,
    pub check: usize,
    /// `None`: all.
    pub op: Option<ReduceOp>,
    /// `None`: all.
    pub dtype: Option<DataType>,
    /// `None`: all.
    pub root: Option<usize>,
    pub blocking: u8,
    pub average: u8,
    pub timeout_s: Option<f64>,
    pub per_iter: bool,
    pub per_iter_skip: usize,
    pub json: Option<String>,
    pub memory: bool,
    pub report_cputime: bool,
    pub timestamps: bool,
    /// Buffers in oxccl's shared (registered) memory (`-R 1`, the default) or on the heap.
    pub register: bool,
    pub unalign: usize,
    pub np: Option<usize>,
    pub plot: Option<String>,
    /// JSON files to overlay in `--plot` (besides this run's).
    pub plot_inputs: Vec<String>,
    /// Buffers in CUDA device memory (`--mem device`).
    pub device: bool,
    /// CUDA graph launches per iteration (`-G`; 0: none): the timed iterations are captured
    /// into one graph, launched this many times; each check's call into another.
    pub graph: usize,
    /// The capture mode (`--graph_mode`): 0 global, 1 thread-local, 2 relaxed; `None`: as
    /// nccl-tests (thread-local with several threads, else global).
    pub graph_mode: Option<u8>,
    /// Where in the arguments the benchmark was named (`None`: by the program's name, or not
    /// at all), so that the launcher gives its ranks every other argument.
    pub bench_at: Option<usize>,
}

pub use crate::sizes::parse_size;

/// The second line of a wrong command line's error.
pub const SEE_HELP: &str = "  (--help lists the benchmarks and every option)";

/// Every option as it is typed, for suggestions: exactly the spellings [`parse`] takes.
pub const OPTIONS: [&str; 68] = [
    "-np",
    "-t",
    "--nthreads",
    "-g",
    "--ngpus",
    "--mem",
    "-b",
    "--minbytes",
    "-e",
    "--maxbytes",
    "-i",
    "--stepbytes",
    "-f",
    "--stepfactor",
    "-o",
    "--op",
    "-d",
    "--datatype",
    "-r",
    "--root",
    "-n",
    "--iters",
    "-w",
    "--warmup_iters",
    "-m",
    "--agg_iters",
    "-N",
    "--run_cycles",
    "-a",
    "--average",
    "-c",
    "--check",
    "-z",
    "--blocking",
    "-T",
    "--timeout",
    "-I",
    "--per_iter_timing",
    "-K",
    "--per_iter_skip",
    "-J",
    "--output_file",
    "-M",
    "--memory",
    "-C",
    "--report_cputime",
    "-S",
    "--report_timestamps",
    "-R",
    "--local_register",
    "-u",
    "--unalign",
    "--plot",
    "-G",
    "--cudagraph",
    "--graph_mode",
    "-p",
    "--parallel_init",
    "-y",
    "--stream_null",
    "-x",
    "--cta_policy",
    "-D",
    "--device_implementation",
    "-V",
    "--device_cta_count",
    "-h",
    "--help",
];

pub const USAGE: &str =
    "USAGE: oxccl-perf <benchmark> [options]   (or run as <benchmark>, e.g. all_reduce_perf)
  benchmarks: all_reduce_perf all_gather_perf broadcast_perf reduce_scatter_perf reduce_perf
              alltoall_perf gather_perf scatter_perf sendrecv_perf hypercube_perf
              (none given: all_reduce_perf)
  -np <ranks>                 start this many local rank processes (oxccl); without it, each
                              process started by mpirun/srun/torchrun is one rank (and -np is
                              refused under them)
  -t,--nthreads <1>           ranks per process, each a thread (1)
  -g,--ngpus <1>              devices per thread (1)
  --mem <host/device>         buffers in host memory (host) or on CUDA device
                              (local rank index % devices) with oxccl's device engines
  -b,--minbytes <size>        minimum size (32M)
  -e,--maxbytes <size>        maximum size (32M)
  -i,--stepbytes <size>       fixed increment (1M)
  -f,--stepfactor <factor>    multiplication factor (disabled)
  -o,--op <sum/prod/min/max/avg/band/bor/bxor/all>   reduction (sum)
  -d,--datatype <type/all>    int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
                              f8e4m3 f8e5m2 (float)
  -r,--root <root/all>        root (0)
  -n,--iters <n>              timed iterations (20)
  -w,--warmup_iters <n>       warm-up iterations (1)
  -m,--agg_iters <n>          operations aggregated per iteration in one group (1)
  -N,--run_cycles <n>         run and print each cycle (1; 0 = forever)
  -a,--average <0/1/2/3>      combine times across ranks: rank 0, avg, min, max (1)
  -c,--check <n>              checked iterations per size (1; 0 disables)
  -z,--blocking <0/1/2/3>     barrier after each inner (1) or outer iteration excluded from time (3)
  -T,--timeout <seconds>      fail a call that waits longer (disabled)
  -I,--per_iter_timing <0/1>  per-iteration min/max/p99/cv columns (0)
  -K,--per_iter_skip <n>      leading iterations excluded from -I statistics (0)
  -J,--output_file <file>     JSON results
  -M,--memory <0/1>           host memory report (0)
  -C,--report_cputime <0/1>   report CPU time (0)
  -S,--report_timestamps <0/1> timestamp each line (0)
  -R,--local_register <0/1>   buffers in oxccl shared memory, registered (1) or on the heap (0)
  -u,--unalign <elements>     misalign buffers by this many elements (0)
  --plot <file.svg> [json...] plot busbw and time against size (this run and/or JSON files);
                              alone: oxccl-perf --plot <file.svg> [--title <text>] <json...>
  -G,--cudagraph <n>          with --mem device: capture the timed iterations into a CUDA
                              graph and launch it n times; each check's call is captured too (0)
  --graph_mode <mode>         capture mode: global, thread or relaxed (thread-local with
                              several threads, else global, as nccl-tests)
  -p -y -x -D -V              nccl-tests' parallel init, stream and device-API options:
                              accepted with their value, not used yet
  -h,--help";

/// Why the command line gives nothing to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// `-h` or `--help`: [`USAGE`] goes to stdout and the program ends successfully.
    Help,
    /// A wrong command line; the message names the option (for stderr, exit status 2).
    Invalid(String),
}

impl From<String> for ArgsError {
    fn from(message: String) -> Self {
        ArgsError::Invalid(message)
    }
}

impl From<&str> for ArgsError {
    fn from(message: &str) -> Self {
        ArgsError::Invalid(message.to_string())
    }
}

impl std::fmt::Display for ArgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgsError::Help => f.write_str(USAGE),
            ArgsError::Invalid(message) => f.write_str(message),
        }
    }
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim().parse::<T>().map_err(|_| format!("invalid value {v:?} for {flag}"))
}

/// Parses `args` (without the program name); `bench` when the program name already says it.
pub fn parse(args: &[String], bench: Option<Bench>) -> Result<Opts, ArgsError> {
    let mut o = Opts {
        bench: bench.unwrap_or(Bench::AllReduce),
        nthreads: 1,
        ngpus: 1,
        min_bytes: 32 << 20,
        max_bytes: 32 << 20,
        step_bytes: 1 << 20,
        step_factor: 1,
        iters: 20,
        warmup: 1,
        agg: 1,
        cycles: 1,
        check: 1,
        op: Some(ReduceOp::Sum),
        dtype: Some(DataType::F32),
        root: Some(0),
        blocking: 0,
        average: 1,
        timeout_s: None,
        per_iter: false,
        per_iter_skip: 0,
        json: None,
        memory: false,
        report_cputime: false,
        timestamps: false,
        register: true,
        unalign: 0,
        np: None,
        plot: None,
        plot_inputs: Vec::new(),
        device: false,
        graph: 0,
        graph_mode: None,
        bench_at: None,
    };
    let mut have_bench = bench.is_some();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        // --long=value, --long value, -x value, -xvalue
        let (flag, inline): (String, Option<String>) = if let Some(l) = a.strip_prefix("--") {
            match l.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (l.to_string(), None),
            }
        } else if a == "-np" {
            ("np".to_string(), None)
        } else if let Some(s) = a.strip_prefix('-').filter(|s| !s.is_empty()) {
            let (k, rest) = s.split_at(1);
            (k.to_string(), (!rest.is_empty()).then(|| rest.to_string()))
        } else {
            if !have_bench {
                o.bench = Bench::parse(a).ok_or_else(|| {
                    let names = Bench::ALL.map(Bench::program);
                    format!("unknown benchmark {a:?}{}\n{SEE_HELP}", did_you_mean(a, names))
                })?;
                o.bench_at = Some(i);
                have_bench = true;
            } else if o.plot.is_some() {
                o.plot_inputs.push(a.to_string());
            } else {
                return Err(format!(
                    "unexpected argument {a:?}: the benchmark is {} already, and options start with -\n{SEE_HELP}",
                    o.bench.program()
                )
                .into());
            }
            i += 1;
            continue;
        };
        if flag == "h" || flag == "help" {
            return Err(ArgsError::Help);
        }
        let mut value = || -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            args.get(i).cloned().ok_or_else(|| format!("option {a} needs a value"))
        };
        let size = |v: String, f: &str| {
            parse_size(&v).ok_or_else(|| format!("invalid size {v:?} for {f}: {SIZE_FORMS}"))
        };
        match flag.as_str() {
            "t" | "nthreads" => o.nthreads = num("-t", &value()?)?,
            "g" | "ngpus" => o.ngpus = num("-g", &value()?)?,
            "b" | "minbytes" => o.min_bytes = size(value()?, "-b")?,
            "e" | "maxbytes" => o.max_bytes = size(value()?, "-e")?,
            "i" | "stepbytes" => o.step_bytes = size(value()?, "-i")?,
            "f" | "stepfactor" => o.step_factor = num("-f", &value()?)?,
            "n" | "iters" => o.iters = num("-n", &value()?)?,
            "w" | "warmup_iters" => o.warmup = num("-w", &value()?)?,
            "m" | "agg_iters" => o.agg = num("-m", &value()?)?,
            "N" | "run_cycles" => o.cycles = num("-N", &value()?)?,
            "p" | "parallel_init" => {
                value()?;
            }
            "c" | "check" => o.check = num("-c", &value()?)?,
            "o" | "op" => {
                let v = value()?;
                o.op = if v == "all" {
                    None
                } else {
                    Some(ReduceOp::parse(&v).ok_or_else(|| format!("invalid op {v:?} for -o"))?)
                };
            }
            "d" | "datatype" => {
                let v = value()?;
                o.dtype = if v == "all" {
                    None
                } else {
                    Some(DataType::parse(&v).ok_or_else(|| format!("invalid type {v:?} for -d"))?)
                };
            }
            "r" | "root" => {
                let v = value()?;
                o.root = if v == "all" { None } else { Some(num("-r", &v)?) };
            }
            "z" | "blocking" => o.blocking = num("-z", &value()?)?,
            "G" | "cudagraph" => o.graph = num("-G", &value()?)?,
            "graph_mode" => {
                o.graph_mode = Some(match value()?.as_str() {
                    "global" => 0,
                    "thread" => 1,
                    "relaxed" => 2,
                    v => {
                        return Err(format!(
                            "invalid value {v:?} for --graph_mode (global, thread or relaxed)"
                        )
                        .into())
                    }
                })
            }
            "y"
            | "stream_null"
            | "x"
            | "cta_policy"
            | "D"
            | "device_implementation"
            | "V"
            | "device_cta_count" => {
                value()?;
            }
            "T" | "timeout" => {
                let t: f64 = num("-T", &value()?)?;
                o.timeout_s = (t > 0.0).then_some(t);
            }
            "C" | "report_cputime" => o.report_cputime = num::<u8>("-C", &value()?)? != 0,
            "S" | "report_timestamps" => o.timestamps = num::<u8>("-S", &value()?)? != 0,
            "J" | "output_file" => o.json = Some(value()?),
            "a" | "average" => o.average = num("-a", &value()?)?,
            "R" | "local_register" => o.register = num::<u8>("-R", &value()?)? != 0,
            "M" | "memory" => o.memory = num::<u8>("-M", &value()?)? != 0,
            "u" | "unalign" => o.unalign = num("-u", &value()?)?,
            "I" | "per_iter_timing" => o.per_iter = num::<u8>("-I", &value()?)? != 0,
            "K" | "per_iter_skip" => o.per_iter_skip = num("-K", &value()?)?,
            "np" => o.np = Some(num("-np", &value()?)?),
            "plot" => o.plot = Some(value()?),
            "mem" => {
                o.device = match value()?.as_str() {
                    "device" => true,
                    "host" => false,
                    v => return Err(format!("invalid value {v:?} for --mem (host or device)").into()),
                }
            }
            _ if a.starts_with("--") => {
                // Long names are compared without their dashes, as clap does.
                let longs = OPTIONS.iter().filter_map(|o| o.strip_prefix("--"));
                let hint =
                    nearest(&flag, longs).map(|n| format!("; did you mean \"--{n}\"?")).unwrap_or_default();
                return Err(format!("unknown option \"--{flag}\"{hint}\n{SEE_HELP}").into());
            }
            _ => return Err(format!("unknown option \"-{flag}\"\n{SEE_HELP}").into()),
        }
        i += 1;
    }
    if o.ngpus != 1 {
        return Err(
            "oxccl-perf gives each rank one device: -g must be 1 (use -t or -np for more ranks)".into()
        );
    }
    if o.nthreads == 0 || o.nthreads > 64 {
        return Err(format!("-t takes 1..=64 threads per process, not {}", o.nthreads).into());
    }
    if o.min_bytes > o.max_bytes {
        return Err(format!(
            "invalid sizes for 'minbytes' and 'maxbytes': {} > {}",
            o.min_bytes, o.max_bytes
        )
        .into());
    }
    if o.iters == 0 || o.agg == 0 {
        return Err("-n and -m must be at least 1".into());
    }
    if o.blocking > 3 || o.average > 3 {
        return Err("-z takes 0..3 and -a takes 0..3".into());
    }
    if o.per_iter_skip >= o.iters {
        o.per_iter_skip = 0;
    }
    if o.graph > 0 && !o.device {
        return Err("-G captures CUDA graphs, which needs device buffers: add --mem device".into());
    }
    Ok(o)
}

/// A job's rank count and how to say where it comes from: `-np` processes, or those of the
/// launcher (`(name, processes)`) that started this one, or this process alone; each of `-t`
/// threads.
pub fn job(np: Option<usize>, launcher: Option<(&str, usize)>, threads: usize) -> (usize, String) {
    let t = if threads > 1 { format!(" × -t {threads}") } else { String::new() };
    match (np, launcher) {
        (Some(n), _) => (n * threads, format!("with -np {n}{t}")),
        (None, Some((name, n))) => (n * threads, format!("under {name} with {n} processes{t}")),
        (None, None) if threads > 1 => (threads, format!("with -t {threads} in one process")),
        (None, None) => (1, "in one process (no -np, no launcher)".to_string()),
    }
}

/// Refuses a root (`-r`) that is not a rank of a job of `ranks` ranks, which `job` describes
/// ("with -np 2", "under torchrun with 4 processes"); only for the rooted benchmarks, since
/// nccl-tests ignores `-r` for the others.
pub fn check_root(o: &Opts, ranks: usize, job: &str) -> Result<(), String> {
    match o.root {
        Some(r) if o.bench.rooted() && ranks > 0 && r >= ranks => {
            let have = match ranks {
                1 => "only rank 0: give -r 0".to_string(),
                n => format!("ranks 0 to {}: give one of them", n - 1),
            };
            Err(format!("invalid root {r} for -r: {} {job} has {have}, or -r all", o.bench.program()))
        }
        _ => Ok(()),
    }
}

impl Opts {
    /// The sizes of the sweep, in bytes.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut s = self.min_bytes;
        loop {
            v.push(s);
            let next = if self.step_factor > 1 {
                s.saturating_mul(self.step_factor)
            } else {
                s.saturating_add(self.step_bytes.max(1))
            };
            if next > self.max_bytes || next == s {
                break;
            }
            s = next;
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Opts, ArgsError> {
        let a: Vec<String> = s.split_whitespace().map(String::from).collect();
        parse(&a, None)
    }

    #[test]
    fn nccl_tests_flags() {
        let o =
            p("all_reduce_perf -np 4 -b 8 -e 64M -f 4 -n 5 -w2 -d all -o all -r all -c 1 -a 3 -J out.json")
                .unwrap();
        assert_eq!(o.bench, Bench::AllReduce);
        assert_eq!((o.min_bytes, o.max_bytes, o.step_factor), (8, 64 << 20, 4));
        assert_eq!((o.iters, o.warmup, o.np, o.average), (5, 2, Some(4), 3));
        assert_eq!((o.dtype, o.op, o.root), (None, None, None));
        assert_eq!(o.json.as_deref(), Some("out.json"));
        // 8 × 4^k up to 64M: the last size is 32M, as in nccl-tests.
        assert_eq!(o.sizes().len(), 12);
        assert_eq!(*o.sizes().last().unwrap(), 32 << 20);
        let o = p("sendrecv --minbytes=1K --maxbytes 3K -i 1K").unwrap();
        assert_eq!(o.bench, Bench::SendRecv);
        assert_eq!(o.sizes(), vec![1024, 2048, 3072]);
        assert_eq!(Bench::parse("/usr/bin/oxccl-alltoall_perf"), Some(Bench::AllToAll));
        let o = p("all_reduce_perf -t 4 --mem device").unwrap();
        assert_eq!((o.nthreads, o.device), (4, true));
        assert!(!p("all_reduce_perf --mem=host").unwrap().device);
        // -G: graph launches, on device buffers only; --graph_mode names the capture mode.
        let o = p("all_reduce_perf --mem device -G 10 --graph_mode relaxed").unwrap();
        assert_eq!((o.graph, o.graph_mode), (10, Some(2)));
        assert_eq!(p("all_reduce_perf --mem device -G 0").unwrap().graph, 0);
        let e = p("all_reduce_perf -G 3").unwrap_err();
        assert!(format!("{e:?}").contains("--mem device"), "{e:?}");
        assert!(p("all_reduce_perf --mem device -G 1 --graph_mode sometimes").is_err());
    }

    #[test]
    fn help_is_its_own_outcome() {
        for line in ["-h", "--help", "all_reduce_perf -b 8 -h", "sendrecv_perf --help -e 1K"] {
            assert_eq!(p(line).unwrap_err(), ArgsError::Help, "{line}");
        }
        assert_eq!(ArgsError::Help.to_string(), USAGE);
    }

    #[test]
    fn bad_flags_are_errors() {
        assert!(p("all_reduce_perf -b 64M -e 8").is_err());
        assert!(p("all_reduce_perf -d bogus").is_err());
        assert!(p("all_reduce_perf -g 2").is_err());
        assert!(p("all_reduce_perf -t 0").is_err());
        assert!(p("all_reduce_perf --mem gpu").is_err());
        assert!(p("nosuch_perf").is_err());
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("x"), None);
    }

    fn invalid(line: &str) -> String {
        match p(line) {
            Err(ArgsError::Invalid(e)) => e,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn a_wrong_command_line_is_said_in_two_lines_with_the_nearest_known_word() {
        let help = "\n  (--help lists the benchmarks and every option)";
        let minbytes = format!("unknown option \"--minbyte\"; did you mean \"--minbytes\"?{help}");
        assert_eq!(invalid("all_reduce_perf --minbyte 8"), minbytes);
        assert_eq!(invalid("all_reduce_perf --minbyte=8"), minbytes);
        assert_eq!(
            invalid("all_reduce_perf --warmup_iter 2"),
            format!("unknown option \"--warmup_iter\"; did you mean \"--warmup_iters\"?{help}")
        );
        assert_eq!(invalid("all_reduce_perf -q1"), format!("unknown option \"-q\"{help}"));
        assert_eq!(invalid("all_reduce_perf --colour 1"), format!("unknown option \"--colour\"{help}"));
        assert_eq!(
            invalid("allreduce_perf -b 8"),
            format!("unknown benchmark \"allreduce_perf\"; did you mean \"all_reduce_perf\"?{help}")
        );
        assert_eq!(
            invalid("alltoal_perf"),
            format!("unknown benchmark \"alltoal_perf\"; did you mean \"alltoall_perf\"?{help}")
        );
        assert_eq!(invalid("frobnicate"), format!("unknown benchmark \"frobnicate\"{help}"));
        assert_eq!(
            invalid("all_reduce_perf 8M"),
            format!("unexpected argument \"8M\": the benchmark is all_reduce_perf already, and options start with -{help}")
        );
        assert_eq!(
            invalid("all_reduce_perf -b 1T"),
            "invalid size \"1T\" for -b: a number of bytes, optionally with K, M or G (powers of 1024): 8, 64K, 1.5M, 1G"
        );
        assert_eq!(
            invalid("all_reduce_perf -b 1K -e x"),
            "invalid size \"x\" for -e: a number of bytes, optionally with K, M or G (powers of 1024): 8, 64K, 1.5M, 1G"
        );
    }

    /// The suggestions' list is the parser's: every spelling in it is taken (with some value).
    #[test]
    fn every_listed_option_is_taken() {
        for opt in OPTIONS {
            match p(&format!("all_reduce_perf {opt} 1")) {
                Err(ArgsError::Invalid(e)) => assert!(!e.starts_with("unknown option"), "{opt}: {e}"),
                Err(ArgsError::Help) => assert!(opt == "-h" || opt == "--help", "{opt}"),
                Ok(_) => {}
            }
        }
        assert_eq!(OPTIONS.iter().collect::<std::collections::HashSet<_>>().len(), OPTIONS.len());
    }

    /// The benchmark may come after options; where it came is kept for the launcher.
    #[test]
    fn the_benchmark_anywhere_and_where() {
        let o = p("-np 2 -t 2 broadcast_perf -r 3").unwrap();
        assert_eq!(
            (o.bench, o.bench_at, o.root, o.np, o.nthreads),
            (Bench::Broadcast, Some(4), Some(3), Some(2), 2)
        );
        assert_eq!(p("reduce_perf -np 2").unwrap().bench_at, Some(0));
        assert_eq!(p("-np 2").unwrap().bench_at, None);
    }

    #[test]
    fn a_root_outside_the_job_is_refused_naming_r_and_the_ranks() {
        let o = p("broadcast_perf -r 5").unwrap();
        assert_eq!(
            check_root(&o, 2, "with -np 2").unwrap_err(),
            "invalid root 5 for -r: broadcast_perf with -np 2 has ranks 0 to 1: give one of them, or -r all"
        );
        assert_eq!(
            check_root(&o, 1, "in a process started alone").unwrap_err(),
            "invalid root 5 for -r: broadcast_perf in a process started alone has only rank 0: give -r 0, or -r all"
        );
        assert_eq!(check_root(&o, 6, "with -np 6"), Ok(()));
        assert_eq!(check_root(&p("reduce_perf -r 2").unwrap(), 3, "with -np 3"), Ok(()));
        assert!(check_root(&p("reduce_perf -r 3").unwrap(), 3, "with -np 3").is_err());
        assert_eq!(check_root(&p("broadcast_perf -r all").unwrap(), 2, "with -np 2"), Ok(()));
        // Where the rank count comes from.
        assert_eq!(job(Some(2), None, 1), (2, "with -np 2".to_string()));
        assert_eq!(job(Some(2), None, 3), (6, "with -np 2 × -t 3".to_string()));
        assert_eq!(job(None, Some(("torchrun", 4)), 1), (4, "under torchrun with 4 processes".to_string()));
        assert_eq!(
            job(None, Some(("mpirun", 2)), 2),
            (4, "under mpirun with 2 processes × -t 2".to_string())
        );
        assert_eq!(job(None, None, 2), (2, "with -t 2 in one process".to_string()));
        assert_eq!(job(None, None, 1), (1, "in one process (no -np, no launcher)".to_string()));
        // nccl-tests ignores -r where there is no root.
        assert_eq!(check_root(&p("all_reduce_perf -r 5").unwrap(), 2, "with -np 2"), Ok(()));
    }
}
