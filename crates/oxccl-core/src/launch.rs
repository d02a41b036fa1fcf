//! What launchers tell each process: its rank, the world size, and where to meet.
//!
//! Recognised, in this order: oxccl's own (`OXCCL_RANK`, `OXCCL_WORLD_SIZE`,
//! `OXCCL_LOCAL_RANK`), torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`), Slurm (`SLURM_PROCID`,
//! `SLURM_NTASKS`, `SLURM_LOCALID`), Open MPI (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//! `OMPI_COMM_WORLD_LOCAL_RANK`) and PMI launchers such as MPICH's and Intel MPI's
//! (`PMI_RANK`, `PMI_SIZE`).
//!
//! The rendezvous, in this order:
//! 1. `OXCCL_UNIQUE_ID`: the unique id's text, given to every rank;
//! 2. `OXCCL_UNIQUE_ID_FILE`: rank 0 creates an id and writes it there; the others wait for it;
//! 3. `OXCCL_ROOT_ADDR=host:port`, else `MASTER_ADDR` and `MASTER_PORT`: rank 0 listens there;
//! 4. under Slurm, the first host of `SLURM_JOB_NODELIST`, on port 20000 + job id mod 10000.
//!
//! With an address (3, 4) there is no id to carry a random secret, so the secret is derived
//! from `OXCCL_SECRET` if set, else from the job's identity (address, world size and the
//! launcher's job id): it keeps strangers' stray connections out, not a determined attacker on
//! the same network. Use 1 or 2 where that matters.

use crate::error::CoreError;
use crate::uniqueid::{derive_secret, UniqueId};
use std::path::PathBuf;

/// Where ranks meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    Id(UniqueId),
    File(PathBuf),
    Addr { host: String, port: u16, secret: [u8; 32] },
}

/// One process's place in the job, as its launcher describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub launcher: &'static str,
    pub rank: usize,
    pub size: usize,
    pub local_rank: Option<usize>,
    pub rendezvous: Rendezvous,
}

fn num(
    get: &impl Fn(&str) -> Option<String>,
    launcher: &'static str,
    var: &str,
) -> Result<Option<usize>, CoreError> {
    match get(var) {
        None => Ok(None),
        Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| CoreError::Launcher {
            launcher,
            reason: format!("{var}={v:?} is not a non-negative integer"),
        }),
    }
}

/// The first host name of a Slurm node list (`node[01-04,07],gpu3` → `node01`).
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    let mut depth = 0;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let first = &list[..end];
    if first.is_empty() {
        return None;
    }
    match first.find('[') {
        None => Some(first.to_string()),
        Some(b) => {
            let prefix = &first[..b];
            let inner = first[b + 1..].trim_end_matches(']');
            let elem = inner.split(',').next()?;
            let start = elem.split('-').next()?;
            Some(format!("{prefix}{start}"))
        }
    }
}

fn job_identity(get: &impl Fn(&str) -> Option<String>) -> String {
    [
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "OMPI_MCA_orte_ess_jobid",
        "OMPI_MCA_ess_base_jobid",
        "PMIX_NAMESPACE",
        "PMI_ID",
    ]
    .iter()
    .filter_map(|k| get(k).map(|v| format!("{k}={v}")))
    .collect::<Vec<_>>()
    .join(";")
}

