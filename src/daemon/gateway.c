/* gateway.c - the entry's overload protection: a service's limit and queue, the listener, drain,
 * metrics */
#define _GNU_SOURCE
#include "gw.h"

static int gateway_listen(struct osubd_gateway *g, char *err, size_t errlen);

/* ---- the service's limit and the drain rate ---------------------------------------- */

/* Whole seconds until the queue ahead has likely drained, at least 1. */
/* Milliseconds until a refused client likely finds room: its place behind the queue over the
 * rate at which the service completes requests (1 s when unknown), spread by jitter between
 * half and one and a half of that (the wait at least 100 ms), so that refused clients do not
 * come back together. At most 60 s. */
int osubd__gw_retry_after(const struct gw_svc *s)
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

const struct osubd_route *osubd__gw_route_of(const struct osubd_gateway *d, const char *id)
{
    return osubd_routes_get(d->routes, id);
}

static int32_t limit_of(const struct osubd_gateway *d, const char *id,
                        const osub_service_info_t *si)
{
    const struct osubd_route *r = osubd__gw_route_of(d, id);
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
    const struct osubd_route *r = osubd__gw_route_of(d, id);
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

bool osubd__gw_serving(const osub_service_info_t *si)
{
    return si->state == OSUB_STATE_RUNNING || si->state == OSUB_STATE_DEGRADED;
}

/* ---- small I/O helpers ------------------------------------------------------------------------
 */

/* Reads what the socket has (up to 64 KiB) into b: one read(), no FIONREAD as evbuffer_read
 * makes. Returns read()'s result. */
int osubd__gw_read_into(struct osubd_gateway *g, struct evbuffer *b, int fd)
{
    ssize_t n = read(fd, g->rbuf, sizeof(g->rbuf));
    if (n > 0 && evbuffer_add(b, g->rbuf, (size_t)n) != 0) {
        errno = ENOMEM;
        return -1;
    }
    return (int)n;
}

/* A timer's duration for event_add: libevent's common timeout for ms (made the first time, for
 * the first 32 durations asked for), else *plain set to it. */
const struct timeval *osubd__gw_tv(struct osubd_gateway *g, long ms, struct timeval *plain)
{
    for (int i = 0; i < g->n_ct; i++)
        if (g->ct[i].ms == ms)
            return g->ct[i].tv;
    plain->tv_sec = ms / 1000;
    plain->tv_usec = (ms % 1000) * 1000;
    if (g->n_ct == (int)(sizeof(g->ct) / sizeof(g->ct[0])))
        return plain;
    const struct timeval *tv = event_base_init_common_timeout(g->base, plain);
    if (tv == NULL)
        return plain;
    g->ct[g->n_ct].ms = ms;
    g->ct[g->n_ct++].tv = tv;
    return tv;
}

void osubd__gw_set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Sends at once what the socket takes and keeps the rest for its write event. false: the peer is
 * gone. */
bool osubd__gw_send_bytes(int fd, struct evbuffer *out, struct event *wev, const char *p, size_t n)
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

/* osubd__gw_send_bytes of the n pieces of v, in one writev. */
bool osubd__gw_send_iov(int fd, struct evbuffer *out, struct event *wev, struct iovec *v, int n)
{
    if (evbuffer_get_length(out) == 0) {
        ssize_t w = writev(fd, v, n);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return false;
            w = 0;
        }
        for (int i = 0; i < n && w > 0; i++) {
            size_t k = (size_t)w < v[i].iov_len ? (size_t)w : v[i].iov_len;
            v[i].iov_base = (char *)v[i].iov_base + k;
            v[i].iov_len -= k;
            w -= (ssize_t)k;
        }
    }
    bool left = false;
    for (int i = 0; i < n; i++)
        if (v[i].iov_len > 0) {
            evbuffer_add(out, v[i].iov_base, v[i].iov_len);
            left = true;
        }
    if (left)
        event_add(wev, NULL);
    return true;
}

bool osubd__gw_send_buffer(int fd, struct evbuffer *out, struct event *wev, struct evbuffer *b)
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

/* ---- the entry ----------------------------------------------------------------------------- */

/* What a request needs of the engine and the routes about its service, kept until the next
 * command changes the state. 0, or -1 when the service has no route or no longer exists. */
int osubd__gw_svc_view(struct osubd_gateway *g, struct gw_svc *s)
{
    struct osubd_gateway *d = g;
    if (s->view_version == osubd_core_version(d->core) && s->view_version != 0)
        return s->view_ok ? 0 : -1;
    osub_service_info_t si;
    const struct osubd_route *route = osubd__gw_route_of(d, s->id);
    s->view_version = osubd_core_version(d->core);
    s->view_ok = route != NULL && osub_engine_service_info(d->e, s->id, &si) == 0;
    if (!s->view_ok)
        return -1;
    s->v_serving = osubd__gw_serving(&si);
    s->v_level = si.level;
    s->v_lim = limit_of(d, s->id, &si);
    s->v_maxq = max_queue_of(d, s->id, s->v_lim);
    s->v_qt = route->queue_timeout_ms > 0 ? route->queue_timeout_ms : 5000;
    s->v_upstream_ms =
        route->upstream_timeout_ms > 0 ? route->upstream_timeout_ms : BACKEND_TIMEOUT_S * 1000L;
    s->v_shed = shed_from(d, &si);
    return 0;
}

