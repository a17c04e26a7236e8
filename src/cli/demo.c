/* demo.c - oversub demo: without --url, starts its own oversubd (a simulated 8 x 81920 MiB
 * pool at ratio 1.5, in a temporary folder, on a port the OS picks), runs DESIGN.md's worked
 * scenario through the control API and narrates every decision in the daemon's own words.
 * The user's state is never touched. */
#define _GNU_SOURCE
#include "demo.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "http.h"

static struct http_target tgt;
static long long since_seq;
static int pace_ms;
static bool failed;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One request; NULL (with a message) when the daemon cannot be reached. */
static json_t *req(const char *method, const char *path, const char *body, int *status)
{
    struct http_resp r;
    char err[400];
    if (http_request(&tgt, method, path, body, &r, err, sizeof(err)) != 0) {
        fprintf(stderr, "oversub demo: %s\n", err);
        failed = true;
        *status = 0;
        return NULL;
    }
    *status = r.status;
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    http_resp_free(&r);
    return j;
}

/* Prints the events since the last call, waiting up to wait_s for the first one. */
static void narrate(int wait_s)
{
    char path[96];
    snprintf(path, sizeof(path), "/v1/events?since=%lld&wait=%d", since_seq, wait_s);
    int st;
    json_t *j = req("GET", path, NULL, &st);
    json_t *evs = json_object_get(j, "events");
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e)
    {
        printf("    [%s] %s\n", json_string_value(json_object_get(e, "kind")),
               json_string_value(json_object_get(e, "message")));
    }
    json_t *next = json_object_get(j, "next");
    if (json_is_integer(next))
        since_seq = json_integer_value(next);
    json_decref(j);
}

static void pool_line(void)
{
    int st;
    json_t *p = req("GET", "/v1/pool", NULL, &st);
    json_t *u = json_object_get(p, "utilization");
    json_t *t = json_object_get(p, "totals");
    printf("  pool: held %lld of %lld MiB (%.1f%%), logical %lld of %lld MiB (%.1f%%)\n",
           (long long)json_integer_value(json_object_get(t, "held_mib")),
           (long long)json_integer_value(json_object_get(t, "vram_mib")),
           100.0 * json_real_value(json_object_get(u, "held")),
           (long long)json_integer_value(json_object_get(t, "granted_mib")),
           (long long)json_integer_value(json_object_get(t, "logical_mib")),
           100.0 * json_real_value(json_object_get(u, "logical")));
    json_decref(p);
}

static void step(const char *title)
{
    if (pace_ms > 0)
        sleep_ms(pace_ms);
    printf("\n%s\n", title);
}

/* Submits a service and says what the daemon decided. Returns the HTTP status. */
static int submit(const char *spec)
{
    int st;
    json_t *j = req("POST", "/v1/services", spec, &st);
    json_t *in = json_loads(spec, 0, NULL);
    const char *id = json_string_value(json_object_get(in, "id"));
    const char *outcome =
        json_string_value(json_object_get(json_object_get(j, "decision"), "outcome"));
    printf("  submit %s -> %d %s\n", id ? id : "?", st, outcome ? outcome : "");
    json_decref(in);
    json_decref(j);
    narrate(0);
    return st;
}

static void post(const char *method, const char *path, const char *body)
{
    int st;
    json_t *j = req(method, path, body, &st);
    if (st >= 300) {
        fprintf(stderr, "oversub demo: %s %s answered %d\n", method, path, st);
        failed = true;
    }
    json_decref(j);
}

static const char *state_of(const char *id, char *buf, size_t len)
{
    char path[128];
    snprintf(path, sizeof(path), "/v1/services/%s", id);
    int st;
    json_t *j = req("GET", path, NULL, &st);
    const char *s = json_string_value(json_object_get(j, "state"));
    snprintf(buf, len, "%s", s != NULL ? s : "gone");
    json_decref(j);
    return buf;
}

static void expect(bool ok, const char *what)
{
    if (!ok) {
        printf("  !! unexpected: %s\n", what);
        failed = true;
    }
}

