// oxccl's device kernels: copy and reduce-copy over work lists, compiled at run time by NVRTC.
// No headers: NVRTC is given none. The instantiations (one extern "C" kernel per operator and
// type) are appended by kernels.rs, which also holds the list of names.
//
// Rules (the same as the CPU kernels in oxccl-core's reduce.rs and fp8.rs):
// - integer arithmetic wraps (done in unsigned arithmetic, so no signed overflow);
// - f16, bf16 and both fp8 formats are widened to f32, combined, and rounded once (round to
//   nearest even; fp8 saturates to the largest finite value, NaN stays NaN);
// - f32 and f64 are combined in their own precision;
// - Avg is a sum, rounded to the type, then divided by the rank count (integers truncate,
//   narrow floats divide in f32 and round again), as reduce.rs's `finalize`;
// - PreMulSum multiplies each source element by the scalar and rounds it to the type (as
//   the C ABI's scaled copy on host memory), then sums;
// - a task with one source and no scaling is a byte copy (bit patterns kept, NaN payloads too).
// Each thread moves 16-byte vectors when every pointer of a task is 16-byte aligned (`vec`),
// else single elements. Per thread and source, U vectors are in flight (OX_UNROLL for 4- and
// 8-byte accumulators; fewer for narrow types, whose accumulators take more registers, with
// OX_TYPED_UNROLL), and with OX_PAIR the loads of two sources are issued before either is
// combined.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;
struct __align__(2) h16 { u16 x; };
struct __align__(2) b16 { u16 x; };
struct __align__(1) e4m3 { u8 x; };
struct __align__(1) e5m2 { u8 x; };
struct __align__(16) V16 { u32 w[4]; };

#ifndef OX_UNROLL
#define OX_UNROLL 4
#endif
#ifndef OX_TYPED_UNROLL
#define OX_TYPED_UNROLL 0
#endif
#ifndef OX_PAIR
#define OX_PAIR 1
#endif
// Vectors in flight per thread in byte copies.
#ifndef OX_COPY_UNROLL
#define OX_COPY_UNROLL 8
#endif
#ifndef OX_MINBLOCKS
#define OX_MINBLOCKS 1
#endif
#define OX_MAXSRC 8
#define OX_MAXDST 8
#define OX_MAXTASK 8

// One reduce-copy: every destination receives op(src[0], src[1], ...) over n elements; or,
// with `copy` 1, the n bytes of src[0] (any launch carries such tasks, whatever its type); or,
// with `copy` 2, an exchange: dst[0] <- src[0] and dst[1] <- src[1] over n bytes, each thread
// loading its bytes of both sources before storing either (in-place all-to-all pairs).
struct Task {
  u64 src[OX_MAXSRC];
  u64 dst[OX_MAXDST];
  u64 n;
  u32 nsrc;
  u32 ndst;
  u32 vec;
  u32 copy;
};

// A launch's work: tasks done in order by every block (grid-stride within each), the
// PreMulSum scalar (the element's bit pattern) and the Avg divisor (the rank count).
struct Work {
  Task t[OX_MAXTASK];
  u64 scalar;
  u32 ntask;
  u32 div;
};

__device__ __forceinline__ float pow2f(int e) { return __uint_as_float((u32)(e + 127) << 23); }

// fp8: decoding is exact; encoding rounds to nearest even and saturates (oxccl-core fp8.rs).
__device__ __noinline__ float f8_dec(u8 c, int m, int bias, bool ieee) {
  const float sgn = (c & 0x80) ? -1.0f : 1.0f;
  const u32 mag = c & 0x7f;
  const u32 ef = mag >> m;
  const u32 mant = mag & ((1u << m) - 1);
  const u32 emax = (1u << (7 - m)) - 1;
  if (ieee && ef == emax) return mant == 0 ? sgn * __uint_as_float(0x7f800000u) : __uint_as_float(0x7fc00000u);
  if (!ieee && mag == 0x7f) return __uint_as_float(0x7fc00000u);
  const float v = ef == 0 ? (float)mant * pow2f(1 - bias - m) : (float)((1u << m) + mant) * pow2f((int)ef - bias - m);
  return sgn * v;
}

__device__ __noinline__ u8 f8_enc(float x, int m, int bias, u8 max_code, u32 max_bits) {
  const u32 bits = __float_as_uint(x);
  const u8 sign = (u8)((bits >> 24) & 0x80);
  const u32 a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= max_bits) return sign | max_code;
  const int emin = 1 - bias;
  const int e0 = (int)(a >> 23) - 127;
  u32 mag;
  if (e0 >= emin) {
    const u32 shift = 23 - m;
    const u32 half = (1u << (shift - 1)) - 1;
    const u32 r = a + half + ((a >> shift) & 1);
    const int e = (int)(r >> 23) - 127;
    mag = ((u32)(e + bias) << m) | ((r >> shift) & ((1u << m) - 1));
  } else {
    const float q = __uint_as_float(a) * pow2f(m - emin);
    asm("cvt.rni.u32.f32 %0, %1;" : "=r"(mag) : "f"(q));
  }
  return sign | (u8)mag;
}

