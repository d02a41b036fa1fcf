//! The CUDA driver API, loaded at run time from `libcuda.so.1`: only what oxccl calls, each
//! call checked and turned into a [`CudaError`] that names the call and CUDA's reason.

use super::CudaError;
use crate::sys::dl::Lib;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

pub type CuResult = c_int;
pub type CuDevice = c_int;
pub type CuDevicePtr = u64;
pub type Handle = *mut c_void;

/// `CUipcMemHandle` / `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpcHandle(pub [u8; 64]);

/// `CU_DEVICE_ATTRIBUTE_*` values from cuda.h.
pub mod attr {
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
}

macro_rules! driver_table {
    ($( $field:ident : fn($($arg:ty),*) = [$($name:literal),+] ;)*) => {
        /// The driver entry points oxccl uses.
        #[allow(non_snake_case)]
        pub struct Driver {
            lib: Lib,
            $( pub(crate) $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
        }

        impl Driver {
            fn load_from(lib: Lib) -> Result<Driver, String> {
                $(
                    let $field = [$($name),+]
                        .iter()
                        .find_map(|n| {
                            // SAFETY: each type is the prototype cuda.h declares for these names.
                            unsafe { lib.sym::<unsafe extern "C" fn($($arg),*) -> CuResult>(n).ok() }
                        })
                        .ok_or_else(|| format!("{} lacks {}", lib.name, [$($name),+][0].to_string_lossy()))?;
                )*
                Ok(Driver { lib, $($field,)* })
            }
        }
    };
}

driver_table! {
    init: fn(c_uint) = [c"cuInit"];
    driver_version: fn(*mut c_int) = [c"cuDriverGetVersion"];
    device_count: fn(*mut c_int) = [c"cuDeviceGetCount"];
    device_get: fn(*mut CuDevice, c_int) = [c"cuDeviceGet"];
    device_attr: fn(*mut c_int, c_int, CuDevice) = [c"cuDeviceGetAttribute"];
    device_name: fn(*mut c_char, c_int, CuDevice) = [c"cuDeviceGetName"];
    primary_ctx_retain: fn(*mut Handle, CuDevice) = [c"cuDevicePrimaryCtxRetain"];
    ctx_set_current: fn(Handle) = [c"cuCtxSetCurrent"];
    ctx_get_current: fn(*mut Handle) = [c"cuCtxGetCurrent"];
    ctx_get_device: fn(*mut CuDevice) = [c"cuCtxGetDevice"];
    ctx_enable_peer_access: fn(Handle, c_uint) = [c"cuCtxEnablePeerAccess"];
    device_can_access_peer: fn(*mut c_int, CuDevice, CuDevice) = [c"cuDeviceCanAccessPeer"];
    ctx_synchronize: fn() = [c"cuCtxSynchronize"];
    mem_alloc: fn(*mut CuDevicePtr, usize) = [c"cuMemAlloc_v2"];
    mem_free: fn(CuDevicePtr) = [c"cuMemFree_v2"];
    memcpy_htod: fn(CuDevicePtr, *const c_void, usize) = [c"cuMemcpyHtoD_v2"];
    memcpy_dtoh: fn(*mut c_void, CuDevicePtr, usize) = [c"cuMemcpyDtoH_v2"];
    memcpy_dtod_async: fn(CuDevicePtr, CuDevicePtr, usize, Handle) = [c"cuMemcpyDtoDAsync_v2"];
    memset_d8_async: fn(CuDevicePtr, u8, usize, Handle) = [c"cuMemsetD8Async"];
    stream_create: fn(*mut Handle, c_uint) = [c"cuStreamCreate"];
    stream_sync: fn(Handle) = [c"cuStreamSynchronize"];
    stream_destroy: fn(Handle) = [c"cuStreamDestroy_v2"];
    stream_wait_event: fn(Handle, Handle, c_uint) = [c"cuStreamWaitEvent"];
    event_create: fn(*mut Handle, c_uint) = [c"cuEventCreate"];
    event_record: fn(Handle, Handle) = [c"cuEventRecord"];
    event_sync: fn(Handle) = [c"cuEventSynchronize"];
    event_elapsed: fn(*mut f32, Handle, Handle) = [c"cuEventElapsedTime_v2", c"cuEventElapsedTime"];
    event_destroy: fn(Handle) = [c"cuEventDestroy_v2"];
    module_load_data: fn(*mut Handle, *const c_void) = [c"cuModuleLoadData"];
    module_get_function: fn(*mut Handle, Handle, *const c_char) = [c"cuModuleGetFunction"];
    launch_kernel: fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void) = [c"cuLaunchKernel"];
    error_string: fn(CuResult, *mut *const c_char) = [c"cuGetErrorString"];
    pointer_attr: fn(*mut c_void, c_int, CuDevicePtr) = [c"cuPointerGetAttribute"];
    ctx_push: fn(Handle) = [c"cuCtxPushCurrent_v2"];
    ctx_pop: fn(*mut Handle) = [c"cuCtxPopCurrent_v2"];
    memcpy_dtoh_async: fn(*mut c_void, CuDevicePtr, usize, Handle) = [c"cuMemcpyDtoHAsync_v2"];
    memcpy_htod_async: fn(CuDevicePtr, *const c_void, usize, Handle) = [c"cuMemcpyHtoDAsync_v2"];
    mem_alloc_host: fn(*mut *mut c_void, usize) = [c"cuMemAllocHost_v2"];
    mem_free_host: fn(*mut c_void) = [c"cuMemFreeHost"];
    stream_wait_value32: fn(Handle, CuDevicePtr, u32, c_uint) = [c"cuStreamWaitValue32_v2", c"cuStreamWaitValue32"];
    mem_host_get_device_pointer: fn(*mut CuDevicePtr, *mut c_void, c_uint) = [c"cuMemHostGetDevicePointer_v2"];
    occupancy_blocks: fn(*mut c_int, Handle, c_int, usize) = [c"cuOccupancyMaxActiveBlocksPerMultiprocessor"];
    mem_get_address_range: fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) = [c"cuMemGetAddressRange_v2"];
    ipc_get_mem_handle: fn(*mut IpcHandle, CuDevicePtr) = [c"cuIpcGetMemHandle"];
    ipc_open_mem_handle: fn(*mut CuDevicePtr, IpcHandle, c_uint) = [c"cuIpcOpenMemHandle_v2", c"cuIpcOpenMemHandle"];
    ipc_get_event_handle: fn(*mut IpcHandle, Handle) = [c"cuIpcGetEventHandle"];
    ipc_open_event_handle: fn(*mut Handle, IpcHandle) = [c"cuIpcOpenEventHandle"];
    stream_is_capturing: fn(Handle, *mut c_int) = [c"cuStreamIsCapturing"];
    thread_exchange_capture_mode: fn(*mut c_int) = [c"cuThreadExchangeStreamCaptureMode"];
    stream_begin_capture: fn(Handle, c_int) = [c"cuStreamBeginCapture_v2"];
    stream_end_capture: fn(Handle, *mut Handle) = [c"cuStreamEndCapture"];
    graph_instantiate: fn(*mut Handle, Handle, u64) = [c"cuGraphInstantiateWithFlags"];
    graph_launch: fn(Handle, Handle) = [c"cuGraphLaunch"];
    graph_exec_destroy: fn(Handle) = [c"cuGraphExecDestroy"];
    graph_destroy: fn(Handle) = [c"cuGraphDestroy"];
}

