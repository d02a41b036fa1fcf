//! oxccl: collective communication for host memory, across processes (shared memory) and
//! hosts (TCP).
//!
//! ```no_run
//! use oxccl::{Communicator, Config, Rank, ReduceOp};
//! # fn main() -> oxccl::Result<()> {
//! // One rank creates the id and hands its text to the others (environment, file, ...).
//! let id = oxccl::new_unique_id(&Config::default())?;
//! let comm = Communicator::init(&id, 1, Rank(0), Config::default())?;
//! let send = vec![1.0f32; 4];
//! let mut recv = vec![0.0f32; 4];
//! comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
//! # Ok(()) }
//! ```
//!
//! Layers (see `docs/architecture.md`): [`comm`] (communicators, groups, scopes) plans calls
//! with `oxccl_core::plan` and runs them on the [`engine`], which moves chunks over
//! [`transport`] connections set up through the [`bootstrap`] services; [`sys`] holds every OS
//! call. [`rma`] serves one-sided calls (windows, puts with signals, waits) beside them.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bootstrap;
pub mod calib;
pub mod comm;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod engine;
pub mod env;
pub mod error;
pub mod flight;
mod log;
pub mod mem;
pub mod rendezvous;
pub mod rma;
pub mod sync;
pub mod sys;
pub mod topo;
pub mod transport;
pub mod wait;

pub use comm::{Communicator, Detached, Group, Scope, Work};

// The unit tests write only under their run root and a test-scoped cache.
#[cfg(test)]
oxccl_testkit::test_scope!();
pub use error::{Error, RejectReason, Result};
pub use half::{bf16, f16};
pub use oxccl_core::config::{Config, CrossMemory, LogLevel};
pub use oxccl_core::fp8::{F8E4M3, F8E5M2};
pub use oxccl_core::uniqueid::UniqueId;
pub use oxccl_core::{CommHash, DataType, Element, Rank, ReduceOp};
pub use rendezvous::new_unique_id;
