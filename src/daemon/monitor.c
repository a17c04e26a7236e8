/* monitor.c - the GPUs as NVML shows them: the pool at start, GPUs lost, memory no service
 * reports (system), the usage of services that told their PID (monitor.h) */
#define _POSIX_C_SOURCE 200809L
#include "monitor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "actuator.h"
#include "log.h"
#include "nvml.h"
#include "oversub/units.h"

struct osubd_monitor {
    const struct osubd_config *cfg;
    struct osubd_gpus *gpus;  /* filled here: the UUID of each engine GPU */
    struct osubd__nvml *nvml; /* NULL: a simulated pool */
    struct osubd_core *core;
    osub_engine_t *e;
    struct osubd_act *act;
    struct event *poll_ev;
};

struct osubd_monitor *osubd_monitor_new(const struct osubd_config *cfg, struct osubd_gpus *gpus)
{
    struct osubd_monitor *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->cfg = cfg;
    m->gpus = gpus;
    return m;
}

int osubd_monitor_pool(void *arg, const char *gpus, struct osubd_pool *out, char *err,
                       size_t errlen)
{
    struct osubd_monitor *d = arg;
    int64_t *vram = out->vram;
    char(*names)[96] = out->names;
    size_t cap = OSUB_POOL_GPUS_MAX, *n = &out->n;
    char *desc = out->desc;
    size_t desclen = sizeof(out->desc);
    out->nvml = false;
    const char *spec = gpus;
    for (size_t i = 0; i < cap; i++)
        names[i][0] = '\0';
    if (strcmp(gpus, "auto") == 0 || strcmp(gpus, "nvml") == 0) {
        char nerr[300];
        if (d->nvml == NULL && osubd__nvml_open(d->cfg->nvml_lib[0] ? d->cfg->nvml_lib : NULL,
                                                &d->nvml, nerr, sizeof(nerr)) != 0) {
            if (strcmp(gpus, "nvml") == 0) {
                snprintf(err, errlen, "--gpus nvml: %s", nerr);
                return -1;
            }
            snprintf(desc, desclen,
                     "auto: no NVIDIA driver (%s), so a simulated pool of 8 x 81920 MiB", nerr);
            spec = "8x81920";
        } else {
            struct nvml_gpu g[OSUBD_NVML_GPUS_MAX];
            size_t k = 0;
            if (osubd__nvml_read(d->nvml, g, OSUBD_NVML_GPUS_MAX, &k, err, errlen) != 0)
                return -1;
            if (k == 0) {
                snprintf(err, errlen, "NVML reports no GPU");
                return -1;
            }
            for (size_t i = 0; i < k && i < cap; i++) {
                vram[i] = g[i].total_mib;
                snprintf(names[i], 96, "%s", g[i].name);
                memcpy(d->gpus->uuid[i], g[i].uuid, sizeof(d->gpus->uuid[i]));
                d->gpus->uuid[i][sizeof(d->gpus->uuid[i]) - 1] = '\0';
            }
            *n = k < cap ? k : cap;
            d->gpus->n = (int32_t)*n;
            out->nvml = true;
            snprintf(desc, desclen, "%zu GPU(s) from NVML (the first: %s, %lld MiB)", k, g[0].name,
                     (long long)g[0].total_mib);
            return 0;
        }
    } else if (strncmp(gpus, "sim:", 4) == 0) {
        spec = gpus + 4;
        snprintf(desc, desclen, "a simulated pool %s", spec);
    } else {
        snprintf(err, errlen, "--gpus: '%s' is not auto, nvml or sim:POOL (sim:8x81920)", gpus);
        return -1;
    }
    if (osub_parse_pool(spec, vram, cap, n) != 0) {
        snprintf(err, errlen,
                 "--gpus: '%s' is not a pool (sim:8x81920, sim:4x81920,4x40960; at most %d GPUs)",
                 gpus, OSUB_POOL_GPUS_MAX);
        return -1;
    }
    return 0;
}

/* GPUs the state knows that NVML no longer shows (gone, or another UUID at that index) are
 * marked lost, their services requeued or released with events. */
static int check_gpus_found(struct osubd_monitor *d, char *err, size_t errlen)
{
    char *stored = NULL;
    if (osubd_core_meta(d->core, "gpu_uuids", &stored, err, errlen) != 0)
        return -1;
    if (stored == NULL)
        return 0;
    struct nvml_gpu g[OSUBD_NVML_GPUS_MAX];
    size_t k = 0;
    char nerr[256];
    if (d->nvml == NULL ||
        osubd__nvml_read(d->nvml, g, OSUBD_NVML_GPUS_MAX, &k, nerr, sizeof(nerr)) != 0)
        k = 0;
    int32_t i = 0;
    char *save = NULL;
    d->gpus->n = 0;
    for (char *u = strtok_r(stored, ",", &save); u && i < OSUBD_NVML_GPUS_MAX;
         u = strtok_r(NULL, ",", &save), i++) {
        snprintf(d->gpus->uuid[i], sizeof(d->gpus->uuid[i]), "%s", u);
        d->gpus->n = i + 1;
        bool found = false;
        for (size_t j = 0; j < k; j++)
            found = found || strcmp(g[j].uuid, u) == 0;
        osub_gpu_info_t gi;
        if (found || osub_engine_gpu_info(d->e, i, &gi) != 0 || gi.lost)
            continue;
        osubd_log(OSUBD_LOG_WARN,
                  "GPU %d (%s) is not among the GPUs NVML shows now: marking it lost; "
                  "its services go back to the queue or are released",
                  i, u);
        json_t *cmd = json_pack("{s:s, s:i}", "op", "lost", "gpu", (int)i);
        osubd_apply(d->core, cmd, NULL, nerr, sizeof(nerr));
        json_decref(cmd);
    }
    free(stored);
    return 0;
}

