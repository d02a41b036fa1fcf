//! CUDA IPC: device memory of one process mapped into another (same GPU, or a peer GPU), and
//! the device engine of ranks that are processes of one host ([`Engine`]).
//!
//! A buffer is exported as its allocation's handle and its offset in that allocation
//! (`cuMemGetAddressRange`, `cuIpcGetMemHandle`, remembered by the driver's buffer id); the importer opens each allocation once
//! (`cuIpcOpenMemHandle` with lazy peer access) and keeps the mapping for the life of the
//! process, keyed by the handle's bytes (a new allocation at a reused address has new bytes,
//! so a stale mapping is never used for it). Memory from the virtual memory API
//! (`cuMemCreate`) has no legacy IPC handle: exporting it fails and the caller stages instead.

use super::call::{self, DevCall, What};
use super::driver::{self, CuDevicePtr, IpcHandle};
use super::kernels::{Kernels, Kop, Sync};
use super::{CudaError, DevError, Device, Event, Stream};
use crate::Communicator;
use oxccl_core::contract::CallKind;
use oxccl_core::plan::device::{self, Bufs, Task};
use oxccl_core::{DataType, Rank, ReduceOp};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

mod captured;
mod records;
use records::{check_recv, coll_table};

/// A buffer as another process can open it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exported {
    pub handle: IpcHandle,
    /// Bytes from the allocation's start to the buffer's.
    pub offset: u64,
}

/// Allocations exported so far, by the driver's buffer id (unique for the life of the
/// process, never reused, so a freed allocation's entry is never taken for a new one):
/// `(base address, handle)`. `cuIpcGetMemHandle` costs far more than the id lookup.
fn exports() -> std::sync::MutexGuard<'static, HashMap<u64, (CuDevicePtr, IpcHandle)>> {
    static E: OnceLock<Mutex<HashMap<u64, (CuDevicePtr, IpcHandle)>>> = OnceLock::new();
    E.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// Entries [`exports`] keeps before it starts afresh.
const EXPORTS_KEEP: usize = 4096;

/// Exports the device buffer at `ptr` (a context of its device current).
pub fn export(ptr: CuDevicePtr) -> Result<Exported, CudaError> {
    let d = driver::driver()?;
    const BUFFER_ID: i32 = 7;
    let mut id = 0u64;
    // SAFETY: CU_POINTER_ATTRIBUTE_BUFFER_ID is a 64-bit value written into `id`.
    d.check("cuPointerGetAttribute", unsafe {
        (d.pointer_attr)((&mut id as *mut u64).cast(), BUFFER_ID, ptr)
    })?;
    if let Some(&(base, handle)) = exports().get(&id) {
        return Ok(Exported { handle, offset: ptr - base });
    }
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: writes the base and size of the allocation holding `ptr`.
    d.check("cuMemGetAddressRange", unsafe { (d.mem_get_address_range)(&mut base, &mut size, ptr) })?;
    let mut handle = IpcHandle([0; 64]);
    // SAFETY: `base` starts a cuMemAlloc allocation (else the driver refuses); writes 64 bytes.
    d.check("cuIpcGetMemHandle", unsafe { (d.ipc_get_mem_handle)(&mut handle, base) })?;
    let mut e = exports();
    if e.len() >= EXPORTS_KEEP {
        e.clear();
    }
    e.insert(id, (base, handle));
    Ok(Exported { handle, offset: ptr - base })
}

fn mappings() -> std::sync::MutexGuard<'static, HashMap<(i32, IpcHandle), CuDevicePtr>> {
    static M: OnceLock<Mutex<HashMap<(i32, IpcHandle), CuDevicePtr>>> = OnceLock::new();
    M.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The address, in this process on device `ordinal` (its context current), of another
