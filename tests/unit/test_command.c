/* test_command.c - engine commands as JSON (src/daemon/command.c): a malformed command (no op,
 * an unknown one, arguments missing or of the wrong type or range) is refused with a sentence
 * and leaves the engine exactly as it was, clock included; good ones do what they say */
#include "command.h"
#include "helpers.h"

static json_t *js(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    if (j == NULL)
        fail_msg("bad JSON in the test: %s: %s", text, je.text);
    return j;
}

/* Applies text at now_ms; the command itself is only borrowed (it is the same after). */
static int apply(osub_engine_t *e, const char *text, int64_t now_ms, osub_submit_result_t *res,
                 char *err, size_t errlen)
{
    json_t *c = js(text);
    char *before = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    err[0] = '\0';
    int rc = osubd__cmd_apply(e, c, now_ms, res, err, errlen);
    char *after = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    assert_string_equal(before, after);
    free(before);
    free(after);
    json_decref(c);
    return rc;
}

static osub_engine_t *with_one_service(void)
{
    osub_engine_t *e = mk_engine(2, 81920, 1300);
    char err[256];
    osub_submit_result_t res;
    assert_int_equal(
        apply(e,
              "{\"op\": \"submit\", \"spec\": {\"id\": \"chat\", \"class\": \"online\","
              " \"vram_mib\": 20000}}",
              1000, &res, err, sizeof(err)),
        0);
    assert_int_equal(res.outcome, OSUB_SUBMIT_STARTED);
    return e;
}

