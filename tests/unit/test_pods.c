/* test_pods.c - the pods' evictions (pods.h) without an API server, on the fake core
 * (fake_core.h) and the real actuators: with kube_api "none" an eviction of a pod service (a
 * submit whose exec has a "kubernetes" record) is logged as a "no-api" note and waits to be
 * read; other directives, and any directive for a service that is no pod, do nothing; the
 * directive reaches the pods through the actuators' listener once its decision is committed;
 * the module's metrics print its series. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>

#include "actuator.h"
#include "fake_core.h"
#include "netpolicy.h"
#include "pods.h"
#include "tmpdir.h"

struct fixture {
    char dir[64];
    struct osubd_config cfg;
    struct osubd_gpus gpus;
    struct osubd_destinations *dest;
    struct osubd_core *c;
    struct osubd_act *a;
    struct osubd_pods *p;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(tmpdir_make(f->dir, sizeof(f->dir), "pods"), 0);
    osubd_config_default(&f->cfg);
    snprintf(f->cfg.state_path, sizeof(f->cfg.state_path), "%s/state.db", f->dir);
    snprintf(f->cfg.cgroup, sizeof(f->cfg.cgroup), "none");
    snprintf(f->cfg.cuda_shim, sizeof(f->cfg.cuda_shim), "none");
    snprintf(f->cfg.kube_api, sizeof(f->cfg.kube_api), "none");
    char err[600] = "";
    assert_int_equal(osubd_parse_destinations("", &f->dest, err, sizeof(err)), 0);
    f->c = fake_core_new(&f->cfg, "1x81920");
    assert_non_null(f->c);
    f->a = osubd_act_new(f->c, &f->gpus, f->dest, err, sizeof(err));
    if (f->a == NULL)
        fail_msg("osubd_act_new: %s", err);
    f->p = osubd_pods_new(f->c, f->a, err, sizeof(err));
    if (f->p == NULL)
        fail_msg("osubd_pods_new: %s", err);
    struct osubd_module ma = osubd_act_module(f->a), mp = osubd_pods_module(f->p);
    assert_string_equal(mp.name, "pods");
    assert_int_equal(osubd_core_register(f->c, &ma), 0);
    assert_int_equal(osubd_core_register(f->c, &mp), 0);
    if (osubd_core_load(f->c, err, sizeof(err)) != 0)
        fail_msg("load: %s", err);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    osubd_core_stop(f->c);
    osubd_pods_free(f->p);
    osubd_act_free(f->a);
    osubd_core_free(f->c);
    osubd_destinations_free(f->dest);
    assert_int_equal(tmpdir_remove(f->dir), 0);
    free(f);
    return 0;
}

/* What an API handler does with a submit: the exec taken from the spec, kept by the actuators
 * when the engine accepts (the commit callback runs before the command is logged). */
struct staged {
    struct osubd_act *a;
    const char *id;
    json_t *exec;
};

static void commit_exec(void *arg, int rc, const osub_submit_result_t *res)
{
    struct staged *s = arg;
    if (rc == 0 && res->outcome != OSUB_SUBMIT_REJECTED && s->exec != NULL)
        assert_int_equal(osubd_act_commit_exec(s->a, s->id, s->exec), 0);
}

/* Submits a batch service of vram_mib; a pod when ns is not NULL. */
static void submit(struct fixture *f, const char *id, int64_t vram_mib, const char *ns,
                   const char *name)
{
    json_t *spec =
        json_pack("{s:s, s:s, s:I}", "id", id, "class", "batch", "vram_mib", (json_int_t)vram_mib);
    if (ns != NULL)
        json_object_set_new(spec, "kubernetes",
                            json_pack("{s:s, s:s, s:s, s:i}", "namespace", ns, "name", name, "uid",
                                      "0f0e-1d2c", "grace_seconds", 15));
    json_t *exec = NULL;
    char err[600] = "";
    if (osubd_act_take(f->a, spec, false, -1, &exec, err, sizeof(err)) != 0)
        fail_msg("take %s: %s", id, err);
    assert_true((exec != NULL) == (ns != NULL));
    json_t *cmd = json_pack("{s:s, s:o}", "op", "submit", "spec", spec);
    struct staged s = {.a = f->a, .id = id, .exec = exec};
    osub_submit_result_t res;
    int rc = osubd_apply_with(f->c, cmd, &res, err, sizeof(err), commit_exec, &s);
    if (rc != 0 || err[0] != '\0')
        fail_msg("submit %s: rc %d %s", id, rc, err);
    json_decref(cmd);
    json_decref(exec);
    assert_int_equal(res.outcome, OSUB_SUBMIT_STARTED);
}

