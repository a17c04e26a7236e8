/* suspender.c - the suspend mechanisms (suspender.h): the specs, the jobs and their deadlines,
 * the HTTP methods (vllm, sglang, http) through oversubd's own timed client; the cuda method's
 * calls are in sus_cuda.c */
#define _GNU_SOURCE
#include "sus.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>

#include "httpc.h"
#include "netpolicy.h"

static const char *const method_names[] = {"none", "cuda", "vllm", "sglang", "http"};

const char *osubd_sus_method_name(enum osubd_sus_method m)
{
    return (unsigned)m < sizeof(method_names) / sizeof(method_names[0]) ? method_names[m] : "?";
}

int64_t osubd__sus_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the spec ----------------------------------------------------------------------------- */

static bool base_url_ok(const char *s)
{
    if (s == NULL || strlen(s) > OSUBD_SUS_URL_MAX)
        return false;
    struct evhttp_uri *u = evhttp_uri_parse(s);
    bool ok = u != NULL && evhttp_uri_get_scheme(u) != NULL &&
              strcmp(evhttp_uri_get_scheme(u), "http") == 0 && evhttp_uri_get_host(u) != NULL &&
              evhttp_uri_get_port(u) > 0 && evhttp_uri_get_query(u) == NULL &&
              evhttp_uri_get_fragment(u) == NULL;
    if (u != NULL)
        evhttp_uri_free(u);
    return ok;
}

static bool path_ok(const char *p)
{
    if (p == NULL || p[0] != '/' || strlen(p) > OSUBD_SUS_PATH_MAX)
        return false;
    for (const char *c = p; *c; c++)
        if (*c <= ' ' || *c == '#' || *c == 0x7f)
            return false;
    return true;
}

int osubd_sus_parse(const json_t *v, const struct osubd_destinations *dest,
                    struct osubd_sus_spec *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_object(v)) {
        snprintf(err, errlen,
                 "field 'suspend' must be an object: {\"method\": \"cuda\"}, "
                 "{\"method\": \"vllm\", \"url\": U}, ...");
        return -1;
    }
    const char *m = json_string_value(json_object_get(v, "method"));
    for (int i = OSUBD_SUS_CUDA; m != NULL && i <= OSUBD_SUS_HTTP; i++)
        if (strcmp(m, method_names[i]) == 0)
            out->method = (enum osubd_sus_method)i;
    if (out->method == OSUBD_SUS_NONE) {
        snprintf(err, errlen, "field 'suspend.method' must be cuda, vllm, sglang or http");
        return -1;
    }
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x)
    {
        bool known = strcmp(k, "method") == 0 || strcmp(k, "residual") == 0 ||
                     strcmp(k, "residual_mib") == 0 || /* the engine's (spec_json.c) */
                     (out->method == OSUBD_SUS_CUDA && strcmp(k, "relocate") == 0) ||
                     (out->method != OSUBD_SUS_CUDA && strcmp(k, "url") == 0) ||
                     (out->method == OSUBD_SUS_HTTP &&
                      (strcmp(k, "suspend") == 0 || strcmp(k, "resume") == 0));
        if (!known) {
            snprintf(err, errlen, "field 'suspend.%.40s' is not a field of method %s", k, m);
            return -1;
        }
    }
    if (out->method == OSUBD_SUS_CUDA)
        return 0;
    const char *url = json_string_value(json_object_get(v, "url"));
    if (!base_url_ok(url)) {
        snprintf(err, errlen,
                 "field 'suspend.url' must be an http://HOST:PORT[/PREFIX] URL (the %s server)", m);
        return -1;
    }
    char why[400];
    if (dest != NULL && !osubd_url_allowed(dest, url, why, sizeof(why))) {
        snprintf(err, errlen, "field 'suspend.url': %s", why);
        return -1;
    }
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/')
        n--; /* the paths are appended to it */
    snprintf(out->url, sizeof(out->url), "%.*s", (int)n, url);
    if (out->method != OSUBD_SUS_HTTP)
        return 0;
    const char *sp = json_string_value(json_object_get(v, "suspend"));
    const char *rp = json_string_value(json_object_get(v, "resume"));
    if (!path_ok(sp) || !path_ok(rp)) {
        snprintf(err, errlen,
                 "method http needs 'suspend.suspend' and 'suspend.resume', paths that start "
                 "with / (at most %d characters)",
                 OSUBD_SUS_PATH_MAX);
        return -1;
    }
    snprintf(out->suspend_path, sizeof(out->suspend_path), "%s", sp);
    snprintf(out->resume_path, sizeof(out->resume_path), "%s", rp);
    return 0;
}

