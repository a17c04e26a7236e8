/* extender_nodes.c - oversub-scheduler's nodes: each one's oversubd and the requests to it
 * (deadlines, the in-flight cap), the pools read in the background, the nodes from the API
 * server's oversub.io/url annotation */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "extender_internal.h"

/* An http://HOST:PORT URL's host and port (80 when none): 0, or -1. */
static int parse_url(const char *url, char *host, size_t hostlen, int *port)
{
    struct evhttp_uri *u = evhttp_uri_parse(url);
    if (u == NULL)
        return -1;
    const char *sch = evhttp_uri_get_scheme(u), *h = evhttp_uri_get_host(u);
    int p = evhttp_uri_get_port(u);
    int rc = -1;
    if (sch != NULL && strcmp(sch, "http") == 0 && h != NULL && h[0] != '\0' &&
        strlen(h) < hostlen) {
        snprintf(host, hostlen, "%s", h);
        *port = p > 0 ? p : 80;
        rc = 0;
    }
    evhttp_uri_free(u);
    return rc;
}

/* ---- nodes ------------------------------------------------------------------------------- */

struct node *osub__ext_node_get(struct osub_ext *x, const char *name)
{
    json_t *i = json_object_get(x->by_name, name);
    if (i == NULL)
        return NULL;
    struct node *n = x->nodes[json_integer_value(i)];
    return n->gone ? NULL : n;
}

int osub_ext_node(struct osub_ext *x, const char *name, const char *url, char *why, size_t whylen)
{
    char host[256];
    int port;
    if (name == NULL || name[0] == '\0' || strlen(name) > 253) {
        snprintf(why, whylen, "a node name must be 1 to 253 characters");
        return -1;
    }
    if (parse_url(url, host, sizeof(host), &port) != 0) {
        snprintf(why, whylen, "node %s: '%.200s' is not an http://HOST:PORT URL", name, url);
        return -1;
    }
    json_t *i = json_object_get(x->by_name, name);
    struct node *n = i ? x->nodes[json_integer_value(i)] : NULL;
    if (n != NULL && strcmp(n->url, url) == 0) {
        n->gone = false;
        n->seen = true;
        return 0;
    }
    if (n == NULL) {
        if (x->n_nodes >= OSUB_EXT_NODES_MAX) {
            snprintf(why, whylen, "more than %d nodes", OSUB_EXT_NODES_MAX);
            return -1;
        }
        if (x->n_nodes == x->cap_nodes) {
            size_t cap = x->cap_nodes ? x->cap_nodes * 2 : 64;
            struct node **nn = realloc(x->nodes, cap * sizeof(*nn));
            if (nn == NULL) {
                snprintf(why, whylen, "out of memory");
                return -1;
            }
            x->nodes = nn;
            x->cap_nodes = cap;
        }
        n = calloc(1, sizeof(*n));
        if (n == NULL ||
            json_object_set_new(x->by_name, name, json_integer((json_int_t)x->n_nodes)) != 0) {
            free(n);
            snprintf(why, whylen, "out of memory");
            return -1;
        }
        snprintf(n->name, sizeof(n->name), "%s", name);
        x->nodes[x->n_nodes++] = n;
    }
    /* a new URL: a new connection (requests in flight on the old one finish on it) */
    struct evhttp_connection *c = evhttp_connection_base_new(x->base, NULL, host, (uint16_t)port);
    if (c == NULL) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    /* each request has its own deadline (node_send); this only ends a connection left idle */
    evhttp_connection_set_timeout(c, (int)((x->cfg.node_timeout_ms * 2 + 999) / 1000));
    evhttp_connection_set_retries(c, 0);
    if (n->conn != NULL)
        evhttp_connection_free_on_completion(n->conn);
    n->conn = c;
    snprintf(n->url, sizeof(n->url), "%s", url);
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    n->gone = false;
    n->seen = true;
    json_decref(n->pool);
    n->pool = NULL;
    n->pool_err[0] = '\0';
    return 0;
}

void osub__ext_node_req_done(struct node_req *nr)
{
    struct osub_ext *x = nr->x;
    if (nr->prev)
        nr->prev->next = nr->next;
    else
        x->reqs = nr->next;
    if (nr->next)
        nr->next->prev = nr->prev;
    nr->n->inflight--;
    if (nr->deadline)
        event_free(nr->deadline);
    free(nr);
}

