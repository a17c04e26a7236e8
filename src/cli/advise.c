/* advise.c - three ways to pick an oversell ratio: the brief's rule on a preemption history,
 * the highest ratio of a what-if sweep within the budgets, and a peak-prediction risk bound */
#include "advise.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "oversub/units.h"
#include "report.h"

/* Summed demand over the trace's grid; p99 of each service; mean and sigma of the sum. */
struct demand_stats {
    double mean, sigma, peak, sum_p99;
    double max_requests; /* most MiB requested by services alive at once */
};

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int stats_of(const struct trace *tr, struct demand_stats *st)
{
    memset(st, 0, sizeof(*st));
    size_t steps = (size_t)((tr->t1 - tr->t0) / tr->step_s) + 1;
    double *sum = calloc(steps, sizeof(*sum)), *req = calloc(steps, sizeof(*req));
    if (sum == NULL || req == NULL) {
        free(sum);
        free(req);
        return -1;
    }
    for (size_t i = 0; i < tr->n; i++) {
        const struct trace_svc *s = &tr->svcs[i];
        size_t cur = 0;
        for (size_t k = 0; k < steps; k++) {
            int64_t t = tr->t0 + (int64_t)k * tr->step_s;
            if (t < s->samples[0].t_s || t > s->samples[s->n - 1].t_s)
                continue;
            while (cur + 1 < s->n && s->samples[cur + 1].t_s <= t)
                cur++;
            sum[k] += (double)s->samples[cur].vram_mib;
            req[k] += (double)s->spec.vram_mib;
        }
        int64_t *v = malloc(s->n * sizeof(*v));
        if (v == NULL)
            continue;
        for (size_t j = 0; j < s->n; j++)
            v[j] = s->samples[j].vram_mib;
        qsort(v, s->n, sizeof(*v), cmp_i64);
        size_t idx = (s->n * 99 + 99) / 100;
        st->sum_p99 += (double)v[idx > 0 ? idx - 1 : 0];
        free(v);
    }
    for (size_t k = 0; k < steps; k++) {
        st->mean += sum[k];
        if (sum[k] > st->peak)
            st->peak = sum[k];
        if (req[k] > st->max_requests)
            st->max_requests = req[k];
    }
    st->mean /= (double)steps;
    for (size_t k = 0; k < steps; k++)
        st->sigma += (sum[k] - st->mean) * (sum[k] - st->mean);
    st->sigma = sqrt(st->sigma / (double)steps);
    free(sum);
    free(req);
    return 0;
}

/* The brief's rule counts preemptions: evictions of batch and experiment services (a
 * degrade keeps the service running, so it is not counted; the evidence shows both). */
static double preemptions_per_week(const struct sim_result *r)
{
    return r->evictions_per_week[1] + r->evictions_per_week[2];
}

static double degrades_per_week(const struct sim_result *r)
{
    return r->degrades_per_week[1] + r->degrades_per_week[2];
}

/* Two runs that decided the same: the ratio between them did not bind. */
static bool same_run(const struct sim_result *a, const struct sim_result *b)
{
    return a->feasible == b->feasible && a->mean_used_util == b->mean_used_util &&
           a->mean_held_util == b->mean_held_util && a->oom_events == b->oom_events &&
           a->degrades[1] == b->degrades[1] && a->degrades[2] == b->degrades[2] &&
           a->evictions[1] == b->evictions[1] && a->evictions[2] == b->evictions[2] &&
           a->unmet_fraction == b->unmet_fraction && a->max_wait_s == b->max_wait_s;
}

/* The pool to advise on: gpus as a pool (8x81920), or min[:SIZE], the pool oversub needs at
 * the brief's starting point, 1.3x. Fills pool (4096 entries at most); 0, or -1 (said). */
