#!/usr/bin/env bash
# test_actuation.sh - preemption that really happens, with real child processes, real signals and
# real HTTP on loopback: degrade then evict for a P0 on a full pool; the grace period (SIGTERM,
# then SIGKILL to the process group); a batch job preempted twice that resumes from its
# checkpoints; a degrade without acknowledgement escalating, an external service that never
# exits becoming overdue; restore after the hysteresis window without flapping; a daemon
# restarted while a service drains; who may run commands, env kept secret, commands that cannot
# start; webhooks.
# Usage: test_actuation.sh PATH/TO/oversubd PATH/TO/examples-dir PATH/TO/oversub
set -u
bin=$(realpath "$1")
ex=$(realpath "$2")
cli=$(realpath "$3")
. "$(dirname "$0")/lib.sh"
LLM=$ex/fake-llm-server
JOB=$ex/batch-job

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_d NAME POOL RATIO [config lines...]: a daemon of its own; sets D (its folder), S (its
# socket), PORT, DPID
start_d() {
    D=$tmp/$1
    mkdir -p "$D"
    local pool=$2 ratio=$3
    shift 3
    : >"$D/c.yaml"
    for kv in "ack_timeout_ms: 1500" "grace_ms: 3000" "hysteresis_ms: 1500" \
        "min_runtime_ms: 0" "restart_cost_ms: 5000"; do
        case " $* " in *" ${kv%%:*}:"*) ;; *) echo "$kv" >>"$D/c.yaml" ;; esac
    done
    printf '%s\n' "$@" >>"$D/c.yaml"
    restart_d "$pool" "$ratio"
}
restart_d() {
    # out and err are appended to: this daemon's port is on a "listening on" line after the last
    # one's (the socket can answer before the line is written)
    local seen
    seen=$(grep -c "listening on http" "$D/out" 2>/dev/null)
    "$bin" --config "$D/c.yaml" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "$D/s.sock" \
        --state "$D/st/db" --gpus "sim:$1" --ratio "$2" --tick-ms 100 >>"$D/out" 2>>"$D/err" &
    DPID=$!
    pids+=($DPID)
    S=$D/s.sock
    for _ in $(seq 1 1200); do
        [ -S "$S" ] && curl -s --unix-socket "$S" http://x/healthz >/dev/null &&
            [ "$(grep -c "listening on http" "$D/out" 2>/dev/null)" -gt "${seen:-0}" ] && break
        sleep 0.05
    done
    PORT=$(grep -o "listening on http://127.0.0.1:[0-9]*" "$D/out" | tail -1 | sed 's/.*://')
    GWP=$(grep -o "gateway on http://127.0.0.1:[0-9]*" "$D/out" | tail -1 | sed 's/.*://')
}
api() { curl -s --unix-socket "$S" -X "$1" "http://x$2" ${3:+-d "$3"}; }
code() { curl -s -o "$tmp/body" -w '%{http_code}' --unix-socket "$S" -X "$1" "http://x$2" ${3:+-d "$3"}; }
state() { api GET "/v1/services/$1" | json 'd.get("state", d.get("error", {}).get("code"))'; }
field() { api GET "/v1/services/$1" | json "d$2"; }
wait_state() { # id, state, seconds
    local n=$(( ${3:-10} * 10 ))
    for _ in $(seq 1 "$n"); do [ "$(state "$1")" = "$2" ] && return 0; sleep 0.1; done
    return 1
}
wait_for() { # seconds, command...
    local n=$(( $1 * 10 ))
    shift
    for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.1; done
    return 1
}
# events of a service: "kind reason" per line, or with a kind the messages of that kind
evs() { api GET "/v1/events?since=0" | python3 -c "
import json, sys
k = '${2:-}'
for e in json.load(sys.stdin)['events']:
    if e.get('service') != '$1': continue
    if not k: print(e['kind'] + ' ' + e['reason'])
    elif e['kind'] == k or e['reason'] == k: print(e['message'])"; }
count_ev() { evs "$1" | grep -c "^$2 " ; }
ev_time() { # service kind [reason] -> time_unix_ms of the first such event
    api GET "/v1/events?since=0" | python3 -c "
import json, sys
for e in json.load(sys.stdin)['events']:
    if e.get('service') == '$1' and e['kind'] == '$2' and ('${3:-}' == '' or e['reason'] == '${3:-}'):
        print(e['time_unix_ms']); break"; }
alive() { kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" | cut -c1)" != Z ]; }
penv() { tr '\0' '\n' <"/proc/$1/environ" | grep "^$2="; }

echo "== 1. a P0 on a full pool: the experiment is degraded, then evicted"
start_d s1 1x81920 1.0 "allow_root_services: true"
P1=$(freeport)
expect "exp starts" 201 "$(code POST /v1/services "{\"id\":\"exp\",\"class\":\"experiment\",\"vram\":\"60GiB\",\"min_vram\":\"20GiB\",\"grace_ms\":20000,\"batch_size\":8,\"min_batch_size\":2,\"command\":[\"$LLM\",\"--port\",\"$P1\",\"--load-ms\",\"200\",\"--base-mib\",\"4096\",\"--seq-mib\",\"2048\"]}")"
wait_state exp running 10 || bad "exp never ran: $(state exp)"
EXPPID=$(field exp '["process"]["pid"]')
expect "CUDA_VISIBLE_DEVICES is the placement" "CUDA_VISIBLE_DEVICES=0" "$(penv "$EXPPID" CUDA_VISIBLE_DEVICES)"
expect "CUDA_DEVICE_ORDER" "CUDA_DEVICE_ORDER=PCI_BUS_ID" "$(penv "$EXPPID" CUDA_DEVICE_ORDER)"
expect "OVERSUB_VRAM_MIB" "OVERSUB_VRAM_MIB=61440" "$(penv "$EXPPID" OVERSUB_VRAM_MIB)"
expect "OVERSUB_BATCH_SIZE" "OVERSUB_BATCH_SIZE=8" "$(penv "$EXPPID" OVERSUB_BATCH_SIZE)"
expect "OVERSUB_CONTROL_URL" "OVERSUB_CONTROL_URL=http://127.0.0.1:$PORT" "$(penv "$EXPPID" OVERSUB_CONTROL_URL)"
expect "own process group" "$EXPPID" "$(ps -o pgid= -p "$EXPPID" | tr -d ' ')"
expect "serves" 200 "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P1/v1/completions?tokens=2")"
# the server registered itself as the service's backend: the gateway reaches it
expect "registered backend" "http://127.0.0.1:$P1" "$(field exp '["backends"][0]')"
expect "through the gateway" exp "$(curl -s "http://127.0.0.1:$GWP/exp/v1/completions?tokens=1" | json 'd["service"]')"
expect "bad backends refused" 422 "$(code PUT /v1/services/exp/backends '{"backends":["ftp://x"]}')"
expect "unknown field refused" 400 "$(code PUT /v1/services/exp/backends '{"backends":["http://127.0.0.1:1"],"x":1}')"
expect "unknown service" 404 "$(code PUT /v1/services/nobody/backends '{"backends":["http://127.0.0.1:1"]}')"
# exp's memory in use leaves room for chat1 at once; its grant does not: a degrade
expect "chat1 starts, with a degrade" 201 "$(code POST /v1/services '{"id":"chat1","class":"online","vram":"40GiB"}')"
expect "victim action" degrade "$(json 'd["decision"]["victims"][0]["action"]' <"$tmp/body")"
wait_state chat1 loading 10 || bad "chat1 did not start after the degrade: $(state chat1)"
expect "exp degraded" degraded "$(state exp)"
expect "exp batch" 2 "$(field exp '["batch"]')"
grep -q "directive .*: degrade (batch 2" "$D/st/logs/exp.log" || bad "the server did not see the degrade: $(cat "$D/st/logs/exp.log")"
expect "exp acknowledged" 1 "$(count_ev exp ack)"
# a request in flight when the eviction comes is finished before the server leaves; it lasts
# 1000 x 5 ms, so that it is still in flight when chat2 arrives even on a loaded machine (with 300,
# it once ended first: exp back at 6144 MiB, and chat2 fitted at once); exp's grace (20 s) covers it
curl -s -o "$tmp/inflight" -w '%{http_code}' "http://127.0.0.1:$P1/v1/completions?tokens=1000" >"$tmp/inflight.code" &
CURLP=$!
# in flight once the server counts it in the usage it reports: 4096 + 2048 x (batch 2 + 1) / 2
inflight_seen() { [ "$(field exp '["used_mib"]')" = 7168 ]; }
wait_for 10 inflight_seen || bad "the request did not reach exp: used $(field exp '["used_mib"]') MiB"
expect "chat2 needs an eviction: pending until exp's memory is free (it starts under the high watermark, DESIGN.md)" 202 "$(code POST /v1/services '{"id":"chat2","class":"online","vram":"30GiB"}')"
expect "victim action 2" evict "$(json 'd["decision"]["victims"][0]["action"]' <"$tmp/body")"
wait_state chat2 loading 30 || bad "chat2 did not start after the eviction: $(state chat2)"
wait_state exp unknown_service 10 || bad "exp not released (it is not resumable): $(state exp)"
wait "$CURLP"
expect "in-flight request finished" 200 "$(cat "$tmp/inflight.code")"
expect "its answer" 1000 "$(json 'd["tokens"]' <"$tmp/inflight")"
alive "$EXPPID" && bad "exp's process still alive"
# in this order (a usage report at or under the new grant acknowledges the degrade)
evs exp | python3 -c "
import sys
got = [l.strip() for l in sys.stdin]
want = ['process spawn', 'ready user', 'degrade preemption', 'ack usage_under_grant',
        'evict preemption', 'process term', 'process exit', 'release evicted']
