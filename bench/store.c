/* store.c - the bare SQLite loop: the commits oversubd makes for a submit (one command and
 * its two events, WAL, synchronous=FULL, one durable transaction each), with nothing else
 * around them: no HTTP, no engine, no grouping. The physical limit of this disk for one
 * commit per mutation, run side by side with the daemon by bench/run-daemon.sh.
 * Usage: bench_store DB N */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "store.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: bench_store DB N\n");
        return 2;
    }
    long n = strtol(argv[2], NULL, 10);
    if (n <= 0) {
        fprintf(stderr, "bench_store: N must be a positive count\n");
        return 2;
    }
    osubd__store_t *s;
    char err[600];
    if (osubd__store_open(argv[1], &s, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_store: %s\n", err);
        return 1;
    }
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        char cmd[256], e1[256], e2[256];
        snprintf(cmd, sizeof(cmd),
                 "{\"dry_run\":false,\"op\":\"submit\",\"spec\":{\"class\":\"batch\",\"id\":"
                 "\"w1-%ld\",\"vram_mib\":1024}}",
                 i);
        snprintf(e1, sizeof(e1),
                 "{\"kind\":\"admit\",\"service\":\"w1-%ld\",\"gpu\":0,\"vram_mib\":1024,"
                 "\"message\":\"admitted w1-%ld (batch, 1024 MiB) on GPU 0 without victims\"}",
                 i, i);
        snprintf(e2, sizeof(e2),
                 "{\"kind\":\"start\",\"service\":\"w1-%ld\",\"gpu\":0,\"vram_mib\":1024,"
                 "\"message\":\"started w1-%ld (batch) on GPU 0 with 1024 MiB\"}",
                 i, i);
        const char *ev[2] = {e1, e2};
        int64_t seq;
        if (osubd__store_append_with_events(s, i, i, cmd, ev, 2, &seq, NULL) != 0) {
            fprintf(stderr, "bench_store: %s\n", osubd__store_error(s));
            return 1;
        }
    }
    double dt = now_s() - t0;
    printf("bare_sqlite_commits %ld seconds %.3f per_second %.0f\n", n, dt, (double)n / dt);
    osubd__store_close(s);
    return 0;
}
