/* daemon_services.c - the oversub CLI's commands that change services and the pool: deploy,
 * ready, resize, usage, release, gpu, ratio */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "daemon_cmds_internal.h"
#include "oversub/errors.h"
#include "oversub/units.h"

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
    json_t *r = dcmd_request("GET", path, NULL, &st);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r, "events"), i, e)
    {
        if (strcmp(dcmd_gets(e, "service"), id) == 0)
            snprintf(out, len, "%s", dcmd_gets(e, "message"));
    }
    json_decref(r);
}

/* The line that says a service is up. */
static void print_up(json_t *s, double waited_s)
{
    char gpus[128];
    dcmd_fmt_gpus(s, gpus, sizeof(gpus));
    const char *st = dcmd_gets(s, "state");
    printf("%s: %s on GPU%s %s with %lld MiB", dcmd_gets(s, "id"), st, strchr(gpus, ',') ? "s" : "",
           gpus[0] ? gpus : "-", (long long)dcmd_geti(s, "grant_mib"));
    if (strcmp(st, "degraded") == 0)
        printf(" (degraded: its floor; it asked for %lld MiB)",
               (long long)dcmd_geti(s, "vram_mib"));
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
    double t0 = dcmd_mono_s();
    long long since = 0;
    int ex = dcmd_newest_seq(&since);
    if (ex != EX_OK)
        return ex;
    char path[160], reason[1024] = "";
    dcmd_svc_path(path, sizeof(path), id, "");
    bool told = false;
    for (;;) {
        int status;
        json_t *s = dcmd_request("GET", path, NULL, &status);
        if (s == NULL)
            return EX_UNREACHABLE;
        if (status == 404) {
            json_decref(s);
            if (reason[0] == '\0')
                last_event_about(id, since, reason, sizeof(reason));
            char msg[1400];
            snprintf(msg, sizeof(msg), "%s is not deployed: %s", id,
                     reason[0] ? reason : "no such service (released, refused or never deployed)");
            fprintf(stderr, "oversub %s: %s\n", dcmd_cur, msg);
            dcmd_json_error("not_ready", msg,
                            json_pack("{s:s, s:s}", "id", id, "state", "released"));
            return EX_REFUSED;
        }
        if (status >= 400) {
            const char *m =
                json_string_value(json_object_get(json_object_get(s, "error"), "message"));
            fprintf(stderr, "oversub %s: refused (%d): %s\n", dcmd_cur, status, m ? m : "");
            if (dcmd_as_json)
                dcmd_print_json(s);
            json_decref(s);
            return EX_REFUSED;
        }
        const char *st = dcmd_gets(s, "state");
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
            fprintf(stderr, "oversub %s: %s\n", dcmd_cur, msg);
            dcmd_json_error("not_ready", msg, json_pack("{s:s, s:s}", "id", id, "state", st));
            json_decref(s);
            return EX_REFUSED;
        }
        double left = timeout_s > 0 ? (double)timeout_s - (dcmd_mono_s() - t0) : 30;
        if (left <= 0) {
            char msg[1400];
            snprintf(msg, sizeof(msg), "%s is still %s after %ld s%s%s", id, st, timeout_s,
                     reason[0] ? "; last: " : "", reason);
            fprintf(stderr, "oversub %s: %s (timeout; see 'oversub explain %s')\n", dcmd_cur, msg,
                    id);
            dcmd_json_error("timeout", msg, json_pack("{s:s, s:s}", "id", id, "state", st));
            json_decref(s);
            return EX_TIMEOUT;
        }
        if (!told) {
            char lim[48] = "";
            if (timeout_s > 0)
                snprintf(lim, sizeof(lim), " (at most %ld s)", timeout_s);
            fprintf(stderr, "oversub %s: %s is %s; waiting until it is running%s\n", dcmd_cur, id,
                    st, lim);
            told = true;
        }
        json_decref(s);
        int wait = left > 30 ? 30 : (int)(left + 0.999);
        if (wait < 1)
            wait = 1;
        char epath[96];
        snprintf(epath, sizeof(epath), "/v1/events?since=%lld&wait=%d", since, wait);
        json_t *r = dcmd_request("GET", epath, NULL, &status);
        if (r == NULL)
            return EX_UNREACHABLE;
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(r, "events"), i, e)
        {
            if (strcmp(dcmd_gets(e, "service"), id) == 0)
                snprintf(reason, sizeof(reason), "%s", dcmd_gets(e, "message"));
        }
        if (status == 200 && json_integer_value(json_object_get(r, "next")) > since)
            since = dcmd_geti(r, "next");
        json_decref(r);
    }
}

