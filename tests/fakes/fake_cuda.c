/* fake_cuda.c - a fake CUDA driver (libcuda.so.1) for tests without a GPU: devices with memory
 * and nothing else. FAKE_CUDA_DEVICES devices (default 1) of FAKE_CUDA_MEM_MIB MiB each
 * (default 81920). With FAKE_CUDA_STATE=/path, device memory is one pool shared by every process
 * using that file (as a GPU's is), and the memory of a process that died is given back (as the
 * driver does); fakecuda_stats() reports a device's use and its peak. Device memory is host
 * memory mapped on first use (cuMemcpy*, cuMemsetD8), so a test can check its bytes.
 * The process checkpoint API (fake_cuda_ckpt.h) works across the processes of one state file:
 * see "process checkpoints" below. Built with -DFAKE_CUDA_NO_CKPT it is an older driver
 * (12.4) without that API; FAKE_CUDA_DRIVER_VERSION=N makes it report N (13000: CUDA 13.0,
 * driver 580, the first whose restore remaps GPUs).
 * FAKE_CUDA_UUIDS=GPU-...,GPU-... names the devices (as NVML prints them; by default device d is
 * GPU-fa6e0000-0000-0000-0000-0000000000dd) and then CUDA_VISIBLE_DEVICES is honoured as the
 * driver does: a list of indices or UUIDs, the process's ordinals in that order, a list stopping
 * at its first unknown entry. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "fake_cuda_ckpt.h"

#define API __attribute__((visibility("default")))
#ifdef FAKE_CUDA_NO_CKPT
#define FAKE_DRIVER_VERSION 12040
#else
#define FAKE_DRIVER_VERSION 12080 /* the first with the checkpoint API in the driver API */
#endif
#define MAX_DEV 8
#define MAX_PROC 512

/* One process's checkpoint channel. A caller (oversubd) takes the channel (owner), writes op
 * and its arguments, bumps req; the target's restore thread performs the operation inside the
 * target, writes result and sets done = req. state is written by the restore thread only. The
 * futex words: req (the restore thread waits on it), done (the caller), owner (callers queue on
 * it), blocked (fakecuda_ckpt_blocked). A dead owner or target is noticed by its PID, so no
 * waiter hangs on a process that died (except where the driver itself hangs: FAKE_CUDA_CKPT_HANG).
 */
struct ctl {
    _Atomic uint32_t state;    /* CUprocessState */
    _Atomic uint32_t tid;      /* the restore thread's TID; 0: no context, not checkpointable */
    _Atomic uint32_t owner;    /* TID of the caller holding the channel; 0: free */
    _Atomic uint32_t req;      /* requests posted */
    _Atomic uint32_t done;     /* requests answered */
    _Atomic uint32_t blocked;  /* the target's threads waiting at its lock */
    _Atomic uint32_t hung;     /* a lock that never completes is under way */
    _Atomic uint32_t ctx_devs; /* bit d: the process has a context on device d */
    uint32_t op, timeout_ms, n_pairs;
    int32_t result;
    CUcheckpointGpuPair pairs[MAX_DEV];
};

struct shared {
    uint32_t magic;
    _Atomic uint64_t used[MAX_DEV], peak[MAX_DEV];
    struct {
        _Atomic int32_t pid;
        _Atomic uint64_t used[MAX_DEV];
        struct ctl ctl;
    } proc[MAX_PROC];
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int n_dev = 1;
/* the process's view: ordinal -> device (CUDA_VISIBLE_DEVICES, with FAKE_CUDA_UUIDS), moved by a
 * remapping restore */
static int vis[MAX_DEV], n_vis = 1;
static CUuuid dev_uuid[MAX_DEV];
static int driver_version = FAKE_DRIVER_VERSION;
static uint64_t dev_bytes = 81920ull << 20;
static struct shared *sh;
static int my_proc = -1;
static bool inited;

/* What this process holds: index -> (device, bytes, host copy). A handle is base + index * 1 TiB,
 * so that every byte of an allocation has an address of its own (dptr + offset) and no two
 * allocations' ranges meet. */
#define HANDLE_BASE 0x7e0000000000ull
#define SLOT_SHIFT 40
#define SLOT_BYTES (1ull << SLOT_SHIFT)
#define MAX_HELD ((size_t)1 << 23)
enum kind { K_PTR, K_MANAGED, K_OTHER };
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct held {
    uint64_t bytes;
    unsigned char *host; /* the bytes, mapped on first copy; NULL: never written (zeros) */
    int32_t dev;
    uint8_t kind;
    bool used;
} * held;
static uint32_t *free_idx;
static size_t n_held, n_free;

struct CUctx_st {
    int dev;
};
static struct CUctx_st ctxs[MAX_DEV];
static __thread struct CUctx_st *cur;

/* "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb" (or without "GPU-") into 16 bytes; false if not */
static bool parse_uuid(const char *t, size_t len, CUuuid *u)
{
    if (len >= 4 && strncmp(t, "GPU-", 4) == 0) {
        t += 4;
        len -= 4;
    }
    int nib = 0;
    memset(u, 0, sizeof(*u));
    for (size_t i = 0; i < len; i++) {
        char ch = t[i];
        int x = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (ch == '-')
            continue;
        if (x < 0 || nib >= 32)
            return false;
        u->bytes[nib / 2] = (char)(u->bytes[nib / 2] | (x << (nib % 2 ? 0 : 4)));
        nib++;
    }
    return nib == 32;
}

/* the devices' UUIDs, and the visible ones in the process's order */
static void setup_devices(void)
{
    for (int d = 0; d < MAX_DEV; d++) {
        char def[64];
        snprintf(def, sizeof(def), "GPU-fa6e0000-0000-0000-0000-0000000000%02x", (unsigned)d);
        parse_uuid(def, strlen(def), &dev_uuid[d]);
        vis[d] = d;
    }
    n_vis = n_dev;
    const char *u = getenv("FAKE_CUDA_UUIDS");
    if (u == NULL || *u == '\0')
        return;
    for (int d = 0; d < n_dev && *u; d++) {
        size_t l = strcspn(u, ",");
        parse_uuid(u, l, &dev_uuid[d]);
        u += l + (u[l] == ',');
    }
    const char *cv = getenv("CUDA_VISIBLE_DEVICES");
    if (cv == NULL)
        return;
    n_vis = 0;
    while (*cv && n_vis < n_dev) {
        size_t l = strcspn(cv, ",");
        int found = -1;
        CUuuid x;
        if (l > 0 && strspn(cv, "0123456789") == l) {
            found = atoi(cv) < n_dev ? atoi(cv) : -1;
        } else if (parse_uuid(cv, l, &x)) {
            for (int d = 0; d < n_dev && found < 0; d++)
                if (memcmp(&x, &dev_uuid[d], sizeof(x)) == 0)
                    found = d;
        }
        if (found < 0)
            break; /* as the driver: the list ends at an entry it does not know */
        vis[n_vis++] = found;
        cv += l + (cv[l] == ',');
    }
}

/* the device behind the process's ordinal d */
static inline int phys(int d)
{
    return d >= 0 && d < n_vis ? vis[d] : -1;
}

static CUresult gate_enter(void);
static void gate_leave(void);
static void ckpt_attach(int dev);

static void setup(void)
{
    const char *v = getenv("FAKE_CUDA_DEVICES");
    if (v && atoi(v) >= 1 && atoi(v) <= MAX_DEV)
        n_dev = atoi(v);
    v = getenv("FAKE_CUDA_MEM_MIB");
    if (v && strtoull(v, NULL, 10) > 0)
        dev_bytes = strtoull(v, NULL, 10) << 20;
    for (int i = 0; i < MAX_DEV; i++)
        ctxs[i].dev = i;
    v = getenv("FAKE_CUDA_DRIVER_VERSION");
    if (v && atoi(v) > 0)
        driver_version = atoi(v);
    setup_devices();
    const char *path = getenv("FAKE_CUDA_STATE");
    int fd = -1;
    if (path && *path) {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0 && ftruncate(fd, sizeof(struct shared)) != 0) {
            close(fd);
            fd = -1;
        }
    }
    void *p = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE,
                   fd >= 0 ? MAP_SHARED : MAP_SHARED | MAP_ANONYMOUS, fd, 0);
    if (fd >= 0)
        close(fd);
    sh = p == MAP_FAILED ? NULL : p;
}

