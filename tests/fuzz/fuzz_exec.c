/* fuzz_exec.c - libFuzzer target: the actuation fields of a submitted spec
 * (osubd_exec_take, src/daemon/act_take.c: a pure function of struct osubd_take_rules). Any JSON
 * object, as a spec, as the value of a spec's "kubernetes" member, and with a program to run
 * added, under several rules (trusted or not, a node name or none, the destinations list or
 * none, root allowed or not): refused with a sentence and no exec (-1; OSUBD_ACT_FORBIDDEN only
 * for an untrusted spec that runs a program), or nothing taken (no actuation field given), or an
 * exec whose fields are only the known ones, each of a valid type and range and equal to what
 * the spec gave, none of them left in the spec and the rest of the spec untouched. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/http.h>
#include <jansson.h>
#include <pwd.h>
#include <unistd.h>

#include "actuator.h"
#include "netpolicy.h"
#include "pod.h"
#include "suspender.h"

static void check(bool ok)
{
    if (!ok)
        abort();
}

static const char *const fields[] = {"command",        "env",       "workdir",      "user",
                                     "checkpoint_dir", "restart",   "max_restarts", "control_url",
                                     "cuda_shim",      "kubernetes"};
#define N_FIELDS (sizeof(fields) / sizeof(fields[0]))

static bool is_field(const char *k)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (strcmp(k, fields[i]) == 0)
            return true;
    return false;
}

static bool any_field(const json_t *spec)
{
    if (json_object_get(spec, "suspend") != NULL)
        return true;
    for (size_t i = 0; i < N_FIELDS; i++)
        if (json_object_get(spec, fields[i]) != NULL)
            return true;
    return false;
}

/* a string of 1 to max bytes with no NUL in it */
static bool str_ok(const json_t *v, size_t max)
{
    return json_is_string(v) && json_string_length(v) >= 1 && json_string_length(v) <= max &&
           strlen(json_string_value(v)) == json_string_length(v);
}

static bool env_name_ok(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > 128 || (k[0] >= '0' && k[0] <= '9'))
        return false;
    for (const char *p = k; *p; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
              *p == '_'))
            return false;
    if (strncmp(k, "OVERSUB_", 8) == 0)
        return strcmp(k, "OVERSUB_SHIM_LOG") == 0 || strcmp(k, "OVERSUB_SHIM_LIBCUDA") == 0;
    return strcmp(k, "CUDA_VISIBLE_DEVICES") != 0 && strcmp(k, "CUDA_DEVICE_ORDER") != 0;
}

static bool http_url_ok(const char *s)
{
    struct evhttp_uri *u = evhttp_uri_parse(s);
    bool ok = u != NULL && evhttp_uri_get_scheme(u) != NULL &&
              strcmp(evhttp_uri_get_scheme(u), "http") == 0 && evhttp_uri_get_host(u) != NULL;
    if (u != NULL)
        evhttp_uri_free(u);
    return ok;
}

static void check_kube(const json_t *k, const struct osubd_take_rules *r)
{
    check(json_is_object(k));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)k, key, v)
    {
        check(strcmp(key, "namespace") == 0 || strcmp(key, "name") == 0 ||
              strcmp(key, "uid") == 0 || strcmp(key, "node") == 0 ||
              strcmp(key, "grace_seconds") == 0 || strcmp(key, "containers") == 0);
    }
    check(osub_k8s_name_ok(json_string_value(json_object_get(k, "namespace")), 63));
    check(osub_k8s_name_ok(json_string_value(json_object_get(k, "name")), 253));
    check(osub_k8s_name_ok(json_string_value(json_object_get(k, "uid")), 64));
    const json_t *node = json_object_get(k, "node");
    if (node != NULL) {
        check(osub_k8s_name_ok(json_string_value(node), 253));
        if (r->kube_node[0] != '\0')
            check(strcmp(json_string_value(node), r->kube_node) == 0);
    }
    const json_t *g = json_object_get(k, "grace_seconds");
    if (g != NULL)
        check(json_is_integer(g) && json_integer_value(g) >= 0 && json_integer_value(g) <= 604800);
    const json_t *cs = json_object_get(k, "containers");
    if (cs != NULL) {
        check(json_is_array(cs) && json_array_size(cs) <= 64);
        size_t i;
        json_t *c;
        json_array_foreach(cs, i, c)
        {
            const json_t *m = json_object_get(c, "vram_mib");
            check(json_is_object(c) && json_object_size(c) == 2);
            check(osub_k8s_name_ok(json_string_value(json_object_get(c, "name")), 63));
            check(json_is_integer(m) && json_integer_value(m) >= 0 &&
                  json_integer_value(m) <= ((json_int_t)1 << 40));
        }
    }
}

