//! The communicator: a fixed group of ranks, its connections and the order of its calls.
//!
//! Calls are serialized per communicator, in issue order: a blocking call waits for queued
//! asynchronous work to finish, then runs its job on the calling thread (a small collective on
//! shared memory never hops to another thread); asynchronous work (see [`scope`]) runs on one
//! worker thread per communicator, started at first use.
//!
//! After a failure that leaves connections in an unknown state (a peer gone, a timeout, a
//! mismatch, an abort) every later call fails with [`Error::Broken`] naming the first failure.
//!
//! Files: `init` (joining and assembling), `group` and `scope` (groups, asynchronous work),
//! `api` (single calls, each a group of one), `elastic` (growing, memory held); this one holds the
//! communicator's state, split and shrink, the call queue and failure.

mod anysrc;
mod api;
mod elastic;
mod init;
use init::Parts;
pub mod group;
pub mod scope;

use crate::bootstrap::service::HostDesk;
use crate::bootstrap::{self, Bootstrap, Mailbox, PeerInfo, Route, Service};
use crate::engine::{direct, Engine, EngineCtx, RawBuf};
use crate::env;
use crate::error::{Error, Result};
use crate::log::Logger;
use crate::sys::fd::EventFd;
use crate::sys::{host, ifaces};
use crate::transport::hostmem::Ctl;
use crate::wait::Waiter;
use oxccl_core::config::subsys;
use oxccl_core::config::{Config, CrossMemory};
use oxccl_core::plan::{BufId, ConnClass, ConnKey, Geometry, Loc, OpSpec};
use oxccl_core::uniqueid::{derive_secret, UniqueId};
use oxccl_core::wire::{Reader, Writer};
use oxccl_core::{coll, tuning, ChannelId, CommHash, CoreError, Rank};
use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use group::{Blocking, Group, Scoped};
pub use scope::{Detached, Scope, Work};

/// `b` bytes in the largest binary unit that divides it (`64 KiB`), else in bytes.
fn bytes_text(b: usize) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b >= 1 << shift && b % (1 << shift) == 0 {
            return format!("{} {unit}", b >> shift);
        }
    }
    format!("{b} B")
}

/// `[(up_to_bytes, what)]` as people read it: `Direct up to 64 KiB, then Tree`, or
/// `Ring at every size`.
fn size_steps<T: std::fmt::Debug>(steps: &[(usize, T)]) -> String {
    let mut out = String::new();
    for (i, (b, a)) in steps.iter().enumerate() {
        if i > 0 {
            out.push_str(", then ");
        }
        if *b == usize::MAX {
            out.push_str(&format!("{a:?}{}", if i == 0 { " at every size" } else { "" }));
        } else {
            out.push_str(&format!("{a:?} up to {}", bytes_text(*b)));
        }
    }
    out
}

/// Bootstrap message tags (high byte: purpose).
const TAG_SPLIT: u64 = 1 << 56;
const TAG_SPLIT_ADDR: u64 = 2 << 56;
const TAG_SHRINK_ADDR: u64 = 3 << 56;

type QueuedJob = Box<dyn FnOnce(&Inner) + Send>;

/// A group's operations and buffers (inline for the common single call).
pub(crate) type Ops = smallvec::SmallVec<[OpSpec; 1]>;
pub(crate) type Bufs = smallvec::SmallVec<[RawBuf; 2]>;

#[derive(Default)]
struct Sched {
    queue: VecDeque<QueuedJob>,
    busy: bool,
    shutdown: bool,
    /// Blocking calls waiting for their turn (so a finished call wakes someone only when
    /// someone waits: a notification costs a system call).
    turn_waiters: usize,
}