static int timeout_arg(const struct args *a, long *timeout_s)
{
    *timeout_s = 300;
    const char *t = dcmd_opt(a, "timeout");
    return t != NULL ? dcmd_num_arg("--timeout", t, 0, 86400 * 365, timeout_s) : 0;
}

int dcmd_ready(const struct args *a)
{
    const char *id = a->pos[0];
    long timeout_s;
    if (dcmd_check_id(id) != 0 || timeout_arg(a, &timeout_s) != 0)
        return EX_USAGE;
    double t0 = dcmd_mono_s();
    json_t *s;
    int ex = wait_ready(id, timeout_s, &s);
    if (ex != EX_OK)
        return ex;
    if (dcmd_as_json)
        dcmd_print_json(s);
    else
        print_up(s, dcmd_mono_s() - t0);
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
    long min, max; /* the daemon's own ranges */
} spec_numbers[] = {{"gpus", "gpus", 0, 4096},
                    {"compute", "compute_pct", 0, 100},
                    {"batch", "batch_size", 0, 1000000},
                    {"min-batch", "min_batch_size", 0, 1000000},
                    {"max-inflight", "max_inflight", 0, 1000000},
                    {"max-queue", "max_queue", 0, 1000000},
                    {"queue-timeout", "queue_timeout_ms", 0, 86400000},
                    {"idle-suspend", "idle_suspend_ms", 1000, 604800000},
                    {"grace", "grace_ms", 0, 86400000},
                    {"restart-cost", "restart_cost_ms", 0, 86400000},
                    {"max-restarts", "max_restarts", 0, 1000000}};

/* What the daemon decided, in a line or a few (not --json). */
static void print_deploy(const char *id, json_t *r, bool dry, bool will_wait)
{
    json_t *dec = json_object_get(r, "decision");
    const char *outcome = dcmd_gets(dec, "outcome");
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
    const char *st = dry ? "" : dcmd_gets(r, "state");
    bool hint = false;
    if (dry) {
        if (strcmp(outcome, "started") == 0)
            printf("(dry run) %s: would start on GPU%s %s\n", id, gs, gpus);
        else if (strcmp(outcome, "pending") == 0)
            printf("(dry run) %s: would be pending on GPU%s %s, waiting for its victims\n", id, gs,
                   gpus);
        else if (strcmp(outcome, "queued") == 0)
            printf("(dry run) %s: would be queued at position %lld\n", id,
                   (long long)dcmd_geti(dec, "queue_position"));
        else
            printf("(dry run) %s: %s\n", id, outcome);
    } else if (strcmp(outcome, "exists") == 0) {
        printf("%s: already deployed with this spec; it is %s\n", id, st);
        hint = !is_up(st);
    } else if (strcmp(st, "loading") == 0) {
        dcmd_fmt_dur(dcmd_geti(r, "restart_cost_ms"), dur, sizeof(dur));
        printf("%s: loading on GPU%s %s with %lld MiB; it is running once it reports ready (or "
               "after %s)\n",
               id, gs, gpus, (long long)dcmd_geti(r, "grant_mib"), dur);
        hint = true;
    } else if (strcmp(st, "pending") == 0) {
        printf("%s: pending on GPU%s %s: it loads once its victims have given their memory "
               "back\n",
               id, gs, gpus);
        hint = true;
    } else if (strcmp(st, "queued") == 0) {
        printf("%s: queued at position %lld: no GPU has room for it now", id,
               (long long)dcmd_geti(r, "queue_position"));
        if (json_object_get(dec, "shortfall_mib"))
            printf(" (the %s check is short by %lld MiB on GPU %lld)", dcmd_gets(dec, "check"),
                   (long long)dcmd_geti(dec, "shortfall_mib"), (long long)dcmd_geti(dec, "gpu"));
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
        dcmd_fmt_dur(dcmd_geti(v, "deadline_unix_ms") - dcmd_now_unix_ms(), when, sizeof(when));
        printf("  victim: %s %s (deadline in %s)\n", dcmd_gets(v, "action"),
               dcmd_gets(v, "service"), when);
    }
    if (hint && !will_wait)
        printf("  next: 'oversub ready %s' waits until it is running\n", id);
    fflush(stdout);
}