/* a channel as a fresh process finds it: RUNNING, no restore thread, no request */
static void ctl_reset(struct ctl *c)
{
    atomic_store(&c->tid, 0);
    atomic_store(&c->state, CU_PROCESS_STATE_RUNNING);
    atomic_store(&c->owner, 0);
    atomic_store(&c->done, atomic_load(&c->req));
    atomic_store(&c->blocked, 0);
    atomic_store(&c->hung, 0);
    atomic_store(&c->ctx_devs, 0);
}

static void claim_proc(void)
{
    int32_t pid = (int32_t)getpid();
    for (int i = 0; i < MAX_PROC && sh; i++) {
        int32_t z = 0;
        if (atomic_compare_exchange_strong(&sh->proc[i].pid, &z, pid)) {
            ctl_reset(&sh->proc[i].ctl);
            my_proc = i;
            return;
        }
    }
}

/* gives back what dead processes held */
static void collect_dead(void)
{
    for (int i = 0; i < MAX_PROC; i++) {
        int32_t pid = atomic_load(&sh->proc[i].pid);
        if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        if (!atomic_compare_exchange_strong(&sh->proc[i].pid, &pid, -1))
            continue;
        for (int d = 0; d < MAX_DEV; d++)
            atomic_fetch_sub(&sh->used[d], atomic_exchange(&sh->proc[i].used[d], 0));
        ctl_reset(&sh->proc[i].ctl);
        atomic_store(&sh->proc[i].pid, 0);
    }
}

static bool phys_take(int dev, uint64_t bytes)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t cur_used = atomic_load(&sh->used[dev]);
        while (bytes <= dev_bytes && cur_used <= dev_bytes - bytes) {
            if (atomic_compare_exchange_weak(&sh->used[dev], &cur_used, cur_used + bytes)) {
                if (my_proc >= 0)
                    atomic_fetch_add(&sh->proc[my_proc].used[dev], bytes);
                uint64_t pk = atomic_load(&sh->peak[dev]);
                while (pk < cur_used + bytes &&
                       !atomic_compare_exchange_weak(&sh->peak[dev], &pk, cur_used + bytes))
                    ;
                return true;
            }
        }
        collect_dead();
    }
    return false;
}

static void phys_give(int dev, uint64_t bytes)
{
    if (my_proc >= 0)
        atomic_fetch_sub(&sh->proc[my_proc].used[dev], bytes);
    atomic_fetch_sub(&sh->used[dev], bytes);
}