pub(crate) struct Inner {
    pub rank: Rank,
    pub size: usize,
    pub config: Config,
    pub(crate) secret: [u8; 32],
    pub hash: CommHash,
    pub peers: Arc<Vec<PeerInfo>>,
    pub geometry: Geometry,
    /// The tuner's cost model of this communicator (the same on every rank).
    pub model: Arc<oxccl_core::tuner::Model>,
    /// Where this rank's progress (worker) thread runs.
    pub binding: crate::topo::Binding,
    pub log: Logger,
    pub(crate) abort: Arc<AtomicBool>,
    doorbell: Arc<EventFd>,
    service: Mutex<Service>,
    pub(crate) boot: Arc<Bootstrap>,
    flight: Arc<crate::flight::Recorder>,
    /// The service's mailbox (it also knows which peers are gone).
    pub(crate) mailbox: Arc<crate::bootstrap::Mailbox>,
    engine: Mutex<Engine>,
    sockets: Arc<Mutex<Vec<std::net::TcpStream>>>,
    sched: Mutex<Sched>,
    sched_cv: Condvar,
    failure: Mutex<Option<String>>,
    /// Set once `failure` holds something (checked on every call without the lock).
    failed: AtomicBool,
    /// Set by [`Communicator::close`]: resources released, every later call refused.
    closed: AtomicBool,
    split_seq: AtomicU64,
    shrink_seq: AtomicU64,
    /// Where a receive from any rank starts looking (an index into the other ranks), after
    /// the peer it last took from (`anysrc`).
    any_next: std::sync::atomic::AtomicU32,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// A sparse communicator's herald thread (joined at shutdown, once the mailbox closed).
    herald: Mutex<Option<JoinHandle<()>>>,
    /// The `OXCCL_BOOTSTRAP_SPARSE_FROM` the communicator agreed on (rank 0's): its children
    /// (splits, shrinks) go sparse by it too.
    sparse_from: u32,
    /// One-sided calls' state, made by that layer at the first window registration.
    pub(crate) one_sided: std::sync::OnceLock<Box<dyn Attached>>,
}

/// State a layer above keeps per communicator (the one-sided calls'): the communicator only
/// wakes it at an abort and stops it at close; its owner finds it again by type (`as_any`).
pub(crate) trait Attached: Send + Sync {
    fn stop(&self);
    fn wake(&self);
    fn as_any(&self) -> &dyn std::any::Any;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A communicator: this process's membership in a fixed group of ranks.
///
/// `Communicator` is `Send + Sync`: calls from several threads are serialized, in the order
/// they reach it; [`abort`](Communicator::abort) may be called from any thread at any time.
pub struct Communicator {
    pub(crate) inner: Arc<Inner>,
}

impl Communicator {
    /// This process's rank.
    pub fn rank(&self) -> Rank {
        self.inner.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The communicator's identity (the same on every rank).
    pub fn comm_hash(&self) -> CommHash {
        self.inner.hash
    }

    /// The tuner's cost model of this communicator.
    pub fn model(&self) -> &oxccl_core::tuner::Model {
        &self.inner.model
    }

    /// The explain table of collective `c` on this communicator: for sizes 8 B .. 4 GiB, the
    /// predicted time of every algorithm × protocol and the choice (`oxccl explain` prints the
    /// same for topology files).
    pub fn explain(
        &self,
        c: oxccl_core::tuner::RingColl,
    ) -> Vec<(
        usize,
        Vec<oxccl_core::tuner::Estimate>,
        std::result::Result<oxccl_core::tuner::Estimate, oxccl_core::tuner::NoCandidate>,
    )> {
        self.inner.model.explain(c, &oxccl_core::tuner::explain_sizes(), &self.inner.config.enabled)
    }

    /// What every rank told the others about itself, in rank order.
    /// The communicator's logger (NCCL_DEBUG's lines for this rank).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn logger(&self) -> &crate::log::Logger {
        &self.inner.log
    }

    pub fn peers(&self) -> &[PeerInfo] {
        &self.inner.peers
    }

    /// The peers this rank has held control connections to since init: every other rank,
    /// or in a sparse communicator (`OXCCL_BOOTSTRAP_SPARSE_FROM`) its ring and tree
    /// neighbours only.
    pub fn lifelines(&self) -> &[Rank] {
        self.inner.boot.lifelines()
    }

    /// The settings the communicator runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Whether the communicator can still run calls: `Err` with the abort or the first
    /// failure (`ncclCommGetAsyncError`'s question).
    pub fn check(&self) -> Result<()> {
        self.inner.check_usable()
    }

