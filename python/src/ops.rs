//! One recorded call (a collective or a send/recv over [`Buf`]s) and how it joins an
//! `oxccl::Group` (host buffers) or becomes device calls (CUDA buffers).
//!
//! Rules: a call is checked where Python makes it (missing or overlapping buffers, places),
//! so its exception comes from the call that was wrong; the library's own checks (lengths,
//! roots, operators) run when the group is built, before anything moves. Two buffers of one
//! call that share bytes are either NCCL's in-place layout (one buffer, the in-place form) or
//! an error: the host path never makes a `&[u8]` and a `&mut [u8]` over the same bytes.

use crate::buf::{Buf, Elem, Place, Ty};
use crate::errors::invalid;
use oxccl::{DataType, Group, Rank, ReduceOp};
use pyo3::PyResult;

/// What a call does.
#[derive(Clone, Debug)]
pub enum Kind {
    AllReduce(ReduceOp),
    Broadcast(Rank),
    Reduce(ReduceOp, Rank),
    AllGather,
    ReduceScatter(ReduceOp),
    AllToAll,
    /// Counts and displacements in elements, per peer.
    AllToAllV {
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
    },
    Gather(Rank),
    Scatter(Rank),
    Send(Rank),
    Recv(Rank),
}

impl Kind {
    /// The call a buffer of type `t` runs: a reduction's operator as the type defines it
    /// (bool's logical operators), or why the type cannot be reduced so.
    fn typed(self, t: Ty) -> Result<Kind, BadArg> {
        // A type without arithmetic is the buffer's fault; an operator its type does not
        // define, the operator's.
        let arg = if matches!(t.elem, Elem::Bytes(_)) { "send" } else { "op" };
        let op = |o: ReduceOp| t.reduction(o).map_err(|why| BadArg(arg, why));
        Ok(match self {
            Kind::AllReduce(o) => Kind::AllReduce(op(o)?),
            Kind::Reduce(o, root) => Kind::Reduce(op(o)?, root),
            Kind::ReduceScatter(o) => Kind::ReduceScatter(op(o)?),
            k => k,
        })
    }
}

