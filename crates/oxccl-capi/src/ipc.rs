//! AllReduce on device buffers between processes of one host by CUDA IPC: no host mirrors,
//! no proxy, nothing on the host waits for the GPU.
//!
//! Taken when a single ncclAllReduce (not in a group; an operator with a device kernel) has
//! both buffers in device memory on a communicator whose ranks are distinct processes of one
//! host — all things every rank decides alike, or sees alike in the exchange below. Per call:
//! 1. each rank records its interprocess `ready` event on the caller's stream and exports its
//!    buffers (allocation handle and offset);
//! 2. the ranks exchange that over the communicator (a host all-gather of [`Entry`]s); if any
//!    rank could not export (say, memory from cuMemCreate), every rank stages instead;
//! 3. each rank maps the others' buffers (cached), makes its stream wait on every `ready`,
//!    and launches one reduce-copy of its slice of every input into the same slice of every
//!    output (each input byte read once, each output byte written once), then records `done`;
//! 4. a second exchange says every `done` is recorded (and whether every rank launched); each
//!    stream then waits on every `done`, so work after the call sees the whole result.
//!
//! Events are re-recorded only after every peer has enqueued its waits on their previous
//! record (the exchanges order that). Kernels of processes sharing a GPU time-slice, so
//! nothing here spins on the GPU: the streams wait on events.

use super::{Call, Kind};
use crate::handle::{Fail, St, R, UNHANDLED_CUDA_ERROR};
use oxccl::cuda::driver::IpcHandle;
use oxccl::cuda::ipc::{self, Exported};
use oxccl::cuda::kernels::Kernels;
use oxccl::cuda::{CudaError, Device, Event, Stream};
use oxccl::{Communicator, DataType, ReduceOp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// What one rank tells the others per call (fixed layout, little-endian, [`ENTRY_BYTES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    ok: bool,
    bytes: u64,
    dtype: u8,
    op: u8,
    send: Exported,
    recv: Exported,
    ready: IpcHandle,
    done: IpcHandle,
}

const ENTRY_BYTES: usize = 16 + 4 * 64 + 16;

