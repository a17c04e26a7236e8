#!/usr/bin/env python3
"""fake_torch.py - a PyTorch-like job for tests: a CUDA program (through libcuda.so.1: the fake
driver of tests/fakes, or a real one) that holds device memory with a known pattern and works on
it, as a training or inference process holds its tensors. It never speaks to oversub.

    fake_torch.py --mib N --status FILE [--cuda-lib PATH] [--step-ms MS]

Allocates N MiB on device 0, writes a 64 KiB pattern at its start, then, every --step-ms
(default 50), reads the pattern back (a CUDA call: it blocks while the CUDA checkpoint API holds
the process locked) and rewrites FILE with "steps=K intact=1" (or intact=0 when the bytes
changed). Standard library only (ctypes)."""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

PATTERN = bytes((i * 31 + 7) & 0xFF for i in range(65536))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--status", required=True)
    p.add_argument("--cuda-lib", default="libcuda.so.1")
    p.add_argument("--step-ms", type=int, default=50)
    a = p.parse_args()
    cu = ctypes.CDLL(a.cuda_lib)
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    ptr = ctypes.c_ulonglong()
    if (cu.cuInit(0) != 0 or cu.cuDeviceGet(ctypes.byref(dev), 0) != 0
            or cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) != 0
            or cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(a.mib << 20)) != 0):
        print("fake_torch: no CUDA device memory", file=sys.stderr)
        return 1
    src = ctypes.create_string_buffer(PATTERN, len(PATTERN))
    if cu.cuMemcpyHtoD_v2(ptr, src, ctypes.c_size_t(len(PATTERN))) != 0:
        return 1
    back = ctypes.create_string_buffer(len(PATTERN))
    steps = 0
    while True:
        rc = cu.cuMemcpyDtoH_v2(back, ptr, ctypes.c_size_t(len(PATTERN)))
        steps += 1
        intact = 1 if rc == 0 and back.raw == PATTERN else 0
        tmp = a.status + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"steps={steps} intact={intact} pid={os.getpid()}\n")
        os.replace(tmp, a.status)
        time.sleep(a.step_ms / 1000.0)


if __name__ == "__main__":
    sys.exit(main())
