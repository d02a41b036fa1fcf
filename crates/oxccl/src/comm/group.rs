//! Groups: any mix of collectives and send/recv planned and run as one unit.
//!
//! Between [`Communicator::group`] and [`Group::end`] calls only record what to do; `end` plans
//! the whole set and runs it, so mutually dependent sends and receives (a ring shift, a
//! pairwise exchange) progress together and never deadlock. Point-to-point operations run
//! concurrently with the group's collectives, which run one after another in issue order.
//!
//! Buffers are borrowed for the group's lifetime `'a`, so nothing can touch them until the
//! group has finished (blocking) or its scope has ended (asynchronous, see
//! [`Scope`](super::Scope)). A group dropped without `end` does nothing.
//!
//! Argument rules (NCCL's, with slice lengths as counts): a receive buffer may be longer than
//! needed (only the prefix is written), never shorter; in-place forms take one buffer laid out
//! as NCCL's in-place rules say (all-gather: this rank's input at `rank × count`;
//! reduce-scatter: this rank's output at `rank × count`).
//!
//! Every call exists typed (`all_reduce(&[T], &mut [T], ..)`, counts in elements of `T`) and
//! untyped (`all_reduce_raw(dtype, &[u8], &mut [u8], ..)`, byte buffers whose lengths must be
//! whole elements of `dtype`) for callers that choose the data type at run time.

use super::{Communicator, Scope, Work};
use crate::engine::RawBuf;
use crate::error::{Error, Result};
use oxccl_core::coll::{check_alltoallv, check_len, check_rank, elems, Segments};
use oxccl_core::plan::{BufId, Loc, OpSpec};
use oxccl_core::{CoreError, DataType, Element, Rank, ReduceOp};
use smallvec::SmallVec;
use std::marker::PhantomData;
use std::sync::Arc;

/// A group that runs when [`Group::end`] is called, on the calling thread.
pub struct Blocking;

/// A group made inside a [`Scope`]: [`Group::launch`] queues it and returns a [`Work`].
pub struct Scoped<'scope, 'env> {
    pub(super) scope: &'scope Scope<'scope, 'env>,
}

/// Recorded operations and the buffers they borrow.
pub struct Group<'a, M = Blocking> {
    comm: &'a Communicator,
    ops: SmallVec<[OpSpec; 1]>,
    bufs: SmallVec<[RawBuf; 2]>,
    what: &'static str,
    mode: M,
    _borrows: PhantomData<&'a mut ()>,
}

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

impl Communicator {
    /// Starts a group.
    pub fn group(&self) -> Group<'_, Blocking> {
        Group::new(self, Blocking)
    }
}

impl<'a, M> Group<'a, M> {
    pub(super) fn new(comm: &'a Communicator, mode: M) -> Self {
        Group {
            comm,
            ops: SmallVec::new(),
            bufs: SmallVec::new(),
            what: "group",
            mode,
            _borrows: PhantomData,
        }
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn me(&self) -> Rank {
        self.comm.rank()
    }

    fn buf(&mut self, b: RawBuf) -> Result<Loc> {
        // The last id is the engines' scratch buffer.
        let id = u16::try_from(self.bufs.len()).ok().filter(|&i| i != BufId::SCRATCH.0).ok_or_else(|| {
            CoreError::InvalidArgument { arg: "group", reason: "more than 65535 buffers in one group".into() }
        })?;
        self.bufs.push(b);
        Ok(Loc::start(BufId(id)))
    }

    /// Names the group's call in errors and the flight recorder (a barrier made of an
    /// all-reduce is a "barrier" to its caller).
    pub(crate) fn label(&mut self, what: &'static str) -> &mut Self {
        self.what = what;
        self
    }

    fn push(&mut self, op: OpSpec, what: &'static str) -> &mut Self {
        self.what = if self.ops.is_empty() { what } else { "group" };
        self.ops.push(op);
        self
    }

    fn rank_arg(&self, arg: &'static str, r: Rank) -> Result<Rank> {
        Ok(check_rank(arg, r.0 as i64, self.size())?)
    }

    fn per_rank(&self, arg: &'static str, len: usize) -> Result<usize> {
        let p = self.size();
        if len % p != 0 {
            return Err(CoreError::InvalidArgument {
                arg,
                reason: format!("length {len} is not a multiple of the communicator size {p}"),
            }
            .into());
        }
        Ok(len / p)
    }

    /// Elements of `dtype` in `b` (which must hold whole elements).
    fn elems_of(arg: &'static str, dtype: DataType, b: &[u8]) -> Result<usize> {
        let es = dtype.size_bytes();
        if b.len() % es != 0 {
            return Err(CoreError::InvalidArgument {
                arg,
                reason: format!("{} bytes is not a whole number of {dtype} elements", b.len()),
            }
            .into());
        }
        Ok(b.len() / es)
    }

    /// [`all_reduce`](Self::all_reduce) on bytes of `dtype`.
    pub fn all_reduce_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        recv: &'a mut [u8],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        op.check(dtype)?;
        let count = Self::elems_of("send", dtype, send)?;
        check_len("recv", count, Self::elems_of("recv", dtype, recv)?)?;
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        Ok(self.push(OpSpec::AllReduce { count, dtype, op, src, dst }, "all_reduce"))
    }

