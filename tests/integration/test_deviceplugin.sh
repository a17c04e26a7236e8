#!/usr/bin/env bash
# test_deviceplugin.sh - oversubd's kubelet device plugin (docs/deviceplugin.md) against a
# kubelet stand-in (tests/k8s/kubelet_standin.py, Debian's python3-grpcio): Register, the
# device list and its re-streaming, Allocate for a pod submitted through the API (its env, its
# mounts, its grant segment enforced by the shim and read back as usage), a pod bound while its
# victims leave (allocated, PreStartContainer held until they are gone, or answered UNAVAILABLE
# after OSUB_DP_PRESTART_MS), refusals, malformed input, a kubelet restart, an oversubd
# restart, the cut list and the pods' MiB held under it.
# usage: test_deviceplugin.sh OVERSUBD SHIM CUDA_CLIENT FAKECUDA_DIR
set -u
oversubd=$1 shim=$2 client=$3 fakedir=$4
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
SI="$(cd "$(dirname "$0")/../k8s" && pwd)/kubelet_standin.py"
if ! $PY -c 'import grpc, grpc_tools' 2>/dev/null; then
    echo "test_deviceplugin: python3-grpcio and python3-grpc-tools are needed (scripts/install-deps.sh test)"
    exit 1
fi
KD=$tmp/kd
D=$tmp/d
mkdir -p "$KD" "$D"
wait_for() { # seconds, command...: the event it waits for, or a failure after the deadline
    local t=$1
    shift
    for _ in $(seq 1 $((t * 20))); do "$@" && return 0; sleep 0.05; done
    return 1
}
lines() { grep -c "$2" "$1" 2>/dev/null || true; }
has_lines() { [ "$(lines "$1" "$2")" -ge "$3" ]; }

standin() { # a kubelet (re)starting: its Registration service, plugins' sockets removed
    $PY "$SI" serve "$KD" >"$tmp/serve.$1" 2>&1 &
    SPID=$!
    pids+=($SPID)
    wait_for 20 has_lines "$tmp/serve.$1" '^serving' 1 || bad "stand-in $1 did not start: $(cat "$tmp/serve.$1")"
}
printf '%s\n' "device_plugin: $KD" "cuda_shim: $shim" "hysteresis_ms: 500" >"$D/c.yaml"
start_d() { # PreStartContainer gives up after 3 s here (25 s by default)
    OSUB_DP_PRESTART_MS=3000 "$oversubd" --config "$D/c.yaml" --listen 127.0.0.1:0 --socket "$D/s.sock" --state "$D/st/db" \
        --gpus sim:2x1000 --ratio 1.5 --tick-ms 100 >>"$D/out" 2>>"$D/err" &
    DPID=$!
    pids+=($DPID)
    S=$D/s.sock
    for _ in $(seq 1 1200); do [ -S "$S" ] && curl -s --unix-socket "$S" http://x/healthz >/dev/null && break; sleep 0.05; done
}
api() { curl -s --unix-socket "$S" -X "$1" "http://x$2" ${3:+-d "$3"}; }
svc() { api GET "/v1/services/$1" | json "$2" 2>/dev/null; }
dp() { timeout 20 $PY "$SI" "$@" "$KD"; }
dpa() { local c=$1; shift; timeout 20 $PY "$SI" "$c" "$KD" "$@"; }

echo "== register"
standin 1
start_d
wait_for 20 has_lines "$tmp/serve.1" '^register' 1 || bad "no Register came: $(tail -5 "$D/err")"
expect "Register's fields" "register version=v1beta1 endpoint=oversub.sock resource=oversub.io/vram-mib pre_start=1" \
    "$(grep '^register' "$tmp/serve.1" | head -1)"
grep -q "device plugin: registered oversub.io/vram-mib" "$D/err" || bad "the registration is logged"

