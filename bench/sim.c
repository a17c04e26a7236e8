/* sim.c - benchmark of the simulator: replay rate on a synthetic week and the GenAI trace */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "sim.h"
#include "trace.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* This process's CPU time: on a shared machine the wall clock also counts the others. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rng = 7;
static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A synthetic week: services x one-minute steps. Each service has a daily cycle (a triangle
 * wave, online peaking by day, batch by night, experiments at random phases) plus noise. */
static int synthetic(struct trace *tr, size_t n_svc, size_t steps)
{
    memset(tr, 0, sizeof(*tr));
    tr->svcs = calloc(n_svc, sizeof(*tr->svcs));
    if (tr->svcs == NULL)
        return -1;
    tr->n = tr->cap = n_svc;
    for (size_t i = 0; i < n_svc; i++) {
        struct trace_svc *s = &tr->svcs[i];
        char id[32];
        snprintf(id, sizeof(id), "svc-%zu", i);
        int r = (int)(rnd() % 100);
        const char *cls = r < 20 ? "online" : r < 60 ? "batch" : "experiment";
        osub_spec_init(&s->spec, id, cls);
        int64_t peak = 4096 + (int64_t)(rnd() % 8192);
        s->spec.vram_mib = peak * 13 / 10;
        s->spec.gpus = 1;
        if (r >= 20) {
            s->spec.min_vram_mib = peak / 2;
            s->spec.resumable = true;
        }
        s->spec.restart_cost_ms = 30000 + (int64_t)(rnd() % 30000);
        int64_t phase = r < 20 ? 0 : r < 60 ? 720 : (int64_t)(rnd() % 1440);
        s->samples = malloc(steps * sizeof(*s->samples));
        if (s->samples == NULL)
            return -1;
        s->n = s->cap = steps;
        for (size_t k = 0; k < steps; k++) {
            int64_t m = ((int64_t)k + phase) % 1440; /* minute of the day */
            int64_t tri = m < 720 ? m : 1440 - m;    /* 0..720 */
            int64_t v = peak / 2 + peak * tri / 1440 + (int64_t)(rnd() % (uint64_t)(peak / 8));
            if (v > peak)
                v = peak;
            s->samples[k] = (struct sample){(int64_t)k * 60, (int32_t)v, -1};
            if (v > s->peak_mib)
                s->peak_mib = v;
        }
    }
    tr->t0 = 0;
    tr->t1 = (int64_t)(steps - 1) * 60;
    tr->step_s = 60;
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t n_svc = 1000, steps = 10080;
    int runs = 3, gpus = 125;
    const char *genai = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--services") == 0 && i + 1 < argc)
            n_svc = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--gpus") == 0 && i + 1 < argc)
            gpus = atoi(argv[++i]);
        else if (strcmp(argv[i], "--genai") == 0 && i + 1 < argc)
            genai = argv[++i];
        else {
            fprintf(stderr, "usage: bench_sim [--services N] [--steps N] [--gpus N] [--runs R] "
                            "[--genai DIR]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 50 || gpus < 1 || gpus > 4096 || n_svc == 0 || steps == 0)
        return 2;
    struct trace tr;
    if (synthetic(&tr, n_svc, steps) != 0) {
        fprintf(stderr, "bench_sim: out of memory\n");
        return 1;
    }
    int64_t *pool = malloc((size_t)gpus * sizeof(*pool));
    for (int i = 0; i < gpus; i++)
        pool[i] = 81920;
    struct sim_budget b = {.evict_budget_per_week = 5, .unmet_budget_milli = 10, .max_wait_s = 300};
    double rates[50], cpu_rates[50];
    struct sim_result r;
    char err[256];
    for (int k = 0; k < runs; k++) {
        struct sim_opts o = {
            .policy = POL_OVERSUB, .ratio_milli = 1300, .pool = pool, .n_pool = (size_t)gpus};
        double t0 = now_s(), c0 = cpu_s();
        if (sim_run(&tr, &o, &b, &r, err, sizeof(err)) != 0) {
            fprintf(stderr, "bench_sim: %s\n", err);
            return 1;
        }
        double dt = now_s() - t0, dc = cpu_s() - c0;
        rates[k] = (double)r.samples / dt;
        cpu_rates[k] = (double)r.samples / dc;
        if (k == runs - 1)
            printf("synthetic week: %zu services x %zu one-minute steps = %lld samples on %d "
                   "GPUs at 1.3x: %.2f s; mean used %.1f%%, %llu degrades, %llu evictions, "
                   "%llu OOM\n",
                   n_svc, steps, (long long)r.samples, gpus, dt, 100 * r.mean_used_util,
                   (unsigned long long)(r.degrades[1] + r.degrades[2]),
                   (unsigned long long)(r.evictions[1] + r.evictions[2]),
                   (unsigned long long)r.oom_events);
        sim_result_free(&r);
    }
    qsort(rates, (size_t)runs, sizeof(rates[0]), cmp_d);
    qsort(cpu_rates, (size_t)runs, sizeof(cpu_rates[0]), cmp_d);
    printf("samples/s median: %.0f\n", rates[runs / 2]);
    printf("samples/s median on CPU time: %.0f\n", cpu_rates[runs / 2]);
    trace_free(&tr);
    if (genai != NULL) {
        struct genai_opts g;
        genai_opts_default(&g);
        double t0 = now_s();
        struct trace gt;
        if (trace_import_genai(genai, &g, &gt, err, sizeof(err)) != 0) {
            fprintf(stderr, "bench_sim: %s\n", err);
            return 1;
        }
        double t_imp = now_s() - t0;
        int64_t gp[64];
        for (int i = 0; i < 42; i++)
            gp[i] = 81920;
        struct sim_opts o = {.policy = POL_OVERSUB, .ratio_milli = 1300, .pool = gp, .n_pool = 42};
        double t1 = now_s();
        sim_run(&gt, &o, &b, &r, err, sizeof(err));
        double t_run = now_s() - t1;
        printf("genai trace: import %.3f s, replay %.3f s (%lld samples, oversub 1.3x on 42 "
               "GPUs); total %.3f s\n",
               t_imp, t_run, (long long)r.samples, t_imp + t_run);
        sim_result_free(&r);
        trace_free(&gt);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak memory (max RSS): %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
    free(pool);
    return 0;
}