pos = [got.index(w) if w in got else -1 for w in want]
sys.exit(0 if -1 not in pos and pos == sorted(pos) else 1)" || bad "exp's events in order: $(evs exp | tr '\n' ',')"
evs exp exit | grep -q "exited with code 0" || bad "exp did not exit cleanly: $(evs exp exit)"
evs exp degrade | grep -q "to make room for chat1" || bad "degrade reason: $(evs exp degrade)"
evs exp evict | grep -q "to make room for chat2" || bad "evict reason: $(evs exp evict)"
grep -q "checkpoint .*served reported" "$D/st/logs/exp.log" || bad "no checkpoint on evict: $(tail -3 "$D/st/logs/exp.log")"

curl -s "http://127.0.0.1:$PORT/metrics" >"$tmp/metrics"
grep -q '^oversub_directives_total{action="degrade"} 1$' "$tmp/metrics" || bad "degrade directives metric: $(grep directives "$tmp/metrics")"
grep -q '^oversub_process_exits_total{how="code_zero"} 1$' "$tmp/metrics" || bad "exits metric: $(grep exits "$tmp/metrics")"
if command -v promtool >/dev/null; then
    promtool check metrics <"$tmp/metrics" >"$tmp/promtool" 2>&1 || bad "promtool: $(cat "$tmp/promtool")"
