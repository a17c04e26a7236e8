/* plan.c - admission and pressure planning: candidate GPUs, victim plans, placement score */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int64_t osub__share(int64_t total, int32_t k, int32_t i)
{
    int64_t base = total / k;
    return i == 0 ? base + total % k : base;
}

int64_t osub__floor_share(const struct svc *s, int32_t i)
{
    if (s->spec.exclusive)
        return s->slots[i].grant;
    return osub__share(s->floor_total, s->k, i);
}

bool osub__svc_victim_eligible(const struct svc *s)
{
    return s->preemptible && s->n_slots > 0 &&
           (s->state == OSUB_STATE_LOADING || s->state == OSUB_STATE_RUNNING ||
            s->state == OSUB_STATE_DEGRADED);
}

/* The held a slot will have once its service complies with `act`. */
int64_t osub__slot_held_after(const osub_engine_t *e, const struct svc *s, const struct slot *sl,
                              int act)
{
    (void)e;
    if (act == ACT_EVICT)
        return 0;
    if (act == ACT_DEGRADE) {
        int64_t fl = osub__floor_share(s, (int32_t)(sl - s->slots));
        if (s->loading)
            return sl->used > fl ? sl->used : fl;
        return sl->used < fl ? sl->used : fl;
    }
    return sl->held;
}

static int64_t slot_grant_after(const struct svc *s, const struct slot *sl, int act)
{
    if (act == ACT_EVICT)
        return 0;
    if (act == ACT_DEGRADE)
        return osub__floor_share(s, (int32_t)(sl - s->slots));
    return sl->grant;
}

/* What the held checks count for a share of the request: the share itself for backed and
 * exclusive requests, the same fraction of the predicted peak for oversold ones. */
static int64_t charge_of(const struct req *r, int64_t share)
{
    if (share == r->c_share && share > 0)
        return r->c_charge;
    if (r->exclusive || r->total <= 0 || r->charge >= r->total || r->charge <= 0)
        return share;
    if (share < (INT64_C(1) << 31) && r->charge < (INT64_C(1) << 31))
        return share * r->charge / r->total; /* fits 64 bits */
    return (int64_t)((osub_i128)share * r->charge / r->total);
}

/* What held plus the newcomer may reach on a GPU (osub__held_limit): every request's limit is
 * the pool's high watermark (fill_req), cached per GPU, with its two exceptions. */
static inline int64_t held_limit(const struct gpu *g, const struct req *r, int64_t share)
{
    return osub__held_limit(g, r->held_limit_pct, r->backed, share);
}

/* ---- floor room ------------------------------------------------------------------------ */

/* What a placed slot keeps under pressure: backed services their grant, degradable ones their
 * floor, the others nothing (pressure can only evict them). */
static int64_t slot_floor(const struct svc *s, int32_t i)
{
    if (s->backed)
        return s->slots[i].grant;
    if (!s->degradable)
        return 0;
    return osub__floor_share(s, i);
}

/* What a share of the request keeps under pressure. */
static int64_t req_floor(const struct req *r, int64_t share)
{
    if (share == r->c_share && share > 0)
        return r->c_floor;
    if (r->exclusive || r->total <= 0)
        return 0;
    if (r->floor == r->total)
        return share;
    if (share < (INT64_C(1) << 31) && r->floor < (INT64_C(1) << 31))
        return share * r->floor / r->total;
    return (int64_t)((osub_i128)share * r->floor / r->total);
}

static int64_t gpu_floors_now(const osub_engine_t *e, const struct gpu *g);
static int64_t gpu_rise_now(const osub_engine_t *e, const struct gpu *g);

/* Refreshes g's cached rise when the GPU changed or the minute did (the age term of the
 * predictions moves once a minute). */
static void gpu_cache(const osub_engine_t *e, struct gpu *g)
{
    int64_t minute = e->now / 60000;
    if (!g->cache_dirty && g->cache_minute == minute)
        return;
    g->rise_cache = gpu_rise_now(e, g);
    g->cache_minute = minute;
    g->cache_dirty = false;
}

/* What the services on g keep under pressure (those leaving excluded). */
static void gpu_floors_refresh(const osub_engine_t *e, const struct gpu *g)
{
    struct gpu *m = (struct gpu *)g; /* the cache only */
    m->floors_cache = gpu_floors_now(e, g);
    m->floors_dirty = false;
}

static inline int64_t gpu_floors(const osub_engine_t *e, const struct gpu *g)
{
    /* floors do not move with time: recomputed only when the GPU was touched */
    if (__builtin_expect(g->floors_dirty, 0))
        gpu_floors_refresh(e, g);
    return g->floors_cache;
}

static int64_t gpu_floors_now(const osub_engine_t *e, const struct gpu *g)
{
    int32_t gi = (int32_t)(g - e->gpus);
    int64_t sum = 0;
    for (int32_t j = 0; j < g->nsvc; j++) {
        const struct svc *o = g->svcs[j];
        if (o->state == OSUB_STATE_DRAINING || o->state == OSUB_STATE_OVERDUE)
            continue;
        for (int32_t i = 0; i < o->n_slots; i++)
            if (o->slots[i].gpu == gi)
                sum += slot_floor(o, i);
    }
    return sum;
}

/* Floor room (DESIGN's checks, one more): after a start, what every service on the GPU
 * keeps under pressure -- backed grants, degradable floors -- must fit under the same limit
 * as held, so that pressure there is always relieved by degrades alone and nobody is
 * evicted because a newcomer (or a degrade that cannot last) took the room their floors
 * need. Evicting a victim frees its floor; degrading it does not. */
static bool floor_room(const osub_engine_t *e, const struct gpu *g, const struct req *r,
                       int64_t share)
{
    if (r->exclusive)
        return true;
    return gpu_floors(e, g) + req_floor(r, share) <= held_limit(g, r, share);
}

/* ---- placement history ------------------------------------------------------------------ */

static void hist_advance(osub_engine_t *e, struct gpu *g)
{
    int64_t m = e->now / 60000;
    if (m <= g->hist_minute)
        return;
    int64_t steps = m - g->hist_minute;
    if (steps > e->hist_n)
        steps = e->hist_n;
    for (int64_t i = 1; i <= steps; i++) {
        int64_t mm = m - steps + i;
        g->hist[mm % e->hist_n] = g->held;
    }
    g->hist_minute = m;
    int64_t peak = 0;
    for (int32_t i = 0; i < e->hist_n; i++)
        if (g->hist[i] > peak)
            peak = g->hist[i];
    g->hist_peak = peak;
}

void osub__hist_reset(osub_engine_t *e, struct gpu *g)
{
    hist_advance(e, g);
    for (int32_t i = 0; i < e->hist_n; i++)
        g->hist[i] = g->held;
    g->hist_peak = g->held;
    osub__gpu_touch(e, g);
}

int64_t osub__gpu_peak(osub_engine_t *e, struct gpu *g)
{
    hist_advance(e, g);
    return g->hist_peak > g->held ? g->hist_peak : g->held;
}

static void gpu_cache(const osub_engine_t *e, struct gpu *g);

static inline int64_t gpu_rise(const osub_engine_t *e, struct gpu *g)
{
    if (__builtin_expect(g->cache_dirty || g->cache_minute != e->now / 60000, 0))
        gpu_cache(e, g);
    return g->rise_cache;
}

/* How far the oversold services on g may still rise from what they hold to their predicted
 * peaks: the largest single rise, assuming that their peaks do not all come at once -- the
 * trace's pods peak apart (the sum of their peaks is 1.7x the peak of their sum); the co-peaks
 * they did show are in the GPU's held history. */
static int64_t gpu_rise_now(const osub_engine_t *e, const struct gpu *g)
{
    int32_t gi = (int32_t)(g - e->gpus);
    int64_t rise = 0;
    for (int32_t j = 0; j < g->nsvc; j++) {
        const struct svc *o = g->svcs[j];
        if (o->backed || (o->state != OSUB_STATE_RUNNING && o->state != OSUB_STATE_LOADING &&
                          o->state != OSUB_STATE_DEGRADED))
            continue;
        int64_t up = osub__slot_rise(e, o, gi);
        if (up > rise)
            rise = up;
    }
    return rise;
}

/* The GPU's projected peak before a newcomer: its held peak over the history window, or what
 * it holds now plus the largest rise its oversold services are predicted to make. */
static inline int64_t projected_base(osub_engine_t *e, struct gpu *g)
{
    if (__builtin_expect(e->now / 60000 > g->hist_minute, 0))
        hist_advance(e, g);
    int64_t peak = g->hist_peak > g->held ? g->hist_peak : g->held;
    int64_t up = g->held + gpu_rise(e, g);
    return up > peak ? up : peak;
}

/* Placement aims under the high watermark: the tightest fit among the GPUs where the
 * projected peak plus the newcomer stays under it; when none does, the GPU with the most
 * room (so that GPUs to spare lower the risk instead of sitting idle). */
static inline int64_t place_limit(const osub_engine_t *e, const struct gpu *g)
{
    (void)e;
    return g->hw_lim;
}

