/* gpus.h - the machine's GPUs as the engine numbers them: each one's NVML UUID ("" when the
 * pool is simulated). A plain table: the monitor fills it at start (from NVML or the state),
 * the actuators, the device plugin and the API read it. */
#ifndef OSUBD_GPUS_H
#define OSUBD_GPUS_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

struct osubd_gpus {
    int32_t n; /* GPUs with a UUID: 0 for a simulated pool */
    char uuid[OSUBD_NVML_GPUS_MAX][96];
    /* NVML's last poll (the monitor): each GPU's free memory, MiB; polled false until one has
     * been read (and always for a simulated pool) */
    bool polled;
    int64_t free_mib[OSUBD_NVML_GPUS_MAX];
    /* NVML failing to answer the poll: since when (Unix ms; 0: it answers), and why */
    int64_t unreadable_since_ms;
    char unreadable_why[256];
};

/* GPU i's UUID, "" when it has none. */
static inline const char *osubd_gpu_uuid(const struct osubd_gpus *g, int32_t i)
{
    return g != NULL && i >= 0 && i < g->n ? g->uuid[i] : "";
}

#endif
