//! The rendezvous root: collects every rank's join request and answers with the peer table.
//! With several roots (a scalable init, [`super::roots`]) each collects its share of the
//! ranks, the roots `k > 0` report theirs to root 0, and root 0's table reaches every share
//! through its root; the rules below hold for each root and its share, whose first rank
//! stands where rank 0 stands for a single root.
//!
//! Rules:
//! 1. A request with the wrong secret (or protocol version) is answered with a rejection and
//!    closed; it never disturbs the communicator being formed.
//! 2. The world size is rank 0's. A rank that claims another, a rank outside its own world
//!    size, or a rank that joins twice fails the whole rendezvous: every rank that joined (and
//!    every later one) receives the reason, naming the culprit, so no rank waits forever for a
//!    communicator that cannot form.
//! 3. Once ranks `0..size` have all joined, each receives its [`Route`] and then the table
//!    and the root exits. A sparse communicator (at least rank 0's `OXCCL_BOOTSTRAP_SPARSE_FROM`
//!    ranks) gets the table only at rank 0, which starts relaying it down the relay tree
//!    ([`super::relay_links`]): the root sends O(N) bytes, not N tables. After a failure it
//!    keeps answering late joiners for `FAIL_LINGER`, then exits.
//! 4. The thread never blocks on one client: every socket is non-blocking, requests are
//!    bounded in size and in the time they take to arrive.
//! 5. While the set is incomplete, joined ranks hear who is still missing (a status frame
//!    after joins, at most every `STATUS_EVERY`), so a rank that times out can name them.
//! 6. Every accepted connection is greeted at once ([`super::greeting`]), before its request
//!    is read: a joiner that reached another program instead learns it within
//!    `GREET_WAIT_MS`, from what that program said or did not say.
//! 7. After a failure rank 0 is told last, whenever it arrives: its process runs this thread
//!    and ends once rank 0 knows. A rank 0 whose own start fails in that process (it too may
//!    run out of descriptors) waits in [`failure_here`] until this thread is done telling the
//!    others, and reports the same reason.
//! 8. A rank of the root's process whose start fails before it joined, or that runs out of
//!    descriptors before the root noticed it had, tells the root so through [`failure_here`]:
//!    the root fails at once, with the descriptor limit or [`RejectReason::RootRankFailed`],
//!    and tells every rank (rule 7) instead of leaving them to wait for a rank that will never
//!    join.

use super::roots::{link, root_of, share, Answer, Linking, Place, Report};
use super::{
    decode_table, encode_reject, encode_table, kind, relay_links, write_frame, Join, JoinStatus, PeerInfo,
    Route, PROTOCOL_VERSION,
};
use crate::bootstrap::service::same_secret;
use crate::error::RejectReason;
use crate::log::Logger;
use crate::sys::fd;
use oxccl_core::tuning::{HELLO_DEADLINE_MS, MAX_BOOTSTRAP_FRAME_BYTES, MAX_PENDING_CONNECTIONS};
use oxccl_core::Rank;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A join: a peer entry, and 8 bytes per id of a scalable init.
const MAX_JOIN_BYTES: usize = 4096 + 8 * super::roots::MAX_ROOTS;
const FAIL_LINGER: Duration = Duration::from_secs(60);
/// After a failure, how long rank 0 (whose process runs the root, and ends once told) waits
/// for the other ranks to arrive and be told, unless all of them have been told before. Ranks
/// of a large job on a loaded host may still be starting when the root fails; the wait costs
/// only a job that has already failed. (CI runs that told only 4 to 16 of 79 ranks most
/// likely had rank 0 arrive after the failure, which then was told at once: rule 7 holds it.)
const RANK0_LAST_FOR: Duration = Duration::from_secs(10);
const STATUS_EVERY: Duration = Duration::from_millis(200);
/// A status frame is a few hundred bytes; a rank that cannot take it this fast is skipped.
const STATUS_WRITE_TIMEOUT: Duration = Duration::from_millis(100);
const STATUS_WRITES_PER_SEC: f64 = 20_000.0;

