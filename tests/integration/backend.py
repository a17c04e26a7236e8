#!/usr/bin/env python3
"""backend.py - a test backend for the gateway: prints "port N" once it listens.
  /echo            the path and headers it got, as JSON
  /metrics         vLLM's saturation series, as /set-engine?waiting=W&running=R&kv=K set them
  /slow?ms=N&tag=T records T in arrival order, waits N ms, answers T
  /order           the tags in arrival order, as JSON
  /stats           completions finished and abandoned (the client left), as JSON
  /upgrade         101 Switching Protocols (a WebSocket upgrade)
  POST .../chat/completions  an OpenAI-like answer (see completions())
  POST /early      300,000 bytes answered at once, the body never read (held 2 s, then closed)
  /stream          a chunked body: "first", then (once the file named by FLAG exists, at
                   most 5 s later) "after-flag" or "timeout"
"""
import json, os, select, socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse, parse_qs

order = []
lock = threading.Lock()
# what /metrics says, as vLLM's Prometheus endpoint would (GET /set-engine?waiting=&running=&kv=)
engine = {"waiting": 0.0, "running": 0.0, "kv": 0.0}
stats = {"aborted": 0, "completed": 0}


def gone(sock):
    """The client closed its side (as vLLM and TGI check between tokens)."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def send(self, code, body, ctype="application/json"):
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def do_POST(self):
        if self.path.startswith("/early"):
            # answers before reading the body (as a backend refusing an upload does), reads
            # none of it, and holds the connection a while
            b = b"B" * 300000
            self.send_response(200)
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)
            self.wfile.flush()
            time.sleep(2)
            self.close_connection = True
            return
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
            body = body.decode()
        else:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n).decode()
        if self.path.endswith("/chat/completions"):
            return self.completions(json.loads(body or "{}"))
        self.send(200, json.dumps({"path": self.path, "body": body}))

    def completions(self, req):
        """An OpenAI-like chat completion: the user message "delay:N" waits N ms first,
        "chunks:N" streams N tokens 50 ms apart; a client that leaves stops the work."""
        text = (req.get("messages") or [{}])[-1].get("content", "")
        delay = int(text.split("delay:")[1].split()[0]) if "delay:" in text else 0
        n = int(text.split("chunks:")[1].split()[0]) if "chunks:" in text else 3
        t = time.time()
        while (time.time() - t) * 1000 < delay:
            if gone(self.connection):
                with lock:
                    stats["aborted"] += 1
                return
            time.sleep(0.02)
        base = {"id": "c1", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model", "m")}
        if not req.get("stream"):
            base["choices"] = [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "ok"}}]
            with lock:
                stats["completed"] += 1
            return self.send(200, json.dumps(base))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for i in range(n + 1):
                if gone(self.connection):
                    raise BrokenPipeError
                c = dict(base, object="chat.completion.chunk",
                         choices=[{"index": 0, "delta": {"content": "t%d " % i}, "finish_reason": None}])
                ev = b"data: " + json.dumps(c).encode() + b"\n\n" if i < n else b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            with lock:
                stats["completed"] += 1
        except (BrokenPipeError, ConnectionResetError):
            with lock:
                stats["aborted"] += 1
    def do_HEAD(self):
        # a length without a body, as HEAD answers are: the proxy must not wait for it
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "42")
        self.end_headers()
    def do_GET(self):
        u = urlparse(self.path)
        q = parse_qs(u.query)
        if u.path == "/set-engine":
            for k in engine:
                if k in q:
                    engine[k] = float(q[k][0])
            self.send(200, json.dumps(engine))
        elif u.path == "/metrics":
            self.send(200, "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
                      "# TYPE vllm:num_requests_waiting gauge\n"
                      'vllm:num_requests_waiting{model_name="m",engine="0"} %g\n'
                      'vllm:num_requests_running{model_name="m",engine="0"} %g\n'
                      'vllm:kv_cache_usage_perc{model_name="m",engine="0"} %g\n'
                      % (engine["waiting"], engine["running"], engine["kv"]), "text/plain")
        elif u.path == "/echo":
            self.send(200, json.dumps({"path": self.path, "headers": dict(self.headers),
                                       "port": self.server.server_address[1]}))
        elif u.path == "/slow":
            tag = q.get("tag", ["?"])[0]
            with lock:
                order.append(tag)
            time.sleep(int(q.get("ms", ["100"])[0]) / 1000.0)
            self.send(200, tag, "text/plain")
        elif u.path == "/upgrade":
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.close_connection = True
        elif u.path == "/stats":
            with lock:
                self.send(200, json.dumps(stats))
        elif u.path == "/order":
            with lock:
                self.send(200, json.dumps(order))
        elif u.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            def chunk(s):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(s), s))
                self.wfile.flush()
            chunk(b"first\n")
            flag = os.environ.get("FLAG", "/nonexistent")
            t = time.time()
            while not os.path.exists(flag) and time.time() - t < 5:
                time.sleep(0.02)
            chunk(b"after-flag\n" if os.path.exists(flag) else b"timeout\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        else:
            self.send(404, json.dumps({"error": "no such path"}))

s = ThreadingHTTPServer(("127.0.0.1", 0), H)
s.daemon_threads = True
print("port", s.server_address[1], flush=True)
s.serve_forever()
