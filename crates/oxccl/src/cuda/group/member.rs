//! One rank of a thread group: its calls, launches and waits (LL alone, the meetings).

use super::*;

impl Member {
    pub(super) fn new(shared: &Arc<Shared>, rank: usize) -> Result<Member, CudaError> {
        {
            let mut j = shared.joined.lock().unwrap_or_else(|e| e.into_inner());
            if rank >= shared.p || j[rank] {
                return Err(CudaError::Invalid(format!(
                    "rank {rank} cannot join a {}-rank thread group (out of range, or joined already)",
                    shared.p
                )));
            }
            j[rank] = true;
        }
        let kernels =
            shared.kernels.clone().ok_or_else(|| CudaError::Invalid("a group without kernels".into()))?;
        Ok(Member {
            rank,
            shared: shared.clone(),
            kernels,
            dev: Device::open(shared.ordinal)?,
            state: Default::default(),
            blocks_per_sm: 1,
            ll: ll_allowed(),
            ll128: ll128_allowed(),
            ll_alone: crate::env::device().ll_alone,
            coll_calls: AtomicU64::new(0),
        })
    }

    /// Whether small all-reduces run as LL (default: [`ll_allowed`]). Every rank must set the
    /// same, between calls.
    pub fn set_ll(&mut self, on: bool) {
        self.ll = on;
    }

    /// Whether mid-sized all-reduces (above [`LL_MAX_BYTES`], up to [`LL128_MAX_BYTES`]) run
    /// as LL128 (default: [`ll128_allowed`]). Every rank must set the same, between calls.
    pub fn set_ll128(&mut self, on: bool) {
        self.ll128 = on;
    }

    /// Whether a lone small all-reduce skips the host meeting (default: yes, unless
    /// `OXCCL_LL_ALONE=0`). Every rank must set the same, between calls.
    pub fn set_ll_alone(&mut self, on: bool) {
        self.ll_alone = on;
    }

    /// Gives up on the group: every rank's kernels that wait for others end (they poll the
    /// host-mapped record) and every later call fails, naming this rank. For an abort: the
    /// group's memory can then be freed without waiting for kernels that would never end.
    pub fn abort(&self) {
        self.shared.fail_group(self.rank, format!("rank {} aborted the communicator", self.rank));
    }

    pub fn size(&self) -> usize {
        self.shared.p
    }

    /// Blocks each multiprocessor gives one launch of the whole group (1 by default; capped
    /// at what the multiprocessor holds when a call launches). Every rank must set the same.
    pub fn set_blocks_per_sm(&mut self, n: u32) {
        self.blocks_per_sm = n.max(1);
    }

    /// The group's failure, if a kernel gave up waiting (read from host-mapped memory; does
    /// not wait for any stream) or a rank gave up on the host.
    pub fn check(&self) -> Result<(), CudaError> {
        // A reason given on the host says more than the GPU's record of it.
        if self.shared.broken().is_some() {
            return Err(self.shared.unusable(self.rank));
        }
        if let Some(why) = self.shared.device_failure() {
            return Err(CudaError::Invalid(format!("rank {}: the group is unusable: {why}", self.rank)));
        }
        Ok(())
    }

    /// Enqueues an all-reduce of `count` elements of `t` from `send` into `recv` (device
    /// pointers; equal for in place) on `s`, and returns. Every rank must make the same call.
    pub fn all_reduce(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        send: u64,
        recv: u64,
        count: usize,
    ) -> Result<(), CudaError> {
        self.run(s, &[DevCall::coll(device::DeviceColl::AllReduce, t, op, count, send, recv)])
    }

    /// Enqueues `calls` (a group: collectives every rank makes alike, in the same order, and
    /// sends and receives matched per pair in order) on `s`, and returns.
    /// On a stream being captured into a CUDA graph, the launches are captured: they meet
    /// through the ranks' device records (kernels/sync.cu's `base`), so every replay meets afresh,
    /// and nothing else is enqueued (no event is recorded or waited for: a replay is ordered
    /// by the stream the graph is launched on).
    pub fn run(&self, s: &Stream, calls: &[DevCall]) -> Result<(), CudaError> {
        let capturing = !legacy(s.h as usize) && crate::cuda::graph::capturing(s.h as usize)?;
        self.run_on(s, calls, capturing)
    }

    /// [`run`](Self::run) for a caller that already asked whether `s` is being captured.
    pub fn run_on(&self, s: &Stream, calls: &[DevCall], capturing: bool) -> Result<(), CudaError> {
        if let [c] = calls {
            if self.lone_ll(c) && self.run_lone_ll(s, c, capturing)? {
                return Ok(());
            }
        }
        self.run_met(s, calls, capturing)
    }

