/* nvml.h - NVIDIA's management library, loaded at run time with dlopen (no build
 * dependency): the GPUs, their memory and utilisation */
#ifndef OSUB_DAEMON_NVML_H
#define OSUB_DAEMON_NVML_H

#include <stddef.h>
#include <stdint.h>

#define OSUB_NVML_PROCS 32

struct nvml_proc {
    uint32_t pid;
    int64_t used_mib;
};

struct nvml_gpu {
    char uuid[96];
    char name[96];
    int64_t total_mib, used_mib;
    int32_t util_pct;
    /* compute processes and their memory (n_procs -1: this NVML cannot list them) */
    struct nvml_proc procs[OSUB_NVML_PROCS];
    int32_t n_procs;
};

typedef struct osubd__nvml osubd__nvml_t;

/* Loads path (NULL: "libnvidia-ml.so.1", or $OSUB_NVML_LIB) and initialises NVML. Returns 0,
 * or -1 with a sentence in err (no driver, a library without the calls we need...). */
int osubd__nvml_open(const char *path, osubd__nvml_t **out, char *err, size_t errlen);
void osubd__nvml_close(osubd__nvml_t *n);
/* Reads every GPU into gpus (up to cap); *n_out their number. Returns 0 or -1. */
int osubd__nvml_read(osubd__nvml_t *n, struct nvml_gpu *gpus, size_t cap, size_t *n_out, char *err,
                     size_t errlen);

#endif
