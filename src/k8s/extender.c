/* extender.c - oversub-scheduler: kube-scheduler's filter, prioritize, preempt and bind verbs,
 * each answered by asking the nodes' oversubd (docs/kubernetes.md) */
#define _GNU_SOURCE
#include "extender.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <sys/resource.h>

#include "conns.h"

#define BODY_MAX (16u << 20) /* a filter call for 5,000 full Node objects fits */
#define LAT_BUCKETS 12

enum verb { V_FILTER, V_PRIORITIZE, V_PREEMPT, V_BIND, V__COUNT };
static const char *const verb_names[] = {"filter", "prioritize", "preempt", "bind"};
static const double lat_bounds[LAT_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                               0.1,   0.25,   0.5,   1.0,  2.5,   5.0};

struct node {
    char name[254];
    char url[512];
    char host[256];
    int port;
    struct evhttp_connection *conn; /* keep-alive, to its oversubd */
    json_t *pool;                   /* the last GET /v1/pool (NULL: none yet) */
    int64_t pool_at_ms;             /* when it came */
    char pool_err[256];             /* the last refresh's failure, "" when it answered */
    int64_t pool_err_ms;            /* when that failure came */
    bool pool_busy;
    bool from_api, seen; /* found through a Node object; seen in the last listing */
    bool gone;           /* dropped from the listing: kept while requests fly */
    int inflight;        /* requests sent and not yet answered */
    uint64_t gen;        /* bumped by each bind to it: decisions cached before are stale */
};

#define NODE_INFLIGHT_MAX 8 /* more outstanding on one node: it is not keeping up */
#define BIND_BUDGET_MS 4500 /* a bind answers inside kube-scheduler's 5 s */

struct node_req;

struct osub_ext {
    struct osub_ext_config cfg;
    struct event_base *base;
    struct evhttp *http;
    struct node **nodes;
    size_t n_nodes, cap_nodes;
    json_t *by_name;   /* node name -> index */
    json_t *decisions; /* "uid node" -> {"d": decision, "at", "spec"} */
    struct osub_kube *kube;
    struct node_req *reqs; /* every request to a node not yet answered */
    char token[512];
    struct event *pool_ev, *nodes_ev, *sweep_ev;
    bool nodes_listing;
    char nodes_err[256];
    /* metrics */
    uint64_t calls[V__COUNT], errors[V__COUNT];
    uint64_t lat[V__COUNT][LAT_BUCKETS + 1];
    double lat_sum[V__COUNT];
    uint64_t node_asks, node_cached, node_failures;
    uint64_t accept_refused; /* connections not accepted for want of descriptors */
    uint64_t binds_ok, binds_failed, releases, preempt_degrade_only;
};

/* ---- small helpers ---------------------------------------------------------------------- */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void reply_text(struct evhttp_request *req, int code, const char *ctype, const char *text)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL || evbuffer_add(b, text, strlen(text)) != 0) {
        if (b)
            evbuffer_free(b);
        evhttp_send_reply(req, 503, "Service Unavailable", NULL);
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    evhttp_send_reply(req, code, code == 200 ? "OK" : "Error", b);
    evbuffer_free(b);
}

/* Sends j (taken) as the answer. */
static void reply_json(struct evhttp_request *req, int code, json_t *j)
{
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (t == NULL) {
        evhttp_send_reply(req, 503, "Service Unavailable", NULL);
        return;
    }
    size_t n = strlen(t);
    char *t2 = realloc(t, n + 2);
    if (t2 != NULL) {
        t = t2;
        t[n] = '\n';
        t[n + 1] = '\0';
    }
    reply_text(req, code, "application/json", t);
    free(t);
}

static void reply_error(struct evhttp_request *req, int code, const char *msg)
{
    reply_json(req, code, json_pack("{s:s}", "error", msg));
}

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

static struct node *node_get(struct osub_ext *x, const char *name)
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

/* One request to a node's oversubd; cb(arg, code, body JSON or NULL, why) once. */
typedef void (*node_cb)(void *arg, int code, json_t *body, const char *why);
struct node_req {
    struct osub_ext *x;
    struct node *n;
    node_cb cb;
    void *arg;
    struct evhttp_request *req;
    struct event *deadline; /* the whole answer within node_timeout_ms, however it trickles */
    struct node_req *prev, *next;
    bool sending;     /* inside evhttp_make_request: a callback now is a synchronous failure */
    bool failed_sync; /* ... which node_send reports itself (-1); the caller's cb is not run */
};

static void node_req_done(struct node_req *nr)
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
    node_req_done(nr);
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
    node_req_done(nr);
    cb(cb_arg, code, body, why[0] ? why : NULL);
    json_decref(body);
}

static int node_send(struct osub_ext *x, struct node *n, enum evhttp_cmd_type m, const char *path,
                     const char *body, node_cb cb, void *arg)
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
            logf_("oversub-scheduler: node %s: a request to oversubd at %s could not be sent "
                  "(%s); said once every 10 s",
                  n->name, n->url, e ? strerror(e) : "connection refused at once");
            said = now;
        }
        node_req_done(nr);
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
        n->pool_at_ms = mono_ms();
        n->pool_err[0] = '\0';
    } else {
        n->pool_err_ms = mono_ms();
        snprintf(n->pool_err, sizeof(n->pool_err), "%s",
                 why                          ? why
                 : code == 401 || code == 403 ? "oversubd refused our token"
                                              : "oversubd answered an error");
    }
}

static void pool_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_ext *x = arg;
    for (size_t i = 0; i < x->n_nodes; i++) {
        struct node *n = x->nodes[i];
        if (n->gone || n->pool_busy)
            continue;
        if (node_send(x, n, EVHTTP_REQ_GET, "/v1/pool", NULL, on_pool, n) == 0)
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
        logf_("oversub-scheduler: %s (HTTP %ld)", x->nodes_err, status);
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
            logf_("oversub-scheduler: node %s: oversub.io/url %.200s is not one of the node's "
                  "addresses (status.addresses): ignored",
                  name, url);
            continue;
        }
        struct node *old = node_get(x, name);
        bool had = old != NULL && strcmp(old->url, url) == 0;
        if (osub_ext_node(x, name, url, why, sizeof(why)) != 0) {
            logf_("oversub-scheduler: node %s: %s", name, why);
            continue;
        }
        node_get(x, name)->from_api = true;
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
        logf_("oversub-scheduler: nodes from the API server: %zu new or changed, %zu gone", added,
              dropped);
    json_decref(j);
}

static void nodes_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_ext *x = arg;
    if (x->nodes_listing || x->kube == NULL)
        return;
    if (osub_kube_request(x->kube, "GET", "/api/v1/nodes", NULL, on_nodes, x) == 0)
        x->nodes_listing = true;
}

/* ---- decisions: a node's dry run for a pod, cached --------------------------------------- */

static void cache_key(char *out, size_t outlen, const char *uid, const char *node)
{
    snprintf(out, outlen, "%s %s", uid, node);
}

/* The cached decision of node for the pod, if fresh and for the same spec. */
static json_t *cached(struct osub_ext *x, const char *uid, struct node *n, const json_t *spec)
{
    char k[400];
    cache_key(k, sizeof(k), uid, n->name);
    json_t *c = json_object_get(x->decisions, k);
    if (c == NULL)
        return NULL;
    if (mono_ms() - json_integer_value(json_object_get(c, "at")) > x->cfg.cache_ms ||
        (uint64_t)json_integer_value(json_object_get(c, "gen")) != n->gen ||
        !json_equal(json_object_get(c, "spec"), spec))
        return NULL;
    return json_object_get(c, "d");
}

