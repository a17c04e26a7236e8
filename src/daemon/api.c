/* api.c - oversubd's control API: JSON over HTTP/1.1 under /v1, /healthz and /metrics */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <sqlite3.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <sys/queue.h>
#include <event2/listener.h>

#include "conns.h"
#include "log.h"
#include "api.h"
#include "jsonmem.h"
#include "deviceplugin.h"
#include "netpolicy.h"
#include "actuator.h"
#include "pods.h"
#include "gateway.h"
#include "oversub/units.h"
#include "spec_json.h"

struct osubd_api {
    struct osubd_core *core;
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    struct osubd_api_deps dep;   /* the modules it shows and changes */
    struct osubd_act *act;       /* = dep.act, ... (short names) */
    struct osubd_routes *routes;
    struct osubd_gateway *gw;
    struct osubd_dp *dp;
    const struct osubd_gpus *gpus;
    const struct osubd_destinations *dest;
    struct osubd_self *self;
    struct evhttp *http;      /* TCP */
    struct evhttp *http_unix; /* the Unix socket: trusted to run programs */
    struct osubd_conns *conns, *conns_unix; /* connection caps (conns.h) */
    int port;                               /* the TCP port bound */
    bool socket_bound; /* the Unix socket is ours to remove at exit */
    struct waiter *waiters; /* long-polling GET /v1/events */
    /* replies sent while applied > durable wait here until the commit that covers them */
    struct deferred *deferred_head, *deferred_tail;
    char *pool_text; /* GET /v1/pool's body at pool_text_version */
    size_t pool_text_len;
    uint64_t pool_text_version;
    uint64_t waiters_gone; /* long-polls whose client left before the answer */
    /* metrics */
    uint64_t http_requests[6]; /* by status class 1xx..5xx, index 0 unused */
    uint64_t latency_buckets[12];
    double latency_sum;
    uint64_t latency_count;
};

struct deferred {
    struct deferred *next;
    struct evhttp_request *req;
    int code;
    const char *phrase;
    struct evbuffer *body;
    uint64_t ticket;
};

struct waiter {
    struct waiter *next;
    struct evhttp_request *req;
    struct event *timer;
    struct osubd_client_watch watch; /* freed at once when the client leaves */
    struct evhttp_connection *evcon;
    struct osubd_api *d;
    int64_t since;
};

/* ---- responses ------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void count(struct osubd_api *d, int code)
{
    int cls = code / 100;
    if (cls >= 1 && cls <= 5)
        d->http_requests[cls]++;
}

static void reply_buf(struct osubd_api *d, struct evhttp_request *req, int code, struct evbuffer *b);

static void free_text(const void *data, size_t len, void *arg)
{
    (void)len;
    (void)arg;
    free((void *)data);
}

static const char oom_body[] =
    "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"oversubd ran out of memory making "
    "this answer: a change asked for may or may not have been made (read it back)\"}}\n";

static void reply_buf(struct osubd_api *d, struct evhttp_request *req, int code, struct evbuffer *b);

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
static void reply_oom(struct osubd_api *d, struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    if (b != NULL && evbuffer_add(b, oom_body, sizeof(oom_body) - 1) == 0) {
        reply_buf(d, req, 503, b);
        return;
    }
    if (b != NULL)
        evbuffer_free(b);
    count(d, 503);
    evhttp_send_reply(req, 503, "Service Unavailable", NULL);
}

static void reply_json(struct osubd_api *d, struct evhttp_request *req, int code, json_t *body)
{
    struct evbuffer *b = evbuffer_new();
    bool ok = b != NULL && add_json(b, body);
    json_decref(body);
    if (!ok) {
        if (b != NULL)
            evbuffer_free(b);
        reply_oom(d, req);
        return;
    }
    reply_buf(d, req, code, b);
}

/* Sends b (taking it), or holds it while a command is not yet durable. */
static void reply_buf(struct osubd_api *d, struct evhttp_request *req, int code, struct evbuffer *b)
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
    count(d, code);
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

static void reply_error(struct osubd_api *d, struct evhttp_request *req, int code, const char *ecode,
                        const char *msg)
{
    reply_json(d, req, code, json_pack("{s:{s:s, s:s}}", "error", "code", ecode, "message", msg));
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
        return 409;
    case OSUB_ENOMEM:
    case OSUB_ETIME_BACKWARDS:
        return 500;
    default:
        return 422;
    }
}

static void reply_rc(struct osubd_api *d, struct evhttp_request *req, int rc)
{
    reply_error(d, req, status_of(rc), osub_errcode(rc), osub_strerror(rc));
}

/* Reads the request body as a JSON object: 400 with the position, or 413. NULL when replied. */
static json_t *read_body(struct osubd_api *d, struct evhttp_request *req, bool allow_empty)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    if (len > OSUBD_BODY_MAX) {
        reply_error(d, req, 413, "body_too_large", "the request body is over 64 KiB");
        return NULL;
    }
    if (len == 0 && allow_empty)
        return json_object();
    char *buf = malloc(len + 1);
    if (buf == NULL) {
        reply_error(d, req, 500, "out_of_memory", "out of memory");
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
        reply_error(d, req, 400, "malformed_json", msg);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        reply_error(d, req, 400, "malformed_json", "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* Refuses fields other than those listed; replies 400 naming the field. */
static bool only_fields(struct osubd_api *d, struct evhttp_request *req, json_t *j,
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
            reply_error(d, req, 400, "unknown_field", msg);
            return false;
        }
    }
    return true;
}

