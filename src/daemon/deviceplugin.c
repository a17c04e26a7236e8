/* deviceplugin.c - the kubelet device plugin (v1beta1) in oversubd: gRPC over HTTP/2 (nghttp2)
 * on the daemon's loop, the messages encoded by hand (pbwire.h) */
#define _GNU_SOURCE
#include "deviceplugin.h"
#include "log.h"

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
    struct osubd_act *act;          /* pods' records and segments */
    const struct osubd_gpus *gpus;  /* each GPU's UUID */
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
    json_t *allocated; /* service id -> [{container, devices, n}, ...] given to the kubelet
                        * (devices: the ID set's fingerprint, dp_id_hash; a bare index before) */
    bool cut_said;
    char shim[700];           /* the shim pods mount: its copy in the state's folder ("" none) */
    int64_t prestart_ms;      /* a waiting PreStartContainer is answered UNAVAILABLE after this */
    struct event *park_ev;    /* re-checks the parked PreStartContainer calls */
    uint64_t lists_coalesced; /* list changes a slow watcher skipped (it gets the latest) */
    uint64_t watch_refused;   /* ListAndWatch calls beyond DP_WATCHERS_MAX */
};

/* ---- the device list -------------------------------------------------------------------- */

static const char dp_alpha[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/* Device i's ID: the 62 one-character IDs, then the 3844 of two, ... (shortest first). */
static size_t dp_id(uint64_t i, char out[16])
{
    size_t len = 1;
    uint64_t span = 62;
    while (i >= span) {
        i -= span;
        span *= 62;
        len++;
    }
    for (size_t k = len; k-- > 0;) {
        out[k] = dp_alpha[i % 62];
        i /= 62;
    }
    out[len] = '\0';
    return len;
}

/* Bytes device i takes in ListAndWatchResponse.devices: tag, length, {ID, health}. */
static size_t dp_entry_len(uint64_t i)
{
    char id[16];
    size_t inner = 2 + dp_id(i, id) + 2 + 7; /* ID = 1, health = 2 ("Healthy") */
    return 1 + osubd_pb_varint_len(inner) + inner;
}

int64_t osubd_dp_list_fit(int64_t count, size_t max, size_t *bytes)
{
    size_t total = 0;
    int64_t fit = -1;
    for (int64_t i = 0; i < count; i++) {
        size_t e = dp_entry_len((uint64_t)i);
        if (fit < 0 && total + e > max)
            fit = i;
        total += e;
    }
    if (bytes != NULL)
        *bytes = total;
    return fit < 0 ? count : fit;
}

/* The usable logical capacity: GPUs neither lost nor cordoned. */
static int dp_open(struct osubd_dp *dp, char *err, size_t errlen);

static int64_t dp_capacity(struct osubd_dp *d)
{
    int64_t mib = 0;
    size_t n = osub_engine_gpu_count(d->e);
    for (size_t g = 0; g < n; g++) {
        osub_gpu_info_t gi;
        if (osub_engine_gpu_info(d->e, (int32_t)g, &gi) == 0 && !gi.lost && !gi.cordoned)
            mib += gi.logical_mib;
    }
    return mib;
}

static void grpc_prefix(struct osubd_pb *b, size_t len)
{
    uint8_t h[5] = {0, (uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
                    (uint8_t)len};
    osubd_pb_raw(b, h, sizeof(h));
}

/* Rebuilds dp->list for the capacity now: 0, or -1 out of memory (the old list stays). */
static int dp_build_list(struct osubd_dp *dp, int64_t capacity)
{
    size_t full;
    int64_t n = osubd_dp_list_fit(capacity, DP_LIST_MAX, &full);
    if (n < capacity && !dp->cut_said) {
        osubd_log(OSUBD_LOG_INFO, "device plugin: %lld MiB of logical capacity would be a ListAndWatch "
                "message of %zu bytes, over the kubelet's %d: advertising %lld MiB "
                "(docs/deviceplugin.md)",
                (long long)capacity, full, OSUBD_DP_MSG_MAX, (long long)n);
        dp->cut_said = true;
    }
    struct osubd_pb b;
    osubd_pb_init(&b, DP_LIST_MAX + 5);
    size_t body = 0;
    for (int64_t i = 0; i < n; i++)
        body += dp_entry_len((uint64_t)i);
    grpc_prefix(&b, body);
    for (int64_t i = 0; i < n; i++) {
        char id[16];
        size_t l = dp_id((uint64_t)i, id);
        size_t inner = 2 + l + 2 + 7;
        osubd_pb_varint(&b, 1 << 3 | 2);
        osubd_pb_varint(&b, inner);
        osubd_pb_bytes(&b, 1, id, l);
        osubd_pb_bytes(&b, 2, "Healthy", 7);
    }
    if (b.failed) {
        osubd_pb_free(&b);
        return -1;
    }
    osubd_pb_free(&dp->list);
    dp->list = b;
    dp->capacity_mib = capacity;
    dp->advertised = n;
    return 0;
}

/* ---- connections ------------------------------------------------------------------------ */

static void reg_done(struct osubd_dp *dp, struct dp_conn *c, const char *why);

static void conn_close(struct dp_conn *c)
{
    struct osubd_dp *dp = c->dp;
    for (struct dp_conn **pp = &dp->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    if (dp->reg == c)
        dp->reg = NULL;
    if (c->s != NULL)
        nghttp2_session_del(c->s); /* closes its streams: on_stream_close frees them */
    while (c->streams != NULL) {
        struct dp_stream *st = c->streams;
        c->streams = st->next;
        osubd_pb_free(&st->in);
        if (st->out)
            evbuffer_free(st->out);
        free(st);
    }
    if (c->bev)
        bufferevent_free(c->bev);
    free(c);
}

/* Hands nghttp2's frames to the socket, up to DP_OUT_HIGH queued; closes the connection when
 * neither side has more to say. false when it was closed. */
static bool conn_flush(struct dp_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    while (!c->dead && evbuffer_get_length(out) < DP_OUT_HIGH) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->s, &data);
        if (n < 0 || (n > 0 && evbuffer_add(out, data, (size_t)n) != 0)) {
            c->dead = true;
            break;
        }
        if (n == 0)
            break;
    }
    if (!c->dead && !nghttp2_session_want_read(c->s) && !nghttp2_session_want_write(c->s) &&
        evbuffer_get_length(out) == 0)
        c->dead = true;
    if (c->dead) {
        if (c->client)
            reg_done(c->dp, c, "the connection ended without an answer"); /* if none came */
        conn_close(c);
        return false;
    }
    return true;
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct dp_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len = evbuffer_get_length(in);
    unsigned char *data = evbuffer_pullup(in, -1);
    if (len > 0 && data == NULL) {
        c->dead = true;
    } else if (len > 0) {
        ssize_t n = nghttp2_session_mem_recv(c->s, data, len);
        if (n < 0) {
            if (c->client)
                reg_done(c->dp, c, nghttp2_strerror((int)n));
            c->dead = true;
        } else {
            evbuffer_drain(in, (size_t)n);
        }
    }
    conn_flush(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    (void)bev;
    conn_flush(arg);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct dp_conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        conn_flush(c);
        return;
    }
    if (c->client) {
        char why[200];
        snprintf(why, sizeof(why), "%s",
                 what & BEV_EVENT_TIMEOUT ? "no answer in time"
                 : what & BEV_EVENT_EOF   ? "the kubelet closed the connection"
                                          : strerror(EVUTIL_SOCKET_ERROR()));
        reg_done(c->dp, c, why);
    }
    c->dead = true;
    conn_flush(c);
}

static nghttp2_nv nv(const char *name, const char *value)
{
    nghttp2_nv v = {(uint8_t *)(uintptr_t)name, (uint8_t *)(uintptr_t)value, strlen(name),
                    strlen(value), NGHTTP2_NV_FLAG_NONE};
    return v;
}

/* grpc-message is percent-encoded (gRPC over HTTP/2): '%' and what is not printable ASCII. */
static void pct_encode(const char *s, char *out, size_t outlen)
{
    size_t o = 0;
    for (; *s && o + 4 < outlen; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch > 0x7e || ch == '%')
            o += (size_t)snprintf(out + o, outlen - o, "%%%02X", ch);
        else
            out[o++] = (char)ch;
    }
    out[o] = '\0';
}

