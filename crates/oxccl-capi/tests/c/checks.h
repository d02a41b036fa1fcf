/* Exact checks of every collective on host memory, shared by the C test programs. Inputs are
 * small integers, so every reduction order gives the same exact answer and each result is
 * compared exactly. P and R are the communicator's size and this process's rank. */
#ifndef OXCCL_TEST_CHECKS_H
#define OXCCL_TEST_CHECKS_H

#include <stdint.h>

#include "common.h"

static int P, R;

static void* xmalloc(size_t n) {
  void* p = calloc(n ? n : 1, 1);
  EXPECT(p != NULL, "out of memory");
  return p;
}

/* Element i of rank r's input. */
static int val(int r, size_t i) { return (int)((r + 1) * (int)(i % 7 + 1)); }

static void check_all_reduce(ncclComm_t comm, size_t n) {
  float* s = xmalloc(n * sizeof(float));
  float* d = xmalloc(n * sizeof(float));
  int64_t* si = xmalloc(n * sizeof(int64_t));
  double* sd = xmalloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) {
    s[i] = (float)val(R, i);
    si[i] = val(R, i);
    sd[i] = val(R, i);
  }
  int tri = P * (P + 1) / 2;
  /* Sum, out of place. */
  NCCLCHECK(ncclAllReduce(s, d, n, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++) EXPECT(d[i] == (float)(tri * (int)(i % 7 + 1)), "sum[%zu] = %g", i, d[i]);
  /* Max, Min, Prod on int64, in place. */
  NCCLCHECK(ncclAllReduce(si, si, n, ncclInt64, ncclMax, comm, NULL));
  for (size_t i = 0; i < n; i++) EXPECT(si[i] == (int64_t)P * (int64_t)(i % 7 + 1), "max[%zu] = %lld", i, (long long)si[i]);
  for (size_t i = 0; i < n; i++) si[i] = val(R, i);
  NCCLCHECK(ncclAllReduce(si, si, n, ncclInt64, ncclMin, comm, NULL));
  for (size_t i = 0; i < n; i++) EXPECT(si[i] == (int64_t)(i % 7 + 1), "min[%zu]", i);
  for (size_t i = 0; i < n; i++) si[i] = R + 2;
  NCCLCHECK(ncclAllReduce(si, si, n, ncclInt64, ncclProd, comm, NULL));
  int64_t prod = 1;
  for (int q = 0; q < P; q++) prod *= q + 2;
  for (size_t i = 0; i < n; i++) EXPECT(si[i] == prod, "prod[%zu] = %lld", i, (long long)si[i]);
  /* Avg on double: (1 + ... + P) * k / P. */
  NCCLCHECK(ncclAllReduce(sd, sd, n, ncclDouble, ncclAvg, comm, NULL));
  for (size_t i = 0; i < n; i++)
    EXPECT(sd[i] == (double)tri * (double)(i % 7 + 1) / P, "avg[%zu] = %g", i, sd[i]);
  free(s);
  free(d);
  free(si);
  free(sd);
}

static void check_rooted(ncclComm_t comm, size_t n) {
  int32_t* s = xmalloc(n * P * sizeof(int32_t));
  int32_t* d = xmalloc(n * P * sizeof(int32_t));
  for (int root = 0; root < P; root++) {
    /* Broadcast, out of place, then ncclBcast (in place). */
    for (size_t i = 0; i < n; i++) s[i] = R == root ? val(root, i) : -1;
    memset(d, 0, n * sizeof(int32_t));
    NCCLCHECK(ncclBroadcast(s, d, n, ncclInt32, root, comm, NULL));
    for (size_t i = 0; i < n; i++) EXPECT(d[i] == val(root, i), "broadcast root %d [%zu] = %d", root, i, d[i]);
    NCCLCHECK(ncclBcast(s, n, ncclInt32, root, comm, NULL));
    for (size_t i = 0; i < n; i++) EXPECT(s[i] == val(root, i), "bcast root %d [%zu]", root, i);
    /* Reduce: recvbuff is NULL on the other ranks. */
    for (size_t i = 0; i < n; i++) s[i] = val(R, i);
    NCCLCHECK(ncclReduce(s, R == root ? d : NULL, n, ncclInt32, ncclSum, root, comm, NULL));
    if (R == root)
      for (size_t i = 0; i < n; i++) EXPECT(d[i] == P * (P + 1) / 2 * (int)(i % 7 + 1), "reduce root %d [%zu]", root, i);
    /* Gather: rank q's block lands at q * n on the root. */
    for (size_t i = 0; i < n; i++) s[i] = val(R, i);
    NCCLCHECK(ncclGather(s, R == root ? d : NULL, n, ncclInt32, root, comm, NULL));
    if (R == root)
      for (int q = 0; q < P; q++)
        for (size_t i = 0; i < n; i++) EXPECT(d[q * n + i] == val(q, i), "gather root %d from %d [%zu]", root, q, i);
    /* Scatter: the root's block q goes to rank q. */
    if (R == root)
      for (int q = 0; q < P; q++)
        for (size_t i = 0; i < n; i++) s[q * n + i] = val(q, i) + 1000;
    NCCLCHECK(ncclScatter(R == root ? s : NULL, d, n, ncclInt32, root, comm, NULL));
    for (size_t i = 0; i < n; i++) EXPECT(d[i] == val(R, i) + 1000, "scatter root %d [%zu] = %d", root, i, d[i]);
    /* Gather and scatter in place on the root. */
    for (size_t i = 0; i < n; i++) (R == root ? d + root * n : s)[i] = val(R, i) + 7;
    NCCLCHECK(ncclGather(R == root ? d + root * n : s, d, n, ncclInt32, root, comm, NULL));
    if (R == root)
      for (int q = 0; q < P; q++)
        for (size_t i = 0; i < n; i++) EXPECT(d[q * n + i] == val(q, i) + 7, "gather in place from %d", q);
    if (R == root)
      for (int q = 0; q < P; q++)
        for (size_t i = 0; i < n; i++) s[q * n + i] = val(q, i) + 3;
    NCCLCHECK(ncclScatter(s, R == root ? s + root * n : d, n, ncclInt32, root, comm, NULL));
    int32_t* mine = R == root ? s + root * n : d;
    for (size_t i = 0; i < n; i++) EXPECT(mine[i] == val(R, i) + 3, "scatter in place [%zu]", i);
  }
  free(s);
  free(d);
}