static int notes_of(const struct osubd_core *c, const char *id, const char *reason)
{
    int n = 0;
    for (size_t i = 0; i < fake_core_n_notes(c); i++)
        n += strcmp(fake_core_note(c, i)->id, id) == 0 &&
             strcmp(fake_core_note(c, i)->reason, reason) == 0;
    return n;
}

static void test_pod_evict_without_api_is_noted(void **state)
{
    struct fixture *f = *state;
    submit(f, "pod-a", 20000, "team-x", "trainer-0");
    assert_non_null(osubd_act_kube(f->a, "pod-a"));
    size_t before = fake_core_n_notes(f->c);
    osubd_pods_directive(f->p, "pod-a", "evict", NULL);
    assert_int_equal(fake_core_n_notes(f->c), before + 1);
    const struct fake_core_note *nt = fake_core_note(f->c, before);
    assert_string_equal(nt->id, "pod-a");
    assert_string_equal(nt->kind, "pod");
    assert_string_equal(nt->reason, "no-api");
    assert_int_equal(nt->level, OSUBD_LOG_WARN); /* seen under --log-level warn */
    assert_non_null(strstr(nt->message, "pod-a is pod team-x/trainer-0"));
    assert_non_null(strstr(nt->message, "its directive waits to be read"));
    /* logged as a command, as the real core logs a note */
    assert_non_null(strstr(fake_core_last_cmd(f->c)->text, "\"op\":\"note\""));
    /* with a cause (the pod it makes room for): still nothing to evict through */
    osubd_pods_directive(f->p, "pod-a", "evict", "pod-b");
    assert_int_equal(notes_of(f->c, "pod-a", "no-api"), 2);
    /* the other directives are the service's own to read */
    static const char *const others[] = {"degrade", "restore", "resume"};
    for (size_t i = 0; i < 3; i++)
        osubd_pods_directive(f->p, "pod-a", others[i], NULL);
    assert_int_equal(fake_core_n_notes(f->c), before + 2);
}

static void test_non_pod_directive_does_nothing(void **state)
{
    struct fixture *f = *state;
    submit(f, "plain", 20000, NULL, NULL);
    size_t notes = fake_core_n_notes(f->c), cmds = fake_core_n_cmds(f->c);
    static const char *const actions[] = {"evict", "degrade", "restore", "resume"};
    for (size_t i = 0; i < 4; i++)
        osubd_pods_directive(f->p, "plain", actions[i], NULL);
    osubd_pods_directive(f->p, "unknown-service", "evict", NULL);
    assert_int_equal(fake_core_n_notes(f->c), notes);
    assert_int_equal(fake_core_n_cmds(f->c), cmds);
}

/* The pods hear of a directive through the actuators' listener (osubd_pods_new set it), once
 * the eviction's command is committed. */
