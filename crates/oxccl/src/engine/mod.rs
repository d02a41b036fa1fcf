//! The engine: runs a job's lanes over connections, on the calling thread.
//!
//! One engine per communicator, used by one thread at a time (the communicator serializes
//! calls). A job's lanes progress round-robin: each lane runs its next step when the step's
//! inbound chunk is there and its outbound slot is free. When nothing can move, the engine
//! spins briefly, then yields, then sleeps in `poll` on its doorbell and its TCP sockets, after
//! announcing on every shared-memory connection it waits for that it is asleep (see
//! [`crate::transport::shm`] for the no-lost-wake-up rule). It re-checks the abort flag and the
//! deadline at least every `MAX_SLEEP_MS`.
//!
//! Memory rules:
//! 1. A job's buffers ([`RawBuf`]) stay valid and unaliased by the caller for the whole job;
//!    the API layer guarantees it (borrows held across the call, or a scope that outlives it).
//! 2. Every location a step touches is bounds-checked against its buffer before a slice is
//!    made; a destination must be writable; a source and destination in one buffer either
//!    coincide (in-place) or are disjoint.
//! 3. A received chunk is read only between `ready` and `release`; a send slot is written only
//!    between `ready` and `commit`.

pub(crate) mod direct;
pub(crate) mod memops;

use crate::bootstrap::{Incoming, Mailbox, PeerInfo, Waiter};
use crate::error::{Error, Result};
use crate::log::Logger;
use crate::sys::fd::{self, EventFd};
use crate::transport::shm::{ShmRecv, ShmSend};
use crate::transport::tcp::{TcpRecv, TcpSend};
use crate::transport::{RecvConn, SendConn};
use oxccl_core::plan::exec::{apply, StepData};
use oxccl_core::plan::{
    job_connections, plan_group, BufId, ConnKey, Geometry, Input, Job, Lane, Loc, OpSpec, Step,
};
use oxccl_core::tuning::{SPIN_NS, YIELD_NS};
use oxccl_core::Rank;
use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One buffer of a job: where it is, how long, and whether the job may write it.
#[derive(Clone, Copy, Debug)]
pub struct RawBuf {
    pub ptr: *mut u8,
    pub len: usize,
    pub writable: bool,
}

// SAFETY: a RawBuf is an address and a length; whoever builds one guarantees (rule 1) that the
// memory stays valid and unaliased while a job that uses it runs, on whichever thread.
unsafe impl Send for RawBuf {}

impl RawBuf {
    /// A read-only buffer over `s`.
    pub fn of(s: &[u8]) -> RawBuf {
        RawBuf { ptr: s.as_ptr() as *mut u8, len: s.len(), writable: false }
    }

    /// A writable buffer over `s`.
    pub fn of_mut(s: &mut [u8]) -> RawBuf {
        RawBuf { ptr: s.as_mut_ptr(), len: s.len(), writable: true }
    }
}

/// What the engine knows of its communicator.
pub(crate) struct EngineCtx {
    pub me: Rank,
    pub secret: [u8; 32],
    pub host_id: u64,
    pub peers: Arc<Vec<PeerInfo>>,
    pub mailbox: Arc<Mailbox>,
    pub doorbell: Arc<EventFd>,
    pub abort: Arc<AtomicBool>,
    pub timeout: Option<Duration>,
    pub slots: usize,
    pub slot_bytes: usize,
    pub shm_disable: bool,
    pub log: Logger,
}

/// A communicator's connections and the machinery that runs jobs over them.
pub(crate) struct Engine {
    pub ctx: EngineCtx,
    /// The direct path, when every rank shares this host.
    pub direct: Option<direct::Direct>,
    sends: HashMap<ConnKey, SendConn>,
    recvs: HashMap<ConnKey, RecvConn>,
    /// Clones of every TCP socket, so an abort from another thread can shut them down.
    pub sockets: Arc<Mutex<Vec<TcpStream>>>,
    /// Scratch memory for plans that need it (one-shot all-reduce), kept between jobs.
    scratch: Vec<u64>,
}

struct LaneRt {
    lane: Lane,
    inb: Vec<usize>,
    out: Vec<usize>,
    pending: Option<Step>,
}

