/* kubeapi.h - a client of the Kubernetes API server for an event loop: requests are made with
 * libcurl on worker threads (one keep-alive connection each: a slow answer holds up only its
 * own) and each answer is handed back on the loop */
#ifndef OSUB_K8S_KUBEAPI_H
#define OSUB_K8S_KUBEAPI_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/event.h>

struct osub_kube;

struct osub_kube_opts {
    char api[512];        /* https://HOST:PORT ("" = in-cluster: $KUBERNETES_SERVICE_HOST/PORT) */
    char token_file[512]; /* read before each request (service-account tokens rotate); "" = none */
    char ca_file[512];    /* "" = the system's CAs */
    long timeout_ms;      /* per request (10000) */
    int workers;          /* requests made at once, each on its own thread and connection (4) */
};

/* The in-cluster defaults: the service account's token and CA, the API from the environment. */
void osub_kube_opts_default(struct osub_kube_opts *o);

int osub_kube_new(struct event_base *base, const struct osub_kube_opts *o, struct osub_kube **out,
                  char *err, size_t errlen);
void osub_kube_free(struct osub_kube *k);
const char *osub_kube_api(const struct osub_kube *k);

/* The answer, on the loop: status 0 when no HTTP answer came (error says why), -1 when the
 * client is being freed (only free arg then); body NUL-terminated (may be empty). */
typedef void (*osub_kube_cb)(void *arg, long status, const char *body, size_t len,
                             const char *error);

/* method GET/POST/DELETE/PATCH, path from the API's root ("/api/v1/..."), body JSON or NULL.
 * Returns 0 (cb is called exactly once, later), or -1 (out of memory: cb is not called). */
int osub_kube_request(struct osub_kube *k, const char *method, const char *path, const char *body,
                      osub_kube_cb cb, void *arg);

/* The same, within timeout_ms (at most the client's own; 0: the client's). */
int osub_kube_request_within(struct osub_kube *k, const char *method, const char *path,
                             const char *body, long timeout_ms, osub_kube_cb cb, void *arg);

/* Requests sent and answers by class (0: none, 2: 2xx, 4: 4xx, 5: 5xx). */
void osub_kube_counts(const struct osub_kube *k, unsigned long counts[6]);

#endif
