//! Runs of 64 MiB and more per rank, over shared memory and over TCP, checked exactly:
//! all-reduce of 64 MiB of f32 (heap and shared buffers), bf16 in place (shared), all-gather
//! into 64 MiB (shared), broadcast of 64 MiB.

use oxccl::{Communicator, DataType, ReduceOp};
use oxccl_testkit::{child, run_case, Case, Coll, Launch};
use std::time::{Duration, Instant};

const MIB64_F32: usize = 16 << 20;

fn rank() {
    let comm = Communicator::from_env().unwrap();
    let p = comm.size();
    let cases = [
        Case {
            coll: Coll::AllReduce,
            dtype: DataType::F32,
            op: Some(ReduceOp::Sum),
            count: MIB64_F32 + 5,
            in_place: false,
            root: 0,
            seed: 64,
            shared: false,
        },
        Case {
            coll: Coll::AllReduce,
            dtype: DataType::Bf16,
            op: Some(ReduceOp::Max),
            count: 2 * MIB64_F32,
            in_place: true,
            root: 0,
            seed: 65,
            shared: true,
        },
        Case {
            coll: Coll::AllGather,
            dtype: DataType::U8,
            op: None,
            count: (64 << 20) / p,
            in_place: false,
            root: 0,
            seed: 66,
            shared: true,
        },
        Case {
            coll: Coll::Broadcast,
            dtype: DataType::F64,
            op: None,
            count: 8 << 20,
            in_place: false,
            root: p - 1,
            seed: 67,
            shared: false,
        },
        Case {
            coll: Coll::AllReduce,
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

#[test]
fn large_buffers_shm_and_tcp() {
    if child("large").is_some() {
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
        for l in done[0].stdout.lines().filter(|l| l.contains("LARGE rank")) {
            oxccl_testkit::report!("  {l}");
        }
    }
}
