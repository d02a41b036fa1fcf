//! The only reader of the process environment: settings and launcher variables.

use crate::error::Result;
use oxccl_core::config::Config;
use oxccl_core::launch::{self, LaunchEnv};

fn get(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// The configuration the environment describes (NCCL_* and OXCCL_* variables).
pub fn config() -> Result<Config> {
    Ok(Config::from_lookup(get)?)
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
