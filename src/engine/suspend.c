/* suspend.c - suspend, the rung between degrade and evict: the spec's method, the decision, the
 * reports of the daemon's mechanisms, the timeout, the wake pass and the operator's commands */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- spec and derived fields -------------------------------------------------------------- */

int osub__resolve_suspend(const osub_engine_t *e, const osub_spec_t *in, bool pre, osub_spec_t *o)
{
    const osub_suspend_spec_t *x = &in->suspend;
    osub_suspend_spec_t *y = &o->suspend;
    memset(y, 0, sizeof(*y));
    if ((unsigned)x->method > OSUB_SUSPEND_HTTP)
        return OSUB_EBAD_SUSPEND;
    if (in->resume_cost_ms < -1 || in->resume_cost_ms > 86400000LL)
        return OSUB_EBAD_TIME;
    if (x->method == OSUB_SUSPEND_NONE) {
        o->resume_cost_ms = -1; /* nothing to resume: one spelling of "not suspendable" */
        return 0;
    }
    if (!pre)
        return OSUB_EBACKED_SUSPEND;
    if (x->residual_mib < 0 || x->residual_mib > in->vram_mib)
        return OSUB_EBAD_SUSPEND;
    /* a remap restores one process's checkpoint onto other GPUs: the CUDA driver's alone, and
     * one GPU only (a multi-GPU service is NCCL across processes, which cannot be checkpointed) */
    if (x->relocate && (x->method != OSUB_SUSPEND_CUDA || in->gpus > 1 || in->exclusive))
        return OSUB_EBAD_SUSPEND;
    y->method = x->method;
    y->residual_mib = x->residual_mib;
    y->relocate = x->relocate;
    /* DESIGN.md: its grant at the pool's suspend_mib_per_s, plus 1 s */
    o->resume_cost_ms = in->resume_cost_ms >= 0
                            ? in->resume_cost_ms
                            : o->vram_mib * 1000 / e->cfg.suspend_mib_per_s + 1000;
    return 0;
}

void osub__susp_derive(struct svc *s)
{
    s->suspendable = s->preemptible && s->spec.suspend.method != OSUB_SUSPEND_NONE;
    s->resume_cost_ms = s->spec.resume_cost_ms > 0 ? s->spec.resume_cost_ms : 0;
    s->residual_est = s->spec.suspend.residual_mib;
}

/* ---- planning's view ----------------------------------------------------------------------- */

bool osub__suspendable_now(const osub_engine_t *e, const struct svc *v, bool pressure)
{
    if (e->cfg.suspend_host_mib <= 0 || !osub__susp_state_ok(v))
        return false;
    return pressure || !v->woke || e->now - v->wake_ms >= e->cfg.suspend_min_runtime_ms;
}

int64_t osub__host_need(const struct svc *s)
{
    return osub__max64(osub__used_total(s), osub__grant_total(s));
}

int64_t osub__residual_share(const struct svc *s, int32_t i)
{
    return osub__share(s->residual_est, s->k, i);
}

/* ---- transitions ------------------------------------------------------------------------- */

void osub__susp_list_add(osub_engine_t *e, struct svc *s)
{
    s->sprev = NULL;
    s->snext = e->suspended;
    if (e->suspended)
        e->suspended->sprev = s;
    e->suspended = s;
    e->n_suspended++;
}

void osub__susp_list_remove(osub_engine_t *e, struct svc *s)
{
    if (s->sprev)
        s->sprev->snext = s->snext;
    else
        e->suspended = s->snext;
    if (s->snext)
        s->snext->sprev = s->sprev;
    s->sprev = s->snext = NULL;
    e->n_suspended--;
}

void osub__susp_clear(osub_engine_t *e, struct svc *s)
{
    if (s->host_mib == 0)
        return;
    e->host_used -= s->host_mib;
    s->host_mib = 0;
    s->susp_hold = false;
    s->susp_idle = false;
    assert(e->host_used >= 0);
}

