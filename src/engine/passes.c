/* passes.c - what time and freed memory set off: timers (acknowledgements, grace periods, loading),
 * the pending list, the queue, pressure, restores, the tick */
#include <assert.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- timers, pending, queue, pressure, restore ---------------------------------------- */

static void on_deadline(osub_engine_t *e, struct svc *s)
{
    s->heap_pos[T_DEADLINE] = -1;
    s->timer_at[T_DEADLINE] = 0;
    if (s->state == OSUB_STATE_SUSPENDING) {
        osub__suspend_timeout(e, s);
        return;
    }
    if (s->state == OSUB_STATE_DEGRADED && s->ack_pending) {
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_ESCALATE, OSUB_R_ACK_TIMEOUT,
                       "%s did not acknowledge its degrade within %lld ms: evicting it", s->spec.id,
                       (long long)e->cfg.ack_timeout_ms);
        osub__ev_svc(ev, s);
        char cause[OSUB_ID_MAX + 1];
        osub__str_copy(cause, sizeof(cause), s->preemptor);
        osub__svc_evict(e, s, cause, s->preemptor_level, OSUB_R_ACK_TIMEOUT);
        return;
    }
    if (s->state == OSUB_STATE_DRAINING) {
        osub__set_state(e, s, OSUB_STATE_OVERDUE);
        s->deadline_ms = e->now + s->grace_ms;
        osub__timer_set(e, s, T_DEADLINE, s->deadline_ms);
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_OVERDUE, OSUB_R_GRACE_OVER,
                       "%s is overdue: its grace period ended and its %lld MiB are not "
                       "seen free yet",
                       s->spec.id, (long long)osub__held_total(s));
        osub__ev_svc(ev, s);
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
            if (osub__queue_reserve(e, e->n_queue + 1) != 0) {
                i++;
                continue;
            }
            osub__svc_to_queue(e, p);
            osub_event_t *ev = osub__emit(e, OSUB_EV_REQUEUE, OSUB_R_VICTIM_OVERDUE,
                                          "%s gave up waiting for %s, overdue for a second grace "
                                          "period, and is back in the queue at position %zu",
                                          p->spec.id, s->spec.id, osub__queue_pos(e, p));
            osub__ev_svc(ev, p);
        }
    }
}

static void on_load(osub_engine_t *e, struct svc *s)
{
    s->heap_pos[T_LOAD] = -1;
    s->timer_at[T_LOAD] = 0;
    if (!s->loading)
        return;
    /* a victim evicted while it loaded may be loading still: what its load was expected to
     * reach stays counted until it exits (else a waiting service would start on memory that
     * is only unreported, not free) */
    if (s->state == OSUB_STATE_DRAINING || s->state == OSUB_STATE_OVERDUE)
        return;
    bool waking = s->state == OSUB_STATE_RESUMING;
    osub__end_loading(e, s);
    osub_event_t *ev = osub__emit(e, OSUB_EV_READY, OSUB_R_LOADED,
                                  "%s is taken as %s after %lld ms; held now follows its usage",
                                  s->spec.id, waking ? "resumed" : "loaded",
                                  (long long)(waking ? s->resume_cost_ms : s->restart_cost_ms));
    osub__ev_svc(ev, s);
}

