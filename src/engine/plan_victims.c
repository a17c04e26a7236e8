/* plan_victims.c - exact plans on a set of GPUs: the workspace of checks, victims chosen and
 * given back, the set's plan, pressure plans, and why nothing fits */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* ---- workspace ------------------------------------------------------------------------- */

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
    sf = g->held - x->dh + x->charge - osub__req_held_limit(g, r, x->charge);
    if (sf > 0) {
        *shortfall = sf;
        return OSUB_CHECK_HELD;
    }
    sf = x->floors - x->df + osub__req_floor(r, x->share) - osub__req_held_limit(g, r, x->share);
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

void osub__ws_init(const osub_engine_t *e, struct ws *w, const struct req *r, const int32_t *gpus,
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
        x->charge = osub__req_charge(r, shares[j]);
        x->floors = osub__gpu_floors(e, &e->gpus[gpus[j]]);
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
        x->dg += osub__slot_grant_after(v, sl, a0) - osub__slot_grant_after(v, sl, a1);
        x->dh += osub__slot_held_after(e, v, sl, a0) - osub__slot_held_after(e, v, sl, a1);
        /* an eviction or a suspend frees the victim's floor there; a degrade does not */
        x->df += (a1 == ACT_EVICT || a1 == ACT_SUSPEND ? osub__slot_floor(v, i) : 0) -
                 (a0 == ACT_EVICT || a0 == ACT_SUSPEND ? osub__slot_floor(v, i) : 0);
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

/* Whether v may be suspended now with `host` MiB already counted by the plan; *need is what its
 * suspend would add. */
static bool can_suspend(const osub_engine_t *e, const struct svc *v, bool pressure, int64_t host,
                        int64_t *need)
{
    if (!osub__suspendable_now(e, v, pressure))
        return false;
    *need = osub__host_need(v);
    return e->host_used + host + *need <= e->cfg.suspend_host_mib;
}

/* Moves V[t] to act a1 (from A[t]) and says whether the checks pass. */
static bool ws_move(const osub_engine_t *e, struct ws *w, struct svc *const *V, uint8_t *A,
                    int32_t t, int a1)
{
    ws_apply(e, w, V[t], A[t], a1);
    A[t] = (uint8_t)a1;
    return w->n_fail == 0;
}

/* The walk: level by level, lowest priority first (under pressure every level at once), the
 * degrades, then the suspends, then the evictions, each replacing the one before. */
static bool victims_walk(osub_engine_t *e, struct ws *w, struct svc **V, uint8_t *A, int32_t nv,
                         int64_t *host)
{
    const struct req *r = w->r;
    bool ok = false;
    int32_t i = 0;
    while (i < nv && !ok) {
        int32_t lvl = V[i]->level, end = i;
        bool susp = false;
        for (; end < nv && (r->pressure || V[end]->level == lvl); end++)
            susp |= V[end]->suspendable; /* pressure: every level's degrades first */
        for (int32_t t = i; t < end && !ok; t++)
            if (osub__degradable_now(V[t]))
                ok = ws_move(e, w, V, A, t, ACT_DEGRADE);
        for (int32_t t = i; t < end && !ok && susp; t++) {
            int64_t need;
            if (can_suspend(e, V[t], r->pressure, *host, &need)) {
                *host += need;
                ok = ws_move(e, w, V, A, t, ACT_SUSPEND);
            }
        }
        for (int32_t t = i; t < end && !ok; t++) {
            if (osub__evictable(e, V[t], r->pressure)) {
                if (A[t] == ACT_SUSPEND)
                    *host -= osub__host_need(V[t]);
                ok = ws_move(e, w, V, A, t, ACT_EVICT);
            }
        }
        i = end;
    }
    return ok;
}

/* Gives back every victim that is not needed, highest priority and oldest first: an eviction
 * becomes a degrade or a suspend where that suffices, a suspend a degrade, anything nothing. */
static void victims_give_back(osub_engine_t *e, struct ws *w, struct svc **V, uint8_t *A,
                              int32_t nv, int64_t *host)
{
    for (int32_t t = nv - 1; t >= 0; t--) {
        int a = A[t];
        if (a == ACT_NONE)
            continue;
        if (a == ACT_SUSPEND)
            *host -= osub__host_need(V[t]);
        if (ws_move(e, w, V, A, t, ACT_NONE))
            continue;
        if (a != ACT_DEGRADE && osub__degradable_now(V[t]) && ws_move(e, w, V, A, t, ACT_DEGRADE))
            continue;
        int64_t need;
        if (a == ACT_EVICT && can_suspend(e, V[t], w->r->pressure, *host, &need)) {
            if (ws_move(e, w, V, A, t, ACT_SUSPEND)) {
                *host += need;
                continue;
            }
        }
        ws_move(e, w, V, A, t, a);
        if (a == ACT_SUSPEND)
            *host += osub__host_need(V[t]);
    }
}

/* Plans victims on the workspace's GPUs. Returns true when the checks pass afterwards. */
bool osub__plan_victims(osub_engine_t *e, struct ws *w, struct plan *p)
{
    const struct req *r = w->r;
    p->n_victims = 0;
    p->top_level = INT32_MAX;
    p->n_evict = p->n_suspend = p->n_degrade = 0;
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

    int64_t host = 0; /* host memory this plan's suspends count */
    bool ok = victims_walk(e, w, V, A, nv, &host);
    if (!ok && !r->pressure) {
        p->n_victims = 0;
        return false;
    }
    victims_give_back(e, w, V, A, nv, &host);
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
        } else if (A[t] == ACT_SUSPEND) {
            p->n_suspend++;
            p->restart_sum += V[t]->resume_cost_ms;
        } else {
            p->n_degrade++;
        }
    }
    p->n_victims = n;
    return ok || n > 0;
}

