//! Direct plans for ranks that address each other's buffers: ranks as threads of one process
//! on one GPU (one address space), or processes whose device buffers are mapped into each
//! other by CUDA IPC. No connections and no chunks: each rank is given *tasks*, each a
//! reduce-copy of up to [`MAX_SOURCES`] source ranges into up to [`MAX_DESTS`] destination
//! ranges (every destination gets the same result), over addresses any rank can use.
//!
//! The work of a call is split so that each input byte is read once and each output byte
//! written once over all ranks, and ranks never race:
//! - AllReduce: rank r reduces slice r of every input into slice r of every output;
//! - ReduceScatter: rank r reduces block r of every input into its own output;
//! - Reduce: rank r reduces slice r of every input into slice r of the root's output;
//! - Broadcast: rank r copies slice r of the root's input into slice r of every output;
//! - AllGather: rank r copies its input into block r of every output;
//! - Gather: rank r copies its input into block r of the root's output;
//! - Scatter: rank r copies block r of the root's input into its own output;
//! - AllToAll: rank r copies block q of its input into block r of rank q's output, for each q;
//!   a pair of ranks of which one is in place (send == recv, legal per rank) is exchanged
//!   by one of the two with a pairwise task (see [`pair_owner`]), since the in-place rank's
//!   block q is both what it sends q and where q's block lands.
//!
//! Slices are 16-byte multiples (so vector loads stay aligned when the buffers are). Within
//! one call, no byte written by one rank is read or written by another, and a rank that both
//! reads and writes a byte (in-place layouts) does so in one element of one task, reading
//! before writing. [`tests`] checks that by executing every plan in memory.

pub mod launch;

use crate::coll::Collective;
use crate::dtype::DataType;

/// Sources one task combines at most (the kernels' `OX_MAXSRC`).
pub const MAX_SOURCES: usize = 8;
/// Destinations one task writes at most (the kernels' `OX_MAXDST`).
pub const MAX_DESTS: usize = 8;
/// Ranks a direct plan serves: every source of a reduction is one rank's input.
pub const MAX_RANKS: usize = 8;

/// A collective, with its root where it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceColl {
    AllReduce,
    Broadcast(usize),
    Reduce(usize),
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather(usize),
    Scatter(usize),
}

impl DeviceColl {
    /// The collective it is.
    pub const fn collective(self) -> Collective {
        match self {
            DeviceColl::AllReduce => Collective::AllReduce,
            DeviceColl::Broadcast(_) => Collective::Broadcast,
            DeviceColl::Reduce(_) => Collective::Reduce,
            DeviceColl::AllGather => Collective::AllGather,
            DeviceColl::ReduceScatter => Collective::ReduceScatter,
            DeviceColl::AllToAll => Collective::AllToAll,
            DeviceColl::Gather(_) => Collective::Gather,
            DeviceColl::Scatter(_) => Collective::Scatter,
        }
    }

    /// `c` with root `root` (ignored where `c` has none); `None` for a collective the device
    /// path does not run (all-to-all-v, point-to-point).
    pub const fn of(c: Collective, root: usize) -> Option<DeviceColl> {
        Some(match c {
            Collective::AllReduce => DeviceColl::AllReduce,
            Collective::Broadcast => DeviceColl::Broadcast(root),
            Collective::Reduce => DeviceColl::Reduce(root),
            Collective::AllGather => DeviceColl::AllGather,
            Collective::ReduceScatter => DeviceColl::ReduceScatter,
            Collective::AllToAll => DeviceColl::AllToAll,
            Collective::Gather => DeviceColl::Gather(root),
            Collective::Scatter => DeviceColl::Scatter(root),
            Collective::AllToAllV | Collective::Send | Collective::Recv => return None,
        })
    }

    /// Whether the collective combines values (runs its kind's reduction kernel).
    pub const fn reduces(self) -> bool {
        self.collective().reduces()
    }