void osub__run_timers(osub_engine_t *e)
{
    while (e->n_heap > 0 && e->heap[0].at <= e->now) {
        struct timer_ent t = e->heap[0];
        e->n_heap--;
        if (e->n_heap > 0) {
            osub__heap_set(e, 0, e->heap[e->n_heap]);
            osub__heap_down(e, 0);
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
    osub__emit(e, OSUB_EV_OVERCOMMIT, OSUB_R_ROOM_FREED,
               "the grants fit the logical capacity again: admissions resume");
}

static void process_pending(osub_engine_t *e)
{
    for (size_t i = 0; i < e->n_pending;) {
        struct svc *s = e->pending[i];
        if (osub__pending_can_start(e, s)) {
            osub__svc_start(e, s, OSUB_R_ROOM_FREED); /* removes it from the pending list */
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
        osub__fill_req(e, s, &r);
        r.quiet = true;

        struct plan p;
        if (!osub__may_fit(e, &r, osub__min_share(e, s, &r))) {
            p.ok = false; /* cannot fit even with every lower level evicted: no plan needed */
        } else {
            planned++;
            osub__plan_for(e, s, &r, &p);
        }
        if (p.ok && i > 0) {
            /* backfill: not ahead of the head unless it delays nothing */
            struct svc **q = e->queue;
            (void)q;
            if (!osub__backfill_ok(e, &p, s->level))
                p.ok = false;
        }
        if (!p.ok || osub__admit_reserve(e, s, &p) != 0) {
            if (i == 0 && e->now - s->since_ms >= e->cfg.queue_aging_ms)
                return; /* aged head: nobody passes it */
            i++;
            continue;
        }
        if (e->queue[i] == s)
            osub__queue_remove_at(e, i);
        else
            osub__queue_remove(e, s);
        osub__admit_apply(e, s, &p, OSUB_R_ROOM_FREED);
        /* the queue shifted: look again from the same position */
    }
}

void osub__check_pressure(osub_engine_t *e, int32_t gi)
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
    if (osub__timer_reserve(e, 2 * (size_t)p.n_victims) != 0)
        return;
    for (int32_t i = 0; i < p.n_victims; i++) {
        if (p.acts[i] == ACT_EVICT)
            osub__svc_evict(e, p.victims[i], "", -1, OSUB_R_PRESSURE);
        else if (p.acts[i] == ACT_SUSPEND)
            osub__svc_suspend(e, p.victims[i], "", -1, OSUB_R_PRESSURE);
        else
            osub__svc_degrade(e, p.victims[i], "", -1, OSUB_R_PRESSURE);
    }
}

/* Compute contention (DESIGN.md "Compute"): measured compute above 100% of a GPU cuts the
 * batch of one preemptible service there, lowest priority and most recent first, one per
 * report; memory is never touched and nothing is evicted for compute. */
void osub__check_compute(osub_engine_t *e, int32_t gi)
{
    struct gpu *g = &e->gpus[gi];
    if (g->compute_measured <= 100)
        return;
    for (int32_t i = 0; i < g->nsvc; i++) {
        struct svc *v = g->svcs[i]; /* victim order already */
        if (!osub__svc_victim_eligible(v) || osub__in_suspend(v) || v->batch_degraded ||
            v->batch <= v->floor_batch)
            continue;
        int32_t from = v->batch;
        v->batch = v->floor_batch;
        v->batch_degraded = true;
        v->batch_room_since_ms = -1;
        v->n_degrades++;
        e->degrades++;
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_DEGRADE, OSUB_R_COMPUTE,
                       "cut the batch of %s (%s) from %d to %d: GPU %d's measured "
                       "compute is %d%%; its memory is untouched",
                       v->spec.id, osub__class_of(e, v), from, v->batch, gi, g->compute_measured);
        osub__ev_svc(ev, v);
        ev->batch_size = v->batch;
        ev->vram_mib = osub__grant_total(v);
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
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_RESTORE, OSUB_R_COMPUTE,
                       "restored the batch of %s from %d to %d: compute stayed at or "
                       "under 80%% for %lld ms",
                       s->spec.id, from, s->batch, (long long)e->cfg.hysteresis_ms);
        osub__ev_svc(ev, s);
        ev->batch_size = s->batch;
        ev->vram_mib = osub__grant_total(s);
    }
}

void osub__process(osub_engine_t *e)
{
    if (e->n_pending > 0 && e->pending_check)
        process_pending(e);
    e->pending_check = false;
    for (int round = 0; round < 4 && e->dirty; round++) {
        e->dirty = false;
        check_overcommit(e);
        process_pending(e);
        if (e->n_suspended > 0)
            osub__process_wakes(e); /* ahead of the queued services of their level */
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
    return osub__max64(s->slots[i].used, osub__min64(full, pred));
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
        osub__slot_set_grant(e, s, &s->slots[i], osub__share(s->full_total, s->k, i));
        s->slots[i].held_grant = s->slots[i].grant;
    }
    int32_t from_batch = s->batch;
    s->batch = s->full_batch;
    s->batch_degraded = false;
    osub__set_state(e, s, s->loading ? OSUB_STATE_LOADING : OSUB_STATE_RUNNING);
    s->used_capped = false;
    s->room_since_ms = -1;
    e->restores++;
    osub__svc_sync(e, s);
    char gb[96];
    osub__fmt_gpus(s, gb, sizeof(gb));
    osub_event_t *ev =
        osub__emit(e, OSUB_EV_RESTORE, OSUB_R_ROOM_STABLE,
                   "restored %s (%s) to %lld MiB on %s, batch %d -> %d: room lasted %lld ms",
                   s->spec.id, osub__class_of(e, s), (long long)s->full_total, gb, from_batch,
                   s->batch, (long long)e->cfg.hysteresis_ms);
    osub__ev_svc(ev, s);
    ev->vram_mib = s->full_total;
    ev->batch_size = s->batch;
}

void osub__process_restores(osub_engine_t *e)
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
    osub__clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    int rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    for (int32_t i = 0; i < e->n_gpus; i++)
        osub__check_pressure(e, i);
    osub__process_restores(e);
    process_compute_restores(e);
    e->dirty = true;
    e->in_tick = true;
    osub__finish(e);
    e->in_tick = false;
    return 0;
}
