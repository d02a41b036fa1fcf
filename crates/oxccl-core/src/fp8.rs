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
    nan_code: 0x7f,
    ieee_specials: false,
};

const E5M2: Format = Format {
    mantissa_bits: 2,
    bias: 15,
    max_code: 0x7b,
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
            return if mant == 0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            };
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

    fn encode(&self, x: f32) -> u8 {
        if x.is_nan() {
            return self.nan_code;
        }
        let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs();
        let max = self.decode(self.max_code);
        if a >= max {
            // Saturate (also for infinity): the largest finite value of the format.
            return sign | self.max_code;
        }
        let m = self.mantissa_bits as i32;
        let emin = 1 - self.bias;
        // floor(log2(a)) for a > 0; f32 subnormals are far below every fp8 quantum.
        let e = if a == 0.0 || !a.is_normal() {
            emin
        } else {
            (((a.to_bits() >> 23) & 0xff) as i32 - 127).max(emin)
        };
        let quantum = pow2(e - m);
        // a / quantum is exact (division by a power of two of a normal number into range).
        let r = round_half_even(a / quantum);
        let v = r * quantum;
        if v >= max {
            return sign | self.max_code;
        }
        if v == 0.0 {
            return sign;
        }
        sign | self.exact_code(v)
    }

    /// The bit pattern of a positive value that is exactly representable and finite.
    fn exact_code(&self, v: f32) -> u8 {
        let m = self.mantissa_bits as i32;
        let emin = 1 - self.bias;
        let e = ((v.to_bits() >> 23) & 0xff) as i32 - 127;
        if e < emin {
            (v / pow2(emin - m)) as u8
        } else {
            let mant = (v / pow2(e - m)) as i32 - (1 << m);
            (((e + self.bias) << m) | mant) as u8
        }
    }
}

fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

fn round_half_even(q: f32) -> f32 {
    let f = q.floor();
    let diff = q - f;
    if diff > 0.5 || (diff == 0.5 && (f as u32) % 2 == 1) {
        f + 1.0
    } else {
        f
    }
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

fp8_type!(
    F8E4M3,
    E4M3,
    "8-bit float, 4 exponent bits, 3 mantissa bits, no infinities (max 448)."
);
fp8_type!(
    F8E5M2,
    E5M2,
    "8-bit float, 5 exponent bits, 2 mantissa bits, IEEE specials (max 57344)."
);

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
        let mut t = DecodeTables {
            e4m3: [0.0; 256],
            e5m2: [0.0; 256],
        };
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
        assert_eq!(
            F8E4M3::from_f32(1.5 * 2f32.powi(-9)).to_f32(),
            2.0 * 2f32.powi(-9)
        );
    }

    #[test]
    fn encode_is_nearest_for_a_sweep() {
        // For many values, the encoded value is at least as close as every other code.
        let codes: Vec<f32> = (0..=255u8)
            .map(|c| F8E4M3(c).to_f32())
            .filter(|v| v.is_finite())
            .collect();
        let mut x = -500.0f32;
        while x < 500.0 {
            let enc = F8E4M3::from_f32(x).to_f32();
            let clamped = x.clamp(-448.0, 448.0);
            let best = codes
                .iter()
                .map(|c| (c - clamped).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((enc - clamped).abs(), best, "x = {x}");
            x += 0.37;
        }
        let t = decode_tables();
        assert_eq!(t.e4m3[0x38], 1.0);
        assert_eq!(t.e5m2[0x3c], 1.0);
    }
}
