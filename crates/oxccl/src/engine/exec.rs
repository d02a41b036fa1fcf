//! Executing a job: every lane's steps in order, each as soon as its connections allow,
//! sockets pumped in between; waits spin, yield, then sleep on the doorbell and the sockets
//! (see "Waiting" in docs/architecture.md).

use super::*;

impl Engine {
    /// Runs `job` over `bufs`; `what` names the operation in errors.
    pub fn run(&mut self, job: Job, bufs: &[RawBuf], what: &str) -> Result<()> {
        let w = self.waiter();
        let needed = job_connections(&job);
        self.connect(&needed, &w)?;
        // Per-job vectors are kept between jobs (a small call should not allocate them).
        let mut work = std::mem::take(&mut self.work);
        let (sv, rv) = (&mut work.sv, &mut work.rv);
        for (k, out) in &needed {
            if *out {
                if let Some(c) = self.sends.remove(k) {
                    sv.push((*k, c));
                }
            } else if let Some(c) = self.recvs.remove(k) {
                rv.push((*k, c));
            }
        }
        // The user's buffers, then the scratch buffer (BufId::SCRATCH).
        let words = job.scratch_bytes.div_ceil(8);
        if self.scratch.len() < words {
            self.scratch.resize(words, 0);
        }
        let mut all: smallvec::SmallVec<[RawBuf; 4]> = bufs.iter().copied().collect();
        all.push(RawBuf { ptr: self.scratch.as_mut_ptr().cast(), len: job.scratch_bytes, writable: true });
        // Large jobs that write shared-memory slots: ordinary or streaming stores, whichever
        // this engine has measured faster lately (`stores`).
        let largest = bufs.iter().map(|b| b.len).max().unwrap_or(0);
        let shm = || work.sv.iter().any(|(_, c)| matches!(c, SendConn::Shm(_)));
        let choice =
            if largest >= stores::ADAPT_MIN_BYTES && shm() { self.stores.pick(largest) } else { None };
        let mode = StoreMode { stream: choice.is_some_and(|c| c.stream), timed: choice.is_some() };
        let res = self.exec(job, &mut work, &all, &w, what, mode);
        if let (Some(c), Ok(())) = (choice, &res) {
            if let Some(t0) = self.first_recv.take() {
                self.stores.record(c, largest, t0.elapsed().as_nanos() as u64);
            }
        }
        if res.is_err() {
            for (_, r) in work.rv.iter_mut() {
                r.abandon_posted();
            }
        }
        self.sends.extend(work.sv.drain(..));
        self.recvs.extend(work.rv.drain(..));
        self.work = work;
        res
    }

