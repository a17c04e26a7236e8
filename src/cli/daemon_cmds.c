/* daemon_cmds.c - the oversub CLI's commands that talk to oversubd */
#define _POSIX_C_SOURCE 200809L
#include "daemon_cmds.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "http.h"
#include "oversub/units.h"

enum { EX_OK = 0, EX_REFUSED = 1, EX_USAGE = 2, EX_UNREACHABLE = 3 };

static struct http_target tgt;
static bool as_json;

/* Sends a request; prints the daemon's error on 4xx/5xx. Returns the JSON body (new
 * reference) and the exit code in *ex. */
static json_t *call(const char *method, const char *path, json_t *body, int *ex)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    struct http_resp r;
    char err[400];
    int rc = http_request(&tgt, method, path, text, &r, err, sizeof(err));
    free(text);
    if (rc != 0) {
        fprintf(stderr,
                "oversub: %s\n  is oversubd running? start it with 'make run', or point "
                "--url / OVERSUB_URL at it\n",
                err);
        *ex = EX_UNREACHABLE;
        return NULL;
    }
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    if (r.status >= 400) {
        const char *code = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
        const char *msg =
            json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        fprintf(stderr, "oversub: refused (%d %s): %s\n", r.status, code ? code : "error",
                msg ? msg : (r.body ? r.body : ""));
        if (r.status == 401)
            fprintf(stderr, "  set OVERSUB_TOKEN to the admin token\n");
        *ex = EX_REFUSED;
    } else {
        *ex = EX_OK;
    }
    http_resp_free(&r);
    return j;
}

