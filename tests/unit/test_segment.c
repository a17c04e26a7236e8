/* test_segment.c - the grant segment: admission at the grant, no over-admission under a race
 * of threads and of processes, clamps, dead processes reclaimed, versions refused. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "segment.h"

#define MIB (1ull << 20)

static char dir[] = "/tmp/osub-seg-XXXXXX";

static void make(struct osub_segment *g, const char *name, uint32_t n, uint64_t grant)
{
    char path[256], err[256];
    uint64_t grants[OSUB_SEG_DEVICES];
    for (int i = 0; i < OSUB_SEG_DEVICES; i++)
        grants[i] = grant;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    unlink(path);
    assert_int_equal(
        osub_seg_create(g, path, (uid_t)-1, (gid_t)-1, "svc", n, grants, err, sizeof(err)), 0);
}

static void test_grant_is_the_limit(void **state)
{
    (void)state;
    struct osub_segment g;
    make(&g, "a", 2, 1000 * MIB);
    int s = osub_seg_claim(&g);
    assert_true(s >= 0);
    assert_int_equal(osub_seg_live(&g), 1);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 600 * MIB), 0);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 401 * MIB), -ENOMEM);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 400 * MIB), 0);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 1), -ENOMEM);
    assert_int_equal(osub_seg_reserve(&g, s, 1, UINT64_MAX), -ENOMEM); /* no wrap */
    assert_int_equal(osub_seg_reserve(&g, s, 2, 1), -EINVAL);          /* beyond its devices */
    assert_int_equal(osub_seg_reserved(&g, 0), 1000 * MIB);
    assert_int_equal(atomic_load(&g.s->dev[0].refused), 2);
    /* a release of more than held is clamped, never a wrap to 17 TB */
    osub_seg_release(&g, s, 0, 5000 * MIB);
    assert_int_equal(osub_seg_reserved(&g, 0), 0);
    osub_seg_release(&g, s, 0, 1);
    assert_int_equal(osub_seg_reserved(&g, 0), 0);
    /* a lower grant refuses until use falls under it; a higher one admits again */
    assert_int_equal(osub_seg_reserve(&g, s, 0, 800 * MIB), 0);
    osub_seg_set_grant(&g, 0, 500 * MIB);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 1), -ENOMEM);
    osub_seg_release(&g, s, 0, 400 * MIB);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 100 * MIB), 0);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 1), -ENOMEM);
    osub_seg_set_grant(&g, 0, 1000 * MIB);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 500 * MIB), 0);
    assert_int_equal(atomic_load(&g.s->generation), 2);
    osub_seg_unclaim(&g, s);
    assert_int_equal(osub_seg_reserved(&g, 0), 0);
    assert_int_equal(osub_seg_live(&g), 0);
    osub_seg_cleanup(&g);
}

struct racer {
    struct osub_segment *g;
    int slot;
    uint64_t grant;
    _Atomic uint64_t *mine_total; /* what the racers believe they hold, summed */
    _Atomic int *over;
};

static void *race(void *arg)
{
    struct racer *r = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    uint64_t held[8];
    int n = 0;
    for (int round = 0; round < 20000; round++) {
        if (n == 8 || (n > 0 && rand_r(&seed) % 2)) {
            uint64_t b = held[--n];
            atomic_fetch_sub(r->mine_total, b);
            osub_seg_release(r->g, r->slot, 0, b);
            continue;
        }
        uint64_t b = (uint64_t)(rand_r(&seed) % 300 + 1) * MIB;
        if (osub_seg_reserve(r->g, r->slot, 0, b) == 0) {
            held[n++] = b;
            if (atomic_fetch_add(r->mine_total, b) + b > r->grant)
                atomic_store(r->over, 1);
        }
    }
    while (n > 0) {
        uint64_t b = held[--n];
        atomic_fetch_sub(r->mine_total, b);
        osub_seg_release(r->g, r->slot, 0, b);
    }
    return NULL;
}

static void test_threads_never_pass_the_grant(void **state)
{
    (void)state;
    struct osub_segment g;
    make(&g, "b", 1, 1000 * MIB);
    int s = osub_seg_claim(&g);
    _Atomic uint64_t total = 0;
    _Atomic int over = 0;
    pthread_t t[8];
    struct racer r = {&g, s, 1000 * MIB, &total, &over};
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, race, &r);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&over), 0);
    assert_true(atomic_load(&g.s->dev[0].peak_bytes) <= 1000 * MIB);
    assert_true(atomic_load(&g.s->dev[0].refused) > 0); /* the race did reach the grant */
    assert_int_equal(osub_seg_reserved(&g, 0), 0);
    osub_seg_unclaim(&g, s);
    osub_seg_cleanup(&g);
}