static void test_malformed_refused(void **state)
{
    (void)state;
    char gpus65[600] = "{\"op\": \"usage\", \"id\": \"chat\", \"gpus\": [";
    for (int i = 0; i < 65; i++)
        strcat(gpus65, i ? ",1" : "1");
    strcat(gpus65, "]}");
    const char *const bad[] = {
        /* not a command at all */
        "[]",
        "\"submit\"",
        "42",
        "null",
        "{}",
        "{\"id\": \"chat\"}",
        /* op of the wrong type, or unknown */
        "{\"op\": 5}",
        "{\"op\": null}",
        "{\"op\": true}",
        "{\"op\": [\"tick\"]}",
        "{\"op\": {\"name\": \"tick\"}}",
        "{\"op\": \"\"}",
        "{\"op\": \"frobnicate\"}",
        "{\"op\": \"SUBMIT\"}",
        "{\"op\": \"tick \"}",
        /* submit */
        "{\"op\": \"submit\"}",
        "{\"op\": \"submit\", \"spec\": null}",
        "{\"op\": \"submit\", \"spec\": \"chat\"}",
        "{\"op\": \"submit\", \"spec\": []}",
        "{\"op\": \"submit\", \"spec\": {}}",
        "{\"op\": \"submit\", \"spec\": {\"id\": \"b\"}}",
        "{\"op\": \"submit\", \"spec\": {\"id\": 7, \"vram_mib\": 100}}",
        "{\"op\": \"submit\", \"spec\": {\"id\": \"b\", \"vram_mib\": \"lots\"}}",
        "{\"op\": \"submit\", \"spec\": {\"id\": \"b\", \"vram_mib\": 100, \"colour\": 1}}",
        "{\"op\": \"submit\", \"spec\": {\"id\": \"b\", \"vram_mib\": 100, \"exclusive\": 1}}",
        /* an id where one is needed */
        "{\"op\": \"release\"}",
        "{\"op\": \"release\", \"id\": 5}",
        "{\"op\": \"ready\", \"id\": null}",
        "{\"op\": \"ack\", \"id\": [\"chat\"]}",
        "{\"op\": \"exited\"}",
        "{\"op\": \"fail\", \"id\": {}}",
        "{\"op\": \"usage\", \"vram_mib\": 5}",
        "{\"op\": \"resize\", \"vram_mib\": 5}",
        /* resize */
        "{\"op\": \"resize\", \"id\": \"chat\", \"vram_mib\": \"30000\"}",
        "{\"op\": \"resize\", \"id\": \"chat\", \"vram_mib\": 3.5}",
        "{\"op\": \"resize\", \"id\": \"chat\", \"min_vram_mib\": true}",
        "{\"op\": \"resize\", \"id\": \"chat\", \"batch_size\": -1}",
        "{\"op\": \"resize\", \"id\": \"chat\", \"batch_size\": 2147483648}",
        "{\"op\": \"resize\", \"id\": \"chat\", \"batch_size\": null}",
        /* usage */
        "{\"op\": \"usage\", \"id\": \"chat\"}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"vram_mib\": \"1\"}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"vram_mib\": 1.0}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"gpus\": []}",
        gpus65,
        "{\"op\": \"usage\", \"id\": \"chat\", \"gpus\": [\"1\"]}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"gpus\": [1, 2.5]}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"gpus\": [null]}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"vram_mib\": 5, \"compute_pct\": 101}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"vram_mib\": 5, \"compute_pct\": -1}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"vram_mib\": 5, \"compute_pct\": \"50\"}",
        "{\"op\": \"usage\", \"id\": \"chat\", \"vram_mib\": 5, \"compute_pct\": null}",
        /* pool-wide */
        "{\"op\": \"ratio\"}",
        "{\"op\": \"ratio\", \"ratio_milli\": \"1300\"}",
        "{\"op\": \"ratio\", \"ratio_milli\": 1.3}",
        "{\"op\": \"ratio\", \"ratio_milli\": -1}",
        "{\"op\": \"ratio\", \"ratio_milli\": 2147483648}",
        "{\"op\": \"system\", \"vram_mib\": 5}",
        "{\"op\": \"system\", \"gpu\": \"0\", \"vram_mib\": 5}",
        "{\"op\": \"system\", \"gpu\": 0}",
        "{\"op\": \"system\", \"gpu\": 0, \"vram_mib\": \"5\"}",
        "{\"op\": \"system\", \"gpu\": 2147483648, \"vram_mib\": 5}",
        "{\"op\": \"system\", \"gpu\": -2147483649, \"vram_mib\": 5}",
        "{\"op\": \"cordon\"}",
        "{\"op\": \"cordon\", \"gpu\": 0.0}",
        "{\"op\": \"drain\", \"gpu\": true}",
        "{\"op\": \"lost\", \"gpu\": [0]}",
        "{\"op\": \"lost\", \"gpu\": 1e2}",
    };
    osub_engine_t *e = with_one_service();
    char *before = osub_engine_dump(e);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256];
        osub_submit_result_t res;
        int rc = apply(e, bad[i], 5000, &res, err, sizeof(err));
        if (rc != OSUB_EINVAL)
            fail_msg("%s: %s, not refused as malformed", bad[i], osub_strerror(rc));
        if (strncmp(err, "command '", 9) != 0)
            fail_msg("%s: the error is not a sentence about the command: '%s'", bad[i], err);
        assert_true(strlen(err) > strlen("command '': "));
        char *after = osub_engine_dump(e);
        if (strcmp(before, after) != 0)
            fail_msg("%s: the engine changed", bad[i]);
        free(after);
    }
    check_ok(e);
    free(before);
    osub_engine_free(e);
}

