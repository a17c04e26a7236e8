/* dp_alloc.c - the device plugin's Allocate (kubelet's requests matched with the extender's pods)
 * and PreStartContainer */
#define _GNU_SOURCE
#include "dp.h"

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
            osubd__dp_answer_error(st, GRPC_INVALID_ARGUMENT,
                                   "more than 64 containers in one request");
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
        osubd__dp_answer_error(st, GRPC_INVALID_ARGUMENT,
                               "AllocateRequest: not a valid protobuf message");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!dp_find(dp, counts[i], m, i, &m[i])) {
            osubd_log(OSUBD_LOG_WARN,
                      "device plugin: Allocate of %lld MiB (container %zu of the "
                      "request) refused: no running or pending pod submitted through the extender "
                      "has a container of that size not yet allocated",
                      (long long)counts[i], i + 1);
            osubd__dp_answer_error(
                st, GRPC_FAILED_PRECONDITION,
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
            osubd__dp_answer_error(st, GRPC_FAILED_PRECONDITION, "oversub: %s: %s", m[i].id, why);
            return;
        }
    }
    struct osubd_pb framed;
    osubd_pb_init(&framed, 1024 * 1024 + 5);
    osubd__dp_grpc_prefix(&framed, out.len);
    osubd_pb_raw(&framed, out.p, out.len);
    if (out.failed || framed.failed) {
        osubd__dp_answer_error(st, GRPC_INTERNAL, "out of memory");
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
            /* a note: the allocation is saved in the state with it (one transaction) */
            dp->dirty = true;
            osubd_note(dp->core, m[i].id, "pod", "allocated",
                       "device plugin: allocated %lld MiB to %s container %zu%s",
                       (long long)m[i].vram_mib, m[i].id, m[i].container,
                       waits ? " (pending: it starts once its victims are gone)" : "");
        }
        osubd__dp_answer(st, &framed, false);
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
        osubd__dp_answer_error(
            st, GRPC_FAILED_PRECONDITION,
            "oversub: %s is no longer in oversubd: its pod does not start on this node", id);
        return true;
    }
    if (si.state == OSUB_STATE_LOADING || si.state == OSUB_STATE_RUNNING ||
        si.state == OSUB_STATE_DEGRADED) {
        char path[700], why[300];
        if (dp->shim[0] &&
            osubd_act_pod_segment(d->act, id, path, sizeof(path), why, sizeof(why)) != 0) {
            osubd_log(OSUBD_LOG_WARN, "device plugin: PreStartContainer for %s refused: %s", id,
                      why);
            osubd__dp_answer_error(st, GRPC_FAILED_PRECONDITION, "oversub: %s: %s", id, why);
            return true;
        }
        if (st->parked)
            osubd_log(OSUBD_LOG_INFO,
                      "device plugin: PreStartContainer for %s container %zu answered: "
                      "its service is %s",
                      id, st->park_container, osub_state_name(si.state));
        osubd__dp_answer_empty(st);
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
        osubd_log(OSUBD_LOG_INFO,
                  "device plugin: PreStartContainer for %s container %zu: still %s after "
                  "%lld ms: answered UNAVAILABLE (the kubelet retries the start)",
                  id, st->park_container, osub_state_name(si.state), (long long)dp->prestart_ms);
        osubd__dp_answer_error(
            st, GRPC_UNAVAILABLE,
            "waiting for its victims to leave: oversub's %s is still %s after %lld s%s%s%s; "
            "the kubelet retries the container's start",
            id, osub_state_name(si.state), (long long)(dp->prestart_ms / 1000),
            waits[0] ? " (waiting for " : "", waits, waits[0] ? ")" : "");
        return true;
    }
    osubd_log(OSUBD_LOG_WARN, "device plugin: PreStartContainer for %s refused: it is %s", id,
              osub_state_name(si.state));
    osubd__dp_answer_error(st, GRPC_FAILED_PRECONDITION,
                           "oversub: %s is %s in oversubd: its pod is leaving this node", id,
                           osub_state_name(si.state));
    return true;
}

/* Every DP_PARK_MS while calls wait: those whose service started (or timed out) are answered. */
void osubd__dp_on_park(evutil_socket_t fd, short what, void *arg)
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
            osubd__dp_conn_flush(c);
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
        osubd__dp_answer_error(st, GRPC_INVALID_ARGUMENT,
                               "PreStartContainerRequest: not a valid protobuf message");
        return;
    }
    const char *id;
    size_t ctr;
    if (!dp_lookup(dp, fp, n, &id, &ctr)) {
        osubd_log(OSUBD_LOG_INFO,
                  "device plugin: PreStartContainer for %lld devices that no allocation "
                  "of this oversubd holds: nothing to wait for",
                  (long long)n);
        osubd__dp_answer_empty(st);
        return;
    }
    snprintf(st->park_id, sizeof(st->park_id), "%s", id);
    st->park_container = ctr;
    st->park_until_ms = osubd_engine_now(dp->core) + dp->prestart_ms;
    if (prestart_try(st))
        return;
    st->parked = true;
    osubd_log(OSUBD_LOG_INFO,
              "device plugin: PreStartContainer for %s container %zu waits: its service "
              "is pending (its victims are leaving)",
              st->park_id, ctr);
    struct timeval tv = {0, DP_PARK_MS * 1000};
    if (!evtimer_pending(dp->park_ev, NULL) && event_add(dp->park_ev, &tv) != 0) {
        st->parked = false;
        osubd__dp_answer_error(st, GRPC_INTERNAL, "out of memory");
    }
}

void osubd__dp_dispatch(struct dp_stream *st)
{
    if (!st->grpc) {
        nghttp2_nv h[2] = {osubd__dp_nv(":status", "415"),
                           osubd__dp_nv("content-type", "text/plain")};
        nghttp2_submit_response(st->c->s, st->id, h, 2, NULL);
        return;
    }
    if (st->too_big) {
        osubd__dp_answer_error(st, GRPC_RESOURCE_EXHAUSTED, "the request passes %d bytes",
                               DP_REQ_MAX);
        return;
    }
    static const struct {
        const char *path;
        void (*fn)(struct dp_stream *, struct osubd_pb_reader *);
    } calls[] = {
        {"/v1beta1.DevicePlugin/GetDevicePluginOptions", osubd__dp_call_options},
        {"/v1beta1.DevicePlugin/ListAndWatch", osubd__dp_call_watch},
        {"/v1beta1.DevicePlugin/GetPreferredAllocation", osubd__dp_call_preferred},
        {"/v1beta1.DevicePlugin/Allocate", call_allocate},
        {"/v1beta1.DevicePlugin/PreStartContainer", call_prestart},
    };
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++)
        if (strcmp(st->path, calls[i].path) == 0) {
            struct osubd_pb_reader r;
            if (osubd__dp_request_message(st, &r) == 0)
                calls[i].fn(st, &r);
            return;
        }
    osubd__dp_answer_error(st, GRPC_UNIMPLEMENTED, "unknown method %.80s", st->path);
}
