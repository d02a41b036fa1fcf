//! Several rendezvous roots (a scalable init, `ncclCommInitRankScalable`): which root each
//! rank joins, where a root stands among the others ([`Place`]), and the report a root
//! `k > 0` sends root 0 once its share of the ranks has joined ([`Report`], [`report`]).
//!
//! Rules:
//! 1. Root `k` of `R` serves a contiguous share of the ranks ([`share`], NCCL's split: the
//!    first `N mod R` roots take one rank more); each rank talks to its own root only.
//! 2. Every join names the root's index, `R`, root 0's address and secret, and every id's
//!    communicator hash: a root refuses ids that differ from its other joiners', naming the
//!    index that differs ([`RejectReason::MixedIds`]), and a rank outside its share
//!    ([`RejectReason::WrongRoot`]).
//! 3. Root `k > 0`, once its share has joined, connects to root 0 (authenticated by root 0's
//!    secret, which its ranks passed it) and sends its share's peer entries; root 0, once its
//!    own share and every other root have come, answers each root with the whole table and
//!    the sparse threshold of rank 0; then every root answers its own ranks (route, and the
//!    table as a single root does). A root that fails reports the failure to root 0 instead,
//!    and root 0's failure reaches every root that reported: every rank hears the reason.
//! 4. Nothing here blocks a root's thread: [`report`] runs on a helper thread and gives up
//!    when told to stop.

use super::{decode_reject, encode_reject};
use super::{kind, put_addr, write_frame, PeerInfo, PROTOCOL_VERSION};
use crate::error::RejectReason;
use oxccl_core::tuning::CONNECT_RETRY_MS;
use oxccl_core::wire::{Reader, Writer};
use oxccl_core::CoreError;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The most unique ids (roots) one communicator may be started with.
pub const MAX_ROOTS: usize = 1024;

const REPORT_MAGIC: u32 = u32::from_le_bytes(*b"OXRR");

/// The ranks root `k` of `nroots` serves, of `nranks` (rule 1).
pub fn share(k: usize, nranks: usize, nroots: usize) -> Range<usize> {
    let nroots = nroots.max(1);
    let (per, extra) = (nranks / nroots, nranks % nroots);
    let lo = k * per + k.min(extra);
    lo..lo + per + usize::from(k < extra)
}

/// The root that serves `rank` (rule 1); `nroots` at most `nranks`.
pub fn root_of(rank: usize, nranks: usize, nroots: usize) -> usize {
    let nroots = nroots.max(1);
    let (per, extra) = (nranks / nroots, nranks % nroots);
    let big = extra * (per + 1);
    if rank < big {
        rank / (per + 1)
    } else {
        extra + (rank - big) / per.max(1)
    }
}

/// Where a rank's root stands among the roots of its communicator (rule 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub index: u32,
    pub nroots: u32,
    /// Root 0's address and secret: root `index > 0` reports to it.
    pub root0: SocketAddr,
    pub root0_secret: [u8; 32],
    /// Every id's communicator hash, in order.
    pub ids: Vec<u64>,
}

impl Place {
    /// A single root's place.
    #[cfg(test)]
    pub fn single(root: SocketAddr, secret: &[u8; 32]) -> Place {
        Place {
            index: 0,
            nroots: 1,
            root0: root,
            root0_secret: *secret,
            ids: vec![oxccl_core::uniqueid::comm_hash(secret).0],
        }
    }

