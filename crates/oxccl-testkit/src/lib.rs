//! oxccl's test kit: ranks as processes ([`spawn`]), verifiable inputs with an independent
//! reference ([`verify`]), one checked call of every collective ([`cases`]), skips that CI
//! turns into failures ([`skip`]), and each test binary's scratch and cache ([`scope`]).

pub mod alloc;
pub mod cases;
pub mod cluster;
pub mod matrixrun;
pub mod netns;
pub mod rng;
pub mod scope;
pub mod skip;
pub mod spawn;
pub mod verify;

pub use cases::{matrix, run_case, Case, CaseColl, MatrixSpec};
pub use rng::Rng;
pub use skip::{skip, skip_unavailable};
pub use spawn::{child, epoch_ms, ChildCtx, Finished, Launch};

/// Prints a line to the process's stderr even under libtest's output capture (which only
/// catches the `print!` family), so test logs — CI's too — show what ran and how long it took.
#[macro_export]
macro_rules! report {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// Runs `f(comm)` on `n` ranks as threads of this process, rank `r` on the simulated host
/// `r / per_host` (its `OXCCL_HOST_ID`); returns each rank's result in rank order.
pub fn threads<T: Send + 'static>(
    n: usize,
    per_host: usize,
    config: oxccl::Config,
    f: impl Fn(oxccl::Communicator) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    let id = oxccl::new_unique_id(&config).unwrap();
    // Flight-recorder dumps of ranks that fail on purpose are removed with this scratch
    // directory, unless the config chose where they go.
    let scratch = config.flight_dir.is_none().then(spawn::Launch::scratch);
    let mut config = config;
    if let Some(d) = &scratch {
        config.flight_dir = Some(d.clone());
    }
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let config = config.clone().with_host_id(&format!("host{}", r / per_host.max(1)));
            std::thread::spawn(move || {
                f(oxccl::Communicator::init(&id, n, oxccl::Rank::new(r), config).unwrap())
            })
        })
        .collect();
    let out = hs.into_iter().map(|h| h.join().unwrap()).collect();
    if let Some(d) = scratch {
        let _ = std::fs::remove_dir_all(d);
    }
    out
}
