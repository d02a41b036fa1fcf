//! Collective and point-to-point calls: argument checks, group queues and execution.
//!
//! A call is checked completely when it is made (so its error comes back from the call that
//! was wrong, naming the argument), then either runs at once (outside a group) or joins this
//! thread's group queue. `ncclGroupEnd` runs the queue: one oxccl group per communicator, all
//! communicators concurrently (one thread may drive several ranks, as with
//! `ncclCommInitAll`), and queued inits and splits likewise.
//!
//! Memory kinds: a call on host memory completes before it returns, whatever the stream. A
//! call with device buffers (found by asking the CUDA driver, when the process has loaded
//! it) runs staged: its inputs are copied into pinned host mirrors on the caller's stream,
//! the collective runs on the mirrors, and the outputs go back on the same stream. The call
//! returns once they are enqueued: the communicator's proxy thread runs the collective when
//! the inputs have landed, and the stream waits for it before the outputs go back (see
//! [`staged`] and [`crate::proxy`]). `OXCCL_ASYNC_STREAMS=0` makes it return only once the
//! outputs have landed.
//!
//! Layout: `call.rs` (one checked call, and how calls on host memory run) is below this file
//! and the device paths `staged.rs` (host mirrors, run by the proxy) and `device.rs` (the
//! device engines), which name it and never this file; this file holds the thread's group
//! queue and [`run`], which picks the path. Rule: names the handles, never an entry point.

use crate::fail::{usage, Fail, R};
use crate::handle::{CommState, Tomb};
use oxccl::Communicator;
use std::cell::RefCell;

mod call;
use call::run_host;
pub use call::{dtype_of, Args, Call, Kind};

/// Runs `calls` on `comm` (whose state is `st`) as one oxccl group (a single call is a
/// group of one). Calls on host memory run now, after any stream-ordered ones still queued
/// on the communicator's proxy (the order every rank made them in).
pub fn run(st: &CommState, comm: &Communicator, calls: &[Call]) -> R<()> {
    #[cfg(feature = "cuda")]
    if let Some(r) = staged::run_if_device(st, comm, calls) {
        return r;
    }
    if st.proxy.pending() > 0 {
        st.proxy.drain();
    }
    st.proxy.check()?;
    run_host(comm, calls)
}

/// A queued management job (a communicator init or split made inside a group).
pub type Job = Box<dyn FnOnce() -> R<()> + Send>;

/// A thread's open group. Calls are queued by their communicator's tomb, unpinned: each is
/// pinned again when the group ends (a communicator destroyed meanwhile is refused then).
#[derive(Default)]
struct GroupState {
    depth: u32,
    calls: Vec<(&'static Tomb, Call)>,
    jobs: Vec<Job>,
    /// The first error a call inside the group returned: `ncclGroupEnd` returns it too and
    /// runs nothing.
    error: Option<Fail>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

pub fn group_start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Notes a call's failure inside a group (the group fails as a whole).
pub fn group_failed(f: &Fail) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(f.clone());
        }
    })
}

/// Queues `call` in the open group.
pub fn queue(tomb: &'static Tomb, call: Call) {
    GROUP.with(|g| g.borrow_mut().calls.push((tomb, call)));
}

/// Queues `job` in the open group, or runs it now.
pub fn submit_job(job: Job) -> R<()> {
    let job = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Some(job);
        }
        g.jobs.push(job);
        None
    });
    match job {
        Some(j) => j(),
        None => Ok(()),
    }
}

/// What `ncclGroupEnd` found to do, per communicator.
pub struct Ended {
    pub jobs: Vec<Job>,
    pub per_comm: Vec<(&'static Tomb, Vec<Call>)>,
}

/// Closes one level of grouping; at the outermost, takes the queue (or its error).
pub fn group_end() -> R<Option<Ended>> {
    let st = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(usage("ncclGroupEnd without a matching ncclGroupStart"));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut *g)))
    })?;
    let Some(st) = st else { return Ok(None) };
    if let Some(e) = st.error {
        return Err(e);
    }
    let mut per_comm: Vec<(&'static Tomb, Vec<Call>)> = Vec::new();
    for (t, call) in st.calls {
        match per_comm.iter_mut().find(|e| std::ptr::eq(e.0, t)) {
            Some(e) => e.1.push(call),
            None => per_comm.push((t, vec![call])),
        }
    }
    Ok(Some(Ended { jobs: st.jobs, per_comm }))
}

/// Runs every unit concurrently (the first on this thread); returns each unit's result.
pub fn run_all<T: Send>(units: Vec<T>, f: impl Fn(T) -> R<()> + Sync) -> Vec<R<()>> {
    let mut units = units.into_iter();
    let Some(first) = units.next() else { return Vec::new() };
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = units.map(|u| s.spawn(move || f(u))).collect();
        let mut out = vec![f(first)];
        for h in hs {
            out.push(h.join().unwrap_or_else(|_| {
                Err(Fail { code: crate::fail::INTERNAL_ERROR, msg: "a group thread panicked".into() })
            }));
        }
        out
    })
}

#[cfg(feature = "cuda")]
mod device;

#[cfg(feature = "cuda")]
mod staged;

#[cfg(all(test, feature = "cuda"))]
mod tests;
