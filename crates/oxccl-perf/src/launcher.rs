//! The local launcher (`-np N`): starts N copies of this program as the ranks of one job on
//! this host, forwards their stderr, and says how each rank that failed ended.
//!
//! Rules:
//! 1. `-np` is checked before anything starts: at least 1, and within what this machine allows
//!    (processes and threads, descriptors, memory), or an error that names the limit.
//! 2. Ranks share the launcher's stdout (rank 0 prints the report); their stderr comes through
//!    the launcher line by line, so every rank's own error reaches the user whichever rank died.
//! 3. A rank that ends by a signal or a non-zero exit is named with its pid and how it ended;
//!    ranks still running [`GRACE`] after the first failure are killed and named. The exit code
//!    is the first failure's (128 + signal for a signal), 0 only if every rank succeeded.
//! 4. A rank killed by SIGPIPE means the reader of stdout went away (`| head`): the other ranks
//!    are stopped, their errors (about the dead rank) and flight recorder dumps are dropped,
//!    and the launcher ends by SIGPIPE itself, quietly, as `cat` does.
//! 5. After a failure, the launcher says where the ranks' flight recorder dumps are and how
//!    to read them: a command that runs as printed, from any directory ([`analyze_command`]).

use crate::args::Opts;
use oxccl::Config;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The variable that marks a process as a rank started by this launcher.
pub const CHILD_ENV: &str = "OXCCL_PERF_CHILD";

/// How long the other ranks get to notice a failed rank (they name it within a second) before
/// they are killed.
const GRACE: Duration = Duration::from_secs(5);

/// How long a rank's stderr is held before it is forwarded: long enough to learn that rank 0
/// died of SIGPIPE (whose consequences, the others' errors, are dropped; rule 4).
const HOLD: Duration = Duration::from_millis(100);

/// Descriptors a rank holds per rank of the job (shared-memory regions, doorbells, sockets:
/// 72 at 8 ranks running alltoall, measured 2026-12-04), and besides.
const FDS_PER_PEER: u64 = 10;
const FDS_BASE: u64 = 64;
/// Threads of one rank process (main, service, worker, root on rank 0, flight), rounded up.
const THREADS_PER_RANK: u64 = 5;
/// The least memory a rank takes (23 MB resident at 8 ranks, 1 MiB all-to-all, measured).
const MIN_RANK_BYTES: u64 = 16 << 20;

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.split_whitespace().next()?.parse().ok()
}

fn mem_available() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = t.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Checks `-np` against this machine's limits; the error names the limit.
pub fn check_np(np: usize) -> Result<(), String> {
    if np == 0 {
        return Err("-np 0: a job needs at least one rank".into());
    }
    let n = np as u64;
    let threads = n * THREADS_PER_RANK;
    if let Some(pid_max) = read_u64("/proc/sys/kernel/pid_max").filter(|&m| threads > m) {
        return Err(format!(
            "-np {np}: each rank is a process of about {THREADS_PER_RANK} threads, and kernel.pid_max ({pid_max}) allows at most {} ranks on this machine",
            pid_max / THREADS_PER_RANK
        ));
    }
    if let Some(max) = read_u64("/proc/sys/kernel/threads-max").filter(|&m| threads > m) {
        return Err(format!(
            "-np {np}: each rank is a process of about {THREADS_PER_RANK} threads, and kernel.threads-max ({max}) allows at most {} ranks on this machine",
            max / THREADS_PER_RANK
        ));
    }
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes a local struct; geteuid has no preconditions.
    let (nproc, root) = unsafe { (libc::getrlimit(libc::RLIMIT_NPROC, &mut l) == 0, libc::geteuid() == 0) };
    if nproc && !root && l.rlim_cur != libc::RLIM_INFINITY && threads > l.rlim_cur {
        return Err(format!(
            "-np {np}: each rank is a process of about {THREADS_PER_RANK} threads, and this user's process limit (ulimit -u: {}) allows at most {} ranks",
            l.rlim_cur,
            l.rlim_cur / THREADS_PER_RANK
        ));
    }
    // Ranks inherit the raised limit.
    let nofile = oxccl::sys::limits::raise_nofile();
    let need = n * FDS_PER_PEER + FDS_BASE;
    if need > nofile {
        return Err(format!(
            "-np {np}: each rank needs about {FDS_PER_PEER} descriptors per rank ({need} in all), and the descriptor limit (ulimit -n, hard: {nofile}) allows at most {} ranks",
            nofile.saturating_sub(FDS_BASE) / FDS_PER_PEER
        ));
    }
    if let Some(avail) = mem_available().filter(|&a| n * MIN_RANK_BYTES > a) {
        return Err(format!(
            "-np {np}: each rank takes at least {} MiB, and this machine has {} MiB available (MemAvailable), enough for at most {} ranks",
            MIN_RANK_BYTES >> 20,
            avail >> 20,
            avail / MIN_RANK_BYTES
        ));
    }
    Ok(())
}

