/* act_suspend.c - the engine's suspends and wakes carried out (issue 25): a SUSPEND event runs
 * the service's suspend mechanism (suspender.h) on its processes, a WAKE event its resume; what
 * the mechanism answers goes back to the engine as a command (suspended, resumed,
 * suspend_failed), logged like any other, so that a restart replays it. A suspend or wake under
 * way when oversubd stopped is run again at its next start (each method is safe to repeat: a
 * checkpointed process is left as it is, a sleeping vLLM sleeps). */
#define _GNU_SOURCE
#include "act.h"
#include "suspender.h"

#define MECHANISM_MARGIN_MS 2000

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

const char *osubd__act_relocate_unusable(const struct osubd_act *d, char *why, size_t whylen)
{
    if (osubd__act_cuda_unusable(d, why, whylen) != NULL)
        return why;
    if (d->gpus == NULL || d->gpus->n == 0) {
        snprintf(why, whylen,
                 "suspend.relocate needs the GPUs' UUIDs for the driver's remap: this pool is "
                 "simulated (run oversubd with --gpus nvml)");
        return why;
    }
    return osubd_sus_cuda_remap_ok(d->sus, why, whylen) ? NULL : why;
}

/* The remap of a resume onto another GPU (the engine's relocate: si->relocated_from): every GPU
 * of the machine named, as the driver wants when the process sees them all (act_spawn.c), the
 * one it was checkpointed on and the one it goes to swapped. 0, or -1 with why. */
static int relocate_remap(struct osubd_act *d, const osub_service_info_t *si,
                          struct osubd_sus_spec *sp, char *why, size_t len)
{
    int32_t from = si->relocated_from, to = si->n_slots == 1 ? si->slots[0].gpu : -1;
    if (osubd__act_relocate_unusable(d, why, len) != NULL)
        return -1;
    int32_t n = d->gpus->n;
    if (to < 0 || from >= n || to >= n || n > OSUBD_SUS_REMAP_MAX) {
        snprintf(why, len, "cannot restore it from GPU %d onto GPU %d: no UUID for one of them",
                 (int)from, (int)to);
        return -1;
    }
    osub_gpu_info_t a, b;
    if (osub_engine_gpu_info(d->e, from, &a) != 0 || osub_engine_gpu_info(d->e, to, &b) != 0 ||
        strcmp(a.name, b.name) != 0 || a.vram_mib != b.vram_mib) {
        snprintf(why, len,
                 "cannot restore it from GPU %d (%s) onto GPU %d (%s): the driver restores a "
                 "checkpoint onto a GPU of the same chip only",
                 (int)from, a.name, (int)to, b.name);
        return -1;
    }
    for (int32_t g = 0; g < n; g++) {
        int32_t ng = g == from ? to : g == to ? from : g;
        if (osubd_sus_uuid_bytes(d->gpus->uuid[g], sp->remap[g][0]) != 0 ||
            osubd_sus_uuid_bytes(d->gpus->uuid[ng], sp->remap[g][1]) != 0) {
            snprintf(why, len, "GPU %d's UUID '%s' is not one the driver takes", (int)g,
                     d->gpus->uuid[g]);
            return -1;
        }
    }
    sp->n_remap = (int)n;
    return 0;
}