/* A backed request holds exactly its grant for ever: it is packed tightest under usable,
 * as reservations are (the best-fit index is keyed under the high watermark; usable minus
 * that is the same for every GPU of a size, so the order is the same). */
static int64_t req_limit(const osub_engine_t *e, const struct gpu *g, const struct req *r)
{
    return r->backed && !r->exclusive ? g->usable : place_limit(e, g);
}

static int64_t placement_score(osub_engine_t *e, struct gpu *g, const struct req *r, int64_t charge)
{
    int64_t projected = projected_base(e, g) + charge, lim = req_limit(e, g, r);
    if (projected <= lim)
        return lim - projected;                    /* tightest fit first */
    return (INT64_C(1) << 50) + (projected - lim); /* least overshoot first */
}

/* ---- workspace ------------------------------------------------------------------------- */

struct ws_gpu {
    int32_t gpu;
    int64_t share;
    int64_t charge; /* what the held check counts of the share */
    int64_t floors; /* what the services there keep under pressure, before any victim */
    int64_t dg, dh, df;
    int32_t dc, nev;
    bool pass;
};

struct ws {
    const struct req *r;
    struct ws_gpu g[OSUB_SERVICE_GPUS_MAX];
    int32_t n;
    int32_t n_fail;
    int64_t held_target; /* pressure mode when >= 0 */
    int64_t relief;      /* pressure mode: relief already promised */
};

static int32_t ws_find(const struct ws *w, int32_t gpu)
{
    for (int32_t j = 0; j < w->n; j++)
        if (w->g[j].gpu == gpu)
            return j;
    return -1;
}

/* Evaluates one GPU's checks; returns the first failing check (NONE when all pass) and the
 * shortfall in MiB (or percent for compute, services for exclusive). */
static osub_check_t ws_eval(const osub_engine_t *e, const struct ws *w, const struct ws_gpu *x,
                            int64_t *shortfall)
{
    const struct gpu *g = &e->gpus[x->gpu];
    const struct req *r = w->r;
    int64_t sf;
    if (w->held_target >= 0) {
        sf = g->held - w->relief - x->dh - w->held_target;
        *shortfall = sf > 0 ? sf : 0;
        return sf > 0 ? OSUB_CHECK_HELD : OSUB_CHECK_NONE;
    }
    if (r->exclusive) {
        sf = g->nsvc - x->nev;
        *shortfall = sf;
        return sf > 0 ? OSUB_CHECK_EXCLUSIVE : OSUB_CHECK_NONE;
    }
    sf = g->granted - x->dg + x->share - g->logical;
    if (sf > 0) {
        *shortfall = sf;
        return OSUB_CHECK_LOGICAL;
    }
    if (r->backed) {
        sf = g->backed + x->share - g->usable;
        if (sf > 0) {
            *shortfall = sf;
            return OSUB_CHECK_BACKED;
        }
    }
    sf = g->held - x->dh + x->charge - held_limit(g, r, x->charge);
    if (sf > 0) {
        *shortfall = sf;
        return OSUB_CHECK_HELD;
    }
    sf = x->floors - x->df + req_floor(r, x->share) - held_limit(g, r, x->share);
    if (sf > 0) {
        *shortfall = sf;
        return OSUB_CHECK_FLOORS;
    }
    if (r->compute > 0) {
        int64_t lim = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
        sf = g->compute_all - x->dc + r->compute - lim;
        if (sf > 0) {
            *shortfall = sf;
            return OSUB_CHECK_COMPUTE;
        }
        if (r->backed) {
            sf = g->compute_backed + r->compute - 100;
            if (sf > 0) {
                *shortfall = sf;
                return OSUB_CHECK_COMPUTE;
            }
        }
    }
    *shortfall = 0;
    return OSUB_CHECK_NONE;
}

static void ws_update(const osub_engine_t *e, struct ws *w, int32_t j)
{
    int64_t sf;
    bool pass = ws_eval(e, w, &w->g[j], &sf) == OSUB_CHECK_NONE;
    if (pass != w->g[j].pass)
        w->n_fail += pass ? -1 : 1;
    w->g[j].pass = pass;
}

static void ws_init(const osub_engine_t *e, struct ws *w, const struct req *r, const int32_t *gpus,
                    const int64_t *shares, int32_t n)
{
    w->r = r;
    w->n = n;
    w->n_fail = 0;
    w->held_target = -1;
    w->relief = 0;
    for (int32_t j = 0; j < n; j++) {
        struct ws_gpu *x = &w->g[j];
        memset(x, 0, sizeof(*x));
        x->gpu = gpus[j];
        x->share = shares[j];
        x->charge = charge_of(r, shares[j]);
        x->floors = gpu_floors(e, &e->gpus[gpus[j]]);
        x->pass = true;
        ws_update(e, w, j);
    }
}

/* Changes victim v's action from a0 to a1, updating the GPUs of the set it sits on. */
static void ws_apply(const osub_engine_t *e, struct ws *w, const struct svc *v, int a0, int a1)
{
    for (int32_t i = 0; i < v->n_slots; i++) {
        const struct slot *sl = &v->slots[i];
        int32_t j = ws_find(w, sl->gpu);
        if (j < 0)
            continue;
        struct ws_gpu *x = &w->g[j];
        x->dg += slot_grant_after(v, sl, a0) - slot_grant_after(v, sl, a1);
        x->dh += osub__slot_held_after(e, v, sl, a0) - osub__slot_held_after(e, v, sl, a1);
        x->df +=
            (a1 == ACT_EVICT ? slot_floor(v, i) : 0) - (a0 == ACT_EVICT ? slot_floor(v, i) : 0);
        if (a0 == ACT_EVICT) {
            x->dc -= v->spec.compute_pct;
            x->nev--;
        }
        if (a1 == ACT_EVICT) {
            x->dc += v->spec.compute_pct;
            x->nev++;
        }
        ws_update(e, w, j);
    }
}

/* Victim order: lowest priority first (level desc), then most recently submitted first. */
static int victim_cmp(const void *a, const void *b)
{
    const struct svc *x = *(const struct svc *const *)a, *y = *(const struct svc *const *)b;
    if (x->level != y->level)
        return x->level > y->level ? -1 : 1;
    if (x->submit_ms != y->submit_ms)
        return x->submit_ms > y->submit_ms ? -1 : 1;
    if (x->seq != y->seq)
        return x->seq > y->seq ? -1 : 1;
    return 0;
}

static bool evictable(const osub_engine_t *e, const struct svc *v, bool pressure)
{
    if (pressure)
        return true;
    return !(v->resumed && e->now - v->resume_ms < e->cfg.min_runtime_ms);
}

static bool degradable_now(const struct svc *v)
{
    return v->degradable && v->state != OSUB_STATE_DEGRADED;
}

/* Plans victims on the workspace's GPUs. Returns true when the checks pass afterwards. */
static bool plan_victims(osub_engine_t *e, struct ws *w, struct plan *p)
{
    const struct req *r = w->r;
    p->n_victims = 0;
    p->top_level = INT32_MAX;
    p->n_evict = p->n_degrade = 0;
    p->restart_sum = 0;
    if (w->n_fail == 0)
        return true;

    /* gather eligible victims on the set's GPUs, deduplicated */
    uint64_t stamp = ++e->plan_stamp;
    struct svc **V = p->victims;
    int32_t nv = 0;
    for (int32_t j = 0; j < w->n; j++) {
        const struct gpu *g = &e->gpus[w->g[j].gpu];
        for (int32_t i = 0; i < g->nsvc && nv < OSUB_PLAN_MAX_VICTIMS; i++) {
            struct svc *v = g->svcs[i];
            if (v->plan_stamp == stamp || v == r->self || !osub__svc_victim_eligible(v))
                continue;
            if (v->level <= r->level)
                continue;
            v->plan_stamp = stamp;
            V[nv++] = v;
        }
    }
    if (w->n > 1 && nv > 1)
        qsort(V, (size_t)nv, sizeof(V[0]), victim_cmp);
    uint8_t *A = p->acts;
    memset(A, 0, (size_t)nv);

    bool ok = false;
    int32_t i = 0;
    while (i < nv && !ok) {
        int32_t lvl = V[i]->level, end = i;
        while (end < nv && (r->pressure || V[end]->level == lvl))
            end++; /* pressure: every level's degrades before any eviction */
        for (int32_t t = i; t < end && !ok; t++) {
            if (degradable_now(V[t])) {
                ws_apply(e, w, V[t], A[t], ACT_DEGRADE);
                A[t] = ACT_DEGRADE;
                ok = w->n_fail == 0;
            }
        }
        for (int32_t t = i; t < end && !ok; t++) {
            if (evictable(e, V[t], r->pressure)) {
                ws_apply(e, w, V[t], A[t], ACT_EVICT);
                A[t] = ACT_EVICT;
                ok = w->n_fail == 0;
            }
        }
        i = end;
    }
    if (!ok && !r->pressure) {
        p->n_victims = 0;
        return false;
    }
    /* give back what is not needed, highest priority and oldest first */
    for (int32_t t = nv - 1; t >= 0; t--) {
        if (A[t] == ACT_NONE)
            continue;
        int a = A[t];
        ws_apply(e, w, V[t], a, ACT_NONE);
        if (w->n_fail == 0) {
            A[t] = ACT_NONE;
            continue;
        }
        if (a == ACT_EVICT && degradable_now(V[t])) {
            ws_apply(e, w, V[t], ACT_NONE, ACT_DEGRADE);
            if (w->n_fail == 0) {
                A[t] = ACT_DEGRADE;
                continue;
            }
            ws_apply(e, w, V[t], ACT_DEGRADE, a);
        } else {
            ws_apply(e, w, V[t], ACT_NONE, a);
        }
    }
    /* compact */
    int32_t n = 0;
    for (int32_t t = 0; t < nv; t++) {
        if (A[t] == ACT_NONE)
            continue;
        V[n] = V[t];
        A[n] = A[t];
        n++;
        if (V[t]->level < p->top_level)
            p->top_level = V[t]->level;
        if (A[t] == ACT_EVICT) {
            p->n_evict++;
            p->restart_sum += V[t]->restart_cost_ms;
        } else {
            p->n_degrade++;
        }
    }
    p->n_victims = n;
    return ok || n > 0;
}

