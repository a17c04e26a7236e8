/* extender.c - oversub-scheduler: kube-scheduler's filter, prioritize, preempt and bind verbs,
 * each answered by asking the nodes' oversubd (docs/kubernetes.md): the calls, HTTP, metrics
 * and the extender's life */
#define _GNU_SOURCE
#include "extender.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <sys/resource.h>

#include "conns.h"
#include "extender_internal.h"

#define BODY_MAX (16u << 20) /* a filter call for 5,000 full Node objects fits */

static const char *const verb_names[] = {"filter", "prioritize", "preempt", "bind"};
static const double lat_bounds[LAT_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                               0.1,   0.25,   0.5,   1.0,  2.5,   5.0};

/* ---- small helpers ---------------------------------------------------------------------- */

int64_t osub__ext_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double osub__ext_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void osub__ext_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void reply_text(struct evhttp_request *req, int code, const char *ctype, const char *text)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL || evbuffer_add(b, text, strlen(text)) != 0) {
        if (b)
            evbuffer_free(b);
        evhttp_send_reply(req, 503, "Service Unavailable", NULL);
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    evhttp_send_reply(req, code, code == 200 ? "OK" : "Error", b);
    evbuffer_free(b);
}

/* Sends j (taken) as the answer. */
static void reply_json(struct evhttp_request *req, int code, json_t *j)
{
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (t == NULL) {
        evhttp_send_reply(req, 503, "Service Unavailable", NULL);
        return;
    }
    size_t n = strlen(t);
    char *t2 = realloc(t, n + 2);
    if (t2 != NULL) {
        t = t2;
        t[n] = '\n';
        t[n + 1] = '\0';
    }
    reply_text(req, code, "application/json", t);
    free(t);
}

static void reply_error(struct evhttp_request *req, int code, const char *msg)
{
    reply_json(req, code, json_pack("{s:s}", "error", msg));
}

/* ---- one verb's call --------------------------------------------------------------------- */

void osub__ext_call_free(struct call *c)
{
    if (c->req != NULL)
        evhttp_connection_set_closecb(evhttp_request_get_connection(c->req), NULL, NULL);
    json_decref(c->args);
    json_decref(c->spec);
    json_decref(c->names);
    json_decref(c->answers);
    json_decref(c->held);
    json_decref(c->bind_decision);
    free(c);
}

void osub__ext_call_done(struct call *c, int code, json_t *body)
{
    struct osub_ext *x = c->x;
    double took = osub__ext_mono_s() - c->started;
    x->calls[c->verb]++;
    int b = 0;
    while (b < LAT_BUCKETS && took > lat_bounds[b])
        b++;
    x->lat[c->verb][b]++;
    x->lat_sum[c->verb] += took;
    if (code != 200 || json_string_length(json_object_get(body, "Error")) > 0)
        x->errors[c->verb]++;
    if (c->req != NULL) {
        evhttp_connection_set_closecb(evhttp_request_get_connection(c->req), NULL, NULL);
        reply_json(c->req, code, body);
    } else {
        json_decref(body); /* kube-scheduler gave up (its timeout): nobody to answer */
    }
    osub__ext_call_free(c);
}

/* kube-scheduler closed the connection before the answer: the call goes on (a bind must still
 * release what it reserved) and its answer is dropped. */
static void on_client_close(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    struct call *c = arg;
    c->req = NULL;
}

/* ---- HTTP -------------------------------------------------------------------------------- */

