/* daemon.c - oversubd's core: the engine driven by commands that are logged durably first */
#define _POSIX_C_SOURCE 200809L
#include "daemon.h"
#include "log.h"
#include "pods.h"
#include "jsonmem.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <stdarg.h>
#include <sys/random.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "actuator.h"
#include "command.h"
#include "nvml.h"
#include "sha256.h"
#include "conns.h"
#include "gateway.h"
#include "notify.h"
#include "netpolicy.h"
#include "writer.h"
#include "oversub/units.h"

void osubd_config_default(struct osubd_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->listen_host, sizeof(c->listen_host), "127.0.0.1");
    c->listen_port = 7070;
    snprintf(c->socket_path, sizeof(c->socket_path), "var/oversub.sock");
    snprintf(c->state_path, sizeof(c->state_path), "var/oversub.db");
    snprintf(c->gpus, sizeof(c->gpus), "auto");
    snprintf(c->kube_api, sizeof(c->kube_api), "auto");
    const char *node = getenv("NODE_NAME"); /* the DaemonSet's, from the downward API */
    if (node != NULL && strlen(node) < sizeof(c->kube_node))
        snprintf(c->kube_node, sizeof(c->kube_node), "%s", node);
    c->ratio_milli = 1300;
    c->tick_ms = 1000;
    c->snapshot_every = 1000;
    c->events_keep = 100000;
    c->poll_ms = 1000;
    c->service_log_max = 10 * 1024 * 1024;
    c->shutdown_grace_ms = 30000;
    c->api_conns_per_client = 64;
    c->api_conns_max = 1024;
    osub_pool_config_default(&c->engine);
}

int64_t osubd_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Engine time: the monotonic clock since start, from where the last run (or the wall clock,
 * when it is later) left it. A step of the wall clock (NTP, a VM resumed) moves nothing. */
int64_t osubd_engine_now(const struct osubd *d)
{
    int64_t now = d->engine_start_ms + (mono_ms() - d->mono_start_ms);
    return now < d->last_engine_ms ? d->last_engine_ms : now;
}

int64_t osubd_now(const struct osubd *d)
{
    return d->base_unix_ms + osubd_engine_now(d);
}

int64_t osubd_engine_to_unix(const struct osubd *d, int64_t engine_ms)
{
    return engine_ms > 0 ? d->base_unix_ms + engine_ms : 0;
}

static json_t *event_json(const struct osubd *d, const osub_event_t *ev)
{
    json_t *o = json_object();
    json_object_set_new(o, "time_unix_ms", json_integer(osubd_engine_to_unix(d, ev->time_ms)));
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
                            json_integer(osubd_engine_to_unix(d, ev->deadline_ms)));
    json_object_set_new(o, "message", json_string(ev->msg));
    return o;
}

static int snapshot_now(struct osubd *d)
{
    char *snap = osub_engine_save(d->e);
    if (snap == NULL)
        return -1;
    int rc = osubd__store_snapshot(d->store, snap, d->last_seq);
    free(snap);
    if (rc == 0) {
        d->since_snapshot = 0;
        osubd__store_trim_events(
            d->store, d->cfg.events_keep,
            d->cfg.events_days > 0 ? osubd_unix_ms() - d->cfg.events_days * 86400000LL : 0);
    }
    return rc;
}

/* The daemon's own maps (service PIDs, gateway routes, the actuators') as the writer's meta
 * object: key -> JSON text. */
static char *daemon_meta(struct osubd *d)
{
    json_t *m = json_object();
    char *routes = osubd_routes_save(d->routes);
    if (routes == NULL) {
        json_decref(m);
        return NULL;
    }
    json_object_set_new(m, "gateway_routes", json_string(routes));
    free(routes);
    osubd_act_meta(d, m);
    char *out = osubd_json_dumps(m, JSON_COMPACT);
    json_decref(m);
    return out;
}

static bool meta_dirty(const struct osubd *d)
{
    return osubd_routes_dirty(d->routes) || osubd_act_dirty(d);
}

static void meta_saved(struct osubd *d, bool ok)
{
    osubd_routes_saved(d->routes, ok);
    osubd_act_saved(d, ok);
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
static void log_command(struct osubd *d, int64_t now, const json_t *cmd, json_t **objs, size_t n)
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
    bool dirty = meta_dirty(d);
    if (d->writer != NULL) {
        char *snap = NULL;
        if (ok && ++d->since_snapshot >= d->cfg.snapshot_every) {
            snap = osub_engine_save(d->e);
            ok = snap != NULL;
            d->since_snapshot = 0;
        }
        char *meta = ok && dirty ? daemon_meta(d) : NULL;
        if (!ok || (dirty && meta == NULL)) {
            osubd_fatal(d, "out of memory logging a command");
            for (size_t i = 0; texts != NULL && i < n; i++)
                free(texts[i]);
            free(texts);
            free(ctext);
            free(snap);
            free(meta);
            return;
        }
        meta_saved(d, true);
        d->applied_ticket =
            osubd__writer_add(d->writer, now, now + d->base_unix_ms, ctext, texts, n, snap, meta);
        return;
    }
    int64_t *seqs = calloc(n ? n : 1, sizeof(*seqs));
    ok = ok && seqs != NULL;
    if (ok && dirty) {
        char *meta = daemon_meta(d);
        json_t *m = meta ? json_loads(meta, 0, NULL) : NULL;
        const char *k;
        json_t *v;
        ok = m != NULL;
        json_object_foreach(m, k, v) ok =
            ok && osubd__store_meta_set(d->store, k, json_string_value(v)) == 0;
        json_decref(m);
        free(meta);
        meta_saved(d, ok);
    }
    if (ok && osubd__store_append_with_events(d->store, now, now + d->base_unix_ms, ctext,
                                            (const char *const *)texts, n, &d->last_seq, seqs) != 0)
        ok = false;
    if (!ok) {
        /* the engine moved and the disk did not: the state on disk is the truth */
        osubd_log(OSUBD_LOG_ERROR, "cannot write the state (%s): stopping",
                osubd__store_error(d->store));
        d->fatal = true;
        event_base_loopbreak(d->base);
    } else {
        if (n > 0) {
            d->last_event_seq = seqs[n - 1];
            osubd_api_events_ready(d);
        }
        if (++d->since_snapshot >= d->cfg.snapshot_every)
            snapshot_now(d);
    }
    for (size_t i = 0; i < n && texts; i++)
        free(texts[i]);
    free(texts);
    free(seqs);
    free(ctext);
}

