/* test_suspend.c - suspend, the rung between degrade and evict: the ladder and the key, the host
 * budget, the timeout and a failed mechanism, the wake ahead of the queue, the minimum runtime
 * after a wake, pressure, the operator's commands, snapshots, the migration of a service left
 * suspended longer than its restart cost (at its floor after the queue's aging time) */
#define _POSIX_C_SOURCE 200809L
#include "helpers.h"

/* One GPU of 81920 MiB (high watermark 77824), ratio 2.0, a host budget for suspends. */
static osub_engine_t *mk_pool(int n, int64_t host_mib)
{
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 2000;
    cfg.suspend_host_mib = host_mib;
    int64_t v[8];
    for (int i = 0; i < n; i++)
        v[i] = 81920;
    return mk_engine_cfg(n, v, &cfg);
}

/* A spec that declares the cuda method, with the residual it expects. */
static osub_spec_t susp_spec(const char *id, const char *cls, int64_t vram, int64_t min_vram,
                             int64_t residual)
{
    osub_spec_t s = spec(id, cls, vram, 1, min_vram);
    s.suspend.method = OSUB_SUSPEND_CUDA;
    s.suspend.residual_mib = residual;
    return s;
}

/* Starts a service and makes it ready with the given usage. */
static void running(osub_engine_t *e, osub_spec_t s, int64_t used, int64_t t)
{
    assert_int_equal(sub(e, s, t), OSUB_SUBMIT_STARTED);
    assert_int_equal(osub_engine_ready(e, s.id, t), 0);
    assert_int_equal(osub_engine_usage(e, s.id, used, -1, t), 0);
}

static void test_spec_checks(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(1, 100000);
    osub_submit_result_t r;
    osub_spec_t on = susp_spec("web", "online", 1000, 0, 0);
    assert_int_equal(osub_engine_submit(e, &on, 0, 0, &r), OSUB_EBACKED_SUSPEND);
    osub_spec_t h = susp_spec("h", "batch", 1000, 0, 2000); /* residual above the request */
    h.suspend.method = OSUB_SUSPEND_HTTP;
    assert_int_equal(osub_engine_submit(e, &h, 0, 0, &r), OSUB_EBAD_SUSPEND);
    h.suspend.residual_mib = 100;
    assert_int_equal(osub_engine_submit(e, &h, 0, 0, &r), 0);
    osub_spec_t v = susp_spec("v", "batch", 8192, 0, 0);
    v.suspend.method = (osub_suspend_method_t)7;
    assert_int_equal(osub_engine_submit(e, &v, 0, 0, &r), OSUB_EBAD_SUSPEND);
    v.suspend.method = OSUB_SUSPEND_VLLM;
    assert_int_equal(osub_engine_submit(e, &v, 0, 0, &r), 0);
    /* the resume cost: its request at 4096 MiB/s, plus 1 s */
    assert_int_equal(info(e, "v").resume_cost_ms, 8192 * 1000 / 4096 + 1000);
    assert_true(info(e, "v").suspendable);
    assert_false(info(e, "h").suspend_hold);
    check_ok(e);
    osub_engine_free(e);
}

static void test_ladder_degrade_then_suspend_then_evict(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(1, 200000);
    running(e, susp_spec("exp", "experiment", 61440, 51200, 2048), 60000, 0);
    /* a degrade is enough for 20000 MiB (51200 + 20000 under 77824): degraded, not suspended */
    osub_submit_result_t r;
    osub_spec_t small = spec("small", "online", 20000, 1, 0);
    assert_int_equal(osub_engine_submit(e, &small, 10, OSUB_SUBMIT_DRY_RUN, &r), 0);
    assert_int_equal(r.n_victims, 1);
    assert_false(r.victims[0].evict);
    assert_false(r.victims[0].suspend);
    /* 30000 MiB: the degrade is not enough, the suspend is; nobody is evicted */
    osub_spec_t web = spec("web", "online", 30000, 1, 0);
    assert_int_equal(osub_engine_submit(e, &web, 10, 0, &r), 0);
    assert_int_equal(r.outcome, OSUB_SUBMIT_PENDING);
    assert_int_equal(r.n_victims, 1);
    assert_string_equal(r.victims[0].service, "exp");
    assert_true(r.victims[0].suspend);
    assert_false(r.victims[0].evict);
    assert_int_equal(r.victims[0].deadline_ms, 10 + 30000);
    const osub_event_t *ev = find_ev(e, OSUB_EV_SUSPEND, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_PREEMPTION);
    assert_string_equal(ev->cause, "web");
    osub_service_info_t x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_SUSPENDING);
    assert_int_equal(x.held_mib, 60000); /* it holds its memory until it is seen free */
    assert_int_equal(x.host_mib, 61440);
    check_ok(e);
    /* done: it holds its residual, keeps its grant, and the pending service starts */
    assert_int_equal(osub_engine_suspended(e, "exp", 1800, 20), 0);
    x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_SUSPENDED);
    assert_int_equal(x.held_mib, 1800);
    assert_int_equal(x.grant_mib, 61440);
    assert_int_equal(x.residual_mib, 1800);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    assert_int_equal(ginfo(e, 0).granted_mib, 61440 + 30000);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.suspends, 1);
    assert_int_equal(p.evictions, 0);
    assert_int_equal(p.n_suspended, 1);
    assert_int_equal(p.host_used_mib, 61440);
    /* a report for a service that is not suspending is refused */
    assert_int_equal(osub_engine_suspended(e, "exp", 0, 30), OSUB_EBAD_STATE);
    check_ok(e);
    osub_engine_free(e);
}

