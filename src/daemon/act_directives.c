/* act_directives.c - directives: the per-service ring, long polls and webhooks (their own timed,
 * allowlisted HTTP client) */
#define _GNU_SOURCE
#include "act.h"
#include "httpc.h"

/* ---- directives ----------------------------------------------------------------------- */

struct hook {
    struct osubd_act *d;
    char id[OSUB_ID_MAX + 1];
    char *url, *body;
    int attempt;
    int64_t seq;
    struct event *timer;
};

static void hook_send(struct hook *h);

static void hook_free(struct hook *h)
{
    if (h->timer)
        event_free(h->timer);
    free(h->url);
    free(h->body);
    free(h);
}

static void hook_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    hook_send(arg);
}

static void hook_done(void *arg, int code, const char *body)
{
    (void)body;
    struct hook *h = arg;
    if (code >= 200 && code < 300) {
        hook_free(h);
        return;
    }
    if (++h->attempt >= HOOK_ATTEMPTS) {
        h->d->webhook_failures++;
        osubd_warn(h->d->core, h->id, "directive", "webhook_failed",
                   "directive %lld for %s could not be delivered to %s after %d attempts (last: "
                   "%s%d); it stays available at GET /v1/services/%s/directives",
                   (long long)h->seq, h->id, h->url, HOOK_ATTEMPTS, code ? "HTTP " : "no answer, ",
                   code, h->id);
        hook_free(h);
        return;
    }
    if (h->timer == NULL)
        h->timer = evtimer_new(h->d->base, hook_retry, h);
    int64_t ms = 250LL << h->attempt; /* 0.5 s, 1 s, 2 s */
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (h->timer == NULL || evtimer_add(h->timer, &tv) != 0)
        hook_free(h);
}

static void hook_send(struct hook *h)
{
    /* signed with the service's token: the receiver can tell oversubd from anyone */
    char tok[65], sig[160];
    osubd_service_token(h->d->core, h->id, tok);
    osubd_sign(tok, (long long)(osubd_unix_ms() / 1000), h->body, strlen(h->body), sig,
               sizeof(sig));
    struct osubd_httpc_req r = {.method = "POST",
                                .url = h->url,
                                .body = h->body,
                                .signature = sig,
                                .timeout_s = HOOK_TIMEOUT_S};
    if (osubd_httpc_send(h->d->base, &h->d->dns, &r, hook_done, h, NULL) != 0) {
        h->attempt = HOOK_ATTEMPTS - 1; /* it cannot be sent: no retries */
        hook_done(h, 0, "");
    }
}

/* A directive as the service sees it, remaining_ms computed now. New reference (NULL: out of
 * memory). */
static json_t *directive_view(const struct osubd_act *d, const struct act_directive *dir)
{
    json_t *o = json_pack("{s:I, s:s, s:s, s:I, s:i, s:s, s:s}", "seq", (json_int_t)dir->seq,
                          "action", dir->action, "service", dir->service, "vram_mib",
                          (json_int_t)dir->vram_mib, "batch_size", dir->batch_size, "reason",
                          osub_reason_name(dir->reason), "message", dir->message);
    if (o == NULL)
        return NULL;
    if (dir->deadline_unix_ms > 0) {
        json_object_set_new(o, "deadline_unix_ms", json_integer(dir->deadline_unix_ms));
        int64_t left = dir->deadline_unix_ms - osubd_now(d->core);
        json_object_set_new(o, "remaining_ms", json_integer(left > 0 ? left : 0));
    }
    if (dir->checkpoint[0])
        json_object_set_new(o, "checkpoint", json_string(dir->checkpoint));
    if (dir->checkpoint_dir[0])
        json_object_set_new(o, "checkpoint_dir", json_string(dir->checkpoint_dir));
    return o;
}

/* A service's last directives, oldest first: i from 0 to ring->n - 1. */
static const struct act_directive *ring_at(const struct act_ring *r, size_t i)
{
    assert(i < r->n);
    return &r->dir[(r->first + i) % DIRECTIVES_KEPT];
}