/* Services that told their PID (POST .../ready {"pid"}): their processes' memory on each of
 * their GPUs, from NVML, becomes their usage (a command only when it changed). PIDs of
 * services that are gone are forgotten. */
static void report_process_usage(struct osubd_monitor *d, const struct nvml_gpu *g, size_t k)
{
    size_t nk;
    osubd__idmap_key_t *keys = osubd_act_pid_ids(d->act, &nk); /* a command may forget one */
    for (size_t ki = 0; ki < nk; ki++) {
        const char *id = keys[ki];
        osub_service_info_t si;
        json_int_t pid = osubd_act_pid(d->act, id);
        if (pid <= 0 || osub_engine_service_info(d->e, id, &si) != 0)
            continue;
        /* the shim's figure is exact: it wins, but for a CUDA checkpoint, whose allocations
         * the shim still counts while their bytes are in host memory (until its restore has
         * put them back): NVML sees them leave and come back */
        bool ckpt = (si.state == OSUB_STATE_SUSPENDING || si.state == OSUB_STATE_SUSPENDED ||
                     si.state == OSUB_STATE_RESUMING) &&
                    si.spec != NULL && si.spec->suspend.method == OSUB_SUSPEND_CUDA;
        if (osubd_act_shim_processes(d->act, id) > 0 && !ckpt)
            continue;
        /* every process of the service (vLLM's engine core is a child of its API server) */
        pid_t pids[64];
        int np = osubd_act_service_pids(d->act, id, pids, 64);
        if (np == 0)
            pids[np++] = (pid_t)pid;
        json_t *per = json_array();
        bool changed = false, seen = false;
        for (int32_t s = 0; s < si.n_slots; s++) {
            int64_t mib = 0;
            const char *uuid = si.slots[s].gpu < d->gpus->n ? d->gpus->uuid[si.slots[s].gpu] : "";
            for (size_t j = 0; j < k; j++) {
                if (strcmp(g[j].uuid, uuid) != 0)
                    continue;
                for (int32_t p = 0; p < g[j].n_procs; p++)
                    for (int q = 0; q < np; q++)
                        if (g[j].procs[p].pid == (uint32_t)pids[q]) {
                            mib += g[j].procs[p].used_mib;
                            seen = true;
                        }
            }
            changed = changed || mib != si.slots[s].used_mib;
            json_array_append_new(per, json_integer(mib));
        }
        /* an external service evicted whose process holds no GPU memory any more has
         * exited, as far as memory goes (managed ones are watched as processes) */
        if (!seen && (si.state == OSUB_STATE_DRAINING || si.state == OSUB_STATE_OVERDUE) &&
            !osubd_act_managed(d->act, id)) {
            json_decref(per);
            osubd_log(OSUBD_LOG_INFO, "NVML shows no memory of %s's process %lld: exited", id,
                      (long long)pid);
            json_t *cmd = json_pack("{s:s, s:s}", "op", "exited", "id", id);
            char err[256];
            osubd_apply(d->core, cmd, NULL, err, sizeof(err));
            json_decref(cmd);
            continue;
        }
        /* a process not (yet) on any GPU: nothing to say, unless it is being suspended (a
         * checkpointed process leaves NVML's list: its memory fell to nothing) */
        bool off = si.state == OSUB_STATE_SUSPENDING || si.state == OSUB_STATE_SUSPENDED || ckpt;
        if ((seen || off) && changed) {
            json_t *cmd = json_pack("{s:s, s:s, s:o}", "op", "usage", "id", id, "gpus", per);
            char err[256];
            osubd_apply(d->core, cmd, NULL, err, sizeof(err));
            json_decref(cmd);
        } else {
            json_decref(per);
        }
    }
    free(keys);
}

/* The monitor: NVML's view of each GPU. Memory in use that no service reports counts as
 * system (the driver, contexts, processes oversub does not know); a GPU that vanished is
 * lost. */
