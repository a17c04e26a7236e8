/* extender_internal.h - what oversub-scheduler's files share (extender.c: the calls, HTTP and
 * life; extender_nodes.c: nodes and requests to them; extender_verbs.c: dry runs and the
 * filter, prioritize and preempt answers; extender_bind.c: bind); nothing else includes it */
#ifndef OSUB_K8S_EXTENDER_INTERNAL_H
#define OSUB_K8S_EXTENDER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/http.h>
#include <jansson.h>

#include "extender.h"

#define LAT_BUCKETS 12

enum verb { V_FILTER, V_PRIORITIZE, V_PREEMPT, V_BIND, V__COUNT };

struct node {
    char name[254];
    char url[512];
    char host[256];
    int port;
    struct evhttp_connection *conn; /* keep-alive, to its oversubd */
    json_t *pool;                   /* the last GET /v1/pool (NULL: none yet) */
    int64_t pool_at_ms;             /* when it came */
    char pool_err[256];             /* the last refresh's failure, "" when it answered */
    int64_t pool_err_ms;            /* when that failure came */
    bool pool_busy;
    bool from_api, seen; /* found through a Node object; seen in the last listing */
    bool gone;           /* dropped from the listing: kept while requests fly */
    int inflight;        /* requests sent and not yet answered */
    uint64_t gen;        /* bumped by each bind to it: decisions cached before are stale */
};

#define NODE_INFLIGHT_MAX 8 /* more outstanding on one node: it is not keeping up */
#define BIND_BUDGET_MS 4500 /* a bind answers inside kube-scheduler's 5 s */

struct node_req;

struct osub_ext {
    struct osub_ext_config cfg;
    struct event_base *base;
    struct evhttp *http;
    struct node **nodes;
    size_t n_nodes, cap_nodes;
    json_t *by_name;   /* node name -> index */
    json_t *decisions; /* "uid node" -> {"d": decision, "at", "spec"} */
    struct osub_kube *kube;
    struct node_req *reqs; /* every request to a node not yet answered */
    char token[512];
    struct event *pool_ev, *nodes_ev, *sweep_ev;
    bool nodes_listing;
    char nodes_err[256];
    /* metrics */
    uint64_t calls[V__COUNT], errors[V__COUNT];
    uint64_t lat[V__COUNT][LAT_BUCKETS + 1];
    double lat_sum[V__COUNT];
    uint64_t node_asks, node_cached, node_failures;
    uint64_t accept_refused; /* connections not accepted for want of descriptors */
    uint64_t binds_ok, binds_failed, releases, preempt_degrade_only;
};

/* One request to a node's oversubd; cb(arg, code, body JSON or NULL, why) once. */
typedef void (*node_cb)(void *arg, int code, json_t *body, const char *why);
struct node_req {
    struct osub_ext *x;
    struct node *n;
    node_cb cb;
    void *arg;
    struct evhttp_request *req;
    struct event *deadline; /* the whole answer within node_timeout_ms, however it trickles */
    struct node_req *prev, *next;
    bool sending;     /* inside evhttp_make_request: a callback now is a synchronous failure */
    bool failed_sync; /* ... which node_send reports itself (-1); the caller's cb is not run */
};

/* One verb's call: kube-scheduler's request, what the nodes answered, the bind's progress. */
struct call {
    struct osub_ext *x;
    struct evhttp_request *req;
    enum verb verb;
    double started;
    json_t *args;  /* the request */
    json_t *pod;   /* borrowed from args */
    json_t *spec;  /* oversub's spec for the pod, NULL when it asks for nothing */
    char uid[128]; /* the pod's */
    char pod_name[320];
    json_t *names;   /* the nodes asked about, in order */
    json_t *answers; /* node -> decision, or {"error": why} */
    json_t *held;    /* preempt: node -> the pod UIDs its oversubd holds */
    size_t waiting;
    char bad_pod[400]; /* why the pod cannot be read ("" when it can) */
    /* bind */
    char bind_node[254], bind_ns[64], bind_name[254];
    json_t *bind_decision;
    bool bind_created; /* this bind's submit made the service (a failure releases only that) */
};

/* ---- extender.c ------------------------------------------------------------------------- */

int64_t osub__ext_mono_ms(void);
double osub__ext_mono_s(void);
/* One line on stderr. */
void osub__ext_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void osub__ext_call_free(struct call *c);
/* Answers the call with body (taken; dropped when kube-scheduler has gone), counts it and frees
 * the call. */
void osub__ext_call_done(struct call *c, int code, json_t *body);

/* ---- extender_nodes.c ------------------------------------------------------------------- */

/* The node of that name, NULL if none (or dropped from the listing). Borrowed. */
struct node *osub__ext_node_get(struct osub_ext *x, const char *name);
/* Sends a request (body borrowed, may be NULL) to n's oversubd: cb runs once, with code 0 and
 * why when it fails or times out, -1 when the extender stops. Returns 0; -2 when the node has
 * NODE_INFLIGHT_MAX outstanding, -1 when it could not be sent (then cb never runs). */
int osub__ext_node_send(struct osub_ext *x, struct node *n, enum evhttp_cmd_type m,
                        const char *path, const char *body, node_cb cb, void *arg);
/* Unlinks and frees a request to a node (its callback is the caller's to run). */
void osub__ext_node_req_done(struct node_req *nr);
/* Timers: each node's GET /v1/pool; the Node objects from the API server. */
void osub__ext_pool_tick(evutil_socket_t fd, short what, void *arg);
void osub__ext_nodes_tick(evutil_socket_t fd, short what, void *arg);

/* ---- extender_verbs.c ------------------------------------------------------------------- */

/* Timer: drops the cached decisions older than cache_ms. */
void osub__ext_sweep_tick(evutil_socket_t fd, short what, void *arg);
/* Asks each node of the call for a dry run of the pod (cached answers reused), then finishes. */
void osub__ext_ask_nodes(struct call *c);
/* Answers a filter, prioritize or preempt call from what the nodes said. */
void osub__ext_finish(struct call *c);
/* 1: the pod starts there (or after victims); 0: it does not, and preemption of lower-priority
 * pods might help; -1: it does not, and nothing kube-scheduler may do helps. why: the node's
 * own reason. */
int osub__ext_verdict(const json_t *d, char *why, size_t whylen);
/* A preempt call's victims per node (borrowed from args), NULL if it has none. */
json_t *osub__ext_victim_map(const json_t *args);

/* ---- extender_bind.c -------------------------------------------------------------------- */

/* A bind call: the pod checked with the API server, its grant reserved on the node, then the
 * Binding; answered (and freed) when done. */
void osub__ext_bind(struct call *c);

#endif
