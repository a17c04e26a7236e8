/* test_writer.c - the group-commit writer thread (src/daemon/writer.c) over a temporary state:
 * commands handed over come back from the store in order with their events, a ticket is on
 * disk once the writer's pipe says it is durable, a snapshot and meta go in the same
 * transaction, stop commits what is left, and a failed commit is reported and ends the work.
 * Every wait is on the writer's descriptor, never on a timer. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "store.h"
#include "writer.h"

static char dir[] = "/tmp/osub-writer-XXXXXX";
static char db[300];

static char *dup_s(const char *s)
{
    char *p = strdup(s);
    assert_non_null(p);
    return p;
}

/* A fresh state, made by a store as the loop makes it, then the writer on it. */
static osubd__writer_t *start(int64_t events_keep)
{
    unlink(db);
    char wal[320];
    snprintf(wal, sizeof(wal), "%s-wal", db);
    unlink(wal);
    snprintf(wal, sizeof(wal), "%s-shm", db);
    unlink(wal);
    osubd__store_t *s;
    char err[512];
    if (osubd__store_open(db, &s, err, sizeof(err)) != 0)
        fail_msg("open: %s", err);
    osubd__store_close(s);
    osubd__writer_t *w = NULL;
    if (osubd__writer_start(db, 0, events_keep, 0, &w, err, sizeof(err)) != 0)
        fail_msg("writer: %s", err);
    assert_non_null(w);
    assert_true(osubd__writer_fd(w) >= 0);
    return w;
}

/* Waits on the writer's pipe until ticket is durable (or the writer fails: the test fails). */
static void wait_durable(osubd__writer_t *w, uint64_t ticket, struct osubd__writer_progress *p)
{
    for (;;) {
        char err[600] = "";
        if (osubd__writer_progress(w, p, err, sizeof(err)) != 0)
            fail_msg("the writer failed: %s", err);
        if (p->durable >= ticket)
            return;
        struct pollfd pfd = {.fd = osubd__writer_fd(w), .events = POLLIN};
        int n = poll(&pfd, 1, 60000); /* a guard against a hang, not a timing */
        if (n == 0)
            fail_msg("no commit for 60 s (ticket %llu, durable %llu)", (unsigned long long)ticket,
                     (unsigned long long)p->durable);
        assert_true(n > 0 || errno == EINTR);
    }
}

/* Waits on the pipe until the writer reports a failure; its sentence goes to err. */
static void wait_failed(osubd__writer_t *w, char *err, size_t errlen)
{
    for (;;) {
        struct osubd__writer_progress p;
        err[0] = '\0';
        if (osubd__writer_progress(w, &p, err, errlen) != 0)
            return;
        struct pollfd pfd = {.fd = osubd__writer_fd(w), .events = POLLIN};
        if (poll(&pfd, 1, 60000) == 0)
            fail_msg("the writer did not fail within 60 s");
    }
}

static char *cmd_text(int i)
{
    char c[64];
    snprintf(c, sizeof(c), "{\"op\":\"tick\",\"n\":%d}", i);
    return dup_s(c);
}

static char **events_of(int i, size_t *n)
{
    *n = (size_t)(i % 4); /* 0 to 3 events */
    if (*n == 0)
        return NULL;
    char **ev = malloc(*n * sizeof(*ev));
    assert_non_null(ev);
    for (size_t k = 0; k < *n; k++) {
        char e[64];
        snprintf(e, sizeof(e), "{\"cmd\":%d,\"k\":%zu}", i, k);
        ev[k] = dup_s(e);
    }
    return ev;
}

struct readback {
    int base; /* the index of the first command expected */
    int n;
    int64_t first_seq, last_seq;
    bool in_order;
};

static int replay_cb(void *arg, int64_t seq, int64_t engine_ms, int64_t unix_ms, const char *cmd)
{
    struct readback *r = arg;
    int i = r->base + r->n;
    char want[64];
    snprintf(want, sizeof(want), "{\"op\":\"tick\",\"n\":%d}", i);
    if (strcmp(cmd, want) != 0 || engine_ms != 1000 + i || unix_ms != 1700000000000 + i ||
        (r->n > 0 && seq != r->last_seq + 1))
        r->in_order = false;
    if (r->n == 0)
        r->first_seq = seq;
    r->last_seq = seq;
    r->n++;
    return 0;
}

/* The log after upto, read by a connection of its own; base: the first command's index. */
static struct readback read_log(int64_t upto, int base)
{
    osubd__store_t *s;
    char err[512];
    if (osubd__store_open(db, &s, err, sizeof(err)) != 0)
        fail_msg("open: %s", err);
    struct readback r = {.base = base, .in_order = true};
    assert_int_equal(osubd__store_replay(s, upto, replay_cb, &r), 0);
    osubd__store_close(s);
    return r;
}

