"""Errors raised by the oversub client.

Every error the daemon answers is ``{"error": {"code": ..., "message": ...}}`` with an HTTP
status; the client raises it as an :class:`OversubError` (or one of its subclasses) carrying
both, so that a program can match on the daemon's stable ``code``::

    try:
        svc.ack(d)
    except oversub.OversubError as e:
        if e.code != "no_directive":
            raise

Failing to reach the daemon at all is :class:`DaemonUnreachable` (``code`` ``"unreachable"``,
``status`` 0).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "OversubError",
    "DaemonUnreachable",
    "MissingEnvironment",
    "InvalidRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "UnknownService",
    "Conflict",
    "NoDirective",
    "Unavailable",
    "error_from_response",
]


class OversubError(Exception):
    """An error from oversubd (or on the way to it).

    Attributes:
        code: the daemon's error code (``"unknown_service"``, ``"no_directive"``,
            ``"unauthorized"``, ``"invalid_usage"`` ...), or the client's own
            (``"unreachable"``, ``"missing_environment"``, ``"bad_response"``).
        message: the daemon's sentence.
        status: the HTTP status (0 when no answer came).
        method, path: the request that failed, when there was one.
        body: the whole decoded answer (a refused submit carries its ``decision``).
        retry_after: seconds from a ``Retry-After`` header, when the daemon sent one.
    """

    def __init__(
        self,
        code: str,
        message: str,
        status: int = 0,
        *,
        method: Optional[str] = None,
        path: Optional[str] = None,
        body: Optional[Mapping[str, Any]] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        self.code = code
        self.message = message
        self.status = status
        self.method = method
        self.path = path
        self.body: Dict[str, Any] = dict(body or {})
        self.retry_after = retry_after
        where = f" ({method} {path})" if method and path else ""
        shown = f"{status} {code}" if status else code
        super().__init__(f"{shown}: {message}{where}")


class DaemonUnreachable(OversubError):
    """No answer: the connection was refused, dropped or timed out (oversubd down or
    restarting)."""


class MissingEnvironment(OversubError):
    """``Service.from_env()`` found no ``OVERSUB_SERVICE`` (or no daemon address): the program
    does not run under oversub."""


class InvalidRequest(OversubError):
    """400, 413, 415 or 422: the request itself is wrong (a field, a size, a media type)."""


class Unauthorized(OversubError):
    """401: the daemon has an admin token and the request carried neither it nor the
    service's own token."""


class Forbidden(OversubError):
    """403: refused whatever the token (a ``Host`` that is not the daemon's, a managed
    ``command`` over TCP without the admin token ...)."""


class NotFound(OversubError):
    """404: no such endpoint, GPU or service."""


class UnknownService(NotFound):
    """404 ``unknown_service``: the daemon does not know this service (released, or never
    submitted)."""


class Conflict(OversubError):
    """409: refused in the current state (no room, a different spec for a live id ...)."""


class NoDirective(Conflict):
    """409 ``no_directive``: an acknowledgement with nothing outstanding to acknowledge."""


class Unavailable(OversubError):
    """503 or 507: busy, or its disk is full; worth retrying after ``retry_after``."""


_BY_CODE: Dict[str, Type[OversubError]] = {
    "unknown_service": UnknownService,
    "no_directive": NoDirective,
    "unauthorized": Unauthorized,
}

_BY_STATUS: Dict[int, Type[OversubError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: InvalidRequest,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    503: Unavailable,
    507: Unavailable,
}


def error_from_response(
    status: int,
    body: Any,
    *,
    method: Optional[str] = None,
    path: Optional[str] = None,
    retry_after: Optional[float] = None,
) -> OversubError:
    """The exception for a non-2xx answer: the daemon's ``error.code`` and ``message`` when
    the body has them, else a code made from the status."""
    code = f"http_{status}"
    message = "the daemon answered an error without a JSON body"
    data: Dict[str, Any] = body if isinstance(body, dict) else {}
    err = data.get("error")
    if isinstance(err, dict):
        code = str(err.get("code") or code)
        message = str(err.get("message") or message)
    elif isinstance(body, str) and body.strip():
        message = body.strip()[:500]
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        cls = Unavailable if status >= 500 else OversubError
    return cls(
        code, message, status, method=method, path=path, body=data, retry_after=retry_after
    )
