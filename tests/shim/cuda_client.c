/* cuda_client.c - a small CUDA driver-API program for the shim's tests: runs a script of
 * allocations given as arguments, reaching the driver one of three ways (--via link, dlsym or
 * procaddr), and prints one line per step. Built twice: linked with libcuda (cuda_client) and
 * not (cuda_client_dl, which reaches it only by dlopen). Needs no CUDA headers, so the same
 * program runs against the fake driver and, in scripts/gpu-check-shim.sh, a real one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
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

#define FUNCS(X)                                                                                   \
    X(cuInit, (unsigned int))                                                                      \
    X(cuDeviceGet, (CUdevice *, int))                                                              \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                           \
    X(cuCtxSetCurrent, (CUcontext))                                                                \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                      \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))                                    \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                                          \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                    \
    X(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))                 \
    X(cuMemFree_v2, (CUdeviceptr))                                                                 \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                     \
    X(cuMemCreate,                                                                                 \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))   \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                                \
    X(cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))                                \
    X(cuArray3DCreate_v2, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))                            \
    X(cuArrayDestroy, (CUarray))                                                                   \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int)) \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray))                                                 \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                                       \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))

/* cuGetProcAddress names: the base name a CUDA 12 runtime asks for */
static const char *const base_names[] = {
    "cuInit",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuMemAlloc",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocPitch",
    "cuMemFree",
    "cuMemFreeAsync",
    "cuMemCreate",
    "cuMemRelease",
    "cuArrayCreate",
    "cuArray3DCreate",
    "cuArrayDestroy",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy",
    "cuMemGetInfo",
    "cuDeviceTotalMem",
};

#ifndef CLIENT_NO_LINK
#define X(name, args) CUresult name args;
FUNCS(X)
#undef X
#endif

static struct {
#define X(name, args) CUresult(*name) args;
    FUNCS(X)
#undef X
} cu;

static int (*stats)(int, unsigned long long *, unsigned long long *);
static int device;
static int last_rc;

struct item {
    char kind; /* p ptr, a async ptr, h handle, r array, m mipmap */
    unsigned long long v;
};
static struct item stack[4096];
static int depth;

static void die(const char *msg)
{
    fprintf(stderr, "cuda_client: %s\n", msg);
    exit(2);
}

static void bind_all(const char *via)
{
    void *lib = NULL;
    if (strcmp(via, "link") == 0) {
#ifdef CLIENT_NO_LINK
        die("this build is not linked with libcuda: use --via dlsym or procaddr");
#else
#define X(name, args) cu.name = name;
        FUNCS(X)
#undef X
        *(void **)&stats = dlsym(RTLD_DEFAULT, "fakecuda_stats");
        return;
#endif
    }
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        die(dlerror());
    *(void **)&stats = dlsym(lib, "fakecuda_stats");
    if (strcmp(via, "dlsym") == 0) {
#define X(name, args) *(void **)&cu.name = dlsym(lib, #name);
        FUNCS(X)
#undef X
        return;
    }
    if (strcmp(via, "procaddr") != 0)
        die("--via must be link, dlsym or procaddr");
    /* as the CUDA runtime does: find cuGetProcAddress, then ask it for itself, then for all */
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
    *(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (gpa == NULL)
        die("no cuGetProcAddress_v2");
    void *self = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa("cuGetProcAddress", &self, 12040, 0, &st) != CUDA_SUCCESS || self == NULL)
        die("cuGetProcAddress(\"cuGetProcAddress\") failed");
    memcpy(&gpa, &self, sizeof(self));
    void **slots = (void **)&cu;
    for (size_t i = 0; i < sizeof(base_names) / sizeof(base_names[0]); i++) {
        void *p = NULL;
        if (gpa(base_names[i], &p, 12040, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS)
            p = NULL;
        slots[i] = p;
    }
}

static void report(const char *step, CUresult rc)
{
    last_rc = rc;
    printf("%s rc=%d\n", step, rc);
    fflush(stdout);
}

static void push(char kind, unsigned long long v)
{
    if (depth < (int)(sizeof(stack) / sizeof(stack[0])))
        stack[depth++] = (struct item){kind, v};
}

static CUresult release(struct item it)
{
    switch (it.kind) {
    case 'p':
        return cu.cuMemFree_v2(it.v);
    case 'a':
        return cu.cuMemFreeAsync(it.v, NULL);
    case 'h':
        return cu.cuMemRelease(it.v);
    case 'r':
        return cu.cuArrayDestroy((CUarray)(uintptr_t)it.v);
    default:
        return cu.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)it.v);
    }
}

