/* sim.c - the simulator: a virtual clock over a usage trace, driving the engine (static and
 * oversub policies; the brief's algorithm and a hindsight packing are in sim_ref.c) */
#include "sim.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oversub/engine.h"
#include "sim_int.h"

static const char *const policy_names[] = {"static", "brief", "oversub", "hindsight"};

const char *sim_policy_name(enum sim_policy p)
{
    return (unsigned)p < POL__COUNT ? policy_names[p] : "?";
}

void sim_result_free(struct sim_result *r)
{
    free(r->used_series);
    free(r->held_series);
    free(r->event_series);
    r->used_series = r->held_series = NULL;
    r->event_series = NULL;
}

int sim__idmap_init(struct idmap *m, const struct trace *tr)
{
    m->cap = 64;
    while (m->cap < tr->n * 2)
        m->cap *= 2;
    m->keys = calloc(m->cap, sizeof(*m->keys));
    m->vals = calloc(m->cap, sizeof(*m->vals));
    if (m->keys == NULL || m->vals == NULL)
        return -1;
    for (size_t i = 0; i < tr->n; i++) {
        size_t h = fnv1a64(tr->svcs[i].spec.id) & (m->cap - 1);
        while (m->keys[h] != NULL)
            h = (h + 1) & (m->cap - 1);
        m->keys[h] = tr->svcs[i].spec.id;
        m->vals[h] = (int32_t)i;
    }
    return 0;
}

int32_t sim__idmap_get(const struct idmap *m, const char *id)
{
    size_t h = fnv1a64(id) & (m->cap - 1);
    while (m->keys[h] != NULL) {
        if (strcmp(m->keys[h], id) == 0)
            return m->vals[h];
        h = (h + 1) & (m->cap - 1);
    }
    return -1;
}

