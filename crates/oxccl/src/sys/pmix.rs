//! PMIx, loaded at run time (`libpmix.so.2`): the process-management interface that Open MPI's
//! `mpirun`, `srun --mpi=pmix` and PRRTE serve to the processes they start. oxccl uses it only
//! to learn a process's place (rank, job size, local rank) and to pass one string from rank 0
//! to the others (put, commit, fence, get). The build never needs PMIx; a process without it
//! gets an error value naming the library, never a panic.
//!
//! Rules:
//! 1. A process initialises PMIx once ([`session`]) and finalises it once, at exit (`atexit`):
//!    a launcher counts a process that initialised and exited without finalising as failed,
//!    PMIx 4 keeps even a failed init's reference, and a process that finalised is done in the
//!    server's eyes (a second session's fence fails).
//! 2. Structures are laid out as PMIx 3 to 6 define them on LP64 Linux (`pmix_proc_t` 260
//!    bytes, `pmix_value_t` 32 with its union at 8, `pmix_info_t` 552 with its value at 520);
//!    values PMIx returns are freed with the library's own function (`PMIx_Value_free`, else
//!    `PMIx_Value_destruct` and `free`).

use super::dl::Lib;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

const MAX_NSLEN: usize = 255;
const MAX_KEYLEN: usize = 511;
const RANK_WILDCARD: u32 = u32::MAX - 1;
const SUCCESS: c_int = 0;
const SCOPE_GLOBAL: u8 = 3;
const TYPE_BOOL: u16 = 1;
const TYPE_STRING: u16 = 3;
const TYPE_INT: u16 = 6;
const TYPE_UINT16: u16 = 13;
const TYPE_UINT32: u16 = 14;

#[repr(C)]
struct Proc {
    nspace: [c_char; MAX_NSLEN + 1],
    rank: u32,
}

/// `pmix_value_t`: the type, then a 24-byte union (pointers and integers at its start).
#[repr(C)]
struct Value {
    ty: u16,
    data: Data,
}

#[repr(C, align(8))]
struct Data([u8; 24]);

#[repr(C)]
struct Info {
    key: [c_char; MAX_KEYLEN + 1],
    flags: u32,
    value: Value,
}

const _: () = assert!(std::mem::size_of::<Proc>() == 260);
const _: () = assert!(std::mem::size_of::<Value>() == 32);
const _: () = assert!(std::mem::size_of::<Info>() == 552);

impl Value {
    fn new(ty: u16, head: &[u8]) -> Value {
        let mut data = [0u8; 24];
        data[..head.len()].copy_from_slice(head);
        Value { ty, data: Data(data) }
    }
}

impl Info {
    fn new(key: &str, value: Value) -> Info {
        let mut k = [0 as c_char; MAX_KEYLEN + 1];
        for (d, s) in k.iter_mut().zip(key.bytes().take(MAX_KEYLEN)) {
            *d = s as c_char;
        }
        Info { key: k, flags: 0, value }
    }
}

type Init = unsafe extern "C" fn(*mut Proc, *mut Info, usize) -> c_int;
type Finalize = unsafe extern "C" fn(*const Info, usize) -> c_int;
type Put = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
type Commit = unsafe extern "C" fn() -> c_int;
type Fence = unsafe extern "C" fn(*const Proc, usize, *const Info, usize) -> c_int;
type Get = unsafe extern "C" fn(*const Proc, *const c_char, *const Info, usize, *mut *mut Value) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type ValueFree = unsafe extern "C" fn(*mut Value, usize);
type ValueDestruct = unsafe extern "C" fn(*mut Value);

/// A PMIx client session (initialised; finalised at process exit).
pub struct Pmix {
    lib: Lib,
    me: Proc,
    finalize: Finalize,
    put: Put,
    commit: Commit,
    fence: Fence,
    get: Get,
    error_string: Option<ErrorString>,
}

// SAFETY: PMIx clients are thread-safe (the library runs its own progress thread and locks its
// state); the session's fields are read-only after init.
unsafe impl Send for Pmix {}
// SAFETY: as above.
unsafe impl Sync for Pmix {}

/// What a value PMIx returned holds.
enum Got {
    Str(String),
    Num(u64),
    Other(u16),
}

