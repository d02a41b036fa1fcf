//! oxccl's copy and reduce-copy kernels: CUDA C (the files of `kernels/`, one per family:
//! `common.cu` types and work lists, `arith.cu` element arithmetic and operators,
//! `reduce_copy.cu` the reduce-copy, `sync.cu` the GPU meeting, `ll.cu` the LL and LL128
//! all-reduces, `instances.cu` the per-variant entry points; concatenated in that order, plus
//! one instantiation per operator and type, listed here), compiled by NVRTC as one source for
//! the device's architecture at first use, cached per process and on disk, and loaded with
//! every kernel resolved at once.
//!
//! A launch carries a work list of up to [`MAX_TASKS`] tasks (oxccl-core's
//! `plan::device::Task`: sources reduced into destinations) and a [`Sync`] saying how it meets
//! the launches of the other ranks (nothing, or the counters of a thread group).

use super::driver::{CuDevicePtr, Handle};
use super::{arg, nvrtc, CudaError, Device, Stream};
use oxccl_core::plan::device::Task;
use oxccl_core::{DataType, ReduceOp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The most sources one task combines.
pub const MAX_SOURCES: usize = 8;
/// The most destinations one task writes.
pub const MAX_DESTS: usize = 8;
/// The most tasks one launch carries (the kernels' `OX_MAXTASK`).
pub const MAX_TASKS: usize = 8;
/// Threads per block of every kernel (`__launch_bounds__(512)` in the source).
pub const BLOCK_THREADS: u32 = 512;

/// The kernels' source without their instantiations: the files of `kernels/`, one per family,
/// in the order each names only those before it (NVRTC compiles them as one source).
const BODY: &str = concat!(
    include_str!("kernels/common.cu"),
    include_str!("kernels/arith.cu"),
    include_str!("kernels/reduce_copy.cu"),
    include_str!("kernels/sync.cu"),
    include_str!("kernels/ll.cu"),
    include_str!("kernels/instances.cu"),
);

/// The types the kernels serve and their names in the source.
pub const TYPES: [(DataType, &str, &str); 12] = [
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
    (DataType::F8E4M3, "f8e4m3", "e4m3"),
    (DataType::F8E5M2, "f8e5m2", "e5m2"),
];

/// What a launch computes: one of NCCL's operators, or PreMulSum (each source scaled by a
/// scalar, then summed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kop {
    Op(ReduceOp),
    PreMulSum,
}

/// The operators the kernels compute and their names in the source.
pub const OPS: [(Kop, &str, &str); 9] = [
    (Kop::Op(ReduceOp::Sum), "sum", "OpSum"),
    (Kop::Op(ReduceOp::Prod), "prod", "OpProd"),
    (Kop::Op(ReduceOp::Max), "max", "OpMax"),
    (Kop::Op(ReduceOp::Min), "min", "OpMin"),
    (Kop::Op(ReduceOp::BitAnd), "band", "OpBand"),
    (Kop::Op(ReduceOp::BitOr), "bor", "OpBor"),
    (Kop::Op(ReduceOp::BitXor), "bxor", "OpBxor"),
    (Kop::Op(ReduceOp::Avg), "avg", "OpAvg"),
    (Kop::PreMulSum, "premul", "OpPremul"),
];

fn is_float(t: DataType) -> bool {
    matches!(
        t,
        DataType::F16 | DataType::F32 | DataType::F64 | DataType::Bf16 | DataType::F8E4M3 | DataType::F8E5M2
    )
}

/// Every (type, operator) with a kernel: bitwise operators on integer types only.
pub fn variants() -> Vec<(DataType, Kop)> {
    let mut v = Vec::new();
    for (op, ..) in OPS {
        for (t, ..) in TYPES {
            let bitwise = matches!(op, Kop::Op(ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor));
            if !(bitwise && is_float(t)) {
                v.push((t, op));
            }
        }
    }
    v
}

