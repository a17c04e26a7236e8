/* gw_clients.c - the gateway's clients: connections, the HTTP/1.1 request read ahead, answers, the
 * access log */
#define _GNU_SOURCE
#include "gw.h"

/* ---- clients ------------------------------------------------------------------------------ */

static int format_answer(char *buf, size_t len, int code, const char *phrase, const char *ecode,
                         const char *reason, const char *msg, int osubd__gw_retry_after,
                         bool close_it, bool head, int *split);
static void cl_process(struct gw_client *c);

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

void osubd__gw_req_free(struct gw_req *r)
{
    if (r->timer) {
        event_free(r->timer);
        r->timer = NULL;
    }
    if (r->svc != NULL) {
        if (r->streams) {
            r->svc->streaming--;
            osubd__gw_kick(r->svc); /* a streaming share came free */
        }
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
void osubd__gw_req_detach(struct gw_req *r)
{
    if (r->cl != NULL && r->cl->cur == r)
        r->cl->cur = NULL;
    osubd__gw_req_free(r);
}

/* A paused client's end: EV_CLOSED (EPOLLRDHUP) for a FIN; a reset shows only as an error on
 * the socket (libevent reports EPOLLHUP as read and write, which a paused client does not
 * wait for), so a timer looks at SO_ERROR every 250 ms while paused. */
static void cl_on_hup(evutil_socket_t fd, short what, void *arg)
{
    int err = 0;
    socklen_t l = sizeof(err);
    if ((what & EV_CLOSED) || (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) == 0 && err != 0))
        osubd__gw_client_gone(arg, "closed while its reads were paused");
}

/* Reads paused (a body beyond what is buffered for a queued request, or a backend slower than
 * the client): a client that leaves meanwhile is still noticed, by EV_CLOSED (EPOLLRDHUP). */
void osubd__gw_cl_read_pause(struct gw_client *c)
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

void osubd__gw_cl_read_resume(struct gw_client *c)
{
    if (c->hup != NULL)
        event_del(c->hup);
    if (c->hup_tick != NULL)
        event_del(c->hup_tick);
    event_add(c->rev, NULL);
}

void osubd__gw_cl_send(struct gw_client *c, const char *p, size_t n)
{
    if (!osubd__gw_send_bytes(c->fd, c->out, c->wev, p, n)) {
        c->closing = c->gone = true; /* the client is gone */
        evbuffer_drain(c->out, evbuffer_get_length(c->out));
    }
}

/* The client left (closed, reset, or cannot be written to): its request's backend connection
 * is closed, never pooled (vLLM and TGI stop generating when theirs closes), its slot freed at
 * once, a queued request leaves the queue. */
void osubd__gw_client_gone(struct gw_client *c, const char *why)
{
    (void)why;
    if (c->cur != NULL) {
        c->g->client_gone++;
        if (c->cur->svc != NULL)
            c->cur->svc->client_gone++;
        osubd__gw_access_log(c->cur, 499, "client_gone"); /* nginx's number for it */
    }
    osubd__gw_cl_close(c);
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
        osubd__gw_cl_arm(c, LINGER_S);
        return;
    }
    osubd__gw_cl_close(c);
}

/* After an answer: close when asked to and all is sent, else read on (pipelined requests). */
void osubd__gw_cl_after(struct gw_client *c)
{
    if (c->closing) {
        if (evbuffer_get_length(c->out) == 0 && c->cur == NULL)
            cl_end(c); /* a body still coming: read and dropped for a while first */
        return;
    }
    cl_process(c);
}

/* One JSON line per request in the access log: when, who, what, the answer and why. */
void osubd__gw_access_log(struct gw_req *r, int status, const char *outcome)
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
                         const char *reason, const char *msg, int osubd__gw_retry_after,
                         bool close_it, bool head, int *split)
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
    if (osubd__gw_retry_after > 0)
        snprintf(ra, sizeof(ra), "Retry-After: %d\r\nRetry-After-Ms: %d\r\n",
                 (osubd__gw_retry_after + 999) / 1000, osubd__gw_retry_after);
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

void osubd__gw_reply(struct gw_req *r, int code, const char *phrase, const char *ecode,
                     const char *reason, const char *msg, int osubd__gw_retry_after)
{
    static struct canned cache[16];
    static unsigned next_slot;
    struct gw_client *c = r->cl;
    if (c == NULL) {
        osubd__gw_req_free(r);
        return;
    }
    osubd__gw_access_log(r, code, reason);
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
    osubd__gw_req_detach(r);
    if (osubd__gw_retry_after <= 0) {
        osubd__gw_cl_send(c, k->bytes, (size_t)k->len);
        return;
    }
    /* Retry-After of the moment (spread by jitter): between the fixed fields and the rest */
    char buf[1400];
    memcpy(buf, k->bytes, (size_t)k->split);
    int n = k->split + snprintf(buf + k->split, 80, "Retry-After: %d\r\nRetry-After-Ms: %d\r\n",
                                (osubd__gw_retry_after + 999) / 1000, osubd__gw_retry_after);
    memcpy(buf + n, k->bytes + k->split, (size_t)(k->len - k->split));
    osubd__gw_cl_send(c, buf, (size_t)(n + k->len - k->split));
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
    osubd__gw_cl_send(c, buf, (size_t)n);
}

/* The client's timer is due in seconds (its event added only when it would fire later). */
void osubd__gw_cl_arm(struct gw_client *c, int seconds)
{
    c->deadline = now_s() + seconds;
    if (c->due == 0 || c->due > c->deadline) {
        struct timeval tv;
        event_add(c->timer, osubd__gw_tv(c->g, seconds * 1000L, &tv));
        c->due = c->deadline;
    }
}

/* Nothing is due on the client (its request is being answered): the event, when it fires,
 * does nothing. */
