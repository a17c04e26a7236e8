/* streams.c - concurrent server-sent-event streams through a proxy: C connections, each asking
 * for one stream after another (keep-alive) for a duration; the time to the first byte of each
 * answer (its head) and to its end, the events received, the streams completed.
 * Usage: bench_streams HOST PORT PATH[,PATH...] CONNS SECONDS   (connection i asks the i-th
 * path, round robin: several services behind one proxy)
 * Prints one JSON line: streams, events, errors, ttfb p50/p99 ms, stream p50/p99 ms, and
 * held_peak: the most streams open at once (their head in, their end not yet), and wave
 * p50/p99/max ms: the first byte of each connection's first stream (the opening burst). */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#define LAT_SLOTS 100000 /* 0.1 ms buckets up to 10 s */

static struct event_base *base;
#define PATHS_MAX 16
static const char *host, *paths[PATHS_MAX];
static int n_paths;
static int open_now, held_peak; /* streams whose head came and whose end did not yet */
static int port;
static double t_end;
static uint64_t streams, events, errors;
static int active; /* connections still asking */
static uint64_t ttfb_h[LAT_SLOTS + 1], total_h[LAT_SLOTS + 1];
static uint64_t wave_h[LAT_SLOTS + 1]; /* the first stream of each connection: the opening burst */

struct conn {
    struct evhttp_connection *ec;
    const char *path;
    double t0;
    bool got_head;
    bool asked_before; /* its first stream is the opening burst's */
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void observe(uint64_t *h, double s)
{
    long i = (long)(s * 10000.0);
    h[i < 0 ? 0 : i > LAT_SLOTS ? LAT_SLOTS : i]++;
}

static double pct(const uint64_t *h, double p)
{
    uint64_t n = 0, c = 0;
    for (int i = 0; i <= LAT_SLOTS; i++)
        n += h[i];
    for (int i = 0; i <= LAT_SLOTS; i++) {
        c += h[i];
        if (n > 0 && (double)c >= p * (double)n)
            return i / 10.0;
    }
    return 0;
}

static void ask(struct conn *c);

static int on_head(struct evhttp_request *req, void *arg)
{
    struct conn *c = arg;
    (void)req;
    if (!c->got_head) {
        c->got_head = true;
        if (++open_now > held_peak)
            held_peak = open_now;
        observe(ttfb_h, now() - c->t0);
        if (!c->asked_before)
            observe(wave_h, now() - c->t0);
    }
    return 0;
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
    (void)arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    char buf[4096];
    while (n > 0) {
        size_t k = n < sizeof(buf) ? n : sizeof(buf);
        evbuffer_remove(in, buf, k);
        for (size_t i = 0; i + 5 < k; i++)
            if (memcmp(buf + i, "data:", 5) == 0)
                events++;
        n -= k;
    }
}

static void on_done(struct evhttp_request *req, void *arg)
{
    struct conn *c = arg;
    if (c->got_head)
        open_now--;
    c->asked_before = true;
    if (req == NULL || evhttp_request_get_response_code(req) != 200) {
        errors++;
    } else {
        streams++;
        observe(total_h, now() - c->t0);
    }
    if (now() < t_end)
        ask(c);
    else if (--active == 0)
        event_base_loopexit(base, NULL);
}

static void ask(struct conn *c)
{
    struct evhttp_request *req = evhttp_request_new(on_done, c);
    evhttp_request_set_header_cb(req, on_head);
    evhttp_request_set_chunked_cb(req, on_chunk);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", host);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Accept", "text/event-stream");
    c->t0 = now();
    c->got_head = false;
    if (evhttp_make_request(c->ec, req, EVHTTP_REQ_GET, c->path) != 0)
        errors++;
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    event_base_loopexit(base, NULL);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: bench_streams HOST PORT PATH[,PATH...] CONNS SECONDS\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    for (char *p = argv[3], *save = NULL, *t; n_paths < PATHS_MAX && (t = strtok_r(p, ",", &save));
         p = NULL)
        paths[n_paths++] = t;
    if (n_paths == 0) {
        fprintf(stderr, "bench_streams: no path\n");
        return 2;
    }
    int nconn = atoi(argv[4]);
    double secs = atof(argv[5]);
    base = event_base_new();
    struct conn *cs = calloc((size_t)nconn, sizeof(*cs));
    t_end = now() + secs;
    for (int i = 0; i < nconn; i++) {
        cs[i].ec = evhttp_connection_base_new(base, NULL, host, (uint16_t)port);
        evhttp_connection_set_timeout(cs[i].ec, 30);
        cs[i].path = paths[i % n_paths];
        ask(&cs[i]);
        active++;
    }
    struct timeval tv = {(time_t)secs + 15, 0}; /* the streams under way end, then we stop */
    struct event *stop = evtimer_new(base, on_stop, NULL);
    evtimer_add(stop, &tv);
    event_base_dispatch(base);
    printf("{\"streams\": %llu, \"events\": %llu, \"errors\": %llu, \"streams_per_s\": %.1f, "
           "\"ttfb_p50_ms\": %.1f, \"ttfb_p99_ms\": %.1f, \"stream_p50_ms\": %.1f, "
           "\"stream_p99_ms\": %.1f, \"held_peak\": %d, \"wave_p50_ms\": %.1f, "
           "\"wave_p99_ms\": %.1f, \"wave_max_ms\": %.1f}\n",
           (unsigned long long)streams, (unsigned long long)events, (unsigned long long)errors,
           (double)streams / secs, pct(ttfb_h, 0.5), pct(ttfb_h, 0.99), pct(total_h, 0.5),
           pct(total_h, 0.99), held_peak, pct(wave_h, 0.5), pct(wave_h, 0.99), pct(wave_h, 1.0));
    return 0;
}
