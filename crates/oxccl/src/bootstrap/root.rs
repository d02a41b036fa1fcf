//! The rendezvous root: collects every rank's join request and answers with the peer table.
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

use super::{
    encode_reject, encode_table, kind, relay_links, write_frame, Join, JoinStatus, PeerInfo, Route,
    PROTOCOL_VERSION,
};
use crate::bootstrap::service::same_secret;
use crate::error::RejectReason;
use crate::log::Logger;
use crate::sys::fd;
use oxccl_core::tuning::{HELLO_DEADLINE_MS, MAX_PENDING_CONNECTIONS};
use oxccl_core::Rank;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const MAX_JOIN_BYTES: usize = 4096;
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

/// The ranks not in `joined`, of the world size rank 0 (else any joined rank) claims.
fn missing(joined: &BTreeMap<u32, Joined>) -> Vec<Rank> {
    let size = joined.get(&0).or_else(|| joined.values().next()).map_or(0, |j| j.nranks);
    (0..size).filter(|r| !joined.contains_key(r)).take(JoinStatus::MAX_LISTED).map(Rank).collect()
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

/// Reads what is available; `Some(payload)` when a whole JOIN frame is in.
fn read_join(p: &mut Pending) -> Result<Option<Vec<u8>>, String> {
    loop {
        let need = if p.buf.len() < 8 {
            8
        } else {
            let len = u32::from_le_bytes([p.buf[0], p.buf[1], p.buf[2], p.buf[3]]) as usize;
            if len > MAX_JOIN_BYTES {
                return Err(format!("{len}-byte request"));
            }
            if p.buf[4] != kind::JOIN {
                return Err(format!("frame kind {}", p.buf[4]));
            }
            8 + len
        };
        if p.buf.len() == need && need > 8 {
            return Ok(Some(p.buf[8..].to_vec()));
        }
        let mut chunk = vec![0u8; need - p.buf.len()];
        match fd::recv_some(p.s.as_raw_fd(), &mut chunk) {
            Ok(None) => return Ok(None),
            Ok(Some(0)) => return Err("closed".into()),
            Ok(Some(n)) => p.buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// What the joined set says now that `new` joined: complete, broken (and why), or still
/// waiting. O(1) per join, except once, when rank 0 joins and sets the world size that every
/// rank already in must match.
fn judge(joined: &BTreeMap<u32, Joined>, new: u32) -> Option<Result<(), RejectReason>> {
    let j = joined.get(&new)?;
    if new >= j.nranks {
        return Some(Err(RejectReason::RankOutOfRange { rank: new, size: j.nranks }));
    }
    let root = joined.get(&0)?;
    let mismatch = |(r, j): (&u32, &Joined)| {
        (j.nranks != root.nranks).then_some(RejectReason::WorldSizeMismatch {
            rank: *r,
            size: j.nranks,
            root_size: root.nranks,
        })
    };
    let bad = if new == 0 { joined.iter().find_map(mismatch) } else { mismatch((&new, j)) };
    if let Some(why) = bad {
        return Some(Err(why));
    }
    (joined.len() as u32 == root.nranks).then_some(Ok(()))
}

/// How often joined ranks hear who is missing: every `STATUS_EVERY`, stretched so the root
/// writes at most `STATUS_WRITES_PER_SEC` status frames a second (at 100,000 ranks, one round
/// every 5 s): the root's time goes to taking joins.
fn status_interval(joined: usize) -> Duration {
    STATUS_EVERY.max(Duration::from_secs_f64(joined as f64 / STATUS_WRITES_PER_SEC))
}

/// Everyone joined: each rank gets its route, and the table (all ranks, or rank 0 alone in a
/// sparse communicator).
fn answer(joined: &mut BTreeMap<u32, Joined>, log: &Logger) {
    let table: Vec<PeerInfo> = joined.values().map(|j| j.info.clone()).collect();
    let msg = encode_table(&table);
    let sparse_from = joined.get(&0).map_or(0, |j| j.sparse_from);
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
                write_frame(&mut j.s, kind::TABLE, &msg)
            }
        });
        if let Err(e) = r {
            log.warn(format_args!("root: cannot send the table to rank {}: {e}", j.info.rank));
        }
    }
    log.info_in(
        oxccl_core::config::subsys::BOOTSTRAP,
        format_args!(
            "root: {} ranks joined; the table went {}",
            table.len(),
            if sparse { "to rank 0, to relay down the tree" } else { "to every rank" }
        ),
    );
}

