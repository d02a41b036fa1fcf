//! Cross-memory attach: copying bytes out of another process's address space with
//! `process_vm_readv`, one copy with no shared buffer in between (Linux 3.2+).
//!
//! Rules:
//! 1. The kernel checks permission as for `ptrace` attach (same user and, under Yama's
//!    `ptrace_scope` ≥ 1, more): callers probe once ([`probe`]) and fall back when refused.
//! 2. A remote range that is not mapped in the other process fails with `EFAULT` (never reads
//!    anything else); the local range must be writable memory of this process for `len` bytes,
//!    which is the caller's promise ([`read`] is `unsafe`).

use super::cvt_size;
use std::io;

/// Copies `len` bytes from address `remote` of process `pid` to `local`.
///
/// # Safety
/// `local` must be valid for writes of `len` bytes, and no other thread may access them
/// during the call.
pub unsafe fn read(pid: i32, remote: u64, local: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let liov = libc::iovec {
            // SAFETY: done < len, so the pointer stays within the caller's range.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let riov =
            libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: one local iovec within the caller's writable range (see above) and one
        // remote iovec, which the kernel validates against the other process's mappings.
        let n = cvt_size(unsafe { libc::process_vm_readv(pid, &liov, 1, &riov, 1, 0) })?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("process {pid} has no readable memory at {:#x}", remote as usize + done),
            ));
        }
        done += n;
    }
    Ok(())
}

/// Whether this process may read process `pid`'s memory: reads the 8 bytes at `remote`, which
/// the caller knows hold `expect` (a nonce the other process wrote into memory both can see).
/// `Err` carries why not, for a log line.
pub fn probe(pid: i32, remote: u64, expect: u64) -> Result<(), String> {
    let mut v = 0u64;
    // SAFETY: `v` is a live local u64, written only by this call.
    match unsafe { read(pid, remote, (&mut v as *mut u64).cast(), 8) } {
        Ok(()) if v == expect => Ok(()),
        Ok(()) => Err(format!("process {pid} answered with other bytes (another PID namespace?)")),
        Err(e) => {
            let why = match e.raw_os_error() {
                Some(libc::EPERM) => {
                    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
                        .map(|s| format!(", kernel.yama.ptrace_scope = {}", s.trim()))
                        .unwrap_or_default();
                    format!(" (not permitted by the ptrace policy{scope})")
                }
                Some(libc::ENOSYS) => " (the kernel lacks it)".to_string(),
                Some(libc::ESRCH) => " (no such process here: another PID namespace?)".to_string(),
                _ => String::new(),
            };
            Err(format!("process_vm_readv from process {pid} failed: {e}{why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_refuses_unmapped_addresses() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let pid = std::process::id() as i32;
        // SAFETY: dst is a live Vec of the given length.
        unsafe { read(pid, src.as_ptr() as u64, dst.as_mut_ptr(), dst.len()) }.unwrap();
        assert_eq!(src, dst);
        let nonce = 0x1234_5678_9abc_def0u64;
        let b = Box::new(nonce);
        assert_eq!(probe(pid, &*b as *const u64 as u64, nonce), Ok(()));
        assert!(probe(pid, &*b as *const u64 as u64, nonce + 1).unwrap_err().contains("other bytes"));
        // Page 0 is never mapped.
        let e = probe(pid, 16, 0).unwrap_err();
        assert!(e.contains("process_vm_readv"), "{e}");
    }
}
