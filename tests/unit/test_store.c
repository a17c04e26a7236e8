/* test_store.c - oversubd's durable state: commands as JSON replayed from SQLite end in
 * exactly the state they left, with and without a snapshot, after a kill -9, and a foreign or
 * corrupt database is refused without being touched */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "command.h"
#include "helpers.h"
#include "sha256.h"
#include "store.h"

static char dir[] = "/tmp/osub-store-XXXXXX";
static char db[300];

static uint64_t rs = 99;
static int64_t rr(int64_t lo, int64_t hi)
{
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (int64_t)((rs >> 33) % (uint64_t)(hi - lo + 1));
}

/* A command stream touching every operation. */
static json_t *next_cmd(int i)
{
    char id[16];
    snprintf(id, sizeof(id), "s%d", (int)rr(0, 30));
    static const char *const cls[] = {"online", "batch", "experiment"};
    int k = (int)rr(0, 99);
    if (k < 25) {
        int64_t v = rr(1000, 60000);
        json_t *spec = json_pack("{s:s, s:s, s:I, s:I, s:b}", "id", id, "class", cls[rr(0, 2)],
                                 "vram_mib", (json_int_t)v, "min_vram_mib", (json_int_t)(v / 2 + 1),
                                 "resumable", rr(0, 1));
        return json_pack("{s:s, s:o, s:b}", "op", "submit", "spec", spec, "running", i < 20);
    }
    if (k < 55)
        return json_pack("{s:s, s:s, s:I, s:i}", "op", "usage", "id", id, "vram_mib",
                         (json_int_t)rr(0, 70000), "compute_pct", (int)rr(0, 100));
    if (k < 62)
        return json_pack("{s:s, s:s}", "op", "release", "id", id);
    if (k < 68)
        return json_pack("{s:s, s:s}", "op", "ready", "id", id);
    if (k < 75)
        return json_pack("{s:s, s:s, s:s}", "op", "ack", "id", id, "checkpoint", "step 7");
    if (k < 80)
        return json_pack("{s:s, s:s}", "op", "exited", "id", id);
    if (k < 82)
        return json_pack("{s:s, s:i}", "op", "ratio", "ratio_milli", (int)rr(1000, 2000));
    if (k < 84)
        return json_pack("{s:s, s:i, s:b}", "op", "cordon", "gpu", (int)rr(0, 3), "on", rr(0, 1));
    if (k < 86)
        return json_pack("{s:s, s:i, s:I}", "op", "system", "gpu", (int)rr(0, 3), "vram_mib",
                         (json_int_t)rr(0, 2000));
    if (k < 87)
        return json_pack("{s:s, s:s, s:I}", "op", "resize", "id", id, "vram_mib",
                         (json_int_t)rr(1000, 40000));
    return json_pack("{s:s}", "op", "tick");
}

static osub_engine_t *fresh(void)
{
    return mk_engine(4, 81920, 1500);
}

struct replay {
    osub_engine_t *e;
    long n;
};

static int replay_cb(void *arg, int64_t seq, int64_t engine_ms, int64_t unix_ms, const char *cmd)
{
    (void)seq;
    (void)unix_ms;
    struct replay *r = arg;
    json_t *j = json_loads(cmd, 0, NULL);
    if (j == NULL)
        return -1;
    char err[256];
    osubd__cmd_apply(r->e, j, engine_ms, NULL, err, sizeof(err));
    json_decref(j);
    r->n++;
    return 0;
}

/* Opens the store, rebuilds the engine from its snapshot and log. */
static osub_engine_t *restore(long *n_replayed)
{
    osubd__store_t *s;
    char err[512];
    if (osubd__store_open(db, &s, err, sizeof(err)) != 0)
        fail_msg("open: %s", err);
    char *snap;
    int64_t upto;
    assert_int_equal(osubd__store_load_snapshot(s, &snap, &upto), 0);
    osub_engine_t *e = NULL;
    if (snap != NULL) {
        assert_int_equal(osub_engine_load(snap, &e, NULL), 0);
        free(snap);
    } else {
        e = fresh();
    }
    struct replay r = {.e = e};
    assert_int_equal(osubd__store_replay(s, upto, replay_cb, &r), 0);
    osubd__store_close(s);
    if (n_replayed)
        *n_replayed = r.n;
    return e;
}

