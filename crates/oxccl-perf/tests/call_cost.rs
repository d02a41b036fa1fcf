//! The instruction budget of the common small call: an 8-byte all-reduce between two ranks
//! of one host, counted by valgrind's callgrind on rank 0 (instructions, not seconds: the
//! same for the same binary, whatever the machine's load). Waiting for the peer is left
//! out by name (`Direct::wait_all`), as its count depends on when the peer arrives.
//!
//! The budget and its reason live in `tests/call_cost.budget`. Without valgrind the test
//! skips, which `OXCCL_REQUIRE_ALL=1` (CI, which installs it) turns into a failure.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

oxccl_testkit::test_scope!();

const EXE: &str = env!("CARGO_BIN_EXE_oxccl-callcost");
const BUDGET: &str = include_str!("call_cost.budget");
const CALLS: usize = 2000;

fn budget(key: &str) -> (u64, String) {
    let mut lines = BUDGET.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    while let Some(l) = lines.next() {
        let mut f = l.split_whitespace();
        if f.next() == Some(key) {
            let n = f.next().and_then(|v| v.parse().ok()).expect("a budget number");
            let reason = lines.next().and_then(|r| r.strip_prefix("reason: ")).expect("a reason line");
            return (n, reason.to_string());
        }
    }
    panic!("no budget for {key} in tests/call_cost.budget");
}

/// The program total, and the inclusive instructions of the function whose name contains
/// `name` (callgrind lists a function's inlined pieces from other source files as functions
/// of their own, called from it: the largest entry is the whole function).
fn annotate(out: &std::path::Path, name: &str) -> (u64, u64) {
    let o = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(out)
        .output()
        .expect("callgrind_annotate runs");
    let text = String::from_utf8_lossy(&o.stdout);
    let num = |l: &str| -> Option<u64> { l.split_whitespace().next()?.replace(',', "").parse().ok() };
    let total = text
        .lines()
        .find(|l| l.contains("PROGRAM TOTALS"))
        .and_then(num)
        .unwrap_or_else(|| panic!("no PROGRAM TOTALS in callgrind_annotate's output:\n{text}"));
    let named: u64 = text.lines().filter(|l| l.contains(name)).filter_map(num).max().unwrap_or(0);
    (total, named)
}

#[test]
fn an_eight_byte_all_reduce_stays_within_its_instruction_budget() {
    let test = "call_cost::an_eight_byte_all_reduce_stays_within_its_instruction_budget";
    if Command::new("valgrind").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        oxccl_testkit::skip(test, "valgrind", "not installed (apt-get install valgrind)");
        return;
    }
    let (limit, reason) = budget("all_reduce_8B_P2_direct_inline");
    let dir = std::env::temp_dir().join(format!("oxccl-callcost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("callgrind.out");
    let calls = CALLS.to_string();
    let mut peer = Command::new(EXE)
        .args(["--rank", "1", "--calls", &calls])
        .stdout(Stdio::piped())
        .spawn()
        .expect("oxccl-callcost starts");
    let mut line = String::new();
    BufReader::new(peer.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let id = line.strip_prefix("id ").map(str::trim).unwrap_or_else(|| panic!("rank 1 printed {line:?}"));
    let r0 = Command::new("valgrind")
        .args(["--tool=callgrind", "--collect-atstart=no", "--toggle-collect=oxccl_callcost_measured"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args([EXE, "--rank", "0", "--id", id, "--calls", &calls])
        .output()
        .expect("valgrind runs");
    let p1 = peer.wait().unwrap();
    assert!(
        r0.status.success() && p1.success(),
        "rank 0 under callgrind: {:?}, rank 1: {p1:?}\n{}",
        r0.status,
        String::from_utf8_lossy(&r0.stderr)
    );
    let (total, waiting) = annotate(&out, "Direct::wait_all");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        waiting > 0,
        "no instructions attributed to Direct::wait_all: the call did not take the direct path"
    );
    let per_call = (total - waiting) / CALLS as u64;
    oxccl_testkit::report!(
        "8-byte all-reduce, 2 ranks: {per_call} instructions per call besides waiting \
         ({total} in all over {CALLS} calls, {waiting} waiting); budget {limit}"
    );
    assert!(
        per_call <= limit,
        "an 8-byte all-reduce now executes {per_call} instructions per call besides waiting, over \
         its budget of {limit} (tests/call_cost.budget: {reason}). Find what the call path gained \
         (callgrind_annotate on a run of oxccl-callcost), or raise the budget with a reason."
    );
}