static CUresult take_locked(int dev, uint64_t bytes, enum kind kind, unsigned long long *handle)
{
    if (dev < 0 || dev >= n_dev)
        return CUDA_ERROR_INVALID_DEVICE;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (sh == NULL || bytes > SLOT_BYTES || !phys_take(dev, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    size_t idx;
    if (n_free > 0) {
        idx = free_idx[--n_free];
    } else {
        if (n_held >= MAX_HELD) {
            pthread_mutex_unlock(&mu);
            phys_give(dev, bytes);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if ((n_held & (n_held - 1)) == 0 || n_held == 0) {
            size_t cap = n_held ? n_held * 2 : 64;
            struct held *h = realloc(held, cap * sizeof(*h));
            uint32_t *f = h ? realloc(free_idx, cap * sizeof(*f)) : NULL;
            if (h)
                held = h;
            if (f == NULL) {
                pthread_mutex_unlock(&mu);
                phys_give(dev, bytes);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            free_idx = f;
        }
        idx = n_held++;
    }
    held[idx] = (struct held){.bytes = bytes, .dev = dev, .kind = (uint8_t)kind, .used = true};
    pthread_mutex_unlock(&mu);
    *handle = HANDLE_BASE + ((uint64_t)idx << SLOT_SHIFT);
    return CUDA_SUCCESS;
}

/* an allocation: counted on the device, waits while the process is locked */
static CUresult take(int dev, uint64_t bytes, enum kind kind, unsigned long long *handle)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = gate_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    dev = phys(dev); /* read after the gate: a remapping restore moves it */
    ckpt_attach(dev);
    rc = take_locked(dev, bytes, kind, handle);
    gate_leave();
    return rc;
}

static CUresult give(uint64_t handle)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (handle < HANDLE_BASE || ((handle - HANDLE_BASE) & (SLOT_BYTES - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = gate_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    size_t idx = (size_t)((handle - HANDLE_BASE) >> SLOT_SHIFT);
    pthread_mutex_lock(&mu);
    if (idx >= n_held || !held[idx].used) {
        pthread_mutex_unlock(&mu);
        gate_leave();
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct held h = held[idx];
    held[idx].used = false;
    held[idx].host = NULL;
    free_idx[n_free++] = (uint32_t)idx;
    pthread_mutex_unlock(&mu);
    phys_give(h.dev, h.bytes);
    gate_leave();
    if (h.host)
        munmap(h.host, (size_t)h.bytes);
    return CUDA_SUCCESS;
}

/* The host bytes behind [p, p + n) of one allocation made by cuMemAlloc and its kin, mapped on
 * first use (untouched pages cost nothing); NULL when that is not device memory we handed out. */
static unsigned char *bytes_at(CUdeviceptr p, size_t n)
{
    if (p < HANDLE_BASE)
        return NULL;
    size_t idx = (size_t)((p - HANDLE_BASE) >> SLOT_SHIFT);
    uint64_t off = (p - HANDLE_BASE) & (SLOT_BYTES - 1);
    unsigned char *host = NULL;
    pthread_mutex_lock(&mu);
    if (idx < n_held && held[idx].used && held[idx].kind != K_OTHER && n <= held[idx].bytes &&
        off <= held[idx].bytes - n) {
        if (held[idx].host == NULL) {
            void *m = mmap(NULL, (size_t)held[idx].bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            held[idx].host = m == MAP_FAILED ? NULL : m;
        }
        host = held[idx].host ? held[idx].host + off : NULL;
    }
    pthread_mutex_unlock(&mu);
    return host;
}

static int cur_dev(void)
{
    return cur ? cur->dev : -1;
}

#define NEED_CTX()                                                                                 \
    do {                                                                                           \
        if (!inited)                                                                               \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        if (cur == NULL)                                                                           \
            return CUDA_ERROR_INVALID_CONTEXT;                                                     \
    } while (0)

API CUresult cuInit(unsigned int flags)
{
    (void)flags;
    pthread_once(&once, setup);
    if (sh == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!inited) {
        pthread_mutex_lock(&mu);
        if (my_proc < 0)
            claim_proc();
        inited = true;
        pthread_mutex_unlock(&mu);
    }
    return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *v)
{
    if (v == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *v = driver_version;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *n)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    *n = n_vis;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= n_vis)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= n_vis || name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake GPU %llu MiB", (unsigned long long)(dev_bytes >> 20));
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= n_vis || bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = (size_t)dev_bytes;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= n_vis || ctx == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    ckpt_attach(phys(d));
    *ctx = &ctxs[d];
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    return d >= 0 && d < n_vis ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= n_vis || u == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *u = dev_uuid[phys(d)];
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    return cuDevicePrimaryCtxRelease(d);
}

API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice d)
{
    (void)flags;
    CUresult rc = cuDevicePrimaryCtxRetain(ctx, d);
    if (rc == CUDA_SUCCESS)
        cur = *ctx;
    return rc;
}

API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (cur == ctx)
        cur = NULL;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    cur = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *d)
{
    NEED_CTX();
    *d = cur->dev;
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorString(CUresult rc, const char **s)
{
    switch (rc) {
    case CUDA_SUCCESS:
        *s = "no error";
        break;
    case CUDA_ERROR_INVALID_VALUE:
        *s = "invalid argument";
        break;
    case CUDA_ERROR_OUT_OF_MEMORY:
        *s = "out of memory";
        break;
    case CUDA_ERROR_NOT_INITIALIZED:
        *s = "initialization error";
        break;
    case CUDA_ERROR_INVALID_DEVICE:
        *s = "invalid device ordinal";
        break;
    case CUDA_ERROR_INVALID_CONTEXT:
        *s = "invalid device context";
        break;
    case CUDA_ERROR_NOT_FOUND:
        *s = "named symbol not found";
        break;
    case CUDA_ERROR_OPERATING_SYSTEM:
        *s = "OS call failed or operation not supported on this OS";
        break;
    case CUDA_ERROR_ILLEGAL_STATE:
        *s = "the operation cannot be performed in the present state";
        break;
    case CUDA_ERROR_NOT_READY:
        *s = "device not ready";
        break;
    case CUDA_ERROR_NOT_PERMITTED:
        *s = "operation not permitted";
        break;
    case CUDA_ERROR_NOT_SUPPORTED:
        *s = "operation not supported";
        break;
    default:
        *s = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    NEED_CTX();
    uint64_t used = atomic_load(&sh->used[phys(cur->dev)]);
    *free_bytes = (size_t)(used < dev_bytes ? dev_bytes - used : 0);
    *total = (size_t)dev_bytes;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    NEED_CTX();
    return take(cur_dev(), n, K_PTR, p);
}

API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags)
{
    (void)flags;
    NEED_CTX();
    return take(cur_dev(), n, K_MANAGED, p);
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h,
                                unsigned int elem)
{
    NEED_CTX();
    if (elem != 4 && elem != 8 && elem != 16)
        return CUDA_ERROR_INVALID_VALUE;
    *pitch = (w + 511) & ~(size_t)511;
    return take(cur_dev(), (uint64_t)*pitch * h, K_PTR, p);
}

API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s)
{
    (void)s;
    NEED_CTX();
    return take(cur_dev(), n, K_PTR, p);
}

API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s)
{
    return cuMemAllocAsync(p, n, s);
}

API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
    (void)pool;
    return cuMemAllocAsync(p, n, s);
}

API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
    (void)pool;
    return cuMemAllocAsync(p, n, s);
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
    return give(p);
}

API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    (void)s;
    return give(p);
}

