#!/usr/bin/python3
"""oversub-scheduler against real oversubd nodes on loopback and a stand-in API server.

Usage: test_extender.py OVERSUBD OVERSUB_SCHEDULER

Requests are sent in the exact shapes kube-scheduler writes (PascalCase keys, null where Go
writes nil; tests/k8s/fixtures/), answers are checked key by key. Every wait is for an event
(a line printed, a request recorded, a state reached), with a generous cap.
"""
import copy
import json
import os
import re
import socket
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
if len(sys.argv) != 3:
    sys.exit("usage: test_extender.py OVERSUBD OVERSUB_SCHEDULER")
TMP = tempfile.mkdtemp(prefix="osub-k8s-")
PROCS = []
passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s %s" % (name, detail), flush=True)


def start(argv, name, env=None):
    """Starts a process; returns (proc, url) once it prints 'listening on http://...' (its other
    lines may come before it, in any order)."""
    import queue
    import threading
    log = open(os.path.join(TMP, name + ".log"), "w")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env, text=True)
    PROCS.append(p)
    lines = queue.Queue()
    # one reader drains its stdout for good (it never blocks on a full pipe)
    threading.Thread(target=lambda: [lines.put(l) for l in p.stdout] + [lines.put(None)],
                     daemon=True).start()
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.time()))
        except queue.Empty:
            break
        if line is None:
            break
        if line.startswith("listening on http://"):
            return p, line.split()[2]
    raise SystemExit("%s did not start: %s" % (name, open(os.path.join(TMP, name + ".log")).read()))


def http(method, url, body=None, token=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")  # oversubd refuses changes without it
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text.strip().startswith(("{", "[")) else text)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def wait_for(what, fn, cap=60):
    deadline = time.time() + cap
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    check("waited for " + what, False, "(not seen within %d s)" % cap)
    return None


def fixture(name):
    with open(os.path.join(HERE, "fixtures", name)) as f:
        return json.load(f)


def pod(name, uid, mib, cls=None, prio=None, floor=None, grace=None, ns="serving"):
    """A pod as kube-scheduler serialises it (creationTimestamp null, nil slices as null)."""
    ann = {}
    if cls:
        ann["oversub.io/class"] = cls
    if floor is not None:
        ann["oversub.io/min-vram-mib"] = str(floor)
    spec = {"volumes": None, "containers": [{"name": "main", "image": "x:1", "resources": {
        "limits": {"oversub.io/vram-mib": str(mib)}, "requests": {"oversub.io/vram-mib": str(mib)}}}],
        "schedulerName": "oversub"}
    if prio is not None:
        spec["priority"] = prio
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"metadata": {"name": name, "namespace": ns, "uid": uid, "creationTimestamp": None,
                         "annotations": ann}, "spec": spec, "status": {"phase": "Pending"}}


def uid(n):
    return "00000000-0000-4000-8000-%012d" % n


