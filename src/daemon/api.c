/* api.c - oversubd's control API: JSON over HTTP/1.1 under /v1, /healthz and /metrics; responses,
 * views, dispatch, listeners */
#define _GNU_SOURCE
#include "api_int.h"

/* ---- responses ------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void osubd__api_count(struct osubd_api *d, int code)
{
    int cls = code / 100;
    if (cls >= 1 && cls <= 5)
        d->http_requests[cls]++;
}

static void free_text(const void *data, size_t len, void *arg)
{
    (void)len;
    (void)arg;
    free((void *)data);
}

static const char oom_body[] =
    "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"oversubd ran out of memory making "
    "this answer: a change asked for may or may not have been made (read it back)\"}}\n";

/* body's text, with a newline, as one piece (jansson's callback dump adds a piece per token);
 * false when memory ran out */
static bool add_json(struct evbuffer *b, json_t *body)
{
    char *text = body ? osubd_json_dumps(body, JSON_COMPACT) : NULL;
    if (text == NULL)
        return false;
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (t2 == NULL) {
        free(text);
        return false;
    }
    t2[n] = '\n';
    t2[n + 1] = '\0';
    if (evbuffer_add_reference(b, t2, n + 1, free_text, NULL) != 0) {
        free(t2);
        return false;
    }
    return true;
}

/* Out of memory making an answer: a 503 that needs nothing more (after what is held). */
void osubd__api_reply_oom(struct osubd_api *d, struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    if (b != NULL && evbuffer_add(b, oom_body, sizeof(oom_body) - 1) == 0) {
        osubd__api_reply_buf(d, req, 503, b);
        return;
    }
    if (b != NULL)
        evbuffer_free(b);
    osubd__api_count(d, 503);
    evhttp_send_reply(req, 503, "Service Unavailable", NULL);
}

void osubd__api_reply_json(struct osubd_api *d, struct evhttp_request *req, int code, json_t *body)
{
    struct evbuffer *b = evbuffer_new();
    bool ok = b != NULL && add_json(b, body);
    json_decref(body);
    if (!ok) {
        if (b != NULL)
            evbuffer_free(b);
        osubd__api_reply_oom(d, req);
        return;
    }
    osubd__api_reply_buf(d, req, code, b);
}

/* Sends b (taking it), or holds it while a command is not yet durable. */
void osubd__api_reply_buf(struct osubd_api *d, struct evhttp_request *req, int code,
                          struct evbuffer *b)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    const char *phrase = code == 200   ? "OK"
                         : code == 201 ? "Created"
                         : code == 202 ? "Accepted"
                         : code == 400 ? "Bad Request"
                         : code == 401 ? "Unauthorized"
                         : code == 404 ? "Not Found"
                         : code == 405 ? "Method Not Allowed"
                         : code == 409 ? "Conflict"
                         : code == 413 ? "Payload Too Large"
                         : code == 422 ? "Unprocessable Entity"
                         : code == 503 ? "Service Unavailable"
                         : code == 507 ? "Insufficient Storage"
                                       : "Error";
    osubd__api_count(d, code);
    if (osubd_core_applied(d->core) > osubd_core_durable(d->core) && !osubd_core_full(d->core)) {
        /* a command is not on disk yet: nobody hears of it (or of what followed it) before */
        struct deferred *r = malloc(sizeof(*r));
        if (r != NULL) {
            *r = (struct deferred){NULL, req, code, phrase, b, osubd_core_applied(d->core)};
            if (d->deferred_tail != NULL)
                d->deferred_tail->next = r;
            else
                d->deferred_head = r;
            d->deferred_tail = r;
            return;
        }
        /* out of memory: a 503 is honest, the command may or may not become durable */
        evbuffer_drain(b, evbuffer_get_length(b));
        code = 503;
        phrase = "Service Unavailable";
    }
    evhttp_send_reply(req, code, phrase, b);
    evbuffer_free(b);
}