static void run_scenario(void)
{
    int st;
    json_t *h = req("GET", "/healthz", NULL, &st);
    json_decref(h);
    if (st != 200)
        return;
    char b1[32], b2[32];
    step("Step 1: four services arrive (DESIGN.md's worked scenario; pool 8 x 80 GiB, ratio "
         "1.5)");
    expect(submit("{\"id\":\"agent-online\",\"class\":\"online\",\"vram\":\"160GiB\",\"gpus\":2,"
                  "\"compute_pct\":100}") == 201,
           "agent-online not started");
    expect(submit("{\"id\":\"batch-analysis\",\"class\":\"batch\",\"vram\":\"120GiB\",\"gpus\":2,"
                  "\"min_vram\":\"60GiB\"}") == 201,
           "batch-analysis not started");
    expect(submit("{\"id\":\"model-eval\",\"class\":\"experiment\",\"vram\":\"100GiB\",\"gpus\":"
                  "2,\"min_vram\":\"40GiB\"}") == 201,
           "model-eval not started");
    expect(submit("{\"id\":\"new-service\",\"class\":\"batch\",\"vram\":\"80GiB\",\"gpus\":1}") ==
               201,
           "new-service not started");
    pool_line();
    printf("  (a fixed reservation would have needed 560 GiB of 640; oversub grants it "
           "against 960 GiB of logical capacity)\n");

    step("Step 2: all report ready, then what they really use");
    const char *ids[] = {"agent-online", "batch-analysis", "model-eval", "new-service"};
    for (int i = 0; i < 4; i++) {
        char path[128];
        snprintf(path, sizeof(path), "/v1/services/%s/ready", ids[i]);
        post("POST", path, NULL);
    }
    narrate(0);
    post("PUT", "/v1/services/batch-analysis/usage", "{\"vram_mib\":114688}");
    post("PUT", "/v1/services/model-eval/usage", "{\"vram_mib\":90112}");
    post("PUT", "/v1/services/new-service/usage", "{\"vram_mib\":61440}");
    printf("  usage reports: batch-analysis 2 x 56 GiB, model-eval 2 x 44 GiB, new-service 60 "
           "GiB\n");
    narrate(0);
    pool_line();

    step("Step 3: two online chat services fit on the free GPU");
    expect(submit("{\"id\":\"chat-1\",\"class\":\"online\",\"vram\":\"40GiB\"}") == 201,
           "chat-1 not started");
    expect(submit("{\"id\":\"chat-2\",\"class\":\"online\",\"vram\":\"40GiB\"}") == 201,
           "chat-2 not started");
    pool_line();

    step("Step 4: a third chat service: no GPU has room, so the least disruptive plan degrades "
         "the experiment");
    expect(submit("{\"id\":\"chat-3\",\"class\":\"online\",\"vram\":\"40GiB\"}") == 202,
           "chat-3 not pending");
    printf("  chat-3 is %s; model-eval is %s: it shrinks, checkpoints, and acknowledges\n",
           state_of("chat-3", b1, sizeof(b1)), state_of("model-eval", b2, sizeof(b2)));
    post("POST", "/v1/services/model-eval/ack", "{\"checkpoint\":\"step-1200\"}");
    post("PUT", "/v1/services/model-eval/usage", "{\"vram_mib\":40960}");
    narrate(3);
    for (int i = 0; i < 30 && strcmp(state_of("chat-3", b1, sizeof(b1)), "pending") == 0; i++) {
        sleep_ms(100);
        narrate(0);
    }
    narrate(0);
    printf("  chat-3 is %s; model-eval is %s\n", state_of("chat-3", b1, sizeof(b1)),
           state_of("model-eval", b2, sizeof(b2)));
    expect(strcmp(b1, "pending") != 0 && strcmp(b1, "gone") != 0, "chat-3 did not start");
    pool_line();

    step("Step 5: the batch job finishes and leaves");
    post("DELETE", "/v1/services/batch-analysis", NULL);
    narrate(1);
    pool_line();
}

