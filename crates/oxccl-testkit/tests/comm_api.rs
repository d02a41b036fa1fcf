//! Communicator life cycle: split, asynchronous scopes, abort, timeouts, launcher
//! environments, and bad input (which must return a typed error naming the problem, never
//! panic or hang).

use oxccl::{Communicator, Config, Error, Rank, ReduceOp, RejectReason, UniqueId};
use oxccl_core::CoreError;
use oxccl_testkit::{child, Launch};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

/// Runs `f(comm)` on `n` ranks as threads of this process, all on one host.
fn threads<T: Send + 'static>(
    n: usize,
    config: Config,
    f: impl Fn(Communicator) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    oxccl_testkit::threads(n, n, config, f)
}

fn quick() -> Config {
    Config::default().with_timeout(Some(Duration::from_secs(30)))
}

// ---------------------------------------------------------------- split

fn split_rank() {
    let comm = Communicator::from_env().unwrap();
    let (r, p) = (comm.rank().idx(), comm.size());
    // Colors by parity; keys reverse the order inside each color.
    let a = comm.split(Some((r % 2) as u32), -(r as i64)).unwrap().unwrap();
    let mates: Vec<usize> = (0..p).filter(|q| q % 2 == r % 2).rev().collect();
    assert_eq!(a.size(), mates.len(), "color {} size", r % 2);
    assert_eq!(a.rank().idx(), mates.iter().position(|q| *q == r).unwrap(), "rank in color {}", r % 2);
    // Rank 0 opts out; the rest split into halves by rank / 3.
    let b = comm.split(if r == 0 { None } else { Some((r / 3) as u32) }, r as i64).unwrap();
    assert_eq!(b.is_none(), r == 0);
    let b_mates: Vec<usize> = (1..p).filter(|q| q / 3 == r / 3).collect();
    if let Some(b) = &b {
        assert_eq!(b.size(), b_mates.len());
        assert_eq!(b.rank().idx(), b_mates.iter().position(|q| *q == r).unwrap());
    }
    // Collectives on both sub-communicators at once, several rounds, different sizes.
    for round in 0..6usize {
        let n = 1000 + round * 37_123;
        let send_a = vec![(r + 1) as u64 * (round as u64 + 1); n];
        let send_b = vec![(r * r) as u32 + round as u32; n + 5];
        let mut out_a = vec![0u64; n];
        let mut out_b = vec![0u32; n + 5];
        a.scope(|sa| {
            let wa = sa.all_reduce(&send_a, &mut out_a, ReduceOp::Sum).unwrap();
            if let Some(b) = &b {
                b.scope(|sb| {
                    let wb = sb.all_reduce(&send_b, &mut out_b, ReduceOp::Max).unwrap();
                    wb.wait().unwrap();
                });
            }
            wa.wait().unwrap();
        });
        let want_a: u64 = mates.iter().map(|q| (q + 1) as u64 * (round as u64 + 1)).sum();
        assert!(out_a.iter().all(|v| *v == want_a), "sub-communicator A round {round}");
        if b.is_some() {
            let want_b = b_mates.iter().map(|q| (q * q) as u32 + round as u32).max().unwrap();
            assert!(out_b.iter().all(|v| *v == want_b), "sub-communicator B round {round}");
        }
        // The parent still works between sub-communicator calls.
        let mut x = vec![1i32; 3];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, vec![p as i32; 3]);
    }
    // A split of a split, and a split where nobody takes part.
    let aa = a.split(Some((a.rank().idx() / 2) as u32), 0).unwrap().unwrap();
    let mut v = vec![1u8; 9];
    aa.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert!(v.iter().all(|x| *x as usize == aa.size()));
    assert!(comm.split(None, 0).unwrap().is_none());
    println!(
        "SPLIT ok rank {r}: A {} of {}, B {:?}",
        a.rank(),
        a.size(),
        b.as_ref().map(|b| (b.rank(), b.size()))
    );
}

