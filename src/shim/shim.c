/* shim.c - liboversub-cuda.so: preloaded into a service's processes, it reserves device memory
 * against the service's grant before the CUDA driver allocates it, and answers
 * CUDA_ERROR_OUT_OF_MEMORY past it (docs/shim.md).
 *
 * Reached three ways: by linking (our exported symbols come before libcuda's), by dlsym on a
 * dlopen'ed libcuda.so.1 (dlsym is interposed), and by cuGetProcAddress(_v2) (interposed; the
 * CUDA runtime resolves every entry point through it). The grant lives in the service's segment
 * (segment.h, OVERSUB_SHIM_SEGMENT) or, standalone, comes from OVERSUB_VRAM_MIB.
 *
 * Never exits, never raises a signal, never blocks on another process. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "segment.h"

#define SHIM_API __attribute__((visibility("default")))

/* ---- the real driver ---------------------------------------------------------------------- */

#define REAL_FUNCS(X)                                                                              \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                      \
    X(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))                 \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))                                    \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                                          \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))                                     \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                    \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))               \
    X(cuMemFree_v2, (CUdeviceptr))                                                                 \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                     \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))                                                \
    X(cuMemCreate,                                                                                 \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))   \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                                \
    X(cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))                                \
    X(cuArray3DCreate_v2, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))                            \
    X(cuArrayDestroy, (CUarray))                                                                   \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int)) \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray))                                                 \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                                       \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                                   \
    X(cuCtxGetDevice, (CUdevice *))                                                                \
    X(cuArrayGetMemoryRequirements, (CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUarray, CUdevice))         \
    X(cuMipmappedArrayGetMemoryRequirements,                                                       \
      (CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUmipmappedArray, CUdevice))                              \
    X(cuGetProcAddress, (const char *, void **, int, cuuint64_t))                                  \
    X(cuGetProcAddress_v2,                                                                         \
      (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))

/* the prototypes of what we export under the driver's names (and two we only call) */
#define X(name, args) SHIM_API CUresult name args;
REAL_FUNCS(X)
#undef X

static struct {
    void *lib;
#define X(name, args) CUresult(*name) args;
    REAL_FUNCS(X)
#undef X
} real;

/* dlsym as libc has it; the trampoline below jumps to it (hidden: not part of our ABI) */
__attribute__((visibility("hidden"))) void *(*osub__real_dlsym)(void *, const char *);

static void resolve_dlsym(void)
{
    if (osub__real_dlsym != NULL)
        return;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && !osub__real_dlsym; i++)
        *(void **)&osub__real_dlsym = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

/* ---- state -------------------------------------------------------------------------------- */

enum shim_mode {
    MODE_OFF,    /* no grant configured: pass everything through */
    MODE_ON,     /* reserving against the segment */
    MODE_BROKEN, /* a grant was configured but cannot be used: refuse every allocation */
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static enum shim_mode mode = MODE_OFF;
static struct osub_segment seg = {.fd = -1, .probe_fd = -1, .s = NULL};
static int my_slot = -1;
static bool verbose;
static _Atomic int told_refusal;
static __thread int in_shim_init;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t w = write(2, line, (size_t)n);
    (void)w;
}

/* ---- what this process holds: (kind, key) -> (device, bytes), open addressing ---------------- */

enum kind { K_EMPTY = 0, K_PTR, K_HANDLE, K_ARRAY, K_MIPMAP };

struct ent {
    uint64_t key;
    uint32_t kind;
    uint32_t dev;
    uint64_t bytes;
};

static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ent *tab;
static size_t tab_cap, tab_n; /* cap is a power of two; kept at most half full */