/* Processes, each with its slot, race on one grant; the parent checks the peak. */
static void test_processes_never_pass_the_grant(void **state)
{
    (void)state;
    struct osub_segment g;
    make(&g, "c", 1, 1000 * MIB);
    pid_t kids[6];
    for (int k = 0; k < 6; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            char path[256], err[256];
            struct osub_segment mine;
            snprintf(path, sizeof(path), "%s/c", dir);
            if (osub_seg_open(&mine, path, err, sizeof(err)) != 0)
                _exit(3);
            int s = osub_seg_claim(&mine);
            if (s < 0)
                _exit(4);
            _Atomic uint64_t total = 0;
            _Atomic int over = 0;
            struct racer r = {&mine, s, 1000 * MIB, &total, &over};
            race(&r);
            osub_seg_unclaim(&mine, s);
            _exit(over ? 5 : 0);
        }
    }
    for (int k = 0; k < 6; k++) {
        int st;
        assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    assert_true(atomic_load(&g.s->dev[0].peak_bytes) <= 1000 * MIB);
    assert_true(atomic_load(&g.s->dev[0].peak_bytes) > 700 * MIB);
    assert_int_equal(osub_seg_reserved(&g, 0), 0);
    assert_int_equal(osub_seg_live(&g), 0);
    osub_seg_cleanup(&g);
}

/* A process SIGKILLed while holding: its slot is seen dead and its bytes come back. */
static void test_dead_process_reclaimed(void **state)
{
    (void)state;
    struct osub_segment g;
    make(&g, "d", 1, 1000 * MIB);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t kid = fork();
    if (kid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        char path[256], err[256];
        struct osub_segment mine;
        snprintf(path, sizeof(path), "%s/d", dir);
        if (osub_seg_open(&mine, path, err, sizeof(err)) != 0)
            _exit(3);
        int s = osub_seg_claim(&mine);
        if (s < 0 || osub_seg_reserve(&mine, s, 0, 700 * MIB) != 0)
            _exit(4);
        char c = 'x';
        if (write(pipefd[1], &c, 1) != 1)
            _exit(5);
        for (;;)
            pause();
    }
    char c;
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    int s = osub_seg_claim(&g);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 400 * MIB), -ENOMEM);
    assert_int_equal(osub_seg_live(&g), 2);
    uint64_t b = 0;
    assert_int_equal(osub_seg_reclaim(&g, &b), 0); /* alive: nothing to take */
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    assert_int_equal(osub_seg_live(&g), 1);
    assert_int_equal(osub_seg_reclaim(&g, &b), 1);
    assert_int_equal(b, 700 * MIB);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 1000 * MIB), 0);
    assert_int_equal(atomic_load(&g.s->reclaimed_slots), 1);
    osub_seg_unclaim(&g, s);
    /* a death between the two counters' updates leaves the device high; with nobody left the
     * next reclaim makes it exact */
    atomic_fetch_add(&g.s->dev[0].reserved_bytes, 5 * MIB);
    assert_int_equal(osub_seg_reclaim(&g, &b), 0);
    assert_int_equal(b, 5 * MIB);
    assert_int_equal(osub_seg_reserved(&g, 0), 0);
    close(pipefd[0]);
    close(pipefd[1]);
    osub_seg_cleanup(&g);
}

/* A claim abandoned (CLAIMING, no lock, long ago) is taken back; one whose claimer holds the
 * lock is not, however old; a claimer whose slot was taken back never frees its new owner's. */
static void test_abandoned_claims(void **state)
{
    (void)state;
    struct osub_segment g;
    make(&g, "f", 1, 1000 * MIB);
    atomic_store(&g.s->slot[3].state, OSUB_SLOT_CLAIMING);
    atomic_store(&g.s->slot[3].claimed_ns, 1); /* at boot: long ago */
    uint64_t b;
    assert_int_equal(osub_seg_reclaim(&g, &b), 1);
    assert_int_equal(atomic_load(&g.s->slot[3].state), OSUB_SLOT_FREE);
    /* a live claimer of slot 0, then its slot marked as an old claim: its lock keeps it */
    int s = osub_seg_claim(&g);
    assert_int_equal(s, 0);
    assert_int_equal(osub_seg_reserve(&g, s, 0, 300 * MIB), 0);
    atomic_store(&g.s->slot[0].state, OSUB_SLOT_CLAIMING);
    atomic_store(&g.s->slot[0].claimed_ns, 1);
    assert_int_equal(osub_seg_reclaim(&g, &b), 0);
    assert_int_equal(osub_seg_reserved(&g, 0), 300 * MIB); /* and no reset with it alive */
    atomic_store(&g.s->slot[0].state, OSUB_SLOT_LIVE);
    osub_seg_unclaim(&g, s);
    osub_seg_cleanup(&g);
}