/* The key: evictions before suspends. Two GPUs, an experiment each; the one that may be
 * suspended is chosen over the one that would be evicted, and an experiment is evicted before
 * a batch job is suspended (the highest priority touched comes first). */
static void test_key_suspend_beats_evict_priority_first(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(2, 200000);
    running(e, spec("plain", "experiment", 60000, 1, 0), 60000, 0); /* lands on GPU 0 */
    running(e, susp_spec("sus", "experiment", 60000, 0, 0), 60000, 1);
    assert_int_equal(info(e, "sus").slots[0].gpu, 1);
    osub_submit_result_t r;
    osub_spec_t web = spec("web", "online", 30000, 1, 0);
    assert_int_equal(osub_engine_submit(e, &web, 10, OSUB_SUBMIT_DRY_RUN, &r), 0);
    assert_int_equal(r.gpus[0], 1);
    assert_int_equal(r.n_victims, 1);
    assert_true(r.victims[0].suspend);
    osub_engine_free(e);

    e = mk_pool(2, 200000);
    running(e, spec("exp", "experiment", 60000, 1, 0), 60000, 0);
    running(e, susp_spec("bat", "batch", 60000, 0, 0), 60000, 1);
    assert_int_equal(osub_engine_submit(e, &web, 10, OSUB_SUBMIT_DRY_RUN, &r), 0);
    assert_int_equal(r.gpus[0], 0);
    assert_string_equal(r.victims[0].service, "exp");
    assert_true(r.victims[0].evict);
    osub_engine_free(e);
}

static void test_host_budget_refuses_suspend_next_rung(void **state)
{
    (void)state;
    /* the suspend would count 61440 MiB against a 40000 MiB budget: not planned; evicted */
    osub_engine_t *e = mk_pool(1, 40000);
    running(e, susp_spec("exp", "experiment", 61440, 51200, 0), 60000, 0);
    osub_submit_result_t r;
    osub_spec_t web = spec("web", "online", 30000, 1, 0);
    assert_int_equal(osub_engine_submit(e, &web, 10, 0, &r), 0);
    assert_int_equal(r.n_victims, 1);
    assert_true(r.victims[0].evict);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_DRAINING);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.host_used_mib, 0);
    assert_int_equal(p.suspends, 0);
    /* the operator's suspend is refused the same way */
    osub_engine_t *e2 = mk_pool(1, 40000);
    running(e2, susp_spec("exp", "experiment", 61440, 51200, 0), 60000, 0);
    assert_int_equal(osub_engine_suspend(e2, "exp", 0, 10), OSUB_EHOST_FULL);
    running(e2, spec("plain", "experiment", 1000, 1, 0), 1000, 10);
    assert_int_equal(osub_engine_suspend(e2, "plain", 0, 20), OSUB_ENOT_SUSPENDABLE);
    check_ok(e2);
    osub_engine_free(e2);
    /* a budget of 0 turns suspend off */
    osub_engine_t *e3 = mk_pool(1, 0);
    running(e3, susp_spec("exp", "experiment", 61440, 51200, 0), 60000, 0);
    assert_int_equal(osub_engine_submit(e3, &web, 10, 0, &r), 0);
    assert_true(r.victims[0].evict);
    osub_engine_free(e3);
    check_ok(e);
    osub_engine_free(e);
}

