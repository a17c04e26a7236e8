/* daemon_cmds.c - the oversub CLI's commands that talk to oversubd: one table gives each
 * command's arguments, flags, help and example, and drives its parsing and its --help */
#define _POSIX_C_SOURCE 200809L
#include "daemon_cmds.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "http.h"
#include "oversub/engine.h"
#include "oversub/errors.h"
#include "oversub/units.h"

enum { EX_OK = 0, EX_REFUSED = 1, EX_USAGE = 2, EX_UNREACHABLE = 3, EX_TIMEOUT = 3 };

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

static struct http_target tgt;
static bool as_json;
static const char *url_opt;
static const char *cur; /* the command's name, for messages */

/* ---- talking to oversubd --------------------------------------------------------------- */

/* With --json, a failure is one JSON document on stdout too (the sentence stays on stderr). */
static void json_error(const char *code, const char *message, json_t *extra)
{
    if (!as_json) {
        json_decref(extra);
        return;
    }
    json_t *e = json_pack("{s:s, s:s}", "code", code, "message", message);
    if (extra != NULL) {
        json_object_update(e, extra);
        json_decref(extra);
    }
    json_t *doc = json_pack("{s:o}", "error", e);
    json_dumpf(doc, stdout, JSON_INDENT(2));
    fputc('\n', stdout);
    fflush(stdout);
    json_decref(doc);
}

/* One request. Returns the body (new reference; an empty object when it is not JSON) and the
 * HTTP status in *status, or NULL when the daemon cannot be reached (said on stderr). */
static json_t *request(const char *method, const char *path, json_t *body, int *status)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    struct http_resp r;
    char err[400];
    int rc = http_request(&tgt, method, path, text, &r, err, sizeof(err));
    free(text);
    if (rc != 0) {
        fprintf(stderr,
                "oversub %s: %s\n  is oversubd running? start it with 'make run', or point "
                "--url / OVERSUB_URL at it\n",
                cur, err);
        json_error("unreachable", err, NULL);
        *status = 0;
        return NULL;
    }
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    if (j == NULL)
        j = json_pack("{s:s}", "body", r.body ? r.body : "");
    *status = r.status;
    http_resp_free(&r);
    return j;
}

/* A request whose failure ends the command: an answer of 400 or more is said on stderr (and
 * with --json printed as the daemon's error document). Returns the body (new reference, also
 * on a refusal) and the exit code in *ex; NULL when unreachable. */