/// The process's PMIx session, initialised at the first call (rule 1); the error of that
/// first attempt on every call after a failure.
pub fn session() -> Result<&'static Pmix, String> {
    static SESSION: std::sync::OnceLock<Result<Pmix, String>> = std::sync::OnceLock::new();
    static FINALIZE: std::sync::OnceLock<Finalize> = std::sync::OnceLock::new();
    extern "C" fn at_exit() {
        if let Some(f) = FINALIZE.get() {
            // SAFETY: the session's own PMIx_Finalize, once, at exit (rule 1); no info.
            unsafe { f(std::ptr::null(), 0) };
        }
    }
    SESSION
        .get_or_init(|| {
            let (p, rc) = Pmix::init()?;
            let _ = FINALIZE.set(p.finalize);
            // SAFETY: registers a plain extern "C" function with no arguments.
            unsafe { libc::atexit(at_exit) };
            if rc != SUCCESS {
                return Err(format!("PMIx_Init: {}", p.status(rc)));
            }
            Ok(p)
        })
        .as_ref()
        .map_err(|e| e.clone())
}

impl Pmix {
    /// Loads `libpmix.so.2` and initialises a client of the launcher's PMIx server; the
    /// session and `PMIx_Init`'s status (to be finalised even when it failed).
    fn init() -> Result<(Pmix, c_int), String> {
        let lib = Lib::open(&["libpmix.so.2".to_string(), "libpmix.so".to_string()])
            .map_err(|e| format!("cannot load libpmix.so.2 ({e})"))?;
        // SAFETY: each type is the C signature PMIx defines for the symbol.
        let (init, finalize, put, commit, fence, get) = unsafe {
            (
                lib.sym::<Init>(c"PMIx_Init")?,
                lib.sym::<Finalize>(c"PMIx_Finalize")?,
                lib.sym::<Put>(c"PMIx_Put")?,
                lib.sym::<Commit>(c"PMIx_Commit")?,
                lib.sym::<Fence>(c"PMIx_Fence")?,
                lib.sym::<Get>(c"PMIx_Get")?,
            )
        };
        // SAFETY: as above.
        let error_string = unsafe { lib.sym::<ErrorString>(c"PMIx_Error_string") }.ok();
        let mut me = Proc { nspace: [0; MAX_NSLEN + 1], rank: 0 };
        // SAFETY: `me` is a live pmix_proc_t PMIx fills in; no info.
        let rc = unsafe { init(&mut me, std::ptr::null_mut(), 0) };
        Ok((Pmix { lib, me, finalize, put, commit, fence, get, error_string }, rc))
    }

