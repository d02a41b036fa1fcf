//! NVRTC, loaded at run time: CUDA C source to a CUBIN for one architecture.
//!
//! Where from: `OXCCL_NVRTC` (a file path) if set, else `libnvrtc.so.13`, `.12` or `libnvrtc.so`
//! by the loader's search path, else the same names under `/usr/local/cuda/lib64`.

use super::CudaError;
use crate::sys::dl::Lib;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

type Prog = *mut c_void;

struct Api {
    lib: Lib,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    cubin_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Prog) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// The names tried, in order.
pub fn candidates() -> Vec<String> {
    let mut v = Vec::new();
    if let Some(p) = &crate::env::device().nvrtc {
        v.push(p.clone());
    }
    for n in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
        v.push(n.to_string());
    }
    for n in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
        v.push(format!("/usr/local/cuda/lib64/{n}"));
    }
    v
}

fn api() -> Result<&'static Api, CudaError> {
    API.get_or_init(|| {
        let lib = Lib::open(&candidates()).map_err(|e| format!("no NVRTC library ({e})"))?;
        // SAFETY: each type is the prototype nvrtc.h declares for the name.
        unsafe {
            Ok(Api {
                version: lib.sym(c"nvrtcVersion")?,
                create: lib.sym(c"nvrtcCreateProgram")?,
                compile: lib.sym(c"nvrtcCompileProgram")?,
                log_size: lib.sym(c"nvrtcGetProgramLogSize")?,
                log: lib.sym(c"nvrtcGetProgramLog")?,
                cubin_size: lib.sym(c"nvrtcGetCUBINSize")?,
                cubin: lib.sym(c"nvrtcGetCUBIN")?,
                destroy: lib.sym(c"nvrtcDestroyProgram")?,
                error_string: lib.sym(c"nvrtcGetErrorString")?,
                lib,
            })
        }
    })
    .as_ref()
    .map_err(|e| CudaError::Nvrtc(e.clone()))
}

/// The loaded NVRTC's path and version, e.g. `("libnvrtc.so.13", (13, 0))`.
pub fn version() -> Result<(String, (i32, i32)), CudaError> {
    let a = api()?;
    let (mut ma, mut mi) = (0, 0);
    // SAFETY: writes two ints.
    unsafe { (a.version)(&mut ma, &mut mi) };
    Ok((a.lib.name.clone(), (ma, mi)))
}

fn why(a: &Api, r: c_int) -> String {
    // SAFETY: returns a static NUL-terminated string for any code.
    let p = unsafe { (a.error_string)(r) };
    if p.is_null() {
        return format!("error {r}");
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Compiles `src` (named `name` in messages) for `arch` (e.g. `sm_90`) with `defines`
/// (`-D` options); the CUBIN, or NVRTC's log.
pub fn compile(src: &str, name: &str, arch: &str, defines: &[String]) -> Result<Vec<u8>, CudaError> {
    let a = api()?;
    let bad = |what: &str| CudaError::Invalid(format!("NVRTC {what} contains a NUL byte"));
    let csrc = CString::new(src).map_err(|_| bad("source"))?;
    let cname = CString::new(name).map_err(|_| bad("name"))?;
    let mut opts =
        vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "-default-device".to_string()];
    opts.extend(defines.iter().map(|d| format!("-D{d}")));
    let copts: Vec<CString> =
        opts.iter().map(|o| CString::new(o.as_str())).collect::<Result<_, _>>().map_err(|_| bad("option"))?;
    let optp: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let mut prog: Prog = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings that outlive the call; no headers.
    let r = unsafe {
        (a.create)(&mut prog, csrc.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null())
    };
    if r != 0 {
        return Err(CudaError::Nvrtc(format!("creating program {name}: {}", why(a, r))));
    }
    // SAFETY: a live program and option strings that outlive the call.
    let r = unsafe { (a.compile)(prog, optp.len() as c_int, optp.as_ptr()) };
    let out = if r != 0 {
        let mut n = 0usize;
        // SAFETY: the program is live; the log buffer has the size NVRTC reported.
        let log = unsafe {
            (a.log_size)(prog, &mut n);
            let mut buf = vec![0u8; n.max(1)];
            (a.log)(prog, buf.as_mut_ptr().cast());
            String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().to_string()
        };
        Err(CudaError::Nvrtc(format!(
            "compiling {name} for {arch} ({}): {}: {log}",
            opts.join(" "),
            why(a, r)
        )))
    } else {
        let mut n = 0usize;
        // SAFETY: as above, for the CUBIN.
        unsafe {
            (a.cubin_size)(prog, &mut n);
            let mut buf = vec![0u8; n];
            let r = (a.cubin)(prog, buf.as_mut_ptr().cast());
            if r != 0 || n == 0 {
                Err(CudaError::Nvrtc(format!("no CUBIN for {name}: {}", why(a, r))))
            } else {
                Ok(buf)
            }
        }
    };
    // SAFETY: destroyed once.
    unsafe { (a.destroy)(&mut prog) };
    out
}