static int advise_pool(const struct sim_budget *b, const char *gpus, const struct trace *tr,
                       bool quiet, int64_t *pool, size_t *n_pool)
{
    char err[256];
    int64_t size = 81920;
    *n_pool = 0;
    bool min = strncmp(gpus, "min", 3) == 0;
    if (!min) {
        if (osub_parse_pool(gpus, pool, 4096, n_pool) != 0) {
            fprintf(stderr, "oversub: --gpus: '%s' is not a pool (8x81920) or min[:SIZE]\n", gpus);
            return -1;
        }
        return 0;
    }
    if (gpus[3] == ':' && osub_parse_gpu_size(gpus + 4, &size) != 0) {
        fprintf(stderr, "oversub: --gpus: '%s' is not min[:SIZE]\n", gpus);
        return -1;
    }
    /* no pool given: the pool oversub needs at the brief's starting point, 1.3x */
    int32_t lb = sim_lower_bound(tr, size), hi = 0;
    for (size_t i = 0; i < tr->n; i++)
        hi += tr->svcs[i].spec.gpus > 0 ? tr->svcs[i].spec.gpus : 1;
    struct sim_result r0;
    if (!quiet)
        fprintf(stderr, "advise: sizing the pool oversub needs at 1.3x ...\n");
    int32_t g = sim_min_gpus(tr, POL_OVERSUB, 1300, size, lb, hi, b, false, &r0, err, sizeof(err));
    if (g <= 0) {
        fprintf(stderr, "oversub: advise: %s\n",
                g < 0 ? err : "no pool meets the budgets even at 1.3x: give --gpus");
        return -1;
    }
    sim_result_free(&r0);
    for (int32_t i = 0; i < g; i++)
        pool[(*n_pool)++] = size;
    return 0;
}

/* What advise recommends from the sweep res[0..nr), and why. */
struct advice {
    int32_t rule, sweep, risk_ok, rec;
    int32_t binds_until; /* from this ratio up every run of the sweep is the same */
    size_t bind_k;       /* its index in the sweep */
    bool capped;         /* rec lowered to binds_until */
    double *risk;        /* per ratio: the predicted peak over physical (NULL: no memory) */
};

static void advise_decide(const struct sim_result *res, size_t nr, int64_t physical,
                          const struct demand_stats *st, struct advice *ad)
{
    double predicted = fmax(st->mean + 3 * st->sigma, st->sum_p99);
    /* (a) the brief's rule: start at 1.3; while fewer than 5 preemptions a week, step up,
     * towards 1.5-1.8 */
    int32_t rule = 1300;
    const struct sim_result *at = NULL;
    for (size_t k = 0; k < nr; k++)
        if (res[k].ratio_milli == 1300)
            at = &res[k];
    while (at != NULL && preemptions_per_week(at) < 5.0 && rule < 1800) {
        const struct sim_result *next = NULL;
        for (size_t k = 0; k < nr; k++)
            if (res[k].ratio_milli == rule + 100)
                next = &res[k];
        if (next == NULL || preemptions_per_week(next) >= 5.0 || !next->feasible)
            break;
        rule += 100;
        at = next;
    }
    /* (b) the highest ratio of the sweep within every budget */
    int32_t sweep = 0;
    for (size_t k = 0; k < nr; k++)
        if (res[k].feasible && res[k].ratio_milli > sweep)
            sweep = res[k].ratio_milli;
    /* (c) risk: at ratio R the pool admits up to R x physical of requests; the demand of what
     * it admits, predicted at its peak, must stay under the high watermark */
    int32_t risk_ok = 0;
    double *risk = calloc(nr, sizeof(*risk));
    for (size_t k = 0; k < nr && risk; k++) {
        double logical = (double)physical * (double)res[k].ratio_milli / 1000.0;
        double admitted = st->max_requests > 0 ? fmin(1.0, logical / st->max_requests) : 1.0;
        risk[k] = admitted * predicted / (double)physical;
        if (risk[k] <= 0.95 && res[k].ratio_milli > risk_ok)
            risk_ok = res[k].ratio_milli;
    }
    int32_t rec = rule;
    if (sweep > 0 && sweep < rec)
        rec = sweep;
    if (risk_ok > 0 && risk_ok < rec)
        rec = risk_ok;
    if (sweep == 0)
        rec = 0;
    /* the lowest ratio from which every higher one of the sweep runs the same: above it the
     * ratio does not bind (physical memory does), and recommending more changes nothing */
    size_t bind_k = nr - 1;
    while (bind_k > 0 && same_run(&res[bind_k - 1], &res[nr - 1]))
        bind_k--;
    int32_t binds_until = res[bind_k].ratio_milli;
    bool capped = false;
    if (rec > binds_until && bind_k < nr - 1) {
        rec = binds_until;
        capped = true;
    }
    *ad = (struct advice){rule, sweep, risk_ok, rec, binds_until, bind_k, capped, risk};
}

