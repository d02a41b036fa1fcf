//! The sparse bootstrap (`OXCCL_BOOTSTRAP_SPARSE_FROM`): the peer table relayed down a tree of
//! ranks, control connections to neighbours only, word of a departure flooded over them.
//! Forced on at small rank counts here; it is the default from 128 ranks.

use oxccl::{Communicator, Config, Error, Rank, ReduceOp};
use oxccl_testkit::{child, epoch_ms, Launch};
use std::time::Duration;

oxccl_testkit::test_scope!();

fn sparse(n: usize) -> Config {
    Config::default()
        .with_timeout(Some(Duration::from_secs(60)))
        .with_bootstrap_sparse_from(n)
        .with_shm_disabled(true)
        .with_direct(false)
}

/// Every rank's table is the same and complete, each rank holds control connections to its
/// neighbours only (fewer than all), the relation is symmetric, and collectives and
/// sends/receives between ranks that are not neighbours give exact results.
#[test]
fn a_sparse_communicator_forms_and_runs_with_neighbour_lifelines() {
    for (n, per_host) in [(2, 1), (3, 3), (13, 4), (40, 8)] {
        let out = oxccl_testkit::threads(n, per_host, sparse(2), move |comm| {
            let (r, p) = (comm.rank().idx(), comm.size());
            let table: Vec<(u32, String)> =
                comm.peers().iter().map(|q| (q.rank.0, q.addr.to_string())).collect();
            let mut x = vec![(r + 1) as u64; 1000];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
            let want = (p * (p + 1) / 2) as u64;
            assert!(x.iter().all(|v| *v == want), "{n} ranks: all-reduce on rank {r}");
            // A send to the rank half way round (not a neighbour for n >= 13).
            let to = Rank::new((r + p / 2) % p);
            let from = Rank::new((r + p - p / 2) % p);
            let src = vec![r as u32; 777];
            let mut dst = vec![0u32; 777];
            let mut g = comm.group();
            g.send(&src, to).unwrap();
            g.recv(&mut dst, from).unwrap();
            g.end().unwrap();
            assert!(dst.iter().all(|v| *v == from.0), "{n} ranks: recv on rank {r}");
            let lifelines = comm.lifelines().to_vec();
            comm.destroy().unwrap();
            (table, lifelines)
        });
        for (r, (table, lifelines)) in out.iter().enumerate() {
            assert_eq!(table, &out[0].0, "{n} ranks: rank {r}'s table differs from rank 0's");
            assert_eq!(table.len(), n);
            assert!(table.iter().enumerate().all(|(i, (q, _))| *q as usize == i));
            assert!(!lifelines.contains(&Rank::new(r)) && !lifelines.is_empty() || n == 1);
            for q in lifelines {
                assert!(out[q.idx()].1.contains(&Rank::new(r)), "{n} ranks: {r} -> {q} not symmetric");
            }
            // Ring (2) + two trees (<= 3 each over hosts, chains inside) + relay tree (3).
            assert!(lifelines.len() <= 11, "{n} ranks: rank {r} has {} lifelines", lifelines.len());
            if n >= 40 {
                assert!(lifelines.len() < n - 1, "{n} ranks: rank {r} is connected to every peer");
            }
        }
        let most = out.iter().map(|o| o.1.len()).max().unwrap_or(0);
        oxccl_testkit::report!("sparse bootstrap: {n} ranks formed; at most {most} lifelines per rank");
    }
}

/// The same communicator with sparse off (threshold 0) or above its size keeps every peer
/// as a lifeline.
#[test]
fn below_the_threshold_every_peer_is_a_lifeline() {
    for from in [0, 9] {
        let out = oxccl_testkit::threads(8, 2, sparse(from), |comm| {
            let l = comm.lifelines().to_vec();
            comm.destroy().unwrap();
            l
        });
        for (r, l) in out.iter().enumerate() {
            let want: Vec<Rank> = (0..8).filter(|q| *q != r).map(Rank::new).collect();
            assert_eq!(l, &want, "threshold {from}: rank {r}");
        }
    }
}

