//! Fault injection: a random rank of a random world size (2–8) is SIGKILLed at a random moment
//! — during bootstrap, connection setup, a collective, or between calls — and every survivor
//! must fail, naming it, within 2 s of the kill (its pending call, and its next call too),
//! never hang. Over shared memory and over TCP.

use oxccl::{Communicator, Error, Rank, ReduceOp};
use oxccl_testkit::Rng;
use oxccl_testkit::{child, epoch_ms, Launch};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

/// How long a survivor stays alive after its errors.
const LINGER_MS: u64 = 500;

/// The culprit an error names, and how: `(kind, rank)`.
fn culprit(e: &Error) -> (&'static str, Vec<usize>) {
    match e {
        Error::PeerClosed { peer, .. } => ("closed", vec![peer.idx()]),
        Error::PeerFailed { peer, .. } => ("failed", vec![peer.idx()]),
        Error::Timeout { waiting_for, .. } => ("timeout", waiting_for.iter().map(|r| r.idx()).collect()),
        Error::Broken { .. } => ("broken", vec![]),
        _ => ("other", vec![]),
    }
}

/// Every rank: init, then collectives of several kinds and sizes (and pauses between them)
/// for up to 3 s. On the first error it prints it, tries one more call, prints that, and ends.
fn fault_rank(ctx: oxccl_testkit::ChildCtx) {
    let seed: u64 = ctx.args.parse().unwrap_or(1);
    let say = |what: &str, e: &Error| {
        let (kind, ranks) = culprit(e);
        println!("{what} {} {kind} {ranks:?} | {e}", epoch_ms());
    };
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            say("ERR init", &e);
            std::thread::sleep(Duration::from_millis(LINGER_MS));
            return;
        }
    };
    println!("READY {}", epoch_ms());
    let (me, p) = (comm.rank().idx(), comm.size());
    let mut rng = Rng::new(seed ^ (me as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut small = vec![1u32; 64];
    let mut big = vec![1.0f32; 64 << 10];
    let t = Instant::now();
    let mut i = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        // Every rank draws the same call from the shared sequence (the calls must match).
        let mut shared = Rng::new(seed.wrapping_add(i * 7919) | 1);
        let r = match shared.below(5) {
            0 => comm.all_reduce_in_place(&mut small, ReduceOp::Sum),
            1 => comm.all_reduce_in_place(&mut big, ReduceOp::Max),
            2 => comm.broadcast_in_place(&mut big[..4096], Rank::new(shared.below(p as u64) as usize)),
            3 => {
                let mut out = vec![0u32; 64 * p];
                comm.all_gather(&small, &mut out)
            }
            _ => {
                // A ring of sends and receives (the ring engine's point-to-point lanes).
                let next = Rank::new((me + 1) % p);
                let prev = Rank::new((me + p - 1) % p);
                let src = vec![me as u32; 1000];
                let mut dst = vec![0u32; 1000];
                let mut g = comm.group();
                g.send(&src, next).and_then(|g| g.recv(&mut dst, prev)).map(|_| ()).and_then(|_| g.end())
            }
        };
        if let Err(e) = r {
            say("ERR call", &e);
            let e2 = comm.all_reduce_in_place(&mut small, ReduceOp::Sum).unwrap_err();
            say("NEXT", &e2);
            // A survivor stays alive a while, as a real one would (to shrink, or to report):
            // one that exited at once would itself look gone to the others.
            std::thread::sleep(Duration::from_millis(LINGER_MS));
            return;
        }
        // Pauses between calls, so kills also land while every rank is idle.
        if rng.below(4) == 0 {
            std::thread::sleep(Duration::from_millis(rng.below(30)));
        }
        i += 1;
    }
    println!("DONE {}", epoch_ms());
}