int osubd_bound_port(struct evhttp_bound_socket *h)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(evhttp_bound_socket_get_fd(h), (struct sockaddr *)&ss, &sl);
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void api_flush(struct osubd_api *d)
{
    while (d->deferred_head != NULL && d->deferred_head->ticket <= osubd_core_durable(d->core)) {
        struct deferred *r = d->deferred_head;
        d->deferred_head = r->next;
        if (d->deferred_head == NULL)
            d->deferred_tail = NULL;
        evhttp_send_reply(r->req, r->code, r->phrase, r->body);
        evbuffer_free(r->body);
        free(r);
    }
}

static void api_release_held(struct osubd_api *d)
{
    while (d->deferred_head != NULL) {
        struct deferred *r = d->deferred_head;
        d->deferred_head = r->next;
        if (d->deferred_head == NULL)
            d->deferred_tail = NULL;
        enum evhttp_cmd_type m = evhttp_request_get_command(r->req);
        bool mut = m == EVHTTP_REQ_POST || m == EVHTTP_REQ_PUT || m == EVHTTP_REQ_PATCH ||
                   m == EVHTTP_REQ_DELETE;
        if (mut && r->ticket > osubd_core_durable(d->core) && r->code < 400) {
            evbuffer_drain(r->body, evbuffer_get_length(r->body));
            evbuffer_add_printf(
                r->body, "{\"error\":{\"code\":\"not_durable\",\"message\":\"applied, but the "
                         "state's disk is full: this change is not on disk yet and is written "
                         "when space returns (a restart before then loses it)\"}}");
            evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", "5");
            r->code = 503;
            r->phrase = "Service Unavailable";
        }
        evhttp_send_reply(r->req, r->code, r->phrase, r->body);
        evbuffer_free(r->body);
        free(r);
    }
}

void osubd__api_reply_error(struct osubd_api *d, struct evhttp_request *req, int code,
                            const char *ecode, const char *msg)
{
    osubd__api_reply_json(d, req, code,
                          json_pack("{s:{s:s, s:s}}", "error", "code", ecode, "message", msg));
}

/* The HTTP status for an engine code. */
static int status_of(int rc)
{
    switch (rc) {
    case 0:
        return 200;
    case OSUB_EUNKNOWN_SERVICE:
    case OSUB_EBAD_GPU:
        return 404;
    case OSUB_ESPEC_CONFLICT:
    case OSUB_ENO_ROOM:
    case OSUB_EOVERCOMMITTED:
    case OSUB_ETOO_BIG:
    case OSUB_ETOO_MANY_GPUS:
    case OSUB_ENO_DIRECTIVE:
    case OSUB_EBAD_STATE:
    case OSUB_EGPU_LOST:
    case OSUB_EHOST_FULL: /* the host budget of suspended services: full now, maybe not later */
        return 409;
    case OSUB_ENOMEM:
    case OSUB_ETIME_BACKWARDS:
        return 500;
    default:
        return 422;
    }
}

void osubd__api_reply_rc(struct osubd_api *d, struct evhttp_request *req, int rc)
{
    osubd__api_reply_error(d, req, status_of(rc), osub_errcode(rc), osub_strerror(rc));
}

/* Reads the request body as a JSON object: 400 with the position, or 413. NULL when replied. */
json_t *osubd__api_read_body(struct osubd_api *d, struct evhttp_request *req, bool allow_empty)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    if (len > OSUBD_BODY_MAX) {
        osubd__api_reply_error(d, req, 413, "body_too_large", "the request body is over 64 KiB");
        return NULL;
    }
    if (len == 0 && allow_empty)
        return json_object();
    char *buf = malloc(len + 1);
    if (buf == NULL) {
        osubd__api_reply_error(d, req, 500, "out_of_memory", "out of memory");
        return NULL;
    }
    evbuffer_copyout(in, buf, len);
    buf[len] = '\0';
    json_error_t je;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (j == NULL) {
        char msg[300];
        snprintf(msg, sizeof(msg), "malformed JSON at line %d, column %d (byte %d): %s", je.line,
                 je.column, je.position, je.text);
        osubd__api_reply_error(d, req, 400, "malformed_json", msg);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        osubd__api_reply_error(d, req, 400, "malformed_json", "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* Refuses fields other than those listed; replies 400 naming the field. */
bool osubd__api_only_fields(struct osubd_api *d, struct evhttp_request *req, json_t *j,
                            const char *const *allowed)
{
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, key) == 0;
        if (!ok) {
            char msg[160];
            snprintf(msg, sizeof(msg), "unknown field '%.80s'", key);
            osubd__api_reply_error(d, req, 400, "unknown_field", msg);
            return false;
        }
    }
    return true;
}