def main():
    oversubd = os.path.abspath(sys.argv[1])
    ext_bin = os.path.abspath(sys.argv[2])
    token = "kube-test-token"
    tokf = os.path.join(TMP, "kube.token")
    with open(tokf, "w") as f:
        f.write(token + "\n")
    os.chmod(tokf, 0o600)
    api_p, api = start(["/usr/bin/python3", os.path.join(HERE, "apiserver.py"), "--token", token],
                       "apiserver")
    # three nodes, one GPU each: a and b 80 GiB, c 40 GiB
    nodes = {}
    for n, pool in (("node-a", "sim:1x81920"), ("node-b", "sim:1x81920"), ("node-c", "sim:1x40960")):
        cfg = os.path.join(TMP, n + ".yaml")
        with open(cfg, "w") as f:
            f.write("kubernetes_api: %s\nkubernetes_token_file: %s\nkubernetes_node: %s\n"
                    % (api, tokf, n))
        _, url = start([oversubd, "--config", cfg, "--listen", "127.0.0.1:0", "--state",
                        os.path.join(TMP, n + ".db"), "--socket", "", "--gpus", pool], n,
                       env=dict(os.environ, OSUB_POD_UNBOUND_MS="4000", OSUB_POD_SWEEP_MS="2000",
                                OSUB_POD_RETRY_MS="1000"))
        nodes[n] = url
    ext_args = [ext_bin, "--listen", "127.0.0.1:0", "--kube-api", api, "--kube-token-file", tokf,
                "--kube-ca-file", "", "--pool-refresh-ms", "200"]
    for n, u in nodes.items():
        ext_args += ["--node", "%s=%s" % (n, u)]
    ext_args += ["--node", "node-down=http://127.0.0.1:1"]
    _, ext = start(ext_args, "extender")

    names = ["node-a", "node-b", "node-c", "node-down", "node-nogpu"]

    # -- filter, nodeCacheCapable: the exact reply shape, each node's own reason --------------
    args = fixture("filter_cache_capable.json")
    args["NodeNames"] = names
    # 48 GiB: more than node-c's one 40 GiB GPU can back
    for k in ("limits", "requests"):
        args["Pod"]["spec"]["containers"][0]["resources"][k]["oversub.io/vram-mib"] = "49152"
    code, r = http("POST", ext + "/filter", args)
    check("filter answers 200", code == 200, r)
    check("filter reply has exactly the extender/v1 keys",
          sorted(r.keys()) == ["Error", "FailedAndUnresolvableNodes", "FailedNodes", "NodeNames", "Nodes"], r)
    check("filter: Nodes is null when nodeCacheCapable", r["Nodes"] is None)
    check("filter: Error is empty", r["Error"] == "")
    check("filter: empty 80 GiB nodes pass a 48 GiB online pod",
          sorted(r["NodeNames"]) == ["node-a", "node-b"], r)
    check("filter: a 40 GiB GPU cannot back a 48 GiB online pod: unresolvable",
          "node-c" in r["FailedAndUnresolvableNodes"], r)
    why_c = r["FailedAndUnresolvableNodes"].get("node-c", r["FailedNodes"].get("node-c", ""))
    check("filter: node-c's reason comes from oversub", why_c.startswith("oversub"), why_c)
    check("filter: an unreachable oversubd is a failed node, not unresolvable",
          "node-down" in r["FailedNodes"] and "unreachable" in r["FailedNodes"]["node-down"], r)
    check("filter: a node with no oversubd is unresolvable",
          "node-nogpu" in r["FailedAndUnresolvableNodes"], r)

    # -- keys in another case are read as Go reads them -----------------------------------
    low = {"pod": args["Pod"], "nodes": None, "nodenames": ["node-a"]}
    code, r = http("POST", ext + "/filter", low)
    check("filter reads lower-case keys", code == 200 and r["NodeNames"] == ["node-a"], r)

    # -- not nodeCacheCapable: Node objects in, the passing Node objects out --------------
    a2 = json.loads(json.dumps(fixture("filter_nodes.json")).replace("NODE0", "node-a").replace("NODE1", "node-c"))
    code, r = http("POST", ext + "/filter", a2)
    check("filter with Nodes: NodeNames null", code == 200 and r["NodeNames"] is None, r)
    items = [i["metadata"]["name"] for i in (r.get("Nodes") or {}).get("items", [])]
    check("filter with Nodes: the passing Node objects, as given", items == ["node-a"], r)
    check("filter with Nodes: the Node object is returned whole",
          r["Nodes"]["items"][0]["status"]["capacity"]["cpu"] == "64", r)

    # -- pods oversub cannot take anywhere, or that ask nothing of it ---------------------
    big = fixture("filter_cache_capable.json")
    big["Pod"]["metadata"]["uid"] = uid(900)
    big["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"oversub.io/vram-mib": "300000"}}
    big["NodeNames"] = ["node-a", "node-b"]
    code, r = http("POST", ext + "/filter", big)
    check("a pod too big for any GPU is unresolvable everywhere",
          r["NodeNames"] == [] and sorted(r["FailedAndUnresolvableNodes"]) == ["node-a", "node-b"], r)
    bad = copy.deepcopy(big)
    bad["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"oversub.io/vram-mib": "1.5"}}
    code, r = http("POST", ext + "/filter", bad)
    check("a fractional vram-mib is unresolvable with the field named",
          all("whole number" in v for v in r["FailedAndUnresolvableNodes"].values()) and
          len(r["FailedAndUnresolvableNodes"]) == 2, r)
    bad = copy.deepcopy(big)
    bad["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"oversub.io/vram-mib": "1000"}}
    bad["Pod"]["metadata"]["annotations"] = {"oversub.io/gpus": "zero"}
    code, r = http("POST", ext + "/filter", bad)
    check("a bad annotation is unresolvable with the annotation named",
          all("oversub.io/gpus" in v for v in r["FailedAndUnresolvableNodes"].values()), r)
    none = copy.deepcopy(big)
    none["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    code, r = http("POST", ext + "/filter", none)
    check("a pod asking no vram passes every node", sorted(r["NodeNames"]) == ["node-a", "node-b"], r)

    # -- bind: the grant reserved on the node, then the Binding ---------------------------
    def filter_bind(p, node, candidates=("node-a", "node-b", "node-c")):
        http("POST", api + "/_pods", p)
        code, r = http("POST", ext + "/filter", {"Pod": p, "Nodes": None, "NodeNames": list(candidates)})
        b = {"PodName": p["metadata"]["name"], "PodNamespace": p["metadata"]["namespace"],
             "PodUID": p["metadata"]["uid"], "Node": node}
        return r, http("POST", ext + "/bind", b)

    b1 = pod("train-a", uid(1), 60000, cls="batch", grace=7)
    r, (code, br) = filter_bind(b1, "node-a")
    check("bind answers {\"Error\":\"\"}", code == 200 and br == {"Error": ""}, br)
    code, sv = http("GET", nodes["node-a"] + "/v1/services/pod-" + uid(1))
    check("bind: the pod is a service on node-a", code == 200 and sv.get("class") == "batch", sv)
    k = sv.get("kubernetes", {}) if isinstance(sv, dict) else {}
    check("bind: the service knows its pod and node",
          k.get("name") == "train-a" and k.get("namespace") == "serving" and k.get("node") == "node-a"
          and k.get("grace_seconds") == 7, sv)
    log = http("GET", api + "/_log")[1]
    bindings = [e for e in log if e["path"].endswith("/binding")]
    check("bind: one Binding created", len(bindings) == 1, bindings)
    if bindings:
        bd = bindings[0]
        check("Binding: path names the pod", bd["path"] == "/api/v1/namespaces/serving/pods/train-a/binding")
        check("Binding: body", bd["body"]["kind"] == "Binding" and bd["body"]["apiVersion"] == "v1"
              and bd["body"]["target"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a"}
              and bd["body"]["metadata"]["uid"] == uid(1), bd)
        check("Binding: the service account's token", bd["auth"] == "Bearer " + token, bd)

    # node-b: a batch pod with a floor (degradable); node-c stays empty
    b2 = pod("train-b", uid(2), 60000, cls="batch", floor=30000)
    r, (code, br) = filter_bind(b2, "node-b")
    check("bind train-b", br == {"Error": ""}, br)
    # node-c: 40 GiB; leave it empty

    # -- an online pod now: node-c too small to back it, node-b by degrading, node-a by evicting
    p = pod("chat-1", uid(10), 40000, cls="online", prio=100000, grace=5)
    code, r = http("POST", ext + "/filter", {"Pod": p, "Nodes": None, "NodeNames": ["node-a", "node-b"]})
    check("filter: nodes where the pod starts after victims pass", sorted(r["NodeNames"]) == ["node-a", "node-b"], r)
    code, pr = http("POST", ext + "/prioritize", {"Pod": p, "Nodes": None, "NodeNames": ["node-a", "node-b"]})
    check("prioritize: a bare array of {Host, Score}", code == 200 and isinstance(pr, list)
          and all(sorted(e.keys()) == ["Host", "Score"] for e in pr), pr)
    sc = {e["Host"]: e["Score"] for e in pr} if isinstance(pr, list) else {}
    check("prioritize: scores 0-10", all(0 <= v <= 10 for v in sc.values()), sc)
    check("prioritize: degrading (node-b) ranks above evicting (node-a)",
          sc.get("node-b", 0) > sc.get("node-a", 99), sc)
    # a third node with room: best of all
    p3 = pod("chat-3", uid(13), 30000, cls="online", prio=100000)
    code, pr3 = http("POST", ext + "/prioritize", {"Pod": p3, "Nodes": None, "NodeNames": ["node-a", "node-b", "node-c"]})
    sc3 = {e["Host"]: e["Score"] for e in pr3}
    check("prioritize: no victims (node-c) ranks above victims", sc3["node-c"] > max(sc3["node-a"], sc3["node-b"]), sc3)
    check("prioritize: no victims scores in the top band (6-10)", sc3["node-c"] >= 6, sc3)
    # filter and prioritize agree: the decisions are the same cached answers
    code, mt = http("GET", ext + "/metrics")
    check("prioritize reused filter's answers", "oversub_extender_node_cached_total" in mt and
          int([l for l in mt.splitlines() if l.startswith("oversub_extender_node_cached_total")][0].split()[1]) >= 2, "")

    # -- preempt: kube-scheduler's victims stand where oversub starts the pod ----------------
    # kube-scheduler proposes, on node-a, train-a (a pod on oversub's GPUs, which oversub would
    # evict) and a CPU hog (uid 77, no pod of oversub's); on node-b, train-b (oversub's; oversub
    # only needs to degrade it)
    pa = json.loads(json.dumps(fixture("preempt_meta.json")))
    pa["Pod"] = p
    victims = {
        "node-a": {"Pods": [{"UID": uid(1)}, {"UID": uid(77)}], "NumPDBViolations": 1},
        "node-b": {"Pods": [{"UID": uid(2)}], "NumPDBViolations": 0},
        "node-nogpu": {"Pods": [{"UID": uid(78)}], "NumPDBViolations": 0},
    }
    pa["NodeNameToMetaVictims"] = victims
    code, pr = http("POST", ext + "/preempt", pa)
    check("preempt: reply key", code == 200 and "NodeNameToMetaVictims" in pr, pr)
    mv = pr.get("NodeNameToMetaVictims", {})
    check("preempt (ignoredByScheduler): kube-scheduler's victims stand where oversub starts the pod",
          mv.get("node-a") == victims["node-a"] and mv.get("node-b") == victims["node-b"], mv)
    check("preempt: a node where oversub would not start the pod is dropped", "node-nogpu" not in mv, mv)
    check("preempt: every node listed has at least one victim",
          all(len(v["Pods"]) >= 1 for v in mv.values()), mv)
    extlog = open(os.path.join(TMP, "extender.log")).read()
    check("preempt: the degrade-only node is told apart in the log", "1 degrade-only" in extlog, extlog[-400:])
    check("preempt: and why node-nogpu was dropped", "node-nogpu dropped: no oversubd known" in extlog, extlog[-600:])
    # kube-scheduler counting oversub.io/vram-mib itself: its victims on oversub's GPUs that
    # oversub would not evict are spared
    _, ext4 = start(ext_args[:3] + ["--scheduler-counts-vram"] + ext_args[3:], "extender4")
    code, pr = http("POST", ext4 + "/preempt", pa)
    mv = pr.get("NodeNameToMetaVictims", {})
    check("preempt (counts vram): oversub's own victim and the hog kept on node-a",
          sorted(x["UID"] for x in mv.get("node-a", {}).get("Pods", [])) == sorted([uid(1), uid(77)]), mv)
    check("preempt (counts vram): train-b, which oversub only degrades, spared: node-b dropped",
          "node-b" not in mv, mv)

    # -- bind with victims: node-a evicts train-a through the Eviction API -----------------
    http("POST", api + "/_pods", p)
    code, br = http("POST", ext + "/bind", {"PodName": "chat-1", "PodNamespace": "serving",
                                             "PodUID": uid(10), "Node": "node-a"})
    check("bind with a victim", br == {"Error": ""}, br)
    ev = wait_for("the eviction of train-a", lambda: [e for e in http("GET", api + "/_log")[1]
                                                      if e["path"].endswith("/train-a/eviction")])
    if ev:
        e = ev[0]["body"]
        check("Eviction: policy/v1 Eviction naming the pod", e["apiVersion"] == "policy/v1" and
              e["kind"] == "Eviction" and e["metadata"] == {"name": "train-a", "namespace": "serving"}, e)
        check("Eviction: the pod's grace period and UID precondition",
              e["deleteOptions"] == {"gracePeriodSeconds": 7, "preconditions": {"uid": uid(1)}}, e)
        check("Eviction: with the token", ev[0]["auth"] == "Bearer " + token)
    code, sv = http("GET", nodes["node-a"] + "/v1/services/pod-" + uid(10))
    check("chat-1 waits for its victim", sv.get("state") == "pending", sv.get("state"))
    # the pod leaves (kubelet killed it, the API server deleted it): the node releases it
    http("POST", api + "/_gone", {"namespace": "serving", "name": "train-a"})
    wait_for("train-a released on node-a",
             lambda: http("GET", nodes["node-a"] + "/v1/services/pod-" + uid(1))[0] == 404)
    st = wait_for("chat-1 started", lambda: http("GET", nodes["node-a"] + "/v1/services/pod-" + uid(10))[1]
                  .get("state") in ("loading", "running") or None)
    check("chat-1 starts once its victim's pod is gone", st, "")
    code, mt = http("GET", nodes["node-a"] + "/metrics")
    check("node metrics count the eviction", 'oversub_pod_evictions_total{result="accepted"} 1' in mt, "")

    # -- a PodDisruptionBudget blocks an eviction: asked again, never forced ---------------
    b4 = pod("train-c", uid(4), 15000, cls="batch", grace=3)
    r, (code, br) = filter_bind(b4, "node-b", ("node-b",))
    check("bind train-c (node-b, beside train-b)", br == {"Error": ""}, br)
    http("POST", api + "/_fail", {"eviction": 429})
    p5 = pod("chat-5", uid(5), 50000, cls="online", prio=100000)
    r, (code, br) = filter_bind(p5, "node-b", ("node-b",))
    check("bind chat-5 on node-b (needs an eviction)", br == {"Error": ""}, br)
    blocked = wait_for("two refused evictions on node-b", lambda: len(
        [e for e in http("GET", api + "/_log")[1] if e["path"].endswith("/eviction")
         and "/train-" in e["path"] and not e["path"].endswith("/train-a/eviction")]) >= 2, cap=30)
    check("a blocked eviction is asked again", blocked, "")
    nb = open(os.path.join(TMP, "node-b.log")).read()
    check("the node says why: the disruption budget", "disruption budget" in nb, nb[-500:])
    http("POST", api + "/_fail", {})

    # -- a bind whose Binding fails costs its victim nothing ----------------------------------
    http("POST", api + "/_fail", {})
    va = pod("train-d", uid(20), 30000, cls="batch", grace=2)
    r, (code, br) = filter_bind(va, "node-a", ("node-a",))
    check("bind train-d on node-a", br == {"Error": ""}, br)
    before = len([e for e in http("GET", api + "/_log")[1] if e["path"].endswith("/train-d/eviction")])
    http("POST", api + "/_fail", {"binding": 409})
    pd = pod("chat-d", uid(21), 20000, cls="online", prio=100000)
    r, (code, br) = filter_bind(pd, "node-a", ("node-a",))
    check("the Binding refused: the bind fails", "refused the Binding" in br.get("Error", ""), br)
    http("POST", api + "/_fail", {})
    na = os.path.join(TMP, "node-a.log")
    wait_for("train-d's eviction dropped on node-a", lambda: "evict-dropped" in open(na).read() or
             "its eviction is not sent" in open(na).read())
    after = len([e for e in http("GET", api + "/_log")[1] if e["path"].endswith("/train-d/eviction")])
    check("no Eviction was sent for train-d", after == before == 0, (before, after))
    check("train-d's service is still there", http("GET", nodes["node-a"] + "/v1/services/pod-" + uid(20))[0] == 200)
    check("the node said it held the eviction for the pod it made room for",
          "held until pod serving/chat-d" in open(na).read())

    # -- a Binding whose answer is lost while it went through: the reservation stays --------
    pl = pod("chat-lost", uid(22), 2000, cls="online", prio=100000)
    http("POST", api + "/_pods", pl)
    http("POST", ext + "/filter", {"Pod": pl, "Nodes": None, "NodeNames": ["node-c"]})
    http("POST", api + "/_fail", {"hang": {"binding": 6, "get": 0}})
    code, br = http("POST", ext + "/bind", {"PodName": "chat-lost", "PodNamespace": "serving",
                                             "PodUID": uid(22), "Node": "node-c"})
    check("a lost Binding answer: the pod read says it went through", br == {"Error": ""}, br)
    check("... and its reservation stays", http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(22))[0] == 200)
    http("POST", api + "/_fail", {})
    pu = pod("chat-unknown", uid(23), 2000, cls="online", prio=100000)
    http("POST", api + "/_pods", pu)
    http("POST", ext + "/filter", {"Pod": pu, "Nodes": None, "NodeNames": ["node-c"]})
    http("POST", api + "/_fail", {"hang": {"binding": 6, "get_bound": 6}})
    t0 = time.time()
    code, br = http("POST", ext + "/bind", {"PodName": "chat-unknown", "PodNamespace": "serving",
                                             "PodUID": uid(23), "Node": "node-c"})
    took = time.time() - t0
    http("POST", api + "/_fail", {})
    check("neither answer: the outcome is said to be unknown", "outcome is unknown" in br.get("Error", ""), br)
    check("... and the reservation is kept", http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(23))[0] == 200)
    print("bind with the API server hanging answered in %.1f s" % took)
    # a reservation whose pod is bound nowhere: the node releases it
    orphan = pod("orphan", uid(24), 1000, cls="batch")
    http("POST", api + "/_pods", orphan)
    code, r = http("POST", nodes["node-c"] + "/v1/services", {
        "id": "pod-" + uid(24), "class": "batch", "vram_mib": 1000,
        "kubernetes": {"namespace": "serving", "name": "orphan", "uid": uid(24), "node": "node-c"}})
    check("a reservation made without a Binding", code in (201, 202), r)
    wait_for("the unbound pod's reservation released",
             lambda: http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(24))[0] == 404, cap=90)
    check("the node says why: bound nowhere", "is still bound nowhere" in open(os.path.join(TMP, "node-c.log")).read())

    # -- a Binding the API server refuses: the reservation is released ---------------------
    http("POST", api + "/_fail", {"binding": 409})
    p6 = pod("chat-6", uid(6), 10000, cls="online", prio=100000)
    r, (code, br) = filter_bind(p6, "node-c", ("node-c",))
    check("a refused Binding is a bind error", code == 200 and "refused the Binding" in br.get("Error", ""), br)
    check("the error carries the API server's message", "already assigned" in br.get("Error", ""), br)
    wait_for("the reservation released on node-c",
             lambda: http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(6))[0] == 404)
    http("POST", api + "/_fail", {})

    # -- bind of a pod no filter of ours saw: read from the API server ---------------------
    p7 = pod("chat-7", uid(7), 8000, cls="online", prio=100000)
    http("POST", api + "/_pods", p7)
    code, br = http("POST", ext + "/bind", {"PodName": "chat-7", "PodNamespace": "serving",
                                             "PodUID": uid(7), "Node": "node-c"})
    check("bind reads an unseen pod from the API server", br == {"Error": ""}, br)
    check("... and it runs on node-c", http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(7))[0] == 200)
    code, br = http("POST", ext + "/bind", {"PodName": "ghost", "PodNamespace": "serving",
                                             "PodUID": uid(8), "Node": "node-c"})
    check("bind of a pod the API server does not know: an error", "ghost" in br.get("Error", "") or
          "not found" in br.get("Error", ""), br)
    # a pod deleted without oversub evicting it (kubectl delete), and one that finished (a Job
    # done): their node gives the memory back
    http("POST", api + "/_gone", {"namespace": "serving", "name": "chat-7"})
    done = pod("job-done", uid(11), 2000, cls="batch")
    r, (code, br) = filter_bind(done, "node-c", ("node-c",))
    check("bind job-done", br == {"Error": ""}, br)
    done["status"]["phase"] = "Succeeded"
    done["spec"]["nodeName"] = "node-c"
    http("POST", api + "/_pods", done)
    wait_for("the deleted pod's service released",
             lambda: http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(7))[0] == 404, cap=60)
    wait_for("the finished pod's service released",
             lambda: http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(11))[0] == 404, cap=60)
    nc = open(os.path.join(TMP, "node-c.log")).read()
    check("the node says why: deleted", "pod serving/chat-7 was deleted: released" in nc, nc[-600:])
    check("the node says why: finished", "job-done has finished (Succeeded)" in nc, nc[-600:])
    # the class from the priority: no annotation
    p9 = pod("batchy", uid(9), 1000, prio=10)
    http("POST", api + "/_pods", p9)
    http("POST", ext + "/bind", {"PodName": "batchy", "PodNamespace": "serving", "PodUID": uid(9), "Node": "node-c"})
    check("priority 10 with no annotation is batch",
          http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(9))[1].get("class") == "batch")

    # -- bind checks the pod with the API server before any node reserves for it -----------
    def evictions():
        return len([e for e in http("GET", api + "/_log")[1] if e["path"].endswith("/eviction")])
    before = evictions()
    fake = pod("fake", uid(40), 60000, cls="online", prio=100000, ns="attacker")
    http("POST", ext + "/filter", {"Pod": fake, "Nodes": None, "NodeNames": ["node-a"]})
    code, br = http("POST", ext + "/bind", {"PodName": "fake", "PodNamespace": "attacker",
                                             "PodUID": uid(40), "Node": "node-a"})
    check("bind of a pod the API server does not have: an error, before any node is asked",
          "not found" in br.get("Error", ""), br)
    check("... no service made for it", http("GET", nodes["node-a"] + "/v1/services/pod-" + uid(40))[0] == 404)
    check("... and no eviction asked", evictions() == before, evictions())
    # a pod already bound: bound again to its node is a no-op, to another node an error, and
    # neither touches the running pod's reservation
    code, br = http("POST", ext + "/bind", {"PodName": "batchy", "PodNamespace": "serving",
                                             "PodUID": uid(9), "Node": "node-c"})
    check("binding an already-bound pod to its node again: done", br == {"Error": ""}, br)
    code, br = http("POST", ext + "/bind", {"PodName": "batchy", "PodNamespace": "serving",
                                             "PodUID": uid(9), "Node": "node-a"})
    check("binding it to another node: an error naming where it is", "already bound to node node-c"
          in br.get("Error", ""), br)
    check("its reservation is untouched", http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(9))[0] == 200)
    check("nothing made on the other node", http("GET", nodes["node-a"] + "/v1/services/pod-" + uid(9))[0] == 404)
    code, br = http("POST", ext + "/bind", {"PodName": "a/../../x", "PodNamespace": "b?c",
                                             "PodUID": uid(41), "Node": "node-a"})
    check("names that are no Kubernetes names are refused", "Kubernetes names" in br.get("Error", ""), br)

    # -- what a bind changes on a node is not answered from the cache ----------------------
    def asks():
        mt = http("GET", ext + "/metrics")[1]
        return int([l for l in mt.splitlines() if l.startswith("oversub_extender_node_asks_total")][0].split()[1])
    q = pod("cache-q", uid(42), 1000, cls="batch")
    http("POST", ext + "/filter", {"Pod": q, "Nodes": None, "NodeNames": ["node-c"]})
    a0 = asks()
    http("POST", ext + "/prioritize", {"Pod": q, "Nodes": None, "NodeNames": ["node-c"]})
    check("prioritize right after filter: from the cache", asks() == a0, (a0, asks()))
    other = pod("cache-other", uid(43), 1000, cls="batch")
    filter_bind(other, "node-c", ("node-c",))
    a1 = asks()
    http("POST", ext + "/prioritize", {"Pod": q, "Nodes": None, "NodeNames": ["node-c"]})
    check("after a bind to the node, the node is asked again", asks() == a1 + 1, (a1, asks()))

    # -- a pod the API server shows on another node: its reservation here goes --------------
    moved = http("GET", api + "/api/v1/namespaces/serving/pods/cache-other", token=token)[1]
    moved["spec"]["nodeName"] = "node-a"
    http("POST", api + "/_pods", moved)
    wait_for("the moved pod released on node-c",
             lambda: http("GET", nodes["node-c"] + "/v1/services/pod-" + uid(43))[0] == 404, cap=60)
    check("the node says why: bound elsewhere", "is bound to node node-a, not here" in
          open(os.path.join(TMP, "node-c.log")).read())

    # -- a hung node and a trickling one: filter still answers, with their reason ----------
    import socket
    import threading
    held = []

    def serve(kind):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(64)

        def loop():
            while True:
                try:
                    conn, _ = s.accept()
                except OSError:
                    return
                held.append(conn)
                if kind == "trickle":
                    def drip(cn):
                        try:
                            cn.recv(65536)
                            cn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                            while True:
                                cn.sendall(b" ")
                                time.sleep(0.2)
                        except OSError:
                            pass
                    threading.Thread(target=drip, args=(conn,), daemon=True).start()
        threading.Thread(target=loop, daemon=True).start()
        return "http://127.0.0.1:%d" % s.getsockname()[1]
    hung, trickle = serve("hung"), serve("trickle")
    _, ext3 = start([ext_bin, "--listen", "127.0.0.1:0", "--node-timeout", "1000",
                     "--node", "hung=" + hung, "--node", "trickle=" + trickle,
                     "--node", "node-c=" + nodes["node-c"]], "extender3")
    small = pod("small", uid(44), 500, cls="batch")
    results = []

    def one():
        results.append(http("POST", ext3 + "/filter", {"Pod": small, "Nodes": None,
                                                         "NodeNames": ["hung", "trickle", "node-c"]}))
    ts = [threading.Thread(target=one) for _ in range(3)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    for code, r in results:
        check("filter answers beside a hung and a trickling node", code == 200 and r["NodeNames"] == ["node-c"], r)
        check("... each failed with the deadline said", all(
            "did not answer within 1000 ms" in r["FailedNodes"].get(n, "") for n in ("hung", "trickle")), r)

    # -- a node holds only its own pods ---------------------------------------------------
    code, r = http("POST", nodes["node-a"] + "/v1/services", {
        "id": "pod-" + uid(30), "class": "batch", "vram_mib": 1000,
        "kubernetes": {"namespace": "serving", "name": "elsewhere", "uid": uid(30), "node": "node-b"}})
    check("a pod record for another node is refused (422, both names said)", code == 422 and
          "node-b" in r["error"]["message"] and "node-a" in r["error"]["message"], r)
    code, r = http("POST", nodes["node-a"] + "/v1/services", {
        "id": "pod-" + uid(31), "class": "batch", "vram_mib": 1000,
        "kubernetes": {"namespace": "serving", "name": "x", "uid": uid(31), "extra": 1}})
    check("an unknown field in the pod record: 422 naming it", code == 422 and "extra" in r["error"]["message"], r)
    code, r = http("POST", nodes["node-a"] + "/v1/services", {
        "id": "pod-" + uid(32), "class": "batch", "vram_mib": 1000, "command": ["/bin/true"],
        "kubernetes": {"namespace": "serving", "name": "x", "uid": uid(32)}})
    check("a pod with a command: refused", code in (403, 422), r)

    # -- broken requests ------------------------------------------------------------------
    code, r = http("POST", ext + "/filter", raw=b"{\"Pod\": ")
    check("malformed JSON: 400 with a reason", code == 400 and "not JSON" in r.get("error", ""), r)
    code, r = http("POST", ext + "/filter", raw=b"[1,2]")
    check("a JSON array: 400", code == 400, r)
    code, r = http("GET", ext + "/filter")
    check("GET on a verb: 405", code == 405, r)
    code, r = http("POST", ext + "/nope", {})
    check("unknown path: 404", code == 404, r)
    code, r = http("POST", ext + "/bind", {"PodName": 5})
    check("bind without its fields: an Error", code == 200 and "PodName" in r.get("Error", ""), r)
    code, r = http("POST", ext + "/preempt", {"Pod": p})
    check("preempt with no victims map: an empty map", code == 200 and r.get("NodeNameToMetaVictims") == {}, r)

    # -- metrics pass promtool ------------------------------------------------------------
    code, mt = http("GET", ext + "/metrics")
    if shutil.which("promtool"):
        pt = subprocess.run(["promtool", "check", "metrics"], input=mt, text=True, capture_output=True)
        check("promtool check metrics", pt.returncode == 0, pt.stdout + pt.stderr)
    check("metrics count the binds", 'oversub_extender_binds_total{result="ok"}' in mt)

    # -- nodes found through the API server's Node objects --------------------------------
    api2_p, api2 = start(["/usr/bin/python3", os.path.join(HERE, "apiserver.py"),
                          "--node", "gpu-1=" + nodes["node-a"], "--node", "cpu-1=",
                          "--node", "evil=" + nodes["node-b"] + "@10.9.9.9"], "apiserver2")
    _, ext2 = start([ext_bin, "--listen", "127.0.0.1:0", "--kube-api", api2, "--kube-nodes",
                     "--kube-token-file", "", "--kube-ca-file", ""], "extender2")
    known = wait_for("gpu-1 known from its annotation", lambda: [n for n in http("GET", ext2 + "/v1/nodes")[1]["nodes"]
                                                                 if n["name"] == "gpu-1"])
    check("a node from its oversub.io/url annotation", known and known[0]["url"] == nodes["node-a"], known)
    code, r = http("POST", ext2 + "/filter", {"Pod": p3, "Nodes": None, "NodeNames": ["gpu-1", "cpu-1"]})
    check("a Node without the annotation is unresolvable", "cpu-1" in r["FailedAndUnresolvableNodes"], r)
    names2 = [n["name"] for n in http("GET", ext2 + "/v1/nodes")[1]["nodes"]]
    check("an annotation pointing away from the node's own addresses is ignored (the token never "
          "goes there)", "evil" not in names2, names2)
    check("... and said so", "is not one of the node's addresses" in open(os.path.join(TMP, "extender2.log")).read())

    # -- deploy/kubernetes: what the manifests say is what the programs take --------------
    import yaml
    dk = os.path.join(HERE, "..", "..", "deploy", "kubernetes")
    docs = {}
    for fn in sorted(os.listdir(dk)):
        if fn.endswith(".yaml"):
            with open(os.path.join(dk, fn)) as f:
                docs[fn] = [d for d in yaml.safe_load_all(f) if d]
    sc = docs["scheduler-config.yaml"][0]
    e = sc["extenders"][0]
    check("scheduler config: the extender/v1 config keys and our verbs",
          sc["apiVersion"] == "kubescheduler.config.k8s.io/v1" and e["filterVerb"] == "filter"
          and e["prioritizeVerb"] == "prioritize" and e["preemptVerb"] == "preempt"
          and e["bindVerb"] == "bind" and e["nodeCacheCapable"] is True and e["weight"] > 0
          and e["managedResources"] == [{"name": "oversub.io/vram-mib", "ignoredByScheduler": True}], e)

    def rules(fn, role):
        for d in docs[fn]:
            if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role:
                return {(r, v) for rule in d["rules"] for r in rule["resources"] for v in rule["verbs"]}
        return set()
    need = {("pods/binding", "create"), ("nodes", "list"), ("pods", "get"), ("leases", "update")}
    check("extender RBAC: what it calls", need <= rules("oversub-scheduler.yaml", "oversub-scheduler"))
    need = {("pods/eviction", "create"), ("pods", "get")}
    got = rules("oversubd.yaml", "oversubd")
    check("oversubd RBAC: what it calls, and nothing on nodes", need <= got and
          not any(r == "nodes" for r, _ in got), got)
    cm = [d for d in docs["oversubd.yaml"] if d["kind"] == "ConfigMap"][0]
    conf = yaml.safe_load(cm["data"]["oversub.yaml"])
    tokf2 = os.path.join(TMP, "admin.token")
    with open(tokf2, "w") as f:
        f.write("admin-token-for-the-manifest-check\n")
    os.chmod(tokf2, 0o600)
    conf.update({"listen": "127.0.0.1:0", "state": os.path.join(TMP, "manifest.db"),
                 "token_file": tokf2, "device_plugin": "", "kubernetes_api": "none"})
    mcfg = os.path.join(TMP, "manifest.yaml")
    with open(mcfg, "w") as f:
        yaml.safe_dump(conf, f)
    _, murl = start([oversubd, "--config", mcfg, "--gpus", "sim:1x81920", "--socket", ""], "manifest-node")
    check("the DaemonSet's oversub.yaml starts oversubd (its keys, with paths made local)", murl.startswith("http://"))
    dep = [d for d in docs["oversub-scheduler.yaml"] if d["kind"] == "Deployment"][0]
    ctrs = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
    check("the scheduler pod runs kube-scheduler beside the extender", sorted(ctrs) == ["kube-scheduler", "oversub-scheduler"], ctrs.keys())
    check("the extender listens on the pod's loopback only, where kube-scheduler calls it",
          "127.0.0.1:8888" in ctrs["oversub-scheduler"]["args"] and e["urlPrefix"] == "http://127.0.0.1:8888", e)
    scm = [d for d in docs["oversub-scheduler.yaml"] if d["kind"] == "ConfigMap"][0]
    check("the scheduler pod's configuration is scheduler-config.yaml",
          yaml.safe_load(scm["data"]["scheduler-config.yaml"]) == sc)
    eargs = ctrs["oversub-scheduler"]["args"][1:]
    eargs = [("127.0.0.1:0" if a == "127.0.0.1:8888" else tokf2 if a.endswith("/token") else a) for a in eargs]
    _, e3 = start([ext_bin] + eargs + ["--kube-api", api2, "--kube-token-file", "", "--kube-ca-file", ""], "manifest-ext")
    check("the Deployment's arguments start oversub-scheduler", e3.startswith("http://"))

    # -- descriptors run out (issue 23): accept backs off instead of spinning, and a request
    # to a node that cannot even be sent (socket() fails) is failed, never used after libevent
    # freed it --------------------------------------------------------------------------------
    import resource
    def low_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    log = open(os.path.join(TMP, "ext-fd.log"), "w")
    xp = subprocess.Popen([ext_bin, "--listen", "127.0.0.1:0", "--pool-refresh-ms", "100",
                           "--node", "node-a=%s" % nodes["node-a"],
                           "--node", "node-down=http://127.0.0.1:1"],
                          stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=low_nofile)
    PROCS.append(xp)
    line = xp.stdout.readline()
    check("the low-descriptor scheduler starts", line.startswith("listening on http://"), line)
    import threading
    threading.Thread(target=lambda: [None for _ in xp.stdout], daemon=True).start()
    xurl = line.split()[2]
    host, port = xurl[len("http://"):].split(":")
    held = []
    def logtext():
        return open(os.path.join(TMP, "ext-fd.log")).read()
    for _ in range(200):
        if "out of file descriptors" in logtext():
            break
        c = socket.create_connection((host, int(port)))
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a head never finished
        held.append(c)
    check("running out is said", wait_for("the back-off line", lambda: "out of file descriptors" in logtext()), logtext()[-500:])
    check("a node request that cannot be sent is failed and said",
          wait_for("the send failure", lambda: "could not be sent" in logtext()), logtext()[-500:])
    check("the scheduler lives on without descriptors", xp.poll() is None, xp.poll())
    check("accept backs off: a few lines, not millions", logtext().count("out of file descriptors") < 20,
          logtext().count("out of file descriptors"))
    for c in held:
        c.close()
    def healthy():
        try:
            return http("GET", xurl + "/healthz")[0] == 200
        except OSError:
            return False
    check("once descriptors are back it answers", wait_for("healthz again", healthy))
    code, text = http("GET", xurl + "/metrics")
    m = re.search(r"^oversub_extender_accept_refused_total (\d+)", text or "", re.M)
    check("the refusals are counted", m is not None and int(m.group(1)) > 0, (text or "")[:200])

    print("test_extender: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in PROCS:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        # every program stops cleanly on SIGTERM (a sanitizer's report at exit is a failure)
        bad = [(os.path.basename(p.args[0]), p.returncode) for p in PROCS
               if p.returncode not in (0, -signal.SIGTERM)]
        if bad:
            print("FAIL: processes that did not stop cleanly: %s (logs: %s)" % (bad, TMP))
            os.environ["OSUB_KEEP_TMP"] = "1"
            rc = 1
        if os.environ.get("OSUB_KEEP_TMP"):
            print("kept", TMP)
        else:
            shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(rc)
