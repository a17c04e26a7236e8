/* core.c - oversubd's core: commands applied to the engine and logged durably first, the
 * clock, the tickets, the registry of modules (core.h) */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "command.h"
#include "jsonmem.h"
#include "log.h"
#include "state.h"
#include "store.h"
#include "writer.h"

struct osubd_core {
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    osubd__store_t *store;
    struct osubd__writer *writer; /* NULL until start: commands are then written at once */
    struct event *writer_ev;
    struct event *tick_ev;
    int64_t tick_at; /* engine time of the next tick (INT64_MAX: none set) */
    struct osubd_module mods[OSUBD_MODULES_MAX];
    size_t n_mods;
    bool loaded;   /* the modules loaded: none registers after */
    bool started;  /* the writer ran: the state is whole, a last snapshot may be taken */
    int lock_fd;   /* STATE.lock, flock'ed while we run (-1: none) */
    int marker_fd; /* STATE.marker (-1: none) */
    char state_id[17];
    uint8_t service_key[32]; /* per-service tokens: HMAC-SHA256(key, id) */
    bool existing;           /* the state was not new at start */
    char pool[512];          /* the pool the state was made with */
    int64_t base_unix_ms;    /* engine time 0, on the wall clock (timestamps shown) */
    int64_t engine_start_ms; /* engine time when this run started ... */
    int64_t mono_start_ms;   /* ... and the monotonic clock then: engine time never jumps */
    int64_t last_engine_ms;
    int64_t since_snapshot;
    int64_t last_seq;
    int64_t last_event_seq;
    /* group commit: commands handed to the writer (applied) and on disk (durable) */
    uint64_t applied_ticket, durable_ticket;
    uint64_t commits, commit_items;
    uint64_t state_version; /* counts the commands applied */
    bool fatal;
    bool store_full; /* the state's disk is full: mutations refused (507) */
    uint64_t store_full_count;
    uint64_t ev_counts[OSUB_EV__COUNT][4]; /* by kind and level (3 = none) */
};

int64_t osubd_unix_ms(void);

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Engine time: the monotonic clock since start, from where the last run (or the wall clock,
 * when it is later) left it. A step of the wall clock (NTP, a VM resumed) moves nothing. */
int64_t osubd_engine_now(const struct osubd_core *c)
{
    int64_t now = c->engine_start_ms + (mono_ms() - c->mono_start_ms);
    return now < c->last_engine_ms ? c->last_engine_ms : now;
}

int64_t osubd_now(const struct osubd_core *c)
{
    return c->base_unix_ms + osubd_engine_now(c);
}

int64_t osubd_engine_to_unix(const struct osubd_core *c, int64_t engine_ms)
{
    return engine_ms > 0 ? c->base_unix_ms + engine_ms : 0;
}

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

static int snapshot_now(struct osubd_core *c)
{
    char *snap = osub_engine_save(c->e);
    if (snap == NULL)
        return -1;
    int rc = osubd__store_snapshot(c->store, snap, c->last_seq);
    free(snap);
    if (rc == 0) {
        c->since_snapshot = 0;
        osubd__store_trim_events(
            c->store, c->cfg->events_keep,
            c->cfg->events_days > 0 ? osubd_unix_ms() - c->cfg->events_days * 86400000LL : 0);
    }
    return rc;
}

/* The modules' records as the writer's meta object: key -> JSON text. */
static char *modules_meta(struct osubd_core *c)
{
    json_t *m = json_object();
    if (m == NULL)
        return NULL;
    for (size_t i = 0; i < c->n_mods; i++)
        if (c->mods[i].save != NULL)
            c->mods[i].save(c->mods[i].ctx, m);
    char *out = osubd_json_dumps(m, JSON_COMPACT);
    json_decref(m);
    return out;
}

static bool meta_dirty(const struct osubd_core *c)
{
    bool dirty = false;
    for (size_t i = 0; i < c->n_mods; i++)
        dirty = dirty || (c->mods[i].dirty != NULL && c->mods[i].dirty(c->mods[i].ctx));
    return dirty;
}

static void meta_saved(struct osubd_core *c, bool ok)
{
    for (size_t i = 0; i < c->n_mods; i++)
        if (c->mods[i].saved != NULL)
            c->mods[i].saved(c->mods[i].ctx, ok);
}

