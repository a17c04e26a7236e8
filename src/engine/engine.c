/* engine.c - the engine's containers (services, timers, lists), accounting, the transitions of a
 * service, and the engine's lifetime */
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
    cfg->suspend_host_mib = 0;
    cfg->suspend_mib_per_s = 4096;
    cfg->suspend_timeout_ms = 30000;
    cfg->suspend_min_runtime_ms = 60000;
}

void osub_spec_init(osub_spec_t *spec, const char *id, const char *class_name)
{
    memset(spec, 0, sizeof(*spec));
    if (id != NULL)
        osub__str_copy(spec->id, sizeof(spec->id), id);
    osub__str_copy(spec->class_name, sizeof(spec->class_name),
                   class_name != NULL ? class_name : "batch");
    spec->preemptible = OSUB_TRI_DEFAULT;
    spec->queue = OSUB_TRI_DEFAULT;
    spec->on_evict = OSUB_ON_EVICT_DEFAULT;
    spec->restart_cost_ms = -1;
    spec->grace_ms = -1;
    spec->resume_cost_ms = -1;
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

static const char *const state_names[] = {"queued",   "pending",    "loading",   "running",
                                          "degraded", "draining",   "overdue",   "failed",
                                          "released", "suspending", "suspended", "resuming"};

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

const osub_class_t *osub__find_class(const osub_engine_t *e, const char *name)
{
    for (size_t i = 0; i < e->n_classes; i++)
        if (strcmp(e->classes[i].name, name) == 0)
            return &e->classes[i];
    return NULL;
}

const char *osub__class_of(const osub_engine_t *e, const struct svc *s)
{
    (void)e;
    return s->spec.class_name;
}

void osub__fmt_gpus(const struct svc *s, char *buf, size_t len)
{
    const char *head = s->n_slots == 1 ? "GPU " : "GPUs ";
    osub__str_copy(buf, len, head);
    size_t off = strlen(head);
    /* each piece below is at most 11 bytes and written only with 12 to spare: never cut */
    for (int32_t i = 0; i < s->n_slots && off + 12 < len; i++) {
        if (i >= 8) {
            memcpy(buf + off, ",...", 5);
            return;
        }
        char d[12];
        size_t n = sizeof(d);
        uint32_t v = (uint32_t)s->slots[i].gpu; /* an index: never negative */
        do {
            d[--n] = (char)('0' + v % 10);
            v /= 10;
        } while (v != 0);
        if (i > 0)
            d[--n] = ',';
        memcpy(buf + off, d + n, sizeof(d) - n);
        off += sizeof(d) - n;
        buf[off] = '\0';
    }
}

int64_t osub__grant_total(const struct svc *s)
{
    int64_t t = 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        t += s->slots[i].grant;
    return t;
}

int64_t osub__used_total(const struct svc *s)
{
    int64_t t = 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        t += s->slots[i].used;
    return t;
}

int64_t osub__held_total(const struct svc *s)
{
    int64_t t = 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        t += s->slots[i].held;
    return t;
}

/* ---- events --------------------------------------------------------------------------- */

OSUB_PRINTF(4, 5)
osub_event_t *osub__emit(osub_engine_t *e, osub_event_kind_t kind, osub_reason_t reason,
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
    osub__vfmt(ev->msg, sizeof(ev->msg), fmt, ap);
    va_end(ap);
    return ev;
}

void osub__ev_svc(osub_event_t *ev, const struct svc *s)
{
    osub__str_copy(ev->service, sizeof(ev->service), s->spec.id);
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

struct svc *osub__e_lookup(const osub_engine_t *e, const char *id)
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

void osub__tab_insert_raw(struct svc **tab, size_t cap, struct svc *s)
{
    size_t m = cap - 1;
    size_t i = fnv1a(s->spec.id) & m;
    while (tab[i] != NULL) {
        assert(tab[i] != s && strcmp(tab[i]->spec.id, s->spec.id) != 0); /* ids are unique */
        i = (i + 1) & m;
    }
    tab[i] = s;
}

int osub__tab_reserve(osub_engine_t *e)
{
    if ((e->n_live + 1) * 2 <= e->tab_cap)
        return 0;
    size_t cap = e->tab_cap ? e->tab_cap * 2 : 64;
    struct svc **t = calloc(cap, sizeof(*t));
    if (t == NULL)
        return OSUB_ENOMEM;
    for (size_t i = 0; i < e->tab_cap; i++)
        if (e->tab[i] != NULL)
            osub__tab_insert_raw(t, cap, e->tab[i]);
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

void osub__heap_set(osub_engine_t *e, size_t i, struct timer_ent t)
{
    assert(i < e->cap_heap && t.kind >= 0 && t.kind < T__KINDS);
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
        osub__heap_set(e, i, e->heap[p]);
        i = p;
    }
    osub__heap_set(e, i, t);
}

void osub__heap_down(osub_engine_t *e, size_t i)
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
        osub__heap_set(e, i, e->heap[c]);
        i = c;
    }
    osub__heap_set(e, i, t);
}