// The accumulator of each type, with its widening load and narrowing store.
template <typename T> struct Acc { typedef T A; static __device__ __forceinline__ A ld(T v) { return v; } static __device__ __forceinline__ T st(A v) { return v; } };
template <> struct Acc<i8> { typedef u32 A; static __device__ __forceinline__ A ld(i8 v) { return (u32)(i32)v; } static __device__ __forceinline__ i8 st(A v) { return (i8)(u8)v; } };
template <> struct Acc<u8> { typedef u32 A; static __device__ __forceinline__ A ld(u8 v) { return v; } static __device__ __forceinline__ u8 st(A v) { return (u8)v; } };
template <> struct Acc<h16> {
  typedef float A;
  static __device__ __forceinline__ A ld(h16 v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x)); return f; }
  static __device__ __forceinline__ h16 st(A f) { h16 v; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v.x) : "f"(f)); return v; }
};
template <> struct Acc<b16> {
  typedef float A;
  static __device__ __forceinline__ A ld(b16 v) { return __uint_as_float(((u32)v.x) << 16); }
  static __device__ __forceinline__ b16 st(A f) { b16 v; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v.x) : "f"(f)); return v; }
};
template <> struct Acc<e4m3> {
  typedef float A;
  static __device__ __forceinline__ A ld(e4m3 v) { return f8_dec(v.x, 3, 7, false); }
  static __device__ __forceinline__ e4m3 st(A f) { e4m3 v; v.x = f8_enc(f, 3, 7, 0x7e, 0x43e00000u); return v; }
};
template <> struct Acc<e5m2> {
  typedef float A;
  static __device__ __forceinline__ A ld(e5m2 v) { return f8_dec(v.x, 2, 15, true); }
  static __device__ __forceinline__ e5m2 st(A f) { e5m2 v; v.x = f8_enc(f, 2, 15, 0x7b, 0x47600000u); return v; }
};

// Signedness for comparisons: the accumulator of i8 is u32 (for wrapping arithmetic), so
// max/min compare through the element's own signed type.
template <typename T> struct Cmp { template <typename A> static __device__ __forceinline__ bool lt(A a, A b) { return a < b; } };
template <> struct Cmp<i8> { template <typename A> static __device__ __forceinline__ bool lt(A a, A b) { return (i32)a < (i32)b; } };

__device__ __forceinline__ u32 wadd(u32 a, u32 b) { return a + b; }
__device__ __forceinline__ i32 wadd(i32 a, i32 b) { return (i32)((u32)a + (u32)b); }
__device__ __forceinline__ u64 wadd(u64 a, u64 b) { return a + b; }
__device__ __forceinline__ i64 wadd(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ float wadd(float a, float b) { return a + b; }
__device__ __forceinline__ double wadd(double a, double b) { return a + b; }
__device__ __forceinline__ u32 wmul(u32 a, u32 b) { return a * b; }
__device__ __forceinline__ i32 wmul(i32 a, i32 b) { return (i32)((u32)a * (u32)b); }
__device__ __forceinline__ u64 wmul(u64 a, u64 b) { return a * b; }
__device__ __forceinline__ i64 wmul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
__device__ __forceinline__ float wmul(float a, float b) { return a * b; }
__device__ __forceinline__ double wmul(double a, double b) { return a * b; }

// Avg's division of a finished sum (reduce.rs `finalize`).
template <typename T> struct Div { static __device__ __forceinline__ T f(T v, u32 n) { return v / (T)n; } };
template <> struct Div<i8> { static __device__ __forceinline__ i8 f(i8 v, u32 n) { return (i8)((i32)v / (i32)n); } };
template <> struct Div<u8> { static __device__ __forceinline__ u8 f(u8 v, u32 n) { return (u8)((u32)v / n); } };
template <> struct Div<i32> { static __device__ __forceinline__ i32 f(i32 v, u32 n) { return (i32)((i64)v / (i64)n); } };
template <> struct Div<i64> { static __device__ __forceinline__ i64 f(i64 v, u32 n) { return v / (i64)n; } };
template <> struct Div<float> { static __device__ __forceinline__ float f(float v, u32 n) { return v / (float)n; } };
template <> struct Div<double> { static __device__ __forceinline__ double f(double v, u32 n) { return v / (double)n; } };
template <typename T> struct DivNarrow { static __device__ __forceinline__ T f(T v, u32 n) { return Acc<T>::st(Acc<T>::ld(v) / (float)n); } };
template <> struct Div<h16> : DivNarrow<h16> {};
template <> struct Div<b16> : DivNarrow<b16> {};
template <> struct Div<e4m3> : DivNarrow<e4m3> {};
template <> struct Div<e5m2> : DivNarrow<e5m2> {};

// Operators: PRE scales each source by the scalar (PreMulSum), POST divides the result (Avg).
struct OpBase { static constexpr bool PRE = false; static constexpr bool POST = false; };
template <typename T> struct OpSum : OpBase { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return wadd(a, b); } };
template <typename T> struct OpProd : OpBase { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return wmul(a, b); } };
// NaN-ignoring like Rust's f32::max/min (the CPU kernels' rule); integers compare plainly.
template <typename T> struct OpMax : OpBase { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return (a != a) ? b : (b != b) ? a : (Cmp<T>::lt(a, b) ? b : a); } };
template <typename T> struct OpMin : OpBase { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return (a != a) ? b : (b != b) ? a : (Cmp<T>::lt(b, a) ? b : a); } };
template <typename T> struct OpBand : OpBase { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return a & b; } };
template <typename T> struct OpBor : OpBase { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return a | b; } };
template <typename T> struct OpBxor : OpBase { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return a ^ b; } };
template <typename T> struct OpAvg : OpSum<T> { static constexpr bool POST = true; };
template <typename T> struct OpPremul : OpSum<T> { static constexpr bool PRE = true; };

