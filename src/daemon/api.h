/* api.h - oversubd's control API: JSON over HTTP/1.1 under /v1, /healthz, /metrics, the
 * dashboard; on TCP and on the Unix socket (trusted to run programs) */
#ifndef OSUBD_API_H
#define OSUBD_API_H

#include <stddef.h>

#include <event2/http.h>

#include "actuator.h"
#include "core.h"
#include "deviceplugin.h"
#include "gateway.h"
#include "gpus.h"
#include "netpolicy.h"
#include "pods.h"
#include "routes.h"
#include "selfaddr.h"

struct osubd_api;

/* What the API shows and changes, borrowed for its lifetime (gw, dp: NULL when off). */
struct osubd_api_deps {
    struct osubd_act *act;
    struct osubd_routes *routes;
    struct osubd_gateway *gw;
    struct osubd_dp *dp;
    const struct osubd_gpus *gpus;
    const struct osubd_destinations *dest;
    struct osubd_self *self; /* gets the API's listeners */
};

struct osubd_api *osubd_api_new(struct osubd_core *c, const struct osubd_api_deps *dep, char *err,
                                size_t errlen);
/* Listens on cfg.listen_host:listen_port and the Unix socket. 0, or -1 with a sentence. */
int osubd_api_listen(struct osubd_api *a, char *err, size_t errlen);
/* The API as the core's module "api": replies held for a commit go out once it is durable
 * (as 503 "applied, not yet durable" when the disk filled), long-polls wake on new events. */
struct osubd_module osubd_api_module(struct osubd_api *a);
/* The TCP port bound (port 0: the one the OS picked). */
int osubd_api_port(const struct osubd_api *a);
void osubd_api_free(struct osubd_api *a);

/* The port a bound socket got. */
int osubd_bound_port(struct evhttp_bound_socket *h);

#endif
