#!/usr/bin/env bash
# test_frontdoor.sh - the gateway as an LLM front door, through the real oversubd on loopback:
# limits that fit real servers, the OpenAI error shape, 413 before the body (the client reads
# it, no reset), Retry-After spread by jitter, the access log, /-/healthz, SIGHUP that reloads
# the admin token and never stops the daemon, and SIGTERM that lets a stream in flight finish.
# Usage: test_frontdoor.sh PATH/TO/oversubd
set -u
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

FLAG=$tmp/flag python3 "$here/backend.py" >"$tmp/backend.out" 2>&1 &
pids+=($!)
BPORT=$(waitline "$tmp/backend.out" "port ") || { echo "backend did not start"; exit 1; }
B="http://127.0.0.1:$BPORT"
echo "first-token" >"$tmp/token"; chmod 600 "$tmp/token"
cat >"$tmp/oversub.yaml" <<EOF
gateway_access_log: $tmp/access.log
shutdown_grace_ms: 20000
token_file: $tmp/token
EOF
"$bin" --config "$tmp/oversub.yaml" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" \
    --state "$tmp/state.db" --gpus sim:2x81920 --ratio 1.5 --tick-ms 100 >"$tmp/out" 2>"$tmp/err" &
DPID=$!
pids+=($DPID)
PORT=$(waitline "$tmp/out" "listening on http://127.0.0.1:") || { echo "oversubd did not start: $(cat "$tmp/err")"; exit 1; }
GW=$(waitline "$tmp/out" "gateway on http://127.0.0.1:") || { echo "no gateway line"; exit 1; }
A="http://127.0.0.1:$PORT"
G="http://127.0.0.1:$GW"
TOK="first-token"
api() { curl -s -o "$tmp/body" -w '%{http_code}' -H "Authorization: Bearer $TOK" "$@"; }

# ---- a head made of empty lines only: the head's clock runs (408), it does not idle (background) ----
python3 - "$GW" >"$tmp/emptylines" <<'PY' &
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
t0 = time.time()
out = b""
s.settimeout(1)
while time.time() - t0 < 20:
    try:
        s.sendall(b"\r\n")
        b = s.recv(4096)
        if not b:
            break
        out += b
    except socket.timeout:
        continue
    except OSError:
        break
print(out.split(b"\r\n")[0].decode() or "nothing", round(time.time() - t0) < 16)
PY
EMPTY=$!

# ---- limits that fit real servers: up to 4096 in flight, queues to 100,000 ----
expect "max_inflight 4096" 201 "$(api -X POST "$A/v1/services" -d "{\"id\":\"big\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"max_inflight\":4096,\"max_queue\":100000}")"
expect "max_inflight 4097 refused" 422 "$(api -X POST "$A/v1/services" -d "{\"id\":\"big2\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"max_inflight\":4097}")"
expect "chat" 201 "$(api -X POST "$A/v1/services" -d "{\"id\":\"chat\",\"class\":\"online\",\"vram\":\"10GiB\",\"backends\":[\"$B\"],\"max_inflight\":1,\"max_queue\":0}")"
api -X POST "$A/v1/services/chat/ready" >/dev/null
api -X POST "$A/v1/services/big/ready" >/dev/null

# ---- health, and errors in OpenAI's shape ----
expect "/-/healthz" '200 {"status":"ok"}' "$(curl -s -w '%{http_code} ' -o "$tmp/h" "$G/-/healthz"; cat "$tmp/h")"
expect "unknown service: 404" 404 "$(curl -s -o "$tmp/e" -w '%{http_code}' "$G/nobody/v1/chat/completions")"
expect "  OpenAI's error shape" "invalid_request_error unknown_service True" "$(json 'd["error"]["type"] + " " + d["error"]["code"] + " " + str(len(d["error"]["message"]) > 0 and "param" in d["error"])' <"$tmp/e")"