// Vectors in flight per thread and source for type T: OX_UNROLL, except for 1-byte types
// (16 accumulators a vector), which keep one (with OX_TYPED_UNROLL: fewer as accumulators
// take more registers).
template <typename T> struct Unroll {
  static constexpr int REGS = (16 / (int)sizeof(T)) * (int)sizeof(typename Acc<T>::A) / 4;
  static constexpr int U = OX_TYPED_UNROLL ? ((OX_UNROLL * 4 / REGS) >= 1 ? OX_UNROLL * 4 / REGS : 1)
                                           : (REGS > 8 ? 1 : OX_UNROLL);
};

template <typename T> __device__ __forceinline__ T from_bits(u64 b) { union { u64 b; T t; } u; u.b = b; return u.t; }

template <typename T, typename Op>
__device__ __forceinline__ typename Acc<T>::A load_acc(T v, typename Acc<T>::A s) {
  typedef typename Acc<T>::A A;
  A a = Acc<T>::ld(v);
  if (Op::PRE) a = Acc<T>::ld(Acc<T>::st(wmul(a, s)));
  return a;
}

template <typename T, typename Op>
__device__ __forceinline__ T store_val(typename Acc<T>::A a, u32 div) {
  T v = Acc<T>::st(a);
  if (Op::POST && div > 1) v = Div<T>::f(v, div);
  return v;
}

// Loads vector v of U consecutive strides from `p` (guarded by nv).
template <int U>
__device__ __forceinline__ void load_vecs(V16 (&in)[U], const V16* p, u64 base, u64 stride, u64 nv) {
#pragma unroll
  for (int r = 0; r < U; r++) {
    const u64 v = base + r * stride;
    if (v < nv) in[r] = p[v];
  }
}

template <typename T, typename Op, int U>
__device__ __forceinline__ void fold(typename Acc<T>::A (&acc)[U][16 / sizeof(T)], const V16 (&in)[U], typename Acc<T>::A s, bool first) {
  constexpr int PER = 16 / sizeof(T);
  union W { V16 u; T e[PER]; };
#pragma unroll
  for (int r = 0; r < U; r++) {
    W w;
    w.u = in[r];
#pragma unroll
    for (int k = 0; k < PER; k++) {
      const typename Acc<T>::A x = load_acc<T, Op>(w.e[k], s);
      acc[r][k] = first ? x : Op::f(acc[r][k], x);
    }
  }
}

// Byte copy of `bytes` from src to dst (16-byte vectors when `vec`).
__device__ __forceinline__ void copy_bytes(const u8* __restrict__ src, u8* __restrict__ dst, u64 bytes, u32 vec) {
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 nv = vec ? bytes / 16 : 0;
  for (u64 base = tid; base < nv; base += stride * OX_COPY_UNROLL) {
    V16 t[OX_COPY_UNROLL];
    load_vecs<OX_COPY_UNROLL>(t, (const V16*)src, base, stride, nv);
#pragma unroll
    for (int r = 0; r < OX_COPY_UNROLL; r++) {
      const u64 v = base + r * stride;
      if (v < nv) ((V16*)dst)[v] = t[r];
    }
  }
  for (u64 i = nv * 16 + tid; i < bytes; i += stride) dst[i] = src[i];
}

// The exchange task: no __restrict__, since one pair's source is the other's destination.
__device__ __forceinline__ void pair_bytes(const Task& t) {
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 bytes = t.n;
  const u64 nv = t.vec ? bytes / 16 : 0;
  constexpr int U = OX_COPY_UNROLL / 2 > 0 ? OX_COPY_UNROLL / 2 : 1;
  for (u64 base = tid; base < nv; base += stride * U) {
    V16 a[U], b[U];
    load_vecs<U>(a, (const V16*)t.src[0], base, stride, nv);
    load_vecs<U>(b, (const V16*)t.src[1], base, stride, nv);
#pragma unroll
    for (int r = 0; r < U; r++) {
      const u64 v = base + r * stride;
      if (v < nv) {
        ((V16*)t.dst[0])[v] = a[r];
        ((V16*)t.dst[1])[v] = b[r];
      }
    }
  }
  const u8* s0 = (const u8*)t.src[0];
  const u8* s1 = (const u8*)t.src[1];
  for (u64 i = nv * 16 + tid; i < bytes; i += stride) {
    const u8 x = s0[i], y = s1[i];
    ((u8*)t.dst[0])[i] = x;
    ((u8*)t.dst[1])[i] = y;
  }
}

