/* extender_verbs.c - oversub-scheduler's filter, prioritize and preempt: each node's dry run for
 * the pod (cached), what a decision means to kube-scheduler, and the verbs' answers */
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

/* ---- decisions: a node's dry run for a pod, cached --------------------------------------- */

static void cache_key(char *out, size_t outlen, const char *uid, const char *node)
{
    snprintf(out, outlen, "%s %s", uid, node);
}

/* The cached decision of node for the pod, if fresh and for the same spec. */
static json_t *cached(struct osub_ext *x, const char *uid, struct node *n, const json_t *spec)
{
    char k[400];
    cache_key(k, sizeof(k), uid, n->name);
    json_t *c = json_object_get(x->decisions, k);
    if (c == NULL)
        return NULL;
    if (osub__ext_mono_ms() - json_integer_value(json_object_get(c, "at")) > x->cfg.cache_ms ||
        (uint64_t)json_integer_value(json_object_get(c, "gen")) != n->gen ||
        !json_equal(json_object_get(c, "spec"), spec))
        return NULL;
    return json_object_get(c, "d");
}

void osub__ext_sweep_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_ext *x = arg;
    int64_t now = osub__ext_mono_ms();
    const char *k;
    json_t *v, *tmp;
    json_object_foreach_safe(x->decisions, tmp, k, v)
    {
        if (now - json_integer_value(json_object_get(v, "at")) > x->cfg.cache_ms)
            json_object_del(x->decisions, k);
    }
}

/* ---- asking the nodes ------------------------------------------------------------------- */

/* An answer of a node: what its oversubd would do with the pod. */
static void on_dry(void *arg, int code, json_t *body, const char *why);

struct ask {
    struct call *c;
    char node[254];
    uint64_t gen; /* the node's when asked */
};

/* preempt: which pods a node's oversubd holds (GET /v1/services). */
static void on_services(void *arg, int code, json_t *body, const char *why)
{
    (void)why;
    struct ask *a = arg;
    struct call *c = a->c;
    if (code < 0) {
        free(a);
        if (--c->waiting == 0)
            osub__ext_call_free(c);
        return;
    }
    if (code == 200) {
        json_t *uids = json_array();
        size_t i;
        json_t *sv;
        json_array_foreach(json_object_get(body, "services"), i, sv)
        {
            json_t *u = json_object_get(json_object_get(sv, "kubernetes"), "uid");
            if (json_is_string(u))
                json_array_append(uids, u);
        }
        json_object_set_new(c->held, a->node, uids);
    }
    free(a);
    if (--c->waiting == 0)
        osub__ext_finish(c);
}

void osub__ext_ask_nodes(struct call *c)
{
    struct osub_ext *x = c->x;
    char *text = json_dumps(c->spec, JSON_COMPACT);
    size_t i;
    json_t *nm;
    c->waiting = 1; /* held until every ask is out */
    json_array_foreach(c->names, i, nm)
    {
        const char *name = json_string_value(nm);
        if (json_object_get(c->answers, name) != NULL)
            continue;
        struct node *n = osub__ext_node_get(x, name);
        if (n == NULL) {
            json_object_set_new(
                c->answers, name,
                json_pack("{s:s, s:b}", "error",
                          "no oversubd known on this node (no oversub.io/url annotation and no "
                          "--node)",
                          "unresolvable", 1));
            continue;
        }
        json_t *d = cached(x, c->uid, n, c->spec);
        if (d != NULL) {
            x->node_cached++;
            json_object_set(c->answers, name, d);
            continue;
        }
        if (n->pool_err[0] && n->pool == NULL) {
            /* never answered a pool read: not waited for again on each pod */
            char why[400];
            snprintf(why, sizeof(why), "%s (its last pool read, %lld s ago; it has never answered)",
                     n->pool_err, (long long)((osub__ext_mono_ms() - n->pool_err_ms) / 1000));
            json_object_set_new(c->answers, name, json_pack("{s:s}", "error", why));
            continue;
        }
        struct ask *a = calloc(1, sizeof(*a));
        if (a == NULL || text == NULL) {
            free(a);
            json_object_set_new(c->answers, name, json_pack("{s:s}", "error", "out of memory"));
            continue;
        }
        a->c = c;
        snprintf(a->node, sizeof(a->node), "%s", name);
        a->gen = n->gen;
        x->node_asks++;
        c->waiting++;
        /* asked once per call, however often the name is listed */
        json_object_set_new(c->answers, name, json_pack("{s:s}", "error", "asking"));
        int rc =
            osub__ext_node_send(x, n, EVHTTP_REQ_POST, "/v1/services?dry_run=1", text, on_dry, a);
        if (rc != 0) {
            c->waiting--;
            free(a);
            char why[700];
            if (rc == -2)
                snprintf(why, sizeof(why),
                         "oversubd at %s has %d requests outstanding: it is not keeping up", n->url,
                         NODE_INFLIGHT_MAX);
            else
                snprintf(why, sizeof(why), "cannot reach oversubd at %s", n->url);
            json_object_set_new(c->answers, name, json_pack("{s:s}", "error", why));
        }
    }
    free(text);
    /* preempt: also which pods each node holds, to tell kube-scheduler's victims on oversub's
     * GPUs from those it chose for other resources */
    json_array_foreach(c->names, i, nm)
    {
        struct node *n;
        struct ask *a;
        if (c->verb != V_PREEMPT || !x->cfg.scheduler_counts_vram ||
            (n = osub__ext_node_get(x, json_string_value(nm))) == NULL ||
            (a = calloc(1, sizeof(*a))) == NULL)
            continue;
        a->c = c;
        snprintf(a->node, sizeof(a->node), "%s", json_string_value(nm));
        c->waiting++;
        if (osub__ext_node_send(x, n, EVHTTP_REQ_GET, "/v1/services", NULL, on_services, a) != 0) {
            c->waiting--;
            free(a);
        }
    }
    if (--c->waiting == 0)
        osub__ext_finish(c);
}

