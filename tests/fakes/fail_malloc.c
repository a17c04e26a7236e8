/* fail_malloc.c - an LD_PRELOAD library that makes a process's allocations fail on demand, to
 * test what a program does when malloc returns NULL (tests/integration/test_allocfail.sh).
 *
 * Interposes malloc, calloc, realloc, free, posix_memalign, aligned_alloc and memalign (glibc's
 * own strdup, asprintf, fopen... call malloc through the interposable symbol, so they fail too).
 *
 * Control: FAIL_MALLOC_CTL=PATH names a control file; without the variable, or while the file
 * is absent or empty, nothing fails. The file is looked at again (stat, no allocation) at most
 * every 10 ms (CLOCK_MONOTONIC_COARSE) and re-read when its inode, size or mtime changed; write
 * it with a rename so that it is never read half-written. Its one line is one of
 *     off                 nothing fails
 *     N P [SEED]          after the first N allocations (counted from when the line was read),
 *                         each fails with probability P per mille (a hash of SEED and the call's
 *                         number: the same sequence of calls fails the same way)
 *     every K [N]         after the first N (default 0), every K-th allocation fails
 * A failed allocation returns NULL with errno ENOMEM; a realloc that fails leaves its block.
 *
 * FAIL_MALLOC_SPARE=NAME[,NAME...] (optional): exported functions (of any loaded library, found
 * with dlsym) whose allocations never fail: one that would is spared when one of the 12 frames
 * above malloc is inside such a function. For a library's known bug, so that it does not hide
 * the program's own handling of failures (libevent 2.1's evhttp_request_new crashes on one).
 *
 * PATH.stats is rewritten at each look (at most every 10 ms while allocations happen):
 * "calls CALLS failed FAILURES spared SPARED" since the process started.
 * FAIL_MALLOC_LOG=FILE (optional) appends, for every failure, "fail #N size S" and the
 * backtrace (backtrace_symbols_fd: addresses to resolve with addr2line), for finding which
 * allocation it was. gdb can also print fm_last_fail / fm_last_fail_n (the thread's latest).
 *
 * Thread-safe: counters and the configuration are atomics; one thread at a time re-reads.
 * The bootstrap (dlsym may itself call calloc) is served from a static arena and never fails,
 * nor does any allocation made from inside this library (its re-entry guard).
 * Not for sanitizer builds: ASan and TSan must own malloc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef void (*free_fn)(void *);
typedef int (*posix_memalign_fn)(void **, size_t, size_t);
typedef void *(*aligned_alloc_fn)(size_t, size_t);

static _Atomic(malloc_fn) real_malloc;
static _Atomic(calloc_fn) real_calloc;
static _Atomic(realloc_fn) real_realloc;
static _Atomic(free_fn) real_free;
static _Atomic(posix_memalign_fn) real_posix_memalign;
static _Atomic(aligned_alloc_fn) real_aligned_alloc;
static _Atomic(aligned_alloc_fn) real_memalign;
static atomic_int resolved;

/* ---- the bootstrap arena: blocks with a 16-byte header holding their size ---- */
static _Alignas(16) unsigned char arena[256 * 1024];
static atomic_size_t arena_used;

static int in_arena(const void *p)
{
    return (const unsigned char *)p >= arena && (const unsigned char *)p < arena + sizeof arena;
}

static void *arena_alloc(size_t n)
{
    size_t need = ((n + 15) & ~(size_t)15) + 16;
    size_t at = atomic_fetch_add(&arena_used, need);
    if (n > sizeof arena || at + need > sizeof arena) {
        static const char msg[] = "fail_malloc: bootstrap arena exhausted\n";
        ssize_t r = write(2, msg, sizeof msg - 1);
        (void)r;
        abort();
    }
    memcpy(arena + at, &n, sizeof n);
    return arena + at + 16; /* static memory: already zero, as calloc needs */
}

static size_t arena_size(const void *p)
{
    size_t n;
    memcpy(&n, (const unsigned char *)p - 16, sizeof n);
    return n;
}

/* ---- re-entry: the bootstrap and our own calls (backtrace) never fail ---- */
static __thread int in_hook __attribute__((tls_model("initial-exec")));

