/* actuator.c - makes services obey the engine: the actuators' state, what they save and show, the
 * events they act on, start and stop */
#define _GNU_SOURCE
#include "act.h"
#include "suspender.h"

#include <linux/magic.h>

static int act_setup(struct osubd_act *a, char *err, size_t errlen);

/* ---- the spec's actuation fields ------------------------------------------------------ */
/* ---- small helpers ---------------------------------------------------------------------- */

struct osub_proc *osubd__act_proc_find(struct osubd_act *d, const char *id)
{
    for (struct osub_proc *p = d->proc_list; p; p = p->next)
        if (strcmp(p->id, id) == 0)
            return p;
    return NULL;
}

struct osub_proc *osubd__act_proc_get(struct osubd_act *d, const char *id)
{
    struct osub_proc *p = osubd__act_proc_find(d, id);
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

void osubd__act_proc_drop(struct osubd_act *d, struct osub_proc *p)
{
    osubd__act_cg_remove(d, p->id); /* empty: gone; still holding processes (kept at exit): kept */
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
unsigned long long osubd__act_proc_starttime(pid_t pid)
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

void osubd__act_state_dir(const struct osubd_act *d, char *out, size_t len)
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

void osubd__act_log_path(const struct osubd_act *d, const char *id, char *out, size_t len)
{
    char dir[512];
    osubd__act_state_dir(d, dir, sizeof(dir));
    snprintf(out, len, "%s/logs/%s.log", dir, id);
}

void osubd__act_checkpoint_dir(const struct osubd_act *d, const char *id, char *out, size_t len)
{
    const char *cd =
        json_string_value(json_object_get(json_object_get(d->execs, id), "checkpoint_dir"));
    if (cd != NULL) {
        snprintf(out, len, "%s", cd);
        return;
    }
    char dir[512];
    osubd__act_state_dir(d, dir, sizeof(dir));
    snprintf(out, len, "%s/checkpoints/%s", dir, id);
}

int osubd__act_mkdirs(const char *path, mode_t mode)
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
int osubd__act_service_dir(const char *path, uid_t uid, gid_t gid, bool give, char *why, size_t len)
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
int osubd__act_child_dir(const char *path)
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
void osubd__act_save_proc(struct osubd_act *d, struct osub_proc *p)
{
    if (p->pid > 0)
        osubd_act_set_pid(d, p->id, p->pid);
    else
        osubd__idmap_del(d->pids, p->id);
    d->dirty = true;
}

void osubd__act_apply(struct osubd_act *d, json_t *cmd)
{
    char err[256];
    int rc = osubd_apply(d->core, cmd, NULL, err, sizeof(err));
    if (err[0] || rc != 0)
        osubd_log(OSUBD_LOG_INFO, "%s for %s: %s", json_string_value(json_object_get(cmd, "op")),
                  json_string_value(json_object_get(cmd, "id")), err[0] ? err : osub_strerror(rc));
    json_decref(cmd);
}

void osubd__act_apply_fail(struct osubd_act *d, struct osub_proc *p, const char *why)
{
    p->failed = true;
    osubd__act_apply(d, json_pack("{s:s, s:s, s:s}", "op", "fail", "id", p->id, "why", why));
}

bool osubd__act_live_state(osub_state_t s)
{
    return s == OSUB_STATE_LOADING || s == OSUB_STATE_RUNNING || s == OSUB_STATE_DEGRADED;
}

bool osubd__act_suspend_state(osub_state_t s)
{
    return s == OSUB_STATE_SUSPENDING || s == OSUB_STATE_SUSPENDED || s == OSUB_STATE_RESUMING;
}

bool osubd__act_draining_state(osub_state_t s)
{
    return s == OSUB_STATE_DRAINING || s == OSUB_STATE_OVERDUE;
}

/* ---- reconciling processes with the engine's states -------------------------------------- */

/* The grace period of service si: its spec's, else its class's, else the pool's. */
static int64_t grace_of(const struct osubd_act *d, const osub_service_info_t *si,
                        const osub_pool_config_t *cfg)
{
    if (si->spec == NULL)
        return cfg->grace_ms;
    if (si->spec->grace_ms >= 0)
        return si->spec->grace_ms;
    size_t n;
    const osub_class_t *c = osub_engine_classes(d->e, &n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(c[i].name, si->spec->class_name) == 0 && c[i].grace_ms >= 0)
            return c[i].grace_ms;
    return cfg->grace_ms;
}

void osubd__act_reconcile(struct osubd_act *d)
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
        struct osub_proc *p = osubd__act_proc_find(d, id);
        bool alive = p != NULL && p->pid > 0;
        if (known && p != NULL)
            p->grace_ms = grace_of(d, &si, &cfg); /* the spec is gone once it is released */
        if (json_object_get(x, "command") == NULL) {
            if (!known) {
                char gone[OSUB_ID_MAX + 1];
                snprintf(gone, sizeof(gone), "%s", id);
                json_object_del(d->execs, gone);
                d->dirty = true;
            }
            continue;
        }
        if (known && osubd__act_live_state(si.state)) {
            bool waiting =
                p != NULL && p->restart_ev != NULL && evtimer_pending(p->restart_ev, NULL);
            if (!alive && !waiting && (p == NULL || !p->failed) &&
                (p = osubd__act_proc_get(d, id)) != NULL)
                osubd__act_spawn(d, p, &si);
            continue;
        }
        if (known && osubd__act_suspend_state(si.state))
            continue; /* its process lives on, suspended: neither started nor stopped */
        if (known && osubd__act_draining_state(si.state)) {
            if (alive && !p->term_sent)
                osubd__act_terminate(d, p, osubd_engine_to_unix(d->core, si.deadline_ms),
                                     "it is evicted");
            continue;
        }
        if (p != NULL && p->restart_ev != NULL)
            evtimer_del(p->restart_ev);
        if (alive) {
            if (!p->term_sent)
                osubd__act_terminate(
                    d, p, osubd_now(d->core) + (p->grace_ms > 0 ? p->grace_ms : cfg.grace_ms),
                    known ? "it is no longer running" : "it was released");
            continue;
        }
        if (!known) {
            char gone[OSUB_ID_MAX + 1];
            snprintf(gone, sizeof(gone), "%s", id); /* id is the key deleted next */
            json_object_del(d->execs, gone);
            d->dirty = true;
            if (p != NULL)
                osubd__act_proc_drop(d, p);
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
            osubd__act_post_directive(d, &ev, "degrade");
            break;
        case OSUB_EV_RESTORE:
            osubd__act_post_directive(d, &ev, "restore");
            break;
        case OSUB_EV_EVICT: {
            osubd__act_post_directive(d, &ev, "evict");
            struct osub_proc *p = osubd__act_proc_find(d, ev.service);
            if (managed && p != NULL && p->pid > 0)
                osubd__act_terminate(d, p, osubd_engine_to_unix(d->core, ev.deadline_ms),
                                     "it is evicted");
            break;
        }
        case OSUB_EV_RESUME:
            if (!managed)
                osubd__act_post_directive(d, &ev, "resume");
            break;
        case OSUB_EV_SUSPEND:
            osubd__act_suspend_start(d, ev.service, false,
                                     ev.deadline_ms - osubd_engine_now(d->core));
            break;
        case OSUB_EV_RELEASE:
        case OSUB_EV_FAIL:
        case OSUB_EV_EXITED:
            if (d->sus != NULL)
                osubd_sus_cancel(d->sus, ev.service);
            osubd__idmap_del(d->sus_falls, ev.service);
            osubd__idmap_del(d->wake_waits, ev.service);
            break;
        case OSUB_EV_WAKE: {
            osub_service_info_t si;
            int64_t cost =
                osub_engine_service_info(d->e, ev.service, &si) == 0 ? si.resume_cost_ms : 0;
            osubd__act_suspend_start(d, ev.service, true, cost + 30000);
            break;
        }
        default:
            break;
        }
    }
    if (done > 0) {
        memmove(q, q + done, (d->act_n - done) * sizeof(*q));
        d->act_n -= done;
    }
    osubd__act_reconcile(d);
}