/* --suspend METHOD [--suspend-url URL]: the spec's "suspend" (http, with its paths, through the
 * API's JSON). */
static int suspend_arg(const struct args *a, json_t *spec)
{
    const char *m = dcmd_opt(a, "suspend"), *url = dcmd_opt(a, "suspend-url");
    if (m == NULL) {
        if (url == NULL)
            return 0;
        fprintf(stderr, "oversub deploy: --suspend-url goes with --suspend vllm or sglang\n");
        return -1;
    }
    bool cuda = strcmp(m, "cuda") == 0;
    if (!cuda && strcmp(m, "vllm") != 0 && strcmp(m, "sglang") != 0) {
        fprintf(stderr,
                "oversub deploy: --suspend is cuda, vllm or sglang, not '%s' (the http method, "
                "with its paths, is given in the spec's JSON: POST /v1/services)\n",
                m);
        return -1;
    }
    if (cuda != (url == NULL)) {
        fprintf(stderr,
                cuda ? "oversub deploy: --suspend cuda takes no --suspend-url\n"
                     : "oversub deploy: --suspend %s needs --suspend-url URL (the "
                       "server's http://HOST:PORT)\n",
                m);
        return -1;
    }
    json_t *o = json_pack("{s:s}", "method", m);
    if (url != NULL)
        json_object_set_new(o, "url", json_string(url));
    json_object_set_new(spec, "suspend", o);
    return 0;
}

