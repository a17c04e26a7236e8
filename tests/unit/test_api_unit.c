/* test_api_unit.c - the control API (api.h) without a daemon: osubd_api_new and
 * osubd_api_listen on 127.0.0.1 port 0 (no Unix socket) on the fake core (fake_core.h), with the
 * real actuators and routes. Requests come from a blocking loopback client in the test while
 * the test turns the loop (loop_client.h): the pool, refused bodies and specs with their error
 * codes, an unknown path, a browser's origin and a name that is not oversubd's, the token, a
 * reply held until the fake core's commit reaches the module's durable hook (and the same
 * reply made a 503 when the disk fills instead). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>
#include <unistd.h>

#include "api.h"
#include "fake_core.h"
#include "loop_client.h"
#include "tmpdir.h"

struct fixture {
    char dir[64];
    struct osubd_config cfg;
    struct osubd_gpus gpus;
    struct osubd_destinations *dest;
    struct osubd_self self;
    struct osubd_core *c;
    struct osubd_act *act;
    struct osubd_routes *routes;
    struct osubd_api *api;
    int port;
    struct lc_answer *ans;
    json_t *body; /* the last answer's body, parsed */
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->ans = calloc(1, sizeof(*f->ans));
    assert_non_null(f->ans);
    assert_int_equal(tmpdir_make(f->dir, sizeof(f->dir), "api"), 0);
    osubd_config_default(&f->cfg);
    snprintf(f->cfg.state_path, sizeof(f->cfg.state_path), "%s/state.db", f->dir);
    snprintf(f->cfg.listen_host, sizeof(f->cfg.listen_host), "127.0.0.1");
    f->cfg.listen_port = 0;
    f->cfg.socket_path[0] = '\0';
    snprintf(f->cfg.cgroup, sizeof(f->cfg.cgroup), "none");
    snprintf(f->cfg.cuda_shim, sizeof(f->cfg.cuda_shim), "none");
    snprintf(f->cfg.kube_api, sizeof(f->cfg.kube_api), "none");
    char err[600] = "";
    assert_int_equal(osubd_parse_destinations("", &f->dest, err, sizeof(err)), 0);
    f->c = fake_core_new(&f->cfg, "2x81920");
    assert_non_null(f->c);
    f->act = osubd_act_new(f->c, &f->gpus, f->dest, err, sizeof(err));
    if (f->act == NULL)
        fail_msg("osubd_act_new: %s", err);
    f->routes = osubd_routes_new();
    assert_non_null(f->routes);
    struct osubd_api_deps dep = {
        .act = f->act, .routes = f->routes, .gpus = &f->gpus, .dest = f->dest, .self = &f->self};
    f->api = osubd_api_new(f->c, &dep, err, sizeof(err));
    assert_non_null(f->api);
    if (osubd_api_listen(f->api, err, sizeof(err)) != 0)
        fail_msg("osubd_api_listen: %s", err);
    f->port = osubd_api_port(f->api);
    assert_true(f->port > 0);
    assert_int_equal(f->self.n, 1); /* its listener, for the Host check */
    struct osubd_module ma = osubd_act_module(f->act), mr = osubd_routes_module(f->routes),
                        mapi = osubd_api_module(f->api);
    assert_string_equal(mapi.name, "api");
    assert_non_null(mapi.durable);
    assert_int_equal(osubd_core_register(f->c, &ma), 0);
    assert_int_equal(osubd_core_register(f->c, &mr), 0);
    assert_int_equal(osubd_core_register(f->c, &mapi), 0);
    if (osubd_core_load(f->c, err, sizeof(err)) != 0)
        fail_msg("load: %s", err);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    osubd_core_stop(f->c);
    osubd_api_free(f->api);
    osubd_act_free(f->act);
    osubd_routes_free(f->routes);
    osubd_core_free(f->c);
    osubd_destinations_free(f->dest);
    json_decref(f->body);
    assert_int_equal(tmpdir_remove(f->dir), 0);
    free(f->ans);
    free(f);
    return 0;
}

static struct event_base *base_of(const struct fixture *f)
{
    return osubd_core_base(f->c);
}

/* A request's text: Host names the listener unless headers give one; the connection closes
 * after the answer. */
