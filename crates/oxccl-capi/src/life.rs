//! A communicator's start and end: [`init_rank`] (what every init entry point does),
//! [`launch_init`] (an init runs now, queued in the open group, or on a thread of its own),
//! [`Later`] (a parent pinned for a split or shrink that runs later), and the end entry points
//! `ncclCommFinalize`, `ncclCommDestroy` and `ncclCommAbort`, which close the communicator and
//! free everything it held (the rules that make freeing safe are [`crate::tomb`]'s).
//!
//! Rule: above the handles ([`crate::handle`]), the group queue ([`crate::ops`]) and the
//! settings ([`crate::settings`]); only entry points (`lib.rs`, [`crate::elastic`]) name it.

use crate::abi::{decode_id, ncclComm_t, ncclConfig, ncclUniqueId};
use crate::fail::{
    invalid, ncclResult_t, usage, Fail, INTERNAL_ERROR, IN_PROGRESS, R, SUCCESS, SYSTEM_ERROR,
};
use crate::handle::{self, set_current, state, CommState, Pin, Tomb};
use crate::ops;
use crate::ptr::put;
use crate::settings::{current_device, env_config, settings};
use crate::tomb::phase;
use oxccl::{Communicator, Rank};
use std::ffi::c_int;
use std::time::Duration;

/// Starts rank `rank` of `nranks` on `ids` (one, or a scalable init's: one rendezvous root
/// each) and writes its handle to `out`.
///
/// # Safety
/// `out` is NULL or valid for a write of an `ncclComm_t`; `config` is as [`settings`] needs.
pub(crate) unsafe fn init_rank(
    out: *mut ncclComm_t,
    nranks: c_int,
    ids: &[ncclUniqueId],
    rank: c_int,
    config: *const ncclConfig,
) -> R<ncclResult_t> {
    if out.is_null() {
        return Err(invalid("comm", "NULL pointer for the new communicator"));
    }
    if nranks < 1 {
        return Err(invalid("nranks", format!("{nranks} (a communicator needs at least one rank)")));
    }
    if rank < 0 || rank >= nranks {
        return Err(invalid("rank", format!("{rank} is outside 0..{nranks}")));
    }
    // SAFETY: `config` is as `settings` needs: this function's contract.
    let s = unsafe { settings(config, None) }?;
    if ids.len() > nranks as usize {
        return Err(invalid(
            "nId",
            format!("{} unique ids for {nranks} ranks (at most one per rank)", ids.len()),
        ));
    }
    let ids = match ids {
        [one] => vec![decode_id(one, "commId")?],
        many => many
            .iter()
            .enumerate()
            .map(|(i, id)| decode_id(id, &format!("commIds[{i}]")))
            .collect::<R<Vec<_>>>()?,
    };
    let mut cfg = env_config()?;
    // NCCL's rank lives on the device current at init: every rank learns every rank's.
    cfg.cuda_device = current_device();
    let st = handle::new_comm(-1, s.name.clone(), s.blocking);
    s.apply(&st);
    // SAFETY: `out` is NULL or writable (this function's contract; checked non-NULL above).
    unsafe { put(out, "comm", st.handle as ncclComm_t) }?;
    let (n, r) = (nranks as usize, Rank::new(rank as usize));
    launch_init(st, s.blocking, move || Communicator::init_scalable(&ids, n, r, cfg).map_err(Fail::from))
}

/// Starts `job` for the new communicator `st`: now (blocking), queued (in a group) or on a
/// thread (nonblocking). Returns what the init call answers. A queued init holds no pin: if
/// the communicator is aborted before the group ends, its state is freed and the init skipped;
/// a thread's init keeps its pin, and frees the state itself if it was aborted meanwhile.
pub fn launch_init(
    st: Pin,
    blocking: bool,
    job: impl FnOnce() -> R<Communicator> + Send + 'static,
) -> R<ncclResult_t> {
    if ops::in_group() {
        let tomb = st.tomb();
        drop(st);
        ops::submit_job(Box::new(move || match tomb.pin() {
            Ok(st) => st.finish_init(job()),
            Err(_) => Ok(()),
        }))?;
        return Ok(if blocking { SUCCESS } else { IN_PROGRESS });
    }
    if blocking {
        set_current(Some(&st));
        st.finish_init(job())?;
        return Ok(SUCCESS);
    }
    std::thread::Builder::new()
        .name("oxccl-capi-init".into())
        .spawn(move || {
            let _ = st.finish_init(job());
        })
        .map_err(|e| Fail { code: SYSTEM_ERROR, msg: format!("cannot start the init thread: {e}") })?;
    Ok(IN_PROGRESS)
}

