//! From a launcher's rendezvous ([`oxccl_core::launch::Rendezvous`]) to the unique id every
//! rank of the job shares, and the unique id itself ([`new_unique_id`]: a root in this process).
//!
//! Rules:
//! 1. Only rank 0 creates an id (and runs the root); the others obtain rank 0's: from the
//!    environment, a file, an address where rank 0 listens, torchrun's agent store
//!    ([`tcpstore`]) or the launcher's PMIx server ([`crate::sys::pmix`]).
//! 2. Under torchrun's agent store nobody binds `MASTER_PORT` (the agent serves its store there).
//! 3. Every wait is bounded by the communicator's timeout and says on stderr, every
//!    `OXCCL_WAIT_NOTICE` seconds, what it waits for; a rank 0 that fails to create an id
//!    publishes why (store, PMIx), so the others fail with its reason instead of waiting.
//! 4. Several communicators from one launcher environment each take the next key
//!    (`oxccl/unique_id/<n>`): every rank must create them in the same order, as every
//!    rank makes the same calls.
//! 5. Which rendezvous was used is logged at `NCCL_DEBUG=INFO`.

pub mod tcpstore;

use crate::bootstrap::root;
use crate::error::{Error, Result};
use crate::log::Logger;
use crate::sys::ifaces;
use crate::wait::Waiter;
use oxccl_core::config::{subsys, Config};
use oxccl_core::launch::{LaunchEnv, Rendezvous};
use oxccl_core::uniqueid::UniqueId;
use oxccl_core::{ifname, tuning, Rank};
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Creates a unique id: starts the rendezvous root in this process, on the interface the
/// configuration selects. Pass the id (or its text form) to every rank.
pub fn new_unique_id(config: &Config) -> Result<UniqueId> {
    let log = Logger::new(config, None);
    let ip = choose_ip(config, None, Rank(0))?;
    let listener = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| Error::io(Rank(0), "bind the rendezvous root", None, e))?;
    let root = listener.local_addr().map_err(|e| Error::io(Rank(0), "rendezvous root", None, e))?;
    let mut secret = [0u8; 32];
    getrandom::getrandom(&mut secret).map_err(|e| Error::Internal(format!("no randomness: {e}")))?;
    root::spawn(listener, secret, log)
        .map_err(|e| Error::io(Rank(0), "start the rendezvous root", None, e))?;
    log.info(format_args!("rendezvous root listening on {root}"));
    Ok(UniqueId { root, secret })
}

/// The address this rank talks from: the interface the configuration selects (near `root`'s
/// address family when given).
pub(crate) fn choose_ip(config: &Config, root: Option<IpAddr>, rank: Rank) -> Result<IpAddr> {
    let list = ifaces::list().map_err(|e| Error::io(rank, "list network interfaces", None, e))?;
    let i = ifname::select(&list, config.socket_ifname.as_ref(), config.socket_family, root)?;
    Ok(i.addr)
}

/// The rails this rank spreads its TCP channels over (`oxccl_core::ifname::rails`), `ip`
/// among them; empty when `ip` carries everything.
pub(crate) fn rails(config: &Config, ip: IpAddr, rank: Rank) -> Result<Vec<IpAddr>> {
    let list = ifaces::list().map_err(|e| Error::io(rank, "list network interfaces", None, e))?;
    Ok(ifname::rails(&list, config.socket_ifname.as_ref(), ip).iter().map(|i| i.addr).collect())
}

/// Each rail's speed to other hosts, GB/s: `OXCCL_NET_GBIT` where set, else the slowest that
/// the kernel reports for the interfaces of `rails` (or of `ip` where there are none); 0 where
/// none is known.
pub(crate) fn nic_gbs(config: &Config, ip: IpAddr, rails: &[IpAddr]) -> f64 {
    if let Some(g) = config.net_gbit {
        return g / 8.0;
    }
    let Ok(list) = ifaces::list() else { return 0.0 };
    let addrs = if rails.is_empty() { std::slice::from_ref(&ip) } else { rails };
    let speeds: Vec<f64> = addrs
        .iter()
        .filter_map(|a| list.iter().find(|i| i.addr == *a))
        .filter_map(|i| ifaces::speed_gbit(&i.name))
        .collect();
    if speeds.len() < addrs.len() {
        return 0.0;
    }
    speeds.into_iter().fold(f64::INFINITY, f64::min) / 8.0
}

