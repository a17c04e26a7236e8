#!/usr/bin/env bash
# test_daemon.sh - the real oversubd on loopback (port 0) in a temporary folder: every endpoint
# and its errors, a restart, a kill -9 in the middle of concurrent mutations, promtool on
# /metrics, the admin token, bad configuration and a foreign database.
# Usage: test_daemon.sh PATH/TO/oversubd
set -u
bin=$(realpath "$1")
cli=${2:+$(realpath "$2")}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
# curl as the API's clients call it: JSON declared (changes without it are refused: CSRF)
curl() {
    local a
    for a in "$@"; do
        case "$a" in [Cc]ontent-[Tt]ype:*) command curl "$@"; return ;; esac
    done
    command curl -H 'Content-Type: application/json' "$@"
}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
expect() { # name, want, got
    if [ "$2" = "$3" ]; then ok; else bad "$1: got '$3', want '$2'"; fi
}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
wait_for() { # seconds, command...: the event it waits for, or a failure after the deadline
    local n=$(($1 * 20))
    shift
    for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.05; done
    return 1
}

start() { # dir, extra args... ; sets PORT and PID
    local dir=$1
    shift
    mkdir -p "$dir"
    rm -f "$dir/out" "$dir/err" # the last daemon's lines are not this one's
    (cd "$dir" && exec "$bin" --listen 127.0.0.1:0 --state "$dir/state.db" --socket "$dir/d.sock" \
        --gpus sim:8x81920 --ratio 1.5 --tick-ms 200 "$@" >"$dir/out" 2>"$dir/err") &
    PID=$!
    pids+=("$PID")
    PORT=""
    for _ in $(seq 1 1200); do
        PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$dir/out" 2>/dev/null | head -1 | sed 's/.*://')
        [ -n "$PORT" ] && break
        sleep 0.05
    done
    [ -n "$PORT" ] || { bad "daemon did not start: $(cat "$dir/err")"; return 1; }
}
U() { echo "http://127.0.0.1:$PORT$1"; }
code() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }

# ---- start, health ----
start "$tmp/a" || exit 1
expect "healthz" 200 "$(code "$(U /healthz)")"
expect "healthz invariants" ok "$(json 'd["invariants"]' <"$tmp/body")"
expect "unix socket" 200 "$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$tmp/a/d.sock" http://x/healthz)"
expect "socket mode" 600 "$(stat -c %a "$tmp/a/d.sock")"
expect "state mode" 600 "$(stat -c %a "$tmp/a/state.db")"

# ---- DESIGN.md's scenario, step 1 ----
expect "submit agent-online" 201 "$(code -X POST "$(U /v1/services)" -d '{"id":"agent-online","class":"online","vram":"160GiB","gpus":2,"compute_pct":100}')"
expect "submit batch-analysis" 201 "$(code -X POST "$(U /v1/services)" -d '{"id":"batch-analysis","class":"batch","vram":"120GiB","gpus":2,"min_vram":"60GiB"}')"
expect "submit model-eval" 201 "$(code -X POST "$(U /v1/services)" -d '{"id":"model-eval","class":"experiment","vram":"100GiB","gpus":2,"min_vram":"40GiB"}')"
expect "submit new-service" 201 "$(code -X POST "$(U /v1/services)" -d '{"id":"new-service","class":"batch","vram_mib":81920,"gpus":1}')"
code "$(U /v1/pool)" >/dev/null
expect "held 71.9%" 0.719 "$(json 'round(d["utilization"]["held"], 3)' <"$tmp/body")"
expect "logical 47.9%" 0.479 "$(json 'round(d["utilization"]["logical"], 3)' <"$tmp/body")"
[ "$fail" -gt 0 ] && cat "$tmp/body"
expect "physical = held" True "$(json 'd["utilization"]["physical"] == d["utilization"]["held"]' <"$tmp/body")"

