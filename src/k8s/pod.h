/* pod.h - a Kubernetes Pod (as kube-scheduler sends it) read as an oversub service spec */
#ifndef OSUB_K8S_POD_H
#define OSUB_K8S_POD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define OSUB_K8S_RESOURCE "oversub.io/vram-mib"

/* How a pod with no oversub.io/class annotation gets its class from spec.priority: at least
 * online_min is online, at least batch_min is batch, below is experiment. */
struct osub_pod_policy {
    int64_t online_min; /* 1000 */
    int64_t batch_min;  /* 0 */
};

void osub_pod_policy_default(struct osub_pod_policy *p);

/* Parses a Kubernetes quantity that must be a whole number ("16384", "16Ki", "2k", "1e3"):
 * 0 with *out, or -1 (fractions, negatives, overflow past 2^53, garbage). */
int osub_k8s_quantity(const char *s, int64_t *out);

/* What the pod asks of oversub: its effective oversub.io/vram-mib (the sum over its containers,
 * or the largest init container's when larger, as Kubernetes counts requests; a container's
 * limit, else its request). Returns 0 (*mib 0: the pod does not ask), or -1 with why. */
int osub_pod_vram(const json_t *pod, int64_t *mib, char *why, size_t whylen);

/* A Kubernetes object name (DNS-1123: lowercase letters, digits, '-', '.'), 1 to max bytes;
 * NULL is none. */
bool osub_k8s_name_ok(const char *s, size_t max);

/* The service id of a pod: "pod-" + its UID. -1 when the UID is not one. */
int osub_pod_service_id(const char *uid, char *out, size_t outlen);

/* The oversub spec for a pod (id, class, vram_mib, gpus, floor, batch sizes, grace, restart
 * cost, queue false, on_evict release, and the "kubernetes" record naming it and node, which
 * may be NULL: added at bind). Annotations: oversub.io/class, oversub.io/gpus,
 * oversub.io/min-vram-mib, oversub.io/batch-size, oversub.io/min-batch-size,
 * oversub.io/grace-seconds (else spec.terminationGracePeriodSeconds, else 30),
 * oversub.io/restart-cost-seconds, oversub.io/exclusive. Returns a new object, or NULL with
 * why (a sentence naming the field). */
json_t *osub_pod_spec(const json_t *pod, const struct osub_pod_policy *pol, const char *node,
                      char *why, size_t whylen);

/* A JSON object's member by a case-insensitive key (kube-scheduler's Go types have no JSON
 * tags: PascalCase is what it writes, and Go's decoder accepts any case). */
json_t *osub_json_get_ci(const json_t *obj, const char *key);

#endif