/* ---- the chosen set, and why nothing fits --------------------------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void osub__note_failure(struct plan *out, osub_check_t c, int32_t gpu, int64_t sf)
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

/* Plans the chosen k GPUs as one set (DESIGN.md: victims shared between them count once; the
 * odd MiB goes to the first GPU of the set) and fills p. The set's score is its worst GPU's. */
bool osub__plan_set(osub_engine_t *e, const struct req *r, const struct cand *best, int32_t k,
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
    osub__ws_init(e, &w, r, gpus, shares, k);
    if (!osub__plan_victims(e, &w, p))
        return false;
    p->ok = true;
    p->k = k;
    memcpy(p->gpus, gpus, sizeof(gpus[0]) * (size_t)k);
    memcpy(p->shares, shares, sizeof(shares[0]) * (size_t)k);
    for (int32_t j = 0; j < k; j++)
        p->charges[j] = osub__req_charge(r, shares[j]);
    p->score = worst;
    return true;
}

/* What note_closest() measures every GPU of a size against: the share, its charge and floor,
 * and (lims) the held limits of the charge and of the share, which for a request that is not
 * backed are the same on every GPU of one size (usable and the high watermark are). */
struct closest_req {
    int64_t share, charge, floor;
    bool lims, exclusive, backed;
    int64_t lim_charge, lim_share;
};

/* The first check a share fails on g with no victim planned, and its shortfall: ws_eval() on a
 * fresh workspace of g alone (g's floors are read only when the checks before theirs pass). The
 * request's figures come by value, so that the loop over a size's GPUs keeps them at hand. */
static inline osub_check_t closest_eval(const osub_engine_t *e, const struct gpu *g,
                                        const struct req *r, struct closest_req q,
                                        int64_t *shortfall)
{
    int64_t sf;
    if (q.exclusive) {
        *shortfall = sf = g->nsvc;
        return sf > 0 ? OSUB_CHECK_EXCLUSIVE : OSUB_CHECK_NONE;
    }
    *shortfall = 0;
    if ((sf = g->granted + q.share - g->logical) > 0) {
        *shortfall = sf;
        return OSUB_CHECK_LOGICAL;
    }
    if (q.backed && (sf = g->backed + q.share - g->usable) > 0) {
        *shortfall = sf;
        return OSUB_CHECK_BACKED;
    }
    if ((sf = g->held + q.charge - (q.lims ? q.lim_charge : osub__req_held_limit(g, r, q.charge))) >
        0) {
        *shortfall = sf;
        return OSUB_CHECK_HELD;
    }
    if ((sf = osub__gpu_floors(e, g) + q.floor -
              (q.lims ? q.lim_share : osub__req_held_limit(g, r, q.share))) > 0) {
        *shortfall = sf;
        return OSUB_CHECK_FLOORS;
    }
    if (r->compute > 0) {
        int64_t lim = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
        if ((sf = g->compute_all + r->compute - lim) > 0 ||
            (q.backed && (sf = g->compute_backed + r->compute - 100) > 0)) {
            *shortfall = sf;
            return OSUB_CHECK_COMPUTE;
        }
    }
    return OSUB_CHECK_NONE;
}