echo "== ListAndWatch"
timeout 120 $PY "$SI" watch "$KD" >"$tmp/watch1" 2>&1 & # open until the kubelet restart below
WPID=$!
pids+=($WPID)
# 2 GPUs x 1000 MiB x 1.5 = 3000 devices of 1 MiB, all healthy, IDs distinct and short
wait_for 20 has_lines "$tmp/watch1" '^devices' 1 || bad "no list streamed: $(cat "$tmp/watch1")"
expect "the list: logical MiB" "devices 3000 healthy=3000 unique=3000 maxlen=2" \
    "$(grep '^devices' "$tmp/watch1" | head -1 | cut -d' ' -f1-5)"
expect "ratio to 2.0" 200 "$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$S" -X PUT http://x/v1/pool -d '{"ratio": 2.0}')"
wait_for 20 has_lines "$tmp/watch1" '^devices' 2 || bad "a ratio change was not streamed: $(cat "$tmp/watch1")"
expect "the list again at ratio 2.0" "devices 4000" "$(grep '^devices' "$tmp/watch1" | sed -n 2p | cut -d' ' -f1-2)"
expect "options: PreStartContainer required" "options pre_start=1 preferred=0" "$(dp options)"
expect "Register carries the option too" "register version=v1beta1 endpoint=oversub.sock resource=oversub.io/vram-mib pre_start=1" \
    "$(grep '^register' "$tmp/serve.1" | head -1)"
expect "PreStartContainer for devices no allocation holds: nothing to wait for" "prestart ok" "$(dp prestart)"
expect "GetPreferredAllocation: the must first" "preferred c,a" "$(dpa preferred 2 a b c)"
expect "GetPreferredAllocation of 60,000 IDs: each once, the musts first" "preferred-many n=60000 unique=60000 musts_first=True" "$(timeout 130 $PY "$SI" preferred-many "$KD" 60000)"
expect "more IDs than any plugin has: refused" "preferred-many INVALID_ARGUMENT PreferredAllocationRequest: a container request names more than 65536 device IDs in a list" "$(timeout 130 $PY "$SI" preferred-many "$KD" 70000)"
expect "and the daemon answers after both" ok "$(api GET /healthz | json 'd["status"]')"

echo "== Allocate"
out=$(dpa allocate 100)
expect "no pod: refused" FAILED_PRECONDITION "$(json 'd["code"]' <<<"$out")"
grep -q "Allocate of 100 MiB (container 1 of the request) refused" "$D/err" || bad "the refusal is logged: $(tail -3 "$D/err")"
pod='{"id":"pod-u1","class":"batch","vram":"300MiB","kubernetes":{"namespace":"ns","name":"p1",
 "uid":"u1","node":"n1","grace_seconds":5,"containers":[{"name":"a","vram_mib":100},{"name":"b","vram_mib":200}]}}'
