/* NCCL 2.30's elasticity and fault-tolerance calls on host memory, written against nccl.h and
 * NCCL's documentation: ncclCommGetUniqueId + ncclCommGrow (2 processes grow to 4, then every
 * collective runs on the grown communicator), ncclCommSuspend / ncclCommResume /
 * ncclCommMemStats, ncclCommRevoke during a blocked receive and then ncclCommShrink (and a
 * split of a revoked communicator), the parameter calls, a config struct of NCCL 2.28's size,
 * and each new call's invalid arguments.
 *
 * Usage: elastic DIR 4 RANK   (ranks 0 and 1 start; ranks 2 and 3 join by growing)
 * Prints "ELASTIC OK rank R" at the end.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>

#include "checks.h"

static const char* DIR_;

static void path_of(char* out, size_t n, const char* name) { snprintf(out, n, "%s/%s", DIR_, name); }

#define EXPECT_FAIL(call, code, needle)                                                             \
  do {                                                                                              \
    ncclResult_t r_ = (call);                                                                       \
    const char* m_ = ncclGetLastError(NULL);                                                        \
    EXPECT(r_ == (code), "%s returned %d, expected %d (%s)", #call, (int)r_, (int)(code), m_);       \
    EXPECT(strstr(m_, needle) != NULL, "%s: last error \"%s\" does not name \"%s\"", #call, m_, needle); \
  } while (0)

static void touch(const char* name) {
  char p[4096];
  path_of(p, sizeof p, name);
  FILE* f = fopen(p, "w");
  EXPECT(f != NULL, "create %s", p);
  fclose(f);
}

static void wait_file(const char* name) {
  char p[4096];
  path_of(p, sizeof p, name);
  for (int i = 0; i < 6000; i++) {
    if (access(p, F_OK) == 0) return;
    usleep(10000);
  }
  EXPECT(0, "no %s after 60 s", p);
}

/* Parameters are read from the environment at the call. */
static void check_params(void) {
  setenv("NCCL_MAX_NCHANNELS", "4", 1);
  setenv("NCCL_BUFFSIZE", "4194304", 1);
  unsetenv("NCCL_MIN_NCHANNELS");
  ncclParamHandle_t h, h2;
  NCCLCHECK(ncclParamBind(&h, "NCCL_MAX_NCHANNELS"));
  NCCLCHECK(ncclParamBind(&h2, "MAX_NCHANNELS"));
  EXPECT(h == h2, "a key with and without NCCL_ binds one parameter");
  int32_t i32 = 0;
  int8_t i8 = 0;
  uint64_t u64 = 0;
  NCCLCHECK(ncclParamGetI32(h, &i32));
  NCCLCHECK(ncclParamGetI8(h, &i8));
  EXPECT(i32 == 4 && i8 == 4, "NCCL_MAX_NCHANNELS read as %d and %d", i32, i8);
  NCCLCHECK(ncclParamBind(&h, "NCCL_BUFFSIZE"));
  NCCLCHECK(ncclParamGetU64(h, &u64));
  EXPECT(u64 == 4194304, "NCCL_BUFFSIZE read as %llu", (unsigned long long)u64);
  EXPECT_FAIL(ncclParamGetI8(h, &i8), ncclInvalidArgument, "does not fit in i8");
  const char* s = NULL;
  NCCLCHECK(ncclParamGetStr(h, &s));
  EXPECT(strcmp(s, "4194304") == 0, "NCCL_BUFFSIZE as a string: %s", s);
  char raw[4];
  int len = 0;
  EXPECT_FAIL(ncclParamGet(h, raw, sizeof raw, &len), ncclInvalidArgument, "maxLen");
  EXPECT(len == 7, "ncclParamGet says %d bytes are needed", len);
  char raw2[16];
  NCCLCHECK(ncclParamGet(h, raw2, sizeof raw2, &len));
  EXPECT(len == 7 && memcmp(raw2, "4194304", 7) == 0, "ncclParamGet copied %d bytes", len);
  const char* v = NULL;
  int vlen = -1;
  NCCLCHECK(ncclParamGetParameter("NCCL_MAX_NCHANNELS", &v, &vlen));
  EXPECT(strcmp(v, "4") == 0 && vlen == 1, "ncclParamGetParameter: %s (%d)", v, vlen);
  NCCLCHECK(ncclParamBind(&h, "NCCL_MIN_NCHANNELS"));
  EXPECT_FAIL(ncclParamGetI32(h, &i32), ncclInvalidUsage, "is not set");
  NCCLCHECK(ncclParamGetStr(h, &s));
  EXPECT(strcmp(s, "") == 0, "an unset parameter reads as an empty string: %s", s);
  EXPECT_FAIL(ncclParamBind(&h, "NCCL_NO_SUCH_THING"), ncclInvalidArgument, "NCCL_NO_SUCH_THING");
  EXPECT_FAIL(ncclParamBind(NULL, "NCCL_DEBUG"), ncclInvalidArgument, "out");
  EXPECT_FAIL(ncclParamGetI32((ncclParamHandle_t)&h, &i32), ncclInvalidArgument, "not a handle");
  const char** keys = NULL;
  int nkeys = 0;
  NCCLCHECK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  int seen = 0;
  for (int k = 0; k < nkeys; k++)
    seen += strcmp(keys[k], "NCCL_DEBUG") == 0 || strcmp(keys[k], "OXCCL_TIMEOUT") == 0;
  EXPECT(nkeys >= 10 && seen == 2, "%d keys, NCCL_DEBUG and OXCCL_TIMEOUT among them: %d", nkeys, seen);
  unsetenv("NCCL_MAX_NCHANNELS");
  unsetenv("NCCL_BUFFSIZE");
}

