/* test_idmap.c - the daemon's id tables against a plain array, through growth and deletions */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/daemon/idmap.h"

static int freed;
static void free_int(void *p)
{
    freed++;
    free(p);
}

static void test_matches_a_plain_array(void **state)
{
    (void)state;
    enum { N = 600 };
    int ref[N]; /* 0: absent, else the value */
    memset(ref, 0, sizeof(ref));
    struct osubd__idmap *m = osubd__idmap_new(free_int);
    assert_non_null(m);
    uint64_t x = 88172645463325252ULL;
    int live = 0;
    for (int step = 0; step < 40000; step++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % N);
        char id[16];
        snprintf(id, sizeof(id), "s%d", k);
        if ((x >> 20) % 3 != 0) {
            int *v = malloc(sizeof(int));
            assert_non_null(v);
            *v = step + 1;
            assert_int_equal(osubd__idmap_put(m, id, v), 0);
            live += ref[k] == 0;
            ref[k] = step + 1;
        } else {
            assert_int_equal(osubd__idmap_del(m, id), ref[k] != 0);
            live -= ref[k] != 0;
            ref[k] = 0;
        }
        if (step % 997 == 0 || step == 39999) {
            assert_int_equal(osubd__idmap_count(m), (size_t)live);
            for (int i = 0; i < N; i++) {
                snprintf(id, sizeof(id), "s%d", i);
                int *v = osubd__idmap_get(m, id);
                if (ref[i] == 0)
                    assert_null(v);
                else {
                    assert_non_null(v);
                    assert_int_equal(*v, ref[i]);
                }
            }
            size_t nk;
            osubd__idmap_key_t *keys = osubd__idmap_keys(m, &nk);
            assert_int_equal(nk, (size_t)live);
            for (size_t i = 0; i < nk; i++)
                assert_int_not_equal(ref[atoi(keys[i] + 1)], 0);
            free(keys);
        }
    }
    int before = freed;
    osubd__idmap_free(m);
    assert_int_equal(freed - before, live); /* every record still held is freed once */
    /* ids longer than an id may be are refused */
    m = osubd__idmap_new(NULL);
    char longid[100];
    memset(longid, 'a', 99);
    longid[99] = '\0';
    int v = 1;
    assert_int_equal(osubd__idmap_put(m, longid, &v), -1);
    assert_int_equal(osubd__idmap_count(m), 0);
    osubd__idmap_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matches_a_plain_array)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
