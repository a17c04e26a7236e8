/* extender_bind.c - oversub-scheduler's bind: the pod checked with the API server, its grant
 * reserved on the node's oversubd, then the Binding (the reservation released when it fails) */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "extender_internal.h"

/* ---- bind: the grant reserved on the node, then the Binding ------------------------------ */

static void on_release(void *arg, int code, json_t *body, const char *why)
{
    (void)body;
    struct osub_ext *x = arg;
    if (code < 0)
        return;
    if (code == 200 || code == 404)
        x->releases++;
    else
        osub__ext_log("oversub-scheduler: releasing a reservation failed: %s",
                      why ? why : "oversubd answered an error");
}

static void release_on_node(struct call *c)
{
    if (!c->bind_created) { /* it was there before this bind: not this bind's to release */
        osub__ext_log("oversub-scheduler: %s was on %s before this bind: left as it is",
                      c->pod_name, c->bind_node);
        return;
    }
    struct node *n = osub__ext_node_get(c->x, c->bind_node);
    if (n != NULL)
        n->gen++; /* what was cached while the reservation held is stale again */
    char path[200];
    snprintf(path, sizeof(path), "/v1/services/%s",
             json_string_value(json_object_get(c->spec, "id")));
    if (n == NULL ||
        osub__ext_node_send(c->x, n, EVHTTP_REQ_DELETE, path, NULL, on_release, c->x) != 0)
        osub__ext_log("oversub-scheduler: cannot release %s on %s", path, c->bind_node);
}

