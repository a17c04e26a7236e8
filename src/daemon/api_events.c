/* api_events.c - the API's long-polled events, the embedded dashboard and OpenAPI description,
 * /metrics */
#define _GNU_SOURCE
#include "api_int.h"

/* ---- events (long-polled) -------------------------------------------------------------- */

struct ev_collect {
    json_t *arr;
    int64_t last;
};

static int collect_cb(void *arg, int64_t seq, const char *text)
{
    struct ev_collect *c = arg;
    json_t *j = json_loads(text, 0, NULL);
    if (j != NULL) {
        json_object_set_new(j, "seq", json_integer(seq));
        json_array_append_new(c->arr, j);
    }
    c->last = seq;
    return 0;
}

static void send_events(struct osubd_api *d, struct evhttp_request *req, int64_t since)
{
    struct ev_collect c = {json_array(), since};
    osubd_core_events(d->core, since, 1000, collect_cb, &c);
    osubd__api_reply_json(d, req, 200,
                          json_pack("{s:o, s:I}", "events", c.arr, "next", (json_int_t)c.last));
}

void osubd__api_waiter_free(struct osubd_api *d, struct waiter *w)
{
    for (struct waiter **p = &d->waiters; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    if (w->evcon != NULL)
        evhttp_connection_set_closecb(w->evcon, NULL, NULL);
    event_free(w->timer);
    osubd_client_unwatch(&w->watch);
    free(w);
}

/* evhttp freed the waiter's connection: nobody to answer */
static void waiter_closed(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    struct waiter *w = arg;
    w->evcon = NULL;
    osubd__api_waiter_free(w->d, w);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct waiter *w = arg;
    struct osubd_api *d = w->d;
    send_events(d, w->req, w->since);
    osubd__api_waiter_free(d, w);
}

void osubd__api_events_ready(struct osubd_api *d)
{
    while (d->waiters != NULL) {
        struct waiter *w = d->waiters;
        send_events(d, w->req, w->since);
        osubd__api_waiter_free(d, w);
    }
}

void osubd__api_h_events(struct osubd_api *d, struct evhttp_request *req, const char *query)
{
    struct evkeyvalq q;
    q.tqh_first = NULL;
    q.tqh_last = &q.tqh_first;
    evhttp_parse_query_str(query ? query : "", &q);
    const char *s = evhttp_find_header(&q, "since");
    const char *wt = evhttp_find_header(&q, "wait");
    char *end = NULL, *wend = NULL;
    errno = 0;
    int64_t since = s ? strtoll(s, &end, 10) : 0;
    bool bad = s != NULL && (errno != 0 || end == s || *end != '\0');
    errno = 0;
    long wait = wt ? strtol(wt, &wend, 10) : 0;
    bad = bad || (wt != NULL && (errno != 0 || wend == wt || *wend != '\0'));
    evhttp_clear_headers(&q);
    if (bad || since < 0 || wait < 0 || wait > 300) {
        osubd__api_reply_error(d, req, 400, "invalid_query",
                               "since >= 0, wait between 0 and 300 seconds");
        return;
    }
    if (wait == 0 || since < osubd_core_last_event(d->core)) {
        send_events(d, req, since);
        return;
    }
    struct waiter *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        send_events(d, req, since);
        return;
    }
    w->d = d;
    w->req = req;
    w->since = since;
    w->timer = evtimer_new(d->base, waiter_timeout, w);
    struct timeval tv = {(time_t)wait, 0};
    evtimer_add(w->timer, &tv);
    w->next = d->waiters;
    d->waiters = w;
    w->evcon = evhttp_request_get_connection(req);
    if (w->evcon != NULL)
        evhttp_connection_set_closecb(w->evcon, waiter_closed, w);
    osubd_client_watch(&w->watch, d->base, req, &d->waiters_gone);
}

/* ---- the dashboard and the OpenAPI description (src/daemon/web/, embedded) ------------- */

void osubd__api_h_static(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m,
                         const unsigned char *body, size_t len, const char *type)
{
    if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
        osubd__api_reply_error(d, req, 405, "method_not_allowed", "GET only");
        return;
    }
    struct evbuffer *b = evbuffer_new();
    if (b == NULL || evbuffer_add_reference(b, body, len, NULL, NULL) != 0) {
        if (b != NULL)
            evbuffer_free(b);
        osubd__api_reply_oom(d, req);
        return;
    }
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
    if (strncmp(type, "text/html", 9) == 0) {
        /* the page talks to this API only, and is framed by nobody */
        evhttp_add_header(h, "Content-Security-Policy",
                          "default-src 'self'; style-src 'self' 'unsafe-inline'; script-src "
                          "'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'");
        evhttp_add_header(h, "X-Frame-Options", "DENY");
    }
    osubd__api_count(d, 200);
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

