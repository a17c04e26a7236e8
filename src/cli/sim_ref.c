/* sim_ref.c - the policies the engine is compared with: the brief's pool-level algorithm (defects
 * included) and a hindsight packing of whole usage series, with the true lower bound */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brief_policy.h"
#include "sim_int.h"

/* ---- the brief's pool-level algorithm ------------------------------------------------- */

int sim__brief(const struct trace *tr, const struct sim_opts *o, const struct sim_budget *b,
               struct sim_result *r, struct progress *pg, char *err, size_t errlen)
{
    int64_t vram_total = 0;
    for (size_t g = 0; g < o->n_pool; g++)
        vram_total += o->pool[g];
    double total_gb = (double)vram_total / 1024.0;
    brief_pool_t *p = brief_new(total_gb, (double)o->ratio_milli / 1000.0);
    struct run_svc *rs = calloc(tr->n, sizeof(*rs));
    size_t steps = sim__n_steps(tr);
    struct acc a = {0};
    a.used = calloc(steps, sizeof(double));
    a.held = calloc(steps, sizeof(double));
    a.events = calloc(steps, sizeof(uint32_t));
    struct idmap m;
    if (p == NULL || rs == NULL || a.used == NULL || a.held == NULL || a.events == NULL ||
        sim__idmap_init(&m, tr) != 0) {
        snprintf(err, errlen, "out of memory");
        brief_free(p);
        free(rs);
        free(a.used);
        free(a.held);
        free(a.events);
        return -1;
    }
    for (size_t i = 0; i < tr->n; i++)
        rs[i].wait_since = -1;
    char victims[64][64];
    for (size_t k = 0; k < steps; k++) {
        sim__step_progress(pg, o, k, steps);
        int64_t t = tr->t0 + (int64_t)k * tr->step_s;
        int64_t real = 0;
        uint32_t evs = 0;
        for (size_t i = 0; i < tr->n; i++) {
            const struct trace_svc *s = &tr->svcs[i];
            struct run_svc *x = &rs[i];
            if (x->st == RS_GONE)
                continue;
            int64_t d = sim__demand_at(s, x, t);
            if (d < 0) {
                if (x->st == RS_PLACED)
                    brief_release(p, s->spec.id);
                if (x->wait_since >= 0)
                    sim__note_wait(&a, x, t);
                if (x->st != RS_FUTURE)
                    x->st = RS_GONE;
                continue;
            }
            a.demand += d;
            r->service_steps++;
            int lvl = sim__level_of(s->spec.class_name);
            bool pre = lvl > 0;
            double gb = (double)s->spec.vram_mib / 1024.0;
            if (x->st == RS_FUTURE || x->st == RS_WAITING) {
                if (x->st == RS_FUTURE)
                    x->wait_since = t;
                if (!brief_can_allocate(p, lvl, gb, pre)) {
                    if (x->st == RS_FUTURE && lvl == 0)
                        r->p0_disruptions++;
                    x->st = RS_WAITING;
                    a.lost_min += (double)tr->step_s / 60.0;
                    continue;
                }
                int nv = brief_allocate(p, s->spec.id, lvl, gb, pre, t, victims, 64);
                for (int v = 0; v < nv && v < 64; v++) {
                    int32_t vi = sim__idmap_get(&m, victims[v]);
                    if (vi < 0)
                        continue;
                    int vl = sim__level_of(tr->svcs[vi].spec.class_name);
                    r->evictions[vl]++;
                    if (vl == 0)
                        r->p0_disruptions++;
                    evs++;
                    rs[vi].st = RS_WAITING; /* it retries next step, from scratch */
                    rs[vi].wait_since = t;
                }
                x->st = RS_PLACED;
                x->started_once = true;
                sim__note_wait(&a, x, t);
            }
            brief_update_usage(p, s->spec.id, (double)d / 1024.0);
            real += d;
        }
        /* an OOM: the pool's real demand above its VRAM */
        if (real > vram_total)
            r->oom_events++;
        a.used[k] = (double)real / (double)vram_total;
        double actual = brief_actual(p) / total_gb;
        a.held[k] = actual;
        a.used_sum += a.used[k];
        a.held_sum += actual;
        a.logical_sum += brief_allocated(p) / brief_logical(p);
        a.events[k] = evs;
        a.steps++;
    }
    sim__end_run(tr, b, &a, rs, r, o->timeline);
    sim__idmap_free(&m);
    free(rs);
    brief_free(p);
    return 0;
}

/* ---- hindsight: first-fit decreasing of whole usage series ---------------------------- */

struct hs_item {
    size_t svc;
    int64_t key;
};

static int cmp_hs(const void *a, const void *b)
{
    const struct hs_item *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return (x->svc > y->svc) - (x->svc < y->svc);
}