static void bind_fail(struct call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bind_fail(struct call *c, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    c->x->binds_failed++;
    osub__ext_log("oversub-scheduler: bind %s to %s failed: %s", c->pod_name, c->bind_node, msg);
    osub__ext_call_done(c, 200, json_pack("{s:s}", "Error", msg));
}

/* What is left of a bind's budget for its next API request (at least 100 ms). */
static long bind_left_ms(const struct call *c)
{
    long left = (long)(BIND_BUDGET_MS - (osub__ext_mono_s() - c->started) * 1000.0);
    return left < 100 ? 100 : left;
}

static void bound_ok(struct call *c)
{
    c->x->binds_ok++;
    const char *out = json_string_value(json_object_get(c->bind_decision, "outcome"));
    osub__ext_log("oversub-scheduler: bound %s to %s (oversub: %s, %zu victims)", c->pod_name,
                  c->bind_node, out ? out : "?",
                  json_array_size(json_object_get(c->bind_decision, "victims")));
    osub__ext_call_done(c, 200, json_pack("{s:s}", "Error", ""));
}

/* The Binding's answer was lost (a timeout, a 5xx): the pod itself says whether it went
 * through, before the reservation is kept or released. */
static void on_binding_check(void *arg, long status, const char *body, size_t len,
                             const char *error)
{
    struct call *c = arg;
    if (status < 0) {
        osub__ext_call_free(c);
        return;
    }
    json_t *pod = status == 200 ? json_loadb(body, len, 0, NULL) : NULL;
    const char *uid = json_string_value(json_object_get(json_object_get(pod, "metadata"), "uid"));
    const char *node = json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
    bool seen = pod != NULL && uid != NULL; /* the pod was read: its binding is known */
    bool same = seen && strcmp(uid, c->uid) == 0;
    bool bound = same && node != NULL && strcmp(node, c->bind_node) == 0;
    json_decref(pod);
    if (bound) {
        osub__ext_log(
            "oversub-scheduler: the Binding of %s went through though its answer was lost",
            c->pod_name);
        bound_ok(c);
        return;
    }
    if (status == 404 ||
        (seen && (!same || node == NULL || node[0] == '\0' || strcmp(node, c->bind_node) != 0))) {
        release_on_node(c);
        bind_fail(c,
                  "the Binding's answer was lost (%s) and the pod is not bound to %s; the "
                  "reservation is released",
                  error ? error : "an error", c->bind_node);
        return;
    }
    /* neither answer came: whether it is bound is unknown, so the reservation stays (the node
     * releases it once the pod is seen bound nowhere, or elsewhere) */
    bind_fail(c,
              "the Binding's outcome is unknown (%s, and the pod could not be read); the "
              "reservation on %s is kept until its node sees where the pod went",
              error ? error : "no answer", c->bind_node);
}

static void on_binding(void *arg, long status, const char *body, size_t len, const char *error)
{
    struct call *c = arg;
    if (status < 0) { /* stopping */
        osub__ext_call_free(c);
        return;
    }
    if (status == 0 || status >= 500) {
        char path[600];
        snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", c->bind_ns, c->bind_name);
        if (osub_kube_request_within(c->x->kube, "GET", path, NULL, bind_left_ms(c),
                                     on_binding_check, c) == 0)
            return;
    }
    if (status == 201 || status == 200) {
        bound_ok(c);
        return;
    }
    /* no Binding: the reservation goes, so the node's memory is not held for a pod that is
     * not there */
    json_t *j = json_loadb(body, len, 0, NULL);
    const char *msg = json_string_value(json_object_get(j, "message"));
    char m[400];
    snprintf(m, sizeof(m), "%s", msg ? msg : error ? error : "no reason given");
    json_decref(j);
    release_on_node(c);
    bind_fail(c,
              "the API server refused the Binding (HTTP %ld: %s); the reservation on %s is "
              "released",
              status, m, c->bind_node);
}

static void on_submit(void *arg, int code, json_t *body, const char *why)
{
    struct call *c = arg;
    struct osub_ext *x = c->x;
    if (code < 0) {
        osub__ext_call_free(c);
        return;
    }
    json_t *dec = json_object_get(body, "decision");
    const char *out = json_string_value(json_object_get(dec, "outcome"));
    if (why != NULL) {
        bind_fail(c, "%s", why);
        return;
    }
    if (!(code == 201 || code == 202 || code == 200) || out == NULL ||
        !(strcmp(out, "started") == 0 || strcmp(out, "pending") == 0 ||
          strcmp(out, "exists") == 0)) {
        const char *msg =
            json_string_value(json_object_get(json_object_get(body, "error"), "message"));
        char v[512] = "";
        if (dec != NULL)
            osub__ext_verdict(dec, v, sizeof(v));
        bind_fail(c, "oversubd on %s refused the pod (HTTP %d): %s", c->bind_node, code,
                  v[0]  ? v
                  : msg ? msg
                        : "no reason given");
        return;
    }
    c->bind_decision = json_incref(dec);
    c->bind_created = strcmp(out, "exists") != 0;
    /* the node now holds the grant: the Binding makes the pod the node's */
    json_t *binding =
        json_pack("{s:s, s:s, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:s}}", "apiVersion", "v1", "kind",
                  "Binding", "metadata", "name", c->bind_name, "namespace", c->bind_ns, "uid",
                  c->uid, "target", "apiVersion", "v1", "kind", "Node", "name", c->bind_node);
    char *text = binding ? json_dumps(binding, JSON_COMPACT) : NULL;
    json_decref(binding);
    char path[600];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s/binding", c->bind_ns, c->bind_name);
    if (text == NULL || osub_kube_request_within(x->kube, "POST", path, text, bind_left_ms(c),
                                                 on_binding, c) != 0) {
        free(text);
        release_on_node(c);
        bind_fail(c, "out of memory");
        return;
    }
    free(text);
}

static void bind_submit(struct call *c)
{
    struct osub_ext *x = c->x;
    if (osub__ext_mono_s() - c->started > BIND_BUDGET_MS / 1000.0) {
        bind_fail(c, "the API server took the bind's %d ms before the node could be asked",
                  BIND_BUDGET_MS);
        return;
    }
    struct node *n = osub__ext_node_get(x, c->bind_node);
    if (n == NULL) {
        bind_fail(c, "no oversubd known on node %s", c->bind_node);
        return;
    }
    json_t *k = json_object_get(c->spec, "kubernetes");
    json_object_set_new(k, "node", json_string(c->bind_node));
    n->gen++; /* what was cached about this node no longer holds, bound or not */
    char *text = json_dumps(c->spec, JSON_COMPACT);
    if (text == NULL ||
        osub__ext_node_send(x, n, EVHTTP_REQ_POST, "/v1/services", text, on_submit, c) != 0)
        bind_fail(c, "cannot reach oversubd on %s", c->bind_node);
    free(text);
}

static void on_pod_read(void *arg, long status, const char *body, size_t len, const char *error)
{
    struct call *c = arg;
    if (status < 0) { /* stopping */
        osub__ext_call_free(c);
        return;
    }
    json_t *pod = status == 200 ? json_loadb(body, len, 0, NULL) : NULL;
    char why[300];
    if (pod == NULL) {
        json_t *st = json_loadb(body, len, 0, NULL);
        const char *msg = json_string_value(json_object_get(st, "message"));
        bind_fail(c, "reading pod %s from the API server: %s (HTTP %ld)", c->pod_name,
                  msg     ? msg
                  : error ? error
                          : "no pod in the answer",
                  status);
        json_decref(st);
        return;
    }
    const char *uid = json_string_value(json_object_get(json_object_get(pod, "metadata"), "uid"));
    if (uid == NULL || strcmp(uid, c->uid) != 0) {
        json_decref(pod);
        bind_fail(c, "the pod %s is no longer the one with UID %s", c->pod_name, c->uid);
        return;
    }
    const char *bound =
        json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
    if (bound != NULL && bound[0] != '\0') {
        char b[254];
        snprintf(b, sizeof(b), "%s", bound);
        json_decref(pod);
        if (strcmp(b, c->bind_node) == 0) { /* a retry of a bind that went through */
            osub__ext_log("oversub-scheduler: %s is already bound to %s", c->pod_name, b);
            osub__ext_call_done(c, 200, json_pack("{s:s}", "Error", ""));
        } else {
            bind_fail(c, "the pod %s is already bound to node %s", c->pod_name, b);
        }
        return;
    }
    c->spec = osub_pod_spec(pod, &c->x->cfg.policy, NULL, why, sizeof(why));
    json_decref(pod);
    if (c->spec == NULL) {
        bind_fail(c, "%s", why);
        return;
    }
    bind_submit(c);
}

void osub__ext_bind(struct call *c)
{
    struct osub_ext *x = c->x;
    const char *name = json_string_value(osub_json_get_ci(c->args, "PodName"));
    const char *ns = json_string_value(osub_json_get_ci(c->args, "PodNamespace"));
    const char *uid = json_string_value(osub_json_get_ci(c->args, "PodUID"));
    const char *node = json_string_value(osub_json_get_ci(c->args, "Node"));
    if (name == NULL || uid == NULL || node == NULL) {
        osub__ext_call_done(
            c, 200,
            json_pack("{s:s}", "Error",
                      "a bind needs PodName, PodNamespace, PodUID and Node (strings)"));
        return;
    }
    if (!osub_k8s_name_ok(name, 253) || !osub_k8s_name_ok(node, 253) ||
        (ns != NULL && ns[0] && !osub_k8s_name_ok(ns, 63)) || !osub_k8s_name_ok(uid, 64)) {
        osub__ext_call_done(
            c, 200,
            json_pack("{s:s}", "Error",
                      "PodName, PodNamespace, PodUID and Node must be Kubernetes names "
                      "(lowercase letters, digits, '-' and '.')"));
        return;
    }
    snprintf(c->bind_name, sizeof(c->bind_name), "%s", name);
    snprintf(c->bind_ns, sizeof(c->bind_ns), "%s", ns && ns[0] ? ns : "default");
    snprintf(c->bind_node, sizeof(c->bind_node), "%s", node);
    snprintf(c->uid, sizeof(c->uid), "%s", uid);
    snprintf(c->pod_name, sizeof(c->pod_name), "%s/%s", c->bind_ns, name);
    if (x->kube == NULL) {
        bind_fail(c, "oversub-scheduler has no API server to create the Binding with (give "
                     "--kube-api, or run it in the cluster)");
        return;
    }
    /* the pod as the API server has it, first: it must exist with this UID and be bound
     * nowhere yet, before any node reserves (and evicts) for it */
    char path[600];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", c->bind_ns, name);
    if (osub_kube_request_within(x->kube, "GET", path, NULL, bind_left_ms(c), on_pod_read, c) != 0)
        bind_fail(c, "out of memory");
}
