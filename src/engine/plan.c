/* plan.c - admission planning: the checks' shares and floors, placement history and score, the
 * pruned search for the best GPUs of each size (checked against a reference), resize checks */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

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
    /* a suspended or resuming service may still be evicted (never degraded or suspended) */
    return s->preemptible && s->n_slots > 0 &&
           (s->state == OSUB_STATE_LOADING || s->state == OSUB_STATE_RUNNING ||
            s->state == OSUB_STATE_DEGRADED || s->state == OSUB_STATE_SUSPENDED ||
            s->state == OSUB_STATE_RESUMING);
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
    if (act == ACT_SUSPEND) /* what it is expected to keep there: its residual */
        return osub__min64(sl->held, osub__residual_share(s, (int32_t)(sl - s->slots)));
    return sl->held;
}

/* ---- floor room ------------------------------------------------------------------------ */

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
                sum += osub__slot_floor(o, i);
    }
    return sum;
}

void osub__gpu_floors_refresh(const osub_engine_t *e, const struct gpu *g)
{
    struct gpu *m = (struct gpu *)g; /* the cache only */
    m->floors_cache = gpu_floors_now(e, g);
    m->floors_dirty = false;
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
    return osub__gpu_floors(e, g) + osub__req_floor(r, share) <= osub__req_held_limit(g, r, share);
}

/* ---- placement history ------------------------------------------------------------------ */

void osub__hist_advance(osub_engine_t *e, struct gpu *g)
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
    osub__hist_advance(e, g);
    for (int32_t i = 0; i < e->hist_n; i++)
        g->hist[i] = g->held;
    g->hist_peak = g->held;
    osub__gpu_touch(e, g);
}