/* ---- the server: calls and their answers -------------------------------------------------- */

static ssize_t read_out(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len, uint32_t *flags,
                        nghttp2_data_source *src, void *user)
{
    (void)user;
    struct dp_stream *st = src->ptr;
    if (st->want_list && evbuffer_get_length(st->out) == 0) {
        /* what it had is sent: the latest list now */
        st->want_list = false;
        if (evbuffer_add(st->out, st->c->dp->list.p, st->c->dp->list.len) != 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    size_t n = (size_t)evbuffer_remove(st->out, buf, len);
    if (evbuffer_get_length(st->out) > 0 || st->want_list)
        return (ssize_t)n;
    if (!st->ending) {
        if (n > 0)
            return (ssize_t)n;
        st->deferred = true;
        return NGHTTP2_ERR_DEFERRED;
    }
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    char code[16], msg[sizeof(st->message) * 3 + 1];
    snprintf(code, sizeof(code), "%d", st->status);
    pct_encode(st->message, msg, sizeof(msg));
    nghttp2_nv t[2] = {nv("grpc-status", code), nv("grpc-message", msg)};
    if (nghttp2_submit_trailer(s, sid, t, st->message[0] ? 2 : 1) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return (ssize_t)n;
}

/* A request's body (our Register call): all of out, then END_STREAM. */
static ssize_t read_req(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len, uint32_t *flags,
                        nghttp2_data_source *src, void *user)
{
    (void)s;
    (void)sid;
    (void)user;
    struct dp_stream *st = src->ptr;
    size_t n = (size_t)evbuffer_remove(st->out, buf, len);
    if (evbuffer_get_length(st->out) == 0)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* An error with no data: the status in the headers, the stream ended (trailers-only). */
static void answer_error(struct dp_stream *st, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void answer_error(struct dp_stream *st, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof(st->message), fmt, ap);
    va_end(ap);
    char code[16], msg[sizeof(st->message) * 3 + 1];
    snprintf(code, sizeof(code), "%d", status);
    pct_encode(st->message, msg, sizeof(msg));
    nghttp2_nv h[4] = {nv(":status", "200"), nv("content-type", "application/grpc"),
                       nv("grpc-status", code), nv("grpc-message", msg)};
    nghttp2_submit_response(st->c->s, st->id, h, 4, NULL);
}

/* A message: the data, then the trailers (status 0), or with watch the stream kept open. */
static void answer(struct dp_stream *st, const struct osubd_pb *msg, bool watch)
{
    if (st->out == NULL && (st->out = evbuffer_new()) == NULL) {
        answer_error(st, GRPC_INTERNAL, "out of memory");
        return;
    }
    if (evbuffer_add(st->out, msg->p, msg->len) != 0) {
        answer_error(st, GRPC_INTERNAL, "out of memory");
        return;
    }
    st->watch = watch;
    st->ending = !watch;
    st->status = GRPC_OK;
    nghttp2_nv h[2] = {nv(":status", "200"), nv("content-type", "application/grpc")};
    nghttp2_data_provider prd;
    prd.source.ptr = st;
    prd.read_callback = read_out;
    if (nghttp2_submit_response(st->c->s, st->id, h, 2, &prd) != 0)
        st->c->dead = true;
}

static void answer_empty(struct dp_stream *st)
{
    struct osubd_pb b;
    osubd_pb_init(&b, 16);
    grpc_prefix(&b, 0);
    answer(st, &b, false);
    osubd_pb_free(&b);
}

/* The one message of a unary request (or a stream's first): 0, or -1 answered. */
static int request_message(struct dp_stream *st, struct osubd_pb_reader *r)
{
    const uint8_t *p = st->in.p;
    size_t len = st->in.len;
    if (len < 5) {
        answer_error(st, GRPC_INTERNAL, "a gRPC message needs its 5-byte prefix (got %zu bytes)",
                     len);
        return -1;
    }
    if (p[0] != 0) {
        answer_error(st, GRPC_UNIMPLEMENTED, "compressed messages are not accepted");
        return -1;
    }
    size_t n = (size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4];
    if (n != len - 5) {
        answer_error(st, GRPC_INTERNAL,
                     "the gRPC prefix says %zu bytes, the request holds %zu (one message)", n,
                     len - 5);
        return -1;
    }
    r->p = p + 5;
    r->end = p + len;
    return 0;
}

/* Walks a whole message, checking it is well formed. */
static bool message_ok(struct osubd_pb_reader r)
{
    struct osubd_pb_field f;
    int rc;
    while ((rc = osubd_pb_next(&r, &f)) == 1)
        ;
    return rc == 0;
}

/* DevicePluginOptions: pre_start_required (a pod's container starts only once its service
 * does); get_preferred_allocation_available false (the IDs mean nothing). */
static void call_options(struct dp_stream *st, struct osubd_pb_reader *r)
{
    if (!message_ok(*r)) {
        answer_error(st, GRPC_INVALID_ARGUMENT, "Empty: not a valid protobuf message");
        return;
    }
    struct osubd_pb b;
    osubd_pb_init(&b, 16);
    grpc_prefix(&b, 2);
    osubd_pb_bool(&b, 1, true);
    if (b.failed)
        answer_error(st, GRPC_INTERNAL, "out of memory");
    else
        answer(st, &b, false);
    osubd_pb_free(&b);
}

static void call_watch(struct dp_stream *st, struct osubd_pb_reader *r)
{
    if (!message_ok(*r)) {
        answer_error(st, GRPC_INVALID_ARGUMENT, "Empty: not a valid protobuf message");
        return;
    }
    struct osubd_dp *dp = st->c->dp;
    int open = 0;
    for (struct dp_conn *c = dp->conns; c; c = c->next)
        for (struct dp_stream *o = c->streams; o; o = o->next)
            open += o->watch && o != st;
    if (open >= DP_WATCHERS_MAX) {
        dp->watch_refused++;
        answer_error(st, GRPC_RESOURCE_EXHAUSTED,
                     "%d ListAndWatch streams are open already (the kubelet keeps one)",
                     DP_WATCHERS_MAX);
        return;
    }
    answer(st, &dp->list, true);
}

/* One device ID of a request: bytes inside the request. */
struct dp_id {
    const uint8_t *p;
    size_t len;
};

static int id_cmp(const void *a, const void *b)
{
    const struct dp_id *x = a, *y = b;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return memcmp(x->p, y->p, x->len);
}

/* the IDs one container request may name in each list (kubelet names at most the plugin's
 * devices; our list is cut under DP_LIST_MAX bytes, so this many are always more than it has) */
#define DP_IDS_MAX 65536

/* GetPreferredAllocation: the devices that must be in, then the first available ones. Linear
 * in the request (issue 23: a check of each available ID against every must-include one froze
 * the daemon's loop for 116 s on 120,000 IDs): the must-include IDs sorted once, each available
 * one looked up by binary search; at most DP_IDS_MAX IDs per container request. */
static void call_preferred(struct dp_stream *st, struct osubd_pb_reader *r)
{
    struct osubd_pb out;
    osubd_pb_init(&out, DP_LIST_MAX);
    struct osubd_pb_field f, g;
    int rc;
    struct dp_id *must = NULL;
    bool too_many = false;
    while ((rc = osubd_pb_next(r, &f)) == 1) {
        if (f.num != 1 || f.wire != 2)
            continue;
        struct osubd_pb_reader c = {f.data, f.data + f.len}, again;
        int64_t size = 0;
        size_t n_must = 0, n_ids = 0; /* must-include, available */
        again = c;
        while ((rc = osubd_pb_next(&c, &g)) == 1) {
            if (g.num == 3 && g.wire == 0)
                size = (int32_t)g.varint;
            else if (g.num == 1 && g.wire == 2 && ++n_ids > DP_IDS_MAX)
                too_many = true;
            else if (g.num == 2 && g.wire == 2 && ++n_must > DP_IDS_MAX)
                too_many = true;
        }
        if (rc < 0 || too_many)
            break;
        free(must);
        must = n_must ? malloc(n_must * sizeof(*must)) : NULL;
        if (n_must && must == NULL) {
            out.failed = true;
            break;
        }
        size_t k = 0;
        for (c = again; osubd_pb_next(&c, &g) == 1;)
            if (g.num == 2 && g.wire == 2)
                must[k++] = (struct dp_id){(const uint8_t *)g.data, g.len};
        qsort(must, n_must, sizeof(*must), id_cmp);
        struct osubd_pb one;
        osubd_pb_init(&one, DP_LIST_MAX);
        int64_t taken = 0;
        for (int pass = 2; pass >= 1; pass--) { /* must_include (2) first, then available (1) */
            c = again;
            while (taken < size && osubd_pb_next(&c, &g) == 1) {
                if (g.num != (uint32_t)pass || g.wire != 2)
                    continue;
                struct dp_id key = {(const uint8_t *)g.data, g.len};
                /* an available one already taken as a must */
                if (pass == 1 && n_must && bsearch(&key, must, n_must, sizeof(*must), id_cmp))
                    continue;
                osubd_pb_bytes(&one, 1, g.data, g.len);
                taken++;
            }
        }
        osubd_pb_bytes(&out, 1, one.p, one.len);
        osubd_pb_free(&one);
    }
    free(must);
    if (too_many) {
        osubd_pb_free(&out);
        answer_error(st, GRPC_INVALID_ARGUMENT,
                     "PreferredAllocationRequest: a container request names more than %d "
                     "device IDs in a list",
                     DP_IDS_MAX);
        return;
    }
    if (rc < 0) {
        osubd_pb_free(&out);
        answer_error(st, GRPC_INVALID_ARGUMENT,
                     "PreferredAllocationRequest: not a valid protobuf message");
        return;
    }
    struct osubd_pb framed;
    osubd_pb_init(&framed, DP_LIST_MAX + 5);
    grpc_prefix(&framed, out.len);
    osubd_pb_raw(&framed, out.p, out.len);
    if (out.failed || framed.failed)
        answer_error(st, GRPC_RESOURCE_EXHAUSTED, "the answer would be too large");
    else
        answer(st, &framed, false);
    osubd_pb_free(&out);
    osubd_pb_free(&framed);
}

/* ---- Allocate: kubelet's requests matched with the extender's pods ----------------------- */

/* The container index of an allocation record ({container, devices, n}, or a bare index). */
static json_int_t dp_rec_container(const json_t *e)
{
    return json_is_object(e) ? json_integer_value(json_object_get(e, "container"))
                             : json_integer_value(e);
}

static bool dp_given(struct osubd_dp *dp, const char *id, size_t j)
{
    const json_t *a = json_object_get(dp->allocated, id);
    for (size_t i = 0; i < json_array_size(a); i++)
        if (dp_rec_container(json_array_get(a, i)) == (json_int_t)j)
            return true;
    return false;
}

/* One device ID's part of a set's fingerprint: FNV-1a, then splitmix64's finalizer, so that
 * the sum over a set (the same in any order: kubelet sends sets) stays spread. */
static uint64_t dp_id_hash(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

static void dp_fp_text(uint64_t fp, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)fp);
}

/* The allocation a set of device IDs was given to (PreStartContainer sends the container's
 * IDs): the service id (borrowed from dp->allocated) and the container, or false. */
static bool dp_lookup(struct osubd_dp *dp, uint64_t fp, int64_t n, const char **id, size_t *ctr)
{
    char hex[17];
    dp_fp_text(fp, hex);
    const char *k;
    json_t *a;
    json_object_foreach(dp->allocated, k, a)
    {
        size_t i;
        json_t *e;
        json_array_foreach(a, i, e)
        {
            const char *f = json_string_value(json_object_get(e, "devices"));
            if (f != NULL && strcmp(f, hex) == 0 &&
                json_integer_value(json_object_get(e, "n")) == n) {
                *id = k;
                *ctr = (size_t)dp_rec_container(e);
                return true;
            }
        }
    }
    return false;
}

static void dp_save_allocated(struct osubd_dp *dp)
{
    char tmp[700];
    snprintf(tmp, sizeof(tmp), "%s.tmp", dp->allocs_path);
    if (json_dump_file(dp->allocated, tmp, JSON_COMPACT) != 0 ||
        rename(tmp, dp->allocs_path) != 0) {
        osubd_log(OSUBD_LOG_WARN, "device plugin: cannot save %s: %s", dp->allocs_path,
                strerror(errno));
        unlink(tmp);
    }
}

struct dp_match {
    const char *id; /* the engine's, valid during the call */
    size_t container;
    const json_t *kube;
    int64_t vram_mib;
};

/* The oldest pod container of `count` MiB not given yet (nor earlier in this request), of a
 * pod that runs or waits for its victims to leave. */
static bool dp_find(struct osubd_dp *dp, int64_t count, const struct dp_match *taken, size_t nt,
                    struct dp_match *m)
{
    struct osubd_dp *d = dp;
    size_t n = osub_engine_service_count(d->e);
    for (size_t i = 0; i < n; i++) {
        const char *id = osub_engine_service_id(d->e, i);
        const json_t *k = osubd_act_kube(d->act, id);
        osub_service_info_t si;
        if (k == NULL || osub_engine_service_info(d->e, id, &si) != 0 ||
            !(si.state == OSUB_STATE_PENDING || si.state == OSUB_STATE_LOADING ||
              si.state == OSUB_STATE_RUNNING || si.state == OSUB_STATE_DEGRADED))
            continue; /* pending: bound, its victims leaving (PreStartContainer waits) */
        size_t j;
        json_t *c;
        json_array_foreach(json_object_get(k, "containers"), j, c)
        {
            if (json_integer_value(json_object_get(c, "vram_mib")) != count || dp_given(dp, id, j))
                continue;
            bool dup = false;
            for (size_t t = 0; t < nt && !dup; t++)
                dup = strcmp(taken[t].id, id) == 0 && taken[t].container == j;
            if (dup)
                continue;
            m->id = id;
            m->container = j;
            m->kube = k;
            m->vram_mib = count;
            return true;
        }
    }
    return false;
}

/* One ContainerAllocateResponse for a matched container. 0, or -1 with why. */
static int dp_container_answer(struct osubd_dp *dp, const struct dp_match *m, struct osubd_pb *out,
                               char *why, size_t whylen)
{
    struct osubd_dp *d = dp;
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, m->id, &si) != 0) {
        snprintf(why, whylen, "service %s is gone", m->id);
        return -1;
    }
    char gpus[1024] = "", num[32], tok[65], segpath[700] = "";
    for (int32_t i = 0; i < si.n_slots; i++) {
        int32_t g = si.slots[i].gpu;
        size_t l = strlen(gpus);
        if (g < d->gpus->n && d->gpus->uuid[g][0])
            snprintf(gpus + l, sizeof(gpus) - l, "%s%s", i ? "," : "", d->gpus->uuid[g]);
        else
            snprintf(gpus + l, sizeof(gpus) - l, "%s%d", i ? "," : "", (int)g);
    }
    const char *shim = dp->shim;
    if (shim[0] && osubd_act_pod_segment(d->act, m->id, segpath, sizeof(segpath), why, whylen) != 0)
        return -1;
    struct osubd_pb c;
    osubd_pb_init(&c, 64 * 1024);
    osubd_pb_map_entry(&c, 1, "NVIDIA_VISIBLE_DEVICES", gpus);
    osubd_pb_map_entry(&c, 1, "CUDA_VISIBLE_DEVICES", gpus);
    osubd_pb_map_entry(&c, 1, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    osubd_pb_map_entry(&c, 1, "OVERSUB_SERVICE", m->id);
    osubd_service_token(d->core, m->id, tok);
    osubd_pb_map_entry(&c, 1, "OVERSUB_TOKEN", tok);
    snprintf(num, sizeof(num), "%lld", (long long)m->vram_mib);
    osubd_pb_map_entry(&c, 1, "OVERSUB_VRAM_MIB", num);
    const char *cname = json_string_value(json_object_get(
        json_array_get(json_object_get(m->kube, "containers"), m->container), "name"));
    osubd_pb_map_entry(&c, 1, "OVERSUB_CONTAINER", cname ? cname : "");
    if (shim[0]) {
        osubd_pb_map_entry(&c, 1, "LD_PRELOAD", DP_SHIM_IN_CTR);
        osubd_pb_map_entry(&c, 1, "OVERSUB_SHIM_SEGMENT", DP_SEG_IN_CTR);
        struct osubd_pb mnt;
        osubd_pb_init(&mnt, 4096);
        osubd_pb_string(&mnt, 1, DP_SHIM_IN_CTR);
        osubd_pb_string(&mnt, 2, shim);
        osubd_pb_bool(&mnt, 3, true);
        osubd_pb_bytes(&c, 2, mnt.p, mnt.len);
        bool failed = mnt.failed;
        osubd_pb_free(&mnt);
        osubd_pb_init(&mnt, 4096);
        osubd_pb_string(&mnt, 1, DP_SEG_IN_CTR);
        osubd_pb_string(&mnt, 2, segpath);
        osubd_pb_bytes(&c, 2, mnt.p, mnt.len);
        failed = failed || mnt.failed;
        osubd_pb_free(&mnt);
        if (failed)
            c.failed = true;
    }
    osubd_pb_bytes(out, 1, c.p, c.len);
    bool failed = c.failed;
    osubd_pb_free(&c);
    if (failed) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    return 0;
}

static void call_allocate(struct dp_stream *st, struct osubd_pb_reader *r)
{
    struct osubd_dp *dp = st->c->dp;
    struct dp_match m[64];
    int64_t counts[64];
    uint64_t fps[64];
    size_t n = 0;
    struct osubd_pb_field f, g;
    int rc;
    while ((rc = osubd_pb_next(r, &f)) == 1) {
        if (f.num != 1 || f.wire != 2)
            continue;
        if (n == 64) {
            answer_error(st, GRPC_INVALID_ARGUMENT, "more than 64 containers in one request");
            return;
        }
        struct osubd_pb_reader c = {f.data, f.data + f.len};
        counts[n] = 0;
        fps[n] = 0;
        while ((rc = osubd_pb_next(&c, &g)) == 1)
            if (g.num == 1 && g.wire == 2) {
                counts[n]++;
                fps[n] += dp_id_hash(g.data, g.len);
            }
        if (rc < 0)
            break;
        n++;
    }
    if (rc < 0) {
        answer_error(st, GRPC_INVALID_ARGUMENT, "AllocateRequest: not a valid protobuf message");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!dp_find(dp, counts[i], m, i, &m[i])) {
            osubd_log(OSUBD_LOG_WARN, "device plugin: Allocate of %lld MiB (container %zu of the "
                    "request) refused: no running or pending pod submitted through the extender "
                    "has a container of that size not yet allocated",
                    (long long)counts[i], i + 1);
            answer_error(st, GRPC_FAILED_PRECONDITION,
                         "oversub: no pod bound through oversub-scheduler has a container asking "
                         "%lld %s that is not allocated yet (pods must be scheduled by the "
                         "oversub extender, and be running or pending in oversubd)",
                         (long long)counts[i], OSUBD_DP_RESOURCE);
            return;
        }
    }
    struct osubd_pb out;
    osubd_pb_init(&out, 1024 * 1024);
    char why[400];
    for (size_t i = 0; i < n; i++) {
        if (dp_container_answer(dp, &m[i], &out, why, sizeof(why)) != 0) {
            osubd_pb_free(&out);
            osubd_log(OSUBD_LOG_WARN, "device plugin: Allocate for %s refused: %s", m[i].id, why);
            answer_error(st, GRPC_FAILED_PRECONDITION, "oversub: %s: %s", m[i].id, why);
            return;
        }
    }
    struct osubd_pb framed;
    osubd_pb_init(&framed, 1024 * 1024 + 5);
    grpc_prefix(&framed, out.len);
    osubd_pb_raw(&framed, out.p, out.len);
    if (out.failed || framed.failed) {
        answer_error(st, GRPC_INTERNAL, "out of memory");
    } else {
        for (size_t i = 0; i < n; i++) {
            json_t *a = json_object_get(dp->allocated, m[i].id);
            if (a == NULL) {
                a = json_array();
                if (a == NULL || json_object_set_new(dp->allocated, m[i].id, a) != 0) {
                    osubd_fatal(dp->core, "out of memory recording an allocation");
                    break;
                }
            }
            char hex[17];
            dp_fp_text(fps[i], hex);
            if (json_array_append_new(a, json_pack("{s:I, s:s, s:I}", "container",
                                                   (json_int_t)m[i].container, "devices", hex, "n",
                                                   (json_int_t)counts[i])) != 0) {
                osubd_fatal(dp->core, "out of memory recording an allocation");
                break;
            }
            osub_service_info_t si;
            bool waits = osub_engine_service_info(dp->e, m[i].id, &si) == 0 &&
                         si.state == OSUB_STATE_PENDING;
            osubd_log(OSUBD_LOG_INFO, "device plugin: allocated %lld MiB to %s container %zu%s",
                    (long long)m[i].vram_mib, m[i].id, m[i].container,
                    waits ? " (pending: it starts once its victims are gone)" : "");
        }
        dp_save_allocated(dp);
        answer(st, &framed, false);
    }
    osubd_pb_free(&out);
    osubd_pb_free(&framed);
}

/* ---- PreStartContainer: a pod's container starts once its service does ----------------- */

/* A PreStartContainer call for the container in st->park_id: answered (true) once its service
 * runs, or is gone or leaving, or when it waited too long; false while it still waits. */
static bool prestart_try(struct dp_stream *st)
{
    struct osubd_dp *dp = st->c->dp;
    struct osubd_dp *d = dp;
    const char *id = st->park_id;
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0 || osubd_act_kube(d->act, id) == NULL) {
        osubd_log(OSUBD_LOG_WARN, "device plugin: PreStartContainer for %s refused: it is gone",
                id);
        answer_error(st, GRPC_FAILED_PRECONDITION,
                     "oversub: %s is no longer in oversubd: its pod does not start on this node",
                     id);
        return true;
    }
    if (si.state == OSUB_STATE_LOADING || si.state == OSUB_STATE_RUNNING ||
        si.state == OSUB_STATE_DEGRADED) {
        char path[700], why[300];
        if (dp->shim[0] &&
            osubd_act_pod_segment(d->act, id, path, sizeof(path), why, sizeof(why)) != 0) {
            osubd_log(OSUBD_LOG_WARN, "device plugin: PreStartContainer for %s refused: %s", id,
                    why);
            answer_error(st, GRPC_FAILED_PRECONDITION, "oversub: %s: %s", id, why);
            return true;
        }
        if (st->parked)
            osubd_log(OSUBD_LOG_INFO, "device plugin: PreStartContainer for %s container %zu answered: "
                    "its service is %s",
                    id, st->park_container, osub_state_name(si.state));
        answer_empty(st);
        return true;
    }
    if (si.state == OSUB_STATE_PENDING || si.state == OSUB_STATE_QUEUED) {
        if (osubd_engine_now(d->core) < st->park_until_ms)
            return false;
        char waits[160] = "";
        for (int32_t i = 0; i < si.n_waits; i++) {
            size_t l = strlen(waits);
            snprintf(waits + l, sizeof(waits) - l, "%s%s", i ? ", " : "", si.waits[i].service);
        }
        osubd_log(OSUBD_LOG_INFO, "device plugin: PreStartContainer for %s container %zu: still %s after "
                "%lld ms: answered UNAVAILABLE (the kubelet retries the start)",
                id, st->park_container, osub_state_name(si.state), (long long)dp->prestart_ms);
        answer_error(
            st, GRPC_UNAVAILABLE,
            "waiting for its victims to leave: oversub's %s is still %s after %lld s%s%s%s; "
            "the kubelet retries the container's start",
            id, osub_state_name(si.state), (long long)(dp->prestart_ms / 1000),
            waits[0] ? " (waiting for " : "", waits, waits[0] ? ")" : "");
        return true;
    }
    osubd_log(OSUBD_LOG_WARN, "device plugin: PreStartContainer for %s refused: it is %s", id,
            osub_state_name(si.state));
    answer_error(st, GRPC_FAILED_PRECONDITION,
                 "oversub: %s is %s in oversubd: its pod is leaving this node", id,
                 osub_state_name(si.state));
    return true;
}

