//! Per-benchmark facts (nccl-tests' counts, in-place layouts and bus-bandwidth factors), the
//! call each benchmark makes, and its expected result.

use crate::args::Bench;
use oxccl::{Communicator, DataType, Rank, ReduceOp, Result};
use oxccl_testkit::verify::{expected_reduction, input, Use};

/// Element counts of one size (nccl-tests' `GetCollByteCount`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub send: usize,
    pub recv: usize,
    /// The count the API call takes (per rank for block collectives).
    pub param: usize,
}

/// Counts for `bytes` of `dtype` on `nranks` ranks.
pub fn counts(bench: Bench, bytes: usize, dtype: DataType, nranks: usize) -> Counts {
    let es = dtype.size_bytes();
    let count = bytes / es;
    // nccl-tests rounds per-rank blocks down to 16-byte multiples.
    let base = (count / nranks) & !(16 / es - 1);
    match bench {
        Bench::AllReduce | Bench::Broadcast | Bench::Reduce | Bench::SendRecv => {
            Counts { send: count, recv: count, param: count }
        }
        Bench::AllGather | Bench::HyperCube | Bench::Gather => {
            Counts { send: base, recv: base * nranks, param: base }
        }
        Bench::ReduceScatter | Bench::Scatter => Counts { send: base * nranks, recv: base, param: base },
        Bench::AllToAll => Counts { send: base * nranks, recv: base * nranks, param: base },
    }
}

/// (algbw, busbw) in GB/s for `param` elements moved in `sec` seconds.
pub fn bandwidth(bench: Bench, param: usize, dtype: DataType, sec: f64, nranks: usize) -> (f64, f64) {
    let p = nranks as f64;
    let bytes = (param * dtype.size_bytes()) as f64;
    let (base, factor) = match bench {
        Bench::AllReduce => (bytes, 2.0 * (p - 1.0) / p),
        Bench::Broadcast | Bench::Reduce | Bench::SendRecv => (bytes, 1.0),
        Bench::AllGather | Bench::ReduceScatter | Bench::AllToAll | Bench::Gather | Bench::Scatter => {
            (bytes * p, (p - 1.0) / p)
        }
        Bench::HyperCube => (bytes * (p - 1.0), 1.0),
    };
    let alg = if sec > 0.0 { base / 1e9 / sec } else { 0.0 };
    (alg, alg * factor)
}

/// What an input of rank `r` is used for.
fn use_of(bench: Bench, op: ReduceOp) -> Use {
    if bench.reduces() {
        Use::Reduce(op)
    } else {
        Use::Move
    }
}

/// One call's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub bench: Bench,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
    pub in_place: bool,
    pub counts: Counts,
}

fn es(c: &Call) -> usize {
    c.dtype.size_bytes()
}

/// Fills this rank's input for `c` (into `send`, or the in-place layout in `recv`), with
/// verifiable values of `seed`.
pub fn init(comm: &Communicator, c: &Call, seed: u64, send: &mut [u8], recv: &mut [u8]) {
    let (p, r, e) = (comm.size(), comm.rank().idx(), es(c));
    let n = c.counts.param;
    let u = use_of(c.bench, c.op);
    let mine = |first: usize, len: usize| input(c.dtype, u, p, r, seed, first, len);
    if !c.in_place {
        let s = mine(0, c.counts.send);
        send[..s.len()].copy_from_slice(&s);
        return;
    }
    match c.bench {
        Bench::AllReduce | Bench::Reduce | Bench::Broadcast | Bench::SendRecv | Bench::AllToAll => {
            let s = mine(0, c.counts.send);
            recv[..s.len()].copy_from_slice(&s);
        }
        Bench::ReduceScatter => {
            let s = mine(0, n * p);
            recv[..s.len()].copy_from_slice(&s);
        }
        Bench::Scatter => {
            if r == c.root {
                let s = mine(0, n * p);
                recv[..s.len()].copy_from_slice(&s);
            }
        }
        Bench::AllGather | Bench::HyperCube | Bench::Gather => {
            let s = mine(0, n);
            recv[r * n * e..(r + 1) * n * e].copy_from_slice(&s);
        }
    }
}

