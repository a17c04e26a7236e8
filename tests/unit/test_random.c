/* test_random.c - a million random commands over random pools, every invariant checked after
 * every command. Prints its seed on failure; replay with OSUB_SEED=<seed> (and optionally
 * OSUB_COMMANDS=<n>). */
#include <inttypes.h>

#include "helpers.h"
#include "internal.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int64_t rr(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static uint64_t seed;
static long cmd_no;

static bool verify;
static int pool_max = 12; /* GPUs in a random pool: 1..pool_max */

static osub_engine_t *random_pool(void)
{
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = (int32_t)rr(1000, 2500);
    cfg.margin_mib = rr(0, 3) == 0 ? 1024 : 0;
    cfg.ack_timeout_ms = rr(1000, 20000);
    cfg.grace_ms = rr(0, 40000);
    cfg.hysteresis_ms = rr(0, 120000);
    cfg.min_runtime_ms = rr(0, 600000);
    cfg.restart_cost_ms = rr(0, 90000);
    cfg.queue_aging_ms = rr(0, 600000);
    /* suspend: off in a third of the pools, else a host budget from tight to ample */
    cfg.suspend_host_mib = rr(0, 2) == 0 ? 0 : rr(20000, 600000);
    cfg.suspend_mib_per_s = rr(512, 8192);
    cfg.suspend_timeout_ms = rr(1000, 40000);
    cfg.suspend_min_runtime_ms = rr(0, 120000);
    int n = (int)rr(1, pool_max);
    int64_t v[512];
    static const int64_t sizes[] = {81920, 40960, 24576, 143771};
    int kinds = (int)rr(1, 3);
    for (int i = 0; i < n; i++)
        v[i] = sizes[rr(0, kinds - 1)];
    osub_engine_t *e = NULL;
    if (osub_engine_new(&cfg, v, NULL, (size_t)n, NULL, 0, &e) != 0)
        fail_msg("seed %" PRIu64 ": engine_new failed", seed);
    osub__verify_plans(e, verify, NULL);
    return e;
}

/* Mostly a live service's id, sometimes any id (unknown ones included). */
static void random_id(osub_engine_t *e, char *buf, size_t len)
{
    size_t n = osub_engine_service_count(e);
    if (n > 0 && rr(0, 9) < 8) {
        snprintf(buf, len, "%s", osub_engine_service_id(e, (size_t)rr(0, (int64_t)n - 1)));
        return;
    }
    snprintf(buf, len, "s%d", (int)rr(0, pool_max * 3));
}

/* Mostly a live service in state st (when there is one), else random_id()'s pick. */
static void id_in_state(osub_engine_t *e, osub_state_t st, char *buf, size_t len)
{
    size_t n = osub_engine_service_count(e), found = 0;
    const char *pick = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *id = osub_engine_service_id(e, i);
        osub_service_info_t si;
        if (osub_engine_service_info(e, id, &si) == 0 && si.state == st &&
            rr(0, (int64_t)found++) == 0)
            pick = id;
    }
    if (pick != NULL && rr(0, 9) < 9)
        snprintf(buf, len, "%s", pick);
    else
        random_id(e, buf, len);
}

/* A random suspend part for a spec: a third of them suspendable, by each method. */
static void random_suspend(osub_spec_t *sp)
{
    if (rr(0, 2) != 0)
        return;
    sp->suspend.method = (osub_suspend_method_t)rr(1, rr(0, 20) == 0 ? 5 : 4); /* 5: refused */
    sp->suspend.residual_mib = rr(0, 3) == 0 ? rr(0, sp->vram_mib > 0 ? sp->vram_mib / 4 : 1) : 0;
    sp->resume_cost_ms = rr(0, 3) == 0 ? rr(-1, 60000) : -1;
    /* relocatable: most cuda ones; now and then one the engine must refuse (another method,
     * several GPUs) */
    sp->suspend.relocate = sp->suspend.method == OSUB_SUSPEND_CUDA ? rr(0, 3) != 0 : rr(0, 30) == 0;
}

