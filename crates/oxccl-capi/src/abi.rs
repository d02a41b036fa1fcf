//! nccl.h's types as C lays them out ([`ncclComm_t`], [`ncclUniqueId`], [`ncclConfig`],
//! [`ncclSimInfo`]) with their magic numbers, and the unique id's 128 bytes to and from an
//! oxccl [`UniqueId`] ([`encode_id`], [`decode_id`]).
//!
//! Rule: names only [`crate::fail`]; every module that speaks C names it (the crate root
//! re-exports the public types under their old paths).

use crate::fail::{invalid, R};
use oxccl::UniqueId;
use std::ffi::{c_char, c_int, c_void};

/// `ncclComm_t`.
#[allow(non_camel_case_types)]
pub type ncclComm_t = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes (oxccl's root address and secret, see [`encode_id`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [u8; 128],
}

/// `ncclConfig_t` as NCCL 2.30 lays it out (a 2.28 struct ends after `nvlink_centric_sched`:
/// fields are read only within the caller's `size`).
#[repr(C)]
pub struct ncclConfig {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
    pub traffic_class: c_int,
    pub comm_name: *const c_char,
    pub collnet_enable: c_int,
    pub cta_policy: c_int,
    pub shrink_share: c_int,
    pub nvls_ctas: c_int,
    pub n_channels_per_net_peer: c_int,
    pub nvlink_centric_sched: c_int,
    pub graph_usage_mode: c_int,
    pub num_rma_ctx: c_int,
    pub max_p2p_peers: c_int,
    pub graph_stream_ordering: c_int,
}

/// `ncclSimInfo_t`.
#[repr(C)]
pub struct ncclSimInfo {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub estimated_time: f32,
}

pub(crate) const API_MAGIC: u32 = 0xcafe_beef;
pub(crate) const SIM_MAGIC: u32 = 0x7468_5283;
pub(crate) const UNDEF_INT: c_int = c_int::MIN;

/// An oxccl unique id in NCCL's 128 bytes (its binary form, see `oxccl_core::uniqueid`).
pub fn encode_id(id: &UniqueId) -> ncclUniqueId {
    ncclUniqueId { internal: id.to_bytes() }
}

/// The oxccl unique id in NCCL's 128 bytes (the argument is named `arg` in errors).
pub fn decode_id(u: &ncclUniqueId, arg: &str) -> R<UniqueId> {
    UniqueId::from_bytes(&u.internal).map_err(|e| {
        invalid(
            arg,
            format!(
                "not a unique id from oxccl's ncclGetUniqueId (uninitialized, or made by another NCCL?): {e}"
            ),
        )
    })
}
