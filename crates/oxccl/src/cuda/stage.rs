//! Device memory seen from the host: what kind of memory a pointer is, and stream-ordered
//! copies between device memory and pinned host mirrors.
//!
//! This is how a call on device buffers runs over the host transports while the device
//! engine does not serve it (processes on one GPU, hosts over TCP): its inputs are copied
//! into host memory on the caller's stream (so after every earlier kernel on that stream),
//! the collective runs on the mirrors, and the outputs are copied back on the same stream (so
//! before every later kernel). The calling thread waits for both copies.

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
    let mut dev = 0;
    // SAFETY: writes one device handle.
    d.check("cuDeviceGet", unsafe { (d.device_get)(&mut dev, ordinal) })?;
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

    /// Copies `dst.len()` bytes from device address `src` into `dst`, ordered after the work
    /// already on `stream`, and waits for it.
    pub fn download(&self, stream: usize, dst: &mut [u8], src: CuDevicePtr) -> Result<(), CudaError> {
        if dst.is_empty() {
            return Ok(());
        }
        let s = stream as Handle;
        // SAFETY: `dst` is writable for its length and outlives the copy (waited for below);
        // the caller passes a device range of that length.
        let r = unsafe { (self.d.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), src, dst.len(), s) };
        self.d.check("cuMemcpyDtoHAsync", r)?;
        self.sync(stream)
    }

    /// Copies `src` to device address `dst`, ordered after the work already on `stream` and
    /// before any later, and waits for it (so `src` may be reused on return).
    pub fn upload(&self, stream: usize, dst: CuDevicePtr, src: &[u8]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        let s = stream as Handle;
        // SAFETY: `src` is readable for its length and outlives the copy (waited for below).
        let r = unsafe { (self.d.memcpy_htod_async)(dst, src.as_ptr().cast(), src.len(), s) };
        self.d.check("cuMemcpyHtoDAsync", r)?;
        self.sync(stream)
    }

    /// Waits for the work on `stream`.
    pub fn sync(&self, stream: usize) -> Result<(), CudaError> {
        // SAFETY: the caller's stream handle (0, the legacy and per-thread handles included).
        self.d.check("cuStreamSynchronize", unsafe { (self.d.stream_sync)(stream as Handle) })
    }
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

/// Buffers the pool keeps; more are freed on return.
const POOL_KEEP: usize = 16;

impl Pinned {
    /// `len` bytes of pinned memory (the smallest pooled buffer that fits, else a new one).
    pub fn take(len: usize) -> Result<Pinned, CudaError> {
        let len1 = len.max(1);
        {
            let mut p = pool();
            let best =
                p.iter().enumerate().filter(|(_, b)| b.1 >= len1).min_by_key(|(_, b)| b.1).map(|(i, _)| i);
            if let Some(i) = best {
                let (ptr, cap) = p.swap_remove(i);
                return Ok(Pinned { ptr, cap, len });
            }
        }
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
    fn drop(&mut self) {
        let mut p = pool();
        if p.len() < POOL_KEEP {
            p.push((self.ptr, self.cap));
            return;
        }
        drop(p);
        if let Ok(d) = driver::driver() {
            // SAFETY: from cuMemAllocHost, freed once.
            let _ = unsafe { (d.mem_free_host)(self.ptr as *mut c_void) };
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
