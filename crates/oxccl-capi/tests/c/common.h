/* Helpers shared by the C test programs: checked calls and unique ids passed through files. */
#ifndef OXCCL_TEST_COMMON_H
#define OXCCL_TEST_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static int g_rank = -1;

#define NCCLCHECK(call)                                                                   \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) {                                                              \
      fprintf(stderr, "rank %d: %s:%d: %s -> %d (%s): %s\n", g_rank, __FILE__, __LINE__, \
              #call, (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL));            \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

#define EXPECT(cond, ...)                                                       \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "rank %d: %s:%d: expected %s: ", g_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                             \
      fprintf(stderr, "\n");                                                    \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* Publishes `id` at `path` (write, then rename, so readers never see half of it). */
static inline void publish_id(const char* path, const ncclUniqueId* id) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "wb");
  EXPECT(f != NULL, "open %s: %s", tmp, strerror(errno));
  EXPECT(fwrite(id, sizeof *id, 1, f) == 1, "write %s", tmp);
  fclose(f);
  EXPECT(rename(tmp, path) == 0, "rename to %s: %s", path, strerror(errno));
}

/* Waits (up to 60 s, looking every 200 us) for the id published at `path`. */
static inline void wait_id(const char* path, ncclUniqueId* id) {
  for (int i = 0; i < 300000; i++) {
    FILE* f = fopen(path, "rb");
    if (f != NULL) {
      size_t n = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (n == 1) return;
    }
    usleep(200);
  }
  fprintf(stderr, "rank %d: no unique id at %s after 60 s\n", g_rank, path);
  exit(1);
}

/* Rank 0 makes a unique id and publishes it at `path`; the others wait for it. */
static inline void share_id(const char* path, int rank, ncclUniqueId* id) {
  if (rank == 0) {
    NCCLCHECK(ncclGetUniqueId(id));
    publish_id(path, id);
    return;
  }
  wait_id(path, id);
}

#endif
