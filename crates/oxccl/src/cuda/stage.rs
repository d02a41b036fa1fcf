//! Device memory seen from the host: what kind of memory a pointer is, and stream-ordered
//! copies between device memory and pinned host mirrors.
//!
//! This is how a call on device buffers runs over the host transports while the device
//! engine does not serve it (processes on one GPU, hosts over TCP): its inputs are copied
//! into host memory on the caller's stream (so after every earlier kernel on that stream),
//! the collective runs on the mirrors, and the outputs are copied back on the same stream (so
//! before every later kernel). The copies are only enqueued here; who waits for them, and
//! when, is the caller's choice (libnccl's `ops::staged`: inline, or on its proxy thread).

use super::driver::{self, ptr_attr, CuDevicePtr, Driver, Handle};
use super::CudaError;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// What a pointer addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Memory the CPU reads and writes directly: pageable, or pinned (`cuMemAllocHost`).
    Host,
    /// Device memory of device `ordinal`.
    Device { ordinal: i32 },
    /// Managed memory: the CPU may touch it once the stream's earlier work is done.
    Managed { ordinal: i32 },
}

/// What `p` addresses. Without a loaded driver every pointer is host memory (no device
/// pointer can exist in a process that never loaded CUDA).
pub fn classify(p: *const u8) -> MemKind {
    let Some(d) = driver::driver_if_loaded() else { return MemKind::Host };
    classify_with(d, p)
}

fn attr_u32(d: &Driver, a: i32, p: *const u8) -> Option<u32> {
    let mut v: u32 = 0;
    // SAFETY: these attributes are 32-bit values written into `v`; an address CUDA does not
    // know (ordinary host memory) is answered with an error, not a fault.
    let r = unsafe { (d.pointer_attr)((&mut v as *mut u32).cast::<c_void>(), a, p as CuDevicePtr) };
    (r == 0).then_some(v)
}

fn classify_with(d: &Driver, p: *const u8) -> MemKind {
    if p.is_null() {
        return MemKind::Host;
    }
    match attr_u32(d, ptr_attr::MEMORY_TYPE, p) {
        Some(ptr_attr::MEMORYTYPE_DEVICE) => {
            let ordinal = attr_u32(d, ptr_attr::DEVICE_ORDINAL, p).unwrap_or(0) as i32;
            if attr_u32(d, ptr_attr::IS_MANAGED, p) == Some(1) {
                MemKind::Managed { ordinal }
            } else {
                MemKind::Device { ordinal }
            }
        }
        _ => MemKind::Host,
    }
}

/// Each device's primary context, retained once for the life of the process (the one CUDA's
/// runtime, and so PyTorch, allocates in).
fn primary(d: &'static Driver, ordinal: i32) -> Result<usize, CudaError> {
    static CTX: OnceLock<Mutex<HashMap<i32, usize>>> = OnceLock::new();
    let mut m = CTX.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = m.get(&ordinal) {
        return Ok(*c);
    }
    let dev = d.device(ordinal)?;
    let mut ctx: Handle = std::ptr::null_mut();
    // SAFETY: writes one context handle; retained for the process's life.
    d.check("cuDevicePrimaryCtxRetain", unsafe { (d.primary_ctx_retain)(&mut ctx, dev) })?;
    m.insert(ordinal, ctx as usize);
    Ok(ctx as usize)
}

/// A device's primary context pushed on the calling thread until drop (the thread's own
/// current context, if any, is back afterwards).
pub struct OnDevice {
    d: &'static Driver,
}

impl OnDevice {
    pub fn push(ordinal: i32) -> Result<OnDevice, CudaError> {
        let d = driver::driver()?;
        let ctx = primary(d, ordinal)? as Handle;
        // SAFETY: a retained context; popped in drop.
        d.check("cuCtxPushCurrent", unsafe { (d.ctx_push)(ctx) })?;
        Ok(OnDevice { d })
    }

    /// Waits for the work on `stream`.
    pub fn sync(&self, stream: usize) -> Result<(), CudaError> {
        // SAFETY: the caller's stream handle (0, the legacy and per-thread handles included).
        self.d.check("cuStreamSynchronize", unsafe { (self.d.stream_sync)(stream as Handle) })
    }

