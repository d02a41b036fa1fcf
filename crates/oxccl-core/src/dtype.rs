//! Data types and the reduce operations valid for each.
//!
//! The discriminants are NCCL's (`ncclDataType_t`, `ncclRedOp_t`), so the C ABI maps them by
//! value. Bitwise operations are an oxccl extension and carry values past NCCL's built-in range
//! of operators that a C caller can never confuse with a user-created operator handle.
//!
//! Rule: this module names no error type; the check that answers one ([`ReduceOp::check`],
//! [`crate::error::CoreError::OpInvalidForType`]) lives in [`crate::error`], above it.

use crate::fp8::{F8E4M3, F8E5M2};
use bytemuck::Pod;

/// The element type of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
    F8E4M3 = 10,
    F8E5M2 = 11,
}

impl DataType {
    /// Every data type, in NCCL's order.
    pub const ALL: [DataType; 12] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16
                | DataType::F32
                | DataType::F64
                | DataType::Bf16
                | DataType::F8E4M3
                | DataType::F8E5M2
        )
    }

    /// The name nccl-tests prints for the type.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// The type with NCCL's enum value `v`.
    pub fn from_nccl(v: i32) -> Option<DataType> {
        DataType::ALL.iter().copied().find(|d| *d as i32 == v)
    }

    /// Parses nccl-tests' names (and a few common aliases).
    pub fn parse(s: &str) -> Option<DataType> {
        let t = match s {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "f16" | "float16" => DataType::F16,
            "float" | "f32" | "float32" => DataType::F32,
            "double" | "f64" | "float64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::Bf16,
            "f8e4m3" | "fp8_e4m3" | "e4m3" => DataType::F8E4M3,
            "f8e5m2" | "fp8_e5m2" | "e5m2" => DataType::F8E5M2,
            _ => return None,
        };
        Some(t)
    }
}

impl core::fmt::Display for DataType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    /// Sum, then divide by the number of ranks (integer division for integer types).
    Avg = 4,
    BitAnd = 0x40,
    BitOr = 0x41,
    BitXor = 0x42,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
    ];

    /// Whether the operator is bitwise (defined on integer types only).
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor)
    }

    /// Whether `self` may be applied to `dtype`.
    pub const fn valid_for(self, dtype: DataType) -> bool {
        !(self.is_bitwise() && dtype.is_float())
    }

    /// The operators valid for `dtype`.
    pub fn valid_ops(dtype: DataType) -> impl Iterator<Item = ReduceOp> {
        ReduceOp::ALL.into_iter().filter(move |o| o.valid_for(dtype))
    }

    /// The name nccl-tests prints for the operator.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::BitAnd => "band",
            ReduceOp::BitOr => "bor",
            ReduceOp::BitXor => "bxor",
        }
    }

    /// Parses [`ReduceOp::name`]'s names.
    pub fn parse(s: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| o.name() == s)
    }

    /// The operator with NCCL's enum value `v` (built-ins only).
    pub fn from_nccl(v: i32) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| *o as i32 == v)
    }
}

impl core::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is one of the supported data types.
pub trait Element: Pod + Send + Sync + 'static {
    /// The data type of `Self`.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: DataType = DataType::$d; })*
    };
}

element!(
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    half::f16 => F16, half::bf16 => Bf16, f32 => F32, f64 => F64,
    F8E4M3 => F8E4M3, F8E5M2 => F8E5M2,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_enum_values() {
        assert_eq!(DataType::from_nccl(7), Some(DataType::F32));
        assert_eq!(DataType::from_nccl(9), Some(DataType::Bf16));
        assert_eq!(DataType::from_nccl(11), Some(DataType::F8E5M2));
        assert_eq!(DataType::from_nccl(12), None);
        assert_eq!(ReduceOp::from_nccl(4), Some(ReduceOp::Avg));
        assert_eq!(ReduceOp::from_nccl(2), Some(ReduceOp::Max));
        for d in DataType::ALL {
            assert_eq!(DataType::parse(d.name()), Some(d));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::parse(o.name()), Some(o));
        }
    }

    #[test]
    fn bitwise_only_on_integers() {
        assert!(!ReduceOp::BitXor.valid_for(DataType::F32));
        assert!(ReduceOp::BitXor.valid_for(DataType::U8));
        assert_eq!(ReduceOp::valid_ops(DataType::F16).count(), 5);
        assert_eq!(ReduceOp::valid_ops(DataType::I64).count(), 8);
    }
}
