//! Several hosts over a shaped network: an emulated cluster ([`oxccl_testkit::cluster`]) of 2
//! hosts × 2 ranks, each host's link a 1 Gbit/s token bucket both ways. Every collective runs
//! exact across it with the hierarchical plans forced (`NCCL_ALGO=hier,ring`: all-reduce,
//! all-gather and reduce-scatter hierarchical at every size) and with the flat ones
//! (`NCCL_ALGO=ring`); each rank's log shows which it built. A rank killed mid-call is named by
//! the others, and the cluster leaves nothing behind in `ip netns list`. With two links per
//! host (rails), channels spread over both, exact.

use oxccl_testkit::cluster::{Cluster, Spec};
use oxccl_testkit::{matrix, Launch};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

fn spec() -> Spec {
    Spec { hosts: 2, per_host: 2, rails: 1, rate: Some("1gbit".into()) }
}

/// The hosts' two links ("rails"), both named by `NCCL_SOCKET_IFNAME`.
fn two_rails() -> Spec {
    Spec { rails: 2, ..spec() }
}

/// Every rank of `c` on its host ([`Cluster::launch`]), logging at INFO.
fn launch(c: &Cluster, test: &str, scenario: &str) -> Launch {
    c.launch(test, scenario).env("NCCL_DEBUG", "INFO")
}