# ---- framing at the gateway (each of these passed or hung before the codec) ----
python3 - "$GW" "$B" >"$tmp/framing" <<'PY'
import json, socket, sys, time, urllib.request
gw = int(sys.argv[1])
def talk(data, wait=3.0):
    s = socket.create_connection(("127.0.0.1", gw))
    s.sendall(data)
    s.settimeout(wait)
    out, t0 = b"", time.time()
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        out += b"<open>"
    s.close()
    return out, time.time() - t0
def first(out):
    return out.split(b"\r\n")[0].decode(errors="replace")
# a bare-LF request pipelined before a CRLF one: two requests, two answers
out, _ = talk(b"GET /chat/echo HTTP/1.1\nHost: x\n\nGET /chat/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
print("pipelined", out.count(b"HTTP/1.1 200"))
# a bare CR inside a field value: refused, never two fields at the backend
out, _ = talk(b"GET /chat/echo HTTP/1.1\r\nHost: x\r\nX-A: a\rX-Injected: yes\r\n\r\n")
print("bare-cr", first(out), b"X-Injected" in out)
out, _ = talk(b"GET /chat/echo HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n")
print("nul", first(out))
# a chunk size of 18 f's: closed at once, not a slot held for 60 s
out, dt = talk(b"POST /chat/gen HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n")
print("huge-chunk", b"<open>" not in out and dt < 2.5)
# an empty chunk-size line is not the last chunk: closed
out, dt = talk(b"POST /chat/gen HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\r\n0\r\n\r\n")
print("empty-size", b"HTTP/1.1 200" not in out and b"<open>" not in out)
# a trailer holding a request line: closed, the request never reaches the backend
out, dt = talk(b"POST /chat/gen HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"0\r\nGET /order?smuggled HTTP/1.1\r\n\r\n")
print("trailer", b"HTTP/1.1 200" not in out)
# a chunked body over 64 MiB: the size line alone ends it
out, dt = talk(b"POST /chat/gen HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5000000\r\n")
print("chunked-cap", b"<open>" not in out and dt < 2.5)
PY
expect "a bare-LF request, then a CRLF one: two answers" "pipelined 2" "$(grep ^pipelined "$tmp/framing")"
expect "a bare CR in a value: 400, nothing injected" "bare-cr HTTP/1.1 400 Bad Request False" "$(grep ^bare-cr "$tmp/framing")"
expect "a NUL in a value: 400" "nul HTTP/1.1 400 Bad Request" "$(grep ^nul "$tmp/framing")"
expect "a chunk size of 18 hex digits: closed at once" "huge-chunk True" "$(grep ^huge-chunk "$tmp/framing")"
expect "an empty chunk-size line: closed" "empty-size True" "$(grep ^empty-size "$tmp/framing")"
expect "a trailer holding a request line: closed" "trailer True" "$(grep ^trailer "$tmp/framing")"
expect "a chunked body over 64 MiB: closed at its size line" "chunked-cap True" "$(grep ^chunked-cap "$tmp/framing")"
expect "the smuggled request never reached the backend" False "$(curl -s "$B/order" | json '"smuggled" in str(d)')"

# ---- what a helper's attack found (each crashed or poisoned the gateway before) ----
python3 - "$GW" "$B" "$A" "$TOK" >"$tmp/attack" <<'PY'
import json, socket, sys, time, urllib.request
gw, backend, api = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def raw(data, wait=3.0):
    s = socket.create_connection(("127.0.0.1", gw))
    s.sendall(data)
    s.settimeout(wait)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        pass
    s.close()
    return out
def victim():
    r = raw(b"GET /big/echo?victim HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return b"victim" in r and b"EVIL" not in r
# a client naming Content-Length in Connection: its body must not become the next request
evil = b"GET /slow?ms=100&tag=EVIL HTTP/1.1\r\nHost: x\r\n\r\n"
print("conn-cl", raw(b"POST /big/x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n"
                     b"Connection: Content-Length\r\n\r\n" % len(evil) + evil).split(b"\r\n")[0].decode(),
      victim())
# a backend that answers before the body: the connection is not pooled with the body half sent
out = raw(b"GET /big/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
          b"GET /slow?ms=100&tag=EVIL2 HTTP/1.1\r\nX-Junk: ", wait=1.0)
print("early", victim())
# a smuggled request would be the next one on the backend connection that carried its bytes; the
# gateway's pool hands out the connection it got back last, so a request after the victims rides
# behind it and is answered after it was taken (the backend takes one connection's in order)
mark = raw(b"GET /big/slow?ms=0&tag=after-the-attacks HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
print("marker", mark.split(b"\r\n")[0].decode(), mark.endswith(b"after-the-attacks"))
order = json.load(urllib.request.urlopen(backend + "/order"))
# (a backend that does not read a GET's body may read its bytes as a request of its own: that
# is between it and the one client that sent them; no other client may get its answer)
print("smuggled", "EVIL" in order, order)
# a chunk extension bomb: closed, not a way around the body limit
out = raw(b"POST /big/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;" + b"a" * 20000 + b"\r\nz\r\n0\r\n\r\n")
print("ext-bomb", b"HTTP/1.1 200" not in out)
# a backend that resets while the client still uploads: the daemon lives
lis = socket.socket()
lis.bind(("127.0.0.1", 0))
lis.listen(64)
port = lis.getsockname()[1]
auth = {"Authorization": "Bearer " + sys.argv[4], "Content-Type": "application/json"}
req = urllib.request.Request(api + "/v1/services", data=json.dumps({"id": "rst", "class": "online", "vram": "1GiB", "backends": ["http://127.0.0.1:%d" % port], "max_inflight": 8}).encode(), method="POST", headers=auth)
urllib.request.urlopen(req).read()
urllib.request.urlopen(urllib.request.Request(api + "/v1/services/rst/ready", data=b"", method="POST", headers=auth)).read()
import struct
# a request takes a slot (and a backend connection) once 1 MiB of its body is in (GW_PREREAD):
# the body is larger than that, so the backend is reached while the client still uploads
pre = 1024 * 1024 + 1
accepted = 0
for i in range(40):
    c = socket.create_connection(("127.0.0.1", gw))
    c.sendall(b"POST /rst/x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % (4 * pre) + b"A" * pre)
    lis.settimeout(10)
    try:
        b, _ = lis.accept()
    except socket.timeout:
        c.close()
        continue
    accepted += 1
    b.recv(4096)
    try:
        c.send(b"B" * 65536)
    except OSError:
        pass
    b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    b.close()
    c.settimeout(2)
    try:
        c.recv(4096)
    except OSError:
        pass
    c.close()
ok = urllib.request.urlopen(api + "/healthz").status == 200
print("rst-upload", ok, accepted)
PY
expect "Connection naming Content-Length: refused or answered alone" "conn-cl True" "$(grep ^conn-cl "$tmp/attack" | awk '{print $1, $NF}')"
expect "an answer before the body: nothing poisoned" "early True" "$(grep ^early "$tmp/attack")"
expect "a request after the attacks answered (what came before it was taken)" "marker HTTP/1.1 200 OK True" "$(grep ^marker "$tmp/attack")"
expect "the Connection: Content-Length body never reached the backend as a request" "smuggled False" "$(grep ^smuggled "$tmp/attack" | awk '{print $1, $2}')"
expect "a chunk extension bomb: closed" "ext-bomb True" "$(grep ^ext-bomb "$tmp/attack")"
expect "a backend resetting during uploads: the daemon lives, each upload reached the backend" "rst-upload True 40" "$(grep ^rst-upload "$tmp/attack")"

# ---- a queued client with a big body (its reads paused) that leaves: out of the queue at once ----
expect "q1" 201 "$(api -X POST "$A/v1/services" -d "{\"id\":\"q1\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"max_inflight\":1,\"max_queue\":4,\"queue_timeout_ms\":20000}")"
api -X POST "$A/v1/services/q1/ready" >/dev/null
curl -s -m 30 "$G/q1/slow?ms=12000&tag=q1hold" >/dev/null &
QH=$!
qmetric() { curl -s "$A/metrics" | awk -v m="oversub_gateway_$1{service=\"q1\"}" '$1 == m {print $2}'; }
for _ in $(seq 1 100); do [ "$(qmetric inflight)" = 1 ] && break; sleep 0.05; done
python3 - "$GW" "$tmp/qgo" <<'PY' &
import os, socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /q1/gen HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n")
s.setblocking(False)
sent = 0
while sent < 3000000 and not os.path.exists(sys.argv[2]):
    try:
        sent += s.send(b"x" * 65536)
    except BlockingIOError:
        time.sleep(0.05)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
PY
QC=$!
for _ in $(seq 1 100); do [ "$(qmetric queued)" = 1 ] && break; sleep 0.05; done
expect "the big-bodied request waits in the queue" 1 "$(qmetric queued)"
touch "$tmp/qgo"
wait "$QC"
for _ in $(seq 1 100); do [ "$(qmetric queued)" = 0 ] && break; sleep 0.05; done
expect "  and leaves it when its client does (its holder still running)" "0 1" "$(qmetric queued) $(qmetric inflight)"
kill "$QH" 2>/dev/null; wait "$QH" 2>/dev/null

# ---- HTTP/1.0 keep-alive answers say so; a backend's 101 is not tunnelled (502) ----
python3 - "$GW" >"$tmp/ka10" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.settimeout(3)
s.sendall(b"GET /-/healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
a = s.recv(4096)
s.sendall(b"GET /nobody/x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
b = s.recv(4096)
print(b"Connection: keep-alive" in a, b"Connection: keep-alive" in b, b.split(b" ")[1].decode())
PY
expect "HTTP/1.0 keep-alive: healthz and a 404 say keep-alive" "True True 404" "$(cat "$tmp/ka10")"
expect "a backend's 101: 502" 502 "$(curl -s -o /dev/null -w '%{http_code}' "$G/big/upgrade")"

# ---- 413 before the body: the client reads the answer, not a reset ----
python3 - "$GW" >"$tmp/413" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /chat/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: 100000000\r\n\r\n")
out = b""
try:
    for _ in range(64):  # it keeps sending its body, as an SDK does
        s.sendall(b"x" * 16384)
except (BrokenPipeError, ConnectionResetError):
    pass
try:
    s.settimeout(10)
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
except (ConnectionResetError, socket.timeout) as e:
    out += b" <" + type(e).__name__.encode() + b">"
print(out.split(b"\r\n")[0].decode(), b"body_too_large" in out, b"Reset" in out)
PY
expect "413 read by a client that kept sending" "HTTP/1.1 413 Content Too Large True False" "$(cat "$tmp/413")"
# a 429 for a POST whose 3 MB body was not read: the client reads the 429, then an orderly close
curl -s "$G/chat/slow?ms=4000&tag=hold429" >/dev/null &
H429=$!
for _ in $(seq 1 100); do
    [ "$(curl -s "$A/metrics" | awk '$1 == "oversub_gateway_inflight{service=\"chat\"}" {print $2}')" = 1 ] && break
    sleep 0.05
done
python3 - "$GW" >"$tmp/429body" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /chat/gen HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n")
out = b""
try:
    for _ in range(45):
        s.sendall(b"x" * 65536)
except (BrokenPipeError, ConnectionResetError):
    pass
try:
    s.settimeout(10)
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
except (ConnectionResetError, socket.timeout) as e:
    out += b" <" + type(e).__name__.encode() + b">"
print(out.split(b"\r\n")[0].decode(), b"Reset" in out)
PY
expect "a refused POST's unread body: the 429 read, no reset" "HTTP/1.1 429 Too Many Requests False" "$(cat "$tmp/429body")"
kill "$H429" 2>/dev/null

# ---- Retry-After from the likely wait, spread by jitter ----
# the hold outlasts the 20 refusals on any machine (it is ended below, not waited for)
curl -s -m 60 "$G/chat/slow?ms=45000&tag=hold" >/dev/null &
HOLD=$!
for _ in $(seq 1 100); do
    [ "$(curl -s "$A/metrics" | awk '$1 == "oversub_gateway_inflight{service=\"chat\"}" {print $2}')" = 1 ] && break
    sleep 0.05
done
for i in $(seq 1 20); do
    curl -s -D - -o /dev/null "$G/chat/echo" | tr -d '\r' | awk -F': ' 'tolower($1) == "retry-after-ms" {print $2}'
done >"$tmp/ra"
kill "$HOLD" 2>/dev/null
# the client gone, its slot frees (the backend's answer is dropped)
for _ in $(seq 1 200); do
    [ "$(curl -s "$A/metrics" | awk '$1 == "oversub_gateway_inflight{service=\"chat\"}" {print $2}')" = 0 ] && break
    sleep 0.05
done
python3 - "$tmp/ra" >"$tmp/spread" <<'PY'
import statistics, sys
v = [int(x) for x in open(sys.argv[1]) if x.strip()]
med = statistics.median(v)
print(len(v), len(set(v)) >= 15, (max(v) - min(v)) >= 0.3 * med)
PY
expect "20 refusals, spread (not one second for all)" "20 True True" "$(cat "$tmp/spread")"

# ---- the access log: one JSON line per request ----
python3 - "$tmp/access.log" >"$tmp/acc" <<'PY'
import json, sys
ls = [json.loads(l) for l in open(sys.argv[1])]
st = {}
for l in ls:
    st[l["status"]] = st.get(l["status"], 0) + 1
full = [l for l in ls if "method" in l]
print(all({"time_unix_ms", "client", "service", "method", "path", "status", "outcome", "ms"} <= set(l) for l in full),
      st.get(429, 0) >= 20, st.get(404, 0) >= 1, st.get(400, 0) >= 1)
PY
expect "access log lines (malformed requests too)" "True True True True" "$(cat "$tmp/acc")"

wait "$EMPTY"
expect "empty lines only: 408 within the head's 10 s" "HTTP/1.1 408 Request Timeout True" "$(cat "$tmp/emptylines")"

# ---- SIGHUP: the daemon stays; the admin token is read again ----
echo "second-token" >"$tmp/token"
kill -HUP "$DPID"
for _ in $(seq 1 100); do grep -q "SIGHUP" "$tmp/err" && break; sleep 0.05; done
kill -0 "$DPID" 2>/dev/null && ok || bad "SIGHUP killed oversubd"
expect "the new token works" 200 "$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Authorization: Bearer second-token' "$A/v1/pool" -d '{"ratio":"1.5"}')"
expect "the old one no more" 401 "$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Authorization: Bearer first-token' "$A/v1/pool" -d '{"ratio":"1.5"}')"
grep -q "restart oversubd to change them" "$tmp/err" || bad "SIGHUP does not say what it cannot reload: $(grep SIGHUP "$tmp/err")"
TOK="second-token"

# ---- SIGTERM with a stream in flight: no new connections, the stream ends whole, then exit ----
rm -f "$tmp/flag"
curl -s -N "$G/big/stream" >"$tmp/stream" 2>&1 &
CP=$!
for _ in $(seq 1 100); do grep -q first "$tmp/stream" 2>/dev/null && break; sleep 0.05; done
expect "the stream's first chunk" first "$(head -1 "$tmp/stream")"
kill -TERM "$DPID"
for _ in $(seq 1 100); do grep -q "accepts no more connections" "$tmp/err" && break; sleep 0.05; done
kill -0 "$DPID" 2>/dev/null && ok || bad "SIGTERM stopped oversubd with a stream in flight"
expect "no new connection while draining" 000 "$(curl -s -o /dev/null -w '%{http_code}' -m 3 "$G/chat/echo")"
touch "$tmp/flag"
wait "$CP"
expect "the stream ended whole" "0 first after-flag" "$? $(tr '\n' ' ' <"$tmp/stream" | sed 's/ $//')"
wait "$DPID"
expect "then oversubd exited cleanly" 0 "$?"
grep -q "the gateway drained" "$tmp/err" || bad "no drain message: $(tail -3 "$tmp/err")"

echo "test_frontdoor: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
