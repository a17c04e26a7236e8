/* engine.c - the engine's state machine: services, accounting, commands, timers, queue */
#include <assert.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- defaults ------------------------------------------------------------------------- */

static const osub_class_t default_classes[] = {
    {"online", 0, false, -1},
    {"batch", 1, true, -1},
    {"experiment", 2, true, -1},
};

const osub_class_t *osub_default_classes(size_t *n_out)
{
    *n_out = sizeof(default_classes) / sizeof(default_classes[0]);
    return default_classes;
}

void osub_pool_config_default(osub_pool_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->ratio_milli = 1300;
    cfg->compute_ratio_milli = 2000;
    cfg->margin_mib = 0;
    cfg->high_watermark_pct = 95;
    cfg->low_watermark_pct = 90;
    cfg->hysteresis_ms = 60000;
    cfg->ack_timeout_ms = 10000;
    cfg->grace_ms = 30000;
    cfg->min_runtime_ms = 600000;
    cfg->history_window_ms = 3600000;
    cfg->restart_cost_ms = 60000;
    cfg->queue_aging_ms = 300000;
    cfg->prediction_trust_ms = 3600000;
    cfg->floor_start_after_ms = 120000;
}

void osub_spec_init(osub_spec_t *spec, const char *id, const char *class_name)
{
    memset(spec, 0, sizeof(*spec));
    if (id != NULL)
        snprintf(spec->id, sizeof(spec->id), "%s", id);
    snprintf(spec->class_name, sizeof(spec->class_name), "%s",
             class_name != NULL ? class_name : "batch");
    spec->preemptible = OSUB_TRI_DEFAULT;
    spec->queue = OSUB_TRI_DEFAULT;
    spec->on_evict = OSUB_ON_EVICT_DEFAULT;
    spec->restart_cost_ms = -1;
    spec->grace_ms = -1;
}

bool osub_id_valid(const char *id)
{
    if (id == NULL || id[0] < 'a' || id[0] > 'z')
        return false;
    size_t n = 0;
    for (const char *p = id; *p; p++, n++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
            return false;
    }
    return n >= 1 && n <= OSUB_ID_MAX;
}

static const char *const state_names[] = {"queued",   "pending", "loading", "running", "degraded",
                                          "draining", "overdue", "failed",  "released"};

const char *osub_state_name(osub_state_t s)
{
    return (unsigned)s < sizeof(state_names) / sizeof(state_names[0]) ? state_names[s] : "?";
}

const char *osub_event_name(osub_event_kind_t k)
{
    switch (k) {
#define OSUB__EV_NAME(name, str)                                                                   \
    case OSUB_EV_##name:                                                                           \
        return str;
        OSUB_EVENT_MAP(OSUB__EV_NAME)
#undef OSUB__EV_NAME
    default:
        return "?";
    }
}

const char *osub_reason_name(osub_reason_t r)
{
    switch (r) {
#define OSUB__RS_NAME(name, str)                                                                   \
    case OSUB_R_##name:                                                                            \
        return str;
        OSUB_REASON_MAP(OSUB__RS_NAME)
#undef OSUB__RS_NAME
    default:
        return "?";
    }
}

const char *osub_check_name(osub_check_t c)
{
    static const char *const n[] = {"none",    "logical",   "backed", "held",
                                    "compute", "exclusive", "gpus",   "floors"};
    return (unsigned)c < sizeof(n) / sizeof(n[0]) ? n[c] : "?";
}

/* ---- small helpers -------------------------------------------------------------------- */

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static const osub_class_t *find_class(const osub_engine_t *e, const char *name)
{
    for (size_t i = 0; i < e->n_classes; i++)
        if (strcmp(e->classes[i].name, name) == 0)
            return &e->classes[i];
    return NULL;
}

static const char *class_of(const osub_engine_t *e, const struct svc *s)
{
    (void)e;
    return s->spec.class_name;
}

static void fmt_gpus(const struct svc *s, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    off += (size_t)snprintf(buf, len, s->n_slots == 1 ? "GPU " : "GPUs ");
    for (int32_t i = 0; i < s->n_slots && off + 12 < len; i++) {
        if (i >= 8) {
            snprintf(buf + off, len - off, ",...");
            return;
        }
        off += (size_t)snprintf(buf + off, len - off, i ? ",%d" : "%d", s->slots[i].gpu);
    }
}

static int64_t grant_total(const struct svc *s)
{
    int64_t t = 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        t += s->slots[i].grant;
    return t;
}

static int64_t used_total(const struct svc *s)
{
    int64_t t = 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        t += s->slots[i].used;
    return t;
}

static int64_t held_total(const struct svc *s)
{
    int64_t t = 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        t += s->slots[i].held;
    return t;
}

/* ---- events --------------------------------------------------------------------------- */

OSUB_PRINTF(4, 5)
static osub_event_t *emit(osub_engine_t *e, osub_event_kind_t kind, osub_reason_t reason,
                          const char *fmt, ...)
{
    static osub_event_t sink;
    if (e->n_events == e->cap_events) {
        size_t cap = e->cap_events ? e->cap_events * 2 : 16;
        osub_event_t *n = realloc(e->events, cap * sizeof(*n));
        if (n == NULL) {
            e->events_lost++; /* the decision stands; only its record is lost */
            return &sink;
        }
        e->events = n;
        e->cap_events = cap;
    }
    osub_event_t *ev = &e->events[e->n_events++];
    ev->time_ms = e->now;
    ev->kind = kind;
    ev->reason = reason;
    ev->service[0] = ev->cause[0] = '\0';
    ev->cause_level = ev->level = ev->gpu = -1;
    ev->vram_mib = ev->deadline_ms = 0;
    ev->batch_size = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev->msg, sizeof(ev->msg), fmt, ap);
    va_end(ap);
    return ev;
}

static void ev_svc(osub_event_t *ev, const struct svc *s)
{
    snprintf(ev->service, sizeof(ev->service), "%s", s->spec.id);
    ev->level = s->level;
    ev->gpu = s->n_slots > 0 ? s->slots[0].gpu : -1;
}

/* ---- hash table of live services ---------------------------------------------------- */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static struct svc *lookup(const osub_engine_t *e, const char *id)
{
    if (e->tab_cap == 0 || id == NULL)
        return NULL;
    size_t m = e->tab_cap - 1;
    for (size_t i = fnv1a(id) & m;; i = (i + 1) & m) {
        struct svc *s = e->tab[i];
        if (s == NULL)
            return NULL;
        if (strcmp(s->spec.id, id) == 0)
            return s;
    }
}

static void tab_insert_raw(struct svc **tab, size_t cap, struct svc *s)
{
    size_t m = cap - 1;
    size_t i = fnv1a(s->spec.id) & m;
    while (tab[i] != NULL)
        i = (i + 1) & m;
    tab[i] = s;
}

static int tab_reserve(osub_engine_t *e)
{
    if ((e->n_live + 1) * 2 <= e->tab_cap)
        return 0;
    size_t cap = e->tab_cap ? e->tab_cap * 2 : 64;
    struct svc **t = calloc(cap, sizeof(*t));
    if (t == NULL)
        return OSUB_ENOMEM;
    for (size_t i = 0; i < e->tab_cap; i++)
        if (e->tab[i] != NULL)
            tab_insert_raw(t, cap, e->tab[i]);
    free(e->tab);
    e->tab = t;
    e->tab_cap = cap;
    return 0;
}

static void tab_remove(osub_engine_t *e, struct svc *s)
{
    size_t m = e->tab_cap - 1;
    size_t i = fnv1a(s->spec.id) & m;
    while (e->tab[i] != s)
        i = (i + 1) & m;
    e->tab[i] = NULL;
    /* backward-shift deletion keeps probe chains intact */
    size_t j = i;
    for (;;) {
        j = (j + 1) & m;
        struct svc *x = e->tab[j];
        if (x == NULL)
            break;
        size_t home = fnv1a(x->spec.id) & m;
        bool move = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (move) {
            e->tab[i] = x;
            e->tab[j] = NULL;
            i = j;
        }
    }
}

/* ---- timers: an indexed min-heap, at most one timer of each kind per service -------- */

static bool timer_less(const struct timer_ent *a, const struct timer_ent *b)
{
    if (a->at != b->at)
        return a->at < b->at;
    if (a->s->seq != b->s->seq)
        return a->s->seq < b->s->seq;
    return a->kind < b->kind;
}

static void heap_set(osub_engine_t *e, size_t i, struct timer_ent t)
{
    e->heap[i] = t;
    t.s->heap_pos[t.kind] = (int32_t)i;
}

static void heap_up(osub_engine_t *e, size_t i)
{
    struct timer_ent t = e->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!timer_less(&t, &e->heap[p]))
            break;
        heap_set(e, i, e->heap[p]);
        i = p;
    }
    heap_set(e, i, t);
}

static void heap_down(osub_engine_t *e, size_t i)
{
    struct timer_ent t = e->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= e->n_heap)
            break;
        if (c + 1 < e->n_heap && timer_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!timer_less(&e->heap[c], &t))
            break;
        heap_set(e, i, e->heap[c]);
        i = c;
    }
    heap_set(e, i, t);
}

static void timer_cancel(osub_engine_t *e, struct svc *s, int kind)
{
    int32_t pos = s->heap_pos[kind];
    if (pos < 0)
        return;
    s->heap_pos[kind] = -1;
    s->timer_at[kind] = 0;
    size_t i = (size_t)pos;
    e->n_heap--;
    if (i == e->n_heap)
        return;
    struct timer_ent last = e->heap[e->n_heap];
    heap_set(e, i, last);
    heap_up(e, i);
    heap_down(e, (size_t)last.s->heap_pos[last.kind]);
}

/* Timers are set only after everything that can fail: a full heap grows first (reserve). */
static int timer_reserve(osub_engine_t *e, size_t more)
{
    if (e->n_heap + more <= e->cap_heap)
        return 0;
    size_t cap = e->cap_heap ? e->cap_heap * 2 : 64;
    while (cap < e->n_heap + more)
        cap *= 2;
    struct timer_ent *n = realloc(e->heap, cap * sizeof(*n));
    if (n == NULL)
        return OSUB_ENOMEM;
    e->heap = n;
    e->cap_heap = cap;
    return 0;
}

static void timer_set(osub_engine_t *e, struct svc *s, int kind, int64_t at)
{
    timer_cancel(e, s, kind);
    if (timer_reserve(e, 1) != 0)
        return; /* cannot happen after a successful reserve; the tick still sweeps */
    struct timer_ent t = {.at = at, .s = s, .kind = kind};
    s->timer_at[kind] = at;
    e->heap[e->n_heap] = t;
    s->heap_pos[kind] = (int32_t)e->n_heap;
    e->n_heap++;
    heap_up(e, e->n_heap - 1);
}

/* ---- accounting ----------------------------------------------------------------------- */

static int64_t slot_held(const struct svc *s, const struct slot *sl)
{
    if (s->backed)
        return sl->grant;
    /* an oversold service is expected to grow to what admission counted for it (its
     * predicted peak: its grant when it has no history) */
    if (s->state == OSUB_STATE_PENDING)
        return min64(sl->grant, sl->charge);
    if (s->loading)
        return max64(sl->used, min64(sl->held_grant, sl->charge));
    if (s->used_capped)
        return min64(sl->used, sl->held_grant);
    return sl->used;
}

static void gpu_add_held(osub_engine_t *e, struct gpu *g, int64_t delta)
{
    if (delta == 0)
        return;
    (void)osub__gpu_peak(e, g); /* rolls the history forward to now first */
    osub__gpu_touch(e, g);
    if (delta < 0 && g->n_pending > 0)
        e->pending_check = true; /* a pending service here may start now */
    g->held += delta;
    int64_t *cur = &g->hist[g->hist_minute % e->hist_n];
    if (g->held > *cur)
        *cur = g->held;
    if (g->held > g->hist_peak)
        g->hist_peak = g->held;
}

/* Recomputes the held of every slot of s and carries the change into its GPUs. */
static void svc_sync(osub_engine_t *e, struct svc *s)
{
    for (int32_t i = 0; i < s->n_slots; i++) {
        struct slot *sl = &s->slots[i];
        osub__gpu_touch(e, &e->gpus[sl->gpu]);
        int64_t h = slot_held(s, sl);
        if (h != sl->held) {
            gpu_add_held(e, &e->gpus[sl->gpu], h - sl->held);
            sl->held = h;
        }
    }
}

static void slot_set_grant(osub_engine_t *e, struct svc *s, struct slot *sl, int64_t g)
{
    struct gpu *gp = &e->gpus[sl->gpu];
    osub__gpu_touch(e, gp);
    gp->granted += g - sl->grant;
    if (s->backed)
        gp->backed += g - sl->grant;
    sl->grant = g;
}

static void slot_set_used(osub_engine_t *e, struct slot *sl, int64_t u)
{
    e->gpus[sl->gpu].used += u - sl->used;
    sl->used = u;
}

static int gpu_list_reserve(struct gpu *g)
{
    if (g->nsvc < g->capsvc)
        return 0;
    int32_t cap = g->capsvc ? g->capsvc * 2 : 8;
    struct svc **n = realloc(g->svcs, (size_t)cap * sizeof(*n));
    if (n == NULL)
        return OSUB_ENOMEM;
    g->svcs = n;
    struct vinfo *v = realloc(g->vic, (size_t)cap * sizeof(*v));
    if (v == NULL)
        return OSUB_ENOMEM; /* svcs grew; capsvc stays: the next call tries again */
    g->vic = v;
    g->capsvc = cap;
    return 0;
}

/* Victim order on a GPU: level desc, submit time desc, seq desc. */
static bool svc_before(const struct svc *a, const struct svc *b)
{
    if (a->level != b->level)
        return a->level > b->level;
    if (a->submit_ms != b->submit_ms)
        return a->submit_ms > b->submit_ms;
    return a->seq > b->seq;
}

static void gpu_list_add(osub_engine_t *e, struct gpu *g, struct svc *s)
{
    osub__gpu_touch(e, g);
    int32_t pos = g->nsvc;
    while (pos > 0 && svc_before(s, g->svcs[pos - 1])) {
        g->svcs[pos] = g->svcs[pos - 1];
        pos--;
    }
    g->svcs[pos] = s;
    g->nsvc++;
    if (s->preemptible)
        g->n_preempt++;
}