static size_t slot_of(uint64_t key, uint32_t kind, size_t cap)
{
    uint64_t h = (key ^ ((uint64_t)kind << 61)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static int tab_grow(void)
{
    size_t cap = tab_cap ? tab_cap * 2 : 1024;
    struct ent *t = calloc(cap, sizeof(*t));
    if (t == NULL)
        return -1;
    for (size_t i = 0; i < tab_cap; i++) {
        if (tab[i].kind == K_EMPTY)
            continue;
        size_t j = slot_of(tab[i].key, tab[i].kind, cap);
        while (t[j].kind != K_EMPTY)
            j = (j + 1) & (cap - 1);
        t[j] = tab[i];
    }
    free(tab);
    tab = t;
    tab_cap = cap;
    return 0;
}

/* 0, or -1 when out of memory (the caller undoes the allocation) */
static void give(uint32_t dev, uint64_t bytes);

static int remember(enum kind kind, uint64_t key, uint32_t dev, uint64_t bytes)
{
    pthread_mutex_lock(&tab_mu);
    if ((tab_n + 1) * 2 > tab_cap && tab_grow() != 0) {
        pthread_mutex_unlock(&tab_mu);
        return -1;
    }
    size_t j = slot_of(key, kind, tab_cap);
    while (tab[j].kind != K_EMPTY && !(tab[j].kind == kind && tab[j].key == key))
        j = (j + 1) & (tab_cap - 1);
    struct ent stale = tab[j];
    if (tab[j].kind == K_EMPTY)
        tab_n++;
    tab[j] = (struct ent){.key = key, .kind = kind, .dev = dev, .bytes = bytes};
    pthread_mutex_unlock(&tab_mu);
    /* the driver handed out a key we still held: it was freed without us (a context destroyed
     * or reset frees everything in it), so what it held goes back to the grant */
    if (stale.kind != K_EMPTY)
        give(stale.dev, stale.bytes);
    return 0;
}

/* Removes (kind, key); true with *out filled when it was there. */
static bool forget(enum kind kind, uint64_t key, struct ent *out)
{
    bool found = false;
    pthread_mutex_lock(&tab_mu);
    if (tab_cap == 0)
        goto done;
    size_t j = slot_of(key, kind, tab_cap);
    while (tab[j].kind != K_EMPTY && !(tab[j].kind == kind && tab[j].key == key))
        j = (j + 1) & (tab_cap - 1);
    if (tab[j].kind == K_EMPTY)
        goto done;
    *out = tab[j];
    found = true;
    tab_n--;
    /* backward-shift deletion: no tombstones */
    size_t hole = j;
    for (size_t k = (j + 1) & (tab_cap - 1); tab[k].kind != K_EMPTY; k = (k + 1) & (tab_cap - 1)) {
        size_t home = slot_of(tab[k].key, tab[k].kind, tab_cap);
        /* k may move to the hole when its home is not in (hole, k] cyclically */
        bool between = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
        if (!between) {
            tab[hole] = tab[k];
            hole = k;
        }
    }
    tab[hole].kind = K_EMPTY;
done:
    pthread_mutex_unlock(&tab_mu);
    return found;
}

/* ---- set-up ------------------------------------------------------------------------------- */

static void on_fork_child(void)
{
    /* The child shares the parent's open file description, so the parent's slot lock too:
     * take a description of its own, claim a slot of its own. What the parent allocated is
     * not the child's to free. */
    if (mode != MODE_ON)
        return;
    free(tab);
    tab = NULL;
    tab_cap = tab_n = 0;
    pthread_mutex_init(&tab_mu, NULL);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", seg.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        mode = MODE_BROKEN;
        say("oversub-cuda: after fork, cannot reopen the grant segment: %s; refusing device "
            "memory",
            strerror(errno));
        return;
    }
    close(seg.fd);
    seg.fd = fd;
    my_slot = osub_seg_claim(&seg);
    if (my_slot < 0) {
        mode = MODE_BROKEN;
        say("oversub-cuda: after fork, no slot in the grant segment (%s); refusing device memory",
            strerror(-my_slot));
    }
}

static bool parse_mib(const char *s, uint64_t *bytes)
{
    if (s == NULL || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > (UINT64_MAX >> 20))
        return false;
    *bytes = (uint64_t)v << 20;
    return true;
}

static void shim_init(void)
{
    in_shim_init = 1;
    resolve_dlsym();
    verbose = getenv("OVERSUB_SHIM_LOG") != NULL && strcmp(getenv("OVERSUB_SHIM_LOG"), "0") != 0;
    const char *libpath = getenv("OVERSUB_SHIM_LIBCUDA");
    if (libpath == NULL || *libpath == '\0')
        libpath = "libcuda.so.1";
    real.lib = dlopen(libpath, RTLD_NOW | RTLD_LOCAL);
    if (real.lib != NULL && osub__real_dlsym != NULL) {
#define X(name, args) *(void **)&real.name = osub__real_dlsym(real.lib, #name);
        REAL_FUNCS(X)
#undef X
    }
    const char *segpath = getenv("OVERSUB_SHIM_SEGMENT");
    const char *vram = getenv("OVERSUB_VRAM_MIB");
    char err[256];
    if (segpath != NULL && *segpath != '\0') {
        int rc = osub_seg_open(&seg, segpath, err, sizeof(err));
        if (rc == 0) {
            my_slot = osub_seg_claim(&seg);
            if (my_slot < 0)
                snprintf(err, sizeof(err), "no free slot in %s (%s)", segpath, strerror(-my_slot));
        }
        if (rc != 0 || my_slot < 0) {
            mode = MODE_BROKEN;
            say("oversub-cuda: %s; refusing device memory rather than exceed the grant", err);
        } else {
            mode = MODE_ON;
        }
    } else if (vram != NULL && *vram != '\0') {
        uint64_t bytes;
        if (!parse_mib(vram, &bytes)) {
            mode = MODE_BROKEN;
            say("oversub-cuda: OVERSUB_VRAM_MIB='%.32s' is not a whole number of MiB (at most "
                "%" PRIu64 "); refusing device memory",
                vram, UINT64_MAX >> 20);
        } else if (osub_seg_create_anon(&seg, OSUB_SEG_DEVICES, bytes, err, sizeof(err)) != 0 ||
                   (my_slot = osub_seg_claim(&seg)) < 0) {
            mode = MODE_BROKEN;
            say("oversub-cuda: %s; refusing device memory", err);
        } else {
            mode = MODE_ON;
        }
    }
    if (mode != MODE_OFF)
        pthread_atfork(NULL, NULL, on_fork_child);
    if (verbose)
        say("oversub-cuda: %s (driver %s%s)",
            mode == MODE_ON    ? "enforcing the grant"
            : mode == MODE_OFF ? "no grant: passing through"
                               : "refusing",
            libpath, real.lib ? "" : ": not loaded");
    in_shim_init = 0;
}

static inline void ensure_init(void)
{
    if (!in_shim_init)
        pthread_once(&init_once, shim_init);
}

__attribute__((constructor)) static void shim_load(void)
{
    resolve_dlsym();
}

/* No destructor gives the slot back at exit: another thread may still be allocating. The
 * slot's lock goes with the process and the reservations are reclaimed (by oversubd within a
 * watch round, or by any process of the service before it refuses). */

/* ---- reserving ---------------------------------------------------------------------------- */

static CUresult current_device(uint32_t *dev)
{
    if (real.cuCtxGetDevice == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUdevice d;
    CUresult rc = real.cuCtxGetDevice(&d);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (d < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = (uint32_t)d;
    return CUDA_SUCCESS;
}

static void tell_refusal(uint32_t dev, uint64_t bytes)
{
    if (!verbose && atomic_exchange(&told_refusal, 1) != 0)
        return;
    if (mode != MODE_ON) {
        say("oversub-cuda: refused %" PRIu64 " MiB on device %u: no usable grant (see the first "
            "line this library printed)",
            (bytes + (1u << 20) - 1) >> 20, dev);
        return;
    }
    say("oversub-cuda: refused %" PRIu64 " MiB on device %u: grant %" PRIu64 " MiB, %" PRIu64
        " MiB reserved by the service%s",
        (bytes + (1u << 20) - 1) >> 20, dev, osub_seg_grant(&seg, dev) >> 20,
        osub_seg_reserved(&seg, dev) >> 20,
        verbose ? ""
                : " (further refusals are counted, not printed; OVERSUB_SHIM_LOG=1 prints them)");
}

/* Reserves bytes on dev: CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY past the grant. */
static CUresult take(uint32_t dev, uint64_t bytes)
{
    if (mode == MODE_BROKEN || dev >= OSUB_SEG_DEVICES) {
        tell_refusal(dev, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (osub_seg_reserve(&seg, my_slot, dev, bytes) == 0)
        return CUDA_SUCCESS;
    /* a process of the service that died may still hold part of the grant: take it back (no
     * waiting on anyone; oversubd does the same on its own) and try once more */
    if (osub_seg_reclaim(&seg, NULL) > 0 && osub_seg_reserve(&seg, my_slot, dev, bytes) == 0)
        return CUDA_SUCCESS;
    tell_refusal(dev, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static void give(uint32_t dev, uint64_t bytes)
{
    if (mode == MODE_ON)
        osub_seg_release(&seg, my_slot, dev, bytes);
}

/* Moves a reservation from what was guessed to what the driver says it took. */
static CUresult settle(uint32_t dev, uint64_t guessed, uint64_t actual)
{
    if (actual > guessed)
        return take(dev, actual - guessed);
    give(dev, guessed - actual);
    return CUDA_SUCCESS;
}

#define PASS(name, ...) (real.name != NULL ? real.name(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* One allocation of `bytes` through fn, remembered under the device pointer it returns. */
#define ALLOC_PTR(name, dptr, bytes, ...)                                                          \
    do {                                                                                           \
        ensure_init();                                                                             \
        if (real.name == NULL)                                                                     \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        if (mode == MODE_OFF || in_shim_init)                                                      \
            return real.name(dptr, __VA_ARGS__);                                                   \
        uint32_t dev;                                                                              \
        CUresult rc = current_device(&dev);                                                        \
        if (rc == CUDA_SUCCESS)                                                                    \
            rc = take(dev, bytes);                                                                 \
        if (rc != CUDA_SUCCESS)                                                                    \
            return rc;                                                                             \
        rc = real.name(dptr, __VA_ARGS__);                                                         \
        if (rc != CUDA_SUCCESS) {                                                                  \
            give(dev, bytes);                                                                      \
            return rc;                                                                             \
        }                                                                                          \
        if (remember(K_PTR, *(dptr), dev, bytes) != 0) {                                           \
            PASS(cuMemFree_v2, *(dptr));                                                           \
            give(dev, bytes);                                                                      \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                       \
        }                                                                                          \
        return CUDA_SUCCESS;                                                                       \
    } while (0)

/* Frees through fn; gives back what the key held once the driver says it is freed. */
static CUresult free_through(enum kind kind, uint64_t key, CUresult rc_of_free, bool had,
                             const struct ent *e)
{
    if (!had)
        return rc_of_free;
    if (rc_of_free == CUDA_SUCCESS)
        give(e->dev, e->bytes);
    else if (remember(kind, key, e->dev, e->bytes) != 0)
        give(e->dev, e->bytes); /* cannot keep track of it any more: do not leak the grant */
    return rc_of_free;
}

#define FREE_KEY(kind, name, key, ...)                                                             \
    do {                                                                                           \
        ensure_init();                                                                             \
        if (real.name == NULL)                                                                     \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        if (mode == MODE_OFF || in_shim_init)                                                      \
            return real.name(__VA_ARGS__);                                                         \
        struct ent e;                                                                              \
        bool had = forget(kind, (uint64_t)(key), &e);                                              \
        return free_through(kind, (uint64_t)(key), real.name(__VA_ARGS__), had, &e);               \
    } while (0)

/* ---- the interposed entry points ---------------------------------------------------------- */

SHIM_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ALLOC_PTR(cuMemAlloc_v2, dptr, bytesize, bytesize);
}

SHIM_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ALLOC_PTR(cuMemAllocManaged, dptr, bytesize, bytesize, flags);
}

SHIM_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    ALLOC_PTR(cuMemAllocAsync, dptr, bytesize, bytesize, s);
}

SHIM_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    ALLOC_PTR(cuMemAllocAsync_ptsz, dptr, bytesize, bytesize, s);
}

SHIM_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                          CUstream s)
{
    ALLOC_PTR(cuMemAllocFromPoolAsync, dptr, bytesize, bytesize, pool, s);
}

SHIM_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                               CUmemoryPool pool, CUstream s)
{
    ALLOC_PTR(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, bytesize, pool, s);
}

SHIM_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    FREE_KEY(K_PTR, cuMemFree_v2, dptr, dptr);
}

