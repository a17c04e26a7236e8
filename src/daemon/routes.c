/* routes.c - the gateway's per-service settings as typed records */
#include "routes.h"
#include "jsonmem.h"

#include "netpolicy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/http.h>

#include "idmap.h"
#include "log.h"

struct osubd_routes {
    struct osubd__idmap *map; /* id -> struct osubd_route */
    bool dirty;
    const struct osubd_destinations *dest; /* borrowed: where loaded routes may point */
};

void osubd_routes_allow(struct osubd_routes *t, const struct osubd_destinations *dest)
{
    t->dest = dest;
}

struct osubd_routes *osubd_routes_new(void)
{
    struct osubd_routes *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->map = osubd__idmap_new(free);
    if (t->map == NULL) {
        free(t);
        return NULL;
    }
    return t;
}

void osubd_routes_free(struct osubd_routes *t)
{
    if (t == NULL)
        return;
    osubd__idmap_free(t->map);
    free(t);
}

static bool backend_url_ok(const char *s)
{
    if (s == NULL || strlen(s) > OSUBD_ROUTE_URL_MAX)
        return false;
    struct evhttp_uri *uri = evhttp_uri_parse(s);
    bool ok = uri != NULL && evhttp_uri_get_scheme(uri) != NULL &&
              strcmp(evhttp_uri_get_scheme(uri), "http") == 0 && evhttp_uri_get_host(uri) != NULL &&
              evhttp_uri_get_port(uri) > 0;
    if (uri)
        evhttp_uri_free(uri);
    return ok;
}

int osubd_route_take(json_t *spec, bool backends_only, const struct osubd_destinations *dest,
                     struct osubd_route **out, char *err, size_t errlen)
{
    *out = NULL;
    struct osubd_route r = {.max_queue = -1};
    bool any = false;
    json_t *b = json_object_get(spec, "backends");
    if (b != NULL) {
        if (!json_is_array(b) || json_array_size(b) == 0 ||
            json_array_size(b) > OSUBD_ROUTE_BACKENDS_MAX) {
            snprintf(err, errlen, "field 'backends' must list 1 to %d http://HOST:PORT URLs",
                     OSUBD_ROUTE_BACKENDS_MAX);
            return -1;
        }
        size_t i;
        json_t *u;
        json_array_foreach(b, i, u)
        {
            const char *s = json_string_value(u);
            if (!backend_url_ok(s)) {
                snprintf(err, errlen, "field 'backends': entry %zu is not an http://HOST:PORT URL",
                         i);
                return -1;
            }
            char why[400];
            if (dest != NULL && !osubd_url_allowed(dest, s, why, sizeof(why))) {
                snprintf(err, errlen, "field 'backends': entry %zu: %s", i, why);
                return -1;
            }
            snprintf(r.backends[r.n_backends++], sizeof(r.backends[0]), "%s", s);
        }
        json_object_del(spec, "backends");
        any = true;
    }
    static const struct {
        const char *name;
        json_int_t lo, hi;
        size_t off;
    } ints[] = {
        {"max_inflight", 1, OSUBD_ROUTE_INFLIGHT_MAX, offsetof(struct osubd_route, max_inflight)},
        {"max_queue", 0, OSUBD_ROUTE_QUEUE_MAX, offsetof(struct osubd_route, max_queue)},
        {"queue_timeout_ms", 1, 600000, offsetof(struct osubd_route, queue_timeout_ms)},
        {"upstream_timeout_ms", 100, 600000, offsetof(struct osubd_route, upstream_timeout_ms)},
        {"idle_suspend_ms", 1000, 604800000, offsetof(struct osubd_route, idle_suspend_ms)}};
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]) && !backends_only; k++) {
        json_t *v = json_object_get(spec, ints[k].name);
        if (v == NULL)
            continue;
        if (!json_is_integer(v) || json_integer_value(v) < ints[k].lo ||
            json_integer_value(v) > ints[k].hi) {
            snprintf(err, errlen, "field '%s' must be an integer from %lld to %lld", ints[k].name,
                     (long long)ints[k].lo, (long long)ints[k].hi);
            return -1;
        }
        *(int32_t *)((char *)&r + ints[k].off) = (int32_t)json_integer_value(v);
        json_object_del(spec, ints[k].name);
        any = true;
    }
    json_t *mu = backends_only ? NULL : json_object_get(spec, "metrics_url");
    if (mu != NULL) {
        const char *s = json_string_value(mu);
        if (!backend_url_ok(s)) {
            snprintf(err, errlen,
                     "field 'metrics_url' must be an http://HOST:PORT/PATH URL (the engine's "
                     "Prometheus endpoint)");
            return -1;
        }
        char why[400];
        if (dest != NULL && !osubd_url_allowed(dest, s, why, sizeof(why))) {
            snprintf(err, errlen, "field 'metrics_url': %s", why);
            return -1;
        }
        snprintf(r.metrics_url, sizeof(r.metrics_url), "%s", s);
        json_object_del(spec, "metrics_url");
        any = true;
    }
    if (!any)
        return 0;
    if (r.n_backends == 0) {
        snprintf(err, errlen, "the gateway's fields need 'backends'");
        return -1;
    }
    *out = malloc(sizeof(r));
    if (*out == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    **out = r;
    return 0;
}