template <typename T, typename Op>
__device__ __forceinline__ void reduce_task(const Task& t, u64 scalar, u32 div) {
  typedef typename Acc<T>::A A;
  constexpr int PER = 16 / sizeof(T);
  constexpr int U = Unroll<T>::U;
  const int nsrc = (int)t.nsrc, ndst = (int)t.ndst;
  const u64 n = t.n;
  if (t.copy == 2) {
    pair_bytes(t);
    return;
  }
  if (t.copy || (nsrc == 1 && !Op::PRE && !(Op::POST && div > 1))) {
    const u64 bytes = t.copy ? n : n * sizeof(T);
    for (int j = 0; j < ndst; j++)
      if (t.dst[j] != t.src[0]) copy_bytes((const u8*)t.src[0], (u8*)t.dst[j], bytes, t.vec);
    return;
  }
  const A s = Op::PRE ? Acc<T>::ld(from_bits<T>(scalar)) : A();
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 nv = t.vec ? n / PER : 0;
  union W { V16 u; T e[PER]; };
  for (u64 base = tid; base < nv; base += stride * U) {
    A acc[U][PER];
    V16 a[U];
    int j;
#if OX_PAIR
    V16 b[U];
    if (nsrc >= 2) {
      load_vecs<U>(a, (const V16*)t.src[0], base, stride, nv);
      load_vecs<U>(b, (const V16*)t.src[1], base, stride, nv);
      fold<T, Op, U>(acc, a, s, true);
      fold<T, Op, U>(acc, b, s, false);
      j = 2;
    } else {
      load_vecs<U>(a, (const V16*)t.src[0], base, stride, nv);
      fold<T, Op, U>(acc, a, s, true);
      j = 1;
    }
    for (; j + 1 < nsrc; j += 2) {
      load_vecs<U>(a, (const V16*)t.src[j], base, stride, nv);
      load_vecs<U>(b, (const V16*)t.src[j + 1], base, stride, nv);
      fold<T, Op, U>(acc, a, s, false);
      fold<T, Op, U>(acc, b, s, false);
    }
#else
    load_vecs<U>(a, (const V16*)t.src[0], base, stride, nv);
    fold<T, Op, U>(acc, a, s, true);
    j = 1;
#endif
    for (; j < nsrc; j++) {
      load_vecs<U>(a, (const V16*)t.src[j], base, stride, nv);
      fold<T, Op, U>(acc, a, s, false);
    }
#pragma unroll
    for (int r = 0; r < U; r++) {
      const u64 v = base + r * stride;
      if (v < nv) {
        W o;
#pragma unroll
        for (int k = 0; k < PER; k++) o.e[k] = store_val<T, Op>(acc[r][k], div);
        if (ndst == 1) {
          ((V16*)t.dst[0])[v] = o.u;
        } else {
          for (int d = 0; d < ndst; d++) ((V16*)t.dst[d])[v] = o.u;
        }
      }
    }
  }
  for (u64 i = nv * PER + tid; i < n; i += stride) {
    A acc = load_acc<T, Op>(((const T*)t.src[0])[i], s);
    for (int j = 1; j < nsrc; j++) acc = Op::f(acc, load_acc<T, Op>(((const T*)t.src[j])[i], s));
    const T out = store_val<T, Op>(acc, div);
    for (int d = 0; d < ndst; d++) ((T*)t.dst[d])[i] = out;
  }
}

// Each task is copied to shared memory first: its pointers are then read from there, not
// indexed out of the kernel's parameters (which costs registers).
template <typename T, typename Op>
__device__ __forceinline__ void run_work(const Work& w) {
  __shared__ Task st;
  const u32 nt = w.ntask < OX_MAXTASK ? w.ntask : OX_MAXTASK;
  for (u32 i = 0; i < nt; i++) {
    __syncthreads();
    if (threadIdx.x < sizeof(Task) / 8) ((u64*)&st)[threadIdx.x] = ((const u64*)&w.t[i])[threadIdx.x];
    __syncthreads();
    reduce_task<T, Op>(st, w.scalar, w.div);
  }
}

extern "C" __global__ void __launch_bounds__(512, OX_MINBLOCKS) oxk_copy(const u8* __restrict__ src, u8* __restrict__ dst, u64 n, int vec) {
  copy_bytes(src, dst, n, (u32)vec);
}

// How the kernels of one call meet each other (ranks as threads of one process and one
// context, every block of all of them co-resident; or any ranks whose kernels can reach one
// another's counters). All zero (arr null): no meeting, the launch just does its work.
// - Collectives (seq != 0): block 0 of `rank` raises arr[rank] to `seq` (this rank's count of
//   collective launches, the same on every rank); thread 0 of every block waits until every
//   rank's arr is >= seq, so every rank's stream has reached this call: inputs written,
//   outputs free. At the end every block adds 1 to *dep after its writes, and block 0 waits
//   until *dep reaches `depart` (every rank's blocks of every collective launch so far).
// - Point-to-point, per peer q: at the start a sender raises pready[rank * p + q] to
//   send_to[q] (its count of sends to q so far), and a receiver waits until
//   pready[q * p + rank] >= recv_from[q] before copying out of q's buffer. At the end, once
//   all of the launch's blocks are done (mydep[rank] reaches `mydepart`), a receiver raises
//   pdone[q * p + rank] to recv_done[q], and a sender's block 0 waits until
//   pdone[rank * p + q] >= send_done[q], so work after the launch may reuse the send buffer.
//   The counters of pair (q -> rank) are at rready[q] / rdone[q] when set (the sender's own
//   counters, as processes capturing into a CUDA graph keep them), else in pready / pdone.
// - A wait longer than `timeout_ns` (0: forever), or a failure already recorded, stops it:
//   the first failure is recorded in *fail (device) and in host[0..3] (host-mapped: code,
//   0, seq) for the host to read without waiting for the stream; the code is
//   1 | waiting rank << 8 | missing rank << 16 (0xff: unknown) | phase << 24 (0 arrival,
//   1 departure, 2 a peer's send, 3 a receive, 4 a peer's LL data). A failed block skips its
//   work, and every later launch sees *fail and skips.
// - With `base` set, the counts above are relative: each is added to this rank's record at
//   `base` (device memory the kernels alone advance, so a launch replayed from a CUDA graph
//   meets with fresh numbers): u64 words 0 collective launches, 1 departure target, 2 own
//   receiving blocks, 3 LL calls, 4 blocks that have read the record in the running launch,
//   8 + q sends to q, 16 + q receives from q. A count of 0 stays 0 (nothing to do). Thread 0
//   of every block reads the record at its start and counts itself in word 4; the block that
//   brings it to the launch's block count (the last reader) advances the record by the
//   launch's counts (sends and receives by send_done and recv_done, which only a group's last
//   send/receive launch carries) and zeroes word 4. A rank's launches never overlap, so the
//   next one reads the advanced record.
// - `sys` (ranks on several devices): fences and acquire loads at system scope.
struct Sync {
  u64* arr;
  u64* dep;
  u32* fail;
  u32* host;
  u64* pready;
  u64* pdone;
  u64* rready[8];
  u64* rdone[8];
  u64* mydep;
  u64* base;
  u64 seq;
  u64 depart;
  u64 mydepart;
  u64 timeout_ns;
  u64 send_to[8];
  u64 recv_from[8];
  u64 recv_done[8];
  u64 send_done[8];
  int rank;
  int p;
  int sys;
  int pad;
};

