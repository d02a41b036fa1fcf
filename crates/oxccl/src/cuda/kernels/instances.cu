// kernels/instances.cu: OXK(opname, Op, tname, T), the three extern "C" kernels of one
// operator and type (the reduce-copy with its meeting, LL, LL128); kernels.rs appends one
// OXK line per variant after this file.
// Rules: last of the kernel files; defines no kernel by itself.

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
