//! CUDA, loaded at run time: the driver API (`libcuda.so.1`) and NVRTC (`libnvrtc.so.*`).
//! Nothing here is needed to build, and a machine without CUDA gets [`CudaError::NoCuda`]
//! from the first call, never a panic.
//!
//! - [`driver`]: the driver's entry points and checked calls;
//! - [`nvrtc`]: CUDA C to CUBIN for a device architecture;
//! - [`kernels`]: oxccl's copy and reduce-copy kernels, their source, and a module with every
//!   kernel loaded at once (CUDA's lazy loading would otherwise load a kernel at its first
//!   launch, which stalls behind a spinning kernel; see docs/devices.md);
//! - [`stage`]: what memory a pointer is, and stream-ordered copies to and from pinned host
//!   mirrors (device buffers over the host transports);
//! - [`call`]: calls on device buffers, and how a group of them becomes launches;
//! - [`group`]: the device engine of ranks that are threads of one process on one GPU;
//! - [`ipc`]: device buffers of other processes mapped here (CUDA IPC), and the device engine
//!   of ranks that are processes of one host;
//! - [`comm`]: [`DevComm`], a communicator's calls on device buffers, served by whichever
//!   engine fits its ranks (or staged through host memory).

pub mod call;
pub mod comm;
pub mod driver;
pub mod graph;
pub mod group;
pub mod ipc;
pub mod kernels;
pub mod nvrtc;
pub mod stage;

pub use comm::DevComm;
use driver::{CuDevice, CuDevicePtr, Driver, Handle};
use std::ffi::c_void;

/// What went wrong with CUDA.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA here (no library, a missing symbol, no device, no driver).
    #[error("no CUDA: {0}")]
    NoCuda(String),
    /// A CUDA call failed.
    #[error("{op} failed: {reason} (CUDA error {code})")]
    Call { op: &'static str, code: i32, reason: String },
    /// NVRTC is missing or refused a kernel source (its log attached).
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    /// A request this layer refuses before calling CUDA.
    #[error("{0}")]
    Invalid(String),
}

/// What went wrong with a call on device buffers: CUDA, or the communicator the device
/// engine exchanges its records over.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(transparent)]
    Comm(#[from] crate::Error),
}

/// One device with its primary context current on the calling thread.
pub struct Device {
    pub d: &'static Driver,
    pub ordinal: i32,
    pub ctx: Handle,
    pub name: String,
    /// Compute capability, e.g. (9, 0).
    pub cc: (i32, i32),
    pub sms: i32,
}

// SAFETY: a primary context may be made current on any thread (cuCtxSetCurrent); the
// handle is only passed to the driver.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    /// Device `ordinal`, its primary context retained and made current on this thread.
    pub fn open(ordinal: i32) -> Result<Device, CudaError> {
        let d = driver::driver()?;
        let n = d.device_count()?;
        if ordinal < 0 || ordinal >= n {
            return Err(CudaError::Invalid(format!("device {ordinal} does not exist: the driver sees {n}")));
        }
        let dev = d.device(ordinal)?;
        let attr = |a: i32| d.attribute(dev, a);
        let cc =
            (attr(driver::attr::COMPUTE_CAPABILITY_MAJOR)?, attr(driver::attr::COMPUTE_CAPABILITY_MINOR)?);
        let sms = attr(driver::attr::MULTIPROCESSOR_COUNT)?;
        let mut name = [0 as std::ffi::c_char; 128];
        // SAFETY: writes at most 128 bytes, NUL-terminated.
        d.check("cuDeviceGetName", unsafe { (d.device_name)(name.as_mut_ptr(), 128, dev) })?;
        // SAFETY: NUL-terminated by the driver within the buffer.
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        d.check("cuDevicePrimaryCtxRetain", unsafe { (d.primary_ctx_retain)(&mut ctx, dev) })?;
        let me = Device { d, ordinal, ctx, name, cc, sms };
        me.make_current()?;
        Ok(me)
    }

    /// Makes this device's context current on the calling thread.
    pub fn make_current(&self) -> Result<(), CudaError> {
        // SAFETY: the context was retained and is never released while `self` lives.
        self.d.check("cuCtxSetCurrent", unsafe { (self.d.ctx_set_current)(self.ctx) })
    }

    /// The NVRTC architecture name, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }
}

