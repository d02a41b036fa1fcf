// kernels/ll.cu: the LL and LL128 all-reduces, which exchange flagged lines instead of
// meeting (small and mid sizes), and ll_resolve, a launch's LL call number.
// Rules: the comments below (line layouts, slot reuse, giving up); names every file before
// it (the reduce-copy's folds and stores, the meeting's failure record and device record).

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

