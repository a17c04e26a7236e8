/* test_fake_ckpt.c - the fake driver's process checkpoint API (fake_cuda_ckpt.h) across
 * processes, as oversubd will drive it: a forked target allocates device memory, writes a known
 * pattern and keeps calling CUDA, reporting progress through a pipe; this process (the caller)
 * locks it (its calls stop), checkpoints it (the device count falls, another process can use the
 * memory), restores it (the count back, still locked) and unlocks it (progress resumes, the
 * pattern intact at the same address). Then the documented failures: a lock timeout, wrong
 * states, NOT_SUPPORTED, NOT_PERMITTED, FAILED, a restore without room, a hanging lock, a PID
 * without CUDA, a caller that dies midway, an older driver without the API.
 * Waits are on events (pipes, the fake's counters), each bounded by WAIT_MS so a broken fake
 * fails instead of hanging; only the hang test waits for something not to happen.
 * usage: test_fake_ckpt [PATH_OF_A_FAKE_LIBCUDA_WITHOUT_THE_API] */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "fake_cuda_ckpt.h"

/* the rest of the driver API the target uses (the fake exports them) */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *v);
CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice d);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

#define MIB (1ull << 20)
#define DEV_MIB 1024
#define TARGET_MIB 600
#define PATTERN_BYTES 65536
#define WAIT_MS 20000
#define PROGRESS_ERROR 0xffffffffu

static const char *old_driver; /* argv[1] */

/* ---- children --------------------------------------------------------------------------- */

static pid_t children[16];
static int n_children;

static void close_fds_but(int a, int b, int c)
{
    for (int fd = 3; fd < 1024; fd++)
        if (fd != a && fd != b && fd != c)
            close(fd);
}

static pid_t spawn(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid > 0 && n_children < (int)(sizeof(children) / sizeof(children[0])))
        children[n_children++] = pid;
    return pid;
}

static void reap(pid_t pid)
{
    for (int i = 0; i < n_children; i++) {
        if (children[i] == pid) {
            waitpid(pid, NULL, 0);
            children[i] = children[--n_children];
            return;
        }
    }
}

static void kill_and_reap(pid_t pid)
{
    kill(pid, SIGKILL);
    reap(pid);
}

static int teardown(void **state)
{
    (void)state;
    while (n_children > 0)
        kill_and_reap(children[0]);
    return 0;
}

/* one byte from fd within WAIT_MS, or -1 */
static int read_byte(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    unsigned char c;
    if (poll(&p, 1, WAIT_MS) != 1 || read(fd, &c, 1) != 1)
        return -1;
    return c;
}

/* ---- the target: a CUDA program that allocates, writes a pattern and keeps working --------- */

struct target {
    pid_t pid;
    int cmd;  /* commands to it */
    int ans;  /* its answers, a byte each */
    int prog; /* its progress: a uint32 per round of CUDA calls, non-blocking */
};

struct worker {
    CUcontext ctx;
    int prog;
};