static void test_timeout_and_failure_escalate_to_eviction(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(1, 200000);
    osub_spec_t ex = susp_spec("exp", "experiment", 61440, 51200, 0);
    ex.grace_ms = 5000;
    running(e, ex, 60000, 0);
    osub_spec_t web = spec("web", "online", 30000, 1, 0);
    assert_int_equal(sub(e, web, 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(osub_engine_next_deadline(e), 10 + 30000);
    assert_int_equal(osub_engine_tick(e, 30009), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDING);
    assert_int_equal(osub_engine_tick(e, 30010), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_ESCALATE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_SUSPEND_TIMEOUT);
    ev = find_ev(e, OSUB_EV_EVICT, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->deadline_ms, 30010 + 5000); /* with its grace */
    osub_service_info_t x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_DRAINING);
    assert_int_equal(x.host_mib, 0);
    assert_int_equal(osub_engine_suspended(e, "exp", 0, 30020), OSUB_EBAD_STATE);
    assert_int_equal(osub_engine_exited(e, "exp", NULL, 30030), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    check_ok(e);
    osub_engine_free(e);

    /* the mechanism fails (a process that cannot be checkpointed): evicted at once */
    e = mk_pool(1, 200000);
    running(e, ex, 60000, 0);
    assert_int_equal(sub(e, web, 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(osub_engine_suspend_failed(e, "exp", "NCCL across processes", 20), 0);
    ev = find_ev(e, OSUB_EV_ESCALATE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_SUSPEND_FAILED);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_DRAINING);
    assert_int_equal(osub_engine_suspend_failed(e, "exp", NULL, 30), OSUB_EBAD_STATE);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.suspends, 1);
    assert_int_equal(p.evictions, 1);
    check_ok(e);
    osub_engine_free(e);
}

/* A victim that keeps more than planned once suspended: the pending service is planned again
 * with the residual as measured (here: the suspended victim is evicted). */
static void test_residual_above_plan_replans(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(1, 200000);
    running(e, susp_spec("exp", "experiment", 61440, 51200, 0), 60000, 0);
    assert_int_equal(sub(e, spec("web", "online", 30000, 1, 0), 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(osub_engine_suspended(e, "exp", 50000, 20), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_REQUEUE, "web");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_RESIDUAL);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_DRAINING);
    assert_int_equal(info(e, "web").state, OSUB_STATE_PENDING);
    assert_int_equal(info(e, "exp").residual_mib, 50000);
    assert_int_equal(osub_engine_exited(e, "exp", NULL, 30), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    check_ok(e);
    osub_engine_free(e);
}

/* A multi-GPU victim is suspended as a whole: on all its GPUs, its residual split as usage is,
 * and it wakes on the same GPUs. */
static void test_multi_gpu_victim_suspended_everywhere(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(2, 300000);
    osub_spec_t big = susp_spec("big", "batch", 2 * 61440, 0, 0);
    big.gpus = 2;
    running(e, big, 2 * 60000, 0);
    osub_submit_result_t r;
    osub_spec_t web = spec("web", "online", 30000, 1, 0);
    assert_int_equal(osub_engine_submit(e, &web, 10, 0, &r), 0);
    assert_int_equal(r.n_victims, 1);
    assert_true(r.victims[0].suspend);
    assert_int_equal(info(e, "big").host_mib, 2 * 61440);
    assert_int_equal(osub_engine_suspended(e, "big", 3000, 20), 0);
    osub_service_info_t x = info(e, "big");
    assert_int_equal(x.n_slots, 2);
    assert_int_equal(x.slots[0].held_mib + x.slots[1].held_mib, 3000);
    assert_int_equal(x.slots[0].grant_mib, 61440);
    assert_int_equal(x.slots[1].grant_mib, 61440);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    assert_int_equal(osub_engine_release(e, "web", 30), 0);
    x = info(e, "big");
    assert_int_equal(x.state, OSUB_STATE_RESUMING);
    assert_int_equal(x.slots[0].gpu, 0);
    assert_int_equal(x.slots[1].gpu, 1);
    check_ok(e);
    osub_engine_free(e);
}

/* Suspends exp for web, with q (same level, later) queued behind: web is released at 100. */
static osub_engine_t *suspended_with_queue(void)
{
    osub_engine_t *e = mk_pool(1, 200000);
    running(e, susp_spec("exp", "experiment", 61440, 51200, 0), 60000, 0);
    assert_int_equal(sub(e, spec("web", "online", 30000, 1, 0), 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(osub_engine_suspended(e, "exp", 2048, 20), 0);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    assert_int_equal(osub_engine_ready(e, "web", 30), 0);
    assert_int_equal(osub_engine_usage(e, "web", 30000, -1, 30), 0);
    /* 2048 + 30000 + 50000 is over the high watermark: q waits, and may displace nobody */
    assert_int_equal(sub(e, spec("q", "experiment", 50000, 1, 0), 40), OSUB_SUBMIT_QUEUED);
    check_ok(e);
    return e;
}

static void test_wake_ahead_of_the_queue(void **state)
{
    (void)state;
    osub_engine_t *e = suspended_with_queue();
    /* while web runs there is no room to wake exp */
    assert_int_equal(osub_engine_tick(e, 50), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDED);
    assert_int_equal(osub_engine_release(e, "web", 100), 0);
    /* q alone would fit now (2048 + 50000), but exp comes back first, on its GPU */
    const osub_event_t *ev = find_ev(e, OSUB_EV_WAKE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_ROOM_FREED);
    osub_service_info_t x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_RESUMING);
    assert_true(x.loading);
    assert_int_equal(x.slots[0].gpu, 0);
    assert_int_equal(x.held_mib, 61440); /* held like a loading service */
    assert_int_equal(info(e, "q").state, OSUB_STATE_QUEUED);
    check_ok(e);
    assert_int_equal(osub_engine_resumed(e, "exp", 200), 0);
    assert_non_null(find_ev(e, OSUB_EV_RESUMED, "exp"));
    x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_RUNNING);
    assert_int_equal(x.host_mib, 0);
    assert_int_equal(osub_engine_resumed(e, "exp", 210), OSUB_EBAD_STATE);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.wakes, 1);
    assert_int_equal(p.host_used_mib, 0);
    check_ok(e);
    osub_engine_free(e);
}

static void test_min_runtime_after_wake(void **state)
{
    (void)state;
    osub_engine_t *e = suspended_with_queue();
    assert_int_equal(osub_engine_release(e, "web", 100), 0);
    assert_int_equal(osub_engine_resumed(e, "exp", 200), 0);
    assert_int_equal(osub_engine_usage(e, "exp", 60000, -1, 300), 0);
    assert_int_equal(osub_engine_release(e, "q", 300), 0);
    /* within 60 s of its wake it is not suspended again: the next rung, an eviction */
    osub_submit_result_t r;
    osub_spec_t web = spec("web2", "online", 30000, 1, 0);
    assert_int_equal(osub_engine_submit(e, &web, 1000, OSUB_SUBMIT_DRY_RUN, &r), 0);
    assert_int_equal(r.n_victims, 1);
    assert_true(r.victims[0].evict);
    /* after it, suspended again */
    assert_int_equal(osub_engine_submit(e, &web, 100 + 60000, OSUB_SUBMIT_DRY_RUN, &r), 0);
    assert_int_equal(r.n_victims, 1);
    assert_true(r.victims[0].suspend);
    /* pressure overrides the protection: usage over the high watermark suspends it */
    assert_int_equal(osub_engine_usage(e, "exp", 50000, -1, 2000), 0);
    running(e, spec("exp2", "experiment", 24000, 1, 0), 24000, 2000);
    assert_int_equal(osub_engine_usage(e, "exp", 61000, -1, 2000), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_SUSPEND, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_PRESSURE);
    check_ok(e);
    osub_engine_free(e);
}

static void test_pressure_degrades_before_suspending(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(1, 200000);
    running(e, susp_spec("exp", "experiment", 61440, 58000, 0), 40000, 0);
    running(e, spec("exp2", "experiment", 20000, 1, 0), 19000, 1);
    /* 60000 + 19000 is over the high watermark; degrading exp leaves 77000, over the low one:
     * exp is suspended (exp2 can only be evicted) */
    assert_int_equal(osub_engine_usage(e, "exp", 60000, -1, 10), 0);
    assert_non_null(find_ev(e, OSUB_EV_SUSPEND, "exp"));
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
    assert_int_equal(info(e, "exp2").state, OSUB_STATE_RUNNING);
    check_ok(e);
    osub_engine_free(e);
}

static void test_operator_suspend_and_resume(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(1, 200000);
    running(e, susp_spec("exp", "batch", 40960, 0, 0), 40000, 0);
    assert_int_equal(osub_engine_suspend(e, "exp", OSUB_SUSPEND_IDLE, 10), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_SUSPEND, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_IDLE);
    assert_true(info(e, "exp").suspend_hold);
    assert_int_equal(osub_engine_suspend(e, "exp", 0, 15), 0); /* already: held, no event */
    assert_int_equal(count_ev(e, OSUB_EV_SUSPEND, NULL), 0);
    assert_int_equal(osub_engine_suspended(e, "exp", 1000, 20), 0);
    /* room everywhere, but held: it stays suspended */
    assert_int_equal(osub_engine_tick(e, 1000), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDED);
    assert_int_equal(osub_engine_resume(e, "exp", 2000), 0);
    ev = find_ev(e, OSUB_EV_WAKE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_USER);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_RESUMING);
    assert_false(info(e, "exp").suspend_hold);
    /* not reported: taken as resumed after its resume cost */
    int64_t rc_ms = info(e, "exp").resume_cost_ms;
    assert_int_equal(osub_engine_tick(e, 2000 + rc_ms), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_RUNNING);
    assert_int_equal(osub_engine_resume(e, "exp", 2000 + rc_ms), OSUB_EBAD_STATE);
    check_ok(e);
    osub_engine_free(e);
}

/* Two GPUs: exp (resumable, restart cost 5 s) on GPU 0 is suspended for web, which stays; fill,
 * which nobody may suspend, takes GPU 1 until it is released at 1000. Returns the engine with exp
 * suspended (done at 20) and GPU 1 free. */
static osub_engine_t *suspended_beside_free_gpu_r(bool resumable, bool held, bool relocate)
{
    osub_engine_t *e = mk_pool(2, 200000);
    osub_spec_t ex = susp_spec("exp", "experiment", 61440, 0, 0);
    ex.resumable = resumable;
    ex.suspend.relocate = relocate;
    ex.restart_cost_ms = 5000;
    running(e, ex, 60000, 0);
    running(e, spec("fill", "batch", 70000, 1, 0), 70000, 1);
    assert_int_equal(info(e, "fill").slots[0].gpu, 1);
    if (held)
        assert_int_equal(osub_engine_suspend(e, "exp", 0, 5), 0);
    else
        assert_int_equal(sub(e, spec("web", "online", 30000, 1, 0), 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDING);
    assert_int_equal(osub_engine_suspended(e, "exp", 2048, 20), 0);
    if (held) /* web comes after the operator's suspend: it fits beside the residual */
        assert_int_equal(sub(e, spec("web", "online", 30000, 1, 0), 30), OSUB_SUBMIT_STARTED);
    assert_int_equal(info(e, "web").slots[0].gpu, 0);
    assert_int_equal(osub_engine_release(e, "fill", 1000), 0);
    check_ok(e);
    return e;
}

static osub_engine_t *suspended_beside_free_gpu(bool resumable, bool held)
{
    return suspended_beside_free_gpu_r(resumable, held, false);
}

/* Suspended longer than its restart cost, with no room on its own GPU (web holds 30000 of it)
 * while GPU 1 is free: exp is evicted (reason migrate, counted as an eviction), requeued and
 * restarted on GPU 1 as a reload. Before its restart cost has passed it waits where it is. */
static void test_migrate_after_restart_cost(void **state)
{
    (void)state;
    osub_engine_t *e = suspended_beside_free_gpu(true, false);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDED); /* 980 ms of 5000 waited */
    assert_int_equal(osub_engine_tick(e, 20 + 4999), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDED);
    assert_int_equal(osub_engine_tick(e, 20 + 5000), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_EVICT, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_MIGRATE);
    assert_string_equal(ev->cause, "");
    assert_non_null(strstr(ev->msg, "restart it elsewhere"));
    assert_null(find_ev(e, OSUB_EV_WAKE, "exp"));
    osub_service_info_t x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_DRAINING);
    assert_int_equal(x.host_mib, 0); /* its host copy goes: it will reload */
    assert_int_equal(x.grant_mib, 0);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.evictions, 1);
    assert_int_equal(p.suspends, 1);
    assert_int_equal(p.n_suspended, 0);
    assert_int_equal(p.host_used_mib, 0);
    check_ok(e);
    /* its processes gone, it is requeued and started again where there is room, loading */
    assert_int_equal(osub_engine_exited(e, "exp", NULL, 6000), 0);
    assert_non_null(find_ev(e, OSUB_EV_REQUEUE, "exp"));
    assert_non_null(find_ev(e, OSUB_EV_RESUME, "exp"));
    x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_LOADING);
    assert_true(x.loading);
    assert_int_equal(x.n_slots, 1);
    assert_int_equal(x.slots[0].gpu, 1);
    assert_int_equal(x.grant_mib, 61440);
    assert_int_equal(ginfo(e, 0).granted_mib, 30000); /* its old GPU keeps only web */
    check_ok(e);
    osub_engine_free(e);
}

