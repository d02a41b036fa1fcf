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

/// What the launcher (torchrun, Slurm, Open MPI, PMI, oxccl's own) says about this process.
pub fn launch() -> Result<LaunchEnv> {
    Ok(launch::detect(get)?)
}
