/* sus_cuda.c - the cuda suspend method: the CUDA driver's process checkpoint API (loaded with
 * dlopen, as NVML is), applied to every process of a service that holds a CUDA context, on a
 * worker thread (the calls block for as long as the memory takes to move). */
#define _GNU_SOURCE
#include "sus.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_ckpt_abi.h"

struct osubd__sus_cuda {
    void *dl;
    osub_cu_ckpt_lock_fn lock;
    osub_cu_ckpt_checkpoint_fn checkpoint;
    osub_cu_ckpt_restore_fn restore;
    osub_cu_ckpt_unlock_fn unlock;
    osub_cu_ckpt_state_fn state;
    int version; /* cuDriverGetVersion, 0 if none */
};

struct osubd__sus_cuda *osubd__sus_cuda_load(const char *lib, char *why, size_t whylen)
{
    const char *path = lib != NULL && lib[0] ? lib : "libcuda.so.1";
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        snprintf(why, whylen, "no CUDA driver (%s)", dlerror());
        return NULL;
    }
    struct osubd__sus_cuda *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        dlclose(dl);
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    c->dl = dl;
    static const char *const names[] = {"cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                                        "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock",
                                        "cuCheckpointProcessGetState"};
    /* POSIX says a function pointer can be read through a cast of dlsym's result */
    void **fns[5] = {(void **)&c->lock, (void **)&c->checkpoint, (void **)&c->restore,
                     (void **)&c->unlock, (void **)&c->state};
    for (int i = 0; i < 5; i++) {
        *fns[i] = dlsym(dl, names[i]);
        if (*fns[i] == NULL) {
            snprintf(why, whylen,
                     "the CUDA driver %s has no process checkpoint API (%s is missing: driver "
                     "550 or later is needed)",
                     path, names[i]);
            dlclose(dl);
            free(c);
            return NULL;
        }
    }
    /* a restore needs the caller's driver initialised (or persistence mode) */
    CUresult (*init)(unsigned int) = NULL;
    *(void **)&init = dlsym(dl, "cuInit");
    if (init != NULL)
        (void)init(0);
    CUresult (*version)(int *) = NULL;
    *(void **)&version = dlsym(dl, "cuDriverGetVersion");
    if (version == NULL || version(&c->version) != CUDA_SUCCESS)
        c->version = 0;
    return c;
}

int osubd__sus_cuda_version(const struct osubd__sus_cuda *c)
{
    return c != NULL ? c->version : 0;
}

void osubd__sus_cuda_unload(struct osubd__sus_cuda *c)
{
    if (c == NULL)
        return;
    dlclose(c->dl);
    free(c);
}

static const char *cu_name(CUresult rc)
{
    switch (rc) {
    case CUDA_ERROR_INVALID_VALUE:
        return "invalid value";
    case CUDA_ERROR_OUT_OF_MEMORY:
        return "out of memory: the GPU has no room for it";
    case CUDA_ERROR_NOT_INITIALIZED:
        return "not initialized";
    case CUDA_ERROR_OPERATING_SYSTEM:
        return "operating system error";
    case CUDA_ERROR_ILLEGAL_STATE:
        return "illegal state";
    case CUDA_ERROR_NOT_READY:
        return "not ready: its work did not finish in time";
    case CUDA_ERROR_NOT_PERMITTED:
        return "not permitted";
    case CUDA_ERROR_NOT_SUPPORTED:
        return "not supported (memory the driver cannot move: UVM, IPC, NCCL across processes?)";
    default:
        return "error";
    }
}

static void fail(struct sus_job *j, pid_t pid, const char *call, CUresult rc)
{
    snprintf(j->why, sizeof(j->why), "process %d: %s: CUDA error %d (%s)", (int)pid, call, (int)rc,
             cu_name(rc));
}

/* The processes of the job that hold a CUDA context, with their states: n of them. */
static int with_context(struct osubd__sus_cuda *c, struct sus_job *j, pid_t *pids,
                        CUprocessState *st)
{
    int n = 0;
    for (int i = 0; i < j->npids; i++)
        if (c->state((int)j->pids[i], &st[n]) == CUDA_SUCCESS)
            pids[n++] = j->pids[i];
    return n;
}

static unsigned int left_ms(const struct sus_job *j)
{
    int64_t left = j->deadline_ms - osubd__sus_now_ms();
    return left < 1 ? 1 : left > 3600000 ? 3600000 : (unsigned int)left;
}