int osubd_act_service_pids(struct osubd_act *d, const char *id, pid_t *out, int max)
{
    int n = 0;
    struct osub_proc *p = osubd__act_proc_find(d, id);
    if (max <= 0)
        return 0;
    if (p != NULL && p->pid > 0)
        out[n++] = p->pid;
    pid_t cg[OSUBD_SUS_PIDS_MAX];
    int k = osubd__act_service_procs(d, id, p != NULL ? p->pid : 0, cg, OSUBD_SUS_PIDS_MAX);
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

static int64_t measured_mib(struct osubd_act *d, const char *id, bool cuda);

/* A suspend begins: what the service holds now is what must be seen to fall. */
static void fall_begin(struct osubd_act *d, const char *id, bool cuda)
{
    struct act_sus_fall *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return; /* then the fall is judged against its residual alone */
    f->cuda = cuda;
    f->before_mib = measured_mib(d, id, cuda);
    if (osubd__idmap_put(d->sus_falls, id, f) != 0)
        free(f);
}

/* What a CUDA restore of id brings back onto GPU slot k, MiB: the shim's count of its
 * allocations (exact: the shim keeps counting what the driver holds in host memory), else its
 * grant less what stays there (its residual; nothing stays on a GPU it moves to). */
static int64_t restore_need_mib(struct osubd_act *d, const char *id, const osub_service_info_t *si,
                                int32_t k)
{
    struct osub_proc *p = osubd__act_proc_find(d, id);
    struct osub_seg_view v;
    if (si->n_slots == 1 && p != NULL && p->seg.s != NULL && osubd__act_seg_look(d, p, NULL, &v) &&
        v.live > 0) {
        uint64_t b = 0;
        for (uint32_t i = 0; i < v.n; i++)
            b += v.held[i];
        return (int64_t)osubd__act_to_mib(b);
    }
    int64_t stays = si->relocated_from >= 0 ? 0 : si->slots[k].used_mib;
    return si->slots[k].grant_mib > stays ? si->slots[k].grant_mib - stays : 0;
}

/* Whether NVML shows the room a CUDA restore of id needs on each of its GPUs (a restore that
 * runs out of memory cannot be undone: the driver leaves the process broken). Memory the engine
 * no longer counts can still be there: a released service's process that has not exited yet.
 * Without NVML (a simulated pool) there is nothing to look at: true. Else false, with why. */
static bool restore_room(struct osubd_act *d, const char *id, const osub_service_info_t *si,
                         char *why, size_t len)
{
    if (d->gpus == NULL || d->gpus->n == 0)
        return true;
    if (!d->gpus->polled) {
        snprintf(why, len, "NVML has not been read since oversubd started");
        return false;
    }
    for (int32_t k = 0; k < si->n_slots; k++) {
        int32_t g = si->slots[k].gpu;
        if (g < 0 || g >= d->gpus->n)
            continue;
        int64_t need = restore_need_mib(d, id, si, k);
        if (d->gpus->free_mib[g] < need) {
            snprintf(why, len,
                     "GPU %d has %lld MiB free as NVML shows it, and its checkpoint needs %lld MiB "
                     "there",
                     (int)g, (long long)d->gpus->free_mib[g], (long long)need);
            return false;
        }
    }
    return true;
}

/* A CUDA restore held for room (restore_room()): waits for the monitor's polls until the
 * mechanism's timeout, then the wake fails. True: held (or failed), not started now. */
static bool restore_held(struct osubd_act *d, const char *id, const osub_service_info_t *si,
                         int64_t timeout_ms)
{
    char why[300];
    if (restore_room(d, id, si, why, sizeof(why))) {
        osubd__idmap_del(d->wake_waits, id);
        return false;
    }
    int64_t now = osubd_engine_now(d->core);
    struct act_wake_wait *w = osubd__idmap_get(d->wake_waits, id);
    if (w == NULL) {
        w = calloc(1, sizeof(*w));
        if (w == NULL || osubd__idmap_put(d->wake_waits, id, w) != 0) {
            free(w);
            return false; /* no memory to wait: tried now, as before the wait existed */
        }
        w->until_ms = now + timeout_ms;
        w->reloc_from = si->relocated_from;
    }
    if (now >= w->until_ms) {
        char what[500];
        snprintf(what, sizeof(what),
                 "not restored: %s, and the room did not come within its resume timeout", why);
        osubd__idmap_del(d->wake_waits, id);
        report_failed(d, id, what);
        return true;
    }
    if (!w->said) {
        w->said = true;
        osubd_note(d->core, id, "suspend", "waiting",
                   "%s: its restore waits for room: %s (a restore without it cannot be undone); "
                   "it starts when NVML shows the room",
                   id, why);
    }
    return true;
}

void osubd__act_wake_waits(struct osubd_act *d)
{
    if (osubd__idmap_count(d->wake_waits) == 0)
        return;
    size_t nk;
    osubd__idmap_key_t *keys = osubd__idmap_keys(d->wake_waits, &nk);
    for (size_t k = 0; k < nk; k++) {
        osub_service_info_t si;
        struct act_wake_wait *w = osubd__idmap_get(d->wake_waits, keys[k]);
        if (w == NULL)
            continue;
        if (osub_engine_service_info(d->e, keys[k], &si) != 0 ||
            si.state == OSUB_STATE_SUSPENDING || si.state == OSUB_STATE_SUSPENDED ||
            si.state == OSUB_STATE_DRAINING || si.state == OSUB_STATE_OVERDUE) {
            osubd__idmap_del(d->wake_waits, keys[k]); /* the engine moved on */
            continue;
        }
        osubd__act_suspend_start(d, keys[k], true, w->until_ms - osubd_engine_now(d->core));
    }
    free(keys);
}

void osubd_act_gpus_polled(struct osubd_act *d)
{
    osubd__act_wake_waits(d);
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
    if (d->sus != NULL && osubd_sus_busy(d->sus, id)) {
        /* under way already (a repeat after a restart: its answer comes), or a wake the engine
         * took as done after its resume cost: the suspend runs when the wake is answered
         * (wake_ended()), its timeout running meanwhile. Said, so that a wake that hangs is
         * seen to be what holds the suspend */
        if (!resume && !osubd_sus_busy_suspending(d->sus, id))
            osubd_note(d->core, id, "suspend", "waiting",
                       "%s: its suspend waits for its mechanism to answer the wake under way (it "
                       "runs then; its suspend timeout runs meanwhile)",
                       id);
        return;
    }
    osub_service_info_t si;
    bool cuda_wake =
        resume && sp.method == OSUBD_SUS_CUDA && osub_engine_service_info(d->e, id, &si) == 0;
    /* a relocation held for room outlives the engine's relocated_from, which ends with the
     * resume cost (taken as resumed): the wait keeps the GPU it left */
    const struct act_wake_wait *held = osubd__idmap_get(d->wake_waits, id);
    if (cuda_wake && si.relocated_from < 0 && held != NULL)
        si.relocated_from = held->reloc_from;
    if (cuda_wake && si.relocated_from >= 0 && relocate_remap(d, &si, &sp, err, sizeof(err)) != 0) {
        osubd__idmap_del(d->wake_waits, id);
        report_failed(d, id, err);
        return;
    }
    if (cuda_wake && restore_held(d, id, &si, timeout_ms))
        return;
    pid_t pids[OSUBD_SUS_PIDS_MAX];
    int n =
        sp.method == OSUBD_SUS_CUDA ? osubd_act_service_pids(d, id, pids, OSUBD_SUS_PIDS_MAX) : 0;
    /* the engine's deadline decides (reason suspend_timeout): the mechanism gives up a little
     * after it, so that its own failure never races the engine's timer */
    timeout_ms += MECHANISM_MARGIN_MS;
    if (timeout_ms < 1000)
        timeout_ms = 1000;
    if (d->sus == NULL || timeout_ms > INT32_MAX ||
        osubd_sus_start(d->sus, id, resume, &sp, pids, n, (int)timeout_ms, err, sizeof(err)) != 0) {
        report_failed(d, id, d->sus == NULL ? "this oversubd has no suspender" : err);
        return;
    }
    if (!resume)
        fall_begin(d, id, sp.method == OSUBD_SUS_CUDA);
    osubd_note(d->core, id, "suspend", resume ? "wake" : "start", "%s: %s by %s%s%s%s", id,
               resume ? "resuming" : "suspending", osubd_sus_method_name(sp.method),
               n > 0       ? " on its processes"
               : sp.url[0] ? " at "
                           : "",
               n > 0 ? "" : sp.url,
               sp.n_remap > 0 ? ", its checkpoint restored onto another GPU (a remap)" : "");
}

/* What the service is measured to hold on its GPUs now, MiB: the shim's count of its live
 * processes (not for a checkpoint: the shim counts allocations, whose addresses stay while the
 * driver keeps their bytes in host memory), else NVML's reading of its processes under an NVML
 * pool (the monitor's usage reports; a process gone from the GPU reads 0); -1 when nothing
 * measures it (a simulated pool without the shim: the mechanism's word is all there is). */
static int64_t measured_mib(struct osubd_act *d, const char *id, bool cuda)
{
    struct osub_proc *p = osubd__act_proc_find(d, id);
    struct osub_seg_view v;
    if (p != NULL)
        osubd__act_shim_adopt(d, p); /* adopted after a restart: its count from the start */
    if (!cuda && p != NULL && p->seg.s != NULL && osubd__act_seg_look(d, p, NULL, &v) &&
        v.live > 0) {
        uint64_t b = 0;
        for (uint32_t i = 0; i < v.n; i++)
            b += v.held[i];
        return (int64_t)osubd__act_to_mib(b);
    }
    osub_service_info_t si;
    if (strcmp(osubd_core_pool(d->core), "nvml") != 0 || osubd_act_pid(d, id) <= 0 ||
        osub_engine_service_info(d->e, id, &si) != 0)
        return -1;
    int64_t t = 0;
    for (int32_t i = 0; i < si.n_slots; i++)
        t += si.slots[i].used_mib;
    return t;
}

bool osubd_act_sus_is_cuda(struct osubd_act *d, const char *id)
{
    return osubd__act_sus_cuda(d, id);
}

bool osubd__act_sus_cuda(struct osubd_act *d, const char *id)
{
    const json_t *v = json_object_get(json_object_get(d->execs, id), "suspend");
    const char *m = json_string_value(json_object_get(v, "method"));
    return m != NULL && strcmp(m, "cuda") == 0;
}

static void report_suspended(struct osubd_act *d, const char *id, int64_t residual, bool seen)
{
    osubd_note(d->core, id, "suspend", "suspended",
               "%s: suspended: its GPU memory is in host memory; %lld MiB %s", id,
               (long long)residual,
               seen ? "still measured on its GPUs"
                    : "expected to stay on its GPUs (nothing measures its memory here: no shim, "
                      "no NVML; the mechanism's word is taken)");
    osubd__act_apply(d, json_pack("{s:s, s:s, s:I}", "op", "suspended", "id", id, "residual_mib",
                                  (json_int_t)residual));
}

/* Done is seen, not assumed: a suspend its mechanism says is done is reported once its memory
 * is seen to have fallen to at most what is expected to stay (the declared or last measured
 * residual) or to half of what it held when the suspend began, whichever is more; what is
 * measured then is its residual. A memory that never falls keeps it suspending until the
 * engine's suspend timeout evicts it (an SGLang without --enable-memory-saver answers 200 and
 * frees nothing). A checkpoint leaves nothing on the GPU (the driver releases every handle):
 * without NVML its residual is 0. */
static bool fall_seen(struct osubd_act *d, const char *id, struct act_sus_fall *f)
{
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0 || si.state != OSUB_STATE_SUSPENDING)
        return true; /* released, escalated or reported meanwhile: nothing to wait for */
    int64_t now = measured_mib(d, id, f->cuda);
    if (now < 0) {
        report_suspended(d, id, f->cuda ? 0 : si.residual_mib, f->cuda);
        return true;
    }
    int64_t enough = si.residual_mib;
    if (f->before_mib >= 0 && f->before_mib / 2 > enough)
        enough = f->before_mib / 2;
    if (now <= enough) {
        report_suspended(d, id, now, true);
        return true;
    }
    if (!f->said) {
        f->said = true;
        osubd_note(d->core, id, "suspend", "waiting",
                   "%s: its mechanism says it is suspended, but %lld MiB are still measured on "
                   "its GPUs (at most %lld expected): waiting for them to fall",
                   id, (long long)now, (long long)enough);
    }
    return false;
}

