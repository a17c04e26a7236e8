/* commands.c - the command discipline (check, osub__advance, apply, osub__finish) and every
 * command: submit, release, usage, ready, ack, exited, fail, resize, ratio, cordon, drain, a lost
 * GPU */
#include <assert.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- command discipline --------------------------------------------------------------- *
 *
 * Every command has the same three steps, and a refused command changes nothing:
 *   1. check: its arguments and the state as the last command left it, without a side
 *      effect (no timer runs, time does not move); a refusal returns here;
 *   2. osub__advance: time moves to now_ms and the timers due by then run (their events first);
 *   3. apply, then osub__finish: the command's own change, then the passes (pending, queue).
 * A timer never removes a service, never takes away a placement and never adds held memory,
 * so what step 1 accepted still applies after step 2 (test_errors checks every refusal at a
 * time when timers are due). */

/* Every command starts by forgetting the last one's events, refused or not: a command
 * refused before it reaches the engine's state must not show the previous command's. */
void osub__clear_events(osub_engine_t *e)
{
    if (e != NULL) {
        e->n_events = 0;
        e->measured_memo = -1;
    }
}

int osub__check_time(const osub_engine_t *e, int64_t now_ms)
{
    if (now_ms < 0 || now_ms > (INT64_C(1) << 53))
        return OSUB_EBAD_TIME;
    if (now_ms < e->now)
        return OSUB_ETIME_BACKWARDS;
    return 0;
}

void osub__advance(osub_engine_t *e, int64_t now_ms)
{
    assert(now_ms >= e->now);
    e->n_events = 0;
    e->now = now_ms;
    e->cmd_no++;
    osub__run_timers(e);
}

