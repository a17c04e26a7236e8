"""What the blocking and the asyncio clients share: the environment, the service's view of its
grant, the handlers, the long-poll's bookkeeping and the backoff. No I/O here."""

from __future__ import annotations

import logging
import os
import random
import time
import urllib.parse
from typing import (Any, Callable, Dict, Iterable, List, Mapping, MutableMapping, Optional,
                    Tuple, Union)

from ._http import Endpoint
from .directive import DEGRADE, EVICT, RESTORE, RESUME, SUSPEND, Directive, DirectiveBatch
from .errors import MissingEnvironment

log = logging.getLogger("oversub")

#: What ``Service.from_env()`` reads, and what each means. oversubd sets all but
#: ``OVERSUB_SOCKET`` for the services it runs (``docs/actuation.md``); an external service,
#: or a test, sets them itself.
ENVIRONMENT: Dict[str, str] = {
    "OVERSUB_SERVICE": "the service's id",
    "OVERSUB_CONTROL_URL": "the control API: http://HOST:PORT (or unix:PATH)",
    "OVERSUB_SOCKET": "not set by oversubd: the Unix socket's path, used when "
                      "OVERSUB_CONTROL_URL is not set",
    "OVERSUB_TOKEN": "the service's own token (usage, ready, ack, exited, backends)",
    "OVERSUB_VRAM_MIB": "its grant at start, MiB over all its GPUs",
    "OVERSUB_BATCH_SIZE": "its batch size at start (0: the spec gave none)",
    "OVERSUB_CHECKPOINT_DIR": "where it writes checkpoints",
    "OVERSUB_RESUME_FROM": "set when it is started again after an eviction: the checkpoint it "
                           "reported",
    "OVERSUB_SHIM_SEGMENT": "the CUDA shim's grant segment (docs/shim.md)",
    "OVERSUB_SHIM_LOG": "the CUDA shim's log, when the spec asked for one",
    "OVERSUB_SHIM_LIBCUDA": "the driver library the CUDA shim loads, when the spec named one",
}

DEFAULT_URL = "http://127.0.0.1:7070"

#: States in which the service is gone: the directives end.
GONE_STATES = ("released", "failed")

Handler = Callable[[Directive], Any]


def _env_int(env: Mapping[str, str], name: str) -> Optional[int]:
    v = env.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        return int(v.strip())
    except ValueError:
        raise MissingEnvironment("missing_environment",
                                 f"{name}={v!r} is not a whole number") from None


def split_grant(vram_mib: int, n: int) -> List[int]:
    """A grant over n GPUs as oversubd splits it: evenly, the odd MiB on the first."""
    if n <= 0:
        return []
    each, rest = divmod(max(0, vram_mib), n)
    return [each + rest] + [each] * (n - 1)


