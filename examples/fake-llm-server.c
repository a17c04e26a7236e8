/* fake-llm-server.c - an example inference service for oversub: an HTTP stand-in for an LLM
 * server that obeys oversubd's directives.
 *
 *   fake-llm-server --port P [--load-ms MS] [--base-mib M] [--seq-mib M] [--token-ms MS]
 *                   [--ignore-directives] [--ignore-sigterm] [--spawn-child FILE]
 *
 * - Serves any path: ?tokens=N (default 16) answers after N x token-ms with a JSON body; at most
 *   batch-size requests run at once (continuous batching: the in-flight count is the batch), the
 *   rest wait in order.
 * - "Uses" VRAM: base-mib + seq-mib x (batch size + in flight) / 2, reported to oversubd
 *   (PUT .../usage) whenever it changes.
 * - Reports ready (with its PID) after load-ms, as a model that finished loading, and registers
 *   itself as the service's backend for oversubd's gateway (PUT .../backends).
 * - Long-polls GET .../directives: degrade -> smaller batch, usage reported, then POST .../ack;
 *   restore -> its batch back; evict (or SIGTERM) -> refuses new work, finishes what is in
 *   flight, writes a checkpoint, POSTs it in an ack and exits 0.
 * - For tests: --ignore-directives never acknowledges nor leaves; --ignore-sigterm ignores
 *   SIGTERM; --spawn-child FILE starts a child process (its PID in FILE) that lives as long as
 *   it is not killed, as a server's worker would. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <sys/queue.h>
#include <jansson.h>

#include "osub_example.h"

struct pending {
    struct pending *next;
    struct evhttp_request *req;
    long tokens;
};

static struct {
    struct event_base *base;
    struct osx_env env;
    long load_ms, base_mib, seq_mib, token_ms;
    bool ignore_directives, ignore_sigterm;
    long batch, full_batch, inflight;
    long served;
    long reported;
    bool ready, draining;
    long long after;
    struct pending *queue_head, *queue_tail;
    size_t queued;
    struct evhttp_connection *ctl;
    char host[256];
    char host_port[300]; /* the Host header: oversubd refuses one that is not its address */
    int port;
    int listen_port;
} S;

static long used_mib(void)
{
    return S.base_mib + S.seq_mib * (S.batch + S.inflight) / 2;
}

static void ctl_done(struct evhttp_request *req, void *arg)
{
    (void)arg;
    (void)req;
}

/* A call to oversubd's control API on the kept connection (answers are not waited for). */
static void ctl_send(enum evhttp_cmd_type m, const char *what, const char *body)
{
    if (S.ctl == NULL)
        return;
    struct evhttp_request *req = evhttp_request_new(ctl_done, NULL);
    if (req == NULL)
        return;
    char path[256], auth[128];
    snprintf(path, sizeof(path), "/v1/services/%s/%s", S.env.service, what);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", S.host_port);
    evhttp_add_header(h, "Content-Type", "application/json");
    if (S.env.token) {
        snprintf(auth, sizeof(auth), "Bearer %s", S.env.token);
        evhttp_add_header(h, "Authorization", auth);
    }
    evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    evhttp_make_request(S.ctl, req, m, path);
}

static void report_usage(void)
{
    long u = used_mib();
    if (u == S.reported || S.env.control_url == NULL)
        return;
    S.reported = u;
    char body[64];
    snprintf(body, sizeof(body), "{\"vram_mib\": %ld}", u);
    ctl_send(EVHTTP_REQ_PUT, "usage", body);
}

static void checkpoint_and_exit(void);

static void finish(evutil_socket_t fd, short what, void *arg);

static void start_next(void)
{
    while (!S.draining && S.inflight < S.batch && S.queue_head != NULL) {
        struct pending *p = S.queue_head;
        S.queue_head = p->next;
        if (S.queue_head == NULL)
            S.queue_tail = NULL;
        S.queued--;
        S.inflight++;
        long ms = p->tokens * S.token_ms;
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        event_base_once(S.base, -1, EV_TIMEOUT, finish, p, &tv);
    }
    report_usage();
}

static void sent_last(struct evhttp_request *req, void *arg)
{
    (void)req;
    (void)arg;
    checkpoint_and_exit();
}

static void finish(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct pending *p = arg;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"tokens\": %ld, \"batch\": %ld, \"service\": \"%s\"}\n", p->tokens,
                        S.batch, S.env.service ? S.env.service : "");
    evhttp_add_header(evhttp_request_get_output_headers(p->req), "Content-Type",
                      "application/json");
    S.inflight--;
    S.served++;
    bool last = S.draining && S.inflight == 0;
    if (last) /* leave once the last answer is out, not merely queued */
        evhttp_request_set_on_complete_cb(p->req, sent_last, NULL);
    evhttp_send_reply(p->req, 200, "OK", b);
    evbuffer_free(b);
    free(p);
    if (!last)
        start_next();
}

