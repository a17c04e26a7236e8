/* actuator.c - makes services obey the engine: managed processes, directives, webhooks, logs */
#define _GNU_SOURCE
#include "actuator.h"
#include "log.h"
#include "pod.h"

#include <linux/close_range.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <sys/queue.h>

#include "conns.h"
#include "jsonmem.h"
#include "idmap.h"
#include "netpolicy.h"
#include "segment.h"
#include "sha256.h"

extern char **environ;

#define DIRECTIVES_KEPT 8
#define FAST_EXIT_MS 2000 /* a process that dies sooner "exits at once" */
#define WATCH_MS 200      /* adopted processes are checked this often */
#define HOOK_TIMEOUT_S 2  /* one webhook attempt */
#define HOOK_ATTEMPTS 4   /* then the directive waits for a long-poll */
#define MAX_ARGS 64
#define MAX_ENV 64

/* A managed service's process: the leader of its own process group (setsid). */
struct osub_proc {
    struct osub_proc *next;
    char id[OSUB_ID_MAX + 1];
    pid_t pid;                    /* 0: none now */
    unsigned long long starttime; /* /proc/PID/stat's starttime: a reused PID is not ours */
    bool child;                   /* ours to wait for; false when adopted after a restart */
    bool term_sent;
    bool failed; /* gave up on it: no more starts until it is submitted again */
    int64_t spawned_unix_ms;
    int64_t kill_at_unix_ms; /* the grace end */
    int restarts;
    struct event *kill_ev;    /* SIGKILL to the group when the grace period ends */
    struct event *restart_ev; /* a restart waiting out its backoff */
    struct osub_segment seg;  /* its CUDA shim's grant segment (seg.s NULL: none) */
    char seg_path[700];
    uint64_t seg_reported[OSUB_SEG_DEVICES]; /* the usage last reported from it, MiB */
    bool seg_faulty; /* its segment said something impossible last look (said once an episode) */
    struct osubd_act *d;
};

/* The actuators' own state: nobody else reads or writes it (actuator.h is the way in). */
struct osubd_act {
    struct osubd_core *core;
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    const struct osubd_gpus *gpus;            /* each GPU's UUID (CUDA_VISIBLE_DEVICES) */
    const struct osubd_destinations *dest;    /* where webhooks may connect */
    osubd_directive_fn on_directive;          /* told of each directive posted (pods) */
    void *on_directive_arg;
    uint64_t waiters_gone; /* long-polls whose client left before the answer */
    json_t *execs;           /* service id -> how to run it: the submitted fields, as osubd_act_take
                              * validated them (an exec is the user's document, shown back as given) */
    struct osubd__idmap *pids; /* service id -> struct act_pid: NVML's memory of that process */
    json_t *saved_procs;     /* the processes saved by the last run, until adopted at start */
    json_t *directives;      /* service id -> its latest directives (in memory) */
    bool dirty;              /* execs, pids or processes changed since the last save */
    int64_t directive_seq;
    struct osub_proc *proc_list;
    struct act_waiter *act_waiters;
    struct act_item *act_q; /* events waiting for the actuators, each with its command's ticket */
    size_t act_n, act_cap;
    struct event *act_ev, *sigchld_ev, *watch_ev;
    char cg_base[600]; /* the cgroup v2 folder holding one folder per service; "" = subreaper */
    char cg_why[300];  /* why there is none */
    uint64_t proc_starts, proc_exits[3]; /* exits: code 0, other code, signal */
    uint64_t directives_sent[4];         /* degrade, restore, evict, resume */
    uint64_t webhook_failures;
    struct evdns_base *dns;   /* webhooks to host names, made when first needed */
    char shim_path[PATH_MAX]; /* liboversub-cuda.so, "" when services run without it */
};

struct act_pid {
    pid_t pid;
};

struct act_waiter {
    struct act_waiter *next;
    struct osubd_act *d;
    struct evhttp_request *req;
    char id[OSUB_ID_MAX + 1];
    int64_t after;
    struct event *timer;
    struct osubd_client_watch watch; /* freed at once when the client leaves */
};

static int act_setup(struct osubd_act *a, char *err, size_t errlen);

/* ---- the spec's actuation fields ------------------------------------------------------ */

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

int osubd_act_take(const struct osubd_act *d, json_t *spec, bool trusted, int64_t pod_cut_mib,
                   json_t **exec, char *err,
                   size_t errlen)
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
    if ((v = json_object_get(spec, "kubernetes")) != NULL) {
        char why[300];
        json_t *k = kube_record(v, why, sizeof(why));
        if (k == NULL)
            FAIL("field 'kubernetes': %s", why);
        json_object_set_new(x, "kubernetes", k);
        /* a pod bound to another node is not this oversubd's to hold, nor to evict */
        const char *node = json_string_value(json_object_get(k, "node"));
        if (node != NULL && d->cfg->kube_node[0] != '\0' && strcmp(node, d->cfg->kube_node) != 0)
            FAIL("field 'kubernetes': the pod is for node %.253s, and this oversubd is node %.253s",
                 node, d->cfg->kube_node);
    }
    static const char *const all[] = {"command",        "env",       "workdir",      "user",
                                      "checkpoint_dir", "restart",   "max_restarts", "control_url",
                                      "cuda_shim",      "kubernetes"};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        json_object_del(spec, all[k]);
    if (json_object_get(x, "kubernetes") != NULL && osubd_act_pod_fits(d, spec, pod_cut_mib, err, errlen) != 0) {
        json_decref(x);
        return -1;
    }
    if (json_object_size(x) == 0) {
        json_decref(x);
        return 0;
    }
    bool runs = json_object_get(x, "command") != NULL;
    if (runs && json_object_get(x, "kubernetes") != NULL)
        FAIL("a pod ('kubernetes') is run by its kubelet, not by oversubd: drop 'command'");
    if (!runs && json_object_size(x) > (json_object_get(x, "control_url") ? 1u : 0u) +
                                           (json_object_get(x, "kubernetes") ? 1u : 0u))
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
        if (uid == 0 && !d->cfg->allow_root_services)
            FAIL("the command would run as root: give 'user', or set allow_root_services: true "
                 "in oversubd's configuration");
    }
#undef FAIL
    *exec = x;
    return 0;
}

/* ---- small helpers ---------------------------------------------------------------------- */

static struct osub_proc *proc_find(struct osubd_act *d, const char *id)
{
    for (struct osub_proc *p = d->proc_list; p; p = p->next)
        if (strcmp(p->id, id) == 0)
            return p;
    return NULL;
}

static struct osub_proc *proc_get(struct osubd_act *d, const char *id)
{
    struct osub_proc *p = proc_find(d, id);
    if (p != NULL)
        return p;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    snprintf(p->id, sizeof(p->id), "%s", id);
    p->seg.fd = p->seg.probe_fd = -1;
    p->d = d;
    p->next = d->proc_list;
    d->proc_list = p;
    return p;
}

static void cg_remove(struct osubd_act *d, const char *id);

static void proc_drop(struct osubd_act *d, struct osub_proc *p)
{
    cg_remove(d, p->id); /* empty: gone; still holding processes (kept at exit): kept */
    for (struct osub_proc **pp = &d->proc_list; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    if (p->kill_ev)
        event_free(p->kill_ev);
    if (p->restart_ev)
        event_free(p->restart_ev);
    if (p->seg.s != NULL) {
        osub_seg_cleanup(&p->seg);
        unlink(p->seg_path);
    }
    free(p);
}

/* Field 22 of /proc/PID/stat (clock ticks after boot), 0 when the process is gone. */
static unsigned long long proc_starttime(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL)
        return 0;
    p += 2; /* field 3, the state */
    if (*p == 'Z' || *p == 'X')
        return 0; /* a zombie holds no memory */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

static void state_dir(const struct osubd_act *d, char *out, size_t len)
{
    snprintf(out, len, "%s", d->cfg->state_path);
    char *slash = strrchr(out, '/');
    if (slash != NULL)
        *slash = '\0';
    else
        snprintf(out, len, ".");
    if (out[0] == '\0')
        snprintf(out, len, "/");
    char cwd[512], both[1100];
    if (out[0] != '/' && getcwd(cwd, sizeof(cwd)) != NULL) {
        snprintf(both, sizeof(both), "%s/%s", cwd, strcmp(out, ".") == 0 ? "" : out);
        snprintf(out, len, "%.*s", (int)(len - 1), both);
    }
}

static void log_path(const struct osubd_act *d, const char *id, char *out, size_t len)
{
    char dir[512];
    state_dir(d, dir, sizeof(dir));
    snprintf(out, len, "%s/logs/%s.log", dir, id);
}

static void checkpoint_dir(const struct osubd_act *d, const char *id, char *out, size_t len)
{
    const char *cd =
        json_string_value(json_object_get(json_object_get(d->execs, id), "checkpoint_dir"));
    if (cd != NULL) {
        snprintf(out, len, "%s", cd);
        return;
    }
    char dir[512];
    state_dir(d, dir, sizeof(dir));
    snprintf(out, len, "%s/checkpoints/%s", dir, id);
}

static int mkdirs(const char *path, mode_t mode)
{
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, mode) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(tmp, mode) != 0 && errno != EEXIST ? -1 : 0;
}

/* The service's checkpoint folder, made without following a link: each part of path is opened
 * with O_NOFOLLOW | O_DIRECTORY under the one before it (from /), what does not exist is made
 * (0755 on the way, 0700 at the end), and only a folder made here is given to the service's
 * user: an existing file, link or folder is never chowned, and an existing part that is not a
 * folder (or is a link) is refused. 0, or -1 with why. */
static int service_dir(const char *path, uid_t uid, gid_t gid, bool give, char *why, size_t len)
{
    if (path[0] != '/') {
        snprintf(why, len, "%s is not an absolute path", path);
        return -1;
    }
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", path);
    int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, len, "cannot open /: %s", strerror(errno));
        return -1;
    }
    char *save = NULL;
    bool made = false;
    for (char *part = strtok_r(tmp, "/", &save); part != NULL; part = strtok_r(NULL, "/", &save)) {
        if (strcmp(part, "..") == 0) {
            snprintf(why, len, "%s: '..' is not allowed in a checkpoint folder", path);
            close(fd);
            return -1;
        }
        if (strcmp(part, ".") == 0)
            continue;
        bool last = save == NULL || *save == '\0';
        made = false;
        int nfd = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (nfd < 0 && errno == ENOENT) {
            if (mkdirat(fd, part, last ? 0700 : 0755) != 0 && errno != EEXIST) {
                snprintf(why, len, "cannot make %s (at '%s'): %s", path, part, strerror(errno));
                close(fd);
                return -1;
            }
            made = errno != EEXIST;
            nfd = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (nfd < 0) {
            int e = errno;
            snprintf(why, len, "%s: '%s' %s", path, part,
                     e == ELOOP || e == ENOTDIR || e == EMLINK
                         ? "is a symbolic link or not a folder: oversubd follows no link and "
                           "takes no file for a checkpoint folder"
                         : strerror(e));
            close(fd);
            return -1;
        }
        close(fd);
        fd = nfd;
    }
    int rc = 0;
    if (made && give && fchown(fd, uid, gid) != 0) {
        snprintf(why, len, "cannot give %s to its user: %s", path, strerror(errno));
        rc = -1;
    }
    close(fd);
    return rc;
}

/* The same walk in a forked child, as the service's user (async-signal-safe: no allocation, no
 * formatting): a folder it names is made only where that user could make it anyway. 0, or -1
 * with errno (ELOOP or ENOTDIR for a link or a file on the way, EINVAL for '..'). */
static int child_dir(const char *path)
{
    char tmp[1024];
    size_t n = 0;
    while (path[n] != '\0' && n + 1 < sizeof(tmp)) {
        tmp[n] = path[n];
        n++;
    }
    tmp[n] = '\0';
    int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char *part = tmp;
    while (*part != '\0') {
        while (*part == '/')
            part++;
        if (*part == '\0')
            break;
        char *end = part;
        while (*end != '\0' && *end != '/')
            end++;
        bool last = true;
        for (const char *q = end; *q != '\0'; q++)
            if (*q != '/')
                last = false;
        char save = *end;
        *end = '\0';
        if (part[0] == '.' && part[1] == '.' && part[2] == '\0') {
            close(fd);
            errno = EINVAL;
            return -1;
        }
        int nfd = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (nfd < 0 && errno == ENOENT) {
            if (mkdirat(fd, part, last ? 0700 : 0755) != 0 && errno != EEXIST) {
                int e = errno;
                close(fd);
                errno = e;
                return -1;
            }
            nfd = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        int e = errno;
        close(fd);
        if (nfd < 0) {
            errno = e;
            return -1;
        }
        fd = nfd;
        *end = save;
        part = end;
    }
    close(fd);
    return 0;
}

/* A process started or ended: saved with the next command; NVML's memory for its PID is the
 * service's usage. */
static void save_proc(struct osubd_act *d, struct osub_proc *p)
{
    if (p->pid > 0)
        osubd_act_set_pid(d, p->id, p->pid);
    else
        osubd__idmap_del(d->pids, p->id);
    d->dirty = true;
}

static void apply(struct osubd_act *d, json_t *cmd)
{
    char err[256];
    int rc = osubd_apply(d->core, cmd, NULL, err, sizeof(err));
    if (err[0] || rc != 0)
        osubd_log(OSUBD_LOG_INFO, "%s for %s: %s", json_string_value(json_object_get(cmd, "op")),
                json_string_value(json_object_get(cmd, "id")), err[0] ? err : osub_strerror(rc));
    json_decref(cmd);
}

static void apply_fail(struct osubd_act *d, struct osub_proc *p, const char *why)
{
    p->failed = true;
    apply(d, json_pack("{s:s, s:s, s:s}", "op", "fail", "id", p->id, "why", why));
}

static bool live_state(osub_state_t s)
{
    return s == OSUB_STATE_LOADING || s == OSUB_STATE_RUNNING || s == OSUB_STATE_DEGRADED;
}

static bool draining_state(osub_state_t s)
{
    return s == OSUB_STATE_DRAINING || s == OSUB_STATE_OVERDUE;
}

/* ---- what a service's processes are: a cgroup v2 folder, else a subreaper's sweep ---------- */

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

static bool cg_is_v2(const char *path)
{
    struct statfs sf;
    return statfs(path, &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC;
}

/* Where the cgroup v2 hierarchy is mounted, and this process's folder in it. */
static bool cg_own(char *out, size_t len)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[2048], mnt[1024] = "";
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        char *dash = strstr(line, " - cgroup2 ");
        if (dash == NULL)
            continue;
        char m[1024];
        if (sscanf(line, "%*s %*s %*s %*s %1023s", m) == 1) {
            snprintf(mnt, sizeof(mnt), "%s", m);
            break;
        }
    }
    if (f != NULL)
        fclose(f);
    f = fopen("/proc/self/cgroup", "re");
    char own[1024] = "";
    bool found = false;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "0::", 3) == 0) {
            snprintf(own, sizeof(own), "%.1000s", line + 3);
            own[strcspn(own, "\n")] = '\0';
            found = true;
        }
    if (f != NULL)
        fclose(f);
    if (!mnt[0] || !found)
        return false;
    snprintf(out, len, "%s%s", mnt, strcmp(own, "/") == 0 ? "" : own);
    return true;
}

