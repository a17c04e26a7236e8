/* gateway.c - the entry's overload protection (see gateway.h). One service's state: requests
 * in flight to its backends (at most its limit, which shrinks while it is degraded) and a
 * queue ordered by priority then arrival, each request with a deadline. Beyond the queue, or
 * past the deadline: 429 with Retry-After from the measured drain rate. */
#define _POSIX_C_SOURCE 200809L
#include "gateway.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include "daemon.h"

#define GW_CONNS 64

struct gw_svc;

struct gw_req {
    struct gw_req *next; /* in the queue */
    struct gw_svc *svc;
    struct evhttp_request *req;  /* the client's */
    struct evhttp_request *breq; /* to the backend, while in flight */
    struct gw_conn *conn;
    int32_t prio; /* a class level: 0 first */
    uint64_t seq;
    struct event *timer;
    bool started;  /* the reply's head went out: the body streams */
    bool by_host;  /* routed by Host: the path is forwarded whole */
    int error;     /* from the backend request's error callback, -1 none */
    double t0;     /* arrival */
    double t_sent; /* dispatched to a backend */
};

struct gw_conn {
    struct evhttp_connection *evcon;
    int backend;
    bool busy;
    char host[300]; /* the Host header for this backend */
};

#define GW_BUCKETS 12
static const double gw_bounds[GW_BUCKETS] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,   1,    2.5,   5,    10};

struct hist {
    uint64_t count[GW_BUCKETS + 1]; /* the last: above every bound */
    double sum;
};

static void observe(struct hist *h, double v)
{
    int i = 0;
    while (i < GW_BUCKETS && v > gw_bounds[i])
        i++;
    h->count[i]++;
    h->sum += v;
}

struct osub_gateway;

struct gw_svc {
    struct gw_svc *next;
    struct osub_gateway *g;
    char id[OSUB_ID_MAX + 1];
    struct gw_req *queue;
    int32_t n_queued, inflight;
    struct gw_conn conns[GW_CONNS];
    int32_t n_conns;
    uint32_t rr;
    uint64_t admitted, completed, rej_full, rej_deadline, rej_unavailable, rej_shed, backend_errors;
    double rate, last_done; /* completions a second (moving average), and when the last was */
    /* a backend that failed is out of rotation until down_until; the first request after
     * that probes it (failing again doubles the wait, up to 30 s) */
    double down_until[16], backoff[16];
    struct hist queue_wait, upstream; /* seconds */
};

struct osub_gateway {
    struct osubd *d;
    struct evhttp *http;
    struct event *pump;
    struct gw_svc *svcs;
    uint64_t seq;
    uint64_t no_route;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the spec's gateway fields ----------------------------------------------------------- */

int osubd_gateway_take(json_t *spec, json_t **route, char *err, size_t errlen)
{
    *route = NULL;
    json_t *r = json_object();
    json_t *b = json_object_get(spec, "backends");
    if (b != NULL) {
        if (!json_is_array(b) || json_array_size(b) == 0 || json_array_size(b) > 16) {
            snprintf(err, errlen, "field 'backends' must list 1 to 16 http://HOST:PORT URLs");
            json_decref(r);
            return -1;
        }
        size_t i;
        json_t *u;
        json_array_foreach(b, i, u)
        {
            const char *s = json_string_value(u);
            struct evhttp_uri *uri = s ? evhttp_uri_parse(s) : NULL;
            bool ok = uri != NULL && evhttp_uri_get_scheme(uri) != NULL &&
                      strcmp(evhttp_uri_get_scheme(uri), "http") == 0 &&
                      evhttp_uri_get_host(uri) != NULL && evhttp_uri_get_port(uri) > 0;
            if (uri)
                evhttp_uri_free(uri);
            if (!ok) {
                snprintf(err, errlen, "field 'backends': entry %zu is not an http://HOST:PORT URL",
                         i);
                json_decref(r);
                return -1;
            }
        }
        json_object_set(r, "backends", b);
        json_object_del(spec, "backends");
    }
    static const struct {
        const char *name;
        json_int_t lo, hi;
    } ints[] = {
        {"max_inflight", 1, GW_CONNS}, {"max_queue", 0, 100000}, {"queue_timeout_ms", 1, 600000}};
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
        json_t *v = json_object_get(spec, ints[k].name);
        if (v == NULL)
            continue;
        if (!json_is_integer(v) || json_integer_value(v) < ints[k].lo ||
            json_integer_value(v) > ints[k].hi) {
            snprintf(err, errlen, "field '%s' must be an integer from %lld to %lld", ints[k].name,
                     (long long)ints[k].lo, (long long)ints[k].hi);
            json_decref(r);
            return -1;
        }
        json_object_set(r, ints[k].name, v);
        json_object_del(spec, ints[k].name);
    }
    if (json_object_size(r) == 0) {
        json_decref(r);
        return 0;
    }
    if (json_object_get(r, "backends") == NULL) {
        snprintf(err, errlen, "the gateway's fields need 'backends'");
        json_decref(r);
        return -1;
    }
    *route = r;
    return 0;
}