static void print_advice_json(const struct sim_result *res, size_t nr, size_t n_pool,
                              const struct demand_stats *st, const struct advice *ad, double days)
{
    json_t *rows = json_array();
    for (size_t k = 0; k < nr; k++) {
        json_t *o = report_json(&res[k]);
        json_object_set_new(o, "preemptions_per_week", json_real(preemptions_per_week(&res[k])));
        json_object_set_new(o, "degrades_per_week", json_real(degrades_per_week(&res[k])));
        json_object_set_new(o, "predicted_peak_over_physical",
                            json_real(ad->risk ? ad->risk[k] : 0));
        json_array_append_new(rows, o);
    }
    json_t *root = json_pack(
        "{s:o, s:i, s:f, s:b, s:{s:f, s:f, s:f}, s:o, s:{s:f, s:f, s:f, s:f}, s:b}",
        "recommended_ratio", ad->rec ? json_real(ad->rec / 1000.0) : json_null(), "gpus",
        (int)n_pool, "ratio_stops_binding_at", ad->binds_until / 1000.0,
        "capped_where_ratio_stops_binding", ad->capped, "by", "brief_rule", ad->rule / 1000.0,
        "sweep", ad->sweep / 1000.0, "risk", ad->risk_ok / 1000.0, "evidence", rows, "demand",
        "mean_mib", st->mean, "sigma_mib", st->sigma, "sum_p99_mib", st->sum_p99, "peak_mib",
        st->peak, "history_shorter_than_a_week", days < 7.0);
    json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    fputc('\n', stdout);
    json_decref(root);
}