void sim__idmap_free(struct idmap *m)
{
    free(m->keys);
    free(m->vals);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void sim__finish(const struct trace *tr, const struct sim_budget *b, struct acc *a,
                 struct sim_result *r, bool keep)
{
    r->steps = (int64_t)a->steps;
    double span_s = (double)(tr->t1 - tr->t0 + tr->step_s);
    r->span_days = span_s / 86400.0;
    if (a->steps > 0) {
        r->mean_used_util = a->used_sum / (double)a->steps;
        r->mean_held_util = a->held_sum / (double)a->steps;
        r->mean_logical_util = a->logical_sum / (double)a->steps;
        double *v = malloc(a->steps * sizeof(*v));
        if (v != NULL) {
            memcpy(v, a->used, a->steps * sizeof(*v));
            qsort(v, a->steps, sizeof(*v), cmp_double);
            size_t idx = (a->steps * 95 + 99) / 100;
            r->p95_used_util = v[idx > 0 ? idx - 1 : 0];
            free(v);
        }
    }
    double weeks = span_s / (7.0 * 86400.0);
    for (int l = 0; l < 3; l++) {
        r->degrades_per_week[l] = weeks > 0 ? (double)r->degrades[l] / weeks : 0;
        r->evictions_per_week[l] = weeks > 0 ? (double)r->evictions[l] / weeks : 0;
        r->suspends_per_week[l] = weeks > 0 ? (double)r->suspends[l] / weeks : 0;
    }
    r->unmet_fraction = a->demand > 0 ? (double)a->unmet / (double)a->demand : 0;
    r->lost_service_minutes = a->lost_min;
    r->max_wait_s = a->wait_max;
    r->mean_wait_s = a->wait_n ? (double)a->wait_total / (double)a->wait_n : 0;
    r->feasible = true;
    r->why_infeasible = NULL;
    double ev_week = r->evictions_per_week[1] + r->evictions_per_week[2];
    if (r->too_big > 0)
        r->why_infeasible = "a service larger than a GPU";
    else if (r->p0_disruptions > 0)
        r->why_infeasible = "P0 disruptions";
    else if (r->oom_events > 0)
        r->why_infeasible = "OOM events";
    else if (r->never_started > 0)
        r->why_infeasible = "services never started";
    else if (ev_week > (double)b->evict_budget_per_week + 1e-9)
        r->why_infeasible = "evictions over budget";
    else if (r->unmet_fraction * 1000.0 > (double)b->unmet_budget_milli + 1e-9)
        r->why_infeasible = "unmet demand over budget";
    else if (a->wait_max > b->max_wait_s)
        r->why_infeasible = "a wait over the limit";
    r->feasible = r->why_infeasible == NULL;
    if (keep) {
        r->used_series = a->used;
        r->held_series = a->held;
        r->event_series = a->events;
        r->n_series = a->steps;
        a->used = a->held = NULL;
        a->events = NULL;
    }
    free(a->used);
    free(a->held);
    free(a->events);
}

size_t sim__n_steps(const struct trace *tr)
{
    return (size_t)((tr->t1 - tr->t0) / tr->step_s) + 1;
}

/* Latest sample at or before t (advances the cursor). Returns the demand, -1 if not active. */
int64_t sim__demand_at(const struct trace_svc *s, struct run_svc *rs, int64_t t)
{
    if (t < s->samples[0].t_s || t > s->samples[s->n - 1].t_s)
        return -1;
    while (rs->cur + 1 < s->n && s->samples[rs->cur + 1].t_s <= t)
        rs->cur++;
    return s->samples[rs->cur].vram_mib;
}

/* What a replay through the engine reads of a service at every step, packed (the trace's
 * service is a spec of hundreds of bytes: its samples pointer, count and first and last
 * times were cache lines apart): demand_at on it is demand_at on the trace's. */
struct lane {
    const struct sample *samples;
    size_t n;
    int64_t t_first, t_last;
    const char *id; /* the spec's */
};

static inline int64_t lane_demand(const struct lane *l, struct run_svc *rs, int64_t t)
{
    if (t < l->t_first || t > l->t_last)
        return -1;
    while (rs->cur + 1 < l->n && l->samples[rs->cur + 1].t_s <= t)
        rs->cur++;
    return l->samples[rs->cur].vram_mib;
}

/* ---- progress ------------------------------------------------------------------------ */

/* Every 64 steps: a line when one is due (trace.h's progress). */
void sim__step_progress(struct progress *pg, const struct sim_opts *o, size_t k, size_t steps)
{
    FILE *f = progress_file();
    if (f == NULL || (k & 63) != 0 || k == 0 || !progress_due(pg))
        return;
    fprintf(f, "simulate: %s at %d.%03d on %zu GPUs: step %zu of %zu (%.0f%%), %.0f s\n",
            sim_policy_name(o->policy), o->ratio_milli / 1000, o->ratio_milli % 1000, o->n_pool, k,
            steps, 100.0 * (double)k / (double)steps, progress_elapsed(pg));
}

/* ---- engine policies (static, oversub) ------------------------------------------------ */

/* Services that arrive at the same instant are submitted biggest request first (first-fit
 * decreasing, as a scheduler given a batch would), then by priority, then by id. */
static const struct trace *sort_tr;

static int cmp_arrival(const void *a, const void *b)
{
    const struct trace_svc *x = &sort_tr->svcs[*(const size_t *)a];
    const struct trace_svc *y = &sort_tr->svcs[*(const size_t *)b];
    int lx = sim__level_of(x->spec.class_name), ly = sim__level_of(y->spec.class_name);
    if (x->spec.vram_mib != y->spec.vram_mib)
        return x->spec.vram_mib > y->spec.vram_mib ? -1 : 1;
    if (lx != ly)
        return lx - ly;
    return strcmp(x->spec.id, y->spec.id);
}

struct follow {
    int32_t svc;
    bool exit;
};

void sim__note_wait(struct acc *a, struct run_svc *rs, int64_t t)
{
    if (rs->wait_since < 0)
        return;
    int64_t w = t - rs->wait_since;
    if (w > a->wait_max)
        a->wait_max = w;
    a->wait_total += w;
    a->wait_n++;
    rs->wait_since = -1;
}

/* The end of a replay: who never started, who is still waiting, then the figures. */
void sim__end_run(const struct trace *tr, const struct sim_budget *b, struct acc *a,
                  struct run_svc *rs, struct sim_result *r, bool timeline)
{
    for (size_t i = 0; i < tr->n; i++) {
        if (!rs[i].started_once)
            r->never_started++;
        if (rs[i].wait_since >= 0)
            sim__note_wait(a, &rs[i], tr->t1 + tr->step_s);
    }
    sim__finish(tr, b, a, r, timeline);
}

/*
 * The engine's view. What the replay reads of a service (is it known, its state, grant, use,
 * loading, its GPUs and what it uses on each) and what each GPU uses are kept here, as of the
 * last command, instead of being asked of the engine at every sample (osub_engine_service_info
 * and osub_engine_gpu_info format strings and compute predictions: they were 70% of a
 * replay's instructions). The engine changes a service only in a command, and every change
 * the replay reads comes with an event naming the service (start, degrade, ack, restore,
 * evict, exited, requeue, release, ready...) or is the replay's own command on it; so a
 * service named by an event or a command of the replay is read again from the engine once
 * the command's events are in (view_sync), and a usage report the engine accepted on one GPU
 * is applied here (it sets the service's use, and its GPU's, to the figure reported). With
 * opts.verify every read is compared with the engine's own answer (tests).
 */
struct view {
    bool live; /* the engine knows it (service_info succeeds) */
    bool loading, resumed, dirty;
    osub_state_t state;
    int32_t n_slots;
    int64_t grant_mib, used_mib;
};

/* A suspend of the replay (DESIGN.md, "Suspend"): the mechanism takes its used memory to the
 * host at the pool's suspend_mib_per_s and reports it done (osub_engine_suspended, with the
 * residual its spec expects, at most what it used), as oversubd's suspender does; a wake is
 * reported done (osub_engine_resumed) after its resume cost. From the decision to the resume it
 * serves nothing: that time is lost, to the millisecond. */
struct susp {
    int64_t since_ms;       /* the suspend decision; -1: not in suspend */
    int64_t evict_since_ms; /* an eviction decision, until it runs again loaded; -1: none */
    int64_t used_mib;       /* what it used then */
    int64_t wake_ms;        /* its wake decision; -1: not resuming */
    bool wait_covered;      /* its open wait to restart was inside an eviction now counted */
    uint32_t gen;           /* a report to come is for this suspend or wake only */
};

struct stimer {
    int64_t due_ms;
    uint64_t seq; /* ties in the order they were made */
    int32_t svc;
    uint32_t gen;
    bool resume; /* osub_engine_resumed, else osub_engine_suspended */
};

static inline bool in_suspend(osub_state_t st)
{
    return st == OSUB_STATE_SUSPENDING || st == OSUB_STATE_SUSPENDED || st == OSUB_STATE_RESUMING;
}

/* One replay through the engine (sim_engine()): the engine, each service's run state and
 * view, the follow-ups of the last command and the bookkeeping. */
struct erun {
    osub_engine_t *e;
    const struct trace *tr;
    const struct sim_opts *o;
    struct sim_result *r;
    struct idmap m;
    struct run_svc *rs;
    struct follow *fq;
    size_t nf, fcap;
    struct acc a;
    size_t *order;    /* arrivals at the same instant go in priority order: online first */
    size_t *oom_step; /* step+1 of a GPU's last OOM */
    int64_t vram_total;
    uint64_t ev_before;
    /* the view: per service, then its slots (slot_cap of them from slot_off) */
    struct view *v;
    size_t *slot_off;
    int32_t *slot_cap, *slot_gpu;
    int64_t *slot_used;
    int64_t *gpu_used; /* per GPU: what its services use */
    size_t *dirty;     /* services to read again */
    size_t n_dirty;
    struct lane *lane; /* per service */
    /* suspend: per service, then the mechanisms' reports to come, in time order */
    struct susp *sus;
    struct stimer *tq;
    size_t nt, tcap;
    uint64_t t_seq;
    int64_t ev_ms;             /* the time of the last command's events */
    int64_t suspend_mib_per_s; /* the pool's: how fast memory moves to the host and back */
};

static void view_touch(struct erun *x, int32_t i)
{
    if (i < 0 || x->v[i].dirty)
        return;
    x->v[i].dirty = true;
    x->dirty[x->n_dirty++] = (size_t)i;
}

static void view_mismatch(struct erun *x, size_t i, const char *what)
{
    if (x->r->verify_mismatches++ == 0)
        fprintf(stderr, "simulate: verify: %s of %s differs from the engine's\n", what,
                x->tr->svcs[i].spec.id);
}

/* Service i left its suspend (resumed, evicted or released) at the last events' time: the time
 * since the decision is lost. */
static void suspend_ended(struct erun *x, size_t i, int64_t now_ms)
{
    struct susp *s = &x->sus[i];
    if (s->since_ms < 0)
        return;
    int64_t ms = now_ms - s->since_ms;
    if (s->wake_ms >= 0)
        x->r->suspend_transit_minutes += (double)(now_ms - s->wake_ms) / 60000.0;
    s->wake_ms = -1;
    x->a.lost_min += (double)ms / 60000.0;
    x->r->suspend_lost_minutes += (double)ms / 60000.0;
    if (ms / 1000 > x->r->max_suspended_s)
        x->r->max_suspended_s = ms / 1000;
    s->since_ms = -1;
}

/* Service i, evicted, runs again loaded (or is gone) at now_ms: the time since the eviction is
 * what the eviction cost it (the figure suspends are compared with; part of lost_min). */
static void evict_ended(struct erun *x, size_t i, int64_t now_ms)
{
    struct susp *s = &x->sus[i];
    if (s->evict_since_ms < 0)
        return;
    x->r->evict_lost_minutes += (double)(now_ms - s->evict_since_ms) / 60000.0;
    x->a.lost_min += (double)(now_ms - s->evict_since_ms) / 60000.0;
    s->evict_since_ms = -1;
    s->wait_covered = x->rs[i].wait_since >= 0; /* a wait to restart it is not lost twice */
}

/* Service i stops waiting to start at t (s): placed and started, or gone. The wait is lost
 * time, unless it is a restart's after an eviction (evict_ended counts that, to the end of its
 * reload). */
static void wait_ended(struct erun *x, size_t i, int64_t t)
{
    struct run_svc *rs = &x->rs[i];
    if (rs->wait_since < 0)
        return;
    if (x->sus[i].evict_since_ms < 0 && !x->sus[i].wait_covered)
        x->a.lost_min += (double)(t - rs->wait_since) / 60.0;
    x->sus[i].wait_covered = false;
    sim__note_wait(&x->a, rs, t);
}

/* Reads service i again from the engine. */
static void view_read(struct erun *x, size_t i)
{
    struct view *v = &x->v[i];
    int32_t *gpu = x->slot_gpu + x->slot_off[i];
    int64_t *used = x->slot_used + x->slot_off[i];
    for (int32_t sl = 0; sl < v->n_slots; sl++)
        x->gpu_used[gpu[sl]] -= used[sl];
    v->dirty = false;
    v->n_slots = 0;
    osub_service_info_t si;
    v->live = osub_engine_service_info(x->e, x->tr->svcs[i].spec.id, &si) == 0;
    if (x->sus[i].since_ms >= 0 && !(v->live && in_suspend(si.state)))
        suspend_ended(x, i, x->ev_ms);
    if (!v->live)
        return;
    if (x->sus[i].evict_since_ms >= 0 && !si.loading &&
        (si.state == OSUB_STATE_RUNNING || si.state == OSUB_STATE_DEGRADED))
        evict_ended(x, i, x->ev_ms);
    v->state = si.state;
    v->loading = si.loading;
    v->resumed = si.resumed;
    v->grant_mib = si.grant_mib;
    v->used_mib = si.used_mib;
    v->n_slots = si.n_slots < x->slot_cap[i] ? si.n_slots : x->slot_cap[i];
    for (int32_t sl = 0; sl < v->n_slots; sl++) {
        gpu[sl] = si.slots[sl].gpu;
        used[sl] = si.slots[sl].used_mib;
        x->gpu_used[gpu[sl]] += used[sl];
    }
}

static void view_sync(struct erun *x)
{
    for (size_t k = 0; k < x->n_dirty; k++)
        view_read(x, x->dirty[k]);
    x->n_dirty = 0;
}

/* Service i's view checked against the engine's answer (opts.verify). */
static void view_verify(struct erun *x, size_t i)
{
    const struct view *v = &x->v[i];
    osub_service_info_t si;
    bool live = osub_engine_service_info(x->e, x->tr->svcs[i].spec.id, &si) == 0;
    if (live != v->live)
        view_mismatch(x, i, "being known");
    else if (live && (si.state != v->state || si.loading != v->loading ||
                      si.resumed != v->resumed || si.grant_mib != v->grant_mib ||
                      si.used_mib != v->used_mib || si.n_slots != v->n_slots))
        view_mismatch(x, i, "the state, grant, use or GPUs");
    else
        for (int32_t sl = 0; live && sl < si.n_slots; sl++)
            if (si.slots[sl].gpu != x->slot_gpu[x->slot_off[i] + (size_t)sl] ||
                si.slots[sl].used_mib != x->slot_used[x->slot_off[i] + (size_t)sl])
                view_mismatch(x, i, "a GPU's share");
}

/* Service i's view (opts.verify: checked against the engine's answer). */
static inline const struct view *view_of(struct erun *x, size_t i)
{
    if (x->o->verify)
        view_verify(x, i);
    return &x->v[i];
}

/* GPU g's use checked against the engine's answer (opts.verify). */
static void gpu_verify(struct erun *x, int32_t g)
{
    osub_gpu_info_t gi;
    if (osub_engine_gpu_info(x->e, g, &gi) != 0 || gi.used_mib != x->gpu_used[g] ||
        gi.vram_mib != x->o->pool[g]) {
        if (x->r->verify_mismatches++ == 0)
            fprintf(stderr, "simulate: verify: GPU %d's use differs from the engine's\n", (int)g);
    }
}

/* What GPU g uses (opts.verify: checked against the engine's answer). */
static inline int64_t gpu_used(struct erun *x, int32_t g)
{
    if (x->o->verify)
        gpu_verify(x, g);
    return x->gpu_used[g];
}

/* The mechanism's report for svc at due_ms, to come (in time order, ties in order made). */
static void timer_add(struct erun *x, int64_t due_ms, int32_t svc, bool resume)
{
    if (x->nt == x->tcap) {
        size_t cap = x->tcap ? x->tcap * 2 : 64;
        struct stimer *q = realloc(x->tq, cap * sizeof(*q));
        if (q == NULL)
            return; /* never reported: the engine's timeout evicts it, or its resume cost ends */
        x->tq = q;
        x->tcap = cap;
    }
    x->tq[x->nt++] = (struct stimer){due_ms, x->t_seq++, svc, x->sus[svc].gen, resume};
}

/* A suspend decision (its mechanism starts: done when its used memory is on the host) or a
 * wake (done after its resume cost: the event's deadline). */
static void suspend_event(struct erun *x, const osub_event_t *ev, int32_t svc, int lvl)
{
    if (svc < 0)
        return;
    struct susp *s = &x->sus[svc];
    s->gen++;
    if (ev->kind == OSUB_EV_WAKE) {
        x->r->wakes++;
        x->r->relocations += ev->reason == OSUB_R_RELOCATE;
        s->wake_ms = ev->time_ms;
        timer_add(x, ev->deadline_ms, svc, true);
        return;
    }
    x->r->suspends[lvl]++;
    if (lvl == 0)
        x->r->p0_disruptions++;
    if (s->since_ms < 0)
        s->since_ms = ev->time_ms;
    s->used_mib = x->v[svc].used_mib > 0 ? x->v[svc].used_mib : 0; /* as of the decision */
    timer_add(x, ev->time_ms + s->used_mib * 1000 / x->suspend_mib_per_s, svc, false);
}

/* --events: the event as a JSON line (the replay's time in s from the trace's start). */
static void event_line(struct erun *x, const osub_event_t *ev)
{
    json_t *o = json_pack("{s:f, s:s, s:s, s:s, s:i, s:s, s:i, s:I, s:s}", "t_s",
                          (double)ev->time_ms / 1000.0, "kind", osub_event_name(ev->kind), "reason",
                          osub_reason_name(ev->reason), "service", ev->service, "level",
                          (int)ev->level, "cause", ev->cause, "gpu", (int)ev->gpu, "vram_mib",
                          (json_int_t)ev->vram_mib, "msg", ev->msg);
    if (o == NULL)
        return;
    json_dumpf(o, x->o->events, JSON_COMPACT);
    fputc('\n', x->o->events);
    json_decref(o);
}

/* --events: GPU g over its VRAM at step k (a service's report, or the step's end). */
static void oom_line(struct erun *x, int32_t g, size_t k)
{
    if (x->o->events == NULL)
        return;
    fprintf(x->o->events,
            "{\"t_s\":%lld,\"kind\":\"oom\",\"gpu\":%d,\"used_mib\":%lld,\"vram_mib\":%lld}\n",
            (long long)((int64_t)k * x->tr->step_s), (int)g, (long long)x->gpu_used[g],
            (long long)x->o->pool[g]);
}

/* Reads the last command's events: counts decisions, marks the services they name to be
 * read again, queues follow-ups (victims comply at once: a degraded service acknowledges, an
 * evicted one checkpoints and exits). */
static void read_events_of(struct erun *x, const osub_event_t *ev, size_t n)
{
    struct sim_result *r = x->r;
    for (size_t i = 0; i < n; i++) {
        if (x->o->events != NULL)
            event_line(x, &ev[i]);
        int32_t svc = ev[i].service[0] != '\0' ? sim__idmap_get(&x->m, ev[i].service) : -1;
        view_touch(x, svc);
        if (ev[i].cause[0] != '\0')
            view_touch(x, sim__idmap_get(&x->m, ev[i].cause));
        int lvl = ev[i].level >= 0 && ev[i].level < 3 ? ev[i].level : 2;
        if (ev[i].kind == OSUB_EV_DEGRADE && ev[i].reason != OSUB_R_COMPUTE) {
            r->degrades[lvl]++;
            if (lvl == 0)
                r->p0_disruptions++;
            if (x->nf < x->fcap)
                x->fq[x->nf++] = (struct follow){svc, false};
        } else if (ev[i].kind == OSUB_EV_EVICT) {
            r->evictions[lvl]++;
            r->migrations += ev[i].reason == OSUB_R_MIGRATE;
            if (svc >= 0 && x->sus[svc].evict_since_ms < 0)
                x->sus[svc].evict_since_ms = ev[i].time_ms;
            if (svc >= 0 && x->rs[svc].wait_since < 0) /* it waits to restart from now */
                x->rs[svc].wait_since = x->tr->t0 + ev[i].time_ms / 1000;
            if (lvl == 0)
                r->p0_disruptions++;
            if (x->nf < x->fcap)
                x->fq[x->nf++] = (struct follow){svc, true};
        } else if ((ev[i].kind == OSUB_EV_RELEASE || ev[i].kind == OSUB_EV_REQUEUE) &&
                   ev[i].reason == OSUB_R_GPU_LOST && lvl == 0) {
            r->p0_disruptions++;
        } else if (ev[i].kind == OSUB_EV_SUSPEND || ev[i].kind == OSUB_EV_WAKE) {
            suspend_event(x, &ev[i], svc, lvl);
        } else if ((ev[i].kind == OSUB_EV_START || ev[i].kind == OSUB_EV_RESUME) && svc >= 0) {
            /* it starts (whichever command started it): its wait ends now, not at its step */
            wait_ended(x, (size_t)svc, x->tr->t0 + ev[i].time_ms / 1000);
            x->rs[svc].started_once = true;
        }
    }
    if (n > 0)
        x->ev_ms = ev[0].time_ms;
    view_sync(x);
}

/* Most commands of a replay (usage reports) have no event and leave nothing to read again. */
static inline void read_events(struct erun *x)
{
    size_t n;
    const osub_event_t *ev = osub_engine_events(x->e, &n);
    if (n > 0 || x->n_dirty > 0)
        read_events_of(x, ev, n);
}

static void run_follow_ups_of(struct erun *x, int64_t now_ms)
{
    for (size_t i = 0; i < x->nf; i++) {
        if (x->fq[i].svc < 0)
            continue;
        const char *id = x->lane[x->fq[i].svc].id;
        view_touch(x, x->fq[i].svc);
        if (x->fq[i].exit)
            osub_engine_exited(x->e, id, "checkpoint", now_ms);
        else
            osub_engine_ack(x->e, id, NULL, now_ms);
        read_events(x);
    }
    x->nf = 0;
}

static inline void run_follow_ups(struct erun *x, int64_t now_ms)
{
    if (x->nf > 0)
        run_follow_ups_of(x, now_ms);
}

/* The last command's events counted and its follow-ups run. */
static void erun_events(struct erun *x, int64_t now)
{
    read_events(x);
    run_follow_ups(x, now);
}

/* Service i reports used_mib: the engine's command, then the view. */
static void report_usage(struct erun *x, size_t i, int64_t used_mib, int32_t pct, int64_t now)
{
    struct view *v = &x->v[i];
    if (osub_engine_usage(x->e, x->lane[i].id, used_mib, pct, now) != 0)
        return; /* refused: nothing changed */
    if (v->n_slots == 1 && !v->dirty) {
        int64_t *used = &x->slot_used[x->slot_off[i]];
        x->gpu_used[x->slot_gpu[x->slot_off[i]]] += used_mib - *used;
        *used = used_mib;
        v->used_mib = used_mib;
    } else {
        view_touch(x, (int32_t)i);
    }
}

static void erun_free(struct erun *x)
{
    sim__idmap_free(&x->m);
    free(x->rs);
    free(x->fq);
    free(x->a.used);
    free(x->a.held);
    free(x->a.events);
    free(x->order);
    free(x->oom_step);
    free(x->v);
    free(x->slot_off);
    free(x->slot_cap);
    free(x->slot_gpu);
    free(x->slot_used);
    free(x->gpu_used);
    free(x->dirty);
    free(x->lane);
    free(x->sus);
    free(x->tq);
    osub_engine_free(x->e);
}

/* The view's arrays: a service has room for as many GPUs as it asks for (64 when it lets the
 * engine choose). */
static int view_init(struct erun *x)
{
    const struct trace *tr = x->tr;
    x->v = calloc(tr->n, sizeof(*x->v));
    x->slot_off = calloc(tr->n, sizeof(*x->slot_off));
    x->slot_cap = calloc(tr->n, sizeof(*x->slot_cap));
    x->dirty = calloc(tr->n, sizeof(*x->dirty));
    x->gpu_used = calloc(x->o->n_pool, sizeof(*x->gpu_used));
    if (x->v == NULL || x->slot_off == NULL || x->slot_cap == NULL || x->dirty == NULL ||
        x->gpu_used == NULL)
        return -1;
    size_t slots = 0;
    for (size_t i = 0; i < tr->n; i++) {
        int32_t k = tr->svcs[i].spec.gpus;
        x->slot_cap[i] = k >= 1 && k <= OSUB_SERVICE_GPUS_MAX ? k : OSUB_SERVICE_GPUS_MAX;
        x->slot_off[i] = slots;
        slots += (size_t)x->slot_cap[i];
    }
    x->slot_gpu = calloc(slots, sizeof(*x->slot_gpu));
    x->slot_used = calloc(slots, sizeof(*x->slot_used));
    x->lane = calloc(tr->n, sizeof(*x->lane));
    if (x->slot_gpu == NULL || x->slot_used == NULL || x->lane == NULL)
        return -1;
    for (size_t i = 0; i < tr->n; i++) {
        const struct trace_svc *s = &tr->svcs[i];
        x->lane[i] = (struct lane){s->samples, s->n, s->samples[0].t_s, s->samples[s->n - 1].t_s,
                                   s->spec.id};
    }
    return 0;
}

/* Makes the engine and what the replay keeps. Returns 0, or -1 with err (everything freed). */
static int erun_init(struct erun *x, const struct trace *tr, const struct sim_opts *o,
                     const struct sim_budget *b, struct sim_result *r, char *err, size_t errlen)
{
    memset(x, 0, sizeof(*x));
    x->tr = tr;
    x->o = o;
    x->r = r;
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = o->policy == POL_STATIC ? 1000 : o->ratio_milli;
    if (b->trust_ms > 0)
        cfg.prediction_trust_ms = b->trust_ms;
    if (b->floor_start_ms != 0)
        cfg.floor_start_after_ms = b->floor_start_ms;
    for (size_t g = 0; g < o->n_pool; g++)
        x->vram_total += o->pool[g];
    /* a host budget only where a service may use it (static keeps every request: no suspend) */
    bool suspendable = false;
    for (size_t i = 0; i < tr->n && o->policy != POL_STATIC; i++)
        suspendable = suspendable || tr->svcs[i].spec.suspend.method != OSUB_SUSPEND_NONE;
    if (suspendable)
        cfg.suspend_host_mib = b->suspend_host_mib < 0 ? x->vram_total : b->suspend_host_mib;
    r->suspend_on = suspendable && cfg.suspend_host_mib > 0;
    x->suspend_mib_per_s = cfg.suspend_mib_per_s > 0 ? cfg.suspend_mib_per_s : 4096;
    int rc = osub_engine_new(&cfg, o->pool, NULL, o->n_pool, NULL, 0, &x->e);
    if (rc != 0) {
        snprintf(err, errlen, "pool: %s", osub_strerror(rc));
        return -1;
    }
    x->rs = calloc(tr->n, sizeof(*x->rs));
    x->fcap = 4096;
    x->fq = malloc(x->fcap * sizeof(*x->fq));
    size_t steps = sim__n_steps(tr);
    x->a.used = calloc(steps, sizeof(double));
    x->a.held = calloc(steps, sizeof(double));
    x->a.events = calloc(steps, sizeof(uint32_t));
    x->order = malloc(tr->n * sizeof(*x->order));
    x->oom_step = calloc(o->n_pool, sizeof(*x->oom_step));
    x->sus = calloc(tr->n, sizeof(*x->sus));
    if (sim__idmap_init(&x->m, tr) != 0 || x->rs == NULL || x->fq == NULL || x->a.used == NULL ||
        x->a.held == NULL || x->a.events == NULL || x->order == NULL || x->oom_step == NULL ||
        x->sus == NULL || view_init(x) != 0) {
        snprintf(err, errlen, "out of memory");
        erun_free(x);
        return -1;
    }
    for (size_t i = 0; i < tr->n; i++) {
        x->rs[i].wait_since = -1;
        x->sus[i].since_ms = x->sus[i].evict_since_ms = x->sus[i].wake_ms = -1;
    }
    for (size_t i = 0; i < tr->n; i++)
        x->order[i] = i;
    sort_tr = tr;
    qsort(x->order, tr->n, sizeof(*x->order), cmp_arrival);
    return 0;
}

/* One sampling instant: the services whose use went down report first, so that the order of
 * the reports does not make a peak that never was (an NVML poll sees them all at once). */
static void report_downs(struct erun *x, size_t k, int64_t t, int64_t now)
{
    const struct trace *tr = x->tr;
    for (size_t oi = 0; oi < tr->n; oi++) {
        size_t i = x->order[oi];
        struct run_svc *rs = &x->rs[i];
        if (rs->st != RS_PLACED)
            continue;
        /* the cursor moves to where step_service will find it at t */
        int64_t d = lane_demand(&x->lane[i], rs, t);
        if (d < 0)
            continue;
        const struct view *v = view_of(x, i);
        if (!v->live || (v->state != OSUB_STATE_RUNNING && v->state != OSUB_STATE_LOADING &&
                         v->state != OSUB_STATE_DEGRADED))
            continue;
        int64_t report = v->state == OSUB_STATE_DEGRADED && d > v->grant_mib ? v->grant_mib : d;
        if (report >= v->used_mib)
            continue;
        report_usage(x, i, report, x->lane[i].samples[rs->cur].compute_pct, now);
        rs->reported_k = k + 1;
        erun_events(x, now);
    }
}

/* Submits service i, arriving or waiting to (re)start. Returns false when it was refused (it
 * waits on, retried next step). */
static bool submit_waiting(struct erun *x, size_t i, size_t k, int64_t t, int64_t now)
{
    const struct trace_svc *s = &x->tr->svcs[i];
    struct run_svc *rs = &x->rs[i];
    struct sim_result *r = x->r;
    if (rs->never_fits) { /* as its refusal would have it */
        rs->st = RS_WAITING;
        return false;
    }
    if (rs->st == RS_FUTURE)
        rs->wait_since = t;
    osub_spec_t sp = s->spec;
    if (x->o->policy == POL_STATIC) {
        sp.preemptible = OSUB_TRI_NO; /* today's practice: every request kept */
        sp.suspend.method = OSUB_SUSPEND_NONE;
    }
    /* a preemptible service waits in the engine's queue (keeping its place and how long it has
     * waited); an online one is retried each step (its first refusal is a P0 disruption) */
    sp.queue = sp.preemptible == OSUB_TRI_NO || sim__level_of(sp.class_name) == 0 ? OSUB_TRI_NO
                                                                                  : OSUB_TRI_YES;
    osub_submit_result_t sr;
    /* a service already there when the trace begins was running before it */
    int src = osub_engine_submit(x->e, &sp, now, k == 0 ? OSUB_SUBMIT_RUNNING : 0, &sr);
    bool too_big = src == OSUB_ETOO_BIG || src == OSUB_ETOO_MANY_GPUS;
    if (too_big && rs->st == RS_FUTURE)
        r->too_big++;
    rs->never_fits = too_big && sr.outcome == OSUB_SUBMIT_REJECTED;
    view_touch(x, (int32_t)i);
    erun_events(x, now);
    if (sr.outcome == OSUB_SUBMIT_REJECTED) {
        if (rs->st == RS_FUTURE && sim__level_of(sp.class_name) == 0) {
            r->p0_disruptions++;
            rs->refused_p0 = true;
        }
        rs->st = RS_WAITING;
        return false;
    }
    rs->st = RS_PLACED;
    return true;
}

/* The memory is in use the moment it is reported, before anyone reacts: a GPU of service i
 * over its VRAM now is an OOM the engine was too late for. */
static void count_ooms(struct erun *x, size_t i, size_t k)
{
    const struct view *v = &x->v[i];
    for (int32_t sl = 0; sl < v->n_slots; sl++) {
        int32_t gix = x->slot_gpu[x->slot_off[i] + (size_t)sl];
        if (gpu_used(x, gix) > x->o->pool[gix] && x->oom_step[gix] != k + 1) {
            x->oom_step[gix] = k + 1;
            x->r->oom_events++;
            oom_line(x, gix, k);
        }
    }
}

/* What service i keeps on its GPUs once suspended: its spec's residual, at most what it used. */
static int64_t residual_of(const struct erun *x, size_t i)
{
    int64_t r = x->tr->svcs[i].spec.suspend.residual_mib;
    return r < x->sus[i].used_mib ? r : x->sus[i].used_mib;
}

/* The mechanisms' reports due by until_ms, in time order, each at its time (the engine acts on
 * each: a pending service whose victim is suspended starts then). */
static void run_timers(struct erun *x, int64_t until_ms)
{
    while (x->nt > 0) {
        size_t m = 0;
        for (size_t j = 1; j < x->nt; j++)
            if (x->tq[j].due_ms < x->tq[m].due_ms ||
                (x->tq[j].due_ms == x->tq[m].due_ms && x->tq[j].seq < x->tq[m].seq))
                m = j;
        struct stimer tm = x->tq[m];
        if (tm.due_ms > until_ms)
            return;
        x->tq[m] = x->tq[--x->nt];
        const struct view *v = view_of(x, (size_t)tm.svc);
        if (tm.gen != x->sus[tm.svc].gen || !v->live)
            continue; /* a report for a suspend or wake that is over */
        const char *id = x->lane[tm.svc].id;
        int rc;
        if (tm.resume && v->state == OSUB_STATE_RESUMING)
            rc = osub_engine_resumed(x->e, id, tm.due_ms);
        else if (!tm.resume && v->state == OSUB_STATE_SUSPENDING)
            rc = osub_engine_suspended(x->e, id, residual_of(x, (size_t)tm.svc), tm.due_ms);
        else
            continue;
        if (rc != 0)
            continue;
        if (!tm.resume) /* the time its memory took to move */
            x->r->suspend_transit_minutes +=
                (double)(tm.due_ms - x->sus[tm.svc].since_ms) / 60000.0;
        view_touch(x, tm.svc);
        erun_events(x, tm.due_ms); /* a start it allows ends a wait then (read_events_of) */
    }
}

/* Service i at step k in its suspend: suspending, its memory stays as measured while it moves;
 * suspended, it reports its residual; resuming, its memory is back (reported, as a loading
 * service's): it serves nothing meanwhile. */
static void step_suspended(struct erun *x, size_t i, size_t k, int64_t d, int64_t now)
{
    const struct view *v = &x->v[i];
    int64_t report = v->state == OSUB_STATE_SUSPENDED ? residual_of(x, i) : d;
    if (v->state == OSUB_STATE_SUSPENDING || v->used_mib == report)
        return;
    report_usage(x, i, report, x->lane[i].samples[x->rs[i].cur].compute_pct, now);
    x->rs[i].reported_k = k + 1;
    read_events(x);
    count_ooms(x, i, k);
    run_follow_ups(x, now);
}

/* Service i at step k: released past its last sample, submitted when it arrives or waits, else
 * its use reported (and an OOM counted where a GPU is over its VRAM). */
static void step_service(struct erun *x, size_t i, size_t k, int64_t t, int64_t now)
{
    const struct trace *tr = x->tr;
    const struct trace_svc *s = &tr->svcs[i];
    struct run_svc *rs = &x->rs[i];
    struct sim_result *r = x->r;
    struct acc *a = &x->a;
    if (rs->st == RS_GONE)
        return;
    int64_t d = lane_demand(&x->lane[i], rs, t);
    if (d < 0) {
        if (rs->st != RS_FUTURE) {
            /* past its last sample: release */
            osub_engine_release(x->e, s->spec.id, now);
            view_touch(x, (int32_t)i);
            erun_events(x, now);
            /* its trace ends while it waits (refused, queued or pending) or before it was back
             * from an eviction: the wait first, which an eviction under way covers */
            wait_ended(x, i, t);
            evict_ended(x, i, now);
            rs->st = RS_GONE;
        }
        return;
    }
    a->demand += d;
    r->service_steps++;
    if ((rs->st == RS_FUTURE || rs->st == RS_WAITING) && !submit_waiting(x, i, k, t, now))
        return;
    const struct view *v = view_of(x, i);
    if (!v->live) {
        rs->st = RS_WAITING; /* released (evicted, not resumable): retried */
        if (rs->wait_since < 0)
            rs->wait_since = t;
        return;
    }
    if (v->state == OSUB_STATE_QUEUED || v->state == OSUB_STATE_PENDING) {
        if (rs->wait_since < 0)
            rs->wait_since = t;
        return;
    }
    /* started (its start event ended the wait; this is a fallback), unless it is still leaving
     * after an eviction (draining, overdue): its wait to restart goes on */
    if (rs->wait_since >= 0 && v->state != OSUB_STATE_DRAINING && v->state != OSUB_STATE_OVERDUE)
        wait_ended(x, i, t);
    rs->started_once = true;
    if (in_suspend(v->state)) {
        step_suspended(x, i, k, d, now);
        return;
    }
    int64_t report = d;
    if (v->state == OSUB_STATE_DEGRADED && d > v->grant_mib) {
        report = v->grant_mib; /* it complies: the rest is demand left unmet */
        a->unmet += d - report;
    }
    if (rs->reported_k == k + 1 && v->used_mib == report)
        return; /* reported first, as it went down */
    report_usage(x, i, report, x->lane[i].samples[rs->cur].compute_pct, now);
    rs->reported_k = k + 1;
    read_events(x);
    count_ooms(x, i, k);
    run_follow_ups(x, now);
}

/* The end of step k: the engine's tick, who it started, the OOMs, the utilisation. */
static void end_step(struct erun *x, size_t k, int64_t now)
{
    struct sim_result *r = x->r;
    struct acc *a = &x->a;
    osub_engine_tick(x->e, now);
    erun_events(x, now);
    /* what the GPUs really hold now */
    for (size_t g = 0; g < x->o->n_pool; g++) {
        if (gpu_used(x, (int32_t)g) > x->o->pool[g] && x->oom_step[g] != k + 1) {
            x->oom_step[g] = k + 1;
            r->oom_events++;
            oom_line(x, (int32_t)g, k);
        }
    }
    osub_pool_info_t pi;
    osub_engine_pool_info(x->e, &pi);
    a->used[k] = (double)pi.used_mib / (double)x->vram_total;
    a->held[k] = (double)pi.held_mib / (double)x->vram_total;
    a->used_sum += a->used[k];
    a->held_sum += a->held[k];
    a->logical_sum += (double)pi.granted_mib / (double)pi.logical_mib;
    uint64_t evs = r->degrades[0] + r->degrades[1] + r->degrades[2] + r->evictions[0] +
                   r->evictions[1] + r->evictions[2] + r->suspends[1] + r->suspends[2];
    a->events[k] = (uint32_t)(evs - x->ev_before);
    x->ev_before = evs;
    a->steps++;
}

static int sim_engine(const struct trace *tr, const struct sim_opts *o, const struct sim_budget *b,
                      struct sim_result *r, struct progress *pg, char *err, size_t errlen)
{
    struct erun x;
    if (erun_init(&x, tr, o, b, r, err, errlen) != 0)
        return -1;
    size_t steps = sim__n_steps(tr);
    for (size_t k = 0; k < steps; k++) {
        int64_t t = tr->t0 + (int64_t)k * tr->step_s;
        int64_t now = (t - tr->t0) * 1000;
        sim__step_progress(pg, o, k, steps);
        if (x.nt > 0)
            run_timers(&x, now);
        if (k > 0)
            report_downs(&x, k, t, now);
        for (size_t oi = 0; oi < tr->n; oi++)
            step_service(&x, x.order[oi], k, t, now);
        end_step(&x, k, now);
    }
    for (size_t i = 0; i < tr->n; i++) { /* suspended, waiting or not back from an eviction */
        suspend_ended(&x, i, (tr->t1 - tr->t0 + tr->step_s) * 1000);
        wait_ended(&x, i, tr->t1 + tr->step_s);
        evict_ended(&x, i, (tr->t1 - tr->t0 + tr->step_s) * 1000);
    }
    sim__end_run(tr, b, &x.a, x.rs, r, o->timeline);
    x.a.used = x.a.held = NULL; /* sim__finish() took or freed them */
    x.a.events = NULL;
    erun_free(&x);
    return 0;
}

int sim_run(const struct trace *tr, const struct sim_opts *o, const struct sim_budget *b,
            struct sim_result *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    r->samples = (int64_t)trace_samples(tr); /* the trace's rows, whatever the policy */
    r->policy = o->policy;
    r->ratio_milli = o->policy == POL_STATIC ? 1000 : o->ratio_milli;
    r->n_gpus = (int32_t)o->n_pool;
    if (tr->n == 0 || o->n_pool == 0) {
        snprintf(err, errlen, "nothing to simulate");
        return -1;
    }
    struct progress pg;
    progress_begin(&pg);
    int rc;
    switch (o->policy) {
    case POL_STATIC:
    case POL_OVERSUB:
        rc = sim_engine(tr, o, b, r, &pg, err, errlen);
        break;
    case POL_BRIEF:
        rc = sim__brief(tr, o, b, r, &pg, err, errlen);
        break;
    case POL_HINDSIGHT:
        rc = sim__hindsight(tr, o, b, r, err, errlen);
        break;
    default:
        snprintf(err, errlen, "unknown policy");
        return -1;
    }
    /* a run long enough to have said how it went says how it ended */
    if (rc == 0 && pg.said && progress_file() != NULL) {
        double dt = progress_elapsed(&pg);
        fprintf(progress_file(),
                "simulate: %s at %d.%03d on %zu GPUs: %lld steps, %lld samples in %.1f s "
                "(%.2fM samples/s); peak RSS %.0f MiB\n",
                sim_policy_name(o->policy), r->ratio_milli / 1000, r->ratio_milli % 1000, o->n_pool,
                (long long)r->steps, (long long)r->samples, dt,
                dt > 0 ? (double)r->samples / dt / 1e6 : 0.0, peak_rss_mib());
    }
    return rc;
}

int32_t sim_min_gpus(const struct trace *tr, enum sim_policy p, int32_t ratio_milli,
                     int64_t gpu_mib, int32_t lo, int32_t hi, const struct sim_budget *b,
                     bool timeline, struct sim_result *res, char *err, size_t errlen)
{
    int64_t *pool = malloc((size_t)(hi > 0 ? hi : 1) * sizeof(*pool));
    if (pool == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int32_t i = 0; i < hi; i++)
        pool[i] = gpu_mib;
    struct sim_opts o = {.policy = p, .ratio_milli = ratio_milli, .pool = pool};
    struct sim_result r;
    int32_t best = 0;
    /* feasibility is not monotonic in the pool size (a different pool places services
     * differently): walk up from the lower bound when that is affordable, else binary search */
    if (hi - lo <= 64) {
        for (int32_t n = lo; n <= hi && best == 0; n++) {
            o.n_pool = (size_t)n;
            if (sim_run(tr, &o, b, &r, err, errlen) != 0) {
                free(pool);
                return -1;
            }
            if (r.feasible)
                best = n;
            sim_result_free(&r);
        }
        lo = hi + 1; /* skip the binary search */
    }
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        o.n_pool = (size_t)mid;
        if (sim_run(tr, &o, b, &r, err, errlen) != 0) {
            free(pool);
            return -1;
        }
        if (r.feasible) {
            best = mid;
            hi = mid - 1;
        } else {
            lo = mid + 1;
        }
        sim_result_free(&r);
    }
    if (best > 0) {
        o.n_pool = (size_t)best;
        o.timeline = timeline;
        if (sim_run(tr, &o, b, res, err, errlen) != 0) {
            free(pool);
            return -1;
        }
    }
    free(pool);
    return best;
}

