//! [`DevComm`]: a communicator's calls on device buffers, enqueued on the caller's stream.
//!
//! Made once per rank (no communication), it serves every call with the engine that fits the
//! communicator's ranks, chosen alike on every rank from their processes and hosts:
//! - every rank a thread of this process on one device: [`group`](super::group) (the ranks'
//!   kernels meet on the GPU; nothing on the host waits for it);
//! - every rank a distinct process of this host (at most 8): [`ipc`](super::ipc) (buffers
//!   mapped by CUDA IPC, streams ordered by interprocess events); `OXCCL_CUDA_IPC=0` stages
//!   instead;
//! - otherwise (several hosts, more than 8 ranks, ranks mixing threads and processes):
//!   staged through host memory: the stream is synchronised, inputs copied to the host, the
//!   host collective run, outputs copied back (the call returns when it is complete).

use super::call::{DevCall, What};
use super::driver::{self, Handle};
use super::group::Member;
use super::ipc::Engine;
use super::kernels::Kop;
use super::{CudaError, DevError, Stream};
use crate::{Communicator, Rank};
use oxccl_core::plan::device::{self, DeviceColl, MAX_RANKS};
use oxccl_core::{DataType, ReduceOp};
use std::sync::Mutex;

/// Which engine serves a communicator's device calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// Ranks are threads of one process on one device.
    Threads,
    /// Ranks are processes of one host, buffers mapped by CUDA IPC.
    Ipc,
    /// Ranks are threads of one process on several devices (or on one, with
    /// `OXCCL_DEVICE_ENGINE=events`): the IPC engine's protocol over addresses every device
    /// reaches by peer access, streams ordered by events.
    Events,
    /// Through host memory and the host transports.
    Staged,
}

enum Mode {
    Threads(Box<Member>),
    Ipc(Box<Mutex<Engine>>),
    Staged,
}

/// One rank's device side of a communicator.
pub struct DevComm<'c> {
    comm: &'c Communicator,
    ordinal: i32,
    mode: Mode,
}

/// Which engine fits ranks with these (process, host, device) triples, as every rank decides.
/// A device of -1 is not known (the rank's init was not told it) and taken to be the
/// others'. Threads of one process on several devices get [`EngineKind::Events`] (the caller
/// stages instead when some pair of their devices has no peer access).
pub fn choose(ranks: &[(u32, u64, i32)], ipc_allowed: bool) -> EngineKind {
    let p = ranks.len();
    let one_host = ranks.iter().all(|r| r.1 == ranks[0].1);
    let one_process = ranks.iter().all(|r| r.0 == ranks[0].0);
    let mut known = ranks.iter().map(|r| r.2).filter(|&d| d >= 0);
    let one_device = known.next().is_none_or(|d| known.all(|e| e == d));
    let mut pids: Vec<u32> = ranks.iter().map(|r| r.0).collect();
    pids.sort_unstable();
    pids.dedup();
    if p <= MAX_RANKS && one_host && one_process && one_device {
        EngineKind::Threads
    } else if p <= MAX_RANKS && one_host && one_process {
        EngineKind::Events
    } else if p <= MAX_RANKS && one_host && pids.len() == p && ipc_allowed {
        EngineKind::Ipc
    } else {
        EngineKind::Staged
    }
}

/// Whether every pair of `devices` (-1: `mine`) has peer access both ways.
fn all_peers_reachable(devices: &[i32], mine: i32) -> bool {
    let mut ds: Vec<i32> = devices.iter().map(|&d| if d < 0 { mine } else { d }).collect();
    ds.sort_unstable();
    ds.dedup();
    ds.iter().all(|&a| ds.iter().all(|&b| super::can_access_peer(a, b).unwrap_or(false)))
}

/// `OXCCL_DEVICE_ENGINE=events`: threads of one process on one device use the event engine
/// instead of the thread group (so its in-process path runs on one GPU too).
pub fn events_forced() -> bool {
    crate::env::device().engine_events
}

