/* pods.c - evictions that reach Kubernetes pods (pods.h) */
#define _GNU_SOURCE
#include "pods.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>

#include "actuator.h"
#include "idmap.h"
#include "kubeapi.h"

#define RETRY_MS 5000    /* an eviction refused (a disruption budget, the API down): asked again */
#define WATCH_MS 1000    /* an evicted pod: looked at this often until it is gone */
#define SWEEP_MS 10000   /* every pod service: is its pod still there, and still running? */
#define UNBOUND_MS 60000 /* a pod reserved here and still bound nowhere after this: released */

/* Where an eviction of a pod stands. */
enum pod_step {
    POD_ASKING,   /* the Eviction is being asked of the API server */
    POD_HELD,     /* waits until the pod it makes room for is bound here */
    POD_CHECKING, /* held, and the GET of that pod is in flight */
    POD_RETRY,    /* refused (a disruption budget, the API down): asked again */
    POD_EVICTED,  /* accepted: the pod is watched until it is gone */
};

/* A pod being evicted: what the Eviction names, and where it stands. */
struct pod_eviction {
    char ns[254], name[254], uid[128];
    int64_t grace_s;
    enum pod_step step;
    char cause[OSUB_ID_MAX + 1]; /* the service it makes room for ("": none) */
};

struct osubd_pods {
    struct osubd_core *core;
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    struct osubd_act *act; /* which services are pods */
    struct osub_kube *kube;
    struct osubd__idmap *evicting; /* service id -> struct pod_eviction */
    struct event *tick;
    int64_t sweep_at;
    int64_t unbound_ms;            /* UNBOUND_MS, or $OSUB_POD_UNBOUND_MS (a test knob) */
    int64_t sweep_ms;              /* SWEEP_MS, or $OSUB_POD_SWEEP_MS (a test knob) */
    int64_t retry_ms;              /* RETRY_MS, or $OSUB_POD_RETRY_MS (a test knob) */
    int64_t retry_at;              /* refused evictions are asked again from then */
    struct osubd__idmap *sweeping; /* ids whose GET is in flight (records: (void *)1) */
    uint64_t asked, accepted, blocked, failed, gone;
};

struct ask {
    struct osubd_pods *d;
    char id[OSUB_ID_MAX + 1];
    bool watch; /* a GET of the pod, not an eviction */
    bool sweep; /* a GET of the sweep: the pod was not being evicted */
    bool cause; /* a GET of the pod a held eviction makes room for */
};

/* The pod of a service is gone (or done): an evicted one has exited; any other is released. */
static void release_pod(struct osubd_pods *d, const char *id, const char *why)
{
    bool evicted = osubd__idmap_get(d->evicting, id) != NULL;
    osubd__idmap_del(d->evicting, id);
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0)
        return;
    d->gone++;
    osubd_note(d->core, id, "pod", "gone", "%s: %s", id, why);
    char err[256];
    json_t *cmd = json_pack("{s:s, s:s}", "op", evicted ? "exited" : "release", "id", id);
    if (cmd != NULL)
        osubd_apply(d->core, cmd, NULL, err, sizeof(err));
    json_decref(cmd);
}

static void send_eviction(struct osubd_pods *d, const char *id);
static void on_answer(void *arg, long status, const char *body, size_t len, const char *error);

/* A held eviction: is the pod it makes room for bound here yet? Bound: the eviction goes.
 * Gone (its Binding failed, it was deleted): the eviction is dropped and the victim's pod
 * keeps running, counted as leaving until it ends. Not yet: asked again next tick. */
