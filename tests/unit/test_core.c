/* test_core.c - oversubd's core (core.h) on a state in a temporary folder, without a daemon:
 * a new state on a pool of the test's own, a module that records every hook the core calls,
 * commands applied and logged (malformed ones and dry runs not), the modules' records saved
 * with the command that changed them, the commit callback before the log, the writer's tickets
 * made durable (the event loop run until the module hears it), the state restored from its
 * snapshot and replayed from its log after a crash, one core per state, notes, metrics */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "core.h"
#include "log.h"
#include "store.h"

#define MODNAME "testmod"

/* What the test module heard, and what it saves. */
struct rec {
    int load, dirty, save, saved_ok, saved_failed, events, durable, forget, metrics;
    size_t events_n;
    char loaded[128]; /* meta[MODNAME] as its load read it ("(none)": absent) */
    char forgot[8][64];
    bool want_dirty; /* dirty() answers this; saved(true) clears it */
    char value[64];  /* what save puts under MODNAME */
    bool a_started;  /* heard a start or admit event of service "a" */
    uint64_t last_durable;
    bool last_commit, last_events;
};

static int m_load(void *ctx, struct osubd_core *c, char *err, size_t errlen)
{
    struct rec *r = ctx;
    r->load++;
    char *text = NULL;
    if (osubd_core_meta(c, MODNAME, &text, err, errlen) != 0)
        return -1;
    snprintf(r->loaded, sizeof(r->loaded), "%s", text != NULL ? text : "(none)");
    free(text);
    return 0;
}

static bool m_dirty(void *ctx)
{
    struct rec *r = ctx;
    r->dirty++;
    return r->want_dirty;
}

static void m_save(void *ctx, json_t *meta)
{
    struct rec *r = ctx;
    r->save++;
    json_object_set_new(meta, MODNAME, json_string(r->value));
}

static void m_saved(void *ctx, bool ok)
{
    struct rec *r = ctx;
    if (ok) {
        r->saved_ok++;
        r->want_dirty = false;
    } else {
        r->saved_failed++;
    }
}

static void m_events(void *ctx, const osub_event_t *ev, size_t n)
{
    struct rec *r = ctx;
    r->events++;
    r->events_n += n;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ev[i].service, "a") == 0 &&
            (ev[i].kind == OSUB_EV_ADMIT || ev[i].kind == OSUB_EV_START))
            r->a_started = true;
}

static void m_durable(void *ctx, const struct osubd_progress *p)
{
    struct rec *r = ctx;
    r->durable++;
    r->last_durable = p->durable;
    r->last_commit = p->commit;
    r->last_events = p->events;
}

static void m_forget(void *ctx, const char *id)
{
    struct rec *r = ctx;
    if (r->forget < 8)
        snprintf(r->forgot[r->forget], sizeof(r->forgot[0]), "%s", id);
    r->forget++;
}

static void m_metrics(void *ctx, struct evbuffer *b)
{
    struct rec *r = ctx;
    r->metrics++;
    evbuffer_add_printf(b, "testmod_series 1\n");
}

static struct osubd_module module_of(struct rec *r)
{
    struct osubd_module m = {.name = MODNAME,
                             .ctx = r,
                             .load = m_load,
                             .dirty = m_dirty,
                             .save = m_save,
                             .saved = m_saved,
                             .events = m_events,
                             .durable = m_durable,
                             .forget = m_forget,
                             .metrics = m_metrics};
    return m;
}

struct fixture {
    char dir[64];
    struct osubd_config cfg; /* the cores borrow it */
    int pool_calls;
    char pool_asked[64]; /* the gpus the core asked the pool for */
    struct osubd_core *c;
    struct rec rec;
    FILE *log;
};

