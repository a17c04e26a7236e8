/* gateway.h - the entry's overload protection: an HTTP/1.1 reverse proxy in front of each
 * service's backends, with a concurrency limit and a bounded priority queue per service, and
 * 429 + Retry-After beyond them */
#ifndef OSUB_DAEMON_GATEWAY_H
#define OSUB_DAEMON_GATEWAY_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/buffer.h>
#include <jansson.h>

struct osubd;

/* Listens on cfg.gateway_host:gateway_port (nothing when gateway_host is ""). */
int osubd_gateway_init(struct osubd *d, char *err, size_t errlen);
void osubd_gateway_free(struct osubd *d);

/* True (and the reply set to close the connection) when a request's length is ambiguous:
 * two Content-Length headers, or one with Transfer-Encoding (request smuggling). */
struct evhttp_request;
bool osubd_http_ambiguous_length(struct evhttp_request *req);

/* Graceful stop: accepts no more connections, closes the idle ones, and lets the others close
 * after their answer (queued requests are still served). Returns the connections still open. */
int osubd_gateway_drain(struct osubd *d);
int osubd_gateway_open_clients(const struct osubd *d);

/* The gateway's series for /metrics. */
void osubd_gateway_metrics(struct osubd *d, struct evbuffer *b);

#endif
