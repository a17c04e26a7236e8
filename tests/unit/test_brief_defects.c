/* test_brief_defects.c - one regression test for each defect of the brief's sample code:
 * each shows the brief's algorithm (transcribed in src/common/brief_policy.c) going wrong
 * and the engine getting it right on the same situation. */
#include "helpers.h"

#include "brief_policy.h"

/* Defect 1: victims walked highest priority first. */
static void test_victims_lowest_priority_first(void **state)
{
    (void)state;
    /* brief: batch (P1) and experiment (P2) on a 100 GB pool, each reporting 30 GB; a P0 of
     * 10 GB arrives (the phantom requests of defect 5 make the pool look short) */
    brief_pool_t *b = brief_new(100, 1.5);
    char v[8][64];
    assert_int_equal(brief_allocate(b, "batch", 1, 40, true, 1, v, 8), 0);
    assert_int_equal(brief_allocate(b, "exp", 2, 40, true, 2, v, 8), 0);
    assert_int_equal(brief_update_usage(b, "batch", 30), 0);
    assert_int_equal(brief_update_usage(b, "exp", 30), 0);
    assert_true(brief_can_allocate(b, 0, 10, false));
    assert_int_equal(brief_allocate(b, "online", 0, 10, false, 3, v, 8), 2);
    assert_string_equal(v[0], "batch"); /* the brief walks the batch job first */
    brief_free(b);

    osub_engine_t *e = mk_engine(1, 81920, 1500);
    assert_int_equal(sub(e, spec("batch", "batch", 40960, 1, 0), 0), OSUB_SUBMIT_STARTED);
    osub_engine_ready(e, "batch", 0);
    osub_engine_usage(e, "batch", 36864, -1, 0);
    assert_int_equal(sub(e, spec("exp", "experiment", 40960, 1, 0), 1), OSUB_SUBMIT_STARTED);
    osub_engine_ready(e, "exp", 2);
    osub_engine_usage(e, "exp", 36864, -1, 3);
    osub_submit_result_t r;
    osub_spec_t on = spec("online", "online", 40960, 1, 0);
    assert_int_equal(osub_engine_submit(e, &on, 4, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    assert_int_equal(r.n_victims, 1);
    assert_string_equal(r.victims[0].service, "exp"); /* the engine evicts the experiment */
    assert_true(r.victims[0].evict);
    assert_int_equal(info(e, "batch").state, OSUB_STATE_RUNNING);
    check_ok(e);
    osub_engine_free(e);
}

/* Defect 2: logical capacity ignored when allocating. */
static void test_logical_capacity_enforced(void **state)
{
    (void)state;
    /* brief at ratio 1.0: allocate() admits 120 GB of requests onto 80 GB of logical capacity */
    brief_pool_t *b = brief_new(80, 1.0);
    char v[8][64];
    assert_int_equal(brief_allocate(b, "a", 1, 80, true, 1, v, 8), 0);
    assert_int_equal(brief_update_usage(b, "a", 10), 0);
    assert_int_equal(brief_allocate(b, "b", 2, 40, true, 2, v, 8), 0);
    assert_true(brief_allocated(b) > brief_logical(b));
    brief_free(b);

    osub_engine_t *e = mk_engine(1, 81920, 1000);
    assert_int_equal(sub(e, spec("a", "batch", 81920, 1, 0), 0), OSUB_SUBMIT_STARTED);
    osub_engine_ready(e, "a", 1);
    osub_engine_usage(e, "a", 10240, -1, 1);
    osub_spec_t s = spec("b", "experiment", 40960, 1, 0);
    s.queue = OSUB_TRI_NO;
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &s, 2, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(r.outcome, OSUB_SUBMIT_REJECTED);
    assert_int_equal(r.check, OSUB_CHECK_LOGICAL);
    assert_int_equal(r.shortfall_mib, 40960);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_true(p.granted_mib <= p.logical_mib);
    check_ok(e);
    osub_engine_free(e);
}

/* Defect 3: admission despite an unresolved shortage (and victims thrown out for nothing). */
static void test_no_admission_with_unresolved_shortage(void **state)
{
    (void)state;
    /* brief: 80 GB; a non-preemptible P1 uses 50, a P2 uses 20; a P0 of 40 needs 30 more
     * than the 10 free, the P2 frees 20: shortage 10 left, admitted anyway */
    brief_pool_t *b = brief_new(80, 2.0);
    char v[8][64];
    assert_int_equal(brief_allocate(b, "big", 1, 50, false, 1, v, 8), 0);
    assert_int_equal(brief_allocate(b, "exp", 2, 20, true, 2, v, 8), 0);
    assert_int_equal(brief_update_usage(b, "big", 50), 0);
    assert_int_equal(brief_update_usage(b, "exp", 20), 0);
    int nv = brief_allocate(b, "online", 0, 40, false, 3, v, 8);
    assert_int_equal(nv, 1);
    assert_true(brief_actual(b) > brief_total(b)); /* over physical: an OOM in waiting */
    brief_free(b);

    osub_engine_t *e = mk_engine(1, 81920, 2000);
    osub_spec_t big = spec("big", "batch", 51200, 1, 0);
    big.preemptible = OSUB_TRI_NO;
    assert_int_equal(sub(e, big, 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("exp", "experiment", 20480, 1, 0), 0), OSUB_SUBMIT_STARTED);
    osub_engine_ready(e, "big", 1);
    osub_engine_ready(e, "exp", 1);
    osub_engine_usage(e, "exp", 20480, -1, 1);
    osub_spec_t on = spec("online", "online", 40960, 1, 0);
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &on, 2, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(r.outcome, OSUB_SUBMIT_REJECTED);
    assert_int_equal(r.check, OSUB_CHECK_BACKED);
    /* nobody was preempted for a plan that could not work */
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL) + count_ev(e, OSUB_EV_DEGRADE, NULL), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_RUNNING);
    assert_true(ginfo(e, 0).held_mib <= 81920);
    check_ok(e);
    osub_engine_free(e);
}

