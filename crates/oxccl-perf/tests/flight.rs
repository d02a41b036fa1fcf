//! The flight recorder end to end: rank 2 stops calling after call #0 and dumps on SIGUSR1;
//! ranks 0 and 1 time out in call #1 and dump on the failure; `oxccl analyze` over the three
//! dumps names rank 2 as the one that stopped first, after call #0, with ranks 0 and 1 waiting
//! in call #1.

use oxccl::{Communicator, ReduceOp};
use oxccl_testkit::{child, Launch};
use std::time::Duration;

oxccl_testkit::test_scope!();

fn rank_main(_ctx: oxccl_testkit::ChildCtx) {
    let comm = Communicator::from_env().unwrap();
    let me = comm.rank().idx();
    let mut v = vec![1.0f32; 100];
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    if me == 2 {
        // The laggard: asked for its recorder's dump (as an operator would, with kill -USR1).
        // SAFETY: raise(3) on this process; the recorder installed the handler.
        unsafe { libc::raise(libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(3000));
        return;
    }
    let e = comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap_err();
    println!("FAILED rank {me}: {e}");
    std::thread::sleep(Duration::from_millis(1000));
}

#[test]
fn oxccl_analyze_names_the_rank_that_stopped_first() {
    if let Some(ctx) = child("flight") {
        return rank_main(ctx);
    }
    let dir = Launch::scratch();
    let id = oxccl::new_unique_id(&oxccl::Config::default()).unwrap();
    Launch::new("oxccl_analyze_names_the_rank_that_stopped_first", "flight", 3)
        .env("OXCCL_UNIQUE_ID", &id.to_string())
        .env("OXCCL_TIMEOUT", "1")
        .env("OXCCL_FLIGHT_DIR", dir.to_str().unwrap())
        .timeout(Duration::from_secs(60))
        .run()
        .unwrap();
    let mut dumps: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    dumps.sort();
    assert_eq!(dumps.len(), 3, "one dump per rank: {dumps:?}");
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_oxccl")).arg("analyze").args(&dumps).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for want in [
        "of 3 ranks, 3 dump(s)",
        "dumped because: SIGUSR1",
        "dumped because: failure: rank 0: all_reduce timed out",
        "verdict: rank(s) [2] stopped first, after all_reduce call #0 (float × 100, sum) (done): it never reached call #1, which rank(s) [0, 1] waited in",
        "first error: rank ",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    oxccl_testkit::report!("{text}");
    // Bad input: a clear error, exit status 1.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"oxccl_flight_recorder\": 2}").unwrap();
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_oxccl")).arg("analyze").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an oxccl flight recorder dump"));
    let _ = std::fs::remove_dir_all(&dir);
}