/* ---- metrics --------------------------------------------------------------------------- */

#ifndef OSUB_VERSION
#define OSUB_VERSION "0.1.0"
#endif

/* oversub_build_info and the process_* series every Prometheus client library exports */
static void process_metrics(struct osubd_api *d, struct evbuffer *b)
{
    evbuffer_add_printf(b,
                        "# HELP oversub_build_info The running oversubd: its version and the "
                        "libraries it runs on.\n# TYPE oversub_build_info gauge\n"
                        "oversub_build_info{version=\"%s\",sqlite=\"%s\",libevent=\"%s\","
                        "jansson=\"%s\"} 1\n",
                        OSUB_VERSION, sqlite3_libversion(), event_get_version(), JANSSON_VERSION);
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
    if (fd >= 0)
        close(fd);
    long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    char *rp = n > 0 ? (buf[n] = '\0', strrchr(buf, ')')) : NULL;
    unsigned long long ut = 0, st = 0, start = 0, vsize = 0;
    long long rss = 0;
    /* after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
     * utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss */
    if (rp != NULL && tck > 0 &&
        sscanf(rp + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d "
               "%*d %llu %llu %lld",
               &ut, &st, &start, &vsize, &rss) == 5) {
        double boot = 0;
        FILE *f = fopen("/proc/stat", "re");
        char line[256];
        while (f != NULL && fgets(line, sizeof(line), f) != NULL)
            if (strncmp(line, "btime ", 6) == 0)
                boot = strtod(line + 6, NULL);
        if (f != NULL)
            fclose(f);
        evbuffer_add_printf(
            b,
            "# HELP process_cpu_seconds_total User and system CPU time spent in seconds.\n"
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
            "# HELP process_start_time_seconds Start time of the process since unix epoch in "
            "seconds.\n# TYPE process_start_time_seconds gauge\n"
            "process_start_time_seconds %.2f\n"
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
            "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n"
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %lld\n",
            (double)(ut + st) / (double)tck, boot + (double)start / (double)tck, vsize,
            rss * (long long)page);
    }
    int open_fds = 0;
    DIR *dir = opendir("/proc/self/fd");
    for (struct dirent *e; dir != NULL && (e = readdir(dir)) != NULL;)
        open_fds += e->d_name[0] != '.';
    if (dir != NULL) {
        closedir(dir);
        open_fds--; /* the one reading the folder */
    }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    evbuffer_add_printf(b,
                        "# HELP process_open_fds Number of open file descriptors.\n"
                        "# TYPE process_open_fds gauge\nprocess_open_fds %d\n"
                        "# HELP process_max_fds Maximum number of open file descriptors.\n"
                        "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
                        open_fds, (unsigned long long)rl.rlim_cur);
    (void)d;
}

/* The opt-in series, one per service (?per_service=1 or metrics_per_service: true). */
static void per_service_metrics(struct osubd_api *d, struct evbuffer *b)
{
    /* opt-in (?per_service=1 or metrics_per_service: true): one series per service */
    static const char *const what[] = {"grant", "held", "used"};
    for (int w = 0; w < 3; w++) {
        evbuffer_add_printf(b,
                            "# HELP oversub_service_%s_bytes %s VRAM of a service, in bytes "
                            "(opt-in).\n"
                            "# TYPE oversub_service_%s_bytes gauge\n",
                            what[w], what[w], what[w]);
        for (size_t i = 0; i < osub_engine_service_count(d->e); i++) {
            const char *id = osub_engine_service_id(d->e, i);
            osub_service_info_t si;
            osub_engine_service_info(d->e, id, &si);
            int64_t v = w == 0 ? si.grant_mib : w == 1 ? si.held_mib : si.used_mib;
            evbuffer_add_printf(b, "oversub_service_%s_bytes{service=\"%s\",class=\"%s\"} %lld\n",
                                what[w], id, si.spec->class_name, (long long)v * 1048576LL);
        }
    }
    evbuffer_add_printf(b, "# HELP oversub_service_suspends_total Times a service was "
                           "suspended (opt-in).\n# TYPE oversub_service_suspends_total counter\n");
    for (size_t i = 0; i < osub_engine_service_count(d->e); i++) {
        const char *id = osub_engine_service_id(d->e, i);
        osub_service_info_t si;
        osub_engine_service_info(d->e, id, &si);
        evbuffer_add_printf(b, "oversub_service_suspends_total{service=\"%s\",class=\"%s\"} %u\n",
                            id, si.spec->class_name, (unsigned)si.suspends);
    }
}

