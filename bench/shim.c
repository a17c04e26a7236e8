/* shim.c - cuMemAlloc_v2/cuMemFree_v2 pairs per second on the fake driver, THREADS threads at
 * once: run as is, then under LD_PRELOAD=liboversub-cuda.so (bench/run-shim.sh), to measure
 * what the shim adds per pair. Prints "ns_per_pair=N". */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_abi.h"

CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static long pairs;

static void *loop(void *arg)
{
    (void)arg;
    CUcontext ctx;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        abort();
    for (long i = 0; i < pairs; i++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 1u << 20) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS)
            abort();
    }
    return NULL;
}

int main(int argc, char **argv)
{
    pairs = argc > 1 ? atol(argv[1]) : 1000000;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    if (cuInit(0) != CUDA_SUCCESS || threads < 1 || threads > 64)
        return 2;
    pthread_t t[64];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, loop, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("ns_per_pair=%.1f\n", ns / (double)(pairs * threads));
    return 0;
}
