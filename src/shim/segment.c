/* segment.c - the per-service grant segment (segment.h): creation, claims, reservations,
 * reclaiming what dead processes held. Lock-free: C11 atomics and per-slot OFD locks. */
#define _GNU_SOURCE
#include "segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "the segment needs lock-free 64-bit atomics");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the segment needs lock-free 32-bit atomics");
_Static_assert(sizeof(struct osub_seg) < (1u << 20), "the segment stays small");

#define RLX memory_order_relaxed
#define ACQ memory_order_acquire
#define REL memory_order_release
#define ACQREL memory_order_acq_rel

static uint64_t boottime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* the byte of slot i's lock: from the layout this build knows, never from the header */
static off_t slot_byte(int i)
{
    return (off_t)offsetof(struct osub_seg, slot) + (off_t)i * (off_t)sizeof(struct osub_seg_slot);
}

/* Subtracts up to n from *c, never below zero; returns what it took. */
static uint64_t sub_clamped(_Atomic uint64_t *c, uint64_t n)
{
    uint64_t cur = atomic_load_explicit(c, RLX);
    for (;;) {
        uint64_t take = n < cur ? n : cur;
        if (atomic_compare_exchange_weak_explicit(c, &cur, cur - take, ACQREL, RLX))
            return take;
    }
}

static void max_into(_Atomic uint64_t *c, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(c, RLX);
    while (cur < v && !atomic_compare_exchange_weak_explicit(c, &cur, v, RLX, RLX))
        ;
}

static void init_header(struct osub_seg *s, const char *service, uint32_t n_devices,
                        const uint64_t *grant_bytes, uint64_t one_grant)
{
    memset(s, 0, sizeof(*s));
    s->magic = OSUB_SEG_MAGIC;
    s->version = OSUB_SEG_VERSION;
    s->size = (uint32_t)sizeof(*s);
    s->n_devices = n_devices;
    s->n_slots = OSUB_SEG_SLOTS;
    s->slot_offset = (uint32_t)offsetof(struct osub_seg, slot);
    s->slot_size = (uint32_t)sizeof(struct osub_seg_slot);
    if (service != NULL)
        snprintf(s->service, sizeof(s->service), "%s", service);
    for (uint32_t i = 0; i < n_devices; i++)
        atomic_store(&s->dev[i].grant_bytes, grant_bytes ? grant_bytes[i] : one_grant);
}

static int map_fd(struct osub_segment *g, int fd, char *err, size_t errlen, const char *what)
{
    void *p = mmap(NULL, sizeof(struct osub_seg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        snprintf(err, errlen, "cannot map %s: %s", what, strerror(e));
        return -e;
    }
    char self[64];
    snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
    /* O_NONBLOCK: a lease its owner holds on the file makes a blocking open wait for the
     * kernel to break it (45 s); this way the open fails at once (EWOULDBLOCK) */
    int probe = open(self, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (probe < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open %s a second time: %s", what, strerror(e));
        munmap(p, sizeof(struct osub_seg));
        return -e;
    }
    g->fd = fd;
    g->probe_fd = probe;
    g->s = p;
    return 0;
}

int osub_seg_create(struct osub_segment *g, const char *path, uid_t uid, gid_t gid,
                    const char *service, uint32_t n_devices, const uint64_t *grant_bytes, char *err,
                    size_t errlen)
{
    g->fd = g->probe_fd = -1;
    g->s = NULL;
    g->n_devices = g->n_slots = 0;
    if (n_devices == 0 || n_devices > OSUB_SEG_DEVICES) {
        snprintf(err, errlen, "a segment grants 1 to %d devices, not %u", OSUB_SEG_DEVICES,
                 n_devices);
        return -EINVAL;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(e));
        return -e;
    }
    int e = 0;
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)sizeof(struct osub_seg)) != 0)
        e = errno;
    else if (uid != (uid_t)-1 && fchown(fd, uid, gid) != 0)
        e = errno;
    if (e != 0) {
        snprintf(err, errlen, "cannot prepare %s: %s", path, strerror(e));
        close(fd);
        unlink(path);
        return -e;
    }
    int rc = map_fd(g, fd, err, errlen, path);
    if (rc != 0) {
        close(fd);
        unlink(path);
        return rc;
    }
    init_header(g->s, service, n_devices, grant_bytes, 0);
    g->n_devices = n_devices;
    g->n_slots = OSUB_SEG_SLOTS;
    atomic_thread_fence(memory_order_seq_cst);
    return 0;
}

