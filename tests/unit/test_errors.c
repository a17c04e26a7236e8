/* test_errors.c - every refused command returns its own error code and changes nothing */
#include "helpers.h"

static const int64_t T = 100000;
/* Refusals are tried an hour later, when timers are due (a loading period and an overdue
 * deadline): a refused command must not run them either. */
static const int64_t T2 = T + 3600000;

/* A pool with services in many states: running, degraded awaiting ack, pending, queued. */
static osub_engine_t *rich(void)
{
    osub_engine_t *e = mk_engine(3, 81920, 1500);
    assert_int_equal(osub_engine_cordon(e, 2, true, 0), 0);
    osub_spec_t s = spec("exp", "experiment", 81920, 1, 40960);
    s.batch_size = 32;
    s.min_batch_size = 8;
    assert_int_equal(sub(e, s, 0), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("bat", "batch", 81920, 1, 0), 0), OSUB_SUBMIT_STARTED);
    osub_engine_ready(e, "exp", 1000);
    osub_engine_ready(e, "bat", 1000);
    osub_engine_usage(e, "exp", 61440, -1, 1000);
    osub_engine_usage(e, "bat", 61440, -1, 1000);
    assert_int_equal(sub(e, spec("web", "online", 40960, 1, 0), 2000), OSUB_SUBMIT_PENDING);
    assert_int_equal(osub_engine_cordon(e, 2, false, 2500), 0);
    assert_int_equal(sub(e, spec("calm", "batch", 1024, 1, 0), 2600), OSUB_SUBMIT_STARTED);
    assert_int_equal(sub(e, spec("later", "experiment", 163840, 2, 0), 3000), OSUB_SUBMIT_QUEUED);
    assert_int_equal(osub_engine_tick(e, T), 0);
    check_ok(e);
    assert_int_equal(info(e, "exp").state, OSUB_STATE_OVERDUE);
    assert_int_equal(info(e, "bat").state, OSUB_STATE_RUNNING);
    assert_int_equal(info(e, "calm").state, OSUB_STATE_RUNNING);
    assert_int_equal(info(e, "web").state, OSUB_STATE_LOADING);
    assert_int_equal(info(e, "later").state, OSUB_STATE_QUEUED);
    return e;
}

typedef int (*cmd_fn)(osub_engine_t *e);

#define SPEC_CASE(fname, body)                                                                     \
    static int fname(osub_engine_t *e)                                                             \
    {                                                                                              \
        osub_spec_t s = spec("fresh", "batch", 1024, 1, 0);                                        \
        body;                                                                                      \
        osub_submit_result_t r;                                                                    \
        return osub_engine_submit(e, &s, T2, 0, &r);                                               \
    }

SPEC_CASE(c_bad_id_upper, snprintf(s.id, sizeof(s.id), "Bad"))
SPEC_CASE(c_bad_id_empty, s.id[0] = '\0')
SPEC_CASE(c_bad_id_digit, snprintf(s.id, sizeof(s.id), "1abc"))
SPEC_CASE(c_bad_id_chars, snprintf(s.id, sizeof(s.id), "a_b"))
SPEC_CASE(c_vram_zero, s.vram_mib = 0)
SPEC_CASE(c_vram_negative, s.vram_mib = -5)
SPEC_CASE(c_vram_too_big, s.vram_mib = 81921; s.gpus = 1)
SPEC_CASE(c_vram_larger_than_pool, s.vram_mib = 4 * 81920)
SPEC_CASE(c_min_over_vram, s.min_vram_mib = 2048)
SPEC_CASE(c_min_negative, s.min_vram_mib = -1)
SPEC_CASE(c_backed_preemptible, snprintf(s.class_name, sizeof(s.class_name), "online");
          s.preemptible = OSUB_TRI_YES)
SPEC_CASE(c_exclusive_preemptible, s.exclusive = true; s.preemptible = OSUB_TRI_YES)
SPEC_CASE(c_unknown_class, snprintf(s.class_name, sizeof(s.class_name), "gold"))
SPEC_CASE(c_conflict, snprintf(s.id, sizeof(s.id), "bat"); s.vram_mib = 1000)
SPEC_CASE(c_too_many_gpus, s.gpus = 4)
SPEC_CASE(c_way_too_many_gpus, s.gpus = 1000)
SPEC_CASE(c_bad_batch, s.batch_size = 4; s.min_batch_size = 8)
SPEC_CASE(c_bad_compute, s.compute_pct = 101)
SPEC_CASE(c_requeue_not_resumable, s.on_evict = OSUB_ON_EVICT_REQUEUE)
SPEC_CASE(c_bad_restart_cost, s.restart_cost_ms = -7)