/// process's exported buffer; the allocation is opened at first use and kept.
pub fn open(ordinal: i32, e: &Exported) -> Result<CuDevicePtr, CudaError> {
    if let Some(&base) = mappings().get(&(ordinal, e.handle)) {
        return Ok(base + e.offset);
    }
    let d = driver::driver()?;
    let mut base = 0u64;
    const LAZY_ENABLE_PEER_ACCESS: u32 = 1;
    // SAFETY: writes one device address; the handle came from cuIpcGetMemHandle elsewhere.
    d.check("cuIpcOpenMemHandle", unsafe {
        (d.ipc_open_mem_handle)(&mut base, e.handle, LAZY_ENABLE_PEER_ACCESS)
    })?;
    mappings().insert((ordinal, e.handle), base);
    Ok(base + e.offset)
}

/// The device engine of ranks that are distinct processes of one host (at most
/// [`device::MAX_RANKS`]): every collective and send/receive runs as reduce-copy kernels over
/// the other ranks' buffers mapped by CUDA IPC. No host mirrors, no proxy; kernels of
/// processes sharing a GPU time-slice, so nothing spins on the GPU: streams wait on
/// interprocess events. Per group of calls:
/// 1. each rank records its `ready` events on the caller's stream (the communicator's, for
///    collectives; one per peer it sends to) and exports its buffers;
/// 2. one host exchange: an all-gather of the collectives' records (buffers, descriptions,
///    events); each send's record to its receiver, and the receiver's answer (its per-pair
///    `done` event); a rank whose buffer could not be exported says so, and every rank then
///    leaves the collectives to the caller (staged through host memory), or fails the send
///    and its receive alike;
/// 3. each rank maps the buffers it needs (cached), makes its stream wait on the `ready`
///    events of the ranks it reads or writes, launches its tasks, and records its `done`
///    events;
/// 4. a second exchange says every `done` is recorded (all-gather for collectives; receiver
///    to sender for sends); each stream then waits on the `done` events of the ranks that
///    touched its buffers, so work after the call sees the results and may reuse the inputs.
///
/// An event is re-recorded only after every rank that waits on it has enqueued that wait:
/// the collectives' pair by the all-gathers (every rank is in the next group's first one
/// before anyone records again), the per-pair ones by the pair's own exchanges (a pair's
/// events serve that pair only).
///
/// The same protocol serves ranks that are threads of one process on several devices
/// ([`Engine::local`]): buffers travel as their addresses (one address space; each device's
/// context has peer access to the others'), events as their handles (waited on across
/// devices, no IPC), and the peers' events are never opened or destroyed here (the rank that
/// owns one keeps it alive; it is waited on only while that rank is in the same call).
pub struct Engine {
    ordinal: i32,
    dev: Device,
    /// Ranks are threads of this process (addresses and event handles are exchanged as they
    /// are); the devices opened for peer access are kept here.
    local: Option<Vec<Device>>,
    kernels: Kernels,
    ready: Event,
    done: Event,
    /// Per peer: (`ready` for sends to it, `done` for receives from it).
    pair: HashMap<usize, (Event, Event)>,
    /// Other ranks' events, opened once, by handle.
    peers: HashMap<IpcHandle, Event>,
    /// The GPU meeting of captured calls, once made (`captured.rs`).
    board: Option<captured::Board>,
}

/// A collective's record in the exchange (fixed layout, little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CollRec {
    ok: bool,
    call: DevCall,
    send: Exported,
    recv: Exported,
}

const HANDLE: usize = 64;
/// Bytes of a collective record: flags, the call, two exported buffers.
const COLL_REC: usize = 48 + 2 * (HANDLE + 8);
/// Bytes of a send's record: the call's type and count, the buffer, the pair's ready event.
const SEND_REC: usize = 16 + (HANDLE + 8) + HANDLE;

fn put_exported(b: &mut [u8], e: &Exported) {
    b[..HANDLE].copy_from_slice(&e.handle.0);
    b[HANDLE..HANDLE + 8].copy_from_slice(&e.offset.to_le_bytes());
}

fn get_exported(b: &[u8]) -> Exported {
    Exported {
        handle: IpcHandle(b[..HANDLE].try_into().unwrap_or([0; HANDLE])),
        offset: u64::from_le_bytes(b[HANDLE..HANDLE + 8].try_into().unwrap_or([0; 8])),
    }
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]))
}

