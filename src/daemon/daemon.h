/* daemon.h - oversubd: the engine behind one event loop, its durable state, its HTTP API */
#ifndef OSUB_DAEMON_H
#define OSUB_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

#include "selfaddr.h"
#include "oversub/engine.h"
#include "idmap.h"
#include "routes.h"
#include "store.h"

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
    int64_t events_days; /* 0: no age limit */
    char nvml_lib[512];  /* "" = libnvidia-ml.so.1 or $OSUB_NVML_LIB */
    char cuda_shim[512]; /* liboversub-cuda.so: "" = next to oversubd, "none" = never preload */
    char cgroup[512];    /* "" or "auto": a cgroup v2 folder per service; "none"; or a folder */
    char allowed_destinations[1024]; /* where webhooks and the gateway may connect: CIDRs, names */
    char api_hostnames[512]; /* names the API may be reached by (Host), besides its addresses */
    int64_t poll_ms;
    bool metrics_per_service; /* per-service series on /metrics (cardinality: opt-in) */
    char gateway_host[256];   /* "" = no gateway */
    int gateway_port;
    int32_t gateway_conns_per_client; /* connections one client address may hold (256) */
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

struct waiter;   /* a long-polling GET /v1/events */
struct deferred; /* a reply held until the writer made its command durable */
struct osubd__writer;
struct osub_gateway;
struct osubd__nvml;
struct osubd_act;    /* the actuators: processes, PIDs, directives (actuator.c) */
struct osubd_routes; /* the gateway's per-service settings (routes.c) */
struct osubd_dp;     /* the kubelet device plugin (deviceplugin.c) */

struct osubd {
    struct osubd_config cfg;
    struct event_base *base;
    struct evhttp *http;
    struct event *tick_ev, *sigint_ev, *sigterm_ev, *sighup_ev, *poll_ev;
    struct event *drain_ev; /* while stopping gracefully: checks the gateway has drained */
    int64_t drain_until_ms; /* engine time the grace ends */
    struct osubd__nvml *nvml; /* NULL: a simulated pool */
    char uuids[OSUBD_NVML_GPUS_MAX][96]; /* per engine GPU (NVML), "" when simulated */
    int32_t n_uuids;
    osub_engine_t *e;
    osubd__store_t *store;
    int lock_fd;             /* STATE.lock, flock'ed while we run (-1: none) */
    bool socket_bound;       /* the Unix socket is ours to remove at exit */
    int64_t base_unix_ms;    /* engine time 0, on the wall clock (timestamps shown) */
    int64_t engine_start_ms; /* engine time when this run started ... */
    int64_t mono_start_ms;   /* ... and the monotonic clock then: engine time never jumps */
    int64_t last_engine_ms;
    int64_t tick_at; /* engine time of the next tick (INT64_MAX: none set) */
    int64_t since_snapshot;
    int64_t last_seq;
    int64_t last_event_seq;
    struct waiter *waiters;
    /* group commit: commands handed to the writer (applied) and on disk (durable); replies
     * sent while applied > durable wait in deferred until the commit that covers them */
    struct osubd__writer *writer;
    struct event *writer_ev;
    uint64_t applied_ticket, durable_ticket;
    struct deferred *deferred_head, *deferred_tail;
    uint64_t commits, commit_items;
    struct osubd_routes *routes; /* each service's gateway settings (routes.c) */
    struct osub_gateway *gw;     /* the gateway's listener and connections (gateway.c) */
    uint8_t service_key[32];     /* per-service tokens: HMAC-SHA256(key, id) */
    uint64_t state_version;      /* counts the commands applied: cached answers key on it */
    char *pool_text;             /* GET /v1/pool's body at pool_text_version */
    size_t pool_text_len;
    uint64_t pool_text_version;
    bool fatal;
    bool existing; /* the state was not new at start */
    int marker_fd; /* STATE.marker (-1: none) */
    char state_id[17];
    bool store_full;                        /* the state's disk is full: mutations refused (507) */
    uint64_t store_full_count;              /* times it filled */
    uint64_t waiters_gone;                  /* long-polls whose client left before the answer */
    struct osubd_conns *conns, *conns_unix; /* the API's connection caps (conns.h) */
    struct evhttp *http_unix;        /* the API on the Unix socket: trusted to run programs */
    bool req_trusted;                /* the request being handled came over the Unix socket */
    struct osubd_destinations *dest; /* allowed_destinations, parsed */
    struct osubd_self self;          /* the addresses the API and the gateway listen on */
    bool req_admin;                  /* ... or carries the admin token, or no token is configured */
    struct osubd_act *act;           /* the actuators' own state (actuator.c) */
    struct osubd_pods *pods;         /* pods evicted through the API server (pods.c) */
    struct osubd_dp *dp;             /* the device plugin, NULL when off (deviceplugin.c) */
    /* metrics */
    uint64_t http_requests[6]; /* by status class 1xx..5xx, index 0 unused */
    uint64_t latency_buckets[12];
    double latency_sum;
    uint64_t latency_count;
    uint64_t ev_counts[OSUB_EV__COUNT][4]; /* by kind and level (3 = none) */
};

