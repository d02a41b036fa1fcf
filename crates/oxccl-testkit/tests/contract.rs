//! The contract check: ranks whose calls differ fail, every one of them, with both call
//! signatures in the message — never a hang or a wrong result. Over the direct path, the
//! shared-memory ring engine and TCP.

use oxccl::{Communicator, Rank, ReduceOp};
use oxccl_testkit::{child, Launch};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

/// Every kind of divergence: rank 1 makes the odd call, after one matching all-reduce (call
/// #0). The expected pair of signatures (as the error prints them) for each.
const CASES: &[(&str, &str, &str)] = &[
    ("kind", "all_reduce call #1 (float × 1000, sum)", "broadcast call #1 (float × 1000, root 0)"),
    ("count", "all_reduce call #1 (float × 1000, sum)", "all_reduce call #1 (float × 999, sum)"),
    ("dtype", "all_reduce call #1 (float × 1000, sum)", "all_reduce call #1 (int32 × 1000, sum)"),
    ("op", "all_reduce call #1 (float × 1000, sum)", "all_reduce call #1 (float × 1000, max)"),
    ("root", "broadcast call #1 (float × 1000, root 0)", "broadcast call #1 (float × 1000, root 1)"),
    // Rank 1 makes the same two calls as the others, in the other order.
    ("order", "all_reduce call #1 (float × 1000, sum)", "broadcast call #1 (float × 1000, root 0)"),
    ("p2p_count", "send/recv message #0 (float × 100)", "send/recv message #0 (float × 99)"),
    ("p2p_dtype", "send/recv message #0 (float × 100)", "send/recv message #0 (int32 × 100)"),
];

fn diverge(ctx: oxccl_testkit::ChildCtx) {
    let comm = Communicator::from_env().unwrap();
    let me = comm.rank().idx();
    let odd = me == 1;
    let mut v = vec![1.0f32; 1000];
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    let t = Instant::now();
    let sum = ReduceOp::Sum;
    let run = || -> oxccl::Result<()> {
        let mut v = vec![1.0f32; 1000];
        match ctx.args.as_str() {
            "kind" if odd => comm.broadcast_in_place(&mut v, Rank::new(0))?,
            "count" if odd => comm.all_reduce_in_place(&mut v[..999], sum)?,
            "dtype" if odd => comm.all_reduce_in_place(&mut vec![1i32; 1000], sum)?,
            "op" if odd => comm.all_reduce_in_place(&mut v, ReduceOp::Max)?,
            "kind" | "count" | "dtype" | "op" => comm.all_reduce_in_place(&mut v, sum)?,
            "root" => comm.broadcast_in_place(&mut v, Rank::new(if odd { 1 } else { 0 }))?,
            "order" => {
                if odd {
                    comm.broadcast_in_place(&mut v, Rank::new(0))?;
                    comm.all_reduce_in_place(&mut v, sum)?;
                } else {
                    comm.all_reduce_in_place(&mut v, sum)?;
                    comm.broadcast_in_place(&mut v, Rank::new(0))?;
                }
            }
            "p2p_count" | "p2p_dtype" => {
                let mut g = comm.group();
                let src = vec![2.0f32; 100];
                let (mut f, mut i) = (vec![0f32; 100], vec![0i32; 100]);
                match me {
                    0 => {
                        g.send(&src, Rank::new(1))?;
                    }
                    1 if ctx.args == "p2p_count" => {
                        g.recv(&mut f[..99], Rank::new(0))?;
                    }
                    1 => {
                        g.recv(&mut i, Rank::new(0))?;
                    }
                    _ => {}
                }
                g.end()?;
            }
            other => panic!("unknown case {other}"),
        }
        // The next call: a rank whose own part of the odd call could complete (a sender, a
        // broadcast root) hears of the mismatch here at the latest.
        comm.all_reduce_in_place(&mut v, sum)
    };
    match run() {
        Ok(()) => println!("NOERROR rank {me}"),
        Err(e) => println!("MISMATCH rank {me} after {} ms: {e}", t.elapsed().as_millis()),
    }
}

/// A variable and its value.
type Env = (&'static str, &'static str);

