//! The error type of the pure layer: argument validation, decoding, configuration.
//!
//! Every variant names what was wrong (the argument, the value, the limit), so the runtime can
//! wrap it with the rank and operation without losing the specifics.
//!
//! Rule: this module sits above [`crate::dtype`] (its variants name data types and operators);
//! `dtype` names no error, so the check of an operator against a type that answers one,
//! [`ReduceOp::check`], is here.

use crate::dtype::{DataType, ReduceOp};

/// An error found by pure logic: a bad argument, a malformed message, a bad setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// A reduce operator that is not defined on the data type.
    #[error("reduce operator `{op}` is not defined on data type `{dtype}` (bitwise operators need an integer type)")]
    OpInvalidForType { op: ReduceOp, dtype: DataType },
    /// A rank argument outside the communicator.
    #[error("argument `{arg}`: rank {rank} is outside 0..{size}")]
    RankOutOfRange { arg: &'static str, rank: i64, size: usize },
    /// A buffer too short for the element count the call needs.
    #[error("argument `{arg}`: buffer holds {got} elements but the call needs {needed}")]
    BufferTooShort { arg: &'static str, needed: usize, got: usize },
    /// An element count whose byte size does not fit in memory.
    #[error("argument `{arg}`: {count} elements of `{dtype}` overflow the address space")]
    CountOverflow { arg: &'static str, count: usize, dtype: DataType },
    /// Any other invalid argument.
    #[error("argument `{arg}`: {reason}")]
    InvalidArgument { arg: &'static str, reason: String },
    /// A message or identifier that does not decode.
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    /// An environment variable (or config value) that does not parse.
    #[error("setting {var}={value:?}: {reason}")]
    BadSetting { var: String, value: String, reason: String },
    /// The launcher environment is incomplete.
    #[error("launcher environment ({launcher}): {reason}")]
    Launcher { launcher: &'static str, reason: String },
}

impl CoreError {
    pub(crate) fn malformed(what: &'static str, reason: impl Into<String>) -> Self {
        CoreError::Malformed { what, reason: reason.into() }
    }

    pub(crate) fn invalid(arg: &'static str, reason: impl Into<String>) -> Self {
        CoreError::InvalidArgument { arg, reason: reason.into() }
    }
}

impl ReduceOp {
    /// Checks that `self` may be applied to `dtype` ([`ReduceOp::valid_for`]).
    pub fn check(self, dtype: DataType) -> Result<(), CoreError> {
        if self.valid_for(dtype) {
            Ok(())
        } else {
            Err(CoreError::OpInvalidForType { op: self, dtype })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_operators_are_refused_on_floats_by_name() {
        let e = ReduceOp::BitXor.check(DataType::F32).unwrap_err();
        assert_eq!(e, CoreError::OpInvalidForType { op: ReduceOp::BitXor, dtype: DataType::F32 });
        assert_eq!(
            e.to_string(),
            "reduce operator `bxor` is not defined on data type `float` (bitwise operators need an integer type)"
        );
        assert_eq!(ReduceOp::BitXor.check(DataType::U8), Ok(()));
    }
}
