/* fake_cuda_ckpt.h - the CUDA driver's process checkpoint API (CUDA 12.8 / driver r570 and
 * later) as the fake driver (fake_cuda.c) implements it, plus the fake's own test helpers. The
 * types are the ABI's (src/shim/cuda_ckpt_abi.h). */
#ifndef OSUB_FAKE_CUDA_CKPT_H
#define OSUB_FAKE_CUDA_CKPT_H

#include "cuda_ckpt_abi.h"

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
