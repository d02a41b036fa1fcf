//! `oxccl-gpucheck`: the device side of the GPU check (`bench/gpu/check.sh` runs it on the
//! lent machine). On device 0 it loads the kernels (NVRTC at run time, every kernel resolved at
//! once), checks every reduce-copy kernel bit-exactly against the CPU kernels of oxccl-core
//! (aligned and unaligned, with a ragged tail), then measures, with CUDA events in one run:
//! the driver's device-to-device copy, oxccl's copy kernel, and reduce-copy of 2 and 4 sources
//! (f32 and bf16), as read + write bytes per second and as a ratio to the driver's copy.
//! Exit status 1 if any check fails; without CUDA it says so and exits 2. `--help` prints
//! [`USAGE`] (stdout, exit 0); an argument it does not know is an error (stderr, exit 2).

#[cfg(test)]
oxccl_testkit::test_scope!();

mod sigpipe;

use oxccl::cuda::kernels::{Kop, Sync};
use oxccl::cuda::{kernels, CudaError, DevBuf, Device, Event, Stream};
use oxccl_core::plan::device::Task;
use oxccl_core::reduce::{finalize, reduce_many, ReduceCtx};
use oxccl_core::{DataType, ReduceOp};

const USAGE: &str = "\
usage: oxccl-gpucheck [--threads-only]
         check every kernel on device 0 bit-exactly and measure it (--threads-only: only the
         thread-group checks); exit status 1 if a check fails, 2 without CUDA
       oxccl-gpucheck --cubin ARCH FILE [DEFINE...]
         compile every kernel for ARCH with NVRTC (no GPU needed) and write the CUBIN to FILE";

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
            DataType::F8E4M3 => out.push(oxccl_core::fp8::F8E4M3::from_f32(v as f32).0),
            DataType::F8E5M2 => out.push(oxccl_core::fp8::F8E5M2::from_f32(v as f32).0),
        }
    }
    out
}

/// Source `j`'s element `i`: small integers, exact in every type and in any order of
/// combination (products of at most 8 values in {1, 2}; fp8 sums of at most 8 values in
/// {-1, 0, 1}).
fn value(t: DataType, op: ReduceOp, i: usize, j: usize) -> i64 {
    match op {
        ReduceOp::Prod => 1 + ((i + j) % 2) as i64,
        _ if matches!(t, DataType::F8E4M3 | DataType::F8E5M2) => ((i * 7 + j * 13) % 3) as i64 - 1,
        _ => ((i * 7 + j * 13) % 9) as i64 - 4,
    }
}

/// The CPU's answer for a launch of `(t, kop)` over `srcs`: PreMulSum scales each source
/// (oxccl-core's rule), Avg divides by the source count (`finalize`).
fn reference(t: DataType, kop: Kop, srcs: &[Vec<u8>], scalar: &[u8]) -> Vec<u8> {
    let (op, scaled): (ReduceOp, Vec<Vec<u8>>) = match kop {
        Kop::Op(o) => (o, srcs.to_vec()),
        Kop::PreMulSum => {
            (ReduceOp::Sum, srcs.iter().map(|s| oxccl_core::premul::scaled(t, scalar, s)).collect())
        }
    };
    let ctx = ReduceCtx::new(t, op, srcs.len() as u32).expect("a valid operator");
    let mut out = vec![0u8; srcs[0].len()];
    let refs: Vec<&[u8]> = scaled.iter().map(|v| v.as_slice()).collect();
    reduce_many(&ctx, &mut out, &refs);
    finalize(&ctx, &mut out);
    out
}

