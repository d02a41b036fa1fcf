//! The IPC engine's calls on a stream being captured into a CUDA graph (and the event
//! engine's, its twin over addresses): no interprocess event, no host exchange on the
//! replayed path. At capture, the ranks exchange their buffers once (as an eager call does)
//! and each captures kernels that meet on the GPU through *boards*: the thread group's meeting
//! memory (`cuda::group`'s layout: counters, failure word, a record per rank) in device
//! memory. Every count the kernels take is relative to the rank's record, which the kernels
//! advance (kernels/sync.cu's `base`), so each replay meets afresh.
//!
//! Rules:
//! 1. Every rank makes its own board at its first captured group. Its record, its count of
//!    receiving blocks and the counters of its sends (pair rank → q: published, and done,
//!    which the receiver raises there) live on it. Each send's record carries the sender's
//!    board, so a receiver finds its pair's counters there (`Sync::rready`, `rdone`): sends
//!    and receives need no collective before them.
//! 2. Collectives meet on rank 0's board (arrival, departure, failure word), handed to every
//!    rank in the collective's exchange. Only captured launches use boards, so their counts
//!    are alike on every rank as long as every rank replays its graphs alike (NCCL's rule).
//! 3. Fences and acquire loads are at system scope (`Sync::sys`): ranks may be on several
//!    devices, the boards on theirs. Processes sharing a GPU time-slice, so a kernel waiting
//!    for another process's kernel waits for the GPU's next time slice.
//! 4. A kernel that gives up (the timeout) records why on the board and in this rank's
//!    host-mapped record; this rank's next captured call refuses, naming it.
//! 5. Sends and receives never ride in a collective launch here (merging needs every rank's
//!    receive counts, which a group of sends and receives does not exchange).
//! 6. A group of one small all-reduce runs as LL or LL128 (as the thread group decides, from
//!    the same settings on every rank) over line buffers on rank 0's board, after its
//!    counters: LL `p × 2 × p × (LL_LINES + 1)` lines of 16 bytes, then LL128
//!    `p × 2 × p × (LL128_LINES + 1)` lines of 128 bytes (kernels/ll.cu's layouts).
//! 7. A buffer that cannot be exported (virtual-memory allocations) is refused: the staged
//!    path an eager call would take cannot be captured.

use super::*;
use crate::cuda::group::{
    describe_failure, ll128_allowed, ll_allowed, BAR_BYTES, BASE_AT, BASE_BYTES, BLOCK_PASS_BYTES,
    LL128_LINES, LL128_MAX_BYTES, LL_LINES, LL_MAX_BYTES,
};
use crate::cuda::kernels::{LineProto, Ll};
use crate::cuda::DevBuf;
use oxccl_core::plan::device::launch::{self, Counters, Shape};
use oxccl_core::plan::device::MAX_RANKS;

/// The GPU meeting of captured calls (rules 1 and 2).
pub(super) struct Board {
    /// This rank's board, kept for the engine's life.
    own: DevBuf,
    /// Rank 0's board as this rank addresses it, once a collective handed it out.
    coll: Option<u64>,
    /// This rank's counts of its captured launches (only to plan relative meetings).
    counters: Counters,
    /// This rank's host-mapped failure record: (host address, device address).
    host: (usize, u64),
}

/// Bytes of a captured collective group's record after the collectives': rank 0's board.
const BOARD_REC: usize = HANDLE + 8;

/// Where a captured send's record carries the sender's board (after the eager record's
/// buffer; its event handle is not used).
const SEND_BOARD: usize = SEND_REC - HANDLE;

/// Bytes of a captured send's record.
const CAPTURED_SEND_REC: usize = SEND_BOARD + HANDLE + 8;

impl Engine {
    /// A board with line buffers for `p` ranks (0: none), zeroed and waited for.
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