void osubd__act_sus_falls(struct osubd_act *d)
{
    if (osubd__idmap_count(d->sus_falls) == 0)
        return;
    size_t nk;
    osubd__idmap_key_t *keys = osubd__idmap_keys(d->sus_falls, &nk);
    for (size_t k = 0; k < nk; k++) {
        struct act_sus_fall *f = osubd__idmap_get(d->sus_falls, keys[k]);
        if (f != NULL && f->done && fall_seen(d, keys[k], f))
            osubd__idmap_del(d->sus_falls, keys[k]);
    }
    free(keys);
}

/* A wake that ended after the engine had moved on (true: dealt with here). Past its resume cost
 * the engine takes a service as resumed; a suspend decided meanwhile waited for the wake (one
 * operation at a time per service) and runs now. A wake that failed after the service was taken
 * as resumed leaves it not serving, its memory wherever the mechanism left it: it is failed,
 * said so, rather than left "running" asleep. */
static bool wake_ended(struct osubd_act *d, const char *id, const osub_service_info_t *si, bool ok,
                       const char *why)
{
    if (si->state == OSUB_STATE_SUSPENDING) {
        osubd__act_suspend_start(d, id, false, si->deadline_ms - osubd_engine_now(d->core));
        return true;
    }
    if (si->state == OSUB_STATE_RESUMING)
        return false;
    if (ok) {
        osubd_note(d->core, id, "suspend", "resumed",
                   "%s: its memory is back on its GPUs (after its resume cost had passed)", id);
        return true;
    }
    char what[700];
    snprintf(what, sizeof(what), "its wake failed after its resume cost had passed: %s",
             why != NULL ? why : "its mechanism failed");
    osubd_warn(d->core, id, "suspend", "failed", "%s: %s", id, what);
    osubd__act_apply(d, json_pack("{s:s, s:s, s:s}", "op", "fail", "id", id, "why", what));
    return true;
}

