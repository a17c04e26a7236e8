/* test_suspender.c - the suspend mechanisms (src/daemon/suspender.c, sus_cuda.c) without a
 * daemon: the specs; the cuda method against the fake driver (tests/fakes/fake_cuda.c) with a
 * forked CUDA target whose bytes are checked after the resume, and the driver's documented
 * failures; the HTTP methods (vllm, sglang, http) against a loopback server in this process that
 * records what it is asked and answers as told.
 * usage: test_suspender FAKE_LIBCUDA FAKE_LIBCUDA_WITHOUT_THE_API */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "cuda_ckpt_abi.h"
#include "spec_json.h"
#include "netpolicy.h"
#include "suspender.h"

static const char *fake_lib, *old_lib; /* argv */

#define MIB (1ull << 20)
#define TARGET_MIB 256
#define PATTERN_BYTES 65536
#define WAIT_MS 20000

/* ---- the loop and what the suspender reported ------------------------------------------------ */

struct seen {
    int n;
    char id[80];
    bool resume, ok;
    char why[800];
};

static void on_done(void *arg, const char *id, bool resume, bool ok, const char *why)
{
    struct seen *s = arg;
    s->n++;
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->resume = resume;
    s->ok = ok;
    snprintf(s->why, sizeof(s->why), "%s", why != NULL ? why : "");
}

/* runs the loop until the n-th report (or WAIT_MS) */
static void wait_report(struct event_base *b, struct seen *s, int n)
{
    for (int i = 0; i < WAIT_MS / 10 && s->n < n; i++) {
        struct timeval tv = {0, 10000};
        event_base_loopexit(b, &tv);
        event_base_dispatch(b);
    }
    if (s->n < n)
        fail_msg("no report %d within %d ms", n, WAIT_MS);
}

/* ---- the specs ------------------------------------------------------------------------------- */

