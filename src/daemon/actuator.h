/* actuator.h - makes services obey the engine: managed processes (spawn, signals, exits,
 * restarts, adoption after a restart), directives (long-poll and webhooks), per-service logs */
#ifndef OSUB_DAEMON_ACTUATOR_H
#define OSUB_DAEMON_ACTUATOR_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/http.h>
#include <jansson.h>

#include "oversub/engine.h"

struct osubd;

/*
 * Takes the actuation fields (command, env, workdir, user, checkpoint_dir, restart,
 * max_restarts, control_url) out of a submitted spec. *exec: a new object, or NULL when none
 * was given. Returns 0, or -1 with a sentence in err (the field and why). trusted says
 * whether the request may make the daemon run programs (the Unix socket, or the admin token).
 */
int osubd_act_take(const struct osubd *d, json_t *spec, bool trusted, json_t **exec, char *err,
                   size_t errlen);

/* Starts the actuators once the loop and the writer run: adopts live processes, treats dead
 * ones as exited, starts what should run. Returns 0 or -1 with a sentence in err. */
int osubd_act_start(struct osubd *d, char *err, size_t errlen);
void osubd_act_free(struct osubd *d);

/* The events of the command just applied: the actuators act on them from the loop, once the
 * command is durable (never from inside osubd_apply). With n 0: a commit happened, act on what
 * waited for it. */
void osubd_act_events(struct osubd *d, const osub_event_t *ev, size_t n);

/* What a service's JSON shows of its actuation (never env's values): merged into o. */
void osubd_act_describe(struct osubd *d, const char *id, json_t *o);

/* GET /v1/services/{id}/directives?wait=SECONDS&after=SEQ */
void osubd_act_directives(struct osubd *d, struct evhttp_request *req, const char *id,
                          const char *query);

/* The actuators' series for /metrics. */
struct evbuffer;
void osubd_act_metrics(struct osubd *d, struct evbuffer *b);

/* A JSON object of the actuators' persistent maps for the writer's meta (service_exec,
 * managed_procs): each value a JSON text. */
void osubd_act_meta(struct osubd *d, json_t *meta);

#endif
