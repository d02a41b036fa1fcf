//! Calls with device buffers, run over host mirrors by the communicator's proxy (see the
//! documentation of `ops`).

use super::call::{run_host, Call};
use crate::fail::{Fail, R, UNHANDLED_CUDA_ERROR};
use crate::handle::{CommState, PreMul, Scalar};
use crate::proxy::Proxy;
use oxccl::cuda::stage::{classify, stream_flag, MemKind, OnDevice, Pinned, StreamEvent};
use oxccl::cuda::CudaError;
use oxccl::Communicator;
use std::sync::atomic::Ordering;

/// One device range of a call and its host mirror.
struct Mirror {
    ordinal: i32,
    dev: usize,
    host: Pinned,
    /// Holds an output: copied back after the collective.
    out: bool,
    /// The call's stream and name.
    stream: usize,
    func: &'static str,
}

fn cuda_fail(func: &str, what: &str, e: CudaError) -> Fail {
    Fail { code: UNHANDLED_CUDA_ERROR, msg: format!("{func}: {what}: {e}") }
}

/// Runs `calls` staged if any buffer of theirs is device memory; `None` if all are host.
pub fn run_if_device(st: &CommState, comm: &Communicator, calls: &[Call]) -> Option<R<()>> {
    oxccl::cuda::driver::driver_if_loaded()?;
    // SAFETY: the caller holds a pin on `st`, and `comm` is `st`'s communicator; the device
    // engine and the proxy jobs that keep them end before the state is freed (see
    // `CommState::forever`).
    let (st, comm): (&'static CommState, &'static Communicator) =
        unsafe { (st.forever(), &*(comm as *const Communicator)) };
    let kinds: Vec<(MemKind, MemKind, Option<MemKind>)> = calls
        .iter()
        .map(|c| {
            let scalar = match c.premul.as_deref() {
                Some(PreMul { scalar: Scalar::Pointer(p), .. }) => Some(classify(*p as *const u8)),
                _ => None,
            };
            let s = if c.send_len > 0 { classify(c.send) } else { MemKind::Host };
            let r = if c.recv_len > 0 { classify(c.recv) } else { MemKind::Host };
            (s, r, scalar)
        })
        .collect();
    let host = |k: &MemKind| *k == MemKind::Host;
    let on_host = kinds.iter().all(|(s, r, p)| host(s) && host(r) && p.as_ref().is_none_or(host));
    if on_host {
        // Host buffers are done with when the call returns: a capture would replay nothing.
        // Calls without bytes (count 0) have nothing to replay.
        if calls.iter().all(|c| c.send_len == 0 && c.recv_len == 0) {
            return None;
        }
        return refuse_capture(calls, "its buffers are host memory, which the call moves before it returns");
    }
    if let Some(r) = super::device::run(st, comm, calls, &kinds) {
        return Some(r);
    }
    if let Some(r) = refuse_capture(calls, "these calls are staged through host memory by the communicator's proxy (buffers on several devices or streams, managed memory, a PreMulSum scalar in device memory, or ranks the device engines cannot serve)") {
        return Some(r);
    }
    Some(run_staged(st, comm, calls, &kinds))
}

/// ncclInvalidUsage naming why, if a call's stream is being captured into a CUDA graph and
/// the calls cannot be captured (`why`); `None` otherwise.
fn refuse_capture(calls: &[Call], why: &str) -> Option<R<()>> {
    let c =
        calls.iter().find(|c| c.stream > 1 && oxccl::cuda::graph::capturing(c.stream).unwrap_or(false))?;
    Some(Err(Fail {
        code: crate::fail::INVALID_USAGE,
        msg: format!(
            "{}: the stream is being captured into a CUDA graph, but {why}: a graph could not replay it (run the call outside the capture)",
            c.func
        ),
    }))
}

fn ordinal(k: MemKind) -> Option<i32> {
    match k {
        MemKind::Device { ordinal } => Some(ordinal),
        _ => None,
    }
}

fn any_ordinal(k: MemKind) -> Option<i32> {
    match k {
        MemKind::Device { ordinal } | MemKind::Managed { ordinal } => Some(ordinal),
        MemKind::Host => None,
    }
}

/// A device range of a call that gets a host mirror.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Span {
    pub start: usize,
    pub len: usize,
    /// Copied in before the collective / back after it.
    pub input: bool,
    pub output: bool,
    /// Which of the call's pointers lie in it.
    pub send: bool,
    pub recv: bool,
}