/// The ranks of this root's share not in `joined`.
fn missing(joined: &BTreeMap<u32, Joined>, share: &Range<u32>) -> Vec<Rank> {
    share.clone().filter(|r| !joined.contains_key(r)).take(JoinStatus::MAX_LISTED).map(Rank).collect()
}

/// What this root is, once its first join said: its place among the roots and its share of
/// the ranks (by the world size its first rank claims, else the first joiner's).
struct Role {
    place: Place,
    share: Range<u32>,
}

impl Role {
    fn new(place: Place, nranks: u32) -> Role {
        let r = share(place.index as usize, nranks as usize, place.nroots as usize);
        Role { place, share: r.start as u32..r.end as u32 }
    }
}

/// A root `k > 0` that reported its share (root 0 holds the connection to answer it).
struct Reported {
    s: TcpStream,
    addr: SocketAddr,
    place: Place,
    nranks: u32,
    entries: Vec<PeerInfo>,
}

struct Pending {
    s: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
    since: Instant,
}

struct Joined {
    s: TcpStream,
    nranks: u32,
    sparse_from: u32,
    info: PeerInfo,
}

/// Starts the root thread on `listener`.
pub(crate) fn spawn(listener: TcpListener, secret: [u8; 32], log: Logger) -> std::io::Result<()> {
    // All ranks connect at once.
    fd::widen_backlog(listener.as_raw_fd())?;
    listener.set_nonblocking(true)?;
    register(&secret);
    let spawned =
        std::thread::Builder::new().name("oxccl-root".into()).spawn(move || run(listener, secret, log));
    spawned.inspect_err(|_| forget(&secret))?;
    Ok(())
}

/// A root running in this process, by secret: what became of it.
struct Entry {
    secret: [u8; 32],
    state: State,
}

enum State {
    /// Forming the communicator; `abandoned` once the rank in this process could not start
    /// (rule 8): its rank, its world size and why.
    Running { abandoned: Option<Abandon> },
    /// Failed with this reason; `done` once every rank that could be told was (rule 7).
    Failed { why: RejectReason, done: bool },
}

/// A rank of the root's process giving up: before it joined, or out of descriptors (rule 8).
#[derive(Clone, Debug)]
pub(crate) struct Abandon {
    pub(crate) rank: u32,
    /// Its world size (whom the root must tell).
    pub(crate) size: u32,
    /// Its own error was the descriptor limit: the root's failure, seen first by this rank.
    pub(crate) out_of_descriptors: bool,
    pub(crate) why: String,
}

static ROOTS: std::sync::Mutex<Vec<Entry>> = std::sync::Mutex::new(Vec::new());
static ROOTS_CHANGED: std::sync::Condvar = std::sync::Condvar::new();

fn roots() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    ROOTS.lock().unwrap_or_else(|p| p.into_inner())
}

fn register(secret: &[u8; 32]) {
    let mut all = roots();
    all.retain(|e| !same_secret(&e.secret, secret));
    all.push(Entry { secret: *secret, state: State::Running { abandoned: None } });
}

/// The root formed its communicator (or never started): nothing of it is left to wait for.
fn forget(secret: &[u8; 32]) {
    roots().retain(|e| !same_secret(&e.secret, secret));
    ROOTS_CHANGED.notify_all();
}

fn note_failure(secret: &[u8; 32], why: &RejectReason, done: bool) {
    let mut all = roots();
    match all.iter_mut().find(|e| same_secret(&e.secret, secret)) {
        Some(Entry { state: State::Failed { done: d, .. }, .. }) => *d |= done,
        Some(e) => e.state = State::Failed { why: why.clone(), done },
        None => all.push(Entry { secret: *secret, state: State::Failed { why: why.clone(), done } }),
    }
    if done {
        ROOTS_CHANGED.notify_all();
    }
}

/// The abandonment the rank in this process left for the root of `secret`, if any.
fn abandoned(secret: &[u8; 32]) -> Option<Abandon> {
    match roots().iter().find(|e| same_secret(&e.secret, secret)) {
        Some(Entry { state: State::Running { abandoned }, .. }) => abandoned.clone(),
        _ => None,
    }
}