/* ---- views ----------------------------------------------------------------------------- */

double osubd__api_frac(int64_t a, int64_t b)
{
    return b > 0 ? (double)a / (double)b : 0.0;
}

json_t *osubd__api_pool_json(struct osubd_api *d)
{
    osub_pool_info_t p;
    osub_engine_pool_info(d->e, &p);
    char ratio[16];
    osub_format_ratio(p.ratio_milli, ratio, sizeof(ratio));
    osub_pool_config_t pc;
    osub_engine_config(d->e, &pc);
    json_t *gpus = json_array();
    for (size_t i = 0; i < osub_engine_gpu_count(d->e); i++) {
        osub_gpu_info_t g;
        osub_engine_gpu_info(d->e, (int32_t)i, &g);
        char uuid[96];
        if ((int32_t)i < d->gpus->n)
            memcpy(uuid, d->gpus->uuid[i], sizeof(uuid));
        else
            snprintf(uuid, sizeof(uuid), "sim-%zu", i);
        uuid[sizeof(uuid) - 1] = '\0';
        json_array_append_new(
            gpus,
            json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:b}", "index", (int)i,
                      "name", g.name, "uuid", uuid, "vram_mib", (json_int_t)g.vram_mib,
                      "logical_mib", (json_int_t)g.logical_mib, "granted_mib",
                      (json_int_t)g.granted_mib, "held_mib", (json_int_t)g.held_mib, "used_mib",
                      (json_int_t)g.used_mib, "system_mib", (json_int_t)g.system_mib, "cordoned",
                      g.cordoned, "lost", g.lost));
        /* pressure starts above the high watermark of usable memory, relieves to the low */
        json_t *gj = json_array_get(gpus, json_array_size(gpus) - 1);
        int64_t usable = g.vram_mib - pc.margin_mib;
        json_object_set_new(gj, "high_watermark_mib",
                            json_integer(usable * pc.high_watermark_pct / 100));
        json_object_set_new(gj, "low_watermark_mib",
                            json_integer(usable * pc.low_watermark_pct / 100));
    }
    double held = osubd__api_frac(p.held_mib, p.vram_mib);
    json_t *o = json_pack(
        "{s:f, s:s, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I}, s:{s:f, s:f, s:f, s:f}, "
        "s:b, s:i, s:i, s:{s:i, s:i, s:I}}",
        "ratio", (double)p.ratio_milli / 1000.0, "ratio_text", ratio, "gpus", gpus, "totals",
        "vram_mib", (json_int_t)p.vram_mib, "logical_mib", (json_int_t)p.logical_mib, "granted_mib",
        (json_int_t)p.granted_mib, "held_mib", (json_int_t)p.held_mib, "used_mib",
        (json_int_t)p.used_mib, "system_mib", (json_int_t)p.system_mib, "utilization", "used",
        osubd__api_frac(p.used_mib, p.vram_mib), "held", held, "logical",
        osubd__api_frac(p.granted_mib, p.logical_mib), "physical", held, "overcommitted",
        p.overcommitted, "queued", p.n_queued, "pending", p.n_pending, "watermarks", "high_pct",
        pc.high_watermark_pct, "low_pct", pc.low_watermark_pct, "margin_mib",
        (json_int_t)pc.margin_mib);
    /* decisions so far (a suspend is not an eviction), and the host memory suspends fill */
    if (o != NULL) {
        json_object_set_new(o, "degrades", json_integer((json_int_t)p.degrades));
        json_object_set_new(o, "suspends", json_integer((json_int_t)p.suspends));
        json_object_set_new(o, "evictions", json_integer((json_int_t)p.evictions));
        json_object_set_new(o, "suspended",
                            json_pack("{s:i, s:I, s:I}", "services", p.n_suspended, "host_mib",
                                      (json_int_t)p.host_used_mib, "host_budget_mib",
                                      (json_int_t)p.host_budget_mib));
    }
    return o;
}