/* Every DP_PARK_MS while calls wait: those whose service started (or timed out) are answered. */
static void on_park(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_dp *dp = arg;
    bool left = false;
    for (struct dp_conn *c = dp->conns, *next; c; c = next) {
        next = c->next;
        if (c->client)
            continue;
        bool any = false;
        for (struct dp_stream *st = c->streams; st; st = st->next) {
            if (!st->parked)
                continue;
            if (prestart_try(st)) {
                st->parked = false;
                any = true;
            } else {
                left = true;
            }
        }
        if (any)
            conn_flush(c);
    }
    if (!left)
        event_del(dp->park_ev);
}

/* PreStartContainer: the kubelet is about to start a container with these devices. The
 * allocation they were given to names the pod; the call is held open (parked, the loop goes
 * on) while the pod's service is pending, so the container starts only once its victims are
 * gone and its memory is real. IDs no allocation holds have nothing to wait for. */
static void call_prestart(struct dp_stream *st, struct osubd_pb_reader *r)
{
    struct osubd_dp *dp = st->c->dp;
    struct osubd_pb_field f;
    uint64_t fp = 0;
    int64_t n = 0;
    int rc;
    while ((rc = osubd_pb_next(r, &f)) == 1)
        if (f.num == 1 && f.wire == 2) {
            n++;
            fp += dp_id_hash(f.data, f.len);
        }
    if (rc < 0) {
        answer_error(st, GRPC_INVALID_ARGUMENT,
                     "PreStartContainerRequest: not a valid protobuf message");
        return;
    }
    const char *id;
    size_t ctr;
    if (!dp_lookup(dp, fp, n, &id, &ctr)) {
        osubd_log(OSUBD_LOG_INFO, "device plugin: PreStartContainer for %lld devices that no allocation "
                "of this oversubd holds: nothing to wait for",
                (long long)n);
        answer_empty(st);
        return;
    }
    snprintf(st->park_id, sizeof(st->park_id), "%s", id);
    st->park_container = ctr;
    st->park_until_ms = osubd_engine_now(dp->core) + dp->prestart_ms;
    if (prestart_try(st))
        return;
    st->parked = true;
    osubd_log(OSUBD_LOG_INFO, "device plugin: PreStartContainer for %s container %zu waits: its service "
            "is pending (its victims are leaving)",
            st->park_id, ctr);
    struct timeval tv = {0, DP_PARK_MS * 1000};
    if (!evtimer_pending(dp->park_ev, NULL) && event_add(dp->park_ev, &tv) != 0) {
        st->parked = false;
        answer_error(st, GRPC_INTERNAL, "out of memory");
    }
}

