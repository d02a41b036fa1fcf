//! oxccl under the launchers people use, run as a user runs them: torchrun (standalone and
//! static, through its agent's TCPStore), a real c10d TCPStore read back from Python, Open
//! MPI's mpirun (PMIx), the `-np` launcher naming a killed rank, and the failures that must
//! be quick and clear (a rank and size with no rendezvous, an endpoint that is not an oxccl
//! root, a store that answers garbage, a wait at init that says what it waits for).
//!
//! PyTorch comes from `OXCCL_PYTHON` (a python with torch; CI makes a virtualenv), else
//! `python3`; Open MPI's `mpirun` from the path. Without them the tests skip, which
//! `OXCCL_REQUIRE_ALL=1` (CI) turns into failures.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

const PERF: &str = env!("CARGO_BIN_EXE_oxccl-perf");

/// Variables a launcher may have left in this process's environment: children start clean.
const LAUNCHER_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "OXCCL_RANK",
    "OXCCL_WORLD_SIZE",
    "OXCCL_LOCAL_RANK",
    "OXCCL_UNIQUE_ID",
    "OXCCL_UNIQUE_ID_FILE",
    "OXCCL_ROOT_ADDR",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_NAMESPACE",
    "PMIX_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "PMI_RANK",
    "PMI_SIZE",
];

fn command(program: &str) -> Command {
    let mut c = Command::new(program);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

/// Runs `c` to its end, killing it after `limit`; (exit code or -signal, stdout, stderr).
fn run(mut c: Command, limit: Duration) -> (i32, String, String) {
    use std::os::unix::process::ExitStatusExt;
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let started = Instant::now();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let code = status.code().unwrap_or_else(|| -status.signal().unwrap_or(0));
    (code, o.join().unwrap(), e.join().unwrap())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A python that imports torch, or why there is none.
fn torch_python() -> Result<PathBuf, String> {
    let py = std::env::var_os("OXCCL_PYTHON").map(PathBuf::from).unwrap_or_else(|| "python3".into());
    match Command::new(&py).args(["-c", "import torch"]).stderr(Stdio::piped()).output() {
        Ok(o) if o.status.success() => Ok(py),
        Ok(o) => Err(format!(
            "{} cannot import torch ({}); set OXCCL_PYTHON to a python with torch",
            py.display(),
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
        )),
        Err(e) => Err(format!("{}: {e}", py.display())),
    }
}

fn mpirun() -> Result<(), String> {
    match Command::new("mpirun").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("mpirun --version failed: {}", String::from_utf8_lossy(&o.stderr))),
        Err(e) => Err(format!("no mpirun on the path ({e}); install openmpi-bin")),
    }
}

fn torchrun(py: &std::path::Path) -> Command {
    let mut c = command(py.to_str().unwrap());
    c.args(["-m", "torch.distributed.run"]);
    c
}

/// Every rank's report line of a run (`#  Rank  r ...`), and the verdict.
fn assert_ok(out: &str, err: &str, ranks: usize, what: &str) {
    assert!(out.contains("# Out of bounds values : 0 OK"), "{what}: no \"0 OK\"\n{out}\n{err}");
    assert_eq!(out.matches("# Out of bounds values").count(), 1, "{what}: not one job\n{out}");
    for r in 0..ranks {
        assert!(out.contains(&format!("#  Rank {r:>2} ")), "{what}: rank {r} missing\n{out}\n{err}");
    }
    assert!(!out.contains(&format!("#  Rank {ranks:>2} ")), "{what}: more than {ranks} ranks\n{out}");
}

#[test]
fn torchrun_standalone_and_static_run_oxccl_perf_through_the_agent_store() {
    let py = match torch_python() {
        Ok(p) => p,
        Err(why) => return oxccl_testkit::skip("torchrun", "PyTorch (torchrun)", &why),
    };
    let mut c = torchrun(&py);
    c.args(["--standalone", "--nproc-per-node", "2", "--no-python", PERF]).args([
        "all_reduce_perf",
        "-b",
        "8",
        "-e",
        "1M",
        "-f",
        "32",
    ]);
    let (rc, out, err) = run(c, Duration::from_secs(180));
    assert_eq!(rc, 0, "torchrun --standalone:\n{out}\n{err}");
    assert_ok(&out, &err, 2, "torchrun --standalone");
    let port = free_port().to_string();
    let mut c = torchrun(&py);
    c.args(["--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", &port])
        .args(["--nproc-per-node", "3", "--no-python", PERF])
        .args(["all_gather_perf", "-b", "8", "-e", "64K", "-f", "16"]);
    let (rc, out, err) = run(c, Duration::from_secs(180));
    assert_eq!(rc, 0, "torchrun --master-port {port}:\n{out}\n{err}");
    assert_ok(&out, &err, 3, "torchrun static");
}