/* Every module hears that the log moved on disk. */
static void tell_durable(struct osubd_core *c, const struct osubd_progress *p)
{
    for (size_t i = 0; i < c->n_mods; i++)
        if (c->mods[i].durable != NULL)
            c->mods[i].durable(c->mods[i].ctx, p);
}

void osubd_meta_put(json_t *meta, const char *key, const json_t *value)
{
    char *text = osubd_json_dumps(value, JSON_COMPACT | JSON_SORT_KEYS);
    if (text != NULL)
        json_object_set_new(meta, key, json_string(text));
    free(text);
}

/* Logs a command and its events (objs, n, consumed) at engine time now: through the writer
 * (its replies then wait for the commit), or at once while there is no writer (start-up). */
static void log_command(struct osubd_core *c, int64_t now, const json_t *cmd, json_t **objs,
                        size_t n)
{
    char **texts = calloc(n ? n : 1, sizeof(*texts));
    char *ctext = osubd_json_dumps(cmd, JSON_COMPACT | JSON_SORT_KEYS);
    bool ok = texts != NULL && ctext != NULL;
    for (size_t i = 0; i < n && ok; i++) {
        texts[i] = osubd_json_dumps(objs[i], JSON_COMPACT);
        ok = texts[i] != NULL;
    }
    for (size_t i = 0; i < n; i++)
        json_decref(objs[i]);
    bool dirty = meta_dirty(c);
    if (c->writer != NULL) {
        char *snap = NULL;
        if (ok && ++c->since_snapshot >= c->cfg->snapshot_every) {
            snap = osub_engine_save(c->e);
            ok = snap != NULL;
            c->since_snapshot = 0;
        }
        char *meta = ok && dirty ? modules_meta(c) : NULL;
        if (!ok || (dirty && meta == NULL)) {
            osubd_fatal(c, "out of memory logging a command");
            for (size_t i = 0; texts != NULL && i < n; i++)
                free(texts[i]);
            free(texts);
            free(ctext);
            free(snap);
            free(meta);
            return;
        }
        meta_saved(c, true);
        c->applied_ticket =
            osubd__writer_add(c->writer, now, now + c->base_unix_ms, ctext, texts, n, snap, meta);
        return;
    }
    int64_t *seqs = calloc(n ? n : 1, sizeof(*seqs));
    ok = ok && seqs != NULL;
    if (ok && dirty) {
        char *meta = modules_meta(c);
        json_t *m = meta ? json_loads(meta, 0, NULL) : NULL;
        const char *k;
        json_t *v;
        ok = m != NULL;
        json_object_foreach(m, k, v) ok =
            ok && osubd__store_meta_set(c->store, k, json_string_value(v)) == 0;
        json_decref(m);
        free(meta);
        meta_saved(c, ok);
    }
    if (ok &&
        osubd__store_append_with_events(c->store, now, now + c->base_unix_ms, ctext,
                                        (const char *const *)texts, n, &c->last_seq, seqs) != 0)
        ok = false;
    if (!ok) {
        /* the engine moved and the disk did not: the state on disk is the truth */
        osubd_log(OSUBD_LOG_ERROR, "cannot write the state (%s): stopping",
                  osubd__store_error(c->store));
        c->fatal = true;
        event_base_loopbreak(c->base);
    } else {
        if (n > 0) {
            c->last_event_seq = seqs[n - 1];
            struct osubd_progress p = {.durable = c->durable_ticket, .events = true};
            tell_durable(c, &p);
        }
        if (++c->since_snapshot >= c->cfg->snapshot_every)
            snapshot_now(c);
    }
    for (size_t i = 0; i < n && texts; i++)
        free(texts[i]);
    free(texts);
    free(seqs);
    free(ctext);
}

static void schedule_tick(struct osubd_core *c);
static int apply_at(struct osubd_core *c, json_t *cmd, int64_t now, osub_submit_result_t *res,
                    char *err, size_t errlen, osubd_commit_fn commit, void *arg);

int osubd_apply(struct osubd_core *c, json_t *cmd, osub_submit_result_t *res, char *err,
                size_t errlen)
{
    return osubd_apply_with(c, cmd, res, err, errlen, NULL, NULL);
}