void osub__finish(osub_engine_t *e)
{
    osub__process(e);
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

/* A new service record for the resolved spec s of class cls, submitted at now_ms, queued and not
 * yet in e. Returns it (owned by the caller, osub_svc_free), or NULL for want of memory. */
static struct svc *svc_new(const osub_engine_t *e, const osub_spec_t *s, const osub_class_t *cls,
                           int64_t now_ms, unsigned flags)
{
    struct svc *sv = calloc(1, sizeof(*sv));
    if (sv == NULL)
        return NULL;
    sv->spec = *s;
    sv->k = s->gpus;
    sv->slots = calloc((size_t)sv->k, sizeof(*sv->slots));
    if (sv->slots == NULL) {
        osub_svc_free(sv);
        return NULL;
    }
    sv->seq = e->next_seq;
    sv->level = cls->level;
    sv->preemptible = s->preemptible == OSUB_TRI_YES;
    sv->backed = !sv->preemptible;
    sv->degradable = sv->preemptible && s->min_vram_mib < s->vram_mib;
    sv->requeue_on_evict = s->on_evict == OSUB_ON_EVICT_REQUEUE;
    sv->queue_ok = s->queue == OSUB_TRI_YES;
    sv->full_total = s->vram_mib;
    sv->floor_total = s->min_vram_mib;
    sv->full_batch = s->batch_size;
    sv->floor_batch = s->min_batch_size;
    sv->batch = s->batch_size;
    sv->grace_ms = s->grace_ms;
    sv->restart_cost_ms = s->restart_cost_ms;
    sv->submit_ms = now_ms;
    sv->since_ms = sv->submit_ms;
    sv->room_since_ms = -1;
    sv->heap_pos[0] = sv->heap_pos[1] = -1;
    sv->state = OSUB_STATE_QUEUED;
    sv->adopted = (flags & OSUB_SUBMIT_RUNNING) != 0;
    osub__pred_init(&sv->pred);
    osub__susp_derive(sv);
    return sv;
}

/* Files sv in e's table and at the end of its live list (the table has room: tab_reserve). */
static void live_append(osub_engine_t *e, struct svc *sv)
{
    osub__tab_insert_raw(e->tab, e->tab_cap, sv);
    e->n_live++;
    if (sv->suspendable)
        e->n_suspendable++;
    sv->prev = e->tail;
    if (e->tail)
        e->tail->next = sv;
    else
        e->head = sv;
    e->tail = sv;
}

int osub_engine_submit(osub_engine_t *e, const osub_spec_t *spec, int64_t now_ms, unsigned flags,
                       osub_submit_result_t *res)
{
    osub__clear_events(e);
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
    int rc = osub__resolve_spec(e, spec, &s, &cls);
    if (rc == 0)
        rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    struct svc *old = osub__e_lookup(e, s.id);
    if (old != NULL) {
        if (!osub__spec_equal(&old->spec, &s))
            return OSUB_ESPEC_CONFLICT;
        res->outcome = OSUB_SUBMIT_EXISTS; /* a retry: nothing to do */
        return 0;
    }
    rc = osub__empty_pool_fit(e, &s);
    if (rc != 0) {
        /* a refused command, not a decision: nothing in the state changes; the event says why */
        osub_event_t *ev = osub__emit(
            e, OSUB_EV_REJECT, OSUB_R_EMPTY_POOL, "rejected %s (%s, %lld MiB on %d GPU(s)): %s",
            s.id, s.class_name, (long long)s.vram_mib, s.gpus, osub_strerror(rc));
        osub__str_copy(ev->service, sizeof(ev->service), s.id);
        ev->time_ms = now_ms;
        res->outcome = OSUB_SUBMIT_REJECTED;
        res->rc = rc;
        return rc;
    }
    if ((flags & OSUB_SUBMIT_DRY_RUN) != 0)
        return dry_run(e, spec, now_ms, flags, res);

    /* build the service */
    struct svc *sv = svc_new(e, &s, cls, now_ms, flags);
    if (sv == NULL)
        return OSUB_ENOMEM;
    if (osub__tab_reserve(e) != 0 || osub__queue_reserve(e, e->n_queue + 1) != 0) {
        osub_svc_free(sv);
        return OSUB_ENOMEM;
    }

    /* 2. osub__advance: the decision reads the state at now_ms */
    osub__advance(e, now_ms);

    /* 3. apply */
    struct req r;
    osub__fill_req(e, sv, &r);
    struct plan p;
    bool blocked = e->overcommitted;
    if (!blocked)
        osub__plan_for(e, sv, &r, &p);
    else
        memset(&p, 0, sizeof(p));
    if (p.ok && !osub__backfill_ok(e, &p, sv->level)) {
        /* it has a plan, the queue's head comes first: that is the reason, whatever another
         * GPU size's search noted on its way */
        p.ok = false;
        p.check = OSUB_CHECK_NONE;
        p.check_gpu = -1;
        p.shortfall = 0;
    }
    res->check = p.ok ? OSUB_CHECK_NONE : p.check;
    res->check_gpu = p.ok ? -1 : p.check_gpu;
    res->shortfall_mib = p.ok ? 0 : p.shortfall;

    if (!p.ok && !sv->queue_ok) {
        e->rejections++;
        rc = blocked ? OSUB_EOVERCOMMITTED : OSUB_ENO_ROOM;
        char fb[160];
        osub__describe_failure(&p, fb, sizeof(fb));
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_REJECT, blocked ? OSUB_R_OVERCOMMITTED : OSUB_R_NO_ROOM,
                       "rejected %s (%s, %lld MiB): %s, even with victims", s.id, s.class_name,
                       (long long)s.vram_mib,
                       blocked ? "the pool is over-committed after a ratio change" : fb);
        osub__str_copy(ev->service, sizeof(ev->service), s.id);
        ev->level = sv->level;
        ev->gpu = p.check_gpu;
        osub_svc_free(sv);
        res->outcome = OSUB_SUBMIT_REJECTED;
        res->rc = rc;
        osub__finish(e); /* the timers that ran may have freed room for others */
        return rc;
    }
    /* reserve everything that can fail, then commit (the timers due have run: the state is
     * the one at now_ms, consistent, without this service) */
    if (p.ok && osub__admit_reserve(e, sv, &p) != 0) {
        osub_svc_free(sv);
        osub__finish(e);
        return OSUB_ENOMEM;
    }
    e->next_seq++;
    live_append(e, sv);

    if (p.ok) {
        osub__admit_apply(e, sv, &p, OSUB_R_FITS);
        res->outcome = sv->state == OSUB_STATE_PENDING ? OSUB_SUBMIT_PENDING : OSUB_SUBMIT_STARTED;
        res->n_gpus = p.k;
        memcpy(res->gpus, p.gpus, sizeof(int32_t) * (size_t)p.k);
        osub__fill_victims(e, &p, res);
    } else {
        osub__queue_push(e, sv);
        res->outcome = OSUB_SUBMIT_QUEUED;
        res->queue_position = (int32_t)osub__queue_pos(e, sv);
        char fb[160];
        osub__describe_failure(&p, fb, sizeof(fb));
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_QUEUE, blocked ? OSUB_R_OVERCOMMITTED : OSUB_R_NO_ROOM,
                       "queued %s (%s, %lld MiB) at position %d: %s", s.id, s.class_name,
                       (long long)s.vram_mib, res->queue_position,
                       blocked ? "the pool is over-committed after a ratio change" : fb);
        osub__ev_svc(ev, sv);
    }
    osub__finish(e);
    return 0;
}

