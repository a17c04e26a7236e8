"""The asyncio client: :class:`AsyncService`, the same surface as :class:`oversub.Service` with
coroutines, for servers written on asyncio (aiohttp, FastAPI, vLLM's own front end)::

    import oversub.aio

    async def main():
        svc = oversub.aio.AsyncService.from_env()
        await svc.ready()
        async for d in svc.directives():
            if d.kind == "degrade":
                limiter.set(d.batch_size)
                await svc.ack(d)

Standard library only (``asyncio`` streams, HTTP/1.1 written here). Call its methods from
the event loop's thread.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import (Any, AsyncIterator, Dict, Iterable, Mapping, Optional, Set, Tuple,
                    Union)

from . import _http
from ._core import Backoff, ServiceBase, Tracker, batch_from_json, log
from .directive import Directive, DirectiveBatch
from .errors import DaemonUnreachable, NoDirective, OversubError, Unavailable, UnknownService

__all__ = ["AsyncService", "arequest"]

_RETRYABLE = (DaemonUnreachable, Unavailable)


async def _read_body(reader: asyncio.StreamReader, headers: Dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            line = await reader.readline()
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read()


async def _exchange(endpoint: _http.Endpoint, method: str, target: str,
                    headers: Mapping[str, str], data: Optional[bytes]) -> Tuple[int, Dict[str, str],
                                                                                 bytes]:
    if endpoint.unix_path is not None:
        reader, writer = await asyncio.open_unix_connection(endpoint.unix_path)
    else:
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    try:
        head = f"{method} {target} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode("latin-1") + (data or b""))
        await writer.drain()
        line = await reader.readline()
        parts = line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ConnectionError(f"no HTTP answer ({line[:60]!r})")
        status = int(parts[1])
        hdrs: Dict[str, str] = {}
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        raw = await _read_body(reader, hdrs)
        return status, hdrs, raw
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (OSError, asyncio.CancelledError):
            pass


async def arequest(endpoint: _http.Endpoint, method: str, path: str,
                   body: Optional[Mapping[str, Any]] = None, *, token: Optional[str] = None,
                   timeout: float = 10.0) -> Any:
    """One request on asyncio; the decoded JSON answer.

    Raises:
        DaemonUnreachable: no answer (refused, reset, timed out).
        OversubError: the daemon answered an error.
    """
    target, headers, data = _http.encode_request(endpoint, method, path, body, token)
    try:
        status, hdrs, raw = await asyncio.wait_for(
            _exchange(endpoint, method, target, headers, data), timeout)
    except asyncio.TimeoutError:
        raise DaemonUnreachable("unreachable", f"oversubd at {endpoint.url}: timed out",
                                method=method, path=path) from None
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        raise DaemonUnreachable("unreachable", f"oversubd at {endpoint.url}: {e or type(e)}",
                                method=method, path=path) from e
    return _http.decode_answer(status, raw, hdrs.get("retry-after"), method, path)


async def _maybe_await(x: Any) -> Any:
    if inspect.isawaitable(x):
        return await x
    return x


class AsyncService(ServiceBase):
    """A service under oversub on asyncio: :class:`oversub.Service`'s surface, with
    coroutines. Handlers registered with ``on_degrade`` and the others may be plain functions
    or coroutine functions."""

    def __init__(self, service_id: str, url: Optional[str] = None, **kw: Any) -> None:
        super().__init__(service_id, url, **kw)
        self._stops: Set[asyncio.Event] = set()

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, *,
                 url: Optional[str] = None, service_id: Optional[str] = None,
                 token: Optional[str] = None, **kw: Any) -> "AsyncService":
        """As :meth:`oversub.Service.from_env`."""
        args = cls._env_kwargs(environ, url, service_id, token)
        sid = args.pop("service_id")
        u = args.pop("url")
        args.update(kw)
        return cls(sid, u, **args)

    async def _request(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None,
                       *, timeout: Optional[float] = None) -> Dict[str, Any]:
        return _http.as_object(await arequest(
            self.endpoint, method, path, body, token=self.token,
            timeout=self.timeout if timeout is None else timeout))

    async def _call(self, method: str, what: str, body: Optional[Mapping[str, Any]] = None, *,
                    retry_for: Optional[float] = None,
                    ok_on_retry: Tuple[str, ...] = ()) -> Dict[str, Any]:
        rf = self.retry_for if retry_for is None else retry_for
        backoff = Backoff(0.1, 2.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._request(method, self._path(what), body)
            except _RETRYABLE as e:
                delay = backoff.next_delay(e.retry_after)
                if loop.time() - start + delay > rf:
                    raise
                await asyncio.sleep(delay)
            except OversubError as e:
                if attempt > 1 and e.code in ok_on_retry:
                    return {}
                raise

    async def info(self) -> Dict[str, Any]:
        """The service as the daemon shows it."""
        return await self._request("GET", self._path())

    async def ready(self, pid: Union[int, bool, None] = True) -> Dict[str, Any]:
        """As :meth:`oversub.Service.ready`."""
        body: Dict[str, Any] = {}
        if pid is True:
            body["pid"] = os.getpid()
        elif pid is not None and pid is not False:
            body["pid"] = int(pid)
        return await self._call("POST", "ready", body)

    async def report_usage(self, vram_mib: Optional[int] = None, *,
                           gpus: Union[None, Mapping[int, int], Iterable[Tuple[int, int]]] = None,
                           compute_pct: Optional[int] = None) -> Dict[str, Any]:
        """As :meth:`oversub.Service.report_usage`."""
        body = self._usage_body(vram_mib, gpus, compute_pct)
        r = await self._call("PUT", "usage", body)
        self._note_usage(body)
        return r

    async def ack(self, directive: Optional[Directive] = None, *,
                  checkpoint: Optional[str] = None) -> Dict[str, Any]:
        """As :meth:`oversub.Service.ack`."""
        body = self._ack_body(checkpoint)
        left = directive.time_left() if directive is not None else None
        try:
            r = await self._call("POST", "ack", body, retry_for=max(self.retry_for, left or 0.0),
                                 ok_on_retry=("no_directive",))
        except NoDirective:
            if directive is not None and (directive.replayed or self._acked_by_usage(directive)):
                r = {}
            else:
                raise
        self._note_ack(directive, checkpoint)
        return r

    async def exited(self, checkpoint: Optional[str] = None) -> Dict[str, Any]:
        """As :meth:`oversub.Service.exited`."""
        return await self._call("POST", "exited", self._ack_body(checkpoint),
                                ok_on_retry=("unknown_service",))

    async def set_backends(self, backends: Iterable[str]) -> Dict[str, Any]:
        """As :meth:`oversub.Service.set_backends`."""
        return await self._call("PUT", "backends", {"backends": list(backends)})

    async def release(self) -> Dict[str, Any]:
        """As :meth:`oversub.Service.release`."""
        return await self._request("DELETE", self._path())

    async def poll(self, wait: int = 0, after: int = 0) -> DirectiveBatch:
        """One long-poll, as :meth:`oversub.Service.poll`."""
        raw = await self._request("GET", self._path("directives") +
                                  f"?wait={int(wait)}&after={int(after)}",
                                  timeout=self.timeout + max(0, wait))
        return batch_from_json(raw)

    async def _poll_or_stop(self, stop: asyncio.Event, wait: int, after: int
                            ) -> Optional[DirectiveBatch]:
        poll = asyncio.ensure_future(self.poll(wait, after))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({poll, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (poll, stopped):
                if not t.done():
                    t.cancel()
        if poll in done:
            return poll.result()
        try:
            await poll
        except (asyncio.CancelledError, OversubError):
            pass
        return None

    async def directives(self, *, wait: int = 20, after: Optional[int] = None,
                         stop_on_evict: bool = True,
                         give_up_after: Optional[float] = None) -> AsyncIterator[Directive]:
        """As :meth:`oversub.Service.directives`, an async iterator."""
        stop = asyncio.Event()
        self._stops.add(stop)
        tracker = Tracker(after, stop_on_evict)
        backoff = Backoff()
        try:
            while not tracker.ended and not stop.is_set():
                try:
                    batch = await self._poll_or_stop(stop, 0 if tracker.catch_up else wait,
                                                     tracker.after)
                except UnknownService:
                    if tracker.gone():
                        self.state = "released"
                        break
                    raise
                except _RETRYABLE as e:
                    if give_up_after is not None and backoff.failing_for() > give_up_after:
                        raise
                    delay = backoff.next_delay(e.retry_after)
                    log.info("directives of %s: %s; again in %.2f s", self.id, e, delay)
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
                    continue
                if batch is None:
                    break
                backoff.reset()
                fresh, repeats = tracker.feed(batch)
                self.state = tracker.state
                self.last_seq = tracker.after
                for d in repeats:
                    k = Tracker.key(d)
                    if k is not None and k in self._acked:
                        try:
                            await self._call("POST", "ack", self._ack_body(self._acked[k]))
                        except OversubError as e:
                            log.info("%s: acknowledging again: %s", self.id, e)
                for d in fresh:
                    self._apply(d)
                    yield d
        finally:
            self._stops.discard(stop)

    def stop(self) -> None:
        """Ends every :meth:`directives` iterator and :meth:`run` of this service (call it
        from the event loop's thread; from another, use ``loop.call_soon_threadsafe``)."""
        for s in list(self._stops):
            s.set()

    async def handle(self, d: Directive, *, auto_ack: bool = True) -> Any:
        """As :meth:`oversub.Service.handle`; the handler may be a coroutine function."""
        h = self._handler_for(d)
        if h is None:
            log.info("%s: no handler for %s; not acknowledged", self.id, d.kind)
            return None
        result = await _maybe_await(h(d))
        if auto_ack:
            what, ck = self._after_handler(d, result)
            if what == "ack":
                try:
                    await self.ack(d, checkpoint=ck)
                except NoDirective as e:
                    log.info("%s: %s", self.id, e)
            elif what == "ready":
                await self.ready()
        return result

    async def run(self, *, auto_ack: bool = True, **kw: Any) -> Optional[Directive]:
        """As :meth:`oversub.Service.run`."""
        last = None
        async for d in self.directives(**kw):
            last = d
            await self.handle(d, auto_ack=auto_ack)
        return last