static void request_text(const struct fixture *f, char *out, size_t len, const char *method,
                         const char *path, const char *headers, const char *body)
{
    char host[64] = "";
    if (headers == NULL || strstr(headers, "Host:") == NULL)
        snprintf(host, sizeof(host), "Host: 127.0.0.1:%d\r\n", f->port);
    size_t bl = body != NULL ? strlen(body) : 0;
    char cl[64] = "";
    if (body != NULL)
        snprintf(cl, sizeof(cl), "Content-Length: %zu\r\n", bl);
    snprintf(out, len, "%s %s HTTP/1.1\r\n%s%s%sConnection: close\r\n\r\n%s", method, path, host,
             headers != NULL ? headers : "", cl, body != NULL ? body : "");
}

/* Sends a request and turns the loop until its answer is in (the server closes): its status;
 * the body parsed into f->body. */
static int ask(struct fixture *f, const char *method, const char *path, const char *headers,
               const char *body)
{
    char text[8192];
    request_text(f, text, sizeof(text), method, path, headers, body);
    memset(f->ans, 0, sizeof(*f->ans));
    int fd = lc_connect(f->port);
    assert_true(fd >= 0);
    assert_int_equal(lc_send(fd, text, strlen(text)), 0);
    if (!lc_wait_closed(base_of(f), fd, f->ans, LOOP_TURNS_MAX))
        fail_msg("%s %s: no answer (read %zu bytes)", method, path, f->ans->len);
    close(fd);
    json_decref(f->body);
    const char *b = lc_body(f->ans);
    f->body = b != NULL ? json_loads(b, 0, NULL) : NULL;
    return lc_status(f->ans);
}

static const char *error_code(const struct fixture *f)
{
    return json_string_value(json_object_get(json_object_get(f->body, "error"), "code"));
}

#define JSON_CT "Content-Type: application/json\r\n"

static void test_pool(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(ask(f, "GET", "/v1/pool", NULL, NULL), 200);
    assert_non_null(strstr(f->ans->buf, "Content-Type: application/json"));
    json_t *gpus = json_object_get(f->body, "gpus");
    assert_int_equal(json_array_size(gpus), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *g = json_array_get(gpus, i);
        assert_int_equal(json_integer_value(json_object_get(g, "index")), (json_int_t)i);
        assert_int_equal(json_integer_value(json_object_get(g, "vram_mib")), 81920);
        char uuid[16];
        snprintf(uuid, sizeof(uuid), "sim-%zu", i);
        assert_string_equal(json_string_value(json_object_get(g, "uuid")), uuid);
        assert_true(json_is_false(json_object_get(g, "lost")));
    }
    json_t *totals = json_object_get(f->body, "totals");
    assert_int_equal(json_integer_value(json_object_get(totals, "vram_mib")), 2 * 81920);
    assert_int_equal(json_integer_value(json_object_get(totals, "held_mib")), 0);
    /* a service held there shows in the next answer (the cached text follows the commands) */
    json_t *cmd = json_pack("{s:s, s:{s:s, s:s, s:i}}", "op", "submit", "spec", "id", "s", "class",
                            "batch", "vram_mib", 10000);
    char err[300];
    assert_int_equal(osubd_apply(f->c, cmd, NULL, err, sizeof(err)), 0);
    json_decref(cmd);
    assert_int_equal(ask(f, "GET", "/v1/pool", NULL, NULL), 200);
    totals = json_object_get(f->body, "totals");
    assert_int_equal(json_integer_value(json_object_get(totals, "granted_mib")), 10000);
    /* and its health: the engine's books balance */
    assert_int_equal(ask(f, "GET", "/healthz", NULL, NULL), 200);
    assert_string_equal(json_string_value(json_object_get(f->body, "invariants")), "ok");
}

