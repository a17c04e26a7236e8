#!/usr/bin/env bash
# test_suspend.sh - preemption without a reload (issue 25), with real processes and no GPU: a P2
# service run by the fake vLLM (tests/fakes/fake_vllm.py, sleep mode, method vllm) and a P1
# PyTorch-like process on the fake driver (tests/fakes/fake_torch.py, method cuda: the driver's
# checkpoint API, as oversubd loads it with dlopen) share a GPU, oversold 2x, their memory
# counted by the CUDA shim; a P0 arrival needs the physical room (the logical is there: a
# suspended service keeps its logical grant).
# Both are suspended, not killed (the same PIDs), their memory seen to fall (the vLLM's residual
# as measured), and the P0 started; kill -9 of oversubd while both are suspended: after the
# restart they still are, once; the P0 released, both resume on their GPU: the fake driver's
# bytes intact and the job working again, the fake vLLM answering chat completions. Then an
# operator's suspend survives another kill -9 and is resumed by the operator; a suspend that
# never completes (a hung endpoint) and one whose memory never falls (a vLLM whose sleep frees
# nothing) are evicted after suspend_timeout_ms.
# Each wait is for the event it checks (a state, a file), bounded so a failure says so.
# Usage: test_suspend.sh OVERSUBD FAKE_LIBCUDA_DIR
set -u
bin=$(realpath "$1")
fakedir=$(realpath "$2")
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3
export FAKE_CUDA_STATE=$tmp/cuda.state FAKE_CUDA_MEM_MIB=40960
D=$tmp/d
mkdir -p "$D"
cat >"$D/c.yaml" <<EOF
allow_root_services: true
cuda_lib: $fakedir/libcuda.so.1
suspend_host_mib: 65536
suspend_timeout_ms: 4000
tick_ms: 100
EOF
start_d() {
    local seen
    seen=$(grep -c "listening on http" "$D/out" 2>/dev/null)
    "$bin" --config "$D/c.yaml" --listen 127.0.0.1:0 --socket "$D/s.sock" --state "$D/st/db" \
        --gpus sim:1x40960 --ratio 2.0 >>"$D/out" 2>>"$D/err" &
    DPID=$!
    pids+=($DPID)
    for _ in $(seq 1 1200); do
        [ -S "$D/s.sock" ] && [ "$(grep -c "listening on http" "$D/out" 2>/dev/null)" -gt "${seen:-0}" ] && break
        sleep 0.05
    done
}
api() { curl -s --unix-socket "$D/s.sock" -X "$1" "http://x$2" ${3:+-d "$3"}; }
code() { curl -s -o "$tmp/body" -w '%{http_code}' --unix-socket "$D/s.sock" -X "$1" "http://x$2" ${3:+-d "$3"}; }
field() { api GET "/v1/services/$1" | json "$2" 2>/dev/null; }
wait_for() { local n=$(($1 * 20)); shift; for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.05; done; return 1; }
state_is() { [ "$(field "$1" 'd["state"]')" = "$2" ]; }
free_port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_d
[ -S "$D/s.sock" ] || { echo "oversubd did not start: $(cat "$D/err")"; exit 1; }

# ---- the two victims ----
VP=$(free_port)
env_json='{"FAKE_CUDA_STATE":"'$FAKE_CUDA_STATE'","FAKE_CUDA_MEM_MIB":"40960","LD_LIBRARY_PATH":"'$fakedir'"}'
expect "the vLLM service" 201 "$(code POST /v1/services '{"id":"chat-exp","class":"experiment","vram":"16000MiB",
 "command":["'$py'","'$here'/tests/fakes/fake_vllm.py","--port","'$VP'","--dev-mode","--enable-sleep-mode",
  "--vram-mib","15000","--residual-mib","1000","--cuda","--cuda-lib","'$fakedir'/libcuda.so.1"],
 "env":'"$env_json"',"suspend":{"method":"vllm","url":"http://127.0.0.1:'$VP'","residual":"500MiB"}}')"
