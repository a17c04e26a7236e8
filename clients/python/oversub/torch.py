"""PyTorch held to the grant: the caching allocator capped at it, a degrade that really gives
memory back before it is acknowledged, usage reported from what the allocator reserves.

``import oversub.torch`` does not import torch; the first call that needs it does (an
ImportError then says so). Nothing here needs a GPU to be imported::

    import oversub, oversub.torch

    svc = oversub.Service.from_env()
    mem = oversub.torch.TorchMemory(svc)
    mem.cap()                                  # set_per_process_memory_fraction at the grant
    model = load()
    svc.ready()
    mem.report_usage()                         # torch.cuda.memory_reserved()
    with svc.listen() as inbox:
        for batch in batches(svc.batch_size):
            for d in inbox.drain():
                if d.kind == "degrade":
                    drop_references()          # activations, caches of the old batch size
                    mem.degrade(d)             # cap, empty_cache, report, then ack
                elif d.kind == "restore":
                    mem.restore(d)
            step(batch)

How the cap is reckoned: ``set_per_process_memory_fraction(f, dev)`` caps the allocator at
``f`` times the device's total as CUDA reports it *at that call*. Under oversubd's CUDA shim
(``docs/shim.md``) that total is itself the grant, and the shim lowers it live on a degrade;
so the fraction is computed from ``torch.cuda.mem_get_info(dev)`` read just before it is set,
never from a figure remembered from start. What the allocator reserves is not all a process
holds (its CUDA context, NCCL's buffers, cuBLAS workspaces are outside it): give
``headroom_mib`` for them.
"""

from __future__ import annotations

import gc
import math
import time
from typing import Any, List, Optional, Sequence

from ._core import split_grant
from .directive import DEGRADE, RESTORE, RESUME, Directive

__all__ = ["TorchMemory", "load_torch", "MIB"]

MIB = 1 << 20


def load_torch() -> Any:
    """Imports torch (the caller's), or raises ImportError saying what oversub.torch needs."""
    try:
        import torch  # type: ignore  # noqa: PLC0415 - on purpose: only when used
    except ImportError as e:
        raise ImportError("oversub.torch needs PyTorch (pip install torch); the rest of oversub "
                          "does not") from e
    return torch


