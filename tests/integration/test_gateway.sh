#!/usr/bin/env bash
# test_gateway.sh - the gateway on loopback with real sockets, asserting behaviour: routing with
# the prefix stripped, X-Forwarded-For, streaming (the client has the first chunk before the
# backend sends the last), the concurrency limit and the bounded queue (429 + Retry-After),
# priority order in the queue, deadlines, a service not running yet (503), a dead backend (502),
# bad input, metrics (promtool).
# Usage: test_gateway.sh PATH/TO/oversubd PATH/TO/examples-dir
set -u
bin=$(realpath "$1")
ex=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/lib.sh"

FLAG=$tmp/flag python3 "$here/backend.py" >"$tmp/backend.out" 2>&1 &
pids+=($!)
BPORT=$(waitline "$tmp/backend.out" "port ") || { echo "backend did not start"; exit 1; }
# the host's own name, when it resolves to 127.0.0.1, allowed by name (a backend named so
# reaches oversubd's API: refused when the gateway connects)
SELFNAME=$(hostname 2>/dev/null)
case "$(getent ahostsv4 "$SELFNAME" 2>/dev/null | head -1 | cut -d' ' -f1)" in
127.0.0.1) printf 'allowed_destinations: "127.0.0.0/8,::1/128,localhost,%s"\n' "$SELFNAME" >"$tmp/gw.yaml" ;;
*) SELFNAME= ; : >"$tmp/gw.yaml" ;;
esac
"$bin" --config "$tmp/gw.yaml" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" --state "$tmp/state.db" \
    --gpus sim:8x81920 --ratio 1.5 --tick-ms 100 >"$tmp/out" 2>"$tmp/err" &
pids+=($!)
PORT=$(waitline "$tmp/out" "listening on http://127.0.0.1:") || { echo "oversubd did not start: $(cat "$tmp/err")"; exit 1; }
GW=$(waitline "$tmp/out" "gateway on http://127.0.0.1:") || { echo "no gateway line: $(cat "$tmp/out")"; exit 1; }
A="http://127.0.0.1:$PORT"
G="http://127.0.0.1:$GW"
B="http://127.0.0.1:$BPORT"
submit() { curl -s -o "$tmp/sub" -w '%{http_code}' -X POST "$A/v1/services" -d "$1"; }
wait_for() { local n=$(($1 * 10)); shift; for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.1; done; return 1; }

# ---- bad gateway fields ----
expect "backends not URLs" 422 "$(submit '{"id":"x1","class":"online","vram":"1GiB","backends":["ftp://a"]}')"
expect "limit out of range" 422 "$(submit "{\"id\":\"x2\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"max_inflight\":0}")"
expect "limits without backends" 422 "$(submit '{"id":"x3","class":"online","vram":"1GiB","max_queue":3}')"

# ---- routing ----
expect "submit chat" 201 "$(submit "{\"id\":\"chat\",\"class\":\"online\",\"vram\":\"10GiB\",\"backends\":[\"$B\"],\"max_inflight\":1,\"max_queue\":2,\"queue_timeout_ms\":4000}")"
curl -s -X POST "$A/v1/services/chat/ready" >/dev/null
curl -s "$G/chat/echo?x=1" >"$tmp/echo"
expect "prefix stripped" "/echo?x=1" "$(json 'd["path"]' <"$tmp/echo")"
expect "X-Forwarded-For" 127.0.0.1 "$(json 'd["headers"].get("X-Forwarded-For")' <"$tmp/echo")"
expect "POST body passes" '{"q": 1}' "$(curl -s -X POST "$G/chat/gen" -d '{"q": 1}' | json 'd["body"]')"
expect "by Host" "/echo?y=2" "$(curl -s -H 'Host: chat.example.com' "$G/echo?y=2" | json 'd["path"]')"
expect "by Host with a port" "/echo" "$(curl -s -H 'Host: chat:8080' "$G/echo" | json 'd["path"]')"
expect "unknown Host" 404 "$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: nobody.example.com' "$G/echo")"
expect "unknown service" 404 "$(curl -s -o /dev/null -w '%{http_code}' "$G/nobody/x")"
expect "bad X-Priority" 400 "$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Priority: vip' "$G/chat/echo")"

# ---- streaming: the first chunk arrives while the backend still holds the last ----
python3 - "$GW" "$tmp/flag" >"$tmp/stream" <<'PY'
import socket, sys, os
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /chat/stream HTTP/1.1\r\nHost: x\r\n\r\n")
data = b""
while b"first" not in data:
    b = s.recv(4096)
    if not b: break
    data += b
open(sys.argv[2], "w").close()   # only now may the backend send the rest
s.settimeout(10)
while b"0\r\n\r\n" not in data and b"after-flag" not in data and b"timeout" not in data:
    b = s.recv(4096)
    if not b: break
    data += b
print("after-flag" if b"after-flag" in data else "buffered")
PY
expect "streamed" after-flag "$(cat "$tmp/stream")"
# an HTTP/1.0 client gets the chunks' data, delimited by the connection's close
expect "de-chunked for HTTP/1.0" "first after-flag" "$(curl -s --http1.0 "$G/chat/stream" | tr '\n' ' ' | sed 's/ $//')"
expect "and chunked for HTTP/1.1" "chunked" "$(curl -s -o /dev/null -D - "$G/chat/stream" | tr -d '\r' | awk -F': ' 'tolower($1)=="transfer-encoding" {print $2}')"

# ---- the limit, the queue, 429 with Retry-After ----
python3 - "$GW" "$A" >"$tmp/burst" <<'PY'
import http.client, sys, threading, time, urllib.request
port, api = int(sys.argv[1]), sys.argv[2]; res = []
def metric(name, svc="chat"):  # one of the gateway's gauges for a service, from oversubd's /metrics
    for l in urllib.request.urlopen(api + "/metrics").read().decode().splitlines():
        if l.startswith('oversub_gateway_%s{service="%s"} ' % (name, svc)):
            return int(float(l.split()[1]))
    return 0
