/* snapshot.c - the engine's whole state as versioned text, and back */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SNAP_MAGIC "oversub-engine-snapshot 1"

/* ---- writing ----------------------------------------------------------------------- */

static void put_str(struct osub_sbuf *o, const char *key, const char *s)
{
    osub_sb_printf(o, " %s=", key);
    if (*s == '\0') {
        osub_sb_printf(o, "%%");
        return;
    }
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c <= ' ' || *c == '=' || *c == '%' || *c >= 0x7f)
            osub_sb_printf(o, "%%%02X", *c);
        else
            osub_sb_printf(o, "%c", *c);
    }
}

/* A service's suspend spec and state, on a line of its own after its "svc" line (snapshots made
 * before suspend have none: not suspendable). Only for services that have any. */
static void save_susp(struct osub_sbuf *o, const struct svc *s)
{
    const osub_suspend_spec_t *x = &s->spec.suspend;
    if (x->method == OSUB_SUSPEND_NONE && s->n_suspends == 0 && !s->woke && s->host_mib == 0)
        return;
    osub_sb_printf(o, "susp");
    put_str(o, "of", s->spec.id);
    osub_sb_printf(o, " method=%d", (int)x->method);
    osub_sb_printf(o,
                   " residual_spec=%lld resume_cost=%lld hold=%d woke=%d from=%d host=%lld "
                   "residual=%lld wake=%lld n=%u",
                   (long long)x->residual_mib, (long long)s->spec.resume_cost_ms,
                   s->susp_hold + s->susp_idle, s->woke, (int)s->susp_from, (long long)s->host_mib,
                   (long long)s->residual_est, (long long)s->wake_ms, s->n_suspends);
    /* migrated at its floor, not restarted yet; relocating (its spec may, and a resume onto
     * another GPU under way): each written only then (snapshots before have none) */
    osub_sb_printf(o, "%s%s", s->floor_now ? " floor_now=1" : "", x->relocate ? " relocate=1" : "");
    if (s->reloc_from1 > 0)
        osub_sb_printf(o, " reloc_from=%d", (int)(s->reloc_from1 - 1));
    osub_sb_printf(o, "\n");
}