/* The deadline passed: the request is cancelled (libevent calls no callback for it then) and
 * the caller told, whatever the node is doing (hung, trickling bytes, queued behind another). */
static void on_node_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct node_req *nr = arg;
    char why[700];
    snprintf(why, sizeof(why), "oversubd at %s did not answer within %lld ms", nr->n->url,
             (long long)nr->x->cfg.node_timeout_ms);
    nr->x->node_failures++;
    evhttp_cancel_request(nr->req);
    node_cb cb = nr->cb;
    void *cb_arg = nr->arg;
    osub__ext_node_req_done(nr);
    cb(cb_arg, 0, NULL, why);
}

static void on_node_answer(struct evhttp_request *req, void *arg)
{
    struct node_req *nr = arg;
    if (nr->sending) {
        /* evhttp_make_request failed before it returned (no descriptor, no route): libevent
         * frees the request after this; node_send, still running, cleans up and says so */
        nr->failed_sync = true;
        nr->req = NULL;
        return;
    }
    int code = req ? evhttp_request_get_response_code(req) : 0;
    json_t *body = NULL;
    char why[700] = "";
    if (code == 0) {
        snprintf(why, sizeof(why), "oversubd at %s is unreachable", nr->n->url);
        nr->x->node_failures++;
    } else {
        struct evbuffer *in = evhttp_request_get_input_buffer(req);
        size_t len = evbuffer_get_length(in);
        const char *p = (const char *)evbuffer_pullup(in, (ssize_t)len);
        json_error_t je;
        body = p ? json_loadb(p, len, 0, &je) : NULL;
        if (body == NULL) {
            snprintf(why, sizeof(why), "oversubd at %s answered %d without JSON", nr->n->url, code);
            nr->x->node_failures++;
        }
    }
    node_cb cb = nr->cb;
    void *cb_arg = nr->arg;
    osub__ext_node_req_done(nr);
    cb(cb_arg, code, body, why[0] ? why : NULL);
    json_decref(body);
}

int osub__ext_node_send(struct osub_ext *x, struct node *n, enum evhttp_cmd_type m,
                        const char *path, const char *body, node_cb cb, void *arg)
{
    if (n->inflight >= NODE_INFLIGHT_MAX)
        return -2; /* not keeping up: failed at once rather than queued */
    struct node_req *nr = calloc(1, sizeof(*nr));
    if (nr == NULL)
        return -1;
    nr->x = x;
    nr->n = n;
    nr->cb = cb;
    nr->arg = arg;
    struct evhttp_request *req = evhttp_request_new(on_node_answer, nr);
    nr->deadline = evtimer_new(x->base, on_node_deadline, nr);
    if (req == NULL || nr->deadline == NULL) {
        if (req != NULL)
            evhttp_request_free(req);
        if (nr->deadline != NULL)
            event_free(nr->deadline);
        free(nr);
        return -1;
    }
    nr->req = req;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char hostport[300];
    snprintf(hostport, sizeof(hostport), "%s:%d", n->host, n->port);
    evhttp_add_header(h, "Host", hostport);
    evhttp_add_header(h, "Accept", "application/json");
    if (x->token[0]) {
        char auth[600];
        snprintf(auth, sizeof(auth), "Bearer %s", x->token);
        evhttp_add_header(h, "Authorization", auth);
    }
    if (body != NULL) {
        evhttp_add_header(h, "Content-Type", "application/json");
        evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    }
    /* linked and counted first: whatever the call does, node_req_done undoes exactly this */
    n->inflight++;
    nr->next = x->reqs;
    if (x->reqs)
        x->reqs->prev = nr;
    x->reqs = nr;
    nr->sending = true;
    int rc = evhttp_make_request(n->conn, req, m, path);
    nr->sending = false;
    if (rc != 0 || nr->failed_sync) {
        /* the request is libevent's to free (it has, or will as the call unwinds) */
        int e = errno;
        x->node_failures++;
        static time_t said;
        time_t now = time(NULL);
        if (now - said >= 10) {
            osub__ext_log(
                "oversub-scheduler: node %s: a request to oversubd at %s could not be sent "
                "(%s); said once every 10 s",
                n->name, n->url, e ? strerror(e) : "connection refused at once");
            said = now;
        }
        osub__ext_node_req_done(nr);
        return -1;
    }
    struct timeval tv = {(time_t)(x->cfg.node_timeout_ms / 1000),
                         (suseconds_t)(x->cfg.node_timeout_ms % 1000) * 1000};
    evtimer_add(nr->deadline, &tv);
    return 0;
}