static void print_advice_text(const struct sim_result *res, size_t nr, size_t n_pool,
                              int64_t physical, const struct demand_stats *st,
                              const struct advice *ad, double days)
{
    int32_t rec = ad->rec, rule = ad->rule, sweep = ad->sweep, risk_ok = ad->risk_ok;
    int32_t binds_until = ad->binds_until;
    if (rec > 0)
        printf("Recommended oversell ratio: %d.%02dx on %zu GPUs (%lld MiB physical)\n\n",
               rec / 1000, (rec % 1000) / 10, n_pool, (long long)physical);
    else
        printf("No ratio of the sweep stays within the budgets on %zu GPUs: add GPUs or "
               "loosen the budgets.\n\n",
               n_pool);
    printf("  (a) the brief's rule (start at 1.3x, step up while fewer than 5 preemptions "
           "a week, up to 1.8x): %d.%02dx\n",
           rule / 1000, (rule % 1000) / 10);
    printf("  (b) the highest ratio of the sweep within every budget: ");
    if (sweep)
        printf("%d.%02dx\n", sweep / 1000, (sweep % 1000) / 10);
    else
        printf("none\n");
    printf("  (c) the highest ratio whose predicted peak (max of mean + 3 sigma = %.0f MiB "
           "and the sum of per-service p99 = %.0f MiB) stays under 95%% of physical: ",
           st->mean + 3 * st->sigma, st->sum_p99);
    if (risk_ok)
        printf("%d.%02dx\n", risk_ok / 1000, (risk_ok % 1000) / 10);
    else
        printf("none\n");
    printf("  The recommendation is the lowest of the three");
    if (ad->capped)
        printf(", lowered to %d.%02dx: every ratio of the sweep from there up runs the same "
               "on this pool (physical memory binds, not the ratio)",
               binds_until / 1000, (binds_until % 1000) / 10);
    else if (ad->bind_k < nr - 1)
        printf("; ratios from %d.%02dx up run the same on this pool (the ratio no longer "
               "binds there)",
               binds_until / 1000, (binds_until % 1000) / 10);
    printf(".\n\nEvidence:\n");
    printf("%6s %9s %8s %8s %6s %5s %9s %9s %9s %10s\n", "ratio", "feasible", "used", "held", "oom",
           "p0", "evictions", "degrades", "unmet", "peak/phys");
    printf("%6s %9s %8s %8s %6s %5s %9s %9s %9s %10s\n", "", "", "mean", "mean", "", "", "/week",
           "/week", "", "predicted");
    for (size_t k = 0; k < nr; k++)
        printf("%3d.%02d %9s %7.1f%% %7.1f%% %6llu %5llu %9.1f %9.1f %8.2f%% %10.2f\n",
               res[k].ratio_milli / 1000, (res[k].ratio_milli % 1000) / 10,
               res[k].feasible ? "yes" : "no", 100 * res[k].mean_used_util,
               100 * res[k].mean_held_util, (unsigned long long)res[k].oom_events,
               (unsigned long long)res[k].p0_disruptions, preemptions_per_week(&res[k]),
               degrades_per_week(&res[k]), 100 * res[k].unmet_fraction, ad->risk ? ad->risk[k] : 0);
    printf("\nCaveats:\n");
    if (days < 7.0)
        printf("  - The history covers %.1f days, less than a week: the brief asks for a whole "
               "business cycle including a weekend. Per-week figures are extrapolated.\n",
               days);
    printf("  - The brief's rule counts preemptions as evictions of batch and experiment "
           "services; degrades (the service keeps running at its floor) are shown but not "
           "counted.\n");
    printf("  - A simulation replays measured usage: services whose load changes with what "
           "else runs (shared caches, co-located traffic) can behave differently.\n");
}

int advise_run(const struct sim_budget *b, const char *gpus, int32_t r_from, int32_t r_to,
               int32_t r_step, const struct trace *tr, bool json, bool quiet)
{
    char err[256];
    int64_t pool[4096];
    size_t n_pool = 0;
    if (advise_pool(b, gpus, tr, quiet, pool, &n_pool) != 0)
        return -1;
    int64_t physical = 0;
    for (size_t i = 0; i < n_pool; i++)
        physical += pool[i];

    size_t nr = (size_t)((r_to - r_from) / r_step) + 1;
    struct sim_result *res = calloc(nr, sizeof(*res));
    if (res == NULL)
        return -1;
    for (size_t k = 0; k < nr; k++) {
        int32_t ratio = r_from + (int32_t)k * r_step;
        if (!quiet)
            fprintf(stderr, "advise: %zu GPUs at %d.%03dx ...\n", n_pool, ratio / 1000,
                    ratio % 1000);
        struct sim_opts o = {
            .policy = POL_OVERSUB, .ratio_milli = ratio, .pool = pool, .n_pool = n_pool};
        if (sim_run(tr, &o, b, &res[k], err, sizeof(err)) != 0) {
            fprintf(stderr, "oversub: advise: %s\n", err);
            free(res);
            return -1;
        }
    }
    struct demand_stats st;
    if (stats_of(tr, &st) != 0) {
        free(res);
        return -1;
    }
    struct advice ad;
    advise_decide(res, nr, physical, &st, &ad);
    double days = (double)(tr->t1 - tr->t0 + tr->step_s) / 86400.0;
    if (json)
        print_advice_json(res, nr, n_pool, &st, &ad, days);
    else
        print_advice_text(res, nr, n_pool, physical, &st, &ad, days);
    for (size_t k = 0; k < nr; k++)
        sim_result_free(&res[k]);
    free(res);
    free(ad.risk);
    return 0;
}
