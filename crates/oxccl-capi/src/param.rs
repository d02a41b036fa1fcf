//! NCCL 2.30's parameter calls (`ncclParamBind`, `ncclParamGet*`, `ncclParamGetParameter`,
//! `ncclParamGetAllParameterKeys`, `ncclParamDumpAll`) and `ncclResetDebugInit`.
//!
//! The parameters are the settings oxccl reads ([`oxccl::env::param_keys`]: `NCCL_*` and
//! `OXCCL_*` variables), looked up by their full name or, as NCCL names its own, without the
//! `NCCL_` prefix. A value is the environment's, read at the call; a setting the environment
//! leaves unset has no value (oxccl uses its default): the string calls answer an empty
//! string, the typed ones `ncclInvalidUsage` saying so. Handles point into a table made once
//! and never freed, so a handle stays valid for the life of the process; strings handed out
//! live until the next call of the same kind on the same thread, as NCCL documents.

use crate::fail::{invalid, usage, R, SUCCESS};
use crate::ptr::{self, put};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

/// One parameter: its name, NUL-terminated (a handle is the address of one of these).
struct Param {
    name: CString,
}

struct Table {
    params: Vec<Param>,
    /// `name` pointers, for `ncclParamGetAllParameterKeys`.
    ptrs: Vec<*const c_char>,
}

// SAFETY: the table is built once and never written again; the raw pointers point into its
// own `CString`s, which live (unmoved: their heap buffers) as long as the table, i.e. forever.
unsafe impl Sync for Table {}
// SAFETY: as above.
unsafe impl Send for Table {}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let params: Vec<Param> = oxccl::env::param_keys()
            .into_iter()
            .filter_map(|k| CString::new(k).ok().map(|name| Param { name }))
            .collect();
        let ptrs = params.iter().map(|p| p.name.as_ptr()).collect();
        Table { params, ptrs }
    })
}

fn find(key: &str) -> Option<&'static Param> {
    let t = table();
    let full = |p: &Param| p.name.to_str().map(|n| n == key || n.strip_prefix("NCCL_") == Some(key));
    t.params.iter().find(|p| full(p).unwrap_or(false))
}

/// The parameter the caller's string `key` (named `arg`) names.
///
/// # Safety
/// `key` is NULL or a NUL-terminated string, unchanged during the call.
unsafe fn key_arg(key: *const c_char, arg: &str) -> R<&'static Param> {
    // SAFETY: this function's contract.
    let k = unsafe { ptr::c_str(key, arg) }?.ok_or_else(|| invalid(arg, "NULL pointer"))?;
    find(k).ok_or_else(|| {
        invalid(arg, format!("{k:?} is not a parameter of oxccl (ncclParamGetAllParameterKeys lists them)"))
    })
}

fn by_handle(h: *mut c_void) -> R<&'static Param> {
    if h.is_null() {
        return Err(invalid("h", "NULL handle"));
    }
    table()
        .params
        .iter()
        .find(|p| std::ptr::eq(*p as *const Param as *const c_void, h))
        .ok_or_else(|| invalid("h", format!("{h:p} is not a handle from ncclParamBind")))
}

fn name(p: &Param) -> &str {
    p.name.to_str().unwrap_or("?")
}

fn value(p: &Param) -> Option<String> {
    oxccl::env::param(name(p))
}

/// The value as an integer of the type `ty` spans (`lo..=hi`).
fn integer(p: &Param, ty: &str, lo: i128, hi: i128) -> R<i128> {
    let v = value(p).ok_or_else(|| usage(format!("{} is not set (oxccl uses its default)", name(p))))?;
    let n: i128 = v.trim().parse().map_err(|_| {
        invalid("h", format!("{} = {v:?} is not an integer (read it with ncclParamGetStr)", name(p)))
    })?;
    if n < lo || n > hi {
        return Err(invalid("h", format!("{} = {n} does not fit in {ty}", name(p))));
    }
    Ok(n)
}

thread_local! {
    static STR: RefCell<CString> = RefCell::new(CString::default());
    static PARAM: RefCell<CString> = RefCell::new(CString::default());
}

/// Keeps `s` in `cell` (until the next call that uses it on this thread); returns its address
/// and length.
fn keep(cell: &'static std::thread::LocalKey<RefCell<CString>>, s: String) -> (*const c_char, usize) {
    let c = CString::new(s.replace('\0', " ")).unwrap_or_default();
    let len = c.as_bytes().len();
    cell.with(|k| {
        *k.borrow_mut() = c;
        (k.borrow().as_ptr(), len)
    })
}

macro_rules! typed {
    ($( $name:ident / $pname:ident : $t:ty ),* $(,)?) => {
        crate::entry! {$(
            fn $name / $pname(h: *mut c_void, out: *mut $t) {
                let p = by_handle(h)?;
                if out.is_null() {
                    return Err(invalid("out", "NULL pointer"));
                }
                let n = integer(p, stringify!($t), <$t>::MIN as i128, <$t>::MAX as i128)?;
                // SAFETY: nccl.h: `out` points to the integer of this type the call fills
                // (checked non-NULL).
                unsafe { put(out, "out", n as $t) }?;
                Ok(SUCCESS)
            }
        )*}
    };
}