def until(cond, what):  # the event, or the script's failure after a deadline
    t0 = time.time()
    while not cond():
        if time.time() - t0 > 30:
            sys.exit("gave up waiting for " + what)
        time.sleep(0.02)
def one(tag):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.request("GET", "/chat/slow?ms=800&tag=" + tag)
    r = c.getresponse(); body = r.read()
    res.append((tag, r.status, r.getheader("Retry-After"), body))
ts = []
for i in range(4):
    t = threading.Thread(target=one, args=("b%d" % i,)); t.start(); ts.append(t)
    # the next one once the gateway has this one: in flight, queued, or answered (refused)
    until(lambda: metric("inflight") + metric("queued") + len(res) > i, "b%d at the gateway" % i)
for t in ts: t.join()
codes = sorted(s for _, s, _, _ in res)
print("codes", " ".join(map(str, codes)))
for tag, st, ra, body in res:
    if st == 429:
        print("retry_after", ra)
        print("reason", __import__("json").loads(body)["error"]["reason"])
PY
expect "one in flight, two queued, one refused" "codes 200 200 200 429" "$(grep codes "$tmp/burst")"
ra=$(grep retry_after "$tmp/burst" | awk '{print $2}')
[ -n "$ra" ] && [ "$ra" -ge 1 ] && ok || bad "429 without Retry-After >= 1: '$ra'"
expect "reason" "reason queue_full" "$(grep reason "$tmp/burst")"

# ---- priority order in the queue ----
python3 - "$GW" "$BPORT" "$A" >"$tmp/prio" <<'PY'
import http.client, json, sys, threading, time, urllib.request
gw, bp, api = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def metric(name, svc="chat"):  # one of the gateway's gauges for a service, from oversubd's /metrics
    for l in urllib.request.urlopen(api + "/metrics").read().decode().splitlines():
        if l.startswith('oversub_gateway_%s{service="%s"} ' % (name, svc)):
            return int(float(l.split()[1]))
    return 0
def until(cond, what):  # the event, or the script's failure after a deadline
    t0 = time.time()
    while not cond():
        if time.time() - t0 > 30:
            sys.exit("gave up waiting for " + what)
        time.sleep(0.02)
def one(tag, prio=None, ms=300):
    c = http.client.HTTPConnection("127.0.0.1", gw, timeout=20)
    h = {"X-Priority": prio} if prio else {}
    c.request("GET", "/chat/slow?ms=%d&tag=%s" % (ms, tag), headers=h)
    c.getresponse().read()
c = http.client.HTTPConnection("127.0.0.1", bp); c.request("GET", "/order"); before = len(json.loads(c.getresponse().read()))
# p-busy holds the slot while the others come (each once the gateway has the one before)
ts = [threading.Thread(target=one, args=("p-busy", None, 1500))]
ts[0].start(); until(lambda: metric("inflight") == 1, "p-busy in flight")
ts.append(threading.Thread(target=one, args=("p-low", "experiment"))); ts[1].start()
until(lambda: metric("queued") == 1, "p-low queued")
ts.append(threading.Thread(target=one, args=("p-high",))); ts[2].start()
for t in ts: t.join()
c = http.client.HTTPConnection("127.0.0.1", bp); c.request("GET", "/order")
print(" ".join(json.loads(c.getresponse().read())[before:]))
PY
expect "online before experiment in the queue" "p-busy p-high p-low" "$(cat "$tmp/prio")"

# ---- a deadline in the queue ----
python3 - "$GW" "$A" >"$tmp/dl" <<'PY'
import http.client, json, sys, threading, time, urllib.request
gw, api = int(sys.argv[1]), sys.argv[2]
def metric(name, svc="chat"):  # one of the gateway's gauges for a service, from oversubd's /metrics
    for l in urllib.request.urlopen(api + "/metrics").read().decode().splitlines():
        if l.startswith('oversub_gateway_%s{service="%s"} ' % (name, svc)):
            return int(float(l.split()[1]))
    return 0
def until(cond, what):  # the event, or the script's failure after a deadline
    t0 = time.time()
    while not cond():
        if time.time() - t0 > 30:
            sys.exit("gave up waiting for " + what)
        time.sleep(0.02)
def busy():
    c = http.client.HTTPConnection("127.0.0.1", gw, timeout=20); c.request("GET", "/chat/slow?ms=1500&tag=d-busy"); c.getresponse().read()
t = threading.Thread(target=busy); t.start(); until(lambda: metric("inflight") == 1, "d-busy in flight")
c = http.client.HTTPConnection("127.0.0.1", gw, timeout=20)
c.request("GET", "/chat/slow?ms=10&tag=d-late", headers={"X-Request-Deadline-Ms": "200"})
r = c.getresponse(); b = json.loads(r.read())
print(r.status, b["error"]["reason"], r.getheader("Retry-After"))
t.join()
PY
expect "deadline passed in the queue" "429 deadline" "$(awk '{print $1, $2}' "$tmp/dl")"

# ---- not running yet: queued, then 503 ----
expect "submit cold" 201 "$(submit "{\"id\":\"cold\",\"class\":\"batch\",\"vram\":\"2GiB\",\"backends\":[\"$B\"]}")"
st=$(curl -s -o "$tmp/cold" -w '%{http_code}' -H 'X-Request-Deadline-Ms: 200' "$G/cold/echo")
expect "loading service: 503" 503 "$st"
expect "503 reason" not_running "$(json 'd["error"]["reason"]' <"$tmp/cold")"
curl -s -X POST "$A/v1/services/cold/ready" >/dev/null
expect "ready: served" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$G/cold/echo")"

# ---- a dead backend ----
expect "submit dead" 201 "$(submit '{"id":"dead","class":"online","vram":"1GiB","backends":["http://127.0.0.1:1"]}')"
curl -s -X POST "$A/v1/services/dead/ready" >/dev/null
expect "dead backend: 502" 502 "$(curl -s -o /dev/null -w '%{http_code}' "$G/dead/x")"

