#!/usr/bin/env bash
# test_relocate.sh - a suspended CUDA job resumed on another GPU (suspend.relocate), with real
# processes and no GPU: oversubd on two "NVML" GPUs (the fake libnvidia-ml.so.1, two UUIDs) and
# the fake CUDA driver as a CUDA 13.0 one (its restore remaps GPUs) that knows the same UUIDs and
# honours CUDA_VISIBLE_DEVICES. A P1 PyTorch-like job (tests/fakes/fake_torch.py, method cuda,
# relocate) runs on GPU 0; a batch job nobody may suspend fills GPU 1. A P0 arrival on GPU 0
# suspends the job (its checkpoint leaves the device). The P0 stays; the filler is released:
# the filler's memory stays counted (as system memory) until NVML shows its process gone; then
# the job's own GPU has no room, GPU 1 has, and the engine relocates it there. oversubd restores
# the checkpoint with the driver's remap (GPU 0 <-> GPU 1): the same process runs on, its bytes
# intact, its memory now on the fake driver's device 1, and nothing was evicted.
# The fake NVML's per-process lines are this script's (a real NVML sees the process move).
# Each wait is for the event it checks, bounded so a failure says so.
# Usage: test_relocate.sh OVERSUBD FAKE_LIBCUDA_DIR LIBNVIDIA_ML
set -u
bin=$(realpath "$1")
fakedir=$(realpath "$2")
nvml=$(realpath "$3")
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3
U0=GPU-8f4022ba-e0cb-1298-286e-225c953a7feb
U1=GPU-5449fdd5-fb83-f4ed-37a3-ea1057d82160
export FAKE_CUDA_STATE=$tmp/cuda.state FAKE_CUDA_MEM_MIB=40960 FAKE_CUDA_DEVICES=2
export FAKE_CUDA_UUIDS=$U0,$U1 FAKE_CUDA_DRIVER_VERSION=13000
export FAKE_NVML_FILE=$tmp/gpus
nvml_file() { # the processes' lines: "UUID PID MIB" each (a checkpointed one has none); a
    # device's used memory is its processes', as a real NVML's
    local u0=0 u1=0 p uu pp mib
    local -a procs=("$@")
    for p in "${procs[@]}"; do
        read -r uu pp mib <<<"$p"
        if [ "$uu" = "$U0" ]; then u0=$((u0 + mib)); else u1=$((u1 + mib)); fi
    done
    {
        echo "gpu $U0 Fake-GPU-40GB 40960 $u0 0"
        echo "gpu $U1 Fake-GPU-40GB 40960 $u1 0"
        for p in "${procs[@]}"; do echo "proc $p"; done
    } >"$FAKE_NVML_FILE.new"
    mv "$FAKE_NVML_FILE.new" "$FAKE_NVML_FILE"
}
nvml_file
D=$tmp/d
mkdir -p "$D"
cat >"$D/c.yaml" <<EOF
allow_root_services: true
cuda_lib: $fakedir/libcuda.so.1
suspend_host_mib: 65536
suspend_timeout_ms: 8000
tick_ms: 100
poll_ms: 100
EOF
"$bin" --config "$D/c.yaml" --listen 127.0.0.1:0 --socket "$D/s.sock" --state "$D/st/db" \
    --gpus nvml --nvml-lib "$nvml" --ratio 2.0 >"$D/out" 2>"$D/err" &
DPID=$!
pids+=($DPID)
for _ in $(seq 1 1200); do
    [ -S "$D/s.sock" ] && grep -q "listening on http" "$D/out" 2>/dev/null && break
    sleep 0.05
