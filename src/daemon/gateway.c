/* gateway.c - the entry's overload protection (see gateway.h): an HTTP/1.1 reverse proxy of our
 * own on non-blocking sockets. One service's state: requests in flight to its backends (at most
 * its limit, which shrinks while it is degraded) and a queue ordered by priority then arrival,
 * each request with a deadline. Beyond the queue, or past the deadline: 429 with Retry-After
 * from the measured drain rate.
 *
 * HTTP handling is ours rather than evhttp's: a request's head is parsed in place from one
 * buffer, nothing is allocated per header, a rejection is one prebuilt write(), and backend
 * connections are kept alive in a pool per service and backend. Bodies stream both ways
 * (Content-Length, chunked passed through as framed, or until close for responses). */
#define _GNU_SOURCE
#include "gateway.h"
#include "h1.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>

#include "conns.h"
#include "core.h"

#define GW_BODY_MAX (64LL * 1024 * 1024) /* a request body through the gateway: beyond it, 413 */
#define GW_DISCARD_MAX (1LL << 30) /* a refused body read and dropped, so the answer is read */
#define LINGER_S 5                 /* at most this long */
#define HEAD_TIMEOUT_S 10          /* a request's head must arrive within this */
#define IDLE_TIMEOUT_S 60          /* a kept-alive client may idle this long */
#define BODY_TIMEOUT_S 30          /* between two reads of a request's body */
/* A request takes a slot (or a queue place) only once its body has arrived, up to this much of
 * it: a client trickling its body holds its own connection, never a slot other clients need
 * (issue 23: two bodies at a byte every 8 s held both slots of a service for 20 s). */
#define GW_PREREAD (1024 * 1024)
#define PREREAD_TIMEOUT_S 30 /* ... and that much must arrive within this */
/* a body larger than GW_PREREAD streams once it has its slot, but no slower than this on
 * average after its first STREAM_GRACE_S (nginx's client_body_timeout is per read; a rate
 * floor also stops a byte every few seconds) */
#define STREAM_FLOOR_BPS (16 * 1024)
#define STREAM_GRACE_S 10
#define BACKEND_TIMEOUT_S 60       /* a backend's answer, between two reads */
#define CONNS_PER_CLIENT 256       /* connections one client address may hold */
#define OUT_HIGH (4 * 1024 * 1024) /* a client's unsent bytes that pause its backend */
#define IDLE_PER_BACKEND 1024      /* kept-alive backend connections (as many as streams at once) */

struct gw_svc;
struct gw_client;
struct gw_bconn;

/* One request, from its head's arrival to its answer's last byte. */
struct gw_req {
    struct gw_req *next; /* in the queue (or the free list) */
    struct osubd_gateway *g;
    struct gw_svc *svc;
    struct gw_client *cl;
    struct gw_bconn *bc; /* while in flight */
    char *head;          /* the head as received (malloc'd, head_cap bytes), parsed in place */
    size_t head_cap;
    const char *method, *uri;
    size_t mlen, ulen;
    bool http10, keepalive, is_head, by_host;
    bool chunked_body;
    int64_t body_left; /* Content-Length bytes still to pass on */
    struct h1_chunked cs;
    bool body_done, had_body;
    int retries; /* on a pooled connection that turned out closed */
    int32_t prio;
    long deadline_ms;       /* its queue deadline (the service's, or the client's shorter one) */
    bool awaiting_body;     /* head read, body still arriving: no slot, no queue place yet */
    bool continued;         /* 100 Continue sent already (to have the body before a slot) */
    struct h1_chunked scan; /* awaiting a chunked body: its framing scanned ahead, ... */
    size_t scanned;         /* ... over this many bytes of the client's buffer */
    double stream_t0;       /* its body began streaming to the backend (slot held) */
    bool streams;           /* counted in its service's streaming */
    int64_t streamed;       /* body bytes sent to the backend since */
    struct event *timer;
    bool started; /* the answer's head went out: the body streams */
    int status;   /* the answer's status (the gateway's own or the backend's) */
    double t0, t_sent;
    struct h1_head hd; /* its head, parsed (h1.h); last: not cleared when reused */
};

struct gw_client {
    struct gw_client *prev, *next; /* every open client */
    struct osubd_gateway *g;
    int fd;
    struct event *rev, *wev, *timer;
    struct evbuffer *in, *out;
    struct gw_req *cur; /* the request being answered; pipelined ones wait in `in` */
    char peer[INET6_ADDRSTRLEN];
    struct peer_count *pc;
    bool closing;      /* close once out is sent */
    bool gone;         /* a write failed: the client left */
    bool last_request; /* stopping: no request read after the current one */
    bool bad_framing;  /* its request's body framing broke: closed, counted as a bad request */
    struct event *hup, *hup_tick; /* while its reads are paused: its leaving is still seen */
    bool lingering;  /* answered and half-closed: reading and discarding what it still sends */
    int64_t discard; /* bytes still to read and discard before closing (a refused body) */
    bool paused_bc;  /* its backend's reads wait for out to drain */
    bool in_head;    /* a head is arriving */
};

struct gw_bconn {
    struct gw_bconn *next; /* idle list */
    struct gw_svc *svc;
    int backend;
    int fd;
    struct event *rev, *wev, *timer;
    struct evbuffer *in, *out;
    struct gw_req *r;
    bool connected;
    int st; /* 0 head, 1 body by length, 2 chunked, 3 until close, 4 done */
    int64_t left;
    struct h1_chunked cs;
    bool keepalive;
    bool got_bytes; /* something came back: a failure now is not a refusal */
    bool reused;    /* taken from the pool: the backend may have closed it meanwhile */
    bool broken;    /* a send failed: failed from the loop (the timer at once), not from the
                     * sender, whose caller still holds the client */
    char url[OSUBD_ROUTE_URL_MAX + 1]; /* the backend URL it was opened for: pooled and taken
                                        * again only while the route still names it there */
};