/* Suspend: counted apart from evictions; the host memory it fills, against its budget (the
 * per-service count is oversub_service_suspends_total, with the opt-in series). */
static void suspend_metrics(struct evbuffer *b, const osub_pool_info_t *p)
{
    evbuffer_add_printf(
        b,
        "# HELP oversub_suspends_total Suspends decided (a service's GPU memory to host memory; "
        "a suspend is not an eviction: one that fails or times out is escalated, and counted "
        "again, as an eviction).\n"
        "# TYPE oversub_suspends_total counter\noversub_suspends_total %llu\n"
        "# HELP oversub_suspended_host_bytes Host memory the suspended services' GPU memory "
        "fills.\n# TYPE oversub_suspended_host_bytes gauge\noversub_suspended_host_bytes %lld\n"
        "# HELP oversub_suspend_host_budget_bytes The pool's host budget for suspended services "
        "(0: suspend off).\n# TYPE oversub_suspend_host_budget_bytes gauge\n"
        "oversub_suspend_host_budget_bytes %lld\n",
        (unsigned long long)p->suspends, (long long)p->host_used_mib * 1048576LL,
        (long long)p->host_budget_mib * 1048576LL);
}

void osubd__api_h_metrics(struct osubd_api *d, struct evhttp_request *req, const char *query)
{
    bool per_service =
        d->cfg->metrics_per_service || (query != NULL && strstr(query, "per_service=1") != NULL);
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        osubd__api_reply_oom(d, req);
        return;
    }
    osub_pool_info_t p;
    osub_engine_pool_info(d->e, &p);
    /* sizes in bytes, fractions as _ratio: Prometheus' base units (docs/operations.md) */
    static const char *const fields[] = {"vram", "logical", "granted", "held", "used", "system"};
    static const char *const fhelp[] = {"Physical VRAM of a GPU",
                                        "Logical capacity of a GPU (VRAM x the oversell ratio)",
                                        "VRAM granted to services on a GPU",
                                        "VRAM held on a GPU (grants of running services)",
                                        "VRAM in use on a GPU, as reported",
                                        "VRAM used on a GPU by nothing oversub knows"};
    for (int f = 0; f < 6; f++) {
        evbuffer_add_printf(b,
                            "# HELP oversub_gpu_%s_bytes %s, in bytes.\n"
                            "# TYPE oversub_gpu_%s_bytes gauge\n",
                            fields[f], fhelp[f], fields[f]);
        for (size_t i = 0; i < osub_engine_gpu_count(d->e); i++) {
            osub_gpu_info_t g;
            osub_engine_gpu_info(d->e, (int32_t)i, &g);
            int64_t v = f == 0   ? g.vram_mib
                        : f == 1 ? g.logical_mib
                        : f == 2 ? g.granted_mib
                        : f == 3 ? g.held_mib
                        : f == 4 ? g.used_mib
                                 : g.system_mib;
            evbuffer_add_printf(b, "oversub_gpu_%s_bytes{gpu=\"%zu\"} %lld\n", fields[f], i,
                                (long long)v * 1048576LL);
        }
    }
    evbuffer_add_printf(b,
                        "# HELP oversub_pool_utilization_ratio Pool utilisation by kind: used and "
                        "held of physical VRAM, granted of logical capacity.\n"
                        "# TYPE oversub_pool_utilization_ratio gauge\n"
                        "oversub_pool_utilization_ratio{kind=\"used\"} %.6f\n"
                        "oversub_pool_utilization_ratio{kind=\"held\"} %.6f\n"
                        "oversub_pool_utilization_ratio{kind=\"logical\"} %.6f\n",
                        osubd__api_frac(p.used_mib, p.vram_mib),
                        osubd__api_frac(p.held_mib, p.vram_mib),
                        osubd__api_frac(p.granted_mib, p.logical_mib));
    evbuffer_add_printf(b,
                        "# HELP oversub_pool_ratio The oversell ratio.\n"
                        "# TYPE oversub_pool_ratio gauge\noversub_pool_ratio %.3f\n",
                        (double)p.ratio_milli / 1000.0);
    evbuffer_add_printf(b,
                        "# HELP oversub_queue_length Services waiting in the queue.\n"
                        "# TYPE oversub_queue_length gauge\noversub_queue_length %d\n",
                        p.n_queued);
    suspend_metrics(b, &p);
    /* services by class and state */
    size_t nc;
    const osub_class_t *cls = osub_engine_classes(d->e, &nc);
    evbuffer_add_printf(b, "# HELP oversub_services Services by class and state.\n"
                           "# TYPE oversub_services gauge\n");
    /* one pass over the services (a scrape of 10,000 stays cheap) */
    enum { MAXC = 16, NST = (int)OSUB_STATE__COUNT };
    int counts[MAXC][NST];
    memset(counts, 0, sizeof(counts));
    for (size_t i = 0; i < osub_engine_service_count(d->e); i++) {
        osub_service_info_t si;
        osub_engine_service_info(d->e, osub_engine_service_id(d->e, i), &si);
        for (size_t c = 0; c < nc && c < MAXC; c++)
            if (strcmp(si.spec->class_name, cls[c].name) == 0 && (int)si.state < NST)
                counts[c][si.state]++;
    }
    for (size_t c = 0; c < nc && c < MAXC; c++)
        for (int st = 0; st < NST; st++)
            evbuffer_add_printf(b, "oversub_services{class=\"%s\",state=\"%s\"} %d\n", cls[c].name,
                                osub_state_name((osub_state_t)st), counts[c][st]);
    if (per_service)
        per_service_metrics(d, b);
    evbuffer_add_printf(b, "# HELP oversub_http_requests_total API requests by status class.\n"
                           "# TYPE oversub_http_requests_total counter\n");
    for (int c = 1; c <= 5; c++)
        evbuffer_add_printf(b, "oversub_http_requests_total{code=\"%dxx\"} %llu\n", c,
                            (unsigned long long)d->http_requests[c]);
    evbuffer_add_printf(
        b,
        "# HELP oversub_api_connections Open connections to the API.\n"
        "# TYPE oversub_api_connections gauge\n"
        "oversub_api_connections{listener=\"tcp\"} %d\n"
        "oversub_api_connections{listener=\"unix\"} %d\n"
        "# HELP oversub_api_connections_refused_total Connections turned away: over a cap, or "
        "while out of file descriptors.\n"
        "# TYPE oversub_api_connections_refused_total counter\n"
        "oversub_api_connections_refused_total{listener=\"tcp\"} %llu\n"
        "oversub_api_connections_refused_total{listener=\"unix\"} %llu\n"
        "# HELP oversub_api_waiters_gone_total Long-polls whose client left before the answer.\n"
        "# TYPE oversub_api_waiters_gone_total counter\n"
        "oversub_api_waiters_gone_total %llu\n",
        osubd_conns_open(d->conns), osubd_conns_open(d->conns_unix),
        (unsigned long long)osubd_conns_refused(d->conns),
        (unsigned long long)osubd_conns_refused(d->conns_unix),
        (unsigned long long)(d->waiters_gone + osubd_act_waiters_gone(d->act)));
    osubd_core_metrics(d->core, b); /* the core's series, then every module's */
    process_metrics(d, b);
    evbuffer_add_printf(b, "# HELP oversub_http_request_seconds API request latency.\n"
                           "# TYPE oversub_http_request_seconds histogram\n");
    uint64_t cum = 0;
    for (size_t i = 0; i < sizeof(lat_bounds) / sizeof(lat_bounds[0]); i++) {
        cum += d->latency_buckets[i];
        evbuffer_add_printf(b, "oversub_http_request_seconds_bucket{le=\"%g\"} %llu\n",
                            lat_bounds[i], (unsigned long long)cum);
    }
    evbuffer_add_printf(b,
                        "oversub_http_request_seconds_bucket{le=\"+Inf\"} %llu\n"
                        "oversub_http_request_seconds_sum %.6f\n"
                        "oversub_http_request_seconds_count %llu\n",
                        (unsigned long long)d->latency_count, d->latency_sum,
                        (unsigned long long)d->latency_count);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
    osubd__api_count(d, 200);
}
