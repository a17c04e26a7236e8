/* dp_grpc.c - the device plugin's gRPC: connections, calls and their answers, nghttp2's callbacks
 * (server and client) */
#define _GNU_SOURCE
#include "dp.h"

/* ---- connections ------------------------------------------------------------------------ */

void osubd__dp_conn_close(struct dp_conn *c)
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
bool osubd__dp_conn_flush(struct dp_conn *c)
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
            osubd__dp_reg_done(c->dp, c,
                               "the connection ended without an answer"); /* if none came */
        osubd__dp_conn_close(c);
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
                osubd__dp_reg_done(c->dp, c, nghttp2_strerror((int)n));
            c->dead = true;
        } else {
            evbuffer_drain(in, (size_t)n);
        }
    }
    osubd__dp_conn_flush(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    (void)bev;
    osubd__dp_conn_flush(arg);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct dp_conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        osubd__dp_conn_flush(c);
        return;
    }
    if (c->client) {
        char why[200];
        snprintf(why, sizeof(why), "%s",
                 what & BEV_EVENT_TIMEOUT ? "no answer in time"
                 : what & BEV_EVENT_EOF   ? "the kubelet closed the connection"
                                          : strerror(EVUTIL_SOCKET_ERROR()));
        osubd__dp_reg_done(c->dp, c, why);
    }
    c->dead = true;
    osubd__dp_conn_flush(c);
}

nghttp2_nv osubd__dp_nv(const char *name, const char *value)
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
    nghttp2_nv t[2] = {osubd__dp_nv("grpc-status", code), osubd__dp_nv("grpc-message", msg)};
    if (nghttp2_submit_trailer(s, sid, t, st->message[0] ? 2 : 1) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return (ssize_t)n;
}

/* A request's body (our Register call): all of out, then END_STREAM. */
ssize_t osubd__dp_read_req(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len,
                           uint32_t *flags, nghttp2_data_source *src, void *user)
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
void osubd__dp_answer_error(struct dp_stream *st, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void osubd__dp_answer_error(struct dp_stream *st, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof(st->message), fmt, ap);
    va_end(ap);
    char code[16], msg[sizeof(st->message) * 3 + 1];
    snprintf(code, sizeof(code), "%d", status);
    pct_encode(st->message, msg, sizeof(msg));
    nghttp2_nv h[4] = {osubd__dp_nv(":status", "200"),
                       osubd__dp_nv("content-type", "application/grpc"),
                       osubd__dp_nv("grpc-status", code), osubd__dp_nv("grpc-message", msg)};
    nghttp2_submit_response(st->c->s, st->id, h, 4, NULL);
}

/* A message: the data, then the trailers (status 0), or with watch the stream kept open. */
void osubd__dp_answer(struct dp_stream *st, const struct osubd_pb *msg, bool watch)
{
    if (st->out == NULL && (st->out = evbuffer_new()) == NULL) {
        osubd__dp_answer_error(st, GRPC_INTERNAL, "out of memory");
        return;
    }
    if (evbuffer_add(st->out, msg->p, msg->len) != 0) {
        osubd__dp_answer_error(st, GRPC_INTERNAL, "out of memory");
        return;
    }
    st->watch = watch;
    st->ending = !watch;
    st->status = GRPC_OK;
    nghttp2_nv h[2] = {osubd__dp_nv(":status", "200"),
                       osubd__dp_nv("content-type", "application/grpc")};
    nghttp2_data_provider prd;
    prd.source.ptr = st;
    prd.read_callback = read_out;
    if (nghttp2_submit_response(st->c->s, st->id, h, 2, &prd) != 0)
        st->c->dead = true;
}

void osubd__dp_answer_empty(struct dp_stream *st)
{
    struct osubd_pb b;
    osubd_pb_init(&b, 16);
    osubd__dp_grpc_prefix(&b, 0);
    osubd__dp_answer(st, &b, false);
    osubd_pb_free(&b);
}

