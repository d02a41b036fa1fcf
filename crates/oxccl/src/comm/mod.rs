//! The communicator: a fixed group of ranks, its connections and the order of its calls.
//!
//! Calls are serialized per communicator, in issue order: a blocking call waits for queued
//! asynchronous work to finish, then runs its job on the calling thread (a small collective on
//! shared memory never hops to another thread); asynchronous work (see [`scope`]) runs on one
//! worker thread per communicator, started at first use.
//!
//! After a failure that leaves connections in an unknown state (a peer gone, a timeout, a
//! mismatch, an abort) every later call fails with [`Error::Broken`] naming the first failure.

mod api;
mod elastic;
pub mod group;
pub mod scope;

use crate::bootstrap::{self, Bootstrap, Mailbox, PeerInfo, Route, Service, Waiter};
use crate::engine::{direct, Engine, EngineCtx, RawBuf};
use crate::env;
use crate::error::{Error, Result};
use crate::log::Logger;
use crate::sys::fd::EventFd;
use crate::sys::{host, ifaces};
use crate::transport::hostmem::Ctl;
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
    worker: Mutex<Option<JoinHandle<()>>>,
    /// A sparse communicator's herald thread (joined at shutdown, once the mailbox closed).
    herald: Mutex<Option<JoinHandle<()>>>,
    /// The `OXCCL_BOOTSTRAP_SPARSE_FROM` the communicator agreed on (rank 0's): its children
    /// (splits, shrinks) go sparse by it too.
    sparse_from: u32,
    /// One-sided calls' state, made at the first window registration (`crate::rma`).
    pub(crate) rma: std::sync::OnceLock<Arc<crate::rma::Rma>>,
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

/// The ring order: ranks of one host adjacent, hosts in order of their lowest rank.
fn ring_order(peers: &[PeerInfo]) -> Vec<Rank> {
    let host = host_indices(peers);
    let mut order: Vec<Rank> = peers.iter().map(|p| p.rank).collect();
    order.sort_by_key(|r| (host[r.idx()], r.0));
    order
}

/// Each rank's host as a small index (in order of first appearance). Linear in the rank
/// count (a map, not a search per rank: 100,000 ranks on 12,500 hosts).
fn host_indices(peers: &[PeerInfo]) -> Vec<u32> {
    let mut hosts: HashMap<u64, u32> = HashMap::new();
    peers
        .iter()
        .map(|p| {
            let n = hosts.len() as u32;
            *hosts.entry(p.host_id).or_insert(n)
        })
        .collect()
}

/// A sparse communicator's lifelines for `me`: its neighbours on the ring, in both trees
/// and in the relay tree. The relation is symmetric, so each pair holds connections both
/// ways and each learns of the other's end.
fn sparse_lifelines(me: Rank, geometry: &Geometry) -> Vec<Rank> {
    let n = geometry.size;
    let ring = &geometry.ring;
    let mut v: Vec<Rank> = Vec::new();
    if let Some(pos) = ring.iter().position(|r| *r == me) {
        v.push(ring[(pos + 1) % n]);
        v.push(ring[(pos + n - 1) % n]);
    }
    if n > 2 {
        for t in oxccl_core::plan::tree::places(geometry) {
            let pl = &t[me.idx()];
            v.extend(pl.parent);
            v.extend(pl.children.iter().copied());
        }
    }
    let (parent, children) = bootstrap::relay_links(me, n);
    v.extend(parent);
    v.extend(children);
    v.sort();
    v.dedup();
    v.retain(|r| *r != me);
    v
}

/// A sparse communicator's herald: passes the first word of each departure this rank
/// learns on to its lifelines, so word floods the lifeline graph (whose diameter is at most
/// twice the relay tree's depth) as it would reach every rank directly in a full mesh. Ends
/// when the mailbox closes or the communicator is gone; shutdown joins it after closing the
/// mailbox, so a communicator's end leaves no thread behind.
fn spawn_herald(boot: &Arc<Bootstrap>, mailbox: &Mailbox, rank: Rank) -> Option<JoinHandle<()>> {
    let (tx, rx) = std::sync::mpsc::channel::<bootstrap::Word>();
    mailbox.set_herald(tx);
    let weak = Arc::downgrade(boot);
    let t = std::thread::Builder::new().name(format!("oxccl-herald-{rank}")).spawn(move || {
        while let Ok(word) = rx.recv() {
            let Some(boot) = weak.upgrade() else { return };
            match word {
                bootstrap::Word::Gone(r) => boot.pass_gone(r),
                bootstrap::Word::Failed(r, reason) => boot.tell_failed_by(r, &reason),
            }
        }
    });
    t.ok()
}

