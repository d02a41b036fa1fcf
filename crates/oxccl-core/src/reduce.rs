//! Element-wise reductions over byte buffers: the CPU reduction kernels the engine runs and the
//! plan simulator uses.
//!
//! Rules:
//! 1. Buffers are byte slices whose length is a multiple of the element size; the kernels cast
//!    them to typed slices when every buffer is aligned for the type (the common case: user
//!    buffers, shared-memory slots and staging buffers are all aligned), and fall back to
//!    unaligned loads and stores otherwise, with the same results.
//! 2. Integer arithmetic wraps, so every reduction order gives the same integer result.
//! 3. f16, bf16 and both fp8 formats are widened to f32, combined, and rounded once per call
//!    (NCCL's "wider accumulation"); f32 and f64 are combined in their own precision.
//! 4. `Avg` is a sum during the reduction and one division by the rank count at the end
//!    ([`finalize`]), applied once by whichever rank produces the final value.
//! 5. Bitwise operators on a float type act on its bit pattern; the API rejects that
//!    combination before any kernel runs, so it is never reached from user input.

use crate::dtype::{DataType, ReduceOp};
use crate::error::CoreError;
use crate::fp8::{decode_tables, F8E4M3, F8E5M2};
use bytemuck::Pod;
use half::{bf16, f16};

/// What a reduction combines and how: checked once, used for every chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceCtx {
    dtype: DataType,
    op: ReduceOp,
    nranks: u32,
}

impl ReduceCtx {
    /// A reduction of `dtype` with `op` over `nranks` ranks.
    pub fn new(dtype: DataType, op: ReduceOp, nranks: u32) -> Result<Self, CoreError> {
        op.check(dtype)?;
        Ok(Self { dtype, op, nranks })
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The operator.
    pub fn op(&self) -> ReduceOp {
        self.op
    }

    /// Whether the final value needs [`finalize`].
    pub fn needs_finalize(&self) -> bool {
        self.op == ReduceOp::Avg && self.nranks > 1
    }
}

fn aligned<T>(b: &[u8]) -> bool {
    (b.as_ptr() as usize) % core::mem::align_of::<T>() == 0
}

/// dst[i] = f(a[i], b[i]).
#[inline(always)]
fn binary<T: Pod>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(T, T) -> T) {
    let n = dst.len().min(a.len()).min(b.len());
    let (dst, a, b) = (&mut dst[..n], &a[..n], &b[..n]);
    if aligned::<T>(dst) && aligned::<T>(a) && aligned::<T>(b) {
        let d: &mut [T] = bytemuck::cast_slice_mut(dst);
        let x: &[T] = bytemuck::cast_slice(a);
        let y: &[T] = bytemuck::cast_slice(b);
        for ((d, x), y) in d.iter_mut().zip(x).zip(y) {
            *d = f(*x, *y);
        }
    } else {
        let s = core::mem::size_of::<T>();
        for ((d, x), y) in dst.chunks_exact_mut(s).zip(a.chunks_exact(s)).zip(b.chunks_exact(s)) {
            let v = f(bytemuck::pod_read_unaligned(x), bytemuck::pod_read_unaligned(y));
            d.copy_from_slice(bytemuck::bytes_of(&v));
        }
    }
}

/// acc[i] = f(acc[i], b[i]).
#[inline(always)]
fn accumulate<T: Pod>(acc: &mut [u8], b: &[u8], f: impl Fn(T, T) -> T) {
    let n = acc.len().min(b.len());
    let (acc, b) = (&mut acc[..n], &b[..n]);
    if aligned::<T>(acc) && aligned::<T>(b) {
        let d: &mut [T] = bytemuck::cast_slice_mut(acc);
        let y: &[T] = bytemuck::cast_slice(b);
        for (d, y) in d.iter_mut().zip(y) {
            *d = f(*d, *y);
        }
    } else {
        let s = core::mem::size_of::<T>();
        for (d, y) in acc.chunks_exact_mut(s).zip(b.chunks_exact(s)) {
            let v = f(bytemuck::pod_read_unaligned(d), bytemuck::pod_read_unaligned(y));
            d.copy_from_slice(bytemuck::bytes_of(&v));
        }
    }
}