/* The machine's pool, as the test gives it: 2 GPUs of 81920 MiB. */
static int test_pool(void *arg, const char *gpus, struct osubd_pool *out, char *err, size_t errlen)
{
    struct fixture *f = arg;
    f->pool_calls++;
    snprintf(f->pool_asked, sizeof(f->pool_asked), "%s", gpus);
    if (strcmp(gpus, "sim:2x81920") != 0) {
        snprintf(err, errlen, "test pool: '%s' is not the test's", gpus);
        return -1;
    }
    out->n = 2;
    for (size_t i = 0; i < 2; i++) {
        out->vram[i] = 81920;
        snprintf(out->names[i], sizeof(out->names[i]), "TestGPU-%zu", i);
    }
    out->nvml = false;
    snprintf(out->desc, sizeof(out->desc), "the test's pool");
    return 0;
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/osubd-core-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    osubd_config_default(&f->cfg);
    snprintf(f->cfg.state_path, sizeof(f->cfg.state_path), "%s/state.db", f->dir);
    snprintf(f->cfg.gpus, sizeof(f->cfg.gpus), "sim:2x81920");
    f->log = tmpfile(); /* the core's lines, read by some tests */
    assert_non_null(f->log);
    osubd_log_set_stream(f->log);
    *state = f;
    return 0;
}

static void close_core(struct fixture *f)
{
    if (f->c == NULL)
        return;
    osubd_core_stop(f->c);
    osubd_core_free(f->c);
    f->c = NULL;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    close_core(f);
    osubd_log_set_stream(NULL);
    fclose(f->log);
    static const char *const tails[] = {"", "-wal", "-shm", ".lock", ".marker"};
    for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++) {
        char p[700];
        snprintf(p, sizeof(p), "%s%s", f->cfg.state_path, tails[i]);
        unlink(p);
    }
    rmdir(f->dir);
    free(f);
    return 0;
}

/* A core opened on the state (new or existing), the test module registered and loaded. */
static void open_core(struct fixture *f)
{
    f->c = osubd_core_new(&f->cfg);
    assert_non_null(f->c);
    char err[700] = "";
    if (osubd_core_open(f->c, test_pool, f, err, sizeof(err)) != 0)
        fail_msg("open: %s", err);
}

static void register_and_load(struct fixture *f)
{
    struct osubd_module m = module_of(&f->rec);
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    char err[700] = "";
    if (osubd_core_load(f->c, err, sizeof(err)) != 0)
        fail_msg("load: %s", err);
    assert_int_equal(f->rec.load, 1);
}

static void start(struct fixture *f)
{
    char err[700] = "";
    if (osubd_core_start(f->c, err, sizeof(err)) != 0)
        fail_msg("start: %s", err);
}

static int apply(struct fixture *f, const char *text, char *err, size_t errlen)
{
    json_error_t je;
    json_t *cmd = json_loads(text, 0, &je);
    if (cmd == NULL)
        fail_msg("test command not JSON: %s", je.text);
    int rc = osubd_apply(f->c, cmd, NULL, err, errlen);
    json_decref(cmd);
    return rc;
}

static void apply_ok(struct fixture *f, const char *text)
{
    char err[300] = "";
    int rc = apply(f, text, err, sizeof(err));
    if (rc != 0 || err[0] != '\0')
        fail_msg("%s: rc %d, '%s'", text, rc, err);
}

static const char sub_a[] = "{\"op\":\"submit\",\"spec\":{\"id\":\"a\",\"class\":\"batch\","
                            "\"vram_mib\":10000}}";
static const char sub_b[] = "{\"op\":\"submit\",\"spec\":{\"id\":\"b\",\"class\":\"batch\","
                            "\"vram_mib\":20000}}";

static int count_cb(void *arg, int64_t seq, int64_t engine_ms, int64_t unix_ms, const char *cmd)
{
    (void)seq;
    (void)engine_ms;
    (void)unix_ms;
    (void)cmd;
    (*(int *)arg)++;
    return 0;
}

/* The commands in the state's log (after its snapshot), read over a connection of our own. */
static int logged(const struct fixture *f)
{
    osubd__store_t *st = NULL;
    char err[600] = "";
    if (osubd__store_open(f->cfg.state_path, &st, err, sizeof(err)) != 0)
        fail_msg("store: %s", err);
    char *snap = NULL;
    int64_t upto = 0;
    assert_int_equal(osubd__store_load_snapshot(st, &snap, &upto), 0);
    free(snap);
    int n = 0;
    assert_int_equal(osubd__store_replay(st, upto, count_cb, &n), 0);
    osubd__store_close(st);
    return n;
}