struct Parts {
    ctl: Arc<Ctl>,
    rank: Rank,
    size: usize,
    config: Config,
    secret: [u8; 32],
    peers: Vec<PeerInfo>,
    /// How the bootstrap went: sparse or not, and the threshold the communicator agreed on.
    route: Route,
    /// Control connections the bootstrap opened (the table's relay to this rank's children).
    links: HashMap<u32, TcpStream>,
    service: Service,
    doorbell: Arc<EventFd>,
    abort: Arc<AtomicBool>,
    log: Logger,
}

impl Communicator {
    /// Joins the communicator of `id` as `rank` of `size`.
    pub fn init(id: &UniqueId, size: usize, rank: Rank, config: Config) -> Result<Communicator> {
        Communicator::start(id, size, rank, config).map_err(|e| {
            // The rendezvous root may run in this process (rank 0's) and have failed: this
            // process must last until the root has told the other ranks, and the root's reason
            // is the cause (this rank's own failure may be only its consequence).
            match crate::bootstrap::root::failure_here(&id.secret) {
                Some(reason) => Error::Rejected { rank, reason },
                None => e,
            }
        })
    }

    fn start(id: &UniqueId, size: usize, rank: Rank, config: Config) -> Result<Communicator> {
        if size == 0 {
            return Err(CoreError::InvalidArgument {
                arg: "size",
                reason: "a communicator needs at least one rank".into(),
            }
            .into());
        }
        let rank = coll::check_rank("rank", rank.0 as i64, size)?;
        config.validate()?;
        let log = Logger::new(&config, Some(rank.0));
        let ip = crate::rendezvous::choose_ip(&config, Some(id.root.ip()), rank)?;
        let doorbell = Arc::new(EventFd::new().map_err(|e| Error::io(rank, "eventfd", None, e))?);
        let abort = Arc::new(AtomicBool::new(false));
        let ctl =
            Arc::new(Ctl::create(rank.0).map_err(|e| Error::io(rank, "create the control block", None, e))?);
        let service = Service::start(ip, rank, size, id.secret, doorbell.clone(), ctl.clone(), log)?;
        let info = PeerInfo {
            rank,
            pid: std::process::id(),
            host_id: host::host_id(config.host_id.as_deref()),
            hostname: host::hostname(),
            addr: service.addr,
            unix_name: service.unix_name,
            costs: crate::calib::host_costs(
                host::host_id(config.host_id.as_deref()),
                config.calibrate.as_deref(),
            ),
            cuda_device: config.cuda_device.unwrap_or(-1),
        };
        let w = Waiter::new(rank, config.timeout, abort.clone())
            .watching(&service.mailbox)
            .announcing(config.wait_notice);
        let rv = bootstrap::Rendezvous {
            root: id.root,
            secret: &id.secret,
            size,
            sparse_from: config.bootstrap_sparse_from,
        };
        let joined = bootstrap::join(rv, &info, &service.mailbox, &w, &log)?;
        log.info(format_args!(
            "joined communicator {} as rank {rank} of {size} ({})",
            id.comm_hash(),
            service.addr
        ));
        Communicator::assemble(Parts {
            ctl,
            rank,
            size,
            config,
            secret: id.secret,
            peers: joined.peers,
            route: joined.route,
            links: joined.links,
            service,
            doorbell,
            abort,
            log,
        })
    }

    /// Joins the communicator the launcher's environment describes (torchrun, Slurm, Open MPI,
    /// PMI or oxccl's own variables; see [`oxccl_core::launch`]), with settings from the
    /// environment.
    pub fn from_env() -> Result<Communicator> {
        Communicator::from_env_with(env::config()?)
    }

    /// [`from_env`](Communicator::from_env) with explicit settings.
    pub fn from_env_with(config: Config) -> Result<Communicator> {
        let l = env::launch()?.ok_or_else(|| {
            Error::InvalidUsage(
                "Communicator::from_env: no launcher started this process (no OXCCL_RANK, RANK and \
                 WORLD_SIZE, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK); start it \
                 with torchrun, srun or mpirun, set OXCCL_RANK, OXCCL_WORLD_SIZE and a rendezvous \
                 (OXCCL_UNIQUE_ID, ...), or use Communicator::init"
                    .into(),
            )
        })?;
        let id = crate::rendezvous::unique_id(&l, &config)?;
        Communicator::init(&id, l.size, Rank::new(l.rank), config)
    }

