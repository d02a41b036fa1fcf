//! oxccl's test kit: ranks as processes ([`spawn`]), verifiable inputs with an independent
//! reference ([`verify`]), and one checked call of every collective ([`cases`]).

pub mod cases;
pub mod matrixrun;
pub mod netns;
pub mod spawn;
pub mod verify;

pub use cases::{matrix, run_case, Case, Coll, MatrixSpec};
pub use spawn::{child, ChildCtx, Finished, Launch};