static void on_dry(void *arg, int code, json_t *body, const char *why)
{
    struct ask *a = arg;
    struct call *c = a->c;
    struct osub_ext *x = c->x;
    json_t *d = NULL;
    if (code < 0) { /* stopping: nobody is answered */
        free(a);
        if (--c->waiting == 0)
            osub__ext_call_free(c);
        return;
    }
    if (why != NULL) {
        d = json_pack("{s:s}", "error", why);
    } else if (code == 200 || code == 409) {
        d = json_incref(json_object_get(body, "decision"));
        if (d == NULL)
            d = json_pack("{s:s}", "error", "oversubd answered without a decision");
    } else {
        const char *msg =
            json_string_value(json_object_get(json_object_get(body, "error"), "message"));
        char t[400];
        snprintf(t, sizeof(t), "oversubd answered %d: %s", code, msg ? msg : "no reason given");
        /* a spec the node refuses (422, 400): no other pod could change that */
        d = json_pack("{s:s, s:b}", "error", t, "unresolvable", code == 422 || code == 400);
    }
    if (d != NULL) {
        if (json_object_get(d, "error") == NULL) {
            char k[400];
            cache_key(k, sizeof(k), c->uid, a->node);
            json_object_set_new(x->decisions, k,
                                json_pack("{s:O, s:I, s:O, s:I}", "d", d, "at",
                                          (json_int_t)osub__ext_mono_ms(), "spec", c->spec, "gen",
                                          (json_int_t)a->gen));
        }
        json_object_set_new(c->answers, a->node, d);
    }
    free(a);
    if (--c->waiting == 0)
        osub__ext_finish(c);
}

static bool is_evict(const json_t *victim)
{
    const char *a = json_string_value(json_object_get(victim, "action"));
    return a != NULL && strcmp(a, "evict") == 0;
}

/* ---- what a decision means to kube-scheduler --------------------------------------------- */

/* 1: the pod starts there (or after victims); 0: it does not, and preemption of lower-priority
 * pods might help; -1: it does not, and nothing kube-scheduler may do helps. why: the node's
 * own reason. */
int osub__ext_verdict(const json_t *d, char *why, size_t whylen)
{
    const char *err = json_string_value(json_object_get(d, "error"));
    if (err != NULL) {
        snprintf(why, whylen, "%s", err);
        return json_is_true(json_object_get(d, "unresolvable")) ? -1 : 0;
    }
    const char *out = json_string_value(json_object_get(d, "outcome"));
    if (out == NULL) {
        snprintf(why, whylen, "oversubd answered an unknown decision");
        return 0;
    }
    if (strcmp(out, "started") == 0 || strcmp(out, "pending") == 0 || strcmp(out, "exists") == 0)
        return 1;
    const char *check = json_string_value(json_object_get(d, "check"));
    const char *code = json_string_value(json_object_get(d, "code"));
    const char *msg = json_string_value(json_object_get(d, "message"));
    json_int_t gpu = json_integer_value(json_object_get(d, "gpu"));
    json_int_t short_mib = json_integer_value(json_object_get(d, "shortfall_mib"));
    if (code != NULL && strcmp(code, "no_room") != 0) {
        /* refused outright: too big for any GPU here, too many GPUs, a class it does not
         * know... no eviction changes that */
        snprintf(why, whylen, "oversub: %s", msg ? msg : code);
        return -1;
    }
    if (check != NULL && strcmp(check, "none") == 0)
        snprintf(why, whylen, "oversub: it would fit, but it may not go ahead of the queue's head");
    else if (json_object_get(d, "shortfall_mib") != NULL)
        snprintf(why, whylen,
                 "oversub: no room even after degrading and evicting what this pod may displace "
                 "(%s check, GPU %lld short by %lld MiB)",
                 check ? check : "capacity", (long long)gpu, (long long)short_mib);
    else
        snprintf(why, whylen, "oversub: no room even after what this pod may displace (%s check)",
                 check ? check : "capacity");
    /* oversub's plan already counted every service this pod may displace on the node: only
     * services leaving on their own could make room, which preemption cannot hurry */
    return -1;
}