void osubd_act_sus_done(void *arg, const char *id, bool resume, bool ok, const char *why)
{
    struct osubd_act *d = arg;
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0 || !ok || resume)
        osubd__idmap_del(d->sus_falls, id);
    if (osub_engine_service_info(d->e, id, &si) != 0)
        return; /* released meanwhile */
    if (resume && wake_ended(d, id, &si, ok, why))
        return;
    if (!ok) {
        report_failed(d, id, why != NULL ? why : "its mechanism failed");
        return;
    }
    if (resume) {
        osubd_note(d->core, id, "suspend", "resumed", "%s: its memory is back on its GPUs", id);
        osubd__act_apply(d, json_pack("{s:s, s:s}", "op", "resumed", "id", id));
        return;
    }
    struct act_sus_fall *f = osubd__idmap_get(d->sus_falls, id);
    struct act_sus_fall one = {.before_mib = 0, .cuda = osubd__act_sus_cuda(d, id)};
    for (int32_t i = 0; i < si.n_slots; i++)
        one.before_mib += si.slots[i].grant_mib;
    if (f == NULL)
        f = &one; /* begun before a restart: what it held then is unknown, its grant bounds it */
    f->done = true;
    if (fall_seen(d, id, f)) {
        osubd__idmap_del(d->sus_falls, id);
        return;
    }
    if (f == &one) {
        struct act_sus_fall *keep = malloc(sizeof(*keep));
        if (keep == NULL || osubd__idmap_put(d->sus_falls, id, keep) != 0) {
            free(keep);
            report_failed(d, id, "out of memory");
        } else {
            *keep = one;
        }
    }
}

void osubd__act_suspend_restart(struct osubd_act *d)
{
    for (size_t i = 0; i < osub_engine_service_count(d->e); i++) {
        const char *id = osub_engine_service_id(d->e, i);
        osub_service_info_t si;
        if (id == NULL || osub_engine_service_info(d->e, id, &si) != 0)
            continue;
        if (si.state == OSUB_STATE_SUSPENDING) {
            osubd__act_suspend_start(d, id, false, si.deadline_ms - osubd_engine_now(d->core));
            /* what it holds now may be after the fall (the mechanism went on while oversubd was
             * down): what it held when the suspend began is unknown, its grant bounds it, as
             * for a suspend whose done comes with no fall noted (osubd_act_sus_done()) */
            struct act_sus_fall *f = osubd__idmap_get(d->sus_falls, id);
            int64_t grant = 0;
            for (int32_t k = 0; k < si.n_slots; k++)
                grant += si.slots[k].grant_mib;
            if (f != NULL && f->before_mib < grant)
                f->before_mib = grant;
        } else if (si.state == OSUB_STATE_RESUMING)
            osubd__act_suspend_start(d, id, true, si.resume_cost_ms + 30000);
    }
}
