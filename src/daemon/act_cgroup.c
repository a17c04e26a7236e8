/* act_cgroup.c - what a service's processes are (a cgroup v2 folder, else a subreaper's sweep) and
 * the signals they get */
#define _GNU_SOURCE
#include "act.h"

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

void osubd__act_cg_setup(struct osubd_act *d)
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
        osubd__act_state_dir(d, sd, sizeof(sd));
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

void osubd__act_cg_path(const struct osubd_act *d, const char *id, char *out, size_t len)
{
    snprintf(out, len, "%s/%.*s", d->cg_base, OSUB_ID_MAX, id);
}

/* The PIDs in a service's cgroup (at most max); -1 when it has none. */
int osubd__act_cg_pids(const struct osubd_act *d, const char *id, pid_t *out, int max)
{
    char f[800];
    osubd__act_cg_path(d, id, f, sizeof(f));
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

int osubd__act_service_procs(const struct osubd_act *d, const char *id, pid_t leader, pid_t *out,
                             int max)
{
    return d->cg_base[0] ? osubd__act_cg_pids(d, id, out, max)
                         : sweep_pids(d, id, leader, out, max);
}

/* sig to everything of the service: its process group, its cgroup (or what the sweep finds). */
void osubd__act_signal_service(struct osubd_act *d, const char *id, pid_t leader, int sig)
{
    if (leader > 0)
        kill(-leader, sig);
    enum { MAXP = 4096 };
    static pid_t pids[MAXP];
    int n;
    if (d->cg_base[0]) {
        char f[800];
        osubd__act_cg_path(d, id, f, sizeof(f));
        strcat(f, "/cgroup.kill");
        int fd = sig == SIGKILL ? open(f, O_WRONLY | O_CLOEXEC) : -1;
        if (fd >= 0) {
            bool done = write(fd, "1", 1) == 1;
            close(fd);
            if (done)
                return;
        }
        n = osubd__act_cg_pids(d, id, pids, MAXP);
    } else {
        n = sweep_pids(d, id, leader, pids, MAXP);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 1 && pids[i] != getpid())
            kill(pids[i], sig);
}

/* A service's cgroup folder, removed once nothing is left in it. */
void osubd__act_cg_remove(struct osubd_act *d, const char *id)
{
    if (!d->cg_base[0])
        return;
    char f[800];
    osubd__act_cg_path(d, id, f, sizeof(f));
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
    osubd__act_signal_service(p->d, p->id, p->pid, SIGKILL);
    osubd_warn(p->d->core, p->id, "process", "kill",
               "%s's grace period ended with its process %d still alive: killed its process "
               "group with SIGKILL",
               p->id, (int)p->pid);
}

/* SIGTERM to the group now, SIGKILL at deadline_unix_ms. */
void osubd__act_terminate(struct osubd_act *d, struct osub_proc *p, int64_t deadline_unix_ms,
                          const char *why)
{
    if (p->pid <= 0)
        return;
    if (!p->term_sent) {
        osubd__act_signal_service(d, p->id, p->pid, SIGTERM);
        p->term_sent = true;
        int64_t grace = deadline_unix_ms - osubd_now(d->core);
        osubd_note(d->core, p->id, "process", "term",
                   "sent SIGTERM to %s's process group %d (%s); SIGKILL in %lld ms", p->id,
                   (int)p->pid, why, (long long)(grace > 0 ? grace : 0));
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