static json_t *call(const char *method, const char *path, json_t *body, int *ex)
{
    int status;
    json_t *j = request(method, path, body, &status);
    if (j == NULL) {
        *ex = EX_UNREACHABLE;
        return NULL;
    }
    *ex = EX_OK;
    if (status >= 400) {
        json_t *e = json_object_get(j, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        fprintf(stderr, "oversub %s: refused (%d %s): %s\n", cur, status, code ? code : "error",
                msg ? msg : json_string_value(json_object_get(j, "body")));
        if (status == 401)
            fprintf(stderr, "  set OVERSUB_TOKEN to the admin token\n");
        if (as_json) {
            if (e == NULL) {
                json_t *wrapped = json_pack("{s:{s:s, s:s, s:i}}", "error", "code", "http_error",
                                            "message", msg ? msg : "", "status", status);
                json_decref(j);
                j = wrapped;
            }
            json_dumpf(j, stdout, JSON_INDENT(2));
            fputc('\n', stdout);
        }
        *ex = EX_REFUSED;
    }
    return j;
}

static void print_json(json_t *j)
{
    json_dumpf(j, stdout, JSON_INDENT(2));
    fputc('\n', stdout);
    fflush(stdout);
}

static int64_t geti(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

static const char *gets_(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* ---- formatting ------------------------------------------------------------------------ */

/* RFC 3339 in local time with its UTC offset ("2026-12-01T11:03:13.123+01:00"; "Z" in UTC). */
static void fmt_time(int64_t unix_ms, bool with_ms, char *out, size_t len)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    char base[40], z[16], off[16];
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    if (strftime(z, sizeof(z), "%z", &tm) != 5 || strcmp(z, "+0000") == 0 ||
        strcmp(z, "-0000") == 0)
        snprintf(off, sizeof(off), "Z");
    else
        snprintf(off, sizeof(off), "%.3s:%.2s", z, z + 3);
    if (with_ms)
        snprintf(out, len, "%s.%03d%s", base, (int)(unix_ms % 1000), off);
    else
        snprintf(out, len, "%s%s", base, off);
}

static int64_t now_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "3m12s" for a duration in ms */
static void fmt_dur(int64_t ms, char *out, size_t len)
{
    if (ms < 0)
        ms = 0;
    int64_t s = ms / 1000;
    if (ms < 1000 && ms > 0)
        snprintf(out, len, "%lldms", (long long)ms);
    else if (s < 60)
        snprintf(out, len, "%llds", (long long)s);
    else if (s < 3600)
        snprintf(out, len, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
    else
        snprintf(out, len, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
}

/* "0" or "0,1" from a service's placement */
static void fmt_gpus(json_t *svc, char *out, size_t len)
{
    size_t off = 0, k;
    json_t *p;
    out[0] = '\0';
    json_array_foreach(json_object_get(svc, "placement"), k, p)
    {
        if (off + 24 >= len)
            break;
        off += (size_t)snprintf(out + off, len - off, "%s%lld", k ? "," : "",
                                (long long)geti(p, "gpu"));
    }
}

/* ---- arguments ------------------------------------------------------------------------- */

static void print_usage(const struct command *c, FILE *f)
{
    fprintf(f, "usage: oversub %s%s%s\n\n%s\n", c->name, c->synopsis[0] ? " " : "", c->synopsis,
            c->about);
    if (c->flags != NULL && c->flags[0].name != NULL) {
        fprintf(f, "\nOptions:\n");
        for (const struct flag *fl = c->flags; fl->name != NULL; fl++) {
            char left[64];
            snprintf(left, sizeof(left), "%s%c%s--%s%s%s", fl->short_name ? "-" : "",
                     fl->short_name ? fl->short_name : ' ', fl->short_name ? ", " : "", fl->name,
                     fl->arg ? " " : "", fl->arg ? fl->arg : "");
            fprintf(f, "  %-26s ", fl->short_name ? left : left + 1);
            for (const char *h = fl->help; *h; h++) {
                fputc(*h, f);
                if (*h == '\n')
                    fprintf(f, "%29s", "");
            }
            fputc('\n', f);
        }
    }
    fprintf(f, "\nGlobal options: --url URL (or OVERSUB_URL), --json (the daemon's JSON), "
               "-h/--help\n");
    fprintf(f, "\nExample:\n%s\n", c->example);
}

static int flag_index(const struct command *c, const char *name)
{
    for (int i = 0; c->flags != NULL && c->flags[i].name != NULL; i++)
        if (strcmp(c->flags[i].name, name) == 0)
            return i;
    return -1;
}

/* The last value of --name ("" for a switch given), or NULL. */
static const char *opt(const struct args *a, const char *name)
{
    int i = flag_index(a->cmd, name);
    return i >= 0 ? a->val[i] : NULL;
}

/* Says what is wrong, then the usage, on stderr. Returns EX_USAGE. */
static int usage_error(const struct command *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int usage_error(const struct command *c, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "oversub %s: ", c->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n\n");
    print_usage(c, stderr);
    return EX_USAGE;
}

/* Parses argv (argv[0] the command) against c's flags and the global ones. Returns 0, 1 when
 * the usage was asked for (printed on stdout), or EX_USAGE (said on stderr, with the usage). */
static int parse_args(const struct command *c, int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof(*a));
    a->cmd = c;
    int end = argc;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            end = i;
            a->dashdash = true;
            a->rest = argv + i + 1;
            a->n_rest = argc - i - 1;
            break;
        }
    struct option opts[MAX_FLAGS + 4];
    char shorts[3 * MAX_FLAGS + 8];
    size_t ns = 0;
    shorts[ns++] = ':';
    shorts[ns++] = 'h';
    int n = 0;
    for (; c->flags != NULL && c->flags[n].name != NULL && n < MAX_FLAGS; n++) {
        opts[n] = (struct option){
            c->flags[n].name, c->flags[n].arg ? required_argument : no_argument, NULL, 1000 + n};
        if (c->flags[n].short_name) {
            shorts[ns++] = c->flags[n].short_name;
            if (c->flags[n].arg)
                shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    opts[n] = (struct option){"json", no_argument, NULL, 900};
    opts[n + 1] = (struct option){"url", required_argument, NULL, 901};
    opts[n + 2] = (struct option){"help", no_argument, NULL, 'h'};
    opts[n + 3] = (struct option){NULL, 0, NULL, 0};
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(end, argv, shorts, opts, NULL)) != -1) {
        int idx = -1;
        if (ch == 'h') {
            print_usage(c, stdout);
            return 1;
        } else if (ch == 900) {
            as_json = true;
        } else if (ch == 901) {
            url_opt = optarg;
        } else if (ch >= 1000) {
            idx = ch - 1000;
        } else if (ch == ':') {
            return usage_error(c, "%s needs a value", argv[optind - 1]);
        } else if (ch == '?') {
            if (optopt >= 256) /* a long option that takes no value, given one */
                return usage_error(c, "'%s' takes no value", argv[optind - 1]);
            if (optopt != 0) {
                char o[3] = {'-', (char)optopt, '\0'};
                return usage_error(c, "unknown option '%s'", o);
            }
            return usage_error(c, "unknown option '%s'", argv[optind - 1]);
        } else {
            for (int i = 0; i < n; i++)
                if (c->flags[i].short_name == ch)
                    idx = i;
        }
        if (idx >= 0) {
            const char *v = c->flags[idx].arg ? optarg : "";
            a->val[idx] = v;
            if (a->n_rep == MAX_REPEATS)
                return usage_error(c, "more than %d options", MAX_REPEATS);
            a->rep[a->n_rep].flag = idx;
            a->rep[a->n_rep].v = v;
            a->n_rep++;
        }
    }
    a->pos = argv + optind;
    a->n_pos = end - optind;
    if (a->dashdash && !c->takes_rest)
        return usage_error(c, "%s takes nothing after '--'", c->name);
    if (a->n_pos > c->max_pos)
        return usage_error(c, "unexpected argument '%s'", a->pos[c->max_pos]);
    if (a->n_pos < c->min_pos)
        return usage_error(c, "missing %s", c->synopsis);
    return 0;
}

static int check_id(const char *id)
{
    if (osub_id_valid(id))
        return 0;
    fprintf(stderr,
            "oversub %s: '%s' is not a service id (1-%d characters of a-z, 0-9 and '-', starting "
            "with a letter)\n",
            cur, id, OSUB_ID_MAX);
    return EX_USAGE;
}

static void svc_path(char *out, size_t len, const char *id, const char *suffix)
{
    snprintf(out, len, "/v1/services/%s%s", id, suffix);
}

/* A size with its unit: "10" alone is refused (MiB or GiB? say which). */
static int size_arg(const char *flag, const char *v, int64_t *out)
{
    if (osub_parse_size_mib(v, 0, out) != 0) {
        fprintf(stderr,
                "oversub %s: %s: '%s' is not a size (say 120GiB, 0.5GiB, 81920MiB, 80GB or "
                "1TiB)\n",
                cur, flag, v);
        return EX_USAGE;
    }
    size_t l = strlen(v);
    while (l > 0 && isspace((unsigned char)v[l - 1]))
        l--;
    if (l > 0 && (isdigit((unsigned char)v[l - 1]) || v[l - 1] == '.')) {
        char as_gib[64], as_mib[64];
        if (*out < 1024) { /* 10: likely GiB */
            int64_t g = 0;
            snprintf(as_gib, sizeof(as_gib), "%.*sGiB", (int)l, v);
            osub_parse_size_mib(as_gib, 0, &g);
            snprintf(as_mib, sizeof(as_mib), "%lldMiB", (long long)g);
            fprintf(stderr, "oversub %s: %s: %.*s is not a size: say %s or %s\n", cur, flag, (int)l,
                    v, as_gib, as_mib);
        } else { /* 81920: likely MiB */
            snprintf(as_mib, sizeof(as_mib), "%.*sMiB", (int)l, v);
            if (*out % 1024 == 0)
                snprintf(as_gib, sizeof(as_gib), "%lldGiB", (long long)(*out / 1024));
            else
                snprintf(as_gib, sizeof(as_gib), "%.2fGiB", (double)*out / 1024.0);
            fprintf(stderr, "oversub %s: %s: %.*s is not a size: say %s or %s\n", cur, flag, (int)l,
                    v, as_mib, as_gib);
        }
        return EX_USAGE;
    }
    return 0;
}

static int num_arg(const char *flag, const char *v, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < min || n > max) {
        fprintf(stderr, "oversub %s: %s: '%s' is not a whole number from %ld to %ld\n", cur, flag,
                v, min, max);
        return EX_USAGE;
    }
    *out = n;
    return 0;
}

/* ---- events ---------------------------------------------------------------------------- */

/* One page of the log after `since`: its number of events and its "next". */
static int events_page(long long since, size_t *n, long long *next)
{
    char path[96];
    snprintf(path, sizeof(path), "/v1/events?since=%lld&wait=0", since);
    int ex;
    json_t *r = call("GET", path, NULL, &ex);
    if (r == NULL || ex != EX_OK) {
        json_decref(r);
        return ex;
    }
    *n = json_array_size(json_object_get(r, "events"));
    *next = geti(r, "next");
    json_decref(r);
    return EX_OK;
}

#define EVENTS_PAGE 1000 /* the daemon's page */

/* The newest event's seq (0: none) without reading the whole log: a page that is not full
 * ends at the newest event, and a search over `since` finds one in about 2 log2(N/1000)
 * pages. Returns an exit code. */
static int newest_seq(long long *out)
{
    size_t n;
    long long next;
    int ex = events_page(0, &n, &next);
    if (ex != EX_OK)
        return ex;
    if (n < EVENTS_PAGE) {
        *out = n > 0 ? next : 0;
        return EX_OK;
    }
    /* lo: an event's seq; hi: no event after it (once known) */
    long long lo = next, hi = -1, step = EVENTS_PAGE;
    while (hi < 0) {
        long long x = lo + step;
        if ((ex = events_page(x, &n, &next)) != EX_OK)
            return ex;
        if (n == 0) {
            hi = x;
        } else if (n < EVENTS_PAGE) {
            *out = next;
            return EX_OK;
        } else {
            lo = next;
            step *= 2;
        }
    }
    while (hi > lo) {
        long long mid = lo + (hi - lo) / 2;
        if ((ex = events_page(mid, &n, &next)) != EX_OK)
            return ex;
        if (n == 0) {
            hi = mid;
        } else if (n < EVENTS_PAGE) {
            *out = next;
            return EX_OK;
        } else {
            lo = next;
        }
    }
    *out = lo;
    return EX_OK;
}

static void print_event(json_t *e)
{
    char ts[64];
    fmt_time(geti(e, "time_unix_ms"), true, ts, sizeof(ts));
    printf("%6lld %s %-9s %-14s %s\n", (long long)geti(e, "seq"), ts, gets_(e, "kind"),
           gets_(e, "reason"), gets_(e, "message"));
}

static int cmd_events(const struct args *a)
{
    bool follow = opt(a, "follow") != NULL;
    long long since = 0;
    const char *s = opt(a, "since"), *last = opt(a, "last");
    if (s != NULL && last != NULL) {
        fprintf(stderr, "oversub events: --since or --last, not both\n");
        return EX_USAGE;
    }
    if (s != NULL) {
        long v;
        if (num_arg("--since", s, 0, LONG_MAX, &v) != 0)
            return EX_USAGE;
        since = v;
    } else if (last != NULL || follow) {
        long nlast = 0;
        if (last != NULL && num_arg("--last", last, 0, 1000000, &nlast) != 0)
            return EX_USAGE;
        int ex = newest_seq(&since);
        if (ex != EX_OK)
            return ex;
        since = since > nlast ? since - nlast : 0;
    }
    if (follow) {
        fprintf(stderr,
                "oversub events: following the decision log after seq %lld (Ctrl-C stops)\n",
                since);
    }
    json_t *all = as_json && !follow ? json_array() : NULL;
    for (;;) {
        char path[96];
        snprintf(path, sizeof(path), "/v1/events?since=%lld&wait=%d", since, follow ? 30 : 0);
        int ex;
        json_t *r = call("GET", path, NULL, &ex);
        if (r == NULL || ex != EX_OK) {
            json_decref(r);
            json_decref(all);
            return ex;
        }
        json_t *evs = json_object_get(r, "events");
        size_t i;
        json_t *e;
        json_array_foreach(evs, i, e)
        {
            if (all != NULL) {
                json_array_append(all, e);
            } else if (as_json) { /* --follow --json: one event a line */
                json_dumpf(e, stdout, JSON_COMPACT);
                fputc('\n', stdout);
            } else {
                print_event(e);
            }
        }
        fflush(stdout);
        size_t n = json_array_size(evs);
        since = geti(r, "next");
        json_decref(r);
        if (!follow && n < EVENTS_PAGE)
            break;
    }
    if (all != NULL) {
        json_t *doc = json_pack("{s:o, s:I}", "events", all, "next", (json_int_t)since);
        print_json(doc);
        json_decref(doc);
    }
    return EX_OK;
}

/* ---- status, list ---------------------------------------------------------------------- */

static void process_text(json_t *s, char *proc, size_t len)
{
    snprintf(proc, len, "-");
    json_t *pr = json_object_get(s, "process");
    if (pr != NULL && json_is_true(json_object_get(pr, "alive")))
        snprintf(proc, len, "pid %lld", (long long)geti(pr, "pid"));
    else if (pr != NULL)
        snprintf(proc, len, "not running");
    else if (json_object_get(s, "pid") != NULL)
        snprintf(proc, len, "pid %lld (external)", (long long)geti(s, "pid"));
    if (pr != NULL && geti(pr, "restarts") > 0) {
        size_t l = strlen(proc);
        snprintf(proc + l, len - l, ", %lld restart(s)", (long long)geti(pr, "restarts"));
    }
}

static int cmd_status(const struct args *a)
{
    (void)a;
    int ex;
    json_t *pool = call("GET", "/v1/pool", NULL, &ex);
    if (pool == NULL || ex) {
        json_decref(pool);
        return ex;
    }
    json_t *svcs = call("GET", "/v1/services", NULL, &ex);
    if (svcs == NULL || ex) {
        json_decref(pool);
        json_decref(svcs);
        return ex;
    }
    if (as_json) {
        json_t *all =
            json_pack("{s:O, s:O}", "pool", pool, "services", json_object_get(svcs, "services"));
        print_json(all);
        json_decref(all);
    } else {
        json_t *u = json_object_get(pool, "utilization");
        printf("ratio %s   used %.1f%%   held %.1f%%   logical %.1f%%%s\n\n",
               gets_(pool, "ratio_text"), 100 * json_number_value(json_object_get(u, "used")),
               100 * json_number_value(json_object_get(u, "held")),
               100 * json_number_value(json_object_get(u, "logical")),
               json_is_true(json_object_get(pool, "overcommitted")) ? "   OVER-COMMITTED" : "");
        printf("%-4s %9s %9s %9s %9s %9s  %s\n", "GPU", "VRAM", "logical", "granted", "held",
               "used", "");
        size_t i;
        json_t *g;
        json_array_foreach(json_object_get(pool, "gpus"), i, g)
        {
            printf("%-4lld %9lld %9lld %9lld %9lld %9lld  %s%s\n", (long long)geti(g, "index"),
                   (long long)geti(g, "vram_mib"), (long long)geti(g, "logical_mib"),
                   (long long)geti(g, "granted_mib"), (long long)geti(g, "held_mib"),
                   (long long)geti(g, "used_mib"),
                   json_is_true(json_object_get(g, "cordoned")) ? "cordoned " : "",
                   json_is_true(json_object_get(g, "lost")) ? "lost" : "");
        }
        printf("\n%-24s %-10s %-9s %9s %9s %9s  %-8s %s\n", "SERVICE", "CLASS", "STATE", "grant",
               "held", "used", "GPUs", "PROCESS");
        json_t *s;
        json_array_foreach(json_object_get(svcs, "services"), i, s)
        {
            char gpus[128], proc[64];
            fmt_gpus(s, gpus, sizeof(gpus));
            process_text(s, proc, sizeof(proc));
            printf("%-24s %-10s %-9s %9lld %9lld %9lld  %-8s %s\n", gets_(s, "id"),
                   gets_(s, "class"), gets_(s, "state"), (long long)geti(s, "grant_mib"),
                   (long long)geti(s, "held_mib"), (long long)geti(s, "used_mib"),
                   gpus[0] ? gpus : "-", proc);
        }
        printf("(MiB)\n");
    }
    json_decref(pool);
    json_decref(svcs);
    return EX_OK;
}

static int cmd_list(const struct args *a)
{
    int ex;
    json_t *r = call("GET", "/v1/services", NULL, &ex);
    if (r == NULL || ex) {
        json_decref(r);
        return ex;
    }
    json_t *list = json_object_get(r, "services");
    size_t i;
    json_t *s;
    if (as_json) {
        print_json(r);
    } else if (opt(a, "ids") != NULL) {
        json_array_foreach(list, i, s) printf("%s\n", gets_(s, "id"));
    } else {
        printf("%-24s %-10s %-9s %9s %9s  %s\n", "SERVICE", "CLASS", "STATE", "grant MiB",
               "vram MiB", "GPUs");
        json_array_foreach(list, i, s)
        {
            char gpus[128];
            fmt_gpus(s, gpus, sizeof(gpus));
            printf("%-24s %-10s %-9s %9lld %9lld  %s\n", gets_(s, "id"), gets_(s, "class"),
                   gets_(s, "state"), (long long)geti(s, "grant_mib"),
                   (long long)geti(s, "vram_mib"), gpus[0] ? gpus : "-");
        }
    }
    json_decref(r);
    return EX_OK;
}

/* ---- ready ----------------------------------------------------------------------------- */

static bool is_up(const char *st)
{
    return strcmp(st, "running") == 0 || strcmp(st, "degraded") == 0;
}

/* The last event about id among the 1000 before `upto` (its message, or ""). */
static void last_event_about(const char *id, long long upto, char *out, size_t len)
{
    out[0] = '\0';
    char path[96];
    snprintf(path, sizeof(path), "/v1/events?since=%lld&wait=0",
             upto > EVENTS_PAGE ? upto - EVENTS_PAGE : 0);
    int st;
    json_t *r = request("GET", path, NULL, &st);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r, "events"), i, e)
    {
        if (strcmp(gets_(e, "service"), id) == 0)
            snprintf(out, len, "%s", gets_(e, "message"));
    }
    json_decref(r);
}