struct peer_count {
    struct peer_count *next;
    char addr[INET6_ADDRSTRLEN];
    int n;
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

struct osubd_gateway;

struct gw_svc {
    struct gw_svc *next;
    struct osubd_gateway *g;
    char id[OSUB_ID_MAX + 1];
    struct gw_req *queue;
    int32_t n_queued, inflight;
    int32_t refs;      /* requests that point at it: it is freed, once its route is gone, at 0 */
    int32_t streaming; /* in flight with their body still arriving: at most half the slots */
    uint64_t swept_version;    /* the state version its idle connections were last checked at */
    struct gw_bconn *idle[16]; /* per backend */
    int n_idle[16];
    uint32_t rr;
    uint64_t admitted, completed, rej_full, rej_deadline, rej_unavailable, rej_shed, backend_errors;
    uint64_t client_gone;   /* requests whose client left (queued or in flight) */
    uint64_t answers[6];    /* the backends' answers by status class (1xx..5xx) */
    double rate, last_done; /* completions a second (moving average), and when the last was */
    /* a backend that failed is out of rotation until down_until; the first request after
     * that probes it (failing again doubles the wait, up to 30 s) */
    double down_until[16], backoff[16];
    char bhost[16][300]; /* each backend's Host header */
    struct sockaddr_storage baddr[16];
    socklen_t baddr_len[16];
    char baddr_url[16][300];          /* the URL baddr was resolved from */
    struct hist queue_wait, upstream; /* seconds */
    struct hist ttfb;                 /* sent to the backend -> the answer's head: seconds */
    /* the view of the engine and the route (svc_view), as of state version view_version */
    uint64_t view_version;
    bool view_ok, v_serving;
    int32_t v_level, v_lim, v_maxq, v_shed;
    /* the serving engine's own saturation (its metrics_url, read every second): while it
     * queues or its KV cache is full, at most eng_lim requests go to it; the rest wait in our
     * queue, by priority, instead of in its FIFO */
    struct evhttp_connection *eng_conn;
    char eng_url[OSUBD_ROUTE_URL_MAX + 1]; /* what eng_conn was opened for */
    bool eng_busy;                         /* a read in flight */
    double eng_at;                         /* the last good read (0: none) */
    int32_t eng_lim;                       /* 0: no limit of its own (no metrics, or stale) */
    double eng_waiting, eng_running, eng_kv;
    uint64_t eng_reads, eng_errors;
    long v_qt, v_upstream_ms;
};

static int gateway_listen(struct osubd_gateway *g, char *err, size_t errlen);

struct osubd_gateway {
    struct osubd_core *core;
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    const struct osubd_routes *routes; /* each service's backends and limits */
    struct osubd_self *self;           /* oversubd's own addresses: never a backend */
    struct evconnlistener *lis;
    struct event *pump;
    struct gw_svc *svcs;
    struct peer_count *peers[1024]; /* connections per client address, hashed */
    uint64_t no_route, bad_requests, refused_conns, too_large, client_gone;
    struct evbuffer *scratch; /* one message at a time passes through it */
    struct h1_head resp;      /* the backend answer's head being parsed */
    struct gw_req *free_reqs; /* requests to reuse */
    struct gw_client *clients;
    int n_clients;
    bool stopping, draining;
    FILE *access; /* the access log (NULL: none) */
    int n_free;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the service's limit and the drain rate ---------------------------------------- */

/* Whole seconds until the queue ahead has likely drained, at least 1. */
/* Milliseconds until a refused client likely finds room: its place behind the queue over the
 * rate at which the service completes requests (1 s when unknown), spread by jitter between
 * half and one and a half of that (the wait at least 100 ms), so that refused clients do not
 * come back together. At most 60 s. */
static int retry_after(const struct gw_svc *s)
{
    static uint64_t x = 0x9e3779b97f4a7c15ULL;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double rate = s->rate;
    if (rate > 0.0 && s->last_done > 0) {
        double quiet = now_s() - s->last_done; /* nothing completed for this long: slower */
        if (quiet * rate > 1.0)
            rate = 1.0 / quiet;
    }
    double base = rate > 0.0 ? (double)(s->n_queued + 1) / rate * 1000.0 : 1000.0;
    if (base < 200)
        base = 200; /* sooner is not worth a round trip; with the jitter, 100 to 300 ms */
    if (base > 40000)
        base = 40000; /* capped before the jitter: a long wait is still spread (20 to 60 s) */
    double ms = base * (0.5 + (double)(x >> 11) / 9007199254740992.0); /* [0.5, 1.5) x base */
    return ms > 60000 ? 60000 : (int)ms;
}

/* ---- the service's limit ------------------------------------------------------------------- */

static const struct osubd_route *route_of(const struct osubd_gateway *d, const char *id)
{
    return osubd_routes_get(d->routes, id);
}

static int32_t limit_of(const struct osubd_gateway *d, const char *id, const osub_service_info_t *si)
{
    const struct osubd_route *r = route_of(d, id);
    int32_t base = r != NULL && r->max_inflight > 0 ? r->max_inflight
                   : si->spec->batch_size > 0       ? si->spec->batch_size
                                                    : 8;
    if (base > OSUBD_ROUTE_INFLIGHT_MAX)
        base = OSUBD_ROUTE_INFLIGHT_MAX;
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

static int32_t max_queue_of(const struct osubd_gateway *d, const char *id, int32_t limit)
{
    const struct osubd_route *r = route_of(d, id);
    return r != NULL && r->max_queue >= 0 ? r->max_queue : 2 * limit;
}

/* Shedding: while a GPU the service runs on is above the high watermark (held, or used where
 * that is more), requests at the lowest priority are refused first; past halfway from there
 * to full, every level but the highest. The highest level (online) is never shed. Returns the
 * level from which requests are shed (INT32_MAX: none). */
static int32_t shed_from(const struct osubd_gateway *d, const osub_service_info_t *si)
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

/* ---- small I/O helpers ------------------------------------------------------------------------
 */

/* Reads what the socket has (up to 64 KiB) into b: one read(), no FIONREAD as evbuffer_read
 * makes. Returns read()'s result. */
static int read_into(struct evbuffer *b, int fd)
{
    struct evbuffer_iovec v;
    if (evbuffer_reserve_space(b, 65536, &v, 1) < 1)
        return -1;
    ssize_t n = read(fd, v.iov_base, v.iov_len < 65536 ? v.iov_len : 65536);
    if (n > 0) {
        v.iov_len = (size_t)n;
        evbuffer_commit_space(b, &v, 1);
    } else {
        evbuffer_commit_space(b, &v, 0);
    }
    return (int)n;
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Sends at once what the socket takes and keeps the rest for its write event. false: the peer is
 * gone. */
static bool send_bytes(int fd, struct evbuffer *out, struct event *wev, const char *p, size_t n)
{
    if (n == 0)
        return true;
    if (evbuffer_get_length(out) == 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return false;
            w = 0;
        }
        p += w;
        n -= (size_t)w;
        if (n == 0)
            return true;
    }
    evbuffer_add(out, p, n);
    event_add(wev, NULL);
    return true;
}

static bool send_buffer(int fd, struct evbuffer *out, struct event *wev, struct evbuffer *b)
{
    if (evbuffer_get_length(out) == 0) {
        while (evbuffer_get_length(b) > 0) {
            int w = evbuffer_write(b, fd);
            if (w < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                    return false;
                break;
            }
            if (w == 0)
                break;
        }
        if (evbuffer_get_length(b) == 0)
            return true;
    }
    evbuffer_add_buffer(out, b);
    event_add(wev, NULL);
    return true;
}

/* ---- clients ------------------------------------------------------------------------------ */

static void cl_close(struct gw_client *c);
static void cl_arm(struct gw_client *c, int seconds);
static void access_log(struct gw_req *r, int status, const char *outcome);
static int format_answer(char *buf, size_t len, int code, const char *phrase, const char *ecode,
                         const char *reason, const char *msg, int retry_after, bool close_it,
                         bool head, int *split);
static void cl_process(struct gw_client *c);
static void bc_close(struct gw_bconn *bc);
static void pump(struct osubd_gateway *g, struct gw_svc *s);
static void forward_body(struct gw_req *r);

/* A request to fill: reused from earlier ones when there are (its head buffer with it). */
/* Room for a head of head_len bytes (and its NUL) in r->head; -1 (r freed) without memory. */
static int req_reserve(struct gw_req *r, size_t head_len)
{
    if (r->head_cap >= head_len + 1)
        return 0;
    size_t want = head_len + 1 < 2048 ? 2048 : head_len + 1;
    char *nh = realloc(r->head, want);
    if (nh == NULL) {
        free(r->head);
        free(r);
        return -1;
    }
    r->head = nh;
    r->head_cap = want;
    return 0;
}

static struct gw_req *req_new(struct osubd_gateway *g, size_t head_len)
{
    struct gw_req *r = g->free_reqs;
    if (r != NULL) {
        g->free_reqs = r->next;
        g->n_free--;
    } else if ((r = malloc(sizeof(*r))) == NULL) {
        return NULL;
    } else {
        r->head = NULL;
        r->head_cap = 0;
    }
    char *head = r->head;
    size_t cap = r->head_cap;
    memset(r, 0, offsetof(struct gw_req, hd)); /* the head is filled as parsed */
    r->head = head;
    r->head_cap = cap;
    r->g = g;
    if (req_reserve(r, head_len) != 0)
        return NULL;
    return r;
}

static void req_free(struct gw_req *r)
{
    if (r->timer) {
        event_free(r->timer);
        r->timer = NULL;
    }
    if (r->svc != NULL) {
        if (r->streams)
            r->svc->streaming--;
        r->streams = false;
        r->svc->refs--;
        r->svc = NULL;
    }
    struct osubd_gateway *g = r->g;
    if (g != NULL && g->n_free < 256 && r->head_cap <= 16384) {
        r->next = g->free_reqs;
        g->free_reqs = r;
        g->n_free++;
        return;
    }
    free(r->head);
    free(r);
}

/* The client is done with r (answered, or gone): the next request may be read. */
static void req_detach(struct gw_req *r)
{
    if (r->cl != NULL && r->cl->cur == r)
        r->cl->cur = NULL;
    req_free(r);
}

static void client_gone(struct gw_client *c, const char *why);

/* A paused client's end: EV_CLOSED (EPOLLRDHUP) for a FIN; a reset shows only as an error on
 * the socket (libevent reports EPOLLHUP as read and write, which a paused client does not
 * wait for), so a timer looks at SO_ERROR every 250 ms while paused. */
static void cl_on_hup(evutil_socket_t fd, short what, void *arg)
{
    int err = 0;
    socklen_t l = sizeof(err);
    if ((what & EV_CLOSED) || (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) == 0 && err != 0))
        client_gone(arg, "closed while its reads were paused");
}

/* Reads paused (a body beyond what is buffered for a queued request, or a backend slower than
 * the client): a client that leaves meanwhile is still noticed, by EV_CLOSED (EPOLLRDHUP). */
static void cl_read_pause(struct gw_client *c)
{
    event_del(c->rev);
    if (c->hup == NULL) {
        c->hup = event_new(c->g->base, c->fd, EV_CLOSED | EV_PERSIST, cl_on_hup, c);
        c->hup_tick = event_new(c->g->base, c->fd, EV_PERSIST, cl_on_hup, c);
    }
    struct timeval tv = {0, 250000};
    if (c->hup != NULL)
        event_add(c->hup, NULL);
    if (c->hup_tick != NULL)
        event_add(c->hup_tick, &tv);
}

static void cl_read_resume(struct gw_client *c)
{
    if (c->hup != NULL)
        event_del(c->hup);
    if (c->hup_tick != NULL)
        event_del(c->hup_tick);
    event_add(c->rev, NULL);
}

static void cl_send(struct gw_client *c, const char *p, size_t n)
{
    if (!send_bytes(c->fd, c->out, c->wev, p, n)) {
        c->closing = c->gone = true; /* the client is gone */
        evbuffer_drain(c->out, evbuffer_get_length(c->out));
    }
}

/* The client left (closed, reset, or cannot be written to): its request's backend connection
 * is closed, never pooled (vLLM and TGI stop generating when theirs closes), its slot freed at
 * once, a queued request leaves the queue. */
static void client_gone(struct gw_client *c, const char *why)
{
    (void)why;
    if (c->cur != NULL) {
        c->g->client_gone++;
        if (c->cur->svc != NULL)
            c->cur->svc->client_gone++;
        access_log(c->cur, 499, "client_gone"); /* nginx's number for it */
    }
    cl_close(c);
}

/* A connection done with: closed, or when a refused body is still coming, half-closed after
 * the answer and read (and dropped) for a while, so the client reads the answer instead of a
 * reset. */
static void cl_end(struct gw_client *c)
{
    if (c->discard > 0 && !c->lingering && !c->gone) {
        c->lingering = true;
        shutdown(c->fd, SHUT_WR);
        event_add(c->rev, NULL);
        cl_arm(c, LINGER_S);
        return;
    }
    cl_close(c);
}

/* After an answer: close when asked to and all is sent, else read on (pipelined requests). */
static void cl_after(struct gw_client *c)
{
    if (c->closing) {
        if (evbuffer_get_length(c->out) == 0 && c->cur == NULL)
            cl_close(c);
        return;
    }
    cl_process(c);
}

/* One JSON line per request in the access log: when, who, what, the answer and why. */
static void access_log(struct gw_req *r, int status, const char *outcome)
{
    struct osubd_gateway *g = r->g;
    if (g == NULL || g->access == NULL)
        return;
    double t = now_s();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char path[300];
    size_t n = r->ulen < sizeof(path) - 1 ? r->ulen : sizeof(path) - 1;
    for (size_t i = 0; i < n; i++) /* a target has no control characters (the codec): quotes */
        path[i] = r->uri[i] == '"' || r->uri[i] == '\\' ? '_' : r->uri[i];
    path[n] = '\0';
    fprintf(g->access,
            "{\"time_unix_ms\":%lld,\"client\":\"%s\",\"service\":\"%s\",\"method\":\"%.*s\","
            "\"path\":\"%s\",\"status\":%d,\"outcome\":\"%s\",\"ms\":%.1f",
            (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, r->cl ? r->cl->peer : "",
            r->svc ? r->svc->id : "", (int)r->mlen, r->method, path, status, outcome,
            r->t0 > 0 ? (t - r->t0) * 1000.0 : 0.0);
    if (r->t_sent > 0)
        fprintf(g->access, ",\"queue_ms\":%.1f", (r->t_sent - r->t0) * 1000.0);
    fputs("}\n", g->access);
}

/* An answer of the gateway's own: JSON, one write. The texts are the gateway's own literals, so
 * an answer is built once per (code, texts, Retry-After, framing) and kept: a rejection costs
 * a lookup and a send. */
struct canned {
    const char *ecode, *reason, *msg;
    int code;
    bool close, head, ka10;
    int len, split; /* bytes; the Retry-After fields go in at split */
    char bytes[1280];
};

/* A JSON error answer, head and body, into buf; returns its length. *split: where fields of
 * the moment (Retry-After) may be inserted (after the fixed fields). */
static bool keep_alive_10; /* the answer being formatted goes to an HTTP/1.0 keep-alive client */

static int format_answer(char *buf, size_t len, int code, const char *phrase, const char *ecode,
                         const char *reason, const char *msg, int retry_after, bool close_it,
                         bool head, int *split)
{
    char body[768], ra[80] = "";
    /* OpenAI's error shape (message, type, param, code), which its SDKs read; reason: ours */
    const char *type = code == 429   ? "rate_limit_error"
                       : code >= 500 ? "server_error"
                                     : "invalid_request_error";
    int bl = snprintf(body, sizeof(body),
                      "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
                      "\"code\":\"%s\",\"reason\":\"%s\"}}\n",
                      msg, type, ecode, reason);
    if (retry_after > 0)
        snprintf(ra, sizeof(ra), "Retry-After: %d\r\nRetry-After-Ms: %d\r\n",
                 (retry_after + 999) / 1000, retry_after);
    int n = snprintf(buf, len,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n",
                     code, phrase, bl);
    if (split != NULL)
        *split = n;
    n += snprintf(buf + n, len - (size_t)n, "%s%s\r\n%s", ra,
                  close_it        ? "Connection: close\r\n"
                  : keep_alive_10 ? "Connection: keep-alive\r\n"
                                  : "",
                  head ? "" : body);
    return n < (int)len ? n : (int)len - 1;
}

static void reply(struct gw_req *r, int code, const char *phrase, const char *ecode,
                  const char *reason, const char *msg, int retry_after)
{
    static struct canned cache[16];
    static unsigned next_slot;
    struct gw_client *c = r->cl;
    if (c == NULL) {
        req_free(r);
        return;
    }
    access_log(r, code, reason);
    /* a body we will not read: the connection cannot carry another request */
    bool close_it = !r->keepalive || !r->body_done;
    bool head = r->is_head, ka10 = r->http10 && !close_it;
    struct canned *k = NULL;
    for (int i = 0; i < 16 && k == NULL; i++)
        if (cache[i].msg == msg && cache[i].code == code && cache[i].ecode == ecode &&
            cache[i].reason == reason && cache[i].close == close_it && cache[i].head == head &&
            cache[i].ka10 == ka10)
            k = &cache[i];
    if (k == NULL) {
        k = &cache[next_slot++ % 16];
        keep_alive_10 = ka10;
        k->len = format_answer(k->bytes, sizeof(k->bytes), code, phrase, ecode, reason, msg, 0,
                               close_it, head, &k->split);
        keep_alive_10 = false;
        k->ka10 = ka10;
        k->msg = msg;
        k->code = code;
        k->ecode = ecode;
        k->reason = reason;
        k->close = close_it;
        k->head = head;
    }
    if (close_it)
        c->closing = true;
    if (!r->body_done) /* its body, unread: read and dropped after the answer, so it is read */
        c->discard =
            r->chunked_body || r->body_left > GW_DISCARD_MAX ? GW_DISCARD_MAX : r->body_left;
    req_detach(r);
    if (retry_after <= 0) {
        cl_send(c, k->bytes, (size_t)k->len);
        return;
    }
    /* Retry-After of the moment (spread by jitter): between the fixed fields and the rest */
    char buf[1400];
    memcpy(buf, k->bytes, (size_t)k->split);
    int n = k->split + snprintf(buf + k->split, 80, "Retry-After: %d\r\nRetry-After-Ms: %d\r\n",
                                (retry_after + 999) / 1000, retry_after);
    memcpy(buf + n, k->bytes + k->split, (size_t)(k->len - k->split));
    cl_send(c, buf, (size_t)(n + k->len - k->split));
}

/* A request that never became one (bad head): answer and close. */
static void reply_bad(struct gw_client *c, int code, const char *phrase, const char *msg)
{
    char buf[1280];
    const char *ecode = code == 413   ? "body_too_large"
                        : code == 414 ? "uri_too_long"
                        : code == 431 ? "headers_too_large"
                        : code == 501 ? "not_implemented"
                        : code == 505 ? "http_version_not_supported"
                        : code == 503 ? "unavailable"
                                      : "bad_request";
    const char *reason = code == 503 ? "memory" : code == 400 ? "malformed" : "limit";
    int n = format_answer(buf, sizeof(buf), code, phrase, ecode, reason, msg, 0, true, false, NULL);
    c->g->bad_requests++;
    if (c->g->access != NULL) { /* no request was parsed: who, the answer and why */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        fprintf(c->g->access,
                "{\"time_unix_ms\":%lld,\"client\":\"%s\",\"status\":%d,\"outcome\":\"%s\"}\n",
                (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, c->peer, code, ecode);
    }
    c->closing = true;
    evbuffer_drain(c->in, evbuffer_get_length(c->in));
    cl_send(c, buf, (size_t)n);
}

static void cl_arm(struct gw_client *c, int seconds)
{
    struct timeval tv = {seconds, 0};
    event_add(c->timer, &tv);
}

static void cl_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_client *c = arg;
    if (c->gone) {
        if (c->bad_framing)
            cl_close(c);
        else
            client_gone(c, "a write failed");
        return;
    }
    if (!c->lingering && c->cur != NULL && c->cur->awaiting_body) {
        /* a body that did not arrive in time: it never had a slot; 408 and close */
        char buf[1280];
        int n =
            format_answer(buf, sizeof(buf), 408, "Request Timeout", "timeout", "body_timeout",
                          "the request's body did not arrive within 30 s", 0, true, false, NULL);
        send(c->fd, buf, (size_t)n, MSG_NOSIGNAL);
        access_log(c->cur, 408, "body_timeout");
        c->g->bad_requests++;
        cl_close(c);
        return;
    }
    if (!c->lingering && c->in_head && c->cur == NULL) {
        /* a head that did not arrive in time (slowloris): 408 and close */
        char buf[1280];
        int n =
            format_answer(buf, sizeof(buf), 408, "Request Timeout", "timeout", "head_timeout",
                          "the request's head did not arrive within 10 s", 0, true, false, NULL);
        send(c->fd, buf, (size_t)n, MSG_NOSIGNAL);
    }
    cl_close(c);
}

static void cl_on_write(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct gw_client *c = arg;
    while (evbuffer_get_length(c->out) > 0) {
        int w = evbuffer_write(c->out, fd);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return;
            client_gone(c, "a write failed");
            return;
        }
        if (w == 0)
            return;
    }
    event_del(c->wev);
    if (c->paused_bc && c->cur != NULL && c->cur->bc != NULL) {
        c->paused_bc = false;
        event_add(c->cur->bc->rev, NULL);
    }
    if (c->closing && c->cur == NULL && !c->lingering)
        cl_end(c);
}

static void cl_on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct gw_client *c = arg;
    int n = read_into(c->in, fd);
    if (c->lingering) {
        evbuffer_drain(c->in, evbuffer_get_length(c->in));
        c->discard -= n > 0 ? n : 0;
        if (n == 0 || c->discard <= 0 ||
            (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            cl_close(c);
        return;
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        /* the end of the client's side while its request waits or runs: it left (an SDK that
         * gives up closes its socket), as nginx and HAProxy read it by default */
        client_gone(c, n == 0 ? "closed" : "reset");
        return;
    }
    if (n < 0)
        return;
    if (c->closing) {
        evbuffer_drain(c->in, evbuffer_get_length(c->in));
        return;
    }
    cl_process(c);
}

/* A request's fields from its parsed head (r->hd, into r->head). */
static void req_from_head(struct gw_req *r)
{
    const struct h1_head *h = &r->hd;
    r->method = h->method;
    r->mlen = h->mlen;
    r->uri = h->target;
    r->ulen = h->tlen;
    r->http10 = h->minor == 0;
    r->keepalive = h->keepalive;
    r->is_head = h->mlen == 4 && memcmp(h->method, "HEAD", 4) == 0;
    r->chunked_body = h->chunked;
    r->body_left = h->content_length > 0 ? h->content_length : 0;
    r->body_done = !r->chunked_body && r->body_left == 0;
    r->had_body = !r->body_done;
    if (r->chunked_body) /* CRLF framing only: a bare LF would be read otherwise behind us */
        h1_chunked_init(&r->cs, GW_BODY_MAX, false);
}

static const char *phrase_of(int code)
{
    switch (code) {
    case 400:
        return "Bad Request";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 431:
        return "Request Header Fields Too Large";
    case 501:
        return "Not Implemented";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Error";
    }
}

static void handle(struct gw_client *c, struct gw_req *r);
static void admit(struct osubd_gateway *g, struct gw_req *r);
static bool body_arrived(struct gw_client *c, struct gw_req *r);

static void cl_process_inner(struct gw_client *c)
{
    while (!c->closing) {
        if (c->cur != NULL) {
            if (c->cur->awaiting_body) {
                if (!body_arrived(c, c->cur))
                    return;
                c->cur->awaiting_body = false;
                event_del(c->timer);
                admit(c->g, c->cur);
                continue; /* answered at once, dispatched, or queued */
            }
            if (c->cur->bc != NULL && !c->cur->body_done)
                forward_body(c->cur);
            /* a queued request's body waits in `in`; beyond 1 MiB we stop reading */
            if (evbuffer_get_length(c->in) > 1024 * 1024)
                cl_read_pause(c);
            return;
        }
        if (c->last_request) {
            c->closing = true; /* the gateway is stopping: its answer was the last */
            return;
        }
        size_t len = evbuffer_get_length(c->in);
        /* empty lines before a request line are allowed (RFC 9112, 2.2); they start the head's
         * clock like any other byte of it (a client may not idle on them) */
        bool stripped = false;
        while (len > 0) {
            unsigned char ch;
            evbuffer_copyout(c->in, &ch, 1);
            if (ch != '\r' && ch != '\n')
                break;
            evbuffer_drain(c->in, 1);
            len--;
            stripped = true;
        }
        if (stripped && !c->in_head) {
            c->in_head = true;
            cl_arm(c, HEAD_TIMEOUT_S);
        }
        if (len == 0) {
            if (!c->in_head)
                cl_arm(c, IDLE_TIMEOUT_S);
            return;
        }
        /* the head, found and checked by the codec: one line-ending policy for the whole
         * head, so a bare-LF head never swallows the request pipelined after it */
        size_t look = len < H1_HEAD_MAX + 1 ? len : H1_HEAD_MAX + 1;
        const char *buf = (const char *)evbuffer_pullup(c->in, (ssize_t)look);
        struct gw_req *r = req_new(c->g, 0);
        if (r == NULL) {
            reply_bad(c, 503, "Service Unavailable", "out of memory");
            return;
        }
        int prc = h1_parse_request(buf, look, &r->hd);
        if (prc == H1_PARTIAL) {
            req_free(r);
            if (!c->in_head) {
                c->in_head = true; /* the head's clock starts at its first byte, once */
                cl_arm(c, HEAD_TIMEOUT_S);
            }
            return;
        }
        if (prc == H1_BAD) {
            int code = r->hd.err_status;
            const char *why = r->hd.err_why;
            req_free(r);
            reply_bad(c, code, phrase_of(code), why);
            return;
        }
        size_t hl = r->hd.len;
        c->in_head = false;
        event_del(c->timer);
        if (req_reserve(r, hl) != 0) {
            reply_bad(c, 503, "Service Unavailable", "out of memory");
            return;
        }
        memcpy(r->head, buf, hl);
        r->head[hl] = '\0';
        h1_head_rebase(&r->hd, buf, r->head);
        evbuffer_drain(c->in, hl);
        r->cl = c;
        req_from_head(r);
        if (r->body_left > GW_BODY_MAX) {
            /* refused before its body: read and discard a bounded amount, so that the
             * client gets to read the answer instead of a reset */
            c->g->too_large++;
            c->discard = r->body_left < GW_DISCARD_MAX ? r->body_left : GW_DISCARD_MAX;
            req_free(r);
            reply_bad(c, 413, "Content Too Large", "the body is over 64 MiB");
            return;
        }
        c->cur = r;
        handle(c, r);
    }
}

/* Reads what requests the buffer holds; the last thing a caller does with c (it may be
 * closed). */
static void cl_process(struct gw_client *c)
{
    cl_process_inner(c);
    if (c->closing && c->cur == NULL && evbuffer_get_length(c->out) == 0 && !c->lingering)
        cl_end(c);
}

static unsigned peer_hash(const char *a)
{
    unsigned h = 2166136261u;
    for (; *a; a++)
        h = (h ^ (unsigned char)*a) * 16777619u;
    return h % 1024;
}

/* One connection fewer for that address; an address with none is forgotten. */
static void peer_release(struct osubd_gateway *g, struct peer_count *pc)
{
    if (--pc->n > 0)
        return;
    for (struct peer_count **pp = &g->peers[peer_hash(pc->addr)]; *pp; pp = &(*pp)->next)
        if (*pp == pc) {
            *pp = pc->next;
            free(pc);
            return;
        }
}

static void cl_close(struct gw_client *c)
{
    struct gw_req *r = c->cur;
    if (r != NULL) {
        struct gw_svc *s = r->svc;
        if (r->bc != NULL) {
            /* in flight: the backend's answer has nowhere to go */
            struct gw_bconn *bc = r->bc;
            bc->r = NULL;
            bc_close(bc);
            s->inflight--;
            req_free(r);
            pump(s->g, s);
        } else if (s != NULL && r->timer != NULL) {
            for (struct gw_req **p = &s->queue; *p; p = &(*p)->next)
                if (*p == r) {
                    *p = r->next;
                    s->n_queued--;
                    break;
                }
            req_free(r);
        } else {
            req_free(r);
        }
        c->cur = NULL;
    }
    if (c->pc != NULL)
        peer_release(c->g, c->pc);
    if (c->prev)
        c->prev->next = c->next;
    else
        c->g->clients = c->next;
    c->g->n_clients--;
    if (c->next)
        c->next->prev = c->prev;
    event_free(c->rev);
    event_free(c->wev);
    event_free(c->timer);
    if (c->hup != NULL)
        event_free(c->hup);
    if (c->hup_tick != NULL)
        event_free(c->hup_tick);
    evbuffer_free(c->in);
    evbuffer_free(c->out);
    close(c->fd);
    free(c);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    (void)l;
    (void)salen;
    struct osubd_gateway *g = arg;
    char peer[INET6_ADDRSTRLEN] = "";
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, peer, sizeof(peer));
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, peer, sizeof(peer));
    /* one client address holds at most its share of connections (slow clients included) */
    unsigned hb = peer_hash(peer);
    struct peer_count *pc = g->peers[hb];
    while (pc != NULL && strcmp(pc->addr, peer) != 0)
        pc = pc->next;
    if (pc == NULL && (pc = calloc(1, sizeof(*pc))) != NULL) {
        snprintf(pc->addr, sizeof(pc->addr), "%s", peer);
        pc->next = g->peers[hb];
        g->peers[hb] = pc;
    }
    int share = g->cfg->gateway_conns_per_client > 0 ? g->cfg->gateway_conns_per_client
                                                       : CONNS_PER_CLIENT;
    if (pc != NULL && pc->n >= share) {
        g->refused_conns++;
        close(fd);
        return;
    }
    struct gw_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        if (pc != NULL && pc->n == 0) {
            pc->n = 1; /* made for this connection: forgotten with it */
            peer_release(g, pc);
        }
        close(fd);
        return;
    }
    c->g = g;
    c->fd = fd;
    c->pc = pc;
    if (pc != NULL)
        pc->n++;
    memcpy(c->peer, peer, sizeof(peer));
    set_nodelay(fd);
    c->in = evbuffer_new();
    c->out = evbuffer_new();
    c->rev = event_new(g->base, fd, EV_READ | EV_PERSIST, cl_on_read, c);
    c->wev = event_new(g->base, fd, EV_WRITE | EV_PERSIST, cl_on_write, c);
    c->timer = evtimer_new(g->base, cl_on_timer, c);
    if (c->in == NULL || c->out == NULL || c->rev == NULL || c->wev == NULL || c->timer == NULL) {
        if (c->in)
            evbuffer_free(c->in);
        if (c->out)
            evbuffer_free(c->out);
        if (c->rev)
            event_free(c->rev);
        if (c->wev)
            event_free(c->wev);
        if (c->timer)
            event_free(c->timer);
        if (pc)
            peer_release(g, pc);
        close(fd);
        free(c);
        return;
    }
    c->next = g->clients;
    if (g->clients)
        g->clients->prev = c;
    g->clients = c;
    g->n_clients++;
    event_add(c->rev, NULL);
    cl_arm(c, HEAD_TIMEOUT_S);
}
/* ---- backends ------------------------------------------------------------------------------ */

