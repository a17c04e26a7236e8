"""The blocking client: :class:`Service` (a service's own calls and its directives) and
:class:`Client` (the rest of the control API, for tools and tests)."""

from __future__ import annotations

import os
import queue
import threading
import time
import urllib.parse
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Tuple, Union)

from . import _http
from ._core import (Backoff, ServiceBase, Tracker, batch_from_json, log)
from .directive import Directive, DirectiveBatch
from .errors import (DaemonUnreachable, NoDirective, OversubError, Unavailable,
                     UnknownService)

__all__ = ["Service", "Client", "Listener"]

_RETRYABLE = (DaemonUnreachable, Unavailable)


def _retrying(fn: Callable[[], Any], retry_for: float, ok_on_retry: Tuple[str, ...] = (),
              stop: Optional[threading.Event] = None) -> Any:
    """Calls fn, again after connection failures and 503/507 for up to retry_for seconds. A
    retry that fails with a code in ok_on_retry counts as done (the first attempt may have
    been applied before its answer was lost)."""
    backoff = Backoff(0.1, 2.0)
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except _RETRYABLE as e:
            if getattr(e, "code", "") == "cancelled":
                raise
            delay = backoff.next_delay(e.retry_after)
            if time.monotonic() - start + delay > retry_for or (stop is not None and
                                                                 stop.is_set()):
                raise
            log.debug("%s; again in %.2f s", e, delay)
            time.sleep(delay)
        except OversubError as e:
            if attempt > 1 and e.code in ok_on_retry:
                return {}
            raise


class Client:
    """The control API as a whole (``docs/daemon.md``): submit, look at, release services;
    the pool; the event log. A program that only is a service needs :class:`Service`.

    Args:
        url: ``http://HOST:PORT`` or ``unix:PATH`` (the socket needs no token and may submit
            managed services, ``command``).
        token: the admin token, when the daemon has one.
        timeout: seconds for each request.
    """

    def __init__(self, url: str, *, token: Optional[str] = None, timeout: float = 10.0) -> None:
        self.endpoint = _http.Endpoint(url)
        self.token = token
        self.timeout = timeout

    @property
    def url(self) -> str:
        return self.endpoint.url

    def request(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None, *,
                timeout: Optional[float] = None) -> Dict[str, Any]:
        """Any request; the decoded answer (a JSON object). Raises
        :class:`~oversub.OversubError`."""
        return _http.as_object(_http.request(self.endpoint, method, path, body,
                                             token=self.token,
                                             timeout=self.timeout if timeout is None else timeout))

    @staticmethod
    def _sid(service_id: str) -> str:
        return "/v1/services/" + urllib.parse.quote(service_id, safe="")

    def health(self) -> Dict[str, Any]:
        return self.request("GET", "/healthz")

    def pool(self) -> Dict[str, Any]:
        return self.request("GET", "/v1/pool")

    def services(self) -> List[Dict[str, Any]]:
        r = self.request("GET", "/v1/services")
        return list(r.get("services", r.get("items", [])))

    def submit(self, spec: Mapping[str, Any], *, dry_run: bool = False) -> Dict[str, Any]:
        """Submits a service; the daemon's answer (the service, its ``decision`` and its
        ``token``). A refusal raises :class:`~oversub.errors.Conflict` (or InvalidRequest)
        with the ``decision`` in ``body``."""
        return self.request("POST", "/v1/services" + ("?dry_run=1" if dry_run else ""), spec)

    def service(self, service_id: str) -> Dict[str, Any]:
        return self.request("GET", self._sid(service_id))

    def release(self, service_id: str) -> Dict[str, Any]:
        return self.request("DELETE", self._sid(service_id))

    def resize(self, service_id: str, **fields: int) -> Dict[str, Any]:
        return self.request("PATCH", self._sid(service_id), fields)

    def events(self, since: int = 0, wait: int = 0) -> Dict[str, Any]:
        """The decision log after ``since``, long-polled up to ``wait`` seconds:
        ``{"events": [...], "next": SEQ}``."""
        return self.request("GET", f"/v1/events?since={int(since)}&wait={int(wait)}",
                            timeout=self.timeout + max(0, wait))

    def for_service(self, service_id: str, token: Optional[str] = None, **kw: Any) -> "Service":
        """A :class:`Service` for one of its services (its token from the submit's answer)."""
        return Service(service_id, self.url, token=token or self.token, **kw)