/* ---- replies ----------------------------------------------------------------------------- */

static void reply(struct evhttp_request *req, int code, const char *phrase, const char *ecode,
                  const char *reason, const char *msg, int retry_after)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "application/json");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", retry_after);
        evhttp_add_header(h, "Retry-After", ra);
    }
    /* the strings are ours, none needs escaping: no JSON library on the rejection path */
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"error\":{\"code\":\"%s\",\"reason\":\"%s\",\"message\":\"%s\"}}\n",
                        ecode, reason, msg);
    evhttp_send_reply(req, code, phrase, b);
    evbuffer_free(b);
}

/* Whole seconds until the queue ahead has likely drained, at least 1. */
static int retry_after(const struct gw_svc *s)
{
    if (s->rate <= 0.0)
        return 1;
    double t = ceil((double)(s->n_queued + 1) / s->rate);
    return t < 1 ? 1 : t > 60 ? 60 : (int)t;
}

/* ---- the service's limit ------------------------------------------------------------------- */

static json_t *route_of(const struct osubd *d, const char *id)
{
    return json_object_get(d->routes, id);
}

static int32_t limit_of(const struct osubd *d, const char *id, const osub_service_info_t *si)
{
    json_t *r = route_of(d, id);
    json_t *m = json_object_get(r, "max_inflight");
    int32_t base = m                          ? (int32_t)json_integer_value(m)
                   : si->spec->batch_size > 0 ? si->spec->batch_size
                                              : 8;
    if (base > GW_CONNS)
        base = GW_CONNS;
    if (si->state == OSUB_STATE_DEGRADED) {
        /* for a continuous-batching server the in-flight count is the batch */
        int32_t mb = si->spec->min_batch_size;
        int32_t lim = mb > 0 ? mb
                             : (si->batch_size > 0 && si->spec->batch_size > 0
                                    ? base * si->batch_size / si->spec->batch_size
                                    : base / 2);
        if (lim < 1)
            lim = 1;
        return lim < base ? lim : base;
    }
    return base;
}

static int32_t max_queue_of(const struct osubd *d, const char *id, int32_t limit)
{
    json_t *m = json_object_get(route_of(d, id), "max_queue");
    return m ? (int32_t)json_integer_value(m) : 2 * limit;
}

/* Shedding: while a GPU the service runs on is above the high watermark (held, or used where
 * that is more), requests at the lowest priority are refused first; past halfway from there
 * to full, every level but the highest. The highest level (online) is never shed. Returns the
 * level from which requests are shed (INT32_MAX: none). */
