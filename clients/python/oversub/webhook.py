"""Directives by webhook: a service submitted with ``control_url`` is sent each directive as a
``POST`` of its JSON, signed (``docs/actuation.md``)::

    X-Oversub-Signature: t=UNIX,v1=HEX      HEX = HMAC-SHA256(token, "UNIX." + body)

keyed with the service's own token. :func:`verify` checks a request; :class:`WebhookReceiver`
is a small loopback server that verifies, answers at once (oversubd waits 2 s and tries 4
times) and queues the directives for the program::

    rx = oversub.webhook.WebhookReceiver(svc.token, port=9100)   # control_url http://127.0.0.1:9100/
    for d in rx:                                                 # or rx.get(timeout), rx.drain()
        ...

The long-poll (:meth:`oversub.Service.directives`) delivers the same directives; a service may
use both (they carry the same ``seq``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, List, Optional, Set, Tuple

from .directive import Directive
from .errors import OversubError

__all__ = ["sign", "verify", "parse_signature", "directive_from_request", "WebhookReceiver",
           "BadSignature", "HEADER"]

HEADER = "X-Oversub-Signature"


class BadSignature(OversubError):
    """A webhook whose signature is missing, wrong or too old (code ``bad_signature``)."""


def sign(token: str, body: bytes, unix_s: Optional[int] = None) -> str:
    """The header value oversubd would send for body at unix_s (default: now)."""
    t = int(time.time()) if unix_s is None else int(unix_s)
    mac = hmac.new(token.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def parse_signature(header: Optional[str]) -> Optional[Tuple[int, str]]:
    """(t, v1) from the header, or None when it is not one."""
    if not header:
        return None
    parts = dict(p.strip().split("=", 1) for p in header.split(",") if "=" in p)
    try:
        return int(parts["t"]), parts["v1"]
    except (KeyError, ValueError):
        return None


def verify(token: str, header: Optional[str], body: bytes, *, max_age_s: float = 300.0,
           now: Optional[float] = None) -> bool:
    """True when header signs body with token and its time is within max_age_s of now (a
    replayed old request fails)."""
    p = parse_signature(header)
    if p is None or not token:
        return False
    t, got = p
    if abs((time.time() if now is None else now) - t) > max_age_s:
        return False
    want = hmac.new(token.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, got)


def directive_from_request(token: str, header: Optional[str], body: bytes, *,
                           max_age_s: float = 300.0) -> Directive:
    """The directive a verified webhook carries.

    Raises:
        BadSignature: not signed with token, or too old.
    """
    if not verify(token, header, body, max_age_s=max_age_s):
        raise BadSignature("bad_signature", f"{HEADER} does not sign this body with the "
                           "service's token (or is too old)", 401)
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise BadSignature("bad_signature", "the webhook's body is not a directive", 400)
    return Directive.from_json(obj)


class WebhookReceiver:
    """A loopback HTTP server that receives a service's signed directives.

    Args:
        token: the service's token (the key of the signatures).
        host, port: where to listen (port 0: any; see :attr:`url`).
        max_age_s: how old a signature may be.

    Every POST (any path) is verified: 401 when the signature fails, 200 at once otherwise;
    each directive is queued once (a retry of the same ``seq`` is not queued again).
    """

    def __init__(self, token: str, host: str = "127.0.0.1", port: int = 0, *,
                 max_age_s: float = 300.0) -> None:
        self.token = token
        self.max_age_s = max_age_s
        self._q: "queue.Queue[Optional[Directive]]" = queue.Queue()
        self._seen: Set[int] = set()
        self._lock = threading.Lock()
        #: Requests refused for their signature.
        self.refused = 0
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                try:
                    d = directive_from_request(rx.token, self.headers.get(HEADER), body,
                                               max_age_s=rx.max_age_s)
                except (BadSignature, ValueError):
                    with rx._lock:
                        rx.refused += 1
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with rx._lock:
                    fresh = d.seq not in rx._seen
                    rx._seen.add(d.seq)
                if fresh:
                    rx._q.put(d)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="oversub-webhook", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The ``control_url`` to give in the service's spec."""
        host, port = self._server.server_address[:2]
        h = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{h}:{port}/"

    def get(self, timeout: Optional[float] = None) -> Optional[Directive]:
        """The next directive, waiting up to timeout seconds; None when none came (or
        stopped)."""
        try:
            d = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if d is None:
            self._q.put(None)
        return d

    def drain(self) -> List[Directive]:
        """The directives received since the last look, without waiting."""
        out: List[Directive] = []
        while True:
            try:
                d = self._q.get_nowait()
            except queue.Empty:
                return out
            if d is None:
                self._q.put(None)
                return out
            out.append(d)

    def __iter__(self) -> Iterator[Directive]:
        while True:
            d = self.get()
            if d is None:
                return
            yield d

    def stop(self) -> None:
        """Stops the server; iteration ends."""
        self._server.shutdown()
        self._server.server_close()
        self._q.put(None)

    def __enter__(self) -> "WebhookReceiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
