//! What launchers tell each process: its rank, the world size, and where to meet.
//!
//! Recognised, in this order: oxccl's own (`OXCCL_RANK`, `OXCCL_WORLD_SIZE`,
//! `OXCCL_LOCAL_RANK`), torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`), Slurm (`SLURM_PROCID`,
//! `SLURM_NTASKS`, `SLURM_LOCALID`), Open MPI (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//! `OMPI_COMM_WORLD_LOCAL_RANK`) and PMI launchers such as MPICH's and Intel MPI's
//! (`PMI_RANK`, `PMI_SIZE`). A process with none of these is not launched ([`detect`] answers
//! `None`); one with a rank and a size but no way to meet the others is an error that says
//! what to set, never a world of one.
//!
//! The rendezvous, in this order:
//! 1. `OXCCL_UNIQUE_ID`: the unique id's text, given to every rank;
//! 2. `OXCCL_UNIQUE_ID_FILE`: rank 0 creates an id and writes it there; the others wait for it;
//! 3. `OXCCL_ROOT_ADDR=host:port`: rank 0 listens there;
//! 4. torchrun's agent store (`TORCHELASTIC_USE_AGENT_STORE=True`): the c10d TCPStore the
//!    agent serves at `MASTER_ADDR:MASTER_PORT`, keys under `/worker/attempt_<restart count>`;
//!    rank 0 publishes an id there (nobody binds the agent's port);
//! 5. `MASTER_ADDR` and `MASTER_PORT` (without an agent store): rank 0 listens there;
//! 6. a PMIx server (`PMIX_NAMESPACE` and `PMIX_RANK`, as Open MPI's mpirun, `srun
//!    --mpi=pmix` and PRRTE set): rank 0 puts an id, a fence, the others get it;
//! 7. under Slurm without PMIx, the first host of `SLURM_JOB_NODELIST`, on a port derived from
//!    the job and step ids (20000 + (job id × 16 + step id) mod 10000);
//! 8. a world of one needs none.
//!
//! With an address (3, 5, 7) there is no id to carry a random secret, so the secret is derived
//! from `OXCCL_SECRET` if set, else from the job's identity (address, world size and the
//! launcher's job id): it keeps strangers' stray connections out, not a determined attacker on
//! the same network. Use 1, 2, 4 or 6 where that matters.

use crate::error::CoreError;
use crate::uniqueid::{derive_secret, UniqueId};
use std::path::PathBuf;

/// Where ranks meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    Id(UniqueId),
    File(PathBuf),
    Addr {
        host: String,
        port: u16,
        secret: [u8; 32],
    },
    /// torchrun's agent store: a c10d TCPStore at `host:port`, keys under `prefix`.
    TorchStore {
        host: String,
        port: u16,
        prefix: String,
    },
    /// The launcher's PMIx server (job `namespace`).
    Pmix {
        namespace: String,
    },
    /// A world of one: nobody to meet.
    Alone,
}

