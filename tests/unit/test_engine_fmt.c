/* test_engine_fmt.c - the engine's own formatter (fmt.c) against snprintf: the same bytes and
 * the same return value, truncated or not, for every conversion it does and for those it hands
 * to vsnprintf */
#include <limits.h>

#include "helpers.h"
#include "internal.h"

/* Formats fmt with osub__vfmt and vsnprintf into buffers of several sizes and compares. */
OSUB_PRINTF(1, 2)
static void same_as_snprintf(const char *fmt, ...)
{
    static const size_t lens[] = {0, 1, 2, 3, 7, 16, 64, 300};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        char want[300], got[300];
        memset(want, 'x', sizeof(want));
        memset(got, 'x', sizeof(got));
        va_list a, b;
        va_start(a, fmt);
        va_copy(b, a);
        int rw = vsnprintf(want, lens[i], fmt, a);
        int rg = osub__vfmt(got, lens[i], fmt, b);
        va_end(b);
        va_end(a);
        assert_int_equal(rg, rw);
        assert_memory_equal(got, want, sizeof(want));
    }
}

static void test_fmt_matches_snprintf(void **state)
{
    (void)state;
    same_as_snprintf("plain text");
    same_as_snprintf("%s", "");
    same_as_snprintf("%s and %s", "svc-1", "a longer service name than most buffers here hold");
    same_as_snprintf("%d %d %d %d", 0, -1, INT_MAX, INT_MIN);
    same_as_snprintf("%i|%u|%u", -42, 0u, UINT_MAX);
    same_as_snprintf("%ld %lu", LONG_MIN, ULONG_MAX);
    same_as_snprintf("%lld %lld %llu", LLONG_MIN, LLONG_MAX, ULLONG_MAX);
    same_as_snprintf("%zu items", (size_t)123456789);
    same_as_snprintf("100%% of %c%c", 'G', 'B');
    same_as_snprintf("admitted %s (%s, %lld MiB) on %s with %d victim(s): %s", "chat-3", "online",
                     40960LL, "GPU 4", 1, "it was counted as 40960 MiB (its request)");
    /* conversions it hands to vsnprintf, whatever came before them */
    same_as_snprintf("%s then %5d", "text", 42);
    same_as_snprintf("%d.%02d", 1, 5);
    same_as_snprintf("%.3s|%-4s|%x", "abcdef", "ab", 255u);
    same_as_snprintf("%lld then %f", 7LL, 0.5);
}

static void test_str_copy_matches_snprintf(void **state)
{
    (void)state;
    static const char *srcs[] = {"", "a", "svc-1", "exactly-sixteen!", "a string longer than 16"};
    for (size_t i = 0; i < sizeof(srcs) / sizeof(srcs[0]); i++) {
        for (size_t len = 1; len <= 24; len++) {
            char want[24], got[24];
            memset(want, 'x', sizeof(want));
            memset(got, 'x', sizeof(got));
            snprintf(want, len, "%s", srcs[i]);
            osub__str_copy(got, len, srcs[i]);
            assert_memory_equal(got, want, sizeof(want));
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fmt_matches_snprintf),
        cmocka_unit_test(test_str_copy_matches_snprintf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