static json_t *read_args(struct evhttp_request *req, char *why, size_t whylen)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    if (len == 0) {
        snprintf(why, whylen, "the request has no body (kube-scheduler sends JSON)");
        return NULL;
    }
    const char *p = (const char *)evbuffer_pullup(in, (ssize_t)len);
    json_error_t je;
    json_t *j = p ? json_loadb(p, len, 0, &je) : NULL;
    if (j == NULL) {
        snprintf(why, whylen, "the body is not JSON: %s (line %d, column %d)",
                 p ? je.text : "out of memory", je.line, je.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(why, whylen, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* The pod of a filter, prioritize or preempt call: its spec for oversub, kept for bind. */
static void read_pod(struct call *c)
{
    c->pod = osub_json_get_ci(c->args, "Pod");
    const json_t *md = json_object_get(c->pod, "metadata");
    const char *uid = json_string_value(json_object_get(md, "uid"));
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    snprintf(c->uid, sizeof(c->uid), "%s", uid ? uid : "");
    snprintf(c->pod_name, sizeof(c->pod_name), "%s/%s", ns && ns[0] ? ns : "default",
             name ? name : "?");
    if (!json_is_object(c->pod)) {
        snprintf(c->bad_pod, sizeof(c->bad_pod), "oversub: the request has no Pod");
        return;
    }
    int64_t mib;
    char why[300];
    if (osub_pod_vram(c->pod, &mib, why, sizeof(why)) != 0) {
        snprintf(c->bad_pod, sizeof(c->bad_pod), "oversub: %s", why);
        return;
    }
    if (mib == 0)
        return; /* asks nothing of oversub: every node passes */
    c->spec = osub_pod_spec(c->pod, &c->x->cfg.policy, NULL, why, sizeof(why));
    if (c->spec == NULL) {
        snprintf(c->bad_pod, sizeof(c->bad_pod), "oversub: %s", why);
        return;
    }
}

/* The node names of a call: NodeNames, else the Nodes' items, else the victims' nodes. */
static json_t *read_names(const json_t *args, enum verb v)
{
    json_t *out = json_array();
    if (v == V_PREEMPT) {
        const char *k;
        json_t *val;
        json_object_foreach(osub__ext_victim_map(args), k, val)
            json_array_append_new(out, json_string(k));
        return out;
    }
    const json_t *names = osub_json_get_ci(args, "NodeNames");
    size_t i;
    json_t *e;
    if (json_is_array(names)) {
        json_array_foreach(names, i, e) if (json_is_string(e)) json_array_append(out, e);
        return out;
    }
    json_array_foreach(json_object_get(osub_json_get_ci(args, "Nodes"), "items"), i, e)
    {
        json_t *nm = json_object_get(json_object_get(e, "metadata"), "name");
        if (json_is_string(nm))
            json_array_append(out, nm);
    }
    return out;
}

static void on_verb(struct evhttp_request *req, void *arg, enum verb v)
{
    struct osub_ext *x = arg;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "POST");
        reply_error(req, 405, "kube-scheduler's verbs are POSTs");
        return;
    }
    char why[400];
    json_t *args = read_args(req, why, sizeof(why));
    if (args == NULL) {
        x->errors[v]++;
        reply_error(req, 400, why);
        return;
    }
    struct call *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        json_decref(args);
        reply_error(req, 503, "out of memory");
        return;
    }
    c->x = x;
    c->req = req;
    c->verb = v;
    c->started = osub__ext_mono_s();
    c->args = args;
    c->answers = json_object();
    c->held = json_object();
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_client_close, c);
    if (v == V_BIND) {
        osub__ext_bind(c);
        return;
    }
    read_pod(c);
    c->names = read_names(args, v);
    if (v == V_PREEMPT && osub__ext_victim_map(args) == NULL) {
        osub__ext_call_done(
            c, 200, json_pack("{s:s, s:o}", "Error", "", "NodeNameToMetaVictims", json_object()));
        return;
    }
    if (c->spec == NULL || c->bad_pod[0]) {
        osub__ext_finish(c);
        return;
    }
    osub__ext_ask_nodes(c);
}

static void on_filter(struct evhttp_request *r, void *a)
{
    on_verb(r, a, V_FILTER);
}
static void on_prioritize(struct evhttp_request *r, void *a)
{
    on_verb(r, a, V_PRIORITIZE);
}
static void on_preempt(struct evhttp_request *r, void *a)
{
    on_verb(r, a, V_PREEMPT);
}
static void on_bind(struct evhttp_request *r, void *a)
{
    on_verb(r, a, V_BIND);
}

static void on_healthz(struct evhttp_request *req, void *arg)
{
    (void)arg;
    reply_text(req, 200, "text/plain", "ok\n");
}

