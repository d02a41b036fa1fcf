//! One-sided calls on a [`Communicator`]: windows, puts with signals, signals, waits.
//!
//! Every call checks its arguments first (a bad one is `Error::Invalid`, naming it with
//! NCCL's argument names, and leaves the communicator usable); registration and
//! deregistration are collective (see the module rules of [`crate::rma`]); puts and signals
//! complete (the source may be reused) before they return; a wait returns once the signals it
//! waits for arrived, and the data of the puts that carried them is in the window.

use super::Rma;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use oxccl_core::{coll, CoreError, Element, Rank};

/// This rank's handle of a registered window: the same registration on every rank (the k-th
/// of each), so a put names the peer's instance with the origin's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub(crate) rma: u64,
    pub(crate) seq: u64,
    pub(crate) base: usize,
    pub(crate) len: usize,
}

impl Window {
    /// The registration's number on this communicator (0 for the first; alike on every rank).
    pub fn index(&self) -> u64 {
        self.seq
    }

    /// This rank's instance: where it starts.
    pub fn base(&self) -> *mut u8 {
        self.base as *mut u8
    }

    /// This rank's instance: its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether this rank's instance is empty (never: registration refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What a wait waits for: `count` more signals from `peer` on (`ctx`, `sig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitDesc {
    pub peer: Rank,
    pub count: u64,
    pub ctx: usize,
    pub sig: usize,
}

impl Communicator {
    fn rma(&self) -> Result<&Rma> {
        self.inner.check_usable()?;
        Rma::of(&self.inner)
    }

    /// Registers `[base, base + len)` as this rank's instance of the communicator's next
    /// window (collective: every rank registers its windows in the same order). With
    /// `device`, the memory is a device's: it is registered (so the order stays aligned) but
    /// one-sided calls into it are refused.
    ///
    /// # Safety
    /// Until [`deregister_window`](Self::deregister_window) returns, the memory must stay
    /// valid, and the program may touch a range of it only when no put into that range is in
    /// flight (after the wait for the put's signal): peers write it at any time otherwise.
    pub unsafe fn register_window(&self, base: *mut u8, len: usize, device: bool) -> Result<Window> {
        if base.is_null() {
            return Err(CoreError::InvalidArgument { arg: "buff", reason: "NULL pointer".into() }.into());
        }
        if len == 0 {
            return Err(CoreError::InvalidArgument { arg: "size", reason: "0 bytes".into() }.into());
        }
        if (base as usize).checked_add(len).is_none() {
            return Err(CoreError::InvalidArgument {
                arg: "size",
                reason: format!("{len} bytes from {base:p} wrap around the address space"),
            }
            .into());
        }
        self.rma()?.register(&self.inner, base as usize, len, device)
    }

    /// Deregisters `win` (collective, in the registrations' order on every rank): once it
    /// returns, no peer writes this rank's instance any more.
    pub fn deregister_window(&self, win: Window) -> Result<()> {
        let r = Rma::get(&self.inner).ok_or_else(|| {
            Error::from(CoreError::InvalidArgument {
                arg: "win",
                reason: "no window was registered on this communicator".into(),
            })
        })?;
        r.deregister(&self.inner, &win)
    }

    /// The size of `peer`'s instance of `win` (learned at registration), for checks before a
    /// put.
    pub fn window_size(&self, win: &Window, peer: Rank) -> Result<usize> {
        let peer = coll::check_rank("peer", peer.0 as i64, self.size())?;
        self.rma()?.peer_len(win, peer)
    }

    /// Writes `src` into `peer`'s instance of `win` at byte `offset`, then delivers one signal
    /// on (`ctx`, `sig`) to `peer`, after the data and after every earlier put and signal to
    /// it (`ncclPutSignal`). `src` may be reused once this returns.
    pub fn put_signal<T: Element>(
        &self,
        src: &[T],
        peer: Rank,
        win: &Window,
        offset: usize,
        ctx: usize,
        sig: usize,
    ) -> Result<()> {
        let peer = coll::check_rank("peer", peer.0 as i64, self.size())?;
        let r = self.rma()?;
        r.put(&self.inner, bytemuck::cast_slice(src), peer, win, offset, (ctx, sig))
    }

    /// Delivers one signal on (`ctx`, `sig`) to `peer` without data (`ncclSignal`).
    pub fn signal(&self, peer: Rank, ctx: usize, sig: usize) -> Result<()> {
        let peer = coll::check_rank("peer", peer.0 as i64, self.size())?;
        self.rma()?.signal(&self.inner, peer, ctx, sig)
    }

    /// Waits until, for every descriptor, `count` more signals from its peer on its (ctx,
    /// sig) have arrived than earlier waits consumed, then consumes them (`ncclWaitSignal`).
    /// A wait that never completes fails at the communicator's timeout (naming what it waits
    /// for), when a peer it waits on is gone, or at [`abort`](Self::abort).
    pub fn wait_signal(&self, descs: &[WaitDesc]) -> Result<()> {
        for d in descs {
            coll::check_rank("peer", d.peer.0 as i64, self.size())?;
        }
        self.rma()?.wait(&self.inner, descs)
    }
}
