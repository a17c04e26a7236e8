/* test_scenario.c - DESIGN.md's worked scenario, step by step, with exact figures */
#include "helpers.h"

static osub_engine_t *step1(void)
{
    osub_engine_t *e = mk_engine(8, 81920, 1500);
    osub_spec_t a = spec("agent-online", "online", 163840, 2, 0);
    a.compute_pct = 100;
    assert_int_equal(sub(e, a, 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("batch-analysis", "batch", 122880, 2, 61440), 0),
                     OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("model-eval", "experiment", 102400, 2, 40960), 0),
                     OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("new-service", "batch", 81920, 1, 0), 0), OSUB_SUBMIT_STARTED);
    check_ok(e);
    return e;
}

static void step2(osub_engine_t *e)
{
    int64_t t = 15 * 60000;
    const char *ids[] = {"agent-online", "batch-analysis", "model-eval", "new-service"};
    int64_t used[] = {163840, 2 * 57344, 2 * 45056, 61440};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(osub_engine_ready(e, ids[i], t), 0);
        assert_int_equal(osub_engine_usage(e, ids[i], used[i], -1, t), 0);
    }
    check_ok(e);
}

static void step3(osub_engine_t *e)
{
    int64_t t = 15 * 60000;
    assert_int_equal(sub(e, spec("chat-1", "online", 40960, 1, 0), t), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("chat-2", "online", 40960, 1, 0), t), OSUB_SUBMIT_STARTED);
    check_ok(e);
}

static void test_step1_admits_all_on_seven_gpus(void **state)
{
    (void)state;
    osub_engine_t *e = step1();
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.held_mib, 471040);
    assert_int_equal(p.vram_mib, 655360);
    assert_int_equal(p.granted_mib, 471040);
    assert_int_equal(p.logical_mib, 983040);
    /* 71.9% held and 47.9% logical, to one decimal */
    assert_int_equal((p.held_mib * 1000 + p.vram_mib / 2) / p.vram_mib, 719);
    assert_int_equal((p.granted_mib * 1000 + p.logical_mib / 2) / p.logical_mib, 479);
    /* placement: GPUs 0-1, 2-3, 4-5 and 6; nothing on 7 */
    osub_service_info_t s = info(e, "agent-online");
    assert_int_equal(s.n_slots, 2);
    assert_int_equal(s.slots[0].gpu, 0);
    assert_int_equal(s.slots[1].gpu, 1);
    assert_int_equal(s.slots[0].grant_mib, 81920);
    s = info(e, "batch-analysis");
    assert_int_equal(s.slots[0].gpu, 2);
    assert_int_equal(s.slots[1].gpu, 3);
    assert_int_equal(s.slots[0].grant_mib, 61440);
    s = info(e, "model-eval");
    assert_int_equal(s.slots[0].gpu, 4);
    assert_int_equal(s.slots[1].gpu, 5);
    assert_int_equal(s.slots[1].grant_mib, 51200);
    s = info(e, "new-service");
    assert_int_equal(s.n_slots, 1);
    assert_int_equal(s.slots[0].gpu, 6);
    assert_int_equal(s.state, OSUB_STATE_LOADING);
    assert_int_equal(ginfo(e, 7).n_services, 0);
    assert_int_equal(p.degrades + p.evictions, 0);
    osub_engine_free(e);
}

static void test_step2_held_follows_usage(void **state)
{
    (void)state;
    osub_engine_t *e = step1();
    step2(e);
    assert_int_equal(ginfo(e, 2).held_mib, 57344);
    assert_int_equal(ginfo(e, 4).held_mib, 45056);
    assert_int_equal(ginfo(e, 6).held_mib, 61440);
    assert_int_equal(ginfo(e, 0).held_mib, 81920); /* backed: held is the grant */
    assert_int_equal(info(e, "model-eval").state, OSUB_STATE_RUNNING);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.held_mib, 163840 + 114688 + 90112 + 61440);
    osub_engine_free(e);
}

static void test_step3_chats_share_the_free_gpu(void **state)
{
    (void)state;
    osub_engine_t *e = step1();
    step2(e);
    step3(e);
    assert_int_equal(info(e, "chat-1").slots[0].gpu, 7);
    assert_int_equal(info(e, "chat-2").slots[0].gpu, 7);
    assert_int_equal(ginfo(e, 7).backed_mib, 81920);
    osub_engine_free(e);
}

