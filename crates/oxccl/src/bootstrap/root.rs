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

use super::{
    encode_reject, encode_table, kind, write_frame, Join, JoinStatus, PeerInfo, Route, PROTOCOL_VERSION,
};
use crate::bootstrap::service::same_secret;
use crate::error::RejectReason;
use crate::log::Logger;
use crate::sys::fd;
use oxccl_core::tuning::{HELLO_DEADLINE_MS, MAX_PENDING_CONNECTIONS};
use oxccl_core::Rank;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const MAX_JOIN_BYTES: usize = 4096;
const FAIL_LINGER: Duration = Duration::from_secs(60);
const STATUS_EVERY: Duration = Duration::from_millis(200);
/// A status frame is a few hundred bytes; a rank that cannot take it this fast is skipped.
const STATUS_WRITE_TIMEOUT: Duration = Duration::from_millis(100);

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
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name("oxccl-root".into()).spawn(move || run(listener, secret, log))?;
    Ok(())
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

/// What the joined set says: complete, broken (and why), or still waiting.
fn judge(joined: &BTreeMap<u32, Joined>) -> Option<Result<(), RejectReason>> {
    for (r, j) in joined {
        if *r >= j.nranks {
            return Some(Err(RejectReason::RankOutOfRange { rank: *r, size: j.nranks }));
        }
    }
    let root = joined.get(&0)?;
    for (r, j) in joined {
        if j.nranks != root.nranks {
            return Some(Err(RejectReason::WorldSizeMismatch {
                rank: *r,
                size: j.nranks,
                root_size: root.nranks,
            }));
        }
    }
    (joined.len() as u32 == root.nranks).then_some(Ok(()))
}

fn run(listener: TcpListener, secret: [u8; 32], log: Logger) {
    let mut pending: Vec<Pending> = Vec::new();
    let mut joined: BTreeMap<u32, Joined> = BTreeMap::new();
    let mut failed: Option<(RejectReason, Instant)> = None;
    let (mut changed, mut last_status) = (false, Instant::now());
    loop {
        if let Some((_, at)) = &failed {
            if at.elapsed() > FAIL_LINGER {
                return;
            }
        }
        let mut pfds = vec![fd::pollfd(listener.as_raw_fd(), libc::POLLIN)];
        pfds.extend(pending.iter().map(|p| fd::pollfd(p.s.as_raw_fd(), libc::POLLIN)));
        let _ = fd::poll(&mut pfds, Duration::from_millis(500));
        while let Ok((s, peer)) = listener.accept() {
            if pending.len() >= MAX_PENDING_CONNECTIONS || s.set_nonblocking(true).is_err() {
                log.warn(format_args!("root: dropping connection from {peer}: too many pending"));
                continue;
            }
            pending.push(Pending { s, peer, buf: Vec::new(), since: Instant::now() });
        }
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
            if let Some((why, _)) = &failed {
                reject(&mut p.s, why);
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
            joined.insert(
                j.rank,
                Joined { s: p.s, nranks: j.nranks, sparse_from: j.sparse_from, info: j.info },
            );
            changed = true;
        }
        pending = still;
        if failed.is_none() {
            match judge(&joined) {
                None => {}
                Some(Ok(())) => {
                    let table: Vec<PeerInfo> = joined.values().map(|j| j.info.clone()).collect();
                    let msg = encode_table(&table);
                    let sparse_from = joined.get(&0).map_or(0, |j| j.sparse_from);
                    let sparse = Route::is_sparse(table.len(), sparse_from as usize);
                    // Rank 0 first: in a sparse communicator every other rank waits for it.
                    for j in joined.values_mut() {
                        let ancestors = if sparse {
                            Route::ancestors_of(j.info.rank).iter().map(|a| table[a.idx()].addr).collect()
                        } else {
                            Vec::new()
                        };
                        let route = Route { sparse_from, sparse, ancestors };
                        let _ = j.s.set_write_timeout(Some(Duration::from_secs(10)));
                        let r = write_frame(&mut j.s, kind::ROUTE, &route.encode()).and_then(|_| {
                            if sparse && j.info.rank.0 != 0 {
                                Ok(())
                            } else {
                                write_frame(&mut j.s, kind::TABLE, &msg)
                            }
                        });
                        if let Err(e) = r {
                            log.warn(format_args!(
                                "root: cannot send the table to rank {}: {e}",
                                j.info.rank
                            ));
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
                    return;
                }
                Some(Err(why)) => {
                    log.warn(format_args!("root: rendezvous failed: {why}"));
                    failed = Some((why, Instant::now()));
                }
            }
        }
        if failed.is_none() && changed && last_status.elapsed() >= STATUS_EVERY {
            let msg = JoinStatus { missing: missing(&joined) }.encode();
            for j in joined.values_mut() {
                let _ = j.s.set_write_timeout(Some(STATUS_WRITE_TIMEOUT));
                let _ = write_frame(&mut j.s, kind::STATUS, &msg);
            }
            (changed, last_status) = (false, Instant::now());
        }
        if let Some((why, _)) = &failed {
            for (_, mut j) in std::mem::take(&mut joined) {
                reject(&mut j.s, why);
            }
        }
    }
}