/* ---- other commands ------------------------------------------------------------------- */

int osub__get_svc(osub_engine_t *e, const char *id, struct svc **out)
{
    if (e == NULL || id == NULL)
        return OSUB_EINVAL;
    if (!osub_id_valid(id))
        return OSUB_EBAD_ID;
    *out = osub__e_lookup(e, id);
    return *out ? 0 : OSUB_EUNKNOWN_SERVICE;
}

static int release(osub_engine_t *e, const char *id, int64_t now_ms, bool measured)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc == 0)
        rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    /* measured: what it used, per GPU, counted as system memory once it is gone (after its
     * place is undone, so the GPU's peak history does not keep it as a peak) */
    int32_t n = measured ? s->n_slots : 0, gpus[OSUB_SERVICE_GPUS_MAX];
    int64_t used[OSUB_SERVICE_GPUS_MAX];
    for (int32_t i = 0; i < n; i++) {
        gpus[i] = s->slots[i].gpu;
        used[i] = s->slots[i].used;
    }
    char gb[96];
    osub__fmt_gpus(s, gb, sizeof(gb));
    osub_event_t *ev = osub__emit(
        e, OSUB_EV_RELEASE, OSUB_R_USER, "released %s (%s, %lld MiB held) from %s%s", s->spec.id,
        osub__class_of(e, s), (long long)osub__held_total(s), s->n_slots ? gb : "the queue",
        measured && osub__used_total(s) > 0
            ? "; what it used stays counted as system memory until its process is seen to leave it"
            : "");
    osub__ev_svc(ev, s);
    osub__svc_destroy(e, s);
    for (int32_t i = 0; i < n; i++) {
        struct gpu *g = &e->gpus[gpus[i]];
        int64_t add = osub__min64(used[i], g->vram - g->system);
        if (g->lost || add <= 0)
            continue;
        g->system += add;
        osub__gpu_add_held(e, g, add);
    }
    osub__finish(e);
    return 0;
}

int osub_engine_release(osub_engine_t *e, const char *id, int64_t now_ms)
{
    return release(e, id, now_ms, false);
}

int osub_engine_release_measured(osub_engine_t *e, const char *id, int64_t now_ms)
{
    return release(e, id, now_ms, true);
}

static int usage_apply(osub_engine_t *e, struct svc *s, const int64_t *per, int32_t compute)
{
    for (int32_t i = 0; i < s->n_slots; i++)
        osub__slot_set_used(e, &s->slots[i], per[i]);
    /* its first report measures its GPUs: a queued degradable service may start at its floor
     * there now (osub__plan_for) */
    if (s->pred.n == 0) {
        e->measured_memo = -1;
        e->dirty = e->dirty || e->n_queue > 0;
    }
    osub__pred_observe(&s->pred, osub__used_total(s), e->now);
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
            osub__timer_cancel(e, s, T_DEADLINE);
            s->deadline_ms = 0;
            osub_event_t *ev = osub__emit(
                e, OSUB_EV_ACK, OSUB_R_USAGE_UNDER_GRANT,
                "%s reports %lld MiB, at or under its degraded grant of %lld "
                "MiB: taken as its acknowledgement",
                s->spec.id, (long long)osub__used_total(s), (long long)osub__grant_total(s));
            osub__ev_svc(ev, s);
        }
    }
    osub__svc_sync(e, s);
    /* usage going down does not scan the queue (the tick does): usage moves all the time,
     * and a pending service is looked at after every command anyway */
    for (int32_t i = 0; i < s->n_slots; i++) {
        osub__check_pressure(e, s->slots[i].gpu);
        if (compute >= 0)
            osub__check_compute(e, s->slots[i].gpu);
    }
    osub__finish(e);
    return 0;
}