/* The engine's order, as a band and a place in it: started (by placement: the fuller the GPU
 * after it, the better, as oversub packs), then degrade-only, then evictions (the least
 * important touched, fewest evictions, fewest degrades, least restart cost). */
struct rank {
    int band; /* 3 started, 2 degrade-only, 1 evicts, 0 fails */
    double key[4];
};

static double fill_after(const json_t *d, const json_t *spec)
{
    const json_t *g = json_object_get(d, "gpu_now");
    double usable = (double)json_integer_value(json_object_get(g, "usable_mib"));
    double held = (double)json_integer_value(json_object_get(g, "held_mib"));
    int64_t gpus = json_integer_value(json_object_get(spec, "gpus"));
    double share = (double)json_integer_value(json_object_get(spec, "vram_mib")) /
                   (double)(gpus > 0 ? gpus : 1);
    if (usable <= 0)
        return 0;
    double f = (held + share) / usable;
    return f > 1 ? 1 : f < 0 ? 0 : f;
}

static struct rank rank_of(const json_t *d, const json_t *spec)
{
    struct rank r = {0, {0, 0, 0, 0}};
    char why[8];
    if (d == NULL || osub__ext_verdict(d, why, sizeof(why)) != 1)
        return r;
    const json_t *v = json_object_get(d, "victims");
    if (json_array_size(v) == 0) {
        r.band = 3;
        r.key[0] = fill_after(d, spec);
        return r;
    }
    int evictions = 0, degrades = 0, top_level = 1000;
    double cost = 0;
    size_t i;
    json_t *vi;
    json_array_foreach(v, i, vi)
    {
        bool ev = is_evict(vi);
        int lvl = (int)json_integer_value(json_object_get(vi, "level"));
        if (ev) {
            evictions++;
            cost += (double)json_integer_value(json_object_get(vi, "restart_cost_ms"));
            if (lvl < top_level)
                top_level = lvl;
        } else {
            degrades++;
        }
    }
    if (evictions == 0) {
        r.band = 2;
        r.key[0] = -degrades;
        r.key[1] = fill_after(d, spec);
        return r;
    }
    r.band = 1;
    r.key[0] = top_level; /* a higher level number is a less important service */
    r.key[1] = -evictions;
    r.key[2] = -degrades;
    r.key[3] = -cost;
    return r;
}

static int rank_cmp(const struct rank *a, const struct rank *b)
{
    if (a->band != b->band)
        return a->band < b->band ? -1 : 1;
    for (int i = 0; i < 4; i++)
        if (a->key[i] != b->key[i])
            return a->key[i] < b->key[i] ? -1 : 1;
    return 0;
}

/* Bands of scores: started 6-10, degrade-only 4-5, evictions 1-3, fails 0; within a band the
 * best node gets the top and the others spread below by their place among the band's distinct
 * keys (sorted once: O(n log n) for 1,000s of nodes). */
static const struct rank *sort_ranks;

static int by_rank_desc(const void *a, const void *b)
{
    return rank_cmp(&sort_ranks[*(const size_t *)b], &sort_ranks[*(const size_t *)a]);
}

