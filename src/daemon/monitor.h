/* monitor.h - the GPUs as NVML shows them (a runner: the poll every poll_ms) */
#ifndef OSUBD_MONITOR_H
#define OSUBD_MONITOR_H

#include <stddef.h>

#include "core.h"
#include "gpus.h"

struct osubd_act;
struct osubd_monitor;

/* gpus: the table the monitor fills (the UUID of each engine GPU). */
struct osubd_monitor *osubd_monitor_new(const struct osubd_config *cfg, struct osubd_gpus *gpus);

/* The core's osubd_pool_fn (arg: the monitor): NVML's GPUs for "auto" when a driver answers
 * and for "nvml", else a simulated pool ("auto": 8 x 81920 MiB, "sim:POOL"). */
int osubd_monitor_pool(void *arg, const char *gpus, struct osubd_pool *out, char *err,
                       size_t errlen);

/* Once the core has opened the state and its modules loaded, before the writer starts: a new
 * state keeps the GPUs' UUIDs; a state of NVML GPUs needs NVML, and the GPUs it knows that
 * NVML no longer shows are marked lost; then the poll starts (NVML only). act: whose PIDs'
 * memory becomes their services' usage. */
int osubd_monitor_start(struct osubd_monitor *m, struct osubd_core *c, struct osubd_act *act,
                        char *err, size_t errlen);
void osubd_monitor_free(struct osubd_monitor *m);

#endif