API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    (void)s;
    return give(p);
}

/* copies and sets: the bytes live in host memory (bytes_at); they wait while locked */
static CUresult copy(unsigned char *dst, const unsigned char *src, size_t n, int byte)
{
    if (dst == NULL || (src == NULL && byte < 0))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = gate_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (byte >= 0)
        memset(dst, byte, n);
    else
        memmove(dst, src, n);
    gate_leave();
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    NEED_CTX();
    return copy(bytes_at(dst, n), src, n, -1);
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    return copy(dst, bytes_at(src, n), n, -1);
}

API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    return copy(bytes_at(dst, n), bytes_at(src, n), n, -1);
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    NEED_CTX();
    return copy(bytes_at(dst, n), NULL, n, value);
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                         unsigned long long flags)
{
    (void)flags;
    if (prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    return take(prop->location.id, n, K_OTHER, h);
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    return give(h);
}

/* arrays: what a row of a format takes, rounded as a texture would be (to 64 KiB) */
static uint64_t array_size(size_t w, size_t h, size_t d, int format, unsigned int ch)
{
    uint64_t e = format == CU_AD_FORMAT_FLOAT || format == CU_AD_FORMAT_UNSIGNED_INT32 ||
                         format == CU_AD_FORMAT_SIGNED_INT32
                     ? 4
                 : format == CU_AD_FORMAT_HALF || format == CU_AD_FORMAT_UNSIGNED_INT16 ||
                         format == CU_AD_FORMAT_SIGNED_INT16
                     ? 2
                     : 1;
    uint64_t b = e * (ch ? ch : 1) * w * (h ? h : 1) * (d ? d : 1);
    return (b + 65535) & ~(uint64_t)65535;
}

API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    NEED_CTX();
    if (desc == NULL || desc->Width == 0)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long h;
    CUresult rc =
        take(cur_dev(), array_size(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
             K_OTHER, &h);
    if (rc == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)h;
    return rc;
}

API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    NEED_CTX();
    if (desc == NULL || desc->Width == 0)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long h;
    CUresult rc =
        take(cur_dev(),
             array_size(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels),
             K_OTHER, &h);
    if (rc == CUDA_SUCCESS)
        *a = (CUarray)(uintptr_t)h;
    return rc;
}

API CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                    unsigned int levels)
{
    NEED_CTX();
    if (desc == NULL || desc->Width == 0 || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    unsigned long long h;
    size_t w = desc->Width, hh = desc->Height, d = desc->Depth;
    for (unsigned int l = 0; l < levels; l++) {
        total += array_size(w, hh, d, desc->Format, desc->NumChannels);
        w = w > 1 ? w / 2 : 1;
        hh = hh > 1 ? hh / 2 : hh;
        d = d > 1 ? d / 2 : d;
    }
    CUresult rc = take(cur_dev(), total, K_OTHER, &h);
    if (rc == CUDA_SUCCESS)
        *a = (CUmipmappedArray)(uintptr_t)h;
    return rc;
}

API CUresult cuArrayDestroy(CUarray a)
{
    return give((uint64_t)(uintptr_t)a);
}

API CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    return give((uint64_t)(uintptr_t)a);
}

static CUresult requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r, uint64_t handle)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    size_t idx = (size_t)((handle - HANDLE_BASE) >> SLOT_SHIFT);
    pthread_mutex_lock(&mu);
    bool ok = handle >= HANDLE_BASE && idx < n_held && held[idx].used;
    uint64_t b = ok ? held[idx].bytes : 0;
    pthread_mutex_unlock(&mu);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    memset(r, 0, sizeof(*r));
    r->size = (size_t)b;
    r->alignment = 65536;
    return CUDA_SUCCESS;
}

API CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r, CUarray a, CUdevice d)
{
    (void)d;
    return requirements(r, (uint64_t)(uintptr_t)a);
}

API CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r,
                                                   CUmipmappedArray a, CUdevice d)
{
    (void)d;
    return requirements(r, (uint64_t)(uintptr_t)a);
}

/* ---- process checkpoints (fake_cuda_ckpt.h) ------------------------------------------------
 * The target's side. Each process with a context starts a "restore thread" (as the driver does)
 * that waits on its channel in the state file and performs the operations inside the process.
 * A lock closes the gate every call that launches work or changes GPU state passes (allocations,
 * frees, copies, sets): such calls wait there until the unlock; the lock waits for the calls in
 * flight. A checkpoint takes the process's memory off the device count and keeps its bytes (they
 * are host memory already); a restore takes it back, same addresses, same bytes, and leaves the
 * process locked.
 * Knobs, read in the target when its first context is made, for the driver's documented
 * failures: FAKE_CUDA_CKPT_EPERM=1 (every action: CUDA_ERROR_NOT_PERMITTED, as without
 * persistence mode), FAKE_CUDA_CKPT_UNSUPPORTED=1 (checkpoint: CUDA_ERROR_NOT_SUPPORTED, as for
 * IPC memory; managed memory always gets it), FAKE_CUDA_CKPT_HANG=1 (a lock that never
 * completes and a state that never answers, as with NCCL across processes),
 * FAKE_CUDA_CKPT_FAIL=lock|checkpoint|restore|unlock (that action fails midway with
 * CUDA_ERROR_OPERATING_SYSTEM and the process is FAILED for good), FAKE_CUDA_CKPT_US_PER_MIB=N
 * (a checkpoint or a restore takes N us per MiB the process holds), FAKE_CUDA_CKPT_TRANSIENT=1
 * (CHECKPOINTING and RESTORING are shown meanwhile, as newer drivers name them),
 * FAKE_CUDA_CKPT_RESTORE_RETRY=1 (a restore refused for want of memory may be tried again; by
 * default every later restore fails with CUDA_ERROR_OPERATING_SYSTEM, as driver 580.95 does:
 * NVIDIA/cuda-checkpoint#44). */

