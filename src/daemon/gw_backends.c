/* gw_backends.c - the gateway's backends: pooled connections tied to their URL, forwarding,
 * streaming answers back */
#define _GNU_SOURCE
#include "gw.h"

/* ---- backends ------------------------------------------------------------------------------ */

void osubd__gw_bc_close(struct gw_bconn *bc)
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
void osubd__gw_svc_flush_idle(struct gw_svc *s, bool all)
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
            osubd__gw_bc_close(bc);
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
        osubd__gw_bc_close(bc);
        r->bc = NULL;
        r->retries++;
        s->inflight--;
        s->admitted--;
        struct gw_client *c = r->cl;
        osubd__gw_dispatch(s->g, r);
        if (c->cur != r)
            osubd__gw_cl_after(c); /* answered (no backend at all): the client reads on */
        return;
    }
    s->backend_errors++;
    s->backoff[b] = s->backoff[b] > 0 ? (s->backoff[b] * 2 > 30 ? 30 : s->backoff[b] * 2) : 1;
    s->down_until[b] = now_s() + s->backoff[b];
    bc->r = NULL;
    osubd__gw_bc_close(bc);
    if (r == NULL)
        return;
    r->bc = NULL;
    struct gw_client *c = r->cl;
    s->inflight--;
    if (r->started) {
        /* the answer stops short: the client sees it by the closed connection */
        osubd__gw_access_log(r, r->status, "cut");
        c->closing = true;
        osubd__gw_req_detach(r);
    } else if (timeout) {
        osubd__gw_reply(r, 504, "Gateway Timeout", "backend_timeout", "timeout",
                        "the service's backend did not answer in time", 0);
    } else {
        osubd__gw_reply(r, 502, "Bad Gateway", "backend_unavailable", "connection",
                        "the service's backend refused or dropped the connection", 0);
    }
    osubd__gw_pump(s->g, s);
    osubd__gw_cl_after(c);
}

static long bc_timeout_ms(const struct gw_bconn *bc)
{
    return bc->svc->v_upstream_ms > 0 ? bc->svc->v_upstream_ms : BACKEND_TIMEOUT_S * 1000L;
}

/* bc's timer is due in ms (its event added only when it would fire later: see gw_bconn). */
static void bc_arm_ms(struct gw_bconn *bc, long ms)
{
    bc->deadline = now_s() + (double)ms / 1000.0;
    if (bc->due == 0 || bc->due > bc->deadline) {
        struct timeval tv;
        event_add(bc->timer, osubd__gw_tv(bc->svc->g, ms, &tv));
        bc->due = bc->deadline;
    }
}

/* The answer's timeout, from now. */
static void bc_arm(struct gw_bconn *bc)
{
    if (bc->broken)
        return; /* its timer is due at once: a send failed */
    bc_arm_ms(bc, bc_timeout_ms(bc));
}

static void bc_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_bconn *bc = arg;
    bc->due = 0;
    if (!bc->broken) {
        double left = bc->deadline - now_s();
        if (left > 0.005) { /* bytes came, or it was armed again, since: the rest */
            struct timeval tv = {(time_t)left, (suseconds_t)((left - (double)(time_t)left) * 1e6)};
            event_add(bc->timer, &tv);
            bc->due = bc->deadline;
            return;
        }
    }
    if (bc->r == NULL) {
        bc_unidle(bc);
        osubd__gw_bc_close(bc);
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
        bc_arm_ms(bc, IDLE_TIMEOUT_S * 1000L);
        event_add(bc->rev, NULL); /* a close while idle is noticed */
    } else {
        osubd__gw_bc_close(bc);
    }
    struct gw_client *c = r->cl;
    if (!r->keepalive || !r->body_done)
        c->closing = true; /* the rest of its body would be read as a request: close */
    /* answered before its body was all in: the rest read and dropped, so that the client
     * reads the answer, not a reset */
    if (!r->body_done)
        c->discard =
            r->chunked_body || r->body_left > GW_DISCARD_MAX ? GW_DISCARD_MAX : r->body_left;
    osubd__gw_finish(r, true);
    osubd__gw_cl_after(c);
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
    if (!osubd__gw_send_buffer(c->fd, c->out, c->wev, st))
        c->closing = c->gone = true;
    evbuffer_drain(st, evbuffer_get_length(st));
    if (evbuffer_get_length(c->out) > OUT_HIGH) {
        c->paused_bc = true;
        event_del(bc->rev);
    }
}