json_t *osubd_route_json(const struct osubd_route *r)
{
    json_t *o = json_object();
    json_t *b = json_array();
    for (int32_t i = 0; i < r->n_backends; i++)
        json_array_append_new(b, json_string(r->backends[i]));
    json_object_set_new(o, "backends", b);
    if (r->max_inflight > 0)
        json_object_set_new(o, "max_inflight", json_integer(r->max_inflight));
    if (r->max_queue >= 0)
        json_object_set_new(o, "max_queue", json_integer(r->max_queue));
    if (r->queue_timeout_ms > 0)
        json_object_set_new(o, "queue_timeout_ms", json_integer(r->queue_timeout_ms));
    if (r->upstream_timeout_ms > 0)
        json_object_set_new(o, "upstream_timeout_ms", json_integer(r->upstream_timeout_ms));
    if (r->idle_suspend_ms > 0)
        json_object_set_new(o, "idle_suspend_ms", json_integer(r->idle_suspend_ms));
    if (r->metrics_url[0])
        json_object_set_new(o, "metrics_url", json_string(r->metrics_url));
    return o;
}

bool osubd_route_equal(const struct osubd_route *a, const struct osubd_route *b)
{
    if (a == NULL || b == NULL)
        return a == b;
    if (a->n_backends != b->n_backends || a->max_inflight != b->max_inflight ||
        a->max_queue != b->max_queue || a->queue_timeout_ms != b->queue_timeout_ms ||
        a->upstream_timeout_ms != b->upstream_timeout_ms ||
        a->idle_suspend_ms != b->idle_suspend_ms || strcmp(a->metrics_url, b->metrics_url) != 0)
        return false;
    for (int32_t i = 0; i < a->n_backends; i++)
        if (strcmp(a->backends[i], b->backends[i]) != 0)
            return false;
    return true;
}

const struct osubd_route *osubd_routes_get(const struct osubd_routes *t, const char *id)
{
    return osubd__idmap_get(t->map, id);
}

int osubd_routes_set(struct osubd_routes *t, const char *id, struct osubd_route *r)
{
    if (r == NULL) {
        osubd_routes_forget(t, id);
        return 0;
    }
    if (osubd__idmap_put(t->map, id, r) != 0) {
        free(r);
        return -1;
    }
    t->dirty = true;
    return 0;
}

int osubd_routes_set_backends(struct osubd_routes *t, const char *id, const struct osubd_route *b)
{
    struct osubd_route *r = malloc(sizeof(*r));
    if (r == NULL)
        return -1;
    const struct osubd_route *old = osubd_routes_get(t, id);
    if (old != NULL)
        *r = *old;
    else
        *r = (struct osubd_route){.max_queue = -1};
    r->n_backends = b->n_backends;
    memcpy(r->backends, b->backends, sizeof(r->backends));
    return osubd_routes_set(t, id, r);
}

void osubd_routes_forget(struct osubd_routes *t, const char *id)
{
    if (osubd__idmap_del(t->map, id))
        t->dirty = true;
}

size_t osubd_routes_count(const struct osubd_routes *t)
{
    return osubd__idmap_count(t->map);
}

osubd__idmap_key_t *osubd_routes_idle_ids(const struct osubd_routes *t, size_t *n)
{
    *n = 0;
    size_t k = 0;
    for (size_t i = 0; i < osubd__idmap_slots(t->map); i++) {
        void *v;
        if (osubd__idmap_at(t->map, i, &v) != NULL &&
            ((struct osubd_route *)v)->idle_suspend_ms > 0)
            k++;
    }
    if (k == 0)
        return NULL;
    osubd__idmap_key_t *ids = malloc(k * sizeof(*ids));
    for (size_t i = 0; ids != NULL && i < osubd__idmap_slots(t->map) && *n < k; i++) {
        void *v;
        const char *id = osubd__idmap_at(t->map, i, &v);
        if (id != NULL && ((struct osubd_route *)v)->idle_suspend_ms > 0)
            snprintf(ids[(*n)++], sizeof(ids[0]), "%s", id);
    }
    return ids;
}