# ---- retries, conflicts, errors ----
expect "same spec again" 200 "$(code -X POST "$(U /v1/services)" -d '{"id":"new-service","class":"batch","vram_mib":81920,"gpus":1}')"
expect "other spec, same id" 409 "$(code -X POST "$(U /v1/services)" -d '{"id":"new-service","class":"batch","vram_mib":1000}')"
expect "conflict code" spec_conflict "$(json 'd["error"]["code"]' <"$tmp/body")"
expect "unknown field" 400 "$(code -X POST "$(U /v1/services)" -d '{"id":"x","vram_mib":5,"colour":"red"}')"
expect "unknown field named" True "$(json '"colour" in d["error"]["message"]' <"$tmp/body")"
expect "malformed json" 400 "$(code -X POST "$(U /v1/services)" -d '{"id": ')"
expect "malformed position" True "$(json '"column" in d["error"]["message"]' <"$tmp/body")"
head -c 70000 /dev/zero | tr '\0' 'a' >"$tmp/big"
expect "body too large" 413 "$(code -X POST "$(U /v1/services)" --data-binary @"$tmp/big")"
expect "bad id" 422 "$(code -X POST "$(U /v1/services)" -d '{"id":"Bad_Id","vram_mib":5}')"
expect "negative vram" 422 "$(code -X POST "$(U /v1/services)" -d '{"id":"neg","vram_mib":-5}')"
expect "too big" 409 "$(code -X POST "$(U /v1/services)" -d '{"id":"huge","class":"online","vram":"2000GiB"}')"
expect "unknown service" 404 "$(code "$(U /v1/services/nobody)")"
expect "unknown endpoint" 404 "$(code "$(U /v2/things)")"
expect "bad method" 405 "$(code -X DELETE "$(U /v1/pool)")"
expect "dry run" 200 "$(code -X POST "$(U '/v1/services?dry_run=1')" -d '{"id":"probe","class":"online","vram":"40GiB"}')"
expect "dry run changes nothing" 404 "$(code "$(U /v1/services/probe)")"
# GET /v1/pool's text is cached between commands: a command must show at once
g1=$(curl -s "$(U /v1/pool)" | json 'd["totals"]["granted_mib"]')
curl -s -o /dev/null -X POST "$(U /v1/services)" -d '{"id":"cache-probe","class":"experiment","vram_mib":1000}'
g2=$(curl -s "$(U /v1/pool)" | json 'd["totals"]["granted_mib"]')
expect "pool follows a submit" 1000 "$((g2 - g1))"
curl -s -o /dev/null -X DELETE "$(U /v1/services/cache-probe)"
expect "pool follows a release" "$g1" "$(curl -s "$(U /v1/pool)" | json 'd["totals"]["granted_mib"]')"

# ---- usage, ready, pending, ack ----
expect "ready" 200 "$(code -X POST "$(U /v1/services/model-eval/ready)")"
expect "usage" 200 "$(code -X PUT "$(U /v1/services/model-eval/usage)" -d '{"vram_mib":90112}')"
expect "usage per gpu" 200 "$(code -X PUT "$(U /v1/services/batch-analysis/usage)" -d '{"gpus":[{"gpu":2,"vram_mib":57344},{"gpu":3,"vram_mib":57344}]}')"
expect "negative usage" 422 "$(code -X PUT "$(U /v1/services/model-eval/usage)" -d '{"vram_mib":-1}')"
expect "ack unasked" 409 "$(code -X POST "$(U /v1/services/model-eval/ack)")"
curl -s -X POST "$(U /v1/services/agent-online/ready)" >/dev/null
curl -s -X POST "$(U /v1/services/new-service/ready)" >/dev/null
curl -s -X POST "$(U /v1/services/batch-analysis/ready)" >/dev/null
curl -s -X PUT "$(U /v1/services/new-service/usage)" -d '{"vram_mib":61440}' >/dev/null
curl -s -X POST "$(U /v1/services)" -d '{"id":"chat-1","class":"online","vram":"40GiB"}' >/dev/null
curl -s -X POST "$(U /v1/services)" -d '{"id":"chat-2","class":"online","vram":"40GiB"}' >/dev/null
last=$(curl -s "$(U '/v1/events?since=0')" | json 'd["next"]')
# a long poll returns as soon as an event happens
# the poll waits once oversubd has its request: curl traces it as sent ("=> Send header"; a GET
# has no body), and oversubd reads it before chat-3's, whose connection opens after it
(curl -s --trace-ascii "$tmp/poll.trace" "$(U "/v1/events?since=$last&wait=20")" >"$tmp/poll") &
poller=$!
wait_for 20 grep -q '^=> Send header' "$tmp/poll.trace" || bad "the long poll was not sent: $(cat "$tmp/poll.trace")"
expect "chat-3 pending" 202 "$(code -X POST "$(U /v1/services)" -d '{"id":"chat-3","class":"online","vram":"40GiB"}')"
expect "victim" model-eval "$(json 'd["decision"]["victims"][0]["service"]' <"$tmp/body")"
wait $poller
expect "long poll woke" True "$(json 'any(e["kind"]=="degrade" for e in d["events"])' <"$tmp/poll")"
expect "ack" 200 "$(code -X POST "$(U /v1/services/model-eval/ack)" -d '{"checkpoint":"step-12"}')"
expect "chat-3 starts" loading "$(curl -s "$(U /v1/services/chat-3)" | json 'd["state"]')"