fn check_kernels(dev: &Device, k: &kernels::Kernels, s: &Stream) -> Result<usize, CudaError> {
    let mut failed = 0;
    let count = (1 << 18) + 3;
    let es_max = 8;
    let bufs: Vec<DevBuf> =
        (0..9).map(|_| DevBuf::new(dev, (count + 1) * es_max)).collect::<Result<_, _>>()?;
    for (t, kop) in kernels::variants() {
        let op = match kop {
            Kop::Op(o) => o,
            Kop::PreMulSum => ReduceOp::Sum,
        };
        let es = t.size_bytes();
        let scalar = encode(t, &[2]);
        let mut bits = [0u8; 8];
        bits[..es].copy_from_slice(&scalar);
        for nsrc in [1usize, 2, 3, 8] {
            for offset in [0usize, 1] {
                let n = count - offset;
                let hosts: Vec<Vec<u8>> = (0..nsrc)
                    .map(|j| encode(t, &(0..n).map(|i| value(t, op, i, j)).collect::<Vec<_>>()))
                    .collect();
                let want = reference(t, kop, &hosts, &scalar);
                // Each source (and the output) starts `offset` elements into its buffer.
                let off = (offset * es) as u64;
                for (h, b) in hosts.iter().zip(&bufs) {
                    s.upload(b.ptr + off, h)?;
                }
                let out = &bufs[8];
                s.fill(out.ptr, 0xA5, out.bytes)?;
                let srcs: Vec<u64> = bufs[..nsrc].iter().map(|b| b.ptr + off).collect();
                let task = Task::reduce(srcs, vec![out.ptr + off], n);
                let div = if kop == Kop::Op(ReduceOp::Avg) { nsrc as u32 } else { 0 };
                k.run(s, t, kop, &[task], u64::from_le_bytes(bits), div, k.blocks, &Sync::default())?;
                let mut got = vec![0u8; n * es];
                s.download(&mut got, out.ptr + off)?;
                if got != want {
                    let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                    println!(
                        "WRONG {t:?} {kop:?} sources={nsrc} offset={offset}: first differing byte {first} (element {}): got {:?} want {:?}",
                        first / es,
                        &got[first / es * es..first / es * es + es],
                        &want[first / es * es..first / es * es + es]
                    );
                    failed += 1;
                }
            }
        }
    }
    // One launch of several tasks: a reduction, a byte copy to two places, an unaligned copy.
    let n = 100_003usize;
    let a: Vec<u8> = encode(DataType::F32, &(0..n).map(|i| (i % 5) as i64).collect::<Vec<_>>());
    let b2: Vec<u8> = encode(DataType::F32, &(0..n).map(|i| (i % 3) as i64).collect::<Vec<_>>());
    s.upload(bufs[0].ptr, &a)?;
    s.upload(bufs[1].ptr, &b2)?;
    for x in &bufs[2..6] {
        s.fill(x.ptr, 0, x.bytes)?;
    }
    let tasks = [
        Task::reduce(vec![bufs[0].ptr, bufs[1].ptr], vec![bufs[2].ptr], n),
        Task::copy(bufs[0].ptr, vec![bufs[3].ptr, bufs[4].ptr], n * 4),
        Task::copy(bufs[1].ptr + 1, vec![bufs[5].ptr + 3], n * 4 - 1),
    ];
    k.run(s, DataType::F32, Kop::Op(ReduceOp::Sum), &tasks, 0, 0, k.blocks, &Sync::default())?;
    let get = |b: &DevBuf, at: u64, len: usize| -> Result<Vec<u8>, CudaError> {
        let mut v = vec![0u8; len];
        s.download(&mut v, b.ptr + at)?;
        Ok(v)
    };
    let sum = reference(DataType::F32, Kop::Op(ReduceOp::Sum), &[a.clone(), b2.clone()], &[]);
    let ok = get(&bufs[2], 0, n * 4)? == sum
        && get(&bufs[3], 0, n * 4)? == a
        && get(&bufs[4], 0, n * 4)? == a
        && get(&bufs[5], 3, n * 4 - 1)? == b2[1..];
    if !ok {
        println!("WRONG a launch of three tasks (reduce, copy to two, unaligned copy)");
        failed += 1;
    }
    // The copy kernel, aligned and not.
    for offset in [0usize, 3] {
        let n = (8 << 20) + 5;
        let host: Vec<u8> = (0..n).map(|i| (i * 31 + 7) as u8).collect();
        let a = DevBuf::new(dev, n + 16)?;
        let b = DevBuf::new(dev, n + 16)?;
        s.upload(a.ptr + offset as u64, &host)?;
        k.copy(s, b.ptr + offset as u64, a.ptr + offset as u64, n)?;
        let mut got = vec![0u8; n];
        s.download(&mut got, b.ptr + offset as u64)?;
        if got != host {
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
    let sizes: Vec<usize> =
        vec![8, 4096, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 64 << 20, 256 << 20, 1 << 30];
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
                    // Buffers for the largest size, allocated once: cuMemFree waits for the
                    // whole device, so a rank freeing between calls would wait for kernels
                    // that wait for its own next call (see docs/devices.md).
                    let most = sizes.iter().copied().max().unwrap_or(0);
                    let send = DevBuf::new(&m.dev, most)?;
                    let recv = DevBuf::new(&m.dev, most)?;
                    // Chains: 25 in-place f64 sums back to back, switching streams every call,
                    // 10 times per size (LL and LL128 sizes, lengths not a multiple of a line):
                    // after the first each multiplies by 4, so a line read from an earlier
                    // call (a quarter of the value) or torn cannot go unnoticed. f64 keeps
                    // (4 * 6 + 6) * 4^24 exact.
                    for &bytes in &[8usize, 4096, 16 << 10, (16 << 10) + 8, 100_008, 256 << 10] {
                        let n = bytes / 8;
                        for rep in 0..10 {
                            let vals: Vec<i64> = (0..n).map(|i| (i % 7) as i64 + m.rank as i64).collect();
                            s.upload(recv.ptr, &encode(DataType::F64, &vals))?;
                            let mut last = &s;
                            for k in 0..25 {
                                last = if k % 2 == 0 { &s } else { &s2 };
                                m.all_reduce(last, DataType::F64, ReduceOp::Sum, recv.ptr, recv.ptr, n)?;
                            }
                            let mut got = vec![0u8; bytes];
                            // On the last call's stream: work after it there sees its result.
                            last.download(&mut got, recv.ptr)?;
                            let want = encode(
                                DataType::F64,
                                &(0..n).map(|i| (4 * (i % 7) as i64 + 6) << 48).collect::<Vec<_>>(),
                            );
                            if got != want {
                                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                                println!(
                                    "WRONG threads chain rank {} {bytes} B repetition {rep}: first differing byte {first}",
                                    m.rank
                                );
                            }
                        }
                    }
                    if m.rank == 0 {
                        results.lock().unwrap().push(
                            "THREADS chains: 6 sizes x 10 x 25 in-place f64 all-reduces, streams switched every call: checked".into(),
                        );
                    }
                    // A group of a collective and sends/receives (one launch: the receives'
                    // copies ride in the all-reduce's launch): 1 MiB f32 all-reduce in place,
                    // and 4096 f32 to the next rank from the previous, 10 times, streams
                    // switched each time.
                    {
                        use oxccl::cuda::call::DevCall;
                        use oxccl_core::plan::device::DeviceColl;
                        let (n, k) = (1usize << 18, 4096usize);
                        let (next, prev) = ((m.rank + 1) % p, (m.rank + p - 1) % p);
                        let (msg, got_at) = (send.ptr + (n * 4) as u64, send.ptr + (2 * n * 4) as u64);
                        for rep in 0..10 {
                            let st = if rep % 2 == 0 { &s } else { &s2 };
                            let vals: Vec<i64> = (0..n).map(|i| (i % 7) as i64 + m.rank as i64).collect();
                            st.upload(send.ptr, &encode(DataType::F32, &vals))?;
                            let ring: Vec<i64> = (0..k).map(|i| (i % 5) as i64 + 10 * m.rank as i64 + rep).collect();
                            st.upload(msg, &encode(DataType::F32, &ring))?;
                            let calls = [
                                DevCall::coll(DeviceColl::AllReduce, DataType::F32, ReduceOp::Sum, n, send.ptr, send.ptr),
                                DevCall::send(next, DataType::F32, k, msg),
                                DevCall::recv(prev, DataType::F32, k, got_at),
                            ];
                            m.run(st, &calls)?;
                            let mut got = vec![0u8; n * 4];
                            st.download(&mut got, send.ptr)?;
                            let sum = encode(DataType::F32, &(0..n).map(|i| 4 * (i % 7) as i64 + 6).collect::<Vec<_>>());
                            let mut got_msg = vec![0u8; k * 4];
                            st.download(&mut got_msg, got_at)?;
                            let want_msg = encode(
                                DataType::F32,
                                &(0..k).map(|i| (i % 5) as i64 + 10 * prev as i64 + rep).collect::<Vec<_>>(),
                            );
                            if got != sum || got_msg != want_msg {
                                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                println!(
                                    "WRONG threads mixed group rank {} repetition {rep}: all-reduce {}, receive {}",
                                    m.rank,
                                    if got == sum { "right" } else { "wrong" },
                                    if got_msg == want_msg { "right" } else { "wrong" }
                                );
                            }
                        }
                        if m.rank == 0 {
                            results.lock().unwrap().push(
                                "THREADS mixed group: 1 MiB all-reduce + 16 KiB ring send/recv in one group, 10 x: checked".into(),
                            );
                        }
                    }
                    // All-to-all in place on even ranks, out of place on odd ones (NCCL lets
                    // each rank choose): blocks of 3, 1000 and 2^18 + 5 f32 (unaligned tails),
                    // 5 times each, streams switched each time. Rank r's block q holds
                    // 1000 r + 10 q + (i % 7) + rep: every block is told from every other.
                    {
                        use oxccl::cuda::call::DevCall;
                        use oxccl_core::plan::device::DeviceColl;
                        let r = m.rank;
                        for n in [3usize, 1000, (1 << 18) + 5] {
                            for rep in 0..5i64 {
                                let st = if rep % 2 == 0 { &s } else { &s2 };
                                let block = |from: usize, to: usize| -> Vec<i64> {
                                    (0..n).map(|i| 1000 * from as i64 + 10 * to as i64 + (i % 7) as i64 + rep).collect()
                                };
                                let mine: Vec<i64> = (0..p).flat_map(|q| block(r, q)).collect();
                                let want = encode(DataType::F32, &(0..p).flat_map(|q| block(q, r)).collect::<Vec<_>>());
                                st.upload(send.ptr, &encode(DataType::F32, &mine))?;
                                let out = if r % 2 == 0 { send.ptr } else { recv.ptr };
                                let call = DevCall::coll(DeviceColl::AllToAll, DataType::F32, ReduceOp::Sum, n, send.ptr, out);
                                m.run(st, &[call])?;
                                let mut got = vec![0u8; n * p * 4];
                                st.download(&mut got, out)?;
                                if got != want {
                                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                                    println!(
                                        "WRONG threads all_to_all rank {r} ({}) {n} per block repetition {rep}: first differing byte {first}",
                                        if r % 2 == 0 { "in place" } else { "out of place" }
                                    );
                                }
                            }
                        }
                        if r == 0 {
                            results.lock().unwrap().push(
                                "THREADS all_to_all: in place on even ranks, out of place on odd, 3 sizes x 5: checked".into(),
                            );
                        }
                    }
                    for t in types {
                        for &bytes in sizes {
                            let n = bytes / t.size_bytes();
                            use oxccl::cuda::group::{LL128_MAX_BYTES, LL_MAX_BYTES};
                            let line = if bytes <= LL_MAX_BYTES {
                                Some("LL")
                            } else if bytes <= LL128_MAX_BYTES {
                                Some("LL128")
                            } else {
                                None
                            };
                            for (alone, lines) in [(true, true), (false, true), (false, false)] {
                                if lines && line.is_none() {
                                    continue;
                                }
                                m.set_blocks_per_sm(1);
                                m.set_ll(lines && line == Some("LL"));
                                m.set_ll128(lines && line == Some("LL128"));
                                m.set_ll_alone(alone);
                                let proto = match (lines, alone) {
                                    (true, true) => line.unwrap_or_default().to_string(),
                                    (true, false) => format!("{}-met", line.unwrap_or_default()),
                                    _ => "Simple".to_string(),
                                };
                                // Check: rank r's element i is (i % 7) + r; the sum is 4 (i % 7) + 6.
                                // Then in place on the result: 4 (4 (i % 7) + 6).
                                let check_n = n.min(1 << 22);
                                let vals: Vec<i64> =
                                    (0..check_n).map(|i| (i % 7) as i64 + m.rank as i64).collect();
                                s.upload(send.ptr, &encode(t, &vals))?;
                                m.all_reduce(&s, t, ReduceOp::Sum, send.ptr, recv.ptr, check_n)?;
                                m.all_reduce(&s2, t, ReduceOp::Sum, recv.ptr, recv.ptr, check_n)?;
                                let mut got = vec![0u8; check_n * t.size_bytes()];
                                s2.download(&mut got, recv.ptr)?;
                                let want = encode(
                                    t,
                                    &(0..check_n).map(|i| 4 * (4 * (i % 7) as i64 + 6)).collect::<Vec<_>>(),
                                );
                                if got != want {
                                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                                    println!(
                                        "WRONG threads all_reduce rank {} {t:?} {check_n} elements {proto}: first differing byte {first}",
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
                                let host = std::time::Instant::now();
                                for _ in 0..iters {
                                    m.all_reduce(&s, t, ReduceOp::Sum, send.ptr, recv.ptr, n)?;
                                }
                                // Host time to issue the calls: equal to the GPU's when the
                                // calls are host-bound (small sizes).
                                let host_us = host.elapsed().as_secs_f64() * 1e6 / iters as f64;
                                b.record(&s)?;
                                let us = b.since(&a)? as f64 * 1e3 / iters as f64;
                                m.check()?;
                                if m.rank == 0 {
                                    let bound_us = (2 * p * bytes) as f64 / (copy_gbs * 1e9) * 1e6;
                                    results.lock().unwrap().push(format!(
                                        "THREADS all_reduce P={p} {t:?} {bytes} B {proto}: {us:.2} us per call (host issues one in {host_us:.2} us); bound {bound_us:.2} us (read each input once, write each output once at {copy_gbs:.0} GB/s); ratio {:.3}",
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

/// The floor under a small all-reduce's time: the same 8-byte LL call in 1-rank groups, so
/// the same launch and event record with no other rank to wait for; once from one thread,
/// then from 4 threads at once (each its own group and stream), as the 4 ranks issue theirs.
fn threads_floor() -> Result<(), CudaError> {
    for threads in [1usize, 4] {
        let results = std::sync::Mutex::new(Vec::<f64>::new());
        std::thread::scope(|sc| {
            for _ in 0..threads {
                let results = &results;
                sc.spawn(move || {
                    let go = || -> Result<f64, CudaError> {
                        let m = oxccl::cuda::group::thread_group(1, 0, None)?.remove(0);
                        m.dev.make_current()?;
                        let s = Stream::new(&m.dev)?;
                        let buf = DevBuf::new(&m.dev, 64)?;
                        s.fill(buf.ptr, 0, 64)?;
                        for _ in 0..20 {
                            m.all_reduce(&s, DataType::F32, ReduceOp::Sum, buf.ptr, buf.ptr, 2)?;
                        }
                        let (a, b) = (Event::new(&m.dev)?, Event::new(&m.dev)?);
                        a.record(&s)?;
                        let iters = 500;
                        for _ in 0..iters {
                            m.all_reduce(&s, DataType::F32, ReduceOp::Sum, buf.ptr, buf.ptr, 2)?;
                        }
                        b.record(&s)?;
                        Ok(b.since(&a)? as f64 * 1e3 / iters as f64)
                    };
                    match go() {
                        Ok(us) => results.lock().unwrap().push(us),
                        Err(e) => println!("ERROR floor: {e}"),
                    }
                });
            }
        });
        let r = results.into_inner().unwrap();
        let mean = r.iter().sum::<f64>() / r.len().max(1) as f64;
        println!(
            "THREADS uncoupled: {threads} thread(s), each a 1-rank group on its own stream, 8 B LL all-reduce (the same launch and record, no other rank): {mean:.2} us per call"
        );
    }
    Ok(())
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
                    let named = e.as_ref().is_some_and(|e| {
                        let e = e.to_string();
                        e.contains("for rank 1's kernel to start") || e.contains("for rank 1's data")
                    });
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

/// Ranks whose calls differ, without the host meeting a lone small all-reduce skips: (a) two
/// LL all-reduces of different counts: both calls return, both kernels end at once (they
/// compare signatures), and the next check names both calls; (b) the same call, one rank
/// with LL off, so it runs LL128: named alike; (c) one rank runs it as LL, the other (LL and
/// LL128 off) comes to the host meeting: one of them must say the calls differ. Every
/// stream must drain well within the group's 10 s timeout (a waiting kernel is told to give
/// up). Returns the number of failures.
fn threads_mismatch() -> Result<usize, CudaError> {
    let failed = std::sync::atomic::AtomicUsize::new(0);
    for case in ["counts", "ll-vs-ll128", "ll-vs-meeting"] {
        let members = oxccl::cuda::group::thread_group(2, 0, Some(std::time::Duration::from_secs(10)))?;
        let errors = std::sync::Mutex::new(Vec::<String>::new());
        let t0 = std::time::Instant::now();
        std::thread::scope(|sc| {
            for mut m in members {
                let (failed, errors) = (&failed, &errors);
                sc.spawn(move || {
                    let mut go = || -> Result<(), CudaError> {
                        m.dev.make_current()?;
                        let s = Stream::new(&m.dev)?;
                        let buf = DevBuf::new(&m.dev, 64)?;
                        s.fill(buf.ptr, 0, 64)?;
                        let n = if case == "counts" { 2 + m.rank } else { 2 };
                        if case != "counts" {
                            m.set_ll(m.rank == 0);
                        }
                        if case == "ll-vs-meeting" {
                            m.set_ll128(m.rank == 0);
                        }
                        if let Err(e) = m.all_reduce(&s, DataType::F32, ReduceOp::Sum, buf.ptr, buf.ptr, n) {
                            errors.lock().unwrap().push(format!("rank {} call: {e}", m.rank));
                        }
                        s.sync()?;
                        if let Err(e) = m.check() {
                            errors.lock().unwrap().push(format!("rank {} check: {e}", m.rank));
                        }
                        Ok(())
                    };
                    if let Err(e) = go() {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        println!("ERROR mismatch {case} rank {}: {e}", m.rank);
                    }
                });
            }
        });
        let took = t0.elapsed();
        let errors = errors.into_inner().unwrap();
        for e in &errors {
            println!("MISMATCH {case}: {e}");
        }
        let named = match case {
            "counts" => {
                errors.iter().filter(|e| e.contains("check:") && e.contains("calls differ")).count() == 2
                    && errors.iter().any(|e| e.contains("2 x float with sum (LL)") && e.contains("3 x float"))
            }
            "ll-vs-ll128" => {
                errors.iter().filter(|e| e.contains("check:") && e.contains("calls differ")).count() == 2
                    && errors.iter().any(|e| e.contains("(LL)") && e.contains("(LL128)"))
            }
            _ => {
                errors.iter().any(|e| e.contains("call:") && e.contains("calls differ at collective call 1"))
            }
        };
        println!("MISMATCH {case}: every stream drained in {:.1} ms", took.as_secs_f64() * 1e3);
        if !named || took > std::time::Duration::from_secs(5) {
            failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            println!("WRONG mismatch {case}: not named as differing calls, or the streams took {took:?}");
        }
    }
    Ok(failed.into_inner())
}

fn run(threads_only: bool) -> Result<usize, CudaError> {
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
    if threads_only {
        let a = DevBuf::new(&dev, 1 << 30)?;
        let b = DevBuf::new(&dev, 1 << 30)?;
        let ms = time(&dev, &s, 10, || s.copy(b.ptr, a.ptr, 1 << 30))?;
        let copy_gbs = 2.0 * (1u64 << 30) as f64 / (ms * 1e-3) / 1e9;
        println!("BW driver copy (cuMemcpyDtoDAsync) 1 GiB: {ms:.3} ms, {copy_gbs:.0} GB/s (read + write)");
        drop((a, b));
        threads_floor()?;
        let threads_failed = threads_all_reduce(copy_gbs)?;
        println!("CHECK threads all_reduce: {threads_failed} wrong");
        let timeout_failed = threads_timeout()?;
        println!("CHECK threads timeout names the held-up rank: {timeout_failed} wrong");
        let mismatch_failed = threads_mismatch()?;
        println!("CHECK threads differing calls are named, nothing hangs: {mismatch_failed} wrong");
        return Ok(threads_failed + timeout_failed + mismatch_failed);
    }
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
    let ms = time(&dev, &s, reps, || k.copy(&s, b.ptr, a.ptr, gib))?;
    let gbs = 2.0 * gib as f64 / (ms * 1e-3) / 1e9;
    println!("BW copy kernel 1 GiB: {ms:.3} ms, {gbs:.0} GB/s, {:.3} of the driver's copy", ratio(gbs));
    // The copy tasks of the work-list kernels (what broadcast, all-gather and the rest run).
    let task = Task::copy(a.ptr, vec![b.ptr], gib);
    let ms = time(&dev, &s, reps, || {
        k.run(
            &s,
            DataType::U8,
            Kop::Op(ReduceOp::Sum),
            std::slice::from_ref(&task),
            0,
            0,
            k.blocks,
            &Sync::default(),
        )
    })?;
    let gbs = 2.0 * gib as f64 / (ms * 1e-3) / 1e9;
    println!("BW copy task 1 GiB: {ms:.3} ms, {gbs:.0} GB/s, {:.3} of the driver's copy", ratio(gbs));
    // Reduce-copy bandwidth of the default build, then of other builds of the same kernels
    // (defines), compiled with only the measured kernels (a few seconds each).
    let each = 256usize << 20;
    let srcs: Vec<DevBuf> = (0..4).map(|_| DevBuf::new(&dev, each)).collect::<Result<_, _>>()?;
    for x in &srcs {
        s.fill(x.ptr, 0x3c, each)?;
    }
    let out = DevBuf::new(&dev, each)?;
    let cases = [
        (DataType::F32, 2usize),
        (DataType::F32, 4),
        (DataType::Bf16, 4),
        (DataType::F16, 4),
        (DataType::Bf16, 2),
    ];
    let measure = |kk: &kernels::Kernels, label: &str| -> Result<(), CudaError> {
        let ms = time(&dev, &s, reps, || kk.copy(&s, b.ptr, a.ptr, gib))?;
        let gbs = 2.0 * gib as f64 / (ms * 1e-3) / 1e9;
        let mut line = format!("BW {label:<56} copy {gbs:.0} GB/s {:.3} |", ratio(gbs));
        for (t, nsrc) in cases {
            let ptrs: Vec<u64> = srcs[..nsrc].iter().map(|x| x.ptr).collect();
            let n = each / t.size_bytes();
            let ms = time(&dev, &s, reps, || kk.reduce(&s, t, ReduceOp::Sum, &ptrs, out.ptr, n))?;
            let gbs = ((nsrc + 1) * each) as f64 / (ms * 1e-3) / 1e9;
            line += &format!(" {t}x{nsrc} {gbs:.0} GB/s {:.3} |", ratio(gbs));
        }
        println!("{line}");
        Ok(())
    };
    measure(&k, "default build")?;
    let mut which: Vec<(DataType, Kop)> = cases.iter().map(|&(t, _)| (t, Kop::Op(ReduceOp::Sum))).collect();
    which.dedup();
    which.sort_by_key(|w| w.0 as u8);
    which.dedup();
    for defines in [
        vec!["OX_UNROLL=8", "OX_PAIR=0", "OX_TYPED_UNROLL=0", "OX_COPY_UNROLL=4"],
        vec!["OX_UNROLL=8", "OX_PAIR=1", "OX_TYPED_UNROLL=0", "OX_COPY_UNROLL=16"],
        vec!["OX_UNROLL=8", "OX_PAIR=1", "OX_TYPED_UNROLL=1", "OX_COPY_UNROLL=2"],
        vec!["OX_UNROLL=4", "OX_PAIR=1", "OX_TYPED_UNROLL=0", "OX_COPY_UNROLL=1"],
        vec!["OX_UNROLL=4", "OX_PAIR=1", "OX_TYPED_UNROLL=1", "OX_MINBLOCKS=2"],
        vec!["OX_UNROLL=2", "OX_PAIR=1", "OX_TYPED_UNROLL=0", "OX_MINBLOCKS=2"],
    ] {
        let d: Vec<String> = defines.iter().map(|x| x.to_string()).collect();
        let kk = kernels::Kernels::load_only(&dev, &d, &which)?;
        measure(&kk, &defines.join(" "))?;
    }
    threads_floor()?;
    let threads_failed = threads_all_reduce(copy_gbs)?;
    println!("CHECK threads all_reduce: {threads_failed} wrong");
    let timeout_failed = threads_timeout()?;
    println!("CHECK threads timeout names the held-up rank: {timeout_failed} wrong");
    let mismatch_failed = threads_mismatch()?;
    println!("CHECK threads differing calls are named, nothing hangs: {mismatch_failed} wrong");
    Ok(failed + threads_failed + timeout_failed + mismatch_failed)
}

/// `oxccl-gpucheck --cubin ARCH FILE [DEFINE...]`: compiles every kernel for ARCH with NVRTC
/// (no GPU needed) and writes the CUBIN, for `cuobjdump --dump-resource-usage` and SASS.
fn cubin(args: &[String]) -> i32 {
    let (Some(arch), Some(file)) = (args.first(), args.get(1)) else {
        eprintln!("{USAGE}");
        return 2;
    };
    // OXCCL_CUBIN_ONLY=sum_f32,avg_bf16: only those kernels (a quick look at a few).
    let only: Option<Vec<(DataType, Kop)>> = std::env::var("OXCCL_CUBIN_ONLY").ok().map(|v| {
        kernels::variants()
            .into_iter()
            .filter(|&(t, op)| {
                kernels::reduce_name(t, op).is_some_and(|n| v.split(',').any(|x| n == format!("oxk_{x}")))
            })
            .collect()
    });
    let built = match &only {
        Some(w) => kernels::cubin_of(w, arch, &args[2..]),
        None => kernels::cubin(arch, &args[2..]),
    };
    match built {
        Ok(b) => match std::fs::write(file, &*b) {
            Ok(()) => {
                println!("{file}: {} bytes, {} kernels for {arch}", b.len(), kernels::names().len());
                0
            }
            Err(e) => {
                eprintln!("oxccl-gpucheck: {file}: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("oxccl-gpucheck: {e}");
            1
        }
    }
}

fn main() {
    sigpipe::restore_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads_only = match args.first().map(String::as_str) {
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return;
        }
        Some("--cubin") => std::process::exit(cubin(&args[1..])),
        None => false,
        Some("--threads-only") if args.len() == 1 => true,
        Some(_) => {
            eprintln!("oxccl-gpucheck: unexpected arguments {:?}\n{USAGE}", &args[..]);
            std::process::exit(2);
        }
    };
    match run(threads_only) {
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
