//! `oxccl-gpucheck`: the device side of the GPU check (`bench/gpu/check.sh` runs it on the
//! lent machine). On device 0 it loads the kernels (NVRTC at run time, every kernel resolved at
//! once), checks every reduce-copy kernel bit-exactly against the CPU kernels of oxccl-core
//! (aligned and unaligned, with a ragged tail), then measures, with CUDA events in one run:
//! the driver's device-to-device copy, oxccl's copy kernel, and reduce-copy of 2 and 4 sources
//! (f32 and bf16), as read + write bytes per second and as a ratio to the driver's copy.
//! Exit status 1 if any check fails; without CUDA it says so and exits 2.

use oxccl::cuda::{kernels, CudaError, DevBuf, Device, Event, Stream};
use oxccl_core::reduce::{reduce_many, ReduceCtx};
use oxccl_core::{DataType, ReduceOp};

fn encode(t: DataType, vals: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * t.size_bytes());
    for &v in vals {
        match t {
            DataType::I8 | DataType::U8 => out.push(v as u8),
            DataType::I32 | DataType::U32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DataType::I64 | DataType::U64 => out.extend_from_slice(&v.to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&half::f16::from_f64(v as f64).to_le_bytes()),
            DataType::Bf16 => out.extend_from_slice(&half::bf16::from_f64(v as f64).to_le_bytes()),
            DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DataType::F64 => out.extend_from_slice(&(v as f64).to_le_bytes()),
            _ => unreachable!("no kernel for {t:?}"),
        }
    }
    out
}

/// Source `j`'s element `i`: small integers, exact in every type and in any order of
/// combination (products of at most 8 values in {1, 2}).
fn value(op: ReduceOp, i: usize, j: usize) -> i64 {
    match op {
        ReduceOp::Prod => 1 + ((i + j) % 2) as i64,
        _ => ((i * 7 + j * 13) % 9) as i64 - 4,
    }
}

fn check_kernels(dev: &Device, k: &kernels::Kernels, s: &Stream) -> Result<usize, CudaError> {
    let mut failed = 0;
    let count = (1 << 20) + 3;
    for (t, op) in kernels::variants() {
        let ctx = ReduceCtx::new(t, op, 8).map_err(|e| CudaError::Invalid(e.to_string()))?;
        for nsrc in [1usize, 2, 4, 8] {
            for offset in [0usize, 1] {
                let n = count - offset;
                let hosts: Vec<Vec<u8>> = (0..nsrc)
                    .map(|j| encode(t, &(0..n).map(|i| value(op, i, j)).collect::<Vec<_>>()))
                    .collect();
                let mut want = vec![0u8; n * t.size_bytes()];
                let refs: Vec<&[u8]> = hosts.iter().map(|h| h.as_slice()).collect();
                reduce_many(&ctx, &mut want, &refs);
                // Each source (and the output) starts `offset` elements into its buffer.
                let bufs: Vec<DevBuf> = hosts
                    .iter()
                    .map(|h| {
                        let b = DevBuf::new(dev, (count + 1) * t.size_bytes())?;
                        let mut padded = vec![0u8; offset * t.size_bytes()];
                        padded.extend_from_slice(h);
                        b.upload(&padded)?;
                        Ok(b)
                    })
                    .collect::<Result<_, CudaError>>()?;
                let out = DevBuf::new(dev, (count + 1) * t.size_bytes())?;
                s.fill(out.ptr, 0xA5, out.bytes)?;
                let off = (offset * t.size_bytes()) as u64;
                let srcs: Vec<u64> = bufs.iter().map(|b| b.ptr + off).collect();
                k.reduce(s, t, op, &srcs, out.ptr + off, n)?;
                s.sync()?;
                let mut got = vec![0u8; (offset + n) * t.size_bytes()];
                out.download(&mut got)?;
                if got[offset * t.size_bytes()..] != want[..] {
                    let first = got[offset * t.size_bytes()..]
                        .iter()
                        .zip(&want)
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    println!(
                        "WRONG {t:?} {op:?} sources={nsrc} offset={offset}: first differing byte {first} (element {})",
                        first / t.size_bytes()
                    );
                    failed += 1;
                }
            }
        }
    }
    // The copy kernel, aligned and not.
    for offset in [0usize, 3] {
        let n = (8 << 20) + 5;
        let host: Vec<u8> = (0..n).map(|i| (i * 31 + 7) as u8).collect();
        let a = DevBuf::new(dev, n + 16)?;
        let b = DevBuf::new(dev, n + 16)?;
        let mut padded = vec![0u8; offset];
        padded.extend_from_slice(&host);
        a.upload(&padded)?;
        k.copy(s, b.ptr + offset as u64, a.ptr + offset as u64, n)?;
        s.sync()?;
        let mut got = vec![0u8; offset + n];
        b.download(&mut got)?;
        if got[offset..] != host[..] {
            println!("WRONG copy offset={offset}");
            failed += 1;
        }
    }
    Ok(failed)
}

