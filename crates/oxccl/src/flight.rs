//! The flight recorder: each communicator keeps its last N calls (signature, state, start and
//! end times, error), and writes them as one self-describing JSON file per rank when it fails
//! (error, timeout), when it is aborted, or when the process gets SIGUSR1. [`analyze`] merges
//! the ranks' files and says which rank stopped first, at which call, and who waited for whom
//! (`oxccl analyze DUMP...`).
//!
//! Settings: `OXCCL_FLIGHT_RECORDER` (calls kept, default 2000, 0 off), `OXCCL_FLIGHT_DIR`
//! (where dumps go, default the temporary directory). File: `oxccl-flight-<comm>-r<rank>.json`.

use crate::error::Error;
use oxccl_core::contract::{CallKind, Sig};
use oxccl_core::json::{self, Mark};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sys::ticks::{unix_us as now_us, TickClock};

/// Calls kept by default.
pub const DEFAULT_ENTRIES: usize = 2000;

#[derive(Clone, Debug)]
struct Entry {
    id: u64,
    sig: Sig,
    what: &'static str,
    /// In the recorder's clock's ticks (Unix microseconds only in the dump: `sys::ticks`).
    start: u64,
    end: Option<u64>,
    error: Option<String>,
}

/// Who a recorder belongs to (written into every dump).
#[derive(Clone, Debug)]
pub struct Member {
    pub rank: usize,
    pub size: usize,
    pub comm: String,
    /// Every rank's (host, pid).
    pub peers: Vec<(String, u32)>,
}

/// One communicator's recent calls.
pub struct Recorder {
    cap: usize,
    ring: Mutex<VecDeque<Entry>>,
    next: AtomicU64,
    member: Member,
    dir: PathBuf,
    clock: TickClock,
}

impl Recorder {
    /// A recorder keeping `cap` calls (0: records nothing, dumps only the membership).
    pub fn new(cap: usize, member: Member, dir: Option<PathBuf>) -> Arc<Recorder> {
        let r = Arc::new(Recorder {
            cap,
            ring: Mutex::new(VecDeque::with_capacity(cap.min(4096))),
            next: AtomicU64::new(1),
            member,
            dir: dir.unwrap_or_else(std::env::temp_dir),
            clock: TickClock::new(),
        });
        signal::register(&r);
        r
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call begins; returns its id for [`end`](Self::end).
    #[inline]
    pub fn begin(&self, sig: Sig, what: &'static str) -> u64 {
        if self.cap == 0 {
            return 0;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut ring = self.lock();
        if ring.len() == self.cap {
            ring.pop_front();
        }
        ring.push_back(Entry { id, sig, what, start: self.clock.now(), end: None, error: None });
        id
    }

    /// Call `id` ended, with `error` if it failed.
    #[inline]
    pub fn end(&self, id: u64, error: Option<&Error>) {
        if id == 0 {
            return;
        }
        let mut ring = self.lock();
        if let Some(e) = ring.iter_mut().rev().find(|e| e.id == id) {
            e.end = Some(self.clock.now());
            e.error = error.map(|e| e.to_string());
        }
    }

    /// Where this rank's dump goes.
    pub fn path(&self) -> PathBuf {
        self.dir.join(format!("oxccl-flight-{}-r{}.json", self.member.comm, self.member.rank))
    }

    /// Writes the dump (replacing an earlier one), saying `why`.
    pub fn dump(&self, why: &str) -> std::io::Result<PathBuf> {
        let text = self.to_json(why);
        let path = self.path();
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// The dump: a [`Dump`] as JSON.
    fn to_json(&self, why: &str) -> String {
        let m = &self.member;
        let unix_us = self.clock.to_unix();
        let calls = self
            .lock()
            .iter()
            .map(|e| {
                let state = match (&e.end, &e.error) {
                    (None, _) => "running",
                    (Some(_), None) => "done",
                    (Some(_), Some(_)) => "failed",
                };
                let (seq, call) = if e.sig.kind == CallKind::P2p || !e.sig.checked() {
                    (None, e.what.to_string())
                } else {
                    (Some(e.sig.seq), e.sig.to_string())
                };
                Call {
                    id: e.id,
                    seq,
                    op: e.what.into(),
                    call,
                    state: state.into(),
                    start_us: unix_us(e.start),
                    end_us: e.end.map(&unix_us),
                    error: e.error.clone(),
                }
            })
            .collect();
        let dump = Dump {
            oxccl_flight_recorder: Mark,
            version: env!("CARGO_PKG_VERSION").into(),
            reason: why.into(),
            time_us: now_us(),
            host: crate::sys::host::hostname(),
            pid: std::process::id().into(),
            rank: m.rank,
            size: m.size,
            comm: m.comm.clone(),
            peers: m
                .peers
                .iter()
                .enumerate()
                .map(|(rank, (host, pid))| Peer { rank, host: host.clone(), pid: (*pid).into() })
                .collect(),
            calls,
        };
        json::to_text(&dump) + "\n"
    }
}

/// SIGUSR1: every live recorder of the process dumps. The handler only writes a byte to a
/// pipe; a thread reads it and dumps. Installed once, and only where the program has not set
/// a handler of its own.
mod signal {
    use super::Recorder;
    use std::sync::{Arc, Mutex, Once, Weak};

    static LIVE: Mutex<Vec<Weak<Recorder>>> = Mutex::new(Vec::new());
    static INSTALL: Once = Once::new();

    pub(super) fn register(r: &Arc<Recorder>) {
        {
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(r));
        }
        INSTALL.call_once(install);
    }

    fn install() {
        let Some(usr1) = crate::sys::signal::usr1_pipe() else { return };
        let _ = std::thread::Builder::new().name("oxccl-flight".into()).spawn(move || loop {
            if !usr1.wait() {
                return;
            }
            let live: Vec<Arc<Recorder>> =
                LIVE.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(|w| w.upgrade()).collect();
            for r in live {
                let _ = r.dump("SIGUSR1");
            }
        });
    }
}

// ---------------------------------------------------------------- analysis

/// One call as a dump records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub id: u64,
    /// The collective's number (`null`: a point-to-point or unchecked call).
    pub seq: Option<u64>,
    /// The API call (`all_reduce`).
    #[serde(default)]
    pub op: String,
    /// The call described (`all_reduce call #4 (float × 8, sum)`).
    pub call: String,
    /// `running`, `done` or `failed`.
    pub state: String,
    pub start_us: u64,
    pub end_us: Option<u64>,
    pub error: Option<String>,
}

/// Every rank of the communicator, as the dumping rank knew it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peer {
    pub rank: usize,
    pub host: String,
    pub pid: u64,
}

