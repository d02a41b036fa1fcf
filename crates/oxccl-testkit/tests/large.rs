//! Runs of 64 MiB and more per rank, over shared memory and over TCP, checked exactly:
//! all-reduce of 64 MiB of f32 (heap and shared buffers), bf16 in place (shared), all-gather
//! into 64 MiB (shared), broadcast of 64 MiB.

use oxccl::{Communicator, DataType, ReduceOp};
use oxccl_testkit::{child, run_case, Case, CaseColl, Launch};
use std::time::{Duration, Instant};

oxccl_testkit::test_scope!();

const MIB64_F32: usize = 16 << 20;

/// Cases each rank of `large_buffers_shm_and_tcp` runs (and reports with a `LARGE` line).
const LARGE_CASES: usize = 5;

fn rank() {
    let comm = Communicator::from_env().unwrap();
    let p = comm.size();
    let cases: [Case; LARGE_CASES] = [
        Case {
            coll: CaseColl::AllReduce,
            dtype: DataType::F32,
            op: Some(ReduceOp::Sum),
            count: MIB64_F32 + 5,
            in_place: false,
            root: 0,
            seed: 64,
            shared: false,
        },
        Case {
            coll: CaseColl::AllReduce,
            dtype: DataType::Bf16,
            op: Some(ReduceOp::Max),
            count: 2 * MIB64_F32,
            in_place: true,
            root: 0,
            seed: 65,
            shared: true,
        },
        Case {
            coll: CaseColl::AllGather,
            dtype: DataType::U8,
            op: None,
            count: (64 << 20) / p,
            in_place: false,
            root: 0,
            seed: 66,
            shared: true,
        },
        Case {
            coll: CaseColl::Broadcast,
            dtype: DataType::F64,
            op: None,
            count: 8 << 20,
            in_place: false,
            root: p - 1,
            seed: 67,
            shared: false,
        },
        Case {
            coll: CaseColl::AllReduce,
            dtype: DataType::F32,
            op: Some(ReduceOp::Sum),
            count: MIB64_F32 + 5,
            in_place: false,
            root: 0,
            seed: 68,
            shared: true,
        },
    ];
    for c in &cases {
        let t = Instant::now();
        run_case(&comm, c).unwrap_or_else(|e| panic!("{e}"));
        println!("\nLARGE rank {} {c}: exact ({:.2} s incl. check)", comm.rank(), t.elapsed().as_secs_f64());
    }
}

/// A container's trap: a tiny /dev/shm (Docker's default is 64 MiB). oxccl's shared memory is
/// memfd, never a /dev/shm file, so 64 MiB collectives over shared memory work with a 64 KiB
/// /dev/shm. Each rank runs in its own mount namespace with such a /dev/shm mounted.
fn tiny_dev_shm_rank() {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    // The last /dev/shm mount is the one in effect (the test's, over the host's).
    let shm = mounts.lines().rfind(|l| l.split(' ').nth(1) == Some("/dev/shm")).unwrap_or("");
    assert!(shm.contains("size=64k"), "the test's tiny /dev/shm is not mounted here: {shm:?}");
    let comm = Communicator::from_env().unwrap();
    for (seed, shared) in [(70, true), (71, false)] {
        let c = Case {
            coll: CaseColl::AllReduce,
            dtype: DataType::F32,
            op: Some(ReduceOp::Sum),
            count: MIB64_F32 + 5,
            in_place: false,
            root: 0,
            seed,
            shared,
        };
        run_case(&comm, &c).unwrap_or_else(|e| panic!("{e}"));
        println!("TINYSHM rank {} {c}: exact", comm.rank());
    }
}

#[test]
fn a_64k_dev_shm_does_not_limit_shared_memory() {
    if let Some(_ctx) = child("tinyshm") {
        return tiny_dev_shm_rank();
    }
    let probe = std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k oxccl-tiny /dev/shm",
        ])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match &probe {
            Ok(o) => format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => format!("cannot run unshare: {e}"),
        };
        return oxccl_testkit::skip(
            "a_64k_dev_shm_does_not_limit_shared_memory",
            "a mount namespace with its own /dev/shm",
            &why,
        );
    }
    let id = oxccl::new_unique_id(&oxccl::Config::default()).unwrap();
    let mut l = Launch::new("a_64k_dev_shm_does_not_limit_shared_memory", "tinyshm", 4)
        .env("OXCCL_UNIQUE_ID", &id.to_string())
        .env("OXCCL_TIMEOUT", "300")
        .timeout(Duration::from_secs(600));
    let wrap: Vec<String> = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs -o size=64k oxccl-tiny /dev/shm && exec \"$@\"",
        "sh",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    l.wrap = vec![wrap; 4];
    let done = l.run().unwrap_or_else(|e| panic!("{e}"));
    for d in &done {
        let n = d.stdout.matches(&format!("TINYSHM rank {} ", d.rank)).count();
        assert_eq!(n, 2, "rank {} reported {n} of its 2 cases:\n{}", d.rank, d.stdout);
    }
}

#[test]
fn large_buffers_shm_and_tcp() {
    if let Some(_ctx) = child("large") {
        return rank();
    }
    for shm_off in ["0", "1"] {
        let id = oxccl::new_unique_id(&oxccl::Config::default()).unwrap();
        let t = Instant::now();
        let done = Launch::new("large_buffers_shm_and_tcp", "large", 4)
            .env("OXCCL_UNIQUE_ID", &id.to_string())
            .env("NCCL_SHM_DISABLE", shm_off)
            .env("OXCCL_TIMEOUT", "300")
            .timeout(Duration::from_secs(600))
            .run()
            .unwrap_or_else(|e| panic!("NCCL_SHM_DISABLE={shm_off}:\n{e}"));
        oxccl_testkit::report!(
            "large buffers, 4 ranks, NCCL_SHM_DISABLE={shm_off}: {:.1} s",
            t.elapsed().as_secs_f64()
        );
        // Every rank ran every case: each printed one LARGE line per case.
        for d in &done {
            let lines = d.stdout.lines().filter(|l| l.starts_with(&format!("LARGE rank {} ", d.rank)));
            let n = lines.filter(|l| l.contains(": exact (")).count();
            assert_eq!(
                n, LARGE_CASES,
                "NCCL_SHM_DISABLE={shm_off}: rank {} reported {n} of {LARGE_CASES} cases exact:\n{}",
                d.rank, d.stdout
            );
        }
        for l in done[0].stdout.lines().filter(|l| l.contains("LARGE rank")) {
            oxccl_testkit::report!("  {l}");
        }
    }
}
