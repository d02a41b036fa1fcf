//! The direct path: collectives of a communicator whose ranks all share one host, run by
//! reading and writing each other's memory instead of streaming chunks through connections.
//!
//! A call posts in this rank's control block ([`crate::transport::hostmem`]) and waits until
//! every peer has posted the same sequence number. Then, identically on every rank:
//! - inline (every contribution fits the inline area, and pulling it would not be cheaper,
//!   `plan::hostdirect::cma_over_inline`): each rank computes its result from the posted
//!   copies, locally, in rank order; nothing else is exchanged;
//! - zero-copy (every rank's buffers are shared allocations, [`crate::mem`]): each rank does its
//!   share of the work on the peers' buffers, mapped here (each input byte read once and each
//!   output byte written once), then waits at an end barrier;
//! - cross-memory (heap buffers, when every rank may read every peer's memory with
//!   `process_vm_readv`, [`cma`]): each rank pulls what it needs from the peers' buffers into
//!   its own; no rank ever writes another's memory;
//! - otherwise the call falls back to the ring engine, with nothing touched.
//!
//! Memory rules (besides the control block's, see its module):
//! 1. Peers' buffers are touched only between the post exchange and the end barrier of a
//!    zero-copy call, and only at locations the peer posted, bounds-checked against its
//!    allocation.
//! 2. The work split gives every output byte exactly one writer; a rank reads a byte that some
//!    rank writes in the same call only if it is that writer (in-place slices), and then
//!    through a private block buffer, so no slice is read after it was overwritten.
//! 3. Cross-memory calls only read peers' memory; what a rank writes in a first phase for its
//!    peers to read is read only after that rank's `mid` mark ([`crate::transport::hostmem`]).

mod cma;
mod setup;

use super::{memops, RawBuf};
use crate::bootstrap::{Mailbox, PeerInfo};
use crate::error::{Error, Result};
use crate::mem::{self, PeerAlloc};
use crate::sys::fd::{self, EventFd};
use crate::transport::host::{host_call, HostRequest};
use crate::transport::hostmem::{publisher_fence, Ctl, FLAG_CMA, FLAG_INLINE, FLAG_SHARED, INLINE_BYTES};
use crate::wait::Waiter;
use oxccl_core::coll::Collective;
use oxccl_core::config::CrossMemory;
use oxccl_core::contract::Sig;
use oxccl_core::plan::hostdirect::{contribution_bytes, slice, Host};
use oxccl_core::plan::{Loc, OpSpec};
use oxccl_core::reduce::{finalize, reduce_many, ReduceCtx};
use oxccl_core::tuning::{
    DIRECT_BLOCK_BYTES, DIRECT_INLINE_STREAM_MIN_BYTES, DIRECT_SPIN_NS, DIRECT_SPIN_OVERSUBSCRIBED_NS,
    DIRECT_STREAM_MIN_BYTES, DIRECT_ZERO_COPY_MIN_BYTES, YIELD_NS,
};
use oxccl_core::{DataType, Rank, ReduceOp};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a direct call did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done,
    /// Not every rank's buffers are shared and the call is too big to inline: run the ring.
    Fallback,
}

struct PeerCtl {
    ctl: Ctl,
    bell: EventFd,
}

/// A peer's posted location: (allocation id, offset, bytes from there to the buffer's end).
#[derive(Clone, Copy, Debug, Default)]
struct Desc {
    alloc: u64,
    off: u64,
    len: u64,
}

/// One call, described for the direct path.
struct Call {
    kind: Collective,
    count: usize,
    dtype: DataType,
    op: Option<ReduceOp>,
    root: usize,
    src: Loc,
    dst: Loc,
}

impl Call {
    /// The largest rank's contribution in bytes (what decides inline, and where it lies).
    fn largest_contribution(&self, p: usize) -> usize {
        let es = self.dtype.size_bytes();
        (0..p).map(|q| contribution_bytes(self.kind, self.count, es, p, q == self.root)).max().unwrap_or(0)
    }
}

