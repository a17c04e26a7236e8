/* deviceplugin.h - the kubelet device plugin (API v1beta1) inside oversubd: advertises
 * oversub.io/vram-mib and answers Allocate for the pods the scheduler extender submitted
 * (docs/deviceplugin.md). gRPC over HTTP/2 over Unix sockets, on the daemon's event loop. */
#ifndef OSUB_DAEMON_DEVICEPLUGIN_H
#define OSUB_DAEMON_DEVICEPLUGIN_H

#include <stddef.h>
#include <stdint.h>

struct osubd;

#define OSUBD_DP_RESOURCE "oversub.io/vram-mib"
#define OSUBD_DP_SOCKET "oversub.sock"     /* ours, in the kubelet's folder */
#define OSUBD_DP_KUBELET "kubelet.sock"    /* the kubelet's Registration service */
#define OSUBD_DP_MSG_MAX (4 * 1024 * 1024) /* kubelet's gRPC receive limit (grpc-go default) */

/* Starts the device plugin when d->cfg.device_plugin names a folder: serves DIR/oversub.sock
 * and registers with DIR/kubelet.sock (again whenever the kubelet restarts). Needs the loop,
 * the engine and the actuators (after osubd_start). 0, or -1 with a sentence in err. */
int osubd_dp_start(struct osubd *d, char *err, size_t errlen);
/* Closes its sockets and connections; pods' segments stay on disk for the next run. Before
 * osubd_stop(). NULL-safe (no plugin: nothing). */
void osubd_dp_stop(struct osubd *d);
/* The device plugin's series for /metrics (nothing when it is off). */
struct evbuffer;
void osubd_dp_metrics(struct osubd *d, struct evbuffer *b);

/* What the kubelet can account of oversub.io/vram-mib on this node when the device list is cut
 * to fit its 4 MiB message limit: the MiB advertised; -1 when the plugin is off or the list
 * holds the whole logical capacity. Pod submits past it are refused (osubd_act_pod_fits). */
int64_t osubd_dp_cut_mib(const struct osubd *d);

/* The ListAndWatch answer for count devices of 1 MiB (the shortest device IDs first), cut to
 * what fits in max bytes: the number of devices it holds, and in *bytes the size of the whole
 * list had it not been cut (either may be NULL). Pure: for the docs' figure and the tests. */
int64_t osubd_dp_list_fit(int64_t count, size_t max, size_t *bytes);

#endif