static void test_directive_through_actuators(void **state)
{
    struct fixture *f = *state;
    char err[300] = "";
    assert_int_equal(osubd_core_start(f->c, err, sizeof(err)), 0);
    assert_int_equal(osubd_act_start(f->a, err, sizeof(err)), 0);
    submit(f, "pod-a", 20000, "team-x", "trainer-0");
    submit(f, "plain", 20000, NULL, NULL);
    json_t *drain = json_pack("{s:s, s:i}", "op", "drain", "gpu", 0);
    assert_int_equal(osubd_apply(f->c, drain, NULL, err, sizeof(err)), 0);
    json_decref(drain);
    struct event_base *base = osubd_core_base(f->c);
    for (int i = 0; i < 100; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    assert_int_equal(notes_of(f->c, "pod-a", "no-api"), 0); /* not durable yet */
    fake_core_commit(f->c);
    for (int i = 0; i < 1000 && notes_of(f->c, "pod-a", "no-api") == 0; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    assert_int_equal(notes_of(f->c, "pod-a", "no-api"), 1);
    assert_int_equal(notes_of(f->c, "plain", "no-api"), 0);
    osub_service_info_t si;
    assert_int_equal(osub_engine_service_info(osubd_core_engine(f->c), "plain", &si), 0);
    assert_int_equal(si.state, OSUB_STATE_DRAINING); /* evicted: its directive waits for it */
}

static void test_metrics(void **state)
{
    struct fixture *f = *state;
    struct evbuffer *b = evbuffer_new();
    osubd_pods_metrics(f->p, b);
    evbuffer_add(b, "", 1);
    const char *text = (const char *)evbuffer_pullup(b, -1);
    assert_non_null(strstr(text, "# TYPE oversub_pod_evictions_total counter\n"));
    assert_non_null(strstr(text, "oversub_pod_evictions_total{result=\"accepted\"} 0\n"));
    assert_non_null(strstr(text, "oversub_pod_evictions_total{result=\"blocked\"} 0\n"));
    assert_non_null(strstr(text, "oversub_pod_evictions_total{result=\"failed\"} 0\n"));
    assert_non_null(strstr(text, "oversub_pods_gone_total 0\n"));
    evbuffer_free(b);
    /* the same series through the core's /metrics, from the module */
    b = evbuffer_new();
    osubd_core_metrics(f->c, b);
    evbuffer_add(b, "", 1);
    assert_non_null(strstr((const char *)evbuffer_pullup(b, -1), "oversub_pods_gone_total 0\n"));
    evbuffer_free(b);
    osubd_pods_metrics(NULL, NULL); /* no pods: nothing, no crash */
}

/* kube_api that is no URL: refused with a sentence; "auto" outside a cluster: no API server, as
 * "none" (an eviction is noted, never asked). */
static void test_new_kube_api(void **state)
{
    struct fixture *f = *state;
    struct osubd_config cfg = f->cfg;
    snprintf(cfg.kube_api, sizeof(cfg.kube_api), "ftp://127.0.0.1:1");
    struct osubd_core *c = fake_core_new(&cfg, "1x81920");
    assert_non_null(c);
    char err[600] = "";
    assert_null(osubd_pods_new(c, f->a, err, sizeof(err)));
    assert_string_equal(err, "kubernetes_api: the API server 'ftp://127.0.0.1:1' must be an "
                             "http:// or https:// URL");
    osubd_core_free(c);
    unsetenv("KUBERNETES_SERVICE_HOST");
    snprintf(cfg.kube_api, sizeof(cfg.kube_api), "auto");
    c = fake_core_new(&cfg, "1x81920");
    assert_non_null(c);
    struct osubd_pods *p = osubd_pods_new(c, f->a, err, sizeof(err));
    assert_non_null(p);
    osubd_pods_free(p);
    osubd_core_free(c);
    /* the listener those made is the last one set: the fixture's pods listen again */
    osubd_pods_free(f->p);
    f->p = osubd_pods_new(f->c, f->a, err, sizeof(err));
    assert_non_null(f->p);
    submit(f, "pod-a", 20000, "team-x", "trainer-0");
    osubd_pods_directive(f->p, "pod-a", "evict", NULL);
    assert_int_equal(notes_of(f->c, "pod-a", "no-api"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pod_evict_without_api_is_noted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_pod_directive_does_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_directive_through_actuators, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_kube_api, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