void osub__timer_cancel(osub_engine_t *e, struct svc *s, int kind)
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
    osub__heap_set(e, i, last);
    heap_up(e, i);
    osub__heap_down(e, (size_t)last.s->heap_pos[last.kind]);
}

/* Timers are set only after everything that can fail: a full heap grows first (reserve). */
int osub__timer_reserve(osub_engine_t *e, size_t more)
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

void osub__timer_set(osub_engine_t *e, struct svc *s, int kind, int64_t at)
{
    osub__timer_cancel(e, s, kind);
    if (osub__timer_reserve(e, 1) != 0)
        return; /* cannot happen after a successful reserve; the tick still sweeps */
    struct timer_ent t = {.at = at, .s = s, .kind = kind};
    s->timer_at[kind] = at;
    e->heap[e->n_heap] = t;
    s->heap_pos[kind] = (int32_t)e->n_heap;
    e->n_heap++;
    heap_up(e, e->n_heap - 1);
}

/* ---- accounting ----------------------------------------------------------------------- */

int64_t osub__slot_held(const struct svc *s, const struct slot *sl)
{
    if (s->backed)
        return sl->grant;
    /* an oversold service is expected to grow to what admission counted for it (its
     * predicted peak: its grant when it has no history) */
    if (s->state == OSUB_STATE_PENDING)
        return osub__min64(sl->grant, sl->charge);
    if (s->loading)
        return osub__max64(sl->used, osub__min64(sl->held_grant, sl->charge));
    if (s->used_capped)
        return osub__min64(sl->used, sl->held_grant);
    return sl->used;
}

void osub__gpu_add_held(osub_engine_t *e, struct gpu *g, int64_t delta)
{
    if (delta == 0)
        return;
    (void)osub__gpu_peak(e, g); /* rolls the history forward to now first */
    osub__gpu_touch(e, g);
    if (delta < 0 && g->n_pending > 0)
        e->pending_check = true; /* a pending service here may start now */
    g->held += delta;
    assert(g->held >= 0); /* held is a sum of non-negative slots */
    int64_t *cur = &g->hist[g->hist_minute % e->hist_n];
    if (g->held > *cur)
        *cur = g->held;
    if (g->held > g->hist_peak)
        g->hist_peak = g->held;
}

/* Recomputes the held of every slot of s and carries the change into its GPUs. */
void osub__svc_sync(osub_engine_t *e, struct svc *s)
{
    for (int32_t i = 0; i < s->n_slots; i++) {
        struct slot *sl = &s->slots[i];
        osub__gpu_touch(e, &e->gpus[sl->gpu]);
        int64_t h = osub__slot_held(s, sl);
        if (h != sl->held) {
            osub__gpu_add_held(e, &e->gpus[sl->gpu], h - sl->held);
            sl->held = h;
        }
    }
}

void osub__slot_set_grant(osub_engine_t *e, struct svc *s, struct slot *sl, int64_t g)
{
    struct gpu *gp = &e->gpus[sl->gpu];
    assert(g >= 0);
    osub__gpu_touch(e, gp);
    gp->granted += g - sl->grant;
    if (s->backed)
        gp->backed += g - sl->grant;
    sl->grant = g;
    assert(gp->granted >= 0 && gp->backed >= 0 && gp->backed <= gp->granted);
}

