/* conns.h - what one client, and all clients, may hold of the API's connections, and what an
 * accept loop does when the process runs out of file descriptors (docs/security.md). */
#ifndef OSUBD_CONNS_H
#define OSUBD_CONNS_H

#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>

struct osubd_conns;

/* A guard for one evhttp server: per_client connections per client address (0: no per-client
 * cap, e.g. the Unix socket), total in all. name is for the log ("API", "Unix socket"). */
struct osubd_conns *osubd_conns_new(struct event_base *base, struct evhttp *http, int per_client,
                                    int total, const char *name);
/* Watches bound's listener for descriptor exhaustion (see osubd_listener_guard). */
void osubd_conns_listen(struct osubd_conns *c, struct evhttp_bound_socket *bound);
void osubd_conns_free(struct osubd_conns *c);
/* A request arrived whole on fd: its connection met the deadline for a first request's head
 * (10 s; slower ones, a slowloris trickling headers, are answered 408 and closed). */
void osubd_conns_served(struct osubd_conns *c, int fd);
uint64_t osubd_conns_slow(const struct osubd_conns *c);
/* Connections open now, and refused (over a cap, or while out of descriptors) so far. */
int osubd_conns_open(const struct osubd_conns *c);
uint64_t osubd_conns_refused(const struct osubd_conns *c);

/* A parked request (a long-poll) whose client may leave before the answer: its socket is
 * watched, and when the client closed it (CLOSE_WAIT) the connection is freed at once (evhttp
 * then calls the connection's close callback, which must forget the request) and *gone counted;
 * anything else on it (a pipelined request) is left to evhttp. Embedded in the waiter. */
struct osubd_client_watch {
    struct event *ev;
    struct evhttp_connection *evcon;
    uint64_t *gone;
};
void osubd_client_watch(struct osubd_client_watch *w, struct event_base *base,
                        struct evhttp_request *req, uint64_t *gone);
void osubd_client_unwatch(struct osubd_client_watch *w);

/* On EMFILE/ENFILE from accept: one pending client is answered 503 and closed (with a spare
 * descriptor kept for this), accepting pauses for 250 ms, and the log says so at most once
 * per 10 s with a count, instead of libevent's warning per failed accept in a busy loop.
 * counter (may be NULL) counts the clients turned away. */
void osubd_listener_guard(struct evconnlistener *lis, const char *name, uint64_t *counter);
/* Before lis is freed. */
void osubd_listener_unguard(struct evconnlistener *lis);

#endif
