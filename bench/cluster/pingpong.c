/* The 8-byte TCP round trip between host 0 and host 1 of the emulated cluster, the yardstick
 * of the small-message targets. Run as ranks of `oxccl-cluster` (RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT): rank 0 (host 0) listens on MASTER_ADDR:MASTER_PORT+1, the first
 * rank of host 1 connects and sends 8 bytes that rank 0 echoes, WARMUP then ITERS times, with
 * TCP_NODELAY; every other rank exits at once. The client prints the median and mean round
 * trip and writes {"rtt_us_median":..,"rtt_us_mean":..} to the -J file.
 *
 *   pingpong [-n ITERS] [-J out.json]
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int env_int(const char *k, int def) {
    const char *v = getenv(k);
    return v ? atoi(v) : def;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void full(int fd, char *b, int n, int send_) {
    for (int d = 0; d < n;) {
        ssize_t k = send_ ? write(fd, b + d, n - d) : read(fd, b + d, n - d);
        if (k <= 0) die(send_ ? "write" : "read");
        d += (int)k;
    }
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int iters = 10000, warmup = 1000;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-J") && i + 1 < argc) json = argv[++i];
        else {
            fprintf(stderr, "pingpong: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (iters < 1) {
        fprintf(stderr, "pingpong: -n must be at least 1\n");
        return 2;
    }
    int rank = env_int("RANK", -1), k = env_int("LOCAL_WORLD_SIZE", 1);
    const char *addr = getenv("MASTER_ADDR");
    int port = env_int("MASTER_PORT", 0) + 1;
    if (rank < 0 || !addr || port == 1) {
        fprintf(stderr, "pingpong: RANK, MASTER_ADDR and MASTER_PORT must be set\n");
        return 2;
    }
    if (rank != 0 && rank != k) return 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        fprintf(stderr, "pingpong: MASTER_ADDR %s is not an IPv4 address\n", addr);
        return 2;
    }
    int one = 1, fd;
    if (rank == 0) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, 1)) die("bind/listen");
        fd = accept(l, NULL, NULL);
        if (fd < 0) die("accept");
        close(l);
    } else {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        int tries = 0;
        while (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
            if (++tries > 1000) die("connect");
            close(fd);
            fd = socket(AF_INET, SOCK_STREAM, 0);
            usleep(10000);
        }
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char b[8] = {0};
    double *rtt = malloc(sizeof(double) * iters);
    for (int i = 0; i < warmup + iters; i++) {
        if (rank == 0) {
            full(fd, b, 8, 0);
            full(fd, b, 8, 1);
        } else {
            double t0 = now_us();
            full(fd, b, 8, 1);
            full(fd, b, 8, 0);
            if (i >= warmup) rtt[i - warmup] = now_us() - t0;
        }
    }
    if (rank != 0) {
        double sum = 0;
        for (int i = 0; i < iters; i++) sum += rtt[i];
        qsort(rtt, iters, sizeof(double), cmp);
        double med = rtt[iters / 2], mean = sum / iters;
        printf("pingpong: 8-byte TCP round trip host 0 <-> host 1: median %.1f us, mean %.1f us (%d round trips)\n", med, mean, iters);
        if (json) {
            FILE *f = fopen(json, "w");
            if (!f) die(json);
            fprintf(f, "{\"rtt_us_median\":%.2f,\"rtt_us_mean\":%.2f,\"iters\":%d}\n", med, mean, iters);
            fclose(f);
        }
    }
    close(fd);
    free(rtt);
    return 0;
}