/* Keeps dir as the service's newest directive (the oldest goes past DIRECTIVES_KEPT). */
static int ring_push(struct osubd_act *d, const struct act_directive *dir)
{
    struct act_ring *r = osubd__idmap_get(d->directives, dir->service);
    if (r == NULL) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || osubd__idmap_put(d->directives, dir->service, r) != 0) {
            free(r);
            return -1;
        }
    }
    if (r->n == DIRECTIVES_KEPT) {
        r->first = (r->first + 1) % DIRECTIVES_KEPT;
        r->n--;
    }
    r->dir[(r->first + r->n) % DIRECTIVES_KEPT] = *dir;
    r->n++;
    return 0;
}

static void waiter_reply(struct act_waiter *w, bool only_new);

void osubd__act_waiter_free(struct osubd_act *d, struct act_waiter *w)
{
    for (struct act_waiter **pp = &d->act_waiters; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    if (w->timer)
        event_free(w->timer);
    osubd_client_unwatch(&w->watch);
    free(w);
}

void osubd__act_post_directive(struct osubd_act *d, const osub_event_t *ev, const char *action)
{
    struct act_directive *dir = calloc(1, sizeof(*dir));
    if (dir == NULL) {
        osubd_fatal(d->core, "out of memory keeping a directive");
        return;
    }
    dir->seq = ++d->directive_seq;
    snprintf(dir->action, sizeof(dir->action), "%s", action);
    snprintf(dir->service, sizeof(dir->service), "%s", ev->service);
    dir->vram_mib = ev->vram_mib;
    dir->batch_size = ev->batch_size;
    dir->reason = ev->reason;
    snprintf(dir->message, sizeof(dir->message), "%s", ev->msg);
    static const char *const actions[] = {"degrade", "restore", "evict", "resume"};
    for (int i = 0; i < 4; i++)
        if (strcmp(action, actions[i]) == 0)
            d->directives_sent[i]++;
    if (ev->deadline_ms > 0)
        dir->deadline_unix_ms = osubd_engine_to_unix(d->core, ev->deadline_ms);
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, ev->service, &si) == 0 && si.checkpoint[0])
        snprintf(dir->checkpoint, sizeof(dir->checkpoint), "%s", si.checkpoint);
    json_t *x = json_object_get(d->execs, ev->service);
    if (json_object_get(x, "command") != NULL)
        osubd__act_checkpoint_dir(d, ev->service, dir->checkpoint_dir, sizeof(dir->checkpoint_dir));
    if (ring_push(d, dir) != 0) {
        free(dir);
        osubd_fatal(d->core, "out of memory keeping a directive");
        return;
    }
    /* the long-polls of that service */
    for (struct act_waiter *w = d->act_waiters, *next; w; w = next) {
        next = w->next;
        if (strcmp(w->id, ev->service) == 0)
            waiter_reply(w, true);
    }
    if (d->on_directive != NULL)
        d->on_directive(d->on_directive_arg, ev->service, action, ev->cause);
    const char *url = json_string_value(json_object_get(x, "control_url"));
    if (url != NULL) {
        struct hook *h = calloc(1, sizeof(*h));
        json_t *view = directive_view(d, dir);
        if (h != NULL) {
            h->d = d;
            snprintf(h->id, sizeof(h->id), "%s", ev->service);
            h->url = strdup(url);
            h->body = osubd_json_dumps(view, JSON_COMPACT);
            h->seq = dir->seq;
            if (h->url && h->body)
                hook_send(h);
            else
                hook_free(h);
        }
        json_decref(view);
    }
    free(dir);
}