/// What was wrong with a call: the argument, and why.
pub struct BadArg(pub &'static str, pub String);

/// One checked call.
#[derive(Clone, Debug)]
pub struct Op {
    pub kind: Kind,
    pub dtype: DataType,
    pub send: Option<Buf>,
    pub recv: Option<Buf>,
    /// One buffer serves as input and output (`recv` holds it).
    pub in_place: bool,
}

/// A slice over `b`'s bytes (empty for none; never from a null address).
///
/// # Safety
/// `b`'s memory must be valid for `'a` and not written by anyone while the slice is used.
unsafe fn rd<'a>(b: Option<&Buf>) -> &'a [u8] {
    match b {
        // SAFETY: the caller's promise; a non-empty Buf never has a null address.
        Some(b) if b.len > 0 => unsafe { std::slice::from_raw_parts(b.ptr as *const u8, b.len) },
        _ => &[],
    }
}

/// A mutable slice over `b`'s bytes (empty for none).
///
/// # Safety
/// As [`rd`], and no other reference to these bytes exists while the slice is used.
unsafe fn wr<'a>(b: Option<&Buf>) -> &'a mut [u8] {
    match b {
        // SAFETY: the caller's promise; a non-empty Buf never has a null address.
        Some(b) if b.len > 0 => unsafe { std::slice::from_raw_parts_mut(b.ptr as *mut u8, b.len) },
        _ => &mut [],
    }
}

impl Op {
    /// A call with input `send` and output `recv` where `in_place_at(recv)` is the address an
    /// in-place input has (NCCL's layouts); `None` for either means "not given".
    pub fn new(
        kind: Kind,
        send: Option<Buf>,
        recv: Option<Buf>,
        in_place_at: impl Fn(&Buf) -> Option<usize>,
    ) -> PyResult<Op> {
        Op::checked(kind, send, recv, in_place_at).map_err(|BadArg(arg, why)| invalid(arg, why))
    }

    /// [`Op::new`] without Python: what was wrong comes back as a [`BadArg`] (the compiled
    /// fast path, which holds no GIL, leaves such a call to the Python path, which raises it).
    pub fn checked(
        kind: Kind,
        send: Option<Buf>,
        recv: Option<Buf>,
        in_place_at: impl Fn(&Buf) -> Option<usize>,
    ) -> Result<Op, BadArg> {
        let ty = match (&send, &recv) {
            (Some(s), Some(r)) if s.ty() != r.ty() => {
                return Err(BadArg(
                    "recv",
                    format!("its data type {} differs from send's {}", r.ty().name(), s.ty().name()),
                ))
            }
            (Some(b), _) | (None, Some(b)) => b.ty(),
            (None, None) => return Err(BadArg("send", "no buffer given".into())),
        };
        let kind = kind.typed(ty)?;
        let dtype = ty.dtype;
        if let (Some(s), Some(r)) = (&send, &recv) {
            if s.place != r.place {
                return Err(BadArg(
                    "recv",
                    format!("it is in {:?} memory but send is in {:?}", r.place, s.place),
                ));
            }
        }
        let mut op = Op { kind, dtype, send, recv, in_place: false };
        if let (Some(s), Some(r)) = (&op.send, &op.recv) {
            if s.overlaps(r) {
                if in_place_at(r) == Some(s.ptr) {
                    // The in-place buffer is the larger one (all-gather's and gather's output,
                    // reduce-scatter's and scatter's input).
                    let big = if s.len > r.len { *s } else { *r };
                    op.in_place = true;
                    op.send = None;
                    op.recv = Some(big);
                } else {
                    return Err(BadArg(
                        "recv",
                        format!(
                            "send ({:#x}, {} B) and recv ({:#x}, {} B) overlap, and not in NCCL's in-place layout for this call",
                            s.ptr, s.len, r.ptr, r.len
                        ),
                    ));
                }
            }
        }
        Ok(op)
    }

    /// One buffer used in place (input and output).
    pub fn in_place(kind: Kind, buf: Buf) -> PyResult<Op> {
        Op::in_place_checked(kind, buf).map_err(|BadArg(arg, why)| invalid(arg, why))
    }

    /// [`Op::in_place`] without Python (see [`Op::checked`]).
    pub fn in_place_checked(kind: Kind, buf: Buf) -> Result<Op, BadArg> {
        let kind = kind.typed(buf.ty())?;
        Ok(Op { kind, dtype: buf.dtype, send: None, recv: Some(buf), in_place: true })
    }

    pub fn place(&self) -> Place {
        self.recv.or(self.send).map(|b| b.place).unwrap_or(Place::Host)
    }

    /// Adds the call to a host group.
    ///
    /// # Safety
    /// Every buffer of the op must stay valid, untouched by anything else, for `'a` (until the
    /// group that holds it is complete).
    pub unsafe fn add<'a>(&self, g: &mut Group<'a>) -> oxccl::Result<()> {
        let t = self.dtype;
        let (s, r) = (self.send.as_ref(), self.recv.as_ref());
        // SAFETY: every slice below is the caller's promise; `in_place` ops make one mutable
        // slice, other ops were checked not to overlap (Op::new).
        unsafe {
            if self.in_place {
                let b = wr(r);
                match &self.kind {
                    Kind::AllReduce(op) => g.all_reduce_in_place_raw(t, b, *op),
                    Kind::Broadcast(root) => g.broadcast_in_place_raw(t, b, *root),
                    Kind::Reduce(op, root) => g.reduce_in_place_raw(t, b, *op, *root),
                    Kind::AllGather => g.all_gather_in_place_raw(t, b),
                    Kind::ReduceScatter(op) => g.reduce_scatter_in_place_raw(t, b, *op),
                    Kind::AllToAll => g.all_to_all_in_place_raw(t, b),
                    Kind::Gather(root) => g.gather_in_place_raw(t, b, *root),
                    Kind::Scatter(root) => g.scatter_in_place_raw(t, b, *root),
                    Kind::AllToAllV { .. } | Kind::Send(_) | Kind::Recv(_) => {
                        return Err(oxccl::Error::InvalidUsage("this call has no in-place form".into()))
                    }
                }?;
                return Ok(());
            }
            match &self.kind {
                Kind::AllReduce(op) => g.all_reduce_raw(t, rd(s), wr(r), *op),
                Kind::Broadcast(root) => g.broadcast_raw(t, rd(s), wr(r), *root),
                Kind::Reduce(op, root) => g.reduce_raw(t, rd(s), wr(r), *op, *root),
                Kind::AllGather => g.all_gather_raw(t, rd(s), wr(r)),
                Kind::ReduceScatter(op) => g.reduce_scatter_raw(t, rd(s), wr(r), *op),
                Kind::AllToAll => g.all_to_all_raw(t, rd(s), wr(r)),
                Kind::AllToAllV { send_counts, send_displs, recv_counts, recv_displs } => {
                    g.all_to_all_v_raw(t, rd(s), send_counts, send_displs, wr(r), recv_counts, recv_displs)
                }
                Kind::Gather(root) => g.gather_raw(t, rd(s), wr(r), *root),
                Kind::Scatter(root) => g.scatter_raw(t, rd(s), wr(r), *root),
                Kind::Send(peer) => g.send_raw(t, rd(s), *peer),
                Kind::Recv(peer) => g.recv_raw(t, wr(r), *peer),
            }?;
        }
        Ok(())
    }
}

/// NCCL's in-place layout for gathers (all-gather, gather): the input is rank `me`'s block of
/// the output `r` (of `p` blocks).
pub fn block_of_output(me: usize, p: usize) -> impl Fn(&Buf) -> Option<usize> {
    move |r| Some(r.ptr + me * (r.len / p))
}

/// NCCL's in-place layout for scatters (reduce-scatter, scatter): the output `r` is rank `me`'s
/// block of the input.
pub fn output_is_block(me: usize) -> impl Fn(&Buf) -> Option<usize> {
    move |r| Some(r.ptr.wrapping_sub(me * r.len))
}

/// Adds every op to `g`.
///
/// # Safety
/// As [`Op::add`], for every op.
pub unsafe fn build<'a>(g: &mut Group<'a>, ops: &[Op]) -> oxccl::Result<()> {
    for op in ops {
        // SAFETY: the caller's promise.
        unsafe { op.add(g)? };
    }
    Ok(())
}