int osubd_apply_with(struct osubd_core *c, json_t *cmd, osub_submit_result_t *res, char *err,
                     size_t errlen, osubd_commit_fn commit, void *arg)
{
    int64_t now = osubd_engine_now(c);
    bool dry = json_is_true(json_object_get(cmd, "dry_run"));
    const char *op = json_string_value(json_object_get(cmd, "op"));
    /* timers due first, as a command of their own: the command is then checked against the
     * state at its time, and a refusal changes nothing (a dry run runs them on its copy) */
    if (!dry && c->e != NULL && osub_engine_next_deadline(c->e) <= now &&
        (op == NULL || strcmp(op, "tick") != 0)) {
        json_t *tick = json_pack("{s:s}", "op", "tick");
        char terr[256];
        if (tick != NULL)
            apply_at(c, tick, now, NULL, terr, sizeof(terr), NULL, NULL);
        json_decref(tick);
    }
    int rc = apply_at(c, cmd, now, res, err, errlen, commit, arg);
    if (c->tick_ev != NULL)
        schedule_tick(c);
    return rc;
}

/* The services gone from the engine with the command's events: each module forgets its
 * records (routes, PIDs, directives; the actuators stop their processes). */
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

static int apply_at(struct osubd_core *c, json_t *cmd, int64_t now, osub_submit_result_t *res,
                    char *err, size_t errlen, osubd_commit_fn commit, void *arg)
{
    bool dry = json_is_true(json_object_get(cmd, "dry_run"));
    err[0] = '\0';
    osub_submit_result_t local;
    if (res == NULL)
        res = &local;
    memset(res, 0, sizeof(*res));
    int rc = osubd__cmd_apply(c->e, cmd, now, res, err, errlen);
    if (err[0] != '\0' || dry)
        return rc;      /* malformed, or a dry run: nothing reached the engine's state */
    if (commit != NULL) /* the engine decided: what the caller staged is kept or dropped now,
                         * before the command is logged, so it is saved with it */
        commit(arg, rc, res);
    c->last_engine_ms = now;
    c->state_version++;
    /* log the command and its events before anyone hears of them */
    size_t n;
    const osub_event_t *ev = osub_engine_events(c->e, &n);
    json_t **objs = calloc(n ? n : 1, sizeof(*objs));
    osub_pool_info_t pi;
    osub_engine_pool_info(c->e, &pi);
    if (objs == NULL || pi.events_lost > 0) {
        free(objs);
        osubd_fatal(c, "out of memory recording a command's events");
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        objs[i] = event_json(c, &ev[i]);
        int lvl = ev[i].level >= 0 && ev[i].level < 3 ? ev[i].level : 3;
        c->ev_counts[ev[i].kind][lvl]++;
    }
    osubd_log(OSUBD_LOG_DEBUG, "command %s: %s, %zu event(s)",
              json_string_value(json_object_get(cmd, "op")), osub_strerror(rc), n);
    forget_gone(c, ev, n);
    log_command(c, now, cmd, objs, n);
    for (size_t m = 0; m < c->n_mods; m++) /* acted on once the command is durable */
        if (c->mods[m].events != NULL)
            c->mods[m].events(c->mods[m].ctx, ev, n);
    free(objs);
    return rc;
}

void osubd_fatal(struct osubd_core *c, const char *what)
{
    osubd_log(OSUBD_LOG_ERROR,
              "%s: stopping (the state on disk is the truth: a restart replays it and "
              "repeats what services were told)",
              what);
    c->fatal = true;
    if (c->base != NULL)
        event_base_loopbreak(c->base);
}