SHIM_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    FREE_KEY(K_PTR, cuMemFreeAsync, dptr, dptr, s);
}

SHIM_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
    FREE_KEY(K_PTR, cuMemFreeAsync_ptsz, dptr, dptr, s);
}

/* The pitch is the driver's choice: reserve a row rounded to 512 bytes, then settle on
 * pitch x height once the driver has said. */
SHIM_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                     unsigned int elem)
{
    ensure_init();
    if (real.cuMemAllocPitch_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (mode == MODE_OFF || in_shim_init)
        return real.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    uint64_t guess;
    if (width > SIZE_MAX - 511 ||
        __builtin_mul_overflow((uint64_t)((width + 511) & ~(size_t)511), (uint64_t)height, &guess))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint32_t dev;
    CUresult rc = current_device(&dev);
    if (rc == CUDA_SUCCESS)
        rc = take(dev, guess);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS) {
        give(dev, guess);
        return rc;
    }
    uint64_t actual;
    if (__builtin_mul_overflow((uint64_t)*pitch, (uint64_t)height, &actual))
        actual = UINT64_MAX;
    if (settle(dev, guess, actual) != CUDA_SUCCESS) {
        PASS(cuMemFree_v2, *dptr);
        give(dev, guess);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (remember(K_PTR, *dptr, dev, actual) != 0) {
        PASS(cuMemFree_v2, *dptr);
        give(dev, actual);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* Virtual memory management: only physical memory placed on a device counts. */
SHIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags)
{
    ensure_init();
    if (real.cuMemCreate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (mode == MODE_OFF || in_shim_init || prop == NULL || handle == NULL ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0)
        return real.cuMemCreate(handle, size, prop, flags);
    uint32_t dev = (uint32_t)prop->location.id;
    CUresult rc = take(dev, size);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = real.cuMemCreate(handle, size, prop, flags);
    if (rc != CUDA_SUCCESS) {
        give(dev, size);
        return rc;
    }
    if (remember(K_HANDLE, *handle, dev, size) != 0) {
        PASS(cuMemRelease, *handle);
        give(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

SHIM_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FREE_KEY(K_HANDLE, cuMemRelease, handle, handle);
}

/* Bytes per element of a CUarray_format; 16 (the widest) for a format not known here, so an
 * unknown one is over-counted rather than under. */
static uint64_t format_bytes(int format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 16;
    }
}

/* w x max(h,1) x max(d,1) x channels x element bytes; UINT64_MAX on overflow */
static uint64_t array_bytes(size_t w, size_t h, size_t d, int format, unsigned int channels)
{
    uint64_t b = format_bytes(format), r;
    uint64_t dims[4] = {w, h ? h : 1, d ? d : 1, channels ? channels : 1};
    r = b;
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(r, dims[i], &r))
            return UINT64_MAX;
    return r;
}

/* An array made by `made` (already reserved as guess): settle on the driver's own size when it
 * can tell (cuArrayGetMemoryRequirements, CUDA 11.6+), remember it, or undo. */
static CUresult keep_array(enum kind kind, void *handle, uint32_t dev, uint64_t guess)
{
    uint64_t actual = guess;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    memset(&req, 0, sizeof(req));
    if (kind == K_ARRAY && real.cuArrayGetMemoryRequirements != NULL &&
        real.cuArrayGetMemoryRequirements(&req, (CUarray)handle, (CUdevice)dev) == CUDA_SUCCESS)
        actual = req.size;
    if (kind == K_MIPMAP && real.cuMipmappedArrayGetMemoryRequirements != NULL &&
        real.cuMipmappedArrayGetMemoryRequirements(&req, (CUmipmappedArray)handle, (CUdevice)dev) ==
            CUDA_SUCCESS)
        actual = req.size;
    CUresult rc = settle(dev, guess, actual);
    if (rc == CUDA_SUCCESS && remember(kind, (uint64_t)(uintptr_t)handle, dev, actual) == 0)
        return CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS)
        give(dev, actual);
    else
        give(dev, guess);
    if (kind == K_ARRAY)
        PASS(cuArrayDestroy, (CUarray)handle);
    else
        PASS(cuMipmappedArrayDestroy, (CUmipmappedArray)handle);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

#define ARRAY_CREATE(kind, name, out, guess, ...)                                                  \
    do {                                                                                           \
        ensure_init();                                                                             \
        if (real.name == NULL)                                                                     \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        if (mode == MODE_OFF || in_shim_init)                                                      \
            return real.name(out, __VA_ARGS__);                                                    \
        uint32_t dev;                                                                              \
        CUresult rc = current_device(&dev);                                                        \
        if (rc == CUDA_SUCCESS)                                                                    \
            rc = take(dev, guess);                                                                 \
        if (rc != CUDA_SUCCESS)                                                                    \
            return rc;                                                                             \
        rc = real.name(out, __VA_ARGS__);                                                          \
        if (rc != CUDA_SUCCESS) {                                                                  \
            give(dev, guess);                                                                      \
            return rc;                                                                             \
        }                                                                                          \
        return keep_array(kind, (void *)*(out), dev, guess);                                       \
    } while (0)

SHIM_API CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    uint64_t guess =
        desc ? array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels) : 0;
    ARRAY_CREATE(K_ARRAY, cuArrayCreate_v2, arr, guess, desc);
}

SHIM_API CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    uint64_t guess =
        desc ? array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels)
             : 0;
    ARRAY_CREATE(K_ARRAY, cuArray3DCreate_v2, arr, guess, desc);
}

