/* test_log.c - oversubd's logging layer (log.h): "oversubd: " + message + newline, the warning
 * and error tags, the threshold tested before the arguments are evaluated, level names, a
 * message longer than the line buffer still ends its line */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "log.h"

static FILE *out;

static int setup(void **state)
{
    (void)state;
    out = tmpfile();
    assert_non_null(out);
    osubd_log_set_stream(out);
    osubd_log_set_level(OSUBD_LOG_INFO);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    osubd_log_set_stream(NULL);
    osubd_log_set_level(OSUBD_LOG_INFO);
    fclose(out);
    return 0;
}

/* Everything written so far (malloc'd). */
static char *written(void)
{
    long len = ftell(out);
    assert_true(len >= 0);
    char *buf = calloc(1, (size_t)len + 1);
    assert_non_null(buf);
    rewind(out);
    assert_int_equal(fread(buf, 1, (size_t)len, out), (size_t)len);
    fseek(out, 0, SEEK_END);
    return buf;
}

static void expect_written(const char *want)
{
    char *got = written();
    assert_string_equal(got, want);
    free(got);
}

static int evaluated;

static int side_effect(void)
{
    return ++evaluated;
}

static void test_info_line(void **state)
{
    (void)state;
    osubd_log(OSUBD_LOG_INFO, "listening on %s:%d", "127.0.0.1", 7070);
    expect_written("oversubd: listening on 127.0.0.1:7070\n");
}

static void test_tags(void **state)
{
    (void)state;
    osubd_log(OSUBD_LOG_WARN, "disk %d%% full", 95);
    osubd_log(OSUBD_LOG_ERROR, "cannot write the state");
    expect_written("oversubd: warning: disk 95% full\noversubd: error: cannot write the state\n");
}

static void test_below_threshold_not_evaluated(void **state)
{
    (void)state;
    evaluated = 0;
    osubd_log(OSUBD_LOG_DEBUG, "costly %d", side_effect());
    assert_int_equal(evaluated, 0);
    expect_written("");
    osubd_log_set_level(OSUBD_LOG_ERROR);
    osubd_log(OSUBD_LOG_WARN, "w %d", side_effect());
    osubd_log(OSUBD_LOG_INFO, "i %d", side_effect());
    assert_int_equal(evaluated, 0);
    expect_written("");
    /* at the threshold: printed, and the argument evaluated once */
    osubd_log(OSUBD_LOG_ERROR, "e %d", side_effect());
    assert_int_equal(evaluated, 1);
    expect_written("oversubd: error: e 1\n");
}

static void test_debug_when_enabled(void **state)
{
    (void)state;
    evaluated = 0;
    osubd_log_set_level(OSUBD_LOG_DEBUG);
    osubd_log(OSUBD_LOG_DEBUG, "costly %d", side_effect());
    assert_int_equal(evaluated, 1);
    expect_written("oversubd: costly 1\n");
}

static void test_parse_level(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int level;
    } cases[] = {
        {"debug", OSUBD_LOG_DEBUG},
        {"info", OSUBD_LOG_INFO},
        {"warn", OSUBD_LOG_WARN},
        {"error", OSUBD_LOG_ERROR},
        {"warning", -1},
        {"", -1},
        {"infos", -1},
        {"fatal", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(osubd_log_parse_level(cases[i].name), cases[i].level);
    assert_int_equal(osubd_log_parse_level(NULL), -1);
}

static void test_long_message_ends_its_line(void **state)
{
    (void)state;
    size_t n = 10000;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, 'x', n);
    big[n] = '\0';
    osubd_log(OSUBD_LOG_WARN, "%s", big);
    osubd_log(OSUBD_LOG_INFO, "next");
    char *got = written();
    const char *prefix = "oversubd: warning: xxx";
    assert_memory_equal(got, prefix, strlen(prefix));
    char *nl = strchr(got, '\n');
    assert_non_null(nl);
    assert_true(nl - got > 1000); /* cut, not dropped */
    assert_true((size_t)(nl - got) < n);
    for (char *p = got + strlen("oversubd: warning: "); p < nl; p++)
        assert_int_equal(*p, 'x');
    assert_string_equal(nl + 1, "oversubd: next\n"); /* the next line starts on its own */
    free(got);
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_info_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_below_threshold_not_evaluated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_debug_when_enabled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_level, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_message_ends_its_line, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