/// The buffer and range a location names; `bufs` ends with the job's scratch buffer, which
/// [`BufId::SCRATCH`] addresses.
fn span(bufs: &[RawBuf], loc: Loc, len: usize) -> Result<RawBuf> {
    let i = if loc.buf == BufId::SCRATCH { bufs.len().wrapping_sub(1) } else { loc.buf.0 as usize };
    let b = bufs
        .get(i)
        .ok_or_else(|| Error::Internal(format!("step names buffer {} of {}", loc.buf.0, bufs.len())))?;
    let end = loc.off.checked_add(len).filter(|e| *e <= b.len).ok_or_else(|| {
        Error::Internal(format!(
            "step touches bytes {}..{} of a {}-byte buffer",
            loc.off,
            loc.off + len,
            b.len
        ))
    })?;
    let _ = end;
    Ok(RawBuf {
        // SAFETY: loc.off + len ≤ b.len, so the offset stays inside the buffer's allocation.
        ptr: unsafe { b.ptr.add(loc.off) },
        len,
        writable: b.writable,
    })
}

impl Engine {
    pub fn new(ctx: EngineCtx) -> Engine {
        Engine {
            ctx,
            direct: None,
            sends: HashMap::new(),
            recvs: HashMap::new(),
            sockets: Arc::new(Mutex::new(Vec::new())),
            scratch: Vec::new(),
        }
    }

    fn uses_shm(&self, peer: &PeerInfo) -> bool {
        !self.ctx.shm_disable && peer.host_id == self.ctx.host_id
    }

    fn remember(&self, s: Option<TcpStream>) {
        if let Some(s) = s {
            self.sockets.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        }
    }

    /// Establishes every connection in `needed` that does not exist yet: outbound ones first
    /// (they never wait for the peer's engine), then inbound ones.
    pub fn connect(&mut self, needed: &[(ConnKey, bool)], w: &Waiter) -> Result<()> {
        let outs: Vec<ConnKey> =
            needed.iter().filter(|(k, out)| *out && !self.sends.contains_key(k)).map(|(k, _)| *k).collect();
        let ins: Vec<ConnKey> =
            needed.iter().filter(|(k, out)| !*out && !self.recvs.contains_key(k)).map(|(k, _)| *k).collect();
        for key in &outs {
            let c = &self.ctx;
            let peer = &c.peers[key.peer.idx()];
            let conn = if self.uses_shm(peer) {
                SendConn::Shm(ShmSend::connect(
                    c.me,
                    &c.secret,
                    peer,
                    key.class,
                    c.slots,
                    c.slot_bytes,
                    &c.doorbell,
                )?)
            } else {
                SendConn::Tcp(TcpSend::connect(c.me, &c.secret, peer, key.class, c.slots, c.slot_bytes, w)?)
            };
            c.log.info(format_args!(
                "connected to rank {} ({:?}) over {}",
                key.peer,
                key.class,
                if matches!(conn, SendConn::Shm(_)) { "SHM" } else { "TCP" }
            ));
            self.remember(conn.shutdown_handle());
            self.sends.insert(*key, conn);
        }
        for key in &ins {
            let c = &self.ctx;
            let peer = &c.peers[key.peer.idx()];
            let conn = match c.mailbox.wait_conn(key.peer, key.class, w)? {
                Incoming::Tcp(s) => RecvConn::Tcp(TcpRecv::accept(c.me, peer, s, c.slots, c.slot_bytes)?),
                Incoming::Shm(o) => RecvConn::Shm(ShmRecv::accept(c.me, key.peer, o, c.slots, c.slot_bytes)?),
            };
            self.remember(conn.shutdown_handle());
            self.recvs.insert(*key, conn);
        }
        Ok(())
    }

    /// Runs a group: a single collective on the direct path when this communicator has one
    /// (and the call does not fall back), otherwise planned onto the ring engine.
    pub fn run_ops(&mut self, g: &Geometry, ops: &[OpSpec], bufs: &[RawBuf], what: &str) -> Result<()> {
        if let (Some(d), [op]) = (self.direct.as_mut(), ops) {
            let w = Waiter::new(self.ctx.me, self.ctx.timeout, self.ctx.abort.clone());
            if d.run(op, bufs, &w)? == direct::Outcome::Done {
                return Ok(());
            }
        }
        let job = plan_group(g, ops)?;
        self.run(job, bufs, what)
    }

