//! Futexes on 32-bit words that may live in memory shared between processes.
//!
//! Rules: the word must stay mapped for the whole call (the caller keeps the mapping alive);
//! the calls are the shared (not `FUTEX_PRIVATE_FLAG`) kind, so a waiter in one process is
//! woken by a waker in another that maps the same page, wherever it is mapped.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout` (spurious wake-ups are possible: the
/// caller re-checks its condition).
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic for the duration of the call (borrowed);
    // the kernel only reads it and compares it with `expected`; `ts` lives on this stack. The
    // outcome (woken, timed out, value changed, interrupted) needs no handling: the caller
    // re-checks.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every waiter sleeping on `word`.
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic; FUTEX_WAKE only uses its address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_waiter_sleeps_until_woken_or_its_timeout() {
        let w = Arc::new(AtomicU32::new(0));
        let t = Instant::now();
        wait(&w, 0, Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(20), "slept {:?}", t.elapsed());
        // A changed value returns at once.
        let t = Instant::now();
        wait(&w, 7, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1));
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            let t = Instant::now();
            while w2.load(Ordering::Acquire) == 0 {
                wait(&w2, 0, Duration::from_secs(5));
            }
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        w.store(1, Ordering::Release);
        wake_all(&w);
        assert!(h.join().unwrap() < Duration::from_secs(4));
    }
}
