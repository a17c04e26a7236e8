/* backend.c - the gateway benchmark's backend: a minimal fixed-response HTTP/1.1 server on
 * libevent, one thread. Every path answers 200 with a 64-byte body, keep-alive; /hang never
 * answers (it holds a gateway slot for the rejection-path run). Prints "port N".
 * Usage: bench_backend [PORT] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <sys/socket.h>

static const char body[] = "{\"text\":\"a fixed answer from the benchmark's backend....\"}\n";

static void answer(struct evhttp_request *req)
{
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_reference(b, body, sizeof(body) - 1, NULL, NULL);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

struct later {
    struct evhttp_request *req;
    struct event *ev;
};

static void on_later(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct later *l = arg;
    answer(l->req);
    event_free(l->ev);
    free(l);
}

/* /stream?n=N&ms=M: a server-sent-events answer, N events M ms apart, chunked */
struct stream {
    struct evhttp_request *req;
    struct event *ev;
    int left, ms, seq;
};

static void on_stream(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct stream *st = arg;
    struct evbuffer *b = evbuffer_new();
    if (st->left-- > 0)
        evbuffer_add_printf(b, "data: {\"seq\":%d,\"text\":\"a token from the backend\"}\n\n",
                            st->seq++);
    else
        evbuffer_add_printf(b, "data: [DONE]\n\n");
    evhttp_send_reply_chunk(st->req, b);
    evbuffer_free(b);
    if (st->left < 0) {
        evhttp_send_reply_end(st->req);
        event_free(st->ev);
        free(st);
        return;
    }
    struct timeval tv = {st->ms / 1000, (st->ms % 1000) * 1000};
    evtimer_add(st->ev, &tv);
}

static void start_stream(struct event_base *base, struct evhttp_request *req, const char *q)
{
    struct stream *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return;
    st->req = req;
    st->left = 20;
    st->ms = 50;
    const char *n = strstr(q, "n="), *m = strstr(q, "ms=");
    if (n != NULL)
        st->left = atoi(n + 2);
    if (m != NULL)
        st->ms = atoi(m + 3);
    st->ev = evtimer_new(base, on_stream, st);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/event-stream");
    evhttp_send_reply_start(req, 200, "OK");
    on_stream(-1, 0, st); /* the first event at once: the time to first byte is the proxy's */
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct event_base *base = arg;
    const char *uri = evhttp_request_get_uri(req);
    if (strncmp(uri, "/stream", 7) == 0) {
        start_stream(base, req, uri);
        return;
    }
    if (strcmp(uri, "/hang") == 0)
        return; /* never answered: the connection stays busy */
    if (strncmp(uri, "/sleep?ms=", 10) == 0) {
        long ms = strtol(uri + 10, NULL, 10);
        struct later *l = malloc(sizeof(*l));
        if (l != NULL) {
            l->req = req;
            l->ev = evtimer_new(base, on_later, l);
            struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
            evtimer_add(l->ev, &tv);
            return;
        }
    }
    answer(req);
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0;
    struct event_base *base = event_base_new();
    struct evhttp *http = evhttp_new(base);
    evhttp_set_gencb(http, on_request, base);
    /* a deep accept queue: a thousand streams connect at once */
    struct sockaddr_in la = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct evconnlistener *lis =
        evconnlistener_new_bind(base, NULL, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 4096,
                                (struct sockaddr *)&la, sizeof(la));
    struct evhttp_bound_socket *h = lis ? evhttp_bind_listener(http, lis) : NULL;
    if (h == NULL) {
        fprintf(stderr, "bench_backend: cannot listen\n");
        return 1;
    }
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    getsockname(evhttp_bound_socket_get_fd(h), (struct sockaddr *)&sa, &sl);
    printf("port %d\n", ntohs(sa.sin_port));
    fflush(stdout);
    event_base_dispatch(base);
    evhttp_free(http);
    event_base_free(base);
    return 0;
}
