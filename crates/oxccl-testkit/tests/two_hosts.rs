//! Two hosts over TCP: network namespaces made by the test, ranks split 2 + 2 across them
//! (shared memory inside each namespace, TCP over the veth pair between them), running the
//! standard collective matrix; the test also checks from the ranks' INFO logs that peers in one
//! namespace connected over shared memory and peers across namespaces over TCP.

use oxccl_testkit::netns::TwoHosts;
use oxccl_testkit::{matrix, Launch};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

#[test]
fn two_hosts_2_plus_2() {
    if let Some(ctx) = oxccl_testkit::child("two_hosts") {
        return oxccl_testkit::matrixrun::rank_main(ctx);
    }
    let hosts = match TwoHosts::create() {
        Ok(h) => h,
        Err(why) => return oxccl_testkit::skip("two_hosts_2_plus_2", "network namespaces", &why),
    };
    let dir = Launch::scratch();
    let idfile = dir.join("unique-id");
    let mut l = Launch::new("two_hosts_2_plus_2", "two_hosts", 4)
        .args("standard")
        .env("OXCCL_UNIQUE_ID_FILE", idfile.to_str().unwrap())
        .env("OXCCL_TIMEOUT", "120")
        .env("NCCL_DEBUG", "INFO")
        .timeout(Duration::from_secs(600));
    l.wrap = vec![
        TwoHosts::exec_in(&hosts.a),
        TwoHosts::exec_in(&hosts.a),
        TwoHosts::exec_in(&hosts.b),
        TwoHosts::exec_in(&hosts.b),
    ];
    let started = Instant::now();
    match l.run() {
        Ok(done) => {
            let n = matrix(4, &oxccl_testkit::matrixrun::standard_spec()).len();
            if let Err(e) = oxccl_testkit::matrixrun::check_summaries(&done, 4, n) {
                panic!("two-host matrix: every rank exited 0, but\n{e}");
            }
            oxccl_testkit::report!(
                "two hosts ({} = {}, {} = {}), ranks 0-1 | 2-3: {n} cases on every rank, all exact, {:.1} s",
                hosts.a,
                hosts.addr_a,
                hosts.b,
                hosts.addr_b,
                started.elapsed().as_secs_f64()
            );
            for d in &done {
                for line in d.stdout.lines().filter(|l| l.starts_with("MATRIX rank")) {
                    oxccl_testkit::report!("  {line}");
                }
                // Peers in the same namespace use shared memory, peers across it TCP.
                let me = d.rank;
                for peer in (0..4).filter(|p| *p != me) {
                    let want = if peer / 2 == me / 2 {
                        format!(" : {me} -> {peer} via SHM")
                    } else {
                        format!(" : {me} <-> {peer} via NET/Socket")
                    };
                    assert!(d.stderr.contains(&want), "rank {me} never logged {want:?}");
                }
            }
        }
        Err(e) => panic!("two-host matrix failed:\n{e}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}
