#!/usr/bin/python3
"""A stand-in for the Kubernetes API server, on loopback, for oversub's tests.

Serves what oversub-scheduler and oversubd ask of an API server, and checks each request's
shape as the real one would (a Binding's kind and target, an Eviction's kind and delete
options, the bearer token); every request is recorded and read back with GET /_log.

  GET  /api/v1/nodes                                   the nodes given with --node NAME=URL
  GET  /api/v1/namespaces/NS/pods/NAME                 a pod added with POST /_pods
  POST /api/v1/namespaces/NS/pods/NAME/binding         201, or 409/500 when /_fail says so
  POST /api/v1/namespaces/NS/pods/NAME/eviction        201 (the pod is gone after its grace),
                                                       429 when a PodDisruptionBudget blocks it
  DELETE /api/v1/namespaces/NS/pods/NAME               200
  POST /_pods {pod}      adds or replaces a pod        POST /_fail {"binding": 409, "eviction": 429}
  POST /_fail {"hang": {"binding": S, "get": S, "get_bound": S}}: a Binding applied, then its
                         answer held S seconds; a pod GET (of a bound pod) held S seconds
  GET  /_log             the recorded requests         POST /_gone {"namespace","name"}: pod deleted
"""
import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
log = []
pods = {}   # (ns, name) -> pod object
fail = {}   # "binding" / "eviction" -> status
nodes = []
token = None

POD = re.compile(r"^/api/v1/namespaces/([a-z0-9.-]+)/pods/([a-z0-9.-]+)(/binding|/eviction)?$")


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def status(self, code, reason, message):
        self.send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": reason, "message": message, "code": code})

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return "<not json>"

    def handle_any(self, method):
        b = self.body() if method in ("POST", "PUT", "PATCH") else None
        path = self.path.split("?")[0]
        entry = {"method": method, "path": path, "body": b,
                 "auth": self.headers.get("Authorization"),
                 "content_type": self.headers.get("Content-Type")}
        with lock:
            if not path.startswith("/_"):
                log.append(entry)
        if path == "/_log":
            with lock:
                return self.send(200, log)
        if path == "/_pods" and method == "POST":
            md = b["metadata"]
            with lock:
                pods[(md.get("namespace", "default"), md["name"])] = b
            return self.send(200, {})
        if path == "/_gone" and method == "POST":
            with lock:
                pods.pop((b["namespace"], b["name"]), None)
            return self.send(200, {})
        if path == "/_fail" and method == "POST":
            with lock:
                fail.clear()
                fail.update(b)
            return self.send(200, {})
        if token is not None and self.headers.get("Authorization") != "Bearer " + token:
            return self.status(401, "Unauthorized", "Unauthorized")
        if path == "/api/v1/nodes" and method == "GET":
            items = [{"metadata": {"name": n, "annotations": {"oversub.io/url": u} if u else {}},
                      "status": {"addresses": [{"type": "InternalIP", "address": ip},
                                               {"type": "Hostname", "address": n}]}}
                     for n, u, ip in nodes]
            return self.send(200, {"kind": "NodeList", "apiVersion": "v1", "items": items})
        m = POD.match(path)
        if not m:
            return self.status(404, "NotFound", "the server could not find the requested resource")
        ns, name, sub = m.groups()
        with lock:
            pod = pods.get((ns, name))
        if sub is None and method == "GET":
            if fail.get("hang", {}).get("get"):
                time.sleep(fail["hang"]["get"])
            if fail.get("hang", {}).get("get_bound") and pod and pod.get("spec", {}).get("nodeName"):
                time.sleep(fail["hang"]["get_bound"])
            if pod is None:
                return self.status(404, "NotFound", 'pods "%s" not found' % name)
            return self.send(200, pod)
        if sub is None and method == "DELETE":
            with lock:
                pods.pop((ns, name), None)
            return self.send(200, {"kind": "Status", "status": "Success"})
        if sub == "/binding" and method == "POST":
            ok = (isinstance(b, dict) and b.get("apiVersion") == "v1" and b.get("kind") == "Binding"
                  and b.get("metadata", {}).get("name") == name
                  and b.get("target", {}).get("kind") == "Node" and b["target"].get("name"))
            if not ok:
                return self.status(400, "BadRequest", "not a Binding for pod %s" % name)
            if pod is not None and b["metadata"].get("uid") not in (None, pod["metadata"].get("uid")):
                return self.status(409, "Conflict", "Precondition failed: UID in precondition: %s,"
                                   " UID in object meta: %s" % (b["metadata"].get("uid"),
                                                                 pod["metadata"].get("uid")))
            if fail.get("binding"):
                return self.status(fail["binding"], "Conflict",
                                   'pod %s is already assigned to node "elsewhere"' % name)
            if pod is not None:
                with lock:
                    pod.setdefault("spec", {})["nodeName"] = b["target"]["name"]
            if fail.get("hang", {}).get("binding"):
                time.sleep(fail["hang"]["binding"])  # applied, its answer lost
            return self.send(201, {"kind": "Status", "status": "Success", "code": 201})
        if sub == "/eviction" and method == "POST":
            ok = (isinstance(b, dict) and b.get("apiVersion") == "policy/v1"
                  and b.get("kind") == "Eviction" and b.get("metadata", {}).get("name") == name
                  and b["metadata"].get("namespace") == ns)
            if not ok:
                return self.status(400, "BadRequest", "not an Eviction for pod %s/%s" % (ns, name))
            if pod is None:
                return self.status(404, "NotFound", 'pods "%s" not found' % name)
            if fail.get("eviction"):
                return self.status(fail["eviction"], "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.")
            return self.send(201, {"kind": "Status", "status": "Success", "code": 201})
        return self.status(405, "MethodNotAllowed", "the server does not allow this method")

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_DELETE(self):
        self.handle_any("DELETE")

    def do_PATCH(self):
        self.handle_any("PATCH")


def main():
    global token
    ap = argparse.ArgumentParser()
    ap.add_argument("--node", action="append", default=[],
                    help="NAME=URL[@ADDRESS] (URL may be empty; ADDRESS: the node's, else URL's host)")
    ap.add_argument("--token", default=None)
    a = ap.parse_args()
    token = a.token
    for n in a.node:  # NAME=URL, or NAME=URL@ADDRESS when the node's address is another
        k, _, v = n.partition("=")
        v, _, ip = v.partition("@")
        if not ip:
            ip = v.split("//")[-1].split(":")[0] if v else "10.0.0.1"
        nodes.append((k, v, ip))
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print("listening on http://127.0.0.1:%d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