/* ---- views ----------------------------------------------------------------------------- */

static double frac(int64_t a, int64_t b)
{
    return b > 0 ? (double)a / (double)b : 0.0;
}

static json_t *pool_json(struct osubd_api *d)
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
    double held = frac(p.held_mib, p.vram_mib);
    return json_pack(
        "{s:f, s:s, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I}, s:{s:f, s:f, s:f, s:f}, "
        "s:b, s:i, s:i, s:{s:i, s:i, s:I}}",
        "ratio", (double)p.ratio_milli / 1000.0, "ratio_text", ratio, "gpus", gpus, "totals",
        "vram_mib", (json_int_t)p.vram_mib, "logical_mib", (json_int_t)p.logical_mib, "granted_mib",
        (json_int_t)p.granted_mib, "held_mib", (json_int_t)p.held_mib, "used_mib",
        (json_int_t)p.used_mib, "system_mib", (json_int_t)p.system_mib, "utilization", "used",
        frac(p.used_mib, p.vram_mib), "held", held, "logical", frac(p.granted_mib, p.logical_mib),
        "physical", held, "overcommitted", p.overcommitted, "queued", p.n_queued, "pending",
        p.n_pending, "watermarks", "high_pct", pc.high_watermark_pct, "low_pct",
        pc.low_watermark_pct, "margin_mib", (json_int_t)pc.margin_mib);
}

static json_t *service_json(struct osubd_api *d, const struct osubd_caller *who, const char *id)
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
    json_object_set_new(o, "since_unix_ms", json_integer(osubd_engine_to_unix(d->core, si.since_ms)));
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
                             si.waits[i].evict ? "evict" : "degrade", "deadline_unix_ms",
                             (json_int_t)osubd_engine_to_unix(d->core, si.waits[i].deadline_ms)));
        json_object_set_new(o, "waiting_for", w);
    }
    if (si.checkpoint[0])
        json_object_set_new(o, "checkpoint", json_string(si.checkpoint));
    json_object_set_new(o, "degrades", json_integer(si.degrades));
    json_object_set_new(o, "evictions", json_integer(si.evictions));
    return o;
}

/* ---- handlers ------------------------------------------------------------------------ */

static void h_pool(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m)
{
    if (m == EVHTTP_REQ_GET) {
        /* the pool changes only by commands: its text is kept until the next one */
        if (d->pool_text == NULL || d->pool_text_version != osubd_core_version(d->core)) {
            free(d->pool_text);
            json_t *p = pool_json(d);
            d->pool_text = p ? osubd_json_dumps(p, JSON_COMPACT) : NULL;
            json_decref(p);
            d->pool_text_len = d->pool_text ? strlen(d->pool_text) : 0;
            d->pool_text_version = osubd_core_version(d->core);
        }
        struct evbuffer *b = d->pool_text ? evbuffer_new() : NULL;
        if (b == NULL || evbuffer_add(b, d->pool_text, d->pool_text_len) != 0 ||
            evbuffer_add(b, "\n", 1) != 0) {
            if (b != NULL)
                evbuffer_free(b);
            if (d->pool_text == NULL)
                d->pool_text_version = osubd_core_version(d->core) - 1; /* not kept: made again next time */
            reply_oom(d, req);
            return;
        }
        reply_buf(d, req, 200, b);
        return;
    }
    if (m != EVHTTP_REQ_PUT) {
        reply_error(d, req, 405, "method_not_allowed", "GET or PUT /v1/pool");
        return;
    }
    json_t *j = read_body(d, req, false);
    if (j == NULL)
        return;
    static const char *const allowed[] = {"ratio", NULL};
    if (!only_fields(d, req, j, allowed)) {
        json_decref(j);
        return;
    }
    json_t *r = json_object_get(j, "ratio");
    char text[64];
    if (json_is_string(r) && json_string_length(r) >= sizeof(text)) {
        json_decref(j);
        reply_error(d, req, 422, "invalid_ratio", "field 'ratio' is too long to be a ratio");
        return;
    } else if (json_is_string(r))
        snprintf(text, sizeof(text), "%s", json_string_value(r));
    else if (json_is_number(r))
        snprintf(text, sizeof(text), "%.9f", json_number_value(r));
    else {
        json_decref(j);
        reply_error(d, req, 422, "invalid_ratio",
                    "field 'ratio' is required: a number or a string");
        return;
    }
    /* a JSON number carries binary noise: trim the zeros %.9f adds */
    size_t tl = strlen(text);
    while (strchr(text, '.') && tl > 0 && text[tl - 1] == '0')
        text[--tl] = '\0';
    int32_t milli;
    int rc = osub_parse_ratio(text, &milli);
    json_decref(j);
    if (rc != 0) {
        reply_error(d, req, 422, osub_errcode(rc), osub_strerror(rc));
        return;
    }
    json_t *cmd = json_pack("{s:s, s:i}", "op", "ratio", "ratio_milli", milli);
    char err[256];
    rc = osubd_apply(d->core, cmd, NULL, err, sizeof(err));
    json_decref(cmd);
    if (rc != 0) {
        reply_rc(d, req, rc);
        return;
    }
    reply_json(d, req, 200, pool_json(d));
}