fn describe(op: &OpSpec) -> Option<Call> {
    let c = |kind, count, dtype, op, root: Option<Rank>, src, dst| Call {
        kind,
        count,
        dtype,
        op,
        root: root.map(|r| r.idx()).unwrap_or(0),
        src,
        dst,
    };
    Some(match *op {
        OpSpec::AllReduce { count, dtype, op, src, dst } => {
            c(Collective::AllReduce, count, dtype, Some(op), None, src, dst)
        }
        OpSpec::Broadcast { count, dtype, root, src, dst } => {
            c(Collective::Broadcast, count, dtype, None, Some(root), src, dst)
        }
        OpSpec::Reduce { count, dtype, op, root, src, dst } => {
            c(Collective::Reduce, count, dtype, Some(op), Some(root), src, dst)
        }
        OpSpec::AllGather { count, dtype, src, dst } => {
            c(Collective::AllGather, count, dtype, None, None, src, dst)
        }
        OpSpec::ReduceScatter { count, dtype, op, src, dst } => {
            c(Collective::ReduceScatter, count, dtype, Some(op), None, src, dst)
        }
        OpSpec::AllToAll { count, dtype, src, dst } => {
            c(Collective::AllToAll, count, dtype, None, None, src, dst)
        }
        OpSpec::AllToAllV { dtype, src, dst, .. } => c(Collective::AllToAllV, 0, dtype, None, None, src, dst),
        OpSpec::Gather { count, dtype, root, src, dst } => {
            c(Collective::Gather, count, dtype, None, Some(root), src, dst)
        }
        OpSpec::Scatter { count, dtype, root, src, dst } => {
            c(Collective::Scatter, count, dtype, None, Some(root), src, dst)
        }
        OpSpec::Send { .. } | OpSpec::Recv { .. } => return None,
    })
}

/// Who this rank is: its rank, every peer's information, the communicator's secret, and
/// which heap-buffer calls may read across processes (`OXCCL_CMA`).
pub(crate) struct Identity<'a> {
    pub me: Rank,
    pub peers: &'a [PeerInfo],
    pub secret: [u8; 32],
    pub cma: CrossMemory,
}

/// The direct engine of one rank of a single-host communicator.
pub(crate) struct Direct {
    me: usize,
    p: usize,
    secret: [u8; 32],
    unix: Vec<[u8; 16]>,
    own: Arc<Ctl>,
    peers: Vec<Option<PeerCtl>>,
    seq: u64,
    allocs: HashMap<(usize, u64), PeerAlloc>,
    doorbell: Arc<EventFd>,
    abort: Arc<AtomicBool>,
    spin: Duration,
    /// Ranks, cores and cache: what the cross-memory choices depend on.
    host: Host,
    block: Vec<u64>,
    /// Every rank's process id where this rank may read every peer's memory; otherwise why not
    /// (for the log).
    cma: std::result::Result<Vec<i32>, String>,
    /// Which calls take the cross-memory mode where it is possible.
    cma_mode: CrossMemory,
    /// Blocks read from peers by cross-memory calls (allocated on first use).
    cma_tmp: Vec<u64>,
}

impl Direct {
    /// Bytes mapped for this communicator: `(peers' allocations mapped on demand, control
    /// blocks)`. The first can be dropped at any time between jobs ([`Direct::unmap_allocs`]).
    pub fn mapped_bytes(&self) -> (usize, usize) {
        let allocs = self.allocs.values().map(|a| a.data_len()).sum();
        let ctls = (1 + self.peers.iter().flatten().count()) * crate::transport::hostmem::CTL_BYTES;
        (allocs, ctls)
    }

    /// Unmaps the peers' allocations mapped so far (the next job that meets one maps it again).
    pub fn unmap_allocs(&mut self) {
        self.allocs = HashMap::new();
    }

    /// Whether a contribution of `bytes` to a call of `kind` goes into the inline area with
    /// streaming stores. Ordinary stores into lines the peers read at the last use of the area
    /// must first take them back from the peers' caches, which on the machine measured (a
    /// 2-vCPU KVM guest) cost more than the peers then reading the lines from memory, for
    /// the kinds where every peer reads all of a contribution: all-reduce (oxccl-perf, heap
    /// buffers, 5 alternating rounds: 16-64 KiB 0.83-0.96 of the time at 2 ranks, 0.63-0.94
    /// at 4) and broadcast (0.28-0.39 at 2 ranks; not at 4 ranks on 2 cores, 0.98-1.28).
    /// Kinds whose peers read a part of each contribution (reduce-scatter, all-to-all,
    /// reduce, gather, scatter) were 1.2-1.9 times slower with them, all-gather 1.0-1.1.
    fn stream_inline(&self, kind: Collective, bytes: usize) -> bool {
        bytes >= DIRECT_INLINE_STREAM_MIN_BYTES
            && match kind {
                Collective::AllReduce => true,
                Collective::Broadcast => !self.host.oversubscribed,
                _ => false,
            }
    }