int64_t osub__gpu_peak(osub_engine_t *e, struct gpu *g)
{
    osub__hist_advance(e, g);
    return g->hist_peak > g->held ? g->hist_peak : g->held;
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

void osub__gpu_cache(const osub_engine_t *e, struct gpu *g)
{
    int64_t minute = e->now / 60000;
    if (!g->cache_dirty && g->cache_minute == minute)
        return;
    g->rise_cache = gpu_rise_now(e, g);
    g->cache_minute = minute;
    g->cache_dirty = false;
}

/* A backed request holds exactly its grant for ever: it is packed tightest under usable,
 * as reservations are (the best-fit index is keyed under the high watermark; usable minus
 * that is the same for every GPU of a size, so the order is the same). */
static int64_t req_limit(const osub_engine_t *e, const struct gpu *g, const struct req *r)
{
    return r->backed && !r->exclusive ? g->usable : osub__place_limit(e, g);
}

static int64_t placement_score(osub_engine_t *e, struct gpu *g, const struct req *r, int64_t charge)
{
    int64_t projected = osub__projected_base(e, g) + charge, lim = req_limit(e, g, r);
    if (projected <= lim)
        return lim - projected;                    /* tightest fit first */
    return (INT64_C(1) << 50) + (projected - lim); /* least overshoot first */
}

/* placement_score() read from the best-fit index: a GPU filed there is filed under its
 * place_limit - projected_base (osub__trees_refresh(), which plan_size() ran: nothing has
 * moved since), so the score needs no projected peak of its own. */
static int64_t indexed_score(osub_engine_t *e, const struct room_tree *t, struct gpu *g,
                             const struct req *r, int64_t charge)
{
    if (!t->in[g->tree_pos])
        return placement_score(e, g, r, charge);
    /* req_limit() - projected: usable - hw_lim more for a backed request */
    int64_t room = t->pfree[g->tree_pos] + (r->backed && !r->exclusive ? g->usable - g->hw_lim : 0);
    if (charge <= room)
        return room - charge;
    return (INT64_C(1) << 50) + (charge - room);
}

/* ---- candidates and their keys ---------------------------------------------------------- */

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
    if (a->n_suspend != b->n_suspend)
        return a->n_suspend < b->n_suspend ? -1 : 1;
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

_Static_assert(OSUB_POOL_GPUS_MAX <= 4096, "a GPU index fits the low 12 bits of klo");

/* Packs DESIGN.md's key into two integers: (victims, top level inverted, evictions, suspends,
 * degrades, restart cost) and (placement score, GPU index). Lower is better. */
static inline void cand_pack(struct cand *c)
{
    uint64_t hi = 0;
    if (c->victims) {
        uint64_t lvl = (uint64_t)(OSUB_MAX_LEVEL -
                                  (c->top_level > OSUB_MAX_LEVEL ? OSUB_MAX_LEVEL : c->top_level));
        uint64_t ev = (uint64_t)(c->n_evict > 127 ? 127 : c->n_evict);
        uint64_t sp = (uint64_t)(c->n_suspend > 127 ? 127 : c->n_suspend);
        uint64_t dg = (uint64_t)(c->n_degrade > 127 ? 127 : c->n_degrade);
        uint64_t rs = (uint64_t)c->restart_sum;
        if (rs > (UINT64_C(1) << 37) - 1)
            rs = (UINT64_C(1) << 37) - 1; /* 4 years of restarts */
        hi = (UINT64_C(1) << 62) | (lvl << 58) | (ev << 51) | (sp << 44) | (dg << 37) | rs;
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

static inline bool cand_less(const struct cand *a, const struct cand *b)
{
    return a->khi < b->khi || (a->khi == b->khi && a->klo < b->klo);
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

/* ---- victims as aggregates: the optimistic key and the exact plan on one GPU ------------- */

/* Turns per-level aggregates into totals over the levels >= L, and notes the levels that have
 * something of their own (optimistic() skips the others, as a walk over the levels did). */
static void agg_suffixes(struct gpu_aggs *a, int32_t max_level)
{
    a->lvl_mask = 0;
    for (int32_t L = max_level; L >= 0; L--) {
        if (a->lv[L].ev_held != 0 || a->lv[L].ev_grant != 0 || a->lv[L].ev_cnt != 0 ||
            a->lv[L].ev_floor != 0)
            a->lvl_mask |= 1u << L;
        if (L == OSUB_MAX_LEVEL)
            continue; /* (above max_level every entry is zero, or INT64_MAX for restarts) */
        a->lv[L].ev_held += a->lv[L + 1].ev_held;
        a->lv[L].ev_grant += a->lv[L + 1].ev_grant;
        a->lv[L].ev_comp += a->lv[L + 1].ev_comp;
        a->lv[L].ev_cnt += a->lv[L + 1].ev_cnt;
        a->lv[L].ev_floor += a->lv[L + 1].ev_floor;
        a->lv[L].dg_held += a->lv[L + 1].dg_held;
        a->lv[L].dg_grant += a->lv[L + 1].dg_grant;
        top3_merge(a->lv[L].dg_top_held, a->lv[L + 1].dg_top_held);
        top3_merge(a->lv[L].dg_top_grant, a->lv[L + 1].dg_top_grant);
        top3_merge(a->lv[L].ex_top_held, a->lv[L + 1].ex_top_held);
        top3_merge(a->lv[L].ex_top_grant, a->lv[L + 1].ex_top_grant);
        top3_merge(a->lv[L].ex_top_floor, a->lv[L + 1].ex_top_floor);
        a->lv[L].ev_min_restart = osub__min64(a->lv[L].ev_min_restart, a->lv[L + 1].ev_min_restart);
    }
}

void osub__gpu_agg_refresh(const osub_engine_t *e, struct gpu *g, int32_t gi)
{
    struct gpu_aggs *a = g->a;
    g->agg_valid_until = INT64_MAX;
    /* the levels in use and the one above them (agg_suffixes() reads it); the others were
     * never written */
    int32_t top = e->max_level < OSUB_MAX_LEVEL ? e->max_level + 1 : OSUB_MAX_LEVEL;
    memset(a->lv, 0, (size_t)(top + 1) * sizeof(a->lv[0]));
    a->sp_mask = 0;
    a->lvl_mask = 0;
    bool susp_on = e->cfg.suspend_host_mib > 0;
    for (int32_t L = 0; L <= top; L++)
        a->lv[L].ev_min_restart = INT64_MAX;
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
            bool can_evict = osub__evictable(e, v, false);
            if (!can_evict && v->resume_ms + e->cfg.min_runtime_ms < g->agg_valid_until)
                g->agg_valid_until = v->resume_ms + e->cfg.min_runtime_ms;
            struct vinfo *vi = &g->vic[g->nvic++];
            vi->s = v;
            vi->level = L;
            vi->degradable = osub__degradable_now(v);
            vi->evictable = can_evict;
            /* what the slot keeps once degraded (its grant and held then), worked out once */
            int64_t gd = vi->degradable ? osub__slot_grant_after(v, sl, ACT_DEGRADE) : 0;
            int64_t hd = vi->degradable ? osub__slot_held_after(e, v, sl, ACT_DEGRADE) : 0;
            vi->comp = v->spec.compute_pct;
            vi->rg_e = sl->grant;
            vi->rh_e = sl->held;
            vi->rf_e = v->state == OSUB_STATE_DRAINING || v->state == OSUB_STATE_OVERDUE
                           ? 0
                           : osub__slot_floor(v, t);
            vi->rg_d = vi->degradable ? sl->grant - gd : 0;
            vi->rh_d = vi->degradable ? sl->held - hd : 0;
            vi->restart_ms = v->restart_cost_ms;
            vi->suspendable = susp_on && osub__susp_state_ok(v);
            vi->rh_s =
                vi->suspendable ? sl->held - osub__slot_held_after(e, v, sl, ACT_SUSPEND) : 0;
            vi->resume_ms = v->resume_cost_ms;
            if (vi->suspendable)
                a->sp_mask |= 1u << L;
            /* ev_*: the most each victim can give: all of it if it may be evicted, else
             * what a degrade or a suspend frees (protected work may still be degraded or
             * suspended) */
            if (can_evict) {
                a->lv[L].ev_held += sl->held;
                a->lv[L].ev_grant += sl->grant;
                a->lv[L].ev_comp += v->spec.compute_pct;
                a->lv[L].ev_cnt++;
                a->lv[L].ev_floor += vi->rf_e;
                top3_add(a->lv[L].ex_top_floor, vi->rf_e);
                if (v->restart_cost_ms < a->lv[L].ev_min_restart)
                    a->lv[L].ev_min_restart = v->restart_cost_ms;
                /* what an eviction frees beyond a degrade of the same victim */
                int64_t xh = vi->degradable ? hd : sl->held, xg = vi->degradable ? gd : sl->grant;
                top3_add(a->lv[L].ex_top_held, xh);
                top3_add(a->lv[L].ex_top_grant, xg);
            } else if (vi->suspendable) {
                a->lv[L].ev_held += osub__max64(vi->rh_s, vi->rh_d);
                a->lv[L].ev_grant += vi->rg_d;
                a->lv[L].ev_floor += vi->rf_e;
            } else if (vi->degradable) {
                a->lv[L].ev_held += vi->rh_d;
                a->lv[L].ev_grant += vi->rg_d;
            }
            if (vi->degradable) {
                a->lv[L].dg_held += vi->rh_d;
                a->lv[L].dg_grant += vi->rg_d;
                top3_add(a->lv[L].dg_top_held, vi->rh_d);
                top3_add(a->lv[L].dg_top_grant, vi->rg_d);
            }
        }
    }
    agg_suffixes(a, e->max_level);
    g->agg_dirty = false;
}

/* What optimistic() may take as read on every GPU of one size (plan_size()): a share that is not
 * exclusive, its charge and floor, and its held limits where something preemptible is placed,
 * which are the same on every GPU of a size (usable and the high watermark are); a backed
 * request's limit is usable on a GPU where nothing preemptible is (osub__held_limit()). */
struct opt_share {
    int64_t share, charge, floor;
    int64_t lim_charge, lim_share;
};

/* An optimistic key for a GPU that needs victims, from its aggregates: no real plan can beat
 * it. Returns false when no plan on this GPU can work at all. os: the share's figures read
 * once for its size, or NULL (worked out here). */
static bool optimistic(const osub_engine_t *e, struct gpu *g, int32_t gi, const struct req *r,
                       int64_t share, const struct opt_share *os, struct cand *c)
{
    osub__gpu_agg(e, g, gi);
    int64_t ch, lim_c, lim_s, fl;
    if (os != NULL) {
        bool whole = r->backed && g->n_preempt == 0;
        ch = os->charge;
        fl = os->floor;
        lim_c = whole ? g->usable : os->lim_charge;
        lim_s = whole ? g->usable : os->lim_share;
    } else {
        ch = osub__req_charge(r, share);
        fl = r->exclusive ? 0 : osub__req_floor(r, share);
        lim_c = osub__req_held_limit(g, r, ch);
        lim_s = r->exclusive ? 0 : osub__req_held_limit(g, r, share);
    }
    int64_t dl = g->granted + share - g->logical;
    int64_t dh = g->held + ch - lim_c;
    int64_t dc = 0;
    if (r->backed && g->backed + share > g->usable)
        return false;
    if (r->compute > 0) {
        int64_t lim = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
        dc = g->compute_all + r->compute - lim;
        if (r->backed && g->compute_backed + r->compute > 100)
            return false;
    }
    int64_t df = r->exclusive ? 0 : osub__gpu_floors(e, g) + fl - lim_s;
    const struct gpu_aggs *a = g->a;
    for (int32_t L = e->max_level; L > r->level; L--) {
        if (!((a->lvl_mask >> L) & 1u))
            continue; /* (a protected victim's suspend may free floor room alone) */
        int64_t eh = a->lv[L].ev_held, eg = a->lv[L].ev_grant, ec = a->lv[L].ev_comp,
                ef = a->lv[L].ev_floor;
        int64_t cnt = a->lv[L].ev_cnt;
        bool ok = r->exclusive ? cnt >= g->nsvc : (eg >= dl && eh >= dh && ec >= dc && ef >= df);
        if (!ok)
            continue;
        int64_t dgh = a->lv[L].dg_held, dgg = a->lv[L].dg_grant;
        const int64_t *xh = a->lv[L].ex_top_held, *xg = a->lv[L].ex_top_grant;
        int64_t rmin = a->lv[L].ev_min_restart;
        c->victims = true;
        c->top_level = L;
        /* lower bounds: no eviction only if degrading everything would do; one degrade only
         * if some single victim frees enough of both */
        bool deg_ok = !r->exclusive && dgg >= dl && dgh >= dh && dc <= 0 && df <= 0;
        int32_t nev = 0, nsp = 0;
        if (!deg_ok && (a->sp_mask >> L) != 0 && !r->exclusive) {
            /* suspends may free held and floor room, never grants or compute: only those
             * need evictions; with none needed, at least one suspend */
            nev = needed32(dl - dgg, xg);
            if (dc > 0 && nev < 1)
                nev = 1;
            nsp = nev == 0 ? 1 : 0;
        } else if (!deg_ok) {
            /* the evictions free beyond their degrades at most what the largest extras do */
            nev = 1;
            if (!r->exclusive) {
                nev = osub__max32(nev, needed32(dh - dgh, xh));
                nev = osub__max32(nev, needed32(dl - dgg, xg));
                nev = osub__max32(nev, needed32(df, a->lv[L].ex_top_floor));
            } else {
                nev = (int32_t)g->nsvc;
            }
        }
        c->n_evict = nev;
        c->n_suspend = nsp;
        c->n_degrade = deg_ok ? osub__max32(1, osub__max32(needed32(dh, a->lv[L].dg_top_held),
                                                           needed32(dl, a->lv[L].dg_top_grant)))
                              : 0;
        /* a plan touching no level above L evicts at least nev of the victims there, each
         * costing at least the cheapest restart among them */
        c->restart_sum = nev > 0 && rmin != INT64_MAX ? nev * rmin : 0;
        return true;
    }
    return false;
}

/* The best-first heap of victims_phase(): the candidates' keys (and scores), by value. */
struct opt_heap {
    struct opt_ent *h; /* e->opt_buf */
    int32_t nh;
};

static inline bool ent_less(const struct opt_ent *a, const struct opt_ent *b)
{
    return a->khi < b->khi || (a->khi == b->khi && a->klo < b->klo);
}

/* Fills the hole at i (of a heap whose subtrees below i are heaps) with x: the hole goes down to
 * a leaf by the smaller child, then x comes up to where it belongs, but not above i (one compare
 * a level on the way down instead of two). The keys are unique (the GPU is in klo), so the
 * order of pops does not depend on how the heap is laid out. */
static void heap_sift(struct opt_heap *q, int32_t i, struct opt_ent x)
{
    struct opt_ent *h = q->h;
    int32_t n = q->nh, top = i;
    for (int32_t l = 2 * i + 1; l < n; l = 2 * i + 1) {
        int32_t m = l + 1 < n && ent_less(&h[l + 1], &h[l]) ? l + 1 : l;
        h[i] = h[m];
        i = m;
    }
    while (i > top) {
        int32_t p = (i - 1) / 2;
        if (!ent_less(&x, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

/* plan_single()'s running sums: what the victims chosen so far free of each check's shortfall
 * (logical, held, compute, floors; evictions for an exclusive request), and the host memory
 * their suspends count. */
struct sgl {
    int64_t rg, rh, rc, nev, rf, host;
    int64_t dl0, dh0, dc0, df0;
    bool excl;
    int32_t nsvc;
};

static inline bool sgl_pass(const struct sgl *x)
{
    return x->excl ? (x->nsvc - x->nev == 0)
                   : (x->rg >= x->dl0 && x->rh >= x->dh0 && x->rc >= x->dc0 && x->rf >= x->df0);
}

/* Adds (sign 1) or takes back (sign -1) what victim v frees by act. */
static inline void sgl_add(struct sgl *x, const struct vinfo *v, int act, int64_t sign)
{
    if (act == ACT_DEGRADE) {
        x->rg += sign * v->rg_d;
        x->rh += sign * v->rh_d;
    } else if (act == ACT_SUSPEND) {
        x->rh += sign * v->rh_s;
        x->rf += sign * v->rf_e;
    } else if (act == ACT_EVICT) {
        x->rg += sign * v->rg_e;
        x->rh += sign * v->rh_e;
        x->rc += sign * v->comp;
        x->rf += sign * v->rf_e;
        x->nev += sign;
    }
}

/* Moves victim v from act a0 to a1 and says whether the checks pass. */
static inline bool sgl_move(struct sgl *x, const struct vinfo *v, int a0, int a1)
{
    sgl_add(x, v, a0, -1);
    sgl_add(x, v, a1, 1);
    return sgl_pass(x);
}

/* Whether victim v may be suspended now with `host` MiB already counted by the plan. */
static inline bool sgl_can_suspend(const osub_engine_t *e, const struct vinfo *v,
                                   const struct req *r, int64_t host, int64_t *need)
{
    if (!v->suspendable || !osub__suspendable_now(e, v->s, r->pressure))
        return false;
    *need = osub__host_need(v->s);
    return e->host_used + host + *need <= e->cfg.suspend_host_mib;
}

/* The walk of plan_single(): level by level, degrades, then suspends, then evictions. */
static bool sgl_walk(const osub_engine_t *e, const struct req *r, const struct vinfo *V, int32_t n,
                     uint32_t sp_mask, uint8_t *A, struct sgl *x)
{
    bool ok = false;
    for (int32_t i = 0; i < n && !ok;) {
        int32_t lvl = V[i].level, end = i;
        while (end < n && V[end].level == lvl)
            end++;
        bool susp = (sp_mask >> lvl) & 1u;
        for (int32_t t = i; t < end && !ok; t++) {
            if (V[t].degradable) { /* the level's first action: nothing to take back */
                x->rg += V[t].rg_d;
                x->rh += V[t].rh_d;
                A[t] = ACT_DEGRADE;
                ok = sgl_pass(x);
            }
        }
        for (int32_t t = i; t < end && !ok && susp; t++) {
            int64_t need;
            if (sgl_can_suspend(e, &V[t], r, x->host, &need)) {
                ok = sgl_move(x, &V[t], A[t], ACT_SUSPEND);
                A[t] = ACT_SUSPEND;
                x->host += need;
            }
        }
        for (int32_t t = i; t < end && !ok; t++) {
            if (r->pressure || V[t].evictable) { /* osub__evictable(), cached */
                if (A[t] == ACT_SUSPEND)
                    x->host -= osub__host_need(V[t].s);
                ok = sgl_move(x, &V[t], A[t], ACT_EVICT);
                A[t] = ACT_EVICT;
            }
        }
        i = end;
    }
    return ok;
}

/* The give-back of plan_single(), highest priority and oldest first: an eviction becomes a
 * degrade or a suspend where that suffices, a suspend a degrade, anything nothing. */
static void sgl_give_back(const osub_engine_t *e, const struct req *r, const struct vinfo *V,
                          int32_t n, uint8_t *A, struct sgl *x)
{
    for (int32_t t = n - 1; t >= 0; t--) {
        int a = A[t];
        if (a == ACT_NONE)
            continue;
        if (a == ACT_SUSPEND)
            x->host -= osub__host_need(V[t].s);
        if (sgl_move(x, &V[t], a, ACT_NONE)) {
            A[t] = ACT_NONE;
            continue;
        }
        int cur = ACT_NONE;
        if (a != ACT_DEGRADE && V[t].degradable) {
            cur = ACT_DEGRADE;
            if (sgl_move(x, &V[t], ACT_NONE, ACT_DEGRADE)) {
                A[t] = ACT_DEGRADE;
                continue;
            }
        }
        int64_t need;
        if (a == ACT_EVICT && sgl_can_suspend(e, &V[t], r, x->host, &need)) {
            bool pass = sgl_move(x, &V[t], cur, ACT_SUSPEND);
            cur = ACT_SUSPEND;
            if (pass) {
                A[t] = ACT_SUSPEND;
                x->host += need;
                continue;
            }
        }
        sgl_move(x, &V[t], cur, a);
        if (a == ACT_SUSPEND)
            x->host += osub__host_need(V[t].s);
    }
}

/* The exact victim plan of DESIGN.md step 4 on one GPU, on the GPU's cached victim list:
 * the same walk and give-back as osub__plan_victims(), in scalar arithmetic. Fills the key of c;
 * returns false when no plan works. (osub__plan_victims() stays the reference: the chosen set is
 * always planned again by it.) */
static bool plan_single(const osub_engine_t *e, const struct gpu *g, const struct req *r,
                        int64_t share, struct cand *c)
{
    int64_t climit = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
    int64_t ch = osub__req_charge(r, share);
    struct sgl x = {.excl = r->exclusive, .nsvc = g->nsvc};
    x.dl0 = g->granted + share - g->logical;
    x.dh0 = g->held + ch - osub__req_held_limit(g, r, ch);
    x.df0 = r->exclusive ? INT64_MIN / 4
                         : osub__gpu_floors(e, g) + osub__req_floor(r, share) -
                               osub__req_held_limit(g, r, share);
    x.dc0 = r->compute > 0 ? g->compute_all + r->compute - climit : 0;
    if (r->backed &&
        (g->backed + share > g->usable || (r->compute > 0 && g->compute_backed + r->compute > 100)))
        return false;
    int32_t n = 0;
    while (n < g->nvic && n < OSUB_PLAN_MAX_VICTIMS && g->vic[n].level > r->level)
        n++;
    uint8_t A[OSUB_PLAN_MAX_VICTIMS];
    memset(A, 0, (size_t)n);
    const struct vinfo *V = g->vic;
    if (sgl_pass(&x))
        return false; /* not a victim case: the caller handles fits */
    if (!sgl_walk(e, r, V, n, g->a->sp_mask, A, &x))
        return false;
    sgl_give_back(e, r, V, n, A, &x);
    c->victims = true;
    c->top_level = INT32_MAX;
    c->n_evict = c->n_suspend = c->n_degrade = 0;
    c->restart_sum = 0;
    for (int32_t t = 0; t < n; t++) {
        if (A[t] == ACT_NONE)
            continue;
        if (V[t].level < c->top_level)
            c->top_level = V[t].level;
        if (A[t] == ACT_EVICT) {
            c->n_evict++;
            c->restart_sum += V[t].restart_ms;
        } else if (A[t] == ACT_SUSPEND) {
            c->n_suspend++;
            c->restart_sum += V[t].resume_ms;
        } else {
            c->n_degrade++;
        }
    }
    return true;
}

/* ---- the search for one GPU size ---------------------------------------------------------- */

/* One size's search (plan_size()): the request with the charge and floor of its first share
 * computed once for every GPU looked at, the size's group, and the k best candidates so far. */
struct size_plan {
    struct req rq;
    int64_t size, usable;
    int32_t k;
    struct room_tree *grp;
    int64_t share0, share_min, charge0, charge_min;
    /* the floor room a GPU needs (none for exclusive requests, nor for a share above the high
     * watermark, whose limit is the share itself) */
    int64_t fneed;
    int64_t climit;
    bool shared;         /* not exclusive: os holds the share's figures */
    struct opt_share os; /* for optimistic() */
    uint64_t stamp;
    int32_t *cand; /* e->miss_buf */
    int32_t ncand;
    struct cand best[OSUB_SERVICE_GPUS_MAX];
    int32_t nb;
    /* the plan another size already has, as a candidate's key (plan_admission_fast(), one GPU
     * only): what cannot beat it cannot be chosen */
    bool has_bound;
    struct cand bound;
};

/* Whether c can no longer be chosen: it does not beat the k best so far, or the plan another
 * size has. */
static inline bool hopeless(const struct size_plan *sp, const struct cand *c)
{
    return (sp->nb == sp->k && !cand_less(c, &sp->best[sp->k - 1])) ||
           (sp->has_bound && !cand_less(c, &sp->bound));
}

/* Whether a share fits on g without victims, counted as ch by the held check (every check but
 * exclusivity). */
static bool fits_free(const osub_engine_t *e, const struct gpu *g, const struct req *r,
                      int64_t share, int64_t ch, int64_t climit)
{
    return g->granted + share <= g->logical && g->held + ch <= osub__req_held_limit(g, r, ch) &&
           floor_room(e, g, r, share) && (!r->backed || g->backed + share <= g->usable) &&
           (r->compute == 0 || (g->compute_all + r->compute <= climit &&
                                (!r->backed || g->compute_backed + r->compute <= 100)));
}

/* Sets sp up for r0 on GPUs of this size; false (with the failure noted) when the size has
 * fewer than k GPUs in service, or no group. */
static bool size_setup(osub_engine_t *e, const struct req *r0, int64_t size, struct size_plan *sp,
                       struct plan *fail)
{
    sp->rq = *r0;
    sp->rq.c_share = 0;
    int64_t s0 = osub__share(sp->rq.total, sp->rq.k, 0);
    sp->rq.c_charge = osub__req_charge(&sp->rq, s0);
    sp->rq.c_floor = osub__req_floor(&sp->rq, s0);
    sp->rq.c_share = s0;
    const struct req *r = &sp->rq;
    int32_t k = r->k;
    sp->size = size;
    sp->k = k;
    sp->nb = 0;
    sp->best[k - 1].victims = false;
    sp->best[k - 1].top_level = INT32_MAX;
    sp->share0 = osub__share(r->total, k, 0);
    sp->share_min = r->total / k;
    sp->charge0 = osub__req_charge(r, sp->share0);
    sp->charge_min = osub__req_charge(r, sp->share_min);
    sp->fneed = INT64_MIN / 4;
    sp->climit = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
    sp->grp = NULL;
    for (int32_t j = 0; j < e->n_trees && sp->grp == NULL; j++)
        if (e->trees[j].vram == size)
            sp->grp = &e->trees[j];
    if (sp->grp == NULL)
        return false;
    int32_t navail = 0;
    sp->usable = 0;
    for (int32_t j = 0; j < e->n_sizes; j++)
        if (e->size_vram[j] == size) {
            navail = e->size_count[j];
            sp->usable = e->size_usable[j];
        }
    if (navail < k) {
        osub__note_failure(fail, OSUB_CHECK_GPUS, -1, k - navail);
        return false;
    }
    if (!r->exclusive && sp->share_min <= sp->usable * e->cfg.high_watermark_pct / 100)
        sp->fneed = osub__req_floor(r, sp->share_min);
    sp->shared = !r->exclusive && sp->grp->n > 0;
    if (sp->shared) {
        /* the limits where something preemptible is placed: osub__held_limit() not backed */
        const struct gpu *g0 = &e->gpus[sp->grp->gpus[0]];
        sp->os.share = sp->share0;
        sp->os.charge = sp->charge0;
        sp->os.floor = osub__req_floor(r, sp->share0);
        sp->os.lim_charge = osub__held_limit(g0, r->held_limit_pct, false, sp->charge0);
        sp->os.lim_share = osub__held_limit(g0, r->held_limit_pct, false, sp->share0);
    }
    osub__trees_refresh(e);
    sp->cand = e->miss_buf;
    sp->ncand = 0;
    sp->stamp = ++e->plan_stamp;
    return true;
}

/* 1. without victims, the GPUs to rank. The tightest fit is the smallest projected free room
 * that still holds the share: walk the best-fit index up from there, stop at the k-th GPU that
 * passes every check. Only when none does (every fitting GPU would overshoot its past peaks)
 * are all the GPUs with room looked at. */
static void collect_fits(osub_engine_t *e, struct size_plan *sp)
{
    const struct req *r = &sp->rq;
    struct room_tree *grp = sp->grp;
    int32_t k = sp->k;
    bool scan = r->exclusive;
    if (!r->exclusive) {
        int32_t got = 0, walked = 0;
        int64_t slack = r->backed ? sp->usable - sp->usable * e->cfg.high_watermark_pct / 100 : 0;
        /* the walk is bounded: GPUs with held room but no floor room (or logical room) are
         * not in the index's order; past 4k of them the scan below, which the room trees
         * prune on every kind of room, finds the same best k */
        int32_t tsp;
        for (int32_t x = osub__treap_first(grp, sp->charge0 - slack, -1, &tsp);
             x >= 0 && got < k && walked < 4 * k + 16; x = osub__treap_next(grp, &tsp), walked++) {
            int32_t gi = grp->gpus[x];
            struct gpu *g = &e->gpus[gi];
            if (!osub__gpu_takes(g, r, sp->size))
                continue;
            if (!fits_free(e, g, r, sp->share0, sp->charge0, sp->climit))
                continue;
            sp->cand[sp->ncand++] = gi;
            got++;
        }
        if (got < k) {
            sp->ncand = 0;
            scan = true;
        }
    }
    if (scan && r->exclusive) {
        for (int32_t x = 0; x < grp->n; x++) {
            struct gpu *g = &e->gpus[grp->gpus[x]];
            if (!g->lost && !g->cordoned && g->nsvc == 0)
                sp->cand[sp->ncand++] = grp->gpus[x];
        }
    } else if (scan) {
        osub__tree_collect(grp, osub__tree_for(e, grp, r, e->max_level, false, sp->charge_min),
                           sp->charge_min, sp->fneed, sp->cand, &sp->ncand);
    }
}

/* Ranks the candidates collect_fits() found, keeping the k best that fit without victims. */
static void rank_fits(osub_engine_t *e, struct size_plan *sp)
{
    const struct req *r = &sp->rq;
    for (int32_t x = 0; x < sp->ncand; x++) {
        int32_t gi = sp->cand[x];
        struct gpu *g = &e->gpus[gi];
        if (!osub__gpu_takes(g, r, sp->size))
            continue;
        int64_t share = r->exclusive ? g->usable : sp->share0;
        int64_t ch = r->exclusive ? share : sp->charge0;
        bool fits = r->exclusive || fits_free(e, g, r, share, ch, sp->climit);
        if (!fits)
            continue; /* compute, or the first GPU's odd MiB: victims may still help */
        e->gpu_stamp[gi] = sp->stamp;
        struct cand c = {.gpu = gi, .victims = false, .top_level = INT32_MAX};
        c.score = placement_score(e, g, r, ch);
        cand_pack(&c);
        keep_best(sp->best, &sp->nb, sp->k, &c);
    }
}

/* One phase of level L (0: GPUs where degrades alone could do, 1: the rest): the GPUs whose
 * victims could make room, ranked by their optimistic keys in the heap opt, then planned for
 * real best-first until nothing left in it can beat the k best. */
static void victims_phase(osub_engine_t *e, struct size_plan *sp, int32_t L, int phase,
                          struct opt_heap *q)
{
    const struct req *r = &sp->rq;
    struct room_tree *grp = sp->grp;
    int32_t k = sp->k;
    struct cand *best = sp->best;
    sp->ncand = 0;
    if (r->exclusive) {
        for (int32_t x = 0; x < grp->n; x++)
            sp->cand[sp->ncand++] = grp->gpus[x];
    } else {
        osub__tree_collect(grp, osub__tree_for(e, grp, r, L - 1, phase == 0, sp->charge_min),
                           sp->charge_min, sp->fneed, sp->cand, &sp->ncand);
    }
    for (int32_t x = 0; x < sp->ncand; x++) {
        int32_t gi = sp->cand[x];
        if (x + 4 < sp->ncand) {
            /* the GPUs keyed are scattered over the pool: ask for a later one's hot lines and
             * its highest level's aggregates early (the loop is bound by their misses) */
            const struct gpu *pg = &e->gpus[sp->cand[x + 4]];
            __builtin_prefetch(pg);
            __builtin_prefetch((const char *)pg + 64);
            __builtin_prefetch(&pg->a->lv[e->max_level]);
        }
        if (e->gpu_stamp[gi] == sp->stamp)
            continue;
        struct gpu *g = &e->gpus[gi];
        if (!osub__gpu_takes(g, r, sp->size))
            continue;
        int64_t share = r->exclusive ? g->usable : sp->share0;
        struct cand c;
        c.gpu = gi;
        if (!optimistic(e, g, gi, r, share, sp->shared ? &sp->os : NULL, &c))
            continue;
        e->gpu_stamp[gi] = sp->stamp;
        c.score =
            indexed_score(e, grp, g, r, sp->shared ? sp->charge0 : osub__req_charge(r, share));
        cand_pack(&c);
        if (hopeless(sp, &c))
            continue; /* it cannot beat the k best: no plan of it can */
        q->h[q->nh++] = (struct opt_ent){.khi = c.khi, .klo = c.klo};
    }
    for (int32_t i = q->nh / 2 - 1; i >= 0; i--)
        heap_sift(q, i, q->h[i]); /* Floyd: O(n) */
    while (q->nh > 0) {
        struct opt_ent top = q->h[0];
        struct cand c = {.khi = top.khi, .klo = top.klo};
        if (hopeless(sp, &c)) {
            /* nothing in the heap can beat the k best, now or later (they only get better) */
            q->nh = 0;
            break;
        }
        c.gpu = (int32_t)(top.klo & 0xfff);
        c.score = (int64_t)(top.klo >> 12); /* cand_pack(): the score above the GPU */
        struct opt_ent last = q->h[--q->nh];
        if (q->nh > 0)
            heap_sift(q, 0, last);
        struct gpu *g = &e->gpus[c.gpu];
        int64_t share = r->exclusive ? g->usable : sp->share0;
        if (!plan_single(e, g, r, share, &c))
            continue;
        cand_pack(&c);
        keep_best(best, &sp->nb, k, &c);
    }
}

/* 2. with victims, the lowest priority levels first. */
/* What a candidate must beat to be chosen: the k-th best so far or the plan another size has,
 * whichever is better; NULL while neither is there. */
static const struct cand *to_beat(const struct size_plan *sp)
{
    const struct cand *b = sp->nb == sp->k ? &sp->best[sp->k - 1] : NULL;
    if (sp->has_bound && (b == NULL || cand_less(&sp->bound, b)))
        b = &sp->bound;
    return b;
}

static void plan_with_victims(osub_engine_t *e, struct size_plan *sp)
{
    const struct req *r = &sp->rq;
    struct opt_heap q = {.h = e->opt_buf};
    for (int32_t L = e->max_level; L > r->level; L--) {
        const struct cand *b = to_beat(sp);
        if (b != NULL && !b->victims)
            break; /* a plan without victims beats every plan with some */
        /* a GPU whose victims of levels >= L are enough: its top level is at best L */
        if (b != NULL && b->top_level > L)
            break; /* what is left touches level L or higher: it cannot beat the k best */
        /* phase 0: GPUs where degrades alone could do (no eviction); phase 1: the rest */
        for (int phase = r->exclusive ? 1 : 0; phase < 2; phase++) {
            b = to_beat(sp);
            if (phase == 1 && b != NULL && b->victims && b->top_level == L && b->n_evict == 0 &&
                b->n_suspend == 0)
                break; /* the rest needs an eviction or a suspend at level L, or touches more:
                          it cannot beat the k best */
            victims_phase(e, sp, L, phase, &q);
        }
    }
}

/* Plans the best placement for one GPU size. Returns true and fills *p when one exists.
 * Candidates come from the room trees: first the GPUs where it fits without victims (ranked
 * exactly), then, only if fewer than k of those, level by level from the lowest priority up,
 * the GPUs where victims of that level and below could make room, ranked by an optimistic
 * key and planned for real best-first until nothing left can beat the k best. */
static bool plan_size(osub_engine_t *e, const struct req *r0, int64_t size,
                      const struct cand *bound, struct plan *p, struct plan *fail)
{
    struct size_plan sp;
    if (!size_setup(e, r0, size, &sp, fail))
        return false;
    sp.has_bound = bound != NULL;
    if (bound != NULL)
        sp.bound = *bound;
    collect_fits(e, &sp);
    rank_fits(e, &sp);
    plan_with_victims(e, &sp);
    if (sp.nb < sp.k) {
        /* say why: the closest GPU of this size that cannot take a share, and by how much;
         * when every other one is out of reach (cordoned, lost, exclusive), the GPUs short */
        if (!sp.rq.quiet && !sp.has_bound) /* (with a plan found, no failure is told) */
            osub__note_closest(e, &sp.rq, size, sp.share0, sp.best, sp.nb, sp.k, fail);
        return false;
    }
    return osub__plan_set(e, &sp.rq, sp.best, sp.k, sp.usable, p);
}

/* ---- the reference planner, and admission -------------------------------------------- */

static int plan_admission_fast(osub_engine_t *e, const struct req *r, struct plan *out);

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
        if (!osub__gpu_takes(g, r, size))
            continue;
        usable = g->usable;
        int64_t share = r->exclusive ? g->usable : share0;
        osub__ws_init(e, &w, r, &gi, &share, 1);
        struct cand c = {.gpu = gi, .victims = false, .top_level = INT32_MAX};
        if (w.n_fail > 0) {
            if (!osub__plan_victims(e, &w, &tmp))
                continue;
            c.victims = true;
            c.top_level = tmp.top_level;
            c.n_evict = tmp.n_evict;
            c.n_suspend = tmp.n_suspend;
            c.n_degrade = tmp.n_degrade;
            c.restart_sum = tmp.restart_sum;
        }
        c.score = placement_score(e, g, r, osub__req_charge(r, share));
        cand_pack(&c);
        keep_best(best, &nb, k, &c);
    }
    if (nb < k)
        return false;
    return osub__plan_set(e, r, best, k, usable, p);
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
                bool o = optimistic(e, g, gi, r, share, NULL, &c);
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

/* Clears a plan but for its arrays (1.7 KiB of the 1.9), which are only ever read below k and
 * n_victims, and written there first (osub__plan_set()). */
static void plan_clear(struct plan *p)
{
    memset(p, 0, offsetof(struct plan, gpus));
    p->degraded_start = false;
    p->n_victims = 0;
    memset(&p->top_level, 0, sizeof(*p) - offsetof(struct plan, top_level));
}

/* The key of plan p (of one GPU) as a candidate's, for the search of the next size: a plan
 * there is chosen only if it beats p by key_cmp(), which for one GPU is the order of the
 * candidates' keys (cand_pack()) where none of p's counts is clamped there. False when p's
 * key cannot be put so. */
static bool plan_bound(const struct req *r, const struct plan *p, struct cand *c)
{
    if (r->k != 1 || p->k != 1 || p->score < 0 || p->score >= (INT64_C(1) << 50) * 2)
        return false;
    *c = (struct cand){.gpu = p->gpus[0], .victims = p->n_victims > 0, .score = p->score};
    if (c->victims) {
        if (p->top_level < 0 || p->top_level > OSUB_MAX_LEVEL || p->n_evict >= 127 ||
            p->n_suspend >= 127 || p->n_degrade >= 127 || p->restart_sum < 0 ||
            p->restart_sum >= (INT64_C(1) << 37) - 1)
            return false;
        c->top_level = p->top_level;
        c->n_evict = p->n_evict;
        c->n_suspend = p->n_suspend;
        c->n_degrade = p->n_degrade;
        c->restart_sum = p->restart_sum;
    } else {
        c->top_level = INT32_MAX;
    }
    cand_pack(c);
    return true;
}

static int plan_admission_fast(osub_engine_t *e, const struct req *r, struct plan *out)
{
    plan_clear(out);
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
        struct cand bound;
        if (!plan_size(e, r, size, found && plan_bound(r, out, &bound) ? &bound : NULL, &cur, out))
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
        osub__note_failure(out, OSUB_CHECK_GPUS, -1,
                           r->k); /* no GPU it may go to is large enough */
    out->ok = found;
    return 0;
}