static void resolve(void)
{
    if (atomic_load_explicit(&resolved, memory_order_acquire))
        return;
    in_hook++;
    atomic_store(&real_malloc, (malloc_fn)dlsym(RTLD_NEXT, "malloc"));
    atomic_store(&real_calloc, (calloc_fn)dlsym(RTLD_NEXT, "calloc"));
    atomic_store(&real_realloc, (realloc_fn)dlsym(RTLD_NEXT, "realloc"));
    atomic_store(&real_free, (free_fn)dlsym(RTLD_NEXT, "free"));
    atomic_store(&real_posix_memalign, (posix_memalign_fn)dlsym(RTLD_NEXT, "posix_memalign"));
    atomic_store(&real_aligned_alloc, (aligned_alloc_fn)dlsym(RTLD_NEXT, "aligned_alloc"));
    atomic_store(&real_memalign, (aligned_alloc_fn)dlsym(RTLD_NEXT, "memalign"));
    in_hook--;
    if (!atomic_load(&real_malloc) || !atomic_load(&real_calloc) || !atomic_load(&real_realloc) ||
        !atomic_load(&real_free)) {
        static const char msg[] = "fail_malloc: dlsym(RTLD_NEXT) found no malloc\n";
        ssize_t r = write(2, msg, sizeof msg - 1);
        (void)r;
        abort();
    }
    atomic_store_explicit(&resolved, 1, memory_order_release);
}

/* ---- the configuration ---- */
enum { MODE_OFF, MODE_PROB, MODE_EVERY };
static atomic_int cfg_mode;
static atomic_ullong cfg_param; /* per mille, or K */
static atomic_ullong cfg_seed;
static atomic_ullong cfg_start; /* the call number from which failures may happen */

static atomic_ullong n_calls;
static atomic_ullong n_failed;
static atomic_ullong n_spared;
static atomic_llong last_look_ns = -1000000000LL;
static atomic_flag looking = ATOMIC_FLAG_INIT;
static const char *ctl_path; /* getenv's pointer: no allocation */
static struct stat ctl_st;
static int have_st;

/* exported for gdb: the latest failure's backtrace on each thread */
EXPORT __thread void *fm_last_fail[24] __attribute__((tls_model("initial-exec")));
EXPORT __thread int fm_last_fail_n __attribute__((tls_model("initial-exec")));

static unsigned long long parse_u(const char **s, int *ok)
{
    unsigned long long v = 0;
    int digits = 0;
    while (**s == ' ' || **s == '\t')
        (*s)++;
    while (**s >= '0' && **s <= '9') {
        v = v * 10 + (unsigned long long)(**s - '0');
        (*s)++;
        digits++;
    }
    if (!digits)
        *ok = 0;
    return v;
}

static void apply(const char *buf)
{
    const char *s = buf;
    int ok = 1;
    unsigned long long now = atomic_load(&n_calls);
    while (*s == ' ' || *s == '\t' || *s == '\n')
        s++;
    if (*s == '\0' || strncmp(s, "off", 3) == 0) {
        atomic_store(&cfg_mode, MODE_OFF);
        return;
    }
    if (strncmp(s, "every", 5) == 0) {
        s += 5;
        unsigned long long k = parse_u(&s, &ok);
        int ok2 = 1;
        unsigned long long skip = parse_u(&s, &ok2);
        if (!ok || k == 0) {
            atomic_store(&cfg_mode, MODE_OFF);
            return;
        }
        atomic_store(&cfg_param, k);
        atomic_store(&cfg_start, now + (ok2 ? skip : 0));
        atomic_store(&cfg_mode, MODE_EVERY);
        return;
    }
    unsigned long long skip = parse_u(&s, &ok);
    unsigned long long pm = parse_u(&s, &ok);
    int ok2 = 1;
    unsigned long long seed = parse_u(&s, &ok2);
    if (!ok) {
        atomic_store(&cfg_mode, MODE_OFF);
        return;
    }
    atomic_store(&cfg_param, pm > 1000 ? 1000 : pm);
    atomic_store(&cfg_seed, ok2 ? seed : 1);
    atomic_store(&cfg_start, now + skip);
    atomic_store(&cfg_mode, MODE_PROB);
}

static void put_u(char **p, unsigned long long v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *(*p)++ = tmp[--n];
}