static void finish(struct gw_req *r, bool ok);

static void bc_close(struct gw_bconn *bc)
{
    if (bc->rev)
        event_free(bc->rev);
    if (bc->wev)
        event_free(bc->wev);
    if (bc->timer)
        event_free(bc->timer);
    if (bc->in)
        evbuffer_free(bc->in);
    if (bc->out)
        evbuffer_free(bc->out);
    if (bc->fd >= 0)
        close(bc->fd);
    free(bc);
}

/* Whether the service's route still names, at bc's place, the backend bc was opened for. */
static bool bc_current(const struct gw_bconn *bc)
{
    const struct osubd_route *rt = osubd_routes_get(bc->svc->g->routes, bc->svc->id);
    return rt != NULL && bc->backend < rt->n_backends &&
           strcmp(rt->backends[bc->backend], bc->url) == 0;
}

/* Closes s's idle connections (all, or those whose backend the route no longer names). */
static void svc_flush_idle(struct gw_svc *s, bool all)
{
    for (int b = 0; b < 16; b++)
        for (struct gw_bconn **p = &s->idle[b]; *p != NULL;) {
            struct gw_bconn *bc = *p;
            if (!all && bc_current(bc)) {
                p = &bc->next;
                continue;
            }
            *p = bc->next;
            s->n_idle[b]--;
            bc_close(bc);
        }
}

