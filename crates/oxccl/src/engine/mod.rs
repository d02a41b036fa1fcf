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
//!
//! Files: `connect` (setting up a job's connections), `exec` (running its lanes, pumping
//! sockets), `direct/` (the direct path), `memops` and `stores` (copies); this one holds the
//! engine's state and the entry points.

mod connect;
pub(crate) mod direct;
mod exec;
pub(crate) mod memops;
pub(crate) mod stores;

use crate::bootstrap::{Bootstrap, Incoming, Mailbox, PeerInfo};
use crate::error::{Error, Result};
use crate::log::Logger;
use crate::sys::fd::{self, EventFd};
use crate::transport::host::ShmOffer;
use crate::transport::shm::{ShmRecv, ShmSend};
use crate::transport::tcp::{Post, TcpRecv, TcpSend};
use crate::transport::{RecvConn, SendConn};
use crate::wait::Waiter;
use oxccl_core::config::subsys;
use oxccl_core::contract::{Seqs, Sig};
use oxccl_core::plan::exec::{apply, StepData};
use oxccl_core::plan::ConnClass;
use oxccl_core::plan::{
    job_connections, plan_group_signed, BufId, ConnKey, Geometry, Input, Job, Lane, Loc, OpSpec, Step,
};
use oxccl_core::tuner::Proto;
use oxccl_core::tuning::{SPIN_NS, SPIN_OVERSUBSCRIBED_NS, YIELD_NS};
use oxccl_core::Rank;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A hasher for connection keys (a few small integers, never chosen by a stranger): one
/// multiply per word instead of SipHash, which showed in small-call profiles.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }
    fn write_u16(&mut self, v: u16) {
        self.write_u64(v as u64);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type KeyMap<V> = HashMap<ConnKey, V, BuildHasherDefault<KeyHasher>>;

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
    /// Control connections to the peers (stuck waits probe them).
    pub boot: Arc<Bootstrap>,
    /// The communicator's flight recorder.
    pub flight: Arc<crate::flight::Recorder>,
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
    /// The contract check: chunks carry call signatures, receivers compare them.
    pub check_calls: bool,
    /// The NUMA node this rank's connection buffers are placed on ([`crate::topo::Binding`]).
    pub numa: Option<u32>,
    pub log: Logger,
}

/// A communicator's connections and the machinery that runs jobs over them.
pub(crate) struct Engine {
    pub ctx: EngineCtx,
    /// The direct path, when every rank shares this host.
    pub direct: Option<direct::Direct>,
    sends: KeyMap<SendConn>,
    recvs: KeyMap<RecvConn>,
    /// Clones of every TCP socket, so an abort from another thread can shut them down.
    pub sockets: Arc<Mutex<Vec<TcpStream>>>,
    /// Scratch memory for plans that need it (one-shot all-reduce), kept between jobs.
    scratch: Vec<u64>,
    /// The other direction of TCP streams whose first direction is in use: kept until a job
    /// needs it.
    spare: KeyMap<TcpStream>,
    /// A job's working vectors, kept between jobs.
    work: Work,
    /// How long a waiting job spins before it yields.
    spin: Duration,
    /// The numbers the next calls' signatures take.
    pub seqs: Seqs,
    /// The call being run (its first collective, for a group), for probes.
    cur: Sig,
    /// Collective calls finished successfully.
    completed: u64,
    /// Ordinary or streaming stores into shared-memory slots, for large jobs (`stores`).
    stores: stores::StoreChooser,
    /// When the timed job being run first consumed a received chunk (its peers had all
    /// arrived): its time runs from there, so that peers' late arrival is not counted.
    first_recv: std::cell::Cell<Option<Instant>>,
}

/// The memory an engine holds for its communicator, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Rebuilt on demand, so it can be given back between calls: scratch space, a job's
    /// working vectors, peers' allocations mapped for the zero-copy path.
    pub releasable: usize,
    /// Held until the communicator ends: connection rings and staging slots (each
    /// direction's), control blocks.
    pub connections: usize,
}

