/* pod.c - a Kubernetes Pod read as an oversub service spec (pod.h) */
#include "pod.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define MAX_EXACT ((int64_t)1 << 53)

void osub_pod_policy_default(struct osub_pod_policy *p)
{
    p->online_min = 1000;
    p->batch_min = 0;
}

json_t *osub_json_get_ci(const json_t *obj, const char *key)
{
    if (!json_is_object(obj))
        return NULL;
    json_t *v = json_object_get(obj, key);
    if (v != NULL)
        return v;
    const char *k;
    json_object_foreach((json_t *)obj, k, v)
    {
        if (strcasecmp(k, key) == 0)
            return v;
    }
    return NULL;
}

int osub_k8s_quantity(const char *s, int64_t *out)
{
    if (s == NULL || *s == '\0' || strlen(s) > 64)
        return -1;
    const char *p = s;
    if (*p == '+')
        p++;
    int64_t m = 0;
    int frac = 0, digits = 0;
    bool dot = false;
    for (; *p && (isdigit((unsigned char)*p) || *p == '.'); p++) {
        if (*p == '.') {
            if (dot)
                return -1;
            dot = true;
            continue;
        }
        if (++digits > 30 || __builtin_mul_overflow(m, 10, &m) ||
            __builtin_add_overflow(m, *p - '0', &m))
            return -1;
        if (dot)
            frac++;
    }
    if (digits == 0)
        return -1;
    int64_t mul = 1;
    int exp10 = 0;
    static const struct {
        const char *suf;
        int bin, dec;
    } sufs[] = {{"Ki", 10, 0}, {"Mi", 20, 0}, {"Gi", 30, 0}, {"Ti", 40, 0}, {"Pi", 50, 0},
                {"Ei", 60, 0}, {"k", 0, 3},   {"M", 0, 6},   {"G", 0, 9},   {"T", 0, 12},
                {"P", 0, 15},  {"E", 0, 18},  {"m", 0, -3},  {"u", 0, -6},  {"n", 0, -9}};
    if (*p == 'e' || *p == 'E') {
        if (p[1] == '\0') {
            exp10 = 18; /* "E": exa */
            p++;
        } else {
            p++;
            int sign = 1, e = 0, nd = 0;
            if (*p == '+' || *p == '-')
                sign = *p++ == '-' ? -1 : 1;
            for (; isdigit((unsigned char)*p); p++, nd++)
                if ((e = e * 10 + (*p - '0')) > 40)
                    return -1;
            if (nd == 0)
                return -1;
            exp10 = sign * e;
        }
    } else if (*p) {
        bool found = false;
        for (size_t i = 0; i < sizeof(sufs) / sizeof(sufs[0]); i++) {
            if (strcmp(p, sufs[i].suf) == 0) {
                mul = (int64_t)1 << sufs[i].bin;
                exp10 = sufs[i].dec;
                found = true;
                p += strlen(sufs[i].suf);
                break;
            }
        }
        if (!found)
            return -1;
    }
    if (*p != '\0')
        return -1;
    exp10 -= frac;
    int64_t v;
    if (__builtin_mul_overflow(m, mul, &v))
        return -1;
    for (; exp10 > 0; exp10--)
        if (__builtin_mul_overflow(v, 10, &v) || v > MAX_EXACT)
            return -1;
    for (; exp10 < 0; exp10++) {
        if (v % 10 != 0)
            return -1; /* not a whole number */
        v /= 10;
    }
    if (v > MAX_EXACT)
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* A container's oversub.io/vram-mib: its limit, else its request, else 0. */
static int container_vram(const json_t *c, int64_t *mib, char *why, size_t whylen)
{
    const json_t *res = json_object_get(c, "resources");
    const json_t *lim = json_object_get(json_object_get(res, "limits"), OSUB_K8S_RESOURCE);
    const json_t *req = json_object_get(json_object_get(res, "requests"), OSUB_K8S_RESOURCE);
    const json_t *q = lim != NULL ? lim : req;
    *mib = 0;
    if (q == NULL)
        return 0;
    const char *name = json_string_value(json_object_get(c, "name"));
    int64_t v;
    if (json_is_integer(q) && json_integer_value(q) >= 0)
        v = json_integer_value(q);
    else if (!json_is_string(q) || osub_k8s_quantity(json_string_value(q), &v) != 0) {
        snprintf(why, whylen, "container '%.63s': %s must be a whole number of MiB",
                 name ? name : "?", OSUB_K8S_RESOURCE);
        return -1;
    }
    *mib = v;
    return 0;
}

int osub_pod_vram(const json_t *pod, int64_t *mib, char *why, size_t whylen)
{
    const json_t *spec = json_object_get(pod, "spec");
    int64_t sum = 0, init_max = 0, v;
    size_t i;
    json_t *c;
    *mib = 0;
    json_array_foreach(json_object_get(spec, "containers"), i, c)
    {
        if (container_vram(c, &v, why, whylen) != 0)
            return -1;
        sum += v;
        if (sum > MAX_EXACT) {
            snprintf(why, whylen, "%s summed over the containers is too large", OSUB_K8S_RESOURCE);
            return -1;
        }
    }
    json_array_foreach(json_object_get(spec, "initContainers"), i, c)
    {
        if (container_vram(c, &v, why, whylen) != 0)
            return -1;
        if (v > init_max)
            init_max = v;
    }
    *mib = sum > init_max ? sum : init_max;
    return 0;
}

bool osub_k8s_name_ok(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
            return false;
    return true;
}

int osub_pod_service_id(const char *uid, char *out, size_t outlen)
{
    size_t n = uid ? strlen(uid) : 0;
    if (n == 0 || n > 58 || outlen < n + 5)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char c = uid[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
            return -1;
    }
    snprintf(out, outlen, "pod-%s", uid);
    return 0;
}

/* An annotation holding a whole number in [lo, hi]: 0 (absent: *out untouched), or -1. */
static int ann_int(const json_t *ann, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   char *why, size_t whylen)
{
    const json_t *v = json_object_get(ann, key);
    if (v == NULL)
        return 0;
    int64_t x;
    if (!json_is_string(v) || osub_k8s_quantity(json_string_value(v), &x) != 0 || x < lo ||
        x > hi) {
        snprintf(why, whylen, "annotation %s must be a whole number from %lld to %lld", key,
                 (long long)lo, (long long)hi);
        return -1;
    }
    *out = x;
    return 0;
}

json_t *osub_pod_spec(const json_t *pod, const struct osub_pod_policy *pol, const char *node,
                      char *why, size_t whylen)
{
    const json_t *meta = json_object_get(pod, "metadata");
    const json_t *spec = json_object_get(pod, "spec");
    const json_t *ann = json_object_get(meta, "annotations");
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *uid = json_string_value(json_object_get(meta, "uid"));
    char id[64];
    if (!json_is_object(meta) || name == NULL || uid == NULL) {
        snprintf(why, whylen, "the pod has no metadata.name or metadata.uid");
        return NULL;
    }
    if (ns == NULL || ns[0] == '\0')
        ns = "default";
    if (osub_pod_service_id(uid, id, sizeof(id)) != 0) {
        snprintf(why, whylen, "metadata.uid '%.64s' is not a Kubernetes UID", uid);
        return NULL;
    }
    int64_t vram;
    if (osub_pod_vram(pod, &vram, why, whylen) != 0)
        return NULL;
    if (vram <= 0) {
        snprintf(why, whylen, "the pod asks for no %s", OSUB_K8S_RESOURCE);
        return NULL;
    }
    /* the class: the annotation, else the pod's priority */
    const char *cls = json_string_value(json_object_get(ann, "oversub.io/class"));
    if (json_object_get(ann, "oversub.io/class") != NULL) {
        if (cls == NULL || cls[0] == '\0' || strlen(cls) > 31) {
            snprintf(why, whylen,
                     "annotation oversub.io/class must name a class (online, "
                     "batch, experiment)");
            return NULL;
        }
        for (const char *p = cls; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-')) {
                snprintf(why, whylen, "annotation oversub.io/class '%.31s' is not a class name",
                         cls);
                return NULL;
            }
    } else {
        const json_t *pr = json_object_get(spec, "priority");
        int64_t prio = json_is_integer(pr) ? json_integer_value(pr) : 0;
        cls = prio >= pol->online_min ? "online" : prio >= pol->batch_min ? "batch" : "experiment";
    }
    int64_t gpus = 1, floor = -1, bs = -1, mbs = -1, grace = -1, cost = -1;
    const json_t *tg = json_object_get(spec, "terminationGracePeriodSeconds");
    if (json_is_integer(tg) && json_integer_value(tg) >= 0)
        grace = json_integer_value(tg);
    if (ann_int(ann, "oversub.io/gpus", 1, 64, &gpus, why, whylen) != 0 ||
        ann_int(ann, "oversub.io/min-vram-mib", 0, vram, &floor, why, whylen) != 0 ||
        ann_int(ann, "oversub.io/batch-size", 1, 1 << 20, &bs, why, whylen) != 0 ||
        ann_int(ann, "oversub.io/min-batch-size", 1, 1 << 20, &mbs, why, whylen) != 0 ||
        ann_int(ann, "oversub.io/grace-seconds", 0, 86400, &grace, why, whylen) != 0 ||
        ann_int(ann, "oversub.io/restart-cost-seconds", 0, 86400, &cost, why, whylen) != 0)
        return NULL;
    if (grace < 0)
        grace = 30; /* Kubernetes' default terminationGracePeriodSeconds */
    if (grace > 86400)
        grace = 86400;
    const char *ex = json_string_value(json_object_get(ann, "oversub.io/exclusive"));
    bool exclusive = ex != NULL && strcmp(ex, "true") == 0;
    if (ex != NULL && !exclusive && strcmp(ex, "false") != 0) {
        snprintf(why, whylen, "annotation oversub.io/exclusive must be \"true\" or \"false\"");
        return NULL;
    }
    json_t *s =
        json_pack("{s:s, s:s, s:I, s:I, s:b, s:s, s:I, s:b}", "id", id, "class", cls, "vram_mib",
                  (json_int_t)vram, "gpus", (json_int_t)gpus, "queue", 0, "on_evict", "release",
                  "grace_ms", (json_int_t)(grace * 1000), "exclusive", exclusive);
    if (s == NULL) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    if (floor >= 0)
        json_object_set_new(s, "min_vram_mib", json_integer(floor));
    if (bs > 0)
        json_object_set_new(s, "batch_size", json_integer(bs));
    if (mbs > 0)
        json_object_set_new(s, "min_batch_size", json_integer(mbs));
    if (cost >= 0)
        json_object_set_new(s, "restart_cost_ms", json_integer(cost * 1000));
    /* the pod it is: what the node evicts through the API server, and what its device plugin
     * hands each container */
    json_t *ctrs = json_array();
    size_t i;
    json_t *c;
    /* every container the kubelet asks the device plugin for: init containers first */
    static const char *const lists[] = {"initContainers", "containers"};
    for (int l = 0; l < 2; l++)
        json_array_foreach(json_object_get(spec, lists[l]), i, c)
        {
            int64_t v = 0;
            const char *cn = json_string_value(json_object_get(c, "name"));
            if (container_vram(c, &v, why, whylen) == 0 && v > 0 && cn != NULL)
                json_array_append_new(
                    ctrs, json_pack("{s:s, s:I}", "name", cn, "vram_mib", (json_int_t)v));
        }
    json_t *k = json_pack("{s:s, s:s, s:s, s:I, s:o}", "namespace", ns, "name", name, "uid", uid,
                          "grace_seconds", (json_int_t)grace, "containers", ctrs);
    if (k != NULL && node != NULL)
        json_object_set_new(k, "node", json_string(node));
    if (k == NULL) {
        json_decref(s);
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    json_object_set_new(s, "kubernetes", k);
    return s;
}