class Service(ServiceBase):
    """A service under oversub, speaking for itself::

        svc = oversub.Service.from_env()
        svc.ready()
        for d in svc.directives():
            if d.kind == "degrade":
                shrink_to(d.batch_size)
                svc.ack(d)
            elif d.kind == "evict":
                svc.ack(d, checkpoint=save())
                break

    Args:
        service_id: its id.
        url: the daemon (``http://HOST:PORT`` or ``unix:PATH``); default
            ``http://127.0.0.1:7070``.
        token: its own token (``OVERSUB_TOKEN``; the submit's answer carries it), or the
            admin token.
        vram_mib, batch_size: its grant and batch size at start.
        checkpoint_dir, resume_from: its checkpoint folder; the checkpoint it resumes from.
        gpus: CUDA_VISIBLE_DEVICES' entries.
        timeout: seconds for each short request.
        retry_for: how long ready, usage, ack and exited keep trying through connection
            failures and 503s (0: once).

    The grant and batch size in :attr:`vram_mib` and :attr:`batch_size` follow the
    directives as they are delivered. Thread-safe: a background thread may listen while the
    main thread acknowledges.
    """

    def __init__(self, service_id: str, url: Optional[str] = None, **kw: Any) -> None:
        super().__init__(service_id, url, **kw)
        self._lock = threading.Lock()
        # each running iterator: its stop event, and the cancel of its poll in flight
        self._active: Dict[threading.Event, Optional[_http.Cancel]] = {}

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, *,
                 url: Optional[str] = None, service_id: Optional[str] = None,
                 token: Optional[str] = None, **kw: Any) -> "Service":
        """The service described by the ``OVERSUB_*`` variables oversubd sets for the
        programs it runs (see ``oversub.ENVIRONMENT``); arguments override them.

        Raises:
            MissingEnvironment: OVERSUB_SERVICE is not set (not running under oversub).
        """
        args = cls._env_kwargs(environ, url, service_id, token)
        sid = args.pop("service_id")
        u = args.pop("url")
        args.update(kw)
        return cls(sid, u, **args)

    # ---- requests ------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None, *,
                 timeout: Optional[float] = None, cancel: Optional[_http.Cancel] = None
                 ) -> Dict[str, Any]:
        return _http.as_object(_http.request(
            self.endpoint, method, path, body, token=self.token,
            timeout=self.timeout if timeout is None else timeout, cancel=cancel))

    def _call(self, method: str, what: str, body: Optional[Mapping[str, Any]] = None, *,
              retry_for: Optional[float] = None, ok_on_retry: Tuple[str, ...] = ()
              ) -> Dict[str, Any]:
        rf = self.retry_for if retry_for is None else retry_for
        return _http.as_object(_retrying(lambda: self._request(method, self._path(what), body),
                                         rf, ok_on_retry))

    def info(self) -> Dict[str, Any]:
        """The service as the daemon shows it (state, grant, held, used, placement ...)."""
        return self._request("GET", self._path())

    def ready(self, pid: Union[int, bool, None] = True) -> Dict[str, Any]:
        """Reports that it has loaded and serves (``loading`` -> ``running``). With ``pid``
        (default: this process; False or None: none) NVML's per-process memory of that process
        becomes its usage, and an external service whose PID is gone counts as exited."""
        body: Dict[str, Any] = {}
        if pid is True:
            body["pid"] = os.getpid()
        elif pid is not None and pid is not False:
            body["pid"] = int(pid)
        return self._call("POST", "ready", body)

    def report_usage(self, vram_mib: Optional[int] = None, *,
                     gpus: Union[None, Mapping[int, int], Iterable[Tuple[int, int]]] = None,
                     compute_pct: Optional[int] = None) -> Dict[str, Any]:
        """Reports the memory it really uses: ``vram_mib`` over all its GPUs (split in
        proportion to its grants), or ``gpus`` as {pool GPU index: MiB}. A report at or under
        a degraded grant also acknowledges the degrade."""
        body = self._usage_body(vram_mib, gpus, compute_pct)
        r = self._call("PUT", "usage", body)
        self._note_usage(body)
        return r

    def ack(self, directive: Optional[Directive] = None, *,
            checkpoint: Optional[str] = None) -> Dict[str, Any]:
        """Acknowledges the outstanding directive: a degrade once the memory above the new
        grant is given back; an eviction with the ``checkpoint`` to resume from (a path or a
        name, reported before the process exits).

        Raises:
            NoDirective: nothing to acknowledge. Not raised for a ``replayed`` directive, for a
                degrade that a usage report at or under its grant already acknowledged (the
                daemon takes such a report as the acknowledgement), nor when a retry after a
                lost answer finds it done.
        """
        body = self._ack_body(checkpoint)
        left = directive.time_left() if directive is not None else None
        rf = max(self.retry_for, left or 0.0)
        try:
            r = self._call("POST", "ack", body, retry_for=rf, ok_on_retry=("no_directive",))
        except NoDirective:
            if directive is not None and (directive.replayed or self._acked_by_usage(directive)):
                r = {}
            else:
                raise
        self._note_ack(directive, checkpoint)
        return r

    def exited(self, checkpoint: Optional[str] = None) -> Dict[str, Any]:
        """Says its processes are gone and its memory free (an external service leaving after
        an eviction), with the checkpoint to resume from."""
        return self._call("POST", "exited", self._ack_body(checkpoint),
                          ok_on_retry=("unknown_service",))

    def set_backends(self, backends: Iterable[str]) -> Dict[str, Any]:
        """Registers where the gateway reaches it (``http://HOST:PORT`` each)."""
        return self._call("PUT", "backends", {"backends": list(backends)})

    def release(self) -> Dict[str, Any]:
        """Releases the service (needs the admin token when the daemon has one)."""
        return self._request("DELETE", self._path())

    # ---- directives ----------------------------------------------------------------------

    def poll(self, wait: int = 0, after: int = 0) -> DirectiveBatch:
        """One long-poll: the directives after ``after``, waiting up to ``wait`` (0-60)
        seconds for one."""
        return self._poll(wait, after, None)

    def _poll(self, wait: int, after: int, stop: Optional[threading.Event]) -> DirectiveBatch:
        cancel = _http.Cancel()
        if stop is not None:
            with self._lock:
                self._active[stop] = cancel
            if stop.is_set():
                cancel.cancel()
        try:
            raw = self._request("GET", self._path("directives") + f"?wait={int(wait)}"
                                f"&after={int(after)}", timeout=self.timeout + max(0, wait),
                                cancel=cancel)
        finally:
            if stop is not None:
                with self._lock:
                    if stop in self._active:
                        self._active[stop] = None
        return batch_from_json(raw)

    def directives(self, *, wait: int = 20, after: Optional[int] = None,
                   stop_on_evict: bool = True, give_up_after: Optional[float] = None,
                   stop_event: Optional[threading.Event] = None,
                   subscribed: Optional[threading.Event] = None) -> Iterator[Directive]:
        """The service's directives as they come, long-polled.

        Reconnects with backoff when the daemon is away (restarting) and resumes after the
        last sequence it saw; the directive that oversubd repeats after its restart is not
        delivered twice (and is acknowledged again if it had been). Started without
        ``after``, it delivers from the daemon's history only the directive that still holds
        (see :class:`~oversub._core.Tracker`). Each directive updates :attr:`vram_mib` and
        :attr:`batch_size` before it is yielded.

        Ends when the service is released (or failed), after an eviction when
        ``stop_on_evict`` (the default: an evicted service checkpoints and leaves), when
        :meth:`stop` is called or ``stop_event`` is set, or, with ``give_up_after``, once the
        daemon has been unreachable that many seconds (raising
        :class:`~oversub.errors.DaemonUnreachable`).

        ``subscribed``, when given, is set once the daemon has answered the first poll: a
        directive issued after that is delivered fresh, never as a replay of the history.

        Raises:
            UnknownService: the daemon never knew the service.
            OversubError: an answer that retrying will not change (401, 400 ...).
        """
        stop = stop_event if stop_event is not None else threading.Event()
        with self._lock:
            self._active[stop] = None
        try:
            yield from self._directives(stop, wait, after, stop_on_evict, give_up_after,
                                        subscribed)
        finally:
            with self._lock:
                self._active.pop(stop, None)

    def _directives(self, stop: threading.Event, wait: int, after: Optional[int],
                    stop_on_evict: bool, give_up_after: Optional[float],
                    subscribed: Optional[threading.Event]) -> Iterator[Directive]:
        tracker = Tracker(after, stop_on_evict)
        backoff = Backoff()
        while not tracker.ended and not stop.is_set():
            try:
                batch = self._poll(0 if tracker.catch_up else wait, tracker.after, stop)
            except UnknownService:
                if tracker.gone():
                    self.state = "released"
                    break
                raise
            except _RETRYABLE as e:
                if stop.is_set():
                    break
                if give_up_after is not None and backoff.failing_for() > give_up_after:
                    raise
                delay = backoff.next_delay(e.retry_after)
                log.info("directives of %s: %s; again in %.2f s", self.id, e, delay)
                stop.wait(delay)
                continue
            backoff.reset()
            fresh, repeats = tracker.feed(batch)
            self.state = tracker.state
            self.last_seq = tracker.after
            if subscribed is not None:
                subscribed.set()
            for d in repeats:
                self._reack(d)
            for d in fresh:
                self._apply(d)
                log.info("%s directive %d: %s (vram %d MiB, batch %d)", self.id, d.seq,
                         d.kind, d.vram_mib, d.batch_size)
                yield d

    def _reack(self, d: Directive) -> None:
        k = Tracker.key(d)
        if k is None or k not in self._acked:
            return
        try:
            self._call("POST", "ack", self._ack_body(self._acked[k]))
            log.info("%s: acknowledged %s again after oversubd restarted", self.id,
                     d.kind)
        except OversubError as e:
            log.info("%s: acknowledging %s again: %s", self.id, d.kind, e)

    def stop(self) -> None:
        """Ends every :meth:`directives` iterator (and :meth:`run`, :class:`Listener`) of this
        service promptly, from any thread: the long-poll in flight is cut."""
        with self._lock:
            active = list(self._active.items())
        for ev, c in active:
            self._stop_one(ev, c)

    def _stop_one(self, ev: threading.Event, c: Optional[_http.Cancel] = None) -> None:
        ev.set()
        with self._lock:
            c = self._active.get(ev, c)
        if c is not None:
            c.cancel()

    def handle(self, d: Directive, *, auto_ack: bool = True) -> Any:
        """Runs the handler registered for ``d`` and then what :meth:`run` does after it
        (acknowledge a degrade or suspend, report an eviction's checkpoint, report ready after
        a resume). Returns the handler's result; without a handler nothing is acknowledged
        (the daemon then escalates an ignored degrade to an eviction)."""
        h = self._handler_for(d)
        if h is None:
            log.info("%s: no handler for %s; not acknowledged", self.id, d.kind)
            return None
        result = h(d)
        if auto_ack:
            what, ck = self._after_handler(d, result)
            if what == "ack":
                try:
                    self.ack(d, checkpoint=ck)
                except NoDirective as e:
                    log.info("%s: %s", self.id, e)
            elif what == "ready":
                self.ready()
        return result

    def run(self, *, auto_ack: bool = True, **kw: Any) -> Optional[Directive]:
        """Delivers the directives to the handlers registered with :meth:`on_degrade`,
        :meth:`on_restore`, :meth:`on_evict`, :meth:`on_suspend`, :meth:`on_resume` and
        :meth:`on_directive`, until they end (``kw`` as for :meth:`directives`). Returns the
        last directive (the eviction that ended it), or None."""
        last = None
        for d in self.directives(**kw):
            last = d
            self.handle(d, auto_ack=auto_ack)
        return last

    def run_in_thread(self, **kw: Any) -> threading.Thread:
        """:meth:`run` in a daemon thread (a server's main thread serves); :meth:`stop` ends
        it. An exception in a handler is logged and ends it."""
        def target() -> None:
            try:
                self.run(**kw)
            except Exception:
                log.exception("%s: directives thread", self.id)
        t = threading.Thread(target=target, name=f"oversub-{self.id}", daemon=True)
        t.start()
        return t

    def listen(self, **kw: Any) -> "Listener":
        """The directives in a background thread, queued for a loop that looks between its
        steps (``kw`` as for :meth:`directives`)."""
        return Listener(self, **kw)