/* the lock's gate; lock order: gate_mu before mu. in_flight: calls past the gate. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_open = PTHREAD_COND_INITIALIZER;
static pthread_cond_t gate_idle = PTHREAD_COND_INITIALIZER;
static unsigned int in_flight;
static bool gate_closed, gate_failed;

static void futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static struct ctl *my_ctl(void)
{
    return sh && my_proc >= 0 ? &sh->proc[my_proc].ctl : NULL;
}

static CUresult gate_enter(void)
{
    pthread_mutex_lock(&gate_mu);
    if (gate_closed && !gate_failed) {
        struct ctl *c = my_ctl();
        if (c) {
            atomic_fetch_add(&c->blocked, 1);
            futex_wake(&c->blocked);
        }
        while (gate_closed && !gate_failed)
            pthread_cond_wait(&gate_open, &gate_mu);
        if (c)
            atomic_fetch_sub(&c->blocked, 1);
    }
    if (gate_failed) {
        /* the fake's choice: the driver documents no recovery, not what the calls then do */
        pthread_mutex_unlock(&gate_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    in_flight++;
    pthread_mutex_unlock(&gate_mu);
    return CUDA_SUCCESS;
}

static void gate_leave(void)
{
    pthread_mutex_lock(&gate_mu);
    if (--in_flight == 0 && gate_closed)
        pthread_cond_broadcast(&gate_idle);
    pthread_mutex_unlock(&gate_mu);
}

API CUresult fakecuda_call_begin(void)
{
    return gate_enter();
}

API void fakecuda_call_end(void)
{
    gate_leave();
}

#ifdef FAKE_CUDA_NO_CKPT
static void ckpt_attach(int dev)
{
    (void)dev;
}
#else
enum { OP_LOCK = 1, OP_CHECKPOINT, OP_RESTORE, OP_UNLOCK };

static int futex_wait(_Atomic uint32_t *word, uint32_t val, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    return (int)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, timeout_ms >= 0 ? &ts : NULL,
                        NULL, 0);
}

static struct {
    bool eperm, unsupported, hang, transient, restore_retry;
    uint32_t fail_op;
    uint64_t us_per_mib;
} knob;
static pthread_once_t ckpt_once = PTHREAD_ONCE_INIT;
static bool restore_stuck; /* a restore ran out of memory (restore thread only) */

static bool knob_on(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "1") == 0;
}

static void *restore_thread(void *arg);

static void ckpt_start(void)
{
    knob.eperm = knob_on("FAKE_CUDA_CKPT_EPERM");
    knob.unsupported = knob_on("FAKE_CUDA_CKPT_UNSUPPORTED");
    knob.hang = knob_on("FAKE_CUDA_CKPT_HANG");
    knob.transient = knob_on("FAKE_CUDA_CKPT_TRANSIENT");
    knob.restore_retry = knob_on("FAKE_CUDA_CKPT_RESTORE_RETRY");
    const char *v = getenv("FAKE_CUDA_CKPT_FAIL");
    static const char *const ops[] = {NULL, "lock", "checkpoint", "restore", "unlock"};
    for (uint32_t op = OP_LOCK; v && op <= OP_UNLOCK; op++)
        if (strcmp(v, ops[op]) == 0)
            knob.fail_op = op;
    v = getenv("FAKE_CUDA_CKPT_US_PER_MIB");
    knob.us_per_mib = v ? strtoull(v, NULL, 10) : 0;

    /* the restore thread takes no signals: they are the program's */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    struct ctl *c = my_ctl();
    bool started = pthread_create(&t, &attr, restore_thread, c) == 0;
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* checkpointable from the moment it has a context, as with the driver */
    while (started && atomic_load(&c->tid) == 0)
        futex_wait(&c->tid, 0, -1);
}

/* a context on dev: the process is now a CUDA process, which a checkpoint can name */
static void ckpt_attach(int dev)
{
    struct ctl *c = my_ctl();
    if (c == NULL || dev < 0 || dev >= MAX_DEV)
        return;
    atomic_fetch_or(&c->ctx_devs, 1u << dev);
    pthread_once(&ckpt_once, ckpt_start);
}

/* what this process holds per device; true when some of it is managed (UVM) memory */
static bool held_per_dev(uint64_t per_dev[MAX_DEV], uint64_t *total)
{
    bool managed = false;
    memset(per_dev, 0, MAX_DEV * sizeof(per_dev[0]));
    *total = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_held; i++) {
        if (!held[i].used)
            continue;
        per_dev[held[i].dev] += held[i].bytes;
        *total += held[i].bytes;
        managed |= held[i].kind == K_MANAGED;
    }
    pthread_mutex_unlock(&mu);
    return managed;
}

/* the time a copy of bytes to or from the device takes (FAKE_CUDA_CKPT_US_PER_MIB) */
static void transfer_time(uint64_t bytes)
{
    uint64_t us = (uint64_t)((double)bytes / (1 << 20) * (double)knob.us_per_mib);
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static CUresult fail(struct ctl *c)
{
    atomic_store(&c->state, CU_PROCESS_STATE_FAILED);
    pthread_mutex_lock(&gate_mu);
    gate_failed = true;
    pthread_cond_broadcast(&gate_open);
    pthread_mutex_unlock(&gate_mu);
    return CUDA_ERROR_OPERATING_SYSTEM;
}

static CUresult do_lock(struct ctl *c, uint32_t timeout_ms)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = true;
    if (knob.hang) {
        /* NCCL across processes: the lock waits on peers that will never come */
        atomic_store(&c->hung, 1);
        pthread_mutex_unlock(&gate_mu);
        for (;;)
            pause();
    }
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    while (in_flight > 0) {
        int e = timeout_ms
                    ? pthread_cond_clockwait(&gate_idle, &gate_mu, CLOCK_MONOTONIC, &deadline)
                    : pthread_cond_wait(&gate_idle, &gate_mu);
        if (e == ETIMEDOUT && in_flight > 0) {
            /* only Lock documents CUDA_ERROR_NOT_READY: read as its timeout (an inference) */
            gate_closed = false;
            pthread_cond_broadcast(&gate_open);
            pthread_mutex_unlock(&gate_mu);
            return CUDA_ERROR_NOT_READY;
        }
    }
    pthread_mutex_unlock(&gate_mu);
    if (knob.fail_op == OP_LOCK)
        return fail(c);
    atomic_store(&c->state, CU_PROCESS_STATE_LOCKED);
    return CUDA_SUCCESS;
}