/// The expected bytes of this rank's result, and where they lie in the receive buffer
/// (`None`: this rank has no result to check).
pub fn expected(comm: &Communicator, c: &Call, seed: u64) -> Option<(usize, Vec<u8>)> {
    let (p, r, e) = (comm.size(), comm.rank().idx(), es(c));
    let n = c.counts.param;
    let dt = c.dtype;
    let mv = Use::Move;
    let all = |first: usize, len: usize| -> Vec<u8> {
        (0..p).flat_map(|q| input(dt, mv, p, q, seed, first, len)).collect()
    };
    Some(match c.bench {
        Bench::AllReduce => (0, expected_reduction(dt, c.op, p, seed, 0, n)),
        Bench::Reduce => {
            if r != c.root {
                return None;
            }
            (0, expected_reduction(dt, c.op, p, seed, 0, n))
        }
        Bench::Broadcast => (0, input(dt, mv, p, c.root, seed, 0, n)),
        Bench::AllGather | Bench::HyperCube => (0, all(0, n)),
        Bench::Gather => {
            if r != c.root {
                return None;
            }
            (0, all(0, n))
        }
        Bench::ReduceScatter => {
            let at = if c.in_place { r * n * e } else { 0 };
            (at, expected_reduction(dt, c.op, p, seed, r * n, n))
        }
        Bench::Scatter => {
            let at = if c.in_place { r * n * e } else { 0 };
            (at, input(dt, mv, p, c.root, seed, r * n, n))
        }
        Bench::AllToAll => (0, all(r * n, n)),
        Bench::SendRecv => (0, input(dt, mv, p, (r + p - 1) % p, seed, 0, n)),
    })
}

/// Counts the elements of `got` that differ from `want`.
pub fn wrong_elements(dtype: DataType, got: &[u8], want: &[u8]) -> u64 {
    let e = dtype.size_bytes();
    got.chunks_exact(e).zip(want.chunks_exact(e)).filter(|(a, b)| a != b).count() as u64
}