static void scores(struct call *c, int64_t *out)
{
    size_t n = json_array_size(c->names);
    struct rank *r = calloc(n ? n : 1, sizeof(*r));
    size_t *ix = calloc(n ? n : 1, sizeof(*ix));
    size_t *place = calloc(n ? n : 1, sizeof(*place));
    if (r == NULL || ix == NULL || place == NULL) {
        for (size_t i = 0; i < n; i++)
            out[i] = 0;
        free(r);
        free(ix);
        free(place);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        r[i] = rank_of(json_object_get(c->answers, json_string_value(json_array_get(c->names, i))),
                       c->spec);
        ix[i] = i;
    }
    sort_ranks = r;
    qsort(ix, n, sizeof(*ix), by_rank_desc); /* best first: bands in order, keys within */
    size_t distinct[4] = {0, 0, 0, 0};
    for (size_t k = 0; k < n; k++) {
        size_t i = ix[k];
        if (k == 0 || r[ix[k - 1]].band != r[i].band || rank_cmp(&r[ix[k - 1]], &r[i]) != 0)
            distinct[r[i].band]++;
        place[i] = distinct[r[i].band] - 1; /* 0: the band's best */
    }
    static const int lo[4] = {0, 1, 4, 6}, hi[4] = {0, 3, 5, 10};
    for (size_t i = 0; i < n; i++) {
        int b = r[i].band, span = hi[b] - lo[b];
        size_t nd = distinct[b];
        out[i] =
            nd <= 1 ? hi[b] : hi[b] - (int64_t)llround((double)place[i] * span / (double)(nd - 1));
    }
    free(r);
    free(ix);
    free(place);
}

/* ---- the verbs' answers ------------------------------------------------------------------ */

static void finish_filter(struct call *c)
{
    json_t *pass = json_array(), *failed = json_object(), *unres = json_object();
    size_t i;
    json_t *nm;
    json_array_foreach(c->names, i, nm)
    {
        const char *name = json_string_value(nm);
        char why[512];
        int v;
        if (c->bad_pod[0]) {
            snprintf(why, sizeof(why), "%s", c->bad_pod);
            v = -1;
        } else if (c->spec == NULL) {
            v = 1; /* it asks nothing of oversub */
        } else {
            v = osub__ext_verdict(json_object_get(c->answers, name), why, sizeof(why));
        }
        if (v == 1)
            json_array_append(pass, nm);
        else
            json_object_set_new(v == 0 ? failed : unres, name, json_string(why));
    }
    osub__ext_log(
        "oversub-scheduler: filter %s: %zu of %zu nodes pass, %zu failed, %zu unresolvable",
        c->pod_name, json_array_size(pass), json_array_size(c->names), json_object_size(failed),
        json_object_size(unres));
    json_t *res = json_object();
    /* nodeCacheCapable: names; else the Node objects that passed, as given */
    json_t *nodes = osub_json_get_ci(c->args, "Nodes");
    if (json_is_object(nodes)) {
        json_t *items = json_array();
        json_array_foreach(json_object_get(nodes, "items"), i, nm)
        {
            const char *name =
                json_string_value(json_object_get(json_object_get(nm, "metadata"), "name"));
            size_t k;
            json_t *p;
            json_array_foreach(pass, k, p)
            {
                if (name && strcmp(json_string_value(p), name) == 0) {
                    json_array_append(items, nm);
                    break;
                }
            }
        }
        json_object_set_new(res, "Nodes", json_pack("{s:{}, s:o}", "metadata", "items", items));
        json_object_set_new(res, "NodeNames", json_null());
        json_decref(pass);
    } else {
        json_object_set_new(res, "Nodes", json_null());
        json_object_set_new(res, "NodeNames", pass);
    }
    json_object_set_new(res, "FailedNodes", failed);
    json_object_set_new(res, "FailedAndUnresolvableNodes", unres);
    json_object_set_new(res, "Error", json_string(""));
    osub__ext_call_done(c, 200, res);
}

static void finish_prioritize(struct call *c)
{
    size_t n = json_array_size(c->names);
    int64_t *sc = calloc(n ? n : 1, sizeof(*sc));
    json_t *out = json_array();
    if (sc != NULL && c->spec != NULL && !c->bad_pod[0])
        scores(c, sc);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(out, json_pack("{s:O, s:I}", "Host", json_array_get(c->names, i),
                                             "Score", (json_int_t)(sc ? sc[i] : 0)));
    free(sc);
    osub__ext_call_done(c, 200, out);
}

/* The UIDs kube-scheduler proposed for a node (meta victims, or full pods). */
static json_t *proposed_uids(const json_t *v)
{
    json_t *out = json_array();
    size_t i;
    json_t *p;
    json_array_foreach(osub_json_get_ci(v, "Pods"), i, p)
    {
        const char *uid = json_string_value(osub_json_get_ci(p, "UID"));
        if (uid == NULL)
            uid = json_string_value(json_object_get(json_object_get(p, "metadata"), "uid"));
        if (uid != NULL)
            json_array_append_new(out, json_string(uid));
    }
    return out;
}

