#!/usr/bin/env bash
# test_nvml.sh - oversubd on "real" GPUs: the fake libnvidia-ml.so.1 (tests/fakes/fake_nvml.c)
# reads its devices from a file this script rewrites. Checks: the pool comes from NVML (names,
# UUIDs, the 1 GiB driver margin), memory no service reports becomes system memory and causes
# pressure, a GPU gone across a restart is marked lost, and every way NVML can be missing.
# Usage: test_nvml.sh PATH/TO/oversubd PATH/TO/libnvidia-ml.so.1
set -u
bin=$(realpath "$1")
lib=$(realpath "$2")
. "$(dirname "$0")/lib.sh"
export FAKE_NVML_FILE=$tmp/gpus
printf 'poll_ms: 100\ntick_ms: 100\n' >"$tmp/conf.yaml"

start() { # extra args...; sets PORT and PID
    # the last daemon's lines are not this one's: the new files are made by the subshell, maybe
    # after the loop below first looks (a loaded machine), so the old ones go first
    rm -f "$tmp/out" "$tmp/err"
    ("$bin" --config "$tmp/conf.yaml" --listen 127.0.0.1:0 --state "$tmp/state.db" --socket "" \
        --ratio 1.5 "$@" >"$tmp/out" 2>"$tmp/err") &
    PID=$!
    pids+=("$PID")
    PORT=""
    for _ in $(seq 1 1200); do
        PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/out" 2>/dev/null | head -1 | sed 's/.*://')
        [ -n "$PORT" ] && break
        sleep 0.05
    done
    [ -n "$PORT" ] || { bad "daemon did not start: $(cat "$tmp/err")"; return 1; }
}
U() { echo "http://127.0.0.1:$PORT$1"; }
pool() { curl -s "$(U /v1/pool)"; }
wait_for() { # python expression on /v1/pool, tries
    for _ in $(seq 1 60); do
        [ "$(pool | json "$1")" = True ] && return 0
        sleep 0.1
    done
    return 1
}

# ---- the pool comes from NVML ----
cat >"$FAKE_NVML_FILE" <<G
gpu GPU-aaaa-1111 NVIDIA-A100-SXM4-80GB 81920 500 10
gpu GPU-bbbb-2222 NVIDIA-A100-SXM4-80GB 81920 700 0
G
start --gpus nvml --nvml-lib "$lib" || exit 1
grep -q "2 GPU(s) from NVML" "$tmp/err" && ok || bad "start-up does not say where the GPUs came from: $(cat "$tmp/err")"
pool >"$tmp/p"
expect "two gpus" 2 "$(json 'len(d["gpus"])' <"$tmp/p")"
expect "uuid" GPU-aaaa-1111,GPU-bbbb-2222 "$(json '",".join(g["uuid"] for g in d["gpus"])' <"$tmp/p")"
expect "name" NVIDIA-A100-SXM4-80GB "$(json 'd["gpus"][0]["name"]' <"$tmp/p")"
expect "vram" 81920 "$(json 'd["gpus"][0]["vram_mib"]' <"$tmp/p")"
# the oversell ratio applies to the whole card; the driver's 1 GiB margin is kept free
expect "logical" 122880 "$(json 'd["gpus"][0]["logical_mib"]' <"$tmp/p")"
wait_for '[g["system_mib"] for g in d["gpus"]] == [500, 700]' && ok || bad "NVML memory not seen as system memory: $(pool)"
uuids=(GPU-aaaa-1111 GPU-bbbb-2222)
setused() { sed -i "s/^gpu $1 \(\S*\) 81920 [0-9]*/gpu $1 \1 81920 $2/" "$FAKE_NVML_FILE"; }
gpu_of() { curl -s "$(U /v1/services/$1)" | json 'd["placement"][0]["gpu"]'; }