void osubd_act_events(struct osubd_act *d, const osub_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ev[i].service[0] == '\0')
            continue;
        osub_event_kind_t k = ev[i].kind;
        if (k != OSUB_EV_DEGRADE && k != OSUB_EV_RESTORE && k != OSUB_EV_EVICT &&
            k != OSUB_EV_RESUME && k != OSUB_EV_START && k != OSUB_EV_RELEASE &&
            k != OSUB_EV_REQUEUE && k != OSUB_EV_FAIL && k != OSUB_EV_SUSPEND &&
            k != OSUB_EV_WAKE && k != OSUB_EV_EXITED)
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
    struct osub_seg_view sv;
    if (p != NULL && p->seg.s != NULL && osubd__act_seg_look(d, p, NULL, &sv)) {
        json_t *grant = json_array(), *held = json_array(), *peak = json_array();
        for (uint32_t i = 0; i < sv.n; i++) {
            json_array_append_new(grant, json_integer((json_int_t)(sv.grant[i] >> 20)));
            json_array_append_new(held, json_integer((json_int_t)osubd__act_to_mib(sv.held[i])));
            json_array_append_new(peak, json_integer((json_int_t)osubd__act_to_mib(sv.peak[i])));
        }
        /* the path is a way into the service's accounting: the admin's (and the socket's) only */
        json_object_set_new(o, "shim",
                            json_pack("{s:s, s:i, s:o, s:o, s:o, s:I, s:I}", "segment",
                                      who->admin ? p->seg_path : "<redacted>", "processes", sv.live,
                                      "grant_mib", grant, "held_mib", held, "peak_mib", peak,
                                      "refused", (json_int_t)sv.refused, "reclaimed_mib",
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
            describe_shim(d, who, osubd__act_proc_find(d, id),
                          o); /* a pod: its segment, if allocated */
        return;
    }
    char logf[1024], ck[1024];
    osubd__act_log_path(d, id, logf, sizeof(logf));
    osubd__act_checkpoint_dir(d, id, ck, sizeof(ck));
    struct osub_proc *p = osubd__act_proc_find(d, id);
    json_t *proc = json_pack("{s:s, s:s, s:i, s:b}", "log", logf, "checkpoint_dir", ck, "restarts",
                             p ? p->restarts : 0, "alive", p != NULL && p->pid > 0);
    if (p != NULL && p->pid > 0)
        json_object_set_new(proc, "pid", json_integer(p->pid));
    if (d->cg_base[0]) {
        char cg[800], f[900];
        osubd__act_cg_path(d, id, cg, sizeof(cg));
        pid_t pids[256];
        int n = osubd__act_cg_pids(d, id, pids, 256);
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
        (unsigned long long)d->directives_sent[0], (unsigned long long)d->directives_sent[1],
        (unsigned long long)d->directives_sent[2], (unsigned long long)d->directives_sent[3],
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
    osubd__idmap_del(d->directives, id);
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

int osubd_act_check_config(const struct osubd_config *cfg, char *err, size_t errlen)
{
    const char *shim = cfg->cuda_shim;
    struct stat st;
    if (shim[0] != '\0' && strcmp(shim, "none") != 0 &&
        (shim[0] != '/' || access(shim, R_OK) != 0 || stat(shim, &st) != 0 ||
         !S_ISREG(st.st_mode))) {
        snprintf(err, errlen,
                 "cuda_shim: '%.400s' is not a readable absolute path of a file (\"none\" runs "
                 "services without it)",
                 shim);
        return -1;
    }
    if (cfg->cgroup[0] == '/') {
        /* the folder, or where it is to be made */
        char at[sizeof(cfg->cgroup)];
        snprintf(at, sizeof(at), "%s", cfg->cgroup);
        struct statfs sf;
        while (statfs(at, &sf) != 0 && errno == ENOENT && strrchr(at, '/') > at)
            *strrchr(at, '/') = '\0';
        if (statfs(at, &sf) != 0 || sf.f_type != CGROUP2_SUPER_MAGIC) {
            snprintf(err, errlen, "cgroup: %.400s is not in a cgroup v2 hierarchy", cfg->cgroup);
            return -1;
        }
    }
    return 0;
}

/* The subreaper, cgroups, the SIGBUS guard, the shim, the maps. */
static int act_setup(struct osubd_act *a, char *err, size_t errlen)
{
    struct osubd_act *d = a;
    /* orphans of services (a double fork) come to us, not to init: they are found and reaped */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        osubd_log(OSUBD_LOG_WARN, "cannot become a subreaper: %s", strerror(errno));
    osubd__act_cg_setup(d);
    if (!a->cg_base[0] && d->cfg->cgroup[0] == '/') {
        snprintf(err, errlen, "cgroup: %s", a->cg_why);
        return -1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = osubd__act_on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    const char *shim = d->cfg->cuda_shim;
    if (osubd_act_check_config(d->cfg, err, errlen) != 0)
        return -1;
    if (strcmp(shim, "none") == 0) {
        a->shim_path[0] = '\0';
    } else if (shim[0] != '\0') {
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
    a->sus_falls = osubd__idmap_new(free);
    a->wake_waits = osubd__idmap_new(free);
    a->directives = osubd__idmap_new(free);
    if (a->pids == NULL || a->sus_falls == NULL || a->wake_waits == NULL || a->directives == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* A saved exec has the shape osubd_exec_take gave it (what the spawn reads without checking):
 * a damaged state is refused at start, never run into. */
static bool exec_shape_ok(const json_t *x, char *why, size_t len)
{
    if (!json_is_object(x)) {
        snprintf(why, len, "not an object");
        return false;
    }
    const json_t *cmd = json_object_get(x, "command");
    if (cmd != NULL) {
        bool ok =
            json_is_array(cmd) && json_array_size(cmd) >= 1 && json_array_size(cmd) <= MAX_ARGS;
        for (size_t i = 0; ok && i < json_array_size(cmd); i++)
            ok = json_is_string(json_array_get(cmd, i));
        if (!ok) {
            snprintf(why, len, "'command' is not an array of 1 to %d strings", MAX_ARGS);
            return false;
        }
    }
    const json_t *env = json_object_get(x, "env");
    const char *k;
    const json_t *ev;
    if (env != NULL && (!json_is_object(env) || json_object_size(env) > MAX_ENV)) {
        snprintf(why, len, "'env' is not an object of at most %d strings", MAX_ENV);
        return false;
    }
    json_object_foreach((json_t *)env, k, ev) if (!json_is_string(ev))
    {
        snprintf(why, len, "'env' %.40s is not a string", k);
        return false;
    }
    static const char *const strs[] = {"workdir", "user", "checkpoint_dir", "control_url",
                                       "restart"};
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
        const json_t *f = json_object_get(x, strs[i]);
        if (f != NULL && !json_is_string(f)) {
            snprintf(why, len, "'%s' is not a string", strs[i]);
            return false;
        }
    }
    const json_t *m = json_object_get(x, "max_restarts");
    const json_t *shim = json_object_get(x, "cuda_shim");
    const json_t *kube = json_object_get(x, "kubernetes");
    if ((m != NULL && !json_is_integer(m)) || (shim != NULL && !json_is_boolean(shim)) ||
        (kube != NULL && !json_is_object(kube))) {
        snprintf(why, len, "'max_restarts', 'cuda_shim' or 'kubernetes' has the wrong type");
        return false;
    }
    return true;
}

/* A managed_procs record as act_meta writes it: {pid, starttime, restarts}. */
static bool proc_shape_ok(const json_t *v)
{
    const json_t *pid = json_object_get(v, "pid"), *st = json_object_get(v, "starttime"),
                 *r = json_object_get(v, "restarts");
    return json_is_object(v) && json_object_size(v) == 3 && json_is_integer(pid) &&
           json_integer_value(pid) >= 2 && json_integer_value(pid) <= 4194304 &&
           json_is_integer(st) && json_integer_value(st) >= 0 && json_is_integer(r) &&
           json_integer_value(r) >= 0 && json_integer_value(r) <= INT32_MAX;
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
    json_object_foreach(a->execs, id, v)
    {
        char why[200];
        if (!exec_shape_ok(v, why, sizeof(why))) {
            snprintf(err, errlen, "the state's service_exec of %.63s is damaged: %s", id, why);
            return -1;
        }
    }
    /* a record not adopted would start a second process beside the one still running */
    json_object_foreach(a->saved_procs, id, v)
    {
        if (!proc_shape_ok(v)) {
            snprintf(err, errlen,
                     "the state's managed_procs of %.63s is damaged (wanted {\"pid\": 2 to "
                     "4194304, \"starttime\": N >= 0, \"restarts\": N >= 0})",
                     id);
            return -1;
        }
    }
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
    /* actuator.h: once the core loaded the module (what the last run saved) and started */
    assert(d->execs != NULL && d->saved_procs != NULL);
    /* service cgroup folders a previous run left empty (released, failed starts): removed
     * (one still holding processes stays: an adopted service's, or leftovers to kill) */
    DIR *cgd = d->cg_base[0] ? opendir(d->cg_base) : NULL;
    for (struct dirent *e; cgd != NULL && (e = readdir(cgd)) != NULL;)
        if (e->d_type == DT_DIR && osub_id_valid(e->d_name))
            osubd__act_cg_remove(d, e->d_name);
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
    d->sigchld_ev = evsignal_new(d->base, SIGCHLD, osubd__act_on_sigchld, d);
    d->watch_ev = event_new(d->base, -1, EV_PERSIST, osubd__act_on_watch, d);
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
        if (!deg && !osubd__act_draining_state(si.state))
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
        osubd__act_post_directive(d, &ev, deg ? "degrade" : "evict");
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
        struct osub_proc *p = osubd__act_proc_get(d, id);
        if (p == NULL || pid <= 0)
            continue;
        p->restarts = (int)json_integer_value(json_object_get(rec, "restarts"));
        p->pid = pid;
        p->child = false;
        p->starttime = st;
        p->spawned_unix_ms = osubd_now(d->core);
        if (st != 0 && osubd__act_proc_starttime(pid) == st) {
            osubd_note(d->core, id, "process", "adopt",
                       "adopted %s's process %d, alive across oversubd's restart", id, (int)pid);
            osub_service_info_t si;
            if (osub_engine_service_info(d->e, id, &si) == 0 &&
                osubd__act_draining_state(si.state)) {
                /* it was told before; the SIGKILL at the same deadline is ours to send */
                p->term_sent = true;
                osubd__act_terminate(d, p, osubd_engine_to_unix(d->core, si.deadline_ms),
                                     "it is evicted");
            }
            continue;
        }
        /* died while we were away: exited, whatever its restart policy */
        osubd_note(d->core, id, "process", "exit",
                   "%s's process %d ended while oversubd was down: treated as exited", id,
                   (int)pid);
        p->pid = 0;
        osubd__act_save_proc(d, p);
        osub_service_info_t si;
        if (osub_engine_service_info(d->e, id, &si) == 0 &&
            (osubd__act_live_state(si.state) || osubd__act_draining_state(si.state) ||
             osubd__act_suspend_state(si.state))) {
            p->failed = true; /* not started again by the reconcile below */
            osubd__act_exited_cmd(d, id);
            p->failed = false;
        }
    }
    json_decref(saved);
    osubd__act_suspend_restart(d); /* suspends and wakes under way when we stopped */
    osubd__act_reconcile(d);
    return 0;
}

void osubd_act_free(struct osubd_act *d)
{
    if (d == NULL)
        return;
    /* managed processes and pods keep running: the next oversubd adopts them, and maps again
     * the shim segments they were started with (unmapped here, never removed) */
    while (d->proc_list != NULL) {
        struct osub_proc *p = d->proc_list;
        osub_seg_cleanup(&p->seg);
        osubd__act_proc_drop(d, p);
    }
    while (d->act_waiters != NULL) {
        struct act_waiter *w = d->act_waiters;
        evhttp_connection_set_closecb(evhttp_request_get_connection(w->req), NULL, NULL);
        osubd__act_waiter_free(d, w);
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
    osubd__idmap_free(d->directives);
    json_decref(d->execs);
    json_decref(d->saved_procs);
    osubd__idmap_free(d->pids);
    osubd__idmap_free(d->sus_falls);
    osubd__idmap_free(d->wake_waits);
    free(d);
    d = NULL;
}

int osubd_act_shim_processes(struct osubd_act *d, const char *id)
{
    struct osub_seg_view v;
    for (struct osub_proc *p = d->proc_list; p; p = p->next)
        if (strcmp(p->id, id) == 0)
            return p->seg.s != NULL && osubd__act_seg_look(d, p, NULL, &v) ? v.live : 0;
    return 0;
}