json_t *osub__ext_victim_map(const json_t *args)
{
    json_t *m = osub_json_get_ci(args, "NodeNameToMetaVictims");
    if (!json_is_object(m))
        m = osub_json_get_ci(args, "NodeNameToVictims");
    return json_is_object(m) ? m : NULL;
}

static bool uid_in(const json_t *arr, const char *uid, const char *key)
{
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        const char *u = json_string_value(key ? json_object_get(e, key) : e);
        if (u != NULL && strcmp(u, uid) == 0)
            return true;
    }
    return false;
}

/* Per node: where oversub would not start the pod, the node is dropped. Where it would, the
 * victims kube-scheduler chose stand: with ignoredByScheduler (the shipped configuration) they
 * were chosen for what kube-scheduler counts itself (CPU, memory), and oversub's own victims
 * are evicted by the node at bind, degrade first, with their grace and their disruption budgets
 * (kube-scheduler would merely delete them). With --scheduler-counts-vram, kube-scheduler also
 * counted oversub.io/vram-mib itself, naively: its victims that are pods on oversub's GPUs and
 * that oversub would not evict are spared. A node left with no victim is dropped; nodes oversub
 * makes room on by degrading only are counted apart. */
static void finish_preempt(struct call *c)
{
    struct osub_ext *x = c->x;
    json_t *out = json_object();
    json_t *in = osub__ext_victim_map(c->args);
    const char *name;
    json_t *v;
    size_t kept = 0, degrade_only = 0, dropped = 0, spared = 0;
    json_object_foreach(in, name, v)
    {
        json_t *sched = proposed_uids(v);
        json_t *pods = json_array();
        int64_t pdb = json_integer_value(osub_json_get_ci(v, "NumPDBViolations"));
        bool keep_all = c->spec == NULL && !c->bad_pod[0]; /* asks nothing of oversub */
        json_t *d = json_object_get(c->answers, name);
        char why[512] = "";
        if (!keep_all && !c->bad_pod[0] && osub__ext_verdict(d, why, sizeof(why)) == 1) {
            size_t k, evictions = 0;
            json_t *u;
            json_array_foreach(json_object_get(d, "victims"), k, u) evictions += is_evict(u);
            if (evictions == 0 && json_array_size(json_object_get(d, "victims")) > 0)
                degrade_only++;
            json_t *held = x->cfg.scheduler_counts_vram ? json_object_get(c->held, name) : NULL;
            json_array_foreach(sched, k, u)
            {
                const char *uid = json_string_value(u);
                bool oversub_evicts = false;
                size_t j;
                json_t *w;
                json_array_foreach(json_object_get(d, "victims"), j, w)
                {
                    const char *pu = json_string_value(json_object_get(w, "pod_uid"));
                    oversub_evicts = oversub_evicts || (is_evict(w) && pu && strcmp(pu, uid) == 0);
                }
                if (held != NULL && uid_in(held, uid, NULL) && !oversub_evicts) {
                    spared++; /* on oversub's GPUs, and oversub says it need not go */
                    continue;
                }
                json_array_append_new(pods, json_pack("{s:O}", "UID", u));
            }
        } else if (keep_all) {
            size_t k;
            json_t *u;
            json_array_foreach(sched, k, u)
                json_array_append_new(pods, json_pack("{s:O}", "UID", u));
        } else if (why[0]) {
            osub__ext_log("oversub-scheduler: preempt %s: %s dropped: %s", c->pod_name, name, why);
        }
        if (json_array_size(pods) > 0) {
            json_object_set_new(
                out, name,
                json_pack("{s:o, s:I}", "Pods", pods, "NumPDBViolations", (json_int_t)pdb));
            kept++;
        } else {
            json_decref(pods);
            dropped++;
        }
        json_decref(sched);
    }
    x->preempt_degrade_only += degrade_only;
    osub__ext_log(
        "oversub-scheduler: preempt %s: %zu nodes kept, %zu dropped, %zu of kube-scheduler's "
        "victims spared on oversub's GPUs; %zu degrade-only (oversub makes room there by "
        "degrading, no pod of its need go)",
        c->pod_name, kept, dropped, spared, degrade_only);
    osub__ext_call_done(c, 200, json_pack("{s:o}", "NodeNameToMetaVictims", out));
}

void osub__ext_finish(struct call *c)
{
    switch (c->verb) {
    case V_FILTER:
        finish_filter(c);
        break;
    case V_PRIORITIZE:
        finish_prioritize(c);
        break;
    case V_PREEMPT:
        finish_preempt(c);
        break;
    default:
        osub__ext_call_done(c, 500, json_pack("{s:s}", "Error", "internal: no such verb"));
    }
}
