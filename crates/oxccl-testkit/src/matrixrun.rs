//! The rank side and the launching side of the collective test matrix.
//!
//! Rule: a launch passes only if every rank printed its summary line (`MATRIX rank R of P: N
//! cases, 0 failed`) with the number of cases the spec gives for P ([`check_summaries`]), so a
//! rank that ran fewer cases, or none, fails the test even if it exited 0.

use crate::cases::{matrix, run_case, CaseColl, MatrixSpec};
use crate::spawn::{ChildCtx, Finished, Launch};
use oxccl::{Communicator, Config, DataType};
use std::time::{Duration, Instant};

/// Counts in the matrix: all combinations at the small ones, roots rotating at the big one.
pub fn standard_spec() -> MatrixSpec {
    MatrixSpec {
        full_counts: vec![0, 1, 7],
        big_counts: vec![(1 << 20) + 3],
        colls: CaseColl::ALL.to_vec(),
        dtypes: DataType::ALL.to_vec(),
        shared_counts: vec![2000, (1 << 20) + 3],
        shared_dtypes: vec![
            DataType::U8,
            DataType::I64,
            DataType::F32,
            DataType::F64,
            DataType::Bf16,
            DataType::F8E5M2,
        ],
    }
}

/// The spec named by a launch's arguments: `standard`, or `light` (every collective and data
/// type at counts 0, 1, 7; the big count for f32, u8 and bf16 only).
pub fn spec_named(name: &str) -> MatrixSpec {
    match name {
        "light" => MatrixSpec {
            full_counts: vec![0, 1, 7],
            big_counts: vec![],
            colls: CaseColl::ALL.to_vec(),
            dtypes: DataType::ALL.to_vec(),
            shared_counts: vec![],
            shared_dtypes: vec![],
        },
        "light-big" => MatrixSpec {
            full_counts: vec![],
            big_counts: vec![(1 << 20) + 3],
            colls: CaseColl::ALL.to_vec(),
            dtypes: vec![DataType::F32, DataType::U8, DataType::Bf16],
            shared_counts: vec![(1 << 20) + 3],
            shared_dtypes: vec![DataType::F32],
        },
        _ => standard_spec(),
    }
}

/// A rank of a matrix launch: runs every case, prints a summary line and every failure, and
/// panics (non-zero exit) if any case failed.
pub fn rank_main(ctx: ChildCtx) {
    let comm = Communicator::from_env().unwrap_or_else(|e| panic!("init failed: {e}"));
    let mut cases = Vec::new();
    for name in ctx.args.split(',').filter(|s| !s.is_empty()).chain(ctx.args.is_empty().then_some("standard"))
    {
        cases.extend(matrix(comm.size(), &spec_named(name)));
    }
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut per_coll: std::collections::BTreeMap<&str, (usize, f64)> = Default::default();
    for c in &cases {
        let t = Instant::now();
        let r = run_case(&comm, c);
        let e = per_coll.entry(c.coll.name()).or_default();
        e.0 += 1;
        e.1 += t.elapsed().as_secs_f64();
        if let Err(e) = r {
            let fatal = e.contains("call failed");
            failures.push(format!("rank {}: {e}", comm.rank()));
            if fatal || failures.len() >= 20 {
                break;
            }
        }
    }
    println!(
        "\nMATRIX rank {} of {}: {} cases, {} failed, {:.1} s",
        comm.rank(),
        comm.size(),
        cases.len(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    for (k, (n, t)) in &per_coll {
        println!("MATRIX   {k}: {n} cases, {t:.2} s");
    }
    for f in &failures {
        println!("FAIL {f}");
    }
    assert!(failures.is_empty(), "{} case(s) failed", failures.len());
}

/// The summary line rank `rank` of `size` prints after running `cases` cases, all exact.
fn summary(rank: usize, size: usize, cases: usize) -> String {
    format!("MATRIX rank {rank} of {size}: {cases} cases, 0 failed,")
}

/// Checks that each of the `size` ranks in `done` printed its summary line for `cases` exact
/// cases; `Err` names every rank that did not.
pub fn check_summaries(done: &[Finished], size: usize, cases: usize) -> Result<(), String> {
    let mut missing = Vec::new();
    for r in 0..size {
        let want = summary(r, size, cases);
        let said =
            done.iter().find(|d| d.rank == r).is_some_and(|d| d.stdout.lines().any(|l| l.starts_with(&want)));
        if !said {
            let got = done.iter().find(|d| d.rank == r).map_or(String::from("no output"), |d| {
                d.stdout.lines().filter(|l| l.starts_with("MATRIX rank")).collect::<Vec<_>>().join(" / ")
            });
            missing.push(format!("rank {r} did not print {want:?} (it printed: {got:?})"));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join("\n"))
    }
}

/// Launches the matrix on `size` ranks with the extra environment `env`; returns the number of
/// cases each rank ran.
pub fn launch_matrix(
    test: &str,
    scenario: &str,
    size: usize,
    env: &[(&str, &str)],
    timeout: Duration,
) -> usize {
    let id = oxccl::new_unique_id(&Config::default()).expect("unique id");
    let mut l = Launch::new(test, scenario, size)
        .args("standard")
        .env("OXCCL_UNIQUE_ID", &id.to_string())
        .env("OXCCL_TIMEOUT", "120")
        .timeout(timeout);
    for (k, v) in env {
        l = l.env(k, v);
    }
    let started = Instant::now();
    match l.run() {
        Ok(done) => {
            let n = matrix(size, &standard_spec()).len();
            if let Err(e) = check_summaries(&done, size, n) {
                panic!("matrix {scenario} P={size}: every rank exited 0, but\n{e}");
            }
            crate::report!(
                "matrix {scenario} P={size}: {n} cases on every rank, all exact, {:.1} s",
                started.elapsed().as_secs_f64()
            );
            for d in &done {
                let lines = d.stdout.lines().filter(|l| l.starts_with("MATRIX"));
                for l in lines.filter(|l| d.rank == 0 || !l.starts_with("MATRIX  ")) {
                    crate::report!("  {l}");
                }
            }
            n
        }
        Err(e) => panic!("matrix {scenario} P={size} failed:\n{e}"),
    }
}
