//! Calls whose buffers are all device memory of one device, on one stream: run by the device
//! engine the communicator's ranks allow (`oxccl::cuda::DevComm`: ranks as threads of this
//! process, or processes of this host by CUDA IPC); anything else is staged.

use super::call::{Call, Kind};
use crate::fail::{code_of, Fail, INVALID_USAGE, R, UNHANDLED_CUDA_ERROR};
use crate::handle::{CommState, PreMul, Scalar};
use oxccl::cuda::call::DevCall;
use oxccl::cuda::comm::EngineKind;
use oxccl::cuda::stage::MemKind;
use oxccl::cuda::{DevComm, DevError};
use oxccl::Communicator;
use oxccl_core::plan::device::DeviceColl;

fn fail(func: &str, e: DevError) -> Fail {
    let code = match &e {
        DevError::Cuda(oxccl::cuda::CudaError::Invalid(_)) => INVALID_USAGE,
        DevError::Cuda(_) => UNHANDLED_CUDA_ERROR,
        DevError::Comm(c) => code_of(c),
    };
    Fail { code, msg: format!("{func}: {e}") }
}

fn dev_call(c: &Call) -> Option<DevCall> {
    // A buffer this rank does not use (a non-root's send of a broadcast, say) is left out:
    // nccl.h lets it be anything.
    let s = if c.send_len > 0 { c.send as u64 } else { 0 };
    let r = if c.recv_len > 0 { c.recv as u64 } else { 0 };
    let t = c.dtype;
    let n = c.count;
    let scalar = match c.premul.as_deref() {
        None => None,
        Some(PreMul { scalar: Scalar::Value(v), .. }) => {
            let mut b = [0u8; 8];
            b[..v.len().min(8)].copy_from_slice(&v[..v.len().min(8)]);
            Some(u64::from_le_bytes(b))
        }
        // A scalar behind a pointer is read when the call runs: staged.
        Some(_) => return None,
    };
    let coll = |k: DeviceColl, op: oxccl::ReduceOp| match scalar {
        Some(v) => DevCall::premul(k, t, v, n, s, r),
        None => DevCall::coll(k, t, op, n, s, r),
    };
    let sum = oxccl::ReduceOp::Sum;
    Some(match c.kind {
        Kind::Send(peer) => DevCall::send(peer.idx(), t, n, s),
        Kind::Recv(peer) => DevCall::recv(peer.idx(), t, n, r),
        k => {
            let root = k.root().map_or(0, |r| r.idx());
            coll(DeviceColl::of(k.collective(), root)?, k.op().unwrap_or(sum))
        }
    })
}

/// Runs `calls` by the device engine; `None` if they are to be staged.
pub fn run(
    st: &'static CommState,
    comm: &'static Communicator,
    calls: &[Call],
    kinds: &[(MemKind, MemKind, Option<MemKind>)],
) -> Option<R<()>> {
    let stream = calls[0].stream;
    if calls.iter().any(|c| c.stream != stream) {
        return None;
    }
    let mut ordinal = None;
    for (c, &(sk, rk, pk)) in calls.iter().zip(kinds) {
        if pk.is_some() {
            return None;
        }
        for (k, used) in [(sk, c.send_len > 0), (rk, c.recv_len > 0)] {
            match (k, used) {
                (_, false) => {}
                (MemKind::Device { ordinal: o }, true) if *ordinal.get_or_insert(o) == o => {}
                _ => return None,
            }
        }
    }
    let ordinal = ordinal?;
    let dev_calls: Vec<DevCall> = calls.iter().map(dev_call).collect::<Option<_>>()?;
    let func = calls[0].func;
    let dc = match st.dev_engine(|| DevComm::new(comm, ordinal).map_err(|e| fail(func, e))) {
        Ok(d) => d,
        Err(f) => return Some(Err(f)),
    };
    if dc.ordinal() != ordinal || (dc.engine() == EngineKind::Staged) {
        return None;
    }
    if st.proxy.pending() > 0 {
        st.proxy.drain();
    }
    if let Err(e) = st.proxy.check() {
        return Some(Err(e));
    }
    Some(dc.run(stream, &dev_calls).map_err(|e| fail(func, e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl::cuda::call::What;
    use oxccl::cuda::kernels::Kop;
    use oxccl::{DataType, Rank, ReduceOp};

    fn call(kind: Kind, send: usize, recv: usize, lens: (usize, usize), count: usize) -> Call {
        Call {
            func: "test",
            kind,
            dtype: DataType::F32,
            send: send as *const u8,
            recv: recv as *mut u8,
            send_len: lens.0,
            recv_len: lens.1,
            in_place: send == recv,
            count,
            premul: None,
            stream: 0,
        }
    }

    /// nccl.h's calls become the device engines' calls: NCCL's count, the collective and
    /// its root, buffers a rank does not use left out, PreMulSum's immediate scalar by
    /// value (a scalar behind a pointer is staged).
    #[test]
    fn calls_map_to_device_calls() {
        let c = dev_call(&call(Kind::AllReduce(ReduceOp::Max), 0x100, 0x100, (40, 40), 10)).unwrap();
        assert_eq!(
            (c.what, c.op, c.count, c.send, c.recv),
            (What::Coll(DeviceColl::AllReduce), Kop::Op(ReduceOp::Max), 10, 0x100, 0x100)
        );
        // A non-root broadcast's send buffer is not used: left out whatever it points at.
        let c = dev_call(&call(Kind::Broadcast(Rank::new(2)), 0xdead, 0x200, (0, 40), 10)).unwrap();
        assert_eq!((c.what, c.send, c.recv), (What::Coll(DeviceColl::Broadcast(2)), 0, 0x200));
        // A non-root reduce has no output.
        let c =
            dev_call(&call(Kind::Reduce(ReduceOp::Sum, Rank::new(0)), 0x300, 0xbeef, (40, 0), 10)).unwrap();
        assert_eq!((c.what, c.send, c.recv), (What::Coll(DeviceColl::Reduce(0)), 0x300, 0));
        let c = dev_call(&call(Kind::Recv(Rank::new(3)), 0, 0x400, (0, 12), 3)).unwrap();
        assert_eq!((c.what, c.count, c.recv), (What::Recv(3), 3, 0x400));
        let mut pm = call(Kind::ReduceScatter(ReduceOp::Sum), 0x500, 0x600, (160, 40), 10);
        pm.premul = Some(Box::new(PreMul {
            dtype: DataType::F32,
            scalar: Scalar::Value(2.5f32.to_le_bytes().to_vec()),
        }));
        let c = dev_call(&pm).unwrap();
        assert_eq!((c.op, c.scalar), (Kop::PreMulSum, 2.5f32.to_bits() as u64));
        pm.premul = Some(Box::new(PreMul { dtype: DataType::F32, scalar: Scalar::Pointer(0x700) }));
        assert!(dev_call(&pm).is_none(), "a scalar read when the call runs is staged");
    }
}
