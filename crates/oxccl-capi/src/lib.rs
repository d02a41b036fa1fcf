//! libnccl.so.2 from oxccl: the host API of `nccl.h` (NCCL 2.30.7) over oxccl communicators.
//!
//! Every entry point exists as `ncclX` and as its profiling alias `pncclX`. Each one catches
//! panics (answering `ncclInternalError`), checks every argument before acting (answering
//! `ncclInvalidArgument` or `ncclInvalidUsage`, with `ncclGetLastError` naming the argument
//! and the rank), and records every failure for `ncclGetLastError`.
//!
//! Layout, lowest first (a module names only those before it; `tests/module_graph.rs` of
//! oxccl-core checks that no file names another in a circle):
//! - [`fail`] (result codes, failures), [`abi`] (nccl.h's types, unique ids), `ptr` (every read
//!   or write through a pointer argument: entry bodies are not `unsafe` blocks, each such
//!   operation is a `ptr` call in a block of its own with its `// SAFETY:` reasoning),
//!   [`premul`] (PreMulSum scaling);
//! - [`tomb`] (a handle's tomb, phase and pins, over any state), [`proxy`] (the thread that runs
//!   stream-ordered work), then [`handle`] (a communicator's state, the handle registry, the
//!   last error);
//! - [`mem`] (ncclMemAlloc, registrations), `settings` (what an `ncclConfig_t` asks for),
//!   [`ops`] (call checks, group queues, execution), `entry` (how every entry point runs:
//!   `crate::entry!`), [`winops`] (the window table and the one-sided work on it);
//! - the entry points: [`life`] (the start and end of a communicator), [`win`] (windows),
//!   [`rma`] (one-sided calls), [`elastic`] (revoke, grow, suspend, memory statistics),
//!   [`param`] (parameters), and this file (init, collectives, groups, queries).
//!
//! See `docs/capi.md` for the semantics on host memory.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![allow(clippy::missing_safety_doc)]

pub mod abi;
pub mod elastic;
mod entry;
pub mod fail;
pub mod handle;
pub mod life;
pub mod mem;
pub mod ops;
pub mod param;
pub mod premul;
pub mod proxy;
mod ptr;
pub mod rma;
mod settings;
pub mod tomb;
pub mod win;
pub mod winops;

use abi::SIM_MAGIC;
pub use abi::{decode_id, encode_id, ncclComm_t, ncclConfig, ncclSimInfo, ncclUniqueId};
pub(crate) use entry::entry;
use fail::{invalid, lock, ncclResult_t, usage, Fail, INTERNAL_ERROR, IN_PROGRESS, R, SUCCESS};
use handle::{ready, state, PreMul, RegKind, Scalar};
use life::{init_rank, launch_init, Later};
pub use life::{
    ncclCommAbort, ncclCommDestroy, ncclCommFinalize, pncclCommAbort, pncclCommDestroy, pncclCommFinalize,
};
use ops::{Args, Call, Kind};
use oxccl::{Communicator, Config, Rank};
use ptr::put;
use settings::{env_config, settings, Settings};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::catch_unwind;
use std::sync::atomic::Ordering;
use tomb::phase;

/// The NCCL version whose host API this library implements (`NCCL_VERSION_CODE`).
pub const NCCL_VERSION_CODE: c_int = 23007;

