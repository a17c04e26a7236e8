/* test_state.c - the state on disk around the store (state.h): one oversubd per state (the
 * lock), the marker that tells an emptied, replaced or shortened database, the service key and
 * the tokens made from it, the engine settings a state was made with, the replay of its log */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"
#include "state.h"
#include "store.h"

struct fixture {
    char dir[64];
    char path[128]; /* DIR/state.db */
    char marker[160];
    osubd__store_t *st;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/osubd-state-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/state.db", f->dir);
    snprintf(f->marker, sizeof(f->marker), "%s.marker", f->path);
    *state = f;
    return 0;
}

/* Removes the state's files (the store closed first). */
static void reset(struct fixture *f)
{
    osubd__store_close(f->st);
    f->st = NULL;
    static const char *const tails[] = {"", "-wal", "-shm", ".lock", ".marker"};
    for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++) {
        char p[200];
        snprintf(p, sizeof(p), "%s%s", f->path, tails[i]);
        unlink(p);
    }
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    reset(f);
    rmdir(f->dir);
    free(f);
    return 0;
}

static void open_store(struct fixture *f)
{
    char err[600] = "";
    assert_int_equal(osubd__store_open(f->path, &f->st, err, sizeof(err)), 0);
}

static void write_marker(const struct fixture *f, const char *text)
{
    FILE *m = fopen(f->marker, "w");
    assert_non_null(m);
    fputs(text, m);
    fclose(m);
}

static char *read_marker(const struct fixture *f)
{
    static char buf[128];
    FILE *m = fopen(f->marker, "r");
    assert_non_null(m);
    size_t n = fread(buf, 1, sizeof(buf) - 1, m);
    fclose(m);
    buf[n] = '\0';
    return buf;
}

static void key_of(uint8_t key[32], uint8_t v)
{
    for (int i = 0; i < 32; i++)
        key[i] = (uint8_t)(v + i);
}

/* ---- the lock ------------------------------------------------------------------------------ */

static void test_lock_second_refused(void **state)
{
    struct fixture *f = *state;
    int fd1 = -1, fd2 = 7;
    char err[600] = "";
    assert_int_equal(osubd_state_lock(f->path, &fd1, err, sizeof(err)), 0);
    assert_true(fd1 >= 0);
    assert_int_equal(osubd_state_lock(f->path, &fd2, err, sizeof(err)), -1);
    assert_int_equal(fd2, -1);
    assert_non_null(strstr(err, "another oversubd runs on this state"));
    assert_non_null(strstr(err, f->path));
    close(fd1); /* the lock goes with the descriptor */
    assert_int_equal(osubd_state_lock(f->path, &fd2, err, sizeof(err)), 0);
    close(fd2);
}

static void test_lock_folder_missing(void **state)
{
    struct fixture *f = *state;
    char p[200];
    snprintf(p, sizeof(p), "%s/no/such/state.db", f->dir);
    int fd = 7;
    char err[600] = "";
    assert_int_equal(osubd_state_lock(p, &fd, err, sizeof(err)), -1);
    assert_int_equal(fd, -1);
    assert_non_null(strstr(err, "No such file"));
}

/* ---- the marker ---------------------------------------------------------------------------- */

static void test_marker_early_empty_state_with_commands_refused(void **state)
{
    struct fixture *f = *state;
    write_marker(f, "oversub-state 1 0123456789abcdef 5\n");
    char err[600] = "";
    assert_int_equal(
        osubd_state_marker(f->path, false, false, true, NULL, 0, NULL, NULL, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "is empty, but"));
    assert_non_null(strstr(err, "held 5 command(s)"));
    assert_non_null(strstr(err, "--new-state"));
    /* --new-state takes it */
    assert_int_equal(
        osubd_state_marker(f->path, true, false, true, NULL, 0, NULL, NULL, err, sizeof(err)), 0);
}