char *osub_engine_save(const osub_engine_t *e)
{
    struct osub_sbuf o = {.p = malloc(8192), .cap = 8192};
    if (o.p == NULL)
        return NULL;
    o.p[0] = '\0';
    const osub_pool_config_t *c = &e->cfg;
    osub_sb_printf(&o, "%s\n", SNAP_MAGIC);
    osub_sb_printf(
        &o,
        "config ratio=%d compute_ratio=%d margin=%lld high=%d low=%d hysteresis=%lld ack=%lld "
        "grace=%lld min_runtime=%lld window=%lld restart=%lld aging=%lld trust=%lld "
        "floor_start=%lld suspend_host=%lld suspend_rate=%lld suspend_timeout=%lld "
        "suspend_min_runtime=%lld\n",
        c->ratio_milli, c->compute_ratio_milli, (long long)c->margin_mib, c->high_watermark_pct,
        c->low_watermark_pct, (long long)c->hysteresis_ms, (long long)c->ack_timeout_ms,
        (long long)c->grace_ms, (long long)c->min_runtime_ms, (long long)c->history_window_ms,
        (long long)c->restart_cost_ms, (long long)c->queue_aging_ms,
        (long long)c->prediction_trust_ms, (long long)c->floor_start_after_ms,
        (long long)c->suspend_host_mib, (long long)c->suspend_mib_per_s,
        (long long)c->suspend_timeout_ms, (long long)c->suspend_min_runtime_ms);
    for (size_t i = 0; i < e->n_classes; i++) {
        osub_sb_printf(&o, "class");
        put_str(&o, "name", e->classes[i].name);
        osub_sb_printf(&o, " level=%d preemptible=%d grace=%lld\n", e->classes[i].level,
                       e->classes[i].preemptible, (long long)e->classes[i].grace_ms);
    }
    for (int32_t i = 0; i < e->n_gpus; i++) {
        const struct gpu *g = &e->gpus[i];
        osub_sb_printf(&o, "gpu");
        put_str(&o, "name", g->name);
        osub_sb_printf(
            &o, " vram=%lld cordoned=%d lost=%d system=%lld hist_minute=%lld hist_peak=%lld hist=",
            (long long)g->vram, g->cordoned, g->lost, (long long)g->system,
            (long long)g->hist_minute, (long long)g->hist_peak);
        for (int32_t h = 0; h < e->hist_n; h++)
            osub_sb_printf(&o, h ? ",%lld" : "%lld", (long long)g->hist[h]);
        osub_sb_printf(&o, "\n");
    }
    osub_sb_printf(&o,
                   "engine now=%lld next_seq=%llu overcommitted=%d dirty=%d pending_check=%d "
                   "admissions=%llu rejections=%llu degrades=%llu evictions=%llu restores=%llu "
                   "resumes=%llu suspends=%llu wakes=%llu\n",
                   (long long)e->now, (unsigned long long)e->next_seq, e->overcommitted, e->dirty,
                   e->pending_check, (unsigned long long)e->admissions,
                   (unsigned long long)e->rejections, (unsigned long long)e->degrades,
                   (unsigned long long)e->evictions, (unsigned long long)e->restores,
                   (unsigned long long)e->resumes, (unsigned long long)e->suspends,
                   (unsigned long long)e->wakes);
    for (const struct svc *s = e->head; s; s = s->next) {
        const osub_spec_t *p = &s->spec;
        osub_sb_printf(&o, "svc");
        put_str(&o, "id", p->id);
        put_str(&o, "class", p->class_name);
        osub_sb_printf(
            &o,
            " vram=%lld gpus=%d compute=%d min_vram=%lld batch_size=%d min_batch=%d "
            "exclusive=%d preemptible=%d resumable=%d on_evict=%d restart_cost=%lld queue=%d "
            "grace=%lld",
            (long long)p->vram_mib, p->gpus, p->compute_pct, (long long)p->min_vram_mib,
            p->batch_size, p->min_batch_size, p->exclusive, (int)p->preemptible, p->resumable,
            (int)p->on_evict, (long long)p->restart_cost_ms, (int)p->queue, (long long)p->grace_ms);
        osub_sb_printf(
            &o,
            " seq=%llu state=%d loading=%d ack_pending=%d used_capped=%d resumed=%d "
            "evicted_before=%d adopted=%d batch=%d compute_used=%d batch_degraded=%d "
            "batch_room_since=%lld submit=%lld since=%lld start=%lld resume=%lld deadline=%lld "
            "room_since=%lld overdue_requeued=%d n_evictions=%u n_degrades=%u preemptor_level=%d "
            "timer_load=%lld timer_deadline=%lld",
            (unsigned long long)s->seq, (int)s->state, s->loading, s->ack_pending, s->used_capped,
            s->resumed, s->evicted_before, s->adopted, s->batch, s->compute_used, s->batch_degraded,
            (long long)s->batch_room_since_ms, (long long)s->submit_ms, (long long)s->since_ms,
            (long long)s->start_ms, (long long)s->resume_ms, (long long)s->deadline_ms,
            (long long)s->room_since_ms, s->overdue_requeued, s->n_evictions, s->n_degrades,
            s->preemptor_level, (long long)s->timer_at[T_LOAD], (long long)s->timer_at[T_DEADLINE]);
        osub_sb_printf(&o,
                       " pred_n=%u pred_first=%lld pred_mean16=%lld pred_dev16=%lld "
                       "pred_peak=%lld pred_jump=%lld pred_last=%lld place=%lld:%lld:%lld",
                       s->pred.n, (long long)s->pred.first_ms, (long long)s->pred.mean16,
                       (long long)s->pred.dev16, (long long)s->pred.peak, (long long)s->pred.jump,
                       (long long)s->pred.last, (long long)s->place_projected,
                       (long long)s->place_limit, (long long)s->place_charge);
        put_str(&o, "checkpoint", s->checkpoint);
        put_str(&o, "preemptor", s->preemptor);
        osub_sb_printf(&o, " slots=");
        for (int32_t i = 0; i < s->n_slots; i++)
            osub_sb_printf(&o, "%s%d:%lld:%lld:%lld:%lld", i ? "," : "", s->slots[i].gpu,
                           (long long)s->slots[i].grant, (long long)s->slots[i].held_grant,
                           (long long)s->slots[i].used, (long long)s->slots[i].charge);
        if (s->n_slots == 0)
            osub_sb_printf(&o, "-");
        osub_sb_printf(&o, "\n");
        save_susp(&o, s);
        for (int32_t i = 0; i < s->n_waits && s->state == OSUB_STATE_PENDING; i++) {
            osub_sb_printf(&o, "wait");
            put_str(&o, "of", s->spec.id);
            put_str(&o, "victim", s->waits[i].service);
            osub_sb_printf(&o, " evict=%d suspend=%d deadline=%lld\n", s->waits[i].evict,
                           s->waits[i].suspend, (long long)s->waits[i].deadline_ms);
        }
    }
    for (size_t i = 0; i < e->n_queue; i++) {
        osub_sb_printf(&o, "queued");
        put_str(&o, "id", e->queue[i]->spec.id);
        osub_sb_printf(&o, "\n");
    }
    for (size_t i = 0; i < e->n_pending; i++) {
        osub_sb_printf(&o, "pending");
        put_str(&o, "id", e->pending[i]->spec.id);
        osub_sb_printf(&o, "\n");
    }
    osub_sb_printf(&o, "end\n");
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    return o.p;
}

