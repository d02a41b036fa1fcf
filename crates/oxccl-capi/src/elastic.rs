//! NCCL 2.30's fault-tolerance and elasticity calls: `ncclCommRevoke`, `ncclCommGetUniqueId`
//! with `ncclCommGrow`, `ncclCommSuspend` / `ncclCommResume` and `ncclCommMemStats`.
//!
//! Rules:
//! - Revoke aborts the communicator (every call in flight fails at once, on any thread), lets
//!   the proxy finish, and moves the handle to `phase::REVOKED`; the communicator is quiet
//!   when the call returns, so `ncclCommGetAsyncError` answers `ncclSuccess`. Afterwards only
//!   queries, `ncclCommShrink`, `ncclCommSplit`, `ncclCommDestroy` and `ncclCommAbort` are
//!   accepted. A split of a revoked communicator first re-forms it (a shrink that excludes
//!   nobody, which needs no working connection) and splits that.
//! - A grow id is made by one existing rank (`ncclCommGetUniqueId`), is the only one pending
//!   on its communicator (`CommState::grow_id`) until a grow consumes it (whatever that
//!   grow's outcome), and is accepted only from that communicator. New ranks join with it as ranks `size..nRanks`.
//! - Suspend is local: it waits for the communicator's stream-ordered calls, gives back the
//!   memory the communicator rebuilds on demand (with `NCCL_SUSPEND_MEM`) and refuses calls
//!   until `ncclCommResume`. Connection memory (shared with the peers) stays: MemStats
//!   reports it as persistent.

use crate::abi::{decode_id, encode_id, ncclComm_t, ncclConfig, ncclUniqueId};
use crate::fail::{invalid, lock, usage, SUCCESS};
use crate::handle::{member_of, ready, set_current_handle, state};
use crate::life::{init_rank, launch_init, Later};
use crate::ptr::{self, put};
use crate::settings::{settings, Settings};
use crate::tomb::phase;
use oxccl::{Communicator, UniqueId};
use std::ffi::c_int;

/// `NCCL_SUSPEND_MEM`.
const SUSPEND_MEM: c_int = 0x01;

/// `ncclCommSplit` on a revoked communicator: re-form it without excluding anyone (a shrink
/// works on an aborted communicator), split that, and let the re-formed one go.
pub(crate) fn split_revoked(
    c: &Communicator,
    color: Option<u32>,
    key: i64,
) -> oxccl::Result<Option<Communicator>> {
    c.shrink(&[])?.split(color, key)
}