static void sweep_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_ext *x = arg;
    int64_t now = mono_ms();
    const char *k;
    json_t *v, *tmp;
    json_object_foreach_safe(x->decisions, tmp, k, v)
    {
        if (now - json_integer_value(json_object_get(v, "at")) > x->cfg.cache_ms)
            json_object_del(x->decisions, k);
    }
}

/* ---- one verb's call --------------------------------------------------------------------- */

struct call {
    struct osub_ext *x;
    struct evhttp_request *req;
    enum verb verb;
    double started;
    json_t *args;  /* the request */
    json_t *pod;   /* borrowed from args */
    json_t *spec;  /* oversub's spec for the pod, NULL when it asks for nothing */
    char uid[128]; /* the pod's */
    char pod_name[320];
    json_t *names;   /* the nodes asked about, in order */
    json_t *answers; /* node -> decision, or {"error": why} */
    json_t *held;    /* preempt: node -> the pod UIDs its oversubd holds */
    size_t waiting;
    char bad_pod[400]; /* why the pod cannot be read ("" when it can) */
    /* bind */
    char bind_node[254], bind_ns[64], bind_name[254];
    json_t *bind_decision;
    bool bind_created; /* this bind's submit made the service (a failure releases only that) */
};

static void call_free(struct call *c)
{
    if (c->req != NULL)
        evhttp_connection_set_closecb(evhttp_request_get_connection(c->req), NULL, NULL);
    json_decref(c->args);
    json_decref(c->spec);
    json_decref(c->names);
    json_decref(c->answers);
    json_decref(c->held);
    json_decref(c->bind_decision);
    free(c);
}

static void call_done(struct call *c, int code, json_t *body)
{
    struct osub_ext *x = c->x;
    double took = mono_s() - c->started;
    x->calls[c->verb]++;
    int b = 0;
    while (b < LAT_BUCKETS && took > lat_bounds[b])
        b++;
    x->lat[c->verb][b]++;
    x->lat_sum[c->verb] += took;
    if (code != 200 || json_string_length(json_object_get(body, "Error")) > 0)
        x->errors[c->verb]++;
    if (c->req != NULL) {
        evhttp_connection_set_closecb(evhttp_request_get_connection(c->req), NULL, NULL);
        reply_json(c->req, code, body);
    } else {
        json_decref(body); /* kube-scheduler gave up (its timeout): nobody to answer */
    }
    call_free(c);
}

/* kube-scheduler closed the connection before the answer: the call goes on (a bind must still
 * release what it reserved) and its answer is dropped. */
static void on_client_close(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    struct call *c = arg;
    c->req = NULL;
}

/* An answer of a node: what its oversubd would do with the pod. */
static void on_dry(void *arg, int code, json_t *body, const char *why);

struct ask {
    struct call *c;
    char node[254];
    uint64_t gen; /* the node's when asked */
};

static void finish(struct call *c);

/* preempt: which pods a node's oversubd holds (GET /v1/services). */
static void on_services(void *arg, int code, json_t *body, const char *why)
{
    (void)why;
    struct ask *a = arg;
    struct call *c = a->c;
    if (code < 0) {
        free(a);
        if (--c->waiting == 0)
            call_free(c);
        return;
    }
    if (code == 200) {
        json_t *uids = json_array();
        size_t i;
        json_t *sv;
        json_array_foreach(json_object_get(body, "services"), i, sv)
        {
            json_t *u = json_object_get(json_object_get(sv, "kubernetes"), "uid");
            if (json_is_string(u))
                json_array_append(uids, u);
        }
        json_object_set_new(c->held, a->node, uids);
    }
    free(a);
    if (--c->waiting == 0)
        finish(c);
}

static void finish(struct call *c);

static void ask_nodes(struct call *c)
{
    struct osub_ext *x = c->x;
    char *text = json_dumps(c->spec, JSON_COMPACT);
    size_t i;
    json_t *nm;
    c->waiting = 1; /* held until every ask is out */
    json_array_foreach(c->names, i, nm)
    {
        const char *name = json_string_value(nm);
        if (json_object_get(c->answers, name) != NULL)
            continue;
        struct node *n = node_get(x, name);
        if (n == NULL) {
            json_object_set_new(
                c->answers, name,
                json_pack("{s:s, s:b}", "error",
                          "no oversubd known on this node (no oversub.io/url annotation and no "
                          "--node)",
                          "unresolvable", 1));
            continue;
        }
        json_t *d = cached(x, c->uid, n, c->spec);
        if (d != NULL) {
            x->node_cached++;
            json_object_set(c->answers, name, d);
            continue;
        }
        if (n->pool_err[0] && n->pool == NULL) {
            /* never answered a pool read: not waited for again on each pod */
            char why[400];
            snprintf(why, sizeof(why), "%s (its last pool read, %lld s ago; it has never answered)",
                     n->pool_err, (long long)((mono_ms() - n->pool_err_ms) / 1000));
            json_object_set_new(c->answers, name, json_pack("{s:s}", "error", why));
            continue;
        }
        struct ask *a = calloc(1, sizeof(*a));
        if (a == NULL || text == NULL) {
            free(a);
            json_object_set_new(c->answers, name, json_pack("{s:s}", "error", "out of memory"));
            continue;
        }
        a->c = c;
        snprintf(a->node, sizeof(a->node), "%s", name);
        a->gen = n->gen;
        x->node_asks++;
        c->waiting++;
        /* asked once per call, however often the name is listed */
        json_object_set_new(c->answers, name, json_pack("{s:s}", "error", "asking"));
        int rc = node_send(x, n, EVHTTP_REQ_POST, "/v1/services?dry_run=1", text, on_dry, a);
        if (rc != 0) {
            c->waiting--;
            free(a);
            char why[700];
            if (rc == -2)
                snprintf(why, sizeof(why),
                         "oversubd at %s has %d requests outstanding: it is not keeping up", n->url,
                         NODE_INFLIGHT_MAX);
            else
                snprintf(why, sizeof(why), "cannot reach oversubd at %s", n->url);
            json_object_set_new(c->answers, name, json_pack("{s:s}", "error", why));
        }
    }
    free(text);
    /* preempt: also which pods each node holds, to tell kube-scheduler's victims on oversub's
     * GPUs from those it chose for other resources */
    json_array_foreach(c->names, i, nm)
    {
        struct node *n;
        struct ask *a;
        if (c->verb != V_PREEMPT || !x->cfg.scheduler_counts_vram ||
            (n = node_get(x, json_string_value(nm))) == NULL || (a = calloc(1, sizeof(*a))) == NULL)
            continue;
        a->c = c;
        snprintf(a->node, sizeof(a->node), "%s", json_string_value(nm));
        c->waiting++;
        if (node_send(x, n, EVHTTP_REQ_GET, "/v1/services", NULL, on_services, a) != 0) {
            c->waiting--;
            free(a);
        }
    }
    if (--c->waiting == 0)
        finish(c);
}