/* The line that says a service is up. */
static void print_up(json_t *s, double waited_s)
{
    char gpus[128];
    fmt_gpus(s, gpus, sizeof(gpus));
    const char *st = gets_(s, "state");
    printf("%s: %s on GPU%s %s with %lld MiB", gets_(s, "id"), st, strchr(gpus, ',') ? "s" : "",
           gpus[0] ? gpus : "-", (long long)geti(s, "grant_mib"));
    if (strcmp(st, "degraded") == 0)
        printf(" (degraded: its floor; it asked for %lld MiB)", (long long)geti(s, "vram_mib"));
    if (waited_s >= 0.05)
        printf(" (waited %.1f s)", waited_s);
    printf("\n");
    fflush(stdout);
}

/* Waits until id is running (or degraded: running at its floor), following the event log's
 * long poll and looking at the service after each wake. timeout_s 0: no limit. Returns an
 * exit code: 0 with the service in *out (new reference), 1 when it failed or is gone (said),
 * 3 on timeout or when the daemon cannot be reached. */
static int wait_ready(const char *id, long timeout_s, json_t **out)
{
    *out = NULL;
    double t0 = mono_s();
    long long since = 0;
    int ex = newest_seq(&since);
    if (ex != EX_OK)
        return ex;
    char path[160], reason[1024] = "";
    svc_path(path, sizeof(path), id, "");
    bool told = false;
    for (;;) {
        int status;
        json_t *s = request("GET", path, NULL, &status);
        if (s == NULL)
            return EX_UNREACHABLE;
        if (status == 404) {
            json_decref(s);
            if (reason[0] == '\0')
                last_event_about(id, since, reason, sizeof(reason));
            char msg[1400];
            snprintf(msg, sizeof(msg), "%s is not deployed: %s", id,
                     reason[0] ? reason : "no such service (released, refused or never deployed)");
            fprintf(stderr, "oversub %s: %s\n", cur, msg);
            json_error("not_ready", msg, json_pack("{s:s, s:s}", "id", id, "state", "released"));
            return EX_REFUSED;
        }
        if (status >= 400) {
            const char *m =
                json_string_value(json_object_get(json_object_get(s, "error"), "message"));
            fprintf(stderr, "oversub %s: refused (%d): %s\n", cur, status, m ? m : "");
            if (as_json)
                print_json(s);
            json_decref(s);
            return EX_REFUSED;
        }
        const char *st = gets_(s, "state");
        if (is_up(st)) {
            *out = s;
            return EX_OK;
        }
        if (strcmp(st, "failed") == 0 || strcmp(st, "released") == 0) {
            if (reason[0] == '\0')
                last_event_about(id, since, reason, sizeof(reason));
            char msg[1400];
            snprintf(msg, sizeof(msg), "%s is %s: %s", id, st,
                     reason[0] ? reason : "(no event says why)");
            fprintf(stderr, "oversub %s: %s\n", cur, msg);
            json_error("not_ready", msg, json_pack("{s:s, s:s}", "id", id, "state", st));
            json_decref(s);
            return EX_REFUSED;
        }
        double left = timeout_s > 0 ? (double)timeout_s - (mono_s() - t0) : 30;
        if (left <= 0) {
            char msg[1400];
            snprintf(msg, sizeof(msg), "%s is still %s after %ld s%s%s", id, st, timeout_s,
                     reason[0] ? "; last: " : "", reason);
            fprintf(stderr, "oversub %s: %s (timeout; see 'oversub explain %s')\n", cur, msg, id);
            json_error("timeout", msg, json_pack("{s:s, s:s}", "id", id, "state", st));
            json_decref(s);
            return EX_TIMEOUT;
        }
        if (!told) {
            char lim[48] = "";
            if (timeout_s > 0)
                snprintf(lim, sizeof(lim), " (at most %ld s)", timeout_s);
            fprintf(stderr, "oversub %s: %s is %s; waiting until it is running%s\n", cur, id, st,
                    lim);
            told = true;
        }
        json_decref(s);
        int wait = left > 30 ? 30 : (int)(left + 0.999);
        if (wait < 1)
            wait = 1;
        char epath[96];
        snprintf(epath, sizeof(epath), "/v1/events?since=%lld&wait=%d", since, wait);
        json_t *r = request("GET", epath, NULL, &status);
        if (r == NULL)
            return EX_UNREACHABLE;
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(r, "events"), i, e)
        {
            if (strcmp(gets_(e, "service"), id) == 0)
                snprintf(reason, sizeof(reason), "%s", gets_(e, "message"));
        }
        if (status == 200 && json_integer_value(json_object_get(r, "next")) > since)
            since = geti(r, "next");
        json_decref(r);
    }
}