json_t *osubd__api_service_json(struct osubd_api *d, const struct osubd_caller *who, const char *id)
{
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0)
        return NULL;
    json_t *o = osub_spec_to_json(si.spec);
    json_object_set_new(o, "state", json_string(osub_state_name(si.state)));
    json_object_set_new(o, "grant_mib", json_integer(si.grant_mib));
    json_object_set_new(o, "held_mib", json_integer(si.held_mib));
    json_object_set_new(o, "used_mib", json_integer(si.used_mib));
    json_object_set_new(o, "batch", json_integer(si.batch_size));
    /* its own usage's prediction, and why it was placed where it is */
    json_object_set_new(o, "prediction",
                        json_pack("{s:I, s:I, s:I}", "peak_mib", (json_int_t)si.predicted_peak_mib,
                                  "charge_mib", (json_int_t)si.charge_mib, "reports",
                                  (json_int_t)si.usage_reports));
    if (si.place_limit_mib > 0)
        json_object_set_new(o, "placed_because",
                            json_pack("{s:I, s:I, s:I, s:b, s:s}", "projected_peak_mib",
                                      (json_int_t)si.place_projected_mib, "limit_mib",
                                      (json_int_t)si.place_limit_mib, "charge_per_gpu_mib",
                                      (json_int_t)si.place_charge_mib, "tightest_fit",
                                      si.place_projected_mib <= si.place_limit_mib, "of",
                                      si.n_slots > 1 ? "the fullest of its GPUs" : "its GPU"));
    json_t *pl = json_array();
    for (int32_t i = 0; i < si.n_slots; i++)
        json_array_append_new(pl, json_pack("{s:i, s:I, s:I, s:I}", "gpu", si.slots[i].gpu,
                                            "grant_mib", (json_int_t)si.slots[i].grant_mib,
                                            "held_mib", (json_int_t)si.slots[i].held_mib,
                                            "used_mib", (json_int_t)si.slots[i].used_mib));
    json_object_set_new(o, "placement", pl);
    pid_t pid = osubd_act_pid(d->act, id);
    if (pid > 0)
        json_object_set_new(o, "pid", json_integer(pid));
    const struct osubd_route *route = osubd_routes_get(d->routes, id);
    if (route != NULL) {
        json_t *rj = osubd_route_json(route);
        json_object_update(o, rj);
        json_decref(rj);
    }
    osubd_act_describe(d->act, who, id, o);
    json_object_set_new(o, "since_unix_ms",
                        json_integer(osubd_engine_to_unix(d->core, si.since_ms)));
    if (si.deadline_ms > 0)
        json_object_set_new(o, "deadline_unix_ms",
                            json_integer(osubd_engine_to_unix(d->core, si.deadline_ms)));
    if (si.queue_position > 0)
        json_object_set_new(o, "queue_position", json_integer(si.queue_position));
    if (si.n_waits > 0) {
        json_t *w = json_array();
        for (int32_t i = 0; i < si.n_waits; i++)
            json_array_append_new(
                w, json_pack("{s:s, s:s, s:I}", "service", si.waits[i].service, "action",
                             si.waits[i].evict     ? "evict"
                             : si.waits[i].suspend ? "suspend"
                                                   : "degrade",
                             "deadline_unix_ms",
                             (json_int_t)osubd_engine_to_unix(d->core, si.waits[i].deadline_ms)));
        json_object_set_new(o, "waiting_for", w);
    }
    if (si.checkpoint[0])
        json_object_set_new(o, "checkpoint", json_string(si.checkpoint));
    json_object_set_new(o, "degrades", json_integer(si.degrades));
    json_object_set_new(o, "evictions", json_integer(si.evictions));
    if (si.suspendable) {
        json_object_set_new(o, "suspends", json_integer(si.suspends));
        json_object_set_new(o, "suspend_held", json_boolean(si.suspend_hold));
        json_object_set_new(o, "suspend_idle", json_boolean(si.suspend_idle));
        json_object_set_new(o, "resume_cost_ms", json_integer(si.resume_cost_ms));
        json_object_set_new(o, "residual_mib", json_integer(si.residual_mib));
        if (si.host_mib > 0)
            json_object_set_new(o, "host_mib", json_integer(si.host_mib));
        if (si.relocated_from >= 0)
            json_object_set_new(o, "relocated_from", json_integer(si.relocated_from));
    }
    return o;
}