static void test_refused_requests(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(ask(f, "POST", "/v1/services", JSON_CT, "{\"id\": \"x\", "), 400);
    assert_string_equal(error_code(f), "malformed_json");
    assert_int_equal(ask(f, "POST", "/v1/services", JSON_CT, "[1, 2]"), 400);
    assert_string_equal(error_code(f), "malformed_json");
    assert_int_equal(ask(f, "POST", "/v1/services", JSON_CT,
                         "{\"id\":\"x\",\"class\":\"batch\",\"vram_mib\":1,\"colour\":1}"),
                     400);
    assert_string_equal(error_code(f), "invalid_spec");
    assert_int_equal(ask(f, "POST", "/v1/services", JSON_CT,
                         "{\"id\":\"x\",\"class\":\"batch\",\"vram_mib\":1,\"command\":[\"\"]}"),
                     422);
    assert_string_equal(error_code(f), "invalid_spec");
    /* a program over TCP without the admin token configured: not for this door */
    assert_int_equal(ask(f, "POST", "/v1/services", JSON_CT,
                         "{\"id\":\"x\",\"class\":\"batch\",\"vram_mib\":1,\"command\":[\"/bin/"
                         "true\"]}"),
                     403);
    assert_string_equal(error_code(f), "forbidden");
    /* a change without JSON's media type (what a page's form sends) */
    assert_int_equal(ask(f, "POST", "/v1/services", NULL, "{}"), 415);
    assert_string_equal(error_code(f), "unsupported_media_type");
    assert_int_equal(ask(f, "GET", "/v1/nosuch", NULL, NULL), 404);
    assert_string_equal(error_code(f), "not_found");
    assert_int_equal(ask(f, "POST", "/healthz", JSON_CT, "{}"), 405);
    /* nothing of it reached the engine */
    assert_int_equal(fake_core_n_cmds(f->c), 0);
}

static void test_browser_refused(void **state)
{
    struct fixture *f = *state;
    char hd[200];
    snprintf(hd, sizeof(hd), "Origin: http://evil.example\r\n");
    assert_int_equal(ask(f, "GET", "/v1/pool", hd, NULL), 403);
    assert_string_equal(error_code(f), "cross_origin");
    /* the same origin as the Host: its own dashboard */
    snprintf(hd, sizeof(hd), "Origin: http://127.0.0.1:%d\r\n", f->port);
    assert_int_equal(ask(f, "GET", "/v1/pool", hd, NULL), 200);
    /* a name that is not oversubd's (DNS rebinding) */
    snprintf(hd, sizeof(hd), "Host: evil.example:%d\r\n", f->port);
    assert_int_equal(ask(f, "GET", "/v1/pool", hd, NULL), 403);
    assert_string_equal(error_code(f), "forbidden_host");
    snprintf(hd, sizeof(hd), "Host: localhost:%d\r\n", f->port);
    assert_int_equal(ask(f, "GET", "/v1/pool", hd, NULL), 200);
    /* two lengths: the framing is ambiguous */
    assert_int_equal(ask(f, "POST", "/v1/services", JSON_CT "Content-Length: 2\r\n", "{}"), 400);
    assert_string_equal(error_code(f), "bad_request");
}

static void test_token(void **state)
{
    struct fixture *f = *state;
    snprintf(f->cfg.token, sizeof(f->cfg.token), "s3cret-admin");
    const char *spec = "{\"id\":\"t\",\"class\":\"batch\",\"vram_mib\":1000}";
    assert_int_equal(ask(f, "POST", "/v1/services", JSON_CT, spec), 401);
    assert_string_equal(error_code(f), "unauthorized");
    assert_int_equal(
        ask(f, "POST", "/v1/services", JSON_CT "Authorization: Bearer wrong-admin\r\n", spec), 401);
    assert_int_equal(fake_core_n_cmds(f->c), 0);
    /* reads need none */
    assert_int_equal(ask(f, "GET", "/v1/pool", NULL, NULL), 200);
    /* before the core starts, a command is durable at once: the answer is not held */
    assert_int_equal(
        ask(f, "POST", "/v1/services", JSON_CT "Authorization: Bearer s3cret-admin\r\n", spec),
        201);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(f->body, "decision"), "outcome")),
        "started");
    /* the service's own token answers its own calls */
    char tok[65];
    osubd_service_token(f->c, "t", tok);
    assert_string_equal(json_string_value(json_object_get(f->body, "token")), tok);
    char hd[200];
    snprintf(hd, sizeof(hd), JSON_CT "Authorization: Bearer %s\r\n", tok);
    assert_int_equal(ask(f, "POST", "/v1/services/t/ready", hd, ""), 200);
    assert_int_equal(ask(f, "POST", "/v1/services/t/release", hd, ""), 401); /* not its own */
    f->cfg.token[0] = '\0';
}

/* Sends a request whose command the core applies but does not make durable: the answer waits.
 * Returns the client's socket (the answer not read yet). */