    /// Splits the communicator: ranks that pass the same `color` form a new communicator,
    /// ordered by `key` (ties by rank). `None` as color takes no part and returns `None`.
    /// Every rank must call it, in the same order relative to its other calls.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        self.inner.check_usable()?;
        let i = &self.inner;
        let _turn = i.take_turn();
        let seq = i.split_seq.fetch_add(1, Ordering::Relaxed);
        let w = Waiter::new(i.rank, i.config.timeout, i.abort.clone());
        let mut msg = Writer::new();
        msg.u8(color.is_some() as u8).u32(color.unwrap_or(0)).i64(key);
        let all = i.boot.all_gather(TAG_SPLIT | seq, &msg.finish(), &w).inspect_err(|e| i.fail(e))?;
        let mut members: Vec<(i64, u32, u32)> = Vec::new();
        for (r, m) in all.iter().enumerate() {
            let mut rd = Reader::new(m, "split request");
            let (has, c, k) = (rd.u8()?, rd.u32()?, rd.i64()?);
            if has == 1 {
                members.push((k, r as u32, c));
            }
        }
        let mine: Vec<(i64, u32)> = match color {
            Some(c) => {
                let mut v: Vec<(i64, u32)> =
                    members.iter().filter(|m| m.2 == c).map(|m| (m.0, m.1)).collect();
                v.sort();
                v
            }
            None => Vec::new(),
        };
        let child_rank = mine.iter().position(|m| m.1 == i.rank.0).map(Rank::new);
        let secret = derive_secret(&i.secret, "split", &[seq, color.unwrap_or(0) as u64]);
        let parents: Vec<Rank> = mine.iter().map(|m| Rank(m.1)).collect();
        let what = format!("split {seq}: color {color:?}");
        i.child(child_rank, &parents, secret, &what, |msg| {
            i.boot.all_gather(TAG_SPLIT_ADDR | seq, msg, &w).inspect_err(|e| i.fail(e))
        })
    }

    /// Shrinks the communicator: the ranks not in `exclude` form a new communicator, keeping
    /// their order (like `ncclCommShrink`). Only those ranks call it (the excluded ones may be
    /// dead); it talks to no excluded rank, and works after the communicator has failed or
    /// been aborted, so survivors can carry on without restarting. Every surviving rank must
    /// pass the same list and call it in the same order relative to its other shrinks.
    pub fn shrink(&self, exclude: &[Rank]) -> Result<Communicator> {
        let i = &self.inner;
        for r in exclude {
            coll::check_rank("exclude", r.0 as i64, i.size)?;
        }
        if exclude.contains(&i.rank) {
            return Err(Error::InvalidUsage(format!(
                "rank {} is in the exclude list of its own shrink (excluded ranks must not call it)",
                i.rank
            )));
        }
        let parents: Vec<Rank> = (0..i.size).map(Rank::new).filter(|r| !exclude.contains(r)).collect();
        let seq = i.shrink_seq.fetch_add(1, Ordering::Relaxed);
        let mut key = Writer::new();
        for r in &parents {
            key.u32(r.0);
        }
        let list_hash = u64::from_le_bytes(
            derive_secret(&key.finish(), "shrink-members", &[])[..8].try_into().expect("8 bytes"),
        );
        let secret = derive_secret(&i.secret, "shrink", &[seq, list_hash]);
        let me = parents.iter().position(|r| *r == i.rank).map(Rank::new);
        // A fresh abort flag: the parent may have been aborted, the child must still form.
        let w = Waiter::new(i.rank, i.config.timeout, Arc::new(AtomicBool::new(false)));
        let tag = TAG_SHRINK_ADDR | seq;
        let what = format!("shrink {seq}: without ranks {exclude:?}");
        i.child(me, &parents, secret, &what, |msg| {
            for p in &parents {
                // A connection shut down by an abort is reopened once.
                if i.boot.send(*p, tag, msg, &w).is_err() {
                    i.boot.send(*p, tag, msg, &w)?;
                }
            }
            let mut all = vec![Vec::new(); i.size];
            for p in &parents {
                all[p.idx()] = i.boot.recv(*p, tag, &w)?;
            }
            Ok(all)
        })?
        .ok_or_else(|| Error::Internal("shrink built no communicator for a member".into()))
    }