static void print_json(json_t *j)
{
    json_dumpf(j, stdout, JSON_INDENT(2));
    fputc('\n', stdout);
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

static int cmd_status(void)
{
    int ex;
    json_t *pool = call("GET", "/v1/pool", NULL, &ex);
    if (pool == NULL || ex)
        return ex;
    json_t *svcs = call("GET", "/v1/services", NULL, &ex);
    if (svcs == NULL || ex) {
        json_decref(pool);
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
            char gpus[128] = "";
            size_t k;
            json_t *p;
            json_array_foreach(json_object_get(s, "placement"), k, p)
            {
                char one[16];
                snprintf(one, sizeof(one), k ? ",%lld" : "%lld", (long long)geti(p, "gpu"));
                strncat(gpus, one, sizeof(gpus) - strlen(gpus) - 1);
            }
            /* a managed service's process: its PID, or why there is none */
            char proc[64] = "-";
            json_t *pr = json_object_get(s, "process");
            if (pr != NULL && json_is_true(json_object_get(pr, "alive")))
                snprintf(proc, sizeof(proc), "pid %lld", (long long)geti(pr, "pid"));
            else if (pr != NULL)
                snprintf(proc, sizeof(proc), "not running");
            else if (json_object_get(s, "pid") != NULL)
                snprintf(proc, sizeof(proc), "pid %lld (external)", (long long)geti(s, "pid"));
            if (pr != NULL && geti(pr, "restarts") > 0) {
                size_t l = strlen(proc);
                snprintf(proc + l, sizeof(proc) - l, ", %lld restart(s)",
                         (long long)geti(pr, "restarts"));
            }
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

static int size_arg(const char *opt, const char *v, int64_t *out)
{
    if (osub_parse_size_mib(v, 0, out) != 0) {
        fprintf(stderr, "oversub: %s: '%s' is not a size (81920, 120GiB, 0.5GiB, 80GB)\n", opt, v);
        return -1;
    }
    return 0;
}

static int cmd_deploy(int argc, char **argv)
{
    static const struct option opts[] = {{"class", required_argument, NULL, 'c'},
                                         {"vram", required_argument, NULL, 'v'},
                                         {"min-vram", required_argument, NULL, 'm'},
                                         {"gpus", required_argument, NULL, 'g'},
                                         {"compute", required_argument, NULL, 'C'},
                                         {"exclusive", no_argument, NULL, 'x'},
                                         {"no-queue", no_argument, NULL, 'n'},
                                         {"dry-run", no_argument, NULL, 'd'},
                                         {"resumable", no_argument, NULL, 'r'},
                                         {"batch", required_argument, NULL, 'b'},
                                         {"min-batch", required_argument, NULL, 'B'},
                                         {"backend", required_argument, NULL, 'k'},
                                         {"max-inflight", required_argument, NULL, 'I'},
                                         {"max-queue", required_argument, NULL, 'Q'},
                                         {"queue-timeout", required_argument, NULL, 'T'},
                                         {"env", required_argument, NULL, 'e'},
                                         {"user", required_argument, NULL, 'u'},
                                         {"workdir", required_argument, NULL, 'w'},
                                         {"checkpoint-dir", required_argument, NULL, 'K'},
                                         {"restart", required_argument, NULL, 'R'},
                                         {"max-restarts", required_argument, NULL, 'M'},
                                         {"control-url", required_argument, NULL, 'U'},
                                         {"grace", required_argument, NULL, 'G'},
                                         {NULL, 0, NULL, 0}};
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr,
                "usage: oversub deploy ID --class CLASS --vram 120GiB [--min-vram 60GiB] "
                "[--gpus N] [--compute 80] [--exclusive] [--resumable] [--no-queue] "
                "[--dry-run] [--backend URL]... [--max-inflight N] [--max-queue N] "
                "[--queue-timeout MS] [--grace MS] [--control-url URL]\n"
                "       [--env NAME=VALUE]... [--user U] [--workdir DIR] "
                "[--checkpoint-dir DIR] [--restart never|on-failure] [--max-restarts N]\n"
                "       [-- PROGRAM ARG...]   (a managed service: oversubd runs it; over the\n"
                "                              Unix socket or with the admin token)\n");
        return EX_USAGE;
    }
    json_t *spec = json_pack("{s:s}", "id", argv[1]);
    bool dry = false;
    int64_t v;
    optind = 2;
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            json_object_set_new(spec, "class", json_string(optarg));
            break;
        case 'v':
        case 'm':
            if (size_arg(ch == 'v' ? "--vram" : "--min-vram", optarg, &v) != 0)
                goto usage;
            json_object_set_new(spec, ch == 'v' ? "vram_mib" : "min_vram_mib", json_integer(v));
            break;
        case 'e': {
            const char *eq = strchr(optarg, '=');
            if (eq == NULL || eq == optarg) {
                fprintf(stderr, "oversub: --env wants NAME=VALUE, not '%s'\n", optarg);
                goto usage;
            }
            json_t *env = json_object_get(spec, "env");
            if (env == NULL) {
                env = json_object();
                json_object_set_new(spec, "env", env);
            }
            char name[256];
            snprintf(name, sizeof(name), "%.*s", (int)(eq - optarg), optarg);
            json_object_set_new(env, name, json_string(eq + 1));
            break;
        }
        case 'u':
        case 'w':
        case 'K':
        case 'R':
        case 'U':
            json_object_set_new(spec,
                                ch == 'u'   ? "user"
                                : ch == 'w' ? "workdir"
                                : ch == 'K' ? "checkpoint_dir"
                                : ch == 'R' ? "restart"
                                            : "control_url",
                                json_string(optarg));
            break;
        case 'k': {
            /* the gateway's backends, repeatable */
            json_t *list = json_object_get(spec, "backends");
            if (list == NULL) {
                list = json_array();
                json_object_set_new(spec, "backends", list);
            }
            json_array_append_new(list, json_string(optarg));
            break;
        }
        case 'g':
        case 'C':
        case 'b':
        case 'B':
        case 'I':
        case 'Q':
        case 'M':
        case 'G':
        case 'T': {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (*end != '\0' || n < 0 || n > 86400000) {
                fprintf(stderr, "oversub: '%s' is not a number\n", optarg);
                goto usage;
            }
            json_object_set_new(spec,
                                ch == 'g'   ? "gpus"
                                : ch == 'C' ? "compute_pct"
                                : ch == 'b' ? "batch_size"
                                : ch == 'B' ? "min_batch_size"
                                : ch == 'I' ? "max_inflight"
                                : ch == 'Q' ? "max_queue"
                                : ch == 'M' ? "max_restarts"
                                : ch == 'G' ? "grace_ms"
                                            : "queue_timeout_ms",
                                json_integer(n));
            break;
        }
        case 'x':
            json_object_set_new(spec, "exclusive", json_true());
            break;
        case 'n':
            json_object_set_new(spec, "queue", json_false());
            break;
        case 'r':
            json_object_set_new(spec, "resumable", json_true());
            break;
        case 'd':
            dry = true;
            break;
        default:
            goto usage;
        }
    }
    if (optind < argc) {
        /* after --: the managed service's argv */
        json_t *cmdv = json_array();
        for (int i = optind; i < argc; i++)
            json_array_append_new(cmdv, json_string(argv[i]));
        json_object_set_new(spec, "command", cmdv);
    }
    if (json_object_get(spec, "vram_mib") == NULL) {
        fprintf(stderr, "oversub: deploy needs --vram\n");
        goto usage;
    }
    int ex;
    json_t *r = call("POST", dry ? "/v1/services?dry_run=1" : "/v1/services", spec, &ex);
    json_decref(spec);
    if (r == NULL)
        return ex;
    json_t *dec = json_object_get(r, "decision");
    if (as_json) {
        print_json(r);
    } else if (dec != NULL) {
        const char *outcome = gets_(dec, "outcome");
        printf("%s%s: %s", dry ? "(dry run) " : "", argv[1], outcome);
        if (json_object_get(dec, "queue_position"))
            printf(" at position %lld", (long long)geti(dec, "queue_position"));
        if (json_object_get(dec, "shortfall_mib"))
            printf(" (%s check short by %lld MiB on GPU %lld)", gets_(dec, "check"),
                   (long long)geti(dec, "shortfall_mib"), (long long)geti(dec, "gpu"));
        printf("\n");
        size_t i;
        json_t *vv;
        json_array_foreach(json_object_get(dec, "victims"), i, vv)
            printf("  victim: %s %s\n", gets_(vv, "action"), gets_(vv, "service"));
    }
    json_decref(r);
    return ex;
