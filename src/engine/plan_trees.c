/* plan_trees.c - which GPUs may hold a request: the room trees per size group and level, and
 * the best-fit index (a treap of projected free room) */
#include <limits.h>
#include <stdlib.h>

#include "plan.h"

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
    t->n_in--;
}

static void treap_insert(struct room_tree *t, int32_t pos, int64_t key)
{
    t->pfree[pos] = key;
    t->left[pos] = t->right[pos] = -1;
    int32_t l, r;
    treap_split(t, t->root, key, pos, &l, &r);
    t->root = treap_merge(t, treap_merge(t, l, pos), r);
    t->in[pos] = true;
    t->n_in++;
}

int32_t osub__treap_first(struct room_tree *t, int64_t key, int32_t pos, int32_t *sp)
{
    /* the stack holds the nodes where the search went left: the first at or after the key is
     * the last of them */
    int32_t x = t->root;
    *sp = 0;
    while (x >= 0) {
        if (tkey_less(t, x, key, pos)) {
            x = t->right[x];
        } else {
            t->stk[(*sp)++] = x;
            x = t->left[x];
        }
    }
    return *sp > 0 ? t->stk[*sp - 1] : -1;
}

int32_t osub__treap_next(struct room_tree *t, int32_t *sp)
{
    if (*sp == 0)
        return -1;
    int32_t x = t->right[t->stk[--*sp]];
    for (; x >= 0; x = t->left[x])
        t->stk[(*sp)++] = x;
    return *sp > 0 ? t->stk[*sp - 1] : -1;
}

struct room_pick osub__tree_for(const osub_engine_t *e, const struct room_tree *t,
                                const struct req *r, int32_t L, bool degrades_only, int64_t share)
{
    int kind;
    if (r->backed && !r->exclusive)
        kind = 2; /* bt, bd */
    else if (r->held_limit_pct > 0 && r->held_limit_pct < 100 &&
             share <= t->usable * r->held_limit_pct / 100 &&
             r->held_limit_pct == e->cfg.high_watermark_pct)
        kind = 4; /* pt, pd */
    else
        kind = 0; /* t, d */
    const int64_t *const all[6] = {t->t[L], t->d[L], t->bt[L], t->bd[L], t->pt[L], t->pd[L]};
    if (degrades_only)
        kind++;
    return (struct room_pick){
        .tr = all[kind], .ftr = degrades_only ? t->fd : t->ft[L], .both = t->mt[kind][L]};
}

void osub__tree_collect(const struct room_tree *t, struct room_pick p, int64_t share, int64_t fneed,
                        int32_t *out, int32_t *n)
{
    const int64_t *tr = p.tr, *ftr = p.ftr, *both = p.both;
    /* the unused leaves past t->n hold INT64_MIN / 4: no real request asks that little, and
     * with these clamps none ever passes */
    share = share > INT64_MIN / 4 ? share : INT64_MIN / 4 + 1;
    fneed = fneed > INT64_MIN / 4 ? fneed : INT64_MIN / 4 + 1;
    /* a GPU that has both has at least the smaller of the two in both; without that tree,
     * tr's figures stand in and pass whatever they are */
    int64_t least = share < fneed ? share : fneed;
    if (both == NULL) {
        both = tr;
        least = INT64_MIN;
    }
    if (tr[1] < share || ftr[1] < fneed || both[1] < least)
        return; /* the root: no GPU of the group has that much */
    /* depth-first down to blocks of (at most) 8 leaves, whose leaves are then read in a row:
     * the walk's bookkeeping per node costs more than a leaf's two compares. No branch on what
     * the figures say (a third of the planner's mispredicted branches were here): each block
     * writes all its GPUs and counts those that pass, each node writes both children to the
     * stack and keeps those that pass (out has room for the extra write, miss_buf's n + 8) */
    int32_t blk = t->leaves >= 8 ? t->leaves / 8 : 1, span = t->leaves / blk;
    const int64_t *leaf = tr + t->leaves, *fleaf = ftr + t->leaves;
    int32_t stack[64]; /* depth-first over a heap of at most 2 x 4096 nodes: 13 deep */
    int32_t sp = 0, m = *n;
    stack[sp++] = 1;
    while (sp > 0) {
        int32_t x = stack[--sp];
        if (x >= blk) {
            int32_t pos = (x - blk) * span;
            if (span == 8) {
                const int32_t *gp = t->gpus + pos;
                const int64_t *lf = leaf + pos, *fl = fleaf + pos;
#pragma GCC unroll 8
                for (int32_t i = 0; i < 8; i++) {
                    out[m] = gp[i];
                    m += (lf[i] >= share) & (fl[i] >= fneed);
                }
                continue;
            }
            for (int32_t end = pos + span; pos < end; pos++) {
                out[m] = t->gpus[pos];
                m += (leaf[pos] >= share) & (fleaf[pos] >= fneed);
            }
            continue;
        }
        /* right first so that the left (lower index) comes out first */
        int32_t l = 2 * x, rt = 2 * x + 1;
        if (tr[rt] >= share && ftr[rt] >= fneed && both[rt] >= least)
            stack[sp++] = rt;
        if (tr[l] >= share && ftr[l] >= fneed && both[l] >= least)
            stack[sp++] = l;
    }
    *n = m;
}

