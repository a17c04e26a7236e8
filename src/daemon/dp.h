/* dp.h - the device plugin's parts share this (deviceplugin.h is the way in from outside): its
 * state, a connection, a call, and what the parts call of each other */
#ifndef OSUBD_DP_H
#define OSUBD_DP_H

#include "deviceplugin.h"
#include "log.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <nghttp2/nghttp2.h>

#include "actuator.h"
#include "pbwire.h"

#define DP_CHECK_MS 500 /* the folder, the capacity and gone pods are checked */
#define DP_LIST_MAX (OSUBD_DP_MSG_MAX - 4096) /* our cut: under kubelet's limit, with room */
#define DP_REQ_MAX (OSUBD_DP_MSG_MAX + 5)     /* a request's body, gRPC prefix included */
#define DP_CONNS_MAX 16
#define DP_STREAMS_MAX 128 /* concurrent calls on one connection (PreStartContainer waits) */
#define DP_WATCHERS_MAX                                                                            \
    8 /* ListAndWatch streams open at once, all connections together: the                          \
       * kubelet keeps one; each may buffer one list (4 MiB) */
#define DP_REG_TIMEOUT_S 10
#define DP_OUT_HIGH (256 * 1024) /* nghttp2 is asked for more frames below this much queued */
#define DP_PARK_MS 100           /* waiting PreStartContainer calls are checked this often */
#define DP_PRESTART_MS 25000     /* ... and answered UNAVAILABLE after (kubelet gives up at 30 s) */
#define DP_SHIM_IN_CTR "/usr/local/lib/oversub/liboversub-cuda.so"
#define DP_SEG_IN_CTR "/var/run/oversub/grant.seg"

enum { /* gRPC status codes */
       GRPC_OK = 0,
       GRPC_INVALID_ARGUMENT = 3,
       GRPC_FAILED_PRECONDITION = 9,
       GRPC_RESOURCE_EXHAUSTED = 8,
       GRPC_UNIMPLEMENTED = 12,
       GRPC_INTERNAL = 13,
       GRPC_UNAVAILABLE = 14,
};

struct dp_conn;

/* One call: its request body as it arrives, its response frames as nghttp2 takes them. */
struct dp_stream {
    struct dp_stream *next;
    struct dp_conn *c;
    int32_t id;
    char path[96];
    bool grpc;      /* content-type application/grpc */
    bool too_big;   /* the body passed DP_REQ_MAX: dropped, answered RESOURCE_EXHAUSTED */
    bool watch;     /* ListAndWatch: open until the connection goes */
    bool ending;    /* trailers follow what out holds */
    bool deferred;  /* nghttp2 waits for out to fill (resume_data) */
    bool parked;    /* PreStartContainer waiting for its pod's service to start */
    bool want_list; /* watch: the list changed while out still held an earlier one; the
                     * latest goes out once that is sent (coalesced: one copy per watcher) */
    int status;     /* gRPC status of the trailers */
    char message[300];
    char park_id[OSUB_ID_MAX + 1]; /* parked: the service, its container, the deadline */
    size_t park_container;
    int64_t park_until_ms; /* engine time */
    struct osubd_pb in;
    struct evbuffer *out;
};

struct dp_conn {
    struct dp_conn *next;
    struct osubd_dp *dp;
    struct bufferevent *bev;
    nghttp2_session *s;
    struct dp_stream *streams;
    bool client;    /* our Register call to the kubelet */
    int reg_status; /* its grpc-status (-1 until the trailers come) */
    char reg_msg[300];
    bool dead; /* closed at the end of the current callback */
};

struct osubd_dp {
    struct osubd_core *core;
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    struct osubd_act *act;         /* pods' records and segments */
    const struct osubd_gpus *gpus; /* each GPU's UUID */
    char dir[512], sock[600], kubelet[600], allocs_path[600];
    struct evconnlistener *lis;
    ino_t sock_ino;
    ino_t kubelet_ino; /* the kubelet.sock we registered with */
    struct dp_conn *conns;
    struct dp_conn *reg; /* the Register call in flight */
    bool registered;
    int64_t next_reg_ms;
    unsigned reg_failures;
    int64_t capacity_mib; /* logical MiB of the usable GPUs */
    int64_t advertised;   /* devices in the list (capacity, or the cut) */
    struct osubd_pb list; /* the ListAndWatchResponse, gRPC-framed */
    struct event *check_ev;
    bool dirty;        /* allocated changed since the state saved it */
    json_t *allocated; /* service id -> [{container, devices, n}, ...] given to the kubelet
                        * (devices: the ID set's fingerprint, dp_id_hash; a bare index before) */
    bool cut_said;
    char shim[700];           /* the shim pods mount: its copy in the state's folder ("" none) */
    int64_t prestart_ms;      /* a waiting PreStartContainer is answered UNAVAILABLE after this */
    struct event *park_ev;    /* re-checks the parked PreStartContainer calls */
    uint64_t lists_coalesced; /* list changes a slow watcher skipped (it gets the latest) */
    uint64_t watch_refused;   /* ListAndWatch calls beyond DP_WATCHERS_MAX */
};

size_t osubd__dp_id(uint64_t i, char out[16]);

void osubd__dp_grpc_prefix(struct osubd_pb *b, size_t len);

void osubd__dp_conn_close(struct dp_conn *c);

bool osubd__dp_conn_flush(struct dp_conn *c);

nghttp2_nv osubd__dp_nv(const char *name, const char *value);

ssize_t osubd__dp_read_req(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len,
                           uint32_t *flags, nghttp2_data_source *src, void *user);

void osubd__dp_answer_error(struct dp_stream *st, int status, const char *fmt, ...);

void osubd__dp_answer(struct dp_stream *st, const struct osubd_pb *msg, bool watch);

void osubd__dp_answer_empty(struct dp_stream *st);

int osubd__dp_request_message(struct dp_stream *st, struct osubd_pb_reader *r);

void osubd__dp_call_options(struct dp_stream *st, struct osubd_pb_reader *r);

void osubd__dp_call_watch(struct dp_stream *st, struct osubd_pb_reader *r);

void osubd__dp_call_preferred(struct dp_stream *st, struct osubd_pb_reader *r);

void osubd__dp_on_park(evutil_socket_t fd, short what, void *arg);

void osubd__dp_dispatch(struct dp_stream *st);

struct dp_conn *osubd__dp_conn_new(struct osubd_dp *dp, struct bufferevent *bev, bool client);

void osubd__dp_on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                         int salen, void *arg);

void osubd__dp_reg_done(struct osubd_dp *dp, struct dp_conn *c, const char *why);

#endif