static unsigned char pattern(size_t i)
{
    return (unsigned char)(i * 31 + 7);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    uint32_t n = 0;
    cuCtxSetCurrent(w->ctx);
    for (;;) {
        CUdeviceptr q;
        CUresult rc = cuMemAlloc_v2(&q, MIB);
        if (rc == CUDA_SUCCESS) {
            rc = cuMemsetD8_v2(q, (unsigned char)n, MIB);
            unsigned char b = 0;
            if (rc == CUDA_SUCCESS)
                rc = cuMemcpyDtoH_v2(&b, q + MIB - 1, 1);
            if (rc == CUDA_SUCCESS && b != (unsigned char)n)
                rc = CUDA_ERROR_INVALID_VALUE;
            CUresult rf = cuMemFree_v2(q);
            if (rc == CUDA_SUCCESS)
                rc = rf;
        }
        n = rc == CUDA_SUCCESS ? n + 1 : PROGRESS_ERROR;
        if (write(w->prog, &n, sizeof(n)) < 0 && errno != EAGAIN)
            return NULL;
        if (rc != CUDA_SUCCESS)
            return NULL;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

static bool pattern_intact(CUdeviceptr p)
{
    static unsigned char buf[PATTERN_BYTES];
    const size_t offs[] = {0, TARGET_MIB * MIB - PATTERN_BYTES};
    for (size_t k = 0; k < 2; k++) {
        if (cuMemcpyDtoH_v2(buf, p + offs[k], sizeof(buf)) != CUDA_SUCCESS)
            return false;
        for (size_t i = 0; i < sizeof(buf); i++)
            if (buf[i] != pattern(i + k))
                return false;
    }
    return true;
}

/* in the child: never returns */
static void target_main(int cmd, int ans, int prog, bool managed)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p, m;
    static unsigned char buf[PATTERN_BYTES];
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuCtxCreate_v2(&ctx, 0, dev) != CUDA_SUCCESS ||
        cuMemAlloc_v2(&p, TARGET_MIB * MIB) != CUDA_SUCCESS)
        _exit(10);
    if (managed && cuMemAllocManaged(&m, MIB, 1) != CUDA_SUCCESS)
        _exit(11);
    const size_t offs[] = {0, TARGET_MIB * MIB - PATTERN_BYTES};
    for (size_t k = 0; k < 2; k++) {
        for (size_t i = 0; i < sizeof(buf); i++)
            buf[i] = pattern(i + k);
        if (cuMemcpyHtoD_v2(p + offs[k], buf, sizeof(buf)) != CUDA_SUCCESS)
            _exit(12);
    }
    static struct worker w;
    w = (struct worker){.ctx = ctx, .prog = prog};
    pthread_t t;
    if (pthread_create(&t, NULL, worker_main, &w) != 0)
        _exit(13);
    char c = 'R';
    if (write(ans, &c, 1) != 1)
        _exit(14);
    while (read(cmd, &c, 1) == 1) {
        char r = '?';
        if (c == 'b') {
            r = fakecuda_call_begin() == CUDA_SUCCESS ? 'B' : 'x';
        } else if (c == 'e') {
            fakecuda_call_end();
            r = 'E';
        } else if (c == 'v') {
            r = pattern_intact(p) ? '1' : '0';
        } else if (c == 'q') {
            _exit(0);
        }
        if (write(ans, &r, 1) != 1)
            _exit(15);
    }
    _exit(0);
}

/* Forks a target with the given environment (NAME=VALUE strings, NULL-terminated) and waits
 * until it is working. */