/* GET /v1/nodes: what the extender knows of each node. */
static void on_nodes_get(struct evhttp_request *req, void *arg)
{
    struct osub_ext *x = arg;
    json_t *out = json_array();
    int64_t now = osub__ext_mono_ms();
    for (size_t i = 0; i < x->n_nodes; i++) {
        struct node *n = x->nodes[i];
        if (n->gone)
            continue;
        json_t *o =
            json_pack("{s:s, s:s, s:b}", "name", n->name, "url", n->url, "from_api", n->from_api);
        if (n->pool != NULL) {
            json_object_set(o, "pool", n->pool);
            json_object_set_new(o, "pool_age_ms", json_integer(now - n->pool_at_ms));
        }
        if (n->pool_err[0])
            json_object_set_new(o, "error", json_string(n->pool_err));
        json_array_append_new(out, o);
    }
    json_t *res = json_pack("{s:o}", "nodes", out);
    if (x->nodes_err[0])
        json_object_set_new(res, "api_error", json_string(x->nodes_err));
    reply_json(req, 200, res);
}

static void on_metrics(struct evhttp_request *req, void *arg)
{
    struct osub_ext *x = arg;
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        evhttp_send_reply(req, 503, "Service Unavailable", NULL);
        return;
    }
    evbuffer_add_printf(b, "# HELP oversub_extender_calls_total Calls of each verb by "
                           "kube-scheduler.\n# TYPE oversub_extender_calls_total counter\n");
    for (int v = 0; v < V__COUNT; v++)
        evbuffer_add_printf(b, "oversub_extender_calls_total{verb=\"%s\"} %" PRIu64 "\n",
                            verb_names[v], x->calls[v]);
    evbuffer_add_printf(
        b,
        "# HELP oversub_extender_accept_refused_total Connections not accepted "
        "for want of file descriptors.\n# TYPE oversub_extender_accept_refused_total "
        "counter\noversub_extender_accept_refused_total %" PRIu64 "\n",
        x->accept_refused);
    evbuffer_add_printf(b, "# HELP oversub_extender_errors_total Calls answered with an error.\n"
                           "# TYPE oversub_extender_errors_total counter\n");
    for (int v = 0; v < V__COUNT; v++)
        evbuffer_add_printf(b, "oversub_extender_errors_total{verb=\"%s\"} %" PRIu64 "\n",
                            verb_names[v], x->errors[v]);
    evbuffer_add_printf(b, "# HELP oversub_extender_call_duration_seconds Time to answer a "
                           "verb.\n# TYPE oversub_extender_call_duration_seconds histogram\n");
    for (int v = 0; v < V__COUNT; v++) {
        uint64_t cum = 0;
        for (int i = 0; i <= LAT_BUCKETS; i++) {
            cum += x->lat[v][i];
            if (i < LAT_BUCKETS)
                evbuffer_add_printf(b,
                                    "oversub_extender_call_duration_seconds_bucket{verb=\"%s\","
                                    "le=\"%g\"} %" PRIu64 "\n",
                                    verb_names[v], lat_bounds[i], cum);
            else
                evbuffer_add_printf(b,
                                    "oversub_extender_call_duration_seconds_bucket{verb=\"%s\","
                                    "le=\"+Inf\"} %" PRIu64 "\n",
                                    verb_names[v], cum);
        }
        evbuffer_add_printf(b, "oversub_extender_call_duration_seconds_sum{verb=\"%s\"} %.6f\n",
                            verb_names[v], x->lat_sum[v]);
        evbuffer_add_printf(
            b, "oversub_extender_call_duration_seconds_count{verb=\"%s\"} %" PRIu64 "\n",
            verb_names[v], cum);
    }
    size_t live = 0, down = 0;
    for (size_t i = 0; i < x->n_nodes; i++) {
        live += !x->nodes[i]->gone;
        down += !x->nodes[i]->gone && x->nodes[i]->pool_err[0] != '\0';
    }
    evbuffer_add_printf(
        b,
        "# HELP oversub_extender_nodes Nodes with an oversubd known.\n"
        "# TYPE oversub_extender_nodes gauge\noversub_extender_nodes %zu\n"
        "# HELP oversub_extender_nodes_unreachable Nodes whose last pool read failed.\n"
        "# TYPE oversub_extender_nodes_unreachable gauge\noversub_extender_nodes_unreachable %zu\n"
        "# HELP oversub_extender_node_asks_total Dry runs asked of nodes' oversubd.\n"
        "# TYPE oversub_extender_node_asks_total counter\noversub_extender_node_asks_total %" PRIu64
        "\n"
        "# HELP oversub_extender_node_cached_total Node decisions reused from the cache.\n"
        "# TYPE oversub_extender_node_cached_total counter\n"
        "oversub_extender_node_cached_total %" PRIu64 "\n"
        "# HELP oversub_extender_node_failures_total Node requests with no usable answer.\n"
        "# TYPE oversub_extender_node_failures_total counter\n"
        "oversub_extender_node_failures_total %" PRIu64 "\n"
        "# HELP oversub_extender_binds_total Binds by result.\n"
        "# TYPE oversub_extender_binds_total counter\n"
        "oversub_extender_binds_total{result=\"ok\"} %" PRIu64 "\n"
        "oversub_extender_binds_total{result=\"failed\"} %" PRIu64 "\n"
        "# HELP oversub_extender_preempt_degrade_only_total Nodes in preempt calls where oversub "
        "makes room by degrading only.\n"
        "# TYPE oversub_extender_preempt_degrade_only_total counter\n"
        "oversub_extender_preempt_degrade_only_total %" PRIu64 "\n"
        "# HELP oversub_extender_reservations_released_total Reservations released after a "
        "failed Binding.\n"
        "# TYPE oversub_extender_reservations_released_total counter\n"
        "oversub_extender_reservations_released_total %" PRIu64 "\n",
        live, down, x->node_asks, x->node_cached, x->node_failures, x->binds_ok, x->binds_failed,
        x->preempt_degrade_only, x->releases);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void on_other(struct evhttp_request *req, void *arg)
{
    (void)arg;
    reply_error(req, 404,
                "no such path: POST /filter, /prioritize, /preempt, /bind; GET /healthz, "
                "/metrics, /v1/nodes");
}