static int c_time_backwards(osub_engine_t *e)
{
    osub_spec_t s = spec("fresh", "batch", 1024, 1, 0);
    osub_submit_result_t r;
    return osub_engine_submit(e, &s, T - 1, 0, &r);
}
static int c_usage_unknown(osub_engine_t *e)
{
    return osub_engine_usage(e, "nobody", 10, -1, T2);
}
static int c_usage_negative(osub_engine_t *e)
{
    return osub_engine_usage(e, "bat", -1, -1, T2);
}
static int c_usage_queued(osub_engine_t *e)
{
    return osub_engine_usage(e, "later", 10, -1, T2);
}
static int c_usage_per_gpu_count(osub_engine_t *e)
{
    int64_t u[2] = {1, 2};
    return osub_engine_usage_per_gpu(e, "bat", u, 2, T2);
}
static int c_usage_per_gpu_negative(osub_engine_t *e)
{
    int64_t u[1] = {-3};
    return osub_engine_usage_per_gpu(e, "bat", u, 1, T2);
}
static int c_ack_unknown(osub_engine_t *e)
{
    return osub_engine_ack(e, "nobody", NULL, T2);
}
static int c_ack_unasked(osub_engine_t *e)
{
    return osub_engine_ack(e, "calm", NULL, T2);
}
static int c_release_unknown(osub_engine_t *e)
{
    return osub_engine_release(e, "nobody", T2);
}
static int c_release_bad_id(osub_engine_t *e)
{
    return osub_engine_release(e, "NOPE", T2);
}
static int c_ready_queued(osub_engine_t *e)
{
    return osub_engine_ready(e, "later", T2);
}
static int c_exited_unknown(osub_engine_t *e)
{
    return osub_engine_exited(e, "nobody", NULL, T2);
}
static int c_ratio_low(osub_engine_t *e)
{
    return osub_engine_set_ratio(e, 999, T2);
}
static int c_ratio_high(osub_engine_t *e)
{
    return osub_engine_set_ratio(e, 100001, T2);
}
static int c_ratio_precision(osub_engine_t *e)
{
    int32_t m;
    int rc = osub_parse_ratio("1.2345", &m);
    if (rc == 0)
        return osub_engine_set_ratio(e, m, T2);
    return rc;
}
static int c_cordon_bad_gpu(osub_engine_t *e)
{
    return osub_engine_cordon(e, 3, true, T2);
}
static int c_cordon_negative_gpu(osub_engine_t *e)
{
    return osub_engine_cordon(e, -1, true, T2);
}
static int c_lost_bad_gpu(osub_engine_t *e)
{
    return osub_engine_gpu_lost(e, 7, T2);
}
static int c_system_negative(osub_engine_t *e)
{
    return osub_engine_system_usage(e, 0, -1, T2);
}
static int c_system_bad_gpu(osub_engine_t *e)
{
    return osub_engine_system_usage(e, 9, 1, T2);
}
static int c_resize_below_min(osub_engine_t *e)
{
    return osub_engine_resize(e, "exp", 1000, 0, 0, T2);
}
static int c_resize_grow_too_big(osub_engine_t *e)
{
    return osub_engine_resize(e, "bat", 200000, 0, 0, T2);
}
static int c_resize_grow_no_room(osub_engine_t *e)
{
    return osub_engine_resize(e, "calm", 81920, 0, 0, T2);
}
static int c_resize_unknown(osub_engine_t *e)
{
    return osub_engine_resize(e, "nobody", 1000, 0, 0, T2);
}
static int c_resize_negative(osub_engine_t *e)
{
    return osub_engine_resize(e, "bat", -1, 0, 0, T2);
}
SPEC_CASE(c_backed_suspend, snprintf(s.class_name, sizeof(s.class_name), "online");
          s.suspend.method = OSUB_SUSPEND_CUDA)
SPEC_CASE(c_suspend_residual_too_big, s.suspend.method = OSUB_SUSPEND_VLLM;
          s.suspend.residual_mib = 4096)