static struct target spawn_target(const char *const *env, bool managed)
{
    int cmd[2], ans[2], prog[2];
    assert_int_equal(pipe(cmd), 0);
    assert_int_equal(pipe(ans), 0);
    assert_int_equal(pipe(prog), 0);
    pid_t pid = spawn();
    assert_true(pid >= 0);
    if (pid == 0) {
        close_fds_but(cmd[0], ans[1], prog[1]);
        fcntl(prog[1], F_SETFL, O_NONBLOCK);
        for (size_t i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        target_main(cmd[0], ans[1], prog[1], managed);
    }
    close(cmd[0]);
    close(ans[1]);
    close(prog[1]);
    fcntl(prog[0], F_SETFL, O_NONBLOCK);
    struct target t = {.pid = pid, .cmd = cmd[1], .ans = ans[0], .prog = prog[0]};
    assert_int_equal(read_byte(t.ans), 'R');
    return t;
}

/* a command to the target and its answer */
static int ask(struct target *t, char c)
{
    if (write(t->cmd, &c, 1) != 1)
        return -1;
    return read_byte(t->ans);
}

/* the progress reports there are now: how many, the last in *last */
static int progress_drain(struct target *t, uint32_t *last)
{
    uint32_t v;
    int n = 0;
    while (read(t->prog, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
        *last = v;
        n++;
    }
    return n;
}

/* waits for the next progress report (WAIT_MS at most) and returns the last one there is */
static uint32_t progress_next(struct target *t)
{
    uint32_t last = 0;
    progress_drain(t, &last);
    struct pollfd p = {.fd = t->prog, .events = POLLIN};
    assert_int_equal(poll(&p, 1, WAIT_MS), 1);
    assert_true(progress_drain(t, &last) > 0);
    return last;
}

static void end_target(struct target *t)
{
    close(t->cmd);
    close(t->ans);
    close(t->prog);
    kill_and_reap(t->pid);
}

/* ---- another process on the same device ----------------------------------------------------- */

struct other {
    pid_t pid;
    int hold; /* closing it lets the process exit */
};

/* Forks a process that allocates mib MiB and keeps it until other_release; returns the result of
 * its cuMemAlloc. */
static int other_alloc(unsigned int mib, struct other *o)
{
    int res[2], hold[2];
    assert_int_equal(pipe(res), 0);
    assert_int_equal(pipe(hold), 0);
    pid_t pid = spawn();
    assert_true(pid >= 0);
    if (pid == 0) {
        close_fds_but(res[1], hold[0], -1);
        CUdevice dev;
        CUcontext ctx;
        CUdeviceptr p;
        CUresult rc = cuInit(0);
        if (rc == CUDA_SUCCESS)
            rc = cuDeviceGet(&dev, 0);
        if (rc == CUDA_SUCCESS)
            rc = cuCtxCreate_v2(&ctx, 0, dev);
        if (rc == CUDA_SUCCESS)
            rc = cuMemAlloc_v2(&p, mib * MIB);
        unsigned char c = (unsigned char)(rc > 255 ? 255 : rc);
        if (write(res[1], &c, 1) != 1)
            _exit(1);
        char x;
        while (read(hold[0], &x, 1) > 0)
            ;
        _exit(0);
    }
    close(res[1]);
    close(hold[0]);
    int rc = read_byte(res[0]);
    close(res[0]);
    *o = (struct other){.pid = pid, .hold = hold[1]};
    return rc;
}

static void other_release(struct other *o)
{
    close(o->hold);
    reap(o->pid);
}

static unsigned long long used_mib(void)
{
    unsigned long long used, peak;
    assert_int_equal(fakecuda_stats(0, &used, &peak), 0);
    return used >> 20;
}

static bool lists(int pid)
{
    int pids[64];
    int n = fakecuda_processes(0, pids, 64);
    for (int i = 0; i < n && i < 64; i++)
        if (pids[i] == pid)
            return true;
    return false;
}

static CUprocessState state_of(int pid)
{
    CUprocessState st = (CUprocessState)-1;
    assert_int_equal(cuCheckpointProcessGetState(pid, &st), CUDA_SUCCESS);
    return st;
}

/* ---- the cases ---------------------------------------------------------------------------- */

/* the whole cycle, as a suspend and a resume */
static void test_suspend_resume(void **state)
{
    (void)state;
    assert_int_equal(used_mib(), 0);
    struct target t = spawn_target(NULL, false);
    progress_next(&t);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_RUNNING);
    assert_true(lists(t.pid));
    int tid = 0;
    assert_int_equal(cuCheckpointProcessGetRestoreThreadId(t.pid, &tid), CUDA_SUCCESS);
    char task[64];
    struct stat st;
    snprintf(task, sizeof(task), "/proc/%d/task/%d", t.pid, tid);
    assert_true(tid > 0 && tid != t.pid);
    assert_int_equal(stat(task, &st), 0); /* a thread of the target */

    /* the device is too full for a second 600 MiB */
    struct other o;
    assert_int_equal(other_alloc(TARGET_MIB, &o), CUDA_ERROR_OUT_OF_MEMORY);
    other_release(&o);

    /* lock: the target's calls stop (its worker waits at the lock) */
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_SUCCESS);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_LOCKED);
    assert_int_equal(fakecuda_ckpt_blocked(t.pid, 1, WAIT_MS), 0);
    uint32_t last = 0;
    progress_drain(&t, &last);
    unsigned long long held = used_mib();
    assert_true(held >= TARGET_MIB);

    /* checkpoint: its memory leaves the device, the PID leaves its process list */
    assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_SUCCESS);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_CHECKPOINTED);
    assert_int_equal(used_mib(), 0);
    assert_false(lists(t.pid));
    assert_int_equal(other_alloc(TARGET_MIB, &o), CUDA_SUCCESS);
    assert_true(lists(o.pid));
    other_release(&o);

    /* restore: the memory back, still locked */
    CUcheckpointRestoreArgs ra;
    memset(&ra, 0, sizeof(ra));
    assert_int_equal(cuCheckpointProcessRestore(t.pid, &ra), CUDA_SUCCESS);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_LOCKED);
    assert_int_equal(used_mib(), held);
    assert_true(lists(t.pid));
    assert_int_equal(progress_drain(&t, &last), 0); /* no progress from lock to here */

    /* unlock: the calls proceed, the bytes are where they were */
    CUcheckpointUnlockArgs ua;
    memset(&ua, 0, sizeof(ua));
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, &ua), CUDA_SUCCESS);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_RUNNING);
    uint32_t now = progress_next(&t);
    assert_true(now > last && now != PROGRESS_ERROR);
    assert_int_equal(ask(&t, 'v'), '1');

    /* and again, with arguments */
    CUcheckpointLockArgs la;
    memset(&la, 0, sizeof(la));
    la.timeoutMs = WAIT_MS;
    CUcheckpointCheckpointArgs ca;
    memset(&ca, 0, sizeof(ca));
    assert_int_equal(cuCheckpointProcessLock(t.pid, &la), CUDA_SUCCESS);
    assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, &ca), CUDA_SUCCESS);
    assert_int_equal(cuCheckpointProcessRestore(t.pid, NULL), CUDA_SUCCESS);
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_SUCCESS);
    progress_next(&t);
    assert_int_equal(ask(&t, 'v'), '1');
    end_target(&t);
    assert_int_equal(used_mib(), 0);
}