static size_t mib(const char *s)
{
    return (size_t)strtoull(s, NULL, 10) << 20;
}

struct hammer {
    int rounds;
    unsigned max_mib;
    unsigned seed;
    atomic_long ok, oom, other;
};

static void *hammer_thread(void *arg)
{
    struct hammer *h = arg;
    unsigned seed = h->seed ^ (unsigned)(uintptr_t)pthread_self();
    CUdeviceptr live[4];
    int n = 0;
    CUcontext ctx;
    if (cu.cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS ||
        cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        atomic_fetch_add(&h->other, 1);
        return NULL;
    }
    for (int r = 0; r < h->rounds; r++) {
        if (n == 4 || (n > 0 && rand_r(&seed) % 2)) {
            int k = rand_r(&seed) % n;
            if (cu.cuMemFree_v2(live[k]) != CUDA_SUCCESS)
                atomic_fetch_add(&h->other, 1);
            live[k] = live[--n];
            continue;
        }
        size_t b = ((size_t)(rand_r(&seed) % h->max_mib) + 1) << 20;
        CUresult rc = cu.cuMemAlloc_v2(&live[n], b);
        if (rc == CUDA_SUCCESS) {
            n++;
            atomic_fetch_add(&h->ok, 1);
        } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            atomic_fetch_add(&h->oom, 1);
        } else {
            atomic_fetch_add(&h->other, 1);
        }
    }
    while (n > 0)
        if (cu.cuMemFree_v2(live[--n]) != CUDA_SUCCESS)
            atomic_fetch_add(&h->other, 1);
    return NULL;
}

