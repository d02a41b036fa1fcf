//! The command lines as users expect them: `--help` prints the usage on stdout and exits 0 for
//! every tool and subcommand, unknown options and missing arguments are rejected naming them,
//! and a closed stdout (`| head -1`) ends each tool quietly, by SIGPIPE, never a panic.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};

oxccl_testkit::test_scope!();

const OXCCL: &str = env!("CARGO_BIN_EXE_oxccl");
const PERF: &str = env!("CARGO_BIN_EXE_oxccl-perf");
const GPUCHECK: &str = env!("CARGO_BIN_EXE_oxccl-gpucheck");

fn summit() -> String {
    format!("{}/../../fixtures/clusters/summit.json", env!("CARGO_MANIFEST_DIR"))
}

/// `exe args` without a launcher's variables (so oxccl-perf is a world of one rank) and
/// without the tuner's overrides.
fn command(exe: &str, args: &[&str]) -> Command {
    let mut c = Command::new(exe);
    c.args(args);
    let launcher = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "NCCL_ALGO", "NCCL_PROTO", "NCCL_TOPO_FILE"];
    for (k, _) in std::env::vars() {
        if ["OXCCL_", "MASTER_", "SLURM_", "OMPI_", "PMI_"].iter().any(|p| k.starts_with(p))
            || launcher.contains(&k.as_str())
        {
            c.env_remove(k);
        }
    }
    c
}

/// Held by a test while it starts a child, and by [`closed_after`] and [`no_reader`] until
/// their pipe's read end is closed: a child that another test forks meanwhile would hold that
/// read end open until its exec.
static SPAWN: Mutex<()> = Mutex::new(());

fn spawn_lock() -> MutexGuard<'static, ()> {
    SPAWN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Exit code (-1 for a signal), stdout, stderr.