/* Demand series of one service over the grid (P0 at its full request), into out[steps]. */
static void series_of(const struct trace *tr, size_t i, int64_t *out, size_t steps)
{
    const struct trace_svc *s = &tr->svcs[i];
    struct run_svc x = {0};
    bool p0 = sim__level_of(s->spec.class_name) == 0;
    for (size_t k = 0; k < steps; k++) {
        int64_t d = sim__demand_at(s, &x, tr->t0 + (int64_t)k * tr->step_s);
        out[k] = d < 0 ? 0 : (p0 ? s->spec.vram_mib : d);
    }
}

int32_t sim_lower_bound(const struct trace *tr, int64_t gpu_mib)
{
    size_t steps = sim__n_steps(tr);
    int64_t *sum = calloc(steps, sizeof(*sum));
    struct run_svc *rs = calloc(tr->n, sizeof(*rs));
    if (sum == NULL || rs == NULL) {
        free(sum);
        free(rs);
        return 1;
    }
    for (size_t i = 0; i < tr->n; i++)
        for (size_t k = 0; k < steps; k++) {
            int64_t d = sim__demand_at(&tr->svcs[i], &rs[i], tr->t0 + (int64_t)k * tr->step_s);
            if (d > 0)
                sum[k] += d;
        }
    int64_t peak = 0;
    for (size_t k = 0; k < steps; k++)
        if (sum[k] > peak)
            peak = sum[k];
    free(sum);
    free(rs);
    return (int32_t)((peak + gpu_mib - 1) / gpu_mib);
}

int sim__hindsight(const struct trace *tr, const struct sim_opts *o, const struct sim_budget *b,
                   struct sim_result *r, char *err, size_t errlen)
{
    size_t steps = sim__n_steps(tr);
    int64_t gpu_mib = o->pool[0];
    struct hs_item *items = calloc(tr->n, sizeof(*items));
    int64_t *ser = calloc(steps, sizeof(*ser));
    int64_t **gpus = calloc(tr->n, sizeof(*gpus));
    struct acc a = {0};
    a.used = calloc(steps, sizeof(double));
    a.held = calloc(steps, sizeof(double));
    a.events = calloc(steps, sizeof(uint32_t));
    if (items == NULL || ser == NULL || gpus == NULL || a.used == NULL || a.held == NULL ||
        a.events == NULL) {
        snprintf(err, errlen, "out of memory");
        free(items);
        free(ser);
        free(gpus);
        free(a.used);
        free(a.held);
        free(a.events);
        return -1;
    }
    for (size_t i = 0; i < tr->n; i++) {
        items[i].svc = i;
        items[i].key = sim__level_of(tr->svcs[i].spec.class_name) == 0 ? tr->svcs[i].spec.vram_mib
                                                                       : tr->svcs[i].peak_mib;
    }
    qsort(items, tr->n, sizeof(*items), cmp_hs);
    size_t ng = 0;
    int64_t *used_real = calloc(steps, sizeof(*used_real));
    int64_t *held = calloc(steps, sizeof(*held));
    struct run_svc *rs = calloc(tr->n, sizeof(*rs));
    for (size_t it = 0; it < tr->n && used_real && held && rs; it++) {
        size_t i = items[it].svc;
        series_of(tr, i, ser, steps);
        bool alone = true;
        for (size_t k = 0; k < steps && alone; k++)
            alone = ser[k] <= gpu_mib;
        if (!alone) {
            /* even an empty GPU cannot hold it: it never starts (and makes the run infeasible) */
            r->too_big++;
            r->never_started++;
            continue;
        }
        size_t g;
        for (g = 0; g < ng; g++) {
            bool fits = true;
            for (size_t k = 0; k < steps && fits; k++)
                fits = gpus[g][k] + ser[k] <= gpu_mib;
            if (fits)
                break;
        }
        if (g == ng) {
            gpus[ng] = calloc(steps, sizeof(int64_t));
            if (gpus[ng] == NULL)
                break;
            ng++;
        }
        for (size_t k = 0; k < steps; k++) {
            gpus[g][k] += ser[k];
            held[k] += ser[k];
        }
        for (size_t k = 0; k < steps; k++) {
            int64_t d = sim__demand_at(&tr->svcs[i], &rs[i], tr->t0 + (int64_t)k * tr->step_s);
            if (d > 0) {
                used_real[k] += d;
                a.demand += d;
                r->service_steps++;
            }
        }
    }
    double cap = (double)ng * (double)gpu_mib;
    for (size_t k = 0; k < steps && used_real && held; k++) {
        a.used[k] = (double)used_real[k] / cap;
        a.held[k] = (double)held[k] / cap;
        a.used_sum += a.used[k];
        a.held_sum += a.held[k];
        a.logical_sum += a.held[k];
        a.steps++;
    }
    r->n_gpus = (int32_t)ng;
    for (size_t g = 0; g < ng; g++)
        free(gpus[g]);
    free(gpus);
    free(items);
    free(ser);
    free(used_real);
    free(held);
    free(rs);
    sim__finish(tr, b, &a, r, o->timeline);
    r->lower_bound_gpus = sim_lower_bound(tr, gpu_mib);
    return 0;
}