static void on_dry(void *arg, int code, json_t *body, const char *why)
{
    struct ask *a = arg;
    struct call *c = a->c;
    struct osub_ext *x = c->x;
    json_t *d = NULL;
    if (code < 0) { /* stopping: nobody is answered */
        free(a);
        if (--c->waiting == 0)
            call_free(c);
        return;
    }
    if (why != NULL) {
        d = json_pack("{s:s}", "error", why);
    } else if (code == 200 || code == 409) {
        d = json_incref(json_object_get(body, "decision"));
        if (d == NULL)
            d = json_pack("{s:s}", "error", "oversubd answered without a decision");
    } else {
        const char *msg =
            json_string_value(json_object_get(json_object_get(body, "error"), "message"));
        char t[400];
        snprintf(t, sizeof(t), "oversubd answered %d: %s", code, msg ? msg : "no reason given");
        /* a spec the node refuses (422, 400): no other pod could change that */
        d = json_pack("{s:s, s:b}", "error", t, "unresolvable", code == 422 || code == 400);
    }
    if (d != NULL) {
        if (json_object_get(d, "error") == NULL) {
            char k[400];
            cache_key(k, sizeof(k), c->uid, a->node);
            json_object_set_new(x->decisions, k,
                                json_pack("{s:O, s:I, s:O, s:I}", "d", d, "at",
                                          (json_int_t)mono_ms(), "spec", c->spec, "gen",
                                          (json_int_t)a->gen));
        }
        json_object_set_new(c->answers, a->node, d);
    }
    free(a);
    if (--c->waiting == 0)
        finish(c);
}

static bool is_evict(const json_t *victim)
{
    const char *a = json_string_value(json_object_get(victim, "action"));
    return a != NULL && strcmp(a, "evict") == 0;
}

/* ---- what a decision means to kube-scheduler --------------------------------------------- */

/* 1: the pod starts there (or after victims); 0: it does not, and preemption of lower-priority
 * pods might help; -1: it does not, and nothing kube-scheduler may do helps. why: the node's
 * own reason. */
static int verdict(const json_t *d, char *why, size_t whylen)
{
    const char *err = json_string_value(json_object_get(d, "error"));
    if (err != NULL) {
        snprintf(why, whylen, "%s", err);
        return json_is_true(json_object_get(d, "unresolvable")) ? -1 : 0;
    }
    const char *out = json_string_value(json_object_get(d, "outcome"));
    if (out == NULL) {
        snprintf(why, whylen, "oversubd answered an unknown decision");
        return 0;
    }
    if (strcmp(out, "started") == 0 || strcmp(out, "pending") == 0 || strcmp(out, "exists") == 0)
        return 1;
    const char *check = json_string_value(json_object_get(d, "check"));
    const char *code = json_string_value(json_object_get(d, "code"));
    const char *msg = json_string_value(json_object_get(d, "message"));
    json_int_t gpu = json_integer_value(json_object_get(d, "gpu"));
    json_int_t short_mib = json_integer_value(json_object_get(d, "shortfall_mib"));
    if (code != NULL && strcmp(code, "no_room") != 0) {
        /* refused outright: too big for any GPU here, too many GPUs, a class it does not
         * know... no eviction changes that */
        snprintf(why, whylen, "oversub: %s", msg ? msg : code);
        return -1;
    }
    if (json_object_get(d, "shortfall_mib") != NULL)
        snprintf(why, whylen,
                 "oversub: no room even after degrading and evicting what this pod may displace "
                 "(%s check, GPU %lld short by %lld MiB)",
                 check ? check : "capacity", (long long)gpu, (long long)short_mib);
    else
        snprintf(why, whylen, "oversub: no room even after what this pod may displace (%s check)",
                 check ? check : "capacity");
    /* oversub's plan already counted every service this pod may displace on the node: only
     * services leaving on their own could make room, which preemption cannot hurry */
    return -1;
}

/* The engine's order, as a band and a place in it: started (by placement: the fuller the GPU
 * after it, the better, as oversub packs), then degrade-only, then evictions (the least
 * important touched, fewest evictions, fewest degrades, least restart cost). */
struct rank {
    int band; /* 3 started, 2 degrade-only, 1 evicts, 0 fails */
    double key[4];
};

static double fill_after(const json_t *d, const json_t *spec)
{
    const json_t *g = json_object_get(d, "gpu_now");
    double usable = (double)json_integer_value(json_object_get(g, "usable_mib"));
    double held = (double)json_integer_value(json_object_get(g, "held_mib"));
    int64_t gpus = json_integer_value(json_object_get(spec, "gpus"));
    double share = (double)json_integer_value(json_object_get(spec, "vram_mib")) /
                   (double)(gpus > 0 ? gpus : 1);
    if (usable <= 0)
        return 0;
    double f = (held + share) / usable;
    return f > 1 ? 1 : f < 0 ? 0 : f;
}

static struct rank rank_of(const json_t *d, const json_t *spec)
{
    struct rank r = {0, {0, 0, 0, 0}};
    char why[8];
    if (d == NULL || verdict(d, why, sizeof(why)) != 1)
        return r;
    const json_t *v = json_object_get(d, "victims");
    if (json_array_size(v) == 0) {
        r.band = 3;
        r.key[0] = fill_after(d, spec);
        return r;
    }
    int evictions = 0, degrades = 0, top_level = 1000;
    double cost = 0;
    size_t i;
    json_t *vi;
    json_array_foreach(v, i, vi)
    {
        bool ev = is_evict(vi);
        int lvl = (int)json_integer_value(json_object_get(vi, "level"));
        if (ev) {
            evictions++;
            cost += (double)json_integer_value(json_object_get(vi, "restart_cost_ms"));
            if (lvl < top_level)
                top_level = lvl;
        } else {
            degrades++;
        }
    }
    if (evictions == 0) {
        r.band = 2;
        r.key[0] = -degrades;
        r.key[1] = fill_after(d, spec);
        return r;
    }
    r.band = 1;
    r.key[0] = top_level; /* a higher level number is a less important service */
    r.key[1] = -evictions;
    r.key[2] = -degrades;
    r.key[3] = -cost;
    return r;
}

static int rank_cmp(const struct rank *a, const struct rank *b)
{
    if (a->band != b->band)
        return a->band < b->band ? -1 : 1;
    for (int i = 0; i < 4; i++)
        if (a->key[i] != b->key[i])
            return a->key[i] < b->key[i] ? -1 : 1;
    return 0;
}

/* Bands of scores: started 6-10, degrade-only 4-5, evictions 1-3, fails 0; within a band the
 * best node gets the top and the others spread below by their place among the band's distinct
 * keys (sorted once: O(n log n) for 1,000s of nodes). */
static const struct rank *sort_ranks;

static int by_rank_desc(const void *a, const void *b)
{
    return rank_cmp(&sort_ranks[*(const size_t *)b], &sort_ranks[*(const size_t *)a]);
}