static void bc_unidle(struct gw_bconn *bc)
{
    struct gw_svc *s = bc->svc;
    for (struct gw_bconn **p = &s->idle[bc->backend]; *p; p = &(*p)->next)
        if (*p == bc) {
            *p = bc->next;
            s->n_idle[bc->backend]--;
            break;
        }
}

/* The backend failed this request: 502 (refused, reset), 504 (timeout), or a body cut short. */
static void dispatch(struct osubd_gateway *g, struct gw_req *r);

/* A request without a body that a safe method makes may be sent again. */
static bool retryable(const struct gw_req *r)
{
    return !r->had_body && !r->started && r->retries < 2 &&
           ((r->mlen == 3 && memcmp(r->method, "GET", 3) == 0) || r->is_head ||
            (r->mlen == 7 && memcmp(r->method, "OPTIONS", 7) == 0));
}

static void bc_fail(struct gw_bconn *bc, bool timeout)
{
    struct gw_req *r = bc->r;
    struct gw_svc *s = bc->svc;
    int b = bc->backend;
    if (r != NULL && !timeout && bc->reused && !bc->got_bytes && retryable(r)) {
        /* a kept-alive connection the backend had closed as we reused it: not the backend's
         * failure; the request goes again, on another connection */
        bc->r = NULL;
        bc_close(bc);
        r->bc = NULL;
        r->retries++;
        s->inflight--;
        s->admitted--;
        struct gw_client *c = r->cl;
        dispatch(s->g, r);
        if (c->cur != r)
            cl_after(c); /* answered (no backend at all): the client reads on */
        return;
    }
    s->backend_errors++;
    s->backoff[b] = s->backoff[b] > 0 ? (s->backoff[b] * 2 > 30 ? 30 : s->backoff[b] * 2) : 1;
    s->down_until[b] = now_s() + s->backoff[b];
    bc->r = NULL;
    bc_close(bc);
    if (r == NULL)
        return;
    r->bc = NULL;
    struct gw_client *c = r->cl;
    s->inflight--;
    if (r->started) {
        /* the answer stops short: the client sees it by the closed connection */
        access_log(r, r->status, "cut");
        c->closing = true;
        req_detach(r);
    } else if (timeout) {
        reply(r, 504, "Gateway Timeout", "backend_timeout", "timeout",
              "the service's backend did not answer in time", 0);
    } else {
        reply(r, 502, "Bad Gateway", "backend_unavailable", "connection",
              "the service's backend refused or dropped the connection", 0);
    }
    pump(s->g, s);
    cl_after(c);
}

static void bc_arm(struct gw_bconn *bc)
{
    long ms = bc->svc->v_upstream_ms > 0 ? bc->svc->v_upstream_ms : BACKEND_TIMEOUT_S * 1000L;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(bc->timer, &tv);
}

static void bc_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_bconn *bc = arg;
    if (bc->r == NULL) {
        bc_unidle(bc);
        bc_close(bc);
        return;
    }
    bc_fail(bc, !bc->broken);
}

/* The answer is complete: the connection goes back to the pool, the client reads on. */
static void bc_done(struct gw_bconn *bc)
{
    struct gw_req *r = bc->r;
    struct gw_svc *s = bc->svc;
    int b = bc->backend;
    bc->r = NULL;
    r->bc = NULL;
    s->backoff[b] = 0;
    /* back to the pool only when the whole request went out and nothing is left over: a
     * backend that answered before the body was sent would read the rest as a request */
    if (bc->keepalive && bc->st != 3 && evbuffer_get_length(bc->in) == 0 && r->body_done &&
        !bc->broken && evbuffer_get_length(bc->out) == 0 && s->n_idle[b] < IDLE_PER_BACKEND &&
        bc_current(bc)) {
        bc->st = 0;
        bc->next = s->idle[b];
        s->idle[b] = bc;
        s->n_idle[b]++;
        struct timeval tv = {IDLE_TIMEOUT_S, 0};
        event_add(bc->timer, &tv);
        event_add(bc->rev, NULL); /* a close while idle is noticed */
    } else {
        bc_close(bc);
    }
    struct gw_client *c = r->cl;
    if (!r->keepalive || !r->body_done)
        c->closing = true; /* the rest of its body would be read as a request: close */
    finish(r, true);
    cl_after(c);
}