/// A collective's description as bytes: kind, root, type, operator, count, scalar.
fn put_call(b: &mut [u8], c: &DevCall) {
    let (kind, root) = match c.what {
        // The contract check's codes (never 0, which marks no call).
        What::Coll(x) => (CallKind::from(x.collective()) as u8, x.root().unwrap_or(0) as u32),
        _ => (0, 0),
    };
    b[0] = kind;
    b[1] = c.t as u8;
    let (op, premul) = match c.op {
        Kop::Op(o) => (o as u8, 0u8),
        Kop::PreMulSum => (0, 1),
    };
    b[2] = op;
    b[3] = premul;
    b[4..8].copy_from_slice(&root.to_le_bytes());
    b[8..16].copy_from_slice(&(c.count as u64).to_le_bytes());
    b[16..24].copy_from_slice(&c.scalar.to_le_bytes());
}

fn get_call(b: &[u8]) -> Option<DevCall> {
    let root = u32::from_le_bytes(b[4..8].try_into().ok()?) as usize;
    let kind = CallKind::from_u8(b[0])?.collective()?;
    let what = What::Coll(device::DeviceColl::of(kind, root)?);
    let t = DataType::from_nccl(b[1] as i32)?;
    let op = if b[3] == 1 { Kop::PreMulSum } else { Kop::Op(ReduceOp::from_nccl(b[2] as i32)?) };
    Some(DevCall { what, t, op, scalar: u64_at(b, 16), count: u64_at(b, 8) as usize, send: 0, recv: 0 })
}

impl CollRec {
    fn encode(&self, b: &mut [u8]) {
        b[24] = self.ok as u8;
        put_call(b, &self.call);
        put_exported(&mut b[48..], &self.send);
        put_exported(&mut b[48 + HANDLE + 8..], &self.recv);
    }

    fn decode(b: &[u8]) -> Option<CollRec> {
        Some(CollRec {
            ok: b[24] == 1,
            call: get_call(b)?,
            send: get_exported(&b[48..]),
            recv: get_exported(&b[48 + HANDLE + 8..]),
        })
    }
}

fn comm_err(e: crate::Error) -> DevError {
    DevError::Comm(e)
}

const NO_EXPORT: Exported = Exported { handle: IpcHandle([0; 64]), offset: 0 };

/// The handle of a buffer exported by address (ranks that are threads of one process).
const LOCAL: IpcHandle = {
    let mut h = [0u8; 64];
    h[0] = 1;
    IpcHandle(h)
};

/// Event `e` as the other ranks wait on it: its IPC handle, or (`local`) its handle's value.
fn event_id(local: bool, e: &Event) -> Result<IpcHandle, CudaError> {
    if !local {
        return e.ipc_handle();
    }
    let mut h = [0u8; 64];
    h[..8].copy_from_slice(&(e.h as usize as u64).to_le_bytes());
    Ok(IpcHandle(h))
}

impl Engine {
    /// The engine of this process on device `ordinal` (its primary context).
    pub fn new(ordinal: i32) -> Result<Engine, CudaError> {
        Self::on(Device::open(ordinal)?, None)
    }

    /// The engine of a rank that is a thread of this process on device `ordinal`, the other
    /// ranks on `devices` (each a thread of this process): peer access to each of them is
    /// enabled for this device's context.
    pub fn local(ordinal: i32, devices: &[i32]) -> Result<Engine, CudaError> {
        let mut peers = Vec::new();
        for &o in devices {
            if o != ordinal && !peers.iter().any(|d: &Device| d.ordinal == o) {
                peers.push(Device::open(o)?);
            }
        }
        let dev = Device::open(ordinal)?;
        for p in &peers {
            super::enable_peer_access(&dev, p)?;
        }
        Self::on(dev, Some(peers))
    }

