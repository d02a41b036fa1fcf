//! The IPC engine's calls on a stream being captured into a CUDA graph (and the event
//! engine's, its twin over addresses): no interprocess event, no host exchange on the
//! replayed path. At capture, the ranks exchange their buffers once (as an eager call does)
//! and each captures kernels that meet on the GPU through a *board*: the thread group's
//! meeting memory (`cuda::group`'s layout: counters, failure word, a record per rank), here
//! in rank 0's device memory, mapped by every rank. Every count the kernels take is relative
//! to the rank's record, which the kernels advance (kernels.cu's `base`), so each replay
//! meets afresh.
//!
//! Rules:
//! 1. The board is made by rank 0 at the first captured group holding a collective and
//!    handed to every rank in that group's exchange; a captured group of sends and receives
//!    alone, before any, is refused (it names the fix).
//! 2. Only captured launches use the board, so its counters count captured launches alone,
//!    alike on every rank as long as every rank replays its graphs alike (NCCL's rule too).
//! 3. Fences and acquire loads are at system scope (`Sync::sys`): ranks may be on several
//!    devices, the board on one of them. Processes sharing a GPU time-slice, so a kernel
//!    waiting for another process's kernel waits for the GPU's next time slice.
//! 4. A kernel that gives up (the timeout) records why on the board and in this rank's
//!    host-mapped record; this rank's next captured call refuses, naming it.
//! 5. Sends and receives never ride in a collective launch here (merging needs every rank's
//!    receive counts, which a group of sends and receives does not exchange).
//! 6. A group of one small all-reduce runs as LL or LL128 (as the thread group decides, from
//!    the same settings on every rank) over the board's line buffers, which follow its
//!    counters: LL `p × 2 × p × (LL_LINES + 1)` lines of 16 bytes, then LL128
//!    `p × 2 × p × (LL128_LINES + 1)` lines of 128 bytes (kernels.cu's layouts).

use super::*;
use crate::cuda::group::{
    describe_failure, ll128_allowed, ll_allowed, BAR_BYTES, BASE_AT, BASE_BYTES, BLOCK_PASS_BYTES,
    LL128_LINES, LL128_MAX_BYTES, LL_LINES, LL_MAX_BYTES,
};
use crate::cuda::kernels::{LineProto, Ll};
use crate::cuda::DevBuf;
use oxccl_core::plan::device::launch::{self, Counters, Shape};
use oxccl_core::plan::device::MAX_RANKS;

/// The GPU meeting of captured calls (rule 1).
pub(super) struct Board {
    /// This rank's address of rank 0's board.
    ptr: u64,
    /// Rank 0's allocation (rank 0 only), kept for the engine's life.
    _own: Option<DevBuf>,
    /// This rank's counts of its captured launches (only to plan relative meetings).
    counters: Counters,
    /// This rank's host-mapped failure record: (host address, device address).
    host: (usize, u64),
}

/// Bytes of a captured collective group's record: the collectives', then rank 0's board.
const BOARD_REC: usize = HANDLE + 8;

impl Engine {
    /// Rank 0's board for `p` ranks, made once (zeroed, waited for).
    fn make_board(&self, p: usize) -> Result<DevBuf, CudaError> {
        let (_, _, bytes) = board_layout(p);
        let buf = DevBuf::new(&self.dev, bytes)?;
        let zero = Stream::new(&self.dev)?;
        zero.fill(buf.ptr, 0, bytes)?;
        zero.sync()?;
        Ok(buf)
    }