/* every action in a state it does not start from; arguments with reserved bits */
static void test_illegal_state(void **state)
{
    (void)state;
    struct target t = spawn_target(NULL, false);
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessRestore(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_SUCCESS);
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessRestore(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_SUCCESS);
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_CHECKPOINTED);

    /* a remap naming a GPU the driver does not have is refused (the process stays
     * checkpointed); reserved fields must be zero. Device 0 is GPU-fa6e0000-...-000000000000
     * (the fake's default name) */
    CUcheckpointGpuPair pair;
    memset(&pair, 0, sizeof(pair));
    pair.oldUuid.bytes[0] = (char)0xfa;
    pair.oldUuid.bytes[1] = 0x6e;
    pair.newUuid.bytes[0] = 1;
    CUcheckpointRestoreArgs ra;
    memset(&ra, 0, sizeof(ra));
    ra.gpuPairs = &pair;
    ra.gpuPairsCount = 1;
    assert_int_equal(cuCheckpointProcessRestore(t.pid, &ra), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_CHECKPOINTED);
    ra.gpuPairs = NULL;
    assert_int_equal(cuCheckpointProcessRestore(t.pid, &ra), CUDA_ERROR_INVALID_VALUE);
    ra.gpuPairsCount = 0;
    ra.reserved1 = 1;
    assert_int_equal(cuCheckpointProcessRestore(t.pid, &ra), CUDA_ERROR_INVALID_VALUE);
    pair.newUuid = pair.oldUuid; /* the same GPU: a remap that is no remap */
    memset(&ra, 0, sizeof(ra));
    ra.gpuPairs = &pair;
    ra.gpuPairsCount = 1;
    assert_int_equal(cuCheckpointProcessRestore(t.pid, &ra), CUDA_SUCCESS);

    CUcheckpointLockArgs la;
    memset(&la, 0, sizeof(la));
    la.reserved1[6] = 1;
    CUcheckpointUnlockArgs ua;
    memset(&ua, 0, sizeof(ua));
    ua.reserved[0] = 1;
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, &ua), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_SUCCESS);
    assert_int_equal(cuCheckpointProcessLock(t.pid, &la), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuCheckpointProcessGetState(t.pid, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuCheckpointProcessGetRestoreThreadId(t.pid, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_RUNNING);
    progress_next(&t);
    assert_int_equal(ask(&t, 'v'), '1');
    end_target(&t);
}

struct lock_call {
    int pid;
    unsigned int timeout_ms;
    _Atomic CUresult rc;
    atomic_bool done;
};

static void *lock_thread(void *arg)
{
    struct lock_call *l = arg;
    CUcheckpointLockArgs la;
    memset(&la, 0, sizeof(la));
    la.timeoutMs = l->timeout_ms;
    atomic_store(&l->rc, cuCheckpointProcessLock(l->pid, &la));
    atomic_store(&l->done, true);
    return NULL;
}

/* a call that does not finish: a lock with a timeout gives up and leaves it RUNNING; one
 * without waits for it */
static void test_lock_timeout(void **state)
{
    (void)state;
    struct target t = spawn_target(NULL, false);
    progress_next(&t);
    assert_int_equal(ask(&t, 'b'), 'B'); /* the target is inside a call */
    CUcheckpointLockArgs la;
    memset(&la, 0, sizeof(la));
    la.timeoutMs = 50;
    assert_int_equal(cuCheckpointProcessLock(t.pid, &la), CUDA_ERROR_NOT_READY);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_RUNNING);
    progress_next(&t); /* its other calls go on */

    struct lock_call l = {.pid = t.pid, .timeout_ms = 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, lock_thread, &l), 0);
    assert_int_equal(fakecuda_ckpt_blocked(t.pid, 1, WAIT_MS), 0); /* the lock is under way */
    assert_false(atomic_load(&l.done));                            /* and waits for the call */
    assert_int_equal(ask(&t, 'e'), 'E');
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&l.rc), CUDA_SUCCESS);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_LOCKED);
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_SUCCESS);
    progress_next(&t);
    end_target(&t);
}