    /// Aborts the communicator: pending and future calls on it fail promptly with
    /// [`Error::Aborted`], whatever the peers do. Returns without waiting for them.
    pub fn abort(&self) {
        self.inner.abort();
    }

    /// Destroys the communicator in order: waits for queued work, then closes connections
    /// and the service.
    pub fn destroy(self) -> Result<()> {
        self.shutdown();
        Ok(())
    }

    /// Destroys the communicator in place, as [`destroy`](Communicator::destroy) does, for
    /// owners that cannot give it up (a handle shared with other threads): every later call
    /// fails with [`Error::InvalidUsage`]. A second close does nothing.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.shutdown();
    }

    fn shutdown(&self) {
        let i = &self.inner;
        {
            let mut s = lock(&i.sched);
            s.shutdown = true;
            i.sched_cv.notify_all();
        }
        if let Some(t) = lock(&i.worker).take() {
            let _ = t.join();
        }
        if let Some(r) = i.one_sided.get() {
            r.stop();
        }
        lock(&i.engine).close();
        i.boot.close();
        // Stopping the service closes the mailbox, which drops the herald's channel: it ends.
        lock(&i.service).stop();
        if let Some(h) = lock(&i.herald).take() {
            let _ = h.join();
        }
    }

    /// Runs a group on the calling thread, after any queued asynchronous work.
    pub(crate) fn execute(&self, ops: &[OpSpec], bufs: &[RawBuf], what: &'static str) -> Result<()> {
        self.inner.check_usable()?;
        let _turn = self.inner.take_turn();
        self.inner.run_job(ops, bufs, what)
    }

    /// Queues a group for the worker thread; `done` receives the result.
    pub(crate) fn submit(
        &self,
        ops: Ops,
        bufs: Bufs,
        what: &'static str,
        done: Box<dyn FnOnce(Result<()>) + Send>,
    ) -> Result<()> {
        self.inner.check_usable()?;
        self.queue(Box::new(move |inner: &Inner| {
            let r = match inner.check_usable() {
                Ok(()) => inner.run_job(&ops, &bufs, what),
                Err(e) => Err(e),
            };
            done(r);
        }))
    }

    /// Queues `job` for the worker thread (started at the first job), after every job queued
    /// before it.
    fn queue(&self, job: QueuedJob) -> Result<()> {
        let i = &self.inner;
        {
            let mut w = lock(&i.worker);
            if w.is_none() {
                let inner = i.clone();
                *w = Some(
                    std::thread::Builder::new()
                        .name(format!("oxccl-work-{}", i.rank))
                        .spawn(move || {
                            let _ = crate::sys::affinity::bind_current(&inner.binding.cpus);
                            worker(inner)
                        })
                        .map_err(|e| Error::io(i.rank, "spawn the worker thread", None, e))?,
                );
            }
        }
        let mut s = lock(&i.sched);
        s.queue.push_back(job);
        i.sched_cv.notify_all();
        Ok(())
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Tells the peers about a failure of this rank's setup (its communicator never existed, so
/// `Inner::fail` cannot): who is gone, or why it failed. Returns the error.
fn told(boot: &Bootstrap, mailbox: &Mailbox, e: Error) -> Error {
    let e = mailbox.explain(e, Duration::from_millis(REASON_WAIT_MS));
    match &e {
        Error::PeerClosed { peer, .. } => boot.tell_gone(*peer),
        Error::PeerFailed { .. } | Error::Aborted { .. } => {}
        other => boot.tell_failure(&other.to_string()),
    }
    e
}

/// How long a call that lost a peer's connection waits for that peer's failure reason.
const REASON_WAIT_MS: u64 = 200;

/// Holds the communicator's turn (no other call runs until it is dropped).
struct Turn<'a>(&'a Inner);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.sched);
        s.busy = false;
        if s.turn_waiters > 0 || !s.queue.is_empty() {
            self.0.sched_cv.notify_all();
        }
    }
}

