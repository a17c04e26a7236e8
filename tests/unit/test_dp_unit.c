/* test_dp_unit.c - the device plugin (deviceplugin.h) without a kubelet, on the fake core
 * (fake_core.h) and the real actuators: osubd_dp_list_fit (pure: how many 1 MiB devices a
 * ListAndWatch answer holds under a size, and the whole list's size); osubd_dp_new on a
 * temporary folder; its module loaded from the meta (device_plugin_allocations) or, once, from
 * the side file a run from before kept (STATE.allocated.json: then dirty, saved into the state
 * with the next command and removed); damaged values refused; save/saved; a gone pod's
 * allocations forgotten. Serving and registering with a kubelet is the integration test's. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <unistd.h>

#include "actuator.h"
#include "deviceplugin.h"
#include "fake_core.h"
#include "netpolicy.h"
#include "tmpdir.h"

/* ---- osubd_dp_list_fit ------------------------------------------------------------------ */

/* Bytes device i takes in the list, worked out here from the wire format rather than taken
 * from deviceplugin.c: tag 1, a length, {ID = 1: the ID, health = 2: "Healthy"}. IDs are the
 * 62 one-character ones, then the 62^2 of two characters, and so on. */
static size_t entry_bytes(int64_t i)
{
    size_t id_len = 1;
    int64_t span = 62;
    while (i >= span) {
        i -= span;
        span *= 62;
        id_len++;
    }
    size_t inner = (1 + 1 + id_len) + (1 + 1 + 7);
    return 1 + (inner < 128 ? 1 : 2) + inner;
}

static void test_list_fit(void **state)
{
    (void)state;
    assert_int_equal(entry_bytes(0), 14);
    assert_int_equal(entry_bytes(61), 14);
    assert_int_equal(entry_bytes(62), 15);
    assert_int_equal(entry_bytes(62 + 3844), 16);
    size_t bytes = 1;
    assert_int_equal(osubd_dp_list_fit(0, 1000, &bytes), 0);
    assert_int_equal(bytes, 0);
    assert_int_equal(osubd_dp_list_fit(62, 10000, &bytes), 62);
    assert_int_equal(bytes, 62 * 14);
    assert_int_equal(osubd_dp_list_fit(63, 10000, &bytes), 63);
    assert_int_equal(bytes, 62 * 14 + 15);
    /* cut: as many whole entries as fit; bytes is still the whole list's */
    assert_int_equal(osubd_dp_list_fit(100, 10 * 14, &bytes), 10);
    assert_int_equal(bytes, 62 * 14 + 38 * 15);
    assert_int_equal(osubd_dp_list_fit(100, 10 * 14 + 13, &bytes), 10);
    assert_int_equal(osubd_dp_list_fit(100, 10 * 14 + 14, NULL), 11);
    assert_int_equal(osubd_dp_list_fit(100, 0, &bytes), 0);
    assert_int_equal(osubd_dp_list_fit(100, 13, &bytes), 0);
    assert_int_equal(osubd_dp_list_fit(1, 14, &bytes), 1);
    /* exactly the whole list: nothing cut */
    assert_int_equal(osubd_dp_list_fit(100, 62 * 14 + 38 * 15, &bytes), 100);
    assert_int_equal(osubd_dp_list_fit(100, 62 * 14 + 38 * 15 - 1, &bytes), 99);
    /* past the two-character IDs into three, against the sums worked out here, for a few
     * counts and limits around the boundaries */
    static const int64_t counts[] = {61, 62, 63, 3905, 3906, 3907, 10000};
    static const size_t limits[] = {0, 14, 868, 869, 883, 58528, 58529, 58544, 1000000};
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
        for (size_t li = 0; li < sizeof(limits) / sizeof(limits[0]); li++) {
            size_t total = 0, fit_bytes = 0;
            int64_t fit = -1;
            for (int64_t i = 0; i < counts[ci]; i++) {
                if (fit < 0 && total + entry_bytes(i) > limits[li])
                    fit = i;
                total += entry_bytes(i);
                if (fit < 0)
                    fit_bytes = total;
            }
            if (fit < 0)
                fit = counts[ci];
            size_t got_bytes = 0;
            int64_t got = osubd_dp_list_fit(counts[ci], limits[li], &got_bytes);
            if (got != fit || got_bytes != total)
                fail_msg("count %lld, max %zu: %lld devices, %zu bytes (wanted %lld, %zu)",
                         (long long)counts[ci], limits[li], (long long)got, got_bytes,
                         (long long)fit, total);
            assert_true(fit_bytes <= limits[li] || fit == 0);
        }
    /* a big node: 8 GPUs of 141 GiB at a ratio of 1.5 is over the kubelet's 4 MiB */
    int64_t cap = 8LL * 144384 * 3 / 2;
    int64_t n = osubd_dp_list_fit(cap, OSUBD_DP_MSG_MAX - 4096, &bytes);
    assert_true(bytes > OSUBD_DP_MSG_MAX);
    assert_true(n > 0 && n < cap);
    size_t used = 0;
    for (int64_t i = 0; i < n; i++)
        used += entry_bytes(i);
    assert_true(used <= OSUBD_DP_MSG_MAX - 4096);
    assert_true(used + entry_bytes(n) > OSUBD_DP_MSG_MAX - 4096);
}