    /// [`all_reduce_in_place`](Self::all_reduce_in_place) on bytes of `dtype`.
    pub fn all_reduce_in_place_raw(
        &mut self,
        dtype: DataType,
        buf: &'a mut [u8],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        op.check(dtype)?;
        let count = Self::elems_of("buf", dtype, buf)?;
        let b = self.buf(RawBuf::of_mut(buf))?;
        Ok(self.push(OpSpec::AllReduce { count, dtype, op, src: b, dst: b }, "all_reduce"))
    }

    /// [`broadcast`](Self::broadcast) on bytes of `dtype`.
    pub fn broadcast_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        recv: &'a mut [u8],
        root: Rank,
    ) -> Result<&mut Self> {
        let root = self.rank_arg("root", root)?;
        let count = Self::elems_of("recv", dtype, recv)?;
        if self.me() == root {
            check_len("send", count, Self::elems_of("send", dtype, send)?)?;
        }
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        Ok(self.push(OpSpec::Broadcast { count, dtype, root, src, dst }, "broadcast"))
    }

    /// [`broadcast_in_place`](Self::broadcast_in_place) on bytes of `dtype`.
    pub fn broadcast_in_place_raw(
        &mut self,
        dtype: DataType,
        buf: &'a mut [u8],
        root: Rank,
    ) -> Result<&mut Self> {
        let root = self.rank_arg("root", root)?;
        let count = Self::elems_of("buf", dtype, buf)?;
        let b = self.buf(RawBuf::of_mut(buf))?;
        Ok(self.push(OpSpec::Broadcast { count, dtype, root, src: b, dst: b }, "broadcast"))
    }

    /// [`reduce`](Self::reduce) on bytes of `dtype`.
    pub fn reduce_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        recv: &'a mut [u8],
        op: ReduceOp,
        root: Rank,
    ) -> Result<&mut Self> {
        op.check(dtype)?;
        let root = self.rank_arg("root", root)?;
        let count = Self::elems_of("send", dtype, send)?;
        if self.me() == root {
            check_len("recv", count, Self::elems_of("recv", dtype, recv)?)?;
        }
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        Ok(self.push(OpSpec::Reduce { count, dtype, op, root, src, dst }, "reduce"))
    }

    /// [`reduce_in_place`](Self::reduce_in_place) on bytes of `dtype`.
    pub fn reduce_in_place_raw(
        &mut self,
        dtype: DataType,
        buf: &'a mut [u8],
        op: ReduceOp,
        root: Rank,
    ) -> Result<&mut Self> {
        op.check(dtype)?;
        let root = self.rank_arg("root", root)?;
        let count = Self::elems_of("buf", dtype, buf)?;
        let b = self.buf(RawBuf::of_mut(buf))?;
        Ok(self.push(OpSpec::Reduce { count, dtype, op, root, src: b, dst: b }, "reduce"))
    }

    /// [`all_gather`](Self::all_gather) on bytes of `dtype`.
    pub fn all_gather_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        recv: &'a mut [u8],
    ) -> Result<&mut Self> {
        let count = Self::elems_of("send", dtype, send)?;
        check_len("recv", elems("recv", count, self.size(), dtype)?, Self::elems_of("recv", dtype, recv)?)?;
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        Ok(self.push(OpSpec::AllGather { count, dtype, src, dst }, "all_gather"))
    }

    /// [`all_gather_in_place`](Self::all_gather_in_place) on bytes of `dtype`.
    pub fn all_gather_in_place_raw(&mut self, dtype: DataType, buf: &'a mut [u8]) -> Result<&mut Self> {
        let count = self.per_rank("buf", Self::elems_of("buf", dtype, buf)?)?;
        let me = self.me().idx();
        let dst = self.buf(RawBuf::of_mut(buf))?;
        let src = dst.at(me * count * dtype.size_bytes());
        Ok(self.push(OpSpec::AllGather { count, dtype, src, dst }, "all_gather"))
    }

    /// [`reduce_scatter`](Self::reduce_scatter) on bytes of `dtype`.
    pub fn reduce_scatter_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        recv: &'a mut [u8],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        op.check(dtype)?;
        let count = Self::elems_of("recv", dtype, recv)?;
        check_len("send", elems("send", count, self.size(), dtype)?, Self::elems_of("send", dtype, send)?)?;
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        Ok(self.push(OpSpec::ReduceScatter { count, dtype, op, src, dst }, "reduce_scatter"))
    }

    /// [`reduce_scatter_in_place`](Self::reduce_scatter_in_place) on bytes of `dtype`.
    pub fn reduce_scatter_in_place_raw(
        &mut self,
        dtype: DataType,
        buf: &'a mut [u8],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        op.check(dtype)?;
        let count = self.per_rank("buf", Self::elems_of("buf", dtype, buf)?)?;
        let me = self.me().idx();
        let src = self.buf(RawBuf::of_mut(buf))?;
        let dst = src.at(me * count * dtype.size_bytes());
        Ok(self.push(OpSpec::ReduceScatter { count, dtype, op, src, dst }, "reduce_scatter"))
    }

    /// [`all_to_all`](Self::all_to_all) on bytes of `dtype`.
    pub fn all_to_all_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        recv: &'a mut [u8],
    ) -> Result<&mut Self> {
        let total = Self::elems_of("send", dtype, send)?;
        let count = self.per_rank("send", total)?;
        check_len("recv", total, Self::elems_of("recv", dtype, recv)?)?;
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        Ok(self.push(OpSpec::AllToAll { count, dtype, src, dst }, "all_to_all"))
    }

    /// [`all_to_all_in_place`](Self::all_to_all_in_place) on bytes of `dtype`.
    pub fn all_to_all_in_place_raw(&mut self, dtype: DataType, buf: &'a mut [u8]) -> Result<&mut Self> {
        let count = self.per_rank("buf", Self::elems_of("buf", dtype, buf)?)?;
        let b = self.buf(RawBuf::of_mut(buf))?;
        Ok(self.push(OpSpec::AllToAll { count, dtype, src: b, dst: b }, "all_to_all"))
    }

    /// [`all_to_all_v`](Self::all_to_all_v) on bytes of `dtype` (counts and displacements in
    /// elements).
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &'a mut [u8],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<&mut Self> {
        let s =
            Segments { counts: send_counts, displs: send_displs, len: Self::elems_of("send", dtype, send)? };
        let r =
            Segments { counts: recv_counts, displs: recv_displs, len: Self::elems_of("recv", dtype, recv)? };
        check_alltoallv(self.size(), self.me(), s, r)?;
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        let op = OpSpec::AllToAllV {
            dtype,
            send_counts: send_counts.to_vec(),
            send_displs: send_displs.to_vec(),
            recv_counts: recv_counts.to_vec(),
            recv_displs: recv_displs.to_vec(),
            src,
            dst,
        };
        Ok(self.push(op, "all_to_all_v"))
    }

    /// [`gather`](Self::gather) on bytes of `dtype`.
    pub fn gather_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        recv: &'a mut [u8],
        root: Rank,
    ) -> Result<&mut Self> {
        let root = self.rank_arg("root", root)?;
        let count = Self::elems_of("send", dtype, send)?;
        if self.me() == root {
            check_len(
                "recv",
                elems("recv", count, self.size(), dtype)?,
                Self::elems_of("recv", dtype, recv)?,
            )?;
        }
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        Ok(self.push(OpSpec::Gather { count, dtype, root, src, dst }, "gather"))
    }

    /// [`gather_in_place`](Self::gather_in_place) on bytes of `dtype`.
    pub fn gather_in_place_raw(
        &mut self,
        dtype: DataType,
        buf: &'a mut [u8],
        root: Rank,
    ) -> Result<&mut Self> {
        let root = self.rank_arg("root", root)?;
        let n = Self::elems_of("buf", dtype, buf)?;
        let (count, own) = if self.me() == root {
            let c = self.per_rank("buf", n)?;
            (c, root.idx() * c * dtype.size_bytes())
        } else {
            (n, 0)
        };
        let dst = self.buf(RawBuf::of_mut(buf))?;
        let src = dst.at(own);
        Ok(self.push(OpSpec::Gather { count, dtype, root, src, dst }, "gather"))
    }

    /// [`scatter`](Self::scatter) on bytes of `dtype`.
    pub fn scatter_raw(
        &mut self,
        dtype: DataType,
        send: &'a [u8],
        recv: &'a mut [u8],
        root: Rank,
    ) -> Result<&mut Self> {
        let root = self.rank_arg("root", root)?;
        let count = Self::elems_of("recv", dtype, recv)?;
        if self.me() == root {
            check_len(
                "send",
                elems("send", count, self.size(), dtype)?,
                Self::elems_of("send", dtype, send)?,
            )?;
        }
        let src = self.buf(RawBuf::of(send))?;
        let dst = self.buf(RawBuf::of_mut(recv))?;
        Ok(self.push(OpSpec::Scatter { count, dtype, root, src, dst }, "scatter"))
    }

    /// [`scatter_in_place`](Self::scatter_in_place) on bytes of `dtype`.
    pub fn scatter_in_place_raw(
        &mut self,
        dtype: DataType,
        buf: &'a mut [u8],
        root: Rank,
    ) -> Result<&mut Self> {
        let root = self.rank_arg("root", root)?;
        let n = Self::elems_of("buf", dtype, buf)?;
        let (count, own) = if self.me() == root {
            let c = self.per_rank("buf", n)?;
            (c, root.idx() * c * dtype.size_bytes())
        } else {
            (n, 0)
        };
        let src = self.buf(RawBuf::of_mut(buf))?;
        let dst = src.at(own);
        Ok(self.push(OpSpec::Scatter { count, dtype, root, src, dst }, "scatter"))
    }

    /// [`send`](Self::send) on bytes of `dtype`.
    pub fn send_raw(&mut self, dtype: DataType, buf: &'a [u8], peer: Rank) -> Result<&mut Self> {
        let peer = self.rank_arg("peer", peer)?;
        let count = Self::elems_of("buf", dtype, buf)?;
        let src = self.buf(RawBuf::of(buf))?;
        Ok(self.push(OpSpec::Send { count, dtype, peer, src }, "send"))
    }

    /// [`recv`](Self::recv) on bytes of `dtype`.
    pub fn recv_raw(&mut self, dtype: DataType, buf: &'a mut [u8], peer: Rank) -> Result<&mut Self> {
        let peer = self.rank_arg("peer", peer)?;
        let count = Self::elems_of("buf", dtype, buf)?;
        let dst = self.buf(RawBuf::of_mut(buf))?;
        Ok(self.push(OpSpec::Recv { count, dtype, peer, dst }, "recv"))
    }

    /// Every rank ends with the element-wise reduction of all ranks' `send`.
    pub fn all_reduce<T: Element>(
        &mut self,
        send: &'a [T],
        recv: &'a mut [T],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        self.all_reduce_raw(T::DTYPE, bytes(send), bytes_mut(recv), op)
    }

    /// All-reduce in place.
    pub fn all_reduce_in_place<T: Element>(&mut self, buf: &'a mut [T], op: ReduceOp) -> Result<&mut Self> {
        self.all_reduce_in_place_raw(T::DTYPE, bytes_mut(buf), op)
    }

    /// Every rank's `recv` gets the root's `send` (`recv.len()` elements; `send` is read on
    /// the root only and may be empty elsewhere).
    pub fn broadcast<T: Element>(
        &mut self,
        send: &'a [T],
        recv: &'a mut [T],
        root: Rank,
    ) -> Result<&mut Self> {
        self.broadcast_raw(T::DTYPE, bytes(send), bytes_mut(recv), root)
    }

    /// Broadcast in place.
    pub fn broadcast_in_place<T: Element>(&mut self, buf: &'a mut [T], root: Rank) -> Result<&mut Self> {
        self.broadcast_in_place_raw(T::DTYPE, bytes_mut(buf), root)
    }

    /// The root's `recv` gets the reduction of every rank's `send` (`recv` is written on the
    /// root only and may be empty elsewhere).
    pub fn reduce<T: Element>(
        &mut self,
        send: &'a [T],
        recv: &'a mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<&mut Self> {
        self.reduce_raw(T::DTYPE, bytes(send), bytes_mut(recv), op, root)
    }

    /// Reduce in place (the root's `buf` gets the result; other ranks' are left untouched).
    pub fn reduce_in_place<T: Element>(
        &mut self,
        buf: &'a mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<&mut Self> {
        self.reduce_in_place_raw(T::DTYPE, bytes_mut(buf), op, root)
    }

    /// Every rank's `recv` gets all ranks' `send`, concatenated in rank order.
    pub fn all_gather<T: Element>(&mut self, send: &'a [T], recv: &'a mut [T]) -> Result<&mut Self> {
        self.all_gather_raw(T::DTYPE, bytes(send), bytes_mut(recv))
    }

    /// All-gather in place: `buf` holds `size` blocks; this rank's block is its input.
    pub fn all_gather_in_place<T: Element>(&mut self, buf: &'a mut [T]) -> Result<&mut Self> {
        self.all_gather_in_place_raw(T::DTYPE, bytes_mut(buf))
    }

    /// Block `r` of the reduction of every rank's `send` lands in rank `r`'s `recv`
    /// (`recv.len()` elements per rank).
    pub fn reduce_scatter<T: Element>(
        &mut self,
        send: &'a [T],
        recv: &'a mut [T],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        self.reduce_scatter_raw(T::DTYPE, bytes(send), bytes_mut(recv), op)
    }

    /// Reduce-scatter in place: this rank's block of `buf` gets its result.
    pub fn reduce_scatter_in_place<T: Element>(
        &mut self,
        buf: &'a mut [T],
        op: ReduceOp,
    ) -> Result<&mut Self> {
        self.reduce_scatter_in_place_raw(T::DTYPE, bytes_mut(buf), op)
    }

    /// Block `j` of this rank's `send` goes to rank `j`; block `i` of `recv` comes from rank
    /// `i` (`send.len() / size` elements per block).
    pub fn all_to_all<T: Element>(&mut self, send: &'a [T], recv: &'a mut [T]) -> Result<&mut Self> {
        self.all_to_all_raw(T::DTYPE, bytes(send), bytes_mut(recv))
    }

    /// All-to-all in place: block `j` of `buf` goes to rank `j` and is replaced by rank `j`'s
    /// block for this rank (NCCL's `sendbuff == recvbuff`; each rank chooses for itself).
    pub fn all_to_all_in_place<T: Element>(&mut self, buf: &'a mut [T]) -> Result<&mut Self> {
        self.all_to_all_in_place_raw(T::DTYPE, bytes_mut(buf))
    }

    /// All-to-all with per-peer counts and displacements (in elements): this rank sends
    /// `send[send_displs[j]..][..send_counts[j]]` to rank `j` and receives rank `i`'s segment
    /// into `recv[recv_displs[i]..][..recv_counts[i]]`. Counts must agree pairwise.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<T: Element>(
        &mut self,
        send: &'a [T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &'a mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<&mut Self> {
        self.all_to_all_v_raw(
            T::DTYPE,
            bytes(send),
            send_counts,
            send_displs,
            bytes_mut(recv),
            recv_counts,
            recv_displs,
        )
    }

    /// The root's `recv` gets every rank's `send` in rank order (`recv` is written on the
    /// root only).
    pub fn gather<T: Element>(&mut self, send: &'a [T], recv: &'a mut [T], root: Rank) -> Result<&mut Self> {
        self.gather_raw(T::DTYPE, bytes(send), bytes_mut(recv), root)
    }

    /// Gather in place: on the root, `buf` holds `size` blocks with the root's input already
    /// in its own block; elsewhere `buf` is the rank's input (and is left untouched).
    pub fn gather_in_place<T: Element>(&mut self, buf: &'a mut [T], root: Rank) -> Result<&mut Self> {
        self.gather_in_place_raw(T::DTYPE, bytes_mut(buf), root)
    }

    /// Rank `r`'s `recv` gets block `r` of the root's `send` (`send` is read on the root
    /// only).
    pub fn scatter<T: Element>(&mut self, send: &'a [T], recv: &'a mut [T], root: Rank) -> Result<&mut Self> {
        self.scatter_raw(T::DTYPE, bytes(send), bytes_mut(recv), root)
    }

    /// Scatter in place: on the root, `buf` holds `size` blocks (its own block stays where it
    /// is); elsewhere `buf` receives the rank's block.
    pub fn scatter_in_place<T: Element>(&mut self, buf: &'a mut [T], root: Rank) -> Result<&mut Self> {
        self.scatter_in_place_raw(T::DTYPE, bytes_mut(buf), root)
    }

    /// Sends `buf` to `peer`, which must post a matching receive.
    pub fn send<T: Element>(&mut self, buf: &'a [T], peer: Rank) -> Result<&mut Self> {
        self.send_raw(T::DTYPE, bytes(buf), peer)
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: Rank) -> Result<&mut Self> {
        self.recv_raw(T::DTYPE, bytes_mut(buf), peer)
    }

    /// How many operations the group holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the group holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl Group<'_, Blocking> {
    /// Plans and runs the group; returns when this rank's part is complete.
    pub fn end(self) -> Result<()> {
        if self.ops.is_empty() {
            return Ok(());
        }
        self.comm.execute(&self.ops, &self.bufs, self.what)
    }
}