void osubd__gw_cl_disarm(struct gw_client *c)
{
    c->deadline = 0;
}

/* The timer at once: the client is closed from the loop (c->gone says why). */
void osubd__gw_cl_fire(struct gw_client *c)
{
    struct timeval now = {0, 0};
    event_add(c->timer, &now);
    c->due = now_s();
}

static void cl_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct gw_client *c = arg;
    c->due = 0;
    if (!c->gone) {
        if (c->deadline == 0)
            return; /* disarmed meanwhile */
        double left = c->deadline - now_s();
        if (left > 0.005) { /* armed again meanwhile: the rest */
            struct timeval tv = {(time_t)left, (suseconds_t)((left - (double)(time_t)left) * 1e6)};
            event_add(c->timer, &tv);
            c->due = c->deadline;
            return;
        }
    }
    if (c->gone) {
        if (c->bad_framing)
            osubd__gw_cl_close(c);
        else
            osubd__gw_client_gone(c, "a write failed");
        return;
    }
    if (!c->lingering && c->cur != NULL && c->cur->awaiting_body) {
        /* a body that did not arrive in time: it never had a slot; 408 and close */
        char buf[1280];
        int n =
            format_answer(buf, sizeof(buf), 408, "Request Timeout", "timeout", "body_timeout",
                          "the request's body did not arrive within 30 s", 0, true, false, NULL);
        send(c->fd, buf, (size_t)n, MSG_NOSIGNAL);
        osubd__gw_access_log(c->cur, 408, "body_timeout");
        c->g->bad_requests++;
        osubd__gw_cl_close(c);
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
    osubd__gw_cl_close(c);
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
            osubd__gw_client_gone(c, "a write failed");
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
    int n = osubd__gw_read_into(c->g, c->in, fd);
    if (c->lingering) {
        evbuffer_drain(c->in, evbuffer_get_length(c->in));
        c->discard -= n > 0 ? n : 0;
        if (n == 0 || c->discard <= 0 ||
            (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            osubd__gw_cl_close(c);
        return;
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        /* the end of the client's side while its request waits or runs: it left (an SDK that
         * gives up closes its socket), as nginx and HAProxy read it by default */
        osubd__gw_client_gone(c, n == 0 ? "closed" : "reset");
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

void osubd__gw_cl_process_inner(struct gw_client *c)
{
    while (!c->closing) {
        if (c->cur != NULL) {
            if (c->cur->awaiting_body) {
                if (!osubd__gw_body_arrived(c, c->cur))
                    return;
                c->cur->awaiting_body = false;
                osubd__gw_cl_disarm(c);
                osubd__gw_admit(c->g, c->cur);
                continue; /* answered at once, dispatched, or queued */
            }
            if (c->cur->bc != NULL && !c->cur->body_done)
                osubd__gw_forward_body(c->cur);
            else if (c->cur->timer != NULL && c->cur->svc != NULL)
                osubd__gw_kick(c->cur->svc); /* queued: all of its body here may let it go */
            /* a queued request's body waits in `in`; beyond 1 MiB we stop reading */
            if (evbuffer_get_length(c->in) > 1024 * 1024)
                osubd__gw_cl_read_pause(c);
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
            osubd__gw_cl_arm(c, HEAD_TIMEOUT_S);
        }
        if (len == 0) {
            if (!c->in_head)
                osubd__gw_cl_arm(c, IDLE_TIMEOUT_S);
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
            osubd__gw_req_free(r);
            if (!c->in_head) {
                c->in_head = true; /* the head's clock starts at its first byte, once */
                osubd__gw_cl_arm(c, HEAD_TIMEOUT_S);
            }
            return;
        }
        if (prc == H1_BAD) {
            int code = r->hd.err_status;
            const char *why = r->hd.err_why;
            osubd__gw_req_free(r);
            reply_bad(c, code, phrase_of(code), why);
            return;
        }
        size_t hl = r->hd.len;
        c->in_head = false;
        osubd__gw_cl_disarm(c);
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
            osubd__gw_req_free(r);
            reply_bad(c, 413, "Content Too Large", "the body is over 64 MiB");
            return;
        }
        c->cur = r;
        osubd__gw_handle(c, r);
    }
}

/* Reads what requests the buffer holds; the last thing a caller does with c (it may be
 * closed). */
static void cl_process(struct gw_client *c)
{
    osubd__gw_cl_process_inner(c);
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

void osubd__gw_cl_close(struct gw_client *c)
{
    struct gw_req *r = c->cur;
    if (r != NULL) {
        struct gw_svc *s = r->svc;
        if (r->bc != NULL) {
            /* in flight: the backend's answer has nowhere to go */
            struct gw_bconn *bc = r->bc;
            bc->r = NULL;
            osubd__gw_bc_close(bc);
            s->inflight--;
            osubd__gw_req_free(r);
            osubd__gw_pump(s->g, s);
        } else if (s != NULL && r->timer != NULL) {
            osubd__gw_unqueue(s, r);
            osubd__gw_req_free(r);
        } else {
            osubd__gw_req_free(r);
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

void osubd__gw_on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                         int salen, void *arg)
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
    int share =
        g->cfg->gateway_conns_per_client > 0 ? g->cfg->gateway_conns_per_client : CONNS_PER_CLIENT;
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
    osubd__gw_set_nodelay(fd);
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
    osubd__gw_cl_arm(c, HEAD_TIMEOUT_S);
    /* its request's first bytes are in (the listener defers the accept until they are): read
     * them now, not after a turn of the loop behind the rest of an accept burst (a connection
     * handed over by the kernel's timeout has nothing yet: EAGAIN, and the read event waits) */
    if (!g->cfg->gateway_accept_at_once)
        cl_on_read(fd, EV_READ, c);
}
