/* test_routes_module.c - the routes module (routes.h) as the core drives it, through the fake
 * core (fake_core.h): loaded from the meta the last run saved, a route staged with a submit and
 * kept only when the engine accepts, saved under gateway_routes with the command that changed
 * it, forgotten when its service is released. Also checks the fake core itself: links without
 * core.o (fake_core.c comes before libosubd.a), durable only on fake_core_commit, notes and
 * events recorded, the fake clock. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "fake_core.h"
#include "routes.h"

struct fixture {
    struct osubd_config cfg;
    struct osubd_core *c;
    struct osubd_routes *t;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    osubd_config_default(&f->cfg);
    snprintf(f->cfg.state_path, sizeof(f->cfg.state_path), "fake.db");
    f->c = fake_core_new(&f->cfg, "2x81920");
    assert_non_null(f->c);
    f->t = osubd_routes_new();
    assert_non_null(f->t);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    osubd_core_stop(f->c);
    osubd_core_free(f->c);
    osubd_routes_free(f->t);
    free(f);
    return 0;
}

static void register_and_load(struct fixture *f)
{
    struct osubd_module m = osubd_routes_module(f->t);
    assert_string_equal(m.name, "routes");
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    char err[600] = "";
    assert_int_equal(osubd_core_load(f->c, err, sizeof(err)), 0);
}

static json_t *submit_cmd(const char *id, int64_t vram_mib)
{
    json_t *cmd = json_pack("{s:s, s:{s:s, s:s, s:I}}", "op", "submit", "spec", "id", id, "class",
                            "batch", "vram_mib", (json_int_t)vram_mib);
    assert_non_null(cmd);
    return cmd;
}

/* What an API handler does with a submit: the route staged, kept only when the engine takes
 * the service (the commit callback runs before the command is logged, so it is saved with it). */
struct staged {
    struct osubd_routes *t;
    const char *id;
    struct osubd_route *r;
    int calls;
};

static void commit_route(void *arg, int rc, const osub_submit_result_t *res)
{
    struct staged *s = arg;
    s->calls++;
    if (rc == 0 && res->outcome != OSUB_SUBMIT_REJECTED)
        assert_int_equal(osubd_routes_set(s->t, s->id, s->r), 0);
    else
        free(s->r);
    s->r = NULL;
}

static int submit_with_route(struct fixture *f, const char *id, int64_t vram_mib,
                             const char *backend)
{
    json_t *spec = json_pack("{s:[s], s:i}", "backends", backend, "max_inflight", 4);
    struct osubd_route *r = NULL;
    char err[400] = "";
    assert_int_equal(osubd_route_take(spec, false, NULL, &r, err, sizeof(err)), 0);
    assert_non_null(r);
    json_decref(spec);
    struct staged s = {.t = f->t, .id = id, .r = r};
    json_t *cmd = submit_cmd(id, vram_mib);
    osub_submit_result_t res;
    int rc = osubd_apply_with(f->c, cmd, &res, err, sizeof(err), commit_route, &s);
    json_decref(cmd);
    assert_string_equal(err, "");
    assert_int_equal(s.calls, 1);
    return rc;
}

static void release(struct fixture *f, const char *id)
{
    json_t *cmd = json_pack("{s:s, s:s}", "op", "release", "id", id);
    char err[256];
    assert_int_equal(osubd_apply(f->c, cmd, NULL, err, sizeof(err)), 0);
    json_decref(cmd);
}

static void test_load_from_meta(void **state)
{
    struct fixture *f = *state;
    char err[256];
    assert_int_equal(osubd_core_meta_set(f->c, "gateway_routes",
                                         "{\"old\":{\"backends\":[\"http://127.0.0.1:9001\"],"
                                         "\"max_inflight\":7}}",
                                         err, sizeof(err)),
                     0);
    register_and_load(f);
    const struct osubd_route *r = osubd_routes_get(f->t, "old");
    assert_non_null(r);
    assert_int_equal(r->n_backends, 1);
    assert_string_equal(r->backends[0], "http://127.0.0.1:9001");
    assert_int_equal(r->max_inflight, 7);
    assert_false(osubd_routes_dirty(f->t)); /* what was loaded needs no save */
}

static void test_load_nothing_saved(void **state)
{
    struct fixture *f = *state;
    register_and_load(f);
    assert_int_equal(osubd_routes_count(f->t), 0);
}

static void test_load_damaged_meta_refused(void **state)
{
    struct fixture *f = *state;
    char err[600] = "";
    assert_int_equal(osubd_core_meta_set(f->c, "gateway_routes", "{\"x\":{\"max_inflight\":3}}",
                                         err, sizeof(err)),
                     0);
    struct osubd_module m = osubd_routes_module(f->t);
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    assert_int_equal(osubd_core_load(f->c, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "fake.db: "));
    assert_non_null(strstr(err, "gateway route of x is bad"));
}