json_t *osubd_sus_spec_json(const struct osubd_sus_spec *s)
{
    json_t *o = json_pack("{s:s}", "method", osubd_sus_method_name(s->method));
    if (o != NULL && s->method != OSUBD_SUS_CUDA && s->url[0])
        json_object_set_new(o, "url", json_string(s->url));
    if (o != NULL && s->method == OSUBD_SUS_HTTP) {
        json_object_set_new(o, "suspend", json_string(s->suspend_path));
        json_object_set_new(o, "resume", json_string(s->resume_path));
    }
    return o;
}

/* ---- the HTTP methods: their steps ----------------------------------------------------------- */

/* What a step's answer must show beyond a 2xx: nothing, or vLLM's {"is_sleeping": B}. */
enum check { CHECK_NONE, CHECK_ASLEEP, CHECK_AWAKE };

struct step {
    const char *method, *path, *body;
    enum check check;
};

static const struct step vllm_suspend[] = {{"POST", "/sleep?level=1&mode=wait", NULL, CHECK_NONE},
                                           {"GET", "/is_sleeping", NULL, CHECK_ASLEEP},
                                           {NULL, NULL, NULL, CHECK_NONE}};
static const struct step vllm_resume[] = {{"POST", "/wake_up", NULL, CHECK_NONE},
                                          {"GET", "/is_sleeping", NULL, CHECK_AWAKE},
                                          {NULL, NULL, NULL, CHECK_NONE}};
/* SGLang's release asserts an idle engine: generation is paused first, continued after */
static const struct step sglang_suspend[] = {
    {"POST", "/pause_generation", "{}", CHECK_NONE},
    {"POST", "/release_memory_occupation", "{}", CHECK_NONE},
    {NULL, NULL, NULL, CHECK_NONE}};
static const struct step sglang_resume[] = {{"POST", "/resume_memory_occupation", "{}", CHECK_NONE},
                                            {"POST", "/continue_generation", "{}", CHECK_NONE},
                                            {NULL, NULL, NULL, CHECK_NONE}};

static struct step http_step(const struct sus_job *j)
{
    struct step st = {"POST", j->resume ? j->spec.resume_path : j->spec.suspend_path, "{}",
                      CHECK_NONE};
    return st;
}

static bool step_at(const struct sus_job *j, int i, struct step *out)
{
    if (j->spec.method == OSUBD_SUS_HTTP) {
        *out = http_step(j);
        return i == 0;
    }
    const struct step *t = j->spec.method == OSUBD_SUS_VLLM
                               ? (j->resume ? vllm_resume : vllm_suspend)
                               : (j->resume ? sglang_resume : sglang_suspend);
    for (int k = 0; k < i; k++)
        if (t[k].method == NULL)
            return false;
    *out = t[i];
    return out->method != NULL;
}

static bool answer_checked(enum check c, const char *body, char *why, size_t whylen)
{
    if (c == CHECK_NONE)
        return true;
    json_t *o = json_loads(body, JSON_DECODE_ANY, NULL);
    json_t *v = json_object_get(o, "is_sleeping");
    bool ok = json_is_boolean(v) && json_is_true(v) == (c == CHECK_ASLEEP);
    if (!ok)
        snprintf(why, whylen, "GET /is_sleeping answered '%.100s', not {\"is_sleeping\": %s}", body,
                 c == CHECK_ASLEEP ? "true" : "false");
    json_decref(o);
    return ok;
}

static void http_next(struct sus_job *j);

static void http_answer(void *arg, int code, const char *body)
{
    struct sus_job *j = arg;
    j->inflight = false;
    j->call = NULL;
    if (j->reported) { /* timed out meanwhile */
        osubd__sus_finish(j, false, NULL);
        return;
    }
    struct step st;
    step_at(j, j->step, &st);
    char why[700];
    if (code < 200 || code > 299) {
        if (code == 0)
            snprintf(why, sizeof(why), "%s %s%s: no answer (the connection was refused or closed)",
                     st.method, j->spec.url, st.path);
        else
            snprintf(why, sizeof(why), "%s %s%s answered HTTP %d%s%.200s", st.method, j->spec.url,
                     st.path, code, body[0] ? ": " : "", body);
        osubd__sus_finish(j, false, why);
        return;
    }
    if (!answer_checked(st.check, body, why, sizeof(why))) {
        osubd__sus_finish(j, false, why);
        return;
    }
    j->step++;
    http_next(j);
}