fi
kill "$DPID"; wait "$DPID" 2>/dev/null

echo "== 2. grace: SIGTERM at once, the whole grace period, then SIGKILL to the group"
start_d s2 1x81920 1.0 "allow_root_services: true"
P2=$(freeport)
expect "stubborn starts" 201 "$(code POST /v1/services "{\"id\":\"stubborn\",\"class\":\"batch\",\"vram\":\"10GiB\",\"grace_ms\":2500,\"command\":[\"$LLM\",\"--port\",\"$P2\",\"--load-ms\",\"100\",\"--ignore-sigterm\",\"--ignore-directives\",\"--spawn-child\",\"$D/child.pid\"]}")"
wait_state stubborn running 10 || bad "stubborn never ran"
SPID=$(field stubborn '["process"]["pid"]')
wait_for 5 test -s "$D/child.pid"
CPID=$(cat "$D/child.pid")
alive "$CPID" || bad "the child did not start"
expect "p0 waits" 202 "$(code POST /v1/services '{"id":"p0","class":"online","vram":"75GiB"}')"
wait_state p0 loading 10 || bad "p0 did not start after the grace period: $(state p0)"
alive "$SPID" && bad "the evictee survived its grace period"
alive "$CPID" && bad "the evictee's child survived"
deadline=$(api GET "/v1/events?since=0" | json '[e for e in d["events"] if e.get("service")=="stubborn" and e["kind"]=="evict"][0]["deadline_unix_ms"]')
killed=$(ev_time stubborn process kill)
term=$(ev_time stubborn process term)
evict=$(ev_time stubborn evict)
[ -n "$killed" ] && [ "$killed" -ge "$deadline" ] || bad "SIGKILL at $killed, before the grace end $deadline"
# p0 waited out the whole grace period (read from the events, whatever the machine's load)
p0start=$(ev_time p0 start)
[ -n "$p0start" ] && [ "$p0start" -ge "$deadline" ] || bad "p0 started at $p0start, inside the grace period ending $deadline"
[ -n "$term" ] && [ $((term - evict)) -lt 2000 ] || bad "SIGTERM not at once: evict $evict, term $term"
evs stubborn exit | grep -q "killed by signal 9" || bad "stubborn's exit: $(evs stubborn exit)"
kill "$DPID"; wait "$DPID" 2>/dev/null

echo "== 3. a batch job preempted twice resumes from its checkpoints, with exactly the right total"
start_d s3 1x81920 1.0 "allow_root_services: true"
"$cli" --url "unix:$S" deploy job --class batch --vram 50GiB --resumable --env JOB_NOTE=x \
    -- "$JOB" --units 40 --unit-ms 60 --result "$D/result" >"$tmp/deploy" 2>&1
expect "job deployed by the CLI" "job: loading" "$(head -1 "$tmp/deploy" | cut -d" " -f1-2)"
expect "its command" "$JOB --units 40 --unit-ms 60 --result $D/result" "$(field job '["command"]' | python3 -c 'import ast,sys; print(" ".join(ast.literal_eval(sys.stdin.read())))')"
wait_for 10 test -s "$D/st/checkpoints/job/state" || bad "no checkpoint from the job"
for round in 1 2; do
    # the job's memory in use is small: big starts at once, the job is evicted
    expect "p0 evicts the job ($round)" 201 "$(code POST /v1/services '{"id":"big","class":"online","vram":"50GiB"}')"
    expect "victim ($round)" "job evict" "$(json 'd["decision"]["victims"][0]["service"] + " " + d["decision"]["victims"][0]["action"]' <"$tmp/body")"
    wait_state job queued 10 || bad "the job did not go back to the queue ($round): $(state job)"
    wait_state big loading 5 || bad "big did not start ($round)"
    expect "checkpoint kept ($round)" "$D/st/checkpoints/job/state" "$(field job '["checkpoint"]')"
    expect "queue position ($round)" 1 "$(field job '["queue_position"]')"
    "$cli" --url "unix:$S" explain job >"$tmp/explain"
    grep -q "started again with OVERSUB_RESUME_FROM=$D/st/checkpoints/job/state" "$tmp/explain" || bad "oversub explain ($round): $(cat "$tmp/explain")"
    "$cli" --url "unix:$S" queue >"$tmp/queue"
    grep -q "^1 *job *batch *51200 MiB .*evicted $round time(s); resumes from $D/st/checkpoints/job/state" "$tmp/queue" || bad "oversub queue ($round): $(cat "$tmp/queue")"
    api DELETE /v1/services/big >/dev/null
    wait_for 10 sh -c "grep -c 'resuming from' '$D/st/logs/job.log' | grep -qx $round" || bad "no resume $round: $(tail -3 "$D/st/logs/job.log")"
    if [ $round = 1 ]; then
        before=$(cat "$D/st/checkpoints/job/state")
        wait_for 10 sh -c "[ \"\$(cat '$D/st/checkpoints/job/state')\" != '$before' ]" || bad "the job made no progress after resuming"
    fi
