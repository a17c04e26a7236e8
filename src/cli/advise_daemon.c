/* advise_daemon.c - oversub advise --from-daemon: the brief's rule (start at 1.3x; fewer than
 * 5 preemptions a week, degrades and evictions both counted, over a whole week: step up towards
 * 1.5-1.8x) applied to a running daemon's decision log. */
#define _POSIX_C_SOURCE 200809L
#include "advise_daemon.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "http.h"

static json_t *get(const struct http_target *t, const char *path, int *ex)
{
    struct http_resp r;
    char err[400];
    if (http_request(t, "GET", path, NULL, &r, err, sizeof(err)) != 0) {
        fprintf(stderr,
                "oversub advise: %s\n  is oversubd running? point --url / OVERSUB_URL at it\n",
                err);
        *ex = 3;
        return NULL;
    }
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    if (r.status != 200 || j == NULL) {
        fprintf(stderr, "oversub advise: GET %s answered %d\n", path, r.status);
        json_decref(j);
        j = NULL;
        *ex = 1;
    }
    http_resp_free(&r);
    return j;
}

int cli_advise_daemon(int argc, char **argv)
{
    const char *url = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--from-daemon") == 0)
            continue;
        if (strcmp(argv[i], "--url") == 0 && i + 1 < argc)
            url = argv[++i];
        else if (strncmp(argv[i], "--url=", 6) == 0)
            url = argv[i] + 6;
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else {
            fprintf(stderr,
                    "oversub advise --from-daemon: unknown argument '%s'\n\n"
                    "usage: oversub advise --from-daemon [--url URL] [--json]\n"
                    "(see 'oversub advise --help')\n",
                    argv[i]);
            return 2;
        }
    }
    struct http_target t;
    char err[300];
    if (http_target_init(&t, url, err, sizeof(err)) != 0) {
        fprintf(stderr, "oversub advise: --url: %s\n", err);
        return 2;
    }
    int ex = 0;
    json_t *pool = get(&t, "/v1/pool", &ex);
    if (pool == NULL)
        return ex;
    double ratio = json_real_value(json_object_get(pool, "ratio"));
    int32_t now_milli = (int32_t)(ratio * 1000.0 + 0.5);
    json_decref(pool);

    /* the whole decision log, a page at a time */
    long long since = 0, first_ms = 0, last_ms = 0, degrades = 0, evictions = 0, n_events = 0;
    for (;;) {
        char path[96];
        snprintf(path, sizeof(path), "/v1/events?since=%lld", since);
        json_t *page = get(&t, path, &ex);
        if (page == NULL)
            return ex;
        json_t *evs = json_object_get(page, "events");
        size_t n = json_array_size(evs);
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(evs, i);
            const char *kind = json_string_value(json_object_get(e, "kind"));
            long long ms = (long long)json_integer_value(json_object_get(e, "time_unix_ms"));
            if (first_ms == 0 || (ms > 0 && ms < first_ms))
                first_ms = ms;
            if (ms > last_ms)
                last_ms = ms;
            n_events++;
            if (kind != NULL && strcmp(kind, "degrade") == 0)
                degrades++;
            else if (kind != NULL && strcmp(kind, "evict") == 0)
                evictions++;
        }
        since = (long long)json_integer_value(json_object_get(page, "next"));
        json_decref(page);
        if (n == 0)
            break;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now_ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    double days = first_ms > 0 ? (double)(now_ms - first_ms) / 86400000.0 : 0.0;
    double per_week = days > 0 ? (double)(degrades + evictions) * 7.0 / days : 0.0;

    /* the rule: below 5 a week, one step (0.1) up, towards 1.8 at most */
    int32_t rec = now_milli;
    const char *why;
    if (n_events == 0) {
        why = "the daemon has no decisions yet: nothing to judge by";
    } else if (per_week >= 5.0) {
        why = "5 or more preemptions a week: keep the ratio (do not step up)";
    } else if (now_milli >= 1800) {
        why = "fewer than 5 preemptions a week, but 1.8x is the top of the brief's range";
    } else {
        rec = now_milli < 1300 ? 1300 : now_milli + 100;
        if (rec > 1800)
            rec = 1800;
        why = "fewer than 5 preemptions a week: step up";
    }
    json_t *caveats = json_array();
    if (days < 7.0)
        json_array_append_new(
            caveats, json_sprintf("the decision log covers %.2f days, less than a week: the brief "
                                  "asks for a whole business cycle including a weekend; the rate "
                                  "is prorated",
                                  days));
    json_array_append_new(caveats,
                          json_string("events older than the daemon's retention (events_keep, "
                                      "events_days) are not counted"));

    if (json) {
        json_t *o = json_pack("{s:s, s:f, s:f, s:f, s:I, s:I, s:f, s:f, s:s, s:s, s:o}", "source",
                              "daemon", "ratio_now", now_milli / 1000.0, "history_days", days,
                              "history_start_unix_ms", (double)first_ms, "degrades",
                              (json_int_t)degrades, "evictions", (json_int_t)evictions,
                              "preemptions_per_week", per_week, "recommended_ratio", rec / 1000.0,
                              "by", "brief_rule", "why", why, "caveats", caveats);
        json_dumpf(o, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(o);
        return 0;
    }
    printf("oversub advise --from-daemon: the brief's rule on the daemon's decision log\n\n");
    printf("  ratio now              %d.%02dx\n", now_milli / 1000, (now_milli % 1000) / 10);
    printf("  history                %.2f days (%lld events)\n", days, n_events);
    printf("  degrades               %lld\n", degrades);
    printf("  evictions              %lld\n", evictions);
    printf("  preemptions a week     %.1f (degrades and evictions, prorated)\n", per_week);
    printf("\nrecommendation: %d.%02dx (%s)\n", rec / 1000, (rec % 1000) / 10, why);
    printf("\ncaveats:\n");
    size_t i;
    json_t *c;
    json_array_foreach(caveats, i, c) printf("  - %s\n", json_string_value(c));
    printf("  - for a what-if sweep and a risk bound on recorded usage, run 'oversub advise' on "
           "a usage trace\n");
    json_decref(caveats);
    return 0;
}