SHIM_API CUresult cuArrayDestroy(CUarray arr)
{
    FREE_KEY(K_ARRAY, cuArrayDestroy, (uintptr_t)arr, arr);
}

SHIM_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                         unsigned int levels)
{
    uint64_t guess = 0;
    if (desc != NULL) {
        size_t w = desc->Width, h = desc->Height, d = desc->Depth;
        for (unsigned int l = 0; l < (levels ? levels : 1) && l < 64; l++) {
            uint64_t b = array_bytes(w, h, d, desc->Format, desc->NumChannels);
            guess = (b == UINT64_MAX || guess > UINT64_MAX - b) ? UINT64_MAX : guess + b;
            w = w > 1 ? w / 2 : 1;
            h = h > 1 ? h / 2 : h;
            d = d > 1 ? d / 2 : d;
        }
    }
    ARRAY_CREATE(K_MIPMAP, cuMipmappedArrayCreate, arr, guess, desc, levels);
}

SHIM_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr)
{
    FREE_KEY(K_MIPMAP, cuMipmappedArrayDestroy, (uintptr_t)arr, arr);
}

/* What a framework sizes its caches by: the grant is the card. Clamped, never negative. */
SHIM_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    ensure_init();
    CUresult rc = PASS(cuMemGetInfo_v2, free_bytes, total_bytes);
    if (rc != CUDA_SUCCESS || mode == MODE_OFF || in_shim_init || free_bytes == NULL ||
        total_bytes == NULL)
        return rc;
    uint32_t dev;
    uint64_t grant = 0, held = 0;
    if (mode == MODE_ON && current_device(&dev) == CUDA_SUCCESS) {
        osub_seg_reclaim(&seg, NULL); /* what dead processes held is room again */
        grant = osub_seg_grant(&seg, dev);
        held = osub_seg_reserved(&seg, dev);
    }
    uint64_t room = grant > held ? grant - held : 0;
    if ((uint64_t)*total_bytes > grant)
        *total_bytes = (size_t)grant;
    if ((uint64_t)*free_bytes > room)
        *free_bytes = (size_t)room;
    return CUDA_SUCCESS;
}