    /// Whether `c`, alone in its group, runs as LL or LL128 without the host meeting.
    pub(super) fn lone_ll(&self, c: &DevCall) -> bool {
        self.ll_alone && self.line_proto(c).is_some()
    }

    /// The line protocol an all-reduce runs with, if any: LL up to [`LL_MAX_BYTES`], LL128
    /// up to [`LL128_MAX_BYTES`], as allowed (decided from what every rank has alike).
    pub(super) fn line_proto(&self, c: &DevCall) -> Option<LineProto> {
        if c.what != What::Coll(device::DeviceColl::AllReduce)
            || c.count == 0
            || call::unsupported(c, self.shared.p).is_some()
        {
            return None;
        }
        match c.bytes() {
            b if b <= LL_MAX_BYTES && self.ll => Some(LineProto::Ll),
            b if b <= LL128_MAX_BYTES && self.ll128 => Some(LineProto::Ll128),
            _ => None,
        }
    }

    /// The group's buffer of `proto` and its data lines per slot.
    pub(super) fn line_buf(&self, proto: LineProto) -> Option<crate::cuda::kernels::Ll> {
        let (buf, lines) = match proto {
            LineProto::Ll => (self.shared.ll.as_ref()?, LL_LINES),
            LineProto::Ll128 => (self.shared.ll128.as_ref()?, LL128_LINES),
        };
        let sig = self.shared.ll.as_ref()?;
        Some(crate::cuda::kernels::Ll {
            buf: buf.ptr,
            seq: 0,
            lines: lines as u32,
            sig_buf: sig.ptr,
            sig_lines: LL_LINES as u32,
        })
    }

    /// A lone small all-reduce, launched as LL without meeting the other ranks on the host:
    /// the kernels exchange the data and compare the calls' signatures (kernels/ll.cu's
    /// `ll_all_reduce`). Ok(false): this rank refuses the call, and takes it to the host
    /// meeting, where every rank refuses alike. A rank that met while another launched (their
    /// calls differ, or one refused) is found by either of them from what each announced
    /// (each announces its call, then reads the others': one of the two sees the other) and
    /// the group is then broken, its waiting kernels told to give up.
    pub(super) fn run_lone_ll(&self, s: &Stream, c: &DevCall, capturing: bool) -> Result<bool, CudaError> {
        let (p, rank, sh) = (self.shared.p, self.rank, s.h as usize);
        let ann = &self.shared.announced;
        if p > 1 && legacy(sh) || (0..p).any(|q| q != rank && ann[q].stream.load(Ordering::Relaxed) == sh) {
            return Ok(false);
        }
        self.check()?;
        let (Some(proto), Some(bar)) = (self.line_proto(c), self.shared.bar.as_ref()) else {
            return Ok(false);
        };
        let Some(mut l) = self.line_buf(proto) else { return Ok(false) };
        let g = self.coll_calls.fetch_add(1, Ordering::Relaxed) + 1;
        ann[rank].stream.store(sh, Ordering::Relaxed);
        if let Some(q) = self.shared.announce_fast(rank, g) {
            let why = format!(
                "rank {rank}: calls differ at collective call {g}: this rank's is an {} alone, which runs as LL without meeting the others, but rank {q} came to the host meeting (its call differs, or it refused it, or its LL setting differs: OXCCL_DEVICE_LL and NCCL_PROTO must be the same on every rank)",
                c.describe()
            );
            self.shared.fail_group(rank, why.clone());
            return Err(CudaError::Invalid(why));
        }
        let _issued = IssuedOnDrop(&self.shared, rank, g);
        self.shared.wait_issued(rank, g - 1)?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.dev.make_current()?;
        if !capturing {
            st.follow(s)?;
        }
        let seq = next_ll_seq(&mut st.counters);
        let sync = Sync {
            timeout_ns: self.timeout_ns(),
            rank: rank as i32,
            p: p as i32,
            fail: bar.ptr + 192,
            host: self.shared.fail_dev,
            base: bar.ptr + (BASE_AT + BASE_BYTES * rank) as u64,
            ..Sync::default()
        };
        let div = if c.op == Kop::Op(ReduceOp::Avg) { p as u32 } else { 0 };
        l.seq = seq;
        let io = (c.send, c.recv, c.count);
        if let Err(e) = self.kernels.run_ll(s, proto, c.t, c.op, io, c.scalar, div, l, &sync) {
            self.shared.fail_group(rank, format!("rank {rank} could not launch its part of a call: {e}"));
            return Err(e);
        }
        if !capturing {
            st.launched(&self.dev, s)?;
        }
        Ok(true)
    }

    pub(super) fn timeout_ns(&self) -> u64 {
        timeout_ns(self.shared.timeout)
    }