static int32_t shed_from(const struct osubd *d, const osub_service_info_t *si)
{
    osub_pool_config_t cfg;
    osub_engine_config(d->e, &cfg);
    size_t nc;
    const osub_class_t *cls = osub_engine_classes(d->e, &nc);
    int32_t lowest = 0;
    for (size_t c = 0; c < nc; c++)
        if (cls[c].level > lowest)
            lowest = cls[c].level;
    int64_t worst = 0; /* held in thousandths of usable, over the service's GPUs */
    for (int32_t i = 0; i < si->n_slots; i++) {
        osub_gpu_info_t g;
        if (osub_engine_gpu_info(d->e, si->slots[i].gpu, &g) != 0 || g.usable_mib <= 0)
            continue;
        /* what is really in use counts, even where a service is over its grant */
        int64_t in_use = g.held_mib > g.used_mib ? g.held_mib : g.used_mib;
        int64_t per_mille = in_use * 1000 / g.usable_mib;
        if (per_mille > worst)
            worst = per_mille;
    }
    int64_t high = cfg.high_watermark_pct * 10;
    if (worst <= high || lowest == 0)
        return INT32_MAX;
    if (worst <= high + (1000 - high) / 2)
        return lowest;
    return 1;
}

static bool serving(const osub_service_info_t *si)
{
    return si->state == OSUB_STATE_RUNNING || si->state == OSUB_STATE_DEGRADED;
}

/* ---- forwarding ---------------------------------------------------------------------------- */

static bool hop_by_hop(const char *name, const struct evkeyvalq *in)
{
    static const char *const hop[] = {"Connection",
                                      "Keep-Alive",
                                      "Proxy-Connection",
                                      "TE",
                                      "Trailer",
                                      "Transfer-Encoding",
                                      "Upgrade",
                                      "Proxy-Authenticate",
                                      "Proxy-Authorization"};
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        if (strcasecmp(name, hop[i]) == 0)
            return true;
    /* and whatever the Connection header names (RFC 9110, 7.6.1) */
    const char *c = in ? evhttp_find_header(in, "Connection") : NULL;
    if (c != NULL) {
        size_t n = strlen(name);
        for (const char *p = c; *p;) {
            while (*p == ' ' || *p == ',')
                p++;
            const char *e = p;
            while (*e && *e != ',' && *e != ' ')
                e++;
            if ((size_t)(e - p) == n && strncasecmp(p, name, n) == 0)
                return true;
            p = e;
        }
    }
    return false;
}

static void finish(struct gw_req *r);
static void pump(struct osub_gateway *g, struct gw_svc *s);

static void copy_response_head(struct gw_req *r)
{
    struct evkeyvalq *in = evhttp_request_get_input_headers(r->breq);
    struct evkeyvalq *out = evhttp_request_get_output_headers(r->req);
    for (struct evkeyval *h = in->tqh_first; h != NULL; h = h->next.tqe_next)
        if (!hop_by_hop(h->key, in))
            evhttp_add_header(out, h->key, h->value);
}

static void on_backend_chunk(struct evhttp_request *breq, void *arg)
{
    struct gw_req *r = arg;
    r->breq = breq;
    if (!r->started) {
        copy_response_head(r);
        int code = evhttp_request_get_response_code(breq);
        const char *phrase = evhttp_request_get_response_code_line(breq);
        evhttp_send_reply_start(r->req, code, phrase ? phrase : "OK");
        r->started = true;
    }
    evhttp_send_reply_chunk(r->req, evhttp_request_get_input_buffer(breq));
}

static void on_backend_error(enum evhttp_request_error e, void *arg)
{
    struct gw_req *r = arg;
    r->error = (int)e;
}