    /// The root, for rooted collectives.
    pub fn root(self) -> Option<usize> {
        match self {
            DeviceColl::Broadcast(r)
            | DeviceColl::Reduce(r)
            | DeviceColl::Gather(r)
            | DeviceColl::Scatter(r) => Some(r),
            _ => None,
        }
    }

    /// The collective's name ([`Collective::name`]).
    pub const fn name(self) -> &'static str {
        self.collective().name()
    }
}

/// One rank's buffers for a call (addresses; 0 where the rank has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bufs {
    pub send: u64,
    pub recv: u64,
}

/// One reduce-copy: `dsts[i][e] = srcs[0][e] ⊕ srcs[1][e] ⊕ …` for `e < n` elements; or, when
/// `copy`, a byte copy of `n` bytes from the one source (the collectives that move data
/// without combining it: any launch may carry such a task, whatever its type); or, when
/// `copy` and `pairs`, byte copies `dsts[i] ← srcs[i]` in which each thread reads its bytes
/// of every source before it writes any destination (so a source may be another pair's
/// destination: an exchange in place).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Task {
    pub srcs: Vec<u64>,
    pub dsts: Vec<u64>,
    /// Elements, or bytes for a copy.
    pub n: usize,
    pub copy: bool,
    pub pairs: bool,
}

impl Task {
    /// A byte copy of `bytes` from `src` to each of `dsts`.
    pub fn copy(src: u64, dsts: Vec<u64>, bytes: usize) -> Task {
        Task { srcs: vec![src], dsts, n: bytes, copy: true, pairs: false }
    }

    /// Byte copies of `bytes`: `dsts[i] ← srcs[i]`, every source read before any write.
    pub fn pairs(srcs: Vec<u64>, dsts: Vec<u64>, bytes: usize) -> Task {
        debug_assert_eq!(srcs.len(), dsts.len());
        Task { srcs, dsts, n: bytes, copy: true, pairs: true }
    }

    /// A reduce-copy of `n` elements of `srcs` into each of `dsts`.
    pub fn reduce(srcs: Vec<u64>, dsts: Vec<u64>, n: usize) -> Task {
        Task { srcs, dsts, n, copy: false, pairs: false }
    }

    /// Bytes each source and destination spans, for elements of `elem` bytes.
    pub fn span(&self, elem: usize) -> usize {
        if self.copy {
            self.n
        } else {
            self.n * elem
        }
    }
}

impl Task {
    /// Whether every address is 16-byte aligned (the kernels then move 16-byte vectors).
    pub fn aligned(&self) -> bool {
        self.srcs.iter().chain(&self.dsts).all(|a| a % 16 == 0)
    }
}

/// Elements per slice of a `count`-element buffer split over `p` ranks: a multiple of 16
/// bytes' worth, so each slice starts 16-byte aligned when the buffer does.
pub fn slice_len(count: usize, p: usize, elem: usize) -> usize {
    let align = (16 / elem.max(1)).max(1);
    count.div_ceil(p.max(1)).div_ceil(align) * align
}

/// Rank `r`'s slice `[lo, hi)` of `count` elements split over `p` ranks.
pub fn slice(count: usize, p: usize, elem: usize, r: usize) -> (usize, usize) {
    let per = slice_len(count, p, elem);
    ((r * per).min(count), ((r + 1) * per).min(count))
}

