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

static void on_request(struct evhttp_request *req, void *arg)
{
    struct event_base *base = arg;
    const char *uri = evhttp_request_get_uri(req);
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
    struct evhttp_bound_socket *h =
        evhttp_bind_socket_with_handle(http, "127.0.0.1", (uint16_t)port);
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