/* lock, checkpoint; on a failure what was done is undone (restored, unlocked) */
static bool do_suspend(struct osubd__sus_cuda *c, struct sus_job *j, pid_t *pids,
                       CUprocessState *st, int n)
{
    int i;
    CUresult rc = CUDA_SUCCESS;
    for (i = 0; i < n; i++) {
        if (st[i] == CU_PROCESS_STATE_FAILED) {
            snprintf(j->why, sizeof(j->why), "process %d: its CUDA state is FAILED", (int)pids[i]);
            break;
        }
        if (st[i] != CU_PROCESS_STATE_RUNNING)
            continue;
        CUcheckpointLockArgs la;
        memset(&la, 0, sizeof(la));
        la.timeoutMs = left_ms(j);
        if ((rc = c->lock((int)pids[i], &la)) != CUDA_SUCCESS) {
            fail(j, pids[i], "cuCheckpointProcessLock", rc);
            break;
        }
        st[i] = CU_PROCESS_STATE_LOCKED;
    }
    for (int k = 0; i == n && k < n; k++) {
        if (st[k] != CU_PROCESS_STATE_LOCKED)
            continue;
        if ((rc = c->checkpoint((int)pids[k], NULL)) != CUDA_SUCCESS) {
            fail(j, pids[k], "cuCheckpointProcessCheckpoint", rc);
            i = k; /* not n: undone below */
            break;
        }
        st[k] = CU_PROCESS_STATE_CHECKPOINTED;
    }
    if (i == n)
        return true;
    for (int k = 0; k < n; k++) {
        if (st[k] == CU_PROCESS_STATE_CHECKPOINTED && c->restore((int)pids[k], NULL) == 0)
            st[k] = CU_PROCESS_STATE_LOCKED;
        if (st[k] == CU_PROCESS_STATE_LOCKED)
            c->unlock((int)pids[k], NULL);
    }
    return false;
}

/* restore (with the job's remap: onto other GPUs), unlock (a restored process is left locked by
 * the driver) */
static bool do_resume(struct osubd__sus_cuda *c, struct sus_job *j, pid_t *pids, CUprocessState *st,
                      int n)
{
    bool ok = true;
    CUresult rc;
    CUcheckpointGpuPair pairs[OSUBD_SUS_REMAP_MAX];
    CUcheckpointRestoreArgs ra;
    memset(&ra, 0, sizeof(ra));
    for (int k = 0; k < j->spec.n_remap && k < OSUBD_SUS_REMAP_MAX; k++) {
        memcpy(pairs[k].oldUuid.bytes, j->spec.remap[k][0], 16);
        memcpy(pairs[k].newUuid.bytes, j->spec.remap[k][1], 16);
    }
    ra.gpuPairs = j->spec.n_remap > 0 ? pairs : NULL;
    ra.gpuPairsCount = j->spec.n_remap > 0 ? (unsigned int)j->spec.n_remap : 0;
    for (int i = 0; i < n; i++) {
        if (st[i] != CU_PROCESS_STATE_CHECKPOINTED)
            continue;
        if ((rc = c->restore((int)pids[i], j->spec.n_remap > 0 ? &ra : NULL)) != CUDA_SUCCESS) {
            if (ok)
                fail(j, pids[i], "cuCheckpointProcessRestore", rc);
            ok = false;
            continue;
        }
        st[i] = CU_PROCESS_STATE_LOCKED;
    }
    for (int i = 0; i < n; i++) {
        if (st[i] != CU_PROCESS_STATE_LOCKED)
            continue;
        if ((rc = c->unlock((int)pids[i], NULL)) != CUDA_SUCCESS && ok) {
            fail(j, pids[i], "cuCheckpointProcessUnlock", rc);
            ok = false;
        }
    }
    for (int i = 0; ok && i < n; i++) {
        CUprocessState now;
        if (c->state((int)pids[i], &now) == CUDA_SUCCESS && now != CU_PROCESS_STATE_RUNNING) {
            snprintf(j->why, sizeof(j->why), "process %d is in CUDA state %d after its resume",
                     (int)pids[i], (int)now);
            ok = false;
        }
    }
    return ok;
}

static void *worker(void *arg)
{
    struct sus_job *j = arg;
    struct osubd__sus_cuda *c = j->cuda;
    pid_t pids[OSUBD_SUS_PIDS_MAX];
    CUprocessState st[OSUBD_SUS_PIDS_MAX];
    int n = with_context(c, j, pids, st);
    if (n == 0) {
        snprintf(j->why, sizeof(j->why), "none of its %d process(es) holds a CUDA context",
                 j->npids);
        j->ok = false;
    } else {
        j->ok = j->resume ? do_resume(c, j, pids, st, n) : do_suspend(c, j, pids, st, n);
    }
    atomic_store(&j->finished, true);
    char b = 1;
    while (write(j->wake_fd, &b, 1) < 0 && errno == EINTR)
        ;
    return NULL;
}

int osubd__sus_cuda_start(struct osubd_sus *s, struct sus_job *j, char *why, size_t whylen)
{
    j->cuda = s->cuda;
    j->wake_fd = s->wake[1];
    int rc = pthread_create(&j->thread, NULL, worker, j);
    if (rc != 0) {
        snprintf(why, whylen, "cannot start a thread: %s", strerror(rc));
        return -1;
    }
    j->has_thread = true;
    return 0;
}