usage:
    json_decref(spec);
    return EX_USAGE;
}

static int simple(const char *method, const char *path, json_t *body)
{
    int ex;
    json_t *r = call(method, path, body, &ex);
    if (r == NULL)
        return ex;
    if (as_json || ex == EX_OK)
        print_json(r);
    json_decref(r);
    return ex;
}

static int cmd_events(int argc, char **argv)
{
    bool follow = false;
    long long since = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--follow") == 0 || strcmp(argv[i], "-f") == 0)
            follow = true;
        else if (strcmp(argv[i], "--since") == 0 && i + 1 < argc)
            since = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: oversub events [--since SEQ] [--follow]\n");
            return EX_USAGE;
        }
    }
    for (;;) {
        char path[96];
        snprintf(path, sizeof(path), "/v1/events?since=%lld&wait=%d", since, follow ? 30 : 0);
        int ex;
        json_t *r = call("GET", path, NULL, &ex);
        if (r == NULL || ex)
            return ex;
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(r, "events"), i, e)
        {
            if (as_json) {
                json_dumpf(e, stdout, JSON_COMPACT);
                fputc('\n', stdout);
            } else {
                time_t t = (time_t)(geti(e, "time_unix_ms") / 1000);
                struct tm tm;
                localtime_r(&t, &tm);
                char ts[32];
                strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
                printf("%6lld %s %-9s %-14s %s\n", (long long)geti(e, "seq"), ts, gets_(e, "kind"),
                       gets_(e, "reason"), gets_(e, "message"));
            }
        }
        fflush(stdout);
        since = geti(r, "next");
        json_decref(r);
        if (!follow)
            return EX_OK;
    }
}