# ---- broken HTTP at the entry: refused, nothing reaches a backend ----
before=$(curl -s "$B/order" | json 'len(d)')
cat >"$tmp/gwbroken.cases" <<'PY'
cases = {
    "smuggling: CL and TE": b"POST /chat/slow?tag=smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two Content-Length": b"POST /chat/slow?tag=smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "huge header": b"GET /chat/slow?tag=smuggled HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 100000 + b"\r\n\r\n",
    "garbage": b"\x16\x03\x01 not http\r\n\r\n",
}
PY
python3 "$(dirname "$0")/rawhttp.py" "$GW" "$tmp/gwbroken.cases" >"$tmp/gwbroken" 2>&1
grep -q BAD "$tmp/gwbroken" && bad "gateway broken HTTP: $(grep BAD "$tmp/gwbroken")" || ok
expect "gateway broken HTTP cases run" 4 "$(grep -c ' ok$' "$tmp/gwbroken")"
expect "nothing smuggled to the backend" "$before" "$(curl -s "$B/order" | json 'len(d)')"
expect "gateway alive" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$G/chat/echo")"

# ---- limits: each answered with its own status, nothing reaches the backend ----
python3 - "$GW" >"$tmp/limits" <<'PY'
import socket, sys
port = int(sys.argv[1])
def status(data):
    s = socket.create_connection(("127.0.0.1", port)); s.settimeout(5)
    s.sendall(data); out = b""
    try:
        while b"\r\n" not in out:
            b = s.recv(4096)
            if not b: break
            out += b
    except socket.timeout: pass
    s.close()
    return out.split(b" ")[1].decode() if out.startswith(b"HTTP/1.1 ") else "none"
print("head", status(b"GET /chat/echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"))
print("body", status(b"POST /chat/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n"))
print("uri", status(b"GET /chat/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"))
print("version", status(b"GET /chat/echo HTTP/2.0\r\nHost: x\r\n\r\n"))
print("coding", status(b"POST /chat/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"))
print("bad length", status(b"POST /chat/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 12a\r\n\r\n"))
print("folded", status(b"GET /chat/echo HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  2\r\n\r\n"))
PY
expect "431 for a head over 16 KiB" "head 431" "$(grep ^head "$tmp/limits")"
expect "413 for a body over 64 MiB" "body 413" "$(grep ^body "$tmp/limits")"
expect "414 for a long request line" "uri 414" "$(grep ^uri "$tmp/limits")"
expect "505 for HTTP/2.0 in text" "version 505" "$(grep ^version "$tmp/limits")"
expect "501 for an unknown transfer coding" "coding 501" "$(grep ^coding "$tmp/limits")"
expect "400 for a malformed Content-Length" "bad length 400" "$(grep '^bad length' "$tmp/limits")"
expect "400 for a folded header" "folded 400" "$(grep ^folded "$tmp/limits")"
# a chunked request body streams through, framed as sent
expect "chunked body" "hello world" "$(printf 'hello world' | curl -s -H 'Transfer-Encoding: chunked' --data-binary @- "$G/chat/gen" | json 'd["body"]')"

# ---- pipelined requests answered in order; HEAD without a body; a large body intact ----
python3 - "$GW" >"$tmp/pipe" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.settimeout(10)
s.sendall(b"GET /chat/echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /chat/echo?n=2 HTTP/1.1\r\nHost: x\r\n\r\n")
data = b""
while data.count(b"HTTP/1.1 200") < 2 or not data.rstrip().endswith(b"}"):
    b = s.recv(65536)
    if not b: break
    data += b
print("order", " ".join(p for p in ("n=1", "n=2") if p.encode() in data), data.find(b"n=1") < data.find(b"n=2"))
s.sendall(b"HEAD /chat/echo HTTP/1.1\r\nHost: x\r\n\r\n")
h = b""
while b"\r\n\r\n" not in h:
    h += s.recv(65536)
s.settimeout(0.5)
try: extra = s.recv(65536)
except socket.timeout: extra = b""
print("head", h.split(b"\r\n")[0].decode(), len(h.split(b"\r\n\r\n", 1)[1]) + len(extra))
PY
expect "pipelined, in order" "order n=1 n=2 True" "$(grep ^order "$tmp/pipe")"
expect "HEAD has no body" "head HTTP/1.1 200 OK 0" "$(grep ^head "$tmp/pipe")"
head -c 3000000 /dev/urandom | base64 -w0 >"$tmp/big"
expect "a 4 MB body intact" "$(wc -c <"$tmp/big")" "$(curl -s --data-binary @"$tmp/big" "$G/chat/gen" | json 'len(d["body"])')"

# ---- answered before its body is in: the client reads the whole answer, then the end (not a
# reset); the body's rest is read and dropped. The backend reads none of it, so the client's
# bytes wait unread in the gateway's socket as the answer ends ----
python3 - "$GW" >"$tmp/early" <<'PY'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /chat/early HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n")
s.setblocking(False)
sent, chunk = 0, b"b" * 65536
try:
    while sent < 16 << 20:
        sent += s.send(chunk)
except BlockingIOError:
    pass
time.sleep(1)  # the answer ends meanwhile, before this client reads any of it
s.setblocking(True); s.settimeout(10)
data, end = b"", "eof"
try:
    while True:
        b = s.recv(65536)
        if not b: break
        data += b
except ConnectionResetError: end = "reset"
except socket.timeout: end = "timeout"
head, _, body = data.partition(b"\r\n\r\n")
print("early", len(body), b"Connection: close" in head, end)
PY
expect "an early answer read whole, then the end" "early 300000 True eof" "$(cat "$tmp/early")"

