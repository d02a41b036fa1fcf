//! One rank of a benchmark run: nccl-tests' procedure and output, on oxccl.
//!
//! Per data type × operator × root: a warm-up over the sizes, then for each size the
//! out-of-place and in-place measurements (`-n` timed iterations of `-m` calls each, times
//! combined across ranks as `-a` says), each followed by `-c` checked iterations with fresh
//! verifiable inputs (exact for any reduction order; oxccl-testkit's inputs and reference).

use crate::args::{Bench, Opts};
use crate::colls::{self, Call, Counts};
use crate::report::{self, float_str, g6, Device, Results, Row, RunConfig, Time, Timing};
use crate::stamp::{cpu_time, g6_plain, timestamp};
use oxccl::{Communicator, DataType, ReduceOp};
use oxccl_core::json::finite;
use std::time::Instant;

/// The test-only fault hook: when set, rank 0 corrupts one element of every checked result
/// before comparing it, so tests can see that a wrong value fails the run.
pub const CORRUPT_ENV: &str = "OXCCL_PERF_CORRUPT_RESULT";

fn barrier(comm: &Communicator) -> oxccl::Result<()> {
    let mut b = [0u8; 1];
    comm.all_reduce_in_place(&mut b, ReduceOp::Max)
}

/// Combines one value across ranks: rank 0's (0), the average (1), the minimum (2) or the
/// maximum (3); `sum` forces a sum.
fn combine(comm: &Communicator, v: &mut [f64], how: u8) -> oxccl::Result<()> {
    match how {
        0 => comm.broadcast_in_place(v, oxccl::Rank(0)),
        1 => comm.all_reduce_in_place(v, ReduceOp::Avg),
        2 => comm.all_reduce_in_place(v, ReduceOp::Min),
        _ => comm.all_reduce_in_place(v, ReduceOp::Max),
    }
}

/// The host's CPU model name.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The CPUs this process may run on, as a list (`0-1`).
fn affinity() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Cpus_allowed_list:")).map(|l| l[18..].trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

/// Resident memory of this process in bytes.
fn rss() -> i64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<i64>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

fn mem_str(b: i64) -> String {
    let (v, u) = match b.abs() {
        x if x >= 1 << 30 => (b as f64 / (1u64 << 30) as f64, "GB"),
        x if x >= 1 << 20 => (b as f64 / (1u64 << 20) as f64, "MB"),
        x if x >= 1 << 10 => (b as f64 / 1024.0, "KB"),
        _ => (b as f64, "B"),
    };
    let p = if v.abs() < 10.0 {
        2
    } else if v.abs() < 100.0 {
        1
    } else {
        0
    };
    format!("{v:.p$} {u}")
}

struct Measured {
    time_us: f64,
    alg: f64,
    bus: f64,
    wrong: Option<u64>,
    per_iter: Option<[f64; 4]>,
}

/// Memory for one buffer: oxccl's shared memory (`-R 1`) or the heap (`-R 0`).
enum Mem {
    Heap(Vec<u8>),
    Shared(oxccl::mem::SharedBuf<u8>),
}

impl Mem {
    fn new(bytes: usize, shared: bool) -> Mem {
        if shared {
            match oxccl::mem::SharedBuf::zeroed(bytes) {
                Ok(b) => return Mem::Shared(b),
                Err(e) => eprintln!("oxccl-perf: shared memory unavailable ({e}); using the heap"),
            }
        }
        Mem::Heap(vec![0u8; bytes])
    }
}

impl std::ops::Deref for Mem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Mem::Heap(v) => v,
            Mem::Shared(b) => b,
        }
    }
}

impl std::ops::DerefMut for Mem {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Mem::Heap(v) => v,
            Mem::Shared(b) => b,
        }
    }
}

/// A rank's buffers: send, and one receive buffer per aggregated call; with `--mem device`
/// their device twins too (the host ones then hold inputs and checked results).
struct Buffers {
    send: Mem,
    recvs: Vec<Mem>,
    offset: usize,
    dsend: Option<oxccl::cuda::DevBuf>,
    drecvs: Vec<oxccl::cuda::DevBuf>,
}