static void scores(struct call *c, int64_t *out)
{
    size_t n = json_array_size(c->names);
    struct rank *r = calloc(n ? n : 1, sizeof(*r));
    size_t *ix = calloc(n ? n : 1, sizeof(*ix));
    size_t *place = calloc(n ? n : 1, sizeof(*place));
    if (r == NULL || ix == NULL || place == NULL) {
        for (size_t i = 0; i < n; i++)
            out[i] = 0;
        free(r);
        free(ix);
        free(place);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        r[i] = rank_of(json_object_get(c->answers, json_string_value(json_array_get(c->names, i))),
                       c->spec);
        ix[i] = i;
    }
    sort_ranks = r;
    qsort(ix, n, sizeof(*ix), by_rank_desc); /* best first: bands in order, keys within */
    size_t distinct[4] = {0, 0, 0, 0};
    for (size_t k = 0; k < n; k++) {
        size_t i = ix[k];
        if (k == 0 || r[ix[k - 1]].band != r[i].band || rank_cmp(&r[ix[k - 1]], &r[i]) != 0)
            distinct[r[i].band]++;
        place[i] = distinct[r[i].band] - 1; /* 0: the band's best */
    }
    static const int lo[4] = {0, 1, 4, 6}, hi[4] = {0, 3, 5, 10};
    for (size_t i = 0; i < n; i++) {
        int b = r[i].band, span = hi[b] - lo[b];
        size_t nd = distinct[b];
        out[i] =
            nd <= 1 ? hi[b] : hi[b] - (int64_t)llround((double)place[i] * span / (double)(nd - 1));
    }
    free(r);
    free(ix);
    free(place);
}

/* ---- the verbs' answers ------------------------------------------------------------------ */

static void finish_filter(struct call *c)
{
    json_t *pass = json_array(), *failed = json_object(), *unres = json_object();
    size_t i;
    json_t *nm;
    json_array_foreach(c->names, i, nm)
    {
        const char *name = json_string_value(nm);
        char why[512];
        int v;
        if (c->bad_pod[0]) {
            snprintf(why, sizeof(why), "%s", c->bad_pod);
            v = -1;
        } else if (c->spec == NULL) {
            v = 1; /* it asks nothing of oversub */
        } else {
            v = verdict(json_object_get(c->answers, name), why, sizeof(why));
        }
        if (v == 1)
            json_array_append(pass, nm);
        else
            json_object_set_new(v == 0 ? failed : unres, name, json_string(why));
    }
    logf_("oversub-scheduler: filter %s: %zu of %zu nodes pass, %zu failed, %zu unresolvable",
          c->pod_name, json_array_size(pass), json_array_size(c->names), json_object_size(failed),
          json_object_size(unres));
    json_t *res = json_object();
    /* nodeCacheCapable: names; else the Node objects that passed, as given */
    json_t *nodes = osub_json_get_ci(c->args, "Nodes");
    if (json_is_object(nodes)) {
        json_t *items = json_array();
        json_array_foreach(json_object_get(nodes, "items"), i, nm)
        {
            const char *name =
                json_string_value(json_object_get(json_object_get(nm, "metadata"), "name"));
            size_t k;
            json_t *p;
            json_array_foreach(pass, k, p)
            {
                if (name && strcmp(json_string_value(p), name) == 0) {
                    json_array_append(items, nm);
                    break;
                }
            }
        }
        json_object_set_new(res, "Nodes", json_pack("{s:{}, s:o}", "metadata", "items", items));
        json_object_set_new(res, "NodeNames", json_null());
        json_decref(pass);
    } else {
        json_object_set_new(res, "Nodes", json_null());
        json_object_set_new(res, "NodeNames", pass);
    }
    json_object_set_new(res, "FailedNodes", failed);
    json_object_set_new(res, "FailedAndUnresolvableNodes", unres);
    json_object_set_new(res, "Error", json_string(""));
    call_done(c, 200, res);
}

static void finish_prioritize(struct call *c)
{
    size_t n = json_array_size(c->names);
    int64_t *sc = calloc(n ? n : 1, sizeof(*sc));
    json_t *out = json_array();
    if (sc != NULL && c->spec != NULL && !c->bad_pod[0])
        scores(c, sc);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(out, json_pack("{s:O, s:I}", "Host", json_array_get(c->names, i),
                                             "Score", (json_int_t)(sc ? sc[i] : 0)));
    free(sc);
    call_done(c, 200, out);
}

/* The UIDs kube-scheduler proposed for a node (meta victims, or full pods). */
static json_t *proposed_uids(const json_t *v)
{
    json_t *out = json_array();
    size_t i;
    json_t *p;
    json_array_foreach(osub_json_get_ci(v, "Pods"), i, p)
    {
        const char *uid = json_string_value(osub_json_get_ci(p, "UID"));
        if (uid == NULL)
            uid = json_string_value(json_object_get(json_object_get(p, "metadata"), "uid"));
        if (uid != NULL)
            json_array_append_new(out, json_string(uid));
    }
    return out;
}

static json_t *victim_map(const json_t *args)
{
    json_t *m = osub_json_get_ci(args, "NodeNameToMetaVictims");
    if (!json_is_object(m))
        m = osub_json_get_ci(args, "NodeNameToVictims");
    return json_is_object(m) ? m : NULL;
}

static bool uid_in(const json_t *arr, const char *uid, const char *key)
{
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        const char *u = json_string_value(key ? json_object_get(e, key) : e);
        if (u != NULL && strcmp(u, uid) == 0)
            return true;
    }
    return false;
}

/* Per node: where oversub would not start the pod, the node is dropped. Where it would, the
 * victims kube-scheduler chose stand: with ignoredByScheduler (the shipped configuration) they
 * were chosen for what kube-scheduler counts itself (CPU, memory), and oversub's own victims
 * are evicted by the node at bind, degrade first, with their grace and their disruption budgets
 * (kube-scheduler would merely delete them). With --scheduler-counts-vram, kube-scheduler also
 * counted oversub.io/vram-mib itself, naively: its victims that are pods on oversub's GPUs and
 * that oversub would not evict are spared. A node left with no victim is dropped; nodes oversub
 * makes room on by degrading only are counted apart. */
static void finish_preempt(struct call *c)
{
    struct osub_ext *x = c->x;
    json_t *out = json_object();
    json_t *in = victim_map(c->args);
    const char *name;
    json_t *v;
    size_t kept = 0, degrade_only = 0, dropped = 0, spared = 0;
    json_object_foreach(in, name, v)
    {
        json_t *sched = proposed_uids(v);
        json_t *pods = json_array();
        int64_t pdb = json_integer_value(osub_json_get_ci(v, "NumPDBViolations"));
        bool keep_all = c->spec == NULL && !c->bad_pod[0]; /* asks nothing of oversub */
        json_t *d = json_object_get(c->answers, name);
        char why[512] = "";
        if (!keep_all && !c->bad_pod[0] && verdict(d, why, sizeof(why)) == 1) {
            size_t k, evictions = 0;
            json_t *u;
            json_array_foreach(json_object_get(d, "victims"), k, u) evictions += is_evict(u);
            if (evictions == 0 && json_array_size(json_object_get(d, "victims")) > 0)
                degrade_only++;
            json_t *held = x->cfg.scheduler_counts_vram ? json_object_get(c->held, name) : NULL;
            json_array_foreach(sched, k, u)
            {
                const char *uid = json_string_value(u);
                bool oversub_evicts = false;
                size_t j;
                json_t *w;
                json_array_foreach(json_object_get(d, "victims"), j, w)
                {
                    const char *pu = json_string_value(json_object_get(w, "pod_uid"));
                    oversub_evicts = oversub_evicts || (is_evict(w) && pu && strcmp(pu, uid) == 0);
                }
                if (held != NULL && uid_in(held, uid, NULL) && !oversub_evicts) {
                    spared++; /* on oversub's GPUs, and oversub says it need not go */
                    continue;
                }
                json_array_append_new(pods, json_pack("{s:O}", "UID", u));
            }
        } else if (keep_all) {
            size_t k;
            json_t *u;
            json_array_foreach(sched, k, u)
                json_array_append_new(pods, json_pack("{s:O}", "UID", u));
        } else if (why[0]) {
            logf_("oversub-scheduler: preempt %s: %s dropped: %s", c->pod_name, name, why);
        }
        if (json_array_size(pods) > 0) {
            json_object_set_new(
                out, name,
                json_pack("{s:o, s:I}", "Pods", pods, "NumPDBViolations", (json_int_t)pdb));
            kept++;
        } else {
            json_decref(pods);
            dropped++;
        }
        json_decref(sched);
    }
    x->preempt_degrade_only += degrade_only;
    logf_("oversub-scheduler: preempt %s: %zu nodes kept, %zu dropped, %zu of kube-scheduler's "
          "victims spared on oversub's GPUs; %zu degrade-only (oversub makes room there by "
          "degrading, no pod of its need go)",
          c->pod_name, kept, dropped, spared, degrade_only);
    call_done(c, 200, json_pack("{s:o}", "NodeNameToMetaVictims", out));
}