# ---- 600 mutated requests: each answered with a status line or closed; the gateway lives ----
python3 "$here/fuzz_http.py" "$GW" /chat 600 7 >"$tmp/fuzz" 2>&1
echo "gateway fuzz: $(cat "$tmp/fuzz")"
expect "fuzz: every answer an HTTP/1.1 status line" 0 "$(json 'd["results"]["bad"]' <"$tmp/fuzz")"
expect "fuzz: some valid, some refused" True "$(json 'd["results"]["2xx"] > 0 and d["results"]["4xx"] > 0' <"$tmp/fuzz")"
expect "gateway alive after the fuzz" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$G/chat/echo")"
# ---- a client that leaves is cancelled: its backend connection closed, its slot freed at once,
# its queued request out of the queue (an SDK that gives up closes its socket) ----
metric() { curl -s "$A/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
wait_metric() { # name value seconds: waits for the event, at most that long
    for _ in $(seq 1 $(($3 * 10))); do [ "$(metric "$1")" = "$2" ] && return 0; sleep 0.1; done
    return 1
}
gone0=$(metric 'oversub_gateway_requests_total{service="chat",outcome="client_gone"}')
# the clients close when the test says so (a file appears): each step waits for its event
python3 - "$GW" "$tmp/go1" <<'PY' &
import os, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /chat/slow?ms=20000&tag=abandoned HTTP/1.1\r\nHost: x\r\n\r\n")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
s.close()
PY
CLP=$!
wait_metric 'oversub_gateway_inflight{service="chat"}' 1 10 || bad "the slow request did not start"
touch "$tmp/go1"
wait_metric 'oversub_gateway_requests_total{service="chat",outcome="client_gone"}' $((gone0 + 1)) 10 || bad "the abandoned request was not counted as client_gone"
wait "$CLP"
expect "the abandoned request's slot is free (20 s before the backend would finish)" 0 "$(metric 'oversub_gateway_inflight{service="chat"}')"
expect "the next request served at once" 200 "$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$G/chat/echo")"
# a queued client that leaves: out of the queue
python3 - "$GW" "$tmp/go2" "$tmp/go3" <<'PY' &
import os, socket, sys, time
def until(f):
    while not os.path.exists(f):
        time.sleep(0.05)
hold = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
hold.sendall(b"GET /chat/slow?ms=20000&tag=holder HTTP/1.1\r\nHost: x\r\n\r\n")
q = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
until(sys.argv[2])
q.sendall(b"GET /chat/echo HTTP/1.1\r\nHost: x\r\n\r\n")
until(sys.argv[3])
q.close()
until(sys.argv[3] + "b")
hold.close()
PY
QP=$!
wait_metric 'oversub_gateway_inflight{service="chat"}' 1 10 || bad "the holder did not start"
touch "$tmp/go2"
wait_metric 'oversub_gateway_queued{service="chat"}' 1 10 || bad "the second request was not queued"
touch "$tmp/go3"
wait_metric 'oversub_gateway_queued{service="chat"}' 0 10 || bad "the queued request whose client left stayed queued"
expect "  while the holder still runs" 1 "$(metric 'oversub_gateway_inflight{service="chat"}')"
touch "$tmp/go3b"
wait "$QP"
wait_metric 'oversub_gateway_inflight{service="chat"}' 0 10 || bad "the holder's slot was not freed when it left"
expect "both counted as client_gone" $((gone0 + 3)) "$(metric 'oversub_gateway_requests_total{service="chat",outcome="client_gone"}')"

# ---- slow clients: one address holds at most its share; a head must arrive within 10 s ----
python3 - "$GW" >"$tmp/slow" <<'PY'
import socket, sys, time, http.client
port = int(sys.argv[1])
slow = []
for i in range(300):
    s = socket.socket(); s.bind(("127.0.0.2", 0)); s.connect(("127.0.0.1", port))
    try:
        s.sendall(b"GET /chat/echo HTTP/1.1\r\nHost: x\r\n")   # never finished
    except OSError:
        pass   # refused already: counted below
    slow.append(s)
t0 = time.time()
# another client, served meanwhile: its connection came after the 300, which the gateway took
# (in the order they came) before it, closing those past the share at once
c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
c.request("GET", "/chat/echo"); other = c.getresponse().status
closed = 0
for s in slow:
    s.setblocking(False)
    try:
        if s.recv(1) == b"": closed += 1
    except BlockingIOError: pass
    except ConnectionResetError: closed += 1
print("refused", closed)
print("other", other)
s = slow[0]; s.setblocking(True); s.settimeout(15)
data = b""
try:
    while True:
        b = s.recv(4096)
        if not b: break
        data += b
except Exception: pass
print("timeout", data.split(b"\r\n")[0].decode(), round(time.time() - t0))
PY
expect "beyond its share of 256 connections, refused" "refused 44" "$(grep ^refused "$tmp/slow")"
expect "another client served meanwhile" "other 200" "$(grep ^other "$tmp/slow")"
expect "an unfinished head gets 408 after 10 s" "HTTP/1.1 408 Request Timeout" "$(grep ^timeout "$tmp/slow" | cut -d' ' -f2-5)"

# ---- the share is configurable ----
# with gateway_defer_accept: false, connections that send nothing are counted as they connect;
# by default the kernel hands a connection over once its first bytes are in, so there each of
# the three sends the start of a head (SEND)
printf 'gateway_conns_per_client: 2\ngateway_defer_accept: false\n' >"$tmp/share.yaml"
printf 'gateway_conns_per_client: 2\n' >"$tmp/share2.yaml"
"$bin" --config "$tmp/share.yaml" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" \
    --state "$tmp/share.db" >"$tmp/out6" 2>"$tmp/err6" &
pids+=($!)
GW6=$(waitline "$tmp/out6" "gateway on http://127.0.0.1:") || bad "share daemon: $(cat "$tmp/err6")"
"$bin" --config "$tmp/share2.yaml" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" \
    --state "$tmp/share2.db" >"$tmp/out6b" 2>"$tmp/err6b" &
