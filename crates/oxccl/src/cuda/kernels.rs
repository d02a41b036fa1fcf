//! oxccl's copy and reduce-copy kernels: CUDA C (`kernels.cu` plus one instantiation per
//! operator and type, listed here), compiled by NVRTC for the device's architecture at first
//! use, cached per process, and loaded with every kernel resolved at once.

use super::driver::{CuDevicePtr, Handle};
use super::{arg, nvrtc, CudaError, Device, Stream};
use oxccl_core::{DataType, ReduceOp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The most sources one reduce-copy launch combines.
pub const MAX_SOURCES: usize = 8;
/// Threads per block of every kernel (`__launch_bounds__(512)` in the source).
pub const BLOCK_THREADS: u32 = 512;

const BODY: &str = include_str!("kernels.cu");

/// The types the kernels serve and their names in the source.
pub const TYPES: [(DataType, &str, &str); 10] = [
    (DataType::I8, "i8", "i8"),
    (DataType::U8, "u8", "u8"),
    (DataType::I32, "i32", "i32"),
    (DataType::U32, "u32", "u32"),
    (DataType::I64, "i64", "i64"),
    (DataType::U64, "u64", "u64"),
    (DataType::F16, "f16", "h16"),
    (DataType::F32, "f32", "float"),
    (DataType::F64, "f64", "double"),
    (DataType::Bf16, "bf16", "b16"),
];

/// The operators the kernels compute directly (`Avg` is a sum and a division at the end).
pub const OPS: [(ReduceOp, &str, &str); 7] = [
    (ReduceOp::Sum, "sum", "OpSum"),
    (ReduceOp::Prod, "prod", "OpProd"),
    (ReduceOp::Max, "max", "OpMax"),
    (ReduceOp::Min, "min", "OpMin"),
    (ReduceOp::BitAnd, "band", "OpBand"),
    (ReduceOp::BitOr, "bor", "OpBor"),
    (ReduceOp::BitXor, "bxor", "OpBxor"),
];

fn is_float(t: DataType) -> bool {
    matches!(t, DataType::F16 | DataType::F32 | DataType::F64 | DataType::Bf16)
}

/// Every (type, operator) with a kernel: bitwise operators on integer types only.
pub fn variants() -> Vec<(DataType, ReduceOp)> {
    let mut v = Vec::new();
    for (op, ..) in OPS {
        for (t, ..) in TYPES {
            let bitwise = matches!(op, ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor);
            if !(bitwise && is_float(t)) {
                v.push((t, op));
            }
        }
    }
    v
}

/// The kernel's name for `(t, op)`.
pub fn reduce_name(t: DataType, op: ReduceOp) -> Option<String> {
    let tn = TYPES.iter().find(|x| x.0 == t)?.1;
    let on = OPS.iter().find(|x| x.0 == op)?.1;
    variants().contains(&(t, op)).then(|| format!("oxk_{on}_{tn}"))
}

/// The full source: the body and every instantiation.
pub fn source() -> String {
    let mut s = String::from(BODY);
    for (t, op) in variants() {
        let (_, tn, tc) = TYPES.iter().find(|x| x.0 == t).copied().unwrap_or((t, "?", "?"));
        let (_, on, oc) = OPS.iter().find(|x| x.0 == op).copied().unwrap_or((op, "?", "?"));
        s += &format!("OXK({on}, {oc}, {tn}, {tc})\n");
    }
    s
}

/// Every kernel name in the module.
pub fn names() -> Vec<String> {
    let mut v = vec!["oxk_copy".to_string()];
    v.extend(variants().into_iter().filter_map(|(t, op)| reduce_name(t, op)));
    v
}

/// CUBINs compiled in this process, by architecture and defines.
static CACHE: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();

/// The kernels' CUBIN for `arch` with `defines`: compiled once per process, and kept on disk
/// (see [`disk_cache_dir`]) so later processes skip NVRTC (tens of seconds for every variant).
pub fn cubin(arch: &str, defines: &[String]) -> Result<Arc<Vec<u8>>, CudaError> {
    cubin_from(arch, defines, true)
}

fn cubin_from(arch: &str, defines: &[String], use_disk: bool) -> Result<Arc<Vec<u8>>, CudaError> {
    let key = format!("{arch} {}", defines.join(" "));
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let src = source();
    let file = disk_cache_dir().map(|d| d.join(disk_name(&src, arch, defines)));
    let from_disk = file
        .as_ref()
        .filter(|_| use_disk)
        .and_then(|f| std::fs::read(f).ok())
        .filter(|b| b.len() > 4 && b.starts_with(b"\x7fELF"));
    let bin = match from_disk {
        Some(b) => Arc::new(b),
        None => {
            let b = nvrtc::compile(&src, "oxccl_kernels.cu", arch, defines)?;
            if let Some(f) = file.as_ref().filter(|_| use_disk) {
                store(f, &b);
            }
            Arc::new(b)
        }
    };
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, bin.clone());
    Ok(bin)
}

