#!/usr/bin/env bash
# run-streams.sh - 1,000 concurrent server-sent-event streams (an LLM's token stream: 20
# events 50 ms apart, the first at once) through oversub's gateway and through nginx
# (proxy_buffering off, keep-alive upstream), side by side in one run on the same backend; and
# straight to the backend, for the latency the proxies add. Streams completed per second, time
# to the first byte (p50, p99) and what the proxy adds to it, the proxy's peak RSS.
# Then HELD (10,000) streams at once through each proxy, each 6 s long, spread over three
# services (a route runs at most 4,096 at once): how many were held open together, how many
# ended well, the peak RSS after it (each proxy holds two descriptors a stream: when the hard
# RLIMIT_NOFILE cannot give 2 x HELD, the most that fits is run and said).
# Usage: bench/run-streams.sh [BUILD_DIR]   (make bench-streams)
set -euo pipefail
build=$(realpath "${1:-build}")
runs=${RUNS:-5}
dur=${DURATION:-6}
conns=${CONNS:-1000}
held=${HELD:-10000}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/oversub-st.XXXXXX")
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
ulimit -n "$(ulimit -Hn)"
nofile=$(ulimit -n)
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
if [ "$(nproc)" -ge 2 ]; then P0="taskset -c 0"; P1="taskset -c 1"; else P0=""; P1=""; fi
waitfor() { for _ in $(seq 1 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done; return 1; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
hwm() { awk '/VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

$P1 "$build/bench/bench_backend" >"$tmp/backend.out" &
procs+=($!)
waitfor "$tmp/backend.out" "port " || { echo "backend did not start"; exit 1; }
bport=$(awk '{print $2}' "$tmp/backend.out")

cat >"$tmp/oversub.yaml" <<EOF
gateway_conns_per_client: 16384
EOF
start_oversub() { # BINARY TAG: sets gw and opid; services llm, llm2, llm3 on the backend
    $P0 "$1" --config "$tmp/oversub.yaml" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 \
        --socket "" --state "$tmp/state.$2.db" --gpus sim:8x81920 --ratio 1.5 --tick-ms 1000 \
        >"$tmp/o.$2.out" 2>"$tmp/o.$2.err" &
    opid=$!
    procs+=($opid)
    waitfor "$tmp/o.$2.out" "gateway on" && waitfor "$tmp/o.$2.out" "listening on" ||
        { echo "oversubd did not start: $(cat "$tmp/o.$2.err")"; exit 1; }
    local api
    api=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$tmp/o.$2.out" | head -1 | sed 's/.*://')
    gw=$(grep -o 'gateway on http://127.0.0.1:[0-9]*' "$tmp/o.$2.out" | sed 's/.*://')
    for id in llm llm2 llm3; do
        post "http://127.0.0.1:$api/v1/services" \
            -d "{\"id\":\"$id\",\"class\":\"online\",\"vram\":\"10GiB\",\"backends\":[\"http://127.0.0.1:$bport\"],\"max_inflight\":4096,\"max_queue\":4096}"
        post "http://127.0.0.1:$api/v1/services/$id/ready"
    done
}
# BEFORE=DIR: DIR/oversubd (an earlier build) too, as "before", in the same rounds.
# NGINX_DEFERRED=1: nginx listens with "deferred" (TCP_DEFER_ACCEPT), as oversub's gateway does
# by default
targets="direct:$bport:"
if [ -n "${BEFORE:-}" ]; then
    start_oversub "$(realpath "$BEFORE")/oversubd" before
    bpid=$opid
    targets="$targets before:$gw:$opid"
fi
start_oversub "$build/oversubd" now
targets="$targets oversub:$gw:$opid"

nport=$(free_port)
mkdir -p "$tmp/n"
cat >"$tmp/nginx.conf" <<NG
daemon off; master_process off; worker_processes 1; worker_rlimit_nofile $nofile;
error_log $tmp/nginx.err; pid $tmp/nginx.pid;
events { worker_connections $nofile; multi_accept on; }
http {
    access_log off;
    client_body_temp_path $tmp/n/b; proxy_temp_path $tmp/n/p; fastcgi_temp_path $tmp/n/f;
    uwsgi_temp_path $tmp/n/u; scgi_temp_path $tmp/n/s;
    upstream backend { server 127.0.0.1:$bport; keepalive 1024; }
    server {
        listen 127.0.0.1:$nport backlog=4096${NGINX_DEFERRED:+ deferred};
        location /llm/ {
            proxy_pass http://backend/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
        location /llm2/ {
            proxy_pass http://backend/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
        location /llm3/ {
            proxy_pass http://backend/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
NG
$P0 nginx -c "$tmp/nginx.conf" -p "$tmp" &
npid=$!
procs+=($npid)
targets="$targets nginx:$nport:$npid"
sleep 0.5

path="stream?n=20&ms=50"
echo "machine: $(nproc) CPUs; proxies on core 0, the client and the backend on core 1"
echo "$conns concurrent streams (20 events 50 ms apart each, the first at once), ${dur}s x $runs runs"
names=$(for t in $targets; do printf '%s ' "${t%%:*}"; done)
for r in $(seq 1 "$runs"); do
    for t in $targets; do
        IFS=: read -r who port _ <<<"$t"
        pre=/llm
        [ "$who" = direct ] && pre=""
        $P1 "$build/bench/bench_streams" 127.0.0.1 "$port" "$pre/$path" "$conns" "$dur" >"$tmp/$who.$r"
    done
done
for who in $names; do
    sps=$(for r in $(seq 1 "$runs"); do field "$tmp/$who.$r" streams_per_s; done | median)
    t50=$(for r in $(seq 1 "$runs"); do field "$tmp/$who.$r" ttfb_p50_ms; done | median)
    t99=$(for r in $(seq 1 "$runs"); do field "$tmp/$who.$r" ttfb_p99_ms; done | median)
    err=$(for r in $(seq 1 "$runs"); do field "$tmp/$who.$r" errors; done | median)
    w50=$(for r in $(seq 1 "$runs"); do field "$tmp/$who.$r" wave_p50_ms; done | median)
    w99=$(for r in $(seq 1 "$runs"); do field "$tmp/$who.$r" wave_p99_ms; done | median)
    printf "%-8s streams/s median %7.1f   time to first byte p50 %6.1f ms p99 %6.1f ms   errors %s\n" \
        "$who" "$sps" "$t50" "$t99" "$err"
    printf "%-8s   the opening burst (each connection's first stream): first byte p50 %6.1f ms p99 %6.1f ms\n" \
        "" "$w50" "$w99"
    eval "sps_$who=$sps t99_$who=$t99 t50_$who=$t50"
done
added() { # WHO: the median over the rounds of (its p99 - direct's p99 in the same round)
    for r in $(seq 1 "$runs"); do
        python3 -c "print(round($(field "$tmp/$1.$r" ttfb_p99_ms) - $(field "$tmp/direct.$r" ttfb_p99_ms), 1))"
    done | median
}
for who in $names; do
    [ "$who" = direct ] && continue
    eval "t99=\$t99_$who"
    echo "added to the first byte's p99 (proxy - direct): $who $(python3 -c "print(round($t99 - $t99_direct, 1))") ms (median of the rounds' differences: $(added "$who") ms)"
done
echo "streams/s oversub/nginx: $(python3 -c "print(round($sps_oversub / $sps_nginx, 2))")"
for t in $targets; do
    IFS=: read -r who _ pid <<<"$t"
    [ -n "$pid" ] && printf 'peak RSS: %s %s KiB\n' "$who" "$(hwm "$pid")"
done
echo "(oversubd: the whole daemon; nginx: its one worker)"

# ---- HELD streams at once ----
fit=$(((nofile - 100) / 2))
if [ "$held" -gt "$fit" ]; then
    echo "note: RLIMIT_NOFILE is $nofile here (hard): a proxy holds 2 descriptors a stream, so $fit streams at once, not $held"
    held=$fit
fi
hpath="stream?n=60&ms=100"
echo
echo "$held streams at once (60 events 100 ms apart each, over /llm, /llm2, /llm3), one round each"
for t in $targets; do
    IFS=: read -r who port _ <<<"$t"
    [ "$who" = direct ] && continue
    $P1 "$build/bench/bench_streams" 127.0.0.1 "$port" "/llm/$hpath,/llm2/$hpath,/llm3/$hpath" "$held" 1 >"$tmp/held.$who"
done
for who in $names; do
    [ "$who" = direct ] && continue
    python3 - "$tmp/held.$who" "$who" "$held" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("%-8s held at once %6d of %s   ended well %6d   errors %5d   first byte p50 %6.1f ms p99 %7.1f ms"
      % (sys.argv[2], d["held_peak"], sys.argv[3], d["streams"], d["errors"], d["ttfb_p50_ms"], d["ttfb_p99_ms"]))
PY
done
ho=$(hwm "$opid")
hn=$(hwm "$npid")
[ -n "${bpid:-}" ] && echo "peak RSS after: before $(hwm "$bpid") KiB"
echo "peak RSS after: oversubd $ho KiB (the whole daemon), nginx $hn KiB: oversub/nginx $(python3 -c "print(round($ho / max(1, $hn), 2))")"