static void vnote(struct osubd_core *c, enum osubd_log_level level, const char *id,
                  const char *kind, const char *reason, const char *fmt, va_list ap)
{
    char msg[OSUB_EVENT_MSG_MAX + 200];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    osubd_log(level, "%s", msg);
    int64_t now = osubd_engine_now(c);
    json_t *o =
        json_pack("{s:I, s:s, s:s, s:s, s:s}", "time_unix_ms", (json_int_t)(now + c->base_unix_ms),
                  "kind", kind, "reason", reason, "service", id, "message", msg);
    json_t *cmd = json_pack("{s:s, s:s, s:s}", "op", "note", "id", id, "kind", kind);
    if (o == NULL || cmd == NULL) {
        json_decref(o);
        json_decref(cmd);
        return;
    }
    log_command(c, now, cmd, &o, 1);
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

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_core *c = arg;
    c->tick_at = INT64_MAX;
    json_t *cmd = json_pack("{s:s}", "op", "tick");
    char err[256];
    if (cmd != NULL)
        osubd_apply(c, cmd, NULL, err, sizeof(err));
    json_decref(cmd);
    schedule_tick(c); /* also when the tick could not be made */
}

/* The next tick: at the engine's next deadline (an acknowledgement, a grace period, a loading
 * period ends), and at most tick_ms away (the passes: pressure, restores, the queue). */
static void schedule_tick(struct osubd_core *c)
{
    int64_t now = osubd_engine_now(c);
    int64_t at = now + c->cfg->tick_ms;
    int64_t dl = osub_engine_next_deadline(c->e);
    if (dl < at)
        at = dl < now ? now : dl;
    if (at >= c->tick_at && evtimer_pending(c->tick_ev, NULL))
        return; /* an earlier wake-up is set */
    c->tick_at = at;
    int64_t wait = at - now;
    struct timeval tv = {(time_t)(wait / 1000), (suseconds_t)(wait % 1000) * 1000};
    evtimer_add(c->tick_ev, &tv);
}

/* While stopping gracefully: done when the gateway has no connection left, or the grace ended. */
static void on_writer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_core *c = arg;
    struct osubd__writer_progress p;
    char err[600];
    if (osubd__writer_progress(c->writer, &p, err, sizeof(err)) != 0) {
        /* the engine moved and the disk did not: the state on disk is the truth */
        osubd_log(OSUBD_LOG_ERROR, "cannot write the state (%s): stopping", err);
        c->fatal = true;
        event_base_loopbreak(c->base);
        return;
    }
    if (p.full && !c->store_full) {
        osubd_log(OSUBD_LOG_WARN,
                  "the state's disk is full (%s): changes through the API are refused "
                  "with 507 until space returns; reads, the gateway and the services go on; what "
                  "the engine did meanwhile waits in memory and is written then (a restart before "
                  "that loses it)",
                  err);
        c->store_full = true;
        c->store_full_count++;
        struct osubd_progress fp = {.durable = c->durable_ticket, .full = true};
        tell_durable(c, &fp); /* before the tickets move: what is held goes out as such */
    } else if (!p.full && c->store_full) {
        osubd_log(OSUBD_LOG_INFO, "the state's disk has room again: everything waiting is written "
                                  "and changes are accepted");
        c->store_full = false;
    }
    c->durable_ticket = p.durable;
    c->last_seq = p.last_log_seq;
    c->commits = p.commits;
    c->commit_items = p.items;
    struct osubd_progress dp = {
        .durable = p.durable, .commit = true, .events = p.last_event_seq > c->last_event_seq};
    if (dp.events)
        c->last_event_seq = p.last_event_seq;
    tell_durable(c, &dp); /* replies, directives and signals waited for this commit */
}

/* Engine time runs on the monotonic clock from here, from where the last run left it (or the
 * wall clock since the state was made, when that is later: time passed while we were down). */
static void start_clock(struct osubd_core *c)
{
    c->engine_start_ms = osubd_unix_ms() - c->base_unix_ms;
    if (c->engine_start_ms < c->last_engine_ms)
        c->engine_start_ms = c->last_engine_ms;
    c->mono_start_ms = mono_ms();
}

struct osubd_core *osubd_core_new(const struct osubd_config *cfg)
{
    struct osubd_core *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->cfg = cfg;
    c->lock_fd = -1;
    c->marker_fd = -1;
    c->tick_at = INT64_MAX;
    /* epoll's changelist folds the add/delete pairs evhttp makes per request into one
     * epoll_ctl at most (measured on the gateway: see docs/performance.md) */
    struct event_config *ecfg = event_config_new();
    if (ecfg != NULL)
        event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    c->base = ecfg ? event_base_new_with_config(ecfg) : NULL;
    if (ecfg != NULL)
        event_config_free(ecfg);
    if (c->base == NULL)
        c->base = event_base_new();
    if (c->base == NULL) {
        free(c);
        return NULL;
    }
    return c;
}