struct gw_svc *osubd__gw_svc_find(struct osubd_gateway *g, const char *id, size_t n)
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
    struct gw_svc *s = osubd__gw_svc_find(g, id, n);
    if (s != NULL)
        return osubd__gw_svc_view(g, s) == 0 ? s : NULL;
    char key[OSUB_ID_MAX + 1];
    memcpy(key, id, n);
    key[n] = '\0';
    if (osubd__gw_route_of(g, key) == NULL)
        return NULL;
    s = osubd__gw_svc_of(g, key);
    return s != NULL && osubd__gw_svc_view(g, s) == 0 ? s : NULL;
}

/* Whether r's body (up to GW_PREREAD of it) is in the client's buffer. */
bool osubd__gw_body_arrived(struct gw_client *c, struct gw_req *r)
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

void osubd__gw_handle(struct gw_client *c, struct gw_req *r)
{
    struct osubd_gateway *g = c->g;
    struct osubd_gateway *d = g;
    /* the gateway's own health: /-/healthz (no service id starts with '-'), and /healthz
     * while no service is named so; 503 while it drains, so load balancers move on */
    if ((r->ulen == 10 && memcmp(r->uri, "/-/healthz", 10) == 0) ||
        (r->ulen == 8 && memcmp(r->uri, "/healthz", 8) == 0 &&
         osubd__gw_route_of(d, "healthz") == NULL)) {
        if (g->draining) {
            osubd__gw_reply(
                r, 503, "Service Unavailable", "draining", "draining",
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
        osubd__gw_access_log(r, 200, "healthz");
        osubd__gw_req_detach(r);
        osubd__gw_cl_send(c, ok, (size_t)n);
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
        osubd__gw_reply(r, 404, "Not Found", "unknown_service", "no_route",
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
            osubd__gw_reply(r, 400, "Bad Request", "invalid_priority", "priority",
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
            osubd__gw_reply(r, 400, "Bad Request", "invalid_deadline", "deadline",
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
        osubd__gw_reply(
            r, 429, "Too Many Requests", "overloaded", "shed",
            "the service's GPUs are above their high watermark: lower-priority requests are "
            "turned away first",
            osubd__gw_retry_after(s));
        return;
    }
    r->by_host = by_host;
    r->prio = prio;
    r->deadline_ms = deadline;
    if (!osubd__gw_body_arrived(c, r)) {
        /* no slot and no queue place until the body is here: cl_process_inner admits it */
        r->awaiting_body = true;
        if (h1_find(&r->hd, "Expect") != NULL && evbuffer_get_length(c->in) == 0) {
            osubd__gw_cl_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25); /* the body, please */
            r->continued = true;
        }
        osubd__gw_cl_arm(c, PREREAD_TIMEOUT_S);
        return;
    }
    osubd__gw_admit(g, r);
}

/* A request whose body has arrived: a slot at once, a place in the queue, or a refusal. */
void osubd__gw_admit(struct osubd_gateway *g, struct gw_req *r)
{
    struct osubd_gateway *d = g;
    struct gw_svc *s = r->svc;
    int32_t prio = r->prio;
    long deadline = r->deadline_ms;
    r->t0 = now_s();
    s->last_req = r->t0;
    if (!s->v_serving && osubd__gw_wake(g, s, r))
        return; /* suspended: answered 503 */
    if (s->v_serving && s->inflight < osubd__gw_eff_lim(s) && s->queue == NULL &&
        osubd__gw_stream_ok(s, r)) {
        osubd__gw_dispatch(g, r);
        return;
    }
    if (s->n_queued >= s->v_maxq || deadline == 0) {
        if (!s->v_serving) {
            s->rej_unavailable++;
            osubd__gw_reply(r, 503, "Service Unavailable", "unavailable", "not_running",
                            "the service is not running yet and its queue is full",
                            osubd__gw_retry_after(s));
        } else {
            s->rej_full++;
            osubd__gw_reply(r, 429, "Too Many Requests", "overloaded", "queue_full",
                            "the service is at its concurrency limit and its queue is full",
                            osubd__gw_retry_after(s));
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
    d->n_queued++;
    r->timer = evtimer_new(d->base, osubd__gw_on_deadline, r);
    struct timeval tv;
    evtimer_add(r->timer, osubd__gw_tv(d, deadline, &tv));
    /* queued behind requests that wait for their streaming share: it may go before them */
    if (s->v_serving && s->inflight < osubd__gw_eff_lim(s))
        osubd__gw_kick(s);
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
    /* two descriptors a stream (its client, its backend): the soft limit up to the hard one
     * (the API does so too when it starts first; the gateway may be made without it) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    g->scratch = evbuffer_new();
    if (d->cfg->gateway_access_log[0] != '\0') {
        g->access = fopen(d->cfg->gateway_access_log, "ae");
        if (g->access == NULL) {
            snprintf(err, errlen, "gateway_access_log %s: %s", d->cfg->gateway_access_log,
                     strerror(errno));
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
        return -1;
    }
    /* thousands of streams connect at once (an SDK's retry storm, a load balancer's failover):
     * the kernel caps the backlog at net.core.somaxconn */
    /* and an HTTP client speaks first: the kernel wakes us for a connection once its request's
     * first bytes are in (TCP_DEFER_ACCEPT), so a burst of new connections is read as it is
     * accepted, with no turn of the loop between; one that sends nothing is handed over after
     * the kernel's second (gateway_defer_accept: false accepts each at once) */
    unsigned flags = LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC;
    if (!d->cfg->gateway_accept_at_once)
        flags |= LEV_OPT_DEFERRED_ACCEPT;
    g->lis = evconnlistener_new_bind(d->base, osubd__gw_on_accept, g, flags, GW_BACKLOG,
                                     ai->ai_addr, (int)ai->ai_addrlen);
    freeaddrinfo(ai);
    if (g->lis == NULL) {
        snprintf(err, errlen, "--gateway %s:%d: cannot listen there (%s)", d->cfg->gateway_host,
                 d->cfg->gateway_port, strerror(errno));
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
    g->kick = event_new(d->base, -1, 0, osubd__gw_on_kick, g);
    g->maint = event_new(d->base, -1, EV_PERSIST, osubd__gw_on_maint, g);
    if (g->kick == NULL || g->maint == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    struct timeval tv = {1, 0};
    event_add(g->maint, &tv);
    printf("gateway on http://%s:%d\n", d->cfg->gateway_host, bport);
    fflush(stdout);
    return 0;
}

void osubd_gateway_free(struct osubd_gateway *g)
{
    if (g == NULL)
        return;
    if (g->kick)
        event_free(g->kick);
    if (g->maint)
        event_free(g->maint);
    if (g->lis != NULL) {
        osubd_listener_unguard(g->lis);
        evconnlistener_free(g->lis);
    }
    g->stopping = true;
    while (g->clients != NULL)
        osubd__gw_cl_close(g->clients);
    while (g->svcs != NULL) {
        struct gw_svc *s = g->svcs;
        g->svcs = s->next;
        while (s->queue != NULL) {
            struct gw_req *r = s->queue;
            osubd__gw_unqueue(s, r);
            if (r->cl != NULL)
                r->cl->cur = NULL;
            osubd__gw_req_free(r);
        }
        for (int b = 0; b < 16; b++)
            while (s->idle[b] != NULL) {
                struct gw_bconn *bc = s->idle[b];
                s->idle[b] = bc->next;
                osubd__gw_bc_close(bc);
            }
        osubd__gw_eng_drop(s);
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
            osubd__gw_cl_close(c); /* idle: nothing to finish */
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
                                osubd__gw_eff_lim(s) < s->v_lim ? osubd__gw_eff_lim(s) : 0);
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
        const struct osubd_route *rt = osubd__gw_route_of(g, s->id);
        for (int i = 0; rt != NULL && i < rt->n_backends; i++)
            evbuffer_add_printf(b, "oversub_gateway_backend_up{service=\"%s\",backend=\"%s\"} %d\n",
                                s->id, rt->backends[i], s->down_until[i] > t ? 0 : 1);
    }
}

static void gateway_metrics(void *ctx, struct evbuffer *b)
{
    osubd_gateway_metrics(ctx, b);
}

/* A command was applied: a service may now serve or run more at once (ready, a degrade ended,
 * a limit raised). Its queue is looked at once the command returned. */
static void gateway_events(void *ctx, const osub_event_t *ev, size_t n)
{
    (void)ev;
    (void)n;
    osubd__gw_kick_queued(ctx);
}

/* A service gone from the engine: its pooled connections go at once (the next owner of the id
 * must never reach the old backend through them); its state once nothing points at it. */
static void gateway_forget(void *ctx, const char *id)
{
    struct osubd_gateway *g = ctx;
    struct gw_svc *s = osubd__gw_svc_find(g, id, strlen(id));
    if (s != NULL)
        osubd__gw_svc_flush_idle(s, true);
}

struct osubd_module osubd_gateway_module(struct osubd_gateway *g)
{
    struct osubd_module m = {.name = "gateway",
                             .ctx = g,
                             .events = gateway_events,
                             .forget = gateway_forget,
                             .metrics = gateway_metrics};
    return m;
}