static void finish(struct call *c)
{
    switch (c->verb) {
    case V_FILTER:
        finish_filter(c);
        break;
    case V_PRIORITIZE:
        finish_prioritize(c);
        break;
    case V_PREEMPT:
        finish_preempt(c);
        break;
    default:
        call_done(c, 500, json_pack("{s:s}", "Error", "internal: no such verb"));
    }
}

/* ---- bind: the grant reserved on the node, then the Binding ------------------------------ */

static void on_release(void *arg, int code, json_t *body, const char *why)
{
    (void)body;
    struct osub_ext *x = arg;
    if (code < 0)
        return;
    if (code == 200 || code == 404)
        x->releases++;
    else
        logf_("oversub-scheduler: releasing a reservation failed: %s",
              why ? why : "oversubd answered an error");
}

static void release_on_node(struct call *c)
{
    if (!c->bind_created) { /* it was there before this bind: not this bind's to release */
        logf_("oversub-scheduler: %s was on %s before this bind: left as it is", c->pod_name,
              c->bind_node);
        return;
    }
    struct node *n = node_get(c->x, c->bind_node);
    if (n != NULL)
        n->gen++; /* what was cached while the reservation held is stale again */
    char path[200];
    snprintf(path, sizeof(path), "/v1/services/%s",
             json_string_value(json_object_get(c->spec, "id")));
    if (n == NULL || node_send(c->x, n, EVHTTP_REQ_DELETE, path, NULL, on_release, c->x) != 0)
        logf_("oversub-scheduler: cannot release %s on %s", path, c->bind_node);
}