static void schedule_tick(struct osubd *d);
static int apply_at(struct osubd *d, json_t *cmd, int64_t now, osub_submit_result_t *res, char *err,
                    size_t errlen, osubd_commit_fn commit, void *arg);

int osubd_apply(struct osubd *d, json_t *cmd, osub_submit_result_t *res, char *err, size_t errlen)
{
    return osubd_apply_with(d, cmd, res, err, errlen, NULL, NULL);
}

int osubd_apply_with(struct osubd *d, json_t *cmd, osub_submit_result_t *res, char *err,
                     size_t errlen, osubd_commit_fn commit, void *arg)
{
    int64_t now = osubd_engine_now(d);
    bool dry = json_is_true(json_object_get(cmd, "dry_run"));
    const char *op = json_string_value(json_object_get(cmd, "op"));
    /* timers due first, as a command of their own: the command is then checked against the
     * state at its time, and a refusal changes nothing (a dry run runs them on its copy) */
    if (!dry && d->e != NULL && osub_engine_next_deadline(d->e) <= now &&
        (op == NULL || strcmp(op, "tick") != 0)) {
        json_t *tick = json_pack("{s:s}", "op", "tick");
        char terr[256];
        if (tick != NULL)
            apply_at(d, tick, now, NULL, terr, sizeof(terr), NULL, NULL);
        json_decref(tick);
    }
    int rc = apply_at(d, cmd, now, res, err, errlen, commit, arg);
    if (d->tick_ev != NULL)
        schedule_tick(d);
    return rc;
}

/* The services gone from the engine with the command's events: each module forgets its
 * record (their routes, PIDs, directives; processes are stopped by the actuators). */
static void forget_gone(struct osubd *d, const osub_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        osub_service_info_t si;
        if (ev[i].service[0] == '\0' || osub_engine_service_info(d->e, ev[i].service, &si) == 0)
            continue;
        osubd_routes_forget(d->routes, ev[i].service);
        osubd_act_forget(d, ev[i].service);
    }
}

static int apply_at(struct osubd *d, json_t *cmd, int64_t now, osub_submit_result_t *res, char *err,
                    size_t errlen, osubd_commit_fn commit, void *arg)
{
    bool dry = json_is_true(json_object_get(cmd, "dry_run"));
    err[0] = '\0';
    osub_submit_result_t local;
    if (res == NULL)
        res = &local;
    memset(res, 0, sizeof(*res));
    int rc = osubd__cmd_apply(d->e, cmd, now, res, err, errlen);
    if (err[0] != '\0' || dry)
        return rc;      /* malformed, or a dry run: nothing reached the engine's state */
    if (commit != NULL) /* the engine decided: what the caller staged is kept or dropped now,
                         * before the command is logged, so it is saved with it */
        commit(d, rc, res, arg);
    d->last_engine_ms = now;
    d->state_version++;
    /* log the command and its events before anyone hears of them */
    size_t n;
    const osub_event_t *ev = osub_engine_events(d->e, &n);
    json_t **objs = calloc(n ? n : 1, sizeof(*objs));
    osub_pool_info_t pi;
    osub_engine_pool_info(d->e, &pi);
    if (objs == NULL || pi.events_lost > 0) {
        free(objs);
        osubd_fatal(d, "out of memory recording a command's events");
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        objs[i] = event_json(d, &ev[i]);
        int lvl = ev[i].level >= 0 && ev[i].level < 3 ? ev[i].level : 3;
        d->ev_counts[ev[i].kind][lvl]++;
    }
    forget_gone(d, ev, n);
    log_command(d, now, cmd, objs, n);
    osubd_act_events(d, ev, n); /* acted on once the command is durable */
    free(objs);
    return rc;
}

void osubd_fatal(struct osubd *d, const char *what)
{
    osubd_log(OSUBD_LOG_ERROR, "%s: stopping (the state on disk is the truth: a restart replays it and "
            "repeats what services were told)",
            what);
    d->fatal = true;
    if (d->base != NULL)
        event_base_loopbreak(d->base);
}

