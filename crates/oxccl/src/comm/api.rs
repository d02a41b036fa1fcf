//! Single calls: each one is a group of one, run blocking on the communicator or launched in a
//! scope. The argument rules are [`Group`](super::Group)'s.

use super::{Communicator, Scope, Work};
use crate::error::Result;
use oxccl_core::{DataType, Element, Rank, ReduceOp};

macro_rules! calls {
    ($( $(#[$doc:meta])* fn $name:ident($($arg:ident : $ty:ty),*); )*) => {
        impl Communicator {
            $(
                $(#[$doc])*
                /// Blocks until this rank's part is complete.
                pub fn $name<'a, T: Element>(&self, $($arg: $ty),*) -> Result<()> {
                    let mut g = self.group();
                    g.$name($($arg),*)?;
                    g.end()
                }
            )*
        }

        impl<'scope, 'env> Scope<'scope, 'env> {
            $(
                $(#[$doc])*
                /// Launched asynchronously; the buffers stay borrowed until the scope ends.
                pub fn $name<'a: 'scope, T: Element>(&'scope self, $($arg: $ty),*) -> Result<Work<'scope>> {
                    let mut g = self.group();
                    g.$name($($arg),*)?;
                    g.launch()
                }
            )*
        }
    };
}

calls! {
    /// All-reduce: every rank's `recv` gets the reduction of all ranks' `send`.
    fn all_reduce(send: &'a [T], recv: &'a mut [T], op: ReduceOp);
    /// All-reduce in place.
    fn all_reduce_in_place(buf: &'a mut [T], op: ReduceOp);
    /// Broadcast from `root`.
    fn broadcast(send: &'a [T], recv: &'a mut [T], root: Rank);
    /// Broadcast in place.
    fn broadcast_in_place(buf: &'a mut [T], root: Rank);
    /// Reduce to `root`.
    fn reduce(send: &'a [T], recv: &'a mut [T], op: ReduceOp, root: Rank);
    /// Reduce in place.
    fn reduce_in_place(buf: &'a mut [T], op: ReduceOp, root: Rank);
    /// All-gather.
    fn all_gather(send: &'a [T], recv: &'a mut [T]);
    /// All-gather in place.
    fn all_gather_in_place(buf: &'a mut [T]);
    /// Reduce-scatter.
    fn reduce_scatter(send: &'a [T], recv: &'a mut [T], op: ReduceOp);
    /// Reduce-scatter in place.
    fn reduce_scatter_in_place(buf: &'a mut [T], op: ReduceOp);
    /// All-to-all.
    fn all_to_all(send: &'a [T], recv: &'a mut [T]);
    /// All-to-all in place.
    fn all_to_all_in_place(buf: &'a mut [T]);
    /// All-to-all with per-peer counts and displacements.
    fn all_to_all_v(send: &'a [T], send_counts: &[usize], send_displs: &[usize], recv: &'a mut [T], recv_counts: &[usize], recv_displs: &[usize]);
    /// Gather to `root`.
    fn gather(send: &'a [T], recv: &'a mut [T], root: Rank);
    /// Gather in place.
    fn gather_in_place(buf: &'a mut [T], root: Rank);
    /// Scatter from `root`.
    fn scatter(send: &'a [T], recv: &'a mut [T], root: Rank);
    /// Scatter in place.
    fn scatter_in_place(buf: &'a mut [T], root: Rank);
    /// Send to `peer`.
    fn send(buf: &'a [T], peer: Rank);
    /// Receive from `peer`.
    fn recv(buf: &'a mut [T], peer: Rank);
}

impl Communicator {
    /// Returns once every rank of the communicator has called it (a one-byte all-reduce,
    /// named "barrier" in errors and the flight recorder).
    pub fn barrier(&self) -> Result<()> {
        let mut one = [0u8; 1];
        let mut g = self.group();
        g.all_reduce_in_place_raw(DataType::U8, &mut one, ReduceOp::Max)?;
        g.label("barrier");
        g.end()
    }
}
