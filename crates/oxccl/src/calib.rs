//! Calibration: a quick, bounded probe of this host's links for the tuner's cost model — the
//! memory copy bandwidth, the latency of handing a chunk from one core to another, TCP
//! loopback latency and bandwidth, and what writing and reading the LL / LL128 formats costs. Measured once per host and cached in
//! `OXCCL_CACHE_DIR` (else `$XDG_CACHE_HOME/oxccl/`, else `~/.cache/oxccl/`, else the
//! temporary directory: [`crate::env::cache_dir`]), keyed by host identity and oxccl version. `OXCCL_CALIBRATE=0` uses the built-in values instead,
//! `=force` measures again. The cache file is [`CpuCosts`]' serde form; one that cannot be
//! read as such is reported (path, line and column) and measured again.
//!
//! Every rank publishes its host's numbers in the peer table, and every rank builds its model
//! from rank 0's, so all ranks of a communicator make the same choices.

use oxccl_core::json;
use oxccl_core::proto;
use oxccl_core::tuner::{CpuCosts, Proto};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The most time the probe may take (each part stops early at its share).
const BUDGET: Duration = Duration::from_millis(200);

fn cache_file(host_id: u64) -> PathBuf {
    let dir = crate::env::cache_dir().unwrap_or_else(|| std::env::temp_dir().join("oxccl"));
    dir.join(format!("calibration-{host_id:016x}-v{}.json", env!("CARGO_PKG_VERSION")))
}

/// The cache file: [`CpuCosts`]' serde form (numbers that are not finite are written `null`).
fn to_json(c: &CpuCosts) -> String {
    json::to_text(c)
}

/// Reads a cache file; the error says what was wrong and where.
fn from_json(t: &str) -> Result<CpuCosts, String> {
    let c: CpuCosts = json::parse(t)?;
    let bad = [
        ("copy_gbs", c.copy_gbs),
        ("hop_us", c.hop_us),
        ("tcp_us", c.tcp_us),
        ("tcp_gbs", c.tcp_gbs),
        ("ll_gbs", c.ll_gbs),
        ("ll128_gbs", c.ll128_gbs),
    ]
    .into_iter()
    .find(|(_, x)| !(x.is_finite() && *x > 0.0));
    match bad {
        Some((k, x)) => Err(format!("\"{k}\" is {x}, not a positive number")),
        None => Ok(c),
    }
}

/// The cached costs in `f`: `None` when there are none; a file that cannot be read as a
/// cache is reported through `warn` (with its path and the place) and then treated as none.
fn cached(f: &Path, warn: &dyn Fn(&str)) -> Option<CpuCosts> {
    let t = std::fs::read_to_string(f).ok()?;
    from_json(&t).map_err(|e| warn(&format!("calibration cache {}: {e}; measuring again", f.display()))).ok()
}

/// Single-thread copy bandwidth of 8 MiB buffers (larger than most L2s), GB/s.
fn copy_gbs(deadline: Instant) -> f64 {
    let n = 8 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
        if Instant::now() > deadline {
            break;
        }
    }
    n as f64 / best / 1e9
}

