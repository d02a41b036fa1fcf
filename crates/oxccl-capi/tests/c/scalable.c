/* ncclCommInitRankScalable with several unique ids: argv DIR N RANK, NIDS from the environment
 * (SCALABLE_NIDS). The first rank of each share (NCCL's split: rank r joins root r*NIDS/N,
 * contiguous) makes that root's id and publishes it as DIR/id.K; every rank reads them all,
 * starts the communicator, checks an all-reduce and an all-gather exact. Prints
 * "SCALABLE OK rank R of N over K roots". */
#include <stdint.h>

#include "common.h"

/* The root serving `rank` (NCCL's rootIdFromRank: the first nranks % nids roots take one more). */
static int root_of(int rank, int nranks, int nids) {
  int per = nranks / nids, extra = nranks % nids, big = extra * (per + 1);
  return rank < big ? rank / (per + 1) : extra + (rank - big) / per;
}

int main(int argc, char** argv) {
  EXPECT(argc == 4, "usage: scalable DIR N RANK");
  const char* dir = argv[1];
  int n = atoi(argv[2]), rank = atoi(argv[3]);
  g_rank = rank;
  const char* e = getenv("SCALABLE_NIDS");
  int nids = e ? atoi(e) : 2;
  EXPECT(nids >= 1 && nids <= n && nids <= 16, "SCALABLE_NIDS=%d", nids);
  ncclUniqueId ids[16];
  char path[4096];
  int mine = root_of(rank, n, nids);
  /* The first rank of its share makes that root's id. */
  if (rank == 0 || root_of(rank - 1, n, nids) != mine) {
    NCCLCHECK(ncclGetUniqueId(&ids[mine]));
    snprintf(path, sizeof path, "%s/id.%d", dir, mine);
    publish_id(path, &ids[mine]);
  }
  for (int k = 0; k < nids; k++) {
    snprintf(path, sizeof path, "%s/id.%d", dir, k);
    wait_id(path, &ids[k]);
  }
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRankScalable(&comm, n, rank, nids, ids, NULL));
  int count = 0, me = -1;
  NCCLCHECK(ncclCommCount(comm, &count));
  NCCLCHECK(ncclCommUserRank(comm, &me));
  EXPECT(count == n && me == rank, "count %d rank %d", count, me);
  int64_t send[1000], recv[1000], all[16 * 8];
  for (int i = 0; i < 1000; i++) send[i] = (int64_t)(rank + 1) * (i + 3);
  NCCLCHECK(ncclAllReduce(send, recv, 1000, ncclInt64, ncclSum, comm, NULL));
  for (int i = 0; i < 1000; i++)
    EXPECT(recv[i] == (int64_t)n * (n + 1) / 2 * (i + 3), "all-reduce [%d] = %lld", i, (long long)recv[i]);
  int64_t piece[8];
  for (int i = 0; i < 8; i++) piece[i] = rank * 100 + i;
  EXPECT(n <= 16, "n %d", n);
  NCCLCHECK(ncclAllGather(piece, all, 8, ncclInt64, comm, NULL));
  for (int r = 0; r < n; r++)
    for (int i = 0; i < 8; i++) EXPECT(all[r * 8 + i] == r * 100 + i, "all-gather [%d][%d]", r, i);
  NCCLCHECK(ncclCommDestroy(comm));
  printf("SCALABLE OK rank %d of %d over %d roots\n", rank, n, nids);
  return 0;
}
