/* fake_cuda.c - a fake CUDA driver (libcuda.so.1) for tests without a GPU: devices with memory
 * and nothing else. FAKE_CUDA_DEVICES devices (default 1) of FAKE_CUDA_MEM_MIB MiB each
 * (default 81920). With FAKE_CUDA_STATE=/path, device memory is one pool shared by every process
 * using that file (as a GPU's is), and the memory of a process that died is given back (as the
 * driver does); fakecuda_stats() reports a device's use and its peak. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_abi.h"

#define API __attribute__((visibility("default")))
#define MAX_DEV 8
#define MAX_PROC 512

struct shared {
    uint32_t magic;
    _Atomic uint64_t used[MAX_DEV], peak[MAX_DEV];
    struct {
        _Atomic int32_t pid;
        _Atomic uint64_t used[MAX_DEV];
    } proc[MAX_PROC];
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int n_dev = 1;
static uint64_t dev_bytes = 81920ull << 20;
static struct shared *sh;
static int my_proc = -1;
static bool inited;

/* what this process holds: index -> (device, bytes); handles are base + index * 4096 */
#define HANDLE_BASE 0x7e0000000000ull
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct held {
    uint64_t bytes;
    int32_t dev;
    bool used;
} * held;
static uint32_t *free_idx;
static size_t n_held, n_free;

struct CUctx_st {
    int dev;
};
static struct CUctx_st ctxs[MAX_DEV];
static __thread struct CUctx_st *cur;

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

static void claim_proc(void)
{
    int32_t pid = (int32_t)getpid();
    for (int i = 0; i < MAX_PROC && sh; i++) {
        int32_t z = 0;
        if (atomic_compare_exchange_strong(&sh->proc[i].pid, &z, pid)) {
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

static CUresult take(int dev, uint64_t bytes, unsigned long long *handle)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= n_dev)
        return CUDA_ERROR_INVALID_DEVICE;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (sh == NULL || !phys_take(dev, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    size_t idx;
    if (n_free > 0) {
        idx = free_idx[--n_free];
    } else {
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
    held[idx] = (struct held){.bytes = bytes, .dev = dev, .used = true};
    pthread_mutex_unlock(&mu);
    *handle = HANDLE_BASE + ((uint64_t)idx << 12);
    return CUDA_SUCCESS;
}

static CUresult give(uint64_t handle)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (handle < HANDLE_BASE || (handle & 4095) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t idx = (size_t)((handle - HANDLE_BASE) >> 12);
    pthread_mutex_lock(&mu);
    if (idx >= n_held || !held[idx].used) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct held h = held[idx];
    held[idx].used = false;
    free_idx[n_free++] = (uint32_t)idx;
    pthread_mutex_unlock(&mu);
    phys_give(h.dev, h.bytes);
    return CUDA_SUCCESS;
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
    *v = 12040;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *n)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    *n = n_dev;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= n_dev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= n_dev || name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake GPU %llu MiB", (unsigned long long)(dev_bytes >> 20));
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= n_dev || bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = (size_t)dev_bytes;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d)
{
    if (!inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= n_dev || ctx == NULL)
        return CUDA_ERROR_INVALID_DEVICE;
    *ctx = &ctxs[d];
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    return d >= 0 && d < n_dev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
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
    default:
        *s = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    NEED_CTX();
    uint64_t used = atomic_load(&sh->used[cur->dev]);
    *free_bytes = (size_t)(used < dev_bytes ? dev_bytes - used : 0);
    *total = (size_t)dev_bytes;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    NEED_CTX();
    return take(cur_dev(), n, p);
}

API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags)
{
    (void)flags;
    NEED_CTX();
    return take(cur_dev(), n, p);
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h,
                                unsigned int elem)
{
    NEED_CTX();
    if (elem != 4 && elem != 8 && elem != 16)
        return CUDA_ERROR_INVALID_VALUE;
    *pitch = (w + 511) & ~(size_t)511;
    return take(cur_dev(), (uint64_t)*pitch * h, p);
}

API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s)
{
    (void)s;
    NEED_CTX();
    return take(cur_dev(), n, p);
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

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                         unsigned long long flags)
{
    (void)flags;
    if (prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    return take(prop->location.id, n, h);
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
    CUresult rc = take(
        cur_dev(), array_size(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels), &h);
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
    CUresult rc = take(
        cur_dev(),
        array_size(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels), &h);
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
    CUresult rc = take(cur_dev(), total, &h);
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
    size_t idx = (size_t)((handle - HANDLE_BASE) >> 12);
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