/* Invalid arguments of the new communicator calls, on a ready communicator. */
static void check_invalid(ncclComm_t comm) {
  ncclUniqueId id;
  ncclComm_t out;
  uint64_t v;
  EXPECT_FAIL(ncclCommRevoke(comm, 1), ncclInvalidArgument, "revokeFlags");
  EXPECT_FAIL(ncclCommRevoke(NULL, 0), ncclInvalidArgument, "comm");
  EXPECT_FAIL(ncclCommGetUniqueId(comm, NULL), ncclInvalidArgument, "uniqueId");
  EXPECT_FAIL(ncclCommGrow(comm, 4, NULL, -1, NULL, NULL), ncclInvalidArgument, "newcomm");
  EXPECT_FAIL(ncclCommGrow(NULL, 4, NULL, 2, &out, NULL), ncclInvalidArgument, "uniqueId");
  EXPECT_FAIL(ncclCommGrow(comm, 4, NULL, 0, &out, NULL), ncclInvalidArgument, "rank");
  EXPECT_FAIL(ncclCommGrow(comm, 2, NULL, -1, &out, NULL), ncclInvalidArgument, "nRanks");
  memset(&id, 0x5a, sizeof id);
  EXPECT_FAIL(ncclCommGrow(comm, 4, &id, -1, &out, NULL), ncclInvalidArgument, "pending id");
  EXPECT_FAIL(ncclCommSuspend(comm, 4), ncclInvalidArgument, "flags");
  EXPECT_FAIL(ncclCommResume(comm), ncclInvalidUsage, "not suspended");
  EXPECT_FAIL(ncclCommMemStats(comm, ncclStatGpuMemTotal, NULL), ncclInvalidArgument, "value");
  EXPECT_FAIL(ncclCommMemStats(comm, (ncclCommMemStat_t)9, &v), ncclInvalidArgument, "stat");
}