class Backoff:
    """Exponential backoff with jitter for reconnecting: 0.2 s, 0.4 s ... up to ``maximum``,
    each spread over [0.5, 1.5) of itself; :meth:`reset` after a success."""

    def __init__(self, initial: float = 0.2, maximum: float = 5.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial
        self.failing_since: Optional[float] = None

    def reset(self) -> None:
        self._next = self.initial
        self.failing_since = None

    def next_delay(self, hint: Optional[float] = None) -> float:
        """The wait before the next attempt (a ``Retry-After`` hint is honoured up to
        ``maximum``)."""
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        d = self._next * (0.5 + random.random())
        self._next = min(self.maximum, self._next * 2)
        if hint is not None:
            d = max(d, min(hint, self.maximum))
        return d

    def failing_for(self) -> float:
        return 0.0 if self.failing_since is None else time.monotonic() - self.failing_since


class Tracker:
    """The long-poll's bookkeeping: where to resume (the last sequence seen), what to deliver
    and when the directives end.

    - Started without ``after``, the first answer is the daemon's history (the last 8
      directives it kept). Of those only the one that still holds is delivered, marked
      ``replayed``: the newest eviction while the service drains, the newest degrade while it
      is degraded, a resume that is the newest directive while it is loading again. A service
      started again after an eviction does not see that eviction again.
    - After oversubd restarts it repeats the outstanding directive (an unacknowledged
      degrade, an eviction) with a new number and the same deadline. A repeat of one already
      delivered is not delivered again: :meth:`feed` returns it among the repeats (the client
      acknowledges it again when it had been).
    - An answer whose ``last_seq`` is below the resume point means the daemon's numbering went
      back (its clock did): resume from 0.
    - The directives end when the service is released or failed (or unknown to the daemon
      after it had been seen), and after an eviction when ``stop_on_evict``.
    """

    def __init__(self, after: Optional[int], stop_on_evict: bool) -> None:
        self.catch_up = after is None
        self.after = after or 0
        self.stop_on_evict = stop_on_evict
        self.delivered: Dict[Tuple[str, int], int] = {}
        self.ended = False
        self.seen_service = False
        self.state: Optional[str] = None

    @staticmethod
    def key(d: Directive) -> Optional[Tuple[str, int]]:
        if d.deadline_unix_ms is None:
            return None
        return (d.kind, d.deadline_unix_ms)

    def feed(self, batch: DirectiveBatch) -> Tuple[List[Directive], List[Directive]]:
        """What to deliver from one answer, and the repeats of directives already delivered.
        Sets :attr:`ended` when nothing more will come."""
        self.seen_service = True
        self.state = batch.state
        if batch.last_seq < self.after:
            log.info("the daemon's directive numbers went back (%d < %d): resuming "
                     "from 0", batch.last_seq, self.after)
            self.after = 0
        ds = sorted(batch.directives, key=lambda d: d.seq)
        if ds:
            self.after = max(self.after, ds[-1].seq)
        if self.catch_up:
            self.catch_up = False
            ds = self._still_holding(ds, batch.state)
        fresh: List[Directive] = []
        repeats: List[Directive] = []
        for d in ds:
            k = self.key(d)
            if k is not None and k in self.delivered:
                repeats.append(d)
                continue
            if k is not None:
                self.delivered[k] = d.seq
            fresh.append(d)
            if d.kind == EVICT and self.stop_on_evict:
                self.ended = True
                break
        if batch.state in GONE_STATES:
            self.ended = True
        return fresh, repeats

    def gone(self) -> bool:
        """The daemon does not know the service: True (the end) when it had been seen."""
        if self.seen_service:
            self.ended = True
            self.state = "released"
            return True
        return False

    @staticmethod
    def _still_holding(ds: List[Directive], state: str) -> List[Directive]:
        if not ds:
            return []
        newest = ds[-1]
        if state in ("loading", "resuming"):
            # started again from the queue: an external service learns it from its resume
            keep = newest if newest.kind == RESUME else None
        else:
            want = {"draining": EVICT, "overdue": EVICT, "degraded": DEGRADE,
                    "suspending": SUSPEND, "suspended": SUSPEND}.get(state)
            keep = next((d for d in reversed(ds) if d.kind == want), None) if want else None
        return [Directive.from_json(keep.raw, replayed=True)] if keep is not None else []


def batch_from_json(obj: Any) -> DirectiveBatch:
    """A long-poll answer (``{"directives": [...], "state", "last_seq"}``)."""
    if not isinstance(obj, dict):
        obj = {}
    ds = [Directive.from_json(x) for x in obj.get("directives") or [] if isinstance(x, dict)]
    last = obj.get("last_seq")
    return DirectiveBatch(directives=ds, state=str(obj.get("state") or ""),
                          last_seq=last if isinstance(last, int) else 0)


class ServiceBase:
    """The service as it knows itself: its id, the daemon's address, its token, its grant and
    batch size as the directives change them, its checkpoint folders, and its handlers."""

    def __init__(
        self,
        service_id: str,
        url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        vram_mib: Optional[int] = None,
        batch_size: Optional[int] = None,
        checkpoint_dir: Optional[str] = None,
        resume_from: Optional[str] = None,
        gpus: Optional[Iterable[str]] = None,
        shim_segment: Optional[str] = None,
        environ: Optional[Mapping[str, str]] = None,
        timeout: float = 10.0,
        retry_for: float = 10.0,
    ) -> None:
        if not service_id:
            raise ValueError("a service id is needed")
        self.id = service_id
        self.endpoint = Endpoint(url or DEFAULT_URL)
        self.token = token or None
        #: The grant now (MiB over all its GPUs): OVERSUB_VRAM_MIB, then each degrade,
        #: restore and resume.
        self.vram_mib: Optional[int] = vram_mib
        #: The batch size now: OVERSUB_BATCH_SIZE, then each degrade and restore.
        self.batch_size: Optional[int] = batch_size
        #: What they were at start (a restore without figures goes back to these).
        self.initial_vram_mib = vram_mib
        self.initial_batch_size = batch_size
        self.checkpoint_dir = checkpoint_dir or None
        self.resume_from = resume_from or None
        self.gpus: Tuple[str, ...] = tuple(gpus or ())
        self.shim_segment = shim_segment or None
        #: Every OVERSUB_* variable that was set (from_env), as it was.
        self.environ: Dict[str, str] = dict(environ or {})
        self.timeout = timeout
        self.retry_for = retry_for
        #: The state the daemon last reported in a long-poll answer.
        self.state: Optional[str] = None
        #: The last directive sequence number seen.
        self.last_seq = 0
        self._handlers: Dict[str, Handler] = {}
        self._acked: Dict[Tuple[str, int], Optional[str]] = {}
        # the last usage report that went through: (MiB, time.monotonic())
        self._last_usage: Optional[Tuple[int, float]] = None

    # ---- construction --------------------------------------------------------------------

    @classmethod
    def _env_kwargs(cls, environ: Optional[Mapping[str, str]], url: Optional[str],
                    service_id: Optional[str], token: Optional[str]) -> Dict[str, Any]:
        env = os.environ if environ is None else environ
        sid = service_id or env.get("OVERSUB_SERVICE", "").strip()
        if not sid:
            raise MissingEnvironment(
                "missing_environment",
                "OVERSUB_SERVICE is not set: this program is not running under oversub "
                "(oversubd sets it for the services it runs; an external service sets it "
                "itself, with OVERSUB_CONTROL_URL and OVERSUB_TOKEN)")
        sock = env.get("OVERSUB_SOCKET", "").strip()
        u = url or env.get("OVERSUB_CONTROL_URL", "").strip() or (
            f"unix:{sock}" if sock else DEFAULT_URL)
        cvd = env.get("CUDA_VISIBLE_DEVICES", "").strip()
        return dict(
            service_id=sid,
            url=u,
            token=token or env.get("OVERSUB_TOKEN") or None,
            vram_mib=_env_int(env, "OVERSUB_VRAM_MIB"),
            batch_size=_env_int(env, "OVERSUB_BATCH_SIZE"),
            checkpoint_dir=env.get("OVERSUB_CHECKPOINT_DIR") or None,
            resume_from=env.get("OVERSUB_RESUME_FROM") or None,
            gpus=[g.strip() for g in cvd.split(",") if g.strip()] if cvd else [],
            shim_segment=env.get("OVERSUB_SHIM_SEGMENT") or None,
            environ={k: v for k, v in env.items() if k.startswith("OVERSUB_")},
        )

    # ---- what it knows -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The daemon's address as given."""
        return self.endpoint.url

    @property
    def resumed(self) -> bool:
        """True when this run continues from a checkpoint (``OVERSUB_RESUME_FROM``)."""
        return self.resume_from is not None

    @property
    def managed(self) -> bool:
        """True when oversubd runs this program (it set a checkpoint folder or a shim)."""
        return "OVERSUB_CHECKPOINT_DIR" in self.environ or self.shim_segment is not None

    def grant_per_gpu(self, n: Optional[int] = None) -> List[int]:
        """The grant now, split over its GPUs as oversubd splits it (n: the number of GPUs;
        default: those in CUDA_VISIBLE_DEVICES, else 1)."""
        count = n if n is not None else max(1, len(self.gpus))
        return split_grant(self.vram_mib or 0, count)

    def checkpoint_path(self, name: str) -> str:
        """A path in the checkpoint folder (which must be set)."""
        if not self.checkpoint_dir:
            raise MissingEnvironment("missing_environment",
                                     "no checkpoint folder: OVERSUB_CHECKPOINT_DIR is not set")
        return os.path.join(self.checkpoint_dir, name)

    def _path(self, what: str = "") -> str:
        p = "/v1/services/" + urllib.parse.quote(self.id, safe="")
        return p + ("/" + what if what else "")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.id!r}, url={self.url!r}, vram_mib={self.vram_mib},"
                f" batch_size={self.batch_size})")

    # ---- directives change what it holds -------------------------------------------------

    def _apply(self, d: Directive) -> None:
        if d.kind == DEGRADE:
            self.vram_mib = d.vram_mib
            if d.batch_size > 0:
                self.batch_size = d.batch_size
        elif d.kind == RESTORE:
            self.vram_mib = d.vram_mib or self.initial_vram_mib
            self.batch_size = d.batch_size or self.initial_batch_size
        elif d.kind == RESUME:
            if d.vram_mib:
                self.vram_mib = d.vram_mib
            if d.batch_size:
                self.batch_size = d.batch_size
            if d.checkpoint:
                self.resume_from = d.checkpoint

    # ---- handlers ------------------------------------------------------------------------

    def _register(self, kind: str, fn: Optional[Handler]) -> Any:
        if fn is None:  # used as @svc.on_degrade()
            def deco(f: Handler) -> Handler:
                self._handlers[kind] = f
                return f
            return deco
        self._handlers[kind] = fn
        return fn

    def on_degrade(self, fn: Optional[Handler] = None) -> Any:
        """Registers the degrade handler (also a decorator). It must bring the service down to
        ``d.vram_mib`` / ``d.batch_size`` (already in :attr:`vram_mib` and :attr:`batch_size`
        when it is called); :meth:`run` acknowledges once it returns, unless it returns False.
        """
        return self._register(DEGRADE, fn)

    def on_restore(self, fn: Optional[Handler] = None) -> Any:
        """Registers the restore handler: the full grant and batch size are back."""
        return self._register(RESTORE, fn)

    def on_evict(self, fn: Optional[Handler] = None) -> Any:
        """Registers the eviction handler: checkpoint within ``d.time_left()`` and return the
        checkpoint (a path or a name) to have it reported, or None; then leave (a managed
        service is also sent SIGTERM, then SIGKILL when the grace period ends)."""
        return self._register(EVICT, fn)

    def on_suspend(self, fn: Optional[Handler] = None) -> Any:
        """Registers the suspend handler (acknowledged once it returns)."""
        return self._register(SUSPEND, fn)

    def on_resume(self, fn: Optional[Handler] = None) -> Any:
        """Registers the resume handler (external services: the grant is back, continue from
        ``d.checkpoint``); :meth:`run` reports ready once it returns."""
        return self._register(RESUME, fn)

    def on_directive(self, fn: Optional[Handler] = None) -> Any:
        """Registers a handler for every kind that has none of its own."""
        return self._register("*", fn)

    def _handler_for(self, d: Directive) -> Optional[Handler]:
        return self._handlers.get(d.kind) or self._handlers.get("*")

    @staticmethod
    def _after_handler(d: Directive, result: Any) -> Tuple[str, Optional[str]]:
        """What run() does once a handler returned: ("ack", checkpoint), ("ready", None) or
        ("none", None)."""
        if result is False:
            return "none", None
        ck = result if isinstance(result, str) and result else None
        if d.kind in (DEGRADE, SUSPEND):
            return "ack", ck
        if d.kind == EVICT:
            return ("ack", ck) if ck else ("none", None)
        if d.kind == RESUME:
            return "ready", None
        return "none", None

    def _note_usage(self, body: Mapping[str, Any]) -> None:
        if "vram_mib" in body:
            total = int(body["vram_mib"])
        else:
            total = sum(int(g["vram_mib"]) for g in body.get("gpus", []))
        self._last_usage = (total, time.monotonic())

    def _acked_by_usage(self, d: Optional[Directive]) -> bool:
        """True when a usage report at or under d's grant went through after d arrived: the
        daemon took it as the acknowledgement (docs/actuation.md), so nothing is left to ack."""
        if d is None or d.kind != DEGRADE or self._last_usage is None:
            return False
        mib, at = self._last_usage
        return at >= d.received_monotonic and mib <= d.vram_mib

    def _note_ack(self, d: Optional[Directive], checkpoint: Optional[str]) -> None:
        if d is not None:
            k = Tracker.key(d)
            if k is not None:
                self._acked[k] = checkpoint

    def _ack_body(self, checkpoint: Optional[str]) -> Dict[str, Any]:
        if checkpoint is not None and not (isinstance(checkpoint, str) and checkpoint):
            raise ValueError("a checkpoint is a non-empty string (a path or a name)")
        return {"checkpoint": checkpoint} if checkpoint else {}

    @staticmethod
    def _usage_body(vram_mib: Optional[int], gpus: Union[None, Mapping[int, int],
                    Iterable[Tuple[int, int]]], compute_pct: Optional[int]) -> Dict[str, Any]:
        body: MutableMapping[str, Any] = {}
        if gpus is not None:
            items = gpus.items() if isinstance(gpus, Mapping) else gpus
            body["gpus"] = [{"gpu": int(g), "vram_mib": int(m)} for g, m in items]
        elif vram_mib is not None:
            body["vram_mib"] = int(vram_mib)
        else:
            raise ValueError("report_usage needs vram_mib or gpus")
        if compute_pct is not None:
            body["compute_pct"] = int(compute_pct)
        return dict(body)