impl Inner {
    /// Builds a child communicator of `parents` (parent ranks, in child rank order) where this
    /// rank is `child_rank` (`None`: it takes part in the exchange but joins nothing).
    /// `exchange` sends this rank's encoded address record and returns every parent rank's
    /// record, indexed by parent rank (entries of non-members may be anything).
    fn child(
        &self,
        child_rank: Option<Rank>,
        parents: &[Rank],
        secret: [u8; 32],
        what: &str,
        exchange: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
    ) -> Result<Option<Communicator>> {
        let doorbell = Arc::new(EventFd::new().map_err(|e| Error::io(self.rank, "eventfd", None, e))?);
        let ctl = Arc::new(
            Ctl::create(self.rank.0)
                .map_err(|e| Error::io(self.rank, "create the control block", None, e))?,
        );
        let service = match child_rank {
            Some(cr) => Some(Service::start(
                self.peers[self.rank.idx()].addr.ip(),
                &self.peers[self.rank.idx()].rails,
                cr,
                parents.len(),
                secret,
                doorbell.clone(),
                init::host_share(&ctl, self.rank)?,
                Logger::new(&self.config, Some(cr.0)),
            )?),
            None => None,
        };
        let mut msg = Writer::new();
        match &service {
            Some(s) => {
                msg.u8(1);
                let info =
                    PeerInfo { addr: s.addr, unix_name: s.unix_name, ..self.peers[self.rank.idx()].clone() };
                info.encode(&mut msg);
            }
            None => {
                msg.u8(0);
            }
        }
        let addrs = exchange(&msg.finish())?;
        let (Some(cr), Some(service)) = (child_rank, service) else {
            return Ok(None);
        };
        let mut peers = Vec::with_capacity(parents.len());
        for (new_rank, parent) in parents.iter().enumerate() {
            let mut rd = Reader::new(&addrs[parent.idx()], "child communicator address");
            if rd.u8()? != 1 {
                return Err(Error::Internal(format!("rank {parent} sent no address for {what}")));
            }
            let mut info = PeerInfo::decode(&mut rd)?;
            info.rank = Rank::new(new_rank);
            peers.push(info);
        }
        let log = Logger::new(&self.config, Some(cr.0));
        log.info(format_args!("{what} → rank {cr} of {}", peers.len()));
        Communicator::assemble(Parts {
            ctl,
            rank: cr,
            size: parents.len(),
            config: self.config.clone(),
            secret,
            route: Route {
                sparse_from: self.sparse_from,
                sparse: Route::is_sparse(peers.len(), self.sparse_from as usize),
                ancestors: Vec::new(),
                children: Vec::new(),
            },
            peers,
            links: HashMap::new(),
            service,
            doorbell,
            abort: Arc::new(AtomicBool::new(false)),
            log,
        })
        .map(Some)
    }