static void gpu_list_remove(osub_engine_t *e, struct gpu *g, struct svc *s)
{
    osub__gpu_touch(e, g);
    for (int32_t i = 0; i < g->nsvc; i++) {
        if (g->svcs[i] == s) {
            memmove(&g->svcs[i], &g->svcs[i + 1], (size_t)(g->nsvc - i - 1) * sizeof(s));
            g->nsvc--;
            if (s->preemptible)
                g->n_preempt--;
            return;
        }
    }
}

static int place_reserve(osub_engine_t *e, const int32_t *gpus, int32_t k)
{
    for (int32_t j = 0; j < k; j++)
        if (gpu_list_reserve(&e->gpus[gpus[j]]) != 0)
            return OSUB_ENOMEM;
    return 0;
}

/* Places s on gpus with the given grants (caller reserved the lists). */
static void svc_place(osub_engine_t *e, struct svc *s, const int32_t *gpus, const int64_t *shares,
                      const int64_t *charges, int32_t k)
{
    s->n_slots = k;
    for (int32_t j = 0; j < k; j++) {
        struct slot *sl = &s->slots[j];
        struct gpu *g = &e->gpus[gpus[j]];
        sl->gpu = gpus[j];
        sl->grant = 0;
        sl->held = 0;
        sl->used = 0;
        slot_set_grant(e, s, sl, shares[j]);
        sl->held_grant = shares[j];
        sl->charge =
            charges != NULL && charges[j] > 0 && charges[j] < shares[j] ? charges[j] : shares[j];
        g->compute_all += s->spec.compute_pct;
        if (s->backed)
            g->compute_backed += s->spec.compute_pct;
        if (s->spec.exclusive)
            g->excl = s;
        gpu_list_add(e, g, s);
    }
    s->used_capped = false;
}

static void svc_unplace(osub_engine_t *e, struct svc *s)
{
    if (s->state == OSUB_STATE_PENDING)
        for (int32_t j = 0; j < s->n_slots; j++)
            e->gpus[s->slots[j].gpu].n_pending--;
    for (int32_t j = 0; j < s->n_slots; j++) {
        struct slot *sl = &s->slots[j];
        struct gpu *g = &e->gpus[sl->gpu];
        slot_set_grant(e, s, sl, 0);
        slot_set_used(e, sl, 0);
        gpu_add_held(e, g, -sl->held);
        sl->held = 0;
        g->compute_all -= s->spec.compute_pct;
        if (s->backed)
            g->compute_backed -= s->spec.compute_pct;
        g->compute_measured -= s->compute_used;
        if (g->excl == s)
            g->excl = NULL;
        gpu_list_remove(e, g, s);
        osub__hist_reset(e, g); /* its peaks are not the GPU's any more */
    }
    s->n_slots = 0;
    s->compute_used = 0;
    s->batch_degraded = false;
    s->loading = false;
    s->ack_pending = false;
    s->used_capped = false;
    timer_cancel(e, s, T_LOAD);
    timer_cancel(e, s, T_DEADLINE);
    s->deadline_ms = 0;
    e->dirty = true;
}

/* ---- lists: queue and pending --------------------------------------------------------- */

static bool queue_before(const struct svc *a, const struct svc *b)
{
    if (a->level != b->level)
        return a->level < b->level;
    if (a->submit_ms != b->submit_ms)
        return a->submit_ms < b->submit_ms;
    return a->seq < b->seq;
}

/* Makes room for n entries (n < *cap afterwards), growing by doubling as often as needed:
 * a lost GPU or a snapshot can add many at once. */
static int vec_reserve(struct svc ***v, size_t *cap, size_t n)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    while (c <= n)
        c *= 2;
    struct svc **x = realloc(*v, c * sizeof(*x));
    if (x == NULL)
        return OSUB_ENOMEM;
    *v = x;
    *cap = c;
    return 0;
}

static size_t queue_push(osub_engine_t *e, struct svc *s)
{
    /* binary search for the first entry that s goes before */
    size_t lo = 0, hi = e->n_queue;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (queue_before(s, e->queue[mid]))
            hi = mid;
        else
            lo = mid + 1;
    }
    memmove(&e->queue[lo + 1], &e->queue[lo], (e->n_queue - lo) * sizeof(s));
    e->queue[lo] = s;
    e->n_queue++;
    return lo;
}

static void vec_remove(struct svc **v, size_t *n, struct svc *s)
{
    for (size_t i = 0; i < *n; i++) {
        if (v[i] == s) {
            memmove(&v[i], &v[i + 1], (*n - i - 1) * sizeof(s));
            (*n)--;
            return;
        }
    }
}

static size_t queue_pos(const osub_engine_t *e, const struct svc *s)
{
    for (size_t i = 0; i < e->n_queue; i++)
        if (e->queue[i] == s)
            return i + 1;
    return 0;
}

/* ---- service lifetime ----------------------------------------------------------------- */

void osub_svc_free(struct svc *s)
{
    if (s == NULL)
        return;
    free(s->slots);
    free(s->slot_info);
    free(s->waits);
    free(s);
}

static void svc_unlink(osub_engine_t *e, struct svc *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        e->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        e->tail = s->prev;
    tab_remove(e, s);
    e->n_live--;
}

/* Removes s for good: from its GPUs, lists and timers. Frees it. */
static void svc_destroy(osub_engine_t *e, struct svc *s)
{
    svc_unplace(e, s);
    if (s->state == OSUB_STATE_QUEUED)
        vec_remove(e->queue, &e->n_queue, s);
    if (s->state == OSUB_STATE_PENDING)
        vec_remove(e->pending, &e->n_pending, s);
    svc_unlink(e, s);
    osub_svc_free(s);
}

static void set_state(osub_engine_t *e, struct svc *s, osub_state_t st)
{
    if (s->state == st)
        return;
    if (s->state == OSUB_STATE_PENDING) {
        vec_remove(e->pending, &e->n_pending, s);
        for (int32_t i = 0; i < s->n_slots; i++)
            e->gpus[s->slots[i].gpu].n_pending--;
    }
    if (st == OSUB_STATE_PENDING) {
        for (int32_t i = 0; i < s->n_slots; i++)
            e->gpus[s->slots[i].gpu].n_pending++;
        e->pending_check = true;
    }
    s->state = st;
    s->since_ms = e->now;
    for (int32_t i = 0; i < s->n_slots; i++)
        osub__gpu_touch(e, &e->gpus[s->slots[i].gpu]);
}

/* Moves a service that lost its placement to the queue (requeue) -- list space reserved. */
static void svc_to_queue(osub_engine_t *e, struct svc *s)
{
    svc_unplace(e, s);
    set_state(e, s, OSUB_STATE_QUEUED);
    s->room_since_ms = -1;
    s->batch = s->full_batch;
    s->n_waits = 0;
    queue_push(e, s);
}

static void svc_start(osub_engine_t *e, struct svc *s, osub_reason_t reason)
{
    bool resume = s->evicted_before;
    bool adopted = s->adopted && !resume;
    bool was_pending = s->state == OSUB_STATE_PENDING;
    s->adopted = false;
    set_state(e, s, adopted ? OSUB_STATE_RUNNING : OSUB_STATE_LOADING);
    s->loading = !adopted;
    s->start_ms = e->now;
    s->n_waits = 0;
    if (resume) {
        s->resumed = true;
        s->resume_ms = e->now;
        e->resumes++;
    }
    svc_sync(e, s);
    if (!adopted)
        timer_set(e, s, T_LOAD, e->now + s->restart_cost_ms);
    else if (was_pending) /* its reservation while it waited was not a peak of the GPU's */
        for (int32_t i = 0; i < s->n_slots; i++)
            osub__hist_reset(e, &e->gpus[s->slots[i].gpu]);
    char gb[96];
    fmt_gpus(s, gb, sizeof(gb));
    osub_event_t *ev;
    if (resume)
        ev = emit(e, OSUB_EV_RESUME, reason,
                  "resumed %s (%s) on %s with %lld MiB%s%s; protected from eviction for %lld ms",
                  s->spec.id, class_of(e, s), gb, (long long)grant_total(s),
                  s->checkpoint[0] ? " from checkpoint " : "", s->checkpoint,
                  (long long)e->cfg.min_runtime_ms);
    else
        ev = emit(e, OSUB_EV_START, reason, "started %s (%s) on %s with %lld MiB; %s %lld ms",
                  s->spec.id, class_of(e, s), gb, (long long)grant_total(s),
                  adopted ? "already running: no loading period instead of" : "loading for up to",
                  (long long)s->restart_cost_ms);
    ev_svc(ev, s);
    ev->vram_mib = grant_total(s);
    ev->batch_size = s->batch;
}

static void svc_degrade(osub_engine_t *e, struct svc *s, const char *cause, int32_t cause_level,
                        osub_reason_t reason)
{
    int64_t from = grant_total(s);
    int32_t from_batch = s->batch;
    for (int32_t i = 0; i < s->n_slots; i++)
        slot_set_grant(e, s, &s->slots[i], osub__floor_share(s, i));
    s->batch = s->floor_batch;
    set_state(e, s, OSUB_STATE_DEGRADED);
    s->ack_pending = true;
    s->room_since_ms = -1;
    s->n_degrades++;
    e->degrades++;
    s->deadline_ms = e->now + e->cfg.ack_timeout_ms;
    snprintf(s->preemptor, sizeof(s->preemptor), "%s", cause ? cause : "");
    s->preemptor_level = cause_level;
    timer_set(e, s, T_DEADLINE, s->deadline_ms);
    svc_sync(e, s);
    char gb[96], why[200], bb[48] = "";
    fmt_gpus(s, gb, sizeof(gb));
    if (cause && cause[0])
        snprintf(why, sizeof(why), "to make room for %s (level %d)", cause, cause_level);
    else
        snprintf(why, sizeof(why), "because %s is above its high watermark", gb);
    if (from_batch > 0)
        snprintf(bb, sizeof(bb), ", batch %d -> %d", from_batch, s->batch);
    osub_event_t *ev = emit(e, OSUB_EV_DEGRADE, reason,
                            "degraded %s (%s) on %s from %lld to %lld MiB%s, %s; "
                            "acknowledge within %lld ms",
                            s->spec.id, class_of(e, s), gb, (long long)from,
                            (long long)grant_total(s), bb, why, (long long)e->cfg.ack_timeout_ms);
    ev_svc(ev, s);
    snprintf(ev->cause, sizeof(ev->cause), "%s", cause ? cause : "");
    ev->cause_level = cause_level;
    ev->vram_mib = grant_total(s);
    ev->batch_size = s->batch;
    ev->deadline_ms = s->deadline_ms;
}

static void svc_evict(osub_engine_t *e, struct svc *s, const char *cause, int32_t cause_level,
                      osub_reason_t reason)
{
    int64_t from = grant_total(s);
    s->ack_pending = false;
    for (int32_t i = 0; i < s->n_slots; i++)
        slot_set_grant(e, s, &s->slots[i], 0);
    set_state(e, s, OSUB_STATE_DRAINING);
    s->room_since_ms = -1;
    s->n_evictions++;
    e->evictions++;
    s->deadline_ms = e->now + s->grace_ms;
    snprintf(s->preemptor, sizeof(s->preemptor), "%s", cause ? cause : "");
    s->preemptor_level = cause_level;
    timer_set(e, s, T_DEADLINE, s->deadline_ms);
    svc_sync(e, s);
    char gb[96], why[200];
    fmt_gpus(s, gb, sizeof(gb));
    if (reason == OSUB_R_ACK_TIMEOUT)
        snprintf(why, sizeof(why), "because it did not acknowledge its degrade in time");
    else if (cause && cause[0])
        snprintf(why, sizeof(why), "to make room for %s (level %d)", cause, cause_level);
    else if (reason == OSUB_R_USER)
        snprintf(why, sizeof(why), "because its GPU is being drained");
    else
        snprintf(why, sizeof(why), "because %s is above its high watermark", gb);
    osub_event_t *ev =
        emit(e, OSUB_EV_EVICT, reason,
             "evicting %s (%s, %lld MiB held) from %s %s; grace period %lld ms, "
             "then %s",
             s->spec.id, class_of(e, s), (long long)held_total(s), gb, why, (long long)s->grace_ms,
             s->requeue_on_evict ? "back to the queue" : "released");
    (void)from;
    ev_svc(ev, s);
    snprintf(ev->cause, sizeof(ev->cause), "%s", cause ? cause : "");
    ev->cause_level = cause_level;
    ev->deadline_ms = s->deadline_ms;
}

/* The memory of an evicted (or exited) service is free: requeue or release it. */
static void svc_gone(osub_engine_t *e, struct svc *s, osub_reason_t reason, bool by_eviction)
{
    char gb[96];
    fmt_gpus(s, gb, sizeof(gb));
    if (by_eviction && s->requeue_on_evict) {
        s->evicted_before = true;
        svc_to_queue(e, s);
        osub_event_t *ev = emit(e, OSUB_EV_REQUEUE, reason,
                                "%s (%s) left %s and is back in the queue at position %zu%s%s",
                                s->spec.id, class_of(e, s), gb, queue_pos(e, s),
                                s->checkpoint[0] ? " with checkpoint " : "", s->checkpoint);
        ev_svc(ev, s);
        return;
    }
    osub_event_t *ev = emit(e, OSUB_EV_RELEASE, reason, "released %s (%s) from %s", s->spec.id,
                            class_of(e, s), s->n_slots ? gb : "the queue");
    ev_svc(ev, s);
    svc_destroy(e, s);
}

/* ---- engine lifetime ------------------------------------------------------------------ */

static void refresh_sizes(osub_engine_t *e);

static int validate_config(const osub_pool_config_t *c)
{
    if (c->ratio_milli < 1000 || c->ratio_milli > 100000)
        return OSUB_ERATIO_RANGE;
    if (c->compute_ratio_milli < 1000 || c->compute_ratio_milli > 100000)
        return OSUB_EBAD_CONFIG;
    if (c->margin_mib < 0 || c->high_watermark_pct <= 0 || c->high_watermark_pct > 100 ||
        c->low_watermark_pct <= 0 || c->low_watermark_pct > c->high_watermark_pct)
        return OSUB_EBAD_CONFIG;
    if (c->hysteresis_ms < 0 || c->ack_timeout_ms < 0 || c->grace_ms < 0 || c->min_runtime_ms < 0 ||
        c->history_window_ms < 60000 || c->history_window_ms > 7 * 86400000LL ||
        c->restart_cost_ms < 0 || c->queue_aging_ms < 0 || c->prediction_trust_ms < 1 ||
        c->prediction_trust_ms > 30 * 86400000LL || c->floor_start_after_ms < -1 ||
        c->floor_start_after_ms > 30 * 86400000LL)
        return OSUB_EBAD_CONFIG;
    return 0;
}