static int timeout_arg(const struct args *a, long *timeout_s)
{
    *timeout_s = 300;
    const char *t = opt(a, "timeout");
    return t != NULL ? num_arg("--timeout", t, 0, 86400 * 365, timeout_s) : 0;
}

static int cmd_ready(const struct args *a)
{
    const char *id = a->pos[0];
    long timeout_s;
    if (check_id(id) != 0 || timeout_arg(a, &timeout_s) != 0)
        return EX_USAGE;
    double t0 = mono_s();
    json_t *s;
    int ex = wait_ready(id, timeout_s, &s);
    if (ex != EX_OK)
        return ex;
    if (as_json)
        print_json(s);
    else
        print_up(s, mono_s() - t0);
    json_decref(s);
    return EX_OK;
}

/* ---- deploy ---------------------------------------------------------------------------- */

static const struct {
    const char *flag, *key;
} spec_strings[] = {{"class", "class"},     {"user", "user"},
                    {"workdir", "workdir"}, {"checkpoint-dir", "checkpoint_dir"},
                    {"restart", "restart"}, {"control-url", "control_url"}};

static const struct {
    const char *flag, *key;
    long max;
} spec_numbers[] = {{"gpus", "gpus", 4096},
                    {"compute", "compute_pct", 100},
                    {"batch", "batch_size", 1000000},
                    {"min-batch", "min_batch_size", 1000000},
                    {"max-inflight", "max_inflight", 1000000},
                    {"max-queue", "max_queue", 1000000},
                    {"queue-timeout", "queue_timeout_ms", 86400000},
                    {"grace", "grace_ms", 86400000},
                    {"restart-cost", "restart_cost_ms", 86400000},
                    {"max-restarts", "max_restarts", 1000000}};

/* What the daemon decided, in a line or a few (not --json). */
static void print_deploy(const char *id, json_t *r, bool dry, bool will_wait)
{
    json_t *dec = json_object_get(r, "decision");
    const char *outcome = gets_(dec, "outcome");
    char gpus[128] = "", dur[32];
    size_t k;
    json_t *g;
    json_array_foreach(json_object_get(dec, "gpus"), k, g)
    {
        size_t l = strlen(gpus);
        if (l + 16 < sizeof(gpus))
            snprintf(gpus + l, sizeof(gpus) - l, "%s%lld", k ? "," : "",
                     (long long)json_integer_value(g));
    }
    const char *gs = strchr(gpus, ',') ? "s" : "";
    const char *st = dry ? "" : gets_(r, "state");
    bool hint = false;
    if (dry) {
        if (strcmp(outcome, "started") == 0)
            printf("(dry run) %s: would start on GPU%s %s\n", id, gs, gpus);
        else if (strcmp(outcome, "pending") == 0)
            printf("(dry run) %s: would be pending on GPU%s %s, waiting for its victims\n", id, gs,
                   gpus);
        else if (strcmp(outcome, "queued") == 0)
            printf("(dry run) %s: would be queued at position %lld\n", id,
                   (long long)geti(dec, "queue_position"));
        else
            printf("(dry run) %s: %s\n", id, outcome);
    } else if (strcmp(outcome, "exists") == 0) {
        printf("%s: already deployed with this spec; it is %s\n", id, st);
        hint = !is_up(st);
    } else if (strcmp(st, "loading") == 0) {
        fmt_dur(geti(r, "restart_cost_ms"), dur, sizeof(dur));
        printf("%s: loading on GPU%s %s with %lld MiB; it is running once it reports ready (or "
               "after %s)\n",
               id, gs, gpus, (long long)geti(r, "grant_mib"), dur);
        hint = true;
    } else if (strcmp(st, "pending") == 0) {
        printf("%s: pending on GPU%s %s: it loads once its victims have given their memory "
               "back\n",
               id, gs, gpus);
        hint = true;
    } else if (strcmp(st, "queued") == 0) {
        printf("%s: queued at position %lld: no GPU has room for it now", id,
               (long long)geti(r, "queue_position"));
        if (json_object_get(dec, "shortfall_mib"))
            printf(" (the %s check is short by %lld MiB on GPU %lld)", gets_(dec, "check"),
                   (long long)geti(dec, "shortfall_mib"), (long long)geti(dec, "gpu"));
        printf("; it starts when memory comes free\n");
        hint = true;
    } else if (is_up(st)) {
        print_up(r, 0);
    } else {
        printf("%s: %s\n", id, st[0] ? st : outcome);
    }
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(dec, "victims"), i, v)
    {
        char when[64];
        fmt_dur(geti(v, "deadline_unix_ms") - now_unix_ms(), when, sizeof(when));
        printf("  victim: %s %s (deadline in %s)\n", gets_(v, "action"), gets_(v, "service"), when);
    }
    if (hint && !will_wait)
        printf("  next: 'oversub ready %s' waits until it is running\n", id);
    fflush(stdout);
}