static void test_replay_restores_exactly(void **state)
{
    (void)state;
    unlink(db);
    osubd__store_t *s;
    char err[512];
    assert_int_equal(osubd__store_open(db, &s, err, sizeof(err)), 0);
    assert_int_equal(osubd__store_meta_set(s, "pool", "4x81920"), 0);
    osub_engine_t *live = fresh();
    int64_t t = 0, seq = 0;
    for (int i = 0; i < 3000; i++) {
        t += rr(0, 3) == 0 ? rr(0, 20000) : 0;
        json_t *c = next_cmd(i);
        char err2[256];
        osubd__cmd_apply(live, c, t, NULL, err2, sizeof(err2));
        char *text = json_dumps(c, JSON_COMPACT);
        assert_int_equal(osubd__store_append(s, t, 1700000000000 + t, text, &seq), 0);
        free(text);
        json_decref(c);
        if (i == 1500) {
            char *snap = osub_engine_save(live);
            assert_int_equal(osubd__store_snapshot(s, snap, seq), 0);
            free(snap);
        }
    }
    osubd__store_close(s);
    long n;
    osub_engine_t *back = restore(&n);
    assert_int_equal(n, 3000 - 1501); /* the snapshot covers the first 1501 */
    char *a = osub_engine_dump(live), *b = osub_engine_dump(back);
    assert_string_equal(a, b);
    free(a);
    free(b);
    check_ok(back);
    char *pool;
    assert_int_equal(osubd__store_open(db, &s, err, sizeof(err)), 0);
    assert_int_equal(osubd__store_meta_get(s, "pool", &pool), 0);
    assert_string_equal(pool, "4x81920");
    free(pool);
    osubd__store_close(s);
    struct stat st;
    assert_int_equal(stat(db, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    osub_engine_free(live);
    osub_engine_free(back);
}

static void test_committed_survives_kill9(void **state)
{
    (void)state;
    unlink(db);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        osubd__store_t *s;
        char err[512];
        if (osubd__store_open(db, &s, err, sizeof(err)) != 0)
            _exit(3);
        for (int i = 0; i < 400; i++) {
            char cmd[128];
            snprintf(cmd, sizeof(cmd), "{\"op\":\"tick\",\"n\":%d}", i);
            if (osubd__store_append(s, i, i, cmd, NULL) != 0)
                _exit(4);
        }
        raise(SIGKILL); /* no close, no checkpoint of the WAL */
        _exit(5);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    long n;
    osub_engine_t *back = restore(&n);
    assert_int_equal(n, 400); /* every append that returned is there */
    osub_engine_free(back);
}

static void test_foreign_and_corrupt_refused(void **state)
{
    (void)state;
    char err[512];
    osubd__store_t *s;
    /* not a database at all */
    char path[400];
    snprintf(path, sizeof(path), "%s/text.db", dir);
    FILE *f = fopen(path, "w");
    fputs("this is not a database, but it is somebody's file\n", f);
    fclose(f);
    assert_int_equal(osubd__store_open(path, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, path));
    f = fopen(path, "r");
    char line[128];
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    assert_string_equal(line, "this is not a database, but it is somebody's file\n");
    /* another application's database */
    snprintf(path, sizeof(path), "%s/other.db", dir);
    sqlite3 *o;
    assert_int_equal(sqlite3_open(path, &o), SQLITE_OK);
    assert_int_equal(sqlite3_exec(o, "CREATE TABLE users (name TEXT)", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(o);
    assert_int_equal(osubd__store_open(path, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "not an oversub database"));
    /* a newer schema */
    snprintf(path, sizeof(path), "%s/newer.db", dir);
    assert_int_equal(osubd__store_open(path, &s, err, sizeof(err)), 0);
    osubd__store_close(s);
    assert_int_equal(sqlite3_open(path, &o), SQLITE_OK);
    assert_int_equal(sqlite3_exec(o, "PRAGMA user_version=9", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(o);
    assert_int_equal(osubd__store_open(path, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "upgrade"));
    /* a folder that does not exist */
    assert_int_equal(osubd__store_open("/nonexistent/dir/x.db", &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "No such file"));
}

static void test_malformed_commands(void **state)
{
    (void)state;
    osub_engine_t *e = fresh();
    char *before = osub_engine_dump(e);
    const char *bad[] = {
        "{}",
        "{\"op\": \"frobnicate\"}",
        "{\"op\": \"release\"}",
        "{\"op\": \"usage\", \"id\": \"a\"}",
        "{\"op\": \"usage\", \"id\": \"a\", \"gpus\": []}",
        "{\"op\": \"usage\", \"id\": \"a\", \"vram_mib\": 5, \"compute_pct\": 101}",
        "{\"op\": \"ratio\", \"ratio_milli\": \"1.3\"}",
        "{\"op\": \"cordon\"}",
        "{\"op\": \"submit\", \"spec\": {\"id\": \"a\", \"vram_mib\": 1, \"colour\": 2}}",
        "{\"op\": \"resize\", \"id\": \"a\", \"batch_size\": -1}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        assert_non_null(j);
        char err[256] = "";
        if (osubd__cmd_apply(e, j, 0, NULL, err, sizeof(err)) != OSUB_EINVAL)
            fail_msg("%s: accepted", bad[i]);
        assert_non_null(strstr(err, "command"));
        json_decref(j);
    }
    char *after = osub_engine_dump(e);
    assert_string_equal(before, after);
    free(before);
    free(after);
    osub_engine_free(e);
}

static int setup(void **state)
{
    (void)state;
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(db, sizeof(db), "%s/state.db", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void hex(const uint8_t *b, char *out)
{
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

/* the per-service tokens' hash against FIPS 180-4's and RFC 4231's published vectors */
static void test_sha256_vectors(void **state)
{
    (void)state;
    uint8_t d[32];
    char h[65];
    osubd__sha256("abc", 3, d);
    hex(d, h);
    assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    osubd__sha256("", 0, d);
    hex(d, h);
    assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m56 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    osubd__sha256(m56, strlen(m56), d);
    hex(d, h);
    assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *million = malloc(1000000);
    assert_non_null(million);
    memset(million, 'a', 1000000);
    osubd__sha256(million, 1000000, d);
    free(million);
    hex(d, h);
    assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    osubd__hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, d);
    hex(d, h);
    assert_string_equal(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    uint8_t key[131];
    memset(key, 0xaa, sizeof(key));
    const char *big = "Test Using Larger Than Block-Size Key - Hash Key First";
    osubd__hmac_sha256(key, sizeof(key), big, strlen(big), d);
    hex(d, h);
    assert_string_equal(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_restores_exactly),
        cmocka_unit_test(test_committed_survives_kill9),
        cmocka_unit_test(test_foreign_and_corrupt_refused),
        cmocka_unit_test(test_malformed_commands),
        cmocka_unit_test(test_sha256_vectors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
