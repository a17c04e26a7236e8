/* test_alloc.c - every allocation the engine makes may fail: for each command of a stream
 * that goes through admission, preemption, acknowledgement, restore, the queue, resize, a
 * lost GPU and snapshots, fail its nth allocation for every n; the engine must refuse or
 * carry on cleanly, stay consistent (osub_engine_check), leak nothing (the sanitizer build)
 * and decide the rest of the stream without error. */
#include "helpers.h"

/* src/engine/alloc.c: allocation number n fails from now on (n < 0: none); returns how many
 * were made since the last call */
long osub__alloc_fail_at(long n);

enum op {
    SUB,
    USE,
    READY,
    ACK,
    EXIT,
    TICK,
    REL,
    RESIZE,
    RATIO,
    CORDON,
    DRAIN,
    LOST,
    SYS,
    ROUND,
    SUSPSUB, /* a submit of a service that may be suspended (cuda) */
    SUSPENDED,
    RESUMED,
    OPSUSPEND,
    OPRESUME,
    SUSPFAIL
};

struct step {
    enum op op;
    const char *id;
    const char *cls;
    int64_t a, b; /* vram and min_vram / used / ratio / gpu */
    int32_t gpus;
    int64_t at;
};

static const struct step stream[] = {
    {SUB, "web", "online", 40960, 0, 1, 0},
    {SUB, "bat", "batch", 61440, 20480, 1, 100},
    {SUB, "exp", "experiment", 61440, 30720, 1, 200},
    {SUB, "big", "batch", 2 * 61440, 2 * 20480, 2, 300},
    {READY, "web", NULL, 0, 0, 0, 400},
    {USE, "web", NULL, 38000, 0, 0, 500},
    {USE, "bat", NULL, 50000, 0, 0, 600},
    {USE, "exp", NULL, 60000, 0, 0, 700},
    {SUB, "web2", "online", 70000, 0, 1, 800},
    {SUB, "late", "experiment", 81920, 40960, 1, 900},
    {ACK, "exp", NULL, 0, 0, 0, 1000},
    {TICK, NULL, NULL, 0, 0, 0, 5000},
    {EXIT, "exp", NULL, 0, 0, 0, 6000},
    {SYS, NULL, NULL, 2048, 0, 1, 6500},
    {RESIZE, "bat", NULL, 51200, 0, 0, 7000},
    {TICK, NULL, NULL, 0, 0, 0, 200000},
    {ROUND, NULL, NULL, 0, 0, 0, 0},
    {RATIO, NULL, NULL, 2000, 0, 0, 210000},
    {CORDON, NULL, NULL, 3, 0, 0, 220000},
    {DRAIN, NULL, NULL, 3, 0, 0, 230000},
    {SUB, "many", "experiment", 4096, 1024, 1, 240000},
    {LOST, NULL, NULL, 2, 0, 0, 250000},
    {REL, "web2", NULL, 0, 0, 0, 260000},
    {USE, "bat", NULL, 1024, 0, 0, 270000},
    {TICK, NULL, NULL, 0, 0, 0, 400000},
    {ROUND, NULL, NULL, 0, 0, 0, 0},
    {REL, "late", NULL, 0, 0, 0, 410000},
    {TICK, NULL, NULL, 0, 0, 0, 900000},
};
static const size_t n_stream = sizeof(stream) / sizeof(stream[0]);

/* Suspend: a victim suspended for an online arrival, its report, the wake once the arrival
 * leaves, the operator's suspend and resume, a failed mechanism, a snapshot with all of it. */