/// The child half of [`from_env_under_torchrun`]: two communicators from the environment,
/// each checked with an exact all-reduce.
fn from_env_rank() {
    for k in 0..2 {
        let c = oxccl::Communicator::from_env().expect("from_env");
        let (r, n) = (c.rank().idx() as i64, c.size() as i64);
        let x = vec![r + 1 + k; 1000];
        let mut y = vec![0i64; 1000];
        c.all_reduce(&x, &mut y, oxccl::ReduceOp::Sum).expect("all_reduce");
        let want = n * (n + 1) / 2 + k * n;
        assert!(y.iter().all(|&v| v == want), "rank {r}: {} != {want}", y[0]);
        println!("FROM_ENV communicator {k}: rank {r} of {n}: sum {want} exact");
    }
}

#[test]
fn from_env_under_torchrun() {
    if std::env::var_os("OXCCL_LAUNCHERS_CHILD").is_some() {
        return from_env_rank();
    }
    let py = match torch_python() {
        Ok(p) => p,
        Err(why) => return oxccl_testkit::skip("from_env_under_torchrun", "PyTorch (torchrun)", &why),
    };
    let me = std::env::current_exe().unwrap();
    let mut c = torchrun(&py);
    c.args(["--standalone", "--nproc-per-node", "3", "--no-python"])
        .arg(&me)
        .args(["from_env_under_torchrun", "--exact", "--nocapture", "--test-threads", "1"])
        .env("OXCCL_LAUNCHERS_CHILD", "1");
    let (rc, out, err) = run(c, Duration::from_secs(180));
    assert_eq!(rc, 0, "{out}\n{err}");
    for k in 0..2 {
        for r in 0..3 {
            let want = format!("FROM_ENV communicator {k}: rank {r} of 3: sum {} exact", 6 + 3 * k);
            assert!(out.contains(&want), "{want:?} missing:\n{out}\n{err}");
        }
    }
}

/// A real c10d TCPStore (PyTorch's, served from Python) as torchrun's agent serves it: two
/// oxccl-perf ranks meet through it, and Python reads the id rank 0 published where a torch
/// worker's `PrefixStore` looks. Then oxccl's client speaks every verb to the same server.
#[test]
fn a_real_tcpstore_carries_the_id_where_torch_reads_it() {
    let py = match torch_python() {
        Ok(p) => p,
        Err(why) => return oxccl_testkit::skip("a_real_tcpstore", "PyTorch (TCPStore)", &why),
    };
    let port = free_port();
    let script = format!(
        r#"
import datetime, sys, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", {port}, 1, True, timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
print("READY", flush=True)
w = dist.PrefixStore("/worker/attempt_3", s)
print("ID", w.get("oxccl/unique_id/0").decode(), flush=True)
w.set("from_python", "hello")
w.wait(["done"])
print("COUNT", w.get("counter").decode(), "DONE", w.get("done").decode(), flush=True)
"#
    );
    let mut server = command(py.to_str().unwrap())
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = server.stdout.take().unwrap();
    let mut first = [0u8; 6];
    out.read_exact(&mut first).expect("the store started");
    assert_eq!(&first, b"READY\n");
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let mut c = command(PERF);
            c.args(["all_reduce_perf", "-b", "8", "-e", "64K", "-f", "64"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("TORCHELASTIC_USE_AGENT_STORE", "True")
                .env("TORCHELASTIC_RESTART_COUNT", "3");
            std::thread::spawn(move || run(c, Duration::from_secs(120)))
        })
        .collect();
    let ends: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    for (r, (rc, o, e)) in ends.iter().enumerate() {
        assert_eq!(*rc, 0, "rank {r}:\n{o}\n{e}");
    }
    assert_ok(&ends[0].1, &ends[0].2, 2, "agent store");
    // oxccl's client against the same server: every verb.
    use oxccl::wait::Waiter;
    let w = Waiter::new(oxccl::Rank(0), Some(Duration::from_secs(30)), Default::default());
    let mut st =
        oxccl::rendezvous::tcpstore::Store::connect("127.0.0.1", port, "/worker/attempt_3", &w).unwrap();
    st.wait("from_python", &w, "the key Python sets").unwrap();
    assert_eq!(st.get("from_python", &w).unwrap(), b"hello");
    assert!(st.check("from_python", &w).unwrap());
    assert!(!st.check("never_set", &w).unwrap());
    assert_eq!(st.add("counter", 5, &w).unwrap(), 5);
    assert_eq!(st.add("counter", 37, &w).unwrap(), 42);
    st.set("done", b"from oxccl", &w).unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = server.wait().unwrap();
    let mut err = String::new();
    server.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{rest}\n{err}");
    let id = rest.lines().find_map(|l| l.strip_prefix("ID ")).expect("Python read the id");
    assert!(id.starts_with("oxccl1@") && id.parse::<oxccl::UniqueId>().is_ok(), "{id:?}");
    assert!(rest.contains("COUNT 42 DONE from oxccl"), "{rest}");
}