/* ---- who may be suspended ------------------------------------------------------------ */

/* Whether id is among the share milli (of 1000) picked under salt: FNV-1a 64 of salt + id,
 * modulo 1000, below milli. */
static bool picked(const char *salt, const char *id, int32_t milli)
{
    if (milli >= 1000 || milli <= 0)
        return milli >= 1000;
    char key[96];
    snprintf(key, sizeof(key), "%s%s", salt, id);
    return fnv1a64(key) % 1000 < (uint64_t)milli;
}

bool sim_suspend_picked(const char *id, int32_t milli)
{
    return picked("suspend:", id, milli);
}

size_t sim_mark_degrade(struct trace *tr, int32_t milli)
{
    size_t n = 0;
    for (size_t i = 0; i < tr->n; i++) {
        osub_spec_t *sp = &tr->svcs[i].spec;
        bool vram_floor = sp->min_vram_mib > 0 && sp->min_vram_mib < sp->vram_mib;
        if (sim__level_of(sp->class_name) == 0 || (!vram_floor && sp->min_batch_size <= 0))
            continue;
        if (picked("degrade:", sp->id, milli)) {
            n++;
            continue;
        }
        sp->min_vram_mib = 0; /* no floor: a degrade would go unanswered */
        sp->min_batch_size = 0;
    }
    return n;
}