/// Median milliseconds of `reps` timed runs of `f` (after one warm-up), by CUDA events.
fn time(
    dev: &Device,
    s: &Stream,
    reps: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    f()?;
    s.sync()?;
    let mut v = Vec::new();
    for _ in 0..reps {
        let (a, b) = (Event::new(dev)?, Event::new(dev)?);
        a.record(s)?;
        f()?;
        b.record(s)?;
        v.push(b.since(&a)? as f64);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Ok(v[v.len() / 2])
}

/// All-reduce with 4 ranks as threads on device 0: exact results (small integers, so any
/// order gives the same answer) at several sizes, then the time per call at each size against
/// the bound of reading every input once and writing every output once at `copy_gbs`.
fn threads_all_reduce(copy_gbs: f64) -> Result<usize, CudaError> {
    let p = 4;
    let timeout = Some(std::time::Duration::from_secs(20));
    let members = oxccl::cuda::group::thread_group(p, 0, timeout)?;
    let sizes: Vec<usize> = vec![8, 4096, 1 << 20, 64 << 20, 256 << 20, 1 << 30];
    let types = [DataType::F32, DataType::Bf16];
    let results = std::sync::Mutex::new(Vec::<String>::new());
    let failed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for mut m in members {
            let (results, failed, sizes) = (&results, &failed, &sizes);
            sc.spawn(move || {
                let mut go = || -> Result<(), CudaError> {
                    m.dev.make_current()?;
                    let s = Stream::new(&m.dev)?;
                    // A second stream: every other call switches to it and back.
                    let s2 = Stream::new(&m.dev)?;
                    for t in types {
                        for &bytes in sizes {
                            let n = bytes / t.size_bytes();
                            let send = DevBuf::new(&m.dev, bytes)?;
                            let recv = DevBuf::new(&m.dev, bytes)?;
                            for bps in [1u32, 2] {
                                m.set_blocks_per_sm(bps);
                                // Check: rank r's element i is (i % 7) + r; the sum is 4 (i % 7) + 6.
                                // Then in place on the result: 4 (4 (i % 7) + 6).
                                let check_n = n.min(1 << 22);
                                let vals: Vec<i64> =
                                    (0..check_n).map(|i| (i % 7) as i64 + m.rank as i64).collect();
                                send.upload(&encode(t, &vals))?;
                                m.all_reduce(&s, t, ReduceOp::Sum, send.ptr, recv.ptr, check_n)?;
                                m.all_reduce(&s2, t, ReduceOp::Sum, recv.ptr, recv.ptr, check_n)?;
                                s2.sync()?;
                                let mut got = vec![0u8; check_n * t.size_bytes()];
                                recv.download(&mut got)?;
                                let want = encode(
                                    t,
                                    &(0..check_n).map(|i| 4 * (4 * (i % 7) as i64 + 6)).collect::<Vec<_>>(),
                                );
                                if got != want {
                                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                                    println!(
                                        "WRONG threads all_reduce rank {} {t:?} {check_n} elements blocks/SM {bps}: first differing byte {first}",
                                        m.rank
                                    );
                                }
                                // Time: warm-up, then `iters` calls between two events on each stream.
                                let iters = if bytes <= 1 << 20 { 200 } else { 20 };
                                for _ in 0..5 {
                                    m.all_reduce(&s, t, ReduceOp::Sum, send.ptr, recv.ptr, n)?;
                                }
                                let (a, b) = (Event::new(&m.dev)?, Event::new(&m.dev)?);
                                a.record(&s)?;
                                for _ in 0..iters {
                                    m.all_reduce(&s, t, ReduceOp::Sum, send.ptr, recv.ptr, n)?;
                                }
                                b.record(&s)?;
                                let us = b.since(&a)? as f64 * 1e3 / iters as f64;
                                m.check()?;
                                if m.rank == 0 {
                                    let bound_us = (2 * p * bytes) as f64 / (copy_gbs * 1e9) * 1e6;
                                    results.lock().unwrap().push(format!(
                                        "THREADS all_reduce P={p} {t:?} {bytes} B blocks/SM {bps}: {us:.2} us per call; bound {bound_us:.2} us (read each input once, write each output once at {copy_gbs:.0} GB/s); ratio {:.3}",
                                        us / bound_us
                                    ));
                                }
                            }
                        }
                    }
                    Ok(())
                };
                if let Err(e) = go() {
                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    println!("ERROR threads rank {}: {e}", m.rank);
                }
            });
        }
    });
    for line in results.into_inner().unwrap_or_default() {
        println!("{line}");
    }
    Ok(failed.into_inner())
}