// Acquire loads and fences at the launch's scope: the GPU, or the system (ranks on several
// devices, whose counters one of them holds). `sys` is 0 or 1 alike in every block.
__device__ __forceinline__ u64 ld_acq_gpu(const u64* a) { u64 v; asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(a) : "memory"); return v; }
__device__ __forceinline__ u64 ld_acq_sys(const u64* a) { u64 v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(a) : "memory"); return v; }
__device__ __forceinline__ u32 ld_acq32(const u32* a) { u32 v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory"); return v; }
__device__ __forceinline__ u64 ld_acq(const u64* a, int sys) { return sys ? ld_acq_sys(a) : ld_acq_gpu(a); }
__device__ __forceinline__ void fence(int sys) { if (sys) __threadfence_system(); else __threadfence(); }
__device__ __forceinline__ u64 now_ns() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

__device__ void sync_fail(const Sync& b, u32 code) {
  if (atomicCAS(b.fail, 0u, code) == 0u) {
    volatile u32* h = (volatile u32*)b.host;
    h[2] = (u32)b.seq;
    h[3] = (u32)(b.seq >> 32);
    __threadfence_system();
    h[0] = code;
    __threadfence_system();
  }
}

// Thread 0 waits until *a >= want; false (and the failure recorded) if it gave up.
// It also gives up, every 32 rounds, when the host-mapped record says the group failed on the
// host (a rank aborted, or refused after the others had launched).
__device__ bool sync_wait(const Sync& b, const u64* a, u64 want, u32 phase, int missing) {
  u64 t0 = 0;
  u32 rounds = 0;
  while (ld_acq(a, b.sys) < want) {
    if (ld_acq32(b.fail) != 0u) return false;
    if (++rounds % 32 == 0 && b.host != 0 && *(volatile const u32*)b.host != 0u) return false;
    const u64 t = now_ns();
    if (t0 == 0) t0 = t;
    else if (b.timeout_ns != 0 && t - t0 > b.timeout_ns) {
      sync_fail(b, 1u | ((u32)b.rank << 8) | ((u32)(missing & 0xff) << 16) | (phase << 24));
      return false;
    }
    __nanosleep(100);
  }
  return true;
}

// Word 4 of a rank's record: how many blocks of the running launch have read it.
#define OX_BASE_READ 4

// Thread 0 of a block: the last of the launch's blocks to read the rank's record advances it
// (after every block's read, by the fences around the count).
__device__ __forceinline__ void base_advance(u64* g, const u64 (&by)[24]) {
  __threadfence();
  if (atomicAdd(&g[OX_BASE_READ], 1ull) + 1 == (u64)gridDim.x) {
    __threadfence();
    for (int k = 0; k < 24; k++)
      if (k != OX_BASE_READ && by[k] != 0) g[k] += by[k];
    g[OX_BASE_READ] = 0;
    __threadfence();
  }
}

// Thread 0 of each block: turns a launch's relative counts into this rank's absolute ones
// (see `base` above) and counts the block's read; nothing without a record.
__device__ void sync_resolve(Sync& b) {
  u64* g = b.base;
  if (g == 0) return;
  u64 by[24];
  for (int k = 0; k < 24; k++) by[k] = 0;
  const volatile u64* v = g;
  by[0] = b.seq;
  by[1] = b.depart;
  by[2] = b.mydepart;
  if (b.seq != 0) b.seq += v[0];
  if (b.depart != 0) b.depart += v[1];
  if (b.mydepart != 0) b.mydepart += v[2];
  for (int q = 0; q < 8; q++) {
    const u64 sent = v[8 + q], got = v[16 + q];
    by[8 + q] = b.send_done[q];
    by[16 + q] = b.recv_done[q];
    if (b.send_to[q] != 0) b.send_to[q] += sent;
    if (b.send_done[q] != 0) b.send_done[q] += sent;
    if (b.recv_from[q] != 0) b.recv_from[q] += got;
    if (b.recv_done[q] != 0) b.recv_done[q] += got;
  }
  base_advance(g, by);
}

__device__ bool sync_arrive(const Sync& b) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    const int p = b.p;
    if (blockIdx.x == 0) {
      fence(b.sys);
      if (b.seq != 0) atomicMax(&b.arr[b.rank], b.seq);
      for (int q = 0; q < p; q++)
        if (b.send_to[q] != 0) atomicMax(&b.pready[b.rank * p + q], b.send_to[q]);
    }
    bool good = ld_acq32(b.fail) == 0u;
    if (b.seq != 0)
      for (int q = 0; q < p && good; q++) good = sync_wait(b, &b.arr[q], b.seq, 0, q);
    for (int q = 0; q < p && good; q++)
      if (b.recv_from[q] != 0) good = sync_wait(b, &(b.rready[q] ? b.rready[q] : b.pready)[q * p + b.rank], b.recv_from[q], 2, q);
    ok = good;
  }
  __syncthreads();
  return ok != 0;
}