/// A signal's name (`SIGKILL`), or its number.
pub fn signal_name(sig: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match NAMES.get(sig as usize).filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => format!("signal {sig}"),
    }
}

/// How a process ended, for a sentence ("was killed by signal 9 (SIGKILL)").
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s} ({})", signal_name(s)),
        _ => format!("ended ({status})"),
    }
}

/// The exit code that passes `status` on.
fn code_of(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

struct Rank {
    child: Child,
    pid: u32,
    /// Bytes of stderr not yet forwarded.
    pending: Vec<u8>,
    /// When the oldest of them came in.
    since: Option<Instant>,
    open: bool,
    status: Option<ExitStatus>,
}

impl Rank {
    /// Reads what its stderr has (keeping it in `pending`); whether there may be more now.
    fn pump(&mut self) -> bool {
        let Some(err) = self.child.stderr.as_mut() else {
            self.open = false;
            return false;
        };
        let mut buf = [0u8; 8192];
        match err.read(&mut buf) {
            Ok(0) => {
                self.open = false;
                false
            }
            Ok(n) => {
                self.pending.extend_from_slice(&buf[..n]);
                self.since.get_or_insert_with(Instant::now);
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(_) => {
                self.open = false;
                false
            }
        }
    }

    /// Forwards the whole lines held at least [`HOLD`] (every byte once the rank has ended or
    /// `now`), or drops them (`quiet`).
    fn flush(&mut self, quiet: bool, now: bool) {
        let ended = !self.open || self.status.is_some();
        if !(now || ended || self.since.is_some_and(|t| t.elapsed() >= HOLD)) {
            return;
        }
        let upto = if ended {
            Some(self.pending.len())
        } else {
            self.pending.iter().rposition(|&b| b == b'\n').map(|i| i + 1)
        };
        if let Some(n) = upto.filter(|&n| n > 0) {
            let line: Vec<u8> = self.pending.drain(..n).collect();
            if !quiet {
                let mut e = std::io::stderr().lock();
                let _ = e.write_all(&line);
                if line.last() != Some(&b'\n') {
                    let _ = e.write_all(b"\n");
                }
            }
        }
        self.since = (!self.pending.is_empty()).then(Instant::now);
    }
}

fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on a descriptor this process owns (a child's stderr pipe).
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

/// `-np N`: starts N copies of this program as ranks and waits for them; the exit code.
pub fn launch(o: &Opts, args: &[String]) -> i32 {
    let np = o.np.unwrap_or(1);
    if let Err(e) = check_np(np) {
        eprintln!("oxccl-perf: {e}");
        return 2;
    }
    // Refused here, once, before any rank starts (and prints a header).
    let (ranks, job) = crate::args::job(Some(np), None, o.nthreads);
    if let Err(e) = crate::args::check_root(o, ranks, &job) {
        eprintln!("oxccl-perf: {e}");
        return 2;
    }
    let id = match oxccl::new_unique_id(&Config::default()) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("oxccl-perf: cannot create a unique id: {e}");
            return 2;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("oxccl-perf: cannot find this program to start its ranks: {e}");
            return 2;
        }
    };
    // The children get the same flags without -np, and the benchmark's name first (wherever
    // it was given).
    let mut child_args = vec![o.bench.program().to_string()];
    let mut i = 0;
    while i < args.len() {
        if args[i] == "-np" {
            i += 2;
            continue;
        }
        if o.bench_at != Some(i) {
            child_args.push(args[i].clone());
        }
        i += 1;
    }
    let mut ranks: Vec<Rank> = Vec::with_capacity(np);
    for r in 0..np {
        let c = Command::new(&exe)
            .args(&child_args)
            .env(CHILD_ENV, "1")
            .env("OXCCL_RANK", r.to_string())
            .env("OXCCL_WORLD_SIZE", np.to_string())
            .env("OXCCL_LOCAL_RANK", r.to_string())
            .env("OXCCL_UNIQUE_ID", id.to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        match c {
            Ok(child) => {
                if let Some(e) = &child.stderr {
                    set_nonblocking(e.as_raw_fd());
                }
                ranks.push(Rank {
                    pid: child.id(),
                    child,
                    pending: Vec::new(),
                    since: None,
                    open: true,
                    status: None,
                });
            }
            Err(e) => {
                eprintln!("oxccl-perf: cannot start rank {r} of {np}: {e}");
                for k in &mut ranks {
                    let _ = k.child.kill();
                    let _ = k.child.wait();
                }
                return 2;
            }
        }
    }
    let dir = oxccl::env::config().ok().and_then(|c| c.flight_dir).unwrap_or_else(std::env::temp_dir);
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    let dumps =
        Dumps { dir, comm: format!("{:016x}", id.comm_hash().0), exe: exe.parent().map(Path::to_path_buf) };
    supervise(ranks, &dumps)
}

/// Where the job's ranks write their flight recorder dumps.
struct Dumps {
    /// An absolute path.
    dir: PathBuf,
    comm: String,
    /// The directory of this program (where cargo also puts `oxccl`).
    exe: Option<PathBuf>,
}

/// `s` as one word for a POSIX shell: as it is when nothing in it is special, else in single
/// quotes (a `'` in it as `'\''`).
fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The command that reads the dumps `pattern` (a file name glob, left unquoted) in `dir`, as
/// a shell runs it from any directory: the `oxccl` binary beside this program when there is
/// one (`cargo test` and `cargo build` put it there; the README's `cargo run` does not), else
/// cargo on this program's source tree when its manifest is still there, else `oxccl` from
/// the path.
pub fn analyze_command(exe_dir: Option<&Path>, manifest: &Path, dir: &Path, pattern: &str) -> String {
    let dumps = format!("{}/{pattern}", shell_word(&dir.to_string_lossy()));
    if let Some(tool) = exe_dir.map(|d| d.join("oxccl")).filter(|t| t.is_file()) {
        return format!("{} analyze {dumps}", shell_word(&tool.to_string_lossy()));
    }
    if manifest.is_file() {
        // The profile this program was built with.
        let release = if cfg!(debug_assertions) { "" } else { " --release" };
        return format!(
            "cargo run{release} --manifest-path {} --bin oxccl -- analyze {dumps}",
            shell_word(&manifest.to_string_lossy())
        );
    }
    format!("oxccl analyze {dumps}")
}

impl Dumps {
    /// The dumps the job's ranks wrote.
    fn written(&self) -> Vec<PathBuf> {
        let prefix = format!("oxccl-flight-{}-r", self.comm);
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        rd.flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
            .collect()
    }
}

/// Forwards the ranks' stderr until every rank has ended; names the ones that failed.
fn supervise(mut ranks: Vec<Rank>, dumps: &Dumps) -> i32 {
    let mut first: Option<(usize, ExitStatus, Instant)> = None;
    let mut broken_pipe = false;
    loop {
        let mut fds: Vec<libc::pollfd> = ranks
            .iter()
            .filter(|k| k.open)
            .filter_map(|k| k.child.stderr.as_ref())
            .map(|e| libc::pollfd { fd: e.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: `fds` is a live array of pollfd of its length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20) };
        // Who has ended first, then their output: a death by SIGPIPE is known before the
        // errors it causes in the others are forwarded.
        for (r, k) in ranks.iter_mut().enumerate() {
            if k.status.is_some() {
                continue;
            }
            let Ok(Some(s)) = k.child.try_wait() else { continue };
            // What it wrote before it ended comes first (its end of the pipe is closed, unless
            // something it started holds it: then what is there now).
            while k.open && k.pump() {}
            k.status = Some(s);
            if s.signal() == Some(libc::SIGPIPE) {
                broken_pipe = true;
            }
            k.flush(broken_pipe, true);
            if s.success() {
                continue;
            }
            if !broken_pipe {
                eprintln!("oxccl-perf: rank {r} (pid {}) {}", k.pid, describe(s));
            }
            first.get_or_insert((r, s, Instant::now()));
        }
        for k in ranks.iter_mut() {
            if k.open {
                k.pump();
            }
            k.flush(broken_pipe, false);
        }
        if ranks.iter().all(|k| k.status.is_some()) {
            break;
        }
        if broken_pipe || first.is_some_and(|(_, _, at)| at.elapsed() > GRACE) {
            let (fr, fs, _) = first.expect("a failure was recorded");
            for (r, k) in ranks.iter_mut().enumerate().filter(|(_, k)| k.status.is_none()) {
                if !broken_pipe {
                    eprintln!(
                        "oxccl-perf: rank {r} (pid {}) still running {} s after rank {fr} {}; killing it",
                        k.pid,
                        GRACE.as_secs(),
                        describe(fs)
                    );
                }
                let _ = k.child.kill();
                k.status = k.child.wait().ok();
                while k.open && k.pump() {}
                k.flush(broken_pipe, true);
            }
        }
    }
    if broken_pipe {
        // The ranks failed only because rank 0's output closed: nothing to analyze.
        for p in dumps.written() {
            let _ = std::fs::remove_file(p);
        }
        // The reader of stdout is gone: end as a program writing to it would.
        // SAFETY: restoring SIGPIPE's default action and raising it on this process.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
    }
    match first {
        None => 0,
        Some((r, s, _)) => {
            let failed = ranks.iter().filter(|k| k.status.is_some_and(|s| !s.success())).count();
            eprintln!(
                "oxccl-perf: the job failed ({failed} of {} ranks did not succeed); first: rank {r} (pid {}) {}",
                ranks.len(),
                ranks[r].pid,
                describe(s)
            );
            let n = dumps.written().len();
            if n > 0 {
                let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
                let pattern = format!("oxccl-flight-{}-r*.json", dumps.comm);
                eprintln!(
                    "oxccl-perf: {n} rank(s) wrote flight recorder dumps; read them with: {}",
                    analyze_command(dumps.exe.as_deref(), &manifest, &dumps.dir, &pattern)
                );
            }
            code_of(s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn np_limits_are_named() {
        assert!(check_np(0).unwrap_err().contains("-np 0"));
        let e = check_np(99_999_999).unwrap_err();
        assert!(e.contains("-np 99999999") && e.contains("allows at most"), "{e}");
        assert!(check_np(2).is_ok());
    }

    #[test]
    fn words_are_quoted_for_a_shell_only_when_they_must_be() {
        assert_eq!(shell_word("/tmp/oxccl-flight_1.json"), "/tmp/oxccl-flight_1.json");
        assert_eq!(shell_word("/tmp/flight dumps"), "'/tmp/flight dumps'");
        assert_eq!(shell_word("/tmp/it's"), "'/tmp/it'\\''s'");
        assert_eq!(shell_word("/tmp/$HOME*"), "'/tmp/$HOME*'");
        assert_eq!(shell_word(""), "''");
    }

    /// The three commands, each in the one place where it applies.
    #[test]
    fn the_analyze_command_names_what_is_there() {
        // A directory whose name a shell must have quoted.
        let root = oxccl_testkit::scope::Scratch::new("analyze 'command'");
        let (bin, dumps) = (root.join("bin"), root.join("dumps"));
        std::fs::create_dir_all(&bin).unwrap();
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let pat = "oxccl-flight-00ff-r*.json";
        let quoted = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
        let dumps_q = format!("{}/{pat}", quoted(&dumps));
        // Nothing beside this program: cargo, on the source tree.
        let release = if cfg!(debug_assertions) { "" } else { " --release" };
        assert!(!manifest.display().to_string().contains([' ', '\'']), "{}", manifest.display());
        assert_eq!(
            analyze_command(Some(&bin), &manifest, &dumps, pat),
            format!(
                "cargo run{release} --manifest-path {} --bin oxccl -- analyze {dumps_q}",
                manifest.display()
            )
        );
        // No source tree either: from the path.
        let gone = root.join("no-such/Cargo.toml");
        assert_eq!(analyze_command(Some(&bin), &gone, &dumps, pat), format!("oxccl analyze {dumps_q}"));
        assert_eq!(analyze_command(None, &gone, &dumps, pat), format!("oxccl analyze {dumps_q}"));
        // The binary beside this program comes first.
        std::fs::write(bin.join("oxccl"), "").unwrap();
        assert_eq!(
            analyze_command(Some(&bin), &manifest, &dumps, pat),
            format!("{} analyze {dumps_q}", quoted(&bin.join("oxccl")))
        );
    }

    #[test]
    fn signals_and_exits_are_described() {
        assert_eq!(describe(ExitStatus::from_raw(9)), "was killed by signal 9 (SIGKILL)");
        assert_eq!(describe(ExitStatus::from_raw(2 << 8)), "exited with code 2");
        assert_eq!(code_of(ExitStatus::from_raw(9)), 137);
        assert_eq!(signal_name(13), "SIGPIPE");
        assert_eq!(signal_name(40), "signal 40");
    }
}