int osub_engine_new(const osub_pool_config_t *cfg, const int64_t *vram_mib,
                    const char *const *names, size_t n_gpus, const osub_class_t *classes,
                    size_t n_classes, osub_engine_t **out)
{
    if (cfg == NULL || vram_mib == NULL || out == NULL || n_gpus == 0 ||
        n_gpus > OSUB_POOL_GPUS_MAX)
        return OSUB_EBAD_CONFIG;
    int rc = validate_config(cfg);
    if (rc != 0)
        return rc;
    if (classes == NULL || n_classes == 0)
        classes = osub_default_classes(&n_classes);
    if (n_classes > OSUB_MAX_CLASSES)
        return OSUB_EBAD_CLASS;
    for (size_t i = 0; i < n_classes; i++) {
        const osub_class_t *c = &classes[i];
        if (c->name[0] == '\0' || c->level < 0 || c->level > OSUB_MAX_LEVEL || c->grace_ms < -1)
            return OSUB_EBAD_CLASS;
        for (size_t j = 0; j < i; j++)
            if (strcmp(classes[j].name, c->name) == 0)
                return OSUB_EBAD_CLASS;
        if (c->level == 0 && c->preemptible)
            return OSUB_EBAD_CLASS; /* level 0 is never preempted (DESIGN.md) */
    }
    for (size_t i = 0; i < n_gpus; i++)
        if (vram_mib[i] <= cfg->margin_mib || vram_mib[i] > (INT64_C(1) << 24))
            return OSUB_EBAD_CONFIG;

    osub_engine_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return OSUB_ENOMEM;
    e->cfg = *cfg;
    memcpy(e->classes, classes, n_classes * sizeof(*classes));
    e->n_classes = n_classes;
    for (size_t i = 0; i < n_classes; i++)
        if (classes[i].level > e->max_level)
            e->max_level = classes[i].level;
    e->n_gpus = (int32_t)n_gpus;
    e->hist_n = (int32_t)(cfg->history_window_ms / 60000);
    e->next_seq = 1;
    e->gpus = calloc(n_gpus, sizeof(*e->gpus));
    e->cand_buf = calloc(n_gpus, sizeof(*e->cand_buf));
    e->aggs = calloc(n_gpus, sizeof(*e->aggs));
    e->miss_buf = calloc(n_gpus, sizeof(*e->miss_buf));
    e->promise_buf = calloc(n_gpus, sizeof(*e->promise_buf));
    e->gpu_stamp = calloc(n_gpus, sizeof(*e->gpu_stamp));
    if (e->gpus == NULL || e->cand_buf == NULL || e->miss_buf == NULL || e->promise_buf == NULL ||
        e->aggs == NULL || e->gpu_stamp == NULL)
        goto err_free;
    for (size_t i = 0; i < n_gpus; i++) {
        struct gpu *g = &e->gpus[i];
        if (names != NULL && names[i] != NULL)
            snprintf(g->name, sizeof(g->name), "%s", names[i]);
        else
            snprintf(g->name, sizeof(g->name), "gpu%zu", i);
        g->a = &e->aggs[i];
        g->vram = vram_mib[i];
        g->usable = vram_mib[i] - cfg->margin_mib;
        g->hw_lim = g->usable * cfg->high_watermark_pct / 100;
        g->logical = vram_mib[i] * cfg->ratio_milli / 1000;
        g->hist = calloc((size_t)e->hist_n, sizeof(*g->hist));
        if (g->hist == NULL)
            goto err_free;
    }
    e->tdirty = calloc(n_gpus, sizeof(*e->tdirty));
    e->trees_valid_until = INT64_MAX;
    if (e->tdirty == NULL || osub__trees_init(e) != 0)
        goto err_free;
    for (int32_t i = 0; i < e->n_gpus; i++)
        osub__gpu_touch(e, &e->gpus[i]);
    refresh_sizes(e);
    *out = e;
    return 0;
err_free:
    osub_engine_free(e);
    return OSUB_ENOMEM;
}

void osub_engine_free(osub_engine_t *e)
{
    if (e == NULL)
        return;
    struct svc *s = e->head;
    while (s) {
        struct svc *n = s->next;
        osub_svc_free(s);
        s = n;
    }
    if (e->gpus)
        for (int32_t i = 0; i < e->n_gpus; i++) {
            free(e->gpus[i].svcs);
            free(e->gpus[i].vic);
            free(e->gpus[i].hist);
        }
    free(e->gpus);
    free(e->cand_buf);
    free(e->aggs);
    free(e->tdirty);
    osub__trees_free(e);
    free(e->miss_buf);
    free(e->promise_buf);
    free(e->gpu_stamp);
    free(e->tab);
    free(e->queue);
    free(e->pending);
    free(e->heap);
    free(e->events);
    free(e);
}

/* ---- spec resolution ------------------------------------------------------------------ */

/* Refreshes the pool's size groups; called at creation and when a GPU is lost. */
static void refresh_sizes(osub_engine_t *e)
{
    e->n_sizes = 0;
    e->n_live_gpus = 0;
    e->largest_usable = 0;
    for (int32_t i = 0; i < e->n_gpus; i++) {
        const struct gpu *g = &e->gpus[i];
        if (g->lost)
            continue;
        e->n_live_gpus++;
        if (g->usable > e->largest_usable)
            e->largest_usable = g->usable;
        int32_t j = 0;
        while (j < e->n_sizes && e->size_vram[j] != g->vram)
            j++;
        if (j == e->n_sizes) {
            if (j == OSUB_GPU_SIZES_MAX)
                continue; /* more sizes than that: the rest are not placed on */
            e->size_vram[j] = g->vram;
            e->size_usable[j] = g->usable;
            e->size_count[j] = 0;
            e->n_sizes++;
        }
        e->size_count[j]++;
    }
}

static bool spec_equal(const osub_spec_t *a, const osub_spec_t *b)
{
    return memcmp(a, b, sizeof(*a)) == 0;
}

/* Normalises a spec: resolves defaults so that equal intents compare equal. */
static int resolve_spec(const osub_engine_t *e, const osub_spec_t *in, osub_spec_t *o,
                        const osub_class_t **cls_out)
{
    osub_spec_t s;
    memset(&s, 0, sizeof(s));
    /* copy field by field so that padding and bytes after the strings are zero */
    if (memchr(in->id, '\0', sizeof(in->id)) == NULL || !osub_id_valid(in->id))
        return OSUB_EBAD_ID;
    snprintf(s.id, sizeof(s.id), "%s", in->id);
    if (memchr(in->class_name, '\0', sizeof(in->class_name)) == NULL)
        return OSUB_EUNKNOWN_CLASS;
    const osub_class_t *c = find_class(e, in->class_name);
    if (c == NULL)
        return OSUB_EUNKNOWN_CLASS;
    snprintf(s.class_name, sizeof(s.class_name), "%s", in->class_name);
    if (in->vram_mib <= 0 || in->vram_mib > (INT64_C(1) << 40))
        return OSUB_EBAD_VRAM;
    s.vram_mib = in->vram_mib;
    if (in->compute_pct < 0 || in->compute_pct > 100)
        return OSUB_EBAD_COMPUTE;
    s.compute_pct = in->compute_pct;
    if (in->min_vram_mib < 0 || in->min_vram_mib > in->vram_mib)
        return OSUB_EBAD_MIN_VRAM;
    s.min_vram_mib = in->min_vram_mib ? in->min_vram_mib : in->vram_mib;
    if (in->batch_size < 0 || in->min_batch_size < 0 ||
        (in->min_batch_size > 0 && in->batch_size > 0 && in->min_batch_size > in->batch_size) ||
        (in->min_batch_size > 0 && in->batch_size == 0))
        return OSUB_EBAD_BATCH;
    s.batch_size = in->batch_size;
    s.min_batch_size = in->min_batch_size ? in->min_batch_size : in->batch_size;
    s.exclusive = in->exclusive;
    if (in->preemptible != OSUB_TRI_DEFAULT && in->preemptible != OSUB_TRI_NO &&
        in->preemptible != OSUB_TRI_YES)
        return OSUB_EINVAL;
    if (in->preemptible == OSUB_TRI_YES && in->exclusive)
        return OSUB_EEXCLUSIVE_PREEMPTIBLE;
    if (in->preemptible == OSUB_TRI_YES && !c->preemptible)
        return OSUB_EBACKED_PREEMPTIBLE;
    bool pre = in->preemptible == OSUB_TRI_DEFAULT ? c->preemptible && !in->exclusive
                                                   : in->preemptible == OSUB_TRI_YES;
    s.preemptible = pre ? OSUB_TRI_YES : OSUB_TRI_NO;
    s.resumable = in->resumable;
    if ((unsigned)in->on_evict > OSUB_ON_EVICT_RELEASE)
        return OSUB_EINVAL;
    if (in->on_evict == OSUB_ON_EVICT_REQUEUE && !in->resumable)
        return OSUB_EBAD_ON_EVICT;
    s.on_evict = in->on_evict == OSUB_ON_EVICT_DEFAULT
                     ? (in->resumable ? OSUB_ON_EVICT_REQUEUE : OSUB_ON_EVICT_RELEASE)
                     : in->on_evict;
    if (in->restart_cost_ms < -1 || in->restart_cost_ms > 86400000LL)
        return OSUB_EBAD_TIME;
    s.restart_cost_ms = in->restart_cost_ms < 0 ? e->cfg.restart_cost_ms : in->restart_cost_ms;
    if (in->grace_ms < -1 || in->grace_ms > 86400000LL)
        return OSUB_EBAD_TIME;
    s.grace_ms =
        in->grace_ms >= 0 ? in->grace_ms : (c->grace_ms >= 0 ? c->grace_ms : e->cfg.grace_ms);
    if (in->queue != OSUB_TRI_DEFAULT && in->queue != OSUB_TRI_NO && in->queue != OSUB_TRI_YES)
        return OSUB_EINVAL;
    s.queue = in->queue == OSUB_TRI_DEFAULT ? (pre ? OSUB_TRI_YES : OSUB_TRI_NO) : in->queue;

    /* GPU count */
    int64_t lu = e->largest_usable;
    if (lu <= 0)
        return OSUB_ETOO_BIG;
    if (in->gpus < 0 || in->gpus > OSUB_SERVICE_GPUS_MAX)
        return in->gpus > OSUB_SERVICE_GPUS_MAX ? OSUB_ETOO_MANY_GPUS : OSUB_EBAD_GPU_COUNT;
    int32_t n_live = e->n_live_gpus;
    if (in->gpus > n_live)
        return OSUB_ETOO_MANY_GPUS;
    int64_t k = in->gpus ? in->gpus : (s.vram_mib + lu - 1) / lu;
    if (k > OSUB_SERVICE_GPUS_MAX || k > n_live)
        return OSUB_ETOO_BIG; /* larger than the whole pool */
    s.gpus = (int32_t)k;
    if (s.min_vram_mib < s.gpus)
        return OSUB_EBAD_MIN_VRAM;
    *o = s;
    *cls_out = c;
    return 0;
}

/* Rejects at once what could not fit even on an empty pool (DESIGN.md admission step 1). */
static int empty_pool_fit(const osub_engine_t *e, const osub_spec_t *s)
{
    int32_t k = s->gpus;
    int64_t share = osub__share(s->vram_mib, k, 0);
    bool any_size_with_k = false;
    for (int32_t j = 0; j < e->n_sizes; j++) {
        if (e->size_count[j] < k)
            continue;
        any_size_with_k = true;
        if (share <= e->size_usable[j])
            return 0;
    }
    return any_size_with_k ? OSUB_ETOO_BIG : OSUB_ETOO_MANY_GPUS;
}

static void fill_req(const osub_engine_t *e, const struct svc *s, struct req *r)
{
    memset(r, 0, sizeof(*r));
    /* no start may push held above the high watermark (unless the service is alone there,
     * or, for a backed one, nothing preemptible shares the GPU): pressure would take it, or
     * a neighbour, straight back out */
    r->held_limit_pct = e->cfg.high_watermark_pct;
    r->level = s->level;
    r->backed = s->backed;
    r->exclusive = s->spec.exclusive;
    r->total = s->full_total;
    r->charge = osub__charge_total(e, s);
    r->floor = s->backed ? s->full_total : s->degradable ? s->floor_total : 0;
    r->k = s->k;
    r->compute = s->spec.compute_pct;
    r->self = s;
}

/* ---- admission ------------------------------------------------------------------------ */

/* The admission plan for s (DESIGN.md steps 2-5), with one more way in for a degradable
 * oversold service: when its request has no room without evicting anyone, it may start at
 * its floor where that fits without victims (a degraded start), and is restored once its
 * predicted peak has room (docs/engine.md, "Degraded starts"). */
static void plan_for(osub_engine_t *e, const struct svc *s, const struct req *r, struct plan *p)
{
    osub__plan_admission(e, r, p);
    p->degraded_start = false;
    if (!s->degradable || s->backed || s->spec.exclusive || s->floor_total >= s->full_total)
        return;
    if (p->ok && p->n_evict == 0)
        return;
    /* waited in the queue that long (since_ms: when it entered its state, the queue) */
    if (e->cfg.floor_start_after_ms < 0 || e->now - s->since_ms < e->cfg.floor_start_after_ms)
        return;
    struct req r2 = *r;
    r2.total = s->floor_total;
    r2.charge = r->charge < s->floor_total ? r->charge : s->floor_total;
    r2.quiet = true;
    struct plan p2;
    osub__plan_admission(e, &r2, &p2);
    if (p2.ok && p2.n_victims == 0) {
        *p = p2;
        p->degraded_start = true;
    }
}

/* The smallest share a request of s could be placed with (degraded starts included). */
static int64_t min_share(const osub_engine_t *e, const struct svc *s, const struct req *r)
{
    if (r->exclusive)
        return 1;
    int64_t t = r->charge < r->total ? r->charge : r->total;
    if (s->degradable && !s->backed && s->floor_total < t && e->cfg.floor_start_after_ms >= 0 &&
        e->now - s->since_ms >= e->cfg.floor_start_after_ms)
        t = s->floor_total; /* it may start at its floor by now */
    return t / r->k;
}