__device__ void sync_depart(const Sync& b) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const int p = b.p;
    bool done = false;
    for (int q = 0; q < p; q++) done |= b.recv_done[q] != 0;
    fence(b.sys);
    if (b.seq != 0) atomicAdd(b.dep, 1ull);
    if (done) atomicAdd(&b.mydep[b.rank], 1ull);
    if (blockIdx.x == 0) {
      if (done && sync_wait(b, &b.mydep[b.rank], b.mydepart, 3, 0xff)) {
        fence(b.sys);
        for (int q = 0; q < p; q++)
          if (b.recv_done[q] != 0) atomicMax(&(b.rdone[q] ? b.rdone[q] : b.pdone)[q * p + b.rank], b.recv_done[q]);
      }
      if (b.seq != 0) sync_wait(b, b.dep, b.depart, 1, 0xff);
      for (int q = 0; q < p; q++)
        if (b.send_done[q] != 0) sync_wait(b, &b.pdone[b.rank * p + q], b.send_done[q], 3, q);
    }
  }
}


// LL all-reduce (small sizes, ranks whose kernels reach one another's memory): one launch, one
// flag exchange, no barrier, and no meeting on the host. The group's LL buffer holds, per
// destination rank q, two slots (call parity) per source rank r of `lines` data lines and one
// signature line (LL128 calls keep theirs here too, so ranks whose protocols differ compare),
// 16 bytes each: line(q, parity, r, i) = ll + ((q * 2 + parity) * p + r) *
// (lines + 1) + i, {data lo, flag, data hi, flag}, written with one 16-byte store whose two
// 8-byte halves each carry the flag (NCCL's LL line); the flag is the call's number.
// Thread i of rank r reads its input's 8 bytes i, stores them to line(q, parity, r, i) of every
// rank q, then waits for line(r, parity, q, i) of every q to carry this call's flag, reduces
// them in rank order and writes 8 bytes of its output. Thread 0 also stores the call's
// signature (count, type, op) to line(q, parity, r, lines) and checks every q's: ranks whose
// calls differ fail at once (code 6) instead of waiting for lines that never come.
// A slot is reused two calls later: a rank can start call n + 2 only after every rank has
// started call n + 1, which each does after finishing call n, so nobody still reads it. No
// rank reads another's input or writes another's output, so no meeting is needed.
// While waiting, every 1024 spins, a thread gives up if the group failed: on the GPU (`fail`)
// or on the host (`host[0]`, set by a rank that refused its call after others had launched).
__device__ __forceinline__ void ll_store(u64* a, u64 v, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(a), "r"((u32)v), "r"(flag), "r"((u32)(v >> 32)), "r"(flag) : "memory");
}

__device__ __forceinline__ bool ll_load(const u64* a, u32 flag, u64* v) {
  u32 d0, f0, d1, f1;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1) : "l"(a) : "memory");
  *v = (u64)d0 | ((u64)d1 << 32);
  return f0 == flag && f1 == flag;
}

// An LL launch's arguments (small: launches from several threads of one context serialise,
// and each copies its arguments).
struct LlArgs {
  u64 src;
  u64 dst;
  u64 n;
  u64 scalar;
  u64 buf;
  u32* fail;
  u32* host;
  u64 timeout_ns;
  u32 seq;
  u32 lines;
  u32 div;
  u32 sig;
  int rank;
  int p;
  // This rank's record (see `Sync`'s `base`); when set, `seq` is ignored: the record gives
  // the call's number.
  u64* base;
  // Where the signature lines are (both protocols: the LL buffer, whose slots have siglines
  // data lines before their signature line), so ranks running different protocols compare.
  u64 sigbuf;
  u32 siglines;
  u32 pad;
};

// The signature line (q, parity, r): one LL line after each LL slot's data lines.
__device__ __forceinline__ u64* sig_line(const LlArgs& w, int q, u32 par, int r) {
  return (u64*)w.sigbuf + 2 * ((((u64)q * 2 + par) * w.p + r) * ((u64)w.siglines + 1) + w.siglines);
}

// Whether an LL wait should end: the group failed on the GPU or on the host.
__device__ __forceinline__ bool ll_failed(const Sync& b) {
  return ld_acq32(b.fail) != 0u || (b.host != 0 && *(volatile const u32*)b.host != 0u);
}

// Every 1024 rounds of one thread's LL wait: true when it must give up: the group failed,
// or the wait passed the timeout (then recorded, naming rank `missing`).
__device__ __forceinline__ bool ll_give_up(const Sync& b, u32& spins, u64& t0, int missing) {
  if (++spins % 1024 != 0) return false;
  if (ll_failed(b)) return true;
  const u64 now = now_ns();
  if (t0 == 0) t0 = now;
  else if (b.timeout_ns != 0 && now - t0 > b.timeout_ns) {
    sync_fail(b, 1u | ((u32)b.rank << 8) | ((u32)(missing & 0xff) << 16) | (4u << 24));
    return true;
  }
  return false;
}