/// buf[i] = f(buf[i]).
#[inline(always)]
fn map<T: Pod>(buf: &mut [u8], f: impl Fn(T) -> T) {
    if aligned::<T>(buf) {
        let s = buf.len() / core::mem::size_of::<T>() * core::mem::size_of::<T>();
        for d in bytemuck::cast_slice_mut::<u8, T>(&mut buf[..s]) {
            *d = f(*d);
        }
    } else {
        let s = core::mem::size_of::<T>();
        for d in buf.chunks_exact_mut(s) {
            let v = f(bytemuck::pod_read_unaligned(d));
            d.copy_from_slice(bytemuck::bytes_of(&v));
        }
    }
}

/// The kernel shape a dispatch targets: `dst = a ⊕ b` or `acc = acc ⊕ b`.
enum Target<'a> {
    Binary(&'a mut [u8], &'a [u8], &'a [u8]),
    Accumulate(&'a mut [u8], &'a [u8]),
}

macro_rules! run {
    ($t:ty, $target:expr, $f:expr) => {
        match $target {
            Target::Binary(d, a, b) => binary::<$t>(d, a, b, $f),
            Target::Accumulate(d, b) => accumulate::<$t>(d, b, $f),
        }
    };
}

macro_rules! int_kernel {
    ($t:ty, $op:expr, $target:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => run!($t, $target, |x: $t, y: $t| x.wrapping_add(y)),
            ReduceOp::Prod => run!($t, $target, |x: $t, y: $t| x.wrapping_mul(y)),
            ReduceOp::Max => run!($t, $target, |x: $t, y: $t| if x > y { x } else { y }),
            ReduceOp::Min => run!($t, $target, |x: $t, y: $t| if x < y { x } else { y }),
            ReduceOp::BitAnd => run!($t, $target, |x: $t, y: $t| x & y),
            ReduceOp::BitOr => run!($t, $target, |x: $t, y: $t| x | y),
            ReduceOp::BitXor => run!($t, $target, |x: $t, y: $t| x ^ y),
        }
    };
}

macro_rules! float_kernel {
    ($t:ty, $bits:ty, $op:expr, $target:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => run!($t, $target, |x: $t, y: $t| x + y),
            ReduceOp::Prod => run!($t, $target, |x: $t, y: $t| x * y),
            ReduceOp::Max => run!($t, $target, |x: $t, y: $t| x.max(y)),
            ReduceOp::Min => run!($t, $target, |x: $t, y: $t| x.min(y)),
            ReduceOp::BitAnd => run!($bits, $target, |x: $bits, y: $bits| x & y),
            ReduceOp::BitOr => run!($bits, $target, |x: $bits, y: $bits| x | y),
            ReduceOp::BitXor => run!($bits, $target, |x: $bits, y: $bits| x ^ y),
        }
    };
}

/// A narrow float: widened to f32 to combine, rounded back once.
macro_rules! narrow_kernel {
    ($t:ty, $bits:ty, $op:expr, $target:expr, $to:expr, $from:expr) => {{
        let to = $to;
        let from = $from;
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => run!($t, $target, |x: $t, y: $t| from(to(x) + to(y))),
            ReduceOp::Prod => run!($t, $target, |x: $t, y: $t| from(to(x) * to(y))),
            ReduceOp::Max => run!($t, $target, |x: $t, y: $t| from(to(x).max(to(y)))),
            ReduceOp::Min => run!($t, $target, |x: $t, y: $t| from(to(x).min(to(y)))),
            ReduceOp::BitAnd => run!($bits, $target, |x: $bits, y: $bits| x & y),
            ReduceOp::BitOr => run!($bits, $target, |x: $bits, y: $bits| x | y),
            ReduceOp::BitXor => run!($bits, $target, |x: $bits, y: $bits| x ^ y),
        }
    }};
}

