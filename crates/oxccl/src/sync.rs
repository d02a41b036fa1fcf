//! The atomics of the shared-memory protocols, through one door: `std`'s normally, loom's
//! under the `model` feature, so the model checks (`cargo test -p oxccl --features model --lib
//! model::`, see docs/architecture.md) run the protocols' own step functions.
//!
//! Rules:
//! 1. The modules whose protocols are modelled (`transport::shm`'s slot header,
//!    `transport::hostmem`'s control block, `cuda::group::meeting`, the CPU model of the
//!    device meeting) take the atomics and fences of the modelled state from here, not from
//!    `std::sync::atomic` (shm's LL/LL128 lines stay `std`'s: oxccl-core's, not modelled).
//! 2. These are plain re-exports: nothing is wrapped, so the production build's code is the
//!    same as with `std`'s types (no indirection, no call).
//! 3. A build with `model` is for the models only: loom's atomics live in loom's execution,
//!    not in the bytes they occupy, so a header mapped from a shared file means nothing there
//!    and every loom atomic must be made and used inside `loom::model`. The models build the
//!    protocols' state in ordinary memory and run each side's steps on it.

#[cfg(feature = "model")]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(feature = "model"))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Runs `f` under loom for every interleaving (and every value a load may return) within
/// `preemptions` preemptions of a thread (`None`: unbounded; loom's `LOOM_MAX_PREEMPTIONS`
/// stands instead where set), prints how many executions that was, and returns it. A failed
/// assertion, a data race or a deadlock in any execution panics with loom's report of it.
#[cfg(all(test, feature = "model"))]
pub(crate) fn model(name: &str, preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) -> usize {
    use std::sync::atomic::{AtomicUsize as Count, Ordering::Relaxed};
    use std::sync::Arc;
    let runs = Arc::new(Count::new(0));
    let counted = runs.clone();
    let mut b = loom::model::Builder::new();
    // loom's own LOOM_MAX_PREEMPTIONS, where set, stands instead (to explore more, or less).
    b.preemption_bound = b.preemption_bound.or(preemptions);
    b.max_branches = 100_000;
    let t = std::time::Instant::now();
    b.check(move || {
        counted.fetch_add(1, Relaxed);
        f()
    });
    let n = runs.load(Relaxed);
    println!("model {name}: {n} executions in {:.1} s", t.elapsed().as_secs_f64());
    n
}

/// A plain (non-atomic) word of a model, standing for bytes a protocol moves with ordinary
/// copies (slots, inline areas, buffers): loom reports an access to it that is not ordered
/// after every conflicting one as a data race.
#[cfg(all(test, feature = "model"))]
pub(crate) type Plain = loom::cell::UnsafeCell<u64>;

/// Writes a model's plain word.
#[cfg(all(test, feature = "model"))]
pub(crate) fn plain_write(c: &Plain, v: u64) {
    // SAFETY: the pointer is the cell's own, valid for the call; loom checks the access
    // against every other (a race fails the model before the write happens).
    c.with_mut(|d| unsafe { *d = v })
}

/// Reads a model's plain word.
#[cfg(all(test, feature = "model"))]
pub(crate) fn plain_read(c: &Plain) -> u64 {
    // SAFETY: as in `plain_write`.
    c.with(|d| unsafe { *d })
}
