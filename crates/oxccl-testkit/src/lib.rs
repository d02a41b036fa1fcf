//! oxccl's test kit: ranks as processes ([`spawn`]), verifiable inputs with an independent
//! reference ([`verify`]), and one checked call of every collective ([`cases`]).

pub mod cases;
pub mod matrixrun;
pub mod netns;
pub mod rng;
pub mod spawn;
pub mod verify;

pub use cases::{matrix, run_case, Case, Coll, MatrixSpec};
pub use rng::Rng;
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
