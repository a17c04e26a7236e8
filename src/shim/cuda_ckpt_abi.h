/* cuda_ckpt_abi.h - the CUDA driver's process checkpoint API (CUDA 12.8 / driver r570 and
 * later; the cuda-checkpoint utility since 550): its codes, states and argument structs, as
 * NVIDIA's documented ABI gives them (cuda.h of CUDA 12.8-13.0, 64-bit builds), so that no CUDA
 * headers are needed. Shared by oversubd's cuda suspend mechanism (which loads the entry points
 * with dlopen) and the fake driver of the tests.
 *
 * The calls name a target process by PID; they are made by another process (oversubd) or by
 * the target itself. Every argument struct is 64 bytes and optional (NULL: defaults); its
 * reserved fields must be zero (CUDA_ERROR_INVALID_VALUE otherwise). */
#ifndef OSUB_CUDA_CKPT_ABI_H
#define OSUB_CUDA_CKPT_ABI_H

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

/* the entry points, as loaded by name */
typedef CUresult (*osub_cu_ckpt_lock_fn)(int pid, CUcheckpointLockArgs *args);
typedef CUresult (*osub_cu_ckpt_checkpoint_fn)(int pid, CUcheckpointCheckpointArgs *args);
typedef CUresult (*osub_cu_ckpt_restore_fn)(int pid, CUcheckpointRestoreArgs *args);
typedef CUresult (*osub_cu_ckpt_unlock_fn)(int pid, CUcheckpointUnlockArgs *args);
typedef CUresult (*osub_cu_ckpt_state_fn)(int pid, CUprocessState *state);

#endif