/* No migration where a wake or nothing is the answer: a service held suspended by an operator,
 * one that an eviction would release (not resumable), one whose own GPU has room again (it
 * wakes there, without a reload), and one whose only room elsewhere needs victims. */
static void test_migrate_only_when_it_helps(void **state)
{
    (void)state;
    for (int c = 0; c < 2; c++) {
        osub_engine_t *e = suspended_beside_free_gpu(c == 1, c == 1);
        assert_int_equal(osub_engine_tick(e, 60000), 0);
        assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDED);
        assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
        check_ok(e);
        osub_engine_free(e);
    }
    /* its own GPU has room first: a wake where it left, no eviction */
    osub_engine_t *e = suspended_beside_free_gpu(true, false);
    assert_int_equal(osub_engine_release(e, "web", 2000), 0);
    assert_non_null(find_ev(e, OSUB_EV_WAKE, "exp"));
    assert_int_equal(info(e, "exp").slots[0].gpu, 0);
    assert_int_equal(osub_engine_tick(e, 60000), 0);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.evictions, 0);
    check_ok(e);
    osub_engine_free(e);
    /* a batch service whose only room elsewhere is an experiment's: it waits, suspended (web
     * beside it on GPU 0 leaves no room for its grant; pressure suspended it) */
    e = mk_pool(2, 200000);
    osub_spec_t bat = susp_spec("bat", "batch", 61440, 0, 0);
    bat.resumable = true;
    bat.restart_cost_ms = 5000;
    running(e, bat, 50000, 0);
    running(e, spec("low", "experiment", 70000, 1, 0), 70000, 1);
    running(e, spec("web", "online", 20000, 1, 0), 20000, 2);
    assert_int_equal(info(e, "web").slots[0].gpu, 0);
    assert_int_equal(osub_engine_usage(e, "bat", 60000, -1, 10), 0);
    assert_int_equal(find_ev(e, OSUB_EV_SUSPEND, "bat")->reason, OSUB_R_PRESSURE);
    assert_int_equal(osub_engine_suspended(e, "bat", 2048, 20), 0);
    assert_int_equal(osub_engine_tick(e, 60000), 0);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_SUSPENDED);
    assert_int_equal(info(e, "low").state, OSUB_STATE_RUNNING);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
    check_ok(e);
    osub_engine_free(e);
}