static void cg_setup(struct osubd_act *d)
{
    struct osubd_act *a = d;
    const char *want = d->cfg->cgroup;
    if (strcmp(want, "none") == 0) {
        snprintf(a->cg_why, sizeof(a->cg_why), "cgroup: none in the configuration");
        return;
    }
    char base[600];
    if (want[0] == '/') {
        snprintf(base, sizeof(base), "%s", want);
    } else {
        char own[512];
        if (!cg_own(own, sizeof(own))) {
            snprintf(a->cg_why, sizeof(a->cg_why), "no cgroup v2 hierarchy is mounted");
            return;
        }
        /* one folder per state: two daemons on one machine never share one */
        char sd[512], hex[65];
        state_dir(d, sd, sizeof(sd));
        uint8_t h[32];
        osubd__sha256(d->cfg->state_path, strlen(d->cfg->state_path), h);
        if (d->cfg->state_path[0] != '/') {
            char full[1100];
            snprintf(full, sizeof(full), "%s/%s", sd, d->cfg->state_path);
            osubd__sha256(full, strlen(full), h);
        }
        for (int i = 0; i < 6; i++)
            snprintf(hex + 2 * i, 3, "%02x", h[i]);
        snprintf(base, sizeof(base), "%s/oversub-%s", own, hex);
    }
    if (want[0] != '/') {
        /* folders of daemons gone (killed, their state removed): the empty ones are removed
         * (a live daemon's empty one too, which it makes again at its next start) */
        char own[512];
        DIR *od = cg_own(own, sizeof(own)) ? opendir(own) : NULL;
        for (struct dirent *e; od != NULL && (e = readdir(od)) != NULL;) {
            if (strncmp(e->d_name, "oversub-", 8) != 0 || e->d_type != DT_DIR)
                continue;
            char sub[900];
            snprintf(sub, sizeof(sub), "%s/%.100s", own, e->d_name);
            DIR *sd = opendir(sub);
            for (struct dirent *f; sd != NULL && (f = readdir(sd)) != NULL;)
                if (f->d_type == DT_DIR && osub_id_valid(f->d_name)) {
                    char leaf[1000];
                    snprintf(leaf, sizeof(leaf), "%s/%.*s", sub, OSUB_ID_MAX, f->d_name);
                    /* EBUSY while it holds processes; a minute old at least, never one a
                     * starting service is about to join */
                    struct stat lst;
                    if (stat(leaf, &lst) == 0 && time(NULL) - lst.st_mtime > 60)
                        rmdir(leaf);
                }
            if (sd != NULL)
                closedir(sd);
            rmdir(sub);
        }
        if (od != NULL)
            closedir(od);
    }
    if (mkdir(base, 0755) != 0 && errno != EEXIST) {
        snprintf(a->cg_why, sizeof(a->cg_why), "cannot make %.200s: %s", base, strerror(errno));
        return;
    }
    if (!cg_is_v2(base)) {
        snprintf(a->cg_why, sizeof(a->cg_why), "%.200s is not in a cgroup v2 hierarchy", base);
        return;
    }
    /* memory and pids per service where the hierarchy lets us (else only the processes) */
    char f[700];
    snprintf(f, sizeof(f), "%s/cgroup.subtree_control", base);
    int fd = open(f, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        static const char *const ctl[] = {"+memory", "+pids"};
        for (int i = 0; i < 2; i++)
            if (write(fd, ctl[i], strlen(ctl[i])) < 0) {
                /* the controller is not enabled above us: fine */
            }
        close(fd);
    }
    snprintf(a->cg_base, sizeof(a->cg_base), "%s", base);
}

static void cg_path(const struct osubd_act *d, const char *id, char *out, size_t len)
{
    snprintf(out, len, "%s/%.*s", d->cg_base, OSUB_ID_MAX, id);
}

/* The PIDs in a service's cgroup (at most max); -1 when it has none. */
static int cg_pids(const struct osubd_act *d, const char *id, pid_t *out, int max)
{
    char f[800];
    cg_path(d, id, f, sizeof(f));
    strcat(f, "/cgroup.procs");
    FILE *fp = fopen(f, "re");
    if (fp == NULL)
        return -1;
    int n = 0;
    long v;
    while (n < max && fscanf(fp, "%ld", &v) == 1)
        out[n++] = (pid_t)v;
    fclose(fp);
    return n;
}

/* Does the process's environment at exec say it belongs to service id? */
static bool environ_says(pid_t pid, const char *id)
{
    char f[64], buf[65536];
    snprintf(f, sizeof(f), "/proc/%d/environ", (int)pid);
    int fd = open(f, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    char want[OSUB_ID_MAX + 20];
    snprintf(want, sizeof(want), "OVERSUB_SERVICE=%s", id);
    for (char *p = buf; p < buf + n; p += strlen(p) + 1)
        if (strcmp(p, want) == 0)
            return true;
    return false;
}

/* Without a cgroup: the processes of a service are the descendants of its leader, and those
 * that outlived their parents and came to oversubd (the subreaper) with the service's
 * OVERSUB_SERVICE, with their descendants. At most max. */
static int sweep_pids(const struct osubd_act *d, const char *id, pid_t leader, pid_t *out, int max)
{
    enum { CAP = 65536 };
    static pid_t pid_of[CAP], ppid_of[CAP];
    int all = 0;
    DIR *dir = opendir("/proc");
    if (dir == NULL)
        return 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL && all < CAP) {
        char *end;
        long v = strtol(e->d_name, &end, 10);
        if (*end != '\0' || v <= 0)
            continue;
        char f[64], buf[512];
        snprintf(f, sizeof(f), "/proc/%ld/stat", v);
        int fd = open(f, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        char *rp = strrchr(buf, ')'); /* the name may hold anything but ends at the last ')' */
        long pp;
        if (rp == NULL || sscanf(rp + 1, " %*c %ld", &pp) != 1)
            continue;
        pid_of[all] = (pid_t)v;
        ppid_of[all] = (pid_t)pp;
        all++;
    }
    closedir(dir);
    int n = 0;
    pid_t self = getpid();
    for (int i = 0; i < all && n < max; i++) {
        bool root = pid_of[i] == leader;
        if (!root && ppid_of[i] == self && environ_says(pid_of[i], id)) {
            root = true;
            for (const struct osub_proc *q = d->proc_list; q; q = q->next)
                if (q->pid == pid_of[i])
                    root = false; /* another service's leader */
        }
        if (root)
            out[n++] = pid_of[i];
    }
    /* their descendants, breadth first */
    for (int k = 0; k < n && n < max; k++)
        for (int i = 0; i < all && n < max; i++)
            if (ppid_of[i] == out[k] && pid_of[i] != out[k]) {
                bool seen = false;
                for (int j = 0; j < n && !seen; j++)
                    seen = out[j] == pid_of[i];
                if (!seen)
                    out[n++] = pid_of[i];
            }
    return n;
}

/* sig to everything of the service: its process group, its cgroup (or what the sweep finds). */
static void signal_service(struct osubd_act *d, const char *id, pid_t leader, int sig)
{
    if (leader > 0)
        kill(-leader, sig);
    enum { MAXP = 4096 };
    static pid_t pids[MAXP];
    int n;
    if (d->cg_base[0]) {
        char f[800];
        cg_path(d, id, f, sizeof(f));
        strcat(f, "/cgroup.kill");
        int fd = sig == SIGKILL ? open(f, O_WRONLY | O_CLOEXEC) : -1;
        if (fd >= 0) {
            bool done = write(fd, "1", 1) == 1;
            close(fd);
            if (done)
                return;
        }
        n = cg_pids(d, id, pids, MAXP);
    } else {
        n = sweep_pids(d, id, leader, pids, MAXP);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 1 && pids[i] != getpid())
            kill(pids[i], sig);
}

/* A service's cgroup folder, removed once nothing is left in it. */
static void cg_remove(struct osubd_act *d, const char *id)
{
    if (!d->cg_base[0])
        return;
    char f[800];
    cg_path(d, id, f, sizeof(f));
    rmdir(f);
}

/* ---- signals ------------------------------------------------------------------------------ */

static void on_kill(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_proc *p = arg;
    if (p->pid <= 0)
        return;
    int64_t left = p->kill_at_unix_ms - osubd_now(p->d->core);
    if (left > 0) {
        /* the timer's clock and the wall clock differ by a hair: never before the grace end */
        struct timeval tv = {(time_t)(left / 1000), (suseconds_t)(left % 1000) * 1000};
        evtimer_add(p->kill_ev, &tv);
        return;
    }
    signal_service(p->d, p->id, p->pid, SIGKILL);
    osubd_note(p->d->core, p->id, "process", "kill",
               "%s's grace period ended with its process %d still alive: killed its process "
               "group with SIGKILL",
               p->id, (int)p->pid);
}

/* SIGTERM to the group now, SIGKILL at deadline_unix_ms. */
static void terminate(struct osubd_act *d, struct osub_proc *p, int64_t deadline_unix_ms,
                      const char *why)
{
    if (p->pid <= 0)
        return;
    if (!p->term_sent) {
        signal_service(d, p->id, p->pid, SIGTERM);
        p->term_sent = true;
        osubd_note(d->core, p->id, "process", "term", "sent SIGTERM to %s's process group %d (%s)", p->id,
                   (int)p->pid, why);
    }
    if (p->kill_ev == NULL)
        p->kill_ev = evtimer_new(d->base, on_kill, p);
    p->kill_at_unix_ms = deadline_unix_ms;
    int64_t left = deadline_unix_ms - osubd_now(d->core);
    if (left < 0)
        left = 0;
    struct timeval tv = {(time_t)(left / 1000), (suseconds_t)(left % 1000) * 1000};
    if (p->kill_ev)
        evtimer_add(p->kill_ev, &tv);
}

/* ---- starting a managed process ---------------------------------------------------------- */

/* The program's path: as given when it holds a '/', else the first executable in PATH. */
static int resolve(const char *prog, char *out, size_t len)
{
    if (strchr(prog, '/') != NULL) {
        snprintf(out, len, "%s", prog);
        return 0;
    }
    const char *path = getenv("PATH");
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(out, len, "%.*s/%s", (int)n, path, prog);
        if (access(out, X_OK) == 0)
            return 0;
        path += n + (colon ? 1 : 0);
    }
    return -1;
}

struct envb {
    char *v[256];
    size_t n;
};

static void env_set(struct envb *e, const char *k, const char *val)
{
    size_t kl = strlen(k);
    for (size_t i = 0; i < e->n; i++)
        if (strncmp(e->v[i], k, kl) == 0 && e->v[i][kl] == '=') {
            free(e->v[i]);
            e->v[i] = NULL;
            if (asprintf(&e->v[i], "%s=%s", k, val) < 0)
                e->v[i] = NULL;
            return;
        }
    if (e->n + 1 < sizeof(e->v) / sizeof(e->v[0]) && asprintf(&e->v[e->n], "%s=%s", k, val) >= 0)
        e->n++;
}

static const char *env_get(const struct envb *e, const char *k)
{
    size_t kl = strlen(k);
    for (size_t i = 0; i < e->n; i++)
        if (strncmp(e->v[i], k, kl) == 0 && e->v[i][kl] == '=')
            return e->v[i] + kl + 1;
    return NULL;
}

/* The service's grant segment for this start (docs/shim.md): one device per GPU of its
 * placement, as CUDA_VISIBLE_DEVICES numbers them, each granted the service's share there;
 * created afresh in the state's shim/ folder (0711: passable, not listable), 0600 and owned by
 * the user the service runs as. 0, or -1 with why. */