int osub_engine_usage(osub_engine_t *e, const char *id, int64_t used_mib, int32_t compute_pct,
                      int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
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
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    assert(s->n_slots > 0 && s->state != OSUB_STATE_PENDING); /* timers keep placements */
    int64_t per[64], basis = 0;
    bool by_grant = osub__grant_total(s) > 0;
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
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
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
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    assert(s->n_slots > 0 && s->state != OSUB_STATE_PENDING && n == (size_t)s->n_slots);
    return usage_apply(e, s, used_mib, -1);
}

int osub_engine_system_usage(osub_engine_t *e, int32_t gpu, int64_t used_mib, int64_t now_ms)
{
    osub__clear_events(e);
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
    int rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    struct gpu *g = &e->gpus[gpu];
    int64_t d = used_mib - g->system;
    g->system = used_mib;
    osub__gpu_add_held(e, g, d);
    if (d < 0)
        e->dirty = true;
    osub__check_pressure(e, gpu);
    osub__finish(e);
    return 0;
}

int osub_engine_ready(osub_engine_t *e, const char *id, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (s->n_slots == 0 || s->state == OSUB_STATE_PENDING)
        return OSUB_EBAD_STATE;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    if (s->loading) {
        osub__timer_cancel(e, s, T_LOAD);
        osub__end_loading(e, s);
        osub_event_t *ev = osub__emit(e, OSUB_EV_READY, OSUB_R_USER,
                                      "%s reported ready; held now follows its usage (%lld MiB)",
                                      s->spec.id, (long long)osub__held_total(s));
        osub__ev_svc(ev, s);
    }
    osub__finish(e);
    return 0;
}

int osub_engine_ack(osub_engine_t *e, const char *id, const char *checkpoint, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    bool draining = s->state == OSUB_STATE_DRAINING || s->state == OSUB_STATE_OVERDUE;
    if (!s->ack_pending && !draining)
        return OSUB_ENO_DIRECTIVE;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    if (checkpoint != NULL)
        osub__str_copy(s->checkpoint, sizeof(s->checkpoint), checkpoint);
    if (s->ack_pending) {
        s->ack_pending = false;
        for (int32_t i = 0; i < s->n_slots; i++)
            s->slots[i].held_grant = s->slots[i].grant;
        s->used_capped = true;
        osub__timer_cancel(e, s, T_DEADLINE);
        s->deadline_ms = 0;
        osub__svc_sync(e, s);
        e->dirty = true;
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_ACK, OSUB_R_ACKNOWLEDGED,
                       "%s acknowledged its degrade to %lld MiB; it now holds %lld MiB", s->spec.id,
                       (long long)osub__grant_total(s), (long long)osub__held_total(s));
        osub__ev_svc(ev, s);
    } else {
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_ACK, OSUB_R_ACKNOWLEDGED, "%s acknowledged its eviction%s%s",
                       s->spec.id, s->checkpoint[0] ? "; checkpoint " : "", s->checkpoint);
        osub__ev_svc(ev, s);
    }
    osub__finish(e);
    return 0;
}

int osub_engine_exited(osub_engine_t *e, const char *id, const char *checkpoint, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc != 0)
        return rc;
    if (osub__queue_reserve(e, e->n_queue + 1) != 0)
        return OSUB_ENOMEM;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    if (checkpoint != NULL)
        osub__str_copy(s->checkpoint, sizeof(s->checkpoint), checkpoint);
    bool evicted = s->state == OSUB_STATE_DRAINING || s->state == OSUB_STATE_OVERDUE;
    if (!evicted) {
        osub_event_t *ev = osub__emit(e, OSUB_EV_EXITED, OSUB_R_USER, "%s (%s) exited while %s",
                                      s->spec.id, osub__class_of(e, s), osub_state_name(s->state));
        osub__ev_svc(ev, s);
    }
    osub__svc_gone(e, s, OSUB_R_EVICTED, evicted);
    osub__finish(e);
    return 0;
}

int osub_engine_fail(osub_engine_t *e, const char *id, const char *why, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
    if (rc == 0)
        rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    osub_event_t *ev = osub__emit(e, OSUB_EV_FAIL, OSUB_R_USER, "%s (%s) failed: %s", s->spec.id,
                                  osub__class_of(e, s), why ? why : "no reason given");
    osub__ev_svc(ev, s);
    osub__svc_destroy(e, s);
    osub__finish(e);
    return 0;
}