void osub__slot_set_used(osub_engine_t *e, struct slot *sl, int64_t u)
{
    assert(u >= 0);
    e->gpus[sl->gpu].used += u - sl->used;
    sl->used = u;
    assert(e->gpus[sl->gpu].used >= 0);
}

int osub__gpu_list_reserve(struct gpu *g)
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
bool osub__svc_before(const struct svc *a, const struct svc *b)
{
    if (a->level != b->level)
        return a->level > b->level;
    if (a->submit_ms != b->submit_ms)
        return a->submit_ms > b->submit_ms;
    return a->seq > b->seq;
}

void osub__gpu_list_add(osub_engine_t *e, struct gpu *g, struct svc *s)
{
    osub__gpu_touch(e, g);
    int32_t pos = g->nsvc;
    while (pos > 0 && osub__svc_before(s, g->svcs[pos - 1])) {
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

int osub__place_reserve(osub_engine_t *e, const int32_t *gpus, int32_t k)
{
    for (int32_t j = 0; j < k; j++)
        if (osub__gpu_list_reserve(&e->gpus[gpus[j]]) != 0)
            return OSUB_ENOMEM;
    return 0;
}

/* Places s on gpus with the given grants (caller reserved the lists). */
void osub__svc_place(osub_engine_t *e, struct svc *s, const int32_t *gpus, const int64_t *shares,
                     const int64_t *charges, int32_t k)
{
    assert(k >= 1 && k <= s->k && k <= OSUB_SERVICE_GPUS_MAX && s->n_slots == 0);
    s->n_slots = k;
    for (int32_t j = 0; j < k; j++) {
        struct slot *sl = &s->slots[j];
        struct gpu *g = &e->gpus[gpus[j]];
        sl->gpu = gpus[j];
        sl->grant = 0;
        sl->held = 0;
        sl->used = 0;
        osub__slot_set_grant(e, s, sl, shares[j]);
        sl->held_grant = shares[j];
        sl->charge =
            charges != NULL && charges[j] > 0 && charges[j] < shares[j] ? charges[j] : shares[j];
        g->compute_all += s->spec.compute_pct;
        if (s->backed)
            g->compute_backed += s->spec.compute_pct;
        if (s->spec.exclusive)
            g->excl = s;
        osub__gpu_list_add(e, g, s);
    }
    s->used_capped = false;
}

/* Moves slot j of s, with its grant and charge, to GPU gpu (the caller reserved its list and
 * checked the room): what it measured on the old GPU is left there, it measures nothing on the
 * new one yet. */
void osub__svc_move(osub_engine_t *e, struct svc *s, int32_t j, int32_t gpu)
{
    struct slot *sl = &s->slots[j];
    struct gpu *g = &e->gpus[sl->gpu], *ng = &e->gpus[gpu];
    int64_t grant = sl->grant;
    osub__slot_set_grant(e, s, sl, 0);
    osub__slot_set_used(e, sl, 0);
    osub__gpu_add_held(e, g, -sl->held);
    sl->held = 0;
    g->compute_all -= s->spec.compute_pct;
    g->compute_measured -= s->compute_used;
    gpu_list_remove(e, g, s);
    osub__hist_reset(e, g);
    sl->gpu = gpu;
    osub__slot_set_grant(e, s, sl, grant);
    ng->compute_all += s->spec.compute_pct;
    ng->compute_measured += s->compute_used;
    osub__gpu_list_add(e, ng, s);
    e->dirty = true;
}

static void svc_unplace(osub_engine_t *e, struct svc *s)
{
    if (s->state == OSUB_STATE_PENDING)
        for (int32_t j = 0; j < s->n_slots; j++)
            e->gpus[s->slots[j].gpu].n_pending--;
    for (int32_t j = 0; j < s->n_slots; j++) {
        struct slot *sl = &s->slots[j];
        struct gpu *g = &e->gpus[sl->gpu];
        osub__slot_set_grant(e, s, sl, 0);
        osub__slot_set_used(e, sl, 0);
        osub__gpu_add_held(e, g, -sl->held);
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
    osub__susp_clear(e, s);
    s->n_slots = 0;
    s->compute_used = 0;
    s->batch_degraded = false;
    s->loading = false;
    s->ack_pending = false;
    s->used_capped = false;
    osub__timer_cancel(e, s, T_LOAD);
    osub__timer_cancel(e, s, T_DEADLINE);
    s->deadline_ms = 0;
    e->dirty = true;
}

/* ---- lists: queue and pending --------------------------------------------------------- */

bool osub__queue_before(const struct svc *a, const struct svc *b)
{
    if (a->level != b->level)
        return a->level < b->level;
    if (a->submit_ms != b->submit_ms)
        return a->submit_ms < b->submit_ms;
    return a->seq < b->seq;
}

/* Makes room for n entries (n < *cap afterwards), growing by doubling as often as needed:
 * a lost GPU or a snapshot can add many at once. */
int osub__vec_reserve(struct svc ***v, size_t *cap, size_t n)
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

/* Makes room for n queue entries (n < cap_queue afterwards): the free slots before the head
 * taken back first, then the allocation grown. */
int osub__queue_reserve(osub_engine_t *e, size_t n)
{
    if (n < e->cap_queue)
        return 0;
    if (e->queue_off > 0) {
        struct svc **base = e->queue - e->queue_off;
        memmove(base, e->queue, e->n_queue * sizeof(*base));
        e->queue = base;
        e->cap_queue += e->queue_off;
        e->queue_off = 0;
    }
    return osub__vec_reserve(&e->queue, &e->cap_queue, n);
}

size_t osub__queue_push(osub_engine_t *e, struct svc *s)
{
    /* binary search for the first entry that s goes before */
    size_t lo = 0, hi = e->n_queue;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (osub__queue_before(s, e->queue[mid]))
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo < e->n_queue / 2 && e->queue_off > 0) {
        /* the entries ahead of it move one slot towards the head */
        e->queue--;
        e->queue_off--;
        e->cap_queue++;
        memmove(&e->queue[0], &e->queue[1], lo * sizeof(s));
    } else {
        memmove(&e->queue[lo + 1], &e->queue[lo], (e->n_queue - lo) * sizeof(s));
    }
    e->queue[lo] = s;
    e->n_queue++;
    return lo;
}

void osub__queue_remove_at(osub_engine_t *e, size_t i)
{
    struct svc **q = e->queue;
    if (i < e->n_queue / 2) {
        /* the entries ahead of it move one slot back; the head's slot is freed */
        memmove(&q[1], &q[0], i * sizeof(*q));
        e->queue++;
        e->queue_off++;
        e->cap_queue--;
    } else {
        memmove(&q[i], &q[i + 1], (e->n_queue - i - 1) * sizeof(*q));
    }
    e->n_queue--;
}

/* Where s is in the queue, n_queue if it is not: a binary search in the queue's order, a scan
 * if the entry found is not s. */
static size_t queue_find(const osub_engine_t *e, const struct svc *s)
{
    size_t lo = 0, hi = e->n_queue;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (osub__queue_before(e->queue[mid], s))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < e->n_queue && e->queue[lo] == s)
        return lo;
    for (size_t i = 0; i < e->n_queue; i++)
        if (e->queue[i] == s)
            return i;
    return e->n_queue;
}

void osub__queue_remove(osub_engine_t *e, struct svc *s)
{
    size_t i = queue_find(e, s);
    if (i < e->n_queue)
        osub__queue_remove_at(e, i);
}

void osub__vec_remove(struct svc **v, size_t *n, struct svc *s)
{
    for (size_t i = 0; i < *n; i++) {
        if (v[i] == s) {
            memmove(&v[i], &v[i + 1], (*n - i - 1) * sizeof(s));
            (*n)--;
            return;
        }
    }
}

size_t osub__queue_pos(const osub_engine_t *e, const struct svc *s)
{
    size_t i = queue_find(e, s);
    return i < e->n_queue ? i + 1 : 0;
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
void osub__svc_destroy(osub_engine_t *e, struct svc *s)
{
    svc_unplace(e, s);
    if (s->state == OSUB_STATE_QUEUED)
        osub__queue_remove(e, s);
    if (s->state == OSUB_STATE_PENDING)
        osub__vec_remove(e->pending, &e->n_pending, s);
    svc_unlink(e, s);
    if (s->suspendable)
        e->n_suspendable--;
    if (s->state == OSUB_STATE_SUSPENDED)
        osub__susp_list_remove(e, s);
    osub_svc_free(s);
}

void osub__set_state(osub_engine_t *e, struct svc *s, osub_state_t st)
{
    if (s->state == st)
        return;
    e->measured_memo = -1;
    if (s->state == OSUB_STATE_PENDING) {
        osub__vec_remove(e->pending, &e->n_pending, s);
        for (int32_t i = 0; i < s->n_slots; i++)
            e->gpus[s->slots[i].gpu].n_pending--;
    }
    if (st == OSUB_STATE_PENDING) {
        for (int32_t i = 0; i < s->n_slots; i++)
            e->gpus[s->slots[i].gpu].n_pending++;
        e->pending_check = true;
    }
    if (s->state == OSUB_STATE_SUSPENDED)
        osub__susp_list_remove(e, s);
    if (st == OSUB_STATE_SUSPENDED)
        osub__susp_list_add(e, s);
    if (st != OSUB_STATE_RESUMING)
        s->reloc_from1 = 0; /* a relocation is over when its resume is */
    s->state = st;
    s->since_ms = e->now;
    for (int32_t i = 0; i < s->n_slots; i++)
        osub__gpu_touch(e, &e->gpus[s->slots[i].gpu]);
}

/* Moves a service that lost its placement to the queue (requeue) -- list space reserved. */
void osub__svc_to_queue(osub_engine_t *e, struct svc *s)
{
    svc_unplace(e, s);
    osub__set_state(e, s, OSUB_STATE_QUEUED);
    s->room_since_ms = -1;
    s->batch = s->full_batch;
    s->n_waits = 0;
    osub__queue_push(e, s);
}

/* Its loading period is over (it said it is ready, or the period ran out): held follows its
 * usage from now; what it held as a reservation was not a peak of its GPUs. */
void osub__end_loading(osub_engine_t *e, struct svc *s)
{
    s->loading = false;
    e->measured_memo = -1;
    if (s->state == OSUB_STATE_LOADING)
        osub__set_state(e, s, OSUB_STATE_RUNNING);
    if (s->state == OSUB_STATE_RESUMING) {
        osub__set_state(e, s, s->susp_from); /* its memory is back: the host's copy goes */
        osub__susp_clear(e, s);
    }
    osub__svc_sync(e, s);
    for (int32_t i = 0; i < s->n_slots; i++)
        osub__hist_reset(e, &e->gpus[s->slots[i].gpu]);
    e->dirty = true;
}

void osub__svc_start(osub_engine_t *e, struct svc *s, osub_reason_t reason)
{
    bool resume = s->evicted_before;
    bool adopted = s->adopted && !resume;
    bool was_pending = s->state == OSUB_STATE_PENDING;
    s->adopted = false;
    osub__set_state(e, s, adopted ? OSUB_STATE_RUNNING : OSUB_STATE_LOADING);
    s->loading = !adopted;
    s->start_ms = e->now;
    s->n_waits = 0;
    if (resume) {
        s->resumed = true;
        s->resume_ms = e->now;
        e->resumes++;
    }
    osub__svc_sync(e, s);
    if (!adopted)
        osub__timer_set(e, s, T_LOAD, e->now + s->restart_cost_ms);
    else if (was_pending) /* its reservation while it waited was not a peak of the GPU's */
        for (int32_t i = 0; i < s->n_slots; i++)
            osub__hist_reset(e, &e->gpus[s->slots[i].gpu]);
    char gb[96];
    osub__fmt_gpus(s, gb, sizeof(gb));
    osub_event_t *ev;
    if (resume)
        ev = osub__emit(
            e, OSUB_EV_RESUME, reason,
            "resumed %s (%s) on %s with %lld MiB%s%s; protected from eviction for %lld ms",
            s->spec.id, osub__class_of(e, s), gb, (long long)osub__grant_total(s),
            s->checkpoint[0] ? " from checkpoint " : "", s->checkpoint,
            (long long)e->cfg.min_runtime_ms);
    else
        ev = osub__emit(e, OSUB_EV_START, reason, "started %s (%s) on %s with %lld MiB; %s %lld ms",
                        s->spec.id, osub__class_of(e, s), gb, (long long)osub__grant_total(s),
                        adopted ? "already running: no loading period instead of"
                                : "loading for up to",
                        (long long)s->restart_cost_ms);
    osub__ev_svc(ev, s);
    ev->vram_mib = osub__grant_total(s);
    ev->batch_size = s->batch;
}

void osub__svc_degrade(osub_engine_t *e, struct svc *s, const char *cause, int32_t cause_level,
                       osub_reason_t reason)
{
    int64_t from = osub__grant_total(s);
    int32_t from_batch = s->batch;
    for (int32_t i = 0; i < s->n_slots; i++)
        osub__slot_set_grant(e, s, &s->slots[i], osub__floor_share(s, i));
    s->batch = s->floor_batch;
    osub__set_state(e, s, OSUB_STATE_DEGRADED);
    s->ack_pending = true;
    s->room_since_ms = -1;
    s->n_degrades++;
    e->degrades++;
    s->deadline_ms = e->now + e->cfg.ack_timeout_ms;
    osub__str_copy(s->preemptor, sizeof(s->preemptor), cause ? cause : "");
    s->preemptor_level = cause_level;
    osub__timer_set(e, s, T_DEADLINE, s->deadline_ms);
    osub__svc_sync(e, s);
    char gb[96], why[200], bb[48] = "";
    osub__fmt_gpus(s, gb, sizeof(gb));
    if (cause && cause[0])
        osub__fmt(why, sizeof(why), "to make room for %s (level %d)", cause, cause_level);
    else
        osub__fmt(why, sizeof(why), "because %s is above its high watermark", gb);
    if (from_batch > 0)
        osub__fmt(bb, sizeof(bb), ", batch %d -> %d", from_batch, s->batch);
    osub_event_t *ev =
        osub__emit(e, OSUB_EV_DEGRADE, reason,
                   "degraded %s (%s) on %s from %lld to %lld MiB%s, %s; "
                   "acknowledge within %lld ms",
                   s->spec.id, osub__class_of(e, s), gb, (long long)from,
                   (long long)osub__grant_total(s), bb, why, (long long)e->cfg.ack_timeout_ms);
    osub__ev_svc(ev, s);
    osub__str_copy(ev->cause, sizeof(ev->cause), cause ? cause : "");
    ev->cause_level = cause_level;
    ev->vram_mib = osub__grant_total(s);
    ev->batch_size = s->batch;
    ev->deadline_ms = s->deadline_ms;
}

void osub__svc_evict(osub_engine_t *e, struct svc *s, const char *cause, int32_t cause_level,
                     osub_reason_t reason)
{
    int64_t from = osub__grant_total(s);
    s->ack_pending = false;
    osub__susp_clear(e, s); /* killed: its host copy goes with its processes */
    for (int32_t i = 0; i < s->n_slots; i++)
        osub__slot_set_grant(e, s, &s->slots[i], 0);
    osub__set_state(e, s, OSUB_STATE_DRAINING);
    s->room_since_ms = -1;
    s->n_evictions++;
    e->evictions++;
    s->deadline_ms = e->now + s->grace_ms;
    osub__str_copy(s->preemptor, sizeof(s->preemptor), cause ? cause : "");
    s->preemptor_level = cause_level;
    osub__timer_set(e, s, T_DEADLINE, s->deadline_ms);
    osub__svc_sync(e, s);
    char gb[96], why[200];
    osub__fmt_gpus(s, gb, sizeof(gb));
    if (reason == OSUB_R_ACK_TIMEOUT)
        osub__fmt(why, sizeof(why), "because it did not acknowledge its degrade in time");
    else if (reason == OSUB_R_SUSPEND_TIMEOUT)
        osub__fmt(why, sizeof(why), "because it did not finish suspending in time");
    else if (reason == OSUB_R_SUSPEND_FAILED)
        osub__fmt(why, sizeof(why), "because its suspend mechanism failed");
    else if (reason == OSUB_R_MIGRATE)
        osub__fmt(why, sizeof(why),
                  "to restart it elsewhere (a reload): suspended longer than its restart cost of "
                  "%lld ms, its GPUs have no room for it while others do%s",
                  (long long)s->restart_cost_ms,
                  s->floor_now ? " for its floor (it restarts degraded)" : "");
    else if (cause && cause[0])
        osub__fmt(why, sizeof(why), "to make room for %s (level %d)", cause, cause_level);
    else if (reason == OSUB_R_USER)
        osub__fmt(why, sizeof(why), "because its GPU is being drained");
    else
        osub__fmt(why, sizeof(why), "because %s is above its high watermark", gb);
    osub_event_t *ev =
        osub__emit(e, OSUB_EV_EVICT, reason,
                   "evicting %s (%s, %lld MiB held) from %s %s; grace period %lld ms, "
                   "then %s",
                   s->spec.id, osub__class_of(e, s), (long long)osub__held_total(s), gb, why,
                   (long long)s->grace_ms, s->requeue_on_evict ? "back to the queue" : "released");
    (void)from;
    osub__ev_svc(ev, s);
    osub__str_copy(ev->cause, sizeof(ev->cause), cause ? cause : "");
    ev->cause_level = cause_level;
    ev->deadline_ms = s->deadline_ms;
}

/* The memory of an evicted (or exited) service is free: requeue or release it. */
void osub__svc_gone(osub_engine_t *e, struct svc *s, osub_reason_t reason, bool by_eviction)
{
    char gb[96];
    osub__fmt_gpus(s, gb, sizeof(gb));
    if (by_eviction && s->requeue_on_evict) {
        s->evicted_before = true;
        osub__svc_to_queue(e, s);
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_REQUEUE, reason,
                       "%s (%s) left %s and is back in the queue at position %zu%s%s", s->spec.id,
                       osub__class_of(e, s), gb, osub__queue_pos(e, s),
                       s->checkpoint[0] ? " with checkpoint " : "", s->checkpoint);
        osub__ev_svc(ev, s);
        return;
    }
    osub_event_t *ev = osub__emit(e, OSUB_EV_RELEASE, reason, "released %s (%s) from %s",
                                  s->spec.id, osub__class_of(e, s), s->n_slots ? gb : "the queue");
    osub__ev_svc(ev, s);
    osub__svc_destroy(e, s);
}

/* ---- engine lifetime ------------------------------------------------------------------ */

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
    if (c->suspend_host_mib < 0 || c->suspend_host_mib > (INT64_C(1) << 40) ||
        c->suspend_mib_per_s < 1 || c->suspend_mib_per_s > (INT64_C(1) << 30) ||
        c->suspend_timeout_ms < 0 || c->suspend_timeout_ms > 86400000LL ||
        c->suspend_min_runtime_ms < 0 || c->suspend_min_runtime_ms > 30 * 86400000LL)
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
    e->opt_buf = calloc(n_gpus, sizeof(*e->opt_buf));
    /* by level, a cache line each (struct agg_level) */
    e->aggs = aligned_alloc(64, (size_t)n_gpus * sizeof(*e->aggs));
    if (e->aggs != NULL)
        memset(e->aggs, 0, (size_t)n_gpus * sizeof(*e->aggs));
    /* 8 more: osub__tree_collect() writes one entry past what it keeps */
    e->miss_buf = calloc((size_t)n_gpus + 8, sizeof(*e->miss_buf));
    e->promise_buf = calloc(n_gpus, sizeof(*e->promise_buf));
    e->gpu_stamp = calloc(n_gpus, sizeof(*e->gpu_stamp));
    if (e->gpus == NULL || e->opt_buf == NULL || e->miss_buf == NULL || e->promise_buf == NULL ||
        e->aggs == NULL || e->gpu_stamp == NULL)
        goto err_free;
    for (size_t i = 0; i < n_gpus; i++) {
        struct gpu *g = &e->gpus[i];
        if (names != NULL && names[i] != NULL)
            osub__str_copy(g->name, sizeof(g->name), names[i]);
        else
            osub__fmt(g->name, sizeof(g->name), "gpu%zu", i);
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
    osub__refresh_sizes(e);
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
    free(e->opt_buf);
    free(e->aggs);
    free(e->tdirty);
    osub__trees_free(e);
    free(e->miss_buf);
    free(e->promise_buf);
    free(e->gpu_stamp);
    free(e->tab);
    free(e->queue != NULL ? e->queue - e->queue_off : NULL);
    free(e->pending);
    free(e->heap);
    free(e->events);
    free(e);
}
