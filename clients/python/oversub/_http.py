"""The control API's transport: JSON over HTTP/1.1, to ``http://HOST:PORT`` or a Unix socket.

What oversubd asks of its clients, and every request here does:

- over TCP, ``Host`` names the address connected to (``127.0.0.1:7070``), else 403
  ``forbidden_host``; the Unix socket takes any Host;
- every ``POST``, ``PUT`` and ``PATCH`` says ``Content-Type: application/json``, else 415;
- ``Authorization: Bearer TOKEN`` when a token is known (the service's own, from
  ``OVERSUB_TOKEN``, or the admin token).

One connection per request (``Connection: close``): the calls are rare (a ready, a usage
report, an acknowledgement) and a fresh connection never meets a half-closed idle one after the
daemon restarted. The long-poll holds its own connection for up to ``wait`` seconds and can be
cut short from another thread (:class:`Cancel`).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from typing import Any, Dict, Mapping, Optional, Tuple

from .errors import DaemonUnreachable, OversubError, error_from_response

__all__ = ["Endpoint", "Cancel", "request", "encode_request", "decode_answer", "as_object"]

USER_AGENT = "oversub-python"


class Endpoint:
    """Where oversubd answers: parsed from ``http://HOST:PORT``, ``unix:PATH`` (also
    ``unix:///PATH``, ``http+unix://%2Fpath``) or a bare absolute path to the socket.

    Attributes:
        url: the URL as given.
        unix_path: the socket's path, or None over TCP.
        host, port: the TCP address (None over a socket).
        host_header: what ``Host`` says: ``HOST:PORT`` over TCP (``[::1]:7070`` for IPv6),
            ``localhost`` over the socket.
    """

    def __init__(self, url: str) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ValueError("a daemon URL is http://HOST:PORT or unix:PATH")
        url = url.strip()
        self.url = url
        self.unix_path: Optional[str] = None
        self.host: Optional[str] = None
        self.port: Optional[int] = None
        self.base_path = ""
        if url.startswith("/"):
            self.unix_path = url
        elif url.startswith("unix:"):
            rest = url[5:]
            if rest.startswith("//"):
                rest = rest[2:]
            if not rest.startswith("/") and not rest.startswith("."):
                raise ValueError(f"{url!r}: unix:PATH needs a path to the socket")
            self.unix_path = rest
        elif url.startswith("http+unix://"):
            rest = url[len("http+unix://"):]
            sock, _, tail = rest.partition("/")
            self.unix_path = urllib.parse.unquote(sock)
            self.base_path = ("/" + tail).rstrip("/") if tail else ""
        elif url.startswith("http://"):
            parts = urllib.parse.urlsplit(url)
            if not parts.hostname:
                raise ValueError(f"{url!r}: no host")
            self.host = parts.hostname
            try:
                self.port = parts.port or 80
            except ValueError as e:
                raise ValueError(f"{url!r}: {e}") from None
            self.base_path = parts.path.rstrip("/")
        elif url.startswith("https://"):
            raise ValueError(f"{url!r}: oversubd's API is plain HTTP on loopback or a Unix "
                             "socket; put TLS in front of it and use http:// here")
        else:
            raise ValueError(f"{url!r}: a daemon URL is http://HOST:PORT or unix:PATH")
        if self.unix_path is not None:
            self.host_header = "localhost"
        else:
            assert self.host is not None and self.port is not None
            h = f"[{self.host}]" if ":" in self.host else self.host
            self.host_header = f"{h}:{self.port}"

    @property
    def is_unix(self) -> bool:
        """True when the daemon is reached through its Unix socket."""
        return self.unix_path is not None

    def __repr__(self) -> str:
        return f"Endpoint({self.url!r})"

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        """A new, unconnected HTTP connection to the daemon."""
        if self.unix_path is not None:
            return _UnixConnection(self.unix_path, timeout)
        assert self.host is not None
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._unix_path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Cancel:
    """Lets another thread cut a request short (the long-poll, when a program stops
    listening): :meth:`cancel` shuts the connection down and the request raises
    :class:`~oversub.errors.DaemonUnreachable` with ``cancelled`` set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Optional[http.client.HTTPConnection] = None
        self.cancelled = False

    def _attach(self, conn: Optional[http.client.HTTPConnection]) -> None:
        with self._lock:
            self._conn = conn
            if conn is not None and self.cancelled:
                self._shut(conn)

    @staticmethod
    def _shut(conn: http.client.HTTPConnection) -> None:
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        """Ends the request in flight (if any) and any later one made with this object."""
        with self._lock:
            self.cancelled = True
            if self._conn is not None:
                self._shut(self._conn)