static int shim_prepare(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si,
                        const char *user, uid_t uid, gid_t gid, char *why, size_t len)
{
    if (p->seg.s != NULL) {
        osub_seg_cleanup(&p->seg);
        unlink(p->seg_path);
    }
    memset(p->seg_reported, 0, sizeof(p->seg_reported));
    if (si->n_slots < 1 || si->n_slots > OSUB_SEG_DEVICES) {
        snprintf(why, len, "the CUDA shim grants at most %d GPUs (the service has %d)",
                 OSUB_SEG_DEVICES, (int)si->n_slots);
        return -1;
    }
    char sd[512], dir[600];
    state_dir(d, sd, sizeof(sd));
    snprintf(dir, sizeof(dir), "%s/shim", sd);
    struct stat st;
    if (mkdirs(dir, 0711) != 0 || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
        chmod(dir, 0711) != 0) {
        snprintf(why, len, "cannot make %s for the CUDA shim: %s", dir, strerror(errno));
        return -1;
    }
    if (user != NULL && stat(sd, &st) == 0 && (st.st_mode & 0111) != 0111)
        chmod(sd, (st.st_mode & 07777) | 0111); /* passable by the service's user */
    snprintf(p->seg_path, sizeof(p->seg_path), "%s/%s.seg", dir, p->id);
    if (lstat(p->seg_path, &st) == 0)
        unlink(p->seg_path); /* a segment left by an earlier start or run: ours, in our folder */
    uint64_t grants[OSUB_SEG_DEVICES];
    for (int32_t i = 0; i < si->n_slots; i++)
        grants[i] = (uint64_t)si->slots[i].grant_mib << 20;
    char err[512];
    if (osub_seg_create(&p->seg, p->seg_path, user ? uid : (uid_t)-1, user ? gid : (gid_t)-1, p->id,
                        (uint32_t)si->n_slots, grants, err, sizeof(err)) != 0) {
        snprintf(why, len, "CUDA shim: %s", err);
        return -1;
    }
    return 0;
}

static void spawn(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si)
{
    json_t *x = json_object_get(d->execs, p->id);
    json_t *cmd = json_object_get(x, "command");
    const char *prog = json_string_value(json_array_get(cmd, 0));
    char path[PATH_MAX + 1];
    char why[PATH_MAX + 200];
    if (resolve(prog, path, sizeof(path)) != 0) {
        snprintf(why, sizeof(why), "command '%.200s' was not found in PATH", prog);
        apply_fail(d, p, why);
        return;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || access(path, X_OK) != 0) {
        snprintf(why, sizeof(why), "command '%.200s' %s", path,
                 stat(path, &st) != 0   ? "does not exist"
                 : !S_ISREG(st.st_mode) ? "is not a file"
                                        : "is not executable");
        apply_fail(d, p, why);
        return;
    }
    /* everything the child needs is made before fork: after it, only async-signal-safe calls */
    const char *user = json_string_value(json_object_get(x, "user"));
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (user != NULL) {
        struct passwd *pw = getpwnam(user);
        if (pw == NULL) {
            snprintf(why, sizeof(why), "user '%.64s' no longer exists", user);
            apply_fail(d, p, why);
            return;
        }
        uid = pw->pw_uid;
        gid = pw->pw_gid;
    }
    if (uid == 0 && !d->cfg->allow_root_services) {
        apply_fail(d, p, "it would run as root and allow_root_services is not set");
        return;
    }
    char ckdir[1024], logf[1024], dir[1024];
    checkpoint_dir(d, p->id, ckdir, sizeof(ckdir));
    log_path(d, p->id, logf, sizeof(logf));
    snprintf(dir, sizeof(dir), "%s", logf);
    *strrchr(dir, '/') = '\0';
    if (mkdirs(dir, 0700) != 0) {
        snprintf(why, sizeof(why), "cannot make %s: %s", dir, strerror(errno));
        apply_fail(d, p, why);
        return;
    }
    /* a folder the spec names, for a service that runs as another user, is made by that user
     * in the child (a root-made folder given away anywhere would be a way to root); the default
     * one, inside the state's folder, is made here and given to the user */
    bool ck_as_user = user != NULL && uid != geteuid() && json_object_get(x, "checkpoint_dir");
    if (ck_as_user) {
        if (strstr(ckdir, "/../") != NULL || strcmp(ckdir + strlen(ckdir) - 3, "/..") == 0) {
            snprintf(why, sizeof(why), "%s: '..' is not allowed in a checkpoint folder", ckdir);
            apply_fail(d, p, why);
            return;
        }
    } else if (service_dir(ckdir, uid, gid, user != NULL, why, sizeof(why)) != 0) {
        apply_fail(d, p, why);
        return;
    }
    if (user != NULL && json_object_get(x, "checkpoint_dir") == NULL) {
        /* the default folder is inside the state's: the user must be able to pass through it
         * (traverse only: 0711 lists nothing; the state's files stay 0600) */
        char sd[512], cps[600];
        state_dir(d, sd, sizeof(sd));
        snprintf(cps, sizeof(cps), "%s/checkpoints", sd);
        struct stat st2;
        for (int k = 0; k < 2; k++) {
            const char *dpath = k == 0 ? sd : cps;
            if (stat(dpath, &st2) == 0 && (st2.st_mode & 0111) != 0111)
                chmod(dpath, (st2.st_mode & 07777) | 0111);
        }
    }
    int logfd = open(logf, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (logfd < 0 || nullfd < 0) {
        snprintf(why, sizeof(why), "cannot open its log %s: %s", logf, strerror(errno));
        if (logfd >= 0)
            close(logfd);
        if (nullfd >= 0)
            close(nullfd);
        apply_fail(d, p, why);
        return;
    }
    char *argv[MAX_ARGS + 1];
    size_t argc = json_array_size(cmd);
    for (size_t i = 0; i < argc; i++)
        argv[i] = (char *)json_string_value(json_array_get(cmd, i));
    argv[argc] = NULL;
    /* a clean environment (docs/actuation.md): not oversubd's (HOME=/root and the rest) */
    struct envb env = {.n = 0};
    struct passwd *pwu = getpwuid(uid);
    env_set(&env, "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    env_set(&env, "HOME", pwu && pwu->pw_dir ? pwu->pw_dir : "/");
    if (pwu != NULL) {
        env_set(&env, "USER", pwu->pw_name);
        env_set(&env, "LOGNAME", pwu->pw_name);
    }
    for (char **e = environ; *e && env.n + 1 < 32; e++) {
        static const char *const pass[] = {"LANG=",         "LANGUAGE=",     "LC_",
                                           "TZ=",           "ASAN_OPTIONS=", "UBSAN_OPTIONS=",
                                           "LSAN_OPTIONS=", "TSAN_OPTIONS="};
        for (size_t i = 0; i < sizeof(pass) / sizeof(pass[0]); i++)
            if (strncmp(*e, pass[i], strlen(pass[i])) == 0) {
                char *dup = strdup(*e);
                if (dup != NULL)
                    env.v[env.n++] = dup;
                break;
            }
    }
    const char *k;
    json_t *ev;
    json_object_foreach(json_object_get(x, "env"), k, ev) env_set(&env, k, json_string_value(ev));
    char buf[1024], num[32], gpus[1024] = "";
    for (int32_t i = 0; i < si->n_slots; i++) {
        int32_t g = si->slots[i].gpu;
        size_t l = strlen(gpus);
        if (g < d->gpus->n && d->gpus->uuid[g][0])
            snprintf(gpus + l, sizeof(gpus) - l, "%s%s", i ? "," : "", d->gpus->uuid[g]);
        else
            snprintf(gpus + l, sizeof(gpus) - l, "%s%d", i ? "," : "", g);
    }
    env_set(&env, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    env_set(&env, "CUDA_VISIBLE_DEVICES", gpus);
    env_set(&env, "OVERSUB_SERVICE", p->id);
    snprintf(num, sizeof(num), "%lld", (long long)si->grant_mib);
    env_set(&env, "OVERSUB_VRAM_MIB", num);
    snprintf(num, sizeof(num), "%d", si->batch_size);
    env_set(&env, "OVERSUB_BATCH_SIZE", num);
    const char *host = d->cfg->listen_host;
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 || host[0] == '\0')
        host = "127.0.0.1";
    snprintf(buf, sizeof(buf), strchr(host, ':') ? "http://[%s]:%d" : "http://%s:%d", host,
             d->cfg->listen_port);
    env_set(&env, "OVERSUB_CONTROL_URL", buf);
    char tok[65];
    osubd_service_token(d->core, p->id, tok);
    env_set(&env, "OVERSUB_TOKEN", tok);
    env_set(&env, "OVERSUB_CHECKPOINT_DIR", ckdir);
    bool shim_on = d->shim_path[0] && !json_is_false(json_object_get(x, "cuda_shim"));
    if (shim_on) {
        if (shim_prepare(d, p, si, user, uid, gid, why, sizeof(why)) != 0) {
            close(logfd);
            close(nullfd);
            for (size_t i = 0; i < env.n; i++)
                free(env.v[i]);
            apply_fail(d, p, why);
            return;
        }
        /* after what the service preloads itself (a sanitizer runtime must stay first) */
        const char *had = env_get(&env, "LD_PRELOAD");
        char *pre = NULL;
        if (asprintf(&pre, "%s%s%s", had ? had : "", had && *had ? " " : "", d->shim_path) >=
            0) {
            env_set(&env, "LD_PRELOAD", pre);
            free(pre);
        }
        env_set(&env, "OVERSUB_SHIM_SEGMENT", p->seg_path);
    }
    if (si->checkpoint[0])
        env_set(&env, "OVERSUB_RESUME_FROM", si->checkpoint);
    env.v[env.n] = NULL;
    const char *workdir = json_string_value(json_object_get(x, "workdir"));
    int cgfd = -1;
    if (d->cg_base[0]) {
        /* its own cgroup: what it forks, daemonized or not, stays in it */
        char cg[800], procs[850];
        cg_path(d, p->id, cg, sizeof(cg));
        signal_service(d, p->id, 0, SIGKILL); /* a previous start's leftovers */
        mkdir(d->cg_base, 0755); /* another daemon's sweep may have taken it while empty */
        if (mkdir(cg, 0755) != 0 && errno != EEXIST) {
            snprintf(why, sizeof(why), "cannot make its cgroup %s: %s", cg, strerror(errno));
            goto failed;
        }
        snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg);
        if ((cgfd = open(procs, O_WRONLY | O_CLOEXEC)) < 0) {
            snprintf(why, sizeof(why), "cannot open %s: %s", procs, strerror(errno));
            goto failed;
        }
    }
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        snprintf(why, sizeof(why), "pipe: %s", strerror(errno));
        goto failed;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, sizeof(why), "fork: %s", strerror(errno));
        close(pipefd[0]);
        close(pipefd[1]);
        goto failed;
    }
    if (pid == 0) {
        /* the child: its own session and process group, default signals, then exec */
        int stage = 0;
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        if (setsid() < 0)
            goto child_fail;
        stage = 6;
        if (cgfd >= 0 && write(cgfd, "0", 1) != 1)
            goto child_fail;
        stage = 1;
        if (dup2(nullfd, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
            goto child_fail;
        stage = 3;
        if (user != NULL && (setgroups(1, &gid) != 0 || setgid(gid) != 0 || setuid(uid) != 0))
            goto child_fail;
        stage = 7;
        if (ck_as_user && child_dir(ckdir) != 0)
            goto child_fail;
        stage = 4;
        /* as the service's user: can it load the shim and open its segment? (else ld.so
         * would skip the shim with a warning, and the grant would go unenforced) */
        if (shim_on &&
            (access(d->shim_path, R_OK) != 0 || access(p->seg_path, R_OK | W_OK) != 0))
            goto child_fail;
        stage = 2; /* entered as the service's user, not as oversubd's */
        if (chdir(workdir != NULL ? workdir : ckdir) != 0)
            goto child_fail;
        stage = 5;
        /* nothing oversubd inherited or opened reaches the service: every descriptor past
         * stderr closes at exec (the pipe above included, which is how a failed exec is told) */
        if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
            for (int fd = 3; fd < 65536; fd++) /* kernels before 5.11 */
                fcntl(fd, F_SETFD, FD_CLOEXEC);
        execve(path, argv, env.v);
    child_fail:;
        int msg[2] = {stage, errno};
        ssize_t w = write(pipefd[1], msg, sizeof(msg));
        (void)w;
        _exit(127);
    }
    close(pipefd[1]);
    if (cgfd >= 0)
        close(cgfd);
    int msg[2];
    ssize_t r;
    do
        r = read(pipefd[0], msg, sizeof(msg));
    while (r < 0 && errno == EINTR);
    close(pipefd[0]);
    close(logfd);
    close(nullfd);
    for (size_t i = 0; i < env.n; i++)
        free(env.v[i]);
    if (r == (ssize_t)sizeof(msg)) {
        /* exec failed: the child is gone (reaped by SIGCHLD as a stranger) */
        static const char *const stages[] = {"setsid",
                                             "redirect its output",
                                             "chdir",
                                             "switch user",
                                             "reach the CUDA shim",
                                             "exec",
                                             "join its cgroup",
                                             "make its checkpoint folder (as its user)"};
        waitpid(pid, NULL, 0);
        snprintf(why, sizeof(why), "cannot start '%.200s': %s failed: %s%s", path,
                 stages[msg[0] >= 0 && msg[0] <= 7 ? msg[0] : 5],
                 msg[0] == 7 && (msg[1] == ELOOP || msg[1] == ENOTDIR)
                     ? "a part of it is a symbolic link or not a folder"
                     : strerror(msg[1]),
                 msg[0] == 4   ? " (its user must be able to read liboversub-cuda.so and the "
                                 "folders above it and the state; or set cuda_shim: false)"
                 : msg[0] == 2 ? " (it starts in its workdir, else in its checkpoint folder: "
                                 "its user must be able to enter it)"
                               : "");
        apply_fail(d, p, why);
        return;
    }
    p->pid = pid;
    d->proc_starts++;
    p->child = true;
    p->term_sent = false;
    p->spawned_unix_ms = osubd_now(d->core);
    p->starttime = proc_starttime(pid);
    save_proc(d, p);
    osubd_note(d->core, p->id, "process", "spawn",
               "started %s: process %d (%s) on GPU(s) %s with %lld MiB, batch %d%s%s; log %s",
               p->id, (int)pid, path, gpus, (long long)si->grant_mib, si->batch_size,
               si->checkpoint[0] ? ", resuming from " : "", si->checkpoint, logf);
    return;
failed:
    if (cgfd >= 0)
        close(cgfd);
    close(logfd);
    close(nullfd);
    for (size_t i = 0; i < env.n; i++)
        free(env.v[i]);
    apply_fail(d, p, why);
}

/* ---- directives ----------------------------------------------------------------------- */

struct hook {
    struct osubd_act *d;
    char id[OSUB_ID_MAX + 1];
    char *url, *body;
    int attempt;
    int64_t seq;
    struct event *timer;
};

static void hook_send(struct hook *h);

static void hook_free(struct hook *h)
{
    if (h->timer)
        event_free(h->timer);
    free(h->url);
    free(h->body);
    free(h);
}

static void hook_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    hook_send(arg);
}