static int cmd_explain(const char *id)
{
    char path[128];
    snprintf(path, sizeof(path), "/v1/services/%s", id);
    int ex;
    json_t *s = call("GET", path, NULL, &ex);
    if (s == NULL || ex) {
        json_decref(s);
        return ex;
    }
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
            printf("  - %s of %s (deadline %lld)\n", gets_(w, "action"), gets_(w, "service"),
                   (long long)geti(w, "deadline_unix_ms"));
    } else if (strcmp(st, "degraded") == 0) {
        printf(": running at its floor, %lld MiB instead of %lld, until its GPUs have had room "
               "for what it is expected to hold once restored (its predicted peak, %lld MiB, "
               "beside what its neighbours may still rise to) for the hysteresis window\n",
               (long long)geti(s, "grant_mib"), (long long)geti(s, "vram_mib"),
               (long long)geti(json_object_get(s, "prediction"), "peak_mib"));
    } else if (strcmp(st, "draining") == 0 || strcmp(st, "overdue") == 0) {
        printf(": evicted; its memory is counted until it exits (deadline %lld)\n",
               (long long)geti(s, "deadline_unix_ms"));
    } else if (strcmp(st, "loading") == 0) {
        printf(": started; until it reports ready (or its restart cost passes) it holds its "
               "whole grant of %lld MiB\n",
               (long long)geti(s, "grant_mib"));
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
        size_t off = 0;
        gl[0] = '\0';
        for (size_t i = 0; i < np && off + 16 < sizeof(gl); i++)
            off += (size_t)snprintf(gl + off, sizeof(gl) - off, "%s%lld", i ? "," : "",
                                    (long long)geti(json_array_get(place, i), "gpu"));
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

/* "3m12s" for a duration in ms */
static void fmt_dur(int64_t ms, char *out, size_t len)
{
    if (ms < 0)
        ms = 0;
    int64_t s = ms / 1000;
    if (s < 60)
        snprintf(out, len, "%llds", (long long)s);
    else if (s < 3600)
        snprintf(out, len, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
    else
        snprintf(out, len, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
}

/* Who waits: queued services in queue order (what they need, since when, resumed from what),
 * then pending ones with the victims they wait for and those victims' deadlines. */
static int cmd_queue(void)
{
    int ex;
    json_t *r = call("GET", "/v1/services", NULL, &ex);
    if (r == NULL || ex)
        return ex;
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
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    if (json_array_size(queued) + json_array_size(pending) == 0)
        printf("nobody waits\n");
    if (json_array_size(queued) > 0) {
        printf("%-4s %-24s %-10s %10s  %-20s %8s  %s\n", "POS", "SERVICE", "CLASS", "NEEDS",
               "WAITING SINCE", "FOR", "NOTE");
        json_array_foreach(queued, i, s)
        {
            char when[32], dur[32];
            time_t t = (time_t)(geti(s, "since_unix_ms") / 1000);
            struct tm tm;
            localtime_r(&t, &tm);
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
            fmt_dur(now - geti(s, "since_unix_ms"), dur, sizeof(dur));
            char note[200] = "";
            if (geti(s, "evictions") > 0)
                snprintf(
                    note, sizeof(note), "evicted %lld time(s)%s%s", (long long)geti(s, "evictions"),
                    gets_(s, "checkpoint")[0] ? "; resumes from " : "", gets_(s, "checkpoint"));
            printf("%-4lld %-24s %-10s %6lld MiB  %-20s %8s  %s\n",
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
    size_t start = len;
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
static int cmd_logs(int argc, char **argv)
{
    const char *id = NULL;
    long n = 20;
    bool follow = false;
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "-n") == 0 || strcmp(argv[i], "--lines") == 0) && i + 1 < argc) {
            char *end;
            n = strtol(argv[++i], &end, 10);
            if (*end != '\0' || n < 0) {
                fprintf(stderr, "oversub logs: -n wants a number of lines\n");
                return EX_USAGE;
            }
        } else if (strcmp(argv[i], "--follow") == 0 || strcmp(argv[i], "-f") == 0) {
            follow = true;
        } else if (id == NULL && argv[i][0] != '-') {
            id = argv[i];
        } else {
            fprintf(stderr, "usage: oversub logs ID [-n N] [--follow]\n");
            return EX_USAGE;
        }
    }
    if (id == NULL) {
        fprintf(stderr, "usage: oversub logs ID [-n N] [--follow]\n");
        return EX_USAGE;
    }
    char path[200];
    snprintf(path, sizeof(path), "/v1/services/%s", id);
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

int cli_daemon_cmd(int argc, char **argv)
{
    /* global options before the command's own: --url, --json */
    const char *url = NULL;
    int w = 0;
    bool rest = false; /* after "--": a managed service's argv, left alone */
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            rest = true;
        if (rest)
            argv[w++] = argv[i];
        else if (strcmp(argv[i], "--url") == 0 && i + 1 < argc)
            url = argv[++i];
        else if (strcmp(argv[i], "--json") == 0)
            as_json = true;
        else
            argv[w++] = argv[i];
    }
    argc = w;
    if (argc == 0) {
        fprintf(stderr, "oversub: which command? (see 'oversub --help')\n");
        return EX_USAGE;
    }
    char err[300];
    if (http_target_init(&tgt, url, err, sizeof(err)) != 0) {
        fprintf(stderr, "oversub: --url: %s\n", err);
        return EX_USAGE;
    }
    const char *cmd = argv[0];
    char path[160];
    if (strcmp(cmd, "status") == 0)
        return argc == 1 ? cmd_status() : EX_USAGE;
    if (strcmp(cmd, "deploy") == 0)
        return cmd_deploy(argc, argv);
    if (strcmp(cmd, "events") == 0)
        return cmd_events(argc, argv);
    if (strcmp(cmd, "explain") == 0 && argc == 2)
        return cmd_explain(argv[1]);
    if (strcmp(cmd, "release") == 0 && argc == 2) {
        snprintf(path, sizeof(path), "/v1/services/%s", argv[1]);
        return simple("DELETE", path, NULL);
    }
    if (strcmp(cmd, "usage") == 0 && argc == 4 && strcmp(argv[2], "--vram") == 0) {
        int64_t v;
        if (size_arg("--vram", argv[3], &v) != 0)
            return EX_USAGE;
        snprintf(path, sizeof(path), "/v1/services/%s/usage", argv[1]);
        json_t *b = json_pack("{s:I}", "vram_mib", (json_int_t)v);
        int ex = simple("PUT", path, b);
        json_decref(b);
        return ex;
    }
    if (strcmp(cmd, "resize") == 0 && argc >= 4) {
        json_t *b = json_object();
        for (int i = 2; i + 1 < argc; i += 2) {
            int64_t v;
            const char *k = strcmp(argv[i], "--vram") == 0       ? "vram_mib"
                            : strcmp(argv[i], "--min-vram") == 0 ? "min_vram_mib"
                                                                 : NULL;
            if (k != NULL) {
                if (size_arg(argv[i], argv[i + 1], &v) != 0) {
                    json_decref(b);
                    return EX_USAGE;
                }
                json_object_set_new(b, k, json_integer(v));
            } else if (strcmp(argv[i], "--batch") == 0) {
                json_object_set_new(b, "batch_size", json_integer(atoi(argv[i + 1])));
            } else {
                json_decref(b);
                fprintf(stderr, "usage: oversub resize ID [--vram S] [--min-vram S] [--batch N]\n");
                return EX_USAGE;
            }
        }
        snprintf(path, sizeof(path), "/v1/services/%s", argv[1]);
        int ex = simple("PATCH", path, b);
        json_decref(b);
        return ex;
    }
    if (strcmp(cmd, "ratio") == 0 && argc == 2) {
        int32_t m;
        if (osub_parse_ratio(argv[1], &m) != 0) {
            fprintf(stderr, "oversub: '%s' is not a ratio such as 1.3 (at most three decimals)\n",
                    argv[1]);
            return EX_USAGE;
        }
        json_t *b = json_pack("{s:s}", "ratio", argv[1]);
        int ex;
        json_t *r = call("PUT", "/v1/pool", b, &ex);
        json_decref(b);
        if (r != NULL && ex == EX_OK)
            printf("ratio %s\n", gets_(r, "ratio_text"));
        json_decref(r);
        return ex;
    }
    if (strcmp(cmd, "gpu") == 0 && argc == 3 &&
        (strcmp(argv[1], "cordon") == 0 || strcmp(argv[1], "uncordon") == 0 ||
         strcmp(argv[1], "drain") == 0)) {
        snprintf(path, sizeof(path), "/v1/gpus/%s/%s", argv[2], argv[1]);
        int ex;
        json_t *r = call("POST", path, NULL, &ex);
        if (r != NULL && ex == EX_OK)
            printf("GPU %s: %s\n", argv[2], argv[1]);
        json_decref(r);
        return ex;
    }
    if (strcmp(cmd, "queue") == 0 && argc == 1)
        return cmd_queue();
    if (strcmp(cmd, "logs") == 0)
        return cmd_logs(argc, argv);
    fprintf(stderr, "oversub: '%s': wrong arguments (see 'oversub --help')\n", cmd);
    return EX_USAGE;
}
