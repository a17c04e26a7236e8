/* httpc.c - oversubd's timed HTTP client (httpc.h) over libevent's evhttp */
#define _GNU_SOURCE
#include "httpc.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>

struct osubd_httpc {
    osubd_httpc_fn fn;
    void *arg;
    struct evhttp_connection *conn; /* ours: freed after the answer, or by a cancel */
    struct evhttp_request *req;
    struct event_base *base;
};

/* A connection is not freed from inside its own request's callback: after it returns. */
static void conn_free(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    evhttp_connection_free(arg);
}

static void call_done(struct evhttp_request *req, void *arg)
{
    struct osubd_httpc *c = arg;
    int code = req != NULL ? evhttp_request_get_response_code(req) : 0;
    char body[OSUBD_HTTPC_BODY_MAX + 1];
    size_t n = 0;
    if (req != NULL && code != 0) {
        struct evbuffer *in = evhttp_request_get_input_buffer(req);
        size_t len = evbuffer_get_length(in);
        n = len < OSUBD_HTTPC_BODY_MAX ? len : OSUBD_HTTPC_BODY_MAX;
        if (evbuffer_copyout(in, body, n) < 0)
            n = 0;
    }
    body[n] = '\0';
    struct timeval now = {0, 0};
    if (event_base_once(c->base, -1, EV_TIMEOUT, conn_free, c->conn, &now) != 0)
        evhttp_connection_free_on_completion(c->conn); /* no timer: libevent frees it after */
    c->fn(c->arg, code, body);
    free(c);
}

int osubd_httpc_send(struct event_base *base, struct evdns_base **dns,
                     const struct osubd_httpc_req *r, osubd_httpc_fn fn, void *arg,
                     struct osubd_httpc **call)
{
    if (call != NULL)
        *call = NULL;
    bool post = strcmp(r->method, "POST") == 0;
    if (!post && strcmp(r->method, "GET") != 0)
        return -1;
    struct evhttp_uri *u = evhttp_uri_parse(r->url);
    if (u == NULL || evhttp_uri_get_host(u) == NULL) {
        if (u != NULL)
            evhttp_uri_free(u);
        return -1;
    }
    const char *host = evhttp_uri_get_host(u);
    int port = evhttp_uri_get_port(u);
    /* a name is resolved without blocking the loop (evdns); an address needs no lookup */
    struct in6_addr a6;
    struct in_addr a4;
    bool literal = inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1;
    if (!literal && *dns == NULL)
        *dns = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
    struct osubd_httpc *c = calloc(1, sizeof(*c));
    struct evhttp_connection *conn =
        c == NULL || (!literal && *dns == NULL)
            ? NULL
            : evhttp_connection_base_new(base, literal ? NULL : *dns, host,
                                         (uint16_t)(port > 0 ? port : 80));
    struct evhttp_request *req = conn != NULL ? evhttp_request_new(call_done, c) : NULL;
    if (req == NULL) {
        if (conn != NULL)
            evhttp_connection_free(conn);
        free(c);
        evhttp_uri_free(u);
        return -1;
    }
    c->fn = fn;
    c->arg = arg;
    c->conn = conn;
    c->req = req;
    c->base = base;
    evhttp_connection_set_timeout(conn, r->timeout_s > 0 ? r->timeout_s : 1);
    /* what the peer (a service's URL: anyone's) may make oversubd hold: an answer larger than
     * this fails the call rather than filling oversubd's memory */
    evhttp_connection_set_max_body_size(conn, OSUBD_HTTPC_READ_MAX);
    evhttp_connection_set_max_headers_size(conn, 16384);
    char hv[300];
    snprintf(hv, sizeof(hv), port > 0 ? "%s:%d" : "%s", host, port);
    struct evkeyvalq *hd = evhttp_request_get_output_headers(req);
    evhttp_add_header(hd, "Host", hv);
    if (post) {
        const char *body = r->body != NULL ? r->body : "";
        if (r->body != NULL)
            evhttp_add_header(hd, "Content-Type", "application/json");
        evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    }
    if (r->signature != NULL)
        evhttp_add_header(hd, "X-Oversub-Signature", r->signature);
    const char *path = evhttp_uri_get_path(u), *query = evhttp_uri_get_query(u);
    char target[2100];
    snprintf(target, sizeof(target), "%s%s%s", path && path[0] ? path : "/", query ? "?" : "",
             query ? query : "");
    evhttp_uri_free(u);
    if (evhttp_make_request(conn, req, post ? EVHTTP_REQ_POST : EVHTTP_REQ_GET, target) != 0) {
        /* the request was freed by libevent, its callback not run */
        evhttp_connection_free(conn);
        free(c);
        return -1;
    }
    if (call != NULL)
        *call = c;
    return 0;
}

void osubd_httpc_cancel(struct osubd_httpc *c)
{
    if (c == NULL)
        return;
    evhttp_cancel_request(c->req); /* the request freed, its callback not run */
    evhttp_connection_free(c->conn);
    free(c);
}