/// `bytes` of device memory in the calling thread's current context, if the process has
/// loaded the CUDA driver and a context is current (`None` otherwise: the caller falls back):
/// the address and the context, for [`free_in`]. For `ncclMemAlloc`.
pub fn alloc_in_current(bytes: usize) -> Result<Option<(CuDevicePtr, usize)>, CudaError> {
    let Some(d) = driver::driver_if_loaded() else { return Ok(None) };
    let mut ctx = std::ptr::null_mut();
    // SAFETY: writes one context handle.
    if unsafe { (d.ctx_get_current)(&mut ctx) } != 0 || ctx.is_null() {
        return Ok(None);
    }
    let mut p = 0;
    // SAFETY: writes one device pointer; a context is current.
    d.check("cuMemAlloc", unsafe { (d.mem_alloc)(&mut p, bytes.max(1)) })?;
    Ok(Some((p, ctx as usize)))
}

/// The ordinal of the calling thread's current context's device, if the process has loaded
/// the CUDA driver and a context is current (NCCL's "current device" at init).
pub fn current_device() -> Option<i32> {
    let d = driver::driver_if_loaded()?;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: writes one context handle.
    if unsafe { (d.ctx_get_current)(&mut ctx) } != 0 || ctx.is_null() {
        return None;
    }
    let mut dev: CuDevice = 0;
    // SAFETY: writes one device handle; a context is current.
    if unsafe { (d.ctx_get_device)(&mut dev) } != 0 {
        return None;
    }
    // A device handle is not promised to be its ordinal: find the ordinal that has it.
    (0..d.device_count().ok()?).find(|&i| {
        let mut h: CuDevice = -1;
        // SAFETY: writes one device handle.
        unsafe { (d.device_get)(&mut h, i) == 0 && h == dev }
    })
}

/// Whether kernels on device `a` can address device `b`'s memory (peer access; a device
/// can always address its own).
pub fn can_access_peer(a: i32, b: i32) -> Result<bool, CudaError> {
    if a == b {
        return Ok(true);
    }
    let d = driver::driver()?;
    let (da, db) = (d.device(a)?, d.device(b)?);
    let mut yes = 0;
    // SAFETY: writes one int.
    d.check("cuDeviceCanAccessPeer", unsafe { (d.device_can_access_peer)(&mut yes, da, db) })?;
    Ok(yes != 0)
}

/// Lets kernels in `dev`'s primary context address the memory of `peer`'s primary context
/// (idempotent); `dev`'s context is current afterwards.
pub fn enable_peer_access(dev: &Device, peer: &Device) -> Result<(), CudaError> {
    if peer.ordinal == dev.ordinal {
        return dev.make_current();
    }
    dev.make_current()?;
    const ALREADY_ENABLED: driver::CuResult = 704;
    // SAFETY: both primary contexts are retained for the life of the process.
    match unsafe { (dev.d.ctx_enable_peer_access)(peer.ctx, 0) } {
        0 | ALREADY_ENABLED => Ok(()),
        r => dev.d.check("cuCtxEnablePeerAccess", r),
    }
}