typed! {
    ncclParamGetI8 / pncclParamGetI8: i8,
    ncclParamGetI16 / pncclParamGetI16: i16,
    ncclParamGetI32 / pncclParamGetI32: i32,
    ncclParamGetI64 / pncclParamGetI64: i64,
    ncclParamGetU8 / pncclParamGetU8: u8,
    ncclParamGetU16 / pncclParamGetU16: u16,
    ncclParamGetU32 / pncclParamGetU32: u32,
    ncclParamGetU64 / pncclParamGetU64: u64,
}

crate::entry! {
    fn ncclParamBind / pncclParamBind(out: *mut *mut c_void, key: *const c_char) {
        if out.is_null() {
            return Err(invalid("out", "NULL pointer"));
        }
        // SAFETY: nccl.h: `key` is a NUL-terminated parameter name (key_arg refuses NULL).
        let p = unsafe { key_arg(key, "key") }?;
        // SAFETY: nccl.h: `out` points to the ncclParamHandle_t the call fills (checked
        // non-NULL).
        unsafe { put(out, "out", p as *const Param as *mut c_void) }?;
        Ok(SUCCESS)
    }

    fn ncclParamGetStr / pncclParamGetStr(h: *mut c_void, out: *mut *const c_char) {
        let p = by_handle(h)?;
        if out.is_null() {
            return Err(invalid("out", "NULL pointer"));
        }
        let (s, _) = keep(&STR, value(p).unwrap_or_default());
        // SAFETY: nccl.h: `out` points to the const char* the call fills (checked non-NULL).
        unsafe { put(out, "out", s) }?;
        Ok(SUCCESS)
    }

    fn ncclParamGet / pncclParamGet(h: *mut c_void, out: *mut c_void, max_len: c_int, len: *mut c_int) {
        let p = by_handle(h)?;
        if len.is_null() {
            return Err(invalid("len", "NULL pointer"));
        }
        if max_len < 0 {
            return Err(invalid("maxLen", max_len));
        }
        let v = value(p).unwrap_or_default();
        let bytes = v.as_bytes();
        // SAFETY: nccl.h: `len` points to the int the call fills (checked non-NULL).
        unsafe { put(len, "len", bytes.len() as c_int) }?;
        if bytes.len() > max_len as usize {
            return Err(invalid("maxLen", format!("{max_len} bytes cannot hold {}'s {} (written to *len)", name(p), bytes.len())));
        }
        if !bytes.is_empty() {
            if out.is_null() {
                return Err(invalid("out", "NULL pointer"));
            }
            // SAFETY: nccl.h: `out` is a buffer of `maxLen` bytes (checked non-NULL and
            // maxLen ≥ bytes.len() above).
            unsafe { ptr::put_all(out as *mut u8, "out", bytes) }?;
        }
        Ok(SUCCESS)
    }

    fn ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, value_out: *mut *const c_char, value_len: *mut c_int) {
        // SAFETY: nccl.h: `key` is a NUL-terminated parameter name (key_arg refuses NULL).
        let p = unsafe { key_arg(key, "key") }?;
        if value_out.is_null() {
            return Err(invalid("value", "NULL pointer"));
        }
        let (s, n) = keep(&PARAM, value(p).unwrap_or_default());
        // SAFETY: nccl.h: `value` points to the const char* the call fills (checked non-NULL).
        unsafe { put(value_out, "value", s) }?;
        if !value_len.is_null() {
            // SAFETY: nccl.h: a non-NULL `valueLen` points to the int the call fills.
            unsafe { put(value_len, "valueLen", n as c_int) }?;
        }
        Ok(SUCCESS)
    }

    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(table_out: *mut *const *const c_char, table_len: *mut c_int) {
        if table_out.is_null() {
            return Err(invalid("table", "NULL pointer"));
        }
        if table_len.is_null() {
            return Err(invalid("tableLen", "NULL pointer"));
        }
        let t = table();
        // SAFETY: nccl.h: `table` points to the const char** the call fills (checked non-NULL).
        unsafe { put(table_out, "table", t.ptrs.as_ptr()) }?;
        // SAFETY: nccl.h: `tableLen` points to the int the call fills (checked non-NULL).
        unsafe { put(table_len, "tableLen", t.ptrs.len() as c_int) }?;
        Ok(SUCCESS)
    }
}

/// `ncclParamDumpAll`: every parameter and its value, one line each on stderr.
#[no_mangle]
pub extern "C" fn ncclParamDumpAll() {
    let _ = std::panic::catch_unwind(|| {
        for p in &table().params {
            match value(p) {
                Some(v) => eprintln!("oxccl: {} = {v}", name(p)),
                None => eprintln!("oxccl: {} unset (default)", name(p)),
            }
        }
    });
}

/// `pncclParamDumpAll`.
#[no_mangle]
pub extern "C" fn pncclParamDumpAll() {
    ncclParamDumpAll()
}

/// `ncclResetDebugInit`: nothing to reset, since each communicator reads the logging
/// settings (`NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`, `NCCL_DEBUG_FILE`) when it is made.
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {}

/// `pncclResetDebugInit`.
#[no_mangle]
pub extern "C" fn pncclResetDebugInit() {}