/* What a submit staged for the modules: kept when the engine accepts the service, saved with
 * the command; dropped otherwise. */
struct submit_stage {
    struct osubd_api *d;
    const char *id;
    struct osubd_route *route; /* taken when kept */
    json_t *exec;
    bool route_conflict; /* a retry with other gateway settings or another way to run */
    bool stored;
    bool dry;
};

static void submit_commit(void *arg, int rc, const osub_submit_result_t *r)
{
    struct submit_stage *st = arg;
    struct osubd_api *d = st->d;
    if (rc == 0 && r->outcome == OSUB_SUBMIT_EXISTS) {
        /* a retry of a live service: the same spec, the same gateway settings (PUT
         * .../backends changes backends) and the same way to run it (or none given) */
        st->route_conflict = !osubd_route_equal(st->route, osubd_routes_get(d->routes, st->id)) ||
                             (st->exec != NULL && !osubd_act_exec_equal(d->act, st->id, st->exec));
        return;
    }
    if (rc != 0 || st->dry ||
        (r->outcome != OSUB_SUBMIT_STARTED && r->outcome != OSUB_SUBMIT_PENDING &&
         r->outcome != OSUB_SUBMIT_QUEUED))
        return;
    st->stored = osubd_routes_set(d->routes, st->id, st->route) == 0;
    st->route = NULL;
    if (st->exec != NULL)
        st->stored = osubd_act_commit_exec(d->act, st->id, st->exec) == 0 && st->stored;
    if (!st->stored)
        osubd_fatal(d->core, "out of memory keeping a service's gateway or run settings");
}

/* A route whose backend is oversubd's own API or gateway: the gateway never forwards there,
 * whatever allowed_destinations says (else a service's backends are a way around the token).
 * 0, or -1 with a sentence in err. */
static int route_not_self(struct osubd_api *d, const struct osubd_route *r, char *err, size_t errlen)
{
    const char *mw =
        r != NULL && r->metrics_url[0] ? osubd_self_url(d->self, r->metrics_url) : NULL;
    if (mw != NULL) {
        snprintf(err, errlen, "metrics_url %.200s is oversubd's own %s, not the engine's",
                 r->metrics_url, mw);
        return -1;
    }
    for (int32_t i = 0; r != NULL && i < r->n_backends; i++) {
        const char *w = osubd_self_url(d->self, r->backends[i]);
        if (w != NULL) {
            snprintf(err, errlen,
                     "backends[%d] %.200s is oversubd's own %s: the gateway never forwards to "
                     "oversubd",
                     (int)i, r->backends[i], w);
            return -1;
        }
    }
    return 0;
}