/* Suspend frees what the communicator rebuilds on demand; calls wait for resume. */
static void check_suspend(ncclComm_t comm) {
  uint64_t before[4], during[4], after[4];
  check_all_reduce(comm, 70001);
  for (int s = 0; s < 4; s++) NCCLCHECK(ncclCommMemStats(comm, (ncclCommMemStat_t)s, &before[s]));
  EXPECT(before[ncclStatGpuMemSuspended] == 0, "not suspended yet");
  EXPECT(before[ncclStatGpuMemPersist] > 0, "connections hold memory: %llu", (unsigned long long)before[2]);
  EXPECT(before[ncclStatGpuMemSuspend] > 0, "a collective left working memory: %llu", (unsigned long long)before[0]);
  EXPECT(before[ncclStatGpuMemTotal] == before[0] + before[2], "total = suspendable + persistent");
  NCCLCHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  for (int s = 0; s < 4; s++) NCCLCHECK(ncclCommMemStats(comm, (ncclCommMemStat_t)s, &during[s]));
  EXPECT(during[ncclStatGpuMemSuspended] == 1, "suspended");
  EXPECT(during[ncclStatGpuMemSuspend] == 0, "suspend gave back %llu of %llu bytes",
         (unsigned long long)(before[0] - during[0]), (unsigned long long)before[0]);
  EXPECT(during[ncclStatGpuMemPersist] == before[ncclStatGpuMemPersist], "connections stay");
  int n = 0, x = 1, y = 0;
  NCCLCHECK(ncclCommCount(comm, &n)); /* queries still answer */
  EXPECT_FAIL(ncclAllReduce(&x, &y, 1, ncclInt, ncclSum, comm, NULL), ncclInvalidUsage, "suspended");
  EXPECT_FAIL(ncclCommSuspend(comm, 0), ncclInvalidUsage, "suspended");
  NCCLCHECK(ncclCommResume(comm));
  NCCLCHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &after[1]));
  EXPECT(after[1] == 0, "resumed");
  check_every_collective(comm);
  NCCLCHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &after[0]));
  EXPECT(after[0] > 0, "calls after resume rebuilt their working memory");
}

struct blocked {
  ncclComm_t comm;
  ncclResult_t result;
  char error[512];
};

/* Waits for a message rank 0 never sends. */
static void* blocked_recv(void* arg) {
  struct blocked* b = arg;
  int x = 0;
  b->result = ncclRecv(&x, 1, ncclInt, 0, b->comm, NULL);
  snprintf(b->error, sizeof b->error, "%s", ncclGetLastError(NULL));
  return NULL;
}

/* Ranks 0..2 revoke (rank 1 first, while a receive blocks on another thread) and shrink rank 3
 * away. */