    /// `mode`: how the job writes shared-memory slots, and whether it is timed (`stores`).
    fn exec(
        &self,
        job: Job,
        work: &mut Work,
        bufs: &[RawBuf],
        w: &Waiter,
        what: &str,
        mode: StoreMode,
    ) -> Result<()> {
        self.first_recv.set(None);
        let Work { sv, rv, pfds, io_fds, io_idx, posts, users } = work;
        let (sv, rv) = (sv.as_mut_slice(), rv.as_mut_slice());
        // `sv` and `rv` are in key order (built from the sorted `job_connections`).
        let mk = |mut lane: Lane| -> Result<LaneRt> {
            let inb = lane.inbound.iter().map(|k| rv.binary_search_by_key(k, |c| c.0).ok()).collect();
            let out = lane.outbound.iter().map(|k| sv.binary_search_by_key(k, |c| c.0).ok()).collect();
            let (Some(inb), Some(out)) = (inb, out) else {
                return Err(Error::Internal("lane names a connection that was not set up".into()));
            };
            let pending = lane.steps.next();
            Ok(LaneRt { lane, inb, out, pending, ahead: None })
        };
        let mut p2p: Vec<LaneRt> = job.p2p.into_iter().map(mk).collect::<Result<_>>()?;
        let mut phases: VecDeque<Vec<LaneRt>> = job
            .phases
            .into_iter()
            .map(|ph| ph.into_iter().map(mk).collect::<Result<Vec<_>>>())
            .collect::<Result<_>>()?;
        // How many lanes of the job read each inbound connection (posted receives need one).
        users.clear();
        users.resize(rv.len(), 0);
        for l in p2p.iter().chain(phases.iter().flatten()) {
            for &r in &l.inb {
                users[r] += 1;
            }
        }
        let mut idle_since: Option<Instant> = None;
        loop {
            let lanes = p2p.iter().chain(phases.front().into_iter().flatten());
            post_receives(lanes, sv, rv, users, bufs, posts);
            let mut progressed = pump_sockets(sv, rv, posts, io_fds, io_idx, self.ctx.me)?;
            loop {
                while phases.front().is_some_and(|p| p.iter().all(|l| l.pending.is_none())) {
                    phases.pop_front();
                }
                let mut moved = false;
                let phase = phases.front_mut().map(|p| p.as_mut_slice()).unwrap_or(&mut []);
                for l in p2p.iter_mut().chain(phase.iter_mut()) {
                    while self.try_step(l, sv, rv, bufs, what, mode)? {
                        moved = true;
                    }
                }
                progressed |= moved;
                // A phase that just finished lets the next one start at once.
                let phase_done = phases.front().is_some_and(|p| p.iter().all(|l| l.pending.is_none()));
                if !(moved && phase_done) {
                    break;
                }
            }
            while phases.front().is_some_and(|p| p.iter().all(|l| l.pending.is_none())) {
                phases.pop_front();
            }
            if phases.is_empty()
                && p2p.iter().all(|l| l.pending.is_none())
                && sv.iter().all(|(_, s)| s.flushed())
            {
                return Ok(());
            }
            if progressed {
                idle_since = None;
                continue;
            }
            if self.ctx.abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted { rank: self.ctx.me });
            }
            let now = Instant::now();
            let idle = now.duration_since(*idle_since.get_or_insert(now));
            if idle < self.spin {
                std::hint::spin_loop();
                continue;
            }
            let blocked = blocked_peers(&p2p, phases.front(), sv, rv);
            w.check(what, &blocked)?;
            if idle < Duration::from_nanos(YIELD_NS) {
                std::thread::yield_now();
                continue;
            }
            // Sleep: announce on every connection a pending step waits for, then re-check.
            pfds.clear();
            pfds.push(fd::pollfd(self.ctx.doorbell.as_raw_fd(), fd::POLLIN));
            let lanes = p2p.iter().chain(phases.front().into_iter().flatten());
            for l in lanes {
                if let Some(st) = l.pending {
                    if let Input::Recv(p) | Input::RecvReduce(p, _) = st.input {
                        let r = l.inb[p.0 as usize];
                        rv[r].1.arm(pfds, posts.get(r).is_some_and(|x| x.is_some()));
                    }
                    if let Some(p) = st.send {
                        sv[l.out[p.0 as usize]].1.arm(pfds);
                    }
                }
                if let Some(p) = l.ahead.and_then(|a| a.send) {
                    sv[l.out[p.0 as usize]].1.arm(pfds);
                }
            }
            for (_, s) in sv.iter() {
                if !s.flushed() {
                    s.arm(pfds);
                }
            }
            // Every socket with room to read into, awaited or not: a peer whose frames this
            // rank does not read may be blocked sending them, and be what this rank waits for.
            for (i, (_, r)) in rv.iter().enumerate() {
                if let Some(p) = r.poll_interest(posts.get(i).is_some_and(|x| x.is_some())) {
                    pfds.push(p);
                }
            }
            let ready_now =
                p2p.iter().chain(phases.front().into_iter().flatten()).any(|l| can_step(l, sv, rv));
            if !ready_now {
                fd::poll(pfds, w.slice()).map_err(|e| Error::io(self.ctx.me, "poll", None, e))?;
            }
            for (_, s) in sv.iter() {
                s.disarm();
            }
            for (_, r) in rv.iter() {
                r.disarm();
            }
            self.ctx.doorbell.drain();
            idle_since = None;
        }
    }

    /// Runs a lane's pending step if its inputs and outputs are available; while it waits,
    /// runs the step after it instead where that cannot change any result or the order of
    /// any connection's chunks (a ring's send of its next loop while its last receive of
    /// this loop waits: over sockets that hides one round trip per loop).
    fn try_step(
        &self,
        l: &mut LaneRt,
        sv: &mut [(ConnKey, SendConn)],
        rv: &mut [(ConnKey, RecvConn)],
        bufs: &[RawBuf],
        what: &str,
        mode: StoreMode,
    ) -> Result<bool> {
        let Some(step) = l.pending else {
            return Ok(false);
        };
        if self.run_step(l, step, sv, rv, bufs, what, mode)? {
            l.pending = l.ahead.take().or_else(|| l.lane.steps.next());
            return Ok(true);
        }
        if step.send.is_some() {
            return Ok(false);
        }
        if l.ahead.is_none() {
            l.ahead = l.lane.steps.next();
        }
        match l.ahead {
            Some(a) if may_pass(&step, &a, bufs) && self.run_step(l, a, sv, rv, bufs, what, mode)? => {
                l.ahead = None;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Runs `step` of lane `l` if its inputs and outputs are available (`mode`: see
    /// [`StoreMode`]).
    #[allow(clippy::too_many_arguments)]
    fn run_step(
        &self,
        l: &LaneRt,
        step: Step,
        sv: &mut [(ConnKey, SendConn)],
        rv: &mut [(ConnKey, RecvConn)],
        bufs: &[RawBuf],
        what: &str,
        mode: StoreMode,
    ) -> Result<bool> {
        let rin = match step.input {
            Input::Recv(p) | Input::RecvReduce(p, _) => Some(l.inb[p.0 as usize]),
            Input::Src(_) | Input::Local2(..) => None,
        };
        let sout = step.send.map(|p| l.out[p.0 as usize]);
        if let Some(r) = rin {
            if !rv[r].1.ready()? {
                return Ok(false);
            }
        }
        if let Some(s) = sout {
            if !sv[s].1.ready() {
                return Ok(false);
            }
        }
        let len = step.len;
        let sig = l.lane.sig_of(step.tag);
        let recv = match rin {
            Some(r) => {
                let got = rv[r].1.sig();
                if !sig.accepts(&got) {
                    let theirs = Sig::from_words(got);
                    return Err(Error::CallMismatch {
                        rank: self.ctx.me,
                        op: what.to_string(),
                        peer: rv[r].0.peer,
                        mine: self.ctx.mailbox.progress.mismatch_with(sig, theirs),
                        theirs,
                    });
                }
                let (p, n) = rv[r].1.chunk();
                if n != len {
                    return Err(Error::Mismatch {
                        rank: self.ctx.me,
                        op: what.to_string(),
                        peer: rv[r].0.peer,
                        got: n,
                        want: len,
                    });
                }
                Some(p)
            }
            None => None,
        };
        let send = match sout {
            Some(s) => {
                let (p, cap) = sv[s].1.slot(l.lane.proto);
                if cap < len {
                    return Err(Error::Internal(format!("{len}-byte chunk for a {cap}-byte slot")));
                }
                Some(p)
            }
            None => None,
        };
        // A local pair reduces like a received chunk with a local operand; the operand that is
        // also the destination (if any) plays the local part, so in place works either way.
        let (local, src_loc) = match step.input {
            Input::Local2(a, b) => {
                let (r, s) = if step.dst == Some(a) { (b, a) } else { (a, b) };
                (Some(span(bufs, r, len)?), Some(s))
            }
            Input::Src(l) | Input::RecvReduce(_, l) => (None, Some(l)),
            Input::Recv(_) => (None, None),
        };
        if let (Some(lr), Some(d)) = (local, step.dst) {
            let d = span(bufs, d, len)?;
            let (a, b) = (lr.ptr as usize, d.ptr as usize);
            if a < b + len && b < a + len {
                return Err(Error::Internal("step's local operand and destination overlap".into()));
            }
        }
        let recv = recv.or(local.map(|r| r.ptr as *const u8));
        let words = sig.to_words();
        let in_place = src_loc.is_some() && step.dst == src_loc;
        let src = match src_loc {
            Some(loc) => Some(span(bufs, loc, len)?),
            None => None,
        };
        // In place, a copy has no destination and a reduction's destination is its source.
        let dst = match step.dst {
            Some(_) if in_place && matches!(step.input, Input::Src(_)) => None,
            Some(loc) => {
                let d = span(bufs, loc, len)?;
                if !d.writable {
                    return Err(Error::Internal("step writes a read-only buffer".into()));
                }
                if let (Some(s), false) = (src, in_place) {
                    let (a, b) = (s.ptr as usize, d.ptr as usize);
                    if a < b + len && b < a + len {
                        return Err(Error::Internal("step's source and destination overlap".into()));
                    }
                }
                Some(d)
            }
            None => None,
        };
        // A posted receive already put the chunk at its destination: only a staged send (if
        // any) still needs the bytes.
        if let (Input::Recv(_), Some(r), Some(d)) = (step.input, recv, dst) {
            if std::ptr::eq(r, d.ptr) {
                if let Some(s) = sout {
                    if sv[s].1.sends_in_place() {
                        // SAFETY: the destination holds this step's chunk, valid and unchanged
                        // until the job ends (rule 1), which waits for the flush.
                        unsafe { sv[s].1.commit_external(d.ptr, len, &words)? };
                    } else if let Some(p) = send {
                        // SAFETY: the free slot holds ≥ len bytes (checked above) and is disjoint
                        // from user memory.
                        unsafe { std::ptr::copy_nonoverlapping(d.ptr, p, len) };
                        sv[s].1.commit(len, &words, l.lane.proto)?;
                    }
                }
                if let Some(r) = rin {
                    rv[r].1.release();
                }
                return Ok(true);
            }
        }
        // SAFETY: (for all slices below) `span` bounds-checked every user location against its
        // live buffer (rules 1, 2); a destination is disjoint from the source unless in place,
        // and in place only the destination slice is made for a reduction; the received chunk
        // (between ready and release) and the send slot (between ready and commit) are memory
        // no one else touches now (rule 3); each points at `len` valid bytes.
        let data = unsafe {
            match (step.input, recv, src) {
                (Input::Src(_), _, Some(s)) => StepData::Src(std::slice::from_raw_parts(s.ptr, len)),
                (Input::Recv(_), Some(r), _) => StepData::Recv(std::slice::from_raw_parts(r, len)),
                (Input::RecvReduce(..) | Input::Local2(..), Some(r), _) if in_place => {
                    StepData::RecvReduceInPlace { recv: std::slice::from_raw_parts(r, len) }
                }
                (Input::RecvReduce(..) | Input::Local2(..), Some(r), Some(s)) => StepData::RecvReduce {
                    recv: std::slice::from_raw_parts(r, len),
                    src: std::slice::from_raw_parts(s.ptr, len),
                },
                _ => return Err(Error::Internal("step input unavailable".into())),
            }
        };
        // A connection that can send from where the bytes lie (TCP) sends the step's result
        // from the user buffer that holds it — the destination, or an unreduced source —
        // instead of copying it into a staging slot first.
        let external = match sout {
            Some(s) if sv[s].1.sends_in_place() => match (dst, step.input, src) {
                (Some(d), _, _) => Some(d.ptr as *const u8),
                (None, Input::Src(_), Some(s)) => Some(s.ptr as *const u8),
                _ => None,
            },
            _ => None,
        };
        // SAFETY: as above; the destination is writable, in bounds and exclusive for this step.
        let dst_mut = dst.map(|d| unsafe { std::slice::from_raw_parts_mut(d.ptr, len) });
        // SAFETY: the send slot is free (ready) and holds at least `len` bytes.
        let send_mut =
            send.filter(|_| external.is_none()).map(|p| unsafe { std::slice::from_raw_parts_mut(p, len) });
        if mode.timed && rin.is_some() && self.first_recv.get().is_none() {
            self.first_recv.set(Some(Instant::now()));
        }
        let streamed = mode.stream
            && l.lane.proto == Proto::Simple
            && matches!(sout.map(|s| &sv[s].1), Some(SendConn::Shm(_)));
        match send_mut {
            Some(slot) if streamed => {
                stores::apply_streamed(l.lane.reduce.as_ref(), step.finalize, data, dst_mut, slot)?
            }
            send_mut => apply(l.lane.reduce.as_ref(), step.finalize, data, dst_mut, send_mut)?,
        }
        if let Some(s) = sout {
            match external {
                // SAFETY: the bytes are in a user buffer of this job (valid until the job ends,
                // rule 1), written by this step and by no later step of this job (plans write
                // each output location once), and the job ends only when every connection is
                // flushed.
                Some(p) => unsafe { sv[s].1.commit_external(p, len, &words)? },
                None => sv[s].1.commit(len, &words, l.lane.proto)?,
            }
        }
        if let Some(r) = rin {
            rv[r].1.release();
        }
        Ok(true)
    }
}

/// Moves bytes on every TCP connection that can move them now: one non-blocking poll over
/// the sockets with work (frames to write, room for the next frame), then writes and reads
/// only on those it reports ready. Busy `recv` calls on a socket that another core is
/// delivering into contend for the socket's lock; `poll` takes none. `posts[i]` is a posted
/// receive for inbound connection `i` (see [`post_receives`]).
fn pump_sockets(
    sv: &mut [(ConnKey, SendConn)],
    rv: &mut [(ConnKey, RecvConn)],
    posts: &[Option<Post>],
    fds: &mut Vec<fd::PollFd>,
    idx: &mut Vec<(bool, usize)>,
    me: Rank,
) -> Result<bool> {
    let mut progressed = false;
    fds.clear();
    idx.clear();
    for (i, (_, s)) in sv.iter().enumerate() {
        if let Some(p) = s.poll_interest() {
            fds.push(p);
            idx.push((true, i));
        }
    }
    for (i, (_, r)) in rv.iter_mut().enumerate() {
        progressed |= r.pump_buffered()?;
        if let Some(p) = r.poll_interest(posts[i].is_some()) {
            fds.push(p);
            idx.push((false, i));
        }
    }
    if fds.is_empty() {
        return Ok(progressed);
    }
    if fd::poll(fds, Duration::ZERO).map_err(|e| Error::io(me, "poll", None, e))? == 0 {
        return Ok(progressed);
    }
    for (p, &(send, i)) in fds.iter().zip(idx.iter()) {
        if p.revents == 0 {
            continue;
        }
        progressed |= if send {
            sv[i].1.pump()?
        } else {
            // SAFETY: post_receives only posts a writable, bounds-checked span of this job's
            // buffers that the pending step alone writes and no queued send reads; a frame
            // still going there when the job ends early is abandoned (Engine::run).
            unsafe { rv[i].1.pump_posted(posts[i])? }
        };
    }
    Ok(progressed)
}

/// Posted receives for this round: a lane whose pending step copies the next chunk of an
/// inbound TCP connection into its destination (a plain receive, no reduction) lets the
/// socket write it there directly, saving the copy out of a staging slot. Only when the
/// lane is the connection's one consumer in the job, nothing is queued on the connection
/// (so the next frame is that step's), and no unsent frame reads the destination.
fn post_receives<'a>(
    lanes: impl Iterator<Item = &'a LaneRt>,
    sv: &[(ConnKey, SendConn)],
    rv: &[(ConnKey, RecvConn)],
    users: &[u32],
    bufs: &[RawBuf],
    posts: &mut Vec<Option<Post>>,
) {
    posts.clear();
    posts.resize(rv.len(), None);
    for l in lanes {
        let Some(st) = l.pending else { continue };
        let (Input::Recv(p), Some(d), false) = (st.input, st.dst, st.finalize) else { continue };
        let r = l.inb[p.0 as usize];
        if users[r] != 1 || !rv[r].1.accepts_post() {
            continue;
        }
        let Ok(b) = span(bufs, d, st.len) else { continue };
        if !b.writable || sv.iter().any(|(_, s)| s.reads_external(b.ptr, st.len)) {
            continue;
        }
        posts[r] = Some((b.ptr, st.len, l.lane.sig_of(st.tag).to_words()));
    }
}

/// Whether step `a`, the next of a lane, may run before the lane's waiting step `p`: `p`
/// sends nothing and `a` receives nothing (so every connection still carries chunks in plan
/// order), and neither writes memory the other reads or writes (so both compute what they
/// would in order). Locations are compared as addresses: an in-place call's source and
/// destination are one buffer.
fn may_pass(p: &Step, a: &Step, bufs: &[RawBuf]) -> bool {
    if p.send.is_some() || matches!(a.input, Input::Recv(_) | Input::RecvReduce(..)) {
        return false;
    }
    let range = |loc: Option<Loc>, len: usize| -> Option<Option<(usize, usize)>> {
        match loc {
            None => Some(None),
            Some(l) => span(bufs, l, len).ok().map(|b| Some((b.ptr as usize, b.ptr as usize + len))),
        }
    };
    let reads = |s: &Step| -> Option<[Option<(usize, usize)>; 2]> {
        Some(match s.input {
            Input::Src(l) | Input::RecvReduce(_, l) => [range(Some(l), s.len)?, None],
            Input::Local2(x, y) => [range(Some(x), s.len)?, range(Some(y), s.len)?],
            Input::Recv(_) => [None, None],
        })
    };
    let (Some(pw), Some(aw), Some(pr), Some(ar)) =
        (range(p.dst, p.len), range(a.dst, a.len), reads(p), reads(a))
    else {
        return false;
    };
    let meet = |x: Option<(usize, usize)>, y: Option<(usize, usize)>| match (x, y) {
        (Some((x0, x1)), Some((y0, y1))) => x0 < y1 && y0 < x1,
        _ => false,
    };
    !(meet(pw, aw) || ar.iter().any(|r| meet(pw, *r)) || pr.iter().any(|r| meet(aw, *r)))
}

fn can_step(l: &LaneRt, sv: &mut [(ConnKey, SendConn)], rv: &mut [(ConnKey, RecvConn)]) -> bool {
    let Some(st) = l.pending else {
        return false;
    };
    if let Input::Recv(p) | Input::RecvReduce(p, _) = st.input {
        if !rv[l.inb[p.0 as usize]].1.ready().unwrap_or(true) {
            return false;
        }
    }
    if let Some(p) = st.send {
        if !sv[l.out[p.0 as usize]].1.ready() {
            return false;
        }
    }
    true
}

fn blocked_peers(
    p2p: &[LaneRt],
    phase: Option<&Vec<LaneRt>>,
    sv: &mut [(ConnKey, SendConn)],
    rv: &mut [(ConnKey, RecvConn)],
) -> Vec<Rank> {
    let mut v = Vec::new();
    for l in p2p.iter().chain(phase.into_iter().flatten()) {
        if let Some(st) = l.pending {
            if let Input::Recv(p) | Input::RecvReduce(p, _) = st.input {
                let (k, c) = &mut rv[l.inb[p.0 as usize]];
                if !c.ready().unwrap_or(true) {
                    v.push(k.peer);
                }
            }
            if let Some(p) = st.send {
                let (k, c) = &mut sv[l.out[p.0 as usize]];
                if !c.ready() {
                    v.push(k.peer);
                }
            }
        }
    }
    v.sort();
    v.dedup();
    v
}
