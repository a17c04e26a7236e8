/* act_exits.c - exits of managed processes, restarts with backoff, log rotation */
#define _GNU_SOURCE
#include "act.h"

/* ---- exits -------------------------------------------------------------------------------- */

static void on_restart(evutil_socket_t fd, short what, void *arg);

void osubd__act_exited_cmd(struct osubd_act *d, const char *id)
{
    osubd__act_apply(d, json_pack("{s:s, s:s}", "op", "exited", "id", id));
}

/* The process of p ended; status is waitpid's, or -1 when unknown (adopted, or found gone). */
void osubd__act_on_exit_of(struct osubd_act *d, struct osub_proc *p, int status, const char *how)
{
    pid_t pid = p->pid;
    int64_t ran = osubd_now(d->core) - p->spawned_unix_ms;
    /* what it left behind (its group, its cgroup, its orphans) holds GPU memory too */
    osubd__act_signal_service(d, p->id, pid, SIGKILL);
    osubd__act_cg_remove(d, p->id);
    p->pid = 0;
    p->term_sent = false;
    if (p->kill_ev)
        evtimer_del(p->kill_ev);
    osubd__act_save_proc(d, p);
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
    osubd__act_log_path(d, p->id, logf, sizeof(logf));
    osub_service_info_t si;
    bool known = osub_engine_service_info(d->e, p->id, &si) == 0;
    osubd_note(d->core, p->id, "process", "exit", "%s's process %d %s after %lld ms%s%s (log %s)",
               p->id, (int)pid, desc, (long long)(ran > 0 ? ran : 0), known ? " while " : "",
               known ? osub_state_name(si.state) : "", logf);
    if (!known)
        return;
    if (osubd__act_draining_state(si.state)) {
        osubd__act_exited_cmd(d, p->id);
        return;
    }
    if (!osubd__act_live_state(si.state) && !osubd__act_suspend_state(si.state))
        return;
    if (osubd__act_suspend_state(si.state)) {
        /* what it suspended lived in that process (a checkpoint is the process's, a sleeping
         * server's weights are in its memory): a restart would be a reload, not a resume */
        osubd_warn(d->core, p->id, "process", "lost",
                   "%s's process died while %s: what it suspended is lost (no restart while "
                   "suspended)",
                   p->id, osub_state_name(si.state));
        osubd__act_exited_cmd(d, p->id);
        return;
    }
    if (!failure) {
        osubd__act_exited_cmd(d, p->id);
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
        osubd__act_apply_fail(d, p, why);
    } else if (ran < FAST_EXIT_MS) {
        snprintf(why, sizeof(why), "its process %s at once (after %lld ms); see %s", desc,
                 (long long)ran, logf);
        osubd__act_apply_fail(d, p, why);
    } else {
        osubd__act_exited_cmd(d, p->id);
    }
}

static void on_restart(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osub_proc *p = arg;
    osubd__act_reconcile(p->d);
}

void osubd__act_on_sigchld(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_act *d = arg;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (struct osub_proc *p = d->proc_list; p; p = p->next)
            if (p->pid == pid && p->child) {
                osubd__act_on_exit_of(d, p, status, NULL);
                break;
            }
    }
    osubd__act_reconcile(d);
}

/* Keeps a service's log under its cap: copied to .1, then emptied in place (the process keeps
 * its descriptor, opened for appending, and goes on writing at the new end). */
void osubd__act_rotate_log(struct osubd_act *d, const char *id)
{
    char logf[1024], old[1100];
    osubd__act_log_path(d, id, logf, sizeof(logf));
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