/// The ranges of `c` to mirror, given which of its buffers are device memory. An in-place
/// call is one range (the larger of the two, from its lower start, as `in_place_slice`),
/// copied both ways; otherwise the input is copied in and the output back (every
/// collective writes the whole of its output range, so nothing of it is copied in).
pub(super) fn spans(c: &Call, send_dev: bool, recv_dev: bool) -> Vec<Span> {
    let (s, r) = (c.send as usize, c.recv as usize);
    if c.in_place {
        let (start, len) = if c.send_len >= c.recv_len { (s, c.send_len) } else { (r, c.recv_len) };
        return if send_dev {
            vec![Span { start, len, input: true, output: true, send: true, recv: true }]
        } else {
            Vec::new()
        };
    }
    let mut v = Vec::new();
    if send_dev && c.send_len > 0 {
        v.push(Span { start: s, len: c.send_len, input: true, output: false, send: true, recv: false });
    }
    if recv_dev && c.recv_len > 0 {
        v.push(Span { start: r, len: c.recv_len, input: false, output: true, send: false, recv: true });
    }
    v
}

/// Calls with device buffers, set up: mirrors with their input copies enqueued, the
/// calls rewritten onto the mirrors, and each stream's event after its input copies.
struct Staged {
    proxy: &'static Proxy,
    mirrors: Vec<Mirror>,
    host_calls: Vec<Call>,
    /// Each distinct stream of the calls, with the device whose context serves it.
    streams: Vec<(usize, i32)>,
    ready: Vec<StreamEvent>,
    done: Vec<StreamEvent>,
}

impl Staged {
    fn stream(&mut self, stream: usize, ordinal: i32) {
        if !self.streams.iter().any(|s| s.0 == stream) {
            self.streams.push((stream, ordinal));
        }
    }

    /// A mirror of `[dev, dev + len)` on device `ordinal`, its input copy enqueued if
    /// `input`; returns its host address.
    fn mirror(&mut self, c: &Call, ordinal: i32, dev: usize, len: usize, input: bool, out: bool) -> R<usize> {
        // A new pinned allocation (or a trim of the pool) waits for the whole context, and
        // may hold the driver's context lock meanwhile: it is made only once no job of
        // the communicator is in flight, so no stream waits for the proxy then.
        let mut host = match Pinned::pooled(len) {
            Some(p) => p,
            None => {
                self.proxy.drain();
                Pinned::take(len).map_err(|e| cuda_fail(c.func, "pinned host mirror", e))?
            }
        };
        let base = host.as_mut_ptr();
        // Kept before the copy is enqueued, so a failure below still waits for it.
        self.mirrors.push(Mirror { ordinal, dev, host, out, stream: c.stream, func: c.func });
        self.stream(c.stream, ordinal);
        if input {
            let on = OnDevice::push(ordinal).map_err(|e| cuda_fail(c.func, "device context", e))?;
            // SAFETY: the mirror holds `len` bytes and lives in `self` until the copy is
            // known complete (the job waits on the stream's events; failures sync it).
            unsafe { on.download_async(c.stream, base, dev as u64, len) }
                .map_err(|e| cuda_fail(c.func, &format!("copying {len} input bytes from the device"), e))?;
        }
        Ok(base as usize)
    }

    /// Waits for every stream (all of them, even after a failure), so nothing enqueued
    /// still uses the mirrors; the first failure, if any.
    fn sync_all(&self, func: &str) -> R<()> {
        let mut first = Ok(());
        for &(s, o) in &self.streams {
            let r = OnDevice::push(o).and_then(|on| on.sync(s));
            if let (Err(e), Ok(())) = (r, &first) {
                first = Err(cuda_fail(func, "waiting for the stream", e));
            }
        }
        first
    }

    /// On each stream, an event after what is enqueued on it so far.
    fn record(&self) -> R<Vec<StreamEvent>> {
        let mut v = Vec::with_capacity(self.streams.len());
        for &(s, o) in &self.streams {
            let f = |e| cuda_fail(self.host_calls[0].func, "stream event", e);
            let on = OnDevice::push(o).map_err(f)?;
            v.push(on.record(s).map_err(f)?);
        }
        Ok(v)
    }