static int make_dir(const char *state_path, char *err, size_t errlen)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", state_path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL) {
        *slash = '\0';
        if (dir[0] != '\0' && mkdir(dir, 0700) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "%s: %s", dir, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* A new state: the engine on the machine's pool, its settings and base time kept. */
static int new_state(struct osubd_core *c, const struct osubd_pool *pool, char *err, size_t errlen)
{
    const char *path = c->cfg->state_path;
    c->base_unix_ms = osubd_unix_ms();
    char b[32];
    snprintf(b, sizeof(b), "%lld", (long long)c->base_unix_ms);
    osub_pool_config_t cfg = c->cfg->engine;
    cfg.ratio_milli = c->cfg->ratio_milli;
    if (pool->nvml)
        cfg.margin_mib = 1024; /* DESIGN.md: the driver's own memory under NVML */
    if (c->cfg->suspend_host_auto) {
        /* DESIGN.md: under NVML half of the host's memory; a simulated pool: suspend off */
        long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        cfg.suspend_host_mib =
            pool->nvml && pages > 0 && size > 0 ? (int64_t)pages / 2 * size / (1 << 20) : 0;
    }
    if (osubd__store_meta_set(c->store, "engine_config", osubd_state_engine_text(&cfg)) != 0) {
        snprintf(err, errlen, "%s: %s", path, osubd__store_error(c->store));
        return -1;
    }
    const char *np[OSUB_POOL_GPUS_MAX];
    for (size_t i = 0; i < pool->n; i++)
        np[i] = pool->names[i][0] ? pool->names[i] : NULL;
    int rc = osub_engine_new(&cfg, pool->vram, np, pool->n, NULL, 0, &c->e);
    if (rc != 0) {
        snprintf(err, errlen, "pool: %s", osub_strerror(rc));
        return -1;
    }
    start_clock(c);
    snprintf(c->pool, sizeof(c->pool), "%s", pool->nvml ? "nvml" : c->cfg->gpus);
    if (osubd__store_meta_set(c->store, "base_unix_ms", b) != 0 ||
        osubd__store_meta_set(c->store, "pool", c->pool) != 0) {
        snprintf(err, errlen, "%s: %s", path, osubd__store_error(c->store));
        return -1;
    }
    osubd_log(OSUBD_LOG_INFO, "new state in %s; GPUs: %s", path, pool->desc);
    return 0;
}

/* The engine's suspend settings are the state's, fixed when it was made: a configuration that
 * asks for others is told so at start rather than ignored in silence. */
static void warn_fixed_suspend(const struct osubd_core *c)
{
    osub_pool_config_t st, def;
    osub_engine_config(c->e, &st);
    osub_pool_config_default(&def);
    const osub_pool_config_t *want = &c->cfg->engine;
    const struct {
        const char *key;
        int64_t asked, kept, dflt;
        bool given;
    } k[] = {
        {"suspend_host_mib", want->suspend_host_mib, st.suspend_host_mib, 0,
         !c->cfg->suspend_host_auto},
        {"suspend_mib_per_s", want->suspend_mib_per_s, st.suspend_mib_per_s, def.suspend_mib_per_s,
         true},
        {"suspend_timeout_ms", want->suspend_timeout_ms, st.suspend_timeout_ms,
         def.suspend_timeout_ms, true},
        {"suspend_min_runtime_ms", want->suspend_min_runtime_ms, st.suspend_min_runtime_ms,
         def.suspend_min_runtime_ms, true},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++)
        if (k[i].given && k[i].asked != k[i].kept && (k[i].asked != k[i].dflt || i == 0))
            osubd_log(OSUBD_LOG_WARN,
                      "%s: %lld in the configuration, but this state was made with %lld, which "
                      "it keeps (the engine's settings are fixed when a state is made: give "
                      "another --state to change it)",
                      k[i].key, (long long)k[i].asked, (long long)k[i].kept);
}

/* An existing state: the engine from its snapshot (or made as the state was made), then the
 * log after it replayed. */
static int restore(struct osubd_core *c, const char *base, const char *snap, int64_t upto,
                   osubd_pool_fn pool_fn, void *pool_arg, char *err, size_t errlen)
{
    const char *path = c->cfg->state_path;
    char *bend = NULL;
    errno = 0;
    c->base_unix_ms = strtoll(base, &bend, 10);
    if (errno != 0 || bend == base || *bend != '\0' || c->base_unix_ms <= 0) {
        snprintf(err, errlen, "%s: the state's base time is damaged ('%.40s')", path, base);
        return -1;
    }
    if (c->pool[0] == '\0') {
        snprintf(err, errlen, "%s: the state has no pool recorded (its meta table is damaged)",
                 path);
        return -1;
    }
    if (snap != NULL) {
        size_t line = 0;
        int rc = osub_engine_load(snap, &c->e, &line);
        if (rc != 0) {
            snprintf(err, errlen, "%s: the saved engine state is corrupt (line %zu): %s", path,
                     line, osub_strerror(rc));
            return -1;
        }
    } else {
        /* no snapshot yet: the log replays on the engine as it was made */
        osub_pool_config_t cfg;
        struct osubd_pool *pool = calloc(1, sizeof(*pool));
        if (pool == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        int rc = pool_fn(pool_arg, c->pool, pool, err, errlen);
        if (rc == 0)
            rc = osubd_state_engine_config(c->store, path, c->cfg->ratio_milli,
                                           strcmp(c->pool, "nvml") == 0, &cfg, err, errlen);
        const char *np[OSUB_POOL_GPUS_MAX];
        for (size_t i = 0; rc == 0 && i < pool->n; i++)
            np[i] = pool->names[i][0] ? pool->names[i] : NULL;
        if (rc == 0 && osub_engine_new(&cfg, pool->vram, np, pool->n, NULL, 0, &c->e) != 0) {
            snprintf(err, errlen, "%s: the saved pool '%s' is invalid", path, c->pool);
            rc = -1;
        }
        free(pool);
        if (rc != 0)
            return -1;
    }
    struct osubd_replayed r;
    char rerr[400];
    if (osubd_state_replay(c->store, c->e, upto, &r, rerr, sizeof(rerr)) != 0) {
        snprintf(err, errlen, "%s: %s", path, rerr);
        return -1;
    }
    c->last_engine_ms = r.last_ms;
    c->last_seq = r.last_seq;
    start_clock(c);
    osub_pool_info_t pi;
    osub_engine_pool_info(c->e, &pi);
    osubd_log(OSUBD_LOG_INFO,
              "restored %s: %d services, %d queued, replayed %lld command(s) after the snapshot",
              path, pi.n_services, pi.n_queued, (long long)r.n);
    if (strcmp(c->cfg->gpus, "nvml") == 0 && strcmp(c->pool, "nvml") != 0) {
        /* asked for real GPUs, but the state's services were placed on another pool */
        snprintf(err, errlen,
                 "%s was made with --gpus %s, a simulated pool; --gpus nvml needs a state of "
                 "its own (give another --state)",
                 path, c->pool);
        return -1;
    }
    if (strcmp(c->pool, c->cfg->gpus) != 0)
        osubd_log(strcmp(c->cfg->gpus, "auto") == 0 ? OSUBD_LOG_INFO : OSUBD_LOG_WARN,
                  "the state was made with --gpus %s; it keeps that pool (--gpus %s is "
                  "ignored)",
                  c->pool, c->cfg->gpus);
    warn_fixed_suspend(c);
    return 0;
}

int osubd_core_open(struct osubd_core *c, osubd_pool_fn pool_fn, void *pool_arg, char *err,
                    size_t errlen)
{
    const char *path = c->cfg->state_path;
    char e2[600];
    /* one oversubd per state: a lock file beside it, held while we run */
    if (make_dir(path, err, errlen) != 0 || osubd_state_lock(path, &c->lock_fd, err, errlen) != 0)
        return -1;
    if (osubd__store_open(path, &c->store, e2, sizeof(e2)) != 0) {
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    /* an existing state (it has a base time) must have all it was made with */
    char *base = NULL, *pool = NULL, *snap = NULL;
    if (osubd_state_meta(c->store, path, "base_unix_ms", &base, err, errlen) != 0)
        return -1;
    c->existing = base != NULL;
    int rc = osubd_state_marker(path, c->cfg->new_state, c->existing, true, NULL, 0, NULL, NULL,
                                err, errlen);
    if (rc == 0)
        rc = osubd_state_key(c->store, path, c->existing, c->service_key, err, errlen);
    if (rc == 0)
        rc = osubd_state_meta(c->store, path, "pool", &pool, err, errlen);
    if (rc == 0 && pool != NULL)
        snprintf(c->pool, sizeof(c->pool), "%s", pool);
    int64_t upto = 0;
    if (rc == 0 && osubd__store_load_snapshot(c->store, &snap, &upto) != 0) {
        snprintf(err, errlen, "%s: %s", path, osubd__store_error(c->store));
        rc = -1;
    }
    if (rc == 0 && base == NULL) {
        struct osubd_pool *p = calloc(1, sizeof(*p));
        rc = p == NULL ? -1 : pool_fn(pool_arg, c->cfg->gpus, p, err, errlen);
        if (p == NULL)
            snprintf(err, errlen, "out of memory");
        if (rc == 0)
            rc = new_state(c, p, err, errlen);
        free(p);
    } else if (rc == 0) {
        rc = restore(c, base, snap, upto, pool_fn, pool_arg, err, errlen);
    }
    free(base);
    free(pool);
    free(snap);
    if (rc != 0)
        return -1;
    int64_t last_ev;
    osubd__store_last_event(c->store, &last_ev);
    c->last_event_seq = last_ev;
    return 0;
}

int osubd_core_register(struct osubd_core *c, const struct osubd_module *m)
{
    assert(!c->loaded); /* core.h: modules register before they load */
    if (c->loaded || c->n_mods >= OSUBD_MODULES_MAX)
        return -1; /* a late module would never load: refused in a release build too */
    c->mods[c->n_mods++] = *m;
    return 0;
}

int osubd_core_load(struct osubd_core *c, char *err, size_t errlen)
{
    assert(c->e != NULL); /* after osubd_core_open */
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
    assert(c->loaded);
    if (osubd_state_marker(c->cfg->state_path, c->cfg->new_state, c->existing, false,
                           c->service_key, c->last_seq, &c->marker_fd, c->state_id, err,
                           errlen) != 0)
        return -1;
    if (osubd__writer_start(c->cfg->state_path, c->last_seq, c->cfg->events_keep,
                            c->cfg->events_days, &c->writer, err, errlen) != 0)
        return -1;
    osubd__writer_set_marker(c->writer, c->marker_fd, c->state_id, osubd_marker_write);
    c->writer_ev =
        event_new(c->base, osubd__writer_fd(c->writer), EV_READ | EV_PERSIST, on_writer, c);
    if (c->writer_ev == NULL || event_add(c->writer_ev, NULL) != 0) {
        snprintf(err, errlen, "cannot watch the writer");
        return -1;
    }
    c->tick_ev = evtimer_new(c->base, on_tick, c);
    c->tick_at = INT64_MAX;
    if (c->tick_ev == NULL) {
        snprintf(err, errlen, "cannot set up the event loop");
        return -1;
    }
    schedule_tick(c);
    c->started = true;
    return 0;
}

void osubd_core_stop(struct osubd_core *c)
{
    /* before the writer closes its pipe: an event left on a closed descriptor makes libevent
     * warn (and, with a start that failed early, its addition was never applied) */
    if (c->writer_ev) {
        event_free(c->writer_ev);
        c->writer_ev = NULL;
    }
    if (c->writer != NULL) {
        struct osubd__writer_progress p;
        if (osubd__writer_stop(c->writer, &p) != 0)
            c->fatal = true;
        c->writer = NULL;
        c->last_seq = p.last_log_seq;
        if (!c->fatal) {
            /* everything handed over is durable now: the replies held for it go out before
             * the connections close (new commands from here on commit directly) */
            c->durable_ticket = p.durable;
            struct osubd_progress dp = {.durable = p.durable};
            tell_durable(c, &dp);
            for (int i = 0; i < 20; i++)
                event_base_loop(c->base, EVLOOP_NONBLOCK);
        }
    }
    if (c->tick_ev) {
        event_free(c->tick_ev);
        c->tick_ev = NULL;
    }
}

void osubd_core_free(struct osubd_core *c)
{
    if (c == NULL)
        return;
    assert(c->writer == NULL); /* core.h: stop before free */
    /* only a state that started whole: a start refused halfway (a replay that failed, a marker
     * that disagrees) leaves the state on disk exactly as it found it */
    if (c->started && c->store != NULL && c->e != NULL && !c->fatal)
        snapshot_now(c);
    if (c->base)
        event_base_free(c->base);
    osub_engine_free(c->e);
    osubd__store_close(c->store);
    if (c->marker_fd >= 0)
        close(c->marker_fd);
    if (c->lock_fd >= 0)
        close(c->lock_fd); /* the lock goes with it */
    free(c);
}

/* ---- what the modules read ------------------------------------------------------------- */

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
    return osubd_state_meta(c->store, c->cfg->state_path, key, text, err, errlen);
}

int osubd_core_meta_set(struct osubd_core *c, const char *key, const char *text, char *err,
                        size_t errlen)
{
    assert(c->writer == NULL); /* core.h: while starting */
    if (osubd__store_meta_set(c->store, key, text) != 0) {
        snprintf(err, errlen, "%s: %s", c->cfg->state_path, osubd__store_error(c->store));
        return -1;
    }
    return 0;
}

bool osubd_core_fatal(const struct osubd_core *c)
{
    return c->fatal;
}

void osubd_core_break(struct osubd_core *c)
{
    event_base_loopbreak(c->base);
}

void osubd_service_token(const struct osubd_core *c, const char *id, char out[65])
{
    osubd_state_token(c->service_key, id, out);
}

uint64_t osubd_core_applied(const struct osubd_core *c)
{
    return c->applied_ticket;
}

uint64_t osubd_core_durable(const struct osubd_core *c)
{
    return c->durable_ticket;
}

bool osubd_core_full(const struct osubd_core *c)
{
    return c->store_full;
}

uint64_t osubd_core_version(const struct osubd_core *c)
{
    return c->state_version;
}

void osubd_core_touch(struct osubd_core *c)
{
    c->state_version++;
}

int64_t osubd_core_last_event(const struct osubd_core *c)
{
    return c->last_event_seq;
}

int osubd_core_events(struct osubd_core *c, int64_t since, int limit,
                      int (*cb)(void *arg, int64_t seq, const char *text), void *arg)
{
    return osubd__store_events(c->store, since, limit, cb, arg);
}

void osubd_core_metrics(struct osubd_core *c, struct evbuffer *b)
{
    static const char *const lvl[] = {"online", "batch", "experiment", "none"};
    evbuffer_add_printf(b, "# HELP oversub_decisions_total Decisions and events by kind and the "
                           "level of the service.\n# TYPE oversub_decisions_total counter\n");
    for (int k = 0; k < OSUB_EV__COUNT; k++)
        for (int l = 0; l < 4; l++)
            evbuffer_add_printf(b, "oversub_decisions_total{kind=\"%s\",level=\"%s\"} %llu\n",
                                osub_event_name((osub_event_kind_t)k), lvl[l],
                                (unsigned long long)c->ev_counts[k][l]);
    evbuffer_add_printf(b,
                        "# HELP oversub_store_disk_full 1 while the state's disk is full (changes "
                        "refused).\n"
                        "# TYPE oversub_store_disk_full gauge\n"
                        "oversub_store_disk_full %d\n"
                        "# HELP oversub_store_commits_total Durable transactions of the writer.\n"
                        "# TYPE oversub_store_commits_total counter\n"
                        "oversub_store_commits_total %llu\n"
                        "# HELP oversub_store_commands_total Commands made durable (commands per "
                        "commit: the grouping).\n"
                        "# TYPE oversub_store_commands_total counter\n"
                        "oversub_store_commands_total %llu\n",
                        c->store_full ? 1 : 0, (unsigned long long)c->commits,
                        (unsigned long long)c->commit_items);
    for (size_t i = 0; i < c->n_mods; i++)
        if (c->mods[i].metrics != NULL)
            c->mods[i].metrics(c->mods[i].ctx, b);
}