/// One rank's dump: the file's shape, field for field (times in Unix microseconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    pub oxccl_flight_recorder: Mark<1>,
    /// oxccl's version.
    #[serde(default)]
    pub version: String,
    /// Why it was written (`timeout`, `SIGUSR1`, …).
    pub reason: String,
    /// When it was written.
    #[serde(default)]
    pub time_us: u64,
    pub host: String,
    pub pid: u64,
    pub rank: usize,
    pub size: usize,
    pub comm: String,
    pub peers: Vec<Peer>,
    pub calls: Vec<Call>,
}

impl Dump {
    /// Reads a dump written by [`Recorder::dump`]; the error says what was wrong and where.
    pub fn parse(text: &str) -> Result<Dump, String> {
        json::check_mark(text, "oxccl_flight_recorder", 1, "an oxccl flight recorder dump")?;
        json::parse(text)
    }

    /// The last collective this rank started: (number, description, state).
    fn last_collective(&self) -> Option<&Call> {
        self.calls.iter().rev().find(|c| c.seq.is_some())
    }
}

/// The verdict over the ranks' dumps of one communicator: who stopped first, at which call,
/// who waited for whom, and the first error.
pub fn analyze(dumps: &[Dump]) -> Result<String, String> {
    let first = dumps.first().ok_or("no dumps")?;
    if let Some(d) = dumps.iter().find(|d| d.comm != first.comm) {
        return Err(format!("dumps of different communicators: {} and {}", first.comm, d.comm));
    }
    let size = first.size;
    let mut out = String::new();
    let _ = writeln!(out, "communicator {} of {size} ranks, {} dump(s)", first.comm, dumps.len());
    let have: Vec<usize> = dumps.iter().map(|d| d.rank).collect();
    for r in (0..size).filter(|r| !have.contains(r)) {
        let (h, pid) = first.peers.get(r).map(|p| (p.host.as_str(), p.pid)).unwrap_or_default();
        let _ = writeln!(out, "rank {r} (host {h}, pid {pid}): no dump (did its process die?)");
    }
    // Where each rank is: the last collective it entered (a rank in none yet: before #0).
    let mut at: Vec<(usize, Option<u64>)> = Vec::new();
    for d in dumps {
        let (seq, what) = match d.last_collective() {
            Some(c) => (c.seq, format!("{} ({})", c.call, c.state)),
            None => (None, "no collective yet".into()),
        };
        let _ = writeln!(
            out,
            "rank {} (host {}, pid {}): {what}; dumped because: {}",
            d.rank, d.host, d.pid, d.reason
        );
        at.push((d.rank, seq));
    }
    // The rank furthest behind stopped first; the others, in later calls, waited for it.
    let pos = |s: Option<u64>| s.map_or(0, |x| x + 1);
    if let Some(min) = at.iter().map(|a| pos(a.1)).min() {
        let behind: Vec<usize> = at.iter().filter(|a| pos(a.1) == min).map(|a| a.0).collect();
        let ahead: Vec<usize> = at.iter().filter(|a| pos(a.1) > min).map(|a| a.0).collect();
        let missing: Vec<usize> = (0..size).filter(|r| !have.contains(r)).collect();
        let d = dumps.iter().find(|d| d.rank == behind[0]).ok_or("internal: no dump")?;
        let last = d.last_collective();
        if !ahead.is_empty() {
            let next = at.iter().filter(|a| pos(a.1) > min).map(|a| pos(a.1) - 1).min().unwrap_or(min);
            let verdict = match last {
                Some(c) if c.state == "done" => format!(
                    "rank(s) {behind:?} stopped first, after {} (done): it never reached call #{next}, which rank(s) {ahead:?} waited in",
                    c.call
                ),
                Some(c) => format!(
                    "rank(s) {behind:?} stopped first, in {} ({}), while rank(s) {ahead:?} went on to call #{next}",
                    c.call, c.state
                ),
                None => format!("rank(s) {behind:?} stopped first, before any collective; rank(s) {ahead:?} waited in call #{next}"),
            };
            let _ = writeln!(out, "verdict: {verdict}");
        } else if !missing.is_empty() {
            let _ = writeln!(
                out,
                "verdict: every dumped rank is at the same call; rank(s) {missing:?} left no dump: they stopped first (waited for by all the others)"
            );
        } else {
            let _ =
                writeln!(out, "verdict: every rank reached the same call; none stopped before the others");
        }
    }
    // The first error anyone saw.
    if let Some((d, c)) = dumps
        .iter()
        .flat_map(|d| d.calls.iter().filter(|c| c.error.is_some()).map(move |c| (d, c)))
        .min_by_key(|(_, c)| c.end_us.unwrap_or(u64::MAX))
    {
        let _ =
            writeln!(out, "first error: rank {} in {}: {}", d.rank, c.call, c.error.as_deref().unwrap_or(""));
    }
    Ok(out)
}

