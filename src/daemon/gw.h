/* gw.h - the gateway's parts share this (gateway.h is the way in from outside): its state, a
 * client, a backend connection, a request, and what the parts call of each other */
/*
 * What the gateway is, from its first file:
 * gateway.c - the entry's overload protection (see gateway.h): an HTTP/1.1 reverse proxy of our
 * own on non-blocking sockets. One service's state: requests in flight to its backends (at most
 * its limit, which shrinks while it is degraded) and a queue ordered by priority then arrival,
 * each request with a deadline. Beyond the queue, or past the deadline: 429 with Retry-After
 * from the measured drain rate.
 *
 * HTTP handling is ours rather than evhttp's: a request's head is parsed in place from one
 * buffer, nothing is allocated per header, a rejection is one prebuilt write(), and backend
 * connections are kept alive in a pool per service and backend. Bodies stream both ways
 * (Content-Length, chunked passed through as framed, or until close for responses).
 */
#ifndef OSUBD_GW_H
#define OSUBD_GW_H

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
#include <sys/resource.h>
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
#define GW_BACKLOG 65535           /* the listener's (the kernel caps it at net.core.somaxconn) */

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
    /* its timer (head, idle, body, linger), lazily as a backend's: `deadline` 0 when none is
     * due; `due` when the timer event fires (0: not pending) */
    double deadline, due;
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
    /* its timer, lazily: what is due (the answer's timeout from its last read, or the pool's
     * idle timeout) is `deadline`; the timer event, pending until `due` (0: not pending), is
     * added again only when it would fire too late, and when it fires early it waits for the
     * rest: no event_add or event_del per request or per read */
    double deadline, due;
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

static inline void observe(struct hist *h, double v)
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
    /* asked to look at its queue again (osubd__gw_kick): a slot, a share or a limit may have
     * come free; on the gateway's kicked list until the kick runs */
    bool kicked;
    struct gw_svc *kick_next;
    /* idle suspend (gw_idle.c): its last request's arrival (now_s; 0: none yet), and when an
     * idle suspend was last asked for (engine ms; 0: never) */
    double last_req;
    int64_t idle_tried_ms;
};

struct osubd_gateway {
    struct osubd_core *core;
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    const struct osubd_routes *routes; /* each service's backends and limits */
    struct osubd_self *self;           /* oversubd's own addresses: never a backend */
    struct evconnlistener *lis;
    /* the queues are pumped when something happens, never on a timer: a slot freed pumps its
     * service at once; a command (a service now serving, a limit raised), a read of the
     * engine's saturation, a body done streaming kick the services concerned, and the kick
     * runs in the same turn of the loop, once the callback that asked for it returned.
     * `maint` (each second) reads the engines' metrics and sweeps what routes left behind. */
    struct event *kick;
    struct gw_svc *kicked; /* services asked to pump (gw_svc.kick_next) */
    int64_t n_queued;      /* requests in every service's queue */
    struct event *maint;
    unsigned maint_ticks;
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
    /* libevent's common timeouts, one per duration in use (a queue each: adding and removing a
     * timer of a duration shared by many is O(1), not the heap's O(log n)) */
    struct {
        long ms;
        const struct timeval *tv;
    } ct[32];
    int n_ct;
    char
        rbuf[65536]; /* a read lands here: a backend's bytes go on from it, a client's are copied */
    char hbuf[2 * H1_HEAD_MAX]; /* a head written for a backend or a client (gw_flat) */
};

/* A head written into a flat buffer (one copy a piece, one send) rather than an evbuffer a
 * piece: `over` once a piece did not fit, and nothing more is written. A head out is at most
 * the head in (H1_HEAD_MAX) and a few fields of ours: it fits in hbuf. */
struct gw_flat {
    char *p;
    size_t n, cap;
    bool over;
};

static inline void flat_put(struct gw_flat *f, const char *s, size_t len)
{
    if (f->over || len > f->cap - f->n) {
        f->over = true;
        return;
    }
    memcpy(f->p + f->n, s, len);
    f->n += len;
}

