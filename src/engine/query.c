/* query.c - reading the engine: events, figures, services, the queue, the full dump and the
 * invariant check, and the wiring of a restored snapshot */
#include <assert.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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
    osub__str_copy(out->name, sizeof(out->name), g->name);
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
    out->suspends = e->suspends;
    out->wakes = e->wakes;
    out->n_suspended = e->n_suspended;
    out->host_used_mib = e->host_used;
    out->host_budget_mib = e->cfg.suspend_host_mib;
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
    int rc = osub__get_svc(e, id, &s);
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
    out->grant_mib = osub__grant_total(s);
    out->held_mib = osub__held_total(s);
    out->used_mib = osub__used_total(s);
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
    out->queue_position = s->state == OSUB_STATE_QUEUED ? (int32_t)osub__queue_pos(e, s) : 0;
    out->n_waits = s->state == OSUB_STATE_PENDING ? s->n_waits : 0;
    out->waits = s->waits;
    out->evictions = s->n_evictions;
    out->degrades = s->n_degrades;
    osub__str_copy(out->checkpoint, sizeof(out->checkpoint), s->checkpoint);
    out->suspendable = s->suspendable;
    out->suspend_hold = s->susp_hold;
    out->suspend_idle = s->susp_idle;
    out->woke_ms = s->woke ? s->wake_ms : 0;
    out->suspends = s->n_suspends;
    out->host_mib = s->host_mib;
    out->resume_cost_ms = s->resume_cost_ms;
    out->residual_mib = s->residual_est;
    out->relocated_from = s->reloc_from1 - 1;
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
    osub_sb_printf(&b, "counters adm %llu rej %llu deg %llu evi %llu res %llu rsm %llu",
                   (unsigned long long)e->admissions, (unsigned long long)e->rejections,
                   (unsigned long long)e->degrades, (unsigned long long)e->evictions,
                   (unsigned long long)e->restores, (unsigned long long)e->resumes);
    if (e->suspends > 0 || e->host_used > 0 || c->suspend_host_mib > 0)
        osub_sb_printf(&b, " sus %llu wak %llu host %lld/%lld n %d",
                       (unsigned long long)e->suspends, (unsigned long long)e->wakes,
                       (long long)e->host_used, (long long)c->suspend_host_mib, e->n_suspended);
    osub_sb_printf(&b, "\n");
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
                osub_sb_printf(&b, " wait(%s,%d%s,%lld)", s->waits[i].service, s->waits[i].evict,
                               s->waits[i].suspend ? "s" : "", (long long)s->waits[i].deadline_ms);
        if (s->suspendable || s->n_suspends > 0)
            osub_sb_printf(&b,
                           " susp(%d res %lld/%lld rc %lld hold %d woke %d/%lld from %d host "
                           "%lld n %u)",
                           (int)p->suspend.method, (long long)p->suspend.residual_mib,
                           (long long)s->residual_est, (long long)s->resume_cost_ms,
                           s->susp_hold + s->susp_idle, s->woke, (long long)s->wake_ms,
                           (int)s->susp_from, (long long)s->host_mib, s->n_suspends);
        osub_sb_printf(&b, "%s\n", s->floor_now ? " floor_now" : "");
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

/* The suspend invariants: only preemptible suspendable services suspend; a suspended one holds
 * only its measured residual and keeps its logical grant; the host memory counted is the sum of
 * the services' and never above the budget; the counters match. */