impl Group<'_, Blocking> {
    /// Plans the group and queues it for the communicator's worker thread (after any call
    /// queued before it), returning at once. `keep` is dropped on the worker thread once the
    /// call is complete and before the handle says so: a binding puts there what keeps its
    /// buffers alive (references to the caller's arrays).
    ///
    /// # Safety
    /// The group's buffers must stay valid, and nothing else may write them (nor read its
    /// outputs), until the call is complete: until `keep` is dropped, whatever becomes of
    /// the returned handle. The borrow checker cannot see this, because the handle is not tied
    /// to the buffers' lifetime.
    pub unsafe fn launch_detached(self, keep: Box<dyn Send>) -> Result<super::Detached> {
        let st = Arc::new(super::scope::WorkState::default());
        if self.ops.is_empty() {
            drop(keep);
            st.complete(Ok(()));
            return Ok(super::Detached::new(st));
        }
        let st2 = st.clone();
        self.comm.submit(
            self.ops,
            self.bufs,
            self.what,
            Box::new(move |r| {
                drop(keep);
                st2.complete(r)
            }),
        )?;
        Ok(super::Detached::new(st))
    }
}

impl<'scope, 'env> Group<'scope, Scoped<'scope, 'env>> {
    /// Plans the group and queues it; the returned [`Work`] tells when it is complete. The
    /// buffers stay borrowed until the scope ends.
    pub fn launch(self) -> Result<Work<'scope>> {
        let scope = self.mode.scope;
        if !std::ptr::eq(scope.comm(), self.comm) {
            return Err(Error::Internal("scoped group of another communicator".into()));
        }
        scope.launch(self.ops, self.bufs, self.what)
    }
}