static void on_poll(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_monitor *d = arg;
    struct nvml_gpu g[OSUBD_NVML_GPUS_MAX];
    size_t k = 0;
    char err[256];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    if (osubd__nvml_read(d->nvml, g, OSUBD_NVML_GPUS_MAX, &k, err, sizeof(err)) != 0) {
        if (d->gpus->unreadable_since_ms == 0) {
            d->gpus->unreadable_since_ms = now_ms;
            osubd_log(OSUBD_LOG_WARN,
                      "NVML cannot be read (%s): the GPUs' system memory and the usage NVML "
                      "measures stay as last read (a released service's memory stays counted, "
                      "CUDA restores wait for room) until it answers; /healthz says so",
                      err);
        }
        snprintf(d->gpus->unreadable_why, sizeof(d->gpus->unreadable_why), "%.200s", err);
        return;
    }
    if (d->gpus->unreadable_since_ms != 0) {
        osubd_log(OSUBD_LOG_WARN, "NVML answers again, after %lld ms",
                  (long long)(now_ms - d->gpus->unreadable_since_ms));
        d->gpus->unreadable_since_ms = 0;
    }
    /* the shim's counts of the same moment: what NVML shows of a service that the shim counts is
     * the service's, not system memory (a count read up to 200 ms late made a starting
     * service's memory system memory for a poll, and that pressure could evict it) */
    osubd_act_shim_sync(d->act);
    report_process_usage(d, g, k);
    for (int32_t i = 0; i < d->gpus->n; i++) {
        d->gpus->free_mib[i] = 0;
        for (size_t j = 0; j < k; j++)
            if (strcmp(g[j].uuid, d->gpus->uuid[i]) == 0)
                d->gpus->free_mib[i] =
                    g[j].total_mib > g[j].used_mib ? g[j].total_mib - g[j].used_mib : 0;
    }
    d->gpus->polled = true;
    for (int32_t i = 0; i < d->gpus->n; i++) {
        osub_gpu_info_t gi;
        if (osub_engine_gpu_info(d->e, i, &gi) != 0 || gi.lost)
            continue;
        const struct nvml_gpu *m = NULL;
        for (size_t j = 0; j < k && m == NULL; j++)
            if (strcmp(g[j].uuid, d->gpus->uuid[i]) == 0)
                m = &g[j];
        json_t *cmd;
        if (m == NULL) {
            osubd_log(OSUBD_LOG_WARN, "GPU %d (%s) disappeared", i, d->gpus->uuid[i]);
            cmd = json_pack("{s:s, s:i}", "op", "lost", "gpu", (int)i);
        } else {
            int64_t services = gi.used_mib - gi.system_mib;
            int64_t sys = m->used_mib - services;
            if (sys < 0)
                sys = 0;
            if (sys > gi.vram_mib)
                sys = gi.vram_mib;
            if (sys == gi.system_mib)
                continue;
            cmd = json_pack("{s:s, s:i, s:I}", "op", "system", "gpu", (int)i, "vram_mib",
                            (json_int_t)sys);
        }
        osubd_apply(d->core, cmd, NULL, err, sizeof(err));
        json_decref(cmd);
    }
    osubd_act_gpus_polled(d->act);
}

/* The writer committed (or failed): send the replies it covers, wake long-polls. */

int osubd_monitor_start(struct osubd_monitor *m, struct osubd_core *c, struct osubd_act *act,
                        char *err, size_t errlen)
{
    m->core = c;
    m->e = osubd_core_engine(c);
    m->act = act;
    const char *pool = osubd_core_pool(c);
    if (!osubd_core_existing(c)) {
        char ul[OSUBD_NVML_GPUS_MAX * 97] = "";
        for (int32_t u = 0; u < m->gpus->n; u++) {
            strcat(ul, u ? "," : "");
            strcat(ul, m->gpus->uuid[u]);
        }
        if (osubd_core_meta_set(c, "gpu_uuids", ul, err, errlen) != 0)
            return -1;
    } else if (strcmp(pool, "nvml") == 0) {
        char nerr[300];
        if (m->nvml == NULL && osubd__nvml_open(m->cfg->nvml_lib[0] ? m->cfg->nvml_lib : NULL,
                                                &m->nvml, nerr, sizeof(nerr)) != 0) {
            /* marking every GPU lost would throw the services out: refuse instead */
            snprintf(err, errlen,
                     "%s holds the state of NVML GPUs, but NVML does not answer (%s); start "
                     "oversubd where the driver is, or with another --state",
                     m->cfg->state_path, nerr);
            return -1;
        }
        if (check_gpus_found(m, err, errlen) != 0)
            return -1;
    } else if (m->nvml != NULL) {
        /* a simulated pool: the real GPUs are not watched */
        osubd__nvml_close(m->nvml);
        m->nvml = NULL;
    }
    if (m->nvml == NULL)
        return 0;
    struct timeval pv = {(time_t)(m->cfg->poll_ms / 1000),
                         (suseconds_t)(m->cfg->poll_ms % 1000) * 1000};
    m->poll_ev = event_new(osubd_core_base(c), -1, EV_PERSIST, on_poll, m);
    if (m->poll_ev == NULL || event_add(m->poll_ev, &pv) != 0) {
        snprintf(err, errlen, "cannot set up the GPU monitor");
        return -1;
    }
    return 0;
}

void osubd_monitor_free(struct osubd_monitor *m)
{
    if (m == NULL)
        return;
    if (m->poll_ev)
        event_free(m->poll_ev);
    osubd__nvml_close(m->nvml);
    free(m);
}