crate::entry! {
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revoke_flags: c_int) {
        if revoke_flags != 0 {
            return Err(invalid("revokeFlags", format!("{revoke_flags:#x} (NCCL_REVOKE_DEFAULT, 0, is the only flag)")));
        }
        let st = member_of(comm)?;
        let c = st.member()?;
        let from = st.phase();
        if from == phase::REVOKED {
            return Err(usage(format!("communicator {comm:p} was already revoked")));
        }
        if !st.tomb().advance(from, phase::REVOKED) {
            return Err(st.ready().err().unwrap_or_else(|| usage("the communicator changed state during ncclCommRevoke")));
        }
        c.abort();
        // Queued stream-ordered calls fail at once now, releasing their streams.
        st.proxy.drain();
        Ok(SUCCESS)
    }

    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, unique_id: *mut ncclUniqueId) {
        if unique_id.is_null() {
            return Err(invalid("uniqueId", "NULL pointer"));
        }
        let st = ready(comm)?;
        let c = st.ready()?;
        let mut p = lock(&st.grow_id);
        if p.is_some() {
            return Err(usage("a grow id made earlier on this communicator was not consumed by ncclCommGrow yet"));
        }
        let id = oxccl::new_unique_id(c.config())?;
        let u = encode_id(&id);
        *p = Some(u.internal);
        // SAFETY: nccl.h: `uniqueId` points to the ncclUniqueId the call fills (checked
        // non-NULL).
        unsafe { put(unique_id, "uniqueId", u) }?;
        Ok(SUCCESS)
    }

    fn ncclCommGrow / pncclCommGrow(
        comm: ncclComm_t, n_ranks: c_int, unique_id: *const ncclUniqueId, rank: c_int, newcomm: *mut ncclComm_t,
        config: *mut ncclConfig
    ) {
        if newcomm.is_null() {
            return Err(invalid("newcomm", "NULL pointer for the new communicator"));
        }
        if comm.is_null() {
            // A new rank: it joins the id as `rank`.
            if unique_id.is_null() {
                return Err(invalid("uniqueId", "NULL for a new rank (comm NULL): it joins with the id the existing root made"));
            }
            if rank < 0 {
                return Err(invalid("rank", format!("{rank}: a new rank (comm NULL) passes the rank it is given")));
            }
            // SAFETY: nccl.h: a new rank's `uniqueId` points to the grow id it was given
            // (checked non-NULL), read during the call only.
            let id = unsafe { ptr::deref(unique_id, "uniqueId") }?;
            // SAFETY: nccl.h: `newcomm` points to the ncclComm_t the call fills (checked
            // non-NULL); `config` is NULL or an ncclConfig_t from NCCL_CONFIG_INITIALIZER.
            return unsafe { init_rank(newcomm, n_ranks, std::slice::from_ref(id), rank, config) };
        }
        if rank != -1 {
            return Err(invalid("rank", format!("{rank}: existing ranks pass -1 (they keep their rank)")));
        }
        let st = ready(comm)?;
        let c = st.ready()?;
        if n_ranks < 0 || n_ranks as usize <= c.size() {
            return Err(invalid("nRanks", format!("{n_ranks}: the communicator has {} ranks, a grown one has more", c.size())));
        }
        let id: Option<UniqueId> = if unique_id.is_null() {
            None
        } else {
            // SAFETY: nccl.h: a non-NULL `uniqueId` points to the grow id made by
            // ncclCommGetUniqueId, read during the call only.
            let u = unsafe { ptr::deref(unique_id, "uniqueId") }?;
            let mut pending = lock(&st.grow_id);
            if *pending != Some(u.internal) {
                return Err(invalid(
                    "uniqueId",
                    "not the pending id ncclCommGetUniqueId made on this communicator (each id serves one grow)",
                ));
            }
            let id = decode_id(u, "uniqueId")?;
            // Consumed by this grow, whatever its outcome: the next grow needs a new id.
            *pending = None;
            Some(id)
        };
        // SAFETY: nccl.h: `config` is NULL or an ncclConfig_t from NCCL_CONFIG_INITIALIZER.
        let s = unsafe { settings(config, Some(Settings::of(&st))) }?;
        let child = crate::handle::new_comm(st.device, s.name.clone(), s.blocking);
        s.apply(&child);
        // SAFETY: nccl.h: `newcomm` points to the ncclComm_t the call fills (checked non-NULL).
        unsafe { put(newcomm, "newcomm", child.handle as ncclComm_t) }?;
        let n = n_ranks as usize;
        let parent = Later::new(&st);
        launch_init(child, s.blocking, move || parent.with(|c| Ok(c.grow(n, id.as_ref())?)))
    }

    fn ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) {
        if flags & !SUSPEND_MEM != 0 {
            return Err(invalid("flags", format!("{flags:#x} (NCCL_SUSPEND_MEM is the only flag)")));
        }
        let st = ready(comm)?;
        let c = st.ready()?;
        st.proxy.drain();
        if flags & SUSPEND_MEM != 0 {
            c.release_memory()?;
        }
        if !st.tomb().advance(phase::READY, phase::SUSPENDED) {
            st.ready()?;
        }
        Ok(SUCCESS)
    }

    fn ncclCommResume / pncclCommResume(comm: ncclComm_t) {
        let tomb = state(comm, "comm")?;
        set_current_handle(tomb.handle());
        let st = tomb.pin()?;
        if !tomb.advance(phase::SUSPENDED, phase::READY) {
            st.ready()?;
            return Err(usage(format!("communicator {comm:p} is not suspended")));
        }
        Ok(SUCCESS)
    }

    fn ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: c_int, value: *mut u64) {
        if value.is_null() {
            return Err(invalid("value", "NULL pointer"));
        }
        let st = member_of(comm)?;
        let m = st.member()?.memory();
        let v = match stat {
            0 => m.releasable as u64,
            1 => (st.phase() == phase::SUSPENDED) as u64,
            2 => m.connections as u64,
            3 => (m.releasable + m.connections) as u64,
            s => return Err(invalid("stat", format!("{s} is not an ncclCommMemStat_t (0..=3)"))),
        };
        // SAFETY: nccl.h: `value` points to the uint64_t the call fills (checked non-NULL).
        unsafe { put(value, "value", v) }?;
        Ok(SUCCESS)
    }
}
