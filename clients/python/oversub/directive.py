"""Directives: what oversubd tells a service to do (``docs/actuation.md``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

__all__ = ["Directive", "DirectiveBatch", "KINDS", "DEGRADE", "RESTORE", "EVICT", "SUSPEND",
           "RESUME"]

DEGRADE = "degrade"
RESTORE = "restore"
EVICT = "evict"
SUSPEND = "suspend"
RESUME = "resume"
#: The kinds a directive may have. oversubd sends degrade, restore and evict to every service
#: and resume to external ones; suspend is reserved for the suspend rung of DESIGN.md (the
#: daemon suspends through the engine's own endpoints, so it does not send it today).
KINDS = (DEGRADE, RESTORE, EVICT, SUSPEND, RESUME)


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _opt_int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_str(v: Any) -> Optional[str]:
    return v if isinstance(v, str) and v else None


@dataclass(frozen=True)
class Directive:
    """One directive, as the long-poll (or a webhook) delivered it.

    Attributes:
        seq: its sequence number (rising, across the daemon's restarts too).
        kind: ``"degrade"``, ``"restore"``, ``"evict"``, ``"suspend"`` or ``"resume"`` (the
            daemon's ``action``; an unknown one is passed through as it came).
        service: the service's id.
        vram_mib: the grant it sets (the new, smaller one for a degrade; the full one for a
            restore or a resume; 0 for an eviction). The total over the service's GPUs.
        batch_size: the batch size it sets (0 when the spec has none, and for an eviction).
        reason: the daemon's reason code (``preemption``, ``pressure``, ``ack_timeout`` ...).
        message: the daemon's sentence, naming services, GPUs and MiB.
        deadline_unix_ms: a degrade's acknowledgement deadline, an eviction's end of grace
            (wall clock, ms); None when the directive has none.
        remaining_ms: what was left of it when the daemon answered.
        checkpoint_dir: where the service writes checkpoints (managed services).
        checkpoint: the checkpoint a ``resume`` continues from, when one was reported.
        replayed: True when it came from the daemon's history as the iterator started (the
            service is still in the state it put it in: a degrade not yet acknowledged, or an
            eviction under way), not as it was issued.
        received_monotonic: ``time.monotonic()`` when it arrived.
        raw: the JSON object as received.
    """

    seq: int
    kind: str
    service: str = ""
    vram_mib: int = 0
    batch_size: int = 0
    reason: str = ""
    message: str = ""
    deadline_unix_ms: Optional[int] = None
    remaining_ms: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    checkpoint: Optional[str] = None
    replayed: bool = False
    received_monotonic: float = field(default_factory=time.monotonic, compare=False)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, replayed: bool = False) -> "Directive":
        """A directive from the daemon's JSON (``{"seq", "action", ...}``)."""
        return cls(
            seq=_int(obj.get("seq")),
            kind=str(obj.get("action") or obj.get("kind") or ""),
            service=str(obj.get("service") or ""),
            vram_mib=_int(obj.get("vram_mib")),
            batch_size=_int(obj.get("batch_size")),
            reason=str(obj.get("reason") or ""),
            message=str(obj.get("message") or ""),
            deadline_unix_ms=_opt_int(obj.get("deadline_unix_ms")),
            remaining_ms=_opt_int(obj.get("remaining_ms")),
            checkpoint_dir=_opt_str(obj.get("checkpoint_dir")),
            checkpoint=_opt_str(obj.get("checkpoint")),
            replayed=replayed,
            raw=dict(obj),
        )

    @property
    def action(self) -> str:
        """The daemon's name for :attr:`kind`."""
        return self.kind

    @property
    def deadline(self) -> Optional[float]:
        """The deadline as Unix time in seconds (``time.time()``'s scale), or None."""
        if self.deadline_unix_ms is None:
            return None
        return self.deadline_unix_ms / 1000.0

    def time_left(self) -> Optional[float]:
        """Seconds left before the deadline (0 once passed), or None without one. Counted
        from ``remaining_ms`` on this host's monotonic clock, so a skewed wall clock between
        the service and the daemon does not move it."""
        if self.remaining_ms is not None:
            left = self.remaining_ms / 1000.0 - (time.monotonic() - self.received_monotonic)
            return max(0.0, left)
        if self.deadline is not None:
            return max(0.0, self.deadline - time.time())
        return None

    def to_json(self) -> Dict[str, Any]:
        """The directive as the daemon wrote it."""
        return dict(self.raw) if self.raw else {
            "seq": self.seq, "action": self.kind, "service": self.service,
            "vram_mib": self.vram_mib, "batch_size": self.batch_size,
        }


@dataclass(frozen=True)
class DirectiveBatch:
    """One answer of the long-poll: the directives after the ``after`` asked for, the
    service's state and the daemon's last sequence number (over all services)."""

    directives: List[Directive]
    state: str
    last_seq: int