/* Two services wait suspended beside online ones that stay, and one GPU frees: one migrates
 * there; the other is not sent after it while it drains (the room is claimed by nothing until
 * the first is requeued), and after that the room is gone. */
static void test_migrate_one_at_a_time(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(3, 300000);
    const char *ids[2] = {"exp1", "exp2"};
    for (int i = 0; i < 2; i++) {
        osub_spec_t ex = susp_spec(ids[i], "experiment", 61440, 0, 0);
        ex.resumable = true;
        ex.restart_cost_ms = 5000;
        running(e, ex, 60000, i);
        assert_int_equal(info(e, ids[i]).slots[0].gpu, i);
    }
    running(e, spec("fill", "batch", 70000, 1, 0), 70000, 2);
    assert_int_equal(sub(e, spec("web1", "online", 40000, 1, 0), 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(sub(e, spec("web2", "online", 40000, 1, 0), 11), OSUB_SUBMIT_PENDING);
    assert_int_equal(osub_engine_suspended(e, "exp1", 2048, 20), 0);
    assert_int_equal(osub_engine_suspended(e, "exp2", 2048, 20), 0);
    assert_int_equal(info(e, "web2").slots[0].gpu, 1);
    assert_int_equal(osub_engine_release(e, "fill", 1000), 0);
    assert_int_equal(osub_engine_tick(e, 6000), 0);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 1);
    assert_int_equal(find_ev(e, OSUB_EV_EVICT, "exp1")->reason, OSUB_R_MIGRATE); /* the older */
    assert_int_equal(osub_engine_tick(e, 7000), 0);
    assert_int_equal(info(e, "exp1").state, OSUB_STATE_DRAINING);
    assert_int_equal(info(e, "exp2").state, OSUB_STATE_SUSPENDED);
    check_ok(e);
    assert_int_equal(osub_engine_exited(e, "exp1", NULL, 8000), 0);
    assert_int_equal(info(e, "exp1").slots[0].gpu, 2);
    assert_int_equal(osub_engine_usage(e, "exp1", 60000, -1, 9000), 0);
    assert_int_equal(osub_engine_ready(e, "exp1", 9000), 0);
    assert_int_equal(osub_engine_tick(e, 60000), 0);
    assert_int_equal(info(e, "exp2").state, OSUB_STATE_SUSPENDED);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.evictions, 1);
    check_ok(e);
    osub_engine_free(e);
}