static bool has_service(const struct fixture *f, const char *id)
{
    osub_service_info_t si;
    return osub_engine_service_info(osubd_core_engine(f->c), id, &si) == 0;
}

/* Runs the loop until the module hears that ticket is durable (a bounded number of turns: each
 * turn waits for the writer's pipe or the core's tick, never for a time of the test's own). */
static void wait_durable(struct fixture *f, uint64_t ticket)
{
    struct event_base *base = osubd_core_base(f->c);
    for (int i = 0; i < 200 && f->rec.last_durable < ticket; i++)
        event_base_loop(base, EVLOOP_ONCE);
    if (f->rec.last_durable < ticket)
        fail_msg("ticket %llu never became durable (heard %llu)", (unsigned long long)ticket,
                 (unsigned long long)f->rec.last_durable);
}

/* ---- a new state, loading ------------------------------------------------------------------ */

static void test_new_state_and_load(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    assert_int_equal(f->pool_calls, 1);
    assert_string_equal(f->pool_asked, "sim:2x81920");
    assert_false(osubd_core_existing(f->c));
    assert_string_equal(osubd_core_pool(f->c), "sim:2x81920");
    assert_ptr_equal(osubd_core_config(f->c), &f->cfg);
    assert_non_null(osubd_core_base(f->c));
    osub_engine_t *e = osubd_core_engine(f->c);
    assert_non_null(e);
    assert_int_equal(osub_engine_gpu_count(e), 2);
    osub_gpu_info_t gi;
    assert_int_equal(osub_engine_gpu_info(e, 1, &gi), 0);
    assert_int_equal(gi.vram_mib, 81920);
    assert_string_equal(gi.name, "TestGPU-1");
    /* what a module reads at load: written while starting */
    char err[700] = "";
    assert_int_equal(osubd_core_meta_set(f->c, MODNAME, "hello", err, sizeof(err)), 0);
    register_and_load(f);
    assert_string_equal(f->rec.loaded, "hello");
    char *none = (char *)"x";
    assert_int_equal(osubd_core_meta(f->c, "no_such_key", &none, err, sizeof(err)), 0);
    assert_null(none);
    assert_int_equal(osubd_engine_to_unix(f->c, 0), 0);
    assert_int_equal(osubd_engine_to_unix(f->c, 1500) - osubd_engine_to_unix(f->c, 500), 1000);
}

static int fail_load(void *ctx, struct osubd_core *c, char *err, size_t errlen)
{
    (void)ctx;
    (void)c;
    snprintf(err, errlen, "the saved records are bad");
    return -1;
}

static void test_load_error_names_state(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    struct osubd_module m = {.name = "bad", .load = fail_load};
    assert_int_equal(osubd_core_register(f->c, &m), 0);
    char err[700] = "";
    assert_int_equal(osubd_core_load(f->c, err, sizeof(err)), -1);
    assert_non_null(strstr(err, f->cfg.state_path));
    assert_non_null(strstr(err, "the saved records are bad"));
}

static void test_register_bounded(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    struct osubd_module m = {.name = "n"};
    for (int i = 0; i < OSUBD_MODULES_MAX; i++)
        assert_int_equal(osubd_core_register(f->c, &m), 0);
    assert_int_equal(osubd_core_register(f->c, &m), -1);
}

/* core.h: modules register before they load; a late one is a programming error (an assert:
 * only in builds with assertions). */
static void test_register_after_load_asserts(void **state)
{
#ifdef NDEBUG
    (void)state;
    skip();
#else
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct osubd_module m = {.name = "late"};
        osubd_core_register(f->c, &m);
        _exit(0); /* the assert did not fire */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
#endif
}

/* ---- commands ------------------------------------------------------------------------------ */

