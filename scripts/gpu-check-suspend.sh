#!/usr/bin/env bash
# gpu-check-suspend.sh - suspend on a real NVIDIA GPU (issue 25), in under 5 minutes: oversubd
# with --gpus nvml runs a PyTorch process holding a known 8 GiB tensor as a P1 managed service
# with "suspend": {"method": "cuda"} (the driver's checkpoint API, driver 550+); a P0 arrival
# that needs the physical room suspends it. Checked: the process is not killed (same PID);
# NVML shows its memory freed; the P0 is admitted; once the P0 is released the process resumes
# on its GPU and the tensor's checksum is unchanged. Prints suspend and resume seconds per GiB.
#
# Usage: scripts/gpu-check-suspend.sh [BUILD_DIR]     (default: build; needs oversubd: make)
#   PYTHON=...   the interpreter with PyTorch (default python3)
#   GPU=N        the GPU to use when there are several (default 0; the others are cordoned)
#   GIB=N        the tensor's size (default 8)
# Exit 0: passed; 1: failed; 77: no GPU, no NVIDIA driver, no checkpoint API or no PyTorch
# with CUDA here. It prints FIGURE lines (memory in MiB, times in s) for the report.
set -u
case "${1:-}" in
-h | --help)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$here/build}")
py=${PYTHON:-python3}
bin=$build/oversubd
skip() { echo "gpu-check-suspend: SKIP: $*"; exit 77; }
command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi (no NVIDIA driver)"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || skip "nvidia-smi lists no GPU"
[ -x "$bin" ] || { echo "gpu-check-suspend: FAIL: no $bin (build first: make)"; exit 1; }
"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    skip "$py has no PyTorch with CUDA (PYTHON=... names another interpreter)"
"$py" -c 'import ctypes, sys; c = ctypes.CDLL("libcuda.so.1"); getattr(c, "cuCheckpointProcessLock")' \
    2>/dev/null || skip "the driver's libcuda.so.1 has no checkpoint API (driver 550 or later)"
tmp=$(mktemp -d)
dpid=""
cleanup() {
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    for p in /proc/[0-9]*; do
        ls -l "$p/cwd" "$p/fd" 2>/dev/null | grep -q -- "$tmp" && kill -9 "${p#/proc/}" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
# the job: a tensor of GIB GiB with a known pattern; every 200 ms it sums it on the GPU (a CUDA
# call: it blocks while the process is locked or checkpointed) and writes the sum and a count
cat >"$tmp/holder.py" <<'PY'
import os, sys, time, torch
gib, status = int(sys.argv[1]), sys.argv[2]
n = gib * (1 << 30) // 4
x = (torch.arange(n, dtype=torch.int64, device="cuda") % 251).to(torch.int32)
torch.cuda.synchronize()
steps = 0
while True:
    s = int(x.sum(dtype=torch.int64).item())
    steps += 1
    with open(status + ".tmp", "w") as f:
        f.write(f"{steps} {s} {os.getpid()}\n")
    os.replace(status + ".tmp", status)
    time.sleep(0.2)
PY
cat >"$tmp/c.yaml" <<'YAML'
allow_root_services: true
suspend_host_mib: 32768
suspend_timeout_ms: 120000
restart_cost_ms: 120000
poll_ms: 200
YAML
"$bin" --config "$tmp/c.yaml" --gpus nvml --listen 127.0.0.1:0 --socket "$tmp/s.sock" \
    --state "$tmp/st/db" --ratio 1.5 --tick-ms 100 >"$tmp/out" 2>"$tmp/err" &
dpid=$!
for _ in $(seq 1 300); do [ -S "$tmp/s.sock" ] && break; sleep 0.1; done
[ -S "$tmp/s.sock" ] || { echo "gpu-check-suspend: FAIL: oversubd did not start: $(cat "$tmp/err")"; exit 1; }

PYTHONPATH=$here/clients/python PYTHONDONTWRITEBYTECODE=1 "$py" - "$tmp" "$py" "${GPU:-0}" "${GIB:-8}" <<'PY'
import json, os, subprocess, sys, time
tmp, py, gpu, gib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
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
        time.sleep(0.05)
    raise SystemExit(f"FAIL: timed out ({timeout} s) waiting for {what}\n" +
                     open(os.path.join(tmp, "err")).read()[-3000:])
def nvml_mib(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1])
    return 0