    /// Runs `job` over `bufs`; `what` names the operation in errors.
    pub fn run(&mut self, job: Job, bufs: &[RawBuf], what: &str) -> Result<()> {
        let w = Waiter::new(self.ctx.me, self.ctx.timeout, self.ctx.abort.clone());
        let needed = job_connections(&job);
        self.connect(&needed, &w)?;
        let mut sv: Vec<(ConnKey, SendConn)> = Vec::new();
        let mut rv: Vec<(ConnKey, RecvConn)> = Vec::new();
        for (k, out) in &needed {
            if *out {
                if let Some(c) = self.sends.remove(k) {
                    sv.push((*k, c));
                }
            } else if let Some(c) = self.recvs.remove(k) {
                rv.push((*k, c));
            }
        }
        // The user's buffers, then the scratch buffer (BufId::SCRATCH).
        let words = job.scratch_bytes.div_ceil(8);
        if self.scratch.len() < words {
            self.scratch.resize(words, 0);
        }
        let mut all: smallvec::SmallVec<[RawBuf; 4]> = bufs.iter().copied().collect();
        all.push(RawBuf { ptr: self.scratch.as_mut_ptr().cast(), len: job.scratch_bytes, writable: true });
        let res = self.exec(job, &mut sv, &mut rv, &all, &w, what);
        self.sends.extend(sv);
        self.recvs.extend(rv);
        res
    }