/// The kernel's name for `(t, op)`.
pub fn reduce_name(t: DataType, op: Kop) -> Option<String> {
    let tn = TYPES.iter().find(|x| x.0 == t)?.1;
    let on = OPS.iter().find(|x| x.0 == op)?.1;
    variants().contains(&(t, op)).then(|| format!("oxk_{on}_{tn}"))
}

/// The source of the body and the instantiations of `which` (every variant: [`variants`]).
pub fn source_of(which: &[(DataType, Kop)]) -> String {
    let mut s = String::from(BODY);
    for &(t, op) in which {
        let (Some((_, tn, tc)), Some((_, on, oc))) =
            (TYPES.iter().find(|x| x.0 == t), OPS.iter().find(|x| x.0 == op))
        else {
            continue;
        };
        s += &format!("OXK({on}, {oc}, {tn}, {tc})\n");
    }
    s
}

/// The full source: the body and every instantiation.
pub fn source() -> String {
    source_of(&variants())
}

/// The LL all-reduce kernel's name for `(t, op)`.
pub fn ll_name(t: DataType, op: Kop) -> Option<String> {
    reduce_name(t, op).map(|n| n.replacen("oxk_", "oxk_ll_", 1))
}

/// The LL128 all-reduce kernel's name for `(t, op)`.
pub fn ll128_name(t: DataType, op: Kop) -> Option<String> {
    reduce_name(t, op).map(|n| n.replacen("oxk_", "oxk_ll128_", 1))
}

/// The names of the kernels of `which` (reduce-copy, LL and LL128), and the copy kernel.
pub fn names_of(which: &[(DataType, Kop)]) -> Vec<String> {
    let mut v = vec!["oxk_copy".to_string()];
    v.extend(which.iter().filter_map(|&(t, op)| reduce_name(t, op)));
    v.extend(which.iter().filter_map(|&(t, op)| ll_name(t, op)));
    v.extend(which.iter().filter_map(|&(t, op)| ll128_name(t, op)));
    v
}

/// The flag protocols of the all-reduce kernels that exchange lines instead of meeting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LineProto {
    /// 16-byte lines of 8 payload bytes (two 4-byte flags).
    Ll,
    /// 128-byte lines of 120 payload bytes (one 8-byte flag).
    Ll128,
}

impl LineProto {
    /// Payload bytes per line.
    pub fn payload(self) -> usize {
        match self {
            LineProto::Ll => 8,
            LineProto::Ll128 => 120,
        }
    }

    /// Bytes per line in the buffer.
    pub fn line_bytes(self) -> usize {
        match self {
            LineProto::Ll => 16,
            LineProto::Ll128 => 128,
        }
    }

    /// Threads that carry one line.
    fn threads_per_line(self) -> usize {
        match self {
            LineProto::Ll => 1,
            LineProto::Ll128 => 8,
        }
    }
}

/// Every kernel name in the module.
pub fn names() -> Vec<String> {
    names_of(&variants())
}

/// CUBINs compiled in this process, by [`disk_name`] (source, architecture, defines).
static CACHE: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();

/// The kernels' CUBIN for `arch` with `defines`: compiled once per process, and kept on disk
/// (see [`disk_cache_dir`]) so later processes skip NVRTC (tens of seconds for every variant).
pub fn cubin(arch: &str, defines: &[String]) -> Result<Arc<Vec<u8>>, CudaError> {
    cubin_from(&source(), arch, defines, true)
}

/// The CUBIN of the copy kernel and the reduce-copy kernels of `which` only.
pub fn cubin_of(
    which: &[(DataType, Kop)],
    arch: &str,
    defines: &[String],
) -> Result<Arc<Vec<u8>>, CudaError> {
    cubin_from(&source_of(which), arch, defines, true)
}