tok=$(api POST /v1/services "$pod" | json 'd["token"]')
expect "the pod is running" loading "$(svc pod-u1 'd["state"]')"
out=$(dpa allocate 200)
env() { json "d['containers'][0]['envs'].get('$1')" <<<"$out"; }
expect "allocated" True "$(json 'd["ok"]' <<<"$out")"
expect "OVERSUB_SERVICE" pod-u1 "$(env OVERSUB_SERVICE)"
expect "OVERSUB_TOKEN: the service's" "$tok" "$(env OVERSUB_TOKEN)"
expect "OVERSUB_VRAM_MIB: the container's" 200 "$(env OVERSUB_VRAM_MIB)"
expect "the container matched by size" b "$(env OVERSUB_CONTAINER)"
expect "CUDA_VISIBLE_DEVICES: its GPU" "$(svc pod-u1 'd["placement"][0]["gpu"]')" "$(env CUDA_VISIBLE_DEVICES)"
expect "NVIDIA_VISIBLE_DEVICES as well" "$(env CUDA_VISIBLE_DEVICES)" "$(env NVIDIA_VISIBLE_DEVICES)"
expect "LD_PRELOAD: the shim in the container" /usr/local/lib/oversub/liboversub-cuda.so "$(env LD_PRELOAD)"
expect "OVERSUB_SHIM_SEGMENT" /var/run/oversub/grant.seg "$(env OVERSUB_SHIM_SEGMENT)"
mounts=$(json '" ".join("%s=%s:%s" % (m["container_path"], m["host_path"], "ro" if m["read_only"] else "rw") for m in d["containers"][0]["mounts"])' <<<"$out")
seg=$(json '[m["host_path"] for m in d["containers"][0]["mounts"] if m["container_path"].endswith(".seg")][0]' <<<"$out")
# the shim is mounted from the state's folder (the host's, in the DaemonSet), not from where
# oversubd found it (inside its own image)
expect "the mounts" "/usr/local/lib/oversub/liboversub-cuda.so=$D/st/lib/liboversub-cuda.so:ro /var/run/oversub/grant.seg=$seg:rw" "$mounts"
expect "the shim's copy is the shim" same "$(cmp -s "$shim" "$D/st/lib/liboversub-cuda.so" && echo same)"
expect "the shim's copy: mode 0755" 755 "$(stat -c %a "$D/st/lib/liboversub-cuda.so")"
grep -q "the CUDA shim .* copied to $D/st/lib/liboversub-cuda.so" "$D/err" || bad "the copy is logged: $(grep 'CUDA shim' "$D/err")"
expect "the segment in the state's shim/pods folder" "$D/st/shim/pods" "$(dirname "$seg")"
expect "the segment: any container user may open it (through its bind mount)" 666 "$(stat -c %a "$seg")"
# no local user reaches it by its path (issue 23: 0666 in a 0711 folder was anyone's)
expect "the pods' folder: root's only" "700 $(id -u)" "$(stat -c '%a %u' "$D/st/shim/pods")"
expect "the shim folder: passable, not listable" 711 "$(stat -c %a "$D/st/shim")"
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
    chmod 711 "$tmp" "$D" "$D/st" # every folder above passable, as a host's /var/lib is
    expect "another local user cannot open it, even knowing its name" denied "$(su -s /bin/sh nobody -c "cat '$seg' >/dev/null 2>&1 && echo opened || echo denied")"
fi
expect "the socket (the admin) sees the path" "$seg" "$(svc pod-u1 'd["shim"]["segment"]')"
PORT=$(grep -o "listening on http://127.0.0.1:[0-9]*" "$D/out" | tail -1 | sed 's/.*://')
expect "TCP without the admin token never sees it" "<redacted>" "$(curl -s "http://127.0.0.1:$PORT/v1/services/pod-u1" | json 'd["shim"]["segment"]')"
expect "nor in the list" "" "$(curl -s "http://127.0.0.1:$PORT/v1/services" | grep -o "$(basename "$seg")")"
# the shim as the container would run it, against the fake driver: the grant enforced, the
# usage read back by the watch round
F=$tmp/ctr
OVERSUB_SHIM_SEGMENT=$seg LD_PRELOAD=$shim LD_LIBRARY_PATH=$fakedir FAKE_CUDA_MEM_MIB=1000 \
    "$client" alloc:250 expect:0 alloc:100 expect:2 touch:$F.a hold >"$tmp/ctr.out" 2>&1 &
CPID=$!
pids+=($CPID)
wait_for 20 test -e "$F.a" || bad "the container's program did not run: $(cat "$tmp/ctr.out")"
used() { [ "$(svc pod-u1 'd["used_mib"]')" = "$1" ]; }
wait_for 20 used 250 || bad "the pod's usage from its segment: $(svc pod-u1 'd["used_mib"]')"
kill $CPID 2>/dev/null
wait $CPID 2>/dev/null
wait_for 20 used 0 || bad "the dead process's memory was taken back: $(svc pod-u1 'd["used_mib"]')"
out=$(dpa allocate 100)
expect "the second container" a "$(json "d['containers'][0]['envs']['OVERSUB_CONTAINER']" <<<"$out")"
expect "both share the pod's segment" "$seg" "$(json '[m["host_path"] for m in d["containers"][0]["mounts"] if m["container_path"].endswith(".seg")][0]' <<<"$out")"
expect "each container once" FAILED_PRECONDITION "$(json 'd["code"]' <<<"$(dpa allocate 100)")"