    fn take_turn(&self) -> Turn<'_> {
        let mut s = lock(&self.sched);
        while s.busy || !s.queue.is_empty() {
            s.turn_waiters += 1;
            s = self.sched_cv.wait(s).unwrap_or_else(|e| e.into_inner());
            s.turn_waiters -= 1;
        }
        s.busy = true;
        Turn(self)
    }

    fn run_job(&self, ops: &[OpSpec], bufs: &[RawBuf], what: &'static str) -> Result<()> {
        if let Some(why) = ops.iter().find_map(|o| oxccl_core::plan::refused(&self.geometry, o)) {
            return Err(Error::InvalidUsage(format!("rank {}: {what}: {why}", self.rank)));
        }
        if self.log.on(subsys::TUNING) {
            for op in ops {
                if let (Some(c), Some(bytes)) = (op.tuned(), op.tuned_bytes(self.size)) {
                    match self.model.choose(c, bytes, &self.config.enabled) {
                        Ok(e) => self.log.info_in(
                            subsys::TUNING,
                            format_args!(
                                "{what}: {bytes} B → {}/{} × {} channel(s), predicted {:.1} µs",
                                e.algo, e.proto, e.channels, e.us
                            ),
                        ),
                        Err(e) => self.log.info_in(subsys::TUNING, format_args!("{what}: {bytes} B → {e}")),
                    }
                }
            }
        }
        let tracing = self.log.level >= oxccl_core::config::LogLevel::Trace;
        let started = tracing.then(Instant::now);
        let copied = inputs_of_in_place_all_to_alls(self.rank, self.size, ops, bufs)?;
        let (ops, bufs) = match &copied {
            Some(c) => (&c.ops[..], &c.bufs[..]),
            None => (ops, bufs),
        };
        let mut r = lock(&self.engine).run_ops(&self.geometry, ops, bufs, what);
        if let Some(t) = started {
            self.log.trace(format_args!("{what} took {:?}", t.elapsed()));
        }
        // An abort shuts sockets down under a running job: report the abort, not the socket
        // error it caused.
        if r.is_err() && self.abort.load(Ordering::Relaxed) {
            r = Err(Error::Aborted { rank: self.rank });
        }
        // A connection a peer closed because its communicator failed: report why it failed.
        if let Err(e) = r {
            r = Err(self.mailbox.explain(e, Duration::from_millis(REASON_WAIT_MS)));
        }
        if let Err(e) = &r {
            if e.is_fatal() {
                self.fail(e);
            }
        }
        r
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::InvalidUsage(format!("rank {}: the communicator was destroyed", self.rank)));
        }
        if self.abort.load(Ordering::Relaxed) {
            return Err(Error::Aborted { rank: self.rank });
        }
        if self.failed.load(Ordering::Relaxed) {
            if let Some(f) = lock(&self.failure).as_ref() {
                return Err(Error::Broken { rank: self.rank, first: f.clone() });
            }
        }
        if let Some(peer) = self.mailbox.first_gone() {
            let e = self.mailbox.gone_error(self.rank, "the next call", peer);
            self.fail(&e);
            return Err(e);
        }
        Ok(())
    }

    pub(crate) fn fail(&self, e: &Error) {
        let first = {
            let mut f = lock(&self.failure);
            self.failed.store(true, Ordering::Relaxed);
            let first = f.is_none();
            if first {
                self.log.warn(format_args!("communicator failed: {e}"));
                *f = Some(e.to_string());
            }
            first
        };
        // A failure this rank found itself (not one a peer caused or told it about) goes to
        // every peer, so their waits on this rank end now, naming it and the reason.
        let own = !matches!(
            e,
            Error::PeerClosed { .. }
                | Error::PeerFailed { .. }
                | Error::Aborted { .. }
                | Error::Broken { .. }
        );
        if first && own {
            self.boot.tell_failure(&e.to_string());
        }
        if first {
            self.dump_flight(&format!("failure: {e}"));
        }
        // A peer seen gone is news to the others too (it may not have had its own lifeline
        // to each of them yet, or they may be waiting on someone who waits on it).
        if let (true, Error::PeerClosed { peer, .. }) = (first, e) {
            self.boot.tell_gone(*peer);
        }
    }

    /// Writes the flight recorder's dump, saying where in the log.
    fn dump_flight(&self, why: &str) {
        if self.config.flight_entries == 0 {
            return;
        }
        match self.flight.dump(why) {
            Ok(p) => self.log.warn(format_args!("flight recorder dump: {}", p.display())),
            Err(e) => self
                .log
                .warn(format_args!("flight recorder dump to {} failed: {e}", self.flight.path().display())),
        }
    }

    fn abort(&self) {
        self.dump_flight("abort");
        self.abort.store(true, Ordering::SeqCst);
        self.doorbell.notify();
        if let Some(r) = self.one_sided.get() {
            r.wake();
        }
        lock(&self.service).mailbox.wake();
        // The socket list has its own lock, so this works while a job holds the engine: the
        // job's next socket call fails at once instead of waiting for its peer.
        for s in lock(&self.sockets).iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.boot.shutdown();
        let mut f = lock(&self.failure);
        self.failed.store(true, Ordering::Relaxed);
        if f.is_none() {
            *f = Some(format!("rank {} aborted the communicator", self.rank));
        }
    }
}

