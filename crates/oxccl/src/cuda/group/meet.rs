//! What the ranks of a thread group share: the host meeting (`exchange`: every rank's entry
//! once all have given theirs, or the missing ones named), the lone-LL announcements and the
//! issue order they keep, the GPU meeting's counters and failure record, the mailbox of
//! sends, and the LL/LL128 buffers.

use super::*;

pub(super) struct Shared {
    pub(super) p: usize,
    /// `Round::generation`, readable without the lock (for the spin).
    pub(super) generation: AtomicU64,
    pub(super) round: Mutex<Round>,
    pub(super) cv: Condvar,
    /// Sends posted and not yet taken, per (sender, receiver), in order.
    pub(super) mail: Mutex<HashMap<(usize, usize), VecDeque<Post>>>,
    pub(super) mail_cv: Condvar,
    /// Set when a rank gave up waiting on the host: the group is unusable from then on.
    pub(super) broken: Mutex<Option<String>>,
    /// Longest wait at a meeting, on the host and on the GPU; `None`: forever.
    pub(super) timeout: Option<Duration>,
    /// The GPU meeting's counters (zeroed at creation).
    pub(super) bar: Option<DevBuf>,
    /// Host address and device address of the host-mapped failure record `u32[4]`.
    pub(super) fail_host: usize,
    pub(super) fail_dev: u64,
    /// For synchronising before the counters are freed.
    pub(super) dev: Option<Device>,
    /// The device every member uses, and the kernels loaded on it.
    pub(super) ordinal: i32,
    pub(super) kernels: Option<Arc<Kernels>>,
    /// Which ranks have joined (by [`join`]).
    pub(super) joined: Mutex<Vec<bool>>,
    /// Per rank: how its latest collective calls went, and its latest stream.
    pub(super) announced: Vec<Announced>,
    /// Ranks asleep in `wait_issued`, and where they sleep (woken by `set_issued`).
    pub(super) issued_sleepers: AtomicUsize,
    pub(super) issued_mx: Mutex<()>,
    pub(super) issued_cv: Condvar,
    /// The LL buffer: `p * 2 * p * (LL_LINES + 1)` lines of 16 bytes (zeroed at creation).
    pub(super) ll: Option<DevBuf>,
    /// The LL128 buffer: `p * 2 * p * (LL128_LINES + 1)` lines of 128 bytes (zeroed).
    pub(super) ll128: Option<DevBuf>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Kernels still queued read the counters: let them finish before the memory goes.
        if let Some(d) = &self.dev {
            if d.make_current().is_ok() {
                // SAFETY: no arguments; waits for the context's work.
                let _ = unsafe { (d.d.ctx_synchronize)() };
            }
        }
    }
}

impl Shared {
    pub(super) fn new(p: usize, timeout: Option<Duration>) -> Shared {
        Shared {
            p,
            generation: Default::default(),
            round: Mutex::new(Round::default()),
            cv: Condvar::new(),
            mail: Mutex::new(HashMap::new()),
            mail_cv: Condvar::new(),
            broken: Mutex::new(None),
            timeout,
            bar: None,
            fail_host: 0,
            fail_dev: 0,
            dev: None,
            ordinal: 0,
            kernels: None,
            joined: Mutex::new(vec![false; p]),
            announced: (0..p).map(|_| Announced::default()).collect(),
            issued_sleepers: AtomicUsize::new(0),
            issued_mx: Mutex::new(()),
            issued_cv: Condvar::new(),
            ll: None,
            ll128: None,
        }
    }

    /// A group's shared state on device `ordinal`: counters zeroed, kernels loaded.
    pub(super) fn create(p: usize, ordinal: i32, timeout: Option<Duration>) -> Result<Shared, CudaError> {
        if !(1..=MAX_RANKS).contains(&p) {
            return Err(CudaError::Invalid(format!("a thread group has 1 to {MAX_RANKS} ranks, not {p}")));
        }
        let dev = Device::open(ordinal)?;
        let bar = DevBuf::new(&dev, BAR_BYTES)?;
        let ll_bytes = p * 2 * p * (LL_LINES + 1) * 16;
        let ll = DevBuf::new(&dev, ll_bytes)?;
        let ll128_bytes = p * 2 * p * (LL128_LINES + 1) * 128;
        let ll128 = DevBuf::new(&dev, ll128_bytes)?;
        let zero = Stream::new(&dev)?;
        zero.fill(bar.ptr, 0, BAR_BYTES)?;
        zero.fill(ll.ptr, 0, ll_bytes)?;
        zero.fill(ll128.ptr, 0, ll128_bytes)?;
        zero.sync()?;
        let (fail_host, fail_dev) = crate::cuda::stage::stream_flag()?;
        // SAFETY: the flag is 64 bytes of pinned memory, leaked, nothing uses it yet.
        unsafe { std::ptr::write_bytes(fail_host as *mut u8, 0, 16) };
        let mut shared = Shared::new(p, timeout);
        shared.kernels = Some(Arc::new(Kernels::load(&dev, &[])?));
        shared.bar = Some(bar);
        shared.ll = Some(ll);
        shared.ll128 = Some(ll128);
        shared.fail_host = fail_host;
        shared.fail_dev = fail_dev;
        shared.ordinal = ordinal;
        shared.dev = Some(dev);
        Ok(shared)
    }