done
wait_for 20 test -s "$D/result" || bad "the job never finished: $(tail -5 "$D/st/logs/job.log")"
expect "exact total" "total=820 units=40" "$(cat "$D/result" 2>/dev/null)"
expect "started from scratch once" 1 "$(grep -c 'starting at unit 1' "$D/st/logs/job.log")"
expect "two resumes" 2 "$(count_ev job resume)"
expect "two requeues" 2 "$(count_ev job requeue)"
wait_state job unknown_service 10 || bad "the finished job was not released: $(state job)"
evs job resume | grep -q "from checkpoint $D/st/checkpoints/job/state" || bad "resume message: $(evs job resume)"

kill "$DPID"; wait "$DPID" 2>/dev/null

echo "== 4. a degrade not acknowledged escalates; an external service that never exits is overdue; webhooks"
start_d s4 1x81920 1.0
python3 - "$D/hook" >"$D/hook.out" 2>&1 <<'PY' &
import http.server, sys
out = open(sys.argv[1], "a")
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        out.write(self.rfile.read(n).decode() + "\n"); out.flush()
        self.send_response(204); self.end_headers()
    def log_message(self, *a): pass
import socket
class Dual(http.server.HTTPServer):
    address_family = socket.AF_INET6   # ::1 and 127.0.0.1 alike, whichever localhost is
try:
    s = Dual(("::", 0), H)
except OSError:
    s = http.server.HTTPServer(("127.0.0.1", 0), H)
print("port", s.server_address[1], flush=True)
s.serve_forever()
PY
pids+=($!)
HP=$(waitline "$D/hook.out" "port ")
expect "ext admitted" 201 "$(code POST /v1/services "{\"id\":\"ext\",\"class\":\"experiment\",\"vram\":\"60GiB\",\"min_vram\":\"20GiB\",\"batch_size\":8,\"min_batch_size\":2,\"grace_ms\":1500,\"control_url\":\"http://localhost:$HP/hook\"}")"
TOK=$(json 'd["token"]' <"$tmp/body")
P4=$(freeport)
OVERSUB_SERVICE=ext OVERSUB_CONTROL_URL=http://127.0.0.1:$PORT OVERSUB_TOKEN=$TOK OVERSUB_BATCH_SIZE=8 \
    "$LLM" --port "$P4" --load-ms 100 --base-mib 45000 --ignore-directives >"$D/ext.log" 2>&1 &
EXT=$!
pids+=($EXT)
wait_state ext running 10 || bad "ext never reported ready: $(state ext)"
expect "ext's pid known" "$EXT" "$(field ext '["pid"]')"
expect "p1 waits" 202 "$(code POST /v1/services '{"id":"p1","class":"online","vram":"40GiB"}')"
wait_state ext draining 10 || bad "no escalation: $(state ext)"
evs ext escalate | grep -q "did not acknowledge" || bad "escalate event: $(evs ext)"
evs ext evict | grep -q "did not acknowledge its degrade in time" || bad "evict reason: $(evs ext evict)"
wait_state ext overdue 10 || bad "ext not overdue: $(state ext)"
# p1 waits: pending on its overdue victim, or, once a second grace has passed (a loaded machine
# may take that long between two looks), back in the queue (DESIGN.md) — never started
p1s=$(state p1)
case $p1s in pending | queued) ok ;; *) bad "p1 still waits: got '$p1s', want pending or queued" ;; esac
wait_for 5 sh -c "grep -c '\"action\"' '$D/hook' | grep -qx 2" || bad "webhooks: $(cat "$D/hook")"
python3 - "$D/hook" <<'PY' || bad "webhook bodies: $(cat "$D/hook")"
import json, sys
ds = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [d["action"] for d in ds] == ["degrade", "evict"], ds
assert ds[0]["vram_mib"] == 20480 and ds[0]["batch_size"] == 2, ds[0]
assert ds[1]["deadline_unix_ms"] > 0 and 0 <= ds[1]["remaining_ms"] <= 1500, ds[1]
PY
lp=$(curl -s "http://127.0.0.1:$PORT/v1/services/ext/directives?after=0")
expect "long-poll sees both" "degrade evict" "$(echo "$lp" | json '" ".join(x["action"] for x in d["directives"])')"
last=$(echo "$lp" | json 'd["directives"][-1]["seq"]')
t0=$(date +%s%N)
expect "long-poll waits" 0 "$(curl -s "http://127.0.0.1:$PORT/v1/services/ext/directives?after=$last&wait=1" | json 'len(d["directives"])')"
[ $(( ($(date +%s%N) - t0) / 1000000 )) -ge 900 ] || bad "the long-poll did not wait"
expect "bad wait" 400 "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v1/services/ext/directives?wait=x")"
expect "unknown service" 404 "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v1/services/nobody/directives")"
kill -9 "$EXT"; wait "$EXT" 2>/dev/null
wait_state p1 loading 10 || bad "p1 did not start when ext's process was gone: $(state p1)"
evs ext gone | grep -q "is gone while overdue" || bad "gone note: $(evs ext process)"
kill "$DPID"; wait "$DPID" 2>/dev/null