def status():
    try:
        steps, s, pid = open(os.path.join(tmp, "job.status")).read().split()
        return int(steps), int(s), int(pid)
    except (OSError, ValueError):
        return None

pool = adm.pool()
g = pool["gpus"][gpu]
vram = g["vram_mib"]
figure("gpu", f"{g.get('name')} {vram} MiB, index {gpu} of {len(pool['gpus'])}")
for i in range(len(pool["gpus"])):
    if i != gpu:
        adm.request("POST", f"/v1/gpus/{i}/cordon")
n = gib * (1 << 30) // 4
expected = sum((i % 251) * ((n - i + 250) // 251) for i in range(251))
job_mib = gib * 1024 + 3072  # the tensor, the CUDA context and PyTorch's caching
adm.submit({"id": "job", "class": "batch", "vram_mib": job_mib, "gpus": 1,
            "restart_cost_ms": 120000, "suspend": {"method": "cuda"},
            "command": [py, os.path.join(tmp, "holder.py"), str(gib),
                        os.path.join(tmp, "job.status")]})
st = wait(lambda: status() if status() and status()[0] >= 3 else None, 120, "the job's tensor")
adm.request("POST", "/v1/services/job/ready", {})
steps0, sum0, pid = st
figure("checksum_before", f"{sum0} (expected {expected})")
if sum0 != expected:
    fail(f"the tensor's checksum is {sum0} before anything, not {expected}")
held = wait(lambda: nvml_mib(pid) or None, 30, "NVML to show the job's memory")
figure("job_nvml_before", f"{held} MiB, pid {pid}")

# the P0 arrival: it needs the job's physical room
p0_mib = vram - job_mib // 2
t0 = time.monotonic()
r = adm.submit({"id": "p0", "class": "online", "vram_mib": p0_mib, "gpus": 1})
figure("p0_decision", json.dumps(r["decision"]))
if not any(v["service"] == "job" and v["action"] == "suspend"
           for v in r["decision"].get("victims", [])):
    fail(f"the P0 arrival did not suspend the job: {r['decision']}")
freed = wait(lambda: time.monotonic() if nvml_mib(pid) == 0 else None, 180, "NVML to show it freed")
wait(lambda: adm.service("job")["state"] == "suspended", 180, "the job suspended")
t_sus = freed - t0
figure("suspend_s", round(t_sus, 2))
figure("suspend_s_per_gib", round(t_sus / (held / 1024), 3))
svc = adm.service("job")
figure("job_suspended", json.dumps({k: svc.get(k) for k in ("state", "residual_mib", "host_mib")}))
if status()[2] != pid or not os.path.exists(f"/proc/{pid}"):
    fail("the job's process was killed")
wait(lambda: adm.service("p0")["state"] in ("loading", "running"), 60, "the P0 admitted")
frozen = status()[0]
time.sleep(1.0)
if status()[0] > frozen + 1:
    fail("the job kept computing while checkpointed")

# the P0 leaves: the job comes back where it was
t1 = time.monotonic()
adm.release("p0")
wait(lambda: adm.service("job")["state"] == "running", 180, "the job resumed")
back = wait(lambda: status() if status()[0] > frozen + 2 else None, 60, "the job computing again")
t_res = time.monotonic() - t1
figure("resume_s", round(t_res, 2))
figure("resume_s_per_gib", round(t_res / (held / 1024), 3))
figure("checksum_after", back[1])
if back[1] != sum0:
    fail(f"the tensor's checksum changed: {sum0} -> {back[1]}")
if back[2] != pid:
    fail(f"another process: {pid} -> {back[2]}")
figure("job_nvml_after", f"{nvml_mib(pid)} MiB")
figure("total_s", round(time.monotonic() - t_start, 1))
print("gpu-check-suspend: " + ("FAIL" if fails else "PASS"), flush=True)
sys.exit(1 if fails else 0)
PY
rc=$?
if [ $rc -ne 0 ]; then
    echo "--- oversubd's log"; tail -30 "$tmp/err"
    for f in "$tmp"/st/logs/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done
fi
exit $rc
