//! A test binary's scope on disk: everything its processes write goes under one run root,
//! removed when the process ends, and oxccl's caches go to a test-scoped directory.
//!
//! Every test binary that links the kit (each file under `crates/*/tests/`, and `oxccl`'s unit
//! tests) invokes [`test_scope!`](crate::test_scope) once. Before `main` — one thread, so
//! setting the environment cannot race with test threads — the process:
//! 1. makes its run root `oxccl-test-<pid>` in the temporary directory and points `TMPDIR` at
//!    it, so the temporary files of the process, of the library under test (unique-id files,
//!    flight dumps of communicators that fail on purpose) and of every program it starts
//!    (ranks, C programs, `oxccl-perf`, `cc`) land there;
//! 2. sets `OXCCL_CACHE_DIR` to `<root>/cache` unless the environment already names one (a
//!    rank inherits its parent's, so one calibration serves a whole test run), so calibration
//!    and kernel caches never reach `~/.cache/oxccl`;
//! 3. removes the run root at exit (`atexit`: after libtest's last test, pass or fail). A rank
//!    killed on purpose leaves its root inside its parent's, which the parent removes.
//!
//! A test that wants its files gone when it ends (not only at exit) takes a [`Scratch`]: a
//! fresh directory in the temporary directory, removed when the guard drops, also when the
//! test panics.
//!
//! Programs that are not tests (the kit's examples, `oxccl-perf`) never invoke it: a user's
//! run keeps its temporary files and caches where the library puts them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

static ROOT: OnceLock<PathBuf> = OnceLock::new();
static CACHE_SCOPED: AtomicBool = AtomicBool::new(false);

/// The run root of this process, if its binary invoked [`test_scope!`](crate::test_scope).
pub fn root() -> Option<&'static PathBuf> {
    ROOT.get()
}

/// Whether this process set `OXCCL_CACHE_DIR` to its own run root's `cache` (it was unset).
pub fn cache_is_scoped() -> bool {
    CACHE_SCOPED.load(Ordering::Relaxed)
}

/// A fresh directory `<name>-<pid>-<n>` in the temporary directory (the run root in a test
/// binary); the caller removes it (or leaves it to the run root).
pub fn fresh_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::create_dir_all(&d);
    d
}

/// A test's own directory ([`fresh_dir`]), removed with everything in it when dropped.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        Scratch(fresh_dir(name))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

extern "C" fn leave() {
    if let Some(r) = ROOT.get() {
        let _ = std::fs::remove_dir_all(r);
    }
}

/// Enters the scope (what [`test_scope!`](crate::test_scope) runs before `main`); call it from
/// nowhere else: it sets environment variables, which is sound only while the process has one
/// thread.
#[doc(hidden)]
pub fn enter() {
    let root = std::env::temp_dir().join(format!("oxccl-test-{}", std::process::id()));
    if std::fs::create_dir_all(&root).is_err() || ROOT.set(root.clone()).is_err() {
        return;
    }
    std::env::set_var("TMPDIR", &root);
    if std::env::var_os("OXCCL_CACHE_DIR").is_none_or(|v| v.is_empty()) {
        std::env::set_var("OXCCL_CACHE_DIR", root.join("cache"));
        CACHE_SCOPED.store(true, Ordering::Relaxed);
    }
    // SAFETY: registers a plain function with no captured state; it runs once at exit.
    unsafe { libc::atexit(leave) };
}

/// Puts this test binary in its scope (see [`scope`](crate::scope)): invoke once per test
/// binary, at the top of the test file (or, for a library's unit tests, under `#[cfg(test)]`).
#[macro_export]
macro_rules! test_scope {
    () => {
        #[used]
        #[cfg_attr(any(target_os = "linux", target_os = "android"), link_section = ".init_array")]
        #[cfg_attr(target_vendor = "apple", link_section = "__DATA,__mod_init_func")]
        static OXCCL_TESTKIT_SCOPE: extern "C" fn() = {
            extern "C" fn enter() {
                $crate::scope::enter();
            }
            enter
        };
    };
}