static void bind_fail(struct call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bind_fail(struct call *c, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    c->x->binds_failed++;
    logf_("oversub-scheduler: bind %s to %s failed: %s", c->pod_name, c->bind_node, msg);
    call_done(c, 200, json_pack("{s:s}", "Error", msg));
}

/* What is left of a bind's budget for its next API request (at least 100 ms). */
static long bind_left_ms(const struct call *c)
{
    long left = (long)(BIND_BUDGET_MS - (mono_s() - c->started) * 1000.0);
    return left < 100 ? 100 : left;
}

static void bound_ok(struct call *c)
{
    c->x->binds_ok++;
    const char *out = json_string_value(json_object_get(c->bind_decision, "outcome"));
    logf_("oversub-scheduler: bound %s to %s (oversub: %s, %zu victims)", c->pod_name, c->bind_node,
          out ? out : "?", json_array_size(json_object_get(c->bind_decision, "victims")));
    call_done(c, 200, json_pack("{s:s}", "Error", ""));
}

/* The Binding's answer was lost (a timeout, a 5xx): the pod itself says whether it went
 * through, before the reservation is kept or released. */
static void on_binding_check(void *arg, long status, const char *body, size_t len,
                             const char *error)
{
    struct call *c = arg;
    if (status < 0) {
        call_free(c);
        return;
    }
    json_t *pod = status == 200 ? json_loadb(body, len, 0, NULL) : NULL;
    const char *uid = json_string_value(json_object_get(json_object_get(pod, "metadata"), "uid"));
    const char *node = json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
    bool seen = pod != NULL && uid != NULL; /* the pod was read: its binding is known */
    bool same = seen && strcmp(uid, c->uid) == 0;
    bool bound = same && node != NULL && strcmp(node, c->bind_node) == 0;
    json_decref(pod);
    if (bound) {
        logf_("oversub-scheduler: the Binding of %s went through though its answer was lost",
              c->pod_name);
        bound_ok(c);
        return;
    }
    if (status == 404 ||
        (seen && (!same || node == NULL || node[0] == '\0' || strcmp(node, c->bind_node) != 0))) {
        release_on_node(c);
        bind_fail(c,
                  "the Binding's answer was lost (%s) and the pod is not bound to %s; the "
                  "reservation is released",
                  error ? error : "an error", c->bind_node);
        return;
    }
    /* neither answer came: whether it is bound is unknown, so the reservation stays (the node
     * releases it once the pod is seen bound nowhere, or elsewhere) */
    bind_fail(c,
              "the Binding's outcome is unknown (%s, and the pod could not be read); the "
              "reservation on %s is kept until its node sees where the pod went",
              error ? error : "no answer", c->bind_node);
}

static void on_binding(void *arg, long status, const char *body, size_t len, const char *error)
{
    struct call *c = arg;
    if (status < 0) { /* stopping */
        call_free(c);
        return;
    }
    if (status == 0 || status >= 500) {
        char path[600];
        snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", c->bind_ns, c->bind_name);
        if (osub_kube_request_within(c->x->kube, "GET", path, NULL, bind_left_ms(c),
                                     on_binding_check, c) == 0)
            return;
    }
    if (status == 201 || status == 200) {
        bound_ok(c);
        return;
    }
    /* no Binding: the reservation goes, so the node's memory is not held for a pod that is
     * not there */
    json_t *j = json_loadb(body, len, 0, NULL);
    const char *msg = json_string_value(json_object_get(j, "message"));
    char m[400];
    snprintf(m, sizeof(m), "%s", msg ? msg : error ? error : "no reason given");
    json_decref(j);
    release_on_node(c);
    bind_fail(c,
              "the API server refused the Binding (HTTP %ld: %s); the reservation on %s is "
              "released",
              status, m, c->bind_node);
}

static void on_submit(void *arg, int code, json_t *body, const char *why)
{
    struct call *c = arg;
    struct osub_ext *x = c->x;
    if (code < 0) {
        call_free(c);
        return;
    }
    json_t *dec = json_object_get(body, "decision");
    const char *out = json_string_value(json_object_get(dec, "outcome"));
    if (why != NULL) {
        bind_fail(c, "%s", why);
        return;
    }
    if (!(code == 201 || code == 202 || code == 200) || out == NULL ||
        !(strcmp(out, "started") == 0 || strcmp(out, "pending") == 0 ||
          strcmp(out, "exists") == 0)) {
        const char *msg =
            json_string_value(json_object_get(json_object_get(body, "error"), "message"));
        char v[512] = "";
        if (dec != NULL)
            verdict(dec, v, sizeof(v));
        bind_fail(c, "oversubd on %s refused the pod (HTTP %d): %s", c->bind_node, code,
                  v[0]  ? v
                  : msg ? msg
                        : "no reason given");
        return;
    }
    c->bind_decision = json_incref(dec);
    c->bind_created = strcmp(out, "exists") != 0;
    /* the node now holds the grant: the Binding makes the pod the node's */
    json_t *binding =
        json_pack("{s:s, s:s, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:s}}", "apiVersion", "v1", "kind",
                  "Binding", "metadata", "name", c->bind_name, "namespace", c->bind_ns, "uid",
                  c->uid, "target", "apiVersion", "v1", "kind", "Node", "name", c->bind_node);
    char *text = binding ? json_dumps(binding, JSON_COMPACT) : NULL;
    json_decref(binding);
    char path[600];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s/binding", c->bind_ns, c->bind_name);
    if (text == NULL || osub_kube_request_within(x->kube, "POST", path, text, bind_left_ms(c),
                                                 on_binding, c) != 0) {
        free(text);
        release_on_node(c);
        bind_fail(c, "out of memory");
        return;
    }
    free(text);
}

static void bind_submit(struct call *c)
{
    struct osub_ext *x = c->x;
    if (mono_s() - c->started > BIND_BUDGET_MS / 1000.0) {
        bind_fail(c, "the API server took the bind's %d ms before the node could be asked",
                  BIND_BUDGET_MS);
        return;
    }
    struct node *n = node_get(x, c->bind_node);
    if (n == NULL) {
        bind_fail(c, "no oversubd known on node %s", c->bind_node);
        return;
    }
    json_t *k = json_object_get(c->spec, "kubernetes");
    json_object_set_new(k, "node", json_string(c->bind_node));
    n->gen++; /* what was cached about this node no longer holds, bound or not */
    char *text = json_dumps(c->spec, JSON_COMPACT);
    if (text == NULL || node_send(x, n, EVHTTP_REQ_POST, "/v1/services", text, on_submit, c) != 0)
        bind_fail(c, "cannot reach oversubd on %s", c->bind_node);
    free(text);
}

static void on_pod_read(void *arg, long status, const char *body, size_t len, const char *error)
{
    struct call *c = arg;
    if (status < 0) { /* stopping */
        call_free(c);
        return;
    }
    json_t *pod = status == 200 ? json_loadb(body, len, 0, NULL) : NULL;
    char why[300];
    if (pod == NULL) {
        json_t *st = json_loadb(body, len, 0, NULL);
        const char *msg = json_string_value(json_object_get(st, "message"));
        bind_fail(c, "reading pod %s from the API server: %s (HTTP %ld)", c->pod_name,
                  msg     ? msg
                  : error ? error
                          : "no pod in the answer",
                  status);
        json_decref(st);
        return;
    }
    const char *uid = json_string_value(json_object_get(json_object_get(pod, "metadata"), "uid"));
    if (uid == NULL || strcmp(uid, c->uid) != 0) {
        json_decref(pod);
        bind_fail(c, "the pod %s is no longer the one with UID %s", c->pod_name, c->uid);
        return;
    }
    const char *bound =
        json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
    if (bound != NULL && bound[0] != '\0') {
        char b[254];
        snprintf(b, sizeof(b), "%s", bound);
        json_decref(pod);
        if (strcmp(b, c->bind_node) == 0) { /* a retry of a bind that went through */
            logf_("oversub-scheduler: %s is already bound to %s", c->pod_name, b);
            call_done(c, 200, json_pack("{s:s}", "Error", ""));
        } else {
            bind_fail(c, "the pod %s is already bound to node %s", c->pod_name, b);
        }
        return;
    }
    c->spec = osub_pod_spec(pod, &c->x->cfg.policy, NULL, why, sizeof(why));
    json_decref(pod);
    if (c->spec == NULL) {
        bind_fail(c, "%s", why);
        return;
    }
    bind_submit(c);
}

static void do_bind(struct call *c)
{
    struct osub_ext *x = c->x;
    const char *name = json_string_value(osub_json_get_ci(c->args, "PodName"));
    const char *ns = json_string_value(osub_json_get_ci(c->args, "PodNamespace"));
    const char *uid = json_string_value(osub_json_get_ci(c->args, "PodUID"));
    const char *node = json_string_value(osub_json_get_ci(c->args, "Node"));
    if (name == NULL || uid == NULL || node == NULL) {
        call_done(c, 200,
                  json_pack("{s:s}", "Error",
                            "a bind needs PodName, PodNamespace, PodUID and Node (strings)"));
        return;
    }
    if (!osub_k8s_name_ok(name, 253) || !osub_k8s_name_ok(node, 253) ||
        (ns != NULL && ns[0] && !osub_k8s_name_ok(ns, 63)) || !osub_k8s_name_ok(uid, 64)) {
        call_done(c, 200,
                  json_pack("{s:s}", "Error",
                            "PodName, PodNamespace, PodUID and Node must be Kubernetes names "
                            "(lowercase letters, digits, '-' and '.')"));
        return;
    }
    snprintf(c->bind_name, sizeof(c->bind_name), "%s", name);
    snprintf(c->bind_ns, sizeof(c->bind_ns), "%s", ns && ns[0] ? ns : "default");
    snprintf(c->bind_node, sizeof(c->bind_node), "%s", node);
    snprintf(c->uid, sizeof(c->uid), "%s", uid);
    snprintf(c->pod_name, sizeof(c->pod_name), "%s/%s", c->bind_ns, name);
    if (x->kube == NULL) {
        bind_fail(c, "oversub-scheduler has no API server to create the Binding with (give "
                     "--kube-api, or run it in the cluster)");
        return;
    }
    /* the pod as the API server has it, first: it must exist with this UID and be bound
     * nowhere yet, before any node reserves (and evicts) for it */
    char path[600];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", c->bind_ns, name);
    if (osub_kube_request_within(x->kube, "GET", path, NULL, bind_left_ms(c), on_pod_read, c) != 0)
        bind_fail(c, "out of memory");
}

/* ---- HTTP -------------------------------------------------------------------------------- */

static json_t *read_args(struct evhttp_request *req, char *why, size_t whylen)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    if (len == 0) {
        snprintf(why, whylen, "the request has no body (kube-scheduler sends JSON)");
        return NULL;
    }
    const char *p = (const char *)evbuffer_pullup(in, (ssize_t)len);
    json_error_t je;
    json_t *j = p ? json_loadb(p, len, 0, &je) : NULL;
    if (j == NULL) {
        snprintf(why, whylen, "the body is not JSON: %s (line %d, column %d)",
                 p ? je.text : "out of memory", je.line, je.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(why, whylen, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* The pod of a filter, prioritize or preempt call: its spec for oversub, kept for bind. */
static void read_pod(struct call *c)
{
    c->pod = osub_json_get_ci(c->args, "Pod");
    const json_t *md = json_object_get(c->pod, "metadata");
    const char *uid = json_string_value(json_object_get(md, "uid"));
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    snprintf(c->uid, sizeof(c->uid), "%s", uid ? uid : "");
    snprintf(c->pod_name, sizeof(c->pod_name), "%s/%s", ns && ns[0] ? ns : "default",
             name ? name : "?");
    if (!json_is_object(c->pod)) {
        snprintf(c->bad_pod, sizeof(c->bad_pod), "oversub: the request has no Pod");
        return;
    }
    int64_t mib;
    char why[300];
    if (osub_pod_vram(c->pod, &mib, why, sizeof(why)) != 0) {
        snprintf(c->bad_pod, sizeof(c->bad_pod), "oversub: %s", why);
        return;
    }
    if (mib == 0)
        return; /* asks nothing of oversub: every node passes */
    c->spec = osub_pod_spec(c->pod, &c->x->cfg.policy, NULL, why, sizeof(why));
    if (c->spec == NULL) {
        snprintf(c->bad_pod, sizeof(c->bad_pod), "oversub: %s", why);
        return;
    }
}

/* The node names of a call: NodeNames, else the Nodes' items, else the victims' nodes. */
static json_t *read_names(const json_t *args, enum verb v)
{
    json_t *out = json_array();
    if (v == V_PREEMPT) {
        const char *k;
        json_t *val;
        json_object_foreach(victim_map(args), k, val) json_array_append_new(out, json_string(k));
        return out;
    }
    const json_t *names = osub_json_get_ci(args, "NodeNames");
    size_t i;
    json_t *e;
    if (json_is_array(names)) {
        json_array_foreach(names, i, e) if (json_is_string(e)) json_array_append(out, e);
        return out;
    }
    json_array_foreach(json_object_get(osub_json_get_ci(args, "Nodes"), "items"), i, e)
    {
        json_t *nm = json_object_get(json_object_get(e, "metadata"), "name");
        if (json_is_string(nm))
            json_array_append(out, nm);
    }
    return out;
}

static void on_verb(struct evhttp_request *req, void *arg, enum verb v)
{
    struct osub_ext *x = arg;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "POST");
        reply_error(req, 405, "kube-scheduler's verbs are POSTs");
        return;
    }
    char why[400];
    json_t *args = read_args(req, why, sizeof(why));
    if (args == NULL) {
        x->errors[v]++;
        reply_error(req, 400, why);
        return;
    }
    struct call *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        json_decref(args);
        reply_error(req, 503, "out of memory");
        return;
    }
    c->x = x;
    c->req = req;
    c->verb = v;
    c->started = mono_s();
    c->args = args;
    c->answers = json_object();
    c->held = json_object();
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_client_close, c);
    if (v == V_BIND) {
        do_bind(c);
        return;
    }
    read_pod(c);
    c->names = read_names(args, v);
    if (v == V_PREEMPT && victim_map(args) == NULL) {
        call_done(c, 200,
                  json_pack("{s:s, s:o}", "Error", "", "NodeNameToMetaVictims", json_object()));
        return;
    }
    if (c->spec == NULL || c->bad_pod[0]) {
        finish(c);
        return;
    }
    ask_nodes(c);
}

