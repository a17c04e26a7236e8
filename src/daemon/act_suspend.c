/* act_suspend.c - the engine's suspends and wakes carried out (issue 25): a SUSPEND event runs
 * the service's suspend mechanism (suspender.h) on its processes, a WAKE event its resume; what
 * the mechanism answers goes back to the engine as a command (suspended, resumed,
 * suspend_failed), logged like any other, so that a restart replays it. A suspend or wake under
 * way when oversubd stopped is run again at its next start (each method is safe to repeat: a
 * checkpointed process is left as it is, a sleeping vLLM sleeps). */
#define _GNU_SOURCE
#include "act.h"
#include "suspender.h"

void osubd_act_set_suspender(struct osubd_act *d, struct osubd_sus *s)
{
    d->sus = s;
}

const char *osubd__act_cuda_unusable(const struct osubd_act *d, char *why, size_t whylen)
{
    if (d->sus == NULL) {
        snprintf(why, whylen, "method cuda cannot be used: this oversubd has no suspender");
        return why;
    }
    return osubd_sus_cuda_ok(d->sus, why, whylen) ? NULL : why;
}

/* The processes a mechanism acts on: the managed process and every other process of its cgroup,
 * or the PID an external service reported (POST .../ready {"pid"}). */
static int service_pids(struct osubd_act *d, const char *id, pid_t *out, int max)
{
    int n = 0;
    struct osub_proc *p = osubd__act_proc_find(d, id);
    if (p != NULL && p->pid > 0)
        out[n++] = p->pid;
    pid_t cg[OSUBD_SUS_PIDS_MAX];
    int k = osubd__act_cg_pids(d, id, cg, OSUBD_SUS_PIDS_MAX);
    for (int i = 0; i < k && n < max; i++) {
        bool dup = false;
        for (int j = 0; j < n; j++)
            dup = dup || out[j] == cg[i];
        if (!dup)
            out[n++] = cg[i];
    }
    if (n == 0 && osubd_act_pid(d, id) > 0)
        out[n++] = osubd_act_pid(d, id);
    return n;
}

static void report_failed(struct osubd_act *d, const char *id, const char *why)
{
    osubd_warn(d->core, id, "suspend", "failed", "%s: %s", id, why);
    osubd__act_apply(d, json_pack("{s:s, s:s, s:s}", "op", "suspend_failed", "id", id, "why", why));
}

void osubd__act_suspend_start(struct osubd_act *d, const char *id, bool resume, int64_t timeout_ms)
{
    struct osubd_sus_spec sp;
    char err[600];
    const json_t *v = json_object_get(json_object_get(d->execs, id), "suspend");
    if (v == NULL || osubd_sus_parse(v, NULL, &sp, err, sizeof(err)) != 0) {
        report_failed(d, id, "oversubd knows no suspend mechanism for it");
        return;
    }
    if (d->sus != NULL && osubd_sus_busy(d->sus, id))
        return; /* under way already (a repeat after a restart): its answer comes */
    pid_t pids[OSUBD_SUS_PIDS_MAX];
    int n = sp.method == OSUBD_SUS_CUDA ? service_pids(d, id, pids, OSUBD_SUS_PIDS_MAX) : 0;
    if (timeout_ms < 1000)
        timeout_ms = 1000;
    if (d->sus == NULL || timeout_ms > INT32_MAX ||
        osubd_sus_start(d->sus, id, resume, &sp, pids, n, (int)timeout_ms, err, sizeof(err)) != 0) {
        report_failed(d, id, d->sus == NULL ? "this oversubd has no suspender" : err);
        return;
    }
    osubd_note(d->core, id, "suspend", resume ? "wake" : "start", "%s: %s by %s%s%s", id,
               resume ? "resuming" : "suspending", osubd_sus_method_name(sp.method),
               n > 0       ? " on its processes"
               : sp.url[0] ? " at "
                           : "",
               n > 0 ? "" : sp.url);
}

void osubd_act_sus_done(void *arg, const char *id, bool resume, bool ok, const char *why)
{
    struct osubd_act *d = arg;
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0)
        return; /* released meanwhile */
    if (!ok) {
        report_failed(d, id, why != NULL ? why : "its mechanism failed");
        return;
    }
    if (resume) {
        osubd_note(d->core, id, "suspend", "resumed", "%s: its memory is back on its GPUs", id);
        osubd__act_apply(d, json_pack("{s:s, s:s}", "op", "resumed", "id", id));
        return;
    }
    /* what stays on its GPUs: what planning expects of it (declared, or measured at its last
     * suspend); the usage reports that follow correct it */
    osubd_note(d->core, id, "suspend", "suspended",
               "%s: suspended: its GPU memory is in host memory (%lld MiB expected to stay on "
               "its GPUs)",
               id, (long long)si.residual_mib);
    osubd__act_apply(d, json_pack("{s:s, s:s, s:I}", "op", "suspended", "id", id, "residual_mib",
                                  (json_int_t)si.residual_mib));
}

void osubd__act_suspend_restart(struct osubd_act *d)
{
    for (size_t i = 0; i < osub_engine_service_count(d->e); i++) {
        const char *id = osub_engine_service_id(d->e, i);
        osub_service_info_t si;
        if (id == NULL || osub_engine_service_info(d->e, id, &si) != 0)
            continue;
        if (si.state == OSUB_STATE_SUSPENDING)
            osubd__act_suspend_start(d, id, false, si.deadline_ms - osubd_engine_now(d->core));
        else if (si.state == OSUB_STATE_RESUMING)
            osubd__act_suspend_start(d, id, true, si.resume_cost_ms + 30000);
    }
}
