//! CPU affinity: the CPUs this process was launched on, how many the processes of this host
//! share (what "more ranks than cores" counts against), and binding a thread to a set.

use std::io;

/// The CPU the calling thread runs on at this instant (it may move at any time: a hint), or
/// `None` where the kernel does not say. Cheap: glibc reads it from the thread's rseq area.
pub fn running_on() -> Option<u32> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).ok()
}

/// How many CPUs the processes of this host may share: the CPU set of this process's cgroup
/// (v2 `cpuset.cpus.effective`, v1 `cpuset.effective_cpus`), else the online CPUs, else this
/// thread's affinity. Not this thread's affinity first: a launcher that binds each rank to a
/// core of its own (`mpirun --bind-to core`, Slurm's `--cpu-bind`) leaves one CPU in each mask,
/// and ranks would take themselves for more than the cores. Every rank of a container reads the
/// same number.
pub fn host_cpus() -> usize {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    host_cpus_from(read("/proc/self/cgroup").as_deref(), read)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// [`host_cpus`] over a `/proc/self/cgroup` text and a file reader (`None`: nothing said).
pub fn host_cpus_from(cgroup: Option<&str>, read: impl Fn(&str) -> Option<String>) -> Option<usize> {
    let count = |text: Option<String>| text.map(|t| parse_cpulist(&t).len()).filter(|n| *n > 0);
    for line in cgroup.unwrap_or("").lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrl, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or("").trim());
        let path = path.trim_end_matches('/');
        let found = if ctrl.is_empty() {
            count(read(&format!("/sys/fs/cgroup{path}/cpuset.cpus.effective")))
        } else if ctrl.split(',').any(|c| c == "cpuset") {
            count(read(&format!("/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus")))
        } else {
            None
        };
        if found.is_some() {
            return found;
        }
    }
    count(read("/sys/devices/system/cpu/online"))
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
    fn host_cpus_read_the_cgroup_then_the_online_list() {
        use std::collections::HashMap;
        let files: HashMap<&str, &str> = [
            ("/sys/fs/cgroup/job/cpuset.cpus.effective", "0-3\n"),
            ("/sys/fs/cgroup/cpuset/ctr/cpuset.effective_cpus", "2,5\n"),
            ("/sys/devices/system/cpu/online", "0-7\n"),
        ]
        .into();
        let read = |p: &str| files.get(p).map(|s| s.to_string());
        assert_eq!(host_cpus_from(Some("0::/job\n"), read), Some(4));
        assert_eq!(host_cpus_from(Some("3:cpuset:/ctr\n1:cpu:/\n"), read), Some(2));
        // A cgroup that says nothing (or none at all): the online CPUs.
        assert_eq!(host_cpus_from(Some("0::/other\n"), read), Some(8));
        assert_eq!(host_cpus_from(None, read), Some(8));
        assert_eq!(host_cpus_from(None, |_| None), None);
    }

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