chat() { curl -s -m 10 "http://127.0.0.1:$VP/v1/chat/completions" -d '{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}' | json '"ok" if d["choices"][0]["message"]["content"] else "empty"' 2>/dev/null; }
chat_up() { [ "$(chat)" = ok ]; }
wait_for 30 chat_up || bad "the fake vLLM did not answer: $(tail -3 "$D/err"; cat "$D"/st/logs/chat-exp* 2>/dev/null | tail -5)"
api POST /v1/services/chat-exp/ready '{}' >/dev/null # loaded (a readiness probe's word)
expect "the torch job" 201 "$(code POST /v1/services '{"id":"train","class":"batch","vram":"16000MiB",
 "command":["'$py'","'$here'/tests/fakes/fake_torch.py","--mib","15000","--status","'$tmp'/torch.status",
  "--cuda-lib","'$fakedir'/libcuda.so.1"],"env":'"$env_json"',"suspend":{"method":"cuda"}}')"
steps() { sed -n 's/^steps=\([0-9]*\).*/\1/p' "$tmp/torch.status" 2>/dev/null; }
torch_up() { [ -n "$(steps)" ] && [ "$(steps)" -gt 2 ]; }
wait_for 30 torch_up || bad "the torch job did not run: $(cat "$D"/st/logs/train* 2>/dev/null | tail -5)"
api POST /v1/services/train/ready '{}' >/dev/null
vpid=$(field chat-exp 'd["process"]["pid"]')
tpid=$(field train 'd["process"]["pid"]')
expect "a spec's suspend is shown" vllm "$(field chat-exp 'd["suspend"]["method"]')"

# ---- bad specs ----
expect "a suspend URL outside allowed_destinations" 422 "$(code POST /v1/services '{"id":"x","class":"batch","vram":"1GiB","suspend":{"method":"vllm","url":"http://169.254.169.254:80"}}')"
grep -q "suspend.url" "$tmp/body" && ok || bad "no sentence for the URL: $(cat "$tmp/body")"
expect "a backed service cannot declare suspend" 422 "$(code POST /v1/services '{"id":"y","class":"online","vram":"1GiB","suspend":{"method":"cuda"}}')"
expect "an external service to checkpoint" 201 "$(code POST /v1/services '{"id":"qa","class":"batch","vram":"1GiB","suspend":{"method":"cuda"}}')"
api POST /v1/services/qa/ready '{}' >/dev/null
expect "its suspend, with no process known: refused" 409 "$(code POST /v1/services/qa/suspend)"
grep -q "no process of this service is known to checkpoint" "$tmp/body" && ok || bad "no sentence: $(cat "$tmp/body")"
expect "still running" running "$(field qa 'd["state"]')"
api DELETE /v1/services/qa >/dev/null
expect "an unknown method" 422 "$(code POST /v1/services '{"id":"z","class":"batch","vram":"1GiB","suspend":{"method":"criu"}}')"

# ---- a P0 arrival: both suspended, not killed ----
expect "the P0 arrives" 202 "$(code POST /v1/services '{"id":"online-a","class":"online","vram":"30000MiB"}')"
wait_for 30 state_is chat-exp suspended || bad "the vLLM service was not suspended: $(field chat-exp 'd["state"]'); $(tail -5 "$D/err")"
wait_for 30 state_is train suspended || bad "the torch job was not suspended: $(field train 'd["state"]'); $(tail -5 "$D/err")"
p0_up() { s=$(field online-a 'd["state"]'); [ "$s" = loading ] || [ "$s" = running ]; }
wait_for 30 p0_up || bad "the P0 did not start: $(field online-a 'd["state"]')"
kill -0 "$vpid" 2>/dev/null && kill -0 "$tpid" 2>/dev/null && ok || bad "a victim was killed"
expect "the vLLM sleeps" True "$(curl -s "http://127.0.0.1:$VP/is_sleeping" | json 'd["is_sleeping"]')"
expect "the torch job is checkpointed: its memory left the device" 0 "$($py -c "
import ctypes; c=ctypes.CDLL('$fakedir/libcuda.so.1'); s=ctypes.c_int(-1)
print(c.cuCheckpointProcessGetState($tpid, ctypes.byref(s)) or s.value - 2)")"
expect "suspends are counted apart from evictions" "2 0 2" "$(api GET /v1/pool | json '"%d %d %d" % (d["suspends"], d["evictions"], d["suspended"]["services"])')"
frozen=$(steps)
m=$(api GET /metrics)
grep -q '^oversub_suspends_total 2$' <<<"$m" && ok || bad "no suspends counter: $(grep suspend <<<"$m" | head -5)"
grep -q '^oversub_service_suspends_total{service="train",class="batch"} 1$' <<<"$(api GET '/metrics?per_service=1')" && ok || bad "no per-service suspends"
grep -q '^oversub_suspended_host_bytes [1-9]' <<<"$m" && ok || bad "no suspended host bytes: $(grep suspend <<<"$m" | head -5)"
api GET "/v1/events?since=0" | grep -q '"kind":"suspend"' && ok || bad "no suspend event"
# done is seen, not assumed: the asleep vLLM keeps 1000 MiB (its context; 500 were declared),
# as the shim counts them; the checkpointed job nothing
expect "the vLLM's residual as measured" 1000 "$(field chat-exp 'd["residual_mib"]')"
expect "the checkpoint's residual" 0 "$(field train 'd["residual_mib"]')"
api GET "/v1/events?since=0" | grep -q '1000 MiB still measured on its GPUs' && ok || bad "no measured residual in the events"