static void cause_answer(struct osubd_pods *d, const char *id, long status, const char *body,
                         size_t len)
{
    struct pod_eviction *e = osubd__idmap_get(d->evicting, id);
    if (e == NULL)
        return;
    e->step = POD_HELD;
    const char *cause = (e->cause[0] ? e->cause : NULL);
    const json_t *ck = cause ? osubd_act_kube(d->act, cause) : NULL;
    if (ck == NULL)
        return; /* the tick drops it */
    json_t *j = status == 200 ? json_loadb(body, len, 0, NULL) : NULL;
    const char *uid = json_string_value(json_object_get(json_object_get(j, "metadata"), "uid"));
    const char *on = json_string_value(json_object_get(json_object_get(j, "spec"), "nodeName"));
    const char *want_uid = json_string_value(json_object_get(ck, "uid"));
    const char *want_node = json_string_value(json_object_get(ck, "node"));
    bool same = uid != NULL && want_uid != NULL && strcmp(uid, want_uid) == 0;
    if (same && on != NULL && want_node != NULL && strcmp(on, want_node) == 0) {
        osubd_note(d->core, id, "pod", "evict-release",
                   "%s: pod %s/%s is bound here: its victim's eviction goes", id,
                   json_string_value(json_object_get(ck, "namespace")),
                   json_string_value(json_object_get(ck, "name")));
        send_eviction(d, id);
    } else if (status == 404 || (status == 200 && !same) || (same && on != NULL && on[0] != '\0')) {
        osubd_warn(d->core, id, "pod", "evict-dropped",
                   "%s: its eviction is not sent: pod %s/%s, which it was to make room for, is "
                   "not bound here (%s); %s keeps running, counted as leaving until it ends",
                   id, json_string_value(json_object_get(ck, "namespace")),
                   json_string_value(json_object_get(ck, "name")),
                   status == 404 ? "deleted"
                   : !same       ? "replaced"
                                 : "bound elsewhere",
                   id);
        osubd__idmap_del(d->evicting, id);
    }
    json_decref(j);
}

static bool unbound_too_long(struct osubd_pods *d, const char *id)
{
    osub_service_info_t si;
    return osub_engine_service_info(d->e, id, &si) == 0 &&
           osubd_engine_now(d->core) - si.submitted_ms > d->unbound_ms;
}

/* The sweep's answer about a pod that was not being evicted: deleted (404), replaced (another
 * UID), or finished (Succeeded, Failed: its containers are gone) releases its service. */
static void sweep_answer(struct osubd_pods *d, const char *id, long status, const char *body,
                         size_t len)
{
    osubd__idmap_del(d->sweeping, id);
    const json_t *k = osubd_act_kube(d->act, id);
    if (k == NULL || osubd__idmap_get(d->evicting, id) != NULL)
        return;
    const char *ns = json_string_value(json_object_get(k, "namespace"));
    const char *name = json_string_value(json_object_get(k, "name"));
    const char *uid = json_string_value(json_object_get(k, "uid"));
    json_t *j = status == 200 ? json_loadb(body, len, 0, NULL) : NULL;
    const char *now_uid = json_string_value(json_object_get(json_object_get(j, "metadata"), "uid"));
    const char *phase = json_string_value(json_object_get(json_object_get(j, "status"), "phase"));
    const char *on = json_string_value(json_object_get(json_object_get(j, "spec"), "nodeName"));
    const char *mine = json_string_value(json_object_get(k, "node"));
    char why[700] = "";
    if (status == 404)
        snprintf(why, sizeof(why), "pod %s/%s was deleted: released", ns, name);
    else if (status == 200 && now_uid != NULL && uid != NULL && strcmp(now_uid, uid) != 0)
        snprintf(why, sizeof(why), "pod %s/%s is another pod now (UID %s): released", ns, name,
                 now_uid);
    else if (status == 200 && (on == NULL || on[0] == '\0') && unbound_too_long(d, id))
        snprintf(why, sizeof(why),
                 "pod %s/%s is still bound nowhere %d s after its reservation here (its Binding "
                 "failed or was never made): released",
                 ns, name, (int)(d->unbound_ms / 1000));
    else if (status == 200 && on != NULL && on[0] != '\0' && mine != NULL && strcmp(on, mine) != 0)
        snprintf(why, sizeof(why), "pod %s/%s is bound to node %s, not here: released", ns, name,
                 on);
    else if (status == 200 && phase != NULL &&
             (strcmp(phase, "Succeeded") == 0 || strcmp(phase, "Failed") == 0))
        snprintf(why, sizeof(why), "pod %s/%s has finished (%s): released", ns, name, phase);
    json_decref(j);
    if (why[0])
        release_pod(d, id, why);
}

/* Every pod service's pod, looked at once per SWEEP_MS: a pod deleted, replaced or finished
 * without oversub evicting it (kubectl delete, a scale-down, a Job done) gives its memory back. */