/// One interface this host's ranks would talk to other hosts from, as `oxccl topo` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub name: String,
    pub addr: IpAddr,
    /// Its speed, Gbit/s, and whether `OXCCL_NET_GBIT` said it (else the kernel did).
    pub gbit: Option<(f64, bool)>,
}

/// The interfaces this host's ranks would talk to other hosts from under `config`: the rails
/// where `NCCL_SOCKET_IFNAME` names several, else the one interface chosen, with their speeds.
pub fn links(config: &Config) -> Result<Vec<Link>> {
    let list = ifaces::list().map_err(|e| Error::io(Rank(0), "list network interfaces", None, e))?;
    let chosen = ifname::select(&list, config.socket_ifname.as_ref(), config.socket_family, None)?;
    let rails = ifname::rails(&list, config.socket_ifname.as_ref(), chosen.addr);
    let used = if rails.is_empty() { vec![chosen] } else { rails };
    Ok(used
        .into_iter()
        .map(|i| Link {
            name: i.name.clone(),
            addr: i.addr,
            gbit: match config.net_gbit {
                Some(g) => Some((g, true)),
                None => ifaces::speed_gbit(&i.name).map(|g| (g, false)),
            },
        })
        .collect())
}

/// How many ids this process has taken from a launcher's store (rule 4).
static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// The unique id of the job `l` describes: rank 0 creates it and publishes it the way the
/// launcher allows; the others obtain it.
pub fn unique_id(l: &LaunchEnv, config: &Config) -> Result<UniqueId> {
    let rank = Rank::new(l.rank);
    let log = Logger::new(config, Some(rank.0));
    log.info_in(
        subsys::BOOTSTRAP,
        format_args!(
            "rendezvous: {} (launcher: {}, rank {} of {})",
            l.rendezvous.describe(),
            l.launcher,
            l.rank,
            l.size
        ),
    );
    let w =
        Waiter::new(rank, config.timeout, Arc::new(AtomicBool::new(false))).announcing(config.wait_notice);
    match &l.rendezvous {
        Rendezvous::Id(id) => Ok(*id),
        Rendezvous::Alone => new_unique_id(config),
        Rendezvous::File(path) => by_file(path, rank, config, &w),
        Rendezvous::Addr { host, port, secret } => {
            if l.rank == 0 {
                let listener = TcpListener::bind(("0.0.0.0", *port))
                    .or_else(|_| TcpListener::bind(("::", *port)))
                    .map_err(|e| Error::Rendezvous {
                        rank,
                        through: format!("a root at {host}:{port} on rank 0"),
                        why: format!("cannot listen on port {port}: {e} (another program holds it? choose a free port)"),
                    })?;
                root::spawn(listener, *secret, log)
                    .map_err(|e| Error::io(rank, "start the rendezvous root", None, e))?;
            }
            let root = loop {
                if let Some(a) = (host.as_str(), *port).to_socket_addrs().ok().and_then(|mut a| a.next()) {
                    break a;
                }
                w.check(&format!("bootstrap: resolving {host}"), &[Rank(0)])?;
                std::thread::sleep(Duration::from_millis(tuning::CONNECT_RETRY_MS));
            };
            Ok(UniqueId { root, secret: *secret })
        }
        Rendezvous::TorchStore { host, port, prefix } => by_store(host, *port, prefix, rank, config, &w),
        Rendezvous::Pmix { namespace } => by_pmix(namespace, rank, config, &w),
    }
}