SHIM_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ensure_init();
    CUresult rc = PASS(cuDeviceTotalMem_v2, bytes, dev);
    if (rc != CUDA_SUCCESS || mode == MODE_OFF || in_shim_init || bytes == NULL)
        return rc;
    uint64_t grant = mode == MODE_ON && dev >= 0 ? osub_seg_grant(&seg, (uint32_t)dev) : 0;
    if ((uint64_t)*bytes > grant)
        *bytes = (size_t)grant;
    return CUDA_SUCCESS;
}

/* ---- the ways in: by name, by version ----------------------------------------------------- */

typedef void (*any_fn)(void);

/* a function as the void * that dlsym and cuGetProcAddress hand out (POSIX allows it) */
static void *fn_ptr(any_fn f)
{
    void *p;
    _Static_assert(sizeof(p) == sizeof(f), "function and object pointers have one size");
    memcpy(&p, &f, sizeof(p));
    return p;
}

/* Our entry points under their exported names (what dlsym is asked for). */
static const struct {
    const char *name;
    any_fn fn;
} exported[] = {
#define E(n)                                                                                       \
    {                                                                                              \
#n, (any_fn)n                                                                              \
    }
    E(cuMemAlloc_v2),
    E(cuMemAllocPitch_v2),
    E(cuMemAllocManaged),
    E(cuMemAllocAsync),
    E(cuMemAllocAsync_ptsz),
    E(cuMemAllocFromPoolAsync),
    E(cuMemAllocFromPoolAsync_ptsz),
    E(cuMemFree_v2),
    E(cuMemFreeAsync),
    E(cuMemFreeAsync_ptsz),
    E(cuMemCreate),
    E(cuMemRelease),
    E(cuArrayCreate_v2),
    E(cuArray3DCreate_v2),
    E(cuArrayDestroy),
    E(cuMipmappedArrayCreate),
    E(cuMipmappedArrayDestroy),
    E(cuMemGetInfo_v2),
    E(cuDeviceTotalMem_v2),
    E(cuGetProcAddress),
    E(cuGetProcAddress_v2),
#undef E
};