void osubd_note(struct osubd *d, const char *id, const char *kind, const char *reason,
                const char *fmt, ...)
{
    char msg[OSUB_EVENT_MSG_MAX + 200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    osubd_log(OSUBD_LOG_INFO, "%s", msg);
    int64_t now = osubd_engine_now(d);
    json_t *o =
        json_pack("{s:I, s:s, s:s, s:s, s:s}", "time_unix_ms", (json_int_t)(now + d->base_unix_ms),
                  "kind", kind, "reason", reason, "service", id, "message", msg);
    json_t *cmd = json_pack("{s:s, s:s, s:s}", "op", "note", "id", id, "kind", kind);
    if (o == NULL || cmd == NULL) {
        json_decref(o);
        json_decref(cmd);
        return;
    }
    log_command(d, now, cmd, &o, 1);
    json_decref(cmd);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd *d = arg;
    d->tick_at = INT64_MAX;
    json_t *cmd = json_pack("{s:s}", "op", "tick");
    char err[256];
    if (cmd != NULL)
        osubd_apply(d, cmd, NULL, err, sizeof(err));
    json_decref(cmd);
    schedule_tick(d); /* also when the tick could not be made */
}

/* The next tick: at the engine's next deadline (an acknowledgement, a grace period, a loading
 * period ends), and at most tick_ms away (the passes: pressure, restores, the queue). */
static void schedule_tick(struct osubd *d)
{
    int64_t now = osubd_engine_now(d);
    int64_t at = now + d->cfg.tick_ms;
    int64_t dl = osub_engine_next_deadline(d->e);
    if (dl < at)
        at = dl < now ? now : dl;
    if (at >= d->tick_at && evtimer_pending(d->tick_ev, NULL))
        return; /* an earlier wake-up is set */
    d->tick_at = at;
    int64_t wait = at - now;
    struct timeval tv = {(time_t)(wait / 1000), (suseconds_t)(wait % 1000) * 1000};
    evtimer_add(d->tick_ev, &tv);
}

/* While stopping gracefully: done when the gateway has no connection left, or the grace ended. */
static void on_drain(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd *d = arg;
    int open = osubd_gateway_open_clients(d);
    if (open == 0) {
        osubd_log(OSUBD_LOG_INFO, "the gateway drained: stopping");
        event_base_loopbreak(d->base);
    } else if (osubd_engine_now(d) >= d->drain_until_ms) {
        osubd_log(OSUBD_LOG_INFO, "the grace period (%lld ms) ended with %d gateway connection(s) still "
                "open: stopping",
                (long long)d->cfg.shutdown_grace_ms, open);
        event_base_loopbreak(d->base);
    }
}

/* SIGTERM, SIGINT: the gateway stops accepting and lets what is in flight (streams too)
 * finish, up to shutdown_grace_ms; a second signal stops at once. */
static void on_signal(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd *d = arg;
    if (d->drain_ev != NULL || d->gw == NULL || d->cfg.shutdown_grace_ms == 0) {
        osubd_log(OSUBD_LOG_INFO, "stopping");
        event_base_loopbreak(d->base);
        return;
    }
    int open = osubd_gateway_drain(d);
    osubd_log(OSUBD_LOG_INFO, "stopping: the gateway accepts no more connections and lets %d finish "
            "(at most %lld ms; a second signal stops at once)",
            open, (long long)d->cfg.shutdown_grace_ms);
    d->drain_until_ms = osubd_engine_now(d) + d->cfg.shutdown_grace_ms;
    d->drain_ev = event_new(d->base, -1, EV_PERSIST, on_drain, d);
    struct timeval tv = {0, 50000};
    if (d->drain_ev == NULL || event_add(d->drain_ev, &tv) != 0)
        event_base_loopbreak(d->base);
    else
        on_drain(-1, 0, d);
}

/* SIGHUP: never a stop. The admin token is read again from its file; other settings are read
 * at start, and the message says so. */
static void on_hup_read(struct osubd *d, char *err, size_t errlen);

static void on_hup(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd *d = arg;
    char err[600];
    /* systemd's ExecReload (kill -HUP): reloading, then ready again */
    osubd_notify("RELOADING=1");
    on_hup_read(d, err, sizeof(err));
    osubd_notify("READY=1");
}

static void on_hup_read(struct osubd *d, char *err, size_t errlen)
{
    if (d->cfg.token_file[0] == '\0') {
        osubd_log(OSUBD_LOG_INFO, "SIGHUP: nothing to reload (no --token-file); other settings "
                        "are read at start: restart oversubd to change them");
        return;
    }
    if (osubd_read_token(d->cfg.token_file, d->cfg.token, sizeof(d->cfg.token), err, errlen) != 0) {
        osubd_log(OSUBD_LOG_INFO, "SIGHUP: %s: the old token stays", err);
        return;
    }
    osubd_log(OSUBD_LOG_INFO, "SIGHUP: the admin token was read again from %s; other settings "
            "are read at start: restart oversubd to change them",
            d->cfg.token_file);
}

int osubd_read_token(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 0077) != 0) {
        snprintf(err, errlen,
                 "%s: the token file must be a regular file that only its owner can read or "
                 "write (chmod 600 %s)",
                 path, path);
        fclose(f);
        return -1;
    }
    char buf[512];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *s = buf;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    size_t l = strlen(s);
    while (l > 0 && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\n' || s[l - 1] == '\r'))
        s[--l] = '\0';
    if (l == 0 || l >= outlen) {
        snprintf(err, errlen, "%s: the token must be 1 to %zu characters", path, outlen - 1);
        return -1;
    }
    memcpy(out, s, l + 1);
    return 0;
}

struct replay {
    osub_engine_t *e;
    int64_t expect; /* the next sequence number: the log has no gap */
    int64_t last_seq;
    int64_t last_ms;
    int64_t n;
    char err[300];
};

static int replay_cb(void *arg, int64_t seq, int64_t engine_ms, int64_t unix_ms, const char *cmd)
{
    (void)unix_ms;
    struct replay *r = arg;
    json_error_t je;
    json_t *j = json_loads(cmd, 0, &je);
    if (j == NULL) {
        snprintf(r->err, sizeof(r->err), "command %lld in the log is not JSON: %s", (long long)seq,
                 je.text);
        return -1;
    }
    if (seq != r->expect) {
        json_decref(j);
        snprintf(r->err, sizeof(r->err),
                 "the log misses commands %lld to %lld (the snapshot covers up to %lld): the "
                 "state is damaged",
                 (long long)r->expect, (long long)seq - 1, (long long)r->expect - 1);
        return -1;
    }
    r->expect++;
    char err[256];
    err[0] = '\0';
    osubd__cmd_apply(r->e, j, engine_ms, NULL, err, sizeof(err));
    json_decref(j);
    if (err[0] != '\0') { /* refused commands are logged; malformed ones never are */
        snprintf(r->err, sizeof(r->err), "command %lld in the log is not one: %s", (long long)seq,
                 err);
        return -1;
    }
    r->last_ms = engine_ms;
    r->last_seq = seq;
    r->n++;
    return 0;
}

/* A value of the state's meta table: *text NULL when absent. A read that fails is an error
 * (-1 with a sentence in err), never "absent": a new service key or a new state would follow. */
static int meta_text(struct osubd *d, const char *key, char **text, char *err, size_t errlen)
{
    if (osubd__store_meta_get(d->store, key, text) != 0) {
        snprintf(err, errlen, "%s: cannot read '%s' from the state: %s", d->cfg.state_path, key,
                 osubd__store_error(d->store));
        return -1;
    }
    return 0;
}

/* The pool: NVML's GPUs ("auto" when a driver answers, "nvml"), else simulated ("auto",
 * "sim:8x81920"). names and d->uuids are filled for NVML. */