fn cubin_from(src: &str, arch: &str, defines: &[String], use_disk: bool) -> Result<Arc<Vec<u8>>, CudaError> {
    let key = disk_name(src, arch, defines);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let file = disk_cache_dir().map(|d| d.join(&key));
    let from_disk = file
        .as_ref()
        .filter(|_| use_disk)
        .and_then(|f| std::fs::read(f).ok())
        .filter(|b| b.len() > 4 && b.starts_with(b"\x7fELF"));
    let bin = match from_disk {
        Some(b) => Arc::new(b),
        None => {
            let b = nvrtc::compile(src, "oxccl_kernels.cu", arch, defines)?;
            if let Some(f) = file.as_ref().filter(|_| use_disk) {
                store(f, &b);
            }
            Arc::new(b)
        }
    };
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, bin.clone());
    Ok(bin)
}

/// Forgets a CUBIN in this process and on disk (one the driver refused).
fn forget(src: &str, arch: &str, defines: &[String]) {
    let key = disk_name(src, arch, defines);
    if let Some(c) = CACHE.get() {
        c.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
    }
    if let Some(d) = disk_cache_dir() {
        let _ = std::fs::remove_file(d.join(key));
    }
}

/// Where CUBINs are kept between processes: `OXCCL_KERNEL_CACHE` (a directory; `0` or empty:
/// none), else oxccl's cache directory ([`crate::env::kernel_cache_dir`]).
pub fn disk_cache_dir() -> Option<std::path::PathBuf> {
    crate::env::kernel_cache_dir()
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
    reduce: HashMap<(DataType, Kop), Handle>,
    ll: HashMap<(DataType, Kop), Handle>,
    ll128: HashMap<(DataType, Kop), Handle>,
    /// Blocks of each reduce-copy kernel one multiprocessor holds (asked once, at load).
    occupancy: HashMap<(DataType, Kop), u32>,
    /// Blocks per launch without a meeting (a few per multiprocessor).
    pub blocks: u32,
}

// SAFETY: module and function handles may be used from any thread with the context current.
unsafe impl Send for Kernels {}
// SAFETY: as above; the handles are only passed to the driver.
unsafe impl std::marker::Sync for Kernels {}

/// `#[repr(C)]` twin of the kernels' `Task`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KTask {
    src: [CuDevicePtr; MAX_SOURCES],
    dst: [CuDevicePtr; MAX_DESTS],
    n: u64,
    nsrc: u32,
    ndst: u32,
    vec: u32,
    copy: u32,
}

/// `#[repr(C)]` twin of the kernels' `Work`.
#[repr(C)]
struct Work {
    t: [KTask; MAX_TASKS],
    scalar: u64,
    ntask: u32,
    div: u32,
}

/// `#[repr(C)]` twin of the kernels' `LlArgs`.
#[repr(C)]
struct LlArgs {
    src: CuDevicePtr,
    dst: CuDevicePtr,
    n: u64,
    scalar: u64,
    buf: CuDevicePtr,
    fail: CuDevicePtr,
    host: CuDevicePtr,
    timeout_ns: u64,
    seq: u32,
    lines: u32,
    div: u32,
    sig: u32,
    rank: i32,
    p: i32,
    base: CuDevicePtr,
    sigbuf: CuDevicePtr,
    siglines: u32,
    pad: u32,
}

/// An LL all-reduce's place in its group's LL buffer (see kernels/ll.cu's `ll_all_reduce`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ll {
    /// Device address of the group's LL buffer.
    pub buf: CuDevicePtr,
    /// This call's number among the group's LL calls, from 1 (its flag; parity picks the slot).
    pub seq: u32,
    /// Data lines per slot: the most a call may carry. Each slot has one more line.
    pub lines: u32,
    /// The LL buffer and its data lines per slot: the signature lines of both protocols
    /// (after each LL slot's data lines).
    pub sig_buf: CuDevicePtr,
    pub sig_lines: u32,
}

/// Bits of the count in an LL signature: LL and LL128 calls hold at most 2^18 elements.
const SIG_COUNT_BITS: u32 = 19;