/* The closest GPU found so far: its position in the group, check and shortfall. */
struct closest {
    int32_t x;
    osub_check_t ck;
    int64_t sf;
};

static bool closest_chosen(const struct cand *best, int32_t nb, int32_t gi)
{
    for (int32_t b = 0; b < nb; b++)
        if (best[b].gpu == gi)
            return true;
    return false;
}

/* The group's GPUs one at a time (those not filed in the best-fit index alone when out_only),
 * each through closest_eval(): the smallest shortfall wins, the first of equals, the GPUs
 * chosen in best aside. */
static void closest_scan(osub_engine_t *e, const struct req *r, const struct room_tree *grp,
                         struct closest_req q, const struct cand *best, int32_t nb, bool out_only,
                         struct closest *c)
{
    const struct svc *self = r->self;
    for (int32_t x = 0; x < grp->n; x++) {
        if (out_only && grp->in[x])
            continue;
        const struct gpu *g = &e->gpus[grp->gpus[x]];
        /* osub__gpu_takes() without the size: every GPU of the group has it */
        if (g->lost || g->cordoned || (g->excl != NULL && (self == NULL || g->excl != self)))
            continue;
        int64_t sf;
        osub_check_t ck = closest_eval(e, g, r, q, &sf);
        if (ck == OSUB_CHECK_NONE || sf > c->sf || (sf == c->sf && x > c->x))
            continue;
        if (closest_chosen(best, nb, grp->gpus[x]))
            continue;
        *c = (struct closest){.x = x, .ck = ck, .sf = sf};
    }
}

__extension__ typedef int32_t closest_v4 __attribute__((vector_size(16)));