static void sweep(struct osubd_pods *d)
{
    json_t *ids = osubd_act_pod_ids(d->act);
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v)
    {
        const char *id = json_string_value(v);
        const json_t *k = osubd_act_kube(d->act, id);
        if (osubd__idmap_get(d->evicting, id) != NULL ||
            osubd__idmap_get(d->sweeping, id) != NULL || k == NULL)
            continue;
        struct ask *a = calloc(1, sizeof(*a));
        char path[600];
        snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s",
                 json_string_value(json_object_get(k, "namespace")),
                 json_string_value(json_object_get(k, "name")));
        if (a == NULL)
            break;
        a->d = d;
        a->sweep = true;
        snprintf(a->id, sizeof(a->id), "%s", id);
        if (osub_kube_request(d->kube, "GET", path, NULL, on_answer, a) != 0)
            free(a);
        else
            osubd__idmap_put(d->sweeping, id, (void *)1);
    }
    json_decref(ids);
}

static void on_answer(void *arg, long status, const char *body, size_t len, const char *error)
{
    struct ask *a = arg;
    struct osubd_pods *d = a->d;
    if (a->sweep) {
        if (status >= 0)
            sweep_answer(d, a->id, status, body, len);
        free(a);
        return;
    }
    if (a->cause) {
        if (status >= 0)
            cause_answer(d, a->id, status, body, len);
        free(a);
        return;
    }
    struct pod_eviction *e = status < 0 ? NULL : osubd__idmap_get(d->evicting, a->id);
    if (status < 0 || e == NULL) { /* stopping, or no longer evicting it */
        free(a);
        return;
    }
    const char *ns = e->ns;
    const char *name = e->name;
    const char *uid = e->uid;
    json_t *j = len ? json_loadb(body, len, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(j, "message"));
    if (a->watch) {
        const char *now_uid =
            json_string_value(json_object_get(json_object_get(j, "metadata"), "uid"));
        if (status == 404 || (status == 200 && now_uid != NULL && strcmp(now_uid, uid) != 0)) {
            char why[700];
            snprintf(why, sizeof(why), "pod %s/%s is gone from the API server: released", ns, name);
            release_pod(d, a->id, why);
        }
    } else if (status == 200 || status == 201) {
        d->accepted++;
        e->step = POD_EVICTED;
        osubd_note(d->core, a->id, "pod", "evict",
                   "%s: the API server accepted the eviction of pod %s/%s (grace %llds)", a->id, ns,
                   name, (long long)e->grace_s);
    } else if (status == 404) {
        char why[700];
        snprintf(why, sizeof(why), "pod %s/%s was already gone when evicted", ns, name);
        release_pod(d, a->id, why);
    } else {
        if (status == 429)
            d->blocked++;
        else
            d->failed++;
        e->step = POD_RETRY;
        osubd_warn(d->core, a->id, "pod", status == 429 ? "blocked" : "evict-failed",
                   "%s: evicting pod %s/%s: %s (HTTP %ld); asked again in %d s", a->id, ns, name,
                   msg     ? msg
                   : error ? error
                           : "no reason given",
                   status, (int)((d->retry_ms + 999) / 1000));
    }
    json_decref(j);
    free(a);
}