/* The exec's suspend: the mechanism's spec as the suspender reads what was given (normalized:
 * the URL without its trailing slashes), where the rules allow; the spec keeps its own. */
static void check_suspend(const json_t *v, const json_t *given, const struct osubd_take_rules *r)
{
    struct osubd_sus_spec a, b;
    char why[500];
    check(osubd_sus_parse(given, r->dest, &a, why, sizeof(why)) == 0);
    check(osubd_sus_parse(v, NULL, &b, why, sizeof(why)) == 0);
    check(memcmp(&a, &b, sizeof(a)) == 0);
    check(a.method != OSUBD_SUS_CUDA || r->cuda_unusable == NULL);
}

/* An exec osubd_exec_take returned for spec (the spec as given: orig). */
static void check_exec(const json_t *x, const json_t *orig, const struct osubd_take_rules *r,
                       bool trusted)
{
    check(json_is_object(x) && json_object_size(x) > 0);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)x, k, v)
    {
        if (strcmp(k, "suspend") == 0) {
            check_suspend(v, json_object_get(orig, k), r);
            continue;
        }
        check(is_field(k));
        check(json_equal(v, json_object_get(orig, k))); /* as given */
    }
    const json_t *cmd = json_object_get(x, "command");
    bool runs = cmd != NULL;
    if (runs) {
        check(trusted);
        check(json_is_array(cmd) && json_array_size(cmd) >= 1 && json_array_size(cmd) <= 64);
        check(str_ok(json_array_get(cmd, 0), 4096));
        size_t i;
        json_t *a;
        json_array_foreach(cmd, i, a)
        {
            check(json_is_string(a) && json_string_length(a) <= 4096 &&
                  strlen(json_string_value(a)) == json_string_length(a));
        }
        check(json_object_get(x, "kubernetes") == NULL);
    } else {
        /* without a program: only where to send directives and the pod record */
        json_object_foreach((json_t *)x, k, v)
        {
            check(strcmp(k, "control_url") == 0 || strcmp(k, "kubernetes") == 0 ||
                  strcmp(k, "suspend") == 0);
        }
    }
    const json_t *env = json_object_get(x, "env");
    if (env != NULL) {
        check(json_is_object(env) && json_object_size(env) <= 64);
        const char *ek;
        json_t *ev;
        json_object_foreach((json_t *)env, ek, ev)
        {
            check(env_name_ok(ek));
            check(json_is_string(ev) && json_string_length(ev) <= 8192 &&
                  strlen(json_string_value(ev)) == json_string_length(ev));
        }
    }
    static const char *const paths[] = {"workdir", "checkpoint_dir"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *p = json_object_get(x, paths[i]);
        if (p != NULL)
            check(str_ok(p, 1024) && json_string_value(p)[0] == '/');
    }
    const json_t *user = json_object_get(x, "user");
    if (user != NULL)
        check(str_ok(user, 1024));
    const json_t *url = json_object_get(x, "control_url");
    if (url != NULL) {
        check(str_ok(url, 1024) && http_url_ok(json_string_value(url)));
        char why[400];
        check(r->dest == NULL ||
              osubd_url_allowed(r->dest, json_string_value(url), why, sizeof(why)));
    }
    const json_t *rs = json_object_get(x, "restart");
    if (rs != NULL)
        check(json_is_string(rs) && (strcmp(json_string_value(rs), "never") == 0 ||
                                     strcmp(json_string_value(rs), "on-failure") == 0));
    const json_t *shim = json_object_get(x, "cuda_shim");
    if (shim != NULL)
        check(json_is_boolean(shim));
    const json_t *mr = json_object_get(x, "max_restarts");
    if (mr != NULL)
        check(json_is_integer(mr) && json_integer_value(mr) >= 0 && json_integer_value(mr) <= 100);
    const json_t *k8s = json_object_get(x, "kubernetes");
    if (k8s != NULL)
        check_kube(k8s, r);
    /* who the program runs as: root only when allowed (the user field's, else ours) */
    if (runs && !r->allow_root_services) {
        const struct passwd *pw = user != NULL ? getpwnam(json_string_value(user)) : NULL;
        check(user == NULL ? geteuid() != 0 : pw != NULL && pw->pw_uid != 0);
    }
}

