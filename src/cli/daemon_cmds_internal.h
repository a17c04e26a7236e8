/* daemon_cmds_internal.h - what the oversub CLI's daemon commands share (daemon_cmds.c: the
 * table, the parsing, the client and formatting; daemon_watch.c and daemon_services.c: the
 * commands); nothing outside them includes it */
#ifndef OSUB_CLI_DAEMON_CMDS_INTERNAL_H
#define OSUB_CLI_DAEMON_CMDS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

enum { EX_OK = 0, EX_REFUSED = 1, EX_USAGE = 2, EX_UNREACHABLE = 3, EX_TIMEOUT = 3 };

#define EVENTS_PAGE 1000 /* the daemon's page of events */

/* ---- the command table ----------------------------------------------------------------- */

struct flag {
    const char *name; /* --name */
    char short_name;  /* -x, or 0 */
    const char *arg;  /* its value's name; NULL for a switch */
    const char *help; /* '\n' continues on an indented line */
};

#define MAX_FLAGS 32
#define MAX_REPEATS 128

struct command;

/* What a command line said. Values point into argv. */
struct args {
    const struct command *cmd;
    const char *val[MAX_FLAGS]; /* the last value given ("" for a switch); NULL: not given */
    struct {
        int flag;
        const char *v;
    } rep[MAX_REPEATS]; /* every value of every flag, in order (--env, --backend) */
    int n_rep;
    char **pos; /* positional arguments */
    int n_pos;
    char **rest; /* after "--" */
    int n_rest;
    bool dashdash;
};

struct command {
    const char *name;
    const char *synopsis; /* what follows "oversub NAME" */
    const char *summary;  /* one line, for oversub --help */
    const char *about;    /* what it does */
    int min_pos, max_pos;
    bool takes_rest; /* -- PROGRAM ARG... */
    const struct flag *flags;
    const char *example;
    int (*run)(const struct args *a);
};

/* ---- daemon_cmds.c: the command that runs, the client, formatting, arguments ------------- */

extern bool dcmd_as_json;    /* --json */
extern const char *dcmd_cur; /* the command's name, for messages */

/* With --json, a failure is one JSON document on stdout too (the sentence stays on stderr);
 * extra (taken, may be NULL) is merged into it. */
void dcmd_json_error(const char *code, const char *message, json_t *extra);
/* One request. Returns the body (new reference; an empty object when it is not JSON) and the
 * HTTP status in *status, or NULL when the daemon cannot be reached (said on stderr). body is
 * borrowed. */
json_t *dcmd_request(const char *method, const char *path, json_t *body, int *status);
/* A request whose failure ends the command: an answer of 400 or more is said on stderr (and
 * with --json printed as the daemon's error document). Returns the body (new reference, also
 * on a refusal) and the exit code in *ex; NULL when unreachable. */
json_t *dcmd_call(const char *method, const char *path, json_t *body, int *ex);
void dcmd_print_json(json_t *j);
/* o's integer member k (0 if none), o's string member k ("" if none; borrowed from o). */
int64_t dcmd_geti(json_t *o, const char *k);
const char *dcmd_gets(json_t *o, const char *k);

/* RFC 3339 in local time with its UTC offset ("2026-12-01T11:03:13.123+01:00"; "Z" in UTC). */
void dcmd_fmt_time(int64_t unix_ms, bool with_ms, char *out, size_t len);
int64_t dcmd_now_unix_ms(void);
double dcmd_mono_s(void);
/* "3m12s" for a duration in ms */
void dcmd_fmt_dur(int64_t ms, char *out, size_t len);
/* "0" or "0,1" from a service's placement */
void dcmd_fmt_gpus(json_t *svc, char *out, size_t len);

/* The index of c's flag --name, -1 if it has none. */
int dcmd_flag_index(const struct command *c, const char *name);
/* The last value of --name ("" for a switch given), or NULL. */
const char *dcmd_opt(const struct args *a, const char *name);
/* 0 when id is a service id, else EX_USAGE (said on stderr). */
int dcmd_check_id(const char *id);
/* "/v1/services/ID" followed by suffix. */
void dcmd_svc_path(char *out, size_t len, const char *id, const char *suffix);
/* A size with its unit into *out: 0, or EX_USAGE (said: "10" alone is refused, MiB or GiB?). */
int dcmd_size_arg(const char *flag, const char *v, int64_t *out);
/* A whole number from min to max into *out: 0, or EX_USAGE (said). */
int dcmd_num_arg(const char *flag, const char *v, long min, long max, long *out);

/* ---- the commands: each returns the exit code ------------------------------------------- */

/* daemon_watch.c: what the daemon shows */
int dcmd_status(const struct args *a);
int dcmd_list(const struct args *a);
int dcmd_events(const struct args *a);
int dcmd_explain(const struct args *a);
int dcmd_queue(const struct args *a);
int dcmd_logs(const struct args *a);
/* The newest event's seq (0: none) into *out, without reading the whole log. Returns an exit
 * code. */
int dcmd_newest_seq(long long *out);

/* daemon_services.c: what changes services and the pool */
int dcmd_deploy(const struct args *a);
int dcmd_ready(const struct args *a);
int dcmd_resize(const struct args *a);
int dcmd_release(const struct args *a);
int dcmd_suspend(const struct args *a);
int dcmd_resume(const struct args *a);
int dcmd_usage(const struct args *a);
int dcmd_gpu(const struct args *a);
int dcmd_ratio(const struct args *a);

#endif
