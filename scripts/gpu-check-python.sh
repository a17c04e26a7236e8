#!/usr/bin/env bash
# gpu-check-python.sh - the Python client on a real NVIDIA GPU (issue 26), in under 5 minutes:
# oversubd with --gpus nvml; examples/python/batch_infer.py --torch (a randomly initialised MLP,
# no weights downloaded) as a P1 managed service under the CUDA shim; then a P0 PyTorch server
# (examples/python/serve.py --torch) whose arrival degrades the job. Checked, as NVML sees it:
# the job's memory falls below its floor within the acknowledgement timeout; the P0 server
# starts and serves; the job is restored, finishes, and did every unit exactly once.
#
# Usage: scripts/gpu-check-python.sh [BUILD_DIR]     (default: build; needs oversubd and the
#        shim built there: make)
#   PYTHON=...   the interpreter with PyTorch (default python3)
#   GPU=N        the GPU to use when there are several (default 0); the others are cordoned so
#                that the job and the P0 server share it
# Exit 0: passed; 1: failed; 77: no GPU, no NVIDIA driver or no PyTorch with CUDA here.
# It prints FIGURE lines (memory in MiB, times in ms) for the report.
set -u
case "${1:-}" in
-h | --help)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$here/build}")
py=${PYTHON:-python3}
bin=$build/oversubd
skip() { echo "gpu-check-python: SKIP: $*"; exit 77; }
command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi (no NVIDIA driver)"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || skip "nvidia-smi lists no GPU"
[ -x "$bin" ] || { echo "gpu-check-python: FAIL: no $bin (build first: make)"; exit 1; }
"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    skip "$py has no PyTorch with CUDA (PYTHON=... names another interpreter)"
tmp=$(mktemp -d)
dpid=""
cleanup() {
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    # the managed services oversubd left (it leaves them running when it stops): by their folder
    for p in /proc/[0-9]*; do
        ls -l "$p/cwd" "$p/fd" 2>/dev/null | grep -q -- "$tmp" && kill -9 "${p#/proc/}" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
cat >"$tmp/c.yaml" <<'YAML'
allow_root_services: true
ack_timeout_ms: 15000
grace_ms: 30000
hysteresis_ms: 3000
min_runtime_ms: 0
restart_cost_ms: 120000
poll_ms: 200
YAML
"$bin" --config "$tmp/c.yaml" --gpus nvml --listen 127.0.0.1:0 --socket "$tmp/s.sock" \
    --state "$tmp/st/db" --ratio 1.3 --tick-ms 100 >"$tmp/out" 2>"$tmp/err" &
dpid=$!
for _ in $(seq 1 300); do [ -S "$tmp/s.sock" ] && break; sleep 0.1; done
[ -S "$tmp/s.sock" ] || { echo "gpu-check-python: FAIL: oversubd did not start: $(cat "$tmp/err")"; exit 1; }

PYTHONPATH=$here/clients/python PYTHONDONTWRITEBYTECODE=1 "$py" - "$here" "$tmp" "$py" "${GPU:-0}" <<'PY'
import json, os, subprocess, sys, threading, time, http.client
here, tmp, py, gpu = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import oversub

adm = oversub.Client("unix:" + os.path.join(tmp, "s.sock"))
t_start = time.monotonic()
fails = []
def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    fails.append(msg)
def figure(name, value):
    print(f"FIGURE {name}: {value}", flush=True)
def wait(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            v = pred()
        except oversub.OversubError:
            v = None
        if v:
            return v
        time.sleep(0.1)
    raise SystemExit(f"FAIL: timed out ({timeout} s) waiting for {what}\n" +
                     open(os.path.join(tmp, "err")).read()[-3000:])

pool = adm.pool()
g = pool["gpus"][gpu]
vram = g["vram_mib"]
figure("gpu", f"{g.get('name')} {vram} MiB, index {gpu} of {len(pool['gpus'])}")
for i in range(len(pool["gpus"])):
    if i != gpu:
        adm.request("POST", f"/v1/gpus/{i}/cordon")

def nvml_mib(pid_list):
    """What NVML shows the processes using on the GPU (nvidia-smi's compute apps)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    total = 0
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) in pid_list:
            total += int(parts[1])
    return total

def card_used():
    out = subprocess.run(["nvidia-smi", "-i", str(gpu), "--query-gpu=memory.used",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    try:
        return int(out.split()[0])
    except (IndexError, ValueError):
        return 0

def state_of(sid):
    try:
        return adm.service(sid)["state"]
    except oversub.UnknownService:
        return "gone"

def pids_of(sid):
    """The service's processes: its leader and every descendant."""
    info = adm.service(sid)
    root = info.get("pid") or (info.get("process") or {}).get("pid")
    if not root:
        return set()
    kids = {int(root)}
    changed = True
    while changed:
        changed = False
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) in kids:
                continue
            try:
                ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid in kids:
                kids.add(int(p))
                changed = True
    return kids

# sizes from the card: job 45% (floor 15%), its memory ~40% at full batch and ~10% degraded;
# the P0 server 60%: it fits beside the job only once the job is at its floor
units = 8000
batch, min_batch = 64, 16
job_mib, floor_mib = vram * 45 // 100, vram * 15 // 100
per_item = max(16, (vram * 38 // 100 - 2048) // batch)
p0_mib = vram * 60 // 100
out, trace = os.path.join(tmp, "job.out"), os.path.join(tmp, "job.trace")
baseline = card_used()
figure("card_used_before", f"{baseline} MiB")

def job_nvml():
    """The job's memory as NVML sees it: its processes' (nvidia-smi's compute apps), or, where
    this container's PIDs are not the driver's, the card's use less what it was before."""
    per = nvml_mib(pids_of("job"))
    if per > 0:
        return per, "per process"
    return card_used() - baseline, "card less baseline"
env = {"PYTHONPATH": os.path.join(here, "clients", "python"), "PYTHONDONTWRITEBYTECODE": "1"}
job = adm.submit({"id": "job", "class": "batch", "vram_mib": job_mib, "min_vram_mib": floor_mib,
                  "batch_size": batch, "min_batch_size": min_batch, "gpus": 1, "resumable": True,
                  "restart_cost_ms": 120000, "env": env,
                  "command": [py, os.path.join(here, "examples/python/batch_infer.py"), "--torch",
                              "--units", str(units), "--unit-ms", "4", "--output", out,
                              "--trace", trace, "--mib-per-item", str(per_item),
                              "--dim", "2048", "--layers", "4", "--headroom-mib", "1024"]})
figure("job", f"grant {job_mib}, floor {floor_mib}, batch {batch}->{min_batch}, "
              f"{per_item} MiB per unit of the batch, decision {job['decision']['outcome']}")
wait(lambda: adm.service("job")["state"] == "running", 120, "the job running (ready)")
wait(lambda: os.path.exists(trace) and sum(1 for _ in open(trace)) >= 3 * batch, 120,
     "the job's first batches")
before, how = job_nvml()
figure("job_nvml_before", f"{before} MiB ({how}; processes {sorted(pids_of('job'))})")
figure("job_daemon_view", json.dumps({k: adm.service("job").get(k) for k in ("used_mib", "shim")}))
if before <= floor_mib:
    fail(f"the job uses {before} MiB at full batch, not above its floor {floor_mib}: "
         "the check would prove nothing")

# the P0 arrival
t0 = time.monotonic()
srv = adm.submit({"id": "chat", "class": "online", "vram_mib": p0_mib, "gpus": 1, "env": env,
                  "restart_cost_ms": 120000,
                  "command": [py, os.path.join(here, "examples/python/serve.py"), "--torch",
                              "--port", "0", "--max-concurrency", "8",
                              "--reserve-mib", str(p0_mib * 60 // 100),
                              "--seq-mib", str(p0_mib * 20 // 100 // 8),
                              "--headroom-mib", "1024", "--token-ms", "5"]})
figure("p0_decision", json.dumps(srv["decision"]))
victims = srv["decision"].get("victims", [])
if not any(v["service"] == "job" and v["action"] == "degrade" for v in victims):
    fail(f"the P0 arrival did not degrade the job: {srv['decision']}")
ack_timeout_s = 15.0
fell = None
low = before
while time.monotonic() - t0 < ack_timeout_s + 5:
    now, how = job_nvml()
    low = min(low, now)
    if now < floor_mib:
        fell = time.monotonic() - t0
        break
    time.sleep(0.1)
figure("job_nvml_after", f"{low} MiB ({how}; floor {floor_mib})")
if fell is None:
    fail(f"the job's memory did not fall below its floor {floor_mib} MiB within "
         f"{ack_timeout_s:.0f} s (lowest seen {low} MiB)")
else:
    figure("job_below_floor_ms", int(fell * 1000))
    if fell > ack_timeout_s:
        fail(f"below the floor only after {fell:.1f} s, past the ack timeout")
evs = [e for e in adm.events(0)["events"] if e.get("service") == "job"]
if any(e["kind"] == "escalate" for e in evs):
    fail("the job's degrade escalated to an eviction")
wait(lambda: adm.service("chat")["state"] == "running", 120, "the P0 server running")
figure("p0_running_ms", int((time.monotonic() - t0) * 1000))
backend = wait(lambda: (adm.service("chat").get("backends") or [None])[0], 30, "its backend")
host, port = backend[len("http://"):].rsplit(":", 1)
c = http.client.HTTPConnection(host, int(port), timeout=30)
c.request("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user",
          "content": "hi"}], "max_tokens": 8}), {"Content-Type": "application/json"})
r = c.getresponse()
if r.status != 200:
    fail(f"the P0 server answered {r.status}")
figure("p0_nvml", f"{nvml_mib(pids_of('chat'))} MiB")
figure("job_state_with_p0", adm.service("job")["state"])
# the P0 leaves: the job is restored and finishes
adm.release("chat")
# restored (running at its full grant again), unless it finished first
wait(lambda: state_of("job") in ("running", "gone"), 60, "the job restored")
figure("job_after_p0_left", state_of("job"))
wait(lambda: os.path.exists(out), 240 - (time.monotonic() - t_start), "the job's results")
done = [int(l.split()[0]) for l in open(trace)]
res = [json.loads(l)["unit"] for l in open(out)]
sizes = sorted({int(l.split()[2]) for l in open(trace)})
figure("job_batches", sizes)
if sorted(done) != list(range(1, units + 1)):
    fail(f"units done: {len(done)} lines, {len(set(done))} distinct, of {units}")
if res != list(range(1, units + 1)):
    fail(f"results: {len(res)} lines, not 1..{units} in order")
if min_batch not in sizes or batch not in sizes:
    fail(f"batch sizes {sizes}: want {batch} and {min_batch}")
figure("total_s", round(time.monotonic() - t_start, 1))
print("gpu-check-python: " + ("FAIL" if fails else "PASS"), flush=True)
sys.exit(1 if fails else 0)
PY
rc=$?
if [ $rc -ne 0 ]; then
    echo "--- oversubd's log"; tail -30 "$tmp/err"
    for f in "$tmp"/st/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done
fi
exit $rc