echo "== 5. restore after the hysteresis window, no flapping under oscillating usage"
start_d s5 1x81920 1.5 "allow_root_services: true" "hysteresis_ms: 2500" "log_level: debug"
# the engine's passes run in its ticks, each logged at debug level ("command tick"): a tick
# counted after something happened has seen it
ticks() { grep -c 'command tick' "$D/err"; }
ticks_past() { [ "$(ticks)" -gt "$1" ]; }
P5=$(freeport)
expect "flex starts" 201 "$(code POST /v1/services "{\"id\":\"flex\",\"class\":\"experiment\",\"vram\":\"60GiB\",\"min_vram\":\"20GiB\",\"batch_size\":8,\"min_batch_size\":2,\"command\":[\"$LLM\",\"--port\",\"$P5\",\"--load-ms\",\"100\",\"--base-mib\",\"4096\",\"--seq-mib\",\"8192\"]}")"
wait_state flex running 10 || bad "flex never ran"
expect "noisy" 201 "$(code POST /v1/services '{"id":"noisy","class":"batch","vram":"40GiB"}')"
api POST /v1/services/noisy/ready >/dev/null
api PUT /v1/services/noisy/usage '{"vram_mib":44000}' >/dev/null
wait_state flex degraded 5 || bad "pressure did not degrade flex: $(state flex)"
wait_for 5 sh -c "[ \$(curl -s --unix-socket '$S' http://x/v1/services/flex | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"used_mib\"])') -le 20480 ]" || bad "flex did not shrink"
longest=0
for _ in 1 2 3 4 5; do
    t0=$(date +%s%3N)
    api PUT /v1/services/noisy/usage '{"vram_mib":8000}' >/dev/null; sleep 0.4
    api PUT /v1/services/noisy/usage '{"vram_mib":44000}' >/dev/null
    t1=$(date +%s%3N)
    [ $((t1 - t0)) -gt "$longest" ] && longest=$((t1 - t0))
    # the room is gone for the engine once a tick has seen it gone (the restore pass forgets
    # when it came): the next low starts after such a tick, however late it runs
    n=$(ticks)
    wait_for 10 ticks_past "$n" || bad "no tick after noisy's usage rose"
done
# room lasted at most $longest ms each time; only a loaded machine stretches that past the
# 2500 ms window, and then a restore would be right
if [ "$longest" -lt 2400 ]; then
    expect "no restore while room comes and goes" 0 "$(count_ev flex restore)"
else
    echo "note: room lasted $longest ms once (a loaded machine): the no-flapping check is skipped"
fi
# the room must also hold what noisy has shown it rises to (its predicted peak): it leaves
t_low=$(date +%s%3N)
api DELETE /v1/services/noisy >/dev/null
wait_state flex running 8 || bad "flex not restored: $(state flex)"
t_res=$(ev_time flex restore)
[ -n "$t_res" ] && [ $((t_res - t_low)) -ge 2400 ] || bad "restored before the window: low at $t_low, restore at $t_res"
# what could undo the restore comes after it: the server's usage at batch 8 (4096 + 8192 x 8 / 2),
# then the engine's passes over it; a second degrade or restore is in the events by then
full_usage() { [ "$(field flex '["used_mib"]')" = 36864 ]; }
wait_for 10 full_usage || bad "flex did not report its usage at batch 8: $(field flex '["used_mib"]') MiB"
n=$(ticks)
wait_for 10 ticks_past $((n + 2)) || bad "no ticks after flex's usage report"
if [ "$longest" -lt 2400 ]; then
    expect "one restore" 1 "$(count_ev flex restore)"
    expect "one degrade" 1 "$(count_ev flex degrade)"
fi
expect "server back to batch 8" 8 "$(field flex '["batch"]')"
grep -q "directive .*: restore (batch 8" "$D/st/logs/flex.log" || bad "the server did not see the restore"

