/* api_int.h - the API's parts share this (api.h is the way in from outside): its state, held
 * replies, long-polls, and what the parts call of each other */
#ifndef OSUBD_API_INT_H
#define OSUBD_API_INT_H

#include <arpa/inet.h>
#include <dirent.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <sqlite3.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <sys/queue.h>
#include <event2/listener.h>

#include "conns.h"
#include "log.h"
#include "api.h"
#include "jsonmem.h"
#include "deviceplugin.h"
#include "netpolicy.h"
#include "actuator.h"
#include "pods.h"
#include "gateway.h"
#include "oversub/units.h"
#include "spec_json.h"

struct osubd_api {
    struct osubd_core *core;
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    struct osubd_api_deps dep; /* the modules it shows and changes */
    struct osubd_act *act;     /* = dep.act, ... (short names) */
    struct osubd_routes *routes;
    struct osubd_gateway *gw;
    struct osubd_dp *dp;
    const struct osubd_gpus *gpus;
    const struct osubd_destinations *dest;
    struct osubd_self *self;
    struct evhttp *http;                    /* TCP */
    struct evhttp *http_unix;               /* the Unix socket: trusted to run programs */
    struct osubd_conns *conns, *conns_unix; /* connection caps (conns.h) */
    int port;                               /* the TCP port bound */
    bool socket_bound;                      /* the Unix socket is ours to remove at exit */
    struct waiter *waiters;                 /* long-polling GET /v1/events */
    /* replies sent while applied > durable wait here until the commit that covers them */
    struct deferred *deferred_head, *deferred_tail;
    char *pool_text; /* GET /v1/pool's body at pool_text_version */
    size_t pool_text_len;
    uint64_t pool_text_version;
    uint64_t waiters_gone; /* long-polls whose client left before the answer */
    /* metrics */
    uint64_t http_requests[6]; /* by status class 1xx..5xx, index 0 unused */
    uint64_t latency_buckets[12];
    double latency_sum;
    uint64_t latency_count;
};

struct deferred {
    struct deferred *next;
    struct evhttp_request *req;
    int code;
    const char *phrase;
    struct evbuffer *body;
    uint64_t ticket;
};

struct waiter {
    struct waiter *next;
    struct evhttp_request *req;
    struct event *timer;
    struct osubd_client_watch watch; /* freed at once when the client leaves */
    struct evhttp_connection *evcon;
    struct osubd_api *d;
    int64_t since;
};

void osubd__api_count(struct osubd_api *d, int code);

void osubd__api_reply_oom(struct osubd_api *d, struct evhttp_request *req);

void osubd__api_reply_json(struct osubd_api *d, struct evhttp_request *req, int code, json_t *body);

void osubd__api_reply_buf(struct osubd_api *d, struct evhttp_request *req, int code,
                          struct evbuffer *b);

void osubd__api_reply_error(struct osubd_api *d, struct evhttp_request *req, int code,
                            const char *ecode, const char *msg);

void osubd__api_reply_rc(struct osubd_api *d, struct evhttp_request *req, int rc);

json_t *osubd__api_read_body(struct osubd_api *d, struct evhttp_request *req, bool allow_empty);

bool osubd__api_only_fields(struct osubd_api *d, struct evhttp_request *req, json_t *j,
                            const char *const *allowed);

double osubd__api_frac(int64_t a, int64_t b);

json_t *osubd__api_pool_json(struct osubd_api *d);

json_t *osubd__api_service_json(struct osubd_api *d, const struct osubd_caller *who,
                                const char *id);

void osubd__api_h_pool(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m);

void osubd__api_h_services(struct osubd_api *d, const struct osubd_caller *who,
                           struct evhttp_request *req, enum evhttp_cmd_type m, const char *rest,
                           const char *query);

void osubd__api_h_gpu(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m,
                      const char *rest);

void osubd__api_waiter_free(struct osubd_api *d, struct waiter *w);

void osubd__api_events_ready(struct osubd_api *d);

void osubd__api_h_events(struct osubd_api *d, struct evhttp_request *req, const char *query);

void osubd__api_h_static(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m,
                         const unsigned char *body, size_t len, const char *type);

void osubd__api_h_metrics(struct osubd_api *d, struct evhttp_request *req, const char *query);

/* the dashboard page and the OpenAPI description (src/daemon/web/, embedded) */
extern const unsigned char osubd_dashboard_html[], osubd_openapi_json[];
extern const size_t osubd_dashboard_html_len, osubd_openapi_json_len;

/* the API's latency buckets (seconds) */
static const double lat_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                    0.01,   0.025,   0.05,   0.1,   0.5};

#endif
