/* test_engine_bounds.c - the victim-count bounds of the optimistic key (plan.h): the three
 * largest amounts kept by top3_add() and top3_merge(), and victims_needed(), which must never
 * say more victims than the fewest that really cover a shortfall (else best-first would skip a
 * GPU whose exact plan is better) and never fewer than the one-amount bound it replaced. */
#include <stdlib.h>

#include "helpers.h"
#include "plan.h"

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The fewest of v[0..n) whose sum reaches need (largest first is optimal); -1 when none do. */
static int64_t fewest(int64_t need, int64_t *v, int n)
{
    if (need <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_desc);
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        sum += v[i];
        if (sum >= need)
            return i + 1;
    }
    return -1;
}

static void test_top3_keeps_the_three_largest(void **state)
{
    (void)state;
    int64_t t[3] = {0, 0, 0};
    static const int64_t in[] = {5, 0, -3, 9, 9, 2, 7, 1};
    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++)
        top3_add(t, in[i]);
    assert_int_equal(t[0], 9);
    assert_int_equal(t[1], 9);
    assert_int_equal(t[2], 7);
    int64_t u[3] = {8, 4, 0}, w[3] = {3, 0, 0};
    top3_merge(w, u);
    assert_int_equal(w[0], 8);
    assert_int_equal(w[1], 4);
    assert_int_equal(w[2], 3);
    int64_t z[3] = {0, 0, 0}, none[3] = {0, 0, 0};
    top3_merge(z, none); /* nothing positive: nothing kept */
    assert_int_equal(z[0] + z[1] + z[2], 0);
}

static void test_victims_needed_exact_cases(void **state)
{
    (void)state;
    int64_t t[3] = {10, 6, 4};
    assert_int_equal(victims_needed(0, t), 0);
    assert_int_equal(victims_needed(-5, t), 0);
    assert_int_equal(victims_needed(10, t), 1);
    assert_int_equal(victims_needed(11, t), 2);
    assert_int_equal(victims_needed(16, t), 2);
    assert_int_equal(victims_needed(17, t), 3);
    assert_int_equal(victims_needed(20, t), 3);
    assert_int_equal(victims_needed(21, t), 4); /* 20 + at most 4 more each */
    assert_int_equal(victims_needed(28, t), 5);
    int64_t one[3] = {10, 0, 0};
    assert_int_equal(victims_needed(25, one), 3); /* no plan covers it: ceil(25 / 10) */
    int64_t zero[3] = {0, 0, 0};
    assert_int_equal(victims_needed(25, zero), 0); /* nothing known */
}

/* Random victim sets: the bound from their three largest is a lower bound on the fewest that
 * cover the need, and at least the old ceil(need / largest). */
static void test_victims_needed_is_a_lower_bound(void **state)
{
    (void)state;
    srand(7);
    int checked = 0;
    for (int it = 0; it < 200000; it++) {
        int n = 1 + rand() % 12;
        int64_t v[12], t[3] = {0, 0, 0}, total = 0;
        for (int i = 0; i < n; i++) {
            v[i] = rand() % 4 == 0 ? 0 : 1 + rand() % (rand() % 2 ? 100 : 40000);
            total += v[i];
            top3_add(t, v[i]);
        }
        int64_t need = (int64_t)(rand() % 3 == 0 ? rand() % 50 : rand() % (int)(total + 2));
        int64_t got = victims_needed(need, t);
        int64_t want = fewest(need, v, n);
        if (want >= 0) {
            assert_true(got <= want);
            checked++;
        }
        if (need > 0 && t[0] > 0)
            assert_true(got >= (need + t[0] - 1) / t[0]);
    }
    assert_true(checked > 100000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top3_keeps_the_three_largest),
        cmocka_unit_test(test_victims_needed_exact_cases),
        cmocka_unit_test(test_victims_needed_is_a_lower_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