/* A sentence for a failed admission plan: which check, where, and by how much. */
static void describe_failure(const struct plan *p, char *buf, size_t len)
{
    switch (p->check) {
    case OSUB_CHECK_GPUS:
        snprintf(buf, len, "%lld GPU(s) short of a set of one size that may take it",
                 (long long)p->shortfall);
        break;
    case OSUB_CHECK_COMPUTE:
        snprintf(buf, len, "compute claims on GPU %d over by %lld%%", p->check_gpu,
                 (long long)p->shortfall);
        break;
    case OSUB_CHECK_EXCLUSIVE:
        snprintf(buf, len, "GPU %d still has %lld service(s) an exclusive service cannot share",
                 p->check_gpu, (long long)p->shortfall);
        break;
    case OSUB_CHECK_NONE:
        snprintf(buf, len, "it may not go ahead of the queue's head");
        break;
    default:
        if (p->need_gpus > 1)
            snprintf(buf, len,
                     "only %d of the %d GPUs it needs can take a share; the closest other, GPU "
                     "%d, fails the %s check, short by %lld MiB",
                     p->fit_gpus, p->need_gpus, p->check_gpu, osub_check_name(p->check),
                     (long long)p->shortfall);
        else
            snprintf(buf, len, "the %s check fails on GPU %d, short by %lld MiB",
                     osub_check_name(p->check), p->check_gpu, (long long)p->shortfall);
    }
}

static void fill_victims(const osub_engine_t *e, const struct plan *p, osub_submit_result_t *res)
{
    res->n_victims = 0;
    for (int32_t i = 0; i < p->n_victims && i < OSUB_PLAN_MAX_VICTIMS; i++) {
        osub_victim_t *v = &res->victims[res->n_victims++];
        snprintf(v->service, sizeof(v->service), "%s", p->victims[i]->spec.id);
        v->evict = p->acts[i] == ACT_EVICT;
        v->deadline_ms =
            v->evict ? e->now + p->victims[i]->grace_ms : e->now + e->cfg.ack_timeout_ms;
    }
}

static bool pending_can_start(const osub_engine_t *e, const struct svc *s)
{
    for (int32_t i = 0; i < s->n_slots; i++) {
        const struct gpu *g = &e->gpus[s->slots[i].gpu];
        if (s->spec.exclusive) {
            if (g->nsvc != 1)
                return false;
        } else if (g->held > g->usable) {
            return false;
        }
    }
    return true;
}

/* Carries out an admission plan for s (placement reserved by the caller). */
static void admit_apply(osub_engine_t *e, struct svc *s, const struct plan *p, osub_reason_t why)
{
    svc_place(e, s, p->gpus, p->shares, p->charges, p->k);
    e->admissions++;
    char gb[96];
    fmt_gpus(s, gb, sizeof(gb));
    /* why there: the set's worst placement score read back as a projected peak */
    const struct gpu *g0 = &e->gpus[p->gpus[0]];
    int64_t lim =
        s->backed && !s->spec.exclusive ? g0->usable : g0->usable * e->cfg.high_watermark_pct / 100;
    bool tight = p->score < (INT64_C(1) << 50);
    s->place_limit = lim;
    s->place_projected = tight ? lim - p->score : lim + (p->score - (INT64_C(1) << 50));
    /* per GPU: the first (largest) share's charge, against the fullest GPU of the set */
    s->place_charge = p->charges[0] > 0 ? p->charges[0] : p->shares[0];
    char why_here[240];
    snprintf(why_here, sizeof(why_here),
             "%s counted as %lld MiB (%s); projected peak %lld of %lld MiB %s, %s",
             p->k > 1 ? "its share on each GPU" : "it was", (long long)s->place_charge,
             p->degraded_start                ? "its floor: it starts degraded"
             : s->place_charge < p->shares[0] ? "its predicted peak"
             : s->pred.n == 0 && !s->backed   ? "its request: no usage history yet"
                                              : "its request",
             (long long)s->place_projected, (long long)lim,
             p->k > 1 ? "on the fullest of its GPUs" : "there",
             tight ? "the tightest fit under it" : "the GPU that overshoots it least");
    if (p->n_victims == 0) {
        osub_event_t *ev =
            emit(e, OSUB_EV_ADMIT, why, "admitted %s (%s, %lld MiB) on %s without victims: %s",
                 s->spec.id, class_of(e, s), (long long)s->full_total, gb, why_here);
        ev_svc(ev, s);
        ev->vram_mib = s->full_total;
        set_state(e, s, OSUB_STATE_PENDING);
        svc_sync(e, s);
        svc_start(e, s, why);
        if (p->degraded_start) {
            /* it starts at its floor: degraded from the start, restored when its predicted
             * peak has room (process_restores) */
            set_state(e, s, OSUB_STATE_DEGRADED);
            s->batch = s->floor_batch;
            s->room_since_ms = -1;
            s->n_degrades++;
            e->degrades++;
            osub_event_t *dv = emit(e, OSUB_EV_DEGRADE, OSUB_R_START_FLOOR,
                                    "%s (%s) starts at its floor of %lld MiB on %s: its request "
                                    "of %lld MiB has no room there yet; restored when its "
                                    "predicted peak fits",
                                    s->spec.id, class_of(e, s), (long long)grant_total(s), gb,
                                    (long long)s->full_total);
            ev_svc(dv, s);
            dv->vram_mib = grant_total(s);
            dv->batch_size = s->batch;
        }
        return;
    }
    osub_event_t *ev = emit(e, OSUB_EV_ADMIT, OSUB_R_PREEMPTION,
                            "admitted %s (%s, %lld MiB) on %s with %d victim(s): %s", s->spec.id,
                            class_of(e, s), (long long)s->full_total, gb, p->n_victims, why_here);
    ev_svc(ev, s);
    ev->vram_mib = s->full_total;
    set_state(e, s, OSUB_STATE_PENDING);
    e->pending[e->n_pending++] = s;
    svc_sync(e, s);
    s->n_waits = 0;
    for (int32_t i = 0; i < p->n_victims; i++) {
        struct svc *v = p->victims[i];
        if (p->acts[i] == ACT_EVICT)
            svc_evict(e, v, s->spec.id, s->level, OSUB_R_PREEMPTION);
        else
            svc_degrade(e, v, s->spec.id, s->level, OSUB_R_PREEMPTION);
        osub_victim_t *w = &s->waits[s->n_waits++];
        snprintf(w->service, sizeof(w->service), "%s", v->spec.id);
        w->evict = p->acts[i] == ACT_EVICT;
        w->deadline_ms = v->deadline_ms;
    }
    char vb[200];
    size_t off = 0;
    vb[0] = '\0';
    for (int32_t i = 0; i < s->n_waits && off + 70 < sizeof(vb); i++)
        off +=
            (size_t)snprintf(vb + off, sizeof(vb) - off, "%s%s %s", i ? ", " : "",
                             s->waits[i].evict ? "eviction of" : "degrade of", s->waits[i].service);
    ev = emit(e, OSUB_EV_PEND, OSUB_R_WAIT_VICTIMS, "%s is pending on %s until the %s frees memory",
              s->spec.id, gb, vb);
    ev_svc(ev, s);
    if (pending_can_start(e, s))
        svc_start(e, s, OSUB_R_ROOM_FREED);
}

/* Reserves every allocation an admission of s may need, so that applying cannot fail. */
static int admit_reserve(osub_engine_t *e, struct svc *s, const struct plan *p)
{
    if (place_reserve(e, p->gpus, p->k) != 0 ||
        timer_reserve(e, 2 + 2 * (size_t)p->n_victims) != 0 ||
        vec_reserve(&e->pending, &e->cap_pending, e->n_pending + 1) != 0)
        return OSUB_ENOMEM;
    if (p->n_victims > 0) {
        osub_victim_t *w = realloc(s->waits, (size_t)p->n_victims * sizeof(*w));
        if (w == NULL)
            return OSUB_ENOMEM;
        s->waits = w;
    }
    return 0;
}

static int32_t head_level(const osub_engine_t *e)
{
    return e->n_queue ? e->queue[0]->level : INT32_MAX;
}

/* The GPUs the queue head is waiting for: its best plan's set, or the GPU where it came
 * closest. Computed at most once per command and head (a heuristic, not a promise). */
static int head_reservation(osub_engine_t *e, int32_t *gpus, int32_t *n)
{
    *n = 0;
    if (e->n_queue == 0)
        return 0;
    struct svc *h = e->queue[0];
    if (e->resv_cmd == e->cmd_no && e->resv_head == h) {
        *n = e->resv_n;
        memcpy(gpus, e->resv_gpus, sizeof(int32_t) * (size_t)e->resv_n);
        return 0;
    }
    struct req r;
    fill_req(e, h, &r);
    /* a plan on an imaginary pool where everyone preemptible of lower priority left */
    struct plan p;
    osub__plan_admission(e, &r, &p);
    if (p.ok) {
        *n = p.k;
        memcpy(gpus, p.gpus, sizeof(int32_t) * (size_t)p.k);
    } else if (p.check_gpu >= 0) {
        *n = 1;
        gpus[0] = p.check_gpu;
    }
    e->resv_cmd = e->cmd_no;
    e->resv_head = h;
    e->resv_n = *n;
    memcpy(e->resv_gpus, gpus, sizeof(int32_t) * (size_t)*n);
    return 0;
}

/* May a later request (level lvl, planned p) go ahead of the queue head? */
static bool backfill_ok(osub_engine_t *e, const struct plan *p, int32_t lvl)
{
    if (e->n_queue == 0 || lvl < head_level(e))
        return true;
    struct svc *h = e->queue[0];
    if (e->now - h->since_ms >= e->cfg.queue_aging_ms)
        return false;
    if (p->n_victims > 0)
        return false;
    int32_t rg[OSUB_SERVICE_GPUS_MAX], nr;
    head_reservation(e, rg, &nr);
    for (int32_t i = 0; i < p->k; i++)
        for (int32_t j = 0; j < nr; j++)
            if (p->gpus[i] == rg[j])
                return false;
    return true;
}

static void process(osub_engine_t *e);
static void check_compute(osub_engine_t *e, int32_t gi);

int osub_engine_submit(osub_engine_t *e, const osub_spec_t *spec, int64_t now_ms, unsigned flags,
                       osub_submit_result_t *res);

/* ---- command discipline --------------------------------------------------------------- *
 *
 * Every command has the same three steps, and a refused command changes nothing:
 *   1. check: its arguments and the state as the last command left it, without a side
 *      effect (no timer runs, time does not move); a refusal returns here;
 *   2. advance: time moves to now_ms and the timers due by then run (their events first);
 *   3. apply, then finish: the command's own change, then the passes (pending, queue).
 * A timer never removes a service, never takes away a placement and never adds held memory,
 * so what step 1 accepted still applies after step 2 (test_errors checks every refusal at a
 * time when timers are due). */

/* Every command starts by forgetting the last one's events, refused or not: a command
 * refused before it reaches the engine's state must not show the previous command's. */
static void clear_events(osub_engine_t *e)
{
    if (e != NULL)
        e->n_events = 0;
}

static void run_timers(osub_engine_t *e);

static int check_time(const osub_engine_t *e, int64_t now_ms)
{
    if (now_ms < 0 || now_ms > (INT64_C(1) << 53))
        return OSUB_EBAD_TIME;
    if (now_ms < e->now)
        return OSUB_ETIME_BACKWARDS;
    return 0;
}

static void advance(osub_engine_t *e, int64_t now_ms)
{
    assert(now_ms >= e->now);
    e->n_events = 0;
    e->now = now_ms;
    e->cmd_no++;
    run_timers(e);
}

static void finish(osub_engine_t *e)
{
    process(e);
}

/* ---- submit ----------------------------------------------------------------------------- */

/* A dry run is the real submit on a copy of the engine at the same time: the same timers
 * run first and the same code decides, so its answer (GPUs, victims, queue position) is the
 * real one; the copy costs a save and a load, O(services). */
static int dry_run(const osub_engine_t *e, const osub_spec_t *spec, int64_t now_ms, unsigned flags,
                   osub_submit_result_t *res)
{
    char *text = osub_engine_save(e);
    if (text == NULL)
        return OSUB_ENOMEM;
    osub_engine_t *copy = NULL;
    int rc = osub_engine_load(text, &copy, NULL);
    free(text);
    if (rc != 0)
        return rc == OSUB_ENOMEM ? OSUB_ENOMEM : OSUB_EINVAL;
    rc = osub_engine_submit(copy, spec, now_ms, flags & ~OSUB_SUBMIT_DRY_RUN, res);
    osub_engine_free(copy);
    return rc;
}

