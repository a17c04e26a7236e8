/* deviceplugin.h - the kubelet device plugin (API v1beta1) inside oversubd: advertises
 * oversub.io/vram-mib and answers Allocate for the pods the scheduler extender submitted
 * (docs/deviceplugin.md). gRPC over HTTP/2 over Unix sockets, on the daemon's event loop. */
#ifndef OSUB_DAEMON_DEVICEPLUGIN_H
#define OSUB_DAEMON_DEVICEPLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "actuator.h"
#include "core.h"
#include "gpus.h"

struct osubd_dp;

#define OSUBD_DP_SOCKET "oversub.sock"     /* ours, in the kubelet's folder */
#define OSUBD_DP_KUBELET "kubelet.sock"    /* the kubelet's Registration service */
#define OSUBD_DP_MSG_MAX (4 * 1024 * 1024) /* kubelet's gRPC receive limit (grpc-go default) */

/* The device plugin in cfg.device_plugin's folder (main.c makes one only when it is set): new
 * before the core loads the modules; start, once the core and the actuators run, serves
 * DIR/oversub.sock and registers with DIR/kubelet.sock (again whenever the kubelet restarts).
 * NULL or -1 with a sentence in err. */
struct osubd_dp *osubd_dp_new(struct osubd_core *c, struct osubd_act *act,
                              const struct osubd_gpus *gpus, char *err, size_t errlen);
/* The device plugin as the core's module "device_plugin": the allocations given to the
 * kubelet are loaded from the state and saved in it with the command that made them (an
 * Allocate logs a note); a gone pod's are forgotten; its metrics. */
struct osubd_module osubd_dp_module(struct osubd_dp *dp);
int osubd_dp_start(struct osubd_dp *dp, char *err, size_t errlen);
/* Closes its sockets and connections; pods' segments stay on disk for the next run. Before
 * the core stops. NULL-safe (no plugin: nothing). */
void osubd_dp_stop(struct osubd_dp *dp);
/* The device plugin's series for /metrics (nothing when it is off). */
struct evbuffer;
void osubd_dp_metrics(struct osubd_dp *dp, struct evbuffer *b);

/* What the kubelet can account of oversub.io/vram-mib on this node when the device list is cut
 * to fit its 4 MiB message limit: the MiB advertised; -1 when the plugin is off or the list
 * holds the whole logical capacity. Pod submits past it are refused (osubd_act_pod_fits). */
int64_t osubd_dp_cut_mib(const struct osubd_dp *dp);

/* The ListAndWatch answer for count devices of 1 MiB (the shortest device IDs first), cut to
 * what fits in max bytes: the number of devices it holds, and in *bytes the size of the whole
 * list had it not been cut (either may be NULL). Pure: for the docs' figure and the tests. */
int64_t osubd_dp_list_fit(int64_t count, size_t max, size_t *bytes);

#endif