static void h_services_post(struct osubd_api *d, const struct osubd_caller *who, struct evhttp_request *req, bool dry)
{
    json_t *spec = read_body(d, req, false);
    if (spec == NULL)
        return;
    osub_spec_t sp;
    char err[300];
    /* what the gateway and the actuators keep of the service is staged here and kept only if
     * the engine accepts the submit: a refused submit changes nothing anywhere */
    struct osubd_route *route = NULL;
    if (osubd_route_take(spec, false, d->dest, &route, err, sizeof(err)) != 0 ||
        route_not_self(d, route, err, sizeof(err)) != 0) {
        json_decref(spec);
        free(route);
        reply_error(d, req, 422, "invalid_spec", err);
        return;
    }
    /* running a program is for the Unix socket, or for the admin token (with a token set,
     * every submit over TCP carries it) */
    json_t *exec = NULL;
    int trc =
        osubd_act_take(d->act, spec, who->trusted || d->cfg->token[0] != '\0',
                       osubd_dp_cut_mib(d->dp), &exec, err, sizeof(err));
    if (trc != 0) {
        json_decref(spec);
        free(route);
        bool forbidden = trc == OSUBD_ACT_FORBIDDEN;
        reply_error(d, req, forbidden ? 403 : 422, forbidden ? "forbidden" : "invalid_spec", err);
        return;
    }
    int src = osub_spec_from_json(spec, &sp, err, sizeof(err));
    if (src != 0) {
        json_decref(spec);
        free(route);
        json_decref(exec);
        reply_error(d, req, src == OSUB_SPEC_UNKNOWN_FIELD ? 400 : 422, "invalid_spec", err);
        return;
    }
    json_t *cmd = json_pack("{s:s, s:O, s:b}", "op", "submit", "spec", spec, "dry_run", dry);
    json_decref(spec);
    osub_submit_result_t r;
    memset(&r, 0, sizeof(r));
    struct submit_stage st = {.d = d, .id = sp.id, .route = route, .exec = exec, .dry = dry};
    int rc = cmd != NULL ? osubd_apply_with(d->core, cmd, &r, err, sizeof(err), submit_commit, &st)
                         : OSUB_ENOMEM;
    json_decref(cmd);
    if (dry && err[0] == '\0')
        submit_commit(&st, rc, &r); /* a dry run keeps nothing, but answers the same */
    free(st.route);
    json_decref(exec);
    if (st.route_conflict) {
        reply_error(d, req, 409, osub_errcode(OSUB_ESPEC_CONFLICT),
                    "a service with this id runs with other gateway settings or another "
                    "command; change its backends with PUT /v1/services/ID/backends, or release "
                    "it first");
        return;
    }
    if (err[0]) {
        reply_error(d, req, 422, "invalid_spec", err);
        return;
    }
    static const char *const outcomes[] = {"started", "pending", "queued", "exists", "rejected"};
    json_t *dec = json_pack("{s:s}", "outcome", outcomes[r.outcome]);
    if (r.outcome == OSUB_SUBMIT_REJECTED || r.outcome == OSUB_SUBMIT_QUEUED) {
        json_object_set_new(dec, "check", json_string(osub_check_name(r.check)));
        if (r.check_gpu >= 0)
            json_object_set_new(dec, "gpu", json_integer(r.check_gpu));
        /* the shortfall in the check's own unit */
        const char *unit = r.check == OSUB_CHECK_COMPUTE     ? "shortfall_pct"
                           : r.check == OSUB_CHECK_EXCLUSIVE ? "shortfall_services"
                           : r.check == OSUB_CHECK_GPUS      ? "shortfall_gpus"
                                                             : "shortfall_mib";
        json_object_set_new(dec, unit, json_integer(r.shortfall_mib));
    }
    if (r.n_victims > 0) {
        json_t *v = json_array();
        for (int32_t i = 0; i < r.n_victims; i++) {
            json_t *o = json_pack("{s:s, s:s, s:I}", "service", r.victims[i].service, "action",
                                  r.victims[i].evict ? "evict" : "degrade", "deadline_unix_ms",
                                  (json_int_t)osubd_engine_to_unix(d->core, r.victims[i].deadline_ms));
            /* who it is, for a scheduler ranking nodes by what they would disturb: its class,
             * its level, what a restart costs it, and the pod it is (if one) */
            osub_service_info_t vi;
            if (o != NULL && osub_engine_service_info(d->e, r.victims[i].service, &vi) == 0) {
                json_object_set_new(o, "class", json_string(vi.spec->class_name));
                json_object_set_new(o, "level", json_integer(vi.level));
                json_object_set_new(o, "restart_cost_ms", json_integer(vi.spec->restart_cost_ms));
                const char *uid =
                    json_string_value(json_object_get(osubd_act_kube(d->act, vi.spec->id), "uid"));
                if (uid != NULL)
                    json_object_set_new(o, "pod_uid", json_string(uid));
            }
            json_array_append_new(v, o);
        }
        json_object_set_new(dec, "victims", v);
    }
    if (r.queue_position > 0)
        json_object_set_new(dec, "queue_position", json_integer(r.queue_position));
    if (r.n_gpus > 0) { /* where it starts (or waits for its victims) */
        json_t *g = json_array();
        for (int32_t i = 0; i < r.n_gpus; i++)
            json_array_append_new(g, json_integer(r.gpus[i]));
        json_object_set_new(dec, "gpus", g);
        /* a dry run: how full its first GPU is now, for a scheduler scoring the placement */
        osub_gpu_info_t gi;
        if (dry && osub_engine_gpu_info(d->e, r.gpus[0], &gi) == 0)
            json_object_set_new(
                dec, "gpu_now",
                json_pack("{s:I, s:I, s:I, s:I}", "held_mib", (json_int_t)gi.held_mib,
                          "granted_mib", (json_int_t)gi.granted_mib, "usable_mib",
                          (json_int_t)gi.usable_mib, "logical_mib", (json_int_t)gi.logical_mib));
    }
    if (rc != 0 && r.outcome == OSUB_SUBMIT_REJECTED) {
        json_object_set_new(dec, "code", json_string(osub_errcode(rc)));
        json_object_set_new(dec, "message", json_string(osub_strerror(rc)));
        reply_json(d, req, 409,
                   json_pack("{s:{s:s, s:s}, s:o}", "error", "code", osub_errcode(rc), "message",
                             osub_strerror(rc), "decision", dec));
        return;
    }
    if (rc != 0) {
        json_decref(dec);
        reply_rc(d, req, rc);
        return;
    }
    json_t *body = dry ? json_object() : service_json(d, who, sp.id);
    if (body == NULL)
        body = json_object();
    json_object_set_new(body, "decision", dec);
    if (!dry) {
        /* for the service's own calls: usage, ready, ack, exited */
        char tok[65];
        osubd_service_token(d->core, sp.id, tok);
        json_object_set_new(body, "token", json_string(tok));
    }
    int code = r.outcome == OSUB_SUBMIT_STARTED ? 201 : r.outcome == OSUB_SUBMIT_EXISTS ? 200 : 202;
    if (dry)
        code = 200;
    reply_json(d, req, code, body);
}

