//! Ranks as real processes: a test re-executes its own binary once per rank.
//!
//! The parent calls [`Launch::run`]; each child is the same test binary, filtered to the same
//! test, with `OXCCL_TESTKIT_SCENARIO` set, so the test function finds itself a child with
//! [`child`] and runs one rank's part instead of launching. Ranks learn their place through
//! oxccl's own launcher variables (`OXCCL_RANK`, `OXCCL_WORLD_SIZE`, `OXCCL_LOCAL_RANK`) and
//! the rendezvous through `OXCCL_UNIQUE_ID` or `OXCCL_UNIQUE_ID_FILE`, exactly as a user's
//! program would under `oxrun`.
//!
//! Rules (a child that ran nothing must not pass):
//! 1. A child proves it ran its scenario: [`child`] records the claim in the file the parent
//!    names (`OXCCL_TESTKIT_CLAIM`, in the launch's scratch directory), and dropping the
//!    returned [`ChildCtx`] records that the scenario finished. Hold the context for the
//!    whole of the rank's part (`if let Some(_ctx) = child(..)`, or pass it on), never
//!    `child(..).is_some()`, which finishes at once.
//! 2. [`Launch::run`] fails, naming the rank, the child's arguments (the test filter) and the
//!    scenario, when a rank exits 0 without having claimed its scenario (a filter that
//!    matches no test, a misspelt scenario) or having claimed but not finished it (it exited
//!    inside the scenario).
//! 3. A process launched for a scenario it did not claim may not launch ranks itself (its
//!    test took the parent's path: the scenario is misspelt); [`Launch::run`] refuses, so a
//!    mistake costs one failed launch, not a tree of them.
//! 4. Every launch's scratch directory (rank output, claims, flight dumps) is removed when
//!    the launch ends, whatever its outcome.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const ENV_SCENARIO: &str = "OXCCL_TESTKIT_SCENARIO";
const ENV_ARGS: &str = "OXCCL_TESTKIT_ARGS";
const ENV_RANK: &str = "OXCCL_TESTKIT_RANK";
const ENV_SIZE: &str = "OXCCL_TESTKIT_SIZE";
const ENV_CLAIM: &str = "OXCCL_TESTKIT_CLAIM";

/// What a claim file holds once its rank claimed its scenario, and once it finished it.
const CLAIMED: &str = "claimed";
const FINISHED: &str = "finished";

/// Whether this process claimed the scenario it was launched for.
static CLAIMED_HERE: AtomicBool = AtomicBool::new(false);

/// A child's view of its launch. Dropping it (not while panicking) records that the
/// scenario finished; see the module's rules.
#[derive(Debug)]
pub struct ChildCtx {
    pub rank: usize,
    pub size: usize,
    /// What the parent passed in [`Launch::args`].
    pub args: String,
    claim: Option<PathBuf>,
}

/// Appends `line` to the claim file; a failure is only reported (the parent, finding no
/// record, fails the launch and says which record is missing).
fn append(path: &Path, line: &str) {
    use std::io::Write as _;
    let f = std::fs::OpenOptions::new().create(true).append(true).open(path);
    if let Err(e) = f.and_then(|mut f| writeln!(f, "{line}")) {
        crate::report!("cannot record {line:?} in {}: {e}", path.display());
    }
}

impl Drop for ChildCtx {
    fn drop(&mut self) {
        if let Some(p) = self.claim.as_ref().filter(|_| !std::thread::panicking()) {
            append(p, FINISHED);
        }
    }
}

/// If this process is a rank launched for `scenario`, its context (and the claim is
/// recorded for the parent).
pub fn child(scenario: &str) -> Option<ChildCtx> {
    if std::env::var(ENV_SCENARIO).ok()? != scenario {
        return None;
    }
    let num = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("launched for scenario {scenario:?} without a valid {k}"))
    };
    let claim = std::env::var_os(ENV_CLAIM).map(PathBuf::from);
    if let Some(p) = &claim {
        append(p, CLAIMED);
    }
    CLAIMED_HERE.store(true, Ordering::Relaxed);
    Some(ChildCtx {
        rank: num(ENV_RANK),
        size: num(ENV_SIZE),
        args: std::env::var(ENV_ARGS).unwrap_or_default(),
        claim,
    })
}

/// How to start a set of ranks.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Arguments each child gets (for a test: the libtest filter that selects it).
    pub child_args: Vec<String>,
    pub scenario: String,
    pub size: usize,
    pub args: String,
    /// Environment for every rank.
    pub env: Vec<(String, String)>,
    /// Extra environment per rank (indexed by rank; may be shorter).
    pub rank_env: Vec<Vec<(String, String)>>,
    /// A command prefix per rank (for example `ip netns exec ns0`); may be shorter.
    pub wrap: Vec<Vec<String>>,
    pub timeout: Duration,
    /// Whether ranks get oxccl's own launcher variables (`OXCCL_RANK`, ...). Off for tests
    /// that play another launcher through [`Launch::rank_env`].
    pub oxccl_env: bool,
    /// SIGKILL this rank this long after the launch starts (fault injection).
    pub kill: Option<(usize, Duration)>,
}

