//! Process resource limits.

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (children inherit it); the
/// soft limit after (`u64::MAX` when it cannot be read).
pub fn raise_nofile() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return u64::MAX;
        }
        if l.rlim_cur < l.rlim_max {
            let raised = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                l = raised;
            }
        }
    }
    l.rlim_cur
}

/// Whether `e` says this process (or the system) ran out of file descriptors.
pub fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Whether `e`, or an error it was caused by, is [`out_of_descriptors`].
pub fn error_is_out_of_descriptors(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(x) = at {
        if x.downcast_ref::<std::io::Error>().is_some_and(out_of_descriptors) {
            return true;
        }
        at = x.source();
    }
    false
}
