//! Two hosts over TCP: network namespaces made by the test, ranks split 2 + 2 across them
//! (shared memory inside each namespace, TCP over the veth pair between them). Every
//! collective and data type at counts 0, 1, 7, and 1 Mi + 3 for f32, u8 and bf16.

use oxccl_testkit::netns::TwoHosts;
use oxccl_testkit::{matrix, Launch};
use std::time::{Duration, Instant};

#[test]
fn two_hosts_2_plus_2() {
    if let Some(ctx) = oxccl_testkit::child("two_hosts") {
        return oxccl_testkit::matrixrun::rank_main(ctx);
    }
    let hosts = match TwoHosts::create() {
        Ok(h) => h,
        Err(why) => {
            eprintln!("SKIPPED two_hosts_2_plus_2: cannot create network namespaces here: {why}");
            return;
        }
    };
    let dir = Launch::scratch();
    let idfile = dir.join("unique-id");
    let mut l = Launch::new("two_hosts_2_plus_2", "two_hosts", 4)
        .args("light,light-big")
        .env("OXCCL_UNIQUE_ID_FILE", idfile.to_str().unwrap())
        .env("OXCCL_TIMEOUT", "120")
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
            let n = matrix(4, &oxccl_testkit::matrixrun::spec_named("light")).len()
                + matrix(4, &oxccl_testkit::matrixrun::spec_named("light-big")).len();
            eprintln!(
                "two hosts ({} = {}, {} = {}), ranks 0-1 | 2-3: {n} cases on every rank, all exact, {:.1} s",
                hosts.a,
                hosts.addr_a,
                hosts.b,
                hosts.addr_b,
                started.elapsed().as_secs_f64()
            );
            for d in done {
                for line in d.stdout.lines().filter(|l| l.starts_with("MATRIX rank")) {
                    eprintln!("  {line}");
                }
                for line in d.stderr.lines().filter(|l| l.contains("connected to rank")) {
                    eprintln!("  {line}");
                }
            }
        }
        Err(e) => panic!("two-host matrix failed:\n{e}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}