/* ---- the module ------------------------------------------------------------------------------ */

struct fixture {
    char dir[64], side[128];
    struct osubd_config cfg;
    struct osubd_gpus gpus;
    struct osubd_destinations *dest;
    struct osubd_core *c;
    struct osubd_act *a;
    struct osubd_dp *dp;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(tmpdir_make(f->dir, sizeof(f->dir), "dp"), 0);
    snprintf(f->side, sizeof(f->side), "%s/STATE.allocated.json", f->dir);
    osubd_config_default(&f->cfg);
    snprintf(f->cfg.state_path, sizeof(f->cfg.state_path), "%s/STATE.db", f->dir);
    snprintf(f->cfg.device_plugin, sizeof(f->cfg.device_plugin), "%s", f->dir);
    snprintf(f->cfg.cgroup, sizeof(f->cfg.cgroup), "none");
    snprintf(f->cfg.cuda_shim, sizeof(f->cfg.cuda_shim), "none");
    char err[600] = "";
    assert_int_equal(osubd_parse_destinations("", &f->dest, err, sizeof(err)), 0);
    f->c = fake_core_new(&f->cfg, "2x81920");
    assert_non_null(f->c);
    f->a = osubd_act_new(f->c, &f->gpus, f->dest, err, sizeof(err));
    if (f->a == NULL)
        fail_msg("osubd_act_new: %s", err);
    f->dp = osubd_dp_new(f->c, f->a, &f->gpus, err, sizeof(err));
    if (f->dp == NULL)
        fail_msg("osubd_dp_new: %s", err);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    osubd_core_stop(f->c);
    osubd_dp_stop(f->dp);
    osubd_act_free(f->a);
    osubd_core_free(f->c);
    osubd_destinations_free(f->dest);
    assert_int_equal(tmpdir_remove(f->dir), 0);
    free(f);
    return 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "we");
    assert_non_null(fp);
    assert_int_equal(fputs(text, fp) >= 0, 1);
    assert_int_equal(fclose(fp), 0);
}

static int load(struct fixture *f, char *err, size_t errlen)
{
    struct osubd_module ma = osubd_act_module(f->a), md = osubd_dp_module(f->dp);
    assert_int_equal(osubd_core_register(f->c, &ma), 0);
    assert_int_equal(osubd_core_register(f->c, &md), 0);
    return osubd_core_load(f->c, err, errlen);
}

static void apply_ok(struct fixture *f, json_t *cmd)
{
    assert_non_null(cmd);
    char err[300] = "";
    int rc = osubd_apply(f->c, cmd, NULL, err, sizeof(err));
    if (rc != 0 || err[0] != '\0')
        fail_msg("%s: rc %d %s", json_string_value(json_object_get(cmd, "op")), rc, err);
    json_decref(cmd);
}

/* A pod service: submitted, its exec (the "kubernetes" record) kept by the actuators. */
static void submit_pod(struct fixture *f, const char *id)
{
    apply_ok(f, json_pack("{s:s, s:{s:s, s:s, s:i}}", "op", "submit", "spec", "id", id, "class",
                          "batch", "vram_mib", 1000));
    json_t *exec =
        json_pack("{s:{s:s, s:s, s:s}}", "kubernetes", "namespace", "ns", "name", id, "uid", "u-1");
    assert_int_equal(osubd_act_commit_exec(f->a, id, exec), 0);
    json_decref(exec);
}

static json_t *saved_allocations(const struct fixture *f)
{
    const char *text = fake_core_meta_text(f->c, "device_plugin_allocations");
    return text != NULL ? json_loads(text, 0, NULL) : NULL;
}

#define ALLOCS                                                                                     \
    "{\"pod-a\":[{\"container\":0,\"devices\":\"00000000000000a1\",\"n\":500}],"                   \
    "\"pod-b\":[{\"container\":1,\"devices\":\"00000000000000b2\",\"n\":700}]}"

