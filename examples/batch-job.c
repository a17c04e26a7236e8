/* batch-job.c - an example batch service for oversub: works through N units, checkpointing
 * after each, and when resumed continues from its checkpoint instead of from scratch.
 *
 *   batch-job --units N [--unit-ms MS] [--result FILE]
 *
 * Unit i (1..N) adds i to a running total, so a run that did every unit exactly once ends with
 * N(N+1)/2, however often it was stopped. The state (next unit, total) is written atomically to
 * $OVERSUB_CHECKPOINT_DIR/state after each unit; on SIGTERM the job finishes the unit it is in,
 * reports that checkpoint to oversubd (POST .../ack {"checkpoint"}) and exits 0 within its grace
 * period. Started with $OVERSUB_RESUME_FROM, it reads the state from there. When every unit is
 * done it writes "total=T units=N" to FILE and exits 0 (oversubd then releases it). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "osub_example.h"

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: batch-job --units N [--unit-ms MS] [--result FILE]\n"
               "  an oversub example: N units of MS ms each (default 200), checkpointed; see\n"
               "  examples/README.md\n");
}

/* Sleeps ms whole, SIGTERM or not: a unit is finished once begun. */
static void work(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L}, rem;
    while (nanosleep(&ts, &rem) != 0 && errno == EINTR)
        ts = rem;
}

int main(int argc, char **argv)
{
    long units = -1, unit_ms = 200;
    const char *result = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        char *end;
        if (strcmp(argv[i], "--units") == 0) {
            units = strtol(argv[++i], &end, 10);
            if (*end || units < 1 || units > 100000000) {
                fprintf(stderr, "batch-job: --units: 1 to 100000000\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--unit-ms") == 0) {
            unit_ms = strtol(argv[++i], &end, 10);
            if (*end || unit_ms < 0 || unit_ms > 3600000) {
                fprintf(stderr, "batch-job: --unit-ms: 0 to 3600000\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--result") == 0) {
            result = argv[++i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (units < 0) {
        usage(stderr);
        return 2;
    }
    struct osx_env env;
    osx_env_read(&env);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    long next = 1;
    long long total = 0;
    if (env.resume_from != NULL && env.resume_from[0]) {
        FILE *f = fopen(env.resume_from, "r");
        if (f == NULL || fscanf(f, "next=%ld total=%lld", &next, &total) != 2) {
            osx_log("batch-job: cannot read the checkpoint %s", env.resume_from);
            return 1;
        }
        fclose(f);
        osx_log("batch-job: resuming from %s at unit %ld (total so far %lld)", env.resume_from,
                next, total);
    } else {
        osx_log("batch-job: starting at unit 1 of %ld", units);
    }
    char ck[4096] = "";
    if (env.checkpoint_dir != NULL)
        snprintf(ck, sizeof(ck), "%s/state", env.checkpoint_dir);
    if (env.control_url != NULL) {
        char path[256];
        snprintf(path, sizeof(path), "/v1/services/%s/ready", env.service);
        int st = osx_http(env.control_url, "POST", path, env.token, "{}", 5, NULL, 0);
        osx_log("batch-job: reported ready (HTTP %d)", st);
    }
    long done_here = 0;
    while (next <= units && !stop) {
        work(unit_ms);
        total += next;
        next++;
        done_here++;
        if (ck[0]) {
            char text[128];
            snprintf(text, sizeof(text), "next=%ld total=%lld\n", next, total);
            if (osx_write_atomic(ck, text) != 0) {
                osx_log("batch-job: cannot write the checkpoint %s: %s", ck, strerror(errno));
                return 1;
            }
        }
    }
    if (next <= units) {
        /* stopped: tell oversubd where to resume from, then go */
        osx_log("batch-job: stopped after %ld unit(s) in this run; next unit %ld", done_here, next);
        if (env.control_url != NULL && ck[0]) {
            char path[256], body[4200];
            snprintf(path, sizeof(path), "/v1/services/%s/ack", env.service);
            snprintf(body, sizeof(body), "{\"checkpoint\": \"%s\"}", ck);
            int st = osx_http(env.control_url, "POST", path, env.token, body, 5, NULL, 0);
            osx_log("batch-job: reported checkpoint %s (HTTP %d)", ck, st);
        }
        return 0;
    }
    osx_log("batch-job: done: %ld unit(s), %ld in this run, total %lld", units, done_here, total);
    if (result != NULL) {
        char text[128];
        snprintf(text, sizeof(text), "total=%lld units=%ld\n", total, units);
        if (osx_write_atomic(result, text) != 0) {
            osx_log("batch-job: cannot write %s: %s", result, strerror(errno));
            return 1;
        }
    }
    return 0;
}
