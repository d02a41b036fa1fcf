// oxccl's device kernels: copy and reduce-copy, compiled at run time by NVRTC.
// No headers: NVRTC is given none. The instantiations (one extern "C" kernel per operator and
// type) are appended by kernels.rs, which also holds the list of names.
//
// Rules (the same as the CPU kernels in oxccl-core's reduce.rs):
// - integer arithmetic wraps (done in unsigned arithmetic, so no signed overflow);
// - f16 and bf16 are widened to f32, combined, and rounded once (round to nearest even);
// - f32 and f64 are combined in their own precision;
// - each thread moves 16-byte vectors when every pointer is 16-byte aligned (`vec` != 0),
//   else single elements; OX_UNROLL vectors are in flight per thread and source.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;
struct __align__(2) h16 { u16 x; };
struct __align__(2) b16 { u16 x; };
struct __align__(16) V16 { u32 w[4]; };

#ifndef OX_UNROLL
#define OX_UNROLL 8
#endif
#define OX_MAXSRC 8
#define OX_MAXDST 8
struct Srcs { const void* p[OX_MAXSRC]; };
// Every destination receives the same result (a reduce-scatter that writes each slice
// straight into every rank's output is an all-reduce that reads each input once).
struct Dsts { void* p[OX_MAXDST]; };

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

template <typename T> struct OpSum { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return wadd(a, b); } };
template <typename T> struct OpProd { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return wmul(a, b); } };
// NaN-ignoring like Rust's f32::max/min (the CPU kernels' rule); integers compare plainly.
template <typename T> struct OpMax { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return (a != a) ? b : (b != b) ? a : (Cmp<T>::lt(a, b) ? b : a); } };
template <typename T> struct OpMin { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return (a != a) ? b : (b != b) ? a : (Cmp<T>::lt(b, a) ? b : a); } };
template <typename T> struct OpBand { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return a & b; } };
template <typename T> struct OpBor { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return a | b; } };
template <typename T> struct OpBxor { template <typename A> static __device__ __forceinline__ A f(A a, A b) { return a ^ b; } };

template <typename T, typename Op>
__device__ __forceinline__ void reduce_body(const Srcs& s, int nsrc, const Dsts& d, int ndst, u64 n, int vec) {
  typedef typename Acc<T>::A A;
  constexpr int PER = 16 / sizeof(T);
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 nv = vec ? n / PER : 0;
  union U { V16 u; T e[PER]; };
  for (u64 base = tid; base < nv; base += stride * OX_UNROLL) {
    A acc[OX_UNROLL][PER];
    U in[OX_UNROLL];
#pragma unroll
    for (int r = 0; r < OX_UNROLL; r++) {
      const u64 v = base + r * stride;
      if (v < nv) in[r].u = ((const V16*)s.p[0])[v];
    }
#pragma unroll
    for (int r = 0; r < OX_UNROLL; r++)
#pragma unroll
      for (int k = 0; k < PER; k++) acc[r][k] = Acc<T>::ld(in[r].e[k]);
    for (int j = 1; j < nsrc; j++) {
#pragma unroll
      for (int r = 0; r < OX_UNROLL; r++) {
        const u64 v = base + r * stride;
        if (v < nv) in[r].u = ((const V16*)s.p[j])[v];
      }
#pragma unroll
      for (int r = 0; r < OX_UNROLL; r++)
#pragma unroll
        for (int k = 0; k < PER; k++) acc[r][k] = Op::f(acc[r][k], Acc<T>::ld(in[r].e[k]));
    }
#pragma unroll
    for (int r = 0; r < OX_UNROLL; r++) {
      const u64 v = base + r * stride;
      if (v < nv) {
        U o;
#pragma unroll
        for (int k = 0; k < PER; k++) o.e[k] = Acc<T>::st(acc[r][k]);
        if (ndst == 1) {
          ((V16*)d.p[0])[v] = o.u;
        } else {
          for (int j = 0; j < ndst; j++) ((V16*)d.p[j])[v] = o.u;
        }
      }
    }
  }
  for (u64 i = nv * PER + tid; i < n; i += stride) {
    A acc = Acc<T>::ld(((const T*)s.p[0])[i]);
    for (int j = 1; j < nsrc; j++) acc = Op::f(acc, Acc<T>::ld(((const T*)s.p[j])[i]));
    const T out = Acc<T>::st(acc);
    for (int j = 0; j < ndst; j++) ((T*)d.p[j])[i] = out;
  }
}

