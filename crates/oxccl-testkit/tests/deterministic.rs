//! Deterministic mode (`OXCCL_DETERMINISTIC=1`) keeps its promise at every size: all_reduce (out
//! of place and in place), reduce (to every root at small counts) and reduce_scatter give, on
//! every rank and for every element, the bits of the rank-order fold `((x0 ⊕ x1) ⊕ x2) ⊕ …`,
//! computed here independently — whatever the algorithm, protocol, channel count, slot size,
//! transport (shared memory, TCP), buffer kind (heap, `SharedBuf`) and whether the direct path
//! is on; for world sizes 2 to 5, at log-spaced odd counts from 1 to about 2^22, with inputs
//! whose sums depend on the order they are added in (f32 sums at every count; bf16 and f64
//! sums, and Avg and Prod of all three types, at a few counts).

use half::bf16;
use oxccl::mem::SharedBuf;
use oxccl::{Communicator, Config, Rank, ReduceOp};
use oxccl_core::tuner::Enabled;
use oxccl_core::Element;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

/// Counts every setting runs at every world size: where one-shot, the direct path's inline
/// area and a single chunk end (the sizes the mode's promise was broken at).
const SMALL: [usize; 12] = [1, 3, 7, 13, 31, 61, 127, 251, 509, 1021, 2047, 4093];
/// Counts every setting runs at every world size: several chunks and rounds.
const MID: [usize; 6] = [8191, 16381, 32749, 65521, 131071, 262139];
/// Counts of bf16 and f64 sums and of Avg and Prod (every setting, every world size).
const OTHER_TYPES: [usize; 4] = [7, 1021, 4093, 32749];

/// About 2^19 to 2^21, odd: run by each setting at one world size of 3 to 5
/// ([`Setting::big_ranks`]), the last one only by settings without [`Setting::huge`].
const BIG: [usize; 3] = [524_287, 1_048_583, 2_097_143];
/// About 2^22: run instead of 2^21 by the settings with [`Setting::huge`].
const HUGE: usize = 4_194_301;

/// Inputs whose sums depend on the order they are added in: mixed signs and magnitudes.
trait Val: Element + Copy + PartialEq {
    const NAME: &'static str;
    fn at(rank: usize, i: usize) -> Self;
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    /// Avg's final division by the rank count.
    fn div(a: Self, n: usize) -> Self;
    fn bits(self) -> u64;
}