// What an LL or LL128 kernel's waits need of a `Sync`: where to record a failure, the call
// number, the timeout and the rank.
__device__ __forceinline__ Sync ll_sync(const LlArgs& w) {
  Sync b;
  b.fail = w.fail;
  b.host = w.host;
  b.seq = w.seq;
  b.timeout_ns = w.timeout_ns;
  b.rank = w.rank;
  b.sys = 0;
  return b;
}

template <typename T, typename Op>
__device__ __forceinline__ void ll_all_reduce(const LlArgs& w) {
  typedef typename Acc<T>::A A;
  constexpr int PER = 8 / sizeof(T);
  union W { u64 u; T e[PER]; };
  const u64 n = w.n;
  const int p = w.p, rank = w.rank;
  const u32 par = w.seq & 1u;
  u64* ll = (u64*)w.buf;
  const u64 L = (u64)w.lines + 1;
  Sync b = ll_sync(w);
  const A s = Op::PRE ? Acc<T>::ld(from_bits<T>(w.scalar)) : A();
  const u64 lines = (n + PER - 1) / PER;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  if (tid == 0) {
    for (int q = 0; q < p; q++) ll_store(sig_line(w, q, par, rank), (u64)w.sig, w.seq);
  }
  for (u64 i = tid; i < lines; i += stride) {
    const u64 first = i * PER;
    const int valid = (int)((n - first) < (u64)PER ? (n - first) : (u64)PER);
    W in;
    in.u = 0;
    for (int k = 0; k < valid; k++) in.e[k] = ((const T*)w.src)[first + k];
    for (int q = 0; q < p; q++) ll_store(ll + 2 * ((((u64)q * 2 + par) * p + rank) * L + i), in.u, w.seq);
    A acc[PER];
    u64 t0 = 0;
    u32 spins = 0;
    if (i == 0) {
      // Every rank's call must be this one: compare the signatures (thread 0 only).
      for (int q = 0; q < p; q++) {
        const u64* line = sig_line(w, rank, par, q);
        u64 theirs;
        while (!ll_load(line, w.seq, &theirs))
          if (ll_give_up(b, spins, t0, q)) return;
        if ((u32)theirs != w.sig) {
          b.seq = (u64)w.sig | (theirs << 32);
          sync_fail(b, 1u | ((u32)rank << 8) | ((u32)(q & 0xff) << 16) | (6u << 24));
          return;
        }
      }
    }
    for (int q = 0; q < p; q++) {
      const u64* line = ll + 2 * ((((u64)rank * 2 + par) * p + q) * L + i);
      W got;
      while (!ll_load(line, w.seq, &got.u))
        if (ll_give_up(b, spins, t0, q)) return;
#pragma unroll
      for (int k = 0; k < PER; k++) {
        const A x = load_acc<T, Op>(got.e[k], s);
        acc[k] = q == 0 ? x : Op::f(acc[k], x);
      }
    }
    for (int k = 0; k < valid; k++) ((T*)w.dst)[first + k] = store_val<T, Op>(acc[k], w.div);
  }
}

// LL128 all-reduce (mid sizes, same exchange as LL with 128-byte lines: 120 payload bytes and
// an 8-byte flag). Line (q, parity, r, i) = ll128 + (((q * 2 + parity) * p + r) * (lines + 1)
// + i) * 128 bytes; the call's signature goes to the LL buffer's signature lines (`sig_line`),
// where an LL call's would. Eight threads carry a line, 16 bytes each with one 16-byte store; thread 7's high
// word is the flag (the call number). A warp's store of its 4 lines is one instruction: a
// reader that sees a line's flag takes the other 120 bytes of that load as written with it
// (NCCL's LL128 rests on the same property of 128-byte stores on sm_70 and later; the GPU
// check's chained all-reduces would catch a stale read). Warps step through lines together
// (the flag test is a warp vote), so every thread of a warp takes part in every loop, lines
// past the end included.
__device__ __forceinline__ void st128(u64* a, u64 x, u64 y) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(a), "l"(x), "l"(y) : "memory");
}
__device__ __forceinline__ void ld128(const u64* a, u64& x, u64& y) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(a) : "memory");
}

// Every 1024 rounds of a warp's wait (all its lanes in step): true when the warp must give
// up, alike on every lane: the group failed, or the wait passed the timeout (then the lanes
// still waiting record it, naming rank `missing`).
__device__ __forceinline__ bool ll128_give_up(const Sync& b, u32& spins, u64& t0, bool need, int missing) {
  if (++spins % 1024 != 0) return false;
  if (__any_sync(0xffffffffu, ll_failed(b))) return true;
  const u64 now = now_ns();
  if (t0 == 0) t0 = now;
  if (__any_sync(0xffffffffu, b.timeout_ns != 0 && now - t0 > b.timeout_ns)) {
    if (need) sync_fail(b, 1u | ((u32)b.rank << 8) | ((u32)(missing & 0xff) << 16) | (4u << 24));
    return true;
  }
  return false;
}

