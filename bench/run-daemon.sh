#!/usr/bin/env bash
# run-daemon.sh - oversubd under load on loopback, side by side with peers on the same machine
# in the same run (the machine is shared and noisy: ratios and medians, not absolutes):
#   1. GET /v1/pool with wrk, against nginx serving the same body as a static file;
#   2. a submit/release mix from concurrent wrk connections (every 2xx is durable: WAL,
#      synchronous=FULL, group commit), against the bare SQLite loop (bench_store) making one
#      durable commit per mutation with the same payload, on the same disk;
#   3. resident memory with 10,000 services.
# Usage: bench/run-daemon.sh [BUILD_DIR]   (make bench-daemon)
set -euo pipefail
build=$(realpath "${1:-build}")
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/oversubd
[ -x "$bin" ] || { echo "run-daemon.sh: $bin not built (make bench-daemon)" >&2; exit 2; }
runs=${RUNS:-3}
dur=${DURATION:-4}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/oversub-bench.XXXXXX")
dpid=""
npid=""
cleanup() {
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    [ -n "$npid" ] && kill "$npid" 2>/dev/null && wait "$npid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
# a POST to the API that must succeed (JSON, as the API requires: 415 otherwise)
post() {
    local url=$1 code
    shift
    code=$(curl -s -o "$tmp/post.out" -w '%{http_code}' -X POST -H 'Content-Type: application/json' "$url" "$@")
    case $code in
    2??) ;;
    *) echo "$(basename "$0"): POST $url answered $code: $(cat "$tmp/post.out")" >&2; exit 1 ;;
    esac
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
rps() { awk '/^Requests\/sec:/ {print $2}'; }

start_daemon() { # fresh state in $tmp/$1
    mkdir -p "$tmp/$1"
    "$bin" --listen 127.0.0.1:0 --socket "" --state "$tmp/$1/state.db" --gpus sim:8x81920 \
        --ratio 1.5 >"$tmp/$1/out" 2>"$tmp/$1/err" &
    dpid=$!
    PORT=""
    for _ in $(seq 1 200); do
        PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/$1/out" 2>/dev/null | head -1 | sed 's/.*://' || true)
        [ -n "$PORT" ] && return 0
        sleep 0.05
    done
    echo "run-daemon.sh: oversubd did not start: $(cat "$tmp/$1/err")" >&2
    exit 1
}
stop_daemon() { kill "$dpid"; wait "$dpid" 2>/dev/null || true; dpid=""; }

echo "machine: $(nproc) CPUs; oversubd: one event loop + one writer thread; runs: $runs x ${dur}s"

# ---- 1. GET /v1/pool vs nginx ----
start_daemon get
# a realistic pool: 8 GPUs with some services
for i in $(seq 1 40); do
    post "http://127.0.0.1:$PORT/v1/services" \
        -d "{\"id\":\"s$i\",\"class\":\"batch\",\"vram_mib\":4096}"
done
mkdir -p "$tmp/www/v1"
curl -s "http://127.0.0.1:$PORT/v1/pool" >"$tmp/www/v1/pool"
nport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$tmp/nginx.conf" <<NG
daemon off;
master_process off;
worker_processes 1;
error_log $tmp/nginx.err;
pid $tmp/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $tmp/nb; proxy_temp_path $tmp/np; fastcgi_temp_path $tmp/nf;
    uwsgi_temp_path $tmp/nu; scgi_temp_path $tmp/ns;
    default_type application/json;
    server { listen 127.0.0.1:$nport; root $tmp/www; }
}
NG
nginx -c "$tmp/nginx.conf" -p "$tmp" &
npid=$!
sleep 0.5
echo
echo "== GET /v1/pool ($(wc -c <"$tmp/www/v1/pool") bytes), wrk -t2 -c32 -d${dur}s; nginx (1 worker) serves the same bytes =="
: >"$tmp/get.ours"
: >"$tmp/get.nginx"
for r in $(seq 1 "$runs"); do
    wrk -t2 -c32 -d"${dur}s" "http://127.0.0.1:$PORT/v1/pool" | rps >>"$tmp/get.ours"
    wrk -t2 -c32 -d"${dur}s" "http://127.0.0.1:$nport/v1/pool" | rps >>"$tmp/get.nginx"