/// Rank `rank`'s tasks for collective `c` of `count` elements (NCCL's count argument: per
/// rank for AllGather, ReduceScatter, AllToAll, Gather and Scatter) of `elem` bytes, where
/// `bufs[q]` are rank q's buffers. Empty tasks, and copies of a range onto itself (in-place
/// layouts), are left out. At most `p` ≤ [`MAX_RANKS`] ranks.
pub fn tasks(c: DeviceColl, count: usize, elem: usize, rank: usize, bufs: &[Bufs]) -> Vec<Task> {
    let p = bufs.len();
    assert!((1..=MAX_RANKS).contains(&p) && rank < p, "direct plans serve 1..={MAX_RANKS} ranks");
    let es = elem as u64;
    let block = count as u64 * es;
    let sends = |off: u64| bufs.iter().map(|b| b.send + off).collect::<Vec<_>>();
    let recvs = |off: u64| bufs.iter().map(|b| b.recv + off).collect::<Vec<_>>();
    let me = bufs[rank];
    let mut v = Vec::new();
    let mut exchanges = Vec::new();
    let copy = !c.reduces();
    let mut push = |srcs: Vec<u64>, dsts: Vec<u64>, n: usize| {
        // A copy onto itself (in place) writes nothing new.
        let dsts: Vec<u64> = if copy { dsts.into_iter().filter(|&d| d != srcs[0]).collect() } else { dsts };
        if n > 0 && !dsts.is_empty() {
            // Copies count bytes.
            let n = if copy { n * elem } else { n };
            v.push(Task { srcs, dsts, n, copy, pairs: false });
        }
    };
    match c {
        DeviceColl::AllReduce => {
            let (lo, hi) = slice(count, p, elem, rank);
            let off = lo as u64 * es;
            push(sends(off), recvs(off), hi - lo);
        }
        DeviceColl::Reduce(root) => {
            let (lo, hi) = slice(count, p, elem, rank);
            let off = lo as u64 * es;
            push(sends(off), vec![bufs[root].recv + off], hi - lo);
        }
        DeviceColl::Broadcast(root) => {
            let (lo, hi) = slice(count, p, elem, rank);
            let off = lo as u64 * es;
            push(vec![bufs[root].send + off], recvs(off), hi - lo);
        }
        DeviceColl::ReduceScatter => push(sends(rank as u64 * block), vec![me.recv], count),
        DeviceColl::AllGather => push(vec![me.send], recvs(rank as u64 * block), count),
        DeviceColl::Gather(root) => push(vec![me.send], vec![bufs[root].recv + rank as u64 * block], count),
        DeviceColl::Scatter(root) => push(vec![bufs[root].send + rank as u64 * block], vec![me.recv], count),
        DeviceColl::AllToAll => {
            let in_place = |q: usize| bufs[q].send == bufs[q].recv;
            let at = |base: u64, k: usize| base + k as u64 * block;
            for (q, b) in bufs.iter().enumerate() {
                if q == rank || !(in_place(rank) || in_place(q)) {
                    push(vec![at(me.send, q)], vec![at(b.recv, rank)], count);
                } else if pair_owner(rank, q, p) == rank && count > 0 {
                    // Both directions of the pair, each element read on both sides first.
                    let (srcs, dsts) =
                        (vec![at(me.send, q), at(b.send, rank)], vec![at(b.recv, rank), at(me.recv, q)]);
                    exchanges.push(Task::pairs(srcs, dsts, count * elem));
                }
            }
        }
    }
    v.extend(exchanges);
    v
}

/// Which of ranks `a` and `b` (of `p`) carries their pairwise exchange in an all-to-all: the
/// one the other lies less than half-way round the ring after (the lower rank at exactly
/// half), so that every rank carries at most ⌈(p − 1) / 2⌉ pairs.
pub fn pair_owner(a: usize, b: usize, p: usize) -> usize {
    let d = (b + p - a) % p;
    if 2 * d < p || (2 * d == p && a < b) {
        a
    } else {
        b
    }
}

/// The most bytes any one rank reads and writes for `c` (sizes the launch: every rank of a
/// call launches the same number of blocks, so this depends on global arguments only).
pub fn work_bytes(c: DeviceColl, count: usize, elem: usize, p: usize) -> usize {
    let slice_bytes = slice_len(count, p, elem).min(count) * elem;
    let block = count * elem;
    match c {
        DeviceColl::AllReduce => slice_bytes * 2 * p,
        DeviceColl::Reduce(_) => slice_bytes * (p + 1),
        DeviceColl::Broadcast(_) => slice_bytes * (p + 1),
        DeviceColl::ReduceScatter => block * (p + 1),
        DeviceColl::AllGather => block * (p + 1),
        DeviceColl::Gather(_) | DeviceColl::Scatter(_) => block * 2,
        DeviceColl::AllToAll => block * 2 * p,
    }
}