/* The one message of a unary request (or a stream's first): 0, or -1 answered. */
int osubd__dp_request_message(struct dp_stream *st, struct osubd_pb_reader *r)
{
    const uint8_t *p = st->in.p;
    size_t len = st->in.len;
    if (len < 5) {
        osubd__dp_answer_error(st, GRPC_INTERNAL,
                               "a gRPC message needs its 5-byte prefix (got %zu bytes)", len);
        return -1;
    }
    if (p[0] != 0) {
        osubd__dp_answer_error(st, GRPC_UNIMPLEMENTED, "compressed messages are not accepted");
        return -1;
    }
    size_t n = (size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4];
    if (n != len - 5) {
        osubd__dp_answer_error(
            st, GRPC_INTERNAL,
            "the gRPC prefix says %zu bytes, the request holds %zu (one message)", n, len - 5);
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
void osubd__dp_call_options(struct dp_stream *st, struct osubd_pb_reader *r)
{
    if (!message_ok(*r)) {
        osubd__dp_answer_error(st, GRPC_INVALID_ARGUMENT, "Empty: not a valid protobuf message");
        return;
    }
    struct osubd_pb b;
    osubd_pb_init(&b, 16);
    osubd__dp_grpc_prefix(&b, 2);
    osubd_pb_bool(&b, 1, true);
    if (b.failed)
        osubd__dp_answer_error(st, GRPC_INTERNAL, "out of memory");
    else
        osubd__dp_answer(st, &b, false);
    osubd_pb_free(&b);
}

void osubd__dp_call_watch(struct dp_stream *st, struct osubd_pb_reader *r)
{
    if (!message_ok(*r)) {
        osubd__dp_answer_error(st, GRPC_INVALID_ARGUMENT, "Empty: not a valid protobuf message");
        return;
    }
    struct osubd_dp *dp = st->c->dp;
    int open = 0;
    for (struct dp_conn *c = dp->conns; c; c = c->next)
        for (struct dp_stream *o = c->streams; o; o = o->next)
            open += o->watch && o != st;
    if (open >= DP_WATCHERS_MAX) {
        dp->watch_refused++;
        osubd__dp_answer_error(st, GRPC_RESOURCE_EXHAUSTED,
                               "%d ListAndWatch streams are open already (the kubelet keeps one)",
                               DP_WATCHERS_MAX);
        return;
    }
    osubd__dp_answer(st, &dp->list, true);
}

/* One device ID of a request: bytes inside the request. */
struct osubd__dp_id {
    const uint8_t *p;
    size_t len;
};

static int id_cmp(const void *a, const void *b)
{
    const struct osubd__dp_id *x = a, *y = b;
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
void osubd__dp_call_preferred(struct dp_stream *st, struct osubd_pb_reader *r)
{
    struct osubd_pb out;
    osubd_pb_init(&out, DP_LIST_MAX);
    struct osubd_pb_field f, g;
    int rc;
    struct osubd__dp_id *must = NULL;
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
                must[k++] = (struct osubd__dp_id){(const uint8_t *)g.data, g.len};
        qsort(must, n_must, sizeof(*must), id_cmp);
        struct osubd_pb one;
        osubd_pb_init(&one, DP_LIST_MAX);
        int64_t taken = 0;
        for (int pass = 2; pass >= 1; pass--) { /* must_include (2) first, then available (1) */
            c = again;
            while (taken < size && osubd_pb_next(&c, &g) == 1) {
                if (g.num != (uint32_t)pass || g.wire != 2)
                    continue;
                struct osubd__dp_id key = {(const uint8_t *)g.data, g.len};
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
        osubd__dp_answer_error(st, GRPC_INVALID_ARGUMENT,
                               "PreferredAllocationRequest: a container request names more than %d "
                               "device IDs in a list",
                               DP_IDS_MAX);
        return;
    }
    if (rc < 0) {
        osubd_pb_free(&out);
        osubd__dp_answer_error(st, GRPC_INVALID_ARGUMENT,
                               "PreferredAllocationRequest: not a valid protobuf message");
        return;
    }
    struct osubd_pb framed;
    osubd_pb_init(&framed, DP_LIST_MAX + 5);
    osubd__dp_grpc_prefix(&framed, out.len);
    osubd_pb_raw(&framed, out.p, out.len);
    if (out.failed || framed.failed)
        osubd__dp_answer_error(st, GRPC_RESOURCE_EXHAUSTED, "the answer would be too large");
    else
        osubd__dp_answer(st, &framed, false);
    osubd_pb_free(&out);
    osubd_pb_free(&framed);
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
        osubd__dp_dispatch(st);
    return 0;
}

static int on_close(nghttp2_session *s, int32_t sid, uint32_t code, void *user)
{
    (void)code;
    struct dp_conn *c = user;
    if (c->client) {
        osubd__dp_reg_done(c->dp, c, NULL);
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

struct dp_conn *osubd__dp_conn_new(struct osubd_dp *dp, struct bufferevent *bev, bool client)
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

void osubd__dp_on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
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
    struct dp_conn *c = osubd__dp_conn_new(dp, bev, false);
    if (c != NULL)
        osubd__dp_conn_flush(c);
}