# ---- pool and GPUs ----
expect "ratio" 200 "$(code -X PUT "$(U /v1/pool)" -d '{"ratio":"1.3"}')"
expect "ratio applied" 1.3 "$(json 'd["ratio"]' <"$tmp/body")"
expect "ratio precision" 422 "$(code -X PUT "$(U /v1/pool)" -d '{"ratio":1.2345}')"
expect "ratio unknown field" 400 "$(code -X PUT "$(U /v1/pool)" -d '{"ratio":1.3,"x":1}')"
expect "cordon" 200 "$(code -X POST "$(U /v1/gpus/7/cordon)")"
expect "cordoned" True "$(json 'd["gpus"][7]["cordoned"]' <"$tmp/body")"
expect "uncordon" 200 "$(code -X POST "$(U /v1/gpus/7/uncordon)")"
expect "drain" 200 "$(code -X POST "$(U /v1/gpus/6/drain)")"
expect "drained" draining "$(curl -s "$(U /v1/services/new-service)" | json 'd["state"]')"
expect "bad gpu" 404 "$(code -X POST "$(U /v1/gpus/99/cordon)")"
# an index past a long is not cut down to another GPU's (4294967297 was GPU 1)
cordoned=$(curl -s "$(U /v1/pool)" | json 'sum(g["cordoned"] for g in d["gpus"])')
expect "huge gpu index" 404 "$(code -X POST "$(U /v1/gpus/4294967297/cordon)")"
expect "gpu index beyond long" 404 "$(code -X POST "$(U /v1/gpus/99999999999999999999999/cordon)")"
expect "signed gpu index" 404 "$(code -X POST "$(U /v1/gpus/+1/cordon)")"
expect "nothing cordoned by them" "$cordoned" "$(curl -s "$(U /v1/pool)" | json 'sum(g["cordoned"] for g in d["gpus"])')"
expect "since beyond int64" 400 "$(code "$(U '/v1/events?since=99999999999999999999999')")"
expect "since not a number" 400 "$(code "$(U '/v1/events?since=12abc')")"
expect "exited" 200 "$(code -X POST "$(U /v1/services/new-service/exited)")"
expect "delete" 200 "$(code -X DELETE "$(U /v1/services/chat-2)")"
expect "deleted" 404 "$(code "$(U /v1/services/chat-2)")"

# ---- broken HTTP: refused with a 4xx/5xx, the daemon keeps serving ----
cat >"$tmp/broken.cases" <<'PY'
cases = {
    "garbage": b"HELLO\r\n\r\n",
    "unknown method": b"FOO /v1/pool HTTP/1.1\r\nHost: x\r\n\r\n",
    "huge header": b"GET /v1/pool HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 200000 + b"\r\n\r\n",
    "CL and TE": b"POST /v1/services HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two CL": b"POST /v1/services HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n{\"a\":",
    "negative CL": b"POST /v1/services HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    "bad chunk": b"POST /v1/services HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "no version": b"GET /v1/pool\r\n\r\n",
    "NUL in path": b"GET /v1/po\x00ol HTTP/1.1\r\nHost: x\r\n\r\n",
    "two equal CL, valid body": b"POST /v1/services HTTP/1.1\r\nHost: x\r\nContent-Length: 26\r\nContent-Length: 26\r\n\r\n{\"id\":\"smug\",\"vram_mib\":5}",
}
PY
python3 "$(dirname "$0")/rawhttp.py" "$PORT" "$tmp/broken.cases" >"$tmp/broken" 2>&1
grep -q BAD "$tmp/broken" && bad "broken HTTP: $(grep BAD "$tmp/broken")" || ok
expect "broken HTTP cases run" 10 "$(grep -c ' ok$' "$tmp/broken")"
expect "nothing smuggled into the state" 404 "$(code "$(U /v1/services/smug)")"
expect "alive after broken HTTP" 200 "$(code "$(U /healthz)")"
[ "$(curl -s "$(U /v1/services/agent-online)" | json 'd["state"]')" != "" ] && ok || bad "state lost after broken HTTP"

