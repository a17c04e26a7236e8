/* fake_core.c - a stand-in for oversubd's core for the modules' unit tests (fake_core.h) */
#define _POSIX_C_SOURCE 200809L
#include "fake_core.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "command.h"
#include "log.h"
#include "oversub/units.h"
#include "state.h"

#define FAKE_BASE_UNIX_MS 1700000000000LL /* engine time 0 on the wall clock */

struct fake_event {
    int64_t seq;
    char *text;
};

struct osubd_core {
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    char pool[512];
    struct osubd_module mods[OSUBD_MODULES_MAX];
    size_t n_mods;
    bool loaded, started, existing, fatal, full;
    bool fail_meta, fail_saves;
    int64_t now_ms;
    uint64_t applied, durable, version;
    json_t *meta; /* key -> JSON string */
    size_t n_saves;
    struct fake_core_cmd *cmds;
    size_t n_cmds, cap_cmds;
    struct fake_core_note *notes;
    size_t n_notes, cap_notes;
    struct fake_event *events;
    size_t n_events, cap_events;
    int64_t last_event;    /* the newest durable event */
    int64_t durable_event; /* events up to this one are durable */
    uint64_t ev_counts[OSUB_EV__COUNT][4];
    uint8_t key[32];
};

/* ---- the fake's own ------------------------------------------------------------------------ */

/* A test's fake: out of memory ends the test (not compiled out as an assert would be). */
static void *must(void *p)
{
    if (p == NULL) {
        fprintf(stderr, "fake core: out of memory\n");
        abort();
    }
    return p;
}

static void *grow(void *p, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return p;
    size_t nc = *cap ? *cap * 2 : 16;
    void *q = must(realloc(p, nc * size));
    *cap = nc;
    return q;
}

static int make_engine(struct osubd_core *c, const int64_t *vram, char (*names)[96], size_t n,
                       bool nvml)
{
    osub_pool_config_t cfg = c->cfg->engine;
    cfg.ratio_milli = c->cfg->ratio_milli;
    if (nvml)
        cfg.margin_mib = 1024; /* as the real core: the driver's own memory */
    const char *np[OSUB_POOL_GPUS_MAX];
    for (size_t i = 0; i < n; i++)
        np[i] = names != NULL && names[i][0] ? names[i] : NULL;
    return osub_engine_new(&cfg, vram, np, n, NULL, 0, &c->e);
}

struct osubd_core *fake_core_new(const struct osubd_config *cfg, const char *pool)
{
    int64_t vram[OSUB_POOL_GPUS_MAX];
    size_t n = 0;
    if (osub_parse_pool(pool, vram, OSUB_POOL_GPUS_MAX, &n) != 0)
        return NULL;
    struct osubd_core *c = osubd_core_new(cfg);
    if (c == NULL)
        return NULL;
    if (make_engine(c, vram, NULL, n, false) != 0) {
        osubd_core_free(c);
        return NULL;
    }
    snprintf(c->pool, sizeof(c->pool), "sim:%s", pool);
    return c;
}

void fake_core_set_time(struct osubd_core *c, int64_t engine_ms)
{
    c->now_ms = engine_ms;
}

void fake_core_advance(struct osubd_core *c, int64_t ms)
{
    c->now_ms += ms;
}

static void tell_durable(struct osubd_core *c, const struct osubd_progress *p)
{
    for (size_t i = 0; i < c->n_mods; i++)
        if (c->mods[i].durable != NULL)
            c->mods[i].durable(c->mods[i].ctx, p);
}

void fake_core_commit(struct osubd_core *c)
{
    if (!c->started)
        return;
    bool events = c->durable_event > c->last_event;
    c->last_event = c->durable_event;
    c->durable = c->applied;
    struct osubd_progress p = {.durable = c->durable, .commit = true, .events = events};
    tell_durable(c, &p);
}

void fake_core_set_full(struct osubd_core *c, bool full)
{
    bool was = c->full;
    c->full = full;
    if (full && !was) {
        struct osubd_progress p = {.durable = c->durable, .full = true};
        tell_durable(c, &p);
    }
}

void fake_core_set_existing(struct osubd_core *c, bool existing)
{
    c->existing = existing;
}