/// One event a rank printed: (tag, epoch ms, kind, named ranks, text).
fn events(stdout: &str) -> Vec<(String, u128, String, String, String)> {
    let tags = ["READY ", "ERR init ", "ERR call ", "NEXT ", "DONE "];
    stdout
        .lines()
        .filter_map(|l| {
            let (at, tag) = tags.iter().filter_map(|t| l.find(t).map(|i| (i, *t))).min()?;
            let rest = &l[at + tag.len()..];
            let (head, text) = rest.split_once(" | ").unwrap_or((rest, ""));
            let mut w = head.splitn(3, ' ');
            let ms: u128 = w.next()?.trim().parse().ok()?;
            let kind = w.next().unwrap_or("").to_string();
            let ranks = w.next().unwrap_or("").to_string();
            Some((tag.trim().to_string(), ms, kind, ranks, text.to_string()))
        })
        .collect()
}

#[test]
fn a_killed_rank_is_named_by_every_survivor_at_any_point() {
    if let Some(ctx) = child("fault") {
        return fault_rank(ctx);
    }
    let seed0: u64 =
        std::env::var("OXCCL_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
        });
    let trials: u64 = std::env::var("OXCCL_FAULT_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
    oxccl_testkit::report!("fault injection: seed {seed0}, {trials} trials per transport");
    // The deadline is only the net under rank deaths that nothing else can see (a rank killed
    // before it joined is a rank that never started).
    let timeout_s = 3;
    for (transport, shm_off) in [("shm", "0"), ("tcp", "1")] {
        let mut rng = Rng::new(seed0 ^ (shm_off.parse::<u64>().unwrap_or(0) + 1).wrapping_mul(0x9e37_79b9));
        let mut worst = 0u128;
        let mut by_point = std::collections::BTreeMap::<&str, usize>::new();
        for trial in 0..trials {
            let p = 2 + rng.below(7) as usize;
            let victim = rng.below(p as u64) as usize;
            // A third of kills in the first 20 ms (bootstrap and connection setup), the rest
            // while the ranks make calls or pause between them.
            let at = match rng.below(3) {
                0 => rng.below(20),
                1 => 20 + rng.below(280),
                _ => 300 + rng.below(700),
            };
            let seed = rng.next_u64() | 1;
            let what = format!(
                "{transport} trial {trial}: {p} ranks, rank {victim} killed at {at} ms (seed {seed})"
            );
            let id = oxccl::new_unique_id(&oxccl::Config::default()).unwrap();
            let outs = match Launch::new("a_killed_rank_is_named_by_every_survivor_at_any_point", "fault", p)
                .args(&seed.to_string())
                .env("OXCCL_UNIQUE_ID", &id.to_string())
                .env("NCCL_SHM_DISABLE", shm_off)
                .env("OXCCL_TIMEOUT", &timeout_s.to_string())
                .env("NCCL_DEBUG", &std::env::var("OXCCL_FAULT_DEBUG").unwrap_or_default())
                .kill_after(victim, Duration::from_millis(at))
                .timeout(Duration::from_secs(30))
                .run_keep()
            {
                Ok(o) => o,
                Err((o, e)) if o.is_empty() => panic!("{what}: could not launch: {e}"),
                Err((o, _)) => o,
            };
            let dump = || {
                outs.iter()
                    .map(|o| {
                        format!(
                            "--- rank {} ({:?}):\n{}\n{}\n",
                            o.rank,
                            o.status,
                            o.stdout,
                            o.stderr_tail(20)
                        )
                    })
                    .collect::<String>()
            };
            let killed = outs[victim].killed_at_ms.unwrap_or_else(|| panic!("{what}: no kill\n{}", dump()));
            let victim_ev = events(&outs[victim].stdout);
            if victim_ev.iter().any(|e| e.0 == "DONE" || e.0.starts_with("ERR")) {
                // The victim finished (or failed) before the kill came: nothing to detect.
                *by_point.entry("after the end").or_default() += 1;
                continue;
            }
            let victim_ready = victim_ev.iter().any(|e| e.0 == "READY");
            let point = if victim_ready { "after init" } else { "during init" };
            *by_point.entry(point).or_default() += 1;
            for o in outs.iter().filter(|o| o.rank != victim) {
                let who = format!("{what}, survivor rank {}", o.rank);
                assert!(o.status.is_some_and(|s| s.success()), "{who}: did not end cleanly\n{}", dump());
                let ev = events(&o.stdout);
                let first = ev.iter().find(|e| e.0.starts_with("ERR"));
                let Some((tag, ms, kind, ranks, text)) = first else {
                    panic!("{who}: no error after the kill\n{}", dump());
                };
                let named = ranks.contains(&victim.to_string()) || text.contains(&format!("rank {victim}"));
                assert!(named, "{who}: {tag} does not name rank {victim}: {text}\n{}", dump());
                let after = ms.saturating_sub(killed);
                if kind == "timeout" {
                    // Only a rank that died before it joined may go unseen until the deadline.
                    assert!(!victim_ready, "{who}: a timeout after the victim was ready: {text}");
                    assert!(after < (timeout_s as u128 + 2) * 1000, "{who}: {after} ms: {text}");
                } else {
                    assert!(after < 2000, "{who}: detected after {after} ms: {text}");
                    worst = worst.max(after);
                }
                if tag == "ERR call" {
                    let next =
                        ev.iter().find(|e| e.0 == "NEXT").unwrap_or_else(|| panic!("{who}: no next call"));
                    assert!(
                        next.1.saturating_sub(killed) < 2000 + (kind == "timeout") as u128 * 4000,
                        "{who}: next call"
                    );
                    let named =
                        next.3.contains(&victim.to_string()) || next.4.contains(&format!("rank {victim}"));
                    assert!(named, "{who}: the next call does not name rank {victim}: {}", next.4);
                }
            }
        }
        oxccl_testkit::report!(
            "{transport}: {trials} trials, kills by victim state {by_point:?}, largest detection {worst} ms"
        );
    }
}