/* ---- reading ----------------------------------------------------------------------- */

struct line {
    char *kind;
    char *keys[64];
    char *vals[64];
    int n;
};

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes in place; false on a bad escape. "%" alone is the empty string. */
static bool unescape(char *s)
{
    if (strcmp(s, "%") == 0) {
        s[0] = '\0';
        return true;
    }
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r != '%') {
            *w++ = *r;
            continue;
        }
        int a = hexval(r[1]), b = a >= 0 ? hexval(r[2]) : -1;
        if (a < 0 || b < 0)
            return false;
        *w++ = (char)(a * 16 + b);
        r += 2;
    }
    *w = '\0';
    return true;
}

static bool split_line(char *text, struct line *l)
{
    l->n = 0;
    char *save = NULL;
    l->kind = strtok_r(text, " ", &save);
    if (l->kind == NULL)
        return false;
    for (char *tok = strtok_r(NULL, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (eq == NULL || l->n == 64)
            return false;
        *eq = '\0';
        l->keys[l->n] = tok;
        l->vals[l->n] = eq + 1;
        l->n++;
    }
    return true;
}

static const char *get(const struct line *l, const char *key)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->keys[i], key) == 0)
            return l->vals[i];
    return NULL;
}

static bool get_i64(const struct line *l, const char *key, int64_t *out)
{
    const char *v = get(l, key);
    if (v == NULL || *v == '\0')
        return false;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end != '\0' || errno != 0)
        return false;
    *out = x;
    return true;
}

static bool get_i32(const struct line *l, const char *key, int32_t *out)
{
    int64_t x;
    if (!get_i64(l, key, &x) || x < INT32_MIN || x > INT32_MAX)
        return false;
    *out = (int32_t)x;
    return true;
}

static bool get_bool(const struct line *l, const char *key, bool *out)
{
    int64_t x;
    if (!get_i64(l, key, &x) || (x != 0 && x != 1))
        return false;
    *out = x != 0;
    return true;
}

static bool get_str(const struct line *l, const char *key, char *buf, size_t len)
{
    const char *v = get(l, key);
    if (v == NULL || strlen(v) >= len * 3 + 2)
        return false;
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", v);
    if (!unescape(tmp) || strlen(tmp) >= len)
        return false;
    memcpy(buf, tmp, strlen(tmp) + 1);
    return true;
}

/* Rebuilds a service's derived fields from its spec, as the engine did at submit/resize. */
static bool derive(const osub_engine_t *e, struct svc *s)
{
    const osub_class_t *cls = NULL;
    for (size_t i = 0; i < e->n_classes; i++)
        if (strcmp(e->classes[i].name, s->spec.class_name) == 0)
            cls = &e->classes[i];
    if (cls == NULL || !osub_id_valid(s->spec.id) || s->spec.gpus < 1 ||
        s->spec.gpus > OSUB_SERVICE_GPUS_MAX || s->spec.vram_mib <= 0 ||
        s->spec.min_vram_mib <= 0 || s->spec.min_vram_mib > s->spec.vram_mib)
        return false;
    s->level = cls->level;
    s->preemptible = s->spec.preemptible == OSUB_TRI_YES;
    s->backed = !s->preemptible;
    s->degradable = s->preemptible && s->spec.min_vram_mib < s->spec.vram_mib;
    s->requeue_on_evict = s->spec.on_evict == OSUB_ON_EVICT_REQUEUE;
    s->queue_ok = s->spec.queue == OSUB_TRI_YES;
    s->full_total = s->spec.vram_mib;
    s->floor_total = s->spec.min_vram_mib;
    s->full_batch = s->spec.batch_size;
    s->floor_batch = s->spec.min_batch_size;
    s->grace_ms = s->spec.grace_ms;
    s->restart_cost_ms = s->spec.restart_cost_ms;
    s->k = s->spec.gpus;
    osub__susp_derive(s);
    return true;
}