void fake_core_fail_meta(struct osubd_core *c, bool fail)
{
    c->fail_meta = fail;
}

void fake_core_fail_saves(struct osubd_core *c, bool fail)
{
    c->fail_saves = fail;
}

size_t fake_core_n_cmds(const struct osubd_core *c)
{
    return c->n_cmds;
}

const struct fake_core_cmd *fake_core_cmd(const struct osubd_core *c, size_t i)
{
    return i < c->n_cmds ? &c->cmds[i] : NULL;
}

const struct fake_core_cmd *fake_core_last_cmd(const struct osubd_core *c)
{
    return c->n_cmds > 0 ? &c->cmds[c->n_cmds - 1] : NULL;
}

size_t fake_core_n_notes(const struct osubd_core *c)
{
    return c->n_notes;
}

const struct fake_core_note *fake_core_note(const struct osubd_core *c, size_t i)
{
    return i < c->n_notes ? &c->notes[i] : NULL;
}

size_t fake_core_n_saves(const struct osubd_core *c)
{
    return c->n_saves;
}

const char *fake_core_meta_text(const struct osubd_core *c, const char *key)
{
    return json_string_value(json_object_get(c->meta, key));
}

/* ---- core.h: lifecycle --------------------------------------------------------------------- */

struct osubd_core *osubd_core_new(const struct osubd_config *cfg)
{
    struct osubd_core *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->cfg = cfg;
    c->base = event_base_new();
    c->meta = json_object();
    if (c->base == NULL || c->meta == NULL) {
        osubd_core_free(c);
        return NULL;
    }
    for (int i = 0; i < 32; i++)
        c->key[i] = (uint8_t)(0x42 + i);
    snprintf(c->pool, sizeof(c->pool), "%s", cfg->gpus);
    return c;
}

/* A new state on pool_fn's pool, as the real core makes one (nothing on disk). */
int osubd_core_open(struct osubd_core *c, osubd_pool_fn pool_fn, void *pool_arg, char *err,
                    size_t errlen)
{
    if (c->e != NULL) {
        snprintf(err, errlen, "fake core: the engine is already made");
        return -1;
    }
    struct osubd_pool *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = pool_fn(pool_arg, c->cfg->gpus, p, err, errlen);
    if (rc == 0 && make_engine(c, p->vram, p->names, p->n, p->nvml) != 0) {
        snprintf(err, errlen, "pool: not a pool the engine takes");
        rc = -1;
    }
    if (rc == 0)
        snprintf(c->pool, sizeof(c->pool), "%s", p->nvml ? "nvml" : c->cfg->gpus);
    free(p);
    return rc == 0 ? 0 : -1;
}

int osubd_core_register(struct osubd_core *c, const struct osubd_module *m)
{
    assert(!c->loaded); /* core.h: modules register before they load */
    if (c->n_mods >= OSUBD_MODULES_MAX)
        return -1;
    c->mods[c->n_mods++] = *m;
    return 0;
}

int osubd_core_load(struct osubd_core *c, char *err, size_t errlen)
{
    assert(c->e != NULL);
    c->loaded = true;
    for (size_t i = 0; i < c->n_mods; i++) {
        char e2[600];
        if (c->mods[i].load != NULL && c->mods[i].load(c->mods[i].ctx, c, e2, sizeof(e2)) != 0) {
            snprintf(err, errlen, "%s: %s", c->cfg->state_path, e2);
            return -1;
        }
    }
    return 0;
}

int osubd_core_start(struct osubd_core *c, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    assert(c->loaded);
    c->started = true;
    return 0;
}

void osubd_core_stop(struct osubd_core *c)
{
    if (!c->started)
        return;
    if (!c->fatal) { /* what was handed over is durable and heard of */
        c->last_event = c->durable_event;
        c->durable = c->applied;
        struct osubd_progress p = {.durable = c->durable};
        tell_durable(c, &p);
    }
    c->started = false;
}

void osubd_core_free(struct osubd_core *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_cmds; i++)
        free(c->cmds[i].text);
    free(c->cmds);
    free(c->notes);
    for (size_t i = 0; i < c->n_events; i++)
        free(c->events[i].text);
    free(c->events);
    json_decref(c->meta);
    osub_engine_free(c->e);
    if (c->base != NULL)
        event_base_free(c->base);
    free(c);
}