static void write_stats(void)
{
    char path[4096], line[96], *p = line;
    size_t len = strlen(ctl_path);
    if (len + 7 >= sizeof path)
        return;
    memcpy(path, ctl_path, len);
    memcpy(path + len, ".stats", 7);
    memcpy(p, "calls ", 6);
    p += 6;
    put_u(&p, atomic_load(&n_calls));
    memcpy(p, " failed ", 8);
    p += 8;
    put_u(&p, atomic_load(&n_failed));
    memcpy(p, " spared ", 8);
    p += 8;
    put_u(&p, atomic_load(&n_spared));
    *p++ = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t r = write(fd, line, (size_t)(p - line));
    (void)r;
    close(fd);
}

static void look(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (now - atomic_load_explicit(&last_look_ns, memory_order_relaxed) < 10000000LL)
        return;
    if (atomic_flag_test_and_set(&looking))
        return; /* another thread is looking: keep the configuration we have */
    atomic_store(&last_look_ns, now);
    struct stat st;
    if (stat(ctl_path, &st) != 0) {
        have_st = 0;
        atomic_store(&cfg_mode, MODE_OFF);
    } else if (!have_st || st.st_ino != ctl_st.st_ino || st.st_size != ctl_st.st_size ||
               st.st_mtim.tv_sec != ctl_st.st_mtim.tv_sec ||
               st.st_mtim.tv_nsec != ctl_st.st_mtim.tv_nsec) {
        char buf[128];
        ssize_t n = -1;
        int fd = open(ctl_path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            n = read(fd, buf, sizeof buf - 1);
            close(fd);
        }
        buf[n > 0 ? n : 0] = '\0';
        apply(buf);
        ctl_st = st;
        have_st = 1;
    }
    write_stats();
    atomic_flag_clear(&looking);
}