/* Defect 4: equal or higher priority counted as reclaimable. */
static void test_equal_priority_not_reclaimable(void **state)
{
    (void)state;
    brief_pool_t *b = brief_new(80, 1.0);
    char v[8][64];
    assert_int_equal(brief_allocate(b, "a", 1, 80, true, 1, v, 8), 0);
    assert_true(brief_can_allocate(b, 1, 40, true)); /* counts a (same priority) as reclaimable */
    brief_free(b);

    osub_engine_t *e = mk_engine(1, 81920, 1000);
    assert_int_equal(sub(e, spec("a", "batch", 81920, 1, 40960), 0), OSUB_SUBMIT_STARTED);
    osub_engine_ready(e, "a", 1);
    osub_engine_usage(e, "a", 71680, -1, 1);
    osub_spec_t s = spec("b", "batch", 40960, 1, 0);
    s.queue = OSUB_TRI_NO;
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &s, 2, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(r.n_victims, 0);
    assert_int_equal(info(e, "a").state, OSUB_STATE_RUNNING);
    assert_int_equal(info(e, "a").grant_mib, 81920);
    /* and a higher-priority service is never a victim of a lower one */
    osub_engine_t *e2 = mk_engine(1, 81920, 1000);
    osub_spec_t hi = spec("hi", "batch", 81920, 1, 40960);
    assert_int_equal(sub(e2, hi, 0), OSUB_SUBMIT_STARTED);
    osub_spec_t lo = spec("lo", "experiment", 40960, 1, 0);
    lo.queue = OSUB_TRI_NO;
    assert_int_equal(osub_engine_submit(e2, &lo, 1, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(info(e2, "hi").state, OSUB_STATE_LOADING);
    check_ok(e);
    check_ok(e2);
    osub_engine_free(e);
    osub_engine_free(e2);
}

/* Defect 5: the request counted as pool usage for ever. */
static void test_request_not_counted_as_usage_forever(void **state)
{
    (void)state;
    brief_pool_t *b = brief_new(80, 1.5);
    char v[8][64];
    assert_int_equal(brief_allocate(b, "a", 1, 40, true, 1, v, 8), 0);
    assert_int_equal(brief_update_usage(b, "a", 30), 0);
    assert_int_equal(brief_release(b, "a"), 0);
    assert_true(brief_actual(b) > 39.9); /* 40 GB that nobody uses, for ever */
    brief_free(b);

    osub_engine_t *e = mk_engine(2, 81920, 1500);
    for (int round = 0; round < 3; round++) {
        int64_t t = round * 200000;
        assert_int_equal(sub(e, spec("a", "batch", 40960, 1, 0), t), OSUB_SUBMIT_STARTED);
        /* (placement may pick either GPU: the one that held it last still has it in its
         * history) */
        int32_t g = info(e, "a").slots[0].gpu;
        assert_int_equal(ginfo(e, g).held_mib, 40960); /* loading: held is the grant */
        assert_int_equal(ginfo(e, g).used_mib, 0);     /* but nothing is used yet */
        osub_engine_ready(e, "a", t + 1);
        assert_int_equal(osub_engine_usage(e, "a", 30720, -1, t + 2), 0);
        assert_int_equal(ginfo(e, g).held_mib, 30720);
        assert_int_equal(ginfo(e, g).used_mib, 30720);
        assert_int_equal(osub_engine_release(e, "a", t + 3), 0);
        osub_pool_info_t p;
        osub_engine_pool_info(e, &p);
        assert_int_equal(p.held_mib, 0);
        assert_int_equal(p.used_mib, 0);
        assert_int_equal(p.granted_mib, 0);
    }
    check_ok(e);
    osub_engine_free(e);
}

/* Defect 6: floating-point totals. Parsing is exact and a million cycles leave zero. */
static void test_no_float_drift(void **state)
{
    (void)state;
    int32_t milli;
    int64_t mib;
    assert_int_equal(osub_parse_ratio("1.3", &milli), 0);
    assert_int_equal(milli, 1300);
    assert_int_equal(osub_parse_size_mib("0.1GiB", 0, &mib), 0);
    assert_int_equal(mib, 103);

    /* the brief drifts: 0.1 GB added and removed a million times */
    brief_pool_t *b = brief_new(640, 1.3);
    char v[8][64];
    brief_allocate(b, "keep", 1, 0.3, true, 0, v, 8);
    for (int i = 0; i < 1000000; i++) {
        brief_allocate(b, "x", 1, 0.1, true, i, v, 8);
        brief_release(b, "x");
    }
    brief_release(b, "keep");
    assert_true(brief_allocated(b) != 0.0);
    brief_free(b);

    /* the engine: a million submit/usage/release cycles of odd sizes, totals exactly 0 */
    osub_engine_t *e = mk_engine(8, 81920, 1300);
    int64_t t = 0;
    for (int i = 0; i < 1000000; i++) {
        osub_spec_t s =
            spec("x", i % 3 ? "batch" : "experiment", 103 + (i % 7) * 1001, 1 + i % 3, 0);
        assert_int_equal(sub(e, s, t), OSUB_SUBMIT_STARTED);
        assert_int_equal(osub_engine_usage(e, "x", 77 + i % 5, -1, t), 0);
        assert_int_equal(osub_engine_release(e, "x", t), 0);
        t += 1;
    }
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.granted_mib, 0);
    assert_int_equal(p.held_mib, 0);
    assert_int_equal(p.used_mib, 0);
    for (int g = 0; g < 8; g++) {
        osub_gpu_info_t gi = ginfo(e, g);
        assert_int_equal(gi.granted_mib + gi.held_mib + gi.used_mib + gi.backed_mib, 0);
    }
    check_ok(e);
    osub_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_victims_lowest_priority_first),
        cmocka_unit_test(test_logical_capacity_enforced),
        cmocka_unit_test(test_no_admission_with_unresolved_shortage),
        cmocka_unit_test(test_equal_priority_not_reclaimable),
        cmocka_unit_test(test_request_not_counted_as_usage_forever),
        cmocka_unit_test(test_no_float_drift),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