static int cmd_deploy(const struct args *a)
{
    const char *id = a->pos[0];
    if (check_id(id) != 0)
        return EX_USAGE;
    if (opt(a, "class") == NULL) {
        fprintf(stderr,
                "oversub deploy: --class is required: online (never preempted, backed by "
                "physical memory), batch (degraded, then evicted, before online work) or "
                "experiment (first to go)\n"
                "  e.g. oversub deploy %s --class batch --vram 20GiB\n",
                id);
        return EX_USAGE;
    }
    if (opt(a, "vram") == NULL) {
        fprintf(stderr, "oversub deploy: --vram is required (its memory, such as 20GiB)\n");
        return EX_USAGE;
    }
    bool dry = opt(a, "dry-run") != NULL, wait = opt(a, "wait") != NULL;
    long timeout_s;
    if (timeout_arg(a, &timeout_s) != 0)
        return EX_USAGE;
    if (dry && wait) {
        fprintf(stderr, "oversub deploy: --dry-run deploys nothing to wait for (drop --wait)\n");
        return EX_USAGE;
    }
    if (opt(a, "timeout") != NULL && !wait) {
        fprintf(stderr, "oversub deploy: --timeout goes with --wait\n");
        return EX_USAGE;
    }
    json_t *spec = json_pack("{s:s}", "id", id);
    int64_t v;
    for (size_t i = 0; i < sizeof(spec_strings) / sizeof(spec_strings[0]); i++) {
        const char *s = opt(a, spec_strings[i].flag);
        if (s != NULL)
            json_object_set_new(spec, spec_strings[i].key, json_string(s));
    }
    for (size_t i = 0; i < sizeof(spec_numbers) / sizeof(spec_numbers[0]); i++) {
        const char *s = opt(a, spec_numbers[i].flag);
        long n;
        if (s == NULL)
            continue;
        char flag[32];
        snprintf(flag, sizeof(flag), "--%s", spec_numbers[i].flag);
        if (num_arg(flag, s, 0, spec_numbers[i].max, &n) != 0)
            goto usage;
        json_object_set_new(spec, spec_numbers[i].key, json_integer(n));
    }
    if (size_arg("--vram", opt(a, "vram"), &v) != 0)
        goto usage;
    json_object_set_new(spec, "vram_mib", json_integer(v));
    if (opt(a, "min-vram") != NULL) {
        if (size_arg("--min-vram", opt(a, "min-vram"), &v) != 0)
            goto usage;
        json_object_set_new(spec, "min_vram_mib", json_integer(v));
    }
    if (opt(a, "exclusive") != NULL)
        json_object_set_new(spec, "exclusive", json_true());
    if (opt(a, "resumable") != NULL)
        json_object_set_new(spec, "resumable", json_true());
    if (opt(a, "no-queue") != NULL)
        json_object_set_new(spec, "queue", json_false());
    int i_env = flag_index(a->cmd, "env"), i_backend = flag_index(a->cmd, "backend");
    for (int i = 0; i < a->n_rep; i++) {
        const char *val = a->rep[i].v;
        if (a->rep[i].flag == i_backend) {
            json_t *list = json_object_get(spec, "backends");
            if (list == NULL) {
                list = json_array();
                json_object_set_new(spec, "backends", list);
            }
            json_array_append_new(list, json_string(val));
        } else if (a->rep[i].flag == i_env) {
            const char *eq = strchr(val, '=');
            if (eq == NULL || eq == val) {
                fprintf(stderr, "oversub deploy: --env wants NAME=VALUE, not '%s'\n", val);
                goto usage;
            }
            json_t *env = json_object_get(spec, "env");
            if (env == NULL) {
                env = json_object();
                json_object_set_new(spec, "env", env);
            }
            char name[256];
            snprintf(name, sizeof(name), "%.*s", (int)(eq - val), val);
            json_object_set_new(env, name, json_string(eq + 1));
        }
    }
    if (a->dashdash) {
        if (a->n_rest == 0) {
            fprintf(stderr, "oversub deploy: '--' with no program after it\n");
            goto usage;
        }
        json_t *cmdv = json_array();
        for (int i = 0; i < a->n_rest; i++)
            json_array_append_new(cmdv, json_string(a->rest[i]));
        json_object_set_new(spec, "command", cmdv);
    }
    int ex;
    json_t *r = call("POST", dry ? "/v1/services?dry_run=1" : "/v1/services", spec, &ex);
    json_decref(spec);
    if (r == NULL)
        return ex;
    if (ex != EX_OK) {
        json_t *dec = json_object_get(r, "decision");
        if (!as_json && json_object_get(dec, "shortfall_mib") != NULL) {
            fprintf(stderr, "  the %s check is short by %lld MiB", gets_(dec, "check"),
                    (long long)geti(dec, "shortfall_mib"));
            if (json_object_get(dec, "gpu") != NULL)
                fprintf(stderr, " on GPU %lld", (long long)geti(dec, "gpu"));
            fprintf(stderr, "\n");
        }
        json_decref(r);
        return ex;
    }
    if (!as_json)
        print_deploy(id, r, dry, wait);
    if (!wait || is_up(gets_(r, "state"))) {
        if (as_json)
            print_json(r);
        json_decref(r);
        return EX_OK;
    }
    double t0 = mono_s();
    json_t *s;
    cur = "deploy --wait";
    ex = wait_ready(id, timeout_s, &s);
    if (ex == EX_OK) {
        if (as_json) { /* one document: the service now, with the submit's decision and token */
            json_object_set(s, "decision", json_object_get(r, "decision"));
            json_object_set(s, "token", json_object_get(r, "token"));
            print_json(s);
        } else {
            print_up(s, mono_s() - t0);
        }
        json_decref(s);
    }
    json_decref(r);
    return ex;
usage:
    json_decref(spec);
    return EX_USAGE;
}

/* ---- resize, usage, release ------------------------------------------------------------ */

/* A service's request, grant and state in a line (after resize, usage). */
static void print_service_line(json_t *s)
{
    char gpus[128];
    fmt_gpus(s, gpus, sizeof(gpus));
    printf("%s: %s, request %lld MiB", gets_(s, "id"), gets_(s, "state"),
           (long long)geti(s, "vram_mib"));
    if (geti(s, "min_vram_mib") != geti(s, "vram_mib"))
        printf(" (floor %lld MiB)", (long long)geti(s, "min_vram_mib"));
    printf(", grant %lld MiB, used %lld MiB", (long long)geti(s, "grant_mib"),
           (long long)geti(s, "used_mib"));
    if (geti(s, "batch") > 0)
        printf(", batch %lld", (long long)geti(s, "batch"));
    if (gpus[0])
        printf(", GPU%s %s", strchr(gpus, ',') ? "s" : "", gpus);
    printf("\n");
}

static int service_cmd(const char *method, const char *path, json_t *body)
{
    int ex;
    json_t *r = call(method, path, body, &ex);
    if (r == NULL || ex != EX_OK) {
        json_decref(r);
        return ex;
    }
    if (as_json)
        print_json(r);
    else if (strcmp(method, "DELETE") == 0 || strcmp(gets_(r, "state"), "released") == 0)
        printf("%s: %s\n", gets_(r, "id"), gets_(r, "state"));
    else
        print_service_line(r);
    json_decref(r);
    return EX_OK;
}

static int cmd_release(const struct args *a)
{
    char path[160];
    if (check_id(a->pos[0]) != 0)
        return EX_USAGE;
    svc_path(path, sizeof(path), a->pos[0], "");
    return service_cmd("DELETE", path, NULL);
}

static int cmd_usage(const struct args *a)
{
    const char *id = a->pos[0];
    if (check_id(id) != 0)
        return EX_USAGE;
    if (opt(a, "vram") == NULL) {
        fprintf(stderr, "oversub usage: --vram is required (the memory it uses now, such as "
                        "12GiB)\n");
        return EX_USAGE;
    }
    int64_t v;
    if (size_arg("--vram", opt(a, "vram"), &v) != 0)
        return EX_USAGE;
    json_t *b = json_pack("{s:I}", "vram_mib", (json_int_t)v);
    if (opt(a, "compute") != NULL) {
        long pct;
        if (num_arg("--compute", opt(a, "compute"), 0, 100, &pct) != 0) {
            json_decref(b);
            return EX_USAGE;
        }
        json_object_set_new(b, "compute_pct", json_integer(pct));
    }
    char path[160];
    svc_path(path, sizeof(path), id, "/usage");
    int ex = service_cmd("PUT", path, b);
    json_decref(b);
    return ex;
}

static int cmd_resize(const struct args *a)
{
    const char *id = a->pos[0];
    if (check_id(id) != 0)
        return EX_USAGE;
    json_t *b = json_object();
    int64_t v;
    long n;
    static const char *const sizes[][2] = {{"vram", "vram_mib"}, {"min-vram", "min_vram_mib"}};
    for (size_t i = 0; i < 2; i++) {
        const char *s = opt(a, sizes[i][0]);
        char flag[32];
        snprintf(flag, sizeof(flag), "--%s", sizes[i][0]);
        if (s == NULL)
            continue;
        if (size_arg(flag, s, &v) != 0)
            goto usage;
        json_object_set_new(b, sizes[i][1], json_integer(v));
    }
    if (opt(a, "batch") != NULL) {
        if (num_arg("--batch", opt(a, "batch"), 1, 1000000, &n) != 0)
            goto usage;
        json_object_set_new(b, "batch_size", json_integer(n));
    }
    if (json_object_size(b) == 0) {
        fprintf(stderr, "oversub resize: say what changes: --vram, --min-vram or --batch\n");
        goto usage;
    }
    char path[160];
    svc_path(path, sizeof(path), id, "");
    int ex = service_cmd("PATCH", path, b);
    json_decref(b);
    return ex;
usage:
    json_decref(b);
    return EX_USAGE;
}