/* ---- core.h: what the modules read --------------------------------------------------------- */

struct event_base *osubd_core_base(const struct osubd_core *c)
{
    return c->base;
}

osub_engine_t *osubd_core_engine(const struct osubd_core *c)
{
    return c->e;
}

const struct osubd_config *osubd_core_config(const struct osubd_core *c)
{
    return c->cfg;
}

const char *osubd_core_pool(const struct osubd_core *c)
{
    return c->pool;
}

bool osubd_core_existing(const struct osubd_core *c)
{
    return c->existing;
}

int osubd_core_meta(struct osubd_core *c, const char *key, char **text, char *err, size_t errlen)
{
    *text = NULL;
    if (c->fail_meta) {
        snprintf(err, errlen, "%s: cannot read '%s' from the state: the fake says no",
                 c->cfg->state_path, key);
        return -1;
    }
    const char *v = json_string_value(json_object_get(c->meta, key));
    if (v != NULL) {
        *text = strdup(v);
        if (*text == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

int osubd_core_meta_set(struct osubd_core *c, const char *key, const char *text, char *err,
                        size_t errlen)
{
    assert(!c->started); /* core.h: while starting */
    if (json_object_set_new(c->meta, key, json_string(text)) != 0) {
        snprintf(err, errlen, "%s: cannot set '%s'", c->cfg->state_path, key);
        return -1;
    }
    return 0;
}

void osubd_meta_put(json_t *meta, const char *key, const json_t *value)
{
    char *text = json_dumps(value, JSON_COMPACT | JSON_SORT_KEYS);
    if (text != NULL)
        json_object_set_new(meta, key, json_string(text));
    free(text);
}

/* ---- core.h: commands ---------------------------------------------------------------------- */

static json_t *event_json(const struct osubd_core *c, const osub_event_t *ev)
{
    json_t *o = json_object();
    json_object_set_new(o, "time_unix_ms", json_integer(osubd_engine_to_unix(c, ev->time_ms)));
    json_object_set_new(o, "kind", json_string(osub_event_name(ev->kind)));
    json_object_set_new(o, "reason", json_string(osub_reason_name(ev->reason)));
    if (ev->service[0])
        json_object_set_new(o, "service", json_string(ev->service));
    if (ev->cause[0])
        json_object_set_new(o, "cause", json_string(ev->cause));
    if (ev->gpu >= 0)
        json_object_set_new(o, "gpu", json_integer(ev->gpu));
    if (ev->vram_mib > 0)
        json_object_set_new(o, "vram_mib", json_integer(ev->vram_mib));
    if (ev->batch_size > 0)
        json_object_set_new(o, "batch_size", json_integer(ev->batch_size));
    if (ev->deadline_ms > 0)
        json_object_set_new(o, "deadline_unix_ms",
                            json_integer(osubd_engine_to_unix(c, ev->deadline_ms)));
    json_object_set_new(o, "message", json_string(ev->msg));
    return o;
}

static void add_event(struct osubd_core *c, json_t *o)
{
    c->events = grow(c->events, &c->cap_events, c->n_events, sizeof(*c->events));
    char *text = must(json_dumps(o, JSON_COMPACT));
    int64_t seq = c->n_events > 0 ? c->events[c->n_events - 1].seq + 1 : 1;
    c->events[c->n_events++] = (struct fake_event){.seq = seq, .text = text};
    c->durable_event = seq;
}

/* The modules' records saved with the command (one transaction: all or none). */
static void save_modules(struct osubd_core *c)
{
    bool dirty = false;
    for (size_t i = 0; i < c->n_mods; i++)
        dirty = dirty || (c->mods[i].dirty != NULL && c->mods[i].dirty(c->mods[i].ctx));
    if (!dirty)
        return;
    json_t *m = json_object();
    for (size_t i = 0; i < c->n_mods; i++)
        if (c->mods[i].save != NULL)
            c->mods[i].save(c->mods[i].ctx, m);
    bool ok = !c->fail_saves;
    if (ok) {
        json_object_update(c->meta, m);
        c->n_saves++;
    }
    json_decref(m);
    for (size_t i = 0; i < c->n_mods; i++)
        if (c->mods[i].saved != NULL)
            c->mods[i].saved(c->mods[i].ctx, ok);
}

/* Records a command and its events (objs, consumed) as the real core logs them. */
static void log_command(struct osubd_core *c, const json_t *cmd, int rc, json_t **objs, size_t n)
{
    c->cmds = grow(c->cmds, &c->cap_cmds, c->n_cmds, sizeof(*c->cmds));
    char *text = must(json_dumps(cmd, JSON_COMPACT | JSON_SORT_KEYS));
    for (size_t i = 0; i < n; i++) {
        add_event(c, objs[i]);
        json_decref(objs[i]);
    }
    save_modules(c);
    uint64_t ticket = c->started ? ++c->applied : 0;
    c->cmds[c->n_cmds++] = (struct fake_core_cmd){
        .text = text, .rc = rc, .engine_ms = c->now_ms, .ticket = ticket, .n_events = n};
    if (!c->started && n > 0) { /* written at once: heard of at once */
        c->last_event = c->durable_event;
        struct osubd_progress p = {.durable = c->durable, .events = true};
        tell_durable(c, &p);
    }
}

static void forget_gone(struct osubd_core *c, const osub_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        osub_service_info_t si;
        if (ev[i].service[0] == '\0' || osub_engine_service_info(c->e, ev[i].service, &si) == 0)
            continue;
        for (size_t m = 0; m < c->n_mods; m++)
            if (c->mods[m].forget != NULL)
                c->mods[m].forget(c->mods[m].ctx, ev[i].service);
    }
}

static int apply_at(struct osubd_core *c, json_t *cmd, osub_submit_result_t *res, char *err,
                    size_t errlen, osubd_commit_fn commit, void *arg)
{
    bool dry = json_is_true(json_object_get(cmd, "dry_run"));
    err[0] = '\0';
    osub_submit_result_t local;
    if (res == NULL)
        res = &local;
    memset(res, 0, sizeof(*res));
    int rc = osubd__cmd_apply(c->e, cmd, c->now_ms, res, err, errlen);
    if (err[0] != '\0' || dry)
        return rc;
    if (commit != NULL)
        commit(arg, rc, res);
    c->version++;
    size_t n;
    const osub_event_t *ev = osub_engine_events(c->e, &n);
    json_t **objs = must(calloc(n ? n : 1, sizeof(*objs)));
    for (size_t i = 0; i < n; i++) {
        objs[i] = event_json(c, &ev[i]);
        int lvl = ev[i].level >= 0 && ev[i].level < 3 ? ev[i].level : 3;
        c->ev_counts[ev[i].kind][lvl]++;
    }
    forget_gone(c, ev, n);
    log_command(c, cmd, rc, objs, n);
    for (size_t m = 0; m < c->n_mods; m++)
        if (c->mods[m].events != NULL)
            c->mods[m].events(c->mods[m].ctx, ev, n);
    free(objs);
    return rc;
}

int osubd_apply(struct osubd_core *c, json_t *cmd, osub_submit_result_t *res, char *err,
                size_t errlen)
{
    return osubd_apply_with(c, cmd, res, err, errlen, NULL, NULL);
}

int osubd_apply_with(struct osubd_core *c, json_t *cmd, osub_submit_result_t *res, char *err,
                     size_t errlen, osubd_commit_fn commit, void *arg)
{
    bool dry = json_is_true(json_object_get(cmd, "dry_run"));
    const char *op = json_string_value(json_object_get(cmd, "op"));
    if (!dry && osub_engine_next_deadline(c->e) <= c->now_ms &&
        (op == NULL || strcmp(op, "tick") != 0)) {
        json_t *tick = must(json_pack("{s:s}", "op", "tick"));
        char terr[256];
        apply_at(c, tick, NULL, terr, sizeof(terr), NULL, NULL);
        json_decref(tick);
    }
    return apply_at(c, cmd, res, err, errlen, commit, arg);
}

static void vnote(struct osubd_core *c, enum osubd_log_level level, const char *id,
                  const char *kind, const char *reason, const char *fmt, va_list ap)
{
    c->notes = grow(c->notes, &c->cap_notes, c->n_notes, sizeof(*c->notes));
    struct fake_core_note *nt = &c->notes[c->n_notes++];
    snprintf(nt->id, sizeof(nt->id), "%s", id);
    snprintf(nt->kind, sizeof(nt->kind), "%s", kind);
    snprintf(nt->reason, sizeof(nt->reason), "%s", reason);
    nt->level = level;
    vsnprintf(nt->message, sizeof(nt->message), fmt, ap);
    osubd_log(level, "%s", nt->message);
    json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:s}", "time_unix_ms", (json_int_t)osubd_now(c),
                          "kind", kind, "reason", reason, "service", id, "message", nt->message);
    json_t *cmd = json_pack("{s:s, s:s, s:s}", "op", "note", "id", id, "kind", kind);
    must(o);
    must(cmd);
    log_command(c, cmd, 0, &o, 1);
    json_decref(cmd);
}