static void test_apply_good_command(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    json_t *cmd = json_loads(sub_a, 0, NULL);
    osub_submit_result_t res;
    char err[300] = "";
    assert_int_equal(osubd_apply(f->c, cmd, &res, err, sizeof(err)), 0);
    json_decref(cmd);
    assert_string_equal(err, "");
    assert_int_equal(res.outcome, OSUB_SUBMIT_STARTED);
    assert_true(has_service(f, "a"));
    assert_int_equal(logged(f), 1); /* no writer yet: on disk at once */
    assert_int_equal(osubd_core_version(f->c), 1);
    /* the submit's events reached the module, and (written at once) the durable hook too */
    assert_int_equal(f->rec.events, 1);
    assert_true(f->rec.events_n > 0);
    assert_true(f->rec.a_started);
    assert_true(f->rec.durable >= 1);
    assert_true(f->rec.last_events);
    assert_false(f->rec.last_commit);
    assert_int_equal(f->rec.forget, 0);
    assert_true(osubd_core_last_event(f->c) > 0);
}

static void test_malformed_not_logged(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    apply_ok(f, sub_a);
    struct rec before = f->rec;
    int n = logged(f);
    uint64_t version = osubd_core_version(f->c);
    static const char *const bad[] = {
        "{\"op\":\"explode\"}",
        "{\"id\":\"a\"}",
        "{\"op\":\"release\"}",
        "{\"op\":\"submit\",\"spec\":{\"class\":\"batch\"}}",
        "{\"op\":\"usage\",\"id\":\"a\",\"vram_mib\":\"lots\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[300] = "";
        int rc = apply(f, bad[i], err, sizeof(err));
        if (rc != OSUB_EINVAL || err[0] == '\0')
            fail_msg("%s: rc %d, err '%s'", bad[i], rc, err);
    }
    assert_int_equal(logged(f), n);
    assert_int_equal(osubd_core_version(f->c), version);
    assert_int_equal(f->rec.events, before.events);
    assert_int_equal(f->rec.dirty, before.dirty);
    assert_int_equal(f->rec.save, before.save);
    assert_int_equal(f->rec.durable, before.durable);
    assert_int_equal(f->rec.forget, before.forget);
    assert_true(has_service(f, "a"));
}

static void test_dry_run_not_logged(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    json_t *cmd = json_loads(sub_b, 0, NULL);
    json_object_set_new(cmd, "dry_run", json_true());
    osub_submit_result_t res;
    char err[300] = "";
    assert_int_equal(osubd_apply(f->c, cmd, &res, err, sizeof(err)), 0);
    json_decref(cmd);
    assert_string_equal(err, "");
    assert_int_equal(res.outcome, OSUB_SUBMIT_STARTED); /* what it would do */
    assert_int_equal(res.n_gpus, 1);
    assert_false(has_service(f, "b"));
    assert_int_equal(logged(f), 0);
    assert_int_equal(osubd_core_version(f->c), 0);
    assert_int_equal(f->rec.events, 0);
    assert_int_equal(f->rec.dirty, 0);
}

static void test_release_forgets(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    apply_ok(f, sub_a);
    apply_ok(f, sub_b);
    assert_int_equal(f->rec.forget, 0);
    apply_ok(f, "{\"op\":\"release\",\"id\":\"a\"}");
    assert_int_equal(f->rec.forget, 1);
    assert_string_equal(f->rec.forgot[0], "a");
    assert_false(has_service(f, "a"));
    assert_true(has_service(f, "b"));
    /* refused (no such service): logged, and nothing to forget */
    char err[300] = "";
    assert_int_not_equal(apply(f, "{\"op\":\"release\",\"id\":\"a\"}", err, sizeof(err)), 0);
    assert_string_equal(err, "");
    assert_int_equal(f->rec.forget, 1);
    assert_int_equal(logged(f), 4);
}

static void test_save_with_command(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    assert_string_equal(f->rec.loaded, "(none)");
    apply_ok(f, sub_a);
    assert_true(f->rec.dirty > 0);
    assert_int_equal(f->rec.save, 0); /* not dirty: nothing saved */
    f->rec.want_dirty = true;
    snprintf(f->rec.value, sizeof(f->rec.value), "v2");
    apply_ok(f, sub_b);
    assert_int_equal(f->rec.save, 1);
    assert_int_equal(f->rec.saved_ok, 1);
    assert_false(f->rec.want_dirty);
    char *text = NULL;
    char err[700] = "";
    assert_int_equal(osubd_core_meta(f->c, MODNAME, &text, err, sizeof(err)), 0);
    assert_non_null(text);
    assert_string_equal(text, "v2");
    free(text);
    /* kept with the state: the next run's load reads it */
    close_core(f);
    memset(&f->rec, 0, sizeof(f->rec));
    open_core(f);
    assert_true(osubd_core_existing(f->c));
    register_and_load(f);
    assert_string_equal(f->rec.loaded, "v2");
}