fn dispatch(ctx: &ReduceCtx, target: Target<'_>) {
    let t = decode_tables();
    match ctx.dtype {
        DataType::I8 => int_kernel!(i8, ctx.op, target),
        DataType::U8 => int_kernel!(u8, ctx.op, target),
        DataType::I32 => int_kernel!(i32, ctx.op, target),
        DataType::U32 => int_kernel!(u32, ctx.op, target),
        DataType::I64 => int_kernel!(i64, ctx.op, target),
        DataType::U64 => int_kernel!(u64, ctx.op, target),
        DataType::F32 => float_kernel!(f32, u32, ctx.op, target),
        DataType::F64 => float_kernel!(f64, u64, ctx.op, target),
        DataType::F16 => {
            narrow_kernel!(f16, u16, ctx.op, target, |x: f16| x.to_f32(), f16::from_f32)
        }
        DataType::Bf16 => {
            narrow_kernel!(bf16, u16, ctx.op, target, |x: bf16| x.to_f32(), bf16::from_f32)
        }
        DataType::F8E4M3 => {
            narrow_kernel!(F8E4M3, u8, ctx.op, target, |x: F8E4M3| t.e4m3[x.0 as usize], F8E4M3::from_f32)
        }
        DataType::F8E5M2 => {
            narrow_kernel!(F8E5M2, u8, ctx.op, target, |x: F8E5M2| t.e5m2[x.0 as usize], F8E5M2::from_f32)
        }
    }
}

/// `dst = a ⊕ b`, element-wise over the common length.
pub fn reduce_to(ctx: &ReduceCtx, dst: &mut [u8], a: &[u8], b: &[u8]) {
    dispatch(ctx, Target::Binary(dst, a, b));
}

/// `acc = acc ⊕ b`, element-wise over the common length.
pub fn reduce_into(ctx: &ReduceCtx, acc: &mut [u8], b: &[u8]) {
    dispatch(ctx, Target::Accumulate(acc, b));
}

/// `out = srcs[0] ⊕ srcs[1] ⊕ …`, element-wise, in source order (so every rank that computes
/// the same sources gets the same bits); `out` must not alias a source. With one source it is a
/// copy. Finalizing (Avg) is the caller's choice, see [`finalize`].
pub fn reduce_many(ctx: &ReduceCtx, out: &mut [u8], srcs: &[&[u8]]) {
    match srcs {
        [] => {}
        [a] => out.copy_from_slice(&a[..out.len()]),
        [a, b, rest @ ..] => {
            reduce_to(ctx, out, a, b);
            for s in rest {
                reduce_into(ctx, out, s);
            }
        }
    }
}