# ---- memory no service reports is system memory, and it presses ----
expect "b1" 201 "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$(U /v1/services)" -d '{"id":"b1","class":"batch","vram":"40GiB","min_vram":"20GiB"}')"
g=$(gpu_of b1)
curl -s -X POST "$(U /v1/services/b1/ready)" >/dev/null
curl -s -X PUT "$(U /v1/services/b1/usage)" -d '{"vram_mib":40960}' >/dev/null
sys0=$([ "$g" = 0 ] && echo 500 || echo 700)
setused "${uuids[$g]}" $((40960 + sys0))
wait_for "d['gpus'][$g]['system_mib'] == $sys0 and d['gpus'][$g]['used_mib'] == $((40960 + sys0))" && ok || bad "the service's usage is counted twice: $(pool | json "d['gpus'][$g]")"
since=$(curl -s "$(U '/v1/events?since=0')" | json 'd["next"]')
# another process takes 38000 MiB: 40960 + 38000 + sys > 80896 usable
setused "${uuids[$g]}" $((40960 + sys0 + 38000))
wait_for "d['gpus'][$g]['system_mib'] == $((sys0 + 38000))" && ok || bad "the other process is not seen: $(pool | json "d['gpus'][$g]")"
curl -s "$(U "/v1/events?since=$since&wait=5")" >"$tmp/ev"
expect "pressure degrades the batch service" True "$(json 'any(e["kind"] in ("degrade","evict") and e.get("service")=="b1" for e in d["events"])' <"$tmp/ev")"
expect "healthz" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$(U /healthz)")"
setused "${uuids[$g]}" $((20480 + sys0))

# ---- a service that names its process: NVML's memory for that PID is its usage ----
expect "p1" 201 "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$(U /v1/services)" -d '{"id":"p1","class":"online","vram":"20GiB"}')"
gp=$(gpu_of p1)
expect "ready with a bad pid" 422 "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$(U /v1/services/p1/ready)" -d '{"pid":"abc"}')"
expect "ready with pid" 200 "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$(U /v1/services/p1/ready)" -d '{"pid":4242}')"
expect "pid shown" 4242 "$(curl -s "$(U /v1/services/p1)" | json 'd["pid"]')"
before=$(pool | json "d['gpus'][$gp]['used_mib']")
sysb=$(pool | json "d['gpus'][$gp]['system_mib']")
echo "proc ${uuids[$gp]} 4242 15000" >>"$FAKE_NVML_FILE"
setused "${uuids[$gp]}" $((before + 15000))
wait_for "d['gpus'][$gp]['used_mib'] == $((before + 15000))" && ok || bad "process memory not seen: $(pool | json "d['gpus'][$gp]")"
expect "the process's memory is p1's usage" 15000 "$(curl -s "$(U /v1/services/p1)" | json 'd["used_mib"]')"
expect "not system memory" "$sysb" "$(pool | json "d['gpus'][$gp]['system_mib']")"
kill -TERM "$PID"
wait "$PID" 2>/dev/null
sed -i "s/^proc \(\S*\) 4242 15000/proc \1 4242 16000/" "$FAKE_NVML_FILE"
setused "${uuids[$gp]}" $((before + 16000))
start --gpus nvml --nvml-lib "$lib" || exit 1
for _ in $(seq 1 50); do
    [ "$(curl -s "$(U /v1/services/p1)" | json 'd["used_mib"]')" = 16000 ] && break
    sleep 0.1
done
expect "the PID survives a restart" 16000 "$(curl -s "$(U /v1/services/p1)" | json 'd["used_mib"]')"

# ---- a release while its process still holds memory: counted as system memory until NVML
# shows it gone ("measured"), so nothing is started into it ----
sysp=$(pool | json "d['gpus'][$gp]['system_mib']")
usedp=$(pool | json "d['gpus'][$gp]['used_mib']")
expect "p1 released" 200 "$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$(U /v1/services/p1)")"
expect "its memory stays counted (system)" $((sysp + 16000)) "$(pool | json "d['gpus'][$gp]['system_mib']")"
curl -s "$(U '/v1/events?since=0')" | grep -q "released p1 (online, [0-9]* MiB held) from GPU $gp; what it used stays counted as system memory until its process is seen to leave it" && ok || bad "the release event does not say so"
sed -i "/^proc \S* 4242 16000/d" "$FAKE_NVML_FILE"
setused "${uuids[$gp]}" $((usedp - 16000))
wait_for "d['gpus'][$gp]['system_mib'] == $sysp" && ok || bad "the memory was not freed once NVML showed it gone: $(pool | json "d['gpus'][$gp]")"
# ---- NVML unreadable: /healthz says since when and why; then it answers again ----
mv "$FAKE_NVML_FILE" "$FAKE_NVML_FILE.away"
hz() { curl -s "$(U /healthz)" | json 'd.get("nvml", "")'; }
for _ in $(seq 1 100); do case "$(hz)" in unreadable*) break ;; esac; sleep 0.1; done
case "$(hz)" in unreadable\ since\ *) ok ;; *) bad "healthz does not say NVML is unreadable: $(curl -s "$(U /healthz)")" ;; esac
mv "$FAKE_NVML_FILE.away" "$FAKE_NVML_FILE"
for _ in $(seq 1 100); do [ "$(hz)" = ok ] && break; sleep 0.1; done
expect "healthz: NVML answers again" ok "$(hz)"