/* A ready's PID: kept when the engine accepted the command (saved with it). */
struct pid_stage {
    struct osubd_api *d;
    const char *id;
    pid_t pid;
    bool stored;
};

static void pid_commit(void *arg, int rc, const osub_submit_result_t *r)
{
    (void)r;
    struct pid_stage *st = arg;
    struct osubd_api *d = st->d;
    if (rc == 0 && st->pid > 0 &&
        osub_engine_service_info(d->e, st->id, &(osub_service_info_t){0}) == 0 &&
        osubd_act_set_pid(d->act, st->id, st->pid) != 0) {
        st->stored = false;
        osubd_fatal(d->core, "out of memory keeping a service's PID");
    }
}

static void h_service_cmd(struct osubd_api *d, const struct osubd_caller *who, struct evhttp_request *req, const char *id,
                          const char *op)
{
    json_t *j = read_body(d, req, true);
    if (j == NULL)
        return;
    static const char *const f_usage[] = {"vram_mib", "gpus", "compute_pct", NULL};
    static const char *const f_ck[] = {"checkpoint", NULL};
    static const char *const f_none[] = {NULL};
    static const char *const f_resize[] = {"vram_mib", "min_vram_mib", "batch_size", NULL};
    static const char *const f_ready[] = {"pid", NULL};
    const char *const *allowed = strcmp(op, "usage") == 0     ? f_usage
                                 : strcmp(op, "resize") == 0  ? f_resize
                                 : strcmp(op, "ready") == 0   ? f_ready
                                 : strcmp(op, "release") == 0 ? f_none
                                                              : f_ck;
    if (!only_fields(d, req, j, allowed)) {
        json_decref(j);
        return;
    }
    /* ready may name the service's process: NVML's memory for that PID becomes its usage */
    json_t *pidv = json_object_get(j, "pid");
    pid_t pid = 0; /* staged: kept only when the engine accepts the command */
    if (pidv != NULL) {
        if (!json_is_integer(pidv) || json_integer_value(pidv) < 1 ||
            json_integer_value(pidv) > 4194304) {
            json_decref(j);
            reply_error(d, req, 422, "invalid_argument",
                        "\"pid\" must be a process id (1 to 4194304)");
            return;
        }
        pid = (pid_t)json_integer_value(pidv);
        json_object_del(j, "pid");
    }
    json_t *ck = json_object_get(j, "checkpoint");
    if (ck != NULL &&
        (!json_is_string(ck) || json_string_length(ck) == 0 || json_string_length(ck) > 1024 ||
         strlen(json_string_value(ck)) != json_string_length(ck))) {
        json_decref(j);
        reply_error(d, req, 422, "invalid_argument",
                    "\"checkpoint\" must be a non-empty string (a path or a name, at most 1024 "
                    "bytes, no NUL)");
        return;
    }
    /* the per-GPU form takes objects {gpu, vram_mib}: turn it into the command's list */
    json_t *gpus = json_object_get(j, "gpus");
    if (json_is_array(gpus) && strcmp(op, "usage") == 0) {
        size_t gi;
        json_t *g;
        json_array_foreach(gpus, gi, g)
        {
            if (!json_is_object(g) || !json_is_integer(json_object_get(g, "gpu")) ||
                !json_is_integer(json_object_get(g, "vram_mib")) || json_object_size(g) != 2) {
                json_decref(j);
                reply_error(d, req, 422, "invalid_usage",
                            "each item of \"gpus\" must be {\"gpu\": INDEX, \"vram_mib\": "
                            "MIB} with integers and nothing else");
                return;
            }
        }
        osub_service_info_t si;
        if (osub_engine_service_info(d->e, id, &si) != 0) {
            json_decref(j);
            reply_rc(d, req, OSUB_EUNKNOWN_SERVICE);
            return;
        }
        json_t *list = json_array();
        for (int32_t s = 0; s < si.n_slots; s++) {
            json_int_t v = -1;
            size_t i;
            json_t *it;
            json_array_foreach(gpus, i, it)
            {
                if (json_integer_value(json_object_get(it, "gpu")) == si.slots[s].gpu &&
                    json_is_integer(json_object_get(it, "vram_mib")))
                    v = json_integer_value(json_object_get(it, "vram_mib"));
            }
            if (v < 0) {
                json_decref(list);
                json_decref(j);
                reply_error(d, req, 422, "invalid_usage",
                            "\"gpus\" must give {\"gpu\", \"vram_mib\"} for each of the service's "
                            "GPUs");
                return;
            }
            json_array_append_new(list, json_integer(v));
        }
        json_object_set_new(j, "gpus", list);
    }
    json_object_set_new(j, "op", json_string(op));
    json_object_set_new(j, "id", json_string(id));
    char err[256];
    struct pid_stage st = {.d = d, .id = id, .pid = pid, .stored = true};
    int rc = osubd_apply_with(d->core, j, NULL, err, sizeof(err), pid_commit, &st);
    json_decref(j);
    if (!st.stored) {
        reply_error(d, req, 500, "out_of_memory", "out of memory keeping the service's PID");
        return;
    }
    if (err[0]) {
        reply_error(d, req, 422, "invalid_argument", err);
        return;
    }
    if (rc != 0) {
        reply_rc(d, req, rc);
        return;
    }
    json_t *body = service_json(d, who, id);
    if (body == NULL)
        body = json_pack("{s:s, s:s}", "id", id, "state", "released");
    reply_json(d, req, 200, body);
}

