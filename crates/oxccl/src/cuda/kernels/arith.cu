// kernels/arith.cu: element arithmetic: the fp8 codec, each type's accumulator (widening load,
// narrowing store), wrapping integer add and multiply, Avg's division, and the reduction
// operators (Op*) the kernels are instantiated with.
// Rules: the CPU kernels' (oxccl-core's reduce.rs and fp8.rs), as common.cu's comment lists
// them; names only common.cu.

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