/* Saves e, loads it, checks the dumps agree; returns the loaded copy. */
static osub_engine_t *round_trip(osub_engine_t *e)
{
    char *snap = osub_engine_save(e);
    assert_non_null(snap);
    osub_engine_t *e2 = NULL;
    size_t line = 0;
    int rc = osub_engine_load(snap, &e2, &line);
    if (rc != 0)
        fail_msg("load: %s at line %zu\n%s", osub_strerror(rc), line, snap);
    char *d1 = osub_engine_dump(e), *d2 = osub_engine_dump(e2);
    assert_string_equal(d1, d2);
    free(d1);
    free(d2);
    free(snap);
    return e2;
}

/* A degradable service suspended where its GPU stays full (web, 50000 MiB, beside it leaves no
 * room for its grant) while GPU 1 has room for its floor but not for its whole request: once it
 * has waited the queue's aging time (5 min) it is evicted to migrate at its floor (counted as an
 * eviction) and restarts there degraded at once, through a snapshot too. Before that it waits.
 * Before this rule it stayed suspended for as long as web stayed. */
static void test_migrate_at_floor_after_queue_aging(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(2, 200000);
    osub_spec_t ex = susp_spec("exp", "experiment", 61440, 30000, 0);
    ex.resumable = true;
    ex.restart_cost_ms = 5000;
    running(e, ex, 60000, 0);
    running(e, spec("fill", "batch", 40000, 1, 0), 40000, 1);
    assert_int_equal(info(e, "fill").slots[0].gpu, 1);
    /* its degrade is not enough for web (30000 + 50000 over 77824): suspended */
    assert_int_equal(sub(e, spec("web", "online", 50000, 1, 0), 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDING);
    assert_int_equal(osub_engine_suspended(e, "exp", 2048, 20), 0);
    assert_int_equal(info(e, "web").slots[0].gpu, 0);
    /* GPU 1: 40000 + its floor fits, 40000 + its request does not; no migration before 5 min */
    assert_int_equal(osub_engine_tick(e, 20 + 299999), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDED);
    assert_int_equal(count_ev(e, OSUB_EV_EVICT, NULL), 0);
    assert_int_equal(osub_engine_tick(e, 20 + 300000), 0);
    const osub_event_t *ev = find_ev(e, OSUB_EV_EVICT, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_MIGRATE);
    assert_non_null(strstr(ev->msg, "for its floor"));
    assert_int_equal(info(e, "exp").state, OSUB_STATE_DRAINING);
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    assert_int_equal(p.evictions, 1);
    check_ok(e);
    /* a snapshot keeps that it may start at its floor at once */
    osub_engine_t *e2 = round_trip(e);
    osub_engine_free(e);
    e = e2;
    /* its processes gone: requeued, started at its floor on GPU 1 without the queue's wait */
    assert_int_equal(osub_engine_exited(e, "exp", NULL, 300100), 0);
    assert_non_null(find_ev(e, OSUB_EV_REQUEUE, "exp"));
    ev = find_ev(e, OSUB_EV_DEGRADE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_START_FLOOR);
    osub_service_info_t x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_DEGRADED);
    assert_int_equal(x.n_slots, 1);
    assert_int_equal(x.slots[0].gpu, 1);
    assert_int_equal(x.grant_mib, 30000);
    assert_int_equal(x.host_mib, 0);
    check_ok(e);
    osub_engine_free(e);
}

/* Relocate: exp (cuda, relocate) suspended on GPU 0 beside web, which stays, and GPU 1 frees:
 * it is woken on GPU 1 at once (reason relocate, no eviction, no restart cost waited), its grant
 * moved with it, the GPU it left named for the mechanism's remap until it has resumed; a
 * snapshot keeps that. */
static void test_relocate_onto_a_free_gpu(void **state)
{
    (void)state;
    osub_engine_t *e = suspended_beside_free_gpu_r(true, false, true);
    const osub_event_t *ev = find_ev(e, OSUB_EV_WAKE, "exp");
    assert_non_null(ev);
    assert_int_equal(ev->reason, OSUB_R_RELOCATE);
    assert_int_equal(ev->gpu, 1);
    assert_non_null(strstr(ev->msg, "GPU 0, where it was suspended"));
    assert_int_equal(ev->deadline_ms, 1000 + info(e, "exp").resume_cost_ms);
    osub_service_info_t x = info(e, "exp");
    assert_int_equal(x.state, OSUB_STATE_RESUMING);
    assert_int_equal(x.n_slots, 1);
    assert_int_equal(x.slots[0].gpu, 1);
    assert_int_equal(x.relocated_from, 0);
    assert_int_equal(x.grant_mib, 61440);
    assert_int_equal(x.host_mib, 61440); /* its host copy until it is back */
    assert_int_equal(ginfo(e, 0).granted_mib, 30000);
    assert_int_equal(ginfo(e, 1).granted_mib, 61440);
    assert_int_equal(ginfo(e, 0).used_mib, 30000 * 0 + info(e, "web").used_mib);
    assert_true(ginfo(e, 1).held_mib >= 61440 - 1); /* held as a loading service's */
    check_ok(e);
    /* a snapshot while it resumes keeps where it came from */
    osub_engine_t *e2 = round_trip(e);
    assert_int_equal(info(e2, "exp").relocated_from, 0);
    char *d1 = osub_engine_dump(e), *d2 = osub_engine_dump(e2);
    assert_string_equal(d1, d2);
    free(d1);
    free(d2);
    osub_engine_t *es[2] = {e, e2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(osub_engine_resumed(es[i], "exp", 3000), 0);
        x = info(es[i], "exp");
        assert_int_equal(x.state, OSUB_STATE_RUNNING);
        assert_int_equal(x.relocated_from, -1);
        assert_int_equal(x.host_mib, 0);
        assert_non_null(strstr(find_ev(es[i], OSUB_EV_RESUMED, "exp")->msg, "on GPU 1"));
        /* past its restart cost: nothing migrates, nobody was evicted */
        assert_int_equal(osub_engine_tick(es[i], 60000), 0);
        osub_pool_info_t p;
        osub_engine_pool_info(es[i], &p);
        assert_int_equal(p.evictions, 0);
        assert_int_equal(p.suspends, 1);
        check_ok(es[i]);
    }
    osub_engine_free(e);
    osub_engine_free(e2);
}

