// kernels/common.cu: what every kernel shares: the fixed-width types, the element types'
// bit containers (h16, b16, e4m3, e5m2), the tuning macros (OX_UNROLL, OX_PAIR, ...), the
// limits (OX_MAXSRC, OX_MAXDST, OX_MAXTASK: kernels.rs's MAX_SOURCES, MAX_DESTS, MAX_TASKS) and
// a launch's work list (Task, Work).
// Rules: first of the kernel files (kernels.rs concatenates them in the order common.cu,
// arith.cu, reduce_copy.cu, sync.cu, ll.cu, instances.cu, each using only those before it);
// the comment below is the whole kernel set's, and holds for every file.

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