done
[ -S "$D/s.sock" ] || { echo "oversubd did not start: $(cat "$D/err")"; exit 1; }
api() { curl -s --unix-socket "$D/s.sock" -X "$1" "http://x$2" ${3:+-d "$3"}; }
code() { curl -s -o "$tmp/body" -w '%{http_code}' --unix-socket "$D/s.sock" -X "$1" "http://x$2" ${3:+-d "$3"}; }
field() { api GET "/v1/services/$1" | json "$2" 2>/dev/null; }
wait_for() { local end=$((SECONDS + $1)); shift; while [ "$SECONDS" -lt "$end" ]; do "$@" && return 0; sleep 0.05; done; "$@"; }
state_is() { [ "$(field "$1" 'd["state"]')" = "$2" ]; }
dev_mib() { # what the fake driver's device $1 holds, MiB
    $py -c "
import ctypes; c=ctypes.CDLL('$fakedir/libcuda.so.1'); u=ctypes.c_ulonglong(); p=ctypes.c_ulonglong()
print(c.fakecuda_stats($1, ctypes.byref(u), ctypes.byref(p)) or u.value >> 20)"
}

# ---- the job on GPU 0, a filler on GPU 1 ----
env_json='{"FAKE_CUDA_STATE":"'$FAKE_CUDA_STATE'","FAKE_CUDA_MEM_MIB":"40960","FAKE_CUDA_DEVICES":"2",
 "FAKE_CUDA_UUIDS":"'$FAKE_CUDA_UUIDS'","FAKE_CUDA_DRIVER_VERSION":"13000","LD_LIBRARY_PATH":"'$fakedir'"}'
expect "the torch job, relocatable" 201 "$(code POST /v1/services '{"id":"train","class":"batch","vram":"16000MiB",
 "command":["'$py'","'$here'/tests/fakes/fake_torch.py","--mib","15000","--status","'$tmp'/torch.status",
  "--cuda-lib","'$fakedir'/libcuda.so.1"],"env":'"$env_json"',"suspend":{"method":"cuda","relocate":true}}')"
steps() { sed -n 's/^steps=\([0-9]*\).*/\1/p' "$tmp/torch.status" 2>/dev/null; }
torch_up() { [ -n "$(steps)" ] && [ "$(steps)" -gt 2 ]; }
wait_for 30 torch_up || bad "the torch job did not run: $(cat "$D"/st/logs/train* 2>/dev/null | tail -5)"
api POST /v1/services/train/ready '{}' >/dev/null
tpid=$(field train 'd["process"]["pid"]')
expect "the service shows it relocatable" True "$(field train 'd["spec"]["suspend"].get("relocate")' 2>/dev/null || api GET /v1/services/train | json 'd.get("suspend", {}).get("relocate")')"
expect "relocate for a service oversubd does not start" 422 "$(code POST /v1/services '{"id":"ext","class":"batch","vram":"1000MiB","suspend":{"method":"cuda","relocate":true}}')"
grep -q "field 'suspend.relocate' is for services oversubd starts (give 'command')" "$tmp/body" && ok || bad "the refusal says why: $(cat "$tmp/body")"

g=$(field train 'd["placement"][0]["gpu"]')
expect "the job on GPU 0" 0 "$g"
expect "the job's memory on the driver's device 0" 15000 "$(dev_mib 0)"
nvml_file "$U0 $tpid 15000"
# it sees every GPU, its own first (the driver remaps only such a process)
expect "its CUDA_VISIBLE_DEVICES" "$U0,$U1" "$(tr '\0' '\n' <"/proc/$tpid/environ" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')"
expect "a filler on GPU 1" 201 "$(code POST /v1/services '{"id":"fill","class":"batch","vram":"30000MiB",
 "command":["'$py'","'$here'/tests/fakes/fake_torch.py","--mib","29000","--status","'$tmp'/fill.status",
  "--cuda-lib","'$fakedir'/libcuda.so.1"],"env":'"$env_json"'}')"
expect "the filler on GPU 1" 1 "$(field fill 'd["placement"][0]["gpu"]')"
fill_up() { grep -q "intact=1" "$tmp/fill.status" 2>/dev/null; }
wait_for 30 fill_up || bad "the filler did not run: $(cat "$D"/st/logs/fill* 2>/dev/null | tail -5)"
api POST /v1/services/fill/ready '{}' >/dev/null
fpid=$(field fill 'd["process"]["pid"]')
expect "the filler's memory on the driver's device 1" 29000 "$(dev_mib 1)"
# NVML shows its memory at once: the monitor reads the shim's count beside it, so the memory is
# the filler's, not system memory (read late, it made a pressure that could evict the filler)
nvml_file "$U0 $tpid 15000" "$U1 $fpid 29000"
fill_seen() { [ "$(field fill 'd["used_mib"]')" = 29000 ]; }
wait_for 30 fill_seen || bad "the filler's use not seen: $(field fill 'd["used_mib"]')"