static void on_filter(struct evhttp_request *r, void *a)
{
    on_verb(r, a, V_FILTER);
}
static void on_prioritize(struct evhttp_request *r, void *a)
{
    on_verb(r, a, V_PRIORITIZE);
}
static void on_preempt(struct evhttp_request *r, void *a)
{
    on_verb(r, a, V_PREEMPT);
}
static void on_bind(struct evhttp_request *r, void *a)
{
    on_verb(r, a, V_BIND);
}

static void on_healthz(struct evhttp_request *req, void *arg)
{
    (void)arg;
    reply_text(req, 200, "text/plain", "ok\n");
}

/* GET /v1/nodes: what the extender knows of each node. */
static void on_nodes_get(struct evhttp_request *req, void *arg)
{
    struct osub_ext *x = arg;
    json_t *out = json_array();
    int64_t now = mono_ms();
    for (size_t i = 0; i < x->n_nodes; i++) {
        struct node *n = x->nodes[i];
        if (n->gone)
            continue;
        json_t *o =
            json_pack("{s:s, s:s, s:b}", "name", n->name, "url", n->url, "from_api", n->from_api);
        if (n->pool != NULL) {
            json_object_set(o, "pool", n->pool);
            json_object_set_new(o, "pool_age_ms", json_integer(now - n->pool_at_ms));
        }
        if (n->pool_err[0])
            json_object_set_new(o, "error", json_string(n->pool_err));
        json_array_append_new(out, o);
    }
    json_t *res = json_pack("{s:o}", "nodes", out);
    if (x->nodes_err[0])
        json_object_set_new(res, "api_error", json_string(x->nodes_err));
    reply_json(req, 200, res);
}

static void on_metrics(struct evhttp_request *req, void *arg)
{
    struct osub_ext *x = arg;
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_reply(req, 503, "Service Unavailable", NULL);
        return;
    }
    evbuffer_add_printf(b, "# HELP oversub_extender_calls_total Calls of each verb by "
                           "kube-scheduler.\n# TYPE oversub_extender_calls_total counter\n");
    for (int v = 0; v < V__COUNT; v++)
        evbuffer_add_printf(b, "oversub_extender_calls_total{verb=\"%s\"} %" PRIu64 "\n",
                            verb_names[v], x->calls[v]);
    evbuffer_add_printf(
        b,
        "# HELP oversub_extender_accept_refused_total Connections not accepted "
        "for want of file descriptors.\n# TYPE oversub_extender_accept_refused_total "
        "counter\noversub_extender_accept_refused_total %" PRIu64 "\n",
        x->accept_refused);
    evbuffer_add_printf(b, "# HELP oversub_extender_errors_total Calls answered with an error.\n"
                           "# TYPE oversub_extender_errors_total counter\n");
    for (int v = 0; v < V__COUNT; v++)
        evbuffer_add_printf(b, "oversub_extender_errors_total{verb=\"%s\"} %" PRIu64 "\n",
                            verb_names[v], x->errors[v]);
    evbuffer_add_printf(b, "# HELP oversub_extender_call_duration_seconds Time to answer a "
                           "verb.\n# TYPE oversub_extender_call_duration_seconds histogram\n");
    for (int v = 0; v < V__COUNT; v++) {
        uint64_t cum = 0;
        for (int i = 0; i <= LAT_BUCKETS; i++) {
            cum += x->lat[v][i];
            if (i < LAT_BUCKETS)
                evbuffer_add_printf(b,
                                    "oversub_extender_call_duration_seconds_bucket{verb=\"%s\","
                                    "le=\"%g\"} %" PRIu64 "\n",
                                    verb_names[v], lat_bounds[i], cum);
            else
                evbuffer_add_printf(b,
                                    "oversub_extender_call_duration_seconds_bucket{verb=\"%s\","
                                    "le=\"+Inf\"} %" PRIu64 "\n",
                                    verb_names[v], cum);
        }
        evbuffer_add_printf(b, "oversub_extender_call_duration_seconds_sum{verb=\"%s\"} %.6f\n",
                            verb_names[v], x->lat_sum[v]);
        evbuffer_add_printf(
            b, "oversub_extender_call_duration_seconds_count{verb=\"%s\"} %" PRIu64 "\n",
            verb_names[v], cum);
    }
    size_t live = 0, down = 0;
    for (size_t i = 0; i < x->n_nodes; i++) {
        live += !x->nodes[i]->gone;
        down += !x->nodes[i]->gone && x->nodes[i]->pool_err[0] != '\0';
    }
    evbuffer_add_printf(
        b,
        "# HELP oversub_extender_nodes Nodes with an oversubd known.\n"
        "# TYPE oversub_extender_nodes gauge\noversub_extender_nodes %zu\n"
        "# HELP oversub_extender_nodes_unreachable Nodes whose last pool read failed.\n"
        "# TYPE oversub_extender_nodes_unreachable gauge\noversub_extender_nodes_unreachable %zu\n"
        "# HELP oversub_extender_node_asks_total Dry runs asked of nodes' oversubd.\n"
        "# TYPE oversub_extender_node_asks_total counter\noversub_extender_node_asks_total %" PRIu64
        "\n"
        "# HELP oversub_extender_node_cached_total Node decisions reused from the cache.\n"
        "# TYPE oversub_extender_node_cached_total counter\n"
        "oversub_extender_node_cached_total %" PRIu64 "\n"
        "# HELP oversub_extender_node_failures_total Node requests with no usable answer.\n"
        "# TYPE oversub_extender_node_failures_total counter\n"
        "oversub_extender_node_failures_total %" PRIu64 "\n"
        "# HELP oversub_extender_binds_total Binds by result.\n"
        "# TYPE oversub_extender_binds_total counter\n"
        "oversub_extender_binds_total{result=\"ok\"} %" PRIu64 "\n"
        "oversub_extender_binds_total{result=\"failed\"} %" PRIu64 "\n"
        "# HELP oversub_extender_preempt_degrade_only_total Nodes in preempt calls where oversub "
        "makes room by degrading only.\n"
        "# TYPE oversub_extender_preempt_degrade_only_total counter\n"
        "oversub_extender_preempt_degrade_only_total %" PRIu64 "\n"
        "# HELP oversub_extender_reservations_released_total Reservations released after a "
        "failed Binding.\n"
        "# TYPE oversub_extender_reservations_released_total counter\n"
        "oversub_extender_reservations_released_total %" PRIu64 "\n",
        live, down, x->node_asks, x->node_cached, x->node_failures, x->binds_ok, x->binds_failed,
        x->preempt_degrade_only, x->releases);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void on_other(struct evhttp_request *req, void *arg)
{
    (void)arg;
    reply_error(req, 404,
                "no such path: POST /filter, /prioritize, /preempt, /bind; GET /healthz, "
                "/metrics, /v1/nodes");
}

