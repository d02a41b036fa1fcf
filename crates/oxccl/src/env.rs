//! The only reader of the process environment: settings, launcher variables, and where
//! oxccl keeps its caches.

use crate::error::Result;
use oxccl_core::config::Config;
use oxccl_core::launch::{self, LaunchEnv};
use std::path::PathBuf;

fn get(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// The configuration the environment describes (NCCL_* and OXCCL_* variables).
pub fn config() -> Result<Config> {
    Ok(Config::from_lookup(get)?)
}

/// The process-wide settings (device buffers, the C ABI's streams), read once per process.
/// An environment with a bad setting gives the defaults here: no call gets that far, since
/// every communicator's init parses the same environment and fails naming the variable.
pub fn device() -> &'static oxccl_core::config::DeviceSettings {
    static D: std::sync::OnceLock<oxccl_core::config::DeviceSettings> = std::sync::OnceLock::new();
    D.get_or_init(|| config().map(|c| c.device).unwrap_or_default())
}

/// What the launcher (torchrun, Slurm, Open MPI, PMI, oxccl's own) says about this process:
/// `None` when no launcher started it. A process with only PMIx's variables (`PMIX_RANK`,
/// `PMIX_NAMESPACE`: PRRTE, say) learns its rank and the job's size from the PMIx server.
pub fn launch() -> Result<Option<LaunchEnv>> {
    if let Some(l) = launch::detect(get)? {
        return Ok(Some(l));
    }
    let (Some(namespace), Some(rank)) = (get("PMIX_NAMESPACE"), get("PMIX_RANK")) else {
        return Ok(None);
    };
    let fail = |why: String| crate::error::Error::Rendezvous {
        rank: oxccl_core::Rank(rank.trim().parse().unwrap_or(0)),
        through: format!("PMIx (namespace {namespace})"),
        why,
    };
    let p = crate::sys::pmix::session().map_err(fail)?;
    let size = p.job_size().map_err(fail)?;
    let l = LaunchEnv {
        launcher: "pmix",
        rank: p.rank() as usize,
        size,
        local_rank: p.local_rank(),
        rendezvous: launch::Rendezvous::Pmix { namespace: namespace.clone() },
    };
    if l.rank >= l.size {
        return Err(fail(format!("PMIx says rank {} of {}", l.rank, l.size)));
    }
    Ok(Some(l))
}

fn non_empty(k: &str) -> Option<PathBuf> {
    std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Where oxccl caches what it measures or builds once per host (calibration, kernels), for
/// the whole process: `OXCCL_CACHE_DIR`, else `$XDG_CACHE_HOME/oxccl`, else
/// `$HOME/.cache/oxccl`; `None` without any of them.
pub fn cache_dir() -> Option<PathBuf> {
    non_empty("OXCCL_CACHE_DIR")
        .or_else(|| non_empty("XDG_CACHE_HOME").map(|x| x.join("oxccl")))
        .or_else(|| non_empty("HOME").map(|h| h.join(".cache").join("oxccl")))
}

/// Where compiled kernels are kept between processes: `OXCCL_KERNEL_CACHE` (a directory;
/// `0` or empty: nowhere), else [`cache_dir`].
pub fn kernel_cache_dir() -> Option<PathBuf> {
    match std::env::var_os("OXCCL_KERNEL_CACHE") {
        Some(v) => (!v.is_empty() && v != "0").then(|| v.into()),
        None => cache_dir(),
    }
}

/// The variables oxccl reads (`NCCL_*` and `OXCCL_*`: `oxccl_core::variables::ALL`, the one
/// table, which `layering.rs` holds to the readers' code), sorted.
pub fn param_keys() -> Vec<String> {
    let mut keys: Vec<String> = oxccl_core::variables::ALL.iter().map(|v| v.name.to_string()).collect();
    keys.sort();
    keys
}

/// The value of setting `key` (one of [`param_keys`]) in this process's environment.
pub fn param(key: &str) -> Option<String> {
    get(key)
}