/* No relocation where it is not the answer: a spec that may not (another method, several GPUs,
 * exclusive) is refused; one held by an operator stays; one with no other GPU that has room
 * for its grant (logical and physical) stays suspended until one has. */
static void test_relocate_only_where_it_fits(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(2, 200000);
    osub_submit_result_t r;
    osub_spec_t v = susp_spec("v", "batch", 8192, 0, 0);
    v.suspend.method = OSUB_SUSPEND_VLLM;
    v.suspend.relocate = true;
    assert_int_equal(osub_engine_submit(e, &v, 0, 0, &r), OSUB_EBAD_SUSPEND);
    osub_spec_t two = susp_spec("two", "batch", 8192, 0, 0);
    two.gpus = 2;
    two.suspend.relocate = true;
    assert_int_equal(osub_engine_submit(e, &two, 0, 0, &r), OSUB_EBAD_SUSPEND);
    osub_spec_t ex = susp_spec("ex", "batch", 8192, 0, 0);
    ex.exclusive = true;
    ex.suspend.relocate = true;
    /* an exclusive service is never preemptible: not suspendable at all */
    assert_int_equal(osub_engine_submit(e, &ex, 0, 0, &r), OSUB_EBACKED_SUSPEND);
    osub_engine_free(e);
    /* held by an operator: it stays where it is */
    e = suspended_beside_free_gpu_r(true, true, true);
    assert_int_equal(osub_engine_tick(e, 60000), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDED);
    assert_int_equal(info(e, "exp").slots[0].gpu, 0);
    check_ok(e);
    osub_engine_free(e);
    /* GPU 1 physically free but logically full (ratio 1.0: fill2's grant leaves 20480 MiB of
     * logical room, its use little): no relocation; the logical room freed, it relocates */
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 1000;
    cfg.suspend_host_mib = 200000;
    int64_t vv[2] = {81920, 81920};
    e = mk_engine_cfg(2, vv, &cfg);
    osub_spec_t rs = susp_spec("exp", "experiment", 40000, 0, 0);
    rs.suspend.relocate = true;
    running(e, rs, 40000, 0);
    running(e, spec("fill2", "batch", 61440, 1, 0), 1000, 1);
    assert_int_equal(info(e, "fill2").slots[0].gpu, 1);
    assert_int_equal(sub(e, spec("web", "online", 41000, 1, 0), 10), OSUB_SUBMIT_PENDING);
    assert_int_equal(info(e, "web").slots[0].gpu, 0);
    assert_int_equal(osub_engine_suspended(e, "exp", 1024, 20), 0);
    assert_int_equal(osub_engine_tick(e, 60000), 0);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_SUSPENDED);
    assert_int_equal(count_ev(e, OSUB_EV_WAKE, NULL), 0);
    assert_int_equal(osub_engine_release(e, "fill2", 61000), 0);
    assert_int_equal(find_ev(e, OSUB_EV_WAKE, "exp")->reason, OSUB_R_RELOCATE);
    assert_int_equal(info(e, "exp").slots[0].gpu, 1);
    check_ok(e);
    osub_engine_free(e);
}

static void test_snapshot_round_trip(void **state)
{
    (void)state;
    osub_engine_t *e = suspended_with_queue();
    assert_int_equal(osub_engine_suspend(e, "exp", 0, 50), 0); /* held too */
    osub_spec_t h = spec("h", "batch", 2000, 1, 0);
    h.suspend.method = OSUB_SUSPEND_SGLANG;
    h.suspend.residual_mib = 512;
    h.resume_cost_ms = 1234;
    assert_int_equal(sub(e, h, 60), OSUB_SUBMIT_STARTED);
    osub_engine_t *e2 = round_trip(e);
    assert_int_equal(info(e2, "h").spec->suspend.method, OSUB_SUSPEND_SGLANG);
    assert_int_equal(info(e2, "h").residual_mib, 512);
    assert_int_equal(info(e2, "h").resume_cost_ms, 1234);
    assert_true(info(e2, "exp").suspend_hold);
    osub_pool_info_t p;
    osub_engine_pool_info(e2, &p);
    assert_int_equal(p.host_used_mib, 61440);
    assert_int_equal(p.suspends, 1);
    /* the same commands decide the same on both */
    osub_engine_t *es[2] = {e, e2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(osub_engine_release(es[i], "web", 100), 0);
        assert_int_equal(info(es[i], "exp").state, OSUB_STATE_SUSPENDED); /* held */
        assert_int_equal(info(es[i], "q").state, OSUB_STATE_LOADING);     /* it took the room */
        assert_int_equal(osub_engine_release(es[i], "q", 150), 0);
        assert_int_equal(osub_engine_resume(es[i], "exp", 200), 0);
        assert_int_equal(info(es[i], "exp").state, OSUB_STATE_RESUMING);
    }
    osub_engine_t *e3 = round_trip(e2); /* resuming: its load timer too */
    char *d1 = osub_engine_dump(e), *d3 = osub_engine_dump(e3);
    assert_string_equal(d1, d3);
    free(d1);
    free(d3);
    for (int i = 0; i < 2; i++) {
        osub_engine_t *x = i ? e3 : e;
        assert_int_equal(osub_engine_tick(x, 200 + 16000), 0);
        assert_int_equal(info(x, "exp").state, OSUB_STATE_RUNNING);
    }
    osub_engine_free(e);
    osub_engine_free(e2);
    osub_engine_free(e3);
}