fn rendezvous(
    get: &impl Fn(&str) -> Option<String>,
    launcher: &'static str,
    size: usize,
) -> Result<Rendezvous, CoreError> {
    if let Some(t) = get("OXCCL_UNIQUE_ID") {
        return Ok(Rendezvous::Id(t.parse()?));
    }
    if let Some(p) = get("OXCCL_UNIQUE_ID_FILE") {
        return Ok(Rendezvous::File(PathBuf::from(p)));
    }
    let addr = if let Some(a) = get("OXCCL_ROOT_ADDR") {
        let (h, p) = a.rsplit_once(':').ok_or_else(|| CoreError::Launcher {
            launcher,
            reason: format!("OXCCL_ROOT_ADDR={a:?} is not host:port"),
        })?;
        Some((h.trim_matches(['[', ']']).to_string(), p.to_string(), "OXCCL_ROOT_ADDR"))
    } else if let (Some(h), Some(p)) = (get("MASTER_ADDR"), get("MASTER_PORT")) {
        Some((h, p, "MASTER_PORT"))
    } else if let (Some(list), Some(job)) =
        (get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_STEP_NODELIST")), get("SLURM_JOB_ID"))
    {
        let host = first_slurm_host(&list).ok_or_else(|| CoreError::Launcher {
            launcher,
            reason: format!("SLURM_JOB_NODELIST={list:?} names no host"),
        })?;
        let id: u64 = job.trim().parse().unwrap_or(0);
        Some((host, (20000 + id % 10000).to_string(), "SLURM_JOB_ID"))
    } else {
        None
    };
    let Some((host, port, var)) = addr else {
        return Err(CoreError::Launcher {
            launcher,
            reason: "no rendezvous: set OXCCL_UNIQUE_ID, OXCCL_UNIQUE_ID_FILE, OXCCL_ROOT_ADDR \
                     (host:port), or MASTER_ADDR and MASTER_PORT"
                .to_string(),
        });
    };
    let port: u16 = port.trim().parse().map_err(|_| CoreError::Launcher {
        launcher,
        reason: format!("{var}: port {port:?} is not a number in 0..65536"),
    })?;
    let seed = match get("OXCCL_SECRET") {
        Some(s) => format!("secret:{s}"),
        None => format!("job:{}", job_identity(get)),
    };
    let secret =
        derive_secret(seed.as_bytes(), &format!("oxccl-env-rendezvous {host}:{port}"), &[size as u64]);
    Ok(Rendezvous::Addr { host, port, secret })
}

/// Reads the launcher's environment with `get`.
pub fn detect(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv, CoreError> {
    const LAUNCHERS: [(&str, &str, &str, &str); 5] = [
        ("oxccl", "OXCCL_RANK", "OXCCL_WORLD_SIZE", "OXCCL_LOCAL_RANK"),
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ];
    for (launcher, rank_var, size_var, local_var) in LAUNCHERS {
        let (Some(rank), size) = (num(&get, launcher, rank_var)?, num(&get, launcher, size_var)?) else {
            continue;
        };
        let size = size.ok_or_else(|| CoreError::Launcher {
            launcher,
            reason: format!("{rank_var} is set but {size_var} is not"),
        })?;
        if rank >= size {
            return Err(CoreError::Launcher {
                launcher,
                reason: format!("{rank_var}={rank} is not below {size_var}={size}"),
            });
        }
        let local_rank = num(&get, launcher, local_var)?;
        let rendezvous = rendezvous(&get, launcher, size)?;
        return Ok(LaunchEnv { launcher, rank, size, local_rank, rendezvous });
    }
    Err(CoreError::Launcher {
        launcher: "none",
        reason: "no launcher environment found (OXCCL_RANK, RANK/WORLD_SIZE, SLURM_PROCID, \
                 OMPI_COMM_WORLD_RANK or PMI_RANK)"
            .to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn torchrun() {
        let e = detect(env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "abc"),
        ]))
        .unwrap();
        assert_eq!((e.launcher, e.rank, e.size, e.local_rank), ("torchrun", 3, 8, Some(1)));
        let Rendezvous::Addr { host, port, secret } = e.rendezvous else { panic!() };
        assert_eq!((host.as_str(), port), ("node7", 29500));
        // Another job on the same address gets another secret.
        let e2 = detect(env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "other"),
        ]))
        .unwrap();
        let Rendezvous::Addr { secret: s2, .. } = e2.rendezvous else { panic!() };
        assert_ne!(secret, s2);
    }

    #[test]
    fn slurm_and_openmpi() {
        let e = detect(env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[012-015,020],cpu1"),
            ("SLURM_JOB_ID", "123456"),
        ]))
        .unwrap();
        assert_eq!((e.launcher, e.rank, e.size), ("slurm", 5, 16));
        let Rendezvous::Addr { host, port, .. } = e.rendezvous else { panic!() };
        assert_eq!((host.as_str(), port), ("gpu012", 23456));
        let e = detect(env(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OXCCL_UNIQUE_ID_FILE", "/tmp/id"),
        ]))
        .unwrap();
        assert_eq!(e.launcher, "openmpi");
        assert_eq!(e.rendezvous, Rendezvous::File("/tmp/id".into()));
    }

    #[test]
    fn errors_name_the_variable() {
        let e = detect(env(&[("RANK", "9"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.to_string().contains("RANK=9"), "{e}");
        let e = detect(env(&[("RANK", "1"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.to_string().contains("MASTER_ADDR"), "{e}");
        let e = detect(env(&[])).unwrap_err();
        assert!(e.to_string().contains("no launcher"), "{e}");
        assert_eq!(first_slurm_host("a1,a2").as_deref(), Some("a1"));
        assert_eq!(first_slurm_host("n[7]").as_deref(), Some("n7"));
    }
}