entry! {
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) {
        // SAFETY: nccl.h: `version` points to an int the call fills (put refuses NULL).
        unsafe { put(version, "version", NCCL_VERSION_CODE) }?;
        Ok(SUCCESS)
    }

    fn ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut ncclUniqueId) {
        if unique_id.is_null() {
            return Err(invalid("uniqueId", "NULL pointer"));
        }
        let id = oxccl::new_unique_id(&env_config()?)?;
        // SAFETY: nccl.h: `uniqueId` points to an ncclUniqueId the call fills; checked non-NULL.
        unsafe { put(unique_id, "uniqueId", encode_id(&id)) }?;
        Ok(SUCCESS)
    }

    fn ncclCommInitRank / pncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, comm_id: ncclUniqueId, rank: c_int) {
        // SAFETY: nccl.h: `comm` points to the ncclComm_t the call fills (init_rank refuses
        // NULL); no config.
        unsafe { init_rank(comm, nranks, std::slice::from_ref(&comm_id), rank, std::ptr::null()) }
    }

    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t, nranks: c_int, comm_id: ncclUniqueId, rank: c_int, config: *mut ncclConfig
    ) {
        // SAFETY: nccl.h: `comm` points to the ncclComm_t the call fills (init_rank refuses
        // NULL); `config` is NULL or an ncclConfig_t from NCCL_CONFIG_INITIALIZER.
        unsafe { init_rank(comm, nranks, std::slice::from_ref(&comm_id), rank, config) }
    }

    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, n_id: c_int, comm_ids: *mut ncclUniqueId,
        config: *mut ncclConfig
    ) {
        if n_id < 1 {
            return Err(invalid("nId", format!("{n_id} (at least one unique id is needed)")));
        }
        if comm_ids.is_null() {
            return Err(invalid("commIds", "NULL pointer"));
        }
        // SAFETY: nccl.h: `commIds` is an array of `nId` unique ids (checked non-NULL, nId ≥ 1),
        // read during the call only.
        let ids = unsafe { ptr::slice(comm_ids, n_id as usize, "commIds") }?;
        for (i, id) in ids.iter().enumerate() {
            decode_id(id, &format!("commIds[{i}]"))?;
        }
        // Every id is a rendezvous root; this rank joins its share's (Communicator::init_scalable).
        // SAFETY: nccl.h: `newcomm` points to the ncclComm_t the call fills (init_rank refuses
        // NULL); `config` is NULL or an ncclConfig_t from NCCL_CONFIG_INITIALIZER.
        unsafe { init_rank(newcomm, nranks, ids, myrank, config) }
    }

    fn ncclCommInitAll / pncclCommInitAll(comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) {
        if comms.is_null() {
            return Err(invalid("comm", "NULL array for the new communicators"));
        }
        if ndev < 1 {
            return Err(invalid("ndev", format!("{ndev} (at least one rank)")));
        }
        let n = ndev as usize;
        let devs: Vec<i32> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: nccl.h: a non-NULL `devlist` holds `ndev` device numbers (ndev ≥ 1,
            // checked above); copied here.
            unsafe { ptr::slice(devlist, n, "devlist") }?.to_vec()
        };
        if let Some((i, d)) = devs.iter().enumerate().find(|(_, d)| **d < 0) {
            return Err(invalid("devlist", format!("devlist[{i}] = {d} is not a device")));
        }
        let cfg = env_config()?;
        let id = oxccl::new_unique_id(&cfg)?;
        let states: Vec<handle::Pin> = devs.iter().map(|d| handle::new_comm(*d, None, true)).collect();
        let handles: Vec<ncclComm_t> = states.iter().map(|st| st.handle as ncclComm_t).collect();
        // SAFETY: nccl.h: `comms` is an array of `ndev` ncclComm_t the call fills (checked
        // non-NULL); `handles` has one per device.
        unsafe { ptr::put_all(comms, "comm", &handles) }?;
        let results = ops::run_all(states.iter().enumerate().collect(), |(i, st)| {
            let cfg = Config { cuda_device: Some(devs[i]), ..cfg.clone() };
            st.finish_init(Communicator::init(&id, n, Rank::new(i), cfg).map_err(Fail::from))
        });
        results.into_iter().collect::<R<Vec<()>>>()?;
        Ok(SUCCESS)
    }

    fn ncclCommSplit / pncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig) {
        if newcomm.is_null() {
            return Err(invalid("newcomm", "NULL pointer for the new communicator"));
        }
        if color < -1 {
            return Err(invalid("color", format!("{color} (a color is >= 0, or NCCL_SPLIT_NOCOLOR)")));
        }
        let tomb = state(comm, "comm")?;
        handle::set_current_handle(tomb.handle());
        let st = tomb.pin()?;
        // A revoked communicator splits too (see elastic::split_revoked).
        let revoked = st.phase() == phase::REVOKED;
        if !revoked {
            st.ready()?;
        }
        // SAFETY: nccl.h: `config` is NULL or an ncclConfig_t from NCCL_CONFIG_INITIALIZER.
        let s = unsafe { settings(config, Some(Settings::of(&st))) }?;
        let color = (color >= 0).then_some(color as u32);
        let parent = Later::new(&st);
        let split = move |c: &Communicator| {
            if revoked { elastic::split_revoked(c, color, key as i64) } else { c.split(color, key as i64) }
        };
        match color {
            None => {
                // SAFETY: nccl.h: `newcomm` points to the ncclComm_t the call fills (checked
                // non-NULL); NULL for a rank that passes NCCL_SPLIT_NOCOLOR.
                unsafe { put(newcomm, "newcomm", std::ptr::null_mut()) }?;
                let job = move || parent.with(|c| split(c).map(|_| ()).map_err(Fail::from));
                if s.blocking || ops::in_group() {
                    ops::submit_job(Box::new(job))?;
                    Ok(SUCCESS)
                } else {
                    std::thread::spawn(job);
                    Ok(SUCCESS)
                }
            }
            Some(_) => {
                let child = handle::new_comm(st.device, s.name.clone(), s.blocking);
                s.apply(&child);
                // SAFETY: nccl.h: `newcomm` points to the ncclComm_t the call fills (checked
                // non-NULL).
                unsafe { put(newcomm, "newcomm", child.handle as ncclComm_t) }?;
                launch_init(child, s.blocking, move || {
                    parent.with(|c| split(c)?.ok_or_else(|| Fail { code: INTERNAL_ERROR, msg: "split returned no communicator for a color".into() }))
                })
            }
        }
    }

    fn ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t, exclude_ranks_list: *mut c_int, exclude_ranks_count: c_int, newcomm: *mut ncclComm_t,
        config: *mut ncclConfig, shrink_flags: c_int
    ) {
        if newcomm.is_null() {
            return Err(invalid("newcomm", "NULL pointer for the new communicator"));
        }
        if shrink_flags & !1 != 0 {
            return Err(invalid("shrinkFlags", format!("{shrink_flags:#x} (NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT)")));
        }
        if exclude_ranks_count < 0 {
            return Err(invalid("excludeRanksCount", exclude_ranks_count));
        }
        if exclude_ranks_count > 0 && exclude_ranks_list.is_null() {
            return Err(invalid("excludeRanksList", format!("NULL with excludeRanksCount {exclude_ranks_count}")));
        }
        // A revoked communicator may shrink (that is what revoking is for).
        let st = handle::member_of(comm)?;
        let c = st.member()?;
        let n = exclude_ranks_count as usize;
        // SAFETY: nccl.h: `excludeRanksList` holds `excludeRanksCount` ranks (checked ≥ 0, and
        // non-NULL when > 0), read during the call only.
        let list = unsafe { ptr::slice(exclude_ranks_list, n, "excludeRanksList") }?;
        let mut exclude = Vec::with_capacity(list.len());
        for (i, r) in list.iter().enumerate() {
            if *r < 0 || *r as usize >= c.size() {
                return Err(invalid(&format!("excludeRanksList[{i}]"), format!("{r} is not a rank of this {}-rank communicator", c.size())));
            }
            exclude.push(Rank::new(*r as usize));
        }
        if exclude.contains(&c.rank()) {
            return Err(usage(format!("rank {} is in excludeRanksList: excluded ranks must not call ncclCommShrink", c.rank())));
        }
        // SAFETY: nccl.h: `config` is NULL or an ncclConfig_t from NCCL_CONFIG_INITIALIZER.
        let s = unsafe { settings(config, Some(Settings::of(&st))) }?;
        if shrink_flags & 1 != 0 {
            c.abort();
        }
        let child = handle::new_comm(st.device, s.name.clone(), s.blocking);
        s.apply(&child);
        // SAFETY: nccl.h: `newcomm` points to the ncclComm_t the call fills (checked non-NULL).
        unsafe { put(newcomm, "newcomm", child.handle as ncclComm_t) }?;
        let parent = Later::new(&st);
        launch_init(child, s.blocking, move || parent.with(|c| c.shrink(&exclude).map_err(Fail::from)))
    }

    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, async_error: *mut ncclResult_t) {
        if async_error.is_null() {
            return Err(invalid("asyncError", "NULL pointer"));
        }
        let st = state(comm, "comm")?.pin()?;
        let code = match st.phase() {
            phase::INIT => IN_PROGRESS,
            phase::FAILED => st.failure.get().map_or(INTERNAL_ERROR, |f| f.code),
            phase::DESTROYED => return Err(usage(format!("communicator {comm:p} was destroyed"))),
            // Revoking ends when the communicator is quiet, before ncclCommRevoke returns.
            phase::REVOKED => SUCCESS,
            _ if st.proxy.error().is_some() => st.proxy.error().map_or(INTERNAL_ERROR, |f| f.code),
            _ => match st.comm.get().map(|c| c.check()) {
                Some(Ok(())) => SUCCESS,
                Some(Err(e)) => {
                    *lock(&st.last_error) = Some(e.to_string());
                    fail::code_of(&e)
                }
                None => INTERNAL_ERROR,
            },
        };
        // SAFETY: nccl.h: `asyncError` points to the ncclResult_t the call fills (checked
        // non-NULL).
        unsafe { put(async_error, "asyncError", code) }?;
        Ok(SUCCESS)
    }

    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) {
        if count.is_null() {
            return Err(invalid("count", "NULL pointer"));
        }
        let n = handle::member_of(comm)?.member()?.size() as c_int;
        // SAFETY: nccl.h: `count` points to the int the call fills (checked non-NULL).
        unsafe { put(count, "count", n) }?;
        Ok(SUCCESS)
    }

    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) {
        if rank.is_null() {
            return Err(invalid("rank", "NULL pointer"));
        }
        let r = handle::member_of(comm)?.member()?.rank().idx() as c_int;
        // SAFETY: nccl.h: `rank` points to the int the call fills (checked non-NULL).
        unsafe { put(rank, "rank", r) }?;
        Ok(SUCCESS)
    }

    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) {
        if device.is_null() {
            return Err(invalid("device", "NULL pointer"));
        }
        let st = handle::member_of(comm)?;
        // SAFETY: nccl.h: `device` points to the int the call fills (checked non-NULL).
        unsafe { put(device, "device", st.device) }?;
        Ok(SUCCESS)
    }

    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: ncclComm_t
    ) {
        if op.is_null() {
            return Err(invalid("op", "NULL pointer"));
        }
        if scalar.is_null() {
            return Err(invalid("scalar", "NULL pointer"));
        }
        let dtype = ops::dtype_of(datatype)?;
        let st = ready(comm)?;
        let scalar = match residence {
            1 => {
                // SAFETY: nccl.h: with ncclScalarHostImmediate, `scalar` points to one host
                // value of `datatype` (checked non-NULL), copied here.
                let v = unsafe { ptr::slice(scalar as *const u8, dtype.size_bytes(), "scalar") }?;
                Scalar::Value(v.to_vec())
            }
            0 => Scalar::Pointer(scalar as usize),
            r => return Err(invalid("residence", format!("{r} (ncclScalarDevice or ncclScalarHostImmediate)"))),
        };
        let id = st.next_op.fetch_add(1, Ordering::Relaxed);
        if id < 5 {
            return Err(usage("every ncclRedOp_t value of this communicator is in use"));
        }
        lock(&st.premul).insert(id, PreMul { dtype, scalar });
        // SAFETY: nccl.h: `op` points to the ncclRedOp_t the call fills (checked non-NULL).
        unsafe { put(op, "op", id) }?;
        Ok(SUCCESS)
    }

    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: ncclComm_t) {
        let st = ready(comm)?;
        if (0..5).contains(&op) {
            return Err(invalid("op", format!("{op} is a built-in operator (only ncclRedOpCreatePreMulSum's can be destroyed)")));
        }
        if lock(&st.premul).remove(&op).is_none() {
            return Err(invalid("op", format!("{op} is not an operator created on this communicator (or was destroyed)")));
        }
        Ok(SUCCESS)
    }

    fn ncclGroupStart / pncclGroupStart() {
        ops::group_start();
        Ok(SUCCESS)
    }

    fn ncclGroupEnd / pncclGroupEnd() {
        let Some(ended) = ops::group_end()? else { return Ok(SUCCESS) };
        for r in ops::run_all(ended.jobs, |j| j()) {
            r?;
        }
        // Each communicator pinned again (refused if it was destroyed since its calls queued).
        let results = ops::run_all(ended.per_comm.iter().collect(), |(t, calls)| {
            let st = t.pin()?;
            ops::run(&st, st.ready()?, calls)
        });
        let mut first = None;
        for ((t, _), r) in ended.per_comm.iter().zip(results) {
            if let Err(f) = r {
                handle::record("ncclGroupEnd", t.pin().ok().as_deref(), &f);
                first.get_or_insert((t.handle(), f));
            }
        }
        match first {
            None => Ok(SUCCESS),
            Some((h, f)) => {
                handle::set_current_handle(h);
                Err(f)
            }
        }
    }

    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info: *mut ncclSimInfo) {
        // SAFETY: nccl.h: `simInfo` points to an ncclSimInfo_t the call fills, the caller's
        // alone during the call (deref_mut refuses NULL).
        let sim = unsafe { ptr::deref_mut(sim_info, "simInfo") }?;
        if sim.magic != SIM_MAGIC {
            return Err(invalid("simInfo", "not initialized with NCCL_SIM_INFO_INITIALIZER"));
        }
        // The calls are checked (each returned its error when made) and then dropped, as the
        // simulation runs nothing. oxccl's cost model comes with the tuner; until then the
        // estimate stays NCCL_UNDEF_FLOAT, "not estimated".
        let _ = ops::group_end()?;
        sim.estimated_time = -1.0;
        Ok(SUCCESS)
    }

    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) {
        if ptr.is_null() {
            return Err(invalid("ptr", "NULL pointer"));
        }
        let p = mem::alloc(size)?;
        // SAFETY: nccl.h: `ptr` points to the void* the call fills (checked non-NULL).
        unsafe { put(ptr, "ptr", p as *mut c_void) }?;
        Ok(SUCCESS)
    }

    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) {
        if ptr.is_null() {
            return Ok(SUCCESS);
        }
        mem::free(ptr as usize)?;
        Ok(SUCCESS)
    }

    fn ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void) {
        if handle.is_null() {
            return Err(invalid("handle", "NULL pointer"));
        }
        let st = ready(comm)?;
        let h = mem::register(&st, RegKind::Buffer, buff as usize, size)?;
        // SAFETY: nccl.h: `handle` points to the void* the call fills (checked non-NULL).
        unsafe { put(handle, "handle", h as *mut c_void) }?;
        Ok(SUCCESS)
    }

    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) {
        let st = ready(comm)?;
        mem::deregister(&st, RegKind::Buffer, handle as usize, "handle")?;
        Ok(SUCCESS)
    }

    fn ncclDevCommCreate / pncclDevCommCreate(comm: ncclComm_t, reqs: *const c_void, out_dev_comm: *mut c_void) {
        let _ = (reqs, out_dev_comm);
        ready(comm)?;
        Err(usage("ncclDevCommCreate: the device API (device-side communicators) is not supported by oxccl"))
    }

    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, dev_comm: *const c_void) {
        let _ = dev_comm;
        ready(comm)?;
        Err(usage("ncclDevCommDestroy: the device API (device-side communicators) is not supported by oxccl"))
    }
}