static void dispatch(struct dp_stream *st)
{
    if (!st->grpc) {
        nghttp2_nv h[2] = {nv(":status", "415"), nv("content-type", "text/plain")};
        nghttp2_submit_response(st->c->s, st->id, h, 2, NULL);
        return;
    }
    if (st->too_big) {
        answer_error(st, GRPC_RESOURCE_EXHAUSTED, "the request passes %d bytes", DP_REQ_MAX);
        return;
    }
    static const struct {
        const char *path;
        void (*fn)(struct dp_stream *, struct osubd_pb_reader *);
    } calls[] = {
        {"/v1beta1.DevicePlugin/GetDevicePluginOptions", call_options},
        {"/v1beta1.DevicePlugin/ListAndWatch", call_watch},
        {"/v1beta1.DevicePlugin/GetPreferredAllocation", call_preferred},
        {"/v1beta1.DevicePlugin/Allocate", call_allocate},
        {"/v1beta1.DevicePlugin/PreStartContainer", call_prestart},
    };
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++)
        if (strcmp(st->path, calls[i].path) == 0) {
            struct osubd_pb_reader r;
            if (request_message(st, &r) == 0)
                calls[i].fn(st, &r);
            return;
        }
    answer_error(st, GRPC_UNIMPLEMENTED, "unknown method %.80s", st->path);
}