fn netns_list() -> String {
    std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Drops `c` and checks that none of its host namespaces is left.
fn removed_entirely(c: Cluster) {
    let names: Vec<String> = (0..c.spec().hosts).map(|h| c.ns(h).to_string()).collect();
    drop(c);
    let left = netns_list();
    for n in names {
        assert!(!left.lines().any(|l| l.split_whitespace().next() == Some(n.as_str())), "{n} left: {left}");
    }
}

#[test]
fn hierarchical_and_flat_plans_are_exact_across_a_shaped_cluster() {
    if let Some(ctx) = oxccl_testkit::child("hosts_matrix") {
        return oxccl_testkit::matrixrun::rank_main(ctx);
    }
    let c = match Cluster::create(&spec()) {
        Ok(c) => c,
        Err(why) => {
            return oxccl_testkit::skip(
                "hierarchical_and_flat_plans_are_exact_across_a_shaped_cluster",
                "network namespaces",
                &why,
            )
        }
    };
    let specs = "light,light-big";
    let cases: usize =
        specs.split(',').map(|s| matrix(4, &oxccl_testkit::matrixrun::spec_named(s)).len()).sum();
    for (algo, plans) in [("hier,ring", "Hier"), ("ring", "Ring")] {
        let started = Instant::now();
        let l = launch(&c, "hierarchical_and_flat_plans_are_exact_across_a_shaped_cluster", "hosts_matrix")
            .args(specs)
            .env("NCCL_ALGO", algo)
            .env("OXCCL_TIMEOUT", "120")
            .timeout(Duration::from_secs(600));
        let done = l.run().unwrap_or_else(|e| panic!("NCCL_ALGO={algo}: {e}"));
        if let Err(e) = oxccl_testkit::matrixrun::check_summaries(&done, 4, cases) {
            panic!("NCCL_ALGO={algo}: every rank exited 0, but\n{e}");
        }
        for d in &done {
            // The groups every rank derived from the host ids, and the selector's all-reduce.
            let groups = "Hier: 2 hosts × 2 ranks";
            assert!(
                d.stderr.contains(groups),
                "rank {} never logged {groups:?}:\n{}",
                d.rank,
                d.stderr_tail(30)
            );
            let sel = d
                .stderr
                .lines()
                .find(|l| l.contains("NCCL_ALGO/NCCL_PROTO: all-reduce"))
                .unwrap_or_else(|| panic!("rank {}: no selector line:\n{}", d.rank, d.stderr_tail(30)));
            assert!(sel.contains(plans), "NCCL_ALGO={algo}: rank {} selected {sel:?}", d.rank);
        }
        oxccl_testkit::report!(
            "NCCL_ALGO={algo}: 2 hosts × 2 ranks at 1 Gbit/s, {cases} cases on every rank, all exact, {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    removed_entirely(c);
}

#[test]
fn a_rank_killed_mid_call_is_named_and_the_cluster_is_removed() {
    if let Some(_ctx) = oxccl_testkit::child("hosts_kill") {
        let comm = oxccl::Communicator::from_env().unwrap_or_else(|e| panic!("init failed: {e}"));
        let send = vec![1.0f32; 1 << 20];
        let mut recv = vec![0.0f32; 1 << 20];
        println!("READY");
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Err(e) = comm.all_reduce(&send, &mut recv, oxccl::ReduceOp::Sum) {
                println!("ERR {e}");
                std::process::exit(3);
            }
        }
        println!("NO ERROR");
        return;
    }
    let c = match Cluster::create(&spec()) {
        Ok(c) => c,
        Err(why) => {
            return oxccl_testkit::skip(
                "a_rank_killed_mid_call_is_named_and_the_cluster_is_removed",
                "network namespaces",
                &why,
            )
        }
    };
    let victim = 3;
    let outs = match launch(&c, "a_rank_killed_mid_call_is_named_and_the_cluster_is_removed", "hosts_kill")
        .env("OXCCL_TIMEOUT", "30")
        .kill_after(victim, Duration::from_millis(2500))
        .timeout(Duration::from_secs(120))
        .run_keep()
    {
        Ok(o) => o,
        Err((o, e)) if o.is_empty() => panic!("could not launch: {e}"),
        Err((o, _)) => o,
    };
    assert!(outs[victim].killed_at_ms.is_some(), "the victim was not killed");
    for o in outs.iter().filter(|o| o.rank != victim) {
        let err = o.stdout.lines().find(|l| l.starts_with("ERR")).unwrap_or_else(|| {
            panic!(
                "rank {}: no error after rank {victim} was killed:\n{}\n{}",
                o.rank,
                o.stdout,
                o.stderr_tail(20)
            )
        });
        assert!(err.contains(&format!("rank {victim}")), "rank {}: {err}", o.rank);
        assert_eq!(o.status.and_then(|s| s.code()), Some(3), "rank {}: {:?}", o.rank, o.status);
        // Killed 2.5 s after the launch; the survivors see the closed sockets at once.
        assert!(
            o.elapsed < Duration::from_secs(15),
            "rank {}: ended {:?} after the launch",
            o.rank,
            o.elapsed
        );
    }
    removed_entirely(c);
}

#[test]
fn channels_spread_over_two_rails_exact() {
    if let Some(ctx) = oxccl_testkit::child("hosts_rails") {
        return oxccl_testkit::matrixrun::rank_main(ctx);
    }
    let c = match Cluster::create(&two_rails()) {
        Ok(c) => c,
        Err(why) => {
            return oxccl_testkit::skip("channels_spread_over_two_rails_exact", "network namespaces", &why)
        }
    };
    let specs = "light,light-big";
    let cases: usize =
        specs.split(',').map(|s| matrix(4, &oxccl_testkit::matrixrun::spec_named(s)).len()).sum();
    let done = launch(&c, "channels_spread_over_two_rails_exact", "hosts_rails")
        .args(specs)
        .env("OXCCL_TIMEOUT", "120")
        .timeout(Duration::from_secs(600))
        .run()
        .unwrap_or_else(|e| panic!("two rails: {e}"));
    if let Err(e) = oxccl_testkit::matrixrun::check_summaries(&done, 4, cases) {
        panic!("two rails: every rank exited 0, but\n{e}");
    }
    for d in &done {
        // Channel 0 on the first rail, channel 1 on the second, to every rank of the other host.
        for (ch, rail) in [(0, 0), (1, 1)] {
            let host = (d.rank / 2 + 1) % 2;
            let addr = c.addr(host, rail);
            let want = format!("Channel {ch:02} : ");
            let tail = format!("rail {rail} of 2: {addr})");
            assert!(
                d.stderr.lines().any(|l| l.contains(&want) && l.ends_with(&tail)),
                "rank {} never connected channel {ch} on rail {rail} ({addr}):\n{}",
                d.rank,
                d.stderr_tail(40)
            );
        }
    }
    oxccl_testkit::report!("two rails: 2 hosts × 2 ranks, {cases} cases on every rank, all exact");
    removed_entirely(c);
}