/* what cannot be checkpointed: a knob (IPC memory, an old driver) or managed (UVM) memory */
static void test_not_supported(void **state)
{
    (void)state;
    static const char *const env[] = {"FAKE_CUDA_CKPT_UNSUPPORTED=1", NULL};
    for (int managed = 0; managed < 2; managed++) {
        struct target t = spawn_target(managed ? NULL : env, managed);
        unsigned long long held = used_mib();
        assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_SUCCESS);
        assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_ERROR_NOT_SUPPORTED);
        assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_LOCKED);
        assert_true(used_mib() >= held - 1); /* nothing released */
        assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_SUCCESS);
        progress_next(&t);
        end_target(&t);
    }
}

/* "operation not permitted" (cuda-checkpoint#25): every action refused, the state readable */
static void test_not_permitted(void **state)
{
    (void)state;
    static const char *const env[] = {"FAKE_CUDA_CKPT_EPERM=1", NULL};
    struct target t = spawn_target(env, false);
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_ERROR_NOT_PERMITTED);
    assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_ERROR_NOT_PERMITTED);
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_ERROR_NOT_PERMITTED);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_RUNNING);
    progress_next(&t);
    end_target(&t);
}

/* an error midway: FAILED for good, the memory held until the process goes */
static void test_failed(void **state)
{
    (void)state;
    static const char *const env[] = {"FAKE_CUDA_CKPT_FAIL=checkpoint", NULL};
    struct target t = spawn_target(env, false);
    progress_next(&t);
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_SUCCESS);
    unsigned long long held = used_mib();
    assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_ERROR_OPERATING_SYSTEM);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_FAILED);
    assert_int_equal(cuCheckpointProcessRestore(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    assert_int_equal(used_mib(), held);
    /* the blocked call returns an error to the program */
    struct pollfd p = {.fd = t.prog, .events = POLLIN};
    uint32_t last = 0;
    while (last != PROGRESS_ERROR) {
        assert_int_equal(poll(&p, 1, WAIT_MS), 1);
        progress_drain(&t, &last);
    }
    end_target(&t);
    assert_int_equal(used_mib(), 0);
}

/* a restore without room: OUT_OF_MEMORY and still CHECKPOINTED; then, as driver 580.95 does
 * (cuda-checkpoint#44), every later restore fails unless FAKE_CUDA_CKPT_RESTORE_RETRY is set */
static void test_restore_no_room(void **state)
{
    (void)state;
    static const char *const retry[] = {"FAKE_CUDA_CKPT_RESTORE_RETRY=1", NULL};
    for (int can_retry = 0; can_retry < 2; can_retry++) {
        struct target t = spawn_target(can_retry ? retry : NULL, false);
        assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_SUCCESS);
        assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_SUCCESS);
        struct other o;
        assert_int_equal(other_alloc(TARGET_MIB, &o), CUDA_SUCCESS);
        assert_int_equal(cuCheckpointProcessRestore(t.pid, NULL), CUDA_ERROR_OUT_OF_MEMORY);
        assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_CHECKPOINTED);
        assert_int_equal(used_mib(), TARGET_MIB); /* the other's, nothing of the target's */
        other_release(&o);
        if (can_retry) {
            assert_int_equal(cuCheckpointProcessRestore(t.pid, NULL), CUDA_SUCCESS);
            assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_SUCCESS);
            progress_next(&t);
            assert_int_equal(ask(&t, 'v'), '1');
        } else {
            assert_int_equal(cuCheckpointProcessRestore(t.pid, NULL), CUDA_ERROR_OPERATING_SYSTEM);
            assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
            assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_CHECKPOINTED);
        }
        end_target(&t);
    }
}