fn mix(r: usize, i: usize) -> u64 {
    let h = (r as u64 * 0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = (h ^ (h >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 29)
}

impl Val for f32 {
    const NAME: &'static str = "f32";
    fn at(r: usize, i: usize) -> f32 {
        let h = mix(r, i);
        const SCALE: [f32; 7] = [1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3];
        ((h >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * SCALE[(h % 7) as usize]
    }
    fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    fn div(a: f32, n: usize) -> f32 {
        a / n as f32
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}

impl Val for f64 {
    const NAME: &'static str = "f64";
    fn at(r: usize, i: usize) -> f64 {
        let h = mix(r, i);
        const SCALE: [f64; 7] = [1e-6, 1e-4, 1e-2, 1.0, 1e2, 1e4, 1e6];
        ((h >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * SCALE[(h % 7) as usize]
    }
    fn add(a: f64, b: f64) -> f64 {
        a + b
    }
    fn mul(a: f64, b: f64) -> f64 {
        a * b
    }
    fn div(a: f64, n: usize) -> f64 {
        a / n as f64
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

impl Val for bf16 {
    const NAME: &'static str = "bf16";
    fn at(r: usize, i: usize) -> bf16 {
        bf16::from_f32(f32::at(r, i))
    }
    /// The kernels' rule: widened to f32, combined, rounded back.
    fn add(a: bf16, b: bf16) -> bf16 {
        bf16::from_f32(a.to_f32() + b.to_f32())
    }
    fn mul(a: bf16, b: bf16) -> bf16 {
        bf16::from_f32(a.to_f32() * b.to_f32())
    }
    fn div(a: bf16, n: usize) -> bf16 {
        bf16::from_f32(a.to_f32() / n as f32)
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}

/// The rank-order fold of element `i` over `p` ranks under `op` (Sum, Prod or Avg).
fn fold<T: Val>(op: ReduceOp, p: usize, i: usize) -> T {
    let f = if op == ReduceOp::Prod { T::mul } else { T::add };
    let x = (1..p).fold(T::at(0, i), |a, q| f(a, T::at(q, i)));
    if op == ReduceOp::Avg {
        T::div(x, p)
    } else {
        x
    }
}

/// A heap buffer or a shared allocation peers can map (the direct path's zero-copy).
enum Buf<T: Element> {
    Heap(Vec<T>),
    Shared(SharedBuf<T>),
}

impl<T: Element> Buf<T> {
    fn new(shared: bool, data: Vec<T>) -> Buf<T> {
        if shared {
            Buf::Shared(SharedBuf::from_slice(&data).unwrap())
        } else {
            Buf::Heap(data)
        }
    }
}

impl<T: Element> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Heap(v) => v,
            Buf::Shared(s) => s,
        }
    }
}

impl<T: Element> DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Heap(v) => v,
            Buf::Shared(s) => s,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Setting {
    name: &'static str,
    algo: Option<&'static str>,
    proto: Option<&'static str>,
    /// `with_channels` (0: the communicator's default).
    channels: usize,
    /// `NCCL_BUFFSIZE` (0: the default).
    buffsize: usize,
    /// Ranks per simulated host (0: all on one host); across hosts ranks talk over TCP.
    per_host: usize,
    shm: bool,
    shared: bool,
    direct: bool,
    /// The world size this setting also runs [`BIG`] counts at.
    big_ranks: usize,
    /// There, [`HUGE`] instead of the largest of [`BIG`].
    huge: bool,
}

const fn base(name: &'static str, big_ranks: usize) -> Setting {
    Setting {
        name,
        algo: None,
        proto: None,
        channels: 0,
        buffsize: 0,
        per_host: 0,
        shm: true,
        shared: false,
        direct: true,
        big_ranks,
        huge: false,
    }
}

/// Tree all-reduce, with every other collective on the ring (Tree runs all-reduce only and
/// needs 3 ranks: at 2 ranks the setting refuses all-reduce, which algorithms.rs tests).
const TREE: &str = "ring;allreduce:tree";

const SETTINGS: [Setting; 18] = [
    Setting { huge: true, ..base("default", 4) },
    Setting { algo: Some("ring"), ..base("NCCL_ALGO=ring", 5) },
    Setting { algo: Some(TREE), huge: true, ..base("NCCL_ALGO=tree", 3) },
    Setting { algo: Some(TREE), per_host: 2, ..base("NCCL_ALGO=tree, 2 ranks per host", 5) },
    Setting { algo: Some("ring;allreduce:direct"), ..base("NCCL_ALGO=direct", 3) },
    Setting { proto: Some("LL"), direct: false, huge: true, ..base("NCCL_PROTO=LL", 3) },
    Setting { proto: Some("LL128"), direct: false, ..base("NCCL_PROTO=LL128", 4) },
    Setting { proto: Some("Simple"), direct: false, ..base("NCCL_PROTO=Simple", 5) },
    Setting { channels: 1, direct: false, ..base("1 channel", 4) },
    Setting { channels: 2, direct: false, algo: Some("ring"), ..base("2 channels, ring", 3) },
    Setting { channels: 4, direct: false, per_host: 1, ..base("4 channels, TCP", 4) },
    Setting { buffsize: 16 << 10, direct: false, ..base("NCCL_BUFFSIZE=16384", 5) },
    Setting { per_host: 1, huge: true, ..base("TCP (a host per rank)", 3) },
    Setting { per_host: 2, ..base("2 ranks per host (shm and TCP)", 3) },
    Setting { shm: false, huge: true, ..base("NCCL_SHM_DISABLE=1", 4) },
    Setting { shared: true, huge: true, ..base("SharedBuf (zero-copy)", 5) },
    Setting { shared: true, direct: false, ..base("SharedBuf, direct path off", 4) },
    Setting { direct: false, ..base("direct path off", 3) },
];

impl Setting {
    fn config(&self, deterministic: bool) -> Config {
        let mut c = Config::default()
            .with_timeout(Some(Duration::from_secs(120)))
            .with_shm_disabled(!self.shm)
            .with_direct(self.direct);
        c.enabled = Enabled::parse(self.algo, self.proto).unwrap();
        if self.channels > 0 {
            c = c.with_channels(self.channels);
        }
        if self.buffsize > 0 {
            c = c.with_buffsize(self.buffsize);
        }
        c.deterministic = deterministic;
        c
    }

    fn min_ranks(&self) -> usize {
        if self.algo == Some(TREE) {
            3
        } else {
            2
        }
    }

    /// The f32 counts this setting runs at world size `n`.
    fn counts(&self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = SMALL.iter().chain(&MID).copied().collect();
        if n == self.big_ranks {
            v.extend(&BIG[..2]);
            v.push(if self.huge { HUGE } else { BIG[2] });
        }
        v
    }
}

/// What one rank compared, and what differed.
#[derive(Default)]
struct Tally {
    /// (collective, operator, data type, count) combinations run.
    combos: usize,
    /// Elements compared.
    elems: usize,
    /// (call and type, count, message).
    bad: Vec<(String, usize, String)>,
}

impl Tally {
    fn compare<T: Val>(&mut self, what: &str, count: usize, got: &[T], want: impl Fn(usize) -> T) {
        self.elems += got.len();
        let mut wrong = (0..got.len()).filter(|&i| got[i].bits() != want(i).bits());
        if let Some(first) = wrong.next() {
            let msg = format!(
                "{what} {} count {count}: {} of {} elements differ, first at {first}: got {:#x}, want {:#x}",
                T::NAME,
                1 + wrong.count(),
                got.len(),
                got[first].bits(),
                want(first).bits(),
            );
            self.bad.push((format!("{what} {}", T::NAME), count, msg));
        }
    }
}

/// Runs every reducing collective once at `count` (reduce to each of `roots`) and compares.
fn check<T: Val>(c: &Communicator, shared: bool, op: ReduceOp, count: usize, roots: &[usize], t: &mut Tally) {
    let (me, p) = (c.rank().idx(), c.size());
    let ok = |r: oxccl::Result<()>, what: &str| {
        if let Err(e) = r {
            panic!("rank {me}: {what} {op:?} {} count {count}: {e}", T::NAME)
        }
    };
    let x: Vec<T> = (0..count).map(|i| T::at(me, i)).collect();
    let want: Vec<T> = (0..count).map(|i| fold(op, p, i)).collect();
    let send = Buf::new(shared, x.clone());
    let mut recv = Buf::new(shared, vec![T::zeroed(); count]);
    ok(c.all_reduce(&send, &mut recv, op), "all_reduce");
    let name = |call: &str| if op == ReduceOp::Sum { call.to_string() } else { format!("{call} {op:?}") };
    t.compare(&name("all_reduce"), count, &recv, |i| want[i]);
    let mut buf = Buf::new(shared, x);
    ok(c.all_reduce_in_place(&mut buf, op), "all_reduce_in_place");
    t.compare(&name("all_reduce_in_place"), count, &buf, |i| want[i]);
    t.combos += 2;
    for &root in roots {
        let mut recv = Buf::new(shared, vec![T::zeroed(); count]);
        ok(c.reduce(&send, &mut recv, op, Rank::new(root)), "reduce");
        if me == root {
            t.compare(&name(&format!("reduce to {root}")), count, &recv, |i| want[i]);
        }
        t.combos += 1;
    }
    drop((send, recv, buf, want));
    let send = Buf::new(shared, (0..count * p).map(|i| T::at(me, i)).collect());
    let mut recv = Buf::new(shared, vec![T::zeroed(); count]);
    ok(c.reduce_scatter(&send, &mut recv, op), "reduce_scatter");
    t.compare(&name("reduce_scatter"), count, &recv, |i| fold(op, p, me * count + i));
    t.combos += 1;
}

/// Runs `s` on `n` ranks; returns rank 0's tally and every rank's differences.
fn run(s: Setting, n: usize) -> (Tally, Vec<(String, usize, String)>) {
    let per_host = if s.per_host == 0 { n } else { s.per_host };
    let out = oxccl_testkit::threads(n, per_host, s.config(true), move |c| {
        let p = c.size();
        let mut t = Tally::default();
        let all_roots: Vec<usize> = (0..p).collect();
        for count in s.counts(p) {
            let roots = if count <= 5000 { all_roots.clone() } else { vec![count % p] };
            check::<f32>(&c, s.shared, ReduceOp::Sum, count, &roots, &mut t);
        }
        for count in OTHER_TYPES {
            check::<bf16>(&c, s.shared, ReduceOp::Sum, count, &[p - 1], &mut t);
            check::<f64>(&c, s.shared, ReduceOp::Sum, count, &[0], &mut t);
            // Other order-sensitive operators: Prod, and Avg (a sum divided once).
            for op in [ReduceOp::Avg, ReduceOp::Prod] {
                check::<f32>(&c, s.shared, op, count, &[1], &mut t);
                check::<bf16>(&c, s.shared, op, count, &[0], &mut t);
                check::<f64>(&c, s.shared, op, count, &[p - 1], &mut t);
            }
        }
        t
    });
    let mut bad = Vec::new();
    let mut first = None;
    for (r, t) in out.into_iter().enumerate() {
        bad.extend(t.bad.iter().map(|(w, c, m)| (w.clone(), *c, format!("n={n} {}: rank {r}: {m}", s.name))));
        if r == 0 {
            first = Some(t);
        }
    }
    (first.unwrap_or_default(), bad)
}

#[test]
fn deterministic_reductions_are_the_rank_order_fold_for_every_setting_size_and_world_size() {
    let start = Instant::now();
    let (mut combos, mut elems, mut bad) = (0usize, 0usize, Vec::new());
    let mut big_seen = std::collections::BTreeSet::new();
    for n in 2..=5usize {
        for s in SETTINGS.iter().filter(|s| n >= s.min_ranks()) {
            let t0 = Instant::now();
            let (t, b) = run(*s, n);
            combos += t.combos;
            elems += t.elems;
            if s.counts(n).iter().any(|&c| c > 1 << 20) {
                big_seen.insert(s.name);
            }
            // Which calls differed, at which counts (rank 0's view, else any rank's).
            let mut which = std::collections::BTreeMap::<&str, Vec<usize>>::new();
            for (what, count) in b.iter().map(|(w, c, _)| (w.as_str(), *c)) {
                let v = which.entry(what).or_default();
                if !v.contains(&count) {
                    v.push(count);
                }
            }
            oxccl_testkit::report!(
                "n={n} {}: {} combinations in {:.2} s{}",
                s.name,
                t.combos,
                t0.elapsed().as_secs_f64(),
                if which.is_empty() { String::new() } else { format!("; DIFFER: {which:?}") }
            );
            bad.extend(b.into_iter().map(|(_, _, m)| m));
        }
    }
    oxccl_testkit::report!(
        "deterministic: {combos} (world size, setting, collective, operator, type, count) combinations checked, {elems} elements on rank 0, {} results differ, in {:.1} s",
        bad.len(),
        start.elapsed().as_secs_f64()
    );
    // Every setting was compared above 2^20 at some world size.
    assert_eq!(big_seen.len(), SETTINGS.len(), "{big_seen:?}");
    let shown: Vec<&String> = bad.iter().take(40).collect();
    assert!(bad.is_empty(), "{} results differ from the rank-order fold:\n{shown:#?}", bad.len());
}

/// Control: the inputs are order-sensitive — without the mode, the ring and the tree give
/// other bits than the rank-order fold.
#[test]
fn without_the_mode_the_ring_and_the_tree_fold_in_other_orders() {
    for algo in ["ring", TREE] {
        let s = Setting { algo: Some(algo), ..base("control", 0) };
        let out = oxccl_testkit::threads(3, 3, s.config(false), |c| {
            let (me, p) = (c.rank().idx(), c.size());
            let mut t = Tally::default();
            for count in [1021usize, 65521] {
                let x: Vec<f32> = (0..count).map(|i| f32::at(me, i)).collect();
                let mut recv = vec![0f32; count];
                c.all_reduce(&x, &mut recv, ReduceOp::Sum).unwrap();
                t.compare("all_reduce", count, &recv, |i| fold(ReduceOp::Sum, p, i));
            }
            t.bad.len()
        });
        assert!(out.iter().all(|&b| b > 0), "NCCL_ALGO={algo} folded in rank order everywhere: {out:?}");
    }
}