/* ---- dispatch -------------------------------------------------------------------------- */

static bool mutating(enum evhttp_cmd_type m)
{
    return m == EVHTTP_REQ_POST || m == EVHTTP_REQ_PUT || m == EVHTTP_REQ_PATCH ||
           m == EVHTTP_REQ_DELETE;
}

/* Compares a presented secret with the right one in time that does not depend on where they
 * differ. */
static bool same_secret(const char *given, const char *want)
{
    size_t n = strlen(want);
    if (strlen(given) != n)
        return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(given[i] ^ want[i]);
    return diff == 0;
}

static void on_request(struct evhttp_request *req, void *arg);

/* application/json, or a +json type, with or without parameters */
static bool json_media_type(const char *ct)
{
    if (ct == NULL)
        return false;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    size_t n = strcspn(ct, "; \t");
    if (n == 16 && strncasecmp(ct, "application/json", 16) == 0)
        return true;
    return n > 17 && strncasecmp(ct, "application/", 12) == 0 &&
           strncasecmp(ct + n - 5, "+json", 5) == 0;
}

/* A browser's request from another origin, or through a name that is not oversubd's (DNS
 * rebinding): over TCP, Host must name a listener (its address, localhost, or api_hostnames),
 * and Origin, when sent, must be http://<that Host>. Mutations carry JSON (a form or a
 * text/plain body, what a page may send without asking, is refused). 0, or the status sent. */
static int browser_guard(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m)
{
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    const char *host = evhttp_find_header(in, "Host");
    if (host != NULL && !osubd_self_host_ok(d->self, host, d->cfg->api_hostnames)) {
        osubd__api_reply_error(
            d, req, 403, "forbidden_host",
            "Host names neither an address oversubd listens on nor one of its "
            "api_hostnames (a page that rebinds a name to this address is refused)");
        return 403;
    }
    const char *origin = evhttp_find_header(in, "Origin");
    if (origin != NULL) {
        bool same = host != NULL && strncasecmp(origin, "http://", 7) == 0 &&
                    strcasecmp(origin + 7, host) == 0;
        if (!same) {
            osubd__api_reply_error(
                d, req, 403, "cross_origin",
                "a request from another origin (a web page) is refused: the API is "
                "for its own dashboard and for clients that send no Origin");
            return 403;
        }
    }
    if ((m == EVHTTP_REQ_POST || m == EVHTTP_REQ_PUT || m == EVHTTP_REQ_PATCH) &&
        !json_media_type(evhttp_find_header(in, "Content-Type"))) {
        osubd__api_reply_error(
            d, req, 415, "unsupported_media_type",
            "changes need Content-Type: application/json (a page's form or text/plain "
            "body is refused)");
        return 415;
    }
    return 0;
}

/* The Unix socket's requests: its mode (0600) already says who may connect. */
static void serve(struct osubd_api *d, struct evhttp_request *req, bool trusted);

static void on_request_unix(struct evhttp_request *req, void *arg)
{
    serve(arg, req, true);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    serve(arg, req, false);
}

/* Who asks: the Unix socket is trusted (its mode, 0600, already says who may connect); over
 * TCP, the admin token makes an admin (every request is one when no token is configured). */