/* A service from its line; NULL when the line is bad, or out of memory (*oom set). */
static struct svc *read_svc(const osub_engine_t *e, const struct line *l, bool *oom)
{
    struct svc *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        *oom = true;
        return NULL;
    }
    osub_spec_t *p = &s->spec;
    int32_t pre, onev, q, state;
    int64_t seq;
    bool ok =
        get_str(l, "id", p->id, sizeof(p->id)) &&
        get_str(l, "class", p->class_name, sizeof(p->class_name)) &&
        get_i64(l, "vram", &p->vram_mib) && get_i32(l, "gpus", &p->gpus) &&
        get_i32(l, "compute", &p->compute_pct) && get_i64(l, "min_vram", &p->min_vram_mib) &&
        get_i32(l, "batch_size", &p->batch_size) && get_i32(l, "min_batch", &p->min_batch_size) &&
        get_bool(l, "exclusive", &p->exclusive) && get_i32(l, "preemptible", &pre) &&
        get_bool(l, "resumable", &p->resumable) && get_i32(l, "on_evict", &onev) &&
        get_i64(l, "restart_cost", &p->restart_cost_ms) && get_i32(l, "queue", &q) &&
        get_i64(l, "grace", &p->grace_ms) && get_i64(l, "seq", &seq) &&
        get_i32(l, "state", &state) && get_bool(l, "loading", &s->loading) &&
        get_bool(l, "ack_pending", &s->ack_pending) &&
        get_bool(l, "used_capped", &s->used_capped) && get_bool(l, "resumed", &s->resumed) &&
        get_bool(l, "evicted_before", &s->evicted_before) && get_bool(l, "adopted", &s->adopted) &&
        get_i32(l, "batch", &s->batch) && get_i32(l, "compute_used", &s->compute_used) &&
        get_bool(l, "batch_degraded", &s->batch_degraded) &&
        get_i64(l, "batch_room_since", &s->batch_room_since_ms) &&
        get_i64(l, "submit", &s->submit_ms) && get_i64(l, "since", &s->since_ms) &&
        get_i64(l, "start", &s->start_ms) && get_i64(l, "resume", &s->resume_ms) &&
        get_i64(l, "deadline", &s->deadline_ms) && get_i64(l, "room_since", &s->room_since_ms) &&
        get_bool(l, "overdue_requeued", &s->overdue_requeued) &&
        get_i32(l, "preemptor_level", &s->preemptor_level) &&
        get_i64(l, "timer_load", &s->timer_at[T_LOAD]) &&
        get_i64(l, "timer_deadline", &s->timer_at[T_DEADLINE]) &&
        get_str(l, "checkpoint", s->checkpoint, sizeof(s->checkpoint)) &&
        get_str(l, "preemptor", s->preemptor, sizeof(s->preemptor));
    /* the predictor's state (absent in snapshots made before it: no history) */
    osub__pred_init(&s->pred);
    if (get(l, "pred_n") != NULL) {
        int64_t pn;
        ok = ok && get_i64(l, "pred_n", &pn) && pn >= 0 && pn <= UINT32_MAX &&
             get_i64(l, "pred_first", &s->pred.first_ms) &&
             get_i64(l, "pred_mean16", &s->pred.mean16) &&
             get_i64(l, "pred_dev16", &s->pred.dev16) && get_i64(l, "pred_peak", &s->pred.peak) &&
             get_i64(l, "pred_jump", &s->pred.jump) && get_i64(l, "pred_last", &s->pred.last) &&
             s->pred.mean16 >= 0 && s->pred.dev16 >= 0 && s->pred.peak >= 0 && s->pred.jump >= 0 &&
             s->pred.last >= 0;
        if (ok)
            s->pred.n = (uint32_t)pn;
    }
    const char *pl = get(l, "place");
    if (pl != NULL) {
        long long a, b2, c;
        int used_chars = 0;
        ok = ok && sscanf(pl, "%lld:%lld:%lld%n", &a, &b2, &c, &used_chars) == 3 &&
             pl[used_chars] == '\0' && b2 >= 0 && c >= 0;
        if (ok) {
            s->place_projected = a;
            s->place_limit = b2;
            s->place_charge = c;
        }
    }
    int64_t nev, ndg;
    ok = ok && get_i64(l, "n_evictions", &nev) && get_i64(l, "n_degrades", &ndg) && nev >= 0 &&
         ndg >= 0 && pre >= -1 && pre <= 1 && q >= -1 && q <= 1 && onev >= 0 && onev <= 2 &&
         state >= 0 && state < (int32_t)OSUB_STATE__COUNT && seq > 0;
    if (!ok) {
        osub_svc_free(s);
        return NULL;
    }
    p->preemptible = (osub_tri_t)pre;
    p->queue = (osub_tri_t)q;
    p->on_evict = (osub_on_evict_t)onev;
    s->state = (osub_state_t)state;
    s->seq = (uint64_t)seq;
    s->n_evictions = (uint32_t)nev;
    s->n_degrades = (uint32_t)ndg;
    p->resume_cost_ms = -1;
    if (!derive(e, s)) {
        osub_svc_free(s);
        return NULL;
    }
    s->slots = calloc((size_t)s->k, sizeof(*s->slots));
    if (s->slots == NULL) {
        *oom = true;
        osub_svc_free(s);
        return NULL;
    }
    const char *sl = get(l, "slots");
    if (sl == NULL) {
        osub_svc_free(s);
        return NULL;
    }
    if (strcmp(sl, "-") != 0) {
        const char *c = sl;
        while (*c) {
            long long gpu, grant, hg, used, charge = -1;
            int used_chars = 0, more = 0;
            if (s->n_slots == s->k ||
                sscanf(c, "%lld:%lld:%lld:%lld%n", &gpu, &grant, &hg, &used, &used_chars) != 4 ||
                gpu < 0 || gpu >= e->n_gpus || grant < 0 || hg < 0 || used < 0) {
                osub_svc_free(s);
                return NULL;
            }
            c += used_chars;
            /* snapshots before the predictor have no charge: the grant was counted */
            if (*c == ':' && (sscanf(c, ":%lld%n", &charge, &more) != 1 || charge < 0)) {
                osub_svc_free(s);
                return NULL;
            }
            c += more;
            s->slots[s->n_slots++] =
                (struct slot){(int32_t)gpu, grant, hg, used, 0, charge < 0 ? grant : charge};
            if (*c == ',')
                c++;
            else if (*c != '\0') {
                osub_svc_free(s);
                return NULL;
            }
        }
    }
    return s;
}