/// `CU_POINTER_ATTRIBUTE_*` and `CU_MEMORYTYPE_*` values from cuda.h.
pub mod ptr_attr {
    pub const MEMORY_TYPE: i32 = 2;
    pub const IS_MANAGED: i32 = 8;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const MEMORYTYPE_HOST: u32 = 1;
    pub const MEMORYTYPE_DEVICE: u32 = 2;
}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

/// The driver, loaded and initialised once per process; an error (no library, a missing
/// symbol, `cuInit` failing, e.g. no GPU or no driver) says which and why.
pub fn driver() -> Result<&'static Driver, CudaError> {
    DRIVER
        .get_or_init(|| {
            let lib = Lib::open(&["libcuda.so.1".into(), "libcuda.so".into()])
                .map_err(|e| format!("no CUDA driver library (libcuda.so.1): {e}"))?;
            let d = Driver::load_from(lib)?;
            // SAFETY: cuInit takes flags 0; it may be called more than once.
            let r = unsafe { (d.init)(0) };
            if r != 0 {
                return Err(format!("cuInit failed: {} (CUDA error {r})", d.describe(r)));
            }
            Ok(d)
        })
        .as_ref()
        .map_err(|e| CudaError::NoCuda(e.clone()))
}

/// The driver, only if this process has already loaded `libcuda.so.1` (or `libcuda.so`)
/// for its own use: before that no device pointer can exist in it, so a program that never
/// touches CUDA never has the driver loaded and initialised by oxccl.
///
/// Asked on every call of the C ABI: until the driver is found, the answer is re-checked
/// (a `dlopen(RTLD_NOLOAD)` that searches the library path: ~30 failed `openat`s, ~60 µs)
/// only when the process has loaded some object since the last check (`dl_iterate_phdr`'s
/// load counter, ~15 ns).
pub fn driver_if_loaded() -> Option<&'static Driver> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    /// The load counter at the last check that found no driver (0: none yet).
    static CHECKED_AT: AtomicU64 = AtomicU64::new(0);
    if !SEEN.load(Ordering::Acquire) {
        // Read before the check: an object loaded during it makes the next call check again.
        let adds = crate::sys::dl::loads();
        if adds != 0 && CHECKED_AT.load(Ordering::Acquire) == adds {
            return None;
        }
        let loaded = crate::sys::dl::is_loaded(&[c"libcuda.so.1", c"libcuda.so"]);
        if !loaded {
            CHECKED_AT.store(adds, Ordering::Release);
            return None;
        }
        SEEN.store(true, Ordering::Release);
    }
    driver().ok()
}