static void send_eviction(struct osubd_pods *d, const char *id)
{
    struct pod_eviction *e = osubd__idmap_get(d->evicting, id);
    const char *ns = e->ns;
    const char *name = e->name;
    json_t *ev =
        json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:I, s:{s:s}}}", "apiVersion", "policy/v1", "kind",
                  "Eviction", "metadata", "name", name, "namespace", ns, "deleteOptions",
                  "gracePeriodSeconds", e->grace_s, "preconditions", "uid", e->uid);
    char *text = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    struct ask *a = calloc(1, sizeof(*a));
    char path[600];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s/eviction", ns, name);
    if (text == NULL || a == NULL) {
        free(text);
        free(a);
        return; /* out of memory: the tick asks again */
    }
    a->d = d;
    snprintf(a->id, sizeof(a->id), "%s", id);
    e->step = POD_ASKING;
    d->asked++;
    if (osub_kube_request(d->kube, "POST", path, text, on_answer, a) != 0) {
        free(a);
        e->step = POD_RETRY;
    }
    free(text);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_pods *d = arg;
    int64_t now = osubd_now(d->core);
    size_t nk;
    osubd__idmap_key_t *keys = osubd__idmap_keys(d->evicting, &nk); /* the loop deletes */
    for (size_t ki = 0; ki < nk; ki++) {
        const char *id = keys[ki];
        struct pod_eviction *e = osubd__idmap_get(d->evicting, id);
        if (e == NULL)
            continue;
        osub_service_info_t si;
        if (osub_engine_service_info(d->e, id, &si) != 0) {
            osubd__idmap_del(d->evicting, id); /* released some other way */
            continue;
        }
        if (e->step == POD_HELD) {
            const char *cause = (e->cause[0] ? e->cause : NULL);
            const json_t *ck = cause ? osubd_act_kube(d->act, cause) : NULL;
            osub_service_info_t ci;
            if (ck == NULL || osub_engine_service_info(d->e, cause, &ci) != 0) {
                osubd_warn(d->core, id, "pod", "evict-dropped",
                           "%s: its eviction is not sent: %s, which it was to make room for, was "
                           "released before its pod was bound here; %s keeps running, counted "
                           "as leaving until it ends",
                           id, cause ? cause : "?", id);
                osubd__idmap_del(d->evicting, id);
                continue;
            }
            struct ask *a = calloc(1, sizeof(*a));
            char path[600];
            snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s",
                     json_string_value(json_object_get(ck, "namespace")),
                     json_string_value(json_object_get(ck, "name")));
            if (a == NULL)
                continue;
            a->d = d;
            a->cause = true;
            snprintf(a->id, sizeof(a->id), "%s", id);
            e->step = POD_CHECKING;
            if (osub_kube_request(d->kube, "GET", path, NULL, on_answer, a) != 0) {
                free(a);
                e->step = POD_HELD;
            }
        } else if (e->step == POD_RETRY && now >= d->retry_at) {
            send_eviction(d, id);
        } else if (e->step == POD_EVICTED) {
            struct ask *a = calloc(1, sizeof(*a));
            char path[600];
            snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", e->ns, e->name);
            if (a == NULL)
                continue;
            a->d = d;
            a->watch = true;
            snprintf(a->id, sizeof(a->id), "%s", id);
            if (osub_kube_request(d->kube, "GET", path, NULL, on_answer, a) != 0)
                free(a);
        }
    }
    free(keys);
    if (now >= d->retry_at)
        d->retry_at = now + d->retry_ms;
    if (now >= d->sweep_at) {
        d->sweep_at = now + d->sweep_ms;
        sweep(d);
    }
}

void osubd_pods_directive(struct osubd_pods *d, const char *id, const char *action,
                          const char *cause)
{
    const json_t *k = osubd_act_kube(d->act, id);
    if (k == NULL || strcmp(action, "evict") != 0)
        return;
    if (d->kube == NULL) {
        osubd_warn(d->core, id, "pod", "no-api",
                   "%s is pod %s/%s but oversubd has no API server to evict it through "
                   "(kubernetes_api); its directive waits to be read",
                   id, json_string_value(json_object_get(k, "namespace")),
                   json_string_value(json_object_get(k, "name")));
        return;
    }
    if (osubd__idmap_get(d->evicting, id) != NULL)
        return;
    struct pod_eviction *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return; /* out of memory: its directive waits to be read */
    snprintf(e->ns, sizeof(e->ns), "%s", json_string_value(json_object_get(k, "namespace")));
    snprintf(e->name, sizeof(e->name), "%s", json_string_value(json_object_get(k, "name")));
    snprintf(e->uid, sizeof(e->uid), "%s", json_string_value(json_object_get(k, "uid")));
    json_t *gs = json_object_get(k, "grace_seconds");
    e->grace_s = gs != NULL ? json_integer_value(gs) : 30;
    e->step = POD_ASKING;
    if (osubd__idmap_put(d->evicting, id, e) != 0) {
        free(e);
        return;
    }
    /* made room for a pod: not before that pod is bound here (a bind whose Binding fails
     * must not cost a running pod its life) */
    const json_t *ck = cause != NULL && cause[0] ? osubd_act_kube(d->act, cause) : NULL;
    if (ck != NULL) {
        e->step = POD_HELD;
        snprintf(e->cause, sizeof(e->cause), "%s", cause);
        osubd_note(d->core, id, "pod", "evict-held",
                   "%s: eviction of pod %s/%s held until pod %s/%s, which it makes room for, is "
                   "bound here",
                   id, json_string_value(json_object_get(k, "namespace")),
                   json_string_value(json_object_get(k, "name")),
                   json_string_value(json_object_get(ck, "namespace")),
                   json_string_value(json_object_get(ck, "name")));
        return;
    }
    send_eviction(d, id);
}

