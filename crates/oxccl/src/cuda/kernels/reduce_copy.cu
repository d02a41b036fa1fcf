// kernels/reduce_copy.cu: the reduce-copy and the byte copy over a launch's work list: vector
// loads and folds per source, the exchange task of in-place all-to-all, one task
// (reduce_task) and a whole work list (run_work), and the copy kernel oxk_copy.
// Rules: every block does every task in order (grid-stride within each); 16-byte vectors only
// when every pointer of a task is 16-byte aligned; names common.cu and arith.cu.

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