/// One rank's end.
#[derive(Debug)]
pub struct Finished {
    pub rank: usize,
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// When this rank was sent SIGKILL, in milliseconds since the Unix epoch ([`Launch::kill`]).
    pub killed_at_ms: Option<u128>,
}

/// Milliseconds since the Unix epoch (what ranks and the launcher stamp events with).
pub fn epoch_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

impl Finished {
    /// The last `n` lines of stderr.
    pub fn stderr_tail(&self, n: usize) -> String {
        let lines: Vec<&str> = self.stderr.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// A fresh directory in the temporary directory (under the run root in a test binary, see
/// [`crate::scope`]).
fn scratch_dir() -> PathBuf {
    crate::scope::fresh_dir("oxccl-test")
}

/// What rank `r`'s claim file says is wrong with a rank that exited, if anything.
fn claim_problem(l: &Launch, r: usize, claim: &Path, status: &str) -> Option<String> {
    let text = std::fs::read_to_string(claim).unwrap_or_default();
    let (claimed, finished) = (text.lines().any(|l| l == CLAIMED), text.lines().any(|l| l == FINISHED));
    let (scenario, args) = (&l.scenario, l.child_args.join(" "));
    if !claimed {
        Some(format!(
            "rank {r} ({status}) never claimed scenario {scenario:?}: run with arguments [{args}], no \
             test called child({scenario:?}) (the filter matches no test, or the scenario is misspelt)"
        ))
    } else if !finished {
        Some(format!(
            "rank {r} ({status}) claimed scenario {scenario:?} (arguments [{args}]) but never finished \
             it: the process ended inside the scenario, before its ChildCtx was dropped"
        ))
    } else {
        None
    }
}

impl Launch {
    /// A launch of `size` ranks of `scenario` from test `test`.
    pub fn new(test: &str, scenario: &str, size: usize) -> Launch {
        let filter = [test, "--exact", "--nocapture", "--test-threads", "1"];
        Launch::program(scenario, size, &filter)
    }

    /// A launch of `size` copies of this program, each given `args`.
    pub fn program(scenario: &str, size: usize, args: &[&str]) -> Launch {
        Launch {
            child_args: args.iter().map(|a| a.to_string()).collect(),
            scenario: scenario.to_string(),
            size,
            args: String::new(),
            env: Vec::new(),
            rank_env: Vec::new(),
            wrap: Vec::new(),
            timeout: Duration::from_secs(300),
            oxccl_env: true,
            kill: None,
        }
    }

    /// Sends rank `rank` SIGKILL `after` the launch starts.
    pub fn kill_after(mut self, rank: usize, after: Duration) -> Self {
        self.kill = Some((rank, after));
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    pub fn args(mut self, a: &str) -> Self {
        self.args = a.to_string();
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// A scratch directory for a test (unique id files and logs). In a test binary it is in
    /// the run root, removed at exit ([`crate::scope`]); elsewhere the caller removes it.
    pub fn scratch() -> PathBuf {
        scratch_dir()
    }

    /// Starts every rank, waits for all of them (killing all at the timeout), and returns
    /// their ends; `Err` describes any rank that failed or did not finish.
    pub fn run(&self) -> Result<Vec<Finished>, String> {
        self.run_keep().map_err(|(_, e)| e)
    }

    /// [`run`](Self::run), keeping every rank's output on failure too.
    pub fn run_keep(&self) -> Result<Vec<Finished>, (Vec<Finished>, String)> {
        let fail = |e: String| (Vec::new(), e);
        if let Ok(mine) = std::env::var(ENV_SCENARIO) {
            if !CLAIMED_HERE.load(Ordering::Relaxed) {
                return Err(fail(format!(
                    "this process is a rank launched for scenario {mine:?}, which its test never \
                     claimed (no child({mine:?}) call ran before this launch of {:?}): the scenario \
                     is misspelt, or the test does not call child() first",
                    self.scenario
                )));
            }
        }
        let exe = std::env::current_exe().map_err(|e| fail(format!("current_exe: {e}")))?;
        // Removed when the launch ends, on every path.
        let scratch = crate::scope::Scratch::new("oxccl-test");
        let dir = scratch.path();
        let started = Instant::now();
        let mut children: Vec<(Child, PathBuf, PathBuf)> = Vec::new();
        for r in 0..self.size {
            let out = dir.join(format!("rank{r}.out"));
            let err = dir.join(format!("rank{r}.err"));
            let wrap = self.wrap.get(r).cloned().unwrap_or_default();
            let mut cmd = if wrap.is_empty() {
                Command::new(&exe)
            } else {
                let mut c = Command::new(&wrap[0]);
                c.args(&wrap[1..]).arg(&exe);
                c
            };
            cmd.args(&self.child_args)
                .env(ENV_SCENARIO, &self.scenario)
                .env(ENV_ARGS, &self.args)
                .env(ENV_RANK, r.to_string())
                .env(ENV_SIZE, self.size.to_string())
                .env(ENV_CLAIM, dir.join(format!("rank{r}.claim")))
                .env("RUST_BACKTRACE", "1")
                .stdin(Stdio::null())
                .stdout(File::create(&out).map_err(|e| fail(e.to_string()))?)
                .stderr(File::create(&err).map_err(|e| fail(e.to_string()))?);
            // Flight-recorder dumps of ranks that fail on purpose go with the launch's scratch
            // directory, not into the temporary directory for good (a test may still choose).
            cmd.env("OXCCL_FLIGHT_DIR", dir);
            if self.oxccl_env {
                cmd.env("OXCCL_RANK", r.to_string())
                    .env("OXCCL_WORLD_SIZE", self.size.to_string())
                    .env("OXCCL_LOCAL_RANK", r.to_string());
            }
            for (k, v) in self.env.iter().chain(self.rank_env.get(r).into_iter().flatten()) {
                cmd.env(k, v);
            }
            match cmd.spawn() {
                Ok(child) => children.push((child, out, err)),
                Err(e) => {
                    for (c, ..) in children.iter_mut() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    return Err(fail(format!("spawn rank {r}: {e}")));
                }
            }
        }
        let mut statuses: Vec<Option<ExitStatus>> = vec![None; self.size];
        let mut ended_at: Vec<Duration> = vec![Duration::ZERO; self.size];
        let mut timed_out = false;
        let mut killed_at: Option<u128> = None;
        loop {
            if let (Some((r, after)), None) = (self.kill, killed_at) {
                if started.elapsed() >= after {
                    if let Some((c, ..)) = children.get_mut(r) {
                        let _ = c.kill();
                    }
                    killed_at = Some(epoch_ms());
                }
            }
            for (r, (c, ..)) in children.iter_mut().enumerate() {
                if statuses[r].is_none() {
                    if let Ok(Some(s)) = c.try_wait() {
                        statuses[r] = Some(s);
                        ended_at[r] = started.elapsed();
                    }
                }
            }
            if statuses.iter().all(|s| s.is_some()) {
                break;
            }
            if started.elapsed() > self.timeout {
                timed_out = true;
                for (c, ..) in children.iter_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                break;
            }
            let tick = match (self.kill, killed_at) {
                (Some((_, after)), None) => {
                    after.saturating_sub(started.elapsed()).min(Duration::from_millis(10))
                }
                _ => Duration::from_millis(10),
            };
            std::thread::sleep(tick);
        }
        let results: Vec<Finished> = children
            .into_iter()
            .enumerate()
            .map(|(r, (_, out, err))| Finished {
                rank: r,
                status: statuses[r],
                stdout: std::fs::read_to_string(&out).unwrap_or_default(),
                stderr: std::fs::read_to_string(&err).unwrap_or_default(),
                elapsed: ended_at[r],
                killed_at_ms: killed_at.filter(|_| self.kill.is_some_and(|(k, _)| k == r)),
            })
            .collect();
        // Each rank that failed, with what its claim says; a rank that exited 0 fails too if
        // it did not claim and finish its scenario (rule 2).
        let mut bad: Vec<(&Finished, String, Option<String>)> = Vec::new();
        for f in &results {
            let status = f.status.map(|s| s.to_string()).unwrap_or_else(|| "killed".into());
            let claim = claim_problem(self, f.rank, &dir.join(format!("rank{}.claim", f.rank)), &status);
            if f.status.is_some_and(|s| s.success()) {
                if claim.is_some() {
                    bad.push((f, status, claim));
                }
            } else {
                // A rank that failed did not finish, of course; whether it claimed still tells.
                bad.push((f, status, claim.filter(|c| c.contains("never claimed"))));
            }
        }
        drop(scratch);
        if timed_out || !bad.is_empty() {
            let mut msg = if timed_out {
                format!(
                    "{} of {} ranks still running after {:?}; killed.\n",
                    bad.len(),
                    self.size,
                    self.timeout
                )
            } else {
                format!("{} of {} ranks failed.\n", bad.len(), self.size)
            };
            for (f, status, claim) in &bad {
                if let Some(c) = claim {
                    msg.push_str(&format!("{c}\n"));
                }
                msg.push_str(&format!(
                    "--- rank {} ({status}):\n{}\n{}\n",
                    f.rank,
                    f.stdout
                        .lines()
                        .filter(|l| l.contains("FAIL") || l.contains("panicked"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    f.stderr_tail(30)
                ));
            }
            return Err((results, msg));
        }
        Ok(results)
    }
}