static void hook_done(struct evhttp_request *req, void *arg)
{
    struct hook *h = arg;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code >= 200 && code < 300) {
        hook_free(h);
        return;
    }
    if (++h->attempt >= HOOK_ATTEMPTS) {
        h->d->webhook_failures++;
        osubd_note(h->d->core, h->id, "directive", "webhook_failed",
                   "directive %lld for %s could not be delivered to %s after %d attempts (last: "
                   "%s%d); it stays available at GET /v1/services/%s/directives",
                   (long long)h->seq, h->id, h->url, HOOK_ATTEMPTS, code ? "HTTP " : "no answer, ",
                   code, h->id);
        hook_free(h);
        return;
    }
    if (h->timer == NULL)
        h->timer = evtimer_new(h->d->base, hook_retry, h);
    int64_t ms = 250LL << h->attempt; /* 0.5 s, 1 s, 2 s */
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (h->timer == NULL || evtimer_add(h->timer, &tv) != 0)
        hook_free(h);
}

static void hook_send(struct hook *h)
{
    struct evhttp_uri *u = evhttp_uri_parse(h->url);
    struct evhttp_connection *c = NULL;
    struct evhttp_request *req = NULL;
    if (u != NULL) {
        int port = evhttp_uri_get_port(u);
        /* a name is resolved without blocking the loop (evdns); an address needs no lookup */
        const char *host = evhttp_uri_get_host(u);
        struct in6_addr a6;
        struct in_addr a4;
        bool literal = inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1;
        if (!literal && h->d->dns == NULL)
            h->d->dns = evdns_base_new(h->d->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
        c = evhttp_connection_base_new(h->d->base, literal ? NULL : h->d->dns, host,
                                       (uint16_t)(port > 0 ? port : 80));
    }
    if (c != NULL) {
        evhttp_connection_set_timeout(c, HOOK_TIMEOUT_S);
        evhttp_connection_free_on_completion(c);
        req = evhttp_request_new(hook_done, h);
    }
    if (req != NULL) {
        char host[300];
        int port = evhttp_uri_get_port(u);
        snprintf(host, sizeof(host), port > 0 ? "%s:%d" : "%s", evhttp_uri_get_host(u), port);
        struct evkeyvalq *hd = evhttp_request_get_output_headers(req);
        evhttp_add_header(hd, "Host", host);
        evhttp_add_header(hd, "Content-Type", "application/json");
        /* signed with the service's token: the receiver can tell oversubd from anyone */
        char tok[65], sig[160];
        osubd_service_token(h->d->core, h->id, tok);
        osubd_sign(tok, (long long)(osubd_unix_ms() / 1000), h->body, strlen(h->body), sig,
                   sizeof(sig));
        evhttp_add_header(hd, "X-Oversub-Signature", sig);
        evbuffer_add(evhttp_request_get_output_buffer(req), h->body, strlen(h->body));
        const char *path = evhttp_uri_get_path(u);
        const char *query = evhttp_uri_get_query(u);
        char target[2100];
        snprintf(target, sizeof(target), "%s%s%s", path && path[0] ? path : "/", query ? "?" : "",
                 query ? query : "");
        if (evhttp_make_request(c, req, EVHTTP_REQ_POST, target) != 0) {
            req = NULL; /* freed by libevent */
            evhttp_connection_free(c);
            c = NULL;
        }
    } else if (c != NULL) {
        evhttp_connection_free(c);
        c = NULL;
    }
    if (u)
        evhttp_uri_free(u);
    if (c == NULL) {
        h->attempt = HOOK_ATTEMPTS - 1;
        hook_done(NULL, h);
    }
}

/* A directive as the service sees it, remaining_ms computed now. New reference. */
static json_t *directive_view(const struct osubd_act *d, const json_t *dir)
{
    json_t *o = json_deep_copy(dir);
    json_int_t dl = json_integer_value(json_object_get(o, "deadline_unix_ms"));
    if (dl > 0) {
        int64_t left = dl - osubd_now(d->core);
        json_object_set_new(o, "remaining_ms", json_integer(left > 0 ? left : 0));
    }
    return o;
}

static void waiter_reply(struct act_waiter *w, bool only_new);

static void waiter_free(struct osubd_act *d, struct act_waiter *w)
{
    for (struct act_waiter **pp = &d->act_waiters; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    if (w->timer)
        event_free(w->timer);
    osubd_client_unwatch(&w->watch);
    free(w);
}

static void post_directive(struct osubd_act *d, const osub_event_t *ev, const char *action)
{
    json_t *dir = json_pack(
        "{s:I, s:s, s:s, s:I, s:i, s:s, s:s}", "seq", (json_int_t)++d->directive_seq, "action",
        action, "service", ev->service, "vram_mib", (json_int_t)ev->vram_mib, "batch_size",
        ev->batch_size, "reason", osub_reason_name(ev->reason), "message", ev->msg);
    if (dir == NULL)
        return;
    static const char *const actions[] = {"degrade", "restore", "evict", "resume"};
    for (int i = 0; i < 4; i++)
        if (strcmp(action, actions[i]) == 0)
            d->directives_sent[i]++;
    if (ev->deadline_ms > 0)
        json_object_set_new(dir, "deadline_unix_ms",
                            json_integer(osubd_engine_to_unix(d->core, ev->deadline_ms)));
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, ev->service, &si) == 0 && si.checkpoint[0])
        json_object_set_new(dir, "checkpoint", json_string(si.checkpoint));
    json_t *x = json_object_get(d->execs, ev->service);
    if (json_object_get(x, "command") != NULL) {
        char ck[1024];
        checkpoint_dir(d, ev->service, ck, sizeof(ck));
        json_object_set_new(dir, "checkpoint_dir", json_string(ck));
    }
    json_t *list = json_object_get(d->directives, ev->service);
    if (list == NULL) {
        list = json_array();
        json_object_set_new(d->directives, ev->service, list);
    }
    json_array_append(list, dir);
    while (json_array_size(list) > DIRECTIVES_KEPT)
        json_array_remove(list, 0);
    /* the long-polls of that service */
    for (struct act_waiter *w = d->act_waiters, *next; w; w = next) {
        next = w->next;
        if (strcmp(w->id, ev->service) == 0)
            waiter_reply(w, true);
    }
    if (d->on_directive != NULL)
        d->on_directive(d->on_directive_arg, ev->service, action, ev->cause);
    const char *url = json_string_value(json_object_get(x, "control_url"));
    if (url != NULL) {
        struct hook *h = calloc(1, sizeof(*h));
        json_t *view = directive_view(d, dir);
        if (h != NULL) {
            h->d = d;
            snprintf(h->id, sizeof(h->id), "%s", ev->service);
            h->url = strdup(url);
            h->body = osubd_json_dumps(view, JSON_COMPACT);
            h->seq = (int64_t)json_integer_value(json_object_get(dir, "seq"));
            if (h->url && h->body)
                hook_send(h);
            else
                hook_free(h);
        }
        json_decref(view);
    }
    json_decref(dir);
}

static void send_json(struct evhttp_request *req, int code, json_t *body)
{
    struct evbuffer *b = evbuffer_new();
    char *text = body ? osubd_json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (b == NULL || text == NULL || evbuffer_add(b, text, strlen(text)) != 0 ||
        evbuffer_add(b, "\n", 1) != 0) {
        free(text);
        if (b != NULL)
            evbuffer_free(b);
        evhttp_send_reply(req, 503, "Service Unavailable", NULL); /* out of memory */
        return;
    }
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, code, code == 200 ? "OK" : code == 404 ? "Not Found" : "Bad Request", b);
    evbuffer_free(b);
}

/* Answers w with the directives after w->after (none: only when !only_new) and frees it. */
static void waiter_reply(struct act_waiter *w, bool only_new)
{
    struct osubd_act *d = w->d;
    json_t *out = json_array();
    size_t i;
    json_t *dir;
    json_array_foreach(json_object_get(d->directives, w->id), i, dir)
    {
        if (json_integer_value(json_object_get(dir, "seq")) > w->after)
            json_array_append_new(out, directive_view(d, dir));
    }
    if (only_new && json_array_size(out) == 0) {
        json_decref(out);
        return;
    }
    evhttp_connection_set_closecb(evhttp_request_get_connection(w->req), NULL, NULL);
    osub_service_info_t si;
    const char *state =
        osub_engine_service_info(d->e, w->id, &si) == 0 ? osub_state_name(si.state) : "released";
    send_json(w->req, 200,
              json_pack("{s:o, s:s, s:I}", "directives", out, "state", state, "last_seq",
                        (json_int_t)d->directive_seq));
    waiter_free(d, w);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    waiter_reply(arg, false);
}

static void waiter_gone(struct evhttp_connection *c, void *arg)
{
    (void)c;
    struct act_waiter *w = arg;
    waiter_free(w->d, w);
}

static int64_t query_int(const char *query, const char *key, int64_t dflt, bool *bad)
{
    struct evkeyvalq q;
    TAILQ_INIT(&q);
    int64_t v = dflt;
    if (query != NULL && evhttp_parse_query_str(query, &q) == 0) {
        const char *s = evhttp_find_header(&q, key);
        if (s != NULL) {
            char *end;
            errno = 0;
            long long x = strtoll(s, &end, 10);
            if (*s == '\0' || *end != '\0' || errno != 0 || x < 0)
                *bad = true;
            else
                v = x;
        }
    }
    evhttp_clear_headers(&q);
    return v;
}

void osubd_act_directives(struct osubd_act *d, struct evhttp_request *req, const char *id,
                          const char *query)
{
    bool bad = false;
    int64_t wait = query_int(query, "wait", 0, &bad);
    int64_t after = query_int(query, "after", 0, &bad);
    if (bad || wait > 60) {
        send_json(req, 400,
                  json_pack("{s:{s:s, s:s}}", "error", "code", "invalid_argument", "message",
                            "wait is 0 to 60 seconds, after a directive's seq (0 or more)"));
        return;
    }
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0 &&
        json_object_get(d->directives, id) == NULL) {
        send_json(req, 404,
                  json_pack("{s:{s:s, s:s}}", "error", "code", "unknown_service", "message",
                            "no such service"));
        return;
    }
    struct act_waiter *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    w->d = d;
    w->req = req;
    w->after = after;
    snprintf(w->id, sizeof(w->id), "%s", id);
    w->next = d->act_waiters;
    d->act_waiters = w;
    bool fresh = false;
    size_t i;
    json_t *dir;
    json_array_foreach(json_object_get(d->directives, id), i, dir)
    {
        fresh = fresh || json_integer_value(json_object_get(dir, "seq")) > after;
    }
    if (wait == 0 || fresh) {
        waiter_reply(w, false);
        return;
    }
    w->timer = evtimer_new(d->base, waiter_timeout, w);
    struct timeval tv = {(time_t)wait, 0};
    if (w->timer == NULL || evtimer_add(w->timer, &tv) != 0) {
        waiter_reply(w, false);
        return;
    }
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), waiter_gone, w);
    osubd_client_watch(&w->watch, d->base, req, &d->waiters_gone);
}

/* ---- exits -------------------------------------------------------------------------------- */

static void on_restart(evutil_socket_t fd, short what, void *arg);

static void exited_cmd(struct osubd_act *d, const char *id)
{
    apply(d, json_pack("{s:s, s:s}", "op", "exited", "id", id));
}