static void http_next(struct sus_job *j)
{
    struct step st;
    if (!step_at(j, j->step, &st)) {
        osubd__sus_finish(j, true, NULL);
        return;
    }
    char url[OSUBD_SUS_URL_MAX + OSUBD_SUS_PATH_MAX + 2];
    snprintf(url, sizeof(url), "%s%s", j->spec.url, st.path);
    int64_t left = j->deadline_ms - osubd__sus_now_ms();
    struct osubd_httpc_req r = {
        .method = st.method, .url = url, .body = st.body, .timeout_s = (int)(left / 1000) + 1};
    if (osubd_httpc_send(j->s->base, &j->s->dns, &r, http_answer, j, &j->call) != 0) {
        /* reported from the loop, as an answer would be (never from within osubd_sus_start) */
        snprintf(j->why, sizeof(j->why), "%s %.300s: cannot be sent", st.method, url);
        struct timeval now = {0, 0};
        event_del(j->timer);
        evtimer_add(j->timer, &now);
        return;
    }
    j->inflight = true;
}

/* ---- the jobs ---------------------------------------------------------------------------------
 */

static void job_free(struct sus_job *j)
{
    for (struct sus_job **p = &j->s->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    if (j->timer != NULL)
        event_free(j->timer);
    free(j);
}

void osubd__sus_finish(struct sus_job *j, bool ok, const char *why)
{
    if (!j->reported) {
        j->reported = true;
        if (j->timer != NULL)
            event_del(j->timer);
        j->s->done(j->s->arg, j->id, j->resume, ok, ok ? NULL : why);
    }
    if (!j->inflight && !j->has_thread)
        job_free(j);
}

/* Jobs whose worker was left in a driver call that does not return, with what it uses: kept
 * here, never freed (the worker may wake at any time and write its answer). */
static struct sus_job *hung_jobs;

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct sus_job *j = arg;
    char why[300];
    snprintf(why, sizeof(why), "%s did not finish within its time (%s)",
             j->resume ? "the resume" : "the suspend", osubd_sus_method_name(j->spec.method));
    if (j->inflight) { /* the request under way is given up: its answer would come too late */
        osubd_httpc_cancel(j->call);
        j->call = NULL;
        j->inflight = false;
    }
    osubd__sus_finish(j, false, j->spec.method != OSUBD_SUS_CUDA && j->why[0] ? j->why : why);
}

/* A worker finished: its job reported (unless its deadline did already) and freed. */
static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct osubd_sus *s = arg;
    char buf[64];
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
    for (struct sus_job *j = s->jobs, *next; j != NULL; j = next) {
        next = j->next;
        if (!j->has_thread || !atomic_load(&j->finished))
            continue;
        pthread_join(j->thread, NULL);
        j->has_thread = false;
        osubd__sus_finish(j, j->ok, j->why);
    }
}

struct osubd_sus *osubd_sus_new(struct event_base *base, const char *cuda_lib,
                                osubd_sus_done_fn done, void *arg)
{
    struct osubd_sus *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->base = base;
    s->done = done;
    s->arg = arg;
    s->wake[0] = s->wake[1] = -1;
    snprintf(s->cuda_lib, sizeof(s->cuda_lib), "%s", cuda_lib != NULL ? cuda_lib : "");
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0 ||
        (s->wake_ev = event_new(base, s->wake[0], EV_READ | EV_PERSIST, on_wake, s)) == NULL ||
        event_add(s->wake_ev, NULL) != 0) {
        osubd_sus_free(s);
        return NULL;
    }
    return s;
}

void osubd_sus_free(struct osubd_sus *s)
{
    if (s == NULL)
        return;
    while (s->jobs != NULL) {
        struct sus_job *j = s->jobs;
        s->jobs = j->next;
        if (j->has_thread && !atomic_load(&j->finished)) {
            /* a driver call that does not return (a lock across NCCL ranks hangs): the worker
             * is left with its job, the driver and the pipe's end it writes to */
            pthread_detach(j->thread);
            s->hung = true;
            if (j->timer != NULL)
                event_free(j->timer);
            j->timer = NULL;
            j->next = hung_jobs;
            hung_jobs = j;
            continue;
        }
        if (j->has_thread)
            pthread_join(j->thread, NULL);
        j->next = NULL;
        if (j->timer != NULL)
            event_free(j->timer);
        osubd_httpc_cancel(j->call); /* a request under way: dropped, never answered */
        free(j);
    }
    if (s->wake_ev != NULL)
        event_free(s->wake_ev);
    if (s->dns != NULL)
        evdns_base_free(s->dns, 0);
    if (!s->hung) { /* else the worker's byte must find the pipe open, read or not */
        for (int i = 0; i < 2; i++)
            if (s->wake[i] >= 0)
                close(s->wake[i]);
        osubd__sus_cuda_unload(s->cuda);
    }
    free(s);
}

bool osubd_sus_cuda_ok(struct osubd_sus *s, char *why, size_t whylen)
{
    if (!s->cuda_tried) {
        s->cuda_tried = true;
        s->cuda = osubd__sus_cuda_load(s->cuda_lib, s->cuda_why, sizeof(s->cuda_why));
    }
    if (s->cuda == NULL)
        snprintf(why, whylen, "method cuda cannot be used here: %s", s->cuda_why);
    return s->cuda != NULL;
}