struct commit_seen {
    struct fixture *f;
    int calls, rc, logged_then;
    osub_submit_outcome_t outcome;
};

static void on_commit(void *arg, int rc, const osub_submit_result_t *res)
{
    struct commit_seen *s = arg;
    s->calls++;
    s->rc = rc;
    s->outcome = res->outcome;
    s->logged_then = logged(s->f);
    /* what the caller keeps now is saved with the command */
    s->f->rec.want_dirty = true;
    snprintf(s->f->rec.value, sizeof(s->f->rec.value), "kept rc=%d", rc);
}

static int apply_with(struct fixture *f, const char *text, struct commit_seen *s)
{
    json_t *cmd = json_loads(text, 0, NULL);
    assert_non_null(cmd);
    osub_submit_result_t res;
    char err[300] = "";
    int rc = osubd_apply_with(f->c, cmd, &res, err, sizeof(err), on_commit, s);
    json_decref(cmd);
    return rc;
}

static void test_apply_with_commit_before_log(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    struct commit_seen s = {.f = f};
    assert_int_equal(apply_with(f, sub_a, &s), 0);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.rc, 0);
    assert_int_equal(s.outcome, OSUB_SUBMIT_STARTED);
    assert_int_equal(s.logged_then, 0); /* before the command was logged */
    assert_int_equal(logged(f), 1);
    char *text = NULL;
    char err[700] = "";
    assert_int_equal(osubd_core_meta(f->c, MODNAME, &text, err, sizeof(err)), 0);
    assert_string_equal(text, "kept rc=0");
    free(text);
    /* refused by the engine: the callback hears the engine's code (two backed services fill
     * the pool; a third, not preemptible, does not queue) */
    apply_ok(f, "{\"op\":\"submit\",\"spec\":{\"id\":\"o1\",\"class\":\"online\","
                "\"vram_mib\":80000}}");
    apply_ok(f, "{\"op\":\"submit\",\"spec\":{\"id\":\"o2\",\"class\":\"online\","
                "\"vram_mib\":80000}}");
    int rc = apply_with(f,
                        "{\"op\":\"submit\",\"spec\":{\"id\":\"o3\",\"class\":\"online\","
                        "\"vram_mib\":80000}}",
                        &s);
    assert_int_not_equal(rc, 0);
    assert_int_equal(s.calls, 2);
    assert_int_equal(s.rc, rc);
    if (s.outcome != OSUB_SUBMIT_REJECTED)
        fail_msg("huge: rc %d (%s), outcome %d", rc, osub_strerror(rc), (int)s.outcome);
    assert_int_equal(s.logged_then, 3);
    assert_int_equal(logged(f), 4);
    /* malformed and dry runs: not called */
    assert_int_equal(apply_with(f, "{\"op\":\"explode\"}", &s), OSUB_EINVAL);
    char dry[200];
    snprintf(dry, sizeof(dry),
             "{\"op\":\"submit\",\"dry_run\":true,\"spec\":{\"id\":\"d\","
             "\"class\":\"batch\",\"vram_mib\":1000}}");
    assert_int_equal(apply_with(f, dry, &s), 0);
    assert_int_equal(s.calls, 2);
}

/* ---- the writer, the restart --------------------------------------------------------------- */