/// Frees what [`alloc_in_current`] returned, with its context pushed for the call. The
/// caller frees each allocation once and keeps the context alive until then.
pub fn free_in(ctx: usize, p: CuDevicePtr) -> Result<(), CudaError> {
    let d = driver::driver()?;
    // SAFETY: a context the caller keeps alive.
    let pushed = unsafe { (d.ctx_push)(ctx as Handle) } == 0;
    // SAFETY: a pointer cuMemAlloc returned in that context, freed once.
    let r = d.check("cuMemFree", unsafe { (d.mem_free)(p) });
    if pushed {
        let mut old = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        let _ = unsafe { (d.ctx_pop)(&mut old) };
    }
    r
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct DevBuf {
    d: &'static Driver,
    pub ptr: CuDevicePtr,
    pub bytes: usize,
}

impl DevBuf {
    pub fn new(dev: &Device, bytes: usize) -> Result<DevBuf, CudaError> {
        let mut ptr = 0;
        // SAFETY: writes one device pointer; a context is current (Device::open).
        dev.d.check("cuMemAlloc", unsafe { (dev.d.mem_alloc)(&mut ptr, bytes.max(1)) })?;
        Ok(DevBuf { d: dev.d, ptr, bytes })
    }

    /// Copies `src` to the start of the buffer, complete on return: from pageable memory
    /// cuMemcpyHtoD may return before its DMA lands, and work on a non-blocking stream does
    /// not wait for it, so the context is synchronised after it.
    pub fn upload<T: bytemuck::Pod>(&self, src: &[T]) -> Result<(), CudaError> {
        let b: &[u8] = bytemuck::cast_slice(src);
        if b.len() > self.bytes {
            return Err(CudaError::Invalid(format!(
                "upload of {} bytes into a {}-byte buffer",
                b.len(),
                self.bytes
            )));
        }
        // SAFETY: the host slice is valid for its length, which fits in the buffer.
        let r = unsafe { (self.d.memcpy_htod)(self.ptr, b.as_ptr().cast(), b.len()) };
        self.d.check("cuMemcpyHtoD", r)?;
        // SAFETY: no arguments; waits for the current context's work.
        self.d.check("cuCtxSynchronize", unsafe { (self.d.ctx_synchronize)() })
    }

    /// Copies the start of the buffer into `dst` (blocking).
    pub fn download<T: bytemuck::Pod>(&self, dst: &mut [T]) -> Result<(), CudaError> {
        let b: &mut [u8] = bytemuck::cast_slice_mut(dst);
        if b.len() > self.bytes {
            return Err(CudaError::Invalid(format!(
                "download of {} bytes from a {}-byte buffer",
                b.len(),
                self.bytes
            )));
        }
        // SAFETY: the host slice is valid for writes of its length, which fits in the buffer.
        self.d
            .check("cuMemcpyDtoH", unsafe { (self.d.memcpy_dtoh)(b.as_mut_ptr().cast(), self.ptr, b.len()) })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: the pointer came from cuMemAlloc and is freed once.
        let _ = unsafe { (self.d.mem_free)(self.ptr) };
    }
}

/// A non-blocking stream, destroyed on drop.
pub struct Stream {
    d: &'static Driver,
    pub h: Handle,
}

impl Stream {
    pub fn new(dev: &Device) -> Result<Stream, CudaError> {
        let mut h = std::ptr::null_mut();
        // SAFETY: writes one stream handle; flag 1 is CU_STREAM_NON_BLOCKING.
        dev.d.check("cuStreamCreate", unsafe { (dev.d.stream_create)(&mut h, 1) })?;
        Ok(Stream { d: dev.d, h })
    }

    /// The caller's stream `h` (any handle the driver takes, 0 included), never destroyed
    /// by this value.
    pub fn borrowed(dev: &Device, h: Handle) -> std::mem::ManuallyDrop<Stream> {
        std::mem::ManuallyDrop::new(Stream { d: dev.d, h })
    }

    pub fn sync(&self) -> Result<(), CudaError> {
        // SAFETY: a live stream.
        self.d.check("cuStreamSynchronize", unsafe { (self.d.stream_sync)(self.h) })
    }

    /// Enqueues a device-to-device copy.
    pub fn copy(&self, dst: CuDevicePtr, src: CuDevicePtr, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: the caller passes device pointers valid for `bytes` while the copy runs.
        self.d.check("cuMemcpyDtoDAsync", unsafe { (self.d.memcpy_dtod_async)(dst, src, bytes, self.h) })
    }

    /// Makes work enqueued later on this stream wait for `e`'s latest record.
    pub fn wait(&self, e: &Event) -> Result<(), CudaError> {
        self.wait_raw(e.h as usize)
    }

    /// Makes this stream wait for the event whose handle has value `e`, which the caller
    /// keeps alive until the wait is enqueued (another rank's event of this process, say).
    pub fn wait_raw(&self, e: usize) -> Result<(), CudaError> {
        // SAFETY: a live stream; the driver validates the handle, which the caller keeps alive.
        self.d.check("cuStreamWaitEvent", unsafe { (self.d.stream_wait_event)(self.h, e as Handle, 0) })
    }

    /// Copies `src` to device address `dst` in this stream's order, complete on return (the
    /// stream is synchronised; no other stream or rank is waited for).
    pub fn upload(&self, dst: CuDevicePtr, src: &[u8]) -> Result<(), CudaError> {
        if !src.is_empty() {
            // SAFETY: the caller passes a device range of `src.len()` writable bytes; `src`
            // stays borrowed until the stream is synchronised below.
            self.d.check("cuMemcpyHtoDAsync", unsafe {
                (self.d.memcpy_htod_async)(dst, src.as_ptr().cast(), src.len(), self.h)
            })?;
        }
        self.sync()
    }

    /// Copies device address `src` into `dst` in this stream's order, complete on return.
    pub fn download(&self, dst: &mut [u8], src: CuDevicePtr) -> Result<(), CudaError> {
        if !dst.is_empty() {
            // SAFETY: the caller passes a device range of `dst.len()` readable bytes; `dst`
            // stays borrowed until the stream is synchronised below.
            self.d.check("cuMemcpyDtoHAsync", unsafe {
                (self.d.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), src, dst.len(), self.h)
            })?;
        }
        self.sync()
    }

    /// Enqueues filling `bytes` at `dst` with `v`.
    pub fn fill(&self, dst: CuDevicePtr, v: u8, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: as for `copy`.
        self.d.check("cuMemsetD8Async", unsafe { (self.d.memset_d8_async)(dst, v, bytes, self.h) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: destroyed once.
        let _ = unsafe { (self.d.stream_destroy)(self.h) };
    }
}

/// A timing event, destroyed on drop.
pub struct Event {
    d: &'static Driver,
    pub h: Handle,
}

impl Event {
    pub fn new(dev: &Device) -> Result<Event, CudaError> {
        Self::with_flags(dev, 0)
    }

    /// An event for ordering only (CU_EVENT_DISABLE_TIMING: cheaper to record and wait on).
    pub fn sync_only(dev: &Device) -> Result<Event, CudaError> {
        Self::with_flags(dev, 2)
    }

    /// An event other processes may wait on (CU_EVENT_INTERPROCESS, without timing).
    pub fn interprocess(dev: &Device) -> Result<Event, CudaError> {
        Self::with_flags(dev, 2 | 4)
    }

    /// An event of another process, opened from its IPC handle; destroyed on drop.
    pub fn open_ipc(dev: &Device, h: driver::IpcHandle) -> Result<Event, CudaError> {
        let mut e = std::ptr::null_mut();
        // SAFETY: writes one event handle; the handle bytes came from cuIpcGetEventHandle.
        dev.d.check("cuIpcOpenEventHandle", unsafe { (dev.d.ipc_open_event_handle)(&mut e, h) })?;
        Ok(Event { d: dev.d, h: e })
    }

    /// This (interprocess) event's IPC handle.
    pub fn ipc_handle(&self) -> Result<driver::IpcHandle, CudaError> {
        let mut h = driver::IpcHandle([0; 64]);
        // SAFETY: a live event; writes 64 bytes.
        self.d.check("cuIpcGetEventHandle", unsafe { (self.d.ipc_get_event_handle)(&mut h, self.h) })?;
        Ok(h)
    }

    /// Records this event on the caller's stream, given by its handle's value.
    pub fn record_raw(&self, stream: usize) -> Result<(), CudaError> {
        // SAFETY: a live event; the driver validates the caller's stream handle.
        self.d.check("cuEventRecord", unsafe { (self.d.event_record)(self.h, stream as Handle) })
    }

    fn with_flags(dev: &Device, flags: u32) -> Result<Event, CudaError> {
        let mut h = std::ptr::null_mut();
        // SAFETY: writes one event handle.
        dev.d.check("cuEventCreate", unsafe { (dev.d.event_create)(&mut h, flags) })?;
        Ok(Event { d: dev.d, h })
    }

    pub fn record(&self, s: &Stream) -> Result<(), CudaError> {
        // SAFETY: live event and stream.
        self.d.check("cuEventRecord", unsafe { (self.d.event_record)(self.h, s.h) })
    }

    /// Milliseconds from `start` to this event (waits for this event).
    pub fn since(&self, start: &Event) -> Result<f32, CudaError> {
        // SAFETY: live event.
        self.d.check("cuEventSynchronize", unsafe { (self.d.event_sync)(self.h) })?;
        let mut ms = 0f32;
        // SAFETY: both events were recorded; writes one float.
        self.d.check("cuEventElapsedTime", unsafe { (self.d.event_elapsed)(&mut ms, start.h, self.h) })?;
        Ok(ms)
    }
}

// SAFETY: an event handle may be recorded, waited on and destroyed from any thread; the
// driver serialises what needs it.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: destroyed once.
        let _ = unsafe { (self.d.event_destroy)(self.h) };
    }
}

/// Launch parameters as the driver takes them: pointers to each argument's value.
pub(crate) fn arg<T>(v: &T) -> *mut c_void {
    (v as *const T).cast_mut().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (CI, this machine) every entry point is an error that says why; with
    /// one, a device that does not exist is refused by number. Never a panic.
    #[test]
    fn opening_a_device_without_cuda_is_an_error_naming_why() {
        match driver::driver() {
            Err(CudaError::NoCuda(why)) => {
                assert!(why.contains("libcuda.so.1"), "{why}");
                let e = Device::open(0).err().expect("no driver, no device");
                assert!(matches!(e, CudaError::NoCuda(_)), "{e}");
            }
            Err(e) => panic!("unexpected error kind: {e}"),
            Ok(d) => {
                let n = d.device_count().unwrap();
                let e = Device::open(n).err().expect("one past the last device");
                assert!(e.to_string().contains(&format!("device {n} does not exist")), "{e}");
            }
        }
        assert!(Device::open(-1).is_err());
    }
}