/// Runs `c` once (as `agg` calls in one group when `agg > 1`): out of place from `sends` to
/// `recvs`, or in place in `recvs`. Each aggregated call has its own receive buffer.
pub fn run(comm: &Communicator, c: &Call, sends: &[u8], recvs: &mut [&mut [u8]]) -> Result<()> {
    let (p, r, e) = (comm.size(), comm.rank().idx(), es(c));
    let n = c.counts.param;
    let dt = c.dtype;
    let root = Rank::new(c.root);
    let send = &sends[..c.counts.send * e];
    if c.bench == Bench::HyperCube {
        for buf in recvs.iter_mut() {
            hypercube(comm, c, send, buf)?;
        }
        return Ok(());
    }
    let mut g = comm.group();
    for buf in recvs.iter_mut() {
        let recv: &mut [u8] = &mut buf[..];
        match (c.bench, c.in_place) {
            (Bench::AllReduce, false) => g.all_reduce_raw(dt, send, &mut recv[..n * e], c.op)?,
            (Bench::AllReduce, true) => g.all_reduce_in_place_raw(dt, &mut recv[..n * e], c.op)?,
            (Bench::Broadcast, false) => g.broadcast_raw(dt, send, &mut recv[..n * e], root)?,
            (Bench::Broadcast, true) => g.broadcast_in_place_raw(dt, &mut recv[..n * e], root)?,
            (Bench::Reduce, false) => g.reduce_raw(dt, send, &mut recv[..n * e], c.op, root)?,
            (Bench::Reduce, true) => g.reduce_in_place_raw(dt, &mut recv[..n * e], c.op, root)?,
            (Bench::AllGather, false) => g.all_gather_raw(dt, send, &mut recv[..n * p * e])?,
            (Bench::AllGather, true) => g.all_gather_in_place_raw(dt, &mut recv[..n * p * e])?,
            (Bench::ReduceScatter, false) => g.reduce_scatter_raw(dt, send, &mut recv[..n * e], c.op)?,
            (Bench::ReduceScatter, true) => {
                g.reduce_scatter_in_place_raw(dt, &mut recv[..n * p * e], c.op)?
            }
            (Bench::AllToAll, false) => g.all_to_all_raw(dt, send, &mut recv[..n * p * e])?,
            (Bench::AllToAll, true) => g.all_to_all_in_place_raw(dt, &mut recv[..n * p * e])?,
            (Bench::Gather, false) => {
                let len = if r == c.root { n * p * e } else { 0 };
                g.gather_raw(dt, send, &mut recv[..len], root)?
            }
            (Bench::Gather, true) => {
                let b =
                    if r == c.root { &mut recv[..n * p * e] } else { &mut recv[r * n * e..(r + 1) * n * e] };
                g.gather_in_place_raw(dt, b, root)?
            }
            (Bench::Scatter, false) => {
                let s = if r == c.root { send } else { &send[..0] };
                g.scatter_raw(dt, s, &mut recv[..n * e], root)?
            }
            (Bench::Scatter, true) => {
                let b =
                    if r == c.root { &mut recv[..n * p * e] } else { &mut recv[r * n * e..(r + 1) * n * e] };
                g.scatter_in_place_raw(dt, b, root)?
            }
            (Bench::SendRecv, _) => {
                let (to, from) = (Rank::new((r + 1) % p), Rank::new((r + p - 1) % p));
                g.send_raw(dt, send, to)?;
                g.recv_raw(dt, &mut recv[..n * e], from)?
            }
            (Bench::HyperCube, _) => unreachable!("handled above"),
        };
    }
    g.end()
}

/// Runs `c` once on device buffers (`send` and one receive buffer per aggregated call, device
/// addresses) with the same layouts as [`run`], enqueued on `stream`.
pub fn run_device(
    dc: &oxccl::cuda::DevComm<'_>,
    stream: &oxccl::cuda::Stream,
    c: &Call,
    send: u64,
    recvs: &[u64],
) -> std::result::Result<(), oxccl::cuda::DevError> {
    use oxccl::cuda::call::DevCall;
    use oxccl_core::plan::device::DeviceColl;
    let comm = dc.comm();
    let (p, r, e) = (comm.size(), comm.rank().idx(), es(c));
    let n = c.counts.param;
    let (dt, op, root) = (c.dtype, c.op, c.root);
    let blk = |k: usize| (k * n * e) as u64;
    if c.bench == Bench::HyperCube {
        for &recv in recvs {
            if !c.in_place && n > 0 {
                stream.copy(recv + blk(r), send, n * e)?;
            }
            let mut mask = 1;
            while mask < p {
                let s0 = r & !(mask - 1);
                let t0 = s0 ^ mask;
                let peer = r ^ mask;
                let calls = [
                    DevCall::send(peer, dt, n * mask, recv + blk(s0)),
                    DevCall::recv(peer, dt, n * mask, recv + blk(t0)),
                ];
                dc.run(stream.h as usize, &calls)?;
                mask <<= 1;
            }
        }
        return Ok(());
    }
    let mut calls = Vec::with_capacity(recvs.len() * 2);
    for &recv in recvs {
        let coll = |k: DeviceColl, s: u64, d: u64| DevCall::coll(k, dt, op, n, s, d);
        match (c.bench, c.in_place) {
            (Bench::AllReduce, false) => calls.push(coll(DeviceColl::AllReduce, send, recv)),
            (Bench::AllReduce, true) => calls.push(coll(DeviceColl::AllReduce, recv, recv)),
            (Bench::Broadcast, false) => calls.push(coll(DeviceColl::Broadcast(root), send, recv)),
            (Bench::Broadcast, true) => calls.push(coll(DeviceColl::Broadcast(root), recv, recv)),
            (Bench::Reduce, false) => calls.push(coll(DeviceColl::Reduce(root), send, recv)),
            (Bench::Reduce, true) => calls.push(coll(DeviceColl::Reduce(root), recv, recv)),
            (Bench::AllGather, false) => calls.push(coll(DeviceColl::AllGather, send, recv)),
            (Bench::AllGather, true) => calls.push(coll(DeviceColl::AllGather, recv + blk(r), recv)),
            (Bench::ReduceScatter, false) => calls.push(coll(DeviceColl::ReduceScatter, send, recv)),
            (Bench::ReduceScatter, true) => calls.push(coll(DeviceColl::ReduceScatter, recv, recv + blk(r))),
            (Bench::AllToAll, false) => calls.push(coll(DeviceColl::AllToAll, send, recv)),
            (Bench::AllToAll, true) => calls.push(coll(DeviceColl::AllToAll, recv, recv)),
            (Bench::Gather, false) => calls.push(coll(DeviceColl::Gather(root), send, recv)),
            (Bench::Gather, true) => calls.push(coll(DeviceColl::Gather(root), recv + blk(r), recv)),
            (Bench::Scatter, false) => calls.push(coll(DeviceColl::Scatter(root), send, recv)),
            (Bench::Scatter, true) => calls.push(coll(DeviceColl::Scatter(root), recv, recv + blk(r))),
            (Bench::SendRecv, _) => {
                calls.push(DevCall::send((r + 1) % p, dt, n, send));
                calls.push(DevCall::recv((r + p - 1) % p, dt, n, recv));
            }
            (Bench::HyperCube, _) => unreachable!("handled above"),
        }
    }
    dc.run(stream.h as usize, &calls)
}