// ---------------------------------------------------------------- the network between hosts

/// Ranks on two hosts (network namespaces) run all-reduces until the call fails; each prints
/// how many calls it made and the failure.
fn cut_rank(ctx: oxccl_testkit::ChildCtx) {
    let comm = Communicator::from_env().unwrap();
    let (me, p) = (comm.rank().idx(), comm.size());
    let limit: usize = ctx.args.parse().unwrap_or(usize::MAX);
    let mut calls = 0;
    let mut last = Instant::now();
    while calls < limit {
        let n = [3, 5000, 300_000][calls % 3];
        let mut v: Vec<u32> = (0..n).map(|i| (i % 11) as u32 + me as u32).collect();
        match comm.all_reduce_in_place(&mut v, ReduceOp::Sum) {
            Ok(()) => {
                let want = |i: usize| (i % 11) as u32 * p as u32 + (p * (p - 1) / 2) as u32;
                assert!(v.iter().enumerate().all(|(i, x)| *x == want(i)), "rank {me}: call {calls} wrong");
                calls += 1;
                last = Instant::now();
            }
            Err(e) => {
                println!("CUT {} ms after the last call, {calls} calls | {e}", last.elapsed().as_millis());
                std::thread::sleep(Duration::from_millis(LINGER_MS));
                return;
            }
        }
    }
    println!("EXACT {calls} calls");
}