static int pool_from(struct osubd *d, const char *gpus, int64_t *vram, char (*names)[96],
                     size_t cap, size_t *n, char *desc, size_t desclen, char *err, size_t errlen)
{
    const char *spec = gpus;
    for (size_t i = 0; i < cap; i++)
        names[i][0] = '\0';
    if (strcmp(gpus, "auto") == 0 || strcmp(gpus, "nvml") == 0) {
        char nerr[300];
        if (d->nvml == NULL && osubd__nvml_open(d->cfg.nvml_lib[0] ? d->cfg.nvml_lib : NULL, &d->nvml,
                                              nerr, sizeof(nerr)) != 0) {
            if (strcmp(gpus, "nvml") == 0) {
                snprintf(err, errlen, "--gpus nvml: %s", nerr);
                return -1;
            }
            snprintf(desc, desclen,
                     "auto: no NVIDIA driver (%s), so a simulated pool of 8 x 81920 MiB", nerr);
            spec = "8x81920";
        } else {
            struct nvml_gpu g[OSUBD_NVML_GPUS_MAX];
            size_t k = 0;
            if (osubd__nvml_read(d->nvml, g, OSUBD_NVML_GPUS_MAX, &k, err, errlen) != 0)
                return -1;
            if (k == 0) {
                snprintf(err, errlen, "NVML reports no GPU");
                return -1;
            }
            for (size_t i = 0; i < k && i < cap; i++) {
                vram[i] = g[i].total_mib;
                snprintf(names[i], 96, "%s", g[i].name);
                memcpy(d->uuids[i], g[i].uuid, sizeof(d->uuids[i]));
                d->uuids[i][sizeof(d->uuids[i]) - 1] = '\0';
            }
            *n = k < cap ? k : cap;
            d->n_uuids = (int32_t)*n;
            snprintf(desc, desclen, "%zu GPU(s) from NVML (the first: %s, %lld MiB)", k, g[0].name,
                     (long long)g[0].total_mib);
            return 0;
        }
    } else if (strncmp(gpus, "sim:", 4) == 0) {
        spec = gpus + 4;
        snprintf(desc, desclen, "a simulated pool %s", spec);
    } else {
        snprintf(err, errlen, "--gpus: '%s' is not auto, nvml or sim:POOL (sim:8x81920)", gpus);
        return -1;
    }
    if (osub_parse_pool(spec, vram, cap, n) != 0) {
        snprintf(err, errlen,
                 "--gpus: '%s' is not a pool (sim:8x81920, sim:4x81920,4x40960; at most %d GPUs)",
                 gpus, OSUB_POOL_GPUS_MAX);
        return -1;
    }
    return 0;
}

/* GPUs the state knows that NVML no longer shows (gone, or another UUID at that index) are
 * marked lost, their services requeued or released with events. */
static int check_gpus_found(struct osubd *d, char *err, size_t errlen)
{
    char *stored = NULL;
    if (meta_text(d, "gpu_uuids", &stored, err, errlen) != 0)
        return -1;
    if (stored == NULL)
        return 0;
    struct nvml_gpu g[OSUBD_NVML_GPUS_MAX];
    size_t k = 0;
    char nerr[256];
    if (d->nvml == NULL ||
        osubd__nvml_read(d->nvml, g, OSUBD_NVML_GPUS_MAX, &k, nerr, sizeof(nerr)) != 0)
        k = 0;
    int32_t i = 0;
    char *save = NULL;
    d->n_uuids = 0;
    for (char *u = strtok_r(stored, ",", &save); u && i < OSUBD_NVML_GPUS_MAX;
         u = strtok_r(NULL, ",", &save), i++) {
        snprintf(d->uuids[i], sizeof(d->uuids[i]), "%s", u);
        d->n_uuids = i + 1;
        bool found = false;
        for (size_t j = 0; j < k; j++)
            found = found || strcmp(g[j].uuid, u) == 0;
        osub_gpu_info_t gi;
        if (found || osub_engine_gpu_info(d->e, i, &gi) != 0 || gi.lost)
            continue;
        osubd_log(OSUBD_LOG_WARN, "GPU %d (%s) is not among the GPUs NVML shows now: marking it lost; "
                "its services go back to the queue or are released",
                i, u);
        json_t *cmd = json_pack("{s:s, s:i}", "op", "lost", "gpu", (int)i);
        osubd_apply(d, cmd, NULL, nerr, sizeof(nerr));
        json_decref(cmd);
    }
    free(stored);
    return 0;
}

/* Services that told their PID (POST .../ready {"pid"}): their processes' memory on each of
 * their GPUs, from NVML, becomes their usage (a command only when it changed). PIDs of
 * services that are gone are forgotten. */
static void report_process_usage(struct osubd *d, const struct nvml_gpu *g, size_t k)
{
    size_t nk;
    osubd__idmap_key_t *keys = osubd_act_pid_ids(d, &nk); /* a command may forget one */
    for (size_t ki = 0; ki < nk; ki++) {
        const char *id = keys[ki];
        osub_service_info_t si;
        json_int_t pid = osubd_act_pid(d, id);
        if (pid <= 0 || osub_engine_service_info(d->e, id, &si) != 0 ||
            osubd_act_shim_processes(d, id) > 0) /* the shim's figure is exact: it wins */
            continue;
        json_t *per = json_array();
        bool changed = false, seen = false;
        for (int32_t s = 0; s < si.n_slots; s++) {
            int64_t mib = 0;
            const char *uuid = si.slots[s].gpu < d->n_uuids ? d->uuids[si.slots[s].gpu] : "";
            for (size_t j = 0; j < k; j++) {
                if (strcmp(g[j].uuid, uuid) != 0)
                    continue;
                for (int32_t p = 0; p < g[j].n_procs; p++)
                    if ((json_int_t)g[j].procs[p].pid == pid) {
                        mib += g[j].procs[p].used_mib;
                        seen = true;
                    }
            }
            changed = changed || mib != si.slots[s].used_mib;
            json_array_append_new(per, json_integer(mib));
        }
        /* an external service evicted whose process holds no GPU memory any more has
         * exited, as far as memory goes (managed ones are watched as processes) */
        if (!seen && (si.state == OSUB_STATE_DRAINING || si.state == OSUB_STATE_OVERDUE) &&
            !osubd_act_managed(d, id)) {
            json_decref(per);
            osubd_log(OSUBD_LOG_INFO, "NVML shows no memory of %s's process %lld: exited", id,
                    (long long)pid);
            json_t *cmd = json_pack("{s:s, s:s}", "op", "exited", "id", id);
            char err[256];
            osubd_apply(d, cmd, NULL, err, sizeof(err));
            json_decref(cmd);
            continue;
        }
        /* a process not (yet) on any GPU: nothing to say */
        if (seen && changed) {
            json_t *cmd = json_pack("{s:s, s:s, s:o}", "op", "usage", "id", id, "gpus", per);
            char err[256];
            osubd_apply(d, cmd, NULL, err, sizeof(err));
            json_decref(cmd);
        } else {
            json_decref(per);
        }
    }
    free(keys);
}

/* The monitor: NVML's view of each GPU. Memory in use that no service reports counts as
 * system (the driver, contexts, processes oversub does not know); a GPU that vanished is
 * lost. */