class TorchMemory:
    """The service's PyTorch memory, per visible CUDA device.

    Args:
        service: the :class:`oversub.Service` whose grant it follows (its ``vram_mib`` is the
            grant over all its GPUs; a directive updates it). With an AsyncService use
            :meth:`cap`, :meth:`shrink` with ``report=False`` and :meth:`usage_mib`, and await
            the service's own calls.
        devices: the CUDA ordinals it uses (default: every visible device, 0..n-1, as
            oversubd's CUDA_VISIBLE_DEVICES numbers them).
        headroom_mib: memory each device needs outside the caching allocator (CUDA context,
            libraries' workspaces), kept out of the cap.
        torch_module: a torch to use instead of ``import torch`` (tests).
    """

    def __init__(self, service: Any, devices: Optional[Sequence[int]] = None, *,
                 headroom_mib: int = 0, torch_module: Any = None) -> None:
        self.service = service
        self._torch = torch_module
        self._devices = list(devices) if devices is not None else None
        self.headroom_mib = max(0, int(headroom_mib))
        #: The fraction last set per device.
        self.fractions: List[float] = []

    @property
    def torch(self) -> Any:
        if self._torch is None:
            self._torch = load_torch()
        return self._torch

    @property
    def devices(self) -> List[int]:
        if self._devices is None:
            n = int(self.torch.cuda.device_count())
            self._devices = list(range(n))
        return self._devices

    def grant_mib(self, vram_mib: Optional[int] = None) -> List[int]:
        """The grant per device (a multi-GPU grant split as oversubd splits it)."""
        total = self.service.vram_mib if vram_mib is None else vram_mib
        return split_grant(int(total or 0), len(self.devices))

    def _total_bytes(self, dev: int) -> int:
        cuda = self.torch.cuda
        if hasattr(cuda, "mem_get_info"):
            try:
                return int(cuda.mem_get_info(dev)[1])
            except Exception:  # noqa: BLE001 - an old driver or a stub: use the properties
                pass
        return int(cuda.get_device_properties(dev).total_memory)

    def cap(self, vram_mib: Optional[int] = None) -> List[float]:
        """Caps the caching allocator of each device at its share of the grant (``vram_mib``
        over all devices; default: the service's grant now), less ``headroom_mib``. Returns
        the fractions set. A grant of 0 (none known) leaves the allocator as it is."""
        grants = self.grant_mib(vram_mib)
        cuda = self.torch.cuda
        fractions: List[float] = []
        for dev, g in zip(self.devices, grants):
            if g <= 0:
                fractions.append(1.0)
                continue
            total = self._total_bytes(dev)
            want = max(0, g - self.headroom_mib) * MIB
            f = min(1.0, want / total) if total > 0 else 1.0
            f = max(f, 1e-6)  # 0 would mean "no memory at all" to some versions
            cuda.set_per_process_memory_fraction(f, dev)
            fractions.append(f)
        self.fractions = fractions
        return fractions

    def release_cache(self) -> None:
        """Gives back what the caching allocator holds and nothing uses: collects garbage
        (tensors only reachable from cycles), waits for the devices' queued work, then
        ``torch.cuda.empty_cache()``."""
        gc.collect()
        cuda = self.torch.cuda
        for dev in self.devices:
            if hasattr(cuda, "synchronize"):
                cuda.synchronize(dev)
        cuda.empty_cache()

    def reserved_mib(self) -> List[int]:
        """``torch.cuda.memory_reserved()`` per device, in MiB (rounded up)."""
        cuda = self.torch.cuda
        return [int(math.ceil(int(cuda.memory_reserved(dev)) / MIB)) for dev in self.devices]

    def usage_mib(self) -> int:
        """What it uses over all its devices: reserved plus the headroom of each."""
        return sum(r + self.headroom_mib for r in self.reserved_mib())

    def report_usage(self) -> int:
        """Reports :meth:`usage_mib` to oversubd; returns it."""
        u = self.usage_mib()
        self.service.report_usage(vram_mib=u)
        return u

    def fits(self, vram_mib: Optional[int] = None) -> bool:
        """True when every device's reserved memory (plus headroom) is within its grant."""
        return all(r + self.headroom_mib <= g or g <= 0
                   for r, g in zip(self.reserved_mib(), self.grant_mib(vram_mib)))

    def shrink(self, d: Directive, *, settle_s: float = 0.0, report: bool = True) -> bool:
        """A degrade's memory work, without acknowledging: the cap lowered to ``d.vram_mib``,
        the cache emptied, and the usage reported. With ``settle_s`` it tries again (the
        program's loop may still be finishing a step at the old size) until the memory fits
        or that many seconds passed. Returns whether it fits: acknowledging a degrade that
        does not would let a neighbour allocate memory this process still holds.

        As a handler (``svc.on_degrade(mem.shrink)``), its False keeps :meth:`Service.run`
        from acknowledging."""
        self.cap(d.vram_mib)
        end = time.monotonic() + max(0.0, settle_s)
        while True:
            self.release_cache()
            ok = self.fits(d.vram_mib)
            if ok or time.monotonic() >= end:
                break
            time.sleep(0.05)
        if report:
            self.report_usage()
        return ok

    def degrade(self, d: Directive, *, settle_s: float = 0.0) -> bool:
        """:meth:`shrink`, then the acknowledgement when the memory fits. Returns whether it
        acknowledged. The service's batch size is already ``d.batch_size``
        (``service.batch_size``); drop what the old batch held before calling this."""
        if d.kind != DEGRADE:
            raise ValueError(f"degrade() got a {d.kind} directive")
        ok = self.shrink(d, settle_s=settle_s)
        if ok:
            self.service.ack(d)
        return ok

    def restore(self, d: Optional[Directive] = None) -> List[float]:
        """The cap raised back to the grant (after a restore or a resume)."""
        if d is not None and d.kind not in (RESTORE, RESUME):
            raise ValueError(f"restore() got a {d.kind} directive")
        return self.cap(d.vram_mib if d is not None and d.vram_mib else None)

    def install(self, *, settle_s: float = 0.0) -> None:
        """Registers handlers on the service for :meth:`Service.run`: on a degrade
        :meth:`shrink` (acknowledged by run() when it fits), on a restore or a resume
        :meth:`restore`. Handlers the program registered itself are kept and run first."""
        svc = self.service
        prev = {k: svc._handlers.get(k) for k in (DEGRADE, RESTORE, RESUME)}

        def on_degrade(d: Directive) -> Any:
            if prev[DEGRADE] is not None:
                prev[DEGRADE](d)
            return self.shrink(d, settle_s=settle_s)

        def on_grow(d: Directive) -> Any:
            h = prev.get(d.kind)
            r = h(d) if h is not None else None
            self.restore(d)
            return r

        svc.on_degrade(on_degrade)
        svc.on_restore(on_grow)
        svc.on_resume(on_grow)