/* The process of p ended; status is waitpid's, or -1 when unknown (adopted, or found gone). */
static void on_exit_of(struct osubd_act *d, struct osub_proc *p, int status, const char *how)
{
    pid_t pid = p->pid;
    int64_t ran = osubd_now(d->core) - p->spawned_unix_ms;
    /* what it left behind (its group, its cgroup, its orphans) holds GPU memory too */
    signal_service(d, p->id, pid, SIGKILL);
    cg_remove(d, p->id);
    p->pid = 0;
    p->term_sent = false;
    if (p->kill_ev)
        evtimer_del(p->kill_ev);
    save_proc(d, p);
    char desc[160];
    bool failure;
    if (how != NULL) {
        snprintf(desc, sizeof(desc), "%s", how);
        failure = true;
        d->proc_exits[1]++;
    } else if (WIFEXITED(status)) {
        snprintf(desc, sizeof(desc), "exited with code %d", WEXITSTATUS(status));
        failure = WEXITSTATUS(status) != 0;
        d->proc_exits[failure ? 1 : 0]++;
    } else {
        d->proc_exits[2]++;
        snprintf(desc, sizeof(desc), "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
        failure = true;
    }
    char logf[1024];
    log_path(d, p->id, logf, sizeof(logf));
    osub_service_info_t si;
    bool known = osub_engine_service_info(d->e, p->id, &si) == 0;
    osubd_note(d->core, p->id, "process", "exit", "%s's process %d %s after %lld ms%s%s (log %s)", p->id,
               (int)pid, desc, (long long)(ran > 0 ? ran : 0), known ? " while " : "",
               known ? osub_state_name(si.state) : "", logf);
    if (!known)
        return;
    if (draining_state(si.state)) {
        exited_cmd(d, p->id);
        return;
    }
    if (!live_state(si.state))
        return;
    if (!failure) {
        exited_cmd(d, p->id);
        return;
    }
    json_t *x = json_object_get(d->execs, p->id);
    const char *restart = json_string_value(json_object_get(x, "restart"));
    bool on_failure = restart != NULL && strcmp(restart, "on-failure") == 0;
    int max = json_is_integer(json_object_get(x, "max_restarts"))
                  ? (int)json_integer_value(json_object_get(x, "max_restarts"))
                  : 5;
    char why[1400];
    if (on_failure && p->restarts < max) {
        p->restarts++;
        int64_t ms = 1000LL << (p->restarts - 1 < 5 ? p->restarts - 1 : 5);
        if (ms > 30000)
            ms = 30000;
        if (p->restart_ev == NULL)
            p->restart_ev = evtimer_new(d->base, on_restart, p);
        struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
        if (p->restart_ev != NULL && evtimer_add(p->restart_ev, &tv) == 0) {
            osubd_note(d->core, p->id, "process", "restart",
                       "restarting %s in %lld ms (restart %d of at most %d)", p->id, (long long)ms,
                       p->restarts, max);
            return;
        }
    }
    if (on_failure) {
        snprintf(why, sizeof(why), "its process kept failing: it %s, after %d restart(s); see %s",
                 desc, p->restarts, logf);
        apply_fail(d, p, why);
    } else if (ran < FAST_EXIT_MS) {
        snprintf(why, sizeof(why), "its process %s at once (after %lld ms); see %s", desc,
                 (long long)ran, logf);
        apply_fail(d, p, why);
    } else {
        exited_cmd(d, p->id);
    }
}

static void reconcile(struct osubd_act *d);

static void on_restart(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_proc *p = arg;
    reconcile(p->d);
}

static void on_sigchld(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_act *d = arg;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (struct osub_proc *p = d->proc_list; p; p = p->next)
            if (p->pid == pid && p->child) {
                on_exit_of(d, p, status, NULL);
                break;
            }
    }
    reconcile(d);
}

/* Keeps a service's log under its cap: copied to .1, then emptied in place (the process keeps
 * its descriptor, opened for appending, and goes on writing at the new end). */
static void rotate_log(struct osubd_act *d, const char *id)
{
    char logf[1024], old[1100];
    log_path(d, id, logf, sizeof(logf));
    struct stat st;
    if (stat(logf, &st) != 0 || st.st_size <= d->cfg->service_log_max)
        return;
    snprintf(old, sizeof(old), "%s.1", logf);
    int in = open(logf, O_RDONLY | O_CLOEXEC);
    int out = open(old, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    char buf[65536];
    ssize_t n;
    bool ok = in >= 0 && out >= 0;
    while (ok && (n = read(in, buf, sizeof(buf))) > 0)
        ok = write(out, buf, (size_t)n) == n;
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    if (ok && truncate(logf, 0) == 0)
        return;
    osubd_log(OSUBD_LOG_WARN, "cannot rotate %s: %s", logf, strerror(errno));
}

/* What oversubd reads of a segment, copied out under the guard below. */
#define seg_view osub_seg_view

/* A segment is a file of the service's user, who can shrink it under our mapping: a read past
 * its end is SIGBUS. Every look at one runs under this guard; a fault drops that segment (the
 * service runs on, its processes' shim refusing what it cannot account for) instead of the
 * daemon. */
static sigjmp_buf *seg_guard;

static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
    (void)info;
    (void)ctx;
    if (seg_guard != NULL)
        siglongjmp(*seg_guard, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void seg_drop(struct osubd_act *d, struct osub_proc *p, const char *why)
{
    /* events are anyone's to read: the path only in oversubd's own log */
    osubd_log(OSUBD_LOG_INFO, "%s: its CUDA shim segment %s %s", p->id, p->seg_path, why);
    osubd_note(d->core, p->id, "shim", "damaged",
               "%s: its CUDA shim segment %s: no longer read (its grant is not updated)", p->id,
               why);
    osub_seg_cleanup(&p->seg);
}

/* The largest GPU of the pool, in bytes: no device of a segment can hold more. */
static uint64_t largest_gpu_bytes(struct osubd_act *d)
{
    osub_pool_info_t pi;
    uint64_t most = 0;
    osub_engine_pool_info(d->e, &pi);
    for (int32_t g = 0; g < pi.n_gpus + pi.n_lost; g++) {
        osub_gpu_info_t gi;
        if (osub_engine_gpu_info(d->e, g, &gi) == 0 && gi.vram_mib > 0 &&
            (uint64_t)gi.vram_mib << 20 > most)
            most = (uint64_t)gi.vram_mib << 20;
    }
    return most;
}

/* A segment that said something impossible: the service's fault. Its figure is ignored this
 * round (said once until a round reads clean), the daemon reads on. */
static void seg_fault(struct osubd_act *d, struct osub_proc *p, const char *why)
{
    if (!p->seg_faulty)
        osubd_note(d->core, p->id, "shim", "tampered",
                   "%s: its CUDA shim segment: %s; its figure is ignored until it reads clean",
                   p->id, why);
    p->seg_faulty = true;
}

/* Reads the segment (and, with si, first reclaims dead processes and writes the engine's
 * grants into it). Everything read is bounded by the geometry copied when the segment was
 * made; a rewritten header is put back. false when there is nothing to believe this round
 * (the segment was dropped, or said something impossible). */
static bool seg_look(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si,
                     struct seg_view *v)
{
    struct stat st;
    if (fstat(p->seg.fd, &st) != 0 || st.st_size != (off_t)sizeof(struct osub_seg)) {
        seg_drop(d, p, "changed size");
        return false;
    }
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        seg_guard = NULL;
        seg_drop(d, p, "was cut short while oversubd read it");
        return false;
    }
    seg_guard = &jb;
    memset(v, 0, sizeof(*v));
    char why[300];
    bool clean = osub_seg_check(&p->seg, true, why, sizeof(why)) == 0;
    if (!clean)
        seg_fault(d, p, why);
    if (si != NULL) {
        osub_seg_reclaim(&p->seg, &v->got);
        for (uint32_t i = 0; i < p->seg.n_devices && i < (uint32_t)si->n_slots; i++) {
            uint64_t want = (uint64_t)si->slots[i].grant_mib << 20;
            if (osub_seg_grant(&p->seg, i) != want)
                osub_seg_set_grant(&p->seg, i, want);
        }
    }
    /* no device of the service can hold more than its whole request (the shim reserves only
     * under a grant, and no grant is above the request): a figure above it is a lie */
    uint64_t cap = largest_gpu_bytes(d);
    osub_service_info_t mine;
    if (osub_engine_service_info(d->e, p->id, &mine) == 0 && mine.spec != NULL &&
        mine.spec->vram_mib > 0 && ((uint64_t)mine.spec->vram_mib << 20) < cap)
        cap = (uint64_t)mine.spec->vram_mib << 20;
    if (osub_seg_view(&p->seg, cap, v, why, sizeof(why)) != 0) {
        if (clean)
            seg_fault(d, p, why);
        clean = false;
    }
    seg_guard = NULL;
    if (clean)
        p->seg_faulty = false;
    return clean;
}

/* osub_seg_open under the SIGBUS guard: the service may cut the file short between the size
 * check and the header's read (an attack review's SIGBUS at restart). 0, or a negative errno
 * with a sentence in err. */
static int seg_open_guarded(struct osub_segment *g, const char *path, char *err, size_t errlen)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        seg_guard = NULL;
        osub_seg_cleanup(g);
        snprintf(err, errlen, "%s was cut short while oversubd opened it", path);
        return -EFAULT;
    }
    seg_guard = &jb;
    int rc = osub_seg_open(g, path, err, errlen);
    seg_guard = NULL;
    return rc;
}

/* Sets every device's grant in a mapped segment to 0, under the guard; false when the segment
 * faulted (it is then unmapped). */
static bool seg_zero_guarded(struct osub_segment *g)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        seg_guard = NULL;
        osub_seg_cleanup(g);
        return false;
    }
    seg_guard = &jb;
    for (uint32_t i = 0; i < g->n_devices; i++)
        if (osub_seg_grant(g, i) != 0)
            osub_seg_set_grant(g, i, 0);
    seg_guard = NULL;
    return true;
}

static uint64_t to_mib(uint64_t bytes)
{
    return (bytes + (1u << 20) - 1) >> 20;
}

/* A service's shim segment, every watch round: processes that died give back what they held;
 * the engine's grant on each GPU becomes the segment's (a degrade lowers it, a restore raises
 * it); what the processes hold becomes the service's usage, exact and per GPU (a command only
 * when it changed; once more when the last process using the shim is gone). */
static void shim_sync(struct osubd_act *d, struct osub_proc *p)
{
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, p->id, &si) != 0)
        return;
    struct seg_view v;
    if (!seg_look(d, p, &si, &v))
        return;
    if (v.got > 0) {
        osubd_note(d->core, p->id, "shim", "reclaimed",
                   "%s: %llu MiB held by processes that died taken back into its grant", p->id,
                   (unsigned long long)to_mib(v.got));
    }
    bool reported = false;
    for (uint32_t i = 0; i < v.n; i++)
        reported = reported || p->seg_reported[i] != 0;
    if ((v.live == 0 && !reported) || v.n != (uint32_t)si.n_slots || !live_state(si.state))
        return;
    bool changed = false;
    json_t *per = json_array();
    for (uint32_t i = 0; i < v.n; i++) {
        uint64_t mib = to_mib(v.held[i]);
        changed = changed || mib != p->seg_reported[i] || (int64_t)mib != si.slots[i].used_mib;
        p->seg_reported[i] = mib;
        json_array_append_new(per, json_integer((json_int_t)mib));
    }
    if (!changed) {
        json_decref(per);
        return;
    }
    json_t *cmd = json_pack("{s:s, s:s, s:o}", "op", "usage", "id", p->id, "gpus", per);
    apply(d, cmd);
}

/* A process adopted after oversubd restarted keeps the segment it was started with: map it
 * again (once; a missing or foreign file means it runs without one). */
static void shim_adopt(struct osubd_act *d, struct osub_proc *p)
{
    if (p->seg_path[0] != '\0')
        return; /* tried before */
    char sd[512];
    state_dir(d, sd, sizeof(sd));
    snprintf(p->seg_path, sizeof(p->seg_path), "%s/shim/%s.seg", sd, p->id);
    char err[512];
    if (access(p->seg_path, F_OK) == 0 &&
        seg_open_guarded(&p->seg, p->seg_path, err, sizeof(err)) != 0)
        osubd_log(OSUBD_LOG_WARN, "%s: its CUDA shim segment cannot be used: %s", p->id, err);
}

static void on_watch(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_act *d = arg;
    static unsigned rounds;
    rounds++;
    for (struct osub_proc *p = d->proc_list, *next; p; p = next) {
        next = p->next;
        if (p->seg.s == NULL && p->pid > 0 && !p->child && d->shim_path[0])
            shim_adopt(d, p);
        if (p->seg.s != NULL)
            shim_sync(d, p);
        if (p->pid <= 0) {
            if (rounds % 5 == 0)
                cg_remove(d, p->id);
            continue;
        }
        if (!p->child && proc_starttime(p->pid) != p->starttime)
            on_exit_of(d, p, -1, "ended (an adopted process: its exit status is unknown)");
        else if (rounds % 5 == 0)
            rotate_log(d, p->id);
    }
    /* external services that gave their PID: draining and gone means exited */
    size_t nk;
    osubd__idmap_key_t *keys = osubd__idmap_keys(d->pids, &nk); /* exited_cmd may forget one */
    for (size_t k = 0; k < nk; k++) {
        const char *id = keys[k];
        struct osub_proc *p = proc_find(d, id);
        if (p != NULL && (p->pid > 0 || osubd_act_managed(d, id)))
            continue;
        osub_service_info_t si;
        pid_t pid = osubd_act_pid(d, id);
        if (pid > 0 && osub_engine_service_info(d->e, id, &si) == 0 && draining_state(si.state) &&
            kill(pid, 0) != 0 && errno == ESRCH) {
            osubd_note(d->core, id, "process", "gone", "%s's process %d is gone while %s", id, (int)pid,
                       osub_state_name(si.state));
            exited_cmd(d, id);
        }
    }
    free(keys);
    reconcile(d);
}

/* ---- reconciling processes with the engine's states -------------------------------------- */