static void on_poll(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd *d = arg;
    struct nvml_gpu g[OSUBD_NVML_GPUS_MAX];
    size_t k = 0;
    char err[256];
    if (osubd__nvml_read(d->nvml, g, OSUBD_NVML_GPUS_MAX, &k, err, sizeof(err)) != 0) {
        osubd_log(OSUBD_LOG_INFO, "NVML: %s", err);
        return;
    }
    report_process_usage(d, g, k);
    for (int32_t i = 0; i < d->n_uuids; i++) {
        osub_gpu_info_t gi;
        if (osub_engine_gpu_info(d->e, i, &gi) != 0 || gi.lost)
            continue;
        const struct nvml_gpu *m = NULL;
        for (size_t j = 0; j < k && m == NULL; j++)
            if (strcmp(g[j].uuid, d->uuids[i]) == 0)
                m = &g[j];
        json_t *cmd;
        if (m == NULL) {
            osubd_log(OSUBD_LOG_WARN, "GPU %d (%s) disappeared", i, d->uuids[i]);
            cmd = json_pack("{s:s, s:i}", "op", "lost", "gpu", (int)i);
        } else {
            int64_t services = gi.used_mib - gi.system_mib;
            int64_t sys = m->used_mib - services;
            if (sys < 0)
                sys = 0;
            if (sys > gi.vram_mib)
                sys = gi.vram_mib;
            if (sys == gi.system_mib)
                continue;
            cmd = json_pack("{s:s, s:i, s:I}", "op", "system", "gpu", (int)i, "vram_mib",
                            (json_int_t)sys);
        }
        osubd_apply(d, cmd, NULL, err, sizeof(err));
        json_decref(cmd);
    }
}

/* The key per-service tokens derive from: random, made with the state, kept in it (mode 0600),
 * so tokens survive restarts. */
static int load_service_key(struct osubd *d, bool existing, char *err, size_t errlen)
{
    char *hexkey = NULL;
    if (meta_text(d, "service_key", &hexkey, err, errlen) != 0)
        return -1;
    if (hexkey == NULL && existing) {
        /* a new key would invalidate every service's token: refuse instead */
        snprintf(err, errlen,
                 "%s: the state has no service key (its meta table is damaged); every service's "
                 "token derives from it",
                 d->cfg.state_path);
        return -1;
    }
    if (hexkey == NULL) {
        uint8_t k[32];
        if (getrandom(k, sizeof(k), 0) != (ssize_t)sizeof(k)) {
            snprintf(err, errlen, "cannot read random bytes for the service key: %s",
                     strerror(errno));
            return -1;
        }
        char h[65];
        for (int i = 0; i < 32; i++)
            snprintf(h + 2 * i, 3, "%02x", k[i]);
        if (osubd__store_meta_set(d->store, "service_key", h) != 0) {
            snprintf(err, errlen, "%s: %s", d->cfg.state_path, osubd__store_error(d->store));
            return -1;
        }
        memcpy(d->service_key, k, 32);
        return 0;
    }
    bool ok = strlen(hexkey) == 64;
    for (int i = 0; i < 32 && ok; i++) {
        unsigned v;
        ok = sscanf(hexkey + 2 * i, "%2x", &v) == 1;
        d->service_key[i] = (uint8_t)v;
    }
    free(hexkey);
    if (!ok) {
        snprintf(err, errlen, "%s: the stored service key is damaged", d->cfg.state_path);
        return -1;
    }
    return 0;
}

/* ---- the state's marker: STATE.marker says which state this is and how far it went ---------
 * A deleted -wal file or a database emptied or replaced under the daemon would otherwise start
 * as a "new state" (or an older one) with the acknowledged services gone. The marker is one
 * 64-byte record, "oversub-state 1 ID SEQ", written in place after each commit (not synced: it
 * can only lag the database, never lead it), so a state that ends before the marker does lost
 * commands. */

static void state_id(const struct osubd *d, char out[17])
{
    uint8_t mac[32];
    osubd__hmac_sha256(d->service_key, 32, "oversub state id", 16, mac);
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* 1 and the marker's id and sequence; 0 when there is none; -1 when it cannot be read. */
static int marker_read(const char *path, char id[17], int64_t *seq)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    char buf[65];
    ssize_t n = read(fd, buf, 64);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    long long s;
    char idb[17];
    if (sscanf(buf, "oversub-state 1 %16s %lld", idb, &s) != 2 || s < 0)
        return -1;
    memcpy(id, idb, 17);
    *seq = s;
    return 1;
}

/* early: before anything is written to an empty state; else after the replay, which gives
 * the state's last command */
static int check_marker(struct osubd *d, bool existing, bool early, char *err, size_t errlen)
{
    char path[600], mid[17] = "", sid[17];
    snprintf(path, sizeof(path), "%s.marker", d->cfg.state_path);
    int64_t mseq = 0;
    int r = marker_read(path, mid, &mseq);
    if (r < 0) {
        if (!early)
            osubd_log(OSUBD_LOG_WARN, "%s cannot be read or is damaged: it is written anew",
                    path);
        r = 0;
    }
    if (r == 1 && !d->cfg.new_state) {
        if (!existing && mseq > 0) {
            snprintf(err, errlen,
                     "%s is empty, but %s says it held %lld command(s) (state %s): the database "
                     "or its -wal file was deleted or replaced. Restore them, or start anew with "
                     "--new-state",
                     d->cfg.state_path, path, (long long)mseq, mid);
            return -1;
        }
        if (existing && !early) {
            state_id(d, sid);
            if (strcmp(sid, mid) != 0) {
                snprintf(err, errlen,
                         "%s is state %s, but %s belongs to state %s: the database was replaced. "
                         "Restore the right one, or take this one with --new-state",
                         d->cfg.state_path, sid, path, mid);
                return -1;
            }
            if (d->last_seq < mseq) {
                snprintf(err, errlen,
                         "%s ends at command %lld, but %s says %lld were written: the last %lld "
                         "are lost (was its -wal file deleted?). Restore it, or go on from what "
                         "is there with --new-state",
                         d->cfg.state_path, (long long)d->last_seq, path, (long long)mseq,
                         (long long)(mseq - d->last_seq));
                return -1;
            }
        }
    }
    if (early)
        return 0;
    d->marker_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d->marker_fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    state_id(d, d->state_id);
    osubd_marker_write(d->marker_fd, d->state_id, d->last_seq);
    return 0;
}

void osubd_marker_write(int fd, const char *id, int64_t seq)
{
    char rec[65];
    memset(rec, ' ', 64);
    int n = snprintf(rec, sizeof(rec), "oversub-state 1 %s %lld", id, (long long)seq);
    if (n > 0 && n < 64)
        rec[n] = ' ';
    rec[63] = '\n';
    ssize_t w = pwrite(fd, rec, 64, 0);
    (void)w; /* a full disk: the marker lags, which it may */
}

