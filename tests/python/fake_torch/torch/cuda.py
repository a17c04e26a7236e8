"""torch.cuda, faked (see torch/__init__.py)."""

from typing import Dict, List, Optional, Tuple

MIB = 1 << 20
calls: List[Tuple] = []
_devices: List[int] = [81920 * MIB, 81920 * MIB]
_shim_total: Dict[int, int] = {}
_fraction: Dict[int, float] = {}
_cap: Dict[int, Optional[int]] = {}
_allocated: Dict[int, int] = {}
_reserved: Dict[int, int] = {}
_blocks: Dict[int, Tuple[int, int]] = {}
_next = [1]


class OutOfMemoryError(RuntimeError):
    pass


class _Props:
    def __init__(self, total: int) -> None:
        self.total_memory = total
        self.name = "Fake GPU"


def reset(devices: Optional[List[int]] = None) -> None:
    del calls[:]
    if devices is not None:
        _devices[:] = devices
    for d in (_shim_total, _fraction, _cap, _allocated, _reserved, _blocks):
        d.clear()
    _next[0] = 1


def is_available() -> bool:
    return True


def device_count() -> int:
    return len(_devices)


def get_device_properties(dev: int) -> _Props:
    return _Props(_devices[dev])


def mem_get_info(dev: int = 0) -> Tuple[int, int]:
    total = _shim_total.get(dev, _devices[dev])
    return max(0, total - _reserved.get(dev, 0)), total


def set_per_process_memory_fraction(fraction: float, device: int = 0) -> None:
    if not 0 <= fraction <= 1:
        raise ValueError("fraction out of range")
    _fraction[device] = fraction
    # as PyTorch does: the fraction of the total CUDA reports at this call
    _cap[device] = int(fraction * mem_get_info(device)[1])
    calls.append(("set_per_process_memory_fraction", device, fraction))


def allocate(dev: int, nbytes: int) -> int:
    """A tensor of nbytes on dev: served from the cache, else reserved anew (within the cap)."""
    cached = _reserved.get(dev, 0) - _allocated.get(dev, 0)
    grow = max(0, nbytes - cached)
    cap = _cap.get(dev)
    if grow and cap is not None and _reserved.get(dev, 0) + grow > cap:
        calls.append(("oom", dev, nbytes))
        raise OutOfMemoryError(f"CUDA out of memory: {nbytes} bytes past the cap {cap}")
    _reserved[dev] = _reserved.get(dev, 0) + grow
    _allocated[dev] = _allocated.get(dev, 0) + nbytes
    h = _next[0]
    _next[0] += 1
    _blocks[h] = (dev, nbytes)
    return h


def free(handle: int) -> None:
    """The tensor dropped: its memory stays reserved (cached) until empty_cache."""
    dev, n = _blocks.pop(handle)
    _allocated[dev] -= n


def empty_cache() -> None:
    for dev in list(_reserved):
        _reserved[dev] = _allocated.get(dev, 0)
    calls.append(("empty_cache",))


def synchronize(dev: int = 0) -> None:
    calls.append(("synchronize", dev))


def memory_reserved(dev: int = 0) -> int:
    return _reserved.get(dev, 0)


def memory_allocated(dev: int = 0) -> int:
    return _allocated.get(dev, 0)