/// Forgets `arch`/`defines`' CUBIN in this process and on disk (one the driver refused).
fn forget(arch: &str, defines: &[String]) {
    let key = format!("{arch} {}", defines.join(" "));
    if let Some(c) = CACHE.get() {
        c.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
    }
    if let Some(d) = disk_cache_dir() {
        let _ = std::fs::remove_file(d.join(disk_name(&source(), arch, defines)));
    }
}

/// Where CUBINs are kept between processes: `OXCCL_KERNEL_CACHE` (a directory; `0` or empty:
/// none), else `$XDG_CACHE_HOME/oxccl`, else `$HOME/.cache/oxccl`.
pub fn disk_cache_dir() -> Option<std::path::PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(v) = std::env::var_os("OXCCL_KERNEL_CACHE") {
        return (!v.is_empty() && v != "0").then(|| v.into());
    }
    if let Some(x) = var("XDG_CACHE_HOME") {
        return Some(std::path::PathBuf::from(x).join("oxccl"));
    }
    var("HOME").map(|h| std::path::PathBuf::from(h).join(".cache").join("oxccl"))
}

/// The cache file's name: the architecture and a 64-bit FNV-1a hash of everything the CUBIN
/// depends on (the source, the architecture, the defines).
fn disk_name(src: &str, arch: &str, defines: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [src, "\0", arch, "\0", &defines.join("\0")] {
        for b in part.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("kernels-{arch}-{h:016x}.cubin")
}

/// Writes `bin` to `f` through a temporary file and a rename, so a reader never sees part of
/// one; failures are ignored (the cache is an optimisation).
fn store(f: &std::path::Path, bin: &[u8]) {
    let Some(dir) = f.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(
        ".{}.{}",
        f.file_name().and_then(|n| n.to_str()).unwrap_or("k"),
        std::process::id()
    ));
    if std::fs::write(&tmp, bin).is_ok() && std::fs::rename(&tmp, f).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The kernels loaded on one device: every function resolved now, so no launch ever loads
/// code (CUDA's lazy loading would, and that stalls behind a kernel that spins).
pub struct Kernels {
    dev_d: &'static super::driver::Driver,
    /// The module, loaded for the life of the process (kernels are cached per process).
    pub module: Handle,
    copy: Handle,
    reduce: HashMap<(DataType, ReduceOp), Handle>,
    /// Blocks per launch (a few per multiprocessor).
    pub blocks: u32,
}

// SAFETY: module and function handles may be used from any thread with the context current.
unsafe impl Send for Kernels {}
// SAFETY: as above; the handles are only passed to the driver.
unsafe impl Sync for Kernels {}

/// `#[repr(C)]` twin of the kernels' `Srcs` and `Dsts`.
#[repr(C)]
struct Ptrs {
    p: [CuDevicePtr; MAX_SOURCES],
}

/// `#[repr(C)]` twin of the kernels' `Bar`: the barrier a reduce-copy meets with the same
/// call's kernels on the other ranks' streams (see kernels.cu for the protocol). All zero:
/// no barrier.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bar {
    /// Device address of `u64[p]`: each rank's latest call to have started.
    pub arr: CuDevicePtr,
    /// Device address of one `u64`: blocks finished, over all calls.
    pub dep: CuDevicePtr,
    /// Device address of one `u32`: the first failure's code, 0 while none.
    pub fail: CuDevicePtr,
    /// Device address of host-mapped `u32[4]`: the failure's code, 0, and its call number.
    pub host: CuDevicePtr,
    /// This call's number, from 1.
    pub seq: u64,
    /// Blocks of every rank over all calls up to this one.
    pub depart: u64,
    /// Longest wait in nanoseconds; 0: forever.
    pub timeout_ns: u64,
    pub rank: i32,
    pub p: i32,
}