    /// The engine on `dev`: its kernels, and its events (interprocess unless `local`).
    fn on(dev: Device, local: Option<Vec<Device>>) -> Result<Engine, CudaError> {
        let kernels = Kernels::load(&dev, &[])?;
        let make = if local.is_some() { Event::sync_only } else { Event::interprocess };
        let (ready, done) = (make(&dev)?, make(&dev)?);
        Ok(Engine {
            ordinal: dev.ordinal,
            dev,
            local,
            kernels,
            ready,
            done,
            pair: HashMap::new(),
            peers: HashMap::new(),
            board: None,
        })
    }

    /// Device buffer `a` as the other ranks open it.
    fn export_buf(&self, a: u64) -> Result<Exported, CudaError> {
        match (a, &self.local) {
            (0, _) => Ok(NO_EXPORT),
            (a, Some(_)) => Ok(Exported { handle: LOCAL, offset: a }),
            (a, None) => export(a),
        }
    }

    /// Another rank's buffer, as this rank's kernels address it (0: none).
    fn open_buf(&self, e: &Exported) -> Result<u64, CudaError> {
        match &self.local {
            _ if e.handle == NO_EXPORT.handle => Ok(0),
            Some(_) => Ok(e.offset),
            None => open(self.ordinal, e),
        }
    }

