/* admit.c - a submitted spec resolved against its class and the pool, and admission: the plan, the
 * victims, the start */
#include <assert.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "plan.h"

/* ---- spec resolution ------------------------------------------------------------------ */

/* Refreshes the pool's size groups; called at creation and when a GPU is lost. */
void osub__refresh_sizes(osub_engine_t *e)
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

bool osub__spec_equal(const osub_spec_t *a, const osub_spec_t *b)
{
    return memcmp(a, b, sizeof(*a)) == 0;
}

/* Normalises a spec: resolves defaults so that equal intents compare equal. */
int osub__resolve_spec(const osub_engine_t *e, const osub_spec_t *in, osub_spec_t *o,
                       const osub_class_t **cls_out)
{
    osub_spec_t s;
    memset(&s, 0, sizeof(s));
    /* copy field by field so that padding and bytes after the strings are zero */
    if (memchr(in->id, '\0', sizeof(in->id)) == NULL || !osub_id_valid(in->id))
        return OSUB_EBAD_ID;
    osub__str_copy(s.id, sizeof(s.id), in->id);
    if (memchr(in->class_name, '\0', sizeof(in->class_name)) == NULL)
        return OSUB_EUNKNOWN_CLASS;
    const osub_class_t *c = osub__find_class(e, in->class_name);
    if (c == NULL)
        return OSUB_EUNKNOWN_CLASS;
    osub__str_copy(s.class_name, sizeof(s.class_name), in->class_name);
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
    int rc = osub__resolve_suspend(e, in, pre, &s);
    if (rc != 0)
        return rc;

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
int osub__empty_pool_fit(const osub_engine_t *e, const osub_spec_t *s)
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

void osub__fill_req(const osub_engine_t *e, const struct svc *s, struct req *r)
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

/* Whether every placed service of the pool is measured: started, past its loading, with a usage
 * report, and not moving memory (pending, draining, suspending, resuming, a degrade not yet
 * acknowledged). What one that is not
 * holds may still fall to what it uses, and room for a queued service's whole request may be
 * coming, on its GPU or another. A scan of the placed services, made only for a degraded start
 * that waiting could still spare (osub__plan_for). */
static bool pool_measured(osub_engine_t *e)
{
    if (e->measured_memo >= 0)
        return e->measured_memo == 1;
    e->measured_memo = 0;
    for (int32_t i = 0; i < e->n_gpus; i++) {
        const struct gpu *g = &e->gpus[i];
        for (int32_t j = 0; j < g->nsvc; j++) {
            const struct svc *v = g->svcs[j];
            if (v->loading || v->pred.n == 0 || v->ack_pending ||
                (v->state != OSUB_STATE_RUNNING && v->state != OSUB_STATE_DEGRADED &&
                 v->state != OSUB_STATE_SUSPENDED))
                return false;
        }
    }
    e->measured_memo = 1;
    return true;
}

/* The admission plan for s (DESIGN.md steps 2-5), with one more way in for a degradable
 * oversold service: when its request has no room without evicting anyone, it may start at
 * its floor where that fits without victims (a degraded start), and is restored once its
 * predicted peak has room (docs/engine.md, "Degraded starts"). */
void osub__plan_for(osub_engine_t *e, const struct svc *s, const struct req *r, struct plan *p)
{
    osub__plan_admission(e, r, p);
    p->degraded_start = false;
    if (!s->degradable || s->backed || s->spec.exclusive || s->floor_total >= s->full_total)
        return;
    if (p->ok && p->n_evict == 0)
        return;
    if (e->cfg.floor_start_after_ms < 0)
        return;
    /* waited in the queue that long (since_ms: when it entered its state, the queue), or a
     * migration at its floor brought it there (it waited in its suspend) */
    if (e->now - s->since_ms >= e->cfg.floor_start_after_ms || s->floor_now) {
        osub__plan_floor_start(e, s, r, p);
        return;
    }
    /* before that, at once where waiting shows nothing more: every service measured, so no
     * room for its whole request is still to come from one settling */
    struct plan p2 = *p;
    if (pool_measured(e) && osub__plan_floor_start(e, s, r, &p2))
        *p = p2;
}

bool osub__plan_floor_start(osub_engine_t *e, const struct svc *s, const struct req *r,
                            struct plan *p)
{
    struct req r2 = *r;
    r2.total = s->floor_total;
    r2.charge = r->charge < s->floor_total ? r->charge : s->floor_total;
    r2.quiet = true;
    r2.fit_share = osub__share(s->full_total, s->k, 0); /* its GPUs must hold it restored */
    struct plan p2;
    osub__plan_admission(e, &r2, &p2);
    if (!p2.ok || p2.n_victims > 0)
        return false;
    *p = p2;
    p->degraded_start = true;
    return true;
}

/* The smallest share a request of s could be placed with (degraded starts included). */
int64_t osub__min_share(osub_engine_t *e, const struct svc *s, const struct req *r)
{
    if (r->exclusive)
        return 1;
    int64_t t = r->charge < r->total ? r->charge : r->total;
    if (s->degradable && !s->backed && s->floor_total < t && e->cfg.floor_start_after_ms >= 0 &&
        (e->now - s->since_ms >= e->cfg.floor_start_after_ms || s->floor_now || pool_measured(e)))
        t = s->floor_total; /* it may start at its floor by now */
    return t / r->k;
}

/* A sentence for a failed admission plan: which check, where, and by how much. */
void osub__describe_failure(const struct plan *p, char *buf, size_t len)
{
    switch (p->check) {
    case OSUB_CHECK_GPUS:
        osub__fmt(buf, len, "%lld GPU(s) short of a set of one size that may take it",
                  (long long)p->shortfall);
        break;
    case OSUB_CHECK_COMPUTE:
        osub__fmt(buf, len, "compute claims on GPU %d over by %lld%%", p->check_gpu,
                  (long long)p->shortfall);
        break;
    case OSUB_CHECK_EXCLUSIVE:
        osub__fmt(buf, len, "GPU %d still has %lld service(s) an exclusive service cannot share",
                  p->check_gpu, (long long)p->shortfall);
        break;
    case OSUB_CHECK_NONE:
        osub__fmt(buf, len, "it may not go ahead of the queue's head");
        break;
    default:
        if (p->need_gpus > 1)
            osub__fmt(buf, len,
                      "only %d of the %d GPUs it needs can take a share; the closest other, GPU "
                      "%d, fails the %s check, short by %lld MiB",
                      p->fit_gpus, p->need_gpus, p->check_gpu, osub_check_name(p->check),
                      (long long)p->shortfall);
        else
            osub__fmt(buf, len, "the %s check fails on GPU %d, short by %lld MiB",
                      osub_check_name(p->check), p->check_gpu, (long long)p->shortfall);
    }
}

void osub__fill_victims(const osub_engine_t *e, const struct plan *p, osub_submit_result_t *res)
{
    res->n_victims = 0;
    for (int32_t i = 0; i < p->n_victims && i < OSUB_PLAN_MAX_VICTIMS; i++) {
        osub_victim_t *v = &res->victims[res->n_victims++];
        osub__str_copy(v->service, sizeof(v->service), p->victims[i]->spec.id);
        v->evict = p->acts[i] == ACT_EVICT;
        v->suspend = p->acts[i] == ACT_SUSPEND;
        v->deadline_ms = v->evict     ? e->now + p->victims[i]->grace_ms
                         : v->suspend ? e->now + e->cfg.suspend_timeout_ms
                                      : e->now + e->cfg.ack_timeout_ms;
    }
}

/* May pending s start now (DESIGN.md "Service states")? On each of its GPUs, the held of the
 * others plus its charge must fit under the limit its admission checked (osub__held_limit: the
 * high watermark, or usable for a backed service with nothing preemptible beside it), so that
 * a start never puts a GPU into pressure; an exclusive service needs its GPUs to itself. */
bool osub__pending_can_start(const osub_engine_t *e, const struct svc *s)
{
    for (int32_t i = 0; i < s->n_slots; i++) {
        const struct slot *sl = &s->slots[i];
        const struct gpu *g = &e->gpus[sl->gpu];
        if (s->spec.exclusive) {
            if (g->nsvc != 1)
                return false;
            continue;
        }
        int64_t charge = osub__min64(sl->grant, sl->charge);
        int64_t lim = osub__held_limit(g, e->cfg.high_watermark_pct, s->backed, charge);
        if (g->held - sl->held + charge > lim)
            return false;
    }
    return true;
}

/* Carries out an admission plan for s (placement reserved by the caller). */
void osub__admit_apply(osub_engine_t *e, struct svc *s, const struct plan *p, osub_reason_t why)
{
    osub__svc_place(e, s, p->gpus, p->shares, p->charges, p->k);
    s->floor_now = false;
    e->admissions++;
    char gb[96];
    osub__fmt_gpus(s, gb, sizeof(gb));
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
    osub__fmt(why_here, sizeof(why_here),
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
        osub_event_t *ev = osub__emit(
            e, OSUB_EV_ADMIT, why, "admitted %s (%s, %lld MiB) on %s without victims: %s",
            s->spec.id, osub__class_of(e, s), (long long)s->full_total, gb, why_here);
        osub__ev_svc(ev, s);
        ev->vram_mib = s->full_total;
        osub__set_state(e, s, OSUB_STATE_PENDING);
        osub__svc_sync(e, s);
        osub__svc_start(e, s, why);
        if (p->degraded_start) {
            /* it starts at its floor: degraded from the start, restored when its predicted
             * peak has room (osub__process_restores) */
            osub__set_state(e, s, OSUB_STATE_DEGRADED);
            s->batch = s->floor_batch;
            s->room_since_ms = -1;
            s->n_degrades++;
            e->degrades++;
            osub_event_t *dv =
                osub__emit(e, OSUB_EV_DEGRADE, OSUB_R_START_FLOOR,
                           "%s (%s) starts at its floor of %lld MiB on %s: its request "
                           "of %lld MiB has no room there yet; restored when its "
                           "predicted peak fits",
                           s->spec.id, osub__class_of(e, s), (long long)osub__grant_total(s), gb,
                           (long long)s->full_total);
            osub__ev_svc(dv, s);
            dv->vram_mib = osub__grant_total(s);
            dv->batch_size = s->batch;
        }
        return;
    }
    osub_event_t *ev =
        osub__emit(e, OSUB_EV_ADMIT, OSUB_R_PREEMPTION,
                   "admitted %s (%s, %lld MiB) on %s with %d victim(s): %s", s->spec.id,
                   osub__class_of(e, s), (long long)s->full_total, gb, p->n_victims, why_here);
    osub__ev_svc(ev, s);
    ev->vram_mib = s->full_total;
    osub__set_state(e, s, OSUB_STATE_PENDING);
    e->pending[e->n_pending++] = s;
    osub__svc_sync(e, s);
    s->n_waits = 0;
    for (int32_t i = 0; i < p->n_victims; i++) {
        struct svc *v = p->victims[i];
        if (p->acts[i] == ACT_EVICT)
            osub__svc_evict(e, v, s->spec.id, s->level, OSUB_R_PREEMPTION);
        else if (p->acts[i] == ACT_SUSPEND)
            osub__svc_suspend(e, v, s->spec.id, s->level, OSUB_R_PREEMPTION);
        else
            osub__svc_degrade(e, v, s->spec.id, s->level, OSUB_R_PREEMPTION);
        osub_victim_t *w = &s->waits[s->n_waits++];
        osub__str_copy(w->service, sizeof(w->service), v->spec.id);
        w->evict = p->acts[i] == ACT_EVICT;
        w->suspend = p->acts[i] == ACT_SUSPEND;
        w->deadline_ms = v->deadline_ms;
    }
    char vb[200];
    size_t off = 0;
    vb[0] = '\0';
    for (int32_t i = 0; i < s->n_waits && off + 70 < sizeof(vb); i++)
        off += (size_t)osub__fmt(vb + off, sizeof(vb) - off, "%s%s %s", i ? ", " : "",
                                 s->waits[i].evict     ? "eviction of"
                                 : s->waits[i].suspend ? "suspend of"
                                                       : "degrade of",
                                 s->waits[i].service);
    ev = osub__emit(e, OSUB_EV_PEND, OSUB_R_WAIT_VICTIMS,
                    "%s is pending on %s until the %s frees memory", s->spec.id, gb, vb);
    osub__ev_svc(ev, s);
    if (osub__pending_can_start(e, s))
        osub__svc_start(e, s, OSUB_R_ROOM_FREED);
}

/* Reserves every allocation an admission of s may need, so that applying cannot fail. */
int osub__admit_reserve(osub_engine_t *e, struct svc *s, const struct plan *p)
{
    if (osub__place_reserve(e, p->gpus, p->k) != 0 ||
        osub__timer_reserve(e, 2 + 2 * (size_t)p->n_victims) != 0 ||
        osub__vec_reserve(&e->pending, &e->cap_pending, e->n_pending + 1) != 0)
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
    osub__fill_req(e, h, &r);
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
bool osub__backfill_ok(osub_engine_t *e, const struct plan *p, int32_t lvl)
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

int osub_engine_submit(osub_engine_t *e, const osub_spec_t *spec, int64_t now_ms, unsigned flags,
                       osub_submit_result_t *res);

/* ---- resize ------------------------------------------------------------------------- */

int osub__resize_check(const osub_engine_t *e, const struct svc *s, int64_t nv, int64_t nm,
                       int64_t *charges)
{
    /* the request a submit of the new size would make; a degraded service's grant is its
     * floor, planned as a start at its floor is (admit.c, osub__plan_for) */
    bool degraded = s->state == OSUB_STATE_DEGRADED;
    struct req r;
    memset(&r, 0, sizeof(r));
    r.held_limit_pct = e->cfg.high_watermark_pct;
    r.level = s->level;
    r.backed = s->backed;
    r.k = s->k;
    r.self = s;
    r.total = nv;
    r.charge = s->backed ? nv : osub__pred_peak(&s->pred, nv, e->now, e->cfg.prediction_trust_ms);
    r.floor = s->backed ? nv : s->preemptible && nm < nv ? nm : 0;
    if (degraded) {
        r.total = nm;
        r.charge = osub__min64(r.charge, nm);
        r.floor = osub__min64(r.floor, nm);
    }
    for (int32_t i = 0; i < s->n_slots; i++) {
        const struct slot *sl = &s->slots[i];
        const struct gpu *g = &e->gpus[sl->gpu];
        if (nv > s->full_total && osub__share(nv, s->k, i) > g->usable)
            return OSUB_ETOO_BIG; /* the GPU could never hold it, degraded or restored */
        int64_t ng = osub__share(r.total, s->k, i);
        int64_t ch = osub__req_charge(&r, ng);
        int64_t of = osub__slot_floor(s, i), nf = osub__req_floor(&r, ng);
        charges[i] = ch;
        if (ng <= sl->grant && nf <= of)
            continue; /* nothing grows here */
        if (g->granted - sl->grant + ng > g->logical)
            return OSUB_ENO_ROOM;
        if (s->backed && g->backed - sl->grant + ng > g->usable)
            return OSUB_ENO_ROOM;
        if (g->held - sl->held + ch > osub__req_held_limit(g, &r, ch))
            return OSUB_ENO_ROOM;
        if (osub__gpu_floors(e, g) - of + nf > osub__req_held_limit(g, &r, ng))
            return OSUB_ENO_ROOM;
    }
    return 0;
}