/// A rank whose stream is held up: rank 1's stream waits on a host flag before its call, so
/// rank 0's kernel gives up after the group's 300 ms timeout; the flag is then released and
/// every rank's next call must refuse, naming rank 1. Returns the number of failures.
fn threads_timeout() -> Result<usize, CudaError> {
    let members = oxccl::cuda::group::thread_group(2, 0, Some(std::time::Duration::from_millis(300)))?;
    let (host, dev_flag) = oxccl::cuda::stage::stream_flag()?;
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let host = host as *mut u32 as usize;
    let first = std::sync::Barrier::new(2);
    std::thread::scope(|sc| {
        for m in members {
            let (failed, first) = (&failed, &first);
            sc.spawn(move || {
                let go = || -> Result<(), CudaError> {
                    m.dev.make_current()?;
                    let s = Stream::new(&m.dev)?;
                    let buf = DevBuf::new(&m.dev, 4096)?;
                    s.fill(buf.ptr, 0, 4096)?;
                    if m.rank == 1 {
                        let on = oxccl::cuda::stage::OnDevice::push(0)?;
                        on.wait_flag(0, s.h as usize, dev_flag, 1)?;
                    }
                    m.all_reduce(&s, DataType::F32, ReduceOp::Sum, buf.ptr, buf.ptr, 1024)?;
                    if m.rank == 0 {
                        s.sync()?;
                        let e = m.check().err();
                        println!("TIMEOUT rank 0 after its kernel ended: {e:?}");
                        // SAFETY: the pinned flag word (leaked, so alive).
                        unsafe { (host as *mut u32).write_volatile(1) };
                    }
                    s.sync()?;
                    first.wait();
                    let e = m.all_reduce(&s, DataType::F32, ReduceOp::Sum, buf.ptr, buf.ptr, 1024).err();
                    let named =
                        e.as_ref().is_some_and(|e| e.to_string().contains("for rank 1's kernel to start"));
                    println!("TIMEOUT rank {} next call: {e:?}", m.rank);
                    if !named {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        println!("WRONG timeout rank {}: the next call did not name rank 1", m.rank);
                    }
                    Ok(())
                };
                if let Err(e) = go() {
                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    println!("ERROR timeout rank {}: {e}", m.rank);
                }
            });
        }
    });
    Ok(failed.into_inner())
}