    /// Whether heap buffers are read across processes, or why not (for the log).
    pub fn cross_memory(&self) -> std::result::Result<(), &str> {
        self.cma.as_ref().map(|_| ()).map_err(|e| e.as_str())
    }

    fn ctl(&self, q: usize) -> &Ctl {
        match &self.peers[q] {
            Some(pc) => &pc.ctl,
            None => &self.own,
        }
    }

    /// Rings every sleeping peer after a publication.
    fn wake(&self) {
        publisher_fence();
        for pc in self.peers.iter().flatten() {
            if pc.ctl.asleep() {
                pc.bell.notify();
            }
        }
    }

    /// Waits until `ready(peer)` holds for every peer: polls without reading the clock at
    /// first (a clock read costs as much as many polls), then yields, then sleeps. While it
    /// polls, a peer it waits for whose last wait began on this core (the control block's
    /// `cpu` hint) gets the core at once: spinning would only keep it off (measured, 2 ranks
    /// with a busy loop on the other core: 8 B all-reduce 28 µs a call, 5.5 with the hint). Never
    /// inlined: the instruction-count test (`oxccl-perf/tests/call_cost.rs`) subtracts what
    /// waiting costs, which depends on the peer, by this function's name.
    #[inline(never)]
    fn wait_all(&self, w: &Waiter, what: &str, ready: impl Fn(&Ctl) -> bool) -> Result<()> {
        let all_ready = || (0..self.p).all(|q| q == self.me || ready(self.ctl(q)));
        let check_every = if self.spin < Duration::from_micros(1) { 16 } else { 256 };
        let mut polls = 0u32;
        let mut start: Option<Instant> = None;
        if all_ready() {
            return Ok(());
        }
        // Where this rank waits, for peers that wait for it (the layout's `cpu` hint).
        let mine = crate::sys::affinity::running_on().map_or(0, |c| c.saturating_add(1));
        self.own.cpu().store(mine, Ordering::Relaxed);
        // A peer we wait for that last waited on this core cannot run while we spin there.
        let shares_core = |q: usize| {
            q != self.me && !ready(self.ctl(q)) && self.ctl(q).cpu().load(Ordering::Relaxed) == mine
        };
        loop {
            if all_ready() {
                return Ok(());
            }
            polls = polls.wrapping_add(1);
            if polls % check_every != 0 {
                std::hint::spin_loop();
                continue;
            }
            let idle = start.get_or_insert_with(Instant::now).elapsed();
            if idle < self.spin {
                if mine != 0 && (0..self.p).any(shares_core) {
                    // Hand it the core instead of spinning it away.
                    std::thread::yield_now();
                }
                continue;
            }
            if self.abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted { rank: Rank::new(self.me) });
            }
            let missing: Vec<Rank> =
                (0..self.p).filter(|q| *q != self.me && !ready(self.ctl(*q))).map(Rank::new).collect();
            w.check(what, &missing)?;
            if idle < Duration::from_nanos(YIELD_NS) + self.spin {
                std::thread::yield_now();
                continue;
            }
            self.own.sleep_announce();
            if !all_ready() {
                let mut pfd = [fd::pollfd(self.doorbell.as_raw_fd(), fd::POLLIN)];
                fd::poll(&mut pfd, w.slice()).map_err(|e| Error::io(Rank::new(self.me), "poll", None, e))?;
            }
            self.own.sleep_end();
            self.doorbell.drain();
        }
    }

    /// A peer's allocation range, mapping the allocation on first use.
    fn peer_range(&mut self, q: usize, d: Desc, need: usize) -> Result<*mut u8> {
        let me = Rank::new(self.me);
        if need == 0 {
            return Ok(std::ptr::NonNull::dangling().as_ptr());
        }
        if d.len < need as u64 {
            return Err(Error::Mismatch {
                rank: me,
                op: "direct path".into(),
                peer: Rank::new(q),
                got: d.len as usize,
                want: need,
            });
        }
        if !self.allocs.contains_key(&(q, d.alloc)) {
            // Forget mappings of allocations their owners freed.
            self.allocs.retain(|_, a| !a.freed());
            let req = HostRequest::Map { secret: self.secret, from: me, to: Rank::new(q), alloc: d.alloc };
            let mut fds = host_call(&self.unix[q], &req, &[])
                .map_err(|e| Error::io(me, "map a peer's shared buffer", Some(Rank::new(q)), e))?;
            let fd = fds
                .pop()
                .ok_or_else(|| Error::Internal("shared buffer answer without a descriptor".into()))?;
            let a = PeerAlloc::map(fd, d.alloc)
                .map_err(|e| Error::io(me, "map a peer's shared buffer", Some(Rank::new(q)), e))?;
            self.allocs.insert((q, d.alloc), a);
        }
        self.allocs[&(q, d.alloc)]
            .range(d.off as usize, need)
            .ok_or_else(|| Error::Internal(format!("rank {q} posted a buffer outside its shared allocation")))
    }

    /// Runs one collective, or says it must take the ring. `sig` is the call's signature: it
    /// goes out with the post, and every peer's post must carry the same one. Not inlined
    /// into the engine's entry: the compiler then inlines the inline path into it instead
    /// (measured by `call_cost`: 1950 instructions per 8-byte call when a change of codegen
    /// units let it fold this into `run_ops_inner` and call `run_inline`, 1856 this way).
    #[inline(never)]
    pub fn run(&mut self, op: &OpSpec, bufs: &[RawBuf], w: &Waiter, what: &str, sig: Sig) -> Result<Outcome> {
        let Some(c) = describe(op) else {
            return Ok(Outcome::Fallback);
        };
        let (p, me) = (self.p, self.me);
        let es = c.dtype.size_bytes();
        if c.kind != Collective::AllToAllV && c.count == 0 {
            return Ok(Outcome::Done);
        }
        let ctx = match c.op {
            Some(o) => Some(ReduceCtx::new(c.dtype, o, p as u32)?),
            None => None,
        };
        let loc = |l: Loc| bufs.get(l.buf.0 as usize).map(|b| (b, l.off));
        let (Some((sbuf, soff)), Some((dbuf, doff))) = (loc(c.src), loc(c.dst)) else {
            return Err(Error::Internal("direct call names a missing buffer".into()));
        };
        // SAFETY: offsets come from the validated OpSpec and lie within their buffers.
        let (src, dst) = unsafe { (sbuf.ptr.add(soff.min(sbuf.len)), dbuf.ptr.add(doff.min(dbuf.len))) };
        let (src_len, dst_len) = (sbuf.len.saturating_sub(soff), dbuf.len.saturating_sub(doff));
        let max_contrib = c.largest_contribution(p);
        // Small calls always go inline; mid-sized ones inline unless this rank's buffers are
        // shared (then zero-copy, if every rank's are) or a pull from peers' heaps is cheaper
        // (`cma_over_inline`); large ones zero-copy, cross-memory or the ring.
        let shared = |ptr: *mut u8, len: usize| if len == 0 { Some((0, 0)) } else { mem::lookup(ptr, len) };
        let (sd, dd) = if max_contrib <= DIRECT_ZERO_COPY_MIN_BYTES {
            (None, None)
        } else {
            (shared(src, src_len), shared(dst, dst_len))
        };
        let is_shared = sd.is_some() && dd.is_some();
        let fits_inline = max_contrib <= INLINE_BYTES && !is_shared;
        // (Contributions of at most a kilobyte always go inline: no need to ask.)
        let cma = max_contrib > DIRECT_ZERO_COPY_MIN_BYTES
            && self.flags_cma(&c, max_contrib, fits_inline, (src, src_len), (dst, dst_len));
        let inline = fits_inline && !cma;
        let s = self.seq + 1;
        self.seq = s;
        {
            let post = self.own.post(s);
            let mine = contribution_bytes(c.kind, c.count, es, p, me == c.root);
            let mut flags = 0;
            if inline {
                if mine > src_len {
                    return Err(Error::Internal(format!(
                        "contribution of {mine} bytes from a {src_len}-byte buffer"
                    )));
                }
                // `src` holds `mine` bytes (checked); the inline area holds INLINE_BYTES ≥ mine
                // (the post's head SMALL_BYTES ≥ max_contrib ≥ mine, where it is used) and
                // belongs to this rank (rule 1 of hostmem).
                let area = self.own.inline_for(s, max_contrib);
                if self.stream_inline(c.kind, mine) {
                    // SAFETY: see just above.
                    unsafe { memops::copy(area, src, mine, true) };
                    // Streaming stores are weakly ordered: fence them before the post.
                    memops::store_fence();
                } else {
                    // SAFETY: see just above.
                    unsafe { std::ptr::copy_nonoverlapping(src, area, mine) };
                }
                flags |= FLAG_INLINE;
            }
            if is_shared || cma {
                for (k, (d, len)) in [(sd, src_len), (dd, dst_len)].into_iter().enumerate() {
                    let (id, off) = d.unwrap_or((0, 0));
                    post.meta.0.desc[k][0].store(id, Ordering::Relaxed);
                    post.meta.0.desc[k][1].store(off as u64, Ordering::Relaxed);
                    post.meta.0.desc[k][2].store(len as u64, Ordering::Relaxed);
                }
                if is_shared {
                    flags |= FLAG_SHARED;
                }
                if cma {
                    flags |= FLAG_CMA;
                    post.meta.0.addr[0].store(src as u64, Ordering::Relaxed);
                    post.meta.0.addr[1].store(dst as u64, Ordering::Relaxed);
                }
                if let OpSpec::AllToAllV { send_counts, send_displs, .. } = op {
                    // Peers pull their segments: publish where each one is.
                    let area = self.own.inline(s) as *mut u64;
                    for q in 0..p {
                        // SAFETY: 2 × P u64 fit the inline area (P ≤ 4096, checked at setup).
                        unsafe {
                            area.add(2 * q).write(send_counts[q] as u64);
                            area.add(2 * q + 1).write(send_displs[q] as u64);
                        }
                    }
                }
            }
            post.publish(s, flags, &sig.to_words());
        }
        // Sleeping peers are rung once the posts are in and, inline, the result is made, where
        // this rank's post stored more than a kilobyte or ranks outnumber cores: the fence of
        // `wake` waits until this rank's stores (an inline copy) have left for the peers that
        // hold their lines, which then overlaps the wait and the reduction instead of
        // preceding them. (A small post drains at once and ringing first measured faster.)
        // Safe: a peer asleep in this call's post wait has posted already, so this rank's own
        // wait never waits on it, and rule 4 of hostmem only needs the ring after the post.
        let ring_late = max_contrib > DIRECT_ZERO_COPY_MIN_BYTES || self.host.oversubscribed;
        if !ring_late {
            self.wake();
        }
        let posted = self.wait_all(w, what, |ctl| ctl.post(s).posted(s));
        if let Err(e) = posted.and_then(|()| self.check_signatures(s, sig, what)) {
            self.wake();
            return Err(e);
        }
        let all = |f: u32| (0..p).all(|q| self.ctl(q).post(s).flags() & f != 0);
        if all(FLAG_INLINE) {
            let r = self.run_inline(&c, ctx.as_ref(), s, max_contrib, dst, dst_len);
            if ring_late || r.is_err() {
                self.wake();
            }
            return r.map(|()| Outcome::Done);
        }
        if ring_late {
            // Before the work, whose waits may take long.
            self.wake();
        }
        let r = if all(FLAG_SHARED) {
            self.run_zero_copy(&c, op, ctx.as_ref(), s, (src, src_len), (dst, dst_len))
        } else if all(FLAG_CMA) {
            self.run_cma(&c, op, ctx.as_ref(), s, (src, src_len), (dst, dst_len), (w, what))
        } else {
            // Mixed or heap buffers too large to inline: nothing was touched; take the ring.
            return Ok(Outcome::Fallback);
        };
        r?;
        // Streaming stores must be visible before peers learn this rank is done.
        memops::store_fence();
        if p > 1 {
            self.own.finish(s);
            self.wake();
            self.wait_all(w, what, |ctl| ctl.finished(s))?;
        }
        Ok(Outcome::Done)
    }

    /// The contract check: every peer's post is of this very call (before any of its data or
    /// buffers is used).
    fn check_signatures(&self, s: u64, sig: Sig, what: &str) -> Result<()> {
        if !sig.checked() {
            return Ok(());
        }
        for q in (0..self.p).filter(|q| *q != self.me) {
            let theirs = self.ctl(q).post(s).sig();
            if !sig.accepts(&theirs) {
                return Err(Error::CallMismatch {
                    rank: Rank::new(self.me),
                    op: what.to_string(),
                    peer: Rank::new(q),
                    mine: sig,
                    theirs: Sig::from_words(theirs),
                });
            }
        }
        Ok(())
    }

    /// Reduces `srcs` (each `len` bytes) into every one of `dsts`, a block at a time, with
    /// streaming stores when `stream` is set.
    fn reduce(&mut self, ctx: &ReduceCtx, srcs: &[*const u8], dsts: &[*mut u8], len: usize, stream: bool) {
        let fin = ctx.needs_finalize();
        let block = DIRECT_BLOCK_BYTES;
        let mut off = 0;
        while off < len {
            let b = block.min(len - off);
            let tmp: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut self.block[..])[..b];
            {
                // SAFETY: every source holds `len` bytes (checked by the caller); the slices
                // live only within this block's reduction, before any destination is written
                // (rule 2), and `tmp` is private.
                let ss: SmallVec<[&[u8]; 8]> =
                    srcs.iter().map(|p| unsafe { std::slice::from_raw_parts(p.add(off), b) }).collect();
                reduce_many(ctx, tmp, &ss);
            }
            if fin {
                finalize(ctx, tmp);
            }
            for d in dsts {
                // SAFETY: every destination holds `len` bytes and this rank is the only writer
                // of this range in this call (rule 2); `tmp` does not overlap it.
                unsafe { memops::copy(d.add(off), tmp.as_ptr(), b, stream) };
            }
            off += b;
        }
    }

    /// Reduces the posted contributions `srcs` (each `len` bytes) straight into `dst`, which
    /// is user memory and so never overlaps a post.
    fn reduce_posted(ctx: &ReduceCtx, srcs: &[*const u8], dst: *mut u8, len: usize) {
        // Pushed one by one, as the posts are in `run_inline` (a `collect` may stay out of line).
        let mut ss = SmallVec::<[&[u8]; 8]>::new();
        for p in srcs {
            // SAFETY: every post holds `len` bytes (rule 1 of hostmem) and `dst` holds `len`
            // (checked by the caller); posts live in the control blocks, apart from user memory.
            ss.push(unsafe { std::slice::from_raw_parts(*p, len) });
        }
        // SAFETY: as above; this rank is the only writer of its own output.
        let out = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        reduce_many(ctx, out, &ss);
        finalize(ctx, out);
    }

    /// The inline mode: `max_contrib` is the call's largest contribution (where posts hold
    /// them, `Ctl::inline_for`).
    #[allow(clippy::too_many_arguments)]
    fn run_inline(
        &mut self,
        c: &Call,
        ctx: Option<&ReduceCtx>,
        s: u64,
        max_contrib: usize,
        dst: *mut u8,
        dst_len: usize,
    ) -> Result<()> {
        let (p, me) = (self.p, self.me);
        let es = c.dtype.size_bytes();
        let nb = c.count * es;
        // Pushed one by one: a `collect` goes through SmallVec's generic `extend`, which the
        // compiler may keep out of line (tens of instructions of the 8-byte call, callgrind).
        let mut inl = SmallVec::<[*const u8; 8]>::new();
        for q in 0..p {
            inl.push(self.ctl(q).inline_for(s, max_contrib) as *const u8);
        }
        let need = |n: usize| {
            if n > dst_len {
                Err(Error::Internal(format!("result of {n} bytes for a {dst_len}-byte buffer")))
            } else {
                Ok(())
            }
        };
        let copy = |from: *const u8, to: *mut u8, n: usize| {
            if !std::ptr::eq(from, to) && n > 0 {
                // SAFETY: posts hold the contributions (rule 1 of hostmem) and `to` holds `n`
                // bytes (checked by `need`); a post never overlaps a user buffer.
                unsafe { std::ptr::copy_nonoverlapping(from, to, n) };
            }
        };
        match c.kind {
            Collective::AllReduce => {
                need(nb)?;
                let ctx = ctx.ok_or_else(|| Error::Internal("reduction without context".into()))?;
                Self::reduce_posted(ctx, &inl, dst, nb);
            }
            Collective::Reduce => {
                if me == c.root {
                    need(nb)?;
                    let ctx = ctx.ok_or_else(|| Error::Internal("reduction without context".into()))?;
                    Self::reduce_posted(ctx, &inl, dst, nb);
                }
            }
            Collective::ReduceScatter => {
                need(nb)?;
                let ctx = ctx.ok_or_else(|| Error::Internal("reduction without context".into()))?;
                // SAFETY: each post holds P × nb bytes; block `me` is in range.
                let srcs: SmallVec<[*const u8; 8]> = inl.iter().map(|b| unsafe { b.add(me * nb) }).collect();
                Self::reduce_posted(ctx, &srcs, dst, nb);
            }
            Collective::Broadcast => {
                need(nb)?;
                copy(inl[c.root], dst, nb);
            }
            Collective::AllGather => {
                need(nb * p)?;
                for (q, b) in inl.iter().enumerate() {
                    // SAFETY: dst holds P × nb bytes (checked).
                    copy(*b, unsafe { dst.add(q * nb) }, nb);
                }
            }
            Collective::AllToAll => {
                need(nb * p)?;
                for (q, b) in inl.iter().enumerate() {
                    // SAFETY: posts hold P × nb bytes and dst P × nb (checked).
                    copy(unsafe { b.add(me * nb) }, unsafe { dst.add(q * nb) }, nb);
                }
            }
            Collective::Gather => {
                if me == c.root {
                    need(nb * p)?;
                    for (q, b) in inl.iter().enumerate() {
                        // SAFETY: as above.
                        copy(*b, unsafe { dst.add(q * nb) }, nb);
                    }
                }
            }
            Collective::Scatter => {
                need(nb)?;
                // SAFETY: the root's post holds P × nb bytes.
                copy(unsafe { inl[c.root].add(me * nb) }, dst, nb);
            }
            Collective::AllToAllV => return Err(Error::Internal("all-to-all-v is never inlined".into())),
            Collective::Send | Collective::Recv => {
                return Err(Error::Internal("a point-to-point call on the direct path".into()))
            }
        }
        Ok(())
    }

    /// All-to-all-v: (count, displacement) of the segment rank `q` sends this rank in call `s`,
    /// whose count must be `want` (`es`: bytes per element, for the error).
    fn segment_from(&self, q: usize, s: u64, want: usize, es: usize) -> Result<(usize, usize)> {
        let area = self.ctl(q).inline(s) as *const u64;
        let me = self.me;
        // SAFETY: rank q wrote 2 × P u64 into its inline area before posting (rule 1 of
        // hostmem); 2 × P u64 fit the area (P ≤ 4096, checked at setup).
        let (cnt, displ) =
            unsafe { (area.add(2 * me).read() as usize, area.add(2 * me + 1).read() as usize) };
        if cnt != want {
            return Err(Error::Mismatch {
                rank: Rank::new(me),
                op: "all_to_all_v".into(),
                peer: Rank::new(q),
                got: cnt * es,
                want: want * es,
            });
        }
        Ok((cnt, displ))
    }

    fn desc(&self, q: usize, s: u64, k: usize) -> Desc {
        let m = &self.ctl(q).post(s).meta.0;
        Desc {
            alloc: m.desc[k][0].load(Ordering::Relaxed),
            off: m.desc[k][1].load(Ordering::Relaxed),
            len: m.desc[k][2].load(Ordering::Relaxed),
        }
    }

    /// Rank `q`'s source (k = 0) or destination (k = 1), `need` bytes from `at`.
    fn at(
        &mut self,
        q: usize,
        s: u64,
        k: usize,
        own: (*mut u8, usize),
        at: usize,
        need: usize,
    ) -> Result<*mut u8> {
        if q == self.me {
            if at + need > own.1 {
                return Err(Error::Internal(format!(
                    "direct call touches {} bytes of a {}-byte buffer",
                    at + need,
                    own.1
                )));
            }
            // SAFETY: at + need ≤ the buffer's length (checked).
            return Ok(unsafe { own.0.add(at) });
        }
        let mut d = self.desc(q, s, k);
        if (at as u64) > d.len {
            return Err(Error::Mismatch {
                rank: Rank::new(self.me),
                op: "direct path".into(),
                peer: Rank::new(q),
                got: d.len as usize,
                want: at + need,
            });
        }
        d.off += at as u64;
        d.len -= at as u64;
        self.peer_range(q, d, need)
    }

    fn run_zero_copy(
        &mut self,
        c: &Call,
        op: &OpSpec,
        ctx: Option<&ReduceCtx>,
        s: u64,
        src: (*mut u8, usize),
        dst: (*mut u8, usize),
    ) -> Result<()> {
        let (p, me) = (self.p, self.me);
        let es = c.dtype.size_bytes();
        let n = c.count;
        let nb = n * es;
        // Outputs too large to stay in cache are written with streaming stores, unless they
        // are the inputs just read (in place), whose lines are in cache already.
        let stream = src.1.max(dst.1) >= DIRECT_STREAM_MIN_BYTES && src.0 != dst.0;
        let copy = |from: *mut u8, to: *mut u8, len: usize| {
            if from != to && len > 0 {
                // SAFETY: both ranges were resolved with their lengths checked; this rank is
                // the only writer of `to` in this call (rule 2) and nobody writes `from`.
                unsafe { memops::copy(to, from as *const u8, len, stream) };
            }
        };
        let need_ctx = || ctx.copied().ok_or_else(|| Error::Internal("reduction without context".into()));
        match c.kind {
            Collective::AllReduce => {
                let r = slice(n, p, me, es);
                let (off, len) = (r.start * es, r.len() * es);
                let mut srcs = SmallVec::<[*const u8; 8]>::new();
                let mut dsts = SmallVec::<[*mut u8; 8]>::new();
                for q in 0..p {
                    srcs.push(self.at(q, s, 0, src, off, len)? as *const u8);
                    dsts.push(self.at(q, s, 1, dst, off, len)?);
                }
                self.reduce(&need_ctx()?, &srcs, &dsts, len, stream);
            }
            Collective::Reduce => {
                let r = slice(n, p, me, es);
                let (off, len) = (r.start * es, r.len() * es);
                let mut srcs = SmallVec::<[*const u8; 8]>::new();
                for q in 0..p {
                    srcs.push(self.at(q, s, 0, src, off, len)? as *const u8);
                }
                let d = self.at(c.root, s, 1, dst, off, len)?;
                self.reduce(&need_ctx()?, &srcs, &[d], len, stream);
            }
            Collective::ReduceScatter => {
                let mut srcs = SmallVec::<[*const u8; 8]>::new();
                for q in 0..p {
                    srcs.push(self.at(q, s, 0, src, me * nb, nb)? as *const u8);
                }
                let d = self.at(me, s, 1, dst, 0, nb)?;
                self.reduce(&need_ctx()?, &srcs, &[d], nb, stream);
            }
            Collective::Broadcast => {
                let from = self.at(c.root, s, 0, src, 0, nb)?;
                let to = self.at(me, s, 1, dst, 0, nb)?;
                copy(from, to, nb);
            }
            Collective::AllGather => {
                for i in 0..p {
                    let q = (me + i) % p;
                    let from = self.at(q, s, 0, src, 0, nb)?;
                    let to = self.at(me, s, 1, dst, q * nb, nb)?;
                    copy(from, to, nb);
                }
            }
            Collective::AllToAll => {
                for i in 0..p {
                    let q = (me + i) % p;
                    let from = self.at(q, s, 0, src, me * nb, nb)?;
                    let to = self.at(me, s, 1, dst, q * nb, nb)?;
                    copy(from, to, nb);
                }
            }
            Collective::Gather => {
                let from = self.at(me, s, 0, src, 0, nb)?;
                let to = self.at(c.root, s, 1, dst, me * nb, nb)?;
                copy(from, to, nb);
            }
            Collective::Scatter => {
                let from = self.at(c.root, s, 0, src, me * nb, nb)?;
                let to = self.at(me, s, 1, dst, 0, nb)?;
                copy(from, to, nb);
            }
            Collective::AllToAllV => {
                let OpSpec::AllToAllV { recv_counts, recv_displs, .. } = op else {
                    return Err(Error::Internal("all-to-all-v without its arrays".into()));
                };
                for i in 0..p {
                    let q = (me + i) % p;
                    let (cnt, displ) = self.segment_from(q, s, recv_counts[q], es)?;
                    let from = self.at(q, s, 0, src, displ.saturating_mul(es), cnt * es)?;
                    let to = self.at(me, s, 1, dst, recv_displs[q] * es, cnt * es)?;
                    copy(from, to, cnt * es);
                }
            }
            Collective::Send | Collective::Recv => {
                return Err(Error::Internal("a point-to-point call on the direct path".into()))
            }
        }
        Ok(())
    }
}