static const struct step susp_stream[] = {
    {SUSPSUB, "exp", "experiment", 61440, 51200, 1, 0},
    {SUSPSUB, "bat", "batch", 40960, 0, 1, 10},
    {USE, "exp", NULL, 60000, 0, 0, 100},
    {USE, "bat", NULL, 40000, 0, 0, 100},
    {SUB, "web", "online", 30000, 0, 1, 200},
    {SUB, "web2", "online", 50000, 0, 1, 250},
    {ROUND, NULL, NULL, 0, 0, 0, 0},
    {SUSPENDED, "exp", NULL, 2048, 0, 0, 300},
    {SUSPENDED, "bat", NULL, 1024, 0, 0, 310},
    {ROUND, NULL, NULL, 0, 0, 0, 0},
    {REL, "web", NULL, 0, 0, 0, 400},
    {REL, "web2", NULL, 0, 0, 0, 410},
    {RESUMED, "exp", NULL, 0, 0, 0, 500},
    {OPSUSPEND, "exp", NULL, 0, 0, 0, 600},
    {SUSPENDED, "exp", NULL, 2048, 0, 0, 700},
    {OPRESUME, "exp", NULL, 0, 0, 0, 800},
    {SUSPFAIL, "exp", NULL, 0, 0, 0, 900},
    {TICK, NULL, NULL, 0, 0, 0, 100000},
    {ROUND, NULL, NULL, 0, 0, 0, 0},
};
static const size_t n_susp_stream = sizeof(susp_stream) / sizeof(susp_stream[0]);

/* ROUND: a snapshot round trip of the whole engine (save and load allocate). */
static int run_step(osub_engine_t **ep, const struct step *s)
{
    osub_engine_t *e = *ep;
    switch (s->op) {
    case SUSPSUB: {
        osub_spec_t sp = spec(s->id, s->cls, s->a, s->gpus, s->b);
        sp.suspend.method = OSUB_SUSPEND_CUDA;
        osub_submit_result_t r;
        int rc = osub_engine_submit(e, &sp, s->at, 0, &r);
        if (rc == 0)
            rc = osub_engine_ready(e, s->id, s->at);
        return rc;
    }
    case SUSPENDED:
        return osub_engine_suspended(e, s->id, s->a, s->at);
    case RESUMED:
        return osub_engine_resumed(e, s->id, s->at);
    case OPSUSPEND:
        return osub_engine_suspend(e, s->id, 0, s->at);
    case OPRESUME:
        return osub_engine_resume(e, s->id, s->at);
    case SUSPFAIL:
        return osub_engine_suspend_failed(e, s->id, "test", s->at);
    case SUB: {
        osub_spec_t sp = spec(s->id, s->cls, s->a, s->gpus, s->b);
        osub_submit_result_t r;
        int rc = osub_engine_submit(e, &sp, s->at, 0, &r);
        return rc == OSUB_ENO_ROOM ? 0 : rc;
    }
    case USE:
        return osub_engine_usage(e, s->id, s->a, -1, s->at);
    case READY:
        return osub_engine_ready(e, s->id, s->at);
    case ACK:
        return osub_engine_ack(e, s->id, "ck", s->at);
    case EXIT:
        return osub_engine_exited(e, s->id, NULL, s->at);
    case TICK:
        return osub_engine_tick(e, s->at);
    case REL:
        return osub_engine_release(e, s->id, s->at);
    case RESIZE:
        return osub_engine_resize(e, s->id, s->a, 0, 0, s->at);
    case RATIO:
        return osub_engine_set_ratio(e, (int32_t)s->a, s->at);
    case CORDON:
        return osub_engine_cordon(e, (int32_t)s->a, true, s->at);
    case DRAIN:
        return osub_engine_drain_gpu(e, (int32_t)s->a, s->at);
    case LOST:
        return osub_engine_gpu_lost(e, (int32_t)s->a, s->at);
    case SYS:
        return osub_engine_system_usage(e, (int32_t)s->gpus, s->a, s->at);
    case ROUND: {
        char *text = osub_engine_save(e);
        if (text == NULL)
            return OSUB_ENOMEM;
        osub_engine_t *n = NULL;
        size_t line = 0;
        int rc = osub_engine_load(text, &n, &line);
        if (rc != 0 && rc != OSUB_ENOMEM) {
            const char *l = text;
            for (size_t k = 1; k < line && l != NULL; k++)
                if ((l = strchr(l, '\n')) != NULL)
                    l++;
            fprintf(stderr, "load refused line %zu: %.200s\n", line, l ? l : "?");
        }
        free(text);
        if (rc != 0)
            return rc;
        osub_engine_free(e);
        *ep = n;
        return 0;
    }
    }
    return OSUB_EINVAL;
}

/* Refusals the stream may meet whatever failed before (a service a lost GPU took away, an
 * acknowledgement nobody asked for any more): the engine's ordinary answers. */
static bool benign(int rc)
{
    return rc == 0 || rc == OSUB_EUNKNOWN_SERVICE || rc == OSUB_EBAD_STATE ||
           rc == OSUB_ENO_DIRECTIVE || rc == OSUB_EGPU_LOST;
}

