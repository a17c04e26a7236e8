/* nvml.c - NVIDIA's management library through dlopen: no header, no link dependency */
#define _POSIX_C_SOURCE 200809L
#include "nvml.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The few NVML types and calls we use, as the public API documents them. */
typedef int nvml_ret;
typedef void *nvml_dev;
struct nvml_memory {
    unsigned long long total, free, used;
};
struct nvml_util {
    unsigned int gpu, memory;
};
struct nvml_process {
    unsigned int pid;
    unsigned long long used_bytes;
    unsigned int gpu_instance, compute_instance;
};
#define NVML_INSUFFICIENT_SIZE 7

struct osubd__nvml {
    void *lib;
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    nvml_ret (*count)(unsigned int *);
    nvml_ret (*handle)(unsigned int, nvml_dev *);
    nvml_ret (*name)(nvml_dev, char *, unsigned int);
    nvml_ret (*uuid)(nvml_dev, char *, unsigned int);
    nvml_ret (*memory)(nvml_dev, struct nvml_memory *);
    nvml_ret (*util)(nvml_dev, struct nvml_util *);
    nvml_ret (*procs)(nvml_dev, unsigned int *, struct nvml_process *); /* optional */
};

int osubd__nvml_open(const char *path, osubd__nvml_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (path == NULL)
        path = getenv("OSUB_NVML_LIB");
    if (path == NULL)
        path = "libnvidia-ml.so.1";
    osubd__nvml_t *n = calloc(1, sizeof(*n));
    if (n == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    n->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (n->lib == NULL) {
        const char *why = dlerror();
        snprintf(err, errlen, "cannot load %s: %s", path, why ? why : "?");
        free(n);
        return -1;
    }
    /* POSIX says a function pointer can be read through a cast of dlsym's result */
    *(void **)&n->init = dlsym(n->lib, "nvmlInit_v2");
    *(void **)&n->shutdown = dlsym(n->lib, "nvmlShutdown");
    *(void **)&n->count = dlsym(n->lib, "nvmlDeviceGetCount_v2");
    *(void **)&n->handle = dlsym(n->lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&n->name = dlsym(n->lib, "nvmlDeviceGetName");
    *(void **)&n->uuid = dlsym(n->lib, "nvmlDeviceGetUUID");
    *(void **)&n->memory = dlsym(n->lib, "nvmlDeviceGetMemoryInfo");
    *(void **)&n->util = dlsym(n->lib, "nvmlDeviceGetUtilizationRates");
    *(void **)&n->procs = dlsym(n->lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (n->procs == NULL)
        *(void **)&n->procs = dlsym(n->lib, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (!n->init || !n->shutdown || !n->count || !n->handle || !n->name || !n->uuid || !n->memory ||
        !n->util) {
        snprintf(err, errlen, "%s lacks the NVML calls oversubd needs", path);
        dlclose(n->lib);
        free(n);
        return -1;
    }
    nvml_ret rc = n->init();
    if (rc != 0) {
        snprintf(err, errlen, "%s: nvmlInit failed (error %d): is the NVIDIA driver loaded?", path,
                 rc);
        dlclose(n->lib);
        free(n);
        return -1;
    }
    *out = n;
    return 0;
}

void osubd__nvml_close(osubd__nvml_t *n)
{
    if (n == NULL)
        return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

int osubd__nvml_read(osubd__nvml_t *n, struct nvml_gpu *gpus, size_t cap, size_t *n_out, char *err,
                     size_t errlen)
{
    unsigned int count = 0;
    if (n->count(&count) != 0) {
        snprintf(err, errlen, "nvmlDeviceGetCount failed");
        return -1;
    }
    size_t k = 0;
    for (unsigned int i = 0; i < count && k < cap; i++) {
        nvml_dev d;
        struct nvml_memory m;
        struct nvml_util u = {0, 0};
        struct nvml_gpu *g = &gpus[k];
        memset(g, 0, sizeof(*g));
        if (n->handle(i, &d) != 0 || n->memory(d, &m) != 0 ||
            n->uuid(d, g->uuid, sizeof(g->uuid)) != 0 ||
            n->name(d, g->name, sizeof(g->name)) != 0) {
            snprintf(err, errlen, "NVML cannot read GPU %u", i);
            return -1;
        }
        n->util(d, &u);
        g->total_mib = (int64_t)(m.total >> 20);
        g->used_mib = (int64_t)((m.used + (1u << 20) - 1) >> 20);
        g->util_pct = (int32_t)u.gpu;
        g->n_procs = -1;
        if (n->procs != NULL) {
            struct nvml_process pr[OSUB_NVML_PROCS];
            unsigned int np = OSUB_NVML_PROCS;
            nvml_ret prc = n->procs(d, &np, pr);
            if (prc == 0 || prc == NVML_INSUFFICIENT_SIZE) {
                /* more processes than we keep: the rest count as system memory */
                g->n_procs = 0;
                for (unsigned int p = 0; prc == 0 && p < np && p < OSUB_NVML_PROCS; p++) {
                    g->procs[p].pid = pr[p].pid;
                    g->procs[p].used_mib = (int64_t)((pr[p].used_bytes + (1u << 20) - 1) >> 20);
                    g->n_procs = (int32_t)p + 1;
                }
            }
        }
        k++;
    }
    *n_out = k;
    return 0;
}