/// `OXCCL_CUDA_IPC=0` keeps processes off CUDA IPC (their device calls are staged).
pub fn ipc_allowed() -> bool {
    crate::env::device().cuda_ipc
}

impl<'c> DevComm<'c> {
    /// This rank's device side of `comm`, on device `ordinal` (no communication: the engine
    /// follows from the ranks' processes, hosts and devices as init told them, which every
    /// rank knows alike; threads of one process whose devices were not told must all use one
    /// device, which their group checks).
    pub fn new(comm: &'c Communicator, ordinal: i32) -> Result<DevComm<'c>, DevError> {
        let p = comm.size();
        let ranks: Vec<(u32, u64, i32)> =
            comm.peers().iter().map(|pi| (pi.pid, pi.host_id, pi.cuda_device)).collect();
        let rank = comm.rank().idx();
        let devices: Vec<i32> = ranks.iter().map(|r| r.2).collect();
        let kind = match choose(&ranks, ipc_allowed()) {
            EngineKind::Threads if events_forced() => EngineKind::Events,
            // Every rank asks about every pair: the same answer on every rank (one process).
            EngineKind::Events if !all_peers_reachable(&devices, ordinal) => EngineKind::Staged,
            k => k,
        };
        comm.logger().info_in(
            oxccl_core::config::subsys::INIT,
            format_args!(
                "device buffers on device {ordinal}: {}",
                match kind {
                    EngineKind::Threads => format!("{p} ranks are threads of this process: thread-group kernels meeting on the GPU (LL all-reduce up to {} B: {}; LL128 up to {} B: {})", super::group::LL_MAX_BYTES, super::group::ll_allowed(), super::group::LL128_MAX_BYTES, super::group::ll128_allowed()),
                    EngineKind::Ipc => format!("{p} ranks are processes of one host: kernels over buffers mapped by CUDA IPC, streams ordered by interprocess events"),
                    EngineKind::Events => format!("{p} ranks are threads of this process on devices {devices:?}: kernels over buffers reached by peer access, streams ordered by events"),
                    EngineKind::Staged => format!("staged through host memory ({STAGED_WHY})"),
                }
            ),
        );
        let mode = match kind {
            EngineKind::Threads => {
                let key = comm.comm_hash().0;
                Mode::Threads(Box::new(super::group::join(key, p, rank, ordinal, comm.config().timeout)?))
            }
            EngineKind::Ipc => Mode::Ipc(Box::new(Mutex::new(Engine::new(ordinal)?))),
            EngineKind::Events => {
                let known: Vec<i32> = devices.iter().map(|&d| if d < 0 { ordinal } else { d }).collect();
                Mode::Ipc(Box::new(Mutex::new(Engine::local(ordinal, &known)?)))
            }
            EngineKind::Staged => Mode::Staged,
        };
        Ok(DevComm { comm, ordinal, mode })
    }

    /// The engine serving this communicator's device calls.
    pub fn engine(&self) -> EngineKind {
        match &self.mode {
            Mode::Threads(_) => EngineKind::Threads,
            Mode::Ipc(e) if e.lock().unwrap_or_else(|e| e.into_inner()).is_local() => EngineKind::Events,
            Mode::Ipc(_) => EngineKind::Ipc,
            Mode::Staged => EngineKind::Staged,
        }
    }

    /// Tells this rank's kernels, and the other ranks' that wait for them, to give up (the
    /// threads engine's kernels wait for one another on the GPU); for `ncclCommAbort`,
    /// before the engine is dropped. The other engines' kernels never wait on the GPU.
    pub fn abort(&self) {
        if let Mode::Threads(m) = &self.mode {
            m.abort();
        }
    }

    /// The device of this rank's buffers.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The thread group's member (threads engine only): its device, kernels and checks.
    pub fn member(&self) -> Option<&Member> {
        match &self.mode {
            Mode::Threads(m) => Some(m),
            _ => None,
        }
    }

    /// Enqueues `calls` (one group: collectives every rank makes alike and in order, sends
    /// and receives matched per pair in order) on `stream` (a `CUstream`; 0 is the legacy
    /// default stream). The results are visible to work enqueued on `stream` afterwards.
    pub fn run(&self, stream: usize, calls: &[DevCall]) -> Result<(), DevError> {
        let p = self.comm.size();
        if let Some(why) = calls.iter().find_map(|c| super::call::unsupported(c, p).map(|w| (c, w))) {
            return Err(CudaError::Invalid(format!(
                "rank {}: {}: {}",
                self.comm.rank(),
                why.0.describe(),
                why.1
            ))
            .into());
        }
        // Set-up calls (allocations, mappings) must not fail because some thread captures in
        // global mode (graph.rs, rule 3).
        let _relaxed = super::graph::Relaxed::new()?;
        let capturing = stream > 1 && super::graph::capturing(stream)?;
        match &self.mode {
            Mode::Threads(m) => {
                m.dev.make_current()?;
                let s = Stream::borrowed(&m.dev, stream as Handle);
                Ok(m.run_on(&s, calls, capturing)?)
            }
            Mode::Ipc(e) => {
                let mut e = e.lock().unwrap_or_else(|e| e.into_inner());
                if capturing {
                    return e.run_captured(self.comm, stream, calls);
                }
                let left = e.run(self.comm, stream, calls)?;
                drop(e);
                if left.is_empty() {
                    Ok(())
                } else {
                    staged(self.comm, self.ordinal, stream, &left)
                }
            }
            Mode::Staged if capturing => Err(CudaError::Invalid(format!(
                "rank {}: {} on a stream being captured into a CUDA graph: this communicator's device calls are staged through host memory ({}), which a graph cannot replay; run it outside the capture",
                self.comm.rank(),
                calls.iter().map(|c| c.describe()).collect::<Vec<_>>().join(", "),
                STAGED_WHY
            ))
            .into()),
            Mode::Staged => staged(self.comm, self.ordinal, stream, calls),
        }
    }

    /// Checks that the device engine has not failed (a kernel that gave up waiting names the
    /// rank it waited for); reads host memory only.
    pub fn check(&self) -> Result<(), DevError> {
        match &self.mode {
            Mode::Threads(m) => Ok(m.check()?),
            _ => Ok(self.comm.check()?),
        }
    }

    /// Waits until everything enqueued on `s` so far is done.
    pub fn sync(&self, s: &Stream) -> Result<(), DevError> {
        Ok(s.sync()?)
    }

    fn one(&self, s: &Stream, c: DevCall) -> Result<(), DevError> {
        self.run(s.h as usize, &[c])
    }

    /// All-reduce of `count` elements of `t` (device addresses; `send == recv` in place).
    pub fn all_reduce(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), DevError> {
        self.one(s, DevCall::coll(DeviceColl::AllReduce, t, op, count, send, recv))
    }

    pub fn broadcast(
        &self,
        s: &Stream,
        t: DataType,
        root: Rank,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), DevError> {
        self.one(s, DevCall::coll(DeviceColl::Broadcast(root.idx()), t, ReduceOp::Sum, count, send, recv))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        root: Rank,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), DevError> {
        self.one(s, DevCall::coll(DeviceColl::Reduce(root.idx()), t, op, count, send, recv))
    }

    /// `count` elements from every rank into every rank's `recv` (`count × size` elements).
    pub fn all_gather(
        &self,
        s: &Stream,
        t: DataType,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), DevError> {
        self.one(s, DevCall::coll(DeviceColl::AllGather, t, ReduceOp::Sum, count, send, recv))
    }

    /// Block r (`count` elements) of the element-wise reduction into rank r's `recv`.
    pub fn reduce_scatter(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), DevError> {
        self.one(s, DevCall::coll(DeviceColl::ReduceScatter, t, op, count, send, recv))
    }

    pub fn all_to_all(
        &self,
        s: &Stream,
        t: DataType,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), DevError> {
        self.one(s, DevCall::coll(DeviceColl::AllToAll, t, ReduceOp::Sum, count, send, recv))
    }

    pub fn gather(
        &self,
        s: &Stream,
        t: DataType,
        root: Rank,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), DevError> {
        self.one(s, DevCall::coll(DeviceColl::Gather(root.idx()), t, ReduceOp::Sum, count, send, recv))
    }

    pub fn scatter(
        &self,
        s: &Stream,
        t: DataType,
        root: Rank,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), DevError> {
        self.one(s, DevCall::coll(DeviceColl::Scatter(root.idx()), t, ReduceOp::Sum, count, send, recv))
    }

    pub fn send(&self, s: &Stream, t: DataType, peer: Rank, buf: u64, count: usize) -> Result<(), DevError> {
        self.one(s, DevCall::send(peer.idx(), t, count, buf))
    }

    pub fn recv(&self, s: &Stream, t: DataType, peer: Rank, buf: u64, count: usize) -> Result<(), DevError> {
        self.one(s, DevCall::recv(peer.idx(), t, count, buf))
    }
}

/// Bytes of a call's send and receive buffers on this rank.
fn lens(c: &DevCall, p: usize, rank: usize) -> (usize, usize) {
    match c.what {
        What::Coll(k) => device::buffer_bytes(k, c.count, c.t, p, rank),
        What::Send(_) => (c.bytes(), 0),
        What::Recv(_) => (0, c.bytes()),
    }
}

/// When device calls are staged.
const STAGED_WHY: &str = "ranks on several hosts, over 8 ranks, mixed threads and processes, threads on several devices without peer access, or OXCCL_CUDA_IPC=0";

/// Runs `calls` through host memory: the stream is synchronised, inputs (and outputs, so an
/// in-place layout keeps what the call does not write) copied to the host, the host group
/// run, outputs copied back and waited for.
fn staged(comm: &Communicator, ordinal: i32, stream: usize, calls: &[DevCall]) -> Result<(), DevError> {
    let (p, rank) = (comm.size(), comm.rank().idx());
    let on = super::stage::OnDevice::push(ordinal)?;
    on.sync(stream)?;
    let d = driver::driver()?;
    let down = |a: u64, n: usize| -> Result<Vec<u8>, CudaError> {
        let mut v = vec![0u8; n];
        if n > 0 {
            // SAFETY: `v` holds `n` bytes; the caller's device range holds `n` readable bytes
            // (NCCL's count rules), and the stream that wrote it is synchronised.
            d.check("cuMemcpyDtoH", unsafe { (d.memcpy_dtoh)(v.as_mut_ptr().cast(), a, n) })?;
        }
        Ok(v)
    };
    let mut bufs: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(calls.len());
    for c in calls {
        let (sl, rl) = lens(c, p, rank);
        let mut send = down(c.send, sl)?;
        if c.op == Kop::PreMulSum {
            let es = c.t.size_bytes();
            send = oxccl_core::premul::scaled(c.t, &c.scalar.to_le_bytes()[..es], &send);
        }
        bufs.push((send, down(c.recv, rl)?));
    }
    {
        let mut g = comm.group();
        for (c, (s, r)) in calls.iter().zip(bufs.iter_mut()) {
            let op = match c.op {
                Kop::Op(o) => o,
                Kop::PreMulSum => ReduceOp::Sum,
            };
            let t = c.t;
            match c.what {
                What::Coll(DeviceColl::AllReduce) => g.all_reduce_raw(t, s, r, op)?,
                What::Coll(DeviceColl::Broadcast(root)) => g.broadcast_raw(t, s, r, Rank::new(root))?,
                What::Coll(DeviceColl::Reduce(root)) => g.reduce_raw(t, s, r, op, Rank::new(root))?,
                What::Coll(DeviceColl::AllGather) => g.all_gather_raw(t, s, r)?,
                What::Coll(DeviceColl::ReduceScatter) => g.reduce_scatter_raw(t, s, r, op)?,
                What::Coll(DeviceColl::AllToAll) => g.all_to_all_raw(t, s, r)?,
                What::Coll(DeviceColl::Gather(root)) => g.gather_raw(t, s, r, Rank::new(root))?,
                What::Coll(DeviceColl::Scatter(root)) => g.scatter_raw(t, s, r, Rank::new(root))?,
                What::Send(q) => g.send_raw(t, s, Rank::new(q))?,
                What::Recv(q) => g.recv_raw(t, r, Rank::new(q))?,
            };
        }
        g.end()?;
    }
    for (c, (_, r)) in calls.iter().zip(&bufs) {
        if !r.is_empty() {
            // SAFETY: `r` holds the bytes of the call's receive range, which the caller provides
            // writable; the copy is waited for below, before `r` is freed.
            d.check("cuMemcpyHtoDAsync", unsafe {
                (d.memcpy_htod_async)(c.recv, r.as_ptr().cast(), r.len(), stream as Handle)
            })?;
        }
    }
    on.sync(stream)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_picks_the_same_engine_from_the_same_table() {
        let threads = [(7, 1, 0), (7, 1, 0), (7, 1, 0)];
        assert_eq!(choose(&threads, true), EngineKind::Threads);
        let procs = [(7, 1, 0), (8, 1, 0), (9, 1, 1)];
        assert_eq!(choose(&procs, true), EngineKind::Ipc);
        assert_eq!(choose(&procs, false), EngineKind::Staged);
        let hosts = [(7, 1, 0), (8, 2, 0)];
        assert_eq!(choose(&hosts, true), EngineKind::Staged);
        let mixed = [(7, 1, 0), (7, 1, 0), (8, 1, 0)];
        assert_eq!(choose(&mixed, true), EngineKind::Staged);
        let two_gpus_one_process = [(7, 1, 0), (7, 1, 1)];
        assert_eq!(choose(&two_gpus_one_process, true), EngineKind::Events);
        // Devices not told at init are taken to be the known ones; differing known ones stage.
        assert_eq!(choose(&[(7, 1, -1), (7, 1, 3), (7, 1, -1)], true), EngineKind::Threads);
        assert_eq!(choose(&[(7, 1, -1), (7, 1, -1)], true), EngineKind::Threads);
        assert_eq!(choose(&[(7, 1, 2), (7, 1, -1), (7, 1, 5)], true), EngineKind::Events);
        // Over 8 threads on several devices: staged.
        let nine_devs: Vec<(u32, u64, i32)> = (0..9).map(|i| (7, 1, i)).collect();
        assert_eq!(choose(&nine_devs, true), EngineKind::Staged);
        let nine: Vec<(u32, u64, i32)> = (0..9).map(|i| (i, 1, 0)).collect();
        assert_eq!(choose(&nine, true), EngineKind::Staged);
        assert_eq!(choose(&[(7, 1, 0)], true), EngineKind::Threads);
    }

    #[test]
    fn staged_buffers_follow_nccls_sizes() {
        let c = DevCall::coll(DeviceColl::Gather(1), DataType::F32, ReduceOp::Sum, 10, 1, 2);
        assert_eq!(lens(&c, 4, 1), (40, 160));
        assert_eq!(lens(&c, 4, 0), (40, 0));
        assert_eq!(lens(&DevCall::send(2, DataType::F64, 3, 1), 4, 0), (24, 0));
        assert_eq!(lens(&DevCall::recv(2, DataType::F64, 3, 1), 4, 0), (0, 24));
    }
}