fn tc(ns: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "tc"])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run tc: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// With the link between the hosts cut (no FIN, no RST: `ip link set down`), every rank's
/// call fails within the timeout, naming ranks on the other side.
#[test]
fn a_cut_link_fails_calls_within_the_timeout_naming_the_unreachable_ranks() {
    if let Some(ctx) = child("cut") {
        return cut_rank(ctx);
    }
    let hosts = match oxccl_testkit::netns::TwoHosts::create() {
        Ok(h) => h,
        Err(why) => {
            return oxccl_testkit::skip(
                "a_cut_link_fails_calls_within_the_timeout_naming_the_unreachable_ranks",
                "network namespaces",
                &why,
            )
        }
    };
    let timeout_s = 3;
    let id_dir = Launch::scratch();
    let idfile = id_dir.join("unique-id");
    let mut l =
        Launch::new("a_cut_link_fails_calls_within_the_timeout_naming_the_unreachable_ranks", "cut", 4)
            .env("OXCCL_UNIQUE_ID_FILE", idfile.to_str().unwrap())
            .env("OXCCL_TIMEOUT", &timeout_s.to_string())
            .timeout(Duration::from_secs(90));
    let (a, b, dev) = (hosts.a.clone(), hosts.b.clone(), hosts.dev_a.clone());
    l.wrap = vec![
        oxccl_testkit::netns::TwoHosts::exec_in(&a),
        oxccl_testkit::netns::TwoHosts::exec_in(&a),
        oxccl_testkit::netns::TwoHosts::exec_in(&b),
        oxccl_testkit::netns::TwoHosts::exec_in(&b),
    ];
    // Cut the link while the ranks are in their loop of calls.
    let cutter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2500));
        let out = std::process::Command::new("ip").args(["-n", &a, "link", "set", &dev, "down"]).output();
        out.map(|o| o.status.success()).unwrap_or(false)
    });
    let outs = l.run().unwrap_or_else(|e| panic!("{e}"));
    assert!(cutter.join().unwrap(), "could not take the link down");
    for o in &outs {
        let line = o
            .stdout
            .lines()
            .find(|l| l.contains("CUT "))
            .unwrap_or_else(|| panic!("rank {}: no failure: {}", o.rank, o.stdout));
        let other: Vec<usize> = if o.rank < 2 { vec![2, 3] } else { vec![0, 1] };
        let named =
            other.iter().any(|r| line.contains(&format!("rank {r}")) || line.contains(&format!("[{r}")));
        assert!(named, "rank {}: the unreachable ranks {other:?} are not named: {line}", o.rank);
        let ms: u128 = line.split("CUT ").nth(1).and_then(|s| s.split(' ').next()).unwrap().parse().unwrap();
        assert!(
            ms < (timeout_s as u128 + 4) * 1000,
            "rank {}: failed {ms} ms after its last call: {line}",
            o.rank
        );
        oxccl_testkit::report!("cut link, rank {}: {line}", o.rank);
    }
}

/// Over a lossy, slow link (5% of packets lost and the rest delayed 20 ms, each way) every
/// result is exact. `tc netem` makes the link where the kernel has it; otherwise a user-space
/// link does the same to IP packets (TUN devices and a forwarder per direction).
#[test]
fn a_lossy_slow_link_keeps_every_result_exact() {
    if let Some(ctx) = child("cut") {
        return cut_rank(ctx);
    }
    let calls = 15;
    let run = |a: &str, b: &str, ifname: &str| {
        let idfile = Launch::scratch().join("unique-id");
        let mut l = Launch::new("a_lossy_slow_link_keeps_every_result_exact", "cut", 4)
            .args(&calls.to_string())
            .env("OXCCL_UNIQUE_ID_FILE", idfile.to_str().unwrap())
            .env("NCCL_SOCKET_IFNAME", ifname)
            .env("OXCCL_TIMEOUT", "120")
            .timeout(Duration::from_secs(300));
        l.wrap = vec![
            oxccl_testkit::netns::TwoHosts::exec_in(a),
            oxccl_testkit::netns::TwoHosts::exec_in(a),
            oxccl_testkit::netns::TwoHosts::exec_in(b),
            oxccl_testkit::netns::TwoHosts::exec_in(b),
        ];
        let t = Instant::now();
        let outs = l.run().unwrap_or_else(|e| panic!("{e}"));
        let all = || {
            outs.iter().map(|o| format!("--- rank {}:\n{}{}", o.rank, o.stdout, o.stderr)).collect::<String>()
        };
        for o in &outs {
            assert!(
                o.stdout.contains(&format!("EXACT {calls} calls")),
                "rank {} did not finish\n{}",
                o.rank,
                all()
            );
        }
        t.elapsed()
    };
    const TEST: &str = "a_lossy_slow_link_keeps_every_result_exact";
    let hosts = match oxccl_testkit::netns::TwoHosts::create() {
        Ok(h) => h,
        Err(why) => return oxccl_testkit::skip(TEST, "network namespaces", &why),
    };
    let netem = [(&hosts.a, &hosts.dev_a), (&hosts.b, &hosts.dev_b)].iter().try_for_each(|(ns, dev)| {
        tc(ns, &["qdisc", "add", "dev", dev, "root", "netem", "delay", "20ms", "loss", "5%"])
    });
    match netem {
        Ok(()) => {
            let took = run(&hosts.a, &hosts.b, "oxa,oxb");
            oxccl_testkit::report!(
                "netem link (5% loss, 20 ms): {calls} all-reduces on 2 + 2 ranks, all exact, {took:?}"
            );
        }
        Err(why) => {
            drop(hosts);
            // The netem link is not made: listed (a kernel without sch_netem cannot have it;
            // anything else is a machine's set-up, which CI must get right), and the same
            // test runs over a user-space lossy link instead.
            match oxccl_testkit::netns::netem_absence(&why) {
                Some(absent) => oxccl_testkit::skip_unavailable(TEST, "tc netem (sch_netem)", &absent),
                None => oxccl_testkit::skip(TEST, "tc netem", &why),
            }
            oxccl_testkit::report!("tc netem unavailable ({why}): a user-space lossy link instead");
            let link = match oxccl_testkit::netns::LossyHosts::create(5, Duration::from_millis(20)) {
                Ok(l) => l,
                Err(why) => return oxccl_testkit::skip(TEST, "a TUN link between namespaces", &why),
            };
            let took = run(&link.a.clone(), &link.b.clone(), "oxt");
            let (fwd, dropped) = link.finish();
            assert!(dropped > 0, "the link dropped nothing ({fwd} forwarded)");
            oxccl_testkit::report!(
                "user-space link (5% loss, 20 ms each way): {calls} all-reduces on 2 + 2 ranks, all exact, {took:?}; {fwd} packets forwarded, {dropped} dropped"
            );
        }
    }
}