/* The folder this program is in ("" when /proc does not say). */
static void exe_dir(char *out, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", out, len - 1);
    out[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(out, '/');
    if (slash != NULL)
        *slash = '\0';
}

/* An example service next to this program (build/examples/NAME), or "" */
static void example_path(const char *name, char *out, size_t len)
{
    char dir[PATH_MAX];
    exe_dir(dir, sizeof(dir));
    out[0] = '\0';
    if (strlen(dir) + strlen(name) + 11 < len) {
        snprintf(out, len, "%.*s/examples/%s", (int)(len - 12 - strlen(name)), dir, name);
        if (access(out, X_OK) != 0)
            out[0] = '\0';
    }
}

/* Step 6: a real process. A managed batch-job checkpoints after each unit; its GPU is drained
 * for maintenance, so it is evicted: SIGTERM, it finishes its unit, reports its checkpoint and
 * exits; it waits in the queue and comes back from its checkpoint; it ends with exactly the
 * total of a run that was never stopped. */
static void run_managed(const char *dir)
{
    char job[PATH_MAX], spec[PATH_MAX * 2 + 300], result[PATH_MAX + 16], b1[32];
    example_path("batch-job", job, sizeof(job));
    if (job[0] == '\0') {
        printf("\n(step 6 skipped: build/examples/batch-job is not next to this program)\n");
        return;
    }
    step("Step 6: a real process: a managed batch job is evicted, checkpoints, and resumes");
    snprintf(result, sizeof(result), "%s/result", dir);
    snprintf(spec, sizeof(spec),
             "{\"id\":\"nightly\",\"class\":\"batch\",\"vram\":\"30GiB\",\"resumable\":true,"
             "\"command\":[\"%s\",\"--units\",\"30\",\"--unit-ms\",\"100\",\"--result\",\"%s\"]}",
             job, result);
    expect(submit(spec) == 201, "nightly not started");
    sleep_ms(1200);
    narrate(0);
    int st;
    json_t *j = req("GET", "/v1/services/nightly", NULL, &st);
    int gpu = (int)json_integer_value(
        json_object_get(json_array_get(json_object_get(j, "placement"), 0), "gpu"));
    json_decref(j);
    char path[96];
    printf("  GPU %d goes into maintenance: cordoned and drained\n", gpu);
    snprintf(path, sizeof(path), "/v1/gpus/%d/cordon", gpu);
    post("POST", path, NULL);
    snprintf(path, sizeof(path), "/v1/gpus/%d/drain", gpu);
    post("POST", path, NULL);
    for (int i = 0; i < 50 && strcmp(state_of("nightly", b1, sizeof(b1)), "draining") == 0; i++)
        sleep_ms(100);
    narrate(1);
    snprintf(path, sizeof(path), "/v1/gpus/%d/uncordon", gpu);
    post("POST", path, NULL);
    printf("  GPU %d is back\n", gpu);
    for (int i = 0; i < 100 && access(result, F_OK) != 0; i++) {
        sleep_ms(100);
        narrate(0);
    }
    narrate(1);
    FILE *f = fopen(result, "r");
    char line[128] = "";
    if (f != NULL) {
        if (fgets(line, sizeof(line), f) == NULL)
            line[0] = '\0';
        fclose(f);
    }
    line[strcspn(line, "\n")] = '\0';
    printf("  the job's result: %s (every unit exactly once: 30 x 31 / 2 = 465)\n",
           line[0] ? line : "(none)");
    expect(strcmp(line, "total=465 units=30") == 0, "the job's total is not 465");
}

/* Starts oversubd in dir; fills tgt. Returns its pid, or -1. */
static pid_t start_daemon(const char *dir)
{
    char exe[PATH_MAX], bin[PATH_MAX + 16];
    const char *env = getenv("OVERSUBD");
    if (env != NULL) {
        snprintf(bin, sizeof(bin), "%s", env);
    } else {
        exe_dir(exe, sizeof(exe));
        snprintf(bin, sizeof(bin), "%s/oversubd", exe);
        if (access(bin, X_OK) != 0)
            snprintf(bin, sizeof(bin), "oversubd");
    }
    int out[2];
    if (pipe(out) != 0)
        return -1;
    char state[PATH_MAX], log[PATH_MAX], sock[PATH_MAX], conf[PATH_MAX];
    snprintf(state, sizeof(state), "%s/state.db", dir);
    snprintf(log, sizeof(log), "%s/oversubd.log", dir);
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    snprintf(conf, sizeof(conf), "%s/oversubd.yaml", dir);
    FILE *cf = fopen(conf, "w");
    if (cf == NULL)
        return -1;
    /* the demo's own daemon runs the example job; as root it may (a daemon of yours should
     * give services a user instead) */
    fprintf(cf, "allow_root_services: %s\n", geteuid() == 0 ? "true" : "false");
    fclose(cf);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(out[1], 1);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0)
            dup2(fd, 2);
        close(out[0]);
        execlp(bin, bin, "--config", conf, "--listen", "127.0.0.1:0", "--socket", sock, "--state",
               state, "--gpus", "sim:8x81920", "--ratio", "1.5", "--tick-ms", "100", (char *)NULL);
        fprintf(stderr, "cannot run %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    close(out[1]);
    char buf[512];
    size_t len = 0;
    int port = 0;
    for (int waited = 0; waited < 10000 && port == 0;) {
        struct pollfd p = {out[0], POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) {
            waited += 100;
            if (waitpid(pid, NULL, WNOHANG) == pid)
                break;
            continue;
        }
        ssize_t n = read(out[0], buf + len, sizeof(buf) - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
        char *at = strstr(buf, "http://127.0.0.1:");
        if (at != NULL && strchr(at, '\n') != NULL)
            port = atoi(at + 17);
    }
    close(out[0]);
    if (port == 0) {
        fprintf(stderr, "oversub demo: %s did not start; its log:\n", bin);
        FILE *f = fopen(log, "r");
        char line[512];
        while (f != NULL && fgets(line, sizeof(line), f))
            fprintf(stderr, "  %s", line);
        if (f)
            fclose(f);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    memset(&tgt, 0, sizeof(tgt));
    snprintf(tgt.host, sizeof(tgt.host), "127.0.0.1");
    tgt.port = port;
    if (strlen(sock) < sizeof(tgt.unix_path)) /* trusted to run the job */
        memcpy(tgt.unix_path, sock, strlen(sock) + 1);
    printf("oversub demo: started %s on http://127.0.0.1:%d with its state in %s (a simulated "
           "8 x 81920 MiB pool, ratio 1.5)\n",
           bin, port, dir);
    return pid;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void rm_dir(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void cli_demo_usage(FILE *f)
{
    fprintf(f, "usage: oversub demo [--url URL] [--pace MS] [--keep]\n"
               "\n"
               "Runs DESIGN.md's worked scenario and narrates each decision, then (on its own\n"
               "daemon) evicts and resumes a real checkpointed batch job. Without --url it\n"
               "starts its own oversubd (simulated 8 x 81920 MiB, ratio 1.5; next to oversub,\n"
               "or $OVERSUBD) in a temporary folder and never touches your state. Exit 0 when\n"
               "the scenario went as DESIGN.md says, 1 when not, 3 when no daemon could be\n"
               "started or reached. No --json: it is a narration.\n"
               "\n"
               "Options:\n"
               "  --url URL                  run against that daemon (a fresh one: the scenario's\n"
               "                             ids must be free)\n"
               "  --pace MS                  wait MS between steps (0)\n"
               "  --keep                     leave the temporary folder (state and log)\n"
               "  -h, --help                 this\n"
               "\n"
               "Example:\n"
               "  oversub demo --pace 1500\n");
}

int cli_demo(int argc, char **argv)
{
    const char *url = NULL;
    bool keep = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--url") == 0 && i + 1 < argc) {
            url = argv[++i];
        } else if (strncmp(argv[i], "--url=", 6) == 0) {
            url = argv[i] + 6;
        } else if (strcmp(argv[i], "--pace") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 0 || v > 60000) {
                fprintf(stderr, "oversub demo: --pace: milliseconds, 0 to 60000\n");
                return 2;
            }
            pace_ms = (int)v;
        } else if (strcmp(argv[i], "--keep") == 0) {
            keep = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            cli_demo_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "oversub demo: unknown argument '%s'\n\n", argv[i]);
            cli_demo_usage(stderr);
            return 2;
        }
    }
    pid_t pid = -1;
    /* its folder under $TMPDIR (else /tmp), as other programs make theirs */
    char dir[512];
    const char *td = getenv("TMPDIR");
    if (td == NULL || td[0] != '/' || strlen(td) > 60) /* its socket lives in there */
        td = "/tmp";
    snprintf(dir, sizeof(dir), "%s/oversub-demo.XXXXXX", td);
    if (url != NULL) {
        char err[300];
        if (http_target_init(&tgt, url, err, sizeof(err)) != 0) {
            fprintf(stderr, "oversub demo: --url: %s\n", err);
            return 2;
        }
    } else {
        if (mkdtemp(dir) == NULL) {
            fprintf(stderr, "oversub demo: cannot make a temporary folder: %s\n", strerror(errno));
            return 3;
        }
        pid = start_daemon(dir);
        if (pid < 0) {
            rm_dir(dir);
            return 3;
        }
    }
    run_scenario();
    if (!failed && pid > 0)
        run_managed(dir);
    bool unreachable = failed && since_seq == 0;
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        if (keep)
            printf("\nthe demo's state and log are in %s\n", dir);
        else
            rm_dir(dir);
    }
    if (unreachable)
        return 3;
    printf("\n%s\n", failed ? "oversub demo: the scenario did not go as DESIGN.md says (see "
                              "above)"
                            : "oversub demo: done; every decision above is in the event log "
                              "(oversub events) of a daemon you run with 'make run'");
    return failed ? 1 : 0;
}
