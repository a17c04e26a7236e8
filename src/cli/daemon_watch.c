/* daemon_watch.c - the oversub CLI's commands that show what oversubd holds and decided:
 * status, list, events, explain, queue, logs */
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

/* ---- events ---------------------------------------------------------------------------- */

/* One page of the log after `since`: its number of events and its "next". */
static int events_page(long long since, size_t *n, long long *next)
{
    char path[96];
    snprintf(path, sizeof(path), "/v1/events?since=%lld&wait=0", since);
    int ex;
    json_t *r = dcmd_call("GET", path, NULL, &ex);
    if (r == NULL || ex != EX_OK) {
        json_decref(r);
        return ex;
    }
    *n = json_array_size(json_object_get(r, "events"));
    *next = dcmd_geti(r, "next");
    json_decref(r);
    return EX_OK;
}

/* A page that is not full ends at the newest event, and a search over `since` finds one in about 2
 * log2(N/1000) pages. Returns an exit code. */
int dcmd_newest_seq(long long *out)
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
    dcmd_fmt_time(dcmd_geti(e, "time_unix_ms"), true, ts, sizeof(ts));
    printf("%6lld %s %-9s %-14s %s\n", (long long)dcmd_geti(e, "seq"), ts, dcmd_gets(e, "kind"),
           dcmd_gets(e, "reason"), dcmd_gets(e, "message"));
}

int dcmd_events(const struct args *a)
{
    bool follow = dcmd_opt(a, "follow") != NULL;
    long long since = 0;
    const char *s = dcmd_opt(a, "since"), *last = dcmd_opt(a, "last");
    if (s != NULL && last != NULL) {
        fprintf(stderr, "oversub events: --since or --last, not both\n");
        return EX_USAGE;
    }
    if (s != NULL) {
        long v;
        if (dcmd_num_arg("--since", s, 0, LONG_MAX, &v) != 0)
            return EX_USAGE;
        since = v;
    } else if (last != NULL || follow) {
        long nlast = 0;
        if (last != NULL && dcmd_num_arg("--last", last, 0, 1000000, &nlast) != 0)
            return EX_USAGE;
        int ex = dcmd_newest_seq(&since);
        if (ex != EX_OK)
            return ex;
        since = since > nlast ? since - nlast : 0;
    }
    if (follow) {
        fprintf(stderr,
                "oversub events: following the decision log after seq %lld (Ctrl-C stops)\n",
                since);
    }
    json_t *all = dcmd_as_json && !follow ? json_array() : NULL;
    for (;;) {
        char path[96];
        snprintf(path, sizeof(path), "/v1/events?since=%lld&wait=%d", since, follow ? 30 : 0);
        int ex;
        json_t *r = dcmd_call("GET", path, NULL, &ex);
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
            } else if (dcmd_as_json) { /* --follow --json: one event a line */
                json_dumpf(e, stdout, JSON_COMPACT);
                fputc('\n', stdout);
            } else {
                print_event(e);
            }
        }
        fflush(stdout);
        size_t n = json_array_size(evs);
        since = dcmd_geti(r, "next");
        json_decref(r);
        if (!follow && n < EVENTS_PAGE)
            break;
    }
    if (all != NULL) {
        json_t *doc = json_pack("{s:o, s:I}", "events", all, "next", (json_int_t)since);
        dcmd_print_json(doc);
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
        snprintf(proc, len, "pid %lld", (long long)dcmd_geti(pr, "pid"));
    else if (pr != NULL)
        snprintf(proc, len, "not running");
    else if (json_object_get(s, "pid") != NULL)
        snprintf(proc, len, "pid %lld (external)", (long long)dcmd_geti(s, "pid"));
    if (pr != NULL && dcmd_geti(pr, "restarts") > 0) {
        size_t l = strlen(proc);
        snprintf(proc + l, len - l, ", %lld restart(s)", (long long)dcmd_geti(pr, "restarts"));
    }
}