/* spec (borrowed) through osubd_exec_take under r, on a copy. */
static void take(const json_t *spec, const struct osubd_take_rules *r, bool trusted)
{
    json_t *copy = json_deep_copy(spec);
    if (copy == NULL)
        return;
    json_t *x = (json_t *)&copy; /* must be overwritten */
    char err[600];
    memset(err, 0, sizeof(err));
    int rc = osubd_exec_take(r, copy, trusted, &x, err, sizeof(err));
    if (rc != 0) {
        check(rc == -1 || rc == OSUBD_ACT_FORBIDDEN);
        check(x == NULL);
        check(err[0] != '\0' && err[sizeof(err) - 1] == '\0'); /* a sentence, terminated */
        if (rc == OSUBD_ACT_FORBIDDEN)
            check(!trusted && json_object_get(spec, "command") != NULL);
    } else if (x == NULL) {
        check(!any_field(spec)); /* nothing given, nothing taken */
        check(json_equal(copy, spec));
    } else {
        check_exec(x, spec, r, trusted);
        /* every actuation field is out of the spec, the rest is as it was */
        for (size_t i = 0; i < N_FIELDS; i++)
            check(json_object_get(copy, fields[i]) == NULL);
        const char *k;
        json_t *v;
        json_object_foreach(copy, k, v)
        {
            check(json_equal(v, json_object_get(spec, k)));
        }
        json_object_foreach((json_t *)spec, k, v)
        {
            check(is_field(k) || json_object_get(copy, k) != NULL);
        }
        /* deterministic: the same spec, the same answer */
        json_t *again = json_deep_copy(spec), *x2 = NULL;
        if (again != NULL) {
            check(osubd_exec_take(r, again, trusted, &x2, err, sizeof(err)) == 0);
            check(json_equal(x, x2));
            json_decref(x2);
            json_decref(again);
        }
        json_decref(x);
    }
    json_decref(copy);
}

/* spec under every rule set. */
static void take_all(const json_t *spec, const struct osubd_destinations *dest)
{
    const struct osubd_take_rules rules[] = {
        {.kube_node = "", .allow_root_services = true, .dest = NULL},
        {.kube_node = "node-a", .allow_root_services = false, .dest = dest},
        {.kube_node = "gpu-1.example", .allow_root_services = true, .dest = dest},
        {.kube_node = "",
         .allow_root_services = true,
         .dest = dest,
         .cuda_unusable = "method cuda cannot be used here: no CUDA driver"},
    };
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) {
        take(spec, &rules[i], false);
        take(spec, &rules[i], true);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct osubd_destinations *dest;
    if (dest == NULL) {
        char err[300];
        check(osubd_parse_destinations("127.0.0.0/8,::1/128,10.0.0.0/8,localhost,hooks.example",
                                       &dest, err, sizeof(err)) == 0);
    }
    /* as the API reads a body: no NUL inside strings, duplicate keys refused */
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return 0;
    }
    take_all(j, dest);
    /* the same object as a pod's record, and with a program to run added */
    json_t *pod = json_pack("{s:s, s:O}", "id", "p", "kubernetes", j);
    if (pod != NULL)
        take_all(pod, dest);
    json_decref(pod);
    if (json_object_get(j, "command") == NULL) {
        json_t *prog = json_deep_copy(j);
        if (prog != NULL &&
            json_object_set_new(prog, "command", json_pack("[s]", "/bin/prog")) == 0)
            take_all(prog, dest);
        json_decref(prog);
    }
    json_decref(j);
    return 0;
}