static struct osubd_caller caller_of(const struct osubd_api *d, struct evhttp_request *req,
                                     bool trusted)
{
    /* command arguments and control URLs: the socket and the admin token see them; TCP
     * without the token (configured or not: any local user can reach loopback) does not */
    struct osubd_caller who = {.trusted = trusted, .admin = trusted};
    if (d->cfg->token[0] && !trusted) {
        const char *auth =
            evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
        char want[300];
        snprintf(want, sizeof(want), "Bearer %s", d->cfg->token);
        who.admin = auth != NULL && same_secret(auth, want);
    }
    return who;
}

static void serve(struct osubd_api *d, struct evhttp_request *req, bool trusted)
{
    double t0 = now_s();
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    if (bev != NULL)
        osubd_conns_served(trusted ? d->conns_unix : d->conns, (int)bufferevent_getfd(bev));
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    const char *query = uri ? evhttp_uri_get_query(uri) : NULL;
    if (path == NULL)
        path = "/";
    if (osubd_http_ambiguous_length(req)) {
        osubd__api_reply_error(
            d, req, 400, "bad_request",
            "two Content-Length headers, or Content-Length with Transfer-Encoding");
        goto done;
    }
    if (!trusted && browser_guard(d, req, m) != 0)
        goto done;
    struct osubd_caller caller = caller_of(d, req, trusted);
    const struct osubd_caller *who = &caller;
    if (d->cfg->token[0] && mutating(m)) {
        const char *auth =
            evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
        bool allowed = who->admin;
        /* a service's own calls may carry its token instead */
        const char *sid = strncmp(path, "/v1/services/", 13) == 0 ? path + 13 : NULL;
        const char *slash = sid ? strchr(sid, '/') : NULL;
        bool own = slash != NULL && slash - sid < 128 &&
                   (strcmp(slash, "/usage") == 0 || strcmp(slash, "/ready") == 0 ||
                    strcmp(slash, "/ack") == 0 || strcmp(slash, "/exited") == 0 ||
                    strcmp(slash, "/backends") == 0);
        if (!allowed && own && auth != NULL && strncmp(auth, "Bearer ", 7) == 0) {
            char id[129], tok[65];
            memcpy(id, sid, (size_t)(slash - sid));
            id[slash - sid] = '\0';
            osubd_service_token(d->core, id, tok);
            allowed = same_secret(auth + 7, tok);
        }
        if (!allowed) {
            osubd__api_reply_error(
                d, req, 401, "unauthorized",
                own ? "this request needs Authorization: Bearer <the service's token "
                      "(from its admission) or the admin token>"
                    : "this request needs Authorization: Bearer <the admin token>");
            goto done;
        }
    }
    if (osubd_core_full(d->core) && mutating(m)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "5");
        osubd__api_reply_error(
            d, req, 507, "insufficient_storage",
            "the state's disk is full: nothing was changed; retry when space returns "
            "(reads and the gateway go on)");
        goto done;
    }
    if ((strcmp(path, "/healthz") == 0 || strcmp(path, "/metrics") == 0) && m != EVHTTP_REQ_GET) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET");
        osubd__api_reply_error(d, req, 405, "method_not_allowed", "GET only");
    } else if (strcmp(path, "/healthz") == 0) {
        /* healthy means the engine's books balance (DESIGN.md's invariants) */
        char why[300];
        if (osub_engine_check(d->e, why, sizeof(why)) == 0) {
            json_t *h =
                json_pack("{s:s, s:s, s:s}", "status", "ok", "invariants", "ok", "state",
                          osubd_core_full(d->core) ? "disk full: changes refused (507)" : "ok");
            if (h != NULL && d->gpus != NULL && d->gpus->n > 0) {
                char nv[300] = "ok";
                if (d->gpus->unreadable_since_ms != 0)
                    snprintf(nv, sizeof(nv), "unreadable since %lld (Unix ms): %s",
                             (long long)d->gpus->unreadable_since_ms, d->gpus->unreadable_why);
                json_object_set_new(h, "nvml", json_string(nv));
            }
            osubd__api_reply_json(d, req, 200, h);
        } else
            osubd__api_reply_json(d, req, 500,
                                  json_pack("{s:s, s:s}", "status", "broken", "invariants", why));
    } else if (strcmp(path, "/metrics") == 0)
        osubd__api_h_metrics(d, req, query);
    else if (strcmp(path, "/") == 0 || strcmp(path, "/dashboard") == 0)
        osubd__api_h_static(d, req, m, osubd_dashboard_html, osubd_dashboard_html_len,
                            "text/html; charset=utf-8");
    else if (strcmp(path, "/v1/openapi.json") == 0)
        osubd__api_h_static(d, req, m, osubd_openapi_json, osubd_openapi_json_len,
                            "application/json");
    else if (strcmp(path, "/v1/pool") == 0)
        osubd__api_h_pool(d, req, m);
    else if (strcmp(path, "/v1/services") == 0)
        osubd__api_h_services(d, who, req, m, "", query);
    else if (strncmp(path, "/v1/services/", 13) == 0 && path[13] != '\0')
        osubd__api_h_services(d, who, req, m, path + 13, query);
    else if (strncmp(path, "/v1/gpus/", 9) == 0)
        osubd__api_h_gpu(d, req, m, path + 9);
    else if (strcmp(path, "/v1/events") == 0 && m == EVHTTP_REQ_GET)
        osubd__api_h_events(d, req, query);
    else
        osubd__api_reply_error(d, req, 404, "not_found", "no such endpoint");
