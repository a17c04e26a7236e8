/* act_take.c - the spec's actuation fields (command, env, workdir, user, checkpoint_dir, restart,
 * control_url, kubernetes) taken and checked */
#define _GNU_SOURCE
#include "act.h"
#include "suspender.h"

static bool is_http_url(const char *s)
{
    struct evhttp_uri *u = s ? evhttp_uri_parse(s) : NULL;
    bool ok = u != NULL && evhttp_uri_get_scheme(u) != NULL &&
              strcmp(evhttp_uri_get_scheme(u), "http") == 0 && evhttp_uri_get_host(u) != NULL;
    if (u)
        evhttp_uri_free(u);
    return ok;
}

static bool env_name_ok(const char *k)
{
    if (k[0] == '\0' || (k[0] >= '0' && k[0] <= '9') || strlen(k) > 128)
        return false;
    for (const char *p = k; *p; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
              *p == '_'))
            return false;
    return true;
}

/* Root, or a dedicated user given CAP_SETUID and CAP_SETGID (deploy/systemd/oversubd.service's
 * AmbientCapabilities): may run a service as another user. */
static bool can_switch_users(void)
{
    if (geteuid() == 0)
        return true;
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    unsigned long long eff = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "CapEff:", 7) == 0)
            eff = strtoull(line + 7, NULL, 16);
    if (f != NULL)
        fclose(f);
    return (eff & (1ULL << 7)) && (eff & (1ULL << 6)); /* CAP_SETUID, CAP_SETGID */
}

/* The pod a service is ({"namespace", "name", "uid", "node"?, "grace_seconds"?, "containers"?:
 * [{"name", "vram_mib"}]}), checked and copied: what evicts it through the API server and what
 * the device plugin hands its containers. NULL with why. */
static json_t *kube_record(const json_t *v, char *why, size_t whylen)
{
    const char *ns = json_string_value(json_object_get(v, "namespace"));
    const char *name = json_string_value(json_object_get(v, "name"));
    const char *uid = json_string_value(json_object_get(v, "uid"));
    const char *node = json_string_value(json_object_get(v, "node"));
    const json_t *grace = json_object_get(v, "grace_seconds");
    const json_t *ctrs = json_object_get(v, "containers");
    const char *k;
    json_t *e;
    if (!json_is_object(v)) {
        snprintf(why, whylen,
                 "must be an object {namespace, name, uid, node, grace_seconds, "
                 "containers}");
        return NULL;
    }
    json_object_foreach((json_t *)v, k, e)
    {
        if (strcmp(k, "namespace") != 0 && strcmp(k, "name") != 0 && strcmp(k, "uid") != 0 &&
            strcmp(k, "node") != 0 && strcmp(k, "grace_seconds") != 0 &&
            strcmp(k, "containers") != 0) {
            snprintf(why, whylen, "unknown field '%.64s'", k);
            return NULL;
        }
    }
    if (!osub_k8s_name_ok(ns, 63) || !osub_k8s_name_ok(name, 253) || !osub_k8s_name_ok(uid, 64) ||
        (json_object_get(v, "node") != NULL && !osub_k8s_name_ok(node, 253))) {
        snprintf(why, whylen,
                 "namespace, name and uid (and node, when given) must be "
                 "Kubernetes names: lowercase letters, digits, '-' and '.'");
        return NULL;
    }
    if (grace != NULL && (!json_is_integer(grace) || json_integer_value(grace) < 0 ||
                          json_integer_value(grace) > 86400 * 7)) {
        snprintf(why, whylen, "grace_seconds must be an integer from 0 to 604800");
        return NULL;
    }
    if (ctrs != NULL) {
        size_t i;
        if (!json_is_array(ctrs) || json_array_size(ctrs) > 64) {
            snprintf(why, whylen, "containers must be an array of at most 64 {name, vram_mib}");
            return NULL;
        }
        json_array_foreach(ctrs, i, e)
        {
            const json_t *m = json_object_get(e, "vram_mib");
            if (!json_is_object(e) || json_object_size(e) != 2 ||
                !osub_k8s_name_ok(json_string_value(json_object_get(e, "name")), 63) ||
                !json_is_integer(m) || json_integer_value(m) < 0 ||
                json_integer_value(m) > ((json_int_t)1 << 40)) {
                snprintf(why, whylen,
                         "containers[%zu] must be {\"name\": a container name, \"vram_mib\": "
                         "0 to 2^40}",
                         i);
                return NULL;
            }
        }
    }
    return json_deep_copy(v);
}

