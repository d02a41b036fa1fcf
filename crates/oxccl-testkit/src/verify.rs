//! Verifiable inputs and their expected results (the nccl-tests method).
//!
//! Every rank can compute every rank's input, so every rank can check its own output exactly.
//! Inputs are chosen so that every reduction order gives the same value:
//! - integers: any bits (wrapping arithmetic is associative and commutative);
//! - floats, `Sum`/`Avg`: integers in `±M`, with `M · ranks` within the type's exact-integer
//!   range, so every partial sum is exact;
//! - floats, `Prod`: ±1, ±2, ±½, so every partial product is an exact power of two;
//! - floats, `Min`/`Max` and data movement: integers within the type's exact range (no −0).
//!
//! The reference is computed here, in `f64` and native integers, independently of the
//! library's kernels. Output buffers are poisoned with the bitwise complement of the expected
//! bytes, so an element the library fails to write can never pass.

use half::{bf16, f16};
use oxccl_core::fp8::{F8E4M3, F8E5M2};
use oxccl_core::{DataType, ReduceOp};

/// A 64-bit mix of the inputs (splitmix64).
pub fn hash(seed: u64, rank: usize, index: usize) -> u64 {
    let mut z = seed
        .wrapping_add((rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add((index as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The largest integer magnitude below which every integer is exact in `dtype`.
fn exact_int_limit(dtype: DataType) -> i64 {
    match dtype {
        DataType::F8E5M2 => 8,
        DataType::F8E4M3 => 16,
        DataType::Bf16 => 256,
        DataType::F16 => 2048,
        DataType::F32 => 1 << 24,
        DataType::F64 => 1 << 53,
        _ => i64::MAX,
    }
}

/// What an input is used for: a reduction with an operator, or data movement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    Reduce(ReduceOp),
    Move,
}

/// `h` mapped to `0..n` (multiply-high: cheaper than a division, still uniform enough).
fn below(h: u64, n: u64) -> u64 {
    ((h >> 32) * n) >> 32
}

/// The value range of a float input: (m, prod) — integers in ±m, or powers of two.
fn float_range(dtype: DataType, u: Use, nranks: usize) -> (i64, bool) {
    let lim = exact_int_limit(dtype);
    match u {
        Use::Reduce(ReduceOp::Sum) | Use::Reduce(ReduceOp::Avg) => {
            ((lim / nranks.max(1) as i64).clamp(1, 1000), false)
        }
        Use::Reduce(ReduceOp::Prod) => (0, true),
        _ => (lim.min(100), false),
    }
}

#[inline(always)]
fn float_value(range: (i64, bool), h: u64) -> f64 {
    const POW: [f64; 6] = [1.0, -1.0, 2.0, -2.0, 0.5, -0.5];
    if range.1 {
        POW[below(h, 6) as usize]
    } else {
        below(h, 2 * range.0 as u64 + 1) as i64 as f64 - range.0 as f64
    }
}

#[cfg(test)]
fn float_input(dtype: DataType, u: Use, nranks: usize, h: u64) -> f64 {
    float_value(float_range(dtype, u, nranks), h)
}

fn put_float(dtype: DataType, v: f64, out: &mut [u8]) {
    match dtype {
        DataType::F16 => out.copy_from_slice(&f16::from_f64(v).to_ne_bytes()),
        DataType::Bf16 => out.copy_from_slice(&bf16::from_f64(v).to_ne_bytes()),
        DataType::F32 => out.copy_from_slice(&(v as f32).to_ne_bytes()),
        DataType::F64 => out.copy_from_slice(&v.to_ne_bytes()),
        DataType::F8E4M3 => out[0] = F8E4M3::from_f32(v as f32).0,
        DataType::F8E5M2 => out[0] = F8E5M2::from_f32(v as f32).0,
        _ => unreachable!("put_float on an integer type"),
    }
}

/// Writes rank `rank`'s input elements `first..first + n` (bytes of `dtype`) into `out`.
pub fn fill_input(
    dtype: DataType,
    u: Use,
    nranks: usize,
    rank: usize,
    seed: u64,
    first: usize,
    out: &mut [u8],
) {
    let es = dtype.size_bytes();
    if dtype.is_float() {
        let range = float_range(dtype, u, nranks);
        for (k, e) in out.chunks_exact_mut(es).enumerate() {
            put_float(dtype, float_value(range, hash(seed, rank, first + k)), e);
        }
    } else {
        for (k, e) in out.chunks_exact_mut(es).enumerate() {
            e.copy_from_slice(&hash(seed, rank, first + k).to_ne_bytes()[..es]);
        }
    }
}

fn int_fold<T: Copy + Into<i128> + TryFrom<i128>>(
    op: ReduceOp,
    nranks: usize,
    mut vals: impl Iterator<Item = T>,
    ops: IntOps<T>,
) -> T {
    let first = vals.next().unwrap_or(ops.zero);
    let acc = vals.fold(first, |a, x| match op {
        ReduceOp::Sum | ReduceOp::Avg => (ops.add)(a, x),
        ReduceOp::Prod => (ops.mul)(a, x),
        ReduceOp::Max => {
            if a.into() >= x.into() {
                a
            } else {
                x
            }
        }
        ReduceOp::Min => {
            if a.into() <= x.into() {
                a
            } else {
                x
            }
        }
        ReduceOp::BitAnd => (ops.and)(a, x),
        ReduceOp::BitOr => (ops.or)(a, x),
        ReduceOp::BitXor => (ops.xor)(a, x),
    });
    if op == ReduceOp::Avg && nranks > 1 {
        // The library divides in a type wide enough for any rank count.
        T::try_from(acc.into() / nranks as i128).unwrap_or(ops.zero)
    } else {
        acc
    }
}

/// Wrapping arithmetic of one integer type.
#[derive(Clone, Copy)]
struct IntOps<T> {
    zero: T,
    add: fn(T, T) -> T,
    mul: fn(T, T) -> T,
    and: fn(T, T) -> T,
    or: fn(T, T) -> T,
    xor: fn(T, T) -> T,
}

macro_rules! int_ops {
    ($t:ty) => {
        IntOps::<$t> {
            zero: 0,
            add: |a, b| a.wrapping_add(b),
            mul: |a, b| a.wrapping_mul(b),
            and: |a, b| a & b,
            or: |a, b| a | b,
            xor: |a, b| a ^ b,
        }
    };
}

macro_rules! int_expected {
    ($t:ty, $op:expr, $p:expr, $seed:expr, $first:expr, $out:expr) => {{
        let ops = int_ops!($t);
        for (k, e) in $out.chunks_exact_mut(std::mem::size_of::<$t>()).enumerate() {
            let v = int_fold($op, $p, (0..$p).map(|r| hash($seed, r, $first + k) as $t), ops);
            e.copy_from_slice(&v.to_ne_bytes());
        }
    }};
}

/// The expected reduction of elements `first..first + n`.
pub fn expected_reduction(
    dtype: DataType,
    op: ReduceOp,
    nranks: usize,
    seed: u64,
    first: usize,
    n: usize,
) -> Vec<u8> {
    let es = dtype.size_bytes();
    let mut out = vec![0u8; n * es];
    let p = nranks;
    match dtype {
        DataType::I8 => int_expected!(i8, op, p, seed, first, out),
        DataType::U8 => int_expected!(u8, op, p, seed, first, out),
        DataType::I32 => int_expected!(i32, op, p, seed, first, out),
        DataType::U32 => int_expected!(u32, op, p, seed, first, out),
        DataType::I64 => int_expected!(i64, op, p, seed, first, out),
        DataType::U64 => int_expected!(u64, op, p, seed, first, out),
        _ => {
            let range = float_range(dtype, Use::Reduce(op), p);
            for (k, e) in out.chunks_exact_mut(es).enumerate() {
                let mut vals = (0..p).map(|r| float_value(range, hash(seed, r, first + k)));
                let first_v = vals.next().unwrap_or(0.0);
                let acc = vals.fold(first_v, |a, x| match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + x,
                    ReduceOp::Prod => a * x,
                    ReduceOp::Max => a.max(x),
                    ReduceOp::Min => a.min(x),
                    _ => unreachable!("bitwise operator on a float type"),
                });
                let v = if op == ReduceOp::Avg && p > 1 {
                    // The library divides once: in f64 for f64, in f32 otherwise.
                    match dtype {
                        DataType::F64 => acc / p as f64,
                        _ => (acc as f32 / p as f32) as f64,
                    }
                } else {
                    acc
                };
                put_float(dtype, v, e);
            }
        }
    }
    out
}

/// Rank `rank`'s input for `n` elements starting at `first`, as a byte vector.
pub fn input(
    dtype: DataType,
    u: Use,
    nranks: usize,
    rank: usize,
    seed: u64,
    first: usize,
    n: usize,
) -> Vec<u8> {
    let mut v = vec![0u8; n * dtype.size_bytes()];
    fill_input(dtype, u, nranks, rank, seed, first, &mut v);
    v
}

/// A buffer that differs from `expected` in every byte.
pub fn poison_for(expected: &[u8]) -> Vec<u8> {
    expected.iter().map(|b| !b).collect()
}

/// The first element where `got` differs from `want`, described for a failure message.
pub fn first_mismatch(dtype: DataType, got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None;
    }
    if got.len() != want.len() {
        return Some(format!("length {} vs expected {}", got.len(), want.len()));
    }
    let es = dtype.size_bytes();
    let bad = got.chunks_exact(es).zip(want.chunks_exact(es)).position(|(a, b)| a != b)?;
    let wrong = got.chunks_exact(es).zip(want.chunks_exact(es)).filter(|(a, b)| a != b).count();
    Some(format!(
        "{wrong} wrong element(s); first at index {bad}: got {:02x?}, expected {:02x?}",
        &got[bad * es..(bad + 1) * es],
        &want[bad * es..(bad + 1) * es]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_are_order_independent_and_exact() {
        // Fold in reverse order with the types' own arithmetic: same bytes as the reference.
        for dtype in [DataType::F16, DataType::Bf16, DataType::F8E4M3, DataType::F8E5M2, DataType::F32] {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                for p in [2usize, 5, 8] {
                    for i in 0..200 {
                        let want = expected_reduction(dtype, op, p, 7, i, 1);
                        let vals: Vec<f32> = (0..p)
                            .rev()
                            .map(|r| float_input(dtype, Use::Reduce(op), p, hash(7, r, i)) as f32)
                            .collect();
                        let mut acc = vals[0];
                        for v in &vals[1..] {
                            let x = match op {
                                ReduceOp::Sum => acc + v,
                                ReduceOp::Prod => acc * v,
                                ReduceOp::Max => acc.max(*v),
                                _ => acc.min(*v),
                            };
                            // Round through the type after every step, as a ring would.
                            let mut b = vec![0u8; dtype.size_bytes()];
                            put_float(dtype, x as f64, &mut b);
                            acc = match dtype {
                                DataType::F16 => f16::from_ne_bytes([b[0], b[1]]).to_f32(),
                                DataType::Bf16 => bf16::from_ne_bytes([b[0], b[1]]).to_f32(),
                                DataType::F8E4M3 => F8E4M3(b[0]).to_f32(),
                                DataType::F8E5M2 => F8E5M2(b[0]).to_f32(),
                                _ => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
                            };
                        }
                        let mut got = vec![0u8; dtype.size_bytes()];
                        put_float(dtype, acc as f64, &mut got);
                        assert_eq!(got, want, "{dtype} {op} p={p} i={i}");
                    }
                }
            }
        }
    }

    #[test]
    fn poison_differs_everywhere() {
        let e = expected_reduction(DataType::U8, ReduceOp::Sum, 3, 1, 0, 1000);
        let p = poison_for(&e);
        assert!(e.iter().zip(&p).all(|(a, b)| a != b));
        assert!(first_mismatch(DataType::U8, &p, &e).is_some());
        assert!(first_mismatch(DataType::U8, &e, &e).is_none());
    }
}