done:;
    double dt = now_s() - t0;
    size_t i = 0;
    while (i < sizeof(lat_bounds) / sizeof(lat_bounds[0]) && dt > lat_bounds[i])
        i++;
    if (i < sizeof(lat_bounds) / sizeof(lat_bounds[0]))
        d->latency_buckets[i]++;
    d->latency_sum += dt;
    d->latency_count++;
}

/* Binds the Unix socket, reclaiming a stale one (a live daemon behind it is refused). */
static int bind_unix(struct osubd_api *d, char *err, size_t errlen)
{
    const char *path = d->cfg->socket_path;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "--socket %s: path too long", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen,
                 "%s exists and is not a socket: not removing it (choose another --socket)", path);
        return -1;
    }
    if (lstat(path, &st) == 0) {
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            close(probe);
            snprintf(err, errlen, "%s: another oversubd is listening there", path);
            return -1;
        }
        if (probe >= 0)
            close(probe);
        unlink(path); /* a stale socket left by a crashed run */
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    mode_t old = umask(0077);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (rc == 0)
        d->socket_bound = true;
    if (rc != 0 || listen(fd, 128) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    chmod(path, 0600);
    struct evhttp_bound_socket *b = evhttp_accept_socket_with_handle(d->http_unix, fd);
    if (b == NULL) {
        snprintf(err, errlen, "%s: cannot accept", path);
        close(fd);
        return -1;
    }
    osubd_conns_listen(d->conns_unix, b);
    return 0;
}

static struct evhttp *api_http(struct osubd_api *d, void (*cb)(struct evhttp_request *, void *))
{
    struct evhttp *h = evhttp_new(d->base);
    if (h == NULL)
        return NULL;
    evhttp_set_max_body_size(h, OSUBD_BODY_MAX);
    evhttp_set_max_headers_size(h, 16 * 1024);
    evhttp_set_timeout(h, 90); /* a long-poll waits up to 60 s */
    evhttp_set_allowed_methods(h, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                      EVHTTP_REQ_PATCH | EVHTTP_REQ_DELETE);
    evhttp_set_gencb(h, cb, d);
    return h;
}

static void api_durable(void *ctx, const struct osubd_progress *p)
{
    struct osubd_api *d = ctx;
    if (p->full) { /* the disk filled: what is held goes out now */
        api_release_held(d);
        return;
    }
    api_flush(d);
    if (p->events)
        osubd__api_events_ready(d);
}