fn run() -> Result<usize, CudaError> {
    let dev = Device::open(0)?;
    let (lib, nv) = oxccl::cuda::nvrtc::version()?;
    println!(
        "device 0: {} (sm_{}{}, {} SMs); driver {} from {}; NVRTC {}.{} from {lib}",
        dev.name,
        dev.cc.0,
        dev.cc.1,
        dev.sms,
        dev.d.version()?,
        dev.d.library(),
        nv.0,
        nv.1
    );
    let s = Stream::new(&dev)?;
    let t0 = std::time::Instant::now();
    let k = kernels::Kernels::load(&dev, &[])?;
    println!(
        "kernels: {} compiled and loaded in {:.2} s",
        kernels::names().len(),
        t0.elapsed().as_secs_f64()
    );
    let failed = check_kernels(&dev, &k, &s)?;
    println!(
        "CHECK {} reduce-copy variants x 4 source counts x 2 alignments + copy: {failed} wrong",
        kernels::variants().len()
    );

    // Bandwidth, one run, side by side.
    let gib = 1usize << 30;
    let a = DevBuf::new(&dev, gib)?;
    let b = DevBuf::new(&dev, gib)?;
    s.fill(a.ptr, 1, gib)?;
    let reps = 10;
    let ms = time(&dev, &s, reps, || s.copy(b.ptr, a.ptr, gib))?;
    let copy_gbs = 2.0 * gib as f64 / (ms * 1e-3) / 1e9;
    println!("BW driver copy (cuMemcpyDtoDAsync) 1 GiB: {ms:.3} ms, {copy_gbs:.0} GB/s (read + write)");
    let ratio = |gbs: f64| gbs / copy_gbs;
    for unroll in [1, 2, 4, 8] {
        let kk = kernels::Kernels::load(&dev, &[format!("OX_UNROLL={unroll}")])?;
        let ms = time(&dev, &s, reps, || kk.copy(&s, b.ptr, a.ptr, gib))?;
        let gbs = 2.0 * gib as f64 / (ms * 1e-3) / 1e9;
        println!(
            "BW copy kernel unroll={unroll} 1 GiB: {ms:.3} ms, {gbs:.0} GB/s, {:.3} of the driver's copy",
            ratio(gbs)
        );
        for (t, nsrc) in [(DataType::F32, 2usize), (DataType::F32, 4), (DataType::Bf16, 4)] {
            let each = 256usize << 20;
            let srcs: Vec<DevBuf> = (0..nsrc).map(|_| DevBuf::new(&dev, each)).collect::<Result<_, _>>()?;
            for x in &srcs {
                s.fill(x.ptr, 0, each)?;
            }
            let out = DevBuf::new(&dev, each)?;
            let ptrs: Vec<u64> = srcs.iter().map(|x| x.ptr).collect();
            let n = each / t.size_bytes();
            let ms = time(&dev, &s, reps, || kk.reduce(&s, t, ReduceOp::Sum, &ptrs, out.ptr, n))?;
            let gbs = ((nsrc + 1) * each) as f64 / (ms * 1e-3) / 1e9;
            println!(
                "BW reduce {t:?} sum {nsrc} sources x 256 MiB unroll={unroll}: {ms:.3} ms, {gbs:.0} GB/s ({nsrc} reads + 1 write), {:.3} of the driver's copy",
                ratio(gbs)
            );
        }
    }
    let threads_failed = threads_all_reduce(copy_gbs)?;
    println!("CHECK threads all_reduce: {threads_failed} wrong");
    let timeout_failed = threads_timeout()?;
    println!("CHECK threads timeout names the held-up rank: {timeout_failed} wrong");
    Ok(failed + threads_failed + timeout_failed)
}

fn main() {
    match run() {
        Ok(0) => println!("GPU CHECK PASSED"),
        Ok(n) => {
            println!("GPU CHECK FAILED: {n} wrong");
            std::process::exit(1);
        }
        Err(e @ CudaError::NoCuda(_)) => {
            eprintln!("oxccl-gpucheck: {e}");
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("oxccl-gpucheck: {e}");
            std::process::exit(1);
        }
    }
}
