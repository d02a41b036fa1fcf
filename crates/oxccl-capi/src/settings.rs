//! What an `ncclConfig_t` asks for: its magic checked, then each field read only within the
//! struct's `size` (older nccl.h versions' structs are shorter); a bad field is named.

use super::*;

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
    pub(crate) fn of(st: &handle::CommState) -> Settings {
        Settings {
            blocking: st.blocking,
            name: st.name.clone(),
            num_rma_ctx: st.num_rma_ctx.load(Ordering::Relaxed),
        }
    }

    /// Gives the new communicator `st` what it was asked for beyond its handle.
    pub(crate) fn apply(&self, st: &handle::CommState) {
        st.num_rma_ctx.store(self.num_rma_ctx, Ordering::Relaxed);
    }
}

unsafe fn cstr(p: *const c_char, arg: &str) -> R<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: a non-NULL string field of ncclConfig_t is a NUL-terminated C string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(|s| Some(s.to_string())).map_err(|_| invalid(arg, "not UTF-8"))
}

/// Reads `config` (NULL: `inherit`, or the defaults).
pub(crate) unsafe fn settings(config: *const ncclConfig, inherit: Option<Settings>) -> R<Settings> {
    let base = inherit.unwrap_or(Settings { blocking: true, name: None, num_rma_ctx: 1 });
    if config.is_null() {
        return Ok(base);
    }
    // SAFETY: a non-NULL config points to an ncclConfig_t made from NCCL_CONFIG_INITIALIZER;
    // the first three fields are in every version, the rest are read only within `size`.
    let c = unsafe { &*config };
    if c.magic != API_MAGIC {
        return Err(invalid(
            "config",
            format!("magic {:#x} is not NCCL_API_MAGIC: initialize it with NCCL_CONFIG_INITIALIZER", c.magic),
        ));
    }
    let within = |end: usize| c.size >= end;
    let blocking =
        if within(std::mem::offset_of!(ncclConfig, blocking) + 4) { c.blocking } else { UNDEF_INT };
    let blocking = match blocking {
        UNDEF_INT => base.blocking,
        0 => false,
        1 => true,
        v => return Err(invalid("config->blocking", format!("{v} (must be 0 or 1)"))),
    };
    let mut name = base.name;
    if within(std::mem::offset_of!(ncclConfig, comm_name) + 8) {
        // SAFETY: inside the caller's struct (checked against its size).
        if let Some(n) = unsafe { cstr(c.comm_name, "config->commName") }? {
            name = Some(n);
        }
    }
    if within(std::mem::offset_of!(ncclConfig, net_name) + 8) {
        // SAFETY: as above.
        if let Some(n) = unsafe { cstr(c.net_name, "config->netName") }? {
            if !n.eq_ignore_ascii_case("socket") {
                return Err(invalid(
                    "config->netName",
                    format!("{n:?}: oxccl's network between hosts is \"Socket\" (TCP)"),
                ));
            }
        }
    }
    let num_rma_ctx =
        if within(std::mem::offset_of!(ncclConfig, num_rma_ctx) + 4) { c.num_rma_ctx } else { UNDEF_INT };
    let num_rma_ctx = match num_rma_ctx {
        UNDEF_INT => base.num_rma_ctx,
        v if v < 0 => return Err(invalid("config->numRmaCtx", format!("{v} (0 turns one-sided calls off)"))),
        v => v,
    };
    Ok(Settings { blocking, name, num_rma_ctx })
}