size_t sim_mark_suspend(struct trace *tr, int32_t milli, int64_t residual_mib)
{
    size_t n = 0;
    for (size_t i = 0; i < tr->n; i++) {
        osub_spec_t *sp = &tr->svcs[i].spec;
        bool preemptible =
            sim__level_of(sp->class_name) > 0 && sp->preemptible != OSUB_TRI_NO && !sp->exclusive;
        if (sp->suspend.method == OSUB_SUSPEND_NONE && preemptible &&
            sim_suspend_picked(sp->id, milli)) {
            int64_t r = residual_mib * (sp->gpus > 1 ? sp->gpus : 1);
            sp->suspend.method = OSUB_SUSPEND_CUDA;
            sp->suspend.residual_mib = r < sp->vram_mib ? r : sp->vram_mib;
            sp->resume_cost_ms = -1; /* DESIGN.md: its grant at suspend_mib_per_s, plus 1 s */
        }
        n += sp->suspend.method != OSUB_SUSPEND_NONE;
    }
    return n;
}

size_t sim_mark_relocate(struct trace *tr)
{
    size_t n = 0;
    for (size_t i = 0; i < tr->n; i++) {
        osub_spec_t *sp = &tr->svcs[i].spec;
        if (sp->suspend.method == OSUB_SUSPEND_CUDA && sp->gpus <= 1 && !sp->exclusive)
            sp->suspend.relocate = true;
        n += sp->suspend.relocate;
    }
    return n;
}