    /// Enqueues each output's copy back to the device, on its call's stream.
    fn enqueue_outputs(&mut self) -> R<()> {
        for m in self.mirrors.iter_mut().filter(|m| m.out) {
            let on = OnDevice::push(m.ordinal).map_err(|e| cuda_fail(m.func, "device context", e))?;
            let len = m.host.as_mut_slice().len();
            // SAFETY: the mirror lives until the job has waited for the `done` events
            // recorded after these copies.
            unsafe { on.upload_async(m.stream, m.dev as u64, m.host.as_mut_ptr(), len) }
                .map_err(|e| cuda_fail(m.func, &format!("copying {len} output bytes to the device"), e))?;
        }
        Ok(())
    }

    /// The collective, once the inputs have landed (run by the proxy, or inline).
    fn execute(&self, comm: &Communicator) -> R<()> {
        for ev in &self.ready {
            ev.wait().map_err(|e| cuda_fail(self.host_calls[0].func, "waiting for the input copies", e))?;
        }
        run_host(comm, &self.host_calls)
    }
}

/// Staged calls on device buffers return once enqueued (the proxy runs them), unless
/// `OXCCL_ASYNC_STREAMS=0`: then once they have completed. Asynchronous by default since
/// the proxy stopped releasing CUDA objects itself (PyTorch's 4-process check, staged:
/// 16 of 16 runs passed after that, 2 of 2 hung before, on the lent H200).
fn blocking() -> bool {
    !oxccl::env::device().async_streams
}

/// Stream-ordered calls a communicator keeps in flight before a new one waits.
const MAX_IN_FLIGHT: usize = 8;

fn trace() -> bool {
    oxccl::env::device().trace_streams
}

/// One trace line to stderr in a single write, so lines of processes that share the
/// file (a launcher's redirect) do not tear into one another.
fn trace_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let line = format!("{args}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn flag(st: &CommState, func: &str) -> R<(usize, u64)> {
    if let Some(f) = st.proxy.flag.get() {
        return Ok(*f);
    }
    let f = stream_flag().map_err(|e| cuda_fail(func, "stream flag", e))?;
    // A racing thread's flag wins; this one is leaked (64 bytes, once).
    Ok(*st.proxy.flag.get_or_init(|| f))
}

/// Enqueues `calls` on their streams: input copies, a wait on the communicator's flag,
/// output copies. The proxy runs the collective once the inputs have landed, then sets
/// the flag, which releases the output copies and all later work on the streams.
fn run_staged(
    st: &'static CommState,
    comm: &'static Communicator,
    calls: &[Call],
    kinds: &[(MemKind, MemKind, Option<MemKind>)],
) -> R<()> {
    let func = calls[0].func;
    st.proxy.clear_graves();
    st.proxy.check()?;
    let asynchronous = !blocking();
    if asynchronous {
        // Bounded depth: the mirrors of calls in flight are pinned memory.
        st.proxy.wait_below(MAX_IN_FLIGHT);
    }
    let mut sg = Staged {
        proxy: &st.proxy,
        mirrors: Vec::new(),
        host_calls: Vec::new(),
        streams: Vec::new(),
        ready: Vec::new(),
        done: Vec::new(),
    };
    if let Err(f) = prepare(&mut sg, calls, kinds) {
        let _ = sg.sync_all(func);
        return Err(f);
    }
    // Asynchronous: each stream waits for the flag to reach this call's number; a device
    // where that cannot be enqueued makes the call run inline instead.
    let mut set_flag = None;
    let mut all_wait = false;
    let mut seq = 0;
    if asynchronous {
        let (flag_host, flag_dev) = match flag(st, func) {
            Ok(f) => f,
            Err(f) => {
                let _ = sg.sync_all(func);
                return Err(f);
            }
        };
        seq = st.proxy.seq.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        set_flag = Some(move || {
            // SAFETY: the communicator's flag, never freed; only the thread running the
            // communicator's jobs (one at a time, in sequence order) stores to it.
            unsafe { std::ptr::write_volatile(flag_host as *mut u32, seq) };
            std::sync::atomic::fence(Ordering::SeqCst);
        });
        all_wait = sg.streams.iter().all(|&(s, o)| {
            let r = OnDevice::push(o).and_then(|on| on.wait_flag(o, s, flag_dev, seq));
            r.is_ok()
        });
    }
    let queued = all_wait
        && sg.enqueue_outputs().is_ok()
        && match sg.record() {
            Ok(d) => {
                sg.done = d;
                true
            }
            Err(_) => false,
        };
    if queued {
        let tr = trace();
        if tr {
            trace_line(format_args!(
                "oxccl-trace pid {} seq {seq}: enqueued {} stream(s) {:?}",
                std::process::id(),
                sg.streams.len(),
                sg.streams
            ));
        }
        return st.proxy.submit(Box::new(move || {
            let pid = std::process::id();
            if tr {
                trace_line(format_args!("oxccl-trace pid {pid} seq {seq}: proxy starts"));
            }
            let r = sg.execute(comm);
            if tr {
                trace_line(format_args!(
                    "oxccl-trace pid {pid} seq {seq}: collective {}",
                    if r.is_ok() { "ok" } else { "FAILED" }
                ));
            }
            if let Some(set) = set_flag {
                set();
            }
            for ev in &sg.done {
                let _ = ev.wait();
            }
            if tr {
                trace_line(format_args!("oxccl-trace pid {pid} seq {seq}: outputs landed"));
            }
            // Events are destroyed on the next calling thread, not here: cuEventDestroy
            // takes the context lock, which a caller blocked in a synchronous copy on a
            // stream that waits for the next job may hold (seen: 4 PyTorch processes hung).
            let proxy = sg.proxy;
            proxy.bury(Box::new(sg));
            r.inspect_err(|f| crate::handle::record(func, Some(st), f))
        }));
    }
    // Inline: after every queued call, then the outputs copied back and waited for. (No
    // stream wait on this device, or the asynchronous path is off, or enqueueing failed.)
    st.proxy.drain();
    let r = sg.execute(comm);
    // Streams that already wait for this call are released whatever its outcome.
    if let Some(set) = set_flag {
        set();
    }
    let r = r.and_then(|()| sg.enqueue_outputs());
    // Outputs (if any) landed and no copy still uses a mirror.
    let synced = sg.sync_all(func);
    r.and(synced)
}