void osubd_service_token(const struct osubd *d, const char *id, char out[65])
{
    char msg[160];
    int n = snprintf(msg, sizeof(msg), "oversub service token:%s", id);
    uint8_t mac[32];
    osubd__hmac_sha256(d->service_key, 32, msg, (size_t)n, mac);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* The writer committed (or failed): send the replies it covers, wake long-polls. */
static void on_writer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd *d = arg;
    struct osubd__writer_progress p;
    char err[600];
    if (osubd__writer_progress(d->writer, &p, err, sizeof(err)) != 0) {
        /* the engine moved and the disk did not: the state on disk is the truth */
        osubd_log(OSUBD_LOG_ERROR, "cannot write the state (%s): stopping", err);
        d->fatal = true;
        event_base_loopbreak(d->base);
        return;
    }
    if (p.full && !d->store_full) {
        osubd_log(OSUBD_LOG_WARN, "the state's disk is full (%s): changes through the API are refused "
                "with 507 until space returns; reads, the gateway and the services go on; what "
                "the engine did meanwhile waits in memory and is written then (a restart before "
                "that loses it)",
                err);
        d->store_full = true;
        d->store_full_count++;
        osubd_api_release_held(d);
    } else if (!p.full && d->store_full) {
        osubd_log(OSUBD_LOG_INFO, "the state's disk has room again: everything waiting is written "
                        "and changes are accepted");
        d->store_full = false;
    }
    d->durable_ticket = p.durable;
    d->last_seq = p.last_log_seq;
    d->commits = p.commits;
    d->commit_items = p.items;
    osubd_api_flush(d);
    osubd_act_events(d, NULL, 0); /* directives and signals wait for their decisions' commit */
    if (p.last_event_seq > d->last_event_seq) {
        d->last_event_seq = p.last_event_seq;
        osubd_api_events_ready(d);
    }
}

/* The engine's settings of a new state, kept with it: a state without a snapshot yet replays
 * its log on exactly that engine. */
static const char *engine_config_text(const osub_pool_config_t *c)
{
    static char t[400];
    snprintf(t, sizeof(t), "%d %d %lld %d %d %lld %lld %lld %lld %lld %lld %lld %lld %lld",
             c->ratio_milli, c->compute_ratio_milli, (long long)c->margin_mib,
             c->high_watermark_pct, c->low_watermark_pct, (long long)c->hysteresis_ms,
             (long long)c->ack_timeout_ms, (long long)c->grace_ms, (long long)c->min_runtime_ms,
             (long long)c->history_window_ms, (long long)c->restart_cost_ms,
             (long long)c->queue_aging_ms, (long long)c->prediction_trust_ms,
             (long long)c->floor_start_after_ms);
    return t;
}

static int engine_config_stored(struct osubd *d, osub_pool_config_t *c, char *err, size_t errlen)
{
    osub_pool_config_default(c);
    c->ratio_milli = d->cfg.ratio_milli;
    char *t = NULL;
    if (meta_text(d, "engine_config", &t, err, errlen) != 0)
        return -1;
    long long v[14];
    int nv =
        t == NULL
            ? 0
            : sscanf(t, "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld",
                     &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10],
                     &v[11], &v[12], &v[13]);
    if (nv == 12 || nv == 14) { /* 12: a state made before the predictor (its defaults) */
        c->ratio_milli = (int32_t)v[0];
        c->compute_ratio_milli = (int32_t)v[1];
        c->margin_mib = v[2];
        c->high_watermark_pct = (int32_t)v[3];
        c->low_watermark_pct = (int32_t)v[4];
        c->hysteresis_ms = v[5];
        c->ack_timeout_ms = v[6];
        c->grace_ms = v[7];
        c->min_runtime_ms = v[8];
        c->history_window_ms = v[9];
        c->restart_cost_ms = v[10];
        c->queue_aging_ms = v[11];
        if (nv == 14) {
            c->prediction_trust_ms = v[12];
            c->floor_start_after_ms = v[13];
        }
    } else if (t != NULL) {
        snprintf(err, errlen,
                 "%s: the state's engine settings are damaged ('%.60s'): its log cannot be "
                 "replayed as it was made",
                 d->cfg.state_path, t);
        free(t);
        return -1;
    } else if (d->nvml != NULL) {
        c->margin_mib = 1024; /* a state from before engine_config was kept */
    }
    free(t);
    return 0;
}

/* Engine time runs on the monotonic clock from here, from where the last run left it (or the
 * wall clock since the state was made, when that is later: time passed while we were down). */
static void start_clock(struct osubd *d)
{
    d->engine_start_ms = osubd_unix_ms() - d->base_unix_ms;
    if (d->engine_start_ms < d->last_engine_ms)
        d->engine_start_ms = d->last_engine_ms;
    d->mono_start_ms = mono_ms();
}

