//! Ranks as real processes: a test re-executes its own binary once per rank.
//!
//! The parent calls [`Launch::run`]; each child is the same test binary, filtered to the same
//! test, with `OXCCL_TESTKIT_SCENARIO` set, so the test function finds itself a child with
//! [`child`] and runs one rank's part instead of launching. Ranks learn their place through
//! oxccl's own launcher variables (`OXCCL_RANK`, `OXCCL_WORLD_SIZE`, `OXCCL_LOCAL_RANK`) and
//! the rendezvous through `OXCCL_UNIQUE_ID` or `OXCCL_UNIQUE_ID_FILE`, exactly as a user's
//! program would under `oxrun`.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const ENV_SCENARIO: &str = "OXCCL_TESTKIT_SCENARIO";
const ENV_ARGS: &str = "OXCCL_TESTKIT_ARGS";
const ENV_RANK: &str = "OXCCL_TESTKIT_RANK";
const ENV_SIZE: &str = "OXCCL_TESTKIT_SIZE";

/// A child's view of its launch.
#[derive(Clone, Debug)]
pub struct ChildCtx {
    pub rank: usize,
    pub size: usize,
    /// What the parent passed in [`Launch::args`].
    pub args: String,
}

/// If this process is a rank launched for `scenario`, its context.
pub fn child(scenario: &str) -> Option<ChildCtx> {
    if std::env::var(ENV_SCENARIO).ok()? != scenario {
        return None;
    }
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    Some(ChildCtx {
        rank: num(ENV_RANK)?,
        size: num(ENV_SIZE)?,
        args: std::env::var(ENV_ARGS).unwrap_or_default(),
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

fn scratch_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "oxccl-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::create_dir_all(&d);
    d
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

    /// A scratch directory for this launch (unique id files and logs).
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
        let exe = std::env::current_exe().map_err(|e| fail(format!("current_exe: {e}")))?;
        let dir = scratch_dir();
        let started = Instant::now();
        let mut children: Vec<(Child, PathBuf, PathBuf, Option<Instant>)> = Vec::new();
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
                .env("RUST_BACKTRACE", "1")
                .stdin(Stdio::null())
                .stdout(File::create(&out).map_err(|e| fail(e.to_string()))?)
                .stderr(File::create(&err).map_err(|e| fail(e.to_string()))?);
            // Flight-recorder dumps of ranks that fail on purpose go with the launch's scratch
            // directory, not into the temporary directory for good (a test may still choose).
            cmd.env("OXCCL_FLIGHT_DIR", &dir);
            if self.oxccl_env {
                cmd.env("OXCCL_RANK", r.to_string())
                    .env("OXCCL_WORLD_SIZE", self.size.to_string())
                    .env("OXCCL_LOCAL_RANK", r.to_string());
            }
            for (k, v) in self.env.iter().chain(self.rank_env.get(r).into_iter().flatten()) {
                cmd.env(k, v);
            }
            let child = cmd.spawn().map_err(|e| fail(format!("spawn rank {r}: {e}")))?;
            children.push((child, out, err, None));
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
            .map(|(r, (_, out, err, _))| Finished {
                rank: r,
                status: statuses[r],
                stdout: std::fs::read_to_string(&out).unwrap_or_default(),
                stderr: std::fs::read_to_string(&err).unwrap_or_default(),
                elapsed: ended_at[r],
                killed_at_ms: killed_at.filter(|_| self.kill.is_some_and(|(k, _)| k == r)),
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        let bad: Vec<&Finished> = results.iter().filter(|f| !f.status.is_some_and(|s| s.success())).collect();
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
            for f in &bad {
                msg.push_str(&format!(
                    "--- rank {} ({}):\n{}\n{}\n",
                    f.rank,
                    f.status.map(|s| s.to_string()).unwrap_or_else(|| "killed".into()),
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
