/* This machine's memory copy bandwidth: every core copies its own 256 MiB buffer; prints the
 * read + write bytes per second of all threads together (the B of busbw_max = B(P-1)/P^2),
 * best of several passes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BYTES (256UL << 20)
static int nthreads;
static pthread_barrier_t bar;
static double secs[64];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
    long id = (long)arg;
    char *a = malloc(BYTES), *b = malloc(BYTES);
    memset(a, 1, BYTES);
    memset(b, 2, BYTES);
    double best = 1e9;
    for (int pass = 0; pass < 5; pass++) {
        pthread_barrier_wait(&bar);
        double t0 = now();
        memcpy(b, a, BYTES);
        pthread_barrier_wait(&bar);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    secs[id] = best;
    free(a);
    free(b);
    return NULL;
}

int main(void) {
    nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthreads > 64) nthreads = 64;
    pthread_barrier_init(&bar, NULL, nthreads);
    pthread_t t[64];
    for (long i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    double worst = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(t[i], NULL);
        if (secs[i] > worst) worst = secs[i];
    }
    double copy = nthreads * (double)BYTES / worst / 1e9;
    printf("{\"threads\":%d,\"copy_GBps\":%.2f,\"read_write_GBps\":%.2f}\n", nthreads, copy, 2 * copy);
    return 0;
}