# ---- kill -9 of oversubd while both are suspended: after the restart they still are, once ----
kill -9 "$DPID"
wait "$DPID" 2>/dev/null
start_d
expect "the vLLM service still suspended after kill -9" suspended "$(field chat-exp 'd["state"]')"
expect "the torch job still suspended after kill -9" suspended "$(field train 'd["state"]')"
expect "not duplicated: the same vLLM process" "$vpid" "$(field chat-exp 'd["process"]["pid"]')"
expect "not duplicated: one vLLM process" 1 "$(pgrep -fc "fake_vllm.py --port $VP")"
expect "not duplicated: one torch process" 1 "$(pgrep -fc "fake_torch.py --mib 15000 --status $tmp/torch.status")"
expect "the P0 still there" 1 "$(api GET /v1/services | json 'sum(1 for s in d["services"] if s["id"] == "online-a")')"

# ---- the P0 released: both back on their GPU (room frees), same processes ----
api DELETE /v1/services/online-a >/dev/null
wait_for 30 state_is chat-exp running || bad "the vLLM service did not resume: $(field chat-exp 'd["state"]'); $(tail -5 "$D/err")"
wait_for 30 state_is train running || bad "the torch job did not resume: $(field train 'd["state"]'); $(tail -5 "$D/err")"
expect "the same vLLM process" "$vpid" "$(field chat-exp 'd["process"]["pid"]')"
expect "the same torch process" "$tpid" "$(field train 'd["process"]["pid"]')"
wait_for 30 chat_up || bad "the fake vLLM does not answer after its wake"
moved() { [ "$(steps)" -gt "$((frozen + 2))" ]; }
wait_for 30 moved || bad "the torch job did not work again: $(cat "$tmp/torch.status")"
grep -q "intact=1" "$tmp/torch.status" && ok || bad "the torch job's bytes changed: $(cat "$tmp/torch.status")"

# ---- an operator's suspend and resume; kill -9 while suspended ----
expect "operator suspend" 200 "$(code POST /v1/services/train/suspend)"
wait_for 30 state_is train suspended || bad "the operator's suspend: $(field train 'd["state"]')"
kill -9 "$DPID"
wait "$DPID" 2>/dev/null
start_d
expect "still suspended after kill -9" suspended "$(field train 'd["state"]')"
expect "not duplicated: the same process" "$tpid" "$(field train 'd["process"]["pid"]')"
expect "one torch process" 1 "$(pgrep -fc "fake_torch.py --mib 15000 --status $tmp/torch.status")"
expect "operator resume" 200 "$(code POST /v1/services/train/resume)"
wait_for 30 state_is train running || bad "the resume after a restart: $(field train 'd["state"]'); $(tail -5 "$D/err")"
grep -q "intact=1" "$tmp/torch.status" && ok || bad "bytes after the restart: $(cat "$tmp/torch.status")"