# ---- an external service evicted: exited once NVML shows its process's memory gone ----
expect "e1" 201 "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$(U /v1/services)" -d '{"id":"e1","class":"batch","vram":"5GiB"}')"
ge=$(gpu_of e1)
curl -s -X POST "$(U /v1/services/e1/ready)" -d "{\"pid\":$$}" >/dev/null
beforee=$(pool | json "d['gpus'][$ge]['used_mib']")
echo "proc ${uuids[$ge]} $$ 3000" >>"$FAKE_NVML_FILE"
setused "${uuids[$ge]}" $((beforee + 3000))
for _ in $(seq 1 50); do
    [ "$(curl -s "$(U /v1/services/e1)" | json 'd["used_mib"]')" = 3000 ] && break
    sleep 0.1
done
expect "e1's memory seen" 3000 "$(curl -s "$(U /v1/services/e1)" | json 'd["used_mib"]')"
curl -s -X POST "$(U /v1/gpus/$ge/cordon)" >/dev/null
curl -s -X POST "$(U /v1/gpus/$ge/drain)" >/dev/null
expect "e1 draining" draining "$(curl -s "$(U /v1/services/e1)" | json 'd["state"]')"
sed -i "/^proc \S* $$ 3000/d" "$FAKE_NVML_FILE"
setused "${uuids[$ge]}" "$beforee"
for _ in $(seq 1 50); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$(U /v1/services/e1)")" = 404 ] && break
    sleep 0.1
done
expect "e1 exited (its process still lives, its memory is gone)" 404 "$(curl -s -o /dev/null -w '%{http_code}' "$(U /v1/services/e1)")"
curl -s -X POST "$(U /v1/gpus/$ge/uncordon)" >/dev/null

# ---- a GPU that is gone after a restart is lost; its services go back to the queue ----
expect "b2" 201 "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$(U /v1/services)" -d '{"id":"b2","class":"batch","vram":"30GiB","resumable":true,"on_evict":"requeue"}')"
g2=$(gpu_of b2)
kill -TERM "$PID"
wait "$PID" 2>/dev/null
sed -i "/${uuids[$g2]}/d" "$FAKE_NVML_FILE"
start --gpus nvml --nvml-lib "$lib" || exit 1
grep -q "GPU $g2 (${uuids[$g2]}) is not among" "$tmp/err" && ok || bad "the lost GPU is not logged: $(cat "$tmp/err")"
expect "gpu lost" True "$(pool | json "d['gpus'][$g2]['lost']")"
curl -s "$(U /v1/services/b2)" >"$tmp/b2"
expect "gpu_lost event" True "$(curl -s "$(U '/v1/events?since=0')" | json 'any(e["kind"] == "gpu_lost" for e in d["events"])')"
expect "b2 left the lost GPU" True "$(json "d['state'] == 'queued' or all(p['gpu'] != $g2 for p in d.get('placement', []))" <"$tmp/b2")"

# ---- a GPU that vanishes while running is lost too ----
kill -TERM "$PID"
wait "$PID" 2>/dev/null
rm -f "$tmp/state.db"*
printf 'gpu GPU-c 1 40960 0 0\ngpu GPU-d 1 40960 0 0\n' >"$FAKE_NVML_FILE"
start --gpus auto --nvml-lib "$lib" || exit 1
grep -q "2 GPU(s) from NVML" "$tmp/err" && ok || bad "--gpus auto does not use NVML: $(cat "$tmp/err")"
printf 'gpu GPU-c 1 40960 0 0\n' >"$FAKE_NVML_FILE"
wait_for 'd["gpus"][1]["lost"]' && ok || bad "a GPU gone while running is not lost: $(pool)"
grep -q "GPU 1 (GPU-d) disappeared" "$tmp/err" && ok || bad "the disappearance is not logged"
kill -TERM "$PID"
wait "$PID" 2>/dev/null

