/* segment.h - the per-service grant segment: a small shared file that oversubd owns and every
 * process of one service maps, through which the CUDA shim reserves device memory against the
 * service's grant (docs/shim.md).
 *
 * Rules (the failures of HAMi-core, research/hami.md, are what they avoid):
 * - No cross-process lock. Admission is one compare-and-swap on the device's `reserved`
 *   counter against its `grant`: two processes cannot both pass a check that only one fits.
 * - A process is alive while it holds an open-file-description lock on its slot's byte of the
 *   file (F_OFD_SETLK, taken at claim, never waited for); the kernel drops it when the process
 *   dies, however it dies, in whatever PID namespace. A slot that is LIVE with no lock is a
 *   dead process: its reservations are reclaimed.
 * - Every subtraction is clamped at zero. Updates are ordered so that a process killed between
 *   two of them leaves the device counter too high, never too low (fail safe: no
 *   over-admission); when no process of the service is left, the counter is exact again.
 * - Versioned header; a segment of another version or size is refused, never guessed at.
 */
#ifndef OSUB_SHIM_SEGMENT_H
#define OSUB_SHIM_SEGMENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define OSUB_SEG_MAGIC 0x31475355u /* "USG1" */
#define OSUB_SEG_VERSION 1u
#define OSUB_SEG_DEVICES 16
#define OSUB_SEG_SLOTS 256
/* a slot being claimed whose claimer holds no lock after this long was abandoned */
#define OSUB_SEG_CLAIM_STALE_NS 10000000000ull

enum {
    OSUB_SLOT_FREE = 0,
    OSUB_SLOT_CLAIMING = 1,
    OSUB_SLOT_LIVE = 2,
    OSUB_SLOT_RECLAIMING = 3,
};

struct osub_seg_dev {
    _Atomic uint64_t grant_bytes;    /* what the service may hold here; written by oversubd */
    _Atomic uint64_t reserved_bytes; /* reserved by its processes: the admission counter */
    _Atomic uint64_t peak_bytes;     /* highest reserved_bytes seen */
    _Atomic uint64_t refused;        /* allocations refused for the grant */
    uint64_t pad[4];
};

struct osub_seg_slot {
    _Atomic uint32_t state;      /* OSUB_SLOT_* */
    _Atomic int32_t pid;         /* in the claimer's PID namespace; for people, not liveness */
    _Atomic uint64_t claimed_ns; /* CLOCK_BOOTTIME of the claim, 0 when free */
    _Atomic uint64_t reserved_bytes[OSUB_SEG_DEVICES];
    _Atomic uint64_t allocs, frees, refused;
    uint64_t pad[5];
};

struct osub_seg {
    uint32_t magic, version;
    uint32_t size;      /* bytes of the whole file */
    uint32_t n_devices; /* device ordinals 0..n_devices-1 (as CUDA_VISIBLE_DEVICES numbers them) */
    uint32_t n_slots, slot_offset, slot_size, pad0;
    _Atomic uint64_t generation;      /* bumped by oversubd at each grant change */
    _Atomic uint64_t reclaimed_bytes; /* taken back from processes that died holding them */
    _Atomic uint64_t reclaimed_slots;
    _Atomic uint64_t epoch; /* bumped by every claim and every slot freed: a reclaim resets
                             * the counters only if no slot changed hands while it looked */
    uint64_t pad1[4];
    char service[64];
    struct osub_seg_dev dev[OSUB_SEG_DEVICES];
    struct osub_seg_slot slot[OSUB_SEG_SLOTS];
};

/* A mapping of one segment: the caller allocates it; _cleanup unmaps and closes. */
struct osub_segment {
    int fd;       /* the description this process's slot locks are held through */
    int probe_fd; /* another description of the same file: F_OFD_GETLK ignores locks held
                   * through the asking description, so liveness is asked through this one */
    struct osub_seg *s;
    /* The geometry, copied at creation (or at a validated open): every loop and index is
     * bounded by these, never by the header, which any process of the service can rewrite. */
    uint32_t n_devices;
    uint32_t n_slots;
};