echo "== a pod bound while its victims leave"
# two experiments fill what pod-u1 left; an online pod then needs one of them evicted
expect "victim 1" loading "$(api POST /v1/services '{"id":"v1","class":"experiment","vram":"600MiB","gpus":1,"grace_ms":60000}' | json 'd["state"]')"
expect "victim 2" loading "$(api POST /v1/services '{"id":"v2","class":"experiment","vram":"900MiB","gpus":1,"grace_ms":60000}' | json 'd["state"]')"
pod2='{"id":"pod-u2","class":"online","vram":"900MiB","kubernetes":{"namespace":"ns","name":"p2",
 "uid":"u2","node":"n1","grace_seconds":5,"containers":[{"name":"m","vram_mib":900}]}}'
expect "the pod is bound and waits for a victim" pending "$(api POST /v1/services "$pod2" | json 'd["state"]')"
victim=$(svc pod-u2 'd["waiting_for"][0]["service"]')
out=$(dpa allocate --prefix q 900)
expect "a pending pod is allocated (kubelet's admission)" True "$(json 'd["ok"]' <<<"$out")"
expect "its container" m "$(env OVERSUB_CONTAINER)"
expect "its GPU: the placement it waits on" "$(svc pod-u2 'd["placement"][0]["gpu"]')" "$(env CUDA_VISIBLE_DEVICES)"
grep -q "allocated 900 MiB to pod-u2 container 0 (pending: it starts once its victims are gone)" "$D/err" ||
    bad "the pending allocation is logged: $(tail -3 "$D/err")"
seg2=$(json '[m["host_path"] for m in d["containers"][0]["mounts"] if m["container_path"].endswith(".seg")][0]' <<<"$out")
dpa prestart q 900 20 >"$tmp/ps2" 2>&1 &
PSPID=$!
pids+=($PSPID)
wait_for 20 has_lines "$D/err" "PreStartContainer for pod-u2 container 0 waits" 1 || bad "PreStartContainer did not wait: $(cat "$tmp/ps2")"
expect "PreStartContainer held open while its victim holds the memory" "" "$(cat "$tmp/ps2")"
# the victim's memory is not the pod's yet: its segment grants nothing (watch rounds included)
OVERSUB_SHIM_SEGMENT=$seg2 LD_PRELOAD=$shim LD_LIBRARY_PATH=$fakedir FAKE_CUDA_MEM_MIB=1000 \
    "$client" alloc:100 expect:2 >"$tmp/ctr2.out" 2>&1
expect "while pending, the pod's segment refuses allocations" 0 "$?"
expect "the API still answers while PreStartContainer waits" ok "$(api GET /healthz | json 'd["status"]')"
api DELETE "/v1/services/$victim" >/dev/null # the victim leaves
wait_for 20 has_lines "$tmp/ps2" '^prestart' 1 || bad "PreStartContainer not answered once the victim left: $(tail -3 "$D/err")"
expect "PreStartContainer answered once the victim left" "prestart ok" "$(cat "$tmp/ps2")"
expect "the pod's service runs" loading "$(svc pod-u2 'd["state"]')"
# answered only after the grant is in the segment: the container has its memory at once
OVERSUB_SHIM_SEGMENT=$seg2 LD_PRELOAD=$shim LD_LIBRARY_PATH=$fakedir FAKE_CUDA_MEM_MIB=1000 \
    "$client" alloc:800 expect:0 alloc:200 expect:2 >"$tmp/ctr2.out" 2>&1
expect "its grant once it runs: 900 MiB" 0 "$?"
expect "a container restart: answered at once" "prestart ok" "$(dpa prestart q 900 5)"