    /// This rank's board, made at its first captured group (rule 1; rank 0's with the line
    /// buffers of rule 6), and its address.
    fn own_board(&mut self, rank: usize, p: usize) -> Result<u64, CudaError> {
        if self.board.is_none() {
            let own = self.make_board(if rank == 0 { p } else { 0 })?;
            let host = crate::cuda::stage::stream_flag()?;
            // SAFETY: the flag is 64 bytes of pinned memory, leaked, nothing uses it yet.
            unsafe { std::ptr::write_bytes(host.0 as *mut u8, 0, 16) };
            self.board = Some(Board { own, coll: None, counters: Counters::default(), host });
        }
        Ok(self.board.as_ref().map_or(0, |b| b.own.ptr))
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
        // record, with this rank's board, to its receiver.
        let own_at = self.own_board(rank, p)?;
        let own_ex = self.export_buf(own_at)?;
        let mut mine = vec![0u8; COLL_REC * colls.len() + BOARD_REC];
        self.put_coll_records(&colls, &mut mine);
        let o = COLL_REC * colls.len();
        if rank == 0 {
            put_exported(&mut mine[o..], &own_ex);
        }
        let send_recs: Vec<Vec<u8>> = sends
            .iter()
            .map(|c| {
                let mut b = self.send_record(c);
                b.resize(CAPTURED_SEND_REC, 0);
                put_exported(&mut b[SEND_BOARD..], &own_ex);
                b
            })
            .collect();
        let mut all = vec![0u8; mine.len() * p];
        let mut got_recs = vec![vec![0u8; CAPTURED_SEND_REC]; recvs.len()];
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
            if self.board.as_ref().is_some_and(|b| b.coll.is_none()) {
                let at =
                    if rank == 0 { own_at } else { self.open_buf(&get_exported(&all[o..o + BOARD_REC]))? };
                if at == 0 {
                    return Err(CudaError::Invalid(format!(
                        "rank {rank}: rank 0 sent no device meeting board"
                    ))
                    .into());
                }
                if let Some(b) = self.board.as_mut() {
                    b.coll = Some(at);
                }
            }
            for (i, c) in colls.iter().enumerate() {
                coll_tasks.push(self.coll_tasks(rank, &table, i, c)?);
            }
        }
        // Receives copy from the senders' buffers; sends to itself pair with receives from
        // itself, in order, on local addresses. Per peer, its board holds the pair's counters.
        let mut own_sends = sends.iter().filter(|c| c.what == What::Send(rank)).map(|c| c.send);
        let (mut sent, mut received) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS]);
        for c in &sends {
            if let What::Send(q) = c.what {
                sent[q] += 1;
            }
        }
        let (mut rready, mut rdone) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS]);
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
            let at = if q == rank { own_at } else { self.open_buf(&get_exported(&rec[SEND_BOARD..]))? };
            if at == 0 {
                return Err(CudaError::Invalid(format!(
                    "rank {rank}: {}: rank {q}'s send came without its device meeting board",
                    c.describe()
                ))
                .into());
            }
            (rready[q], rdone[q]) = (at + 512, at + 1024);
            if c.bytes() > 0 {
                let src = match mine {
                    Some(a) => a,
                    None => self.open_buf(&get_exported(&rec[16..]))?,
                };
                tasks.push(Task::copy(src, vec![c.recv], c.bytes()));
            }
        }
        let timeout_ns = crate::cuda::group::timeout_ns(comm.config().timeout);
        let board = self.board.as_mut().expect("made above");
        let base = own_at + (BASE_AT + BASE_BYTES * rank) as u64;
        if let ([c], true) = (colls.as_slice(), sends.is_empty() && recvs.is_empty()) {
            if let (Some(proto), Some(at)) = (line_proto(c, p), board.coll) {
                launch::next_ll_seq(&mut board.counters);
                let (ll_at, ll128_at, _) = board_layout(p);
                let (buf, lines) = match proto {
                    LineProto::Ll => (at + ll_at as u64, LL_LINES),
                    LineProto::Ll128 => (at + ll128_at as u64, LL128_LINES),
                };
                let sig_buf = at + ll_at as u64;
                let l = Ll { buf, seq: 1, lines: lines as u32, sig_buf, sig_lines: LL_LINES as u32 };
                let (rank, p) = (rank as i32, p as i32);
                let sync =
                    Sync { fail: at + 192, host: board.host.1, base, timeout_ns, rank, p, ..Sync::default() };
                let div = if c.op == Kop::Op(ReduceOp::Avg) { p as u32 } else { 0 };
                let io = (c.send, c.recv, c.count);
                self.kernels.run_ll(&sref, proto, c.t, c.op, io, c.scalar, div, l, &sync)?;
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
        let shape = Shape { caps: &caps, pass_bytes: BLOCK_PASS_BYTES };
        let counts = (&sent, &received);
        let plans =
            launch::plan_launches(&mut board.counters, p, &units, &p2p, counts, shape, |_| false, false);
        // Collectives meet on rank 0's board; all of this rank's own is on its own (rules 1, 2).
        let (own, at) = (own_at, board.coll.unwrap_or(own_at));
        for (u, pl) in units.iter().chain(&p2p).zip(plans) {
            let (t, op) = u.kernel();
            let m = pl.rel;
            let sync = Sync {
                arr: if pl.meets() { at } else { 0 },
                dep: at + 128,
                fail: at + 192,
                host: board.host.1,
                mydep: own + 256,
                pready: own + 512,
                pdone: own + 1024,
                rready,
                rdone,
                base,
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