    pub fn encode(&self, w: &mut Writer) {
        w.u32(self.index).u32(self.nroots);
        put_addr(w, &self.root0);
        w.raw(&self.root0_secret);
        for h in &self.ids {
            w.u64(*h);
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Place, CoreError> {
        let (index, nroots) = (r.u32()?, r.u32()?);
        if nroots == 0 || nroots as usize > MAX_ROOTS || index >= nroots {
            return Err(CoreError::Malformed {
                what: "root place",
                reason: format!("root {index} of {nroots} (at most {MAX_ROOTS} roots)"),
            });
        }
        let root0 = super::get_addr(r)?;
        let root0_secret = r.fixed()?;
        let ids = (0..nroots).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        Ok(Place { index, nroots, root0, root0_secret, ids })
    }

    /// The first index where `other`'s ids differ from these (rule 2).
    pub fn first_difference(&self, other: &Place) -> Option<usize> {
        if self.ids.len() != other.ids.len() {
            return Some(self.ids.len().min(other.ids.len()));
        }
        self.ids.iter().zip(&other.ids).position(|(a, b)| a != b)
    }

    /// [`RejectReason::MixedIds`] for `other`'s ids, passed by `by`, if they differ.
    pub fn mixed(&self, other: &Place, by: String) -> Option<RejectReason> {
        let i = self.first_difference(other)?;
        let show = |p: &Place| p.ids.get(i).map_or("(none)".to_string(), |h| format!("{h:016x}"));
        Some(RejectReason::MixedIds { index: i as u32, by, theirs: show(other), ours: show(self) })
    }
}

/// What root `k > 0` tells root 0 (rule 3): its share joined (their entries), or it failed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Report {
    pub version: u32,
    /// Root 0's secret.
    pub secret: [u8; 32],
    /// The reporting root's own address (for messages).
    pub root: SocketAddr,
    pub place: Place,
    /// The world size the share's ranks claim.
    pub nranks: u32,
    pub outcome: Result<Vec<PeerInfo>, RejectReason>,
}

impl Report {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(REPORT_MAGIC).u32(self.version).raw(&self.secret).u32(self.nranks);
        put_addr(&mut w, &self.root);
        self.place.encode(&mut w);
        match &self.outcome {
            Ok(entries) => {
                w.u8(0).bytes(&super::encode_table(entries));
            }
            Err(why) => {
                w.u8(1).bytes(&encode_reject(why));
            }
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<Report, CoreError> {
        let mut r = Reader::new(b, "root report");
        if r.u32()? != REPORT_MAGIC {
            return Err(CoreError::Malformed { what: "root report", reason: "bad magic".into() });
        }
        let version = r.u32()?;
        if version != PROTOCOL_VERSION {
            return Err(CoreError::Malformed {
                what: "root report",
                reason: format!("protocol version {version}, not {PROTOCOL_VERSION}"),
            });
        }
        let (secret, nranks) = (r.fixed()?, r.u32()?);
        let root = super::get_addr(&mut r)?;
        let place = Place::decode(&mut r)?;
        let outcome = match r.u8()? {
            0 => Ok(super::decode_table(r.bytes()?)?),
            1 => Err(decode_reject(r.bytes()?)?),
            k => return Err(CoreError::Malformed { what: "root report", reason: format!("outcome {k}") }),
        };
        r.finish()?;
        Ok(Report { version, secret, root, place, nranks, outcome })
    }
}

/// Root 0's answer to a report: rank 0's sparse threshold and the whole table's bytes.
pub(crate) fn encode_answer(sparse_from: u32, table: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(sparse_from).raw(table);
    w.finish()
}

/// What became of a report.
pub(crate) enum Answer {
    /// Root 0's table (`sparse_from`, the table's bytes).
    Table(u32, Vec<u8>),
    /// Root 0 refused the communicator: the reason every rank hears.
    Rejected(RejectReason),
    /// Root 0 could not be reached or its connection broke.
    Lost(String),
}

/// Sends `rep` to root 0 at `rep.place.root0` and waits for its answer (rule 3), connecting
/// again while nothing listens there, until `stop` is set. A failure's report is sent, and
/// no answer awaited.
pub(crate) fn report(rep: &Report, stop: &AtomicBool) -> Answer {
    let to = rep.place.root0;
    let mut s = loop {
        if stop.load(Ordering::Acquire) {
            return Answer::Lost(format!("nothing answered at {to}"));
        }
        match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(CONNECT_RETRY_MS)),
        }
    };
    let _ = s.set_nodelay(true);
    let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
    if let Err(e) = write_frame(&mut s, kind::ROOT_REPORT, &rep.encode()) {
        return Answer::Lost(format!("sending the report to root 0 at {to}: {e}"));
    }
    if rep.outcome.is_err() {
        return Answer::Lost("failed".into());
    }
    let mut frames = Frames { s, stop, buf: Vec::new() };
    loop {
        match frames.next() {
            Err(e) => return Answer::Lost(format!("waiting for root 0 at {to}: {e}")),
            Ok((kind::GREET, g)) => {
                if super::frame(kind::GREET, &g) != super::greeting() {
                    return Answer::Lost(format!("{to} greeted as another protocol version"));
                }
            }
            Ok((kind::ROOT_TABLE, b)) if b.len() >= 4 => {
                let sparse_from = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                return Answer::Table(sparse_from, b[4..].to_vec());
            }
            Ok((kind::REJECT, b)) => {
                return match decode_reject(&b) {
                    Ok(why) => Answer::Rejected(why),
                    Err(e) => Answer::Lost(e.to_string()),
                }
            }
            Ok((k, _)) => return Answer::Lost(format!("root 0 at {to} answered frame kind {k}")),
        }
    }
}