struct evback {
    int n;
    char last[64];
};

static int event_cb(void *arg, int64_t seq, const char *json)
{
    (void)seq;
    struct evback *e = arg;
    e->n++;
    snprintf(e->last, sizeof(e->last), "%s", json);
    return 0;
}

static struct evback read_events(void)
{
    osubd__store_t *s;
    char err[512];
    if (osubd__store_open(db, &s, err, sizeof(err)) != 0)
        fail_msg("open: %s", err);
    struct evback e = {0};
    assert_int_equal(osubd__store_events(s, 0, 100000, event_cb, &e), 0);
    osubd__store_close(s);
    return e;
}

static int marker_fd_seen = -1;
static char marker_id_seen[32];
static void marker(int fd, const char *id, int64_t seq)
{
    marker_fd_seen = fd;
    snprintf(marker_id_seen, sizeof(marker_id_seen), "%s", id);
    ssize_t w = write(fd, &seq, sizeof(seq));
    (void)w;
}

static void test_durable_in_order(void **state)
{
    (void)state;
    osubd__writer_t *w = start(100000);
    int mp[2];
    assert_int_equal(pipe(mp), 0);
    osubd__writer_set_marker(w, mp[1], "0123456789abcdefOVERFLOW", marker);
    enum { N = 300 };
    size_t n_events = 0;
    struct osubd__writer_progress p;
    for (int i = 0; i < N; i++) {
        size_t n;
        char **ev = events_of(i, &n);
        n_events += n;
        uint64_t t =
            osubd__writer_add(w, 1000 + i, 1700000000000 + i, cmd_text(i), ev, n, NULL, NULL);
        assert_int_equal(t, (uint64_t)i + 1); /* tickets count from 1, one each */
        if (i == 99) {
            /* durable means on disk: a second connection reads at least those */
            wait_durable(w, t, &p);
            assert_true(p.durable >= 100);
            struct readback r = read_log(0, 0);
            assert_true(r.n >= 100);
            assert_true(r.in_order);
        }
    }
    wait_durable(w, N, &p);
    assert_int_equal(p.durable, N);
    assert_int_equal(p.items, N);
    assert_true(p.commits >= 1 && p.commits <= N);
    assert_int_equal(p.last_log_seq, N); /* a fresh log: sequence numbers 1..N */
    assert_int_equal(p.last_event_seq, (int64_t)n_events);
    assert_false(p.full);
    /* the marker heard the last durable sequence, with the id cut to 16 characters */
    osubd__writer_set_marker(w, -1, "", NULL); /* no more markers: the pipe closes */
    int64_t seq = 0, got;
    close(mp[1]);
    while (read(mp[0], &got, sizeof(got)) == (ssize_t)sizeof(got))
        seq = got;
    close(mp[0]);
    assert_int_equal(seq, N);
    assert_int_equal(marker_fd_seen, mp[1]);
    assert_string_equal(marker_id_seen, "0123456789abcdef");
    struct osubd__writer_progress fin;
    memset(&fin, 0xff, sizeof(fin));
    assert_int_equal(osubd__writer_stop(w, &fin), 0);
    assert_int_equal(fin.durable, N);
    assert_int_equal(fin.last_log_seq, N);
    assert_int_equal(fin.items, N);
    struct readback r = read_log(0, 0);
    assert_int_equal(r.n, N);
    assert_true(r.in_order);
    assert_int_equal(r.first_seq, 1);
    struct evback e = read_events();
    assert_int_equal(e.n, (int)n_events);
    assert_string_equal(e.last, "{\"cmd\":299,\"k\":2}"); /* 299 % 4 = 3 events, the last k=2 */
    assert_int_equal(osubd__writer_stop(NULL, NULL), 0);
}

static void test_stop_commits_what_is_left(void **state)
{
    (void)state;
    osubd__writer_t *w = start(100000);
    enum { N = 500 };
    for (int i = 0; i < N; i++)
        osubd__writer_add(w, 1000 + i, 1700000000000 + i, cmd_text(i), NULL, 0, NULL, NULL);
    struct osubd__writer_progress p;
    assert_int_equal(osubd__writer_stop(w, &p), 0); /* no wait: stop itself commits */
    assert_int_equal(p.durable, N);
    assert_int_equal(p.items, N);
    struct readback r = read_log(0, 0);
    assert_int_equal(r.n, N);
    assert_true(r.in_order);
}