# flex goes with this section: the next daemon has a state of its own and would never adopt it
# (issue 23: every run left a fake-llm-server behind, reparented to init)
FLEXPID=$(field flex '["process"]["pid"]')
api DELETE /v1/services/flex >/dev/null
flex_gone() { ! kill -0 "$FLEXPID" 2>/dev/null; }
wait_for 20 flex_gone || bad "flex's process ended with its release: $FLEXPID"

echo "== 6. oversubd restarted while a service drains: same deadline, live processes adopted"
# slow's grace (12 s) must outlast a kill -9, a restart and the checks below on a loaded machine
kill "$DPID"; wait "$DPID" 2>/dev/null
start_d s6 1x81920 1.0 "allow_root_services: true"
expect "keep starts" 201 "$(code POST /v1/services '{"id":"keep","class":"online","vram":"10GiB","command":["/bin/sleep","300"]}')"
P6=$(freeport)
expect "slow starts" 201 "$(code POST /v1/services "{\"id\":\"slow\",\"class\":\"batch\",\"vram\":\"20GiB\",\"grace_ms\":12000,\"command\":[\"$LLM\",\"--port\",\"$P6\",\"--load-ms\",\"100\",\"--base-mib\",\"15000\",\"--ignore-sigterm\",\"--ignore-directives\"]}")"
wait_state slow running 10 || bad "slow never ran"
wait_for 5 sh -c "curl -s --unix-socket '$S' http://x/v1/services/slow | grep -q '\"used_mib\":17048'" || bad "slow's usage not reported"
SLOW=$(field slow '["process"]["pid"]')
KEEP=$(field keep '["process"]["pid"]')
expect "hog waits" 202 "$(code POST /v1/services '{"id":"hog","class":"online","vram":"60GiB"}')"
wait_state slow draining 5 || bad "slow not draining: $(state slow)"
DL=$(field slow '["deadline_unix_ms"]')
kill -9 "$DPID"; wait "$DPID" 2>/dev/null
restart_d 1x81920 1.0
expect "still draining" draining "$(state slow)"
expect "same deadline" "$DL" "$(field slow '["deadline_unix_ms"]')"
expect "adopted, same process" "$SLOW" "$(field slow '["process"]["pid"]')"
expect "keep adopted" "$KEEP" "$(field keep '["process"]["pid"]')"
expect "not duplicated" 1 "$(pgrep -fc -- "--port $P6")"
evs slow adopt | grep -q "adopted slow's process $SLOW" || bad "no adoption note: $(evs slow process)"
# the restarted actuators repeat the outstanding directive once the loop runs (waited for):
# this run's own counter says it went out, whether or not slow has left by then (its grace may
# end first on a loaded machine, and a released service has no directives to read)
repeated() { api GET /metrics | grep -q '^oversub_directives_total{action="evict"} [1-9]'; }
wait_for 20 repeated && ok || bad "the directive repeated: $(api GET /metrics | grep '^oversub_directives_total')"
wait_state hog loading 30 || bad "hog did not start after slow's grace: $(state hog)"
# the SIGKILL at the deadline and the release are two timers of one loop, and an adopted process
# is not the new daemon's child: its end is waited for, not sampled (once, under two busy loops,
# hog was loading while slow was still seen alive)
slow_gone() { ! alive "$SLOW"; }
wait_for 10 slow_gone || bad "slow survived its grace period across the restart"
killed=$(ev_time slow process kill)
[ -n "$killed" ] && [ "$killed" -ge "$DL" ] || bad "killed at $killed, deadline $DL"
expect "keep still the same process" "$KEEP" "$(field keep '["process"]["pid"]')"
kill "$DPID"; wait "$DPID" 2>/dev/null
# a process that died while the daemon was down is treated as exited
kill -9 "$KEEP"
restart_d 1x81920 1.0
wait_for 5 sh -c "curl -s --unix-socket '$S' 'http://x/v1/events?since=0' | grep -q 'ended while oversubd was down'" || bad "keep's death while down was not noticed"
expect "keep released" unknown_service "$(state keep)"
kill "$DPID"; wait "$DPID" 2>/dev/null

