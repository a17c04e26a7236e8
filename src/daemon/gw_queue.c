/* gw_queue.c - the gateway's queue by priority and deadline, and the serving engine's saturation
 * (metrics_url) */
#define _GNU_SOURCE
#include "gw.h"

/* ---- the queue ----------------------------------------------------------------------------- */

void osubd__gw_unqueue(struct gw_svc *s, struct gw_req *r)
{
    for (struct gw_req **p = &s->queue; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            s->n_queued--;
            s->g->n_queued--;
            break;
        }
    if (r->timer) {
        event_free(r->timer);
        r->timer = NULL;
    }
}

void osubd__gw_on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_req *r = arg;
    struct gw_svc *s = r->svc;
    struct gw_client *c = r->cl;
    osubd__gw_unqueue(s, r);
    osub_service_info_t si;
    int sus_ms = osubd__gw_suspend_retry_ms(s->g, s->id);
    if (sus_ms > 0) {
        s->rej_unavailable++;
        osubd__gw_reply(r, 503, "Service Unavailable", "unavailable", "suspended",
                        "the service is suspended (or resuming) and could not answer before the "
                        "request's deadline",
                        sus_ms);
    } else if (osub_engine_service_info(s->g->e, s->id, &si) != 0 || !osubd__gw_serving(&si)) {
        s->rej_unavailable++;
        osubd__gw_reply(
            r, 503, "Service Unavailable", "unavailable", "not_running",
            "the service is not running yet (loading, pending or queued) and the request's "
            "deadline passed",
            osubd__gw_retry_after(s));
    } else {
        s->rej_deadline++;
        osubd__gw_reply(r, 429, "Too Many Requests", "overloaded", "deadline",
                        "the request waited in the service's queue until its deadline",
                        osubd__gw_retry_after(s));
    }
    osubd__gw_cl_after(c);
}

/* ---- the serving engine's saturation (metrics_url) ---------------------------------------- */

#define ENG_STALE_S 5.0 /* a read older than this no longer limits anything */

/* The in-flight limit: the route's (or the degrade's), and the engine's own while it queues. */
int32_t osubd__gw_eff_lim(const struct gw_svc *s)
{
    if (s->eng_lim > 0 && s->eng_lim < s->v_lim && now_s() - s->eng_at < ENG_STALE_S)
        return s->eng_lim;
    return s->v_lim;
}

void osubd__gw_eng_drop(struct gw_svc *s)
{
    if (s->eng_conn != NULL)
        evhttp_connection_free(s->eng_conn);
    s->eng_conn = NULL;
    s->eng_url[0] = '\0';
}

/* Sums (running, waiting) and takes the largest KV-cache fraction over every series of vLLM's
 * and SGLang's names in a Prometheus text body. false when none of them is there. */
static bool eng_parse(const char *p, size_t n, double *waiting, double *running, double *kv)
{
    static const struct {
        const char *name;
        int what; /* 0 waiting, 1 running, 2 kv */
    } names[] = {{"vllm:num_requests_waiting", 0}, {"sglang:num_queue_reqs", 0},
                 {"vllm:num_requests_running", 1}, {"sglang:num_running_reqs", 1},
                 {"vllm:kv_cache_usage_perc", 2},  {"vllm:gpu_cache_usage_perc", 2},
                 {"sglang:token_usage", 2}};
    bool any = false;
    *waiting = *running = *kv = 0;
    const char *end = p + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (*p != '#') {
            size_t nameln = 0;
            while (p + nameln < le && p[nameln] != '{' && p[nameln] != ' ')
                nameln++;
            for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
                if (strlen(names[k].name) != nameln || memcmp(p, names[k].name, nameln) != 0)
                    continue;
                /* the value: the field after the labels (a timestamp may follow) */
                const char *v = p + nameln;
                if (*v == '{') {
                    const char *rb = memchr(v, '}', (size_t)(le - v));
                    v = rb ? rb + 1 : le;
                }
                char num[64];
                while (v < le && *v == ' ')
                    v++;
                size_t vl = 0;
                while (v + vl < le && v[vl] != ' ' && vl < sizeof(num) - 1)
                    vl++;
                memcpy(num, v, vl);
                num[vl] = '\0';
                char *e;
                double x = strtod(num, &e);
                if (vl == 0 || *e != '\0' || !(x >= 0) || x > 1e9)
                    break; /* NaN, negative, or not a number: not believed */
                if (names[k].what == 0)
                    *waiting += x;
                else if (names[k].what == 1)
                    *running += x;
                else if (x > *kv)
                    *kv = x;
                any = true;
                break;
            }
        }
        p = nl ? nl + 1 : end;
    }
    return any;
}

