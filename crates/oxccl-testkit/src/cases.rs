//! One checked call of every collective: build verifiable inputs, poison the outputs, call,
//! compare every element with the reference. Used by the test matrix and the main example.

use crate::verify::{expected_reduction, first_mismatch, hash, input, poison_for, Use};
use oxccl::{bf16, f16, Communicator, DataType, Element, Rank, ReduceOp, F8E4M3, F8E5M2};
use oxccl_core::coll::Collective;

/// The collectives (and the grouped send/recv exchange) a case can exercise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaseColl {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    AllToAllV,
    Gather,
    Scatter,
    /// A group of sends to both ring neighbours and receives from both (mutually dependent).
    SendRecv,
}

impl CaseColl {
    pub const ALL: [CaseColl; 10] = [
        CaseColl::AllReduce,
        CaseColl::Broadcast,
        CaseColl::Reduce,
        CaseColl::AllGather,
        CaseColl::ReduceScatter,
        CaseColl::AllToAll,
        CaseColl::AllToAllV,
        CaseColl::Gather,
        CaseColl::Scatter,
        CaseColl::SendRecv,
    ];

    /// The library's collective it calls (`None` for the send/recv exchange).
    pub fn collective(self) -> Option<Collective> {
        Some(match self {
            CaseColl::AllReduce => Collective::AllReduce,
            CaseColl::Broadcast => Collective::Broadcast,
            CaseColl::Reduce => Collective::Reduce,
            CaseColl::AllGather => Collective::AllGather,
            CaseColl::ReduceScatter => Collective::ReduceScatter,
            CaseColl::AllToAll => Collective::AllToAll,
            CaseColl::AllToAllV => Collective::AllToAllV,
            CaseColl::Gather => Collective::Gather,
            CaseColl::Scatter => Collective::Scatter,
            CaseColl::SendRecv => return None,
        })
    }

    /// The collective's name ([`Collective::name`]), or "send_recv".
    pub fn name(self) -> &'static str {
        self.collective().map_or("send_recv", Collective::name)
    }

    /// Whether the collective reduces (takes an operator).
    pub fn reduces(self) -> bool {
        self.collective().is_some_and(Collective::reduces)
    }

    /// Whether the collective has a root.
    pub fn rooted(self) -> bool {
        self.collective().is_some_and(Collective::rooted)
    }

    /// Whether the collective has an in-place form.
    pub fn has_in_place(self) -> bool {
        !matches!(self, CaseColl::AllToAllV | CaseColl::SendRecv)
    }
}

/// One checked call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    pub coll: CaseColl,
    pub dtype: DataType,
    pub op: Option<ReduceOp>,
    /// Elements per rank (per block for block collectives).
    pub count: usize,
    pub in_place: bool,
    pub root: usize,
    pub seed: u64,
    /// Buffers in oxccl's shared memory (the zero-copy direct path) instead of the heap.
    pub shared: bool,
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} count={}", self.coll.name(), self.dtype, self.count)?;
        if let Some(op) = self.op {
            write!(f, " op={op}")?;
        }
        if self.coll.rooted() {
            write!(f, " root={}", self.root)?;
        }
        write!(f, "{}", if self.in_place { " in-place" } else { " out-of-place" })?;
        if self.shared {
            write!(f, " shared-buffers")?;
        }
        Ok(())
    }
}

/// A test buffer: on the heap or in oxccl's shared memory.
enum Buf<T: Element> {
    Heap(Vec<T>),
    Shared(oxccl::mem::SharedBuf<T>),
}

impl<T: Element> std::ops::Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Heap(v) => v,
            Buf::Shared(b) => b,
        }
    }
}

impl<T: Element> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Heap(v) => v,
            Buf::Shared(b) => b,
        }
    }
}