/// `OXCCL_UNIQUE_ID_FILE`: rank 0 writes the id there (atomically); the others wait for it.
fn by_file(path: &std::path::Path, rank: Rank, config: &Config, w: &Waiter) -> Result<UniqueId> {
    if rank.0 == 0 {
        let id = new_unique_id(config)?;
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, id.to_string())
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| Error::io(rank, "write the unique id file", None, e))?;
        return Ok(id);
    }
    let what = format!("bootstrap: waiting for rank 0's unique id file {}", path.display());
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            if let Ok(id) = t.parse::<UniqueId>() {
                return Ok(id);
            }
        }
        w.check(&what, &[Rank(0)])?;
        std::thread::sleep(Duration::from_millis(tuning::CONNECT_RETRY_MS));
    }
}

/// What rank 0 publishes in place of an id when it could not create one.
const FAILED: &str = "error: ";

/// torchrun's agent store: rank 0 sets the key, the others wait for it and read it.
fn by_store(
    host: &str,
    port: u16,
    prefix: &str,
    rank: Rank,
    config: &Config,
    w: &Waiter,
) -> Result<UniqueId> {
    let key = format!("oxccl/unique_id/{}", NEXT_KEY.fetch_add(1, Ordering::Relaxed));
    let mut store = tcpstore::Store::connect(host, port, prefix, w)?;
    if rank.0 == 0 {
        let made = new_unique_id(config);
        let text = match &made {
            Ok(id) => id.to_string(),
            Err(e) => format!("{FAILED}{e}"),
        };
        store.set(&key, text.as_bytes(), w)?;
        return made;
    }
    let what = format!("rank 0 to publish the unique id (key {prefix}/{key})");
    store.wait(&key, w, &what)?;
    let v = store.get(&key, w)?;
    parse_published(&String::from_utf8_lossy(&v), rank, &format!("torchrun's store at {host}:{port}"))
}

/// The launcher's PMIx server: rank 0 puts the id, a fence, the others get it.
fn by_pmix(namespace: &str, rank: Rank, config: &Config, w: &Waiter) -> Result<UniqueId> {
    let through = format!("PMIx (namespace {namespace})");
    let fail = |why: String| Error::Rendezvous { rank, through: through.clone(), why };
    let p = crate::sys::pmix::session().map_err(|e| {
        fail(format!(
            "{e}; set MASTER_ADDR and MASTER_PORT, OXCCL_ROOT_ADDR or OXCCL_UNIQUE_ID_FILE to meet without it"
        ))
    })?;
    let key = format!("oxccl.unique_id.{}", NEXT_KEY.fetch_add(1, Ordering::Relaxed));
    let made = (rank.0 == 0).then(|| new_unique_id(config));
    if let Some(m) = &made {
        let text = match m {
            Ok(id) => id.to_string(),
            Err(e) => format!("{FAILED}{e}"),
        };
        p.put(&key, &text).map_err(fail)?;
    }
    // The fence blocks in PMIx: wait for it on another thread, so this one can say what it
    // waits for and give up at the deadline.
    let timeout_s = config.timeout.map(|t| t.as_secs().clamp(1, u32::MAX as u64) as u32);
    let fenced = std::thread::scope(|s| -> Result<std::result::Result<(), String>> {
        let h = s.spawn(|| p.fence(timeout_s));
        let what = format!("rendezvous: waiting at the PMIx fence for every rank of namespace {namespace}");
        while !h.is_finished() {
            w.check(&what, &[])?;
            std::thread::sleep(Duration::from_millis(tuning::CONNECT_RETRY_MS));
        }
        Ok(h.join().unwrap_or_else(|_| Err("the fence's thread panicked".into())))
    })?;
    fenced.map_err(fail)?;
    match made {
        Some(m) => m,
        None => parse_published(&p.get_string(0, &key).map_err(fail)?, rank, &through),
    }
}

/// Rank 0's published id, or the error it published instead.
fn parse_published(text: &str, rank: Rank, through: &str) -> Result<UniqueId> {
    if let Some(why) = text.strip_prefix(FAILED) {
        return Err(Error::Rendezvous {
            rank,
            through: through.to_string(),
            why: format!("rank 0 could not create the unique id: {why}"),
        });
    }
    text.trim().parse::<UniqueId>().map_err(|e| Error::Rendezvous {
        rank,
        through: through.to_string(),
        why: format!("rank 0's unique id {text:?} does not parse: {e}"),
    })
}
