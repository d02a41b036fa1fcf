/* One-sided calls (ncclPutSignal, ncclSignal, ncclWaitSignal) on windows over ncclMemAlloc
 * memory and over malloc memory, written against NCCL's documentation.
 *
 * Usage: rma DIR NRANKS RANK   (one process per rank; unique ids pass through DIR)
 *
 * Every rank registers two windows of NRANKS slots (window A on ncclMemAlloc memory, window B
 * on malloc memory, the second inside a group). Each round, every rank puts a block into slot
 * R of every rank's window B (itself too) and a smaller one into slot R of window A, in one
 * group, B first in even rounds (A's puts then queue behind B's stream) and A first in odd
 * ones (zero copy where a peer mapped A); each target waits for one signal from every rank
 * and checks the first window's blocks whole (a peer's first signal vouches for its first
 * put), waits for one more and checks the other's, then all acknowledge with ncclSignal and
 * wait for the acknowledgements before the next round writes the slots again. Lengths, data types and bytes change every round.
 * Then: the window queries, a wait ended by ncclCommAbort from another thread, and the
 * deregistrations (one inside a group). Prints "RMA OK rank R of P (N bytes checked)".
 */
#include <pthread.h>
#include <stdint.h>

#include "common.h"

static int P, R;
enum { ROUNDS = 6, SLOT = 200003 };

static uint8_t byte_of(int round, int from, int to, size_t i) {
  return (uint8_t)((round * 131 + from * 31 + to * 17 + i * 7) % 251);
}

/* Bytes rank `from` puts to `to` in round `round` (window B; window A gets a tenth). The
 * data type cycles so counts are element counts of several sizes; one round sends 0 bytes to
 * one peer (a put of nothing still signals). */
static size_t len_of(int round, int from, int to) {
  if (round == 3 && to == (from + 1) % P) return 0;
  size_t n = SLOT - (size_t)((round * 977 + from * 13 + to) % 1000);
  return n - n % 8;
}

static ncclDataType_t dtype_of(int round, size_t* esize) {
  static const ncclDataType_t t[] = {ncclUint8, ncclFloat, ncclInt64, ncclHalf};
  static const size_t s[] = {1, 4, 8, 2};
  *esize = s[round % 4];
  return t[round % 4];
}

static void fill(uint8_t* p, size_t n, int round, int from, int to) {
  for (size_t i = 0; i < n; i++) p[i] = byte_of(round, from, to, i);
}

static size_t check(const uint8_t* p, size_t n, int round, int from, const char* what) {
  for (size_t i = 0; i < n; i++)
    EXPECT(p[i] == byte_of(round, from, R, i), "round %d: %s byte %zu from rank %d is %u, not %u", round, what, i,
           from, p[i], byte_of(round, from, R, i));
  return n;
}

static void wait_all(ncclComm_t comm, int opcnt) {
  ncclWaitSignalDesc_t* d = calloc((size_t)P, sizeof *d);
  EXPECT(d != NULL, "out of memory");
  for (int q = 0; q < P; q++) {
    d[q].opCnt = opcnt;
    d[q].peer = q;
    d[q].sigIdx = 0;
    d[q].ctx = 0;
  }
  NCCLCHECK(ncclWaitSignal(P, d, comm, NULL));
  free(d);
}

struct aborter {
  ncclComm_t comm;
};

static void* abort_later(void* arg) {
  struct aborter* a = arg;
  usleep(300 * 1000);
  NCCLCHECK(ncclCommAbort(a->comm));
  return NULL;
}

/* A wait for a signal nobody sends ends when another thread aborts the communicator; the
 * other ranks end theirs once rank 0 says it is done (so no departure ends rank 0's first). */