int osub_engine_resize(osub_engine_t *e, const char *id, int64_t vram_mib, int64_t min_vram_mib,
                       int32_t batch_size, int64_t now_ms)
{
    osub__clear_events(e);
    struct svc *s;
    int rc = osub__get_svc(e, id, &s);
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
    if ((s->spec.exclusive && vram_mib) || osub__in_suspend(s))
        return OSUB_EBAD_STATE; /* a suspended service keeps the grant it left with */
    int32_t nb = batch_size ? batch_size : s->full_batch;
    if (s->floor_batch > nb)
        return OSUB_EBAD_BATCH;
    rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    /* growing: the checks a submit of the new size would make on its GPUs, no victims (timers
     * due by now_ms never add held memory, so the room checked here is there after they run);
     * without GPUs of its own (queued, or evicted and on its way out), its next placement is
     * a new admission: only a size that no GPU of the pool could hold is refused now */
    bool degraded = s->state == OSUB_STATE_DEGRADED;
    bool placed =
        s->n_slots > 0 && s->state != OSUB_STATE_DRAINING && s->state != OSUB_STATE_OVERDUE;
    bool grows = nv > s->full_total || nm > s->floor_total; /* a shrink always succeeds */
    int64_t charges[OSUB_SERVICE_GPUS_MAX];
    for (int32_t i = 0; i < s->n_slots; i++)
        charges[i] = s->slots[i].charge;
    if (placed && !s->spec.exclusive && grows) {
        rc = osub__resize_check(e, s, nv, nm, charges);
        if (rc != 0)
            return rc;
    } else if (!placed && nv > s->full_total) {
        osub_spec_t grown = s->spec;
        grown.vram_mib = nv;
        rc = osub__empty_pool_fit(e, &grown);
        if (rc != 0)
            return rc;
    }
    osub__advance(e, now_ms);
    int64_t from = s->full_total;
    s->full_total = s->spec.vram_mib = nv;
    s->floor_total = s->spec.min_vram_mib = nm;
    s->degradable = s->preemptible && nm < nv;
    s->full_batch = s->spec.batch_size = nb;
    if (placed) {
        /* an exclusive service keeps its GPUs' whole usable VRAM whatever its batch or floor */
        for (int32_t i = 0; i < s->n_slots && !s->spec.exclusive; i++) {
            struct slot *sl = &s->slots[i];
            int64_t ng = degraded ? osub__share(nm, s->k, i) : osub__share(nv, s->k, i);
            if (ng < sl->grant)
                e->dirty = true;
            if (ng > sl->grant)
                sl->charge = charges[i]; /* what the physical check counted for it */
            osub__slot_set_grant(e, s, sl, ng);
            if (!s->ack_pending)
                sl->held_grant = ng;
        }
        if (!degraded)
            s->batch = nb;
        osub__svc_sync(e, s);
    } else if (s->state == OSUB_STATE_QUEUED) {
        s->batch = nb;
        e->dirty = true;
    }
    osub_event_t *ev = osub__emit(e, OSUB_EV_RESIZE, OSUB_R_USER,
                                  "resized %s from %lld to %lld MiB (floor %lld MiB, batch %d)",
                                  s->spec.id, (long long)from, (long long)nv, (long long)nm, nb);
    osub__ev_svc(ev, s);
    ev->vram_mib = osub__grant_total(s);
    osub__finish(e);
    return 0;
}

int osub_engine_set_ratio(osub_engine_t *e, int32_t ratio_milli, int64_t now_ms)
{
    osub__clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (ratio_milli < 1000 || ratio_milli > 100000)
        return OSUB_ERATIO_RANGE;
    int rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
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
    osub__emit(e, OSUB_EV_RATIO, OSUB_R_USER, "oversell ratio changed from %d.%03d to %d.%03d",
               old / 1000, old % 1000, ratio_milli / 1000, ratio_milli % 1000);
    if (over && !e->overcommitted)
        osub__emit(e, OSUB_EV_OVERCOMMIT, OSUB_R_OVERCOMMITTED,
                   "the pool is over-committed: grants exceed the new logical capacity; nothing is "
                   "evicted, and nothing is admitted until the grants fit again");
    e->overcommitted = over;
    e->dirty = true;
    osub__finish(e);
    return 0;
}