# ---- a suspend that never completes: evicted after suspend_timeout_ms ----
# a mechanism's endpoint on loopback: POSTs to the paths in HANG never answer, the others get 200;
# its port in $tmp/NAME
hook_server() { # NAME HANG...
    local name=$1
    shift
    $py -c "
import http.server, os, sys, time
hang = sys.argv[1:]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        if '*' in hang or self.path in hang:
            time.sleep(3600)
        self.send_response(200)
        self.send_header('Content-Length', '0')
        self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
open('$tmp/$name.tmp', 'w').write(str(s.server_address[1]))
os.rename('$tmp/$name.tmp', '$tmp/$name')
s.serve_forever()" "$@" &
    pids+=($!)
    wait_for 10 test -s "$tmp/$name" || bad "the server $name did not start"
}
hook_server hp '*'
HP=$(cat "$tmp/hp")
api DELETE /v1/services/chat-exp >/dev/null
api DELETE /v1/services/train >/dev/null
gone_all() { [ -z "$(field chat-exp 'd["state"]')" ] && [ -z "$(field train 'd["state"]')" ]; }
wait_for 30 gone_all || bad "the first two did not go"
NP=$(free_port)
expect "a vLLM whose sleep frees nothing" 201 "$(code POST /v1/services '{"id":"nofree","class":"experiment","vram":"8000MiB",
 "command":["'$py'","'$here'/tests/fakes/fake_vllm.py","--port","'$NP'","--dev-mode","--enable-sleep-mode",
  "--vram-mib","7000","--residual-mib","500","--sleep-frees-nothing","--cuda","--cuda-lib","'$fakedir'/libcuda.so.1"],
 "env":'"$env_json"',"suspend":{"method":"vllm","url":"http://127.0.0.1:'$NP'"}}')"