static void test_new_and_module(void **state)
{
    struct fixture *f = *state;
    struct osubd_module m = osubd_dp_module(f->dp);
    assert_string_equal(m.name, "device_plugin");
    assert_ptr_equal(m.ctx, f->dp);
    assert_non_null(m.load);
    assert_non_null(m.save);
    assert_non_null(m.forget);
    assert_null(m.events); /* it hears nothing of commands but their saves and forgets */
    /* not started: no list, no cut */
    assert_int_equal(osubd_dp_cut_mib(f->dp), -1);
    assert_int_equal(osubd_dp_cut_mib(NULL), -1);
    struct evbuffer *b = evbuffer_new();
    osubd_dp_metrics(f->dp, b);
    evbuffer_add(b, "", 1);
    const char *text = (const char *)evbuffer_pullup(b, -1);
    assert_non_null(strstr(text, "oversub_deviceplugin_watchers 0\n"));
    assert_non_null(strstr(text, "oversub_deviceplugin_watch_refused_total 0\n"));
    evbuffer_free(b);
    osubd_dp_metrics(NULL, NULL); /* off: nothing */
    osubd_dp_stop(NULL);
    /* a folder that is not one */
    struct osubd_config cfg = f->cfg;
    snprintf(cfg.device_plugin, sizeof(cfg.device_plugin), "%s/nope", f->dir);
    struct osubd_core *c = fake_core_new(&cfg, "1x81920");
    char err[600] = "";
    assert_null(osubd_dp_new(c, f->a, &f->gpus, err, sizeof(err)));
    char want[200];
    snprintf(want, sizeof(want), "device_plugin: %s/nope is not a folder", f->dir);
    assert_string_equal(err, want);
    osubd_core_free(c);
}

static void test_load_from_meta_and_forget(void **state)
{
    struct fixture *f = *state;
    char err[600] = "";
    assert_int_equal(
        osubd_core_meta_set(f->c, "device_plugin_allocations", ALLOCS, err, sizeof(err)), 0);
    write_file(f->side, "{\"stale\":[]}"); /* the meta has them: the side file is not read */
    assert_int_equal(load(f, err, sizeof(err)), 0);
    submit_pod(f, "pod-a");
    submit_pod(f, "pod-b");
    assert_int_equal(fake_core_n_saves(f->c), 1); /* the actuators' exec, not the plugin */
    json_t *s = saved_allocations(f);
    assert_null(json_object_get(s, "stale"));
    json_decref(s);
    /* pod-a released: its allocation forgotten, saved with the release */
    apply_ok(f, json_pack("{s:s, s:s}", "op", "release", "id", "pod-a"));
    s = saved_allocations(f);
    assert_non_null(s);
    assert_null(json_object_get(s, "pod-a"));
    json_t *b = json_object_get(s, "pod-b");
    assert_int_equal(json_array_size(b), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(b, 0), "n")), 700);
    assert_null(json_object_get(s, "stale"));
    json_decref(s);
    /* forgetting a service it holds nothing for changes nothing */
    size_t saves = fake_core_n_saves(f->c);
    struct osubd_module m = osubd_dp_module(f->dp);
    m.forget(m.ctx, "never-allocated");
    assert_false(m.dirty(m.ctx));
    apply_ok(f, json_pack("{s:s}", "op", "tick"));
    assert_int_equal(fake_core_n_saves(f->c), saves);
}

static void test_load_side_file_once(void **state)
{
    struct fixture *f = *state;
    write_file(f->side, ALLOCS);
    char err[600] = "";
    assert_int_equal(load(f, err, sizeof(err)), 0);
    struct osubd_module m = osubd_dp_module(f->dp);
    assert_true(m.dirty(m.ctx)); /* into the state with the next command */
    /* a failed save: still dirty, the side file kept */
    fake_core_fail_saves(f->c, true);
    apply_ok(f, json_pack("{s:s}", "op", "tick"));
    fake_core_fail_saves(f->c, false);
    assert_true(m.dirty(m.ctx));
    assert_int_equal(access(f->side, F_OK), 0);
    assert_null(fake_core_meta_text(f->c, "device_plugin_allocations"));
    /* saved: in the state, the side file gone */
    apply_ok(f, json_pack("{s:s}", "op", "tick"));
    assert_false(m.dirty(m.ctx));
    assert_int_equal(access(f->side, F_OK), -1);
    json_t *s = saved_allocations(f);
    json_t *want = json_loads(ALLOCS, 0, NULL);
    assert_true(json_equal(s, want));
    json_decref(want);
    json_decref(s);
    /* a side file written again later is no longer read nor removed (read once) */
    write_file(f->side, "{}");
    assert_int_equal(osubd_act_set_pid(f->a, "x", 5), 0); /* a save comes with the submit */
    size_t saves = fake_core_n_saves(f->c);
    apply_ok(f, json_pack("{s:s, s:{s:s, s:s, s:i}}", "op", "submit", "spec", "id", "x", "class",
                          "batch", "vram_mib", 1000));
    assert_int_equal(fake_core_n_saves(f->c), saves + 1);
    assert_int_equal(access(f->side, F_OK), 0);
}