static CUresult do_checkpoint(struct ctl *c)
{
    uint64_t per_dev[MAX_DEV], total;
    if (held_per_dev(per_dev, &total) || knob.unsupported)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (knob.transient)
        atomic_store(&c->state, CU_PROCESS_STATE_CHECKPOINTING);
    transfer_time(total);
    if (knob.fail_op == OP_CHECKPOINT)
        return fail(c);
    for (int d = 0; d < MAX_DEV; d++)
        if (per_dev[d])
            phys_give(d, per_dev[d]);
    atomic_store(&c->state, CU_PROCESS_STATE_CHECKPOINTED);
    return CUDA_SUCCESS;
}

static int uuid_dev(const CUuuid *u)
{
    for (int d = 0; d < n_dev; d++)
        if (memcmp(u, &dev_uuid[d], sizeof(*u)) == 0)
            return d;
    return -1;
}

/* A restore's remap (gpuPairs) as the driver checks it: every pair's GPUs known, no GPU twice
 * on either side, and every GPU the process was checkpointed on named; a remap that moves
 * anything needs driver 580 (CUDA 13.0) and a process that sees every GPU (with a
 * CUDA_VISIBLE_DEVICES subset the driver answers invalid value, cuda-python#1983). to[d]: where
 * device d's memory goes (d where not moved). */
static CUresult remap_of(const struct ctl *c, const uint64_t per_dev[MAX_DEV], int to[MAX_DEV])
{
    bool named[MAX_DEV] = {false}, taken[MAX_DEV] = {false}, moves = false;
    for (int d = 0; d < MAX_DEV; d++)
        to[d] = d;
    if (c->n_pairs == 0)
        return CUDA_SUCCESS;
    for (uint32_t i = 0; i < c->n_pairs; i++) {
        int o = uuid_dev(&c->pairs[i].oldUuid), n = uuid_dev(&c->pairs[i].newUuid);
        if (o < 0 || n < 0 || named[o] || taken[n])
            return CUDA_ERROR_INVALID_VALUE;
        named[o] = taken[n] = true;
        to[o] = n;
        moves = moves || o != n;
    }
    uint32_t ctx = atomic_load(&c->ctx_devs);
    for (int d = 0; d < n_dev; d++)
        if ((per_dev[d] || (ctx & (1u << d))) && !named[d])
            return CUDA_ERROR_INVALID_VALUE;
    if (moves && driver_version < 13000)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (moves && n_vis < n_dev)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* After a remapping restore: the allocations, the contexts and the ordinals follow. */
static void remap_apply(struct ctl *c, const int to[MAX_DEV])
{
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_held; i++)
        if (held[i].used)
            held[i].dev = to[held[i].dev];
    pthread_mutex_unlock(&mu);
    for (int k = 0; k < n_vis; k++)
        vis[k] = to[vis[k]];
    uint32_t ctx = atomic_load(&c->ctx_devs), moved = 0;
    for (int d = 0; d < MAX_DEV; d++)
        if (ctx & (1u << d))
            moved |= 1u << to[d];
    atomic_store(&c->ctx_devs, moved);
}

