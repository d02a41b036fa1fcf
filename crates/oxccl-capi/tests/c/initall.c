/* One thread drives several ranks: ncclCommInitAll, and ncclCommInitRank for every rank
 * inside one group; then grouped collectives and one-sided calls over all of them. Prints
 * "INITALL OK". */
#include <stdint.h>

#include "common.h"

#define N 4

static void all_reduce_over(ncclComm_t* comms, int n, const char* what) {
  int32_t send[N][100], recv[N][100];
  for (int r = 0; r < n; r++)
    for (int i = 0; i < 100; i++) send[r][i] = (r + 1) * (i + 1);
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) NCCLCHECK(ncclAllReduce(send[r], recv[r], 100, ncclInt32, ncclSum, comms[r], NULL));
  NCCLCHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++)
    for (int i = 0; i < 100; i++) EXPECT(recv[r][i] == n * (n + 1) / 2 * (i + 1), "%s: rank %d [%d] = %d", what, r, i, recv[r][i]);
  /* A ring of sends and receives across the communicators, in one group. */
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    NCCLCHECK(ncclSend(send[r], 100, ncclInt32, (r + 1) % n, comms[r], NULL));
    NCCLCHECK(ncclRecv(recv[r], 100, ncclInt32, (r + n - 1) % n, comms[r], NULL));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++)
    for (int i = 0; i < 100; i++) EXPECT(recv[r][i] == send[(r + n - 1) % n][i], "%s ring: rank %d [%d]", what, r, i);
}

/* One-sided calls across the ranks of this one thread: windows registered in one group (the
 * registration is collective), then each rank puts to the next and waits for the previous
 * one's put, all in one group (a rank's put and wait run in order, the ranks side by side). */
static void one_sided_over(ncclComm_t* comms, int n) {
  int32_t win[N][64], src[N][64];
  ncclWindow_t w[N];
  memset(win, 0, sizeof win);
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) NCCLCHECK(ncclCommWindowRegister(comms[r], win[r], sizeof win[r], &w[r], 0));
  NCCLCHECK(ncclGroupEnd());
  for (int round = 0; round < 3; round++) {
    NCCLCHECK(ncclGroupStart());
    for (int r = 0; r < n; r++) {
      for (int i = 0; i < 64; i++) src[r][i] = round * 1000 + r * 100 + i;
      ncclWaitSignalDesc_t d = {1, (r + n - 1) % n, 0, 0};
      NCCLCHECK(ncclPutSignal(src[r], 64, ncclInt32, (r + 1) % n, w[r], 0, 0, 0, 0, comms[r], NULL));
      NCCLCHECK(ncclWaitSignal(1, &d, comms[r], NULL));
    }
    NCCLCHECK(ncclGroupEnd());
    for (int r = 0; r < n; r++)
      for (int i = 0; i < 64; i++)
        EXPECT(win[r][i] == round * 1000 + (r + n - 1) % n * 100 + i, "one-sided round %d: rank %d [%d] = %d", round,
               r, i, win[r][i]);
    /* Everyone has read its window before the next round writes it. */
    NCCLCHECK(ncclGroupStart());
    for (int r = 0; r < n; r++) {
      ncclWaitSignalDesc_t d = {1, (r + 1) % n, 0, 0};
      NCCLCHECK(ncclSignal((r + n - 1) % n, 0, 0, 0, comms[r], NULL));
      NCCLCHECK(ncclWaitSignal(1, &d, comms[r], NULL));
    }
    NCCLCHECK(ncclGroupEnd());
  }
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) NCCLCHECK(ncclCommWindowDeregister(comms[r], w[r]));
  NCCLCHECK(ncclGroupEnd());
}

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  g_rank = 0;
  ncclComm_t comms[N];
  int devs[N] = {3, 2, 1, 0};
  NCCLCHECK(ncclCommInitAll(comms, N, devs));
  for (int r = 0; r < N; r++) {
    int rank, count, dev;
    NCCLCHECK(ncclCommUserRank(comms[r], &rank));
    NCCLCHECK(ncclCommCount(comms[r], &count));
    NCCLCHECK(ncclCommCuDevice(comms[r], &dev));
    EXPECT(rank == r && count == N && dev == devs[r], "InitAll comm %d: rank %d count %d dev %d", r, rank, count, dev);
  }
  all_reduce_over(comms, N, "InitAll");
  one_sided_over(comms, N);

  /* Split every communicator in one group (each split needs all of them at once). */
  ncclComm_t halves[N];
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) NCCLCHECK(ncclCommSplit(comms[r], r / 2, r, &halves[r], NULL));
  NCCLCHECK(ncclGroupEnd());
  all_reduce_over(halves, 2, "split low half");
  all_reduce_over(halves + 2, 2, "split high half");
  for (int r = 0; r < N; r++) {
    NCCLCHECK(ncclCommDestroy(halves[r]));
    NCCLCHECK(ncclCommDestroy(comms[r]));
  }

  /* Grouped ncclCommInitRank for three ranks from this one thread. */
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  ncclComm_t g[3];
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < 3; r++) NCCLCHECK(ncclCommInitRank(&g[r], 3, id, r));
  NCCLCHECK(ncclGroupEnd());
  all_reduce_over(g, 3, "grouped init");
  for (int r = 0; r < 3; r++) NCCLCHECK(ncclCommAbort(g[r]));
  printf("INITALL OK\n");
  return 0;
}