pids+=($!)
GW6B=$(waitline "$tmp/out6b" "gateway on http://127.0.0.1:") || bad "share daemon 2: $(cat "$tmp/err6b")"
share_probe() { # PORT SEND
python3 - "$1" "$2" <<'PY'
import http.client, socket, sys
port = int(sys.argv[1]); ss = []
for i in range(3):
    s = socket.socket(); s.bind(("127.0.0.3", 0)); s.connect(("127.0.0.1", port)); ss.append(s)
    if sys.argv[2] == "1":
        s.sendall(b"G")
# a request from another address, answered: the gateway took the three before it (in order)
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
c.request("GET", "/-/healthz"); c.getresponse().read()
closed = []
for s in ss:
    s.setblocking(False)
    try: closed.append(s.recv(1) == b"")
    except BlockingIOError: closed.append(False)
    except ConnectionResetError: closed.append(True) # closed with its byte unread: a reset
print(" ".join("closed" if c else "open" for c in closed))
PY
}
share_probe "$GW6" 0 >"$tmp/share"
expect "gateway_conns_per_client: 2 (accepts not deferred)" "open open closed" "$(cat "$tmp/share")"
share_probe "$GW6B" 1 >"$tmp/share2"
expect "gateway_conns_per_client: 2 (accepts deferred)" "open open closed" "$(cat "$tmp/share2")"
printf 'gateway_defer_accept: maybe\n' >"$tmp/share3.yaml"
timeout 20 "$bin" --config "$tmp/share3.yaml" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" \
    --state "$tmp/share3.db" >"$tmp/out6c" 2>"$tmp/err6c" && bad "gateway_defer_accept: maybe was taken"
expect "gateway_defer_accept: maybe refused" "1" \
    "$(grep -c "key 'gateway_defer_accept' must be true or false" "$tmp/err6c")"
printf 'metrics_per_service:\n' >"$tmp/share4.yaml"
timeout 20 "$bin" --config "$tmp/share4.yaml" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" \
    --state "$tmp/share4.db" >"$tmp/out6d" 2>"$tmp/err6d" && bad "metrics_per_service: (empty) was taken"
expect "an empty true/false key refused as one" "1" \
    "$(grep -c "key 'metrics_per_service' must be true or false" "$tmp/err6d")"

# ---- a backend slower than the service's upstream_timeout_ms: 504 ----
expect "submit tardy" 201 "$(submit "{\"id\":\"tardy\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"upstream_timeout_ms\":300}")"
curl -s -X POST "$A/v1/services/tardy/ready" >/dev/null
expect "backend timeout: 504" 504 "$(curl -s -o "$tmp/tardy" -w '%{http_code}' "$G/tardy/slow?ms=1500&tag=tardy")"
expect "504 reason" timeout "$(json 'd["error"]["reason"]' <"$tmp/tardy")"
expect "timeout out of range" 422 "$(submit "{\"id\":\"t2\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"upstream_timeout_ms\":5}")"

# ---- a kept-alive backend connection closed as it is reused: a GET goes again, not a 502 ----
python3 - >"$tmp/oneshot.out" 2>&1 <<'PY' &
import socket, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(16)
print("port", srv.getsockname()[1], flush=True)
def conn(c):
    data = b""
    while b"\r\n\r\n" not in data:            # the first request: answered, kept alive
        b = c.recv(4096)
        if not b: return
        data += b
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    c.recv(4096)                                  # the second: closed without an answer
    c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=conn, args=(c,), daemon=True).start()