/// Mirrors every device range of `calls` (input copies enqueued), rewrites the calls onto
/// the mirrors, and records each stream's `ready` event.
fn prepare(sg: &mut Staged, calls: &[Call], kinds: &[(MemKind, MemKind, Option<MemKind>)]) -> R<()> {
    for (c, &(sk, rk, pk)) in calls.iter().zip(kinds) {
        // Managed memory is used in place, once the stream's earlier work is done (the
        // proxy waits for the stream's `ready` event before it touches anything).
        for k in [sk, rk].into_iter().chain(pk) {
            if let MemKind::Managed { ordinal } = k {
                sg.stream(c.stream, ordinal);
            }
        }
        let (s, r) = (c.send as usize, c.recv as usize);
        let (mut send, mut recv) = (c.send, c.recv);
        for sp in spans(c, ordinal(sk).is_some(), ordinal(rk).is_some()) {
            let o = if sp.send { ordinal(sk) } else { ordinal(rk) }.unwrap_or(0);
            let base = sg.mirror(c, o, sp.start, sp.len, sp.input, sp.output)?;
            if sp.send {
                send = (base + (s - sp.start)) as *const u8;
            }
            if sp.recv {
                recv = (base + (r - sp.start)) as *mut u8;
            }
        }
        let mut premul = c.premul.clone();
        if let (Some(pm), Some(MemKind::Device { ordinal })) = (premul.as_deref_mut(), pk) {
            if let Scalar::Pointer(p) = pm.scalar {
                let es = pm.dtype.size_bytes();
                // Read by the proxy after the stream's `ready` event.
                pm.scalar = Scalar::Pointer(sg.mirror(c, ordinal, p, es, true, false)?);
            }
        }
        if sg.streams.is_empty() {
            // Only a device scalar or managed memory elsewhere: still ordered on the stream.
            if let Some(o) = [sk, rk].into_iter().chain(pk).find_map(any_ordinal) {
                sg.stream(c.stream, o);
            }
        }
        sg.host_calls.push(Call { send, recv, premul, ..c.shallow() });
    }
    sg.ready = sg.record()?;
    Ok(())
}

impl Call {
    /// A copy of the call's description without its PreMulSum operator.
    fn shallow(&self) -> Call {
        Call {
            func: self.func,
            kind: self.kind,
            dtype: self.dtype,
            send: self.send,
            recv: self.recv,
            send_len: self.send_len,
            recv_len: self.recv_len,
            in_place: self.in_place,
            count: self.count,
            premul: None,
            stream: self.stream,
        }
    }
}