static void reconcile(struct osubd_act *d)
{
    const char *id;
    json_t *x;
    void *tmp;
    osub_pool_config_t cfg;
    osub_engine_config(d->e, &cfg);
    json_object_foreach_safe(d->execs, tmp, id, x)
    {
        osub_service_info_t si;
        bool known = osub_engine_service_info(d->e, id, &si) == 0;
        struct osub_proc *p = proc_find(d, id);
        bool alive = p != NULL && p->pid > 0;
        if (json_object_get(x, "command") == NULL) {
            if (!known) {
                char gone[OSUB_ID_MAX + 1];
                snprintf(gone, sizeof(gone), "%s", id);
                json_object_del(d->execs, gone);
                d->dirty = true;
            }
            continue;
        }
        if (known && live_state(si.state)) {
            bool waiting =
                p != NULL && p->restart_ev != NULL && evtimer_pending(p->restart_ev, NULL);
            if (!alive && !waiting && (p == NULL || !p->failed) && (p = proc_get(d, id)) != NULL)
                spawn(d, p, &si);
            continue;
        }
        if (known && draining_state(si.state)) {
            if (alive && !p->term_sent)
                terminate(d, p, osubd_engine_to_unix(d->core, si.deadline_ms), "it is evicted");
            continue;
        }
        if (p != NULL && p->restart_ev != NULL)
            evtimer_del(p->restart_ev);
        if (alive) {
            if (!p->term_sent)
                terminate(d, p, osubd_now(d->core) + cfg.grace_ms,
                          known ? "it is no longer running" : "it was released");
            continue;
        }
        if (!known) {
            char gone[OSUB_ID_MAX + 1];
            snprintf(gone, sizeof(gone), "%s", id); /* id is the key deleted next */
            json_object_del(d->execs, gone);
            d->dirty = true;
            if (p != NULL)
                proc_drop(d, p);
        }
    }
}

/* ---- the events of the engine --------------------------------------------------------- */

struct act_item {
    osub_event_t ev;
    uint64_t ticket;
};

static void on_act(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_act *d = arg;
    struct act_item *q = d->act_q;
    size_t done = 0;
    /* a directive or a signal only once its decision is on disk */
    while (done < d->act_n && q[done].ticket <= osubd_core_durable(d->core)) {
        osub_event_t ev = q[done++].ev;
        json_t *x = json_object_get(d->execs, ev.service);
        bool managed = json_object_get(x, "command") != NULL;
        switch (ev.kind) {
        case OSUB_EV_DEGRADE:
            post_directive(d, &ev, "degrade");
            break;
        case OSUB_EV_RESTORE:
            post_directive(d, &ev, "restore");
            break;
        case OSUB_EV_EVICT: {
            post_directive(d, &ev, "evict");
            struct osub_proc *p = proc_find(d, ev.service);
            if (managed && p != NULL && p->pid > 0)
                terminate(d, p, osubd_engine_to_unix(d->core, ev.deadline_ms), "it is evicted");
            break;
        }
        case OSUB_EV_RESUME:
            if (!managed)
                post_directive(d, &ev, "resume");
            break;
        default:
            break;
        }
    }
    if (done > 0) {
        memmove(q, q + done, (d->act_n - done) * sizeof(*q));
        d->act_n -= done;
    }
    reconcile(d);
}

void osubd_act_events(struct osubd_act *d, const osub_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ev[i].service[0] == '\0')
            continue;
        osub_event_kind_t k = ev[i].kind;
        if (k != OSUB_EV_DEGRADE && k != OSUB_EV_RESTORE && k != OSUB_EV_EVICT &&
            k != OSUB_EV_RESUME && k != OSUB_EV_START && k != OSUB_EV_RELEASE &&
            k != OSUB_EV_REQUEUE && k != OSUB_EV_FAIL)
            continue;
        if (d->act_n == d->act_cap) {
            size_t cap = d->act_cap ? d->act_cap * 2 : 16;
            void *nq = realloc(d->act_q, cap * sizeof(struct act_item));
            if (nq == NULL) {
                osubd_fatal(d->core, "out of memory queueing an action");
                return;
            }
            d->act_q = nq;
            d->act_cap = cap;
        }
        struct act_item *q = d->act_q;
        q[d->act_n].ev = ev[i];
        q[d->act_n].ticket = osubd_core_applied(d->core);
        d->act_n++;
    }
    /* nothing queued, nothing to do: the watch timer reconciles the rest */
    if (d->act_ev != NULL && d->act_n > 0)
        event_active(d->act_ev, EV_TIMEOUT, 0);
}

/* ---- what the API shows, what the state keeps ------------------------------------------- */

/* The "shim" block of a service's JSON: its segment's grant, held, peak (a managed service's,
 * or a pod's, made by the device plugin). */
static void describe_shim(struct osubd_act *d, const struct osubd_caller *who, struct osub_proc *p,
                          json_t *o)
{
    struct seg_view sv;
    if (p != NULL && p->seg.s != NULL && seg_look(d, p, NULL, &sv)) {
        json_t *grant = json_array(), *held = json_array(), *peak = json_array();
        for (uint32_t i = 0; i < sv.n; i++) {
            json_array_append_new(grant, json_integer((json_int_t)(sv.grant[i] >> 20)));
            json_array_append_new(held, json_integer((json_int_t)to_mib(sv.held[i])));
            json_array_append_new(peak, json_integer((json_int_t)to_mib(sv.peak[i])));
        }
        /* the path is a way into the service's accounting: the admin's (and the socket's) only */
        json_object_set_new(o, "shim",
                            json_pack("{s:s, s:i, s:o, s:o, s:o, s:I, s:I}", "segment",
                                      who->admin ? p->seg_path : "<redacted>", "processes",
                                      sv.live, "grant_mib", grant, "held_mib", held, "peak_mib",
                                      peak, "refused", (json_int_t)sv.refused, "reclaimed_mib",
                                      (json_int_t)(sv.reclaimed >> 20)));
    }
}

void osubd_act_describe(struct osubd_act *d, const struct osubd_caller *who, const char *id,
                        json_t *o)
{
    json_t *x = json_object_get(d->execs, id);
    const char *k;
    json_t *v;
    json_object_foreach(x, k, v)
    {
        if (!who->admin && strcmp(k, "command") == 0) {
            /* arguments may carry secrets (--api-key=...): only the admin reads them */
            json_t *red = json_array();
            for (size_t i = 0; i < json_array_size(v); i++)
                json_array_append_new(red, i == 0 ? json_copy(json_array_get(v, 0))
                                                  : json_string("<redacted>"));
            json_object_set_new(o, k, red);
            continue;
        }
        if (!who->admin && strcmp(k, "control_url") == 0) {
            json_object_set_new(o, k, json_string("<redacted>"));
            continue;
        }
        if (strcmp(k, "env") != 0) {
            json_object_set(o, k, v);
            continue;
        }
        /* env's values may be secrets: only its names are shown */
        json_t *names = json_array();
        const char *ek;
        json_t *ev;
        json_object_foreach(v, ek, ev) json_array_append_new(names, json_string(ek));
        json_object_set_new(o, "env_keys", names);
    }
    if (json_object_get(x, "command") == NULL) {
        if (json_object_get(x, "kubernetes") != NULL)
            describe_shim(d, who, proc_find(d, id), o); /* a pod: its segment, if allocated */
        return;
    }
    char logf[1024], ck[1024];
    log_path(d, id, logf, sizeof(logf));
    checkpoint_dir(d, id, ck, sizeof(ck));
    struct osub_proc *p = proc_find(d, id);
    json_t *proc = json_pack("{s:s, s:s, s:i, s:b}", "log", logf, "checkpoint_dir", ck, "restarts",
                             p ? p->restarts : 0, "alive", p != NULL && p->pid > 0);
    if (p != NULL && p->pid > 0)
        json_object_set_new(proc, "pid", json_integer(p->pid));
    if (d->cg_base[0]) {
        char cg[800], f[900];
        cg_path(d, id, cg, sizeof(cg));
        pid_t pids[256];
        int n = cg_pids(d, id, pids, 256);
        json_t *c = json_pack("{s:s, s:i}", "cgroup", cg, "processes", n < 0 ? 0 : n);
        static const char *const stat[] = {"memory.current", "pids.current"};
        for (int i = 0; i < 2; i++) {
            snprintf(f, sizeof(f), "%s/%s", cg, stat[i]);
            FILE *fp = fopen(f, "re");
            long long cv;
            if (fp != NULL && fscanf(fp, "%lld", &cv) == 1)
                json_object_set_new(c, i == 0 ? "memory_bytes" : "pids", json_integer(cv));
            if (fp != NULL)
                fclose(fp);
        }
        json_object_set_new(proc, "tracking", c);
    } else {
        json_object_set_new(
            proc, "tracking",
            json_pack("{s:s, s:s}", "subreaper", "oversubd", "why_no_cgroup", d->cg_why));
    }
    json_object_set_new(o, "process", proc);
    describe_shim(d, who, p, o);
}

void osubd_act_metrics(struct osubd_act *d, struct evbuffer *b)
{
    int alive = 0;
    for (struct osub_proc *p = d->proc_list; p; p = p->next)
        alive += p->pid > 0;
    evbuffer_add_printf(
        b,
        "# HELP oversub_managed_processes Managed services' processes alive now.\n"
        "# TYPE oversub_managed_processes gauge\n"
        "oversub_managed_processes %d\n"
        "# HELP oversub_process_starts_total Managed processes started (starts and restarts).\n"
        "# TYPE oversub_process_starts_total counter\n"
        "oversub_process_starts_total %llu\n"
        "# HELP oversub_process_exits_total Managed processes that ended, by how.\n"
        "# TYPE oversub_process_exits_total counter\n"
        "oversub_process_exits_total{how=\"code_zero\"} %llu\n"
        "oversub_process_exits_total{how=\"failed\"} %llu\n"
        "oversub_process_exits_total{how=\"signal\"} %llu\n"
        "# HELP oversub_directives_total Directives issued to services, by action.\n"
        "# TYPE oversub_directives_total counter\n"
        "oversub_directives_total{action=\"degrade\"} %llu\n"
        "oversub_directives_total{action=\"restore\"} %llu\n"
        "oversub_directives_total{action=\"evict\"} %llu\n"
        "oversub_directives_total{action=\"resume\"} %llu\n"
        "# HELP oversub_webhook_failures_total Directives a webhook could not deliver.\n"
        "# TYPE oversub_webhook_failures_total counter\n"
        "oversub_webhook_failures_total %llu\n",
        alive, (unsigned long long)d->proc_starts, (unsigned long long)d->proc_exits[0],
        (unsigned long long)d->proc_exits[1], (unsigned long long)d->proc_exits[2],
        (unsigned long long)d->directives_sent[0],
        (unsigned long long)d->directives_sent[1],
        (unsigned long long)d->directives_sent[2],
        (unsigned long long)d->directives_sent[3],
        (unsigned long long)d->webhook_failures);
}

static void act_meta(struct osubd_act *d, json_t *meta)
{
    struct osubd_act *a = d;
    osubd_meta_put(meta, "service_exec", a->execs);
    json_t *procs = json_object(), *pids = json_object();
    for (struct osub_proc *p = a->proc_list; p != NULL; p = p->next)
        if (p->pid > 0)
            json_object_set_new(procs, p->id,
                                json_pack("{s:i, s:I, s:i}", "pid", (int)p->pid, "starttime",
                                          (json_int_t)p->starttime, "restarts", p->restarts));
    if (a->saved_procs != NULL) /* not adopted yet: kept as they were */
        json_object_update_missing(procs, a->saved_procs);
    osubd_meta_put(meta, "managed_procs", procs);
    for (size_t i = 0; i < osubd__idmap_slots(a->pids); i++) {
        void *v;
        const char *id = osubd__idmap_at(a->pids, i, &v);
        if (id != NULL)
            json_object_set_new(pids, id, json_integer(((struct act_pid *)v)->pid));
    }
    osubd_meta_put(meta, "service_pids", pids);
    json_decref(procs);
    json_decref(pids);
}


int osubd_act_set_pid(struct osubd_act *d, const char *id, pid_t pid)
{
    struct act_pid *v = malloc(sizeof(*v));
    if (v == NULL)
        return -1;
    v->pid = pid;
    if (osubd__idmap_put(d->pids, id, v) != 0) {
        free(v);
        return -1;
    }
    d->dirty = true;
    return 0;
}

pid_t osubd_act_pid(const struct osubd_act *d, const char *id)
{
    const struct act_pid *v = osubd__idmap_get(d->pids, id);
    return v != NULL ? v->pid : 0;
}

osubd__idmap_key_t *osubd_act_pid_ids(const struct osubd_act *d, size_t *n)
{
    return osubd__idmap_keys(d->pids, n);
}

bool osubd_act_exec_equal(const struct osubd_act *d, const char *id, const json_t *exec)
{
    const json_t *live = json_object_get(d->execs, id);
    return live != NULL && json_equal((json_t *)live, (json_t *)exec);
}

json_t *osubd_act_pod_ids(const struct osubd_act *d)
{
    json_t *out = json_array();
    const char *id;
    json_t *x;
    json_object_foreach(d->execs, id, x)
    {
        if (json_object_get(x, "kubernetes") != NULL)
            json_array_append_new(out, json_string(id));
    }
    return out;
}

const json_t *osubd_act_kube(const struct osubd_act *d, const char *id)
{
    return json_object_get(json_object_get(d->execs, id), "kubernetes");
}

bool osubd_act_managed(const struct osubd_act *d, const char *id)
{
    return json_object_get(json_object_get(d->execs, id), "command") != NULL;
}

int osubd_act_commit_exec(struct osubd_act *d, const char *id, json_t *exec)
{
    if (json_object_set(d->execs, id, exec) != 0)
        return -1;
    d->dirty = true;
    return 0;
}

