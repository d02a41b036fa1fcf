//! Cross-memory calls: the direct path on heap buffers, one copy straight out of each peer's
//! heap with `process_vm_readv` ([`crate::sys::cma`]) instead of two through shared memory.
//!
//! Every rank only reads peers' memory and writes its own. A copy into a shared slot would
//! write cache lines the reader holds, which costs more than the read on the machines
//! measured (see the module's measurements in the issue notes); a pull writes only lines of
//! the puller's own.
//!
//! Work split (the same on every rank, after the post exchange):
//! - all-reduce: with two ranks whose buffers do not overlap, each reduces both whole inputs
//!   into its own output; otherwise rank r reduces its slice (`plan::hostdirect::slice`) from
//!   every rank's input into its own output, marks `mid`, then pulls every other slice from
//!   its owner's output;
//! - reduce-scatter: rank r reduces block r from every rank's input into its output;
//! - reduce: the root reduces everything; broadcast, scatter: non-roots pull from the root;
//!   gather: the root pulls from everyone; all-gather, all-to-all(v): everyone pulls its part.
//!
//! Then every rank marks `done` and waits for every peer's, so no buffer is reused while a
//! peer may still read it (rule 3 of [`crate::transport::hostmem`]).
//!
//! Reductions fold in rank order, as the zero-copy path does, so results do not depend on the
//! path.

use super::{memops, Call, Direct, PeerCtl};
use crate::bootstrap::PeerInfo;
use crate::error::{Error, Result};
use crate::sys::cma;
use crate::wait::Waiter;
use oxccl_core::coll::Collective;
use oxccl_core::config::CrossMemory;
use oxccl_core::plan::hostdirect::{all_reduce_whole, cma_auto, cma_over_inline, slice};
use oxccl_core::plan::OpSpec;
use oxccl_core::reduce::ReduceCtx;
use oxccl_core::tuning::{DIRECT_CMA_BLOCK_BYTES, DIRECT_STREAM_MIN_BYTES};
use oxccl_core::Rank;
use smallvec::SmallVec;
use std::sync::atomic::Ordering;

/// Whether this rank may read every peer's memory: reads each peer's probe nonce through its
/// process id. `Err`: the first refusal, worded for the log.
pub(super) fn probe_peers(
    me: usize,
    peers: &[PeerInfo],
    ctls: &[Option<PeerCtl>],
) -> std::result::Result<Vec<i32>, String> {
    let pids: Vec<i32> = peers.iter().map(|p| p.pid as i32).collect();
    for (q, pc) in ctls.iter().enumerate() {
        let Some(pc) = pc else { continue };
        if q == me {
            continue;
        }
        let (at, nonce) = pc.ctl.probe();
        cma::probe(pids[q], at, nonce).map_err(|e| format!("rank {q}: {e}"))?;
    }
    Ok(pids)
}

/// Whether two non-empty address ranges `(start, len)` overlap.
fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.1 > 0 && b.1 > 0 && a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1)
}

impl Direct {
    /// Whether this rank flags call `c` over these buffers for cross-memory: every peer may be
    /// read, the setting (`OXCCL_CMA`) takes its kind and size, and, for all-to-all, which
    /// reads peers' inputs while they write their outputs, the two do not overlap.
    /// `contribution`: the largest rank's (what decides inline); `fits_inline`: whether the
    /// call could go inline, which it then does unless `cma_over_inline` prefers a pull.
    pub(super) fn flags_cma(
        &self,
        c: &Call,
        contribution: usize,
        fits_inline: bool,
        src: (*mut u8, usize),
        dst: (*mut u8, usize),
    ) -> bool {
        let wanted = match self.cma_mode {
            CrossMemory::Off => false,
            _ if fits_inline => cma_over_inline(c.kind, contribution, &self.host),
            CrossMemory::All => true,
            CrossMemory::Auto => {
                // Sized as nccl-tests counts a call: all-gather by its whole output.
                let n = c.count * c.dtype.size_bytes();
                cma_auto(c.kind, if c.kind == Collective::AllGather { n * self.p } else { n }, &self.host)
            }
        };
        let overlap = |a: (*mut u8, usize), b: (*mut u8, usize)| {
            overlaps((a.0 as u64, a.1 as u64), (b.0 as u64, b.1 as u64))
        };
        // All-to-all reads peers' inputs while they write their outputs; an all-reduce in place
        // would have to split its work (`run_cma`), which won only where the setting says all.
        let overlap_refused = match c.kind {
            Collective::AllToAll | Collective::AllToAllV => true,
            Collective::AllReduce => self.cma_mode == CrossMemory::Auto,
            _ => false,
        };
        wanted && self.cma.is_ok() && !(overlap_refused && overlap(src, dst))
    }