static void test_snapshot_meta_and_trim(void **state)
{
    (void)state;
    osubd__writer_t *w = start(5); /* keep the newest 5 events after a snapshot */
    struct osubd__writer_progress p;
    for (int i = 0; i < 10; i++) {
        size_t n;
        char **ev = events_of(3, &n); /* 3 events each */
        osubd__writer_add(w, 1000 + i, 1700000000000 + i, cmd_text(i), ev, n, NULL, NULL);
    }
    wait_durable(w, 10, &p);
    /* command 10 carries the snapshot of the engine after it, and two meta keys */
    uint64_t t = osubd__writer_add(w, 1010, 1700000000010, cmd_text(10), NULL, 0,
                                   dup_s("{\"engine\":\"after 11\"}"),
                                   dup_s("{\"pool\":\"2x81920\",\"gateway_routes\":\"{}\","
                                         "\"ignored\":5}"));
    for (int i = 11; i < 14; i++)
        t = osubd__writer_add(w, 1000 + i, 1700000000000 + i, cmd_text(i), NULL, 0, NULL, NULL);
    wait_durable(w, t, &p);
    assert_int_equal(p.last_log_seq, 14);
    assert_int_equal(osubd__writer_stop(w, NULL), 0);

    osubd__store_t *s;
    char err[512];
    assert_int_equal(osubd__store_open(db, &s, err, sizeof(err)), 0);
    char *snap = NULL, *v = NULL;
    int64_t upto = -1;
    assert_int_equal(osubd__store_load_snapshot(s, &snap, &upto), 0);
    assert_non_null(snap);
    assert_string_equal(snap, "{\"engine\":\"after 11\"}");
    assert_int_equal(upto, 11); /* the 11th command's sequence number */
    free(snap);
    assert_int_equal(osubd__store_meta_get(s, "pool", &v), 0);
    assert_string_equal(v, "2x81920");
    free(v);
    assert_int_equal(osubd__store_meta_get(s, "gateway_routes", &v), 0);
    assert_string_equal(v, "{}");
    free(v);
    assert_int_equal(osubd__store_meta_get(s, "ignored", &v), 0); /* not a string: not set */
    assert_null(v);
    int64_t last = 0;
    assert_int_equal(osubd__store_last_event(s, &last), 0);
    assert_int_equal(last, 30);
    osubd__store_close(s);
    /* the log after the snapshot: commands 12..14 */
    struct readback r = read_log(upto, 11);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.first_seq, 12);
    struct evback e = read_events();
    assert_int_equal(e.n, 5); /* trimmed to the newest 5 */
}

static void test_failed_commit_reported(void **state)
{
    (void)state;
    osubd__writer_t *w = start(100000);
    struct osubd__writer_progress p;
    for (int i = 0; i < 3; i++)
        osubd__writer_add(w, 1000 + i, 1700000000000 + i, cmd_text(i), NULL, 0, NULL, NULL);
    wait_durable(w, 3, &p);
    /* meta that is no JSON object: the transaction is rolled back, and the writer stops */
    osubd__writer_add(w, 1003, 1700000000003, cmd_text(3), NULL, 0, NULL, dup_s("[not, meta"));
    char err[600];
    wait_failed(w, err, sizeof(err));
    /* what comes after is not committed either: commands stay in order or not at all */
    osubd__writer_add(w, 1004, 1700000000004, cmd_text(4), NULL, 0, NULL, NULL);
    struct osubd__writer_progress fin;
    assert_int_equal(osubd__writer_stop(w, &fin), -1);
    assert_int_equal(fin.durable, 3);
    assert_int_equal(fin.last_log_seq, 3);
    struct readback r = read_log(0, 0);
    assert_int_equal(r.n, 3);
    assert_true(r.in_order);
}

static void test_start_refused(void **state)
{
    (void)state;
    char err[512] = "";
    osubd__writer_t *w = (osubd__writer_t *)&w;
    assert_int_equal(
        osubd__writer_start("/nonexistent/dir/state.db", 0, 10, 0, &w, err, sizeof(err)), -1);
    assert_true(err[0] != '\0');
    /* a file that is not a database */
    char path[400];
    snprintf(path, sizeof(path), "%s/text.db", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("not a database, somebody's notes\n", f);
    fclose(f);
    err[0] = '\0';
    assert_int_equal(osubd__writer_start(path, 0, 10, 0, &w, err, sizeof(err)), -1);
    assert_true(err[0] != '\0');
}

static int setup(void **state)
{
    (void)state;
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(db, sizeof(db), "%s/state.db", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_durable_in_order),
        cmocka_unit_test(test_stop_commits_what_is_left),
        cmocka_unit_test(test_snapshot_meta_and_trim),
        cmocka_unit_test(test_failed_commit_reported),
        cmocka_unit_test(test_start_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