/// Bytes of each rank's send and receive buffers for `c` (NCCL's rules), for rank `rank`.
pub fn buffer_bytes(c: DeviceColl, count: usize, dtype: DataType, p: usize, rank: usize) -> (usize, usize) {
    let one = count * dtype.size_bytes();
    let all = one * p;
    let is = |r: usize| r == rank;
    match c {
        DeviceColl::AllReduce => (one, one),
        DeviceColl::Broadcast(r) => (if is(r) { one } else { 0 }, one),
        DeviceColl::Reduce(r) => (one, if is(r) { one } else { 0 }),
        DeviceColl::AllGather => (one, all),
        DeviceColl::ReduceScatter => (all, one),
        DeviceColl::AllToAll => (all, all),
        DeviceColl::Gather(r) => (one, if is(r) { all } else { 0 }),
        DeviceColl::Scatter(r) => (if is(r) { all } else { 0 }, one),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::ReduceOp;
    use crate::reduce::{finalize, reduce_many, ReduceCtx};

    /// An address space of per-rank send and receive buffers: rank q's send buffer starts at
    /// `(2q + 1) << 32`, its receive buffer at `(2q + 2) << 32` (in-place calls point one into
    /// the other).
    struct Mem {
        bufs: Vec<Vec<u8>>,
    }

    impl Mem {
        fn locate(&self, a: u64) -> (usize, usize) {
            ((a >> 32) as usize - 1, (a & 0xffff_ffff) as usize)
        }
        fn read(&self, a: u64, len: usize) -> Vec<u8> {
            if len == 0 {
                return Vec::new();
            }
            let (b, o) = self.locate(a);
            self.bufs[b][o..o + len].to_vec()
        }
        fn write(&mut self, a: u64, data: &[u8]) {
            let (b, o) = self.locate(a);
            self.bufs[b][o..o + data.len()].copy_from_slice(data);
        }
    }

    /// Rank q's input element i: a small integer, exact in every type and in any order.
    fn value(q: usize, i: usize, op: ReduceOp) -> u8 {
        match op {
            ReduceOp::Prod => 1 + ((q + i) % 2) as u8,
            _ => ((q * 5 + i * 3) % 11) as u8,
        }
    }

    fn encode(t: DataType, v: u8) -> Vec<u8> {
        match t {
            DataType::U8 => vec![v],
            DataType::F16 => half::f16::from_f32(v as f32).to_le_bytes().to_vec(),
            DataType::I32 => (v as i32).to_le_bytes().to_vec(),
            DataType::F64 => (v as f64).to_le_bytes().to_vec(),
            _ => unreachable!(),
        }
    }

    /// Runs `c` on `p` ranks through the plan in memory, checking race freedom and the result
    /// against a reference made from the definitions. `in_place`: the ranks (a bit each) that call in place; NCCL lets each rank choose.
    fn check(c: DeviceColl, p: usize, count: usize, t: DataType, op: ReduceOp, in_place: u32) {
        let es = t.size_bytes();
        let block = count * es;
        let ctx = ReduceCtx::new(t, op, p as u32).unwrap();
        // Inputs (each rank's whole send contents) and the reference outputs.
        let send_len = |q: usize| buffer_bytes(c, count, t, p, q).0;
        let recv_len = |q: usize| buffer_bytes(c, count, t, p, q).1;
        let input = |q: usize| -> Vec<u8> {
            (0..send_len(q) / es).flat_map(|i| encode(t, value(q, i, op))).collect()
        };
        let reduce_of = |range: std::ops::Range<usize>| -> Vec<u8> {
            let ins: Vec<Vec<u8>> = (0..p).map(|q| input(q)[range.clone()].to_vec()).collect();
            let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
            let mut out = vec![0u8; range.len()];
            reduce_many(&ctx, &mut out, &refs);
            finalize(&ctx, &mut out);
            out
        };
        let want = |q: usize| -> Option<Vec<u8>> {
            Some(match c {
                DeviceColl::AllReduce => reduce_of(0..block),
                DeviceColl::Reduce(r) if r == q => reduce_of(0..block),
                DeviceColl::Broadcast(r) => input(r),
                DeviceColl::ReduceScatter => reduce_of(q * block..(q + 1) * block),
                DeviceColl::AllGather => (0..p).flat_map(input).collect(),
                DeviceColl::Gather(r) if r == q => (0..p).flat_map(input).collect(),
                DeviceColl::Scatter(r) => input(r)[q * block..(q + 1) * block].to_vec(),
                DeviceColl::AllToAll => {
                    (0..p).flat_map(|s| input(s)[q * block..(q + 1) * block].to_vec()).collect()
                }
                _ => return None,
            })
        };
        // Buffers: index 2q is rank q's send, 2q + 1 its receive buffer. In place, the send
        // pointer lies inside the receive buffer at NCCL's offset (or the reverse).
        let mut mem = Mem { bufs: Vec::new() };
        let mut bufs = Vec::new();
        for q in 0..p {
            let (sl, rl) = (send_len(q), recv_len(q));
            let sbase = ((2 * q + 1) as u64) << 32;
            let rbase = ((2 * q + 2) as u64) << 32;
            let poison = |n: usize| vec![0xA5u8; n];
            let inner = |r: usize| (r * block) as u64;
            let place = match c {
                _ if in_place >> q & 1 == 0 || sl == 0 || rl == 0 => None,
                DeviceColl::AllReduce
                | DeviceColl::Broadcast(_)
                | DeviceColl::Reduce(_)
                | DeviceColl::AllToAll => Some((true, 0)),
                DeviceColl::AllGather => Some((true, inner(q))),
                DeviceColl::Gather(r) => Some((true, inner(r))),
                DeviceColl::ReduceScatter => Some((false, inner(q))),
                DeviceColl::Scatter(r) => Some((false, inner(r))),
            };
            match place {
                // The send range lies in the receive buffer at `off`.
                Some((true, off)) => {
                    let mut r = poison(rl);
                    r[off as usize..off as usize + sl].copy_from_slice(&input(q));
                    mem.bufs.push(Vec::new());
                    mem.bufs.push(r);
                    bufs.push(Bufs { send: rbase + off, recv: rbase });
                }
                // The receive range lies in the send buffer at `off`.
                Some((false, off)) => {
                    mem.bufs.push(input(q));
                    mem.bufs.push(Vec::new());
                    bufs.push(Bufs { send: sbase, recv: sbase + off });
                }
                None => {
                    mem.bufs.push(input(q));
                    mem.bufs.push(poison(rl));
                    bufs.push(Bufs {
                        send: if sl > 0 { sbase } else { 0 },
                        recv: if rl > 0 { rbase } else { 0 },
                    });
                }
            }
        }
        // Every rank's tasks, then race checks: byte ranges each rank reads and writes.
        let plans: Vec<Vec<Task>> = (0..p).map(|q| tasks(c, count, es, q, &bufs)).collect();
        let mut reads: Vec<Vec<(u64, u64)>> = vec![Vec::new(); p];
        let mut writes: Vec<Vec<(u64, u64)>> = vec![Vec::new(); p];
        for (q, ts) in plans.iter().enumerate() {
            for task in ts {
                assert!(task.srcs.len() <= MAX_SOURCES && task.dsts.len() <= MAX_DESTS);
                assert_eq!(task.copy, !c.reduces());
                let len = task.span(es) as u64;
                reads[q].extend(task.srcs.iter().map(|&a| (a, a + len)));
                writes[q].extend(task.dsts.iter().map(|&a| (a, a + len)));
                for &a in task.srcs.iter().chain(&task.dsts) {
                    assert_eq!((a & 0xffff_ffff) % es as u64, 0, "element-aligned");
                }
            }
        }
        let meet = |a: &(u64, u64), b: &(u64, u64)| a.0 < b.1 && b.0 < a.1;
        for a in 0..p {
            for b in 0..p {
                if a == b {
                    continue;
                }
                for w in &writes[a] {
                    for x in writes[b].iter().chain(&reads[b]) {
                        assert!(!meet(w, x), "{c:?} p={p}: rank {a} writes {w:x?}, rank {b} touches {x:x?}");
                    }
                }
            }
        }
        // Execute: every task reads all its sources before writing (as a kernel's thread does
        // per element).
        for ts in &plans {
            for task in ts {
                let len = task.span(es);
                let ins: Vec<Vec<u8>> = task.srcs.iter().map(|&a| mem.read(a, len)).collect();
                let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
                let mut out = vec![0u8; len];
                if task.pairs {
                    assert!(task.copy && task.srcs.len() == task.dsts.len());
                    for (&d, data) in task.dsts.iter().zip(&ins) {
                        mem.write(d, data);
                    }
                    continue;
                }
                if c.reduces() {
                    reduce_many(&ctx, &mut out, &refs);
                    finalize(&ctx, &mut out);
                } else {
                    out.copy_from_slice(&ins[0]);
                }
                for &d in &task.dsts {
                    mem.write(d, &out);
                }
            }
        }
        for (q, b) in bufs.iter().enumerate() {
            if let Some(w) = want(q) {
                let got = mem.read(b.recv, recv_len(q));
                assert_eq!(got, w, "{c:?} p={p} count={count} {t:?} {op:?} in_place={in_place:b}: rank {q}");
            }
        }
    }

    #[test]
    fn every_collective_is_exact_and_race_free_on_1_to_8_ranks() {
        let colls = |p: usize| {
            let mut v = vec![
                DeviceColl::AllReduce,
                DeviceColl::AllGather,
                DeviceColl::ReduceScatter,
                DeviceColl::AllToAll,
            ];
            for r in [0, p / 2, p - 1] {
                v.extend([
                    DeviceColl::Broadcast(r),
                    DeviceColl::Reduce(r),
                    DeviceColl::Gather(r),
                    DeviceColl::Scatter(r),
                ]);
            }
            v
        };
        for p in 1..=MAX_RANKS {
            for c in colls(p) {
                for count in [0usize, 1, 3, 16, 17, 100, 1027] {
                    for (t, op) in [
                        (DataType::F16, ReduceOp::Sum),
                        (DataType::I32, ReduceOp::Avg),
                        (DataType::U8, ReduceOp::Max),
                        (DataType::F64, ReduceOp::Prod),
                    ] {
                        // None, all, and two mixes of ranks in place.
                        for in_place in [0, u32::MAX, 0b0101_0101, 0b1001_0110] {
                            check(c, p, count, t, op, in_place);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slices_cover_the_buffer_aligned_and_tasks_stay_within_limits() {
        for p in 1..=MAX_RANKS {
            for count in [0usize, 1, 2, 7, 64, 1000, (1 << 20) + 3] {
                for elem in [1usize, 2, 4, 8] {
                    assert_eq!(slice_len(count, p, elem) * elem % 16, 0);
                    let covered: usize = (0..p).map(|r| slice(count, p, elem, r)).map(|(a, b)| b - a).sum();
                    assert_eq!(covered, count);
                }
            }
        }
        // The largest per-rank work bounds every rank's tasks.
        let bufs: Vec<Bufs> =
            (0..8).map(|q| Bufs { send: (q as u64 + 1) << 32, recv: (q as u64 + 9) << 32 }).collect();
        for c in [
            DeviceColl::AllReduce,
            DeviceColl::AllToAll,
            DeviceColl::Reduce(3),
            DeviceColl::AllGather,
            DeviceColl::Broadcast(0),
        ] {
            for r in 0..8 {
                let moved: usize = tasks(c, 1000, 4, r, &bufs)
                    .iter()
                    .map(|t| t.span(4) * (t.srcs.len() + t.dsts.len()))
                    .sum();
                assert!(moved <= work_bytes(c, 1000, 4, 8), "{c:?} rank {r}: {moved}");
            }
        }
    }
}