    /// This rank's failure, if one of its captured kernels gave up (rule 4).
    fn board_failure(&self) -> Option<String> {
        let b = self.board.as_ref()?;
        let h = b.host.0 as *const u32;
        // SAFETY: four u32s of host-mapped memory owned (leaked) by this engine; the GPU
        // writes the call number before the code, each followed by a system-wide fence.
        let code = unsafe { h.read_volatile() };
        if code == 0 {
            return None;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: as above.
        let seq = unsafe { (h.add(2).read_volatile() as u64) | ((h.add(3).read_volatile() as u64) << 32) };
        Some(describe_failure(code, seq, None))
    }

    /// Captures `calls` (one rank's group) on `stream`, which is being captured (see the
    /// module's rules).
    pub fn run_captured(
        &mut self,
        comm: &Communicator,
        stream: usize,
        calls: &[DevCall],
    ) -> Result<(), DevError> {
        let p = comm.size();
        let rank = comm.rank().idx();
        self.dev.make_current()?;
        if let Some(why) = self.board_failure() {
            return Err(
                CudaError::Invalid(format!("rank {rank}: a captured call failed on the GPU: {why}")).into()
            );
        }
        let sref = Stream::borrowed(&self.dev, stream as driver::Handle);
        let colls: Vec<DevCall> = calls.iter().filter(|c| c.collective().is_some()).copied().collect();
        let sends: Vec<DevCall> = calls.iter().filter(|c| matches!(c.what, What::Send(_))).copied().collect();
        let recvs: Vec<DevCall> = calls.iter().filter(|c| matches!(c.what, What::Recv(_))).copied().collect();
        // The exchange: collectives' records and rank 0's board (all-gather); each send's
        // record to its receiver.
        let mut own = None;
        if rank == 0 && self.board.is_none() && !colls.is_empty() {
            own = Some(self.make_board(p)?);
        }
        let mut mine = vec![0u8; COLL_REC * colls.len() + BOARD_REC];
        self.put_coll_records(&colls, &mut mine);
        let o = COLL_REC * colls.len();
        if rank == 0 {
            let at = own.as_ref().map(|b| b.ptr).or(self.board.as_ref().map(|b| b.ptr)).unwrap_or(0);
            put_exported(&mut mine[o..], &self.export_buf(at)?);
        }
        let send_recs: Vec<Vec<u8>> = sends.iter().map(|c| self.send_record(c)).collect();
        let mut all = vec![0u8; mine.len() * p];
        let mut got_recs = vec![vec![0u8; SEND_REC]; recvs.len()];
        {
            let mut g = comm.group();
            let (colls_any, sr) = (!colls.is_empty(), &send_recs);
            super::records::trade_records(
                &mut g,
                (&mine, &mut all, colls_any),
                &sends,
                sr,
                &recvs,
                &mut got_recs,
            )?;
            g.end().map_err(comm_err)?;
        }
        let mut coll_tasks = Vec::new();
        if !colls.is_empty() {
            let table = super::records::coll_table(rank, &colls, &all, mine.len())?;
            for (q, recs) in table.iter().enumerate() {
                if let Some(r) = recs.iter().find(|r| !r.ok) {
                    return Err(CudaError::Invalid(format!(
                        "rank {rank}: {} on a stream being captured into a CUDA graph: rank {q} could not export its buffer for CUDA IPC (virtual-memory allocations cannot be), and the staged path a graph cannot replay",
                        r.call.describe()
                    ))
                    .into());
                }
            }
            if self.board.is_none() {
                let e = get_exported(&all[o..o + BOARD_REC]);
                let ptr = match own.as_ref() {
                    Some(b) => b.ptr,
                    None => self.open_buf(&e)?,
                };
                if ptr == 0 {
                    return Err(CudaError::Invalid(format!(
                        "rank {rank}: rank 0 sent no device meeting board"
                    ))
                    .into());
                }
                let host = crate::cuda::stage::stream_flag()?;
                // SAFETY: the flag is 64 bytes of pinned memory, leaked, nothing uses it yet.
                unsafe { std::ptr::write_bytes(host.0 as *mut u8, 0, 16) };
                self.board = Some(Board { ptr, _own: own.take(), counters: Counters::default(), host });
            }
            for (i, c) in colls.iter().enumerate() {
                coll_tasks.push(self.coll_tasks(rank, &table, i, c)?);
            }
        }
        if self.board.is_none() {
            return Err(CudaError::Invalid(format!(
                "rank {rank}: sends and receives on a stream being captured into a CUDA graph before any captured collective: the ranks' kernels meet on memory the first captured collective shares (make one collective call in a capture first)"
            ))
            .into());
        }
        // Receives copy from the senders' buffers; sends to itself pair with receives from
        // itself, in order, on local addresses.
        let mut own_sends = sends.iter().filter(|c| c.what == What::Send(rank)).map(|c| c.send);
        let (mut sent, mut received) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS]);
        for c in &sends {
            if let What::Send(q) = c.what {
                sent[q] += 1;
            }
        }
        let mut tasks = Vec::new();
        for (c, rec) in recvs.iter().zip(&got_recs) {
            let What::Recv(q) = c.what else { continue };
            received[q] += 1;
            let mine = if q == rank { own_sends.next() } else { None };
            super::records::check_recv(
                rank,
                q,
                c,
                rec,
                "and a call captured into a CUDA graph cannot be staged",
            )?;
            if c.bytes() > 0 {
                let src = match mine {
                    Some(a) => a,
                    None => self.open_buf(&get_exported(&rec[16..]))?,
                };
                tasks.push(Task::copy(src, vec![c.recv], c.bytes()));
            }
        }
        let timeout_ns = comm.config().timeout.map_or(0, |t| t.as_nanos().clamp(1, u64::MAX as u128) as u64);
        if let ([c], true) = (colls.as_slice(), sends.is_empty() && recvs.is_empty()) {
            if let Some(proto) = line_proto(c, p) {
                let board = self.board.as_mut().expect("made above");
                launch::next_ll_seq(&mut board.counters);
                let (ll_at, ll128_at, _) = board_layout(p);
                let at = board.ptr;
                let (buf, lines) = match proto {
                    LineProto::Ll => (at + ll_at as u64, LL_LINES),
                    LineProto::Ll128 => (at + ll128_at as u64, LL128_LINES),
                };
                let l = Ll {
                    buf,
                    seq: 1,
                    lines: lines as u32,
                    sig_buf: at + ll_at as u64,
                    sig_lines: LL_LINES as u32,
                };
                let sync = Sync {
                    fail: at + 192,
                    host: board.host.1,
                    base: at + (BASE_AT + BASE_BYTES * rank) as u64,
                    timeout_ns,
                    rank: rank as i32,
                    p: p as i32,
                    ..Sync::default()
                };
                let div = if c.op == Kop::Op(ReduceOp::Avg) { p as u32 } else { 0 };
                self.kernels.run_ll(
                    &sref,
                    proto,
                    c.t,
                    c.op,
                    (c.send, c.recv, c.count),
                    c.scalar,
                    div,
                    l,
                    &sync,
                )?;
                return Ok(());
            }
        }
        let any_p2p = sent.iter().chain(&received).any(|&n| n > 0);
        let units = call::collective_units(&coll_tasks, p);
        let p2p = call::p2p_units(tasks, any_p2p);
        let sms = self.dev.sms.max(1) as u32;
        let mut caps = Vec::with_capacity(units.len() + p2p.len());
        for u in units.iter().chain(&p2p) {
            let (t, op) = u.kernel();
            caps.push((self.kernels.max_blocks_per_sm(t, op)?.max(1) * sms / p as u32).max(1));
        }
        let board = self.board.as_mut().expect("made above");
        let shape = Shape { caps: &caps, pass_bytes: BLOCK_PASS_BYTES };
        let plans = launch::plan_launches(
            &mut board.counters,
            p,
            &units,
            &p2p,
            (&sent, &received),
            shape,
            |_| false,
            false,
        );
        let at = board.ptr;
        for (u, pl) in units.iter().chain(&p2p).zip(plans) {
            let (t, op) = u.kernel();
            let m = pl.rel;
            let met = pl.meets();
            let sync = Sync {
                arr: if met { at } else { 0 },
                dep: at + 128,
                fail: at + 192,
                host: board.host.1,
                mydep: at + 256,
                pready: at + 512,
                pdone: at + 1024,
                base: at + (BASE_AT + BASE_BYTES * rank) as u64,
                seq: m.seq,
                depart: m.depart,
                mydepart: m.mydepart,
                timeout_ns,
                send_to: m.send_to,
                recv_from: m.recv_from,
                recv_done: m.recv_done,
                send_done: m.send_done,
                rank: rank as i32,
                p: p as i32,
                sys: 1,
                pad: 0,
            };
            let div = if op == Kop::Op(ReduceOp::Avg) { p as u32 } else { 0 };
            self.kernels.run(&sref, t, op, &u.tasks, u.scalar, div, pl.blocks, &sync)?;
        }
        Ok(())
    }
}

/// The board's layout for `p` ranks: where its LL and LL128 lines start, and its bytes
/// (rule 6).
fn board_layout(p: usize) -> (usize, usize, usize) {
    let ll = p * 2 * p * (LL_LINES + 1) * 16;
    let ll128 = p * 2 * p * (LL128_LINES + 1) * 128;
    (BAR_BYTES, BAR_BYTES + ll, BAR_BYTES + ll + ll128)
}

/// The line protocol a captured all-reduce alone in its group runs with, if any (rule 6: the
/// thread group's thresholds and settings).
fn line_proto(c: &DevCall, p: usize) -> Option<LineProto> {
    if c.what != What::Coll(device::DeviceColl::AllReduce)
        || c.count == 0
        || call::unsupported(c, p).is_some()
    {
        return None;
    }
    match c.bytes() {
        b if b <= LL_MAX_BYTES && ll_allowed() => Some(LineProto::Ll),
        b if b <= LL128_MAX_BYTES && ll128_allowed() => Some(LineProto::Ll128),
        _ => None,
    }
}