/// A listener that answers every connection with `reply` (nothing if empty) and holds it, or
/// (`hang_up`) closes it at once.
fn impostor_that(reply: &'static [u8], hang_up: bool) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            let mut s = s;
            if !reply.is_empty() {
                let _ = s.write_all(reply);
            }
            if !hang_up {
                held.push(s);
            }
        }
    });
    port
}

fn impostor(reply: &'static [u8]) -> u16 {
    impostor_that(reply, false)
}

/// One rank of two, launched as torchrun would launch it, with `extra` environment.
fn lone_rank(rank: usize, port: u16, extra: &[(&str, &str)]) -> (i32, String, String, Duration) {
    let mut c = command(PERF);
    c.args(["all_reduce_perf", "-b", "8", "-e", "8"])
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    for (k, v) in extra {
        c.env(k, v);
    }
    let t = Instant::now();
    let (rc, o, e) = run(c, Duration::from_secs(60));
    (rc, o, e, t.elapsed())
}

#[test]
fn a_store_or_root_that_is_something_else_fails_fast_naming_it() {
    let agent = [("TORCHELASTIC_USE_AGENT_STORE", "True")];
    // A store that answers garbage, then one that says nothing.
    let port = impostor(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    let (rc, _, err, took) = lone_rank(1, port, &agent);
    assert_ne!(rc, 0);
    assert!(err.contains(&format!("127.0.0.1:{port}")) && err.contains("not a c10d TCPStore"), "{err}");
    assert!(err.contains("48 54 54 50"), "the bytes it saw: {err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let port = impostor(b"");
    let (rc, _, err, took) = lone_rank(0, port, &agent);
    assert_ne!(rc, 0);
    assert!(err.contains(&format!("127.0.0.1:{port}")) && err.contains("ping"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // A root address (no agent store) where something else answers, says nothing, or hangs
    // up at once (twice: not a root whose process just ended, whose port would then refuse).
    for (reply, hang_up) in [(&b"SSH-2.0-OpenSSH_9.2\r\n"[..], false), (&b""[..], false), (&b""[..], true)] {
        let port = impostor_that(reply, hang_up);
        let (rc, _, err, took) = lone_rank(1, port, &[]);
        assert_ne!(rc, 0);
        assert!(
            err.contains(&format!("the rendezvous endpoint 127.0.0.1:{port} is not an oxccl root")),
            "{err}"
        );
        assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
    }
}

#[test]
fn a_rank_and_size_without_a_rendezvous_fail_saying_what_to_set() {
    for env in [
        &[("RANK", "1"), ("WORLD_SIZE", "2")][..],
        &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "4")],
    ] {
        let mut c = command(PERF);
        c.args(["all_reduce_perf", "-b", "8", "-e", "8"]);
        for (k, v) in env {
            c.env(k, v);
        }
        let (rc, out, err) = run(c, Duration::from_secs(30));
        assert_eq!(rc, 2, "{out}\n{err}");
        assert!(!out.contains("Out of bounds"), "it ran as a world of one:\n{out}");
        let (r, n) = (env[0].1, env[1].1);
        assert!(err.contains(&format!("rank {r} of {n}")) && err.contains("MASTER_ADDR"), "{err}");
    }
}

/// `-np` under another launcher would start a job per process: refused, saying why.
#[test]
fn np_under_another_launcher_is_refused() {
    let mut c = command(PERF);
    c.args(["all_reduce_perf", "-np", "2", "-b", "8", "-e", "8"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", free_port().to_string());
    let (rc, out, err) = run(c, Duration::from_secs(30));
    assert_eq!(rc, 2, "{out}\n{err}");
    assert!(err.contains("torchrun started this process as rank 0 of 2: leave -np out"), "{err}");
    assert!(out.is_empty(), "{out}");
}

#[test]
fn mpirun_runs_one_job_through_pmix() {
    if let Err(why) = mpirun() {
        return oxccl_testkit::skip("mpirun_runs_one_job_through_pmix", "Open MPI (mpirun)", &why);
    }
    let mut c = command("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-np", "4", PERF])
        .args(["all_reduce_perf", "-b", "8", "-e", "1M", "-f", "32"])
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "BOOTSTRAP");
    let (rc, out, err) = run(c, Duration::from_secs(180));
    assert_eq!(rc, 0, "{out}\n{err}");
    assert_ok(&out, &err, 4, "mpirun -np 4");
    assert!(err.contains("rendezvous: the launcher's PMIx server"), "which rendezvous:\n{err}");
}

/// The pids of `launcher`'s children, by their `OXCCL_RANK`.
fn ranks_of(launcher: u32, n: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut found = vec![0u32; n];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            let ppid = stat.rsplit(')').next().and_then(|s| s.split_whitespace().nth(1));
            if ppid != Some(&launcher.to_string()) {
                continue;
            }
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            for kv in env.split(|&b| b == 0) {
                if let Some(r) = kv.strip_prefix(b"OXCCL_RANK=") {
                    if let Ok(r) = String::from_utf8_lossy(r).parse::<usize>() {
                        if r < n {
                            found[r] = pid;
                        }
                    }
                }
            }
        }
        if found.iter().all(|&p| p != 0) || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The command the launcher printed to read the dumps, run as printed by a shell: it exits 0
/// and prints the verdict on the job's dumps.
fn run_the_analyze_hint(err: &str, victim: usize, pid: u32) -> String {
    let hint = "wrote flight recorder dumps; read them with: ";
    let line = err.lines().find(|l| l.contains(hint)).unwrap_or_else(|| panic!("no {hint:?} in:\n{err}"));
    let cmd = line.split_once(hint).unwrap().1;
    let out = Command::new("sh").args(["-c", cmd]).stdin(Stdio::null()).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "`{cmd}` failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains(" of 4 ranks, 3 dump(s)\n"), "the output of `{cmd}`:\n{stdout}");
    let gone = format!("rank {victim} (host ");
    let gone_pid = format!(", pid {pid}): no dump (did its process die?)");
    assert!(
        stdout.lines().any(|l| l.starts_with(&gone) && l.ends_with(&gone_pid)),
        "no {gone:?}...{gone_pid:?} in the output of `{cmd}`:\n{stdout}"
    );
    cmd.to_string()
}

#[test]
fn the_launcher_names_a_killed_rank_and_fails() {
    for victim in [0usize, 2] {
        // Dumps where a shell must quote the path; removed when this round ends.
        let dumps = oxccl_testkit::scope::Scratch::new("flight dumps 'here'");
        let mut c = command(PERF);
        c.args(["all_reduce_perf", "-np", "4", "-b", "1M", "-e", "1M", "-n", "1000000"])
            .env("OXCCL_FLIGHT_DIR", dumps.path());
        let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let pids = ranks_of(child.id(), 4);
        assert!(pids.iter().all(|&p| p != 0), "ranks not found: {pids:?}");
        // Let them get into the sweep, then kill one.
        let mut out = child.stdout.take().unwrap();
        let mut seen = Vec::new();
        let mut b = [0u8; 1];
        while !String::from_utf8_lossy(&seen).contains("(elements)") && out.read(&mut b).unwrap_or(0) == 1 {
            seen.push(b[0]);
        }
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on a pid this test found among its own launcher's children.
        assert_eq!(unsafe { libc::kill(pids[victim] as i32, libc::SIGKILL) }, 0);
        let t = Instant::now();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "exit status {status:?}");
        assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
        let want = format!("rank {victim} (pid {}) was killed by signal 9 (SIGKILL)", pids[victim]);
        assert!(err.contains(&want), "{want:?} missing from:\n{err}");
        // The survivors' own errors reach stderr, naming the dead rank.
        let named = err.lines().filter(|l| l.contains(&format!("peer rank {victim} "))).count();
        assert!(named >= 1, "no survivor named rank {victim}:\n{err}");
        assert!(!rest.contains("0 OK"), "a failed run reported 0 OK:\n{rest}");
        // Rank 0 prints the report: alive, it says the run stopped early.
        assert!(victim == 0 || rest.contains("found before the run stopped early: FAILED"), "{rest}");
        // The survivors' flight recorder dumps, and a command that reads them as printed: the
        // `oxccl` binary beside oxccl-perf (cargo built it for these tests).
        let cmd = run_the_analyze_hint(&err, victim, pids[victim]);
        let tool = std::path::Path::new(PERF).with_file_name("oxccl");
        let quoted = format!("'{}'", dumps.display().to_string().replace('\'', "'\\''"));
        assert!(cmd.starts_with(&format!("{} analyze {quoted}/oxccl-flight-", tool.display())), "{cmd}");
        assert!(cmd.ends_with("-r*.json"), "{cmd}");
        assert_eq!(std::fs::read_dir(&dumps).unwrap().count(), 3, "one dump per survivor");
    }
}

/// `oxccl-perf -np 3 ... | head -1`: the launcher ends quietly by SIGPIPE, as `cat` would,
/// with nothing on stderr and no flight recorder dumps left by the ranks it stopped.
#[test]
fn a_closed_stdout_ends_the_launcher_quietly() {
    let dumps = std::env::temp_dir().join(format!("pipe-dumps-{}", std::process::id()));
    std::fs::create_dir_all(&dumps).unwrap();
    let mut c = command(PERF);
    c.args(["all_reduce_perf", "-np", "3", "-b", "8", "-e", "128M", "-f", "2"])
        .env("OXCCL_FLIGHT_DIR", &dumps)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        first.push(b[0]);
    }
    drop(out);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(String::from_utf8_lossy(&first).starts_with("# oxccl-perf"), "{first:?}");
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?}: {err}");
    assert!(err.is_empty(), "stderr: {err}");
    let left: Vec<_> = std::fs::read_dir(&dumps).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "dumps left: {left:?}");
    let _ = std::fs::remove_dir_all(&dumps);
}