impl Entry {
    fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0] = self.ok as u8;
        b[1] = self.dtype;
        b[2] = self.op;
        b[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        let mut o = 16;
        for h in [&self.send.handle, &self.recv.handle, &self.ready, &self.done] {
            b[o..o + 64].copy_from_slice(&h.0);
            o += 64;
        }
        b[o..o + 8].copy_from_slice(&self.send.offset.to_le_bytes());
        b[o + 8..o + 16].copy_from_slice(&self.recv.offset.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Entry {
        let h = |o: usize| IpcHandle(b[o..o + 64].try_into().unwrap_or([0; 64]));
        let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let o = 16 + 4 * 64;
        Entry {
            ok: b[0] == 1,
            dtype: b[1],
            op: b[2],
            bytes: u(8),
            send: Exported { handle: h(16), offset: u(o) },
            recv: Exported { handle: h(16 + 64), offset: u(o + 8) },
            ready: h(16 + 128),
            done: h(16 + 192),
        }
    }
}

/// A communicator's IPC state on this rank.
struct State {
    ordinal: i32,
    dev: Device,
    kernels: Kernels,
    ready: Event,
    done: Event,
    ready_h: IpcHandle,
    done_h: IpcHandle,
    /// The other ranks' events, opened once, by handle.
    peers: HashMap<IpcHandle, Event>,
}

fn states() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<Mutex<State>>>> {
    static S: OnceLock<Mutex<HashMap<usize, Arc<Mutex<State>>>>> = OnceLock::new();
    S.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

fn state(st: St, ordinal: i32) -> Result<Arc<Mutex<State>>, CudaError> {
    if let Some(s) = states().get(&st.handle) {
        if s.lock().unwrap_or_else(|e| e.into_inner()).ordinal == ordinal {
            return Ok(s.clone());
        }
    }
    let dev = Device::open(ordinal)?;
    let kernels = Kernels::load(&dev, &[])?;
    let ready = Event::interprocess(&dev)?;
    let done = Event::interprocess(&dev)?;
    let (ready_h, done_h) = (ready.ipc_handle()?, done.ipc_handle()?);
    let s = Arc::new(Mutex::new(State {
        ordinal,
        dev,
        kernels,
        ready,
        done,
        ready_h,
        done_h,
        peers: HashMap::new(),
    }));
    states().insert(st.handle, s.clone());
    Ok(s)
}

/// Whether `c` on `comm` takes this path, decided from what every rank knows alike (the
/// communicator's processes and hosts) and what the call is; `ordinal` is the device of both
/// buffers.
pub fn eligible(comm: &Communicator, c: &Call, ordinal: Option<i32>) -> Option<(i32, ReduceOp)> {
    let Kind::AllReduce(op) = c.kind else { return None };
    let ordinal = ordinal?;
    if c.premul.is_some() || c.send_len == 0 || oxccl::cuda::kernels::reduce_name(c.dtype, op).is_none() {
        return None;
    }
    let peers = comm.peers();
    let one_host = peers.iter().all(|p| p.host_id == peers[0].host_id);
    let mut pids: Vec<u32> = peers.iter().map(|p| p.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    (one_host && pids.len() == peers.len() && peers.len() > 1).then_some((ordinal, op))
}

fn fail(c: &Call, what: &str, e: impl std::fmt::Display) -> Fail {
    Fail { code: UNHANDLED_CUDA_ERROR, msg: format!("{}: {what}: {e}", c.func) }
}

/// Elements per rank's slice: a multiple of 16 bytes' worth.
fn slice_len(count: usize, p: usize, elem: usize) -> usize {
    let align = (16 / elem).max(1);
    count.div_ceil(p).div_ceil(align) * align
}

/// A host all-gather of `mine` into `all` over `comm`.
fn gather(comm: &Communicator, c: &Call, mine: &[u8], all: &mut [u8]) -> R<()> {
    let mut g = comm.group();
    g.all_gather_raw(DataType::U8, mine, all).map_err(|e| Fail::from(e).with_func(c.func))?;
    g.end().map_err(|e| Fail::from(e).with_func(c.func))
}

/// Runs `c` by IPC; `Ok(false)` if some rank cannot (every rank then stages the call).
pub fn all_reduce(st: St, comm: &Communicator, c: &Call, ordinal: i32, op: ReduceOp) -> R<bool> {
    let p = comm.size();
    let rank = comm.rank().0 as usize;
    let stream = c.stream as oxccl::cuda::driver::Handle;
    let state = state(st, ordinal).map_err(|e| fail(c, "CUDA IPC set-up", e))?;
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    s.dev.make_current().map_err(|e| fail(c, "device context", e))?;
    // In place, both pointers name one range: the larger one's start.
    let (send_ptr, recv_ptr) = (c.send as u64, c.recv as u64);
    let exported = (|| Ok::<_, CudaError>((ipc::export(send_ptr)?, ipc::export(recv_ptr)?)))();
    let none = Exported { handle: IpcHandle([0; 64]), offset: 0 };
    let (se, re, ok) = match exported {
        Ok((a, b)) => (a, b, true),
        Err(_) => (none, none, false),
    };
    if ok {
        s.ready.record_raw(c.stream).map_err(|e| fail(c, "recording the ready event", e))?;
    }
    let me = Entry {
        ok,
        bytes: c.send_len as u64,
        dtype: c.dtype as u8,
        op: op as u8,
        send: se,
        recv: re,
        ready: s.ready_h,
        done: s.done_h,
    };
    let mut all = vec![0u8; ENTRY_BYTES * p];
    gather(comm, c, &me.encode(), &mut all)?;
    let all: Vec<Entry> = all.chunks(ENTRY_BYTES).map(Entry::decode).collect();
    if all.iter().any(|e| !e.ok) {
        return Ok(false);
    }
    if let Some(q) = all.iter().position(|e| (e.bytes, e.dtype, e.op) != (me.bytes, me.dtype, me.op)) {
        return Err(Fail {
            code: crate::handle::INVALID_USAGE,
            msg: format!(
                "{}: rank {rank} reduces {} bytes (type {}, op {}) but rank {q} {} bytes (type {}, op {})",
                c.func, me.bytes, me.dtype, me.op, all[q].bytes, all[q].dtype, all[q].op
            ),
        });
    }
    // Map, wait, launch, record; a failure here is told to the others at the second exchange.
    let State { dev, kernels, done, done_h, peers, .. } = &mut *s;
    let sref = Stream::borrowed(dev, stream);
    let launched = (|| -> Result<(), CudaError> {
        let mut srcs = Vec::with_capacity(p);
        let mut dsts = Vec::with_capacity(p);
        for (q, e) in all.iter().enumerate() {
            if q == rank {
                srcs.push(send_ptr);
                dsts.push(recv_ptr);
            } else {
                srcs.push(ipc::open(ordinal, &e.send)?);
                dsts.push(ipc::open(ordinal, &e.recv)?);
            }
        }
        for (q, e) in all.iter().enumerate() {
            if q != rank {
                for h in [e.ready, e.done] {
                    if let std::collections::hash_map::Entry::Vacant(v) = peers.entry(h) {
                        v.insert(Event::open_ipc(dev, h)?);
                    }
                }
                sref.wait(&peers[&e.ready])?;
            }
        }
        let elem = c.dtype.size_bytes();
        let count = c.send_len / elem;
        let per = slice_len(count, p, elem);
        let lo = (rank * per).min(count);
        let hi = ((rank + 1) * per).min(count);
        if hi > lo {
            let off = (lo * elem) as u64;
            let srcs: Vec<u64> = srcs.iter().map(|a| a + off).collect();
            let dsts: Vec<u64> = dsts.iter().map(|a| a + off).collect();
            kernels.reduce_multi(&sref, c.dtype, op, &srcs, &dsts, hi - lo)?;
        }
        done.record_raw(c.stream)
    })();
    if launched.is_err() {
        // The others wait on this rank's `done`: record it anyway so their streams go on.
        let _ = done.record_raw(c.stream);
    }
    let mine = [launched.is_ok() as u8];
    let mut flags = vec![0u8; p];
    gather(comm, c, &mine, &mut flags)?;
    if let Err(e) = launched {
        return Err(fail(c, &format!("rank {rank}: CUDA IPC all-reduce"), e));
    }
    if let Some(q) = flags.iter().position(|&f| f != 1) {
        return Err(Fail {
            code: UNHANDLED_CUDA_ERROR,
            msg: format!(
                "{}: rank {q} could not run its part of the CUDA IPC all-reduce (its error names why)",
                c.func
            ),
        });
    }
    for (q, e) in all.iter().enumerate() {
        if q != rank {
            sref.wait(&peers[&e.done]).map_err(|err| fail(c, "waiting on a peer's done event", err))?;
        }
    }
    let _ = done_h;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_their_bytes() {
        let mut h = [0u8; 64];
        for (i, x) in h.iter_mut().enumerate() {
            *x = i as u8;
        }
        let e = Entry {
            ok: true,
            bytes: 1 << 40,
            dtype: DataType::Bf16 as u8,
            op: ReduceOp::Max as u8,
            send: Exported { handle: IpcHandle(h), offset: 4096 },
            recv: Exported { handle: IpcHandle([7; 64]), offset: 12 },
            ready: IpcHandle([9; 64]),
            done: IpcHandle([11; 64]),
        };
        assert_eq!(Entry::decode(&e.encode()), e);
        let not = Entry { ok: false, ..e };
        assert_eq!(Entry::decode(&not.encode()), not);
    }

    #[test]
    fn slices_start_aligned_and_cover_the_buffer() {
        for p in 2..=8 {
            for count in [1usize, 5, 64, 1000, (1 << 20) + 3] {
                for elem in [1usize, 2, 4, 8] {
                    let per = slice_len(count, p, elem);
                    assert_eq!(per * elem % 16, 0);
                    assert!(per * p >= count);
                }
            }
        }
    }
}