echo "== PreStartContainer gives up (UNAVAILABLE) while the victims stay"
pod3='{"id":"pod-u3","class":"online","vram":"600MiB","kubernetes":{"namespace":"ns","name":"p3",
 "uid":"u3","node":"n1","grace_seconds":5,"containers":[{"name":"m","vram_mib":600}]}}'
expect "the second pod waits for a victim" pending "$(api POST /v1/services "$pod3" | json 'd["state"]')"
victim=$(svc pod-u3 'd["waiting_for"][0]["service"]')
expect "allocated" True "$(json 'd["ok"]' <<<"$(dpa allocate --prefix r 600)")"
out=$(dpa prestart r 600 20)
expect "UNAVAILABLE after OSUB_DP_PRESTART_MS (the kubelet retries the start)" \
    "prestart UNAVAILABLE waiting for its victims to leave: oversub's pod-u3 is still pending after 3 s (waiting for $victim); the kubelet retries the container's start" "$out"
grep -q "PreStartContainer for pod-u3 container 0: still pending after 3000 ms: answered UNAVAILABLE" "$D/err" ||
    bad "the timeout is logged: $(tail -3 "$D/err")"
expect "the pod stays bound" pending "$(svc pod-u3 'd["state"]')"
api DELETE "/v1/services/$victim" >/dev/null
wait_for 20 test "$(svc pod-u3 'd["state"]')" = loading || bad "pod-u3 did not start"
expect "the kubelet's retry starts it" "prestart ok" "$(dpa prestart r 600 5)"
seg3=$(ls "$D"/st/shim/pods/pod-u3.*.seg)
api DELETE /v1/services/pod-u2 >/dev/null
api DELETE /v1/services/pod-u3 >/dev/null
wait_for 20 test ! -e "$seg2" -a ! -e "$seg3" || bad "the pods' segments stay after they went"

echo "== malformed input"
out=$(dpa raw Allocate ff)
expect "a broken protobuf" "raw INVALID_ARGUMENT" "$(cut -d' ' -f1-2 <<<"$out")"
expect "an unknown method" "raw UNIMPLEMENTED" "$(dpa raw Nope 00 | cut -d' ' -f1-2)"
grpc_raw() { # bytes (printf format) -> the grpc-status answered
    printf "$1" >"$tmp/body"
    curl -s --http2-prior-knowledge --unix-socket "$KD/oversub.sock" -H 'content-type: application/grpc' \
        -H 'te: trailers' --data-binary @"$tmp/body" -D - -o /dev/null \
        http://localhost/v1beta1.DevicePlugin/Allocate | tr -d '\r' | grep -i '^grpc-status' | cut -d' ' -f2
}
expect "a frame shorter than its prefix says" 13 "$(grpc_raw '\x00\x00\x00\x00\x09ab')"
expect "a frame without its prefix" 13 "$(grpc_raw '\x00\x00')"
expect "a compressed frame" 12 "$(grpc_raw '\x01\x00\x00\x00\x00')"
expect "a nested length past the end" 3 "$(grpc_raw '\x00\x00\x00\x00\x02\x0a\x7f')"
$PY -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"GET / HTTP/1.1\r\n\r\n"+bytes(range(256))*40); s.settimeout(5); s.recv(100)' "$KD/oversub.sock" 2>/dev/null
expect "not HTTP/2 at all: oversubd carries on" ok "$(api GET /healthz | json 'd["status"]' 2>/dev/null || echo dead)"
expect "the list still streams to a new watcher" "devices 4000" "$(timeout 5 $PY "$SI" watch "$KD" 1 | head -1 | cut -d' ' -f1-2)"

echo "== kubelet restart"
kill $SPID
wait $SPID 2>/dev/null
standin 2 # removes oversub.sock, makes kubelet.sock anew
wait_for 20 has_lines "$tmp/serve.2" '^register' 1 || bad "no Register after the kubelet restarted: $(tail -5 "$D/err")"
grep -q "was removed (the kubelet restarted?)" "$D/err" || bad "the restart is logged: $(tail -3 "$D/err")"
wait_for 20 has_lines "$tmp/watch1" '^watch ended' 1 || bad "the old watch stream was closed: $(cat "$tmp/watch1")"
expect "served again" "devices 4000" "$(timeout 5 $PY "$SI" watch "$KD" 1 | head -1 | cut -d' ' -f1-2)"

