//! Diagnostics in NCCL's line format, `host:pid:tid [rank] NCCL LEVEL message`, on stderr or in
//! `NCCL_DEBUG_FILE` (`%h` → host name, `%p` → process id).
//!
//! `NCCL_DEBUG` picks the level (`VERSION`, `WARN`, `INFO`, `TRACE`); `NCCL_DEBUG_SUBSYS` the
//! subsystems INFO and TRACE lines come from (`INIT`, `COLL`, `P2P`, `SHM`, `NET`, `GRAPH`,
//! `TUNING`, `ENV`, `ALLOC`, `CALL`, `BOOTSTRAP`, `ALL`; `^` excludes; default
//! `INIT,BOOTSTRAP,ENV`, as NCCL's). WARN lines always print at WARN or above.

use crate::sys::host;
use oxccl_core::config::{subsys, Config, LogLevel};
use std::io::Write as _;
use std::sync::{Mutex, OnceLock};

/// Where log lines go and which are printed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Logger {
    pub level: LogLevel,
    pub rank: Option<u32>,
    pub subsys: u32,
}

fn host() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(host::hostname)
}

/// The process's log file (`NCCL_DEBUG_FILE`), opened by the first logger that names one.
fn file(name: Option<&str>) -> Option<&'static Mutex<std::fs::File>> {
    static F: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();
    F.get_or_init(|| {
        let n = name?.replace("%h", host()).replace("%p", &std::process::id().to_string());
        std::fs::OpenOptions::new().create(true).append(true).open(n).ok().map(Mutex::new)
    })
    .as_ref()
}

impl Logger {
    pub fn new(config: &Config, rank: Option<u32>) -> Logger {
        let _ = file(config.log_file.as_deref());
        let l = Logger { level: config.log, rank, subsys: config.log_subsys };
        l.version_once();
        l
    }

    /// Whether lines of `sub` at INFO are printed.
    pub fn on(&self, sub: u32) -> bool {
        self.level >= LogLevel::Info && self.subsys & sub != 0
    }

    fn version_once(&self) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        if self.level >= LogLevel::Version {
            ONCE.call_once(|| {
                self.line(
                    "INFO",
                    format_args!(
                        "NCCL version {} (oxccl {})",
                        oxccl_core::NCCL_VERSION_STRING,
                        env!("CARGO_PKG_VERSION")
                    ),
                )
            });
        }
    }

    fn line(&self, tag: &str, args: std::fmt::Arguments<'_>) {
        let rank = self.rank.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
        // One write per line, so lines of ranks sharing a terminal or file never interleave.
        let line =
            format!("{}:{}:{} [{rank}] NCCL {tag} {args}\n", host(), std::process::id(), host::thread_id());
        match file(None) {
            Some(f) => {
                let _ = f.lock().unwrap_or_else(|e| e.into_inner()).write_all(line.as_bytes());
            }
            None => {
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
        }
    }

    pub fn warn(&self, args: std::fmt::Arguments<'_>) {
        if self.level >= LogLevel::Warn {
            self.line("WARN", args);
        }
    }

    /// An INFO line of the INIT subsystem.
    pub fn info(&self, args: std::fmt::Arguments<'_>) {
        self.info_in(subsys::INIT, args);
    }

    /// An INFO line of subsystem `sub`.
    pub fn info_in(&self, sub: u32, args: std::fmt::Arguments<'_>) {
        if self.on(sub) {
            self.line("INFO", args);
        }
    }

    pub fn trace(&self, args: std::fmt::Arguments<'_>) {
        if self.level >= LogLevel::Trace && self.subsys & subsys::CALL != 0 {
            self.line("TRACE", args);
        }
    }
}
