#!/usr/bin/env bash
# test_dashboard.sh - the dashboard (GET / of the control API, src/daemon/web/dashboard.html) in a
# real browser: headless Chromium (Debian's chromium) driven by puppeteer-core (tests/sdk, installed
# by scripts/install-deps.sh) through tests/dashboard/dashboard.test.mjs, against a real oversubd:
# GPUs, services of every class, events with reasons, the utilisation chart, a submit and a release
# shown live, the daemon going away and coming back with an admin token (reads without it, the
# token field unredacting command arguments). Screenshots are kept as artefacts:
# $OSUB_ARTEFACTS, else tests/artefacts/ next to the oversubd binary (the build folder).
# Skips (77) only when Chromium is not installed.
# Usage: test_dashboard.sh PATH/TO/oversubd
set -u
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
sdk=$(cd "$here/../sdk" && pwd)
. "$here/lib.sh"
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "test_dashboard: SKIP: $chromium is not installed (scripts/install-deps.sh test installs chromium)"; exit 77; }
[ -d "$sdk/node_modules/puppeteer-core" ] || {
    echo "test_dashboard: puppeteer-core is not installed (scripts/install-deps.sh test runs npm ci in tests/sdk)"; exit 1; }
art=${OSUB_ARTEFACTS:-$(dirname "$bin")/tests/artefacts}
mkdir -p "$art" && art=$(cd "$art" && pwd)
rm -f "$art/dashboard.png" "$art/dashboard-token.png"

# the page itself: one self-contained file, nothing from elsewhere, API strings never as HTML
page=$here/../../src/daemon/web/dashboard.html
if grep -nE 'innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(' "$page"; then bad "the page builds HTML from strings"; else ok; fi
if grep -nE '(src|href)="(https?:)?//' "$page"; then bad "the page loads something from elsewhere"; else ok; fi

S=$tmp/s.sock
printf 'suspend_host_mib: 65536\n' >"$tmp/c.yaml"
"$bin" --config "$tmp/c.yaml" --listen 127.0.0.1:0 --socket "$S" --state "$tmp/st.db" --gpus sim:4x81920 --tick-ms 100 \
    >"$tmp/out" 2>"$tmp/err" &
dpid=$!
pids+=("$dpid")
PORT=$(waitline "$tmp/out" "listening on http://127.0.0.1:") || { echo "oversubd did not start: $(cat "$tmp/err")"; exit 1; }
A="http://127.0.0.1:$PORT"

# the page is served with its policy
hdr=$(curl -s -D - -o "$tmp/page.html" "$A/")
case "$hdr" in *"Content-Security-Policy: default-src 'self'"*) ok ;; *) bad "GET / has no Content-Security-Policy" ;; esac
if cmp -s "$tmp/page.html" "$page"; then ok; else bad "GET / is not src/daemon/web/dashboard.html (rebuild oversubd)"; fi

# services of every class, over the Unix socket
for spec in '{"id":"chat","class":"online","vram":"40GiB"}' '{"id":"chat-b","class":"online","vram":"20GiB"}' \
    '{"id":"batch-a","class":"batch","vram":"60GiB"}' '{"id":"exp-a","class":"experiment","vram":"30GiB"}'; do
    c=$(curl -s -o "$tmp/body" -w '%{http_code}' --unix-socket "$S" -X POST http://x/v1/services -d "$spec")
    expect "submit $spec" 201 "$c"
done
# a suspended one (an operator's suspend through an http method that answers at once)
python3 -c "
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(200); self.send_header('Content-Length', '0'); self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(('127.0.0.1', 0), H)
open('$tmp/sp.tmp', 'w').write(str(s.server_address[1])); os.rename('$tmp/sp.tmp', '$tmp/sp')
s.serve_forever()" &
pids+=($!)
for _ in $(seq 1 200); do [ -s "$tmp/sp" ] && break; sleep 0.05; done
SP=$(cat "$tmp/sp")
c=$(curl -s -o "$tmp/body" -w '%{http_code}' --unix-socket "$S" -X POST http://x/v1/services \
    -d '{"id":"exp-sus","class":"experiment","vram":"10GiB","suspend":{"method":"http","url":"http://127.0.0.1:'"$SP"'","suspend":"/s","resume":"/r"}}')
expect "submit a suspendable service" 201 "$c"
curl -s -o /dev/null --unix-socket "$S" -X POST http://x/v1/services/exp-sus/ready
expect "its operator suspend" 200 "$(curl -s -o "$tmp/body" -w '%{http_code}' --unix-socket "$S" -X POST http://x/v1/services/exp-sus/suspend)"
sus_state() { curl -s --unix-socket "$S" http://x/v1/services/exp-sus | json 'd["state"]'; }
for _ in $(seq 1 600); do [ "$(sus_state)" = suspended ] && break; sleep 0.05; done
expect "exp-sus suspended" suspended "$(sus_state)"
# some usage, so that the used bars and the chart's used line have something to show
curl -s -o /dev/null --unix-socket "$S" -X PUT http://x/v1/services/chat/usage -d '{"vram_mib": 30000}'
curl -s -o /dev/null --unix-socket "$S" -X PUT http://x/v1/services/batch-a/usage -d '{"vram_mib": 50000}'

OSUB_URL=$A OSUB_SOCK=$S OSUB_BIN=$bin OSUB_DIR=$tmp OSUB_PID=$dpid OSUB_CHROMIUM=$chromium \
    OSUB_SDK=$sdk OSUB_ART=$art timeout 120 node "$here/../dashboard/dashboard.test.mjs" >"$tmp/node.out" 2>&1
rc=$?
cat "$tmp/node.out"
# the driver's second daemon and the managed service's process, should it have left them
for f in d2.pid job.pid; do [ -s "$tmp/$f" ] && pids+=("$(cat "$tmp/$f")"); done
n_pass=$(sed -n 's/^dashboard: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$tmp/node.out")
n_fail=$(sed -n 's/^dashboard: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$tmp/node.out")
pass=$((pass + ${n_pass:-0}))
fail=$((fail + ${n_fail:-0}))
[ -n "$n_pass" ] || bad "the browser driver did not finish (exit $rc): $(tail -5 "$tmp/err" "$tmp/err2" 2>/dev/null)"
[ "$rc" = 0 ] || [ "${n_fail:-0}" != 0 ] || bad "the browser driver exited $rc"

# the screenshots: non-empty PNG files
for f in dashboard.png dashboard-token.png; do
    if [ -s "$art/$f" ] && [ "$(head -c 8 "$art/$f" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
        ok; echo "test_dashboard: screenshot $art/$f ($(stat -c %s "$art/$f") bytes)"
    else
        bad "no PNG screenshot at $art/$f"
    fi
done

echo "test_dashboard: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