struct osubd_module osubd_api_module(struct osubd_api *a)
{
    struct osubd_module m = {.name = "api", .ctx = a, .durable = api_durable};
    return m;
}

int osubd_api_port(const struct osubd_api *a)
{
    return a->port;
}

struct osubd_api *osubd_api_new(struct osubd_core *c, const struct osubd_api_deps *dep, char *err,
                                size_t errlen)
{
    struct osubd_api *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    d->core = c;
    d->cfg = osubd_core_config(c);
    d->base = osubd_core_base(c);
    d->e = osubd_core_engine(c);
    d->dep = *dep;
    d->act = dep->act;
    d->routes = dep->routes;
    d->gw = dep->gw;
    d->dp = dep->dp;
    d->gpus = dep->gpus;
    d->dest = dep->dest;
    d->self = dep->self;
    d->port = d->cfg->listen_port;
    return d;
}

void osubd_api_free(struct osubd_api *d)
{
    if (d == NULL)
        return;
    while (d->waiters != NULL)
        osubd__api_waiter_free(d, d->waiters);
    api_release_held(d);
    free(d->pool_text);
    if (d->http)
        evhttp_free(d->http);
    if (d->http_unix)
        evhttp_free(d->http_unix);
    osubd_conns_free(d->conns);
    osubd_conns_free(d->conns_unix);
    if (d->cfg->socket_path[0] && d->socket_bound) /* never another daemon's, never a file */
        unlink(d->cfg->socket_path);
    free(d);
}

int osubd_api_listen(struct osubd_api *d, char *err, size_t errlen)
{
    assert(d->http == NULL); /* api.h: listens once */
    d->http = api_http(d, on_request);
    d->http_unix = api_http(d, on_request_unix);
    if (d->http == NULL || d->http_unix == NULL) {
        snprintf(err, errlen, "cannot create the HTTP server");
        return -1;
    }
    /* TCP: a share per client address and a total; the Unix socket (trusted): a total of its
     * own, so that a flood over TCP never locks the administrator out */
    /* descriptors: the soft limit raised to the hard one, and the API's TCP connections kept
     * to half of what is left after a reserve, so that a flood of them never takes the ones
     * the Unix socket, the state and the gateway need */
    struct rlimit rl;
    int tcp_max = d->cfg->api_conns_max;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
            getrlimit(RLIMIT_NOFILE, &rl);
        }
        long long room = rl.rlim_cur == RLIM_INFINITY ? 1LL << 30 : (long long)rl.rlim_cur;
        long long cap = (room - 128) / 2;
        if (cap < 8)
            cap = 8;
        if (cap < tcp_max) {
            osubd_log(OSUBD_LOG_INFO,
                      "%lld file descriptors: the API takes at most %lld TCP "
                      "connections (api_conns_max %d; raise LimitNOFILE for more)",
                      room, cap, tcp_max);
            tcp_max = (int)cap;
        }
    }
    d->conns = osubd_conns_new(d->base, d->http, d->cfg->api_conns_per_client, tcp_max, "API");
    d->conns_unix = osubd_conns_new(d->base, d->http_unix, 0, 256, "Unix socket");
    if (d->conns == NULL || d->conns_unix == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    struct evhttp_bound_socket *h =
        evhttp_bind_socket_with_handle(d->http, d->cfg->listen_host, (uint16_t)d->port);
    if (h == NULL) {
        snprintf(err, errlen, "--listen %s:%d: cannot listen there (%s)", d->cfg->listen_host,
                 d->port, strerror(errno));
        return -1;
    }
    osubd_conns_listen(d->conns, h);
    osubd_self_add_fd(d->self, (int)evhttp_bound_socket_get_fd(h), "control API");
    int port = osubd_bound_port(h);
    d->port = port;
    if (d->cfg->socket_path[0] && bind_unix(d, err, errlen) != 0)
        return -1;
    printf("listening on http://%s:%d\n", d->cfg->listen_host, port);
    if (d->cfg->socket_path[0])
        printf("listening on unix:%s\n", d->cfg->socket_path);
    fflush(stdout);
    return 0;
}
