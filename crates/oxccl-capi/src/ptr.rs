//! The raw pointers of the C ABI: every read or write through a pointer argument of an entry
//! point goes through one of these helpers.
//!
//! Rules:
//! - A helper checks what can be checked (NULL, a count whose size in bytes overflows) and
//!   answers `ncclInvalidArgument` naming the argument: bad input never dereferences NULL or
//!   panics. Entry points still make their own checks first where nccl.h fixes their order or
//!   their message; the helper's check then only backs them up.
//! - What cannot be checked (that a non-NULL pointer is aligned, points to storage of the size
//!   the call implies, and that no other thread writes it meanwhile) is the helper's
//!   `# Safety` contract, which nccl.h puts on the C caller. Each call site's `// SAFETY:`
//!   comment says which argument it is and which nccl.h rule vouches for it.
//! - Nothing a helper returns outlives the entry point's call: a borrowed slice, struct or
//!   string is copied out before the call returns if it is kept.

use crate::fail::{invalid, R};
use std::ffi::{c_char, CStr};

/// Writes `v` through the out-pointer `p` (named `arg`).
///
/// # Safety
/// `p` is NULL or valid for a write of one `T` (aligned, writable).
pub(crate) unsafe fn put<T>(p: *mut T, arg: &str, v: T) -> R<()> {
    if p.is_null() {
        return Err(invalid(arg, "NULL pointer"));
    }
    // SAFETY: non-NULL, and the caller's contract makes `p` valid for a write of one T.
    unsafe { p.write(v) };
    Ok(())
}

/// Writes `vals` to the array at `p` (named `arg`): `vals[i]` to `p[i]`. Nothing is written
/// (and `p` may be NULL) when `vals` is empty.
///
/// # Safety
/// `p` is NULL or valid for writes of `vals.len()` consecutive `T`s (aligned, writable).
pub(crate) unsafe fn put_all<T: Copy>(p: *mut T, arg: &str, vals: &[T]) -> R<()> {
    if vals.is_empty() {
        return Ok(());
    }
    if p.is_null() {
        return Err(invalid(arg, format!("NULL pointer for {} elements", vals.len())));
    }
    // SAFETY: non-NULL; the caller's contract makes `p` valid for `vals.len()` writes, and a
    // slice is valid for as many reads; `copy` allows the two to overlap.
    unsafe { p.copy_from(vals.as_ptr(), vals.len()) };
    Ok(())
}

/// The `n` elements at `p` (named `arg`); empty when `n` is 0, whatever `p` is.
///
/// # Safety
/// When `n > 0`, `p` is NULL or points to `n` initialized, aligned, consecutive `T`s that no
/// one writes for `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, arg: &str) -> R<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(arg, format!("NULL pointer with {n} elements")));
    }
    let size = std::mem::size_of::<T>();
    if n.checked_mul(size).is_none_or(|b| b > isize::MAX as usize) {
        return Err(invalid(arg, format!("{n} elements of {size} bytes overflow the address space")));
    }
    // SAFETY: non-NULL, the span fits in isize (checked above), and the caller's contract makes
    // `p` point to `n` initialized, aligned elements that stay unchanged for 'a.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The `T` at `p` (named `arg`), borrowed.
///
/// # Safety
/// `p` is NULL or points to an initialized, aligned `T` that no one writes for `'a`.
pub(crate) unsafe fn deref<'a, T>(p: *const T, arg: &str) -> R<&'a T> {
    // SAFETY: the caller's contract: NULL (then None) or a valid T, unchanged for 'a.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(arg, "NULL pointer"))
}

/// The `T` at `p` (named `arg`), borrowed to be read and written.
///
/// # Safety
/// `p` is NULL or points to an initialized, aligned `T` that no one else reads or writes for
/// `'a`.
pub(crate) unsafe fn deref_mut<'a, T>(p: *mut T, arg: &str) -> R<&'a mut T> {
    // SAFETY: the caller's contract: NULL (then None) or a valid T, this call's alone for 'a.
    unsafe { p.as_mut() }.ok_or_else(|| invalid(arg, "NULL pointer"))
}

/// The C string at `p` (named `arg`): `None` for NULL, refused when not UTF-8.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that no one changes for `'a`.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, arg: &str) -> R<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller's contract makes it a NUL-terminated string unchanged
    // for 'a.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|_| invalid(arg, "not UTF-8"))
}

/// The field of type `F` at byte `offset` of the versioned struct at `p` when it lies within
/// the first `size` bytes (the struct's length as its caller's nccl.h version lays it out:
/// older versions' structs are shorter, and their callers' memory ends there); else `None`.
///
/// # Safety
/// `p` is non-NULL, aligned for `S` and readable for `size` bytes, which no one writes during
/// the call; `offset` is `offset_of!` a field of type `F` in the `#[repr(C)]` struct `S`.
pub(crate) unsafe fn field<S, F: Copy>(p: *const S, size: usize, offset: usize) -> Option<F> {
    let end = offset.checked_add(std::mem::size_of::<F>())?;
    if end > size {
        return None;
    }
    // SAFETY: `offset..end` lies within the `size` readable bytes at `p` (checked above), and a
    // field's offset in an aligned repr(C) struct is aligned for the field's type.
    Some(unsafe { p.cast::<u8>().add(offset).cast::<F>().read() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NULL and overflowing arguments are refused by name; empty ones need no pointer.
    #[test]
    fn bad_pointers_are_refused_by_name() {
        let null_msg = |r: R<()>| r.expect_err("refused").msg;
        // SAFETY: NULL pointers and empty counts, which every helper accepts.
        unsafe {
            assert!(null_msg(put(std::ptr::null_mut::<i32>(), "count", 1)).contains("count"));
            assert!(null_msg(put_all(std::ptr::null_mut::<i32>(), "comm", &[1, 2])).contains("comm"));
            put_all(std::ptr::null_mut::<i32>(), "comm", &[]).unwrap();
            assert!(slice(std::ptr::null::<i32>(), 0, "list").unwrap().is_empty());
            assert!(slice(std::ptr::null::<i32>(), 2, "list").err().unwrap().msg.contains("list"));
            let huge = slice(std::ptr::NonNull::<u64>::dangling().as_ptr(), usize::MAX / 4, "ids");
            assert!(huge.err().unwrap().msg.contains("overflow"));
            assert!(deref(std::ptr::null::<i32>(), "simInfo").err().unwrap().msg.contains("simInfo"));
            assert!(deref_mut(std::ptr::null_mut::<i32>(), "sim").is_err());
            assert_eq!(c_str(std::ptr::null(), "key").unwrap(), None);
        }
    }

    /// Fields past the caller's size are not read.
    #[test]
    fn fields_are_read_within_the_size() {
        #[repr(C)]
        struct V {
            a: u32,
            b: u32,
        }
        let v = V { a: 7, b: 9 };
        let at = |size| {
            // SAFETY: `v` is a whole V, so readable for any size up to its own.
            unsafe {
                (
                    field::<V, u32>(&v, size, std::mem::offset_of!(V, a)),
                    field::<V, u32>(&v, size, std::mem::offset_of!(V, b)),
                )
            }
        };
        assert_eq!(at(4), (Some(7), None));
        assert_eq!(at(8), (Some(7), Some(9)));
    }
}