void osubd_act_forget(struct osubd_act *d, const char *id)
{
    /* the PID and the directives go with the service; how it ran and its process stay until
     * the process is gone (reconcile) */
    if (osubd__idmap_del(d->pids, id))
        d->dirty = true;
    json_object_del(d->directives, id);
}

/* A JSON object saved under key (an empty one when absent); -1 with err when the state cannot
 * be read or what it holds is not an object. */
static json_t *saved_object(struct osubd_core *c, const char *key, char *err, size_t errlen)
{
    char *text = NULL;
    if (osubd_core_meta(c, key, &text, err, errlen) != 0)
        return NULL;
    json_error_t je;
    json_t *o = text != NULL ? json_loads(text, 0, &je) : json_object();
    free(text);
    if (!json_is_object(o)) {
        json_decref(o);
        snprintf(err, errlen, "the state's %s is not a JSON object", key);
        return NULL;
    }
    return o;
}

struct osubd_act *osubd_act_new(struct osubd_core *c, const struct osubd_gpus *gpus,
                                const struct osubd_destinations *dest, char *err, size_t errlen)
{
    struct osubd_act *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    a->core = c;
    a->cfg = osubd_core_config(c);
    a->base = osubd_core_base(c);
    a->e = osubd_core_engine(c);
    a->gpus = gpus;
    a->dest = dest;
    if (act_setup(a, err, errlen) != 0) {
        osubd_act_free(a);
        return NULL;
    }
    return a;
}

/* The subreaper, cgroups, the SIGBUS guard, the shim, the maps. */
static int act_setup(struct osubd_act *a, char *err, size_t errlen)
{
    struct osubd_act *d = a;
    /* orphans of services (a double fork) come to us, not to init: they are found and reaped */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        osubd_log(OSUBD_LOG_WARN, "cannot become a subreaper: %s", strerror(errno));
    cg_setup(d);
    if (!a->cg_base[0] && d->cfg->cgroup[0] == '/') {
        snprintf(err, errlen, "cgroup: %s", a->cg_why);
        return -1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    const char *shim = d->cfg->cuda_shim;
    if (strcmp(shim, "none") == 0) {
        a->shim_path[0] = '\0';
    } else if (shim[0] != '\0') {
        if (shim[0] != '/' || access(shim, R_OK) != 0) {
            snprintf(err, errlen,
                     "cuda_shim: '%.400s' is not a readable absolute path (\"none\" "
                     "runs services without it)",
                     shim);
            return -1;
        }
        snprintf(a->shim_path, sizeof(a->shim_path), "%s", shim);
    } else {
        /* next to oversubd (a build), or in ../lib/oversub (an install) */
        char exe[PATH_MAX], cand[PATH_MAX + 64];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n > 0) {
            exe[n] = '\0';
            *strrchr(exe, '/') = '\0';
            for (int i = 0; i < 2 && !a->shim_path[0]; i++) {
                snprintf(cand, sizeof(cand), "%s/%sliboversub-cuda.so", exe,
                         i == 0 ? "" : "../lib/oversub/");
                char *r = realpath(cand, NULL);
                if (r != NULL && access(r, R_OK) == 0 && strlen(r) < sizeof(a->shim_path))
                    snprintf(a->shim_path, sizeof(a->shim_path), "%s", r);
                free(r);
            }
        }
        if (!a->shim_path[0])
            osubd_log(OSUBD_LOG_WARN, "liboversub-cuda.so not found next to oversubd: managed "
                            "services run without the CUDA shim (set cuda_shim)");
    }
    a->pids = osubd__idmap_new(free);
    a->directives = json_object();
    if (a->pids == NULL || a->directives == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static int act_load(void *ctx, struct osubd_core *c, char *err, size_t errlen)
{
    struct osubd_act *a = ctx, *d = a;
    json_t *pids = saved_object(c, "service_pids", err, errlen);
    if (pids == NULL)
        return -1;
    const char *id;
    json_t *v;
    json_object_foreach(pids, id, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 4194304 ||
            !osub_id_valid(id)) {
            snprintf(err, errlen, "the state's service_pids has a bad entry for %.63s", id);
            json_decref(pids);
            return -1;
        }
        if (osubd_act_set_pid(d, id, (pid_t)json_integer_value(v)) != 0) {
            snprintf(err, errlen, "out of memory");
            json_decref(pids);
            return -1;
        }
    }
    json_decref(pids);
    a->dirty = false;
    json_decref(a->execs);
    if ((a->execs = saved_object(c, "service_exec", err, errlen)) == NULL ||
        (a->saved_procs = saved_object(c, "managed_procs", err, errlen)) == NULL)
        return -1;
    return 0;
}

static bool act_dirty(void *ctx)
{
    return ((struct osubd_act *)ctx)->dirty;
}

static void act_saved(void *ctx, bool ok)
{
    if (ok)
        ((struct osubd_act *)ctx)->dirty = false;
}

static void act_save(void *ctx, json_t *meta)
{
    act_meta(ctx, meta);
}

static void act_events(void *ctx, const osub_event_t *ev, size_t n)
{
    osubd_act_events(ctx, ev, n);
}

static void act_durable(void *ctx, const struct osubd_progress *p)
{
    if (p->commit) /* directives and signals wait for their decisions' commit */
        osubd_act_events(ctx, NULL, 0);
}

static void act_forget(void *ctx, const char *id)
{
    osubd_act_forget(ctx, id);
}

static void act_metrics(void *ctx, struct evbuffer *b)
{
    osubd_act_metrics(ctx, b);
}

struct osubd_module osubd_act_module(struct osubd_act *a)
{
    struct osubd_module m = {.name = "actuators",
                             .ctx = a,
                             .load = act_load,
                             .dirty = act_dirty,
                             .save = act_save,
                             .saved = act_saved,
                             .events = act_events,
                             .durable = act_durable,
                             .forget = act_forget,
                             .metrics = act_metrics};
    return m;
}

void osubd_act_listen(struct osubd_act *a, osubd_directive_fn fn, void *arg)
{
    a->on_directive = fn;
    a->on_directive_arg = arg;
}

uint64_t osubd_act_waiters_gone(const struct osubd_act *a)
{
    return a->waiters_gone;
}

/* ---- start and stop ----------------------------------------------------------------------- */

int osubd_act_start(struct osubd_act *d, char *err, size_t errlen)
{
    /* service cgroup folders a previous run left empty (released, failed starts): removed
     * (one still holding processes stays: an adopted service's, or leftovers to kill) */
    DIR *cgd = d->cg_base[0] ? opendir(d->cg_base) : NULL;
    for (struct dirent *e; cgd != NULL && (e = readdir(cgd)) != NULL;)
        if (e->d_type == DT_DIR && osub_id_valid(e->d_name))
            cg_remove(d, e->d_name);
    if (cgd != NULL)
        closedir(cgd);
    /* PIDs of services the engine does not know (a damaged or older state): forgotten, so
     * that a new service of that id inherits nothing */
    size_t nk;
    osubd__idmap_key_t *keys = osubd__idmap_keys(d->pids, &nk);
    for (size_t k = 0; k < nk; k++)
        if (osub_engine_service_info(d->e, keys[k], &(osub_service_info_t){0}) != 0)
            osubd_act_forget(d, keys[k]);
    free(keys);
    d->directive_seq = osubd_unix_ms(); /* directive numbers keep rising across restarts */
    d->act_ev = event_new(d->base, -1, 0, on_act, d);
    d->sigchld_ev = evsignal_new(d->base, SIGCHLD, on_sigchld, d);
    d->watch_ev = event_new(d->base, -1, EV_PERSIST, on_watch, d);
    struct timeval tv = {0, WATCH_MS * 1000};
    if (d->act_ev == NULL || d->sigchld_ev == NULL || d->watch_ev == NULL ||
        event_add(d->sigchld_ev, NULL) != 0 || event_add(d->watch_ev, &tv) != 0) {
        snprintf(err, errlen, "cannot set up the actuators");
        return -1;
    }
    /* the directives that were outstanding, again: a service long-polling after our restart
     * still learns what it must do, with the same deadlines */
    for (size_t i = 0; i < osub_engine_service_count(d->e); i++) {
        const char *id = osub_engine_service_id(d->e, i);
        osub_service_info_t si;
        if (osub_engine_service_info(d->e, id, &si) != 0)
            continue;
        bool deg = si.state == OSUB_STATE_DEGRADED && si.ack_pending;
        if (!deg && !draining_state(si.state))
            continue;
        osub_event_t ev;
        memset(&ev, 0, sizeof(ev));
        snprintf(ev.service, sizeof(ev.service), "%s", id);
        ev.kind = deg ? OSUB_EV_DEGRADE : OSUB_EV_EVICT;
        ev.reason = OSUB_R_PREEMPTION;
        ev.vram_mib = deg ? si.grant_mib : 0;
        ev.batch_size = deg ? si.batch_size : 0;
        ev.deadline_ms = si.deadline_ms;
        snprintf(ev.msg, sizeof(ev.msg),
                 "%s is still %s (directive repeated after oversubd "
                 "restarted)",
                 id, deg ? "to acknowledge its degrade" : "evicted");
        post_directive(d, &ev, deg ? "degrade" : "evict");
    }
    /* adopt the managed processes that lived through our restart */
    const char *key;
    json_t *rec;
    void *tmp;
    json_t *saved = d->saved_procs;
    d->saved_procs = NULL;
    json_object_foreach_safe(saved, tmp, key, rec)
    {
        char id[OSUB_ID_MAX + 1];
        snprintf(id, sizeof(id), "%s", key); /* the entry may be replaced below */
        pid_t pid = (pid_t)json_integer_value(json_object_get(rec, "pid"));
        unsigned long long st =
            (unsigned long long)json_integer_value(json_object_get(rec, "starttime"));
        struct osub_proc *p = proc_get(d, id);
        if (p == NULL || pid <= 0)
            continue;
        p->restarts = (int)json_integer_value(json_object_get(rec, "restarts"));
        p->pid = pid;
        p->child = false;
        p->starttime = st;
        p->spawned_unix_ms = osubd_now(d->core);
        if (st != 0 && proc_starttime(pid) == st) {
            osubd_note(d->core, id, "process", "adopt",
                       "adopted %s's process %d, alive across oversubd's restart", id, (int)pid);
            osub_service_info_t si;
            if (osub_engine_service_info(d->e, id, &si) == 0 && draining_state(si.state)) {
                /* it was told before; the SIGKILL at the same deadline is ours to send */
                p->term_sent = true;
                terminate(d, p, osubd_engine_to_unix(d->core, si.deadline_ms), "it is evicted");
            }
            continue;
        }
        /* died while we were away: exited, whatever its restart policy */
        osubd_note(d->core, id, "process", "exit",
                   "%s's process %d ended while oversubd was down: treated as exited", id,
                   (int)pid);
        p->pid = 0;
        save_proc(d, p);
        osub_service_info_t si;
        if (osub_engine_service_info(d->e, id, &si) == 0 &&
            (live_state(si.state) || draining_state(si.state))) {
            p->failed = true; /* not started again by the reconcile below */
            exited_cmd(d, id);
            p->failed = false;
        }
    }
    json_decref(saved);
    reconcile(d);
    return 0;
}

void osubd_act_free(struct osubd_act *d)
{
    if (d == NULL)
        return;
    /* managed processes keep running: the next oversubd adopts them */
    while (d->proc_list != NULL)
        proc_drop(d, d->proc_list);
    while (d->act_waiters != NULL) {
        struct act_waiter *w = d->act_waiters;
        evhttp_connection_set_closecb(evhttp_request_get_connection(w->req), NULL, NULL);
        waiter_free(d, w);
    }
    if (d->act_ev)
        event_free(d->act_ev);
    if (d->sigchld_ev)
        event_free(d->sigchld_ev);
    if (d->watch_ev)
        event_free(d->watch_ev);
    free(d->act_q);
    if (d->dns != NULL)
        evdns_base_free(d->dns, 0);
    if (d->cg_base[0])
        rmdir(d->cg_base); /* only when no service's folder is left in it */
    json_decref(d->directives);
    json_decref(d->execs);
    json_decref(d->saved_procs);
    osubd__idmap_free(d->pids);
    free(d);
    d = NULL;
}

int osubd_act_shim_processes(struct osubd_act *d, const char *id)
{
    struct seg_view v;
    for (struct osub_proc *p = d->proc_list; p; p = p->next)
        if (strcmp(p->id, id) == 0)
            return p->seg.s != NULL && seg_look(d, p, NULL, &v) ? v.live : 0;
    return 0;
}

/* ---- pods (device plugin) ---- */

#include <sys/random.h>

#include "deviceplugin.h"
#include "spec_json.h"

/* A pod's segment is named <id>.<16 hex>.seg in the state's shim/pods/ folder: 0700 and
 * root's, so that no local user reaches it by its path; the pod's containers, of any uid, get
 * the file by the bind mount the device plugin asks for (which needs no passage through the
 * folder), so the file itself is 0666. Managed services' are shim/<id>.seg, 0600 and their
 * user's. */
static bool pod_seg_name(const char *name, const char *id)
{
    size_t il = id != NULL ? strlen(id) : 0, nl = strlen(name);
    if (id != NULL && (nl != il + 1 + 16 + 4 || strncmp(name, id, il) != 0))
        return false;
    if (nl < 1 + 16 + 4 || strcmp(name + nl - 4, ".seg") != 0 || name[nl - 21] != '.')
        return false;
    for (size_t i = nl - 20; i < nl - 4; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return false;
    return true;
}

/* The pods' segment folder, made (shim/ 0711, shim/pods/ 0700, both root's, never a link);
 * pod segments an older oversubd left in shim/ itself are moved in (a rename: the bind mounts
 * of running containers follow the file). 0, or -1 with a sentence in why. */
static int pod_seg_dir(struct osubd_act *d, char *dir, size_t dirlen, char *why, size_t whylen)
{
    char sd[512], shim[560];
    struct stat st;
    state_dir(d, sd, sizeof(sd));
    snprintf(shim, sizeof(shim), "%s/shim", sd);
    snprintf(dir, dirlen, "%s/pods", shim);
    if (mkdirs(shim, 0711) != 0 || lstat(shim, &st) != 0 || !S_ISDIR(st.st_mode) ||
        chmod(shim, 0711) != 0 || (mkdir(dir, 0700) != 0 && errno != EEXIST) ||
        lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || chmod(dir, 0700) != 0) {
        snprintf(why, whylen, "cannot make %s for the CUDA shim: %s", dir, strerror(errno));
        return -1;
    }
    if (st.st_uid != geteuid() && lchown(dir, geteuid(), getegid()) != 0) {
        snprintf(why, whylen, "%s is not oversubd's user's and cannot be made so: %s", dir,
                 strerror(errno));
        return -1;
    }
    DIR *dd = opendir(shim);
    for (struct dirent *e; dd != NULL && (e = readdir(dd)) != NULL;) {
        if (!pod_seg_name(e->d_name, NULL))
            continue;
        char from[900], to[900];
        snprintf(from, sizeof(from), "%s/%s", shim, e->d_name);
        snprintf(to, sizeof(to), "%s/%s", dir, e->d_name);
        if (rename(from, to) != 0)
            osubd_log(OSUBD_LOG_WARN, "cannot move the pod segment %s into %s: %s", from, dir,
                    strerror(errno));
    }
    if (dd != NULL)
        closedir(dd);
    return 0;
}

/* An existing segment of the pod (made before oversubd restarted), opened into p. */
static bool pod_seg_adopt(struct osubd_act *d, struct osub_proc *p, const char *dir)
{
    DIR *dd = opendir(dir);
    bool got = false;
    for (struct dirent *e; dd != NULL && !got && (e = readdir(dd)) != NULL;) {
        if (!pod_seg_name(e->d_name, p->id))
            continue;
        char err[512];
        int n = snprintf(p->seg_path, sizeof(p->seg_path), "%s/%s", dir, e->d_name);
        if (n < 0 || (size_t)n >= sizeof(p->seg_path))
            continue;
        if (seg_open_guarded(&p->seg, p->seg_path, err, sizeof(err)) == 0)
            got = true;
        else {
            osubd_log(OSUBD_LOG_INFO, "%s: its pod segment: %s", p->id, err);
            osubd_note(d->core, p->id, "shim", "damaged",
                       "%s: its pod segment cannot be used (oversubd's log says why)", p->id);
        }
    }
    if (dd != NULL)
        closedir(dd);
    return got;
}

/* Writes the engine's grants into a pod's mapped segment now (the watch round does it later
 * on; a container told to start must not find 0 there). */
static void pod_seg_grants(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si)
{
    struct seg_view v;
    seg_look(d, p, si, &v); /* under the guard: the pod can write (and cut) the file */
}

int osubd_act_pod_segment(struct osubd_act *d, const char *id, char *path, size_t pathlen, char *why,
                          size_t whylen)
{
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0 ||
        !(live_state(si.state) || si.state == OSUB_STATE_PENDING)) {
        snprintf(why, whylen,
                 "service %s is neither running nor waiting for its victims in oversubd", id);
        return -1;
    }
    bool waits = si.state == OSUB_STATE_PENDING;
    if (si.n_slots < 1 || si.n_slots > OSUB_SEG_DEVICES) {
        snprintf(why, whylen, "the CUDA shim grants 1 to %d GPUs (service %s has %d)",
                 OSUB_SEG_DEVICES, id, (int)si.n_slots);
        return -1;
    }
    struct osub_proc *p = proc_find(d, id);
    if (p != NULL && p->seg.s != NULL) {
        snprintf(path, pathlen, "%s", p->seg_path);
        return 0;
    }
    struct stat st;
    if (waits && p != NULL && p->seg_path[0] != '\0' && lstat(p->seg_path, &st) == 0 &&
        S_ISREG(st.st_mode)) {
        snprintf(path, pathlen, "%s", p->seg_path); /* made, and left unmapped while it waits */
        return 0;
    }
    if (p == NULL && (p = proc_get(d, id)) == NULL) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    char dir[620];
    if (pod_seg_dir(d, dir, sizeof(dir), why, whylen) != 0)
        return -1;
    memset(p->seg_reported, 0, sizeof(p->seg_reported));
    if (!pod_seg_adopt(d, p, dir)) {
        uint8_t r[8];
        if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
            snprintf(why, whylen, "getrandom: %s", strerror(errno));
            return -1;
        }
        snprintf(p->seg_path, sizeof(p->seg_path), "%s/%s.%02x%02x%02x%02x%02x%02x%02x%02x.seg",
                 dir, id, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
        uint64_t grants[OSUB_SEG_DEVICES] = {0}; /* waiting: nothing may be allocated yet */
        for (int32_t i = 0; i < si.n_slots && !waits; i++)
            grants[i] = (uint64_t)si.slots[i].grant_mib << 20;
        char err[512];
        if (osub_seg_create(&p->seg, p->seg_path, (uid_t)-1, (gid_t)-1, id, (uint32_t)si.n_slots,
                            grants, err, sizeof(err)) != 0) {
            snprintf(why, whylen, "CUDA shim: %s", err);
            p->seg_path[0] = '\0';
            return -1;
        }
        if (fchmod(p->seg.fd, 0666) != 0) {
            snprintf(why, whylen, "chmod %s: %s", p->seg_path, strerror(errno));
            osub_seg_cleanup(&p->seg);
            unlink(p->seg_path);
            p->seg_path[0] = '\0';
            return -1;
        }
    }
    if (waits) {
        /* a pending service's slots already carry the grant it will have; its memory is still
         * the victims'. Unmapped, the watch round leaves the segment at 0 (it writes only mapped
         * segments); the sweep maps it again once the service starts. */
        seg_zero_guarded(&p->seg);
        osub_seg_cleanup(&p->seg);
    } else {
        pod_seg_grants(d, p, &si);
    }
    snprintf(path, pathlen, "%s", p->seg_path);
    return 0;
}

/* A whole regular file (not through a link) into a new buffer of at most max bytes. */
static int pod_file_read(const char *path, size_t max, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
        rc = -EINVAL;
        goto err_close_fd;
    }
    *buf = malloc((size_t)st.st_size + 1);
    if (*buf == NULL) {
        rc = -ENOMEM;
        goto err_close_fd;
    }
    while (*len < (size_t)st.st_size) {
        ssize_t n = read(fd, *buf + *len, (size_t)st.st_size - *len);
        if (n <= 0) {
            rc = n < 0 ? -errno : -EIO;
            free(*buf);
            *buf = NULL;
            *len = 0;
            goto err_close_fd;
        }
        *len += (size_t)n;
    }
err_close_fd:
    close(fd);
    return rc;
}