/// Single-thread throughput of writing then reading one chunk in a flagged format (LL of a
/// 16 KiB slot, LL128 of a 64 KiB slot, as connections use them), best of a few, GB/s.
fn flagged_gbs(p: Proto, deadline: Instant) -> f64 {
    let slot_bytes = 64 << 10;
    let bytes = match p {
        Proto::LL => proto::ll_slot_bytes(slot_bytes),
        _ => proto::ll128_slot_bytes(slot_bytes),
    };
    let len = proto::chunk_capacity(p, slot_bytes);
    let slot: Vec<AtomicU64> = (0..bytes / 8).map(|_| AtomicU64::new(0)).collect();
    let data = vec![5u8; len];
    let mut out = vec![0u8; len];
    let head = proto::ChunkHead { len: len as u32, sig: [0; 3] };
    let mut best = f64::INFINITY;
    for step in 0..20u64 {
        let t = Instant::now();
        let mut prog = proto::Progress::default();
        let done = match p {
            Proto::LL => {
                proto::ll_write(&slot, &head, std::hint::black_box(&data), proto::flag_of(step));
                proto::ll_poll(&slot, proto::flag_of(step), &mut prog, &mut out)
            }
            _ => {
                proto::ll128_write(&slot, &head, std::hint::black_box(&data), step + 1);
                proto::ll128_poll(&slot, step + 1, &mut prog, &mut out)
            }
        };
        std::hint::black_box(&mut out);
        if done {
            best = best.min(t.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            break;
        }
    }
    if best.is_finite() && best > 0.0 {
        len as f64 / best / 1e9
    } else {
        match p {
            Proto::LL => CpuCosts::default().ll_gbs,
            _ => CpuCosts::default().ll128_gbs,
        }
    }
}

/// One-way latency of a hand-off between two threads (spinning briefly, then yielding, as the
/// engine waits), µs.
fn hop_us(deadline: Instant) -> f64 {
    let flag = Arc::new(AtomicU64::new(0));
    let f2 = flag.clone();
    let rounds = 2000u64;
    let wait = |f: &AtomicU64, want: u64| {
        let mut spins = 0u32;
        loop {
            let v = f.load(Ordering::Acquire);
            if v == want || v == u64::MAX {
                return v == want;
            }
            spins += 1;
            if spins > 200 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    };
    let h = std::thread::spawn(move || {
        for i in 0..rounds {
            if !wait(&f2, 2 * i + 1) {
                return;
            }
            f2.store(2 * i + 2, Ordering::Release);
        }
    });
    let t = Instant::now();
    for i in 0..rounds {
        flag.store(2 * i + 1, Ordering::Release);
        wait(&flag, 2 * i + 2);
        if Instant::now() > deadline {
            // Over budget: stop the partner.
            flag.store(u64::MAX, Ordering::Release);
            let _ = h.join();
            return t.elapsed().as_secs_f64() * 1e6 / (2 * (i + 1)) as f64;
        }
    }
    let el = t.elapsed().as_secs_f64();
    let _ = h.join();
    el * 1e6 / (2 * rounds) as f64
}

/// TCP loopback: (one-way latency µs from 1-byte round trips, bandwidth GB/s of 16 MiB);
/// bounded by its fixed sizes and a 2 s read timeout.
fn tcp() -> Option<(f64, f64)> {
    let l = TcpListener::bind("127.0.0.1:0").ok()?;
    let addr = l.local_addr().ok()?;
    let h = std::thread::spawn(move || -> Option<()> {
        let (mut s, _) = l.accept().ok()?;
        s.set_nodelay(true).ok()?;
        let mut b = [0u8; 1];
        for _ in 0..200 {
            s.read_exact(&mut b).ok()?;
            s.write_all(&b).ok()?;
        }
        let mut buf = vec![0u8; 1 << 20];
        let mut left = 16usize << 20;
        while left > 0 {
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            left -= n.min(left);
        }
        s.write_all(&b).ok()
    });
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_nodelay(true).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut b = [7u8; 1];
    let t = Instant::now();
    for _ in 0..200 {
        s.write_all(&b).ok()?;
        s.read_exact(&mut b).ok()?;
    }
    let lat = t.elapsed().as_secs_f64() * 1e6 / 400.0;
    let buf = vec![3u8; 1 << 20];
    let t = Instant::now();
    for _ in 0..16 {
        s.write_all(&buf).ok()?;
    }
    s.read_exact(&mut b).ok()?;
    let bw = (16u64 << 20) as f64 / t.elapsed().as_secs_f64() / 1e9;
    h.join().ok()??;
    Some((lat, bw))
}

/// Measures this host (bounded by [`BUDGET`]).
pub fn measure() -> CpuCosts {
    let deadline = Instant::now() + BUDGET;
    let d = CpuCosts::default();
    let (tcp_us, tcp_gbs) = tcp().unwrap_or((d.tcp_us, d.tcp_gbs));
    CpuCosts {
        copy_gbs: copy_gbs(deadline),
        hop_us: hop_us(deadline),
        tcp_us,
        tcp_gbs,
        ll_gbs: flagged_gbs(Proto::LL, deadline),
        ll128_gbs: flagged_gbs(Proto::LL128, deadline),
        measured: true,
    }
}

/// This host's costs: cached, measured, or the built-in values (`OXCCL_CALIBRATE`). Computed
/// once per process; a cache file that cannot be read as one is reported through `warn` and
/// measured again.
pub fn host_costs(host_id: u64, setting: Option<&str>, warn: &dyn Fn(&str)) -> CpuCosts {
    static C: OnceLock<CpuCosts> = OnceLock::new();
    *C.get_or_init(|| {
        match setting.map(str::trim) {
            Some("0") | Some("off") => return CpuCosts::default(),
            Some("force") => {}
            _ => {
                if let Some(c) = cached(&cache_file(host_id), warn) {
                    return c;
                }
            }
        }
        // One process per host measures (ranks probing at once would slow each other down);
        // the others wait for its result.
        let f = cache_file(host_id);
        let _lock = crate::sys::fd::lock_file(&f.with_extension("lock"), 2 * BUDGET);
        if setting.map(str::trim) != Some("force") {
            if let Some(c) = cached(&f, &|_| {}) {
                return c;
            }
        }
        let c = measure();
        if let Some(dir) = f.parent() {
            let _ = std::fs::create_dir_all(dir);
            // Written whole under a temporary name, then renamed, so readers see all or none.
            let tmp = f.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, to_json(&c)).is_ok() {
                let _ = std::fs::rename(&tmp, &f);
            }
        }
        c
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_bounded_and_its_numbers_round_trip_through_the_cache_format() {
        let t = Instant::now();
        let c = measure();
        assert!(t.elapsed() < Duration::from_secs(5), "probe took {:?}", t.elapsed());
        assert!(c.copy_gbs > 0.01 && c.copy_gbs < 10_000.0, "{c:?}");
        assert!(c.hop_us > 0.0 && c.hop_us < 100_000.0, "{c:?}");
        assert!(c.tcp_us > 0.0 && c.tcp_gbs > 0.0, "{c:?}");
        assert!(c.ll_gbs > 0.0 && c.ll128_gbs > 0.0, "{c:?}");
        assert_eq!(from_json(&to_json(&c)), Ok(c));
    }

    mod cache_format {
        use super::*;
        use proptest::prelude::*;

        fn positive() -> impl Strategy<Value = f64> {
            prop::num::f64::POSITIVE | prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL
        }

        prop_compose! {
            fn costs()(
                copy_gbs in positive(), hop_us in positive(), tcp_us in positive(),
                tcp_gbs in positive(), ll_gbs in positive(), ll128_gbs in positive(),
                measured in any::<bool>(),
            ) -> CpuCosts {
                CpuCosts { copy_gbs, hop_us, tcp_us, tcp_gbs, ll_gbs, ll128_gbs, measured }
            }
        }

        proptest! {
            #[test]
            fn any_costs_round_trip_exactly(c in costs()) {
                prop_assert_eq!(from_json(&to_json(&c)), Ok(c));
            }
        }

        const TEXT: &str = r#"{"copy_gbs":5.5,"hop_us":0.5,"tcp_us":15,"tcp_gbs":2,"ll_gbs":1,"ll128_gbs":4,"measured":true}"#;

        #[test]
        fn the_format_is_the_fields_by_name() {
            let c = CpuCosts {
                copy_gbs: 5.5,
                hop_us: 0.5,
                tcp_us: 15.0,
                tcp_gbs: 2.0,
                ll_gbs: 1.0,
                ll128_gbs: 4.0,
                measured: true,
            };
            assert_eq!(from_json(TEXT), Ok(c));
            assert_eq!(
                to_json(&c),
                r#"{"copy_gbs":5.5,"hop_us":0.5,"tcp_us":15.0,"tcp_gbs":2.0,"ll_gbs":1.0,"ll128_gbs":4.0,"measured":true}"#
            );
            // Written without "measured" (built-in values): false.
            let built_in = TEXT.replace(r#","measured":true"#, "");
            assert_eq!(from_json(&built_in), Ok(CpuCosts { measured: false, ..c }));
        }

        #[test]
        fn bad_numbers_and_malformed_files_are_refused_with_the_place() {
            let inf = CpuCosts { tcp_gbs: f64::INFINITY, ..CpuCosts::default() };
            let text = to_json(&inf);
            assert!(text.contains(r#""tcp_gbs":null"#), "{text}");
            let at = text.find("null").unwrap() + 4;
            assert_eq!(
                from_json(&text),
                Err(format!("invalid type: null, expected f64 at line 1 column {at}"))
            );
            let zero = TEXT.replace(r#""hop_us":0.5"#, r#""hop_us":0"#);
            assert_eq!(from_json(&zero), Err("\"hop_us\" is 0, not a positive number".into()));
            let plus = TEXT.replace(r#""tcp_us":15"#, r#""tcp_us":+15"#);
            let at = plus.find('+').unwrap() + 1;
            assert_eq!(from_json(&plus), Err(format!("expected value at line 1 column {at}")));
            assert_eq!(from_json(&TEXT[..40]), Err("EOF while parsing an object at line 1 column 40".into()));
            assert_eq!(
                from_json("{\"copy_gbs\": -1}"),
                Err("missing field `hop_us` at line 1 column 16".into())
            );
        }

        #[test]
        fn a_broken_cache_file_is_reported_with_its_path_and_measured_again() {
            let f = std::env::temp_dir().join(format!("oxccl-calib-test-{}.json", std::process::id()));
            std::fs::write(&f, "{\"copy_gbs\": 5,\n \"hop_us\": ").unwrap();
            let said = std::cell::RefCell::new(Vec::new());
            assert_eq!(cached(&f, &|w| said.borrow_mut().push(w.to_string())), None);
            assert_eq!(
                said.into_inner(),
                [format!(
                    "calibration cache {}: EOF while parsing a value at line 2 column 11; measuring again",
                    f.display()
                )]
            );
            std::fs::write(&f, TEXT).unwrap();
            assert_eq!(cached(&f, &|w| panic!("{w}")).map(|c| c.copy_gbs), Some(5.5));
            let _ = std::fs::remove_file(&f);
            assert_eq!(cached(&f, &|w| panic!("{w}")), None);
        }
    }
}