/* The suspend commands: the mechanisms' reports and the operator's suspend and resume. */
static int random_suspend_cmd(osub_engine_t *e, int64_t now, const char **what)
{
    char id[16];
    int k = (int)rr(0, 9);
    if (k < 4) {
        *what = "suspended";
        id_in_state(e, OSUB_STATE_SUSPENDING, id, sizeof(id));
        osub_service_info_t si;
        int64_t used = osub_engine_service_info(e, id, &si) == 0 ? si.used_mib : 1000;
        return osub_engine_suspended(e, id, rr(0, 9) == 0 ? rr(-1, 200000) : rr(0, used / 3 + 1),
                                     now);
    }
    if (k < 7) {
        *what = "resumed";
        id_in_state(e, OSUB_STATE_RESUMING, id, sizeof(id));
        return osub_engine_resumed(e, id, now);
    }
    if (k < 8) {
        *what = "suspend_failed";
        id_in_state(e, rr(0, 1) ? OSUB_STATE_SUSPENDING : OSUB_STATE_RESUMING, id, sizeof(id));
        return osub_engine_suspend_failed(e, id, "random", now);
    }
    if (k < 9) {
        *what = "op_suspend";
        id_in_state(e, OSUB_STATE_RUNNING, id, sizeof(id));
        return osub_engine_suspend(e, id, rr(0, 1) ? OSUB_SUSPEND_IDLE : 0, now);
    }
    *what = "op_resume";
    id_in_state(e, OSUB_STATE_SUSPENDED, id, sizeof(id));
    return osub_engine_resume(e, id, now);
}

static void check_all(osub_engine_t *e, const char *what)
{
    if (getenv("OSUB_TRACE_FROM") && cmd_no >= strtol(getenv("OSUB_TRACE_FROM"), NULL, 10)) {
        size_t ne;
        const osub_event_t *xe = osub_engine_events(e, &ne);
        fprintf(stderr, "#%ld %s\n", cmd_no, what);
        for (size_t i = 0; i < ne; i++)
            fprintf(stderr, "   %lld %s: %s\n", (long long)xe[i].time_ms,
                    osub_event_name(xe[i].kind), xe[i].msg);
        char *d = osub_engine_dump(e);
        fprintf(stderr, "%s", d);
        free(d);
    }
    char why[512];
    if (osub_engine_check(e, why, sizeof(why)) != 0)
        fail_msg("seed %" PRIu64 " command %ld (%s): %s", seed, cmd_no, what, why);
    size_t n;
    const osub_event_t *ev = osub_engine_events(e, &n);
    for (size_t i = 0; i < n; i++) {
        const osub_event_t *x = &ev[i];
        /* 6: every decision has an event with a reason and a sentence */
        if (x->msg[0] == '\0' || (unsigned)x->reason >= OSUB_R__COUNT ||
            (unsigned)x->kind >= OSUB_EV__COUNT)
            fail_msg("seed %" PRIu64 " command %ld: event without reason", seed, cmd_no);
        if (x->kind == OSUB_EV_DEGRADE || x->kind == OSUB_EV_EVICT || x->kind == OSUB_EV_SUSPEND) {
            /* 2: a victim's priority is strictly lower than its preemptor's */
            if (x->cause_level >= 0 && x->level <= x->cause_level)
                fail_msg("seed %" PRIu64 " command %ld: %s (level %d) preempted for %s "
                         "(level %d)",
                         seed, cmd_no, x->service, x->level, x->cause, x->cause_level);
            /* 1: backed services are never degraded or evicted */
            osub_service_info_t si;
            if (osub_engine_service_info(e, x->service, &si) == 0 && si.backed)
                fail_msg("seed %" PRIu64 " command %ld: backed %s was a victim (%s)", seed, cmd_no,
                         x->service, x->msg);
        }
        if (x->kind == OSUB_EV_START || x->kind == OSUB_EV_RESUME || x->kind == OSUB_EV_WAKE) {
            /* 3: a service starts (or wakes) only when held + its grant <= usable */
            osub_service_info_t si;
            osub_state_t want = x->kind == OSUB_EV_WAKE ? OSUB_STATE_RESUMING : OSUB_STATE_LOADING;
            if (osub_engine_service_info(e, x->service, &si) != 0 || si.spec->exclusive ||
                si.state != want || si.since_ms != x->time_ms)
                continue;
            for (int32_t g = 0; g < si.n_slots; g++) {
                osub_gpu_info_t gi = ginfo(e, si.slots[g].gpu);
                bool pending_here = false;
                for (size_t j = 0; j < osub_engine_service_count(e) && !pending_here; j++) {
                    osub_service_info_t pi;
                    osub_engine_service_info(e, osub_engine_service_id(e, j), &pi);
                    for (int32_t q = 0; q < pi.n_slots; q++)
                        pending_here = pending_here || (pi.state == OSUB_STATE_PENDING &&
                                                        pi.slots[q].gpu == si.slots[g].gpu);
                }
                /* a pending service's grant counts in held while its victims drain */
                if (gi.held_mib > gi.usable_mib && gi.system_mib == 0 && !pending_here)
                    fail_msg("seed %" PRIu64 " command %ld: %s started on GPU %d with held "
                             "%lld > usable %lld",
                             seed, cmd_no, x->service, si.slots[g].gpu, (long long)gi.held_mib,
                             (long long)gi.usable_mib);
            }
        }
    }
}

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static long ev_counts[OSUB_EV__COUNT];

