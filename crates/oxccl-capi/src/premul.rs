//! `ncclRedOpCreatePreMulSum`: each rank multiplies its input by a scalar, then the ranks sum
//! (the scaling rules are oxccl-core's `premul`).

pub use oxccl_core::premul::scaled;