impl Rendezvous {
    /// How the ranks meet, for a log line (`NCCL_DEBUG=INFO`).
    pub fn describe(&self) -> String {
        match self {
            Rendezvous::Id(id) => format!("the unique id of OXCCL_UNIQUE_ID (root {})", id.root),
            Rendezvous::File(p) => format!("the unique id file {}", p.display()),
            Rendezvous::Addr { host, port, .. } => format!("a root at {host}:{port}, on rank 0"),
            Rendezvous::TorchStore { host, port, prefix } => {
                format!("torchrun's agent store at {host}:{port} (keys under {prefix}/)")
            }
            Rendezvous::Pmix { namespace } => format!("the launcher's PMIx server (namespace {namespace})"),
            Rendezvous::Alone => "none (a world of one)".to_string(),
        }
    }
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
        "SLURM_STEP_ID",
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
    rank: usize,
    size: usize,
) -> Result<Rendezvous, CoreError> {
    if let Some(t) = get("OXCCL_UNIQUE_ID") {
        return Ok(Rendezvous::Id(t.parse()?));
    }
    if let Some(p) = get("OXCCL_UNIQUE_ID_FILE") {
        return Ok(Rendezvous::File(PathBuf::from(p)));
    }
    let master = get("MASTER_ADDR").zip(get("MASTER_PORT"));
    let addr = if let Some(a) = get("OXCCL_ROOT_ADDR") {
        let (h, p) = a.rsplit_once(':').ok_or_else(|| CoreError::Launcher {
            launcher,
            reason: format!("OXCCL_ROOT_ADDR={a:?} is not host:port"),
        })?;
        Some((h.trim_matches(['[', ']']).to_string(), p.to_string(), "OXCCL_ROOT_ADDR"))
    } else if let Some((h, p)) = master {
        if get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.trim() == "True") {
            let port = port_of(launcher, "MASTER_PORT", &p)?;
            let attempt = get("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
            return Ok(Rendezvous::TorchStore {
                host: h,
                port,
                prefix: format!("/worker/attempt_{}", attempt.trim()),
            });
        }
        Some((h, p, "MASTER_PORT"))
    } else if let (Some(ns), Some(_)) = (get("PMIX_NAMESPACE"), get("PMIX_RANK")) {
        return Ok(Rendezvous::Pmix { namespace: ns });
    } else if let (Some(list), Some(job)) =
        (get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_STEP_NODELIST")), get("SLURM_JOB_ID"))
    {
        let host = first_slurm_host(&list).ok_or_else(|| CoreError::Launcher {
            launcher,
            reason: format!("SLURM_JOB_NODELIST={list:?} names no host"),
        })?;
        let id: u64 = job.trim().parse().unwrap_or(0);
        let step: u64 = get("SLURM_STEP_ID").and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        Some((host, (20000 + (id.wrapping_mul(16).wrapping_add(step)) % 10000).to_string(), "SLURM_JOB_ID"))
    } else {
        None
    };
    let Some((host, port, var)) = addr else {
        if size == 1 {
            return Ok(Rendezvous::Alone);
        }
        return Err(CoreError::Launcher {
            launcher,
            reason: format!(
                "this process is rank {rank} of {size}, but nothing says where the ranks meet: set \
                 MASTER_ADDR and MASTER_PORT (rank 0 listens there), OXCCL_ROOT_ADDR=host:port, \
                 OXCCL_UNIQUE_ID_FILE (a path every rank sees), or OXCCL_UNIQUE_ID; or start the \
                 job with a launcher that serves PMIx (Open MPI's mpirun, srun --mpi=pmix) or \
                 torchrun"
            ),
        });
    };
    let port = port_of(launcher, var, &port)?;
    let seed = match get("OXCCL_SECRET") {
        Some(s) => format!("secret:{s}"),
        None => format!("job:{}", job_identity(get)),
    };
    let secret =
        derive_secret(seed.as_bytes(), &format!("oxccl-env-rendezvous {host}:{port}"), &[size as u64]);
    Ok(Rendezvous::Addr { host, port, secret })
}

fn port_of(launcher: &'static str, var: &str, port: &str) -> Result<u16, CoreError> {
    port.trim().parse().map_err(|_| CoreError::Launcher {
        launcher,
        reason: format!("{var}: port {port:?} is not a number in 0..65536"),
    })
}

/// Reads the launcher's environment with `get`: `None` when no launcher started this process.
pub fn detect(get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>, CoreError> {
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
        let rendezvous = rendezvous(&get, launcher, rank, size)?;
        return Ok(Some(LaunchEnv { launcher, rank, size, local_rank, rendezvous }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    fn launched(pairs: &[(&str, &str)]) -> LaunchEnv {
        detect(env(pairs)).unwrap().expect("a launcher")
    }

    #[test]
    fn torchrun() {
        let e = launched(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "abc"),
        ]);
        assert_eq!((e.launcher, e.rank, e.size, e.local_rank), ("torchrun", 3, 8, Some(1)));
        let Rendezvous::Addr { host, port, secret } = e.rendezvous else { panic!() };
        assert_eq!((host.as_str(), port), ("node7", 29500));
        // Another job on the same address gets another secret.
        let e2 = launched(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "other"),
        ]);
        let Rendezvous::Addr { secret: s2, .. } = e2.rendezvous else { panic!() };
        assert_ne!(secret, s2);
    }

    /// torchrun's workers are clients of the agent's store: nobody binds MASTER_PORT.
    #[test]
    fn torchrun_with_the_agent_store() {
        let e = launched(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29400"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ]);
        assert_eq!(
            e.rendezvous,
            Rendezvous::TorchStore {
                host: "127.0.0.1".into(),
                port: 29400,
                prefix: "/worker/attempt_2".into()
            }
        );
        // OXCCL_ROOT_ADDR still wins; "False" is no agent store.
        let e = launched(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29400"),
            ("TORCHELASTIC_USE_AGENT_STORE", "False"),
        ]);
        assert!(matches!(e.rendezvous, Rendezvous::Addr { port: 29400, .. }));
    }

    #[test]
    fn slurm_and_openmpi() {
        let e = launched(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[012-015,020],cpu1"),
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_STEP_ID", "3"),
        ]);
        assert_eq!((e.launcher, e.rank, e.size), ("slurm", 5, 16));
        let Rendezvous::Addr { host, port, .. } = e.rendezvous else { panic!() };
        // 20000 + (123456 × 16 + 3) mod 10000: two steps of one job meet on different ports.
        assert_eq!((host.as_str(), port), ("gpu012", (20000 + (123456u64 * 16 + 3) % 10000) as u16));
        let e = launched(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OXCCL_UNIQUE_ID_FILE", "/tmp/id"),
        ]);
        assert_eq!(e.launcher, "openmpi");
        assert_eq!(e.rendezvous, Rendezvous::File("/tmp/id".into()));
    }

    /// Open MPI's mpirun and `srun --mpi=pmix` serve PMIx: no variable to set.
    #[test]
    fn pmix_launchers() {
        let e = launched(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("PMIX_NAMESPACE", "1641283585"),
            ("PMIX_RANK", "1"),
        ]);
        assert_eq!((e.launcher, e.rank, e.size), ("openmpi", 1, 4));
        assert_eq!(e.rendezvous, Rendezvous::Pmix { namespace: "1641283585".into() });
        let e = launched(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n1"),
            ("SLURM_JOB_ID", "7"),
            ("PMIX_NAMESPACE", "slurm.pmix.7.0"),
            ("PMIX_RANK", "0"),
        ]);
        assert!(matches!(e.rendezvous, Rendezvous::Pmix { .. }), "{:?}", e.rendezvous);
    }

    #[test]
    fn errors_name_the_variable() {
        let e = detect(env(&[("RANK", "9"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.to_string().contains("RANK=9"), "{e}");
        // A rank and a size but nowhere to meet: an error saying what to set, not a world of one.
        let e = detect(env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")])).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("rank 1 of 2") && m.contains("MASTER_ADDR") && m.contains("PMIx"), "{m}");
        assert_eq!(detect(env(&[])).unwrap(), None);
        // A world of one needs no rendezvous.
        assert_eq!(launched(&[("RANK", "0"), ("WORLD_SIZE", "1")]).rendezvous, Rendezvous::Alone);
        assert_eq!(first_slurm_host("a1,a2").as_deref(), Some("a1"));
        assert_eq!(first_slurm_host("n[7]").as_deref(), Some("n7"));
    }
}