static void pods_directive(void *arg, const char *id, const char *action, const char *cause)
{
    osubd_pods_directive(arg, id, action, cause);
}

static void pods_metrics(void *ctx, struct evbuffer *b)
{
    osubd_pods_metrics(ctx, b);
}

struct osubd_module osubd_pods_module(struct osubd_pods *p)
{
    struct osubd_module m = {.name = "pods", .ctx = p, .metrics = pods_metrics};
    return m;
}

/* A period: its default, or a test's $NAME when that is a positive number of ms. */
static int64_t knob_ms(const char *name, int64_t dflt)
{
    const char *knob = getenv(name);
    return knob != NULL && atoll(knob) > 0 ? atoll(knob) : dflt;
}

struct osubd_pods *osubd_pods_new(struct osubd_core *c, struct osubd_act *act, char *err,
                                  size_t errlen)
{
    struct osubd_pods *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->evicting = osubd__idmap_new(free)) == NULL ||
        (p->sweeping = osubd__idmap_new(NULL)) == NULL) {
        if (p != NULL)
            osubd__idmap_free(p->evicting);
        free(p);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->core = c;
    p->cfg = osubd_core_config(c);
    p->base = osubd_core_base(c);
    p->e = osubd_core_engine(c);
    p->act = act;
    osubd_act_listen(act, pods_directive, p);
    struct osubd_pods *d = p;
    p->unbound_ms = knob_ms("OSUB_POD_UNBOUND_MS", UNBOUND_MS);
    p->sweep_ms = knob_ms("OSUB_POD_SWEEP_MS", SWEEP_MS);
    p->retry_ms = knob_ms("OSUB_POD_RETRY_MS", RETRY_MS);
    struct osub_kube_opts o;
    osub_kube_opts_default(&o);
    const char *api = d->cfg->kube_api;
    if (strcmp(api, "none") == 0 || (strcmp(api, "auto") == 0 && o.api[0] == '\0'))
        return p;
    if (strcmp(api, "auto") != 0)
        snprintf(o.api, sizeof(o.api), "%s", api);
    if (d->cfg->kube_token_file[0])
        snprintf(o.token_file, sizeof(o.token_file), "%s", d->cfg->kube_token_file);
    if (d->cfg->kube_ca_file[0])
        snprintf(o.ca_file, sizeof(o.ca_file), "%s", d->cfg->kube_ca_file);
    char why[600];
    if (osub_kube_new(d->base, &o, &p->kube, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "kubernetes_api: %s", why);
        osubd_pods_free(p);
        return NULL;
    }
    p->tick = event_new(d->base, -1, EV_PERSIST, on_tick, d);
    struct timeval tv = {WATCH_MS / 1000, (WATCH_MS % 1000) * 1000};
    if (p->tick == NULL || event_add(p->tick, &tv) != 0) {
        snprintf(err, errlen, "out of memory");
        osubd_pods_free(p);
        return NULL;
    }
    printf("pods evicted through the API server at %s\n", osub_kube_api(p->kube));
    return p;
}

void osubd_pods_free(struct osubd_pods *d)
{
    if (d == NULL)
        return;
    if (d->tick)
        event_free(d->tick);
    osub_kube_free(d->kube);
    osubd__idmap_free(d->evicting);
    osubd__idmap_free(d->sweeping);
    free(d);
}

void osubd_pods_metrics(struct osubd_pods *d, struct evbuffer *b)
{
    struct osubd_pods *p = d;
    if (p == NULL)
        return;
    evbuffer_add_printf(
        b,
        "# HELP oversub_pod_evictions_total Evictions of pods asked of the API server, by "
        "answer.\n# TYPE oversub_pod_evictions_total counter\n"
        "oversub_pod_evictions_total{result=\"accepted\"} %llu\n"
        "oversub_pod_evictions_total{result=\"blocked\"} %llu\n"
        "oversub_pod_evictions_total{result=\"failed\"} %llu\n"
        "# HELP oversub_pods_gone_total Pod services released because their pod left.\n"
        "# TYPE oversub_pods_gone_total counter\noversub_pods_gone_total %llu\n",
        (unsigned long long)p->accepted, (unsigned long long)p->blocked,
        (unsigned long long)p->failed, (unsigned long long)p->gone);
}