/* An idle suspend is held for idleness: kept so by a snapshot, woken by a resume with reason
 * idle (a request came), and its wake time is shown; an operator's suspend over it makes the
 * hold the operator's. */
static void test_idle_hold(void **state)
{
    (void)state;
    osub_engine_t *e = mk_pool(1, 200000);
    running(e, susp_spec("exp", "batch", 40960, 0, 0), 40000, 0);
    running(e, susp_spec("op", "batch", 20480, 0, 0), 20000, 0);
    assert_int_equal(osub_engine_suspend(e, "exp", OSUB_SUSPEND_IDLE, 10), 0);
    assert_int_equal(osub_engine_suspend(e, "op", OSUB_SUSPEND_IDLE, 10), 0);
    assert_int_equal(osub_engine_suspended(e, "exp", 500, 20), 0);
    assert_int_equal(osub_engine_suspended(e, "op", 500, 20), 0);
    assert_int_equal(osub_engine_suspend(e, "op", 0, 30), 0); /* the operator's now */
    assert_true(info(e, "exp").suspend_idle);
    assert_false(info(e, "op").suspend_idle);
    assert_true(info(e, "op").suspend_hold);
    assert_int_equal(info(e, "exp").woke_ms, 0);
    osub_engine_t *e2 = round_trip(e);
    assert_true(info(e2, "exp").suspend_idle);
    assert_true(info(e2, "exp").suspend_hold);
    assert_false(info(e2, "op").suspend_idle);
    assert_true(info(e2, "op").suspend_hold);
    osub_engine_t *es[2] = {e, e2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(osub_engine_resume(es[i], "exp", 1000), 0);
        const osub_event_t *ev = find_ev(es[i], OSUB_EV_WAKE, "exp");
        assert_non_null(ev);
        assert_int_equal(ev->reason, OSUB_R_IDLE);
        assert_false(info(es[i], "exp").suspend_idle);
        assert_int_equal(info(es[i], "exp").woke_ms, 1000);
        assert_int_equal(osub_engine_resume(es[i], "op", 1000), 0);
        ev = find_ev(es[i], OSUB_EV_WAKE, "op");
        assert_non_null(ev);
        assert_int_equal(ev->reason, OSUB_R_USER);
        check_ok(es[i]);
    }
    osub_engine_free(e);
    osub_engine_free(e2);
}

/* A snapshot made before suspend (no suspend keys, no susp lines) still loads, suspend off. */
static void test_old_snapshot_loads(void **state)
{
    (void)state;
    osub_engine_t *e = mk_engine(2, 81920, 1300);
    running(e, spec("a", "batch", 30000, 1, 0), 20000, 0);
    char *snap = osub_engine_save(e);
    /* cut the keys this version added */
    static const char *const keys[] = {
        " suspend_host=",        " suspend_rate=", " suspend_timeout=",
        " suspend_min_runtime=", " suspends=",     " wakes="};
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        char *p = strstr(snap, keys[k]);
        assert_non_null(p);
        char *end = p + 1;
        while (*end != ' ' && *end != '\n')
            end++;
        memmove(p, end, strlen(end) + 1);
    }
    assert_null(strstr(snap, "suspend"));
    osub_engine_t *e2 = NULL;
    assert_int_equal(osub_engine_load(snap, &e2, NULL), 0);
    osub_pool_config_t cfg;
    osub_engine_config(e2, &cfg);
    assert_int_equal(cfg.suspend_host_mib, 0);
    assert_int_equal(cfg.suspend_timeout_ms, 30000);
    assert_int_equal(info(e2, "a").state, OSUB_STATE_RUNNING);
    free(snap);
    osub_engine_free(e);
    osub_engine_free(e2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_checks),
        cmocka_unit_test(test_ladder_degrade_then_suspend_then_evict),
        cmocka_unit_test(test_key_suspend_beats_evict_priority_first),
        cmocka_unit_test(test_host_budget_refuses_suspend_next_rung),
        cmocka_unit_test(test_idle_hold),
        cmocka_unit_test(test_timeout_and_failure_escalate_to_eviction),
        cmocka_unit_test(test_residual_above_plan_replans),
        cmocka_unit_test(test_multi_gpu_victim_suspended_everywhere),
        cmocka_unit_test(test_wake_ahead_of_the_queue),
        cmocka_unit_test(test_min_runtime_after_wake),
        cmocka_unit_test(test_pressure_degrades_before_suspending),
        cmocka_unit_test(test_operator_suspend_and_resume),
        cmocka_unit_test(test_migrate_after_restart_cost),
        cmocka_unit_test(test_migrate_only_when_it_helps),
        cmocka_unit_test(test_migrate_one_at_a_time),
        cmocka_unit_test(test_migrate_at_floor_after_queue_aging),
        cmocka_unit_test(test_relocate_onto_a_free_gpu),
        cmocka_unit_test(test_relocate_only_where_it_fits),
        cmocka_unit_test(test_snapshot_round_trip),
        cmocka_unit_test(test_old_snapshot_loads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