/* Records of another shape (a damaged state, a hand edit) are dropped with a warning, the rest
 * kept: a damaged record must not turn the next Allocate into a fatal "out of memory". */
static void test_load_damaged_records_dropped(void **state)
{
    struct fixture *f = *state;
    char err[600] = "";
    assert_int_equal(
        osubd_core_meta_set(f->c, "device_plugin_allocations",
                            "{\"ok\":[{\"container\":0,\"devices\":\"00000000000000a1\",\"n\":5},2,"
                            "{\"container\":-1,\"devices\":\"00000000000000a1\",\"n\":5},"
                            "{\"container\":1,\"devices\":\"zz\",\"n\":5},"
                            "{\"container\":1,\"devices\":\"00000000000000a1\",\"n\":0},"
                            "{\"container\":1,\"devices\":\"00000000000000a1\",\"n\":5,\"x\":1},"
                            "\"text\"],\"not-a-list\":\"text\",\"all-bad\":[{}],\"empty\":[]}",
                            err, sizeof(err)),
        0);
    assert_int_equal(load(f, err, sizeof(err)), 0);
    struct osubd_module m = osubd_dp_module(f->dp);
    assert_true(m.dirty(m.ctx)); /* what was dropped is saved with the next command */
    apply_ok(f, json_pack("{s:s}", "op", "tick"));
    json_t *s = saved_allocations(f);
    json_t *want = json_loads(
        "{\"ok\":[{\"container\":0,\"devices\":\"00000000000000a1\",\"n\":5},2]}", 0, NULL);
    if (!json_equal(s, want)) {
        char *t = json_dumps(s, JSON_COMPACT);
        fail_msg("kept %s", t);
    }
    json_decref(want);
    json_decref(s);
}

static void test_load_damaged_refused(void **state)
{
    struct fixture *f = *state;
    struct {
        const char *meta, *side, *want;
    } cases[] = {
        {"[1]", NULL, "device_plugin: device_plugin_allocations cannot be read (not an object)"},
        {"{oops", NULL, "device_plugin: device_plugin_allocations cannot be read ("},
        {NULL, "not json", "STATE.allocated.json cannot be read ("},
        {NULL, "\"text\"", "STATE.allocated.json cannot be read ("},
        {NULL, "[]", "STATE.allocated.json cannot be read (not an object)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct osubd_core *c = fake_core_new(&f->cfg, "1x81920");
        assert_non_null(c);
        char err[600] = "";
        struct osubd_dp *dp = osubd_dp_new(c, f->a, &f->gpus, err, sizeof(err));
        assert_non_null(dp);
        unlink(f->side);
        if (cases[i].meta != NULL)
            assert_int_equal(osubd_core_meta_set(c, "device_plugin_allocations", cases[i].meta, err,
                                                 sizeof(err)),
                             0);
        if (cases[i].side != NULL)
            write_file(f->side, cases[i].side);
        struct osubd_module m = osubd_dp_module(dp);
        assert_int_equal(osubd_core_register(c, &m), 0);
        int rc = osubd_core_load(c, err, sizeof(err));
        if (rc != -1 || strstr(err, cases[i].want) == NULL)
            fail_msg("case %zu: rc %d, '%s' (wanted '%s')", i, rc, err, cases[i].want);
        if (cases[i].side != NULL)
            assert_int_equal(access(f->side, F_OK), 0); /* refused: left for the operator */
        osubd_dp_stop(dp);
        osubd_core_free(c);
    }
    unlink(f->side);
    /* the state cannot be read: an error, never "nothing saved" */
    char err[600] = "";
    struct osubd_module m = osubd_dp_module(f->dp);
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    fake_core_fail_meta(f->c, true);
    assert_int_equal(osubd_core_load(f->c, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "cannot read 'device_plugin_allocations'"));
}

static void test_load_nothing_saved(void **state)
{
    struct fixture *f = *state;
    char err[600] = "";
    assert_int_equal(load(f, err, sizeof(err)), 0);
    struct osubd_module m = osubd_dp_module(f->dp);
    assert_false(m.dirty(m.ctx));
    json_t *meta = json_object();
    m.save(m.ctx, meta);
    assert_string_equal(json_string_value(json_object_get(meta, "device_plugin_allocations")),
                        "{}");
    json_decref(meta);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_fit),
        cmocka_unit_test_setup_teardown(test_new_and_module, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_from_meta_and_forget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_side_file_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_damaged_records_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_damaged_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_nothing_saved, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
