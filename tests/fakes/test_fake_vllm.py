#!/usr/bin/env python3
"""test_fake_vllm.py - the fake vLLM server (tests/fakes/fake_vllm.py) against its checklist.

    test_fake_vllm.py [FAKE_CUDA_DIR] [unittest options]

Each test starts the server as a child on 127.0.0.1 port 0 and speaks HTTP to it: the sleep
routes 404 without dev mode; sleep, is_sleeping and wake with query parameters (a body
ignored); requests sent while it sleeps answered only after the wake; the residual reported
asleep, in /metrics and in the usage file; partial wakes by tag; level 0; level 2's garbage
until reload_weights; the abort, wait and keep modes; the wake's time; the racing request
parked forever; errors. With FAKE_CUDA_DIR (the fake libcuda.so.1's folder) the memory is held
on the fake device, seen to fall and come back, and a CUDA checkpoint lock stops generation.
Waits are for conditions (an answer, a gauge), each bounded generously; the only timing
assertions are lower bounds.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_vllm.py")
BOUND_S = 30.0
FAKE_CUDA_DIR: Optional[str] = None
REPLY = "This is a fake reply to: hello world."


class Server:
    def __init__(self, *args: str, env: Optional[Dict[str, str]] = None) -> None:
        self.proc = subprocess.Popen([sys.executable, FAKE, "--port", "0", *args],
                                     stdout=subprocess.PIPE, text=True, env=env)
        ready, _, _ = select.select([self.proc.stdout], [], [], BOUND_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("port "):
            self.proc.kill()
            raise RuntimeError(f"fake_vllm did not start: {line!r}")
        self.port = int(line.split()[1])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()

    def call(self, method: str, path: str, body: Optional[bytes] = None,
             timeout: float = BOUND_S) -> Tuple[int, bytes, http.client.HTTPMessage]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, r.read(), r.headers
        finally:
            conn.close()

    def json(self, method: str, path: str, doc=None) -> Tuple[int, object]:
        status, data, _ = self.call(method, path, None if doc is None else json.dumps(doc).encode())
        return status, json.loads(data) if data else None

    def is_sleeping(self) -> bool:
        status, doc = self.json("GET", "/is_sleeping")
        assert status == 200, status
        return doc["is_sleeping"]

    def metrics(self) -> Dict[str, float]:
        status, data, _ = self.call("GET", "/metrics")
        assert status == 200
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                if "{" in name:
                    base, labels = name.split("{", 1)
                    state = [p.split("=", 1)[1].strip('"') for p in labels.rstrip("}").split(",")
                             if p.startswith("sleep_state=")]
                    name = base + (":" + state[0] if state else "")
                out[name] = float(value)
        return out

    def vram(self) -> int:
        return int(self.metrics()["oversub_fake_vram_used_mib"])

    def chat(self, text: str = "hello world", stream: bool = False, **kw) -> dict:
        doc = {"model": "fake-model", "messages": [{"role": "user", "content": text}], **kw}
        if stream:
            return self._stream(doc)
        status, ans = self.json("POST", "/v1/chat/completions", doc)
        assert status == 200, (status, ans)
        return ans

    def _stream(self, doc: dict) -> dict:
        doc["stream"] = True
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=BOUND_S)
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(doc).encode(),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            text, finish, done = "", None, False
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                ev = json.loads(line[6:])
                assert ev["object"] == "chat.completion.chunk"
                for c in ev["choices"]:
                    text += c["delta"].get("content") or ""
                    finish = c["finish_reason"] or finish
            assert done
            return {"content": text, "finish_reason": finish}
        finally:
            conn.close()

    def post(self, path: str) -> Tuple[int, bytes]:
        status, data, _ = self.call("POST", path, b"")
        return status, data


def wait_for(cond, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Call(threading.Thread):
    """A request in a thread: its result (or exception) once it returns."""

    def __init__(self, fn, *args, **kw) -> None:
        super().__init__(daemon=True)
        self.fn, self.args, self.kw = fn, args, kw
        self.result = None
        self.error: Optional[BaseException] = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args, **self.kw)
        except BaseException as e:  # noqa: BLE001 - reported by get()
            self.error = e

    def get(self):
        self.join(BOUND_S)
        if self.is_alive():
            raise AssertionError("the call did not return")
        if self.error:
            raise self.error
        return self.result


def content(ans: dict) -> str:
    return ans["choices"][0]["message"]["content"]


class FakeVllmTest(unittest.TestCase):
    def start(self, *args: str, env: Optional[Dict[str, str]] = None) -> Server:
        s = Server(*args, env=env)
        self.addCleanup(s.close)
        return s

    def sleep_server(self, *extra: str) -> Server:
        return self.start("--dev-mode", "--enable-sleep-mode", "--vram-mib", "1000",
                          "--residual-mib", "100", "--weights-mib", "600", *extra)

    def test_no_dev_mode_is_404(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}
        s = self.start("--enable-sleep-mode", env=env)
        for method, path in (("POST", "/sleep?level=1"), ("POST", "/wake_up"),
                             ("GET", "/is_sleeping"), ("POST", "/collective_rpc")):
            status, data, headers = s.call(method, path, b"" if method == "POST" else None)
            self.assertEqual(status, 404, path)
            self.assertEqual(json.loads(data), {"detail": "Not Found"})
            self.assertEqual(headers["Content-Type"], "application/json")
        self.assertEqual(content(s.chat()), REPLY)
        self.assertEqual(s.call("GET", "/health")[0], 200)
        status, models = s.json("GET", "/v1/models")
        self.assertEqual(models["data"][0]["id"], "fake-model")
        # the environment variable mounts them too, as in vLLM
        s2 = self.start("--enable-sleep-mode", env={**env, "VLLM_SERVER_DEV_MODE": "1"})
        self.assertFalse(s2.is_sleeping())

    def test_sleep_and_wake(self) -> None:
        usage = os.path.join(self.tmp, "usage.json")
        s = self.sleep_server("--usage-file", usage)

        def used() -> dict:
            with open(usage, encoding="utf-8") as f:
                return json.load(f)

        self.assertFalse(s.is_sleeping())
        m = s.metrics()
        self.assertEqual(m["vllm:engine_sleep_state:awake"], 1.0)
        self.assertEqual(m["oversub_fake_vram_used_mib"], 1000)
        self.assertEqual(used()["vram_used_mib"], 1000)
        # the body is ignored: {"level": 2} is a level-1 sleep
        status, data, _ = s.call("POST", "/sleep", json.dumps({"level": 2}).encode())
        self.assertEqual((status, data), (200, b""))
        self.assertTrue(s.is_sleeping())
        m = s.metrics()
        self.assertEqual(m["vllm:engine_sleep_state:awake"], 0.0)
        self.assertEqual(m["vllm:engine_sleep_state:weights_offloaded"], 1.0)
        self.assertEqual(m["vllm:engine_sleep_state:discard_all"], 0.0)
        self.assertEqual(m["oversub_fake_vram_used_mib"], 100)  # the residual stays
        self.assertEqual(used()["vram_used_mib"], 100)
        self.assertEqual(used()["sleep_state"], "weights_offloaded")
        self.assertEqual(s.post("/sleep"), (200, b""))  # asleep already: nothing more
        self.assertEqual(s.vram(), 100)
        self.assertEqual(s.call("GET", "/sleep")[0], 405)
        self.assertEqual(s.post("/wake_up"), (200, b""))
        self.assertFalse(s.is_sleeping())
        self.assertEqual(s.vram(), 1000)
        self.assertEqual(used()["vram_used_mib"], 1000)
        self.assertEqual(content(s.chat()), REPLY)  # level 1 kept the weights

    def test_requests_held_while_asleep(self) -> None:
        s = self.sleep_server()
        s.post("/sleep?level=1")
        plain = Call(s.chat)
        streamed = Call(s.chat, stream=True)
        wait_for(lambda: s.metrics()["vllm:num_requests_waiting"] == 2, "two requests held")
        self.assertTrue(plain.is_alive() and streamed.is_alive())
        self.assertTrue(s.is_sleeping())
        s.post("/wake_up")
        self.assertEqual(content(plain.get()), REPLY)
        self.assertEqual(plain.get()["choices"][0]["finish_reason"], "stop")
        self.assertEqual(streamed.get(), {"content": REPLY, "finish_reason": "stop"})

    def test_partial_wake(self) -> None:
        s = self.sleep_server()
        s.post("/sleep")
        held = Call(s.chat)
        self.assertEqual(s.post("/wake_up?tags=weights"), (200, b""))
        self.assertTrue(s.is_sleeping())  # the KV cache is still away
        self.assertEqual(s.vram(), 100 + 600)
        self.assertEqual(s.post("/wake_up?tags=weights"), (200, b""))  # a no-op
        wait_for(lambda: s.metrics()["vllm:num_requests_waiting"] == 1, "the request held")
        self.assertTrue(held.is_alive())
        s.post("/wake_up?tags=kv_cache")
        self.assertFalse(s.is_sleeping())
        self.assertEqual(s.vram(), 1000)
        self.assertEqual(content(held.get()), REPLY)
        # both tags in one call, repeated as vLLM reads them
        s.post("/sleep")
        s.post("/wake_up?tags=weights&tags=kv_cache")
        self.assertFalse(s.is_sleeping())

    def test_level0_pauses_only(self) -> None:
        s = self.sleep_server()
        s.post("/sleep?level=0")
        self.assertTrue(s.is_sleeping())
        self.assertEqual(s.vram(), 1000)
        self.assertEqual(s.metrics()["vllm:engine_sleep_state:awake"], 0.0)
        held = Call(s.chat)
        wait_for(lambda: s.metrics()["vllm:num_requests_waiting"] == 1, "the request held")
        s.post("/wake_up?tags=scheduling")
        self.assertFalse(s.is_sleeping())
        self.assertEqual(content(held.get()), REPLY)

    def test_level2_garbage_until_reload(self) -> None:
        s = self.sleep_server()
        s.post("/sleep?level=2")
        m = s.metrics()
        self.assertEqual(m["vllm:engine_sleep_state:discard_all"], 1.0)
        self.assertEqual(m["oversub_fake_vram_used_mib"], 100)
        s.post("/wake_up")
        self.assertFalse(s.is_sleeping())
        self.assertEqual(s.vram(), 1000)
        garbage = content(s.chat())
        self.assertEqual(set(garbage), {"!"})
        self.assertEqual(len(garbage), len(REPLY.split()) + 1)
        self.assertEqual(s.json("POST", "/collective_rpc", {}),
                         (400, {"detail": "Missing 'method' in request body"}))
        self.assertEqual(s.json("POST", "/collective_rpc", {"method": "reload_weights"}),
                         (200, {"results": [None]}))
        self.assertEqual(s.post("/reset_prefix_cache"), (200, b""))
        self.assertEqual(content(s.chat()), REPLY)

    def test_modes(self) -> None:
        s = self.sleep_server("--token-ms", "20")
        long = {"max_tokens": 40}
        words = "one two three four five six seven eight nine ten " * 5

        def running_one() -> bool:
            return s.metrics()["vllm:num_requests_running"] == 1

        # abort (the default): the request in flight ends with finish_reason "abort"
        req = Call(s.chat, words, **long)
        wait_for(running_one, "a request running")
        s.post("/sleep")
        self.assertEqual(req.get()["choices"][0]["finish_reason"], "abort")
        s.post("/wake_up")

        # wait: the request finishes first, then the sleep answers
        order: List[str] = []
        lock = threading.Lock()

        def note(name: str, fn, *a, **kw):
            r = fn(*a, **kw)
            with lock:
                order.append(name)
            return r

        req = Call(note, "request", s.chat, words, **long)
        wait_for(running_one, "a request running")
        slept = Call(note, "sleep", s.post, "/sleep?mode=wait")
        self.assertEqual(req.get()["choices"][0]["finish_reason"], "length")
        self.assertEqual(slept.get(), (200, b""))
        # the request ran to its length (not aborted) before the sleep answered; the order the
        # two client threads note their answers in is theirs, not the server's
        self.assertEqual(sorted(order), ["request", "sleep"])
        s.post("/wake_up")

        # keep: frozen while asleep, finished whole after the wake
        req = Call(s.chat, words, **long)
        wait_for(running_one, "a request running")
        self.assertEqual(s.post("/sleep?mode=keep"), (200, b""))
        self.assertTrue(req.is_alive())
        self.assertEqual(s.metrics()["vllm:num_requests_running"], 1.0)
        s.post("/wake_up")
        ans = req.get()
        self.assertEqual(ans["choices"][0]["finish_reason"], "length")
        self.assertEqual(ans["usage"]["completion_tokens"], 40)

    def test_wake_time(self) -> None:
        # 300 ms fixed + 900 MiB at 3000 MiB/s = 600 ms at least
        s = self.sleep_server("--wake-ms", "300", "--wake-mib-per-s", "3000", "--sleep-ms", "50",
                              "--first-sleep-ms", "200")
        t0 = time.monotonic()
        s.post("/sleep")
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)  # the slow first sleep
        t0 = time.monotonic()
        s.post("/wake_up")
        self.assertGreaterEqual(time.monotonic() - t0, 0.6)

    def test_racing_request_parked_forever(self) -> None:
        s = self.sleep_server("--park-racing-requests", "--sleep-ms", "3000")
        slept = Call(s.post, "/sleep")
        wait_for(s.is_sleeping, "the sleep under way")
        racing = Call(s.chat)
        wait_for(lambda: s.metrics()["vllm:num_requests_waiting"] == 1, "the request in")
        self.assertTrue(slept.is_alive(), "the request came after the sleep: no race")
        self.assertEqual(slept.get(), (200, b""))
        s.post("/wake_up")
        self.assertFalse(s.is_sleeping())
        self.assertEqual(content(s.chat()), REPLY)  # later requests are served
        self.assertTrue(racing.is_alive())  # the racing one never is
        self.assertEqual(s.metrics()["vllm:num_requests_waiting"], 1.0)

    def test_errors(self) -> None:
        s = self.sleep_server()
        self.assertEqual(s.post("/sleep?level=deep")[0], 500)
        self.assertEqual(s.post("/sleep?mode=later")[0], 500)
        self.assertFalse(s.is_sleeping())
        status, err = s.json("POST", "/v1/chat/completions",
                             {"model": "other", "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(status, 404)
        self.assertEqual(err["type"], "NotFoundError")
        status, err = s.json("POST", "/v1/chat/completions", {"model": "fake-model"})
        self.assertEqual(status, 400)
        self.assertEqual(err["object"], "error")
        self.assertEqual(s.call("POST", "/oversub/degrade", b"{}")[0], 404)  # never obeyed
        # dev mode without --enable-sleep-mode: the routes exist, the engine refuses
        s2 = self.start("--dev-mode")
        self.assertEqual(s2.post("/sleep")[0], 500)
        self.assertFalse(s2.is_sleeping())
        # the plain completions route
        status, ans = s.json("POST", "/v1/completions", {"prompt": "hello world", "max_tokens": 3})
        self.assertEqual((status, ans["choices"][0]["text"]), (200, "This is a"))
        self.assertEqual(ans["choices"][0]["finish_reason"], "length")

    def test_memory_on_the_fake_driver(self) -> None:
        if not FAKE_CUDA_DIR:
            self.skipTest("no fake CUDA driver given")
        lib = os.path.join(FAKE_CUDA_DIR, "libcuda.so.1")
        s = self.sleep_server("--cuda", "--cuda-lib", lib, "--token-ms", "1")
        cuda = ctypes.CDLL(lib)
        used, peak = ctypes.c_ulonglong(), ctypes.c_ulonglong()

        def device_mib() -> int:
            self.assertEqual(cuda.fakecuda_stats(0, ctypes.byref(used), ctypes.byref(peak)), 0)
            return used.value >> 20

        self.assertEqual(device_mib(), 1000)
        s.post("/sleep")
        self.assertEqual(device_mib(), 100)  # the residual stays on the device
        s.post("/wake_up")
        self.assertEqual(device_mib(), 1000)
        self.assertEqual(content(s.chat()), REPLY)

        # the CUDA checkpoint API's lock stops its generation, transparently
        pid = s.proc.pid
        cuda.cuCheckpointProcessLock.argtypes = [ctypes.c_int, ctypes.c_void_p]
        cuda.cuCheckpointProcessUnlock.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self.assertEqual(cuda.cuCheckpointProcessLock(pid, None), 0)
        req = Call(s.chat)
        self.assertEqual(cuda.fakecuda_ckpt_blocked(pid, 1, int(BOUND_S * 1000)), 0)
        self.assertTrue(req.is_alive())
        self.assertEqual(cuda.cuCheckpointProcessUnlock(pid, None), 0)
        self.assertEqual(content(req.get()), REPLY)

        # a wake without room on the device: a 500, and it stays asleep
        s.post("/sleep")
        other = self.start("--cuda", "--cuda-lib", lib, "--vram-mib", str(self.dev_mib - 100 - 50),
                           "--residual-mib", "0")
        self.assertEqual(device_mib(), self.dev_mib - 50)
        self.assertEqual(s.post("/wake_up")[0], 500)
        self.assertTrue(s.is_sleeping())
        other.close()
        self.assertEqual(s.post("/wake_up")[0], 200)
        self.assertEqual(device_mib(), 1000)

    dev_mib = 4096

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="test_fake_vllm.")
        # one fake device for the module (the fake reads these once per process)
        os.environ["FAKE_CUDA_STATE"] = os.path.join(cls.tmp, "gpu")
        os.environ["FAKE_CUDA_MEM_MIB"] = str(cls.dev_mib)
        os.environ["FAKE_CUDA_DEVICES"] = "1"
        os.environ.pop("VLLM_SERVER_DEV_MODE", None)

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        FAKE_CUDA_DIR = os.path.abspath(sys.argv.pop(1))
    unittest.main()