nchat_up() { [ "$(curl -s -m 5 "http://127.0.0.1:$NP/is_sleeping" | json 'd["is_sleeping"]' 2>/dev/null)" = False ]; }
wait_for 30 nchat_up || bad "the second fake vLLM did not answer"
api POST /v1/services/nofree/ready '{}' >/dev/null
held() { [ "$(field nofree 'd["used_mib"]')" = 7000 ]; }
wait_for 30 held || bad "the shim did not count its memory: $(api GET /v1/services/nofree)"
expect "a service whose suspend hangs" 201 "$(code POST /v1/services '{"id":"stuck","class":"experiment","vram":"16000MiB","suspend":{"method":"http","url":"http://127.0.0.1:'$HP'","suspend":"/s","resume":"/r"}}')"
api POST /v1/services/stuck/ready '{}' >/dev/null
api PUT /v1/services/stuck/usage '{"vram_mib":16000}' >/dev/null # it holds its memory
expect "the P0 again" 202 "$(code POST /v1/services '{"id":"online-b","class":"online","vram":"36000MiB"}')"
gone() { s=$(field "$1" 'd["state"]'); [ "$s" = draining ] || [ "$s" = overdue ] || [ -z "$s" ]; }
wait_for 30 gone stuck || bad "a suspend past its timeout was not escalated: $(field stuck 'd["state"]')"
api GET "/v1/events?since=0" | grep -q "suspend_timeout" && ok || bad "no suspend_timeout reason in the events"
# its mechanism said done, its memory never fell: still suspending until the timeout evicts it
api GET "/v1/events?since=0" | grep -q 'nofree: its mechanism says it is suspended, but 7000 MiB' && ok || bad "no wait for the fall: $(api GET "/v1/events?since=0" | grep -o '"message":"nofree[^"]*"' | tail -3)"
wait_for 30 gone nofree || bad "a suspend whose memory never fell was not escalated: $(field nofree 'd["state"]')"
expect "nofree was never suspended" 0 "$(api GET "/v1/events?since=0" | json 'sum(1 for e in d["events"] if e.get("service") == "nofree" and e.get("kind") == "suspended")')"

# ---- kill -9 while a suspend is under way, its memory falling meanwhile: after the restart the
# suspend is seen done, not waited for until its timeout evicts it (the fall is judged against
# what it held when the suspend began, not what is left after the restart) ----
api DELETE /v1/services/online-b >/dev/null
api DELETE /v1/services/stuck >/dev/null
api DELETE /v1/services/nofree >/dev/null
sed -i 's/^suspend_timeout_ms: .*/suspend_timeout_ms: 20000/' "$D/c.yaml"
kill -9 "$DPID"
wait "$DPID" 2>/dev/null
start_d
SP=$(free_port)
expect "a vLLM whose sleep takes 2.5 s" 201 "$(code POST /v1/services '{"id":"slowv","class":"experiment","vram":"4000MiB",
 "command":["'$py'","'$here'/tests/fakes/fake_vllm.py","--port","'$SP'","--dev-mode","--enable-sleep-mode",
  "--vram-mib","3000","--residual-mib","1000","--sleep-ms","2500","--usage-file","'$tmp'/slowv.usage","--cuda","--cuda-lib","'$fakedir'/libcuda.so.1"],
 "env":'"$env_json"',"suspend":{"method":"vllm","url":"http://127.0.0.1:'$SP'","residual":"500MiB"}}')"
sleeping() { curl -s -m 5 "http://127.0.0.1:$SP/is_sleeping" | json 'd["is_sleeping"]' 2>/dev/null; }
vused() { json 'd["vram_used_mib"]' <"$tmp/slowv.usage" 2>/dev/null; } # the fake's own word, written as its memory moves
wait_for 30 eval '[ "$(sleeping)" = False ]' || bad "the slow fake vLLM did not answer"
api POST /v1/services/slowv/ready '{}' >/dev/null
sheld() { [ "$(field slowv 'd["used_mib"]')" = 3000 ]; }
wait_for 30 sheld || bad "the shim did not count the slow vLLM: $(api GET /v1/services/slowv)"
spid=$(field slowv 'd["process"]["pid"]')
expect "operator suspend of the slow vLLM" 200 "$(code POST /v1/services/slowv/suspend)"
# its sleep has begun (is_sleeping turns true as it pauses, before the 2.5 s it takes to free)
wait_for 10 eval '[ "$(sleeping)" = True ]' || bad "the slow vLLM's sleep did not begin"
kill -9 "$DPID"
wait "$DPID" 2>/dev/null
expect "killed before its memory fell" 3000 "$(vused)"
wait_for 30 eval '[ "$(vused)" = 1000 ]' || bad "the slow fake vLLM's memory did not fall: $(cat "$tmp/slowv.usage")"
start_d
wait_for 30 state_is slowv suspended || bad "after the restart the suspend is not seen done: $(field slowv 'd["state"]'); $(grep slowv "$D/err" | tail -3)"
r=$(field slowv 'd["residual_mib"]')
[ "$r" = 1000 ] && ok || bad "its residual as measured: got $r, want 1000; $(grep 'slowv: ' "$D/err" | tail -4)"
expect "the same slow vLLM process" "$spid" "$(field slowv 'd["process"]["pid"]')"
api GET "/v1/events?since=0" | grep -q '"service": *"slowv"[^}]*"kind": *"evict"' && bad "slowv was evicted" || ok
expect "a suspended service's resize is refused" 409 "$(code PATCH /v1/services/slowv '{"vram_mib":5000}')"
grep -q "slowv is suspended: a suspended service keeps the grant it left with" "$tmp/body" && ok || bad "the refusal names the state: $(cat "$tmp/body")"
expect "a residual over the request" 422 "$(code POST /v1/services '{"id":"bigres","class":"batch","vram":"1GiB","suspend":{"method":"vllm","url":"http://127.0.0.1:'$SP'","residual":"2GiB"}}')"
grep -q "field 'suspend.residual' (2048 MiB) is more than the request" "$tmp/body" && ok || bad "the refusal names the field: $(cat "$tmp/body")"
# relocate: the driver's remap needs the GPUs' UUIDs (an NVML pool), one GPU, method cuda
expect "relocate on a simulated pool" 422 "$(code POST /v1/services '{"id":"rel","class":"batch","vram":"1GiB","suspend":{"method":"cuda","relocate":true}}')"
grep -q "suspend.relocate needs the GPUs' UUIDs for the driver's remap: this pool is simulated" "$tmp/body" && ok || bad "the refusal says why: $(cat "$tmp/body")"
expect "relocate of two GPUs" 422 "$(code POST /v1/services '{"id":"rel","class":"batch","vram":"1GiB","gpus":2,"suspend":{"method":"cuda","relocate":true}}')"
grep -q "suspend.relocate needs the GPUs' UUIDs" "$tmp/body" && ok || bad "the refusal says why: $(cat "$tmp/body")"
expect "relocate by vLLM" 422 "$(code POST /v1/services '{"id":"rel","class":"batch","vram":"1GiB","suspend":{"method":"vllm","url":"http://127.0.0.1:'$SP'","relocate":true}}')"
grep -q "field 'suspend.relocate' is not a field of method vllm" "$tmp/body" && ok || bad "the refusal names the method: $(cat "$tmp/body")"
expect "relocate not a boolean" 422 "$(code POST /v1/services '{"id":"rel","class":"batch","vram":"1GiB","suspend":{"method":"cuda","relocate":"yes"}}')"
grep -q "field 'suspend.relocate' must be true or false" "$tmp/body" && ok || bad "the refusal says the type: $(cat "$tmp/body")"
api DELETE /v1/services/slowv >/dev/null
sgone() { ! kill -0 "$spid" 2>/dev/null; }
wait_for 30 sgone || bad "the slow vLLM's process did not end with its release"

# ---- a wake its mechanism never answers: past its resume cost the service is taken as resumed;
# an operator's suspend meanwhile waits for the wake (test_idle_suspend: a slow wake), and says
# so: a wake that hangs is seen to be what holds it ----
hook_server rp /r
RP=$(cat "$tmp/rp")
expect "a service whose resume hangs" 201 "$(code POST /v1/services '{"id":"rhang","class":"batch","vram":"2000MiB","suspend":{"method":"http","url":"http://127.0.0.1:'$RP'","suspend":"/s","resume":"/r"}}')"
api POST /v1/services/rhang/ready '{}' >/dev/null
expect "rhang suspended" 200 "$(code POST /v1/services/rhang/suspend)"
wait_for 30 state_is rhang suspended || bad "rhang's suspend: $(field rhang 'd["state"]')"
expect "rhang resumed by the operator" 200 "$(code POST /v1/services/rhang/resume)"
wait_for 30 state_is rhang running || bad "rhang not taken as resumed after its resume cost: $(field rhang 'd["state"]')"
expect "a suspend while its wake is unanswered" 200 "$(code POST /v1/services/rhang/suspend)"
waits() { api GET "/v1/events?since=0" | grep -q "rhang: its suspend waits for its mechanism to answer the wake under way"; }
wait_for 10 waits || bad "the suspend's wait for the wake is not said: $(grep rhang "$D/err" | tail -3)"
api DELETE /v1/services/rhang >/dev/null

# ---- a degrade not yet acknowledged: the suspend's refusal says so ----
expect "a degradable batch job" 201 "$(code POST /v1/services '{"id":"dg","class":"batch","vram":"30000MiB","min_vram":"10000MiB","suspend":{"method":"http","url":"http://127.0.0.1:'$RP'","suspend":"/s","resume":"/r"}}')"
api POST /v1/services/dg/ready '{}' >/dev/null
api PUT /v1/services/dg/usage '{"vram_mib":30000}' >/dev/null
expect "a P0 that needs its room" 202 "$(code POST /v1/services '{"id":"online-c","class":"online","vram":"20000MiB"}')"
acking() { [ "$(field dg 'd["state"] + " " + str("deadline_unix_ms" in d)')" = "degraded True" ]; } # its ack's deadline
wait_for 10 acking || bad "dg not degraded, waiting for its ack: $(api GET "/v1/events?since=0" | grep -o "\"message\": *\"[^\"]*dg[^\"]*\"" | tail -5)"
expect "suspend before the degrade's ack" 409 "$(code POST /v1/services/dg/suspend)"
grep -q "dg is degraded and has not acknowledged its degrade yet" "$tmp/body" && ok || bad "the refusal says the ack is missing: $(cat "$tmp/body")"
api DELETE /v1/services/online-c >/dev/null
api DELETE /v1/services/dg >/dev/null

echo "test_suspend: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