template <typename T, typename Op>
__device__ __forceinline__ void ll128_all_reduce(const LlArgs& w) {
  typedef typename Acc<T>::A A;
  constexpr int E = 16 / sizeof(T);
  union V { u64 u[2]; T e[E]; };
  const u64 n = w.n, nbytes = n * sizeof(T);
  const int p = w.p, rank = w.rank;
  const u32 par = w.seq & 1u;
  const u64 flag = w.seq;
  u64* buf = (u64*)w.buf;
  const u64 L = (u64)w.lines + 1;
  Sync b = ll_sync(w);
  const A s = Op::PRE ? Acc<T>::ld(from_bits<T>(w.scalar)) : A();
  const u64 lines = (nbytes + 119) / 120;
  const u32 lane = threadIdx.x & 31;
  const u32 l = lane & 7;
  const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  const unsigned FULL = 0xffffffffu;
  u64 t0 = 0;
  u32 spins = 0;
  // Signature: warp 0 publishes it (lane 0) and checks every rank's (lane q).
  if (warp == 0) {
    if (lane == 0)
      for (int q = 0; q < p; q++) ll_store(sig_line(w, q, par, rank), (u64)w.sig, w.seq);
    const bool mine = (int)lane < p;
    const u64* line = sig_line(w, rank, par, mine ? lane : 0);
    u64 theirs = 0;
    bool need = mine && !ll_load(line, w.seq, &theirs);
    while (__any_sync(FULL, need)) {
      if (ll128_give_up(b, spins, t0, need, lane)) return;
      if (need) need = !ll_load(line, w.seq, &theirs);
    }
    const bool differs = mine && (u32)theirs != w.sig;
    if (differs) {
      b.seq = (u64)w.sig | (theirs << 32);
      sync_fail(b, 1u | ((u32)rank << 8) | ((u32)(lane & 0xff) << 16) | (6u << 24));
    }
    if (__any_sync(FULL, differs)) return;
  }
  for (u64 base = warp * 4; base < lines; base += warps * 4) {
    const u64 i = base + (lane >> 3);
    const bool active = i < lines;
    // This thread's bytes of line i: 16 (thread 7: 8, then the flag).
    const u64 start = i * 120 + (u64)l * 16;
    const u64 room = l == 7 ? 8 : 16;
    const u64 have = !active || start >= nbytes ? 0 : (nbytes - start < room ? nbytes - start : room);
    const int valid = (int)(have / sizeof(T));
    const u64 first = start / sizeof(T);
    V in;
    in.u[0] = 0;
    in.u[1] = 0;
    for (int k = 0; k < valid; k++) in.e[k] = ((const T*)w.src)[first + k];
    if (l == 7) in.u[1] = flag;
    if (active)
      for (int q = 0; q < p; q++) st128(buf + 16 * ((((u64)q * 2 + par) * p + rank) * L + i) + 2 * l, in.u[0], in.u[1]);
    A acc[E];
    for (int q = 0; q < p; q++) {
      const u64* line = buf + 16 * ((((u64)rank * 2 + par) * p + q) * L + (active ? i : 0)) + 2 * l;
      V got;
      ld128(line, got.u[0], got.u[1]);
      bool need = active && l == 7 && got.u[1] != flag;
      while (__any_sync(FULL, need)) {
        if (ll128_give_up(b, spins, t0, need, q)) return;
        ld128(line, got.u[0], got.u[1]);
        need = active && l == 7 && got.u[1] != flag;
      }
#pragma unroll
      for (int k = 0; k < E; k++) {
        const A x = load_acc<T, Op>(got.e[k], s);
        acc[k] = q == 0 ? x : Op::f(acc[k], x);
      }
    }
    for (int k = 0; k < valid; k++) ((T*)w.dst)[first + k] = store_val<T, Op>(acc[k], w.div);
  }
}

// A launch's LL call number: with a record, this rank's next one, read by thread 0 of every
// block (the last reader advances it) and shared with the block's threads.
__device__ __forceinline__ LlArgs ll_resolve(const LlArgs& a0) {
  __shared__ u32 seq;
  LlArgs a = a0;
  if (a0.base == 0) return a;
  if (threadIdx.x == 0) {
    u64 by[24];
    for (int k = 0; k < 24; k++) by[k] = 0;
    // The host's rule (`next_ll_seq`): from 1, after 2^32 - 2 back to 1 (never 0, and the
    // parity alternates across the wrap).
    const u64 last = ((volatile const u64*)a0.base)[3];
    const u64 next = last >= 0xfffffffeull ? 1ull : last + 1;
    by[3] = next - last;
    seq = (u32)next;
    base_advance(a0.base, by);
  }
  __syncthreads();
  a.seq = seq;
  return a;
}

// The meeting's arguments, resolved by thread 0 into shared memory (only thread 0 reads them).
#define OXK(opname, Op, tname, T) \
  extern "C" __global__ void __launch_bounds__(512, OX_MINBLOCKS) oxk_##opname##_##tname(Work w, Sync s0) { \
    if (s0.arr == 0) { run_work<T, Op<T> >(w); return; } \
    __shared__ Sync s; \
    if (threadIdx.x == 0) { s = s0; sync_resolve(s); } \
    if (sync_arrive(s)) run_work<T, Op<T> >(w); \
    sync_depart(s); \
  } \
  extern "C" __global__ void __launch_bounds__(512, OX_MINBLOCKS) oxk_ll_##opname##_##tname(LlArgs a) { \
    ll_all_reduce<T, Op<T> >(ll_resolve(a)); \
  } \
  extern "C" __global__ void __launch_bounds__(512, OX_MINBLOCKS) oxk_ll128_##opname##_##tname(LlArgs a) { \
    ll128_all_reduce<T, Op<T> >(ll_resolve(a)); \
  }
