/* extender.h - oversub-scheduler: a kube-scheduler extender that asks each node's oversubd */
#ifndef OSUB_K8S_EXTENDER_H
#define OSUB_K8S_EXTENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "kubeapi.h"
#include "pod.h"

#define OSUB_EXT_NODES_MAX 20000

struct osub_ext_config {
    char listen_host[256];
    int listen_port;
    char token_file[512];     /* the nodes' admin token ("" = none) */
    int64_t node_timeout_ms;  /* one oversubd's answer (2000) */
    int64_t cache_ms;         /* a node's decision for a pod is reused this long (10000) */
    int64_t pool_refresh_ms;  /* each node's pool read this often (5000) */
    int64_t nodes_refresh_ms; /* the Node objects read this often (30000) */
    bool kube;                /* use the API server (bind, node discovery) */
    bool kube_nodes;          /* nodes from the Node objects' oversub.io/url annotation */
    struct osub_kube_opts kube_opts;
    struct osub_pod_policy policy;
    bool scheduler_counts_vram; /* kube-scheduler counts oversub.io/vram-mib too (not ignored) */
};

struct osub_ext;

void osub_ext_config_default(struct osub_ext_config *c);

int osub_ext_new(struct event_base *base, const struct osub_ext_config *c, struct osub_ext **out,
                 char *err, size_t errlen);
/* A node and its oversubd's URL (http://HOST:PORT): added, or its URL changed. 0, or -1 with
 * why. */
int osub_ext_node(struct osub_ext *x, const char *name, const char *url, char *why, size_t whylen);
/* Listens and prints "listening on http://HOST:PORT". */
int osub_ext_start(struct osub_ext *x, char *err, size_t errlen);
void osub_ext_free(struct osub_ext *x);

#endif