static void on_eng_answer(struct evhttp_request *req, void *arg)
{
    struct gw_svc *s = arg;
    s->eng_busy = false;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    double w, r, kv;
    struct evbuffer *in = req && code == 200 ? evhttp_request_get_input_buffer(req) : NULL;
    size_t len = in ? evbuffer_get_length(in) : 0;
    const char *p =
        in && len > 0 && len < (8u << 20) ? (const char *)evbuffer_pullup(in, -1) : NULL;
    if (p == NULL || !eng_parse(p, len, &w, &r, &kv)) {
        s->eng_errors++;
        return;
    }
    s->eng_reads++;
    s->eng_waiting = w;
    s->eng_running = r;
    s->eng_kv = kv;
    int32_t lim = s->eng_lim > 0 ? s->eng_lim : s->v_lim;
    if (lim > s->v_lim)
        lim = s->v_lim;
    if (w > 0 || kv >= 0.95) {
        /* it queues (or has no room for more): no more at once than it runs, and a tenth less
         * each second it still queues */
        int32_t runs = r >= 1 ? (int32_t)r : 1;
        if (lim > runs)
            lim = runs;
        else if (w > 0)
            lim -= lim / 10 > 0 ? lim / 10 : 1;
    } else if (kv < 0.9) {
        lim += lim / 10 > 0 ? lim / 10 : 1; /* drained: back up, a tenth a second */
    }
    if (lim < 1)
        lim = 1;
    s->eng_lim = lim >= s->v_lim ? 0 : lim;
    s->eng_at = now_s();
    osubd__gw_kick(s); /* a limit raised lets queued requests go */
}

/* Reads the engine's metrics of every service that names them (once a second). */
static void eng_poll(struct osubd_gateway *g)
{
    for (struct gw_svc *s = g->svcs; s != NULL; s = s->next) {
        const struct osubd_route *rt = osubd__gw_route_of(g, s->id);
        if (rt == NULL || rt->metrics_url[0] == '\0') {
            if (s->eng_conn != NULL && !s->eng_busy)
                osubd__gw_eng_drop(s);
            s->eng_lim = 0;
            continue;
        }
        if (s->eng_busy)
            continue;
        if (s->eng_conn != NULL && strcmp(s->eng_url, rt->metrics_url) != 0)
            osubd__gw_eng_drop(s);
        struct evhttp_uri *u = evhttp_uri_parse(rt->metrics_url);
        if (u == NULL)
            continue;
        const char *host = evhttp_uri_get_host(u);
        int port = evhttp_uri_get_port(u);
        const char *path = evhttp_uri_get_path(u);
        char hostport[300], pathq[600];
        snprintf(hostport, sizeof(hostport), "%s:%d", host ? host : "", port);
        snprintf(pathq, sizeof(pathq), "%s%s%s", path && path[0] ? path : "/metrics",
                 evhttp_uri_get_query(u) ? "?" : "",
                 evhttp_uri_get_query(u) ? evhttp_uri_get_query(u) : "");
        char addr[INET6_ADDRSTRLEN] = "";
        if (s->eng_conn == NULL && host != NULL && port > 0) {
            /* resolved here, and never oversubd's own listener (a name may resolve to it) */
            struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
            char ps[16];
            snprintf(ps, sizeof(ps), "%d", port);
            if (getaddrinfo(host, ps, &hints, &ai) == 0 && ai != NULL &&
                osubd_self_match(g->self, ai->ai_addr) == NULL) {
                if (ai->ai_family == AF_INET)
                    inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, addr,
                              sizeof(addr));
                else if (ai->ai_family == AF_INET6)
                    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, addr,
                              sizeof(addr));
            }
            if (ai != NULL)
                freeaddrinfo(ai);
            if (addr[0] == '\0') {
                s->eng_errors++;
                evhttp_uri_free(u);
                continue;
            }
        }
        if (s->eng_conn == NULL && addr[0] != '\0') {
            s->eng_conn = evhttp_connection_base_new(g->base, NULL, addr, (uint16_t)port);
            if (s->eng_conn != NULL) {
                evhttp_connection_set_timeout(s->eng_conn, 2);
                evhttp_connection_set_retries(s->eng_conn, 0);
                snprintf(s->eng_url, sizeof(s->eng_url), "%s", rt->metrics_url);
            }
        }
        struct evhttp_request *req = s->eng_conn ? evhttp_request_new(on_eng_answer, s) : NULL;
        if (req != NULL) {
            evhttp_add_header(evhttp_request_get_output_headers(req), "Host", hostport);
            s->eng_busy = true;
            if (evhttp_make_request(s->eng_conn, req, EVHTTP_REQ_GET, pathq) != 0 && s->eng_busy) {
                /* failed inside the call: libevent freed the request (its callback may have
                 * run and said so already) */
                s->eng_busy = false;
                s->eng_errors++;
            }
        }
        evhttp_uri_free(u);
    }
}