class _Subscribed(threading.Event):
    """The listener's ``subscribed``: setting it also settles the wait of
    :meth:`Listener.wait_subscribed`."""

    def __init__(self, settled: threading.Event) -> None:
        super().__init__()
        self._settled = settled

    def set(self) -> None:
        super().set()
        self._settled.set()


class Listener:
    """Directives gathered by a background thread for a program's own loop::

        with svc.listen() as inbox:
            while work_left():
                for d in inbox.drain():
                    ...
                step()

    Attributes:
        ended: True once the directives ended (released, evicted, stopped, or an error).
        error: the exception that ended them, if one did.
        subscribed: set once the daemon answered the first poll (see
            :meth:`wait_subscribed`).
    """

    def __init__(self, svc: Service, **kw: Any) -> None:
        self.service = svc
        self._q: "queue.Queue[Optional[Directive]]" = queue.Queue()
        self.ended = False
        self.error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._settled = threading.Event()  # subscribed, or ended before it could be
        self.subscribed: threading.Event = _Subscribed(self._settled)
        kw["stop_event"] = self._stop
        kw["subscribed"] = self.subscribed
        self._thread = threading.Thread(target=self._run, args=(kw,),
                                        name=f"oversub-listen-{svc.id}", daemon=True)
        self._thread.start()

    def _run(self, kw: Dict[str, Any]) -> None:
        try:
            for d in self.service.directives(**kw):
                self._q.put(d)
        except BaseException as e:  # handed to the reader
            self.error = e
            log.warning("%s: directives ended: %s", self.service.id, e)
        finally:
            self.ended = True
            self._settled.set()
            self._q.put(None)

    def wait_subscribed(self, timeout: Optional[float] = None) -> bool:
        """Waits until the daemon has answered the listener's first poll, so that a directive
        issued from now on arrives fresh (not ``replayed``). False when the directives ended
        first or ``timeout`` seconds passed."""
        self._settled.wait(timeout)
        return self.subscribed.is_set()

    def get(self, timeout: Optional[float] = None) -> Optional[Directive]:
        """The next directive, waiting up to ``timeout`` seconds (None: for ever); None when
        none came or they ended."""
        try:
            d = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if d is None:
            self._q.put(None)  # stays ended for the next reader
        return d

    def drain(self) -> List[Directive]:
        """The directives that arrived since the last look, without waiting."""
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

    def stop(self, timeout: float = 5.0) -> None:
        """Stops listening and waits for the thread."""
        self.service._stop_one(self._stop)
        self._thread.join(timeout)

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