int dcmd_status(const struct args *a)
{
    (void)a;
    int ex;
    json_t *pool = dcmd_call("GET", "/v1/pool", NULL, &ex);
    if (pool == NULL || ex) {
        json_decref(pool);
        return ex;
    }
    json_t *svcs = dcmd_call("GET", "/v1/services", NULL, &ex);
    if (svcs == NULL || ex) {
        json_decref(pool);
        json_decref(svcs);
        return ex;
    }
    if (dcmd_as_json) {
        json_t *all =
            json_pack("{s:O, s:O}", "pool", pool, "services", json_object_get(svcs, "services"));
        dcmd_print_json(all);
        json_decref(all);
    } else {
        json_t *u = json_object_get(pool, "utilization");
        printf("ratio %s   used %.1f%%   held %.1f%%   logical %.1f%%%s\n\n",
               dcmd_gets(pool, "ratio_text"), 100 * json_number_value(json_object_get(u, "used")),
               100 * json_number_value(json_object_get(u, "held")),
               100 * json_number_value(json_object_get(u, "logical")),
               json_is_true(json_object_get(pool, "overcommitted")) ? "   OVER-COMMITTED" : "");
        printf("%-4s %9s %9s %9s %9s %9s  %s\n", "GPU", "VRAM", "logical", "granted", "held",
               "used", "");
        size_t i;
        json_t *g;
        json_array_foreach(json_object_get(pool, "gpus"), i, g)
        {
            printf("%-4lld %9lld %9lld %9lld %9lld %9lld  %s%s\n", (long long)dcmd_geti(g, "index"),
                   (long long)dcmd_geti(g, "vram_mib"), (long long)dcmd_geti(g, "logical_mib"),
                   (long long)dcmd_geti(g, "granted_mib"), (long long)dcmd_geti(g, "held_mib"),
                   (long long)dcmd_geti(g, "used_mib"),
                   json_is_true(json_object_get(g, "cordoned")) ? "cordoned " : "",
                   json_is_true(json_object_get(g, "lost")) ? "lost" : "");
        }
        printf("\n%-24s %-10s %-10s %9s %9s %9s  %-8s %s\n", "SERVICE", "CLASS", "STATE", "grant",
               "held", "used", "GPUs", "PROCESS");
        json_t *s;
        json_array_foreach(json_object_get(svcs, "services"), i, s)
        {
            char gpus[128], proc[64];
            dcmd_fmt_gpus(s, gpus, sizeof(gpus));
            process_text(s, proc, sizeof(proc));
            printf("%-24s %-10s %-10s %9lld %9lld %9lld  %-8s %s\n", dcmd_gets(s, "id"),
                   dcmd_gets(s, "class"), dcmd_gets(s, "state"),
                   (long long)dcmd_geti(s, "grant_mib"), (long long)dcmd_geti(s, "held_mib"),
                   (long long)dcmd_geti(s, "used_mib"), gpus[0] ? gpus : "-", proc);
        }
        printf("(MiB)\n");
    }
    json_decref(pool);
    json_decref(svcs);
    return EX_OK;
}

int dcmd_list(const struct args *a)
{
    int ex;
    json_t *r = dcmd_call("GET", "/v1/services", NULL, &ex);
    if (r == NULL || ex) {
        json_decref(r);
        return ex;
    }
    json_t *list = json_object_get(r, "services");
    size_t i;
    json_t *s;
    if (dcmd_as_json) {
        dcmd_print_json(r);
    } else if (dcmd_opt(a, "ids") != NULL) {
        json_array_foreach(list, i, s) printf("%s\n", dcmd_gets(s, "id"));
    } else {
        printf("%-24s %-10s %-10s %9s %9s  %s\n", "SERVICE", "CLASS", "STATE", "grant MiB",
               "vram MiB", "GPUs");
        json_array_foreach(list, i, s)
        {
            char gpus[128];
            dcmd_fmt_gpus(s, gpus, sizeof(gpus));
            printf("%-24s %-10s %-10s %9lld %9lld  %s\n", dcmd_gets(s, "id"), dcmd_gets(s, "class"),
                   dcmd_gets(s, "state"), (long long)dcmd_geti(s, "grant_mib"),
                   (long long)dcmd_geti(s, "vram_mib"), gpus[0] ? gpus : "-");
        }
    }
    json_decref(r);
    return EX_OK;
}

/* ---- explain --------------------------------------------------------------------------- */