# ---- metrics ----
curl -s "$(U /metrics)" >"$tmp/metrics"
if command -v promtool >/dev/null; then
    if promtool check metrics <"$tmp/metrics" >"$tmp/promtool" 2>&1; then ok; else bad "promtool: $(cat "$tmp/promtool")"; fi
else
    echo "promtool missing: metrics checked for their families only"
fi
grep -q '^oversub_pool_utilization_ratio{kind="held"}' "$tmp/metrics" && ok || bad "metrics: no utilisation"
grep -q '^oversub_build_info{version="[0-9.]*",sqlite=' "$tmp/metrics" && ok || bad "metrics: no build info"
grep -q '^process_resident_memory_bytes [1-9]' "$tmp/metrics" && ok || bad "metrics: no process metrics"
grep -q '^oversub_gpu_vram_bytes{gpu="0"} 85899345920$' "$tmp/metrics" && ok || bad "metrics: sizes in bytes"
grep -q 'oversub_decisions_total{kind="degrade",level="experiment"} 1' "$tmp/metrics" && ok || bad "metrics: the degrade is not counted"
grep -q '^oversub_service_' "$tmp/metrics" && bad "metrics: per-service series without opting in" || ok
curl -s "$(U '/metrics?per_service=1')" >"$tmp/metrics2"
grep -q '^oversub_service_grant_bytes{service="agent-online",class="online"} 171798691840' "$tmp/metrics2" && ok || bad "metrics: opt-in per-service series missing"
if command -v promtool >/dev/null; then
    if promtool check metrics <"$tmp/metrics2" >"$tmp/promtool" 2>&1; then ok; else bad "promtool (per service): $(cat "$tmp/promtool")"; fi
fi