struct state_call {
    int pid;
    _Atomic CUresult rc;
    atomic_bool done;
};

static void *state_thread(void *arg)
{
    struct state_call *s = arg;
    CUprocessState st;
    atomic_store(&s->rc, cuCheckpointProcessGetState(s->pid, &st));
    atomic_store(&s->done, true);
    return NULL;
}

/* NCCL across processes: the lock never completes, even with a timeout, and the state is not
 * answered either, until the process is killed */
static void test_hang(void **state)
{
    (void)state;
    static const char *const env[] = {"FAKE_CUDA_CKPT_HANG=1", NULL};
    struct target t = spawn_target(env, false);
    progress_next(&t);
    struct lock_call l = {.pid = t.pid, .timeout_ms = 100};
    struct state_call s = {.pid = t.pid};
    pthread_t tl, ts;
    assert_int_equal(pthread_create(&tl, NULL, lock_thread, &l), 0);
    assert_int_equal(fakecuda_ckpt_blocked(t.pid, 1, WAIT_MS), 0);
    assert_int_equal(pthread_create(&ts, NULL, state_thread, &s), 0);
    /* the one wait for something not to happen: 10 times the lock's timeout */
    nanosleep(&(struct timespec){1, 0}, NULL);
    assert_false(atomic_load(&l.done));
    assert_false(atomic_load(&s.done));
    kill(t.pid, SIGKILL);
    waitpid(t.pid, NULL, 0);
    pthread_join(tl, NULL);
    pthread_join(ts, NULL);
    assert_int_equal(atomic_load(&l.rc), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(atomic_load(&s.rc), CUDA_ERROR_INVALID_VALUE);
    reap(t.pid);
    close(t.cmd);
    close(t.ans);
    close(t.prog);
}

struct poll_states {
    int pid;
    atomic_bool stop;
    atomic_bool saw_checkpointing, saw_restoring;
};

static void *poll_states_thread(void *arg)
{
    struct poll_states *p = arg;
    while (!atomic_load(&p->stop)) {
        CUprocessState st;
        if (cuCheckpointProcessGetState(p->pid, &st) != CUDA_SUCCESS)
            continue;
        if (st == CU_PROCESS_STATE_CHECKPOINTING)
            atomic_store(&p->saw_checkpointing, true);
        if (st == CU_PROCESS_STATE_RESTORING)
            atomic_store(&p->saw_restoring, true);
    }
    return NULL;
}

static long elapsed_ms(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* a checkpoint of N bytes takes N times the knob (a lower bound, which no load can break); the
 * states of newer drivers meanwhile */
static void test_time_per_byte(void **state)
{
    (void)state;
    static const char *const env[] = {"FAKE_CUDA_CKPT_US_PER_MIB=500", "FAKE_CUDA_CKPT_TRANSIENT=1",
                                      NULL};
    struct target t = spawn_target(env, false);
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_SUCCESS);
    struct poll_states p = {.pid = t.pid};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, poll_states_thread, &p), 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(cuCheckpointProcessCheckpoint(t.pid, NULL), CUDA_SUCCESS);
    assert_true(elapsed_ms(&t0) >= TARGET_MIB * 500 / 1000);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(cuCheckpointProcessRestore(t.pid, NULL), CUDA_SUCCESS);
    assert_true(elapsed_ms(&t0) >= TARGET_MIB * 500 / 1000);
    atomic_store(&p.stop, true);
    pthread_join(th, NULL);
    assert_true(atomic_load(&p.saw_checkpointing));
    assert_true(atomic_load(&p.saw_restoring));
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_LOCKED);
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_SUCCESS);
    assert_int_equal(ask(&t, 'v'), '1');
    end_target(&t);
}