/* PUT /v1/services/{id}/backends {"backends": [...]}: a service (a managed one once it
 * listens) registers where the gateway reaches it; the route's other settings stay. */
static void h_backends(struct osubd_api *d, const struct osubd_caller *who, struct evhttp_request *req, const char *id)
{
    json_t *j = read_body(d, req, false);
    if (j == NULL)
        return;
    static const char *const allowed[] = {"backends", NULL};
    if (!only_fields(d, req, j, allowed)) {
        json_decref(j);
        return;
    }
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0) {
        json_decref(j);
        reply_rc(d, req, osub_id_valid(id) ? OSUB_EUNKNOWN_SERVICE : OSUB_EBAD_ID);
        return;
    }
    struct osubd_route *route = NULL;
    char err[300];
    if (json_object_get(j, "backends") == NULL) {
        json_decref(j);
        reply_error(d, req, 422, "invalid_backends", "field 'backends' is required");
        return;
    }
    if (osubd_route_take(j, true, d->dest, &route, err, sizeof(err)) != 0 ||
        route_not_self(d, route, err, sizeof(err)) != 0) {
        json_decref(j);
        free(route);
        reply_error(d, req, 422, "invalid_backends", err);
        return;
    }
    json_decref(j);
    int src = osubd_routes_set_backends(d->routes, id, route);
    json_t *list = json_array();
    for (int32_t i = 0; i < route->n_backends; i++)
        json_array_append_new(list, json_string(route->backends[i]));
    free(route);
    if (src != 0) {
        json_decref(list);
        reply_error(d, req, 500, "out_of_memory", "out of memory keeping the backends");
        return;
    }
    osubd_core_touch(d->core); /* the gateway's view of the service is stale */
    char *text = osubd_json_dumps(list, JSON_COMPACT);
    json_decref(list);
    osubd_note(d->core, id, "gateway", "backends", "%s registered its backends for the gateway: %s", id,
               text ? text : "?");
    free(text);
    json_t *body = service_json(d, who, id);
    reply_json(d, req, 200, body ? body : json_object());
}

static void h_services(struct osubd_api *d, const struct osubd_caller *who, struct evhttp_request *req, enum evhttp_cmd_type m,
                       const char *rest, const char *query)
{
    if (*rest == '\0') {
        if (m == EVHTTP_REQ_GET) {
            /* one service at a time into the buffer: 10,000 services never exist as one
             * JSON tree */
            struct evbuffer *b = evbuffer_new();
            bool ok = b != NULL && evbuffer_add_printf(b, "{\"services\":[") > 0;
            for (size_t i = 0; ok && i < osub_engine_service_count(d->e); i++) {
                json_t *o = service_json(d, who, osub_engine_service_id(d->e, i));
                char *text = o ? osubd_json_dumps(o, JSON_COMPACT) : NULL;
                json_decref(o);
                ok = text != NULL && (i == 0 || evbuffer_add(b, ",", 1) == 0) &&
                     evbuffer_add(b, text, strlen(text)) == 0;
                free(text);
            }
            ok = ok && evbuffer_add_printf(b, "]}\n") > 0;
            if (!ok) {
                if (b != NULL)
                    evbuffer_free(b);
                reply_oom(d, req);
                return;
            }
            reply_buf(d, req, 200, b);
        } else if (m == EVHTTP_REQ_POST) {
            /* ?dry_run=1|true|0|false, and nothing else */
            struct evkeyvalq q;
            TAILQ_INIT(&q);
            bool dry = false, ok = query == NULL || evhttp_parse_query_str(query, &q) == 0;
            struct evkeyval *kv;
            TAILQ_FOREACH(kv, &q, next)
            {
                if (strcmp(kv->key, "dry_run") != 0) {
                    ok = false;
                } else if (strcmp(kv->value, "1") == 0 || strcmp(kv->value, "true") == 0) {
                    dry = true;
                } else if (strcmp(kv->value, "0") != 0 && strcmp(kv->value, "false") != 0) {
                    ok = false;
                }
            }
            evhttp_clear_headers(&q);
            if (!ok) {
                reply_error(d, req, 400, "bad_query",
                            "POST /v1/services takes one query parameter: dry_run=1 (or true, "
                            "0, false)");
                return;
            }
            h_services_post(d, who, req, dry);
        } else {
            reply_error(d, req, 405, "method_not_allowed", "GET or POST /v1/services");
        }
        return;
    }
    char id[OSUB_ID_MAX + 2];
    const char *slash = strchr(rest, '/');
    size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
    if (len == 0 || len > OSUB_ID_MAX) {
        reply_rc(d, req, OSUB_EBAD_ID);
        return;
    }
    memcpy(id, rest, len);
    id[len] = '\0';
    const char *action = slash ? slash + 1 : "";
    if (*action == '\0') {
        if (m == EVHTTP_REQ_GET) {
            json_t *s = service_json(d, who, id);
            if (s == NULL)
                reply_rc(d, req, osub_id_valid(id) ? OSUB_EUNKNOWN_SERVICE : OSUB_EBAD_ID);
            else
                reply_json(d, req, 200, s);
        } else if (m == EVHTTP_REQ_DELETE) {
            h_service_cmd(d, who, req, id, "release");
        } else if (m == EVHTTP_REQ_PATCH) {
            h_service_cmd(d, who, req, id, "resize");
        } else {
            reply_error(d, req, 405, "method_not_allowed", "GET, PATCH or DELETE a service");
        }
        return;
    }
    if (strcmp(action, "backends") == 0 && m == EVHTTP_REQ_PUT)
        h_backends(d, who, req, id);
    else if (strcmp(action, "directives") == 0 && m == EVHTTP_REQ_GET)
        osubd_act_directives(d->act, req, id, query);
    else if (strcmp(action, "usage") == 0 && m == EVHTTP_REQ_PUT)
        h_service_cmd(d, who, req, id, "usage");
    else if ((strcmp(action, "ready") == 0 || strcmp(action, "ack") == 0 ||
              strcmp(action, "exited") == 0) &&
             m == EVHTTP_REQ_POST)
        h_service_cmd(d, who, req, id, action);
    else
        reply_error(d, req, 404, "not_found", "no such endpoint");
}