// ------------------------------------------------------------------------- collectives

/// Checks a call on `comm` and runs or queues it.
fn collective(
    comm: ncclComm_t,
    a: Args,
    kind: impl FnOnce(Option<oxccl::ReduceOp>, Option<Rank>) -> Kind,
) -> R<ncclResult_t> {
    let st = ready(comm)?;
    let c = st.ready()?;
    let call = Call::check(&st, c, a, kind)?;
    if ops::in_group() {
        ops::queue(st.tomb(), call);
    } else {
        ops::run(&st, c, std::slice::from_ref(&call))?;
    }
    Ok(SUCCESS)
}

fn op_of(op: Option<oxccl::ReduceOp>) -> oxccl::ReduceOp {
    op.expect("reductions carry an operator")
}

fn rank_of(r: Option<Rank>) -> Rank {
    r.expect("rooted calls carry a rank")
}

#[allow(clippy::too_many_arguments)]
fn args(
    func: &'static str,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: Option<c_int>,
    rank: Option<(&'static str, c_int)>,
    stream: *mut c_void,
) -> Args {
    Args {
        func,
        send: send as *const u8,
        recv: recv as *mut u8,
        count,
        dtype,
        op,
        rank,
        stream: stream as usize,
    }
}

entry! {
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: ncclComm_t,
        stream: *mut c_void
    ) {
        let a = args("ncclAllReduce", sendbuff, recvbuff, count, datatype, Some(op), None, stream);
        collective(comm, a, |op, _| Kind::AllReduce(op_of(op)))
    }

    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: ncclComm_t,
        stream: *mut c_void
    ) {
        let a = args("ncclBroadcast", sendbuff, recvbuff, count, datatype, None, Some(("root", root)), stream);
        collective(comm, a, |_, r| Kind::Broadcast(rank_of(r)))
    }

    fn ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: ncclComm_t, stream: *mut c_void) {
        let a = args("ncclBcast", buff, buff, count, datatype, None, Some(("root", root)), stream);
        collective(comm, a, |_, r| Kind::Broadcast(rank_of(r)))
    }

    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int,
        comm: ncclComm_t, stream: *mut c_void
    ) {
        let a = args("ncclReduce", sendbuff, recvbuff, count, datatype, Some(op), Some(("root", root)), stream);
        collective(comm, a, |op, r| Kind::Reduce(op_of(op), rank_of(r)))
    }

    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: ncclComm_t,
        stream: *mut c_void
    ) {
        let a = args("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, None, None, stream);
        collective(comm, a, |_, _| Kind::AllGather)
    }

    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: ncclComm_t,
        stream: *mut c_void
    ) {
        let a = args("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, Some(op), None, stream);
        collective(comm, a, |op, _| Kind::ReduceScatter(op_of(op)))
    }

    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: ncclComm_t,
        stream: *mut c_void
    ) {
        let a = args("ncclAlltoAll", sendbuff, recvbuff, count, datatype, None, None, stream);
        collective(comm, a, |_, _| Kind::AllToAll)
    }

    fn ncclGather / pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: ncclComm_t,
        stream: *mut c_void
    ) {
        let a = args("ncclGather", sendbuff, recvbuff, count, datatype, None, Some(("root", root)), stream);
        collective(comm, a, |_, r| Kind::Gather(rank_of(r)))
    }

    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: ncclComm_t,
        stream: *mut c_void
    ) {
        let a = args("ncclScatter", sendbuff, recvbuff, count, datatype, None, Some(("root", root)), stream);
        collective(comm, a, |_, r| Kind::Scatter(rank_of(r)))
    }

    fn ncclSend / pncclSend(sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: ncclComm_t, stream: *mut c_void) {
        let a = args("ncclSend", sendbuff, std::ptr::null_mut(), count, datatype, None, Some(("peer", peer)), stream);
        collective(comm, a, |_, r| Kind::Send(rank_of(r)))
    }

    fn ncclRecv / pncclRecv(recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: ncclComm_t, stream: *mut c_void) {
        let a = args("ncclRecv", std::ptr::null(), recvbuff, count, datatype, None, Some(("peer", peer)), stream);
        collective(comm, a, |_, r| Kind::Recv(rank_of(r)))
    }
}

