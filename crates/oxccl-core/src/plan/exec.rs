//! The meaning of one step, over slices: the single definition both the engine (over shared
//! memory slots, sockets' staging buffers and user buffers) and the in-memory simulator run.
//!
//! The executor resolves a step's locations to slices first. When a step's destination is its
//! own local input (in-place), the executor passes the destination alone and the input as
//! [`StepData::RecvReduceInPlace`], or no destination for a plain copy, since Rust slices may
//! not alias.

use crate::error::CoreError;
use crate::reduce::{finalize, reduce_into, reduce_to, ReduceCtx};

/// A step's input, resolved to memory.
pub enum StepData<'a> {
    /// A local buffer.
    Src(&'a [u8]),
    /// A received chunk.
    Recv(&'a [u8]),
    /// A received chunk and a local operand.
    RecvReduce { recv: &'a [u8], src: &'a [u8] },
    /// A received chunk whose local operand is the destination itself.
    RecvReduceInPlace { recv: &'a [u8] },
}

fn plan_error(reason: &str) -> CoreError {
    CoreError::malformed("plan step", reason)
}

/// Performs one step: computes the chunk's value from `data`, writes it to `dst` and `send`
/// (whichever are present), applying the reduction's final transform when `fin` is set.
pub fn apply(
    ctx: Option<&ReduceCtx>,
    fin: bool,
    data: StepData<'_>,
    dst: Option<&mut [u8]>,
    send: Option<&mut [u8]>,
) -> Result<(), CoreError> {
    let finish = |buf: &mut [u8]| {
        if let (true, Some(c)) = (fin, ctx) {
            finalize(c, buf);
        }
    };
    match data {
        StepData::Src(input) | StepData::Recv(input) => {
            if let Some(d) = dst {
                d.copy_from_slice(input);
                finish(d);
                if let Some(s) = send {
                    s.copy_from_slice(d);
                }
            } else if let Some(s) = send {
                s.copy_from_slice(input);
                finish(s);
            }
            Ok(())
        }
        StepData::RecvReduce { recv, src } => {
            let c = ctx.ok_or_else(|| plan_error("reduction without a reduce context"))?;
            if recv.len() != src.len() {
                return Err(plan_error("operands of different lengths"));
            }
            match (dst, send) {
                (Some(d), s) => {
                    reduce_to(c, d, recv, src);
                    finish(d);
                    if let Some(s) = s {
                        s.copy_from_slice(d);
                    }
                }
                (None, Some(s)) => {
                    reduce_to(c, s, recv, src);
                    finish(s);
                }
                (None, None) => return Err(plan_error("reduction with no output")),
            }
            Ok(())
        }
        StepData::RecvReduceInPlace { recv } => {
            let c = ctx.ok_or_else(|| plan_error("reduction without a reduce context"))?;
            let d = dst.ok_or_else(|| plan_error("in-place reduction without a destination"))?;
            reduce_into(c, d, recv);
            finish(d);
            if let Some(s) = send {
                s.copy_from_slice(d);
            }
            Ok(())
        }
    }
}
