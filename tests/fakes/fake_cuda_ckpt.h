/* fake_cuda_ckpt.h - the CUDA driver's process checkpoint API (CUDA 12.8 / driver r570 and
 * later) as the fake driver (fake_cuda.c) implements it, plus the fake's own test helpers.
 * Declared here from NVIDIA's documented ABI (cuda.h of CUDA 12.8-13.0, 64-bit builds), in the
 * manner of src/shim/cuda_abi.h, so that no CUDA headers are needed.
 *
 * The calls name a target process by PID; they are made by another process (oversubd) or by
 * the target itself. Every argument struct is 64 bytes and optional (NULL: defaults); its
 * reserved fields must be zero (CUDA_ERROR_INVALID_VALUE otherwise). */
#ifndef OSUB_FAKE_CUDA_CKPT_H
#define OSUB_FAKE_CUDA_CKPT_H

#include "cuda_abi.h"

/* result codes the checkpoint calls return beyond those of cuda_abi.h */
enum {
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_PERMITTED = 800,
};

/* CUprocessState. CHECKPOINTING and RESTORING appear only in newer bindings; the fake shows
 * them during a slow operation when FAKE_CUDA_CKPT_TRANSIENT=1 is set in the target. */
typedef enum CUprocessState_enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED = 1,
    CU_PROCESS_STATE_CHECKPOINTED = 2,
    CU_PROCESS_STATE_FAILED = 3,
    CU_PROCESS_STATE_CHECKPOINTING = 4,
    CU_PROCESS_STATE_RESTORING = 5,
} CUprocessState;

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

typedef struct CUcheckpointLockArgs_st {
    unsigned int timeoutMs; /* 0: wait as long as it takes */
    unsigned int reserved0;
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;

typedef struct CUcheckpointCheckpointArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointCheckpointArgs;

typedef struct CUcheckpointGpuPair_st {
    CUuuid oldUuid;
    CUuuid newUuid;
} CUcheckpointGpuPair;

/* the CUDA 12.8-13.0 layout (13.3 and later put padding0 and customStorageInfo_out here) */
typedef struct CUcheckpointRestoreArgs_st {
    CUcheckpointGpuPair *gpuPairs; /* borrowed; NULL: restore where it was taken */
    unsigned int gpuPairsCount;
    char reserved[64 - sizeof(CUcheckpointGpuPair *) - sizeof(unsigned int) - sizeof(cuuint64_t)];
    cuuint64_t reserved1;
} CUcheckpointRestoreArgs;

typedef struct CUcheckpointUnlockArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;

_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "CUcheckpointLockArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointCheckpointArgs) == 64, "CUcheckpointCheckpointArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointUnlockArgs) == 64, "CUcheckpointUnlockArgs is 64 bytes");

/* RUNNING -> LOCKED: the target's CUDA calls that launch work or change GPU state block from
 * now until the unlock; waits for the calls in flight, up to timeoutMs (then
 * CUDA_ERROR_NOT_READY and the process stays RUNNING). */
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
/* LOCKED -> CHECKPOINTED: device memory to host, the GPUs released (the PID leaves the device's
 * process list). CUDA_ERROR_NOT_SUPPORTED (and still LOCKED) for memory it cannot move. */
CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args);
/* CHECKPOINTED -> LOCKED: the memory back on the GPUs, same addresses, same bytes;
 * CUDA_ERROR_OUT_OF_MEMORY (still CHECKPOINTED) when a device has no room. */
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args);
/* LOCKED -> RUNNING: the blocked calls proceed. */
CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args);
CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state);
/* the TID of the target's thread that performs the operations (its "restore thread") */
CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid);

/* ---- not CUDA: the fake's helpers for tests ------------------------------------------------ */

/* In the calling process: a CUDA call in flight from begin to end (what a long kernel or a
 * synchronize would be), so a test can keep a lock waiting. begin blocks while the process is
 * locked, as any call does; it returns CUDA_ERROR_ILLEGAL_STATE once the process has FAILED. */
CUresult fakecuda_call_begin(void);
void fakecuda_call_end(void);
/* Waits until at least n threads of process pid are blocked by its lock, or timeout_ms passes.
 * 0, -ETIMEDOUT, or -ESRCH (no such CUDA process). */
int fakecuda_ckpt_blocked(int pid, unsigned int n, int timeout_ms);
/* The PIDs using device dev (a context or memory on it), as nvidia-smi lists them: a
 * checkpointed process is not among them. Fills up to max; returns how many there are, or -1. */
int fakecuda_processes(int dev, int *pids, int max);
/* a device's memory in use and its peak over the state file's life; 0 or -1 */
int fakecuda_stats(int dev, unsigned long long *used, unsigned long long *peak);

#endif
