/* core.h - oversubd's core: every command applied to the engine is logged durably before
 * anyone hears of it; the engine's clock; the tickets replies wait on; a registry of the
 * modules above it. The core names none of them: each registers what it needs from it. */
#ifndef OSUBD_CORE_H
#define OSUBD_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <jansson.h>

#include "config.h"
#include "oversub/engine.h"

struct evbuffer;
struct osubd_core; /* core.c alone reads its fields */

/* Who asks (the API's authority, given to what decides, never kept in a field). */
struct osubd_caller {
    bool trusted; /* over the Unix socket: may run programs */
    bool admin;   /* carries the admin token, or no token is configured */
};

/* What a module hears when the log moved on disk (osubd_module.durable). */
struct osubd_progress {
    uint64_t durable; /* the last ticket on disk */
    bool commit;      /* the writer committed (false: written at once while starting) */
    bool full;        /* the disk just filled: replies held for a commit go out now */
    bool events;      /* events newer than the last heard of are on disk */
};

/*
 * A module: its name (its key in the state's meta table, where it has one), its context, and
 * what it does for the core; any hook may be NULL. The core calls them in the order the
 * modules registered.
 * - load: reads what the last run saved (osubd_core_meta), once, before the first command.
 * - dirty/save/saved: its records changed since the last save; save puts them into the meta
 *   object handed to the writer with the command that changed them (one transaction); saved
 *   says whether that went through.
 * - events: the events of a command just applied (before it is durable: act on them once it
 *   is, through durable).
 * - durable: the log moved on disk.
 * - forget: a service is gone from the engine: its records go.
 * - metrics: its series for /metrics.
 */
struct osubd_module {
    const char *name;
    void *ctx;
    int (*load)(void *ctx, struct osubd_core *c, char *err, size_t errlen);
    bool (*dirty)(void *ctx);
    void (*save)(void *ctx, json_t *meta);
    void (*saved)(void *ctx, bool ok);
    void (*events)(void *ctx, const osub_event_t *ev, size_t n);
    void (*durable)(void *ctx, const struct osubd_progress *p);
    void (*forget)(void *ctx, const char *id);
    void (*metrics)(void *ctx, struct evbuffer *b);
};
#define OSUBD_MODULES_MAX 16

/* The machine's pool, asked for by the core for a new state and for a state without a
 * snapshot (gpus: the setting, or the pool the state was made with). */
struct osubd_pool {
    size_t n;
    int64_t vram[OSUB_POOL_GPUS_MAX];
    char names[OSUB_POOL_GPUS_MAX][96];
    bool nvml;      /* the GPUs are NVML's */
    char desc[512]; /* for the log */
};
typedef int (*osubd_pool_fn)(void *arg, const char *gpus, struct osubd_pool *out, char *err,
                             size_t errlen);

/* Lifecycle: new (the event loop), open (the state: lock, store, key, marker, engine restored
 * or made, log replayed), then the modules register and load (osubd_core_load), then start
 * (the writer; commands from here wait for their commit), stop (what was handed over is
 * durable and heard of, a last snapshot), free. */
struct osubd_core *osubd_core_new(const struct osubd_config *cfg);
int osubd_core_open(struct osubd_core *c, osubd_pool_fn pool, void *pool_arg, char *err,
                    size_t errlen);
int osubd_core_register(struct osubd_core *c, const struct osubd_module *m);
int osubd_core_load(struct osubd_core *c, char *err, size_t errlen);
int osubd_core_start(struct osubd_core *c, char *err, size_t errlen);
void osubd_core_stop(struct osubd_core *c);
void osubd_core_free(struct osubd_core *c);

/* What the core owns, for the modules. */
struct event_base *osubd_core_base(const struct osubd_core *c);
osub_engine_t *osubd_core_engine(const struct osubd_core *c);
const struct osubd_config *osubd_core_config(const struct osubd_core *c);
/* The pool the state was made with ("nvml", or the --gpus it had), and whether it existed. */
const char *osubd_core_pool(const struct osubd_core *c);
bool osubd_core_existing(const struct osubd_core *c);
/* A value the last run saved in the meta table (osubd_state_meta): for load hooks. */
int osubd_core_meta(struct osubd_core *c, const char *key, char **text, char *err, size_t errlen);
/* Writes a meta value at once: only while starting, before osubd_core_start (a new state's
 * records made with it). */