static void h_gpu(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m,
                  const char *rest)
{
    char *end;
    errno = 0;
    long gpu = strtol(rest, &end, 10);
    if (end == rest || *end != '/' || m != EVHTTP_REQ_POST || rest[0] < '0' || rest[0] > '9') {
        reply_error(d, req, 404, "not_found", "POST /v1/gpus/{index}/cordon, /uncordon or /drain");
        return;
    }
    const char *action = end + 1;
    if (errno != 0 || gpu > OSUB_POOL_GPUS_MAX) { /* never cut down to some other GPU's index */
        reply_rc(d, req, OSUB_EBAD_GPU);
        return;
    }
    json_t *cmd;
    if (strcmp(action, "cordon") == 0 || strcmp(action, "uncordon") == 0)
        cmd = json_pack("{s:s, s:i, s:b}", "op", "cordon", "gpu", (int)gpu, "on", action[0] == 'c');
    else if (strcmp(action, "drain") == 0)
        cmd = json_pack("{s:s, s:i}", "op", "drain", "gpu", (int)gpu);
    else {
        reply_error(d, req, 404, "not_found", "cordon, uncordon or drain");
        return;
    }
    char err[256];
    int rc = osubd_apply(d->core, cmd, NULL, err, sizeof(err));
    json_decref(cmd);
    if (rc != 0) {
        reply_rc(d, req, rc);
        return;
    }
    reply_json(d, req, 200, pool_json(d));
}

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
    reply_json(d, req, 200, json_pack("{s:o, s:I}", "events", c.arr, "next", (json_int_t)c.last));
}

static void waiter_free(struct osubd_api *d, struct waiter *w)
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
    waiter_free(w->d, w);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct waiter *w = arg;
    struct osubd_api *d = w->d;
    send_events(d, w->req, w->since);
    waiter_free(d, w);
}

static void api_events_ready(struct osubd_api *d)
{
    while (d->waiters != NULL) {
        struct waiter *w = d->waiters;
        send_events(d, w->req, w->since);
        waiter_free(d, w);
    }
}

static void h_events(struct osubd_api *d, struct evhttp_request *req, const char *query)
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
        reply_error(d, req, 400, "invalid_query", "since >= 0, wait between 0 and 300 seconds");
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

extern const unsigned char osubd_dashboard_html[], osubd_openapi_json[];
extern const size_t osubd_dashboard_html_len, osubd_openapi_json_len;

static void h_static(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m,
                     const unsigned char *body, size_t len, const char *type)
{
    if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
        reply_error(d, req, 405, "method_not_allowed", "GET only");
        return;
    }
    struct evbuffer *b = evbuffer_new();
    if (b == NULL || evbuffer_add_reference(b, body, len, NULL, NULL) != 0) {
        if (b != NULL)
            evbuffer_free(b);
        reply_oom(d, req);
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
    count(d, 200);
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

static const double lat_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                    0.01,   0.025,   0.05,   0.1,   0.5};