// ------------------------------------------------------------------------- strings

/// `ncclGetErrorString`.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"no error",
        1 => c"a CUDA call failed (ncclGetLastError says which)",
        2 => c"a system call failed (ncclGetLastError says which)",
        3 => c"internal error in oxccl (a bug: please report it with ncclGetLastError's text)",
        4 => c"invalid argument (ncclGetLastError names it)",
        5 => c"invalid usage (ncclGetLastError says why)",
        6 => c"a remote rank failed, exited or could not be reached (ncclGetLastError names it)",
        7 => c"operation in progress",
        8 => c"timed out (ncclGetLastError says what it waited for)",
        _ => c"unknown ncclResult_t value",
    };
    s.as_ptr()
}

/// `pncclGetErrorString`.
#[no_mangle]
pub extern "C" fn pncclGetErrorString(result: ncclResult_t) -> *const c_char {
    ncclGetErrorString(result)
}

/// `ncclGetLastError`: the text of the last failure on `comm` (or, with NULL or no failure
/// there, on this thread); empty when there was none.
#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    catch_unwind(|| handle::last_error(comm)).unwrap_or(c"".as_ptr())
}

/// `pncclGetLastError`.
#[no_mangle]
pub extern "C" fn pncclGetLastError(comm: ncclComm_t) -> *const c_char {
    ncclGetLastError(comm)
}

#[cfg(test)]
mod tests;