/* ---- explain --------------------------------------------------------------------------- */

static int cmd_explain(const struct args *a)
{
    const char *id = a->pos[0];
    if (check_id(id) != 0)
        return EX_USAGE;
    char path[160];
    svc_path(path, sizeof(path), id, "");
    int ex;
    json_t *s = call("GET", path, NULL, &ex);
    if (s == NULL || ex) {
        json_decref(s);
        return ex;
    }
    if (as_json) {
        print_json(s);
        json_decref(s);
        return EX_OK;
    }
    int64_t now = now_unix_ms();
    char when[64], in[32];
    const char *st = gets_(s, "state");
    printf("%s (%s) is %s", id, gets_(s, "class"), st);
    if (strcmp(st, "queued") == 0) {
        printf(" at position %lld of the queue: no GPU has room for its %lld MiB even with the "
               "lower-priority services it may preempt; it starts when memory comes free\n",
               (long long)geti(s, "queue_position"), (long long)geti(s, "vram_mib"));
    } else if (strcmp(st, "pending") == 0) {
        printf(": placed, waiting for the memory of its victims:\n");
        size_t i;
        json_t *w;
        json_array_foreach(json_object_get(s, "waiting_for"), i, w)
        {
            fmt_time(geti(w, "deadline_unix_ms"), false, when, sizeof(when));
            fmt_dur(geti(w, "deadline_unix_ms") - now, in, sizeof(in));
            printf("  - %s of %s (deadline %s, in %s)\n", gets_(w, "action"), gets_(w, "service"),
                   when, in);
        }
    } else if (strcmp(st, "degraded") == 0) {
        printf(": running at its floor, %lld MiB instead of %lld, until its GPUs have had room "
               "for what it is expected to hold once restored (its predicted peak, %lld MiB, "
               "beside what its neighbours may still rise to) for the hysteresis window\n",
               (long long)geti(s, "grant_mib"), (long long)geti(s, "vram_mib"),
               (long long)geti(json_object_get(s, "prediction"), "peak_mib"));
    } else if (strcmp(st, "draining") == 0) {
        fmt_time(geti(s, "deadline_unix_ms"), false, when, sizeof(when));
        printf(": evicted; its memory is counted until it exits (grace until %s)\n", when);
    } else if (strcmp(st, "overdue") == 0) {
        printf(": evicted and past its grace period; its memory is counted until it exits (a "
               "service waiting for it went back to the queue)\n");
    } else if (strcmp(st, "loading") == 0) {
        printf(": started; until it reports ready (or its restart cost passes) it holds its "
               "whole grant of %lld MiB ('oversub ready %s' waits for it)\n",
               (long long)geti(s, "grant_mib"), id);
    } else {
        printf(": holds %lld MiB, uses %lld MiB\n", (long long)geti(s, "held_mib"),
               (long long)geti(s, "used_mib"));
    }
    /* its prediction, and why its GPU was chosen */
    json_t *pr0 = json_object_get(s, "prediction");
    if (pr0 != NULL) {
        long long n = (long long)geti(pr0, "reports");
        if (n == 0)
            printf("  predicted peak: %lld MiB, its request (no usage reported yet)\n",
                   (long long)geti(pr0, "peak_mib"));
        else
            printf("  predicted peak: %lld MiB from %lld usage report(s) (request %lld MiB); an "
                   "admission now would count it as %lld MiB\n",
                   (long long)geti(pr0, "peak_mib"), n, (long long)geti(s, "vram_mib"),
                   (long long)geti(pr0, "charge_mib"));
    }
    json_t *pb = json_object_get(s, "placed_because");
    json_t *place = json_object_get(s, "placement");
    if (pb != NULL && json_array_size(place) > 0) {
        bool tight = json_is_true(json_object_get(pb, "tightest_fit"));
        size_t np = json_array_size(place);
        char gl[256];
        fmt_gpus(s, gl, sizeof(gl));
        printf("  placed on GPU%s %s: %s counted as %lld MiB, the projected peak %s was %lld of "
               "%lld MiB, %s\n",
               np > 1 ? "s" : "", gl, np > 1 ? "its share on each GPU" : "it was",
               (long long)geti(pb, "charge_per_gpu_mib"),
               np > 1 ? "on the fullest of them" : "there",
               (long long)geti(pb, "projected_peak_mib"), (long long)geti(pb, "limit_mib"),
               tight ? "the tightest fit under that limit"
                     : "the GPU that overshot that limit least (none had room under it)");
    }
    /* a managed service: its process, and what eviction does to it */
    json_t *pr = json_object_get(s, "process");
    if (pr != NULL) {
        if (json_is_true(json_object_get(pr, "alive")))
            printf("  managed: process %lld", (long long)geti(pr, "pid"));
        else
            printf("  managed: no process now");
        if (geti(pr, "restarts") > 0)
            printf(", %lld restart(s)", (long long)geti(pr, "restarts"));
        printf("; log %s (oversub logs %s)\n", gets_(pr, "log"), id);
        if (strcmp(st, "draining") == 0 || strcmp(st, "overdue") == 0)
            printf(
                "  it got SIGTERM when evicted; its process group gets SIGKILL at the deadline\n");
        if (strcmp(st, "queued") == 0 && gets_(s, "checkpoint")[0])
            printf("  it will be started again with OVERSUB_RESUME_FROM=%s\n",
                   gets_(s, "checkpoint"));
    }
    json_decref(s);
    return EX_OK;
}

/* ---- queue ----------------------------------------------------------------------------- */

/* Who waits: queued services in queue order (what they need, since when, resumed from what),
 * then pending ones with the victims they wait for and those victims' deadlines. */
static int cmd_queue(const struct args *a)
{
    (void)a;
    int ex;
    json_t *r = call("GET", "/v1/services", NULL, &ex);
    if (r == NULL || ex) {
        json_decref(r);
        return ex;
    }
    json_t *queued = json_array(), *pending = json_array();
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(r, "services"), i, s)
    {
        if (strcmp(gets_(s, "state"), "queued") == 0) {
            /* in queue order */
            size_t at = 0;
            while (at < json_array_size(queued) &&
                   geti(json_array_get(queued, at), "queue_position") < geti(s, "queue_position"))
                at++;
            json_array_insert(queued, at, s);
        } else if (strcmp(gets_(s, "state"), "pending") == 0) {
            json_array_append(pending, s);
        }
    }
    if (as_json) {
        json_t *o = json_pack("{s:O, s:O}", "queued", queued, "pending", pending);
        print_json(o);
        json_decref(o);
        json_decref(queued);
        json_decref(pending);
        json_decref(r);
        return EX_OK;
    }
    int64_t now = now_unix_ms();
    if (json_array_size(queued) + json_array_size(pending) == 0)
        printf("nobody waits\n");
    if (json_array_size(queued) > 0) {
        printf("%-4s %-24s %-10s %10s  %-25s %8s  %s\n", "POS", "SERVICE", "CLASS", "NEEDS",
               "WAITING SINCE", "FOR", "NOTE");
        json_array_foreach(queued, i, s)
        {
            char when[64], dur[32];
            fmt_time(geti(s, "since_unix_ms"), false, when, sizeof(when));
            fmt_dur(now - geti(s, "since_unix_ms"), dur, sizeof(dur));
            char note[200] = "";
            if (geti(s, "evictions") > 0)
                snprintf(
                    note, sizeof(note), "evicted %lld time(s)%s%s", (long long)geti(s, "evictions"),
                    gets_(s, "checkpoint")[0] ? "; resumes from " : "", gets_(s, "checkpoint"));
            printf("%-4lld %-24s %-10s %6lld MiB  %-25s %8s  %s\n",
                   (long long)geti(s, "queue_position"), gets_(s, "id"), gets_(s, "class"),
                   (long long)geti(s, "vram_mib"), when, dur, note);
        }
    }
    json_array_foreach(pending, i, s)
    {
        printf("%s%s (%s, %lld MiB) is placed and waits for:\n",
               i == 0 && json_array_size(queued) ? "\n" : "", gets_(s, "id"), gets_(s, "class"),
               (long long)geti(s, "vram_mib"));
        size_t k;
        json_t *w;
        json_array_foreach(json_object_get(s, "waiting_for"), k, w)
        {
            char dur[32];
            fmt_dur(geti(w, "deadline_unix_ms") - now, dur, sizeof(dur));
            printf("  the %s of %s (deadline in %s)\n", gets_(w, "action"), gets_(w, "service"),
                   dur);
        }
    }
    json_decref(queued);
    json_decref(pending);
    json_decref(r);
    return EX_OK;
}