/// Root `k > 0`'s report to root 0 under way (rule 3).
pub(crate) struct Linking {
    pub rx: std::sync::mpsc::Receiver<Answer>,
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Sends `rep` to root 0 on a helper thread; its answer comes on the channel.
pub(crate) fn link(rep: Report, until: Option<Instant>) -> Linking {
    let (tx, rx) = std::sync::mpsc::channel();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let _ = std::thread::Builder::new().name("oxccl-root-link".into()).spawn(move || {
        if let Some(t) = until {
            // A failure's report: bounded.
            let f = flag.clone();
            std::thread::spawn(move || {
                std::thread::sleep(t.saturating_duration_since(Instant::now()));
                f.store(true, std::sync::atomic::Ordering::Release);
            });
        }
        let _ = tx.send(report(&rep, &flag));
    });
    Linking { rx, stop }
}

/// Frames read from a root link, giving up when `stop` is set.
struct Frames<'a> {
    s: TcpStream,
    stop: &'a AtomicBool,
    buf: Vec<u8>,
}

impl Frames<'_> {
    fn next(&mut self) -> io::Result<(u8, Vec<u8>)> {
        let _ = self.s.set_read_timeout(Some(Duration::from_millis(100)));
        let mut chunk = vec![0u8; 64 << 10];
        let started = Instant::now();
        loop {
            if self.buf.len() >= 8 {
                let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
                if len > oxccl_core::tuning::MAX_BOOTSTRAP_FRAME_BYTES {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{len}-byte frame")));
                }
                if self.buf.len() >= 8 + len {
                    let k = self.buf[4];
                    let payload = self.buf[8..8 + len].to_vec();
                    self.buf.drain(..8 + len);
                    return Ok((k, payload));
                }
            }
            if self.stop.load(Ordering::Acquire) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer in {:.1} s", started.elapsed().as_secs_f64()),
                ));
            }
            match self.s.read(&mut chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_rank_once_in_order() {
        for n in [1usize, 2, 7, 8, 16, 100, 513] {
            for r in 1..=n.min(17) {
                let mut next = 0;
                for k in 0..r {
                    let s = share(k, n, r);
                    assert_eq!(s.start, next, "n {n} r {r} k {k}");
                    assert!(s.len() == n / r || s.len() == n / r + 1);
                    for rank in s.clone() {
                        assert_eq!(root_of(rank, n, r), k, "n {n} r {r} rank {rank}");
                    }
                    next = s.end;
                }
                assert_eq!(next, n);
            }
        }
        assert_eq!(share(1, 10, 4), 3..6);
        assert_eq!(share(3, 10, 4), 8..10);
    }

    #[test]
    fn a_report_survives_the_wire_and_ids_that_differ_are_named() {
        let a = Place {
            index: 2,
            nroots: 3,
            root0: "10.1.2.3:4000".parse().unwrap(),
            root0_secret: [9; 32],
            ids: vec![1, 2, 3],
        };
        let rep = Report {
            version: PROTOCOL_VERSION,
            secret: [9; 32],
            root: "10.1.2.4:4001".parse().unwrap(),
            place: a.clone(),
            nranks: 12,
            outcome: Err(RejectReason::RankOutOfRange { rank: 13, size: 12 }),
        };
        assert_eq!(Report::decode(&rep.encode()).unwrap(), rep);
        let b = Place { ids: vec![1, 5, 3], ..a.clone() };
        assert_eq!(a.first_difference(&b), Some(1));
        assert_eq!(a.first_difference(&a), None);
        match a.mixed(&b, "rank 4".into()) {
            Some(RejectReason::MixedIds { index: 1, by, theirs, ours }) => {
                assert_eq!(
                    (by.as_str(), theirs.as_str(), ours.as_str()),
                    ("rank 4", "0000000000000005", "0000000000000002")
                )
            }
            m => panic!("{m:?}"),
        }
        let mut w = Writer::new();
        Place { nroots: 0, ids: vec![], ..a }.encode(&mut w);
        assert!(Place::decode(&mut Reader::new(&w.finish(), "t")).is_err());
    }
}
