#!/usr/bin/env bash
# test_monitoring.sh - what operators install next to oversubd, held to the real daemon:
#  (a) deploy/prometheus: alerts.yml passes promtool check rules, its unit tests
#      (alerts.test.yml, every alert firing and not) pass promtool test rules, prometheus.yml
#      passes promtool check config; every alert has a severity, a summary, a description and
#      a runbook_url to an anchor of docs/operations.md, and is tested firing and quiet;
#  (b) a real oversubd (simulated pool, gateway, services of every class, a request through
#      the gateway) is scraped with /metrics?per_service=1: every metric named in alerts.yml and
#      in the Grafana dashboard (panels, annotations, variables) is in the scrape, with the
#      labels and label values its selectors use; the dashboard is JSON with a datasource
#      variable, every panel has a datasource and targets, and every expr parses (promtool);
#  (c) docs/man: the pages render without warnings (man, groff; skipped with a message when
#      neither is installed), every oversubd flag is in oversubd.8, every configuration key
#      (oversub.yaml and read_config) in oversub.yaml.5, every oversub command and option (the
#      CLI's command and flag tables, simulate's and demo's parsing) in oversub.1, and the
#      examples of oversub.yaml.5 are accepted by oversubd.
# Usage: test_monitoring.sh PATH/TO/oversubd
set -u
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/lib.sh"
prom=$root/deploy/prometheus
dash=$root/deploy/grafana/oversub.json
mandir=$root/docs/man

# Runs the checker's lines: "ok ..." passes, "FAIL ..." fails, anything else is shown.
tally() {
    while IFS= read -r l; do
        case "$l" in
        ok\ *) ok ;;
        FAIL\ *) bad "${l#FAIL }" ;;
        *) echo "$l" ;;
        esac
    done
}

# ---- (a) the Prometheus rules and their unit tests --------------------------------------
have_promtool=0
if command -v promtool >/dev/null; then
    have_promtool=1
    if promtool check rules "$prom/alerts.yml" >"$tmp/check" 2>&1; then ok; else bad "promtool check rules: $(cat "$tmp/check")"; fi
    if (cd "$prom" && promtool test rules alerts.test.yml) >"$tmp/unit" 2>&1; then ok; else bad "promtool test rules: $(cat "$tmp/unit")"; fi
    if promtool check config "$prom/prometheus.yml" >"$tmp/config" 2>&1; then ok; else bad "promtool check config: $(cat "$tmp/config")"; fi
else
    bad "promtool is missing (Debian: apt-get install prometheus; scripts/install-deps.sh test)"
fi

# ---- (b) a real oversubd and its /metrics -------------------------------------------------
python3 "$here/backend.py" >"$tmp/backend.out" 2>&1 &
pids+=($!)
BPORT=$(waitline "$tmp/backend.out" "port ") || { echo "backend did not start"; exit 1; }
"$bin" --listen 127.0.0.1:0 --socket "$tmp/s.sock" --state "$tmp/st.db" --gpus sim:2x81920 \
    --gateway 127.0.0.1:0 --tick-ms 100 >"$tmp/out" 2>"$tmp/err" &
pids+=($!)
PORT=$(waitline "$tmp/out" "listening on http://127.0.0.1:") || { echo "oversubd did not start: $(cat "$tmp/err")"; exit 1; }
GW=$(waitline "$tmp/out" "gateway on http://127.0.0.1:") || { echo "no gateway line: $(cat "$tmp/out")"; exit 1; }
A="http://127.0.0.1:$PORT"
submit() { curl -s -o "$tmp/sub" -w '%{http_code}' -X POST "$A/v1/services" -d "$1"; }
expect "submit online" 201 "$(submit "{\"id\":\"chat\",\"class\":\"online\",\"vram_mib\":40000,\"backends\":[\"http://127.0.0.1:$BPORT\"]}")"
expect "submit batch" 201 "$(submit '{"id":"nightly","class":"batch","vram_mib":60000,"min_vram_mib":20000}')"
expect "submit experiment (queued)" 202 "$(submit '{"id":"eval","class":"experiment","vram_mib":70000,"min_vram_mib":10000}')"
expect "ready" 200 "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$A/v1/services/chat/ready")"
expect "a request through the gateway" 200 "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GW/chat/echo")"
expect "no route" 404 "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GW/nosuch/x")"
expect "scrape" 200 "$(curl -s -o "$tmp/metrics" -w '%{http_code}' "$A/metrics?per_service=1")"