/* What osub_engine_load() has read so far; the engine exists from the "engine" line on. */
struct loader {
    osub_pool_config_t cfg;
    osub_class_t classes[OSUB_MAX_CLASSES];
    size_t n_classes;
    int64_t *vram;
    char **names;
    struct line *gpu_lines; /* kept until the engine exists; they point into the text read */
    size_t n_gpus, cap_gpus;
    osub_engine_t *e;
    bool seen_engine;
    struct svc **svcs, **queue, **pending;
    size_t n_svcs, cap_svcs, nq, np;
};

/* Each line kind's reader returns 0, OSUB_EBAD_SNAPSHOT or OSUB_ENOMEM. */
static int load_config(struct loader *ld, const struct line *l)
{
    osub_pool_config_t *cfg = &ld->cfg;
    if (!get_i32(l, "ratio", &cfg->ratio_milli) ||
        !get_i32(l, "compute_ratio", &cfg->compute_ratio_milli) ||
        !get_i64(l, "margin", &cfg->margin_mib) || !get_i32(l, "high", &cfg->high_watermark_pct) ||
        !get_i32(l, "low", &cfg->low_watermark_pct) ||
        !get_i64(l, "hysteresis", &cfg->hysteresis_ms) ||
        !get_i64(l, "ack", &cfg->ack_timeout_ms) || !get_i64(l, "grace", &cfg->grace_ms) ||
        !get_i64(l, "min_runtime", &cfg->min_runtime_ms) ||
        !get_i64(l, "window", &cfg->history_window_ms) ||
        !get_i64(l, "restart", &cfg->restart_cost_ms) || !get_i64(l, "aging", &cfg->queue_aging_ms))
        return OSUB_EBAD_SNAPSHOT;
    /* absent in snapshots made before the predictor: the defaults */
    if ((get(l, "trust") != NULL && !get_i64(l, "trust", &cfg->prediction_trust_ms)) ||
        (get(l, "floor_start") != NULL && !get_i64(l, "floor_start", &cfg->floor_start_after_ms)))
        return OSUB_EBAD_SNAPSHOT;
    /* absent in snapshots made before suspend: the defaults (suspend off) */
    if ((get(l, "suspend_host") != NULL && !get_i64(l, "suspend_host", &cfg->suspend_host_mib)) ||
        (get(l, "suspend_rate") != NULL && !get_i64(l, "suspend_rate", &cfg->suspend_mib_per_s)) ||
        (get(l, "suspend_timeout") != NULL &&
         !get_i64(l, "suspend_timeout", &cfg->suspend_timeout_ms)) ||
        (get(l, "suspend_min_runtime") != NULL &&
         !get_i64(l, "suspend_min_runtime", &cfg->suspend_min_runtime_ms)))
        return OSUB_EBAD_SNAPSHOT;
    return 0;
}

static int load_class(struct loader *ld, const struct line *l)
{
    if (ld->n_classes == OSUB_MAX_CLASSES)
        return OSUB_EBAD_SNAPSHOT;
    osub_class_t *c = &ld->classes[ld->n_classes];
    memset(c, 0, sizeof(*c));
    if (!get_str(l, "name", c->name, sizeof(c->name)) || !get_i32(l, "level", &c->level) ||
        !get_bool(l, "preemptible", &c->preemptible) || !get_i64(l, "grace", &c->grace_ms))
        return OSUB_EBAD_SNAPSHOT;
    ld->n_classes++;
    return 0;
}