bool osubd_routes_dirty(const struct osubd_routes *t)
{
    return t->dirty;
}

void osubd_routes_saved(struct osubd_routes *t, bool ok)
{
    if (ok)
        t->dirty = false;
}

char *osubd_routes_save(const struct osubd_routes *t)
{
    json_t *o = json_object();
    for (size_t i = 0; i < osubd__idmap_slots(t->map); i++) {
        void *v;
        const char *id = osubd__idmap_at(t->map, i, &v);
        if (id != NULL)
            json_object_set_new(o, id, osubd_route_json(v));
    }
    char *text = osubd_json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    return text;
}

/* Whether every URL of a route is allowed by dest (NULL: all are); why says which is not. */
static bool route_allowed(const struct osubd_destinations *dest, const struct osubd_route *r,
                          char *why, size_t whylen)
{
    if (dest == NULL)
        return true;
    for (int32_t i = 0; i < r->n_backends; i++)
        if (!osubd_url_allowed(dest, r->backends[i], why, whylen))
            return false;
    return r->metrics_url[0] == '\0' || osubd_url_allowed(dest, r->metrics_url, why, whylen);
}

int osubd_routes_load(struct osubd_routes *t, const char *text, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        snprintf(err, errlen, "the saved gateway routes are not a JSON object");
        return -1;
    }
    struct osubd__idmap *map = osubd__idmap_new(free);
    int rc = map != NULL ? 0 : -1;
    bool dropped = false;
    const char *id;
    json_t *v;
    json_object_foreach(o, id, v)
    {
        if (rc != 0)
            break;
        struct osubd_route *r = NULL;
        json_t *copy = json_deep_copy(v);
        char why[400] = "it holds no backends";
        if (id[0] == '\0' || strlen(id) > OSUB_ID_MAX) {
            snprintf(err, errlen, "the saved gateway routes hold a bad service id '%.63s%s'", id,
                     strlen(id) > 63 ? "..." : "");
            rc = -1;
        } else if (!json_is_object(copy) ||
                   osubd_route_take(copy, false, NULL, &r, why, sizeof(why)) != 0 || r == NULL) {
            snprintf(err, errlen, "the saved gateway route of %.63s is bad: %s", id,
                     json_is_object(copy) ? why : "not an object");
            rc = -1;
        } else if (!route_allowed(t->dest, r, why, sizeof(why))) {
            osubd_log(OSUBD_LOG_WARN,
                      "the saved gateway route of %s is dropped: %s (allowed_destinations "
                      "changed since it was registered; the service may register its backends "
                      "again)",
                      id, why);
            free(r);
            dropped = true;
        } else if (osubd__idmap_put(map, id, r) != 0) {
            free(r);
            snprintf(err, errlen, "out of memory");
            rc = -1;
        }
        json_decref(copy);
    }
    json_decref(o);
    if (rc != 0) {
        osubd__idmap_free(map);
        return -1;
    }
    osubd__idmap_free(t->map);
    t->map = map;
    t->dirty = dropped; /* what was dropped is saved with the next command */
    return 0;
}

/* ---- the table as the core's module "routes" --------------------------------------------- */

static int routes_load(void *ctx, struct osubd_core *c, char *err, size_t errlen)
{
    char *text = NULL;
    if (osubd_core_meta(c, "gateway_routes", &text, err, errlen) != 0)
        return -1;
    int rc = text != NULL ? osubd_routes_load(ctx, text, err, errlen) : 0;
    free(text);
    return rc;
}

static bool routes_dirty(void *ctx)
{
    return osubd_routes_dirty(ctx);
}

static void routes_save(void *ctx, json_t *meta)
{
    char *text = osubd_routes_save(ctx);
    if (text != NULL)
        json_object_set_new(meta, "gateway_routes", json_string(text));
    free(text);
}

static void routes_saved(void *ctx, bool ok)
{
    osubd_routes_saved(ctx, ok);
}

static void routes_forget(void *ctx, const char *id)
{
    osubd_routes_forget(ctx, id);
}

struct osubd_module osubd_routes_module(struct osubd_routes *t)
{
    struct osubd_module m = {.name = "routes",
                             .ctx = t,
                             .load = routes_load,
                             .dirty = routes_dirty,
                             .save = routes_save,
                             .saved = routes_saved,
                             .forget = routes_forget};
    return m;
}