int osubd_start(struct osubd *d, char *err, size_t errlen)
{
    char e2[600];
    /* the state's folder */
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", d->cfg.state_path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL) {
        *slash = '\0';
        if (dir[0] != '\0' && mkdir(dir, 0700) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "%s: %s", dir, strerror(errno));
            return -1;
        }
    }
    /* one oversubd per state: a lock file beside it, held while we run (flock: not disturbed
     * by SQLite's own POSIX locks); a second daemon is refused before it opens the database */
    char lock[600];
    snprintf(lock, sizeof(lock), "%s.lock", d->cfg.state_path);
    d->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d->lock_fd < 0) {
        snprintf(err, errlen, "%s: %s", lock, strerror(errno));
        return -1;
    }
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen,
                 "%s: another oversubd runs on this state (it holds %s); stop it first, or give "
                 "this one another --state",
                 d->cfg.state_path, lock);
        close(d->lock_fd);
        d->lock_fd = -1;
        return -1;
    }
    if (osubd__store_open(d->cfg.state_path, &d->store, e2, sizeof(e2)) != 0) {
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    /* an existing state (it has a base time) must have all it was made with */
    char *probe = NULL;
    if (meta_text(d, "base_unix_ms", &probe, err, errlen) != 0)
        return -1;
    bool existing = probe != NULL;
    d->existing = existing;
    free(probe);
    if (check_marker(d, existing, true, err, errlen) != 0)
        return -1;
    if (load_service_key(d, existing, err, errlen) != 0)
        return -1;
    /* each module's own records, as the last run saved them */
    char *routes = NULL;
    d->routes = osubd_routes_new();
    if (d->routes == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (meta_text(d, "gateway_routes", &routes, err, errlen) != 0)
        return -1;
    int lrc = routes != NULL ? osubd_routes_load(d->routes, routes, e2, sizeof(e2)) : 0;
    free(routes);
    if (lrc != 0) {
        snprintf(err, errlen, "%s: %s", d->cfg.state_path, e2);
        return -1;
    }
    if (osubd_parse_destinations(d->cfg.allowed_destinations, &d->dest, e2, sizeof(e2)) != 0) {
        snprintf(err, errlen, "allowed_destinations: %s", e2);
        return -1;
    }
    if (osubd_act_init(d, e2, sizeof(e2)) != 0) {
        snprintf(err, errlen, "%s: %s", d->cfg.state_path, e2);
        return -1;
    }
    char *pool = NULL, *base = NULL, *snap = NULL;
    int64_t *vram = calloc(OSUB_POOL_GPUS_MAX, sizeof(*vram));
    char(*names)[96] = calloc(OSUB_POOL_GPUS_MAX, sizeof(*names));
    const char **np = calloc(OSUB_POOL_GPUS_MAX, sizeof(*np));
    size_t n = 0;
    char desc[512];
    if (vram == NULL || names == NULL || np == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (meta_text(d, "pool", &pool, err, errlen) != 0 ||
        meta_text(d, "base_unix_ms", &base, err, errlen) != 0)
        goto fail;
    if (pool_from(d, d->cfg.gpus, vram, names, OSUB_POOL_GPUS_MAX, &n, desc, sizeof(desc), err,
                  errlen) != 0)
        goto fail;
    int64_t upto = 0;
    if (osubd__store_load_snapshot(d->store, &snap, &upto) != 0) {
        snprintf(err, errlen, "%s: %s", d->cfg.state_path, osubd__store_error(d->store));
        goto fail;
    }
    if (base == NULL) {
        /* a new state */
        d->base_unix_ms = osubd_unix_ms();
        char b[32];
        snprintf(b, sizeof(b), "%lld", (long long)d->base_unix_ms);
        osub_pool_config_t cfg = d->cfg.engine;
        cfg.ratio_milli = d->cfg.ratio_milli;
        if (d->nvml != NULL)
            cfg.margin_mib = 1024; /* DESIGN.md: the driver's own memory under NVML */
        if (osubd__store_meta_set(d->store, "engine_config", engine_config_text(&cfg)) != 0) {
            snprintf(err, errlen, "%s: %s", d->cfg.state_path, osubd__store_error(d->store));
            goto fail;
        }
        for (size_t i = 0; i < n; i++)
            np[i] = names[i][0] ? names[i] : NULL;
        int rc = osub_engine_new(&cfg, vram, np, n, NULL, 0, &d->e);
        if (rc != 0) {
            snprintf(err, errlen, "pool: %s", osub_strerror(rc));
            goto fail;
        }
        start_clock(d);
        char ul[OSUBD_NVML_GPUS_MAX * 97] = "";
        for (int32_t u = 0; u < d->n_uuids; u++) {
            strcat(ul, u ? "," : "");
            strcat(ul, d->uuids[u]);
        }
        if (osubd__store_meta_set(d->store, "gpu_uuids", ul) != 0 ||
            osubd__store_meta_set(d->store, "base_unix_ms", b) != 0 ||
            osubd__store_meta_set(d->store, "pool", d->nvml ? "nvml" : d->cfg.gpus) != 0) {
            snprintf(err, errlen, "%s: %s", d->cfg.state_path, osubd__store_error(d->store));
            goto fail;
        }
        osubd_log(OSUBD_LOG_INFO, "new state in %s; GPUs: %s", d->cfg.state_path, desc);
    } else {
        char *bend = NULL;
        errno = 0;
        d->base_unix_ms = strtoll(base, &bend, 10);
        if (errno != 0 || bend == base || *bend != '\0' || d->base_unix_ms <= 0) {
            snprintf(err, errlen, "%s: the state's base time is damaged ('%.40s')",
                     d->cfg.state_path, base);
            goto fail;
        }
        if (pool == NULL) {
            snprintf(err, errlen, "%s: the state has no pool recorded (its meta table is damaged)",
                     d->cfg.state_path);
            goto fail;
        }
        if (snap != NULL) {
            size_t line = 0;
            int rc = osub_engine_load(snap, &d->e, &line);
            if (rc != 0) {
                snprintf(err, errlen, "%s: the saved engine state is corrupt (line %zu): %s",
                         d->cfg.state_path, line, osub_strerror(rc));
                goto fail;
            }
        } else {
            /* no snapshot yet: the log replays on the engine as it was made */
            osub_pool_config_t cfg;
            size_t pn = 0;
            char pd[512];
            if (pool_from(d, pool ? pool : "auto", vram, names, OSUB_POOL_GPUS_MAX, &pn, pd,
                          sizeof(pd), err, errlen) != 0)
                goto fail;
            if (engine_config_stored(d, &cfg, err, errlen) != 0)
                goto fail;
            for (size_t i = 0; i < pn; i++)
                np[i] = names[i][0] ? names[i] : NULL;
            if (osub_engine_new(&cfg, vram, np, pn, NULL, 0, &d->e) != 0) {
                snprintf(err, errlen, "%s: the saved pool '%s' is invalid", d->cfg.state_path,
                         pool ? pool : "?");
                goto fail;
            }
        }
        struct replay r = {.e = d->e, .expect = upto + 1};
        if (osubd__store_replay(d->store, upto, replay_cb, &r) != 0) {
            snprintf(err, errlen, "%s: %s", d->cfg.state_path,
                     r.err[0] ? r.err : osubd__store_error(d->store));
            goto fail;
        }
        d->last_engine_ms = r.last_ms;
        d->last_seq = r.n > 0 ? r.last_seq : upto;
        start_clock(d);
        osub_pool_info_t pi;
        osub_engine_pool_info(d->e, &pi);
        osubd_log(OSUBD_LOG_INFO, "restored %s: %d services, %d queued, replayed %lld command(s) after "
                "the snapshot",
                d->cfg.state_path, pi.n_services, pi.n_queued, (long long)r.n);
        if (pool != NULL && strcmp(pool, d->cfg.gpus) != 0)
            osubd_log(OSUBD_LOG_INFO, "note: the state was made with --gpus %s; it keeps that pool "
                    "(--gpus %s is ignored)",
                    pool, d->cfg.gpus);
        if (pool != NULL && strcmp(pool, "nvml") == 0) {
            char nerr[300];
            if (d->nvml == NULL && osubd__nvml_open(d->cfg.nvml_lib[0] ? d->cfg.nvml_lib : NULL,
                                                  &d->nvml, nerr, sizeof(nerr)) != 0) {
                /* marking every GPU lost would throw the services out: refuse instead */
                snprintf(err, errlen,
                         "%s holds the state of NVML GPUs, but NVML does not answer (%s); "
                         "start oversubd where the driver is, or with another --state",
                         d->cfg.state_path, nerr);
                goto fail;
            }
            if (check_gpus_found(d, err, errlen) != 0)
                goto fail;
        } else if (d->nvml != NULL) {
            /* a simulated pool: the real GPUs are not watched */
            osubd__nvml_close(d->nvml);
            d->nvml = NULL;
        }
    }
    int64_t last_ev;
    osubd__store_last_event(d->store, &last_ev);
    d->last_event_seq = last_ev;
    free(pool);
    free(base);
    free(snap);
    free(vram);
    free(names);
    free(np);
    vram = NULL;
    names = NULL;
    np = NULL;
    /* epoll's changelist folds the add/delete pairs evhttp makes per request into one
     * epoll_ctl at most (measured on the gateway: see docs/performance.md) */
    struct event_config *ecfg = event_config_new();
    if (ecfg != NULL)
        event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    d->base = ecfg ? event_base_new_with_config(ecfg) : NULL;
    if (ecfg != NULL)
        event_config_free(ecfg);
    if (d->base == NULL)
        d->base = event_base_new();
    if (d->base == NULL) {
        snprintf(err, errlen, "cannot create the event loop");
        return -1;
    }
    if (check_marker(d, d->existing, false, err, errlen) != 0)
        return -1;
    if (osubd__writer_start(d->cfg.state_path, d->last_seq, d->cfg.events_keep, d->cfg.events_days,
                          &d->writer, err, errlen) != 0)
        return -1;
    osubd__writer_set_marker(d->writer, d->marker_fd, d->state_id, osubd_marker_write);
    d->writer_ev =
        event_new(d->base, osubd__writer_fd(d->writer), EV_READ | EV_PERSIST, on_writer, d);
    if (d->writer_ev == NULL || event_add(d->writer_ev, NULL) != 0) {
        snprintf(err, errlen, "cannot watch the writer");
        return -1;
    }
    if (osubd_api_init(d, err, errlen) != 0)
        return -1;
    if (osubd_gateway_init(d, err, errlen) != 0)
        return -1;
    if (osubd_pods_init(d, err, errlen) != 0)
        return -1;
    if (osubd_act_start(d, err, errlen) != 0)
        return -1;
    d->tick_ev = evtimer_new(d->base, on_tick, d);
    d->tick_at = INT64_MAX;
    d->sigint_ev = evsignal_new(d->base, SIGINT, on_signal, d);
    d->sigterm_ev = evsignal_new(d->base, SIGTERM, on_signal, d);
    d->sighup_ev = evsignal_new(d->base, SIGHUP, on_hup, d);
    if (d->nvml != NULL) {
        struct timeval pv = {(time_t)(d->cfg.poll_ms / 1000),
                             (suseconds_t)(d->cfg.poll_ms % 1000) * 1000};
        d->poll_ev = event_new(d->base, -1, EV_PERSIST, on_poll, d);
        if (d->poll_ev == NULL || event_add(d->poll_ev, &pv) != 0) {
            snprintf(err, errlen, "cannot set up the GPU monitor");
            return -1;
        }
    }
    if (d->tick_ev == NULL || d->sigint_ev == NULL || d->sigterm_ev == NULL ||
        d->sighup_ev == NULL || event_add(d->sigint_ev, NULL) != 0 ||
        event_add(d->sigterm_ev, NULL) != 0 || event_add(d->sighup_ev, NULL) != 0) {
        snprintf(err, errlen, "cannot set up the event loop");
        return -1;
    }
    schedule_tick(d);
    return 0;
fail:
    free(pool);
    free(base);
    free(snap);
    free(vram);
    free(names);
    free(np);
    return -1;
}

void osubd_stop(struct osubd *d)
{
    /* before the writer closes its pipe: an event left on a closed descriptor makes libevent
     * warn (and, with a start that failed early, its addition was never applied) */
    if (d->writer_ev) {
        event_free(d->writer_ev);
        d->writer_ev = NULL;
    }
    if (d->writer != NULL) {
        struct osubd__writer_progress p;
        if (osubd__writer_stop(d->writer, &p) != 0)
            d->fatal = true;
        d->writer = NULL;
        d->last_seq = p.last_log_seq;
        if (!d->fatal && d->base != NULL) {
            /* everything handed over is durable now: the replies held for it go out before
             * the connections close (new commands from here on commit directly) */
            d->durable_ticket = p.durable;
            osubd_api_flush(d);
            for (int i = 0; i < 20; i++)
                event_base_loop(d->base, EVLOOP_NONBLOCK);
        }
    }
    if (d->writer_ev)
        event_free(d->writer_ev);
    osubd_gateway_free(d);
    osubd_act_free(d);
    osubd_pods_free(d);
    osubd_destinations_free(d->dest);
    d->dest = NULL;
    osubd_routes_free(d->routes);
    d->routes = NULL;
    free(d->pool_text);
    if (d->store != NULL && d->e != NULL && !d->fatal)
        snapshot_now(d);
    if (d->tick_ev)
        event_free(d->tick_ev);
    if (d->sigint_ev)
        event_free(d->sigint_ev);
    if (d->sigterm_ev)
        event_free(d->sigterm_ev);
    if (d->sighup_ev)
        event_free(d->sighup_ev);
    if (d->drain_ev)
        event_free(d->drain_ev);
    if (d->poll_ev)
        event_free(d->poll_ev);
    osubd__nvml_close(d->nvml);
    if (d->http)
        evhttp_free(d->http);
    if (d->http_unix)
        evhttp_free(d->http_unix);
    osubd_conns_free(d->conns);
    osubd_conns_free(d->conns_unix);
    if (d->base)
        event_base_free(d->base);
    osub_engine_free(d->e);
    osubd__store_close(d->store);
    if (d->marker_fd >= 0)
        close(d->marker_fd);
    if (d->lock_fd >= 0)
        close(d->lock_fd);                        /* the lock goes with it */
    if (d->cfg.socket_path[0] && d->socket_bound) /* never another daemon's, never a file */
        unlink(d->cfg.socket_path);
}