int osub_engine_submit(osub_engine_t *e, const osub_spec_t *spec, int64_t now_ms, unsigned flags,
                       osub_submit_result_t *res)
{
    clear_events(e);
    osub_submit_result_t dummy;
    if (res == NULL)
        res = &dummy;
    memset(res, 0, sizeof(*res));
    res->check_gpu = -1;
    if (e == NULL || spec == NULL)
        return OSUB_EINVAL;
    /* 1. check */
    osub_spec_t s;
    const osub_class_t *cls;
    int rc = resolve_spec(e, spec, &s, &cls);
    if (rc == 0)
        rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    struct svc *old = lookup(e, s.id);
    if (old != NULL) {
        if (!spec_equal(&old->spec, &s))
            return OSUB_ESPEC_CONFLICT;
        res->outcome = OSUB_SUBMIT_EXISTS; /* a retry: nothing to do */
        return 0;
    }
    rc = empty_pool_fit(e, &s);
    if (rc != 0) {
        /* a refused command, not a decision: nothing in the state changes; the event says why */
        osub_event_t *ev = emit(e, OSUB_EV_REJECT, OSUB_R_EMPTY_POOL,
                                "rejected %s (%s, %lld MiB on %d GPU(s)): %s", s.id, s.class_name,
                                (long long)s.vram_mib, s.gpus, osub_strerror(rc));
        snprintf(ev->service, sizeof(ev->service), "%s", s.id);
        ev->time_ms = now_ms;
        res->outcome = OSUB_SUBMIT_REJECTED;
        res->rc = rc;
        return rc;
    }
    if ((flags & OSUB_SUBMIT_DRY_RUN) != 0)
        return dry_run(e, spec, now_ms, flags, res);

    /* build the service */
    struct svc *sv = calloc(1, sizeof(*sv));
    if (sv == NULL)
        return OSUB_ENOMEM;
    sv->spec = s;
    sv->k = s.gpus;
    sv->slots = calloc((size_t)sv->k, sizeof(*sv->slots));
    if (sv->slots == NULL) {
        osub_svc_free(sv);
        return OSUB_ENOMEM;
    }
    sv->seq = e->next_seq;
    sv->level = cls->level;
    sv->preemptible = s.preemptible == OSUB_TRI_YES;
    sv->backed = !sv->preemptible;
    sv->degradable = sv->preemptible && s.min_vram_mib < s.vram_mib;
    sv->requeue_on_evict = s.on_evict == OSUB_ON_EVICT_REQUEUE;
    sv->queue_ok = s.queue == OSUB_TRI_YES;
    sv->full_total = s.vram_mib;
    sv->floor_total = s.min_vram_mib;
    sv->full_batch = s.batch_size;
    sv->floor_batch = s.min_batch_size;
    sv->batch = s.batch_size;
    sv->grace_ms = s.grace_ms;
    sv->restart_cost_ms = s.restart_cost_ms;
    sv->submit_ms = now_ms;
    sv->since_ms = sv->submit_ms;
    sv->room_since_ms = -1;
    sv->heap_pos[0] = sv->heap_pos[1] = -1;
    sv->state = OSUB_STATE_QUEUED;
    sv->adopted = (flags & OSUB_SUBMIT_RUNNING) != 0;
    osub__pred_init(&sv->pred);
    if (tab_reserve(e) != 0 || vec_reserve(&e->queue, &e->cap_queue, e->n_queue + 1) != 0) {
        osub_svc_free(sv);
        return OSUB_ENOMEM;
    }

    /* 2. advance: the decision reads the state at now_ms */
    advance(e, now_ms);

    /* 3. apply */
    struct req r;
    fill_req(e, sv, &r);
    struct plan p;
    bool blocked = e->overcommitted;
    if (!blocked)
        plan_for(e, sv, &r, &p);
    else
        memset(&p, 0, sizeof(p));
    if (p.ok && !backfill_ok(e, &p, sv->level))
        p.ok = false;
    res->check = p.ok ? OSUB_CHECK_NONE : p.check;
    res->check_gpu = p.ok ? -1 : p.check_gpu;
    res->shortfall_mib = p.ok ? 0 : p.shortfall;

    if (!p.ok && !sv->queue_ok) {
        e->rejections++;
        rc = blocked ? OSUB_EOVERCOMMITTED : OSUB_ENO_ROOM;
        char fb[160];
        describe_failure(&p, fb, sizeof(fb));
        osub_event_t *ev = emit(e, OSUB_EV_REJECT, blocked ? OSUB_R_OVERCOMMITTED : OSUB_R_NO_ROOM,
                                "rejected %s (%s, %lld MiB): %s, even with victims", s.id,
                                s.class_name, (long long)s.vram_mib,
                                blocked ? "the pool is over-committed after a ratio change" : fb);
        snprintf(ev->service, sizeof(ev->service), "%s", s.id);
        ev->level = sv->level;
        ev->gpu = p.check_gpu;
        osub_svc_free(sv);
        res->outcome = OSUB_SUBMIT_REJECTED;
        res->rc = rc;
        finish(e); /* the timers that ran may have freed room for others */
        return rc;
    }
    /* reserve everything that can fail, then commit (the timers due have run: the state is
     * the one at now_ms, consistent, without this service) */
    if (p.ok && admit_reserve(e, sv, &p) != 0) {
        osub_svc_free(sv);
        finish(e);
        return OSUB_ENOMEM;
    }
    e->next_seq++;
    tab_insert_raw(e->tab, e->tab_cap, sv);
    e->n_live++;
    sv->prev = e->tail;
    if (e->tail)
        e->tail->next = sv;
    else
        e->head = sv;
    e->tail = sv;

    if (p.ok) {
        admit_apply(e, sv, &p, OSUB_R_FITS);
        res->outcome = sv->state == OSUB_STATE_PENDING ? OSUB_SUBMIT_PENDING : OSUB_SUBMIT_STARTED;
        res->n_gpus = p.k;
        memcpy(res->gpus, p.gpus, sizeof(int32_t) * (size_t)p.k);
        fill_victims(e, &p, res);
    } else {
        queue_push(e, sv);
        res->outcome = OSUB_SUBMIT_QUEUED;
        res->queue_position = (int32_t)queue_pos(e, sv);
        char fb[160];
        describe_failure(&p, fb, sizeof(fb));
        osub_event_t *ev = emit(e, OSUB_EV_QUEUE, blocked ? OSUB_R_OVERCOMMITTED : OSUB_R_NO_ROOM,
                                "queued %s (%s, %lld MiB) at position %d: %s", s.id, s.class_name,
                                (long long)s.vram_mib, res->queue_position,
                                blocked ? "the pool is over-committed after a ratio change" : fb);
        ev_svc(ev, sv);
    }
    finish(e);
    return 0;
}

/* ---- timers, pending, queue, pressure, restore ---------------------------------------- */

static void on_deadline(osub_engine_t *e, struct svc *s)
{
    s->heap_pos[T_DEADLINE] = -1;
    s->timer_at[T_DEADLINE] = 0;
    if (s->state == OSUB_STATE_DEGRADED && s->ack_pending) {
        osub_event_t *ev = emit(e, OSUB_EV_ESCALATE, OSUB_R_ACK_TIMEOUT,
                                "%s did not acknowledge its degrade within %lld ms: evicting it",
                                s->spec.id, (long long)e->cfg.ack_timeout_ms);
        ev_svc(ev, s);
        char cause[OSUB_ID_MAX + 1];
        snprintf(cause, sizeof(cause), "%s", s->preemptor);
        svc_evict(e, s, cause, s->preemptor_level, OSUB_R_ACK_TIMEOUT);
        return;
    }
    if (s->state == OSUB_STATE_DRAINING) {
        set_state(e, s, OSUB_STATE_OVERDUE);
        s->deadline_ms = e->now + s->grace_ms;
        timer_set(e, s, T_DEADLINE, s->deadline_ms);
        osub_event_t *ev = emit(e, OSUB_EV_OVERDUE, OSUB_R_GRACE_OVER,
                                "%s is overdue: its grace period ended and its %lld MiB are not "
                                "seen free yet",
                                s->spec.id, (long long)held_total(s));
        ev_svc(ev, s);
        return;
    }
    if (s->state == OSUB_STATE_OVERDUE) {
        s->deadline_ms = 0;
        /* pending services waiting on it go back to the queue */
        for (size_t i = 0; i < e->n_pending;) {
            struct svc *p = e->pending[i];
            bool waits = false;
            for (int32_t w = 0; w < p->n_waits; w++)
                waits = waits || strcmp(p->waits[w].service, s->spec.id) == 0;
            if (!waits) {
                i++;
                continue;
            }
            if (vec_reserve(&e->queue, &e->cap_queue, e->n_queue + 1) != 0) {
                i++;
                continue;
            }
            svc_to_queue(e, p);
            osub_event_t *ev = emit(e, OSUB_EV_REQUEUE, OSUB_R_VICTIM_OVERDUE,
                                    "%s gave up waiting for %s, overdue for a second grace "
                                    "period, and is back in the queue at position %zu",
                                    p->spec.id, s->spec.id, queue_pos(e, p));
            ev_svc(ev, p);
        }
    }
}

static void on_load(osub_engine_t *e, struct svc *s)
{
    s->heap_pos[T_LOAD] = -1;
    s->timer_at[T_LOAD] = 0;
    if (!s->loading)
        return;
    s->loading = false;
    if (s->state == OSUB_STATE_LOADING)
        set_state(e, s, OSUB_STATE_RUNNING);
    svc_sync(e, s);
    for (int32_t i = 0; i < s->n_slots; i++) /* the reservation was not a peak */
        osub__hist_reset(e, &e->gpus[s->slots[i].gpu]);
    e->dirty = true;
    osub_event_t *ev = emit(e, OSUB_EV_READY, OSUB_R_LOADED,
                            "%s is taken as loaded after %lld ms; held now follows its usage",
                            s->spec.id, (long long)s->restart_cost_ms);
    ev_svc(ev, s);
}

static void run_timers(osub_engine_t *e)
{
    while (e->n_heap > 0 && e->heap[0].at <= e->now) {
        struct timer_ent t = e->heap[0];
        e->n_heap--;
        if (e->n_heap > 0) {
            heap_set(e, 0, e->heap[e->n_heap]);
            heap_down(e, 0);
        }
        int64_t saved = e->now;
        e->now = t.at; /* events carry the time they were due */
        if (t.kind == T_LOAD)
            on_load(e, t.s);
        else
            on_deadline(e, t.s);
        e->now = saved;
    }
}

static void check_overcommit(osub_engine_t *e)
{
    if (!e->overcommitted)
        return;
    for (int32_t i = 0; i < e->n_gpus; i++)
        if (!e->gpus[i].lost && e->gpus[i].granted > e->gpus[i].logical)
            return;
    e->overcommitted = false;
    emit(e, OSUB_EV_OVERCOMMIT, OSUB_R_ROOM_FREED,
         "the grants fit the logical capacity again: admissions resume");
}

static void process_pending(osub_engine_t *e)
{
    for (size_t i = 0; i < e->n_pending;) {
        struct svc *s = e->pending[i];
        if (pending_can_start(e, s)) {
            svc_start(e, s, OSUB_R_ROOM_FREED); /* removes it from the pending list */
            continue;
        }
        i++;
    }
}

/* How many queued services one pass makes full plans for (the head included): a bounded
 * backfill window, so that a long queue costs a bounded time per command. Services that
 * cannot fit anywhere even with every lower level evicted are skipped in O(1) each (room
 * trees) and do not count. Those further back are looked at as the ones ahead leave. */
#define OSUB__QUEUE_WINDOW 2
/* A tick's pass looks further: it runs once per tick, not once per command. A pass after
 * a command looks at most 32 entries deep (filtered), a tick's at most 4096. */
#define OSUB__QUEUE_WINDOW_TICK 64

static void process_queue(osub_engine_t *e)
{
    size_t window = e->in_tick ? OSUB__QUEUE_WINDOW_TICK : OSUB__QUEUE_WINDOW;
    size_t reach = e->in_tick ? 4096 : 32;
    if (e->overcommitted)
        return;
    size_t planned = 0, looked = 0;
    for (size_t i = 0; i < e->n_queue && planned < window && looked < reach; looked++) {
        struct svc *s = e->queue[i];
        struct req r;
        fill_req(e, s, &r);
        r.quiet = true;

        struct plan p;
        if (!osub__may_fit(e, &r, min_share(e, s, &r))) {
            p.ok = false; /* cannot fit even with every lower level evicted: no plan needed */
        } else {
            planned++;
            plan_for(e, s, &r, &p);
        }
        if (p.ok && i > 0) {
            /* backfill: not ahead of the head unless it delays nothing */
            struct svc **q = e->queue;
            (void)q;
            if (!backfill_ok(e, &p, s->level))
                p.ok = false;
        }
        if (!p.ok || admit_reserve(e, s, &p) != 0) {
            if (i == 0 && e->now - s->since_ms >= e->cfg.queue_aging_ms)
                return; /* aged head: nobody passes it */
            i++;
            continue;
        }
        vec_remove(e->queue, &e->n_queue, s);
        admit_apply(e, s, &p, OSUB_R_ROOM_FREED);
        /* the queue shifted: look again from the same position */
    }
}

static void check_pressure(osub_engine_t *e, int32_t gi)
{
    struct gpu *g = &e->gpus[gi];
    if (g->lost || g->held * 100 <= g->usable * e->cfg.high_watermark_pct)
        return;
    /* a loading service's reservation is not memory at risk: only what is really there counts
     * (a lone service as big as its GPU would otherwise be evicted while it loads) */
    if ((g->held - osub__loading_reserve(e, gi)) * 100 <= g->usable * e->cfg.high_watermark_pct)
        return;
    struct plan p;
    osub__plan_pressure(e, gi, &p);
    if (timer_reserve(e, 2 * (size_t)p.n_victims) != 0)
        return;
    for (int32_t i = 0; i < p.n_victims; i++) {
        if (p.acts[i] == ACT_EVICT)
            svc_evict(e, p.victims[i], "", -1, OSUB_R_PRESSURE);
        else
            svc_degrade(e, p.victims[i], "", -1, OSUB_R_PRESSURE);
    }
}

/* Compute contention (DESIGN.md "Compute"): measured compute above 100% of a GPU cuts the
 * batch of one preemptible service there, lowest priority and most recent first, one per
 * report; memory is never touched and nothing is evicted for compute. */
static void check_compute(osub_engine_t *e, int32_t gi)
{
    struct gpu *g = &e->gpus[gi];
    if (g->compute_measured <= 100)
        return;
    for (int32_t i = 0; i < g->nsvc; i++) {
        struct svc *v = g->svcs[i]; /* victim order already */
        if (!osub__svc_victim_eligible(v) || v->batch_degraded || v->batch <= v->floor_batch)
            continue;
        int32_t from = v->batch;
        v->batch = v->floor_batch;
        v->batch_degraded = true;
        v->batch_room_since_ms = -1;
        v->n_degrades++;
        e->degrades++;
        osub_event_t *ev =
            emit(e, OSUB_EV_DEGRADE, OSUB_R_COMPUTE,
                 "cut the batch of %s (%s) from %d to %d: GPU %d's measured "
                 "compute is %d%%; its memory is untouched",
                 v->spec.id, class_of(e, v), from, v->batch, gi, g->compute_measured);
        ev_svc(ev, v);
        ev->batch_size = v->batch;
        ev->vram_mib = grant_total(v);
        return;
    }
}

/* A batch cut for compute comes back when every GPU of the service has stayed at or under
 * 80% measured compute for the hysteresis window. */
