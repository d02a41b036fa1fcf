//! Diagnostics on stderr, in NCCL's line format: `host:pid:tid [rank] OXCCL LEVEL message`.

use crate::sys::host;
use oxccl_core::config::LogLevel;
use std::sync::OnceLock;

/// Where log lines go and which are printed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Logger {
    pub level: LogLevel,
    pub rank: Option<u32>,
}

fn host() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(host::hostname)
}

impl Logger {
    pub fn new(level: LogLevel, rank: Option<u32>) -> Logger {
        Logger { level, rank }
    }

    fn emit(&self, lvl: LogLevel, tag: &str, args: std::fmt::Arguments<'_>) {
        if self.level >= lvl {
            let rank = self.rank.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
            // One write per line, so lines of ranks sharing a terminal never interleave.
            let line = format!(
                "{}:{}:{} [{rank}] OXCCL {tag} {args}\n",
                host(),
                std::process::id(),
                host::thread_id()
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        }
    }

    pub fn warn(&self, args: std::fmt::Arguments<'_>) {
        self.emit(LogLevel::Warn, "WARN", args);
    }

    pub fn info(&self, args: std::fmt::Arguments<'_>) {
        self.emit(LogLevel::Info, "INFO", args);
    }

    pub fn trace(&self, args: std::fmt::Arguments<'_>) {
        self.emit(LogLevel::Trace, "TRACE", args);
    }
}