    /// A group through the host meeting (collectives) and the mailboxes (sends, receives).
    pub(super) fn run_met(&self, s: &Stream, calls: &[DevCall], capturing: bool) -> Result<(), CudaError> {
        let p = self.shared.p;
        let rank = self.rank;
        let sh = s.h as usize;
        let ann = &self.shared.announced;
        let colls: Vec<DevCall> = calls.iter().filter(|c| c.collective().is_some()).copied().collect();
        // Ranks' kernels wait for one another, so they must run on streams of their own.
        let shared_with = calls.iter().find_map(|c| match c.what {
            What::Send(q) | What::Recv(q) if q != rank && ann[q].stream.load(Ordering::Relaxed) == sh => {
                Some(q)
            }
            _ => None,
        });
        let local = calls
            .iter()
            .find_map(|c| call::unsupported(c, p).map(|why| format!("this rank's {}: {why}", c.describe())))
            .or_else(|| {
                (p > 1 && legacy(sh)).then(|| {
                    "its stream is the legacy default stream, which every rank's thread shares: give each rank a stream of its own (cuStreamCreate, torch.cuda.Stream)".to_string()
                })
            })
            .or_else(|| {
                shared_with.map(|q| {
                    format!("its stream is rank {q}'s too: ranks' kernels wait for one another, so each rank needs a stream of its own")
                })
            });
        ann[rank].stream.store(sh, Ordering::Relaxed);
        // 1. Collectives: every rank meets, even one that refuses, and every rank decides from
        //    the same table, so either all launch or none does.
        let mut coll_tasks: Vec<(DevCall, Vec<Task>)> = Vec::new();
        let recv_tasks = calls.iter().filter(|c| matches!(c.what, What::Recv(_)) && c.bytes() > 0).count();
        let mut all_recv_tasks = Vec::new();
        let mut _issued = None;
        if !colls.is_empty() {
            let g = self.coll_calls.fetch_add(1, Ordering::Relaxed) + 1;
            _issued = Some(IssuedOnDrop(&self.shared, rank, g));
            // A rank that launched this call as a lone LL all-reduce never comes (see
            // `run_lone_ll`); its kernel waits for this rank's.
            if let Some(q) = self.shared.announce_meet(rank, g) {
                let mine = match &local {
                    Some(why) => format!("this rank refused its call: {why}"),
                    None => format!(
                        "this rank's call is {}",
                        colls.iter().map(|c| c.describe()).collect::<Vec<_>>().join(", ")
                    ),
                };
                let why = format!(
                    "rank {rank}: calls differ at collective call {g}: {mine}, but rank {q} launched it as a lone small all-reduce (LL, without meeting: OXCCL_DEVICE_LL and NCCL_PROTO must be the same on every rank)"
                );
                self.shared.fail_group(rank, why.clone());
                return Err(CudaError::Invalid(why));
            }
            let refuse = local.clone().or_else(|| {
                self.shared.device_failure().map(|why| format!("the group's GPU meeting failed: {why}"))
            });
            let all =
                self.shared.exchange(rank, Entry { calls: colls.clone(), refuse, stream: sh, recv_tasks })?;
            all_recv_tasks = all.iter().map(|e| e.recv_tasks).collect();
            if let Some((q, why)) =
                all.iter().enumerate().find_map(|(q, e)| e.refuse.as_ref().map(|w| (q, w)))
            {
                let whose = if q == rank { String::new() } else { format!("rank {q} refused: ") };
                return Err(CudaError::Invalid(format!("rank {rank}: {whose}{why}")));
            }
            if let Some(msg) = mismatch(rank, &all) {
                return Err(CudaError::Invalid(msg));
            }
            if let Some(q) = (0..p).find(|&q| q != rank && all[q].stream == sh) {
                return Err(CudaError::Invalid(format!(
                    "rank {rank}: its stream is rank {q}'s too: ranks' kernels wait for one another, so each rank needs a stream of its own"
                )));
            }
            for (i, c) in colls.iter().enumerate() {
                let coll = c.collective().expect("collectives only");
                let bufs: Vec<Bufs> =
                    all.iter().map(|e| Bufs { send: e.calls[i].send, recv: e.calls[i].recv }).collect();
                coll_tasks.push((*c, device::tasks(coll, c.count, c.t.size_bytes(), rank, &bufs)));
            }
        } else if let Some(why) = local {
            return Err(CudaError::Invalid(format!("rank {rank}: {why}")));
        }
        self.check()?;
        // 2. Sends are posted (never waiting), then each receive takes its send.
        let mut sent = [0u64; MAX_RANKS];
        let mut recv_from = [0u64; MAX_RANKS];
        let mut p2p_tasks = Vec::new();
        let mut wrong = None;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for c in calls {
            if let What::Send(q) = c.what {
                self.shared.post(rank, q, Post { buf: c.send, t: c.t, count: c.count });
                sent[q] += 1;
            }
        }
        for c in calls {
            if let What::Recv(q) = c.what {
                let post = self.shared.take(q, rank)?;
                recv_from[q] += 1;
                if (post.t, post.count) != (c.t, c.count) {
                    wrong.get_or_insert(format!(
                        "rank {rank}: {}, but rank {q}'s matching send is of {} x {}",
                        c.describe(),
                        post.count,
                        post.t
                    ));
                } else if c.bytes() > 0 {
                    p2p_tasks.push(Task::copy(post.buf, vec![c.recv], c.bytes()));
                }
            }
        }
        let any_p2p = sent.iter().chain(&recv_from).any(|&n| n > 0);
        // 3. Launches: collectives, then sends and receives.
        let mut units = call::collective_units(&coll_tasks, p);
        let p2p = call::p2p_units(p2p_tasks, any_p2p);
        let (n_coll, n_p2p) = (units.len(), p2p.len());
        let merge = !p2p.is_empty() && merges(&units, &all_recv_tasks, p, |u| self.ll_call(u).is_some());
        self.dev.make_current()?;
        if !capturing {
            st.follow(s)?;
        }
        let sms = self.dev.sms.max(1) as u32;
        let mut caps = Vec::with_capacity(n_coll + n_p2p);
        for u in units.iter().chain(&p2p) {
            let (t, op) = u.kernel();
            let resident = self.kernels.max_blocks_per_sm(t, op)?;
            if resident == 0 {
                return Err(CudaError::Invalid(format!(
                    "rank {rank}: the {t} {op:?} kernel does not fit a multiprocessor"
                )));
            }
            caps.push((self.blocks_per_sm.min(resident) * sms) / p as u32);
        }
        let timeout_ns = self.timeout_ns();
        let plans = plan_launches(
            &mut st.counters,
            rank,
            p,
            &units,
            &p2p,
            (&sent, &recv_from),
            &caps,
            |u| self.ll_call(u).is_some(),
            timeout_ns,
            merge,
        );
        if merge {
            // The first send/receive launch's copies ride in the last collective launch.
            if let (Some(last), Some(first)) = (units.last_mut(), p2p.first()) {
                last.tasks.extend(first.tasks.iter().cloned());
            }
        }
        for (u, plan) in units.iter().chain(p2p.iter().skip(merge as usize)).zip(plans) {
            let (t, op) = u.kernel();
            let mut sync = plan.sync;
            let bar = self.shared.bar.as_ref().map_or(0, |b| b.ptr);
            sync.fail = bar + 192;
            sync.host = self.shared.fail_dev;
            sync.base = bar + (BASE_AT + BASE_BYTES * rank) as u64;
            if plan.meets() {
                sync.arr = bar;
                sync.dep = bar + 128;
                sync.mydep = bar + 256;
                sync.pready = bar + 512;
                sync.pdone = bar + 1024;
            }
            let div = if op == Kop::Op(ReduceOp::Avg) { p as u32 } else { 0 };
            let line = self.ll_call(u).and_then(|(c, proto)| Some((c, proto, self.line_buf(proto)?)));
            let launched = match (plan.ll, line) {
                (Some(seq), Some((c, proto, mut l))) => {
                    // One flag exchange instead of the meeting (see kernels/ll.cu's ll_all_reduce).
                    l.seq = seq;
                    self.kernels.run_ll(s, proto, t, op, (c.send, c.recv, c.count), u.scalar, div, l, &sync)
                }
                _ => self.kernels.run(s, t, op, &u.tasks, u.scalar, div, plan.blocks, &sync),
            };
            if let Err(e) = launched {
                // The other ranks' kernels of this group wait for this one's: nobody may go on.
                self.shared.break_with(format!("rank {rank} could not launch its part of a call: {e}"));
                return Err(e);
            }
        }
        if n_coll + n_p2p > 0 && !capturing {
            st.launched(&self.dev, s)?;
        }
        match wrong {
            Some(w) => Err(CudaError::Invalid(w)),
            None => Ok(()),
        }
    }
}

impl Member {
    /// The all-reduce a collective launch holds, if it is to run as LL or LL128: a single
    /// all-reduce small enough (decided from what every rank has alike).
    pub(super) fn ll_call(&self, u: &call::Unit) -> Option<(DevCall, LineProto)> {
        match u.calls.as_slice() {
            [c] if u.collective => self.line_proto(c).map(|p| (*c, p)),
            _ => None,
        }
    }
}