void osubd_note(struct osubd_core *c, const char *id, const char *kind, const char *reason,
                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnote(c, OSUBD_LOG_INFO, id, kind, reason, fmt, ap);
    va_end(ap);
}

void osubd_warn(struct osubd_core *c, const char *id, const char *kind, const char *reason,
                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnote(c, OSUBD_LOG_WARN, id, kind, reason, fmt, ap);
    va_end(ap);
}

void osubd_fatal(struct osubd_core *c, const char *what)
{
    osubd_log(OSUBD_LOG_ERROR, "%s: stopping (fake core)", what);
    c->fatal = true;
    event_base_loopbreak(c->base);
}

bool osubd_core_fatal(const struct osubd_core *c)
{
    return c->fatal;
}

void osubd_core_break(struct osubd_core *c)
{
    event_base_loopbreak(c->base);
}

/* ---- core.h: the clock, tokens, tickets ---------------------------------------------------- */

int64_t osubd_engine_now(const struct osubd_core *c)
{
    return c->now_ms;
}

int64_t osubd_now(const struct osubd_core *c)
{
    return FAKE_BASE_UNIX_MS + c->now_ms;
}

int64_t osubd_engine_to_unix(const struct osubd_core *c, int64_t engine_ms)
{
    (void)c;
    return engine_ms > 0 ? FAKE_BASE_UNIX_MS + engine_ms : 0;
}