extern "C" __global__ void __launch_bounds__(512) oxk_copy(const u8* __restrict__ src, u8* __restrict__ dst, u64 n, int vec) {
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 nv = vec ? n / 16 : 0;
  for (u64 base = tid; base < nv; base += stride * OX_UNROLL) {
    V16 t[OX_UNROLL];
#pragma unroll
    for (int r = 0; r < OX_UNROLL; r++) {
      const u64 v = base + r * stride;
      if (v < nv) t[r] = ((const V16*)src)[v];
    }
#pragma unroll
    for (int r = 0; r < OX_UNROLL; r++) {
      const u64 v = base + r * stride;
      if (v < nv) ((V16*)dst)[v] = t[r];
    }
  }
  for (u64 i = nv * 16 + tid; i < n; i += stride) dst[i] = src[i];
}

// A barrier across the kernels of several ranks (threads of one process, one context, one
// launch each per call, every block of all of them co-resident), met at the kernel's start
// and end. `arr` is null for a plain reduce-copy.
// - Arrival: block 0 of `rank` raises arr[rank] to `seq` (this call's number, counted from 1
//   by every rank alike); thread 0 of every block waits until every rank's arr is >= seq, so
//   every rank's stream has reached this call: its input is written and its output free.
// - Departure: every block adds 1 to *dep after its writes; block 0 waits until *dep reaches
//   `depart` (the sum of every rank's blocks over all calls so far), so when the kernel ends
//   every rank has finished reading this rank's input and writing this rank's output.
// - A wait longer than `timeout_ns` (0: forever), or a failure already recorded, stops it:
//   the first failure is recorded in *fail (device) and in host[0..3] (host-mapped: code,
//   0, seq) for the host to read without waiting for the stream; the code is
//   1 | waiting rank << 8 | missing rank << 16 (0xff: unknown) | phase << 24 (0 arrival,
//   1 departure). A failed block skips its work, and every later call sees *fail and skips.
struct Bar {
  u64* arr;
  u64* dep;
  u32* fail;
  u32* host;
  u64 seq;
  u64 depart;
  u64 timeout_ns;
  int rank;
  int p;
};

__device__ __forceinline__ u64 ld_acq(const u64* a) { u64 v; asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(a) : "memory"); return v; }
__device__ __forceinline__ u32 ld_acq32(const u32* a) { u32 v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory"); return v; }
__device__ __forceinline__ u64 now_ns() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

__device__ void bar_fail(const Bar& b, u32 code) {
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
__device__ bool bar_wait(const Bar& b, const u64* a, u64 want, u32 phase, int missing) {
  u64 t0 = 0;
  while (ld_acq(a) < want) {
    if (ld_acq32(b.fail) != 0u) return false;
    const u64 t = now_ns();
    if (t0 == 0) t0 = t;
    else if (b.timeout_ns != 0 && t - t0 > b.timeout_ns) {
      bar_fail(b, 1u | ((u32)b.rank << 8) | ((u32)(missing & 0xff) << 16) | (phase << 24));
      return false;
    }
    __nanosleep(200);
  }
  return true;
}

__device__ bool bar_arrive(const Bar& b) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) {
      __threadfence();
      atomicMax(&b.arr[b.rank], b.seq);
    }
    bool good = ld_acq32(b.fail) == 0u;
    for (int q = 0; q < b.p && good; q++) good = bar_wait(b, &b.arr[q], b.seq, 0, q);
    ok = good;
  }
  __syncthreads();
  return ok != 0;
}

__device__ void bar_depart(const Bar& b) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(b.dep, 1ull);
    if (blockIdx.x == 0) bar_wait(b, b.dep, b.depart, 1, 0xff);
  }
}

#define OXK(opname, Op, tname, T) \
  extern "C" __global__ void __launch_bounds__(512) oxk_##opname##_##tname(Srcs s, int nsrc, Dsts d, int ndst, u64 n, int vec, Bar b) { \
    if (b.arr == 0) { reduce_body<T, Op<T> >(s, nsrc, d, ndst, n, vec); return; } \
    if (bar_arrive(b)) reduce_body<T, Op<T> >(s, nsrc, d, ndst, n, vec); \
    bar_depart(b); \
  }