PY
pids+=($!)
OSP=$(waitline "$tmp/oneshot.out" "port ")
expect "submit oneshot" 201 "$(submit "{\"id\":\"oneshot\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"http://127.0.0.1:$OSP\"],\"max_inflight\":1}")"
curl -s -X POST "$A/v1/services/oneshot/ready" >/dev/null
codes=""
for i in 1 2 3; do codes="$codes $(curl -s -o /dev/null -w '%{http_code}' "$G/oneshot/x")"; done
expect "reused connection closed: sent again" " 200 200 200" "$codes"
expect "a POST is not sent twice" 502 "$(curl -s -o /dev/null -w '%{http_code}' -X POST -d 'x=1' "$G/oneshot/x")"

# ---- a failing backend leaves the rotation ----
expect "submit two" 201 "$(submit "{\"id\":\"two\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"http://127.0.0.1:1\",\"$B\"]}")"
curl -s -X POST "$A/v1/services/two/ready" >/dev/null
codes=""
for i in 1 2 3 4 5 6; do codes="$codes $(curl -s -o /dev/null -w '%{http_code}' "$G/two/echo")"; done
expect "one 502, then the live backend only" " 502 200 200 200 200 200" "$codes"

# ---- metrics ----
curl -s "$A/metrics" >"$tmp/metrics"
grep -Eq '^oversub_gateway_requests_total\{service="chat",outcome="queue_full"\} [1-9]' "$tmp/metrics" && ok || bad "gateway metrics: $(grep gateway "$tmp/metrics" | head -5)"
grep -q '^oversub_gateway_refused_total{why="client_share"} 44$' "$tmp/metrics" && ok || bad "client share metric: $(grep refused_total "$tmp/metrics")"
grep -Eq '^oversub_gateway_refused_total\{why="bad_request"\} [1-9]' "$tmp/metrics" && ok || bad "bad request metric: $(grep refused_total "$tmp/metrics")"
# the queue-wait histogram saw the queued requests wait (some over 0.25 s), upstream the slow ones
python3 - "$tmp/metrics" >"$tmp/hist" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
def get(name, le):
    m = re.search(r'^%s_bucket\{service="chat",le="%s"\} (\d+)' % (name, re.escape(le)), t, re.M)
    return int(m.group(1)) if m else -1
qw_all, qw_fast = get("oversub_gateway_queue_wait_seconds", "+Inf"), get("oversub_gateway_queue_wait_seconds", "0.25")
up_all, up_fast = get("oversub_gateway_upstream_seconds", "+Inf"), get("oversub_gateway_upstream_seconds", "0.25")
print(qw_all > 0 and qw_fast < qw_all and up_all > 0 and up_fast < up_all)
PY
expect "histograms" True "$(cat "$tmp/hist")"
if command -v promtool >/dev/null; then
    promtool check metrics <"$tmp/metrics" >"$tmp/pt" 2>&1 && ok || bad "promtool: $(cat "$tmp/pt")"
fi
expect "control API alive" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$A/healthz")"

# ---- the serving engine's saturation (issue 26): its queue moves into ours ----
m() { curl -s "$A/metrics" | awk -v k="$1" '$1 == k {print $2}'; }
expect "submit eng with its metrics_url" 201 "$(submit "{\"id\":\"eng\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"max_inflight\":8,\"max_queue\":50,\"queue_timeout_ms\":30000,\"metrics_url\":\"$B/metrics\"}")"
expect "metrics_url must be a URL" 422 "$(submit '{"id":"eng2","class":"online","vram":"1GiB","backends":["http://127.0.0.1:9"],"metrics_url":"nope"}')"
expect "nor oversubd's own" 422 "$(submit "{\"id\":\"eng2\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"metrics_url\":\"$A/metrics\"}")"
curl -s -o /dev/null -X POST "$A/v1/services/eng/ready"
curl -s -o /dev/null "$G/eng/echo" # the gateway knows the service from its first request
curl -s -o /dev/null "$B/set-engine?waiting=5&running=2&kv=0.5"
lim2() { [ "$(m 'oversub_gateway_engine_limit{service="eng"}')" = 2 ]; }
wait_for 20 lim2 || bad "the engine queues: at most what it runs (2) go to it: $(curl -s "$A/metrics" | grep 'engine.*eng')"
ecurls=()
for i in 1 2 3 4 5 6; do
    curl -s -o /dev/null "$G/eng/slow?ms=4000&tag=e$i" &
    ecurls+=($!)
done
queued() { [ "$(m 'oversub_gateway_queued{service="eng"}')" -ge 4 ] 2>/dev/null; }
wait_for 20 queued || bad "the rest wait in oversub's queue: queued $(m 'oversub_gateway_queued{service="eng"}')"
expect "two in flight to the engine, not six" 2 "$(m 'oversub_gateway_inflight{service="eng"}')"
curl -s -o /dev/null "$B/set-engine?waiting=0&running=2&kv=0.2"
unlimited() { [ "$(m 'oversub_gateway_engine_limit{service="eng"}')" = 0 ]; }
wait_for 30 unlimited || bad "drained: the limit goes back up: $(m 'oversub_gateway_engine_limit{service="eng"}')"
wait "${ecurls[@]}"
expect "every request served" 0 "$(m 'oversub_gateway_queued{service="eng"}')"
expect "the engine's figures shown" 0.2 "$(m 'oversub_gateway_engine_kv_usage{service="eng"}')"
curl -s -o /dev/null "$B/set-engine?waiting=0&running=0&kv=0"
curl -s -o /dev/null -X DELETE "$A/v1/services/eng"

# ---- a slow request body holds no slot (issue 23: two trickled bodies held both); bodies past
# the read-ahead hold at most half the slots (an attack review: two stalled 2 MB bodies did) ----
expect "submit trickle (2 slots, a short queue)" 201 "$(submit "{\"id\":\"trickle\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"max_inflight\":2,\"max_queue\":2}")"
curl -s -o /dev/null -X POST "$A/v1/services/trickle/ready"
python3 - "$GW" >"$tmp/trickle.out" 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
held = []
for kind in ("length", "chunked", "big", "big"):
    s = socket.create_connection(("127.0.0.1", port))
    if kind == "length":
        s.sendall(b"POST /trickle/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
    elif kind == "chunked":
        s.sendall(b"POST /trickle/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n186a0\r\n{")
    else:  # past the 1 MiB read-ahead at once, then nothing: at most half the slots stream
        s.sendall(b"POST /trickle/x HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n" + b"a" * 1200000)
    held.append(s)
print("holding", flush=True)
time.sleep(120)  # killed by the test once it has checked
PY
TRK=$!
pids+=($TRK)
for _ in $(seq 1 200); do grep -q holding "$tmp/trickle.out" && break; sleep 0.05; done # the heads and a byte each are sent
trickling() { [ "$(grep -c holding "$tmp/trickle.out")" = 1 ]; }
trickling || bad "the trickling client ran: $(cat "$tmp/trickle.out")"
trk_inflight() { curl -s "$A/metrics" | awk '$1 == "oversub_gateway_inflight{service=\"trickle\"}" {print $2}'; }
one_streams() { [ "$(trk_inflight)" = 1 ]; }
wait_for 20 one_streams || bad "one stalled big body streams (in flight): $(trk_inflight)"
for i in 1 2 3; do
    expect "request $i beside two trickled bodies is served" 200 "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$G/trickle/x" -d '{"a":1}')"
done
expect "of two slots, one streams a stalled big body, the other serves" 1 "$(curl -s "$A/metrics" | awk '$1 == "oversub_gateway_inflight{service=\"trickle\"}" {print $2}')"
kill $TRK 2>/dev/null
# a body that comes at once is one request; one past the read-ahead streams as before
expect "a 3 MB body streams through" 200 "$(head -c 3000000 /dev/zero | tr '\0' a | curl -s -o /dev/null -w '%{http_code}' -X POST "$G/trickle/x" --data-binary @-)"
expect "a chunked body through" 200 "$(printf '{"b":2}' | curl -s -o /dev/null -w '%{http_code}' -H 'Transfer-Encoding: chunked' -X POST "$G/trickle/x" --data-binary @-)"
curl -s -o /dev/null -X DELETE "$A/v1/services/trickle"

# ---- a route that changes takes its pooled connections with it (issue 23) ----
python3 "$here/backend.py" >"$tmp/backend2.out" 2>&1 &
pids+=($!)
B2PORT=$(waitline "$tmp/backend2.out" "port ") || bad "second backend did not start"
B2="http://127.0.0.1:$B2PORT"
at() { curl -s "$G/mv/echo" ${1:+-H "Authorization: Bearer $1"} | json 'd["port"]'; }
expect "submit mv on backend 1" 201 "$(submit "{\"id\":\"mv\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"]}")"
curl -s -o /dev/null -X POST "$A/v1/services/mv/ready"
expect "mv answers from backend 1" "$BPORT" "$(at)"
expect "and again (its connection pooled)" "$BPORT" "$(at)"
expect "backends moved to 2" 200 "$(curl -s -o /dev/null -w '%{http_code}' -X PUT "$A/v1/services/mv/backends" -d "{\"backends\":[\"$B2\"]}")"
expect "after PUT backends: backend 2" "$B2PORT" "$(at)"
expect "and only backend 2" "$B2PORT" "$(at)"
curl -s -o /dev/null -X DELETE "$A/v1/services/mv"
expect "the same id by another owner, on backend 1" 201 "$(submit "{\"id\":\"mv\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"]}")"
curl -s -o /dev/null -X POST "$A/v1/services/mv/ready"
expect "its requests (and its Authorization) reach its backend, never the old one" "$BPORT" "$(at secret-of-the-new-owner)"
curl -s -o /dev/null -X DELETE "$A/v1/services/mv"
freed() { ! curl -s "$A/metrics" | grep -q 'oversub_gateway_inflight{service="mv"}'; }
wait_for 20 freed || bad "the gateway's state of a released service is freed: $(curl -s "$A/metrics" | grep 'service="mv"' | head -3)"

# ---- the gateway never forwards to oversubd's own API or gateway (issue 23) ----
for own in "$A" "http://localhost:$PORT" "http://0.0.0.0:$PORT" "$G" "http://[::ffff:127.0.0.1]:$PORT"; do
    expect "a backend at $own refused" 422 "$(submit "{\"id\":\"loop\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$own\"]}")"
done
grep -q "is oversubd's own control API: the gateway never forwards to oversubd" "$tmp/sub" || grep -q "is oversubd's own" "$tmp/sub" || bad "the refusal says why: $(cat "$tmp/sub")"
expect "submit loop on a real backend" 201 "$(submit "{\"id\":\"loop\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"]}")"
expect "PUT backends to the API refused" 422 "$(curl -s -o "$tmp/put" -w '%{http_code}' -X PUT "$A/v1/services/loop/backends" -d "{\"backends\":[\"$A\"]}")"
grep -q "oversubd's own control API" "$tmp/put" || bad "the PUT refusal names the API: $(cat "$tmp/put")"
curl -s -o /dev/null -X DELETE "$A/v1/services/loop"
# a name (allowed by name) that resolves to the API: refused when the gateway connects
if [ -n "$SELFNAME" ]; then
    expect "submit byname (a name: resolved later)" 201 "$(submit "{\"id\":\"byname\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"http://$SELFNAME:$PORT\"]}")"
    curl -s -o /dev/null -X POST "$A/v1/services/byname/ready"
    ratio0=$(curl -s "$A/v1/pool" | json 'd["ratio"]')
    expect "through the gateway to the API by name: 502" 502 "$(curl -s -o "$tmp/bn" -w '%{http_code}' -X PUT "$G/byname/v1/pool" -H 'Content-Type: application/json' -d '{"ratio":"3.0"}')"
    expect "said why" backend_forbidden "$(json 'd["error"]["code"]' <"$tmp/bn")"
    expect "the ratio unchanged" "$ratio0" "$(curl -s "$A/v1/pool" | json 'd["ratio"]')"
    curl -s -o /dev/null -X DELETE "$A/v1/services/byname"
else
    echo "the host's name does not resolve to loopback: the by-name check is skipped"
fi

# ---- the routes survive a restart ----
kill -TERM "${pids[1]}"; wait "${pids[1]}" 2>/dev/null
"$bin" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" --state "$tmp/state.db" \
    --tick-ms 100 >"$tmp/out2" 2>"$tmp/err2" &
pids+=($!)
GW=$(waitline "$tmp/out2" "gateway on http://127.0.0.1:") || { bad "restart: $(cat "$tmp/err2")"; }
expect "route after restart" "/echo" "$(curl -s "http://127.0.0.1:$GW/chat/echo" | json 'd["path"]')"

# ---- shedding on one GPU: experiment first, then batch, never online ----
"$bin" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" --state "$tmp/shed.db" \
    --gpus sim:1x81920 --ratio 1.5 --tick-ms 100 >"$tmp/out3" 2>"$tmp/err3" &
pids+=($!)
PORT=$(waitline "$tmp/out3" "listening on http://127.0.0.1:") || bad "shed daemon: $(cat "$tmp/err3")"
GW=$(waitline "$tmp/out3" "gateway on http://127.0.0.1:") || bad "shed daemon gateway"
A="http://127.0.0.1:$PORT"
G="http://127.0.0.1:$GW"
for sv in o:online x:experiment b:batch; do
    id=${sv%%:*}
    expect "submit $id" 201 "$(submit "{\"id\":\"$id\",\"class\":\"${sv#*:}\",\"vram\":\"20GiB\",\"min_vram\":\"20GiB\",\"backends\":[\"$B\"]}")"
    curl -s -X POST "$A/v1/services/$id/ready" >/dev/null
done
st() { curl -s -o /dev/null -w '%{http_code}' "$G/$1/echo"; }
expect "no pressure: all served" "200 200 200" "$(st o) $(st b) $(st x)"
use() { curl -s -o /dev/null -X PUT "$A/v1/services/$1/usage" -d "{\"vram_mib\":$2}"; }
# 78000 of 81920 held: above the 95% high watermark, below halfway to full
use o 30000; use b 25000; use x 23000
expect "above the watermark: experiment shed" "200 200 429" "$(st o) $(st b) $(st x)"
curl -s "$G/x/echo" | json 'd["error"]["reason"]' >"$tmp/shed.reason"
expect "shed reason" shed "$(cat "$tmp/shed.reason")"
# 81000: past halfway to full: batch shed too, online still served
use o 33000
expect "near full: batch shed too, online served" "200 429 429" "$(st o) $(st b) $(st x)"
expect "an online client asking for experiment priority is shed" 429 "$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Priority: experiment' "$G/o/echo")"
use o 10000
expect "pressure gone: all served" "200 200 200" "$(st o) $(st b) $(st x)"
curl -s "$A/metrics" | grep -q 'oversub_gateway_requests_total{service="x",outcome="shed"} [1-9]' && ok || bad "shed not counted"

# ---- a degrade shrinks the limit live (to min_batch_size) ----
"$bin" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" --state "$tmp/deg.db" \
    --gpus sim:1x81920 --ratio 1.5 --tick-ms 100 >"$tmp/out4" 2>"$tmp/err4" &
pids+=($!)
PORT=$(waitline "$tmp/out4" "listening on http://127.0.0.1:") || bad "degrade daemon: $(cat "$tmp/err4")"
GW=$(waitline "$tmp/out4" "gateway on http://127.0.0.1:") || bad "degrade daemon gateway"
A="http://127.0.0.1:$PORT"
expect "submit d1" 201 "$(submit "{\"id\":\"d1\",\"class\":\"batch\",\"vram\":\"40GiB\",\"min_vram\":\"20GiB\",\"batch_size\":8,\"min_batch_size\":2,\"backends\":[\"$B\"],\"max_inflight\":4,\"max_queue\":0}")"
curl -s -X POST "$A/v1/services/d1/ready" >/dev/null
curl -s -o /dev/null -X PUT "$A/v1/services/d1/usage" -d '{"vram_mib":40960}'
burst() { # N concurrent slow requests: the sorted status codes
    python3 - "$GW" "$1" "$A" <<'PY'
import http.client, sys, threading, time, urllib.request
gw, n, api = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]; res = []
def metric(name, svc="chat"):  # one of the gateway's gauges for a service, from oversubd's /metrics
    for l in urllib.request.urlopen(api + "/metrics").read().decode().splitlines():
        if l.startswith('oversub_gateway_%s{service="%s"} ' % (name, svc)):
            return int(float(l.split()[1]))
    return 0
def until(cond, what):  # the event, or the script's failure after a deadline
    t0 = time.time()
    while not cond():
        if time.time() - t0 > 30:
            sys.exit("gave up waiting for " + what)
        time.sleep(0.02)
def one(i):
    c = http.client.HTTPConnection("127.0.0.1", gw, timeout=20)
    c.request("GET", "/d1/slow?ms=600&tag=deg%d" % i); r = c.getresponse(); r.read(); res.append(r.status)
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for i, t in enumerate(ts):
    t.start()  # the next once the gateway has this one: in flight or answered (refused)
    until(lambda: metric("inflight", "d1") + len(res) > i, "deg%d at the gateway" % i)
for t in ts: t.join()
print(" ".join(map(str, sorted(res))))
PY
}
expect "running: 4 at once" "200 200 200 200" "$(burst 4)"
expect "running: the 5th refused" "200 200 200 200 429" "$(burst 5)"
expect "an online service needs the room" 202 "$(submit '{"id":"big","class":"online","vram":"45GiB"}')"
expect "d1 degraded" degraded "$(curl -s "$A/v1/services/d1" | json 'd["state"]')"
# d1 shrinks (its usage report acknowledges): the GPU is back under the watermark, nothing shed
curl -s -o /dev/null -X PUT "$A/v1/services/d1/usage" -d '{"vram_mib":20480}'
expect "degraded: 2 at once (min_batch_size)" "200 200 429" "$(burst 3)"