/* Well formed, but the engine says no: its own code, and the engine is as it was. */
static void test_engine_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *cmd;
        int rc;
    } c[] = {
        {"{\"op\": \"release\", \"id\": \"nobody\"}", OSUB_EUNKNOWN_SERVICE},
        {"{\"op\": \"ready\", \"id\": \"nobody\"}", OSUB_EUNKNOWN_SERVICE},
        {"{\"op\": \"usage\", \"id\": \"chat\", \"vram_mib\": -1}", OSUB_ENEGATIVE_USAGE},
        {"{\"op\": \"usage\", \"id\": \"nobody\", \"vram_mib\": 1}", OSUB_EUNKNOWN_SERVICE},
        {"{\"op\": \"ack\", \"id\": \"chat\"}", OSUB_ENO_DIRECTIVE},
        {"{\"op\": \"cordon\", \"gpu\": 7, \"on\": true}", OSUB_EBAD_GPU},
        {"{\"op\": \"drain\", \"gpu\": -1}", OSUB_EBAD_GPU},
        {"{\"op\": \"system\", \"gpu\": 2, \"vram_mib\": 1}", OSUB_EBAD_GPU},
        {"{\"op\": \"ratio\", \"ratio_milli\": 999}", OSUB_ERATIO_RANGE},
        {"{\"op\": \"submit\", \"spec\": {\"id\": \"Bad_Id\", \"vram_mib\": 1}}", OSUB_EINVAL},
        {"{\"op\": \"submit\", \"spec\": {\"id\": \"chat\", \"class\": \"online\","
         " \"vram_mib\": 30000}}",
         OSUB_ESPEC_CONFLICT},
        {"{\"op\": \"tick\"}", OSUB_ETIME_BACKWARDS}, /* at 500, after the submit at 1000 */
    };
    osub_engine_t *e = with_one_service();
    char *before = osub_engine_dump(e);
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        char err[256];
        osub_submit_result_t res;
        int64_t now = c[i].rc == OSUB_ETIME_BACKWARDS ? 500 : 2000;
        int rc = apply(e, c[i].cmd, now, &res, err, sizeof(err));
        if (rc == 0 && c[i].rc != 0 && strstr(c[i].cmd, "submit") != NULL &&
            res.outcome == OSUB_SUBMIT_REJECTED)
            rc = res.rc;
        if (rc != c[i].rc)
            fail_msg("%s: %s, wanted %s", c[i].cmd, osub_strerror(rc), osub_strerror(c[i].rc));
        char *after = osub_engine_dump(e);
        if (strcmp(before, after) != 0)
            fail_msg("%s: the engine changed", c[i].cmd);
        free(after);
    }
    free(before);
    osub_engine_free(e);
}