/* ---- room trees ---------------------------------------------------------------------- */

/* The rows of a position where every check of osub__note_closest() passes. */
static void row_pass(struct room_tree *t, int32_t pos)
{
    t->r_logical[pos] = OSUB__ROW_PASS;
    t->r_held[pos] = t->r_floors[pos] = t->r_backed[pos] = -OSUB__ROW_PASS;
}

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
        t->leaves = 1;
        while (t->leaves < t->n)
            t->leaves *= 2;
        /* a GPU for every leaf, -1 past t->n: osub__tree_collect() reads whole blocks */
        t->gpus = malloc((size_t)t->leaves * sizeof(int32_t));
        if (t->gpus == NULL)
            return OSUB_ENOMEM;
        for (int32_t x = t->n; x < t->leaves; x++)
            t->gpus[x] = -1;
        for (int32_t i = 0; i < e->n_gpus; i++)
            if (e->gpus[i].tree_size == j)
                t->gpus[e->gpus[i].tree_pos] = i;
        t->root = -1;
        t->left = malloc((size_t)t->n * sizeof(int32_t));
        t->right = malloc((size_t)t->n * sizeof(int32_t));
        t->prio = malloc((size_t)t->n * sizeof(uint32_t));
        t->pfree = calloc((size_t)t->n, sizeof(int64_t));
        t->in = calloc((size_t)t->n, sizeof(bool));
        t->stk = malloc((size_t)t->n * sizeof(int32_t));
        if (t->left == NULL || t->right == NULL || t->prio == NULL || t->pfree == NULL ||
            t->in == NULL || t->stk == NULL)
            return OSUB_ENOMEM;
        size_t n4 = ((size_t)t->n + 3) & ~(size_t)3;
        int32_t **rows[] = {&t->r_logical, &t->r_held,  &t->r_floors,
                            &t->r_backed,  &t->r_nopre, &t->sf};
        for (size_t a = 0; a < sizeof(rows) / sizeof(rows[0]); a++)
            if ((*rows[a] = calloc(n4, sizeof(int32_t))) == NULL)
                return OSUB_ENOMEM;
        for (size_t x = 0; x < n4; x++)
            row_pass(t, (int32_t)x);
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
        for (int32_t L = 0; L <= e->max_level; L++) {
            for (int a = 2; a < 6; a += 2) {
                t->mt[a][L] = malloc(2 * (size_t)t->leaves * sizeof(int64_t));
                if (t->mt[a][L] == NULL)
                    return OSUB_ENOMEM;
                for (int32_t x = 0; x < 2 * t->leaves; x++)
                    t->mt[a][L][x] = INT64_MIN / 4;
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
        free(e->trees[j].stk);
        free(e->trees[j].r_logical);
        free(e->trees[j].r_held);
        free(e->trees[j].r_floors);
        free(e->trees[j].r_backed);
        free(e->trees[j].r_nopre);
        free(e->trees[j].sf);
        for (int32_t L = 0; L <= OSUB_MAX_LEVEL; L++) {
            free(e->trees[j].t[L]);
            free(e->trees[j].d[L]);
            free(e->trees[j].bt[L]);
            free(e->trees[j].bd[L]);
            free(e->trees[j].pt[L]);
            free(e->trees[j].pd[L]);
            free(e->trees[j].ft[L]);
            for (int a = 0; a < 6; a++)
                free(e->trees[j].mt[a][L]);
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
    if (tr[x] == v)
        return; /* nothing changes, here or above */
    tr[x] = v;
    for (x /= 2; x >= 1; x /= 2) {
        int64_t m = tr[2 * x] > tr[2 * x + 1] ? tr[2 * x] : tr[2 * x + 1];
        if (tr[x] == m && x != 1)
            break; /* nothing above changes */
        tr[x] = m;
    }
}

void osub__trees_refresh(osub_engine_t *e)
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
        int64_t pf = osub__place_limit(e, g) - osub__projected_base(e, g);
        if (t->in[g->tree_pos] && (out || t->pfree[g->tree_pos] != pf))
            treap_erase(t, g->tree_pos);
        if (!out && !t->in[g->tree_pos])
            treap_insert(t, g->tree_pos, pf);
        if (!out) {
            osub__gpu_agg(e, g, gi);
            if (g->agg_valid_until < e->trees_valid_until)
                e->trees_valid_until = g->agg_valid_until;
        }
        int64_t cap[6][OSUB_MAX_LEVEL + 1], fcap[OSUB_MAX_LEVEL + 1];
        int64_t floors = osub__gpu_floors(e, g);
        int64_t ffree = (g->n_preempt == 0 ? g->usable : osub__place_limit(e, g)) - floors;
        if (out) {
            row_pass(t, g->tree_pos);
        } else {
            t->r_logical[g->tree_pos] = osub__clamp_row(g->logical - g->granted);
            t->r_held[g->tree_pos] = osub__clamp_row(g->held);
            t->r_floors[g->tree_pos] = osub__clamp_row(floors);
            t->r_backed[g->tree_pos] = osub__clamp_row(g->backed);
        }
        t->r_nopre[g->tree_pos] = g->n_preempt == 0 ? -1 : 0;
        int64_t bfree = g->usable - g->backed;
        int64_t wfree = g->hw_lim - g->held;
        const struct gpu_aggs *a = g->a;
        for (int32_t L = e->max_level; L >= 0; L--) {
            /* what every level below L gives back (the aggregates are over levels >= L + 1) */
            bool top = L == OSUB_MAX_LEVEL;
            int64_t rh = top ? 0 : a->lv[L + 1].ev_held, rg = top ? 0 : a->lv[L + 1].ev_grant;
            int64_t dh = top ? 0 : a->lv[L + 1].dg_held, dg = top ? 0 : a->lv[L + 1].dg_grant;
            int64_t rf = top ? 0 : a->lv[L + 1].ev_floor;
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
        }
        int64_t fdv = out ? INT64_MIN / 4 : ffree;
        for (int32_t L = 0; L <= e->max_level; L++) {
            int64_t *arrs[6] = {t->t[L], t->d[L], t->bt[L], t->bd[L], t->pt[L], t->pd[L]};
            for (int which = 0; which < 6; which++) {
                int64_t v = cap[which][L];
                tree_set(t, arrs[which], g->tree_pos, v);
                if (t->mt[which][L] != NULL)
                    tree_set(t, t->mt[which][L], g->tree_pos, v < fcap[L] ? v : fcap[L]);
            }
            tree_set(t, t->ft[L], g->tree_pos, fcap[L]);
        }
        tree_set(t, t->fd, g->tree_pos, fdv);
    }
    e->n_tdirty = 0;
}

bool osub__may_fit(osub_engine_t *e, const struct req *r, int64_t share)
{
    if (r->exclusive || r->level > e->max_level || r->level < 0)
        return true;
    osub__trees_refresh(e);
    for (int32_t j = 0; j < e->n_trees; j++) {
        if (r->size_mib > 0 && e->trees[j].vram != r->size_mib)
            continue;
        if (e->trees[j].t[r->level][1] >= share)
            return true;
    }
    return false;
}