/* ---- nghttp2's callbacks (server and client) ---------------------------------------------- */

static int on_begin_headers(nghttp2_session *s, const nghttp2_frame *frame, void *user)
{
    struct dp_conn *c = user;
    if (c->client || frame->hd.type != NGHTTP2_HEADERS ||
        frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct dp_stream *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    st->c = c;
    st->id = frame->hd.stream_id;
    osubd_pb_init(&st->in, DP_REQ_MAX);
    st->next = c->streams;
    c->streams = st;
    nghttp2_session_set_stream_user_data(s, st->id, st);
    return 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user)
{
    (void)flags;
    struct dp_conn *c = user;
    if (c->client) {
        if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
            char v[16];
            snprintf(v, sizeof(v), "%.*s", (int)(valuelen < 15 ? valuelen : 15), value);
            c->reg_status = atoi(v);
        } else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0) {
            snprintf(c->reg_msg, sizeof(c->reg_msg), "%.*s", (int)(valuelen < 299 ? valuelen : 299),
                     value);
        }
        return 0;
    }
    struct dp_stream *st = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (st == NULL)
        return 0;
    if (namelen == 5 && memcmp(name, ":path", 5) == 0)
        snprintf(st->path, sizeof(st->path), "%.*s", (int)(valuelen < 95 ? valuelen : 95), value);
    else if (namelen == 12 && memcmp(name, "content-type", 12) == 0)
        st->grpc = valuelen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                   (valuelen == 16 || value[16] == '+' || value[16] == ';');
    return 0;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data, size_t len,
                   void *user)
{
    (void)flags;
    struct dp_conn *c = user;
    if (c->client)
        return 0; /* Register's answer is Empty: only its status matters */
    struct dp_stream *st = nghttp2_session_get_stream_user_data(s, sid);
    if (st == NULL || st->too_big)
        return 0;
    osubd_pb_raw(&st->in, data, len);
    if (st->in.failed) {
        st->too_big = true;
        osubd_pb_free(&st->in);
    }
    return 0;
}