int osub_seg_create_anon(struct osub_segment *g, uint32_t n_devices, uint64_t grant_bytes,
                         char *err, size_t errlen)
{
    g->fd = g->probe_fd = -1;
    g->s = NULL;
    g->n_devices = g->n_slots = 0;
    int fd = memfd_create("oversub-grant", MFD_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "memfd_create: %s", strerror(e));
        return -e;
    }
    if (ftruncate(fd, (off_t)sizeof(struct osub_seg)) != 0) {
        int e = errno;
        snprintf(err, errlen, "cannot size the segment: %s", strerror(e));
        close(fd);
        return -e;
    }
    int rc = map_fd(g, fd, err, errlen, "the segment");
    if (rc != 0) {
        close(fd);
        return rc;
    }
    if (n_devices == 0 || n_devices > OSUB_SEG_DEVICES)
        n_devices = OSUB_SEG_DEVICES;
    init_header(g->s, "standalone", n_devices, NULL, grant_bytes);
    g->n_devices = n_devices;
    g->n_slots = OSUB_SEG_SLOTS;
    return 0;
}

int osub_seg_open(struct osub_segment *g, const char *path, char *err, size_t errlen)
{
    g->fd = g->probe_fd = -1;
    g->s = NULL;
    g->n_devices = g->n_slots = 0;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK); /* never wait on a lease */
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size != (off_t)sizeof(struct osub_seg)) {
        snprintf(err, errlen, "%s is not a grant segment of this version (%lld bytes, want %zu)",
                 path, (long long)st.st_size, sizeof(struct osub_seg));
        close(fd);
        return -EPROTO;
    }
    int rc = map_fd(g, fd, err, errlen, path);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    /* one read of each field: what is checked is what is kept */
    const volatile struct osub_seg *s = g->s;
    uint32_t magic = s->magic, version = s->version, size = s->size, n_slots = s->n_slots;
    uint32_t slot_offset = s->slot_offset, slot_size = s->slot_size, n_devices = s->n_devices;
    if (magic != OSUB_SEG_MAGIC || version != OSUB_SEG_VERSION || size != sizeof(struct osub_seg) ||
        n_slots != OSUB_SEG_SLOTS || slot_offset != offsetof(struct osub_seg, slot) ||
        slot_size != sizeof(struct osub_seg_slot) || n_devices == 0 ||
        n_devices > OSUB_SEG_DEVICES) {
        snprintf(err, errlen, "%s: not a version-%u grant segment (magic %08x, version %u)", path,
                 OSUB_SEG_VERSION, magic, version);
        osub_seg_cleanup(g);
        return -EPROTO;
    }
    g->n_devices = n_devices;
    g->n_slots = n_slots;
    return 0;
}

void osub_seg_cleanup(struct osub_segment *g)
{
    if (g == NULL)
        return;
    if (g->s != NULL)
        munmap(g->s, sizeof(struct osub_seg));
    if (g->fd >= 0)
        close(g->fd);
    if (g->probe_fd >= 0)
        close(g->probe_fd);
    g->s = NULL;
    g->fd = g->probe_fd = -1;
    g->n_devices = g->n_slots = 0;
}

static int slot_lock(const struct osub_segment *g, int i, int cmd, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = slot_byte(i), .l_len = 1};
    if (fcntl(cmd == F_OFD_GETLK ? g->probe_fd : g->fd, cmd, &fl) != 0)
        return -errno;
    return cmd == F_OFD_GETLK ? (fl.l_type == F_UNLCK ? 0 : 1) : 0;
}

/* a lock (or unlock) of slot i through the probe description: 0 or a negative errno */
static int probe_lock(const struct osub_segment *g, int i, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = slot_byte(i), .l_len = 1};
    return fcntl(g->probe_fd, F_OFD_SETLK, &fl) != 0 ? -errno : 0;
}

/* 1 when some open file description holds slot i's lock, 0 when none, <0 on error */
static int slot_held(const struct osub_segment *g, int i)
{
    return slot_lock(g, i, F_OFD_GETLK, F_WRLCK);
}