/* The answer's head at h (len bytes, up to H1_HEAD_MAX looked at): status and headers passed on,
 * hop-by-hop ones dropped, the framing kept. 0: not all of it yet; -1: bad (502); 1: an
 * informational answer (1xx), *hl bytes, not passed on; 2: the head, *hl bytes, and the
 * client's head written in g->hbuf, *out bytes. */
static int bc_head_at(struct gw_bconn *bc, const char *h, size_t len, size_t *hl, size_t *out)
{
    if (len == 0)
        return 0;
    size_t look = len < H1_HEAD_MAX ? len : H1_HEAD_MAX;
    struct gw_req *r = bc->r;
    struct h1_head *hd = &bc->svc->g->resp;
    int prc = h1_parse_response(h, look, r->is_head, hd);
    if (prc == H1_PARTIAL)
        return 0;
    if (prc == H1_BAD)
        return -1;
    *hl = hd->len;
    int code = hd->status;
    if (code == 101)
        return -1; /* an upgrade (WebSocket): the gateway does not tunnel; 502 */
    if (code < 200)
        return 1; /* 100 Continue and the like: not passed on */
    struct gw_svc *s = bc->svc;
    s->answers[code / 100 < 6 ? code / 100 : 5]++;
    r->status = code;
    observe(&s->ttfb, now_s() - r->t_sent);
    const struct h1_header *conn = h1_find(hd, "Connection");
    bc->keepalive = hd->keepalive;
    if (hd->no_body)
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
    const char *reason = h + 12, *rend = memchr(h, '\n', *hl);
    if (rend > h && rend[-1] == '\r')
        rend--;
    while (reason < rend && *reason == ' ')
        reason++;
    struct osubd_gateway *g = s->g;
    struct gw_flat o = {.p = g->hbuf, .cap = sizeof(g->hbuf)};
    flat_put(&o, "HTTP/1.1 ", 9);
    flat_put(&o, h + 9, 3);
    flat_put(&o, " ", 1);
    flat_put(&o, reason, (size_t)(rend - reason));
    flat_put(&o, "\r\n", 2);
    for (int i = 0; i < hd->nh; i++) {
        const struct h1_header *f = &hd->h[i];
        bool te = f->nlen == 17 && strncasecmp(f->name, "Transfer-Encoding", 17) == 0;
        if (!h1_hop_by_hop(f->name, f->nlen, conn) || (te && bc->st == 2 && !r->http10))
            flat_field(&o, f->name, f->nlen, f->value, f->vlen);
    }
    if (!r->body_done)
        r->keepalive = false; /* answered before its body is all in: closed after the answer */
    if (!r->keepalive)
        flat_put(&o, "Connection: close\r\n", 19);
    else if (r->http10)
        flat_put(&o, "Connection: keep-alive\r\n", 24);
    flat_put(&o, "\r\n", 2);
    if (o.over)
        return -1; /* cannot be (hbuf holds the largest head and ours): 502 */
    r->started = true;
    *out = o.n;
    return 2;
}

/* The head from bc->in: 0, -1 as bc_head_at; 1 when one was taken (the client's staged in the
 * scratch buffer, with the body that follows). */
static int bc_head(struct gw_bconn *bc)
{
    size_t len = evbuffer_get_length(bc->in);
    size_t look = len < H1_HEAD_MAX ? len : H1_HEAD_MAX;
    const char *h = len ? (const char *)evbuffer_pullup(bc->in, (ssize_t)look) : NULL;
    size_t hl = 0, out = 0;
    int rc = bc_head_at(bc, h, len, &hl, &out);
    if (rc <= 0)
        return rc;
    if (rc == 2)
        evbuffer_add(bc->svc->g->scratch, bc->svc->g->hbuf, out);
    evbuffer_drain(bc->in, hl);
    return 1;
}

