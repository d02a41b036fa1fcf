//! Single-thread cost of writing and reading one LL / LL128 chunk (`cargo run --release -p
//! oxccl-core --example llbench`): the encoding's own throughput, no second core involved.
use oxccl_core::proto::*;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

fn run(name: &str, slot_bytes: usize, len: usize, n: u64, ll: bool) {
    let slot: Vec<AtomicU64> = (0..slot_bytes / 8).map(|_| AtomicU64::new(0)).collect();
    let data = vec![7u8; len];
    let mut out = vec![0u8; len];
    let h = ChunkHead { len: len as u32, sig: [1, 2, 3] };
    let t = Instant::now();
    for i in 0..n {
        let mut p = Progress::default();
        if ll {
            ll_write(&slot, &h, &data, flag_of(i));
            assert!(ll_poll(&slot, flag_of(i), &mut p, &mut out));
        } else {
            ll128_write(&slot, &h, &data, i + 1);
            assert!(ll128_poll(&slot, i + 1, &mut p, &mut out));
        }
    }
    let dt = t.elapsed().as_secs_f64();
    println!(
        "{name} write+read {len} B: {:.2} us, {:.2} GB/s",
        dt / n as f64 * 1e6,
        len as f64 * n as f64 / dt / 1e9
    );
}

fn main() {
    run("LL", 16384, 8160, 20000, true);
    run("LL128", 65536, 61320, 5000, false);
}
