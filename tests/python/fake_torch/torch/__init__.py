"""A stand-in for PyTorch, for oversub.torch's tests: only torch.cuda's memory calls, with a
caching allocator simulated well enough to tell a cap, an empty_cache and a reserved figure
apart. Every call is recorded in ``torch.calls`` (a list shared with the test, which may append
its own entries to see the order of events).

Knobs for a test: ``torch.cuda._devices`` (total bytes per device), ``torch.cuda._shim_total``
(when set, what mem_get_info answers as total, as oversubd's CUDA shim makes it answer the
grant), ``torch.cuda.allocate(dev, nbytes)`` / ``free(handle)``.
"""

from . import cuda  # noqa: F401

__version__ = "0.0-fake"
calls = cuda.calls