static void test_load_meta_unreadable_refused(void **state)
{
    struct fixture *f = *state;
    struct osubd_module m = osubd_routes_module(f->t);
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    fake_core_fail_meta(f->c, true);
    char err[600] = "";
    assert_int_equal(osubd_core_load(f->c, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "cannot read 'gateway_routes'"));
}

static void test_submit_route_saved_with_command(void **state)
{
    struct fixture *f = *state;
    register_and_load(f);
    char err[256];
    assert_int_equal(osubd_core_start(f->c, err, sizeof(err)), 0);
    assert_int_equal(submit_with_route(f, "a", 20000, "http://127.0.0.1:9002"), 0);
    const struct osubd_route *r = osubd_routes_get(f->t, "a");
    assert_non_null(r);
    assert_string_equal(r->backends[0], "http://127.0.0.1:9002");
    assert_int_equal(r->max_inflight, 4);
    /* saved with the submit itself (one transaction), and marked saved */
    assert_int_equal(fake_core_n_saves(f->c), 1);
    const char *saved = fake_core_meta_text(f->c, "gateway_routes");
    assert_non_null(saved);
    assert_non_null(strstr(saved, "\"a\""));
    assert_non_null(strstr(saved, "http://127.0.0.1:9002"));
    assert_false(osubd_routes_dirty(f->t));
    const struct fake_core_cmd *cmd = fake_core_last_cmd(f->c);
    assert_non_null(cmd);
    assert_non_null(strstr(cmd->text, "\"op\":\"submit\""));
    assert_int_equal(cmd->ticket, 1);
    /* a command that changes no route saves nothing */
    json_t *usage = json_pack("{s:s, s:s, s:i}", "op", "usage", "id", "a", "vram_mib", 1000);
    assert_int_equal(osubd_apply(f->c, usage, NULL, err, sizeof(err)), 0);
    json_decref(usage);
    assert_int_equal(fake_core_n_saves(f->c), 1);
}

static void test_refused_submit_drops_route(void **state)
{
    struct fixture *f = *state;
    register_and_load(f);
    /* larger than the whole pool: the engine refuses, the staged route goes */
    int rc = submit_with_route(f, "huge", 10000000, "http://127.0.0.1:9003");
    assert_int_not_equal(rc, 0);
    assert_null(osubd_routes_get(f->t, "huge"));
    assert_int_equal(fake_core_n_saves(f->c), 0);
    assert_null(fake_core_meta_text(f->c, "gateway_routes"));
}

static void test_release_forgets_route(void **state)
{
    struct fixture *f = *state;
    register_and_load(f);
    assert_int_equal(submit_with_route(f, "a", 20000, "http://127.0.0.1:9002"), 0);
    assert_int_equal(submit_with_route(f, "b", 20000, "http://127.0.0.1:9004"), 0);
    assert_int_equal(osubd_routes_count(f->t), 2);
    release(f, "a");
    assert_null(osubd_routes_get(f->t, "a"));
    assert_non_null(osubd_routes_get(f->t, "b")); /* only the service gone */
    /* the forget made the table dirty: saved with the release, without "a" */
    const char *saved = fake_core_meta_text(f->c, "gateway_routes");
    assert_non_null(saved);
    assert_null(strstr(saved, "\"a\""));
    assert_non_null(strstr(saved, "\"b\""));
    assert_false(osubd_routes_dirty(f->t));
    assert_int_equal(fake_core_n_saves(f->c), 3);
}

static void test_failed_save_stays_dirty(void **state)
{
    struct fixture *f = *state;
    register_and_load(f);
    fake_core_fail_saves(f->c, true);
    assert_int_equal(submit_with_route(f, "a", 20000, "http://127.0.0.1:9002"), 0);
    assert_true(osubd_routes_dirty(f->t)); /* saved(false): saved with the next command */
    assert_null(fake_core_meta_text(f->c, "gateway_routes"));
    fake_core_fail_saves(f->c, false);
    json_t *tick = json_pack("{s:s}", "op", "tick");
    char err[256];
    osubd_apply(f->c, tick, NULL, err, sizeof(err));
    json_decref(tick);
    assert_false(osubd_routes_dirty(f->t));
    assert_non_null(strstr(fake_core_meta_text(f->c, "gateway_routes"), "9002"));
}

/* ---- the fake core itself ------------------------------------------------------------------ */

struct heard {
    int events, durable, forget, metrics;
    uint64_t last_durable;
    bool last_commit;
};

static void h_events(void *ctx, const osub_event_t *ev, size_t n)
{
    (void)ev;
    ((struct heard *)ctx)->events += (int)n;
}

static void h_durable(void *ctx, const struct osubd_progress *p)
{
    struct heard *h = ctx;
    h->durable++;
    h->last_durable = p->durable;
    h->last_commit = p->commit;
}

