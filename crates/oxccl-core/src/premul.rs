//! `ncclRedOpCreatePreMulSum`: each rank multiplies its input by a scalar, then the ranks sum.
//!
//! On host memory the multiply is a scaled copy of the input made when the call runs; the
//! collective then sums the copies (the device kernels scale each element the same way as
//! they read it). Integers multiply with wrap-around (as two's-complement
//! hardware does), half-width floats and fp8 multiply in f32 and round once.

use crate::dtype::DataType;
use crate::fp8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

/// `src` scaled by `scalar` (one element of `dtype`, native byte order).
pub fn scaled(dtype: DataType, scalar: &[u8], src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len());
    macro_rules! by {
        ($t:ty, $mul:expr) => {{
            const N: usize = std::mem::size_of::<$t>();
            let s = <$t>::from_ne_bytes(scalar[..N].try_into().expect("scalar width"));
            for c in src.chunks_exact(N) {
                let x = <$t>::from_ne_bytes(c.try_into().expect("element width"));
                let f: fn($t, $t) -> $t = $mul;
                out.extend_from_slice(&f(x, s).to_ne_bytes());
            }
        }};
    }
    macro_rules! narrow {
        ($t:ty, $bits:ty) => {{
            const N: usize = std::mem::size_of::<$bits>();
            let s = <$t>::from_bits(<$bits>::from_ne_bytes(scalar[..N].try_into().expect("scalar width")))
                .to_f32();
            for c in src.chunks_exact(N) {
                let x = <$t>::from_bits(<$bits>::from_ne_bytes(c.try_into().expect("element width")));
                out.extend_from_slice(&<$t>::from_f32(x.to_f32() * s).to_bits().to_ne_bytes());
            }
        }};
    }
    match dtype {
        DataType::I8 => by!(i8, |a, b| a.wrapping_mul(b)),
        DataType::U8 => by!(u8, |a, b| a.wrapping_mul(b)),
        DataType::I32 => by!(i32, |a, b| a.wrapping_mul(b)),
        DataType::U32 => by!(u32, |a, b| a.wrapping_mul(b)),
        DataType::I64 => by!(i64, |a, b| a.wrapping_mul(b)),
        DataType::U64 => by!(u64, |a, b| a.wrapping_mul(b)),
        DataType::F32 => by!(f32, |a, b| a * b),
        DataType::F64 => by!(f64, |a, b| a * b),
        DataType::F16 => narrow!(f16, u16),
        DataType::Bf16 => narrow!(bf16, u16),
        DataType::F8E4M3 => {
            let s = F8E4M3(scalar[0]).to_f32();
            out.extend(src.iter().map(|x| F8E4M3::from_f32(F8E4M3(*x).to_f32() * s).0));
        }
        DataType::F8E5M2 => {
            let s = F8E5M2(scalar[0]).to_f32();
            out.extend(src.iter().map(|x| F8E5M2::from_f32(F8E5M2(*x).to_f32() * s).0));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_every_type() {
        let f: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let got = scaled(DataType::F32, &4.0f32.to_ne_bytes(), &f);
        let want: Vec<u8> = [6.0f32, -8.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(got, want);
        let i: Vec<u8> = [3i32, i32::MAX].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let got = scaled(DataType::I32, &2i32.to_ne_bytes(), &i);
        let want: Vec<u8> = [6i32, i32::MAX.wrapping_mul(2)].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(got, want);
        let h: Vec<u8> = [f16::from_f32(0.5)].iter().flat_map(|x| x.to_bits().to_ne_bytes()).collect();
        let got = scaled(DataType::F16, &f16::from_f32(3.0).to_bits().to_ne_bytes(), &h);
        assert_eq!(got, f16::from_f32(1.5).to_bits().to_ne_bytes());
        let b: Vec<u8> = bf16::from_f32(-1.0).to_bits().to_ne_bytes().to_vec();
        let got = scaled(DataType::Bf16, &bf16::from_f32(0.25).to_bits().to_ne_bytes(), &b);
        assert_eq!(got, bf16::from_f32(-0.25).to_bits().to_ne_bytes());
        let got = scaled(DataType::F8E4M3, &[F8E4M3::from_f32(2.0).0], &[F8E4M3::from_f32(3.0).0]);
        assert_eq!(got, vec![F8E4M3::from_f32(6.0).0]);
        let got = scaled(DataType::U64, &7u64.to_ne_bytes(), &6u64.to_ne_bytes());
        assert_eq!(got, 42u64.to_ne_bytes());
        let got = scaled(DataType::F64, &0.5f64.to_ne_bytes(), &9.0f64.to_ne_bytes());
        assert_eq!(got, 4.5f64.to_ne_bytes());
    }
}