static void check_gather_scatter_all(ncclComm_t comm, size_t n) {
  uint8_t* s = xmalloc(n * P);
  uint8_t* d = xmalloc(n * P);
  /* AllGather out of place and in place (own block at rank * n). */
  for (size_t i = 0; i < n; i++) s[i] = (uint8_t)val(R, i);
  NCCLCHECK(ncclAllGather(s, d, n, ncclUint8, comm, NULL));
  for (int q = 0; q < P; q++)
    for (size_t i = 0; i < n; i++) EXPECT(d[q * n + i] == (uint8_t)val(q, i), "allgather from %d [%zu]", q, i);
  memset(d, 0, n * P);
  for (size_t i = 0; i < n; i++) d[R * n + i] = (uint8_t)(val(R, i) + 1);
  NCCLCHECK(ncclAllGather(d + R * n, d, n, ncclUint8, comm, NULL));
  for (int q = 0; q < P; q++)
    for (size_t i = 0; i < n; i++) EXPECT(d[q * n + i] == (uint8_t)(val(q, i) + 1), "allgather in place from %d", q);
  /* ReduceScatter: block q of the sum goes to rank q; then in place. */
  float* fs = xmalloc(n * P * sizeof(float));
  float* fd = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n * P; i++) fs[i] = (float)val(R, i);
  NCCLCHECK(ncclReduceScatter(fs, fd, n, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++)
    EXPECT(fd[i] == (float)(P * (P + 1) / 2 * (int)((R * n + i) % 7 + 1)), "reducescatter [%zu] = %g", i, fd[i]);
  NCCLCHECK(ncclReduceScatter(fs, fs + R * n, n, ncclFloat32, ncclMax, comm, NULL));
  for (size_t i = 0; i < n; i++) EXPECT(fs[R * n + i] == (float)(P * (int)((R * n + i) % 7 + 1)), "reducescatter in place");
  /* AlltoAll: block q of rank r goes to block r of rank q. */
  int32_t* as = xmalloc(n * P * sizeof(int32_t));
  int32_t* ad = xmalloc(n * P * sizeof(int32_t));
  for (int q = 0; q < P; q++)
    for (size_t i = 0; i < n; i++) as[q * n + i] = R * 1000 + q * 10 + (int)(i % 5);
  NCCLCHECK(ncclAlltoAll(as, ad, n, ncclInt32, comm, NULL));
  for (int q = 0; q < P; q++)
    for (size_t i = 0; i < n; i++) EXPECT(ad[q * n + i] == q * 1000 + R * 10 + (int)(i % 5), "alltoall from %d [%zu]", q, i);
  /* AlltoAll in place (sendbuff == recvbuff) on even ranks, out of place on odd ones: NCCL
     lets each rank choose. Each block of an in-place buffer is both sent and replaced. */
  for (int q = 0; q < P; q++)
    for (size_t i = 0; i < n; i++) as[q * n + i] = R * 1000 + q * 10 + (int)(i % 7);
  memset(ad, 0, n * P * sizeof(int32_t));
  int32_t* aout = R % 2 == 0 ? as : ad;
  NCCLCHECK(ncclAlltoAll(as, aout, n, ncclInt32, comm, NULL));
  for (int q = 0; q < P; q++)
    for (size_t i = 0; i < n; i++)
      EXPECT(aout[q * n + i] == q * 1000 + R * 10 + (int)(i % 7), "alltoall (%s) from %d [%zu]",
             R % 2 == 0 ? "in place" : "out of place", q, i);
  free(s);
  free(d);
  free(fs);
  free(fd);
  free(as);
  free(ad);
}

