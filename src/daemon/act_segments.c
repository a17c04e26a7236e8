/* act_segments.c - the CUDA shim's grant segments of managed services, read under a SIGBUS guard;
 * the watch round */
#define _GNU_SOURCE
#include "act.h"

/* What oversubd reads of a segment, copied out under the guard below. */

/* A segment is a file of the service's user, who can shrink it under our mapping: a read past
 * its end is SIGBUS. Every look at one runs under this guard; a fault drops that segment (the
 * service runs on, its processes' shim refusing what it cannot account for) instead of the
 * daemon. */
static sigjmp_buf *seg_guard;

void osubd__act_on_sigbus(int sig, siginfo_t *info, void *ctx)
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
    osubd_warn(d->core, p->id, "shim", "damaged",
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
        osubd_warn(d->core, p->id, "shim", "tampered",
                   "%s: its CUDA shim segment: %s; its figure is ignored until it reads clean",
                   p->id, why);
    p->seg_faulty = true;
}

/* Reads the segment (and, with si, first reclaims dead processes and writes the engine's
 * grants into it). Everything read is bounded by the geometry copied when the segment was
 * made; a rewritten header is put back. false when there is nothing to believe this round
 * (the segment was dropped, or said something impossible). */
bool osubd__act_seg_look(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si,
                         struct osub_seg_view *v)
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
int osubd__act_seg_open_guarded(struct osub_segment *g, const char *path, char *err, size_t errlen)
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
bool osubd__act_seg_zero_guarded(struct osub_segment *g)
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

uint64_t osubd__act_to_mib(uint64_t bytes)
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
    struct osub_seg_view v;
    if (!osubd__act_seg_look(d, p, &si, &v))
        return;
    if (v.got > 0) {
        osubd_note(d->core, p->id, "shim", "reclaimed",
                   "%s: %llu MiB held by processes that died taken back into its grant", p->id,
                   (unsigned long long)osubd__act_to_mib(v.got));
    }
    bool reported = false;
    for (uint32_t i = 0; i < v.n; i++)
        reported = reported || p->seg_reported[i] != 0;
    /* suspended, its usage is its residual (a vLLM asleep keeps its context); a checkpoint's
     * is not the shim's count (the allocations stay, their bytes are in host memory) */
    bool measured = osubd__act_live_state(si.state) || si.state == OSUB_STATE_RESUMING ||
                    (osubd__act_suspend_state(si.state) && !osubd__act_sus_cuda(d, p->id));
    if ((v.live == 0 && !reported) || v.n != (uint32_t)si.n_slots || !measured)
        return;
    bool changed = false;
    json_t *per = json_array();
    for (uint32_t i = 0; i < v.n; i++) {
        uint64_t mib = osubd__act_to_mib(v.held[i]);
        changed = changed || mib != p->seg_reported[i] || (int64_t)mib != si.slots[i].used_mib;
        p->seg_reported[i] = mib;
        json_array_append_new(per, json_integer((json_int_t)mib));
    }
    if (!changed) {
        json_decref(per);
        return;
    }
    json_t *cmd = json_pack("{s:s, s:s, s:o}", "op", "usage", "id", p->id, "gpus", per);
    osubd__act_apply(d, cmd);
}

/* A process adopted after oversubd restarted keeps the segment it was started with: map it
 * again (once; a missing or foreign file means it runs without one). The watch does it, and
 * whatever needs its count before the watch's first round (a suspend run again at the start). */
void osubd__act_shim_adopt(struct osubd_act *d, struct osub_proc *p)
{
    if (p->seg.s != NULL || p->pid <= 0 || p->child || d->shim_path[0] == '\0')
        return;
    if (p->seg_path[0] != '\0')
        return; /* tried before */
    char sd[512];
    osubd__act_state_dir(d, sd, sizeof(sd));
    snprintf(p->seg_path, sizeof(p->seg_path), "%s/shim/%s.seg", sd, p->id);
    char err[512];
    if (access(p->seg_path, F_OK) == 0 &&
        osubd__act_seg_open_guarded(&p->seg, p->seg_path, err, sizeof(err)) != 0)
        osubd_log(OSUBD_LOG_WARN, "%s: its CUDA shim segment cannot be used: %s", p->id, err);
}

void osubd_act_shim_sync(struct osubd_act *d)
{
    for (struct osub_proc *p = d->proc_list; p; p = p->next)
        if (p->seg.s != NULL)
            shim_sync(d, p);
}

void osubd__act_on_watch(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_act *d = arg;
    static unsigned rounds;
    rounds++;
    for (struct osub_proc *p = d->proc_list, *next; p; p = next) {
        next = p->next;
        osubd__act_shim_adopt(d, p);
        if (p->seg.s != NULL)
            shim_sync(d, p);
        if (p->pid <= 0) {
            if (rounds % 5 == 0)
                osubd__act_cg_remove(d, p->id);
            continue;
        }
        if (!p->child && osubd__act_proc_starttime(p->pid) != p->starttime)
            osubd__act_on_exit_of(d, p, -1,
                                  "ended (an adopted process: its exit status is unknown)");
        else if (rounds % 5 == 0)
            osubd__act_rotate_log(d, p->id);
    }
    /* external services that gave their PID: draining and gone means exited */
    size_t nk;
    osubd__idmap_key_t *keys = osubd__idmap_keys(d->pids, &nk); /* exited_cmd may forget one */
    for (size_t k = 0; k < nk; k++) {
        const char *id = keys[k];
        struct osub_proc *p = osubd__act_proc_find(d, id);
        if (p != NULL && (p->pid > 0 || osubd_act_managed(d, id)))
            continue;
        osub_service_info_t si;
        pid_t pid = osubd_act_pid(d, id);
        if (pid > 0 && osub_engine_service_info(d->e, id, &si) == 0 &&
            osubd__act_draining_state(si.state) && kill(pid, 0) != 0 && errno == ESRCH) {
            osubd_warn(d->core, id, "process", "gone", "%s's process %d is gone while %s", id,
                       (int)pid, osub_state_name(si.state));
            osubd__act_exited_cmd(d, id);
        }
    }
    free(keys);
    osubd__act_sus_falls(d);
    osubd__act_reconcile(d);
}