#[test]
fn split_colors_keys_and_concurrent_subcommunicators() {
    if let Some(_ctx) = child("split") {
        return split_rank();
    }
    for (p, shm_off) in [(6usize, "0"), (5, "1")] {
        let id = oxccl::new_unique_id(&Config::default()).unwrap();
        Launch::new("split_colors_keys_and_concurrent_subcommunicators", "split", p)
            .env("OXCCL_UNIQUE_ID", &id.to_string())
            .env("NCCL_SHM_DISABLE", shm_off)
            .env("OXCCL_TIMEOUT", "60")
            .timeout(Duration::from_secs(120))
            .run()
            .unwrap_or_else(|e| panic!("split with {p} ranks (NCCL_SHM_DISABLE={shm_off}):\n{e}"));
    }
}

// ---------------------------------------------------------------- shrink

#[test]
fn shrink_excludes_ranks_that_never_call_it_even_after_abort() {
    for shm_off in [false, true] {
        // Every rank's init completes before anyone aborts or leaves (an abort during a peer's
        // init fails that init, naming the aborting rank).
        static INIT_DONE: std::sync::Barrier = std::sync::Barrier::new(5);
        let out = threads(5, quick().with_shm_disabled(shm_off), |c| {
            INIT_DONE.wait();
            let r = c.rank().idx();
            let excluded = [Rank::new(1), Rank::new(3)];
            if excluded.contains(&c.rank()) {
                // Gone: never calls shrink (its communicator is dropped).
                return None;
            }
            // The survivors abort the parent first (as after a failure), then shrink it.
            if r == 4 {
                c.abort();
            }
            let s = c.shrink(&excluded).unwrap();
            let mut v = vec![r as u32 + 1; 777];
            s.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            assert_eq!(v, vec![1 + 3 + 5; 777], "shrunk all-reduce");
            // A second shrink of the shrunk communicator: drop its rank 1 (parent rank 2).
            let s2 = if s.rank().idx() == 1 { None } else { Some(s.shrink(&[Rank::new(1)]).unwrap()) };
            let bad = s.shrink(&[Rank::new(9)]).err().expect("rank 9 of 3 is refused");
            assert!(bad.to_string().contains("exclude"), "{bad}");
            let s2 = s2.map(|s2| {
                let mut w = vec![r as u64; 3];
                s2.all_reduce_in_place(&mut w, ReduceOp::Max).unwrap();
                assert_eq!(w, vec![4; 3]);
                s2.rank().idx()
            });
            Some((s.rank().idx(), s.size(), s2))
        });
        assert_eq!(
            out,
            vec![Some((0, 3, Some(0))), None, Some((1, 3, None)), None, Some((2, 3, Some(1)))],
            "shm off: {shm_off}"
        );
    }
}

#[test]
fn close_destroys_in_place_and_later_calls_are_refused() {
    let out = threads(2, quick(), |c| {
        let mut v = vec![1u32; 5];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        c.close();
        c.close();
        let e = c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)) && e.to_string().contains("destroyed"), "{e}");
        v
    });
    assert_eq!(out, vec![vec![2u32; 5]; 2]);
}

// ---------------------------------------------------------------- asynchronous calls

#[test]
fn scoped_async_calls_complete_and_keep_order() {
    for shm_off in [false, true] {
        threads(3, quick().with_shm_disabled(shm_off), |c| {
            let r = c.rank().idx() as u32;
            let a: Vec<u32> = (0..50_000).map(|i| i * (r + 1)).collect();
            let mut sum = vec![0u32; 50_000];
            let mut gathered = vec![0u32; 3 * 7];
            let mine = vec![r; 7];
            let mut shifted = vec![0u32; 11];
            let to_next = vec![r + 100; 11];
            let mut blocking = vec![r; 1];
            c.scope(|s| {
                let w1 = s.all_reduce(&a, &mut sum, ReduceOp::Sum).unwrap();
                let w2 = s.all_gather(&mine, &mut gathered).unwrap();
                let mut g = s.group();
                g.send(&to_next, Rank::new((r as usize + 1) % 3)).unwrap();
                g.recv(&mut shifted, Rank::new((r as usize + 2) % 3)).unwrap();
                let w3 = g.launch().unwrap();
                // A blocking call inside the scope runs after the queued ones.
                c.all_reduce_in_place(&mut blocking, ReduceOp::Max).unwrap();
                assert!(w1.test() && w2.test() && w3.test(), "queued work finished before the blocking call");
                w2.wait().unwrap();
                w3.wait().unwrap();
                // w1 is never waited for: the scope waits anyway.
                drop(w1);
            });
            assert!(sum.iter().enumerate().all(|(i, v)| *v == (i as u32).wrapping_mul(6)));
            assert_eq!(gathered, (0..3).flat_map(|q| vec![q; 7]).collect::<Vec<u32>>());
            assert_eq!(shifted, vec![(r + 2) % 3 + 100; 11]);
            assert_eq!(blocking, vec![2]);
        });
    }
}