fn worker(inner: Arc<Inner>) {
    loop {
        let job = {
            let mut s = lock(&inner.sched);
            loop {
                if !s.busy {
                    if let Some(j) = s.queue.pop_front() {
                        s.busy = true;
                        break j;
                    }
                    if s.shutdown {
                        return;
                    }
                }
                s = inner.sched_cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        job(&inner);
        let mut s = lock(&inner.sched);
        s.busy = false;
        if s.turn_waiters > 0 {
            inner.sched_cv.notify_all();
        }
    }
}

/// A group's operations with every in-place all-to-all reading its input from a copy, and the
/// copies (which the rewritten buffers point into).
struct CopiedInputs {
    ops: Vec<OpSpec>,
    bufs: Vec<RawBuf>,
    _copies: Vec<Vec<u8>>,
}

/// Rewrites in-place all-to-alls (source and destination the same buffer, which NCCL allows)
/// to read from a copy of their input taken now: each block of such a buffer is both what
/// this rank sends a peer and where that peer's block lands, so no engine may read it after
/// the first block arrives. `None` when the group has none (the common case: no copy). The
/// copy is taken before the group runs, so a call that writes the buffer before the
/// all-to-all in the same group (an earlier collective, or any receive, which runs
/// throughout) is refused by name rather than its result missed.
fn inputs_of_in_place_all_to_alls(
    me: Rank,
    p: usize,
    ops: &[OpSpec],
    bufs: &[RawBuf],
) -> Result<Option<CopiedInputs>> {
    let in_place = |o: &OpSpec| matches!(o, OpSpec::AllToAll { src, dst, .. } if src == dst);
    if !ops.iter().any(in_place) {
        return Ok(None);
    }
    let mut c = CopiedInputs { ops: ops.to_vec(), bufs: bufs.to_vec(), _copies: Vec::new() };
    for i in 0..c.ops.len() {
        if let OpSpec::AllToAll { count, dtype, src, dst } = &mut c.ops[i] {
            if src != dst {
                continue;
            }
            let len = *count * dtype.size_bytes() * p;
            let b = c.bufs.get(src.buf.0 as usize).copied();
            let Some(b) = b.filter(|b| src.off.checked_add(len).is_some_and(|end| end <= b.len)) else {
                return Err(Error::Internal(format!(
                    "in-place all-to-all of {len} bytes outside its buffer"
                )));
            };
            let start = b.ptr as usize + src.off;
            let writer = ops.iter().enumerate().find(|&(j, o)| {
                let before = (j < i && !o.is_p2p()) || matches!(o, OpSpec::Recv { .. });
                let w = o.dst().and_then(|d| bufs.get(d.buf.0 as usize)).filter(|w| w.writable);
                before && w.is_some_and(|w| (w.ptr as usize) < start + len && start < w.ptr as usize + w.len)
            });
            if let Some((j, _)) = writer {
                return Err(Error::InvalidUsage(format!(
                    "rank {me}: call {} of this group, an in-place all-to-all, reads its buffer when the group starts, but call {} of the group writes it first: end the group between the two",
                    i + 1,
                    j + 1
                )));
            }
            let id =
                u16::try_from(c.bufs.len()).ok().filter(|&k| k != BufId::SCRATCH.0).ok_or_else(|| {
                    Error::from(CoreError::InvalidArgument {
                        arg: "group",
                        reason: "too many buffers in one group".into(),
                    })
                })?;
            // SAFETY: the group checked that the buffer holds `len` bytes from `src.off`, and it
            // stays borrowed (unaliased) while the job runs.
            let data = unsafe { std::slice::from_raw_parts(b.ptr.add(src.off), len) }.to_vec();
            c.bufs.push(RawBuf { ptr: data.as_ptr() as *mut u8, len, writable: false });
            // The Vec's heap block does not move when `_copies` grows.
            c._copies.push(data);
            if let OpSpec::AllToAll { src, .. } = &mut c.ops[i] {
                *src = Loc::start(BufId(id));
            }
        }
    }
    Ok(Some(c))
}