/* a process without CUDA, no process, one that exited: CUDA_ERROR_INVALID_VALUE */
static void test_no_cuda(void **state)
{
    (void)state;
    int hold[2];
    assert_int_equal(pipe(hold), 0);
    pid_t plain = spawn();
    assert_true(plain >= 0);
    if (plain == 0) {
        char x;
        close(hold[1]);
        while (read(hold[0], &x, 1) > 0)
            ;
        _exit(0);
    }
    close(hold[0]);
    CUprocessState st;
    int tid;
    const int pids[] = {plain, 0, -1, getpid()};
    for (size_t i = 0; i < sizeof(pids) / sizeof(pids[0]); i++) {
        assert_int_equal(cuCheckpointProcessGetState(pids[i], &st), CUDA_ERROR_INVALID_VALUE);
        assert_int_equal(cuCheckpointProcessGetRestoreThreadId(pids[i], &tid),
                         CUDA_ERROR_INVALID_VALUE);
        assert_int_equal(cuCheckpointProcessLock(pids[i], NULL), CUDA_ERROR_INVALID_VALUE);
    }
    close(hold[1]);
    reap(plain);

    /* a target that exited and is not reaped yet (a zombie) */
    struct target t = spawn_target(NULL, false);
    assert_int_equal(write(t.cmd, "q", 1), 1);
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)t.pid, &si, WEXITED | WNOWAIT), 0);
    assert_int_equal(cuCheckpointProcessLock(t.pid, NULL), CUDA_ERROR_INVALID_VALUE);
    end_target(&t);
}

/* a caller killed while its lock waits: the lock still completes in the target, the next
 * caller takes the channel over */
static void test_caller_dies(void **state)
{
    (void)state;
    struct target t = spawn_target(NULL, false);
    assert_int_equal(ask(&t, 'b'), 'B');
    pid_t caller = spawn();
    assert_true(caller >= 0);
    if (caller == 0)
        _exit(cuCheckpointProcessLock(t.pid, NULL) == CUDA_SUCCESS ? 0 : 1);
    assert_int_equal(fakecuda_ckpt_blocked(t.pid, 1, WAIT_MS), 0);
    kill_and_reap(caller);
    assert_int_equal(ask(&t, 'e'), 'E');
    assert_int_equal(cuCheckpointProcessUnlock(t.pid, NULL), CUDA_SUCCESS);
    assert_int_equal(state_of(t.pid), CU_PROCESS_STATE_RUNNING);
    progress_next(&t);
    end_target(&t);
}

