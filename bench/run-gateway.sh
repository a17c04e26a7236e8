#!/usr/bin/env bash
# run-gateway.sh - oversub's gateway against nginx and haproxy in one run, same backend
# (bench_backend), one worker each, keep-alive on both sides; the proxy on core 0, wrk and the
# backend on core 1 (when there are two). Then the rejection path: every request answered 429.
# Besides requests/s: each proxy's own CPU time per request (/proc/PID/stat over its runs), which
# still tells the proxies apart when the client and the backend's core is what limits the rate.
# Usage: bench/run-gateway.sh [BUILD_DIR]   (make bench-gateway)
set -euo pipefail
build=$(realpath "${1:-build}")
runs=${RUNS:-5}
dur=${DURATION:-4}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/oversub-gw.XXXXXX")
procs=()
cleanup() { for p in "${procs[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
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
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
if [ "$(nproc)" -ge 2 ]; then P0="taskset -c 0"; P1="taskset -c 1"; else P0=""; P1=""; fi
waitfor() { for _ in $(seq 1 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done; return 1; }

$P1 "$build/bench/bench_backend" >"$tmp/backend.out" &
procs+=($!)
waitfor "$tmp/backend.out" "port " || { echo "backend did not start"; exit 1; }
bport=$(awk '{print $2}' "$tmp/backend.out")

# oversub: one event loop (its writer thread sleeps: no commands during the run). BEFORE=DIR
# runs DIR/oversubd too (an earlier build), as "before", in the same rounds.
start_oversub() { # BINARY TAG: sets api, gw, opid
    $P0 "$1" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" \
        --state "$tmp/state.$2.db" --gpus sim:8x81920 --ratio 1.5 --tick-ms 1000 >"$tmp/o.$2.out" 2>"$tmp/o.$2.err" &
    opid=$!
    procs+=($opid)
    waitfor "$tmp/o.$2.out" "gateway on" && waitfor "$tmp/o.$2.out" "listening on" ||
        { echo "oversubd did not start: $(cat "$tmp/o.$2.err")"; exit 1; }
    api=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$tmp/o.$2.out" | head -1 | sed 's/.*://')
    gw=$(grep -o 'gateway on http://127.0.0.1:[0-9]*' "$tmp/o.$2.out" | sed 's/.*://')
    post "http://127.0.0.1:$api/v1/services" \
        -d "{\"id\":\"bench\",\"class\":\"online\",\"vram\":\"10GiB\",\"backends\":[\"http://127.0.0.1:$bport\"],\"max_inflight\":64,\"max_queue\":1024}"
    post "http://127.0.0.1:$api/v1/services/bench/ready"
}
proxies=""
if [ -n "${BEFORE:-}" ]; then
    start_oversub "$(realpath "$BEFORE")/oversubd" before
    proxies="before:$gw:$opid"
fi
start_oversub "$build/oversubd" now
proxies="oversub:$gw:$opid $proxies"
ourpid=$opid
post "http://127.0.0.1:$api/v1/services" \
    -d "{\"id\":\"full\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"http://127.0.0.1:$bport\"],\"max_inflight\":1,\"max_queue\":0}"
post "http://127.0.0.1:$api/v1/services/full/ready"

nport=$(free_port)
mkdir -p "$tmp/n"
cat >"$tmp/nginx.conf" <<NG
daemon off; master_process off; worker_processes 1;
error_log $tmp/nginx.err; pid $tmp/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $tmp/n/b; proxy_temp_path $tmp/n/p; fastcgi_temp_path $tmp/n/f;
    uwsgi_temp_path $tmp/n/u; scgi_temp_path $tmp/n/s;
    upstream backend { server 127.0.0.1:$bport; keepalive 64; }
    server {
        listen 127.0.0.1:$nport;
        location /bench/ {
            proxy_pass http://backend/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NG
$P0 nginx -c "$tmp/nginx.conf" -p "$tmp" &
procs+=($!)
npid=$!
hport=$(free_port)
cat >"$tmp/haproxy.cfg" <<HA
global
    nbthread 1
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    http-reuse always
frontend fe
    bind 127.0.0.1:$hport
    http-request set-path %[path,regsub(^/bench/,/)]
    default_backend be
backend be
    server b1 127.0.0.1:$bport
HA
$P0 haproxy -f "$tmp/haproxy.cfg" -q &
procs+=($!)
hpid=$!
sleep 0.5
proxies="$proxies nginx:$nport:$npid haproxy:$hport:$hpid"
names=$(for p in $proxies; do printf '%s ' "${p%%:*}"; done)
for p in $(for p in $proxies; do p=${p#*:}; printf '%s ' "${p%%:*}"; done); do
    c=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p/bench/x")
    [ "$c" = 200 ] || { echo "proxy on $p answers $c"; exit 1; }
done

echo "machine: $(nproc) CPUs; proxies on core 0, wrk and the backend on core 1; $runs runs x ${dur}s; wrk -t1 -c64"
for name in $names; do
    : >"$tmp/rps.$name"
    : >"$tmp/lat.$name"
    : >"$tmp/cpu.$name"
done
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for r in $(seq 1 "$runs"); do
    for name in $proxies; do
        IFS=: read -r who port pid <<<"$name"
        c0=$(cpu_ticks "$pid")
        $P1 wrk -t1 -c64 -d"${dur}s" --latency "http://127.0.0.1:$port/bench/x" >"$tmp/w"
        c1=$(cpu_ticks "$pid")
        awk '/^Requests\/sec:/ {print $2}' "$tmp/w" >>"$tmp/rps.$who"
        awk '/^ +50%/ {p50=$2} /^ +99%/ {p99=$2} END {print p50, p99}' "$tmp/w" >>"$tmp/lat.$who"
        # microseconds of the proxy's CPU per request answered
        awk -v t=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" '/requests in/ {printf "%.2f\n", t / hz * 1e6 / $1}' "$tmp/w" >>"$tmp/cpu.$who"
    done
done
ours=$(median <"$tmp/rps.oversub")
ours_cpu=$(median <"$tmp/cpu.oversub")
for name in $names; do
    m=$(median <"$tmp/rps.$name")
    printf '%-8s %s -> median %s req/s; p50 p99 of the runs: %s; ours/%s %.2f\n' "$name" \
        "$(tr '\n' ' ' <"$tmp/rps.$name")" "$m" "$(tr '\n' ';' <"$tmp/lat.$name")" "$name" \
        "$(awk -v a="$ours" -v b="$m" 'BEGIN {print a/b}')"
done
for name in $names; do
    m=$(median <"$tmp/cpu.$name")
    printf '%-8s proxy CPU per request: %s us -> median %s us; %s/oversub %.2f\n' "$name" \
        "$(tr '\n' ' ' <"$tmp/cpu.$name")" "$m" "$name" "$(awk -v a="$m" -v b="$ours_cpu" 'BEGIN {print a/b}')"
done

# Proxy-bound: on this machine the rate above is set by wrk and the backend's core (each proxy
# uses a third of its own), so it cannot tell the proxies apart. Here each proxy in turn runs
# under the same CPU quota (CAP percent of one core, a CFS cgroup), well under what it used above:
# the proxy is then what limits, and the rate is its quota over its CPU per request. Needs a
# writable cpu cgroup (v1 cpu.cfs_quota_us or v2 cpu.max); skipped with a line otherwise.
cap=${CAP:-10}
cg=""
if [ -w /sys/fs/cgroup/cpu ] && [ -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    cg=/sys/fs/cgroup/cpu/oversub-bench-$$
    mkdir "$cg" && echo 100000 >"$cg/cpu.cfs_period_us" && echo $((cap * 1000)) >"$cg/cpu.cfs_quota_us" || cg=""
    cgroot=/sys/fs/cgroup/cpu
elif [ -e /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    cg=/sys/fs/cgroup/oversub-bench-$$
    mkdir "$cg" && echo "$((cap * 1000)) 100000" >"$cg/cpu.max" || cg=""
    cgroot=/sys/fs/cgroup
fi
if [ -n "$cg" ]; then
    trap 'for p in "${procs[@]}"; do echo "$p" >"$cgroot/cgroup.procs" 2>/dev/null || true; done; rmdir "$cg" 2>/dev/null; cleanup' EXIT
    for name in $names; do : >"$tmp/cap.$name"; done
    for r in $(seq 1 "$runs"); do
        for name in $proxies; do
            IFS=: read -r who port pid <<<"$name"
            echo "$pid" >"$cg/cgroup.procs"
            $P1 wrk -t1 -c64 -d"${dur}s" "http://127.0.0.1:$port/bench/x" | awk '/^Requests\/sec:/ {print $2}' >>"$tmp/cap.$who"
            echo "$pid" >"$cgroot/cgroup.procs"
        done
    done
    ours_cap=$(median <"$tmp/cap.oversub")
    for name in $names; do
        m=$(median <"$tmp/cap.$name")
        printf '%-8s proxy-bound (quota %s%% of a core): %s-> median %s req/s; ours/%s %.2f\n' "$name" "$cap" \
            "$(tr '\n' ' ' <"$tmp/cap.$name")" "$m" "$name" "$(awk -v a="$ours_cap" -v b="$m" 'BEGIN {print a/b}')"
    done
else
    echo "proxy-bound phase skipped: no writable cpu cgroup (run as root with cgroup v1 cpu or v2 cpu.max)"
fi

# the rejection path: the only slot is held by a request that never ends, the queue is 0
curl -s -o /dev/null -m 600 "http://127.0.0.1:$gw/full/hang" &
procs+=($!)
sleep 0.3
c=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$gw/full/x")
[ "$c" = 429 ] || { echo "rejection path answers $c, not 429"; exit 1; }
: >"$tmp/rps.reject"
for r in $(seq 1 "$runs"); do
    $P1 wrk -t1 -c64 -d"${dur}s" "http://127.0.0.1:$gw/full/x" | awk '/^Requests\/sec:/ {print $2}' >>"$tmp/rps.reject"
done
rej=$(median <"$tmp/rps.reject")
echo "rejection path (every request 429): $(tr '\n' ' ' <"$tmp/rps.reject")-> median $rej req/s; $(awk -v a="$rej" -v b="$ours" 'BEGIN {printf "%.2f", a/b}')x our proxied rate (target >= 3x)"
echo "(target: oversub >= 1.1x the better of nginx and haproxy)"

# ---- overload: an open-loop generator at 5x capacity ----
# three services on the same backend, 100 ms of service time each request (/sleep?ms=100):
# capacity = (64 + 8 + 8) / 0.1 s = 800 requests/s; offered 4,000/s, 2:9:9 online:batch:
# experiment, so online gets 400/s against its own 640.
secs=${OVERLOAD_SECONDS:-60}
for sv in on:online:64 ba:batch:8 ex:experiment:8; do
    IFS=: read -r id cls lim <<<"$sv"
    post "http://127.0.0.1:$api/v1/services" \
        -d "{\"id\":\"$id\",\"class\":\"$cls\",\"vram\":\"10GiB\",\"backends\":[\"http://127.0.0.1:$bport\"],\"max_inflight\":$lim,\"max_queue\":$((2 * lim)),\"queue_timeout_ms\":2000}"
    post "http://127.0.0.1:$api/v1/services/$id/ready"
done
opid=$ourpid # oversubd (taskset execs it in place)
$P1 "$build/bench/bench_openloop" 127.0.0.1 "$gw" 4000 "$secs" \
    "/on/sleep?ms=100:2" "/ba/sleep?ms=100:9" "/ex/sleep?ms=100:9" >"$tmp/ol" &
olp=$!
sleep 5
rss0=$(awk '/^VmRSS/ {print $2}' "/proc/$opid/status")
wait "$olp"
rss1=$(awk '/^VmRSS/ {print $2}' "/proc/$opid/status")
echo
echo "overload: open loop at 4,000 requests/s = 5x capacity for ${secs}s (bench_openloop)"
python3 - "$tmp/ol" "$rss0" "$rss1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); r0, r1 = int(sys.argv[2]), int(sys.argv[3])
for p in d["paths"]:
    ok = p["2xx"] / p["sent"] if p["sent"] else 0
    print("  %-22s sent %7d  2xx %7d (%.2f%%)  429 %7d  other %5d  p50 %5.0f ms  p99 %5.0f ms"
          % (p["path"], p["sent"], p["2xx"], 100 * ok, p["429"], p["other"], p["p50_ms"], p["p99_ms"]))
on = d["paths"][0]
print("online success: %.2f%% (target >= 99%%)" % (100.0 * on["2xx"] / max(1, on["sent"])))
print("RSS: %d KiB after 5 s, %d KiB at the end: %+.1f%% (target <= +10%%)" % (r0, r1, 100.0 * (r1 - r0) / r0))
PY