/// nccl-tests' hypercube all-gather: log2(P) rounds of pairwise exchanges of doubling blocks.
fn hypercube(comm: &Communicator, c: &Call, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (p, r, e) = (comm.size(), comm.rank().idx(), es(c));
    let rs = c.counts.param * e;
    if !c.in_place {
        recv[r * rs..(r + 1) * rs].copy_from_slice(&send[..rs]);
    }
    let mut mask = 1;
    while mask < p {
        let s = r & !(mask - 1);
        let t = s ^ mask;
        let peer = Rank::new(r ^ mask);
        let (lo, hi) = recv.split_at_mut(s.max(t) * rs);
        let (sbuf, rbuf): (&[u8], &mut [u8]) = if s < t {
            (&lo[s * rs..(s + mask) * rs], &mut hi[..mask * rs])
        } else {
            (&hi[..mask * rs], &mut lo[t * rs..(t + mask) * rs])
        };
        let mut g = comm.group();
        g.send_raw(c.dtype, sbuf, peer)?;
        g.recv_raw(c.dtype, rbuf, peer)?;
        g.end()?;
        mask <<= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_tests_counts_and_factors() {
        let c = counts(Bench::AllGather, 1000, DataType::F32, 4);
        // 250 floats, 62 per rank, rounded down to a multiple of 4 floats (16 bytes).
        assert_eq!(c, Counts { send: 60, recv: 240, param: 60 });
        let c = counts(Bench::AllReduce, 1 << 20, DataType::F32, 4);
        assert_eq!(c.param, 1 << 18);
        let (alg, bus) = bandwidth(Bench::AllReduce, 1 << 18, DataType::F32, 1e-3, 4);
        assert!((alg - 1.048576).abs() < 1e-9 && (bus - alg * 1.5).abs() < 1e-9);
        let (alg, bus) = bandwidth(Bench::AllGather, 248, DataType::F32, 1e-6, 4);
        assert!((alg - 3.968).abs() < 1e-9 && (bus - alg * 0.75).abs() < 1e-9);
    }
}