/* reachable by cuGetProcAddress; an older driver has none of it */
static void test_entry_points(void **state)
{
    (void)state;
    typedef void (*any_fn)(void);
    static const struct {
        const char *name;
        any_fn fn;
    } fns[] = {
        {"cuCheckpointProcessGetState", (any_fn)cuCheckpointProcessGetState},
        {"cuCheckpointProcessGetRestoreThreadId", (any_fn)cuCheckpointProcessGetRestoreThreadId},
        {"cuCheckpointProcessLock", (any_fn)cuCheckpointProcessLock},
        {"cuCheckpointProcessCheckpoint", (any_fn)cuCheckpointProcessCheckpoint},
        {"cuCheckpointProcessRestore", (any_fn)cuCheckpointProcessRestore},
        {"cuCheckpointProcessUnlock", (any_fn)cuCheckpointProcessUnlock},
        {"cuMemcpyHtoD", (any_fn)cuMemcpyHtoD_v2},
        {"cuMemcpyDtoH", (any_fn)cuMemcpyDtoH_v2},
    };
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        void *p = NULL;
        any_fn got;
        CUdriverProcAddressQueryResult q = -1;
        assert_int_equal(cuGetProcAddress_v2(fns[i].name, &p, 12080, 0, &q), CUDA_SUCCESS);
        memcpy(&got, &p, sizeof(got));
        assert_true(got == fns[i].fn);
        assert_int_equal(q, CU_GET_PROC_ADDRESS_SUCCESS);
    }
    int v = 0;
    assert_int_equal(cuDriverGetVersion(&v), CUDA_SUCCESS);
    assert_true(v >= 12080);

    if (old_driver == NULL) {
        print_message("no older fake driver given: its half skipped\n");
        return;
    }
    void *h = dlmopen(LM_ID_NEWLM, old_driver, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    assert_null(dlsym(h, "cuCheckpointProcessLock"));
    assert_null(dlsym(h, "cuCheckpointProcessGetState"));
    CUresult (*version)(int *);
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
    *(void **)&version = dlsym(h, "cuDriverGetVersion");
    *(void **)&gpa = dlsym(h, "cuGetProcAddress_v2");
    assert_non_null(version);
    assert_non_null(gpa);
    assert_int_equal(version(&v), CUDA_SUCCESS);
    assert_true(v < 12080);
    void *p = NULL;
    assert_int_equal(gpa("cuCheckpointProcessLock", &p, 12080, 0, NULL), CUDA_ERROR_NOT_FOUND);
    assert_null(p);
    dlclose(h);
}

int main(int argc, char **argv)
{
    old_driver = argc > 1 ? argv[1] : NULL;
    char dir[] = "/tmp/test_fake_ckpt.XXXXXX", path[64];
    if (mkdtemp(dir) == NULL)
        return 1;
    snprintf(path, sizeof(path), "%s/gpu", dir);
    setenv("FAKE_CUDA_STATE", path, 1);
    setenv("FAKE_CUDA_DEVICES", "1", 1);
    setenv("FAKE_CUDA_MEM_MIB", "1024", 1);
    static const char *const knobs[] = {"FAKE_CUDA_CKPT_EPERM",        "FAKE_CUDA_CKPT_UNSUPPORTED",
                                        "FAKE_CUDA_CKPT_HANG",         "FAKE_CUDA_CKPT_FAIL",
                                        "FAKE_CUDA_CKPT_US_PER_MIB",   "FAKE_CUDA_CKPT_TRANSIENT",
                                        "FAKE_CUDA_CKPT_RESTORE_RETRY"};
    for (size_t i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++)
        unsetenv(knobs[i]);
    signal(SIGPIPE, SIG_IGN);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_suspend_resume, teardown),
        cmocka_unit_test_teardown(test_illegal_state, teardown),
        cmocka_unit_test_teardown(test_lock_timeout, teardown),
        cmocka_unit_test_teardown(test_not_supported, teardown),
        cmocka_unit_test_teardown(test_not_permitted, teardown),
        cmocka_unit_test_teardown(test_failed, teardown),
        cmocka_unit_test_teardown(test_restore_no_room, teardown),
        cmocka_unit_test_teardown(test_hang, teardown),
        cmocka_unit_test_teardown(test_time_per_byte, teardown),
        cmocka_unit_test_teardown(test_no_cuda, teardown),
        cmocka_unit_test_teardown(test_caller_dies, teardown),
        cmocka_unit_test_teardown(test_entry_points, teardown),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(path);
    rmdir(dir);
    return failed;
}
