//! Skips that cannot hide a missing capability.
//!
//! A test that cannot run here (no network namespaces, no mount namespace, no NVRTC, no
//! PyTorch, no Open MPI) calls [`skip`]; one whose capability this kernel cannot have at all
//! (no `sch_netem`) calls [`skip_unavailable`]. Rules:
//! 1. Under `OXCCL_REQUIRE_ALL=1` (CI sets it) [`skip`] fails the test: CI provides every
//!    such capability, so a skip there means CI's set-up is broken, not that the test passed.
//! 2. Every skip prints `SKIPPED <test>: <what>: <why>` on stderr (shown under libtest's
//!    capture) and appends the same line to the file `OXCCL_SKIP_LOG` names, if set, so CI can
//!    list every skip at the end of its log.

/// Whether skips of capabilities CI provides are failures (`OXCCL_REQUIRE_ALL=1`).
pub fn required() -> bool {
    std::env::var("OXCCL_REQUIRE_ALL").is_ok_and(|v| v.trim() == "1")
}

fn record(line: &str) {
    crate::report!("{line}");
    if let Some(path) = std::env::var_os("OXCCL_SKIP_LOG") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Test `test` cannot get `what` here, for `why`: a skip, or under `OXCCL_REQUIRE_ALL=1` a
/// failure (panics). The caller returns after it.
#[track_caller]
pub fn skip(test: &str, what: &str, why: &str) {
    if required() {
        panic!("{test}: {what} is unavailable ({why}), and OXCCL_REQUIRE_ALL=1 makes that a failure");
    }
    record(&format!("SKIPPED {test}: {what}: {why}"));
}

/// Test `test` cannot get `what`, which this machine cannot provide at all (say, a kernel
/// module it lacks), for `why`: a skip even under `OXCCL_REQUIRE_ALL=1`, listed by CI.
pub fn skip_unavailable(test: &str, what: &str, why: &str) {
    record(&format!("SKIPPED {test}: {what} (not available on this machine): {why}"));
}