/* Releases slot i's reservations, drops the lock when the caller holds it, then frees it. */
static void free_slot(const struct osub_segment *g, int i, bool unlock, uint64_t *bytes)
{
    struct osub_seg *s = g->s;
    struct osub_seg_slot *sl = &s->slot[i];
    uint64_t total = 0;
    for (uint32_t d = 0; d < g->n_devices; d++) {
        uint64_t had = atomic_exchange_explicit(&sl->reserved_bytes[d], 0, ACQREL);
        total += sub_clamped(&s->dev[d].reserved_bytes, had);
    }
    atomic_store_explicit(&sl->pid, 0, RLX);
    atomic_store_explicit(&sl->claimed_ns, 0, RLX);
    if (unlock)
        slot_lock(g, i, F_OFD_SETLK, F_UNLCK);
    atomic_fetch_add_explicit(&s->epoch, 1, ACQREL);
    atomic_store_explicit(&sl->state, OSUB_SLOT_FREE, REL);
    if (bytes != NULL)
        *bytes += total;
}

int osub_seg_reclaim(struct osub_segment *g, uint64_t *bytes)
{
    struct osub_seg *s = g->s;
    uint64_t got = 0;
    int n = 0, alive = 0;
    uint64_t epoch0 = atomic_load_explicit(&s->epoch, ACQ);
    for (int i = 0; i < (int)g->n_slots; i++) {
        uint32_t st = atomic_load_explicit(&s->slot[i].state, ACQ);
        if (st == OSUB_SLOT_FREE)
            continue;
        if (st == OSUB_SLOT_RECLAIMING) {
            alive++; /* someone else is at it; not ours to count as gone */
            continue;
        }
        int held = slot_held(g, i);
        if (held != 0) {
            alive++;
            continue;
        }
        /* an abandoned claim: take its lock ourselves first, so that a claimer that was only
         * slow cannot lock it between our look and our taking it */
        bool probe_locked = false;
        if (st == OSUB_SLOT_CLAIMING) {
            uint64_t at = atomic_load_explicit(&s->slot[i].claimed_ns, RLX);
            if (at == 0 || boottime_ns() - at < OSUB_SEG_CLAIM_STALE_NS ||
                probe_lock(g, i, F_WRLCK) != 0) {
                alive++;
                continue;
            }
            probe_locked = true;
        }
        if (!atomic_compare_exchange_strong_explicit(&s->slot[i].state, &st, OSUB_SLOT_RECLAIMING,
                                                     ACQREL, RLX)) {
            if (probe_locked)
                probe_lock(g, i, F_UNLCK);
            alive++;
            continue;
        }
        uint64_t b = 0;
        free_slot(g, i, false, &b);
        if (probe_locked)
            probe_lock(g, i, F_UNLCK);
        got += b;
        n++;
    }
    if (n > 0) {
        atomic_fetch_add_explicit(&s->reclaimed_bytes, got, RLX);
        atomic_fetch_add_explicit(&s->reclaimed_slots, (uint64_t)n, RLX);
    }
    if (alive == 0) {
        /* nobody left: what the counters still hold was left by a process killed between two
         * of its updates. Each counter is read, then the epoch checked (a claim since our look
         * began changes it: stop), then swapped to zero only if it still holds what was read
         * (a claimer's reservation since changes it, and its value stands). */
        for (uint32_t d = 0; d < g->n_devices; d++) {
            uint64_t cur = atomic_load_explicit(&s->dev[d].reserved_bytes, ACQ);
            if (atomic_load_explicit(&s->epoch, ACQ) != epoch0 + (uint64_t)n)
                break;
            uint64_t left = cur;
            if (cur != 0 && atomic_compare_exchange_strong_explicit(&s->dev[d].reserved_bytes, &cur,
                                                                    0, ACQREL, RLX))
                got += left;
        }
    }
    if (bytes != NULL)
        *bytes = got;
    return n;
}

int osub_seg_live(const struct osub_segment *g)
{
    int n = 0;
    for (int i = 0; i < (int)g->n_slots; i++)
        if (atomic_load_explicit(&g->s->slot[i].state, ACQ) == OSUB_SLOT_LIVE &&
            slot_held(g, i) == 1)
            n++;
    return n;
}

