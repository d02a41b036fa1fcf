//! `oxccl-cluster`: runs a job across an emulated cluster ([`oxccl_testkit::cluster`]) and
//! removes the cluster after it, whatever happened.
//!
//!   oxccl-cluster --hosts H --per-host K [--rails R] [--rate 1gbit|none] [--peer P] -- CMD ARGS...
//!   oxccl-cluster --hosts H --per-host K ... --jobs FILE
//!
//! Peers (`--peer`, or the first word of each line of a jobs file):
//! - `ranks`: one process of CMD per (host, slot), inside its host, with the rank's
//!   environment ([`Cluster::rank_env`]: torchrun's variables, `OXCCL_HOST_ID`,
//!   `NCCL_SOCKET_IFNAME`, the shaped rate as `OXCCL_NET_GBIT`): oxccl-perf, or any program launched as torchrun launches.
//! - `mpi`: one `mpirun` on host 0 whose launch agent enters each host (a hostfile of the hosts'
//!   names with `slots=K`), Open MPI's TCP byte-transfer layer and out-of-band channel on the
//!   rails.
//! - `gloo`: one `torchrun` per host (static rendezvous at host 0's rail-0 address),
//!   `GLOO_SOCKET_IFNAME` the rails.
//!
//! Rules:
//! 1. The primary process's output (rank 0, mpirun, host 0's torchrun) is this program's;
//!    the others' goes to files in the log directory, whose last lines are printed for every
//!    process that failed.
//! 2. The exit status is the worst of the job's processes (128 + signal for a signal); the
//!    jobs of a file run one after another in the same cluster, and the status is the worst
//!    over them. A run stopped by a signal exits 128 + that signal, one past its time limit 124.
//! 3. When a process fails, the others get `--grace` seconds to end, then they are killed.
//!    SIGINT, SIGTERM and SIGHUP kill every process of the job (their process groups), and the
//!    cluster is removed before this program exits; so is it after any failure. This program
//!    reaps its descendants' orphans (a child subreaper), so none is left behind as a zombie.
//! 4. Namespaces left by a dead `oxccl-cluster` (or test) are swept before the cluster is made.

use clap::Parser;
use oxccl_testkit::cluster::{sweep_stale, Cluster, Spec, MASTER_PORT};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

#[cfg(test)]
oxccl_testkit::test_scope!();

#[derive(Parser, Debug)]
#[command(
    name = "oxccl-cluster",
    about = "Runs a job across an emulated, shaped cluster of network namespaces"
)]
struct Args {
    /// Hosts (network namespaces).
    #[arg(long)]
    hosts: usize,
    /// Rank processes per host.
    #[arg(long)]
    per_host: usize,
    /// Links per host ("rails"), each on its own bridge: 1 or 2.
    #[arg(long, default_value_t = 1)]
    rails: usize,
    /// Each link's rate per direction, in tc's syntax (1gbit, 100mbit), or "none".
    #[arg(long, default_value = "1gbit")]
    rate: String,
    /// How CMD is launched: ranks, mpi or gloo.
    #[arg(long, default_value = "ranks")]
    peer: String,
    /// Run the jobs of this file (one a line: `ranks|mpi|gloo CMD ARGS...`, split at
    /// whitespace; `#` starts a comment) one after another in the same cluster.
    #[arg(long)]
    jobs: Option<PathBuf>,
    /// Where the other processes' output goes (default: a new directory in TMPDIR, removed
    /// when every job succeeded).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Seconds the other processes get after one failed, before they are killed.
    #[arg(long, default_value_t = 10)]
    grace: u64,
    /// Seconds a job may run before every process is killed (exit status 124); 0: no limit.
    #[arg(long, default_value_t = 0)]
    timeout: u64,
    /// The mpirun to use.
    #[arg(long, default_value = "mpirun")]
    mpirun: String,
    /// Open MPI's byte-transfer layers.
    #[arg(long, default_value = "self,tcp")]
    mpi_btl: String,
    /// The torchrun to use.
    #[arg(long, default_value = "torchrun")]
    torchrun: String,
    /// The command (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<String>,
}

/// The signal that asked this program to stop (0: none yet).
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// Makes this program the reaper of its descendants' orphans (mpirun's daemons and ranks, a
/// torchrun's workers), so that none is left a zombie for init to collect after the run.
fn become_subreaper() {
    // SAFETY: prctl(2) with an integer argument; no memory is passed.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// Collects every descendant that has ended (the orphans of rule 3).
fn reap_orphans() {
    let mut st = 0;
    // SAFETY: waitpid(2) on any child, without blocking, into a local status word.
    while unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) } > 0 {}
}

fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs a handler that only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// One process of a job.
struct Proc {
    label: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    primary: bool,
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Open MPI's launch agent: `agent HOST CMD...` runs CMD (a shell command line) on HOST.
fn write_agent(c: &Cluster) -> Result<PathBuf, String> {
    let mut s = String::from("#!/bin/sh\n# oxccl-cluster's launch agent for mpirun: runs \"$*\" on emulated host $1.\nh=$1\nshift\ncase \"$h\" in\n");
    for h in 0..c.spec().hosts {
        let argv: Vec<String> = c.exec_in(h).iter().map(|a| quote(a)).collect();
        s += &format!("  {}) exec {} sh -c \"$*\" ;;\n", c.ns(h), argv.join(" "));
    }
    s += "  *) echo \"oxccl-cluster agent: no host $h\" >&2; exit 1 ;;\nesac\n";
    let p = c.scratch().join("agent.sh");
    std::fs::write(&p, s).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    Ok(p)
}

fn procs(c: &Cluster, a: &Args, peer: &str, cmd: &[String], port: u16) -> Result<Vec<Proc>, String> {
    let s = c.spec();
    let n = s.hosts * s.per_host;
    let with = |mut pre: Vec<String>, tail: &[String]| {
        pre.extend(tail.iter().cloned());
        pre
    };
    let port_env = ("MASTER_PORT".to_string(), port.to_string());
    match peer {
        "ranks" => Ok((0..n)
            .map(|r| {
                let mut env = c.rank_env(r);
                env.retain(|(k, _)| k != "MASTER_PORT");
                env.push(port_env.clone());
                Proc {
                    label: format!("rank{r}"),
                    argv: with(c.exec_in(r / s.per_host), cmd),
                    env,
                    primary: r == 0,
                }
            })
            .collect()),
        "mpi" => {
            let hostfile = c.scratch().join("hostfile");
            let hosts: String = (0..s.hosts).map(|h| format!("{} slots={}\n", c.ns(h), s.per_host)).collect();
            std::fs::write(&hostfile, hosts).map_err(|e| format!("cannot write the hostfile: {e}"))?;
            let agent = write_agent(c)?;
            let mpi: Vec<String> = [
                a.mpirun.as_str(),
                "--allow-run-as-root",
                "-np",
                &n.to_string(),
                "--hostfile",
                &hostfile.display().to_string(),
                "--mca",
                "plm_rsh_agent",
                &agent.display().to_string(),
                "--mca",
                "plm_rsh_no_tree_spawn",
                "1",
                "--mca",
                "pml",
                "ob1",
                "--mca",
                "btl",
                &a.mpi_btl,
                "--mca",
                "btl_tcp_if_include",
                &c.ifnames(),
                "--mca",
                "oob_tcp_if_include",
                &c.ifnames(),
            ]
            .iter()
            .map(|x| x.to_string())
            .collect();
            Ok(vec![Proc {
                label: "mpirun".into(),
                argv: with(with(c.exec_in(0), &mpi), cmd),
                env: vec![],
                primary: true,
            }])
        }
        "gloo" => Ok((0..s.hosts)
            .map(|h| {
                let run: Vec<String> = [
                    a.torchrun.clone(),
                    "--nnodes".into(),
                    s.hosts.to_string(),
                    "--nproc-per-node".into(),
                    s.per_host.to_string(),
                    "--node-rank".into(),
                    h.to_string(),
                    "--master-addr".into(),
                    c.addr(0, 0),
                    "--master-port".into(),
                    port.to_string(),
                ]
                .into();
                let env = vec![
                    ("GLOO_SOCKET_IFNAME".to_string(), c.ifnames()),
                    ("OXCCL_HOST_ID".to_string(), c.ns(h).to_string()),
                    ("NCCL_SOCKET_IFNAME".to_string(), c.ifnames()),
                ];
                Proc {
                    label: format!("torchrun{h}"),
                    argv: with(with(c.exec_in(h), &run), cmd),
                    env,
                    primary: h == 0,
                }
            })
            .collect()),
        other => Err(format!("peer {other:?}: ranks, mpi or gloo")),
    }
}

fn status_code(st: std::process::ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

fn kill_group(child: &Child, sig: i32) {
    // SAFETY: signals the process group this program made for the child (its pid).
    unsafe { libc::kill(-(child.id() as i32), sig) };
}

fn tail(path: &Path, lines: usize) -> String {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = t.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Runs one job's processes to their end (rule 3); the worst exit status.
fn run_job(ps: Vec<Proc>, logs: &Path, grace: Duration, timeout: Option<Duration>) -> Result<i32, String> {
    let mut kids: Vec<(Proc, Child, Option<i32>)> = Vec::new();
    for p in ps {
        let mut cmd = Command::new(&p.argv[0]);
        cmd.args(&p.argv[1..]).envs(p.env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).process_group(0);
        if !p.primary {
            let f = |ext: &str| std::fs::File::create(logs.join(format!("{}.{ext}", p.label)));
            cmd.stdout(f("out").map_err(|e| e.to_string())?).stderr(f("err").map_err(|e| e.to_string())?);
        }
        match cmd.spawn() {
            Ok(ch) => kids.push((p, ch, None)),
            Err(e) => {
                for (_, ch, _) in &kids {
                    kill_group(ch, libc::SIGKILL);
                }
                for (_, ch, _) in &mut kids {
                    let _ = ch.wait();
                }
                return Err(format!("cannot start {}: {e}", p.argv[0]));
            }
        }
    }
    let started = Instant::now();
    let mut failed_at: Option<Instant> = None;
    let mut killed = false;
    let mut forced: Option<i32> = None;
    while kids.iter().any(|k| k.2.is_none()) {
        for (p, ch, st) in kids.iter_mut().filter(|k| k.2.is_none()) {
            if let Ok(Some(s)) = ch.try_wait() {
                let code = status_code(s);
                *st = Some(code);
                if code != 0 && failed_at.is_none() && !killed {
                    eprintln!("oxccl-cluster: {} ended with status {code}", p.label);
                    failed_at = Some(Instant::now());
                }
            }
        }
        let sig = STOP.load(Ordering::SeqCst);
        let over = timeout.is_some_and(|t| started.elapsed() > t);
        let late = failed_at.is_some_and(|t| t.elapsed() > grace);
        if !killed && (sig != 0 || over || late) {
            let why = if sig != 0 {
                forced = Some(128 + sig);
                format!("signal {sig}")
            } else if over {
                forced = Some(124);
                "the job's time limit".to_string()
            } else {
                "a failed process".to_string()
            };
            eprintln!("oxccl-cluster: stopping the job ({why})");
            for (_, ch, st) in &kids {
                if st.is_none() {
                    kill_group(ch, libc::SIGTERM);
                }
            }
            killed = true;
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(2)
                && kids.iter_mut().any(|k| k.2.is_none() && matches!(k.1.try_wait(), Ok(None)))
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            for (_, ch, st) in &mut kids {
                if st.is_none() {
                    kill_group(ch, libc::SIGKILL);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (p, _, st) in &kids {
        if st.unwrap_or(0) != 0 && !p.primary {
            let err = logs.join(format!("{}.err", p.label));
            eprintln!(
                "--- {} (status {}), last lines of {}:\n{}",
                p.label,
                st.unwrap_or(0),
                err.display(),
                tail(&err, 15)
            );
        }
    }
    // A job stopped by a signal or its time limit says so, whatever its processes died of.
    Ok(forced.unwrap_or_else(|| kids.iter().map(|k| k.2.unwrap_or(0)).max().unwrap_or(0)))
}

/// The jobs to run: `(peer, argv)`.
fn jobs(a: &Args) -> Result<Vec<(String, Vec<String>)>, String> {
    match &a.jobs {
        Some(f) => {
            if !a.cmd.is_empty() {
                return Err("give either --jobs or a command after --, not both".into());
            }
            let t = std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            let mut out = Vec::new();
            for (i, line) in t.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("");
                let mut w = line.split_whitespace().map(str::to_string);
                let Some(peer) = w.next() else { continue };
                let cmd: Vec<String> = w.collect();
                if cmd.is_empty() {
                    return Err(format!("{}:{}: a peer and no command", f.display(), i + 1));
                }
                out.push((peer, cmd));
            }
            Ok(out)
        }
        None if a.cmd.is_empty() => Err("no command: give one after --, or --jobs FILE".into()),
        None => Ok(vec![(a.peer.clone(), a.cmd.clone())]),
    }
}

fn main() {
    std::process::exit(real_main());
}

fn real_main() -> i32 {
    let a = Args::parse();
    catch_signals();
    become_subreaper();
    let jobs = match jobs(&a) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("oxccl-cluster: {e}");
            return 2;
        }
    };
    if let Some((p, _)) = jobs.iter().find(|(p, _)| !["ranks", "mpi", "gloo"].contains(&p.as_str())) {
        eprintln!("oxccl-cluster: peer {p:?}: ranks, mpi or gloo");
        return 2;
    }
    for ns in sweep_stale() {
        eprintln!("oxccl-cluster: removed stale namespace {ns}");
    }
    let rate = (a.rate != "none").then(|| a.rate.clone());
    let spec = Spec { hosts: a.hosts, per_host: a.per_host, rails: a.rails, rate };
    let cluster = match Cluster::create(&spec) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oxccl-cluster: cannot make the cluster: {e}");
            return 2;
        }
    };
    let logs = a
        .log_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("oxccl-cluster-{}", std::process::id())));
    if let Err(e) = std::fs::create_dir_all(&logs) {
        eprintln!("oxccl-cluster: cannot create {}: {e}", logs.display());
        return 2;
    }
    eprintln!(
        "oxccl-cluster: {} hosts x {} ranks, {} rail(s) at {}: {}",
        a.hosts,
        a.per_host,
        a.rails,
        a.rate,
        (0..a.hosts)
            .map(|h| format!("{} = {}", cluster.ns(h), cluster.addr(h, 0)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut worst = 0;
    for (i, (peer, cmd)) in jobs.iter().enumerate() {
        if STOP.load(Ordering::SeqCst) != 0 {
            break;
        }
        // A port per job: the previous job's connections may linger on the last one.
        let port = MASTER_PORT + i as u16;
        let code = procs(&cluster, &a, peer, cmd, port).and_then(|ps| {
            if jobs.len() > 1 {
                eprintln!("oxccl-cluster: job {} of {}: {peer} {}", i + 1, jobs.len(), cmd.join(" "));
            }
            run_job(
                ps,
                &logs,
                Duration::from_secs(a.grace),
                (a.timeout > 0).then(|| Duration::from_secs(a.timeout)),
            )
        });
        let code = code.unwrap_or_else(|e| {
            eprintln!("oxccl-cluster: {e}");
            2
        });
        if code != 0 && jobs.len() > 1 {
            eprintln!("oxccl-cluster: job {} ({peer} {}) ended with status {code}", i + 1, cmd.join(" "));
        }
        worst = worst.max(code);
    }
    drop(cluster);
    reap_orphans();
    if worst == 0 && a.log_dir.is_none() {
        let _ = std::fs::remove_dir_all(&logs);
    } else if worst != 0 {
        eprintln!("oxccl-cluster: the other processes' output is in {}", logs.display());
    }
    match STOP.load(Ordering::SeqCst) {
        0 => worst,
        sig => 128 + sig,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        Args::parse_from(["oxccl-cluster", "--hosts", "2", "--per-host", "2"].iter().chain(extra))
    }

    #[test]
    fn a_command_after_the_dashes_is_one_job() {
        let a = args(&["--peer", "mpi", "--", "prog", "-x", "1"]);
        assert_eq!(jobs(&a), Ok(vec![("mpi".to_string(), vec!["prog".into(), "-x".into(), "1".into()])]));
        assert_eq!(jobs(&args(&[])).unwrap_err(), "no command: give one after --, or --jobs FILE");
    }

    #[test]
    fn a_jobs_file_is_read_line_by_line() {
        let dir = std::env::temp_dir().join(format!("oxccl-cluster-jobs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("jobs.txt");
        std::fs::write(&f, "# comment\nranks a b  # trailing\n\n  gloo   c\nmpi\n").unwrap();
        let a = args(&["--jobs", f.to_str().unwrap()]);
        assert_eq!(jobs(&a).unwrap_err(), format!("{}:5: a peer and no command", f.display()));
        std::fs::write(&f, "# comment\nranks a b  # trailing\n\n  gloo   c\n").unwrap();
        assert_eq!(
            jobs(&a),
            Ok(vec![("ranks".into(), vec!["a".into(), "b".into()]), ("gloo".into(), vec!["c".into()])])
        );
        let both = args(&["--jobs", f.to_str().unwrap(), "--", "x"]);
        assert_eq!(jobs(&both).unwrap_err(), "give either --jobs or a command after --, not both");
        let missing = args(&["--jobs", "/nonexistent/jobs"]);
        assert!(jobs(&missing).unwrap_err().starts_with("cannot read /nonexistent/jobs"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn quoting_for_the_agent_script() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("hostname \"$0\""), "'hostname \"$0\"'");
    }
}