    /// Copies `len` bytes at offset `at` of rank `q`'s source (k = 0) or destination (k = 1)
    /// to `to`. This rank's own buffers are copied locally.
    #[allow(clippy::too_many_arguments)]
    fn pull(
        &self,
        q: usize,
        s: u64,
        k: usize,
        own: (*mut u8, usize),
        at: usize,
        len: usize,
        to: *mut u8,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let me = Rank::new(self.me);
        if q == self.me {
            if at + len > own.1 {
                return Err(Error::Internal(format!(
                    "cross-memory call touches {} bytes of a {}-byte buffer",
                    at + len,
                    own.1
                )));
            }
            // SAFETY: at + len ≤ the buffer's length (checked); `to` holds `len` bytes (the
            // caller's check); the work split never names a range as both.
            let from = unsafe { own.0.add(at) };
            if from != to {
                // SAFETY: as above; `copy` allows overlap.
                unsafe { std::ptr::copy(from, to, len) };
            }
            return Ok(());
        }
        let d = self.desc(q, s, k);
        if (at + len) as u64 > d.len {
            return Err(Error::Mismatch {
                rank: me,
                op: "direct path (cross-memory)".into(),
                peer: Rank::new(q),
                got: d.len as usize,
                want: at + len,
            });
        }
        let base = self.ctl(q).post(s).meta.0.addr[k].load(Ordering::Relaxed);
        let pid = self.cma.as_ref().map(|p| p[q]).map_err(|e| Error::Internal(e.clone()))?;
        // SAFETY: `to` holds `len` bytes of this rank's memory that nothing else touches during
        // the call (the caller's check and rule 2 of the direct path).
        unsafe { cma::read(pid, base + at as u64, to, len) }.map_err(|e| {
            let e =
                std::io::Error::new(e.kind(), format!("{e}, reading {len} bytes at {:#x}", base + at as u64));
            Error::io(me, "read a peer's buffer (process_vm_readv)", Some(Rank::new(q)), e)
        })
    }

    /// Whether some rank's send and receive buffers of call `s` overlap (from the posted
    /// addresses and lengths: the same answer on every rank).
    fn any_in_place(&self, s: u64) -> bool {
        (0..self.p).any(|q| {
            let m = &self.ctl(q).post(s).meta.0;
            let at = |k: usize| (m.addr[k].load(Ordering::Relaxed), self.desc(q, s, k).len);
            overlaps(at(0), at(1))
        })
    }

    /// The mid mark: publish `s` (streaming stores first), wake sleepers, wait for every
    /// peer's.
    fn mark_mid(&self, w: &Waiter, what: &str, s: u64) -> Result<()> {
        memops::store_fence();
        self.own.finish_first(s);
        self.wake();
        self.wait_all(w, what, |c| c.finished_first(s))
    }

    /// Reduces bytes `[at, at + len)` of every rank's source into `to`, a block at a time,
    /// peers' blocks pulled into private buffers (in place, `to` may be this rank's source
    /// range: each block is reduced into a private buffer before it is written).
    #[allow(clippy::too_many_arguments)]
    fn reduce_pulled(
        &mut self,
        ctx: &ReduceCtx,
        s: u64,
        src: (*mut u8, usize),
        at: usize,
        len: usize,
        to: *mut u8,
        stream: bool,
    ) -> Result<()> {
        let p = self.p;
        let block = DIRECT_CMA_BLOCK_BYTES;
        let mut tmp = std::mem::take(&mut self.cma_tmp);
        // One block per peer (this rank's own source is read in place).
        if tmp.len() < (p - 1) * block / 8 {
            tmp = vec![0u64; (p - 1) * block / 8];
        }
        let r = (|| {
            let mut off = 0;
            while off < len {
                let b = block.min(len - off);
                let mut srcs = SmallVec::<[*const u8; 8]>::new();
                for q in 0..p {
                    if q == self.me {
                        if at + off + b > src.1 {
                            return Err(Error::Internal("cross-memory reduction beyond the source".into()));
                        }
                        // SAFETY: within the source (checked just above).
                        srcs.push(unsafe { src.0.add(at + off) } as *const u8);
                    } else {
                        let i = if q < self.me { q } else { q - 1 };
                        let t =
                            bytemuck::cast_slice_mut::<u64, u8>(&mut tmp[i * block / 8..(i + 1) * block / 8]);
                        self.pull(q, s, 0, src, at + off, b, t.as_mut_ptr())?;
                        srcs.push(t.as_ptr());
                    }
                }
                // SAFETY: `to` holds `len` bytes (the caller's check).
                self.reduce(ctx, &srcs, &[unsafe { to.add(off) }], b, stream);
                off += b;
            }
            Ok(())
        })();
        self.cma_tmp = tmp;
        r
    }

