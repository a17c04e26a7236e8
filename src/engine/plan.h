/* plan.h - what the planner's files (plan.c, plan_victims.c, plan_trees.c) share; the engine's
 * own files only */
#ifndef OVERSUB_ENGINE_PLAN_H
#define OVERSUB_ENGINE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

/* ---- what the checks count of a request's share ----------------------------------------- */

/* The grant a slot will have once its service complies with `act`. */
static inline int64_t osub__slot_grant_after(const struct svc *s, const struct slot *sl, int act)
{
    if (act == ACT_EVICT)
        return 0;
    if (act == ACT_DEGRADE)
        return osub__floor_share(s, (int32_t)(sl - s->slots));
    return sl->grant; /* none, or a suspend: it keeps its logical grant */
}

/* What the held checks count for a share of the request: the share itself for backed and
 * exclusive requests, the same fraction of the predicted peak for oversold ones. */
static inline int64_t osub__req_charge(const struct req *r, int64_t share)
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
static inline int64_t osub__req_held_limit(const struct gpu *g, const struct req *r, int64_t share)
{
    return osub__held_limit(g, r->held_limit_pct, r->backed, share);
}

/* What a placed slot keeps under pressure: backed services their grant, degradable ones their
 * floor, the others nothing (pressure can only evict them). */
static inline int64_t osub__slot_floor(const struct svc *s, int32_t i)
{
    if (s->backed)
        return s->slots[i].grant;
    if (!s->degradable || s->state == OSUB_STATE_SUSPENDING || s->state == OSUB_STATE_SUSPENDED)
        return 0; /* a suspended service's residual is in held; pressure cannot shrink it */
    return osub__floor_share(s, i);
}

/* What a share of the request keeps under pressure. */
static inline int64_t osub__req_floor(const struct req *r, int64_t share)
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

/* Recomputes g's cached floors (what the services on g keep under pressure, those leaving
 * excluded); the cache only, so g may be const. */
OSUB__HIDDEN void osub__gpu_floors_refresh(const osub_engine_t *e, const struct gpu *g);

static inline int64_t osub__gpu_floors(const osub_engine_t *e, const struct gpu *g)
{
    /* floors do not move with time: recomputed only when the GPU was touched */
    if (__builtin_expect(g->floors_dirty, 0))
        osub__gpu_floors_refresh(e, g);
    return g->floors_cache;
}

/* ---- placement history and projected peaks ---------------------------------------------- */

/* Rolls g's held history forward to the current minute. */
OSUB__HIDDEN void osub__hist_advance(osub_engine_t *e, struct gpu *g);
/* Refreshes g's cached rise when the GPU changed or the minute did (the age term of the
 * predictions moves once a minute). */
OSUB__HIDDEN void osub__gpu_cache(const osub_engine_t *e, struct gpu *g);

static inline int64_t osub__gpu_rise(const osub_engine_t *e, struct gpu *g)
{
    if (__builtin_expect(g->cache_dirty || g->cache_minute != e->now / 60000, 0))
        osub__gpu_cache(e, g);
    return g->rise_cache;
}

/* The GPU's projected peak before a newcomer: its held peak over the history window, or what
 * it holds now plus the largest rise its oversold services are predicted to make. */
static inline int64_t osub__projected_base(osub_engine_t *e, struct gpu *g)
{
    if (__builtin_expect(e->now / 60000 > g->hist_minute, 0))
        osub__hist_advance(e, g);
    int64_t peak = g->hist_peak > g->held ? g->hist_peak : g->held;
    int64_t up = g->held + osub__gpu_rise(e, g);
    return up > peak ? up : peak;
}

/* Placement aims under the high watermark: the tightest fit among the GPUs where the
 * projected peak plus the newcomer stays under it; when none does, the GPU with the most
 * room (so that GPUs to spare lower the risk instead of sitting idle). */
static inline int64_t osub__place_limit(const osub_engine_t *e, const struct gpu *g)
{
    (void)e;
    return g->hw_lim;
}

/* ---- victims ------------------------------------------------------------------------- */

/* Whether v may be evicted now: always under pressure, else not while protected by its minimum
 * runtime after a resume. */
static inline bool osub__evictable(const osub_engine_t *e, const struct svc *v, bool pressure)
{
    if (pressure)
        return true;
    return !(v->resumed && e->now - v->resume_ms < e->cfg.min_runtime_ms);
}

static inline bool osub__degradable_now(const struct svc *v)
{
    return v->degradable && (v->state == OSUB_STATE_RUNNING || v->state == OSUB_STATE_LOADING);
}

/* Whether GPU g may take a share of r at all: of its size, in service, not another's whole. */
static inline bool osub__gpu_takes(const struct gpu *g, const struct req *r, int64_t size)
{
    if (g->lost || g->cordoned || g->vram != size)
        return false;
    if (g->excl != NULL && (r->self == NULL || g->excl != r->self))
        return false;
    return true;
}

/* Recomputes a GPU's victim aggregates (plan.c). */
OSUB__HIDDEN void osub__gpu_agg_refresh(const osub_engine_t *e, struct gpu *g, int32_t gi);

/* Recomputes a GPU's victim aggregates if anything on it changed since the last look, or a
 * victim's protection ended. */