def encode_request(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: Optional[Mapping[str, Any]],
    token: Optional[str],
) -> Tuple[str, Dict[str, str], Optional[bytes]]:
    """The target, headers and body of a request, as oversubd wants them."""
    target = endpoint.base_path + path
    headers = {
        "Host": endpoint.host_header,
        "Accept": "application/json",
        "User-Agent": USER_AGENT,
        "Connection": "close",
    }
    data: Optional[bytes] = None
    if body is not None or method in ("POST", "PUT", "PATCH"):
        data = json.dumps(body if body is not None else {}, separators=(",", ":")).encode()
        headers["Content-Type"] = "application/json"
        headers["Content-Length"] = str(len(data))
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return target, headers, data


def as_object(x: Any) -> Dict[str, Any]:
    """An answer as the JSON object it should be (a list is wrapped as ``{"items": [...]}``)."""
    if isinstance(x, dict):
        return x
    return {"items": x} if isinstance(x, list) else {}


def _retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def decode_answer(
    status: int,
    raw: bytes,
    retry_after: Optional[str],
    method: str,
    path: str,
) -> Any:
    """The decoded JSON of a 2xx answer; raises the daemon's error for any other status."""
    text = raw.decode("utf-8", "replace")
    data: Any = None
    if text.strip():
        try:
            data = json.loads(text)
        except ValueError:
            data = text
    if 200 <= status < 300:
        if data is not None and not isinstance(data, (dict, list)):
            raise OversubError("bad_response", f"the daemon's answer is not JSON: {text[:200]!r}",
                               status, method=method, path=path)
        return data if data is not None else {}
    raise error_from_response(status, data, method=method, path=path,
                              retry_after=_retry_after(retry_after))


def request(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: Optional[Mapping[str, Any]] = None,
    *,
    token: Optional[str] = None,
    timeout: float = 10.0,
    cancel: Optional[Cancel] = None,
) -> Any:
    """One request; the decoded JSON answer (a dict, or a list).

    Raises:
        DaemonUnreachable: no answer (refused, reset, timed out, cancelled).
        OversubError: the daemon answered an error (a subclass by code and status).
    """
    target, headers, data = encode_request(endpoint, method, path, body, token)
    conn = endpoint.connection(timeout)
    try:
        if cancel is not None:
            if cancel.cancelled:
                raise DaemonUnreachable("cancelled", "the request was cancelled",
                                        method=method, path=path)
            conn.connect()
            cancel._attach(conn)
        conn.request(method, target, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        status = resp.status
        retry_after = resp.getheader("Retry-After")
    except OversubError:
        raise
    except (OSError, http.client.HTTPException) as e:
        if cancel is not None and cancel.cancelled:
            raise DaemonUnreachable("cancelled", "the request was cancelled",
                                    method=method, path=path) from None
        what = "timed out" if isinstance(e, socket.timeout) else (str(e) or type(e).__name__)
        raise DaemonUnreachable("unreachable", f"oversubd at {endpoint.url}: {what}",
                                method=method, path=path) from e
    finally:
        if cancel is not None:
            cancel._attach(None)
        conn.close()
    return decode_answer(status, raw, retry_after, method, path)