SPEC_CASE(c_suspend_bad_method, s.suspend.method = (osub_suspend_method_t)9)
static int c_suspend_unsuspendable(osub_engine_t *e)
{
    return osub_engine_suspend(e, "calm", 0, T2);
}
static int c_suspend_unknown(osub_engine_t *e)
{
    return osub_engine_suspend(e, "nobody", 0, T2);
}
static int c_resume_running(osub_engine_t *e)
{
    return osub_engine_resume(e, "calm", T2);
}
static int c_suspended_running(osub_engine_t *e)
{
    return osub_engine_suspended(e, "calm", 0, T2);
}
static int c_resumed_running(osub_engine_t *e)
{
    return osub_engine_resumed(e, "calm", T2);
}
static int c_suspend_failed_running(osub_engine_t *e)
{
    return osub_engine_suspend_failed(e, "bat", "x", T2);
}
static int c_tick_backwards(osub_engine_t *e)
{
    return osub_engine_tick(e, T - 5);
}
static int c_time_negative(osub_engine_t *e)
{
    return osub_engine_tick(e, -1);
}

static const struct {
    const char *name;
    cmd_fn fn;
    int rc;
} cases[] = {
    {"bad id (upper case)", c_bad_id_upper, OSUB_EBAD_ID},
    {"bad id (empty)", c_bad_id_empty, OSUB_EBAD_ID},
    {"bad id (digit first)", c_bad_id_digit, OSUB_EBAD_ID},
    {"bad id (underscore)", c_bad_id_chars, OSUB_EBAD_ID},
    {"vram 0", c_vram_zero, OSUB_EBAD_VRAM},
    {"vram negative", c_vram_negative, OSUB_EBAD_VRAM},
    {"vram over one GPU", c_vram_too_big, OSUB_ETOO_BIG},
    {"vram larger than the pool", c_vram_larger_than_pool, OSUB_ETOO_BIG},
    {"min_vram over vram", c_min_over_vram, OSUB_EBAD_MIN_VRAM},
    {"min_vram negative", c_min_negative, OSUB_EBAD_MIN_VRAM},
    {"backed class preemptible", c_backed_preemptible, OSUB_EBACKED_PREEMPTIBLE},
    {"exclusive preemptible", c_exclusive_preemptible, OSUB_EEXCLUSIVE_PREEMPTIBLE},
    {"unknown class", c_unknown_class, OSUB_EUNKNOWN_CLASS},
    {"different spec, same id", c_conflict, OSUB_ESPEC_CONFLICT},
    {"more GPUs than the pool", c_too_many_gpus, OSUB_ETOO_MANY_GPUS},
    {"far more GPUs", c_way_too_many_gpus, OSUB_ETOO_MANY_GPUS},
    {"min batch over batch", c_bad_batch, OSUB_EBAD_BATCH},
    {"compute over 100", c_bad_compute, OSUB_EBAD_COMPUTE},
    {"requeue, not resumable", c_requeue_not_resumable, OSUB_EBAD_ON_EVICT},
    {"negative restart cost", c_bad_restart_cost, OSUB_EBAD_TIME},
    {"time backwards", c_time_backwards, OSUB_ETIME_BACKWARDS},
    {"usage for unknown", c_usage_unknown, OSUB_EUNKNOWN_SERVICE},
    {"negative usage", c_usage_negative, OSUB_ENEGATIVE_USAGE},
    {"usage for queued", c_usage_queued, OSUB_EBAD_STATE},
    {"usage per GPU, wrong count", c_usage_per_gpu_count, OSUB_EINVAL},
    {"usage per GPU, negative", c_usage_per_gpu_negative, OSUB_ENEGATIVE_USAGE},
    {"ack for unknown", c_ack_unknown, OSUB_EUNKNOWN_SERVICE},
    {"ack nobody asked for", c_ack_unasked, OSUB_ENO_DIRECTIVE},
    {"release unknown", c_release_unknown, OSUB_EUNKNOWN_SERVICE},
    {"release bad id", c_release_bad_id, OSUB_EBAD_ID},
    {"ready while queued", c_ready_queued, OSUB_EBAD_STATE},
    {"exited unknown", c_exited_unknown, OSUB_EUNKNOWN_SERVICE},
    {"ratio under 1", c_ratio_low, OSUB_ERATIO_RANGE},
    {"ratio over 100", c_ratio_high, OSUB_ERATIO_RANGE},
    {"ratio with four decimals", c_ratio_precision, OSUB_ERATIO_PRECISION},
    {"cordon unknown GPU", c_cordon_bad_gpu, OSUB_EBAD_GPU},
    {"cordon negative GPU", c_cordon_negative_gpu, OSUB_EBAD_GPU},
    {"lose unknown GPU", c_lost_bad_gpu, OSUB_EBAD_GPU},
    {"negative system usage", c_system_negative, OSUB_ENEGATIVE_USAGE},
    {"system usage, unknown GPU", c_system_bad_gpu, OSUB_EBAD_GPU},
    {"resize below min", c_resize_below_min, OSUB_ENO_SHRINK_BELOW_MIN},
    {"resize, too big for its GPU", c_resize_grow_too_big, OSUB_ETOO_BIG},
    {"resize, no room", c_resize_grow_no_room, OSUB_ENO_ROOM},
    {"resize unknown", c_resize_unknown, OSUB_EUNKNOWN_SERVICE},
    {"resize negative", c_resize_negative, OSUB_EBAD_VRAM},
    {"backed service declares suspend", c_backed_suspend, OSUB_EBACKED_SUSPEND},
    {"suspend residual above the request", c_suspend_residual_too_big, OSUB_EBAD_SUSPEND},
    {"unknown suspend method", c_suspend_bad_method, OSUB_EBAD_SUSPEND},
    {"suspend, no method", c_suspend_unsuspendable, OSUB_ENOT_SUSPENDABLE},
    {"suspend unknown", c_suspend_unknown, OSUB_EUNKNOWN_SERVICE},
    {"resume a running service", c_resume_running, OSUB_EBAD_STATE},
    {"suspended report, not suspending", c_suspended_running, OSUB_EBAD_STATE},
    {"resumed report, not resuming", c_resumed_running, OSUB_EBAD_STATE},
    {"suspend failed, neither", c_suspend_failed_running, OSUB_EBAD_STATE},
    {"tick backwards", c_tick_backwards, OSUB_ETIME_BACKWARDS},
    {"negative time", c_time_negative, OSUB_EBAD_TIME},
};