# ---- a P0 on GPU 0: the job suspended, not killed ----
expect "the P0 arrives" 202 "$(code POST /v1/services '{"id":"web","class":"online","vram":"30000MiB"}')"
ckpt_done() { [ "$(dev_mib 0)" = 0 ]; }
wait_for 30 ckpt_done || bad "its checkpoint did not leave the device: $(dev_mib 0) MiB; $(tail -5 "$D/err")"
nvml_file "$U1 $fpid 29000" # as NVML sees it then: the process gone from GPU 0
suspended() { state_is train suspended; }
wait_for 30 suspended || bad "the job was not suspended: $(field train 'd["state"]'); $(tail -5 "$D/err")"
expect "the P0 on GPU 0" 0 "$(field web 'd["placement"][0]["gpu"]')"
frozen=$(steps)

# ---- the filler released: its process drains (NVML still shows its memory), so GPU 1 is not
# free yet and the job stays suspended; once NVML shows it gone, GPU 1 has room, the job's own
# GPU does not: relocated ----
expect "the filler released" 200 "$(code DELETE /v1/services/fill)"
expect "no relocation into memory still in use" suspended "$(field train 'd["state"]')"
expect "the filler's memory counted as system until its process leaves it" 29000 "$(api GET /v1/pool | json 'd["gpus"][1]["system_mib"]')"
fgone() { ! kill -0 "$fpid" 2>/dev/null; }
wait_for 30 fgone || bad "the filler's process did not end with its release"
expect "still suspended while NVML shows the filler's memory" suspended "$(field train 'd["state"]')"
nvml_file
running() { state_is train running; }
wait_for 30 running || bad "the job did not resume: $(field train 'd["state"]'); $(tail -8 "$D/err")"
expect "the job now on GPU 1" 1 "$(field train 'd["placement"][0]["gpu"]')"
expect "the same process" "$tpid" "$(field train 'd["process"]["pid"]')"
expect "its memory on the driver's device 1" 15000 "$(dev_mib 1)"
expect "none left on device 0" 0 "$(dev_mib 0)"
nvml_file "$U1 $tpid 15000"
moved() { [ "$(steps)" -gt "$((frozen + 2))" ]; }
wait_for 30 moved || bad "the job did not work again: $(cat "$tmp/torch.status")"
grep -q "intact=1" "$tmp/torch.status" && ok || bad "the job's bytes changed: $(cat "$tmp/torch.status")"
ev=$(api GET "/v1/events?since=0")
grep -q '"reason": *"relocate"' <<<"$ev" && ok || bad "no relocate event: $(grep -o '"kind": *"wake"[^}]*' <<<"$ev" | head -3)"
grep -q "its checkpoint restored onto another GPU (a remap)" "$D/err" && ok || bad "the log does not say the restore remapped: $(grep train "$D/err" | tail -4)"
expect "nothing evicted" "1 0" "$(api GET /v1/pool | json '"%d %d" % (d["suspends"], d["evictions"])')"
st=$(field web 'd["state"]')
case "$st" in loading|running) ok ;; *) bad "the P0 was touched: $st" ;; esac
[ "$fail" -eq 0 ] || { echo "--- events"; api GET "/v1/events?since=0" | json '"\n".join("%s %s %s %s" % (e.get("kind"), e.get("reason"), e.get("service"), e.get("message", e.get("msg", ""))[:200]) for e in d["events"])'; }
api DELETE /v1/services/train >/dev/null
api DELETE /v1/services/web >/dev/null
gone() { ! kill -0 "$tpid" 2>/dev/null; }
wait_for 30 gone || bad "the job's process did not end with its release"

echo "test_relocate: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