static osub_engine_t *copy_of(const osub_engine_t *e)
{
    char *text = osub_engine_save(e);
    assert_non_null(text);
    osub_engine_t *c = NULL;
    assert_int_equal(osub_engine_load(text, &c, NULL), 0);
    free(text);
    return c;
}

static void consistent(const osub_engine_t *e, size_t step, long n)
{
    char why[512];
    if (osub_engine_check(e, why, sizeof(why)) != 0)
        fail_msg("step %zu, allocation %ld failed: inconsistent: %s", step, n, why);
}

/* Runs the stream, failing each allocation of each step in turn; counts the points tried and
 * the refusals for memory. */
static void every_allocation(osub_engine_t **ep, const struct step *st, size_t n_st,
                             long *points_out, long *enomem_out)
{
    long points = 0, enomem = 0;
    osub_engine_t *e = *ep;
    for (size_t i = 0; i < n_st; i++) {
        for (long n = 0;; n++) {
            osub_engine_t *c = copy_of(e);
            char *before = osub_engine_dump(c);
            assert_non_null(before);
            osub__alloc_fail_at(n);
            int rc = run_step(&c, &st[i]);
            long made = osub__alloc_fail_at(-1);
            if (made <= n) { /* the command made fewer allocations: nothing failed */
                free(before);
                osub_engine_free(c);
                break;
            }
            points++;
            if (rc != 0 && rc != OSUB_ENOMEM)
                fail_msg("step %zu, allocation %ld failed: %s, not out of memory", i, n,
                         osub_strerror(rc));
            if (rc == OSUB_ENOMEM) {
                enomem++;
                /* refused before its time: nothing changed; refused after it (the timers due
                 * ran): no service of its own was added */
                if (st[i].op == SUB) {
                    osub_service_info_t si;
                    assert_int_not_equal(osub_engine_service_info(c, st[i].id, &si), 0);
                }
            }
            consistent(c, i, n);
            /* the engine stays usable: the rest of the stream runs without error */
            for (size_t j = i + 1; j < n_st; j++) {
                int r2 = run_step(&c, &st[j]);
                if (!benign(r2))
                    fail_msg("after step %zu failed at allocation %ld, step %zu: %s", i, n, j,
                             osub_strerror(r2));
                consistent(c, j, -1);
            }
            free(before);
            osub_engine_free(c);
        }
        int rc = run_step(&e, &st[i]);
        if (!benign(rc))
            fail_msg("step %zu without failures: %s", i, osub_strerror(rc));
        consistent(e, i, -1);
    }
    *ep = e;
    *points_out = points;
    *enomem_out = enomem;
}

static void test_every_allocation_may_fail(void **state)
{
    (void)state;
    osub__alloc_fail_at(-1);
    osub_engine_t *e = mk_engine(4, 81920, 1500);
    long points = 0, enomem = 0;
    every_allocation(&e, stream, n_stream, &points, &enomem);
    osub_pool_info_t pi;
    osub_engine_pool_info(e, &pi);
    assert_true(pi.admissions >= 5);
    assert_true(pi.degrades + pi.evictions >= 1);
    /* the stream reached many allocation points and some commands were refused for memory */
    printf("allocation failures tried: %ld, refused with out of memory: %ld\n", points, enomem);
    assert_true(points >= 40);
    assert_true(enomem >= 10);
    osub_engine_free(e);
}

static void test_every_allocation_may_fail_suspend(void **state)
{
    (void)state;
    osub__alloc_fail_at(-1);
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 2000;
    cfg.suspend_host_mib = 200000;
    int64_t v[2] = {81920, 81920};
    osub_engine_t *e = mk_engine_cfg(2, v, &cfg);
    long points = 0, enomem = 0;
    every_allocation(&e, susp_stream, n_susp_stream, &points, &enomem);
    osub_pool_info_t pi;
    osub_engine_pool_info(e, &pi);
    assert_true(pi.suspends >= 2);
    assert_true(pi.wakes >= 2);
    printf("suspend stream: allocation failures tried: %ld, refused with out of memory: %ld\n",
           points, enomem);
    osub_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_may_fail),
        cmocka_unit_test(test_every_allocation_may_fail_suspend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