static void test_refused_commands_change_nothing(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        osub_engine_t *e = rich();
        assert_true(osub_engine_next_deadline(e) <= T2); /* timers are due */
        char *before = osub_engine_dump(e);
        assert_non_null(before);
        int rc = cases[i].fn(e);
        if (rc != cases[i].rc)
            fail_msg("%s: got %d (%s), want %d (%s)", cases[i].name, rc, osub_errcode(rc),
                     cases[i].rc, osub_errcode(cases[i].rc));
        assert_string_not_equal(osub_strerror(rc), "unknown error");
        /* regression: a command refused before reaching the state showed the last command's
         * events, which the daemon then logged a second time */
        size_t nev;
        const osub_event_t *evs = osub_engine_events(e, &nev);
        bool engine_called = strstr(cases[i].name, "four decimals") == NULL; /* parse only */
        for (size_t k = 0; k < nev && engine_called; k++)
            if (evs[k].kind != OSUB_EV_REJECT)
                fail_msg("%s: stale event '%s' after a refusal", cases[i].name, evs[k].msg);
        char *after = osub_engine_dump(e);
        assert_non_null(after);
        if (strcmp(before, after) != 0)
            fail_msg("%s changed the state:\n--- before\n%s--- after\n%s", cases[i].name, before,
                     after);
        check_ok(e);
        free(before);
        free(after);
        osub_engine_free(e);
    }
}

static void test_codes_are_distinct_per_kind(void **state)
{
    (void)state;
    /* the list: each refusal has its own code */
    int kinds[] = {OSUB_EBAD_ID,          OSUB_EBAD_VRAM,           OSUB_ETOO_BIG,
                   OSUB_EBAD_MIN_VRAM,    OSUB_EBACKED_PREEMPTIBLE, OSUB_EEXCLUSIVE_PREEMPTIBLE,
                   OSUB_ERATIO_PRECISION, OSUB_EUNKNOWN_CLASS,      OSUB_ESPEC_CONFLICT,
                   OSUB_ETOO_MANY_GPUS,   OSUB_EUNKNOWN_SERVICE,    OSUB_ENEGATIVE_USAGE,
                   OSUB_ENO_DIRECTIVE};
    size_t n = sizeof(kinds) / sizeof(kinds[0]);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(osub_strerror(kinds[i]), osub_strerror(kinds[j]));
}