// ---------------------------------------------------------------- abort and timeouts

#[test]
fn abort_returns_promptly_and_fails_the_pending_call() {
    let id = oxccl::new_unique_id(&quick()).unwrap();
    let other = std::thread::spawn(move || Communicator::init(&id, 2, Rank(1), quick()).unwrap());
    let c = std::sync::Arc::new(Communicator::init(&id, 2, Rank(0), quick()).unwrap());
    let peer = other.join().unwrap();
    // Rank 0 waits in an all-reduce that rank 1 never joins.
    let c2 = c.clone();
    let waiter = std::thread::spawn(move || {
        let mut v = vec![1.0f32; 1 << 16];
        let t = Instant::now();
        (c2.all_reduce_in_place(&mut v, ReduceOp::Sum), t)
    });
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    c.abort();
    assert!(t.elapsed() < Duration::from_millis(100), "abort() took {:?}", t.elapsed());
    let (r, _) = waiter.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "pending call returned {:?} after the abort", t.elapsed());
    assert!(matches!(r, Err(Error::Aborted { rank: Rank(0) })), "{r:?}");
    let mut v = vec![0u8; 4];
    assert!(matches!(c.all_reduce_in_place(&mut v, ReduceOp::Sum), Err(Error::Aborted { .. })));
    peer.abort();
}