/* Moves n bytes of the backend's answer to the client (pausing the backend when the client
 * reads slower than it sends). */
static void to_client(struct gw_bconn *bc, size_t n)
{
    /* staged: the head and the body of one read leave in one write (stage_flush) */
    evbuffer_remove_buffer(bc->in, bc->svc->g->scratch, n);
}

/* Sends what a backend read staged for its client. */
static void stage_flush(struct gw_bconn *bc)
{
    struct evbuffer *st = bc->svc->g->scratch;
    if (evbuffer_get_length(st) == 0 || bc->r == NULL)
        return;
    struct gw_client *c = bc->r->cl;
    if (!send_buffer(c->fd, c->out, c->wev, st))
        c->closing = c->gone = true;
    evbuffer_drain(st, evbuffer_get_length(st));
    if (evbuffer_get_length(c->out) > OUT_HIGH) {
        c->paused_bc = true;
        event_del(bc->rev);
    }
}

/* The answer's head: status and headers passed on, hop-by-hop ones dropped, the framing kept. */
static int bc_head(struct gw_bconn *bc)
{
    size_t len = evbuffer_get_length(bc->in);
    if (len == 0)
        return 0;
    size_t look = len < H1_HEAD_MAX ? len : H1_HEAD_MAX;
    const char *h = (const char *)evbuffer_pullup(bc->in, (ssize_t)look);
    struct gw_req *r = bc->r;
    struct h1_head *hd = &bc->svc->g->resp;
    int prc = h1_parse_response(h, look, r->is_head, hd);
    if (prc == H1_PARTIAL)
        return 0;
    if (prc == H1_BAD)
        return -1;
    size_t hl = hd->len;
    int code = hd->status;
    if (code == 101)
        return -1; /* an upgrade (WebSocket): the gateway does not tunnel; 502 */
    if (code < 200) {
        evbuffer_drain(bc->in, hl); /* 100 Continue and the like: not passed on */
        return 1;
    }
    struct gw_svc *s = bc->svc;
    s->answers[code / 100 < 6 ? code / 100 : 5]++;
    r->status = code;
    observe(&s->ttfb, now_s() - r->t_sent);
    const struct h1_header *conn = h1_find(hd, "Connection");
    bc->keepalive = hd->keepalive;
    struct gw_client *c = r->cl;
    bool nobody = hd->no_body;
    if (nobody)
        bc->st = 4;
    else if (hd->chunked)
        bc->st = 2, h1_chunked_init(&bc->cs, 0, hd->lf_only);
    else if (hd->content_length >= 0)
        bc->st = 1, bc->left = hd->content_length;
    else
        bc->st = 3, r->keepalive = false; /* until close: so is the client's */
    if (r->http10 && bc->st == 2)
        r->keepalive = false;
    /* the client's head */
    const char *reason = h + 12, *rend = memchr(h, '\n', hl);
    if (rend > h && rend[-1] == '\r')
        rend--;
    while (reason < rend && *reason == ' ')
        reason++;
    struct evbuffer *out = c->g->scratch;
    evbuffer_add(out, "HTTP/1.1 ", 9);
    evbuffer_add(out, h + 9, 3);
    evbuffer_add(out, " ", 1);
    evbuffer_add(out, reason, (size_t)(rend - reason));
    evbuffer_add(out, "\r\n", 2);
    for (int i = 0; i < hd->nh; i++) {
        const struct h1_header *f = &hd->h[i];
        bool te = f->nlen == 17 && strncasecmp(f->name, "Transfer-Encoding", 17) == 0;
        if (!h1_hop_by_hop(f->name, f->nlen, conn) || (te && bc->st == 2 && !r->http10)) {
            evbuffer_add(out, f->name, f->nlen);
            evbuffer_add(out, ": ", 2);
            evbuffer_add(out, f->value, f->vlen);
            evbuffer_add(out, "\r\n", 2);
        }
    }
    if (!r->keepalive)
        evbuffer_add(out, "Connection: close\r\n", 19);
    else if (r->http10)
        evbuffer_add(out, "Connection: keep-alive\r\n", 24);
    evbuffer_add(out, "\r\n", 2);
    evbuffer_drain(bc->in, hl);
    r->started = true;
    return 1; /* the head stays staged in out (the scratch buffer) with the body that follows */
}

static void add_data(void *arg, const char *p, size_t n)
{
    evbuffer_add(arg, p, n);
}

static void bc_on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct gw_bconn *bc = arg;
    int n = read_into(bc->in, fd);
    if (bc->r == NULL) {
        /* idle: the backend closed it (or said something it should not have) */
        bc_unidle(bc);
        bc_close(bc);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    bool eof = n <= 0;
    if (n > 0) {
        bc->got_bytes = true;
        bc_arm(bc);
    }
    for (;;) {
        if (bc->st == 0) {
            int h = bc_head(bc);
            if (h < 0) {
                evbuffer_drain(bc->svc->g->scratch, evbuffer_get_length(bc->svc->g->scratch));
                bc_fail(bc, false);
                return;
            }
            if (h == 0)
                break;
            continue;
        }
        size_t len = evbuffer_get_length(bc->in);
        if (bc->st == 1) {
            size_t k = len < (size_t)bc->left ? len : (size_t)bc->left;
            if (k > 0)
                to_client(bc, k);
            bc->left -= (int64_t)k;
            if (bc->left == 0)
                bc->st = 4;
        } else if (bc->st == 2 && len > 0) {
            const char *p = (const char *)evbuffer_pullup(bc->in, -1);
            bool dechunk = bc->r->http10; /* HTTP/1.0 has no chunks: the data, until close */
            size_t k =
                h1_chunked_feed(&bc->cs, p, len, dechunk ? add_data : NULL, bc->svc->g->scratch);
            if (bc->cs.st == H1C_BAD) {
                stage_flush(bc);
                bc_fail(bc, false);
                return;
            }
            if (dechunk)
                evbuffer_drain(bc->in, k);
            else
                to_client(bc, k);
            if (bc->cs.st == H1C_DONE)
                bc->st = 4;
        } else if (bc->st == 3 && len > 0) {
            to_client(bc, len);
        }
        break;
    }
    stage_flush(bc);
    if (bc->r != NULL && bc->r->cl != NULL && bc->r->cl->gone) {
        client_gone(bc->r->cl, "a write failed"); /* closes bc too */
        return;
    }
    if (bc->st == 4) {
        bc_done(bc);
        return;
    }
    if (eof) {
        if (bc->st == 3) {
            bc->st = 4;
            bc_done(bc);
        } else {
            bc_fail(bc, false);
        }
        return;
    }
}

static void bc_on_write(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct gw_bconn *bc = arg;
    if (!bc->connected) {
        int err = 0;
        socklen_t l = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err != 0) {
            bc_fail(bc, false);
            return;
        }
        bc->connected = true;
        event_add(bc->rev, NULL);
    }
    while (evbuffer_get_length(bc->out) > 0) {
        int w = evbuffer_write(bc->out, fd);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return;
            bc_fail(bc, false);
            return;
        }
        if (w == 0)
            return;
    }
    event_del(bc->wev);
    /* the client's body may go on */
    if (bc->r != NULL && !bc->r->body_done && bc->r->cl != NULL) {
        cl_read_resume(bc->r->cl);
        forward_body(bc->r);
    }
}

static void bc_send(struct gw_bconn *bc, struct evbuffer *b)
{
    if (bc->broken)
        return;
    if (!bc->connected) {
        evbuffer_add_buffer(bc->out, b);
        return;
    }
    if (!send_buffer(bc->fd, bc->out, bc->wev, b)) {
        bc->broken = true;
        struct timeval now = {0, 0};
        event_add(bc->timer, &now);
    }
}

/* The backend's address, resolved once per URL. */
static int backend_addr(struct gw_svc *s, int b, const char *url)
{
    if (strcmp(s->baddr_url[b], url) == 0)
        return 0;
    char host[256], port[16];
    const char *h = url + (strncmp(url, "http://", 7) == 0 ? 7 : 0);
    size_t hl = strcspn(h, "/");
    const char *colon = memchr(h, ':', hl);
    if (h[0] == '[') {
        const char *rb = memchr(h, ']', hl);
        if (rb == NULL)
            return -1;
        snprintf(host, sizeof(host), "%.*s", (int)(rb - h - 1), h + 1);
        colon = rb[1] == ':' ? rb + 1 : NULL;
    } else {
        snprintf(host, sizeof(host), "%.*s", (int)(colon ? colon - h : (ptrdiff_t)hl), h);
    }
    snprintf(port, sizeof(port), "%.*s", colon ? (int)(h + hl - colon - 1) : 2,
             colon ? colon + 1 : "80");
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return -1;
    memcpy(&s->baddr[b], ai->ai_addr, ai->ai_addrlen);
    s->baddr_len[b] = ai->ai_addrlen;
    freeaddrinfo(ai);
    snprintf(s->baddr_url[b], sizeof(s->baddr_url[b]), "%s", url);
    snprintf(s->bhost[b], sizeof(s->bhost[b]), "%.*s", (int)hl, h);
    return 0;
}

static struct gw_bconn *bc_get(struct gw_svc *s, int b, const char *url, const char **self)
{
    *self = NULL;
    while (s->idle[b] != NULL) {
        struct gw_bconn *bc = s->idle[b];
        s->idle[b] = bc->next;
        s->n_idle[b]--;
        if (strcmp(bc->url, url) != 0) {
            bc_close(bc); /* opened for a backend the route no longer names here */
            continue;
        }
        event_del(bc->timer);
        bc->reused = true;
        return bc;
    }
    if (backend_addr(s, b, url) != 0)
        return NULL;
    const char *own = osubd_self_match(s->g->self, (struct sockaddr *)&s->baddr[b]);
    if (own != NULL) {
        /* a name that resolves to oversubd's own API or gateway: never forwarded to */
        *self = own;
        return NULL;
    }
    int fd = socket(s->baddr[b].ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    set_nodelay(fd);
    struct gw_bconn *bc = calloc(1, sizeof(*bc));
    if (bc == NULL) {
        close(fd);
        return NULL;
    }
    bc->fd = fd;
    bc->svc = s;
    bc->backend = b;
    snprintf(bc->url, sizeof(bc->url), "%s", url);
    struct event_base *base = s->g->base;
    bc->in = evbuffer_new();
    bc->out = evbuffer_new();
    bc->rev = event_new(base, fd, EV_READ | EV_PERSIST, bc_on_read, bc);
    bc->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, bc_on_write, bc);
    bc->timer = evtimer_new(base, bc_on_timer, bc);
    if (bc->in == NULL || bc->out == NULL || bc->rev == NULL || bc->wev == NULL ||
        bc->timer == NULL) {
        bc_close(bc);
        return NULL;
    }
    int rc = connect(fd, (struct sockaddr *)&s->baddr[b], s->baddr_len[b]);
    if (rc == 0) {
        bc->connected = true;
        event_add(bc->rev, NULL);
    } else if (errno == EINPROGRESS) {
        event_add(bc->wev, NULL);
    } else {
        bc->fd = fd;
        bc_close(bc);
        return NULL;
    }
    return bc;
}