static void *exported_fn(const char *name)
{
    for (size_t i = 0; i < sizeof(exported) / sizeof(exported[0]); i++)
        if (strcmp(exported[i].name, name) == 0)
            return fn_ptr(exported[i].fn);
    return NULL;
}

/* The driver's function of that exported name (what the program would get without us). */
static void *real_fn(const char *name)
{
#define X(n, args)                                                                                 \
    if (strcmp(name, #n) == 0)                                                                     \
        return real.n ? fn_ptr((any_fn)real.n) : NULL;
    REAL_FUNCS(X)
#undef X
    return NULL;
}

/* cuGetProcAddress names entry points without their _vN suffix and picks the version by the
 * caller's CUDA version (and the _ptsz variant by the per-thread-stream flag). */
static const struct {
    const char *base;
    int v2_since; /* the CUDA version from which the name means its _v2 (0: no _v2) */
    any_fn fn, ptsz;
} by_version[] = {
    {"cuMemAlloc", 3020, (any_fn)cuMemAlloc_v2, NULL},
    {"cuMemAllocPitch", 3020, (any_fn)cuMemAllocPitch_v2, NULL},
    {"cuMemFree", 3020, (any_fn)cuMemFree_v2, NULL},
    {"cuMemGetInfo", 3020, (any_fn)cuMemGetInfo_v2, NULL},
    {"cuDeviceTotalMem", 3020, (any_fn)cuDeviceTotalMem_v2, NULL},
    {"cuArrayCreate", 3020, (any_fn)cuArrayCreate_v2, NULL},
    {"cuArray3DCreate", 3020, (any_fn)cuArray3DCreate_v2, NULL},
    {"cuMemAllocManaged", 0, (any_fn)cuMemAllocManaged, NULL},
    {"cuMemAllocAsync", 0, (any_fn)cuMemAllocAsync, (any_fn)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 0, (any_fn)cuMemAllocFromPoolAsync,
     (any_fn)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", 0, (any_fn)cuMemFreeAsync, (any_fn)cuMemFreeAsync_ptsz},
    {"cuMemCreate", 0, (any_fn)cuMemCreate, NULL},
    {"cuMemRelease", 0, (any_fn)cuMemRelease, NULL},
    {"cuArrayDestroy", 0, (any_fn)cuArrayDestroy, NULL},
    {"cuMipmappedArrayCreate", 0, (any_fn)cuMipmappedArrayCreate, NULL},
    {"cuMipmappedArrayDestroy", 0, (any_fn)cuMipmappedArrayDestroy, NULL},
};

static void *versioned_fn(const char *symbol, int version, cuuint64_t flags)
{
    if (strcmp(symbol, "cuGetProcAddress") == 0)
        return version >= 12000 ? fn_ptr((any_fn)cuGetProcAddress_v2)
                                : fn_ptr((any_fn)cuGetProcAddress);
    for (size_t i = 0; i < sizeof(by_version) / sizeof(by_version[0]); i++) {
        if (strcmp(by_version[i].base, symbol) != 0)
            continue;
        /* before its _v2, the name was the 32-bit entry point: not ours to wrap */
        if (by_version[i].v2_since != 0 && version < by_version[i].v2_since)
            return NULL;
        if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && by_version[i].ptsz)
            return fn_ptr(by_version[i].ptsz);
        return fn_ptr(by_version[i].fn);
    }
    return NULL;
}

SHIM_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    ensure_init();
    CUresult rc = PASS(cuGetProcAddress, symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL) {
        void *mine = versioned_fn(symbol, version, flags);
        if (mine != NULL)
            *pfn = mine;
    }
    return rc;
}

SHIM_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult *status)
{
    ensure_init();
    CUresult rc = PASS(cuGetProcAddress_v2, symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL) {
        void *mine = versioned_fn(symbol, version, flags);
        if (mine != NULL)
            *pfn = mine;
    }
    return rc;
}