    pub(super) fn broken(&self) -> Option<String> {
        self.broken.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn break_with(&self, why: String) {
        let mut b = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        if b.is_none() {
            *b = Some(why);
        }
        drop(b);
        let _r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
        let _m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        self.mail_cv.notify_all();
        let _i = self.issued_mx.lock().unwrap_or_else(|e| e.into_inner());
        self.issued_cv.notify_all();
    }

    /// Rank `rank` launches its collective call `g` as a lone LL all-reduce: a rank that
    /// came to the host meeting for call `g` instead, if one has. (A rank's meeting number
    /// cannot pass `g` while this rank has not met.)
    pub(super) fn announce_fast(&self, rank: usize, g: u64) -> Option<usize> {
        let ann = &self.announced;
        ann[rank].fast.store(g, Ordering::SeqCst);
        (0..self.p).find(|&q| q != rank && ann[q].meet.load(Ordering::SeqCst) == g)
    }

    /// Rank `rank` comes to the host meeting for its collective call `g`: a rank that
    /// launched call `g` (or a later one) as a lone LL all-reduce instead, if one has: it
    /// will never come. Of two ranks announcing differently, at least one sees the other
    /// (each stores, then loads; sequentially consistent).
    pub(super) fn announce_meet(&self, rank: usize, g: u64) -> Option<usize> {
        let ann = &self.announced;
        ann[rank].meet.store(g, Ordering::SeqCst);
        (0..self.p).find(|&q| q != rank && ann[q].fast.load(Ordering::SeqCst) >= g)
    }

    /// Waits until every rank has enqueued the launches of its collective call `g` (or
    /// refused it): a rank's launches of call `g + 1` must not be enqueued before then. Streams
    /// share the GPU's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS), each in order: work
    /// waiting at a queue's head (a launch behind this rank's spinning kernel, a stream's wait
    /// for an event) holds up the work behind it, so a kernel another rank's kernel waits
    /// for must never be enqueued behind it. The host meeting keeps this order by itself;
    /// lone LL calls, which skip it, keep it here (one call behind the slowest rank, where
    /// the meeting would wait for the slowest rank's current call).
    pub(super) fn wait_issued(&self, rank: usize, g: u64) -> Result<(), CudaError> {
        let behind = |q: &usize| self.announced[*q].issued.load(Ordering::Acquire) < g;
        if g == 0 || !(0..self.p).any(|q| behind(&q)) {
            return Ok(());
        }
        let t = Instant::now();
        while t.elapsed() < MEET_SPIN {
            if !(0..self.p).any(|q| behind(&q)) {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        // Asleep until `set_issued` (or `break_with`) wakes it: it counts itself a sleeper,
        // then checks under the lock; a setter stores, then looks for sleepers, and
        // notifies under the lock, so one of the two sees the other.
        let mut guard = self.issued_mx.lock().unwrap_or_else(|e| e.into_inner());
        self.issued_sleepers.fetch_add(1, Ordering::SeqCst);
        let out = loop {
            let Some(q) = (0..self.p).find(behind) else { break Ok(()) };
            if self.broken().is_some() {
                break Err(self.unusable(rank));
            }
            let waited = t.elapsed();
            let left = match self.timeout {
                Some(limit) if waited > limit => {
                    let why = format!(
                        "rank {rank} waited {limit:?} for rank {q} to make collective call {g}, which it never did"
                    );
                    break Err(CudaError::Invalid(why));
                }
                Some(limit) => limit - waited,
                None => Duration::from_secs(3600),
            };
            guard = self.issued_cv.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0;
        };
        self.issued_sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
        if let Err(CudaError::Invalid(why)) = &out {
            if self.broken().is_none() {
                self.fail_group(rank, why.clone());
            }
        }
        out
    }

    /// Rank `rank` has enqueued the launches of its collective call `g` (or refused it).
    pub(super) fn set_issued(&self, rank: usize, g: u64) {
        self.announced[rank].issued.store(g, Ordering::SeqCst);
        if self.issued_sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.issued_mx.lock().unwrap_or_else(|e| e.into_inner());
            self.issued_cv.notify_all();
        }
    }

    /// Breaks the group when other ranks' kernels may already wait for this rank's: also
    /// tells those kernels (through the host-mapped failure record, which LL kernels poll)
    /// to give up.
    pub(super) fn fail_group(&self, rank: usize, why: String) {
        self.break_with(why);
        if self.fail_host != 0 {
            // SAFETY: the failure record is 16 bytes of pinned host memory, aligned, leaked by
            // this group; the GPU writes it only after winning the device-side flag, and a
            // lost race only changes which failure the record names.
            let code = unsafe { AtomicU32::from_ptr(self.fail_host as *mut u32) };
            let _ = code.compare_exchange(
                0,
                1 | ((rank as u32) << 8) | (0xff << 16) | (5 << 24),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    pub(super) fn unusable(&self, rank: usize) -> CudaError {
        CudaError::Invalid(format!(
            "rank {rank}: the group is unusable: {}",
            self.broken().unwrap_or_default()
        ))
    }

    /// Every rank's `v` for this round, once all have given theirs; an error naming the
    /// missing ranks if they did not come within the timeout (the group is then broken).
    pub(super) fn exchange(&self, rank: usize, v: Entry) -> Result<Arc<Vec<Entry>>, CudaError> {
        if self.broken().is_some() {
            return Err(self.unusable(rank));
        }
        let mut r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        if r.vals.len() != self.p {
            r.vals = vec![Entry::default(); self.p];
            r.present = vec![false; self.p];
        }
        r.vals[rank] = v;
        r.present[rank] = true;
        r.arrived += 1;
        if r.arrived == self.p {
            r.out = Arc::new(std::mem::take(&mut r.vals));
            r.vals = vec![Entry::default(); self.p];
            r.arrived = 0;
            r.present.iter_mut().for_each(|x| *x = false);
            r.generation += 1;
            self.generation.store(r.generation, Ordering::Release);
            self.cv.notify_all();
            return Ok(r.out.clone());
        }
        let g = r.generation;
        drop(r);
        // `out` stays this round's until every rank (this one too) has given its next value.
        let t = Instant::now();
        while self.generation.load(Ordering::Acquire) == g && t.elapsed() < MEET_SPIN {
            std::hint::spin_loop();
        }
        let mut r = self.round.lock().unwrap_or_else(|e| e.into_inner());
        while r.generation == g {
            if self.broken().is_some() {
                return Err(self.unusable(rank));
            }
            match self.timeout {
                None => r = self.cv.wait(r).unwrap_or_else(|e| e.into_inner()),
                Some(limit) => {
                    let left = limit.saturating_sub(t.elapsed());
                    if left.is_zero() {
                        let missing: Vec<usize> = (0..self.p).filter(|&q| !r.present[q]).collect();
                        let why = format!(
                            "rank {rank} waited {limit:?} at call meeting {} for ranks {missing:?}, which never called",
                            g + 1
                        );
                        drop(r);
                        self.break_with(why.clone());
                        return Err(CudaError::Invalid(why));
                    }
                    r = self.cv.wait_timeout(r, left).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
        Ok(r.out.clone())
    }

    pub(super) fn post(&self, from: usize, to: usize, p: Post) {
        let mut m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        m.entry((from, to)).or_default().push_back(p);
        self.mail_cv.notify_all();
    }

    /// The oldest post from `from` to `to`, waiting for it up to the timeout.
    pub(super) fn take(&self, from: usize, to: usize) -> Result<Post, CudaError> {
        let t = Instant::now();
        let mut m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(p) = m.get_mut(&(from, to)).and_then(|q| q.pop_front()) {
                return Ok(p);
            }
            if self.broken().is_some() {
                return Err(self.unusable(to));
            }
            match self.timeout {
                None => m = self.mail_cv.wait(m).unwrap_or_else(|e| e.into_inner()),
                Some(limit) => {
                    let left = limit.saturating_sub(t.elapsed());
                    if left.is_zero() {
                        let why = format!(
                            "rank {to} waited {limit:?} for a send from rank {from}, which never came"
                        );
                        drop(m);
                        self.break_with(why.clone());
                        return Err(CudaError::Invalid(why));
                    }
                    m = self.mail_cv.wait_timeout(m, left).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
    }

    /// The GPU meeting's failure, if a kernel recorded one.
    pub(super) fn device_failure(&self) -> Option<String> {
        if self.fail_host == 0 {
            return None;
        }
        let h = self.fail_host as *const u32;
        // SAFETY: four u32s of host-mapped memory owned (leaked) by this group; the GPU writes
        // the call number before the code, each followed by a system-wide fence.
        let code = unsafe { h.read_volatile() };
        if code == 0 {
            return None;
        }
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: as above.
        let seq = unsafe { (h.add(2).read_volatile() as u64) | ((h.add(3).read_volatile() as u64) << 32) };
        Some(describe_failure(code, seq, self.timeout))
    }
}