static void process_compute_restores(osub_engine_t *e)
{
    for (struct svc *s = e->head; s; s = s->next) {
        if (!s->batch_degraded)
            continue;
        bool calm = true;
        for (int32_t i = 0; i < s->n_slots; i++)
            calm = calm && e->gpus[s->slots[i].gpu].compute_measured <= 80;
        if (!calm) {
            s->batch_room_since_ms = -1;
            continue;
        }
        if (s->batch_room_since_ms < 0)
            s->batch_room_since_ms = e->now;
        if (e->now - s->batch_room_since_ms < e->cfg.hysteresis_ms)
            continue;
        s->batch_degraded = false;
        if (s->state == OSUB_STATE_DEGRADED)
            continue; /* a memory restore brings the batch back with the memory */
        int32_t from = s->batch;
        s->batch = s->full_batch;
        e->restores++;
        osub_event_t *ev = emit(e, OSUB_EV_RESTORE, OSUB_R_COMPUTE,
                                "restored the batch of %s from %d to %d: compute stayed at or "
                                "under 80%% for %lld ms",
                                s->spec.id, from, s->batch, (long long)e->cfg.hysteresis_ms);
        ev_svc(ev, s);
        ev->batch_size = s->batch;
        ev->vram_mib = grant_total(s);
    }
}

static void process(osub_engine_t *e)
{
    if (e->n_pending > 0 && e->pending_check)
        process_pending(e);
    e->pending_check = false;
    for (int round = 0; round < 4 && e->dirty; round++) {
        e->dirty = false;
        check_overcommit(e);
        process_pending(e);
        process_queue(e);
    }
}

/* What a restored slot is expected to hold: its predicted peak's share (its full share
 * when it has no history), or what it uses now if more. */
static int64_t restore_need(const osub_engine_t *e, const struct svc *s, int32_t i)
{
    int64_t full = osub__share(s->full_total, s->k, i);
    int64_t pred = osub__share(
        osub__pred_peak(&s->pred, s->full_total, e->now, e->cfg.prediction_trust_ms), s->k, i);
    return max64(s->slots[i].used, min64(full, pred));
}

/* How far the other oversold services running at full grant on g may still rise above what
 * they hold now, to their predicted peaks: a restore must leave room for that too, or it
 * trades the restored service's unmet demand for a neighbour's OOM. */
static int64_t others_rise(const osub_engine_t *e, const struct gpu *g, const struct svc *s)
{
    int32_t gi = (int32_t)(g - e->gpus);
    int64_t rise = 0;
    for (int32_t j = 0; j < g->nsvc; j++) {
        const struct svc *o = g->svcs[j];
        if (o != s && !o->backed &&
            (o->state == OSUB_STATE_RUNNING || o->state == OSUB_STATE_LOADING))
            rise += osub__slot_rise(e, o, gi);
    }
    return rise;
}

/* Room to restore s on every GPU: its full grant under the logical capacity and what it is
 * expected to hold under the low watermark, counting the room already promised in this pass
 * to services restored (or waiting to be) ahead of it. */
static bool restore_room(const osub_engine_t *e, const struct svc *s)
{
    for (int32_t i = 0; i < s->n_slots; i++) {
        const struct slot *sl = &s->slots[i];
        const struct gpu *g = &e->gpus[sl->gpu];
        int64_t full = osub__share(s->full_total, s->k, i);
        if (g->granted - sl->grant + full > g->logical)
            return false;
        int64_t need = restore_need(e, s, i);
        if ((g->held - sl->held + need + e->promise_buf[sl->gpu] + others_rise(e, g, s)) * 100 >
            g->usable * e->cfg.low_watermark_pct)
            return false;
    }
    return true;
}

static void svc_restore(osub_engine_t *e, struct svc *s)
{
    for (int32_t i = 0; i < s->n_slots; i++) {
        slot_set_grant(e, s, &s->slots[i], osub__share(s->full_total, s->k, i));
        s->slots[i].held_grant = s->slots[i].grant;
    }
    int32_t from_batch = s->batch;
    s->batch = s->full_batch;
    s->batch_degraded = false;
    set_state(e, s, s->loading ? OSUB_STATE_LOADING : OSUB_STATE_RUNNING);
    s->used_capped = false;
    s->room_since_ms = -1;
    e->restores++;
    svc_sync(e, s);
    char gb[96];
    fmt_gpus(s, gb, sizeof(gb));
    osub_event_t *ev =
        emit(e, OSUB_EV_RESTORE, OSUB_R_ROOM_STABLE,
             "restored %s (%s) to %lld MiB on %s, batch %d -> %d: room lasted %lld ms", s->spec.id,
             class_of(e, s), (long long)s->full_total, gb, from_batch, s->batch,
             (long long)e->cfg.hysteresis_ms);
    ev_svc(ev, s);
    ev->vram_mib = s->full_total;
    ev->batch_size = s->batch;
}

static void process_restores(osub_engine_t *e)
{
    int32_t maxl = 0;
    for (size_t c = 0; c < e->n_classes; c++)
        if (e->classes[c].level > maxl)
            maxl = e->classes[c].level;
    bool promised = false;
    for (int32_t lvl = 0; lvl <= maxl; lvl++) {
        for (struct svc *s = e->head; s; s = s->next) {
            if (s->level != lvl || s->state != OSUB_STATE_DEGRADED || s->ack_pending)
                continue;
            if (!restore_room(e, s)) {
                s->room_since_ms = -1;
                continue;
            }
            /* the room is this service's until the pass ends: the next ones need more */
            for (int32_t i = 0; i < s->n_slots; i++) {
                int64_t grow = restore_need(e, s, i) - s->slots[i].held;
                if (grow > 0) {
                    e->promise_buf[s->slots[i].gpu] += grow;
                    promised = true;
                }
            }
            if (s->room_since_ms < 0)
                s->room_since_ms = e->now;
            if (e->now - s->room_since_ms >= e->cfg.hysteresis_ms)
                svc_restore(e, s);
        }
    }
    if (promised)
        memset(e->promise_buf, 0, (size_t)e->n_gpus * sizeof(*e->promise_buf));
}

int osub_engine_tick(osub_engine_t *e, int64_t now_ms)
{
    clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    int rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    for (int32_t i = 0; i < e->n_gpus; i++)
        check_pressure(e, i);
    process_restores(e);
    process_compute_restores(e);
    e->dirty = true;
    e->in_tick = true;
    finish(e);
    e->in_tick = false;
    return 0;
}

/* ---- other commands ------------------------------------------------------------------- */

static int get_svc(osub_engine_t *e, const char *id, struct svc **out)
{
    if (e == NULL || id == NULL)
        return OSUB_EINVAL;
    if (!osub_id_valid(id))
        return OSUB_EBAD_ID;
    *out = lookup(e, id);
    return *out ? 0 : OSUB_EUNKNOWN_SERVICE;
}

int osub_engine_release(osub_engine_t *e, const char *id, int64_t now_ms)
{
    clear_events(e);
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc == 0)
        rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    char gb[96];
    fmt_gpus(s, gb, sizeof(gb));
    osub_event_t *ev =
        emit(e, OSUB_EV_RELEASE, OSUB_R_USER, "released %s (%s, %lld MiB held) from %s", s->spec.id,
             class_of(e, s), (long long)held_total(s), s->n_slots ? gb : "the queue");
    ev_svc(ev, s);
    svc_destroy(e, s);
    finish(e);
    return 0;
}

static int usage_apply(osub_engine_t *e, struct svc *s, const int64_t *per, int32_t compute)
{
    for (int32_t i = 0; i < s->n_slots; i++)
        slot_set_used(e, &s->slots[i], per[i]);
    osub__pred_observe(&s->pred, used_total(s), e->now);
    if (compute >= 0) {
        for (int32_t i = 0; i < s->n_slots; i++)
            e->gpus[s->slots[i].gpu].compute_measured += compute - s->compute_used;
        s->compute_used = compute;
    }
    s->used_capped = false;
    if (s->ack_pending) {
        bool under = true;
        for (int32_t i = 0; i < s->n_slots; i++)
            under = under && s->slots[i].used <= s->slots[i].grant;
        if (under) {
            s->ack_pending = false;
            for (int32_t i = 0; i < s->n_slots; i++)
                s->slots[i].held_grant = s->slots[i].grant;
            timer_cancel(e, s, T_DEADLINE);
            s->deadline_ms = 0;
            osub_event_t *ev =
                emit(e, OSUB_EV_ACK, OSUB_R_USAGE_UNDER_GRANT,
                     "%s reports %lld MiB, at or under its degraded grant of %lld "
                     "MiB: taken as its acknowledgement",
                     s->spec.id, (long long)used_total(s), (long long)grant_total(s));
            ev_svc(ev, s);
        }
    }
    svc_sync(e, s);
    /* usage going down does not scan the queue (the tick does): usage moves all the time,
     * and a pending service is looked at after every command anyway */
    for (int32_t i = 0; i < s->n_slots; i++) {
        check_pressure(e, s->slots[i].gpu);
        if (compute >= 0)
            check_compute(e, s->slots[i].gpu);
    }
    finish(e);
    return 0;
}

int osub_engine_usage(osub_engine_t *e, const char *id, int64_t used_mib, int32_t compute_pct,
                      int64_t now_ms)
{
    clear_events(e);
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (used_mib < 0)
        return OSUB_ENEGATIVE_USAGE;
    if (used_mib > (INT64_C(1) << 40) || compute_pct > 100 * 64)
        return OSUB_EINVAL;
    if (s->n_slots == 0 || s->state == OSUB_STATE_PENDING)
        return OSUB_EBAD_STATE;
    int64_t cap = 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        cap += e->gpus[s->slots[i].gpu].vram;
    if (used_mib > cap)
        return OSUB_EINVAL;
    rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    assert(s->n_slots > 0 && s->state != OSUB_STATE_PENDING); /* timers keep placements */
    int64_t per[64], basis = 0;
    bool by_grant = grant_total(s) > 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        basis += by_grant ? s->slots[i].grant : s->slots[i].held_grant;
    int64_t assigned = 0;
    for (int32_t i = 0; i < s->n_slots; i++) {
        int64_t w = by_grant ? s->slots[i].grant : s->slots[i].held_grant;
        per[i] = basis > 0 ? (int64_t)((osub_i128)used_mib * w / basis) : used_mib / s->n_slots;
        assigned += per[i];
    }
    per[0] += used_mib - assigned;
    return usage_apply(e, s, per, compute_pct);
}

int osub_engine_usage_per_gpu(osub_engine_t *e, const char *id, const int64_t *used_mib, size_t n,
                              int64_t now_ms)
{
    clear_events(e);
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (used_mib == NULL)
        return OSUB_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (used_mib[i] < 0)
            return OSUB_ENEGATIVE_USAGE;
        if (used_mib[i] > (INT64_C(1) << 40))
            return OSUB_EINVAL;
    }
    if (s->n_slots == 0 || s->state == OSUB_STATE_PENDING)
        return OSUB_EBAD_STATE;
    if (n != (size_t)s->n_slots)
        return OSUB_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (used_mib[i] > e->gpus[s->slots[i].gpu].vram)
            return OSUB_EINVAL;
    rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    assert(s->n_slots > 0 && s->state != OSUB_STATE_PENDING && n == (size_t)s->n_slots);
    return usage_apply(e, s, used_mib, -1);
}

int osub_engine_system_usage(osub_engine_t *e, int32_t gpu, int64_t used_mib, int64_t now_ms)
{
    clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (gpu < 0 || gpu >= e->n_gpus)
        return OSUB_EBAD_GPU;
    if (used_mib < 0)
        return OSUB_ENEGATIVE_USAGE;
    if (used_mib > e->gpus[gpu].vram)
        return OSUB_EINVAL;
    if (e->gpus[gpu].lost)
        return OSUB_EGPU_LOST;
    int rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    struct gpu *g = &e->gpus[gpu];
    int64_t d = used_mib - g->system;
    g->system = used_mib;
    gpu_add_held(e, g, d);
    if (d < 0)
        e->dirty = true;
    check_pressure(e, gpu);
    finish(e);
    return 0;
}

int osub_engine_ready(osub_engine_t *e, const char *id, int64_t now_ms)
{
    clear_events(e);
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (s->n_slots == 0 || s->state == OSUB_STATE_PENDING)
        return OSUB_EBAD_STATE;
    rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    if (s->loading) {
        s->loading = false;
        timer_cancel(e, s, T_LOAD);
        if (s->state == OSUB_STATE_LOADING)
            set_state(e, s, OSUB_STATE_RUNNING);
        svc_sync(e, s);
        for (int32_t i = 0; i < s->n_slots; i++) /* the reservation was not a peak */
            osub__hist_reset(e, &e->gpus[s->slots[i].gpu]);
        e->dirty = true;
        osub_event_t *ev = emit(e, OSUB_EV_READY, OSUB_R_USER,
                                "%s reported ready; held now follows its usage (%lld MiB)",
                                s->spec.id, (long long)held_total(s));
        ev_svc(ev, s);
    }
    finish(e);
    return 0;
}

int osub_engine_ack(osub_engine_t *e, const char *id, const char *checkpoint, int64_t now_ms)
{
    clear_events(e);
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    bool draining = s->state == OSUB_STATE_DRAINING || s->state == OSUB_STATE_OVERDUE;
    if (!s->ack_pending && !draining)
        return OSUB_ENO_DIRECTIVE;
    rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    if (checkpoint != NULL)
        snprintf(s->checkpoint, sizeof(s->checkpoint), "%s", checkpoint);
    if (s->ack_pending) {
        s->ack_pending = false;
        for (int32_t i = 0; i < s->n_slots; i++)
            s->slots[i].held_grant = s->slots[i].grant;
        s->used_capped = true;
        timer_cancel(e, s, T_DEADLINE);
        s->deadline_ms = 0;
        svc_sync(e, s);
        e->dirty = true;
        osub_event_t *ev = emit(e, OSUB_EV_ACK, OSUB_R_ACKNOWLEDGED,
                                "%s acknowledged its degrade to %lld MiB; it now holds %lld MiB",
                                s->spec.id, (long long)grant_total(s), (long long)held_total(s));
        ev_svc(ev, s);
    } else {
        osub_event_t *ev =
            emit(e, OSUB_EV_ACK, OSUB_R_ACKNOWLEDGED, "%s acknowledged its eviction%s%s",
                 s->spec.id, s->checkpoint[0] ? "; checkpoint " : "", s->checkpoint);
        ev_svc(ev, s);
    }
    finish(e);
    return 0;
}