static void test_parse(void **state)
{
    (void)state;
    struct osubd_destinations *dest = NULL;
    char err[500] = "";
    assert_int_equal(osubd_parse_destinations("", &dest, err, sizeof(err)), 0);
    static const struct {
        const char *in, *out; /* out NULL: refused, with a sentence holding err */
        const char *err;
    } cases[] = {
        {"{\"method\":\"cuda\"}", "{\"method\": \"cuda\"}", NULL},
        {"{\"method\":\"vllm\",\"url\":\"http://127.0.0.1:8000/\"}",
         "{\"method\": \"vllm\", \"url\": \"http://127.0.0.1:8000\"}", NULL},
        {"{\"method\":\"sglang\",\"url\":\"http://localhost:30000/api\"}",
         "{\"method\": \"sglang\", \"url\": \"http://localhost:30000/api\"}", NULL},
        {"{\"method\":\"http\",\"url\":\"http://[::1]:9\",\"suspend\":\"/s\",\"resume\":\"/"
         "r?x=1\"}",
         "{\"method\": \"http\", \"url\": \"http://[::1]:9\", \"suspend\": \"/s\", \"resume\": "
         "\"/r?x=1\"}",
         NULL},
        {"{\"method\":\"cuda\",\"relocate\":true}", "{\"method\": \"cuda\"}", NULL},
        {"{\"method\":\"vllm\",\"url\":\"http://127.0.0.1:1\",\"relocate\":true}", NULL,
         "'suspend.relocate' is not a field of method vllm"},
        {"\"cuda\"", NULL, "field 'suspend' must be an object"},
        {"{}", NULL, "'suspend.method' must be cuda, vllm, sglang or http"},
        {"{\"method\":\"criu\"}", NULL, "'suspend.method' must be"},
        {"{\"method\":7}", NULL, "'suspend.method' must be"},
        {"{\"method\":\"cuda\",\"url\":\"http://127.0.0.1:1\"}", NULL,
         "'suspend.url' is not a field of method cuda"},
        {"{\"method\":\"vllm\",\"url\":\"http://127.0.0.1:1\",\"level\":2}", NULL,
         "'suspend.level' is not a field of method vllm"},
        {"{\"method\":\"vllm\"}", NULL, "'suspend.url' must be an http://HOST:PORT"},
        {"{\"method\":\"vllm\",\"url\":\"https://127.0.0.1:1\"}", NULL, "'suspend.url' must be"},
        {"{\"method\":\"vllm\",\"url\":\"http://127.0.0.1\"}", NULL, "'suspend.url' must be"},
        {"{\"method\":\"vllm\",\"url\":\"http://127.0.0.1:1/?a=b\"}", NULL, "'suspend.url' must"},
        {"{\"method\":\"vllm\",\"url\":\"http://169.254.169.254:80\"}", NULL,
         "field 'suspend.url': "},
        {"{\"method\":\"http\",\"url\":\"http://127.0.0.1:1\",\"suspend\":\"/s\"}", NULL,
         "method http needs 'suspend.suspend' and 'suspend.resume'"},
        {"{\"method\":\"http\",\"url\":\"http://127.0.0.1:1\",\"suspend\":\"s\",\"resume\":\"/r\"}",
         NULL, "method http needs"},
        {"{\"method\":\"http\",\"url\":\"http://127.0.0.1:1\",\"suspend\":\"/a "
         "b\",\"resume\":\"/r\"}",
         NULL, "method http needs"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *v = json_loads(cases[i].in, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        struct osubd_sus_spec sp;
        err[0] = '\0';
        int rc = osubd_sus_parse(v, dest, &sp, err, sizeof(err));
        if (cases[i].out == NULL) {
            if (rc != -1 || strstr(err, cases[i].err) == NULL)
                fail_msg("case %zu (%s): rc %d, '%s'", i, cases[i].in, rc, err);
        } else {
            if (rc != 0)
                fail_msg("case %zu (%s): %s", i, cases[i].in, err);
            json_t *o = osubd_sus_spec_json(&sp);
            char *t = json_dumps(o, JSON_SORT_KEYS * 0);
            json_t *want = json_loads(cases[i].out, 0, NULL);
            if (!json_equal(o, want))
                fail_msg("case %zu: %s, wanted %s", i, t, cases[i].out);
            /* what is shown reads back as the same spec */
            struct osubd_sus_spec again;
            assert_int_equal(osubd_sus_parse(o, NULL, &again, err, sizeof(err)), 0);
            assert_memory_equal(&sp, &again, sizeof(sp));
            free(t);
            json_decref(want);
            json_decref(o);
        }
        json_decref(v);
    }
    osubd_destinations_free(dest);
}

/* ---- the cuda method against the fake driver ------------------------------------------------- */

struct target {
    pid_t pid;
    int cmd, ans;
};

static int read_byte(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    unsigned char c;
    if (poll(&p, 1, WAIT_MS) != 1 || read(fd, &c, 1) != 1)
        return -1;
    return c;
}

static unsigned char pattern(size_t i)
{
    return (unsigned char)(i * 29 + 3);
}

/* The target: a CUDA program (the fake driver, loaded as a program would) holding TARGET_MIB
 * with a pattern; 'r' once ready; on 'v' it reads its bytes back and answers 'o' (intact) or
 * 'x'; on EOF it exits. knob: a FAKE_CUDA_CKPT_* setting (NAME=VALUE) or NULL. */
static void target_main(int cmd, int ans, const char *knob)
{
    if (knob != NULL)
        putenv((char *)knob);
    void *dl = dlopen(fake_lib, RTLD_NOW | RTLD_LOCAL);
    CUresult (*init)(unsigned) = NULL, (*dev)(CUdevice *, int) = NULL;
    CUresult (*ctx)(CUcontext *, unsigned, CUdevice) = NULL, (*alloc)(CUdeviceptr *, size_t) = NULL;
    CUresult (*htod)(CUdeviceptr, const void *, size_t) = NULL;
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) = NULL;
    if (dl == NULL)
        _exit(10);
    *(void **)&init = dlsym(dl, "cuInit");
    *(void **)&dev = dlsym(dl, "cuDeviceGet");
    *(void **)&ctx = dlsym(dl, "cuCtxCreate_v2");
    *(void **)&alloc = dlsym(dl, "cuMemAlloc_v2");
    *(void **)&htod = dlsym(dl, "cuMemcpyHtoD_v2");
    *(void **)&dtoh = dlsym(dl, "cuMemcpyDtoH_v2");
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    static unsigned char buf[PATTERN_BYTES], back[PATTERN_BYTES];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = pattern(i);
    if (init(0) != 0 || dev(&d, 0) != 0 || ctx(&c, 0, d) != 0 || alloc(&p, TARGET_MIB * MIB) != 0 ||
        htod(p, buf, sizeof(buf)) != 0)
        _exit(11);
    char b = 'r';
    if (write(ans, &b, 1) != 1)
        _exit(12);
    for (;;) {
        int k = read_byte(cmd);
        if (k < 0)
            _exit(0);
        if (k == 'v') {
            b = dtoh(back, p, sizeof(back)) == 0 && memcmp(back, buf, sizeof(buf)) == 0 ? 'o' : 'x';
            if (write(ans, &b, 1) != 1)
                _exit(13);
        }
    }
}

static const char *self_exe;

/* The target is a program of its own (this one, run again with --target), as a service is: the
 * fake driver is loaded in it fresh, never inherited through a fork. */
static struct target target_start(const char *knob)
{
    int c[2], a[2];
    assert_int_equal(pipe(c), 0);
    assert_int_equal(pipe(a), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (dup2(c[0], 3) < 0 || dup2(a[1], 4) < 0)
            _exit(9);
        execl(self_exe, self_exe, "--target", fake_lib, knob != NULL ? knob : "-", (char *)NULL);
        _exit(8);
    }
    close(c[0]);
    close(a[1]);
    struct target t = {pid, c[1], a[0]};
    int r = read_byte(t.ans);
    if (r != 'r')
        fail_msg("the target did not start (%d)", r);
    return t;
}

static void target_stop(struct target *t)
{
    close(t->cmd);
    close(t->ans);
    kill(t->pid, SIGKILL);
    waitpid(t->pid, NULL, 0);
}

static char verify(struct target *t)
{
    char v = 'v';
    assert_int_equal(write(t->cmd, &v, 1), 1);
    return (char)read_byte(t->ans);
}

/* the fake's device dev in use (its test helper, in this process's copy of the fake) */
static unsigned long long dev_used_on(int dev)
{
    void *dl = dlopen(fake_lib, RTLD_NOW | RTLD_LOCAL);
    int (*stats)(int, unsigned long long *, unsigned long long *) = NULL;
    *(void **)&stats = dlsym(dl, "fakecuda_stats");
    unsigned long long used = 0, peak = 0;
    assert_non_null(stats);
    assert_int_equal(stats(dev, &used, &peak), 0);
    dlclose(dl);
    return used;
}

static unsigned long long dev_used(void)
{
    return dev_used_on(0);
}

static int proc_state(pid_t pid)
{
    void *dl = dlopen(fake_lib, RTLD_NOW | RTLD_LOCAL);
    osub_cu_ckpt_state_fn st = NULL;
    *(void **)&st = dlsym(dl, "cuCheckpointProcessGetState");
    CUprocessState s = CU_PROCESS_STATE_FAILED;
    int rc = st != NULL ? st((int)pid, &s) : -1;
    dlclose(dl);
    return rc == 0 ? (int)s : -rc;
}

struct fixture {
    struct event_base *b;
    struct osubd_sus *s;
    struct seen seen;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    f->b = event_base_new();
    f->s = osubd_sus_new(f->b, fake_lib, on_done, &f->seen);
    assert_non_null(f->s);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    osubd_sus_free(f->s);
    event_base_free(f->b);
    free(f);
    return 0;
}

static const struct osubd_sus_spec cuda_spec = {.method = OSUBD_SUS_CUDA};

static void run_op(struct fixture *f, const char *id, bool resume, const pid_t *pids, int n,
                   int timeout_ms)
{
    char err[500] = "";
    int before = f->seen.n;
    if (osubd_sus_start(f->s, id, resume, &cuda_spec, pids, n, timeout_ms, err, sizeof(err)) != 0)
        fail_msg("start: %s", err);
    assert_true(osubd_sus_busy(f->s, id));
    assert_int_equal(f->seen.n, before); /* never reported from within the start */
    wait_report(f->b, &f->seen, before + 1);
    assert_false(osubd_sus_busy(f->s, id));
    assert_string_equal(f->seen.id, id);
    assert_int_equal(f->seen.resume, resume);
}

static void test_cuda_suspend_resume(void **state)
{
    struct fixture *f = *state;
    char why[300];
    assert_true(osubd_sus_cuda_ok(f->s, why, sizeof(why)));
    struct target t = target_start(NULL);
    /* a process without CUDA beside it (the service's shell, say): passed over */
    pid_t plain = fork();
    if (plain == 0) {
        pause();
        _exit(0);
    }
    pid_t pids[2] = {plain, t.pid};
    assert_int_equal(dev_used(), TARGET_MIB * MIB);
    run_op(f, "job", false, pids, 2, 10000);
    if (!f->seen.ok)
        fail_msg("suspend failed: %s", f->seen.why);
    assert_int_equal(proc_state(t.pid), CU_PROCESS_STATE_CHECKPOINTED);
    assert_int_equal(dev_used(), 0); /* its memory left the device */
    char err[300];
    assert_int_equal(
        osubd_sus_start(f->s, "job", false, &cuda_spec, pids, 2, 1000, err, sizeof(err)),
        0); /* checkpointed already: nothing to do, done */
    wait_report(f->b, &f->seen, f->seen.n + 1);
    assert_true(f->seen.ok);
    run_op(f, "job", true, pids, 2, 10000);
    if (!f->seen.ok)
        fail_msg("resume failed: %s", f->seen.why);
    assert_int_equal(proc_state(t.pid), CU_PROCESS_STATE_RUNNING); /* restored and unlocked */
    assert_int_equal(dev_used(), TARGET_MIB * MIB);
    assert_int_equal(verify(&t), 'o'); /* the same bytes at the same address, and it runs */
    kill(plain, SIGKILL);
    waitpid(plain, NULL, 0);
    target_stop(&t);
}

/* the fake's two devices, as NVML would name them (main() gives the fake these UUIDs) */
#define UUID0 "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb"
#define UUID1 "GPU-5449fdd5-fb83-f4ed-37a3-ea1057d82160"

/* Relocate: a checkpoint restored onto the other GPU by the driver's remap (CUDA 13.0): its
 * memory leaves device 0 and lands on device 1, the same bytes at the same address, and it
 * runs on. A process that sees only some GPUs (CUDA_VISIBLE_DEVICES a subset) cannot be
 * remapped (the driver answers invalid value, cuda-python#1983): the resume fails, it stays
 * checkpointed, and a plain restore still brings it back where it was. */
static void test_cuda_resume_onto_another_gpu(void **state)
{
    struct fixture *f = *state;
    char why[300];
    assert_true(osubd_sus_cuda_remap_ok(f->s, why, sizeof(why)));
    struct osubd_sus_spec sp = cuda_spec;
    const char *u[2] = {UUID0, UUID1};
    for (int g = 0; g < 2; g++) {
        assert_int_equal(osubd_sus_uuid_bytes(u[g], sp.remap[g][0]), 0);
        assert_int_equal(osubd_sus_uuid_bytes(u[1 - g], sp.remap[g][1]), 0);
    }
    sp.n_remap = 2;
    unsigned char junk[16];
    assert_int_equal(osubd_sus_uuid_bytes("GPU-8f4022ba", junk), -1);
    assert_int_equal(osubd_sus_uuid_bytes("GPU-8f4022ba-e0cb-1298-286e-225c953a7feg", junk), -1);

    struct target t = target_start(NULL);
    assert_int_equal(dev_used_on(0), TARGET_MIB * MIB);
    assert_int_equal(dev_used_on(1), 0);
    run_op(f, "job", false, &t.pid, 1, 10000);
    assert_true(f->seen.ok);
    assert_int_equal(dev_used_on(0), 0);
    char err[300];
    int before = f->seen.n;
    assert_int_equal(osubd_sus_start(f->s, "job", true, &sp, &t.pid, 1, 10000, err, sizeof(err)),
                     0);
    wait_report(f->b, &f->seen, before + 1);
    if (!f->seen.ok)
        fail_msg("the remapping resume failed: %s", f->seen.why);
    assert_int_equal(proc_state(t.pid), CU_PROCESS_STATE_RUNNING);
    assert_int_equal(dev_used_on(0), 0);
    assert_int_equal(dev_used_on(1), TARGET_MIB * MIB);
    assert_int_equal(verify(&t), 'o');
    target_stop(&t);

    struct target sub = target_start("CUDA_VISIBLE_DEVICES=" UUID0);
    run_op(f, "sub", false, &sub.pid, 1, 10000);
    assert_true(f->seen.ok);
    before = f->seen.n;
    assert_int_equal(osubd_sus_start(f->s, "sub", true, &sp, &sub.pid, 1, 10000, err, sizeof(err)),
                     0);
    wait_report(f->b, &f->seen, before + 1);
    assert_false(f->seen.ok);
    if (strstr(f->seen.why, "cuCheckpointProcessRestore: CUDA error 1 (invalid value)") == NULL)
        fail_msg("'%s'", f->seen.why);
    assert_int_equal(proc_state(sub.pid), CU_PROCESS_STATE_CHECKPOINTED);
    run_op(f, "sub", true, &sub.pid, 1, 10000);
    assert_true(f->seen.ok);
    assert_int_equal(dev_used_on(0), TARGET_MIB * MIB);
    assert_int_equal(verify(&sub), 'o');
    target_stop(&sub);
}

/* The engine's side of the spec (spec_json.c): relocate is for one GPU and method cuda, a
 * boolean, and kept when the spec is written back */
static void test_relocate_spec(void **state)
{
    (void)state;
    static const struct {
        const char *in, *err; /* err NULL: taken */
    } cases[] = {
        {"{\"id\":\"a\",\"vram_mib\":100,\"suspend\":{\"method\":\"cuda\",\"relocate\":true}}",
         NULL},
        {"{\"id\":\"a\",\"vram_mib\":100,\"gpus\":2,\"suspend\":{\"method\":\"cuda\",\"relocate\":"
         "true}}",
         "field 'suspend.relocate' is for a service of one GPU that is not exclusive"},
        {"{\"id\":\"a\",\"vram_mib\":100,\"suspend\":{\"method\":\"http\",\"relocate\":true}}",
         "field 'suspend.relocate' is for method cuda only"},
        {"{\"id\":\"a\",\"vram_mib\":100,\"suspend\":{\"method\":\"cuda\",\"relocate\":1}}",
         "field 'suspend.relocate' must be true or false"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *v = json_loads(cases[i].in, 0, NULL);
        assert_non_null(v);
        osub_spec_t sp;
        char err[300] = "";
        int rc = osub_spec_from_json(v, &sp, err, sizeof(err));
        if (cases[i].err != NULL && (rc == 0 || strstr(err, cases[i].err) == NULL))
            fail_msg("case %zu: rc %d, '%s'", i, rc, err);
        if (cases[i].err == NULL) {
            if (rc != 0)
                fail_msg("case %zu: %s", i, err);
            assert_true(sp.suspend.relocate);
            json_t *o = osub_spec_to_json(&sp);
            assert_true(json_is_true(json_object_get(json_object_get(o, "suspend"), "relocate")));
            json_decref(o);
        }
        json_decref(v);
    }
}

static void test_cuda_failures(void **state)
{
    struct fixture *f = *state;
    static const struct {
        const char *knob, *want;
    } cases[] = {
        {"FAKE_CUDA_CKPT_EPERM=1", "cuCheckpointProcessLock: CUDA error 800 (not permitted)"},
        {"FAKE_CUDA_CKPT_UNSUPPORTED=1",
         "cuCheckpointProcessCheckpoint: CUDA error 801 (not supported"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct target t = target_start(cases[i].knob);
        run_op(f, "job", false, &t.pid, 1, 10000);
        assert_false(f->seen.ok);
        if (strstr(f->seen.why, cases[i].want) == NULL)
            fail_msg("%s: '%s'", cases[i].knob, f->seen.why);
        /* undone: it runs on, its memory where it was */
        assert_int_equal(proc_state(t.pid), CU_PROCESS_STATE_RUNNING);
        assert_int_equal(dev_used(), TARGET_MIB * MIB);
        assert_int_equal(verify(&t), 'o');
        target_stop(&t);
    }
    /* no process with a CUDA context */
    pid_t plain = fork();
    if (plain == 0) {
        pause();
        _exit(0);
    }
    run_op(f, "plain", false, &plain, 1, 5000);
    assert_false(f->seen.ok);
    assert_string_equal(f->seen.why, "none of its 1 process(es) holds a CUDA context");
    kill(plain, SIGKILL);
    waitpid(plain, NULL, 0);
    /* no process at all, and no second operation for one service at a time */
    char err[300];
    assert_int_equal(
        osubd_sus_start(f->s, "none", false, &cuda_spec, NULL, 0, 1000, err, sizeof(err)), -1);
    assert_string_equal(err, "no process is known to checkpoint (method cuda)");
    /* a restore that fails: said so */
    struct target t = target_start("FAKE_CUDA_CKPT_FAIL=restore");
    run_op(f, "job", false, &t.pid, 1, 10000);
    assert_true(f->seen.ok);
    run_op(f, "job", true, &t.pid, 1, 10000);
    assert_false(f->seen.ok);
    if (strstr(f->seen.why, "cuCheckpointProcessRestore: CUDA error 304") == NULL)
        fail_msg("'%s'", f->seen.why);
    target_stop(&t);
}

/* A lock that never completes (NCCL across processes): the deadline reports it; the worker is
 * left behind at free, never joined (the suspender must not hang the daemon's stop). */
static void test_cuda_hang(void **state)
{
    struct fixture *f = *state;
    struct target t = target_start("FAKE_CUDA_CKPT_HANG=1");
    run_op(f, "job", false, &t.pid, 1, 300);
    assert_false(f->seen.ok);
    assert_string_equal(f->seen.why, "the suspend did not finish within its time (cuda)");
    target_stop(&t);
}

static void test_cuda_old_driver(void **state)
{
    (void)state;
    struct event_base *b = event_base_new();
    struct seen seen = {0};
    struct osubd_sus *s = osubd_sus_new(b, old_lib, on_done, &seen);
    char why[400] = "";
    assert_false(osubd_sus_cuda_ok(s, why, sizeof(why)));
    if (strstr(why, "method cuda cannot be used here: the CUDA driver ") == NULL ||
        strstr(why, "has no process checkpoint API (cuCheckpointProcessLock is missing: "
                    "driver 550 or later is needed)") == NULL)
        fail_msg("'%s'", why);
    pid_t one = 1;
    char err[400];
    assert_int_equal(osubd_sus_start(s, "x", false, &cuda_spec, &one, 1, 100, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "has no process checkpoint API"));
    osubd_sus_free(s);
    s = osubd_sus_new(b, "/nonexistent/libcuda.so.1", on_done, &seen);
    assert_false(osubd_sus_cuda_ok(s, why, sizeof(why)));
    assert_non_null(strstr(why, "method cuda cannot be used here: no CUDA driver ("));
    osubd_sus_free(s);
    event_base_free(b);
    assert_int_equal(seen.n, 0);
}

/* ---- the HTTP methods against a loopback server ---------------------------------------------- */

struct server {
    struct evhttp *http;
    int port;
    char log[2000]; /* "METHOD URI BODY;" for each request */
    /* answers: by path prefix, else 200 "" */
    const char *path[4];
    int code[4]; /* 0: no answer (the request is held) */
    const char *body[4];
};

static void on_request(struct evhttp_request *req, void *arg)
{
    struct server *sv = arg;
    const char *uri = evhttp_request_get_uri(req);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    char body[200] = "";
    evbuffer_copyout(in, body, n < sizeof(body) - 1 ? n : sizeof(body) - 1);
    size_t l = strlen(sv->log);
    snprintf(sv->log + l, sizeof(sv->log) - l, "%s %s %s;",
             evhttp_request_get_command(req) == EVHTTP_REQ_GET ? "GET" : "POST", uri, body);
    for (int i = 0; i < 4 && sv->path[i] != NULL; i++) {
        if (strncmp(uri, sv->path[i], strlen(sv->path[i])) != 0)
            continue;
        if (sv->code[i] == 0)
            return; /* held: never answered */
        struct evbuffer *out = evbuffer_new();
        evbuffer_add_printf(out, "%s", sv->body[i] ? sv->body[i] : "");
        evhttp_send_reply(req, sv->code[i], "X", out);
        evbuffer_free(out);
        return;
    }
    evhttp_send_reply(req, 200, "OK", NULL);
}

static void server_start(struct fixture *f, struct server *sv)
{
    sv->http = evhttp_new(f->b);
    evhttp_set_allowed_methods(sv->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_gencb(sv->http, on_request, sv);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(sv->http, "127.0.0.1", 0);
    assert_non_null(bs);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    assert_int_equal(getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl), 0);
    sv->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* json holds one %d: the server's port */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static struct osubd_sus_spec http_spec(const struct server *sv, const char *json)
{
    char text[600], err[300];
    snprintf(text, sizeof(text), json, sv->port);
#pragma GCC diagnostic pop
    json_t *v = json_loads(text, 0, NULL);
    struct osubd_sus_spec sp;
    if (osubd_sus_parse(v, NULL, &sp, err, sizeof(err)) != 0)
        fail_msg("%s: %s", text, err);
    json_decref(v);
    return sp;
}

static void run_http(struct fixture *f, const struct osubd_sus_spec *sp, bool resume, int ms)
{
    char err[300];
    int before = f->seen.n;
    if (osubd_sus_start(f->s, "svc", resume, sp, NULL, 0, ms, err, sizeof(err)) != 0)
        fail_msg("start: %s", err);
    assert_int_equal(f->seen.n, before);
    wait_report(f->b, &f->seen, before + 1);
}

static void test_vllm(void **state)
{
    struct fixture *f = *state;
    struct server sv = {
        .path = {"/is_sleeping"}, .code = {200}, .body = {"{\"is_sleeping\":true}"}};
    server_start(f, &sv);
    struct osubd_sus_spec sp =
        http_spec(&sv, "{\"method\":\"vllm\",\"url\":\"http://127.0.0.1:%d\"}");
    run_http(f, &sp, false, 5000);
    assert_true(f->seen.ok);
    /* the level in the query string, as vLLM reads it (a JSON body is ignored) */
    assert_string_equal(sv.log, "POST /sleep?level=1&mode=wait ;GET /is_sleeping ;");
    /* the wake: is_sleeping must turn false */
    sv.log[0] = '\0';
    run_http(f, &sp, true, 5000);
    assert_false(f->seen.ok);
    assert_string_equal(sv.log, "POST /wake_up ;GET /is_sleeping ;");
    assert_non_null(strstr(f->seen.why, "GET /is_sleeping answered '{\"is_sleeping\":true}', not "
                                        "{\"is_sleeping\": false}"));
    sv.body[0] = "{\"is_sleeping\":false}";
    run_http(f, &sp, true, 5000);
    assert_true(f->seen.ok);
    /* without VLLM_SERVER_DEV_MODE the routes are not there: 404, said so */
    sv.path[0] = "/sleep";
    sv.code[0] = 404;
    sv.body[0] = "{\"detail\":\"Not Found\"}";
    run_http(f, &sp, false, 5000);
    assert_false(f->seen.ok);
    char want[300];
    snprintf(want, sizeof(want),
             "POST http://127.0.0.1:%d/sleep?level=1&mode=wait answered HTTP 404: "
             "{\"detail\":\"Not Found\"}",
             sv.port);
    assert_string_equal(f->seen.why, want);
    /* a sleep that never answers: the deadline */
    sv.code[0] = 0;
    run_http(f, &sp, false, 300);
    assert_false(f->seen.ok);
    assert_string_equal(f->seen.why, "the suspend did not finish within its time (vllm)");
    evhttp_free(sv.http);
    /* nobody there */
    run_http(f, &sp, false, 5000);
    assert_false(f->seen.ok);
    snprintf(want, sizeof(want),
             "POST http://127.0.0.1:%d/sleep?level=1&mode=wait: no answer (the connection was "
             "refused or closed)",
             sv.port);
    assert_string_equal(f->seen.why, want);
}

static void test_sglang_and_http(void **state)
{
    struct fixture *f = *state;
    struct server sv = {.path = {"/x/release_memory_occupation", "/down"},
                        .code = {400, 503},
                        .body = {"{\"error\":{\"message\":\"busy\"}}", ""}};
    server_start(f, &sv);
    struct osubd_sus_spec sp =
        http_spec(&sv, "{\"method\":\"sglang\",\"url\":\"http://127.0.0.1:%d/x\"}");
    run_http(f, &sp, false, 5000);
    assert_false(f->seen.ok);
    assert_string_equal(sv.log,
                        "POST /x/pause_generation {};POST /x/release_memory_occupation {};");
    assert_non_null(strstr(f->seen.why, "answered HTTP 400: {\"error\":{\"message\":\"busy\"}}"));
    sv.log[0] = '\0';
    sv.code[0] = 200;
    run_http(f, &sp, false, 5000);
    assert_true(f->seen.ok);
    sv.log[0] = '\0';
    run_http(f, &sp, true, 5000);
    assert_true(f->seen.ok);
    assert_string_equal(sv.log,
                        "POST /x/resume_memory_occupation {};POST /x/continue_generation {};");
    /* http: the two paths given */
    sp = http_spec(&sv, "{\"method\":\"http\",\"url\":\"http://127.0.0.1:%d\",\"suspend\":\"/up?"
                        "a=1\",\"resume\":\"/down\"}");
    sv.log[0] = '\0';
    run_http(f, &sp, false, 5000);
    assert_true(f->seen.ok);
    run_http(f, &sp, true, 5000);
    assert_false(f->seen.ok);
    assert_string_equal(sv.log, "POST /up?a=1 {};POST /down {};");
    assert_non_null(strstr(f->seen.why, "/down answered HTTP 503"));
    /* an answer larger than oversubd holds (the URL is the submitter's: anyone's) fails the
     * call instead of filling oversubd's memory */
    static char huge[2 * 1024 * 1024 + 1];
    memset(huge, 'x', sizeof(huge) - 1);
    sv.path[1] = "/up";
    sv.code[1] = 200;
    sv.body[1] = huge;
    run_http(f, &sp, false, 5000);
    assert_false(f->seen.ok);
    assert_non_null(strstr(f->seen.why, "/up?a=1"));
    evhttp_free(sv.http);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_suspender FAKE_LIBCUDA FAKE_LIBCUDA_WITHOUT_THE_API\n");
        return 2;
    }
    if (strcmp(argv[1], "--target") == 0 && argc == 4) {
        fake_lib = argv[2];
        target_main(3, 4, strcmp(argv[3], "-") != 0 ? argv[3] : NULL);
        return 0;
    }
    self_exe = "/proc/self/exe";
    fake_lib = argv[1];
    old_lib = argv[2];
    signal(SIGPIPE, SIG_IGN);
    /* one fake device for the run, shared by this process's copy of the fake and the targets'
     * (the fake reads its settings once per process) */
    char statefile[64];
    snprintf(statefile, sizeof(statefile), "/tmp/test_suspender.XXXXXX");
    int fd = mkstemp(statefile);
    if (fd < 0)
        return 1;
    close(fd);
    setenv("FAKE_CUDA_STATE", statefile, 1);
    setenv("FAKE_CUDA_MEM_MIB", "1024", 1);
    /* two named devices of a CUDA 13.0 driver (a restore may remap), every one visible */
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    setenv("FAKE_CUDA_UUIDS", UUID0 "," UUID1, 1);
    setenv("FAKE_CUDA_DRIVER_VERSION", "13000", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_relocate_spec),
        cmocka_unit_test_setup_teardown(test_cuda_suspend_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cuda_resume_onto_another_gpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cuda_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cuda_hang, setup, teardown),
        cmocka_unit_test(test_cuda_old_driver),
        cmocka_unit_test_setup_teardown(test_vllm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sglang_and_http, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(statefile);
    return rc;
}