/* ---- logs ------------------------------------------------------------------------------ */

/* Prints the last n lines of f (looking at most 1 MiB back) and leaves f at its end. */
static void tail_lines(FILE *f, long n)
{
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    long from = end > (1L << 20) ? end - (1L << 20) : 0;
    size_t len = (size_t)(end - from);
    char *buf = malloc(len + 1);
    if (buf == NULL)
        return;
    fseek(f, from, SEEK_SET);
    len = fread(buf, 1, len, f);
    size_t start;
    long lines = 0;
    /* a last line without its newline counts as a line */
    size_t i = len;
    if (i > 0 && buf[i - 1] == '\n')
        i--;
    while (i > 0 && n > 0) {
        if (buf[i - 1] == '\n' && ++lines == n)
            break;
        i--;
    }
    start = n > 0 ? i : len;
    fwrite(buf + start, 1, len - start, stdout);
    fflush(stdout);
    free(buf);
}

/* oversub logs ID [-n N] [--follow]: a managed service's log, read from the file oversubd
 * writes (so on oversubd's host); --follow goes on as it grows, through rotations. */
static int cmd_logs(const struct args *a)
{
    const char *id = a->pos[0];
    if (check_id(id) != 0)
        return EX_USAGE;
    long n = 20;
    if (opt(a, "lines") != NULL && num_arg("--lines", opt(a, "lines"), 0, 10000000, &n) != 0)
        return EX_USAGE;
    bool follow = opt(a, "follow") != NULL;
    if (as_json) {
        fprintf(stderr, "oversub logs: prints the service's own output; --json does not apply\n");
        return EX_USAGE;
    }
    char path[160];
    svc_path(path, sizeof(path), id, "");
    int ex;
    json_t *r = call("GET", path, NULL, &ex);
    if (r == NULL || ex) {
        json_decref(r);
        return ex;
    }
    const char *log = json_string_value(json_object_get(json_object_get(r, "process"), "log"));
    if (log == NULL) {
        fprintf(stderr,
                "oversub logs: %s is not a managed service (it has no command): its "
                "output is wherever it was started\n",
                id);
        json_decref(r);
        return EX_REFUSED;
    }
    char file[1024];
    snprintf(file, sizeof(file), "%s", log);
    json_decref(r);
    FILE *f = fopen(file, "r");
    if (f == NULL) {
        fprintf(stderr, "oversub logs: %s: %s (the log is on oversubd's host)\n", file,
                strerror(errno));
        return EX_REFUSED;
    }
    tail_lines(f, n);
    while (follow) {
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
        long at = ftell(f);
        struct stat st;
        if (stat(file, &st) == 0 && st.st_size < at)
            fseek(f, 0, SEEK_SET); /* rotated: emptied in place */
        clearerr(f);
        char buf[4096];
        size_t k;
        while ((k = fread(buf, 1, sizeof(buf), f)) > 0)
            fwrite(buf, 1, k, stdout);
        fflush(stdout);
    }
    fclose(f);
    return EX_OK;
}

/* ---- gpu, ratio ------------------------------------------------------------------------ */

static int cmd_gpu(const struct args *a)
{
    const char *action = a->pos[0], *gpu = a->pos[1];
    if (strcmp(action, "cordon") != 0 && strcmp(action, "uncordon") != 0 &&
        strcmp(action, "drain") != 0) {
        fprintf(stderr, "oversub gpu: '%s' is not cordon, uncordon or drain\n", action);
        return EX_USAGE;
    }
    long idx;
    if (num_arg("the GPU index", gpu, 0, 4095, &idx) != 0)
        return EX_USAGE;
    char path[96];
    snprintf(path, sizeof(path), "/v1/gpus/%ld/%s", idx, action);
    int ex;
    json_t *r = call("POST", path, NULL, &ex);
    if (r != NULL && ex == EX_OK) {
        if (as_json)
            print_json(r);
        else if (strcmp(action, "drain") == 0)
            printf("GPU %ld: draining: cordoned, its preemptible services evicted with their "
                   "grace period (oversub events says which)\n",
                   idx);
        else
            printf("GPU %ld: %sed\n", idx, action);
    }
    json_decref(r);
    return ex;
}

/* ratio's answer: the pool's JSON, or its line */
static void show_ratio(json_t *p)
{
    if (as_json) {
        print_json(p);
        return;
    }
    printf("ratio %s: logical capacity %lld MiB on %lld MiB of GPU memory\n",
           gets_(p, "ratio_text"), (long long)geti(json_object_get(p, "totals"), "logical_mib"),
           (long long)geti(json_object_get(p, "totals"), "vram_mib"));
}

static int cmd_ratio(const struct args *a)
{
    int ex;
    if (a->n_pos == 0) {
        json_t *p = call("GET", "/v1/pool", NULL, &ex);
        if (p != NULL && ex == EX_OK)
            show_ratio(p);
        json_decref(p);
        return ex;
    }
    const char *r = a->pos[0];
    int32_t m;
    int rc = osub_parse_ratio(r, &m);
    if (rc == OSUB_ERATIO_RANGE) {
        fprintf(stderr,
                "oversub ratio: %s is out of range: a ratio is from 1.0 (no overselling) to "
                "100, with at most three decimals (1.3, 1.25)\n",
                r);
        return EX_USAGE;
    }
    if (rc == OSUB_ERATIO_PRECISION) {
        fprintf(stderr,
                "oversub ratio: %s has more than three decimals (a ratio is from 1.0 to 100, "
                "such as 1.3 or 1.125)\n",
                r);
        return EX_USAGE;
    }
    if (rc != 0) {
        fprintf(stderr,
                "oversub ratio: '%s' is not a ratio: a decimal number from 1.0 to 100 with at "
                "most three decimals, such as 1.3\n",
                r);
        return EX_USAGE;
    }
    json_t *b = json_pack("{s:s}", "ratio", r);
    json_t *p = call("PUT", "/v1/pool", b, &ex);
    json_decref(b);
    if (p != NULL && ex == EX_OK)
        show_ratio(p);
    json_decref(p);
    return ex;
}

/* ---- the table ------------------------------------------------------------------------- */

static const struct flag no_flags[] = {{NULL, 0, NULL, NULL}};
static const struct flag list_flags[] = {
    {"ids", 0, NULL, "only the ids, one a line (for scripts and shell completion)"},
    {NULL, 0, NULL, NULL}};
static const struct flag deploy_flags[] = {
    {"class", 0, "CLASS",
     "required: online (never preempted), batch or experiment\n(preempted first)"},
    {"vram", 0, "SIZE", "required: its memory, with a unit: 20GiB, 20480MiB, 21GB"},
    {"min-vram", 0, "SIZE", "the floor it may be degraded to (default: --vram, not\ndegradable)"},
    {"gpus", 0, "N", "over N GPUs (default: as few as hold --vram)"},
    {"compute", 0, "PCT", "a compute claim per GPU, 0-100"},
    {"exclusive", 0, NULL, "whole GPUs, never shared or oversold"},
    {"resumable", 0, NULL, "an evicted run goes back to the queue and resumes"},
    {"no-queue", 0, NULL, "refuse rather than queue when there is no room"},
    {"dry-run", 0, NULL, "say what would happen; change nothing"},
    {"wait", 0, NULL, "then wait until it is running (as 'oversub ready')"},
    {"timeout", 0, "SECONDS", "with --wait: give up after this long (300; 0: never)"},
    {"restart-cost", 0, "MS",
     "how long it takes to load: it is loading until it reports\nready "
     "or this passes (the daemon's default, 60000)"},
    {"batch", 0, "N", "its batch size (scaled down when degraded)"},
    {"min-batch", 0, "N", "the batch size at its floor"},
    {"grace", 0, "MS", "the eviction grace period (default: its class's)"},
    {"backend", 0, "URL", "the gateway: where its traffic goes (repeatable)"},
    {"max-inflight", 0, "N", "the gateway: requests at once"},
    {"max-queue", 0, "N", "the gateway: requests waiting beyond that"},
    {"queue-timeout", 0, "MS", "the gateway: how long a request may wait"},
    {"control-url", 0, "URL", "a webhook for its directives"},
    {"env", 0, "NAME=VALUE", "managed: its environment (repeatable)"},
    {"user", 0, "USER", "managed: the user it runs as"},
    {"workdir", 0, "DIR", "managed: its working folder"},
    {"checkpoint-dir", 0, "DIR", "managed: where it checkpoints"},
    {"restart", 0, "POLICY", "managed: never or on-failure"},
    {"max-restarts", 0, "N", "managed: restarts before it is failed"},
    {NULL, 0, NULL, NULL}};