/* The spec's suspend (v): the mechanism's own fields, checked here (where it may connect); the
 * spec keeps the field for the engine (the method and the residual). Returned owned, or NULL
 * with err. */
static json_t *take_suspend(const struct osubd_take_rules *d, const json_t *spec, const json_t *v,
                            char *err, size_t errlen)
{
    struct osubd_sus_spec sp;
    char why[500];
    bool relocate = json_is_true(json_object_get(v, "relocate"));
    if (osubd_sus_parse(v, d->dest, &sp, why, sizeof(why)) != 0)
        snprintf(err, errlen, "%s", why);
    else if (sp.method == OSUBD_SUS_CUDA && d->cuda_unusable != NULL)
        snprintf(err, errlen, "field 'suspend': %s", d->cuda_unusable);
    else if (relocate && d->relocate_unusable != NULL)
        snprintf(err, errlen, "field 'suspend.relocate': %s", d->relocate_unusable);
    else if (relocate && json_object_get(spec, "kubernetes") != NULL)
        snprintf(err, errlen,
                 "field 'suspend.relocate' is for services oversubd starts (a pod's "
                 "GPUs are the kubelet's to choose)");
    else if (relocate && json_object_get(spec, "command") == NULL)
        snprintf(err, errlen,
                 "field 'suspend.relocate' is for services oversubd starts (give 'command'): the "
                 "driver remaps only a process started seeing every GPU, as oversubd starts it");
    else {
        json_t *o = osubd_sus_spec_json(&sp);
        if (o != NULL && relocate)
            json_object_set_new(o, "relocate", json_true());
        return o;
    }
    return NULL;
}