int osub_engine_exited(osub_engine_t *e, const char *id, const char *checkpoint, int64_t now_ms)
{
    clear_events(e);
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (vec_reserve(&e->queue, &e->cap_queue, e->n_queue + 1) != 0)
        return OSUB_ENOMEM;
    rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    if (checkpoint != NULL)
        snprintf(s->checkpoint, sizeof(s->checkpoint), "%s", checkpoint);
    bool evicted = s->state == OSUB_STATE_DRAINING || s->state == OSUB_STATE_OVERDUE;
    if (!evicted) {
        osub_event_t *ev = emit(e, OSUB_EV_EXITED, OSUB_R_USER, "%s (%s) exited while %s",
                                s->spec.id, class_of(e, s), osub_state_name(s->state));
        ev_svc(ev, s);
    }
    svc_gone(e, s, OSUB_R_EVICTED, evicted);
    finish(e);
    return 0;
}

int osub_engine_fail(osub_engine_t *e, const char *id, const char *why, int64_t now_ms)
{
    clear_events(e);
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc == 0)
        rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    osub_event_t *ev = emit(e, OSUB_EV_FAIL, OSUB_R_USER, "%s (%s) failed: %s", s->spec.id,
                            class_of(e, s), why ? why : "no reason given");
    ev_svc(ev, s);
    svc_destroy(e, s);
    finish(e);
    return 0;
}

int osub_engine_resize(osub_engine_t *e, const char *id, int64_t vram_mib, int64_t min_vram_mib,
                       int32_t batch_size, int64_t now_ms)
{
    clear_events(e);
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (vram_mib < 0 || min_vram_mib < 0 || vram_mib > (INT64_C(1) << 40))
        return OSUB_EBAD_VRAM;
    if (batch_size < 0)
        return OSUB_EBAD_BATCH;
    int64_t nv = vram_mib ? vram_mib : s->full_total;
    int64_t nm = min_vram_mib ? min_vram_mib
                              : (s->floor_total == s->full_total && vram_mib ? nv : s->floor_total);
    if (nm > nv)
        return vram_mib ? OSUB_ENO_SHRINK_BELOW_MIN : OSUB_EBAD_MIN_VRAM;
    if (nm < s->k)
        return OSUB_EBAD_MIN_VRAM;
    if (s->spec.exclusive && vram_mib)
        return OSUB_EBAD_STATE;
    int32_t nb = batch_size ? batch_size : s->full_batch;
    if (s->floor_batch > nb)
        return OSUB_EBAD_BATCH;
    rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    /* growing: checks on its GPUs, no victims (timers due by now_ms never add held memory, so
     * the room checked here is there after they run) */
    bool degraded = s->state == OSUB_STATE_DEGRADED;
    if (s->n_slots > 0 && s->state != OSUB_STATE_DRAINING && s->state != OSUB_STATE_OVERDUE) {
        for (int32_t i = 0; i < s->n_slots; i++) {
            const struct slot *sl = &s->slots[i];
            const struct gpu *g = &e->gpus[sl->gpu];
            int64_t ng = degraded ? osub__share(nm, s->k, i) : osub__share(nv, s->k, i);
            int64_t d = ng - sl->grant;
            if (d <= 0)
                continue;
            if (g->granted + d > g->logical || (s->backed && g->backed + d > g->usable) ||
                ((s->backed || s->loading || s->state == OSUB_STATE_PENDING) &&
                 g->held + d > g->usable))
                return OSUB_ENO_ROOM;
        }
    }
    advance(e, now_ms);
    int64_t from = s->full_total;
    s->full_total = s->spec.vram_mib = nv;
    s->floor_total = s->spec.min_vram_mib = nm;
    s->degradable = s->preemptible && nm < nv;
    s->full_batch = s->spec.batch_size = nb;
    if (s->n_slots > 0 && s->state != OSUB_STATE_DRAINING && s->state != OSUB_STATE_OVERDUE) {
        for (int32_t i = 0; i < s->n_slots; i++) {
            int64_t ng = degraded ? osub__share(nm, s->k, i) : osub__share(nv, s->k, i);
            if (ng < s->slots[i].grant)
                e->dirty = true;
            slot_set_grant(e, s, &s->slots[i], ng);
            if (!s->ack_pending)
                s->slots[i].held_grant = ng;
        }
        if (!degraded)
            s->batch = nb;
        svc_sync(e, s);
    } else if (s->state == OSUB_STATE_QUEUED) {
        s->batch = nb;
        e->dirty = true;
    }
    osub_event_t *ev = emit(e, OSUB_EV_RESIZE, OSUB_R_USER,
                            "resized %s from %lld to %lld MiB (floor %lld MiB, batch %d)",
                            s->spec.id, (long long)from, (long long)nv, (long long)nm, nb);
    ev_svc(ev, s);
    ev->vram_mib = grant_total(s);
    finish(e);
    return 0;
}

int osub_engine_set_ratio(osub_engine_t *e, int32_t ratio_milli, int64_t now_ms)
{
    clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (ratio_milli < 1000 || ratio_milli > 100000)
        return OSUB_ERATIO_RANGE;
    int rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    int32_t old = e->cfg.ratio_milli;
    e->cfg.ratio_milli = ratio_milli;
    bool over = false;
    for (int32_t i = 0; i < e->n_gpus; i++) {
        struct gpu *g = &e->gpus[i];
        g->logical = g->vram * ratio_milli / 1000;
        osub__gpu_touch(e, g);
        if (!g->lost && g->granted > g->logical)
            over = true;
    }
    emit(e, OSUB_EV_RATIO, OSUB_R_USER, "oversell ratio changed from %d.%03d to %d.%03d",
         old / 1000, old % 1000, ratio_milli / 1000, ratio_milli % 1000);
    if (over && !e->overcommitted)
        emit(e, OSUB_EV_OVERCOMMIT, OSUB_R_OVERCOMMITTED,
             "the pool is over-committed: grants exceed the new logical capacity; nothing is "
             "evicted, and nothing is admitted until the grants fit again");
    e->overcommitted = over;
    e->dirty = true;
    finish(e);
    return 0;
}

int osub_engine_cordon(osub_engine_t *e, int32_t gpu, bool cordon, int64_t now_ms)
{
    clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (gpu < 0 || gpu >= e->n_gpus)
        return OSUB_EBAD_GPU;
    if (e->gpus[gpu].lost)
        return OSUB_EGPU_LOST;
    int rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    if (e->gpus[gpu].cordoned != cordon) {
        e->gpus[gpu].cordoned = cordon;
        osub__gpu_touch(e, &e->gpus[gpu]);
        osub_event_t *ev = emit(e, cordon ? OSUB_EV_CORDON : OSUB_EV_UNCORDON, OSUB_R_USER,
                                cordon ? "GPU %d cordoned: no new placements"
                                       : "GPU %d uncordoned: it takes placements again",
                                gpu);
        ev->gpu = gpu;
        e->dirty = !cordon;
    }
    finish(e);
    return 0;
}

int osub_engine_drain_gpu(osub_engine_t *e, int32_t gpu, int64_t now_ms)
{
    clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (gpu < 0 || gpu >= e->n_gpus)
        return OSUB_EBAD_GPU;
    if (e->gpus[gpu].lost)
        return OSUB_EGPU_LOST;
    if (timer_reserve(e, (size_t)e->gpus[gpu].nsvc) != 0)
        return OSUB_ENOMEM;
    int rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    struct gpu *g = &e->gpus[gpu];
    if (!g->cordoned) {
        g->cordoned = true;
        osub__gpu_touch(e, g);
        osub_event_t *ev =
            emit(e, OSUB_EV_CORDON, OSUB_R_USER, "GPU %d cordoned for draining", gpu);
        ev->gpu = gpu;
    }
    for (int32_t i = g->nsvc - 1; i >= 0; i--) {
        struct svc *s = g->svcs[i];
        if (osub__svc_victim_eligible(s))
            svc_evict(e, s, "", -1, OSUB_R_USER);
    }
    finish(e);
    return 0;
}

int osub_engine_gpu_lost(osub_engine_t *e, int32_t gpu, int64_t now_ms)
{
    clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (gpu < 0 || gpu >= e->n_gpus)
        return OSUB_EBAD_GPU;
    if (e->gpus[gpu].lost)
        return OSUB_EGPU_LOST;
    if (vec_reserve(&e->queue, &e->cap_queue, e->n_queue + (size_t)e->gpus[gpu].nsvc) != 0)
        return OSUB_ENOMEM;
    int rc = check_time(e, now_ms);
    if (rc != 0)
        return rc;
    advance(e, now_ms);
    struct gpu *g = &e->gpus[gpu];
    g->lost = true;
    osub__gpu_touch(e, g);
    refresh_sizes(e);
    osub_event_t *ev = emit(e, OSUB_EV_GPU_LOST, OSUB_R_GPU_LOST,
                            "GPU %d (%s) is lost with %d service(s) on it", gpu, g->name, g->nsvc);
    ev->gpu = gpu;
    while (g->nsvc > 0) {
        struct svc *s = g->svcs[g->nsvc - 1];
        if (s->state == OSUB_STATE_PENDING || s->requeue_on_evict) {
            if (s->state != OSUB_STATE_PENDING)
                s->evicted_before = true;
            svc_to_queue(e, s);
            ev = emit(e, OSUB_EV_REQUEUE, OSUB_R_GPU_LOST,
                      "%s (%s) lost GPU %d and is back in the queue at position %zu", s->spec.id,
                      class_of(e, s), gpu, queue_pos(e, s));
            ev_svc(ev, s);
        } else {
            ev = emit(e, OSUB_EV_RELEASE, OSUB_R_GPU_LOST, "%s (%s) released: GPU %d is lost",
                      s->spec.id, class_of(e, s), gpu);
            ev_svc(ev, s);
            ev->gpu = gpu;
            svc_destroy(e, s);
        }
    }
    gpu_add_held(e, g, -g->system);
    g->system = 0;
    e->dirty = true;
    finish(e);
    return 0;
}

/* ---- queries ---------------------------------------------------------------------------- */

const osub_event_t *osub_engine_events(const osub_engine_t *e, size_t *n_out)
{
    *n_out = e->n_events;
    return e->events;
}

int64_t osub_engine_next_deadline(const osub_engine_t *e)
{
    return e->n_heap ? e->heap[0].at : INT64_MAX;
}

void osub_engine_config(const osub_engine_t *e, osub_pool_config_t *cfg)
{
    *cfg = e->cfg;
}

const osub_class_t *osub_engine_classes(const osub_engine_t *e, size_t *n_out)
{
    *n_out = e->n_classes;
    return e->classes;
}

size_t osub_engine_gpu_count(const osub_engine_t *e)
{
    return (size_t)e->n_gpus;
}

int osub_engine_gpu_info(const osub_engine_t *e, int32_t gpu, osub_gpu_info_t *out)
{
    if (gpu < 0 || gpu >= e->n_gpus)
        return OSUB_EBAD_GPU;
    const struct gpu *g = &e->gpus[gpu];
    memset(out, 0, sizeof(*out));
    out->index = gpu;
    snprintf(out->name, sizeof(out->name), "%s", g->name);
    out->vram_mib = g->vram;
    out->usable_mib = g->usable;
    out->logical_mib = g->logical;
    out->granted_mib = g->granted;
    out->backed_mib = g->backed;
    out->held_mib = g->held;
    out->used_mib = g->used + g->system;
    out->system_mib = g->system;
    out->compute_claimed_pct = g->compute_all;
    out->compute_backed_pct = g->compute_backed;
    out->n_services = g->nsvc;
    out->cordoned = g->cordoned;
    out->lost = g->lost;
    out->exclusive = g->excl != NULL;
    return 0;
}

void osub_engine_pool_info(const osub_engine_t *e, osub_pool_info_t *out)
{
    memset(out, 0, sizeof(*out));
    out->ratio_milli = e->cfg.ratio_milli;
    for (int32_t i = 0; i < e->n_gpus; i++) {
        const struct gpu *g = &e->gpus[i];
        if (g->lost) {
            out->n_lost++;
            continue;
        }
        out->n_gpus++;
        out->vram_mib += g->vram;
        out->usable_mib += g->usable;
        out->logical_mib += g->logical;
        out->granted_mib += g->granted;
        out->held_mib += g->held;
        out->used_mib += g->used + g->system;
        out->system_mib += g->system;
    }
    out->n_services = (int32_t)e->n_live;
    out->n_queued = (int32_t)e->n_queue;
    out->n_pending = (int32_t)e->n_pending;
    out->overcommitted = e->overcommitted;
    out->admissions = e->admissions;
    out->rejections = e->rejections;
    out->degrades = e->degrades;
    out->evictions = e->evictions;
    out->restores = e->restores;
    out->resumes = e->resumes;
    out->events_lost = e->events_lost;
}

size_t osub_engine_service_count(const osub_engine_t *e)
{
    return e->n_live;
}

const char *osub_engine_service_id(const osub_engine_t *e, size_t i)
{
    const struct svc *s = e->head;
    while (s && i > 0) {
        s = s->next;
        i--;
    }
    return s ? s->spec.id : NULL;
}

int osub_engine_service_info(osub_engine_t *e, const char *id, osub_service_info_t *out)
{
    struct svc *s;
    int rc = get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    memset(out, 0, sizeof(*out));
    if (s->slot_info == NULL) {
        s->slot_info = calloc((size_t)s->k, sizeof(*s->slot_info));
        if (s->slot_info == NULL)
            return OSUB_ENOMEM;
    }
    out->spec = &s->spec;
    out->state = s->state;
    out->level = s->level;
    out->backed = s->backed;
    out->preemptible = s->preemptible;
    out->degradable = s->degradable;
    out->loading = s->loading;
    out->ack_pending = s->ack_pending;
    out->resumed = s->resumed;
    out->grant_mib = grant_total(s);
    out->held_mib = held_total(s);
    out->used_mib = used_total(s);
    out->predicted_peak_mib =
        osub__pred_peak(&s->pred, s->full_total, e->now, e->cfg.prediction_trust_ms);
    out->charge_mib = osub__charge_total(e, s);
    out->usage_reports = s->pred.n;
    out->place_projected_mib = s->place_projected;
    out->place_limit_mib = s->place_limit;
    out->place_charge_mib = s->place_charge;
    out->batch_size = s->batch;
    out->submitted_ms = s->submit_ms;
    out->since_ms = s->since_ms;
    out->deadline_ms = s->deadline_ms;
    out->n_slots = s->n_slots;
    for (int32_t i = 0; i < s->n_slots; i++) {
        s->slot_info[i].gpu = s->slots[i].gpu;
        s->slot_info[i].grant_mib = s->slots[i].grant;
        s->slot_info[i].held_mib = s->slots[i].held;
        s->slot_info[i].used_mib = s->slots[i].used;
    }
    out->slots = s->slot_info;
    out->queue_position = s->state == OSUB_STATE_QUEUED ? (int32_t)queue_pos(e, s) : 0;
    out->n_waits = s->state == OSUB_STATE_PENDING ? s->n_waits : 0;
    out->waits = s->waits;
    out->evictions = s->n_evictions;
    out->degrades = s->n_degrades;
    snprintf(out->checkpoint, sizeof(out->checkpoint), "%s", s->checkpoint);
    return 0;
}