static void h_metrics(struct osubd_api *d, struct evhttp_request *req, const char *query)
{
    bool per_service =
        d->cfg->metrics_per_service || (query != NULL && strstr(query, "per_service=1") != NULL);
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        reply_oom(d, req);
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
                        frac(p.used_mib, p.vram_mib), frac(p.held_mib, p.vram_mib),
                        frac(p.granted_mib, p.logical_mib));
    evbuffer_add_printf(b,
                        "# HELP oversub_pool_ratio The oversell ratio.\n"
                        "# TYPE oversub_pool_ratio gauge\noversub_pool_ratio %.3f\n",
                        (double)p.ratio_milli / 1000.0);
    evbuffer_add_printf(b,
                        "# HELP oversub_queue_length Services waiting in the queue.\n"
                        "# TYPE oversub_queue_length gauge\noversub_queue_length %d\n",
                        p.n_queued);
    /* services by class and state */
    size_t nc;
    const osub_class_t *cls = osub_engine_classes(d->e, &nc);
    evbuffer_add_printf(b, "# HELP oversub_services Services by class and state.\n"
                           "# TYPE oversub_services gauge\n");
    /* one pass over the services (a scrape of 10,000 stays cheap) */
    enum { MAXC = 16, NST = (int)OSUB_STATE_RELEASED + 1 };
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
    if (per_service) {
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
                evbuffer_add_printf(b,
                                    "oversub_service_%s_bytes{service=\"%s\",class=\"%s\"} %lld\n",
                                    what[w], id, si.spec->class_name, (long long)v * 1048576LL);
            }
        }
    }
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
    osubd_dp_metrics(d->dp, b);     /* started after the modules registered */
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
    count(d, 200);
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
        reply_error(d, req, 403, "forbidden_host",
                    "Host names neither an address oversubd listens on nor one of its "
                    "api_hostnames (a page that rebinds a name to this address is refused)");
        return 403;
    }
    const char *origin = evhttp_find_header(in, "Origin");
    if (origin != NULL) {
        bool same = host != NULL && strncasecmp(origin, "http://", 7) == 0 &&
                    strcasecmp(origin + 7, host) == 0;
        if (!same) {
            reply_error(d, req, 403, "cross_origin",
                        "a request from another origin (a web page) is refused: the API is "
                        "for its own dashboard and for clients that send no Origin");
            return 403;
        }
    }
    if ((m == EVHTTP_REQ_POST || m == EVHTTP_REQ_PUT || m == EVHTTP_REQ_PATCH) &&
        !json_media_type(evhttp_find_header(in, "Content-Type"))) {
        reply_error(d, req, 415, "unsupported_media_type",
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
        reply_error(d, req, 400, "bad_request",
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
            reply_error(d, req, 401, "unauthorized",
                        own ? "this request needs Authorization: Bearer <the service's token "
                              "(from its admission) or the admin token>"
                            : "this request needs Authorization: Bearer <the admin token>");
            goto done;
        }
    }
    if (osubd_core_full(d->core) && mutating(m)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "5");
        reply_error(d, req, 507, "insufficient_storage",
                    "the state's disk is full: nothing was changed; retry when space returns "
                    "(reads and the gateway go on)");
        goto done;
    }
    if ((strcmp(path, "/healthz") == 0 || strcmp(path, "/metrics") == 0) && m != EVHTTP_REQ_GET) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET");
        reply_error(d, req, 405, "method_not_allowed", "GET only");
    } else if (strcmp(path, "/healthz") == 0) {
        /* healthy means the engine's books balance (DESIGN.md's invariants) */
        char why[300];
        if (osub_engine_check(d->e, why, sizeof(why)) == 0)
            reply_json(d, req, 200,
                       json_pack("{s:s, s:s, s:s}", "status", "ok", "invariants", "ok", "state",
                                 osubd_core_full(d->core) ? "disk full: changes refused (507)" : "ok"));
        else
            reply_json(d, req, 500, json_pack("{s:s, s:s}", "status", "broken", "invariants", why));
    } else if (strcmp(path, "/metrics") == 0)
        h_metrics(d, req, query);
    else if (strcmp(path, "/") == 0 || strcmp(path, "/dashboard") == 0)
        h_static(d, req, m, osubd_dashboard_html, osubd_dashboard_html_len,
                 "text/html; charset=utf-8");
    else if (strcmp(path, "/v1/openapi.json") == 0)
        h_static(d, req, m, osubd_openapi_json, osubd_openapi_json_len, "application/json");
    else if (strcmp(path, "/v1/pool") == 0)
        h_pool(d, req, m);
    else if (strcmp(path, "/v1/services") == 0)
        h_services(d, who, req, m, "", query);
    else if (strncmp(path, "/v1/services/", 13) == 0 && path[13] != '\0')
        h_services(d, who, req, m, path + 13, query);
    else if (strncmp(path, "/v1/gpus/", 9) == 0)
        h_gpu(d, req, m, path + 9);
    else if (strcmp(path, "/v1/events") == 0 && m == EVHTTP_REQ_GET)
        h_events(d, req, query);
    else
        reply_error(d, req, 404, "not_found", "no such endpoint");
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
        api_events_ready(d);
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

void osubd_api_set_dp(struct osubd_api *a, struct osubd_dp *dp)
{
    a->dp = dp;
}

void osubd_api_free(struct osubd_api *d)
{
    if (d == NULL)
        return;
    while (d->waiters != NULL)
        waiter_free(d, d->waiters);
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
            osubd_log(OSUBD_LOG_INFO, "%lld file descriptors: the API takes at most %lld TCP "
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
