#!/usr/bin/env python3
"""openapi_check.py - GET /v1/openapi.json checked against the live oversubd that serves it.

Run by test_openapi.sh, which starts two daemons: A (no token; a config allowing managed
services; its Unix socket) and B (--token-file). This script:

1. fetches the description, checks that it is a structurally valid OpenAPI 3.0 document (the
   required keys, path parameters, unique operationIds, security schemes) whose every $ref
   resolves and whose every schema is a valid JSON Schema once converted (nullable -> a type
   list), and that it is the one in src/daemon/web/openapi.json;
2. walks every documented operation with real requests (services submitted, made pending,
   queued, refused, degraded and acknowledged, evicted and exited, usage reported, a managed
   service over the socket, GPUs cordoned, long-polls woken by the changes they wait for) and
   the documented errors (400, 401, 403, 404, 409, 413, 422), checking for each answer that its
   status is documented for that operation, that its Content-Type is one documented for that
   status, that its documented required headers are there and that its JSON body validates
   against the documented schema (jsonschema, Draft 4: OpenAPI 3.0's dialect);
3. fails when a documented operation was never exercised, when the router (api.c's
   on_request, mirrored in ROUTER below) has an operation the document lacks or the other way
   round, and probes undocumented methods and paths (405 / 404, with the error's shape).

Prints one line per failure and a summary; exits 1 on any failure.
"""
import argparse
import copy
import http.client
import json
import os
import re
import socket
import sys
import threading
import time

import jsonschema

# ---- the router as api.c's on_request (and h_services, h_gpu) dispatches it ----------------
# Keep in step with src/daemon/api.c: on_request, h_pool, h_services, h_gpu, h_static, h_events
# and actuator.c's osubd_act_directives. (method, path template)
ROUTER = {
    ("GET", "/healthz"), ("GET", "/metrics"),
    ("GET", "/"), ("GET", "/dashboard"), ("GET", "/v1/openapi.json"),
    ("GET", "/v1/pool"), ("PUT", "/v1/pool"),
    ("GET", "/v1/services"), ("POST", "/v1/services"),
    ("GET", "/v1/services/{id}"), ("PATCH", "/v1/services/{id}"),
    ("DELETE", "/v1/services/{id}"),
    ("PUT", "/v1/services/{id}/backends"), ("GET", "/v1/services/{id}/directives"),
    ("PUT", "/v1/services/{id}/usage"), ("POST", "/v1/services/{id}/ready"),
    ("POST", "/v1/services/{id}/ack"), ("POST", "/v1/services/{id}/exited"),
    ("POST", "/v1/services/{id}/suspend"), ("POST", "/v1/services/{id}/resume"),
    ("POST", "/v1/gpus/{index}/cordon"), ("POST", "/v1/gpus/{index}/uncordon"),
    ("POST", "/v1/gpus/{index}/drain"),
    ("GET", "/v1/events"),
}
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# Known deviations of the daemon from its own conventions: reported, not failed.
# api.c on_request: /healthz and /metrics are answered whatever the method (no 405).
KNOWN_ANY_METHOD = {"/healthz", "/metrics"}

passed = 0
failed = 0
known = []


def ok():
    global passed
    passed += 1


def bad(msg):
    global failed
    failed += 1
    print("FAIL: " + msg, flush=True)


def check(cond, msg):
    if cond:
        ok()
    else:
        bad(msg)
    return cond


# ---- HTTP -------------------------------------------------------------------------------------

class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=30):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Answer:
    def __init__(self, status, headers, raw):
        self.status = status
        self.headers = headers  # lower-case name -> value
        self.raw = raw
        self.json = None
        try:
            self.json = json.loads(raw) if raw else None
        except ValueError:
            pass

    def get(self, *keys):
        v = self.json
        for k in keys:
            if isinstance(v, dict):
                v = v.get(k)
            elif isinstance(v, list) and isinstance(k, int) and k < len(v):
                v = v[k]
            else:
                return None
        return v