/* ---- life -------------------------------------------------------------------------------- */

void osub_ext_config_default(struct osub_ext_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->listen_host, sizeof(c->listen_host), "127.0.0.1");
    c->listen_port = 8888;
    c->node_timeout_ms = 2000;
    c->cache_ms = 10000;
    c->pool_refresh_ms = 5000;
    c->nodes_refresh_ms = 30000;
    osub_kube_opts_default(&c->kube_opts);
    c->kube_opts.timeout_ms = 4000; /* a bind's API calls end inside kube-scheduler's 5 s */
    osub_pod_policy_default(&c->policy);
}

int osub_ext_new(struct event_base *base, const struct osub_ext_config *c, struct osub_ext **out,
                 char *err, size_t errlen)
{
    *out = NULL;
    struct osub_ext *x = calloc(1, sizeof(*x));
    if (x == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    x->cfg = *c;
    x->base = base;
    x->by_name = json_object();
    x->decisions = json_object();
    if (x->by_name == NULL || x->decisions == NULL) {
        snprintf(err, errlen, "out of memory");
        osub_ext_free(x);
        return -1;
    }
    if (c->token_file[0]) {
        FILE *f = fopen(c->token_file, "re");
        size_t n = f ? fread(x->token, 1, sizeof(x->token) - 1, f) : 0;
        if (f == NULL) {
            snprintf(err, errlen, "--token-file %s: %s", c->token_file, strerror(errno));
            osub_ext_free(x);
            return -1;
        }
        fclose(f);
        x->token[n] = '\0';
        while (n > 0 && (x->token[n - 1] == '\n' || x->token[n - 1] == ' '))
            x->token[--n] = '\0';
    }
    if (c->kube && osub_kube_new(base, &c->kube_opts, &x->kube, err, errlen) != 0) {
        osub_ext_free(x);
        return -1;
    }
    *out = x;
    return 0;
}

static struct event *every(struct osub_ext *x, int64_t ms, event_callback_fn fn)
{
    struct event *ev = event_new(x->base, -1, EV_PERSIST, fn, x);
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (ev != NULL)
        event_add(ev, &tv);
    return ev;
}

int osub_ext_start(struct osub_ext *x, char *err, size_t errlen)
{
    x->http = evhttp_new(x->base);
    if (x->http == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    evhttp_set_max_body_size(x->http, BODY_MAX);
    evhttp_set_allowed_methods(x->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD);
    evhttp_set_timeout(x->http, 30);
    evhttp_set_cb(x->http, "/filter", on_filter, x);
    evhttp_set_cb(x->http, "/prioritize", on_prioritize, x);
    evhttp_set_cb(x->http, "/preempt", on_preempt, x);
    evhttp_set_cb(x->http, "/bind", on_bind, x);
    evhttp_set_cb(x->http, "/healthz", on_healthz, x);
    evhttp_set_cb(x->http, "/metrics", on_metrics, x);
    evhttp_set_cb(x->http, "/v1/nodes", on_nodes_get, x);
    evhttp_set_gencb(x->http, on_other, x);
    /* descriptors: the soft limit raised to the hard one (kube-scheduler keeps many
     * connections, and every node has one of ours) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct evhttp_bound_socket *h =
        evhttp_bind_socket_with_handle(x->http, x->cfg.listen_host, (uint16_t)x->cfg.listen_port);
    if (h == NULL) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", x->cfg.listen_host, x->cfg.listen_port,
                 strerror(errno));
        return -1;
    }
    /* out of descriptors: accept backs off (and says so once) instead of spinning */
    osubd_listener_guard(evhttp_bound_socket_get_listener(h), "oversub-scheduler",
                         &x->accept_refused);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int port = x->cfg.listen_port;
    if (getsockname(evhttp_bound_socket_get_fd(h), (struct sockaddr *)&ss, &sl) == 0)
        port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    x->pool_ev = every(x, x->cfg.pool_refresh_ms, pool_tick);
    x->sweep_ev = every(x, 1000, sweep_tick);
    if (x->cfg.kube_nodes) {
        x->nodes_ev = every(x, x->cfg.nodes_refresh_ms, nodes_tick);
        nodes_tick(-1, 0, x);
    }
    pool_tick(-1, 0, x);
    if (x->pool_ev == NULL || x->sweep_ev == NULL || (x->cfg.kube_nodes && x->nodes_ev == NULL)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    printf("listening on http://%s:%d\n", x->cfg.listen_host, port);
    fflush(stdout);
    return 0;
}

void osub_ext_free(struct osub_ext *x)
{
    if (x == NULL)
        return;
    /* requests to nodes still out: cancelled, their calls freed unanswered */
    while (x->reqs != NULL) {
        struct node_req *nr = x->reqs;
        node_cb cb = nr->cb;
        void *arg = nr->arg;
        evhttp_cancel_request(nr->req);
        node_req_done(nr);
        cb(arg, -1, NULL, "stopping");
    }
    osub_kube_free(x->kube); /* its callbacks see -1 and free their calls */
    x->kube = NULL;
    if (x->http)
        evhttp_free(x->http);
    struct event *evs[] = {x->pool_ev, x->nodes_ev, x->sweep_ev};
    for (size_t i = 0; i < 3; i++)
        if (evs[i])
            event_free(evs[i]);
    for (size_t i = 0; i < x->n_nodes; i++) {
        if (x->nodes[i]->conn)
            evhttp_connection_free(x->nodes[i]->conn);
        json_decref(x->nodes[i]->pool);
        free(x->nodes[i]);
    }
    free(x->nodes);
    json_decref(x->by_name);
    json_decref(x->decisions);
    osub_kube_free(x->kube);
    free(x);
}