echo "== oversubd restart"
kill $DPID
wait $DPID 2>/dev/null
expect "the pod's segment outlives oversubd (running containers have it mounted)" yes "$(test -e "$seg" && echo yes)"
start_d
wait_for 20 has_lines "$tmp/serve.2" '^register' 2 || bad "no Register after oversubd restarted: $(tail -5 "$D/err")"
expect "its allocations are remembered" FAILED_PRECONDITION "$(json 'd["code"]' <<<"$(dpa allocate 200)")"
OVERSUB_SHIM_SEGMENT=$seg LD_PRELOAD=$shim LD_LIBRARY_PATH=$fakedir FAKE_CUDA_MEM_MIB=1000 \
    "$client" alloc:120 expect:0 alloc:200 expect:2 touch:$F.b hold >"$tmp/ctr.out" 2>&1 &
CPID=$!
pids+=($CPID)
wait_for 20 test -e "$F.b" || bad "the container's program after the restart: $(cat "$tmp/ctr.out")"
wait_for 20 used 120 || bad "the segment is read again after the restart: $(svc pod-u1 'd["used_mib"]')"
kill $CPID 2>/dev/null
wait $CPID 2>/dev/null

echo "== the pod goes"
api DELETE /v1/services/pod-u1 >/dev/null
wait_for 20 test ! -e "$seg" || bad "the pod's segment stays after the pod went"
# the allocations live in the state (saved with the command that made or dropped them)
allocs() { sqlite3 "$D/st/db" "SELECT value FROM meta WHERE key = 'device_plugin_allocations'"; }
nomore() { ! allocs | grep -q pod-u1; }
wait_for 20 nomore || bad "its allocations are forgotten: $(allocs)"
test ! -e "$D/st/db.allocated.json" || bad "no side file beside the state: the allocations are in it"

echo "== message size (docs/deviceplugin.md)"
kill $DPID
wait $DPID 2>/dev/null
rm -rf "$D/st"
sed -i 's/^hysteresis_ms.*//' "$D/c.yaml"
"$oversubd" --config "$D/c.yaml" --listen 127.0.0.1:0 --socket "$D/s.sock" --state "$D/st/db" \
    --gpus sim:8x81920 --ratio 1.3 --tick-ms 100 >>"$D/out" 2>"$D/err8" &
DPID=$!
pids+=($DPID)
S=$D/s.sock
wait_for 20 has_lines "$D/err8" 'device plugin: serving' 1 || bad "8x81920: $(cat "$D/err8")"
grep -q "851968 MiB of logical capacity would be a ListAndWatch message of 14237254 bytes, over the kubelet's 4194304: advertising 260965 MiB" "$D/err8" ||
    bad "the cut is said: $(grep 'device plugin' "$D/err8")"