static int load_gpu(struct loader *ld, const struct line *l)
{
    if (ld->e != NULL)
        return OSUB_EBAD_SNAPSHOT;
    if (ld->n_gpus == ld->cap_gpus) {
        ld->cap_gpus = ld->cap_gpus ? ld->cap_gpus * 2 : 16;
        int64_t *nv = realloc(ld->vram, ld->cap_gpus * sizeof(*nv));
        char **nn = nv ? realloc(ld->names, ld->cap_gpus * sizeof(*nn)) : NULL;
        struct line *nl = nn ? realloc(ld->gpu_lines, ld->cap_gpus * sizeof(*nl)) : NULL;
        if (nv)
            ld->vram = nv;
        if (nn)
            ld->names = nn;
        if (nl == NULL)
            return OSUB_ENOMEM;
        ld->gpu_lines = nl;
    }
    size_t i = ld->n_gpus;
    ld->names[i] = malloc(OSUB_GPU_NAME_MAX + 1);
    if (ld->names[i] == NULL)
        return OSUB_ENOMEM;
    ld->n_gpus++; /* its name is freed with the others from now on */
    if (!get_str(l, "name", ld->names[i], OSUB_GPU_NAME_MAX + 1) ||
        !get_i64(l, "vram", &ld->vram[i]))
        return OSUB_EBAD_SNAPSHOT;
    ld->gpu_lines[i] = *l; /* its pointers stay valid: they point into the text read */
    return 0;
}

/* The engine line: the engine is made from what came before it, then its GPUs' state. */
static int load_engine(struct loader *ld, const struct line *l)
{
    int rc = osub_engine_new(&ld->cfg, ld->vram, (const char *const *)ld->names, ld->n_gpus,
                             ld->classes, ld->n_classes, &ld->e);
    if (rc != 0)
        return rc == OSUB_ENOMEM ? OSUB_ENOMEM : OSUB_EBAD_SNAPSHOT;
    osub_engine_t *e = ld->e;
    int64_t now, seq, ad, rj, dg, ev, rs, rm;
    if (!get_i64(l, "now", &now) || !get_i64(l, "next_seq", &seq) ||
        !get_bool(l, "overcommitted", &e->overcommitted) || !get_bool(l, "dirty", &e->dirty) ||
        !get_bool(l, "pending_check", &e->pending_check) || !get_i64(l, "admissions", &ad) ||
        !get_i64(l, "rejections", &rj) || !get_i64(l, "degrades", &dg) ||
        !get_i64(l, "evictions", &ev) || !get_i64(l, "restores", &rs) ||
        !get_i64(l, "resumes", &rm) || now < 0 || seq < 1)
        return OSUB_EBAD_SNAPSHOT;
    e->now = now;
    e->next_seq = (uint64_t)seq;
    e->admissions = (uint64_t)ad;
    e->rejections = (uint64_t)rj;
    e->degrades = (uint64_t)dg;
    e->evictions = (uint64_t)ev;
    e->restores = (uint64_t)rs;
    e->resumes = (uint64_t)rm;
    int64_t sus = 0, wk = 0;
    if ((get(l, "suspends") != NULL && (!get_i64(l, "suspends", &sus) || sus < 0)) ||
        (get(l, "wakes") != NULL && (!get_i64(l, "wakes", &wk) || wk < 0)))
        return OSUB_EBAD_SNAPSHOT;
    e->suspends = (uint64_t)sus;
    e->wakes = (uint64_t)wk;
    e->trees_minute = now / 60000;
    for (size_t i = 0; i < ld->n_gpus; i++) {
        struct gpu *g = &e->gpus[i];
        const struct line *gl = &ld->gpu_lines[i];
        int64_t hm, hp;
        if (!get_bool(gl, "cordoned", &g->cordoned) || !get_bool(gl, "lost", &g->lost) ||
            !get_i64(gl, "system", &g->system) || !get_i64(gl, "hist_minute", &hm) ||
            !get_i64(gl, "hist_peak", &hp) || g->system < 0 || g->system > g->vram)
            return OSUB_EBAD_SNAPSHOT;
        g->held += g->system;
        g->hist_minute = hm;
        g->hist_peak = hp;
        const char *h = get(gl, "hist");
        for (int32_t x = 0; x < e->hist_n; x++) {
            char *end;
            if (h == NULL || *h == '\0')
                return OSUB_EBAD_SNAPSHOT;
            g->hist[x] = strtoll(h, &end, 10);
            h = *end == ',' ? end + 1 : end;
            if (*end != ',' && *end != '\0')
                return OSUB_EBAD_SNAPSHOT;
        }
    }
    ld->seen_engine = true;
    return 0;
}