/* Key order of DESIGN.md step 5. Returns <0 when a is better. */
static int key_cmp(const struct plan *a, const struct plan *b)
{
    bool av = a->n_victims > 0, bv = b->n_victims > 0;
    if (av != bv)
        return av ? 1 : -1;
    if (a->top_level != b->top_level)
        return a->top_level > b->top_level ? -1 : 1;
    if (a->n_evict != b->n_evict)
        return a->n_evict < b->n_evict ? -1 : 1;
    if (a->n_degrade != b->n_degrade)
        return a->n_degrade < b->n_degrade ? -1 : 1;
    if (a->restart_sum != b->restart_sum)
        return a->restart_sum < b->restart_sum ? -1 : 1;
    if (a->score != b->score)
        return a->score < b->score ? -1 : 1;
    if (a->gpus[0] != b->gpus[0])
        return a->gpus[0] < b->gpus[0] ? -1 : 1;
    return 0;
}

/* Packs DESIGN.md's key into two integers: (victims, top level inverted, evictions, degrades,
 * restart cost) and (placement score, GPU index). Lower is better. */
static void cand_pack(struct cand *c)
{
    uint64_t hi = 0;
    if (c->victims) {
        uint64_t lvl = (uint64_t)(OSUB_MAX_LEVEL -
                                  (c->top_level > OSUB_MAX_LEVEL ? OSUB_MAX_LEVEL : c->top_level));
        uint64_t ev = (uint64_t)(c->n_evict > 127 ? 127 : c->n_evict);
        uint64_t dg = (uint64_t)(c->n_degrade > 127 ? 127 : c->n_degrade);
        uint64_t rs = (uint64_t)c->restart_sum;
        if (rs > (UINT64_C(1) << 34) - 1)
            rs = (UINT64_C(1) << 34) - 1;
        hi = (UINT64_C(1) << 62) | (lvl << 58) | (ev << 51) | (dg << 44) | (rs << 10);
    }
    c->khi = hi;
    c->klo = ((uint64_t)c->score << 12) | (uint64_t)c->gpu;
}

static int cand_cmp(const struct cand *a, const struct cand *b)
{
    if (a->khi != b->khi)
        return a->khi < b->khi ? -1 : 1;
    return (a->klo > b->klo) - (a->klo < b->klo);
}