    fn assemble(p: Parts) -> Result<Communicator> {
        let peers = Arc::new(p.peers);
        let ring: Arc<[Rank]> = ring_order(&peers).into();
        // Communicators whose rings cross sockets (several hosts, or shared memory off) get
        // the socket defaults; every rank decides from the same peer table, so all agree.
        let net = p.size > 1 && (p.config.shm_disable || peers.iter().any(|q| q.host_id != peers[0].host_id));
        let slot_bytes = p.config.slot_bytes(net);
        let one_shot = tuning::one_shot_max_bytes(net);
        let mut geometry = Geometry {
            rank: p.rank,
            size: p.size,
            ring,
            nchannels: p.config.channels(net),
            chunk_bytes: slot_bytes,
            // NCCL_MIN_NCHANNELS > 1 asks for that many rings on every call.
            channel_min_bytes: if p.config.min_channels > 1 { 0 } else { tuning::RING_MIN_BYTES_PER_CHANNEL },
            one_shot_max_bytes: one_shot,
            hosts: host_indices(&peers).into(),
            deterministic: p.config.deterministic,
            select: None,
            cache: None,
        }
        .cached();
        let model = oxccl_core::tuner::Model::cpu(
            p.size,
            geometry.hosts.iter().max().map_or(1, |h| *h as usize + 1),
            &peers[0].costs,
            peers.iter().all(|q| q.host_id == peers[0].host_id)
                && !p.config.shm_disable
                && p.config.direct
                && p.size > 1,
            p.config.min_channels,
            geometry.nchannels,
        );
        // Shared memory off: every pair talks over sockets, and the model prices it so.
        let model = Arc::new(if p.config.shm_disable { model.over_sockets() } else { model });
        geometry.select = if p.config.tuner {
            Some(Arc::new(oxccl_core::tuner::Selector::tuned(&model, &p.config.enabled, one_shot)))
        } else {
            oxccl_core::tuner::Selector::forced(&p.config.enabled, p.size, one_shot).map(Arc::new)
        };
        if p.log.on(subsys::TUNING) {
            let c = &peers[0].costs;
            p.log.info_in(
                subsys::TUNING,
                format_args!(
                    "cost model from rank 0's host ({}): copy {:.2} GB/s, hand-off {:.2} µs, TCP {:.1} µs {:.2} GB/s, LL {:.2} GB/s, LL128 {:.2} GB/s; all-reduce by size: {:?}, its protocol by size: {:?}",
                    if c.measured { "measured" } else { "built-in values" },
                    c.copy_gbs,
                    c.hop_us,
                    c.tcp_us,
                    c.tcp_gbs,
                    c.ll_gbs,
                    c.ll128_gbs,
                    geometry.select.as_ref().map(|s| s.all_reduce.clone()).unwrap_or_default(),
                    geometry
                        .select
                        .as_ref()
                        .map(|s| s.protos[oxccl_core::tuner::Coll::AllReduce as usize].clone())
                        .unwrap_or_default()
                ),
            );
        }
        if p.log.on(subsys::INIT | subsys::GRAPH) {
            let ring: Vec<String> = geometry.ring.iter().map(|r| r.to_string()).collect();
            for c in 0..geometry.nchannels {
                p.log.info_in(
                    subsys::INIT | subsys::GRAPH,
                    format_args!("Channel {c:02}/{:02} : {}", geometry.nchannels, ring.join(" ")),
                );
            }
            if p.size > 2 {
                let show = |r: Option<Rank>| r.map_or("-1".to_string(), |r| r.to_string());
                let [a, b] = oxccl_core::plan::tree::places(&geometry);
                let me = p.rank.idx();
                let fmt = |pl: &oxccl_core::plan::tree::Place| {
                    let ch: Vec<String> = pl.children.iter().map(|c| c.to_string()).collect();
                    format!(
                        "{}->{}->{}",
                        if ch.is_empty() { "-1".into() } else { ch.join("/") },
                        p.rank,
                        show(pl.parent)
                    )
                };
                p.log.info_in(
                    subsys::INIT | subsys::GRAPH,
                    format_args!(
                        "Trees [0] {} [1] {} (double binary tree over hosts, chain inside each)",
                        fmt(&a[me]),
                        fmt(&b[me])
                    ),
                );
            }
        }
        let iface = ifaces::list()
            .ok()
            .and_then(|l| l.into_iter().find(|i| i.addr == peers[p.rank.idx()].addr.ip()))
            .map(|i| i.name);
        let binding = crate::topo::binding(
            &crate::topo::host().hosts[0],
            &crate::sys::affinity::current(),
            iface.as_deref(),
            peers.iter().any(|q| q.host_id != peers[p.rank.idx()].host_id),
        );
        p.log.info(format_args!(
            "affinity: progress thread on CPUs {} and connection buffers on NUMA node {} (mbind, preferred): {}",
            crate::sys::affinity::format_cpulist(&binding.cpus),
            binding.numa.map_or("? (not bound)".to_string(), |n| n.to_string()),
            binding.why
        ));
        if let Some(s) = &geometry.select {
            p.log.info(format_args!(
                "NCCL_ALGO/NCCL_PROTO: all-reduce {}; direct path per collective {:?}; refused: {:?}",
                if s.all_reduce.is_empty() {
                    "by the built-in rules".to_string()
                } else {
                    size_steps(&s.all_reduce)
                },
                s.direct,
                s.refuse.iter().flatten().collect::<Vec<_>>()
            ));
        }
        p.log.info(format_args!(
            "{} ring channel(s), {} KiB of buffering per connection ({}; NCCL_MAX_NCHANNELS, NCCL_BUFFSIZE)",
            geometry.nchannels,
            p.config.buffsize(net) >> 10,
            if net { "socket defaults" } else { "shared-memory defaults" }
        ));
        let mailbox = p.service.mailbox.clone();
        mailbox.watch(p.doorbell.clone(), peers.iter().map(|q| q.hostname.clone()).collect());
        // Control connections to every peer first: they are the lifelines that tell a peer
        // this rank is gone, from the moment the communicator exists; every later wait of the
        // setup watches them and probes the peers it waits for.
        let lifelines = p.route.sparse.then(|| sparse_lifelines(p.rank, &geometry));
        if let Some(l) = &lifelines {
            p.log.info_in(
                subsys::BOOTSTRAP,
                format_args!(
                    "sparse bootstrap ({} ranks >= OXCCL_BOOTSTRAP_SPARSE_FROM={}): table relayed from rank {}, lifelines to ranks {l:?}",
                    p.size,
                    p.route.sparse_from,
                    bootstrap::relay_links(p.rank, p.size).0.map_or("- (the root)".to_string(), |r| r.to_string())
                ),
            );
        }
        let sparse = lifelines.is_some();
        let boot =
            Arc::new(Bootstrap::new(p.rank, p.secret, peers.clone(), mailbox.clone(), lifelines, p.links));
        let herald = if sparse { spawn_herald(&boot, &mailbox, p.rank) } else { None };
        let w = Waiter::new(p.rank, p.config.timeout, p.abort.clone())
            .watching(&mailbox)
            .probing(&boot, oxccl_core::contract::Sig::NONE, false)
            .announcing(p.config.wait_notice);
        boot.connect_all(&w).map_err(|e| told(&boot, &mailbox, e))?;
        let single_host = peers.iter().all(|q| q.host_id == peers[p.rank.idx()].host_id);
        let direct =
            if single_host && !p.config.shm_disable && p.config.direct && p.size > 1 && p.size <= 4096 {
                let d = direct::Direct::setup(
                    direct::Identity { me: p.rank, peers: &peers, secret: p.secret, cma: p.config.cma },
                    p.ctl.clone(),
                    p.doorbell.clone(),
                    &mailbox,
                    p.abort.clone(),
                    &w,
                )
                .map_err(|e| told(&boot, &mailbox, e))?;
                p.log.info(format_args!(
                    "direct path: {} ranks on this host read and write each other's memory",
                    p.size
                ));
                let which = match p.config.cma {
                    CrossMemory::All => "every collective beyond the inline area, and within it as auto \
                                         does (OXCCL_CMA=1)"
                        .to_string(),
                    _ => format!(
                        "{} (OXCCL_CMA=auto; =1: every collective, =0: none)",
                        oxccl_core::plan::hostdirect::cma_auto_described()
                    ),
                };
                match d.cross_memory() {
                    _ if p.config.cma == CrossMemory::Off => {}
                    Ok(()) => p.log.info(format_args!(
                        "direct path: heap buffers are read straight from peers' processes \
                         (process_vm_readv) for {which}"
                    )),
                    Err(why) => {
                        static ONCE: std::sync::Once = std::sync::Once::new();
                        ONCE.call_once(|| {
                            p.log.info(format_args!(
                            "direct path: heap buffers go through shared memory, not process_vm_readv: {why}"
                        ))
                        });
                    }
                }
                Some(d)
            } else {
                None
            };
        let flight = crate::flight::Recorder::new(
            p.config.flight_entries,
            crate::flight::Member {
                rank: p.rank.idx(),
                size: p.size,
                comm: format!("{:016x}", oxccl_core::uniqueid::comm_hash(&p.secret).0),
                peers: peers.iter().map(|q| (q.hostname.clone(), q.pid)).collect(),
            },
            p.config.flight_dir.clone(),
        );
        let mut engine = Engine::new(EngineCtx {
            boot: boot.clone(),
            flight: flight.clone(),
            me: p.rank,
            secret: p.secret,
            host_id: peers[p.rank.idx()].host_id,
            peers: peers.clone(),
            mailbox: mailbox.clone(),
            doorbell: p.doorbell.clone(),
            abort: p.abort.clone(),
            timeout: p.config.timeout,
            slots: tuning::SLOTS_PER_CONN,
            slot_bytes,
            shm_disable: p.config.shm_disable,
            check_calls: p.config.check_calls,
            numa: binding.numa,
            log: p.log,
        });
        engine.direct = direct;
        let inner = Arc::new(Inner {
            rank: p.rank,
            size: p.size,
            hash: oxccl_core::uniqueid::comm_hash(&p.secret),
            boot,
            flight,
            mailbox,
            secret: p.secret,
            peers,
            geometry,
            model,
            binding,
            log: p.log,
            abort: p.abort,
            doorbell: p.doorbell,
            service: Mutex::new(p.service),
            sockets: engine.sockets.clone(),
            engine: Mutex::new(engine),
            sched: Mutex::new(Sched::default()),
            sched_cv: Condvar::new(),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            split_seq: AtomicU64::new(0),
            shrink_seq: AtomicU64::new(0),
            worker: Mutex::new(None),
            herald: Mutex::new(herald),
            sparse_from: p.route.sparse_from,
            rma: std::sync::OnceLock::new(),
            config: p.config,
        });
        let comm = Communicator { inner };
        comm.connect_rings()?;
        Ok(comm)
    }

