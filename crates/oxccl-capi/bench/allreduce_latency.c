/* 8-byte all-reduce latency through nccl.h, for comparing the C ABI with the Rust API
 * (oxccl-perf all_reduce_perf -b 8 -e 8) across processes.
 *
 * Usage: allreduce_latency DIR NRANKS RANK [ITERS [ROUNDS]]
 * Each round times ITERS float all-reduces of 2 elements (8 bytes) after a warm-up; rank 0
 * prints each round's microseconds per call and the median.
 */
#include <stdint.h>

#include "../tests/c/common.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  int P = atoi(argv[2]), R = g_rank = atoi(argv[3]);
  int iters = argc > 4 ? atoi(argv[4]) : 20000, rounds = argc > 5 ? atoi(argv[5]) : 5;
  char path[4096];
  snprintf(path, sizeof path, "%s/id", argv[1]);
  ncclUniqueId id;
  share_id(path, R, &id);
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, P, id, R));
  float s[2] = {1, 2}, d[2];
  for (int i = 0; i < 1000; i++) NCCLCHECK(ncclAllReduce(s, d, 2, ncclFloat, ncclSum, comm, NULL));
  double t[64];
  if (rounds > 64) rounds = 64;
  for (int k = 0; k < rounds; k++) {
    double t0 = now_us();
    for (int i = 0; i < iters; i++) NCCLCHECK(ncclAllReduce(s, d, 2, ncclFloat, ncclSum, comm, NULL));
    t[k] = (now_us() - t0) / iters;
    EXPECT(d[0] == (float)P && d[1] == 2.0f * P, "result %g %g", d[0], d[1]);
    if (R == 0) printf("round %d: %.3f us\n", k, t[k]);
  }
  qsort(t, rounds, sizeof *t, cmp);
  if (R == 0) printf("c-abi median %.3f us per 8-byte all-reduce (%d ranks, %d x %d)\n", t[rounds / 2], P, rounds, iters);
  NCCLCHECK(ncclCommDestroy(comm));
  return 0;
}