static int run(const char *cmd)
{
    char step[256];
    snprintf(step, sizeof(step), "%s", cmd);
    char *arg = strchr(step, ':');
    if (arg)
        *arg++ = '\0';
    CUdeviceptr p = 0;
    CUresult rc;
    if (strcmp(step, "alloc") == 0 && arg) {
        rc = cu.cuMemAlloc_v2(&p, mib(arg));
        if (rc == CUDA_SUCCESS)
            push('p', p);
        report(cmd, rc);
    } else if (strcmp(step, "managed") == 0 && arg) {
        rc = cu.cuMemAllocManaged(&p, mib(arg), 1);
        if (rc == CUDA_SUCCESS)
            push('p', p);
        report(cmd, rc);
    } else if (strcmp(step, "async") == 0 && arg) {
        rc = cu.cuMemAllocAsync(&p, mib(arg), NULL);
        if (rc == CUDA_SUCCESS)
            push('a', p);
        report(cmd, rc);
    } else if (strcmp(step, "pool") == 0 && arg) {
        rc = cu.cuMemAllocFromPoolAsync(&p, mib(arg), NULL, NULL);
        if (rc == CUDA_SUCCESS)
            push('a', p);
        report(cmd, rc);
    } else if (strcmp(step, "pitch") == 0 && arg) {
        size_t w = 0, h = 0, pitch = 0;
        sscanf(arg, "%zux%zu", &w, &h);
        rc = cu.cuMemAllocPitch_v2(&p, &pitch, w, h, 4);
        if (rc == CUDA_SUCCESS)
            push('p', p);
        report(cmd, rc);
    } else if (strcmp(step, "create") == 0 && arg) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = 1; /* pinned */
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        CUmemGenericAllocationHandle h = 0;
        rc = cu.cuMemCreate(&h, mib(arg), &prop, 0);
        if (rc == CUDA_SUCCESS)
            push('h', h);
        report(cmd, rc);
    } else if (strcmp(step, "array") == 0 && arg) {
        CUDA_ARRAY_DESCRIPTOR d = {0, 0, CU_AD_FORMAT_FLOAT, 1};
        sscanf(arg, "%zux%zu", &d.Width, &d.Height);
        CUarray a = NULL;
        rc = cu.cuArrayCreate_v2(&a, &d);
        if (rc == CUDA_SUCCESS)
            push('r', (uintptr_t)a);
        report(cmd, rc);
    } else if (strcmp(step, "array3d") == 0 && arg) {
        CUDA_ARRAY3D_DESCRIPTOR d = {0, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0};
        sscanf(arg, "%zux%zux%zu", &d.Width, &d.Height, &d.Depth);
        CUarray a = NULL;
        rc = cu.cuArray3DCreate_v2(&a, &d);
        if (rc == CUDA_SUCCESS)
            push('r', (uintptr_t)a);
        report(cmd, rc);
    } else if (strcmp(step, "mipmap") == 0 && arg) {
        CUDA_ARRAY3D_DESCRIPTOR d = {0, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0};
        unsigned levels = 1;
        sscanf(arg, "%zux%zu:%u", &d.Width, &d.Height, &levels);
        CUmipmappedArray a = NULL;
        rc = cu.cuMipmappedArrayCreate(&a, &d, levels);
        if (rc == CUDA_SUCCESS)
            push('m', (uintptr_t)a);
        report(cmd, rc);
    } else if (strcmp(step, "free") == 0) {
        if (depth == 0)
            die("free: nothing allocated");
        report(cmd, release(stack[--depth]));
    } else if (strcmp(step, "freeall") == 0) {
        rc = CUDA_SUCCESS;
        while (depth > 0 && rc == CUDA_SUCCESS)
            rc = release(stack[--depth]);
        report(cmd, rc);
    } else if (strcmp(step, "fill") == 0 && arg) {
        int n = 0;
        while ((rc = cu.cuMemAlloc_v2(&p, mib(arg))) == CUDA_SUCCESS) {
            push('p', p);
            n++;
        }
        printf("fill chunks=%d rc=%d\n", n, rc);
        fflush(stdout);
        last_rc = rc;
    } else if (strcmp(step, "expect") == 0 && arg) {
        if (last_rc != atoi(arg)) {
            printf("FAILED: expected rc=%s, got rc=%d\n", arg, last_rc);
            return 1;
        }
    } else if (strcmp(step, "info") == 0) {
        size_t f = 0, t = 0;
        rc = cu.cuMemGetInfo_v2(&f, &t);
        printf("info free_mib=%zu total_mib=%zu rc=%d\n", f >> 20, t >> 20, rc);
        fflush(stdout);
        last_rc = rc;
    } else if (strcmp(step, "totalmem") == 0) {
        size_t t = 0;
        rc = cu.cuDeviceTotalMem_v2(&t, device);
        printf("totalmem mib=%zu rc=%d\n", t >> 20, rc);
        fflush(stdout);
        last_rc = rc;
    } else if (strcmp(step, "phys") == 0) {
        unsigned long long u = 0, pk = 0;
        if (stats == NULL || stats(device, &u, &pk) != 0)
            die("phys: not the fake driver");
        printf("phys used_mib=%llu peak_mib=%llu\n", u >> 20, pk >> 20);
        fflush(stdout);
    } else if (strcmp(step, "touch") == 0 && arg) {
        FILE *f = fopen(arg, "w");
        if (f)
            fclose(f);
    } else if (strcmp(step, "wait") == 0 && arg) {
        struct stat st;
        while (stat(arg, &st) != 0)
            nanosleep(&(struct timespec){0, 5000000}, NULL);
    } else if (strcmp(step, "forkalloc") == 0 && arg) {
        /* a child process allocates (and exits holding it): its rc is the step's */
        fflush(stdout);
        pid_t k = fork();
        if (k == 0) {
            CUdeviceptr q;
            CUresult r = cu.cuMemAlloc_v2(&q, mib(arg));
            _exit(r == CUDA_SUCCESS ? 0 : r == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 3);
        }
        int st = 0;
        if (k < 0 || waitpid(k, &st, 0) != k)
            die("forkalloc: fork failed");
        report(cmd, WIFEXITED(st) ? WEXITSTATUS(st) : 99);
    } else if (strcmp(step, "shrinkseg") == 0) {
        /* a hostile service: cut its grant segment short under oversubd's mapping */
        const char *seg = getenv("OVERSUB_SHIM_SEGMENT");
        if (seg == NULL || truncate(seg, 0) != 0)
            die("shrinkseg: no segment to cut");
    } else if (strcmp(step, "pokeseg") == 0 && arg) {
        /* a hostile service: write a 32- or 64-bit value at a byte offset of its segment
         * (pokeseg:OFFSET:VALUE, a value above 2^32-1 written as 64 bits) */
        const char *seg = getenv("OVERSUB_SHIM_SEGMENT");
        unsigned long long off = 0, val = 0;
        if (seg == NULL || sscanf(arg, "%llu:%llu", &off, &val) != 2)
            die("pokeseg:OFFSET:VALUE with OVERSUB_SHIM_SEGMENT set");
        int fd = open(seg, O_RDWR);
        uint32_t v32 = (uint32_t)val;
        uint64_t v64 = val;
        ssize_t n = fd < 0             ? -1
                    : val > UINT32_MAX ? pwrite(fd, &v64, sizeof(v64), (off_t)off)
                                       : pwrite(fd, &v32, sizeof(v32), (off_t)off);
        if (n <= 0)
            die("pokeseg: cannot write the segment");
        close(fd);
    } else if (strcmp(step, "hold") == 0) {
        for (;;)
            pause();
    } else if (strcmp(step, "hammer") == 0 && arg) {
        int threads = 4;
        struct hammer h = {.rounds = 1000, .max_mib = 64, .seed = (unsigned)getpid()};
        sscanf(arg, "%d:%d:%u", &threads, &h.rounds, &h.max_mib);
        if (threads < 1 || threads > 64 || h.max_mib == 0)
            die("hammer:THREADS:ROUNDS:MAX_MIB");
        pthread_t t[64];
        for (int i = 0; i < threads; i++)
            pthread_create(&t[i], NULL, hammer_thread, &h);
        for (int i = 0; i < threads; i++)
            pthread_join(t[i], NULL);
        printf("hammer ok=%ld oom=%ld other=%ld\n", atomic_load(&h.ok), atomic_load(&h.oom),
               atomic_load(&h.other));
        fflush(stdout);
        if (atomic_load(&h.other) != 0)
            return 1;
    } else {
        fprintf(stderr, "cuda_client: unknown step '%s'\n", cmd);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *via = "link";
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--via") == 0 && i + 1 < argc)
            via = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = atoi(argv[++i]);
        else
            die("usage: cuda_client [--via link|dlsym|procaddr] [--device N] STEP...");
    }
    bind_all(via);
    void **slots = (void **)&cu;
    for (size_t k = 0; k < sizeof(cu) / sizeof(void *); k++)
        if (slots[k] == NULL) {
            fprintf(stderr, "cuda_client: entry point %zu (%s) not found via %s\n", k,
                    base_names[k], via);
            return 2;
        }
    CUdevice dev;
    CUcontext ctx;
    if (cu.cuInit(0) != CUDA_SUCCESS || cu.cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
        cu.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        die("cannot initialise the driver and a context");
    for (; i < argc; i++) {
        int rc = run(argv[i]);
        if (rc != 0)
            return rc;
    }
    return 0;
}
