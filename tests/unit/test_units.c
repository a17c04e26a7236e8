/* test_units.c - exact parsing of ratios, sizes and pools (where floats enter) */
#include "helpers.h"

static void test_ratio(void **state)
{
    (void)state;
    struct {
        const char *in;
        int rc;
        int32_t milli;
    } cases[] = {
        {"1.3", 0, 1300},
        {"1.25", 0, 1250},
        {"1", 0, 1000},
        {"2.000", 0, 2000},
        {"1.5x", 0, 1500},
        {" 1.8 ", 0, 1800},
        {"1.30000", 0, 1300},
        {"100", 0, 100000},
        {"1.2345", OSUB_ERATIO_PRECISION, 0},
        {"0.9", OSUB_ERATIO_RANGE, 0},
        {"100.001", OSUB_ERATIO_RANGE, 0},
        {"", OSUB_EBAD_RATIO, 0},
        {"abc", OSUB_EBAD_RATIO, 0},
        {"1.3.4", OSUB_EBAD_RATIO, 0},
        {"-1.3", OSUB_EBAD_RATIO, 0},
        {"1e3", OSUB_EBAD_RATIO, 0},
        {"99999999999999999999", OSUB_EBAD_RATIO, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t m = -1;
        int rc = osub_parse_ratio(cases[i].in, &m);
        if (rc != cases[i].rc)
            fail_msg("ratio '%s': rc %d, want %d", cases[i].in, rc, cases[i].rc);
        if (rc == 0)
            assert_int_equal(m, cases[i].milli);
    }
    char buf[32];
    osub_format_ratio(1300, buf, sizeof(buf));
    assert_string_equal(buf, "1.3");
    osub_format_ratio(1250, buf, sizeof(buf));
    assert_string_equal(buf, "1.25");
    osub_format_ratio(2000, buf, sizeof(buf));
    assert_string_equal(buf, "2");
}

static void test_size(void **state)
{
    (void)state;
    struct {
        const char *in;
        int rc;
        int64_t mib;
    } cases[] = {
        {"0.1GiB", 0, 103},
        {"120GiB", 0, 122880},
        {"160 GiB", 0, 163840},
        {"81920", 0, 81920},
        {"1MB", 0, 1},
        {"1GB", 0, 954},
        {"80GB", 0, 76294},
        {"0.5GiB", 0, 512},
        {"1.5", 0, 2},
        {"512MiB", 0, 512},
        {"1TiB", 0, 1048576},
        {"2048KiB", 0, 2},
        {"1gib", 0, 1024},
        {"0", OSUB_EBAD_SIZE, 0},
        {"-1GiB", OSUB_EBAD_SIZE, 0},
        {"12XB", OSUB_EBAD_SIZE, 0},
        {"", OSUB_EBAD_SIZE, 0},
        {"GiB", OSUB_EBAD_SIZE, 0},
        {"99999999999999TiB", OSUB_EBAD_SIZE, 0},
        /* issue 23: what int64 cannot hold is refused, never wrapped (was 298 MiB; UB) */
        {"18446744074GiB", OSUB_EBAD_SIZE, 0},
        {"99999999999TiB", OSUB_EBAD_SIZE, 0},
        {"9223372037GiB", OSUB_EBAD_SIZE, 0},
        {"10000000000B", 0, 9537},                 /* 10 GB in bytes: large, and exact */
        {"1099511627776MiB", 0, INT64_C(1) << 40}, /* the largest size */
        {"1099511627777MiB", OSUB_EBAD_SIZE, 0},
        {"1048576TiB", 0, INT64_C(1) << 40},
        {"1048576.000000001TiB", OSUB_EBAD_SIZE, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t m = -1;
        int rc = osub_parse_size_mib(cases[i].in, 0, &m);
        if (rc != cases[i].rc)
            fail_msg("size '%s': rc %d, want %d", cases[i].in, rc, cases[i].rc);
        if (rc == 0 && m != cases[i].mib)
            fail_msg("size '%s': %lld, want %lld", cases[i].in, (long long)m,
                     (long long)cases[i].mib);
    }
    int64_t z = -1;
    assert_int_equal(osub_parse_size_mib("0", 1, &z), 0);
    assert_int_equal(z, 0);
}

static void test_ratio_overflow(void **state)
{
    (void)state;
    int32_t m = -1;
    /* digits past what int64 x 1000 holds: refused as out of range, never wrapped into it */
    assert_true(osub_parse_ratio("18446744073709552", &m) != 0);
    assert_true(osub_parse_ratio("9223372036854775.808", &m) != 0);
    assert_int_equal(osub_parse_ratio("18446744.073", &m), OSUB_ERATIO_RANGE);
    assert_int_equal(m, -1);
    assert_int_equal(osub_parse_ratio("100", &m), 0);
    assert_int_equal(m, 100000);
}

static void test_pool(void **state)
{
    (void)state;
    int64_t v[64];
    size_t n;
    assert_int_equal(osub_parse_pool("8x81920", v, 64, &n), 0);
    assert_int_equal(n, 8);
    assert_int_equal(v[7], 81920);
    assert_int_equal(osub_parse_pool("4x81920,4x40960", v, 64, &n), 0);
    assert_int_equal(n, 8);
    assert_int_equal(v[3], 81920);
    assert_int_equal(v[4], 40960);
    assert_int_equal(osub_parse_pool("2xA100-80GB", v, 64, &n), 0);
    assert_int_equal(v[1], 81920);
    const char *bad[] = {"",         "8",      "x81920", "8x",          "0x81920",
                         "8x81920,", "-1x100", "8xfoo",  "99999x81920", "8x81920,,2x10"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (osub_parse_pool(bad[i], v, 64, &n) != OSUB_EBAD_POOL)
            fail_msg("pool '%s' accepted", bad[i]);
    assert_int_equal(osub_parse_pool("65x100", v, 64, &n), OSUB_EBAD_POOL); /* over cap */
}

static void test_error_messages_distinct(void **state)
{
    (void)state;
    int codes[] = {
#define X(name, value, code, msg) OSUB_E##name,
        OSUB_ERRNO_MAP(X)
#undef X
    };
    size_t n = sizeof(codes) / sizeof(codes[0]);
    for (size_t i = 0; i < n; i++) {
        assert_string_not_equal(osub_strerror(codes[i]), "unknown error");
        for (size_t j = 0; j < i; j++) {
            assert_int_not_equal(codes[i], codes[j]);
            assert_string_not_equal(osub_errcode(codes[i]), osub_errcode(codes[j]));
        }
    }
    assert_string_equal(osub_strerror(12345), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ratio),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_ratio_overflow),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_error_messages_distinct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