static void on_backend_done(struct evhttp_request *breq, void *arg)
{
    struct gw_req *r = arg;
    struct gw_svc *s = r->svc;
    int code = breq ? evhttp_request_get_response_code(breq) : 0;
    int bi = r->conn != NULL ? r->conn->backend : -1;
    if (code == 0 || r->error >= 0) {
        s->backend_errors++;
        if (bi >= 0 && bi < 16) {
            s->backoff[bi] =
                s->backoff[bi] > 0 ? (s->backoff[bi] * 2 > 30 ? 30 : s->backoff[bi] * 2) : 1;
            s->down_until[bi] = now_s() + s->backoff[bi];
        }
        if (r->started) {
            evhttp_send_reply_end(r->req); /* the body stops short: the client sees it */
        } else if (r->error == EVREQ_HTTP_TIMEOUT) {
            reply(r->req, 504, "Gateway Timeout", "backend_timeout", "timeout",
                  "the service's backend did not answer in time", 0);
        } else {
            reply(r->req, 502, "Bad Gateway", "backend_unavailable", "connection",
                  "the service's backend refused or dropped the connection", 0);
        }
        if (r->conn != NULL && r->conn->evcon != NULL) {
            /* a broken connection is not reused */
            evhttp_connection_free_on_completion(r->conn->evcon);
            r->conn->evcon = NULL;
        }
    } else if (r->started) {
        if (bi >= 0 && bi < 16)
            s->backoff[bi] = 0;
        evhttp_send_reply_end(r->req);
    } else {
        if (bi >= 0 && bi < 16)
            s->backoff[bi] = 0;
        r->breq = breq;
        copy_response_head(r);
        const char *phrase = evhttp_request_get_response_code_line(breq);
        evhttp_send_reply(r->req, code, phrase ? phrase : "OK",
                          evhttp_request_get_input_buffer(breq));
    }
    double t = now_s();
    observe(&s->upstream, t - r->t_sent);
    if (s->last_done > 0) {
        double dt = t - s->last_done;
        double inst = dt > 1e-6 ? 1.0 / dt : 1e6;
        s->rate = s->rate > 0 ? 0.9 * s->rate + 0.1 * inst : inst;
    }
    s->last_done = t;
    s->completed++;
    finish(r);
}

static struct gw_conn *conn_for(struct gw_svc *s, int backend, const char *url)
{
    for (int32_t i = 0; i < s->n_conns; i++)
        if (!s->conns[i].busy && s->conns[i].backend == backend && s->conns[i].evcon != NULL)
            return &s->conns[i];
    struct gw_conn *c = NULL;
    for (int32_t i = 0; i < s->n_conns && c == NULL; i++)
        if (s->conns[i].evcon == NULL)
            c = &s->conns[i];
    if (c == NULL && s->n_conns < GW_CONNS)
        c = &s->conns[s->n_conns++];
    if (c == NULL)
        return NULL;
    struct evhttp_uri *u = evhttp_uri_parse(url);
    if (u == NULL)
        return NULL;
    c->evcon = evhttp_connection_base_new(s->g->d->base, NULL, evhttp_uri_get_host(u),
                                          (unsigned short)evhttp_uri_get_port(u));
    evhttp_uri_free(u);
    if (c->evcon == NULL)
        return NULL;
    evhttp_connection_set_timeout(c->evcon, 60);
    c->backend = backend;
    snprintf(c->host, sizeof(c->host), "%s", url + (strncmp(url, "http://", 7) == 0 ? 7 : 0));
    char *slash = strchr(c->host, '/');
    if (slash != NULL)
        *slash = '\0';
    c->busy = false;
    return c;
}

