//! A communicator's proxy: the thread that runs its stream-ordered work after the calls that
//! enqueued it have returned.
//!
//! A call on device buffers returns once its copies and a stream wait are enqueued on the
//! caller's stream (see `ops::staged`); the collective itself runs here, in call order, one
//! job at a time. The thread is started by the first job and leaves after a short idle spell
//! (it sleeps on a condition variable meanwhile, never spins), so an idle communicator holds
//! no thread.
//!
//! Invariants: jobs run in submission order, never two at once; `pending` counts jobs
//! submitted and not yet finished, so `pending == 0` means every job has returned; the first
//! job that fails is kept as the communicator's asynchronous error, and the jobs after it
//! still run (each has to release the stream that waits for it). The thread borrows the
//! proxy for `'static`: a proxy that is freed at all (with its communicator's state) is
//! [`stop`](Proxy::stop)ped first, which runs every job and joins the thread.

use crate::fail::{lock, Fail, INTERNAL_ERROR, R};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Work for the proxy.
pub type Job = Box<dyn FnOnce() -> R<()> + Send>;

/// How long an idle proxy thread waits for more work before it leaves.
const IDLE: Duration = Duration::from_millis(200);

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// A thread is serving the queue.
    running: bool,
    /// The serving thread (or the last one, which has left or is leaving).
    thread: Option<std::thread::JoinHandle<()>>,
    /// Set by `stop`: the thread leaves once the queue is empty.
    stop: bool,
}

#[derive(Default)]
pub struct Proxy {
    q: Mutex<Queue>,
    /// Signalled when a job is queued (to the thread) and when one finishes (to `drain`).
    cv: Condvar,
    pending: AtomicUsize,
    failed: AtomicBool,
    error: Mutex<Option<Fail>>,
    /// Stream-wait sequence numbers handed out (`ops::staged`).
    pub seq: AtomicU32,
    /// The pinned word streams wait on: `(host address, device address)` (`ops::staged`).
    pub flag: OnceLock<(usize, u64)>,
    /// What jobs leave to be dropped on a calling thread ([`bury`](Self::bury),
    /// [`clear_graves`](Self::clear_graves)): CUDA objects whose release takes the driver's
    /// context lock, which a calling thread may hold while it waits for a stream that waits
    /// for this very proxy.
    graves: Mutex<Vec<Box<dyn Send>>>,
}

impl Proxy {
    /// Queues `job` behind every earlier one; starts the thread if none serves the queue.
    pub fn submit(&'static self, job: Job) -> R<()> {
        self.pending.fetch_add(1, Ordering::AcqRel);
        let mut q = lock(&self.q);
        q.jobs.push_back(job);
        if q.running {
            drop(q);
            self.cv.notify_all();
            return Ok(());
        }
        q.running = true;
        // A thread that left after an idle spell has released the lock for good: joining it
        // (at once) keeps every thread this proxy started accounted for.
        if let Some(t) = q.thread.take() {
            let _ = t.join();
        }
        let spawned = std::thread::Builder::new().name("oxccl-proxy".into()).spawn(move || self.serve());
        match spawned {
            Ok(t) => q.thread = Some(t),
            Err(e) => {
                // Nothing serves the queue: take the job back out, so `drain` does not wait on it.
                q.running = false;
                let n = q.jobs.len();
                q.jobs.clear();
                drop(q);
                self.pending.fetch_sub(n, Ordering::AcqRel);
                self.cv.notify_all();
                return Err(Fail {
                    code: crate::fail::SYSTEM_ERROR,
                    msg: format!("cannot start the proxy thread: {e}"),
                });
            }
        }
        Ok(())
    }

    /// Runs every job submitted so far, then ends the thread (joined before this returns):
    /// after it, nothing borrows the proxy. For a proxy about to be freed: no job may be
    /// submitted meanwhile.
    pub fn stop(&self) {
        self.drain();
        let t = {
            let mut q = lock(&self.q);
            q.stop = true;
            q.thread.take()
        };
        self.cv.notify_all();
        if let Some(t) = t {
            let _ = t.join();
        }
    }