size_t osub_engine_queue_length(const osub_engine_t *e)
{
    return e->n_queue;
}

const char *osub_engine_queue_at(const osub_engine_t *e, size_t pos)
{
    return pos < e->n_queue ? e->queue[pos]->spec.id : NULL;
}

/* ---- dump and invariant check (for tests and debugging) ------------------------------ */

void osub_sb_printf(struct osub_sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)w < b->cap - b->n) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = (b->cap + (size_t)w + 1) * 2;
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

char *osub_engine_dump(const osub_engine_t *e)
{
    struct osub_sbuf b = {.p = malloc(4096), .cap = 4096};
    if (b.p == NULL)
        return NULL;
    b.p[0] = '\0';
    const osub_pool_config_t *c = &e->cfg;
    osub_sb_printf(&b, "now %lld ratio %d compute_ratio %d margin %lld wm %d/%d over %d seq %llu\n",
                   (long long)e->now, c->ratio_milli, c->compute_ratio_milli,
                   (long long)c->margin_mib, c->high_watermark_pct, c->low_watermark_pct,
                   e->overcommitted, (unsigned long long)e->next_seq);
    osub_sb_printf(&b, "counters adm %llu rej %llu deg %llu evi %llu res %llu rsm %llu\n",
                   (unsigned long long)e->admissions, (unsigned long long)e->rejections,
                   (unsigned long long)e->degrades, (unsigned long long)e->evictions,
                   (unsigned long long)e->restores, (unsigned long long)e->resumes);
    for (int32_t i = 0; i < e->n_gpus; i++) {
        const struct gpu *g = &e->gpus[i];
        osub_sb_printf(
            &b,
            "gpu %d %s vram %lld usable %lld logical %lld granted %lld backed %lld held %lld "
            "used %lld system %lld compute %d/%d/%d cordoned %d lost %d excl %s svcs",
            i, g->name, (long long)g->vram, (long long)g->usable, (long long)g->logical,
            (long long)g->granted, (long long)g->backed, (long long)g->held, (long long)g->used,
            (long long)g->system, g->compute_all, g->compute_backed, g->compute_measured,
            g->cordoned, g->lost, g->excl ? g->excl->spec.id : "-");
        for (int32_t j = 0; j < g->nsvc; j++)
            osub_sb_printf(&b, " %s", g->svcs[j]->spec.id);
        osub_sb_printf(&b, "\n");
    }
    for (const struct svc *s = e->head; s; s = s->next) {
        const osub_spec_t *p = &s->spec;
        osub_sb_printf(
            &b,
            "svc %s class %s vram %lld min %lld gpus %d compute %d batch %d/%d excl %d "
            "pre %d res %d onev %d rc %lld q %d grace %lld | seq %llu state %s load %d "
            "ack %d cap %d resumed %d evb %d ad %d batch %d submit %lld since %lld start %lld "
            "resume %lld deadline %lld room %lld cp '%s' by '%s'/%d ev %u dg %u "
            "timers %lld/%lld cu %d bd %d slots",
            p->id, p->class_name, (long long)p->vram_mib, (long long)p->min_vram_mib, p->gpus,
            p->compute_pct, p->batch_size, p->min_batch_size, p->exclusive, (int)p->preemptible,
            p->resumable, (int)p->on_evict, (long long)p->restart_cost_ms, (int)p->queue,
            (long long)p->grace_ms, (unsigned long long)s->seq, osub_state_name(s->state),
            s->loading, s->ack_pending, s->used_capped, s->resumed, s->evicted_before, s->adopted,
            s->batch, (long long)s->submit_ms, (long long)s->since_ms, (long long)s->start_ms,
            (long long)s->resume_ms, (long long)s->deadline_ms, (long long)s->room_since_ms,
            s->checkpoint, s->preemptor, s->preemptor_level, s->n_evictions, s->n_degrades,
            (long long)s->timer_at[0], (long long)s->timer_at[1], s->compute_used,
            s->batch_degraded);
        for (int32_t i = 0; i < s->n_slots; i++)
            osub_sb_printf(&b, " [%d g%lld hg%lld u%lld h%lld]", s->slots[i].gpu,
                           (long long)s->slots[i].grant, (long long)s->slots[i].held_grant,
                           (long long)s->slots[i].used, (long long)s->slots[i].held);
        if (s->state == OSUB_STATE_PENDING)
            for (int32_t i = 0; i < s->n_waits; i++)
                osub_sb_printf(&b, " wait(%s,%d,%lld)", s->waits[i].service, s->waits[i].evict,
                               (long long)s->waits[i].deadline_ms);
        osub_sb_printf(&b, "\n");
    }
    osub_sb_printf(&b, "queue");
    for (size_t i = 0; i < e->n_queue; i++)
        osub_sb_printf(&b, " %s", e->queue[i]->spec.id);
    osub_sb_printf(&b, "\npending");
    for (size_t i = 0; i < e->n_pending; i++)
        osub_sb_printf(&b, " %s", e->pending[i]->spec.id);
    osub_sb_printf(&b, "\n");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

OSUB_PRINTF(3, 4)
static int fail_why(char *why, size_t len, const char *fmt, ...)
{
    if (why != NULL && len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return OSUB_EINVAL;
}

int osub_engine_check(const osub_engine_t *e, char *why, size_t why_len)
{
    int32_t n = e->n_gpus;
    int64_t *sum = calloc((size_t)n * 4, sizeof(int64_t));
    int32_t *cnt = calloc((size_t)n, sizeof(int32_t));
    int32_t *pend = calloc((size_t)n, sizeof(int32_t));
    int32_t *comp = calloc((size_t)n, sizeof(int32_t));
    int rc = 0;
    if (sum == NULL || cnt == NULL || pend == NULL || comp == NULL) {
        free(sum);
        free(cnt);
        free(pend);
        free(comp);
        snprintf(why, why_len, "out of memory while checking");
        return OSUB_ENOMEM;
    }
    size_t live = 0, queued = 0, pending = 0;
    for (const struct svc *s = e->head; s && rc == 0; s = s->next) {
        live++;
        if (lookup(e, s->spec.id) != s)
            rc = fail_why(why, why_len, "%s is not found by its id", s->spec.id);
        if (s->state == OSUB_STATE_QUEUED) {
            queued++;
            if (s->n_slots != 0)
                rc = fail_why(why, why_len, "queued %s holds a placement", s->spec.id);
        }
        if (s->state == OSUB_STATE_PENDING)
            pending++;
        bool running = s->state == OSUB_STATE_LOADING || s->state == OSUB_STATE_RUNNING ||
                       s->state == OSUB_STATE_DEGRADED;
        if (running && s->n_slots != s->k)
            rc = fail_why(why, why_len, "%s runs on %d GPUs, not %d", s->spec.id, s->n_slots, s->k);
        if (running && !s->spec.exclusive && grant_total(s) < s->floor_total)
            rc = fail_why(why, why_len, "invariant 5: %s grant %lld below its floor %lld",
                          s->spec.id, (long long)grant_total(s), (long long)s->floor_total);
        if (s->backed && running && grant_total(s) < s->full_total && !s->spec.exclusive)
            rc = fail_why(why, why_len, "invariant 1: backed %s holds less than its request",
                          s->spec.id);
        for (int32_t i = 0; i < s->n_slots && rc == 0; i++) {
            const struct slot *sl = &s->slots[i];
            if (sl->held != slot_held(s, sl))
                rc = fail_why(why, why_len, "%s slot %d cached held %lld != %lld", s->spec.id, i,
                              (long long)sl->held, (long long)slot_held(s, sl));
            if (sl->grant < 0 || sl->used < 0)
                rc = fail_why(why, why_len, "%s slot %d negative", s->spec.id, i);
            sum[sl->gpu * 4 + 0] += sl->grant;
            if (s->backed)
                sum[sl->gpu * 4 + 1] += sl->grant;
            sum[sl->gpu * 4 + 2] += sl->held;
            sum[sl->gpu * 4 + 3] += sl->used;
            cnt[sl->gpu]++;
            if (s->state == OSUB_STATE_PENDING)
                pend[sl->gpu]++;
            comp[sl->gpu] += s->compute_used;
        }
    }
    if (rc == 0 && live != e->n_live)
        rc = fail_why(why, why_len, "live count %zu != %zu", live, e->n_live);
    if (rc == 0 && queued != e->n_queue)
        rc = fail_why(why, why_len, "queue length %zu != %zu queued", e->n_queue, queued);
    if (rc == 0 && pending != e->n_pending)
        rc = fail_why(why, why_len, "pending length %zu != %zu", e->n_pending, pending);
    for (size_t i = 1; i < e->n_queue && rc == 0; i++)
        if (queue_before(e->queue[i], e->queue[i - 1]))
            rc = fail_why(why, why_len, "queue out of order at %zu", i);
    for (int32_t i = 0; i < n && rc == 0; i++) {
        const struct gpu *g = &e->gpus[i];
        if (g->granted != sum[i * 4] || g->backed != sum[i * 4 + 1] ||
            g->held != sum[i * 4 + 2] + g->system || g->used != sum[i * 4 + 3] || g->nsvc != cnt[i])
            rc = fail_why(why, why_len,
                          "invariant 4: GPU %d totals granted %lld/%lld backed %lld/%lld held "
                          "%lld/%lld used %lld/%lld svcs %d/%d",
                          i, (long long)g->granted, (long long)sum[i * 4], (long long)g->backed,
                          (long long)sum[i * 4 + 1], (long long)g->held,
                          (long long)(sum[i * 4 + 2] + g->system), (long long)g->used,
                          (long long)sum[i * 4 + 3], g->nsvc, cnt[i]);
        else if (!e->overcommitted && g->granted > g->logical)
            rc = fail_why(why, why_len, "invariant 3: GPU %d grants %lld > logical %lld", i,
                          (long long)g->granted, (long long)g->logical);
        else if (g->backed > g->usable)
            rc = fail_why(why, why_len, "invariant 3: GPU %d backed %lld > usable %lld", i,
                          (long long)g->backed, (long long)g->usable);
        else if (g->lost && g->nsvc > 0)
            rc = fail_why(why, why_len, "lost GPU %d still has services", i);
        else if (g->compute_measured != comp[i])
            rc = fail_why(why, why_len, "GPU %d measured compute %d, services say %d", i,
                          g->compute_measured, comp[i]);
        else if (g->n_pending != pend[i])
            rc = fail_why(why, why_len, "GPU %d counts %d pending, not %d", i, g->n_pending,
                          pend[i]);
        for (int32_t j = 1; j < g->nsvc && rc == 0; j++)
            if (svc_before(g->svcs[j], g->svcs[j - 1]))
                rc = fail_why(why, why_len, "GPU %d service list out of order", i);
    }
    free(sum);
    free(cnt);
    free(pend);
    free(comp);
    return rc;
}

uint64_t osub__verify_plans(osub_engine_t *e, bool on, const char **last)
{
    e->verify_plans = on;
    if (last != NULL)
        *last = e->verify_last;
    return e->verify_mismatches;
}

/* ---- restoring from a snapshot (snapshot.c reads, this wires) ------------------------- */

struct svc *osub__lookup(const osub_engine_t *e, const char *id)
{
    return lookup(e, id);
}

int osub__restore_service(osub_engine_t *e, struct svc *s)
{
    if (tab_reserve(e) != 0 || timer_reserve(e, 2) != 0)
        return OSUB_ENOMEM;
    for (int32_t i = 0; i < s->n_slots; i++)
        if (gpu_list_reserve(&e->gpus[s->slots[i].gpu]) != 0)
            return OSUB_ENOMEM;
    tab_insert_raw(e->tab, e->tab_cap, s);
    e->n_live++;
    s->prev = e->tail;
    s->next = NULL;
    if (e->tail)
        e->tail->next = s;
    else
        e->head = s;
    e->tail = s;
    for (int32_t i = 0; i < s->n_slots; i++) {
        struct slot *sl = &s->slots[i];
        struct gpu *g = &e->gpus[sl->gpu];
        g->granted += sl->grant;
        if (s->backed)
            g->backed += sl->grant;
        g->used += sl->used;
        sl->held = slot_held(s, sl);
        g->held += sl->held; /* not through gpu_add_held: the history ring is restored as saved */
        g->compute_all += s->spec.compute_pct;
        if (s->backed)
            g->compute_backed += s->spec.compute_pct;
        g->compute_measured += s->compute_used;
        if (s->spec.exclusive)
            g->excl = s;
        if (s->state == OSUB_STATE_PENDING)
            g->n_pending++;
        gpu_list_add(e, g, s);
    }
    s->heap_pos[0] = s->heap_pos[1] = -1;
    for (int kind = 0; kind < T__KINDS; kind++) {
        int64_t at = s->timer_at[kind];
        if (at != 0)
            timer_set(e, s, kind, at);
    }
    return 0;
}

int osub__restore_lists(osub_engine_t *e, struct svc **queue, size_t nq, struct svc **pending,
                        size_t np)
{
    if (vec_reserve(&e->queue, &e->cap_queue, nq + 1) != 0 ||
        vec_reserve(&e->pending, &e->cap_pending, np + 1) != 0)
        return OSUB_ENOMEM;
    if (nq > 0)
        memcpy(e->queue, queue, nq * sizeof(*queue));
    e->n_queue = nq;
    if (np > 0)
        memcpy(e->pending, pending, np * sizeof(*pending));
    e->n_pending = np;
    return 0;
}

void osub__restore_done(osub_engine_t *e)
{
    refresh_sizes(e);
    for (int32_t i = 0; i < e->n_gpus; i++)
        osub__gpu_touch(e, &e->gpus[i]);
}