    /// Runs a cross-memory call (every rank flagged it); the caller makes the end mark.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_cma(
        &mut self,
        c: &Call,
        op: &OpSpec,
        ctx: Option<&ReduceCtx>,
        s: u64,
        src: (*mut u8, usize),
        dst: (*mut u8, usize),
        (w, what): (&Waiter, &str),
    ) -> Result<()> {
        let (p, me) = (self.p, self.me);
        let es = c.dtype.size_bytes();
        let n = c.count;
        let nb = n * es;
        let stream = src.1.max(dst.1) >= DIRECT_STREAM_MIN_BYTES && src.0 != dst.0;
        let need = |len: usize| {
            if len > dst.1 {
                Err(Error::Internal(format!("result of {len} bytes for a {}-byte buffer", dst.1)))
            } else {
                Ok(())
            }
        };
        let need_ctx = || ctx.copied().ok_or_else(|| Error::Internal("reduction without context".into()));
        // Where byte `at` of this rank's output lies (`need` checked the range first).
        let out = |at: usize| dst.0.wrapping_add(at);
        match c.kind {
            Collective::AllReduce if all_reduce_whole(nb, &self.host) && !self.any_in_place(s) => {
                // Two ranks: each reduces the whole of both inputs into its own output. The
                // same bytes cross between the cores as with the split below (the peer's whole
                // input instead of half its input and half its output), with no `mid` wait,
                // and only inputs are read, which nothing writes during the call. Every rank
                // folds in rank order, so the results agree bit for bit.
                need(nb)?;
                self.reduce_pulled(&need_ctx()?, s, src, 0, nb, dst.0, stream)?;
            }
            Collective::AllReduce => {
                need(nb)?;
                let r = slice(n, p, me, es);
                let (off, len) = (r.start * es, r.len() * es);
                self.reduce_pulled(&need_ctx()?, s, src, off, len, out(off), stream)?;
                self.mark_mid(w, what, s)?;
                for i in 1..p {
                    let q = (me + i) % p;
                    let r = slice(n, p, q, es);
                    let (off, len) = (r.start * es, r.len() * es);
                    self.pull(q, s, 1, dst, off, len, out(off))?;
                }
            }
            Collective::ReduceScatter => {
                need(nb)?;
                self.reduce_pulled(&need_ctx()?, s, src, me * nb, nb, dst.0, stream)?;
            }
            Collective::Reduce => {
                if me == c.root {
                    need(nb)?;
                    self.reduce_pulled(&need_ctx()?, s, src, 0, nb, dst.0, stream)?;
                }
            }
            Collective::Broadcast => {
                need(nb)?;
                self.pull(c.root, s, 0, src, 0, nb, dst.0)?;
            }
            Collective::AllGather => {
                need(nb * p)?;
                for i in 0..p {
                    let q = (me + i) % p;
                    self.pull(q, s, 0, src, 0, nb, out(q * nb))?;
                }
            }
            Collective::AllToAll => {
                need(nb * p)?;
                for i in 0..p {
                    let q = (me + i) % p;
                    self.pull(q, s, 0, src, me * nb, nb, out(q * nb))?;
                }
            }
            Collective::Gather => {
                if me == c.root {
                    need(nb * p)?;
                    for q in 0..p {
                        self.pull(q, s, 0, src, 0, nb, out(q * nb))?;
                    }
                }
            }
            Collective::Scatter => {
                need(nb)?;
                self.pull(c.root, s, 0, src, me * nb, nb, dst.0)?;
            }
            Collective::AllToAllV => {
                let OpSpec::AllToAllV { recv_counts, recv_displs, .. } = op else {
                    return Err(Error::Internal("all-to-all-v without its arrays".into()));
                };
                for i in 0..p {
                    let q = (me + i) % p;
                    let (cnt, displ) = self.segment_from(q, s, recv_counts[q], es)?;
                    let at = recv_displs[q] * es;
                    need(at + cnt * es)?;
                    self.pull(q, s, 0, src, displ.saturating_mul(es), cnt * es, out(at))?;
                }
            }
            Collective::Send | Collective::Recv => {
                return Err(Error::Internal("a point-to-point call on the direct path".into()))
            }
        }
        Ok(())
    }
}