int osubd_core_meta_set(struct osubd_core *c, const char *key, const char *text, char *err,
                        size_t errlen);
/* Sets meta[key] to value's JSON text (for save hooks). */
void osubd_meta_put(json_t *meta, const char *key, const json_t *value);

/*
 * Applies a command at the current engine time and logs it with its events: before returning
 * (no writer yet, at start-up), or through the writer, in which case every reply is held until
 * the command is durable (osubd_core_tickets). Timers due by now run first, as a tick command
 * of their own. Returns the engine's code; a malformed command (err set) and a dry run reach
 * no state and are not logged.
 */
int osubd_apply(struct osubd_core *c, json_t *cmd, osub_submit_result_t *res, char *err,
                size_t errlen);
/* The same, for a command that staged records in the modules (a submit's route and exec, a
 * ready's PID): commit(arg, rc, res) runs once the engine has decided and before the command
 * is logged: it keeps the records when the engine accepted, drops them otherwise, and what it
 * keeps is saved with the command. Not called for malformed commands or dry runs. */
typedef void (*osubd_commit_fn)(void *arg, int rc, const osub_submit_result_t *res);
int osubd_apply_with(struct osubd_core *c, json_t *cmd, osub_submit_result_t *res, char *err,
                     size_t errlen, osubd_commit_fn commit, void *arg);

/* Logs an event of the daemon's own (kind, e.g. "process"; reason, e.g. "exit") for a
 * service, with a "note" command that the engine ignores, and prints it. */
void osubd_note(struct osubd_core *c, const char *id, const char *kind, const char *reason,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The same, printed as a warning: for what an operator should look at (a segment damaged, a
 * webhook that failed, an eviction that could not be sent), seen under --log-level warn. */
void osubd_warn(struct osubd_core *c, const char *id, const char *kind, const char *reason,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/*
 * Out of memory, one rule: before a command reaches the engine, the request gets 500
 * out_of_memory and nothing changed; once the engine has decided (an event to record, a record
 * to keep, an action to queue, the log to write), oversubd stops through osubd_fatal(): the
 * state on disk is the truth, and a restart replays it and repeats the outstanding directives.
 */
void osubd_fatal(struct osubd_core *c, const char *what);
bool osubd_core_fatal(const struct osubd_core *c);
/* Stops the loop (a signal, the end of a drain). */
void osubd_core_break(struct osubd_core *c);

/* Engine time now: monotonic within a run. osubd_now(): the same as Unix ms (base + engine
 * time): what deadlines are compared with. */
int64_t osubd_engine_now(const struct osubd_core *c);
int64_t osubd_now(const struct osubd_core *c);
int64_t osubd_engine_to_unix(const struct osubd_core *c, int64_t engine_ms);

/* The token a service's own calls (usage, ready, ack, exited) may carry instead of the admin
 * token: 64 hex digits. */
void osubd_service_token(const struct osubd_core *c, const char *id, char out[65]);

/* Tickets: the last command handed to the writer (applied) and the last on disk (durable). A
 * reply to a command is sent once durable >= the applied ticket it was made at. */
uint64_t osubd_core_applied(const struct osubd_core *c);
uint64_t osubd_core_durable(const struct osubd_core *c);
/* The state's disk is full: mutations are refused (507) until it has room. */
bool osubd_core_full(const struct osubd_core *c);
/* Counts the commands applied: cached answers key on it. */
uint64_t osubd_core_version(const struct osubd_core *c);
/* A module changed what cached answers show without a command (PUT .../backends). */
void osubd_core_touch(struct osubd_core *c);
int64_t osubd_core_last_event(const struct osubd_core *c);

/* The events logged after since, oldest first, at most limit: cb(arg, seq, json_text). */
int osubd_core_events(struct osubd_core *c, int64_t since, int limit,
                      int (*cb)(void *arg, int64_t seq, const char *text), void *arg);

/* The core's series and every module's, for /metrics. */
void osubd_core_metrics(struct osubd_core *c, struct evbuffer *b);

#endif