/* The request's body, from the client to the backend as it arrives. */
static void forward_body(struct gw_req *r)
{
    struct gw_client *c = r->cl;
    struct gw_bconn *bc = r->bc;
    if (bc == NULL || r->body_done)
        return;
    if (evbuffer_get_length(bc->out) > 1024 * 1024) {
        cl_read_pause(c); /* the backend reads slower: wait for its write event */
        return;
    }
    size_t len = evbuffer_get_length(c->in);
    size_t k;
    if (r->chunked_body) {
        if (len == 0)
            return;
        const char *p = (const char *)evbuffer_pullup(c->in, -1);
        k = h1_chunked_feed(&r->cs, p, len, NULL, NULL);
        if (r->cs.st == H1C_BAD) {
            /* the framing is broken (or the body over the limit): nothing after it can be
             * trusted, and nothing of it goes on */
            if (r->cs.too_large)
                c->g->too_large++;
            /* closed from the loop (the timer at once): the callers still hold c; a bad
             * request, not a client that left */
            c->g->bad_requests++;
            c->closing = c->gone = c->bad_framing = true;
            struct timeval now = {0, 0};
            event_add(c->timer, &now);
            return;
        }
        if (r->cs.st == H1C_DONE)
            r->body_done = true;
    } else {
        k = len < (size_t)r->body_left ? len : (size_t)r->body_left;
        r->body_left -= (int64_t)k;
        if (r->body_left == 0)
            r->body_done = true;
    }
    if (k > 0) {
        struct evbuffer *tmp = c->g->scratch;
        evbuffer_remove_buffer(c->in, tmp, k);
        bc_send(bc, tmp);
        evbuffer_drain(tmp, evbuffer_get_length(tmp));
    }
    double t = now_s();
    if (r->stream_t0 == 0)
        r->stream_t0 = t; /* what was read ahead does not count toward the floor */
    else
        r->streamed += (int64_t)k;
    if (!r->body_done && t - r->stream_t0 > STREAM_GRACE_S &&
        (double)r->streamed < STREAM_FLOOR_BPS * (t - r->stream_t0)) {
        /* holding a slot while trickling: cut (from the loop: the callers still hold c) */
        c->g->bad_requests++;
        c->closing = c->gone = c->bad_framing = true;
        struct timeval now = {0, 0};
        event_add(c->timer, &now);
        return;
    }
    if (r->body_done && r->streams) {
        r->streams = false;
        r->svc->streaming--;
    }
    if (!r->body_done) {
        struct timeval tv = {BODY_TIMEOUT_S, 0};
        event_add(c->timer, &tv);
    }
}

static void dispatch(struct osubd_gateway *g, struct gw_req *r)
{
    struct gw_svc *s = r->svc;
    const struct osubd_route *route = route_of(g, s->id);
    size_t nb = route != NULL ? (size_t)route->n_backends : 0;
    int b = nb ? (int)(s->rr++ % nb) : 0;
    double t = now_s();
    for (size_t k = 0; k < nb && s->down_until[b] > t; k++)
        b = (int)(s->rr++ % nb); /* skip backends out of rotation (all out: probe one) */
    const char *self = NULL;
    struct gw_bconn *bc = nb ? bc_get(s, b, route->backends[b], &self) : NULL;
    if (bc == NULL && self != NULL) {
        s->backend_errors++;
        /* literals: answers are cached by their texts' addresses */
        reply(r, 502, "Bad Gateway", "backend_forbidden", "self",
              strcmp(self, "gateway") == 0
                  ? "the service's backend is oversubd's own gateway: never forwarded to"
                  : "the service's backend is oversubd's own control API: never forwarded to",
              0);
        return;
    }
    if (bc == NULL) {
        s->backend_errors++;
        if (nb) {
            s->backoff[b] =
                s->backoff[b] > 0 ? (s->backoff[b] * 2 > 30 ? 30 : s->backoff[b] * 2) : 1;
            s->down_until[b] = t + s->backoff[b];
        }
        reply(r, 502, "Bad Gateway", "backend_unavailable", "no_backend",
              "the service has no backend that takes connections", 0);
        return;
    }
    bc->r = r;
    bc->st = 0;
    bc->got_bytes = false;
    r->bc = bc;
    if (!r->body_done && !r->streams) {
        r->streams = true;
        s->streaming++;
    }
    r->t_sent = t;
    observe(&s->queue_wait, t - r->t0);
    s->inflight++;
    s->admitted++;
    struct gw_client *c = r->cl;
    /* the head: the path without the service's prefix (by Host: whole), headers but the
     * hop-by-hop ones, Host for the backend, X-Forwarded-For with the client */
    struct evbuffer *out = g->scratch;
    const char *rest = r->by_host ? r->uri : memchr(r->uri + 1, '/', r->ulen - 1);
    const char *q = memchr(r->uri, '?', r->ulen);
    evbuffer_add(out, r->method, r->mlen);
    evbuffer_add(out, " ", 1);
    const char *uend = r->uri + r->ulen;
    if (rest == NULL || (q != NULL && q < rest)) {
        evbuffer_add(out, "/", 1);
        if (q != NULL)
            evbuffer_add(out, q, (size_t)(uend - q));
    } else {
        evbuffer_add(out, rest, (size_t)(uend - rest));
    }
    evbuffer_add(out, " HTTP/1.1\r\nHost: ", 17);
    evbuffer_add(out, s->bhost[b], strlen(s->bhost[b]));
    evbuffer_add(out, "\r\n", 2);
    const struct h1_header *conn = h1_find(&r->hd, "Connection");
    const struct h1_header *xff = NULL;
    bool expect100 = false;
    for (int i = 0; i < r->hd.nh; i++) {
        const struct h1_header *h = &r->hd.h[i];
        if (h1_hop_by_hop(h->name, h->nlen, conn) ||
            (h->nlen == 4 && strncasecmp(h->name, "Host", 4) == 0))
            continue;
        if (h->nlen == 15 && strncasecmp(h->name, "X-Forwarded-For", 15) == 0) {
            xff = h;
            continue;
        }
        if (h->nlen == 6 && strncasecmp(h->name, "Expect", 6) == 0) {
            expect100 = true; /* answered here, once the request goes to a backend */
            continue;
        }
        evbuffer_add(out, h->name, h->nlen);
        evbuffer_add(out, ": ", 2);
        evbuffer_add(out, h->value, h->vlen);
        evbuffer_add(out, "\r\n", 2);
    }
    if (r->chunked_body)
        evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
    if (xff != NULL) {
        evbuffer_add(out, "X-Forwarded-For: ", 17);
        evbuffer_add(out, xff->value, xff->vlen);
        evbuffer_add(out, ", ", 2);
    } else {
        evbuffer_add(out, "X-Forwarded-For: ", 17);
    }
    evbuffer_add(out, c->peer, strlen(c->peer));
    evbuffer_add(out, "\r\n\r\n", 4);
    bc_send(bc, out);
    evbuffer_drain(out, evbuffer_get_length(out));
    if (r->bc != bc)
        return; /* the send failed: answered already, or sent again on another connection */
    bc_arm(bc);
    if (expect100 && !r->body_done && !r->continued)
        cl_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    if (!r->body_done) {
        cl_read_resume(c);
        forward_body(r);
    }
}

static void finish(struct gw_req *r, bool ok)
{
    struct gw_svc *s = r->svc;
    double t = now_s();
    access_log(r, r->status, ok ? "served" : "backend_error");
    if (ok) {
        observe(&s->upstream, t - r->t_sent);
        if (s->last_done > 0) {
            double dt = t - s->last_done;
            double inst = dt > 1e-6 ? 1.0 / dt : 1e6;
            s->rate = s->rate > 0 ? 0.9 * s->rate + 0.1 * inst : inst;
        }
        s->last_done = t;
        s->completed++;
    }
    s->inflight--;
    req_detach(r);
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
    struct gw_client *c = r->cl;
    unqueue(s, r);
    osub_service_info_t si;
    if (osub_engine_service_info(s->g->e, s->id, &si) != 0 || !serving(&si)) {
        s->rej_unavailable++;
        reply(r, 503, "Service Unavailable", "unavailable", "not_running",
              "the service is not running yet (loading, pending or queued) and the request's "
              "deadline passed",
              retry_after(s));
    } else {
        s->rej_deadline++;
        reply(r, 429, "Too Many Requests", "overloaded", "deadline",
              "the request waited in the service's queue until its deadline", retry_after(s));
    }
    cl_after(c);
}

/* ---- the serving engine's saturation (metrics_url) ---------------------------------------- */

#define ENG_STALE_S 5.0 /* a read older than this no longer limits anything */

/* The in-flight limit: the route's (or the degrade's), and the engine's own while it queues. */
static int32_t eff_lim(const struct gw_svc *s)
{
    if (s->eng_lim > 0 && s->eng_lim < s->v_lim && now_s() - s->eng_at < ENG_STALE_S)
        return s->eng_lim;
    return s->v_lim;
}

static void eng_drop(struct gw_svc *s)
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
}

