/* pods.h - services that are Kubernetes pods: an eviction reaches the pod through the API
 * server's Eviction API (PodDisruptionBudgets honoured, the pod's grace period), and the pod
 * leaving releases the service */
#ifndef OSUB_DAEMON_PODS_H
#define OSUB_DAEMON_PODS_H

#include <stddef.h>

struct osubd;
struct evbuffer;

/* From cfg.kube_api ("auto": the cluster's API server when KUBERNETES_SERVICE_HOST is set, else
 * none; "none"; or a URL). 0, or -1 with a sentence in err. */
int osubd_pods_init(struct osubd *d, char *err, size_t errlen);
void osubd_pods_free(struct osubd *d);

/* A directive for a service (degrade, restore, evict, resume): an eviction of a pod is asked of
 * the API server. */
/* cause: the service it makes room for ("" or NULL: none); a pod's eviction for another pod
 * waits until that pod is bound to this node. */
void osubd_pods_directive(struct osubd *d, const char *id, const char *action, const char *cause);

/* oversub_pod_evictions_total and friends for /metrics. */
void osubd_pods_metrics(struct osubd *d, struct evbuffer *b);

#endif