/* A service in suspend: where its memory is, what stays, what brings it back. */
static void explain_suspend(json_t *s, const char *st)
{
    const char *method = dcmd_gets(json_object_get(s, "suspend"), "method");
    if (strcmp(st, "suspending") == 0) {
        char when[64];
        dcmd_fmt_time(dcmd_geti(s, "deadline_unix_ms"), false, when, sizeof(when));
        printf(": its memory is going to host memory (method %s); it holds its %lld MiB until "
               "its memory is seen to fall, and is evicted with its grace if that has not "
               "happened by %s\n",
               method, (long long)dcmd_geti(s, "held_mib"), when);
        return;
    }
    if (strcmp(st, "resuming") == 0) {
        printf(": its memory is coming back from host memory (method %s) on the GPUs it left; "
               "it holds its %lld MiB grant, as a loading service does, within %lld ms\n",
               method, (long long)dcmd_geti(s, "grant_mib"),
               (long long)dcmd_geti(s, "resume_cost_ms"));
        return;
    }
    printf(": its GPU memory is in host memory (%lld MiB, method %s); its processes live on; "
           "%lld MiB stay on its GPUs (its residual); it keeps its %lld MiB grant\n",
           (long long)dcmd_geti(s, "host_mib"), method, (long long)dcmd_geti(s, "residual_mib"),
           (long long)dcmd_geti(s, "grant_mib"));
    if (json_is_true(json_object_get(s, "suspend_idle")))
        printf("  suspended for idleness (no gateway request for %lld ms): its next request "
               "resumes it when its GPUs have room\n",
               (long long)dcmd_geti(s, "idle_suspend_ms"));
    else if (json_is_true(json_object_get(s, "suspend_held")))
        printf("  suspended by an operator: it stays so until 'oversub resume %s'\n",
               dcmd_gets(s, "id"));
    else
        printf("  suspended to make room: it resumes as soon as its GPUs have room for its grant "
               "(ahead of the queue at its level); the resume itself takes about %lld ms\n",
               (long long)dcmd_geti(s, "resume_cost_ms"));
}

