/* test_engine.c - the engine's rules one by one: pressure, restore, queue, backfill, ratio,
 * lost GPUs, exclusive, multi-GPU victims, minimum runtime, overdue, placement, loading */
#define _POSIX_C_SOURCE 200809L
#include "helpers.h"

/* Starts a service and makes it ready with the given usage. */
static void running(osub_engine_t *e, osub_spec_t s, int64_t used, int64_t t)
{
    assert_int_equal(sub(e, s, t), OSUB_SUBMIT_STARTED);
    assert_int_equal(osub_engine_ready(e, s.id, t), 0);
    assert_int_equal(osub_engine_usage(e, s.id, used, -1, t), 0);
}

static void test_priority_outranks_degrade_first(void **state)
{
    (void)state;
    /* one GPU: a degradable batch and a non-degradable experiment; an online arrival.
     * Evicting the experiment beats degrading the batch (level 2 touched only). */
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("bat", "batch", 40960, 1, 20480), 36000, 0);
    running(e, spec("exp", "experiment", 36000, 1, 0), 36000, 0);
    osub_submit_result_t r;
    osub_spec_t on = spec("web", "online", 20480, 1, 0);
    assert_int_equal(osub_engine_submit(e, &on, 10, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    assert_int_equal(r.n_victims, 1);
    assert_string_equal(r.victims[0].service, "exp");
    assert_true(r.victims[0].evict);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_RUNNING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_give_back_turns_eviction_into_degrade(void **state)
{
    (void)state;
    /* an experiment and a batch job. Level 2 first: degrading the experiment is not enough,
     * so it is evicted; still not enough, so the batch job is degraded. Then the give-back,
     * highest priority first: the batch degrade is needed, and the experiment's eviction
     * becomes a degrade, which now suffices. The start may not push held above the high
     * watermark (77824 of 81920) while preemptible services share the GPU: 10240 + 20480 +
     * 47000 = 77720 just fits. */
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("exp", "experiment", 30720, 1, 10240), 30000, 0);
    running(e, spec("bat", "batch", 40960, 1, 20480), 40000, 1);
    osub_submit_result_t r;
    osub_spec_t on = spec("web", "online", 47000, 1, 0);
    assert_int_equal(osub_engine_submit(e, &on, 10, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    assert_int_equal(r.n_victims, 2);
    for (int i = 0; i < 2; i++)
        assert_false(r.victims[i].evict);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_DEGRADED);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_DEGRADED);
    assert_int_equal(osub_engine_ack(e, "exp", NULL, 20), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_PENDING);
    assert_int_equal(osub_engine_ack(e, "bat", NULL, 30), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    assert_int_equal(ginfo(e, 0).held_mib, 10240 + 20480 + 47000);
    check_ok(e);
    osub_engine_free(e);
}

/* A degradable newcomer whose request has no room (and may displace nobody) starts at its
 * floor; it is restored once its predicted peak has room, not before. */
static void test_degraded_start_restored_by_prediction(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    /* bat: loading, its held its request until it reports what it uses */
    assert_int_equal(sub(e, spec("bat", "batch", 40960, 1, 40960), 0), OSUB_SUBMIT_STARTED);
    osub_submit_result_t r;
    osub_spec_t ex = spec("exp", "experiment", 50000, 1, 20000);
    assert_int_equal(osub_engine_submit(e, &ex, 10, 0, &r), 0);
    /* room for its request may be coming (bat is not measured yet): it waits in the queue */
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    assert_int_equal(osub_engine_usage(e, "bat", 40000, -1, 20), 0);
    /* bat ready, measured at 40000: no room for 50000 under the high watermark, and none to
     * come; it starts at its floor at once, not after floor_start_after_ms (2 min) */
    assert_int_equal(osub_engine_ready(e, "bat", 30), 0);
    osub_service_info_t x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_DEGRADED);
    assert_int_equal(x.grant_mib, 20000);
    const osub_event_t *ev = find_ev(e, OSUB_EV_DEGRADE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_START_FLOOR);
    ev = find_ev(e, OSUB_EV_ADMIT, "exp");
    assert_non_null(ev);
    assert_non_null(strstr(ev->msg, "counted as 20000 MiB (its floor: it starts degraded)"));
    /* no history: its predicted peak is its request */
    assert_int_equal(info(e, "exp").predicted_peak_mib, 50000);
    assert_int_equal(osub_engine_ready(e, "exp", 120020), 0);
    /* it uses 15000 every minute; bat keeps 40000: a restore needs its predicted peak under
     * 90% of 81920 (73728) - 40000 = 33728, which the history earns after some hours */
    int64_t last_pred = 50000, restored_at = -1;
    for (int64_t m = 3; m <= 12 * 60 && restored_at < 0; m++) {
        int64_t t = m * 60000;
        assert_int_equal(osub_engine_usage(e, "exp", 15000, -1, t), 0);
        assert_int_equal(osub_engine_usage(e, "bat", 40000, -1, t), 0);
        int64_t pred = info(e, "exp").predicted_peak_mib;
        assert_true(pred <= last_pred); /* steady use: the prediction only comes down */
        assert_true(pred >= 15000);
        last_pred = pred;
        assert_int_equal(osub_engine_tick(e, t), 0);
        if (count_ev(e, OSUB_EV_RESTORE, "exp") > 0) {
            restored_at = t;
            /* room for its predicted peak under the low watermark */
            assert_true(40000 + pred <= 73728);
        }
    }
    /* not in the first 45 minutes: the request still dominates the prediction */
    assert_true(restored_at > 45 * 60000);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_RUNNING);
    assert_int_equal(info(e, "exp").grant_mib, 50000);
    check_ok(e);
    osub_engine_free(e);
}

/* Pressure degrades first: when degrades alone bring held under the high watermark, nobody
 * is evicted, even if held stays above the low watermark. */
/* The watermarks' boundaries, pinned: held at exactly the high watermark is not pressure;
 * pressure stops once held is projected at or under the low watermark (exactly is enough). */
static void test_pressure_boundaries_are_exact(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 80000, 2000); /* usable 80000: 95% = 76000, 90% = 72000 */
    assert_int_equal(sub(e, spec("o", "online", 40000, 1, 0), 0), OSUB_SUBMIT_STARTED);
    running(e, spec("p", "batch", 36000, 1, 32000), 36000, 0);
    assert_int_equal(osub_engine_tick(e, 100000), 0);
    assert_int_equal(ginfo(e, 0).held_mib, 76000);
    assert_int_equal(info(e, "p").state, OSUB_STATE_RUNNING); /* exactly 95%: no pressure */
    assert_int_equal(osub_engine_usage(e, "p", 36001, -1, 100001), 0);
    /* 76001 > 95%: degrading p to its floor projects 40000 + 32000 = 72000, exactly 90% */
    assert_int_equal(info(e, "p").state, OSUB_STATE_DEGRADED);
    assert_int_equal(info(e, "p").grant_mib, 32000);
    osub_pool_info_t pi;
    osub_engine_pool_info(e, &pi);
    assert_int_equal(pi.evictions, 0);
    check_ok(e);
    osub_engine_free(e);
}

static void test_pressure_degrades_before_any_eviction(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("web", "online", 24000, 1, 0), 24000, 0);
    running(e, spec("bat", "batch", 30720, 1, 20000), 20000, 0);
    running(e, spec("exp", "experiment", 33000, 1, 30000), 20000, 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_RUNNING);
    /* exp grows: 24000 + 20000 + 36000 = 80000 > 77824; degrading exp to 30000 gives 74000,
     * under the high watermark but above the low one (73728) */
    assert_int_equal(osub_engine_usage(e, "exp", 36000, -1, 1000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
    assert_non_null(find_ev(e, OSUB_EV_DEGRADE, "exp"));
    assert_int_equal(info(e, "exp").state, OSUB_STATE_DEGRADED);
    assert_int_equal(osub_engine_usage(e, "exp", 30000, -1, 2000), 0); /* complies */
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
    assert_true(ginfo(e, 0).held_mib <= 77824);
    check_ok(e);
    osub_engine_free(e);
}

/* No start pushes a GPU that holds preemptible services into pressure; backed services next
 * to backed ones only may fill the GPU (DESIGN's worked scenario, step 3). */
static void test_backed_start_never_causes_pressure(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(2, 81920, 2000);
    running(e, spec("bat", "batch", 40960, 1, 0), 30000, 0);
    osub_spec_t big = spec("web", "online", 50000, 1, 0);
    assert_int_equal(osub_engine_cordon(e, 1, true, 1), 0);
    /* 30000 + 50000 = 80000: under usable, above the high watermark: the batch job must go,
     * as the arrival's victim (it used to start at once and leave the GPU to pressure) */
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &big, 10, 0, &r), 0);
    assert_int_equal(r.n_victims, 1);
    assert_true(r.victims[0].evict);
    const osub_event_t *ev = find_ev(e, OSUB_EV_EVICT, "bat");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_PREEMPTION);
    assert_int_equal(osub_engine_cordon(e, 1, false, 20), 0);
    assert_int_equal(sub(e, spec("c1", "online", 40960, 1, 0), 30), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("c2", "online", 40960, 1, 0), 40), OSUB_SUBMIT_STARTED);
    assert_int_equal(ginfo(e, 1).held_mib, 81920);
    check_ok(e);
    osub_engine_free(e);
}