#[test]
fn np_out_of_bounds_is_refused_naming_the_limit() {
    let (rc, out, err) = run(
        {
            let mut c = command(PERF);
            c.args(["all_reduce_perf", "-np", "0"]);
            c
        },
        Duration::from_secs(30),
    );
    assert_eq!(rc, 2, "{out}\n{err}");
    assert!(err.contains("-np 0") && out.is_empty(), "{err}");
    let (rc, out, err) = run(
        {
            let mut c = command(PERF);
            c.args(["all_reduce_perf", "-np", "99999"]);
            c
        },
        Duration::from_secs(30),
    );
    assert_eq!(rc, 2, "{out}\n{err}");
    assert!(err.contains("-np 99999") && err.contains("allows at most"), "{err}");
}

#[test]
fn a_rank_waiting_at_init_says_what_it_waits_for() {
    // Nobody listens at the root's address: the rank says so every second, then times out.
    let port = free_port();
    let (rc, _, err, _) = lone_rank(1, port, &[("OXCCL_WAIT_NOTICE", "1"), ("OXCCL_TIMEOUT", "3.5")]);
    assert_ne!(rc, 0);
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("still waiting after")).collect();
    assert!(notes.len() >= 2, "{err}");
    assert!(notes.iter().all(|l| l.contains(&format!("the rendezvous root at 127.0.0.1:{port}"))), "{err}");
    // Rank 0 alone of two: its root waits for rank 1, and says so by number.
    let port = free_port();
    let (rc, _, err, _) = lone_rank(0, port, &[("OXCCL_WAIT_NOTICE", "1"), ("OXCCL_TIMEOUT", "3.5")]);
    assert_ne!(rc, 0);
    assert!(err.lines().any(|l| l.contains("still waiting after") && l.contains("rank(s) 1")), "{err}");
    assert!(err.contains("timed out after") && !err.contains("[]"), "{err}");
}