#define POD_SHIM_MAX (256u << 20)

int osubd_act_pod_shim(struct osubd_act *d, char *path, size_t pathlen, char *why, size_t whylen)
{
    path[0] = '\0';
    const char *src = d->shim_path;
    if (src[0] == '\0')
        return 0;
    char sd[512], dir[600], tmp[700];
    state_dir(d, sd, sizeof(sd));
    snprintf(dir, sizeof(dir), "%s/lib", sd);
    struct stat st;
    if (mkdirs(dir, 0755) != 0 || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, whylen, "cannot make %s for the CUDA shim pods mount: %s", dir,
                 strerror(errno));
        return -1;
    }
    int n = snprintf(path, pathlen, "%s/liboversub-cuda.so", dir);
    if (n < 0 || (size_t)n >= pathlen) {
        snprintf(why, whylen, "%s: the path is too long", dir);
        path[0] = '\0';
        return -1;
    }
    char *want = NULL, *have = NULL;
    size_t wl, hl;
    int rc = pod_file_read(src, POD_SHIM_MAX, &want, &wl);
    if (rc != 0) {
        snprintf(why, whylen, "cannot read the CUDA shim %s: %s", src, strerror(-rc));
        path[0] = '\0';
        return -1;
    }
    if (pod_file_read(path, POD_SHIM_MAX, &have, &hl) == 0 && hl == wl &&
        memcmp(have, want, wl) == 0 && lstat(path, &st) == 0) {
        free(have);
        free(want);
        if ((st.st_mode & 07777) != 0755 && chmod(path, 0755) != 0) {
            snprintf(why, whylen, "chmod %s: %s", path, strerror(errno));
            path[0] = '\0';
            return -1;
        }
        return 0; /* the same shim: left alone */
    }
    free(have);
    /* a new file renamed over the old: containers running keep the one they mounted */
    snprintf(tmp, sizeof(tmp), "%s/.liboversub-cuda.so.XXXXXX", dir);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot create a file in %s: %s", dir, strerror(errno));
        goto err_free_want;
    }
    size_t off = 0;
    while (off < wl) {
        ssize_t w = write(fd, want + off, wl - off);
        if (w <= 0) {
            snprintf(why, whylen, "cannot write %s: %s", tmp, w < 0 ? strerror(errno) : "no room");
            goto err_unlink_tmp;
        }
        off += (size_t)w;
    }
    if (fchmod(fd, 0755) != 0 || fsync(fd) != 0) {
        snprintf(why, whylen, "cannot finish %s: %s", tmp, strerror(errno));
        goto err_unlink_tmp;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) != 0) {
        snprintf(why, whylen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto err_unlink_tmp;
    }
    free(want);
    osubd_log(OSUBD_LOG_INFO, "device plugin: the CUDA shim %s copied to %s (what pods mount)",
            src, path);
    return 0;
err_unlink_tmp:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
err_free_want:
    free(want);
    path[0] = '\0';
    return -1;
}

int osubd_act_pod_fits(const struct osubd_act *d, const json_t *spec, int64_t can, char *err,
                       size_t errlen)
{
    if (can < 0)
        return 0;
    osub_spec_t sp;
    char e2[300];
    if (osub_spec_from_json(spec, &sp, e2, sizeof(e2)) != 0)
        return 0; /* the submit says what is wrong with it */
    int64_t held = 0;
    size_t n = osub_engine_service_count(d->e);
    for (size_t i = 0; i < n; i++) {
        const char *id = osub_engine_service_id(d->e, i);
        osub_service_info_t si;
        if (strcmp(id, sp.id) == 0 || osubd_act_kube(d, id) == NULL ||
            osub_engine_service_info(d->e, id, &si) != 0)
            continue; /* a retry of the same pod counts once */
        held += si.spec->vram_mib;
    }
    if (held + sp.vram_mib <= can)
        return 0;
    snprintf(err, errlen,
             "this node's kubelet can account only %lld MiB of %s (the device plugin's list is "
             "cut at 4 MiB); %lld MiB are held by pods already, and this pod asks %lld MiB",
             (long long)can, OSUBD_DP_RESOURCE, (long long)held, (long long)sp.vram_mib);
    return -1;
}

const char *osubd_act_shim_path(const struct osubd_act *d)
{
    return d->shim_path;
}

void osubd_act_pods_sweep(struct osubd_act *d)
{
    osub_service_info_t si;
    for (struct osub_proc *p = d->proc_list, *next; p; p = next) {
        next = p->next;
        if (p->pid > 0 || p->child || osubd_act_managed(d, p->id) ||
            osub_engine_service_info(d->e, p->id, &si) == 0)
            continue;
        proc_drop(d, p); /* a pod that is gone: its segment with it */
    }
    /* segments of pods that went while oversubd was stopped */
    char dir[620], why[300];
    if (pod_seg_dir(d, dir, sizeof(dir), why, sizeof(why)) != 0) {
        osubd_log(OSUBD_LOG_INFO, "%s", why);
        return;
    }
    DIR *dd = opendir(dir);
    for (struct dirent *e; dd != NULL && (e = readdir(dd)) != NULL;) {
        size_t nl = strlen(e->d_name);
        if (!pod_seg_name(e->d_name, NULL) || nl - 21 > OSUB_ID_MAX)
            continue;
        char id[OSUB_ID_MAX + 1];
        snprintf(id, sizeof(id), "%.*s", (int)(nl - 21), e->d_name);
        struct osub_proc *p = proc_find(d, id);
        if (osub_engine_service_info(d->e, id, &si) != 0) {
            if (p == NULL)
                unlinkat(dirfd(dd), e->d_name, 0);
        } else if ((p == NULL || p->seg.s == NULL) && live_state(si.state) &&
                   osubd_act_kube(d, id) != NULL) {
            /* a pod running since before oversubd restarted: its grant kept up again */
            char path[700];
            if (osubd_act_pod_segment(d, id, path, sizeof(path), why, sizeof(why)) != 0)
                osubd_log(OSUBD_LOG_INFO, "%s: its pod segment: %s", id, why);
        }
    }
    if (dd != NULL)
        closedir(dd);
}

void osubd_act_pods_close(struct osubd_act *d)
{
    if (d == NULL)
        return;
    for (struct osub_proc *p = d->proc_list; p; p = p->next)
        if (p->pid <= 0 && !p->child && !osubd_act_managed(d, p->id) && p->seg.s != NULL &&
            pod_seg_name(strrchr(p->seg_path, '/') + 1, p->id))
            osub_seg_cleanup(&p->seg); /* unmapped, not removed: mounted in running pods */
}
