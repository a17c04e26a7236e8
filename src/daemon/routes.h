/* routes.h - each service's gateway settings (backends, limits): typed records in the
 * routes module's own table, staged with a submit and kept only when the engine accepts it,
 * deleted when the service is released, saved as JSON only with the state */
#ifndef OSUB_DAEMON_ROUTES_H
#define OSUB_DAEMON_ROUTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core.h"
#include "idmap.h"

#define OSUBD_ROUTE_BACKENDS_MAX 16   /* backends of one service */
#define OSUBD_ROUTE_URL_MAX 255       /* an http://HOST:PORT URL */
#define OSUBD_ROUTE_INFLIGHT_MAX 4096 /* max_inflight's ceiling (vLLM runs 256 at once) */
#define OSUBD_ROUTE_QUEUE_MAX 100000

struct osubd_route {
    int32_t n_backends;
    char backends[OSUBD_ROUTE_BACKENDS_MAX][OSUBD_ROUTE_URL_MAX + 1];
    int32_t max_inflight;        /* 0: not given (the service's batch size, else 8) */
    int32_t max_queue;           /* -1: not given (twice the limit) */
    int32_t queue_timeout_ms;    /* 0: not given (5 s) */
    int32_t upstream_timeout_ms; /* 0: not given (the gateway's default) */
    int32_t idle_suspend_ms;     /* 0: never; else suspended after so long without a request */
    /* the serving engine's Prometheus endpoint (vLLM's or SGLang's /metrics), "" for none: the
     * gateway lowers the in-flight limit while the engine queues or its KV cache is full */
    char metrics_url[OSUBD_ROUTE_URL_MAX + 1];
};

struct osubd_routes;

struct osubd_routes *osubd_routes_new(void);
void osubd_routes_free(struct osubd_routes *t);
struct osubd_destinations;
/* Where loaded routes may point (borrowed, must outlive t; NULL, the default: anywhere). A
 * saved route outside it (allowed_destinations narrowed since) is dropped at load with a
 * warning naming it; its service keeps running and may register its backends again. */
void osubd_routes_allow(struct osubd_routes *t, const struct osubd_destinations *dest);

/* Takes the gateway's fields (backends, max_inflight, max_queue, queue_timeout_ms,
 * upstream_timeout_ms, idle_suspend_ms, metrics_url) out of a submitted spec (or a PUT .../backends
 * body when backends_only). *out: a new record, or NULL when no field was given. Returns 0, or -1
 * with a sentence in err naming the field. */
/* dest: where backends may be (NULL: anywhere, for routes already in the state) */
int osubd_route_take(json_t *spec, bool backends_only, const struct osubd_destinations *dest,
                     struct osubd_route **out, char *err, size_t errlen);
/* The given fields as JSON, as a submit would carry them. */
json_t *osubd_route_json(const struct osubd_route *r);
bool osubd_route_equal(const struct osubd_route *a, const struct osubd_route *b);

const struct osubd_route *osubd_routes_get(const struct osubd_routes *t, const char *id);
/* Sets id's route (taken; NULL deletes it). -1 on out of memory (r freed). */
int osubd_routes_set(struct osubd_routes *t, const char *id, struct osubd_route *r);
/* Replaces id's backends, keeping its other settings (a new route when it had none). */
int osubd_routes_set_backends(struct osubd_routes *t, const char *id, const struct osubd_route *b);
/* Forgets a released service. */
void osubd_routes_forget(struct osubd_routes *t, const char *id);
size_t osubd_routes_count(const struct osubd_routes *t);
/* The ids whose route has an idle_suspend_ms (malloc'd, *n of them; NULL when none). */
osubd__idmap_key_t *osubd_routes_idle_ids(const struct osubd_routes *t, size_t *n);

/* Saving: changed since the last save; the table as one JSON text (malloc'd); marking saved.
 * Loading: replaces the table with a saved text; -1 with a sentence in err. */
bool osubd_routes_dirty(const struct osubd_routes *t);
void osubd_routes_saved(struct osubd_routes *t, bool ok);
char *osubd_routes_save(const struct osubd_routes *t);
int osubd_routes_load(struct osubd_routes *t, const char *text, char *err, size_t errlen);

/* The table as the core's module "routes": loaded from and saved to the meta key
 * gateway_routes with the command that changed it; a gone service's route is forgotten. */
struct osubd_module osubd_routes_module(struct osubd_routes *t);

#endif
