//! Who and where this process is: host name, pid, the host identity that decides which peers
//! share memory, and the L2 cache size that the direct path sizes its work by.
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

/// The machine identity: the kernel's boot id, shared by every network namespace and
/// container of the machine (whose ranks share its cores), whatever `OXCCL_HOST_ID` says.
pub fn machine_id() -> u64 {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    match boot.trim() {
        "" => fnv1a(hostname().as_bytes()),
        b => fnv1a(b.as_bytes()),
    }
}

/// The calling thread's kernel thread id (for log lines).
pub fn thread_id() -> u64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u64 }
}

/// Bytes of CPU 0's L2 cache, from sysfs (`None` where it does not say). CPU 0 for every
/// caller, so that every rank of a host reads the same number.
pub fn l2_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.flatten().find_map(|e| {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        let kind = read("type")?;
        if read("level")?.trim() != "2" || kind.trim() == "Instruction" {
            return None;
        }
        parse_cache_size(&read("size")?)
    })
}

/// Parses a sysfs cache size (`2048K`, `1M`, `512`).
pub fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, shift) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 10),
        b'M' => (&s[..s.len() - 1], 20),
        b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<usize>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("2048K\n"), Some(2 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("12Q"), None);
    }
}