static const struct flag ready_flags[] = {
    {"timeout", 0, "SECONDS", "give up after this long, exit 3 (300; 0: never)"},
    {NULL, 0, NULL, NULL}};
static const struct flag resize_flags[] = {{"vram", 0, "SIZE", "its new request"},
                                           {"min-vram", 0, "SIZE", "its new floor"},
                                           {"batch", 0, "N", "its new batch size"},
                                           {NULL, 0, NULL, NULL}};
static const struct flag usage_flags[] = {{"vram", 0, "SIZE", "required: the memory it uses now"},
                                          {"compute", 0, "PCT", "the compute it uses now, 0-100"},
                                          {NULL, 0, NULL, NULL}};
static const struct flag events_flags[] = {
    {"since", 0, "SEQ", "the events after SEQ (default: all; with --follow: now)"},
    {"last", 'n', "N", "the last N events"},
    {"follow", 'f', NULL, "then wait for new ones and print them as they come"},
    {NULL, 0, NULL, NULL}};
static const struct flag logs_flags[] = {{"lines", 'n', "N", "the last N lines (20)"},
                                         {"follow", 'f', NULL, "then print what it adds"},
                                         {NULL, 0, NULL, NULL}};

static const struct command commands[] = {
    {"status", "", "GPUs and services, as tables",
     "Shows the pool (ratio; used, held and logical utilisation), each GPU's memory\n"
     "and every service: class, state, grant, held and used memory, GPUs, process.\n"
     "--json: {\"pool\": GET /v1/pool, \"services\": [...]}.",
     0, 0, false, no_flags, "  oversub status", cmd_status},
    {"list", "", "the services, one a line (--ids: only their ids)",
     "Lists the services: id, class, state, grant, request and GPUs.\n"
     "--json: GET /v1/services as it is.",
     0, 0, false, list_flags, "  oversub list --ids", cmd_list},
    {"deploy", "ID --class CLASS --vram SIZE [options] [-- PROGRAM ARG...]",
     "submit a service (--wait: and wait until it is running)",
     "Submits a service and says what the daemon decided: loading (admitted; it holds\n"
     "its whole grant until it reports ready), pending (placed, waiting for the\n"
     "memory of the services it preempts), queued (no room now) or refused (exit 1).\n"
     "A service is running once it reports ready (POST /v1/services/ID/ready) or its\n"
     "restart cost has passed: 'oversub ready ID' waits for that, as does --wait.\n"
     "With '-- PROGRAM ARG...' it is a managed service: oversubd runs the program\n"
     "(over the Unix socket or with the admin token).\n"
     "--json: the daemon's answer (the service, its decision and its token).",
     1, 1, true, deploy_flags,
     "  oversub deploy chat --class online --vram 40GiB --backend http://127.0.0.1:8000 "
     "--wait\n"
     "  oversub deploy nightly --class batch --vram 50GiB --resumable -- \\\n"
     "      /opt/jobs/batch-job --units 1000",
     cmd_deploy},
    {"ready", "ID [--timeout SECONDS]", "wait until a service is running",
     "Waits until the service is running (or degraded: running at its floor) while\n"
     "it is loading, pending or queued, following the daemon's event log, and prints\n"
     "one line. Exit 0 when it runs; 1 when it failed, was released or refused (the\n"
     "state and the daemon's reason on stderr); 3 on timeout (or no daemon).\n"
     "--json: the service once running, or {\"error\": {\"code\": \"not_ready\" or\n"
     "\"timeout\", \"message\", \"state\"}}.",
     1, 1, false, ready_flags,
     "  oversub ready chat --timeout 120 && curl http://127.0.0.1:8080/chat/v1/models", cmd_ready},
    {"resize", "ID [--vram SIZE] [--min-vram SIZE] [--batch N]",
     "change a service's request, floor or batch size",
     "Changes a service's request, floor or batch size and prints the service's new\n"
     "request and grant. --json: the service.",
     1, 1, false, resize_flags, "  oversub resize chat --vram 48GiB --min-vram 24GiB", cmd_resize},
    {"release", "ID", "release a service (its memory is freed)",
     "Releases the service: it leaves its GPUs (a managed one is stopped).\n"
     "--json: the daemon's answer.",
     1, 1, false, no_flags, "  oversub release chat", cmd_release},
    {"usage", "ID --vram SIZE [--compute PCT]", "report the memory a service uses now",
     "Reports a service's memory in use (what a service without the CUDA shim or\n"
     "NVML process accounting tells the daemon). --json: the service.",
     1, 1, false, usage_flags, "  oversub usage chat --vram 31GiB", cmd_usage},
    {"events", "[--since SEQ | -n N] [--follow]", "the decision log, with reasons",
     "Prints the decision log: seq, time (RFC 3339, local time with its UTC offset),\n"
     "kind, reason and the daemon's sentence. Without options, the whole log;\n"
     "--follow starts from now (or --since SEQ, or the last N) and prints new events\n"
     "as they come, until Ctrl-C.\n"
     "--json: {\"events\": [...], \"next\": SEQ}; with --follow one event a line.",
     0, 0, false, events_flags, "  oversub events -n 20 --follow", cmd_events},
    {"explain", "ID", "why a service is queued, pending, degraded, or placed where it is",
     "Explains a service's state: its queue position, the victims it waits for,\n"
     "its floor, its predicted peak, why its GPU was chosen, its process.\n"
     "--json: the service (GET /v1/services/ID).",
     1, 1, false, no_flags, "  oversub explain nightly", cmd_explain},
    {"queue", "", "who waits, at which position, since when, for what",
     "The queued services in queue order and the pending ones with the victims\n"
     "they wait for. --json: {\"queued\": [...], \"pending\": [...]}.",
     0, 0, false, no_flags, "  oversub queue", cmd_queue},
    {"logs", "ID [-n N] [--follow]", "a managed service's output (on oversubd's host)",
     "Prints the last lines of a managed service's log, which oversubd writes and\n"
     "rotates (so on oversubd's host); --follow goes on as it grows. No --json.",
     1, 1, false, logs_flags, "  oversub logs nightly -n 100 --follow", cmd_logs},
    {"gpu", "cordon|uncordon|drain N", "cordon, uncordon or drain GPU N",
     "cordon: nothing new is placed on GPU N; uncordon undoes it; drain cordons it\n"
     "and evicts its preemptible services (each with its grace period; a resumable one\n"
     "waits in the queue). --json: the pool.",
     2, 2, false, no_flags, "  oversub gpu drain 3", cmd_gpu},
    {"ratio", "[R]", "show or set the oversell ratio",
     "Without R, shows the oversell ratio (logical capacity = physical memory x R).\n"
     "With R, sets it: from 1.0 (no overselling) to 100, at most three decimals;\n"
     "a lower ratio never evicts (services wait in the queue instead).\n"
     "--json: the pool.",
     0, 1, false, no_flags, "  oversub ratio 1.5", cmd_ratio},
};

static const struct command *find(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

bool cli_daemon_has(const char *name)
{
    return find(name) != NULL;
}

int cli_daemon_usage(const char *name, FILE *f)
{
    const struct command *c = find(name);
    if (c == NULL)
        return -1;
    print_usage(c, f);
    return 0;
}

void cli_daemon_list(FILE *f)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int cli_daemon_cmd(int argc, char **argv)
{
    const struct command *c = argc > 0 ? find(argv[0]) : NULL;
    if (c == NULL) {
        fprintf(stderr, "oversub: unknown command '%s' (see 'oversub --help')\n",
                argc > 0 ? argv[0] : "");
        return EX_USAGE;
    }
    cur = c->name;
    tzset();
    struct args a;
    int rc = parse_args(c, argc, argv, &a);
    if (rc != 0)
        return rc == 1 ? EX_OK : rc;
    char err[300];
    if (http_target_init(&tgt, url_opt, err, sizeof(err)) != 0) {
        fprintf(stderr, "oversub %s: --url: %s\n", c->name, err);
        return EX_USAGE;
    }
    return c->run(&a);
}
