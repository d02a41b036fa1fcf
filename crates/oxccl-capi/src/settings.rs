//! What an `ncclConfig_t` asks for: its magic checked, then each field read only within the
//! struct's `size` (older nccl.h versions' structs are shorter); a bad field is named. Also
//! what a new communicator takes from the process: the environment's configuration
//! ([`env_config`]) and the calling thread's CUDA device ([`current_device`]).
//!
//! Rule: names only [`crate::abi`], [`crate::fail`], [`crate::handle`] and [`crate::ptr`].

use crate::abi::{ncclConfig, API_MAGIC, UNDEF_INT};
use crate::fail::{invalid, Fail, R};
use crate::handle::CommState;
use crate::ptr;
use oxccl::Config;
use std::ffi::{c_char, c_int};
use std::sync::atomic::Ordering;

/// What an `ncclConfig_t` asks for.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) blocking: bool,
    pub(crate) name: Option<String>,
    /// `config->numRmaCtx` (NCCL's default: 1).
    pub(crate) num_rma_ctx: i32,
}

impl Settings {
    /// What a child of `st` inherits when its config leaves a field undefined.
    pub(crate) fn of(st: &CommState) -> Settings {
        Settings {
            blocking: st.blocking,
            name: st.name.clone(),
            num_rma_ctx: st.num_rma_ctx.load(Ordering::Relaxed),
        }
    }

    /// Gives the new communicator `st` what it was asked for beyond its handle.
    pub(crate) fn apply(&self, st: &CommState) {
        st.num_rma_ctx.store(self.num_rma_ctx, Ordering::Relaxed);
    }
}

/// What a caller's `ncclConfig_t` asks for, read within its `size`.
///
/// # Safety
/// `config` is NULL or points to an `ncclConfig_t` made from `NCCL_CONFIG_INITIALIZER` (of the
/// caller's nccl.h version: readable for its `size` bytes, and at least the first three fields),
/// whose string fields are NULL or NUL-terminated strings, none of it changed during the call.
pub(crate) unsafe fn settings(config: *const ncclConfig, inherit: Option<Settings>) -> R<Settings> {
    use std::mem::offset_of;
    let base = inherit.unwrap_or(Settings { blocking: true, name: None, num_rma_ctx: 1 });
    if config.is_null() {
        return Ok(base);
    }
    // `size`, `magic` and `version` are in every version's struct.
    let head = offset_of!(ncclConfig, blocking);
    // SAFETY: non-NULL; the caller's config holds at least the first three fields (`head`
    // bytes), the ones read here.
    let (size, magic): (Option<usize>, Option<u32>) = unsafe {
        (
            ptr::field(config, head, offset_of!(ncclConfig, size)),
            ptr::field(config, head, offset_of!(ncclConfig, magic)),
        )
    };
    let (size, magic) = (size.unwrap_or(0), magic.unwrap_or(0));
    if magic != API_MAGIC {
        return Err(invalid(
            "config",
            format!("magic {magic:#x} is not NCCL_API_MAGIC: initialize it with NCCL_CONFIG_INITIALIZER"),
        ));
    }
    // SAFETY: (for each field read below) the caller's config is readable for its `size`
    // bytes, and `field` reads nothing past them; each offset is its field's, of its type.
    let blocking: Option<c_int> = unsafe { ptr::field(config, size, offset_of!(ncclConfig, blocking)) };
    let blocking = match blocking.unwrap_or(UNDEF_INT) {
        UNDEF_INT => base.blocking,
        0 => false,
        1 => true,
        v => return Err(invalid("config->blocking", format!("{v} (must be 0 or 1)"))),
    };
    let mut name = base.name;
    // SAFETY: as for `blocking`.
    let comm_name: Option<*const c_char> =
        unsafe { ptr::field(config, size, offset_of!(ncclConfig, comm_name)) };
    if let Some(p) = comm_name {
        // SAFETY: a string field within the caller's struct is NULL or a NUL-terminated string
        // (NCCL_CONFIG_INITIALIZER sets NULL), unchanged during the call.
        if let Some(n) = unsafe { ptr::c_str(p, "config->commName") }? {
            name = Some(n.to_string());
        }
    }
    // SAFETY: as for `blocking`.
    let net_name: Option<*const c_char> =
        unsafe { ptr::field(config, size, offset_of!(ncclConfig, net_name)) };
    if let Some(p) = net_name {
        // SAFETY: as for `commName`.
        if let Some(n) = unsafe { ptr::c_str(p, "config->netName") }? {
            if !n.eq_ignore_ascii_case("socket") {
                return Err(invalid(
                    "config->netName",
                    format!("{n:?}: oxccl's network between hosts is \"Socket\" (TCP)"),
                ));
            }
        }
    }
    // SAFETY: as for `blocking`.
    let num_rma_ctx: Option<c_int> = unsafe { ptr::field(config, size, offset_of!(ncclConfig, num_rma_ctx)) };
    let num_rma_ctx = match num_rma_ctx.unwrap_or(UNDEF_INT) {
        UNDEF_INT => base.num_rma_ctx,
        v if v < 0 => return Err(invalid("config->numRmaCtx", format!("{v} (0 turns one-sided calls off)"))),
        v => v,
    };
    Ok(Settings { blocking, name, num_rma_ctx })
}

/// The environment's configuration (`NCCL_*` / `OXCCL_*`, read by `oxccl::env`).
pub(crate) fn env_config() -> R<Config> {
    oxccl::env::config().map_err(Fail::from)
}

/// The calling thread's current CUDA device, if the process uses CUDA.
#[cfg(feature = "cuda")]
pub(crate) fn current_device() -> Option<i32> {
    oxccl::cuda::current_device()
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn current_device() -> Option<i32> {
    None
}
