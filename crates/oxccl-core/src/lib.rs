//! oxccl-core: the pure logic of oxccl — no I/O, no `unsafe`.
//!
//! Data types and reduce operators ([`dtype`], [`fp8`]) and the CPU reduction kernels
//! ([`reduce`]); collective descriptions and their validation ([`coll`]); algorithms as plans of
//! steps over connections ([`plan`]) with an in-memory executor that tests every algorithm
//! without sockets ([`plan::sim`]); wire formats ([`wire`], [`uniqueid`]); configuration and
//! launcher environments ([`config`], [`launch`]); interface selection rules ([`ifname`]); and
//! the tuning constants ([`tuning`]).
//!
//! The runtime crate `oxccl` depends on this one, never the other way round.
#![forbid(unsafe_code)]

pub mod coll;
pub mod config;
pub mod contract;
pub mod dtype;
pub mod error;
pub mod fp8;
pub mod ifname;
pub mod json;
pub mod launch;
pub mod netsim;
pub mod plan;
pub mod premul;
pub mod proto;
pub mod reduce;
pub mod topo;
pub mod tuner;

pub mod tuning;
pub mod types;
pub mod uniqueid;
pub mod variables;
pub mod wire;

/// The NCCL version whose API and behaviour oxccl follows (the C ABI's `NCCL_VERSION_CODE`).
pub const NCCL_VERSION_STRING: &str = "2.30.7";

pub use dtype::{DataType, Element, ReduceOp};
pub use error::CoreError;
pub use types::{ChannelId, CommHash, Rank};