#[test]
fn timeout_names_the_missing_rank() {
    for shm_off in [false, true] {
        let cfg = Config::default().with_timeout(Some(Duration::from_millis(800))).with_shm_disabled(shm_off);
        let id = oxccl::new_unique_id(&cfg).unwrap();
        let cfg2 = cfg.clone();
        let other = std::thread::spawn(move || Communicator::init(&id, 2, Rank(1), cfg2).unwrap());
        let c = Communicator::init(&id, 2, Rank(0), cfg).unwrap();
        let _peer = other.join().unwrap();
        let mut v = vec![1u64; 1000];
        let t = Instant::now();
        let r = c.all_reduce_in_place(&mut v, ReduceOp::Sum);
        let waited = t.elapsed();
        match r {
            Err(Error::Timeout { rank, waiting_for, op, .. }) => {
                assert_eq!(rank, Rank(0));
                assert_eq!(waiting_for, vec![Rank(1)]);
                assert_eq!(op, "all_reduce");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(waited >= Duration::from_millis(700) && waited < Duration::from_secs(3), "{waited:?}");
        // The communicator is unusable afterwards, and says why.
        let e = c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap_err();
        assert!(matches!(e, Error::Broken { .. }) && e.to_string().contains("timed out"), "{e}");
    }
}

#[test]
fn init_timeout_names_the_ranks_that_never_joined() {
    // World size 4: ranks 0 and 2 start, 1 and 3 never do. Both starters' init fails within
    // the timeout, naming 1 and 3. Then the same with rank 0 (the world size's owner) absent.
    for (present, absent) in
        [(vec![0u32, 2], vec![Rank(1), Rank(3)]), (vec![2u32, 3], vec![Rank(0), Rank(1)])]
    {
        let cfg = Config::default().with_timeout(Some(Duration::from_millis(1500)));
        let id = oxccl::new_unique_id(&cfg).unwrap();
        let t = Instant::now();
        let hs: Vec<_> = present
            .iter()
            .map(|r| {
                let (cfg, r) = (cfg.clone(), *r);
                std::thread::spawn(move || {
                    Communicator::init(&id, 4, Rank(r), cfg).err().expect("init must fail")
                })
            })
            .collect();
        for (h, r) in hs.into_iter().zip(&present) {
            match h.join().unwrap() {
                Error::Timeout { rank, waiting_for, .. } => {
                    assert_eq!(rank, Rank(*r));
                    assert_eq!(waiting_for, absent, "rank {r}");
                }
                other => panic!("rank {r}: expected a timeout, got {other}"),
            }
        }
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    }
}

// ---------------------------------------------------------------- peer death

/// The last rank SIGKILLs itself at iteration 10 of a loop of all-reduces: in the middle of
/// the survivors' call ("mid"), or while they are idle between calls ("idle").
fn death_rank(ctx: oxccl_testkit::ChildCtx) {
    let comm = Communicator::from_env().unwrap();
    let (me, victim) = (comm.rank().idx(), comm.size() - 1);
    let mut v = vec![1.0f32; 1 << 15];
    for i in 0..20 {
        if i == 10 {
            if me == victim {
                // SAFETY: kill(2) on this process; nothing after it runs.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            if ctx.args == "idle" {
                std::thread::sleep(Duration::from_millis(1000));
            }
        }
        let t = Instant::now();
        match comm.all_reduce_in_place(&mut v, ReduceOp::Sum) {
            Ok(()) => assert!(i < 10, "rank {me}: iteration {i} succeeded without rank {victim}"),
            Err(e) => {
                println!("DEATH rank {me} iteration {i} after {} ms: {e}", t.elapsed().as_millis());
                assert_eq!(i, 10, "rank {me}: {e}");
                assert!(
                    matches!(e, Error::PeerClosed { peer, .. } if peer.idx() == victim),
                    "rank {me}: expected rank {victim} named as gone, got {e}"
                );
                assert!(t.elapsed() < Duration::from_secs(2), "rank {me}: detected after {:?}", t.elapsed());
                // The next call fails at once, naming the same rank.
                let e2 = comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap_err();
                assert!(e2.to_string().contains(&format!("rank {victim}")), "rank {me}: {e2}");
                // The survivors carry on without it, in the same processes.
                let s = comm.shrink(&[Rank::new(victim)]).unwrap();
                let mut w = vec![me as u64 + 1; 1000];
                s.all_reduce_in_place(&mut w, ReduceOp::Sum).unwrap();
                assert_eq!(w, vec![(victim * (victim + 1) / 2) as u64; 1000], "rank {me}: after shrink");
                println!("SHRUNK rank {me} -> {} of {}", s.rank(), s.size());
                return;
            }
        }
    }
    panic!("rank {me}: no error after rank {victim} died");
}

#[test]
fn a_killed_rank_is_named_by_every_survivor_within_2s() {
    if let Some(ctx) = child("death") {
        return death_rank(ctx);
    }
    for (p, shm_off, mode) in
        [(3, "0", "mid"), (3, "0", "idle"), (3, "1", "mid"), (4, "1", "idle"), (5, "0", "mid")]
    {
        let id = oxccl::new_unique_id(&Config::default()).unwrap();
        let what = format!("{p} ranks, NCCL_SHM_DISABLE={shm_off}, {mode}");
        let outs = match Launch::new("a_killed_rank_is_named_by_every_survivor_within_2s", "death", p)
            .args(mode)
            .env("OXCCL_UNIQUE_ID", &id.to_string())
            .env("NCCL_SHM_DISABLE", shm_off)
            .env("OXCCL_TIMEOUT", "60")
            .timeout(Duration::from_secs(60))
            .run_keep()
        {
            Ok(_) => panic!("{what}: the victim was not killed"),
            Err((outs, _)) => outs,
        };
        let all = || {
            outs.iter()
                .map(|o| {
                    format!("--- rank {} ({:?}):\n{}\n{}\n", o.rank, o.status, o.stdout, o.stderr_tail(30))
                })
                .collect::<String>()
        };
        for o in &outs[..p - 1] {
            assert!(o.status.is_some_and(|s| s.success()), "{what}: rank {} failed:\n{}", o.rank, all());
            let line = o.stdout.find("DEATH").map(|i| o.stdout[i..].lines().next().unwrap_or_default());
            assert!(o.stdout.contains("SHRUNK"), "{what}: rank {} did not carry on:\n{}", o.rank, o.stdout);
            oxccl_testkit::report!("{what}: {}", line.unwrap_or_default());
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            outs[p - 1].status.and_then(|s| s.signal()),
            Some(libc::SIGKILL),
            "{what}: the victim's end"
        );
    }
}

// ---------------------------------------------------------------- launchers

fn launcher_rank() {
    let c = Communicator::from_env().unwrap();
    let want_rank: usize = std::env::var("EXPECT_RANK").unwrap().parse().unwrap();
    assert_eq!(c.rank().idx(), want_rank);
    assert_eq!(c.size(), 3);
    let mut v = vec![c.rank().0 as i64 + 1; 1000];
    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert!(v.iter().all(|x| *x == 6));
    println!("LAUNCHER ok rank {}", c.rank());
}

/// A launcher's variables for rank r.
type EnvFor = Box<dyn Fn(usize) -> Vec<(String, String)>>;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn init_from_torchrun_slurm_and_openmpi_environments() {
    if let Some(_ctx) = child("launcher") {
        return launcher_rank();
    }
    let dir = Launch::scratch();
    let port = free_port().to_string();
    let port2 = free_port().to_string();
    let idfile = dir.join("ompi-unique-id").to_string_lossy().into_owned();
    let envs: Vec<(&str, EnvFor)> = vec![
        (
            "torchrun",
            Box::new(move |r| {
                vec![
                    ("RANK".into(), r.to_string()),
                    ("WORLD_SIZE".into(), "3".into()),
                    ("LOCAL_RANK".into(), r.to_string()),
                    ("MASTER_ADDR".into(), "127.0.0.1".into()),
                    ("MASTER_PORT".into(), port.clone()),
                    ("TORCHELASTIC_RUN_ID".into(), "test".into()),
                ]
            }),
        ),
        (
            "slurm",
            Box::new(move |r| {
                vec![
                    ("SLURM_PROCID".into(), r.to_string()),
                    ("SLURM_NTASKS".into(), "3".into()),
                    ("SLURM_LOCALID".into(), r.to_string()),
                    ("SLURM_JOB_ID".into(), "4242".into()),
                    ("OXCCL_ROOT_ADDR".into(), format!("127.0.0.1:{port2}")),
                ]
            }),
        ),
        (
            "openmpi",
            Box::new(move |r| {
                vec![
                    ("OMPI_COMM_WORLD_RANK".into(), r.to_string()),
                    ("OMPI_COMM_WORLD_SIZE".into(), "3".into()),
                    ("OMPI_COMM_WORLD_LOCAL_RANK".into(), r.to_string()),
                    ("OXCCL_UNIQUE_ID_FILE".into(), idfile.clone()),
                ]
            }),
        ),
    ];
    for (name, env) in envs {
        let mut l = Launch::new("init_from_torchrun_slurm_and_openmpi_environments", "launcher", 3)
            .env("OXCCL_TIMEOUT", "30")
            .timeout(Duration::from_secs(60));
        l.oxccl_env = false;
        l.rank_env = (0..3)
            .map(|r| {
                let mut e = env(r);
                e.push(("EXPECT_RANK".into(), r.to_string()));
                e
            })
            .collect();
        l.run().unwrap_or_else(|e| panic!("{name} environment:\n{e}"));
        oxccl_testkit::report!("{name}: 3 ranks initialised from the launcher's variables, all-reduce exact");
    }
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------- bad input

#[test]
fn init_rejects_bad_rank_and_size() {
    let id = oxccl::new_unique_id(&quick()).unwrap();
    let e = Communicator::init(&id, 4, Rank(4), quick()).err().unwrap();
    assert!(matches!(e, Error::Invalid(CoreError::RankOutOfRange { arg: "rank", rank: 4, size: 4 })), "{e}");
    assert_eq!(e.to_string(), "argument `rank`: rank 4 is outside 0..4");
    let e = Communicator::init(&id, 0, Rank(0), quick()).err().unwrap();
    assert!(matches!(e, Error::Invalid(CoreError::InvalidArgument { arg: "size", .. })), "{e}");
}

#[test]
fn wrong_secret_is_rejected_without_disturbing_the_job() {
    let id = oxccl::new_unique_id(&quick()).unwrap();
    let mut bad = id;
    bad.secret[0] ^= 1;
    let t = Instant::now();
    let e = Communicator::init(&bad, 2, Rank(1), quick()).err().unwrap();
    assert!(matches!(e, Error::Rejected { reason: RejectReason::WrongSecret, .. }), "{e}");
    assert!(e.to_string().contains("secret"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // The real ranks still form the communicator afterwards.
    let out = threads_with_id(id, 2, |c| {
        let mut v = vec![c.rank().0 + 1; 5];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        v
    });
    assert!(out.iter().all(|v| *v == vec![3; 5]));
}

fn threads_with_id<T: Send + 'static>(
    id: UniqueId,
    n: usize,
    f: impl Fn(Communicator) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    let hs: Vec<_> = (0..n)
        .map(|r| std::thread::spawn(move || f(Communicator::init(&id, n, Rank::new(r), quick()).unwrap())))
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn world_size_mismatch_fails_every_rank_naming_the_culprit() {
    let id = oxccl::new_unique_id(&quick()).unwrap();
    let h0 = std::thread::spawn(move || Communicator::init(&id, 3, Rank(0), quick()).err());
    let h1 = std::thread::spawn(move || Communicator::init(&id, 3, Rank(1), quick()).err());
    std::thread::sleep(Duration::from_millis(200));
    let h2 = std::thread::spawn(move || Communicator::init(&id, 4, Rank(2), quick()).err());
    for h in [h0, h1, h2] {
        let e = h.join().unwrap().expect("init must fail");
        match &e {
            Error::Rejected {
                reason: RejectReason::WorldSizeMismatch { rank: 2, size: 4, root_size: 3 },
                ..
            } => {}
            other => panic!("unexpected: {other}"),
        }
        assert!(
            e.to_string().contains(
                "rank 2 was started with world size 4, but rank 0 created the communicator with world size 3"
            ),
            "{e}"
        );
    }
}

/// Rank 0 (whose process runs the root: here, all are threads of one) cannot start, its
/// settings refused: the root fails at once and every rank that came hears why, naming rank 0
/// and the setting, instead of waiting for a rank 0 that never joins; so does rank 0.
#[test]
fn a_rank_beside_the_root_that_cannot_start_is_named_to_every_rank() {
    let id = oxccl::new_unique_id(&quick()).unwrap();
    let t = Instant::now();
    let others: Vec<_> = (1..3u32)
        .map(|r| std::thread::spawn(move || (r, Communicator::init(&id, 3, Rank(r), quick()).err())))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut bad = quick();
    bad.buffsize = Some(1);
    let zero = std::thread::spawn(move || (0, Communicator::init(&id, 3, Rank(0), bad).err()));
    for h in others.into_iter().chain([zero]) {
        let (r, e) = h.join().unwrap();
        let e = e.unwrap_or_else(|| panic!("rank {r}: init must fail"));
        match &e {
            Error::Rejected { rank, reason: RejectReason::RootRankFailed { rank: 0, reason } } => {
                assert_eq!(*rank, Rank(r));
                assert!(reason.contains("NCCL_BUFFSIZE"), "rank {r}: {reason}");
            }
            other => panic!("rank {r}: unexpected: {other}"),
        }
        assert!(
            e.to_string().contains("rank 0, whose process runs the rendezvous root, could not start"),
            "{e}"
        );
    }
    // Well inside the 30 s timeout: no rank waited for rank 0.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn duplicate_rank_fails_the_rendezvous() {
    let id = oxccl::new_unique_id(&quick()).unwrap();
    let h0 = std::thread::spawn(move || Communicator::init(&id, 3, Rank(1), quick()).err());
    std::thread::sleep(Duration::from_millis(100));
    let h1 = std::thread::spawn(move || Communicator::init(&id, 3, Rank(1), quick()).err());
    for h in [h0, h1] {
        let e = h.join().unwrap().expect("init must fail");
        assert!(
            matches!(e, Error::Rejected { reason: RejectReason::DuplicateRank { rank: 1, .. }, .. }),
            "{e}"
        );
    }
}

#[test]
fn bad_arguments_return_errors_and_leave_the_communicator_usable() {
    for shm_off in [false, true] {
        threads(2, quick().with_shm_disabled(shm_off), |c| {
            let mut out = vec![0f32; 10];
            let inp = vec![1f32; 10];
            // Bitwise operator on a float type.
            let e = c.all_reduce(&inp, &mut out, ReduceOp::BitXor).unwrap_err();
            assert!(matches!(e, Error::Invalid(CoreError::OpInvalidForType { .. })), "{e}");
            assert!(e.to_string().contains("bxor") && e.to_string().contains("float"), "{e}");
            // Receive buffers shorter than the call needs.
            let e = c.all_reduce(&inp, &mut out[..9], ReduceOp::Sum).unwrap_err();
            assert_eq!(e.to_string(), "argument `recv`: buffer holds 9 elements but the call needs 10");
            let e = c.all_gather(&inp, &mut out).unwrap_err();
            assert!(
                matches!(e, Error::Invalid(CoreError::BufferTooShort { arg: "recv", needed: 20, got: 10 })),
                "{e}"
            );
            let e = c.reduce_scatter(&inp[..3], &mut out[..2], ReduceOp::Sum).unwrap_err();
            assert!(
                matches!(e, Error::Invalid(CoreError::BufferTooShort { arg: "send", needed: 4, got: 3 })),
                "{e}"
            );
            // Only the root can see that its send buffer is short, so only the root calls.
            if c.rank() == Rank(0) {
                let e = c.broadcast(&inp[..2], &mut out, Rank(0));
                assert!(
                    matches!(e, Err(Error::Invalid(CoreError::BufferTooShort { arg: "send", .. }))),
                    "{e:?}"
                );
            }
            let e = c.all_to_all(&inp[..3], &mut out).unwrap_err();
            assert!(matches!(e, Error::Invalid(CoreError::InvalidArgument { arg: "send", .. })), "{e}");
            let e = c.all_to_all_v(&inp, &[1, 1, 1], &[0, 1, 2], &mut out, &[1, 1], &[0, 1]).unwrap_err();
            assert!(
                matches!(e, Error::Invalid(CoreError::InvalidArgument { arg: "send_counts", .. })),
                "{e}"
            );
            // Ranks outside 0..size.
            let e = c.broadcast(&inp, &mut out, Rank(2)).unwrap_err();
            assert_eq!(e.to_string(), "argument `root`: rank 2 is outside 0..2");
            let e = c.send(&inp, Rank(7)).unwrap_err();
            assert!(
                matches!(e, Error::Invalid(CoreError::RankOutOfRange { arg: "peer", rank: 7, size: 2 })),
                "{e}"
            );
            let e = c.gather(&inp, &mut out, Rank(5)).unwrap_err();
            assert!(matches!(e, Error::Invalid(CoreError::RankOutOfRange { arg: "root", .. })), "{e}");
            // None of that broke the communicator.
            c.all_reduce(&inp, &mut out, ReduceOp::Sum).unwrap();
            assert_eq!(out, vec![2.0; 10]);
        });
    }
}

#[test]
fn mismatched_send_and_receive_sizes_are_reported() {
    for shm_off in [false, true] {
        let r = threads(2, quick().with_shm_disabled(shm_off), |c| {
            if c.rank() == Rank(0) {
                // The small send returns once its data is handed over (eager); the sender's
                // next call hears of the receiver's failure, with both messages.
                c.send(&[1u32; 16], Rank(1)).unwrap();
                let t = std::time::Instant::now();
                let r = c.all_reduce_in_place(&mut [1u32; 3], ReduceOp::Sum).map(|_| ());
                assert!(t.elapsed() < Duration::from_secs(10), "the next call took {:?}", t.elapsed());
                r
            } else {
                let mut b = vec![0u32; 20];
                c.recv(&mut b, Rank(0)).map(|_| ())
            }
        });
        let text = r[0].as_ref().expect_err("the sender's next call must fail").to_string();
        for m in ["send/recv message #0 (uint32 × 20)", "send/recv message #0 (uint32 × 16)", "rank 1"] {
            assert!(text.contains(m), "NCCL_SHM_DISABLE={shm_off}: {text}");
        }
        // The contract check names both messages (16 and 20 elements of uint32).
        match &r[1] {
            Err(e @ Error::CallMismatch { rank: Rank(1), peer: Rank(0), mine, theirs, .. }) => {
                assert_eq!((mine.count, theirs.count), (20, 16), "{e}");
                let text = e.to_string();
                assert!(text.contains("send/recv message #0 (uint32 × 20)"), "{text}");
                assert!(text.contains("send/recv message #0 (uint32 × 16)"), "{text}");
            }
            other => panic!("NCCL_SHM_DISABLE={shm_off}: expected a mismatch, got {other:?}"),
        }
    }
}

/// Groups that differ only after their first collective (rank 1's second call is a broadcast
/// where rank 0's is an all-reduce of the same type and count) fail on both ranks, well
/// before the communicator's timeout, naming both second calls: each finds the mismatch
/// itself, or hears first from the peer that found it (`PeerFailed` with the peer's finding).
#[test]
fn groups_differing_in_a_later_collective_are_reported() {
    for shm_off in [false, true] {
        let cfg = Config::default().with_timeout(Some(Duration::from_secs(20))).with_shm_disabled(shm_off);
        let r = threads(2, cfg, |c| {
            let (mut a, mut b) = (vec![1f64; 4], vec![1f64; 4]);
            let t = std::time::Instant::now();
            let mut g = c.group();
            g.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap();
            if c.rank() == Rank(1) {
                g.broadcast_in_place(&mut b, Rank(0)).unwrap();
            } else {
                g.all_reduce_in_place(&mut b, ReduceOp::Sum).unwrap();
            }
            (g.end(), t.elapsed())
        });
        let ar = "all_reduce call #1 (double × 4, sum)";
        let bc = "broadcast call #1 (double × 4, root 0)";
        for (me, (res, took)) in r.iter().enumerate() {
            let (mine, theirs) = if me == 0 { (ar, bc) } else { (bc, ar) };
            let peer = 1 - me;
            match res {
                Err(e @ Error::CallMismatch { .. }) => {
                    let text = e.to_string();
                    let want = format!("rank {me} is in {mine} but rank {peer} is in {theirs}");
                    assert!(text.contains(&want), "NCCL_SHM_DISABLE={shm_off}: {text}");
                }
                Err(Error::PeerFailed { peer: p, reason, .. }) if p.idx() == peer => {
                    let want = format!("rank {peer} is in {theirs} but rank {me} is in {mine}");
                    assert!(reason.contains(&want), "NCCL_SHM_DISABLE={shm_off}: {reason}");
                }
                other => panic!("NCCL_SHM_DISABLE={shm_off}, rank {me}: expected a mismatch, got {other:?}"),
            }
            assert!(*took < Duration::from_secs(10), "rank {me} took {took:?}");
        }
    }
}

#[test]
fn unique_id_text_and_interface_errors_are_clear() {
    let e = "oxccl1@1.2.3.4:5/zz".parse::<UniqueId>().unwrap_err();
    assert!(e.to_string().contains("secret"), "{e}");
    let e = "hello".parse::<UniqueId>().unwrap_err();
    assert!(e.to_string().contains("oxccl1@"), "{e}");
    let cfg = Config::default().with_socket_ifname("=no-such-interface0");
    let e = oxccl::new_unique_id(&cfg).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("NCCL_SOCKET_IFNAME==no-such-interface0")
            && m.contains("interfaces present")
            && m.contains("lo="),
        "{m}"
    );
    // A text id survives an environment variable round trip and still works.
    let id = oxccl::new_unique_id(&quick()).unwrap();
    let parsed: UniqueId = id.to_string().parse().unwrap();
    let out = threads_with_id(parsed, 1, |c| {
        let mut v = vec![7u32; 3];
        c.all_reduce_in_place(&mut v, ReduceOp::Prod).unwrap();
        v
    });
    assert_eq!(out[0], vec![7; 3]);
}