static void send_json(struct evhttp_request *req, int code, json_t *body)
{
    struct evbuffer *b = evbuffer_new();
    char *text = body ? osubd_json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (b == NULL || text == NULL || evbuffer_add(b, text, strlen(text)) != 0 ||
        evbuffer_add(b, "\n", 1) != 0) {
        free(text);
        if (b != NULL)
            evbuffer_free(b);
        evhttp_send_reply(req, 503, "Service Unavailable", NULL); /* out of memory */
        return;
    }
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, code, code == 200 ? "OK" : code == 404 ? "Not Found" : "Bad Request", b);
    evbuffer_free(b);
}

/* Answers w with the directives after w->after (none: only when !only_new) and frees it. */
static void waiter_reply(struct act_waiter *w, bool only_new)
{
    struct osubd_act *d = w->d;
    json_t *out = json_array();
    const struct act_ring *r = osubd__idmap_get(d->directives, w->id);
    for (size_t i = 0; r != NULL && i < r->n; i++)
        if (ring_at(r, i)->seq > w->after)
            json_array_append_new(out, directive_view(d, ring_at(r, i)));
    if (only_new && json_array_size(out) == 0) {
        json_decref(out);
        return;
    }
    evhttp_connection_set_closecb(evhttp_request_get_connection(w->req), NULL, NULL);
    osub_service_info_t si;
    const char *state =
        osub_engine_service_info(d->e, w->id, &si) == 0 ? osub_state_name(si.state) : "released";
    send_json(w->req, 200,
              json_pack("{s:o, s:s, s:I}", "directives", out, "state", state, "last_seq",
                        (json_int_t)d->directive_seq));
    osubd__act_waiter_free(d, w);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    waiter_reply(arg, false);
}

static void waiter_gone(struct evhttp_connection *c, void *arg)
{
    (void)c;
    struct act_waiter *w = arg;
    osubd__act_waiter_free(w->d, w);
}

static int64_t query_int(const char *query, const char *key, int64_t dflt, bool *bad)
{
    struct evkeyvalq q;
    TAILQ_INIT(&q);
    int64_t v = dflt;
    if (query != NULL && evhttp_parse_query_str(query, &q) == 0) {
        const char *s = evhttp_find_header(&q, key);
        if (s != NULL) {
            char *end;
            errno = 0;
            long long x = strtoll(s, &end, 10);
            if (*s == '\0' || *end != '\0' || errno != 0 || x < 0)
                *bad = true;
            else
                v = x;
        }
    }
    evhttp_clear_headers(&q);
    return v;
}

void osubd_act_directives(struct osubd_act *d, struct evhttp_request *req, const char *id,
                          const char *query)
{
    bool bad = false;
    int64_t wait = query_int(query, "wait", 0, &bad);
    int64_t after = query_int(query, "after", 0, &bad);
    if (bad || wait > 60) {
        send_json(req, 400,
                  json_pack("{s:{s:s, s:s}}", "error", "code", "invalid_argument", "message",
                            "wait is 0 to 60 seconds, after a directive's seq (0 or more)"));
        return;
    }
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0 &&
        osubd__idmap_get(d->directives, id) == NULL) {
        send_json(req, 404,
                  json_pack("{s:{s:s, s:s}}", "error", "code", "unknown_service", "message",
                            "no such service"));
        return;
    }
    struct act_waiter *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    w->d = d;
    w->req = req;
    w->after = after;
    snprintf(w->id, sizeof(w->id), "%s", id);
    w->next = d->act_waiters;
    d->act_waiters = w;
    bool fresh = false;
    const struct act_ring *r = osubd__idmap_get(d->directives, id);
    for (size_t i = 0; r != NULL && i < r->n; i++)
        fresh = fresh || ring_at(r, i)->seq > after;
    if (wait == 0 || fresh) {
        waiter_reply(w, false);
        return;
    }
    w->timer = evtimer_new(d->base, waiter_timeout, w);
    struct timeval tv = {(time_t)wait, 0};
    if (w->timer == NULL || evtimer_add(w->timer, &tv) != 0) {
        waiter_reply(w, false);
        return;
    }
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), waiter_gone, w);
    osubd_client_watch(&w->watch, d->base, req, &d->waiters_gone);
}