int dcmd_deploy(const struct args *a)
{
    const char *id = a->pos[0];
    if (dcmd_check_id(id) != 0)
        return EX_USAGE;
    if (dcmd_opt(a, "class") == NULL) {
        fprintf(stderr,
                "oversub deploy: --class is required: online (never preempted, backed by "
                "physical memory), batch (degraded, then evicted, before online work) or "
                "experiment (first to go)\n"
                "  e.g. oversub deploy %s --class batch --vram 20GiB\n",
                id);
        return EX_USAGE;
    }
    if (dcmd_opt(a, "vram") == NULL) {
        fprintf(stderr, "oversub deploy: --vram is required (its memory, such as 20GiB)\n");
        return EX_USAGE;
    }
    bool dry = dcmd_opt(a, "dry-run") != NULL, wait = dcmd_opt(a, "wait") != NULL;
    long timeout_s;
    if (timeout_arg(a, &timeout_s) != 0)
        return EX_USAGE;
    if (dry && wait) {
        fprintf(stderr, "oversub deploy: --dry-run deploys nothing to wait for (drop --wait)\n");
        return EX_USAGE;
    }
    if (dcmd_opt(a, "timeout") != NULL && !wait) {
        fprintf(stderr, "oversub deploy: --timeout goes with --wait\n");
        return EX_USAGE;
    }
    json_t *spec = json_pack("{s:s}", "id", id);
    int64_t v;
    for (size_t i = 0; i < sizeof(spec_strings) / sizeof(spec_strings[0]); i++) {
        const char *s = dcmd_opt(a, spec_strings[i].flag);
        if (s != NULL)
            json_object_set_new(spec, spec_strings[i].key, json_string(s));
    }
    for (size_t i = 0; i < sizeof(spec_numbers) / sizeof(spec_numbers[0]); i++) {
        const char *s = dcmd_opt(a, spec_numbers[i].flag);
        long n;
        if (s == NULL)
            continue;
        char flag[32];
        snprintf(flag, sizeof(flag), "--%s", spec_numbers[i].flag);
        if (dcmd_num_arg(flag, s, spec_numbers[i].min, spec_numbers[i].max, &n) != 0)
            goto usage;
        json_object_set_new(spec, spec_numbers[i].key, json_integer(n));
    }
    if (dcmd_size_arg("--vram", dcmd_opt(a, "vram"), &v) != 0)
        goto usage;
    json_object_set_new(spec, "vram_mib", json_integer(v));
    if (dcmd_opt(a, "min-vram") != NULL) {
        if (dcmd_size_arg("--min-vram", dcmd_opt(a, "min-vram"), &v) != 0)
            goto usage;
        json_object_set_new(spec, "min_vram_mib", json_integer(v));
    }
    if (dcmd_opt(a, "exclusive") != NULL)
        json_object_set_new(spec, "exclusive", json_true());
    if (dcmd_opt(a, "resumable") != NULL)
        json_object_set_new(spec, "resumable", json_true());
    if (dcmd_opt(a, "no-queue") != NULL)
        json_object_set_new(spec, "queue", json_false());
    int i_env = dcmd_flag_index(a->cmd, "env"), i_backend = dcmd_flag_index(a->cmd, "backend");
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
    if (suspend_arg(a, spec) != 0)
        goto usage;
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
    json_t *r = dcmd_call("POST", dry ? "/v1/services?dry_run=1" : "/v1/services", spec, &ex);
    json_decref(spec);
    if (r == NULL)
        return ex;
    if (ex != EX_OK) {
        json_t *dec = json_object_get(r, "decision");
        if (!dcmd_as_json && json_object_get(dec, "shortfall_mib") != NULL) {
            fprintf(stderr, "  the %s check is short by %lld MiB", dcmd_gets(dec, "check"),
                    (long long)dcmd_geti(dec, "shortfall_mib"));
            if (json_object_get(dec, "gpu") != NULL)
                fprintf(stderr, " on GPU %lld", (long long)dcmd_geti(dec, "gpu"));
            fprintf(stderr, "\n");
        }
        json_decref(r);
        return ex;
    }
    if (!dcmd_as_json)
        print_deploy(id, r, dry, wait);
    if (!wait || is_up(dcmd_gets(r, "state"))) {
        if (dcmd_as_json)
            dcmd_print_json(r);
        json_decref(r);
        return EX_OK;
    }
    double t0 = dcmd_mono_s();
    json_t *s;
    dcmd_cur = "deploy --wait";
    ex = wait_ready(id, timeout_s, &s);
    if (ex == EX_OK) {
        if (dcmd_as_json) { /* one document: the service now, with the submit's decision and token
                             */
            json_object_set(s, "decision", json_object_get(r, "decision"));
            json_object_set(s, "token", json_object_get(r, "token"));
            dcmd_print_json(s);
        } else {
            print_up(s, dcmd_mono_s() - t0);
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
    dcmd_fmt_gpus(s, gpus, sizeof(gpus));
    printf("%s: %s, request %lld MiB", dcmd_gets(s, "id"), dcmd_gets(s, "state"),
           (long long)dcmd_geti(s, "vram_mib"));
    if (dcmd_geti(s, "min_vram_mib") != dcmd_geti(s, "vram_mib"))
        printf(" (floor %lld MiB)", (long long)dcmd_geti(s, "min_vram_mib"));
    printf(", grant %lld MiB, used %lld MiB", (long long)dcmd_geti(s, "grant_mib"),
           (long long)dcmd_geti(s, "used_mib"));
    if (dcmd_geti(s, "batch") > 0)
        printf(", batch %lld", (long long)dcmd_geti(s, "batch"));
    if (gpus[0])
        printf(", GPU%s %s", strchr(gpus, ',') ? "s" : "", gpus);
    printf("\n");
}

static int service_cmd(const char *method, const char *path, json_t *body)
{
    int ex;
    json_t *r = dcmd_call(method, path, body, &ex);
    if (r == NULL || ex != EX_OK) {
        json_decref(r);
        return ex;
    }
    if (dcmd_as_json)
        dcmd_print_json(r);
    else if (strcmp(method, "DELETE") == 0 || strcmp(dcmd_gets(r, "state"), "released") == 0)
        printf("%s: %s\n", dcmd_gets(r, "id"), dcmd_gets(r, "state"));
    else
        print_service_line(r);
    json_decref(r);
    return EX_OK;
}

int dcmd_release(const struct args *a)
{
    char path[160];
    if (dcmd_check_id(a->pos[0]) != 0)
        return EX_USAGE;
    dcmd_svc_path(path, sizeof(path), a->pos[0], "");
    return service_cmd("DELETE", path, NULL);
}

/* oversub suspend ID / oversub resume ID: an operator's suspend (held until resumed) */
static int suspend_cmd(const struct args *a, const char *op)
{
    char path[160];
    if (dcmd_check_id(a->pos[0]) != 0)
        return EX_USAGE;
    dcmd_svc_path(path, sizeof(path), a->pos[0], op);
    json_t *b = json_object();
    int ex = service_cmd("POST", path, b);
    json_decref(b);
    return ex;
}

int dcmd_suspend(const struct args *a)
{
    return suspend_cmd(a, "/suspend");
}

int dcmd_resume(const struct args *a)
{
    return suspend_cmd(a, "/resume");
}

int dcmd_usage(const struct args *a)
{
    const char *id = a->pos[0];
    if (dcmd_check_id(id) != 0)
        return EX_USAGE;
    if (dcmd_opt(a, "vram") == NULL) {
        fprintf(stderr, "oversub usage: --vram is required (the memory it uses now, such as "
                        "12GiB)\n");
        return EX_USAGE;
    }
    int64_t v;
    if (dcmd_size_arg("--vram", dcmd_opt(a, "vram"), &v) != 0)
        return EX_USAGE;
    json_t *b = json_pack("{s:I}", "vram_mib", (json_int_t)v);
    if (dcmd_opt(a, "compute") != NULL) {
        long pct;
        if (dcmd_num_arg("--compute", dcmd_opt(a, "compute"), 0, 100, &pct) != 0) {
            json_decref(b);
            return EX_USAGE;
        }
        json_object_set_new(b, "compute_pct", json_integer(pct));
    }
    char path[160];
    dcmd_svc_path(path, sizeof(path), id, "/usage");
    int ex = service_cmd("PUT", path, b);
    json_decref(b);
    return ex;
}

int dcmd_resize(const struct args *a)
{
    const char *id = a->pos[0];
    if (dcmd_check_id(id) != 0)
        return EX_USAGE;
    json_t *b = json_object();
    int64_t v;
    long n;
    static const char *const sizes[][2] = {{"vram", "vram_mib"}, {"min-vram", "min_vram_mib"}};
    for (size_t i = 0; i < 2; i++) {
        const char *s = dcmd_opt(a, sizes[i][0]);
        char flag[32];
        snprintf(flag, sizeof(flag), "--%s", sizes[i][0]);
        if (s == NULL)
            continue;
        if (dcmd_size_arg(flag, s, &v) != 0)
            goto usage;
        json_object_set_new(b, sizes[i][1], json_integer(v));
    }
    if (dcmd_opt(a, "batch") != NULL) {
        if (dcmd_num_arg("--batch", dcmd_opt(a, "batch"), 1, 1000000, &n) != 0)
            goto usage;
        json_object_set_new(b, "batch_size", json_integer(n));
    }
    if (json_object_size(b) == 0) {
        fprintf(stderr, "oversub resize: say what changes: --vram, --min-vram or --batch\n");
        goto usage;
    }
    char path[160];
    dcmd_svc_path(path, sizeof(path), id, "");
    int ex = service_cmd("PATCH", path, b);
    json_decref(b);
    return ex;
usage:
    json_decref(b);
    return EX_USAGE;
}

/* ---- gpu, ratio ------------------------------------------------------------------------ */

int dcmd_gpu(const struct args *a)
{
    const char *action = a->pos[0], *gpu = a->pos[1];
    if (strcmp(action, "cordon") != 0 && strcmp(action, "uncordon") != 0 &&
        strcmp(action, "drain") != 0) {
        fprintf(stderr, "oversub gpu: '%s' is not cordon, uncordon or drain\n", action);
        return EX_USAGE;
    }
    long idx;
    if (dcmd_num_arg("the GPU index", gpu, 0, 4095, &idx) != 0)
        return EX_USAGE;
    char path[96];
    snprintf(path, sizeof(path), "/v1/gpus/%ld/%s", idx, action);
    int ex;
    json_t *r = dcmd_call("POST", path, NULL, &ex);
    if (r != NULL && ex == EX_OK) {
        if (dcmd_as_json)
            dcmd_print_json(r);
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
    if (dcmd_as_json) {
        dcmd_print_json(p);
        return;
    }
    printf("ratio %s: logical capacity %lld MiB on %lld MiB of GPU memory\n",
           dcmd_gets(p, "ratio_text"),
           (long long)dcmd_geti(json_object_get(p, "totals"), "logical_mib"),
           (long long)dcmd_geti(json_object_get(p, "totals"), "vram_mib"));
}

int dcmd_ratio(const struct args *a)
{
    int ex;
    if (a->n_pos == 0) {
        json_t *p = dcmd_call("GET", "/v1/pool", NULL, &ex);
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
    json_t *p = dcmd_call("PUT", "/v1/pool", b, &ex);
    json_decref(b);
    if (p != NULL && ex == EX_OK)
        show_ratio(p);
    json_decref(p);
    return ex;
}
