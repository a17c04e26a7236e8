/* gateway.h - the entry's overload protection: an HTTP/1.1 reverse proxy in front of each
 * service's backends, with a concurrency limit and a bounded priority queue per service, and
 * 429 + Retry-After beyond them */
#ifndef OSUB_DAEMON_GATEWAY_H
#define OSUB_DAEMON_GATEWAY_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "core.h"
#include "routes.h"
#include "selfaddr.h"

struct osubd_gateway;

/* Listens on cfg.gateway_host:gateway_port (main.c makes one only when gateway_host is set);
 * routes and self are borrowed (self gets the gateway's listener). NULL with a sentence. */
struct osubd_gateway *osubd_gateway_new(struct osubd_core *c, const struct osubd_routes *routes,
                                        struct osubd_self *self, char *err, size_t errlen);
void osubd_gateway_free(struct osubd_gateway *g);

/* True (and the reply set to close the connection) when a request's length is ambiguous:
 * two Content-Length headers, or one with Transfer-Encoding (request smuggling). */
struct evhttp_request;
bool osubd_http_ambiguous_length(struct evhttp_request *req);

/* Graceful stop: accepts no more connections, closes the idle ones, and lets the others close
 * after their answer (queued requests are still served). Returns the connections still open. */
int osubd_gateway_drain(struct osubd_gateway *g);
int osubd_gateway_open_clients(const struct osubd_gateway *g);

/* The gateway's series for /metrics. */
void osubd_gateway_metrics(struct osubd_gateway *g, struct evbuffer *b);
/* The gateway as the core's module "gateway" (its metrics). */
struct osubd_module osubd_gateway_module(struct osubd_gateway *g);

#endif