static void add_data(void *arg, const char *p, size_t n)
{
    evbuffer_add(arg, p, n);
}

/* The answer as far as bc->in holds it: its head, then its body staged for the client. -1
 * when it failed (bc_fail ran: bc is gone). */
static int bc_parse(struct gw_bconn *bc)
{
    for (;;) {
        if (bc->st == 0) {
            int h = bc_head(bc);
            if (h < 0) {
                evbuffer_drain(bc->svc->g->scratch, evbuffer_get_length(bc->svc->g->scratch));
                bc_fail(bc, false);
                return -1;
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
                return -1;
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
    return 0;
}

/* Whether a read's bytes may go to the client straight from the read buffer: the head went,
 * nothing waits before them, and the body passes as it is framed. */
static bool bc_passes(const struct gw_bconn *bc)
{
    return evbuffer_get_length(bc->in) == 0 &&
           (bc->st == 1 || bc->st == 3 || bc->st == 4 || (bc->st == 2 && !bc->r->http10));
}

/* One read of the answer, from p to the client, after hn bytes of the client's head at hp (none:
 * 0): what the body's framing takes goes with the head in one write (the rest kept in the
 * client's out), what is past the answer's end stays in bc->in. -1: the framing is broken. */
static int bc_pass(struct gw_bconn *bc, const char *hp, size_t hn, const char *p, size_t n)
{
    size_t k = n;
    if (bc->st == 4) {
        k = 0;
    } else if (bc->st == 1) {
        k = n < (size_t)bc->left ? n : (size_t)bc->left;
        bc->left -= (int64_t)k;
        if (bc->left == 0)
            bc->st = 4;
    } else if (bc->st == 2) {
        k = h1_chunked_feed(&bc->cs, p, n, NULL, NULL);
        if (bc->cs.st == H1C_BAD) {
            if (hn > 0) /* the head went out, then the answer stops short */
                osubd__gw_cl_send(bc->r->cl, hp, hn);
            return -1;
        }
        if (bc->cs.st == H1C_DONE)
            bc->st = 4;
    }
    struct gw_client *c = bc->r->cl;
    struct iovec v[2] = {{(void *)hp, hn}, {(void *)p, k}};
    if (hn + k > 0 && !osubd__gw_send_iov(c->fd, c->out, c->wev, v, 2))
        c->closing = c->gone = true;
    if (k < n)
        evbuffer_add(bc->in, p + k, n - k);
    if (evbuffer_get_length(c->out) > OUT_HIGH) {
        c->paused_bc = true;
        event_del(bc->rev);
    }
    return 0;
}

/* A read that starts an answer (bc->in empty), parsed where it landed: its head and as much of
 * its body as it holds leave in one write, nothing copied into an evbuffer. -1: failed (bc is
 * gone). */
static int bc_first(struct gw_bconn *bc, const char *p, size_t n)
{
    size_t hl = 0, out = 0;
    int rc;
    while ((rc = bc_head_at(bc, p, n, &hl, &out)) == 1) {
        p += hl; /* an informational answer: not passed on */
        n -= hl;
    }
    if (rc < 0) {
        bc_fail(bc, false);
        return -1;
    }
    struct osubd_gateway *g = bc->svc->g;
    if (rc == 0) {
        evbuffer_add(bc->in, p, n); /* a head in pieces: bc_parse has it from bc->in */
        return 0;
    }
    p += hl;
    n -= hl;
    if (!bc_passes(bc)) { /* dechunked for HTTP/1.0: staged */
        evbuffer_add(g->scratch, g->hbuf, out);
        evbuffer_add(bc->in, p, n);
        return bc_parse(bc);
    }
    if (bc_pass(bc, g->hbuf, out, p, n) != 0) {
        bc_fail(bc, false);
        return -1;
    }
    return 0;
}

static void bc_on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct gw_bconn *bc = arg;
    char *buf = bc->svc->g->rbuf;
    ssize_t n = read(fd, buf, sizeof(bc->svc->g->rbuf));
    if (bc->r == NULL) {
        /* idle: the backend closed it (or said something it should not have) */
        bc_unidle(bc);
        osubd__gw_bc_close(bc);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    bool eof = n <= 0;
    if (n > 0) {
        bc->got_bytes = true;
        bc->deadline = now_s() + (double)bc_timeout_ms(bc) / 1000.0; /* bc_on_timer */
        if (bc->st == 0 && evbuffer_get_length(bc->in) == 0) {
            if (bc_first(bc, buf, (size_t)n) != 0)
                return;
        } else if (bc_passes(bc)) { /* a stream's next bytes: no copy, no buffer */
            if (bc_pass(bc, NULL, 0, buf, (size_t)n) != 0) {
                bc_fail(bc, false);
                return;
            }
        } else {
            evbuffer_add(bc->in, buf, (size_t)n);
            if (bc_parse(bc) != 0)
                return;
        }
    } else if (bc_parse(bc) != 0) {
        return;
    }
    if (bc->r != NULL && bc->r->cl != NULL && bc->r->cl->gone) {
        osubd__gw_client_gone(bc->r->cl, "a write failed"); /* closes bc too */
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
        osubd__gw_cl_read_resume(bc->r->cl);
        osubd__gw_forward_body(bc->r);
    }
}

static void bc_broken(struct gw_bconn *bc)
{
    bc->broken = true;
    struct timeval now = {0, 0};
    event_add(bc->timer, &now);
    bc->due = now_s();
}

/* Sends b on bc. A connection still connecting is written to at once all the same: on loopback
 * its handshake is done by the time connect() returned, and the write then saves a turn of the
 * loop (the write event, SO_ERROR, two changes of interest); EAGAIN says it is not, and the
 * write event waits for it. */
static void bc_send(struct gw_bconn *bc, struct evbuffer *b)
{
    if (bc->broken)
        return;
    if (!bc->connected && evbuffer_get_length(bc->out) == 0) {
        int w = evbuffer_write(b, bc->fd);
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            bc_broken(bc); /* refused: failed from the loop, 502 */
            return;
        }
        if (w > 0) {
            bc->connected = true;
            event_add(bc->rev, NULL);
        }
        if (evbuffer_get_length(b) == 0)
            return;
    }
    if (!bc->connected) {
        evbuffer_add_buffer(bc->out, b);
        event_add(bc->wev, NULL); /* the handshake's end */
        return;
    }
    if (!osubd__gw_send_buffer(bc->fd, bc->out, bc->wev, b))
        bc_broken(bc);
}

/* bc_send of n bytes at p (copied only when the socket does not take them all). */
static void bc_send_bytes(struct gw_bconn *bc, const char *p, size_t n)
{
    if (bc->broken)
        return;
    if (!bc->connected && evbuffer_get_length(bc->out) == 0) {
        ssize_t w = send(bc->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            bc_broken(bc); /* refused: failed from the loop, 502 */
            return;
        }
        if (w > 0) {
            bc->connected = true;
            event_add(bc->rev, NULL);
            p += w;
            n -= (size_t)w;
        }
        if (n == 0)
            return;
    }
    if (!bc->connected) {
        evbuffer_add(bc->out, p, n);
        event_add(bc->wev, NULL); /* the handshake's end */
        return;
    }
    if (!osubd__gw_send_bytes(bc->fd, bc->out, bc->wev, p, n))
        bc_broken(bc);
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
            osubd__gw_bc_close(bc); /* opened for a backend the route no longer names here */
            continue;
        }
        bc->reused = true; /* its idle timer stays: dispatch makes the answer's due */
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
    osubd__gw_set_nodelay(fd);
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
        osubd__gw_bc_close(bc);
        return NULL;
    }
    int rc = connect(fd, (struct sockaddr *)&s->baddr[b], s->baddr_len[b]);
    if (rc == 0) {
        bc->connected = true;
        event_add(bc->rev, NULL);
    } else if (errno == EINPROGRESS) {
        /* bc_send writes at once, or waits for the write event */
    } else {
        bc->fd = fd;
        osubd__gw_bc_close(bc);
        return NULL;
    }
    return bc;
}