static void on_request(struct evhttp_request *req, void *arg)
{
    (void)arg;
    if (S.draining || !S.ready || S.queued >= 1024) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        evhttp_send_error(req, 503, S.draining ? "draining" : S.ready ? "busy" : "loading");
        return;
    }
    long tokens = 16;
    const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
    struct evkeyvalq kv;
    TAILQ_INIT(&kv);
    if (q != NULL && evhttp_parse_query_str(q, &kv) == 0) {
        const char *t = evhttp_find_header(&kv, "tokens");
        if (t != NULL) {
            tokens = strtol(t, NULL, 10);
            if (tokens < 0 || tokens > 100000)
                tokens = 16;
        }
    }
    evhttp_clear_headers(&kv);
    struct pending *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    p->req = req;
    p->tokens = tokens;
    if (S.queue_tail)
        S.queue_tail->next = p;
    else
        S.queue_head = p;
    S.queue_tail = p;
    S.queued++;
    start_next();
}

static void checkpoint_and_exit(void)
{
    char ck[4096] = "";
    if (S.env.checkpoint_dir != NULL) {
        snprintf(ck, sizeof(ck), "%s/served", S.env.checkpoint_dir);
        char text[64];
        snprintf(text, sizeof(text), "served=%ld\n", S.served);
        if (osx_write_atomic(ck, text) != 0) {
            osx_log("fake-llm-server: cannot write %s: %s", ck, strerror(errno));
            ck[0] = '\0';
        }
    }
    if (S.env.control_url != NULL) {
        char path[256], body[4200];
        snprintf(path, sizeof(path), "/v1/services/%s/ack", S.env.service);
        snprintf(body, sizeof(body), ck[0] ? "{\"checkpoint\": \"%s\"}" : "{}", ck);
        int st = osx_http(S.env.control_url, "POST", path, S.env.token, body, 5, NULL, 0);
        osx_log("fake-llm-server: checkpoint %s reported (HTTP %d)", ck[0] ? ck : "(none)", st);
    }
    osx_log("fake-llm-server: served %ld request(s); exiting", S.served);
    exit(0);
}

static void begin_drain(const char *why)
{
    if (S.draining)
        return;
    S.draining = true;
    osx_log("fake-llm-server: draining (%s): %ld in flight, %zu queued refused", why, S.inflight,
            S.queued);
    while (S.queue_head != NULL) {
        struct pending *p = S.queue_head;
        S.queue_head = p->next;
        evhttp_send_error(p->req, 503, "draining");
        free(p);
    }
    S.queue_tail = NULL;
    S.queued = 0;
    if (S.inflight == 0)
        checkpoint_and_exit();
}

static void handle(json_t *dir)
{
    const char *action = json_string_value(json_object_get(dir, "action"));
    long batch = (long)json_integer_value(json_object_get(dir, "batch_size"));
    osx_log("fake-llm-server: directive %lld: %s (batch %ld, vram %lld MiB)",
            (long long)json_integer_value(json_object_get(dir, "seq")), action ? action : "?",
            batch, (long long)json_integer_value(json_object_get(dir, "vram_mib")));
    if (S.ignore_directives || action == NULL)
        return;
    if (strcmp(action, "degrade") == 0) {
        S.batch = batch > 0 ? batch : (S.batch > 1 ? S.batch / 2 : 1);
        report_usage();
        ctl_send(EVHTTP_REQ_POST, "ack", "{}");
    } else if (strcmp(action, "restore") == 0) {
        S.batch = batch > 0 ? batch : S.full_batch;
        start_next();
    } else if (strcmp(action, "evict") == 0) {
        begin_drain("evicted");
    }
}

static void poll_directives(void);

static void poll_again(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    poll_directives();
}

static void on_directives(struct evhttp_request *req, void *arg)
{
    (void)arg;
    struct timeval tv = {0, 0};
    if (req == NULL || evhttp_request_get_response_code(req) != 200) {
        tv.tv_usec = 500000; /* oversubd away or restarting: try again soon */
    } else {
        struct evbuffer *b = evhttp_request_get_input_buffer(req);
        size_t n = evbuffer_get_length(b);
        char *text = malloc(n + 1);
        if (text != NULL) {
            evbuffer_copyout(b, text, n);
            text[n] = '\0';
            json_t *j = json_loads(text, 0, NULL);
            size_t i;
            json_t *dir;
            json_array_foreach(json_object_get(j, "directives"), i, dir)
            {
                long long seq = json_integer_value(json_object_get(dir, "seq"));
                if (seq > S.after) {
                    S.after = seq;
                    handle(dir);
                }
            }
            json_decref(j);
            free(text);
        }
    }
    event_base_once(S.base, -1, EV_TIMEOUT, poll_again, NULL, &tv);
}

static void poll_directives(void)
{
    /* a connection of its own: the long-poll must not hold up usage reports */
    struct evhttp_connection *c =
        evhttp_connection_base_new(S.base, NULL, S.host, (uint16_t)S.port);
    struct evhttp_request *req = c ? evhttp_request_new(on_directives, NULL) : NULL;
    if (req == NULL) {
        if (c)
            evhttp_connection_free(c);
        struct timeval tv = {1, 0};
        event_base_once(S.base, -1, EV_TIMEOUT, poll_again, NULL, &tv);
        return;
    }
    evhttp_connection_set_timeout(c, 40);
    evhttp_connection_free_on_completion(c);
    char path[300];
    snprintf(path, sizeof(path), "/v1/services/%s/directives?wait=20&after=%lld", S.env.service,
             S.after);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", S.host_port);
    evhttp_make_request(c, req, EVHTTP_REQ_GET, path);
}