int dcmd_explain(const struct args *a)
{
    const char *id = a->pos[0];
    if (dcmd_check_id(id) != 0)
        return EX_USAGE;
    char path[160];
    dcmd_svc_path(path, sizeof(path), id, "");
    int ex;
    json_t *s = dcmd_call("GET", path, NULL, &ex);
    if (s == NULL || ex) {
        json_decref(s);
        return ex;
    }
    if (dcmd_as_json) {
        dcmd_print_json(s);
        json_decref(s);
        return EX_OK;
    }
    int64_t now = dcmd_now_unix_ms();
    char when[64], in[32];
    const char *st = dcmd_gets(s, "state");
    printf("%s (%s) is %s", id, dcmd_gets(s, "class"), st);
    if (strcmp(st, "queued") == 0) {
        printf(" at position %lld of the queue: no GPU has room for its %lld MiB even with the "
               "lower-priority services it may preempt; it starts when memory comes free\n",
               (long long)dcmd_geti(s, "queue_position"), (long long)dcmd_geti(s, "vram_mib"));
    } else if (strcmp(st, "pending") == 0) {
        printf(": placed, waiting for the memory of its victims:\n");
        size_t i;
        json_t *w;
        json_array_foreach(json_object_get(s, "waiting_for"), i, w)
        {
            dcmd_fmt_time(dcmd_geti(w, "deadline_unix_ms"), false, when, sizeof(when));
            dcmd_fmt_dur(dcmd_geti(w, "deadline_unix_ms") - now, in, sizeof(in));
            printf("  - %s of %s (deadline %s, in %s)\n", dcmd_gets(w, "action"),
                   dcmd_gets(w, "service"), when, in);
        }
    } else if (strcmp(st, "degraded") == 0) {
        printf(": running at its floor, %lld MiB instead of %lld, until its GPUs have had room "
               "for what it is expected to hold once restored (its predicted peak, %lld MiB, "
               "beside what its neighbours may still rise to) for the hysteresis window\n",
               (long long)dcmd_geti(s, "grant_mib"), (long long)dcmd_geti(s, "vram_mib"),
               (long long)dcmd_geti(json_object_get(s, "prediction"), "peak_mib"));
    } else if (strcmp(st, "draining") == 0) {
        dcmd_fmt_time(dcmd_geti(s, "deadline_unix_ms"), false, when, sizeof(when));
        printf(": evicted; its memory is counted until it exits (grace until %s)\n", when);
    } else if (strcmp(st, "overdue") == 0) {
        printf(": evicted and past its grace period; its memory is counted until it exits (a "
               "service waiting for it went back to the queue)\n");
    } else if (strcmp(st, "suspending") == 0 || strcmp(st, "suspended") == 0 ||
               strcmp(st, "resuming") == 0) {
        explain_suspend(s, st);
    } else if (strcmp(st, "loading") == 0) {
        printf(": started; until it reports ready (or its restart cost passes) it holds its "
               "whole grant of %lld MiB ('oversub ready %s' waits for it)\n",
               (long long)dcmd_geti(s, "grant_mib"), id);
    } else {
        printf(": holds %lld MiB, uses %lld MiB\n", (long long)dcmd_geti(s, "held_mib"),
               (long long)dcmd_geti(s, "used_mib"));
    }
    /* its prediction, and why its GPU was chosen */
    json_t *pr0 = json_object_get(s, "prediction");
    if (pr0 != NULL) {
        long long n = (long long)dcmd_geti(pr0, "reports");
        if (n == 0)
            printf("  predicted peak: %lld MiB, its request (no usage reported yet)\n",
                   (long long)dcmd_geti(pr0, "peak_mib"));
        else
            printf("  predicted peak: %lld MiB from %lld usage report(s) (request %lld MiB); an "
                   "admission now would count it as %lld MiB\n",
                   (long long)dcmd_geti(pr0, "peak_mib"), n, (long long)dcmd_geti(s, "vram_mib"),
                   (long long)dcmd_geti(pr0, "charge_mib"));
    }
    json_t *pb = json_object_get(s, "placed_because");
    json_t *place = json_object_get(s, "placement");
    if (pb != NULL && json_array_size(place) > 0) {
        bool tight = json_is_true(json_object_get(pb, "tightest_fit"));
        size_t np = json_array_size(place);
        char gl[256];
        dcmd_fmt_gpus(s, gl, sizeof(gl));
        printf("  placed on GPU%s %s: %s counted as %lld MiB, the projected peak %s was %lld of "
               "%lld MiB, %s\n",
               np > 1 ? "s" : "", gl, np > 1 ? "its share on each GPU" : "it was",
               (long long)dcmd_geti(pb, "charge_per_gpu_mib"),
               np > 1 ? "on the fullest of them" : "there",
               (long long)dcmd_geti(pb, "projected_peak_mib"),
               (long long)dcmd_geti(pb, "limit_mib"),
               tight ? "the tightest fit under that limit"
                     : "the GPU that overshot that limit least (none had room under it)");
    }
    /* a managed service: its process, and what eviction does to it */
    json_t *pr = json_object_get(s, "process");
    if (pr != NULL) {
        if (json_is_true(json_object_get(pr, "alive")))
            printf("  managed: process %lld", (long long)dcmd_geti(pr, "pid"));
        else
            printf("  managed: no process now");
        if (dcmd_geti(pr, "restarts") > 0)
            printf(", %lld restart(s)", (long long)dcmd_geti(pr, "restarts"));
        printf("; log %s (oversub logs %s)\n", dcmd_gets(pr, "log"), id);
        if (strcmp(st, "draining") == 0 || strcmp(st, "overdue") == 0)
            printf(
                "  it got SIGTERM when evicted; its process group gets SIGKILL at the deadline\n");
        if (strcmp(st, "queued") == 0 && dcmd_gets(s, "checkpoint")[0])
            printf("  it will be started again with OVERSUB_RESUME_FROM=%s\n",
                   dcmd_gets(s, "checkpoint"));
    }
    json_decref(s);
    return EX_OK;
}

/* ---- queue ----------------------------------------------------------------------------- */

/* Who waits: queued services in queue order (what they need, since when, resumed from what),
 * then pending ones with the victims they wait for and those victims' deadlines, then the
 * suspended ones and what brings each back (room, a request, or an operator's resume). */