/* dlsym: our function when the lookup would have found the driver's (never for RTLD_NEXT,
 * whose meaning depends on the caller); NULL to let libc's dlsym answer. Called only from the
 * trampoline, which keeps the caller's return address for libc. */
__attribute__((visibility("hidden"), used)) void *osub__shim_dlsym_pick(void *handle,
                                                                        const char *name);
__attribute__((visibility("hidden"), used)) void *osub__shim_dlsym_pick(void *handle,
                                                                        const char *name)
{
    resolve_dlsym();
    if (name == NULL || name[0] != 'c' || name[1] != 'u' || handle == RTLD_NEXT || in_shim_init)
        return NULL;
    void *mine = exported_fn(name);
    if (mine == NULL)
        return NULL;
    ensure_init();
    if (osub__real_dlsym == NULL)
        return NULL;
    void *r = osub__real_dlsym(handle, name);
    if (r != NULL && (r == mine || r == real_fn(name)))
        return mine;
    return NULL;
}

/* The exported dlsym. libc's dlsym reads its caller's address (for RTLD_NEXT and namespaces),
 * so it must be reached by a jump, not a call: a few lines of assembly guarantee that. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
#if defined(__CET__)
        "  endbr64\n"
#endif
        "  pushq %rdi\n"
        "  pushq %rsi\n"
        "  subq $8, %rsp\n"
        "  call osub__shim_dlsym_pick\n"
        "  addq $8, %rsp\n"
        "  popq %rsi\n"
        "  popq %rdi\n"
        "  testq %rax, %rax\n"
        "  jnz 1f\n"
        "  jmp *osub__real_dlsym(%rip)\n"
        "1:\n"
        "  ret\n"
        ".size dlsym, .-dlsym\n");
#else
/* elsewhere a sibling call at -O2 keeps the caller's address; at -O0 RTLD_NEXT lookups are
 * answered as if asked from here (docs/shim.md) */
SHIM_API void *dlsym(void *handle, const char *name)
{
    void *mine = osub__shim_dlsym_pick(handle, name);
    if (mine != NULL)
        return mine;
    return osub__real_dlsym(handle, name);
}
#endif