# ---- the Azure LLM trace at 3x capacity: online never refused, the others shed with 429 ----
trace=$(cd "$here/../.." && pwd)/../shared/traces/azure_llm_conv_2023.csv
if [ -f "$trace" ]; then
    "$bin" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" --state "$tmp/az.db" \
        --gpus sim:8x81920 --ratio 1.5 --tick-ms 100 >"$tmp/out5" 2>"$tmp/err5" &
    pids+=($!)
    PORT=$(waitline "$tmp/out5" "listening on http://127.0.0.1:") || bad "azure daemon: $(cat "$tmp/err5")"
    GW=$(waitline "$tmp/out5" "gateway on http://127.0.0.1:") || bad "azure daemon gateway"
    A="http://127.0.0.1:$PORT"
    # the example LLM server (examples/fake-llm-server) answers each request after its output
    # tokens x 2 ms; it batches up to 64, so the gateway's limits are the only ones
    LP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    OVERSUB_BATCH_SIZE=64 "$ex/fake-llm-server" --port "$LP" --load-ms 0 --token-ms 2 >"$tmp/llm.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 50); do curl -s -o /dev/null "http://127.0.0.1:$LP/x?tokens=0" && break; sleep 0.1; done
    for sv in on:online:16 ba:batch:2 ex:experiment:2; do
        IFS=: read -r id cls lim <<<"$sv"
        submit "{\"id\":\"$id\",\"class\":\"$cls\",\"vram\":\"10GiB\",\"backends\":[\"http://127.0.0.1:$LP\"],\"max_inflight\":$lim,\"max_queue\":$((2 * lim)),\"queue_timeout_ms\":3000}" >/dev/null
        curl -s -o /dev/null -X POST "$A/v1/services/$id/ready"
    done
    python3 "$here/replay_azure.py" "$trace" "$GW" 600 16 2 2 >"$tmp/az" 2>"$tmp/az.err"
    echo "azure replay: $(cat "$tmp/az")"
    expect "offered about 3x capacity" True "$(json '2.5 <= d["offered_over_capacity"] <= 3.5 and d["online_over_online_capacity"] < 0.8' <"$tmp/az")"
    expect "no online request refused" "0 0" "$(json 'str(d["results"]["online"]["429"]) + " " + str(d["results"]["online"]["other"])' <"$tmp/az")"
    expect "lower classes admitted and refused" True "$(json 'all(d["results"][c]["2xx"] > 0 and d["results"][c]["429"] > 0 for c in ("batch", "experiment"))' <"$tmp/az")"
    expect "every rejection a 429 with Retry-After" True "$(json 'd["retry_after_ok"] and all(d["results"][c]["other"] == 0 for c in d["results"])' <"$tmp/az")"
else
    echo "azure replay skipped: $trace is missing"
fi

echo "test_gateway: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