done
g_ours=$(median <"$tmp/get.ours")
g_ng=$(median <"$tmp/get.nginx")
echo "oversubd: $(tr '\n' ' ' <"$tmp/get.ours")-> median $g_ours req/s"
echo "nginx:    $(tr '\n' ' ' <"$tmp/get.nginx")-> median $g_ng req/s"
echo "ratio oversubd/nginx: $(awk -v a="$g_ours" -v b="$g_ng" 'BEGIN {printf "%.2f", a/b}')  (target: oversubd >= 30000 req/s)"
kill "$npid"; wait "$npid" 2>/dev/null || true; npid=""
stop_daemon

# ---- 2. durable mutations vs the bare SQLite loop ----
echo
echo "== submit/release mix, wrk -t4 -c32 -d${dur}s (every 2xx durable); bare loop: one commit per mutation =="
: >"$tmp/mut.ours"
: >"$tmp/mut.bare"
: >"$tmp/mut.group"
for r in $(seq 1 "$runs"); do
    start_daemon "mut$r"
    wrk -t4 -c32 -d"${dur}s" -s "$here/mutations.lua" "http://127.0.0.1:$PORT" -- "r$r" >"$tmp/wrk.$r"
    total=$(awk '/requests in/ {print $1}' "$tmp/wrk.$r")
    secs=$(awk '/requests in/ {gsub("s,", "", $4); print $4}' "$tmp/wrk.$r")
    non2xx=$(awk '/Non-2xx/ {print $5}' "$tmp/wrk.$r")
    awk -v t="$total" -v s="$secs" -v n="${non2xx:-0}" 'BEGIN {printf "%.0f\n", (t-n)/s}' >>"$tmp/mut.ours"
    curl -s "http://127.0.0.1:$PORT/metrics" |
        awk '/^oversub_store_commits_total/ {c=$2} /^oversub_store_commands_total/ {m=$2} END {printf "%.1f\n", m/c}' >>"$tmp/mut.group"
    [ "${non2xx:-0}" = 0 ] || echo "run $r: $non2xx responses were not 2xx (left out; see mutations.lua)" >&2
    stop_daemon
    "$build/bench/bench_store" "$tmp/bare$r.db" 2000 | awk '{print $6}' >>"$tmp/mut.bare"
done
m_ours=$(median <"$tmp/mut.ours")
m_bare=$(median <"$tmp/mut.bare")
echo "oversubd:  $(tr '\n' ' ' <"$tmp/mut.ours")-> median $m_ours durable mutations/s (commands per commit: $(tr '\n' ' ' <"$tmp/mut.group"))"
echo "bare loop: $(tr '\n' ' ' <"$tmp/mut.bare")-> median $m_bare commits/s"
echo "ratio oversubd/bare: $(awk -v a="$m_ours" -v b="$m_bare" 'BEGIN {printf "%.2f", a/b}')  (target: oversubd >= 2000/s)"

# ---- 3. memory with 10,000 services ----
echo
echo "== resident memory with 10,000 services (sim:8x81920, ratio 1.5; 32 MiB batch services) =="
start_daemon rss
base_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$dpid/status")
python3 - "$PORT" <<'PY'
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
bad = 0
for i in range(10000):
    c.request("POST", "/v1/services", json.dumps({"id": "m%d" % i, "class": "batch", "vram_mib": 32}),
              {"Content-Type": "application/json"})
    r = c.getresponse(); r.read()
    bad += r.status >= 300
c.request("GET", "/v1/pool"); r = c.getresponse(); n = json.loads(r.read())
c.request("GET", "/v1/services"); r = c.getresponse(); s = json.loads(r.read())
print("services admitted: %d of 10000 (%d refused); listed: %d" % (10000 - bad, bad, len(s["services"])))
PY
rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$dpid/status")
hwm_kb=$(awk '/^VmHWM/ {print $2}' "/proc/$dpid/status")
echo "RSS: $((base_kb / 1024)) MiB empty, $((rss_kb / 1024)) MiB with 10,000 services (peak $((hwm_kb / 1024)) MiB; target <= 64 MiB)"
stop_daemon