/// A parent communicator for a job that runs later (a split, a shrink): pinned now when the
/// job runs outside a group (at once, or on its own thread: ending the parent then waits for
/// the job), else pinned when the group runs it (queued jobs hold no pin).
pub enum Later {
    Pinned(Pin),
    Queued(&'static Tomb),
}

impl Later {
    pub fn new(st: &Pin) -> Later {
        if ops::in_group() {
            Later::Queued(st.tomb())
        } else {
            Later::Pinned(st.clone())
        }
    }

    /// Runs `f` on the parent's communicator (it was ready when the job was made), pinned.
    pub fn with<T>(self, f: impl FnOnce(&Communicator) -> R<T>) -> R<T> {
        let st = match self {
            Later::Pinned(p) => p,
            Later::Queued(t) => t.pin()?,
        };
        let c = st.comm.get().ok_or_else(|| Fail {
            code: INTERNAL_ERROR,
            msg: format!("communicator {:#x} has no communicator", st.handle),
        })?;
        f(c)
    }
}

/// How long `ncclCommAbort` waits for aborted calls of other threads to return (they return
/// within milliseconds of the abort) before it leaves the free to them.
const ABORT_WAIT: Duration = Duration::from_secs(2);

/// How long `ncclCommDestroy` waits for calls of other threads when the communicator has no
/// timeout (with one, it waits that long: a call still running then has failed).
const DESTROY_WAIT: Duration = Duration::from_secs(60);

/// How long an end waits for calls of other threads (see [`Tomb::await_free`]), and how often
/// it says so.
fn waits(st: &CommState, abort: bool) -> (Duration, Option<Duration>) {
    let c = st.comm.get();
    let bound = match (abort, c.and_then(|c| c.config().timeout)) {
        (true, _) => ABORT_WAIT,
        (false, Some(t)) => t,
        (false, None) => DESTROY_WAIT,
    };
    (bound, c.map_or(Some(Duration::from_secs(5)), |c| c.config().wait_notice))
}

crate::entry! {
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) {
        let st = handle::ready(comm)?;
        // Host-memory calls complete before they return; stream-ordered ones finish here.
        st.proxy.drain();
        if !st.tomb.advance(phase::READY, phase::FINALIZED) {
            st.ready()?;
        }
        Ok(SUCCESS)
    }

    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) {
        if comm.is_null() {
            return Ok(SUCCESS);
        }
        let tomb = state(comm, "comm")?;
        let st = tomb.pin()?;
        set_current(Some(&st));
        st.wait_init();
        end(st, "ncclCommDestroy", false)
    }

    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) {
        if comm.is_null() {
            return Ok(SUCCESS);
        }
        let tomb = state(comm, "comm")?;
        let st = tomb.pin()?;
        set_current(Some(&st));
        end(st, "ncclCommAbort", true)
    }
}

/// Ends the communicator of `st` (destroy, or abort): closes it, then frees its state (or
/// leaves that to the last call still running on it in another thread).
fn end(st: Pin, func: &str, abort: bool) -> R<ncclResult_t> {
    let old = st.destroy();
    if old == phase::DESTROYED {
        return Err(usage(format!("communicator {:#x} was already destroyed", st.handle)));
    }
    if let Some(c) = st.comm.get() {
        if abort {
            c.abort();
        }
        // Stream-ordered calls still queued finish first (each releases its stream; after an
        // abort they fail at once).
        st.proxy.drain();
        #[cfg(feature = "cuda")]
        st.release_dev(abort);
        c.close();
    }
    // An init still running (nonblocking, or in another thread) ends on its own: it finds
    // the phase DESTROYED, closes its communicator and, as the last pin out, frees the state.
    let waiting = old != phase::INIT;
    let (bound, notice) = waits(&st, abort);
    let tomb = st.tomb();
    drop(st);
    if waiting {
        tomb.await_free(func, bound, notice);
    }
    Ok(SUCCESS)
}