void osub__svc_suspend(osub_engine_t *e, struct svc *s, const char *cause, int32_t cause_level,
                       osub_reason_t reason)
{
    assert(osub__susp_state_ok(s));
    s->susp_from = s->state;
    s->host_mib = osub__host_need(s);
    e->host_used += s->host_mib;
    osub__set_state(e, s, OSUB_STATE_SUSPENDING);
    s->room_since_ms = -1;
    s->n_suspends++;
    e->suspends++;
    s->deadline_ms = e->now + e->cfg.suspend_timeout_ms;
    osub__str_copy(s->preemptor, sizeof(s->preemptor), cause ? cause : "");
    s->preemptor_level = cause_level;
    osub__timer_set(e, s, T_DEADLINE, s->deadline_ms);
    osub__svc_sync(e, s);
    char gb[96], why[200];
    osub__fmt_gpus(s, gb, sizeof(gb));
    if (cause && cause[0])
        osub__fmt(why, sizeof(why), "to make room for %s (level %d)", cause, cause_level);
    else if (reason == OSUB_R_PRESSURE)
        osub__fmt(why, sizeof(why), "because %s is above its high watermark", gb);
    else if (reason == OSUB_R_IDLE)
        osub__fmt(why, sizeof(why), "because it is idle: it lends its memory until a request");
    else
        osub__fmt(why, sizeof(why), "as an operator asked: it stays suspended until resumed");
    osub_event_t *ev = osub__emit(
        e, OSUB_EV_SUSPEND, reason,
        "suspending %s (%s, %lld MiB held) on %s %s; its memory goes to the host (%lld of %lld "
        "MiB counted), its %lld MiB grant stays; done within %lld ms or it is evicted",
        s->spec.id, osub__class_of(e, s), (long long)osub__held_total(s), gb, why,
        (long long)e->host_used, (long long)e->cfg.suspend_host_mib,
        (long long)osub__grant_total(s), (long long)e->cfg.suspend_timeout_ms);
    osub__ev_svc(ev, s);
    osub__str_copy(ev->cause, sizeof(ev->cause), cause ? cause : "");
    ev->cause_level = cause_level;
    ev->vram_mib = osub__grant_total(s);
    ev->deadline_ms = s->deadline_ms;
}

/* Escalation of a suspend that did not happen: evicted with its grace, as an ignored degrade. */
static void suspend_escalate(osub_engine_t *e, struct svc *s, osub_reason_t reason,
                             const char *what)
{
    osub_event_t *ev =
        osub__emit(e, OSUB_EV_ESCALATE, reason, "%s %s: evicting it", s->spec.id, what);
    osub__ev_svc(ev, s);
    char cause[OSUB_ID_MAX + 1];
    osub__str_copy(cause, sizeof(cause), s->preemptor);
    /* a failed resume stays counted as loading: what it was restoring is held until it exits */
    osub__svc_evict(e, s, cause, s->preemptor_level, reason);
}

void osub__suspend_timeout(osub_engine_t *e, struct svc *s)
{
    char what[96];
    osub__fmt(what, sizeof(what), "did not finish suspending within %lld ms",
              (long long)e->cfg.suspend_timeout_ms);
    suspend_escalate(e, s, OSUB_R_SUSPEND_TIMEOUT, what);
}

/* Gives s its GPUs back: resuming, held like a loading service until it reports or its resume
 * cost has passed. The caller reserved a timer. */
static void svc_wake(osub_engine_t *e, struct svc *s, osub_reason_t reason)
{
    osub__set_state(e, s, OSUB_STATE_RESUMING);
    s->loading = true;
    s->woke = true;
    s->wake_ms = e->now;
    s->start_ms = e->now;
    e->wakes++;
    osub__timer_set(e, s, T_LOAD, e->now + s->resume_cost_ms);
    osub__svc_sync(e, s);
    char gb[96];
    osub__fmt_gpus(s, gb, sizeof(gb));
    char moved[160] = "";
    if (reason == OSUB_R_RELOCATE)
        osub__fmt(moved, sizeof(moved),
                  "GPU %d, where it was suspended, has no room while this one does: its checkpoint "
                  "is restored here (a remap, no reload)",
                  (int)(s->reloc_from1 - 1));
    osub_event_t *ev = osub__emit(
        e, OSUB_EV_WAKE, reason,
        "resuming %s (%s) on %s with its %lld MiB grant: %s; resumed within %lld ms, then not "
        "suspended again for %lld ms save under pressure",
        s->spec.id, osub__class_of(e, s), gb, (long long)osub__grant_total(s),
        reason == OSUB_R_USER       ? "an operator asked"
        : reason == OSUB_R_IDLE     ? "a request came for it, suspended for idleness"
        : reason == OSUB_R_RELOCATE ? moved
                                    : "its GPUs have room again",
        (long long)s->resume_cost_ms, (long long)e->cfg.suspend_min_runtime_ms);
    osub__ev_svc(ev, s);
    ev->vram_mib = osub__grant_total(s);
    ev->batch_size = s->batch;
    ev->deadline_ms = e->now + s->resume_cost_ms;
}