fn launch(test: &str, case: &str, p: usize, env: &[Env]) -> Vec<String> {
    let id = oxccl::new_unique_id(&oxccl::Config::default()).unwrap();
    let mut l = Launch::new(test, "diverge", p)
        .args(case)
        .env("OXCCL_UNIQUE_ID", &id.to_string())
        .env("OXCCL_TIMEOUT", "30")
        .timeout(Duration::from_secs(60));
    for (k, v) in env {
        l = l.env(k, v);
    }
    let outs = l.run().unwrap_or_else(|e| panic!("{case} {env:?}: {e}"));
    outs.into_iter()
        .map(|o| {
            o.stdout
                .lines()
                .find(|l| l.contains("MISMATCH") || l.contains("NOERROR"))
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

#[test]
fn mismatches_fail_every_rank_with_both_signatures() {
    if let Some(ctx) = child("diverge") {
        return diverge(ctx);
    }
    let paths: &[(&str, usize, &[Env])] = &[
        ("direct", 4, &[("NCCL_SHM_DISABLE", "0"), ("OXCCL_DIRECT", "1")]),
        ("shm ring", 4, &[("NCCL_SHM_DISABLE", "0"), ("OXCCL_DIRECT", "0")]),
        ("tcp", 3, &[("NCCL_SHM_DISABLE", "1")]),
    ];
    let mut slowest = 0u128;
    for (path, p, env) in paths {
        for (case, a, b) in CASES {
            let lines = launch("mismatches_fail_every_rank_with_both_signatures", case, *p, env);
            for (r, line) in lines.iter().enumerate() {
                let what = format!("{path}, {case}, rank {r} of {p}: {line:?}");
                assert!(line.contains("MISMATCH"), "{what}: no error");
                assert!(line.contains(a) && line.contains(b), "{what}: both signatures expected");
                assert!(line.contains("rank 1"), "{what}: the odd rank must be named");
                let ms: u128 =
                    line.split(" after ").nth(1).and_then(|s| s.split(' ').next()).unwrap().parse().unwrap();
                assert!(ms < 5000, "{what}: took {ms} ms");
                slowest = slowest.max(ms);
            }
            oxccl_testkit::report!("{path}, {case}: {}", lines[0]);
        }
    }
    oxccl_testkit::report!("slowest detection: {slowest} ms");
}

/// With the check off the same divergence goes unnoticed (the check is what finds it).
#[test]
fn without_the_check_a_divergent_operator_goes_unnoticed() {
    if let Some(ctx) = child("diverge") {
        return diverge(ctx);
    }
    let lines = launch(
        "without_the_check_a_divergent_operator_goes_unnoticed",
        "op",
        3,
        &[("OXCCL_CHECK_CALLS", "0"), ("NCCL_SHM_DISABLE", "1")],
    );
    for (r, line) in lines.iter().enumerate() {
        assert!(line.contains("NOERROR"), "rank {r}: {line}");
    }
}

/// Rank 2 stops calling after call #0: the others' call #1 times out naming the collective,
/// its number, who arrived, and where rank 2 stands (its last finished call and its host).
fn laggard(ctx: oxccl_testkit::ChildCtx) {
    let comm = Communicator::from_env().unwrap();
    let me = comm.rank().idx();
    let mut v = vec![1.0f32; 1000];
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    if me == 2 {
        std::thread::sleep(Duration::from_millis(4000));
        return;
    }
    let t = Instant::now();
    let e = comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap_err();
    println!("TIMEOUT rank {me} after {} ms ({}): {e}", t.elapsed().as_millis(), ctx.args);
    // Stay a while, as a real rank would: the other one's report may still ask this one.
    std::thread::sleep(Duration::from_millis(1500));
}

#[test]
fn a_timeout_names_who_arrived_and_where_the_others_stand() {
    if let Some(ctx) = child("laggard") {
        return laggard(ctx);
    }
    for (path, shm_off) in [("shm", "0"), ("tcp", "1")] {
        let id = oxccl::new_unique_id(&oxccl::Config::default()).unwrap();
        let outs = Launch::new("a_timeout_names_who_arrived_and_where_the_others_stand", "laggard", 3)
            .args(path)
            .env("OXCCL_UNIQUE_ID", &id.to_string())
            .env("OXCCL_TIMEOUT", "1")
            .env("NCCL_SHM_DISABLE", shm_off)
            .timeout(Duration::from_secs(60))
            .run()
            .unwrap();
        for o in &outs[..2] {
            let line = o.stdout.lines().find(|l| l.contains("TIMEOUT")).unwrap_or_default();
            // Rank 0's or rank 1's own timeout, or the other's, which it was told (both
            // name the rank that arrived: the one that timed out).
            let arrived = if line.contains(" failed: ") { o.rank } else { 1 - o.rank };
            for want in [
                "all_reduce",
                "timed out after 1",
                "still waiting for rank(s)",
                "this rank is in all_reduce call #1 (float × 1000, sum)",
                &format!("arrived: ranks [{arrived}]"),
                "rank 2 (host ",
                "last finished call #0, idle",
            ] {
                assert!(line.contains(want), "{path}, rank {}: {want:?} missing from {line:?}", o.rank);
            }
            oxccl_testkit::report!("{path}: {line}");
        }
    }
}