static void dispatch(struct osub_gateway *g, struct gw_req *r)
{
    struct gw_svc *s = r->svc;
    json_t *backends = json_object_get(route_of(g->d, s->id), "backends");
    size_t nb = json_array_size(backends);
    int b = nb ? (int)(s->rr++ % nb) : 0;
    double t = now_s();
    for (size_t k = 0; k < nb && s->down_until[b] > t; k++)
        b = (int)(s->rr++ % nb); /* skip backends out of rotation (all out: probe one) */
    struct gw_conn *c =
        nb ? conn_for(s, b, json_string_value(json_array_get(backends, (size_t)b))) : NULL;
    if (c == NULL) {
        s->backend_errors++;
        reply(r->req, 502, "Bad Gateway", "backend_unavailable", "no_backend",
              "the service has no backend to send to", 0);
        free(r);
        return;
    }
    c->busy = true;
    r->conn = c;
    r->error = -1;
    r->t_sent = now_s();
    observe(&s->queue_wait, r->t_sent - r->t0);
    s->inflight++;
    s->admitted++;
    struct evhttp_request *breq = evhttp_request_new(on_backend_done, r);
    evhttp_request_set_chunked_cb(breq, on_backend_chunk);
    evhttp_request_set_error_cb(breq, on_backend_error);
    r->breq = breq;
    struct evkeyvalq *in = evhttp_request_get_input_headers(r->req);
    struct evkeyvalq *out = evhttp_request_get_output_headers(breq);
    for (struct evkeyval *h = in->tqh_first; h != NULL; h = h->next.tqe_next)
        if (!hop_by_hop(h->key, in) && strcasecmp(h->key, "Host") != 0 &&
            strcasecmp(h->key, "X-Forwarded-For") != 0)
            evhttp_add_header(out, h->key, h->value);
    evhttp_add_header(out, "Host", c->host);
    char *peer = NULL;
    ev_uint16_t port = 0;
    evhttp_connection_get_peer(evhttp_request_get_connection(r->req), &peer, &port);
    const char *xff = evhttp_find_header(in, "X-Forwarded-For");
    char fwd[512];
    snprintf(fwd, sizeof(fwd), "%s%s%s", xff ? xff : "", xff ? ", " : "", peer ? peer : "");
    evhttp_add_header(out, "X-Forwarded-For", fwd);
    evbuffer_add_buffer(evhttp_request_get_output_buffer(breq),
                        evhttp_request_get_input_buffer(r->req));
    /* the path without the service's prefix, with its query */
    const char *uri = evhttp_request_get_uri(r->req);
    const char *rest = strchr(uri + 1, '/');
    const char *q = strchr(uri, '?');
    char path[4096];
    if (r->by_host)
        snprintf(path, sizeof(path), "%s", uri);
    else if (rest == NULL || (q != NULL && q < rest))
        snprintf(path, sizeof(path), "/%s", q ? q : "");
    else
        snprintf(path, sizeof(path), "%s", rest);
    if (evhttp_make_request(c->evcon, breq, evhttp_request_get_command(r->req), path) != 0) {
        r->breq = NULL;
        r->error = EVREQ_HTTP_EOF;
        on_backend_done(NULL, r);
    }
}

static void finish(struct gw_req *r)
{
    struct gw_svc *s = r->svc;
    if (r->conn != NULL)
        r->conn->busy = false;
    s->inflight--;
    free(r);
    pump(s->g, s);
}

/* ---- the queue ----------------------------------------------------------------------------- */

static void unqueue(struct gw_svc *s, struct gw_req *r)
{
    for (struct gw_req **p = &s->queue; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            s->n_queued--;
            break;
        }
    if (r->timer) {
        event_free(r->timer);
        r->timer = NULL;
    }
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_req *r = arg;
    struct gw_svc *s = r->svc;
    unqueue(s, r);
    osub_service_info_t si;
    if (osub_engine_service_info(s->g->d->e, s->id, &si) != 0 || !serving(&si)) {
        s->rej_unavailable++;
        reply(r->req, 503, "Service Unavailable", "unavailable", "not_running",
              "the service is not running yet (loading, pending or queued) and the request's "
              "deadline passed",
              retry_after(s));
    } else {
        s->rej_deadline++;
        reply(r->req, 429, "Too Many Requests", "overloaded", "deadline",
              "the request waited in the service's queue until its deadline", retry_after(s));
    }
    free(r);
}