int osub_seg_claim(struct osub_segment *g)
{
    struct osub_seg *s = g->s;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < (int)g->n_slots; i++) {
            uint32_t st = OSUB_SLOT_FREE;
            if (!atomic_compare_exchange_strong_explicit(&s->slot[i].state, &st, OSUB_SLOT_CLAIMING,
                                                         ACQREL, RLX))
                continue;
            atomic_fetch_add_explicit(&s->epoch, 1, ACQREL);
            atomic_store_explicit(&s->slot[i].claimed_ns, boottime_ns(), RLX);
            if (slot_lock(g, i, F_OFD_SETLK, F_WRLCK) != 0) {
                /* held: its last owner is still letting go of it, or our claim was taken as
                 * abandoned and the slot is someone else's now: give it back only if ours */
                uint32_t mine = OSUB_SLOT_CLAIMING;
                atomic_compare_exchange_strong_explicit(&s->slot[i].state, &mine, OSUB_SLOT_FREE,
                                                        ACQREL, RLX);
                continue;
            }
            struct osub_seg_slot *sl = &s->slot[i];
            for (int d = 0; d < OSUB_SEG_DEVICES; d++)
                atomic_store_explicit(&sl->reserved_bytes[d], 0, RLX);
            atomic_store_explicit(&sl->allocs, 0, RLX);
            atomic_store_explicit(&sl->frees, 0, RLX);
            atomic_store_explicit(&sl->refused, 0, RLX);
            atomic_store_explicit(&sl->pid, (int32_t)getpid(), RLX);
            st = OSUB_SLOT_CLAIMING;
            if (atomic_compare_exchange_strong_explicit(&sl->state, &st, OSUB_SLOT_LIVE, ACQREL,
                                                        RLX))
                return i;
            /* reclaimed under us as abandoned: let it go and look again */
            slot_lock(g, i, F_OFD_SETLK, F_UNLCK);
        }
        osub_seg_reclaim(g, NULL);
    }
    return -ENOSPC;
}

void osub_seg_unclaim(struct osub_segment *g, int slot)
{
    if (slot < 0 || slot >= (int)g->n_slots)
        return;
    uint32_t st = OSUB_SLOT_LIVE;
    if (!atomic_compare_exchange_strong_explicit(&g->s->slot[slot].state, &st, OSUB_SLOT_RECLAIMING,
                                                 ACQREL, RLX))
        return;
    free_slot(g, slot, true, NULL);
}

int osub_seg_reserve(struct osub_segment *g, int slot, uint32_t dev, uint64_t bytes)
{
    struct osub_seg *s = g->s;
    if (dev >= g->n_devices || slot < 0 || slot >= (int)g->n_slots)
        return -EINVAL;
    struct osub_seg_dev *d = &s->dev[dev];
    struct osub_seg_slot *sl = &s->slot[slot];
    uint64_t cur = atomic_load_explicit(&d->reserved_bytes, RLX);
    for (;;) {
        uint64_t grant = atomic_load_explicit(&d->grant_bytes, ACQ);
        if (bytes > grant || cur > grant - bytes) {
            atomic_fetch_add_explicit(&d->refused, 1, RLX);
            atomic_fetch_add_explicit(&sl->refused, 1, RLX);
            return -ENOMEM;
        }
        if (atomic_compare_exchange_weak_explicit(&d->reserved_bytes, &cur, cur + bytes, ACQREL,
                                                  RLX))
            break;
    }
    /* the device counter first: a death here leaves it high (safe), see segment.h */
    atomic_fetch_add_explicit(&sl->reserved_bytes[dev], bytes, RLX);
    atomic_fetch_add_explicit(&sl->allocs, 1, RLX);
    max_into(&d->peak_bytes, cur + bytes);
    return 0;
}

void osub_seg_release(struct osub_segment *g, int slot, uint32_t dev, uint64_t bytes)
{
    struct osub_seg *s = g->s;
    if (dev >= g->n_devices || slot < 0 || slot >= (int)g->n_slots)
        return;
    /* the slot first, then the device: a death between leaves the device high (safe) */
    uint64_t took = sub_clamped(&s->slot[slot].reserved_bytes[dev], bytes);
    sub_clamped(&s->dev[dev].reserved_bytes, took);
    atomic_fetch_add_explicit(&s->slot[slot].frees, 1, RLX);
}