    /// Sets up every ring channel's connections now, so the first collective pays no setup
    /// and a transport that cannot work fails at init.
    fn connect_rings(&self) -> Result<()> {
        let i = &self.inner;
        if i.size == 1 {
            return Ok(());
        }
        let g = &i.geometry;
        let pos = g.ring.iter().position(|r| *r == i.rank).unwrap_or(0);
        let next = g.ring[(pos + 1) % i.size];
        let prev = g.ring[(pos + i.size - 1) % i.size];
        let mut needed = Vec::new();
        for c in 0..g.nchannels {
            let class = ConnClass::Ring(ChannelId(c as u16));
            needed.push((ConnKey { peer: next, class }, true));
            needed.push((ConnKey { peer: prev, class }, false));
        }
        let w = Waiter::new(i.rank, i.config.timeout, i.abort.clone())
            .watching(&i.mailbox)
            .probing(&i.boot, oxccl_core::contract::Sig::NONE, false)
            .announcing(i.config.wait_notice);
        let r = lock(&i.engine)
            .connect(&needed, &w)
            .map_err(|e| i.mailbox.explain(e, Duration::from_millis(REASON_WAIT_MS)));
        if let Err(e) = &r {
            i.fail(e);
        }
        r
    }

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
        c: oxccl_core::tuner::Coll,
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
        if let Some(r) = i.rma.get() {
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
        s.queue.push_back(Box::new(move |inner: &Inner| {
            let r = match inner.check_usable() {
                Ok(()) => inner.run_job(&ops, &bufs, what),
                Err(e) => Err(e),
            };
            done(r);
        }));
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
                cr,
                parents.len(),
                secret,
                doorbell.clone(),
                ctl.clone(),
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
        if let Some(r) = self.rma.get() {
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
