/* Every kind of bad argument to every nccl.h call: each must return the documented error
 * code, with ncclGetLastError naming the argument, and leave the communicator usable.
 *
 * Usage: invalid DIR NRANKS RANK. Prints "INVALID OK rank R (N cases)".
 */
#include <stdint.h>

#include "common.h"

static int cases = 0;

/* `call` must return `code`, and the last error must contain `what`. */
#define EXPECT_ERR(call, code, what)                                                          \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    const char* m_ = ncclGetLastError(NULL);                                                  \
    EXPECT(r_ == (code), "%s returned %d (%s), expected %d; last error: %s", #call, (int)r_, \
           ncclGetErrorString(r_), (int)(code), m_);                                          \
    EXPECT(strstr(m_, what) != NULL, "%s: last error \"%s\" does not name \"%s\"", #call, m_, what); \
    cases++;                                                                                  \
  } while (0)

#define BAD_ARG(call, what) EXPECT_ERR(call, ncclInvalidArgument, what)
#define BAD_USE(call, what) EXPECT_ERR(call, ncclInvalidUsage, what)

/* One-sided calls, windows and their queries: every bad argument, then a good put. */
static void check_one_sided(ncclComm_t comm, int P, int R, float* f) {
  float wbuf[64] = {0};
  ncclWindow_t w, w2;
  void* p = NULL;
  int peer = (R + 1) % P, prev = (R + P - 1) % P;
  NCCLCHECK(ncclCommWindowRegister(comm, wbuf, sizeof wbuf, &w, NCCL_WIN_DEFAULT));
  BAD_ARG(ncclPutSignal(NULL, 4, ncclFloat, peer, w, 0, 0, 0, 0, comm, NULL), "localbuff");
  BAD_ARG(ncclPutSignal(f, 4, (ncclDataType_t)12, peer, w, 0, 0, 0, 0, comm, NULL), "datatype");
  BAD_ARG(ncclPutSignal(f, SIZE_MAX, ncclFloat, peer, w, 0, 0, 0, 0, comm, NULL), "count");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, P, w, 0, 0, 0, 0, comm, NULL), "peer");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, -1, w, 0, 0, 0, 0, comm, NULL), "peer");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, NULL, 0, 0, 0, 0, comm, NULL), "peerWin");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, (ncclWindow_t)(void*)f, 0, 0, 0, 0, comm, NULL), "peerWin");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, 250, 0, 0, 0, comm, NULL), "peerWinOffset");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, SIZE_MAX - 4, 0, 0, 0, comm, NULL), "peerWinOffset");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, 0, -1, 0, 0, comm, NULL), "sigIdx");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, 0, 1000, 0, 0, comm, NULL), "sigIdx");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, 0, 0, 1, 0, comm, NULL), "numRmaCtx = 1");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, 0, 0, -1, 0, comm, NULL), "ctx");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, 0, 0, 0, 2, comm, NULL), "flags");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, 0, 0, 0, 0, NULL, NULL), "comm");
  BAD_ARG(ncclSignal(P, 0, 0, 0, comm, NULL), "peer");
  BAD_ARG(ncclSignal(peer, -3, 0, 0, comm, NULL), "sigIdx");
  BAD_ARG(ncclSignal(peer, 0, 7, 0, comm, NULL), "ctx");
  BAD_ARG(ncclSignal(peer, 0, 0, 1, comm, NULL), "flags");
  BAD_ARG(ncclSignal(peer, 0, 0, 0, NULL, NULL), "comm");
  ncclWaitSignalDesc_t d[2] = {{1, prev, 0, 0}, {1, prev, 0, 0}};
  BAD_ARG(ncclWaitSignal(0, d, comm, NULL), "nDesc");
  BAD_ARG(ncclWaitSignal(-1, d, comm, NULL), "nDesc");
  BAD_ARG(ncclWaitSignal(1, NULL, comm, NULL), "signalDescs");
  d[1].opCnt = 0;
  BAD_ARG(ncclWaitSignal(2, d, comm, NULL), "signalDescs[1].opCnt");
  d[1].opCnt = -4;
  BAD_ARG(ncclWaitSignal(2, d, comm, NULL), "signalDescs[1].opCnt");
  d[1].opCnt = 1;
  d[1].peer = P;
  BAD_ARG(ncclWaitSignal(2, d, comm, NULL), "signalDescs[1].peer");
  d[1].peer = prev;
  d[1].sigIdx = -1;
  BAD_ARG(ncclWaitSignal(2, d, comm, NULL), "signalDescs[1].sigIdx");
  d[1].sigIdx = 0;
  d[1].ctx = 3;
  BAD_ARG(ncclWaitSignal(2, d, comm, NULL), "signalDescs[1].ctx");
  d[1].ctx = 0;
  BAD_ARG(ncclWaitSignal(1, d, NULL, NULL), "comm");
  BAD_ARG(ncclWinGetUserPtr(comm, w, NULL), "outUserPtr");
  BAD_ARG(ncclWinGetUserPtr(comm, NULL, &p), "win");
  BAD_ARG(ncclWinGetUserPtr(comm, (ncclWindow_t)(void*)f, &p), "win");
  BAD_ARG(ncclGetPeerDevicePointer(NULL, 0, 0, &p), "window");
  BAD_ARG(ncclGetPeerDevicePointer(w, 0, 0, NULL), "outPtr");
  BAD_ARG(ncclGetPeerDevicePointer(w, 0, P, &p), "peer");
  BAD_ARG(ncclGetPeerDevicePointer(w, 0, -1, &p), "peer");
  BAD_ARG(ncclGetPeerDevicePointer((ncclWindow_t)(void*)f, 0, 0, &p), "window");
  BAD_ARG(ncclGetLsaDevicePointer(w, 0, -1, &p), "lsaRank");
  BAD_ARG(ncclGetLsaDevicePointer(w, 0, P, &p), "lsaRank");
  BAD_ARG(ncclGetLsaDevicePointer(NULL, 0, 0, &p), "window");
  BAD_ARG(ncclGetLsaDevicePointer(w, 0, 0, NULL), "outPtr");
  BAD_ARG(ncclGetLsaMultimemDevicePointer(NULL, 0, &p), "window");
  BAD_ARG(ncclGetLsaMultimemDevicePointer(w, 0, NULL), "outPtr");
  /* A window of another communicator, and one whose config turned one-sided calls off. */
  ncclConfig_t off = NCCL_CONFIG_INITIALIZER;
  off.numRmaCtx = 0;
  ncclComm_t other;
  NCCLCHECK(ncclCommSplit(comm, 0, R, &other, &off));
  NCCLCHECK(ncclCommWindowRegister(other, wbuf, sizeof wbuf, &w2, NCCL_WIN_DEFAULT));
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w2, 0, 0, 0, 0, comm, NULL), "not of this one");
  BAD_ARG(ncclWinGetUserPtr(comm, w2, &p), "not of this one");
  BAD_ARG(ncclCommWindowDeregister(comm, w2), "win");
  BAD_ARG(ncclSignal(peer, 0, 0, 0, other, NULL), "turns one-sided calls off");
  NCCLCHECK(ncclCommWindowDeregister(other, w2));
  NCCLCHECK(ncclCommDestroy(other));
  /* In a group, a bad one-sided call fails the group, which runs nothing. */
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclSignal(peer, 0, 0, 0, comm, NULL));
  BAD_ARG(ncclSignal(peer, 0, 0, 9, comm, NULL), "flags");
  BAD_ARG(ncclGroupEnd(), "flags");
  /* Good calls still work: a put of the whole window from the previous rank. */
  float src[64];
  for (int i = 0; i < 64; i++) src[i] = (float)(R * 100 + i);
  NCCLCHECK(ncclPutSignal(src, 64, ncclFloat, peer, w, 0, 0, 0, 0, comm, NULL));
  NCCLCHECK(ncclWaitSignal(1, d, comm, NULL));
  for (int i = 0; i < 64; i++) EXPECT(wbuf[i] == (float)(prev * 100 + i), "put [%d] = %g", i, wbuf[i]);
  NCCLCHECK(ncclWinGetUserPtr(comm, w, &p));
  EXPECT(p == (void*)wbuf, "user pointer %p", p);
  /* Deregistered: refused by every call. */
  NCCLCHECK(ncclCommWindowDeregister(comm, w));
  BAD_ARG(ncclCommWindowDeregister(comm, w), "win");
  BAD_ARG(ncclPutSignal(f, 4, ncclFloat, peer, w, 0, 0, 0, 0, comm, NULL), "deregistered");
  BAD_ARG(ncclWinGetUserPtr(comm, w, &p), "win");
  BAD_ARG(ncclGetPeerDevicePointer(w, 0, 0, &p), "window");
}

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const char* dir = argv[1];
  int P = atoi(argv[2]), R = g_rank = atoi(argv[3]);
  char path[4096];
  snprintf(path, sizeof path, "%s/id", dir);

  /* Before any communicator. */
  BAD_ARG(ncclGetVersion(NULL), "version");
  BAD_ARG(ncclGetUniqueId(NULL), "uniqueId");
  for (int r = 0; r < 8; r++) EXPECT(strlen(ncclGetErrorString((ncclResult_t)r)) > 0, "error string %d", r);
  EXPECT(strstr(ncclGetErrorString((ncclResult_t)99), "unknown") != NULL, "unknown code's string");
  ncclUniqueId id, junk;
  memset(&junk, 0x5a, sizeof junk);
  ncclComm_t comm = NULL, other = NULL;
  BAD_ARG(ncclCommInitRank(NULL, P, junk, R), "comm");
  BAD_ARG(ncclCommInitRank(&other, 0, junk, 0), "nranks");
  BAD_ARG(ncclCommInitRank(&other, P, junk, -1), "rank");
  BAD_ARG(ncclCommInitRank(&other, P, junk, P), "rank");
  BAD_ARG(ncclCommInitRank(&other, P, junk, R), "commId");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  BAD_ARG(ncclCommInitRankConfig(&other, P, junk, R, &cfg), "config");
  ncclGetUniqueId(&junk); /* a real id nobody else joins: rejected before any contact */
  ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
  cfg2.blocking = 5;
  BAD_ARG(ncclCommInitRankConfig(&other, P, junk, R, &cfg2), "config->blocking");
  ncclConfig_t cfg3 = NCCL_CONFIG_INITIALIZER;
  cfg3.netName = "IB";
  BAD_ARG(ncclCommInitRankConfig(&other, P, junk, R, &cfg3), "config->netName");
  ncclConfig_t cfg4 = NCCL_CONFIG_INITIALIZER;
  cfg4.numRmaCtx = -1;
  BAD_ARG(ncclCommInitRankConfig(&other, P, junk, R, &cfg4), "config->numRmaCtx");
  BAD_ARG(ncclCommInitAll(NULL, 2, NULL), "comm");
  ncclComm_t two[2];
  BAD_ARG(ncclCommInitAll(two, 0, NULL), "ndev");
  int devs[2] = {0, -3};
  BAD_ARG(ncclCommInitAll(two, 2, devs), "devlist");
  BAD_ARG(ncclCommInitRankScalable(&other, P, R, 0, &junk, NULL), "nId");
  BAD_ARG(ncclCommInitRankScalable(&other, P, R, 1, NULL, NULL), "commIds");

  /* A good communicator, through the scalable init. */
  share_id(path, R, &id);
  NCCLCHECK(ncclCommInitRankScalable(&comm, P, R, 1, &id, NULL));
  int n, bogus_storage = 0;
  ncclComm_t bogus = (ncclComm_t)(void*)&bogus_storage;
  BAD_ARG(ncclCommCount(comm, NULL), "count");
  BAD_ARG(ncclCommCount(NULL, &n), "comm");
  BAD_ARG(ncclCommCount(bogus, &n), "not a communicator");
  BAD_ARG(ncclCommUserRank(comm, NULL), "rank");
  BAD_ARG(ncclCommCuDevice(comm, NULL), "device");
  BAD_ARG(ncclCommGetAsyncError(comm, NULL), "asyncError");

  float f[64] = {0}, g[64] = {0};
  BAD_ARG(ncclAllReduce(NULL, g, 4, ncclFloat, ncclSum, comm, NULL), "sendbuff");
  BAD_ARG(ncclAllReduce(f, NULL, 4, ncclFloat, ncclSum, comm, NULL), "recvbuff");
  BAD_ARG(ncclAllReduce(f, g, 4, (ncclDataType_t)12, ncclSum, comm, NULL), "datatype");
  BAD_ARG(ncclAllReduce(f, g, 4, (ncclDataType_t)-1, ncclSum, comm, NULL), "datatype");
  BAD_ARG(ncclAllReduce(f, g, 4, ncclFloat, (ncclRedOp_t)99, comm, NULL), "op");
  BAD_ARG(ncclAllReduce(f, g, 4, ncclFloat, (ncclRedOp_t)-2, comm, NULL), "op");
  BAD_ARG(ncclAllReduce(f, g, SIZE_MAX, ncclFloat, ncclSum, comm, NULL), "count");
  BAD_ARG(ncclAllReduce(f, f + 1, 8, ncclFloat, ncclSum, comm, NULL), "overlaps");
  BAD_ARG(ncclAllReduce(f, g, 4, ncclFloat, ncclSum, NULL, NULL), "comm");
  BAD_ARG(ncclAllReduce(f, g, 4, ncclFloat, ncclSum, bogus, NULL), "comm");
  BAD_ARG(ncclBroadcast(f, g, 4, ncclFloat, P, comm, NULL), "root");
  BAD_ARG(ncclBroadcast(f, g, 4, ncclFloat, -1, comm, NULL), "root");
  BAD_ARG(ncclBcast(NULL, 4, ncclFloat, 0, comm, NULL), "buff");
  BAD_ARG(ncclReduce(f, g, 4, ncclFloat, ncclSum, P + 3, comm, NULL), "root");
  BAD_ARG(ncclReduce(f, g, 4, (ncclDataType_t)40, ncclSum, 0, comm, NULL), "datatype");
  BAD_ARG(ncclAllGather(f, g, SIZE_MAX / 2, ncclFloat, comm, NULL), "count");
  BAD_ARG(ncclAllGather(f, NULL, 1, ncclFloat, comm, NULL), "recvbuff");
  BAD_ARG(ncclReduceScatter(f, NULL, 1, ncclFloat, ncclSum, comm, NULL), "recvbuff");
  BAD_ARG(ncclReduceScatter(f, g, 1, ncclFloat, (ncclRedOp_t)5, comm, NULL), "op");
  /* In place (f, f) is an all-to-all's legal layout; a shifted overlap is not. */
  BAD_ARG(ncclAlltoAll(f, f + 1, 2, ncclFloat, comm, NULL), "overlaps");
  BAD_ARG(ncclAlltoAll(NULL, g, 2, ncclFloat, comm, NULL), "sendbuff");
  BAD_ARG(ncclGather(f, g, 1, ncclFloat, P, comm, NULL), "root");
  BAD_ARG(ncclGather(NULL, g, 1, ncclFloat, 0, comm, NULL), "sendbuff");
  BAD_ARG(ncclScatter(f, g, 1, ncclFloat, -7, comm, NULL), "root");
  BAD_ARG(ncclScatter(f, NULL, 1, ncclFloat, 0, comm, NULL), "recvbuff");
  BAD_ARG(ncclSend(f, 4, ncclFloat, P, comm, NULL), "peer");
  BAD_ARG(ncclSend(NULL, 4, ncclFloat, 0, comm, NULL), "sendbuff");
  BAD_ARG(ncclRecv(g, 4, ncclFloat, -1, comm, NULL), "peer");
  BAD_ARG(ncclRecv(g, 4, (ncclDataType_t)77, 0, comm, NULL), "datatype");
  /* The errors name this rank too. */
  char want_rank[64];
  snprintf(want_rank, sizeof want_rank, "rank %d", R);
  BAD_ARG(ncclAllReduce(f, g, 4, ncclFloat, (ncclRedOp_t)42, comm, NULL), want_rank);

  /* PreMulSum operators. */
  ncclRedOp_t op;
  double two_d = 2.0;
  BAD_ARG(ncclRedOpCreatePreMulSum(NULL, &two_d, ncclDouble, ncclScalarHostImmediate, comm), "op");
  BAD_ARG(ncclRedOpCreatePreMulSum(&op, NULL, ncclDouble, ncclScalarHostImmediate, comm), "scalar");
  BAD_ARG(ncclRedOpCreatePreMulSum(&op, &two_d, (ncclDataType_t)13, ncclScalarHostImmediate, comm), "datatype");
  BAD_ARG(ncclRedOpCreatePreMulSum(&op, &two_d, ncclDouble, (ncclScalarResidence_t)7, comm), "residence");
  BAD_ARG(ncclRedOpCreatePreMulSum(&op, &two_d, ncclDouble, ncclScalarHostImmediate, NULL), "comm");
  NCCLCHECK(ncclRedOpCreatePreMulSum(&op, &two_d, ncclDouble, ncclScalarHostImmediate, comm));
  BAD_ARG(ncclAllReduce(f, g, 4, ncclFloat, op, comm, NULL), "created for double");
  BAD_ARG(ncclRedOpDestroy(ncclSum, comm), "built-in");
  NCCLCHECK(ncclRedOpDestroy(op, comm));
  BAD_ARG(ncclRedOpDestroy(op, comm), "op");
  BAD_ARG(ncclRedOpDestroy((ncclRedOp_t)12345, comm), "op");

  /* Memory, registration, windows. */
  void* p = NULL;
  BAD_ARG(ncclMemAlloc(NULL, 16), "ptr");
  BAD_ARG(ncclMemAlloc(&p, 0), "size");
  BAD_ARG(ncclMemFree(f), "ptr");
  void* h = NULL;
  BAD_ARG(ncclCommRegister(comm, NULL, 64, &h), "buff");
  BAD_ARG(ncclCommRegister(comm, f, 0, &h), "size");
  BAD_ARG(ncclCommRegister(comm, f, 64, NULL), "handle");
  BAD_ARG(ncclCommRegister(NULL, f, 64, &h), "comm");
  BAD_ARG(ncclCommDeregister(comm, (void*)f), "handle");
  ncclWindow_t win;
  BAD_ARG(ncclCommWindowRegister(comm, f, 64, &win, 8), "winFlags");
  BAD_ARG(ncclCommWindowRegister(comm, f, 64, NULL, 0), "win");
  NCCLCHECK(ncclCommRegister(comm, f, sizeof f, &h));
  BAD_ARG(ncclCommWindowDeregister(comm, (ncclWindow_t)h), "win");
  NCCLCHECK(ncclCommDeregister(comm, h));
  BAD_ARG(ncclCommDeregister(comm, h), "handle");
  check_one_sided(comm, P, R, f);

  /* Split and shrink. */
  ncclComm_t child;
  BAD_ARG(ncclCommSplit(comm, 0, 0, NULL, NULL), "newcomm");
  BAD_ARG(ncclCommSplit(comm, -5, 0, &child, NULL), "color");
  BAD_ARG(ncclCommSplit(bogus, 0, 0, &child, NULL), "comm");
  int excl[2] = {P, 0};
  BAD_ARG(ncclCommShrink(comm, excl, 1, &child, NULL, 4), "shrinkFlags");
  BAD_ARG(ncclCommShrink(comm, excl, -1, &child, NULL, 0), "excludeRanksCount");
  BAD_ARG(ncclCommShrink(comm, NULL, 1, &child, NULL, 0), "excludeRanksList");
  BAD_ARG(ncclCommShrink(comm, excl, 1, &child, NULL, 0), "excludeRanksList[0]");
  BAD_ARG(ncclCommShrink(comm, excl, 1, NULL, NULL, 0), "newcomm");
  excl[0] = R;
  BAD_USE(ncclCommShrink(comm, excl, 1, &child, NULL, 0), "excludeRanksList");

  /* Groups: a bad call inside one fails the whole group, which then runs nothing. */
  BAD_USE(ncclGroupEnd(), "ncclGroupStart");
  float before = 7.0f, sum = 0.0f;
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllReduce(&before, &sum, 1, ncclFloat, ncclSum, comm, NULL));
  BAD_ARG(ncclAllReduce(&before, &sum, 1, (ncclDataType_t)99, ncclSum, comm, NULL), "datatype");
  BAD_ARG(ncclGroupEnd(), "datatype");
  EXPECT(sum == 0.0f, "a failed group ran a call (sum = %g)", sum);
  BAD_ARG(ncclGroupSimulateEnd(NULL), "simInfo");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  sim.magic = 1;
  BAD_ARG(ncclGroupSimulateEnd(&sim), "NCCL_SIM_INFO_INITIALIZER");
  /* An in-place all-to-all reads its input when its group starts: a call before it in the
     group that writes that buffer is refused by name (every rank alike here), nothing run. */
  float a2a[64] = {0};
  for (int i = 0; i < 2 * P; i++) a2a[i] = 5.0f;
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllReduce(f, a2a, 2 * P, ncclFloat, ncclSum, comm, NULL));
  NCCLCHECK(ncclAlltoAll(a2a, a2a, 2, ncclFloat, comm, NULL));
  BAD_USE(ncclGroupEnd(), "end the group between the two");
  EXPECT(a2a[0] == 5.0f, "a refused group ran a call (a2a[0] = %g)", a2a[0]);
  /* The communicator still works. */
  NCCLCHECK(ncclAllReduce(&before, &sum, 1, ncclFloat, ncclSum, comm, NULL));
  EXPECT(sum == 7.0f * P, "all-reduce after the bad calls = %g", sum);

  /* The device API is refused, never faked. */
  BAD_USE(ncclDevCommCreate(comm, NULL, NULL), "not supported");
  BAD_USE(ncclDevCommDestroy(comm, NULL), "not supported");
  EXPECT(strstr(ncclGetLastError(comm), "not supported") != NULL, "per-communicator last error: %s", ncclGetLastError(comm));

  /* Finalize, then only destroy; then the handle is refused by name. */
  ncclComm_t dup;
  NCCLCHECK(ncclCommSplit(comm, 0, R, &dup, NULL));
  NCCLCHECK(ncclCommFinalize(dup));
  BAD_USE(ncclAllReduce(f, g, 1, ncclFloat, ncclSum, dup, NULL), "finalized");
  NCCLCHECK(ncclCommDestroy(dup));
  BAD_USE(ncclAllReduce(f, g, 1, ncclFloat, ncclSum, dup, NULL), "destroyed");
  BAD_USE(ncclCommDestroy(dup), "destroyed");
  BAD_USE(ncclCommAbort(dup), "destroyed");
  BAD_USE(ncclCommCount(dup, &n), "destroyed");
  NCCLCHECK(ncclCommDestroy(NULL));
  NCCLCHECK(ncclCommAbort(NULL));
  NCCLCHECK(ncclCommDestroy(comm));

  /* A nonblocking init that cannot complete (rank 1 of 2 never comes): polling
   * ncclCommGetAsyncError turns from ncclInProgress into the failure (the join
   * timeout, OXCCL_TIMEOUT=2 here); calls on the communicator then answer the same failure. */
  if (R == 0) {
    EXPECT(setenv("OXCCL_TIMEOUT", "2", 1) == 0, "setenv");
    ncclUniqueId lonely;
    NCCLCHECK(ncclGetUniqueId(&lonely));
    ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
    nb.blocking = 0;
    ncclComm_t half;
    ncclResult_t r0 = ncclCommInitRankConfig(&half, 2, lonely, 0, &nb);
    EXPECT(r0 == ncclInProgress, "nonblocking init returned %d", (int)r0);
    ncclResult_t st = ncclInProgress;
    int polls = 0;
    while (st == ncclInProgress && polls++ < 20000) {
      NCCLCHECK(ncclCommGetAsyncError(half, &st));
      usleep(1000);
    }
    EXPECT(st == ncclRemoteError, "async error %d after %d polls", (int)st, polls);
    EXPECT_ERR(ncclAllReduce(f, g, 1, ncclFloat, ncclSum, half, NULL), ncclRemoteError, "timed out");
    NCCLCHECK(ncclCommDestroy(half));
  }
  printf("INVALID OK rank %d (%d cases)\n", R, cases);
  return 0;
}
