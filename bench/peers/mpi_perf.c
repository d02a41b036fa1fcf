/* A small MPI collective benchmark with oxccl-perf's sizes, timing method, output columns and
 * JSON schema, so MPI libraries (Open MPI, Intel MPI) can be compared with oxccl side by side.
 *
 *   mpi_perf <all_reduce|broadcast|all_gather|reduce_scatter|alltoall> -b MIN -e MAX -f FACTOR
 *            -n ITERS -w WARMUP -J out.json -L label
 *
 * Per size: one call, a barrier, ITERS timed calls; the per-call time is averaged over ranks
 * (nccl-tests' -a 1). Data: float32 small integers, checked exactly after the timed loop.
 * Bus-bandwidth factors are nccl-tests'. Buffers are 64-byte aligned heap memory.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_common.h"

static void run(coll c, float *s, float *r, size_t param, int in_place, MPI_Comm comm) {
    int p, me;
    MPI_Comm_size(comm, &p);
    MPI_Comm_rank(comm, &me);
    switch (c) {
    case ALL_REDUCE:
        MPI_Allreduce(in_place ? MPI_IN_PLACE : s, r, (int)param, MPI_FLOAT, MPI_SUM, comm);
        break;
    case BROADCAST:
        if (!in_place && me == 0) memcpy(r, s, param * 4);
        MPI_Bcast(r, (int)param, MPI_FLOAT, 0, comm);
        break;
    case ALL_GATHER:
        MPI_Allgather(in_place ? MPI_IN_PLACE : s, (int)param, MPI_FLOAT, r, (int)param, MPI_FLOAT, comm);
        break;
    case REDUCE_SCATTER:
        if (in_place) MPI_Reduce_scatter_block(MPI_IN_PLACE, r, (int)param, MPI_FLOAT, MPI_SUM, comm);
        else MPI_Reduce_scatter_block(s, r, (int)param, MPI_FLOAT, MPI_SUM, comm);
        break;
    case ALLTOALL:
        MPI_Alltoall(in_place ? MPI_IN_PLACE : s, (int)param, MPI_FLOAT, r, (int)param, MPI_FLOAT, comm);
        break;
    }
}

/* Fills inputs and returns the number of wrong elements of one checked call. */
static long check(coll c, float *s, float *r, size_t param, size_t sendc, size_t recvc, int in_place, MPI_Comm comm) {
    int p, me;
    MPI_Comm_size(comm, &p);
    MPI_Comm_rank(comm, &me);
    float *in = in_place ? r : s;
    if (in_place && c == ALL_GATHER) in = r + (size_t)me * param;
    for (size_t i = 0; i < sendc; i++) in[i] = val(me, i);
    if (!in_place) for (size_t i = 0; i < recvc; i++) r[i] = -1;
    run(c, s, r, param, in_place, comm);
    long wrong = 0;
    for (size_t i = 0; i < (c == REDUCE_SCATTER ? param : recvc); i++) {
        float want = want_at(c, p, me, param, i);
        if (r[i] != want) wrong++;
    }
    long total = 0;
    MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, comm);
    return total;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int p, me;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    coll c = ALL_REDUCE;
    size_t minb = 8, maxb = 64 << 20, factor = 2;
    int iters = 20, warmup = 5;
    const char *json = NULL, *label = "mpi";
    for (int i = 1; i < argc; i++) {
        if (i == 1 && argv[1][0] != '-') {
            for (int k = 0; k < 5; k++) if (!strcmp(argv[1], names[k])) c = (enum coll)k;
        } else if (!strcmp(argv[i], "-b") && i + 1 < argc) minb = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "-e") && i + 1 < argc) maxb = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) factor = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-w") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-J") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "-L") && i + 1 < argc) label = argv[++i];
    }
    size_t pm, sc, rc;
    counts(c, maxb, p, &pm, &sc, &rc);
    size_t elems = (sc > rc ? sc : rc) + 16;
    float *s, *r;
    if (posix_memalign((void **)&s, 64, elems * 4) || posix_memalign((void **)&r, 64, elems * 4)) MPI_Abort(MPI_COMM_WORLD, 2);
    memset(s, 0, elems * 4);
    memset(r, 0, elems * 4);
    FILE *jf = NULL;
    if (me == 0 && json) {
        jf = fopen(json, "w");
        fprintf(jf, "{\"label\":\"%s\",\"library\":\"%s\",\"benchmark\":\"%s_perf\",\"nranks\":%d,\"results\":[", label, label, names[c], p);
    }
    if (me == 0) {
        printf("# %s %s_perf, %d ranks, float sum, out-of-place and in-place, %d iterations\n", label, names[c], p, iters);
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "root",
               "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    }
    int first = 1;
    long errors = 0;
    for (size_t bytes = minb; bytes <= maxb; bytes = factor > 1 ? bytes * factor : bytes + (1 << 20)) {
        size_t param, sendc, recvc;
        counts(c, bytes, p, &param, &sendc, &recvc);
        double t[2], ab[2], bb[2];
        long wr[2];
        for (int ip = 0; ip < 2; ip++) {
            for (int i = 0; i < warmup; i++) run(c, s, r, param, ip, MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++) run(c, s, r, param, ip, MPI_COMM_WORLD);
            double dt = (MPI_Wtime() - t0) / iters, sum;
            MPI_Allreduce(&dt, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            t[ip] = sum / p;
            bw(c, param, t[ip], p, &ab[ip], &bb[ip]);
            wr[ip] = check(c, s, r, param, sendc, recvc, ip, MPI_COMM_WORLD);
            errors += wr[ip] != 0;
        }
        if (me == 0) {
            size_t sz = (sendc > recvc ? sendc : recvc) * 4;
            char a[3][32], b[3][32];
            fstr(t[0] * 1e6, 7, a[0]); fstr(ab[0], 6, a[1]); fstr(bb[0], 6, a[2]);
            fstr(t[1] * 1e6, 7, b[0]); fstr(ab[1], 6, b[1]); fstr(bb[1], 6, b[2]);
            printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6s  %6s  %6ld  %7s  %6s  %6s  %6ld\n", sz, param, "float",
                   c == ALL_REDUCE || c == REDUCE_SCATTER ? "sum" : "none", c == BROADCAST ? 0 : -1,
                   a[0], a[1], a[2], wr[0], b[0], b[1], b[2], wr[1]);
            fflush(stdout);
            if (jf) {
                fprintf(jf, "%s{\"size\":%zu,\"count\":%zu,\"type\":\"float\",\"redop\":\"sum\",\"root\":0,"
                            "\"out_of_place\":{\"time\":%g,\"alg_bw\":%g,\"bus_bw\":%g,\"nwrong\":%ld},"
                            "\"in_place\":{\"time\":%g,\"alg_bw\":%g,\"bus_bw\":%g,\"nwrong\":%ld}}",
                        first ? "" : ",", sz, param, t[0] * 1e6, ab[0], bb[0], wr[0], t[1] * 1e6, ab[1], bb[1], wr[1]);
                first = 0;
            }
        }
    }
    if (me == 0) {
        finish_report(jf, errors);
    }
    MPI_Finalize();
    return errors ? 1 : 0;
}