/* Room to wake s: on every GPU it left, what is held there without it plus its grant stays under
 * the high watermark. */
static bool wake_room(const osub_engine_t *e, const struct svc *s)
{
    for (int32_t i = 0; i < s->n_slots; i++) {
        const struct slot *sl = &s->slots[i];
        const struct gpu *g = &e->gpus[sl->gpu];
        if (g->lost || g->held - sl->held + osub__max64(sl->grant, sl->used) > g->hw_lim)
            return false;
    }
    return true;
}

/* Whether waking s may go ahead of the queue: the queue head is of its level or lower priority,
 * or its wake delays nothing the head waits for (the backfill rule). */
static bool wake_before_queue(osub_engine_t *e, const struct svc *s)
{
    if (e->n_queue == 0 || s->level <= e->queue[0]->level)
        return true;
    struct plan p;
    memset(&p, 0, sizeof(p));
    p.k = s->n_slots;
    for (int32_t i = 0; i < s->n_slots; i++)
        p.gpus[i] = s->slots[i].gpu;
    return osub__backfill_ok(e, &p, s->level);
}

static int cmp_wake(const void *a, const void *b)
{
    const struct svc *x = *(const struct svc *const *)a, *y = *(const struct svc *const *)b;
    if (x->level != y->level)
        return x->level < y->level ? -1 : 1;
    if (x->submit_ms != y->submit_ms)
        return x->submit_ms < y->submit_ms ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Whether a migration is under way: a service evicted to restart elsewhere (marked by its own
 * id as its preemptor) whose memory is not yet seen free. Until it is requeued, the room it left
 * for is claimed by nothing, so no second service is sent after it. */
static bool migration_in_flight(const osub_engine_t *e)
{
    for (const struct svc *v = e->head; v; v = v->next)
        if ((v->state == OSUB_STATE_DRAINING || v->state == OSUB_STATE_OVERDUE) &&
            strcmp(v->preemptor, v->spec.id) == 0)
            return true;
    return false;
}

/* A migration's plan for suspended s, on any GPUs, with no victims: its whole request once it
 * has waited its restart cost; else, once it has also waited the queue's aging time (the bound
 * on a queue head's wait), a degradable one at its floor (a degraded start, as a queued service
 * may make): a suspended service can wake only into room for its whole grant, and one whose GPUs
 * stay full would otherwise wait there for hours while another GPU has room for its floor. */
static bool migrate_plan(osub_engine_t *e, const struct svc *s, struct plan *p)
{
    int64_t waited = e->now - s->since_ms;
    if (waited < s->restart_cost_ms)
        return false;
    bool at_floor = s->degradable && !s->spec.exclusive && s->floor_total < s->full_total &&
                    e->cfg.floor_start_after_ms >= 0 && waited >= e->cfg.queue_aging_ms;
    struct req r;
    osub__fill_req(e, s, &r);
    r.quiet = true;
    int64_t share = osub__min_share(e, s, &r);
    if (at_floor)
        share = osub__min64(share, s->floor_total / r.k);
    if (!osub__may_fit(e, &r, share))
        return false;
    osub__plan_admission(e, &r, p);
    p->degraded_start = false;
    if (p->ok && p->n_victims == 0)
        return true;
    return at_floor && osub__plan_floor_start(e, s, &r, p);
}

/* Migrate: suspended s has waited for room on its own GPUs while another set of GPUs has room
 * for it now (migrate_plan), without delaying the queue head: it is evicted (reason migrate) and
 * requeued at its place, to restart there (at its floor at once if that is what the plan found).
 * A CUDA checkpoint is restored where it was taken and a sleeping vLLM wakes where it sleeps, so
 * a restart elsewhere is a reload: an eviction, counted as one (DESIGN.md, "Suspend"). Only for a
 * service that an eviction requeues and that nobody holds suspended (operator, idleness: the
 * caller skips those), and one at a time. Returns whether it was evicted. */
static bool try_migrate(osub_engine_t *e, struct svc *s)
{
    if (s->state != OSUB_STATE_SUSPENDED || !s->requeue_on_evict)
        return false;
    struct plan p;
    if (!migrate_plan(e, s, &p))
        return false;
    /* its own GPUs are where a wake brings it back without a reload */
    for (int32_t i = 0; i < p.k; i++)
        for (int32_t j = 0; j < s->n_slots; j++)
            if (p.gpus[i] == s->slots[j].gpu)
                return false;
    if (!osub__backfill_ok(e, &p, s->level) || migration_in_flight(e) ||
        osub__timer_reserve(e, 1) != 0)
        return false;
    s->floor_now = p.degraded_start; /* before: the eviction's message says so */
    osub__svc_evict(e, s, "", -1, OSUB_R_MIGRATE);
    /* the event names no preemptor (it is none); the record keeps itself as one: in flight */
    snprintf(s->preemptor, sizeof(s->preemptor), "%s", s->spec.id);
    s->preemptor_level = s->level;
    return true;
}

/* The GPU suspended s (one GPU, relocate) could be restored onto: another of the same size (the
 * mechanism checks that it is the same chip, and fails the resume if not), in service, where its
 * grant fits the logical capacity, its compute the compute limit and its wake (its grant, or what
 * it measured if more) the high watermark; the tightest such fit. -1 when none. */
static int32_t relocate_target(const osub_engine_t *e, const struct svc *s)
{
    const struct slot *sl = &s->slots[0];
    const struct gpu *from = &e->gpus[sl->gpu];
    int64_t need = osub__max64(sl->grant, s->host_mib);
    int64_t climit = (int64_t)100 * e->cfg.compute_ratio_milli / 1000;
    int32_t best = -1;
    int64_t best_left = 0;
    for (int32_t i = 0; i < e->n_gpus; i++) {
        const struct gpu *g = &e->gpus[i];
        if (i == sl->gpu || g->lost || g->cordoned || g->excl != NULL || g->vram != from->vram ||
            g->granted + sl->grant > g->logical || g->held + need > g->hw_lim ||
            (s->spec.compute_pct > 0 && g->compute_all + s->spec.compute_pct > climit))
            continue;
        int64_t left = g->hw_lim - g->held - need;
        if (best < 0 || left < best_left) {
            best = i;
            best_left = left;
        }
    }
    return best;
}

/* Relocate: suspended s (method cuda, relocate, one GPU) whose own GPU has no room to wake it is
 * moved, grant and all, to another GPU that has (relocate_target) and woken there: the driver
 * restores its checkpoint onto that GPU (the mechanism is told the GPU it was taken on), so it
 * loses no more than a wake's time, and no eviction. Not while nobody may wake it (operator,
 * idleness: the caller skips those), and not ahead of the queue head's room. Returns whether
 * it was woken. */
static bool try_relocate(osub_engine_t *e, struct svc *s)
{
    if (s->state != OSUB_STATE_SUSPENDED || !s->spec.suspend.relocate || s->n_slots != 1)
        return false;
    int32_t to = relocate_target(e, s);
    if (to < 0)
        return false;
    struct plan p;
    memset(&p, 0, sizeof(p));
    p.k = 1;
    p.gpus[0] = to;
    if ((e->n_queue > 0 && s->level > e->queue[0]->level && !osub__backfill_ok(e, &p, s->level)) ||
        osub__gpu_list_reserve(&e->gpus[to]) != 0 || osub__timer_reserve(e, 1) != 0)
        return false;
    int32_t from = s->slots[0].gpu;
    osub__svc_move(e, s, 0, to);
    s->reloc_from1 = from + 1;
    svc_wake(e, s, OSUB_R_RELOCATE); /* to resuming: reloc_from1 stays until it is over */
    return true;
}

void osub__process_wakes(osub_engine_t *e)
{
    enum { BATCH = 64 };
    struct svc *c[BATCH];
    int32_t n = 0;
    /* the first BATCH suspended services in wake order (by level, then submit time); more
     * are looked at as these leave */
    for (struct svc *s = e->suspended; s; s = s->snext) {
        if (s->susp_hold)
            continue;
        if (n < BATCH) {
            c[n++] = s;
            continue;
        }
        int32_t worst = 0;
        for (int32_t i = 1; i < n; i++)
            if (cmp_wake(&c[i], &c[worst]) > 0)
                worst = i;
        if (cmp_wake(&s, &c[worst]) < 0)
            c[worst] = s;
    }
    qsort(c, (size_t)n, sizeof(c[0]), cmp_wake);
    bool migrated = false; /* one a pass: the room it goes to is not claimed until it is queued */
    for (int32_t i = 0; i < n; i++) {
        struct svc *s = c[i];
        if (!wake_room(e, s)) {
            if (!try_relocate(e, s) && !migrated)
                migrated = try_migrate(e, s);
            continue;
        }
        if (!wake_before_queue(e, s) || osub__timer_reserve(e, 1) != 0)
            continue;
        svc_wake(e, s, OSUB_R_ROOM_FREED);
    }
}

/* ---- commands ---------------------------------------------------------------------------- */

int osub_engine_suspend(osub_engine_t *e, const char *id, unsigned flags, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (!s->suspendable)
        return OSUB_ENOT_SUSPENDABLE;
    bool already = s->state == OSUB_STATE_SUSPENDING || s->state == OSUB_STATE_SUSPENDED;
    if (!already && !osub__susp_state_ok(s))
        return OSUB_EBAD_STATE;
    if (!already && e->host_used + osub__host_need(s) > e->cfg.suspend_host_mib)
        return OSUB_EHOST_FULL;
    if (osub__timer_reserve(e, 1) != 0)
        return OSUB_ENOMEM;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    /* the timers that ran keep it placed and add no held memory: what was checked stands, but
     * a degrade of it may have escalated meanwhile */
    if (osub__in_suspend(s) || osub__susp_state_ok(s)) {
        /* an operator's hold is not an idle one: only an idle one is woken by a request */
        s->susp_idle = (flags & OSUB_SUSPEND_IDLE) != 0 && (!s->susp_hold || s->susp_idle);
        s->susp_hold = true;
    }
    if (!already && osub__susp_state_ok(s))
        osub__svc_suspend(e, s, "", -1,
                          (flags & OSUB_SUSPEND_IDLE) != 0 ? OSUB_R_IDLE : OSUB_R_USER);
    osub__finish(e);
    return 0;
}

int osub_engine_resume(osub_engine_t *e, const char *id, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (!osub__in_suspend(s))
        return OSUB_EBAD_STATE;
    if (osub__timer_reserve(e, 1) != 0)
        return OSUB_ENOMEM;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    osub_reason_t why = s->susp_idle ? OSUB_R_IDLE : OSUB_R_USER;
    s->susp_hold = false;
    s->susp_idle = false;
    if (s->state == OSUB_STATE_SUSPENDED && wake_room(e, s))
        svc_wake(e, s, why);
    e->dirty = true;
    osub__finish(e);
    return 0;
}

/* Whether victim v of a pending service has done all it will do: nothing outstanding. */
static bool victim_settled(const osub_engine_t *e, const char *id)
{
    const struct svc *v = osub__e_lookup(e, id);
    return v == NULL || (!v->ack_pending && v->state != OSUB_STATE_SUSPENDING &&
                         v->state != OSUB_STATE_DRAINING && v->state != OSUB_STATE_OVERDUE);
}

/* A pending service that waited for s's suspend, whose victims have all done what they will,
 * and that still cannot start (s kept more than its planned residual) goes back to the queue,
 * where it is planned again with the residual as measured, at its place. */
static void requeue_stuck_waiters(osub_engine_t *e, const struct svc *s)
{
    for (size_t i = 0; i < e->n_pending;) {
        struct svc *p = e->pending[i];
        bool waits = false, settled = true;
        for (int32_t w = 0; w < p->n_waits; w++) {
            waits = waits || strcmp(p->waits[w].service, s->spec.id) == 0;
            settled = settled && victim_settled(e, p->waits[w].service);
        }
        if (!waits || !settled || osub__pending_can_start(e, p) ||
            osub__queue_reserve(e, e->n_queue + 1) != 0) {
            i++;
            continue;
        }
        osub__svc_to_queue(e, p);
        osub_event_t *ev = osub__emit(
            e, OSUB_EV_REQUEUE, OSUB_R_RESIDUAL,
            "%s still has no room after %s's suspend (it kept %lld MiB on its GPUs, more than "
            "planned): back in the queue at position %zu, to be planned again",
            p->spec.id, s->spec.id, (long long)osub__held_total(s), osub__queue_pos(e, p));
        osub__ev_svc(ev, p);
    }
}

int osub_engine_suspended(osub_engine_t *e, const char *id, int64_t residual_mib, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (s->state != OSUB_STATE_SUSPENDING)
        return OSUB_EBAD_STATE;
    if (residual_mib < 0)
        return OSUB_ENEGATIVE_USAGE;
    int64_t cap = 0;
    for (int32_t i = 0; i < s->n_slots; i++)
        cap += e->gpus[s->slots[i].gpu].vram;
    if (residual_mib > cap)
        return OSUB_EINVAL;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    if (s->state != OSUB_STATE_SUSPENDING) { /* its timeout ran first: it is being evicted */
        osub__finish(e);
        return 0;
    }
    /* the residual, split as usage is: in proportion to the grants */
    int64_t basis = osub__grant_total(s), assigned = 0;
    for (int32_t i = 0; i < s->n_slots; i++) {
        int64_t per = basis > 0 ? (int64_t)((osub_i128)residual_mib * s->slots[i].grant / basis)
                                : residual_mib / s->n_slots;
        if (i == s->n_slots - 1)
            per = residual_mib - assigned;
        per = osub__min64(per, e->gpus[s->slots[i].gpu].vram);
        assigned += per;
        osub__slot_set_used(e, &s->slots[i], per);
    }
    s->used_capped = false;
    s->residual_est = residual_mib;
    osub__timer_cancel(e, s, T_DEADLINE);
    s->deadline_ms = 0;
    osub__set_state(e, s, OSUB_STATE_SUSPENDED);
    osub__svc_sync(e, s);
    e->dirty = true;
    char gb[96];
    osub__fmt_gpus(s, gb, sizeof(gb));
    osub_event_t *ev = osub__emit(
        e, OSUB_EV_SUSPENDED, OSUB_R_ACKNOWLEDGED,
        "%s is suspended: %lld MiB counted in host memory, %lld MiB still measured on %s (its "
        "residual); it keeps its %lld MiB grant%s",
        s->spec.id, (long long)s->host_mib, (long long)osub__held_total(s), gb,
        (long long)osub__grant_total(s),
        s->susp_idle   ? " and stays suspended until a request comes for it"
        : s->susp_hold ? " and stays suspended until resumed"
                       : " and resumes when room frees");
    osub__ev_svc(ev, s);
    ev->vram_mib = osub__grant_total(s);
    requeue_stuck_waiters(e, s);
    osub__finish(e);
    return 0;
}

int osub_engine_resumed(osub_engine_t *e, const char *id, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (s->state != OSUB_STATE_RESUMING)
        return OSUB_EBAD_STATE;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    if (s->state == OSUB_STATE_RESUMING) { /* its resume cost may have run out first */
        osub__timer_cancel(e, s, T_LOAD);
        osub__end_loading(e, s);
        char gb[96];
        osub__fmt_gpus(s, gb, sizeof(gb));
        osub_event_t *ev = osub__emit(
            e, OSUB_EV_RESUMED, OSUB_R_ACKNOWLEDGED,
            "%s resumed on %s: its memory is back, held now follows its usage (%lld MiB)",
            s->spec.id, gb, (long long)osub__held_total(s));
        osub__ev_svc(ev, s);
        ev->vram_mib = osub__grant_total(s);
    }
    osub__finish(e);
    return 0;
}

int osub_engine_suspend_failed(osub_engine_t *e, const char *id, const char *why, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (s->state != OSUB_STATE_SUSPENDING && s->state != OSUB_STATE_RESUMING)
        return OSUB_EBAD_STATE;
    if (osub__timer_reserve(e, 1) != 0)
        return OSUB_ENOMEM;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    if (s->state == OSUB_STATE_SUSPENDING || s->state == OSUB_STATE_RESUMING) {
        char what[200];
        osub__fmt(what, sizeof(what), "could not be %s (%s)",
                  s->state == OSUB_STATE_SUSPENDING ? "suspended" : "resumed",
                  why ? why : "no reason given");
        suspend_escalate(e, s, OSUB_R_SUSPEND_FAILED, what);
    }
    osub__finish(e);
    return 0;
}
