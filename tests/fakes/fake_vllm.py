#!/usr/bin/env python3
"""fake_vllm.py - a stand-in for vLLM's OpenAI-compatible server and its sleep mode, for tests.

    fake_vllm.py [--host 127.0.0.1] [--port 0] [--dev-mode] [--enable-sleep-mode]
                 [--vram-mib N] [--residual-mib R] [--weights-mib W] [--usage-file PATH]
                 [--sleep-ms MS] [--first-sleep-ms MS] [--wake-ms MS] [--wake-mib-per-s BW]
                 [--token-ms MS] [--load-ms MS] [--served-model-name NAME]
                 [--park-racing-requests] [--cuda [--cuda-lib PATH] [--cuda-device N]]

Python 3 standard library only. Prints "port N" on stdout once it listens (after --load-ms, as
vLLM listens only once its model is loaded). Faithful to ../../../shared/research/suspend.md,
section 1 (vLLM's sleep mode), in what a client can see:

- The sleep routes (POST /sleep, POST /wake_up, GET /is_sleeping, POST /collective_rpc,
  POST /reset_prefix_cache) exist only with --dev-mode or VLLM_SERVER_DEV_MODE=1; without it they
  answer 404 {"detail":"Not Found"} as FastAPI does for a route never mounted. Without
  --enable-sleep-mode, /sleep and /wake_up answer 500 (V0's engine asserts; the fake's reading).
- Parameters are query strings; a body is read and ignored. /sleep?level=L&mode=M (level 1 and
  mode abort by default; level 0 pauses scheduling only, 1 offloads the weights and discards the
  KV cache, 2 discards both) answers 200 with an empty body once the engine sleeps; a level that
  is not a number or an unknown mode is a 500. mode=abort finishes the requests in flight
  (finish_reason "abort"), wait lets them finish first, keep freezes them until the wake.
- /wake_up?tags=T (repeatable; none = all; "scheduling" = the level-0 pause) answers 200 once
  the memory is back: --wake-ms plus the MiB brought back at --wake-mib-per-s. A tag already
  awake is a no-op. is_sleeping stays true until every tag is back and scheduling resumed.
- Requests that arrive while it sleeps are held (never refused) and answered after the wake.
  With --park-racing-requests, one that arrives while a /sleep is under way is parked forever
  (vllm#45326, a fix that was not merged).
- After a level-2 sleep the weights are garbage: completions are "!!!!" until
  POST /collective_rpc {"method": "reload_weights"}.
- Memory: --vram-mib awake; asleep only --residual-mib (the CUDA context and what lives outside
  vLLM's pool); weights (--weights-mib, default half the rest) and the KV cache come back by tag.
  Reported at GET /metrics (vllm:engine_sleep_state{sleep_state="awake"|"weights_offloaded"|
  "discard_all"}, vllm:num_requests_running, vllm:num_requests_waiting, and
  oversub_fake_vram_used_mib) and, with --usage-file, in a JSON file rewritten at each change.
- With --cuda the memory is really held through libcuda.so.1 (the fake driver, or a real one):
  cuMemCreate for the weights and the KV cache, released at sleep and made again at wake (as
  vLLM's CuMemAllocator does), cuMemAlloc for the residual; every generated token "launches"
  (a cuMemsetD8 on the residual), so a process locked by the CUDA checkpoint API stops
  generating. Under oversub's shim (LD_PRELOAD) the shim counts that memory, as for vLLM.
- With --sleep-frees-nothing a sleep answers 200 and is_sleeping says true, but nothing is
  freed (vllm#11743: with expandable_segments:True sleep freed 0 GiB).
- It never speaks to oversub: degrade directives are never read (a webhook to it is a 404), as
  with the real server.
Not modelled: tensor parallelism, CUDA graphs (a bigger residual is a flag), /sleep's tags, the
V0 engine's crash on a request during sleep, logprobs, tools, n > 1.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

TAGS = ("weights", "kv_cache")
MODES = ("abort", "wait", "keep")


class CudaError(Exception):
    pass


class Cuda:
    """The few driver calls the fake makes, through ctypes. Contexts are per thread in CUDA."""

    class _Loc(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class _Flags(ctypes.Structure):
        _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                    ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]

    class _Prop(ctypes.Structure):
        pass

    _Prop._fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                      ("location", _Loc), ("win32HandleMetaData", ctypes.c_void_p),
                      ("allocFlags", _Flags)]

    def __init__(self, lib: str, device: int) -> None:
        self.lib = ctypes.CDLL(lib)
        u64, size = ctypes.c_ulonglong, ctypes.c_size_t
        sigs = {
            "cuInit": [ctypes.c_uint],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
            "cuCtxSetCurrent": [ctypes.c_void_p],
            "cuMemAlloc_v2": [ctypes.POINTER(u64), size],
            "cuMemFree_v2": [u64],
            "cuMemsetD8_v2": [u64, ctypes.c_ubyte, size],
            "cuMemCreate": [ctypes.POINTER(u64), size, ctypes.POINTER(Cuda._Prop), u64],
            "cuMemRelease": [u64],
        }
        for name, args in sigs.items():
            fn = getattr(self.lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
        self._check("cuInit", self.lib.cuInit(0))
        dev = ctypes.c_int()
        self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), device))
        self.device = dev.value
        self.ctx = ctypes.c_void_p()
        self._check("cuDevicePrimaryCtxRetain",
                    self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev))
        self._local = threading.local()

    @staticmethod
    def _check(what: str, rc: int) -> None:
        if rc != 0:
            raise CudaError(f"{what} failed: CUresult {rc}")

    def _current(self) -> None:
        if not getattr(self._local, "ctx", False):
            self._check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(self.ctx))
            self._local.ctx = True

    def alloc(self, mib: int) -> int:
        self._current()
        p = ctypes.c_ulonglong()
        self._check(f"cuMemAlloc({mib} MiB)", self.lib.cuMemAlloc_v2(ctypes.byref(p), mib << 20))
        return p.value

    def free(self, p: int) -> None:
        self._current()
        self.lib.cuMemFree_v2(p)

    def create(self, mib: int) -> int:
        self._current()
        prop = Cuda._Prop()
        prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.device
        h = ctypes.c_ulonglong()
        self._check(f"cuMemCreate({mib} MiB)",
                    self.lib.cuMemCreate(ctypes.byref(h), mib << 20, ctypes.byref(prop), 0))
        return h.value

    def release(self, h: int) -> None:
        self._current()
        self.lib.cuMemRelease(h)

    def launch(self, p: int, value: int) -> None:
        """Stands for a kernel launch: waits while the process is locked by a checkpoint."""
        self._current()
        self._check("cuMemsetD8", self.lib.cuMemsetD8_v2(p, value & 0xFF, 1))


class Request:
    def __init__(self) -> None:
        self.aborted = False


class Engine:
    """The engine core: its scheduler's pause, its executor's sleeping tags, the memory.

    One condition variable (cv) guards every field; sleep, wake_up and collective_rpc run one at
    a time (admin), as the engine core runs utility calls in turn."""

    def __init__(self, args: argparse.Namespace, cuda: Optional[Cuda]) -> None:
        self.args = args
        self.cuda = cuda
        self.cv = threading.Condition()
        self.admin = threading.Lock()
        self.pause: Optional[str] = None  # None, "new" (new requests wait), "all" (all wait)
        self.sleeping_tags: set = set()
        self.level = 0
        self.weights_lost = False
        self.sleeps = 0
        self.sleep_under_way = False
        self.running: set = set()
        self.waiting = 0
        self.parked = 0
        self.finished = 0
        rest = max(args.vram_mib - args.residual_mib, 0)
        weights = args.weights_mib if args.weights_mib is not None else rest // 2
        weights = min(weights, rest)
        self.mib = {"weights": weights, "kv_cache": rest - weights}
        self.handles: Dict[str, int] = {}
        self.residual_ptr = 0
        if cuda:
            if args.residual_mib > 0:
                self.residual_ptr = cuda.alloc(args.residual_mib)
            for tag in TAGS:
                if self.mib[tag] > 0:
                    self.handles[tag] = cuda.create(self.mib[tag])
        self.write_usage()

    # ---- what it reports -------------------------------------------------------------------

    def is_sleeping(self) -> bool:
        return self.pause is not None or bool(self.sleeping_tags)

    def vram_used_mib(self) -> int:
        if self.args.sleep_frees_nothing:
            return self.args.vram_mib
        return self.args.residual_mib + sum(self.mib[t] for t in TAGS if t not in self.sleeping_tags)

    def sleep_state(self) -> str:
        if self.sleeping_tags:
            return "weights_offloaded" if self.level == 1 else "discard_all"
        return "paused" if self.pause is not None else "awake"

    def write_usage(self) -> None:
        path = self.args.usage_file
        if not path:
            return
        with self.cv:
            doc = {"pid": os.getpid(), "vram_used_mib": self.vram_used_mib(),
                   "is_sleeping": self.is_sleeping(), "sleep_state": self.sleep_state(),
                   "level": self.level if self.sleeping_tags else 0,
                   "weights_valid": not self.weights_lost}
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
            f.write("\n")
        os.replace(tmp, path)

    def metrics(self) -> str:
        model = self.args.served_model_name
        with self.cv:
            sleeping = self.is_sleeping()
            state = self.sleep_state()
            running, waiting = len(self.running), self.waiting + self.parked
            vram, finished = self.vram_used_mib(), self.finished
        lab = f'engine="0",model_name="{model}"'
        lines = [
            "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is "
            "sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
            "discard_all = 1 means sleep level 2.",
            "# TYPE vllm:engine_sleep_state gauge",
            f'vllm:engine_sleep_state{{{lab},sleep_state="awake"}} {0.0 if sleeping else 1.0}',
            f'vllm:engine_sleep_state{{{lab},sleep_state="weights_offloaded"}} '
            f'{1.0 if state == "weights_offloaded" else 0.0}',
            f'vllm:engine_sleep_state{{{lab},sleep_state="discard_all"}} '
            f'{1.0 if state == "discard_all" else 0.0}',
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lab}}} {float(running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lab}}} {float(waiting)}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{lab},finished_reason="stop"}} {float(finished)}',
            "# HELP oversub_fake_vram_used_mib GPU memory the fake vLLM holds, in MiB.",
            "# TYPE oversub_fake_vram_used_mib gauge",
            f"oversub_fake_vram_used_mib {vram}",
        ]
        return "\n".join(lines) + "\n"

    # ---- generation ------------------------------------------------------------------------

    def generate(self, words: List[str], max_tokens: Optional[int],
                 emit: Callable[[str], None]) -> Tuple[str, int]:
        """Runs one request: held while scheduling is paused, then a token at a time. Returns
        (finish_reason, completion tokens)."""
        req = Request()
        with self.cv:
            if self.sleep_under_way and self.args.park_racing_requests:
                self.parked += 1
                while True:
                    self.cv.wait()
            self.waiting += 1
            while self.pause is not None:
                self.cv.wait()
            self.waiting -= 1
            self.running.add(req)
        n, finish = 0, "stop"
        try:
            while True:
                with self.cv:
                    while self.pause == "all" and not req.aborted:
                        self.cv.wait()
                    if req.aborted:
                        finish = "abort"
                        break
                    garbage = self.weights_lost
                if n >= len(words):
                    break
                if max_tokens is not None and n >= max_tokens:
                    finish = "length"
                    break
                if self.cuda and self.residual_ptr:
                    self.cuda.launch(self.residual_ptr, n)
                if self.args.token_ms:
                    time.sleep(self.args.token_ms / 1000)
                emit("!" if garbage else words[n])
                n += 1
        finally:
            with self.cv:
                self.running.discard(req)
                if finish != "abort":
                    self.finished += 1
                self.cv.notify_all()
        return finish, n

    # ---- sleep mode --------------------------------------------------------------------------

    def sleep(self, level: int, mode: str) -> None:
        with self.admin:
            with self.cv:
                if mode == "abort":
                    for r in self.running:
                        r.aborted = True
                self.pause = "all" if mode == "keep" else "new"
                self.cv.notify_all()
                if mode == "wait":
                    while self.running:
                        self.cv.wait()
                if level < 1 or self.sleeping_tags:
                    return  # level 0 pauses only; an executor already asleep does nothing
                self.sleep_under_way = True
            try:
                delay = self.args.sleep_ms + (self.args.first_sleep_ms if self.sleeps == 0 else 0)
                time.sleep(delay / 1000)
                if self.cuda and not self.args.sleep_frees_nothing:
                    for tag in TAGS:
                        if tag in self.handles:
                            self.cuda.release(self.handles.pop(tag))
                with self.cv:
                    self.sleeping_tags = set(TAGS)
                    self.level = level
                    self.weights_lost = self.weights_lost or level >= 2
                    self.sleeps += 1
            finally:
                with self.cv:
                    self.sleep_under_way = False
        self.write_usage()

    def wake_up(self, tags: Optional[List[str]]) -> None:
        with self.admin:
            if tags is not None and "scheduling" in tags:
                tags = [t for t in tags if t != "scheduling"]
            if tags is None or tags:
                with self.cv:
                    want = [t for t in (tags if tags is not None else TAGS) if t in self.sleeping_tags]
                if want:
                    mib = sum(self.mib[t] for t in want)
                    delay = self.args.wake_ms / 1000
                    if self.args.wake_mib_per_s > 0:
                        delay += mib / self.args.wake_mib_per_s
                    time.sleep(delay)
                for tag in want:
                    if self.cuda and self.mib[tag] > 0 and tag not in self.handles:
                        self.handles[tag] = self.cuda.create(self.mib[tag])  # CudaError: a 500
                    with self.cv:
                        self.sleeping_tags.discard(tag)
            with self.cv:
                if not self.sleeping_tags:
                    self.pause = None
                    self.cv.notify_all()
        self.write_usage()

    def reload_weights(self) -> None:
        with self.admin:
            with self.cv:
                self.weights_lost = False
        self.write_usage()


def reply_words(messages: list) -> List[str]:
    """The deterministic answer: the same prompt gets the same words."""
    last = ""
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, list):
                c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            last = c if isinstance(c, str) else ""
    words = ["This", " is", " a", " fake", " reply", " to:"]
    return words + [" " + w for w in last.split()][:64] + ["."]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    engine: Engine
    args: argparse.Namespace

    def log_message(self, format: str, *a) -> None:  # noqa: A002
        if self.args.log:
            sys.stderr.write("fake_vllm: " + (format % a) + "\n")

    # ---- plumbing -----------------------------------------------------------------------------

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _send(self, code: int, body: bytes = b"", ctype: Optional[str] = None,
              extra: Optional[Dict[str, str]] = None) -> None:
        self.send_response(code)
        if ctype:
            self.send_header("Content-Type", ctype)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, doc) -> None:
        self._send(code, json.dumps(doc, separators=(",", ":")).encode(), "application/json")

    def _error(self, code: int, message: str, kind: str) -> None:
        self._json(code, {"object": "error", "message": message, "type": kind, "param": None,
                          "code": code})

    def _internal_error(self) -> None:
        self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")

    def _route(self) -> None:
        url = urlsplit(self.path)
        self.query = parse_qs(url.query, keep_blank_values=True)
        body = self._body()
        routes = {
            "/health": {"GET": self.health},
            "/version": {"GET": self.version},
            "/metrics": {"GET": self.get_metrics},
            "/v1/models": {"GET": self.models},
            "/v1/chat/completions": {"POST": self.chat},
            "/v1/completions": {"POST": self.completions},
        }
        if self.args.dev_mode:
            routes.update({
                "/sleep": {"POST": self.sleep},
                "/wake_up": {"POST": self.wake_up},
                "/is_sleeping": {"GET": self.is_sleeping},
                "/collective_rpc": {"POST": self.collective_rpc},
                "/reset_prefix_cache": {"POST": self.reset_prefix_cache},
            })
        methods = routes.get(url.path)
        if methods is None:
            self._json(404, {"detail": "Not Found"})
        elif self.command not in methods:
            self._send(405, b'{"detail":"Method Not Allowed"}', "application/json",
                       {"Allow": ", ".join(methods)})
        else:
            methods[self.command](body)

    def do_GET(self) -> None:  # noqa: N802
        self._route()

    def do_POST(self) -> None:  # noqa: N802
        self._route()

    def do_PUT(self) -> None:  # noqa: N802
        self._route()

    def do_DELETE(self) -> None:  # noqa: N802
        self._route()

    # ---- routes -------------------------------------------------------------------------------

    def health(self, _body: bytes) -> None:
        self._send(200)

    def version(self, _body: bytes) -> None:
        self._json(200, {"version": "0.0.0+fake"})

    def get_metrics(self, _body: bytes) -> None:
        self._send(200, self.engine.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")

    def models(self, _body: bytes) -> None:
        name = self.args.served_model_name
        self._json(200, {"object": "list", "data": [
            {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
             "root": name, "parent": None, "max_model_len": 4096}]})

    def sleep(self, _body: bytes) -> None:
        if not self.args.enable_sleep_mode:
            self._internal_error()
            return
        try:
            level = int(self.query.get("level", ["1"])[0])
        except ValueError:
            self._internal_error()
            return
        mode = self.query.get("mode", ["abort"])[0]
        if mode not in MODES:
            self._internal_error()
            return
        self.engine.sleep(level, mode)
        self._send(200)

    def wake_up(self, _body: bytes) -> None:
        if not self.args.enable_sleep_mode:
            self._internal_error()
            return
        tags = self.query.get("tags") or None
        try:
            self.engine.wake_up(tags)
        except CudaError as e:
            sys.stderr.write(f"fake_vllm: wake_up failed: {e}\n")
            self._internal_error()
            return
        self._send(200)

    def is_sleeping(self, _body: bytes) -> None:
        with self.engine.cv:
            s = self.engine.is_sleeping()
        self._json(200, {"is_sleeping": s})

    def collective_rpc(self, body: bytes) -> None:
        try:
            doc = json.loads(body or b"null")
        except ValueError as e:
            self._json(400, {"detail": f"JSON decode error: {e}"})
            return
        method = doc.get("method") if isinstance(doc, dict) else None
        if method is None:
            self._json(400, {"detail": "Missing 'method' in request body"})
            return
        if method != "reload_weights":
            self._internal_error()  # the worker has no such method
            return
        self.engine.reload_weights()
        self._json(200, {"results": [None]})

    def reset_prefix_cache(self, _body: bytes) -> None:
        self._send(200)

    def _parse(self, body: bytes) -> Optional[dict]:
        try:
            doc = json.loads(body)
        except ValueError as e:
            self._error(400, f"JSON decode error: {e}", "BadRequestError")
            return None
        if not isinstance(doc, dict):
            self._error(400, "the body is not a JSON object", "BadRequestError")
            return None
        model = doc.get("model")
        if model is not None and model != self.args.served_model_name:
            self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
            return None
        mt = doc.get("max_completion_tokens", doc.get("max_tokens"))
        if mt is not None and (not isinstance(mt, int) or mt < 1):
            self._error(400, "max_tokens must be at least 1", "BadRequestError")
            return None
        return doc

    def chat(self, body: bytes) -> None:
        doc = self._parse(body)
        if doc is None:
            return
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages:
            self._error(400, "messages: a non-empty list is required", "BadRequestError")
            return
        self._answer(doc, reply_words(messages), chat=True,
                     prompt_tokens=sum(len(str(m.get("content", "")).split()) + 4
                                       for m in messages if isinstance(m, dict)))

    def completions(self, body: bytes) -> None:
        doc = self._parse(body)
        if doc is None:
            return
        prompt = doc.get("prompt")
        if not isinstance(prompt, str):
            self._error(400, "prompt: a string is required", "BadRequestError")
            return
        self._answer(doc, reply_words([{"role": "user", "content": prompt}]), chat=False,
                     prompt_tokens=len(prompt.split()))

    def _answer(self, doc: dict, words: List[str], chat: bool, prompt_tokens: int) -> None:
        max_tokens = doc.get("max_completion_tokens", doc.get("max_tokens"))
        model = self.args.served_model_name
        rid = ("chatcmpl-" if chat else "cmpl-") + os.urandom(8).hex()
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not doc.get("stream"):
            parts: List[str] = []
            finish, n = self.engine.generate(words, max_tokens, parts.append)
            text = "".join(parts)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": None, "finish_reason": finish, "stop_reason": None}
                      if chat else
                      {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                       "stop_reason": None})
            self._json(200, {"id": rid, "object": obj, "created": created, "model": model,
                             "choices": [choice],
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                       "total_tokens": prompt_tokens + n}})
            return
        # server-sent events, one chunk per token, as vLLM streams
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def event(choice: dict, usage: Optional[dict] = None) -> None:
            ev = {"id": rid, "object": chunk_obj, "created": created, "model": model,
                  "choices": [choice] if choice else []}
            if usage is not None:
                ev["usage"] = usage
            self._chunk(b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n")

        def delta(text: str, first: bool = False) -> dict:
            if chat:
                d = {"role": "assistant", "content": text} if first else {"content": text}
                return {"index": 0, "delta": d, "logprobs": None, "finish_reason": None}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}

        try:
            if chat:
                event(delta("", first=True))
            finish, n = self.engine.generate(words, max_tokens, lambda t: event(delta(t)))
            last = delta("")
            last["finish_reason"] = finish
            last["stop_reason"] = None
            event(last)
            opts = doc.get("stream_options") or {}
            if isinstance(opts, dict) and opts.get("include_usage"):
                event({}, {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                           "total_tokens": prompt_tokens + n})
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="a fake vLLM server with sleep mode, for tests")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dev-mode", action="store_true",
                   default=os.environ.get("VLLM_SERVER_DEV_MODE") == "1",
                   help="mount the sleep routes (as VLLM_SERVER_DEV_MODE=1 does)")
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--served-model-name", "--model", default="fake-model")
    p.add_argument("--vram-mib", type=int, default=16384, help="GPU memory held awake")
    p.add_argument("--residual-mib", type=int, default=1024, help="GPU memory kept asleep")
    p.add_argument("--weights-mib", type=int, default=None,
                   help="of the rest, the weights' (default half); the KV cache has the others")
    p.add_argument("--usage-file", default=None, help="JSON usage, rewritten at each change")
    p.add_argument("--sleep-ms", type=int, default=0)
    p.add_argument("--first-sleep-ms", type=int, default=0, help="added to the first sleep")
    p.add_argument("--wake-ms", type=int, default=0, help="the fixed part of a wake")
    p.add_argument("--wake-mib-per-s", type=float, default=0.0,
                   help="the rate a wake brings memory back (0: instant)")
    p.add_argument("--token-ms", type=int, default=2, help="time per generated token")
    p.add_argument("--load-ms", type=int, default=0, help="model load time before listening")
    p.add_argument("--park-racing-requests", action="store_true",
                   help="a request arriving during a sleep is never answered (vllm#45326)")
    p.add_argument("--cuda", action="store_true", help="hold the memory through libcuda.so.1")
    p.add_argument("--sleep-frees-nothing", action="store_true",
                   help="sleep answers 200 and frees nothing (vllm#11743, expandable_segments)")
    p.add_argument("--cuda-lib", default="libcuda.so.1")
    p.add_argument("--cuda-device", type=int, default=0)
    p.add_argument("--log", action="store_true", help="log each request on stderr")
    args = p.parse_args(argv)
    if args.residual_mib > args.vram_mib:
        p.error("--residual-mib cannot exceed --vram-mib")
    return args


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    time.sleep(args.load_ms / 1000)
    cuda = None
    try:
        if args.cuda:
            cuda = Cuda(args.cuda_lib, args.cuda_device)
        engine = Engine(args, cuda)
    except (CudaError, OSError) as e:
        sys.stderr.write(f"fake_vllm: cannot load the model: {e}\n")
        return 1
    Handler.engine = engine
    Handler.args = args
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"port {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