fn run(exe: &str, args: &[&str]) -> (i32, String, String) {
    let child = {
        let _spawning = spawn_lock();
        command(exe, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    };
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn help_goes_to_stdout_with_exit_status_0() {
    let help = |exe: &str, args: &[&str]| -> String {
        let (rc, out, err) = run(exe, args);
        assert_eq!((rc, err.as_str()), (0, ""), "{args:?}: {out}");
        out
    };
    for args in [&["--help"][..], &["-h"], &["help"]] {
        let out = help(OXCCL, args);
        assert!(out.contains("Usage: oxccl <COMMAND>"), "{out}");
        for cmd in ["analyze", "topo", "explain", "sim", "help"] {
            assert!(out.lines().any(|l| l.starts_with(&format!("  {cmd}  "))), "{cmd} missing: {out}");
        }
    }
    for (cmd, usage) in [
        ("analyze", "Usage: oxccl analyze <DUMP.json>..."),
        ("topo", "Usage: oxccl topo [OPTIONS]"),
        ("explain", "Usage: oxccl explain [OPTIONS] <COLLECTIVE>"),
        ("sim", "Usage: oxccl sim [OPTIONS] --cluster <FILE|local>"),
    ] {
        for args in [&[cmd, "--help"][..], &[cmd, "-h"], &["help", cmd]] {
            let out = help(OXCCL, args);
            assert!(out.lines().any(|l| l == usage), "{args:?}: {out}");
        }
    }
    let out = help(OXCCL, &["sim", "--help"]);
    for opt in [
        "--cluster <FILE|local>",
        "--ranks <N,...>",
        "-b <SIZE>",
        "-e <SIZE>",
        "-f <FACTOR>",
        "--sizes <SIZE,...>",
        "--algo <ALGO,...>",
        "--protos <PROTO,...>",
        "--channels <N>",
        "--chunk <SIZE>",
        "--exact",
        "--json <FILE>",
        "--plot <FILE.svg>",
        "--bootstrap",
        "--join-us <US>",
        "--connect-us <US>",
        "--boot-gbs <G>",
    ] {
        assert!(out.contains(opt), "{opt} missing: {out}");
    }
    let out = help(OXCCL, &["topo", "--help"]);
    for opt in ["--topo <FILE>", "--channels <N>", "--svg <FILE>", "--dump <FILE>"] {
        assert!(out.contains(opt), "{opt} missing: {out}");
    }
    assert_eq!(help(OXCCL, &["--version"]), format!("oxccl {}\n", env!("CARGO_PKG_VERSION")));

    for args in [&["-h"][..], &["--help"], &["all_reduce_perf", "-b", "8", "--help"]] {
        let out = help(PERF, args);
        assert!(out.starts_with("USAGE: oxccl-perf <benchmark> [options]"), "{out}");
        assert!(out.ends_with("  -h,--help\n"), "{out}");
    }
    for args in [&["-h"][..], &["--help"]] {
        let out = help(GPUCHECK, args);
        assert!(out.starts_with("usage: oxccl-gpucheck [--threads-only]\n"), "{out}");
        assert!(out.contains("oxccl-gpucheck --cubin ARCH FILE [DEFINE...]"), "{out}");
    }
}

#[test]
fn wrong_command_lines_are_rejected_naming_what_is_wrong() {
    let rejected = |exe: &str, args: &[&str]| -> String {
        let (rc, out, err) = run(exe, args);
        assert_eq!((rc, out.as_str()), (2, ""), "{args:?}: {err}");
        err
    };
    let err = rejected(OXCCL, &["explain", "allreduce", "--rnaks", "64"]);
    assert!(err.starts_with("error: unexpected argument '--rnaks' found"), "{err}");
    assert!(err.contains("tip: a similar argument exists: '--ranks'"), "{err}");
    // Without --topo, --ranks is required; with it, the topology's GPU count is the default.
    let err = rejected(OXCCL, &["explain", "allreduce"]);
    assert!(
        err.starts_with("error: the following required arguments were not provided:\n  --ranks <N>"),
        "{err}"
    );
    let err = rejected(OXCCL, &["explain", "allreduce", "--ranks", "0"]);
    assert!(err.contains("invalid value '0' for '--ranks <N>': not a rank count of at least 1"), "{err}");
    let err = rejected(OXCCL, &["explain", "alreduce", "--ranks", "4"]);
    assert!(err.contains("invalid value 'alreduce' for '<COLLECTIVE>'"), "{err}");
    let err = rejected(OXCCL, &["explain", "--ranks", "4"]);
    assert!(err.contains("<COLLECTIVE>"), "{err}");
    let err = rejected(OXCCL, &["analyze"]);
    assert!(
        err.starts_with("error: the following required arguments were not provided:\n  <DUMP.json>..."),
        "{err}"
    );
    let err = rejected(OXCCL, &["topo", "extra"]);
    assert!(err.starts_with("error: unexpected argument 'extra' found"), "{err}");
    let err = rejected(OXCCL, &["topo", "--channels"]);
    assert!(err.contains("'--channels <N>'"), "{err}");
    let err = rejected(OXCCL, &["sim", "--ranks", "96"]);
    assert!(err.contains("--cluster <FILE|local>"), "{err}");
    let err = rejected(OXCCL, &["sim", "--cluster", &summit(), "--algo", "rign"]);
    assert!(err.contains("invalid value 'rign' for '--algo <ALGO,...>'"), "{err}");
    let err = rejected(OXCCL, &["sim", "--cluster", &summit(), "--join-us", "10"]);
    assert!(err.contains("--bootstrap"), "{err}");
    let err = rejected(OXCCL, &["frobnicate"]);
    assert!(err.starts_with("error: unrecognized subcommand 'frobnicate'"), "{err}");
    let err = rejected(OXCCL, &[]);
    assert!(err.contains("Usage: oxccl <COMMAND>"), "{err}");

    // oxccl-perf: two lines, the nearest known word when one is near.
    let help = "\n  (--help lists the benchmarks and every option)\n";
    let err = rejected(PERF, &["all_reduce_perf", "--rnaks", "4"]);
    assert_eq!(err, format!("oxccl-perf: unknown option \"--rnaks\"{help}"));
    let err = rejected(PERF, &["all_reduce_perf", "--minbyte", "8"]);
    assert_eq!(err, format!("oxccl-perf: unknown option \"--minbyte\"; did you mean \"--minbytes\"?{help}"));
    let err = rejected(PERF, &["all_reduce_perf", "-q1"]);
    assert_eq!(err, format!("oxccl-perf: unknown option \"-q\"{help}"));
    let err = rejected(PERF, &["allreduce_perf", "-b", "8"]);
    assert_eq!(
        err,
        format!("oxccl-perf: unknown benchmark \"allreduce_perf\"; did you mean \"all_reduce_perf\"?{help}")
    );
    let err = rejected(PERF, &["all_reduce_perf", "-b", "1T"]);
    assert_eq!(
        err,
        "oxccl-perf: invalid size \"1T\" for -b: a number of bytes, optionally with K, M or G (powers of 1024): 8, 64K, 1.5M, 1G\n"
    );
    let err = rejected(PERF, &["--plot"]);
    assert_eq!(
        err,
        "oxccl-perf: --plot needs the SVG file to write: --plot <file.svg> [--title <text>] <json...>\n"
    );
    // oxccl's own value parsers suggest with the same function.
    let err = rejected(OXCCL, &["explain", "allreduse", "--ranks", "4"]);
    assert!(err.contains("the collectives are allreduce, allgather, reducescatter, broadcast and reduce; did you mean \"allreduce\"?"), "{err}");
    let err = rejected(OXCCL, &["sim", "--cluster", &summit(), "-b", "1T"]);
    assert!(
        err.contains(
            "invalid value '1T' for '-b <SIZE>': not a size: a number of bytes, optionally with K, M or G"
        ),
        "{err}"
    );
    let err = rejected(GPUCHECK, &["--bogus"]);
    assert!(err.starts_with("oxccl-gpucheck: unexpected arguments [\"--bogus\"]\nusage:"), "{err}");
}

/// A root outside the job is refused once, before any rank starts or any header is printed:
/// under the `-np` launcher (which checks it before it starts the ranks), in one process, and
/// under another launcher (rank 0 alone says it, before the rendezvous).
#[test]
fn a_bad_root_is_refused_once_before_any_rank_starts() {
    let refused = |args: &[&str]| -> String {
        let (rc, out, err) = run(PERF, args);
        assert_eq!((rc, out.as_str()), (2, ""), "{args:?}: {err}");
        err
    };
    assert_eq!(
        refused(&["broadcast_perf", "-np", "2", "-r", "5", "-b", "8", "-e", "8"]),
        "oxccl-perf: invalid root 5 for -r: broadcast_perf with -np 2 has ranks 0 to 1: give one of them, or -r all\n"
    );
    assert_eq!(
        refused(&["-np", "2", "-t", "2", "reduce_perf", "-r", "4"]),
        "oxccl-perf: invalid root 4 for -r: reduce_perf with -np 2 × -t 2 has ranks 0 to 3: give one of them, or -r all\n"
    );
    assert_eq!(
        refused(&["broadcast_perf", "-r", "1"]),
        "oxccl-perf: invalid root 1 for -r: broadcast_perf in one process (no -np, no launcher) has only rank 0: give -r 0, or -r all\n"
    );
    // Under torchrun's variables, with no store listening (the check comes before the
    // rendezvous): rank 0 says it, rank 1 ends with the same code and says nothing.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let ranks: Vec<_> = ["0", "1"]
        .map(|r| {
            let _spawning = spawn_lock();
            command(PERF, &["gather_perf", "-r", "2", "-b", "8", "-e", "8"])
                .envs([
                    ("RANK", r),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", &port),
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert_eq!(ranks[0].status.code(), Some(2));
    assert_eq!(
        (text(&ranks[0].stdout), text(&ranks[0].stderr)),
        (String::new(), "oxccl-perf: invalid root 2 for -r: gather_perf under torchrun with 2 processes has ranks 0 to 1: give one of them, or -r all\n".to_string())
    );
    assert_eq!(ranks[1].status.code(), Some(2));
    assert_eq!((text(&ranks[1].stdout), text(&ranks[1].stderr)), (String::new(), String::new()));
    // A root inside the job runs, the benchmark named after the options.
    let (rc, out, err) =
        run(PERF, &["-np", "2", "-t", "2", "broadcast_perf", "-r", "3", "-b", "8", "-e", "8", "-n", "1"]);
    assert_eq!(rc, 0, "{out}\n{err}");
    assert!(
        out.contains("# Collective test starting: broadcast_perf")
            && out.contains("# Out of bounds values : 0 OK"),
        "{out}"
    );
    assert!(out.lines().any(|l| l.split_whitespace().nth(4) == Some("3")), "no line with root 3:\n{out}");
}

/// Runs `exe args` with stdout a pipe, reads `lines` lines, closes the pipe and waits:
/// the exit status, the lines read and stderr.
fn closed_after(exe: &str, args: &[&str], lines: usize) -> (ExitStatus, Vec<String>, String) {
    let spawning = spawn_lock();
    let mut child =
        command(exe, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start the tool");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let read: Vec<String> = (0..lines)
        .map(|_| {
            let mut l = String::new();
            out.read_line(&mut l).unwrap();
            l
        })
        .collect();
    drop(out);
    drop(spawning);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (child.wait().unwrap(), read, err)
}

/// Runs `exe args` with stdout a pipe that has no reader from the start (the stdin of a child
/// that has ended): its first write meets the closed pipe, however fast it prints.
fn no_reader(exe: &str, args: &[&str]) -> (ExitStatus, String) {
    let spawning = spawn_lock();
    let mut ended =
        Command::new(OXCCL).arg("--version").stdin(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let pipe = ended.stdin.take().unwrap();
    ended.wait().unwrap();
    let child = command(exe, args).stdout(pipe).stderr(Stdio::piped()).spawn().expect("start the tool");
    drop(spawning);
    let o = child.wait_with_output().unwrap();
    (o.status, String::from_utf8_lossy(&o.stderr).into())
}

/// `| head -1`: the tools that print as they go (oxccl-perf's sizes, oxccl sim's) lose their
/// reader after one line (they end by SIGPIPE, or with 0 where they had printed everything
/// before the reader went); those that print everything at once (topo, explain) would fill
/// the pipe before a reader of one line closes it, so they get a pipe without a reader.
#[test]
fn a_closed_stdout_ends_each_tool_quietly() {
    let quiet = |status: ExitStatus, err: &str, what: &str| {
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert_ne!(status.code(), Some(101), "{what}: {err}");
        assert!(status.signal() == Some(libc::SIGPIPE) || status.success(), "{what}: {status:?} {err}");
    };
    let perf = ["all_reduce_perf", "-b", "8", "-e", "64M", "-f", "2", "-n", "2", "-w", "0"];
    let (status, read, err) = closed_after(PERF, &perf, 1);
    assert!(read[0].starts_with("# oxccl-perf version"), "{read:?}");
    quiet(status, &err, "oxccl-perf");
    let (status, read, err) = closed_after(OXCCL, &["sim", "--cluster", &summit(), "--ranks", "96"], 1);
    assert!(read[0].starts_with("# oxccl sim: Summit-like"), "{read:?}");
    quiet(status, &err, "oxccl sim");
    for args in [&["topo"][..], &["explain", "allreduce", "--ranks", "4"]] {
        let (status, err) = no_reader(OXCCL, args);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(status.signal(), Some(libc::SIGPIPE), "{args:?}: {status:?} {err}");
    }
    let (status, err) = no_reader(PERF, &perf);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "oxccl-perf: {status:?} {err}");
}