void osubd_config_default(struct osubd_config *c);

/* Opens the store, restores the engine (snapshot + replay) or creates it, listens. Returns 0
 * or -1 with a sentence in err. */
int osubd_start(struct osubd *d, char *err, size_t errlen);
void osubd_stop(struct osubd *d);

/* Applies a command at the current engine time and logs it with its events: before returning
 * (no writer yet, at start-up), or through the writer, in which case every reply is held until
 * the command is durable. Timers due by now run first, as a tick command of their own. Wakes
 * long-polls once the events are on disk. Returns the engine's code; a malformed command
 * (err set) and a dry run reach no state and are not logged. */
int osubd_apply(struct osubd *d, json_t *cmd, osub_submit_result_t *res, char *err, size_t errlen);
/* The same, for a command that staged records in the modules (a submit's route and exec, a
 * ready's PID): commit(d, rc, res, arg) runs once the engine has decided (rc, res) and before
 * the command is logged: it keeps the records when the engine accepted, drops them otherwise,
 * and what it keeps is saved with the command. Not called for malformed commands or dry runs. */
typedef void (*osubd_commit_fn)(struct osubd *d, int rc, const osub_submit_result_t *res,
                                void *arg);
int osubd_apply_with(struct osubd *d, json_t *cmd, osub_submit_result_t *res, char *err,
                     size_t errlen, osubd_commit_fn commit, void *arg);

/*
 * Out of memory, one rule: before a command reaches the engine, the request gets 500
 * out_of_memory and nothing changed; once the engine has decided (an event to record, a record
 * to keep, an action to queue, the log to write), oversubd stops through osubd_fatal(): the
 * state on disk is the truth, and a restart replays it and repeats the outstanding directives.
 */
void osubd_fatal(struct osubd *d, const char *what);

/* Logs an event of the daemon's own (kind, e.g. "process"; reason, e.g. "exit") for a service,
 * with a "note" command that the engine ignores, and prints it. */
void osubd_note(struct osubd *d, const char *id, const char *kind, const char *reason,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Sets meta[key] to value's JSON text. */
void osubd_meta_put(json_t *meta, const char *key, const json_t *value);

/* The token a service's own calls (usage, ready, ack, exited) may carry instead of the admin
 * token: 64 hex digits. */
void osubd_marker_write(int fd, const char *id, int64_t seq);
void osubd_service_token(const struct osubd *d, const char *id, char out[65]);

/* Reads an admin token from a file (whitespace around it dropped): 0, or -1 with err. */
int osubd_read_token(const char *path, char *out, size_t outlen, char *err, size_t errlen);

/* The wall clock (Unix ms): only for what is about the calendar (ages of events, a seed). */
int64_t osubd_unix_ms(void);
/* Engine time now: monotonic within a run. osubd_now(): the same as Unix ms (base + engine
 * time): what deadlines are compared with. */
int64_t osubd_engine_now(const struct osubd *d);
int64_t osubd_now(const struct osubd *d);
int64_t osubd_engine_to_unix(const struct osubd *d, int64_t engine_ms);

/* api.c */
int osubd_api_init(struct osubd *d, char *err, size_t errlen);
/* The disk filled: replies held for commands not yet durable go out now (a mutation's as 503
 * "applied, not yet durable"), and nothing is held until it has room again. */
void osubd_api_release_held(struct osubd *d);
void osubd_api_events_ready(struct osubd *d);
/* The port a bound socket got (port 0: the one the OS picked). */
int osubd_bound_port(struct evhttp_bound_socket *h);
/* Sends the held replies whose commands are now durable. */
void osubd_api_flush(struct osubd *d);

#endif
