// kernels/sync.cu: how the kernels of one call meet each other on the GPU (Sync: arrival,
// departure, point-to-point readiness, failures and timeouts, the device record of CUDA graph
// replays). The CPU model of this protocol is oxccl's cuda/group/meeting.rs.
// Rules: the comment below; names only common.cu.

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