# ---- the oversub CLI against the daemon ----
if [ -n "$cli" ]; then
    C() { "$cli" --url "http://127.0.0.1:$PORT" "$@"; }
    C deploy cli-svc --class batch --vram 2GiB --min-vram 1GiB >"$tmp/c1" 2>&1
    expect "cli deploy" 0 "$?"
    grep -q "cli-svc: loading on GPU" "$tmp/c1" && ok || bad "cli deploy said: $(cat "$tmp/c1")"
    C deploy gw-svc --class batch --vram 1GiB --backend http://127.0.0.1:9 --backend http://127.0.0.1:10 --max-inflight 3 --max-queue 0 --queue-timeout 700 >/dev/null 2>&1
    expect "cli deploy with gateway settings" 0 "$?"
    expect "gateway settings kept" "2 3 0 700" "$(curl -s "$(U /v1/services/gw-svc)" | json '"%d %d %d %d" % (len(d["backends"]), d["max_inflight"], d["max_queue"], d["queue_timeout_ms"])')"
    C deploy gw-bad --class batch --vram 1GiB --backend ftp://x >/dev/null 2>&1
    expect "cli deploy with a bad backend" 1 "$?"
    C release gw-svc >/dev/null
    C deploy cli-svc --class batch --vram 3GiB >/dev/null 2>"$tmp/c2"
    expect "cli refused" 1 "$?"
    grep -q "spec_conflict" "$tmp/c2" && ok || bad "cli refusal said: $(cat "$tmp/c2")"
    C deploy >/dev/null 2>&1
    expect "cli usage error" 2 "$?"
    C deploy x --class batch --vram lots >/dev/null 2>&1
    expect "cli bad size" 2 "$?"
    "$cli" --url http://127.0.0.1:1 status >/dev/null 2>"$tmp/c3"
    expect "cli unreachable" 3 "$?"
    grep -q "is oversubd running" "$tmp/c3" && ok || bad "cli unreachable said: $(cat "$tmp/c3")"
    C status >"$tmp/c4"
    expect "cli status" 0 "$?"
    grep -q "^cli-svc " "$tmp/c4" && ok || bad "cli status: $(cat "$tmp/c4")"
    expect "cli status --json" True "$(C --json status | json 'any(s["id"]=="cli-svc" for s in d["services"])')"
    C usage cli-svc --vram 1GiB >/dev/null
    expect "cli usage" 0 "$?"
    C resize cli-svc --vram 4GiB >/dev/null
    expect "cli resize" 0 "$?"
    C explain chat-1 >"$tmp/c5"
    grep -q "chat-1 (online) is" "$tmp/c5" && ok || bad "cli explain: $(cat "$tmp/c5")"
    # the daemon runs the predictor live: the service's prediction and why its GPU was chosen
    C explain cli-svc >"$tmp/c6"
    grep -q "predicted peak: [0-9]* MiB from 1 usage report" "$tmp/c6" && ok || bad "explain prediction: $(cat "$tmp/c6")"
    grep -q "placed on GPU [0-9]*: it was counted as [0-9]* MiB, the projected peak there was [0-9]* of [0-9]* MiB" "$tmp/c6" && ok || bad "explain placement: $(cat "$tmp/c6")"
    # a service on two GPUs: its share on each, against the fullest of them
    C deploy twin --class batch --vram 40GiB --gpus 2 --min-vram 20GiB >/dev/null 2>&1
    C explain twin >"$tmp/c7"
    grep -q "placed on GPUs [0-9]*,[0-9]*: its share on each GPU counted as 20480 MiB, the projected peak on the fullest of them was [0-9]* of [0-9]* MiB" "$tmp/c7" && ok || bad "explain two GPUs: $(cat "$tmp/c7")"
    C release twin >/dev/null
    code "$(U /v1/services/cli-svc)" >/dev/null
    expect "prediction reports" 1 "$(json 'd["prediction"]["reports"]' <"$tmp/body")"
    expect "prediction within the request" True "$(json '1024 <= d["prediction"]["peak_mib"] <= d["vram_mib"]' <"$tmp/body")"
    expect "placed_because limit" True "$(json 'd["placed_because"]["limit_mib"] > 0 and d["placed_because"]["charge_per_gpu_mib"] > 0' <"$tmp/body")"
    C events | grep -q "admitted cli-svc" && ok || bad "cli events"
    C gpu cordon 5 >/dev/null && C gpu uncordon 5 >/dev/null
    expect "cli gpu" 0 "$?"
    C ratio 1.2345 >/dev/null 2>&1
    expect "cli bad ratio" 2 "$?"
    C release cli-svc >/dev/null
    expect "cli release" 0 "$?"
    C queue >/dev/null
    expect "cli queue" 0 "$?"
    # advise from the daemon's decision log: one degrade so far (model-eval's)
    "$cli" advise --from-daemon --url "http://127.0.0.1:$PORT" --json >"$tmp/adv" 2>"$tmp/adv.err"
    expect "advise --from-daemon" 0 "$?"
    expect "advise counts the degrade" True "$(json 'd["degrades"] >= 1 and d["source"] == "daemon"' <"$tmp/adv")"
    expect "advise: under a week, prorated, said" True "$(json 'd["history_days"] < 7 and any("less than a week" in c for c in d["caveats"])' <"$tmp/adv")"
    expect "advise: a ratio" True "$(json '1.0 <= d["recommended_ratio"] <= 1.8' <"$tmp/adv")"
    "$cli" advise --from-daemon --url "http://127.0.0.1:$PORT" >"$tmp/adv2"
    grep -q "^recommendation: " "$tmp/adv2" && ok || bad "advise table: $(cat "$tmp/adv2")"
    "$cli" advise --from-daemon --url http://127.0.0.1:1 >/dev/null 2>&1
    expect "advise --from-daemon unreachable" 3 "$?"
    "$cli" advise --from-daemon --bogus >/dev/null 2>&1
    expect "advise --from-daemon bad flag" 2 "$?"
    # the demo: a daemon of its own in a temporary folder, the worked scenario, narrated
    # its folder under its own TMPDIR: another suite's demo running beside this one is not ours
    mkdir -p "$tmp/demotmp"
    ls -d "$tmp"/demotmp/oversub-demo.* 2>/dev/null | sort >"$tmp/demo.before"
    TMPDIR=$tmp/demotmp OVERSUBD=$bin "$cli" demo >"$tmp/demo" 2>&1
    expect "cli demo" 0 "$?"
    grep -q "\[degrade\] degraded model-eval" "$tmp/demo" && ok || bad "demo: no degrade narrated: $(cat "$tmp/demo")"
    grep -q "\[start\] started chat-3" "$tmp/demo" && ok || bad "demo: chat-3 did not start"
    grep -q "held 471040 of 655360 MiB (71.9%)" "$tmp/demo" && ok || bad "demo: step 1's figures"
    # step 6: the example batch-job, a real process, evicted and resumed from its checkpoint
    grep -q "\[resume\] resumed nightly .* from checkpoint" "$tmp/demo" && ok || bad "demo: no resume of the job"
    grep -q "the job's result: total=465 units=30" "$tmp/demo" && ok || bad "demo: the job's total"
    ls -d "$tmp"/demotmp/oversub-demo.* 2>/dev/null | sort >"$tmp/demo.after"
    expect "demo cleans up" "" "$(comm -13 "$tmp/demo.before" "$tmp/demo.after")"
    "$cli" demo --bogus >/dev/null 2>&1
    expect "demo bad flag" 2 "$?"
    "$cli" demo --url http://127.0.0.1:1 >/dev/null 2>&1
    expect "demo unreachable" 3 "$?"
    OVERSUBD=/nonexistent/oversubd "$cli" demo >/dev/null 2>"$tmp/demo.err"
    expect "demo without oversubd" 3 "$?"
    grep -q "did not start" "$tmp/demo.err" && ok || bad "demo: no clear error when oversubd is missing"