static unsigned long long mix(unsigned long long x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static const char *log_path;

/* the functions whose allocations are spared (FAIL_MALLOC_SPARE) */
static struct {
    uintptr_t lo, hi;
} spare[16];
static int n_spare;

static void load_spare(const char *list)
{
    char name[128];
    while (*list && n_spare < (int)(sizeof spare / sizeof spare[0])) {
        size_t n = strcspn(list, ", ");
        if (n > 0 && n < sizeof name) {
            memcpy(name, list, n);
            name[n] = '\0';
            Dl_info info;
            const ElfW(Sym) *sym = NULL;
            void *a = dlsym(RTLD_DEFAULT, name);
            if (a && dladdr1(a, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size) {
                spare[n_spare].lo = (uintptr_t)a;
                spare[n_spare].hi = (uintptr_t)a + sym->st_size;
                n_spare++;
            } else {
                static const char msg[] = "fail_malloc: FAIL_MALLOC_SPARE: a function not found: ";
                ssize_t r = write(2, msg, sizeof msg - 1);
                r = write(2, name, n);
                r = write(2, "\n", 1);
                (void)r;
            }
        }
        list += n;
        while (*list == ',' || *list == ' ')
            list++;
    }
}

static int spared(void *const *frames, int n)
{
    for (int i = 1; i < n && i <= 12; i++)
        for (int j = 0; j < n_spare; j++)
            if ((uintptr_t)frames[i] > spare[j].lo && (uintptr_t)frames[i] <= spare[j].hi)
                return 1;
    return 0;
}

static void log_failure(unsigned long long nr, size_t size)
{
    if (!log_path)
        return;
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[96], *p = line;
    memcpy(p, "fail #", 6);
    p += 6;
    put_u(&p, nr);
    memcpy(p, " size ", 6);
    p += 6;
    put_u(&p, size);
    memcpy(p, " tid ", 5);
    p += 5;
    put_u(&p, (unsigned long long)gettid());
    *p++ = '\n';
    ssize_t r = write(fd, line, (size_t)(p - line));
    (void)r;
    /* frame 0 is should_fail, 1 the interposed function */
    backtrace_symbols_fd(fm_last_fail + 2, fm_last_fail_n > 2 ? fm_last_fail_n - 2 : 0, fd);
    close(fd);
}

/* 1 when this allocation must fail */
__attribute__((noinline)) static int should_fail(size_t size)
{
    if (!ctl_path || in_hook)
        return 0;
    unsigned long long nr = atomic_fetch_add_explicit(&n_calls, 1, memory_order_relaxed);
    look();
    int mode = atomic_load_explicit(&cfg_mode, memory_order_relaxed);
    if (mode == MODE_OFF)
        return 0;
    unsigned long long start = atomic_load_explicit(&cfg_start, memory_order_relaxed);
    if (nr < start)
        return 0;
    unsigned long long param = atomic_load_explicit(&cfg_param, memory_order_relaxed);
    int fail;
    if (mode == MODE_EVERY)
        fail = (nr - start) % param == param - 1;
    else
        fail =
            mix(nr ^ (atomic_load_explicit(&cfg_seed, memory_order_relaxed) << 32)) % 1000 < param;
    if (!fail)
        return 0;
    void *frames[24];
    int n;
    in_hook++;
    n = backtrace(frames, 24);
    in_hook--;
    /* frames[1] is the interposed function: the spared functions are looked for above it */
    if (n_spare && spared(frames + 1, n - 1)) {
        atomic_fetch_add_explicit(&n_spared, 1, memory_order_relaxed);
        return 0;
    }
    memcpy(fm_last_fail, frames, sizeof frames);
    fm_last_fail_n = n;
    atomic_fetch_add_explicit(&n_failed, 1, memory_order_relaxed);
    in_hook++;
    log_failure(nr, size);
    in_hook--;
    errno = ENOMEM;
    return 1;
}

__attribute__((constructor)) static void fm_init(void)
{
    resolve();
    const char *c = getenv("FAIL_MALLOC_CTL");
    if (c && *c) {
        log_path = getenv("FAIL_MALLOC_LOG");
        if (log_path && !*log_path)
            log_path = NULL;
        /* backtrace loads libgcc_s (it allocates) the first time: do it now, not in a failure */
        void *b[2];
        in_hook++;
        backtrace(b, 2);
        in_hook--;
        const char *sp = getenv("FAIL_MALLOC_SPARE");
        if (sp && *sp) {
            in_hook++;
            load_spare(sp);
            in_hook--;
        }
        ctl_path = c;
    }
}

EXPORT void *malloc(size_t n)
{
    if (!atomic_load_explicit(&resolved, memory_order_acquire)) {
        if (in_hook)
            return arena_alloc(n);
        resolve();
    }
    if (should_fail(n))
        return NULL;
    return atomic_load_explicit(&real_malloc, memory_order_relaxed)(n);
}

EXPORT void *calloc(size_t n, size_t m)
{
    if (!atomic_load_explicit(&resolved, memory_order_acquire)) {
        if (in_hook) {
            if (m && n > SIZE_MAX / m)
                return NULL;
            return arena_alloc(n * m);
        }
        resolve();
    }
    if (should_fail(n * m))
        return NULL;
    return atomic_load_explicit(&real_calloc, memory_order_relaxed)(n, m);
}

EXPORT void free(void *p)
{
    if (!p || in_arena(p))
        return;
    if (!atomic_load_explicit(&resolved, memory_order_acquire)) {
        if (in_hook)
            return; /* not ours, during the bootstrap: leaked rather than re-entering dlsym */
        resolve();
    }
    atomic_load_explicit(&real_free, memory_order_relaxed)(p);
}

EXPORT void *realloc(void *p, size_t n)
{
    if (!atomic_load_explicit(&resolved, memory_order_acquire)) {
        if (in_hook) {
            void *q = arena_alloc(n);
            if (p && in_arena(p)) {
                size_t old = arena_size(p);
                memcpy(q, p, old < n ? old : n);
            }
            return q;
        }
        resolve();
    }
    if (p && in_arena(p)) {
        size_t old = arena_size(p);
        void *q = atomic_load_explicit(&real_malloc, memory_order_relaxed)(n ? n : 1);
        if (q)
            memcpy(q, p, old < n ? old : n);
        return q;
    }
    if (n && should_fail(n))
        return NULL;
    return atomic_load_explicit(&real_realloc, memory_order_relaxed)(p, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    resolve();
    if (should_fail(n))
        return ENOMEM;
    return atomic_load_explicit(&real_posix_memalign, memory_order_relaxed)(out, align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
    resolve();
    if (should_fail(n))
        return NULL;
    return atomic_load_explicit(&real_aligned_alloc, memory_order_relaxed)(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
    resolve();
    if (should_fail(n))
        return NULL;
    return atomic_load_explicit(&real_memalign, memory_order_relaxed)(align, n);
}