static void test_marker_early_passes(void **state)
{
    struct fixture *f = *state;
    char err[600] = "";
    /* no marker; a marker at 0 commands; a damaged marker; an existing state (checked later) */
    assert_int_equal(
        osubd_state_marker(f->path, false, false, true, NULL, 0, NULL, NULL, err, sizeof(err)), 0);
    write_marker(f, "oversub-state 1 0123456789abcdef 0\n");
    assert_int_equal(
        osubd_state_marker(f->path, false, false, true, NULL, 0, NULL, NULL, err, sizeof(err)), 0);
    write_marker(f, "garbage");
    assert_int_equal(
        osubd_state_marker(f->path, false, false, true, NULL, 0, NULL, NULL, err, sizeof(err)), 0);
    write_marker(f, "oversub-state 1 0123456789abcdef 9\n");
    assert_int_equal(
        osubd_state_marker(f->path, false, true, true, NULL, 0, NULL, NULL, err, sizeof(err)), 0);
}

/* A marker for key k1 at 3 commands, as a run that wrote 3 commands leaves it. */
static void marker_at_3(struct fixture *f, const uint8_t k1[32], char id[17])
{
    int fd = -1;
    char err[600] = "";
    assert_int_equal(
        osubd_state_marker(f->path, false, false, false, k1, 3, &fd, id, err, sizeof(err)), 0);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(strlen(id), 16);
    char want[64];
    snprintf(want, sizeof(want), "oversub-state 1 %s 3 ", id);
    char *m = read_marker(f);
    assert_memory_equal(m, want, strlen(want));
    assert_int_equal(strlen(m), 64); /* one 64-byte record, ending in a newline */
    assert_int_equal(m[63], '\n');
}

static void test_marker_replaced_database_refused(void **state)
{
    struct fixture *f = *state;
    uint8_t k1[32], k2[32];
    key_of(k1, 1);
    key_of(k2, 2);
    char id[17], id2[17];
    marker_at_3(f, k1, id);
    int fd = -1;
    char err[600] = "";
    assert_int_equal(
        osubd_state_marker(f->path, false, true, false, k2, 3, &fd, id2, err, sizeof(err)), -1);
    assert_int_equal(fd, -1);
    assert_non_null(strstr(err, "the database was replaced"));
    assert_non_null(strstr(err, id));
    /* --new-state takes the database that is there, and the marker becomes its own */
    assert_int_equal(
        osubd_state_marker(f->path, true, true, false, k2, 3, &fd, id2, err, sizeof(err)), 0);
    close(fd);
    assert_string_not_equal(id, id2);
    assert_non_null(strstr(read_marker(f), id2));
}

static void test_marker_shortened_log_refused(void **state)
{
    struct fixture *f = *state;
    uint8_t k1[32];
    key_of(k1, 1);
    char id[17], id2[17];
    marker_at_3(f, k1, id);
    int fd = -1;
    char err[600] = "";
    assert_int_equal(
        osubd_state_marker(f->path, false, true, false, k1, 2, &fd, id2, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "ends at command 2"));
    assert_non_null(strstr(err, "the last 1 are lost"));
    /* as far as the marker, or further (the marker may lag), passes */
    for (int64_t seq = 3; seq <= 4; seq++) {
        assert_int_equal(
            osubd_state_marker(f->path, false, true, false, k1, seq, &fd, id2, err, sizeof(err)),
            0);
        close(fd);
        assert_string_equal(id, id2);
    }
    /* --new-state goes on from what is there */
    assert_int_equal(
        osubd_state_marker(f->path, true, true, false, k1, 1, &fd, id2, err, sizeof(err)), 0);
    close(fd);
    char want[64];
    snprintf(want, sizeof(want), "oversub-state 1 %s 1 ", id);
    assert_memory_equal(read_marker(f), want, strlen(want));
}

static void test_marker_damaged_written_anew(void **state)
{
    struct fixture *f = *state;
    uint8_t k1[32];
    key_of(k1, 1);
    write_marker(f, "not a marker at all");
    int fd = -1;
    char id[17], err[600] = "";
    FILE *quiet = tmpfile();
    osubd_log_set_stream(quiet); /* the warning it gives */
    int rc = osubd_state_marker(f->path, false, true, false, k1, 7, &fd, id, err, sizeof(err));
    osubd_log_set_stream(NULL);
    assert_int_equal(rc, 0);
    close(fd);
    char want[64];
    snprintf(want, sizeof(want), "oversub-state 1 %s 7 ", id);
    assert_memory_equal(read_marker(f), want, strlen(want));
    rewind(quiet);
    char line[300] = "";
    assert_non_null(fgets(line, sizeof(line), quiet));
    assert_non_null(strstr(line, "warning: "));
    fclose(quiet);
}