static void pump(struct osub_gateway *g, struct gw_svc *s)
{
    if (s->queue == NULL)
        return;
    osub_service_info_t si;
    if (osub_engine_service_info(g->d->e, s->id, &si) != 0 || !serving(&si))
        return;
    int32_t lim = limit_of(g->d, s->id, &si);
    while (s->queue != NULL && s->inflight < lim) {
        struct gw_req *r = s->queue;
        unqueue(s, r);
        dispatch(g, r);
    }
}

static void on_pump(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_gateway *g = arg;
    for (struct gw_svc *s = g->svcs; s != NULL; s = s->next)
        pump(g, s);
}

static struct gw_svc *svc_of(struct osub_gateway *g, const char *id)
{
    for (struct gw_svc *s = g->svcs; s != NULL; s = s->next)
        if (strcmp(s->id, id) == 0)
            return s;
    struct gw_svc *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->g = g;
    s->next = g->svcs;
    g->svcs = s;
    return s;
}

/* ---- the entry ----------------------------------------------------------------------------- */

/* Request smuggling: a message whose length two headers could disagree on is refused, and
 * the connection closed (what follows it cannot be trusted to be a request). */
bool osubd_http_ambiguous_length(struct evhttp_request *req)
{
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    int n_cl = 0, n_te = 0;
    for (struct evkeyval *h = in->tqh_first; h != NULL; h = h->next.tqe_next) {
        n_cl += strcasecmp(h->key, "Content-Length") == 0;
        n_te += strcasecmp(h->key, "Transfer-Encoding") == 0;
    }
    if (n_cl > 1 || (n_cl > 0 && n_te > 0)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        return true;
    }
    return false;
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct osub_gateway *g = arg;
    struct osubd *d = g->d;
    if (osubd_http_ambiguous_length(req)) {
        reply(req, 400, "Bad Request", "bad_request", "ambiguous_length",
              "two Content-Length headers, or Content-Length with Transfer-Encoding", 0);
        return;
    }
    const char *uri = evhttp_request_get_uri(req);
    char id[OSUB_ID_MAX + 1];
    size_t n = 0;
    const char *p = uri[0] == '/' ? uri + 1 : uri;
    while (p[n] && p[n] != '/' && p[n] != '?' && n < OSUB_ID_MAX)
        n++;
    memcpy(id, p, n);
    id[n] = '\0';
    bool by_host = false;
    if (n == 0 || route_of(d, id) == NULL) {
        /* by Host: its first label names the service (chat.example.com, chat:8080), and
         * the whole path goes to the backend */
        const char *host = evhttp_find_header(evhttp_request_get_input_headers(req), "Host");
        size_t k = 0;
        while (host != NULL && host[k] && host[k] != '.' && host[k] != ':' && k < OSUB_ID_MAX)
            k++;
        if (k > 0) {
            char hid[OSUB_ID_MAX + 1];
            memcpy(hid, host, k);
            hid[k] = '\0';
            if (route_of(d, hid) != NULL) {
                memcpy(id, hid, k + 1);
                n = k;
                by_host = true;
            }
        }
    }
    osub_service_info_t si;
    if (n == 0 || route_of(d, id) == NULL || osub_engine_service_info(d->e, id, &si) != 0) {
        g->no_route++;
        reply(req, 404, "Not Found", "unknown_service", "no_route",
              "no service with backends at this path or Host: /{service}/... (or Host: "
              "{service}...) reaches a service submitted with \"backends\"",
              0);
        return;
    }
    struct gw_svc *s = svc_of(g, id);
    if (s == NULL) {
        reply(req, 503, "Service Unavailable", "unavailable", "memory", "out of memory", 1);
        return;
    }
    /* priority: the service's class, or a lower one the client asks for */
    int32_t prio = si.level;
    const char *xp = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Priority");
    if (xp != NULL) {
        size_t nc;
        const osub_class_t *cls = osub_engine_classes(d->e, &nc);
        int32_t lvl = -1;
        for (size_t c = 0; c < nc; c++)
            if (strcmp(cls[c].name, xp) == 0)
                lvl = cls[c].level;
        if (lvl < 0) {
            reply(req, 400, "Bad Request", "invalid_priority", "priority",
                  "X-Priority must name a class (online, batch, experiment...)", 0);
            return;
        }
        prio = lvl > si.level ? lvl : si.level; /* never above the service's own */
    }
    json_t *qt = json_object_get(route_of(d, id), "queue_timeout_ms");
    long deadline = qt ? (long)json_integer_value(qt) : 5000;
    const char *xd =
        evhttp_find_header(evhttp_request_get_input_headers(req), "X-Request-Deadline-Ms");
    if (xd != NULL) {
        char *end;
        long v = strtol(xd, &end, 10);
        if (*end != '\0' || v < 0) {
            reply(req, 400, "Bad Request", "invalid_deadline", "deadline",
                  "X-Request-Deadline-Ms must be a number of milliseconds", 0);
            return;
        }
        if (v < deadline)
            deadline = v;
    }
    if (prio > 0 && prio >= shed_from(d, &si)) {
        s->rej_shed++;
        reply(req, 429, "Too Many Requests", "overloaded", "shed",
              "the service's GPUs are above their high watermark: lower-priority requests are "
              "turned away first",
              retry_after(s));
        return;
    }
    int32_t lim = limit_of(d, id, &si);
    int32_t maxq = max_queue_of(d, id, lim);
    struct gw_req *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        reply(req, 503, "Service Unavailable", "unavailable", "memory", "out of memory", 1);
        return;
    }
    r->svc = s;
    r->req = req;
    r->by_host = by_host;
    r->prio = prio;
    r->seq = ++g->seq;
    r->t0 = now_s();
    r->error = -1;
    if (serving(&si) && s->inflight < lim && s->queue == NULL) {
        dispatch(g, r);
        return;
    }
    if (s->n_queued >= maxq || deadline == 0) {
        free(r);
        if (!serving(&si)) {
            s->rej_unavailable++;
            reply(req, 503, "Service Unavailable", "unavailable", "not_running",
                  "the service is not running yet and its queue is full", retry_after(s));
        } else {
            s->rej_full++;
            reply(req, 429, "Too Many Requests", "overloaded", "queue_full",
                  "the service is at its concurrency limit and its queue is full", retry_after(s));
        }
        return;
    }
    /* into the queue: by priority, then arrival */
    struct gw_req **at = &s->queue;
    while (*at != NULL && (*at)->prio <= prio)
        at = &(*at)->next;
    r->next = *at;
    *at = r;
    s->n_queued++;
    r->timer = evtimer_new(d->base, on_deadline, r);
    struct timeval tv = {deadline / 1000, (deadline % 1000) * 1000};
    evtimer_add(r->timer, &tv);
}