/// Turns a finished reduction into its final value: for `Avg`, divides by the rank count.
/// A no-op for every other operator.
pub fn finalize(ctx: &ReduceCtx, buf: &mut [u8]) {
    if !ctx.needs_finalize() {
        return;
    }
    let n = ctx.nranks;
    macro_rules! div_int {
        ($t:ty) => {
            map::<$t>(buf, |x: $t| x / (n as $t))
        };
    }
    let t = decode_tables();
    match ctx.dtype {
        // Integer division truncates toward zero; narrow types divide in a wider type so
        // that any rank count is a valid divisor.
        DataType::I8 => map::<i8>(buf, |x| (x as i32 / n as i32) as i8),
        DataType::U8 => map::<u8>(buf, |x| (x as u32 / n) as u8),
        DataType::I32 => map::<i32>(buf, |x| (x as i64 / n as i64) as i32),
        DataType::U32 => div_int!(u32),
        DataType::I64 => div_int!(i64),
        DataType::U64 => div_int!(u64),
        DataType::F32 => map::<f32>(buf, |x| x / n as f32),
        DataType::F64 => map::<f64>(buf, |x| x / n as f64),
        DataType::F16 => map::<f16>(buf, |x| f16::from_f32(x.to_f32() / n as f32)),
        DataType::Bf16 => map::<bf16>(buf, |x| bf16::from_f32(x.to_f32() / n as f32)),
        DataType::F8E4M3 => map::<F8E4M3>(buf, |x| F8E4M3::from_f32(t.e4m3[x.0 as usize] / n as f32)),
        DataType::F8E5M2 => map::<F8E5M2>(buf, |x| F8E5M2::from_f32(t.e5m2[x.0 as usize] / n as f32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn integer_ops_wrap() {
        let ctx = ReduceCtx::new(DataType::U8, ReduceOp::Sum, 2).unwrap();
        let mut d = vec![0u8; 3];
        reduce_to(&ctx, &mut d, &[250, 1, 2], &[10, 2, 3]);
        assert_eq!(d, [4, 3, 5]);
        let ctx = ReduceCtx::new(DataType::I32, ReduceOp::Min, 2).unwrap();
        let mut d = bytes(&[5i32, -7, 3]);
        reduce_into(&ctx, &mut d, &bytes(&[-1i32, 9, 3]));
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&d), &[-1, -7, 3]);
        let ctx = ReduceCtx::new(DataType::U64, ReduceOp::BitXor, 2).unwrap();
        let mut d = bytes(&[0xf0u64]);
        reduce_into(&ctx, &mut d, &bytes(&[0xffu64]));
        assert_eq!(bytemuck::cast_slice::<u8, u64>(&d), &[0x0f]);
    }

    #[test]
    fn unaligned_buffers_give_the_same_result() {
        let ctx = ReduceCtx::new(DataType::F64, ReduceOp::Prod, 2).unwrap();
        let a = bytes(&[1.5f64, -2.0, 4.0]);
        let b = bytes(&[2.0f64, 3.0, 0.25]);
        let mut store = [0u8; 25];
        let mut a1 = [0u8; 25];
        let mut b1 = [0u8; 25];
        a1[1..].copy_from_slice(&a);
        b1[1..].copy_from_slice(&b);
        reduce_to(&ctx, &mut store[1..], &a1[1..], &b1[1..]);
        let got: Vec<f64> = store[1..].chunks_exact(8).map(bytemuck::pod_read_unaligned).collect();
        assert_eq!(got, [3.0, -6.0, 1.0]);
    }

    #[test]
    fn narrow_floats_widen_and_avg_finalizes() {
        let ctx = ReduceCtx::new(DataType::F16, ReduceOp::Avg, 4).unwrap();
        let mut d = bytes(&[f16::from_f32(6.0), f16::from_f32(-2.0)]);
        reduce_into(&ctx, &mut d, &bytes(&[f16::from_f32(2.0), f16::from_f32(-2.0)]));
        finalize(&ctx, &mut d);
        let got: &[f16] = bytemuck::cast_slice(&d);
        assert_eq!(got, &[f16::from_f32(2.0), f16::from_f32(-1.0)]);
        let ctx = ReduceCtx::new(DataType::F8E4M3, ReduceOp::Max, 2).unwrap();
        let mut d = vec![F8E4M3::from_f32(3.0).0];
        reduce_into(&ctx, &mut d, &[F8E4M3::from_f32(-4.0).0]);
        assert_eq!(F8E4M3(d[0]).to_f32(), 3.0);
        let ctx = ReduceCtx::new(DataType::I32, ReduceOp::Avg, 3).unwrap();
        let mut d = bytes(&[7i32, -7]);
        finalize(&ctx, &mut d);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&d), &[2, -2]);
    }

    #[test]
    fn reduce_many_folds_in_order() {
        let ctx = ReduceCtx::new(DataType::I32, ReduceOp::Sum, 3).unwrap();
        let (a, b, c) = (bytes(&[1i32, 2]), bytes(&[10i32, 20]), bytes(&[100i32, 200]));
        let mut out = vec![0u8; 8];
        reduce_many(&ctx, &mut out, &[&a, &b, &c]);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&out), &[111, 222]);
        reduce_many(&ctx, &mut out, &[&c]);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&out), &[100, 200]);
    }

    #[test]
    fn bitwise_on_float_is_rejected() {
        assert!(ReduceCtx::new(DataType::Bf16, ReduceOp::BitAnd, 2).is_err());
    }
}