/// Called by a rank whose start failed: when the root of `secret` runs in this process and
/// failed, returns its reason once it is done telling the ranks (rule 7). `abandon`: this
/// rank gave up before it joined; a root still forming is told so and fails (rule 8). `None`
/// when no root of `secret` runs here, or it has not failed and this rank had joined.
pub(crate) fn failure_here(secret: &[u8; 32], mut abandon: Option<Abandon>) -> Option<RejectReason> {
    // The root looks at its entry at least every poll (500 ms).
    let until = Instant::now() + RANK0_LAST_FOR + Duration::from_secs(2);
    let mut all = roots();
    loop {
        let e = all.iter_mut().find(|e| same_secret(&e.secret, secret))?;
        let left = until.saturating_duration_since(Instant::now());
        match &mut e.state {
            State::Failed { why, done } if *done || left.is_zero() => return Some(why.clone()),
            State::Failed { .. } => {}
            // Already told (by this rank or another of this process): the root will fail.
            State::Running { abandoned: Some(_) } if !left.is_zero() => {}
            State::Running { abandoned } => {
                let mut a = abandon.take().filter(|_| !left.is_zero())?;
                // Sent to every rank: bounded as every failure's reason is.
                a.why = super::bounded(&a.why).to_string();
                *abandoned = Some(a);
            }
        }
        all = ROOTS_CHANGED.wait_timeout(all, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}

fn reject(s: &mut TcpStream, reason: &RejectReason) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let _ = write_frame(s, kind::REJECT, &encode_reject(reason));
}

/// Reads what is available; `Some((kind, payload))` when a whole JOIN (or, from another
/// root, ROOT_REPORT) frame is in.
fn read_join(p: &mut Pending) -> Result<Option<(u8, Vec<u8>)>, String> {
    loop {
        let need = if p.buf.len() < 8 {
            8
        } else {
            let len = u32::from_le_bytes([p.buf[0], p.buf[1], p.buf[2], p.buf[3]]) as usize;
            let limit = match p.buf[4] {
                kind::JOIN => MAX_JOIN_BYTES,
                kind::ROOT_REPORT => MAX_BOOTSTRAP_FRAME_BYTES,
                k => return Err(format!("frame kind {k}")),
            };
            if len > limit {
                return Err(format!("{len}-byte request"));
            }
            8 + len
        };
        if p.buf.len() == need && need > 8 {
            return Ok(Some((p.buf[4], p.buf[8..].to_vec())));
        }
        let mut chunk = vec![0u8; (need - p.buf.len()).min(1 << 20)];
        match fd::recv_some(p.s.as_raw_fd(), &mut chunk) {
            Ok(None) => return Ok(None),
            Ok(Some(0)) => return Err("closed".into()),
            Ok(Some(n)) => p.buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// What the joined set says now that `new` joined: complete, broken (and why), or still
/// waiting. The share's first rank (rank 0 for a single root) sets the world size that every
/// rank must match. O(1) per join, except once, when that rank joins and checks the ranks
/// already in.
fn judge(joined: &BTreeMap<u32, Joined>, new: u32, role: &Role) -> Option<Result<(), RejectReason>> {
    let j = joined.get(&new)?;
    if new >= j.nranks {
        return Some(Err(RejectReason::RankOutOfRange { rank: new, size: j.nranks }));
    }
    let (index, nroots) = (role.place.index, role.place.nroots);
    let wrong_root = |r: u32, n: u32| {
        let its = root_of(r as usize, n as usize, nroots as usize) as u32;
        (its != index).then_some(RejectReason::WrongRoot { rank: r, root: index, its_root: its, nroots })
    };
    let first = joined.get(&role.share.start);
    if first.is_none_or(|f| f.nranks == j.nranks) {
        if let Some(why) = wrong_root(new, j.nranks) {
            return Some(Err(why));
        }
    }
    let root = first?;
    let mismatch = |(r, j): (&u32, &Joined)| {
        (j.nranks != root.nranks).then_some(RejectReason::WorldSizeMismatch {
            rank: *r,
            size: j.nranks,
            root_size: root.nranks,
        })
    };
    let bad = if new == role.share.start {
        joined.iter().find_map(mismatch).or_else(|| joined.keys().find_map(|r| wrong_root(*r, root.nranks)))
    } else {
        mismatch((&new, j))
    };
    if let Some(why) = bad {
        return Some(Err(why));
    }
    (joined.len() == share(index as usize, root.nranks as usize, nroots as usize).len()).then_some(Ok(()))
}

/// Whether root `k`'s report agrees with this root 0 (`size`: rank 0's world size): the same
/// ids, the same world size, and exactly its share's ranks.
fn check_report(role: &Role, size: u32, k: u32, r: &Reported) -> Option<RejectReason> {
    if let Some(why) = role.place.mixed(&r.place, format!("root {k} (at {}) for its ranks", r.addr)) {
        return Some(why);
    }
    let want = share(k as usize, size as usize, role.place.nroots as usize);
    if r.nranks != size {
        return Some(RejectReason::WorldSizeMismatch {
            rank: want.start as u32,
            size: r.nranks,
            root_size: size,
        });
    }
    let exact =
        r.entries.len() == want.len() && r.entries.iter().zip(want.clone()).all(|(e, q)| e.rank.idx() == q);
    (!exact).then(|| RejectReason::RootFailed {
        root: k,
        addr: r.addr.to_string(),
        why: format!(
            "it reported {} entries, not its share's ranks {}..{}",
            r.entries.len(),
            want.start,
            want.end
        ),
    })
}

/// How often joined ranks hear who is missing: every `STATUS_EVERY`, stretched so the root
/// writes at most `STATUS_WRITES_PER_SEC` status frames a second (at 100,000 ranks, one round
/// every 5 s): the root's time goes to taking joins.
fn status_interval(joined: usize) -> Duration {
    STATUS_EVERY.max(Duration::from_secs_f64(joined as f64 / STATUS_WRITES_PER_SEC))
}

/// Everyone joined: each rank of this root's share gets its route, and the table (all ranks,
/// or rank 0 alone in a sparse communicator). `table` is the whole communicator's, `msg` its
/// bytes, `sparse_from` rank 0's threshold.
fn answer(
    joined: &mut BTreeMap<u32, Joined>,
    table: &[PeerInfo],
    msg: &[u8],
    sparse_from: u32,
    log: &Logger,
) {
    let sparse = Route::is_sparse(table.len(), sparse_from as usize);
    // Rank 0 first: in a sparse communicator every other rank waits for it.
    for j in joined.values_mut() {
        let (ancestors, children) = if sparse {
            let addrs = |v: Vec<Rank>| v.iter().map(|a| table[a.idx()].addr).collect();
            (addrs(Route::ancestors_of(j.info.rank)), addrs(relay_links(j.info.rank, table.len()).1))
        } else {
            (Vec::new(), Vec::new())
        };
        let route = Route { sparse_from, sparse, ancestors, children };
        let _ = j.s.set_write_timeout(Some(Duration::from_secs(10)));
        let r = write_frame(&mut j.s, kind::ROUTE, &route.encode()).and_then(|_| {
            if sparse && j.info.rank.0 != 0 {
                Ok(())
            } else {
                write_frame(&mut j.s, kind::TABLE, msg)
            }
        });
        if let Err(e) = r {
            log.warn(format_args!("root: cannot send the table to rank {}: {e}", j.info.rank));
        }
    }
    log.info_in(
        oxccl_core::config::subsys::BOOTSTRAP,
        format_args!(
            "root: {} of {} ranks joined here; the table went {}",
            joined.len(),
            table.len(),
            if sparse { "to rank 0, to relay down the tree" } else { "to every rank" }
        ),
    );
}

fn run(listener: TcpListener, secret: [u8; 32], log: Logger) {
    let greeting = super::greeting();
    let here = listener.local_addr().ok();
    let mut pending: Vec<Pending> = Vec::new();
    let mut joined: BTreeMap<u32, Joined> = BTreeMap::new();
    let mut failed: Option<(RejectReason, Instant)> = None;
    // The ranks told of the failure (the share's first rank, rank 0 for root 0, is told last,
    // once every other rank was, or after RANK0_LAST_FOR).
    let mut told: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
    // The world size, rank 0's claim else the first (for whom to tell after a failure, until
    // a join said which share this root serves).
    let mut size: Option<(bool, u32)> = None;
    let mut role: Option<Role> = None;
    // Root 0 of several: the other roots' reports. Root k > 0: its report under way.
    let mut reports: BTreeMap<u32, Reported> = BTreeMap::new();
    let mut linking: Option<Linking> = None;
    let (mut share_in, mut failure_reported) = (false, false);
    // The rank of this process that gave up before joining or forming (rule 8): not told.
    let mut gave_up: Option<u32> = None;
    let (mut changed, mut last_status) = (false, Instant::now());
    loop {
        if let Some((why, at)) = &failed {
            if at.elapsed() > FAIL_LINGER {
                note_failure(&secret, why, true);
                return;
            }
        }
        let mut pfds = vec![fd::pollfd(listener.as_raw_fd(), fd::POLLIN)];
        pfds.extend(pending.iter().map(|p| fd::pollfd(p.s.as_raw_fd(), fd::POLLIN)));
        // While root 0's answer is awaited, look at its channel often.
        let _ = fd::poll(&mut pfds, Duration::from_millis(if linking.is_some() { 2 } else { 500 }));
        let mut raised = false;
        loop {
            let (s, peer) = match listener.accept() {
                Ok(c) => c,
                Err(e) if crate::sys::limits::out_of_descriptors(&e) => {
                    // One connection per joined rank is held until all have joined: at scale,
                    // the soft limit (often 1024) is too low. Raise it once; if that is not
                    // enough, every rank hears why rather than timing out.
                    if !raised {
                        raised = true;
                        let limit = crate::sys::limits::raise_nofile();
                        log.info_in(
                            oxccl_core::config::subsys::BOOTSTRAP,
                            format_args!("root: out of file descriptors; soft limit now {limit}"),
                        );
                        continue;
                    }
                    if failed.is_none() {
                        let why = RejectReason::RootOutOfDescriptors {
                            joined: joined.len() as u32,
                            limit: crate::sys::limits::raise_nofile(),
                        };
                        log.warn(format_args!("root: rendezvous failed: {why}"));
                        failed = Some((why, Instant::now()));
                    }
                    break;
                }
                Err(_) => break,
            };
            if pending.len() >= MAX_PENDING_CONNECTIONS || s.set_nonblocking(true).is_err() {
                log.warn(format_args!("root: dropping connection from {peer}: too many pending"));
                continue;
            }
            // Greet at once: a joiner that reached something else instead (another program on
            // the port) learns so within GREET_WAIT_MS. Sixteen bytes fit any new socket's buffer.
            if (&s).write_all(&greeting).is_err() {
                continue;
            }
            pending.push(Pending { s, peer, buf: Vec::new(), since: Instant::now() });
        }
        let mut still = Vec::new();
        for mut p in pending.drain(..) {
            let (k, payload) = match read_join(&mut p) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    if p.since.elapsed() < Duration::from_millis(HELLO_DEADLINE_MS) {
                        still.push(p);
                    } else {
                        log.warn(format_args!("root: dropping {}: no request in time", p.peer));
                    }
                    continue;
                }
                Err(e) => {
                    log.warn(format_args!("root: dropping {}: {e}", p.peer));
                    continue;
                }
            };
            // The version first: a join of another version need not decode as this one's.
            let theirs = payload.get(4..8).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            if let Some(v) = theirs.filter(|v| *v != PROTOCOL_VERSION) {
                reject(&mut p.s, &RejectReason::Version { ours: PROTOCOL_VERSION, theirs: v });
                continue;
            }
            if k == kind::ROOT_REPORT {
                let rep = match Report::decode(&payload) {
                    Ok(r) => r,
                    Err(e) => {
                        log.warn(format_args!("root: dropping a root's report from {}: {e}", p.peer));
                        continue;
                    }
                };
                if !same_secret(&rep.secret, &secret) {
                    log.warn(format_args!("root: rejecting a root's report from {}: wrong secret", p.peer));
                    reject(&mut p.s, &RejectReason::WrongSecret);
                    continue;
                }
                if let Some((why, _)) = &failed {
                    reject(&mut p.s, why);
                    continue;
                }
                let idx = rep.place.index;
                let entries = match rep.outcome {
                    Ok(e) => e,
                    Err(why) => {
                        let why = RejectReason::RootFailed {
                            root: idx,
                            addr: rep.root.to_string(),
                            why: why.to_string(),
                        };
                        log.warn(format_args!("root: rendezvous failed: {why}"));
                        failed = Some((why, Instant::now()));
                        continue;
                    }
                };
                let _ = p.s.set_nonblocking(false);
                let r = Reported { s: p.s, addr: rep.root, place: rep.place, nranks: rep.nranks, entries };
                let twice = reports.contains_key(&idx) || idx == 0;
                let bad = if twice {
                    Some(RejectReason::RootFailed {
                        root: idx,
                        addr: r.addr.to_string(),
                        why: "a second root reported as this index".into(),
                    })
                } else {
                    role.as_ref().and_then(|role| {
                        let size = joined.get(&0).map_or(r.nranks, |z| z.nranks);
                        check_report(role, size, idx, &r)
                    })
                };
                if !twice {
                    reports.insert(idx, r);
                }
                if let Some(why) = bad {
                    log.warn(format_args!("root: rendezvous failed: {why}"));
                    failed = Some((why, Instant::now()));
                }
                changed = true;
                continue;
            }
            let j = match Join::decode(&payload) {
                Ok(j) => j,
                Err(e) => {
                    log.warn(format_args!("root: dropping {}: {e}", p.peer));
                    continue;
                }
            };
            if j.version != PROTOCOL_VERSION {
                reject(&mut p.s, &RejectReason::Version { ours: PROTOCOL_VERSION, theirs: j.version });
                continue;
            }
            if !same_secret(&j.secret, &secret) {
                log.warn(format_args!("root: rejecting {}: wrong secret", p.peer));
                reject(&mut p.s, &RejectReason::WrongSecret);
                continue;
            }
            if size.is_none_or(|(zero, _)| !zero) {
                size = Some((j.rank == 0, j.nranks));
            }
            let role = role.get_or_insert_with(|| Role::new(j.place.clone(), j.nranks));
            if j.rank == role.share.start {
                *role = Role::new(role.place.clone(), j.nranks);
            }
            let first = role.share.start;
            if let Some((why, _)) = &failed {
                if j.rank == first && !joined.contains_key(&first) {
                    // Told last, below (rule 7).
                    let _ = p.s.set_nonblocking(false);
                    joined.insert(
                        first,
                        Joined { s: p.s, nranks: j.nranks, sparse_from: j.sparse_from, info: j.info },
                    );
                    continue;
                }
                reject(&mut p.s, why);
                told.insert(j.rank);
                continue;
            }
            let elsewhere = (j.place.index != role.place.index).then_some(RejectReason::WrongRoot {
                rank: j.rank,
                root: role.place.index,
                its_root: j.place.index,
                nroots: role.place.nroots,
            });
            let mixed = role.place.mixed(&j.place, format!("rank {}", j.rank)).or(elsewhere);
            let dup = joined.get(&j.rank).map(|prev| RejectReason::DuplicateRank {
                rank: j.rank,
                first: prev.info.place(),
                second: j.info.place(),
            });
            if let Some(why) = mixed.or(dup) {
                log.warn(format_args!("root: rendezvous failed: {why}"));
                reject(&mut p.s, &why);
                told.insert(j.rank);
                failed = Some((why, Instant::now()));
                continue;
            }
            let _ = p.s.set_nonblocking(false);
            let rank = j.rank;
            joined
                .insert(rank, Joined { s: p.s, nranks: j.nranks, sparse_from: j.sparse_from, info: j.info });
            changed = true;
            match judge(&joined, rank, role) {
                Some(Err(why)) => {
                    log.warn(format_args!("root: rendezvous failed: {why}"));
                    failed = Some((why, Instant::now()));
                }
                Some(Ok(())) => share_in = true,
                None => {}
            }
        }
        pending = still;
        if let (None, true, Some(role)) = (&failed, share_in, &role) {
            let (index, nroots) = (role.place.index, role.place.nroots);
            if index == 0 && reports.len() + 1 == nroots as usize {
                // Every share is in (root 0's, and each other root's report): the whole table.
                let size = joined.get(&0).map_or(0, |z| z.nranks);
                match reports.iter().find_map(|(k, r)| check_report(role, size, *k, r)) {
                    Some(why) => {
                        log.warn(format_args!("root: rendezvous failed: {why}"));
                        failed = Some((why, Instant::now()));
                    }
                    None => {
                        let mut table: Vec<PeerInfo> = joined.values().map(|j| j.info.clone()).collect();
                        for r in reports.values_mut() {
                            table.append(&mut r.entries);
                        }
                        let msg = encode_table(&table);
                        let sparse_from = joined.get(&0).map_or(0, |z| z.sparse_from);
                        let to_roots = super::roots::encode_answer(sparse_from, &msg);
                        for (k, r) in reports.iter_mut() {
                            let _ = r.s.set_write_timeout(Some(Duration::from_secs(10)));
                            if let Err(e) = write_frame(&mut r.s, kind::ROOT_TABLE, &to_roots) {
                                log.warn(format_args!(
                                    "root: cannot send the table to root {k} at {}: {e}",
                                    r.addr
                                ));
                            }
                        }
                        answer(&mut joined, &table, &msg, sparse_from, &log);
                        forget(&secret);
                        return;
                    }
                }
            } else if index > 0 && linking.is_none() {
                let rep = Report {
                    version: PROTOCOL_VERSION,
                    secret: role.place.root0_secret,
                    root: here.unwrap_or(role.place.root0),
                    place: role.place.clone(),
                    nranks: joined.get(&role.share.start).map_or(0, |f| f.nranks),
                    outcome: Ok(joined.values().map(|j| j.info.clone()).collect()),
                };
                linking = Some(link(rep, None));
                changed = true;
            } else if index == 0 && nroots == 1 {
                let table: Vec<PeerInfo> = joined.values().map(|j| j.info.clone()).collect();
                let msg = encode_table(&table);
                let sparse_from = joined.get(&0).map_or(0, |z| z.sparse_from);
                answer(&mut joined, &table, &msg, sparse_from, &log);
                forget(&secret);
                return;
            }
        }
        if let Some(l) = &linking {
            let (root0, nranks) = role.as_ref().map_or((here, 0), |r| (Some(r.place.root0), r.share.len()));
            let root0 = root0.map_or("?".to_string(), |a| a.to_string());
            match l.rx.try_recv() {
                Ok(Answer::Table(sparse_from, msg)) => {
                    let size = joined.values().next().map_or(0, |j| j.nranks as usize);
                    match decode_table(&msg) {
                        Ok(table)
                            if table.len() == size
                                && table.len() >= nranks
                                && table.iter().enumerate().all(|(i, p)| p.rank.idx() == i) =>
                        {
                            answer(&mut joined, &table, &msg, sparse_from, &log);
                            forget(&secret);
                            return;
                        }
                        t => {
                            let why = RejectReason::RootFailed {
                                root: 0,
                                addr: root0,
                                why: match t {
                                    Ok(t) => format!(
                                        "it sent a table of {} entries for world size {size}",
                                        t.len()
                                    ),
                                    Err(e) => e.to_string(),
                                },
                            };
                            failed = Some((why, Instant::now()));
                        }
                    }
                }
                Ok(Answer::Rejected(why)) => failed = Some((why, Instant::now())),
                Ok(Answer::Lost(why)) => {
                    failed = Some((RejectReason::RootFailed { root: 0, addr: root0, why }, Instant::now()))
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    failed = Some((
                        RejectReason::RootFailed {
                            root: 0,
                            addr: root0,
                            why: "the report's thread ended".into(),
                        },
                        Instant::now(),
                    ))
                }
            }
            if failed.is_some() {
                l.stop.store(true, std::sync::atomic::Ordering::Release);
                linking = None;
                // The failure came from root 0 (or its link): root 0 needs no report of it.
                failure_reported = true;
            }
        }
        if let Some(a) = abandoned(&secret).filter(|_| failed.is_none()) {
            let (r, n) = (a.rank, a.size);
            let why = if a.out_of_descriptors {
                RejectReason::RootOutOfDescriptors {
                    joined: joined.len() as u32,
                    limit: crate::sys::limits::raise_nofile(),
                }
            } else {
                RejectReason::RootRankFailed { rank: r, reason: a.why }
            };
            log.warn(format_args!("root: rendezvous failed: {why}"));
            if size.is_none_or(|(zero, _)| !zero) {
                size = Some((r == 0, n));
            }
            joined.remove(&r);
            gave_up = Some(r);
            failed = Some((why, Instant::now()));
        }
        if failed.is_none() && changed && last_status.elapsed() >= status_interval(joined.len()) {
            let roots: Vec<u32> = match &role {
                Some(r) if r.place.index == 0 => {
                    (1..r.place.nroots).filter(|k| !reports.contains_key(k)).collect()
                }
                Some(_) if linking.is_some() => vec![0],
                _ => Vec::new(),
            };
            let share = role.as_ref().map_or(0..0, |r| r.share.clone());
            let msg = JoinStatus { missing: missing(&joined, &share), roots }.encode();
            for j in joined.values_mut() {
                let _ = j.s.set_write_timeout(Some(STATUS_WRITE_TIMEOUT));
                let _ = write_frame(&mut j.s, kind::STATUS, &msg);
            }
            (changed, last_status) = (false, Instant::now());
        }
        if let Some((why, at)) = &failed {
            // Root k > 0 tells root 0 (once), so every other share hears it too.
            if let Some(r) = role.as_ref().filter(|r| r.place.index > 0 && !failure_reported) {
                failure_reported = true;
                if let Some(l) = linking.take() {
                    l.stop.store(true, std::sync::atomic::Ordering::Release);
                }
                let rep = Report {
                    version: PROTOCOL_VERSION,
                    secret: r.place.root0_secret,
                    root: here.unwrap_or(r.place.root0),
                    place: r.place.clone(),
                    nranks: size.map_or(0, |(_, n)| n),
                    outcome: Err(why.clone()),
                };
                drop(link(rep, Some(Instant::now() + Duration::from_secs(10))));
            }
            // Root 0 tells the roots that reported.
            for (_, mut r) in std::mem::take(&mut reports) {
                reject(&mut r.s, why);
            }
            // The share's first rank hears it last: for root 0 that is rank 0, whose process
            // runs this thread, and ends once it knows. So every other rank is told first, as
            // it arrives (accepted and unread, queued on the listener, or still starting: a
            // root out of descriptors accepts them as the rejected ones' descriptors free up),
            // until all were or RANK0_LAST_FOR passed.
            let first = role.as_ref().map_or(0, |r| r.share.start);
            let zero = joined.remove(&first);
            for (r, mut j) in std::mem::take(&mut joined) {
                reject(&mut j.s, why);
                told.insert(r);
            }
            // Every rank of the share but its first and the one of this process that gave up.
            let expected = role.as_ref().map_or(size.map_or(0, |(_, n)| n as usize), |r| r.share.len());
            let others =
                expected.saturating_sub(1) - usize::from(gave_up.is_some_and(|r| r != first) && expected > 1);
            let done = told.len() >= others || at.elapsed() > RANK0_LAST_FOR;
            if let Some(mut z) = zero {
                if done {
                    reject(&mut z.s, why);
                } else {
                    joined.insert(first, z);
                }
            }
            // After rank 0's rejection is out: once told, this process may end.
            note_failure(&secret, why, done);
        }
    }
}

#[cfg(test)]
#[path = "root_tests.rs"]
mod tests;
