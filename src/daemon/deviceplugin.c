/* deviceplugin.c - the kubelet device plugin (API v1beta1) inside oversubd: the device list,
 * serving and registering, the check timer */
#define _GNU_SOURCE
#include "dp.h"

#include <ctype.h>

/* ---- the device list -------------------------------------------------------------------- */

static const char dp_alpha[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/* Device i's ID: the 62 one-character IDs, then the 3844 of two, ... (shortest first). */
size_t osubd__dp_id(uint64_t i, char out[16])
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
    size_t inner = 2 + osubd__dp_id(i, id) + 2 + 7; /* ID = 1, health = 2 ("Healthy") */
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

void osubd__dp_grpc_prefix(struct osubd_pb *b, size_t len)
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
        osubd_log(OSUBD_LOG_INFO,
                  "device plugin: %lld MiB of logical capacity would be a ListAndWatch "
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
    osubd__dp_grpc_prefix(&b, body);
    for (int64_t i = 0; i < n; i++) {
        char id[16];
        size_t l = osubd__dp_id((uint64_t)i, id);
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

/* ---- serving and registering -------------------------------------------------------------- */

static void serve_stop(struct osubd_dp *dp)
{
    while (dp->conns != NULL)
        osubd__dp_conn_close(dp->conns);
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
    dp->lis = evconnlistener_new_bind(dp->base, osubd__dp_on_accept, dp,
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
void osubd__dp_reg_done(struct osubd_dp *dp, struct dp_conn *c, const char *why)
{
    if (dp->reg != c)
        return;
    dp->reg = NULL;
    int64_t now = osubd_now(dp->core);
    if (why == NULL && c->reg_status == 0) {
        dp->registered = true;
        dp->reg_failures = 0;
        osubd_log(OSUBD_LOG_INFO,
                  "device plugin: registered %s with the kubelet (%s, endpoint %s, "
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
    struct dp_conn *c = osubd__dp_conn_new(dp, bev, true);
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
    osubd__dp_grpc_prefix(&framed, msg.len);
    osubd_pb_raw(&framed, msg.p, msg.len);
    bool failed = framed.failed || msg.failed || st0 == NULL || out == NULL ||
                  evbuffer_add(out, framed.p, framed.len) != 0;
    osubd_pb_free(&framed);
    if (failed) {
        free(st0);
        if (out)
            evbuffer_free(out);
        osubd_pb_free(&msg);
        osubd__dp_reg_done(dp, c, "out of memory");
        c->dead = true;
        osubd__dp_conn_flush(c);
        return;
    }
    osubd_pb_free(&msg);
    st0->c = c;
    st0->out = out;
    st0->next = c->streams;
    c->streams = st0; /* the request body; freed with the connection */
    nghttp2_nv hd[6] = {osubd__dp_nv(":method", "POST"),
                        osubd__dp_nv(":scheme", "http"),
                        osubd__dp_nv(":path", "/v1beta1.Registration/Register"),
                        osubd__dp_nv(":authority", "localhost"),
                        osubd__dp_nv("content-type", "application/grpc"),
                        osubd__dp_nv("te", "trailers")};
    nghttp2_data_provider prd;
    prd.source.ptr = st0;
    prd.read_callback = osubd__dp_read_req;
    if (nghttp2_submit_request(c->s, NULL, hd, 6, &prd, NULL) < 0 ||
        bufferevent_socket_connect(bev, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        osubd__dp_reg_done(dp, c, strerror(errno));
        c->dead = true;
        osubd__dp_conn_flush(c);
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
            osubd__dp_conn_flush(c);
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
        dp->dirty = true; /* saved with the next command */
    /* the kubelet restarted: it removed our socket (and made its own anew) */
    struct stat st;
    if (lstat(dp->sock, &st) != 0 || st.st_ino != dp->sock_ino) {
        osubd_log(OSUBD_LOG_INFO,
                  "device plugin: %s was removed (the kubelet restarted?): serving it "
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
        osubd_log(OSUBD_LOG_INFO, "device plugin: %s was replaced: registering again", dp->kubelet);
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

struct osubd_dp *osubd_dp_new(struct osubd_core *c, struct osubd_act *act,
                              const struct osubd_gpus *gpus, char *err, size_t errlen)
{
    struct osubd_dp *dp = calloc(1, sizeof(*dp));
    if (dp == NULL || (dp->allocated = json_object()) == NULL) {
        free(dp);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    dp->core = c;
    dp->cfg = osubd_core_config(c);
    dp->base = osubd_core_base(c);
    dp->e = osubd_core_engine(c);
    dp->act = act;
    dp->gpus = gpus;
    osubd_pb_init(&dp->list, DP_LIST_MAX + 5);
    snprintf(dp->dir, sizeof(dp->dir), "%s", dp->cfg->device_plugin);
    snprintf(dp->sock, sizeof(dp->sock), "%s/%s", dp->dir, OSUBD_DP_SOCKET);
    snprintf(dp->kubelet, sizeof(dp->kubelet), "%s/%s", dp->dir, OSUBD_DP_KUBELET);
    /* where a run before the allocations were kept in the state saved them: beside the state,
     * named after it (read once, then kept in the state) */
    size_t sl = strlen(dp->cfg->state_path);
    if (sl > 3 && strcmp(dp->cfg->state_path + sl - 3, ".db") == 0)
        sl -= 3;
    snprintf(dp->allocs_path, sizeof(dp->allocs_path), "%.*s.allocated.json", (int)sl,
             dp->cfg->state_path);
    struct stat st;
    if (stat(dp->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "device_plugin: %s is not a folder", dp->dir);
        osubd_dp_stop(dp);
        return NULL;
    }
    return dp;
}

/* Whether one allocation record has the shape Allocate writes ({container, devices: 16 hex
 * digits, n}) or a run from before wrote (a bare container index). */
static bool dp_rec_ok(const json_t *e)
{
    if (json_is_integer(e))
        return json_integer_value(e) >= 0 && json_integer_value(e) < 4096;
    if (!json_is_object(e) || json_object_size(e) != 3)
        return false;
    const json_t *c = json_object_get(e, "container"), *n = json_object_get(e, "n");
    const char *f = json_string_value(json_object_get(e, "devices"));
    if (!json_is_integer(c) || json_integer_value(c) < 0 || json_integer_value(c) >= 4096 ||
        !json_is_integer(n) || json_integer_value(n) < 1 || f == NULL || strlen(f) != 16)
        return false;
    for (const char *p = f; *p; p++)
        if (!isxdigit((unsigned char)*p))
            return false;
    return true;
}

/* Drops the records of a (the loaded allocations) that are not of that shape, each with a
 * warning naming the pod: a damaged record must not stop a later Allocate. */
static void dp_check_allocs(struct osubd_dp *dp, json_t *a, const char *from)
{
    const char *id;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(a, tmp, id, v)
    {
        if (!json_is_array(v)) {
            osubd_log(OSUBD_LOG_WARN,
                      "device plugin: %s: the allocations of %s are not a list: "
                      "dropped",
                      from, id);
            json_object_del(a, id);
            dp->dirty = true;
            continue;
        }
        for (size_t i = json_array_size(v); i-- > 0;)
            if (!dp_rec_ok(json_array_get(v, i))) {
                osubd_log(OSUBD_LOG_WARN,
                          "device plugin: %s: allocation %zu of %s is damaged: "
                          "dropped",
                          from, i, id);
                json_array_remove(v, i);
                dp->dirty = true;
            }
        if (json_array_size(v) == 0) {
            json_object_del(a, id);
            dp->dirty = true;
        }
    }
}

/* The allocations the kubelet was given, as the last run saved them in the state (or, once, in
 * the side file of a run from before). */
static int dp_load(void *ctx, struct osubd_core *c, char *err, size_t errlen)
{
    struct osubd_dp *dp = ctx;
    char *text = NULL;
    if (osubd_core_meta(c, "device_plugin_allocations", &text, err, errlen) != 0)
        return -1;
    json_error_t je;
    json_t *a = NULL;
    const char *from = "device_plugin_allocations";
    if (text != NULL) {
        a = json_loads(text, 0, &je);
        dp->allocs_path[0] = '\0'; /* the state has them: a side file is not ours to remove */
    } else if (access(dp->allocs_path, F_OK) == 0) {
        a = json_load_file(dp->allocs_path, 0, &je);
        from = dp->allocs_path;
        dp->dirty = true; /* into the state with the next command */
    } else {
        a = json_object();
    }
    free(text);
    if (!json_is_object(a)) {
        snprintf(err, errlen, "device_plugin: %s cannot be read (%s)", from,
                 a == NULL ? je.text : "not an object");
        json_decref(a);
        return -1;
    }
    dp_check_allocs(dp, a, from);
    json_decref(dp->allocated);
    dp->allocated = a;
    return 0;
}

static bool dp_dirty(void *ctx)
{
    return ((struct osubd_dp *)ctx)->dirty;
}

static void dp_save(void *ctx, json_t *meta)
{
    osubd_meta_put(meta, "device_plugin_allocations", ((struct osubd_dp *)ctx)->allocated);
}

static void dp_saved(void *ctx, bool ok)
{
    struct osubd_dp *dp = ctx;
    if (!ok)
        return;
    dp->dirty = false;
    if (dp->allocs_path[0] && unlink(dp->allocs_path) == 0) /* the state has them now */
        osubd_log(OSUBD_LOG_INFO, "device plugin: %s moved into the state", dp->allocs_path);
    dp->allocs_path[0] = '\0';
}

static void dp_forget(void *ctx, const char *id)
{
    struct osubd_dp *dp = ctx;
    if (json_object_del(dp->allocated, id) == 0)
        dp->dirty = true;
}

static void dp_metrics(void *ctx, struct evbuffer *b)
{
    osubd_dp_metrics(ctx, b);
}

struct osubd_module osubd_dp_module(struct osubd_dp *dp)
{
    struct osubd_module m = {.name = "device_plugin",
                             .ctx = dp,
                             .load = dp_load,
                             .dirty = dp_dirty,
                             .save = dp_save,
                             .saved = dp_saved,
                             .forget = dp_forget,
                             .metrics = dp_metrics};
    return m;
}

int osubd_dp_start(struct osubd_dp *dp, char *err, size_t errlen)
{
    struct osubd_dp *d = dp;
    assert(dp->lis == NULL); /* deviceplugin.h: started once, after the core loaded it */
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
    dp->park_ev = event_new(d->base, -1, EV_PERSIST, osubd__dp_on_park, dp);
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