    fn serve(&'static self) {
        loop {
            let job = {
                let mut q = lock(&self.q);
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break j;
                    }
                    if q.stop {
                        q.running = false;
                        return;
                    }
                    let (g, t) = self.cv.wait_timeout(q, IDLE).unwrap_or_else(|e| e.into_inner());
                    q = g;
                    if t.timed_out() && q.jobs.is_empty() {
                        q.running = false;
                        return;
                    }
                }
            };
            let r = catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|_| {
                Err(Fail { code: INTERNAL_ERROR, msg: "a stream-ordered job panicked".into() })
            });
            if let Err(f) = r {
                let mut e = lock(&self.error);
                if e.is_none() {
                    *e = Some(f);
                    self.failed.store(true, Ordering::Release);
                }
            }
            // Under the lock, so a `drain` that saw pending > 0 is waiting when we notify.
            let _g = lock(&self.q);
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.cv.notify_all();
        }
    }

    /// Keeps `x` to be dropped later on a calling thread (from a job: never drop a CUDA
    /// object on the proxy thread).
    pub fn bury(&self, x: Box<dyn Send>) {
        lock(&self.graves).push(x);
    }

    /// Drops what jobs buried (on the calling thread).
    pub fn clear_graves(&self) {
        let v = std::mem::take(&mut *lock(&self.graves));
        drop(v);
    }

    /// Jobs submitted and not finished.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Waits until every job submitted so far has finished, then drops what they buried
    /// (called on calling threads only).
    pub fn drain(&self) {
        if self.pending() > 0 {
            let mut q = lock(&self.q);
            while self.pending() > 0 {
                q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.clear_graves();
    }

    /// Waits until fewer than `n` jobs are pending.
    pub fn wait_below(&self, n: usize) {
        if self.pending() < n {
            return;
        }
        let mut q = lock(&self.q);
        while self.pending() >= n {
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// `Err` naming the first failed job, if one failed: the communicator then refuses calls.
    pub fn check(&self) -> R<()> {
        match self.error() {
            None => Ok(()),
            Some(f) => Err(Fail {
                code: f.code,
                msg: format!("an earlier call enqueued on a stream failed: {}", f.msg),
            }),
        }
    }

    /// The first failure of a job, if one failed.
    pub fn error(&self) -> Option<Fail> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.error).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn leak() -> &'static Proxy {
        Box::leak(Box::default())
    }

    /// Jobs run in the order they were submitted, one at a time, after the submitter has
    /// returned; `drain` returns only once all have finished.
    #[test]
    fn jobs_run_in_order_and_drain_waits_for_them() {
        let p = leak();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        {
            let (log, gate) = (log.clone(), gate.clone());
            p.submit(Box::new(move || {
                let mut open = lock(&gate.0);
                while !*open {
                    open = gate.1.wait(open).unwrap();
                }
                log.lock().unwrap().push(0);
                Ok(())
            }))
            .unwrap();
        }
        for i in 1..50 {
            let log = log.clone();
            p.submit(Box::new(move || {
                log.lock().unwrap().push(i);
                Ok(())
            }))
            .unwrap();
        }
        // The first job is held at its gate: nothing has run, all 50 are pending.
        assert_eq!(p.pending(), 50);
        assert!(log.lock().unwrap().is_empty());
        *lock(&gate.0) = true;
        gate.1.notify_all();
        p.drain();
        assert_eq!(p.pending(), 0);
        assert_eq!(*log.lock().unwrap(), (0..50).collect::<Vec<_>>());
        assert!(p.error().is_none());
    }

    /// The first failing job is the asynchronous error; later jobs still run, and a panic in a
    /// job is an error, not a dead proxy.
    #[test]
    fn the_first_failure_is_kept_and_later_jobs_still_run() {
        let p = leak();
        let ran = Arc::new(AtomicUsize::new(0));
        let fail = |m: &str| Fail { code: 6, msg: m.to_string() };
        let (a, b) = (fail("first"), fail("second"));
        p.submit(Box::new(move || Err(a))).unwrap();
        p.submit(Box::new(|| panic!("boom"))).unwrap();
        p.submit(Box::new(move || Err(b))).unwrap();
        let r = ran.clone();
        p.submit(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
        p.drain();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        let e = p.error().expect("an error is kept");
        assert_eq!((e.code, e.msg.as_str()), (6, "first"));
    }

    /// What a job buries is dropped on the calling thread (by `drain` here), never on the
    /// proxy's.
    #[test]
    fn buried_values_are_dropped_on_the_calling_thread() {
        struct Grave(Arc<Mutex<Option<std::thread::ThreadId>>>);
        impl Drop for Grave {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = Some(std::thread::current().id());
            }
        }
        let p = leak();
        let dropped_on = Arc::new(Mutex::new(None));
        let d = dropped_on.clone();
        p.submit(Box::new(move || {
            p.bury(Box::new(Grave(d)));
            Ok(())
        }))
        .unwrap();
        p.wait_below(1);
        assert_eq!(*dropped_on.lock().unwrap(), None, "dropped before the calling thread cleared it");
        p.drain();
        assert_eq!(*dropped_on.lock().unwrap(), Some(std::thread::current().id()));
    }

    /// An idle proxy's thread leaves, and the next job starts a new one.
    #[test]
    fn an_idle_proxy_thread_leaves_and_comes_back() {
        let p = leak();
        p.submit(Box::new(|| Ok(()))).unwrap();
        p.drain();
        let t0 = std::time::Instant::now();
        while lock(&p.q).running {
            assert!(t0.elapsed() < Duration::from_secs(10), "the idle proxy thread never left");
            std::thread::sleep(Duration::from_millis(20));
        }
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        p.submit(Box::new(move || {
            r.store(true, Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
        p.drain();
        assert!(ran.load(Ordering::SeqCst));
    }
}