static int load_svc(struct loader *ld, const struct line *l)
{
    if (!ld->seen_engine)
        return OSUB_EBAD_SNAPSHOT;
    bool oom = false;
    struct svc *s = read_svc(ld->e, l, &oom);
    if (s == NULL || osub__lookup(ld->e, s->spec.id) != NULL) {
        osub_svc_free(s);
        return oom ? OSUB_ENOMEM : OSUB_EBAD_SNAPSHOT;
    }
    if (ld->n_svcs == ld->cap_svcs) {
        ld->cap_svcs = ld->cap_svcs ? ld->cap_svcs * 2 : 64;
        struct svc **n = realloc(ld->svcs, ld->cap_svcs * sizeof(*n));
        if (n == NULL) {
            osub_svc_free(s);
            return OSUB_ENOMEM;
        }
        ld->svcs = n;
    }
    if (osub__restore_service(ld->e, s) != 0) {
        osub_svc_free(s);
        return OSUB_ENOMEM;
    }
    ld->svcs[ld->n_svcs++] = s;
    return 0;
}

/* A victim a pending service waits for. */
static int load_wait(struct loader *ld, const struct line *l)
{
    char of[OSUB_ID_MAX + 1];
    osub_victim_t w;
    int64_t ev, sp = 0;
    if (!ld->seen_engine || !get_str(l, "of", of, sizeof(of)) ||
        !get_str(l, "victim", w.service, sizeof(w.service)) || !get_i64(l, "evict", &ev) ||
        !get_i64(l, "deadline", &w.deadline_ms) ||
        (get(l, "suspend") != NULL && !get_i64(l, "suspend", &sp)))
        return OSUB_EBAD_SNAPSHOT;
    w.suspend = sp != 0;
    struct svc *s = osub__lookup(ld->e, of);
    if (s == NULL || s->n_waits >= OSUB_PLAN_MAX_VICTIMS)
        return OSUB_EBAD_SNAPSHOT;
    osub_victim_t *nw = realloc(s->waits, (size_t)(s->n_waits + 1) * sizeof(*nw));
    if (nw == NULL)
        return OSUB_ENOMEM;
    s->waits = nw;
    w.evict = ev != 0;
    s->waits[s->n_waits++] = w;
    return 0;
}

/* A "queued" or "pending" line: the next service of that list, in saved order. */
static int load_listed(struct loader *ld, const struct line *l)
{
    char id[OSUB_ID_MAX + 1];
    if (!ld->seen_engine || !get_str(l, "id", id, sizeof(id)))
        return OSUB_EBAD_SNAPSHOT;
    struct svc *s = osub__lookup(ld->e, id);
    bool is_q = l->kind[0] == 'q';
    if (s == NULL || s->state != (is_q ? OSUB_STATE_QUEUED : OSUB_STATE_PENDING))
        return OSUB_EBAD_SNAPSHOT;
    struct svc ***v = is_q ? &ld->queue : &ld->pending;
    size_t *nv = is_q ? &ld->nq : &ld->np;
    struct svc **nn = realloc(*v, (*nv + 1) * sizeof(**v));
    if (nn == NULL)
        return OSUB_ENOMEM;
    *v = nn;
    (*v)[(*nv)++] = s;
    return 0;
}

/* A service's suspend line: its spec's suspend part and its suspend state. The service was
 * read without it (in_suspend states refused there) and is wired into the engine already. */
