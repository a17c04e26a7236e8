/* openloop.c - an open-loop HTTP load generator: requests leave on a fixed schedule whatever
 * has come back (wrk is closed-loop and slows down with the server), each on an idle
 * keep-alive connection or a new one; latency counts from the scheduled time, so queueing
 * in the server shows. Three classes of paths with weights.
 * Usage: bench_openloop HOST PORT RATE SECONDS PATH1:W1 [PATH2:W2 ...]
 * Prints one JSON line: per path sent, 2xx, 429, other (errors included), p50/p99 ms. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <event2/http.h>

#define MAX_PATHS 8
#define MAX_CONNS 4096
#define LAT_SLOTS 6000 /* 10 ms buckets up to 60 s */

struct cls {
    char path[256];
    int weight;
    uint64_t sent, ok, r429, other;
    uint64_t lat[LAT_SLOTS + 1];
};

static struct event_base *base;
static const char *host;
static int port;
static struct cls classes[MAX_PATHS];
static int n_classes, weight_sum;
static struct evhttp_connection *idle[MAX_CONNS];
static int n_idle, n_conns;
static double start, rate, seconds;
static uint64_t scheduled;
static int outstanding;
static int over; /* the schedule has ended */

struct inflight {
    struct cls *c;
    struct evhttp_connection *conn;
    double due;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_done(struct evhttp_request *req, void *arg)
{
    struct inflight *f = arg;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code >= 200 && code < 300)
        f->c->ok++;
    else if (code == 429)
        f->c->r429++;
    else
        f->c->other++;
    long slot = (long)((now_s() - f->due) * 100.0);
    f->c->lat[slot < 0 ? 0 : slot > LAT_SLOTS ? LAT_SLOTS : slot]++;
    if (code != 0 && n_idle < MAX_CONNS)
        idle[n_idle++] = f->conn; /* kept alive */
    else {
        evhttp_connection_free_on_completion(f->conn);
        n_conns--;
    }
    outstanding--;
    free(f);
    if (over && outstanding == 0)
        event_base_loopexit(base, NULL);
}

static void send_one(double due)
{
    /* a fixed pattern over the weights: request k goes to the class its residue falls in */
    int k = (int)(scheduled % (uint64_t)weight_sum), ci = 0;
    while (k >= classes[ci].weight)
        k -= classes[ci++].weight;
    scheduled++;
    struct cls *c = &classes[ci];
    struct evhttp_connection *conn = n_idle > 0 ? idle[--n_idle] : NULL;
    if (conn == NULL) {
        if (n_conns >= MAX_CONNS) {
            c->sent++;
            c->other++; /* the generator itself is out of connections: counted, not hidden */
            return;
        }
        conn = evhttp_connection_base_new(base, NULL, host, (unsigned short)port);
        evhttp_connection_set_timeout(conn, 60);
        n_conns++;
    }
    struct inflight *f = malloc(sizeof(*f));
    f->c = c;
    f->conn = conn;
    f->due = due;
    struct evhttp_request *req = evhttp_request_new(on_done, f);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", "bench");
    c->sent++;
    outstanding++;
    if (evhttp_make_request(conn, req, EVHTTP_REQ_GET, c->path) != 0) {
        c->other++;
        outstanding--;
        free(f);
    }
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct event *self = arg;
    double t = now_s() - start;
    if (t >= seconds) {
        event_del(self);
        over = 1;
        struct timeval grace = {65, 0}; /* the last answers, at most the timeout */
        event_base_loopexit(base, outstanding == 0 ? NULL : &grace);
        return;
    }
    while ((double)scheduled < t * rate)
        send_one(start + (double)scheduled / rate);
}

static double pct(const struct cls *c, double q)
{
    uint64_t total = 0;
    for (int i = 0; i <= LAT_SLOTS; i++)
        total += c->lat[i];
    uint64_t want = (uint64_t)ceil(q * (double)total), seen = 0;
    for (int i = 0; i <= LAT_SLOTS; i++) {
        seen += c->lat[i];
        if (total > 0 && seen >= want)
            return (i + 1) * 10.0;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: bench_openloop HOST PORT RATE SECONDS PATH:WEIGHT...\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    rate = atof(argv[3]);
    seconds = atof(argv[4]);
    for (int i = 5; i < argc && n_classes < MAX_PATHS; i++) {
        char *colon = strrchr(argv[i], ':');
        if (colon == NULL || rate <= 0 || seconds <= 0) {
            fprintf(stderr, "bench_openloop: '%s' is not PATH:WEIGHT\n", argv[i]);
            return 2;
        }
        *colon = '\0';
        snprintf(classes[n_classes].path, sizeof(classes[n_classes].path), "%s", argv[i]);
        classes[n_classes].weight = atoi(colon + 1);
        weight_sum += classes[n_classes].weight;
        n_classes++;
    }
    if (weight_sum <= 0) {
        fprintf(stderr, "bench_openloop: the weights add up to nothing\n");
        return 2;
    }
    base = event_base_new();
    struct event *tick = event_new(base, -1, EV_PERSIST, on_tick, event_self_cbarg());
    struct timeval tv = {0, 1000};
    start = now_s();
    event_add(tick, &tv);
    event_base_dispatch(base); /* ends when the schedule is over and every answer is in */
    printf("{\"rate\": %.0f, \"seconds\": %.0f, \"paths\": [", rate, seconds);
    for (int i = 0; i < n_classes; i++) {
        const struct cls *c = &classes[i];
        printf(
            "%s{\"path\": \"%s\", \"sent\": %llu, \"2xx\": %llu, \"429\": %llu, \"other\": %llu, "
            "\"p50_ms\": %.0f, \"p99_ms\": %.0f}",
            i ? ", " : "", c->path, (unsigned long long)c->sent, (unsigned long long)c->ok,
            (unsigned long long)c->r429, (unsigned long long)c->other, pct(c, 0.5), pct(c, 0.99));
    }
    printf("]}\n");
    event_free(tick);
    event_base_free(base);
    return 0;
}
