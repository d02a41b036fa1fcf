//! CUDA graphs: whether a stream is being captured (`cuStreamIsCapturing`, as NCCL decides),
//! the calling thread's capture mode made relaxed while oxccl works ([`Relaxed`]), and, for
//! programs that capture (oxccl-perf's `-G`), capture, instantiation and launch.
//!
//! Rules:
//! 1. A call on a capturing stream enqueues only what replays correctly: kernels whose
//!    meeting numbers come from device memory (kernels/sync.cu's `base`), no event record or wait,
//!    no host work between launches. Engines that cannot say so refuse with a message.
//! 2. A stream whose capture was invalidated is refused (its capture already failed).
//! 3. Inside oxccl a thread's capture mode is relaxed: a thread of another rank capturing in
//!    global mode must not make this thread's own set-up calls (allocation, IPC mapping) fail.

use super::driver::{self, Handle};
use super::{CudaError, Stream};

/// `CUstreamCaptureMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    Global = 0,
    ThreadLocal = 1,
    Relaxed = 2,
}

/// Whether `stream` (a `CUstream`; 0 the legacy default) is being captured; an error for a
/// capture already invalidated.
pub fn capturing(stream: usize) -> Result<bool, CudaError> {
    let d = driver::driver()?;
    let mut status = 0i32;
    // SAFETY: writes one CUstreamCaptureStatus; the driver validates the handle.
    d.check("cuStreamIsCapturing", unsafe { (d.stream_is_capturing)(stream as Handle, &mut status) })?;
    match status {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(CudaError::Invalid(
            "the stream's CUDA graph capture was invalidated by an earlier call; end it and capture again"
                .into(),
        )),
    }
}

/// The calling thread's capture mode made relaxed until dropped (rule 3).
pub struct Relaxed {
    old: i32,
}

impl Relaxed {
    pub fn new() -> Result<Relaxed, CudaError> {
        let d = driver::driver()?;
        let mut mode = CaptureMode::Relaxed as i32;
        // SAFETY: reads and writes one CUstreamCaptureMode.
        d.check("cuThreadExchangeStreamCaptureMode", unsafe { (d.thread_exchange_capture_mode)(&mut mode) })?;
        Ok(Relaxed { old: mode })
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        if let Some(d) = driver::driver_if_loaded() {
            let mut mode = self.old;
            // SAFETY: as in `new`: the mode this thread had before.
            let _ = unsafe { (d.thread_exchange_capture_mode)(&mut mode) };
        }
    }
}

/// A captured graph, destroyed on drop.
pub struct Graph {
    h: Handle,
}

/// An instantiated graph, destroyed on drop.
pub struct GraphExec {
    h: Handle,
}

// SAFETY: graph handles are plain driver handles, usable from any thread of the process.
unsafe impl Send for Graph {}
// SAFETY: as above.
unsafe impl Send for GraphExec {}

impl Stream {
    /// Starts capturing this stream's work into a graph.
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<(), CudaError> {
        let d = driver::driver()?;
        // SAFETY: a live stream; the mode is a CUstreamCaptureMode value.
        d.check("cuStreamBeginCapture", unsafe { (d.stream_begin_capture)(self.h, mode as i32) })
    }

    /// Ends this stream's capture: the graph of what was enqueued since `begin_capture`.
    pub fn end_capture(&self) -> Result<Graph, CudaError> {
        let d = driver::driver()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: writes one CUgraph handle.
        d.check("cuStreamEndCapture", unsafe { (d.stream_end_capture)(self.h, &mut h) })?;
        if h.is_null() {
            return Err(CudaError::Invalid("cuStreamEndCapture gave no graph".into()));
        }
        Ok(Graph { h })
    }
}

impl Graph {
    pub fn instantiate(&self) -> Result<GraphExec, CudaError> {
        let d = driver::driver()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: writes one CUgraphExec handle; `self.h` is a live graph.
        d.check("cuGraphInstantiateWithFlags", unsafe { (d.graph_instantiate)(&mut h, self.h, 0) })?;
        Ok(GraphExec { h })
    }
}

impl GraphExec {
    /// Enqueues one replay of the graph on `s`.
    pub fn launch(&self, s: &Stream) -> Result<(), CudaError> {
        let d = driver::driver()?;
        // SAFETY: a live executable graph and stream.
        d.check("cuGraphLaunch", unsafe { (d.graph_launch)(self.h, s.h) })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Some(d) = driver::driver_if_loaded() {
            // SAFETY: destroyed once, here.
            let _ = unsafe { (d.graph_destroy)(self.h) };
        }
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if let Some(d) = driver::driver_if_loaded() {
            // SAFETY: destroyed once, here.
            let _ = unsafe { (d.graph_exec_destroy)(self.h) };
        }
    }
}