static int on_frame(nghttp2_session *s, const nghttp2_frame *frame, void *user)
{
    struct dp_conn *c = user;
    if (c->client || !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM) ||
        (frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS))
        return 0;
    struct dp_stream *st = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (st != NULL)
        dispatch(st);
    return 0;
}

static int on_close(nghttp2_session *s, int32_t sid, uint32_t code, void *user)
{
    (void)code;
    struct dp_conn *c = user;
    if (c->client) {
        reg_done(c->dp, c, NULL);
        nghttp2_session_terminate_session(s, NGHTTP2_NO_ERROR);
        return 0;
    }
    struct dp_stream *st = nghttp2_session_get_stream_user_data(s, sid);
    if (st == NULL)
        return 0;
    for (struct dp_stream **pp = &c->streams; *pp; pp = &(*pp)->next)
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    osubd_pb_free(&st->in);
    if (st->out)
        evbuffer_free(st->out);
    free(st);
    return 0;
}

static struct dp_conn *conn_new(struct osubd_dp *dp, struct bufferevent *bev, bool client)
{
    struct dp_conn *c = calloc(1, sizeof(*c));
    nghttp2_session_callbacks *cb = NULL;
    if (c == NULL || nghttp2_session_callbacks_new(&cb) != 0) {
        free(c);
        bufferevent_free(bev);
        return NULL;
    }
    c->dp = dp;
    c->bev = bev;
    c->client = client;
    c->reg_status = -1;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
    int rc = client ? nghttp2_session_client_new(&c->s, cb, c)
                    : nghttp2_session_server_new(&c->s, cb, c);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry iv[1] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, DP_STREAMS_MAX}};
    if (rc != 0 || nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, iv, 1) != 0) {
        if (c->s)
            nghttp2_session_del(c->s);
        bufferevent_free(bev);
        free(c);
        return NULL;
    }
    bufferevent_setcb(bev, on_read, on_write, on_event, c);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    c->next = dp->conns;
    dp->conns = c;
    return c;
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    (void)lis;
    (void)sa;
    (void)salen;
    struct osubd_dp *dp = arg;
    size_t n = 0;
    for (struct dp_conn *c = dp->conns; c; c = c->next)
        n++;
    if (n >= DP_CONNS_MAX) {
        osubd_log(OSUBD_LOG_WARN, "device plugin: %d connections already: one more refused",
                DP_CONNS_MAX);
        evutil_closesocket(fd);
        return;
    }
    struct bufferevent *bev = bufferevent_socket_new(dp->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL) {
        evutil_closesocket(fd);
        return;
    }
    struct dp_conn *c = conn_new(dp, bev, false);
    if (c != NULL)
        conn_flush(c);
}

/* ---- serving and registering -------------------------------------------------------------- */

static void serve_stop(struct osubd_dp *dp)
{
    while (dp->conns != NULL)
        conn_close(dp->conns);
    if (dp->lis != NULL) {
        evconnlistener_free(dp->lis);
        dp->lis = NULL;
        struct stat st;
        if (lstat(dp->sock, &st) == 0 && st.st_ino == dp->sock_ino)
            unlink(dp->sock);
    }
    dp->registered = false;
}