/* Whether r may take a slot now: a request whose body is still arriving (past the read-ahead)
 * only while fewer than half the service's slots are held by such requests, so that slow
 * uploaders never hold every slot. */
bool osubd__gw_stream_ok(const struct gw_svc *s, const struct gw_req *r)
{
    if (r->body_done || !r->had_body)
        return true;
    /* all of it in the client's buffer already: it will not stream */
    if (r->cl != NULL && !r->chunked_body &&
        (int64_t)evbuffer_get_length(r->cl->in) >= r->body_left)
        return true;
    if (r->chunked_body && r->scan.st == H1C_DONE)
        return true;
    int32_t share = osubd__gw_eff_lim(s) / 2 > 0 ? osubd__gw_eff_lim(s) / 2 : 1;
    return s->streaming < share;
}

void osubd__gw_pump(struct osubd_gateway *g, struct gw_svc *s)
{
    if (s->queue == NULL || g->stopping)
        return;
    if (osubd__gw_svc_view(g, s) != 0)
        return;
    if (!s->v_serving) {
        osubd__gw_wake_queued(g, s);
        return;
    }
    int32_t lim = osubd__gw_eff_lim(s);
    while (s->queue != NULL && s->inflight < lim) {
        /* the first in order that may go: a body still arriving only within its share */
        struct gw_req *r = s->queue;
        while (r != NULL && !osubd__gw_stream_ok(s, r))
            r = r->next;
        if (r == NULL)
            break;
        osubd__gw_unqueue(s, r);
        struct gw_client *c = r->cl;
        osubd__gw_dispatch(g, r);
        if (c->cur == NULL)
            osubd__gw_cl_after(c); /* answered at once (no backend): the client reads on */
    }
}

/* Asks for s's queue to be looked at again, from the loop (the caller may hold a client that
 * pump would answer): at once, in this turn of the loop, after the current callback. */
void osubd__gw_kick(struct gw_svc *s)
{
    struct osubd_gateway *g = s->g;
    if (s->queue == NULL || s->kicked)
        return;
    s->kicked = true;
    s->kick_next = g->kicked;
    g->kicked = s;
    event_active(g->kick, EV_TIMEOUT, 1);
}

/* Every service with a queue (a command may have changed what any of them may run). */
void osubd__gw_kick_queued(struct osubd_gateway *g)
{
    if (g->n_queued == 0)
        return;
    for (struct gw_svc *s = g->svcs; s != NULL; s = s->next)
        osubd__gw_kick(s);
}

/* When the state changed since s was last swept: a route that changed or went takes its pooled
 * connections with it (the next owner of the id must never reach the old backend). */
static void svc_sweep(struct osubd_gateway *g, struct gw_svc *s)
{
    if (s->swept_version == osubd_core_version(g->core))
        return;
    s->swept_version = osubd_core_version(g->core);
    osubd__gw_svc_flush_idle(s, osubd__gw_route_of(g, s->id) == NULL);
}

void osubd__gw_on_kick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_gateway *g = arg;
    while (g->kicked != NULL) {
        struct gw_svc *s = g->kicked;
        g->kicked = s->kick_next;
        s->kick_next = NULL;
        s->kicked = false;
        osubd__gw_pump(g, s);
    }
}

void osubd__gw_on_maint(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_gateway *g = arg;
    eng_poll(g); /* the engines' metrics, once a second */
    osubd__gw_idle_tick(g);
    for (struct gw_svc **sp = &g->svcs; *sp != NULL;) {
        struct gw_svc *s = *sp;
        osubd__gw_kick(s); /* what time alone changes (an engine's limit gone stale) */
        svc_sweep(g, s);
        /* a service gone takes its gateway state once no request points at it */
        bool gone = osubd__gw_route_of(g, s->id) == NULL;
        if (gone && s->refs == 0 && s->queue == NULL && s->inflight == 0 && !s->eng_busy &&
            !s->kicked) {
            *sp = s->next;
            osubd__gw_eng_drop(s);
            free(s);
            continue;
        }
        sp = &s->next;
    }
}

struct gw_svc *osubd__gw_svc_of(struct osubd_gateway *g, const char *id)
{
    struct gw_svc *s = osubd__gw_svc_find(g, id, strlen(id));
    if (s != NULL)
        return s;
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->g = g;
    s->next = g->svcs;
    g->svcs = s;
    return s;
}