echo "== 7. who may run commands; env kept secret; commands that cannot start"
start_d s7 2x81920 1.3
expect "command over TCP without a token" 403 "$(curl -s -o "$tmp/body" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/v1/services" -d '{"id":"t1","class":"batch","vram":"1GiB","command":["/bin/true"]}')"
expect "nothing admitted" unknown_service "$(state t1)"
expect "env needs command" 422 "$(code POST /v1/services '{"id":"t2","class":"batch","vram":"1GiB","env":{"A":"b"}}')"
expect "command not argv" 422 "$(code POST /v1/services '{"id":"t2","class":"batch","vram":"1GiB","command":"sleep 1"}')"
expect "bad env name" 422 "$(code POST /v1/services '{"id":"t2","class":"batch","vram":"1GiB","command":["/bin/true"],"env":{"A=B":"c"}}')"
expect "env may not set OVERSUB_" 422 "$(code POST /v1/services '{"id":"t2","class":"batch","vram":"1GiB","command":["/bin/true"],"env":{"OVERSUB_TOKEN":"x"}}')"
expect "bad restart" 422 "$(code POST /v1/services '{"id":"t2","class":"batch","vram":"1GiB","command":["/bin/true"],"restart":"always"}')"
if [ "$(id -u)" = 0 ]; then
    expect "root refused" 422 "$(code POST /v1/services '{"id":"t2","class":"batch","vram":"1GiB","command":["/bin/true"]}')"
    grep -q "allow_root_services" "$tmp/body" || bad "root refusal message: $(cat "$tmp/body")"
    chmod 711 "$tmp" "$D" # the test's own folders: the user must pass through them
    expect "as nobody" 201 "$(code POST /v1/services '{"id":"who","class":"batch","vram":"1GiB","user":"nobody","cuda_shim":false,"command":["/bin/sh","-c","id -u; echo saved >\"$OVERSUB_CHECKPOINT_DIR/ck\" && echo wrote; sleep 30"],"env":{"SECRET_KEY":"hunter2"}}')"
    wait_for 5 grep -q . "$D/st/logs/who.log" || bad "no log"
    expect "runs as nobody" "$(id -u nobody)" "$(head -1 "$D/st/logs/who.log")"
    wait_for 5 grep -q wrote "$D/st/logs/who.log" || bad "nobody could not write its checkpoint folder: $(cat "$D/st/logs/who.log")"
    expect "its checkpoint, its own" "saved nobody" "$(cat "$D/st/checkpoints/who/ck" 2>/dev/null) $(stat -c %U "$D/st/checkpoints/who/ck" 2>/dev/null)"
else
    expect "as ourselves" 201 "$(code POST /v1/services '{"id":"who","class":"batch","vram":"1GiB","command":["/bin/sh","-c","id -u; sleep 30"],"env":{"SECRET_KEY":"hunter2"}}')"
fi
grep -q hunter2 "$tmp/body" && bad "env value echoed in the submit's answer"
api GET /v1/services/who | grep -q hunter2 && bad "env value echoed in GET"
api GET /v1/services | grep -q hunter2 && bad "env value echoed in the list"
api GET "/v1/events?since=0" | grep -q hunter2 && bad "env value in events"
expect "env names shown" SECRET_KEY "$(field who '["env_keys"][0]')"
WPID=$(field who '["process"]["pid"]')
expect "env reaches the process" "SECRET_KEY=hunter2" "$(penv "$WPID" SECRET_KEY)"
echo "allow_root_services: true" >>"$D/c.yaml"
kill "$DPID"; wait "$DPID" 2>/dev/null
restart_d 2x81920 1.3
expect "who adopted across a restart" "$WPID" "$(field who '["process"]["pid"]')"
expect "missing command" 201 "$(code POST /v1/services '{"id":"nocmd","class":"batch","vram":"1GiB","command":["/nonexistent/prog"]}')"
expect "not in PATH" 201 "$(code POST /v1/services '{"id":"nopath","class":"batch","vram":"1GiB","command":["no-such-program-xyz"]}')"
printf 'echo hi\n' >"$D/noexec.sh"; chmod 644 "$D/noexec.sh"
expect "not executable" 201 "$(code POST /v1/services "{\"id\":\"noexec\",\"class\":\"batch\",\"vram\":\"1GiB\",\"command\":[\"$D/noexec.sh\"]}")"
expect "exits at once" 201 "$(code POST /v1/services '{"id":"quick","class":"batch","vram":"1GiB","command":["/bin/sh","-c","echo dying >&2; exit 3"]}')"
expect "crashes, restarts" 201 "$(code POST /v1/services '{"id":"crashy","class":"batch","vram":"1GiB","restart":"on-failure","max_restarts":1,"command":["/bin/sh","-c","exit 4"]}')"
expect "bad workdir" 201 "$(code POST /v1/services '{"id":"nowd","class":"batch","vram":"1GiB","workdir":"/nonexistent","command":["/bin/true"]}')"
for s in nocmd nopath noexec quick crashy nowd; do
    wait_for 8 sh -c "curl -s --unix-socket '$S' 'http://x/v1/events?since=0' | python3 -c \"import json,sys; sys.exit(0 if any(e['kind']=='fail' and e.get('service')=='$s' for e in json.load(sys.stdin)['events']) else 1)\"" || bad "$s did not fail: $(state $s)"
