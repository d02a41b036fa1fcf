//! The main job: starts N local rank processes and runs every collective once, each checked
//! exactly on every rank against the reference, then prints a verdict per collective.
//!
//! ```text
//! cargo run --release -p oxccl-testkit --example all_collectives -- -np 4
//! options: -np N (ranks, default 4)   -n COUNT (elements per rank, default 1048579)
//!          --tcp (NCCL_SHM_DISABLE=1)   -d TYPE (data type, default float)
//!          --shared (buffers in oxccl shared memory: the zero-copy path)
//! ```

use oxccl::{Communicator, Config, DataType, ReduceOp};
use oxccl_testkit::{child, run_case, Case, CaseColl, Launch};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const SCENARIO: &str = "all_collectives";

fn arg<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> T {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const USAGE: &str = "usage: all_collectives [-np N] [-n COUNT] [-d TYPE] [--tcp] [--shared]
  -np N      ranks, each a process (default 4)
  -n COUNT   elements per rank (default 1048579)
  -d TYPE    data type: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
             f8e4m3 f8e5m2 (default float)
  --tcp      ranks talk over TCP (NCCL_SHM_DISABLE=1)
  --shared   buffers in oxccl shared memory (the zero-copy path)";

/// Exits with the usage (`-h`, `--help`: stdout, 0) or an error naming the argument (2)
/// unless every argument is one of the options with a valid value.
fn check_args(args: &[String]) {
    let fail = |m: String| -> ! {
        eprintln!("all_collectives: {m}\n{USAGE}");
        std::process::exit(2)
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let value = || args.get(i + 1).cloned().unwrap_or_else(|| fail(format!("{a} needs a value")));
        match a {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0)
            }
            "--tcp" | "--shared" => {}
            "-np" | "-n" => {
                let v = value();
                if v.parse::<usize>().ok().filter(|&n| n > 0).is_none() {
                    fail(format!("{a} {v:?}: not a positive number"));
                }
                i += 1;
            }
            "-d" => {
                let v = value();
                if DataType::parse(&v).is_none() {
                    fail(format!("-d {v:?}: not a data type"));
                }
                i += 1;
            }
            _ => fail(format!("unknown argument {a:?}")),
        }
        i += 1;
    }
}

/// One rank's part: every collective once; whether all were exact.
fn rank_main(args: &[String]) -> bool {
    let comm = Communicator::from_env().unwrap_or_else(|e| {
        println!("VERDICT init FAIL {e}");
        std::process::exit(1)
    });
    let count: usize = arg(args, "-n", (1 << 20) + 3);
    let dtype = DataType::parse(&arg::<String>(args, "-d", "float".into())).unwrap_or(DataType::F32);
    let mut ok = true;
    for (i, coll) in CaseColl::ALL.into_iter().enumerate() {
        let case = Case {
            coll,
            dtype,
            op: coll.reduces().then_some(ReduceOp::Sum),
            count,
            in_place: false,
            root: comm.size() - 1,
            seed: 1000 + i as u64,
            shared: args.iter().any(|a| a == "--shared"),
        };
        let t = Instant::now();
        match run_case(&comm, &case) {
            Ok(()) => println!("VERDICT {} OK {:.3}", coll.name(), t.elapsed().as_secs_f64() * 1e3),
            Err(e) => {
                ok = false;
                println!("VERDICT {} FAIL {e}", coll.name());
            }
        }
    }
    ok
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(ctx) = child(SCENARIO) {
        let ok = rank_main(&args);
        // The scenario finished: recorded now, as the exit below runs no destructors.
        drop(ctx);
        std::process::exit(if ok { 0 } else { 1 });
    }
    check_args(&args[1..]);
    let np: usize = arg(&args, "-np", 4);
    let count: usize = arg(&args, "-n", (1 << 20) + 3);
    let tcp = args.iter().any(|a| a == "--tcp");
    let dtype: String = arg(&args, "-d", "float".into());
    let id = oxccl::new_unique_id(&Config::default()).unwrap_or_else(|e| {
        eprintln!("cannot create a unique id: {e}");
        std::process::exit(2)
    });
    println!(
        "# oxccl all_collectives: {np} ranks, {count} {dtype} elements per rank, transport {}",
        if tcp { "TCP" } else { "shared memory" }
    );
    let mut child_args = vec!["-n".to_string(), count.to_string(), "-d".to_string(), dtype];
    if args.iter().any(|a| a == "--shared") {
        child_args.push("--shared".into());
    }
    let child_args: Vec<&str> = child_args.iter().map(|s| s.as_str()).collect();
    let l = Launch::program(SCENARIO, np, &child_args)
        .env("OXCCL_UNIQUE_ID", &id.to_string())
        .env("OXCCL_TIMEOUT", "120")
        .env("NCCL_SHM_DISABLE", if tcp { "1" } else { "0" })
        .timeout(Duration::from_secs(600));
    let started = Instant::now();
    let (done, launch_err) = match l.run_keep() {
        Ok(d) => (d, None),
        Err((d, e)) => (d, Some(e)),
    };
    // collective -> (ranks OK, slowest ms, first failure)
    let mut table: BTreeMap<usize, (String, usize, f64, Option<String>)> = BTreeMap::new();
    for d in &done {
        for line in d.stdout.lines().filter_map(|l| l.strip_prefix("VERDICT ")) {
            let mut parts = line.splitn(3, ' ');
            let (name, verdict, rest) =
                (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let idx = CaseColl::ALL.iter().position(|c| c.name() == name).unwrap_or(usize::MAX);
            let e = table.entry(idx).or_insert((name.to_string(), 0, 0.0, None));
            if verdict == "OK" {
                e.1 += 1;
                e.2 = e.2.max(rest.parse().unwrap_or(0.0));
            } else if e.3.is_none() {
                e.3 = Some(format!("rank {}: {rest}", d.rank));
            }
        }
    }
    let mut all_ok = launch_err.is_none();
    println!("# {:<16} {:>10} {:>12}  verdict", "collective", "ranks ok", "ms (+check)");
    for (name, n_ok, ms, fail) in table.values() {
        let verdict = match fail {
            None if *n_ok == np => "OK (exact on every rank)".to_string(),
            None => format!("FAILED ({n_ok} of {np} ranks reported)"),
            Some(f) => format!("FAILED: {f}"),
        };
        all_ok &= fail.is_none() && *n_ok == np;
        println!("  {name:<16} {:>10} {ms:>12.2}  {verdict}", format!("{n_ok}/{np}"));
    }
    if table.len() != CaseColl::ALL.len() {
        all_ok = false;
        println!("# only {} of {} collectives reported", table.len(), CaseColl::ALL.len());
    }
    if let Some(e) = launch_err {
        println!("# launch failed:\n{e}");
    }
    println!(
        "# {} in {:.2} s",
        if all_ok { "ALL COLLECTIVES CORRECT" } else { "FAILURES" },
        started.elapsed().as_secs_f64()
    );
    std::process::exit(if all_ok { 0 } else { 1 });
}