static inline void osub__gpu_agg(const osub_engine_t *e, struct gpu *g, int32_t gi)
{
    if (__builtin_expect(g->agg_dirty || e->now >= g->agg_valid_until, 0))
        osub__gpu_agg_refresh(e, g, gi);
}

/* ---- lower bounds on victim counts (optimistic() in plan.c) ---------------------------- */

/* Keeps the three largest positive amounts added to t (t[0] >= t[1] >= t[2], 0 where fewer). */
static inline void top3_add(int64_t t[3], int64_t v)
{
    if (v <= t[2])
        return;
    if (v > t[0]) {
        t[2] = t[1];
        t[1] = t[0];
        t[0] = v;
    } else if (v > t[1]) {
        t[2] = t[1];
        t[1] = v;
    } else {
        t[2] = v;
    }
}

static inline void top3_merge(int64_t t[3], const int64_t u[3])
{
    for (int i = 0; i < 3 && u[i] > t[2]; i++)
        top3_add(t, u[i]);
}

/* The fewest victims whose amounts can cover need, when no victim gives more than t[0], no
 * other more than t[1], none of the rest more than t[2] (their three largest): 0 when nothing is
 * needed or nothing is known. Never more than a plan that covers need uses, so a valid lower
 * bound; never less than ceil(need / t[0]). */
static inline int64_t victims_needed(int64_t need, const int64_t t[3])
{
    if (need <= 0 || t[0] <= 0)
        return 0;
    if (t[0] >= need)
        return 1;
    if (t[1] <= 0 || t[0] + t[1] < need) {
        if (t[1] > 0 && t[2] > 0) {
            int64_t rest = need - t[0] - t[1] - t[2];
            return rest <= 0 ? 3 : 3 + (rest + t[2] - 1) / t[2];
        }
        return (need + t[0] - 1) / t[0]; /* no plan covers it: the old bound */
    }
    return 2;
}

/* victims_needed() as a count for a candidate's key (which keeps at most 127 anyway). */
static inline int32_t needed32(int64_t need, const int64_t t[3])
{
    int64_t n = victims_needed(need, t);
    return n > 1024 ? 1024 : (int32_t)n;
}

/* ---- the workspace: one GPU set's checks as victims are chosen (plan_victims.c) ---------- */

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

/* Sets w up for request r on the n GPUs gpus with the given shares, before any victim. */
OSUB__HIDDEN void osub__ws_init(const osub_engine_t *e, struct ws *w, const struct req *r,
                                const int32_t *gpus, const int64_t *shares, int32_t n);
/* Plans victims on the workspace's GPUs. Returns true when the checks pass afterwards. */
OSUB__HIDDEN bool osub__plan_victims(osub_engine_t *e, struct ws *w, struct plan *p);
/* Plans the chosen k GPUs of best as one set and fills p; false when no victims make it fit. */
OSUB__HIDDEN bool osub__plan_set(osub_engine_t *e, const struct req *r, const struct cand *best,
                                 int32_t k, int64_t usable, struct plan *p);
/* Keeps in out the failure with the smallest shortfall (then the lowest GPU). */
OSUB__HIDDEN void osub__note_failure(struct plan *out, osub_check_t c, int32_t gpu, int64_t sf);
/* Says in fail why no k GPUs of this size take r: the closest GPU not among the nb chosen in
 * best, and by how much; the GPUs short when no other one is in reach. */
OSUB__HIDDEN void osub__note_closest(osub_engine_t *e, const struct req *r, int64_t size,
                                     int64_t share0, const struct cand *best, int32_t nb, int32_t k,
                                     struct plan *fail);

/* ---- room trees and the best-fit index (plan_trees.c) ------------------------------------ */

/* Brings the room trees and the best-fit index up to date with the GPUs touched. */
OSUB__HIDDEN void osub__trees_refresh(osub_engine_t *e);
/* An in-order walk of t's best-fit index: the first node at or after (key, pos), then each
 * node's successor, -1 past the last. The walk's state is t->stk and *sp; nothing may change the
 * index while it runs. */
OSUB__HIDDEN int32_t osub__treap_first(struct room_tree *t, int64_t key, int32_t pos, int32_t *sp);
OSUB__HIDDEN int32_t osub__treap_next(struct room_tree *t, int32_t *sp);
/* A room tree chosen for a request (tr), the floor-room tree read with it (ftr) and their
 * per-GPU minimum (both; NULL where the tree has no twin). */
struct room_pick {
    const int64_t *tr, *ftr, *both;
};
/* The room tree that fits a request at level L: backed requests also need usable - backed,
 * preemptible ones must stay under the high watermark; with its floor room (fd for degrades
 * only, else ft[L]). */
OSUB__HIDDEN struct room_pick osub__tree_for(const osub_engine_t *e, const struct room_tree *t,
                                             const struct req *r, int32_t L, bool degrades_only,
                                             int64_t share);
/* Appends to out the GPUs of group t whose room in p.tr is at least share and whose floor room in
 * p.ftr at least fneed, in ascending order (a walk down the trees that skips every subtree
 * where no GPU has either, or both, of the two). */
OSUB__HIDDEN void osub__tree_collect(const struct room_tree *t, struct room_pick p, int64_t share,
                                     int64_t fneed, int32_t *out, int32_t *n);

#endif