impl Driver {
    /// CUDA's name for error `r`.
    pub fn describe(&self, r: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string (or fails).
        if unsafe { (self.error_string)(r, &mut p) } != 0 || p.is_null() {
            return format!("unknown error {r}");
        }
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `r` as a result for `op`.
    pub fn check(&self, op: &'static str, r: CuResult) -> Result<(), CudaError> {
        if r == 0 {
            Ok(())
        } else {
            Err(CudaError::Call { op, code: r, reason: self.describe(r) })
        }
    }

    /// The library the driver came from.
    pub fn library(&self) -> &str {
        &self.lib.name
    }

    /// The driver's CUDA version (e.g. 13000).
    pub fn version(&self) -> Result<i32, CudaError> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("cuDriverGetVersion", unsafe { (self.driver_version)(&mut v) })?;
        Ok(v)
    }

    /// The handle of device `ordinal`.
    pub fn device(&self, ordinal: i32) -> Result<CuDevice, CudaError> {
        let mut dev = 0;
        // SAFETY: writes one device handle.
        self.check("cuDeviceGet", unsafe { (self.device_get)(&mut dev, ordinal) })?;
        Ok(dev)
    }

    /// Attribute `a` (one of [`attr`]'s) of device `dev`.
    pub fn attribute(&self, dev: CuDevice, a: i32) -> Result<i32, CudaError> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("cuDeviceGetAttribute", unsafe { (self.device_attr)(&mut v, a, dev) })?;
        Ok(v)
    }

    /// How many devices the driver sees.
    pub fn device_count(&self) -> Result<i32, CudaError> {
        let mut n = 0;
        // SAFETY: writes one int.
        self.check("cuDeviceGetCount", unsafe { (self.device_count)(&mut n) })?;
        Ok(n)
    }
}