static void test_good_commands(void **state)
{
    (void)state;
    osub_engine_t *e = with_one_service();
    char err[256];
    osub_submit_result_t res;
    assert_int_equal(osub_engine_service_count(e), 1);
    osub_service_info_t si = info(e, "chat");
    assert_int_equal(si.spec->vram_mib, 20000);
    assert_int_equal(si.grant_mib, 20000);
    /* the same spec again: it exists */
    assert_int_equal(
        apply(e,
              "{\"op\": \"submit\", \"spec\": {\"id\": \"chat\", \"class\": \"online\","
              " \"vram_mib\": 20000}}",
              1500, &res, err, sizeof(err)),
        0);
    assert_int_equal(res.outcome, OSUB_SUBMIT_EXISTS);
    /* a dry run places and keeps nothing, and res may be NULL */
    char *before = osub_engine_dump(e);
    assert_int_equal(apply(e,
                           "{\"op\": \"submit\", \"dry_run\": true, \"spec\": {\"id\": \"probe\","
                           " \"vram_mib\": 1000}}",
                           1500, &res, err, sizeof(err)),
                     0);
    assert_int_equal(res.outcome, OSUB_SUBMIT_STARTED);
    assert_int_equal(res.n_gpus, 1);
    assert_int_equal(osub_engine_service_count(e), 1);
    assert_int_equal(apply(e,
                           "{\"op\": \"submit\", \"dry_run\": true, \"spec\": {\"id\": \"probe\","
                           " \"vram_mib\": 1000}}",
                           1500, NULL, err, sizeof(err)),
                     0);
    /* a note is the daemon's own: nothing changes */
    assert_int_equal(apply(e, "{\"op\": \"note\", \"id\": \"chat\", \"kind\": \"started\"}", 1500,
                           NULL, err, sizeof(err)),
                     0);
    char *after = osub_engine_dump(e);
    assert_string_equal(before, after);
    free(before);
    free(after);
    /* ready, usage (one figure, then per GPU), resize */
    assert_int_equal(
        apply(e, "{\"op\": \"ready\", \"id\": \"chat\"}", 2000, NULL, err, sizeof(err)), 0);
    assert_int_equal(info(e, "chat").state, OSUB_STATE_RUNNING);
    assert_int_equal(apply(e,
                           "{\"op\": \"usage\", \"id\": \"chat\", \"vram_mib\": 15000,"
                           " \"compute_pct\": 40}",
                           3000, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(info(e, "chat").used_mib, 15000);
    assert_int_equal(apply(e, "{\"op\": \"usage\", \"id\": \"chat\", \"gpus\": [12000]}", 4000,
                           NULL, err, sizeof(err)),
                     0);
    assert_int_equal(info(e, "chat").used_mib, 12000);
    assert_int_equal(apply(e, "{\"op\": \"resize\", \"id\": \"chat\", \"vram_mib\": 24000}", 5000,
                           NULL, err, sizeof(err)),
                     0);
    assert_int_equal(info(e, "chat").spec->vram_mib, 24000);
    /* pool-wide: ratio, system usage, cordon on and off */
    assert_int_equal(
        apply(e, "{\"op\": \"ratio\", \"ratio_milli\": 1500}", 6000, NULL, err, sizeof(err)), 0);
    osub_pool_info_t pi;
    osub_engine_pool_info(e, &pi);
    assert_int_equal(pi.ratio_milli, 1500);
    assert_int_equal(apply(e, "{\"op\": \"system\", \"gpu\": 1, \"vram_mib\": 700}", 6000, NULL,
                           err, sizeof(err)),
                     0);
    assert_int_equal(ginfo(e, 1).system_mib, 700);
    assert_int_equal(
        apply(e, "{\"op\": \"cordon\", \"gpu\": 1, \"on\": true}", 6000, NULL, err, sizeof(err)),
        0);
    assert_true(ginfo(e, 1).cordoned);
    assert_int_equal(
        apply(e, "{\"op\": \"cordon\", \"gpu\": 1, \"on\": false}", 6000, NULL, err, sizeof(err)),
        0);
    assert_false(ginfo(e, 1).cordoned);
    assert_int_equal(apply(e, "{\"op\": \"tick\"}", 7000, NULL, err, sizeof(err)), 0);
    check_ok(e);
    /* release: gone */
    assert_int_equal(
        apply(e, "{\"op\": \"release\", \"id\": \"chat\"}", 8000, NULL, err, sizeof(err)), 0);
    assert_int_equal(osub_engine_service_count(e), 0);
    check_ok(e);
    osub_engine_free(e);
}

/* The error sentence is cut to the buffer, terminated, with an op of any length. */
static void test_error_fits(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 1300);
    char op[3000] = "{\"op\": \"";
    memset(op + strlen(op), 'z', 2000);
    strcat(op, "\"}");
    char err[40];
    memset(err, 'x', sizeof(err));
    assert_int_equal(apply(e, op, 0, NULL, err, sizeof(err)), OSUB_EINVAL);
    assert_non_null(memchr(err, '\0', sizeof(err)));
    assert_int_equal(strncmp(err, "command 'zzz", 12), 0);
    char tiny[1] = {'x'};
    json_t *empty = json_object();
    assert_int_equal(osubd__cmd_apply(e, empty, 0, NULL, tiny, 1), OSUB_EINVAL);
    json_decref(empty);
    assert_int_equal(tiny[0], '\0');
    osub_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_refused),
        cmocka_unit_test(test_engine_refusals),
        cmocka_unit_test(test_good_commands),
        cmocka_unit_test(test_error_fits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
