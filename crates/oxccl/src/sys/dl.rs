//! Libraries loaded at run time: the first of several names that `dlopen` finds, and typed
//! symbols from it. A missing library or symbol is an error value, never a panic.

use std::ffi::{c_void, CStr, CString};

/// A library handle from `dlopen`, kept open for the life of the process.
pub(crate) struct Lib {
    handle: *mut c_void,
    /// The name it was found under.
    pub(crate) name: String,
}

// SAFETY: a dlopen handle may be used from any thread (dlsym is thread-safe).
unsafe impl Send for Lib {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for Lib {}

impl Lib {
    /// Opens the first of `names` that loads; the error lists what was tried and why each failed.
    pub(crate) fn open(names: &[String]) -> Result<Lib, String> {
        let mut tried = Vec::new();
        for n in names {
            let Ok(c) = CString::new(n.as_str()) else { continue };
            // SAFETY: dlopen takes a NUL-terminated name; a null result is handled below.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                return Ok(Lib { handle, name: n.clone() });
            }
            // SAFETY: dlerror returns null or a NUL-terminated string valid until the next call.
            let why = unsafe {
                let e = libc::dlerror();
                if e.is_null() {
                    "not found".to_string()
                } else {
                    CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            tried.push(why);
        }
        Err(tried.join("; "))
    }

    /// The symbol `name` as a function pointer of type `T`.
    ///
    /// # Safety
    /// `T` must be the `extern "C"` function pointer type the library defines for `name`.
    pub(crate) unsafe fn sym<T: Copy>(&self, name: &CStr) -> Result<T, String> {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: the handle is live; dlsym only reads the NUL-terminated name.
        let p = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        if p.is_null() {
            return Err(format!("{} has no symbol {}", self.name, name.to_string_lossy()));
        }
        // SAFETY: the caller names the right function pointer type; it has a pointer's size.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
}

/// Whether one of `names` is already loaded in this process (`RTLD_NOLOAD`: nothing is
/// loaded by asking).
pub fn is_loaded(names: &[&CStr]) -> bool {
    names.iter().any(|n| {
        // SAFETY: RTLD_NOLOAD only looks the name up among loaded objects; the reference it
        // takes on a hit is dropped at once.
        unsafe {
            let h = libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if !h.is_null() {
                libc::dlclose(h);
            }
            !h.is_null()
        }
    })
}

/// How many objects the dynamic loader has loaded into this process so far (glibc's and
/// musl's `dlpi_adds`: it grows with every `dlopen` that maps something); 0 if unknown.
pub fn loads() -> u64 {
    extern "C" fn first(info: *mut libc::dl_phdr_info, _: libc::size_t, out: *mut c_void) -> libc::c_int {
        // SAFETY: the loader passes a valid info record, and `out` is the `u64` below.
        unsafe { *(out as *mut u64) = (*info).dlpi_adds };
        1 // the counter is the same in every record: stop at the first
    }
    let mut adds = 0u64;
    // SAFETY: `first` only reads the record and writes `adds`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut adds as *mut u64).cast()) };
    adds
}
