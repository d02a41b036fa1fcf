//! CUDA IPC: device memory of one process mapped into another (same GPU, or a peer GPU).
//!
//! A buffer is exported as its allocation's handle and its offset in that allocation
//! (`cuMemGetAddressRange`, `cuIpcGetMemHandle`, remembered by the driver's buffer id); the importer opens each allocation once
//! (`cuIpcOpenMemHandle` with lazy peer access) and keeps the mapping for the life of the
//! process, keyed by the handle's bytes (a new allocation at a reused address has new bytes,
//! so a stale mapping is never used for it). Memory from the virtual memory API
//! (`cuMemCreate`) has no legacy IPC handle: exporting it fails and the caller stages instead.

use super::driver::{self, CuDevicePtr, IpcHandle};
use super::CudaError;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A buffer as another process can open it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exported {
    pub handle: IpcHandle,
    /// Bytes from the allocation's start to the buffer's.
    pub offset: u64,
}

/// Allocations exported so far, by the driver's buffer id (unique for the life of the
/// process, never reused, so a freed allocation's entry is never taken for a new one):
/// `(base address, handle)`. `cuIpcGetMemHandle` costs far more than the id lookup.
fn exports() -> std::sync::MutexGuard<'static, HashMap<u64, (CuDevicePtr, IpcHandle)>> {
    static E: OnceLock<Mutex<HashMap<u64, (CuDevicePtr, IpcHandle)>>> = OnceLock::new();
    E.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// Entries [`exports`] keeps before it starts afresh.
const EXPORTS_KEEP: usize = 4096;

/// Exports the device buffer at `ptr` (a context of its device current).
pub fn export(ptr: CuDevicePtr) -> Result<Exported, CudaError> {
    let d = driver::driver()?;
    const BUFFER_ID: i32 = 7;
    let mut id = 0u64;
    // SAFETY: CU_POINTER_ATTRIBUTE_BUFFER_ID is a 64-bit value written into `id`.
    d.check("cuPointerGetAttribute", unsafe {
        (d.pointer_attr)((&mut id as *mut u64).cast(), BUFFER_ID, ptr)
    })?;
    if let Some(&(base, handle)) = exports().get(&id) {
        return Ok(Exported { handle, offset: ptr - base });
    }
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: writes the base and size of the allocation holding `ptr`.
    d.check("cuMemGetAddressRange", unsafe { (d.mem_get_address_range)(&mut base, &mut size, ptr) })?;
    let mut handle = IpcHandle([0; 64]);
    // SAFETY: `base` starts a cuMemAlloc allocation (else the driver refuses); writes 64 bytes.
    d.check("cuIpcGetMemHandle", unsafe { (d.ipc_get_mem_handle)(&mut handle, base) })?;
    let mut e = exports();
    if e.len() >= EXPORTS_KEEP {
        e.clear();
    }
    e.insert(id, (base, handle));
    Ok(Exported { handle, offset: ptr - base })
}

fn mappings() -> std::sync::MutexGuard<'static, HashMap<(i32, IpcHandle), CuDevicePtr>> {
    static M: OnceLock<Mutex<HashMap<(i32, IpcHandle), CuDevicePtr>>> = OnceLock::new();
    M.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The address, in this process on device `ordinal` (its context current), of another
/// process's exported buffer; the allocation is opened at first use and kept.
pub fn open(ordinal: i32, e: &Exported) -> Result<CuDevicePtr, CudaError> {
    if let Some(&base) = mappings().get(&(ordinal, e.handle)) {
        return Ok(base + e.offset);
    }
    let d = driver::driver()?;
    let mut base = 0u64;
    const LAZY_ENABLE_PEER_ACCESS: u32 = 1;
    // SAFETY: writes one device address; the handle came from cuIpcGetMemHandle elsewhere.
    d.check("cuIpcOpenMemHandle", unsafe {
        (d.ipc_open_mem_handle)(&mut base, e.handle, LAZY_ENABLE_PEER_ACCESS)
    })?;
    mappings().insert((ordinal, e.handle), base);
    Ok(base + e.offset)
}
