/* engine.c - benchmark of the engine: commands/s, latency, memory per service, side by side
 * with the brief's pool-level algorithm on the same fixed command stream */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "brief_policy.h"
#include "oversub/engine.h"

/* internal to liboversub: compare every plan with the unpruned reference planner */
uint64_t osub__verify_plans(osub_engine_t *e, bool on, const char **last);

enum { C_SUBMIT, C_RELEASE, C_USAGE };

struct cmd {
    uint8_t kind;
    uint8_t cls; /* 0 online, 1 batch, 2 experiment */
    uint32_t id;
    int64_t vram, min_vram, used_pct;
};

static uint64_t rng = 42;
static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static int64_t rr(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static const char *const cls_name[] = {"online", "batch", "experiment"};

#define N_GPUS 1000
#define N_PREFILL 10000

/* The prefill: 10,000 services, sized to fill about 90% of the logical capacity. */
static void gen_service(struct cmd *c, uint32_t id, int prefill)
{
    c->kind = C_SUBMIT;
    c->id = id;
    int64_t r = rr(0, 99);
    /* prefill 20:40:40; arrivals 40:30:30, the online ones big enough to need victims */
    if (prefill)
        c->cls = (uint8_t)(r < 20 ? 0 : r < 60 ? 1 : 2);
    else
        c->cls = (uint8_t)(r < 40 ? 0 : r < 70 ? 1 : 2);
    if (!prefill && c->cls == 0)
        c->vram = rr(8192, 20480); /* online arrivals: big enough to need victims */
    else
        c->vram = rr(3584, 12288);
    c->min_vram = c->cls == 0 ? 0 : c->vram / 2;
    c->used_pct = rr(50, 85);
}

/* The fixed stream: 40% submits, 20% releases, 40% usage reports, over ids the generator
 * believes live (so that both policies see exactly the same commands). */
static struct cmd *gen_stream(size_t n, uint32_t *next_id)
{
    struct cmd *s = calloc(n, sizeof(*s));
    uint32_t *live = malloc((n + N_PREFILL) * sizeof(*live));
    size_t n_live = 0;
    for (uint32_t i = 0; i < N_PREFILL; i++)
        live[n_live++] = i;
    for (size_t i = 0; i < n; i++) {
        int64_t r = rr(0, 99);
        if (r < 40) {
            gen_service(&s[i], (*next_id)++, 0);
            live[n_live++] = s[i].id;
        } else if (r < 60 && n_live > 0) {
            size_t k = (size_t)rr(0, (int64_t)n_live - 1);
            s[i].kind = C_RELEASE;
            s[i].id = live[k];
            live[k] = live[--n_live];
        } else {
            s[i].kind = C_USAGE;
            s[i].id = live[rr(0, (int64_t)n_live - 1)];
            s[i].used_pct = rr(40, 90);
        }
    }
    free(live);
    return s;
}

static void id_str(uint32_t id, char *buf)
{
    snprintf(buf, 16, "svc-%u", id);
}

struct stats {
    double secs;
    size_t n;
    uint64_t victims_submits, submits, admitted, rejected, errors, follow_ups;
};

static osub_engine_t *engine_prefilled(struct cmd *pre)
{
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    int64_t vram[N_GPUS];
    for (int i = 0; i < N_GPUS; i++)
        vram[i] = i < N_GPUS / 2 ? 81920 : 40960;
    osub_engine_t *e;
    if (osub_engine_new(&cfg, vram, NULL, N_GPUS, NULL, 0, &e) != 0)
        return NULL;
    char id[16];
    for (int i = 0; i < N_PREFILL; i++) {
        osub_spec_t s;
        id_str(pre[i].id, id);
        osub_spec_init(&s, id, cls_name[pre[i].cls]);
        s.vram_mib = pre[i].vram;
        s.min_vram_mib = pre[i].min_vram;
        s.queue = OSUB_TRI_NO;
        s.resumable = pre[i].cls > 0; /* evicted batch and experiment work comes back */
        osub_engine_submit(e, &s, 0, 0, NULL);
    }
    /* all loaded, usage reported */
    for (int i = 0; i < N_PREFILL; i++) {
        id_str(pre[i].id, id);
        osub_service_info_t si;
        if (osub_engine_service_info(e, id, &si) != 0)
            continue;
        osub_engine_ready(e, id, 1000);
        osub_engine_usage(e, id, si.grant_mib * pre[i].used_pct / 100, -1, 1000);
    }
    return e;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The process's CPU time: on a shared machine, the rate on it moves less than on the wall. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Follow-ups: what victims do when told (ack a degrade, exit when evicted). */
struct follow {
    char id[OSUB_ID_MAX + 1];
    bool exit;
};

static int run_one(osub_engine_t *e, const struct cmd *c, int64_t t, struct stats *st)
{
    char id[16];
    id_str(c->id, id);
    int rc = 0;
    if (c->kind == C_SUBMIT) {
        osub_spec_t sp;
        osub_spec_init(&sp, id, cls_name[c->cls]);
        sp.vram_mib = c->vram;
        sp.min_vram_mib = c->min_vram;
        sp.queue = OSUB_TRI_NO;
        sp.resumable = c->cls > 0;
        osub_submit_result_t r;
        rc = osub_engine_submit(e, &sp, t, 0, &r);
        st->submits++;
        if (rc == 0) {
            st->admitted++;
            if (r.n_victims > 0)
                st->victims_submits++;
        } else {
            st->rejected++;
        }
    } else if (c->kind == C_RELEASE) {
        rc = osub_engine_release(e, id, t);
    } else {
        osub_service_info_t si;
        rc = osub_engine_service_info(e, id, &si);
        if (rc == 0 && si.n_slots > 0 && si.state != OSUB_STATE_PENDING)
            rc = osub_engine_usage(e, id, si.grant_mib * c->used_pct / 100, -1, t);
    }
    if (rc != 0 && c->kind != C_SUBMIT)
        st->errors++;
    return rc;
}

/* The measured loop (named so callgrind can collect this function alone). Each stream
 * command is followed by what its victims do: a degraded service acknowledges, an evicted
 * one exits; those follow-ups are commands too, timed and counted. */
__attribute__((noinline)) size_t bench_run_engine(osub_engine_t *e, const struct cmd *s, size_t n,
                                                  int64_t t0, double *lat, struct stats *st);
__attribute__((noinline)) size_t bench_run_engine(osub_engine_t *e, const struct cmd *s, size_t n,
                                                  int64_t t0, double *lat, struct stats *st)
{
    static struct follow fq[4096];
    size_t nf = 0, done = 0;
    double tp = lat ? now_s() : 0;
    for (size_t i = 0; i < n; i++) {
        int64_t t = t0 + (int64_t)i * 10;
        run_one(e, &s[i], t, st);
        size_t ne;
        const osub_event_t *ev = osub_engine_events(e, &ne);
        for (size_t j = 0; j < ne && nf < 4096; j++) {
            if (ev[j].kind == OSUB_EV_DEGRADE || ev[j].kind == OSUB_EV_EVICT) {
                memcpy(fq[nf].id, ev[j].service, sizeof(fq[nf].id));
                fq[nf++].exit = ev[j].kind == OSUB_EV_EVICT;
            }
        }
        if (lat) {
            double tn = now_s();
            lat[done] = tn - tp;
            tp = tn;
        }
        done++;
        for (size_t j = 0; j < nf; j++) {
            int rc = fq[j].exit ? osub_engine_exited(e, fq[j].id, NULL, t)
                                : osub_engine_ack(e, fq[j].id, NULL, t);
            st->follow_ups++;
            if (rc != 0)
                st->errors++;
            if (lat) {
                double tn = now_s();
                lat[done] = tn - tp;
                tp = tn;
            }
            done++;
        }
        nf = 0;
    }
    return done;
}

/* Writes one command's return code and every event it produced, each field, one a line. */
static void write_events(osub_engine_t *e, FILE *f, const char *what, int rc)
{
    size_t ne;
    const osub_event_t *ev = osub_engine_events(e, &ne);
    fprintf(f, "%s rc %d\n", what, rc);
    for (size_t j = 0; j < ne; j++)
        fprintf(f, "  %lld %s %d %s|%s|%d %d %d %lld %d %lld %s\n", (long long)ev[j].time_ms,
                osub_event_name(ev[j].kind), (int)ev[j].reason, ev[j].service, ev[j].cause,
                ev[j].cause_level, ev[j].level, ev[j].gpu, (long long)ev[j].vram_mib,
                ev[j].batch_size, (long long)ev[j].deadline_ms, ev[j].msg);
}

/* The stream of bench_run_engine(), untimed, with every command's events and the final dump
 * written to f: two engines decide the same exactly when these files are equal. */
static void dump_events(osub_engine_t *e, const struct cmd *s, size_t n, int64_t t0, FILE *f)
{
    struct stats st = {0};
    static struct follow fq[4096];
    for (size_t i = 0; i < n; i++) {
        int64_t t = t0 + (int64_t)i * 10;
        int rc = run_one(e, &s[i], t, &st);
        write_events(e, f, "cmd", rc);
        size_t ne, nf = 0;
        const osub_event_t *ev = osub_engine_events(e, &ne);
        for (size_t j = 0; j < ne && nf < 4096; j++) {
            if (ev[j].kind == OSUB_EV_DEGRADE || ev[j].kind == OSUB_EV_EVICT) {
                memcpy(fq[nf].id, ev[j].service, sizeof(fq[nf].id));
                fq[nf++].exit = ev[j].kind == OSUB_EV_EVICT;
            }
        }
        for (size_t j = 0; j < nf; j++) {
            rc = fq[j].exit ? osub_engine_exited(e, fq[j].id, NULL, t)
                            : osub_engine_ack(e, fq[j].id, NULL, t);
            write_events(e, f, fq[j].exit ? "exited" : "ack", rc);
        }
    }
    char *d = osub_engine_dump(e);
    fputs(d, f);
    free(d);
}

static brief_pool_t *brief_prefilled(const struct cmd *pre)
{
    double total = (N_GPUS / 2) * 80.0 + (N_GPUS / 2) * 40.0;
    brief_pool_t *p = brief_new(total, 1.3);
    char id[16];
    char v[64][64];
    for (int i = 0; i < N_PREFILL; i++) {
        id_str(pre[i].id, id);
        double gb = (double)pre[i].vram / 1024.0;
        if (brief_can_allocate(p, pre[i].cls, gb, pre[i].cls > 0))
            brief_allocate(p, id, pre[i].cls, gb, pre[i].cls > 0, i, v, 64);
    }
    for (int i = 0; i < N_PREFILL; i++) {
        id_str(pre[i].id, id);
        brief_update_usage(p, id, (double)pre[i].vram / 1024.0 * (double)pre[i].used_pct / 100.0);
    }
    return p;
}

__attribute__((noinline)) void bench_run_brief(brief_pool_t *p, const struct cmd *s, size_t n,
                                               double *lat, struct stats *st);
__attribute__((noinline)) void bench_run_brief(brief_pool_t *p, const struct cmd *s, size_t n,
                                               double *lat, struct stats *st)
{
    char id[16];
    char v[64][64];
    double tp = lat ? now_s() : 0;
    for (size_t i = 0; i < n; i++) {
        const struct cmd *c = &s[i];
        id_str(c->id, id);
        double gb = (double)c->vram / 1024.0;
        if (c->kind == C_SUBMIT) {
            st->submits++;
            if (brief_can_allocate(p, c->cls, gb, c->cls > 0)) {
                int nv = brief_allocate(p, id, c->cls, gb, c->cls > 0, (int64_t)i, v, 64);
                st->admitted++;
                if (nv > 0)
                    st->victims_submits++;
            } else {
                st->rejected++;
            }
        } else if (c->kind == C_RELEASE) {
            if (brief_release(p, id) != 0)
                st->errors++;
        } else {
            /* the brief has no per-service query: usage is a fraction of the request */
            if (brief_update_usage(p, id, gb * (double)c->used_pct / 100.0) != 0)
                st->errors++;
        }
        if (lat) {
            double tn = now_s();
            lat[i] = tn - tp;
            tp = tn;
        }
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static size_t heap_used(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

int main(int argc, char **argv)
{
    size_t n = 45000;
    int runs = 5;
    bool verify = false, latency = true;
    const char *mode = "all", *events = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--commands") == 0 && i + 1 < argc)
            n = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc)
            mode = argv[++i];
        else if (strcmp(argv[i], "--verify") == 0)
            verify = true;
        else if (strcmp(argv[i], "--no-latency") == 0)
            latency = false;
        else if (strcmp(argv[i], "--events") == 0 && i + 1 < argc)
            events = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_engine [--commands N] [--runs R] [--mode all|engine|brief] "
                    "[--no-latency] [--verify] [--events FILE]\n"
                    "Feeds a fixed stream (40%% submits, 20%% releases, 40%% usage reports) to a "
                    "pool of %d GPUs holding %d services.\n",
                    N_GPUS, N_PREFILL);
            fprintf(stderr, "--events FILE writes every command's events and the final dump "
                            "(the stream once, untimed) and exits.\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    if (runs < 1 || runs > 99 || n == 0)
        return 2;
    struct cmd pre[N_PREFILL];
    for (uint32_t i = 0; i < N_PREFILL; i++)
        gen_service(&pre[i], i, 1);
    uint32_t next_id = N_PREFILL;
    struct cmd *stream = gen_stream(n, &next_id);
    if (verify) {
        /* the pruned planner against the reference, on this very stream (slow) */
        osub_engine_t *e = engine_prefilled(pre);
        osub__verify_plans(e, true, NULL);
        struct stats st = {0};
        bench_run_engine(e, stream, n, 2000, NULL, &st);
        const char *last;
        uint64_t bad = osub__verify_plans(e, true, &last);
        printf("verify: %zu commands, %llu plans differ from the reference%s%s\n", n,
               (unsigned long long)bad, bad ? ": " : "", bad ? last : "");
        osub_engine_free(e);
        free(stream);
        return bad ? 1 : 0;
    }
    if (events != NULL) {
        FILE *f = fopen(events, "w");
        osub_engine_t *e = f ? engine_prefilled(pre) : NULL;
        if (e == NULL) {
            perror(events);
            return 1;
        }
        dump_events(e, stream, n, 2000, f);
        osub_engine_free(e);
        free(stream);
        return fclose(f) == 0 ? 0 : 1;
    }
    double *lat = malloc(4 * n * sizeof(*lat));
    double rates[100], brates[100], crates[100], bcrates[100];
    bool do_engine = strcmp(mode, "brief") != 0, do_brief = strcmp(mode, "engine") != 0;

    if (do_engine) {
        size_t h0 = heap_used();
        osub_engine_t *e = engine_prefilled(pre);
        size_t h1 = heap_used();
        printf("pool: %d GPUs (500 x 81920, 500 x 40960 MiB), ratio 1.3, %zu services live\n",
               N_GPUS, osub_engine_service_count(e));
        printf("engine memory per service: %.0f bytes (heap %zu bytes for %zu services and "
               "the pool)\n",
               (double)(h1 - h0) / (double)osub_engine_service_count(e), h1 - h0,
               osub_engine_service_count(e));
        osub_engine_free(e);
        struct stats st = {0};
        for (int r = 0; r < runs; r++) {
            e = engine_prefilled(pre);
            memset(&st, 0, sizeof(st));
            double t0 = now_s(), c0 = cpu_s();
            size_t done = bench_run_engine(e, stream, n, 2000, NULL, &st);
            rates[r] = (double)done / (now_s() - t0);
            crates[r] = (double)done / (cpu_s() - c0);
            if (r == runs - 1) {
                osub_pool_info_t pi;
                osub_engine_pool_info(e, &pi);
                printf("stream: %zu commands + %llu follow-ups (acks and exits of victims); "
                       "%llu submits (%llu admitted, %llu of them with "
                       "victims = %.1f%% of submits, %llu refused), %llu degrades, %llu "
                       "evictions; %zu services live at the end\n",
                       n, (unsigned long long)st.follow_ups, (unsigned long long)st.submits,
                       (unsigned long long)st.admitted, (unsigned long long)st.victims_submits,
                       100.0 * (double)st.victims_submits / (double)st.submits,
                       (unsigned long long)st.rejected, (unsigned long long)pi.degrades,
                       (unsigned long long)pi.evictions, osub_engine_service_count(e));
            }
            osub_engine_free(e);
        }
        printf("engine commands/s median: %.0f\n", median(rates, runs));
        printf("engine commands/s median on CPU time: %.0f\n", median(crates, runs));
        if (latency) {
            e = engine_prefilled(pre);
            memset(&st, 0, sizeof(st));
            size_t m = bench_run_engine(e, stream, n, 2000, lat, &st);
            osub_engine_free(e);
            qsort(lat, m, sizeof(*lat), cmp_d);
            printf("engine latency per command: p50 %.2f us, p99 %.2f us, max %.2f us\n",
                   lat[m / 2] * 1e6, lat[m * 99 / 100] * 1e6, lat[m - 1] * 1e6);
        }
    }
    if (do_brief) {
        struct stats st = {0};
        for (int r = 0; r < runs; r++) {
            brief_pool_t *p = brief_prefilled(pre);
            memset(&st, 0, sizeof(st));
            double t0 = now_s(), c0 = cpu_s();
            bench_run_brief(p, stream, n, NULL, &st);
            brates[r] = (double)n / (now_s() - t0);
            bcrates[r] = (double)n / (cpu_s() - c0);
            brief_free(p);
        }
        brief_pool_t *p = brief_prefilled(pre);
        memset(&st, 0, sizeof(st));
        bench_run_brief(p, stream, n, latency ? lat : NULL, &st);
        printf("brief: %llu submits, %llu admitted (%llu with victims), %llu refused; pool "
               "actual %.0f GB of %.0f GB physical at the end\n",
               (unsigned long long)st.submits, (unsigned long long)st.admitted,
               (unsigned long long)st.victims_submits, (unsigned long long)st.rejected,
               brief_actual(p), brief_total(p));
        brief_free(p);
        printf("brief commands/s median: %.0f\n", median(brates, runs));
        printf("brief commands/s median on CPU time: %.0f\n", median(bcrates, runs));
        if (latency) {
            qsort(lat, n, sizeof(*lat), cmp_d);
            printf("brief latency per command: p50 %.2f us, p99 %.2f us, max %.2f us\n",
                   lat[n / 2] * 1e6, lat[n * 99 / 100] * 1e6, lat[n - 1] * 1e6);
        }
    }
    if (do_engine && do_brief)
        printf("ratio engine/brief commands/s: %.2f\n", median(rates, runs) / median(brates, runs));
    free(lat);
    free(stream);
    return 0;
}