/* Binds DIR/oversub.sock afresh (a stale one removed). 0, or -1 with err. */
static int serve_start(struct osubd_dp *dp, char *err, size_t errlen)
{
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (strlen(dp->sock) >= sizeof(sun.sun_path)) {
        snprintf(err, errlen, "device_plugin: %s is too long for a Unix socket", dp->sock);
        return -1;
    }
    memcpy(sun.sun_path, dp->sock, strlen(dp->sock) + 1);
    struct stat st;
    if (lstat(dp->sock, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(dp->sock);
    mode_t old = umask(0077);
    dp->lis = evconnlistener_new_bind(dp->base, on_accept, dp,
                                      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 16,
                                      (struct sockaddr *)&sun, sizeof(sun));
    umask(old);
    if (dp->lis == NULL || lstat(dp->sock, &st) != 0) {
        snprintf(err, errlen, "device_plugin: cannot listen on %s: %s", dp->sock, strerror(errno));
        if (dp->lis)
            evconnlistener_free(dp->lis);
        dp->lis = NULL;
        return -1;
    }
    dp->sock_ino = st.st_ino;
    return 0;
}

/* The Register call ended: why is NULL when its status came (c->reg_status), else the
 * failure. Only the first word about one call counts. */
static void reg_done(struct osubd_dp *dp, struct dp_conn *c, const char *why)
{
    if (dp->reg != c)
        return;
    dp->reg = NULL;
    int64_t now = osubd_now(dp->core);
    if (why == NULL && c->reg_status == 0) {
        dp->registered = true;
        dp->reg_failures = 0;
        osubd_log(OSUBD_LOG_INFO, "device plugin: registered %s with the kubelet (%s, endpoint %s, "
                "%lld devices)",
                OSUBD_DP_RESOURCE, dp->kubelet, OSUBD_DP_SOCKET, (long long)dp->advertised);
        return;
    }
    dp->reg_failures++;
    unsigned shift = dp->reg_failures < 6 ? dp->reg_failures : 6;
    dp->next_reg_ms = now + (500LL << shift); /* 1 s, 2 s, ... 32 s */
    if (why == NULL)
        osubd_log(OSUBD_LOG_WARN, "device plugin: the kubelet refused Register: status %d %s",
                c->reg_status, c->reg_status < 0 ? "(no status)" : c->reg_msg);
    else
        osubd_log(OSUBD_LOG_WARN, "device plugin: Register with %s failed: %s", dp->kubelet, why);
}

static void reg_start(struct osubd_dp *dp)
{
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    struct stat st;
    if (strlen(dp->kubelet) >= sizeof(sun.sun_path) || stat(dp->kubelet, &st) != 0)
        return;
    memcpy(sun.sun_path, dp->kubelet, strlen(dp->kubelet) + 1);
    dp->kubelet_ino = st.st_ino;
    struct bufferevent *bev = bufferevent_socket_new(dp->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL)
        return;
    struct dp_conn *c = conn_new(dp, bev, true);
    if (c == NULL)
        return;
    dp->reg = c;
    struct timeval tv = {DP_REG_TIMEOUT_S, 0};
    bufferevent_set_timeouts(bev, &tv, &tv);
    /* RegisterRequest{version, endpoint, resource_name, options{pre_start_required}} */
    struct osubd_pb msg;
    osubd_pb_init(&msg, 4096);
    osubd_pb_string(&msg, 1, "v1beta1");
    osubd_pb_string(&msg, 2, OSUBD_DP_SOCKET);
    osubd_pb_string(&msg, 3, OSUBD_DP_RESOURCE);
    osubd_pb_bytes(&msg, 4, "\x08\x01", 2); /* options: pre_start_required */
    struct dp_stream *st0 = calloc(1, sizeof(*st0));
    struct evbuffer *out = evbuffer_new();
    struct osubd_pb framed;
    osubd_pb_init(&framed, 4096 + 5);
    grpc_prefix(&framed, msg.len);
    osubd_pb_raw(&framed, msg.p, msg.len);
    bool failed = framed.failed || msg.failed || st0 == NULL || out == NULL ||
                  evbuffer_add(out, framed.p, framed.len) != 0;
    osubd_pb_free(&framed);
    if (failed) {
        free(st0);
        if (out)
            evbuffer_free(out);
        osubd_pb_free(&msg);
        reg_done(dp, c, "out of memory");
        c->dead = true;
        conn_flush(c);
        return;
    }
    osubd_pb_free(&msg);
    st0->c = c;
    st0->out = out;
    st0->next = c->streams;
    c->streams = st0; /* the request body; freed with the connection */
    nghttp2_nv hd[6] = {nv(":method", "POST"),
                        nv(":scheme", "http"),
                        nv(":path", "/v1beta1.Registration/Register"),
                        nv(":authority", "localhost"),
                        nv("content-type", "application/grpc"),
                        nv("te", "trailers")};
    nghttp2_data_provider prd;
    prd.source.ptr = st0;
    prd.read_callback = read_req;
    if (nghttp2_submit_request(c->s, NULL, hd, 6, &prd, NULL) < 0 ||
        bufferevent_socket_connect(bev, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        reg_done(dp, c, strerror(errno));
        c->dead = true;
        conn_flush(c);
    }
}

/* ---- the check timer ---------------------------------------------------------------------- */

static void push_list(struct osubd_dp *dp)
{
    for (struct dp_conn *c = dp->conns, *next; c; c = next) {
        next = c->next;
        if (c->client)
            continue;
        bool any = false;
        for (struct dp_stream *st = c->streams; st; st = st->next) {
            if (!st->watch || st->out == NULL)
                continue;
            if (evbuffer_get_length(st->out) > 0 || st->want_list) {
                /* still sending an earlier list: it gets the latest after, never a copy per
                 * change (issue 23: 8 stuck watchers, 10 changes, +446 MiB) */
                dp->lists_coalesced += st->want_list;
                st->want_list = true;
                continue;
            }
            if (evbuffer_add(st->out, dp->list.p, dp->list.len) != 0) {
                c->dead = true;
                break;
            }
            if (st->deferred) {
                st->deferred = false;
                nghttp2_session_resume_data(c->s, st->id);
            }
            any = true;
        }
        if (any || c->dead)
            conn_flush(c);
    }
}

static void on_check(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct osubd_dp *dp = arg;
    struct osubd_dp *d = dp;
    osubd_act_pods_sweep(d->act);
    /* allocations of pods that are gone */
    const char *id;
    json_t *v;
    void *tmp;
    bool changed = false;
    json_object_foreach_safe(dp->allocated, tmp, id, v)
    {
        if (osubd_act_kube(d->act, id) == NULL) {
            json_object_del(dp->allocated, id);
            changed = true;
        }
    }
    if (changed)
        dp_save_allocated(dp);
    /* the kubelet restarted: it removed our socket (and made its own anew) */
    struct stat st;
    if (lstat(dp->sock, &st) != 0 || st.st_ino != dp->sock_ino) {
        osubd_log(OSUBD_LOG_INFO, "device plugin: %s was removed (the kubelet restarted?): serving it "
                "again",
                dp->sock);
        serve_stop(dp);
        char err[700];
        if (serve_start(dp, err, sizeof(err)) != 0) {
            osubd_log(OSUBD_LOG_INFO, "%s", err);
            return;
        }
        dp->next_reg_ms = 0;
    }
    bool kubelet = stat(dp->kubelet, &st) == 0 && S_ISSOCK(st.st_mode);
    if (dp->registered && (!kubelet || st.st_ino != dp->kubelet_ino)) {
        osubd_log(OSUBD_LOG_INFO, "device plugin: %s was replaced: registering again",
                dp->kubelet);
        dp->registered = false;
        dp->next_reg_ms = 0;
    }
    if (kubelet && !dp->registered && dp->reg == NULL && osubd_now(d->core) >= dp->next_reg_ms)
        reg_start(dp);
    int64_t cap = dp_capacity(d);
    if (cap != dp->capacity_mib) {
        if (dp_build_list(dp, cap) != 0) {
            osubd_log(OSUBD_LOG_WARN, "device plugin: out of memory building the device list");
            return;
        }
        osubd_log(OSUBD_LOG_INFO, "device plugin: advertising %lld devices (%lld MiB logical)",
                (long long)dp->advertised, (long long)cap);
        push_list(dp);
    }
}

void osubd_dp_metrics(struct osubd_dp *dp, struct evbuffer *b)
{
    if (dp == NULL)
        return;
    int watchers = 0;
    size_t buffered = 0;
    for (struct dp_conn *c = dp->conns; c; c = c->next)
        for (struct dp_stream *st = c->streams; st; st = st->next)
            if (st->watch) {
                watchers++;
                buffered += st->out ? evbuffer_get_length(st->out) : 0;
            }
    evbuffer_add_printf(
        b,
        "# HELP oversub_deviceplugin_watchers ListAndWatch streams open (the kubelet's).\n"
        "# TYPE oversub_deviceplugin_watchers gauge\noversub_deviceplugin_watchers %d\n"
        "# HELP oversub_deviceplugin_watch_buffered_bytes Device-list bytes queued for watchers "
        "that have not read them (at most one list each).\n"
        "# TYPE oversub_deviceplugin_watch_buffered_bytes gauge\n"
        "oversub_deviceplugin_watch_buffered_bytes %zu\n"
        "# HELP oversub_deviceplugin_list_bytes The device list's size, framed.\n"
        "# TYPE oversub_deviceplugin_list_bytes gauge\noversub_deviceplugin_list_bytes %zu\n"
        "# HELP oversub_deviceplugin_lists_coalesced_total List changes a slow watcher skipped "
        "(it gets the latest).\n# TYPE oversub_deviceplugin_lists_coalesced_total counter\n"
        "oversub_deviceplugin_lists_coalesced_total %llu\n"
        "# HELP oversub_deviceplugin_watch_refused_total ListAndWatch calls refused beyond %d "
        "open.\n# TYPE oversub_deviceplugin_watch_refused_total counter\n"
        "oversub_deviceplugin_watch_refused_total %llu\n",
        watchers, buffered, dp->list.len, (unsigned long long)dp->lists_coalesced, DP_WATCHERS_MAX,
        (unsigned long long)dp->watch_refused);
}

struct osubd_dp *osubd_dp_start(struct osubd_core *c, struct osubd_act *act,
                               const struct osubd_gpus *gpus, char *err, size_t errlen)
{
    struct osubd_dp *dp = calloc(1, sizeof(*dp));
    if (dp == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    dp->core = c;
    dp->cfg = osubd_core_config(c);
    dp->base = osubd_core_base(c);
    dp->e = osubd_core_engine(c);
    dp->act = act;
    dp->gpus = gpus;
    if (dp_open(dp, err, errlen) != 0) {
        osubd_dp_stop(dp);
        return NULL;
    }
    return dp;
}

static int dp_open(struct osubd_dp *dp, char *err, size_t errlen)
{
    struct osubd_dp *d = dp;
    osubd_pb_init(&dp->list, DP_LIST_MAX + 5);
    snprintf(dp->dir, sizeof(dp->dir), "%s", d->cfg->device_plugin);
    snprintf(dp->sock, sizeof(dp->sock), "%s/%s", dp->dir, OSUBD_DP_SOCKET);
    snprintf(dp->kubelet, sizeof(dp->kubelet), "%s/%s", dp->dir, OSUBD_DP_KUBELET);
    /* beside the state, named after it (as the API's socket is) */
    size_t sl = strlen(d->cfg->state_path);
    if (sl > 3 && strcmp(d->cfg->state_path + sl - 3, ".db") == 0)
        sl -= 3;
    snprintf(dp->allocs_path, sizeof(dp->allocs_path), "%.*s.allocated.json", (int)sl,
             d->cfg->state_path);
    struct stat st;
    if (stat(dp->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "device_plugin: %s is not a folder", dp->dir);
        return -1;
    }
    json_error_t je;
    dp->allocated = access(dp->allocs_path, F_OK) == 0 ? json_load_file(dp->allocs_path, 0, &je)
                                                       : json_object();
    if (!json_is_object(dp->allocated)) {
        snprintf(err, errlen, "device_plugin: %s cannot be read (%s): remove it to start afresh",
                 dp->allocs_path, dp->allocated == NULL ? je.text : "not an object");
        return -1;
    }
    char why[500];
    if (osubd_act_pod_shim(d->act, dp->shim, sizeof(dp->shim), why, sizeof(why)) != 0) {
        snprintf(err, errlen, "device_plugin: %s", why);
        return -1;
    }
    /* a test knob (docs/deviceplugin.md): how long PreStartContainer waits */
    const char *knob = getenv("OSUB_DP_PRESTART_MS");
    char *end = NULL;
    long long ms = knob != NULL ? strtoll(knob, &end, 10) : 0;
    dp->prestart_ms = knob != NULL && *knob && *end == '\0' && ms > 0 && ms <= 600000
                          ? (int64_t)ms
                          : DP_PRESTART_MS;
    int64_t cap = dp_capacity(d);
    if (dp_build_list(dp, cap) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (serve_start(dp, err, errlen) != 0)
        return -1;
    dp->check_ev = event_new(d->base, -1, EV_PERSIST, on_check, dp);
    dp->park_ev = event_new(d->base, -1, EV_PERSIST, on_park, dp);
    struct timeval tv = {0, DP_CHECK_MS * 1000};
    if (dp->check_ev == NULL || dp->park_ev == NULL || event_add(dp->check_ev, &tv) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    osubd_log(OSUBD_LOG_INFO, "device plugin: serving %s (%lld devices of %s)", dp->sock,
            (long long)dp->advertised, OSUBD_DP_RESOURCE);
    event_active(dp->check_ev, EV_TIMEOUT, 0); /* register now */
    return 0;
}

void osubd_dp_stop(struct osubd_dp *dp)
{
    struct osubd_dp *d = dp;
    if (dp == NULL)
        return;
    serve_stop(dp);
    if (dp->check_ev)
        event_free(dp->check_ev);
    if (dp->park_ev)
        event_free(dp->park_ev);
    osubd_pb_free(&dp->list);
    json_decref(dp->allocated);
    osubd_act_pods_close(d->act);
    free(dp);
}

int64_t osubd_dp_cut_mib(const struct osubd_dp *dp)
{
    if (dp == NULL || dp->advertised >= dp->capacity_mib)
        return -1;
    return dp->advertised;
}