static int load_susp(struct loader *ld, const struct line *l)
{
    char of[OSUB_ID_MAX + 1];
    int32_t method, from;
    int64_t n;
    if (!ld->seen_engine || !get_str(l, "of", of, sizeof(of)))
        return OSUB_EBAD_SNAPSHOT;
    struct svc *s = osub__lookup(ld->e, of);
    if (s == NULL || s->spec.suspend.method != OSUB_SUSPEND_NONE || s->n_suspends != 0)
        return OSUB_EBAD_SNAPSHOT;
    osub_suspend_spec_t *x = &s->spec.suspend;
    int32_t hold;
    bool woke;
    if (!get_i32(l, "method", &method) || method < 0 || method > OSUB_SUSPEND_HTTP ||
        !get_i64(l, "residual_spec", &x->residual_mib) ||
        !get_i64(l, "resume_cost", &s->spec.resume_cost_ms) || !get_i32(l, "hold", &hold) ||
        hold < 0 || hold > 2 || !get_bool(l, "woke", &woke) || !get_i32(l, "from", &from) ||
        !get_i64(l, "host", &s->host_mib) || !get_i64(l, "residual", &s->residual_est) ||
        !get_i64(l, "wake", &s->wake_ms) || !get_i64(l, "n", &n) || n < 0 || n > UINT32_MAX ||
        x->residual_mib < 0 || s->host_mib < 0 || s->residual_est < 0 ||
        s->spec.resume_cost_ms < -1 ||
        (from != OSUB_STATE_RUNNING && from != OSUB_STATE_DEGRADED && from != 0))
        return OSUB_EBAD_SNAPSHOT;
    x->method = (osub_suspend_method_t)method;
    int64_t est = s->residual_est;
    osub__susp_derive(s);
    s->residual_est = est;
    s->susp_hold = hold > 0; /* 2: held for idleness */
    s->susp_idle = hold == 2;
    s->woke = woke;
    s->susp_from = (osub_state_t)from;
    s->n_suspends = (uint32_t)n;
    s->floor_now = false;
    if (get(l, "floor_now") != NULL && !get_bool(l, "floor_now", &s->floor_now))
        return OSUB_EBAD_SNAPSHOT;
    x->relocate = false;
    if (get(l, "relocate") != NULL && !get_bool(l, "relocate", &x->relocate))
        return OSUB_EBAD_SNAPSHOT;
    int32_t rf = -1;
    if (get(l, "reloc_from") != NULL &&
        (!get_i32(l, "reloc_from", &rf) || rf < 0 || rf >= ld->e->n_gpus ||
         s->state != OSUB_STATE_RESUMING || s->n_slots != 1 || s->slots[0].gpu == rf))
        return OSUB_EBAD_SNAPSHOT;
    s->reloc_from1 = rf + 1;
    if (x->relocate && (x->method != OSUB_SUSPEND_CUDA || s->spec.exclusive))
        return OSUB_EBAD_SNAPSHOT;
    if (s->suspendable)
        ld->e->n_suspendable++;
    ld->e->host_used += s->host_mib;
    return 0;
}

static int load_line(struct loader *ld, const struct line *l)
{
    if (strcmp(l->kind, "config") == 0)
        return load_config(ld, l);
    if (strcmp(l->kind, "class") == 0)
        return load_class(ld, l);
    if (strcmp(l->kind, "gpu") == 0)
        return load_gpu(ld, l);
    if (strcmp(l->kind, "engine") == 0)
        return load_engine(ld, l);
    if (strcmp(l->kind, "svc") == 0)
        return load_svc(ld, l);
    if (strcmp(l->kind, "wait") == 0)
        return load_wait(ld, l);
    if (strcmp(l->kind, "susp") == 0)
        return load_susp(ld, l);
    if (strcmp(l->kind, "queued") == 0 || strcmp(l->kind, "pending") == 0)
        return load_listed(ld, l);
    return OSUB_EBAD_SNAPSHOT;
}

static void loader_cleanup(struct loader *ld)
{
    osub_engine_free(ld->e);
    for (size_t i = 0; i < ld->n_gpus; i++)
        free(ld->names[i]);
    free(ld->names);
    free(ld->vram);
    free(ld->gpu_lines);
    free(ld->svcs);
    free(ld->queue);
    free(ld->pending);
}

int osub_engine_load(const char *text, osub_engine_t **out, size_t *err_line)
{
    if (text == NULL || out == NULL)
        return OSUB_EINVAL;
    char *buf = strdup(text);
    if (buf == NULL)
        return OSUB_ENOMEM;
    struct loader ld;
    memset(&ld, 0, sizeof(ld));
    osub_pool_config_default(&ld.cfg);
    int rc = OSUB_EBAD_SNAPSHOT;
    size_t lineno = 0;
    bool seen_end = false;
    char *save = NULL;
    struct line l;
    for (char *ln = strtok_r(buf, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
        lineno++;
        if (lineno == 1) {
            if (strcmp(ln, SNAP_MAGIC) != 0)
                goto fail;
            continue;
        }
        if (seen_end || !split_line(ln, &l))
            goto fail;
        if (strcmp(l.kind, "end") == 0) {
            seen_end = true;
            continue;
        }
        rc = load_line(&ld, &l);
        if (rc != 0)
            goto fail;
        rc = OSUB_EBAD_SNAPSHOT;
    }
    if (!seen_end || !ld.seen_engine)
        goto fail;
    if (osub__restore_lists(ld.e, ld.queue, ld.nq, ld.pending, ld.np) != 0) {
        rc = OSUB_ENOMEM;
        goto fail;
    }
    osub__restore_done(ld.e);
    {
        char why[256];
        int crc = osub_engine_check(ld.e, why, sizeof(why));
        if (crc == OSUB_ENOMEM)
            rc = OSUB_ENOMEM;
        if (crc != 0)
            goto fail; /* the numbers do not add up: corrupt */
    }
    rc = 0;
    *out = ld.e;
    ld.e = NULL;
fail:
    if (rc != 0 && err_line != NULL)
        *err_line = lineno;
    loader_cleanup(&ld);
    free(buf);
    return rc;
}