void osubd_service_token(const struct osubd_core *c, const char *id, char out[65])
{
    osubd_state_token(c->key, id, out);
}

uint64_t osubd_core_applied(const struct osubd_core *c)
{
    return c->applied;
}

uint64_t osubd_core_durable(const struct osubd_core *c)
{
    return c->durable;
}

bool osubd_core_full(const struct osubd_core *c)
{
    return c->full;
}

uint64_t osubd_core_version(const struct osubd_core *c)
{
    return c->version;
}

void osubd_core_touch(struct osubd_core *c)
{
    c->version++;
}

int64_t osubd_core_last_event(const struct osubd_core *c)
{
    return c->last_event;
}

int osubd_core_events(struct osubd_core *c, int64_t since, int limit,
                      int (*cb)(void *arg, int64_t seq, const char *text), void *arg)
{
    int sent = 0;
    for (size_t i = 0; i < c->n_events && (limit < 0 || sent < limit); i++) { /* SQL's LIMIT */
        if (c->events[i].seq <= since || c->events[i].seq > c->last_event)
            continue;
        int rc = cb(arg, c->events[i].seq, c->events[i].text);
        if (rc != 0)
            return rc;
        sent++;
    }
    return 0;
}

void osubd_core_metrics(struct osubd_core *c, struct evbuffer *b)
{
    static const char *const lvl[] = {"online", "batch", "experiment", "none"};
    evbuffer_add_printf(b, "# TYPE oversub_decisions_total counter\n");
    for (int k = 0; k < OSUB_EV__COUNT; k++)
        for (int l = 0; l < 4; l++)
            evbuffer_add_printf(b, "oversub_decisions_total{kind=\"%s\",level=\"%s\"} %llu\n",
                                osub_event_name((osub_event_kind_t)k), lvl[l],
                                (unsigned long long)c->ev_counts[k][l]);
    evbuffer_add_printf(b, "oversub_store_disk_full %d\n", c->full ? 1 : 0);
    for (size_t i = 0; i < c->n_mods; i++)
        if (c->mods[i].metrics != NULL)
            c->mods[i].metrics(c->mods[i].ctx, b);
}