/* ---- the service key and tokens ------------------------------------------------------------ */

static void test_key_made_for_new_state_and_kept(void **state)
{
    struct fixture *f = *state;
    open_store(f);
    uint8_t k[32], again[32];
    char err[600] = "";
    assert_int_equal(osubd_state_key(f->st, f->path, false, k, err, sizeof(err)), 0);
    char *hex = NULL;
    assert_int_equal(osubd_state_meta(f->st, f->path, "service_key", &hex, err, sizeof(err)), 0);
    assert_non_null(hex);
    assert_int_equal(strlen(hex), 64);
    assert_int_equal(strspn(hex, "0123456789abcdef"), 64);
    free(hex);
    /* the same state started again reads the same key */
    assert_int_equal(osubd_state_key(f->st, f->path, true, again, err, sizeof(err)), 0);
    assert_memory_equal(k, again, 32);
}

static void test_key_missing_from_existing_state_refused(void **state)
{
    struct fixture *f = *state;
    open_store(f);
    uint8_t k[32];
    char err[600] = "";
    assert_int_equal(osubd_state_key(f->st, f->path, true, k, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "has no service key"));
    char *hex = NULL;
    osubd_state_meta(f->st, f->path, "service_key", &hex, err, sizeof(err));
    assert_null(hex); /* none made in its place */
}

static void test_key_damaged_refused(void **state)
{
    struct fixture *f = *state;
    open_store(f);
    char not_hex[65]; /* 64 characters, the first two no hex digits */
    memset(not_hex, '0', 64);
    not_hex[0] = not_hex[1] = 'z';
    not_hex[64] = '\0';
    char too_long[66];
    memset(too_long, 'a', 65);
    too_long[65] = '\0';
    const char *const bad[] = {"abcd", "", not_hex, too_long};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(osubd__store_meta_set(f->st, "service_key", bad[i]), 0);
        uint8_t k[32];
        char err[600] = "";
        assert_int_equal(osubd_state_key(f->st, f->path, true, k, err, sizeof(err)), -1);
        assert_non_null(strstr(err, "service key is damaged"));
    }
}

static void test_token_deterministic_per_id(void **state)
{
    (void)state;
    uint8_t k1[32], k2[32];
    key_of(k1, 1);
    key_of(k2, 2);
    char a[65], a2[65], b[65], ak2[65];
    osubd_state_token(k1, "svc-a", a);
    osubd_state_token(k1, "svc-a", a2);
    osubd_state_token(k1, "svc-b", b);
    osubd_state_token(k2, "svc-a", ak2);
    assert_string_equal(a, a2);
    assert_string_not_equal(a, b);
    assert_string_not_equal(a, ak2);
    assert_int_equal(strlen(a), 64);
    assert_int_equal(strspn(a, "0123456789abcdef"), 64);
}

/* ---- the engine settings ------------------------------------------------------------------- */