/* What oversubd reads of a segment each watch round (osub_seg_view). Every figure is bounded:
 * n <= the geometry's devices, held/peak clamped to what a device can be. */
struct osub_seg_view {
    uint32_t n;
    int live;
    uint64_t grant[OSUB_SEG_DEVICES], held[OSUB_SEG_DEVICES], peak[OSUB_SEG_DEVICES];
    uint64_t refused, reclaimed, got;
};

/* Creates the segment file `path` (must not exist: O_EXCL, symlinks not followed), mode 0600,
 * owned by uid:gid when uid is not (uid_t)-1, granting grant_bytes[i] on device i < n_devices,
 * and maps it. 0 or a negative errno with a sentence in err. */
int osub_seg_create(struct osub_segment *g, const char *path, uid_t uid, gid_t gid,
                    const char *service, uint32_t n_devices, const uint64_t *grant_bytes, char *err,
                    size_t errlen);
/* Creates an anonymous segment (memfd) for one process tree: standalone use of the shim. */
int osub_seg_create_anon(struct osub_segment *g, uint32_t n_devices, uint64_t grant_bytes,
                         char *err, size_t errlen);
/* Maps an existing segment read-write (symlinks not followed); refuses another magic, version
 * or size. 0 or a negative errno with a sentence in err. */
int osub_seg_open(struct osub_segment *g, const char *path, char *err, size_t errlen);
/* Unmaps and closes (the process's slot lock goes with its last descriptor). NULL-safe. */
void osub_seg_cleanup(struct osub_segment *g);

/* Claims a slot for the calling process and locks it. The slot index, or -ENOSPC when every
 * slot is taken by a live process (dead ones are reclaimed first), or another negative errno. */
int osub_seg_claim(struct osub_segment *g);
/* Gives the slot back on a clean exit: its reservations are released. */
void osub_seg_unclaim(struct osub_segment *g, int slot);

/* Reserves bytes on device dev for slot: 0, or -ENOMEM when it would pass the grant (counted
 * as refused), -EINVAL for a device beyond the segment's. Never blocks. */
int osub_seg_reserve(struct osub_segment *g, int slot, uint32_t dev, uint64_t bytes);
/* Gives back up to bytes (clamped at what the slot holds there). */
void osub_seg_release(struct osub_segment *g, int slot, uint32_t dev, uint64_t bytes);

/* Finds the slots of processes that died and takes their reservations back. Returns the number
 * of slots reclaimed; *bytes (may be NULL) gets the bytes. When no process is left, the device
 * counters are reset to exact zero. Safe to run from any process at any time. */
int osub_seg_reclaim(struct osub_segment *g, uint64_t *bytes);
/* Number of live processes (LIVE slots whose lock is held). */
int osub_seg_live(const struct osub_segment *g);

/* Whether the header still says what the geometry copy says (magic, version, size, devices,
 * slots, slot layout): 0, or -EPROTO with a sentence in why naming the first field that
 * differs. A process of the service that rewrote it is at fault; with repair, the header is
 * written back to the true geometry so the service's own shims read it right again. */
int osub_seg_check(struct osub_segment *g, bool repair, char *why, size_t whylen);
/* Fills v from the segment, bounded by the geometry copy; a figure no device can hold (held
 * beyond max_bytes when max_bytes > 0, or beyond 2^50) is reported in why and the call returns
 * -ERANGE (v is still filled, clamped). 0 when every figure is plausible. */
int osub_seg_view(const struct osub_segment *g, uint64_t max_bytes, struct osub_seg_view *v,
                  char *why, size_t whylen);

/* Sets the grant of device dev and bumps the generation (oversubd's side). */
void osub_seg_set_grant(struct osub_segment *g, uint32_t dev, uint64_t bytes);
uint64_t osub_seg_grant(const struct osub_segment *g, uint32_t dev);
uint64_t osub_seg_reserved(const struct osub_segment *g, uint32_t dev);

#endif