/// The device side of a run (`--mem device`): the communicator's device calls, the rank's
/// device and the stream every call is enqueued on.
pub struct Dev<'c> {
    pub dc: oxccl::cuda::DevComm<'c>,
    pub dev: oxccl::cuda::Device,
    pub stream: oxccl::cuda::Stream,
}

fn dev_err(e: impl std::fmt::Display) -> oxccl::Error {
    oxccl::Error::InvalidUsage(format!("device: {e}"))
}

pub struct Runner<'c> {
    comm: &'c Communicator,
    dev: Option<Dev<'c>>,
    o: Opts,
    out: bool,
    json_results: Vec<Row>,
    errors: u64,
    bw_sum: f64,
    bw_count: usize,
    started: Instant,
    mem: [i64; 3],
}

impl<'c> Runner<'c> {
    pub fn new(comm: &'c Communicator, o: Opts, init_rss: i64, dev: Option<Dev<'c>>) -> Runner<'c> {
        let out = comm.rank().0 == 0;
        Runner {
            comm,
            dev,
            o,
            out,
            json_results: Vec::new(),
            errors: 0,
            bw_sum: 0.0,
            bw_count: 0,
            started: Instant::now(),
            mem: [init_rss, 0, 0],
        }
    }

    fn print(&self, s: &str) {
        if self.out {
            print!("{s}");
        }
    }

    fn types(&self) -> Vec<DataType> {
        self.o.dtype.map(|d| vec![d]).unwrap_or_else(|| DataType::ALL.to_vec())
    }

    fn ops(&self, dtype: DataType) -> Vec<ReduceOp> {
        if !self.o.bench.reduces() {
            return vec![ReduceOp::Sum];
        }
        match self.o.op {
            Some(op) => vec![op],
            // nccl-tests' "all": sum, prod, max, min, avg.
            None => [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg]
                .into_iter()
                .filter(|o| o.valid_for(dtype))
                .collect(),
        }
    }

    fn roots(&self) -> Vec<usize> {
        if !self.o.bench.rooted() {
            return vec![usize::MAX];
        }
        match self.o.root {
            Some(r) => vec![r],
            None => (0..self.comm.size()).collect(),
        }
    }

    /// The header and the device report; returns the JSON for them.
    fn header(&self) -> oxccl::Result<(RunConfig, Vec<Device>)> {
        let o = &self.o;
        let step = if o.step_factor > 1 {
            format!("{}(factor)", o.step_factor)
        } else {
            format!("{}(bytes)", o.step_bytes)
        };
        self.print(&format!(
            "# oxccl-perf version {} (nccl-tests 2.19.6 layout) oxccl-library={}\n# Collective test starting: {}\n",
            env!("CARGO_PKG_VERSION"),
            env!("CARGO_PKG_VERSION"),
            o.bench.program()
        ));
        self.print(&format!(
            "# nThread {} nGpus 1 minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} agg iters: {} validation: {} graph: {} unalign: {}\n",
            o.nthreads, o.min_bytes, o.max_bytes, o.warmup, o.iters, o.agg, o.check, o.graph, o.unalign
        ));
        match o.blocking {
            1 => self.print("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n"),
            2 => self.print("# Blocking Enabled: wait after each inner iteration (-m), no barrier \n"),
            3 => self.print("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n"),
            _ => {}
        }
        if o.per_iter {
            self.print("# Per-Iteration Report: wall-clock timing; i_* uses max over process rows \n");
        }
        let transport = if self.comm.config().shm_disable { "tcp" } else { "shm/tcp by host" };
        let buffers = match &self.dev {
            Some(d) => format!("CUDA device memory, device engine: {:?}", d.dc.engine()),
            None if o.register => "oxccl shared memory (registered, -R 1)".to_string(),
            None => "process heap (-R 0)".to_string(),
        };
        self.print(&format!("# Buffers: {buffers}; transport: {transport}\n#\n# Using devices\n"));
        // Every rank's line, sent to all (fixed 256-byte records) by an all-to-all, which no
        // NCCL_ALGO / NCCL_PROTO setting restricts (the benchmarked collective may be the only
        // one the settings allow).
        let me = &self.comm.peers()[self.comm.rank().idx()];
        let line = match &self.dev {
            Some(d) => format!(
                "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device {:2} [{}] {}",
                self.comm.rank().0,
                0,
                std::process::id(),
                me.hostname,
                d.dev.ordinal,
                d.dev.name,
                d.dev.arch()
            ),
            None => format!(
                "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device cpu [{}] {}",
                self.comm.rank().0,
                0,
                std::process::id(),
                me.hostname,
                affinity(),
                cpu_model()
            ),
        };
        let mut rec = [0u8; 256];
        let n = line.len().min(255);
        rec[..n].copy_from_slice(&line.as_bytes()[..n]);
        let mut all = vec![0u8; 256 * self.comm.size()];
        let send: Vec<u8> = rec.iter().copied().cycle().take(256 * self.comm.size()).collect();
        let mut g = self.comm.group();
        g.all_to_all(&send, &mut all)?;
        g.end()?;
        let mut devices = Vec::new();
        for (r, chunk) in all.chunks(256).enumerate() {
            let end = chunk.iter().position(|b| *b == 0).unwrap_or(256);
            let l = String::from_utf8_lossy(&chunk[..end]).into_owned();
            self.print(&format!("{l}\n"));
            let p = &self.comm.peers()[r];
            devices.push(Device {
                rank: r as u64,
                group: 0,
                pid: p.pid.into(),
                hostname: p.hostname.clone(),
                device: "cpu".into(),
                device_info: l.split("] ").nth(1).unwrap_or("").to_string(),
            });
        }
        let by_factor = o.step_factor > 1;
        let config = RunConfig {
            nthreads: 1,
            ngpus: 1,
            minimum_bytes: o.min_bytes as u64,
            maximum_bytes: o.max_bytes as u64,
            step_factor: by_factor.then_some(o.step_factor as u64),
            step_bytes: (!by_factor).then_some(o.step_bytes as u64),
            warmup_iters: o.warmup as u64,
            iterations: o.iters as u64,
            aggregated_iterations: o.agg as u64,
            validation: o.check as u64,
            blocking_collectives: o.blocking != 0,
            per_iter_timing: o.per_iter,
            registered_buffers: o.register,
            nranks: self.comm.size() as u64,
        };
        Ok((config, devices))
    }

    fn result_header(&self) {
        let t = if self.o.report_cputime { "cputime" } else { "time" };
        self.print("#\n");
        if self.o.per_iter {
            self.print(&format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}              out-of-place (+ per-iteration)                                in-place (+ per-iteration)\n", "", "", "", "", ""));
            self.print(&format!(
                "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7} \n",
                "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%", t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"
            ));
            self.print(&format!(
                "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7} \n",
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)"
            ));
        } else {
            self.print(&format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          \n", "", "", "", "", ""));
            self.print(&format!(
                "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} \n",
                "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong"
            ));
            self.print(&format!(
                "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} \n",
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
            ));
        }
    }

    fn alloc(&self, dtype: DataType) -> oxccl::Result<Buffers> {
        let p = self.comm.size();
        let c = colls::counts(self.o.bench, self.o.max_bytes, dtype, p);
        let es = dtype.size_bytes();
        let offset = self.o.unalign * es;
        let bytes = c.send.max(c.recv) * es + offset + 64;
        let shared = self.o.register && self.dev.is_none();
        let (dsend, drecvs) = match &self.dev {
            Some(d) => {
                let nb = |_| oxccl::cuda::DevBuf::new(&d.dev, bytes).map_err(dev_err);
                (Some(nb(())?), (0..self.o.agg).map(|_| nb(())).collect::<oxccl::Result<Vec<_>>>()?)
            }
            None => (None, Vec::new()),
        };
        Ok(Buffers {
            send: Mem::new(bytes, shared),
            recvs: (0..self.o.agg).map(|_| Mem::new(bytes, shared)).collect(),
            offset,
            dsend,
            drecvs,
        })
    }

    fn call_once(&self, call: &Call, b: &mut Buffers) -> oxccl::Result<()> {
        let off = b.offset;
        if let (Some(d), Some(s)) = (&self.dev, &b.dsend) {
            let recvs: Vec<u64> = b.drecvs.iter().map(|r| r.ptr + off as u64).collect();
            return colls::run_device(&d.dc, &d.stream, call, s.ptr + off as u64, &recvs).map_err(
                |e| match e {
                    oxccl::cuda::DevError::Comm(c) => c,
                    e => dev_err(e),
                },
            );
        }
        let mut recvs: Vec<&mut [u8]> = b.recvs.iter_mut().map(|r| &mut r[off..]).collect();
        colls::run(self.comm, call, &b.send[off..], &mut recvs)
    }

    /// With `-G`: `n` calls of `call` captured into a graph on the device stream (the capture
    /// ended whatever happens), instantiated.
    fn capture(
        &self,
        call: &Call,
        b: &mut Buffers,
        n: usize,
    ) -> oxccl::Result<oxccl::cuda::graph::GraphExec> {
        use oxccl::cuda::graph::CaptureMode;
        let d = self.dev.as_ref().ok_or_else(|| dev_err("-G needs --mem device"))?;
        let mode = match self.o.graph_mode {
            Some(0) => CaptureMode::Global,
            Some(2) => CaptureMode::Relaxed,
            Some(_) => CaptureMode::ThreadLocal,
            None if self.o.nthreads > 1 => CaptureMode::ThreadLocal,
            None => CaptureMode::Global,
        };
        d.stream.begin_capture(mode).map_err(dev_err)?;
        let mut made = Ok(());
        for _ in 0..n {
            made = self.call_once(call, b);
            if made.is_err() {
                break;
            }
        }
        let graph = d.stream.end_capture().map_err(dev_err);
        made?;
        let graph = graph?;
        // Instantiating is one of the calls a capture in global mode forbids to every other
        // thread: every rank's thread ends its capture first.
        barrier(self.comm)?;
        graph.instantiate().map_err(dev_err)
    }

    /// Waits for the device calls enqueued so far (nothing on host memory).
    fn sync(&self) -> oxccl::Result<()> {
        match &self.dev {
            Some(d) => d.stream.sync().map_err(dev_err),
            None => Ok(()),
        }
    }

    /// Copies the host send buffer and first receive buffer (the inputs `colls::init` wrote)
    /// to their device twins.
    fn upload(&self, b: &Buffers) -> oxccl::Result<()> {
        if let (Some(d), Some(s)) = (&self.dev, &b.dsend) {
            d.stream.upload(s.ptr, &b.send).map_err(dev_err)?;
            d.stream.upload(b.drecvs[0].ptr, &b.recvs[0]).map_err(dev_err)?;
        }
        Ok(())
    }

    /// Copies the first device receive buffer back to its host twin.
    fn download(&self, b: &mut Buffers) -> oxccl::Result<()> {
        if let Some(d) = &self.dev {
            d.stream.download(&mut b.recvs[0], b.drecvs[0].ptr).map_err(dev_err)?;
        }
        Ok(())
    }

    fn measure(&mut self, call: &Call, b: &mut Buffers) -> oxccl::Result<Measured> {
        let o = self.o.clone();
        let p = self.comm.size();
        let off = b.offset;
        if o.check > 0 {
            let (s, r) = (&mut b.send[off..], &mut b.recvs[0][off..]);
            colls::init(self.comm, call, 99, s, r);
            self.upload(b)?;
        }
        self.call_once(call, b)?;
        self.sync()?;
        barrier(self.comm)?;
        // With -G: the timed iterations captured into one graph, launched o.graph times.
        let graph = if o.graph > 0 {
            let g = self.capture(call, b, o.iters)?;
            barrier(self.comm)?;
            Some(g)
        } else {
            None
        };
        let cpu0 = cpu_time();
        let start = Instant::now();
        let mut per_iter = Vec::with_capacity(if o.per_iter && graph.is_none() { o.iters } else { 0 });
        let mut excluded = 0.0f64;
        if let (Some(g), Some(d)) = (&graph, &self.dev) {
            for _ in 0..o.graph {
                g.launch(&d.stream).map_err(dev_err)?;
            }
        }
        for _ in 0..if graph.is_some() { 0 } else { o.iters } {
            let t0 = Instant::now();
            self.call_once(call, b)?;
            if o.per_iter || o.blocking != 0 {
                self.sync()?;
            }
            if o.per_iter {
                per_iter.push(t0.elapsed().as_secs_f64());
            }
            match o.blocking {
                1 => barrier(self.comm)?,
                3 => {
                    let tb = Instant::now();
                    barrier(self.comm)?;
                    excluded += tb.elapsed().as_secs_f64();
                }
                _ => {}
            }
        }
        self.sync()?;
        let ops = (o.iters * o.agg * o.graph.max(1)) as f64;
        let mut sec = [(start.elapsed().as_secs_f64() - excluded) / ops];
        let cpu_sec = (cpu_time() - cpu0) / ops;
        combine(self.comm, &mut sec, o.average)?;
        let (alg, bus) = colls::bandwidth(call.bench, call.counts.param, call.dtype, sec[0], p);
        let per_iter_stats = if o.per_iter && !per_iter.is_empty() {
            let mut v = per_iter.clone();
            self.comm.all_reduce_in_place(&mut v, ReduceOp::Max)?;
            let v: Vec<f64> = v[o.per_iter_skip..].iter().map(|t| t / o.agg as f64).collect();
            let mut sorted = v.clone();
            sorted.sort_by(|a, b| a.total_cmp(b));
            let n = sorted.len();
            let mean = v.iter().sum::<f64>() / n as f64;
            let sd = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64).sqrt();
            let p99 = sorted[((n * 99).div_ceil(100)).max(1) - 1];
            Some([
                sorted[0] * 1e6,
                sorted[n - 1] * 1e6,
                p99 * 1e6,
                if mean > 0.0 { sd / mean * 100.0 } else { 0.0 },
            ])
        } else {
            None
        };
        barrier(self.comm)?;
        let report = !call.in_place || call.bench.checks_in_place();
        let mut wrong = 0u64;
        // With -G each check's call is captured too, and replayed: o.graph times out of place
        // (the same result each time), once in place (its input is its output).
        let check_graph = if o.graph > 0 && o.check > 0 {
            let g = self.capture(call, b, 1)?;
            // Nobody synchronises (the uploads) while another rank's thread still captures: in
            // global mode that would invalidate its capture.
            barrier(self.comm)?;
            Some(g)
        } else {
            None
        };
        let replays = if call.in_place { 1 } else { o.graph.max(1) };
        for rep in 0..o.check {
            let seed = 1000 + rep as u64;
            {
                let (s, r) = (&mut b.send[off..], &mut b.recvs[0][off..]);
                colls::init(self.comm, call, seed, s, r);
            }
            self.upload(b)?;
            match (&check_graph, &self.dev) {
                (Some(g), Some(d)) => {
                    for _ in 0..replays {
                        g.launch(&d.stream).map_err(dev_err)?;
                    }
                }
                _ => self.call_once(call, b)?,
            }
            self.sync()?;
            self.download(b)?;
            if let Some((at, want)) = colls::expected(self.comm, call, seed) {
                let got = &mut b.recvs[0][off + at..off + at + want.len()];
                if std::env::var_os(CORRUPT_ENV).is_some() && self.comm.rank().0 == 0 && !got.is_empty() {
                    got[0] ^= 0x5a;
                }
                wrong += colls::wrong_elements(call.dtype, got, &want);
            }
            let mut w = [wrong];
            self.comm.all_reduce_in_place(&mut w, ReduceOp::Sum)?;
            wrong = w[0];
            if wrong > 0 {
                break;
            }
        }
        if report && wrong > 0 {
            self.errors += 1;
        }
        let time_us = if o.report_cputime { cpu_sec * 1e6 } else { sec[0] * 1e6 };
        Ok(Measured {
            time_us,
            alg,
            bus,
            wrong: (report && o.check > 0).then_some(wrong),
            per_iter: per_iter_stats,
        })
    }

    fn body(&self, m: &Measured) -> String {
        let mut s = format!(
            "  {:>7}  {:>6}  {:>6}",
            float_str(m.time_us, 7),
            float_str(m.alg, 6),
            float_str(m.bus, 6)
        );
        match m.wrong {
            Some(w) => s.push_str(&format!("  {}", g6(w as f64))),
            None => s.push_str("    N/A"),
        }
        if let Some(pi) = m.per_iter {
            s.push_str(&format!(
                "  {:>7}  {:>7}  {:>7}  {:>7}",
                float_str(pi[0], 7),
                float_str(pi[1], 7),
                float_str(pi[2], 7),
                float_str(pi[3], 7)
            ));
        }
        s
    }

    fn body_json(m: &Measured, cputime: bool) -> Timing {
        let t = finite(m.time_us);
        Timing {
            time: if cputime { Time::Cpu(t) } else { Time::Wall(t) },
            alg_bw: finite(m.alg),
            bus_bw: finite(m.bus),
            nwrong: m.wrong,
        }
    }

    fn time_test(&mut self, dtype: DataType, op: ReduceOp, root: usize) -> oxccl::Result<()> {
        let p = self.comm.size();
        let bench = self.o.bench;
        if bench == Bench::HyperCube && !p.is_power_of_two() {
            return Err(oxccl::Error::InvalidUsage(format!(
                "hypercube_perf needs a power-of-two rank count, not {p}"
            )));
        }
        let mut b = self.alloc(dtype)?;
        self.mem[1] = self.mem[1].max(rss());
        let call_for = |bytes: usize, in_place: bool| Call {
            bench,
            dtype,
            op,
            root: if root == usize::MAX { 0 } else { root },
            in_place,
            counts: colls::counts(bench, bytes, dtype, p),
        };
        barrier(self.comm)?;
        // Warm-up over the sizes, doubling.
        let mut size = self.o.min_bytes.max(1);
        while size <= self.o.max_bytes {
            for _ in 0..self.o.warmup {
                self.call_once(&call_for(size, false), &mut b)?;
            }
            self.sync()?;
            size = size.saturating_mul(2);
        }
        let sizes = self.o.sizes();
        let mut cycle = 0;
        while self.o.cycles == 0 || cycle < self.o.cycles {
            cycle += 1;
            for (k, &bytes) in sizes.iter().enumerate() {
                let oop = call_for(bytes, false);
                let c: Counts = oop.counts;
                let es = dtype.size_bytes();
                let root_s = if root == usize::MAX { -1 } else { root as i64 };
                let opname = if bench.reduces() { op.name() } else { "none" };
                let pre = format!(
                    "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
                    c.send.max(c.recv) * es,
                    c.param,
                    dtype.name(),
                    opname,
                    root_s
                );
                let m1 = self.measure(&oop, &mut b)?;
                let m2 = self.measure(&call_for(bytes, true), &mut b)?;
                // nccl-tests averages the bus bandwidth of both columns.
                self.bw_sum += m1.bus + m2.bus;
                self.bw_count += 2;
                let ts = if self.o.timestamps { format!("  {}", timestamp()) } else { String::new() };
                self.print(&format!("{pre}{}{}{ts}\n", self.body(&m1), self.body(&m2)));
                self.json_results.push(Row {
                    size: (c.send.max(c.recv) * es) as u64,
                    count: c.param as u64,
                    dtype: dtype.name().into(),
                    redop: opname.into(),
                    root: root_s,
                    out_of_place: Self::body_json(&m1, self.o.report_cputime),
                    in_place: Self::body_json(&m2, self.o.report_cputime),
                    actual_iterations: self.o.iters as u64,
                    experiment_name: String::new(),
                });
                if self.out && self.started.elapsed().as_secs() >= 2 {
                    eprintln!(
                        "# [oxccl-perf] {} {} {}: size {} done ({}/{}), {:.1} s",
                        bench.program(),
                        dtype.name(),
                        opname,
                        c.send.max(c.recv) * es,
                        k + 1,
                        sizes.len(),
                        self.started.elapsed().as_secs_f64()
                    );
                }
            }
        }
        self.mem[2] = self.mem[2].max(rss());
        Ok(())
    }

    /// Runs the whole benchmark; returns the process exit code.
    pub fn run(mut self) -> i32 {
        let (config, devices) = match self.header() {
            Ok(h) => h,
            Err(e) => {
                eprintln!("oxccl-perf: {e}");
                return 2;
            }
        };
        self.result_header();
        let mut err: Option<String> = None;
        'all: for dtype in self.types() {
            for op in self.ops(dtype) {
                for root in self.roots() {
                    if let Err(e) = self.time_test(dtype, op, root) {
                        err = Some(e.to_string());
                        break 'all;
                    }
                }
            }
        }
        let mut e = [self.errors];
        if err.is_none() && self.comm.all_reduce_in_place(&mut e, ReduceOp::Sum).is_err() {
            err = Some("could not combine error counts".into());
        }
        self.errors = e[0];
        let avg = if self.bw_count > 0 { self.bw_sum / self.bw_count as f64 } else { 0.0 };
        if let Some(e) = &err {
            // Every rank says why it stopped, on its own stderr: the rank that printed the report
            // may be the one that died.
            eprintln!("oxccl-perf: {e}");
            self.print(&format!("# error: {e}\n"));
        }
        // A run that stopped early checked only part of its values: never "OK".
        let verdict = match (&err, self.errors) {
            (Some(_), n) => format!("{n} found before the run stopped early: FAILED (see the error above)"),
            (None, 0) => "0 OK".to_string(),
            (None, n) => format!("{n} FAILED"),
        };
        self.print(&format!("# {:<20} : {verdict}\n", "Out of bounds values"));
        self.print(&format!("# {:<20} : {} \n", "Avg bus bandwidth", g6_plain(avg)));
        self.print("#\n");
        self.print(&format!("# Collective test concluded: {}\n", self.o.bench.program()));
        if self.o.memory {
            let [init, user, coll] = self.mem;
            let (user, coll) = ((user - init).max(0), (coll - user.max(init)).max(0));
            let mut m = [init as f64, user as f64, coll as f64];
            let _ = self.comm.all_reduce_in_place(&mut m, ReduceOp::Max);
            let total = (m[0] + m[1] + m[2]) as i64;
            self.print(&format!(
                "# {:<20} : Initialization {} | User-Allocated {} | Collective {} | Total  {}\n",
                "Host memory usage",
                mem_str(m[0] as i64),
                mem_str(m[1] as i64),
                mem_str(m[2] as i64),
                mem_str(total)
            ));
        }
        self.print("#\n");
        if err.is_none() {
            self.print("\n");
        }
        if self.out {
            if let Some(path) = &self.o.json {
                let j = Results {
                    label: format!("oxccl P={}", self.comm.size()),
                    library: format!("oxccl {}", env!("CARGO_PKG_VERSION")),
                    benchmark: self.o.bench.program().into(),
                    config,
                    devices,
                    results: std::mem::take(&mut self.json_results),
                    out_of_bounds: report::OutOfBounds { count: self.errors, okay: self.errors == 0 },
                    average_bus_bandwidth: report::AverageBusBandwidth {
                        bandwidth: finite(avg),
                        okay: "unchecked".into(),
                    },
                    errors: err.iter().cloned().collect(),
                };
                match std::fs::write(path, j.to_json()) {
                    Ok(()) => println!("# Writing JSON output to {path}"),
                    Err(e) => eprintln!("oxccl-perf: cannot write {path}: {e}"),
                }
                if let Some(svg) = &self.o.plot {
                    crate::plot_files(svg, std::slice::from_ref(path), &self.o.plot_inputs, None);
                }
            }
        }
        if err.is_some() {
            2
        } else if self.errors > 0 {
            1
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(mem_str(3 << 20), "3.00 MB");
    }
}
