/* Every nccl.h call on host memory, written against NCCL's public documentation only.
 *
 * Usage: collectives DIR NRANKS RANK   (one process per rank; unique ids pass through DIR)
 *
 * Inputs are small integers, so every reduction order gives the same exact answer and each
 * result is compared exactly. Prints "COLLECTIVES OK rank R" at the end.
 */
#include "checks.h"

/* Colors by parity, keys reversing the order; one rank opts out with NCCL_SPLIT_NOCOLOR. */
static void check_split(ncclComm_t comm) {
  ncclComm_t half, most;
  NCCLCHECK(ncclCommSplit(comm, R % 2, -R, &half, NULL));
  int hn, hr;
  NCCLCHECK(ncclCommCount(half, &hn));
  NCCLCHECK(ncclCommUserRank(half, &hr));
  int mates = 0, pos = 0;
  for (int q = P - 1; q >= 0; q--)
    if (q % 2 == R % 2) {
      if (q == R) pos = mates;
      mates++;
    }
  EXPECT(hn == mates && hr == pos, "split: %d of %d, expected %d of %d", hr, hn, pos, mates);
  int v = R, s = 0;
  NCCLCHECK(ncclAllReduce(&v, &s, 1, ncclInt, ncclSum, half, NULL));
  int want = 0;
  for (int q = R % 2; q < P; q += 2) want += q;
  EXPECT(s == want, "split all-reduce %d, expected %d", s, want);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = "most";
  NCCLCHECK(ncclCommSplit(comm, R == P - 1 ? NCCL_SPLIT_NOCOLOR : 0, 0, &most, &cfg));
  if (R == P - 1) {
    EXPECT(most == NULL, "NOCOLOR gives a NULL communicator");
  } else {
    NCCLCHECK(ncclAllReduce(&v, &s, 1, ncclInt, ncclMax, most, NULL));
    EXPECT(s == P - 2, "split (no last rank) max %d", s);
    NCCLCHECK(ncclCommDestroy(most));
  }
  NCCLCHECK(ncclCommFinalize(half));
  NCCLCHECK(ncclCommDestroy(half));
}

/* Nonblocking init on a second unique id, polled with ncclCommGetAsyncError. */
static ncclComm_t nonblocking_init(const char* dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/id-nonblocking", dir);
  ncclUniqueId id;
  share_id(path, R, &id);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "nonblocking";
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRankConfig(&comm, P, id, R, &cfg);
  EXPECT(r == ncclInProgress || r == ncclSuccess, "nonblocking init returned %d", (int)r);
  ncclResult_t state = ncclInProgress;
  int polls = 0;
  for (; state == ncclInProgress && polls < 60000; polls++) {
    NCCLCHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclInProgress) usleep(1000);
  }
  EXPECT(state == ncclSuccess, "nonblocking init ended in %d after %d polls: %s", (int)state, polls, ncclGetLastError(comm));
  return comm;
}

/* The last rank leaves; the others shrink it away and carry on. */
static void check_shrink(ncclComm_t comm) {
  if (R == P - 1) return;
  int excl = P - 1;
  ncclComm_t small;
  NCCLCHECK(ncclCommShrink(comm, &excl, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
  int n, v = 1, s = 0;
  NCCLCHECK(ncclCommCount(small, &n));
  EXPECT(n == P - 1, "shrunk count %d", n);
  NCCLCHECK(ncclAllReduce(&v, &s, 1, ncclInt32, ncclSum, small, NULL));
  EXPECT(s == P - 1, "shrunk all-reduce %d", s);
  NCCLCHECK(ncclCommDestroy(small));
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s DIR NRANKS RANK\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  P = atoi(argv[2]);
  R = g_rank = atoi(argv[3]);
  int version = 0;
  NCCLCHECK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE && version == NCCL_VERSION(2, 30, 7), "version %d", version);

  char path[4096];
  snprintf(path, sizeof path, "%s/id", dir);
  ncclUniqueId id;
  share_id(path, R, &id);
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, P, id, R));
  int n = -1, r = -1, dev = 0;
  NCCLCHECK(ncclCommCount(comm, &n));
  NCCLCHECK(ncclCommUserRank(comm, &r));
  NCCLCHECK(ncclCommCuDevice(comm, &dev));
  EXPECT(n == P && r == R, "count %d rank %d", n, r);
  EXPECT(dev == -1, "host-memory communicator reports CUDA device %d", dev);

  check_every_collective(comm);
  check_premul(comm, 4097);
  check_memory(comm, 100000);
  check_split(comm);

  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  float x = 1;
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL));
  NCCLCHECK(ncclGroupSimulateEnd(&sim));
  EXPECT(x == 1, "a simulated group runs nothing (x = %g)", x);

  ncclResult_t dr = ncclDevCommCreate(comm, NULL, NULL);
  EXPECT(dr == ncclInvalidUsage, "ncclDevCommCreate returned %d", (int)dr);
  EXPECT(strstr(ncclGetLastError(comm), "not supported") != NULL, "last error: %s", ncclGetLastError(comm));

  ncclComm_t nb = nonblocking_init(dir);
  float y = (float)R, z = 0;
  NCCLCHECK(ncclAllReduce(&y, &z, 1, ncclFloat, ncclMax, nb, NULL));
  EXPECT(z == (float)(P - 1), "nonblocking communicator all-reduce %g", z);
  ncclResult_t state;
  NCCLCHECK(ncclCommGetAsyncError(nb, &state));
  EXPECT(state == ncclSuccess, "async error %d", (int)state);
  NCCLCHECK(ncclCommFinalize(nb));
  NCCLCHECK(ncclCommDestroy(nb));

  check_shrink(comm);
  /* The last rank leaves without waiting: the survivors' shrink talks to none of it. */
  NCCLCHECK(ncclCommAbort(comm));
  printf("COLLECTIVES OK rank %d of %d\n", R, P);
  return 0;
}