/* Keeps the k best candidates in best[0..*nb), sorted. */
static void keep_best(struct cand *best, int32_t *nb, int32_t k, const struct cand *c)
{
    int32_t n = *nb;
    if (n == k && cand_cmp(c, &best[n - 1]) >= 0)
        return;
    int32_t pos = n < k ? n : k - 1;
    while (pos > 0 && cand_cmp(c, &best[pos - 1]) < 0) {
        best[pos] = best[pos - 1];
        pos--;
    }
    best[pos] = *c;
    if (n < k)
        (*nb)++;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static bool gpu_takes(const struct gpu *g, const struct req *r, int64_t size)
{
    if (g->lost || g->cordoned || g->vram != size)
        return false;
    if (g->excl != NULL && (r->self == NULL || g->excl != r->self))
        return false;
    return true;
}

static void note_failure(struct plan *out, osub_check_t c, int32_t gpu, int64_t sf)
{
    if (c == OSUB_CHECK_NONE)
        return;
    if (out->check == OSUB_CHECK_NONE || sf < out->shortfall ||
        (sf == out->shortfall && gpu < out->check_gpu)) {
        out->check = c;
        out->check_gpu = gpu;
        out->shortfall = sf;
        out->fit_gpus = out->need_gpus = 0;
    }
}

/* Recomputes a GPU's victim aggregates if anything on it changed since the last look. */
static void gpu_agg(const osub_engine_t *e, struct gpu *g, int32_t gi)
{
    if (!g->agg_dirty && e->now < g->agg_valid_until)
        return;
    g->agg_valid_until = INT64_MAX;
    memset(g->a->ev_held, 0, sizeof(g->a->ev_held));
    memset(g->a->ev_grant, 0, sizeof(g->a->ev_grant));
    memset(g->a->dg_held, 0, sizeof(g->a->dg_held));
    memset(g->a->dg_grant, 0, sizeof(g->a->dg_grant));
    memset(g->a->dg_max_held, 0, sizeof(g->a->dg_max_held));
    memset(g->a->dg_max_grant, 0, sizeof(g->a->dg_max_grant));
    memset(g->a->ex_max_held, 0, sizeof(g->a->ex_max_held));
    memset(g->a->ex_max_grant, 0, sizeof(g->a->ex_max_grant));
    memset(g->a->ev_comp, 0, sizeof(g->a->ev_comp));
    memset(g->a->ev_cnt, 0, sizeof(g->a->ev_cnt));
    memset(g->a->ev_floor, 0, sizeof(g->a->ev_floor));
    memset(g->a->ex_max_floor, 0, sizeof(g->a->ex_max_floor));
    g->nvic = 0;
    for (int32_t i = 0; i < g->nsvc; i++) {
        const struct svc *v = g->svcs[i];
        if (!osub__svc_victim_eligible(v))
            continue;
        for (int32_t t = 0; t < v->n_slots; t++) {
            const struct slot *sl = &v->slots[t];
            if (sl->gpu != gi)
                continue;
            int32_t L = v->level;
            bool can_evict = evictable(e, v, false);
            if (!can_evict && v->resume_ms + e->cfg.min_runtime_ms < g->agg_valid_until)
                g->agg_valid_until = v->resume_ms + e->cfg.min_runtime_ms;
            struct vinfo *vi = &g->vic[g->nvic++];
            vi->s = v;
            vi->level = L;
            vi->degradable = degradable_now(v);
            vi->comp = v->spec.compute_pct;
            vi->rg_e = sl->grant;
            vi->rh_e = sl->held;
            vi->rf_e = v->state == OSUB_STATE_DRAINING || v->state == OSUB_STATE_OVERDUE
                           ? 0
                           : slot_floor(v, t);
            vi->rg_d = vi->degradable ? sl->grant - slot_grant_after(v, sl, ACT_DEGRADE) : 0;
            vi->rh_d = vi->degradable ? sl->held - osub__slot_held_after(e, v, sl, ACT_DEGRADE) : 0;
            vi->restart_ms = v->restart_cost_ms;
            /* ev_*: the most each victim can give: all of it if it may be evicted, else
             * what a degrade frees (protected work may still be degraded) */
            if (can_evict) {
                g->a->ev_held[L] += sl->held;
                g->a->ev_grant[L] += sl->grant;
                g->a->ev_comp[L] += v->spec.compute_pct;
                g->a->ev_cnt[L]++;
                g->a->ev_floor[L] += vi->rf_e;
                if (vi->rf_e > g->a->ex_max_floor[L])
                    g->a->ex_max_floor[L] = vi->rf_e;
                /* what an eviction frees beyond a degrade of the same victim */
                int64_t xh = sl->held, xg = sl->grant;
                if (degradable_now(v)) {
                    xh = osub__slot_held_after(e, v, sl, ACT_DEGRADE);
                    xg = slot_grant_after(v, sl, ACT_DEGRADE);
                }
                if (xh > g->a->ex_max_held[L])
                    g->a->ex_max_held[L] = xh;
                if (xg > g->a->ex_max_grant[L])
                    g->a->ex_max_grant[L] = xg;
            } else if (degradable_now(v)) {
                g->a->ev_held[L] += sl->held - osub__slot_held_after(e, v, sl, ACT_DEGRADE);
                g->a->ev_grant[L] += sl->grant - slot_grant_after(v, sl, ACT_DEGRADE);
            }
            if (degradable_now(v)) {
                int64_t rh = sl->held - osub__slot_held_after(e, v, sl, ACT_DEGRADE);
                int64_t rg = sl->grant - slot_grant_after(v, sl, ACT_DEGRADE);
                g->a->dg_held[L] += rh;
                g->a->dg_grant[L] += rg;
                if (rh > g->a->dg_max_held[L])
                    g->a->dg_max_held[L] = rh;
                if (rg > g->a->dg_max_grant[L])
                    g->a->dg_max_grant[L] = rg;
            }
        }
    }
    g->agg_dirty = false;
}

/* An optimistic key for a GPU that needs victims, from its aggregates: no real plan can beat
 * it. Returns false when no plan on this GPU can work at all. */
static bool optimistic(const osub_engine_t *e, struct gpu *g, int32_t gi, const struct req *r,
                       int64_t share, struct cand *c)
{
    gpu_agg(e, g, gi);
    int64_t dl = g->granted + share - g->logical;
    int64_t ch = charge_of(r, share);
    int64_t dh = g->held + ch - held_limit(g, r, ch);
    int64_t dc = 0;
    if (r->backed && g->backed + share > g->usable)
        return false;
    if (r->compute > 0) {
        int64_t lim = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
        dc = g->compute_all + r->compute - lim;
        if (r->backed && g->compute_backed + r->compute > 100)
            return false;
    }
    int64_t df =
        r->exclusive ? 0 : gpu_floors(e, g) + req_floor(r, share) - held_limit(g, r, share);
    int64_t eh = 0, eg = 0, dgh = 0, dgg = 0, mh = 0, mg = 0, xh = 0, xg = 0;
    int64_t ec = 0, cnt = 0, ef = 0, xf = 0;
    for (int32_t L = e->max_level; L > r->level; L--) {
        eh += g->a->ev_held[L];
        eg += g->a->ev_grant[L];
        ec += g->a->ev_comp[L];
        cnt += g->a->ev_cnt[L];
        ef += g->a->ev_floor[L];
        dgh += g->a->dg_held[L];
        dgg += g->a->dg_grant[L];
        if (g->a->dg_max_held[L] > mh)
            mh = g->a->dg_max_held[L];
        if (g->a->dg_max_grant[L] > mg)
            mg = g->a->dg_max_grant[L];
        if (g->a->ex_max_held[L] > xh)
            xh = g->a->ex_max_held[L];
        if (g->a->ex_max_grant[L] > xg)
            xg = g->a->ex_max_grant[L];
        if (g->a->ex_max_floor[L] > xf)
            xf = g->a->ex_max_floor[L];
        if (g->a->ev_held[L] == 0 && g->a->ev_grant[L] == 0 && g->a->ev_cnt[L] == 0)
            continue;
        bool ok = r->exclusive ? cnt >= g->nsvc : (eg >= dl && eh >= dh && ec >= dc && ef >= df);
        if (!ok)
            continue;
        c->victims = true;
        c->top_level = L;
        /* lower bounds: no eviction only if degrading everything would do; one degrade only
         * if some single victim frees enough of both */
        bool deg_ok = !r->exclusive && dgg >= dl && dgh >= dh && dc <= 0 && df <= 0;
        int32_t nev = 0;
        if (!deg_ok) {
            /* each eviction frees at most the largest extra beyond its degrade */
            nev = 1;
            if (!r->exclusive) {
                int64_t rh = dh - dgh, rgr = dl - dgg;
                if (rh > 0 && xh > 0 && (rh + xh - 1) / xh > nev)
                    nev = (int32_t)((rh + xh - 1) / xh);
                if (rgr > 0 && xg > 0 && (rgr + xg - 1) / xg > nev)
                    nev = (int32_t)((rgr + xg - 1) / xg);
                if (df > 0 && xf > 0 && (df + xf - 1) / xf > nev)
                    nev = (int32_t)((df + xf - 1) / xf);
            } else {
                nev = (int32_t)g->nsvc;
            }
        }
        c->n_evict = nev;
        c->n_degrade = deg_ok ? ((mh >= dh && mg >= dl) ? 1 : 2) : 0;
        c->restart_sum = 0;
        return true;
    }
    return false;
}

static void heap_sift(struct cand *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, m = i;
        if (l < n && cand_cmp(&h[l], &h[m]) < 0)
            m = l;
        if (l + 1 < n && cand_cmp(&h[l + 1], &h[m]) < 0)
            m = l + 1;
        if (m == i)
            return;
        struct cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The exact victim plan of DESIGN.md step 4 on one GPU, on the GPU's cached victim list:
 * the same walk and give-back as plan_victims(), in scalar arithmetic. Fills the key of c;
 * returns false when no plan works. (plan_victims() stays the reference: the chosen set is
 * always planned again by it.) */
static bool plan_single(const osub_engine_t *e, const struct gpu *g, const struct req *r,
                        int64_t share, struct cand *c)
{
    int64_t climit = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
    int64_t ch = charge_of(r, share);
    int64_t dl0 = g->granted + share - g->logical, dh0 = g->held + ch - held_limit(g, r, ch);
    int64_t df0 = r->exclusive ? INT64_MIN / 4
                               : gpu_floors(e, g) + req_floor(r, share) - held_limit(g, r, share);
    int64_t dc0 = r->compute > 0 ? g->compute_all + r->compute - climit : 0;
    if (r->backed &&
        (g->backed + share > g->usable || (r->compute > 0 && g->compute_backed + r->compute > 100)))
        return false;
    int32_t n = 0;
    while (n < g->nvic && n < OSUB_PLAN_MAX_VICTIMS && g->vic[n].level > r->level)
        n++;
    uint8_t A[OSUB_PLAN_MAX_VICTIMS];
    memset(A, 0, (size_t)n);
    int64_t rg = 0, rh = 0, rc = 0, nev = 0, rf = 0;
    const struct vinfo *V = g->vic;
#define OSUB__PASS()                                                                               \
    (r->exclusive ? (g->nsvc - nev == 0) : (rg >= dl0 && rh >= dh0 && rc >= dc0 && rf >= df0))
    bool ok = OSUB__PASS();
    if (ok)
        return false; /* not a victim case: the caller handles fits */
    for (int32_t i = 0; i < n && !ok;) {
        int32_t lvl = V[i].level, end = i;
        while (end < n && V[end].level == lvl)
            end++;
        for (int32_t t = i; t < end && !ok; t++) {
            if (V[t].degradable) {
                rg += V[t].rg_d;
                rh += V[t].rh_d;
                A[t] = ACT_DEGRADE;
                ok = OSUB__PASS();
            }
        }
        for (int32_t t = i; t < end && !ok; t++) {
            if (evictable(e, V[t].s, r->pressure)) {
                if (A[t] == ACT_DEGRADE) {
                    rg -= V[t].rg_d;
                    rh -= V[t].rh_d;
                }
                rg += V[t].rg_e;
                rh += V[t].rh_e;
                rc += V[t].comp;
                rf += V[t].rf_e;
                nev++;
                A[t] = ACT_EVICT;
                ok = OSUB__PASS();
            }
        }
        i = end;
    }
    if (!ok)
        return false;
    for (int32_t t = n - 1; t >= 0; t--) {
        if (A[t] == ACT_NONE)
            continue;
        /* take it back entirely */
        int64_t g0 = A[t] == ACT_EVICT ? V[t].rg_e : V[t].rg_d;
        int64_t h0 = A[t] == ACT_EVICT ? V[t].rh_e : V[t].rh_d;
        int64_t c0 = A[t] == ACT_EVICT ? V[t].comp : 0;
        int64_t n0 = A[t] == ACT_EVICT ? 1 : 0;
        int64_t f0 = A[t] == ACT_EVICT ? V[t].rf_e : 0;
        rg -= g0;
        rh -= h0;
        rc -= c0;
        rf -= f0;
        nev -= n0;
        if (OSUB__PASS()) {
            A[t] = ACT_NONE;
            continue;
        }
        if (A[t] == ACT_EVICT && V[t].degradable) {
            rg += V[t].rg_d;
            rh += V[t].rh_d;
            if (OSUB__PASS()) {
                A[t] = ACT_DEGRADE;
                continue;
            }
            rg -= V[t].rg_d;
            rh -= V[t].rh_d;
        }
        rg += g0;
        rh += h0;
        rc += c0;
        rf += f0;
        nev += n0;
    }
#undef OSUB__PASS
    c->victims = true;
    c->top_level = INT32_MAX;
    c->n_evict = c->n_degrade = 0;
    c->restart_sum = 0;
    for (int32_t t = 0; t < n; t++) {
        if (A[t] == ACT_NONE)
            continue;
        if (V[t].level < c->top_level)
            c->top_level = V[t].level;
        if (A[t] == ACT_EVICT) {
            c->n_evict++;
            c->restart_sum += V[t].restart_ms;
        } else {
            c->n_degrade++;
        }
    }
    return true;
}

/* Plans the chosen k GPUs as one set (DESIGN.md: victims shared between them count once; the
 * odd MiB goes to the first GPU of the set) and fills p. The set's score is its worst GPU's. */
static bool plan_set(osub_engine_t *e, const struct req *r, const struct cand *best, int32_t k,
                     int64_t usable, struct plan *p)
{
    struct ws w;
    int32_t gpus[OSUB_SERVICE_GPUS_MAX];
    int64_t shares[OSUB_SERVICE_GPUS_MAX];
    for (int32_t j = 0; j < k; j++)
        gpus[j] = best[j].gpu;
    qsort(gpus, (size_t)k, sizeof(gpus[0]), cmp_i32);
    int64_t worst = 0;
    for (int32_t j = 0; j < k; j++) {
        shares[j] = r->exclusive ? usable : osub__share(r->total, k, j);
        for (int32_t b = 0; b < k; b++)
            if (best[b].gpu == gpus[j] && best[b].score > worst)
                worst = best[b].score;
    }
    ws_init(e, &w, r, gpus, shares, k);
    if (!plan_victims(e, &w, p))
        return false;
    p->ok = true;
    p->k = k;
    memcpy(p->gpus, gpus, sizeof(gpus[0]) * (size_t)k);
    memcpy(p->shares, shares, sizeof(shares[0]) * (size_t)k);
    for (int32_t j = 0; j < k; j++)
        p->charges[j] = charge_of(r, shares[j]);
    p->score = worst;
    return true;
}

static void trees_refresh(osub_engine_t *e);
static int plan_admission_fast(osub_engine_t *e, const struct req *r, struct plan *out);

/* ---- best-fit index (a treap per size group) ------------------------------------- */

static bool tkey_less(const struct room_tree *t, int32_t a, int64_t kb, int32_t b)
{
    return t->pfree[a] < kb || (t->pfree[a] == kb && a < b);
}

/* Splits subtree x into nodes below (key, pos) and the rest. */
static void treap_split(struct room_tree *t, int32_t x, int64_t key, int32_t pos, int32_t *l,
                        int32_t *r)
{
    if (x < 0) {
        *l = *r = -1;
        return;
    }
    if (tkey_less(t, x, key, pos)) {
        treap_split(t, t->right[x], key, pos, &t->right[x], r);
        *l = x;
    } else {
        treap_split(t, t->left[x], key, pos, l, &t->left[x]);
        *r = x;
    }
}

static int32_t treap_merge(struct room_tree *t, int32_t a, int32_t b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    if (t->prio[a] > t->prio[b]) {
        t->right[a] = treap_merge(t, t->right[a], b);
        return a;
    }
    t->left[b] = treap_merge(t, a, t->left[b]);
    return b;
}

static void treap_erase(struct room_tree *t, int32_t pos)
{
    int32_t l, m, r;
    treap_split(t, t->root, t->pfree[pos], pos, &l, &m);
    /* m starts with pos itself: cut it off */
    int32_t m2, r2;
    treap_split(t, m, t->pfree[pos], pos + 1, &m2, &r2);
    (void)m2;
    (void)r;
    t->root = treap_merge(t, l, r2);
    t->in[pos] = false;
}

static void treap_insert(struct room_tree *t, int32_t pos, int64_t key)
{
    t->pfree[pos] = key;
    t->left[pos] = t->right[pos] = -1;
    int32_t l, r;
    treap_split(t, t->root, key, pos, &l, &r);
    t->root = treap_merge(t, treap_merge(t, l, pos), r);
    t->in[pos] = true;
}

/* The first node at or after (key, pos), -1 if none. */
static int32_t treap_lower_bound(const struct room_tree *t, int64_t key, int32_t pos)
{
    int32_t x = t->root, best = -1;
    while (x >= 0) {
        if (tkey_less(t, x, key, pos)) {
            x = t->right[x];
        } else {
            best = x;
            x = t->left[x];
        }
    }
    return best;
}

/* Appends to out the GPUs of group t whose room for level L is at least share (a walk down
 * the room tree that skips every subtree whose best is short). */
/* The room tree that fits a request: backed requests also need usable - backed, preemptible
 * ones must stay under the high watermark. */
static const int64_t *tree_for(const osub_engine_t *e, const struct room_tree *t,
                               const struct req *r, int32_t L, bool degrades_only, int64_t share)
{
    if (r->backed && !r->exclusive)
        return degrades_only ? t->bd[L] : t->bt[L];
    if (r->held_limit_pct > 0 && r->held_limit_pct < 100 &&
        share <= t->usable * r->held_limit_pct / 100 &&
        r->held_limit_pct == e->cfg.high_watermark_pct)
        return degrades_only ? t->pd[L] : t->pt[L];
    return degrades_only ? t->d[L] : t->t[L];
}

static void tree_collect(const struct room_tree *t, const int64_t *tr, int64_t share,
                         const int64_t *ftr, int64_t fneed, int32_t *out, int32_t *n, bool many)
{
    if (tr[1] < share || ftr[1] < fneed)
        return; /* the root: no GPU of the group has that much */
    if (many) {
        /* when many qualify (victims wanted), a straight scan of the contiguous leaves beats
         * a walk down the tree */
        const int64_t *leaf = tr + t->leaves, *fleaf = ftr + t->leaves;
        for (int32_t pos = 0; pos < t->n; pos++)
            if (leaf[pos] >= share && fleaf[pos] >= fneed)
                out[(*n)++] = t->gpus[pos];
        return;
    }
    int32_t stack[64]; /* depth-first over a heap of at most 2 x 4096 nodes: 13 deep */
    int32_t sp = 0;
    stack[sp++] = 1;
    while (sp > 0) {
        int32_t x = stack[--sp];
        if (x >= t->leaves) {
            int32_t pos = x - t->leaves;
            if (pos < t->n)
                out[(*n)++] = t->gpus[pos];
            continue;
        }
        /* right first so that the left (lower index) comes out first */
        if (tr[2 * x + 1] >= share && ftr[2 * x + 1] >= fneed)
            stack[sp++] = 2 * x + 1;
        if (tr[2 * x] >= share && ftr[2 * x] >= fneed)
            stack[sp++] = 2 * x;
    }
}

/* Plans the best placement for one GPU size. Returns true and fills *p when one exists.
 * Candidates come from the room trees: first the GPUs where it fits without victims (ranked
 * exactly), then, only if fewer than k of those, level by level from the lowest priority up,
 * the GPUs where victims of that level and below could make room, ranked by an optimistic
 * key and planned for real best-first until nothing left can beat the k best. */
static bool plan_size(osub_engine_t *e, const struct req *r0, int64_t size, struct plan *p,
                      struct plan *fail)
{
    /* the charge and floor of the first share, computed once for every GPU looked at */
    struct req rq = *r0;
    rq.c_share = 0;
    int64_t s0 = osub__share(rq.total, rq.k, 0);
    rq.c_charge = charge_of(&rq, s0);
    rq.c_floor = req_floor(&rq, s0);
    rq.c_share = s0;
    const struct req *r = &rq;
    int32_t k = r->k;
    struct cand best[OSUB_SERVICE_GPUS_MAX];
    int32_t nb = 0;
    struct ws w;
    best[k - 1].victims = false;
    best[k - 1].top_level = INT32_MAX;
    int64_t share0 = osub__share(r->total, k, 0);
    int64_t share_min = r->total / k;
    int64_t charge0 = charge_of(r, share0), charge_min = charge_of(r, share_min);
    /* the floor room a GPU needs (none for exclusive requests, nor for a share above the high
     * watermark, whose limit is the share itself) */
    int64_t fneed = INT64_MIN / 4;
    int64_t climit = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
    struct room_tree *grp = NULL;
    int32_t gj = -1;
    for (int32_t j = 0; j < e->n_trees && grp == NULL; j++)
        if (e->trees[j].vram == size) {
            grp = &e->trees[j];
            gj = j;
        }
    if (grp == NULL)
        return false;
    int32_t navail = 0;
    int64_t usable = 0;
    for (int32_t j = 0; j < e->n_sizes; j++)
        if (e->size_vram[j] == size) {
            navail = e->size_count[j];
            usable = e->size_usable[j];
        }
    if (navail < k) {
        note_failure(fail, OSUB_CHECK_GPUS, -1, k - navail);
        return false;
    }
    if (!r->exclusive && share_min <= usable * e->cfg.high_watermark_pct / 100)
        fneed = req_floor(r, share_min);
    trees_refresh(e);
    int32_t *cand = e->miss_buf;
    int32_t ncand = 0;
    uint64_t stamp = ++e->plan_stamp;

    /* 1. without victims. The tightest fit is the smallest projected free room that still
     * holds the share: walk the best-fit index up from there, stop at the k-th GPU that
     * passes every check. Only when none does (every fitting GPU would overshoot its past
     * peaks) are all the GPUs with room looked at. */
    bool scan = r->exclusive;
    if (!r->exclusive) {
        int32_t got = 0, walked = 0;
        int64_t slack = r->backed ? usable - usable * e->cfg.high_watermark_pct / 100 : 0;
        /* the walk is bounded: GPUs with held room but no floor room (or logical room) are
         * not in the index's order; past 4k of them the scan below, which the room trees
         * prune on every kind of room, finds the same best k */
        for (int32_t x = treap_lower_bound(grp, charge0 - slack, -1);
             x >= 0 && got < k && walked < 4 * k + 16;
             x = treap_lower_bound(grp, grp->pfree[x], x + 1), walked++) {
            int32_t gi = grp->gpus[x];
            struct gpu *g = &e->gpus[gi];
            if (!gpu_takes(g, r, size))
                continue;
            bool fits =
                g->granted + share0 <= g->logical &&
                g->held + charge0 <= held_limit(g, r, charge0) && floor_room(e, g, r, share0) &&
                (!r->backed || g->backed + share0 <= g->usable) &&
                (r->compute == 0 || (g->compute_all + r->compute <= climit &&
                                     (!r->backed || g->compute_backed + r->compute <= 100)));
            if (!fits)
                continue;
            cand[ncand++] = gi;
            got++;
        }
        if (got < k) {
            ncand = 0;
            scan = true;
        }
    }
    if (scan && r->exclusive) {
        for (int32_t x = 0; x < grp->n; x++) {
            struct gpu *g = &e->gpus[grp->gpus[x]];
            if (!g->lost && !g->cordoned && g->nsvc == 0)
                cand[ncand++] = grp->gpus[x];
        }
    } else if (scan) {
        tree_collect(grp, tree_for(e, grp, r, e->max_level, false, charge_min), charge_min,
                     grp->ft[e->max_level], fneed, cand, &ncand, false);
    }
    for (int32_t x = 0; x < ncand; x++) {
        int32_t gi = cand[x];
        struct gpu *g = &e->gpus[gi];
        if (!gpu_takes(g, r, size))
            continue;
        int64_t share = r->exclusive ? g->usable : share0;
        int64_t ch = r->exclusive ? share : charge0;
        bool fits = r->exclusive ||
                    (g->granted + share <= g->logical && g->held + ch <= held_limit(g, r, ch) &&
                     floor_room(e, g, r, share) && (!r->backed || g->backed + share <= g->usable) &&
                     (r->compute == 0 || (g->compute_all + r->compute <= climit &&
                                          (!r->backed || g->compute_backed + r->compute <= 100))));
        if (!fits)
            continue; /* compute, or the first GPU's odd MiB: victims may still help */
        e->gpu_stamp[gi] = stamp;
        struct cand c = {.gpu = gi, .victims = false, .top_level = INT32_MAX};
        c.score = placement_score(e, g, r, ch);
        cand_pack(&c);
        keep_best(best, &nb, k, &c);
    }

    /* 2. with victims, the lowest priority levels first */
    struct cand *opt = e->cand_buf;
    int32_t nopt = 0;
    for (int32_t L = e->max_level; L > r->level && !(nb == k && !best[k - 1].victims); L--) {
        /* a GPU whose victims of levels >= L are enough: its top level is at best L */
        if (nb == k && best[k - 1].top_level > L)
            break; /* what is left touches level L or higher: it cannot beat the k best */
        /* phase 0: GPUs where degrades alone could do (no eviction); phase 1: the rest */
        for (int phase = r->exclusive ? 1 : 0; phase < 2; phase++) {
            if (phase == 1 && nb == k && best[k - 1].victims && best[k - 1].top_level == L &&
                best[k - 1].n_evict == 0)
                break; /* the rest needs an eviction at level L, or touches more: cannot beat */
            ncand = 0;
            if (r->exclusive) {
                for (int32_t x = 0; x < grp->n; x++)
                    cand[ncand++] = grp->gpus[x];
            } else {
                tree_collect(grp, tree_for(e, grp, r, L - 1, phase == 0, charge_min), charge_min,
                             phase == 0 ? grp->fd : grp->ft[L - 1], fneed, cand, &ncand, false);
            }
            for (int32_t x = 0; x < ncand; x++) {
                int32_t gi = cand[x];
                if (e->gpu_stamp[gi] == stamp)
                    continue;
                struct gpu *g = &e->gpus[gi];
                if (!gpu_takes(g, r, size))
                    continue;
                int64_t share = r->exclusive ? g->usable : share0;
                struct cand c = {.gpu = gi};
                if (!optimistic(e, g, gi, r, share, &c))
                    continue;
                e->gpu_stamp[gi] = stamp;
                c.score = placement_score(e, g, r, charge_of(r, share));
                cand_pack(&c);
                opt[nopt++] = c;
            }
            for (int32_t i = nopt / 2 - 1; i >= 0; i--)
                heap_sift(opt, nopt, i); /* Floyd: O(n) */
            while (nopt > 0) {
                struct cand c = opt[0];
                if (nb == k && cand_cmp(&best[k - 1], &c) <= 0)
                    break; /* nothing in the heap can beat the k best */
                opt[0] = opt[--nopt];
                heap_sift(opt, nopt, 0);
                struct gpu *g = &e->gpus[c.gpu];
                int64_t share = r->exclusive ? g->usable : share0;
                if (!plan_single(e, g, r, share, &c))
                    continue;
                cand_pack(&c);
                keep_best(best, &nb, k, &c);
            }
        }
    }
    (void)gj;
    if (nb < k) {
        /* say why: the closest GPU of this size that cannot take a share, and by how much;
         * when every other one is out of reach (cordoned, lost, exclusive), the GPUs short */
        if (!r->quiet) {
            int32_t cg = -1;
            osub_check_t cck = OSUB_CHECK_NONE;
            int64_t csf = INT64_MAX;
            for (int32_t gi = 0; gi < e->n_gpus; gi++) {
                struct gpu *g = &e->gpus[gi];
                bool chosen = false;
                for (int32_t b = 0; b < nb && !chosen; b++)
                    chosen = best[b].gpu == gi;
                if (chosen || !gpu_takes(g, r, size))
                    continue;
                int64_t share = r->exclusive ? g->usable : share0;
                ws_init(e, &w, r, &gi, &share, 1);
                int64_t sf;
                osub_check_t ck = ws_eval(e, &w, &w.g[0], &sf);
                if (ck != OSUB_CHECK_NONE && sf < csf) {
                    cg = gi;
                    cck = ck;
                    csf = sf;
                }
            }
            if (cg >= 0) {
                note_failure(fail, cck, cg, csf);
                if (k > 1 && fail->check == cck && fail->check_gpu == cg &&
                    fail->shortfall == csf) {
                    fail->fit_gpus = nb;
                    fail->need_gpus = k;
                }
            } else {
                note_failure(fail, OSUB_CHECK_GPUS, -1, k - nb);
            }
        }
        return false;
    }
    return plan_set(e, r, best, k, usable, p);
}

/* The reference planner: every GPU of each size planned exactly, no pruning. Slow; the
 * randomized test checks that the pruned search above picks exactly what this picks. */
static bool plan_size_reference(osub_engine_t *e, const struct req *r, int64_t size, struct plan *p)
{
    int32_t k = r->k;
    struct cand best[OSUB_SERVICE_GPUS_MAX];
    int32_t nb = 0;
    struct ws w;
    struct plan tmp;
    int64_t share0 = osub__share(r->total, k, 0), usable = 0;
    for (int32_t gi = 0; gi < e->n_gpus; gi++) {
        struct gpu *g = &e->gpus[gi];
        if (!gpu_takes(g, r, size))
            continue;
        usable = g->usable;
        int64_t share = r->exclusive ? g->usable : share0;
        ws_init(e, &w, r, &gi, &share, 1);
        struct cand c = {.gpu = gi, .victims = false, .top_level = INT32_MAX};
        if (w.n_fail > 0) {
            if (!plan_victims(e, &w, &tmp))
                continue;
            c.victims = true;
            c.top_level = tmp.top_level;
            c.n_evict = tmp.n_evict;
            c.n_degrade = tmp.n_degrade;
            c.restart_sum = tmp.restart_sum;
        }
        c.score = placement_score(e, g, r, charge_of(r, share));
        cand_pack(&c);
        keep_best(best, &nb, k, &c);
    }
    if (nb < k)
        return false;
    return plan_set(e, r, best, k, usable, p);
}

/* The largest share a request puts on one GPU, which its GPUs' usable VRAM must hold: a size
 * whose usable is smaller never takes it, exclusive or not (an exclusive request's grant is the
 * GPU's whole usable, which would then be below its request), and for a start at its floor, a
 * size that could never hold its full request once restored does not either. */
static int64_t fit_share(const struct req *r)
{
    int64_t s0 = osub__share(r->total, r->k, 0);
    return r->fit_share > s0 ? r->fit_share : s0;
}

static void plan_reference(osub_engine_t *e, const struct req *r, struct plan *out)
{
    memset(out, 0, sizeof(*out));
    struct plan cur;
    for (int32_t j = 0; j < e->n_sizes; j++) {
        if (r->size_mib > 0 && e->size_vram[j] != r->size_mib)
            continue;
        if (fit_share(r) > e->size_usable[j])
            continue;
        if (!plan_size_reference(e, r, e->size_vram[j], &cur))
            continue;
        if (!out->ok || key_cmp(&cur, out) < 0)
            *out = cur;
    }
}

static bool plans_equal(const struct plan *a, const struct plan *b)
{
    if (a->ok != b->ok)
        return false;
    if (!a->ok)
        return true;
    if (a->k != b->k || a->n_victims != b->n_victims)
        return false;
    for (int32_t i = 0; i < a->k; i++)
        if (a->gpus[i] != b->gpus[i])
            return false;
    for (int32_t i = 0; i < a->n_victims; i++)
        if (a->victims[i] != b->victims[i] || a->acts[i] != b->acts[i])
            return false;
    return true;
}

int osub__plan_admission(osub_engine_t *e, const struct req *r, struct plan *out)
{
    int rc = plan_admission_fast(e, r, out);
    if (e->verify_plans) {
        struct plan ref;
        plan_reference(e, r, &ref);
        if (!plans_equal(out, &ref)) {
            e->verify_mismatches++;
            /* is it stale state? touch everything and plan again */
            for (int32_t i = 0; i < e->n_gpus; i++)
                osub__gpu_touch(e, &e->gpus[i]);
            struct plan again;
            plan_admission_fast(e, r, &again);
            fprintf(stderr, "verify: after a full refresh the pruned planner %s\n",
                    plans_equal(&again, &ref) ? "agrees (stale aggregates)" : "still differs");
            if (ref.ok) {
                int32_t gi = ref.gpus[0];
                struct gpu *g = &e->gpus[gi];
                struct room_tree *t = &e->trees[g->tree_size];
                struct cand c = {.gpu = gi};
                int64_t share = r->exclusive ? g->usable : osub__share(r->total, r->k, 0);
                bool o = optimistic(e, g, gi, r, share, &c);
                struct cand c2 = {.gpu = gi};
                bool ps = plan_single(e, g, r, share, &c2);
                fprintf(stderr, "verify: gpu %d share %lld free_l %lld free_h %lld caps", gi,
                        (long long)share, (long long)(g->logical - g->granted),
                        (long long)(g->usable - g->held));
                for (int32_t L = 0; L <= e->max_level; L++)
                    fprintf(stderr, " %lld", (long long)t->t[L][t->leaves + g->tree_pos]);
                fprintf(stderr,
                        "; optimistic %d (T %d ev %d dg %d); single %d (T %d ev %d dg %d); "
                        "ref T %d ev %d dg %d; excl %d compute %d backed %d k %d\n",
                        o, c.top_level, c.n_evict, c.n_degrade, ps, c2.top_level, c2.n_evict,
                        c2.n_degrade, ref.top_level, ref.n_evict, ref.n_degrade, r->exclusive,
                        r->compute, r->backed, r->k);
            }
            snprintf(e->verify_last, sizeof(e->verify_last),
                     "plan for level %d, %lld MiB on %d GPU(s): pruned ok=%d gpu %d victims %d; "
                     "reference ok=%d gpu %d victims %d",
                     r->level, (long long)r->total, r->k, out->ok, out->ok ? out->gpus[0] : -1,
                     out->n_victims, ref.ok, ref.ok ? ref.gpus[0] : -1, ref.n_victims);
        }
    }
    return rc;
}

static int plan_admission_fast(osub_engine_t *e, const struct req *r, struct plan *out)
{
    memset(out, 0, sizeof(*out));
    out->check = OSUB_CHECK_NONE;
    out->check_gpu = -1;
    bool found = false, too_small = false;
    struct plan cur;
    for (int32_t j = 0; j < e->n_sizes; j++) {
        int64_t size = e->size_vram[j];
        if (r->size_mib > 0 && size != r->size_mib)
            continue;
        if (fit_share(r) > e->size_usable[j]) {
            too_small = true;
            continue;
        }
        if (!plan_size(e, r, size, &cur, out))
            continue;
        if (!found || key_cmp(&cur, out) < 0) {
            osub_check_t c = out->check;
            int32_t cg = out->check_gpu, fit = out->fit_gpus, need = out->need_gpus;
            int64_t sf = out->shortfall;
            *out = cur;
            out->check = c;
            out->check_gpu = cg;
            out->shortfall = sf;
            out->fit_gpus = fit;
            out->need_gpus = need;
            found = true;
        }
    }
    if (!found && too_small && out->check == OSUB_CHECK_NONE)
        note_failure(out, OSUB_CHECK_GPUS, -1, r->k); /* no GPU it may go to is large enough */
    out->ok = found;
    return 0;
}

int osub__plan_pressure(osub_engine_t *e, int32_t gpu, struct plan *out)
{
    memset(out, 0, sizeof(*out));
    struct gpu *g = &e->gpus[gpu];
    struct req r = {.level = -1, .pressure = true, .k = 1};
    struct ws w;
    int64_t zero = 0;
    ws_init(e, &w, &r, &gpu, &zero, 1);
    /* relief already promised: unacknowledged degrades and evictions in progress */
    int64_t relief = 0;
    for (int32_t i = 0; i < g->nsvc; i++) {
        const struct svc *s = g->svcs[i];
        for (int32_t t = 0; t < s->n_slots; t++) {
            const struct slot *sl = &s->slots[t];
            if (sl->gpu != gpu)
                continue;
            if (s->state == OSUB_STATE_DRAINING || s->state == OSUB_STATE_OVERDUE)
                relief += sl->held;
            else if (s->ack_pending) {
                int64_t after = sl->used < sl->grant ? sl->used : sl->grant;
                if (s->loading)
                    after = sl->used > sl->grant ? sl->used : sl->grant;
                relief += sl->held - after;
            } else if (s->loading && !s->backed && sl->held > sl->used) {
                relief += sl->held - sl->used; /* a reservation, not memory at risk */
            }
        }
    }
    w.held_target = g->usable * e->cfg.low_watermark_pct / 100;
    w.relief = relief;
    w.n_fail = 0;
    w.g[0].pass = true;
    ws_update(e, &w, 0);
    out->k = 1;
    out->gpus[0] = gpu;
    out->ok = plan_victims(e, &w, out);
    if (out->ok && out->n_evict == 0)
        return 0;
    /* degrade first: when degrades alone bring held under the high watermark, nobody is
     * evicted (the low watermark is only the aim when evictions are needed anyway) */
    struct plan hw;
    memset(&hw, 0, sizeof(hw));
    ws_init(e, &w, &r, &gpu, &zero, 1);
    w.held_target = g->usable * e->cfg.high_watermark_pct / 100;
    w.relief = relief;
    w.n_fail = 0;
    w.g[0].pass = true;
    ws_update(e, &w, 0);
    hw.k = 1;
    hw.gpus[0] = gpu;
    hw.ok = plan_victims(e, &w, &hw);
    if (hw.ok && hw.n_evict == 0)
        *out = hw;
    return 0;
}

/* ---- room trees ---------------------------------------------------------------------- */

int osub__trees_init(osub_engine_t *e)
{
    e->trees = calloc(OSUB_GPU_SIZES_MAX, sizeof(*e->trees));
    if (e->trees == NULL)
        return OSUB_ENOMEM;
    for (int32_t i = 0; i < e->n_gpus; i++) {
        struct gpu *g = &e->gpus[i];
        int32_t j = 0;
        while (j < e->n_trees && e->trees[j].vram != g->vram)
            j++;
        if (j == OSUB_GPU_SIZES_MAX) {
            g->tree_size = -1;
            continue;
        }
        if (j == e->n_trees) {
            e->trees[e->n_trees].usable = g->usable;
            e->trees[e->n_trees++].vram = g->vram;
        }
        g->tree_size = j;
        g->tree_pos = e->trees[j].n++;
    }
    for (int32_t j = 0; j < e->n_trees; j++) {
        struct room_tree *t = &e->trees[j];
        t->gpus = malloc((size_t)t->n * sizeof(int32_t));
        if (t->gpus == NULL)
            return OSUB_ENOMEM;
        for (int32_t i = 0; i < e->n_gpus; i++)
            if (e->gpus[i].tree_size == j)
                t->gpus[e->gpus[i].tree_pos] = i;
        t->leaves = 1;
        while (t->leaves < t->n)
            t->leaves *= 2;
        t->root = -1;
        t->left = malloc((size_t)t->n * sizeof(int32_t));
        t->right = malloc((size_t)t->n * sizeof(int32_t));
        t->prio = malloc((size_t)t->n * sizeof(uint32_t));
        t->pfree = calloc((size_t)t->n, sizeof(int64_t));
        t->in = calloc((size_t)t->n, sizeof(bool));
        if (t->left == NULL || t->right == NULL || t->prio == NULL || t->pfree == NULL ||
            t->in == NULL)
            return OSUB_ENOMEM;
        for (int32_t x = 0; x < t->n; x++) {
            uint32_t h = (uint32_t)x * 2654435761u;
            t->prio[x] = h ^ (h >> 15);
        }
        for (int32_t L = 0; L <= e->max_level; L++) {
            int64_t **arrs[6] = {&t->t[L], &t->d[L], &t->bt[L], &t->bd[L], &t->pt[L], &t->pd[L]};
            for (int a = 0; a < 6; a++) {
                *arrs[a] = malloc(2 * (size_t)t->leaves * sizeof(int64_t));
                if (*arrs[a] == NULL)
                    return OSUB_ENOMEM;
                for (int32_t x = 0; x < 2 * t->leaves; x++)
                    (*arrs[a])[x] = INT64_MIN / 4;
            }
        }
        for (int32_t L = 0; L <= e->max_level + 1; L++) {
            int64_t **a = L <= e->max_level ? &t->ft[L] : &t->fd;
            *a = malloc(2 * (size_t)t->leaves * sizeof(int64_t));
            if (*a == NULL)
                return OSUB_ENOMEM;
            for (int32_t x = 0; x < 2 * t->leaves; x++)
                (*a)[x] = INT64_MIN / 4;
        }
    }
    return 0;
}

void osub__trees_free(osub_engine_t *e)
{
    if (e->trees == NULL)
        return;
    for (int32_t j = 0; j < e->n_trees; j++) {
        free(e->trees[j].gpus);
        free(e->trees[j].left);
        free(e->trees[j].right);
        free(e->trees[j].prio);
        free(e->trees[j].pfree);
        free(e->trees[j].in);
        for (int32_t L = 0; L <= OSUB_MAX_LEVEL; L++) {
            free(e->trees[j].t[L]);
            free(e->trees[j].d[L]);
            free(e->trees[j].bt[L]);
            free(e->trees[j].bd[L]);
            free(e->trees[j].pt[L]);
            free(e->trees[j].pd[L]);
            free(e->trees[j].ft[L]);
        }
        free(e->trees[j].fd);
    }
    free(e->trees);
    e->trees = NULL;
}

/* Sets the leaf of GPU position pos in tree tr and the maxima above it. */
static void tree_set(const struct room_tree *t, int64_t *tr, int32_t pos, int64_t v)
{
    int32_t x = t->leaves + pos;
    tr[x] = v;
    for (x /= 2; x >= 1; x /= 2) {
        int64_t m = tr[2 * x] > tr[2 * x + 1] ? tr[2 * x] : tr[2 * x + 1];
        if (tr[x] == m && x != 1)
            break; /* nothing above changes */
        tr[x] = m;
    }
}

static void trees_refresh(osub_engine_t *e)
{
    if (e->now / 60000 != e->trees_minute) {
        /* the history rolled: every GPU's projected free room may have moved */
        e->trees_minute = e->now / 60000;
        for (int32_t i = 0; i < e->n_gpus; i++)
            osub__gpu_touch(e, &e->gpus[i]);
    }
    if (e->now >= e->trees_valid_until) {
        /* a protection ended somewhere: those GPUs can give more now */
        e->trees_valid_until = INT64_MAX;
        for (int32_t i = 0; i < e->n_gpus; i++) {
            struct gpu *g = &e->gpus[i];
            if (e->now >= g->agg_valid_until)
                osub__gpu_touch(e, g);
            else if (g->agg_valid_until < e->trees_valid_until)
                e->trees_valid_until = g->agg_valid_until;
        }
    }
    for (int32_t d = 0; d < e->n_tdirty; d++) {
        int32_t gi = e->tdirty[d];
        struct gpu *g = &e->gpus[gi];
        g->tree_dirty = false;
        if (g->tree_size < 0)
            continue;
        struct room_tree *t = &e->trees[g->tree_size];
        bool out = g->lost || g->cordoned || g->excl != NULL;
        /* the best-fit index */
        int64_t pf = place_limit(e, g) - projected_base(e, g);
        if (t->in[g->tree_pos] && (out || t->pfree[g->tree_pos] != pf))
            treap_erase(t, g->tree_pos);
        if (!out && !t->in[g->tree_pos])
            treap_insert(t, g->tree_pos, pf);
        if (!out) {
            gpu_agg(e, g, gi);
            if (g->agg_valid_until < e->trees_valid_until)
                e->trees_valid_until = g->agg_valid_until;
        }
        int64_t rh = 0, rg = 0, dh = 0, dg = 0, rf = 0;
        int64_t cap[6][OSUB_MAX_LEVEL + 1], fcap[OSUB_MAX_LEVEL + 1];
        int64_t ffree = (g->n_preempt == 0 ? g->usable : place_limit(e, g)) - gpu_floors(e, g);
        int64_t bfree = g->usable - g->backed;
        int64_t wfree = g->hw_lim - g->held;
        for (int32_t L = e->max_level; L >= 0; L--) {
            int64_t fl = g->logical - g->granted, fh = g->usable - g->held;
            int64_t c_all = fl + rg < fh + rh ? fl + rg : fh + rh;
            int64_t c_deg = fl + dg < fh + dh ? fl + dg : fh + dh;
            int64_t p_all = fl + rg < wfree + rh ? fl + rg : wfree + rh;
            int64_t p_deg = fl + dg < wfree + dh ? fl + dg : wfree + dh;
            cap[0][L] = c_all;
            cap[1][L] = c_deg;
            cap[2][L] = c_all < bfree ? c_all : bfree;
            cap[3][L] = c_deg < bfree ? c_deg : bfree;
            cap[4][L] = p_all;
            cap[5][L] = p_deg;
            fcap[L] = out ? INT64_MIN / 4 : ffree + rf;
            for (int v = 0; v < 6 && out; v++)
                cap[v][L] = INT64_MIN / 4;
            rh += g->a->ev_held[L];
            rg += g->a->ev_grant[L];
            dh += g->a->dg_held[L];
            dg += g->a->dg_grant[L];
            rf += g->a->ev_floor[L];
        }
        for (int32_t L = 0; L <= e->max_level; L++) {
            int64_t *arrs[6] = {t->t[L], t->d[L], t->bt[L], t->bd[L], t->pt[L], t->pd[L]};
            for (int which = 0; which < 6; which++)
                tree_set(t, arrs[which], g->tree_pos, cap[which][L]);
            tree_set(t, t->ft[L], g->tree_pos, fcap[L]);
        }
        tree_set(t, t->fd, g->tree_pos, out ? INT64_MIN / 4 : ffree);
    }
    e->n_tdirty = 0;
}

bool osub__may_fit(osub_engine_t *e, const struct req *r, int64_t share)
{
    if (r->exclusive || r->level > e->max_level || r->level < 0)
        return true;
    trees_refresh(e);
    for (int32_t j = 0; j < e->n_trees; j++) {
        if (r->size_mib > 0 && e->trees[j].vram != r->size_mib)
            continue;
        if (e->trees[j].t[r->level][1] >= share)
            return true;
    }
    return false;
}

int osub__resize_check(const osub_engine_t *e, const struct svc *s, int64_t nv, int64_t nm,
                       int64_t *charges)
{
    /* the request a submit of the new size would make; a degraded service's grant is its
     * floor, planned as a start at its floor is (admit.c, osub__plan_for) */
    bool degraded = s->state == OSUB_STATE_DEGRADED;
    struct req r;
    memset(&r, 0, sizeof(r));
    r.held_limit_pct = e->cfg.high_watermark_pct;
    r.level = s->level;
    r.backed = s->backed;
    r.k = s->k;
    r.self = s;
    r.total = nv;
    r.charge = s->backed ? nv : osub__pred_peak(&s->pred, nv, e->now, e->cfg.prediction_trust_ms);
    r.floor = s->backed ? nv : s->preemptible && nm < nv ? nm : 0;
    if (degraded) {
        r.total = nm;
        r.charge = osub__min64(r.charge, nm);
        r.floor = osub__min64(r.floor, nm);
    }
    for (int32_t i = 0; i < s->n_slots; i++) {
        const struct slot *sl = &s->slots[i];
        const struct gpu *g = &e->gpus[sl->gpu];
        if (nv > s->full_total && osub__share(nv, s->k, i) > g->usable)
            return OSUB_ETOO_BIG; /* the GPU could never hold it, degraded or restored */
        int64_t ng = osub__share(r.total, s->k, i);
        int64_t ch = charge_of(&r, ng);
        int64_t of = slot_floor(s, i), nf = req_floor(&r, ng);
        charges[i] = ch;
        if (ng <= sl->grant && nf <= of)
            continue; /* nothing grows here */
        if (g->granted - sl->grant + ng > g->logical)
            return OSUB_ENO_ROOM;
        if (s->backed && g->backed - sl->grant + ng > g->usable)
            return OSUB_ENO_ROOM;
        if (g->held - sl->held + ch > held_limit(g, &r, ch))
            return OSUB_ENO_ROOM;
        if (gpu_floors(e, g) - of + nf > held_limit(g, &r, ng))
            return OSUB_ENO_ROOM;
    }
    return 0;
}

int64_t osub__loading_reserve(const osub_engine_t *e, int32_t gpu)
{
    const struct gpu *g = &e->gpus[gpu];
    int64_t r = 0;
    for (int32_t i = 0; i < g->nsvc; i++) {
        const struct svc *s = g->svcs[i];
        if (!s->loading || s->backed || s->ack_pending || s->state == OSUB_STATE_DRAINING ||
            s->state == OSUB_STATE_OVERDUE)
            continue;
        for (int32_t t = 0; t < s->n_slots; t++)
            if (s->slots[t].gpu == gpu && s->slots[t].held > s->slots[t].used)
                r += s->slots[t].held - s->slots[t].used;
    }
    return r;
}