fi

# ---- restart: clean, then the same state ----
curl -s "$(U /v1/services)" >"$tmp/before"
kill -TERM "$PID"
wait "$PID" 2>/dev/null
start "$tmp/a" || exit 1
curl -s "$(U /v1/services)" >"$tmp/after"
if python3 - "$tmp/before" "$tmp/after" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["services"]
b = json.load(open(sys.argv[2]))["services"]
assert [s["id"] for s in a] == [s["id"] for s in b], "ids"
for x, y in zip(a, b):
    for k in ("state", "grant_mib", "held_mib", "used_mib", "placement", "since_unix_ms", "checkpoint"):
        assert x.get(k) == y.get(k), (x["id"], k, x.get(k), y.get(k))
PY
then ok; else bad "restart changed the services"; fi
expect "events survive" True "$(curl -s "$(U '/v1/events?since=0')" | json 'len(d["events"]) > 10')"

# ---- kill -9 in the middle of 8 concurrent clients ----
for c in $(seq 1 8); do
    (
        for i in $(seq 1 125); do
            id="c$c-s$i"
            st=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$(U /v1/services)" \
                -d "{\"id\":\"$id\",\"class\":\"experiment\",\"vram_mib\":$((100 + i)),\"queue\":true}")
            case $st in 2*) echo "$id" >>"$tmp/acked.$c" ;; 000) break ;; esac
        done
    ) &
done
# the kill comes in the middle: once every client has had mutations acknowledged (each has
# 125 to make), not after a time that a loaded machine may spend starting them
acked_each() {
    local c
    for c in $(seq 1 8); do [ "$(cat "$tmp/acked.$c" 2>/dev/null | wc -l)" -ge 5 ] || return 1; done
}
wait_for 60 acked_each || bad "the 8 clients did not all have mutations acknowledged: $(cat "$tmp"/acked.* 2>/dev/null | wc -l)"
# the writer groups the concurrent clients' commits
curl -s "$(U /metrics)" >"$tmp/m2"
expect "group commit counted" True "$(python3 -c "
import re,sys
t=open('$tmp/m2').read()
c=int(re.search(r'^oversub_store_commits_total (\d+)', t, re.M).group(1))
m=int(re.search(r'^oversub_store_commands_total (\d+)', t, re.M).group(1))
print(c >= 1 and m >= c)")"
kill -9 "$PID"
wait 2>/dev/null
start "$tmp/a" || exit 1
cat "$tmp"/acked.* 2>/dev/null | sort >"$tmp/acked"
curl -s "$(U /v1/services)" | json '"\n".join(s["id"] for s in d["services"])' | sort >"$tmp/present"
missing=$(comm -23 "$tmp/acked" "$tmp/present" | wc -l)
acked=$(wc -l <"$tmp/acked")
expect "every acknowledged mutation survived kill -9" 0 "$missing"
echo "crash test: $acked mutations acknowledged before kill -9, $missing missing after the restart"
[ "$acked" -gt 0 ] && ok || bad "no mutation was acknowledged before the kill"
expect "invariants after the crash" ok "$(curl -s "$(U /healthz)" | json 'd["invariants"]')"
kill -TERM "$PID"; wait "$PID" 2>/dev/null

