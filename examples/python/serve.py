#!/usr/bin/env python3
"""serve.py - a small OpenAI-compatible server that obeys oversub's degrades.

    serve.py [--port 8000] [--model NAME] [--token-ms 20] [--max-concurrency N] [--torch ...]

Standard library only (``http.server``); it stands for an inference server (vLLM, SGLang, a
Triton Python backend) to show what the protocol asks of one:

- ``POST /v1/chat/completions`` and ``POST /v1/completions`` (``stream: true`` as server-sent
  events, ``data: [DONE]`` at the end), ``GET /v1/models``, ``GET /health``. The "model"
  writes ``max_tokens`` words (16 by default), ``--token-ms`` apart.
- At most *limit* requests generate at once (the batch a continuous-batching engine runs);
  the rest wait up to ``--queue-timeout`` seconds, then get 429 with ``Retry-After``. The limit
  is ``OVERSUB_BATCH_SIZE`` (else ``--max-concurrency``).
- Under oversub it registers its address for the gateway (``PUT .../backends``), reports its
  usage and ready, and follows its directives in a background thread:
  **degrade** lowers the limit to the directive's batch size, waits until no more than that
  many are in flight (the memory of the others is then free), reports the usage and
  acknowledges; **restore** raises it back; **evict** (or SIGTERM) refuses new requests with
  503, lets those in flight finish and exits 0.
- Memory is simulated (``--base-mib`` + ``--seq-mib`` per sequence the limit allows), or with
  ``--torch`` a real allocation: ``--reserve-mib`` for the weights and ``--seq-mib`` per
  sequence of the limit as the KV cache, reported from ``torch.cuda.memory_reserved()``.

``GET /health`` answers ``{"status", "limit", "inflight", "peak", "served", "draining",
"usage_mib"}`` where ``peak`` is the most requests in flight at once since the limit last
changed (since a degrade: since the requests above the new limit finished).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

try:
    import oversub
except ImportError:  # run from a checkout, oversub not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "clients", "python"))
    import oversub


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [{os.getpid()}] serve: {msg}", file=sys.stderr,
          flush=True)


class Limiter:
    """At most ``limit`` holders at once; the limit may change while requests run."""

    def __init__(self, limit: int) -> None:
        self._cv = threading.Condition()
        self.limit = max(1, limit)
        self.inflight = 0
        self.peak = 0
        self.served = 0

    def acquire(self, timeout: float) -> bool:
        with self._cv:
            ok = self._cv.wait_for(lambda: self.inflight < self.limit, timeout)
            if ok:
                self.inflight += 1
                self.peak = max(self.peak, self.inflight)
            return ok

    def release(self) -> None:
        with self._cv:
            self.inflight -= 1
            self.served += 1
            self._cv.notify_all()

    def set_limit(self, limit: int) -> None:
        with self._cv:
            self.limit = max(1, limit)
            self.peak = self.inflight
            self._cv.notify_all()

    def reset_peak(self) -> None:
        with self._cv:
            self.peak = self.inflight

    def wait_at_most(self, n: int, timeout: float) -> bool:
        """Waits until no more than n are in flight."""
        with self._cv:
            return self._cv.wait_for(lambda: self.inflight <= n, timeout)


class Engine:
    """The server's state: the limiter, the memory it stands for, whether it drains."""

    def __init__(self, args: argparse.Namespace, svc: Optional[oversub.Service]) -> None:
        self.args = args
        self.svc = svc
        self.full = (svc.batch_size if svc and svc.batch_size else None) or args.max_concurrency
        self.limiter = Limiter(self.full)
        self.draining = False
        self.kv: Any = None
        self.torch: Any = None
        self.weights: Any = None
        self.mem: Any = None
        if args.torch:
            import oversub.torch as otorch
            self.torch = otorch.load_torch()
            if svc is not None:
                self.mem = otorch.TorchMemory(svc, headroom_mib=args.headroom_mib)
                self.mem.cap()
            self.weights = self.torch.empty(args.reserve_mib << 18, dtype=self.torch.float32,
                                            device=args.device)
            self.resize_kv(self.limiter.limit)

    def resize_kv(self, limit: int) -> None:
        if self.torch is None:
            return
        self.kv = None
        self.torch.cuda.empty_cache()  # before the new size: see batch_infer.py's resize()
        self.kv = self.torch.empty(max(1, limit * self.args.seq_mib) << 18,
                                   dtype=self.torch.float32, device=self.args.device)

    def usage_mib(self) -> int:
        if self.mem is not None:
            return self.mem.usage_mib()
        return self.args.base_mib + self.args.seq_mib * self.limiter.limit

    def report(self) -> None:
        if self.svc is not None:
            try:
                self.svc.report_usage(vram_mib=self.usage_mib())
            except oversub.OversubError as e:
                log(f"usage not reported: {e}")

    # ---- directives ----------------------------------------------------------------------

    def on_degrade(self, d: oversub.Directive) -> bool:
        new = d.batch_size or max(1, self.limiter.limit // 2)
        self.limiter.set_limit(new)
        left = d.time_left()
        drained = self.limiter.wait_at_most(new, max(0.1, (left or 5.0) - 0.5))
        self.limiter.reset_peak()  # from here on, at most `new` at once
        if self.torch is not None:
            self.resize_kv(new)
            if self.mem is not None:
                self.mem.shrink(d, report=False)
        self.report()
        log(f"degraded: at most {new} at once ({d.vram_mib} MiB)"
            f"{'' if drained else '; still more in flight than that'}")
        return drained  # False: not acknowledged (the daemon then evicts us)

    def on_restore(self, d: oversub.Directive) -> None:
        new = d.batch_size or self.full
        if self.mem is not None:
            self.mem.restore(d)
        self.resize_kv(new)
        self.limiter.set_limit(new)
        self.report()
        log(f"restored: at most {new} at once")

    def drain(self, why: str) -> None:
        """Refuses new requests from now on and waits for those in flight (whoever asks: the
        eviction's directive and SIGTERM come together)."""
        if not self.draining:
            self.draining = True
            log(f"draining ({why}): {self.limiter.inflight} in flight")
        self.limiter.wait_at_most(0, 3600)

    def on_evict(self, d: oversub.Directive) -> None:
        self.drain(f"evicted, {d.time_left() or 0:.1f} s of grace")


def make_handler(eng: Engine) -> Any:
    args = eng.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "oversub-serve/0.1"

        def log_message(self, fmt: str, *a: Any) -> None:  # quiet: one line per error only
            pass

        def _json(self, code: int, obj: Any, extra: Optional[Dict[str, str]] = None) -> None:
            data = (json.dumps(obj) + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str, kind: str, err_code: str,
                   retry_after: Optional[int] = None) -> None:
            extra = {"Retry-After": str(retry_after)} if retry_after is not None else None
            self._json(code, {"error": {"message": message, "type": kind, "param": None,
                                        "code": err_code}}, extra)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in ("/health", "/healthz"):
                lim = eng.limiter
                self._json(200, {"status": "draining" if eng.draining else "ok",
                                 "limit": lim.limit, "inflight": lim.inflight, "peak": lim.peak,
                                 "served": lim.served, "draining": eng.draining,
                                 "usage_mib": eng.usage_mib()})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": args.model, "object": "model", "created": 0, "owned_by": "oversub"}]})
            else:
                self._error(404, f"no route {path}", "invalid_request_error", "not_found")

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                self._error(400, f"the body is not JSON: {e}", "invalid_request_error",
                            "invalid_json")
                return
            if path not in ("/v1/chat/completions", "/v1/completions"):
                self._error(404, f"no route {path}", "invalid_request_error", "not_found")
                return
            if eng.draining:
                self._error(503, "the server is leaving (evicted)", "server_error",
                            "unavailable", 1)
                return
            if not eng.limiter.acquire(args.queue_timeout):
                self._error(429, "too many requests at once", "rate_limit_error", "overloaded", 1)
                return
            try:
                self._generate(path, body)
            finally:
                eng.limiter.release()

        def _generate(self, path: str, body: Dict[str, Any]) -> None:
            chat = path.endswith("chat/completions")
            max_tokens = int(body.get("max_tokens") or 16)
            if chat:
                msgs = body.get("messages") or []
                prompt = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
            else:
                prompt = str(body.get("prompt") or "")
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
            created = int(time.time())
            obj = "chat.completion" if chat else "text_completion"
            words: List[str] = []
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                for i in range(max_tokens):
                    time.sleep(args.token_ms / 1000.0)
                    w = f"tok{i}"
                    words.append(w)
                    text = (" " if i else "") + w
                    choice: Dict[str, Any] = ({"index": 0, "delta": {"content": text},
                                               "finish_reason": None} if chat else
                                              {"index": 0, "text": text, "finish_reason": None})
                    chunk = {"id": rid, "object": obj + (".chunk" if chat else ""),
                             "created": created, "model": args.model, "choices": [choice]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                end = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat else
                       {"index": 0, "text": "", "finish_reason": "length"})
                self.wfile.write(("data: " + json.dumps(
                    {"id": rid, "object": obj + (".chunk" if chat else ""), "created": created,
                     "model": args.model, "choices": [end]}) + "\n\ndata: [DONE]\n\n").encode())
                self.wfile.flush()
                return
            for i in range(max_tokens):
                time.sleep(args.token_ms / 1000.0)
                words.append(f"tok{i}")
            text = " ".join(words)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length"})
            self._json(200, {"id": rid, "object": obj, "created": created, "model": args.model,
                             "choices": [choice],
                             "usage": {"prompt_tokens": len(prompt.split()),
                                       "completion_tokens": len(words),
                                       "total_tokens": len(prompt.split()) + len(words)}})

    return Handler


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--model", default="oversub-demo")
    p.add_argument("--token-ms", type=float, default=20.0, help="time per generated token")
    p.add_argument("--max-concurrency", type=int, default=8,
                   help="requests generating at once without oversub (OVERSUB_BATCH_SIZE else)")
    p.add_argument("--queue-timeout", type=float, default=30.0,
                   help="seconds a request waits for a slot before 429")
    p.add_argument("--base-mib", type=int, default=4096, help="simulated weights")
    p.add_argument("--seq-mib", type=int, default=256, help="memory per sequence of the limit")
    p.add_argument("--torch", action="store_true", help="allocate the memory with PyTorch")
    p.add_argument("--device", default="cuda")
    p.add_argument("--reserve-mib", type=int, default=4096, help="--torch: the weights")
    p.add_argument("--headroom-mib", type=int, default=1024,
                   help="--torch: memory outside the caching allocator (CUDA context)")
    args = p.parse_args(argv)

    try:
        svc: Optional[oversub.Service] = oversub.Service.from_env()
    except oversub.MissingEnvironment:
        svc = None
    eng = Engine(args, svc)
    class Server(ThreadingHTTPServer):
        request_queue_size = 1024  # the listen backlog (socketserver's default is 5)
        daemon_threads = True

    server = Server((args.host, args.port), make_handler(eng))
    port = server.server_address[1]
    log(f"serving {args.model} on http://{args.host}:{port}, at most {eng.limiter.limit} at once")

    def leave(why: str) -> None:
        eng.drain(why)
        server.shutdown()

    signal.signal(signal.SIGTERM, lambda s, f: threading.Thread(
        target=leave, args=("SIGTERM",), daemon=True).start())
    if svc is not None:
        svc.on_degrade(eng.on_degrade)
        svc.on_restore(eng.on_restore)

        def evicted(d: oversub.Directive) -> None:
            eng.on_evict(d)
            server.shutdown()
        svc.on_evict(evicted)
        host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
        svc.set_backends([f"http://{host}:{port}"])
        eng.report()
        svc.ready()
        svc.run_in_thread()
    server.serve_forever()
    eng.limiter.wait_at_most(0, 60)  # answers under way are finished before the process goes
    server.server_close()
    log(f"served {eng.limiter.served} request(s); exiting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