    fn status(&self, rc: c_int) -> String {
        let name = self.error_string.and_then(|f| {
            // SAFETY: PMIx_Error_string returns a static NUL-terminated string (or null).
            let s = unsafe { f(rc) };
            // SAFETY: non-null: a static C string.
            (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
        });
        match name {
            Some(n) => format!("{n} ({rc})"),
            None => format!("status {rc}"),
        }
    }

    /// This process's rank in its namespace.
    pub fn rank(&self) -> u32 {
        self.me.rank
    }

    /// The job's namespace.
    pub fn namespace(&self) -> String {
        // SAFETY: PMIx wrote a NUL-terminated name of at most MAX_NSLEN bytes into the array.
        unsafe { CStr::from_ptr(self.me.nspace.as_ptr()) }.to_string_lossy().into_owned()
    }

    fn proc_of(&self, rank: u32) -> Proc {
        Proc { nspace: self.me.nspace, rank }
    }

    /// `PMIx_Get` of `key` for `rank`'s process; `optional`: a missing key fails at once.
    fn get(&self, rank: u32, key: &str, optional: bool) -> Result<Got, String> {
        let k = CString::new(key).map_err(|_| format!("PMIx key {key:?} holds a NUL"))?;
        let p = self.proc_of(rank);
        let info = [Info::new("pmix.optional", Value::new(TYPE_BOOL, &[1]))];
        let ninfo = usize::from(optional);
        let mut v: *mut Value = std::ptr::null_mut();
        // SAFETY: live proc, key and info array; PMIx allocates the value it returns in `v`.
        let rc = unsafe { (self.get)(&p, k.as_ptr(), info.as_ptr(), ninfo, &mut v) };
        if rc != SUCCESS || v.is_null() {
            return Err(format!("PMIx_Get({key}) for rank {rank}: {}", self.status(rc)));
        }
        // SAFETY: a value PMIx allocated and filled; its union's head is read per its type.
        let got = unsafe {
            let val = &*v;
            let d = &val.data.0;
            match val.ty {
                TYPE_STRING => {
                    let s = usize::from_ne_bytes(d[..8].try_into().expect("8 bytes")) as *const c_char;
                    Got::Str(if s.is_null() {
                        String::new()
                    } else {
                        CStr::from_ptr(s).to_string_lossy().into_owned()
                    })
                }
                TYPE_UINT32 => Got::Num(u32::from_ne_bytes(d[..4].try_into().expect("4 bytes")) as u64),
                TYPE_UINT16 => Got::Num(u16::from_ne_bytes(d[..2].try_into().expect("2 bytes")) as u64),
                t => Got::Other(t),
            }
        };
        self.release(v);
        Ok(got)
    }

    /// Frees a value PMIx returned, with the library's own allocator.
    fn release(&self, v: *mut Value) {
        // SAFETY: the types are the C signatures PMIx 5 (Value_free) and 4.2 (Value_destruct)
        // define; `v` came from PMIx_Get, so its contents and itself are malloc'd by PMIx.
        unsafe {
            if let Ok(free) = self.lib.sym::<ValueFree>(c"PMIx_Value_free") {
                free(v, 1);
                return;
            }
            match self.lib.sym::<ValueDestruct>(c"PMIx_Value_destruct") {
                Ok(destruct) => destruct(v),
                // PMIx 3 and 4.0/4.1 destruct in their headers only: free a string's bytes.
                Err(_) => {
                    let val = &*v;
                    if val.ty == TYPE_STRING {
                        let s = usize::from_ne_bytes(val.data.0[..8].try_into().expect("8 bytes"));
                        libc::free(s as *mut c_void);
                    }
                }
            }
            libc::free(v as *mut c_void);
        }
    }

    /// The number of processes in the job (`pmix.job.size`).
    pub fn job_size(&self) -> Result<usize, String> {
        match self.get(RANK_WILDCARD, "pmix.job.size", false)? {
            Got::Num(n) => Ok(n as usize),
            Got::Str(s) => Err(format!("pmix.job.size is a string ({s:?}), not a number")),
            Got::Other(t) => Err(format!("pmix.job.size has PMIx type {t}, not a number")),
        }
    }

    /// This process's rank among the job's processes on this host (`pmix.lrank`), if known.
    pub fn local_rank(&self) -> Option<usize> {
        match self.get(self.me.rank, "pmix.lrank", true) {
            Ok(Got::Num(n)) => Some(n as usize),
            _ => None,
        }
    }

    /// Publishes `value` under `key` for every process of the job (visible after a fence).
    pub fn put(&self, key: &str, value: &str) -> Result<(), String> {
        let k = CString::new(key).map_err(|_| format!("PMIx key {key:?} holds a NUL"))?;
        let s = CString::new(value).map_err(|_| "PMIx value holds a NUL".to_string())?;
        let mut v = Value::new(TYPE_STRING, &(s.as_ptr() as usize).to_ne_bytes());
        // SAFETY: live key and value; PMIx copies the string before returning.
        let rc = unsafe { (self.put)(SCOPE_GLOBAL, k.as_ptr(), &mut v) };
        if rc != SUCCESS {
            return Err(format!("PMIx_Put({key}): {}", self.status(rc)));
        }
        // SAFETY: no arguments.
        let rc = unsafe { (self.commit)() };
        if rc != SUCCESS {
            return Err(format!("PMIx_Commit: {}", self.status(rc)));
        }
        Ok(())
    }

    /// Waits until every process of the job has reached this fence, collecting what each put
    /// (so later gets need no server round trip); gives up after `timeout_s` if set.
    pub fn fence(&self, timeout_s: Option<u32>) -> Result<(), String> {
        let mut info = vec![Info::new("pmix.collect", Value::new(TYPE_BOOL, &[1]))];
        if let Some(t) = timeout_s {
            info.push(Info::new("pmix.timeout", Value::new(TYPE_INT, &(t as c_int).to_ne_bytes())));
        }
        // SAFETY: no procs (the whole namespace) and a live info array.
        let rc = unsafe { (self.fence)(std::ptr::null(), 0, info.as_ptr(), info.len()) };
        if rc != SUCCESS {
            return Err(format!("PMIx_Fence: {}", self.status(rc)));
        }
        Ok(())
    }

    /// The string `rank` published under `key` (after a fence).
    pub fn get_string(&self, rank: u32, key: &str) -> Result<String, String> {
        match self.get(rank, key, true)? {
            Got::Str(s) => Ok(s),
            Got::Num(n) => Err(format!("{key} of rank {rank} is a number ({n}), not a string")),
            Got::Other(t) => Err(format!("{key} of rank {rank} has PMIx type {t}, not a string")),
        }
    }
}