static const char *const classes[] = {"online", "batch", "experiment"};

static long reload_every; /* > 0: save and reload the engine every so many commands */

/* Saves e, loads it into a new engine that must dump identically, and returns the new one. */
static osub_engine_t *reload(osub_engine_t *e)
{
    char *snap = osub_engine_save(e);
    assert_non_null(snap);
    osub_engine_t *e2 = NULL;
    size_t line = 0;
    int rc = osub_engine_load(snap, &e2, &line);
    if (rc != 0)
        fail_msg("seed %" PRIu64 " command %ld: snapshot does not load: %s at line %zu", seed,
                 cmd_no, osub_strerror(rc), line);
    char *d1 = osub_engine_dump(e), *d2 = osub_engine_dump(e2);
    if (strcmp(d1, d2) != 0)
        fail_msg("seed %" PRIu64 " command %ld: reloaded engine differs:\n%s\n---\n%s", seed,
                 cmd_no, d1, d2);
    free(d1);
    free(d2);
    free(snap);
    osub__verify_plans(e2, verify, NULL);
    osub_engine_free(e);
    return e2;
}

/* Runs n random commands; returns a hash of every event and the final dump. */
static uint64_t run(uint64_t s, long n, bool check)
{
    rng_state = s;
    memset(ev_counts, 0, sizeof(ev_counts));
    osub_engine_t *e = random_pool();
    int64_t now = 0;
    uint64_t h = 1469598103934665603ULL;
    long counts[16] = {0};
    for (cmd_no = 0; cmd_no < n; cmd_no++) {
        now += rr(0, 3) == 0 ? rr(0, 20000) : 0;
        char id[16];
        random_id(e, id, sizeof(id));
        int ngpu = (int)osub_engine_gpu_count(e);
        int kind = (int)rr(0, 115);
        const char *what;
        int rc = 0;
        if (kind < 25) {
            what = "submit";
            osub_spec_t sp;
            if (rr(0, 3) != 0)
                snprintf(id, sizeof(id), "s%d", (int)rr(0, pool_max * 5));
            osub_spec_init(&sp, id, classes[rr(0, 2)]);
            sp.vram_mib = rr(0, 9) == 0 ? rr(-10, 400000) : rr(1, 90000);
            sp.gpus = (int32_t)(rr(0, 3) == 0 ? rr(0, 4) : 0);
            sp.min_vram_mib = rr(0, 2) == 0 ? 0 : rr(0, sp.vram_mib > 0 ? sp.vram_mib : 1);
            sp.compute_pct = (int32_t)(rr(0, 3) == 0 ? rr(0, 100) : 0);
            sp.exclusive = rr(0, 30) == 0;
            sp.preemptible = rr(0, 10) == 0 ? OSUB_TRI_NO : OSUB_TRI_DEFAULT;
            sp.resumable = rr(0, 1) == 0;
            sp.queue = rr(0, 5) == 0 ? OSUB_TRI_NO : OSUB_TRI_DEFAULT;
            sp.batch_size = (int32_t)rr(0, 64);
            sp.min_batch_size = sp.batch_size ? (int32_t)rr(1, sp.batch_size) : 0;
            sp.restart_cost_ms = rr(0, 3) == 0 ? rr(0, 120000) : -1;
            random_suspend(&sp);
            osub_submit_result_t r;
            rc = osub_engine_submit(e, &sp, now, rr(0, 20) == 0 ? OSUB_SUBMIT_DRY_RUN : 0, &r);
        } else if (kind < 32) {
            what = "release";
            rc = osub_engine_release(e, id, now);
        } else if (kind < 55) {
            what = "usage";
            if (rr(0, 4) == 0) {
                int64_t per[8];
                size_t k = (size_t)rr(1, 4);
                for (size_t i = 0; i < k; i++)
                    per[i] = rr(0, 90000);
                rc = osub_engine_usage_per_gpu(e, id, per, k, now);
            } else {
                rc = osub_engine_usage(e, id, rr(-1, 170000), (int32_t)rr(-1, 100), now);
            }
        } else if (kind < 60) {
            what = "system";
            rc = osub_engine_system_usage(e, (int32_t)rr(0, ngpu), rr(0, 4096), now);
        } else if (kind < 66) {
            what = "ready";
            rc = osub_engine_ready(e, id, now);
        } else if (kind < 74) {
            what = "ack";
            rc = osub_engine_ack(e, id, rr(0, 1) ? "ckpt" : NULL, now);
        } else if (kind < 80) {
            what = "exited";
            rc = osub_engine_exited(e, id, NULL, now);
        } else if (kind < 82) {
            what = "resize";
            rc = osub_engine_resize(e, id, rr(0, 90000), rr(0, 1) ? 0 : rr(0, 40000),
                                    (int32_t)rr(0, 32), now);
        } else if (kind < 84) {
            what = "ratio";
            rc = osub_engine_set_ratio(e, (int32_t)rr(900, 2600), now);
        } else if (kind < 86) {
            what = "cordon";
            rc = osub_engine_cordon(e, (int32_t)rr(0, ngpu), rr(0, 1) == 0, now);
        } else if (kind < 87) {
            what = "drain";
            rc = osub_engine_drain_gpu(e, (int32_t)rr(0, ngpu - 1), now);
        } else if (kind < 88) {
            what = rr(0, 29) == 0 ? "gpu_lost" : "fail";
            if (what[0] == 'g')
                rc = osub_engine_gpu_lost(e, (int32_t)rr(0, ngpu - 1), now);
            else
                rc = osub_engine_fail(e, id, "random", now);
        } else if (kind < 100) {
            what = "tick";
            now += rr(0, 5000);
            rc = osub_engine_tick(e, now);
        } else {
            rc = random_suspend_cmd(e, now, &what);
        }
        counts[rc == 0 ? 0 : 1]++;
        if (rc && getenv("DBG"))
            fprintf(stderr, "%s %s\n", what, osub_errcode(rc));
        if (check)
            check_all(e, what);
        if (verify) {
            const char *last;
            if (osub__verify_plans(e, true, &last) != 0)
                fail_msg("seed %" PRIu64 " command %ld (%s): pruned planner differs from the "
                         "reference: %s",
                         seed, cmd_no, what, last);
        }
        size_t ne;
        const osub_event_t *ev = osub_engine_events(e, &ne);
        h = mix(h, &rc, sizeof(rc));
        for (size_t i = 0; i < ne; i++) {
            h = mix(h, ev[i].msg, strlen(ev[i].msg));
            ev_counts[ev[i].kind]++;
        }
        if (reload_every > 0 && cmd_no % reload_every == reload_every - 1)
            e = reload(e);
        /* a pool that lost every GPU is replaced by a fresh one */
        osub_pool_info_t p;
        osub_engine_pool_info(e, &p);
        if (p.n_gpus == 0 || (cmd_no % 20000) == 19999) {
            char *d = osub_engine_dump(e);
            h = mix(h, d, strlen(d));
            free(d);
            osub_engine_free(e);
            e = random_pool();
            now = 0;
        }
    }
    char *d = osub_engine_dump(e);
    h = mix(h, d, strlen(d));
    free(d);
    osub_engine_free(e);
    if (check) {
        printf("random: %ld commands, %ld accepted, %ld refused (seed %" PRIu64 ")\nevents:", n,
               counts[0], counts[1], s);
        for (int k = 0; k < OSUB_EV__COUNT; k++)
            printf(" %s %ld", osub_event_name((osub_event_kind_t)k), ev_counts[k]);
        printf("\n");
        /* the generator must reach every decision, or the invariants prove little (checked
         * on the long run; the short runs on sparse large pools need not) */
        for (int k = 0; k < OSUB_EV__COUNT && n >= 500000; k++)
            if (ev_counts[k] == 0)
                fail_msg("seed %" PRIu64 ": no %s event in %ld commands", s,
                         osub_event_name((osub_event_kind_t)k), n);
    }
    return h;
}

