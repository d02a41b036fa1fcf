//! Asynchronous calls: work launched inside a scope, with handles to wait on or poll.
//!
//! [`Communicator::scope`] runs a closure that may launch groups (or single calls) without
//! waiting for them; every launched call completes before `scope` returns, even if the closure
//! panics. Buffers are borrowed for the scope's whole lifetime, so safe code cannot free, read
//! or write a buffer while a call uses it — the same reasoning as `std::thread::scope`.
//! Forgetting a [`Work`] handle is harmless: the scope still waits for the call.

use super::group::{Group, Scoped};
use super::Communicator;
use crate::error::{Error, Result};
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};

/// Completion of one launched call.
#[derive(Default)]
pub(crate) struct WorkState {
    res: Mutex<(bool, Option<Result<()>>)>,
    cv: Condvar,
}

impl WorkState {
    pub(crate) fn complete(&self, r: Result<()>) {
        let mut g = self.res.lock().unwrap_or_else(|e| e.into_inner());
        *g = (true, Some(r));
        self.cv.notify_all();
    }

    fn wait_done(&self) {
        let mut g = self.res.lock().unwrap_or_else(|e| e.into_inner());
        while !g.0 {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn take(&self) -> Result<()> {
        self.wait_done();
        let mut g = self.res.lock().unwrap_or_else(|e| e.into_inner());
        g.1.take().unwrap_or_else(|| Err(Error::Internal("work result taken twice".into())))
    }

    fn is_done(&self) -> bool {
        self.res.lock().unwrap_or_else(|e| e.into_inner()).0
    }
}

/// A handle to a launched call.
#[must_use = "a launched call runs anyway; wait() reports its result"]
pub struct Work<'scope> {
    st: Arc<WorkState>,
    _scope: PhantomData<&'scope ()>,
}

impl Work<'_> {
    /// Blocks until the call is complete on this rank; its result.
    pub fn wait(self) -> Result<()> {
        self.st.take()
    }

    /// Whether the call is complete (never blocks).
    pub fn test(&self) -> bool {
        self.st.is_done()
    }
}

/// A handle to a call launched by [`Group::launch_detached`](super::Group::launch_detached):
/// not tied to a scope, so a binding whose buffers are kept alive by reference counts (Python
/// objects) can hold it across calls.
#[must_use = "a launched call runs anyway; wait() reports its result"]
pub struct Detached {
    st: Arc<WorkState>,
    /// A receive from any rank's sender, set when it completes.
    from: Option<Arc<std::sync::OnceLock<oxccl_core::Rank>>>,
}

impl Detached {
    pub(super) fn new(st: Arc<WorkState>) -> Detached {
        Detached { st, from: None }
    }

    pub(super) fn with_source(
        st: Arc<WorkState>,
        from: Arc<std::sync::OnceLock<oxccl_core::Rank>>,
    ) -> Detached {
        Detached { st, from: Some(from) }
    }

    /// For a receive from any rank ([`Communicator::recv_any_detached`]): a handle that
    /// names the sender once the receive is complete (and stays unset if it failed).
    pub fn source(&self) -> Option<Arc<std::sync::OnceLock<oxccl_core::Rank>>> {
        self.from.clone()
    }

    /// Blocks until the call is complete on this rank; its result.
    pub fn wait(self) -> Result<()> {
        self.st.take()
    }

    /// Whether the call is complete (never blocks).
    pub fn test(&self) -> bool {
        self.st.is_done()
    }
}

/// A region in which calls may run asynchronously; see [`Communicator::scope`].
pub struct Scope<'scope, 'env: 'scope> {
    comm: &'env Communicator,
    pending: Mutex<Vec<Arc<WorkState>>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl Communicator {
    /// Runs `f`, in which calls can be launched without waiting; returns once `f` has returned
    /// and every call it launched is complete.
    ///
    /// ```no_run
    /// # fn demo(comm: &oxccl::Communicator) -> oxccl::Result<()> {
    /// let grads = vec![1.0f32; 1024];
    /// let mut sum = vec![0.0f32; 1024];
    /// comm.scope(|s| {
    ///     let work = s.all_reduce(&grads, &mut sum, oxccl::ReduceOp::Sum)?;
    ///     // ... other work while the all-reduce runs ...
    ///     work.wait()
    /// })?;
    /// assert!(sum.iter().all(|x| *x == comm.size() as f32));
    /// # Ok(()) }
    /// ```
    pub fn scope<'env, F, T>(&'env self, f: F) -> T
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
    {
        let scope =
            Scope { comm: self, pending: Mutex::new(Vec::new()), _scope: PhantomData, _env: PhantomData };
        let r = catch_unwind(AssertUnwindSafe(|| f(&scope)));
        scope.wait_all();
        match r {
            Ok(v) => v,
            Err(p) => resume_unwind(p),
        }
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Starts a group whose [`launch`](Group::launch) runs asynchronously.
    pub fn group(&'scope self) -> Group<'scope, Scoped<'scope, 'env>> {
        Group::new(self.comm, Scoped { scope: self })
    }

    pub(super) fn comm(&self) -> &Communicator {
        self.comm
    }

    pub(super) fn launch(
        &'scope self,
        ops: super::Ops,
        bufs: super::Bufs,
        what: &'static str,
    ) -> Result<Work<'scope>> {
        let st = Arc::new(WorkState::default());
        let st2 = st.clone();
        if ops.is_empty() {
            st.complete(Ok(()));
        } else {
            self.comm.submit(ops, bufs, what, Box::new(move |r| st2.complete(r)))?;
        }
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(st.clone());
        Ok(Work { st, _scope: PhantomData })
    }

    fn wait_all(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for st in pending {
            st.wait_done();
        }
    }
}