fn typed_in<T: Element>(shared: bool, bytes: &[u8]) -> Buf<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut b = if shared {
        Buf::Shared(oxccl::mem::SharedBuf::zeroed(n).expect("shared memory"))
    } else {
        Buf::Heap(vec![T::zeroed(); n])
    };
    bytemuck::cast_slice_mut::<T, u8>(&mut b).copy_from_slice(bytes);
    b
}

fn raw<T: Element>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn check<T: Element>(c: &Case, what: &str, got: &[T], want: &[u8]) -> Result<(), String> {
    match first_mismatch(c.dtype, raw(got), want) {
        None => Ok(()),
        Some(m) => Err(format!("{c}: {what}: {m}")),
    }
}

fn concat(parts: impl Iterator<Item = Vec<u8>>) -> Vec<u8> {
    parts.flatten().collect()
}

fn run_typed<T: Element>(comm: &Communicator, c: &Case) -> Result<(), String> {
    let p = comm.size();
    let r = comm.rank().idx();
    let n = c.count;
    let dt = c.dtype;
    let root = Rank::new(c.root);
    let err = |e: oxccl::Error| format!("{c}: call failed: {e}");
    let mv = Use::Move;
    match c.coll {
        CaseColl::AllReduce => {
            let op = c.op.unwrap_or(ReduceOp::Sum);
            let inp = input(dt, Use::Reduce(op), p, r, c.seed, 0, n);
            let want = expected_reduction(dt, op, p, c.seed, 0, n);
            if c.in_place {
                let mut buf: Buf<T> = typed_in(c.shared, &inp);
                comm.all_reduce_in_place(&mut buf, op).map_err(err)?;
                check(c, "result", &buf, &want)
            } else {
                let send: Buf<T> = typed_in(c.shared, &inp);
                let mut recv: Buf<T> = typed_in(c.shared, &poison_for(&want));
                comm.all_reduce(&send, &mut recv, op).map_err(err)?;
                check(c, "send buffer", &send, &inp)?;
                check(c, "result", &recv, &want)
            }
        }
        CaseColl::Broadcast => {
            let want = input(dt, mv, p, c.root, c.seed, 0, n);
            if c.in_place {
                let mut buf: Buf<T> =
                    typed_in(c.shared, &if r == c.root { want.clone() } else { poison_for(&want) });
                comm.broadcast_in_place(&mut buf, root).map_err(err)?;
                check(c, "result", &buf, &want)
            } else {
                let send: Buf<T> =
                    if r == c.root { typed_in(c.shared, &want) } else { typed_in(c.shared, &[]) };
                let mut recv: Buf<T> = typed_in(c.shared, &poison_for(&want));
                comm.broadcast(&send, &mut recv, root).map_err(err)?;
                check(c, "result", &recv, &want)
            }
        }
        CaseColl::Reduce => {
            let op = c.op.unwrap_or(ReduceOp::Sum);
            let inp = input(dt, Use::Reduce(op), p, r, c.seed, 0, n);
            let want = expected_reduction(dt, op, p, c.seed, 0, n);
            if c.in_place {
                let mut buf: Buf<T> = typed_in(c.shared, &inp);
                comm.reduce_in_place(&mut buf, op, root).map_err(err)?;
                if r == c.root {
                    check(c, "result", &buf, &want)
                } else {
                    check(c, "non-root buffer (must be untouched)", &buf, &inp)
                }
            } else {
                let send: Buf<T> = typed_in(c.shared, &inp);
                let poison = poison_for(&want);
                let mut recv: Buf<T> = typed_in(c.shared, &poison);
                comm.reduce(&send, &mut recv, op, root).map_err(err)?;
                if r == c.root {
                    check(c, "result", &recv, &want)
                } else {
                    check(c, "non-root receive buffer (must be untouched)", &recv, &poison)
                }
            }
        }
        CaseColl::AllGather => {
            let want = concat((0..p).map(|q| input(dt, mv, p, q, c.seed, 0, n)));
            let mine = input(dt, mv, p, r, c.seed, 0, n);
            if c.in_place {
                let mut init = poison_for(&want);
                let es = dt.size_bytes();
                init[r * n * es..(r + 1) * n * es].copy_from_slice(&mine);
                let mut buf: Buf<T> = typed_in(c.shared, &init);
                comm.all_gather_in_place(&mut buf).map_err(err)?;
                check(c, "result", &buf, &want)
            } else {
                let send: Buf<T> = typed_in(c.shared, &mine);
                let mut recv: Buf<T> = typed_in(c.shared, &poison_for(&want));
                comm.all_gather(&send, &mut recv).map_err(err)?;
                check(c, "result", &recv, &want)
            }
        }
        CaseColl::ReduceScatter => {
            let op = c.op.unwrap_or(ReduceOp::Sum);
            let inp = input(dt, Use::Reduce(op), p, r, c.seed, 0, n * p);
            let want = expected_reduction(dt, op, p, c.seed, r * n, n);
            if c.in_place {
                let mut buf: Buf<T> = typed_in(c.shared, &inp);
                comm.reduce_scatter_in_place(&mut buf, op).map_err(err)?;
                check(c, "result", &buf[r * n..(r + 1) * n], &want)
            } else {
                let send: Buf<T> = typed_in(c.shared, &inp);
                let mut recv: Buf<T> = typed_in(c.shared, &poison_for(&want));
                comm.reduce_scatter(&send, &mut recv, op).map_err(err)?;
                check(c, "result", &recv, &want)
            }
        }
        CaseColl::AllToAll => {
            let inp = input(dt, mv, p, r, c.seed, 0, n * p);
            let want = concat((0..p).map(|q| input(dt, mv, p, q, c.seed, r * n, n)));
            if c.in_place {
                let mut buf: Buf<T> = typed_in(c.shared, &inp);
                comm.all_to_all_in_place(&mut buf).map_err(err)?;
                check(c, "result", &buf, &want)
            } else {
                let send: Buf<T> = typed_in(c.shared, &inp);
                let mut recv: Buf<T> = typed_in(c.shared, &poison_for(&want));
                comm.all_to_all(&send, &mut recv).map_err(err)?;
                check(c, "result", &recv, &want)
            }
        }
        CaseColl::AllToAllV => {
            // Rank s sends cnt(s, d) elements to d; segment elements come from index d·n + k.
            let cnt = |s: usize, d: usize| (hash(c.seed ^ 0xa2a, s, d) % (n as u64 + 1)) as usize;
            let sc: Vec<usize> = (0..p).map(|d| cnt(r, d)).collect();
            let rc: Vec<usize> = (0..p).map(|s| cnt(s, r)).collect();
            // Send segments in reverse peer order, receive segments with one-element gaps.
            let mut sd = vec![0usize; p];
            let mut at = 0;
            for d in (0..p).rev() {
                sd[d] = at;
                at += sc[d];
            }
            let send_len = at;
            let mut rd = vec![0usize; p];
            let mut at = 1;
            for s in 0..p {
                rd[s] = at;
                at += rc[s] + 1;
            }
            let recv_len = at;
            let es = dt.size_bytes();
            let mut send_b = vec![0u8; send_len * es];
            for d in 0..p {
                let seg = input(dt, mv, p, r, c.seed, d * n, sc[d]);
                send_b[sd[d] * es..(sd[d] + sc[d]) * es].copy_from_slice(&seg);
            }
            let mut want = vec![0x5au8; recv_len * es];
            for s in 0..p {
                let seg = input(dt, mv, p, s, c.seed, r * n, rc[s]);
                want[rd[s] * es..(rd[s] + rc[s]) * es].copy_from_slice(&seg);
            }
            // Segments are poisoned; gaps hold 0x5a and must keep it.
            let mut init = poison_for(&want);
            for s in 0..=p {
                let gap = if s == 0 { 0 } else { rd[s - 1] + rc[s - 1] };
                init[gap * es..(gap + 1) * es].fill(0x5a);
            }
            let send: Buf<T> = typed_in(c.shared, &send_b);
            let mut recv: Buf<T> = typed_in(c.shared, &init);
            comm.all_to_all_v(&send, &sc, &sd, &mut recv, &rc, &rd).map_err(err)?;
            check(c, "result", &recv, &want)
        }
        CaseColl::Gather => {
            let mine = input(dt, mv, p, r, c.seed, 0, n);
            let want = concat((0..p).map(|q| input(dt, mv, p, q, c.seed, 0, n)));
            if c.in_place {
                let es = dt.size_bytes();
                let mut buf: Buf<T> = if r == c.root {
                    let mut init = poison_for(&want);
                    init[r * n * es..(r + 1) * n * es].copy_from_slice(&mine);
                    typed_in(c.shared, &init)
                } else {
                    typed_in(c.shared, &mine)
                };
                comm.gather_in_place(&mut buf, root).map_err(err)?;
                if r == c.root {
                    check(c, "result", &buf, &want)
                } else {
                    check(c, "non-root buffer (must be untouched)", &buf, &mine)
                }
            } else {
                let send: Buf<T> = typed_in(c.shared, &mine);
                let poison = poison_for(&want);
                let mut recv: Buf<T> =
                    if r == c.root { typed_in(c.shared, &poison) } else { typed_in(c.shared, &[]) };
                comm.gather(&send, &mut recv, root).map_err(err)?;
                if r == c.root {
                    check(c, "result", &recv, &want)
                } else {
                    Ok(())
                }
            }
        }
        CaseColl::Scatter => {
            let all = input(dt, mv, p, c.root, c.seed, 0, n * p);
            let es = dt.size_bytes();
            let want = all[r * n * es..(r + 1) * n * es].to_vec();
            if c.in_place {
                let mut buf: Buf<T> = if r == c.root {
                    typed_in(c.shared, &all)
                } else {
                    typed_in(c.shared, &poison_for(&want))
                };
                comm.scatter_in_place(&mut buf, root).map_err(err)?;
                if r == c.root {
                    check(c, "root buffer", &buf, &all)
                } else {
                    check(c, "result", &buf, &want)
                }
            } else {
                let send: Buf<T> =
                    if r == c.root { typed_in(c.shared, &all) } else { typed_in(c.shared, &[]) };
                let mut recv: Buf<T> = typed_in(c.shared, &poison_for(&want));
                comm.scatter(&send, &mut recv, root).map_err(err)?;
                check(c, "result", &recv, &want)
            }
        }
        CaseColl::SendRecv => {
            let next = (r + 1) % p;
            let prev = (r + p - 1) % p;
            // Two messages to each neighbour: what goes "forward" and what goes "backward".
            let fwd: Buf<T> = typed_in(c.shared, &input(dt, mv, p, r, c.seed, 0, n));
            let bwd: Buf<T> = typed_in(c.shared, &input(dt, mv, p, r, c.seed, n, n));
            // Messages between one pair match in issue order: with one or two ranks, next and
            // prev are the same peer, whose first message (its forward one) meets this rank's
            // first receive (from "next").
            let (want_from_next, want_from_prev) = if next == prev {
                (input(dt, mv, p, next, c.seed, 0, n), input(dt, mv, p, next, c.seed, n, n))
            } else {
                (input(dt, mv, p, next, c.seed, n, n), input(dt, mv, p, prev, c.seed, 0, n))
            };
            let mut from_prev: Buf<T> = typed_in(c.shared, &poison_for(&want_from_prev));
            let mut from_next: Buf<T> = typed_in(c.shared, &poison_for(&want_from_next));
            let mut g = comm.group();
            g.send(&fwd, Rank::new(next)).map_err(err)?;
            g.recv(&mut from_next, Rank::new(next)).map_err(err)?;
            g.send(&bwd, Rank::new(prev)).map_err(err)?;
            g.recv(&mut from_prev, Rank::new(prev)).map_err(err)?;
            g.end().map_err(err)?;
            check(c, "message from previous rank", &from_prev, &want_from_prev)?;
            check(c, "message from next rank", &from_next, &want_from_next)
        }
    }
}