class Target:
    def __init__(self, url=None, sock=None):
        self.sock = sock
        if url:
            m = re.match(r"http://([^:/]+):(\d+)", url)
            self.host, self.port = m.group(1), int(m.group(2))

    def conn(self, timeout=30):
        if self.sock:
            return UnixConnection(self.sock, timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


def http_raw(target, method, path, body=None, headers=None, extra_headers=None, timeout=30):
    """One request on its own connection. body: dict/list (JSON), bytes or str."""
    c = target.conn(timeout)
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    hdrs = dict(headers or {})
    try:
        c.putrequest(method, path, skip_accept_encoding=True)
        for k, v in hdrs.items():
            c.putheader(k, v)
        for k, v in (extra_headers or []):
            c.putheader(k, v)
        if not any(k.lower() == "content-type" for k in hdrs) and not any(
                k.lower() == "content-type" for k, _ in (extra_headers or [])):
            c.putheader("Content-Type", "application/json")  # oversubd refuses changes without
        if body is not None:
            if not any(k.lower() == "content-length" for k, _ in (extra_headers or [])):
                c.putheader("Content-Length", str(len(body)))
        c.endheaders()
        if body:
            try:
                c.send(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused early (413): the answer is still there to read
        r = c.getresponse()
        raw = r.read()
        hd = {k.lower(): v for k, v in r.getheaders()}
        return Answer(r.status, hd, raw)
    finally:
        c.close()


# ---- the document -----------------------------------------------------------------------------

def pointer(doc, ref):
    if not ref.startswith("#/"):
        raise KeyError(ref)
    v = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        v = v[part]
    return v


def deref(doc, o):
    seen = 0
    while isinstance(o, dict) and "$ref" in o:
        o = pointer(doc, o["$ref"])
        seen += 1
        if seen > 32:
            raise ValueError("a $ref cycle")
    return o


OAS_ONLY = {"nullable", "discriminator", "readOnly", "writeOnly", "xml", "externalDocs",
            "example", "deprecated"}


def to_jsonschema(doc, s, depth=0):
    """An OpenAPI 3.0 schema as a Draft 4 JSON Schema: $refs inlined, nullable as a type list."""
    if depth > 64:
        raise ValueError("schema nesting too deep (a $ref cycle?)")
    if isinstance(s, list):
        return [to_jsonschema(doc, x, depth + 1) for x in s]
    if not isinstance(s, dict):
        return s
    if "$ref" in s:
        return to_jsonschema(doc, pointer(doc, s["$ref"]), depth + 1)
    out = {}
    for k, v in s.items():
        if k in OAS_ONLY:
            continue
        if k == "properties":
            out[k] = {pk: to_jsonschema(doc, pv, depth + 1) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties", "not") and isinstance(v, dict):
            out[k] = to_jsonschema(doc, v, depth + 1)
        elif k in ("allOf", "oneOf", "anyOf"):
            out[k] = [to_jsonschema(doc, x, depth + 1) for x in v]
        else:
            out[k] = copy.deepcopy(v)
    if s.get("nullable") is True:
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = out["enum"] + [None]
    return out


def validate(doc, schema, value):
    """[] when value is valid, else the error messages."""
    js = to_jsonschema(doc, schema)
    v = jsonschema.Draft4Validator(js)
    errs = sorted(v.iter_errors(value), key=lambda e: list(e.path))
    return ["%s: %s" % ("/".join(str(p) for p in e.path) or "(body)", e.message[:300])
            for e in errs]


def structural(doc):
    """Checks that doc is a valid OpenAPI 3.0 document, as far as this test needs."""
    check(isinstance(doc, dict), "the description is not a JSON object")
    check(re.match(r"^3\.0\.\d+$", str(doc.get("openapi", ""))) is not None,
          "openapi is not 3.0.x: %r" % doc.get("openapi"))
    info = doc.get("info", {})
    check(isinstance(info.get("title"), str) and isinstance(info.get("version"), str),
          "info needs title and version")
    paths = doc.get("paths")
    check(isinstance(paths, dict) and paths, "paths is missing or empty")
    comps = doc.get("components", {})
    schemes = comps.get("securitySchemes", {})
    for name, sch in schemes.items():
        sch = deref(doc, sch)
        check(sch.get("type") in ("apiKey", "http", "oauth2", "openIdConnect"),
              "securityScheme %s: bad type" % name)
        if sch.get("type") == "http":
            check(isinstance(sch.get("scheme"), str), "securityScheme %s: http needs scheme" % name)

    def security(where, reqs):
        check(isinstance(reqs, list), "%s: security must be a list" % where)
        for r in reqs or []:
            for n in r:
                check(n in schemes, "%s: security names unknown scheme %s" % (where, n))

    if "security" in doc:
        security("top level", doc["security"])

    # every $ref resolves
    refs = []

    def walk(o, where):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "$ref":
                    refs.append((v, where))
                else:
                    walk(v, where + "/" + str(k))
        elif isinstance(o, list):
            for i, v in enumerate(o):
                walk(v, where + "/" + str(i))

    walk(doc, "#")
    for ref, where in refs:
        try:
            pointer(doc, ref)
            ok()
        except (KeyError, TypeError, IndexError):
            bad("$ref %s at %s does not resolve" % (ref, where))
    used = {r for r, _ in refs}
    for kind in ("schemas", "responses", "parameters", "requestBodies"):
        for name in comps.get(kind, {}):
            check("#/components/%s/%s" % (kind, name) in used,
                  "components/%s/%s is never used" % (kind, name))

    # schemas are valid JSON Schemas once converted
    for name, s in comps.get("schemas", {}).items():
        try:
            jsonschema.Draft4Validator.check_schema(to_jsonschema(doc, s))
            ok()
        except Exception as e:  # SchemaError, ValueError
            bad("components/schemas/%s is not a valid schema: %s" % (name, str(e)[:300]))

    op_ids = set()
    item_keys = {"summary", "description", "servers", "parameters", "$ref", "get", "put", "post",
                 "delete", "options", "head", "patch", "trace"}
    for path, item in (paths or {}).items():
        check(path.startswith("/"), "path %s does not start with /" % path)
        extra = {k for k in set(item) - item_keys if not k.startswith("x-")}
        check(not extra, "path %s: unknown keys %s" % (path, sorted(extra)))
        names = set(re.findall(r"\{([^}]+)\}", path))
        for method in ("get", "put", "post", "delete", "options", "head", "patch", "trace"):
            o = item.get(method)
            if o is None:
                continue
            where = "%s %s" % (method.upper(), path)
            oid = o.get("operationId")
            check(oid is None or oid not in op_ids, "%s: operationId %s repeated" % (where, oid))
            op_ids.add(oid)
            params = [deref(doc, p) for p in item.get("parameters", []) + o.get("parameters", [])]
            seen = set()
            for p in params:
                check(p.get("in") in ("query", "header", "path", "cookie") and
                      isinstance(p.get("name"), str), "%s: a parameter needs name and in" % where)
                check(("schema" in p) != ("content" in p),
                      "%s: parameter %s needs schema or content" % (where, p.get("name")))
                check((p.get("in"), p.get("name")) not in seen,
                      "%s: parameter %s twice" % (where, p.get("name")))
                seen.add((p.get("in"), p.get("name")))
                if p.get("in") == "path":
                    check(p.get("required") is True,
                          "%s: path parameter %s must be required" % (where, p.get("name")))
                    check(p.get("name") in names,
                          "%s: path parameter %s is not in the path" % (where, p.get("name")))
            declared = {p.get("name") for p in params if p.get("in") == "path"}
            check(names <= declared, "%s: path parameters %s undeclared" % (where,
                                                                           sorted(names - declared)))
            if "requestBody" in o:
                rb = deref(doc, o["requestBody"])
                check(isinstance(rb.get("content"), dict) and rb["content"],
                      "%s: requestBody needs content" % where)
            resps = o.get("responses")
            check(isinstance(resps, dict) and resps, "%s: responses missing" % where)
            for code, r in (resps or {}).items():
                check(code == "default" or re.match(r"^[1-5]([0-9]{2}|XX)$", code),
                      "%s: bad response key %s" % (where, code))
                r = deref(doc, r)
                check(isinstance(r.get("description"), str),
                      "%s %s: a response needs a description" % (where, code))
                for mt, m in r.get("content", {}).items():
                    check("schema" in m, "%s %s %s: no schema" % (where, code, mt))
            if "security" in o:
                security(where, o["security"])


def operations(doc):
    ops = {}
    for path, item in doc.get("paths", {}).items():
        for method in ("get", "put", "post", "delete", "patch", "head", "options", "trace"):
            if method in item:
                ops[(method.upper(), path)] = item[method]
    return ops


def template_of(doc, path):
    """The documented path template a concrete path falls under (literal segments first)."""
    best = None
    for t in doc.get("paths", {}):
        rx = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(t)) + "$"
        if re.match(rx, path):
            score = len(re.sub(r"\{[^}]+\}", "", t))
            if best is None or score > best[0]:
                best = (score, t)
    return best[1] if best else None


# ---- the walk ---------------------------------------------------------------------------------

class Walker:
    def __init__(self, doc):
        self.doc = doc
        self.ops = operations(doc)
        self.exercised = set()  # (METHOD, template)
        self.statuses = set()  # (METHOD, template, status)
        self.lock = threading.Lock()

    def call(self, target, method, path, body=None, expect=None, headers=None, extra_headers=None,
             timeout=30, what=None, check_request=None):
        """A request, its answer checked against the document. expect: a status or a set."""
        what = what or "%s %s" % (method, path)
        a = http_raw(target, method, path, body, headers, extra_headers, timeout)
        bare = path.split("?")[0]
        t = template_of(self.doc, bare)
        o = self.ops.get((method, t))
        if expect is not None:
            want = expect if isinstance(expect, (set, frozenset)) else {expect}
            check(a.status in want, "%s: status %d, want %s; body %s" %
                  (what, a.status, sorted(want), a.raw[:300]))
        if o is None:
            bad("%s: the document has no operation %s %s" % (what, method, t))
            return a
        with self.lock:
            self.exercised.add((method, t))
            self.statuses.add((method, t, a.status))
        # a 2xx request's body is one the document accepts
        rb = o.get("requestBody")
        if check_request is not False and rb and 200 <= a.status < 300 and \
                isinstance(body, dict):
            sch = deref(self.doc, rb)["content"]["application/json"]["schema"]
            errs = validate(self.doc, sch, body)
            check(not errs, "%s: the request body does not validate against the document, "
                            "yet the daemon took it: %s" % (what, errs[:3]))
        self.check_answer(o, a, what, method, t)
        return a

    def check_answer(self, o, a, what, method, t):
        resps = o["responses"]
        r = resps.get(str(a.status)) or resps.get("%dXX" % (a.status // 100)) or \
            resps.get("default")
        if not check(r is not None, "%s: status %d is not documented for %s %s (body %s)" %
                     (what, a.status, method, t, a.raw[:200])):
            return
        r = deref(self.doc, r)
        for h, spec in r.get("headers", {}).items():
            spec = deref(self.doc, spec)
            if spec.get("required"):
                check(h.lower() in a.headers, "%s: documented header %s missing" % (what, h))
        content = r.get("content", {})
        ctype = a.headers.get("content-type")
        if not content:
            check(not a.raw, "%s: a body where none is documented" % what)
            return
        if not check(ctype in content, "%s: Content-Type %r is not documented for %d (%s)" %
                     (what, ctype, a.status, sorted(content))):
            return
        if ctype.startswith("application/json"):
            if not check(a.json is not None or a.raw.strip() == b"null",
                         "%s: the body is not JSON: %r" % (what, a.raw[:200])):
                return
            errs = validate(self.doc, content[ctype]["schema"], a.json)
            check(not errs, "%s (%d): the body does not validate: %s" %
                  (what, a.status, "; ".join(errs[:4])))
        else:
            check(isinstance(a.raw, bytes), "%s: no body" % what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="daemon A's URL (no token)")
    ap.add_argument("--a-socket", required=True, help="daemon A's Unix socket")
    ap.add_argument("--b", required=True, help="daemon B's URL (--token-file)")
    ap.add_argument("--b-token", required=True, help="daemon B's admin token")
    ap.add_argument("--source", required=True, help="src/daemon/web/openapi.json")
    ap.add_argument("--pids", required=True, help="a file to list managed processes in")
    args = ap.parse_args()
    A = Target(args.a)
    AS = Target(sock=args.a_socket)
    Bt = Target(args.b)
    t0 = time.monotonic()

    # ---- 1. the document ----
    a = http_raw(A, "GET", "/v1/openapi.json")
    if not check(a.status == 200 and a.json is not None,
                 "GET /v1/openapi.json: %d %r" % (a.status, a.raw[:200])):
        return 1
    doc = a.json
    try:
        with open(args.source) as f:
            check(json.load(f) == doc, "the served description differs from %s (rebuild "
                                       "oversubd)" % args.source)
    except (OSError, ValueError) as e:
        bad("%s: %s" % (args.source, e))
    structural(doc)
    if failed:
        print("the description is not valid: not walking it")
        return 1
    w = Walker(doc)
    ops = set(w.ops)
    for m, p in sorted(ROUTER - ops):
        bad("the router answers %s %s (api.c on_request) but the document lacks it" % (m, p))
    for m, p in sorted(ops - ROUTER):
        bad("the document has %s %s, which the router (as listed here) does not" % (m, p))

    call = w.call
    J = "application/json"

    # ---- 2. reads on a fresh daemon ----
    call(A, "GET", "/healthz", expect=200)
    call(A, "GET", "/v1/openapi.json", expect=200)
    call(A, "GET", "/", expect=200)
    call(A, "GET", "/dashboard", expect=200)
    r = call(A, "GET", "/v1/pool", expect=200)
    check(len(r.get("gpus") or []) == 4, "the pool has not 4 GPUs: %s" % r.raw[:200])
    r = call(A, "GET", "/v1/services", expect=200)
    check(r.get("services") == [], "a fresh daemon lists services: %s" % r.raw[:200])
    r = call(A, "GET", "/v1/events", expect=200)
    cursor = r.get("next") or 0
    r = call(A, "GET", "/metrics", expect=200)
    check(b"# TYPE oversub_pool_ratio gauge" in r.raw, "/metrics lacks oversub_pool_ratio")

    def events_until(pred, what, limit=15.0):
        """Long-polls /v1/events from the cursor until an event satisfies pred."""
        nonlocal cursor
        end = time.monotonic() + limit
        while time.monotonic() < end:
            e = call(A, "GET", "/v1/events?since=%d&wait=5" % cursor, expect=200)
            for ev in e.get("events") or []:
                if pred(ev):
                    cursor = e.get("next")
                    return ev
            cursor = e.get("next") or cursor
        bad("no event: " + what)
        return None

    # ---- 3. GPUs: everything below lands on GPU 0 ----
    for g in (1, 2, 3):
        r = call(A, "POST", "/v1/gpus/%d/cordon" % g, expect=200)
        check(r.get("gpus", g, "cordoned") is True, "GPU %d not cordoned" % g)
    call(A, "POST", "/v1/gpus/9/cordon", expect=404, what="cordon an unknown GPU")
    call(A, "POST", "/v1/gpus/4/uncordon", expect=404, what="uncordon an unknown GPU")
    call(A, "POST", "/v1/gpus/99999999999999999999/drain", expect=404, what="a GPU past long")

    # ---- 4. submits: started, the same again, conflicts, a dry run ----
    job = {"id": "job", "class": "batch", "vram_mib": 50000, "min_vram_mib": 20000,
           "batch_size": 8, "min_batch_size": 2, "resumable": True}
    r = call(A, "POST", "/v1/services", job, expect=201, what="submit job")
    job_token = r.get("token")
    check(r.get("decision", "outcome") == "started", "job not started: %s" % r.raw[:200])
    call(A, "POST", "/v1/services", job, expect=200, what="submit job again")
    call(A, "POST", "/v1/services", dict(job, batch_size=4), expect=409,
         what="submit job with another spec")
    r = call(A, "POST", "/v1/services", {"id": "exp", "class": "experiment", "vram": "20000MiB"},
             expect=201, what="submit exp")
    chat = {"id": "chat", "class": "online", "vram_mib": 40000,
            "backends": ["http://127.0.0.1:9"], "max_inflight": 4, "max_queue": 8,
            "queue_timeout_ms": 1000, "upstream_timeout_ms": 1000}
    r = call(A, "POST", "/v1/services?dry_run=1", chat, expect=200, what="dry run of chat")
    check(r.get("decision", "outcome") == "pending", "dry run: %s" % r.raw[:300])
    call(A, "GET", "/v1/services/chat", expect=404, what="a dry run changes nothing")
    call(A, "POST", "/v1/services?dry_run=0", {"id": "dry0", "vram_mib": 1, "colour": 1},
         expect=400, what="dry_run=0 with an unknown field")
    call(A, "POST", "/v1/services?dry_run=yes", chat, expect=400, what="dry_run=yes")
    call(A, "POST", "/v1/services?dry=1", chat, expect=400, what="another query parameter")

    # ---- 5. chat preempts: job degraded, exp evicted; the long-polls wake ----
    got = {}
    cursor = call(A, "GET", "/v1/events?since=%d" % cursor, expect=200).get("next") or cursor

    def poll(name, path):
        got[name] = call(A, "GET", path, expect=200, timeout=40)

    th = [threading.Thread(target=poll, args=("dir", "/v1/services/job/directives?wait=20&after=0")),
          threading.Thread(target=poll, args=("ev", "/v1/events?since=%d&wait=20" % cursor))]
    for t in th:
        t.start()
    # the waits must be in place before the change: wait until the daemon has both waiters
    # (their connections show in oversub_api_connections{listener="tcp"})
    end = time.monotonic() + 5
    waiting = False
    while not waiting and time.monotonic() < end:
        m = http_raw(A, "GET", "/metrics").raw.decode()
        mm = re.search(r'^oversub_api_connections\{listener="tcp"\} (\d+)$', m, re.M)
        waiting = mm is not None and int(mm.group(1)) >= 3  # the two long-polls and this one
        if not waiting:
            time.sleep(0.01)
    check(waiting, "the two long-polls are not connected")
    r = call(A, "POST", "/v1/services", chat, expect=202, what="submit chat (pending)")
    check(r.get("decision", "outcome") == "pending", "chat not pending: %s" % r.raw[:300])
    victims = {(v.get("service"), v.get("action")) for v in r.get("decision", "victims") or []}
    check(victims == {("job", "degrade"), ("exp", "evict")}, "chat's victims: %s" % victims)
    for t in th:
        t.join(45)
    d = got.get("dir")
    check(d is not None and [x.get("action") for x in d.get("directives") or []] == ["degrade"],
          "the directives long-poll: %s" % (d.raw[:300] if d else None))
    e = got.get("ev")
    check(e is not None and any(x.get("service") == "chat" for x in e.get("events") or []),
          "the events long-poll: %s" % (e.raw[:300] if e else None))
    r = call(A, "GET", "/v1/services/chat", expect=200, what="chat pending")
    check(r.get("state") == "pending" and len(r.get("waiting_for") or []) == 2,
          "chat pending with waiting_for: %s" % r.raw[:300])
    r = call(A, "GET", "/v1/services/exp/directives", expect=200, what="exp's directives")
    check([x.get("action") for x in r.get("directives") or []] == ["evict"],
          "exp's directives: %s" % r.raw[:300])
    last = r.get("last_seq") or 0
    call(A, "GET", "/v1/services/exp/directives?after=%d&wait=0" % last, expect=200,
         what="directives after the last")
    call(A, "POST", "/v1/services/chat/ack", expect=409, what="ack without a directive")
    call(A, "POST", "/v1/services/chat/suspend", expect=422, what="suspend without a method")
    call(A, "POST", "/v1/services/chat/resume", expect=409, what="resume of a running service")
    call(A, "POST", "/v1/services/nobody/suspend", expect=404, what="suspend of nobody")
    call(A, "POST", "/v1/services/nobody/ack", expect=404, what="ack of nobody")
    call(A, "POST", "/v1/services/nobody/ready", expect=404, what="ready of nobody")
    call(A, "POST", "/v1/services/Bad_Id/exited", expect=422, what="exited of a bad id")
    call(A, "DELETE", "/v1/services/Bad_Id", expect=422, what="release a bad id")
    call(A, "POST", "/v1/services/job/ack", {"checkpoint": "ck-1", "x": 1}, expect=400,
         what="ack with an unknown field")
    call(A, "POST", "/v1/services/job/ack", {"checkpoint": ""}, expect=422,
         what="ack with an empty checkpoint")
    call(A, "POST", "/v1/services/job/ack", {"checkpoint": "ck-1"}, expect=200, what="job acks")
    call(A, "POST", "/v1/services/exp/exited", {"checkpoint": 5}, expect=422,
         what="exited with a number as checkpoint")
    r = call(A, "POST", "/v1/services/exp/exited", expect=200, what="exp exits")
    check(r.get("state") == "released", "exp after exited: %s" % r.raw[:200])
    events_until(lambda ev: ev.get("kind") == "start" and ev.get("service") == "chat",
                 "chat started")
    call(A, "POST", "/v1/services/exp/exited", expect=404, what="exited of a released service")

    # ---- 6. the service's own calls ----
    call(A, "POST", "/v1/services/chat/ready", {"pid": 0}, expect=422, what="ready with pid 0")
    call(A, "POST", "/v1/services/chat/ready", {"checkpoint": "x"}, expect=400,
         what="ready with a checkpoint")
    r = call(A, "POST", "/v1/services/chat/ready", {"pid": os.getpid()}, expect=200,
             what="chat ready")
    check(r.get("pid") == os.getpid() and r.get("state") == "running",
          "chat after ready: %s" % r.raw[:300])
    call(A, "POST", "/v1/services/chat/ready", expect=200, what="ready twice (the same)")
    call(A, "PUT", "/v1/services/chat/backends", {"backends": ["http://127.0.0.1:7"]},
         expect=200, what="chat's backends")
    call(A, "PUT", "/v1/services/chat/backends", {}, expect=422, what="backends missing")
    call(A, "PUT", "/v1/services/chat/backends", {"backends": ["ftp://x"]}, expect=422,
         what="a backend that is no http URL")
    call(A, "PUT", "/v1/services/chat/backends", {"backends": ["http://169.254.169.254:80"]},
         expect=422, what="a backend outside allowed_destinations")
    call(A, "PUT", "/v1/services/chat/backends", {"backends": [], "x": 1}, expect=400,
         what="backends with an unknown field")
    call(A, "PUT", "/v1/services/nobody/backends", {"backends": ["http://127.0.0.1:7"]},
         expect=404, what="backends of nobody")
    call(A, "PUT", "/v1/services/job/usage", {"vram_mib": 15000, "compute_pct": 10},
         expect=200, what="job's usage")
    call(A, "PUT", "/v1/services/job/usage", {"gpus": [{"gpu": 0, "vram_mib": 16000}]},
         expect=200, what="job's usage per GPU")
    call(A, "PUT", "/v1/services/job/usage", {"gpus": [{"gpu": 1, "vram_mib": 1}]},
         expect=422, what="usage on a GPU it is not on")
    call(A, "PUT", "/v1/services/job/usage", {"vram_mib": -1}, expect=422,
         what="negative usage")
    call(A, "PUT", "/v1/services/job/usage", {"vram_mib": 1, "colour": 1}, expect=400,
         what="usage with an unknown field")
    call(A, "PUT", "/v1/services/job/usage", "{\"vram_mib\": ", expect=400,
         what="usage, malformed JSON")
    call(A, "PUT", "/v1/services/nobody/usage", {"vram_mib": 1}, expect=404,
         what="usage of nobody")
    r = call(A, "PATCH", "/v1/services/job", {"vram_mib": 45000}, expect=200, what="resize job")
    check(r.get("vram_mib") == 45000, "job after resize: %s" % r.raw[:200])
    call(A, "PATCH", "/v1/services/job", {"vram_mib": 1}, expect=422, what="resize below min")
    call(A, "PATCH", "/v1/services/job", {"vram_mib": "1GiB"}, expect=422,
         what="resize with a string", check_request=False)
    call(A, "PATCH", "/v1/services/job", {"gpus": 2}, expect=400, what="resize gpus (unknown)")
    call(A, "PATCH", "/v1/services/nobody", {"vram_mib": 1000}, expect=404,
         what="resize nobody")

    # ---- 7. a managed service over the Unix socket ----
    mgd = {"id": "mgd", "class": "batch", "vram_mib": 1000, "command": ["sleep", "30"],
           "env": {"MODE": "test"}, "restart": "never", "max_restarts": 0, "cuda_shim": False,
           "control_url": "http://127.0.0.1:9/hook"}
    r = call(AS, "POST", "/v1/services", mgd, expect=201, what="submit mgd over the socket")
    ev = events_until(lambda ev: ev.get("kind") == "process" and ev.get("service") == "mgd",
                      "mgd's process spawned")
    r = call(A, "GET", "/v1/services/mgd", expect=200, what="mgd")
    pid = r.get("process", "pid")
    if isinstance(pid, int):
        with open(args.pids, "a") as f:
            f.write("%d\n" % pid)
    check(r.get("env_keys") == ["MODE"] and "env" not in (r.json or {}),
          "mgd's env shown: %s" % r.raw[:300])
    check(isinstance(r.get("process", "tracking"), dict), "mgd's process: %s" % r.raw[:400])
    r = call(A, "GET", "/v1/services", expect=200, what="the list")
    check(len(r.get("services") or []) == 3, "3 services listed: %s" % r.raw[:200])
    r = call(A, "GET", "/metrics?per_service=1", expect=200, what="metrics per service")
    check(b'oversub_service_grant_bytes{service="mgd"' in r.raw, "no per-service series")
    call(AS, "DELETE", "/v1/services/mgd", expect=200, what="release mgd")

    # ---- 8. queued, refused, invalid ----
    r = call(A, "POST", "/v1/services", {"id": "big", "class": "batch", "vram_mib": 80000},
             expect=202, what="submit big (queued)")
    check(r.get("decision", "outcome") == "queued" and r.get("queue_position") == 1,
          "big not queued: %s" % r.raw[:300])
    call(A, "PUT", "/v1/services/big/usage", {"vram_mib": 1}, expect=409,
         what="usage of a queued service")
    call(A, "POST", "/v1/services/big/ready", expect=409, what="ready of a queued service")
    r = call(A, "POST", "/v1/services", {"id": "rej", "class": "online", "vram_mib": 80000},
             expect=409, what="submit rej (no room, no queue)")
    check(r.get("decision", "outcome") == "rejected", "rej: %s" % r.raw[:300])
    call(A, "POST", "/v1/services", {"id": "huge", "class": "online", "vram": "800GiB"},
         expect=409, what="submit huge (too big)")
    call(A, "POST", "/v1/services", {"id": "Bad_Id", "vram_mib": 5}, expect=422,
         what="submit a bad id")
    call(A, "POST", "/v1/services", {"id": "novram"}, expect=422, what="submit without vram")
    call(A, "POST", "/v1/services", {"id": "cls", "class": "nope", "vram_mib": 5}, expect=422,
         what="submit an unknown class")
    call(A, "POST", "/v1/services", {"id": "x", "vram_mib": 5, "colour": "red"}, expect=400,
         what="submit an unknown field")
    call(A, "POST", "/v1/services", "{\"id\": ", expect=400, what="submit malformed JSON")
    call(A, "POST", "/v1/services", [1], expect=400, what="submit a JSON array")
    call(A, "POST", "/v1/services", {"id": "cmd", "vram_mib": 5, "command": ["/bin/true"]},
         expect=403, what="submit a command over TCP without a token")
    call(A, "POST", "/v1/services", {"id": "gw", "vram_mib": 5, "max_inflight": 2}, expect=422,
         what="gateway fields without backends")
    call(A, "POST", "/v1/services", b"{" + b" " * 70000 + b"}", expect=413,
         what="a body over 64 KiB")
    call(A, "GET", "/v1/services/Bad_Id", expect=422, what="GET a bad id")
    call(A, "GET", "/v1/services/" + "a" * 64, expect=422, what="GET a 64-character id")
    call(A, "GET", "/v1/services/nobody", expect=404, what="GET nobody")
    call(A, "GET", "/v1/services/nobody/directives", expect=404, what="directives of nobody")
    call(A, "GET", "/v1/services/job/directives?wait=61", expect=400, what="directives wait=61")
    call(A, "GET", "/v1/services/job/directives?after=x", expect=400,
         what="directives after=x")
    call(A, "GET", "/v1/events?since=-1", expect=400, what="events since=-1")
    call(A, "GET", "/v1/events?wait=301", expect=400, what="events wait=301")
    call(A, "GET", "/v1/pool", extra_headers=[("Content-Length", "0"), ("Content-Length", "0")],
         expect=400, what="two Content-Length headers")

    # ---- 9. the pool ----
    r = call(A, "PUT", "/v1/pool", {"ratio": "1.5"}, expect=200, what="ratio 1.5")
    check(r.get("ratio_text") == "1.5", "ratio_text: %s" % r.raw[:200])
    call(A, "PUT", "/v1/pool", {"ratio": 1.4}, expect=200, what="ratio 1.4 as a number")
    call(A, "PUT", "/v1/pool", {"ratio": "1.5555"}, expect=422, what="ratio of four decimals")
    call(A, "PUT", "/v1/pool", {"ratio": 0.5}, expect=422, what="ratio under 1")
    call(A, "PUT", "/v1/pool", {}, expect=422, what="ratio missing")
    call(A, "PUT", "/v1/pool", {"ratio": "1.5", "x": 1}, expect=400, what="pool, unknown field")
    call(A, "PUT", "/v1/pool", b"", expect=400, what="pool, empty body")
    call(A, "POST", "/v1/gpus/1/uncordon", expect=200)
    r = call(A, "POST", "/v1/gpus/2/drain", expect=200)
    check(r.get("gpus", 2, "cordoned") is True, "a drained GPU is cordoned")

    # ---- 10. releases ----
    call(A, "DELETE", "/v1/services/chat", {"now": True}, expect=400,
         what="release with a field")
    for sid in ("chat", "job", "big"):
        call(A, "DELETE", "/v1/services/" + sid, expect=200, what="release " + sid)
    call(A, "DELETE", "/v1/services/job", expect=404, what="release job twice")
    call(A, "GET", "/v1/services/job/directives", expect=404, what="a released one's")
    r = call(A, "GET", "/v1/events?since=0", expect=200, what="the whole log")
    kinds = {x.get("kind") for x in r.get("events") or []}
    for k in ("admit", "pend", "queue", "degrade", "evict", "ack", "start", "ready",
              "resize", "ratio", "cordon", "uncordon", "release", "process", "gateway"):
        check(k in kinds, "no %s event in the log" % k)
    call(A, "GET", "/healthz", expect=200, what="healthy at the end")

    # ---- 11. daemon B: the admin token and a service's token ----
    adm = {"Authorization": "Bearer " + args.b_token}
    ext = {"id": "ext", "class": "batch", "vram_mib": 2000, "resumable": True,
           "control_url": "http://127.0.0.1:9/hook"}
    call(Bt, "POST", "/v1/services", ext, expect=401, what="B: submit without a token")
    call(Bt, "POST", "/v1/services", ext, headers={"Authorization": "Bearer nope"}, expect=401,
         what="B: submit with a wrong token")
    r = call(Bt, "POST", "/v1/services", ext, headers=adm, expect=201, what="B: submit as admin")
    tok = {"Authorization": "Bearer %s" % r.get("token")}
    r = call(Bt, "GET", "/v1/services/ext", expect=200, what="B: read without a token")
    check(r.get("control_url") == "<redacted>", "B: control_url shown: %s" % r.raw[:300])
    r = call(Bt, "GET", "/v1/services/ext", headers=adm, expect=200, what="B: read as admin")
    check(r.get("control_url") == ext["control_url"], "B: admin's control_url: %s" % r.raw[:300])
    call(Bt, "PUT", "/v1/services/ext/usage", {"vram_mib": 100}, headers=tok, expect=200,
         what="B: usage with the service's token")
    call(Bt, "POST", "/v1/services/ext/ready", headers=tok, expect=200,
         what="B: ready with the service's token")
    call(Bt, "PUT", "/v1/services/ext/backends", {"backends": ["http://127.0.0.1:7"]},
         headers=tok, expect=200, what="B: backends with the service's token")
    call(Bt, "PUT", "/v1/services/ext/usage", {"vram_mib": 100},
         headers={"Authorization": "Bearer " + "0" * 64}, expect=401,
         what="B: usage with another token")
    call(Bt, "POST", "/v1/services/ext/ack", headers={"Authorization": "Bearer " + job_token},
         expect=401, what="B: ack with another service's token")
    call(Bt, "POST", "/v1/services/ext/exited", expect=401, what="B: exited without a token")
    call(Bt, "PATCH", "/v1/services/ext", {"vram_mib": 3000}, headers=tok, expect=401,
         what="B: resize with the service's token")
    call(Bt, "DELETE", "/v1/services/ext", headers=tok, expect=401,
         what="B: release with the service's token")
    call(Bt, "PUT", "/v1/pool", {"ratio": "2"}, expect=401, what="B: ratio without a token")
    call(Bt, "POST", "/v1/gpus/0/cordon", expect=401, what="B: cordon without a token")
    call(Bt, "POST", "/v1/services/ext/ready", expect=401, what="B: ready without a token")
    call(Bt, "PUT", "/v1/services/ext/backends", {"backends": ["http://127.0.0.1:7"]},
         expect=401, what="B: backends without a token")
    call(Bt, "POST", "/v1/services", {"id": "solo", "vram_mib": 1000, "exclusive": True},
         headers=adm, expect=201, what="B: an exclusive service")
    call(Bt, "PATCH", "/v1/services/solo", {"vram_mib": 2000}, headers=adm, expect=409,
         what="B: resize an exclusive service")
    call(Bt, "DELETE", "/v1/services/solo", headers=adm, expect=200, what="B: release solo")
    call(Bt, "POST", "/v1/gpus/0/uncordon", expect=401, what="B: uncordon without a token")
    call(Bt, "POST", "/v1/gpus/0/drain", expect=401, what="B: drain without a token")
    call(Bt, "DELETE", "/v1/services/ext", headers=adm, expect=200, what="B: release as admin")

    # ---- 12. every operation: an ambiguous framing (400), a body over 64 KiB (413) ----
    for (m, path), o in sorted(w.ops.items()):
        concrete = path.replace("{id}", "nobody").replace("{index}", "0")
        call(A, m, concrete, extra_headers=[("Content-Length", "0"), ("Content-Length", "0")],
             expect=400, what="%s %s with two Content-Length headers" % (m, concrete))
        if "requestBody" in o:
            call(A, m, concrete, b"{" + b" " * 70000 + b"}", expect=413,
                 what="%s %s with a body over 64 KiB" % (m, concrete))

    # ---- 13. undocumented methods and paths ----
    for path in sorted(doc["paths"]):
        concrete = path.replace("{id}", "job").replace("{index}", "0")
        # x-other-methods: the answer to the methods the path does not have, as responses
        other = doc["paths"][path].get("x-other-methods", {})
        for m in METHODS:
            if (m, path) in ops:
                continue
            a = http_raw(A, m, concrete, {} if m != "GET" else None)
            where = "%s %s (undocumented method)" % (m, concrete)
            if not other and path in KNOWN_ANY_METHOD:
                if a.status != 405:
                    known.append("%s answers %d, not 405 (api.c on_request)" % (where, a.status))
                continue
            check(len(other) == 1, "%s: x-other-methods missing" % path)
            fake = {"responses": other}
            check(str(a.status) in other, "%s: %d, want %s" % (where, a.status, sorted(other)))
            w.check_answer(fake, a, where, m, path)
    for path in ("/v1/gpus", "/v1/gpus/0", "/v1/gpus/0/reset", "/v1/gpus/x/cordon", "/v2/things",
                 "/v1", "/v1/pool/x", "/v1/eventsx", "/healthz/", "/v1/openapi.yaml",
                 "/v1/services/job/logs", "/v1/services/job/usage/x", "/dashboard/x"):
        for m in ("GET", "POST"):
            a = http_raw(A, m, path, {} if m == "POST" else None)
            where = "%s %s (no such path)" % (m, path)
            check(a.status == 404, "%s: %d, want 404" % (where, a.status))
            check(a.headers.get("content-type") == J and not validate(
                doc, {"$ref": "#/components/schemas/Error"}, a.json),
                "%s: not the error shape: %r" % (where, a.raw[:200]))
    # methods libevent refuses before the API (no JSON): reported
    for m in ("HEAD", "OPTIONS"):
        a = http_raw(A, m, "/v1/pool")
        if a.headers.get("content-type") != J:
            known.append("%s /v1/pool answers %d %s from libevent, not JSON (api.c api_http: "
                         "evhttp_set_allowed_methods)" % (m, a.status,
                                                          a.headers.get("content-type")))
    a = http_raw(A, "GET", "/v1/services/")
    if a.status == 200:
        known.append("GET /v1/services/ (trailing slash) lists the services (api.c "
                     "on_request: /v1/services/ with an empty id goes to the list)")

    # ---- 14. coverage ----
    for k in sorted(ops - w.exercised):
        bad("never exercised: %s %s" % k)
    documented = set()
    for (m, p), o in w.ops.items():
        for code in o["responses"]:
            documented.add((m, p, int(code)))
    unexercised = sorted(documented - w.statuses)
    n_codes = len(documented & w.statuses)
    print("openapi: %d operations on %d paths, %s exercised; %d of %d documented "
          "(operation, status) pairs seen; %.1f s" %
          (len(ops), len(doc["paths"]), "all" if ops <= w.exercised else "NOT all",
           n_codes, len(documented), time.monotonic() - t0))
    by = {}
    for m, p, c in unexercised:
        by.setdefault(c, []).append("%s %s" % (m, p))
    for c in sorted(by):
        print("  documented, not exercised: %d on %d operation(s)%s" %
              (c, len(by[c]), ": " + ", ".join(by[c]) if len(by[c]) <= 4 else ""))
    for k in known:
        print("KNOWN: " + k)
    print("openapi: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