tally < <(python3 - "$tmp/metrics" "$prom/alerts.yml" "$prom/alerts.test.yml" "$dash" "$tmp/exprs.rules.yml" <<'EOF'
import json, re, sys

metrics_path, alerts_path, tests_path, dash_path, rules_out = sys.argv[1:]
try:
    import yaml
except ImportError:
    yaml = None

# the scrape: sample names, families by type, labels and their values per sample name
samples, types, labels = set(), {}, {}
for line in open(metrics_path):
    line = line.rstrip("\n")
    m = re.match(r"# TYPE (\S+) (\S+)", line)
    if m:
        types[m.group(1)] = m.group(2)
        continue
    if not line or line.startswith("#"):
        continue
    m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
    if not m:
        print("FAIL unparsable metrics line: %r" % line)
        continue
    name = m.group(1)
    samples.add(name)
    ls = labels.setdefault(name, {})
    for k, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""):
        ls.setdefault(k, set()).add(v)
print("ok scrape has %d sample names" % len(samples))
if len(samples) < 30:
    print("FAIL the scrape is too small: %s" % sorted(samples))

NAME = re.compile(r"(?<![A-Za-z0-9_:])((?:oversub|process)_[a-z0-9_]+)")
SEL = re.compile(r"(?<![A-Za-z0-9_:])((?:oversub|process)_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
ANY_LABELS = {"job", "instance"}  # added by Prometheus, not in the scrape


def known(name):
    if name in samples:
        return True
    for suf in ("_bucket", "_sum", "_count"):
        if name.endswith(suf) and types.get(name[: -len(suf)]) in ("histogram", "summary"):
            return True
    return False


def check_expr(where, expr):
    """every metric the expr names is scraped, with the labels and values it selects"""
    bad = 0
    for name in sorted(set(NAME.findall(expr))):
        if not known(name):
            print("FAIL %s: metric %s is not in /metrics" % (where, name))
            bad += 1
    for name, body in SEL.findall(expr):
        for label, op, value in MATCHER.findall(body):
            if label in ANY_LABELS or name not in labels:
                continue
            have = labels[name]
            if label not in have:
                print("FAIL %s: %s has no label %s (it has %s)" % (where, name, label, sorted(have)))
                bad += 1
                continue
            if op in ("=", "=~") and "$" not in value:
                for alt in value.split("|") if op == "=~" else [value]:
                    if re.fullmatch(r"[A-Za-z0-9_.:/+-]*", alt) and alt not in have[label]:
                        print("FAIL %s: %s{%s} never takes the value %r (it has %s)"
                              % (where, name, label, alt, sorted(have[label])))
                        bad += 1
    return bad


# ---- alerts.yml ----
text = open(alerts_path).read()
if yaml is None:
    print("FAIL python3-yaml is missing: cannot read alerts.yml (apt-get install python3-yaml)")
    sys.exit(0)
doc = yaml.safe_load(text)
rules = [r for g in doc["groups"] for r in g["rules"]]
records = {r["record"] for r in rules if "record" in r}
alerts = [r for r in rules if "alert" in r]
print("ok alerts.yml: %d alerts, %d recording rules" % (len(alerts), len(records)))
want = {"OversubdDown", "OversubGPUHeldHigh", "OversubOnlineDisrupted",
        "OversubOnlineDisruptionDecision", "OversubEvictionBudget",
        "OversubGatewayRejecting", "OversubStateDiskFull"}
missing = want - {a["alert"] for a in alerts}
print("FAIL alerts missing: %s" % sorted(missing) if missing else "ok every expected alert is there")
bad = 0
for r in rules:
    where = "alerts.yml " + r.get("alert", r.get("record"))
    bad += check_expr(where, r["expr"])
    for rec in re.findall(r"(?<![A-Za-z0-9_])(oversub:[a-z0-9_:]+)", r["expr"]):
        if rec not in records:
            print("FAIL %s: recording rule %s is not defined" % (where, rec))
            bad += 1
print("ok every metric of alerts.yml is scraped" if bad == 0 else "FAIL %d metric problems in alerts.yml" % bad)
import os
ops_path = os.path.join(os.path.dirname(alerts_path), "..", "..", "docs", "operations.md")
ops = open(ops_path).read() if os.path.exists(ops_path) else None
if ops is None:
    print("docs/operations.md is missing: runbook anchors not checked")
bad = 0
for a in alerts:
    name, lab, ann = a["alert"], a.get("labels", {}), a.get("annotations", {})
    if lab.get("severity") not in ("critical", "warning", "info"):
        print("FAIL %s: severity %r" % (name, lab.get("severity"))); bad += 1
    for k in ("summary", "description", "runbook_url"):
        if not ann.get(k):
            print("FAIL %s: no %s annotation" % (name, k)); bad += 1
    url = ann.get("runbook_url", "")
    if not re.fullmatch(r"docs/operations\.md#alert-[a-z0-9-]+", url):
        print("FAIL %s: runbook_url %r is not docs/operations.md#alert-..." % (name, url)); bad += 1
    elif ops is not None and ('id="%s"' % url.split("#")[1]) not in ops:
        print("FAIL %s: docs/operations.md has no anchor %s" % (name, url.split("#")[1])); bad += 1
    if "{{ $labels." not in ann.get("summary", "") + ann.get("description", ""):
        print("FAIL %s: summary and description name no label" % name); bad += 1
print("ok every alert has severity, summary, description, runbook_url" if bad == 0 else "FAIL %d annotation problems" % bad)
# every alert tested firing and not firing
fires, quiet = set(), set()
for t in yaml.safe_load(open(tests_path))["tests"]:
    for at in t.get("alert_rule_test", []):
        (fires if at.get("exp_alerts") else quiet).add(at["alertname"])
names = {a["alert"] for a in alerts}
print("FAIL alerts never tested firing: %s" % sorted(names - fires) if names - fires else "ok every alert is tested firing")
print("FAIL alerts never tested quiet: %s" % sorted(names - quiet) if names - quiet else "ok every alert is tested quiet")

# ---- the Grafana dashboard ----
try:
    d = json.load(open(dash_path))
except ValueError as e:
    print("FAIL oversub.json is not JSON: %s" % e)
    sys.exit(0)
print("ok oversub.json parses")
sv = d.get("schemaVersion", 0)
print("ok schemaVersion %d" % sv if 36 <= sv <= 41 else "FAIL schemaVersion %r (want about 39)" % sv)
tvars = d.get("templating", {}).get("list", [])
dsvars = [v["name"] for v in tvars if v.get("type") == "datasource" and v.get("query") == "prometheus"]
print("ok datasource variable $%s" % dsvars[0] if dsvars else "FAIL no Prometheus datasource variable")
panels = []
def walk(ps):
    for p in ps:
        panels.append(p)
        walk(p.get("panels", []))
walk(d.get("panels", []))
exprs, ids, bad = [], set(), 0
for p in panels:
    if p.get("id") in ids:
        print("FAIL panel id %s twice" % p.get("id")); bad += 1
    ids.add(p.get("id"))
    if p.get("type") == "row":
        continue
    title = p.get("title", "?")
    ds = p.get("datasource")
    if not ds or (isinstance(ds, dict) and not ds.get("uid")):
        print("FAIL panel %r has no datasource" % title); bad += 1
    if "gridPos" not in p:
        print("FAIL panel %r has no gridPos" % title); bad += 1
    ts = p.get("targets") or []
    if not ts:
        print("FAIL panel %r has no target" % title); bad += 1
    for t in ts:
        if not t.get("expr", "").strip():
            print("FAIL panel %r: a target without expr" % title); bad += 1
        else:
            exprs.append(("panel %r" % title, t["expr"]))
n_panels = sum(1 for p in panels if p.get("type") != "row")
print("ok %d panels, each with a datasource and targets" % n_panels if bad == 0 else "FAIL %d panel problems" % bad)
for a in d.get("annotations", {}).get("list", []):
    if a.get("expr"):
        exprs.append(("annotation %r" % a.get("name"), a["expr"]))
queries = []
for v in tvars:
    q = v.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    if v.get("type") == "query" and q:
        queries.append(("variable $%s" % v["name"], q))
bad = sum(check_expr(w, e) for w, e in exprs + queries)
print("ok every metric of the dashboard is scraped (%d exprs)" % len(exprs) if bad == 0 else "FAIL %d metric problems in the dashboard" % bad)
# the exprs as recording rules, for promtool to parse (Grafana's variables made concrete)
def concrete(e):
    e = e.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", e)
with open(rules_out, "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (w, e) in enumerate(exprs):
        f.write("      - record: dashboard:expr%d\n        expr: %s\n" % (i, json.dumps(concrete(e))))
EOF
)
if [ "$have_promtool" = 1 ]; then
    if promtool check rules "$tmp/exprs.rules.yml" >"$tmp/exprs.check" 2>&1; then ok; else bad "dashboard exprs do not parse: $(cat "$tmp/exprs.check")"; fi
fi

# ---- (c) the manual pages --------------------------------------------------------------
pages=(oversubd.8 oversub.1 oversub.yaml.5 oversub-scheduler.8)
for p in "${pages[@]}"; do [ -s "$mandir/$p" ] && ok || bad "docs/man/$p is missing"; done
if command -v man >/dev/null || command -v groff >/dev/null; then
    for p in "${pages[@]}"; do
        if command -v man >/dev/null; then
            w=$(MANWIDTH=80 man --warnings -l "$mandir/$p" 2>&1 >/dev/null)
            [ -z "$w" ] && ok || bad "man --warnings $p: $w"
        fi
        if command -v groff >/dev/null; then
            w=$(groff -man -ww -z "$mandir/$p" 2>&1)
            [ -z "$w" ] && ok || bad "groff -ww $p: $w"
        fi
    done
else
    echo "man and groff missing (Debian: man-db, groff-base): the pages' rendering is not checked"
fi
tally < <(python3 - "$mandir" "$root" "$bin" <<'EOF'
import re, subprocess, sys
mandir, root, daemon = sys.argv[1:4]
def page(p):
    # roff source with its escapes for dashes and quotes undone
    s = open("%s/%s" % (mandir, p)).read()
    s = s.replace("\\-", "-").replace("\\(dq", '"')
    return re.sub(r"\\f[BIRP]", "", s)
def tags(s):
    """the first word of every .TP tag, fonts stripped"""
    out, lines = set(), s.split("\n")
    for i, l in enumerate(lines[:-1]):
        if l.startswith(".TP"):
            t = re.sub(r"\\f[BIRP]", "", lines[i + 1])
            t = re.sub(r"^\.(B|I|BI|BR|IR|RB)\s+", "", t).replace('"', " ")
            out.update(t.split()[:1])
    return out
pages = ("oversubd.8", "oversub.1", "oversub.yaml.5", "oversub-scheduler.8")
bad = 0
for p in pages:
    for sec in ("NAME", "SYNOPSIS", "DESCRIPTION", "FILES", "EXIT STATUS", "ENVIRONMENT", "EXAMPLES", "SEE ALSO"):
        if not re.search(r'^\.SH "?%s"?$' % sec, page(p), re.M):
            print("FAIL %s has no %s section" % (p, sec)); bad += 1
for p, sec in (("oversubd.8", "OPTIONS"), ("oversubd.8", "SIGNALS"), ("oversub.1", "COMMANDS"),
               ("oversub.1", "OPTIONS"), ("oversub.yaml.5", "KEYS")):
    if not re.search(r"^\.SH %s$" % sec, page(p), re.M):
        print("FAIL %s has no %s section" % (p, sec)); bad += 1
print("ok every page has its sections" if bad == 0 else "FAIL %d sections missing" % bad)

# oversubd.8: every flag of oversubd --help, and the signals
s8 = page("oversubd.8")
h = subprocess.run([daemon, "--help"], capture_output=True, text=True).stdout
flags = sorted(set(re.findall(r"(--[a-z][a-z-]*)", h)))
miss = [f for f in flags if f not in tags(s8)]
print("FAIL oversubd.8 lacks the flags %s" % miss if miss or not flags else "ok oversubd.8 has all %d flags" % len(flags))
# oversub-scheduler.8: every flag of oversub-scheduler --help (beside oversubd)
import os
sched = os.path.join(os.path.dirname(daemon), "oversub-scheduler")
if os.path.exists(sched):
    s9 = page("oversub-scheduler.8")
    h = subprocess.run([sched, "--help"], capture_output=True, text=True).stdout
    flags = sorted(set(re.findall(r"(--[a-z][a-z-]*)", h)))
    miss = [f for f in flags if f not in tags(s9)]
    print("FAIL oversub-scheduler.8 lacks the flags %s" % miss if miss or len(flags) < 10 else "ok oversub-scheduler.8 has all %d flags" % len(flags))
else:
    print("FAIL no oversub-scheduler beside %s" % daemon)
for sig in ("SIGTERM", "SIGHUP"):
    print("ok oversubd.8 says what %s does" % sig if sig in tags(s8) else "FAIL oversubd.8 has no %s entry" % sig)

# oversub.yaml.5: every key of oversub.yaml (commented ones too) and of read_config
s5 = page("oversub.yaml.5")
keys = set()
for l in open(root + "/oversub.yaml"):
    m = re.match(r"^(?:# )?([a-z][a-z_]*):(\s|$)", l)
    if m:
        keys.add(m.group(1))
src = open(root + "/src/daemon/main.c").read()
keys.update(re.findall(r'strcmp\(key, "([a-z_]+)"\)', src))
keys.update(re.findall(r'\{"([a-z_]+)", (?:&c->|NULL)', src))
have = {t.rstrip(":") for t in tags(s5) if t.endswith(":")}
miss = sorted(keys - have)
print("FAIL oversub.yaml.5 lacks the keys %s" % miss if miss or len(keys) < 20 else "ok oversub.yaml.5 has all %d keys" % len(keys))
extra = sorted(have - keys)
print("FAIL oversub.yaml.5 documents keys oversubd does not read: %s" % extra if extra else "ok oversub.yaml.5 documents no unknown key")

# oversub.1: every command of the CLI's tables (daemon_cmds.c's commands[], main.c's offline
# ones, demo, help) and every option of their parsing (the flag tables, simulate's and demo's)
s1 = page("oversub.1")
dc = open(root + "/src/cli/daemon_cmds.c").read()
cli = open(root + "/src/cli/main.c").read()
demo = open(root + "/src/cli/demo.c").read()
cmds, opts = set(), set()
m = re.search(r"struct command commands\[\]\s*=\s*\{(.*?)\n\};", dc, re.S)
if m:
    cmds.update(re.findall(r'^\s*\{"([a-z]+)",\s*"', m.group(1), re.M))
m = re.search(r"offline_cmds\[\]\s*=\s*\{(.*?)\n\};", cli, re.S)
if m:
    cmds.update(re.findall(r'\{"([a-z]+)",', m.group(1)))
cmds.update(c for c in re.findall(r'strcmp\(cmd, "([a-z]+)"\)', cli))
# flag tables: {"name", 0 or 'x', NULL or "ARG", "help"}
for name, short in re.findall(r'\{"([a-z][a-z-]*)",\s*(0|\'[a-z]\'),\s*(?:NULL|")', dc):
    opts.add("--" + name)
    if short != "0":
        opts.add("-" + short.strip("'"))
# simulate and advise: parse_common's getopt table
body = cli[cli.index("parse_common("):]
body = body[: body.index("{NULL, 0, NULL, 0}")]
opts.update("--" + o for o in re.findall(r'\{"([a-z][a-z-]*)",\s*(?:required|no)_argument', body))
opts.update(re.findall(r'strcmp\(argv\[i\], "(--[a-z][a-z-]*)"\)', demo))
opts -= {"--history"}  # accepted by simulate and advise, and unused
miss = sorted(cmds - tags(s1))
print("FAIL oversub.1 lacks the commands %s" % miss if miss or len(cmds) < 12 else "ok oversub.1 has all %d commands" % len(cmds))
miss = sorted(o for o in opts if not re.search(r"(?<![A-Za-z-])%s(?![a-z-])" % re.escape(o), s1))
print("FAIL oversub.1 lacks the options %s" % miss if miss or len(opts) < 40 else "ok oversub.1 has all %d options of the commands" % len(opts))
EOF
)

# the examples of oversub.yaml.5 are configurations oversubd accepts (and a bad key is not)
awk -v d="$tmp" '/^\.EX/{n++; f=1; next} /^\.EE/{f=0} f{gsub(/\\\(dq/, "\""); gsub(/\\-/, "-"); print > (d "/example" n ".yaml")}' "$mandir/oversub.yaml.5"
n=0
for f in "$tmp"/example*.yaml; do
    [ -e "$f" ] || continue
    n=$((n + 1))
    "$bin" --config "$f" --help >/dev/null 2>"$tmp/example.err"
    expect "oversub.yaml.5 example $n accepted ($(head -c 300 "$tmp/example.err"))" 0 "$?"
done
[ "$n" -ge 1 ] && ok || bad "oversub.yaml.5 has no example"
printf 'listen: 127.0.0.1:0\nno_such_key: 1\n' >"$tmp/bogus.yaml"
"$bin" --config "$tmp/bogus.yaml" --help >/dev/null 2>&1
expect "an unknown key refused" 2 "$?"

echo "monitoring: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