int dcmd_queue(const struct args *a)
{
    (void)a;
    int ex;
    json_t *r = dcmd_call("GET", "/v1/services", NULL, &ex);
    if (r == NULL || ex) {
        json_decref(r);
        return ex;
    }
    json_t *queued = json_array(), *pending = json_array(), *suspended = json_array();
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(r, "services"), i, s)
    {
        if (strcmp(dcmd_gets(s, "state"), "queued") == 0) {
            /* in queue order */
            size_t at = 0;
            while (at < json_array_size(queued) &&
                   dcmd_geti(json_array_get(queued, at), "queue_position") <
                       dcmd_geti(s, "queue_position"))
                at++;
            json_array_insert(queued, at, s);
        } else if (strcmp(dcmd_gets(s, "state"), "pending") == 0) {
            json_array_append(pending, s);
        } else if (strcmp(dcmd_gets(s, "state"), "suspended") == 0) {
            json_array_append(suspended, s);
        }
    }
    if (dcmd_as_json) {
        json_t *o = json_pack("{s:O, s:O, s:O}", "queued", queued, "pending", pending, "suspended",
                              suspended);
        dcmd_print_json(o);
        json_decref(o);
        json_decref(queued);
        json_decref(pending);
        json_decref(suspended);
        json_decref(r);
        return EX_OK;
    }
    int64_t now = dcmd_now_unix_ms();
    if (json_array_size(queued) + json_array_size(pending) + json_array_size(suspended) == 0)
        printf("nobody waits\n");
    if (json_array_size(queued) > 0) {
        printf("%-4s %-24s %-10s %10s  %-25s %8s  %s\n", "POS", "SERVICE", "CLASS", "NEEDS",
               "WAITING SINCE", "FOR", "NOTE");
        json_array_foreach(queued, i, s)
        {
            char when[64], dur[32];
            dcmd_fmt_time(dcmd_geti(s, "since_unix_ms"), false, when, sizeof(when));
            dcmd_fmt_dur(now - dcmd_geti(s, "since_unix_ms"), dur, sizeof(dur));
            char note[200] = "";
            if (dcmd_geti(s, "evictions") > 0)
                snprintf(note, sizeof(note), "evicted %lld time(s)%s%s",
                         (long long)dcmd_geti(s, "evictions"),
                         dcmd_gets(s, "checkpoint")[0] ? "; resumes from " : "",
                         dcmd_gets(s, "checkpoint"));
            printf("%-4lld %-24s %-10s %6lld MiB  %-25s %8s  %s\n",
                   (long long)dcmd_geti(s, "queue_position"), dcmd_gets(s, "id"),
                   dcmd_gets(s, "class"), (long long)dcmd_geti(s, "vram_mib"), when, dur, note);
        }
    }
    json_array_foreach(pending, i, s)
    {
        printf("%s%s (%s, %lld MiB) is placed and waits for:\n",
               i == 0 && json_array_size(queued) ? "\n" : "", dcmd_gets(s, "id"),
               dcmd_gets(s, "class"), (long long)dcmd_geti(s, "vram_mib"));
        size_t k;
        json_t *w;
        json_array_foreach(json_object_get(s, "waiting_for"), k, w)
        {
            char dur[32];
            dcmd_fmt_dur(dcmd_geti(w, "deadline_unix_ms") - now, dur, sizeof(dur));
            printf("  the %s of %s (deadline in %s)\n", dcmd_gets(w, "action"),
                   dcmd_gets(w, "service"), dur);
        }
    }
    json_array_foreach(suspended, i, s)
    {
        char dur[32];
        dcmd_fmt_dur(now - dcmd_geti(s, "since_unix_ms"), dur, sizeof(dur));
        char why[200];
        if (json_is_true(json_object_get(s, "suspend_idle")))
            snprintf(why, sizeof(why), "idle: its next request through the gateway resumes it");
        else if (json_is_true(json_object_get(s, "suspend_held")))
            snprintf(why, sizeof(why), "by an operator: it stays so until 'oversub resume %s'",
                     dcmd_gets(s, "id"));
        else
            snprintf(why, sizeof(why), "preempted: it resumes on its GPUs when they have room");
        printf("%s%s (%s, %lld MiB) is suspended for %s; %s\n",
               i == 0 && json_array_size(queued) + json_array_size(pending) ? "\n" : "",
               dcmd_gets(s, "id"), dcmd_gets(s, "class"), (long long)dcmd_geti(s, "vram_mib"), dur,
               why);
    }
    json_decref(queued);
    json_decref(pending);
    json_decref(suspended);
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
int dcmd_logs(const struct args *a)
{
    const char *id = a->pos[0];
    if (dcmd_check_id(id) != 0)
        return EX_USAGE;
    long n = 20;
    if (dcmd_opt(a, "lines") != NULL &&
        dcmd_num_arg("--lines", dcmd_opt(a, "lines"), 0, 10000000, &n) != 0)
        return EX_USAGE;
    bool follow = dcmd_opt(a, "follow") != NULL;
    if (dcmd_as_json) {
        fprintf(stderr, "oversub logs: prints the service's own output; --json does not apply\n");
        return EX_USAGE;
    }
    char path[160];
    dcmd_svc_path(path, sizeof(path), id, "");
    int ex;
    json_t *r = dcmd_call("GET", path, NULL, &ex);
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
