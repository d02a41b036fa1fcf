//! The two 8-bit floating-point formats NCCL reduces: E4M3 ("fn": finite, no infinities) and
//! E5M2 (IEEE-like, with infinities), as in the OCP 8-bit floating point specification.
//!
//! Values are stored as their bit patterns. Conversions from `f32` round to nearest, ties to
//! even, and saturate to the largest finite value (CUDA's `__NV_SATFINITE` behaviour, which is
//! what NCCL's fp8 reductions use); NaN stays NaN. Arithmetic is never done in 8 bits: the
//! reducers widen to `f32`, combine, and round once (see `reduce`).

use bytemuck::{Pod, Zeroable};

/// The parameters of one 8-bit float format.
struct Format {
    mantissa_bits: u32,
    bias: i32,
    /// The largest finite magnitude, as a bit pattern without the sign.
    max_code: u8,
    /// The same value as f32 bits.
    max_f32_bits: u32,
    /// The canonical NaN bit pattern, without the sign.
    nan_code: u8,
    /// Whether an all-ones exponent is a special value (E5M2) or ordinary except for the
    /// all-ones mantissa (E4M3).
    ieee_specials: bool,
}

const E4M3: Format = Format {
    mantissa_bits: 3,
    bias: 7,
    max_code: 0x7e,
    max_f32_bits: 0x43e0_0000,
    nan_code: 0x7f,
    ieee_specials: false,
};

const E5M2: Format = Format {
    mantissa_bits: 2,
    bias: 15,
    max_code: 0x7b,
    max_f32_bits: 0x4760_0000,
    nan_code: 0x7f,
    ieee_specials: true,
};

impl Format {
    const fn exponent_bits(&self) -> u32 {
        7 - self.mantissa_bits
    }

    fn decode(&self, code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let mag = code & 0x7f;
        let m = self.mantissa_bits;
        let exp_field = (mag >> m) as i32;
        let mant = (mag & ((1 << m) - 1)) as i32;
        let exp_max = (1 << self.exponent_bits()) - 1;
        if self.ieee_specials && exp_field == exp_max {
            return if mant == 0 { sign * f32::INFINITY } else { f32::NAN };
        }
        if !self.ieee_specials && mag == self.nan_code {
            return f32::NAN;
        }
        let value = if exp_field == 0 {
            // Subnormal: mant × 2^(1 − bias − m).
            mant as f32 * pow2(1 - self.bias - m as i32)
        } else {
            ((1 << m) + mant) as f32 * pow2(exp_field - self.bias - m as i32)
        };
        sign * value
    }

    /// Round to nearest, ties to even, saturating to the largest finite value; bit
    /// arithmetic on the f32 representation (no division, no loop).
    fn encode(&self, x: f32) -> u8 {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let a = bits & 0x7fff_ffff;
        if a > 0x7f80_0000 {
            return self.nan_code;
        }
        if a >= self.max_f32_bits {
            return sign | self.max_code;
        }
        let m = self.mantissa_bits;
        let emin = 1 - self.bias;
        let exp = (a >> 23) as i32 - 127;
        let mag = if exp >= emin {
            // Normal: drop 23 − m mantissa bits, rounding to nearest even; a carry into the
            // exponent is handled by reading the exponent back from the rounded bits.
            let shift = 23 - m;
            let half = (1u32 << (shift - 1)) - 1;
            let rounded = a + half + ((a >> shift) & 1);
            let e = (rounded >> 23) as i32 - 127;
            let mant = (rounded >> shift) & ((1 << m) - 1);
            (((e + self.bias) as u32) << m | mant) as u8
        } else {
            // Subnormal (or zero): a multiple of 2^(emin − m); the scaling is exact.
            let q = f32::from_bits(a) * pow2(m as i32 - emin);
            q.round_ties_even() as u8
        };
        sign | mag
    }
}

fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