// ---------------------------------------------------------------- a rank that leaves in order

/// Rank 2 destroys its communicator after the first call (in order: a goodbye to every peer)
/// and stays alive; the others make a second call, which waits on it for what it will never
/// send. That call must fail within a few seconds naming rank 2, not at the timeout.
fn early_rank(_ctx: oxccl_testkit::ChildCtx) {
    let comm = Communicator::from_env().unwrap();
    let me = comm.rank().idx();
    let mut v = vec![1u32; 4096];
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert!(v.iter().all(|x| *x == 3), "rank {me}: first call wrong");
    if me == 2 {
        comm.destroy().unwrap();
        println!("LEFT");
        std::thread::sleep(Duration::from_secs(12));
        return;
    }
    let t = Instant::now();
    match comm.all_reduce_in_place(&mut v, ReduceOp::Sum) {
        Ok(()) => println!("NO ERROR"),
        Err(e) => println!("ERR {} ms {:?} | {e}", t.elapsed().as_millis(), culprit(&e)),
    }
}

#[test]
fn a_rank_that_destroyed_its_communicator_is_named_by_the_waits_on_it() {
    if let Some(ctx) = child("early") {
        return early_rank(ctx);
    }
    let idfile = Launch::scratch().join("unique-id");
    let outs = Launch::new("a_rank_that_destroyed_its_communicator_is_named_by_the_waits_on_it", "early", 3)
        .env("OXCCL_UNIQUE_ID_FILE", idfile.to_str().unwrap())
        .env("OXCCL_TIMEOUT", "60")
        .timeout(Duration::from_secs(60))
        .run()
        .unwrap_or_else(|e| panic!("{e}"));
    let all =
        || outs.iter().map(|o| format!("--- rank {}:\n{}{}", o.rank, o.stdout, o.stderr)).collect::<String>();
    assert!(outs[2].stdout.contains("LEFT"), "{}", all());
    let mut said_why = false;
    for o in &outs[..2] {
        let line =
            o.stdout.lines().find_map(|l| l.split_once("ERR ")).unwrap_or_else(|| panic!("{}", all())).1;
        let ms: u128 = line.split(' ').next().unwrap().parse().unwrap();
        assert!(line.contains("[2]") && !line.contains("timeout"), "rank {}: {line}", o.rank);
        assert!(ms < 9000, "rank {}: failed after {ms} ms: {line}", o.rank);
        said_why |= line.contains("rank 2 destroyed its communicator in order");
        oxccl_testkit::report!("rank {}: {line}", o.rank);
    }
    assert!(said_why, "no rank said why:\n{}", all());
}