/// Runs one case on this rank; `Err` describes the first wrong element or the failure.
pub fn run_case(comm: &Communicator, c: &Case) -> Result<(), String> {
    match c.dtype {
        DataType::I8 => run_typed::<i8>(comm, c),
        DataType::U8 => run_typed::<u8>(comm, c),
        DataType::I32 => run_typed::<i32>(comm, c),
        DataType::U32 => run_typed::<u32>(comm, c),
        DataType::I64 => run_typed::<i64>(comm, c),
        DataType::U64 => run_typed::<u64>(comm, c),
        DataType::F16 => run_typed::<f16>(comm, c),
        DataType::Bf16 => run_typed::<bf16>(comm, c),
        DataType::F32 => run_typed::<f32>(comm, c),
        DataType::F64 => run_typed::<f64>(comm, c),
        DataType::F8E4M3 => run_typed::<F8E4M3>(comm, c),
        DataType::F8E5M2 => run_typed::<F8E5M2>(comm, c),
    }
}

/// Which cases a matrix covers.
#[derive(Clone, Debug)]
pub struct MatrixSpec {
    /// Counts for which every dtype × op × placement × root combination runs.
    pub full_counts: Vec<usize>,
    /// Counts for which every dtype × op runs out of place and every dtype in place (with
    /// `Sum` for reductions), the root rotating across cases so every root is still covered.
    pub big_counts: Vec<usize>,
    pub colls: Vec<CaseColl>,
    pub dtypes: Vec<DataType>,
    /// Counts run again with shared buffers (every op out of place, Sum in place), for the
    /// data types in `shared_dtypes`.
    pub shared_counts: Vec<usize>,
    pub shared_dtypes: Vec<DataType>,
}