static void check_revoke_then_shrink(ncclComm_t big) {
  if (R == 3) {
    wait_file("revoked-0");
    NCCLCHECK(ncclCommDestroy(big));
    return;
  }
  pthread_t t;
  struct blocked b = {big, ncclSuccess, ""};
  if (R == 1) {
    EXPECT(pthread_create(&t, NULL, blocked_recv, &b) == 0, "pthread_create");
    usleep(300000);
  } else {
    /* Rank 1 revokes first: its own revoke, not a peer's closed connection, must end the
     * receive. */
    wait_file("revoked-1");
  }
  NCCLCHECK(ncclCommRevoke(big, NCCL_REVOKE_DEFAULT));
  if (R == 1) {
    EXPECT(pthread_join(t, NULL) == 0, "pthread_join");
    EXPECT(b.result != ncclSuccess, "the blocked receive ended with success after a revoke");
    EXPECT(strstr(b.error, "abort") != NULL, "the blocked receive's error: %s", b.error);
    touch("revoked-1");
  }
  if (R == 0) touch("revoked-0");
  ncclResult_t st = ncclInProgress;
  NCCLCHECK(ncclCommGetAsyncError(big, &st));
  EXPECT(st == ncclSuccess, "a revoked communicator is quiet when ncclCommRevoke returns: %d", (int)st);
  int x = 1, y = 0;
  EXPECT_FAIL(ncclAllReduce(&x, &y, 1, ncclInt, ncclSum, big, NULL), ncclInvalidUsage, "revoked");
  EXPECT_FAIL(ncclCommFinalize(big), ncclInvalidUsage, "revoked");
  EXPECT_FAIL(ncclCommRevoke(big, 0), ncclInvalidUsage, "already revoked");
  int excl = 3;
  ncclComm_t small;
  NCCLCHECK(ncclCommShrink(big, &excl, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
  int n = 0, r = -1;
  NCCLCHECK(ncclCommCount(small, &n));
  NCCLCHECK(ncclCommUserRank(small, &r));
  EXPECT(n == 3 && r == R, "shrunk to %d ranks, rank %d", n, r);
  P = 3;
  check_all_reduce(small, 1000);
  check_send_recv(small, 1000);
  check_rooted(small, 13);
  P = 4;
  NCCLCHECK(ncclCommDestroy(small));
  NCCLCHECK(ncclCommDestroy(big));
}

int main(int argc, char** argv) {
  if (argc != 4 || atoi(argv[2]) != 4) {
    fprintf(stderr, "usage: %s DIR 4 RANK\n", argv[0]);
    return 2;
  }
  DIR_ = argv[1];
  R = g_rank = atoi(argv[3]);
  char path[4096];
  ncclComm_t comm = NULL, big = NULL;
  ncclUniqueId gid;
  if (R < 2) {
    if (R == 0) check_params();
    P = 2;
    ncclUniqueId id;
    path_of(path, sizeof path, "id");
    share_id(path, R, &id);
    NCCLCHECK(ncclCommInitRank(&comm, 2, id, R));
    check_invalid(comm);
    check_all_reduce(comm, 1000);
    if (R == 0) {
      NCCLCHECK(ncclCommGetUniqueId(comm, &gid));
      EXPECT_FAIL(ncclCommGetUniqueId(comm, &gid), ncclInvalidUsage, "not consumed");
      path_of(path, sizeof path, "grow-id");
      publish_id(path, &gid);
    }
    NCCLCHECK(ncclCommGrow(comm, 4, R == 0 ? &gid : NULL, -1, &big, NULL));
    if (R == 0) {
      ncclComm_t again;
      EXPECT_FAIL(ncclCommGrow(comm, 4, &gid, -1, &again, NULL), ncclInvalidArgument, "pending id");
    }
  } else {
    path_of(path, sizeof path, "grow-id");
    wait_id(path, &gid);
    /* A config as a program built against NCCL 2.28 passes it: its size ends before 2.30's
     * fields, which hold garbage here and must not be read. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.size = offsetof(ncclConfig_t, graphUsageMode);
    cfg.commName = "grown";
    cfg.graphUsageMode = cfg.numRmaCtx = cfg.maxP2pPeers = cfg.graphStreamOrdering = -77;
    NCCLCHECK(ncclCommGrow(NULL, 4, &gid, R, &big, &cfg));
  }
  P = 4;
  int n = 0, r = -1;
  NCCLCHECK(ncclCommCount(big, &n));
  NCCLCHECK(ncclCommUserRank(big, &r));
  EXPECT(n == 4 && r == R, "grown communicator: rank %d of %d", r, n);
  check_every_collective(big);
  check_premul(big, 4097);
  check_memory(big, 100000);
  check_suspend(big);

  if (R < 2) {
    /* The old communicator still works, and a split of it after a revoke re-forms it. */
    P = 2;
    check_all_reduce(comm, 13);
    NCCLCHECK(ncclCommRevoke(comm, 0));
    ncclComm_t part;
    NCCLCHECK(ncclCommSplit(comm, 0, -R, &part, NULL));
    int pr = -1, v = R + 1, s = 0;
    NCCLCHECK(ncclCommUserRank(part, &pr));
    EXPECT(pr == 1 - R, "split of a revoked communicator: rank %d (keys reverse the order)", pr);
    NCCLCHECK(ncclAllReduce(&v, &s, 1, ncclInt, ncclSum, part, NULL));
    EXPECT(s == 3, "all-reduce on the split of a revoked communicator: %d", s);
    NCCLCHECK(ncclCommDestroy(part));
    NCCLCHECK(ncclCommDestroy(comm));
    P = 4;
  }
  check_revoke_then_shrink(big);
  printf("ELASTIC OK rank %d\n", R);
  return 0;
}
