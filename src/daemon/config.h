/* config.h - oversubd's settings (oversub.yaml, flags): read by main.c, read-only after */
#ifndef OSUBD_CONFIG_H
#define OSUBD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "oversub/engine.h"

#define OSUBD_NVML_GPUS_MAX 64     /* GPUs of one machine read from NVML */
#define OSUBD_BODY_MAX (64 * 1024) /* an API request's body (the gateway has its own limit) */

struct osubd_config {
    char listen_host[256];
    int listen_port;
    char socket_path[512]; /* "" = no Unix socket */
    bool socket_set;       /* given; else oversub.sock next to the state */
    char state_path[512];
    char gpus[512]; /* auto | sim:8x81920 */
    int32_t ratio_milli;
    char token[256];           /* "" = none */
    char token_file[512];      /* where the token was read from: read again on SIGHUP */
    int64_t shutdown_grace_ms; /* SIGTERM: in-flight gateway requests may finish this long */
    int64_t tick_ms;
    int64_t snapshot_every; /* commands between snapshots */
    int64_t events_keep;
    int64_t events_days;    /* 0: no age limit */
    char nvml_lib[512];     /* "" = libnvidia-ml.so.1 or $OSUB_NVML_LIB */
    char cuda_shim[512];    /* liboversub-cuda.so: "" = next to oversubd, "none" = never preload */
    char cuda_lib[512];     /* the CUDA driver the cuda suspend method loads: "" = libcuda.so.1 */
    bool suspend_host_auto; /* suspend_host_mib not given: half the host's memory under NVML,
                               0 (suspend off) on a simulated pool (a new state's setting) */
    char cgroup[512];       /* "" or "auto": a cgroup v2 folder per service; "none"; or a folder */
    char allowed_destinations[1024]; /* where webhooks and the gateway may connect: CIDRs, names */
    char api_hostnames[512]; /* names the API may be reached by (Host), besides its addresses */
    int64_t poll_ms;
    bool metrics_per_service; /* per-service series on /metrics (cardinality: opt-in) */
    char gateway_host[256];   /* "" = no gateway */
    int gateway_port;
    int32_t gateway_conns_per_client; /* connections one client address may hold (256) */
    bool gateway_accept_at_once;      /* gateway_defer_accept: false (by default the gateway's
                                       * connections are accepted once their first bytes are in) */
    int32_t api_conns_per_client;     /* the API's TCP connections one address may hold (64) */
    int32_t api_conns_max;            /* the API's TCP connections in all (1024) */
    char gateway_access_log[512];     /* "" = none; else one JSON line per request */
    bool new_state;                   /* --new-state: start although the marker disagrees */
    bool allow_root_services;         /* managed commands may run as root */
    int64_t service_log_max;          /* bytes per service log before it is rotated */
    char device_plugin[512];   /* the kubelet's device-plugin folder: "" = no device plugin */
    char kube_api[512];        /* auto | none | https://HOST:PORT (pods.c) */
    char kube_token_file[512]; /* "" = the service account's */
    char kube_ca_file[512];    /* "" = the service account's */
    char kube_node[254];       /* this node's name ("" = $NODE_NAME, else unchecked) */
    osub_pool_config_t engine; /* timings and watermarks of a new state */
};

void osubd_config_default(struct osubd_config *c);

/* Reads an admin token from a file (whitespace around it dropped): 0, or -1 with err. */
int osubd_read_token(const char *path, char *out, size_t outlen, char *err, size_t errlen);

/* The wall clock (Unix ms): only for what is about the calendar (ages of events, a seed). */
int64_t osubd_unix_ms(void);

#endif