    /// Makes `s` wait for another rank's event, given as [`event_id`] made it.
    fn wait_peer(&mut self, s: &Stream, h: IpcHandle) -> Result<(), CudaError> {
        if self.local.is_some() {
            let raw = u64::from_le_bytes(h.0[..8].try_into().unwrap_or([0; 8]));
            return s.wait_raw(raw as usize);
        }
        let e = self.peer_event(h)?;
        s.wait(e)
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Whether the ranks are threads of this process ([`Engine::local`]).
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    fn pair(&mut self, q: usize) -> Result<&(Event, Event), CudaError> {
        if !self.pair.contains_key(&q) {
            let make = if self.local.is_some() { Event::sync_only } else { Event::interprocess };
            let e = (make(&self.dev)?, make(&self.dev)?);
            self.pair.insert(q, e);
        }
        Ok(&self.pair[&q])
    }

    fn peer_event(&mut self, h: IpcHandle) -> Result<&Event, CudaError> {
        if let std::collections::hash_map::Entry::Vacant(v) = self.peers.entry(h) {
            v.insert(Event::open_ipc(&self.dev, h)?);
        }
        Ok(&self.peers[&h])
    }

    /// Runs `calls` (one rank's group) on `stream`; returns the collectives it left to the
    /// caller because some rank could not export a buffer (every rank leaves the same ones).
    pub fn run(
        &mut self,
        comm: &Communicator,
        stream: usize,
        calls: &[DevCall],
    ) -> Result<Vec<DevCall>, DevError> {
        let p = comm.size();
        let rank = comm.rank().idx();
        self.dev.make_current()?;
        let sref = Stream::borrowed(&self.dev, stream as driver::Handle);
        let colls: Vec<DevCall> = calls.iter().filter(|c| c.collective().is_some()).copied().collect();
        let sends: Vec<DevCall> = calls.iter().filter(|c| matches!(c.what, What::Send(_))).copied().collect();
        let recvs: Vec<DevCall> = calls.iter().filter(|c| matches!(c.what, What::Recv(_))).copied().collect();
        // 1. Ready events and exports.
        let local = self.local.is_some();
        let mut mine = vec![0u8; COLL_REC * colls.len() + 2 * HANDLE];
        self.put_coll_records(&colls, &mut mine);
        let o = COLL_REC * colls.len();
        if !colls.is_empty() {
            self.ready.record_raw(stream)?;
            mine[o..o + HANDLE].copy_from_slice(&event_id(local, &self.ready)?.0);
            mine[o + HANDLE..o + 2 * HANDLE].copy_from_slice(&event_id(local, &self.done)?.0);
        }
        let mut send_recs = Vec::with_capacity(sends.len());
        for c in &sends {
            let What::Send(q) = c.what else { continue };
            let mut b = self.send_record(c);
            let ready = &self.pair(q)?.0;
            ready.record_raw(stream)?;
            let h = event_id(local, ready)?;
            b[16 + HANDLE + 8..].copy_from_slice(&h.0);
            send_recs.push(b);
        }
        let mut answers: Vec<Vec<u8>> = Vec::with_capacity(recvs.len());
        for c in &recvs {
            let What::Recv(q) = c.what else { continue };
            answers.push(event_id(local, &self.pair(q)?.1)?.0.to_vec());
        }
        // 2. The first exchange.
        let mut all = vec![0u8; mine.len() * p];
        let mut got_recs = vec![vec![0u8; SEND_REC]; recvs.len()];
        let mut got_answers = vec![vec![0u8; HANDLE]; sends.len()];
        {
            let mut g = comm.group();
            // Per direction of a pair, every send's record comes before every answer, on both
            // sides (a pair may send both ways in one group).
            records::trade_records(
                &mut g,
                (&mine, &mut all, !colls.is_empty()),
                &sends,
                &send_recs,
                &recvs,
                &mut got_recs,
            )?;
            for (c, ans) in recvs.iter().zip(&answers) {
                let What::Recv(q) = c.what else { continue };
                g.send_raw(DataType::U8, ans, Rank::new(q)).map_err(comm_err)?;
            }
            for (c, ans) in sends.iter().zip(got_answers.iter_mut()) {
                let What::Send(q) = c.what else { continue };
                g.recv_raw(DataType::U8, ans, Rank::new(q)).map_err(comm_err)?;
            }
            g.end().map_err(comm_err)?;
        }
        // Collectives: every rank's records, checked alike everywhere.
        let mut table: Vec<Vec<CollRec>> = Vec::new();
        let mut coll_events: Vec<(IpcHandle, IpcHandle)> = Vec::new();
        let mut left = Vec::new();
        if !colls.is_empty() {
            table = coll_table(rank, &colls, &all, mine.len())?;
            for b in all.chunks(mine.len()) {
                let h = |o: usize| IpcHandle(b[o..o + HANDLE].try_into().unwrap_or([0; HANDLE]));
                coll_events.push((h(o), h(o + HANDLE)));
            }
            if table.iter().any(|recs| recs.iter().any(|r| !r.ok)) {
                left = colls.clone();
            }
        }
        // 3. Map, wait, launch, record.
        let launched =
            self.launch(rank, p, &sref, &colls, &left, &table, &coll_events, &sends, &recvs, &got_recs);
        // Whatever happened, the events others wait on are recorded, so their streams go on.
        if !colls.is_empty() && left.is_empty() {
            let _ = self.done.record_raw(stream);
        }
        for c in &recvs {
            if let What::Recv(q) = c.what {
                let _ = self.pair(q).map(|e| e.1.record_raw(stream));
            }
        }
        // 4. The second exchange: every `done` is recorded (and whether the launch worked).
        let flag = [launched.is_ok() as u8];
        let mut flags = vec![0u8; p];
        let mut send_flags = vec![[0u8; 1]; sends.len()];
        {
            let mut g = comm.group();
            if !colls.is_empty() && left.is_empty() {
                g.all_gather_raw(DataType::U8, &flag, &mut flags).map_err(comm_err)?;
            }
            for (c, f) in sends.iter().zip(send_flags.iter_mut()) {
                let What::Send(q) = c.what else { continue };
                g.recv_raw(DataType::U8, f, Rank::new(q)).map_err(comm_err)?;
            }
            for c in &recvs {
                let What::Recv(q) = c.what else { continue };
                g.send_raw(DataType::U8, &flag, Rank::new(q)).map_err(comm_err)?;
            }
            g.end().map_err(comm_err)?;
        }
        launched?;
        if !colls.is_empty() && left.is_empty() {
            if let Some(q) = flags.iter().position(|&f| f != 1) {
                return Err(CudaError::Invalid(format!(
                    "rank {rank}: rank {q} could not launch its part of the collectives (its error says why)"
                ))
                .into());
            }
            for (q, &(_, done)) in coll_events.iter().enumerate() {
                if q != rank {
                    self.wait_peer(&sref, done)?;
                }
            }
        }
        for (c, ans) in sends.iter().zip(&got_answers) {
            let What::Send(q) = c.what else { continue };
            let h = IpcHandle(ans[..HANDLE].try_into().unwrap_or([0; HANDLE]));
            if q != rank {
                self.wait_peer(&sref, h)?;
            }
        }
        for (c, f) in sends.iter().zip(&send_flags) {
            if let (What::Send(q), 0) = (c.what, f[0]) {
                return Err(CudaError::Invalid(format!(
                    "rank {rank}: {}: rank {q} could not receive it (its error says why)",
                    c.describe()
                ))
                .into());
            }
        }
        Ok(left)
    }

    /// Step 3: waits on the ready events, launches this rank's tasks, records nothing (the
    /// caller records the done events whatever this returns).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        rank: usize,
        p: usize,
        s: &Stream,
        colls: &[DevCall],
        left: &[DevCall],
        table: &[Vec<CollRec>],
        coll_events: &[(IpcHandle, IpcHandle)],
        sends: &[DevCall],
        recvs: &[DevCall],
        got_recs: &[Vec<u8>],
    ) -> Result<(), DevError> {
        let mut coll_tasks = Vec::new();
        if !colls.is_empty() && left.is_empty() {
            for (q, &(ready, _)) in coll_events.iter().enumerate() {
                if q != rank {
                    self.wait_peer(s, ready)?;
                }
            }
            for (i, c) in colls.iter().enumerate() {
                coll_tasks.push(self.coll_tasks(rank, table, i, c)?);
            }
        }
        // Sends to itself pair with receives from itself, in order, on local addresses.
        let mut own_sends = sends.iter().filter(|c| c.what == What::Send(rank)).map(|c| c.send);
        let mut tasks = Vec::new();
        for (c, rec) in recvs.iter().zip(got_recs) {
            let What::Recv(q) = c.what else { continue };
            let own = if q == rank { own_sends.next() } else { None };
            check_recv(rank, q, c, rec, "set OXCCL_CUDA_IPC=0 to stage device calls through host memory")?;
            if c.bytes() == 0 {
                continue;
            }
            let src = match own {
                Some(a) => a,
                None => {
                    let ready = IpcHandle(
                        rec[16 + HANDLE + 8..16 + 2 * HANDLE + 8].try_into().unwrap_or([0; HANDLE]),
                    );
                    self.wait_peer(s, ready)?;
                    self.open_buf(&get_exported(&rec[16..]))?
                }
            };
            tasks.push(Task::copy(src, vec![c.recv], c.bytes()));
        }
        let units = call::collective_units(&coll_tasks, p);
        let p2p_units = call::p2p_units(tasks, false);
        for u in units.iter().chain(&p2p_units) {
            let (t, op) = u.kernel();
            let div = if op == Kop::Op(ReduceOp::Avg) { p as u32 } else { 0 };
            self.kernels.run(s, t, op, &u.tasks, u.scalar, div, self.kernels.blocks, &Sync::default())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_records_round_trip_through_their_bytes() {
        let mut h = [0u8; 64];
        for (i, x) in h.iter_mut().enumerate() {
            *x = i as u8;
        }
        for call in [
            DevCall::coll(device::DeviceColl::Reduce(5), DataType::Bf16, ReduceOp::Max, 1 << 40, 0, 0),
            DevCall::premul(device::DeviceColl::ReduceScatter, DataType::F16, 0x3c00, 77, 0, 0),
            DevCall::coll(device::DeviceColl::AllToAll, DataType::U8, ReduceOp::Sum, 3, 0, 0),
        ] {
            let r = CollRec {
                ok: true,
                call,
                send: Exported { handle: IpcHandle(h), offset: 4096 },
                recv: Exported { handle: IpcHandle([7; 64]), offset: 12 },
            };
            let mut b = vec![0u8; COLL_REC];
            r.encode(&mut b);
            let back = CollRec::decode(&b).unwrap();
            assert_eq!(back, r);
            assert!(back.call.agrees(&call));
        }
    }
}
