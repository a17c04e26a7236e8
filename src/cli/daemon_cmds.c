/* daemon_cmds.c - the oversub CLI's commands that talk to oversubd: one table gives each
 * command's arguments, flags, help and example, and drives its parsing and its --help; the
 * client and the formatting the commands share */
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

#include "daemon_cmds_internal.h"
#include "http.h"
#include "oversub/engine.h"
#include "oversub/errors.h"
#include "oversub/units.h"

static struct http_target tgt;
static const char *url_opt;
bool dcmd_as_json;
const char *dcmd_cur;

/* ---- talking to oversubd --------------------------------------------------------------- */

/* With --json, a failure is one JSON document on stdout too (the sentence stays on stderr). */
void dcmd_json_error(const char *code, const char *message, json_t *extra)
{
    if (!dcmd_as_json) {
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
json_t *dcmd_request(const char *method, const char *path, json_t *body, int *status)
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
                dcmd_cur, err);
        dcmd_json_error("unreachable", err, NULL);
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
json_t *dcmd_call(const char *method, const char *path, json_t *body, int *ex)
{
    int status;
    json_t *j = dcmd_request(method, path, body, &status);
    if (j == NULL) {
        *ex = EX_UNREACHABLE;
        return NULL;
    }
    *ex = EX_OK;
    if (status >= 400) {
        json_t *e = json_object_get(j, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        fprintf(stderr, "oversub %s: refused (%d %s): %s\n", dcmd_cur, status,
                code ? code : "error", msg ? msg : json_string_value(json_object_get(j, "body")));
        if (status == 401)
            fprintf(stderr, "  set OVERSUB_TOKEN to the admin token\n");
        if (dcmd_as_json) {
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

void dcmd_print_json(json_t *j)
{
    json_dumpf(j, stdout, JSON_INDENT(2));
    fputc('\n', stdout);
    fflush(stdout);
}

int64_t dcmd_geti(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

const char *dcmd_gets(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* ---- formatting ------------------------------------------------------------------------ */

/* RFC 3339 in local time with its UTC offset ("2026-12-01T11:03:13.123+01:00"; "Z" in UTC). */
void dcmd_fmt_time(int64_t unix_ms, bool with_ms, char *out, size_t len)
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

int64_t dcmd_now_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double dcmd_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "3m12s" for a duration in ms */
void dcmd_fmt_dur(int64_t ms, char *out, size_t len)
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
void dcmd_fmt_gpus(json_t *svc, char *out, size_t len)
{
    size_t off = 0, k;
    json_t *p;
    out[0] = '\0';
    json_array_foreach(json_object_get(svc, "placement"), k, p)
    {
        if (off + 24 >= len)
            break;
        off += (size_t)snprintf(out + off, len - off, "%s%lld", k ? "," : "",
                                (long long)dcmd_geti(p, "gpu"));
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

int dcmd_flag_index(const struct command *c, const char *name)
{
    for (int i = 0; c->flags != NULL && c->flags[i].name != NULL; i++)
        if (strcmp(c->flags[i].name, name) == 0)
            return i;
    return -1;
}

/* The last value of --name ("" for a switch given), or NULL. */
const char *dcmd_opt(const struct args *a, const char *name)
{
    int i = dcmd_flag_index(a->cmd, name);
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
            dcmd_as_json = true;
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

int dcmd_check_id(const char *id)
{
    if (osub_id_valid(id))
        return 0;
    fprintf(stderr,
            "oversub %s: '%s' is not a service id (1-%d characters of a-z, 0-9 and '-', starting "
            "with a letter)\n",
            dcmd_cur, id, OSUB_ID_MAX);
    return EX_USAGE;
}

void dcmd_svc_path(char *out, size_t len, const char *id, const char *suffix)
{
    snprintf(out, len, "/v1/services/%s%s", id, suffix);
}

/* A size with its unit: "10" alone is refused (MiB or GiB? say which). */
int dcmd_size_arg(const char *flag, const char *v, int64_t *out)
{
    if (osub_parse_size_mib(v, 0, out) != 0) {
        fprintf(stderr,
                "oversub %s: %s: '%s' is not a size (say 120GiB, 0.5GiB, 81920MiB, 80GB or "
                "1TiB)\n",
                dcmd_cur, flag, v);
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
            fprintf(stderr, "oversub %s: %s: %.*s is not a size: say %s or %s\n", dcmd_cur, flag,
                    (int)l, v, as_gib, as_mib);
        } else { /* 81920: likely MiB */
            snprintf(as_mib, sizeof(as_mib), "%.*sMiB", (int)l, v);
            if (*out % 1024 == 0)
                snprintf(as_gib, sizeof(as_gib), "%lldGiB", (long long)(*out / 1024));
            else
                snprintf(as_gib, sizeof(as_gib), "%.2fGiB", (double)*out / 1024.0);
            fprintf(stderr, "oversub %s: %s: %.*s is not a size: say %s or %s\n", dcmd_cur, flag,
                    (int)l, v, as_mib, as_gib);
        }
        return EX_USAGE;
    }
    return 0;
}

int dcmd_num_arg(const char *flag, const char *v, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < min || n > max) {
        fprintf(stderr, "oversub %s: %s: '%s' is not a whole number from %ld to %ld\n", dcmd_cur,
                flag, v, min, max);
        return EX_USAGE;
    }
    *out = n;
    return 0;
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
    {"suspend", 0, "METHOD",
     "preempted by a suspend rather than evicted: cuda (the CUDA\ncheckpoint API), vllm or "
     "sglang (with --suspend-url)"},
    {"suspend-url", 0, "URL", "the vLLM or SGLang server's http://HOST:PORT"},
    {"idle-suspend", 0, "MS", "the gateway: suspend it after MS without a request"},
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
     0, 0, false, no_flags, "  oversub status", dcmd_status},
    {"list", "", "the services, one a line (--ids: only their ids)",
     "Lists the services: id, class, state, grant, request and GPUs.\n"
     "--json: GET /v1/services as it is.",
     0, 0, false, list_flags, "  oversub list --ids", dcmd_list},
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
     dcmd_deploy},
    {"ready", "ID [--timeout SECONDS]", "wait until a service is running",
     "Waits until the service is running (or degraded: running at its floor) while\n"
     "it is loading, pending or queued, following the daemon's event log, and prints\n"
     "one line. Exit 0 when it runs; 1 when it failed, was released or refused (the\n"
     "state and the daemon's reason on stderr); 3 on timeout (or no daemon).\n"
     "--json: the service once running, or {\"error\": {\"code\": \"not_ready\" or\n"
     "\"timeout\", \"message\", \"state\"}}.",
     1, 1, false, ready_flags,
     "  oversub ready chat --timeout 120 && curl http://127.0.0.1:8080/chat/v1/models", dcmd_ready},
    {"resize", "ID [--vram SIZE] [--min-vram SIZE] [--batch N]",
     "change a service's request, floor or batch size",
     "Changes a service's request, floor or batch size and prints the service's new\n"
     "request and grant. --json: the service.",
     1, 1, false, resize_flags, "  oversub resize chat --vram 48GiB --min-vram 24GiB", dcmd_resize},
    {"release", "ID", "release a service (its memory is freed)",
     "Releases the service: it leaves its GPUs (a managed one is stopped).\n"
     "--json: the daemon's answer.",
     1, 1, false, no_flags, "  oversub release chat", dcmd_release},
    {"suspend", "ID", "suspend a service: its GPU memory to the host, its processes live on",
     "Suspends a running or degraded service that declares a suspend method (its\n"
     "\"suspend\" in the spec: cuda, vllm, sglang or http): its GPU memory goes to host\n"
     "memory and its GPUs are free for others; it stays suspended, held, until\n"
     "'oversub resume ID' (traffic through the gateway gets 503 meanwhile). Refused\n"
     "(exit 1) when it declares no method, is in no state to suspend, or its memory would\n"
     "exceed the pool's suspend_host_mib. --json: the service.",
     1, 1, false, no_flags, "  oversub suspend nightly && oversub explain nightly", dcmd_suspend},
    {"resume", "ID", "let a suspended service come back",
     "Lets a suspended service come back on the GPUs it left: at once when they have\n"
     "room for its grant, else as soon as they do (ahead of the queue at its level).\n"
     "--json: the service.",
     1, 1, false, no_flags, "  oversub resume nightly", dcmd_resume},
    {"usage", "ID --vram SIZE [--compute PCT]", "report the memory a service uses now",
     "Reports a service's memory in use (what a service without the CUDA shim or\n"
     "NVML process accounting tells the daemon). --json: the service.",
     1, 1, false, usage_flags, "  oversub usage chat --vram 31GiB", dcmd_usage},
    {"events", "[--since SEQ | -n N] [--follow]", "the decision log, with reasons",
     "Prints the decision log: seq, time (RFC 3339, local time with its UTC offset),\n"
     "kind, reason and the daemon's sentence. Without options, the whole log;\n"
     "--follow starts from now (or --since SEQ, or the last N) and prints new events\n"
     "as they come, until Ctrl-C.\n"
     "--json: {\"events\": [...], \"next\": SEQ}; with --follow one event a line.",
     0, 0, false, events_flags, "  oversub events -n 20 --follow", dcmd_events},
    {"explain", "ID", "why a service is queued, pending, degraded, or placed where it is",
     "Explains a service's state: its queue position, the victims it waits for,\n"
     "its floor, its predicted peak, why its GPU was chosen, its process.\n"
     "--json: the service (GET /v1/services/ID).",
     1, 1, false, no_flags, "  oversub explain nightly", dcmd_explain},
    {"queue", "", "who waits, at which position, since when, for what",
     "The queued services in queue order and the pending ones with the victims\n"
     "they wait for. --json: {\"queued\": [...], \"pending\": [...]}.",
     0, 0, false, no_flags, "  oversub queue", dcmd_queue},
    {"logs", "ID [-n N] [--follow]", "a managed service's output (on oversubd's host)",
     "Prints the last lines of a managed service's log, which oversubd writes and\n"
     "rotates (so on oversubd's host); --follow goes on as it grows. No --json.",
     1, 1, false, logs_flags, "  oversub logs nightly -n 100 --follow", dcmd_logs},
    {"gpu", "cordon|uncordon|drain N", "cordon, uncordon or drain GPU N",
     "cordon: nothing new is placed on GPU N; uncordon undoes it; drain cordons it\n"
     "and evicts its preemptible services (each with its grace period; a resumable one\n"
     "waits in the queue). --json: the pool.",
     2, 2, false, no_flags, "  oversub gpu drain 3", dcmd_gpu},
    {"ratio", "[R]", "show or set the oversell ratio",
     "Without R, shows the oversell ratio (logical capacity = physical memory x R).\n"
     "With R, sets it: from 1.0 (no overselling) to 100, at most three decimals;\n"
     "a lower ratio never evicts (services wait in the queue instead).\n"
     "--json: the pool.",
     0, 1, false, no_flags, "  oversub ratio 1.5", dcmd_ratio},
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
    dcmd_cur = c->name;
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