static void test_refuses_what_is_not_a_segment(void **state)
{
    (void)state;
    char path[256], err[256];
    struct osub_segment g;
    snprintf(path, sizeof(path), "%s/junk", dir);
    FILE *f = fopen(path, "w");
    fputs("not a segment", f);
    fclose(f);
    assert_int_equal(osub_seg_open(&g, path, err, sizeof(err)), -EPROTO);
    assert_non_null(strstr(err, "not a grant segment"));
    /* right size, wrong version */
    make(&g, "v", 1, MIB);
    g.s->version = 99;
    osub_seg_cleanup(&g);
    snprintf(path, sizeof(path), "%s/v", dir);
    assert_int_equal(osub_seg_open(&g, path, err, sizeof(err)), -EPROTO);
    assert_non_null(strstr(err, "version 99"));
    /* never over an existing file, never through a symlink */
    uint64_t grant = MIB;
    assert_int_equal(
        osub_seg_create(&g, path, (uid_t)-1, (gid_t)-1, "x", 1, &grant, err, sizeof(err)), -EEXIST);
    char link[256];
    snprintf(link, sizeof(link), "%s/link", dir);
    assert_int_equal(symlink(path, link), 0);
    assert_int_equal(osub_seg_open(&g, link, err, sizeof(err)), -ELOOP);
    assert_int_equal(
        osub_seg_create(&g, link, (uid_t)-1, (gid_t)-1, "x", 1, &grant, err, sizeof(err)), -EEXIST);
    assert_int_equal(
        osub_seg_create(&g, path, (uid_t)-1, (gid_t)-1, "x", 0, &grant, err, sizeof(err)), -EINVAL);
}

static void test_slots_run_out_cleanly(void **state)
{
    (void)state;
    struct osub_segment g;
    make(&g, "e", 1, MIB);
    int s[OSUB_SEG_SLOTS];
    for (int i = 0; i < OSUB_SEG_SLOTS; i++)
        assert_true((s[i] = osub_seg_claim(&g)) >= 0);
    assert_int_equal(osub_seg_claim(&g), -ENOSPC);
    osub_seg_unclaim(&g, s[7]);
    assert_int_equal(osub_seg_claim(&g), 7);
    osub_seg_cleanup(&g);
}

/* A process of the service can rewrite any byte of the header: the reader is bounded by the
 * geometry it copied (issue 23: n_slots 0x7fffffff, or n_devices 2^32-1 with a dead LIVE slot,
 * read out of bounds and killed oversubd), says what was rewritten, and puts it back. */
static void test_rewritten_header_is_not_believed(void **state)
{
    (void)state;
    struct osub_segment g;
    make(&g, "h", 2, 1000 * MIB);
    char why[200];
    assert_int_equal(osub_seg_check(&g, false, why, sizeof(why)), 0);
    /* a dead process's LIVE slot with something reserved, then the header rewritten */
    atomic_store(&g.s->slot[5].state, OSUB_SLOT_LIVE);
    atomic_store(&g.s->slot[5].reserved_bytes[1], 300 * MIB);
    atomic_store(&g.s->dev[1].reserved_bytes, 300 * MIB);
    g.s->n_slots = 0x7fffffff;
    g.s->n_devices = UINT32_MAX;
    g.s->slot_size = 1u << 30;
    assert_int_equal(osub_seg_check(&g, false, why, sizeof(why)), -EPROTO);
    assert_non_null(strstr(why, "n_devices is 4294967295, not 2"));
    uint64_t b = 0;
    assert_int_equal(osub_seg_reclaim(&g, &b), 1); /* the one dead slot, and nothing past it */
    assert_int_equal(b, 300 * MIB);
    assert_int_equal(osub_seg_live(&g), 0);
    assert_int_equal(osub_seg_grant(&g, 2), 0); /* beyond its 2 devices, whatever it says */
    osub_seg_set_grant(&g, 1000, MIB);          /* ignored, not written past the end */
    assert_int_equal(osub_seg_reserve(&g, 0, 2, MIB), -EINVAL);
    assert_int_equal(osub_seg_reserve(&g, 100000, 0, MIB), -EINVAL);
    struct osub_seg_view v = {0};
    assert_int_equal(osub_seg_view(&g, 10000 * MIB, &v, why, sizeof(why)), 0);
    assert_int_equal(v.n, 2);
    /* repaired: the header reads true again, and a fresh open accepts it */
    assert_int_equal(osub_seg_check(&g, true, why, sizeof(why)), -EPROTO);
    assert_int_equal(osub_seg_check(&g, false, why, sizeof(why)), 0);
    assert_int_equal(g.s->n_slots, OSUB_SEG_SLOTS);
    /* a figure no device holds is refused, clamped, and said */
    atomic_store(&g.s->dev[0].reserved_bytes, UINT64_MAX - 5);
    assert_int_equal(osub_seg_view(&g, 10000 * MIB, &v, why, sizeof(why)), -ERANGE);
    assert_int_equal(v.held[0], 10000 * MIB);
    assert_non_null(strstr(why, "device 0"));
    osub_seg_cleanup(&g);
}

int main(void)
{
    if (mkdtemp(dir) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grant_is_the_limit),
        cmocka_unit_test(test_threads_never_pass_the_grant),
        cmocka_unit_test(test_processes_never_pass_the_grant),
        cmocka_unit_test(test_dead_process_reclaimed),
        cmocka_unit_test(test_abandoned_claims),
        cmocka_unit_test(test_refuses_what_is_not_a_segment),
        cmocka_unit_test(test_slots_run_out_cleanly),
        cmocka_unit_test(test_rewritten_header_is_not_believed),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