# ---- a second daemon on the same socket is refused ----
start "$tmp/a" || exit 1
"$bin" --listen 127.0.0.1:0 --state "$tmp/a/other.db" --socket "$tmp/a/d.sock" >"$tmp/out2" 2>"$tmp/err2"
expect "live socket refused" 1 "$?"
grep -q "another oversubd" "$tmp/err2" && ok || bad "live socket: $(cat "$tmp/err2")"
expect "the refused daemon left the live socket in place" 200 "$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$tmp/a/d.sock" http://x/healthz)"
kill -TERM "$PID"; wait "$PID" 2>/dev/null
# a --socket that names a regular file: refused, the file kept
echo precious >"$tmp/a/notasock"
"$bin" --listen 127.0.0.1:0 --state "$tmp/a/other.db" --socket "$tmp/a/notasock" >"$tmp/out2" 2>"$tmp/err2"
expect "regular file as socket refused" 1 "$?"
expect "the file is kept" precious "$(cat "$tmp/a/notasock")"
grep -q "exists and is not a socket" "$tmp/err2" && ok || bad "regular file socket: $(cat "$tmp/err2")"

# ---- the admin token ----
echo "  s3cret  " >"$tmp/token"; chmod 600 "$tmp/token"
start "$tmp/b" --token-file "$tmp/token" || exit 1
expect "no token" 401 "$(code -X POST "$(U /v1/services)" -d '{"id":"t","vram_mib":5}')"
expect "reads need none" 200 "$(code "$(U /v1/pool)")"
expect "token" 201 "$(code -X POST "$(U /v1/services)" -H 'Authorization: Bearer s3cret' -d '{"id":"t","vram_mib":5}')"
ttok=$(json 'd["token"]' <"$tmp/body")
expect "service token: 64 hex digits" 64 "$(echo -n "$ttok" | tr -cd '0-9a-f' | wc -c)"
curl -s -X POST "$(U /v1/services)" -H 'Authorization: Bearer s3cret' -d '{"id":"u","vram_mib":5}' >"$tmp/u"
utok=$(json 'd["token"]' <"$tmp/u")
[ "$ttok" != "$utok" ] && ok || bad "two services got the same token"
expect "own token: ready" 200 "$(code -X POST "$(U /v1/services/t/ready)" -H "Authorization: Bearer $ttok")"
expect "own token: usage" 200 "$(code -X PUT "$(U /v1/services/t/usage)" -H "Authorization: Bearer $ttok" -d '{"vram_mib":3}')"
expect "another service's token" 401 "$(code -X PUT "$(U /v1/services/t/usage)" -H "Authorization: Bearer $utok" -d '{"vram_mib":3}')"
expect "no token for usage" 401 "$(code -X PUT "$(U /v1/services/t/usage)" -d '{"vram_mib":3}')"
expect "service token cannot release" 401 "$(code -X DELETE "$(U /v1/services/t)" -H "Authorization: Bearer $ttok")"
expect "admin token: usage" 200 "$(code -X PUT "$(U /v1/services/u/usage)" -H 'Authorization: Bearer s3cret' -d '{"vram_mib":2}')"
expect "reads do not show tokens" False "$(curl -s "$(U /v1/services/t)" | json '"token" in d')"
kill -TERM "$PID"; wait "$PID" 2>/dev/null
start "$tmp/b" --token-file "$tmp/token" || exit 1
expect "service token survives a restart" 200 "$(code -X PUT "$(U /v1/services/t/usage)" -H "Authorization: Bearer $ttok" -d '{"vram_mib":4}')"
kill -TERM "$PID"; wait "$PID" 2>/dev/null
"$bin" --listen 0.0.0.0:0 --state "$tmp/c.db" --socket "" >/dev/null 2>"$tmp/err3"
expect "non-loopback without a token" 2 "$?"
grep -q "admin token" "$tmp/err3" && ok || bad "non-loopback message: $(cat "$tmp/err3")"