static void h_metrics(void *ctx, struct evbuffer *b)
{
    ((struct heard *)ctx)->metrics++;
    evbuffer_add_printf(b, "heard_series 1\n");
}

static int count_events(void *arg, int64_t seq, const char *text)
{
    (void)seq;
    (void)text;
    (*(int *)arg)++;
    return 0;
}

static void test_fake_durable_on_commit(void **state)
{
    struct fixture *f = *state;
    struct heard h = {0};
    struct osubd_module m = {.name = "heard", .ctx = &h, .events = h_events, .durable = h_durable};
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    register_and_load(f);
    char err[256];
    assert_int_equal(osubd_core_start(f->c, err, sizeof(err)), 0);
    fake_core_set_time(f->c, 5000);
    json_t *cmd = submit_cmd("s1", 1000);
    assert_int_equal(osubd_apply(f->c, cmd, NULL, err, sizeof(err)), 0);
    json_decref(cmd);
    assert_true(h.events > 0);
    assert_int_equal(osubd_core_applied(f->c), 1);
    assert_int_equal(osubd_core_durable(f->c), 0);
    assert_int_equal(h.durable, 0);
    int n = 0;
    osubd_core_events(f->c, 0, 100, count_events, &n);
    assert_int_equal(n, 0); /* not on "disk" yet */
    fake_core_commit(f->c);
    assert_int_equal(h.durable, 1);
    assert_int_equal(h.last_durable, 1);
    assert_true(h.last_commit);
    osubd_core_events(f->c, 0, 100, count_events, &n);
    assert_int_equal(n, h.events);
    assert_int_equal(fake_core_last_cmd(f->c)->engine_ms, 5000);
    assert_int_equal(osubd_engine_now(f->c), 5000);
    assert_int_equal(osubd_engine_to_unix(f->c, 5000) - osubd_engine_to_unix(f->c, 1000), 4000);
}

static void test_fake_malformed_and_dry_run_not_recorded(void **state)
{
    struct fixture *f = *state;
    struct heard h = {0};
    struct osubd_module m = {.name = "heard", .ctx = &h, .events = h_events};
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    register_and_load(f);
    char err[256] = "";
    json_t *bad = json_pack("{s:s}", "op", "explode");
    int rc = osubd_apply(f->c, bad, NULL, err, sizeof(err));
    json_decref(bad);
    if (rc != OSUB_EINVAL || strstr(err, "command 'explode'") == NULL)
        fail_msg("explode: rc %d, '%s'", rc, err);
    json_t *dry = submit_cmd("d", 1000);
    json_object_set_new(dry, "dry_run", json_true());
    assert_int_equal(osubd_apply(f->c, dry, NULL, err, sizeof(err)), 0);
    json_decref(dry);
    assert_int_equal(fake_core_n_cmds(f->c), 0);
    assert_int_equal(h.events, 0);
    assert_int_equal(osubd_core_version(f->c), 0);
}

static void test_fake_notes_metrics_tokens(void **state)
{
    struct fixture *f = *state;
    struct heard h = {0};
    struct osubd_module m = {.name = "heard", .ctx = &h, .metrics = h_metrics};
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    register_and_load(f);
    osubd_note(f->c, "svc", "process", "exit", "svc's process %d exited", 42);
    assert_int_equal(fake_core_n_notes(f->c), 1);
    assert_string_equal(fake_core_note(f->c, 0)->kind, "process");
    assert_string_equal(fake_core_note(f->c, 0)->message, "svc's process 42 exited");
    assert_non_null(strstr(fake_core_last_cmd(f->c)->text, "\"op\":\"note\""));
    int n = 0;
    osubd_core_events(f->c, 0, 100, count_events, &n);
    assert_int_equal(n, 1); /* before start: durable at once */
    assert_int_equal(osubd_core_last_event(f->c), 1);
    struct evbuffer *b = evbuffer_new();
    osubd_core_metrics(f->c, b);
    evbuffer_add(b, "", 1);
    const char *text = (const char *)evbuffer_pullup(b, -1);
    assert_non_null(strstr(text, "oversub_decisions_total{kind=\"admit\""));
    assert_non_null(strstr(text, "heard_series 1"));
    assert_int_equal(h.metrics, 1);
    evbuffer_free(b);
    char t1[65], t2[65], t3[65];
    osubd_service_token(f->c, "a", t1);
    osubd_service_token(f->c, "a", t2);
    osubd_service_token(f->c, "b", t3);
    assert_string_equal(t1, t2);
    assert_string_not_equal(t1, t3);
    assert_int_equal(strlen(t1), 64);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_from_meta, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_nothing_saved, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_damaged_meta_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_meta_unreadable_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_route_saved_with_command, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_submit_drops_route, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_forgets_route, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_save_stays_dirty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_durable_on_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_malformed_and_dry_run_not_recorded, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_fake_notes_metrics_tokens, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