/// The vectors a job works in; empty between jobs (connections are back in the maps), with
/// their capacity kept.
#[derive(Default)]
struct Work {
    sv: Vec<(ConnKey, SendConn)>,
    rv: Vec<(ConnKey, RecvConn)>,
    pfds: Vec<fd::PollFd>,
    io_fds: Vec<fd::PollFd>,
    io_idx: Vec<(bool, usize)>,
    posts: Vec<Option<Post>>,
    users: Vec<u32>,
}

// SAFETY: between jobs `posts` holds stale addresses that are never dereferenced (it is
// rebuilt before each use); everything else in it is Send.
unsafe impl Send for Work {}

/// How a job writes shared-memory slots (`stores`).
#[derive(Clone, Copy)]
struct StoreMode {
    /// A chunk copied into a shared-memory slot goes with streaming stores.
    stream: bool,
    /// The job is timed: its first step that consumes a received chunk sets `first_recv`.
    timed: bool,
}

struct LaneRt {
    lane: Lane,
    inb: smallvec::SmallVec<[usize; 2]>,
    out: smallvec::SmallVec<[usize; 2]>,
    pending: Option<Step>,
    /// The step after `pending`, taken from the generator while `pending` waits, so it can
    /// run first when [`may_pass`] allows.
    ahead: Option<Step>,
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
        // Ranks of this machine beyond its cores take turns on them: a waiting rank that spins
        // long only delays the one it waits for. The machine's, not the host's: emulated hosts
        // (network namespaces) and containers of one machine share its cores.
        let machine = ctx.peers.get(ctx.me.idx()).map(|p| p.machine);
        let local =
            ctx.peers.iter().filter(|q| q.host_id == ctx.host_id || Some(q.machine) == machine).count();
        let cpus = crate::sys::affinity::host_cpus();
        let spin = Duration::from_nanos(if local > cpus { SPIN_OVERSUBSCRIBED_NS } else { SPIN_NS });
        Engine {
            spin,
            seqs: Seqs::new(ctx.peers.len()),
            cur: Sig::NONE,
            completed: 0,
            stores: stores::StoreChooser::default(),
            first_recv: std::cell::Cell::new(None),
            ctx,
            direct: None,
            sends: KeyMap::default(),
            recvs: KeyMap::default(),
            sockets: Arc::new(Mutex::new(Vec::new())),
            scratch: Vec::new(),
            spare: KeyMap::default(),
            work: Work::default(),
        }
    }

    /// Runs a group: a single collective on the direct path when this communicator has one
    /// (and the call does not fall back), otherwise planned onto the ring engine.
    pub fn run_ops(
        &mut self,
        g: &Geometry,
        ops: &[OpSpec],
        bufs: &[RawBuf],
        what: &'static str,
    ) -> Result<()> {
        // Where this call stands, for peers' probes: its first collective (or its first
        // message, for a group of sends and receives only).
        self.cur = match ops.iter().find(|o| !o.is_p2p()).or(ops.first()) {
            Some(op) if !op.is_p2p() => Sig::of(op, self.seqs.coll),
            Some(op) => Sig::of(op, 0),
            None => Sig::NONE,
        };
        if ops.len() > 1 {
            self.list_group_rest(ops);
        }
        self.ctx.mailbox.progress.begin(&self.cur);
        let id = self.ctx.flight.begin(self.cur, what);
        let r = self.run_ops_inner(g, ops, bufs, what);
        self.ctx.flight.end(id, r.as_ref().err());
        if r.is_ok() {
            self.completed = self.seqs.coll;
        }
        self.ctx.mailbox.progress.end(self.completed);
        r
    }

    /// A group of several collectives lists the later ones too, so that a peer whose group
    /// differs in any of them is told (a probe compares every call number both are in). Out
    /// of line: single calls, the common case, never come here.
    #[inline(never)]
    fn list_group_rest(&self, ops: &[OpSpec]) {
        if self.cur.kind == oxccl_core::contract::CallKind::P2p {
            return;
        }
        let first = self.seqs.coll;
        let later = ops.iter().filter(|o| !o.is_p2p()).skip(1);
        self.ctx.mailbox.progress.group_rest(later.zip(first + 1..).map(|(op, n)| Sig::of(op, n)));
    }

    /// Publishes, for peers' receives from any rank, how many messages this rank has
    /// numbered for each peer it sends to in `ops` (now planned). Out of line: groups with
    /// sends only.
    #[inline(never)]
    fn publish_sends(&self, ops: &[OpSpec]) {
        let n = self.ctx.peers.len();
        for op in ops {
            if let OpSpec::Send { peer, .. } = op {
                self.ctx.mailbox.progress.note_sent(*peer, self.seqs.sent[peer.idx()], n);
            }
        }
    }

    /// A waiter for one job: the communicator's deadline, abort flag, gone peers, and probes
    /// of the awaited peers once stuck.
    fn waiter(&self) -> Waiter {
        let c = &self.ctx;
        Waiter::for_call(
            c.me,
            c.timeout,
            c.abort.clone(),
            c.mailbox.clone(),
            c.boot.clone(),
            self.cur,
            c.check_calls,
        )
    }

    fn run_ops_inner(&mut self, g: &Geometry, ops: &[OpSpec], bufs: &[RawBuf], what: &str) -> Result<()> {
        if let [op] = ops {
            if self.direct.is_some() && oxccl_core::plan::direct_allowed(g, op) {
                let w = self.waiter();
                // `run_ops` made this very signature for a single collective (`cur`).
                let sig = match (self.ctx.check_calls, op.is_p2p()) {
                    (false, _) => Sig::NONE,
                    (true, false) => self.cur,
                    (true, true) => Sig::of(op, self.seqs.coll),
                };
                let d = self.direct.as_mut().ok_or_else(|| Error::Internal("direct path vanished".into()))?;
                match d.run(op, bufs, &w, what, sig) {
                    Ok(direct::Outcome::Fallback) => {}
                    // The call took its number, done or failed.
                    r => {
                        self.seqs.coll += 1;
                        return r.map(|_| ());
                    }
                }
            }
        }
        let job = plan_group_signed(g, ops, &mut self.seqs, self.ctx.check_calls)?;
        if !job.p2p.is_empty() {
            self.publish_sends(ops);
        }
        self.run(job, bufs, what)
    }

    /// What this engine holds, in bytes (see [`Memory`]).
    pub fn memory(&self) -> Memory {
        let (allocs, ctls) = self.direct.as_ref().map_or((0, 0), |d| d.mapped_bytes());
        let conns = (self.sends.len() + self.recvs.len()) * self.ctx.slots * self.ctx.slot_bytes;
        let w = &self.work;
        let work = w.sv.capacity() * std::mem::size_of::<(ConnKey, SendConn)>()
            + w.rv.capacity() * std::mem::size_of::<(ConnKey, RecvConn)>()
            + (w.pfds.capacity() + w.io_fds.capacity()) * std::mem::size_of::<fd::PollFd>()
            + w.io_idx.capacity() * std::mem::size_of::<(bool, usize)>()
            + w.posts.capacity() * std::mem::size_of::<Option<Post>>()
            + w.users.capacity() * 4;
        Memory { releasable: self.scratch.capacity() * 8 + work + allocs, connections: conns + ctls }
    }

    /// Gives back the memory [`Memory::releasable`] counts; jobs rebuild it as they need it.
    pub fn release(&mut self) {
        self.scratch = Vec::new();
        self.work = Work::default();
        if let Some(d) = self.direct.as_mut() {
            d.unmap_allocs();
        }
    }

    /// Closes every connection.
    pub fn close(&mut self) {
        self.direct = None;
        self.sends.clear();
        self.recvs.clear();
        self.spare.clear();
        self.sockets.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
