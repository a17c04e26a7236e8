/* httpc.h - oversubd's own HTTP client for the endpoints a service names (webhooks, a serving
 * engine's sleep and wake): one request at a time per call, timed, on the event loop, never
 * blocking it (a host name is resolved with evdns). Where it may connect is the caller's check
 * (netpolicy.h): this client sends where it is told. */
#ifndef OSUBD_HTTPC_H
#define OSUBD_HTTPC_H

#include <stddef.h>

struct event_base;
struct evdns_base;

/* The answer: code 0 when none came (refused, timed out, a bad URL), else the status; body the
 * first bytes of the answer's body (NUL-terminated, at most OSUBD_HTTPC_BODY_MAX), borrowed for
 * the call. */
#define OSUBD_HTTPC_BODY_MAX 4096
#define OSUBD_HTTPC_READ_MAX (64 * 1024) /* an answer's body above this fails the call */
typedef void (*osubd_httpc_fn)(void *arg, int code, const char *body);

struct osubd_httpc_req {
    const char *method;    /* "GET" or "POST" */
    const char *url;       /* http://HOST[:PORT][/PATH][?QUERY] */
    const char *body;      /* POST's JSON body; NULL: none (an empty body) */
    const char *signature; /* X-Oversub-Signature's value, NULL: not sent */
    int timeout_s;         /* the whole exchange; at least 1 */
};

struct osubd_httpc;

/* Sends r (its strings copied); fn is called exactly once, later, on the loop (never from
 * within this call), unless the call is cancelled. *dns is made when a host name first needs
 * it (free it with evdns_base_free after the last answer). 0, with *call (when not NULL) the
 * call's handle until fn runs; or -1 when nothing could be sent (out of memory, a URL that does
 * not parse): fn is then not called. */
int osubd_httpc_send(struct event_base *base, struct evdns_base **dns,
                     const struct osubd_httpc_req *r, osubd_httpc_fn fn, void *arg,
                     struct osubd_httpc **call);
/* Drops a call under way (its connection closed): fn is never called. */
void osubd_httpc_cancel(struct osubd_httpc *call);

#endif
