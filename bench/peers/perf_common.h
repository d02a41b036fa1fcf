/* What the peer benchmarks share (C and C++): the collectives, nccl-tests' size parsing,
 * counts and bus-bandwidth factors, column formatting, and the verifiable inputs with their
 * expected results (small integers: exact in any reduction order, as in oxccl's test kit). */
#ifndef OXCCL_PEER_PERF_COMMON_H
#define OXCCL_PEER_PERF_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum coll { ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, ALLTOALL } coll;
__attribute__((unused)) static const char* names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "alltoall"};

/* A number in at most `width` columns, like nccl-tests' columns. */
static inline void fstr(double v, int width, char* out) {
  char buf[64];
  const char* fmts[] = {"%*.2f", "%*.1f", "%*.0f"};
  for (int i = 0; i < 3; i++) {
    snprintf(buf, sizeof buf, fmts[i], width, v);
    if ((int)strlen(buf) <= width) {
      strcpy(out, buf);
      return;
    }
  }
  snprintf(out, 32, width >= 7 ? "%*.1e" : "%*.0e", width, v);
}

/* Sizes with K/M/G suffixes (powers of 1024). */
static inline size_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024.0; break;
    case 'M': case 'm': v *= 1024.0 * 1024.0; break;
    case 'G': case 'g': v *= 1024.0 * 1024.0 * 1024.0; break;
  }
  return (size_t)v;
}

/* nccl-tests' counts: param (the API count per rank), send and recv element counts. */
static inline void counts(coll c, size_t bytes, int p, size_t* param, size_t* send, size_t* recv) {
  size_t count = bytes / 4, base = (count / p) & ~(size_t)3;
  switch (c) {
    case ALL_REDUCE: case BROADCAST: *param = *send = *recv = count; break;
    case ALL_GATHER: *param = *send = base; *recv = base * p; break;
    case REDUCE_SCATTER: *param = *recv = base; *send = base * p; break;
    case ALLTOALL: *param = base; *send = *recv = base * p; break;
  }
}

/* Algorithm and bus bandwidth (GB/s) with nccl-tests' factors. */
static inline void bw(coll c, size_t param, double sec, int p, double* alg, double* bus) {
  double bytes = (double)param * 4, f = 1;
  switch (c) {
    case ALL_REDUCE: f = 2.0 * (p - 1) / p; break;
    case BROADCAST: f = 1; break;
    default: bytes *= p; f = (double)(p - 1) / p; break;
  }
  *alg = sec > 0 ? bytes / 1e9 / sec : 0;
  *bus = *alg * f;
}

/* Rank `rank`'s input element i. */
static inline float val(int rank, size_t i) { return (float)((rank * 7 + (int)(i % 13)) % 5); }

/* The expected output element i of rank `me` (root 0, sum). */
static inline float want_at(coll c, int p, int me, size_t param, size_t i) {
  float w = 0;
  switch (c) {
    case ALL_REDUCE: for (int q = 0; q < p; q++) w += val(q, i); break;
    case BROADCAST: w = val(0, i); break;
    case ALL_GATHER: w = val((int)(i / param), i % param); break;
    case REDUCE_SCATTER: for (int q = 0; q < p; q++) w += val(q, (size_t)me * param + i); break;
    case ALLTOALL: w = val((int)(i / param), (size_t)me * param + i % param); break;
  }
  return w;
}

/* One out-of-place result row (rank 0): nccl-tests' columns on stdout, a JSON record in `jf`. */
static inline void out_of_place_row(FILE* jf, int* first, size_t sz, size_t param, int root, double sec,
                                    double alg, double bus, long wrong) {
  char a[3][32];
  fstr(sec * 1e6, 7, a[0]);
  fstr(alg, 6, a[1]);
  fstr(bus, 6, a[2]);
  printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6s  %6s  %6ld\n", sz, param, "float", "sum", -1, a[0], a[1], a[2], wrong);
  fflush(stdout);
  if (jf) {
    fprintf(jf, "%s{\"size\":%zu,\"count\":%zu,\"type\":\"float\",\"redop\":\"sum\",\"root\":%d,\"out_of_place\":{\"time\":%g,\"alg_bw\":%g,\"bus_bw\":%g,\"nwrong\":%ld}}",
            *first ? "" : ",", sz, param, root, sec * 1e6, alg, bus, wrong);
    *first = 0;
  }
}

/* The closing line (rank 0) and the end of the JSON file. */
static inline void finish_report(FILE* jf, long errors) {
  printf("# Out of bounds values : %ld %s\n", errors, errors ? "FAILED" : "OK");
  if (jf) {
    fprintf(jf, "],\"out_of_bounds\":{\"count\":%ld,\"okay\":%s}}\n", errors, errors ? "false" : "true");
    fclose(jf);
  }
}

#endif
