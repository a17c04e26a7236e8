/* fuzz_route.c - libFuzzer target: the gateway's per-service settings (src/daemon/routes.c).
 * Any JSON object as a submitted spec: osubd_route_take either refuses it with a sentence, or
 * takes nothing (and leaves the spec as it was), or returns a route whose every field is in
 * range, whose backends the destinations allow, and which, as JSON, takes back to itself. Any
 * text as a saved table: osubd_routes_load refuses it with a sentence and an untouched table,
 * or loads it; a loaded table saves, loads again and saves to the same text. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "jsonmem.h"
#include "netpolicy.h"
#include "routes.h"

/* routes.c's glue to the daemon's core (osubd_routes_module: the table loaded from the state's
 * meta) is not what is fuzzed here, and the core is no leaf: a weak stand-in for the one core
 * call that glue makes lets routes.c link without it. It is never called. */
struct osubd_core;
int osubd_core_meta(struct osubd_core *c, const char *key, char **text, char *err, size_t errlen)
    __attribute__((weak));
int osubd_core_meta(struct osubd_core *c, const char *key, char **text, char *err, size_t errlen)
{
    (void)c;
    (void)key;
    (void)text;
    (void)err;
    (void)errlen;
    abort();
}

static void check(bool ok)
{
    if (!ok)
        abort();
}

static const char *const fields[] = {"backends",         "max_inflight",        "max_queue",
                                     "queue_timeout_ms", "upstream_timeout_ms", "metrics_url"};

static bool url_ok(const char *s)
{
    size_t n = strnlen(s, OSUBD_ROUTE_URL_MAX + 1);
    return n > 7 && n <= OSUBD_ROUTE_URL_MAX && strncmp(s, "http://", 7) == 0;
}

static void check_route(const struct osubd_route *r, bool backends_only,
                        const struct osubd_destinations *dest)
{
    check(r->n_backends >= 1 && r->n_backends <= OSUBD_ROUTE_BACKENDS_MAX);
    for (int32_t i = 0; i < r->n_backends; i++) {
        check(url_ok(r->backends[i]));
        char why[400];
        check(dest == NULL || osubd_url_allowed(dest, r->backends[i], why, sizeof(why)));
    }
    for (int32_t i = r->n_backends; i < OSUBD_ROUTE_BACKENDS_MAX; i++)
        check(r->backends[i][0] == '\0');
    check(r->max_inflight == 0 || (r->max_inflight >= 1 && r->max_inflight <= 4096));
    check(r->max_queue == -1 || (r->max_queue >= 0 && r->max_queue <= 100000));
    check(r->queue_timeout_ms == 0 || (r->queue_timeout_ms >= 1 && r->queue_timeout_ms <= 600000));
    check(r->upstream_timeout_ms == 0 ||
          (r->upstream_timeout_ms >= 100 && r->upstream_timeout_ms <= 600000));
    check(strnlen(r->metrics_url, sizeof(r->metrics_url)) < sizeof(r->metrics_url));
    if (r->metrics_url[0] != '\0') {
        check(url_ok(r->metrics_url));
        char why[400];
        check(dest == NULL || osubd_url_allowed(dest, r->metrics_url, why, sizeof(why)));
    }
    if (backends_only)
        check(r->max_inflight == 0 && r->max_queue == -1 && r->queue_timeout_ms == 0 &&
              r->upstream_timeout_ms == 0 && r->metrics_url[0] == '\0');
}

static void as_spec(const json_t *spec, bool backends_only, const struct osubd_destinations *dest)
{
    json_t *copy = json_deep_copy(spec);
    if (copy == NULL)
        return;
    struct osubd_route *r = (struct osubd_route *)&copy; /* must be overwritten */
    char err[300];
    memset(err, 0, sizeof(err));
    int rc = osubd_route_take(copy, backends_only, dest, &r, err, sizeof(err));
    if (rc != 0) {
        check(rc == -1 && r == NULL);
        check(err[0] != '\0' && err[sizeof(err) - 1] == '\0'); /* a sentence, terminated */
    } else if (r == NULL) {
        check(json_equal(copy, spec)); /* nothing taken */
        check(json_object_get(spec, "backends") == NULL);
    } else {
        check_route(r, backends_only, dest);
        /* what was taken is out of the spec, the rest is still there */
        for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++)
            if (k == 0 || !backends_only)
                check(json_object_get(copy, fields[k]) == NULL);
        const char *key;
        json_t *v;
        json_object_foreach(copy, key, v)
        {
            check(json_equal(v, json_object_get(spec, key)));
        }
        /* as JSON, taken back: the same route, and nothing left over */
        json_t *j = osubd_route_json(r);
        check(j != NULL);
        struct osubd_route *r2 = NULL;
        check(osubd_route_take(j, false, NULL, &r2, err, sizeof(err)) == 0 && r2 != NULL);
        check(osubd_route_equal(r, r2));
        check(json_object_size(j) == 0);
        json_decref(j);
        free(r2);
        free(r);
    }
    json_decref(copy);
}

static void as_saved(const char *text)
{
    struct osubd_routes *t = osubd_routes_new();
    check(t != NULL);
    char err[300];
    memset(err, 0, sizeof(err));
    if (osubd_routes_load(t, text, err, sizeof(err)) != 0) {
        check(err[0] != '\0' && err[sizeof(err) - 1] == '\0');
        check(osubd_routes_count(t) == 0 && !osubd_routes_dirty(t)); /* untouched */
        osubd_routes_free(t);
        return;
    }
    check(!osubd_routes_dirty(t));
    char *s1 = osubd_routes_save(t);
    check(s1 != NULL);
    struct osubd_routes *u = osubd_routes_new();
    check(u != NULL);
    check(osubd_routes_load(u, s1, err, sizeof(err)) == 0);
    check(osubd_routes_count(u) == osubd_routes_count(t));
    char *s2 = osubd_routes_save(u);
    check(s2 != NULL && strcmp(s1, s2) == 0);
    /* every loaded route is in range (no destinations: the state's own routes) */
    json_t *o = json_loads(s1, 0, NULL);
    check(json_is_object(o));
    const char *id;
    json_t *v;
    json_object_foreach(o, id, v)
    {
        const struct osubd_route *a = osubd_routes_get(t, id), *b = osubd_routes_get(u, id);
        check(a != NULL && osubd_route_equal(a, b));
        check_route(a, false, NULL);
    }
    json_decref(o);
    free(s2);
    free(s1);
    osubd_routes_free(u);
    osubd_routes_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct osubd_destinations *dest;
    if (dest == NULL) {
        osubd_json_init();
        char err[300];
        check(osubd_parse_destinations("10.0.0.0/8,::1/128,fd00::/8,localhost,gpu-node", &dest, err,
                                       sizeof(err)) == 0);
    }
    json_t *j = json_loadb((const char *)data, size, 0, NULL);
    if (json_is_object(j)) {
        as_spec(j, false, NULL);
        as_spec(j, false, dest);
        as_spec(j, true, dest);
    }
    json_decref(j);
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    if (size)
        memcpy(text, data, size);
    text[size] = '\0';
    as_saved(text);
    free(text);
    return 0;
}