/* The request's body, from the client to the backend as it arrives. */
void osubd__gw_forward_body(struct gw_req *r)
{
    struct gw_client *c = r->cl;
    struct gw_bconn *bc = r->bc;
    if (bc == NULL || r->body_done)
        return;
    if (evbuffer_get_length(bc->out) > 1024 * 1024) {
        osubd__gw_cl_read_pause(c); /* the backend reads slower: wait for its write event */
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
            osubd__gw_cl_fire(c);
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
        osubd__gw_cl_fire(c);
        return;
    }
    if (r->body_done && r->streams) {
        r->streams = false;
        r->svc->streaming--;
        osubd__gw_kick(r->svc); /* a streaming share came free */
    }
    if (!r->body_done) {
        osubd__gw_cl_arm(c, BODY_TIMEOUT_S);
    }
}

void osubd__gw_dispatch(struct osubd_gateway *g, struct gw_req *r)
{
    struct gw_svc *s = r->svc;
    const struct osubd_route *route = osubd__gw_route_of(g, s->id);
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
        osubd__gw_reply(
            r, 502, "Bad Gateway", "backend_forbidden", "self",
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
        osubd__gw_reply(r, 502, "Bad Gateway", "backend_unavailable", "no_backend",
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
    struct gw_flat o = {.p = g->hbuf, .cap = sizeof(g->hbuf)};
    const char *rest = r->by_host ? r->uri : memchr(r->uri + 1, '/', r->ulen - 1);
    const char *q = memchr(r->uri, '?', r->ulen);
    flat_put(&o, r->method, r->mlen);
    flat_put(&o, " ", 1);
    const char *uend = r->uri + r->ulen;
    if (rest == NULL || (q != NULL && q < rest)) {
        flat_put(&o, "/", 1);
        if (q != NULL)
            flat_put(&o, q, (size_t)(uend - q));
    } else {
        flat_put(&o, rest, (size_t)(uend - rest));
    }
    flat_put(&o, " HTTP/1.1\r\n", 11);
    flat_field(&o, "Host", 4, s->bhost[b], strlen(s->bhost[b]));
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
        flat_field(&o, h->name, h->nlen, h->value, h->vlen);
    }
    if (r->chunked_body)
        flat_put(&o, "Transfer-Encoding: chunked\r\n", 28);
    flat_put(&o, "X-Forwarded-For: ", 17);
    if (xff != NULL) {
        flat_put(&o, xff->value, xff->vlen);
        flat_put(&o, ", ", 2);
    }
    flat_put(&o, c->peer, strlen(c->peer));
    flat_put(&o, "\r\n\r\n", 4);
    if (o.over) /* cannot be (hbuf holds the largest head and ours): failed from the loop */
        bc_broken(bc);
    else
        bc_send_bytes(bc, o.p, o.n);
    if (r->bc != bc)
        return; /* the send failed: answered already, or sent again on another connection */
    bc_arm(bc);
    if (expect100 && !r->body_done && !r->continued)
        osubd__gw_cl_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    if (!r->body_done) {
        osubd__gw_cl_read_resume(c);
        osubd__gw_forward_body(r);
    }
}

void osubd__gw_finish(struct gw_req *r, bool ok)
{
    struct gw_svc *s = r->svc;
    double t = now_s();
    osubd__gw_access_log(r, r->status, ok ? "served" : "backend_error");
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
    osubd__gw_req_detach(r);
    osubd__gw_pump(s->g, s);
}