void osub_seg_set_grant(struct osub_segment *g, uint32_t dev, uint64_t bytes)
{
    if (dev >= g->n_devices)
        return;
    atomic_store_explicit(&g->s->dev[dev].grant_bytes, bytes, REL);
    atomic_fetch_add_explicit(&g->s->generation, 1, REL);
}

uint64_t osub_seg_grant(const struct osub_segment *g, uint32_t dev)
{
    return dev < g->n_devices ? atomic_load_explicit(&g->s->dev[dev].grant_bytes, ACQ) : 0;
}

uint64_t osub_seg_reserved(const struct osub_segment *g, uint32_t dev)
{
    return dev < g->n_devices ? atomic_load_explicit(&g->s->dev[dev].reserved_bytes, ACQ) : 0;
}

int osub_seg_check(struct osub_segment *g, bool repair, char *why, size_t whylen)
{
    volatile struct osub_seg *s = g->s;
    const char *field = NULL;
    uint32_t got = 0, want = 0;
#define CHECK(f, w)                                                                                \
    do {                                                                                           \
        uint32_t v_ = s->f;                                                                        \
        if (field == NULL && v_ != (w)) {                                                          \
            field = #f;                                                                            \
            got = v_;                                                                              \
            want = (w);                                                                            \
        }                                                                                          \
    } while (0)
    CHECK(magic, OSUB_SEG_MAGIC);
    CHECK(version, OSUB_SEG_VERSION);
    CHECK(size, (uint32_t)sizeof(struct osub_seg));
    CHECK(n_devices, g->n_devices);
    CHECK(n_slots, g->n_slots);
    CHECK(slot_offset, (uint32_t)offsetof(struct osub_seg, slot));
    CHECK(slot_size, (uint32_t)sizeof(struct osub_seg_slot));
#undef CHECK
    if (field == NULL)
        return 0;
    if (why != NULL)
        snprintf(why, whylen, "its header was rewritten (%s is %u, not %u)", field, got, want);
    if (repair) {
        s->magic = OSUB_SEG_MAGIC;
        s->version = OSUB_SEG_VERSION;
        s->size = (uint32_t)sizeof(struct osub_seg);
        s->n_devices = g->n_devices;
        s->n_slots = g->n_slots;
        s->slot_offset = (uint32_t)offsetof(struct osub_seg, slot);
        s->slot_size = (uint32_t)sizeof(struct osub_seg_slot);
    }
    return -EPROTO;
}

/* no device holds a pebibyte: a figure above this is a lie, whatever the pool */
#define SEG_PLAUSIBLE_BYTES (1ull << 50)

int osub_seg_view(const struct osub_segment *g, uint64_t max_bytes, struct osub_seg_view *v,
                  char *why, size_t whylen)
{
    const struct osub_seg *s = g->s;
    uint64_t cap =
        max_bytes > 0 && max_bytes < SEG_PLAUSIBLE_BYTES ? max_bytes : SEG_PLAUSIBLE_BYTES;
    int rc = 0;
    uint64_t got = v->got;
    memset(v, 0, sizeof(*v));
    v->got = got;
    v->n = g->n_devices <= OSUB_SEG_DEVICES ? g->n_devices : OSUB_SEG_DEVICES;
    v->live = osub_seg_live(g);
    for (uint32_t i = 0; i < v->n; i++) {
        v->grant[i] = osub_seg_grant(g, i);
        uint64_t held = osub_seg_reserved(g, i);
        uint64_t peak = atomic_load_explicit(&s->dev[i].peak_bytes, RLX);
        if (held > cap) {
            if (rc == 0 && why != NULL)
                snprintf(why, whylen,
                         "it says %llu bytes are held on its device %u, more than %llu",
                         (unsigned long long)held, i, (unsigned long long)cap);
            rc = -ERANGE;
            held = cap;
        }
        v->held[i] = held;
        v->peak[i] = peak < cap ? peak : cap;
        uint64_t r = atomic_load_explicit(&s->dev[i].refused, RLX);
        v->refused = v->refused + r < v->refused ? UINT64_MAX : v->refused + r;
    }
    v->reclaimed = atomic_load_explicit(&s->reclaimed_bytes, RLX);
    return rc;
}