static void test_writer_ticket_durable_then_restored(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    start(f);
    f->rec.want_dirty = true;
    snprintf(f->rec.value, sizeof(f->rec.value), "through the writer");
    apply_ok(f, sub_a);
    uint64_t t = osubd_core_applied(f->c);
    assert_true(t > 0);
    wait_durable(f, t);
    assert_true(f->rec.last_commit);
    assert_true(f->rec.last_events);
    assert_true(osubd_core_durable(f->c) >= t);
    assert_int_equal(f->rec.saved_ok, 1);
    /* a second command: a later ticket */
    apply_ok(f, sub_b);
    uint64_t t2 = osubd_core_applied(f->c);
    assert_true(t2 > t);
    wait_durable(f, t2);
    /* stop: durable and heard of; free: a last snapshot */
    close_core(f);
    memset(&f->rec, 0, sizeof(f->rec));
    f->pool_calls = 0;
    open_core(f);
    assert_true(osubd_core_existing(f->c));
    assert_int_equal(f->pool_calls, 0); /* from the snapshot: the pool is the state's */
    assert_true(has_service(f, "a"));
    assert_true(has_service(f, "b"));
    osub_service_info_t si;
    assert_int_equal(osub_engine_service_info(osubd_core_engine(f->c), "b", &si), 0);
    assert_int_equal(si.grant_mib, 20000);
    register_and_load(f);
    assert_string_equal(f->rec.loaded, "through the writer");
}

static int child_run(struct fixture *f)
{
    /* no cmocka here: exit codes say what failed */
    f->c = osubd_core_new(&f->cfg);
    char err[700];
    if (f->c == NULL || osubd_core_open(f->c, test_pool, f, err, sizeof(err)) != 0)
        return 10;
    struct osubd_module m = module_of(&f->rec);
    if (osubd_core_register(f->c, &m) != 0 || osubd_core_load(f->c, err, sizeof(err)) != 0)
        return 11;
    json_t *a = json_loads(sub_a, 0, NULL);
    json_t *b = json_loads(sub_b, 0, NULL);
    if (osubd_apply(f->c, a, NULL, err, sizeof(err)) != 0) /* before the writer: at once */
        return 12;
    if (osubd_core_start(f->c, err, sizeof(err)) != 0)
        return 13;
    if (osubd_apply(f->c, b, NULL, err, sizeof(err)) != 0) /* through the writer */
        return 14;
    uint64_t t = osubd_core_applied(f->c);
    for (int i = 0; i < 200 && f->rec.last_durable < t; i++)
        event_base_loop(osubd_core_base(f->c), EVLOOP_ONCE);
    if (f->rec.last_durable < t)
        return 15;
    return 0; /* and no stop, no free: no snapshot, as after kill -9 */
}

static void test_crash_replayed(void **state)
{
    struct fixture *f = *state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(child_run(f));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(logged(f), 2); /* both commands in the log, no snapshot */
    open_core(f);
    assert_true(osubd_core_existing(f->c));
    /* no snapshot: the engine made as the state was made, then the log replayed on it */
    assert_int_equal(f->pool_calls, 1);
    assert_string_equal(f->pool_asked, "sim:2x81920");
    assert_true(has_service(f, "a"));
    assert_true(has_service(f, "b"));
    osub_gpu_info_t gi;
    assert_int_equal(osub_engine_gpu_info(osubd_core_engine(f->c), 0, &gi), 0);
    assert_string_equal(gi.name, "TestGPU-0");
    /* and it goes on: the marker agrees with the state */
    register_and_load(f);
    start(f);
    apply_ok(f, "{\"op\":\"release\",\"id\":\"a\"}");
    wait_durable(f, osubd_core_applied(f->c));
    assert_int_equal(f->rec.forget, 1);
}

static void test_second_open_refused(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    struct osubd_core *c2 = osubd_core_new(&f->cfg);
    assert_non_null(c2);
    char err[700] = "";
    assert_int_equal(osubd_core_open(c2, test_pool, f, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "another oversubd runs on this state"));
    assert_int_equal(f->pool_calls, 1); /* refused before it made anything */
    osubd_core_free(c2);
    /* the first one still works, and once it is gone the state opens again */
    register_and_load(f);
    apply_ok(f, sub_a);
    close_core(f);
    memset(&f->rec, 0, sizeof(f->rec));
    open_core(f);
    assert_true(has_service(f, "a"));
}

static void test_service_token_kept(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    char t1[65], t2[65], tb[65];
    osubd_service_token(f->c, "a", t1);
    osubd_service_token(f->c, "b", tb);
    assert_int_equal(strlen(t1), 64);
    assert_string_not_equal(t1, tb);
    close_core(f);
    open_core(f);
    osubd_service_token(f->c, "a", t2);
    assert_string_equal(t1, t2); /* the key is the state's */
}