static void test_engine_config_round_trip(void **state)
{
    struct fixture *f = *state;
    open_store(f);
    osub_pool_config_t c;
    osub_pool_config_default(&c);
    c.ratio_milli = 1700;
    c.compute_ratio_milli = 1100;
    c.margin_mib = 2048;
    c.high_watermark_pct = 91;
    c.low_watermark_pct = 77;
    c.hysteresis_ms = 1234;
    c.ack_timeout_ms = 4321;
    c.grace_ms = 999;
    c.min_runtime_ms = 5555;
    c.history_window_ms = 66666;
    c.restart_cost_ms = 777;
    c.queue_aging_ms = 8888;
    c.prediction_trust_ms = 31000;
    c.floor_start_after_ms = 42000;
    assert_int_equal(osubd__store_meta_set(f->st, "engine_config", osubd_state_engine_text(&c)), 0);
    osub_pool_config_t out;
    char err[600] = "";
    /* the ratio given now does not override the one the state was made with */
    assert_int_equal(osubd_state_engine_config(f->st, f->path, 1300, false, &out, err, sizeof(err)),
                     0);
    assert_int_equal(out.ratio_milli, 1700);
    assert_int_equal(out.compute_ratio_milli, 1100);
    assert_int_equal(out.margin_mib, 2048);
    assert_int_equal(out.high_watermark_pct, 91);
    assert_int_equal(out.low_watermark_pct, 77);
    assert_int_equal(out.hysteresis_ms, 1234);
    assert_int_equal(out.ack_timeout_ms, 4321);
    assert_int_equal(out.grace_ms, 999);
    assert_int_equal(out.min_runtime_ms, 5555);
    assert_int_equal(out.history_window_ms, 66666);
    assert_int_equal(out.restart_cost_ms, 777);
    assert_int_equal(out.queue_aging_ms, 8888);
    assert_int_equal(out.prediction_trust_ms, 31000);
    assert_int_equal(out.floor_start_after_ms, 42000);
    assert_string_equal(osubd_state_engine_text(&out), osubd_state_engine_text(&c));
}

static void test_engine_config_absent_and_old(void **state)
{
    struct fixture *f = *state;
    open_store(f);
    osub_pool_config_t def, out;
    osub_pool_config_default(&def);
    char err[600] = "";
    /* a state from before the settings were kept: the defaults, the ratio given, and the
     * driver's margin under NVML */
    assert_int_equal(osubd_state_engine_config(f->st, f->path, 1450, false, &out, err, sizeof(err)),
                     0);
    assert_int_equal(out.ratio_milli, 1450);
    assert_int_equal(out.margin_mib, def.margin_mib);
    assert_int_equal(osubd_state_engine_config(f->st, f->path, 1450, true, &out, err, sizeof(err)),
                     0);
    assert_int_equal(out.margin_mib, 1024);
    /* 12 values: a state made before the predictor keeps the predictor's defaults */
    assert_int_equal(osubd__store_meta_set(f->st, "engine_config",
                                           "1600 1000 0 90 80 1000 2000 3000 4000 5000 6000 7000"),
                     0);
    assert_int_equal(osubd_state_engine_config(f->st, f->path, 1300, false, &out, err, sizeof(err)),
                     0);
    assert_int_equal(out.ratio_milli, 1600);
    assert_int_equal(out.queue_aging_ms, 7000);
    assert_int_equal(out.prediction_trust_ms, def.prediction_trust_ms);
    assert_int_equal(out.floor_start_after_ms, def.floor_start_after_ms);
}

static void test_engine_config_damaged_refused(void **state)
{
    struct fixture *f = *state;
    open_store(f);
    static const char *const bad[] = {"", "1300 1000 0", "garbage",
                                      "1 2 3 4 5 6 7 8 9 10 11 12 13" /* 13 values */};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(osubd__store_meta_set(f->st, "engine_config", bad[i]), 0);
        osub_pool_config_t out;
        char err[600] = "";
        assert_int_equal(
            osubd_state_engine_config(f->st, f->path, 1300, false, &out, err, sizeof(err)), -1);
        assert_non_null(strstr(err, "engine settings are damaged"));
    }
}

/* ---- the replay ---------------------------------------------------------------------------- */

static osub_engine_t *engine(void)
{
    osub_pool_config_t c;
    osub_pool_config_default(&c);
    int64_t vram[2] = {81920, 81920};
    osub_engine_t *e = NULL;
    assert_int_equal(osub_engine_new(&c, vram, NULL, 2, NULL, 0, &e), 0);
    return e;
}

static void append(struct fixture *f, int64_t ms, const char *cmd, int64_t want_seq)
{
    int64_t seq = 0;
    assert_int_equal(osubd__store_append(f->st, ms, ms, cmd, &seq), 0);
    assert_int_equal(seq, want_seq);
}