static void check_abort_ends_wait(ncclComm_t comm) {
  ncclComm_t side;
  NCCLCHECK(ncclCommSplit(comm, 0, R, &side, NULL));
  if (R == 0) {
    struct aborter a = {side};
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, abort_later, &a) == 0, "pthread_create");
    ncclWaitSignalDesc_t d = {1, P - 1, 0, 0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ncclResult_t r = ncclWaitSignal(1, &d, side, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    const char* m = ncclGetLastError(NULL);
    EXPECT(r != ncclSuccess, "a wait on an aborted communicator succeeded");
    EXPECT(strstr(m, "abort") != NULL, "the aborted wait says: %s", m);
    EXPECT(s < 10, "the aborted wait took %.1f s", s);
    pthread_join(t, NULL);
    for (int q = 1; q < P; q++) NCCLCHECK(ncclSignal(q, 0, 0, 0, comm, NULL));
  } else {
    ncclWaitSignalDesc_t d = {1, 0, 0, 0};
    NCCLCHECK(ncclWaitSignal(1, &d, comm, NULL));
    NCCLCHECK(ncclCommAbort(side));
  }
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s DIR NRANKS RANK\n", argv[0]);
    return 2;
  }
  P = atoi(argv[2]);
  R = g_rank = atoi(argv[3]);
  char path[2048];
  snprintf(path, sizeof path, "%.2000s/id", argv[1]);
  ncclUniqueId id;
  share_id(path, R, &id);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.numRmaCtx = 1;
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRankConfig(&comm, P, id, R, &cfg));

  size_t wbytes = (size_t)P * SLOT;
  uint8_t *a = NULL, *b = NULL;
  NCCLCHECK(ncclMemAlloc((void**)&a, wbytes / 10 + 4096));
  b = aligned_alloc(4096, wbytes);
  EXPECT(b != NULL, "out of memory");
  memset(b, 0, wbytes);
  ncclWindow_t wa, wb;
  NCCLCHECK(ncclCommWindowRegister(comm, a, wbytes / 10 + 4096, &wa, NCCL_WIN_COLL_SYMMETRIC));
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclCommWindowRegister(comm, b, wbytes, &wb, NCCL_WIN_STRICT_ORDERING));
  NCCLCHECK(ncclGroupEnd());
  void* user = NULL;
  NCCLCHECK(ncclWinGetUserPtr(comm, wb, &user));
  EXPECT(user == b, "ncclWinGetUserPtr gave %p, not %p", user, (void*)b);
  NCCLCHECK(ncclWinGetUserPtr(comm, wa, &user));
  EXPECT(user == a, "ncclWinGetUserPtr gave %p, not %p", user, (void*)a);

  uint8_t** src = calloc((size_t)P, sizeof *src);
  EXPECT(src != NULL, "out of memory");
  for (int q = 0; q < P; q++) {
    src[q] = malloc(SLOT);
    EXPECT(src[q] != NULL, "out of memory");
  }
  size_t checked = 0;
  const size_t aslot = SLOT / 10;
  for (int round = 0; round < ROUNDS; round++) {
    size_t es;
    ncclDataType_t t = dtype_of(round, &es);
    /* Even rounds: window B first (the stream), then A, whose puts must wait behind B's;
     * odd rounds: A first (zero copy where the peer mapped it), then B. */
    NCCLCHECK(ncclGroupStart());
    for (int k = 0; k < 2; k++) {
      int on_a = (k == 1) == (round % 2 == 0);
      for (int q = 0; q < P; q++) {
        size_t n = len_of(round, R, q);
        if (k == 0) fill(src[q], n, round, R, q);
        if (on_a) /* window A's block: the first tenth of the same bytes, as bytes */
          NCCLCHECK(ncclPutSignal(src[q], n / 10, ncclUint8, q, wa, (size_t)R * aslot, 0, 0, 0, comm, NULL));
        else
          NCCLCHECK(ncclPutSignal(src[q], n / es, t, q, wb, (size_t)R * SLOT, 0, 0, 0, comm, NULL));
      }
    }
    NCCLCHECK(ncclGroupEnd());
    /* Each peer's first signal vouches for its first put, the second for the second. */
    for (int k = 0; k < 2; k++) {
      int on_a = (k == 1) == (round % 2 == 0);
      wait_all(comm, 1);
      for (int q = 0; q < P; q++) {
        if (on_a)
          checked += check(a + (size_t)q * aslot, len_of(round, q, R) / 10, round, q, "window A");
        else
          checked += check(b + (size_t)q * SLOT, len_of(round, q, R), round, q, "window B");
      }
    }
    NCCLCHECK(ncclGroupStart());
    for (int q = 0; q < P; q++) NCCLCHECK(ncclSignal(q, 0, 0, 0, comm, NULL));
    NCCLCHECK(ncclGroupEnd());
    wait_all(comm, 1);
  }

  /* No device API: the device-pointer queries answer NULL. */
  void* dp = (void*)1;
  NCCLCHECK(ncclGetPeerDevicePointer(wa, 0, P - 1, &dp));
  EXPECT(dp == NULL, "peer device pointer %p", dp);
  dp = (void*)1;
  NCCLCHECK(ncclGetLsaDevicePointer(wb, 16, 0, &dp));
  EXPECT(dp == NULL, "LSA device pointer %p", dp);
  dp = (void*)1;
  NCCLCHECK(ncclGetLsaMultimemDevicePointer(wb, 0, &dp));
  EXPECT(dp == NULL, "multimem pointer %p", dp);

  check_abort_ends_wait(comm);

  NCCLCHECK(ncclCommWindowDeregister(comm, wa));
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclCommWindowDeregister(comm, wb));
  NCCLCHECK(ncclGroupEnd());
  NCCLCHECK(ncclMemFree(a));
  free(b);
  for (int q = 0; q < P; q++) free(src[q]);
  free(src);
  NCCLCHECK(ncclCommDestroy(comm));
  printf("RMA OK rank %d of %d (%zu bytes checked)\n", R, P, checked);
  return 0;
}
