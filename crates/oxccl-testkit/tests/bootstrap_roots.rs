//! Several rendezvous roots (`Communicator::init_scalable`, NCCL's scalable init): every unique
//! id is a root its share of the ranks joins; the roots join each other. Communicators form and
//! run exact, dense and sparse; a root that never answers is named (index and address) within
//! the timeout; a root that fails tells root 0, and every rank hears why; ids from different
//! jobs are refused naming the index that differs.

use oxccl::{Communicator, Config, Error, Rank, ReduceOp, RejectReason, UniqueId};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

fn config(timeout_s: u64, sparse_from: usize) -> Config {
    Config::default()
        .with_timeout(Some(Duration::from_secs(timeout_s)))
        .with_bootstrap_sparse_from(sparse_from)
        .with_shm_disabled(true)
        .with_direct(false)
}

/// Starts `n` ranks as threads, rank r on `ids_of(r)`, and returns what `f` makes of each
/// rank's init (with the time it took).
fn start<T: Send + 'static>(
    n: usize,
    cfg: Config,
    ids_of: impl Fn(usize) -> Vec<UniqueId>,
    f: impl Fn(Result<Communicator, Error>) -> T + Send + Sync + Copy + 'static,
) -> Vec<(T, Duration)> {
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let ids = ids_of(r);
            let cfg = cfg.clone().with_host_id(&format!("host{}", r / 4));
            std::thread::spawn(move || {
                let t = Instant::now();
                let c = Communicator::init_scalable(&ids, n, Rank::new(r), cfg);
                let took = t.elapsed();
                (f(c), took)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn ids(k: usize, cfg: &Config) -> Vec<UniqueId> {
    (0..k).map(|_| oxccl::new_unique_id(cfg).unwrap()).collect()
}

#[test]
fn communicators_over_2_and_4_roots_form_and_reduce_exactly() {
    for (n, roots, sparse_from) in [(8, 2, 0), (16, 4, 0), (16, 4, 2), (13, 4, 0), (9, 9, 0), (16, 16, 2)] {
        let cfg = config(60, sparse_from);
        let all = ids(roots, &cfg);
        let out = start(
            n,
            cfg,
            |_| all.clone(),
            |c| {
                let comm = match c {
                    Ok(c) => c,
                    Err(e) => return Err(e.to_string()),
                };
                let (r, p) = (comm.rank().idx(), comm.size());
                let mut x: Vec<u64> = (0..1000).map(|i| (r as u64 + 1) * (i + 1)).collect();
                comm.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(|e| format!("all-reduce: {e}"))?;
                let sum = (p * (p + 1) / 2) as u64;
                let exact = x.iter().enumerate().all(|(i, v)| *v == sum * (i as u64 + 1));
                let table: Vec<(u32, String)> =
                    comm.peers().iter().map(|q| (q.rank.0, q.addr.to_string())).collect();
                comm.destroy().map_err(|e| format!("destroy: {e}"))?;
                Ok((r, exact, table))
            },
        );
        let errors: Vec<&String> = out.iter().filter_map(|o| o.0.as_ref().err()).collect();
        assert!(errors.is_empty(), "{n} ranks over {roots} roots (sparse from {sparse_from}): {errors:#?}");
        let out: Vec<_> = out.into_iter().map(|(o, t)| (o.unwrap(), t)).collect();
        for (r, ((rank, exact, table), _)) in out.iter().enumerate() {
            assert_eq!(*rank, r);
            assert!(exact, "{n} ranks over {roots} roots: rank {r}'s all-reduce is wrong");
            assert_eq!(table, &out[0].0 .2, "{n} ranks over {roots} roots: rank {r}'s table differs");
            assert_eq!(table.iter().map(|t| t.0 as usize).collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
        }
        let slowest = out.iter().map(|o| o.1).max().unwrap();
        oxccl_testkit::report!(
            "{n} ranks over {roots} roots (sparse from {sparse_from}): formed, all-reduce exact; slowest init {slowest:?}"
        );
    }
}

/// Root 1's id points where nothing listens: its share cannot reach it, and root 0's share
/// waits for its report; every rank fails within its timeout naming root 1 and its address.
#[test]
fn a_root_that_never_answers_is_named_by_every_rank_within_the_timeout() {
    let cfg = config(3, 0);
    let good = oxccl::new_unique_id(&cfg).unwrap();
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        UniqueId { root: a, secret: [0x5a; 32] }
    };
    let addr = gone.root.to_string();
    let out = start(4, cfg, |_| vec![good, gone], |c| c.err().map(|e| e.to_string()));
    for (r, (e, took)) in out.iter().enumerate() {
        let e = e.as_ref().unwrap_or_else(|| panic!("rank {r} formed a communicator without root 1"));
        assert!(
            e.contains(&format!("rendezvous root 1 of 2 (commIds[1]) at {addr}")),
            "rank {r} does not name root 1: {e}"
        );
        assert!(*took >= Duration::from_secs(3) && *took < Duration::from_secs(8), "rank {r} took {took:?}");
        oxccl_testkit::report!("rank {r} after {took:?}: {e}");
    }
}

/// Ranks 2 and 3 pass job B's id as commIds[1]: root 0 refuses the communicator naming index 1,
/// and every rank (through its own root) hears it.
#[test]
fn ids_from_different_jobs_are_refused_naming_the_index() {
    let cfg = config(20, 0);
    let a = ids(2, &cfg);
    let b = ids(2, &cfg);
    let out = start(4, cfg, |r| if r < 2 { a.clone() } else { vec![a[0], b[1]] }, |c| c.err());
    for (r, (e, took)) in out.iter().enumerate() {
        match e {
            Some(Error::Rejected { reason: RejectReason::MixedIds { index: 1, .. }, .. }) => {}
            e => panic!("rank {r}: {e:?}"),
        }
        assert!(*took < Duration::from_secs(15), "rank {r} took {took:?}");
    }
    oxccl_testkit::report!("mixed ids: {}", out[0].0.as_ref().unwrap());
    // The same id twice is this call's error, naming both indices.
    let e = Communicator::init_scalable(&[a[0], a[1], a[0]], 4, Rank(0), config(5, 0)).err().unwrap();
    assert!(e.to_string().contains("ids[0] and ids[2]"), "{e}");
    let e = Communicator::init_scalable(&ids(3, &config(5, 0)), 2, Rank(0), config(5, 0)).err().unwrap();
    assert!(e.to_string().contains("3 unique ids for 2 ranks"), "{e}");
}

/// Root 1 fails (two processes claim rank 2, of its share): it reports the failure to root 0
/// instead of its share's entries, and every rank, root 0's share included, hears why (the
/// rank claimed twice, both places) well before its timeout.
#[test]
fn a_failing_root_k_reports_to_root_0_and_every_rank_hears_why() {
    let cfg = config(20, 0);
    let all = ids(2, &cfg);
    let hs: Vec<_> = (0..4)
        .map(|r| {
            let (ids, cfg) = (all.clone(), cfg.clone().with_host_id("host0"));
            // The process meant to be rank 3 claims rank 2.
            let claim = if r == 3 { 2 } else { r };
            std::thread::spawn(move || {
                let t = Instant::now();
                let e = Communicator::init_scalable(&ids, 4, Rank::new(claim), cfg).err();
                (e, t.elapsed())
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let (e, took) = h.join().unwrap();
        let e = e.unwrap_or_else(|| panic!("process {r} formed a communicator with rank 2 claimed twice"));
        match &e {
            Error::Rejected { reason: RejectReason::DuplicateRank { rank: 2, .. }, .. } => {}
            Error::Rejected { reason: RejectReason::RootFailed { root: 1, why, .. }, .. }
                if why.contains("rank 2 joined twice") => {}
            e => panic!("process {r} (rank {}): {e:?}", if r == 3 { 2 } else { r }),
        }
        assert!(took < Duration::from_secs(10), "process {r} took {took:?}: {e}");
        oxccl_testkit::report!("process {r} after {took:?}: {e}");
    }
}

/// The start of many ranks as threads of this process, one root against several, alternating
/// in one run: the wall time from the first rank's start to the last rank's communicator (the
/// ids made before). A benchmark, run by hand:
/// `OXCCL_ROOTS_BENCH=512 OXCCL_ROOTS_COUNTS=1,4,8 OXCCL_ROOTS_ROUNDS=3 cargo test --release -p oxccl-testkit --test bootstrap_roots many_ranks_start -- --include-ignored --nocapture`
#[test]
#[ignore]
fn many_ranks_start_with_one_root_and_with_several() {
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.into());
    let n: usize = var("OXCCL_ROOTS_BENCH", "512").parse().unwrap();
    let counts: Vec<usize> =
        var("OXCCL_ROOTS_COUNTS", "1,4,8").split(',').map(|c| c.parse().unwrap()).collect();
    let rounds: usize = var("OXCCL_ROOTS_ROUNDS", "3").parse().unwrap();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); counts.len()];
    for round in 0..rounds {
        for (i, &roots) in counts.iter().enumerate() {
            let cfg = config(300, 128);
            let all = ids(roots, &cfg);
            let t = Instant::now();
            let out = start(
                n,
                cfg,
                |_| all.clone(),
                move |c| {
                    let c = c.map_err(|e| e.to_string())?;
                    let done = Instant::now();
                    let sparse = c.lifelines().len() < n - 1;
                    std::thread::sleep(Duration::from_millis(200));
                    c.destroy().map_err(|e| e.to_string())?;
                    Ok::<_, String>((done, sparse))
                },
            );
            let errors: Vec<&String> = out.iter().filter_map(|o| o.0.as_ref().err()).collect();
            assert!(errors.is_empty(), "{n} ranks over {roots} roots: {:?}", &errors[..errors.len().min(5)]);
            let last = out.iter().map(|o| o.0.as_ref().unwrap().0).max().unwrap();
            let wall = (last - t).as_secs_f64();
            assert!(out.iter().all(|o| o.0.as_ref().unwrap().1), "not sparse");
            times[i].push(wall);
            if std::env::var("OXCCL_ROOTS_SLOWEST").is_ok() {
                let mut per: Vec<(Duration, usize)> = out.iter().enumerate().map(|(r, o)| (o.1, r)).collect();
                per.sort();
                println!("  fastest {:?}, slowest {:?}", &per[..3], &per[per.len() - 8..]);
            }
            println!("round {round}: {n} ranks over {roots} root(s): init wall {wall:.3} s");
            // The last communicators' teardown (their closing drains) off the next start.
            std::thread::sleep(Duration::from_secs(3));
        }
    }
    for (i, &roots) in counts.iter().enumerate() {
        let mut t = times[i].clone();
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{n} ranks over {roots} root(s): init wall min {:.3} s, median {:.3} s, all {:?}",
            t[0],
            t[t.len() / 2],
            times[i]
        );
    }
}
