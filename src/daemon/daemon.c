/* daemon.c - oversubd's core: the engine driven by commands that are logged durably first */
#define _POSIX_C_SOURCE 200809L
#include "daemon.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "command.h"
#include "oversub/units.h"

void osubd_config_default(struct osubd_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->listen_host, sizeof(c->listen_host), "127.0.0.1");
    c->listen_port = 7070;
    snprintf(c->socket_path, sizeof(c->socket_path), "var/oversub.sock");
    snprintf(c->state_path, sizeof(c->state_path), "var/oversub.db");
    snprintf(c->gpus, sizeof(c->gpus), "auto");
    c->ratio_milli = 1300;
    c->tick_ms = 1000;
    c->snapshot_every = 1000;
    c->events_keep = 100000;
}

int64_t osubd_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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
    int rc = osub_store_snapshot(d->store, snap, d->last_seq);
    free(snap);
    if (rc == 0) {
        d->since_snapshot = 0;
        osub_store_trim_events(d->store, d->cfg.events_keep, 0);
    }
    return rc;
}

int osubd_apply(struct osubd *d, json_t *cmd, osub_submit_result_t *res, char *err, size_t errlen)
{
    int64_t now = osubd_unix_ms() - d->base_unix_ms;
    if (now < d->last_engine_ms)
        now = d->last_engine_ms; /* the wall clock stepped back: the engine's time may not */
    bool dry = json_is_true(json_object_get(cmd, "dry_run"));
    err[0] = '\0';
    int rc = osub_cmd_apply(d->e, cmd, now, res, err, errlen);
    if (err[0] != '\0' || dry)
        return rc; /* malformed, or a dry run: nothing reached the engine's state */
    d->last_engine_ms = now;
    /* log the command and its events before anyone hears of them */
    size_t n;
    const osub_event_t *ev = osub_engine_events(d->e, &n);
    char **texts = calloc(n ? n : 1, sizeof(*texts));
    int64_t *seqs = calloc(n ? n : 1, sizeof(*seqs));
    json_t **objs = calloc(n ? n : 1, sizeof(*objs));
    char *ctext = json_dumps(cmd, JSON_COMPACT | JSON_SORT_KEYS);
    bool ok = texts && seqs && objs && ctext;
    for (size_t i = 0; i < n && ok; i++) {
        objs[i] = event_json(d, &ev[i]);
        texts[i] = json_dumps(objs[i], JSON_COMPACT);
        ok = texts[i] != NULL;
        int lvl = ev[i].level >= 0 && ev[i].level < 3 ? ev[i].level : 3;
        d->ev_counts[ev[i].kind][lvl]++;
    }
    if (ok && osub_store_append_with_events(d->store, now, now + d->base_unix_ms, ctext,
                                            (const char *const *)texts, n, &d->last_seq, seqs) != 0)
        ok = false;
    if (!ok) {
        /* the engine moved and the disk did not: the state on disk is the truth */
        fprintf(stderr, "oversubd: cannot write the state (%s): stopping\n",
                osub_store_error(d->store));
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
    for (size_t i = 0; i < n && objs; i++) {
        json_decref(objs[i]);
        free(texts ? texts[i] : NULL);
    }
    free(texts);
    free(seqs);
    free(objs);
    free(ctext);
    return rc;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd *d = arg;
    json_t *cmd = json_pack("{s:s}", "op", "tick");
    char err[256];
    osubd_apply(d, cmd, NULL, err, sizeof(err));
    json_decref(cmd);
}

static void on_signal(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd *d = arg;
    fprintf(stderr, "oversubd: stopping\n");
    event_base_loopbreak(d->base);
}

struct replay {
    osub_engine_t *e;
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
    char err[256];
    osub_cmd_apply(r->e, j, engine_ms, NULL, err, sizeof(err));
    json_decref(j);
    r->last_ms = engine_ms;
    r->n++;
    return 0;
}

/* The simulated pool from "sim:8x81920" or "auto" (no NVML support yet: simulated). */
static int pool_from(const char *gpus, int64_t *vram, size_t cap, size_t *n, char *desc,
                     size_t desclen, char *err, size_t errlen)
{
    const char *spec = gpus;
    if (strcmp(gpus, "auto") == 0) {
        spec = "8x81920";
        snprintf(desc, desclen,
                 "auto: no NVIDIA driver is used yet (NVML support comes later), "
                 "so a simulated pool of 8 x 81920 MiB");
    } else if (strncmp(gpus, "sim:", 4) == 0) {
        spec = gpus + 4;
        snprintf(desc, desclen, "a simulated pool %s", spec);
    } else {
        snprintf(err, errlen, "--gpus: '%s' is not auto or sim:POOL (sim:8x81920)", gpus);
        return -1;
    }
    if (osub_parse_pool(spec, vram, cap, n) != 0) {
        snprintf(err, errlen, "--gpus: '%s' is not a pool (sim:8x81920, sim:4x81920,4x40960)",
                 gpus);
        return -1;
    }
    return 0;
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
    if (osub_store_open(d->cfg.state_path, &d->store, e2, sizeof(e2)) != 0) {
        snprintf(err, errlen, "%s", e2);
        return -1;
    }
    char *pool = NULL, *base = NULL;
    osub_store_meta_get(d->store, "pool", &pool);
    osub_store_meta_get(d->store, "base_unix_ms", &base);
    int64_t vram[4096];
    size_t n = 0;
    char desc[256];
    if (pool_from(d->cfg.gpus, vram, 4096, &n, desc, sizeof(desc), err, errlen) != 0) {
        free(pool);
        free(base);
        return -1;
    }
    char *snap = NULL;
    int64_t upto = 0;
    if (osub_store_load_snapshot(d->store, &snap, &upto) != 0) {
        snprintf(err, errlen, "%s: %s", d->cfg.state_path, osub_store_error(d->store));
        goto fail;
    }
    if (base == NULL) {
        /* a new state */
        d->base_unix_ms = osubd_unix_ms();
        char b[32];
        snprintf(b, sizeof(b), "%lld", (long long)d->base_unix_ms);
        osub_pool_config_t cfg;
        osub_pool_config_default(&cfg);
        cfg.ratio_milli = d->cfg.ratio_milli;
        int rc = osub_engine_new(&cfg, vram, NULL, n, NULL, 0, &d->e);
        if (rc != 0) {
            snprintf(err, errlen, "pool: %s", osub_strerror(rc));
            goto fail;
        }
        if (osub_store_meta_set(d->store, "base_unix_ms", b) != 0 ||
            osub_store_meta_set(d->store, "pool", d->cfg.gpus) != 0) {
            snprintf(err, errlen, "%s: %s", d->cfg.state_path, osub_store_error(d->store));
            goto fail;
        }
        fprintf(stderr, "oversubd: new state in %s; GPUs: %s\n", d->cfg.state_path, desc);
    } else {
        d->base_unix_ms = strtoll(base, NULL, 10);
        if (snap != NULL) {
            size_t line = 0;
            int rc = osub_engine_load(snap, &d->e, &line);
            if (rc != 0) {
                snprintf(err, errlen, "%s: the saved engine state is corrupt (line %zu): %s",
                         d->cfg.state_path, line, osub_strerror(rc));
                goto fail;
            }
        } else {
            osub_pool_config_t cfg;
            osub_pool_config_default(&cfg);
            cfg.ratio_milli = d->cfg.ratio_milli;
            int64_t pv[4096];
            size_t pn = 0;
            char pd[256];
            if (pool_from(pool ? pool : "auto", pv, 4096, &pn, pd, sizeof(pd), err, errlen) != 0)
                goto fail;
            if (osub_engine_new(&cfg, pv, NULL, pn, NULL, 0, &d->e) != 0) {
                snprintf(err, errlen, "%s: the saved pool '%s' is invalid", d->cfg.state_path,
                         pool ? pool : "?");
                goto fail;
            }
        }
        struct replay r = {.e = d->e};
        if (osub_store_replay(d->store, upto, replay_cb, &r) != 0) {
            snprintf(err, errlen, "%s: %s", d->cfg.state_path,
                     r.err[0] ? r.err : osub_store_error(d->store));
            goto fail;
        }
        d->last_engine_ms = r.last_ms;
        osub_pool_info_t pi;
        osub_engine_pool_info(d->e, &pi);
        fprintf(stderr,
                "oversubd: restored %s: %d services, %d queued, replayed %lld command(s) after "
                "the snapshot\n",
                d->cfg.state_path, pi.n_services, pi.n_queued, (long long)r.n);
        if (pool != NULL && strcmp(pool, d->cfg.gpus) != 0)
            fprintf(stderr,
                    "oversubd: note: the state was made with --gpus %s; it keeps that pool "
                    "(--gpus %s is ignored)\n",
                    pool, d->cfg.gpus);
    }
    int64_t last_ev;
    osub_store_last_event(d->store, &last_ev);
    d->last_event_seq = last_ev;
    free(pool);
    free(base);
    free(snap);
    d->base = event_base_new();
    if (d->base == NULL) {
        snprintf(err, errlen, "cannot create the event loop");
        return -1;
    }
    if (osubd_api_init(d, err, errlen) != 0)
        return -1;
    struct timeval tv = {(time_t)(d->cfg.tick_ms / 1000),
                         (suseconds_t)(d->cfg.tick_ms % 1000) * 1000};
    d->tick_ev = event_new(d->base, -1, EV_PERSIST, on_tick, d);
    d->sigint_ev = evsignal_new(d->base, SIGINT, on_signal, d);
    d->sigterm_ev = evsignal_new(d->base, SIGTERM, on_signal, d);
    if (d->tick_ev == NULL || d->sigint_ev == NULL || d->sigterm_ev == NULL ||
        event_add(d->tick_ev, &tv) != 0 || event_add(d->sigint_ev, NULL) != 0 ||
        event_add(d->sigterm_ev, NULL) != 0) {
        snprintf(err, errlen, "cannot set up the event loop");
        return -1;
    }
    return 0;
fail:
    free(pool);
    free(base);
    free(snap);
    return -1;
}

void osubd_stop(struct osubd *d)
{
    if (d->store != NULL && d->e != NULL && !d->fatal)
        snapshot_now(d);
    if (d->tick_ev)
        event_free(d->tick_ev);
    if (d->sigint_ev)
        event_free(d->sigint_ev);
    if (d->sigterm_ev)
        event_free(d->sigterm_ev);
    if (d->http)
        evhttp_free(d->http);
    if (d->base)
        event_base_free(d->base);
    osub_engine_free(d->e);
    osub_store_close(d->store);
    if (d->cfg.socket_path[0])
        unlink(d->cfg.socket_path);
}
