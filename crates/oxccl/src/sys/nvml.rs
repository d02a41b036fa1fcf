//! NVML, loaded at run time (`libnvidia-ml.so.1`): the GPUs of this host, their PCI addresses
//! and NVLinks. The build never needs NVML and the CPU path never loads it; without the
//! library (or without a driver) there are simply no GPUs.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// One GPU as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    /// PCI address, lower case, `dddd:bb:dd.f`.
    pub bus_id: String,
    /// Active NVLinks: the PCI address of the other end of each (a GPU or an NVSwitch).
    pub nvlinks: Vec<String>,
}

/// `nvmlPciInfo_t` (v3 layout).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

type Device = *mut c_void;

/// The NVLink ports NVML numbers (NVML_NVLINK_MAX_LINKS).
const MAX_LINKS: c_uint = 18;

fn sym<T>(lib: *mut c_void, name: &CStr) -> Option<T> {
    // SAFETY: `lib` is a handle from dlopen; dlsym only reads the NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: callers name `T` as the C function pointer type NVML documents for `name`, and
    // function pointers have the size of a data pointer on every target we build.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn normalize(bus: &[c_char]) -> String {
    let bytes: Vec<u8> = bus.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    let s = String::from_utf8_lossy(&bytes).to_lowercase();
    // NVML writes an 8-digit domain (`00000000:18:00.0`); sysfs uses 4.
    match s.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => s,
    }
}

/// The GPUs NVML sees, or none when NVML or the driver is absent.
pub fn gpus() -> Vec<GpuInfo> {
    // SAFETY: dlopen takes a NUL-terminated name; a null result is handled.
    let lib = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Vec::new();
    }
    type Init = unsafe extern "C" fn() -> c_int;
    type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
    type ByIndex = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
    type Name = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
    type Pci = unsafe extern "C" fn(Device, *mut PciInfo) -> c_int;
    type LinkState = unsafe extern "C" fn(Device, c_uint, *mut c_int) -> c_int;
    type Remote = unsafe extern "C" fn(Device, c_uint, *mut PciInfo) -> c_int;
    let (Some(init), Some(count), Some(by_index), Some(name), Some(pci)) = (
        sym::<Init>(lib, c"nvmlInit_v2"),
        sym::<Count>(lib, c"nvmlDeviceGetCount_v2"),
        sym::<ByIndex>(lib, c"nvmlDeviceGetHandleByIndex_v2"),
        sym::<Name>(lib, c"nvmlDeviceGetName"),
        sym::<Pci>(lib, c"nvmlDeviceGetPciInfo_v3"),
    ) else {
        return Vec::new();
    };
    let state = sym::<LinkState>(lib, c"nvmlDeviceGetNvLinkState");
    let remote = sym::<Remote>(lib, c"nvmlDeviceGetNvLinkRemotePciInfo_v2");
    let mut out = Vec::new();
    // SAFETY: every call below is an NVML entry point with the signature declared above; all
    // out-pointers point to live locals of the documented types and sizes.
    unsafe {
        if init() != 0 {
            return out;
        }
        let mut n: c_uint = 0;
        if count(&mut n) != 0 {
            return out;
        }
        for i in 0..n.min(64) {
            let mut dev: Device = std::ptr::null_mut();
            if by_index(i, &mut dev) != 0 {
                continue;
            }
            let mut buf = [0 as c_char; 96];
            let nm = if name(dev, buf.as_mut_ptr(), buf.len() as c_uint) == 0 {
                CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
            } else {
                "GPU".into()
            };
            let mut info: PciInfo = std::mem::zeroed();
            if pci(dev, &mut info) != 0 {
                continue;
            }
            let mut links = Vec::new();
            if let (Some(state), Some(remote)) = (state, remote) {
                for l in 0..MAX_LINKS {
                    let mut active: c_int = 0;
                    if state(dev, l, &mut active) != 0 || active == 0 {
                        continue;
                    }
                    let mut r: PciInfo = std::mem::zeroed();
                    if remote(dev, l, &mut r) == 0 {
                        links.push(normalize(&r.bus_id));
                    }
                }
            }
            out.push(GpuInfo { index: i, name: nm, bus_id: normalize(&info.bus_id), nvlinks: links });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_take_sysfs_form() {
        let raw: Vec<c_char> = b"00000000:1B:00.0\0".iter().map(|&b| b as c_char).collect();
        assert_eq!(normalize(&raw), "0000:1b:00.0");
        // Without NVML (as on CI machines) there are no GPUs, and nothing fails.
        let g = gpus();
        assert!(g.iter().all(|x| !x.bus_id.is_empty()));
    }
}