static const char sub_a[] = "{\"op\":\"submit\",\"spec\":{\"id\":\"a\",\"class\":\"batch\","
                            "\"vram_mib\":10000}}";
static const char sub_b[] = "{\"op\":\"submit\",\"spec\":{\"id\":\"b\",\"class\":\"batch\","
                            "\"vram_mib\":20000}}";

static void test_replay_in_order(void **state)
{
    struct fixture *f = *state;
    open_store(f);
    append(f, 100, sub_a, 1);
    append(f, 200, sub_b, 2);
    append(f, 300, "{\"op\":\"release\",\"id\":\"nobody\"}", 3); /* refused, logged: replays */
    append(f, 400, "{\"op\":\"release\",\"id\":\"a\"}", 4);
    osub_engine_t *e = engine();
    struct osubd_replayed r;
    char err[600] = "";
    assert_int_equal(osubd_state_replay(f->st, e, 0, &r, err, sizeof(err)), 0);
    assert_int_equal(r.n, 4);
    assert_int_equal(r.last_seq, 4);
    assert_int_equal(r.last_ms, 400);
    osub_service_info_t si;
    assert_int_not_equal(osub_engine_service_info(e, "a", &si), 0);
    assert_int_equal(osub_engine_service_info(e, "b", &si), 0);
    assert_int_equal(si.grant_mib, 20000);
    osub_engine_free(e);
    /* nothing after the snapshot: last_seq is the snapshot's */
    e = engine();
    assert_int_equal(osubd_state_replay(f->st, e, 4, &r, err, sizeof(err)), 0);
    assert_int_equal(r.n, 0);
    assert_int_equal(r.last_seq, 4);
    osub_engine_free(e);
}

static void test_replay_gap_refused(void **state)
{
    struct fixture *f = *state;
    open_store(f);
    append(f, 100, sub_a, 1);
    append(f, 200, sub_b, 2);
    append(f, 300, "{\"op\":\"tick\"}", 3);
    /* a snapshot at 2 drops commands 1 and 2 from the log */
    osub_engine_t *e = engine();
    char *snap = osub_engine_save(e);
    assert_non_null(snap);
    assert_int_equal(osubd__store_snapshot(f->st, snap, 2), 0);
    free(snap);
    struct osubd_replayed r;
    char err[600] = "";
    /* replayed as if there were no snapshot: 1 and 2 are missing */
    assert_int_equal(osubd_state_replay(f->st, e, 0, &r, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "misses commands 1 to 2"));
    /* from the snapshot it goes on */
    assert_int_equal(osubd_state_replay(f->st, e, 2, &r, err, sizeof(err)), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.last_seq, 3);
    osub_engine_free(e);
}

static void test_replay_malformed_refused(void **state)
{
    static const struct {
        const char *cmd;
        const char *why;
    } cases[] = {
        {"{\"op\":\"explode\"}", "command 2 in the log is not one"},
        {"{\"op\":\"release\"}", "command 2 in the log is not one"},
        {"{\"op\":\"submit\",\"spec\":{\"class\":\"batch\"}}", "command 2 in the log is not one"},
        {"not json", "command 2 in the log is not JSON"},
    };
    struct fixture *f = *state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        reset(f); /* a fresh state per case */
        open_store(f);
        append(f, 100, sub_a, 1);
        append(f, 200, cases[i].cmd, 2);
        append(f, 300, sub_b, 3);
        osub_engine_t *e = engine();
        struct osubd_replayed r;
        char err[600] = "";
        assert_int_equal(osubd_state_replay(f->st, e, 0, &r, err, sizeof(err)), -1);
        if (strstr(err, cases[i].why) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, err, cases[i].why);
        osub_engine_free(e);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lock_second_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_folder_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_marker_early_empty_state_with_commands_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_marker_early_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_marker_replaced_database_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_marker_shortened_log_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_marker_damaged_written_anew, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_made_for_new_state_and_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_missing_from_existing_state_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_key_damaged_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_token_deterministic_per_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_config_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_config_absent_and_old, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_config_damaged_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_gap_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_malformed_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