int osubd_gateway_init(struct osubd *d, char *err, size_t errlen)
{
    if (d->cfg.gateway_host[0] == '\0')
        return 0;
    struct osub_gateway *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->d = d;
    g->http = evhttp_new(d->base);
    evhttp_set_max_headers_size(g->http, 32 * 1024);
    evhttp_set_max_body_size(g->http, 64 * 1024 * 1024);
    evhttp_set_timeout(g->http, 30);
    evhttp_set_allowed_methods(g->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH | EVHTTP_REQ_HEAD |
                                            EVHTTP_REQ_OPTIONS);
    evhttp_set_gencb(g->http, on_request, g);
    struct evhttp_bound_socket *h =
        evhttp_bind_socket_with_handle(g->http, d->cfg.gateway_host, (uint16_t)d->cfg.gateway_port);
    if (h == NULL) {
        snprintf(err, errlen, "--gateway %s:%d: cannot listen there", d->cfg.gateway_host,
                 d->cfg.gateway_port);
        evhttp_free(g->http);
        free(g);
        return -1;
    }
    int port = osubd_bound_port(h);
    g->pump = event_new(d->base, -1, EV_PERSIST, on_pump, g);
    struct timeval tv = {0, 50000};
    event_add(g->pump, &tv);
    d->gw = g;
    printf("gateway on http://%s:%d\n", d->cfg.gateway_host, port);
    fflush(stdout);
    return 0;
}