/* A header field, "name: value" and its CRLF. */
static inline void flat_field(struct gw_flat *f, const char *name, size_t nlen, const char *value,
                              size_t vlen)
{
    flat_put(f, name, nlen);
    flat_put(f, ": ", 2);
    flat_put(f, value, vlen);
    flat_put(f, "\r\n", 2);
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int osubd__gw_retry_after(const struct gw_svc *s);

/* Idle suspend (gw_idle.c): each second, the services idle for their idle_suspend_ms are
 * suspended; a request for a suspended service resumes it if it was suspended for idleness,
 * and is answered 503 at once (true) when it cannot be served before its deadline; the
 * Retry-After for a service in suspend (-1: not in suspend). */
void osubd__gw_idle_tick(struct osubd_gateway *g);
bool osubd__gw_wake(struct osubd_gateway *g, struct gw_svc *s, struct gw_req *r);
/* Its queue waits while it is suspended for idleness (a request came as it was suspending):
 * resumed. */
void osubd__gw_wake_queued(struct osubd_gateway *g, struct gw_svc *s);
int osubd__gw_suspend_retry_ms(struct osubd_gateway *g, const char *id);

const struct osubd_route *osubd__gw_route_of(const struct osubd_gateway *d, const char *id);

bool osubd__gw_serving(const osub_service_info_t *si);

int osubd__gw_read_into(struct osubd_gateway *g, struct evbuffer *b, int fd);

void osubd__gw_set_nodelay(int fd);

const struct timeval *osubd__gw_tv(struct osubd_gateway *g, long ms, struct timeval *plain);

bool osubd__gw_send_bytes(int fd, struct evbuffer *out, struct event *wev, const char *p, size_t n);

bool osubd__gw_send_iov(int fd, struct evbuffer *out, struct event *wev, struct iovec *v, int n);

bool osubd__gw_send_buffer(int fd, struct evbuffer *out, struct event *wev, struct evbuffer *b);

void osubd__gw_req_free(struct gw_req *r);

void osubd__gw_req_detach(struct gw_req *r);

void osubd__gw_cl_read_pause(struct gw_client *c);

void osubd__gw_cl_read_resume(struct gw_client *c);

void osubd__gw_cl_send(struct gw_client *c, const char *p, size_t n);

void osubd__gw_client_gone(struct gw_client *c, const char *why);

void osubd__gw_cl_after(struct gw_client *c);

void osubd__gw_access_log(struct gw_req *r, int status, const char *outcome);

void osubd__gw_reply(struct gw_req *r, int code, const char *phrase, const char *ecode,
                     const char *reason, const char *msg, int osubd__gw_retry_after);

void osubd__gw_cl_arm(struct gw_client *c, int seconds);

void osubd__gw_cl_disarm(struct gw_client *c);

void osubd__gw_cl_fire(struct gw_client *c);

void osubd__gw_cl_process_inner(struct gw_client *c);

void osubd__gw_cl_close(struct gw_client *c);

void osubd__gw_on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                         int salen, void *arg);

void osubd__gw_bc_close(struct gw_bconn *bc);

void osubd__gw_svc_flush_idle(struct gw_svc *s, bool all);

void osubd__gw_forward_body(struct gw_req *r);

void osubd__gw_dispatch(struct osubd_gateway *g, struct gw_req *r);

void osubd__gw_finish(struct gw_req *r, bool ok);

void osubd__gw_unqueue(struct gw_svc *s, struct gw_req *r);

void osubd__gw_on_deadline(evutil_socket_t fd, short what, void *arg);

int32_t osubd__gw_eff_lim(const struct gw_svc *s);

void osubd__gw_eng_drop(struct gw_svc *s);

bool osubd__gw_stream_ok(const struct gw_svc *s, const struct gw_req *r);

void osubd__gw_pump(struct osubd_gateway *g, struct gw_svc *s);

void osubd__gw_kick(struct gw_svc *s);

void osubd__gw_kick_queued(struct osubd_gateway *g);

void osubd__gw_on_kick(evutil_socket_t fd, short what, void *arg);

void osubd__gw_on_maint(evutil_socket_t fd, short what, void *arg);

struct gw_svc *osubd__gw_svc_of(struct osubd_gateway *g, const char *id);

int osubd__gw_svc_view(struct osubd_gateway *g, struct gw_svc *s);

struct gw_svc *osubd__gw_svc_find(struct osubd_gateway *g, const char *id, size_t n);

bool osubd__gw_body_arrived(struct gw_client *c, struct gw_req *r);

void osubd__gw_handle(struct gw_client *c, struct gw_req *r);

void osubd__gw_admit(struct osubd_gateway *g, struct gw_req *r);

#endif