macro_rules! fp8_type {
    ($name:ident, $fmt:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
        #[repr(transparent)]
        pub struct $name(pub u8);

        impl $name {
            /// The value nearest to `x` (ties to even), saturated to the finite range.
            pub fn from_f32(x: f32) -> Self {
                Self($fmt.encode(x))
            }

            /// The value as an `f32` (exact).
            pub fn to_f32(self) -> f32 {
                $fmt.decode(self.0)
            }

            /// The largest finite value.
            pub fn max_finite() -> Self {
                Self($fmt.max_code)
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}({})", stringify!($name), self.to_f32())
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}", self.to_f32())
            }
        }
    };
}

fp8_type!(F8E4M3, E4M3, "8-bit float, 4 exponent bits, 3 mantissa bits, no infinities (max 448).");
fp8_type!(F8E5M2, E5M2, "8-bit float, 5 exponent bits, 2 mantissa bits, IEEE specials (max 57344).");

/// Decoding tables: one `f32` per bit pattern, so reductions widen with a load, not a branch
/// ladder.
pub struct DecodeTables {
    pub e4m3: [f32; 256],
    pub e5m2: [f32; 256],
}

/// The decoding tables, built once.
pub fn decode_tables() -> &'static DecodeTables {
    static TABLES: std::sync::OnceLock<DecodeTables> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let mut t = DecodeTables { e4m3: [0.0; 256], e5m2: [0.0; 256] };
        for c in 0..256usize {
            t.e4m3[c] = E4M3.decode(c as u8);
            t.e5m2[c] = E5M2.decode(c as u8);
        }
        t
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_bits_match_the_codes() {
        assert_eq!(E4M3.decode(E4M3.max_code).to_bits(), E4M3.max_f32_bits);
        assert_eq!(E5M2.decode(E5M2.max_code).to_bits(), E5M2.max_f32_bits);
    }

    #[test]
    fn e4m3_known_values() {
        assert_eq!(F8E4M3(0x7e).to_f32(), 448.0);
        assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
        assert_eq!(F8E4M3(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(F8E4M3(0x08).to_f32(), 2f32.powi(-6));
        assert!(F8E4M3(0x7f).to_f32().is_nan());
        assert!(F8E4M3(0xff).to_f32().is_nan());
        assert_eq!(F8E4M3(0xb8).to_f32(), -1.0);
        // Every integer up to 16 is exact.
        for i in 0..=16 {
            assert_eq!(F8E4M3::from_f32(i as f32).to_f32(), i as f32);
        }
    }

    #[test]
    fn e5m2_known_values() {
        assert_eq!(F8E5M2(0x7b).to_f32(), 57344.0);
        assert_eq!(F8E5M2(0x3c).to_f32(), 1.0);
        assert_eq!(F8E5M2(0x7c).to_f32(), f32::INFINITY);
        assert_eq!(F8E5M2(0xfc).to_f32(), f32::NEG_INFINITY);
        assert!(F8E5M2(0x7d).to_f32().is_nan());
        assert_eq!(F8E5M2(0x01).to_f32(), 2f32.powi(-16));
        for i in 0..=8 {
            assert_eq!(F8E5M2::from_f32(i as f32).to_f32(), i as f32);
        }
    }

    #[test]
    fn round_trip_every_code() {
        for c in 0..=255u8 {
            let v = F8E4M3(c).to_f32();
            if !v.is_nan() {
                let back = F8E4M3::from_f32(v).0;
                // +0 and -0 keep their sign.
                assert_eq!(back, c, "e4m3 code {c:#x} value {v}");
            }
            let v = F8E5M2(c).to_f32();
            if v.is_finite() {
                assert_eq!(F8E5M2::from_f32(v).0, c, "e5m2 code {c:#x} value {v}");
            }
        }
    }

    #[test]
    fn rounding_ties_to_even_and_saturation() {
        // Between 16 (0x58) and 18 (0x59) in e4m3: 17 is a tie, goes to even mantissa 16.
        assert_eq!(F8E4M3::from_f32(17.0).to_f32(), 16.0);
        // 19 is a tie between 18 and 20: 20 has the even mantissa.
        assert_eq!(F8E4M3::from_f32(19.0).to_f32(), 20.0);
        assert_eq!(F8E4M3::from_f32(17.5).to_f32(), 18.0);
        assert_eq!(F8E4M3::from_f32(1000.0).to_f32(), 448.0);
        assert_eq!(F8E4M3::from_f32(f32::INFINITY).to_f32(), 448.0);
        assert_eq!(F8E4M3::from_f32(-1e9).to_f32(), -448.0);
        assert_eq!(F8E5M2::from_f32(1e9).to_f32(), 57344.0);
        assert!(F8E5M2::from_f32(f32::NAN).to_f32().is_nan());
        // Subnormal rounding: half of the smallest subnormal is a tie to zero.
        assert_eq!(F8E4M3::from_f32(2f32.powi(-10)).to_f32(), 0.0);
        assert_eq!(F8E4M3::from_f32(1.5 * 2f32.powi(-9)).to_f32(), 2.0 * 2f32.powi(-9));
    }

    fn brute_force(codes: &[(u8, f64)], max: f64, x: f32) -> f64 {
        let x = x as f64;
        if x.abs() >= max {
            return max.copysign(x);
        }
        let mut best: Option<(u8, f64)> = None;
        for &(c, v) in codes {
            let better = match best {
                None => true,
                Some((bc, bv)) => {
                    let (d, bd) = ((v - x).abs(), (bv - x).abs());
                    d < bd || (d == bd && c & 1 == 0 && bc & 1 == 1)
                }
            };
            if better {
                best = Some((c, v));
            }
        }
        best.map(|b| b.1).unwrap_or(0.0)
    }

    #[test]
    fn encode_matches_brute_force_nearest_even() {
        let e4: Vec<(u8, f64)> =
            (0..=255u8).map(|c| (c, F8E4M3(c).to_f32() as f64)).filter(|v| v.1.is_finite()).collect();
        let e5: Vec<(u8, f64)> =
            (0..=255u8).map(|c| (c, F8E5M2(c).to_f32() as f64)).filter(|v| v.1.is_finite()).collect();
        let mut z: u64 = 0x1234_5678;
        for i in 0..200_000u32 {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Spread over the formats' ranges: random mantissa, exponent in −20..20.
            let e = ((z >> 40) % 40) as i32 - 20;
            let m = 1.0 + ((z >> 8) as u32 & 0x7f_ffff) as f32 / 8_388_608.0;
            let mut x = m * 2f32.powi(e);
            if i % 2 == 1 {
                x = -x;
            }
            // Exact ties and codes themselves too.
            if i % 7 == 0 {
                x = F8E4M3((z >> 3) as u8 & 0x7e).to_f32() + 2f32.powi(e.clamp(-9, 4)) * 0.5;
            }
            let got = F8E4M3::from_f32(x).to_f32() as f64;
            let want = brute_force(&e4, 448.0, x);
            assert!(got == want || (got == 0.0 && want == 0.0), "e4m3 x={x:e} got {got} want {want}");
            let got = F8E5M2::from_f32(x).to_f32() as f64;
            let want = brute_force(&e5, 57344.0, x);
            assert!(got == want || (got == 0.0 && want == 0.0), "e5m2 x={x:e} got {got} want {want}");
        }
    }

    #[test]
    fn encode_is_nearest_for_a_sweep() {
        // For many values, the encoded value is at least as close as every other code.
        let codes: Vec<f32> = (0..=255u8).map(|c| F8E4M3(c).to_f32()).filter(|v| v.is_finite()).collect();
        let mut x = -500.0f32;
        while x < 500.0 {
            let enc = F8E4M3::from_f32(x).to_f32();
            let clamped = x.clamp(-448.0, 448.0);
            let best = codes.iter().map(|c| (c - clamped).abs()).fold(f32::INFINITY, f32::min);
            assert_eq!((enc - clamped).abs(), best, "x = {x}");
            x += 0.37;
        }
        let t = decode_tables();
        assert_eq!(t.e4m3[0x38], 1.0);
        assert_eq!(t.e5m2[0x3c], 1.0);
    }
}
