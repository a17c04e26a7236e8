/* fake_nvml.c - a stand-in for libnvidia-ml.so.1 for tests: GPUs and their memory come from a
 * script file (FAKE_NVML_FILE), read again on every call so a test can change them live.
 * Lines: "gpu UUID NAME TOTAL_MIB USED_MIB UTIL_PCT" (one per device, in index order) and
 * "proc UUID PID USED_MIB" (a compute process on that device).
 * Only the calls oversubd makes exist. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

struct dev {
    char uuid[96], name[96];
    unsigned long long total_mib, used_mib;
    unsigned int util;
};

struct proc {
    char uuid[96];
    unsigned int pid;
    unsigned long long used_mib;
};

static struct dev devs[64];
static struct proc procs[256];
static unsigned int n_procs;
static unsigned int n_devs;
static int inited;

static int load(void)
{
    const char *path = getenv("FAKE_NVML_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f == NULL)
        return -1;
    n_devs = 0;
    n_procs = 0;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        struct dev *d = &devs[n_devs < 64 ? n_devs : 63];
        struct proc *p = &procs[n_procs < 256 ? n_procs : 255];
        if (n_devs < 64 && sscanf(line, "gpu %95s %95s %llu %llu %u", d->uuid, d->name,
                                  &d->total_mib, &d->used_mib, &d->util) == 5)
            n_devs++;
        else if (n_procs < 256 &&
                 sscanf(line, "proc %95s %u %llu", p->uuid, &p->pid, &p->used_mib) == 3)
            n_procs++;
    }
    fclose(f);
    return 0;
}

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInit_v2(void)
{
    if (load() != 0)
        return 9; /* NVML_ERROR_DRIVER_NOT_LOADED */
    inited = 1;
    return 0;
}

nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlShutdown(void)
{
    inited = 0;
    return 0;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!inited || load() != 0)
        return 1;
    *count = n_devs;
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev)
{
    if (!inited || load() != 0 || index >= n_devs)
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *dev = (nvmlDevice_t)(unsigned long)(index + 1);
    return 0;
}

static struct dev *of(nvmlDevice_t h)
{
    unsigned long i = (unsigned long)h;
    if (load() != 0 || i == 0 || i > n_devs)
        return NULL;
    return &devs[i - 1];
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int len);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int len)
{
    struct dev *d = of(h);
    if (d == NULL)
        return 2;
    snprintf(name, len, "%s", d->name);
    return 0;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int len);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int len)
{
    struct dev *d = of(h);
    if (d == NULL)
        return 2;
    snprintf(uuid, len, "%s", d->uuid);
    return 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m)
{
    struct dev *d = of(h);
    if (d == NULL)
        return 2;
    m->total = d->total_mib << 20;
    m->used = d->used_mib << 20;
    m->free = m->total > m->used ? m->total - m->used : 0;
    return 0;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u)
{
    struct dev *d = of(h);
    if (d == NULL)
        return 2;
    u->gpu = d->util;
    u->memory = 0;
    return 0;
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

/* NVML's contract: with too small a buffer, the count needed and NVML_ERROR_INSUFFICIENT_SIZE */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *count,
                                                     nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *count,
                                                     nvmlProcessInfo_t *infos)
{
    struct dev *d = of(h);
    if (d == NULL)
        return 2;
    unsigned int k = 0;
    for (unsigned int i = 0; i < n_procs; i++)
        if (strcmp(procs[i].uuid, d->uuid) == 0) {
            if (k < *count) {
                infos[k].pid = procs[i].pid;
                infos[k].usedGpuMemory = procs[i].used_mib << 20;
                infos[k].gpuInstanceId = infos[k].computeInstanceId = 0xFFFFFFFFu;
            }
            k++;
        }
    int enough = k <= *count;
    *count = k;
    return enough ? 0 : 7;
}