int osub_engine_cordon(osub_engine_t *e, int32_t gpu, bool cordon, int64_t now_ms)
{
    osub__clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (gpu < 0 || gpu >= e->n_gpus)
        return OSUB_EBAD_GPU;
    if (e->gpus[gpu].lost)
        return OSUB_EGPU_LOST;
    int rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    if (e->gpus[gpu].cordoned != cordon) {
        e->gpus[gpu].cordoned = cordon;
        osub__gpu_touch(e, &e->gpus[gpu]);
        osub_event_t *ev = osub__emit(e, cordon ? OSUB_EV_CORDON : OSUB_EV_UNCORDON, OSUB_R_USER,
                                      cordon ? "GPU %d cordoned: no new placements"
                                             : "GPU %d uncordoned: it takes placements again",
                                      gpu);
        ev->gpu = gpu;
        e->dirty = !cordon;
    }
    osub__finish(e);
    return 0;
}

int osub_engine_drain_gpu(osub_engine_t *e, int32_t gpu, int64_t now_ms)
{
    osub__clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (gpu < 0 || gpu >= e->n_gpus)
        return OSUB_EBAD_GPU;
    if (e->gpus[gpu].lost)
        return OSUB_EGPU_LOST;
    if (osub__timer_reserve(e, (size_t)e->gpus[gpu].nsvc) != 0)
        return OSUB_ENOMEM;
    int rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    struct gpu *g = &e->gpus[gpu];
    if (!g->cordoned) {
        g->cordoned = true;
        osub__gpu_touch(e, g);
        osub_event_t *ev =
            osub__emit(e, OSUB_EV_CORDON, OSUB_R_USER, "GPU %d cordoned for draining", gpu);
        ev->gpu = gpu;
    }
    for (int32_t i = g->nsvc - 1; i >= 0; i--) {
        struct svc *s = g->svcs[i];
        if (osub__svc_victim_eligible(s))
            osub__svc_evict(e, s, "", -1, OSUB_R_USER);
    }
    osub__finish(e);
    return 0;
}

int osub_engine_gpu_lost(osub_engine_t *e, int32_t gpu, int64_t now_ms)
{
    osub__clear_events(e);
    if (e == NULL)
        return OSUB_EINVAL;
    if (gpu < 0 || gpu >= e->n_gpus)
        return OSUB_EBAD_GPU;
    if (e->gpus[gpu].lost)
        return OSUB_EGPU_LOST;
    if (osub__queue_reserve(e, e->n_queue + (size_t)e->gpus[gpu].nsvc) != 0)
        return OSUB_ENOMEM;
    int rc = osub__check_time(e, now_ms);
    if (rc != 0)
        return rc;
    osub__advance(e, now_ms);
    struct gpu *g = &e->gpus[gpu];
    g->lost = true;
    osub__gpu_touch(e, g);
    osub__refresh_sizes(e);
    osub_event_t *ev =
        osub__emit(e, OSUB_EV_GPU_LOST, OSUB_R_GPU_LOST,
                   "GPU %d (%s) is lost with %d service(s) on it", gpu, g->name, g->nsvc);
    ev->gpu = gpu;
    while (g->nsvc > 0) {
        struct svc *s = g->svcs[g->nsvc - 1];
        if (s->state == OSUB_STATE_PENDING || s->requeue_on_evict) {
            if (s->state != OSUB_STATE_PENDING)
                s->evicted_before = true;
            osub__svc_to_queue(e, s);
            ev = osub__emit(e, OSUB_EV_REQUEUE, OSUB_R_GPU_LOST,
                            "%s (%s) lost GPU %d and is back in the queue at position %zu",
                            s->spec.id, osub__class_of(e, s), gpu, osub__queue_pos(e, s));
            osub__ev_svc(ev, s);
        } else {
            ev = osub__emit(e, OSUB_EV_RELEASE, OSUB_R_GPU_LOST, "%s (%s) released: GPU %d is lost",
                            s->spec.id, osub__class_of(e, s), gpu);
            osub__ev_svc(ev, s);
            ev->gpu = gpu;
            osub__svc_destroy(e, s);
        }
    }
    osub__gpu_add_held(e, g, -g->system);
    g->system = 0;
    e->dirty = true;
    osub__finish(e);
    return 0;
}