/* ---- life -------------------------------------------------------------------------------- */

void osub_ext_config_default(struct osub_ext_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->listen_host, sizeof(c->listen_host), "127.0.0.1");
    c->listen_port = 8888;
    c->node_timeout_ms = 2000;
    c->cache_ms = 10000;
    c->pool_refresh_ms = 5000;
    c->nodes_refresh_ms = 30000;
    osub_kube_opts_default(&c->kube_opts);
    c->kube_opts.timeout_ms = 4000; /* a bind's API calls end inside kube-scheduler's 5 s */
    osub_pod_policy_default(&c->policy);
}

int osub_ext_new(struct event_base *base, const struct osub_ext_config *c, struct osub_ext **out,
                 char *err, size_t errlen)
{
    *out = NULL;
    struct osub_ext *x = calloc(1, sizeof(*x));
    if (x == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    x->cfg = *c;
    x->base = base;
    x->by_name = json_object();
    x->decisions = json_object();
    if (x->by_name == NULL || x->decisions == NULL) {
        snprintf(err, errlen, "out of memory");
        osub_ext_free(x);
        return -1;
    }
    if (c->token_file[0]) {
        FILE *f = fopen(c->token_file, "re");
        size_t n = f ? fread(x->token, 1, sizeof(x->token) - 1, f) : 0;
        if (f == NULL) {
            snprintf(err, errlen, "--token-file %s: %s", c->token_file, strerror(errno));
            osub_ext_free(x);
            return -1;
        }
        fclose(f);
        x->token[n] = '\0';
        while (n > 0 && (x->token[n - 1] == '\n' || x->token[n - 1] == ' '))
            x->token[--n] = '\0';
    }
    if (c->kube && osub_kube_new(base, &c->kube_opts, &x->kube, err, errlen) != 0) {
        osub_ext_free(x);
        return -1;
    }
    *out = x;
    return 0;
}

static struct event *every(struct osub_ext *x, int64_t ms, event_callback_fn fn)
{
    struct event *ev = event_new(x->base, -1, EV_PERSIST, fn, x);
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (ev != NULL)
        event_add(ev, &tv);
    return ev;
}

int osub_ext_start(struct osub_ext *x, char *err, size_t errlen)
{
    x->http = evhttp_new(x->base);
    if (x->http == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    evhttp_set_max_body_size(x->http, BODY_MAX);
    evhttp_set_allowed_methods(x->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD);
    evhttp_set_timeout(x->http, 30);
    evhttp_set_cb(x->http, "/filter", on_filter, x);
    evhttp_set_cb(x->http, "/prioritize", on_prioritize, x);
    evhttp_set_cb(x->http, "/preempt", on_preempt, x);
    evhttp_set_cb(x->http, "/bind", on_bind, x);
    evhttp_set_cb(x->http, "/healthz", on_healthz, x);
    evhttp_set_cb(x->http, "/metrics", on_metrics, x);
    evhttp_set_cb(x->http, "/v1/nodes", on_nodes_get, x);
    evhttp_set_gencb(x->http, on_other, x);
    /* descriptors: the soft limit raised to the hard one (kube-scheduler keeps many
     * connections, and every node has one of ours) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct evhttp_bound_socket *h =
        evhttp_bind_socket_with_handle(x->http, x->cfg.listen_host, (uint16_t)x->cfg.listen_port);
    if (h == NULL) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", x->cfg.listen_host, x->cfg.listen_port,
                 strerror(errno));
        return -1;
    }
    /* out of descriptors: accept backs off (and says so once) instead of spinning */
    osubd_listener_guard(evhttp_bound_socket_get_listener(h), "oversub-scheduler",
                         &x->accept_refused);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int port = x->cfg.listen_port;
    if (getsockname(evhttp_bound_socket_get_fd(h), (struct sockaddr *)&ss, &sl) == 0)
        port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    x->pool_ev = every(x, x->cfg.pool_refresh_ms, osub__ext_pool_tick);
    x->sweep_ev = every(x, 1000, osub__ext_sweep_tick);
    if (x->cfg.kube_nodes) {
        x->nodes_ev = every(x, x->cfg.nodes_refresh_ms, osub__ext_nodes_tick);
        osub__ext_nodes_tick(-1, 0, x);
    }
    osub__ext_pool_tick(-1, 0, x);
    if (x->pool_ev == NULL || x->sweep_ev == NULL || (x->cfg.kube_nodes && x->nodes_ev == NULL)) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    printf("listening on http://%s:%d\n", x->cfg.listen_host, port);
    fflush(stdout);
    return 0;
}

void osub_ext_free(struct osub_ext *x)
{
    if (x == NULL)
        return;
    /* requests to nodes still out: cancelled, their calls freed unanswered */
    while (x->reqs != NULL) {
        struct node_req *nr = x->reqs;
        node_cb cb = nr->cb;
        void *arg = nr->arg;
        evhttp_cancel_request(nr->req);
        osub__ext_node_req_done(nr);
        cb(arg, -1, NULL, "stopping");
    }
    osub_kube_free(x->kube); /* its callbacks see -1 and free their calls */
    x->kube = NULL;
    if (x->http)
        evhttp_free(x->http);
    struct event *evs[] = {x->pool_ev, x->nodes_ev, x->sweep_ev};
    for (size_t i = 0; i < 3; i++)
        if (evs[i])
            event_free(evs[i]);
    for (size_t i = 0; i < x->n_nodes; i++) {
        if (x->nodes[i]->conn)
            evhttp_connection_free(x->nodes[i]->conn);
        json_decref(x->nodes[i]->pool);
        free(x->nodes[i]);
    }
    free(x->nodes);
    json_decref(x->by_name);
    json_decref(x->decisions);
    osub_kube_free(x->kube);
    free(x);
}