static void on_loaded(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    S.ready = true;
    osx_log("fake-llm-server: loaded; batch %ld, %ld MiB", S.batch, used_mib());
    char body[96];
    snprintf(body, sizeof(body), "{\"backends\": [\"http://127.0.0.1:%d\"]}", S.listen_port);
    ctl_send(EVHTTP_REQ_PUT, "backends", body); /* the gateway reaches it here */
    snprintf(body, sizeof(body), "{\"pid\": %d}", (int)getpid());
    report_usage();
    ctl_send(EVHTTP_REQ_POST, "ready", body);
}

static void on_term(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    if (S.ignore_sigterm) {
        osx_log("fake-llm-server: SIGTERM ignored (--ignore-sigterm)");
        return;
    }
    begin_drain("SIGTERM");
}

static void usage(FILE *f)
{
    fprintf(f, "usage: fake-llm-server --port P [--load-ms MS] [--base-mib M] [--seq-mib M]\n"
               "                       [--token-ms MS] [--ignore-directives] [--ignore-sigterm]\n"
               "                       [--spawn-child PIDFILE]\n"
               "  an oversub example: an LLM server stand-in; see examples/README.md\n");
}

int main(int argc, char **argv)
{
    long port = -1;
    const char *child_file = NULL;
    S.load_ms = 500;
    S.base_mib = 4096;
    S.seq_mib = 512;
    S.token_ms = 5;
    S.reported = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--ignore-directives") == 0) {
            S.ignore_directives = true;
            continue;
        }
        if (strcmp(a, "--ignore-sigterm") == 0) {
            S.ignore_sigterm = true;
            continue;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        char *end;
        long x = strtol(v, &end, 10);
        bool num = *end == '\0' && v[0] != '\0' && x >= 0;
        if (strcmp(a, "--spawn-child") == 0)
            child_file = v;
        else if (strcmp(a, "--port") == 0 && num && x <= 65535)
            port = x;
        else if (strcmp(a, "--load-ms") == 0 && num)
            S.load_ms = x;
        else if (strcmp(a, "--base-mib") == 0 && num)
            S.base_mib = x;
        else if (strcmp(a, "--seq-mib") == 0 && num)
            S.seq_mib = x;
        else if (strcmp(a, "--token-ms") == 0 && num)
            S.token_ms = x;
        else {
            fprintf(stderr, "fake-llm-server: bad option %s %s\n", a, v);
            usage(stderr);
            return 2;
        }
    }
    if (port < 0) {
        usage(stderr);
        return 2;
    }
    osx_env_read(&S.env);
    S.batch = S.full_batch = S.env.batch_size > 0 ? S.env.batch_size : 8;
    if (child_file != NULL) {
        pid_t c = fork();
        if (c == 0) {
            signal(SIGTERM, SIG_IGN); /* a worker that outlives a polite stop */
            for (;;)
                pause();
        }
        FILE *f = fopen(child_file, "w");
        if (f) {
            fprintf(f, "%d\n", (int)c);
            fclose(f);
        }
    }
    signal(SIGPIPE, SIG_IGN);
    S.base = event_base_new();
    struct evhttp *http = evhttp_new(S.base);
    if (S.base == NULL || http == NULL ||
        evhttp_bind_socket(http, "127.0.0.1", (uint16_t)port) != 0) {
        osx_log("fake-llm-server: cannot listen on 127.0.0.1:%ld: %s", port, strerror(errno));
        return 1;
    }
    evhttp_set_gencb(http, on_request, NULL);
    S.listen_port = (int)port;
    struct event *term = evsignal_new(S.base, SIGTERM, on_term, NULL);
    event_add(term, NULL);
    if (S.env.control_url != NULL && S.env.service != NULL) {
        const char *h = S.env.control_url + 7;
        const char *colon = strrchr(h, ':');
        snprintf(S.host, sizeof(S.host), "%.*s", colon ? (int)(colon - h) : (int)strlen(h), h);
        S.port = colon ? atoi(colon + 1) : 80;
        snprintf(S.host_port, sizeof(S.host_port), "%s:%d", S.host, S.port);
        S.ctl = evhttp_connection_base_new(S.base, NULL, S.host, (uint16_t)S.port);
        evhttp_connection_set_retries(S.ctl, 3);
        poll_directives();
    }
    osx_log("fake-llm-server: %s on 127.0.0.1:%ld, loading for %ld ms",
            S.env.service ? S.env.service : "(no service)", port, S.load_ms);
    struct timeval tv = {S.load_ms / 1000, (S.load_ms % 1000) * 1000};
    event_base_once(S.base, -1, EV_TIMEOUT, on_loaded, NULL, &tv);
    event_base_dispatch(S.base);
    return 0;
}
