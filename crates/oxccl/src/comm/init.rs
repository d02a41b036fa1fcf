//! Forming a communicator: joining (from a unique id or the launcher's environment), then
//! assembling it from the peer table: lifelines first, then the direct path's control blocks
//! and the rings' connections, the tuner's model, the worker. Split and shrink assemble
//! their children here too.

use super::*;

/// The ring order: ranks of one host adjacent, hosts in order of their lowest rank.
fn ring_order(peers: &[PeerInfo]) -> Vec<Rank> {
    let host = host_indices(peers);
    let mut order: Vec<Rank> = peers.iter().map(|p| p.rank).collect();
    order.sort_by_key(|r| (host[r.idx()], r.0));
    order
}

/// The communicator's link between hosts: the slowest rail speed of its ranks (GB/s; 0
/// unless every rank knows its own) and the fewest rails any rank has (at least 1).
fn link_of(peers: &[PeerInfo]) -> (f64, usize) {
    let gbs = peers.iter().map(|p| p.nic_gbs).fold(f64::INFINITY, f64::min);
    let rails = peers.iter().map(|p| p.rails.len().max(1)).min().unwrap_or(1);
    (if gbs.is_finite() { gbs } else { 0.0 }, rails)
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

/// A rank's state between [`Communicator::prepare`] and joining.
struct Ready {
    rank: Rank,
    config: Config,
    log: Logger,
    doorbell: Arc<EventFd>,
    abort: Arc<AtomicBool>,
    ctl: Arc<Ctl>,
    service: Service,
    /// The addresses of this rank's rails (empty: the service's address alone).
    rails: Vec<std::net::IpAddr>,
}

pub(super) struct Parts {
    pub(super) ctl: Arc<Ctl>,
    pub(super) rank: Rank,
    pub(super) size: usize,
    pub(super) config: Config,
    pub(super) secret: [u8; 32],
    pub(super) peers: Vec<PeerInfo>,
    /// How the bootstrap went: sparse or not, and the threshold the communicator agreed on.
    pub(super) route: Route,
    /// Control connections the bootstrap opened (the table's relay to this rank's children).
    pub(super) links: HashMap<u32, TcpStream>,
    pub(super) service: Service,
    pub(super) doorbell: Arc<EventFd>,
    pub(super) abort: Arc<AtomicBool>,
    pub(super) log: Logger,
}

impl Communicator {
    /// Joins the communicator of `id` as `rank` of `size`.
    pub fn init(id: &UniqueId, size: usize, rank: Rank, config: Config) -> Result<Communicator> {
        Communicator::init_scalable(std::slice::from_ref(id), size, rank, config)
    }

    /// Joins the communicator of `ids` as `rank` of `size`, with one rendezvous root per id
    /// (NCCL's `ncclCommInitRankScalable`): the process that made `ids[k]` with
    /// [`crate::new_unique_id`] serves root `k`, rank `r` joins root
    /// [`root_of`](bootstrap::roots::root_of)`(r, size, ids.len())` (contiguous shares), and
    /// the roots join each other (`bootstrap::roots`). Every rank passes the same ids in the
    /// same order; the communicator's secret is `ids[0]`'s. One id is [`init`](Self::init).
    pub fn init_scalable(ids: &[UniqueId], size: usize, rank: Rank, config: Config) -> Result<Communicator> {
        // Bad arguments are this call's alone: the rank may call again with good ones.
        if size == 0 {
            return Err(CoreError::InvalidArgument {
                arg: "size",
                reason: "a communicator needs at least one rank".into(),
            }
            .into());
        }
        let rank = coll::check_rank("rank", rank.0 as i64, size)?;
        check_ids(ids, size)?;
        let k = bootstrap::roots::root_of(rank.idx(), size, ids.len());
        let id = &ids[k];
        let root = |e: Error, before_join: bool| {
            // This rank's rendezvous root may run in this process (rank 0's, usually). A rank
            // that gives up before joining, or that ran out of descriptors (which the root,
            // holding one per joined rank, is the likely cause of) tells it so, and it tells
            // the others rather than leave them waiting for a rank that never comes; this
            // process lasts until it has told them. Its reason is the cause every rank reports.
            let fds = crate::sys::limits::error_is_out_of_descriptors(&e);
            let abandon = (before_join || fds).then(|| crate::bootstrap::root::Abandon {
                rank: rank.0,
                size: u32::try_from(size).unwrap_or(u32::MAX),
                out_of_descriptors: fds,
                why: e.to_string(),
            });
            match crate::bootstrap::root::failure_here(&id.secret, abandon) {
                Some(reason) => Error::Rejected { rank, reason },
                None => e,
            }
        };
        let ready = Communicator::prepare(id.root.ip(), &ids[0].secret, size, rank, config)
            .map_err(|e| root(e, true))?;
        Communicator::start(ids, k, size, ready).map_err(|e| root(e, false))
    }

    /// What a rank sets up before it joins: its settings checked, its service started (on the
    /// interface nearest `root_ip`, admitting the communicator's `secret`).
    fn prepare(
        root_ip: std::net::IpAddr,
        secret: &[u8; 32],
        size: usize,
        rank: Rank,
        config: Config,
    ) -> Result<Ready> {
        config.validate()?;
        let log = Logger::new(&config, Some(rank.0));
        let ip = crate::rendezvous::choose_ip(&config, Some(root_ip), rank)?;
        let rails = crate::rendezvous::rails(&config, ip, rank)?;
        let doorbell = Arc::new(EventFd::new().map_err(|e| Error::io(rank, "eventfd", None, e))?);
        let abort = Arc::new(AtomicBool::new(false));
        let ctl =
            Arc::new(Ctl::create(rank.0).map_err(|e| Error::io(rank, "create the control block", None, e))?);
        let service =
            Service::start(ip, &rails, rank, size, *secret, doorbell.clone(), host_share(&ctl, rank)?, log)?;
        Ok(Ready { rank, config, log, doorbell, abort, ctl, service, rails })
    }

    /// Joins root `k` of `ids`, then assembles the communicator from the table.
    fn start(ids: &[UniqueId], k: usize, size: usize, ready: Ready) -> Result<Communicator> {
        let Ready { rank, config, log, doorbell, abort, ctl, service, rails } = ready;
        let nic_gbs = crate::rendezvous::nic_gbs(&config, service.addr.ip(), &rails);
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
                &|w| log.warn(format_args!("{w}")),
            ),
            cuda_device: config.cuda_device.unwrap_or(-1),
            rails,
            machine: host::machine_id(),
            nic_gbs,
        };
        let w = Waiter::new(rank, config.timeout, abort.clone())
            .watching(&service.mailbox)
            .announcing(config.wait_notice);
        let place = bootstrap::roots::Place {
            index: k as u32,
            nroots: ids.len() as u32,
            root0: ids[0].root,
            root0_secret: ids[0].secret,
            ids: ids.iter().map(|i| i.comm_hash().0).collect(),
        };
        let addrs: Vec<std::net::SocketAddr> = ids.iter().map(|i| i.root).collect();
        let rv = bootstrap::Rendezvous {
            root: ids[k].root,
            secret: &ids[k].secret,
            size,
            sparse_from: config.bootstrap_sparse_from,
            place: &place,
            roots: &addrs,
        };
        let id = &ids[0];
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

    pub(super) fn assemble(p: Parts) -> Result<Communicator> {
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
            hier_piece_bytes: tuning::HIER_PIECE_BYTES,
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
        // What the hosts hold, from the peer table (host hashes), the same on every rank; over
        // several hosts, the slowest rank's link (where every rank knows its own) and the
        // fewest rails.
        let model = oxccl_core::tuner::Model {
            hosts_uniform: geometry.cache.as_ref().is_some_and(|c| c.groups.is_some()),
            ..model
        };
        let (link_gbs, rails) = link_of(&peers);
        let model = if model.nhosts > 1 { model.with_link(link_gbs, rails) } else { model };
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
                    "cost model from rank 0's host ({}): copy {:.2} GB/s, hand-off {:.2} µs, TCP {:.1} µs {:.2} GB/s{}, LL {:.2} GB/s, LL128 {:.2} GB/s; all-reduce by size: {:?}{}, its protocol by size: {:?}",
                    if c.measured { "measured" } else { "built-in values" },
                    c.copy_gbs,
                    c.hop_us,
                    c.tcp_us,
                    c.tcp_gbs,
                    match (model.nhosts > 1, link_gbs > 0.0) {
                        (true, true) => format!(
                            "; between hosts {:.3} GB/s per stream, {:.3} GB/s per host ({rails} rail(s) of {:.3})",
                            model.net.channel_gbs, model.net.limit_gbs, link_gbs
                        ),
                        (true, false) => "; between hosts the link's speed unknown (OXCCL_NET_GBIT): TCP's here".into(),
                        _ => String::new(),
                    },
                    c.ll_gbs,
                    c.ll128_gbs,
                    geometry.select.as_ref().map(|s| s.all_reduce.clone()).unwrap_or_default(),
                    match geometry.select.as_ref().map(|s| s.hier_small_max) {
                        Some(b) if model.nhosts > 1 && b > 0 && b < usize::MAX => {
                            format!(" (Hier's hosts' first ranks in one exchange up to {b} B)")
                        }
                        _ => String::new(),
                    },
                    geometry
                        .select
                        .as_ref()
                        .map(|s| s.protos[oxccl_core::tuner::RingColl::AllReduce as usize].clone())
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
            if let Some(grp) =
                geometry.cache.as_ref().and_then(|c| c.groups.as_ref()).filter(|g| g.hosts() > 1)
            {
                let (h, l) = grp.place[p.rank.idx()];
                let list = |rs: &mut dyn Iterator<Item = Rank>| {
                    rs.map(|r| r.to_string()).collect::<Vec<_>>().join(" ")
                };
                p.log.info_in(
                    subsys::INIT | subsys::GRAPH,
                    format_args!(
                        "Hier: {} hosts × {} ranks; host {h} ring {} (shared memory), local index {l} ring across hosts {} (channels 0..{} each a connection per neighbour)",
                        grp.hosts(),
                        grp.local(),
                        list(&mut grp.members[h as usize].iter().copied()),
                        list(&mut grp.members.iter().map(|m| m[l as usize])),
                        geometry.nchannels,
                    ),
                );
                if p.rank.0 == 0 {
                    for line in grp.describe(geometry.nchannels, rails).lines() {
                        p.log.info_in(subsys::INIT | subsys::GRAPH, format_args!("{}", line.trim_start()));
                    }
                }
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
            any_next: Default::default(),
            worker: Mutex::new(None),
            herald: Mutex::new(herald),
            sparse_from: p.route.sparse_from,
            one_sided: std::sync::OnceLock::new(),
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
}

/// A scalable init's ids: at least one, at most one per rank and [`MAX_ROOTS`](bootstrap::roots::MAX_ROOTS),
/// no two the same.
fn check_ids(ids: &[UniqueId], size: usize) -> Result<()> {
    let bad = |reason: String| -> Error { CoreError::InvalidArgument { arg: "ids", reason }.into() };
    if ids.is_empty() {
        return Err(bad("no unique id (at least one is needed)".into()));
    }
    let most = size.min(bootstrap::roots::MAX_ROOTS);
    if ids.len() > most {
        return Err(bad(format!(
            "{} unique ids for {size} ranks (at most one per rank, and at most {})",
            ids.len(),
            bootstrap::roots::MAX_ROOTS
        )));
    }
    let mut seen: HashMap<[u8; 32], usize> = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        if let Some(j) = seen.insert(id.secret, i) {
            return Err(bad(format!(
                "ids[{j}] and ids[{i}] are the same unique id (each root needs its own)"
            )));
        }
    }
    Ok(())
}

/// What this rank's service hands same-host peers: its control block's descriptor and its
/// shared allocations' (bootstrap carries them without naming either).
pub(super) fn host_share(ctl: &Ctl, rank: Rank) -> Result<Arc<dyn HostDesk>> {
    let block = ctl.try_clone_fd().map_err(|e| Error::io(rank, "share the control block", None, e))?;
    Ok(Arc::new(crate::transport::host::Desk { block, allocation: crate::mem::fd_of }))
}