/* A degradable newcomer with no room for its request starts at its floor at once, without a
 * victim, where every service of the pool is measured (no room for its request is still to come
 * from one settling); while one is still loading it waits, up to floor_start_after_ms
 * (docs/engine.md, "Degraded starts"). One that is not degradable waits for its whole request. */
static void test_degraded_start_at_once_where_measured(void **state)
{
    (void)state;
    int64_t v[2] = {81920, 81920};
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 2000;
    osub_engine_t *e = mk_engine_cfg(2, v, &cfg);
    running(e, spec("bat", "batch", 40960, 1, 40960), 40000, 0);
    /* GPU 1: an online service still loading */
    assert_int_equal(sub(e, spec("web", "online", 40960, 1, 0), 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(info(e, "web").slots[0].gpu, 1);
    osub_submit_result_t r;
    osub_spec_t ex = spec("exp", "experiment", 50000, 1, 20000);
    assert_int_equal(osub_engine_submit(e, &ex, 10, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED); /* web may yet leave room for 50000 */
    /* web measured at 40000: no room for 50000 on either GPU, none to come */
    assert_int_equal(osub_engine_usage(e, "web", 40000, -1, 20), 0);
    assert_int_equal(osub_engine_ready(e, "web", 30), 0);
    osub_service_info_t x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_DEGRADED);
    assert_int_equal(x.grant_mib, 20000);
    const osub_event_t *ev = find_ev(e, OSUB_EV_DEGRADE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_START_FLOOR);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
    /* the next one finds exp not yet measured: it waits, then starts at its floor once exp
     * has reported */
    osub_spec_t ex2 = spec("exp2", "experiment", 50000, 1, 20000);
    assert_int_equal(osub_engine_submit(e, &ex2, 40, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    assert_int_equal(osub_engine_usage(e, "exp", 15000, -1, 50), 0);
    assert_int_equal(osub_engine_ready(e, "exp", 60), 0);
    assert_int_equal(info(e, "exp2").state, OSUB_STATE_DEGRADED);
    assert_int_not_equal(info(e, "exp2").slots[0].gpu, x.slots[0].gpu);
    /* not degradable (no floor): it waits for its whole request */
    assert_int_equal(sub(e, spec("exp3", "experiment", 50000, 1, 0), 70), OSUB_SUBMIT_QUEUED);
    check_ok(e);
    osub_engine_free(e);
}

/* A degraded service whose acknowledgement is still due is not measured: its memory is about to
 * fall to its floor, which may leave room for a queued service's whole request (found by an
 * attack: q started at its floor on the other GPU, and stayed degraded there). */
static void test_no_degraded_start_while_a_degrade_is_due(void **state)
{
    (void)state;
    int64_t v[2] = {100000, 100000};
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 2000;
    osub_engine_t *e = mk_engine_cfg(2, v, &cfg);
    osub_submit_result_t r;
    osub_spec_t a = spec("a", "online", 30000, 1, 0), b = spec("b", "online", 80000, 1, 0),
                d = spec("d", "batch", 60000, 1, 20000);
    assert_int_equal(osub_engine_submit(e, &a, 0, OSUB_SUBMIT_RUNNING, &r), 0);
    assert_int_equal(osub_engine_submit(e, &b, 0, OSUB_SUBMIT_RUNNING, &r), 0);
    assert_int_equal(osub_engine_submit(e, &d, 0, OSUB_SUBMIT_RUNNING, &r), 0);
    assert_int_equal(info(e, "d").slots[0].gpu, info(e, "a").slots[0].gpu);
    assert_int_equal(osub_engine_usage(e, "a", 30000, -1, 1000), 0);
    assert_int_equal(osub_engine_usage(e, "b", 80000, -1, 1000), 0);
    assert_int_equal(osub_engine_usage(e, "d", 66000, -1, 2000), 0); /* pressure: degraded */
    assert_true(info(e, "d").ack_pending);
    osub_spec_t q = spec("q", "experiment", 40000, 1, 10000);
    assert_int_equal(osub_engine_submit(e, &q, 3000, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    /* d complies: 50000 held on its GPU, room for all of q there */
    assert_int_equal(osub_engine_usage(e, "d", 20000, -1, 5000), 0);
    assert_int_equal(osub_engine_tick(e, 6000), 0);
    osub_service_info_t x = info(e, "q");
    assert_int_equal(x.state, OSUB_STATE_LOADING);
    assert_int_equal(x.grant_mib, 40000);
    check_ok(e);
    osub_engine_free(e);
}

/* Two degraded services on one GPU with room for one: only one is restored (they used to
 * be restored together against the same free memory, and pressure took one back). */
static void test_restores_share_one_room(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("web", "online", 50000, 1, 0), 50000, 0);
    osub_spec_t a = spec("a", "experiment", 40000, 1, 10000);
    osub_spec_t b = spec("b", "experiment", 40000, 1, 10000);
    /* web is measured: a starts at its floor at once; b finds a loading there and waits */
    assert_int_equal(sub(e, a, 10), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, b, 20), OSUB_SUBMIT_QUEUED);
    assert_int_equal(osub_engine_tick(e, 120020), 0); /* b waited long enough */
    assert_int_equal(info(e, "a").state, OSUB_STATE_DEGRADED);
    assert_int_equal(info(e, "b").state, OSUB_STATE_DEGRADED);
    assert_int_equal(osub_engine_release(e, "web", 120030), 0);
    int restores = 0;
    for (int64_t t = 121000; t <= 420000; t += 1000) {
        assert_int_equal(osub_engine_usage(e, "a", 10000, -1, t), 0);
        assert_int_equal(osub_engine_usage(e, "b", 10000, -1, t), 0);
        assert_int_equal(osub_engine_tick(e, t), 0);
        restores += count_ev(e, OSUB_EV_RESTORE, NULL);
        /* each needs room for its predicted peak (about its request this young): one fits */
        assert_true(restores <= 1);
    }
    assert_int_equal(restores, 1);
    assert_int_equal(count_ev(e, OSUB_EV_DEGRADE, NULL), 0);
    check_ok(e);
    osub_engine_free(e);
}

static void test_pressure_degrades_then_evicts_lowest_first(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("web", "online", 20480, 1, 0), 20480, 0);
    running(e, spec("bat", "batch", 30720, 1, 10240), 20000, 0);
    running(e, spec("exp", "experiment", 30720, 1, 10240), 20000, 0);
    assert_int_equal(count_ev(e, OSUB_EV_DEGRADE, NULL), 0);
    /* the experiment grows: held 20480 + 20000 + 38000 = 78480 > 95% of 81920 */
    assert_int_equal(osub_engine_usage(e, "exp", 38000, -1, 1000), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_DEGRADE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_PRESSURE);
    assert_int_equal(count_ev(e, OSUB_EV_DEGRADE, "bat"), 0);
    assert_int_equal(info(e, "exp").grant_mib, 10240);
    /* it acknowledges (usage under its grant): pressure is gone */
    assert_int_equal(osub_engine_usage(e, "exp", 10000, -1, 2000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_ACK, "exp"), 1);
    assert_false(info(e, "exp").ack_pending);
    /* the batch job now grows past the watermark: under pressure every level's degrades come
     * before any eviction, so the batch job is degraded and the experiment stays */
    assert_int_equal(osub_engine_usage(e, "bat", 50000, -1, 3000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_DEGRADE, "bat"), 1);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
    assert_int_equal(osub_engine_usage(e, "bat", 10000, -1, 4000), 0);
    /* nothing left to degrade: the experiment, grown past its floor, is evicted first */
    assert_int_equal(osub_engine_usage(e, "exp", 50000, -1, 5000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, "exp"), 1);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, "bat"), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_RUNNING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_restore_after_window_without_flapping(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    osub_spec_t s = spec("exp", "experiment", 40960, 1, 20480);
    s.batch_size = 32;
    s.min_batch_size = 8;
    running(e, spec("web", "online", 20480, 1, 0), 20480, 0);
    running(e, spec("bat", "batch", 40960, 1, 0), 10000, 0);
    running(e, s, 30000, 0);
    /* a usage spike past the high watermark degrades the experiment; it acknowledges */
    assert_int_equal(osub_engine_usage(e, "exp", 50000, -1, 1000), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_DEGRADED);
    assert_int_equal(info(e, "exp").batch_size, 8);
    assert_int_equal(osub_engine_ack(e, "exp", NULL, 1500), 0);
    assert_int_equal(osub_engine_usage(e, "exp", 15000, -1, 2000), 0);
    /* the batch job's usage oscillates: room for the full 40960 comes and goes (room needs
     * 20480 + bat + 40960 <= 90% of 81920, so bat <= 12288): no restore */
    int restores = 0;
    int64_t t = 2000;
    for (int i = 0; i < 60; i++) {
        t += 5000;
        int64_t used = (i % 4 == 3) ? 30000 : 10000;
        assert_int_equal(osub_engine_usage(e, "bat", used, -1, t), 0);
        assert_int_equal(osub_engine_tick(e, t), 0);
        restores += count_ev(e, OSUB_EV_RESTORE, "exp");
    }
    assert_int_equal(restores, 0);
    /* steady room for the hysteresis window: restored exactly once. The room must also hold
     * what the batch job may still rise to (its predicted peak, near its 40960 MiB request
     * after a few minutes of history), so it leaves first */
    t += 5000;
    assert_int_equal(osub_engine_release(e, "bat", t), 0);
    for (int i = 0; i < 30; i++) {
        t += 5000;
        assert_int_equal(osub_engine_usage(e, "exp", 15000, -1, t), 0);
        assert_int_equal(osub_engine_tick(e, t), 0);
        restores += count_ev(e, OSUB_EV_RESTORE, "exp");
    }
    assert_int_equal(restores, 1);
    osub_service_info_t si = info(e, "exp");
    assert_int_equal(si.state, OSUB_STATE_RUNNING);
    assert_int_equal(si.grant_mib, 40960);
    assert_int_equal(si.batch_size, 32);
    check_ok(e);
    osub_engine_free(e);
}

static void test_queue_order_and_backfill(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(2, 81920, 1000);
    running(e, spec("a", "batch", 81920, 1, 0), 70000, 0);
    running(e, spec("b", "batch", 61440, 1, 0), 60000, 0);
    /* queued: an experiment first, then a batch job (higher priority goes first) */
    assert_int_equal(sub(e, spec("exp-big", "experiment", 81920, 1, 0), 10), OSUB_SUBMIT_QUEUED);
    assert_int_equal(sub(e, spec("bat-big", "batch", 81920, 1, 0), 20), OSUB_SUBMIT_QUEUED);
    assert_string_equal(osub_engine_queue_at(e, 0), "bat-big");
    assert_string_equal(osub_engine_queue_at(e, 1), "exp-big");
    assert_int_equal(info(e, "exp-big").queue_position, 2);
    /* a small experiment fits GPU 1 now (20480 free): it may backfill only if it does not
     * sit on the GPU the head waits for */
    osub_submit_result_t r;
    osub_spec_t small = spec("small", "experiment", 16384, 1, 0);
    assert_int_equal(osub_engine_submit(e, &small, 30, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    /* releasing a frees GPU 0: the batch head goes first, then small backfills on GPU 1 */
    assert_int_equal(osub_engine_release(e, "a", 40), 0);
    assert_int_equal(info(e, "bat-big").state, OSUB_STATE_LOADING);
    assert_int_equal(info(e, "bat-big").slots[0].gpu, 0);
    assert_int_equal(info(e, "exp-big").state, OSUB_STATE_QUEUED);
    assert_int_equal(info(e, "small").state, OSUB_STATE_QUEUED);
    check_ok(e);
    osub_engine_free(e);
}

static void test_backfill_away_from_head_and_aging(void **state)
{
    (void)state;
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 1000;
    cfg.queue_aging_ms = 60000;
    int64_t v[2] = {81920, 81920};
    osub_engine_t *e = mk_engine_cfg(2, v, &cfg);
    running(e, spec("a", "batch", 61440, 1, 0), 61440, 0);
    running(e, spec("b", "batch", 40960, 1, 0), 40960, 0);
    /* the head wants 40960 on one GPU: GPU 0 has 20480 left, GPU 1 has 40960 - it waits
     * for neither? GPU 1 fits: so make the head bigger than both */
    assert_int_equal(sub(e, spec("head", "batch", 61440, 1, 0), 10), OSUB_SUBMIT_QUEUED);
    /* a small one that fits GPU 0 (not the head's GPU 1, where the head is shortest) */
    osub_submit_result_t r;
    osub_spec_t s1 = spec("small", "batch", 16384, 1, 0);
    assert_int_equal(osub_engine_submit(e, &s1, 20, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_STARTED);
    assert_int_equal(r.gpus[0], 0);
    /* after the aging bound nothing passes the head */
    osub_spec_t s2 = spec("tiny", "batch", 1024, 1, 0);
    assert_int_equal(osub_engine_submit(e, &s2, 70000, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    /* a higher priority arrival is not a backfill */
    osub_spec_t s3 = spec("web", "online", 1024, 1, 0);
    assert_int_equal(osub_engine_submit(e, &s3, 70001, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_STARTED);
    check_ok(e);
    osub_engine_free(e);
}

/* A submit refused because the queue's head comes first says so (check none, no shortfall),
 * even when another GPU size's search noted a closest miss on its way. */
static void test_refusal_behind_the_head_has_no_shortfall(void **state)
{
    (void)state;
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 1000;
    int64_t v[2] = {40960, 81920}; /* the 40960 size is searched first */
    osub_engine_t *e = mk_engine_cfg(2, v, &cfg);
    running(e, spec("a", "online", 61440, 1, 0), 61440, 0);
    running(e, spec("w", "online", 36864, 1, 0), 36864, 0);
    assert_int_equal(info(e, "a").slots[0].gpu, 1);
    assert_int_equal(info(e, "w").slots[0].gpu, 0);
    /* the head waits for GPU 1, the only one large enough */
    assert_int_equal(sub(e, spec("head", "batch", 81920, 1, 0), 10), OSUB_SUBMIT_QUEUED);
    /* GPU 0 is 12288 short (its P0 cannot give way); GPU 1 fits now, but the head waits
     * for it: queued, and the reason is the head, not GPU 0's shortfall */
    osub_submit_result_t r;
    osub_spec_t s = spec("small", "batch", 16384, 1, 0);
    assert_int_equal(osub_engine_submit(e, &s, 20, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    assert_int_equal(r.check, OSUB_CHECK_NONE);
    assert_int_equal(r.check_gpu, -1);
    assert_int_equal(r.shortfall_mib, 0);
    const osub_event_t *q = find_ev(e, OSUB_EV_QUEUE, "small");
    assert_non_null(q);
    assert_non_null(strstr(q->msg, "it may not go ahead of the queue's head"));
    assert_null(strstr(q->msg, "short by"));
    check_ok(e);
    osub_engine_free(e);
}

static void test_lowering_ratio_never_evicts(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("a", "batch", 61440, 1, 0), 30000, 0);
    running(e, spec("b", "batch", 40960, 1, 0), 30000, 0);
    assert_int_equal(osub_engine_set_ratio(e, 1000, 10), 0);
    assert_int_equal(count_ev(e, OSUB_EV_OVERCOMMIT, NULL), 1);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL) + count_ev(e, OSUB_EV_DEGRADE, NULL), 0);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_true(p.overcommitted);
    /* nothing is admitted, even something tiny */
    osub_submit_result_t r;
    osub_spec_t t = spec("tiny", "batch", 10, 1, 0);
    assert_int_equal(osub_engine_submit(e, &t, 20, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    osub_spec_t w = spec("web", "online", 10, 1, 0);
    assert_int_equal(osub_engine_submit(e, &w, 20, 0, &r), OSUB_EOVERCOMMITTED);
    /* grants fit again after a release: admissions resume and the queue is served */
    assert_int_equal(osub_engine_release(e, "b", 30), 0);
    osub_engine_pool_info(e, &p);
    assert_false(p.overcommitted);
    assert_int_equal(info(e, "tiny").state, OSUB_STATE_LOADING);
    /* raising the ratio admits from the queue */
    assert_int_equal(sub(e, spec("c", "batch", 40960, 1, 0), 40), OSUB_SUBMIT_QUEUED);
    assert_int_equal(osub_engine_set_ratio(e, 2500, 50), 0);
    assert_int_equal(info(e, "c").state, OSUB_STATE_LOADING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_gpu_lost_takes_its_services(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(3, 81920, 1500);
    running(e, spec("web", "online", 81920, 1, 0), 81920, 0);
    osub_spec_t j = spec("job", "batch", 40960, 1, 0);
    j.resumable = true;
    running(e, j, 30000, 0);
    int32_t g = info(e, "web").slots[0].gpu;
    int32_t gj = info(e, "job").slots[0].gpu;
    assert_int_not_equal(g, gj);
    assert_int_equal(osub_engine_gpu_lost(e, g, 100), 0);
    assert_int_equal(count_ev(e, OSUB_EV_GPU_LOST, NULL), 1);
    /* the backed service goes too; a fresh GPU takes it? no: online is not queued */
    osub_service_info_t si;
    assert_int_equal(osub_engine_service_info(e, "web", &si), OSUB_EUNKNOWN_SERVICE);
    assert_true(ginfo(e, g).lost);
    assert_int_equal(ginfo(e, g).held_mib, 0);
    assert_int_equal(osub_engine_gpu_lost(e, gj, 200), 0);
    /* the resumable job is requeued and resumes at once on the remaining GPU */
    si = info(e, "job");
    assert_int_equal(si.state, OSUB_STATE_LOADING);
    assert_true(si.resumed);
    assert_int_equal(count_ev(e, OSUB_EV_RESUME, "job"), 1);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.n_gpus, 1);
    assert_int_equal(p.n_lost, 2);
    assert_int_equal(osub_engine_cordon(e, g, true, 300), OSUB_EGPU_LOST);
    check_ok(e);
    osub_engine_free(e);
}

static void test_exclusive_takes_whole_gpus(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(2, 81920, 2000);
    running(e, spec("exp", "experiment", 10240, 1, 0), 10000, 0);
    osub_spec_t x = spec("safe", "online", 20480, 1, 0);
    x.exclusive = true;
    assert_int_equal(sub(e, x, 10), OSUB_SUBMIT_STARTED);
    osub_service_info_t si = info(e, "safe");
    assert_int_equal(si.slots[0].gpu, 1); /* GPU 0 is not empty */
    assert_int_equal(si.grant_mib, 81920);
    assert_true(ginfo(e, 1).exclusive);
    /* nobody shares it, and it is never oversold */
    osub_submit_result_t r;
    osub_spec_t y = spec("other", "online", 1024, 1, 0);
    assert_int_equal(osub_engine_submit(e, &y, 20, 0, &r), 0);
    assert_int_equal(r.gpus[0], 0);
    /* a second exclusive service evicts the experiment to get a GPU to itself */
    osub_spec_t z = spec("safe2", "online", 1024, 1, 0);
    z.exclusive = true;
    assert_int_equal(osub_engine_submit(e, &z, 30, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(osub_engine_release(e, "other", 40), 0);
    assert_int_equal(osub_engine_submit(e, &z, 50, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    assert_string_equal(r.victims[0].service, "exp");
    assert_true(r.victims[0].evict);
    assert_int_equal(osub_engine_exited(e, "exp", NULL, 60), 0);
    assert_int_equal(info(e, "safe2").state, OSUB_STATE_LOADING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_multi_gpu_victim_degraded_everywhere(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(2, 81920, 2000);
    osub_spec_t m = spec("multi", "experiment", 122880, 2, 40960);
    running(e, m, 2 * 60000, 0);
    osub_submit_result_t r;
    osub_spec_t w = spec("web", "online", 40960, 1, 0);
    assert_int_equal(osub_engine_submit(e, &w, 10, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    osub_service_info_t si = info(e, "multi");
    assert_int_equal(si.state, OSUB_STATE_DEGRADED);
    assert_int_equal(si.slots[0].grant_mib, 20480);
    assert_int_equal(si.slots[1].grant_mib, 20480);
    /* per-GPU usage at or under the new grant is the acknowledgement */
    int64_t u[2] = {20000, 20480};
    assert_int_equal(osub_engine_usage_per_gpu(e, "multi", u, 2, 20), 0);
    assert_int_equal(count_ev(e, OSUB_EV_ACK, "multi"), 1);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_resumed_work_protected_then_pressure_overrides(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    osub_spec_t j = spec("job", "experiment", 61440, 1, 0);
    j.resumable = true;
    running(e, j, 60000, 0);
    /* evicted once for an online service, requeued, resumed after it leaves */
    assert_int_equal(sub(e, spec("web", "online", 40960, 1, 0), 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(osub_engine_exited(e, "job", "step-100", 20), 0);
    assert_int_equal(info(e, "job").state, OSUB_STATE_QUEUED);
    assert_int_equal(osub_engine_release(e, "web", 30), 0);
    osub_service_info_t si = info(e, "job");
    assert_int_equal(si.state, OSUB_STATE_LOADING);
    assert_true(si.resumed);
    assert_string_equal(si.checkpoint, "step-100");
    assert_int_equal(osub_engine_ready(e, "job", 40), 0);
    assert_int_equal(osub_engine_usage(e, "job", 60000, -1, 40), 0);
    /* within its minimum runtime a second online arrival cannot evict it */
    osub_submit_result_t r;
    osub_spec_t w2 = spec("web2", "online", 40960, 1, 0);
    assert_int_equal(osub_engine_submit(e, &w2, 1000, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(info(e, "job").state, OSUB_STATE_RUNNING);
    /* but pressure overrides the protection */
    assert_int_equal(osub_engine_usage(e, "job", 80000, -1, 2000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, "job"), 1);
    /* after the minimum runtime, preemption may evict it again */
    check_ok(e);
    osub_engine_free(e);
}

static void test_overdue_then_pending_requeued(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("exp", "experiment", 61440, 1, 0), 60000, 0);
    assert_int_equal(sub(e, spec("bat", "batch", 40960, 1, 0), 1000), OSUB_SUBMIT_PENDING);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_DRAINING);
    assert_int_equal(info(e, "exp").deadline_ms, 31000);
    assert_int_equal(osub_engine_tick(e, 31000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_OVERDUE, "exp"), 1);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_OVERDUE);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_PENDING);
    assert_int_equal(osub_engine_tick(e, 61000), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_REQUEUE, "bat");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_VICTIM_OVERDUE);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_QUEUED);
    /* the memory finally comes free: the queued batch job starts */
    assert_int_equal(osub_engine_exited(e, "exp", NULL, 70000), 0);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_LOADING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_placement_respects_past_peaks(void **state)
{
    (void)state;
    /* two GPUs with the same held now; GPU 0 peaked at 70000 ten minutes ago. A newcomer
     * goes to GPU 1, whose projected memory leaves room. */
    osub_engine_t *e = mk_engine(2, 81920, 2000);
    running(e, spec("a", "batch", 61440, 1, 0), 10000, 0);
    running(e, spec("b", "batch", 40960, 1, 0), 10000, 0);
    assert_int_equal(info(e, "a").slots[0].gpu, 0);
    assert_int_equal(info(e, "b").slots[0].gpu, 1);
    assert_int_equal(osub_engine_usage(e, "a", 70000, -1, 60000), 0);
    assert_int_equal(osub_engine_usage(e, "a", 10000, -1, 120000), 0);
    osub_submit_result_t r;
    osub_spec_t c = spec("c", "batch", 20480, 1, 0);
    assert_int_equal(osub_engine_submit(e, &c, 600000, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_STARTED);
    assert_int_equal(r.gpus[0], 1);
    /* past the one-hour window the GPU's history has forgotten the peak, but a's own
     * predicted peak has not (it rose to 70000, capped by its 61440 grant): GPU 0 may still
     * rise by 51440, GPU 1 by less, so c still goes to GPU 1 */
    assert_int_equal(osub_engine_release(e, "c", 600001), 0);
    assert_int_equal(osub_engine_submit(e, &c, 60000 * 125, 0, &r), 0);
    assert_int_equal(r.gpus[0], 1);
    assert_int_equal(info(e, "a").predicted_peak_mib, 61440);
    check_ok(e);
    osub_engine_free(e);
}

/* A GPU's held history forgets a service that left it and a loading reservation that ended:
 * neither is a peak of what the GPU holds now. */
static void test_history_forgets_departures_and_reservations(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("a", "batch", 61440, 1, 0), 60000, 0);
    assert_int_equal(osub_engine_release(e, "a", 60000), 0);
    osub_spec_t b = spec("b", "batch", 20480, 1, 0);
    assert_int_equal(sub(e, b, 120000), OSUB_SUBMIT_STARTED);
    osub_service_info_t x = info(e, "b");
    /* only b itself: a's 60000 left with a */
    assert_int_equal(x.place_projected_mib, 20480);
    assert_int_equal(x.place_charge_mib, 20480);
    assert_int_equal(x.place_limit_mib, 81920 * 95 / 100);
    /* b loads at its grant, then reports 5000: the reservation is not a peak any more */
    assert_int_equal(osub_engine_ready(e, "b", 130000), 0);
    assert_int_equal(osub_engine_usage(e, "b", 5000, -1, 130000), 0);
    osub_spec_t c = spec("c", "online", 10240, 1, 0);
    assert_int_equal(sub(e, c, 140000), OSUB_SUBMIT_STARTED);
    x = info(e, "c");
    /* b's held (5000) plus the rise its young prediction still allows (near its request),
     * plus c: never b's 20480 reservation counted on top */
    assert_true(x.place_projected_mib <= 20480 + 10240);
    assert_true(x.place_projected_mib >= 5000 + 10240);
    check_ok(e);
    osub_engine_free(e);
}

/* An adopted service (already running when oversubd restarts) that had to wait for a victim:
 * what it held while pending was a reservation, not a peak of its GPU. */
static void test_adopted_pending_reservation_is_not_a_peak(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("x", "experiment", 61440, 1, 0), 61440, 0);
    osub_spec_t o = spec("o", "batch", 40960, 1, 0);
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &o, 1000, OSUB_SUBMIT_RUNNING, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    assert_int_equal(osub_engine_exited(e, "x", NULL, 2000), 0);
    assert_int_equal(info(e, "o").state, OSUB_STATE_RUNNING); /* adopted: no loading */
    assert_int_equal(osub_engine_usage(e, "o", 1000, -1, 2000), 0);
    assert_int_equal(osub_engine_usage(e, "o", 1000, -1, 1800000), 0);
    osub_spec_t n = spec("n", "batch", 10240, 1, 0);
    assert_int_equal(sub(e, n, 1800000), OSUB_SUBMIT_STARTED);
    osub_service_info_t x = info(e, "n");
    /* o's prediction after half an hour at 1000 MiB is well under its 40960 request; the
     * 40960 it held while pending must not come back as the GPU's peak */
    assert_true(info(e, "o").predicted_peak_mib < 40960);
    assert_true(x.place_projected_mib < 40960 + 10240);
    check_ok(e);
    osub_engine_free(e);
}

/* A multi-GPU request that only some GPUs could take: the refusal names a GPU that cannot
 * and by how much, never one that can with "short by 0 MiB". */
static void test_multi_gpu_refusal_names_the_closest_miss(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(4, 81920, 1000);
    assert_int_equal(sub(e, spec("a", "online", 71680, 1, 0), 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("b", "online", 71680, 1, 0), 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("c", "online", 61440, 1, 0), 0), OSUB_SUBMIT_STARTED);
    osub_spec_t w = spec("w", "online", 102400, 2, 0);
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &w, 10, 0, &r), OSUB_ENO_ROOM);
    int32_t free_gpu = -1;
    for (int32_t g = 0; g < 4; g++)
        if (ginfo(e, g).n_services == 0)
            free_gpu = g;
    assert_true(free_gpu >= 0);
    assert_int_not_equal(r.check_gpu, free_gpu);
    /* the closest miss is c's GPU: 61440 + 51200 over 81920 logical */
    assert_int_equal(r.check, OSUB_CHECK_LOGICAL);
    assert_int_equal(r.shortfall_mib, 61440 + 51200 - 81920);
    assert_int_equal(r.check_gpu, info(e, "c").slots[0].gpu);
    size_t nev;
    const osub_event_t *ev = osub_engine_events(e, &nev);
    assert_int_equal(nev, 1);
    assert_non_null(strstr(ev[0].msg, "only 1 of the 2 GPUs it needs"));
    /* the other GPUs out of reach (cordoned): the GPUs short, not a GPU that fits */
    assert_int_equal(osub_engine_cordon(e, free_gpu, true, 20), 0);
    assert_int_equal(osub_engine_cordon(e, info(e, "a").slots[0].gpu, true, 20), 0);
    assert_int_equal(osub_engine_cordon(e, info(e, "b").slots[0].gpu, true, 20), 0);
    osub_spec_t w2 = spec("w2", "online", 3 * 5120, 3, 0);
    assert_int_equal(osub_engine_submit(e, &w2, 30, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(r.check, OSUB_CHECK_GPUS);
    assert_int_equal(r.shortfall_mib, 2); /* only c's GPU takes a share: two short */
    for (int32_t g = 0; g < 4; g++)
        assert_int_equal(osub_engine_cordon(e, g, true, 40), 0);
    osub_spec_t one = spec("one", "batch", 1024, 1, 0);
    one.queue = OSUB_TRI_NO;
    assert_int_equal(osub_engine_submit(e, &one, 50, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(r.check, OSUB_CHECK_GPUS);
    check_ok(e);
    osub_engine_free(e);
}

static void test_loading_holds_its_grant(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    osub_spec_t a = spec("a", "batch", 61440, 1, 0);
    a.restart_cost_ms = 30000;
    assert_int_equal(sub(e, a, 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(osub_engine_usage(e, "a", 1000, -1, 10), 0);
    assert_int_equal(info(e, "a").held_mib, 61440); /* max(used, grant) while loading */
    /* a newcomer cannot move into the half-loaded model's space */
    osub_spec_t b = spec("b", "batch", 40960, 1, 0);
    b.queue = OSUB_TRI_NO;
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &b, 20, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(r.check, OSUB_CHECK_HELD);
    /* a preemptible newcomer must also stay under the high watermark: 95% of 81920 */
    assert_int_equal(r.shortfall_mib, 61440 + 40960 - 77824);
    /* the loading period ends: held follows usage */
    assert_int_equal(osub_engine_tick(e, 30000), 0);
    assert_int_equal(info(e, "a").state, OSUB_STATE_RUNNING);
    assert_int_equal(info(e, "a").held_mib, 1000);
    assert_int_equal(osub_engine_submit(e, &b, 30001, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_STARTED);
    check_ok(e);
    osub_engine_free(e);
}

static void test_pending_grant_counts_for_others(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    running(e, spec("exp", "experiment", 61440, 1, 0), 60000, 0);
    assert_int_equal(sub(e, spec("web", "online", 40960, 1, 0), 10), OSUB_SUBMIT_PENDING);
    /* the room freed for web is not taken by a later arrival */
    osub_spec_t b = spec("b", "batch", 30000, 1, 0);
    b.queue = OSUB_TRI_NO;
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &b, 20, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(osub_engine_exited(e, "exp", NULL, 30), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_cordon_and_drain(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(2, 81920, 1500);
    running(e, spec("a", "batch", 40960, 1, 0), 30000, 0);
    running(e, spec("w", "online", 20480, 1, 0), 20480, 0);
    assert_int_equal(info(e, "a").slots[0].gpu, info(e, "w").slots[0].gpu);
    int32_t g = info(e, "a").slots[0].gpu;
    assert_int_equal(osub_engine_cordon(e, g, true, 10), 0);
    osub_submit_result_t r;
    osub_spec_t b = spec("b", "batch", 1024, 1, 0);
    assert_int_equal(osub_engine_submit(e, &b, 20, 0, &r), 0);
    assert_int_not_equal(r.gpus[0], g);
    assert_int_equal(osub_engine_drain_gpu(e, g, 30), 0);
    assert_int_equal(info(e, "a").state, OSUB_STATE_DRAINING); /* preemptible: evicted */
    assert_int_equal(info(e, "w").state, OSUB_STATE_RUNNING);  /* backed: stays */
    check_ok(e);
    osub_engine_free(e);
}

static void test_compute_claims(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    osub_spec_t a = spec("a", "online", 10240, 1, 0);
    a.compute_pct = 80;
    assert_int_equal(sub(e, a, 0), OSUB_SUBMIT_STARTED);
    osub_spec_t b = spec("b", "online", 10240, 1, 0);
    b.compute_pct = 30; /* backed claims would be 110 > 100 */
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &b, 1, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(r.check, OSUB_CHECK_COMPUTE);
    osub_spec_t c = spec("c", "batch", 10240, 1, 0);
    c.compute_pct = 100; /* all claims 180 <= 200 */
    assert_int_equal(osub_engine_submit(e, &c, 2, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_STARTED);
    assert_int_equal(ginfo(e, 0).compute_claimed_pct, 180);
    check_ok(e);
    osub_engine_free(e);
}

static void test_compute_contention_cuts_batch_only(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 2000);
    osub_spec_t web = spec("web", "online", 20480, 1, 0);
    web.batch_size = 16;
    web.min_batch_size = 4;
    running(e, web, 20000, 0);
    osub_spec_t bat = spec("bat", "batch", 20480, 1, 10240);
    bat.batch_size = 32;
    bat.min_batch_size = 8;
    running(e, bat, 20000, 0);
    osub_spec_t exp = spec("exp", "experiment", 20480, 1, 10240);
    exp.batch_size = 32;
    exp.min_batch_size = 4;
    running(e, exp, 20000, 0);
    assert_int_equal(osub_engine_usage(e, "web", 20000, 60, 1000), 0);
    assert_int_equal(osub_engine_usage(e, "bat", 20000, 30, 1000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_DEGRADE, NULL), 0);
    /* the experiment pushes the GPU to 130%: its batch is cut, its memory is not */
    assert_int_equal(osub_engine_usage(e, "exp", 20000, 40, 2000), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_DEGRADE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_COMPUTE);
    osub_service_info_t si = info(e, "exp");
    assert_int_equal(si.batch_size, 4);
    assert_int_equal(si.grant_mib, 20480);
    assert_int_equal(si.state, OSUB_STATE_RUNNING);
    /* still contended: the batch job is next, never the online service, nobody evicted */
    assert_int_equal(osub_engine_usage(e, "bat", 20000, 35, 3000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_DEGRADE, "bat"), 1);
    assert_int_equal(osub_engine_usage(e, "exp", 20000, 40, 4000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_DEGRADE, "web"), 0);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
    assert_int_equal(info(e, "web").batch_size, 16);
    /* calm for the hysteresis window: batches come back */
    assert_int_equal(osub_engine_usage(e, "exp", 20000, 5, 5000), 0);
    assert_int_equal(osub_engine_usage(e, "bat", 20000, 5, 5000), 0);
    int restores = 0;
    for (int64_t t = 6000; t <= 80000; t += 5000) {
        assert_int_equal(osub_engine_tick(e, t), 0);
        restores += count_ev(e, OSUB_EV_RESTORE, NULL);
    }
    assert_int_equal(restores, 2);
    assert_int_equal(info(e, "exp").batch_size, 32);
    assert_int_equal(info(e, "bat").batch_size, 32);
    check_ok(e);
    osub_engine_free(e);
}

/* A release whose process still holds its memory (osub_engine_release_measured): what it used
 * stays counted as system memory on its GPU, so a queued service is not started into it; the
 * next measurement of the GPU frees it. */
static void test_release_measured_keeps_memory(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 1000);
    running(e, spec("old", "batch", 60000, 1, 0), 50000, 0);
    assert_int_equal(sub(e, spec("new", "batch", 60000, 1, 0), 10), OSUB_SUBMIT_QUEUED);
    assert_int_equal(osub_engine_release_measured(e, "old", 20), 0);
    osub_gpu_info_t g;
    assert_int_equal(osub_engine_gpu_info(e, 0, &g), 0);
    assert_int_equal(g.system_mib, 50000);
    assert_int_equal(info(e, "new").state, OSUB_STATE_QUEUED);
    check_ok(e);
    /* the process is seen gone: the room is there, and the queued one starts */
    assert_int_equal(osub_engine_system_usage(e, 0, 0, 30), 0);
    assert_int_equal(info(e, "new").state, OSUB_STATE_LOADING);
    check_ok(e);
    assert_int_equal(osub_engine_release_measured(e, "nobody", 40), OSUB_EUNKNOWN_SERVICE);
    osub_engine_free(e);
}

static void test_snapshot_round_trip_and_corruption(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(3, 81920, 1500);
    osub_spec_t ex = spec("exp", "experiment", 61440, 1, 20480);
    ex.batch_size = 16;
    ex.min_batch_size = 4;
    ex.resumable = true;
    running(e, ex, 50000, 0);
    running(e, spec("web", "online", 40960, 1, 0), 40960, 0);
    assert_int_equal(osub_engine_cordon(e, 1, true, 10), 0);
    assert_int_equal(osub_engine_cordon(e, 2, true, 10), 0);
    assert_int_equal(sub(e, spec("chat", "online", 40960, 1, 0), 20), OSUB_SUBMIT_PENDING);
    assert_int_equal(sub(e, spec("later", "batch", 81920, 1, 0), 30), OSUB_SUBMIT_QUEUED);
    assert_int_equal(osub_engine_system_usage(e, 1, 700, 40), 0);
    osub_engine_ack(e, "exp", "ckpt with spaces=and%signs", 50);
    char *snap = osub_engine_save(e);
    assert_non_null(snap);
    osub_engine_t *e2 = NULL;
    assert_int_equal(osub_engine_load(snap, &e2, NULL), 0);
    char *d1 = osub_engine_dump(e), *d2 = osub_engine_dump(e2);
    assert_string_equal(d1, d2);
    free(d1);
    free(d2);
    assert_string_equal(info(e2, "exp").checkpoint, "ckpt with spaces=and%signs");
    /* both decide the same from here */
    assert_int_equal(osub_engine_tick(e, 100000), 0);
    assert_int_equal(osub_engine_tick(e2, 100000), 0);
    size_t n1, n2;
    const osub_event_t *v1 = osub_engine_events(e, &n1), *v2 = osub_engine_events(e2, &n2);
    assert_int_equal(n1, n2);
    for (size_t i = 0; i < n1; i++)
        assert_string_equal(v1[i].msg, v2[i].msg);
    osub_engine_free(e2);

    /* corrupt snapshots: refused with the line, never half-loaded */
    const char *bad[] = {"", "not a snapshot\n", "oversub-engine-snapshot 2\nend\n",
                         "oversub-engine-snapshot 1\nconfig ratio=x\nend\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t line = 0;
        e2 = NULL;
        assert_int_equal(osub_engine_load(bad[i], &e2, &line), OSUB_EBAD_SNAPSHOT);
        assert_null(e2);
    }
    size_t len = strlen(snap);
    char *cut = strdup(snap);
    cut[len / 2] = '\0'; /* truncated: no end line */
    assert_int_equal(osub_engine_load(cut, &e2, NULL), OSUB_EBAD_SNAPSHOT);
    /* a grant that no longer adds up is caught by the invariant check */
    char *tamper = strdup(snap);
    char *g = strstr(tamper, "slots=");
    assert_non_null(g);
    char *colon = strchr(g, ':');
    colon[1] = colon[1] == '9' ? '8' : '9';
    int rc = osub_engine_load(tamper, &e2, NULL);
    if (rc == 0) {
        check_ok(e2);
        osub_engine_free(e2);
    } else {
        assert_int_equal(rc, OSUB_EBAD_SNAPSHOT);
    }
    /* random byte flips: each loads consistently or is refused; never a crash */
    uint64_t x = 12345;
    for (int it = 0; it < 3000; it++) {
        char *m = strdup(snap);
        for (int k = 0; k < 3; k++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t pos = (size_t)(x >> 33) % len;
            m[pos] = "0123456789=:, %-\nax"[(x >> 20) % 19];
        }
        e2 = NULL;
        rc = osub_engine_load(m, &e2, NULL);
        if (rc == 0) {
            check_ok(e2);
            osub_engine_free(e2);
        } else {
            assert_int_equal(rc, OSUB_EBAD_SNAPSHOT);
        }
        free(m);
    }
    free(cut);
    free(tamper);
    free(snap);
    osub_engine_free(e);
}

static void test_loading_reservation_is_not_pressure(void **state)
{
    (void)state;
    /* regression: DESIGN.md's new-service (81920 MiB, batch, alone on its GPU) was evicted by
     * the first tick while it loaded, its reservation read as 100% pressure */
    osub_engine_t *e = mk_engine(1, 81920, 1500);
    assert_int_equal(sub(e, spec("new-service", "batch", 81920, 1, 0), 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(osub_engine_tick(e, 1000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL) + count_ev(e, OSUB_EV_DEGRADE, NULL), 0);
    assert_int_equal(info(e, "new-service").state, OSUB_STATE_LOADING);
    /* memory really used above the watermark is pressure, loading or not */
    assert_int_equal(osub_engine_usage(e, "new-service", 80000, -1, 2000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, "new-service"), 1);
    check_ok(e);
    osub_engine_free(e);
}

static void test_victim_evicted_while_loading_counts_until_exit(void **state)
{
    (void)state;
    /* regression (a new-user review): a batch job evicted while it loaded, overdue, then its
     * load timer fired: held fell to its (never reported) usage and the online service waiting
     * for it started on memory that was only unreported, not free */
    osub_engine_t *e = mk_engine(1, 81920, 1000);
    osub_spec_t b = spec("b2", "batch", 61440, 1, 0);
    b.restart_cost_ms = 20000;
    b.grace_ms = 1000;
    assert_int_equal(sub(e, b, 0), OSUB_SUBMIT_STARTED);
    osub_spec_t on = spec("b3", "online", 40960, 1, 0);
    assert_int_equal(sub(e, on, 100), OSUB_SUBMIT_PENDING);
    assert_int_equal(info(e, "b2").state, OSUB_STATE_DRAINING);
    /* past the grace (overdue) and past the load timer, b2 never exits nor reports: b3 never
     * starts (it waits, pending or back in the queue) */
    for (int64_t t = 1000; t <= 25000; t += 1000) {
        assert_int_equal(osub_engine_tick(e, t), 0);
        osub_state_t st = info(e, "b3").state;
        assert_true(st == OSUB_STATE_PENDING || st == OSUB_STATE_QUEUED);
    }
    assert_int_equal(info(e, "b2").state, OSUB_STATE_OVERDUE);
    assert_true(ginfo(e, 0).held_mib >= 61440);
    check_ok(e);
    /* it exits: now the room is real */
    assert_int_equal(osub_engine_exited(e, "b2", NULL, 26000), 0);
    assert_int_equal(osub_engine_tick(e, 27000), 0);
    osub_state_t st = info(e, "b3").state;
    assert_true(st == OSUB_STATE_LOADING || st == OSUB_STATE_RUNNING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_lost_gpu_with_many_services(void **state)
{
    (void)state;
    /* regression: the queue grew by one doubling only, and a GPU lost with more services than
     * that wrote past it */
    osub_engine_t *e = mk_engine(2, 81920, 2000);
    char id[16];
    for (int i = 0; i < 60; i++) {
        snprintf(id, sizeof(id), "s%d", i);
        osub_spec_t s = spec(id, "batch", 1024, 1, 0);
        s.resumable = true;
        assert_int_equal(sub(e, s, 0), OSUB_SUBMIT_STARTED);
    }
    assert_int_equal(osub_engine_cordon(e, 1, true, 1), 0);
    assert_int_equal(osub_engine_gpu_lost(e, 0, 2), 0);
    assert_true(osub_engine_queue_length(e) >= 30);
    check_ok(e);
    osub_engine_free(e);
}

static void test_resize(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 81920, 1000);
    running(e, spec("a", "batch", 40960, 1, 0), 10000, 0);
    assert_int_equal(osub_engine_resize(e, "a", 61440, 0, 0, 10), 0);
    assert_int_equal(info(e, "a").grant_mib, 61440);
    /* a share above the GPU's usable is too big (DESIGN.md, resize) */
    assert_int_equal(osub_engine_resize(e, "a", 90000, 0, 0, 20), OSUB_ETOO_BIG);
    assert_int_equal(osub_engine_resize(e, "a", 20480, 0, 0, 30), 0);
    assert_int_equal(ginfo(e, 0).granted_mib, 20480);
    check_ok(e);
    osub_engine_free(e);
}

/* A copy of text with the first `from` replaced by `to` (the test fails when it is absent). */
static char *replaced(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (at == NULL)
        fail_msg("snapshot has no \"%s\"", from);
    size_t head = (size_t)(at - text), nf = strlen(from), nt = strlen(to);
    char *out = malloc(strlen(text) - nf + nt + 1);
    assert_non_null(out);
    memcpy(out, text, head);
    memcpy(out + head, to, nt);
    strcpy(out + head + nt, at + nf);
    return out;
}

/* Issue 23: an exclusive request passes the same size check as any other placement (its share
 * <= the GPU's usable): it is never started on a GPU smaller than its share, where its grant,
 * that GPU's usable VRAM, would be below its floor. */
static void test_exclusive_never_on_a_smaller_gpu(void **state)
{
    (void)state;
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 2000;
    int64_t v[2] = {10000, 6000};
    osub_engine_t *e = mk_engine_cfg(2, v, &cfg);
    assert_int_equal(sub(e, spec("p", "online", 9500, 1, 0), 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(info(e, "p").slots[0].gpu, 0);
    osub_spec_t x = spec("x", "online", 9000, 0, 0);
    x.exclusive = true;
    osub_submit_result_t r;
    /* not allowed to queue: refused, GPU 1 untouched */
    assert_int_equal(osub_engine_submit(e, &x, 10, 0, &r), OSUB_ENO_ROOM);
    assert_int_equal(r.outcome, OSUB_SUBMIT_REJECTED);
    assert_int_equal(ginfo(e, 1).n_services, 0);
    /* allowed to: queued, never started on GPU 1 */
    x.queue = OSUB_TRI_YES;
    assert_int_equal(osub_engine_submit(e, &x, 20, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    assert_int_equal(info(e, "x").state, OSUB_STATE_QUEUED);
    assert_int_equal(ginfo(e, 1).n_services, 0);
    assert_false(ginfo(e, 1).exclusive);
    check_ok(e);
    /* GPU 0 frees up: x gets it whole */
    assert_int_equal(osub_engine_release(e, "p", 30), 0);
    osub_service_info_t si = info(e, "x");
    assert_int_equal(si.state, OSUB_STATE_LOADING);
    assert_int_equal(si.slots[0].gpu, 0);
    assert_int_equal(si.grant_mib, 10000);
    check_ok(e);
    osub_engine_free(e);

    /* two GPUs of 10000 cannot hold 21000 in two shares (10500 each), exclusive or not: with
     * the two larger GPUs taken by backed services, it waits for them */
    int64_t v2[4] = {10000, 10000, 30000, 30000};
    e = mk_engine_cfg(4, v2, &cfg);
    assert_int_equal(sub(e, spec("a", "online", 20000, 1, 0), 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("b", "online", 20000, 1, 0), 0), OSUB_SUBMIT_STARTED);
    osub_spec_t big = spec("big", "online", 21000, 2, 0);
    big.exclusive = true;
    big.queue = OSUB_TRI_YES;
    assert_int_equal(osub_engine_submit(e, &big, 10, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_QUEUED);
    assert_int_equal(ginfo(e, 0).n_services + ginfo(e, 1).n_services, 0);
    check_ok(e);
    assert_int_equal(osub_engine_release(e, "a", 20), 0);
    assert_int_equal(osub_engine_release(e, "b", 30), 0);
    si = info(e, "big");
    assert_int_equal(si.state, OSUB_STATE_LOADING);
    assert_int_equal(si.slots[0].gpu, 2);
    assert_int_equal(si.grant_mib, 60000);
    check_ok(e);
    osub_engine_free(e);
}

/* Issue 23: the invariant check catches a grant below the service's floor (exclusive services
 * included) and a share above its GPU's usable VRAM; a snapshot with either is refused. */
static void test_check_catches_grants_off_size(void **state)
{
    (void)state;
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 2000;
    int64_t v[2] = {10000, 10000};
    osub_engine_t *e = mk_engine_cfg(2, v, &cfg);
    osub_spec_t x = spec("x", "online", 9000, 1, 0);
    x.exclusive = true;
    assert_int_equal(sub(e, x, 0), OSUB_SUBMIT_STARTED);
    running(e, spec("b", "batch", 3000, 1, 0), 3000, 0);
    assert_int_equal(info(e, "x").slots[0].gpu, 0);
    assert_int_equal(info(e, "b").slots[0].gpu, 1);
    check_ok(e);
    char *snap = osub_engine_save(e);
    assert_non_null(snap);
    osub_engine_t *e2 = NULL;
    assert_int_equal(osub_engine_load(snap, &e2, NULL), 0);
    osub_engine_free(e2);
    /* x holding 6000 of GPU 0 (as if it had been placed on a 6000 MiB GPU): below its 9000 */
    char *t1 = replaced(snap, "slots=0:10000:10000:0:10000", "slots=0:6000:6000:0:6000");
    e2 = NULL;
    assert_int_equal(osub_engine_load(t1, &e2, NULL), OSUB_EBAD_SNAPSHOT);
    assert_null(e2);
    /* b asking for and granted 12000 on a 10000 MiB GPU: within the logical capacity (20000),
     * at its floor, its held its use; only the share is too big for the GPU */
    char *t2 = replaced(snap, "vram=3000 gpus=1 compute=0 min_vram=3000",
                        "vram=12000 gpus=1 compute=0 min_vram=12000");
    char *t3 = replaced(t2, "slots=1:3000:3000:3000:3000", "slots=1:12000:12000:3000:12000");
    assert_int_equal(osub_engine_load(t3, &e2, NULL), OSUB_EBAD_SNAPSHOT);
    assert_null(e2);
    /* the same with a floor below its share: an exclusive service still holds its request */
    char *t4 = replaced(snap, "vram=9000 gpus=1 compute=0 min_vram=9000",
                        "vram=9000 gpus=1 compute=0 min_vram=1000");
    char *t5 = replaced(t4, "slots=0:10000:10000:0:10000", "slots=0:6000:6000:0:6000");
    assert_int_equal(osub_engine_load(t4, &e2, NULL), 0);
    osub_engine_free(e2);
    e2 = NULL;
    assert_int_equal(osub_engine_load(t5, &e2, NULL), OSUB_EBAD_SNAPSHOT);
    assert_null(e2);
    free(t1);
    free(t2);
    free(t3);
    free(t4);
    free(t5);
    free(snap);
    osub_engine_free(e);
}

/* Issue 23: growth passes the checks a submit of the new size would on the service's GPUs (a
 * share above usable is too big; logical, backed and held against the GPU's held without the
 * service); a service without GPUs is refused a size no GPU of the pool could hold; a shrink
 * always succeeds. */
static void test_resize_growth_checks_like_a_submit(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 10000, 2000); /* logical 20000, high watermark 9500 */
    running(e, spec("b", "batch", 3000, 1, 0), 3000, 0);
    /* larger than the GPU: too big, not just within the logical capacity */
    assert_int_equal(osub_engine_resize(e, "b", 15000, 0, 0, 10), OSUB_ETOO_BIG);
    assert_int_equal(info(e, "b").grant_mib, 3000);
    /* held without it (an online 5000) + its new charge (6000, no history to go by) > 9500 */
    assert_int_equal(sub(e, spec("o", "online", 5000, 1, 0), 20), OSUB_SUBMIT_STARTED);
    assert_int_equal(osub_engine_resize(e, "b", 6000, 0, 0, 30), OSUB_ENO_ROOM);
    assert_int_equal(info(e, "b").grant_mib, 3000);
    assert_int_equal(osub_engine_resize(e, "b", 4500, 0, 0, 40), 0);
    assert_int_equal(info(e, "b").grant_mib, 4500);
    /* a backed service next to a preemptible one: held without it (b's 3000) + its new size
     * must stay under the high watermark, as at admission, not merely under usable */
    assert_int_equal(osub_engine_resize(e, "o", 7000, 0, 0, 50), OSUB_ENO_ROOM);
    assert_int_equal(osub_engine_resize(e, "o", 6500, 0, 0, 55), 0);
    /* a shrink always succeeds */
    assert_int_equal(osub_engine_resize(e, "b", 1000, 0, 0, 60), 0);
    assert_int_equal(osub_engine_resize(e, "o", 4000, 0, 0, 70), 0);
    assert_int_equal(ginfo(e, 0).granted_mib, 5000);
    check_ok(e);
    /* queued: no GPU of the pool could hold a 15000 share */
    osub_spec_t q = spec("q", "batch", 9000, 1, 0);
    assert_int_equal(sub(e, q, 80), OSUB_SUBMIT_QUEUED);
    assert_int_equal(osub_engine_resize(e, "q", 15000, 0, 0, 90), OSUB_ETOO_BIG);
    assert_int_equal(osub_engine_resize(e, "q", 10000, 0, 0, 100), 0);
    assert_int_equal(info(e, "q").state, OSUB_STATE_QUEUED);
    check_ok(e);
    /* draining: it keeps its memory until it exits and comes back through the queue */
    assert_int_equal(osub_engine_drain_gpu(e, 0, 110), 0);
    assert_int_equal(info(e, "b").state, OSUB_STATE_DRAINING);
    assert_int_equal(osub_engine_resize(e, "b", 15000, 0, 0, 120), OSUB_ETOO_BIG);
    assert_int_equal(osub_engine_resize(e, "b", 2000, 0, 0, 130), 0);
    check_ok(e);
    osub_engine_free(e);
}

/* Issue 23: a pending service starts when the held of the others plus its charge fits under
 * the limit admission checked (the high watermark here), not merely under usable. */
static void test_pending_starts_under_the_high_watermark(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(1, 10000, 2000); /* high watermark 9500 */
    running(e, spec("bat", "batch", 3000, 1, 0), 3000, 0);
    running(e, spec("exp", "experiment", 6000, 1, 1000), 6000, 0);
    osub_submit_result_t r;
    osub_spec_t web = spec("web", "online", 1500, 1, 0);
    assert_int_equal(osub_engine_submit(e, &web, 10, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    assert_int_equal(r.n_victims, 1);
    assert_string_equal(r.victims[0].service, "exp");
    assert_false(r.victims[0].evict);
    /* exp frees some, not all: 3000 + 5400 + 1500 = 9900, under usable, over the watermark */
    assert_int_equal(osub_engine_usage(e, "exp", 5400, -1, 20), 0);
    assert_int_equal(ginfo(e, 0).held_mib, 9900);
    assert_int_equal(info(e, "web").state, OSUB_STATE_PENDING);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_RUNNING);
    assert_int_equal(osub_engine_tick(e, 30), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_PENDING);
    check_ok(e);
    /* down to its floor: 3000 + 900 + 1500 = 5400 */
    assert_int_equal(osub_engine_usage(e, "exp", 900, -1, 40), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_RUNNING);
    check_ok(e);
    osub_engine_free(e);
}

/* Issue 23 (found with the share check): a start at its floor goes only to GPUs that could hold
 * its full request once restored, never to a smaller one where the restore would grant more
 * than the GPU has. */
static void test_floor_start_only_where_restorable(void **state)
{
    (void)state;
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 2000;
    int64_t v[2] = {10000, 6000};
    osub_engine_t *e = mk_engine_cfg(2, v, &cfg);
    assert_int_equal(sub(e, spec("p", "online", 9500, 1, 0), 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("big", "batch", 9000, 1, 5000), 10), OSUB_SUBMIT_QUEUED);
    /* past floor_start_after_ms: its floor (5000) would fit GPU 1, its request never could */
    assert_int_equal(osub_engine_tick(e, 130000), 0);
    assert_int_equal(info(e, "big").state, OSUB_STATE_QUEUED);
    assert_int_equal(ginfo(e, 1).n_services, 0);
    check_ok(e);
    /* GPU 0 frees up: it starts there */
    assert_int_equal(osub_engine_release(e, "p", 140000), 0);
    assert_int_equal(osub_engine_tick(e, 140001), 0);
    osub_service_info_t si = info(e, "big");
    assert_int_equal(si.slots[0].gpu, 0);
    check_ok(e);
    osub_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priority_outranks_degrade_first),
        cmocka_unit_test(test_give_back_turns_eviction_into_degrade),
        cmocka_unit_test(test_pressure_degrades_then_evicts_lowest_first),
        cmocka_unit_test(test_degraded_start_restored_by_prediction),
        cmocka_unit_test(test_pressure_degrades_before_any_eviction),
        cmocka_unit_test(test_pressure_boundaries_are_exact),
        cmocka_unit_test(test_backed_start_never_causes_pressure),
        cmocka_unit_test(test_restores_share_one_room),
        cmocka_unit_test(test_history_forgets_departures_and_reservations),
        cmocka_unit_test(test_adopted_pending_reservation_is_not_a_peak),
        cmocka_unit_test(test_multi_gpu_refusal_names_the_closest_miss),
        cmocka_unit_test(test_restore_after_window_without_flapping),
        cmocka_unit_test(test_queue_order_and_backfill),
        cmocka_unit_test(test_backfill_away_from_head_and_aging),
        cmocka_unit_test(test_refusal_behind_the_head_has_no_shortfall),
        cmocka_unit_test(test_lowering_ratio_never_evicts),
        cmocka_unit_test(test_gpu_lost_takes_its_services),
        cmocka_unit_test(test_exclusive_takes_whole_gpus),
        cmocka_unit_test(test_multi_gpu_victim_degraded_everywhere),
        cmocka_unit_test(test_resumed_work_protected_then_pressure_overrides),
        cmocka_unit_test(test_overdue_then_pending_requeued),
        cmocka_unit_test(test_placement_respects_past_peaks),
        cmocka_unit_test(test_loading_holds_its_grant),
        cmocka_unit_test(test_pending_grant_counts_for_others),
        cmocka_unit_test(test_cordon_and_drain),
        cmocka_unit_test(test_compute_claims),
        cmocka_unit_test(test_compute_contention_cuts_batch_only),
        cmocka_unit_test(test_release_measured_keeps_memory),
        cmocka_unit_test(test_snapshot_round_trip_and_corruption),
        cmocka_unit_test(test_loading_reservation_is_not_pressure),
        cmocka_unit_test(test_victim_evicted_while_loading_counts_until_exit),
        cmocka_unit_test(test_lost_gpu_with_many_services),
        cmocka_unit_test(test_resize),
        cmocka_unit_test(test_exclusive_never_on_a_smaller_gpu),
        cmocka_unit_test(test_check_catches_grants_off_size),
        cmocka_unit_test(test_resize_growth_checks_like_a_submit),
        cmocka_unit_test(test_pending_starts_under_the_high_watermark),
        cmocka_unit_test(test_floor_start_only_where_restorable),
        cmocka_unit_test(test_degraded_start_at_once_where_measured),
        cmocka_unit_test(test_no_degraded_start_while_a_degrade_is_due),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