/// Rank 0's threshold holds for all: ranks that ask otherwise go along with it.
#[test]
fn rank_zeros_threshold_decides() {
    let id = oxccl::new_unique_id(&Config::default()).unwrap();
    let n = 12;
    let hs: Vec<_> = (0..n)
        .map(|r| {
            // Rank 0 asks for sparse from 2; the others for never.
            let config = sparse(if r == 0 { 2 } else { 0 });
            std::thread::spawn(move || {
                let comm = Communicator::init(&id, n, Rank::new(r), config).unwrap();
                let mut x = [r as u32 + 1];
                comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                assert_eq!(x[0], 78);
                let l = comm.lifelines().len();
                comm.destroy().unwrap();
                l
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let l = h.join().unwrap();
        assert!(l < n - 1, "rank {r}: {l} lifelines: rank 0's threshold did not hold");
    }
}

// ---------------------------------------------------------------- departures

/// Every rank: init, then all-reduces until one fails; prints the first error's culprit.
/// With `idle`, nobody calls after the victim dies; the victim's own lifelines do nothing at
/// all and the others only ask `check()`: word can reach them only through the heralds.
fn victim_rank(ctx: oxccl_testkit::ChildCtx) {
    let (victim, idle) = ctx.args.split_once(' ').unwrap();
    let (victim, idle): (usize, bool) = (victim.parse().unwrap(), idle == "idle");
    let comm = Communicator::from_env().unwrap();
    let me = comm.rank().idx();
    println!("READY {} {}", epoch_ms(), comm.lifelines().len());
    let mut x = vec![1u32; 256];
    if idle {
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        // Every rank is done with the call (its data delivered) before the victim goes.
        std::thread::sleep(Duration::from_millis(300));
        if me == victim {
            println!("DYING {}", epoch_ms());
            std::process::exit(3);
        }
        if comm.lifelines().contains(&Rank::new(victim)) {
            println!("NEIGHBOUR");
            std::thread::sleep(Duration::from_millis(3000));
            return;
        }
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Err(e) = comm.check() {
                report_err(&e, 1000);
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        println!("NOWORD");
        return;
    }
    for i in 0.. {
        if me == victim && i == 20 {
            // Dies without a word, in the middle of the run.
            println!("DYING {}", epoch_ms());
            std::process::exit(3);
        }
        if let Err(e) = comm.all_reduce_in_place(&mut x, ReduceOp::Sum) {
            report_err(&e, 500);
            return;
        }
        x.fill(1);
    }
}

/// A rank that dies mid-run is named by every survivor within 2 s, though most survivors
/// hold no connection to it: word floods the lifelines.
#[test]
fn a_dead_rank_is_named_by_every_survivor_through_the_lifelines() {
    if let Some(ctx) = child("victim") {
        return victim_rank(ctx);
    }
    let n = 24;
    for (victim, mode) in [(0usize, "busy"), (13, "busy"), (0, "idle"), (13, "idle"), (23, "idle")] {
        let id = oxccl::new_unique_id(&Config::default()).unwrap();
        let outs =
            match Launch::new("a_dead_rank_is_named_by_every_survivor_through_the_lifelines", "victim", n)
                .args(&format!("{victim} {mode}"))
                .env("OXCCL_UNIQUE_ID", &id.to_string())
                .env("NCCL_SHM_DISABLE", "1")
                .env("OXCCL_BOOTSTRAP_SPARSE_FROM", "2")
                .env("OXCCL_TIMEOUT", "20")
                .timeout(Duration::from_secs(120))
                .run_keep()
            {
                Ok(o) => o,
                // The victim's own exit status is not a success.
                Err((o, _)) if o.len() == n => o,
                Err((o, e)) => panic!("launch: {e}: {} outputs", o.len()),
            };
        assert_eq!(outs[victim].status.and_then(|s| s.code()), Some(3), "the victim did not die as planned");
        let dump = || {
            outs.iter()
                .map(|o| format!("--- rank {}:\n{}\n{}\n", o.rank, o.stdout, o.stderr_tail(10)))
                .collect::<String>()
        };
        let died_ms: u128 = outs[victim]
            .stdout
            .lines()
            .find_map(|l| l.find("DYING ").map(|i| &l[i + 6..]))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("the victim did not say when it died\n{}", dump()));
        let mut told = 0;
        for o in outs.iter().filter(|o| o.rank != victim && !o.stdout.contains("NEIGHBOUR")) {
            told += 1;
            let ready = o
                .stdout
                .lines()
                .find_map(|l| l.find("READY ").map(|i| &l[i..]))
                .unwrap_or_else(|| panic!("rank {} not ready\n{}", o.rank, dump()));
            let lifelines: usize = ready.split_whitespace().nth(2).unwrap().parse().unwrap();
            assert!(lifelines < n - 1, "rank {}: {lifelines} lifelines", o.rank);
            assert!(
                !o.stdout.contains("NOWORD"),
                "rank {}: no word of the death in 10 s\n{}",
                o.rank,
                dump()
            );
            let err = o
                .stdout
                .lines()
                .find_map(|l| l.find("ERR ").map(|i| &l[i..]))
                .unwrap_or_else(|| panic!("rank {}: no error\n{}", o.rank, dump()));
            let mut f = err.split_whitespace();
            let (ms, named): (u128, i64) =
                (f.nth(1).unwrap().parse().unwrap(), f.next().unwrap().parse().unwrap());
            assert_eq!(named, victim as i64, "rank {} names {named}, not {victim}: {err}", o.rank);
            assert!(
                ms.saturating_sub(died_ms) < 2000,
                "rank {}: {} ms after the death",
                o.rank,
                ms.saturating_sub(died_ms)
            );
        }
        if mode == "idle" {
            assert!(
                told >= n / 2,
                "only {told} ranks were not the victim's lifelines: the test shows little"
            );
        }
        oxccl_testkit::report!(
            "sparse ({mode}): rank {victim} of {n} died; all {told} survivors that watched named it within 2 s"
        );
    }
}

/// Prints `ERR <ms> <named rank or -1> | <error>` for the parent to read, then lingers
/// `linger_ms` (so the process does not end before its word is out).
fn report_err(e: &Error, linger_ms: u64) {
    let named = match e {
        Error::PeerClosed { peer, .. } | Error::PeerFailed { peer, .. } => peer.idx() as i64,
        _ => -1,
    };
    println!("ERR {} {named} | {e}", epoch_ms());
    std::thread::sleep(Duration::from_millis(linger_ms));
}

/// A rank of `a_root_out_of_descriptors_is_named_to_every_rank`: rank 0 (whose process runs
/// the root) first caps its descriptors at `FD_CAP`, soft and hard, so the root cannot raise
/// it. With `RANK0_LATE_MS` set, rank 0 starts the root, then waits that long before it
/// joins; ranks from `LATE_FROM` on wait `LATE_MS` before they start.
fn fd_capped_rank() {
    let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let rank = num("OXCCL_RANK") as usize;
    let late = num("RANK0_LATE_MS");
    if rank > 0 && num("LATE_FROM") > 0 && rank >= num("LATE_FROM") as usize {
        std::thread::sleep(Duration::from_millis(num("LATE_MS")));
    }
    if rank == 0 {
        let l = libc::rlimit { rlim_cur: FD_CAP, rlim_max: FD_CAP };
        // SAFETY: setrlimit on a local struct, before any thread of this process is started.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) }, 0);
    }
    let joined = if rank == 0 && late > 0 {
        let cfg = oxccl::env::config().expect("settings");
        let l = oxccl::env::launch().expect("launcher").expect("a launcher");
        let id = oxccl::rendezvous::unique_id(&l, &cfg).expect("the unique id");
        // With PAD_FREE, only that many descriptors are left free (the rest held open here):
        // ranks 1 to PAD_FREE take them all without the root running out, and rank 0 runs out
        // in its own start, before the root noticed.
        let mut pad = Vec::new();
        if num("PAD_FREE") > 0 {
            let open = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64 - 1);
            while open() + num("PAD_FREE") < FD_CAP {
                pad.push(std::fs::File::open("/dev/null").expect("a descriptor"));
            }
        }
        std::thread::sleep(Duration::from_millis(late));
        Communicator::init(&id, l.size, Rank(0), cfg)
    } else {
        Communicator::from_env()
    };
    match joined {
        Ok(c) => {
            println!("JOINED");
            let _ = c.destroy();
        }
        Err(e) => println!("ERR {e}"),
    }
}

const FD_CAP: libc::rlim_t = 64;

/// The root holds one connection per joined rank until all have joined. When its process
/// runs out of descriptors (and cannot raise its limit), every rank that had joined is told
/// why, naming the limit, instead of waiting for its timeout; so is every rank that arrives
/// while rank 0 (told last: its process runs the root) waits for them, and so is rank 0, also
/// when it arrives after the failure. Ranks that come later still find the root gone and say so.
#[test]
fn a_root_out_of_descriptors_is_named_to_every_rank() {
    if let Some(_ctx) = child("fdcap") {
        return fd_capped_rank();
    }
    descriptors_run_out(0, None, 0);
    // Rank 0 arrives after the failure, and ranks 60 to 79 after rank 0: all are told.
    descriptors_run_out(1000, Some((60, 2500)), 0);
    // Ranks 1 to 20 take the last free descriptors, rank 0 runs out in its own start before
    // the root noticed, ranks 21 to 79 come after: the root hears it from rank 0 and tells all.
    descriptors_run_out(2000, Some((21, 3500)), 20);
}

fn descriptors_run_out(rank0_late_ms: u64, later: Option<(usize, u64)>, pad_free: u64) {
    let n = 80;
    let dir = Launch::scratch();
    let idfile = dir.join("unique-id").to_string_lossy().into_owned();
    let outs = match Launch::new("a_root_out_of_descriptors_is_named_to_every_rank", "fdcap", n)
        .env("OXCCL_UNIQUE_ID_FILE", &idfile)
        .env("NCCL_SHM_DISABLE", "1")
        .env("OXCCL_TIMEOUT", "15")
        .env("RANK0_LATE_MS", &rank0_late_ms.to_string())
        .env("LATE_FROM", &later.map_or(0, |l| l.0).to_string())
        .env("LATE_MS", &later.map_or(0, |l| l.1).to_string())
        .env("PAD_FREE", &pad_free.to_string())
        .timeout(Duration::from_secs(120))
        .run_keep()
    {
        Ok(o) => o,
        Err((o, e)) => panic!("launch: {e}: {} outputs", o.len()),
    };
    let limit = format!("ran out of file descriptors after {{}} ranks joined: its limit is {FD_CAP}");
    let (head, tail) = limit.split_once("{}").expect("a placeholder");
    let (mut named, mut root_gone) = (0, 0);
    let mut lines = Vec::new();
    for o in &outs {
        // The test harness's "test NAME ... " may precede the rank's word on its line.
        let line = o
            .stdout
            .lines()
            .find_map(|l| l.find("ERR ").or_else(|| l.find("JOINED")).map(|i| &l[i..]))
            .unwrap_or("");
        assert!(line.starts_with("ERR "), "rank {}: {line:?} ({:?})\n{}", o.rank, o.status, o.stderr_tail(8));
        lines.push(format!("rank {}: {line}", o.rank));
        if o.rank == 0 {
            // Rank 0 reports the root's reason whatever its own start ran into.
            assert!(line.contains(head) && line.contains(tail), "rank 0 does not name the limit: {line}");
            continue;
        }
        if line.contains(head) && line.contains(tail) {
            named += 1;
        } else {
            assert!(
                line.contains("rendezvous root"),
                "rank {}: neither the limit nor the root named: {line}",
                o.rank
            );
            root_gone += 1;
        }
    }
    // Rank 0's own process holds some descriptors, so about FD_CAP - 20 joins get in; the
    // others are told as they arrive within RANK0_LAST_FOR (10 s), which the staged arrivals
    // are well inside of (a loaded host may start some ranks of the plain run later).
    let want = if later.is_some() { n - 1 } else { 20 };
    assert!(
        named >= want,
        "rank 0 {rank0_late_ms} ms late: only {named} ranks were told the limit ({root_gone} found the root gone):\n{}",
        lines.join("\n")
    );
    oxccl_testkit::report!(
        "root capped at {FD_CAP} descriptors, {n} ranks, rank 0 {rank0_late_ms} ms late, later ranks {later:?}: {named} told the limit, {root_gone} found the root gone"
    );
    let _ = std::fs::remove_dir_all(dir);
}