fn run(listener: TcpListener, secret: [u8; 32], log: Logger) {
    let greeting = super::greeting();
    let mut pending: Vec<Pending> = Vec::new();
    let mut joined: BTreeMap<u32, Joined> = BTreeMap::new();
    let mut failed: Option<(RejectReason, Instant)> = None;
    // The ranks told of the failure (rank 0 is told last, once every other rank was, or after
    // RANK0_LAST_FOR).
    let mut told: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
    // The world size, rank 0's claim else the first (for whom to tell after a failure).
    let mut size: Option<(bool, u32)> = None;
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
        let _ = fd::poll(&mut pfds, Duration::from_millis(500));
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
        let mut complete = false;
        let mut still = Vec::new();
        for mut p in pending.drain(..) {
            let payload = match read_join(&mut p) {
                Ok(Some(b)) => b,
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
            if let Some((why, _)) = &failed {
                if j.rank == 0 && !joined.contains_key(&0) {
                    // Told last, below (rule 7).
                    let _ = p.s.set_nonblocking(false);
                    joined.insert(
                        0,
                        Joined { s: p.s, nranks: j.nranks, sparse_from: j.sparse_from, info: j.info },
                    );
                    continue;
                }
                reject(&mut p.s, why);
                told.insert(j.rank);
                continue;
            }
            if let Some(prev) = joined.get(&j.rank) {
                let why = RejectReason::DuplicateRank {
                    rank: j.rank,
                    first: prev.info.place(),
                    second: j.info.place(),
                };
                reject(&mut p.s, &why);
                failed = Some((why, Instant::now()));
                continue;
            }
            let _ = p.s.set_nonblocking(false);
            let rank = j.rank;
            joined
                .insert(rank, Joined { s: p.s, nranks: j.nranks, sparse_from: j.sparse_from, info: j.info });
            changed = true;
            if failed.is_none() {
                match judge(&joined, rank) {
                    Some(Err(why)) => {
                        log.warn(format_args!("root: rendezvous failed: {why}"));
                        failed = Some((why, Instant::now()));
                    }
                    Some(Ok(())) => complete = true,
                    None => {}
                }
            }
        }
        pending = still;
        if failed.is_none() && complete {
            answer(&mut joined, &log);
            forget(&secret);
            return;
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
            let msg = JoinStatus { missing: missing(&joined) }.encode();
            for j in joined.values_mut() {
                let _ = j.s.set_write_timeout(Some(STATUS_WRITE_TIMEOUT));
                let _ = write_frame(&mut j.s, kind::STATUS, &msg);
            }
            (changed, last_status) = (false, Instant::now());
        }
        if let Some((why, at)) = &failed {
            // Rank 0 hears it last: its process runs this thread, and ends once it knows. So
            // every other rank is told first, as it arrives (accepted and unread, queued on the
            // listener, or still starting: a root out of descriptors accepts them as the
            // rejected ones' descriptors free up), until all were or RANK0_LAST_FOR passed.
            let zero = joined.remove(&0);
            for (r, mut j) in std::mem::take(&mut joined) {
                reject(&mut j.s, why);
                told.insert(r);
            }
            // Every rank but rank 0 and the one of this process that gave up.
            let others = size.map_or(0, |(_, n)| n as usize).saturating_sub(1)
                - usize::from(gave_up.is_some_and(|r| r != 0));
            let done = told.len() >= others || at.elapsed() > RANK0_LAST_FOR;
            if let Some(mut z) = zero {
                if done {
                    reject(&mut z.s, why);
                } else {
                    joined.insert(0, z);
                }
            }
            // After rank 0's rejection is out: once told, this process may end.
            note_failure(&secret, why, done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_reject, Join};
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn every_rejection_survives_the_wire() {
        let all = [
            RejectReason::WrongSecret,
            RejectReason::WorldSizeMismatch { rank: 3, size: 4, root_size: 5 },
            RejectReason::DuplicateRank { rank: 1, first: "a:1".into(), second: "b:2".into() },
            RejectReason::RankOutOfRange { rank: 9, size: 4 },
            RejectReason::Version { ours: 4, theirs: 3 },
            RejectReason::RootOutOfDescriptors { joined: 1021, limit: 1024 },
            RejectReason::RootRankFailed { rank: 0, reason: "create the control block: oops".into() },
        ];
        for r in all {
            assert_eq!(decode_reject(&encode_reject(&r)).unwrap(), r);
        }
    }

    fn read_frame_raw(s: &mut TcpStream) -> (u8, Vec<u8>) {
        let mut h = [0u8; 8];
        s.read_exact(&mut h).unwrap();
        let mut b = vec![0u8; u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize];
        s.read_exact(&mut b).unwrap();
        (h[4], b)
    }

    /// The root alone at sizes a process can hold here (each join is a connection, two
    /// descriptors in this one process): how long from the first join to the last rank's
    /// answer, dense against sparse. A benchmark, run by hand:
    /// `OXCCL_ROOT_BENCH=1000,2000,4000,8000 cargo test --release -p oxccl --lib root_throughput -- --include-ignored --nocapture`
    #[test]
    #[ignore]
    fn root_throughput() {
        let sizes = super::super::tests::bench_sizes("OXCCL_ROOT_BENCH", "1000,2000,4000");
        // The table's codec at 100,000 entries: what each relay hop pays besides the wire.
        let (entry, decode_us) = super::super::table_codec_probe(100_000);
        println!("# table of 100000 entries: {entry:.1} B/entry, decode {decode_us:.3} us/entry");
        println!("# ranks  mode    joins sent (ms)  all answered (ms)  root bytes out  us/join");
        for n in sizes {
            for sparse in [false, true] {
                if !sparse && n > 4000 {
                    continue;
                }
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = listener.local_addr().unwrap();
                let secret = [7u8; 32];
                let log = Logger::new(&oxccl_core::config::Config::default(), None);
                spawn(listener, secret, log).unwrap();
                let t0 = Instant::now();
                let clients = 2;
                let hs: Vec<_> = (0..clients)
                    .map(|c| {
                        std::thread::spawn(move || {
                            let mine: Vec<usize> = (c..n).step_by(clients).collect();
                            let mut socks = Vec::with_capacity(mine.len());
                            for &r in &mine {
                                let mut s = TcpStream::connect(addr).unwrap();
                                let join = Join {
                                    version: PROTOCOL_VERSION,
                                    secret,
                                    rank: r as u32,
                                    nranks: n as u32,
                                    sparse_from: if sparse { 2 } else { 0 },
                                    info: PeerInfo {
                                        rank: Rank(r as u32),
                                        pid: 1000 + r as u32,
                                        host_id: (r / 8) as u64,
                                        hostname: format!("node{:05}", r / 8),
                                        addr: SocketAddr::from(([10, 0, (r >> 8) as u8, r as u8], 40000)),
                                        unix_name: [1; 16],
                                        costs: Default::default(),
                                        cuda_device: -1,
                                        rails: Vec::new(),
                                    },
                                };
                                s.write_all(&super::super::frame(kind::JOIN, &join.encode())).unwrap();
                                socks.push(s);
                            }
                            let sent = t0.elapsed();
                            let mut bytes = 0usize;
                            for (s, &r) in socks.iter_mut().zip(&mine) {
                                s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                                loop {
                                    let (k, b) = read_frame_raw(s);
                                    bytes += 8 + b.len();
                                    if k == kind::TABLE || (k == kind::ROUTE && sparse && r != 0) {
                                        break;
                                    }
                                }
                            }
                            (sent, t0.elapsed(), bytes)
                        })
                    })
                    .collect();
                let res: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
                let sent = res.iter().map(|r| r.0).max().unwrap();
                let done = res.iter().map(|r| r.1).max().unwrap();
                let bytes: usize = res.iter().map(|r| r.2).sum();
                println!(
                    "  {n:>6}  {:<6}  {:>15.1}  {:>17.1}  {:>14}  {:>7.1}",
                    if sparse { "sparse" } else { "dense" },
                    sent.as_secs_f64() * 1e3,
                    done.as_secs_f64() * 1e3,
                    bytes,
                    done.as_secs_f64() * 1e6 / n as f64
                );
            }
        }
    }
}