static CUresult do_restore(struct ctl *c)
{
    if (restore_stuck)
        return CUDA_ERROR_OPERATING_SYSTEM;
    uint64_t per_dev[MAX_DEV], total, per_new[MAX_DEV] = {0};
    held_per_dev(per_dev, &total);
    int to[MAX_DEV];
    CUresult rc = remap_of(c, per_dev, to);
    if (rc != CUDA_SUCCESS)
        return rc; /* still checkpointed: it may be tried again */
    for (int d = 0; d < MAX_DEV; d++)
        per_new[to[d]] += per_dev[d];
    if (knob.transient)
        atomic_store(&c->state, CU_PROCESS_STATE_RESTORING);
    transfer_time(total);
    for (int d = 0; d < MAX_DEV; d++) {
        if (per_new[d] == 0 || phys_take(d, per_new[d]))
            continue;
        while (--d >= 0)
            if (per_new[d])
                phys_give(d, per_new[d]);
        restore_stuck = !knob.restore_retry;
        atomic_store(&c->state, CU_PROCESS_STATE_CHECKPOINTED);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    remap_apply(c, to);
    if (knob.fail_op == OP_RESTORE)
        return fail(c);
    atomic_store(&c->state, CU_PROCESS_STATE_LOCKED);
    return CUDA_SUCCESS;
}

static CUresult do_unlock(struct ctl *c)
{
    if (knob.fail_op == OP_UNLOCK)
        return fail(c);
    atomic_store(&c->state, CU_PROCESS_STATE_RUNNING);
    pthread_mutex_lock(&gate_mu);
    gate_closed = false;
    pthread_cond_broadcast(&gate_open);
    pthread_mutex_unlock(&gate_mu);
    return CUDA_SUCCESS;
}

static CUresult serve(struct ctl *c)
{
    if (knob.eperm)
        return CUDA_ERROR_NOT_PERMITTED;
    uint32_t st = atomic_load(&c->state);
    switch (c->op) {
    case OP_LOCK:
        return st == CU_PROCESS_STATE_RUNNING ? do_lock(c, c->timeout_ms)
                                              : CUDA_ERROR_ILLEGAL_STATE;
    case OP_CHECKPOINT:
        return st == CU_PROCESS_STATE_LOCKED ? do_checkpoint(c) : CUDA_ERROR_ILLEGAL_STATE;
    case OP_RESTORE:
        return st == CU_PROCESS_STATE_CHECKPOINTED ? do_restore(c) : CUDA_ERROR_ILLEGAL_STATE;
    case OP_UNLOCK:
        return st == CU_PROCESS_STATE_LOCKED ? do_unlock(c) : CUDA_ERROR_ILLEGAL_STATE;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static void *restore_thread(void *arg)
{
    struct ctl *c = arg;
    uint32_t seen = atomic_load(&c->req);
    atomic_store(&c->done, seen);
    atomic_store(&c->tid, (uint32_t)syscall(SYS_gettid));
    futex_wake(&c->tid);
    for (;;) {
        uint32_t r = atomic_load(&c->req);
        if (r == seen) {
            futex_wait(&c->req, r, -1);
            continue;
        }
        seen = r;
        c->result = serve(c);
        atomic_store(&c->done, r);
        futex_wake(&c->done);
    }
    return NULL;
}

/* ---- the caller's side (oversubd, cuda-checkpoint): any process of the same state file ---- */

/* a process that exited, or a zombie (which kill() still finds) */
static bool gone(uint32_t pid)
{
    if (pid == 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))
        return true;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* The channel of pid, if pid is a process of this state file with a context. A PID without one
 * gets CUDA_ERROR_INVALID_VALUE (documented for every call; what NVIDIA's tools read as "no
 * CUDA here"); a caller without a state file, CUDA_ERROR_NOT_INITIALIZED. */
static CUresult target_of(int pid, int *slot, struct ctl **c)
{
    pthread_once(&once, setup);
    if (sh == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    for (int i = 0; pid > 0 && i < MAX_PROC; i++) {
        if (atomic_load(&sh->proc[i].pid) == pid && atomic_load(&sh->proc[i].ctl.tid) != 0) {
            *slot = i;
            *c = &sh->proc[i].ctl;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static bool still_there(int slot, int pid)
{
    return atomic_load(&sh->proc[slot].pid) == pid && atomic_load(&sh->proc[slot].ctl.tid) != 0 &&
           !gone((uint32_t)pid);
}

/* Posts one operation to pid's restore thread and waits for its answer: one operation per
 * process at a time, callers queue. A target that dies meanwhile: CUDA_ERROR_INVALID_VALUE. */
static CUresult ckpt_call(int pid, uint32_t op, uint32_t timeout_ms,
                          const CUcheckpointGpuPair *pairs, uint32_t n_pairs)
{
    int slot;
    struct ctl *c;
    CUresult rc = target_of(pid, &slot, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint32_t me = (uint32_t)syscall(SYS_gettid);
    for (;;) {
        uint32_t o = 0;
        if (atomic_compare_exchange_strong(&c->owner, &o, me))
            break;
        if (gone(o)) {
            atomic_compare_exchange_strong(&c->owner, &o, 0);
            continue;
        }
        if (!still_there(slot, pid))
            return CUDA_ERROR_INVALID_VALUE;
        futex_wait(&c->owner, o, 100);
    }
    rc = CUDA_ERROR_INVALID_VALUE;
    uint32_t r, d;
    while ((r = atomic_load(&c->req)) != (d = atomic_load(&c->done))) {
        /* a request whose caller died before its answer */
        if (!still_there(slot, pid))
            goto out_release;
        futex_wait(&c->done, d, 100);
    }
    c->op = op;
    c->timeout_ms = timeout_ms;
    c->n_pairs = n_pairs;
    if (n_pairs)
        memcpy(c->pairs, pairs, n_pairs * sizeof(pairs[0]));
    atomic_store(&c->req, r + 1);
    futex_wake(&c->req);
    while ((d = atomic_load(&c->done)) != r + 1) {
        if (!still_there(slot, pid))
            goto out_release;
        futex_wait(&c->done, d, 100);
    }
    rc = c->result;
out_release:
    atomic_compare_exchange_strong(&c->owner, &me, 0);
    futex_wake(&c->owner);
    return rc;
}

static bool all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

API CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    if (args && (args->reserved0 || !all_zero(args->reserved1, sizeof(args->reserved1))))
        return CUDA_ERROR_INVALID_VALUE;
    return ckpt_call(pid, OP_LOCK, args ? args->timeoutMs : 0, NULL, 0);
}

API CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    if (args && !all_zero(args, sizeof(*args)))
        return CUDA_ERROR_INVALID_VALUE;
    return ckpt_call(pid, OP_CHECKPOINT, 0, NULL, 0);
}

API CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    if (args && (!all_zero(args->reserved, sizeof(args->reserved)) || args->reserved1 ||
                 args->gpuPairsCount > MAX_DEV || (args->gpuPairsCount && !args->gpuPairs)))
        return CUDA_ERROR_INVALID_VALUE;
    return ckpt_call(pid, OP_RESTORE, 0, args ? args->gpuPairs : NULL,
                     args ? args->gpuPairsCount : 0);
}

API CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    if (args && !all_zero(args, sizeof(*args)))
        return CUDA_ERROR_INVALID_VALUE;
    return ckpt_call(pid, OP_UNLOCK, 0, NULL, 0);
}

/* read from the state file, not asked of the target: it answers during a slow operation
 * (CHECKPOINTING or RESTORING with FAKE_CUDA_CKPT_TRANSIENT), but not while a lock hangs */
API CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    int slot;
    struct ctl *c;
    if (state == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = target_of(pid, &slot, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    while (atomic_load(&c->hung)) {
        if (!still_there(slot, pid))
            return CUDA_ERROR_INVALID_VALUE;
        futex_wait(&c->hung, 1, 100);
    }
    *state = (CUprocessState)atomic_load(&c->state);
    return CUDA_SUCCESS;
}

API CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    int slot;
    struct ctl *c;
    if (tid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = target_of(pid, &slot, &c);
    if (rc == CUDA_SUCCESS)
        *tid = (int)atomic_load(&c->tid);
    return rc;
}

API int fakecuda_ckpt_blocked(int pid, unsigned int n, int timeout_ms)
{
    int slot;
    struct ctl *c;
    if (target_of(pid, &slot, &c) != CUDA_SUCCESS)
        return -ESRCH;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        uint32_t b = atomic_load(&c->blocked);
        if (b >= n)
            return 0;
        if (!still_there(slot, pid))
            return -ESRCH;
        clock_gettime(CLOCK_MONOTONIC, &t);
        long left =
            timeout_ms - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0)
            return -ETIMEDOUT;
        futex_wait(&c->blocked, b, left < 100 ? (int)left : 100);
    }
}
#endif

API int fakecuda_processes(int dev, int *pids, int max)
{
    pthread_once(&once, setup);
    if (sh == NULL || dev < 0 || dev >= MAX_DEV)
        return -1;
    collect_dead();
    int n = 0;
    for (int i = 0; i < MAX_PROC; i++) {
        int32_t pid = atomic_load(&sh->proc[i].pid);
        struct ctl *c = &sh->proc[i].ctl;
        if (pid <= 0 || atomic_load(&c->state) == CU_PROCESS_STATE_CHECKPOINTED)
            continue;
        if (atomic_load(&sh->proc[i].used[dev]) == 0 && !(atomic_load(&c->ctx_devs) & (1u << dev)))
            continue;
        if (n < max && pids)
            pids[n] = pid;
        n++;
    }
    return n;
}

/* not CUDA: for the tests, a device's memory in use and its peak over the state's life */
API int fakecuda_stats(int dev, unsigned long long *used, unsigned long long *peak)
{
    pthread_once(&once, setup);
    if (sh == NULL || dev < 0 || dev >= MAX_DEV)
        return -1;
    collect_dead();
    *used = atomic_load(&sh->used[dev]);
    *peak = atomic_load(&sh->peak[dev]);
    return 0;
}

/* cuGetProcAddress: the driver's own functions by base name and version (never a preload's) */
typedef void (*any_fn)(void);
static const struct {
    const char *name;
    int v2_since;
    any_fn fn, ptsz;
} procs[] = {
#define P(n, since, f, pt)                                                                         \
    {                                                                                              \
        n, since, (any_fn)(f), (any_fn)(pt)                                                        \
    }
    P("cuInit", 0, cuInit, NULL),
    P("cuDriverGetVersion", 0, cuDriverGetVersion, NULL),
    P("cuDeviceGet", 0, cuDeviceGet, NULL),
    P("cuDeviceGetCount", 0, cuDeviceGetCount, NULL),
    P("cuDeviceGetName", 0, cuDeviceGetName, NULL),
    P("cuDeviceGetUuid", 0, cuDeviceGetUuid, NULL),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2, NULL),
    P("cuDevicePrimaryCtxRetain", 0, cuDevicePrimaryCtxRetain, NULL),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2, NULL),
    P("cuCtxCreate", 3020, cuCtxCreate_v2, NULL),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2, NULL),
    P("cuCtxSetCurrent", 0, cuCtxSetCurrent, NULL),
    P("cuCtxGetDevice", 0, cuCtxGetDevice, NULL),
    P("cuGetErrorString", 0, cuGetErrorString, NULL),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2, NULL),
    P("cuMemAlloc", 3020, cuMemAlloc_v2, NULL),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2, NULL),
    P("cuMemAllocManaged", 0, cuMemAllocManaged, NULL),
    P("cuMemAllocAsync", 0, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 0, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    P("cuMemFree", 3020, cuMemFree_v2, NULL),
    P("cuMemFreeAsync", 0, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    P("cuMemCreate", 0, cuMemCreate, NULL),
    P("cuMemRelease", 0, cuMemRelease, NULL),
    P("cuArrayCreate", 3020, cuArrayCreate_v2, NULL),
    P("cuArray3DCreate", 3020, cuArray3DCreate_v2, NULL),
    P("cuArrayDestroy", 0, cuArrayDestroy, NULL),
    P("cuMipmappedArrayCreate", 0, cuMipmappedArrayCreate, NULL),
    P("cuMipmappedArrayDestroy", 0, cuMipmappedArrayDestroy, NULL),
    P("cuArrayGetMemoryRequirements", 0, cuArrayGetMemoryRequirements, NULL),
    P("cuMipmappedArrayGetMemoryRequirements", 0, cuMipmappedArrayGetMemoryRequirements, NULL),
    P("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, NULL),
    P("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, NULL),
    P("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, NULL),
    P("cuMemsetD8", 3020, cuMemsetD8_v2, NULL),
#ifndef FAKE_CUDA_NO_CKPT
    P("cuCheckpointProcessGetState", 0, cuCheckpointProcessGetState, NULL),
    P("cuCheckpointProcessGetRestoreThreadId", 0, cuCheckpointProcessGetRestoreThreadId, NULL),
    P("cuCheckpointProcessLock", 0, cuCheckpointProcessLock, NULL),
    P("cuCheckpointProcessCheckpoint", 0, cuCheckpointProcessCheckpoint, NULL),
    P("cuCheckpointProcessRestore", 0, cuCheckpointProcessRestore, NULL),
    P("cuCheckpointProcessUnlock", 0, cuCheckpointProcessUnlock, NULL),
#endif
#undef P
};

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status);
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    any_fn f = NULL;
    if (strcmp(symbol, "cuGetProcAddress") == 0)
        f = version >= 12000 ? (any_fn)cuGetProcAddress_v2 : (any_fn)cuGetProcAddress;
    for (size_t i = 0; f == NULL && i < sizeof(procs) / sizeof(procs[0]); i++) {
        if (strcmp(procs[i].name, symbol) != 0)
            continue;
        if (procs[i].v2_since && version < procs[i].v2_since)
            break; /* the old entry points are not faked */
        f = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && procs[i].ptsz ? procs[i].ptsz
                                                                                     : procs[i].fn;
    }
    if (status)
        *status = f ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (f == NULL) {
        *pfn = NULL;
        return CUDA_ERROR_NOT_FOUND;
    }
    memcpy(pfn, &f, sizeof(*pfn));
    return CUDA_SUCCESS;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status)
{
    return lookup(symbol, pfn, version, flags, status);
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return lookup(symbol, pfn, version, flags, NULL);
}
