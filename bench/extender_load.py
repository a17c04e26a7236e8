#!/usr/bin/python3
"""bench-extender: oversub-scheduler's filter + prioritize for one pod across 1,000 nodes.

Usage: extender_load.py OVERSUBD OVERSUB_SCHEDULER [--nodes 1000] [--daemons 8] [--pods 60]

A 1,000-node cluster on one machine: --daemons real oversubd processes (8 x 81920 MiB each,
--services pods already bound on each), and 1,000 node names spread over them, so every node
name is a real oversubd answering a real dry run (several names share one daemon: 2 cores
cannot run 1,000 daemons). For each of --pods pods (distinct UIDs: nothing cached), kube-
scheduler's two calls are made in turn, as it makes them: filter (1,000 dry runs fanned out),
then prioritize (the same decisions, from the cache). Reported: p50 / p99 / max per call and
per pod (filter + prioritize), against kube-scheduler's 5 s default extender timeout; and,
side by side in the same run, the same 1,000 dry runs sent straight to the daemons by one
client over 64 connections (the floor: what the nodes themselves take).
"""
import argparse
import http.client
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse


def start(argv, log):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 1.0)
        if r:
            line = p.stdout.readline()
            if line.startswith("listening on http://"):
                threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
                return p, line.split()[2]
            if not line:
                break
    sys.exit("could not start %s (see %s)" % (argv[0], log))


class Client:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)

    def post(self, path, body):
        data = json.dumps(body).encode()
        self.c.request("POST", path, data, {"Content-Type": "application/json"})
        r = self.c.getresponse()
        return r.status, json.loads(r.read())


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]


def pod(i, mib):
    return {"metadata": {"name": "bench-%d" % i, "namespace": "bench",
                         "uid": "00000000-0000-4000-9000-%012d" % i, "creationTimestamp": None,
                         "annotations": {"oversub.io/class": "batch"}},
            "spec": {"containers": [{"name": "m", "image": "x", "resources": {
                "limits": {"oversub.io/vram-mib": str(mib)}}}], "priority": 100},
            "status": {}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("oversubd")
    ap.add_argument("scheduler")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--daemons", type=int, default=8)
    ap.add_argument("--services", type=int, default=12)
    ap.add_argument("--pods", type=int, default=60)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="osub-bench-ext-")
    procs = []
    try:
        daemons = []
        for d in range(a.daemons):
            cfg = os.path.join(tmp, "d%d.yaml" % d)
            with open(cfg, "w") as f:
                f.write("api_conns_per_client: 1024\napi_conns_max: 4096\nkubernetes_api: none\n")
            p, url = start([a.oversubd, "--config", cfg, "--listen", "127.0.0.1:0", "--state",
                            os.path.join(tmp, "d%d.db" % d), "--socket", "", "--gpus", "sim:8x81920"],
                           os.path.join(tmp, "d%d.log" % d))
            procs.append(p)
            daemons.append(url)
            c = Client(url)
            for s in range(a.services):  # pods already there: batch and experiment, some online
                cls = ("online", "batch", "experiment")[s % 3]
                code, r = c.post("/v1/services", {"id": "svc-%d" % s, "class": cls,
                                                  "vram_mib": 20000 + 1000 * (s % 5)})
                if code not in (200, 201, 202):
                    sys.exit("could not fill daemon %d: %s" % (d, r))
        argv = [a.scheduler, "--listen", "127.0.0.1:0", "--pool-refresh-ms", "60000",
                "--node-timeout", "4000"]
        for n in range(a.nodes):
            argv += ["--node", "node-%04d=%s" % (n, daemons[n % a.daemons])]
        p, ext = start(argv, os.path.join(tmp, "ext.log"))
        procs.append(p)
        names = ["node-%04d" % n for n in range(a.nodes)]
        c = Client(ext)
        # one pod first, not measured: connections to every node opened
        c.post("/filter", {"Pod": pod(999999, 4096), "Nodes": None, "NodeNames": names})
        filt, prio, both = [], [], []
        passed = None
        for i in range(a.pods):
            body = {"Pod": pod(i, 4096 + 1024 * (i % 8)), "Nodes": None, "NodeNames": names}
            t0 = time.perf_counter()
            code, r = c.post("/filter", body)
            t1 = time.perf_counter()
            code2, r2 = c.post("/prioritize", body)
            t2 = time.perf_counter()
            if code != 200 or code2 != 200 or len(r2) != a.nodes:
                sys.exit("bad answer: %s %s" % (code, str(r)[:300]))
            passed = len(r["NodeNames"])
            filt.append(t1 - t0)
            prio.append(t2 - t1)
            both.append(t2 - t0)
        # the floor: the same dry runs straight to the daemons, 64 connections, no extender
        spec = {"id": "pod-direct", "class": "batch", "vram_mib": 8192, "queue": False}
        direct = []
        for rep in range(5):
            conns = [Client(daemons[k % a.daemons]) for k in range(64)]
            lock = threading.Lock()
            todo = list(range(a.nodes))

            def worker(cl):
                while True:
                    with lock:
                        if not todo:
                            return
                        todo.pop()
                    cl.post("/v1/services?dry_run=1", spec)
            t0 = time.perf_counter()
            ts = [threading.Thread(target=worker, args=(cl,)) for cl in conns]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            direct.append(time.perf_counter() - t0)
        ms = lambda x: "%.1f ms" % (x * 1000)
        print("oversub-scheduler, %d nodes (%d oversubd, %d services each), %d pods:" %
              (a.nodes, a.daemons, a.services, a.pods))
        print("  filter      p50 %s  p99 %s  max %s  (%d of %d nodes passed the last pod)" %
              (ms(pct(filt, 50)), ms(pct(filt, 99)), ms(max(filt)), passed, a.nodes))
        print("  prioritize  p50 %s  p99 %s  max %s" % (ms(pct(prio, 50)), ms(pct(prio, 99)), ms(max(prio))))
        print("  per pod     p50 %s  p99 %s  max %s   kube-scheduler's timeout: 5000 ms per call "
              "(p99 filter is %.1f%% of it)" % (ms(pct(both, 50)), ms(pct(both, 99)), ms(max(both)),
                                                 100 * pct(filt, 99) / 5.0))
        print("  the same %d dry runs sent straight to the daemons (64 connections, no extender):"
              " median %s; filter's median is %.2fx that" %
              (a.nodes, ms(pct(direct, 50)), pct(filt, 50) / pct(direct, 50)))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
