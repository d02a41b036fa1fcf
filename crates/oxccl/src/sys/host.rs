//! Who and where this process is: host name, pid, and the host identity that decides which
//! peers share memory.
//!
//! The identity hashes the host name, the kernel's boot id and the network namespace: ranks in
//! different containers or network namespaces of one machine count as different hosts (they
//! may not reach each other's abstract Unix sockets), while ranks in one namespace always
//! share memory. `OXCCL_HOST_ID` overrides it.

/// This machine's host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "unknown".to_string();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The host identity; `override_id` is `OXCCL_HOST_ID` when set.
pub fn host_id(override_id: Option<&str>) -> u64 {
    if let Some(s) = override_id {
        return fnv1a(s.as_bytes());
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns =
        std::fs::read_link("/proc/self/ns/net").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    fnv1a(format!("{}|{}|{}", hostname(), boot.trim(), netns).as_bytes())
}

/// The calling thread's kernel thread id (for log lines).
pub fn thread_id() -> u64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u64 }
}