/// An LL or LL128 all-reduce's signature, which every rank's kernel compares with every
/// other's ([`describe_ll_signature`] reads it back): the count (below 2^19: these calls are
/// at most 256 KiB), the type, the operator and the protocol.
pub fn ll_signature(proto: LineProto, t: DataType, op: Kop, count: usize) -> u32 {
    let o = OPS.iter().position(|(k, _, _)| *k == op).unwrap_or(0xf) as u32 & 0xf;
    let count = count.min((1 << SIG_COUNT_BITS) - 1) as u32;
    let pr = (proto == LineProto::Ll128) as u32;
    count | ((t as u32 & 0xf) << SIG_COUNT_BITS) | (o << (SIG_COUNT_BITS + 4)) | (pr << (SIG_COUNT_BITS + 8))
}

/// An LL signature in words ("an all-reduce of 2 x float with sum (LL)").
pub fn describe_ll_signature(sig: u32) -> String {
    let count = sig & ((1 << SIG_COUNT_BITS) - 1);
    let t = DataType::ALL.iter().find(|t| **t as u32 == (sig >> SIG_COUNT_BITS) & 0xf);
    let op = OPS.get(((sig >> (SIG_COUNT_BITS + 4)) & 0xf) as usize).map(|(_, name, _)| *name);
    let proto = if (sig >> (SIG_COUNT_BITS + 8)) & 1 == 1 { "LL128" } else { "LL" };
    match (t, op) {
        (Some(t), Some(op)) => format!("an all-reduce of {count} x {t} with {op} ({proto})"),
        _ => format!("an all-reduce with unknown signature {sig:#x}"),
    }
}

/// `#[repr(C)]` twin of the kernels' `Sync`: how a launch meets the other ranks' launches
/// (see kernels/sync.cu for the protocol). All zero: no meeting.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sync {
    /// Device address of `u64[p]`: each rank's latest collective launch to have started.
    pub arr: CuDevicePtr,
    /// Device address of one `u64`: blocks of collective launches finished, over all launches.
    pub dep: CuDevicePtr,
    /// Device address of one `u32`: the first failure's code, 0 while none.
    pub fail: CuDevicePtr,
    /// Device address of host-mapped `u32[4]`: the failure's code, 0, and its call number.
    pub host: CuDevicePtr,
    /// Device addresses of `u64[p * p]`: sends published, and receives done, per pair.
    pub pready: CuDevicePtr,
    pub pdone: CuDevicePtr,
    /// Per peer q, when set: where the counters of pair (q → this rank) are instead (`u64[p *
    /// p]`, published and done, indexed as above): the sender's own (captured IPC calls).
    pub rready: [CuDevicePtr; 8],
    pub rdone: [CuDevicePtr; 8],
    /// Device address of `u64[p]`: each rank's blocks finished in launches that publish
    /// receives.
    pub mydep: CuDevicePtr,
    /// Device address of this rank's record (`u64[24]`, zero at first): with it, every count
    /// below (and an LL launch's call number) is relative to the record, which the kernels
    /// advance, so a launch replayed from a CUDA graph meets with fresh numbers (kernels/sync.cu's
    /// `sync_resolve`). 0: the counts are absolute.
    pub base: CuDevicePtr,
    /// This rank's count of collective launches including this one; 0: none in this launch.
    pub seq: u64,
    /// Blocks of every rank over all collective launches up to this one.
    pub depart: u64,
    /// This rank's blocks over all its launches that publish receives, this one included.
    pub mydepart: u64,
    /// Longest wait in nanoseconds; 0: forever.
    pub timeout_ns: u64,
    /// Per peer, at the start: publish this rank's count of sends to it (0: nothing to do).
    pub send_to: [u64; 8],
    /// Per peer, at the start: wait until it has published this many sends to this rank.
    pub recv_from: [u64; 8],
    /// Per peer, at the end (once this rank's blocks are done): publish this many receives.
    pub recv_done: [u64; 8],
    /// Per peer, at the end: wait until it has received this many of this rank's sends.
    pub send_done: [u64; 8],
    pub rank: i32,
    pub p: i32,
    /// 1: fences and acquire loads at system scope (ranks on several devices).
    pub sys: i32,
    pub pad: i32,
}