done
evs nocmd fail | grep -q "does not exist" || bad "nocmd: $(evs nocmd fail)"
evs nopath fail | grep -q "was not found in PATH" || bad "nopath: $(evs nopath fail)"
evs noexec fail | grep -q "is not executable" || bad "noexec: $(evs noexec fail)"
evs quick fail | grep -q "exited with code 3 at once" || bad "quick: $(evs quick fail)"
grep -q dying "$D/st/logs/quick.log" || bad "quick's stderr not in its log"
"$cli" --url "unix:$S" status >"$tmp/status"
grep -q "^who .* pid $WPID\$" "$tmp/status" || bad "oversub status shows the process: $(cat "$tmp/status")"
expect "oversub logs" "$(cat "$D/st/logs/who.log")" "$("$cli" --url "unix:$S" logs who)"
expect "oversub logs -n 1" "$(tail -1 "$D/st/logs/who.log")" "$("$cli" --url "unix:$S" logs who -n 1)"
api POST /v1/services '{"id":"plain","class":"batch","vram":"1GiB"}' >/dev/null
"$cli" --url "unix:$S" logs plain >/dev/null 2>"$tmp/logs.err"
expect "logs of a service without a command" 1 "$?"
grep -q "not a managed service" "$tmp/logs.err" || bad "logs message: $(cat "$tmp/logs.err")"
evs crashy fail | grep -q "kept failing: it exited with code 4, after 1 restart" || bad "crashy: $(evs crashy fail)"
expect "crashy restarted once" 1 "$(evs crashy restart | grep -c 'restarting crashy')"
evs nowd fail | grep -q "chdir failed" || bad "nowd: $(evs nowd fail)"
expect "the other service undisturbed" "$WPID" "$(field who '["process"]["pid"]')"
alive "$WPID" || bad "who's process died"
expect "healthy books" ok "$(api GET /healthz | json 'd["invariants"]')"
api DELETE /v1/services/who >/dev/null
wait_for 5 sh -c "! kill -0 $WPID 2>/dev/null" || bad "a released service's process was not stopped"
# a released service's process gets its own grace (the spec is gone from the engine by then)
expect "a service with a grace of its own" 201 "$(code POST /v1/services '{"id":"gr","class":"batch","vram":"1GiB","grace_ms":3000,"cuda_shim":false,"command":["/bin/sh","-c","trap \"\" TERM; sleep 600"]}')"
wait_state gr running 20 || bad "gr did not run: $(state gr)"
GPID=$(field gr '["process"]["pid"]')
api DELETE /v1/services/gr >/dev/null
wait_for 30 sh -c "! kill -0 $GPID 2>/dev/null" || bad "gr's process was not killed after its grace"
evs gr term | grep -Eq "\(it was released\); SIGKILL in (2[0-9]{3}|3000) ms" && ok || bad "gr's grace was not its own: $(evs gr term)"
kill "$DPID"; wait "$DPID" 2>/dev/null

echo "== 8. the admin token may run commands over TCP"
start_d s8 1x81920 1.3 "allow_root_services: true" "service_log_max: 8192"
kill "$DPID"; wait "$DPID" 2>/dev/null
echo secret-admin >"$D/tok"; chmod 600 "$D/tok"
echo "token_file: $D/tok" >>"$D/c.yaml"
restart_d 1x81920 1.3
expect "with the admin token" 201 "$(curl -s -o "$tmp/body" -w '%{http_code}' -X POST -H 'Authorization: Bearer secret-admin' "http://127.0.0.1:$PORT/v1/services" -d '{"id":"tok1","class":"batch","vram":"1GiB","command":["/bin/sleep","30"]}')"
wait_for 5 sh -c "curl -s --unix-socket '$S' http://x/v1/services/tok1 | grep -q '\"alive\":true'" || bad "tok1 not running"
curl -s --unix-socket "$S" -H 'Authorization: Bearer secret-admin' -X DELETE http://x/v1/services/tok1 >/dev/null
# a chatty service's log is kept under its cap: copied to .1 and emptied in place
expect "chatty" 201 "$(curl -s -o "$tmp/body" -w '%{http_code}' --unix-socket "$S" -H 'Authorization: Bearer secret-admin' -X POST http://x/v1/services -d '{"id":"chatty","class":"batch","vram":"1GiB","command":["/bin/sh","-c","while :; do echo 0123456789012345678901234567890123456789012345678901234567890123456789; sleep 0.002; done"]}')"
wait_for 10 test -s "$D/st/logs/chatty.log.1" || bad "the log was not rotated"
# the service writes on: a later rotation (the copy rewritten) shows the cap kept as it grows
rot=$(stat -c %y "$D/st/logs/chatty.log.1")
rotated_again() { [ "$(stat -c %y "$D/st/logs/chatty.log.1")" != "$rot" ]; }
wait_for 10 rotated_again || bad "the log was not rotated again"
sz=$(stat -c %s "$D/st/logs/chatty.log")
[ "$sz" -lt 200000 ] || bad "the log grew past its cap: $sz bytes"
sz1=$(stat -c %s "$D/st/logs/chatty.log.1")
[ "$sz1" -lt 200000 ] || bad "the log grew past its cap before its rotation: $sz1 bytes"
grep -q 0123456789 "$D/st/logs/chatty.log.1" || bad "the rotated log lost its lines"
curl -s --unix-socket "$S" -H 'Authorization: Bearer secret-admin' -X DELETE http://x/v1/services/chatty >/dev/null
kill "$DPID"; wait "$DPID" 2>/dev/null

if [ "$fail" -gt 0 ]; then
    for e in "$tmp"/*/err; do echo "--- $e"; tail -25 "$e"; done
fi
echo "test_actuation: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