# ---- no NVML ----
rm -f "$tmp/state.db"*
start --gpus auto --nvml-lib "$tmp/none.so" || exit 1
grep -q "no NVIDIA driver" "$tmp/err" && ok || bad "auto without a driver does not say so: $(cat "$tmp/err")"
expect "simulated 8 GPUs" 8 "$(pool | json 'len(d["gpus"])')"
kill -TERM "$PID"
wait "$PID" 2>/dev/null
# a simulated state asked to run on NVML: refused (its services were placed on another pool)
"$bin" --listen 127.0.0.1:0 --state "$tmp/state.db" --socket "" --gpus nvml --nvml-lib "$lib" >/dev/null 2>"$tmp/err2"
expect "--gpus nvml on a simulated state fails" 1 "$?"
grep -q "a simulated pool; --gpus nvml needs a state of its own" "$tmp/err2" && ok || bad "no clear error: $(cat "$tmp/err2")"
rm -f "$tmp/state.db"*
"$bin" --listen 127.0.0.1:0 --state "$tmp/state.db" --socket "" --gpus nvml --nvml-lib "$tmp/none.so" >/dev/null 2>"$tmp/err2"
expect "--gpus nvml without a driver fails" 1 "$?"
grep -q "gpus nvml:" "$tmp/err2" && ok || bad "no clear error: $(cat "$tmp/err2")"
# the library answers but with no devices
: >"$FAKE_NVML_FILE"
"$bin" --listen 127.0.0.1:0 --state "$tmp/state.db" --socket "" --gpus nvml --nvml-lib "$lib" >/dev/null 2>"$tmp/err2"
expect "no GPU fails" 1 "$?"
grep -q "no GPU" "$tmp/err2" && ok || bad "no clear error for zero GPUs: $(cat "$tmp/err2")"
# an NVML state where the driver is gone: refused, nothing lost
rm -f "$tmp/state.db"*
printf 'gpu GPU-e 1 40960 0 0\n' >"$FAKE_NVML_FILE"
start --gpus nvml --nvml-lib "$lib" || exit 1
curl -s -X POST "$(U /v1/services)" -d '{"id":"keep","class":"online","vram":"10GiB"}' >/dev/null
kill -TERM "$PID"
wait "$PID" 2>/dev/null
"$bin" --listen 127.0.0.1:0 --state "$tmp/state.db" --socket "" --gpus auto --nvml-lib "$tmp/none.so" >/dev/null 2>"$tmp/err2"
expect "nvml state without a driver refused" 1 "$?"
grep -q "NVML does not answer" "$tmp/err2" && ok || bad "no clear error: $(cat "$tmp/err2")"
start --gpus nvml --nvml-lib "$lib" || exit 1
expect "the service survived" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$(U /v1/services/keep)")"

# ---- a managed service sees its GPUs by UUID ----
kill -TERM "$PID"
wait "$PID" 2>/dev/null
printf 'gpu GPU-m0 A100 81920 0 0\ngpu GPU-m1 A100 81920 0 0\n' >"$FAKE_NVML_FILE"
printf 'allow_root_services: true\ntick_ms: 100\n' >"$tmp/conf2.yaml"
("$bin" --config "$tmp/conf2.yaml" --listen 127.0.0.1:0 --state "$tmp/m.db" --socket "$tmp/m.sock" \
    --gpus nvml --nvml-lib "$lib" >"$tmp/mout" 2>"$tmp/merr") &
MPID=$!
pids+=("$MPID")
for _ in $(seq 1 1200); do [ -S "$tmp/m.sock" ] && break; sleep 0.05; done
curl -s --unix-socket "$tmp/m.sock" -X POST http://x/v1/services -d '{"id":"m1","class":"batch","vram":"100GiB","gpus":2,"command":["/bin/sleep","30"]}' >/dev/null
mp=""
for _ in $(seq 1 50); do
    mp=$(curl -s --unix-socket "$tmp/m.sock" http://x/v1/services/m1 | json 'd.get("process", {}).get("pid", "")')
    [ -n "$mp" ] && break
    sleep 0.1
done
expect "CUDA_VISIBLE_DEVICES holds the UUIDs" "CUDA_VISIBLE_DEVICES=GPU-m0,GPU-m1" "$(tr '\0' '\n' <"/proc/$mp/environ" 2>/dev/null | grep ^CUDA_VISIBLE_DEVICES=)"
curl -s --unix-socket "$tmp/m.sock" -X DELETE http://x/v1/services/m1 >/dev/null
kill -TERM "$MPID"
wait "$MPID" 2>/dev/null

echo "test_nvml: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
