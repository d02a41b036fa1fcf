/* A process that forms and ends communicators over and over (elastic training, a framework
 * re-forming its groups) must not accumulate anything: after the first few cycles, open
 * descriptors and threads stay exactly the same and resident memory stays flat.
 *
 * Usage: lifecycle DIR NRANKS RANK, with OXCCL_TEST_MODE (default destroy) and
 * OXCCL_TEST_CYCLES (default 1000) in the environment:
 *   MODE destroy:  ncclCommInitRank, one ncclAllReduce, ncclCommDestroy
 *        finalize: the same, ending with ncclCommFinalize then ncclCommDestroy
 *        abort:    the same, ending with ncclCommAbort
 *        nonblocking: a nonblocking init (polled with ncclCommGetAsyncError), then as destroy
 *        shrink:   also ncclCommShrink (every other cycle with NCCL_SHRINK_ABORT), one
 *                  ncclAllReduce on the child, then the parent and the child destroyed
 *        split:    also ncclCommSplit, one ncclAllReduce on the child, both destroyed
 * Every cycle checks the reduction's exact values and that the ended handle is refused by
 * name ("was destroyed"). Unique ids pass through DIR, one file per cycle.
 *
 * Prints "LIFECYCLE MODE cycles N fds A B threads A B rss_kb A B heap A B ..." (A after cycle
 * 10, B after the last; heap: bytes malloc has handed out and not taken back) and
 * "LIFECYCLE OK rank R"; the test driving it (c_programs.rs) compares the numbers.
 */
#include <dirent.h>
#include <malloc.h>
#include <stdint.h>

#include "common.h"

static int P, R;

/* Entries of a /proc directory (`.` and `..` left out). */
static int count_dir(const char* path) {
  DIR* d = opendir(path);
  EXPECT(d != NULL, "opendir %s: %s", path, strerror(errno));
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static long rss_kb(void) {
  FILE* f = fopen("/proc/self/status", "r");
  EXPECT(f != NULL, "open /proc/self/status");
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  fclose(f);
  EXPECT(kb > 0, "no VmRSS line");
  return kb;
}

/* Rank 0 publishes cycle `c`'s id at DIR/id.c (write, then rename); the others poll for it
 * every 200 µs (a cycle takes a few ms: a coarser poll would dominate the run). */
static void share(const char* dir, int c, ncclUniqueId* id) {
  char path[4096];
  snprintf(path, sizeof path, "%s/id.%d", dir, c);
  if (R == 0) {
    NCCLCHECK(ncclGetUniqueId(id));
    publish_id(path, id);
    return;
  }
  wait_id(path, id);
  unlink(path); /* the last reader removes it: DIR holds a file or two at any time */
}

/* One all-reduce of 8 floats on `comm` (of `n` ranks, this one `r`), values checked. */
static void reduce_once(ncclComm_t comm, int n, int r, int c) {
  float s[8], d[8];
  for (int i = 0; i < 8; i++) s[i] = (float)((r + 1) * (i + 1) + c % 5);
  NCCLCHECK(ncclAllReduce(s, d, 8, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < 8; i++) {
    float want = (float)(n * (n + 1) / 2 * (i + 1) + n * (c % 5));
    EXPECT(d[i] == want, "cycle %d: sum[%d] = %g, expected %g", c, i, d[i], want);
  }
}

/* `comm` was ended: every call on it is refused by name. */
static void expect_gone(ncclComm_t comm, int c) {
  int n = -1;
  ncclResult_t r = ncclCommCount(comm, &n);
  const char* m = ncclGetLastError(NULL);
  EXPECT(r == ncclInvalidUsage && strstr(m, "was destroyed") != NULL,
         "cycle %d: a call on an ended communicator returned %d (%s)", c, (int)r, m);
}

static void cycle(const char* dir, const char* mode, int c) {
  ncclUniqueId id;
  share(dir, c, &id);
  ncclComm_t comm = NULL;
  if (strcmp(mode, "nonblocking") == 0) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm, P, id, R, &cfg);
    EXPECT(r == ncclSuccess || r == ncclInProgress, "nonblocking init returned %d", (int)r);
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) NCCLCHECK(ncclCommGetAsyncError(comm, &st));
    EXPECT(st == ncclSuccess, "cycle %d: nonblocking init ended with %d: %s", c, (int)st, ncclGetLastError(comm));
  } else {
    NCCLCHECK(ncclCommInitRank(&comm, P, id, R));
  }
  reduce_once(comm, P, R, c);
  if (strcmp(mode, "abort") == 0) {
    NCCLCHECK(ncclCommAbort(comm));
  } else if (strcmp(mode, "finalize") == 0) {
    NCCLCHECK(ncclCommFinalize(comm));
    NCCLCHECK(ncclCommDestroy(comm));
  } else if (strcmp(mode, "shrink") == 0 || strcmp(mode, "split") == 0) {
    ncclComm_t child = NULL;
    if (mode[1] == 'h') {
      int flags = c % 2 ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
      NCCLCHECK(ncclCommShrink(comm, NULL, 0, &child, NULL, flags));
    } else {
      NCCLCHECK(ncclCommSplit(comm, 0, R, &child, NULL));
    }
    reduce_once(child, P, R, c);
    NCCLCHECK(ncclCommDestroy(comm));
    expect_gone(comm, c);
    NCCLCHECK(ncclCommDestroy(child));
    comm = child;
  } else {
    NCCLCHECK(ncclCommDestroy(comm));
  }
  expect_gone(comm, c);
}

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const char* dir = argv[1];
  P = atoi(argv[2]);
  R = g_rank = atoi(argv[3]);
  const char* mode = getenv("OXCCL_TEST_MODE") ? getenv("OXCCL_TEST_MODE") : "destroy";
  int cycles = getenv("OXCCL_TEST_CYCLES") ? atoi(getenv("OXCCL_TEST_CYCLES")) : 1000;
  static const char* modes[] = {"destroy", "finalize", "abort", "nonblocking", "shrink", "split"};
  int known = 0;
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) known |= strcmp(mode, modes[i]) == 0;
  EXPECT(known, "OXCCL_TEST_MODE %s is not a mode (see the usage)", mode);
  EXPECT(cycles > 10, "CYCLES %d (more than 10: the first 10 warm up)", cycles);
  int fds[2], threads[2];
  long rss[2], heap[2];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int c = 1; c <= cycles; c++) {
    cycle(dir, mode, c);
    if (c == 10 || c == cycles) {
      int k = c == cycles;
      /* Free pages the allocator keeps are given back first, so RSS counts memory in use
       * (glibc keeps freed memory of every thread's arena resident otherwise). */
      malloc_trim(0);
      fds[k] = count_dir("/proc/self/fd");
      threads[k] = count_dir("/proc/self/task");
      rss[k] = rss_kb();
      heap[k] = (long)mallinfo2().uordblks;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("LIFECYCLE %s cycles %d fds %d %d threads %d %d rss_kb %ld %ld heap %ld %ld secs %.2f ms_per_cycle %.2f\n",
         mode, cycles, fds[0], fds[1], threads[0], threads[1], rss[0], rss[1], heap[0], heap[1], secs,
         secs * 1e3 / cycles);
  printf("LIFECYCLE OK rank %d\n", R);
  return 0;
}