    fn exec(
        &self,
        job: Job,
        sv: &mut [(ConnKey, SendConn)],
        rv: &mut [(ConnKey, RecvConn)],
        bufs: &[RawBuf],
        w: &Waiter,
        what: &str,
    ) -> Result<()> {
        let sidx: HashMap<ConnKey, usize> = sv.iter().enumerate().map(|(i, (k, _))| (*k, i)).collect();
        let ridx: HashMap<ConnKey, usize> = rv.iter().enumerate().map(|(i, (k, _))| (*k, i)).collect();
        let mk = |mut lane: Lane| -> Result<LaneRt> {
            let inb = lane.inbound.iter().map(|k| ridx.get(k).copied()).collect::<Option<Vec<_>>>();
            let out = lane.outbound.iter().map(|k| sidx.get(k).copied()).collect::<Option<Vec<_>>>();
            let (Some(inb), Some(out)) = (inb, out) else {
                return Err(Error::Internal("lane names a connection that was not set up".into()));
            };
            let pending = lane.steps.next();
            Ok(LaneRt { lane, inb, out, pending })
        };
        let mut p2p: Vec<LaneRt> = job.p2p.into_iter().map(mk).collect::<Result<_>>()?;
        let mut phases: VecDeque<Vec<LaneRt>> = job
            .phases
            .into_iter()
            .map(|ph| ph.into_iter().map(mk).collect::<Result<Vec<_>>>())
            .collect::<Result<_>>()?;
        let mut idle_since: Option<Instant> = None;
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        loop {
            let mut progressed = false;
            for (_, s) in sv.iter_mut() {
                progressed |= s.pump()?;
            }
            for (_, r) in rv.iter_mut() {
                progressed |= r.pump()?;
            }
            loop {
                while phases.front().is_some_and(|p| p.iter().all(|l| l.pending.is_none())) {
                    phases.pop_front();
                }
                let mut moved = false;
                let phase = phases.front_mut().map(|p| p.as_mut_slice()).unwrap_or(&mut []);
                for l in p2p.iter_mut().chain(phase.iter_mut()) {
                    while self.try_step(l, sv, rv, bufs, what)? {
                        moved = true;
                    }
                }
                progressed |= moved;
                // A phase that just finished lets the next one start at once.
                let phase_done = phases.front().is_some_and(|p| p.iter().all(|l| l.pending.is_none()));
                if !(moved && phase_done) {
                    break;
                }
            }
            while phases.front().is_some_and(|p| p.iter().all(|l| l.pending.is_none())) {
                phases.pop_front();
            }
            if phases.is_empty()
                && p2p.iter().all(|l| l.pending.is_none())
                && sv.iter().all(|(_, s)| s.flushed())
            {
                return Ok(());
            }
            if progressed {
                idle_since = None;
                continue;
            }
            if self.ctx.abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted { rank: self.ctx.me });
            }
            let now = Instant::now();
            let idle = now.duration_since(*idle_since.get_or_insert(now));
            if idle < Duration::from_nanos(SPIN_NS) {
                std::hint::spin_loop();
                continue;
            }
            let blocked = blocked_peers(&p2p, phases.front(), sv, rv);
            w.check(what, &blocked)?;
            if idle < Duration::from_nanos(YIELD_NS) {
                std::thread::yield_now();
                continue;
            }
            // Sleep: announce on every connection a pending step waits for, then re-check.
            pfds.clear();
            pfds.push(fd::pollfd(self.ctx.doorbell.as_raw_fd(), libc::POLLIN));
            let lanes = p2p.iter().chain(phases.front().into_iter().flatten());
            for l in lanes {
                if let Some(st) = l.pending {
                    if let Input::Recv(p) | Input::RecvReduce(p, _) = st.input {
                        rv[l.inb[p.0 as usize]].1.arm(&mut pfds);
                    }
                    if let Some(p) = st.send {
                        sv[l.out[p.0 as usize]].1.arm(&mut pfds);
                    }
                }
            }
            for (_, s) in sv.iter() {
                if !s.flushed() {
                    s.arm(&mut pfds);
                }
            }
            let ready_now =
                p2p.iter().chain(phases.front().into_iter().flatten()).any(|l| can_step(l, sv, rv));
            if !ready_now {
                fd::poll(&mut pfds, w.slice()).map_err(|e| Error::io(self.ctx.me, "poll", None, e))?;
            }
            for (_, s) in sv.iter() {
                s.disarm();
            }
            for (_, r) in rv.iter() {
                r.disarm();
            }
            self.ctx.doorbell.drain();
            idle_since = None;
        }
    }

    /// Runs a lane's pending step if its inputs and outputs are available.
    fn try_step(
        &self,
        l: &mut LaneRt,
        sv: &mut [(ConnKey, SendConn)],
        rv: &mut [(ConnKey, RecvConn)],
        bufs: &[RawBuf],
        what: &str,
    ) -> Result<bool> {
        let Some(step) = l.pending else {
            return Ok(false);
        };
        let rin = match step.input {
            Input::Recv(p) | Input::RecvReduce(p, _) => Some(l.inb[p.0 as usize]),
            Input::Src(_) | Input::Local2(..) => None,
        };
        let sout = step.send.map(|p| l.out[p.0 as usize]);
        if let Some(r) = rin {
            if !rv[r].1.ready()? {
                return Ok(false);
            }
        }
        if let Some(s) = sout {
            if !sv[s].1.ready() {
                return Ok(false);
            }
        }
        let len = step.len;
        let recv = match rin {
            Some(r) => {
                let (p, n) = rv[r].1.chunk();
                if n != len {
                    return Err(Error::Mismatch {
                        rank: self.ctx.me,
                        op: what.to_string(),
                        peer: rv[r].0.peer,
                        got: n,
                        want: len,
                    });
                }
                Some(p)
            }
            None => None,
        };
        let send = match sout {
            Some(s) => {
                let (p, cap) = sv[s].1.slot();
                if cap < len {
                    return Err(Error::Internal(format!("{len}-byte chunk for a {cap}-byte slot")));
                }
                Some(p)
            }
            None => None,
        };
        // A local pair reduces like a received chunk with a local operand; the operand that is
        // also the destination (if any) plays the local part, so in place works either way.
        let (local, src_loc) = match step.input {
            Input::Local2(a, b) => {
                let (r, s) = if step.dst == Some(a) { (b, a) } else { (a, b) };
                (Some(span(bufs, r, len)?), Some(s))
            }
            Input::Src(l) | Input::RecvReduce(_, l) => (None, Some(l)),
            Input::Recv(_) => (None, None),
        };
        if let (Some(lr), Some(d)) = (local, step.dst) {
            let d = span(bufs, d, len)?;
            let (a, b) = (lr.ptr as usize, d.ptr as usize);
            if a < b + len && b < a + len {
                return Err(Error::Internal("step's local operand and destination overlap".into()));
            }
        }
        let recv = recv.or(local.map(|r| r.ptr as *const u8));
        let in_place = src_loc.is_some() && step.dst == src_loc;
        let src = match src_loc {
            Some(loc) => Some(span(bufs, loc, len)?),
            None => None,
        };
        // In place, a copy has no destination and a reduction's destination is its source.
        let dst = match step.dst {
            Some(_) if in_place && matches!(step.input, Input::Src(_)) => None,
            Some(loc) => {
                let d = span(bufs, loc, len)?;
                if !d.writable {
                    return Err(Error::Internal("step writes a read-only buffer".into()));
                }
                if let (Some(s), false) = (src, in_place) {
                    let (a, b) = (s.ptr as usize, d.ptr as usize);
                    if a < b + len && b < a + len {
                        return Err(Error::Internal("step's source and destination overlap".into()));
                    }
                }
                Some(d)
            }
            None => None,
        };
        // SAFETY: (for all slices below) `span` bounds-checked every user location against its
        // live buffer (rules 1, 2); a destination is disjoint from the source unless in place,
        // and in place only the destination slice is made for a reduction; the received chunk
        // (between ready and release) and the send slot (between ready and commit) are memory
        // no one else touches now (rule 3); each points at `len` valid bytes.
        let data = unsafe {
            match (step.input, recv, src) {
                (Input::Src(_), _, Some(s)) => StepData::Src(std::slice::from_raw_parts(s.ptr, len)),
                (Input::Recv(_), Some(r), _) => StepData::Recv(std::slice::from_raw_parts(r, len)),
                (Input::RecvReduce(..) | Input::Local2(..), Some(r), _) if in_place => {
                    StepData::RecvReduceInPlace { recv: std::slice::from_raw_parts(r, len) }
                }
                (Input::RecvReduce(..) | Input::Local2(..), Some(r), Some(s)) => StepData::RecvReduce {
                    recv: std::slice::from_raw_parts(r, len),
                    src: std::slice::from_raw_parts(s.ptr, len),
                },
                _ => return Err(Error::Internal("step input unavailable".into())),
            }
        };
        // A connection that can send from where the bytes lie (TCP) sends the step's result
        // from the user buffer that holds it — the destination, or an unreduced source —
        // instead of copying it into a staging slot first.
        let external = match sout {
            Some(s) if sv[s].1.sends_in_place() => match (dst, step.input, src) {
                (Some(d), _, _) => Some(d.ptr as *const u8),
                (None, Input::Src(_), Some(s)) => Some(s.ptr as *const u8),
                _ => None,
            },
            _ => None,
        };
        // SAFETY: as above; the destination is writable, in bounds and exclusive for this step.
        let dst_mut = dst.map(|d| unsafe { std::slice::from_raw_parts_mut(d.ptr, len) });
        // SAFETY: the send slot is free (ready) and holds at least `len` bytes.
        let send_mut =
            send.filter(|_| external.is_none()).map(|p| unsafe { std::slice::from_raw_parts_mut(p, len) });
        apply(l.lane.reduce.as_ref(), step.finalize, data, dst_mut, send_mut)?;
        if let Some(s) = sout {
            match external {
                // SAFETY: the bytes are in a user buffer of this job (valid until the job ends,
                // rule 1), written by this step and by no later step of this job (plans write
                // each output location once), and the job ends only when every connection is
                // flushed.
                Some(p) => unsafe { sv[s].1.commit_external(p, len)? },
                None => sv[s].1.commit(len)?,
            }
        }
        if let Some(r) = rin {
            rv[r].1.release();
        }
        l.pending = l.lane.steps.next();
        Ok(true)
    }

    /// Closes every connection.
    pub fn close(&mut self) {
        self.direct = None;
        self.sends.clear();
        self.recvs.clear();
        self.sockets.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

fn can_step(l: &LaneRt, sv: &mut [(ConnKey, SendConn)], rv: &mut [(ConnKey, RecvConn)]) -> bool {
    let Some(st) = l.pending else {
        return false;
    };
    if let Input::Recv(p) | Input::RecvReduce(p, _) = st.input {
        if !rv[l.inb[p.0 as usize]].1.ready().unwrap_or(true) {
            return false;
        }
    }
    if let Some(p) = st.send {
        if !sv[l.out[p.0 as usize]].1.ready() {
            return false;
        }
    }
    true
}

fn blocked_peers(
    p2p: &[LaneRt],
    phase: Option<&Vec<LaneRt>>,
    sv: &mut [(ConnKey, SendConn)],
    rv: &mut [(ConnKey, RecvConn)],
) -> Vec<Rank> {
    let mut v = Vec::new();
    for l in p2p.iter().chain(phase.into_iter().flatten()) {
        if let Some(st) = l.pending {
            if let Input::Recv(p) | Input::RecvReduce(p, _) = st.input {
                let (k, c) = &mut rv[l.inb[p.0 as usize]];
                if !c.ready().unwrap_or(true) {
                    v.push(k.peer);
                }
            }
            if let Some(p) = st.send {
                let (k, c) = &mut sv[l.out[p.0 as usize]];
                if !c.ready() {
                    v.push(k.peer);
                }
            }
        }
    }
    v.sort();
    v.dedup();
    v
}