# ---- bad configuration, bad state ----
printf 'listen: 127.0.0.1:0\ncolour: red\n' >"$tmp/bad.yaml"
"$bin" --config "$tmp/bad.yaml" --state "$tmp/d.db" >/dev/null 2>"$tmp/err4"
expect "unknown config key" 2 "$?"
grep -q "bad.yaml:2: unknown key 'colour'" "$tmp/err4" && ok || bad "config message (file:line): $(cat "$tmp/err4")"
printf 'listen: 127.0.0.1:0\nhigh_watermark_pct: 80\nlow_watermark_pct: 90\n' >"$tmp/bad3.yaml"
"$bin" --config "$tmp/bad3.yaml" --state "$tmp/wm/d.db" --gpus sim:1x1000 >/dev/null 2>"$tmp/err7"
expect "low watermark above high: a bad configuration" 2 "$?"
grep -q "low_watermark_pct (90) must not be above high_watermark_pct (80)" "$tmp/err7" && ok || bad "watermark message: $(cat "$tmp/err7")"
expect "and nothing touched" no "$([ -e "$tmp/wm" ] && echo yes || echo no)"
printf 'listen: 127.0.0.1:0\ncuda_shim: /nonexistent/liboversub-cuda.so\n' >"$tmp/bad4.yaml"
"$bin" --config "$tmp/bad4.yaml" --state "$tmp/shim/d.db" --gpus sim:1x1000 >/dev/null 2>"$tmp/err8"
expect "a cuda_shim that is not there: a bad configuration" 2 "$?"
grep -q "cuda_shim: '/nonexistent/liboversub-cuda.so' is not a readable absolute path of a file" "$tmp/err8" && ok || bad "cuda_shim message: $(cat "$tmp/err8")"
printf 'listen: 127.0.0.1:0\ncuda_shim: /tmp\n' >"$tmp/bad6.yaml"
"$bin" --config "$tmp/bad6.yaml" --state "$tmp/shim/d.db" --gpus sim:1x1000 >/dev/null 2>"$tmp/err8"
expect "a cuda_shim that is a folder: a bad configuration" 2 "$?"
printf 'listen: 127.0.0.1:0\ncgroup: %s/nocg/svc\n' "$tmp" >"$tmp/bad5.yaml"
"$bin" --config "$tmp/bad5.yaml" --state "$tmp/shim/d.db" --gpus sim:1x1000 >/dev/null 2>"$tmp/err8"
expect "a cgroup outside cgroup v2: a bad configuration" 2 "$?"
grep -q "cgroup: $tmp/nocg/svc is not in a cgroup v2 hierarchy" "$tmp/err8" && ok || bad "cgroup message: $(cat "$tmp/err8")"
expect "and no state made" no "$([ -e "$tmp/shim" ] && echo yes || echo no)"
printf '# settings\nlisten: 127.0.0.1:0\n\ntick_ms: 5\n' >"$tmp/bad2.yaml"
"$bin" --config "$tmp/bad2.yaml" --state "$tmp/d.db" >/dev/null 2>"$tmp/err6"
expect "bad config value" 2 "$?"
grep -q "bad2.yaml:4: key 'tick_ms' must be 10 to 60000" "$tmp/err6" && ok || bad "config value message: $(cat "$tmp/err6")"
printf 'listen: [1, 2\n' >"$tmp/bad3.yaml"
"$bin" --config "$tmp/bad3.yaml" --state "$tmp/d.db" >/dev/null 2>"$tmp/err7"
expect "malformed yaml" 2 "$?"
grep -q "line" "$tmp/err7" && ok || bad "malformed yaml message has no line: $(cat "$tmp/err7")"
[ ! -e "$tmp/d.db" ] && ok || bad "bad config touched the state"
"$bin" --ratio 1.2345 --state "$tmp/d.db" >/dev/null 2>&1
expect "bad ratio flag" 2 "$?"
echo "precious notes, not a database" >"$tmp/notes.db"
"$bin" --listen 127.0.0.1:0 --socket "" --state "$tmp/notes.db" >/dev/null 2>"$tmp/err5"
expect "foreign state refused" 1 "$?"
expect "foreign state untouched" "precious notes, not a database" "$(cat "$tmp/notes.db")"
"$bin" --help >/dev/null
expect "help" 0 "$?"

echo "daemon: $pass passed, $fail failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