static void test_bad_config(void **state)
{
    (void)state;
    osub_pool_config_t c;
    int64_t v[2] = {81920, 81920};
    osub_engine_t *e = NULL;
    osub_pool_config_default(&c);
    c.low_watermark_pct = 99;
    assert_int_equal(osub_engine_new(&c, v, NULL, 2, NULL, 0, &e), OSUB_EBAD_CONFIG);
    osub_pool_config_default(&c);
    c.ratio_milli = 500;
    assert_int_equal(osub_engine_new(&c, v, NULL, 2, NULL, 0, &e), OSUB_ERATIO_RANGE);
    osub_pool_config_default(&c);
    c.margin_mib = 90000;
    assert_int_equal(osub_engine_new(&c, v, NULL, 2, NULL, 0, &e), OSUB_EBAD_CONFIG);
    osub_pool_config_default(&c);
    assert_int_equal(osub_engine_new(&c, v, NULL, 0, NULL, 0, &e), OSUB_EBAD_CONFIG);
    osub_class_t cls[2] = {{"a", 0, true, -1}, {"b", 1, true, -1}};
    assert_int_equal(osub_engine_new(&c, v, NULL, 2, cls, 2, &e), OSUB_EBAD_CLASS);
    osub_class_t dup[2] = {{"a", 0, false, -1}, {"a", 1, true, -1}};
    assert_int_equal(osub_engine_new(&c, v, NULL, 2, dup, 2, &e), OSUB_EBAD_CLASS);
    assert_null(e);
}

static void test_same_spec_is_idempotent(void **state)
{
    (void)state;
    osub_engine_t *e = rich();
    char *before = osub_engine_dump(e);
    osub_spec_t s = spec("bat", "batch", 81920, 1, 0);
    osub_submit_result_t r;
    assert_int_equal(osub_engine_submit(e, &s, T2, 0, &r), 0); /* a retry runs no timer */
    assert_int_equal(r.outcome, OSUB_SUBMIT_EXISTS);
    char *after = osub_engine_dump(e);
    assert_string_equal(before, after);
    free(before);
    free(after);
    osub_engine_free(e);
}

static void test_dry_run_predicts_and_changes_nothing(void **state)
{
    (void)state;
    osub_spec_t probes[] = {
        spec("p1", "online", 40960, 1, 0),     spec("p2", "online", 81920, 1, 0),
        spec("p3", "batch", 1024, 1, 0),       spec("p4", "experiment", 81920, 1, 0),
        spec("p5", "online", 81920 * 2, 2, 0), spec("p6", "batch", 40960, 1, 20480),
    };
    /* at the last command's time, and an hour later when timers are due: the dry run runs them
     * on its copy as the real submit does (the loading service is running by then) */
    for (size_t i = 0; i < 2 * sizeof(probes) / sizeof(probes[0]); i++) {
        size_t pi = i % (sizeof(probes) / sizeof(probes[0]));
        int64_t at = i < sizeof(probes) / sizeof(probes[0]) ? T : T2;
        osub_engine_t *e = rich();
        char *before = osub_engine_dump(e);
        osub_submit_result_t dry, real;
        int rc_dry = osub_engine_submit(e, &probes[pi], at, OSUB_SUBMIT_DRY_RUN, &dry);
        char *after = osub_engine_dump(e);
        assert_string_equal(before, after);
        free(before);
        free(after);
        osub_engine_free(e);
        e = rich();
        int rc_real = osub_engine_submit(e, &probes[pi], at, 0, &real);
        assert_int_equal(rc_dry, rc_real);
        assert_int_equal(dry.outcome, real.outcome);
        assert_int_equal(dry.n_gpus, real.n_gpus);
        for (int32_t g = 0; g < dry.n_gpus; g++)
            assert_int_equal(dry.gpus[g], real.gpus[g]);
        assert_int_equal(dry.n_victims, real.n_victims);
        for (int32_t v = 0; v < dry.n_victims; v++) {
            assert_string_equal(dry.victims[v].service, real.victims[v].service);
            assert_int_equal(dry.victims[v].evict, real.victims[v].evict);
        }
        assert_int_equal(dry.queue_position, real.queue_position);
        check_ok(e);
        osub_engine_free(e);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_commands_change_nothing),
        cmocka_unit_test(test_codes_are_distinct_per_kind),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_same_spec_is_idempotent),
        cmocka_unit_test(test_dry_run_predicts_and_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