/// Reads and analyzes dump files (`oxccl analyze`). Dumps of several communicators (a
/// directory where several runs left theirs) get a verdict each, the most recently written
/// communicator last.
pub fn analyze_files(paths: &[impl AsRef<Path>]) -> Result<String, String> {
    // Per communicator: its dumps and when the newest of them was written.
    let mut comms: Vec<(String, std::time::SystemTime, Vec<Dump>)> = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let t = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let d = Dump::parse(&t).map_err(|e| format!("{}: {e}", p.display()))?;
        let when = std::fs::metadata(p).and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
        match comms.iter_mut().find(|c| c.0 == d.comm) {
            Some(c) => {
                c.1 = c.1.max(when);
                c.2.push(d);
            }
            None => comms.push((d.comm.clone(), when, vec![d])),
        }
    }
    comms.sort_by_key(|c| c.1);
    let mut out = String::new();
    if comms.len() > 1 {
        let _ = writeln!(
            out,
            "{} communicators in these dumps; each gets its own verdict, the most recent last",
            comms.len()
        );
    }
    for (i, (_, _, mut dumps)) in comms.into_iter().enumerate() {
        dumps.sort_by_key(|d| d.rank);
        if i > 0 {
            out.push('\n');
        }
        out += &analyze(&dumps)?;
    }
    if out.is_empty() {
        return Err("no dumps".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_core::plan::{BufId, Loc, OpSpec};
    use oxccl_core::{DataType, ReduceOp};

    fn member(rank: usize) -> Member {
        Member {
            rank,
            size: 3,
            comm: "c0ffee".into(),
            peers: vec![("h0".into(), 10), ("h1".into(), 11), ("h2".into(), 12)],
        }
    }

    #[test]
    fn dumps_round_trip_and_the_verdict_names_the_rank_that_stopped() {
        let dir = std::env::temp_dir().join(format!("oxccl-flight-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let l = Loc::start(BufId(0));
        let ar = OpSpec::AllReduce { count: 8, dtype: DataType::F32, op: ReduceOp::Sum, src: l, dst: l };
        let mut paths = Vec::new();
        for r in 0..3 {
            let rec = Recorder::new(4, member(r), Some(dir.clone()));
            // Every rank makes calls #0..#5 (only the last 4 are kept); rank 2 stops after #4.
            let last = if r == 2 { 4 } else { 5 };
            for s in 0..=last {
                let id = rec.begin(Sig::of(&ar, s), "all_reduce");
                if s < 5 {
                    rec.end(id, None);
                } else if r == 0 {
                    let e = Error::Internal("a \"quoted\"\nmessage".into());
                    rec.end(id, Some(&e));
                }
            }
            paths.push(rec.dump(if r == 2 { "SIGUSR1" } else { "timeout" }).unwrap());
        }
        let d0 = Dump::parse(&std::fs::read_to_string(&paths[0]).unwrap()).unwrap();
        assert_eq!((d0.rank, d0.size, d0.calls.len()), (0, 3, 4));
        assert_eq!(d0.calls[3].error.as_deref(), Some("internal error: a \"quoted\"\nmessage"));
        assert_eq!(d0.calls[3].state, "failed");
        assert_eq!(d0.peers[2], Peer { rank: 2, host: "h2".into(), pid: 12 });
        let v = analyze_files(&paths).unwrap();
        assert!(v.contains("verdict: rank(s) [2] stopped first, after all_reduce call #4 (float × 8, sum) (done): it never reached call #5, which rank(s) [0, 1] waited in"), "{v}");
        assert!(v.contains("first error: rank 0 in all_reduce call #5"), "{v}");
        // A missing dump is named.
        let v = analyze_files(&paths[..2]).unwrap();
        assert!(v.contains("rank 2 (host h2, pid 12): no dump"), "{v}");
        assert!(v.contains("left no dump: they stopped first"), "{v}");
        // Another communicator's dump in the same set: each gets its own verdict, the most
        // recently written last.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let other = Recorder::new(4, Member { comm: "beef".into(), ..member(1) }, Some(dir.clone()));
        let id = other.begin(Sig::of(&ar, 0), "all_reduce");
        other.end(id, None);
        let mut mixed = paths.clone();
        mixed.insert(1, other.dump("timeout").unwrap());
        let v = analyze_files(&mixed).unwrap();
        assert!(v.starts_with("2 communicators in these dumps"), "{v}");
        let (c0, beef) = (v.find("communicator c0ffee").unwrap(), v.find("communicator beef").unwrap());
        assert!(c0 < beef, "the most recent last: {v}");
        assert!(v.contains("rank(s) [2] stopped first"), "{v}");
        // Garbage is refused with a reason.
        assert!(Dump::parse("{\"x\":1}").is_err());
        assert!(Dump::parse("[1,2").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    mod dump_format {
        use super::*;
        use proptest::prelude::*;

        /// Any text, with the escapes JSON writers get wrong more likely.
        fn text() -> impl Strategy<Value = String> {
            let c = prop_oneof![any::<char>(), Just('\u{8}'), Just('\u{c}'), Just('\r'), Just('😀')];
            prop::collection::vec(c, 0..8).prop_map(String::from_iter)
        }

        prop_compose! {
            fn call()(
                id in any::<u64>(), seq in any::<Option<u64>>(), op in text(), call in text(),
                state in text(), start_us in any::<u64>(), end_us in any::<Option<u64>>(),
                error in prop::option::of(text()),
            ) -> Call {
                Call { id, seq, op, call, state, start_us, end_us, error }
            }
        }

        prop_compose! {
            fn dump()(
                version in text(), reason in text(), time_us in any::<u64>(), host in text(),
                pid in any::<u64>(), rank in any::<usize>(), size in any::<usize>(), comm in text(),
                peers in prop::collection::vec((any::<usize>(), text(), any::<u64>()), 0..4),
                calls in prop::collection::vec(call(), 0..4),
            ) -> Dump {
                let peers = peers.into_iter().map(|(rank, host, pid)| Peer { rank, host, pid }).collect();
                Dump {
                    oxccl_flight_recorder: Mark, version, reason, time_us, host, pid, rank, size, comm,
                    peers, calls,
                }
            }
        }

        proptest! {
            #[test]
            fn any_dump_round_trips_exactly(d in dump()) {
                prop_assert_eq!(Dump::parse(&json::to_text(&d)).unwrap(), d);
            }
        }

        #[test]
        fn the_recorder_writes_the_documented_shape() {
            let dir = std::env::temp_dir();
            let rec = Recorder::new(4, Member { comm: "s\u{8}\u{c}\r😀".into(), ..member(1) }, Some(dir));
            let l = Loc::start(BufId(0));
            let ar = OpSpec::AllReduce { count: 8, dtype: DataType::F32, op: ReduceOp::Sum, src: l, dst: l };
            let id = rec.begin(Sig::of(&ar, 0), "all_reduce");
            rec.end(id, None);
            rec.begin(Sig::of(&ar, 1), "all_reduce");
            let text = rec.to_json("a \"why\"");
            let host = json::to_text(&crate::sys::host::hostname());
            let head = format!(
                "{{\"oxccl_flight_recorder\":1,\"version\":\"{}\",\"reason\":\"a \\\"why\\\"\",\"time_us\":",
                env!("CARGO_PKG_VERSION")
            );
            assert!(text.starts_with(&head), "{text}");
            let tail = format!(
                ",\"host\":{host},\"pid\":{},\"rank\":1,\"size\":3,\"comm\":\"s\\b\\f\\r😀\",\"peers\":[{{\"rank\":0,\"host\":\"h0\",\"pid\":10}},{{\"rank\":1,\"host\":\"h1\",\"pid\":11}},{{\"rank\":2,\"host\":\"h2\",\"pid\":12}}],\"calls\":[{{\"id\":1,\"seq\":0,\"op\":\"all_reduce\",\"call\":\"all_reduce call #0 (float × 8, sum)\",\"state\":\"done\",\"start_us\":",
                std::process::id()
            );
            assert!(text.contains(&tail), "{text}");
            assert!(text.ends_with(",\"end_us\":null,\"error\":null}]}\n"), "{text}");
            let d = Dump::parse(&text).unwrap();
            assert_eq!(d.comm, "s\u{8}\u{c}\r😀");
            assert_eq!(d.calls.len(), 2);
            assert_eq!(
                (d.calls[1].seq, d.calls[1].state.as_str(), d.calls[1].end_us),
                (Some(1), "running", None)
            );
        }

        #[test]
        fn large_numbers_round_trip_and_bad_ones_are_refused() {
            let text = r#"{"oxccl_flight_recorder": 1, "reason": "r", "host": "h", "pid": 9007199254740993, "rank": 0,
                "size": 1, "comm": "c", "peers": [],
                "calls": [{"id": 18446744073709551615, "seq": 9007199254740993, "call": "x", "state": "done",
                           "start_us": 9007199254740995, "end_us": null, "error": "\ud83d\ude00"}]}"#;
            let d = Dump::parse(text).unwrap();
            assert_eq!(d.pid, (1 << 53) + 1);
            let c = &d.calls[0];
            assert_eq!((c.id, c.seq, c.start_us), (u64::MAX, Some((1 << 53) + 1), (1 << 53) + 3));
            assert_eq!(c.error.as_deref(), Some("😀"));
            assert_eq!(Dump::parse(&json::to_text(&d)).unwrap(), d);
            let plus = text.replace("\"rank\": 0", "\"rank\": +0");
            let at = plus.find('+').unwrap() + 1;
            assert_eq!(Dump::parse(&plus).unwrap_err(), format!("expected value at line 1 column {at}"));
            let neg = text.replace("\"size\": 1", "\"size\": -1");
            assert_eq!(
                Dump::parse(&neg).unwrap_err(),
                "invalid value: integer `-1`, expected usize at line 2 column 26"
            );
            assert_eq!(
                Dump::parse("{\"oxccl_flight_recorder\": 2}").unwrap_err(),
                "not an oxccl flight recorder dump of version 1 (\"oxccl_flight_recorder\": 2)"
            );
        }

        #[test]
        fn a_truncated_dump_is_refused_naming_the_file_and_the_place() {
            let dir = std::env::temp_dir().join(format!("oxccl-flight-trunc-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let rec = Recorder::new(4, member(0), Some(dir.clone()));
            let path = rec.dump("timeout").unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            let cut = &text[..text.find("\"peers\"").unwrap() + 12];
            std::fs::write(&path, cut).unwrap();
            let e = analyze_files(&[&path]).unwrap_err();
            assert_eq!(
                e,
                format!(
                    "{}: EOF while parsing a string at line 1 column {}",
                    path.display(),
                    cut.chars().count()
                )
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