impl Kernels {
    /// Compiles (or takes from the cache) and loads every kernel on `dev`.
    pub fn load(dev: &Device, defines: &[String]) -> Result<Kernels, CudaError> {
        Self::load_only(dev, defines, &variants())
    }

    /// Like [`load`](Self::load), with only the reduce-copy kernels of `which` (and the copy
    /// kernel): a fast compile for measurements of a few variants.
    pub fn load_only(
        dev: &Device,
        defines: &[String],
        which: &[(DataType, Kop)],
    ) -> Result<Kernels, CudaError> {
        let arch = dev.arch();
        let d = dev.d;
        let src = source_of(which);
        let mut module = std::ptr::null_mut();
        let bin = cubin_from(&src, &arch, defines, true)?;
        // SAFETY: a CUBIN image (from NVRTC or the disk cache); the driver copies what it needs.
        let r = unsafe { (d.module_load_data)(&mut module, bin.as_ptr().cast()) };
        if d.check("cuModuleLoadData", r).is_err() {
            // A cached image this driver refuses (say, from a newer NVRTC): compile afresh.
            forget(&src, &arch, defines);
            let bin = cubin_from(&src, &arch, defines, false)?;
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
        let (mut reduce, mut ll, mut ll128, mut occupancy) =
            (HashMap::new(), HashMap::new(), HashMap::new(), HashMap::new());
        for &(t, op) in which {
            if let (Some(name), Some(lname), Some(l128)) =
                (reduce_name(t, op), ll_name(t, op), ll128_name(t, op))
            {
                let f = func(&name)?;
                let mut n: i32 = 0;
                // SAFETY: a resolved function; writes one int.
                d.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
                    (d.occupancy_blocks)(&mut n, f, BLOCK_THREADS as i32, 0)
                })?;
                reduce.insert((t, op), f);
                occupancy.insert((t, op), n.max(0) as u32);
                ll.insert((t, op), func(&lname)?);
                ll128.insert((t, op), func(&l128)?);
            }
        }
        Ok(Kernels {
            dev_d: d,
            module,
            copy,
            reduce,
            ll,
            ll128,
            occupancy,
            blocks: (dev.sms.max(1) as u32) * 4,
        })
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
                blocks.max(1),
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
        self.launch_blocks(self.copy, self.blocks, s, &mut [arg(&src), arg(&dst), arg(&n), arg(&vec)])
    }

    fn function(&self, t: DataType, op: Kop) -> Result<Handle, CudaError> {
        self.reduce
            .get(&(t, op))
            .copied()
            .ok_or_else(|| CudaError::Invalid(format!("no device kernel reduces {t} with {op:?}")))
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
        let task = Task::reduce(srcs.to_vec(), vec![dst], count);
        self.run(s, t, Kop::Op(op), &[task], 0, 0, self.blocks, &Sync::default())
    }

    /// Enqueues one launch doing `tasks` in order, with `t` and `op` (`scalar`: PreMulSum's
    /// scalar as the element's bit pattern; `div`: Avg's divisor), on `blocks` blocks, meeting
    /// the other ranks' launches as `sync` says (every block of every launch that meets must
    /// be resident at once: see [`max_blocks_per_sm`](Self::max_blocks_per_sm)).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        s: &Stream,
        t: DataType,
        op: Kop,
        tasks: &[Task],
        scalar: u64,
        div: u32,
        blocks: u32,
        sync: &Sync,
    ) -> Result<(), CudaError> {
        if tasks.len() > MAX_TASKS {
            return Err(CudaError::Invalid(format!(
                "a launch carries at most {MAX_TASKS} tasks, not {}",
                tasks.len()
            )));
        }
        let f = self.function(t, op)?;
        let mut w = Work { t: [KTask::default(); MAX_TASKS], scalar, ntask: tasks.len() as u32, div };
        for (k, task) in w.t.iter_mut().zip(tasks) {
            if task.pairs && (!task.copy || task.srcs.len() != 2 || task.dsts.len() != 2) {
                return Err(CudaError::Invalid(format!(
                    "an exchange copies 2 sources into 2 destinations, not {} into {}",
                    task.srcs.len(),
                    task.dsts.len()
                )));
            }
            if task.srcs.is_empty()
                || task.srcs.len() > MAX_SOURCES
                || task.dsts.is_empty()
                || task.dsts.len() > MAX_DESTS
            {
                return Err(CudaError::Invalid(format!(
                    "a reduce-copy combines 1 to {MAX_SOURCES} sources into 1 to {MAX_DESTS} destinations, not {} into {}",
                    task.srcs.len(),
                    task.dsts.len()
                )));
            }
            k.src[..task.srcs.len()].copy_from_slice(&task.srcs);
            k.dst[..task.dsts.len()].copy_from_slice(&task.dsts);
            k.n = task.n as u64;
            k.nsrc = task.srcs.len() as u32;
            k.ndst = task.dsts.len() as u32;
            k.vec = task.aligned() as u32;
            k.copy = if task.pairs { 2 } else { task.copy as u32 };
        }
        self.launch_blocks(f, blocks, s, &mut [arg(&w), arg(sync)])
    }

    /// Enqueues an LL or LL128 all-reduce of `n` elements from this rank's input `src` into
    /// its output `dst` through the group's buffer of that protocol; `sync` gives the rank,
    /// the rank count, the failure record and the timeout.
    #[allow(clippy::too_many_arguments)]
    pub fn run_ll(
        &self,
        s: &Stream,
        proto: LineProto,
        t: DataType,
        op: Kop,
        (src, dst, n): (CuDevicePtr, CuDevicePtr, usize),
        scalar: u64,
        div: u32,
        ll: Ll,
        sync: &Sync,
    ) -> Result<(), CudaError> {
        let lines = (n * t.size_bytes()).div_ceil(proto.payload());
        if lines > ll.lines as usize || ll.buf == 0 || ll.sig_buf == 0 || ll.seq == 0 {
            return Err(CudaError::Invalid(format!(
                "an {proto:?} all-reduce carries at most {} lines, not {lines} (or its buffer or call number is unset)",
                ll.lines
            )));
        }
        let kernels = match proto {
            LineProto::Ll => &self.ll,
            LineProto::Ll128 => &self.ll128,
        };
        let f = kernels
            .get(&(t, op))
            .copied()
            .ok_or_else(|| CudaError::Invalid(format!("no {proto:?} kernel reduces {t} with {op:?}")))?;
        let a = LlArgs {
            src,
            dst,
            n: n as u64,
            scalar,
            buf: ll.buf,
            fail: sync.fail,
            host: sync.host,
            timeout_ns: sync.timeout_ns,
            seq: ll.seq,
            lines: ll.lines,
            div,
            sig: ll_signature(proto, t, op, n),
            rank: sync.rank,
            p: sync.p,
            base: sync.base,
            sigbuf: ll.sig_buf,
            siglines: ll.sig_lines,
            pad: 0,
        };
        let per_block = BLOCK_THREADS as usize / proto.threads_per_line();
        let blocks = lines.div_ceil(per_block).max(1) as u32;
        self.launch_blocks(f, blocks, s, &mut [arg(&a)])
    }

    /// How many blocks of the `(t, op)` kernel one multiprocessor holds at once.
    pub fn max_blocks_per_sm(&self, t: DataType, op: Kop) -> Result<u32, CudaError> {
        self.occupancy
            .get(&(t, op))
            .copied()
            .ok_or_else(|| CudaError::Invalid(format!("no device kernel reduces {t} with {op:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_and_type_has_one_kernel_name() {
        let v = variants();
        // 12 types x (4 arithmetic operators, Avg, PreMulSum), and the 3 bitwise ones on the 6
        // integer types.
        assert_eq!(v.len(), 12 * 6 + 6 * 3);
        let n = names();
        assert_eq!(n.len(), 3 * v.len() + 1);
        let mut uniq = n.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), n.len());
        assert_eq!(reduce_name(DataType::Bf16, Kop::Op(ReduceOp::Sum)).as_deref(), Some("oxk_sum_bf16"));
        assert_eq!(reduce_name(DataType::F8E4M3, Kop::Op(ReduceOp::Avg)).as_deref(), Some("oxk_avg_f8e4m3"));
        assert_eq!(reduce_name(DataType::I8, Kop::PreMulSum).as_deref(), Some("oxk_premul_i8"));
        assert_eq!(reduce_name(DataType::F32, Kop::Op(ReduceOp::BitXor)), None);
        assert_eq!(reduce_name(DataType::F8E5M2, Kop::Op(ReduceOp::BitAnd)), None);
        let src = source();
        for name in n[1..].iter().filter(|n| !n.starts_with("oxk_ll")) {
            assert!(n.contains(&name.replacen("oxk_", "oxk_ll_", 1)), "{name} has no LL twin");
            assert!(n.contains(&name.replacen("oxk_", "oxk_ll128_", 1)), "{name} has no LL128 twin");
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
    /// CI installs NVRTC from PyPI and sets OXCCL_REQUIRE_NVRTC=1 (and OXCCL_REQUIRE_ALL=1),
    /// so there a missing NVRTC fails the test; elsewhere it is a listed skip.
    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        let required = std::env::var("OXCCL_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        match nvrtc::version() {
            Err(e) if !required => {
                let why = format!("{e} (set OXCCL_NVRTC to a libnvrtc.so)");
                return oxccl_testkit::skip("every_kernel_compiles_with_nvrtc", "NVRTC", &why);
            }
            Err(e) => panic!("{e}; tried {:?} (OXCCL_REQUIRE_NVRTC=1)", nvrtc::candidates()),
            Ok((lib, v)) => eprintln!("NVRTC {}.{} from {lib}", v.0, v.1),
        }
        // Every kernel of the default build for Hopper; for Ampere, and for the other code paths
        // the defines select (one vector in flight, one source at a time, unrolls by type), a
        // kernel of every type and operator kind (a full build takes over a minute).
        let mut some: Vec<(DataType, Kop)> = TYPES.iter().map(|t| (t.0, Kop::Op(ReduceOp::Sum))).collect();
        some.extend([
            (DataType::F32, Kop::Op(ReduceOp::Avg)),
            (DataType::Bf16, Kop::PreMulSum),
            (DataType::I8, Kop::Op(ReduceOp::BitXor)),
            (DataType::F8E4M3, Kop::Op(ReduceOp::Max)),
            (DataType::F64, Kop::Op(ReduceOp::Prod)),
        ]);
        let other = ["OX_UNROLL=1", "OX_PAIR=0", "OX_TYPED_UNROLL=1"].map(String::from).to_vec();
        for (arch, defines, which) in
            [("sm_90", vec![], variants()), ("sm_80", vec![], some.clone()), ("sm_90", other, some)]
        {
            // Compiled here, never taken from the disk cache.
            let bin = cubin_from(&source_of(&which), arch, &defines, false).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&bin[..4], b"\x7fELF", "{arch}: not an ELF image");
            for name in names_of(&which) {
                let found = bin
                    .windows(name.len() + 1)
                    .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
                assert!(found, "{arch} {defines:?}: {name} is not in the CUBIN");
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