# what the kubelet cannot account, oversub does not admit: pods' MiB stay under the cut
podc() { echo '{"id":"pod-'$1'","class":"batch","vram":"80000MiB","gpus":1,"kubernetes":{"namespace":"ns","name":"'$1'","uid":"'$1'","containers":[{"name":"m","vram_mib":80000}]}}'; }
for u in c1 c2 c3; do expect "pod $u under the cut" loading "$(api POST /v1/services "$(podc $u)" | json 'd["state"]')"; done
cut_msg="this node's kubelet can account only 260965 MiB of oversub.io/vram-mib (the device plugin's list is cut at 4 MiB); 240000 MiB are held by pods already, and this pod asks 80000 MiB"
expect "a dry run past the cut" "invalid_spec $cut_msg" "$(api POST '/v1/services?dry_run=1' "$(podc c4)" | json 'd["error"]["code"] + " " + d["error"]["message"]')"
expect "a submit past the cut" "invalid_spec $cut_msg" "$(api POST /v1/services "$(podc c4)" | json 'd["error"]["code"] + " " + d["error"]["message"]')"
expect "not admitted" 404 "$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$S" http://x/v1/services/pod-c4)"
expect "a retry of a pod already held counts once" loading "$(api POST /v1/services "$(podc c1)" | json 'd["state"]')"
expect "services that are not pods are not the kubelet's" loading "$(api POST /v1/services '{"id":"plain","class":"batch","vram":"80000MiB","gpus":1}' | json 'd["state"]')"
out=$(timeout 20 $PY "$SI" watch "$KD" 1 | head -1)
expect "the cut list fits kubelet's 4 MiB" "devices 260965 healthy=260965 unique=260965 maxlen=4" "$(cut -d' ' -f1-5 <<<"$out")"
echo "  $out"

echo "== watchers that never read (issue 23: a full list per change each, unbounded)"
metric() { api GET /metrics | grep "^$1 " | cut -d' ' -f2; }
rss() { grep VmRSS "/proc/$DPID/status" | tr -s ' ' | cut -d' ' -f2; }
rss0=$(rss)
$PY "$SI" stuck-watch "$KD" 8 >"$tmp/stuck" 2>&1 &
STPID=$!
pids+=($STPID)
eight() { [ "$(metric oversub_deviceplugin_watchers)" = 8 ]; }
wait_for 30 eight || bad "8 stuck watchers open: $(metric oversub_deviceplugin_watchers) $(cat "$tmp/stuck")"
lb=$(metric oversub_deviceplugin_list_bytes)
for r in 1.4 1.5 1.6 1.7 1.8 1.9 2.0 2.1 2.2 2.3; do
    n0=$(grep -c "device plugin: advertising" "$D/err8")
    api PUT /v1/pool "{\"ratio\":\"$r\"}" >/dev/null
    pushed() { [ "$(grep -c "device plugin: advertising" "$D/err8")" -gt "$n0" ]; }
    wait_for 20 pushed || bad "ratio $r: the list changed: $(tail -2 "$D/err8")"
done
coalesced() { [ "$(metric oversub_deviceplugin_lists_coalesced_total)" -ge 72 ]; }
wait_for 60 coalesced || bad "10 changes, 8 slow watchers: 72 lists skipped, got $(metric oversub_deviceplugin_lists_coalesced_total)"
buf=$(metric oversub_deviceplugin_watch_buffered_bytes)
expect "each slow watcher holds at most one list" True "$($PY -c "print($buf <= 8 * $lb)")"
rss1=$(rss)
# RSS as well, loosely (allocators, and ASan's quarantine, keep freed memory): a copy per change
# would be 10 lists per watcher; this allows half that
expect "memory: not a list per change ($rss0 -> $rss1 KiB, list $lb bytes)" True "$($PY -c "print(($rss1 - $rss0) * 1024 < 8 * $lb * 5)")"
expect "a ninth watcher is refused" "watch ended RESOURCE_EXHAUSTED" "$(timeout 20 $PY "$SI" watch "$KD" 1 | head -1)"
kill $STPID
wait $STPID 2>/dev/null
none() { [ "$(metric oversub_deviceplugin_watchers)" = 0 ]; }
wait_for 30 none || bad "the stuck watchers' streams go with their connection: $(metric oversub_deviceplugin_watchers)"
expect "and a watcher is served again" "devices 260965" "$(timeout 20 $PY "$SI" watch "$KD" 1 | head -1 | cut -d' ' -f1-2)"
kill $DPID
wait $DPID 2>/dev/null

if grep -l "Sanitizer" "$D/err" "$D/err8" >/dev/null 2>&1; then bad "a sanitizer spoke: $(grep -h -A5 Sanitizer "$D/err" "$D/err8" | head -20)"; else ok; fi

echo "deviceplugin: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