/// Every case of `spec` for a communicator of `size`, in a deterministic order (all ranks
/// build the same list).
pub fn matrix(size: usize, spec: &MatrixSpec) -> Vec<Case> {
    let mut v = Vec::new();
    let mut seed = 1u64;
    for &coll in &spec.colls {
        for &dtype in &spec.dtypes {
            let ops: Vec<Option<ReduceOp>> =
                if coll.reduces() { ReduceOp::valid_ops(dtype).map(Some).collect() } else { vec![None] };
            let places: &[bool] = if coll.has_in_place() { &[false, true] } else { &[false] };
            for op in &ops {
                for &in_place in places {
                    for &count in &spec.full_counts {
                        let roots = if coll.rooted() { size } else { 1 };
                        for root in 0..roots {
                            seed += 1;
                            v.push(Case { coll, dtype, op: *op, count, in_place, root, seed, shared: false });
                        }
                    }
                    let big_in_place_op = op.is_none() || *op == Some(ReduceOp::Sum);
                    for &count in spec.big_counts.iter().filter(|_| !in_place || big_in_place_op) {
                        seed += 1;
                        let root = if coll.rooted() { (seed as usize) % size } else { 0 };
                        v.push(Case { coll, dtype, op: *op, count, in_place, root, seed, shared: false });
                    }
                    let shared_ok = spec.shared_dtypes.contains(&dtype);
                    for &count in
                        spec.shared_counts.iter().filter(|_| shared_ok && (!in_place || big_in_place_op))
                    {
                        seed += 1;
                        let root = if coll.rooted() { (seed as usize) % size } else { 0 };
                        v.push(Case { coll, dtype, op: *op, count, in_place, root, seed, shared: true });
                    }
                }
            }
        }
    }
    v
}