static void test_invariants_under_random_commands(void **state)
{
    (void)state;
    long n = 1000000;
    const char *sn = getenv("OSUB_COMMANDS");
    if (sn != NULL)
        n = strtol(sn, NULL, 10);
    run(seed, n, true);
}

static void test_pruned_planner_matches_reference(void **state)
{
    (void)state;
    verify = true;
    run(seed ^ 0x1234, 200000, false);
    verify = false;
}

static void test_pruned_planner_matches_reference_large_pools(void **state)
{
    (void)state;
    /* deep room trees: pools of up to 300 GPUs, ids spread wider */
    verify = true;
    pool_max = 300;
    run(seed ^ 0x4321, 30000, true);
    pool_max = 12;
    verify = false;
}

static void test_snapshot_reload_decides_the_same(void **state)
{
    (void)state;
    /* the same stream, once straight and once through a save and a load every 997 commands:
     * every event and the final state must be the same */
    uint64_t a = run(seed ^ 0x77, 100000, false);
    reload_every = 997;
    uint64_t b = run(seed ^ 0x77, 100000, true);
    reload_every = 0;
    assert_int_equal(a, b);
}

static void test_determinism(void **state)
{
    (void)state;
    uint64_t a = run(seed ^ 0x5555, 50000, false);
    uint64_t b = run(seed ^ 0x5555, 50000, false);
    assert_int_equal(a, b);
    uint64_t c = run(seed ^ 0xaaaa, 50000, false);
    assert_int_not_equal(a, c); /* the hash sees the commands at all */
}

int main(void)
{
    const char *s = getenv("OSUB_SEED");
    seed = s ? strtoull(s, NULL, 10) : 20261130;
    printf("random: seed %" PRIu64 " (replay with OSUB_SEED=%" PRIu64 ")\n", seed, seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invariants_under_random_commands),
        cmocka_unit_test(test_pruned_planner_matches_reference),
        cmocka_unit_test(test_pruned_planner_matches_reference_large_pools),
        cmocka_unit_test(test_snapshot_reload_decides_the_same),
        cmocka_unit_test(test_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