bool osubd_sus_cuda_remap_ok(struct osubd_sus *s, char *why, size_t whylen)
{
    if (!osubd_sus_cuda_ok(s, why, whylen))
        return false;
    int v = osubd__sus_cuda_version(s->cuda);
    if (v >= 13000)
        return true;
    snprintf(why, whylen,
             "suspend.relocate cannot be used here: restoring a checkpoint onto another GPU needs "
             "CUDA 13.0 (driver 580) or later, and this driver is CUDA %d.%d",
             v / 1000, v % 1000 / 10);
    return false;
}

int osubd_sus_uuid_bytes(const char *uuid, unsigned char out[16])
{
    if (uuid == NULL)
        return -1;
    if (strncmp(uuid, "GPU-", 4) == 0)
        uuid += 4;
    int nib = 0;
    memset(out, 0, 16);
    for (const char *c = uuid; *c; c++) {
        if (*c == '-')
            continue;
        int x = *c >= '0' && *c <= '9'   ? *c - '0'
                : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10
                : *c >= 'A' && *c <= 'F' ? *c - 'A' + 10
                                         : -1;
        if (x < 0 || nib >= 32)
            return -1;
        out[nib / 2] = (unsigned char)(out[nib / 2] | (x << (nib % 2 ? 0 : 4)));
        nib++;
    }
    return nib == 32 ? 0 : -1;
}

void osubd_sus_cancel(struct osubd_sus *s, const char *id)
{
    for (struct sus_job *j = s->jobs, *next; j != NULL; j = next) {
        next = j->next;
        if (j->reported || strcmp(j->id, id) != 0)
            continue;
        j->reported = true; /* never answered: its service is gone */
        if (j->timer != NULL)
            event_del(j->timer);
        if (j->inflight) {
            osubd_httpc_cancel(j->call);
            j->call = NULL;
            j->inflight = false;
        }
        if (!j->has_thread)
            job_free(j); /* a worker's job is freed when the worker returns */
    }
}

bool osubd_sus_busy(const struct osubd_sus *s, const char *id)
{
    for (const struct sus_job *j = s->jobs; j != NULL; j = j->next)
        if (!j->reported && strcmp(j->id, id) == 0)
            return true;
    return false;
}

bool osubd_sus_busy_suspending(const struct osubd_sus *s, const char *id)
{
    for (const struct sus_job *j = s->jobs; j != NULL; j = j->next)
        if (!j->reported && strcmp(j->id, id) == 0)
            return !j->resume;
    return false;
}

int osubd_sus_start(struct osubd_sus *s, const char *id, bool resume,
                    const struct osubd_sus_spec *spec, const pid_t *pids, int npids, int timeout_ms,
                    char *err, size_t errlen)
{
    err[0] = '\0';
    if (osubd_sus_busy(s, id)) {
        snprintf(err, errlen, "a suspend or resume is under way already");
        return -1;
    }
    if (spec->method == OSUBD_SUS_CUDA) {
        if (!osubd_sus_cuda_ok(s, err, errlen))
            return -1;
        if (npids <= 0) {
            snprintf(err, errlen, "no process is known to checkpoint (method cuda)");
            return -1;
        }
    } else if (spec->method < OSUBD_SUS_VLLM || spec->method > OSUBD_SUS_HTTP) {
        snprintf(err, errlen, "no suspend method");
        return -1;
    }
    struct sus_job *j = calloc(1, sizeof(*j));
    if (j == NULL || (j->timer = evtimer_new(s->base, on_deadline, j)) == NULL) {
        free(j);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    j->s = s;
    snprintf(j->id, sizeof(j->id), "%s", id);
    j->resume = resume;
    j->spec = *spec;
    j->npids = npids < OSUBD_SUS_PIDS_MAX ? npids : OSUBD_SUS_PIDS_MAX;
    if (pids != NULL && j->npids > 0)
        memcpy(j->pids, pids, (size_t)j->npids * sizeof(pid_t));
    if (timeout_ms < 1)
        timeout_ms = 1;
    j->deadline_ms = osubd__sus_now_ms() + timeout_ms;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    j->next = s->jobs;
    s->jobs = j;
    if (evtimer_add(j->timer, &tv) != 0 ||
        (spec->method == OSUBD_SUS_CUDA && osubd__sus_cuda_start(s, j, err, errlen) != 0)) {
        if (err[0] == '\0')
            snprintf(err, errlen, "cannot set a timer");
        job_free(j);
        return -1;
    }
    if (spec->method != OSUBD_SUS_CUDA)
        http_next(j); /* its first request */
    return 0;
}