impl Kernels {
    /// Compiles (or takes from the cache) and loads the kernels on `dev`.
    pub fn load(dev: &Device, defines: &[String]) -> Result<Kernels, CudaError> {
        let arch = dev.arch();
        let d = dev.d;
        let mut module = std::ptr::null_mut();
        let bin = cubin(&arch, defines)?;
        // SAFETY: a CUBIN image (from NVRTC or the disk cache); the driver copies what it needs.
        let r = unsafe { (d.module_load_data)(&mut module, bin.as_ptr().cast()) };
        if d.check("cuModuleLoadData", r).is_err() {
            // A cached image this driver refuses (say, from a newer NVRTC): compile afresh.
            forget(&arch, defines);
            let bin = cubin_from(&arch, defines, false)?;
            // SAFETY: as above.
            d.check("cuModuleLoadData", unsafe { (d.module_load_data)(&mut module, bin.as_ptr().cast()) })?;
        }
        let func = |name: &str| -> Result<Handle, CudaError> {
            let c = std::ffi::CString::new(name).map_err(|_| CudaError::Invalid(name.into()))?;
            let mut f = std::ptr::null_mut();
            // SAFETY: a loaded module and a NUL-terminated name.
            d.check("cuModuleGetFunction", unsafe { (d.module_get_function)(&mut f, module, c.as_ptr()) })?;
            Ok(f)
        };
        let copy = func("oxk_copy")?;
        let mut reduce = HashMap::new();
        for (t, op) in variants() {
            let name = reduce_name(t, op).unwrap_or_default();
            reduce.insert((t, op), func(&name)?);
        }
        Ok(Kernels { dev_d: d, module, copy, reduce, blocks: (dev.sms.max(1) as u32) * 4 })
    }

    fn launch(&self, f: Handle, s: &Stream, params: &mut [*mut std::ffi::c_void]) -> Result<(), CudaError> {
        self.launch_blocks(f, self.blocks, s, params)
    }

