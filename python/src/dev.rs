//! CUDA tensors: a communicator's device engines (`oxccl::cuda::DevComm`, one per device),
//! calls enqueued on torch's current stream of the tensors' device.
//!
//! Rules: an engine borrows its communicator, whose `Arc` the entry holds and which outlives
//! it (declared after it, so dropped after it); the call returns once enqueued (the stream
//! orders it before later work on that stream, as NCCL's calls do).

use crate::errors::{raise, to_py};
use crate::ops::{Kind, Op};
use oxccl::cuda::call::DevCall;
use oxccl::cuda::{DevComm, DevError};
use oxccl_core::plan::device::DeviceColl;
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

struct Entry {
    /// Borrows `*comm` (lifetime erased to 'static; see `engine`).
    dc: DevComm<'static>,
    _comm: Arc<oxccl::Communicator>,
}

#[derive(Default)]
pub struct Devices(Mutex<HashMap<i32, Arc<Entry>>>);

fn dev_err(e: DevError) -> PyErr {
    match e {
        DevError::Comm(e) => to_py(e),
        DevError::Cuda(e) => raise("Error", format!("CUDA: {e}"), None, None),
    }
}

/// The device calls of one op.
fn calls(op: &Op, size: usize, out: &mut Vec<DevCall>) {
    let t = op.dtype;
    let recv = op.recv.map(|b| b.ptr as u64).unwrap_or(0);
    let send = if op.in_place { recv } else { op.send.map(|b| b.ptr as u64).unwrap_or(0) };
    let n = |b: Option<crate::buf::Buf>| b.map(|b| b.count()).unwrap_or(0);
    let c = |coll, op_, count| DevCall::coll(coll, t, op_, count, send, recv);
    let sum = oxccl::ReduceOp::Sum;
    let in_count = if op.in_place { n(op.recv) } else { n(op.send) };
    match &op.kind {
        Kind::AllReduce(o) => out.push(c(DeviceColl::AllReduce, *o, in_count)),
        Kind::Broadcast(r) => out.push(c(DeviceColl::Broadcast(r.idx()), sum, n(op.recv))),
        Kind::Reduce(o, r) => out.push(c(DeviceColl::Reduce(r.idx()), *o, in_count)),
        Kind::AllGather => out.push(c(DeviceColl::AllGather, sum, n(op.recv) / size)),
        Kind::ReduceScatter(o) => {
            let count = if op.in_place { n(op.recv) / size } else { n(op.recv) };
            out.push(c(DeviceColl::ReduceScatter, *o, count))
        }
        Kind::AllToAll => out.push(c(DeviceColl::AllToAll, sum, in_count / size)),
        Kind::Gather(r) => out.push(c(
            DeviceColl::Gather(r.idx()),
            sum,
            if op.in_place { n(op.recv) / size } else { n(op.send) },
        )),
        Kind::Scatter(r) => out.push(c(
            DeviceColl::Scatter(r.idx()),
            sum,
            if op.in_place { n(op.recv) / size } else { n(op.recv) },
        )),
        Kind::AllToAllV { send_counts, send_displs, recv_counts, recv_displs } => {
            let es = t.size_bytes() as u64;
            for p in 0..size {
                if send_counts[p] > 0 {
                    out.push(DevCall::send(p, t, send_counts[p], send + send_displs[p] as u64 * es));
                }
                if recv_counts[p] > 0 {
                    out.push(DevCall::recv(p, t, recv_counts[p], recv + recv_displs[p] as u64 * es));
                }
            }
        }
        Kind::Send(p) => out.push(DevCall::send(p.idx(), t, n(op.send), send)),
        Kind::Recv(p) => out.push(DevCall::recv(p.idx(), t, n(op.recv), recv)),
    }
}

impl Devices {
    fn engine(&self, comm: &Arc<oxccl::Communicator>, ordinal: i32) -> PyResult<Arc<Entry>> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = m.get(&ordinal) {
            return Ok(e.clone());
        }
        let dc = DevComm::new(comm, ordinal).map_err(dev_err)?;
        // SAFETY: `dc` borrows the Communicator behind `comm`'s Arc, whose address is stable;
        // the Entry holds a clone of that Arc and drops `dc` first (field order), so the
        // borrow never outlives the Communicator.
        let dc: DevComm<'static> = unsafe { std::mem::transmute::<DevComm<'_>, DevComm<'static>>(dc) };
        let e = Arc::new(Entry { dc, _comm: comm.clone() });
        m.insert(ordinal, e.clone());
        Ok(e)
    }

    /// Enqueues `ops` on torch's current stream of device `ordinal`.
    pub fn run(
        &self,
        py: Python<'_>,
        comm: &Arc<oxccl::Communicator>,
        ordinal: i32,
        ops: &[Op],
    ) -> PyResult<()> {
        let e = self.engine(comm, ordinal)?;
        let torch = py.import("torch")?;
        let stream: usize = torch
            .getattr("cuda")?
            .call_method1("current_stream", (ordinal,))?
            .getattr("cuda_stream")?
            .extract()?;
        let mut cs = Vec::new();
        for op in ops {
            calls(op, comm.size(), &mut cs);
        }
        py.detach(|| e.dc.run(stream, &cs)).map_err(dev_err)
    }

    pub fn abort(&self) {
        for e in self.0.lock().unwrap_or_else(|e| e.into_inner()).values() {
            e.dc.abort();
        }
        self.close();
    }

    pub fn close(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