static inline closest_v4 v4_load(const int32_t *p)
{
    closest_v4 v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* a where m is set, else b (m's lanes are -1 or 0) */
static inline closest_v4 v4_sel(closest_v4 m, closest_v4 a, closest_v4 b)
{
    return b ^ ((a ^ b) & m);
}

static inline closest_v4 v4_set(int64_t v)
{
    return (closest_v4){(int32_t)v, (int32_t)v, (int32_t)v, (int32_t)v};
}

/* The thresholds of closest_rows(), four lanes each: the share, usable - share (backed), and
 * the held and floor limits less the charge and the floor, where something preemptible is
 * placed (p) and where nothing is (n). */
struct closest_th {
    closest_v4 share, bthr, tp, tn, up, un;
};

/* The rows closest_rows() reads, held in registers (the store to sf could alias the group). */
struct closest_rows {
    const int32_t *logical, *held, *floors, *backed, *nopre;
    int32_t *sf;
};

/* The shortfall of the four GPUs at x (INT32_MAX where every check passes): the first check
 * that fails, in closest_eval()'s order. Without `backed` the backed check is skipped and the
 * limits are the same everywhere. */
static inline closest_v4 closest_v4_sf(struct closest_rows w, const struct closest_th *t, int32_t x,
                                       bool backed)
{
    const closest_v4 zero = v4_set(0);
    closest_v4 fl, held;
    if (backed) {
        closest_v4 nopre = v4_load(w.nopre + x);
        fl = v4_load(w.floors + x) - v4_sel(nopre, t->un, t->up);
        held = v4_load(w.held + x) - v4_sel(nopre, t->tn, t->tp);
    } else {
        fl = v4_load(w.floors + x) - t->up;
        held = v4_load(w.held + x) - t->tp;
    }
    closest_v4 sf = v4_sel(fl > zero, fl, v4_set(INT32_MAX));
    sf = v4_sel(held > zero, held, sf);
    if (backed) {
        closest_v4 bk = v4_load(w.backed + x) - t->bthr;
        sf = v4_sel(bk > zero, bk, sf);
    }
    closest_v4 lg = t->share - v4_load(w.logical + x);
    return v4_sel(lg > zero, lg, sf);
}

/* Every GPU's shortfall into grp->sf; returns the smallest. */
static inline int32_t closest_v4_all(struct room_tree *grp, struct closest_th t, bool backed)
{
    const struct closest_rows w = {grp->r_logical, grp->r_held,  grp->r_floors,
                                   grp->r_backed,  grp->r_nopre, grp->sf};
    closest_v4 m = v4_set(INT32_MAX);
    int32_t n4 = (grp->n + 3) & ~3;
    for (int32_t x = 0; x < n4; x += 4) {
        closest_v4 sf = closest_v4_sf(w, &t, x, backed);
        m = v4_sel(sf < m, sf, m);
        memcpy(w.sf + x, &sf, sizeof(sf));
    }
    int32_t least = m[0];
    for (int i = 1; i < 4; i++)
        least = m[i] < least ? m[i] : least;
    return least;
}

/* Where the rows hold every figure closest_eval() reads (a request that is not exclusive and
 * claims no compute, whose thresholds are within +-2^29 so that the clamped rows compare
 * exactly): the shortfall of every GPU filed in the best-fit index (the rows of the others
 * pass every check), four at a time with no branch, the chosen ones left out; then the first
 * GPU with the smallest. Returns false when the rows cannot say (a smallest shortfall of 2^29
 * or more: the clamps may hide the exact order); c->x < 0 when no GPU filed there fails a
 * check. */
static bool closest_rows(osub_engine_t *e, const struct req *r, struct room_tree *grp,
                         struct closest_req q, const struct cand *best, int32_t nb,
                         struct closest *c)
{
    const int64_t R = INT64_C(1) << 29;
    const struct gpu *g0 = &e->gpus[grp->gpus[0]];
    int64_t lp_c = osub__held_limit(g0, r->held_limit_pct, false, q.charge);
    int64_t lp_s = osub__held_limit(g0, r->held_limit_pct, false, q.share);
    /* where nothing preemptible is placed a backed request's limit is usable */
    int64_t ln_c = r->backed ? grp->usable : lp_c, ln_s = r->backed ? grp->usable : lp_s;
    int64_t th[6] = {q.share,         r->backed ? grp->usable - q.share : 0,
                     lp_c - q.charge, ln_c - q.charge,
                     lp_s - q.floor,  ln_s - q.floor};
    for (int i = 0; i < 6; i++)
        if (th[i] > R || th[i] < -R)
            return false;
    struct closest_th t = {v4_set(th[0]), v4_set(th[1]), v4_set(th[2]),
                           v4_set(th[3]), v4_set(th[4]), v4_set(th[5])};
    /* the chosen GPUs' rows pass every check while the rows are read */
    int32_t saved[OSUB_SERVICE_GPUS_MAX][4];
    for (int32_t b = 0; b < nb; b++) {
        int32_t pos = e->gpus[best[b].gpu].tree_pos;
        saved[b][0] = grp->r_logical[pos];
        saved[b][1] = grp->r_held[pos];
        saved[b][2] = grp->r_floors[pos];
        saved[b][3] = grp->r_backed[pos];
        grp->r_logical[pos] = OSUB__ROW_PASS;
        grp->r_held[pos] = grp->r_floors[pos] = grp->r_backed[pos] = -OSUB__ROW_PASS;
    }
    int32_t least = r->backed ? closest_v4_all(grp, t, true) : closest_v4_all(grp, t, false);
    for (int32_t b = nb - 1; b >= 0; b--) {
        int32_t pos = e->gpus[best[b].gpu].tree_pos;
        grp->r_logical[pos] = saved[b][0];
        grp->r_held[pos] = saved[b][1];
        grp->r_floors[pos] = saved[b][2];
        grp->r_backed[pos] = saved[b][3];
    }
    c->x = -1;
    if (least == INT32_MAX)
        return true;
    if (least >= R)
        return false;
    /* the first GPU with it: four at a time, then the one */
    const closest_v4 lv = v4_set(least);
    int32_t x = 0;
    for (;; x += 4) {
        closest_v4 eq = v4_load(grp->sf + x) == lv;
        uint64_t w[2];
        memcpy(w, &eq, sizeof(w));
        if ((w[0] | w[1]) != 0)
            break;
    }
    while (grp->sf[x] != least)
        x++;
    /* the exact check and shortfall, from the GPU itself (the same figures) */
    c->x = x;
    c->ck = closest_eval(e, &e->gpus[grp->gpus[x]], r, q, &c->sf);
    return true;
}

void osub__note_closest(osub_engine_t *e, const struct req *r, int64_t size, int64_t share0,
                        const struct cand *best, int32_t nb, int32_t k, struct plan *fail)
{
    /* the size's GPUs, ascending (plan_size() found its group): the first of equals wins */
    struct room_tree *grp = NULL;
    for (int32_t j = 0; j < e->n_trees && grp == NULL; j++)
        if (e->trees[j].vram == size)
            grp = &e->trees[j];
    int32_t n = grp ? grp->n : 0;
    struct closest_req q = {.share = share0,
                            .charge = osub__req_charge(r, share0),
                            .floor = osub__req_floor(r, share0),
                            .lims = n > 0 && !r->backed && !r->exclusive,
                            .exclusive = r->exclusive,
                            .backed = r->backed};
    if (q.lims) {
        const struct gpu *g0 = &e->gpus[grp->gpus[0]];
        q.lim_charge = osub__req_held_limit(g0, r, q.charge);
        q.lim_share = osub__req_held_limit(g0, r, q.share);
    }
    struct closest c = {.x = -1, .ck = OSUB_CHECK_NONE, .sf = INT64_MAX};
    if (n > 0) {
        /* the GPUs filed in the best-fit index from its rows (refreshed by plan_size()), the
         * others one at a time; every GPU one at a time when the rows cannot say */
        if (!r->exclusive && r->compute == 0 && closest_rows(e, r, grp, q, best, nb, &c)) {
            if (grp->n_in < n)
                closest_scan(e, r, grp, q, best, nb, true, &c);
        } else {
            c = (struct closest){.x = -1, .ck = OSUB_CHECK_NONE, .sf = INT64_MAX};
            closest_scan(e, r, grp, q, best, nb, false, &c);
        }
    }
    if (c.x >= 0) {
        int32_t cg = grp->gpus[c.x];
        osub__note_failure(fail, c.ck, cg, c.sf);
        if (k > 1 && fail->check == c.ck && fail->check_gpu == cg && fail->shortfall == c.sf) {
            fail->fit_gpus = nb;
            fail->need_gpus = k;
        }
    } else {
        osub__note_failure(fail, OSUB_CHECK_GPUS, -1, k - nb);
    }
}

/* ---- pressure ------------------------------------------------------------------------- */

int osub__plan_pressure(osub_engine_t *e, int32_t gpu, struct plan *out)
{
    memset(out, 0, sizeof(*out));
    struct gpu *g = &e->gpus[gpu];
    struct req r = {.level = -1, .pressure = true, .k = 1};
    struct ws w;
    int64_t zero = 0;
    osub__ws_init(e, &w, &r, &gpu, &zero, 1);
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
            else if (s->state == OSUB_STATE_SUSPENDING)
                relief += sl->held - osub__min64(sl->held, osub__residual_share(s, t));
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
    out->ok = osub__plan_victims(e, &w, out);
    if (out->ok && out->n_evict == 0)
        return 0;
    /* degrade first: when degrades alone bring held under the high watermark, nobody is
     * evicted (the low watermark is only the aim when evictions are needed anyway) */
    struct plan hw;
    memset(&hw, 0, sizeof(hw));
    osub__ws_init(e, &w, &r, &gpu, &zero, 1);
    w.held_target = g->usable * e->cfg.high_watermark_pct / 100;
    w.relief = relief;
    w.n_fail = 0;
    w.g[0].pass = true;
    ws_update(e, &w, 0);
    hw.k = 1;
    hw.gpus[0] = gpu;
    hw.ok = osub__plan_victims(e, &w, &hw);
    if (hw.ok && hw.n_evict == 0)
        *out = hw;
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