static int check_suspend(const osub_engine_t *e, char *why, size_t why_len)
{
    int64_t host = 0;
    int32_t nsus = 0, nsusp = 0;
    for (const struct svc *s = e->head; s; s = s->next) {
        bool in = osub__in_suspend(s);
        host += s->host_mib;
        nsus += s->state == OSUB_STATE_SUSPENDED;
        nsusp += s->suspendable;
        if (in && (s->backed || !s->suspendable))
            return fail_why(why, why_len, "invariant 1: %s is %s but %s", s->spec.id,
                            osub_state_name(s->state),
                            s->backed ? "backed" : "declares no suspend method");
        if (in != (s->host_mib > 0))
            return fail_why(why, why_len, "%s is %s with %lld MiB counted in host memory",
                            s->spec.id, osub_state_name(s->state), (long long)s->host_mib);
        if (in && s->n_slots != s->k)
            return fail_why(why, why_len, "%s is %s on %d GPUs, not its %d", s->spec.id,
                            osub_state_name(s->state), s->n_slots, s->k);
        if (in && osub__grant_total(s) < s->floor_total)
            return fail_why(why, why_len, "%s is %s without its logical grant (%lld < %lld)",
                            s->spec.id, osub_state_name(s->state), (long long)osub__grant_total(s),
                            (long long)s->floor_total);
        if (in && s->loading != (s->state == OSUB_STATE_RESUMING))
            return fail_why(why, why_len, "%s is %s with loading %d", s->spec.id,
                            osub_state_name(s->state), s->loading);
        if (s->reloc_from1 != 0 &&
            (s->state != OSUB_STATE_RESUMING || !s->spec.suspend.relocate || s->n_slots != 1 ||
             s->reloc_from1 > e->n_gpus || s->slots[0].gpu == s->reloc_from1 - 1))
            return fail_why(why, why_len, "%s is %s, relocating from GPU %d", s->spec.id,
                            osub_state_name(s->state), (int)(s->reloc_from1 - 1));
        for (int32_t i = 0; i < s->n_slots && s->state == OSUB_STATE_SUSPENDED; i++)
            if (s->slots[i].held != s->slots[i].used)
                return fail_why(why, why_len,
                                "suspended %s holds %lld MiB on GPU %d, not its measured %lld",
                                s->spec.id, (long long)s->slots[i].held, s->slots[i].gpu,
                                (long long)s->slots[i].used);
    }
    if (host != e->host_used)
        return fail_why(why, why_len, "host memory counted %lld != %lld, the services' sum",
                        (long long)e->host_used, (long long)host);
    if (e->host_used > e->cfg.suspend_host_mib)
        return fail_why(why, why_len, "host memory %lld MiB above the suspend budget %lld",
                        (long long)e->host_used, (long long)e->cfg.suspend_host_mib);
    int32_t listed = 0;
    for (const struct svc *s = e->suspended; s && listed <= nsus; s = s->snext)
        listed += s->state == OSUB_STATE_SUSPENDED ? 1 : 1000;
    if (nsus != e->n_suspended || nsusp != e->n_suspendable || listed != nsus)
        return fail_why(why, why_len, "suspended %d/%d (%d listed), suspendable %d/%d",
                        e->n_suspended, nsus, listed, e->n_suspendable, nsusp);
    return 0;
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
        if (osub__e_lookup(e, s->spec.id) != s)
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
        /* exclusive services too: their grant, their GPUs' whole usable, holds their request */
        if (running && osub__grant_total(s) < s->floor_total)
            rc = fail_why(why, why_len, "invariant 5: %s grant %lld below its floor %lld",
                          s->spec.id, (long long)osub__grant_total(s), (long long)s->floor_total);
        if (s->backed && running && osub__grant_total(s) < s->full_total)
            rc = fail_why(why, why_len, "invariant 1: backed %s holds less than its request",
                          s->spec.id);
        for (int32_t i = 0; i < s->n_slots && rc == 0; i++) {
            const struct slot *sl = &s->slots[i];
            if (sl->held != osub__slot_held(s, sl))
                rc = fail_why(why, why_len, "%s slot %d cached held %lld != %lld", s->spec.id, i,
                              (long long)sl->held, (long long)osub__slot_held(s, sl));
            if (sl->grant < 0 || sl->used < 0)
                rc = fail_why(why, why_len, "%s slot %d negative", s->spec.id, i);
            else if (sl->grant > e->gpus[sl->gpu].usable)
                rc = fail_why(why, why_len,
                              "%s's share on GPU %d, %lld MiB, exceeds its usable %lld", s->spec.id,
                              sl->gpu, (long long)sl->grant, (long long)e->gpus[sl->gpu].usable);
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
        if (osub__queue_before(e->queue[i], e->queue[i - 1]))
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
            if (osub__svc_before(g->svcs[j], g->svcs[j - 1]))
                rc = fail_why(why, why_len, "GPU %d service list out of order", i);
    }
    free(sum);
    free(cnt);
    free(pend);
    free(comp);
    if (rc == 0)
        rc = check_suspend(e, why, why_len);
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
    return osub__e_lookup(e, id);
}

int osub__restore_service(osub_engine_t *e, struct svc *s)
{
    if (osub__tab_reserve(e) != 0 || osub__timer_reserve(e, 2) != 0)
        return OSUB_ENOMEM;
    for (int32_t i = 0; i < s->n_slots; i++)
        if (osub__gpu_list_reserve(&e->gpus[s->slots[i].gpu]) != 0)
            return OSUB_ENOMEM;
    osub__tab_insert_raw(e->tab, e->tab_cap, s);
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
        sl->held = osub__slot_held(s, sl);
        g->held +=
            sl->held; /* not through osub__gpu_add_held: the history ring is restored as saved */
        g->compute_all += s->spec.compute_pct;
        if (s->backed)
            g->compute_backed += s->spec.compute_pct;
        g->compute_measured += s->compute_used;
        if (s->spec.exclusive)
            g->excl = s;
        if (s->state == OSUB_STATE_PENDING)
            g->n_pending++;
        osub__gpu_list_add(e, g, s);
    }
    if (s->state == OSUB_STATE_SUSPENDED)
        osub__susp_list_add(e, s);
    s->heap_pos[0] = s->heap_pos[1] = -1;
    for (int kind = 0; kind < T__KINDS; kind++) {
        int64_t at = s->timer_at[kind];
        if (at != 0)
            osub__timer_set(e, s, kind, at);
    }
    return 0;
}

int osub__restore_lists(osub_engine_t *e, struct svc **queue, size_t nq, struct svc **pending,
                        size_t np)
{
    if (osub__queue_reserve(e, nq + 1) != 0 ||
        osub__vec_reserve(&e->pending, &e->cap_pending, np + 1) != 0)
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
    osub__refresh_sizes(e);
    for (int32_t i = 0; i < e->n_gpus; i++)
        osub__gpu_touch(e, &e->gpus[i]);
}
