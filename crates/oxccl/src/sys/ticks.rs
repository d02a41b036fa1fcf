//! A cheap clock for timestamps taken on every call and read rarely (the flight recorder):
//! the CPU's time-stamp counter where it runs at a constant rate (x86_64 with an invariant
//! TSC), else the system clock in microseconds.
//!
//! Rules: `TickClock::now` only reads the counter (measured on a 2-vCPU KVM guest: about 10 ns
//! against 34 ns for `SystemTime::now`, which a flight-recorded call took twice); ticks become
//! Unix microseconds only through [`TickClock::to_unix`], which anchors the counter's rate on
//! two readings of the system clock at least [`MIN_SPAN_US`] apart (the clock's creation and
//! the conversion), waiting out the rest of that span if needed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The shortest span the counter's rate is measured over.
pub const MIN_SPAN_US: u64 = 10_000;

/// Microseconds since the Unix epoch (the system clock).
pub fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use std::arch::x86_64::__cpuid;
    // CPUID leaf 0x8000_0007, EDX bit 8: the TSC runs at a constant rate in every power state.
    let max = __cpuid(0x8000_0000).eax;
    max >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn tsc() -> u64 {
    // SAFETY: RDTSC has no operands and no effect beyond reading the counter; it is part of
    // x86_64's baseline.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn invariant_tsc() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn tsc() -> u64 {
    0
}

/// Ticks of the counter (or Unix microseconds where there is none).
#[derive(Debug, Clone, Copy)]
pub struct TickClock {
    tsc: bool,
    t0: u64,
    us0: u64,
}

impl Default for TickClock {
    fn default() -> Self {
        TickClock::new()
    }
}

impl TickClock {
    pub fn new() -> TickClock {
        let tsc = invariant_tsc();
        TickClock { tsc, t0: if tsc { self::tsc() } else { 0 }, us0: unix_us() }
    }

    /// Now, in ticks.
    #[inline]
    pub fn now(&self) -> u64 {
        if self.tsc {
            tsc()
        } else {
            unix_us()
        }
    }

    /// Ticks taken so far → Unix microseconds.
    pub fn to_unix(&self) -> impl Fn(u64) -> u64 {
        let (t0, us0, tsc) = (self.t0, self.us0, self.tsc);
        let mut per_us = 0.0;
        if tsc {
            let waited = unix_us().saturating_sub(us0);
            if waited < MIN_SPAN_US {
                std::thread::sleep(Duration::from_micros(MIN_SPAN_US - waited));
            }
            let (t1, us1) = (self::tsc(), unix_us());
            per_us = t1.saturating_sub(t0) as f64 / us1.saturating_sub(us0).max(1) as f64;
        }
        // Without a counter (or a rate), ticks already are microseconds.
        move |t| if per_us > 0.0 { us0 + (t.saturating_sub(t0) as f64 / per_us) as u64 } else { t }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_the_system_clock() {
        let c = TickClock::new();
        let a = (c.now(), unix_us());
        std::thread::sleep(Duration::from_millis(30));
        let b = (c.now(), unix_us());
        let conv = c.to_unix();
        for (t, us) in [a, b] {
            let got = conv(t);
            assert!(got.abs_diff(us) < 2_000, "tick {t} → {got} µs, system clock said {us} µs");
        }
        assert!(conv(b.0) > conv(a.0) + 20_000, "30 ms apart: {} and {}", conv(a.0), conv(b.0));
    }
}