    fn launch_blocks(
        &self,
        f: Handle,
        blocks: u32,
        s: &Stream,
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<(), CudaError> {
        let d = self.dev_d;
        // SAFETY: `params` point at values of the kernel's parameter types, alive for the call
        // (the driver copies them at launch).
        d.check("cuLaunchKernel", unsafe {
            (d.launch_kernel)(
                f,
                blocks,
                1,
                1,
                BLOCK_THREADS,
                1,
                1,
                0,
                s.h,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Enqueues a copy of `bytes` from `src` to `dst` on `s`.
    pub fn copy(
        &self,
        s: &Stream,
        dst: CuDevicePtr,
        src: CuDevicePtr,
        bytes: usize,
    ) -> Result<(), CudaError> {
        let vec: i32 = ((dst | src) % 16 == 0) as i32;
        let n = bytes as u64;
        self.launch(self.copy, s, &mut [arg(&src), arg(&dst), arg(&n), arg(&vec)])
    }

    /// Enqueues `dst[i] = op(srcs[0][i], srcs[1][i], ...)` over `count` elements of `t`.
    pub fn reduce(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        srcs: &[CuDevicePtr],
        dst: CuDevicePtr,
        count: usize,
    ) -> Result<(), CudaError> {
        self.reduce_multi(s, t, op, srcs, &[dst], count)
    }

    /// Like [`reduce`](Self::reduce), writing the result to every one of `dsts`.
    pub fn reduce_multi(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        srcs: &[CuDevicePtr],
        dsts: &[CuDevicePtr],
        count: usize,
    ) -> Result<(), CudaError> {
        self.reduce_met(s, t, op, srcs, dsts, count, self.blocks, &Bar::default())
    }

    /// Like [`reduce_multi`](Self::reduce_multi) on `blocks` blocks, meeting the same call's
    /// kernels on the other ranks' streams at `bar` (which every block of every rank's
    /// kernel must be able to reach at once: see [`max_blocks_per_sm`](Self::max_blocks_per_sm)).
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_met(
        &self,
        s: &Stream,
        t: DataType,
        op: ReduceOp,
        srcs: &[CuDevicePtr],
        dsts: &[CuDevicePtr],
        count: usize,
        blocks: u32,
        bar: &Bar,
    ) -> Result<(), CudaError> {
        if srcs.is_empty() || srcs.len() > MAX_SOURCES || dsts.is_empty() || dsts.len() > MAX_SOURCES {
            return Err(CudaError::Invalid(format!(
                "a reduce-copy combines 1 to {MAX_SOURCES} sources into 1 to {MAX_SOURCES} destinations, not {} into {}",
                srcs.len(),
                dsts.len()
            )));
        }
        let f = *self
            .reduce
            .get(&(t, op))
            .ok_or_else(|| CudaError::Invalid(format!("no device kernel reduces {t:?} with {op:?}")))?;
        let mut sp = Ptrs { p: [0; MAX_SOURCES] };
        sp.p[..srcs.len()].copy_from_slice(srcs);
        let mut dp = Ptrs { p: [0; MAX_SOURCES] };
        dp.p[..dsts.len()].copy_from_slice(dsts);
        let vec: i32 = (srcs.iter().chain(dsts).fold(0, |a, b| a | b) % 16 == 0) as i32;
        let (nsrc, ndst, n) = (srcs.len() as i32, dsts.len() as i32, count as u64);
        let params = &mut [arg(&sp), arg(&nsrc), arg(&dp), arg(&ndst), arg(&n), arg(&vec), arg(bar)];
        self.launch_blocks(f, blocks.max(1), s, params)
    }

    /// How many blocks of the `(t, op)` reduce-copy one multiprocessor holds at once.
    pub fn max_blocks_per_sm(&self, t: DataType, op: ReduceOp) -> Result<u32, CudaError> {
        let f = *self
            .reduce
            .get(&(t, op))
            .ok_or_else(|| CudaError::Invalid(format!("no device kernel reduces {t:?} with {op:?}")))?;
        let d = self.dev_d;
        let mut n: i32 = 0;
        // SAFETY: a resolved function; writes one int.
        d.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            (d.occupancy_blocks)(&mut n, f, BLOCK_THREADS as i32, 0)
        })?;
        Ok(n.max(0) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_and_type_has_one_kernel_name() {
        let v = variants();
        // 10 types x 4 arithmetic operators, and the 3 bitwise ones on the 6 integer types.
        assert_eq!(v.len(), 10 * 4 + 6 * 3);
        let n = names();
        assert_eq!(n.len(), v.len() + 1);
        let mut uniq = n.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), n.len());
        assert_eq!(reduce_name(DataType::Bf16, ReduceOp::Sum).as_deref(), Some("oxk_sum_bf16"));
        assert_eq!(reduce_name(DataType::F32, ReduceOp::BitXor), None);
        assert_eq!(reduce_name(DataType::F8E4M3, ReduceOp::Sum), None);
        let src = source();
        for name in &n[1..] {
            let (op, t) = name["oxk_".len()..].split_once('_').unwrap();
            assert!(src.contains(&format!("OXK({op}, ")) && src.contains(&format!(", {t}, ")), "{name}");
        }
    }

    /// The cache file name changes with everything the CUBIN depends on, and a stored file
    /// is read back whole.
    #[test]
    fn the_disk_cache_names_each_build_apart_and_stores_whole_files() {
        let d = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = disk_name("src", "sm_90", &d(&["OX_UNROLL=8"]));
        assert!(a.starts_with("kernels-sm_90-") && a.ends_with(".cubin"), "{a}");
        assert_ne!(a, disk_name("src2", "sm_90", &d(&["OX_UNROLL=8"])));
        assert_ne!(a, disk_name("src", "sm_80", &d(&["OX_UNROLL=8"])));
        assert_ne!(a, disk_name("src", "sm_90", &d(&["OX_UNROLL=4"])));
        assert_ne!(a, disk_name("src", "sm_90", &d(&["OX_UNROLL=8", "X"])));
        assert_eq!(a, disk_name("src", "sm_90", &d(&["OX_UNROLL=8"])));
        let dir = std::env::temp_dir().join(format!("oxccl-kcache-{}", std::process::id()));
        let f = dir.join(&a);
        store(&f, b"\x7fELF-test");
        assert_eq!(std::fs::read(&f).unwrap(), b"\x7fELF-test");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every kernel compiles with NVRTC for Hopper and Ampere, and each name is in the CUBIN.
    /// CI installs NVRTC from PyPI and sets OXCCL_REQUIRE_NVRTC=1, so there a missing NVRTC
    /// fails the test; elsewhere it says it did not run.
    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        let required = std::env::var("OXCCL_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        match nvrtc::version() {
            Err(e) if !required => {
                eprintln!(
                    "SKIPPED: {e} (set OXCCL_NVRTC to a libnvrtc.so, or OXCCL_REQUIRE_NVRTC=1 to fail)"
                );
                return;
            }
            Err(e) => panic!("{e}; tried {:?}", nvrtc::candidates()),
            Ok((lib, v)) => eprintln!("NVRTC {}.{} from {lib}", v.0, v.1),
        }
        for arch in ["sm_90", "sm_80"] {
            for unroll in ["OX_UNROLL=8", "OX_UNROLL=1"] {
                // Compiled here, never taken from the disk cache.
                let bin = cubin_from(arch, &[unroll.to_string()], false).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(&bin[..4], b"\x7fELF", "{arch}: not an ELF image");
                for name in names() {
                    let found = bin
                        .windows(name.len() + 1)
                        .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
                    assert!(found, "{arch} {unroll}: {name} is not in the CUBIN");
                }
            }
        }
        // The stream-wait kernel of the staged path, likewise.
        for arch in ["sm_90", "sm_80"] {
            let bin = nvrtc::compile(super::super::stage::WAIT_SOURCE, "oxccl_wait.cu", arch, &[])
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(bin.windows(16).any(|w| w == b"oxccl_wait_flag\0"), "{arch}: no oxccl_wait_flag");
        }
        // A source error comes back as NVRTC's log, naming the line.
        let e =
            nvrtc::compile("extern \"C\" __global__ void k() { undefined_thing(); }", "bad.cu", "sm_90", &[])
                .expect_err("a broken kernel must not compile");
        assert!(e.to_string().contains("undefined_thing"), "{e}");
    }
}