static int send_held(struct fixture *f, const char *id)
{
    char body[200], text[1024];
    snprintf(body, sizeof(body), "{\"id\":\"%s\",\"class\":\"batch\",\"vram_mib\":1000}", id);
    request_text(f, text, sizeof(text), "POST", "/v1/services", JSON_CT, body);
    size_t cmds = fake_core_n_cmds(f->c);
    int fd = lc_connect(f->port);
    assert_true(fd >= 0);
    assert_int_equal(lc_send(fd, text, strlen(text)), 0);
    for (int i = 0; i < LOOP_TURNS_MAX && fake_core_n_cmds(f->c) == cmds; i++)
        event_base_loop(base_of(f), EVLOOP_NONBLOCK);
    assert_int_equal(fake_core_n_cmds(f->c), cmds + 1); /* applied */
    assert_true(osubd_core_applied(f->c) > osubd_core_durable(f->c));
    /* the loop turns on: nothing is sent before the commit */
    memset(f->ans, 0, sizeof(*f->ans));
    for (int i = 0; i < 1000; i++) {
        event_base_loop(base_of(f), EVLOOP_NONBLOCK);
        lc_read_now(fd, f->ans);
    }
    assert_int_equal(f->ans->len, 0);
    assert_false(f->ans->closed);
    return fd;
}

static void test_reply_held_until_durable(void **state)
{
    struct fixture *f = *state;
    char err[300] = "";
    assert_int_equal(osubd_core_start(f->c, err, sizeof(err)), 0);
    int fd = send_held(f, "held");
    /* a read meanwhile: it would show what is not on disk, so it waits too */
    char text[512];
    request_text(f, text, sizeof(text), "GET", "/v1/pool", NULL, NULL);
    int fd2 = lc_connect(f->port);
    assert_true(fd2 >= 0);
    assert_int_equal(lc_send(fd2, text, strlen(text)), 0);
    struct lc_answer *a2 = calloc(1, sizeof(*a2));
    assert_non_null(a2);
    for (int i = 0; i < 1000; i++) {
        event_base_loop(base_of(f), EVLOOP_NONBLOCK);
        lc_read_now(fd2, a2);
    }
    assert_int_equal(a2->len, 0);
    fake_core_commit(f->c); /* the writer's commit: the durable hook sends both */
    assert_true(lc_wait_closed(base_of(f), fd, f->ans, LOOP_TURNS_MAX));
    assert_true(lc_wait_closed(base_of(f), fd2, a2, LOOP_TURNS_MAX));
    assert_int_equal(lc_status(f->ans), 201);
    json_t *b = json_loads(lc_body(f->ans), 0, NULL);
    assert_string_equal(json_string_value(json_object_get(b, "id")), "held");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(b, "decision"), "outcome")), "started");
    json_decref(b);
    assert_int_equal(lc_status(a2), 200);
    assert_non_null(strstr(lc_body(a2), "\"granted_mib\":1000"));
    free(a2);
    close(fd);
    close(fd2);
}

/* The disk filled while a reply waited: it goes out at once as 503 not_durable; and while it
 * stays full, changes are refused with 507 (nothing applied). */
static void test_disk_full(void **state)
{
    struct fixture *f = *state;
    char err[300] = "";
    assert_int_equal(osubd_core_start(f->c, err, sizeof(err)), 0);
    int fd = send_held(f, "late");
    fake_core_set_full(f->c, true);
    assert_true(lc_wait_closed(base_of(f), fd, f->ans, LOOP_TURNS_MAX));
    close(fd);
    assert_int_equal(lc_status(f->ans), 503);
    assert_non_null(strstr(f->ans->buf, "Retry-After: 5"));
    assert_non_null(strstr(lc_body(f->ans), "not_durable"));
    size_t cmds = fake_core_n_cmds(f->c);
    assert_int_equal(ask(f, "POST", "/v1/services", JSON_CT,
                         "{\"id\":\"more\",\"class\":\"batch\",\"vram_mib\":1000}"),
                     507);
    assert_string_equal(error_code(f), "insufficient_storage");
    assert_int_equal(fake_core_n_cmds(f->c), cmds);
    assert_int_equal(ask(f, "GET", "/v1/pool", NULL, NULL), 200); /* reads go on */
    fake_core_set_full(f->c, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_browser_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reply_held_until_durable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disk_full, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
