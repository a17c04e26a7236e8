/* pods.h - services that are Kubernetes pods: an eviction reaches the pod through the API
 * server's Eviction API (PodDisruptionBudgets honoured, the pod's grace period), and the pod
 * leaving releases the service */
#ifndef OSUB_DAEMON_PODS_H
#define OSUB_DAEMON_PODS_H

#include <stddef.h>

#include "actuator.h"
#include "core.h"

struct osubd_pods;
struct evbuffer;

/* From cfg.kube_api ("auto": the cluster's API server when KUBERNETES_SERVICE_HOST is set, else
 * none; "none"; or a URL). 0, or -1 with a sentence in err. */
struct osubd_pods *osubd_pods_new(struct osubd_core *c, struct osubd_act *act, char *err,
                                  size_t errlen);
void osubd_pods_free(struct osubd_pods *p);
/* The pods as the core's module "pods" (their metrics); they listen to the actuators'
 * directives (osubd_act_listen). */
struct osubd_module osubd_pods_module(struct osubd_pods *p);

/* A directive for a service (degrade, restore, evict, resume): an eviction of a pod is asked of
 * the API server. */
/* cause: the service it makes room for ("" or NULL: none); a pod's eviction for another pod
 * waits until that pod is bound to this node. */
void osubd_pods_directive(struct osubd_pods *p, const char *id, const char *action,
                          const char *cause);

/* oversub_pod_evictions_total and friends for /metrics. */
void osubd_pods_metrics(struct osubd_pods *p, struct evbuffer *b);

#endif