/* A ring shift and a pairwise exchange with ncclSend/ncclRecv in groups; nested groups. */
static void check_send_recv(ncclComm_t comm, size_t n) {
  int next = (R + 1) % P, prev = (R + P - 1) % P;
  double* out = xmalloc(n * sizeof(double));
  double* in = xmalloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) out[i] = R * 100.0 + (double)i;
  for (int round = 0; round < 3; round++) {
    memset(in, 0, n * sizeof(double));
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclSend(out, n, ncclFloat64, next, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    NCCLCHECK(ncclRecv(in, n, ncclFloat64, prev, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    for (size_t i = 0; i < n; i++) EXPECT(in[i] == prev * 100.0 + (double)i, "ring round %d [%zu] = %g", round, i, in[i]);
  }
  /* Everyone exchanges with everyone (and itself) in one group, with a collective too. */
  double* all_in = xmalloc(n * P * sizeof(double));
  float one = 1.0f, sum = 0.0f;
  NCCLCHECK(ncclGroupStart());
  for (int q = 0; q < P; q++) {
    NCCLCHECK(ncclSend(out, n, ncclDouble, q, comm, NULL));
    NCCLCHECK(ncclRecv(all_in + q * n, n, ncclDouble, q, comm, NULL));
  }
  NCCLCHECK(ncclAllReduce(&one, &sum, 1, ncclFloat, ncclSum, comm, NULL));
  NCCLCHECK(ncclGroupEnd());
  for (int q = 0; q < P; q++)
    for (size_t i = 0; i < n; i++) EXPECT(all_in[q * n + i] == q * 100.0 + (double)i, "exchange from %d", q);
  EXPECT(sum == (float)P, "group all-reduce = %g", sum);
  free(out);
  free(in);
  free(all_in);
}

static void check_premul(ncclComm_t comm, size_t n) {
  ncclRedOp_t op;
  double scalar = 0.5 * (R + 1); /* rank r contributes x * (r + 1) / 2 */
  NCCLCHECK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat64, ncclScalarHostImmediate, comm));
  EXPECT((int)op >= (int)ncclNumOps, "premul op %d", (int)op);
  scalar = 1000.0; /* read at creation: changing it now has no effect */
  double* b = xmalloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) b[i] = 2.0 * (double)(i % 3 + 1);
  NCCLCHECK(ncclAllReduce(b, b, n, ncclFloat64, op, comm, NULL));
  for (size_t i = 0; i < n; i++)
    EXPECT(b[i] == (double)(P * (P + 1) / 2) * (double)(i % 3 + 1), "premul all-reduce [%zu] = %g", i, b[i]);
  NCCLCHECK(ncclRedOpDestroy(op, comm));
  /* A device-resident scalar (host memory here) is read when the call runs. */
  int32_t iscalar = 0;
  NCCLCHECK(ncclRedOpCreatePreMulSum(&op, &iscalar, ncclInt32, ncclScalarDevice, comm));
  iscalar = R + 1;
  int32_t x = 3, y = 0;
  NCCLCHECK(ncclReduce(&x, &y, 1, ncclInt32, op, 0, comm, NULL));
  if (R == 0) EXPECT(y == 3 * P * (P + 1) / 2, "premul reduce = %d", y);
  NCCLCHECK(ncclRedOpDestroy(op, comm));
  free(b);
}

/* ncclMemAlloc memory (shared: same-host peers map it), registration and windows. */
static void check_memory(ncclComm_t comm, size_t n) {
  float *a = NULL, *b = NULL;
  NCCLCHECK(ncclMemAlloc((void**)&a, n * sizeof(float)));
  NCCLCHECK(ncclMemAlloc((void**)&b, n * sizeof(float)));
  EXPECT(a != NULL && b != NULL && a != b, "ncclMemAlloc pointers");
  void *ha, *hb;
  ncclWindow_t win;
  NCCLCHECK(ncclCommRegister(comm, a, n * sizeof(float), &ha));
  NCCLCHECK(ncclCommRegister(comm, b, n * sizeof(float), &hb));
  NCCLCHECK(ncclCommWindowRegister(comm, b, n * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC));
  for (int round = 0; round < 4; round++) {
    for (size_t i = 0; i < n; i++) a[i] = (float)(val(R, i) + round);
    NCCLCHECK(ncclAllReduce(a, b, n, ncclFloat, ncclSum, comm, NULL));
    for (size_t i = 0; i < n; i++)
      EXPECT(b[i] == (float)(P * (P + 1) / 2 * (int)(i % 7 + 1) + P * round), "registered all-reduce [%zu]", i);
  }
  NCCLCHECK(ncclCommWindowDeregister(comm, win));
  NCCLCHECK(ncclCommDeregister(comm, ha));
  NCCLCHECK(ncclCommDeregister(comm, hb));
  NCCLCHECK(ncclMemFree(a));
  NCCLCHECK(ncclMemFree(b));
}

/* Every collective and send/recv at sizes from 0 to 70001 elements. */
static void check_every_collective(ncclComm_t comm) {
  size_t sizes[] = {0, 1, 13, 1000, 70001};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    check_all_reduce(comm, sizes[k]);
    check_rooted(comm, sizes[k]);
    check_gather_scatter_all(comm, sizes[k]);
    check_send_recv(comm, sizes[k]);
  }
}

#endif
