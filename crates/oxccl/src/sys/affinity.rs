//! CPU affinity: the CPUs this process was launched on, and binding a thread to a set.

use std::io;

/// The CPU the calling thread runs on at this instant (it may move at any time: a hint), or
/// `None` where the kernel does not say. Cheap: glibc reads it from the thread's rseq area.
pub fn running_on() -> Option<u32> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).ok()
}

/// Parses a CPU list as sysfs and `/proc` write it (`0-3,8,10-11`).
pub fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut v = Vec::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    v.extend(a..=b.min(a + 65_535));
                }
            }
            None => v.extend(part.parse::<usize>().ok()),
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Writes a CPU list compactly (`0-3,8`).
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// The CPUs the calling thread may run on (for a process just started: its launch set).
pub fn current() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Binds the calling thread to `cpus`.
pub fn bind_current(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data, filled with CPU_SET below its size; sched_setaffinity
    // reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip_and_binding_to_the_launch_set_works() {
        assert_eq!(parse_cpulist("0-3,8,10-11"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        let now = current();
        assert!(!now.is_empty());
        std::thread::spawn(move || {
            bind_current(&now[..1]).unwrap();
            assert_eq!(current(), now[..1].to_vec());
        })
        .join()
        .unwrap();
    }
}
