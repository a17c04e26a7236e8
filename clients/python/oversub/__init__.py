"""oversub: the Python client of oversubd's service-side protocol.

A service that runs under oversub (``docs/actuation.md``) reads what the daemon told it from
its environment, reports that it is ready and what memory it uses, and obeys directives:
degrade (a smaller grant and batch), restore, evict (checkpoint and leave), suspend, resume::

    import oversub

    svc = oversub.Service.from_env()        # OVERSUB_SERVICE, OVERSUB_CONTROL_URL, ...
    svc.ready()
    for d in svc.directives():              # long-poll; reconnects; ends on release/evict
        if d.kind == "degrade":
            batch = d.batch_size            # also svc.batch_size
            free_memory()
            svc.ack(d)
        elif d.kind == "evict":
            svc.ack(d, checkpoint=save(svc.checkpoint_dir))

- :class:`Service` (blocking, thread-safe) and :class:`oversub.aio.AsyncService` (asyncio);
- :class:`Directive` (``kind``, ``vram_mib``, ``batch_size``, ``deadline``, ``time_left()``);
- callbacks: ``svc.on_degrade(fn)``, ``on_restore``, ``on_evict``, ``on_suspend``,
  ``on_resume``, then ``svc.run()`` (or ``run_in_thread()``); ``svc.listen()`` queues them for
  a loop;
- errors: :class:`OversubError` and subclasses, carrying the daemon's ``code``;
- :mod:`oversub.torch`: PyTorch's caching allocator held to the grant (imports torch only
  when used);
- :mod:`oversub.webhook`: directives by webhook (``control_url``): the signature checked, a
  small receiver;
- :class:`Client`: the rest of the API (submit, services, events), for tools and tests.

Standard library only; Python 3.9 or later.
"""

from ._core import DEFAULT_URL, ENVIRONMENT, split_grant
from .directive import (DEGRADE, EVICT, KINDS, RESTORE, RESUME, SUSPEND, Directive,
                        DirectiveBatch)
from .errors import (Conflict, DaemonUnreachable, Forbidden, InvalidRequest, MissingEnvironment,
                     NoDirective, NotFound, OversubError, Unauthorized, Unavailable,
                     UnknownService)
from .service import Client, Listener, Service

__version__ = "0.1.0"

__all__ = [
    "Service", "Client", "Listener", "Directive", "DirectiveBatch",
    "KINDS", "DEGRADE", "RESTORE", "EVICT", "SUSPEND", "RESUME",
    "ENVIRONMENT", "DEFAULT_URL", "split_grant",
    "OversubError", "DaemonUnreachable", "MissingEnvironment", "InvalidRequest", "Unauthorized",
    "Forbidden", "NotFound", "UnknownService", "Conflict", "NoDirective", "Unavailable",
    "__version__",
]