/* ---- pools: each node's GET /v1/pool, read in the background ------------------------------ */

static void on_pool(void *arg, int code, json_t *body, const char *why)
{
    struct node *n = arg;
    n->pool_busy = false;
    if (code < 0)
        return;
    if (code == 200 && body != NULL) {
        json_decref(n->pool);
        n->pool = json_incref(body);
        n->pool_at_ms = osub__ext_mono_ms();
        n->pool_err[0] = '\0';
    } else {
        n->pool_err_ms = osub__ext_mono_ms();
        snprintf(n->pool_err, sizeof(n->pool_err), "%s",
                 why                          ? why
                 : code == 401 || code == 403 ? "oversubd refused our token"
                                              : "oversubd answered an error");
    }
}

void osub__ext_pool_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_ext *x = arg;
    for (size_t i = 0; i < x->n_nodes; i++) {
        struct node *n = x->nodes[i];
        if (n->gone || n->pool_busy)
            continue;
        if (osub__ext_node_send(x, n, EVHTTP_REQ_GET, "/v1/pool", NULL, on_pool, n) == 0)
            n->pool_busy = true;
    }
}

/* ---- nodes from the API server: the oversub.io/url annotation ----------------------------- */

static void on_nodes(void *arg, long status, const char *body, size_t len, const char *error)
{
    struct osub_ext *x = arg;
    if (status < 0)
        return;
    x->nodes_listing = false;
    json_t *j = status == 200 ? json_loadb(body, len, 0, NULL) : NULL;
    if (j == NULL) {
        snprintf(x->nodes_err, sizeof(x->nodes_err), "listing nodes: %s",
                 error    ? error
                 : status ? "the API server answered an error"
                          : "no answer");
        osub__ext_log("oversub-scheduler: %s (HTTP %ld)", x->nodes_err, status);
        return;
    }
    x->nodes_err[0] = '\0';
    for (size_t i = 0; i < x->n_nodes; i++)
        if (x->nodes[i]->from_api)
            x->nodes[i]->seen = false;
    size_t i, added = 0;
    json_t *it;
    json_array_foreach(json_object_get(j, "items"), i, it)
    {
        const json_t *md = json_object_get(it, "metadata");
        const char *name = json_string_value(json_object_get(md, "name"));
        const char *url = json_string_value(
            json_object_get(json_object_get(md, "annotations"), "oversub.io/url"));
        if (name == NULL || url == NULL)
            continue;
        char why[300], host[256];
        int port;
        /* the token goes only to the node's own addresses: an annotation cannot send it
         * elsewhere */
        bool own = false;
        size_t k;
        json_t *ad;
        if (parse_url(url, host, sizeof(host), &port) == 0)
            json_array_foreach(json_object_get(json_object_get(it, "status"), "addresses"), k, ad)
            {
                const char *a = json_string_value(json_object_get(ad, "address"));
                own = own || (a != NULL && strcmp(a, host) == 0);
            }
        if (!own) {
            osub__ext_log(
                "oversub-scheduler: node %s: oversub.io/url %.200s is not one of the node's "
                "addresses (status.addresses): ignored",
                name, url);
            continue;
        }
        struct node *old = osub__ext_node_get(x, name);
        bool had = old != NULL && strcmp(old->url, url) == 0;
        if (osub_ext_node(x, name, url, why, sizeof(why)) != 0) {
            osub__ext_log("oversub-scheduler: node %s: %s", name, why);
            continue;
        }
        osub__ext_node_get(x, name)->from_api = true;
        added += !had;
    }
    size_t dropped = 0;
    for (size_t k = 0; k < x->n_nodes; k++) {
        struct node *n = x->nodes[k];
        if (n->from_api && !n->seen && !n->gone) {
            n->gone = true;
            dropped++;
        }
    }
    if (added || dropped)
        osub__ext_log("oversub-scheduler: nodes from the API server: %zu new or changed, %zu gone",
                      added, dropped);
    json_decref(j);
}

void osub__ext_nodes_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_ext *x = arg;
    if (x->nodes_listing || x->kube == NULL)
        return;
    if (osub_kube_request(x->kube, "GET", "/api/v1/nodes", NULL, on_nodes, x) == 0)
        x->nodes_listing = true;
}