int osubd_exec_take(const struct osubd_take_rules *d, json_t *spec, bool trusted, json_t **exec,
                    char *err, size_t errlen)
{
    *exec = NULL;
    json_t *x = json_object();
    json_t *v;
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        json_decref(x);                                                                            \
        return -1;                                                                                 \
    } while (0)
    if ((v = json_object_get(spec, "command")) != NULL) {
        if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > MAX_ARGS)
            FAIL("field 'command' must be an array of 1 to %d strings (argv; no shell)", MAX_ARGS);
        size_t i;
        json_t *a;
        json_array_foreach(v, i, a)
        {
            if (!json_is_string(a) || json_string_length(a) > 4096 ||
                strlen(json_string_value(a)) != json_string_length(a))
                FAIL("field 'command': entry %zu must be a string (no NUL, at most 4096 bytes)", i);
        }
        if (json_string_length(json_array_get(v, 0)) == 0)
            FAIL("field 'command': the program (entry 0) is empty");
        json_object_set(x, "command", v);
    }
    if ((v = json_object_get(spec, "env")) != NULL) {
        if (!json_is_object(v) || json_object_size(v) > MAX_ENV)
            FAIL("field 'env' must be an object of at most %d NAME: \"value\" pairs", MAX_ENV);
        const char *k;
        json_t *ev;
        json_object_foreach(v, k, ev)
        {
            if (!env_name_ok(k))
                FAIL("field 'env': '%.64s' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", k);
            bool shim_knob =
                strcmp(k, "OVERSUB_SHIM_LOG") == 0 || strcmp(k, "OVERSUB_SHIM_LIBCUDA") == 0;
            if ((strncmp(k, "OVERSUB_", 8) == 0 && !shim_knob) ||
                strcmp(k, "CUDA_VISIBLE_DEVICES") == 0 || strcmp(k, "CUDA_DEVICE_ORDER") == 0)
                FAIL("field 'env': %s is set by oversubd", k);
            if (!json_is_string(ev) || json_string_length(ev) > 8192 ||
                strlen(json_string_value(ev)) != json_string_length(ev))
                FAIL("field 'env': the value of %s must be a string (no NUL, at most 8192 bytes)",
                     k);
        }
        json_object_set(x, "env", v);
    }
    static const char *const paths[] = {"workdir", "checkpoint_dir", "user", "control_url"};
    for (size_t k = 0; k < sizeof(paths) / sizeof(paths[0]); k++) {
        if ((v = json_object_get(spec, paths[k])) == NULL)
            continue;
        const char *s = json_string_value(v);
        if (s == NULL || s[0] == '\0' || strlen(s) > 1024)
            FAIL("field '%s' must be a non-empty string", paths[k]);
        if (k < 2 && s[0] != '/')
            FAIL("field '%s' must be an absolute path", paths[k]);
        if (k == 3 && !is_http_url(s))
            FAIL("field 'control_url' must be an http:// URL");
        char why[400];
        if (k == 3 && d->dest != NULL && !osubd_url_allowed(d->dest, s, why, sizeof(why)))
            FAIL("field 'control_url': %s", why);
        json_object_set(x, paths[k], v);
    }
    if ((v = json_object_get(spec, "restart")) != NULL) {
        const char *s = json_string_value(v);
        if (s == NULL || (strcmp(s, "never") != 0 && strcmp(s, "on-failure") != 0))
            FAIL("field 'restart' must be \"never\" or \"on-failure\"");
        json_object_set(x, "restart", v);
    }
    if ((v = json_object_get(spec, "cuda_shim")) != NULL) {
        if (!json_is_boolean(v))
            FAIL("field 'cuda_shim' must be true or false (false: run without liboversub-cuda.so)");
        json_object_set(x, "cuda_shim", v);
    }
    if ((v = json_object_get(spec, "max_restarts")) != NULL) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100)
            FAIL("field 'max_restarts' must be an integer from 0 to 100");
        json_object_set(x, "max_restarts", v);
    }
    if ((v = json_object_get(spec, "suspend")) != NULL) {
        json_t *sus = take_suspend(d, spec, v, err, errlen);
        if (sus == NULL) {
            json_decref(x);
            return -1;
        }
        json_object_set_new(x, "suspend", sus);
    }
    if ((v = json_object_get(spec, "kubernetes")) != NULL) {
        char why[300];
        json_t *k = kube_record(v, why, sizeof(why));
        if (k == NULL)
            FAIL("field 'kubernetes': %s", why);
        json_object_set_new(x, "kubernetes", k);
        /* a pod bound to another node is not this oversubd's to hold, nor to evict */
        const char *node = json_string_value(json_object_get(k, "node"));
        if (node != NULL && d->kube_node[0] != '\0' && strcmp(node, d->kube_node) != 0)
            FAIL("field 'kubernetes': the pod is for node %.253s, and this oversubd is node %.253s",
                 node, d->kube_node);
    }
    static const char *const all[] = {"command",        "env",       "workdir",      "user",
                                      "checkpoint_dir", "restart",   "max_restarts", "control_url",
                                      "cuda_shim",      "kubernetes"};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        json_object_del(spec, all[k]);
    if (json_object_size(x) == 0) {
        json_decref(x);
        return 0;
    }
    bool runs = json_object_get(x, "command") != NULL;
    if (runs && json_object_get(x, "kubernetes") != NULL)
        FAIL("a pod ('kubernetes') is run by its kubelet, not by oversubd: drop 'command'");
    if (!runs && json_object_size(x) > (json_object_get(x, "control_url") ? 1u : 0u) +
                                           (json_object_get(x, "kubernetes") ? 1u : 0u) +
                                           (json_object_get(x, "suspend") ? 1u : 0u))
        FAIL("fields env, workdir, user, checkpoint_dir, restart, max_restarts and cuda_shim need "
             "'command'");
    if (runs && !trusted) {
        snprintf(err, errlen,
                 "a spec with 'command' makes oversubd run a program: send it over the Unix "
                 "socket or with the admin token");
        json_decref(x);
        return OSUBD_ACT_FORBIDDEN;
    }
    if (runs) {
        const char *user = json_string_value(json_object_get(x, "user"));
        uid_t uid = geteuid();
        if (user != NULL) {
            struct passwd *pw = getpwnam(user);
            if (pw == NULL)
                FAIL("field 'user': no such user '%.64s'", user);
            if (pw->pw_uid != geteuid() && !can_switch_users())
                FAIL("field 'user': oversubd runs as uid %u and cannot run programs as '%.64s'",
                     (unsigned)geteuid(), user);
            uid = pw->pw_uid;
        }
        if (uid == 0 && !d->allow_root_services)
            FAIL("the command would run as root: give 'user', or set allow_root_services: true "
                 "in oversubd's configuration");
    }
#undef FAIL
    *exec = x;
    return 0;
}