    /// Enqueues a copy of `len` bytes from device address `src` to pinned `dst` on `stream`
    /// and returns at once.
    ///
    /// # Safety
    /// `dst` must stay valid and untouched for `len` bytes until the copy has completed on the
    /// stream (an [`StreamEvent`] recorded after it says when).
    pub unsafe fn download_async(
        &self,
        stream: usize,
        dst: *mut u8,
        src: CuDevicePtr,
        len: usize,
    ) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: per this function's contract.
        let r = unsafe { (self.d.memcpy_dtoh_async)(dst.cast(), src, len, stream as Handle) };
        self.d.check("cuMemcpyDtoHAsync", r)
    }

    /// Enqueues a copy of `len` bytes from pinned `src` to device address `dst` on `stream`
    /// and returns at once.
    ///
    /// # Safety
    /// `src` must stay valid for `len` bytes until the copy has completed on the stream.
    pub unsafe fn upload_async(
        &self,
        stream: usize,
        dst: CuDevicePtr,
        src: *const u8,
        len: usize,
    ) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: per this function's contract.
        let r = unsafe { (self.d.memcpy_htod_async)(dst, src.cast(), len, stream as Handle) };
        self.d.check("cuMemcpyHtoDAsync", r)
    }

    /// An event recorded on `stream` now: it completes once the work enqueued so far has.
    pub fn record(&self, stream: usize) -> Result<StreamEvent, CudaError> {
        let mut e: Handle = std::ptr::null_mut();
        // Waiters sleep on it rather than spin; it keeps no timestamps.
        const BLOCKING_SYNC_NO_TIMING: u32 = 0x1 | 0x2;
        // SAFETY: writes one event handle, owned by the returned value.
        self.d.check("cuEventCreate", unsafe { (self.d.event_create)(&mut e, BLOCKING_SYNC_NO_TIMING) })?;
        let ev = StreamEvent { d: self.d, e: e as usize };
        // SAFETY: a live event and the caller's stream (of this context).
        self.d.check("cuEventRecord", unsafe { (self.d.event_record)(e, stream as Handle) })?;
        Ok(ev)
    }

    /// Makes `stream` wait, at this point, until the 32-bit word at device address `addr`
    /// reaches `value` (cyclically: `(int32)(word - value) >= 0`): by a stream memory
    /// operation (`cuStreamWaitValue32`), or with `OXCCL_STREAM_WAIT=kernel` by a one-thread
    /// kernel that polls the word with sleeps (built by NVRTC at first use).
    pub fn wait_flag(
        &self,
        ordinal: i32,
        stream: usize,
        addr: CuDevicePtr,
        value: u32,
    ) -> Result<(), CudaError> {
        if !crate::env::device().stream_wait_kernel {
            const GEQ: u32 = 0;
            // SAFETY: `addr` is a mapped word that outlives every stream waiting on it (a
            // communicator's flag is never freed).
            let r = unsafe { (self.d.stream_wait_value32)(stream as Handle, addr, value, GEQ) };
            return self.d.check("cuStreamWaitValue32", r);
        }
        let f = wait_kernel(self.d, ordinal)? as Handle;
        let mut a = addr;
        let mut v = value;
        let mut params = [(&mut a as *mut u64).cast::<c_void>(), (&mut v as *mut u32).cast::<c_void>()];
        // SAFETY: the kernel takes (const volatile unsigned*, unsigned), matching `params`;
        // `addr` is a mapped word that is never freed.
        let r = unsafe {
            (self.d.launch_kernel)(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream as Handle,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.d.check("cuLaunchKernel (stream wait)", r)
    }
}

/// The stream-wait kernel's source (compiled by NVRTC at first use, per device).
pub const WAIT_SOURCE: &str = r#"
extern "C" __global__ void oxccl_wait_flag(const volatile unsigned int* flag, unsigned int value) {
  while ((int)(*flag - value) < 0) { __nanosleep(1000); }
}
"#;

/// The stream-wait kernel of device `ordinal` (whose primary context is current), compiled
/// and loaded once per process; a failure is remembered.
fn wait_kernel(d: &'static Driver, ordinal: i32) -> Result<usize, CudaError> {
    static K: OnceLock<Mutex<HashMap<i32, Result<usize, String>>>> = OnceLock::new();
    let mut m = K.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = m.get(&ordinal) {
        return r.clone().map_err(CudaError::Invalid);
    }
    let r = (|| {
        let dev = d.device(ordinal)?;
        let attr = |a: i32| d.attribute(dev, a);
        let arch = format!(
            "sm_{}{}",
            attr(driver::attr::COMPUTE_CAPABILITY_MAJOR)?,
            attr(driver::attr::COMPUTE_CAPABILITY_MINOR)?
        );
        let bin = super::nvrtc::compile(WAIT_SOURCE, "oxccl_wait.cu", &arch, &[])?;
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: a CUBIN image for this device; the module lives for the process.
        d.check("cuModuleLoadData", unsafe { (d.module_load_data)(&mut module, bin.as_ptr().cast()) })?;
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name it defines.
        d.check("cuModuleGetFunction", unsafe {
            (d.module_get_function)(&mut f, module, c"oxccl_wait_flag".as_ptr())
        })?;
        Ok::<usize, CudaError>(f as usize)
    })();
    let r = r.map_err(|e| format!("the stream-wait kernel: {e}"));
    m.insert(ordinal, r.clone());
    r.map_err(CudaError::Invalid)
}

/// An event recorded on a stream (see [`OnDevice::record`]); destroyed on drop.
pub struct StreamEvent {
    d: &'static Driver,
    e: usize,
}

impl StreamEvent {
    /// Waits (sleeping) until the work before the event has completed.
    pub fn wait(&self) -> Result<(), CudaError> {
        // SAFETY: a live event; cuEventSynchronize needs no current context.
        self.d.check("cuEventSynchronize", unsafe { (self.d.event_sync)(self.e as Handle) })
    }
}

impl Drop for StreamEvent {
    fn drop(&mut self) {
        // SAFETY: created by `record`, destroyed once (pending work keeps what it needs).
        let _ = unsafe { (self.d.event_destroy)(self.e as Handle) };
    }
}

/// A pinned 32-bit word for streams to wait on, never freed: `(host address, device
/// address)`. The host stores to it; streams read it through [`OnDevice::wait_value`].
pub fn stream_flag() -> Result<(usize, CuDevicePtr), CudaError> {
    let d = driver::driver()?;
    let mut f = Pinned::take(64)?;
    let host = f.as_mut_ptr();
    // SAFETY: 64 writable bytes; the word starts at 0.
    unsafe { host.cast::<u32>().write_volatile(0) };
    std::mem::forget(f);
    let mut dev: CuDevicePtr = 0;
    let on = OnDevice::push(0)?;
    // SAFETY: `host` is cuMemAllocHost memory (mapped); writes one device address.
    let r = unsafe { (d.mem_host_get_device_pointer)(&mut dev, host.cast(), 0) };
    drop(on);
    d.check("cuMemHostGetDevicePointer", r)?;
    Ok((host as usize, dev))
}

impl Drop for OnDevice {
    fn drop(&mut self) {
        let mut old: Handle = std::ptr::null_mut();
        // SAFETY: pops the context `push` pushed on this thread.
        let _ = unsafe { (self.d.ctx_pop)(&mut old) };
    }
}

/// Pinned host memory (`cuMemAllocHost`), kept in a pool for reuse: device copies from and
/// to it run at full DMA speed and need no bounce through the driver's own staging.
pub struct Pinned {
    ptr: usize,
    cap: usize,
    len: usize,
}

fn pool() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    static P: OnceLock<Mutex<Vec<(usize, usize)>>> = OnceLock::new();
    P.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// Buffers the pool keeps; more are freed by the next `take`.
const POOL_KEEP: usize = 64;

impl Pinned {
    /// `len` bytes from the pool (the smallest buffer that fits), if it has one; calls no
    /// CUDA function.
    pub fn pooled(len: usize) -> Option<Pinned> {
        let len1 = len.max(1);
        let mut p = pool();
        let best =
            p.iter().enumerate().filter(|(_, b)| b.1 >= len1).min_by_key(|(_, b)| b.1).map(|(i, _)| i)?;
        let (ptr, cap) = p.swap_remove(best);
        Some(Pinned { ptr, cap, len })
    }

    /// `len` bytes of pinned memory (the smallest pooled buffer that fits, else a new one,
    /// after trimming the pool). A new allocation and the trim wait for the whole context.
    pub fn take(len: usize) -> Result<Pinned, CudaError> {
        if let Some(p) = Pinned::pooled(len) {
            return Ok(p);
        }
        trim();
        let len1 = len.max(1);
        let d = driver::driver()?;
        // Round up so a slightly larger call later reuses it.
        let cap = len1.next_power_of_two().max(4096);
        let mut p: *mut c_void = std::ptr::null_mut();
        // cuMemAllocHost needs a current context: any device's primary context serves (the
        // memory is portable under unified addressing).
        let on = OnDevice::push(0)?;
        // SAFETY: writes one host pointer.
        let r = unsafe { (d.mem_alloc_host)(&mut p, cap) };
        drop(on);
        d.check("cuMemAllocHost", r)?;
        Ok(Pinned { ptr: p as usize, cap, len })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `cap >= len` bytes of pinned memory owned by this value.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr as *mut u8
    }
}

impl Drop for Pinned {
    /// Back to the pool, never freed here: `cuMemFreeHost` waits for the whole context, and
    /// a drop on the proxy thread would then wait for streams that wait for that very thread.
    fn drop(&mut self) {
        pool().push((self.ptr, self.cap));
    }
}

/// Frees pooled buffers beyond [`POOL_KEEP`], smallest first. Called from `take`, on the
/// thread that makes calls (where waiting for the context only stalls it).
fn trim() {
    let extra: Vec<(usize, usize)> = {
        let mut p = pool();
        if p.len() <= POOL_KEEP {
            return;
        }
        p.sort_by_key(|b| std::cmp::Reverse(b.1));
        p.split_off(POOL_KEEP)
    };
    if let Ok(d) = driver::driver() {
        for (ptr, _) in extra {
            // SAFETY: from cuMemAllocHost, pooled (so no longer in use), freed once.
            let _ = unsafe { (d.mem_free_host)(ptr as *mut c_void) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host memory is host memory whether or not CUDA is here; without CUDA nothing is
    /// classified as a device pointer.
    #[test]
    fn host_memory_is_classified_as_host() {
        let v: Vec<u8> = (0..64).collect();
        assert_eq!(classify(v.as_ptr()), MemKind::Host);
        assert_eq!(classify(std::ptr::null()), MemKind::Host);
        let on_stack = [0u8; 8];
        assert_eq!(classify(on_stack.as_ptr()), MemKind::Host);
    }
}