void osubd_gateway_free(struct osubd *d)
{
    struct osub_gateway *g = d->gw;
    if (g == NULL)
        return;
    if (g->pump)
        event_free(g->pump);
    evhttp_free(g->http);
    while (g->svcs != NULL) {
        struct gw_svc *s = g->svcs;
        g->svcs = s->next;
        while (s->queue != NULL) {
            struct gw_req *r = s->queue;
            unqueue(s, r);
            free(r);
        }
        for (int32_t i = 0; i < s->n_conns; i++)
            if (s->conns[i].evcon != NULL)
                evhttp_connection_free(s->conns[i].evcon);
        free(s);
    }
    free(g);
    d->gw = NULL;
}

void osubd_gateway_metrics(struct osubd *d, struct evbuffer *b)
{
    struct osub_gateway *g = d->gw;
    if (g == NULL)
        return;
    evbuffer_add_printf(b, "# HELP oversub_gateway_inflight Requests in flight to a service.\n"
                           "# TYPE oversub_gateway_inflight gauge\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        evbuffer_add_printf(b, "oversub_gateway_inflight{service=\"%s\"} %d\n", s->id, s->inflight);
    evbuffer_add_printf(b, "# HELP oversub_gateway_queued Requests waiting in a service's queue.\n"
                           "# TYPE oversub_gateway_queued gauge\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        evbuffer_add_printf(b, "oversub_gateway_queued{service=\"%s\"} %d\n", s->id, s->n_queued);
    static const char *const hn[] = {"queue_wait", "upstream"};
    static const char *const hh[] = {"Time a request waited in the service's queue.",
                                     "Time from sending to a backend to its last byte."};
    for (int k = 0; k < 2; k++) {
        evbuffer_add_printf(
            b,
            "# HELP oversub_gateway_%s_seconds %s\n# TYPE oversub_gateway_%s_seconds histogram\n",
            hn[k], hh[k], hn[k]);
        for (struct gw_svc *s = g->svcs; s; s = s->next) {
            const struct hist *h = k == 0 ? &s->queue_wait : &s->upstream;
            uint64_t cum = 0;
            for (int i = 0; i < GW_BUCKETS; i++) {
                cum += h->count[i];
                evbuffer_add_printf(
                    b, "oversub_gateway_%s_seconds_bucket{service=\"%s\",le=\"%g\"} %llu\n", hn[k],
                    s->id, gw_bounds[i], (unsigned long long)cum);
            }
            cum += h->count[GW_BUCKETS];
            evbuffer_add_printf(
                b,
                "oversub_gateway_%s_seconds_bucket{service=\"%s\",le=\"+Inf\"} %llu\n"
                "oversub_gateway_%s_seconds_sum{service=\"%s\"} %.6f\n"
                "oversub_gateway_%s_seconds_count{service=\"%s\"} %llu\n",
                hn[k], s->id, (unsigned long long)cum, hn[k], s->id, h->sum, hn[k], s->id,
                (unsigned long long)cum);
        }
    }
    evbuffer_add_printf(b, "# HELP oversub_gateway_requests_total Requests by outcome.\n"
                           "# TYPE oversub_gateway_requests_total counter\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next) {
        static const char *const what[] = {"admitted",    "queue_full", "deadline",
                                           "not_running", "shed",       "backend_error"};
        uint64_t v[] = {s->admitted,        s->rej_full, s->rej_deadline,
                        s->rej_unavailable, s->rej_shed, s->backend_errors};
        for (int i = 0; i < 6; i++)
            evbuffer_add_printf(b,
                                "oversub_gateway_requests_total{service=\"%s\",outcome=\"%s\"} "
                                "%llu\n",
                                s->id, what[i], (unsigned long long)v[i]);
    }
}
