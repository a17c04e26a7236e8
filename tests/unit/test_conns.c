/* test_conns.c - the API's connection caps (src/daemon/conns.c) on a real evhttp server bound
 * to a loopback port the OS picks: a client over its cap, and any client over the total, is
 * answered 503 and closed; a connection that closed makes room again; a parked request whose
 * client left is noticed and its connection freed. Every wait runs the event loop until the
 * event in question (a guard timer fails the test instead of hanging). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "conns.h"

struct server {
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    struct osubd_conns *conns;
    int port;
    /* the parked request */
    struct osubd_client_watch watch;
    bool parked, closed;
    uint64_t gone;
};

static void on_request(struct evhttp_request *req, void *arg);

static struct server *serve(int per_client, int total)
{
    struct server *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    s->base = event_base_new();
    assert_non_null(s->base);
    s->http = evhttp_new(s->base);
    assert_non_null(s->http);
    s->conns = osubd_conns_new(s->base, s->http, per_client, total, "test");
    assert_non_null(s->conns);
    s->bound = evhttp_bind_socket_with_handle(s->http, "127.0.0.1", 0);
    assert_non_null(s->bound);
    osubd_conns_listen(s->conns, s->bound);
    evhttp_set_gencb(s->http, on_request, s);
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    assert_int_equal(
        getsockname((int)evhttp_bound_socket_get_fd(s->bound), (struct sockaddr *)&sa, &sl), 0);
    s->port = ntohs(sa.sin_port);
    assert_true(s->port > 0);
    return s;
}

static void unserve(struct server *s)
{
    /* the accept guard is the process's: it goes before its listener does */
    osubd_listener_unguard(evhttp_bound_socket_get_listener(s->bound));
    evhttp_free(s->http); /* frees the connections (their bufferevents) first */
    osubd_conns_free(s->conns);
    event_base_free(s->base);
    free(s);
}

static int dial(const struct server *s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    *(bool *)arg = true;
}

/* Runs s's loop until done(s, arg) holds; a 30 s guard fails the test rather than hang. */
static void run_until(struct server *s, bool (*done)(struct server *, void *), void *arg,
                      const char *what)
{
    bool expired = false;
    struct event *guard = evtimer_new(s->base, on_guard, &expired);
    struct timeval tv = {30, 0};
    evtimer_add(guard, &tv);
    while (!done(s, arg) && !expired)
        event_base_loop(s->base, EVLOOP_ONCE);
    event_free(guard);
    if (expired)
        fail_msg("waited 30 s for %s", what);
}

static bool open_is(struct server *s, void *arg)
{
    return osubd_conns_open(s->conns) == *(int *)arg;
}

/* A client's read, the loop running meanwhile: what it got until the server closed. */
struct reply {
    int fd;
    char buf[1024];
    size_t len;
    bool eof;
    struct event *ev;
};

static void on_client(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct reply *r = arg;
    ssize_t n = recv(fd, r->buf + r->len, sizeof(r->buf) - 1 - r->len, MSG_DONTWAIT);
    if (n > 0) {
        r->len += (size_t)n;
        r->buf[r->len] = '\0';
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        r->eof = true;
    }
}

static bool reply_done(struct server *s, void *arg)
{
    (void)s;
    return ((struct reply *)arg)->eof;
}

static void read_reply(struct server *s, int fd, struct reply *r)
{
    memset(r, 0, sizeof(*r));
    r->fd = fd;
    r->ev = event_new(s->base, fd, EV_READ | EV_PERSIST, on_client, r);
    event_add(r->ev, NULL);
    run_until(s, reply_done, r, "the server to answer and close");
    event_free(r->ev);
}

static void on_park_closed(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    struct server *s = arg;
    osubd_client_unwatch(&s->watch);
    s->closed = true;
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct server *s = arg;
    osubd_conns_served(s->conns, (int)bufferevent_getfd(evhttp_connection_get_bufferevent(
                                     evhttp_request_get_connection(req))));
    if (strcmp(evhttp_request_get_uri(req), "/park") == 0) {
        /* a long-poll: no answer; its client is watched */
        s->parked = true;
        evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_park_closed, s);
        osubd_client_watch(&s->watch, s->base, req, &s->gone);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "ok\n");
    evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void send_all(int fd, const char *s)
{
    assert_int_equal(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s));
}

static void test_per_client_cap(void **state)
{
    (void)state;
    struct server *s = serve(2, 100);
    int a = dial(s), b = dial(s);
    int two = 2;
    run_until(s, open_is, &two, "two connections");
    assert_int_equal(osubd_conns_refused(s->conns), 0);
    /* the third from the same address: 503, closed */
    int c = dial(s);
    struct reply r;
    read_reply(s, c, &r);
    assert_non_null(strstr(r.buf, "HTTP/1.1 503"));
    assert_non_null(strstr(r.buf, "too_many_connections"));
    assert_non_null(strstr(r.buf, "this client holds too many connections"));
    assert_non_null(strstr(r.buf, "Retry-After: 1"));
    assert_int_equal(osubd_conns_refused(s->conns), 1);
    assert_int_equal(osubd_conns_open(s->conns), 2);
    /* the ones within the cap are served */
    send_all(a, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n");
    read_reply(s, a, &r);
    assert_non_null(strstr(r.buf, "HTTP/1.1 200"));
    /* a has closed (Connection: close): there is room for one more */
    int d = dial(s);
    send_all(d, "GET /y HTTP/1.1\r\nHost: t\r\n\r\n");
    read_reply(s, d, &r);
    assert_non_null(strstr(r.buf, "HTTP/1.1 200"));
    assert_int_equal(osubd_conns_refused(s->conns), 1);
    close(a);
    close(b);
    close(c);
    close(d);
    unserve(s);
}

static void test_total_cap(void **state)
{
    (void)state;
    struct server *s = serve(0, 2); /* no cap per client (the Unix socket's case) */
    int a = dial(s), b = dial(s);
    int two = 2;
    run_until(s, open_is, &two, "two connections");
    int c = dial(s);
    struct reply r;
    read_reply(s, c, &r);
    assert_non_null(strstr(r.buf, "HTTP/1.1 503"));
    assert_non_null(strstr(r.buf, "the API holds all the connections it takes"));
    assert_int_equal(osubd_conns_refused(s->conns), 1);
    int e = dial(s);
    read_reply(s, e, &r);
    assert_non_null(strstr(r.buf, "HTTP/1.1 503"));
    assert_int_equal(osubd_conns_refused(s->conns), 2);
    close(a);
    close(b);
    close(c);
    close(e);
    unserve(s);
}

static bool parked(struct server *s, void *arg)
{
    (void)arg;
    return s->parked;
}

static bool freed(struct server *s, void *arg)
{
    (void)arg;
    return s->closed;
}

static void test_parked_client_leaves(void **state)
{
    (void)state;
    struct server *s = serve(4, 100);
    int a = dial(s);
    send_all(a, "GET /park HTTP/1.1\r\nHost: t\r\n\r\n");
    run_until(s, parked, NULL, "the request to park");
    assert_int_equal(s->gone, 0);
    close(a); /* the client gives up */
    run_until(s, freed, NULL, "the parked connection to be freed");
    assert_int_equal(s->gone, 1);
    unserve(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_client_cap),
        cmocka_unit_test(test_total_cap),
        cmocka_unit_test(test_parked_client_leaves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