static void test_step4_degrades_model_eval_for_chat3(void **state)
{
    (void)state;
    osub_engine_t *e = step1();
    step2(e);
    step3(e);
    int64_t t = 20 * 60000;
    osub_spec_t c3 = spec("chat-3", "online", 40960, 1, 0);
    osub_submit_result_t r;
    assert_int_equal(osub_engine_tick(e, t), 0); /* the chats' loading periods end first */
    assert_int_equal(osub_engine_submit(e, &c3, t, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    assert_int_equal(r.n_gpus, 1);
    assert_int_equal(r.gpus[0], 4);
    assert_int_equal(r.n_victims, 1);
    assert_string_equal(r.victims[0].service, "model-eval");
    assert_false(r.victims[0].evict);
    /* the decisions, in order */
    size_t n;
    const osub_event_t *ev = osub_engine_events(e, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ev[0].kind, OSUB_EV_ADMIT);
    assert_int_equal(ev[1].kind, OSUB_EV_DEGRADE);
    assert_string_equal(ev[1].service, "model-eval");
    assert_string_equal(ev[1].cause, "chat-3");
    assert_int_equal(ev[1].reason, OSUB_R_PREEMPTION);
    assert_int_equal(ev[1].vram_mib, 40960);
    assert_non_null(strstr(ev[1].msg, "GPUs 4,5"));
    assert_int_equal(ev[2].kind, OSUB_EV_PEND);
    osub_service_info_t me = info(e, "model-eval");
    assert_int_equal(me.state, OSUB_STATE_DEGRADED);
    assert_int_equal(me.slots[0].grant_mib, 20480);
    assert_int_equal(me.slots[1].grant_mib, 20480);
    assert_int_equal(me.held_mib, 90112); /* not acknowledged: held unchanged */
    assert_true(me.ack_pending);
    osub_service_info_t c = info(e, "chat-3");
    assert_int_equal(c.state, OSUB_STATE_PENDING);
    assert_int_equal(c.n_waits, 1);
    assert_string_equal(c.waits[0].service, "model-eval");
    /* batch-analysis and new-service untouched */
    assert_int_equal(info(e, "batch-analysis").state, OSUB_STATE_RUNNING);
    assert_int_equal(info(e, "new-service").state, OSUB_STATE_RUNNING);
    check_ok(e);

    /* model-eval acknowledges: chat-3 starts on GPU 4 */
    assert_int_equal(osub_engine_ack(e, "model-eval", NULL, t + 2000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_START, "chat-3"), 1);
    assert_int_equal(info(e, "chat-3").state, OSUB_STATE_LOADING);
    assert_int_equal(ginfo(e, 4).held_mib, 20480 + 40960);
    assert_int_equal(info(e, "model-eval").held_mib, 40960);
    check_ok(e);
    osub_engine_free(e);
}

static void test_step5_ignored_degrade_escalates(void **state)
{
    (void)state;
    osub_engine_t *e = step1();
    step2(e);
    step3(e);
    int64_t t = 20 * 60000;
    assert_int_equal(sub(e, spec("chat-3", "online", 40960, 1, 0), t), OSUB_SUBMIT_PENDING);
    /* keeps reporting its old usage: no acknowledgement */
    assert_int_equal(osub_engine_usage(e, "model-eval", 2 * 45056, -1, t + 5000), 0);
    assert_int_equal(info(e, "model-eval").state, OSUB_STATE_DEGRADED);
    assert_int_equal(osub_engine_tick(e, t + 10000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_ESCALATE, "model-eval"), 1);
    const osub_event_t *ev = find_ev(e, OSUB_EV_EVICT, "model-eval");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_ACK_TIMEOUT);
    assert_int_equal(ev->deadline_ms, t + 10000 + 30000);
    assert_int_equal(info(e, "model-eval").state, OSUB_STATE_DRAINING);
    assert_int_equal(info(e, "chat-3").state, OSUB_STATE_PENDING);
    /* drains; exits inside its grace period; chat-3 starts, model-eval is released */
    assert_int_equal(osub_engine_tick(e, t + 30000), 0);
    assert_int_equal(info(e, "chat-3").state, OSUB_STATE_PENDING);
    assert_int_equal(osub_engine_exited(e, "model-eval", NULL, t + 35000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_RELEASE, "model-eval"), 1);
    assert_int_equal(count_ev(e, OSUB_EV_START, "chat-3"), 1);
    osub_service_info_t si;
    assert_int_equal(osub_engine_service_info(e, "model-eval", &si), OSUB_EUNKNOWN_SERVICE);
    assert_int_equal(info(e, "chat-3").slots[0].gpu, 4);
    check_ok(e);
    osub_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step1_admits_all_on_seven_gpus),
        cmocka_unit_test(test_step2_held_follows_usage),
        cmocka_unit_test(test_step3_chats_share_the_free_gpu),
        cmocka_unit_test(test_step4_degrades_model_eval_for_chat3),
        cmocka_unit_test(test_step5_ignored_degrade_escalates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