/* ---- notes, metrics ------------------------------------------------------------------------ */

struct seen {
    int n;
    int64_t seq;
    char text[1024];
};

static int seen_cb(void *arg, int64_t seq, const char *text)
{
    struct seen *s = arg;
    s->n++;
    s->seq = seq;
    snprintf(s->text, sizeof(s->text), "%s", text);
    return 0;
}

static void test_note_logged_as_event(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    apply_ok(f, sub_a);
    int64_t last = osubd_core_last_event(f->c);
    int n = logged(f);
    osubd_note(f->c, "a", "process", "exit", "a's process %d exited with %s", 4242, "status 3");
    assert_true(osubd_core_last_event(f->c) > last);
    struct seen s = {0};
    assert_int_equal(osubd_core_events(f->c, last, 10, seen_cb, &s), 0);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.seq, osubd_core_last_event(f->c));
    json_t *ev = json_loads(s.text, 0, NULL);
    assert_non_null(ev);
    assert_string_equal(json_string_value(json_object_get(ev, "kind")), "process");
    assert_string_equal(json_string_value(json_object_get(ev, "reason")), "exit");
    assert_string_equal(json_string_value(json_object_get(ev, "service")), "a");
    assert_string_equal(json_string_value(json_object_get(ev, "message")),
                        "a's process 4242 exited with status 3");
    json_decref(ev);
    assert_int_equal(logged(f), n + 1); /* a "note" command: replays as a no-op */
    assert_true(has_service(f, "a"));
    /* printed, too */
    fflush(f->log);
    rewind(f->log);
    char line[512];
    bool printed = false;
    while (fgets(line, sizeof(line), f->log) != NULL)
        printed = printed || strstr(line, "oversubd: a's process 4242 exited") != NULL;
    assert_true(printed);
    /* under --log-level warn a note is quiet, a warning is printed (and both are events) */
    osubd_log_set_level(OSUBD_LOG_WARN);
    fseek(f->log, 0, SEEK_END);
    long at = ftell(f->log);
    osubd_note(f->c, "a", "process", "spawn", "quiet note");
    osubd_warn(f->c, "a", "shim", "damaged", "loud warning");
    osubd_log_set_level(OSUBD_LOG_INFO);
    assert_int_equal(logged(f), n + 3);
    fflush(f->log);
    fseek(f->log, at, SEEK_SET);
    bool quiet = false, loud = false;
    while (fgets(line, sizeof(line), f->log) != NULL) {
        quiet = quiet || strstr(line, "quiet note") != NULL;
        loud = loud || strstr(line, "loud warning") != NULL;
    }
    assert_false(quiet);
    assert_true(loud);
    fseek(f->log, 0, SEEK_END);
    /* the state with the note opens again */
    close_core(f);
    open_core(f);
    assert_true(has_service(f, "a"));
}

static void test_metrics(void **state)
{
    struct fixture *f = *state;
    open_core(f);
    register_and_load(f);
    apply_ok(f, sub_a);
    struct evbuffer *b = evbuffer_new();
    assert_non_null(b);
    osubd_core_metrics(f->c, b);
    evbuffer_add(b, "", 1);
    const char *text = (const char *)evbuffer_pullup(b, -1);
    assert_non_null(strstr(text, "# TYPE oversub_decisions_total counter\n"));
    assert_non_null(strstr(text, "oversub_decisions_total{kind=\"admit\",level=\"batch\"} 1\n"));
    assert_non_null(strstr(text, "oversub_decisions_total{kind=\"evict\",level=\"online\"} 0\n"));
    assert_non_null(strstr(text, "oversub_store_disk_full 0\n"));
    assert_non_null(strstr(text, "testmod_series 1\n"));
    assert_int_equal(f->rec.metrics, 1);
    evbuffer_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_new_state_and_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_error_names_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_register_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_register_after_load_asserts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_apply_good_command, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_not_logged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dry_run_not_logged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_forgets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_with_command, setup, teardown),
        cmocka_unit_test_setup_teardown(test_apply_with_commit_before_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_ticket_durable_then_restored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_replayed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_open_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_service_token_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_note_logged_as_event, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