/* Reads the engine's metrics of every service that names them (once a second). */
static void eng_poll(struct osubd_gateway *g)
{
    for (struct gw_svc *s = g->svcs; s != NULL; s = s->next) {
        const struct osubd_route *rt = route_of(g, s->id);
        if (rt == NULL || rt->metrics_url[0] == '\0') {
            if (s->eng_conn != NULL && !s->eng_busy)
                eng_drop(s);
            s->eng_lim = 0;
            continue;
        }
        if (s->eng_busy)
            continue;
        if (s->eng_conn != NULL && strcmp(s->eng_url, rt->metrics_url) != 0)
            eng_drop(s);
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

static int svc_view(struct osubd_gateway *g, struct gw_svc *s);

/* Whether r may take a slot now: a request whose body is still arriving (past the read-ahead)
 * only while fewer than half the service's slots are held by such requests, so that slow
 * uploaders never hold every slot. */
static bool stream_ok(const struct gw_svc *s, const struct gw_req *r)
{
    if (r->body_done || !r->had_body)
        return true;
    /* all of it in the client's buffer already: it will not stream */
    if (r->cl != NULL && !r->chunked_body &&
        (int64_t)evbuffer_get_length(r->cl->in) >= r->body_left)
        return true;
    if (r->chunked_body && r->scan.st == H1C_DONE)
        return true;
    int32_t share = eff_lim(s) / 2 > 0 ? eff_lim(s) / 2 : 1;
    return s->streaming < share;
}

static void pump(struct osubd_gateway *g, struct gw_svc *s)
{
    if (s->queue == NULL || g->stopping)
        return;
    if (svc_view(g, s) != 0 || !s->v_serving)
        return;
    int32_t lim = eff_lim(s);
    while (s->queue != NULL && s->inflight < lim) {
        /* the first in order that may go: a body still arriving only within its share */
        struct gw_req *r = s->queue;
        while (r != NULL && !stream_ok(s, r))
            r = r->next;
        if (r == NULL)
            break;
        unqueue(s, r);
        struct gw_client *c = r->cl;
        dispatch(g, r);
        if (c->cur == NULL)
            cl_after(c); /* answered at once (no backend): the client reads on */
    }
}

static void on_pump(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_gateway *g = arg;
    static unsigned ticks;
    if (++ticks % 20 == 0) /* the pump runs every 50 ms: the engines' metrics once a second */
        eng_poll(g);
    for (struct gw_svc **sp = &g->svcs; *sp != NULL;) {
        struct gw_svc *s = *sp;
        pump(g, s);
        if (s->swept_version != osubd_core_version(g->core)) {
            /* the state changed: a route that changed or went takes its pooled connections
             * with it (the next owner of the id must never reach the old backend), and a
             * service gone takes its gateway state once no request points at it */
            s->swept_version = osubd_core_version(g->core);
            bool gone = route_of(g, s->id) == NULL;
            svc_flush_idle(s, gone);
            if (gone && s->refs == 0 && s->queue == NULL && s->inflight == 0 && !s->eng_busy) {
                *sp = s->next;
                eng_drop(s);
                free(s);
                continue;
            }
        }
        sp = &s->next;
    }
}

static struct gw_svc *svc_find(struct osubd_gateway *g, const char *id, size_t n);

static struct gw_svc *svc_of(struct osubd_gateway *g, const char *id)
{
    struct gw_svc *s = svc_find(g, id, strlen(id));
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

/* ---- the entry ----------------------------------------------------------------------------- */

/* What a request needs of the engine and the routes about its service, kept until the next
 * command changes the state. 0, or -1 when the service has no route or no longer exists. */
static int svc_view(struct osubd_gateway *g, struct gw_svc *s)
{
    struct osubd_gateway *d = g;
    if (s->view_version == osubd_core_version(d->core) && s->view_version != 0)
        return s->view_ok ? 0 : -1;
    osub_service_info_t si;
    const struct osubd_route *route = route_of(d, s->id);
    s->view_version = osubd_core_version(d->core);
    s->view_ok = route != NULL && osub_engine_service_info(d->e, s->id, &si) == 0;
    if (!s->view_ok)
        return -1;
    s->v_serving = serving(&si);
    s->v_level = si.level;
    s->v_lim = limit_of(d, s->id, &si);
    s->v_maxq = max_queue_of(d, s->id, s->v_lim);
    s->v_qt = route->queue_timeout_ms > 0 ? route->queue_timeout_ms : 5000;
    s->v_upstream_ms =
        route->upstream_timeout_ms > 0 ? route->upstream_timeout_ms : BACKEND_TIMEOUT_S * 1000L;
    s->v_shed = shed_from(d, &si);
    return 0;
}

static struct gw_svc *svc_find(struct osubd_gateway *g, const char *id, size_t n)
{
    for (struct gw_svc *s = g->svcs; s != NULL; s = s->next)
        if (strncmp(s->id, id, n) == 0 && s->id[n] == '\0')
            return s;
    return NULL;
}

/* The service a path or Host names: known (with a view) or made when it has a route. */
static struct gw_svc *svc_route(struct osubd_gateway *g, const char *id, size_t n)
{
    if (n == 0 || n > OSUB_ID_MAX)
        return NULL;
    struct gw_svc *s = svc_find(g, id, n);
    if (s != NULL)
        return svc_view(g, s) == 0 ? s : NULL;
    char key[OSUB_ID_MAX + 1];
    memcpy(key, id, n);
    key[n] = '\0';
    if (route_of(g, key) == NULL)
        return NULL;
    s = svc_of(g, key);
    return s != NULL && svc_view(g, s) == 0 ? s : NULL;
}

/* Whether r's body (up to GW_PREREAD of it) is in the client's buffer. */
static bool body_arrived(struct gw_client *c, struct gw_req *r)
{
    if (!r->had_body || r->body_done)
        return true;
    size_t len = evbuffer_get_length(c->in);
    if (!r->chunked_body)
        return (int64_t)len >= r->body_left || len >= GW_PREREAD;
    if (r->scanned == 0 && r->scan.st == 0)
        r->scan = r->cs; /* the framing as the head left it */
    size_t upto = len < GW_PREREAD ? len : GW_PREREAD;
    if (upto > r->scanned) {
        const char *p = (const char *)evbuffer_pullup(c->in, (ssize_t)upto);
        h1_chunked_feed(&r->scan, p + r->scanned, upto - r->scanned, NULL, NULL);
        r->scanned = upto;
    }
    /* done, or broken (forward_body says so), or as much as is read ahead */
    return r->scan.st == H1C_DONE || r->scan.st == H1C_BAD || len >= GW_PREREAD;
}

static void handle(struct gw_client *c, struct gw_req *r)
{
    struct osubd_gateway *g = c->g;
    struct osubd_gateway *d = g;
    /* the gateway's own health: /-/healthz (no service id starts with '-'), and /healthz
     * while no service is named so; 503 while it drains, so load balancers move on */
    if ((r->ulen == 10 && memcmp(r->uri, "/-/healthz", 10) == 0) ||
        (r->ulen == 8 && memcmp(r->uri, "/healthz", 8) == 0 && route_of(d, "healthz") == NULL)) {
        if (g->draining) {
            reply(r, 503, "Service Unavailable", "draining", "draining",
                  "the gateway is stopping: it finishes what it has and takes nothing new", 0);
            return;
        }
        bool head = r->is_head, close_it = !r->keepalive || !r->body_done;
        char ok[200];
        int n =
            snprintf(ok, sizeof(ok),
                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n"
                     "%s\r\n%s",
                     close_it    ? "Connection: close\r\n"
                     : r->http10 ? "Connection: keep-alive\r\n"
                                 : "",
                     head ? "" : "{\"status\":\"ok\"}\n");
        if (close_it)
            c->closing = true;
        access_log(r, 200, "healthz");
        req_detach(r);
        cl_send(c, ok, (size_t)n);
        return;
    }
    size_t n = 0;
    const char *p = r->uri + 1;
    while (n < r->ulen - 1 && p[n] != '/' && p[n] != '?' && n <= OSUB_ID_MAX)
        n++;
    bool by_host = false;
    struct gw_svc *s = svc_route(g, p, n);
    if (s == NULL) {
        /* by Host: its first label names the service (chat.example.com, chat:8080), and
         * the whole path goes to the backend */
        const struct h1_header *host = h1_find(&r->hd, "Host");
        size_t k = 0;
        while (host != NULL && k < host->vlen && host->value[k] != '.' && host->value[k] != ':' &&
               k <= OSUB_ID_MAX)
            k++;
        if (host != NULL && (s = svc_route(g, host->value, k)) != NULL)
            by_host = true;
    }
    if (s == NULL) {
        g->no_route++;
        reply(r, 404, "Not Found", "unknown_service", "no_route",
              "no service with backends at this path or Host: /{service}/... (or Host: "
              "{service}...) reaches a service submitted with \\\"backends\\\"",
              0);
        return;
    }
    /* priority: the service's class, or a lower one the client asks for */
    int32_t prio = s->v_level;
    const struct h1_header *xp = h1_find(&r->hd, "X-Priority");
    if (xp != NULL) {
        size_t nc;
        const osub_class_t *cls = osub_engine_classes(d->e, &nc);
        int32_t lvl = -1;
        for (size_t k = 0; k < nc; k++)
            if (strlen(cls[k].name) == xp->vlen && strncmp(cls[k].name, xp->value, xp->vlen) == 0)
                lvl = cls[k].level;
        if (lvl < 0) {
            reply(r, 400, "Bad Request", "invalid_priority", "priority",
                  "X-Priority must name a class (online, batch, experiment...)", 0);
            return;
        }
        prio = lvl > s->v_level ? lvl : s->v_level; /* never above the service's own */
    }
    long deadline = s->v_qt;
    const struct h1_header *xd = h1_find(&r->hd, "X-Request-Deadline-Ms");
    if (xd != NULL) {
        long v = 0;
        bool okv = xd->vlen > 0 && xd->vlen < 10;
        for (size_t k = 0; k < xd->vlen && okv; k++) {
            okv = xd->value[k] >= '0' && xd->value[k] <= '9';
            v = v * 10 + (xd->value[k] - '0');
        }
        if (!okv) {
            reply(r, 400, "Bad Request", "invalid_deadline", "deadline",
                  "X-Request-Deadline-Ms must be a number of milliseconds", 0);
            return;
        }
        if (v < deadline)
            deadline = v;
    }
    r->svc = s;
    s->refs++;
    if (prio > 0 && prio >= s->v_shed) {
        s->rej_shed++;
        reply(r, 429, "Too Many Requests", "overloaded", "shed",
              "the service's GPUs are above their high watermark: lower-priority requests are "
              "turned away first",
              retry_after(s));
        return;
    }
    r->by_host = by_host;
    r->prio = prio;
    r->deadline_ms = deadline;
    if (!body_arrived(c, r)) {
        /* no slot and no queue place until the body is here: cl_process_inner admits it */
        r->awaiting_body = true;
        if (h1_find(&r->hd, "Expect") != NULL && evbuffer_get_length(c->in) == 0) {
            cl_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25); /* the body, please */
            r->continued = true;
        }
        cl_arm(c, PREREAD_TIMEOUT_S);
        return;
    }
    admit(g, r);
}

/* A request whose body has arrived: a slot at once, a place in the queue, or a refusal. */
static void admit(struct osubd_gateway *g, struct gw_req *r)
{
    struct osubd_gateway *d = g;
    struct gw_svc *s = r->svc;
    int32_t prio = r->prio;
    long deadline = r->deadline_ms;
    r->t0 = now_s();
    if (s->v_serving && s->inflight < eff_lim(s) && s->queue == NULL && stream_ok(s, r)) {
        dispatch(g, r);
        return;
    }
    if (s->n_queued >= s->v_maxq || deadline == 0) {
        if (!s->v_serving) {
            s->rej_unavailable++;
            reply(r, 503, "Service Unavailable", "unavailable", "not_running",
                  "the service is not running yet and its queue is full", retry_after(s));
        } else {
            s->rej_full++;
            reply(r, 429, "Too Many Requests", "overloaded", "queue_full",
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

struct osubd_gateway *osubd_gateway_new(struct osubd_core *c, const struct osubd_routes *routes,
                                        struct osubd_self *self, char *err, size_t errlen)
{
    struct osubd_gateway *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    g->core = c;
    g->cfg = osubd_core_config(c);
    g->base = osubd_core_base(c);
    g->e = osubd_core_engine(c);
    g->routes = routes;
    g->self = self;
    if (gateway_listen(g, err, errlen) != 0) {
        osubd_gateway_free(g);
        return NULL;
    }
    return g;
}

static int gateway_listen(struct osubd_gateway *g, char *err, size_t errlen)
{
    struct osubd_gateway *d = g;
    g->scratch = evbuffer_new();
    if (d->cfg->gateway_access_log[0] != '\0') {
        g->access = fopen(d->cfg->gateway_access_log, "ae");
        if (g->access == NULL) {
            snprintf(err, errlen, "gateway_access_log %s: %s", d->cfg->gateway_access_log,
                     strerror(errno));
            free(g);
            return -1;
        }
        setvbuf(g->access, NULL, _IOLBF, 0); /* a line per request, as it happens */
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", d->cfg->gateway_port);
    if (getaddrinfo(d->cfg->gateway_host, port, &hints, &ai) != 0 || ai == NULL) {
        snprintf(err, errlen, "--gateway %s:%d: not an address", d->cfg->gateway_host,
                 d->cfg->gateway_port);
        free(g);
        return -1;
    }
    g->lis = evconnlistener_new_bind(
        d->base, on_accept, g, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
        1024, ai->ai_addr, (int)ai->ai_addrlen);
    freeaddrinfo(ai);
    if (g->lis == NULL) {
        snprintf(err, errlen, "--gateway %s:%d: cannot listen there (%s)", d->cfg->gateway_host,
                 d->cfg->gateway_port, strerror(errno));
        free(g);
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int bport = d->cfg->gateway_port;
    if (getsockname(evconnlistener_get_fd(g->lis), (struct sockaddr *)&ss, &sl) == 0)
        bport = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    osubd_listener_guard(g->lis, "gateway", &g->refused_conns);
    osubd_self_add_fd(d->self, (int)evconnlistener_get_fd(g->lis), "gateway");
    g->pump = event_new(d->base, -1, EV_PERSIST, on_pump, g);
    struct timeval tv = {0, 50000};
    event_add(g->pump, &tv);
    printf("gateway on http://%s:%d\n", d->cfg->gateway_host, bport);
    fflush(stdout);
    return 0;
}

void osubd_gateway_free(struct osubd_gateway *g)
{
    if (g == NULL)
        return;
    if (g->pump)
        event_free(g->pump);
    if (g->lis != NULL) {
        osubd_listener_unguard(g->lis);
        evconnlistener_free(g->lis);
    }
    g->stopping = true;
    while (g->clients != NULL)
        cl_close(g->clients);
    while (g->svcs != NULL) {
        struct gw_svc *s = g->svcs;
        g->svcs = s->next;
        while (s->queue != NULL) {
            struct gw_req *r = s->queue;
            unqueue(s, r);
            if (r->cl != NULL)
                r->cl->cur = NULL;
            req_free(r);
        }
        for (int b = 0; b < 16; b++)
            while (s->idle[b] != NULL) {
                struct gw_bconn *bc = s->idle[b];
                s->idle[b] = bc->next;
                bc_close(bc);
            }
        eng_drop(s);
        free(s);
    }
    for (int i = 0; i < 1024; i++)
        while (g->peers[i] != NULL) {
            struct peer_count *pc = g->peers[i];
            g->peers[i] = pc->next;
            free(pc);
        }
    while (g->free_reqs != NULL) {
        struct gw_req *r = g->free_reqs;
        g->free_reqs = r->next;
        free(r->head);
        free(r);
    }
    if (g->scratch)
        evbuffer_free(g->scratch);
    if (g->access)
        fclose(g->access);
    free(g);
}

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

int osubd_gateway_open_clients(const struct osubd_gateway *g)
{
    return g != NULL ? g->n_clients : 0;
}

int osubd_gateway_drain(struct osubd_gateway *g)
{
    if (g == NULL)
        return 0;
    g->draining = true;
    if (g->lis != NULL) { /* closed, not paused: a new connection is refused, not left hanging */
        osubd_listener_unguard(g->lis);
        evconnlistener_free(g->lis);
        g->lis = NULL;
    }
    for (struct gw_client *c = g->clients, *next; c != NULL; c = next) {
        next = c->next;
        if (c->cur == NULL && evbuffer_get_length(c->out) == 0) {
            cl_close(c); /* idle: nothing to finish */
            continue;
        }
        /* its answer goes out (its body still comes in), with Connection: close when its head
         * has not gone yet; no request after it */
        c->last_request = true;
        if (c->cur != NULL && !c->cur->started)
            c->cur->keepalive = false;
    }
    if (g->access != NULL)
        fflush(g->access);
    return g->n_clients;
}

void osubd_gateway_metrics(struct osubd_gateway *g, struct evbuffer *b)
{
    if (g == NULL)
        return;
    evbuffer_add_printf(
        b,
        "# HELP oversub_gateway_refused_total Requests and connections refused before reaching a "
        "service, by why.\n"
        "# TYPE oversub_gateway_refused_total counter\n"
        "oversub_gateway_refused_total{why=\"no_route\"} %llu\n"
        "oversub_gateway_refused_total{why=\"bad_request\"} %llu\n"
        "oversub_gateway_refused_total{why=\"client_share\"} %llu\n"
        "oversub_gateway_refused_total{why=\"too_large\"} %llu\n",
        (unsigned long long)g->no_route, (unsigned long long)g->bad_requests,
        (unsigned long long)g->refused_conns, (unsigned long long)g->too_large);
    evbuffer_add_printf(b, "# HELP oversub_gateway_engine_limit The in-flight limit the serving "
                           "engine's own saturation sets (its metrics_url), 0 when none.\n"
                           "# TYPE oversub_gateway_engine_limit gauge\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        if (s->eng_reads + s->eng_errors > 0)
            evbuffer_add_printf(b, "oversub_gateway_engine_limit{service=\"%s\"} %d\n", s->id,
                                eff_lim(s) < s->v_lim ? eff_lim(s) : 0);
    evbuffer_add_printf(b, "# HELP oversub_gateway_engine_waiting Requests the serving engine "
                           "says wait in its own queue.\n"
                           "# TYPE oversub_gateway_engine_waiting gauge\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        if (s->eng_reads > 0)
            evbuffer_add_printf(b, "oversub_gateway_engine_waiting{service=\"%s\"} %g\n", s->id,
                                s->eng_waiting);
    evbuffer_add_printf(b, "# HELP oversub_gateway_engine_kv_usage The serving engine's KV cache "
                           "in use (0 to 1).\n# TYPE oversub_gateway_engine_kv_usage gauge\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        if (s->eng_reads > 0)
            evbuffer_add_printf(b, "oversub_gateway_engine_kv_usage{service=\"%s\"} %g\n", s->id,
                                s->eng_kv);
    evbuffer_add_printf(b,
                        "# HELP oversub_gateway_engine_reads_total Reads of the serving "
                        "engine's metrics.\n# TYPE oversub_gateway_engine_reads_total counter\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        if (s->eng_reads + s->eng_errors > 0)
            evbuffer_add_printf(b,
                                "oversub_gateway_engine_reads_total{service=\"%s\",result=\"ok\"} "
                                "%llu\noversub_gateway_engine_reads_total{service=\"%s\",result="
                                "\"error\"} %llu\n",
                                s->id, (unsigned long long)s->eng_reads, s->id,
                                (unsigned long long)s->eng_errors);
    evbuffer_add_printf(b, "# HELP oversub_gateway_inflight Requests in flight to a service.\n"
                           "# TYPE oversub_gateway_inflight gauge\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        evbuffer_add_printf(b, "oversub_gateway_inflight{service=\"%s\"} %d\n", s->id, s->inflight);
    evbuffer_add_printf(b, "# HELP oversub_gateway_queued Requests waiting in a service's queue.\n"
                           "# TYPE oversub_gateway_queued gauge\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        evbuffer_add_printf(b, "oversub_gateway_queued{service=\"%s\"} %d\n", s->id, s->n_queued);
    static const char *const hn[] = {"queue_wait", "upstream", "first_byte"};
    static const char *const hh[] = {
        "Time a request waited in the service's queue.",
        "Time from sending to a backend to its last byte (for a stream, its length).",
        "Time from sending to a backend to the head of its answer (time to first byte)."};
    for (int k = 0; k < 3; k++) {
        evbuffer_add_printf(
            b,
            "# HELP oversub_gateway_%s_seconds %s\n# TYPE oversub_gateway_%s_seconds histogram\n",
            hn[k], hh[k], hn[k]);
        for (struct gw_svc *s = g->svcs; s; s = s->next) {
            const struct hist *h = k == 0 ? &s->queue_wait : k == 1 ? &s->upstream : &s->ttfb;
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
        static const char *const what[] = {"admitted", "queue_full",    "deadline",   "not_running",
                                           "shed",     "backend_error", "client_gone"};
        uint64_t v[] = {s->admitted, s->rej_full,       s->rej_deadline, s->rej_unavailable,
                        s->rej_shed, s->backend_errors, s->client_gone};
        for (int i = 0; i < 7; i++)
            evbuffer_add_printf(b,
                                "oversub_gateway_requests_total{service=\"%s\",outcome=\"%s\"} "
                                "%llu\n",
                                s->id, what[i], (unsigned long long)v[i]);
    }
    evbuffer_add_printf(b, "# HELP oversub_gateway_backend_answers_total The backends' answers "
                           "by status class.\n"
                           "# TYPE oversub_gateway_backend_answers_total counter\n");
    for (struct gw_svc *s = g->svcs; s; s = s->next)
        for (int i = 1; i < 6; i++)
            evbuffer_add_printf(
                b,
                "oversub_gateway_backend_answers_total{service=\"%s\",class=\"%dxx\"} "
                "%llu\n",
                s->id, i, (unsigned long long)s->answers[i]);
    evbuffer_add_printf(b, "# HELP oversub_gateway_backend_up A backend in rotation (1) or out of "
                           "it after failures (0).\n"
                           "# TYPE oversub_gateway_backend_up gauge\n");
    double t = now_s();
    for (struct gw_svc *s = g->svcs; s; s = s->next) {
        const struct osubd_route *rt = route_of(g, s->id);
        for (int i = 0; rt != NULL && i < rt->n_backends; i++)
            evbuffer_add_printf(b, "oversub_gateway_backend_up{service=\"%s\",backend=\"%s\"} %d\n",
                                s->id, rt->backends[i], s->down_until[i] > t ? 0 : 1);
    }
}

static void gateway_metrics(void *ctx, struct evbuffer *b)
{
    osubd_gateway_metrics(ctx, b);
}

struct osubd_module osubd_gateway_module(struct osubd_gateway *g)
{
    struct osubd_module m = {.name = "gateway", .ctx = g, .metrics = gateway_metrics};
    return m;
}
