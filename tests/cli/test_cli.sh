#!/usr/bin/env bash
# test_cli.sh - the oversub CLI as a user runs it: exit codes, messages, JSON, the plot, every
# command's --help, and the daemon commands against a real oversubd (next to oversub, or
# $OVERSUBD) on 127.0.0.1:0: deploy, ready, events --follow, --json, bash completion.
# Usage: test_cli.sh PATH/TO/oversub
set -u
bin=$1
tmp=$(mktemp -d)
DPID=
trap '[ -n "$DPID" ] && kill "$DPID" 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0
fail=0
check() { # name, expected exit, command...
    local name=$1 want=$2
    shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    if [ "$got" -eq "$want" ]; then pass=$((pass + 1)); else
        fail=$((fail + 1))
        echo "FAIL: $name: exit $got, want $want"
        sed 's/^/  | /' "$tmp/err" | head -5
    fi
}
contains() { # name, file, text
    if grep -q -- "$3" "$2"; then pass=$((pass + 1)); else
        fail=$((fail + 1))
        echo "FAIL: $1: $(basename "$2") does not say '$3'"
        sed 's/^/  | /' "$2" | head -5
    fi
}

cat >"$tmp/s.json" <<'J'
{"services": [
 {"id": "web", "class": "online", "vram_mib": 20000},
 {"id": "job", "class": "batch", "vram": "30GiB", "min_vram": "10GiB", "resumable": true},
 {"id": "exp", "class": "experiment", "vram_mib": 30000, "min_vram_mib": 8000}]}
J
{
    echo "timestamp_s,service,vram_mib,compute_pct"
    for t in $(seq 0 60 3600); do
        echo "$t,web,15000,40"
        echo "$t,job,$((10000 + (t / 60 % 10) * 1500)),30"
        echo "$t,exp,$((20000 - (t / 60 % 7) * 1000)),20"
    done
} >"$tmp/u.csv"

check "help" 0 "$bin" --help
contains "help lists simulate" "$tmp/out" "simulate"
cp "$tmp/out" "$tmp/tophelp"
check "version" 0 "$bin" --version
check "no command" 2 "$bin"
check "unknown command" 2 "$bin" frobnicate
contains "unknown command says so" "$tmp/err" "unknown command 'frobnicate'"
check "simulate --help" 0 "$bin" simulate --help
contains "simulate --help documents --gpus" "$tmp/out" "--gpus"
check "simulate without input" 2 "$bin" simulate
contains "says what to give" "$tmp/err" "either --genai"
check "bad ratio" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --ratio 1.2345
contains "ratio message" "$tmp/err" "at most three"
check "bad pool" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 8xbanana
check "bad policy" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --policy magic
check "unknown option" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --frob
check "missing file" 2 "$bin" simulate --services "$tmp/nope.json" --usage "$tmp/u.csv"
contains "names the file" "$tmp/err" "nope.json"
check "table" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920 --quiet
contains "table has the policies" "$tmp/out" "hindsight"
check "json + plot" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus min \
    --ratio 1.0:1.5:0.25 --json --plot "$tmp/p.svg" --quiet
if python3 -c "
import json,sys
d=json.load(open('$tmp/out'))
rs=d['results']
assert len(rs)==6, len(rs)
for r in rs:
    for k in ['policy','ratio','gpus','mean_used_util','p95_used_util','mean_held_util','mean_logical_util','oom_events','p0_disruptions','unmet_fraction','degrades_per_week','evictions_per_week']:
        assert k in r, k
    assert 0 <= r['mean_used_util'] <= 1
" 2>"$tmp/py"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: json shape"; cat "$tmp/py"; fi
if command -v xmllint >/dev/null; then
    check "svg well-formed" 0 xmllint --noout "$tmp/p.svg"
fi
check "progress on stderr" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920
contains "progress" "$tmp/err" "simulate:"
check "same output twice (1)" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --json --quiet
cp "$tmp/out" "$tmp/out1"
check "same output twice (2)" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --json --quiet
if cmp -s "$tmp/out" "$tmp/out1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: output differs between runs"; fi
check "advise" 0 "$bin" advise --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920 --quiet
contains "advise recommends" "$tmp/out" "ratio"
contains "advise caveat" "$tmp/out" "less than a week"
check "advise json" 0 "$bin" advise --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920 --json --quiet
contains "advise json key" "$tmp/out" "recommended_ratio"
contains "advise says whether degrades count" "$tmp/out" "degrades_per_week"
contains "advise says where the ratio stops binding" "$tmp/out" "ratio_stops_binding_at"
# advise never recommends a ratio above the one from which every run is the same
if python3 -c "
import json
d=json.load(open('$tmp/out'))
rec=d['recommended_ratio']
assert rec is None or rec <= d['ratio_stops_binding_at'] + 1e-9, (rec, d['ratio_stops_binding_at'])
" 2>"$tmp/py"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: advise recommends a ratio that does not bind"; cat "$tmp/py"; fi

# the engine's prediction settings and the parts of a trace, with their errors
for bad in "--pods 2/2" "--pods 1" "--pods -1/2" "--pods 0/0" "--pods a/b" "--window 5:3" \
    "--window x" "--window 1:" "--predict-trust 0" "--predict-trust -1" "--predict-trust x" \
    "--floor-start -5" "--floor-start soon"; do
    # shellcheck disable=SC2086
    check "bad ${bad%% *} ($bad)" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" $bad
    contains "says which option ($bad)" "$tmp/err" "${bad%% *}"
done
check "sweep that does not bind" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" \
    --gpus 1x81920 --ratio 1.0:2.0:0.5 --policy oversub --quiet
contains "says where the ratio stops binding" "$tmp/out" "every ratio from 1.00 to 2.00 runs the same"
check "single ratio: no such line" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" \
    --gpus 1x81920 --ratio 1.5 --policy oversub --quiet
if grep -q "runs the same" "$tmp/out"; then fail=$((fail + 1)); echo "FAIL: one ratio said to run the same"; else pass=$((pass + 1)); fi
# --suspend: which preemptible services may be suspended; bad values are refused, none is no flag
for bad in "--suspend 1.5" "--suspend foo" "--suspend -0.5" "--suspend 0.1234" "--suspend=" \
    "--suspend-host-mib lots" "--suspend-host-mib -1" "--suspend-residual x"; do
    # shellcheck disable=SC2086
    check "bad ${bad%% *} ($bad)" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" $bad
    contains "says which option ($bad)" "$tmp/err" "${bad%%[ =]*}"
done
contains "--suspend says what it takes" "$tmp/err" "is not a size"
check "bad --suspend (message)" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --suspend 2
contains "--suspend message" "$tmp/err" "is not all, none or a fraction from 0 to 1"
check "no --suspend" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920 \
    --ratio 1.0:2.0:0.5 --quiet
cp "$tmp/out" "$tmp/nosus"
check "--suspend none" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920 \
    --ratio 1.0:2.0:0.5 --quiet --suspend none
if cmp -s "$tmp/out" "$tmp/nosus"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --suspend none differs from no flag"; diff "$tmp/nosus" "$tmp/out" | head -5; fi
if grep -q "suspends/wk" "$tmp/nosus"; then fail=$((fail + 1)); echo "FAIL: suspend columns without --suspend"; else pass=$((pass + 1)); fi
# --degrade: which batch and experiment services answer a degrade; all is no flag
for bad in "--degrade 1.5" "--degrade some" "--degrade -1" "--degrade="; do
    # shellcheck disable=SC2086
    check "bad --degrade ($bad)" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" $bad
    contains "says which option ($bad)" "$tmp/err" "--degrade"
done
contains "--degrade message" "$tmp/err" "is not all, none or a fraction from 0 to 1"
check "--degrade all" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920 \
    --ratio 1.0:2.0:0.5 --quiet --degrade all
if cmp -s "$tmp/out" "$tmp/nosus"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --degrade all differs from no flag"; diff "$tmp/nosus" "$tmp/out" | head -5; fi
check "--degrade none" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920 \
    --ratio 1.3 --quiet --degrade none --json
if python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
r = [x for x in d['results'] if x['policy'] == 'oversub'][0]
assert sum(r['degrades_per_week'].values()) == 0, r['degrades_per_week']
" "$tmp/out" 2>"$tmp/py"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --degrade none still degrades"; cat "$tmp/py"; fi
# --relocate needs suspendable services: the message says what to give
check "--relocate without --suspend" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" \
    --gpus 1x81920 --ratio 1.3 --quiet --relocate
contains "--relocate says what to give" "$tmp/err" "--suspend is none (the default); give --suspend all or a fraction above 0"
check "--suspend all" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --gpus 1x81920 \
    --ratio 1.3 --quiet --suspend all --suspend-host-mib 100GiB --suspend-residual 0.5GiB
contains "--suspend all shows suspends" "$tmp/out" "suspends/wk"
contains "--suspend all shows what preemption cost" "$tmp/out" "evict / susp"
check "--suspend 0.5 --json" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" \
    --gpus 1x81920 --quiet --suspend 0.5 --json
if python3 -c "
import json
d=json.load(open('$tmp/out'))
for r in d['results']:
    for k in ('suspends_per_week', 'wakes', 'suspend_lost_minutes', 'evict_lost_minutes', 'suspend'):
        assert k in r, k
" 2>"$tmp/py"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --json lacks the suspend figures"; cat "$tmp/py"; fi
check "--pods needs --genai" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --pods 0/2
contains "--pods needs --genai (says so)" "$tmp/err" "applies to --genai only"
check "--window needs --genai" 2 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" --window 0:1
# a window shorter than a second is a window, not the whole trace
mkdir -p "$tmp/g"
{
    echo "timestamp_s,pod,vram_bytes"
    for t in $(seq 0 60 7200); do echo "$t,aa01,$((20 * 1073741824))"; echo "$t,bb02,$((10 * 1073741824))"; done
} >"$tmp/g/genai_pod_vram.csv"
check "tiny window" 0 "$bin" simulate --genai "$tmp/g" --window 0:0.0001 --gpus 2x81920 --json --quiet
if python3 -c "
import json
d=json.load(open('$tmp/out'))
assert d['trace']['samples'] == 2, d['trace']
" 2>"$tmp/py"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: tiny window replayed more than its samples"; cat "$tmp/py"; fi
check "window past the end" 2 "$bin" simulate --genai "$tmp/g" --window 5:6 --gpus 2x81920 --quiet
contains "window past the end (says so)" "$tmp/err" "no pod left in the part or window"
check "floor-start never" 0 "$bin" simulate --services "$tmp/s.json" --usage "$tmp/u.csv" \
    --gpus 1x81920 --floor-start never --predict-trust 0.5 --quiet
# a service larger than any GPU: every policy says so, not 'over budget'
cat >"$tmp/big.json" <<'J'
{"services": [{"id": "huge", "class": "batch", "vram_mib": 90000, "gpus": 1}]}
J
printf 'timestamp_s,service,vram_mib\n0,huge,85000\n60,huge,85000\n' >"$tmp/big.csv"
check "too big runs" 0 "$bin" simulate --services "$tmp/big.json" --usage "$tmp/big.csv" \
    --gpus min --policy static,oversub,hindsight --quiet
contains "too big named (static)" "$tmp/out" "static: not feasible: a service larger than a GPU"
contains "too big named (hindsight)" "$tmp/out" "hindsight: not feasible: a service larger than a GPU"

# ---- every command's usage: --help, -h and 'help CMD' on stdout with exit 0; an unknown flag
# exits 2 with the usage on stderr; the top-level help lists one command a line ----
cmds="status list deploy ready resize release suspend resume usage events explain queue logs gpu ratio simulate
advise demo"
for c in $cmds; do
    for way in "$c --help" "$c -h" "help $c"; do
        # shellcheck disable=SC2086
        check "$way" 0 "$bin" $way
        if grep -q "^usage: oversub $c" "$tmp/out" && grep -q "^Example" "$tmp/out" &&
            [ ! -s "$tmp/err" ]; then pass=$((pass + 1)); else
            fail=$((fail + 1))
            echo "FAIL: '$way' does not print a usage with an example on stdout"
        fi
    done
    check "$c --frobnicate" 2 "$bin" "$c" --frobnicate
    if grep -q "usage: oversub $c" "$tmp/err" && [ ! -s "$tmp/out" ]; then pass=$((pass + 1)); else
        fail=$((fail + 1))
        echo "FAIL: '$c --frobnicate': no usage on stderr (or something on stdout)"
    fi
    if [ "$(grep -c "^  $c  *[A-Za-z]" "$tmp/tophelp")" = 1 ]; then pass=$((pass + 1)); else
        fail=$((fail + 1))
        echo "FAIL: oversub --help does not list '$c' on a line of its own"
    fi
done
# ...and lists nothing else
listed=$(grep -o "^  [a-z][a-z]*  " "$tmp/tophelp" | tr -d ' ' | sort | tr '\n' ' ')
want=$(echo "$cmds" help | tr ' ' '\n' | sort | tr '\n' ' ')
if [ "$listed" = "$want" ]; then pass=$((pass + 1)); else
    fail=$((fail + 1))
    echo "FAIL: oversub --help lists '$listed', want '$want'"
fi
check "help help" 0 "$bin" help help
check "help of an unknown command" 2 "$bin" help frobnicate
check "an unknown global option" 2 "$bin" --frobnicate status
# arguments checked before any daemon is asked (none listens on port 1)
U1="http://127.0.0.1:1"
check "release: no id" 2 "$bin" --url $U1 release
check "release: two ids" 2 "$bin" --url $U1 release a b
contains "release: two ids (says so)" "$tmp/err" "unexpected argument 'b'"
check "an id that is not one" 2 "$bin" --url $U1 release Not_An_Id
contains "an id that is not one (says so)" "$tmp/err" "is not a service id"
check "deploy without --class" 2 "$bin" --url $U1 deploy web --vram 20GiB
contains "--class required (says so)" "$tmp/err" "--class is required"
contains "--class required (lists the classes)" "$tmp/err" "online.*batch.*experiment"
check "deploy without --vram" 2 "$bin" --url $U1 deploy web --class online
check "a bare size" 2 "$bin" --url $U1 deploy web --class online --vram 10
contains "a bare size (says which)" "$tmp/err" "10 is not a size: say 10GiB or 10240MiB"
check "a bare size in MiB" 2 "$bin" --url $U1 deploy web --class online --vram 81920
contains "a bare size in MiB (says which)" "$tmp/err" "say 81920MiB or 80GiB"
check "usage: a bare size" 2 "$bin" --url $U1 usage web --vram 2048
check "resize: a bare size" 2 "$bin" --url $U1 resize web --vram 4
check "resize: nothing to change" 2 "$bin" --url $U1 resize web
check "deploy: --dry-run --wait" 2 "$bin" --url $U1 deploy web --class online --vram 1GiB --dry-run --wait
check "deploy: a program after --, not before" 2 "$bin" --url $U1 deploy web --class batch --vram 1GiB prog
check "deploy: --idle-suspend under the daemon's 1000 ms" 2 "$bin" --url $U1 deploy web --class batch --vram 1GiB --idle-suspend 500
contains "--idle-suspend says the daemon's range" "$tmp/err" "from 1000 to 604800000"
check "ratio below 1" 2 "$bin" --url $U1 ratio 0.5
contains "ratio below 1 (says the range)" "$tmp/err" "from 1.0 (no overselling) to 100"
check "ratio: four decimals" 2 "$bin" --url $U1 ratio 1.2345
contains "ratio: four decimals (says so)" "$tmp/err" "three decimals"
check "ratio: not a number" 2 "$bin" --url $U1 ratio lots
check "gpu: a bad action" 2 "$bin" --url $U1 gpu melt 0
check "events: bad --since" 2 "$bin" --url $U1 events --since x
check "ready: bad --timeout" 2 "$bin" --url $U1 ready web --timeout soon
check "unreachable" 3 "$bin" --url $U1 status
contains "unreachable (says so)" "$tmp/err" "is oversubd running"
check "unreachable --json" 3 "$bin" --json --url $U1 list
if python3 -c "
import json
d=json.load(open('$tmp/out'))
assert d['error']['code'] == 'unreachable', d
" 2>"$tmp/py"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: unreachable --json: no error document"; cat "$tmp/py"; fi

# ---- against a real oversubd ----
wait_for() { # seconds, command...: true once the command is (polled every 50 ms)
    local n=$(($1 * 20))
    shift
    until "$@" 2>/dev/null; do
        n=$((n - 1))
        [ "$n" -le 0 ] && return 1
        sleep 0.05
    done
}
jcheck() { # name, python assertion on d (the JSON in $tmp/out)
    if python3 -c "
import json
d=json.load(open('$tmp/out'))
assert $2, d
" 2>"$tmp/py"; then pass=$((pass + 1)); else
        fail=$((fail + 1))
        echo "FAIL: $1"
        tail -3 "$tmp/py" | sed 's/^/  | /'
    fi
}
daemon=$(dirname "$bin")/oversubd
[ -x "$daemon" ] || daemon=${OVERSUBD:-}
if [ -z "$daemon" ] || [ ! -x "$daemon" ]; then
    fail=$((fail + 1))
    echo "FAIL: no oversubd next to $bin (set OVERSUBD)"
else
    mkdir -p "$tmp/d"
    "$daemon" --listen 127.0.0.1:0 --socket "" --state "$tmp/d/state.db" --gpus sim:2x81920 \
        --ratio 1.0 --tick-ms 100 >"$tmp/d/out" 2>"$tmp/d/err" &
    DPID=$!
    wait_for 10 grep -q "listening on http://127.0.0.1:[0-9]" "$tmp/d/out" ||
        echo "oversubd did not start: $(cat "$tmp/d/err")"
    U=$(grep -o "http://127.0.0.1:[0-9]*" "$tmp/d/out" | head -1)
    C() { "$bin" --url "$U" "$@"; }
    post() { python3 -c "import urllib.request as u; u.urlopen(u.Request('$U$1', data=b'{}', method='POST', headers={'Content-Type': 'application/json'}))"; }

    # deploy says the truth: loading, not started; and what to do next
    check "deploy" 0 C deploy web --class online --vram 20GiB
    contains "deploy says loading" "$tmp/out" "^web: loading on GPU [0-9]"
    contains "deploy points at ready" "$tmp/out" "oversub ready web"
    if grep -q "started" "$tmp/out"; then fail=$((fail + 1)); echo "FAIL: deploy says started while loading"; else pass=$((pass + 1)); fi
    # ready waits for the service to report ready
    C ready web --timeout 30 >"$tmp/ready.out" 2>"$tmp/ready.err" &
    RPID=$!
    wait_for 10 grep -q "web is loading; waiting until it is running" "$tmp/ready.err" ||
        echo "ready did not say it waits: $(cat "$tmp/ready.err")"
    if kill -0 "$RPID" 2>/dev/null; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: ready did not wait"; fi
    post /v1/services/web/ready
    wait "$RPID"
    rc=$?
    if [ "$rc" = 0 ] && grep -q "^web: running on GPU [0-9] with 20480 MiB" "$tmp/ready.out"; then pass=$((pass + 1)); else
        fail=$((fail + 1))
        echo "FAIL: ready: exit $rc, said: $(cat "$tmp/ready.out" "$tmp/ready.err")"
    fi
    check "ready when running already" 0 C ready web
    contains "ready: one line" "$tmp/out" "^web: running"
    check "ready --json" 0 C ready web --json
    jcheck "ready --json is the service" "d['id'] == 'web' and d['state'] == 'running'"
    check "ready: unknown service" 1 C ready nobody
    contains "ready: unknown service (says so)" "$tmp/err" "nobody is not deployed"
    # deploy --wait: loaded once its restart cost passes
    check "deploy --wait" 0 C deploy quick --class batch --vram 2GiB --restart-cost 300 --wait
    contains "deploy --wait: loading, then running" "$tmp/out" "^quick: loading"
    contains "deploy --wait: running" "$tmp/out" "^quick: running on GPU"
    check "deploy --wait --json" 0 C --json deploy quick2 --class batch --vram 1GiB --restart-cost 200 --wait
    jcheck "deploy --wait --json: one document, running, with its decision" \
        "d['state'] == 'running' and d['decision']['outcome'] == 'started' and len(d['token']) == 64"
    check "ready: timeout" 3 C deploy slow --class batch --vram 1GiB --wait --timeout 1
    contains "ready: timeout (says so)" "$tmp/err" "slow is still loading after 1 s"
    check "ready --json: timeout" 3 C --json ready slow --timeout 1
    jcheck "ready --json: timeout document" "d['error']['code'] == 'timeout' and d['error']['state'] == 'loading'"
    # queued, then released while ready waits: exit 1 with the state and the daemon's reason
    # (an online service nobody may preempt on one GPU: no room for 50 GiB on each of two)
    check "deploy on1" 0 C deploy on1 --class online --vram 60GiB
    check "deploy: queued" 0 C deploy q --class batch --vram 100GiB --gpus 2
    contains "deploy: queued (says so)" "$tmp/out" "^q: queued at position 1"
    C ready q --timeout 30 >"$tmp/ready.out" 2>"$tmp/ready.err" &
    RPID=$!
    wait_for 10 grep -q "q is queued; waiting" "$tmp/ready.err" || echo "ready q did not wait"
    check "release" 0 C release q
    contains "release: one line" "$tmp/out" "^q: released$"
    wait "$RPID"
    rc=$?
    if [ "$rc" = 1 ] && grep -q "q is not deployed: released q" "$tmp/ready.err"; then pass=$((pass + 1)); else
        fail=$((fail + 1))
        echo "FAIL: ready on a released service: exit $rc, said: $(cat "$tmp/ready.err")"
    fi
    # events --follow starts from now; times are RFC 3339 with the UTC offset
    C events --follow >"$tmp/follow.out" 2>"$tmp/follow.err" &
    FPID=$!
    wait_for 10 grep -q "following the decision log after seq [0-9]" "$tmp/follow.err" || echo "events --follow did not start"
    C deploy late --class batch --vram 1GiB >/dev/null
    wait_for 10 grep -q "admitted late" "$tmp/follow.out" || echo "events --follow did not show the new event"
    kill "$FPID"
    wait "$FPID" 2>/dev/null
    contains "events --follow: the new event" "$tmp/follow.out" "admitted late"
    if grep -q "admitted web" "$tmp/follow.out"; then fail=$((fail + 1)); echo "FAIL: events --follow replayed old events"; else pass=$((pass + 1)); fi
    check "events" 0 env TZ=UTC "$bin" --url "$U" events
    contains "events: the whole log" "$tmp/out" "admitted web"
    if grep -vqE '^ *[0-9]+ [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z [a-z]' "$tmp/out"; then
        fail=$((fail + 1))
        echo "FAIL: an event time is not RFC 3339 UTC: $(grep -vE 'T[0-9:.]{12}Z' "$tmp/out" | head -2)"
    else pass=$((pass + 1)); fi
    if [ -e /usr/share/zoneinfo/Asia/Kolkata ]; then
        check "events -n 1 (local time)" 0 env TZ=Asia/Kolkata "$bin" --url "$U" events -n 1
        contains "local time with its offset" "$tmp/out" "T[0-9:.]*+05:30 "
    fi
    check "events --json" 0 C events --json
    jcheck "events --json: one document" "len(d['events']) > 5 and d['next'] == d['events'][-1]['seq']"
    last=$(python3 -c "import json; print(json.load(open('$tmp/out'))['next'])")
    check "events --since" 0 C events --since $((last - 2))
    if [ "$(wc -l <"$tmp/out")" = 2 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: events --since: $(wc -l <"$tmp/out") lines, want 2"; fi
    check "events -n 3" 0 C events -n 3
    if [ "$(wc -l <"$tmp/out")" = 3 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: events -n 3: $(wc -l <"$tmp/out") lines"; fi
    # --json everywhere: the daemon's JSON, one document; errors as an error document
    check "status --json" 0 C --json status
    jcheck "status --json" "d['pool']['gpus'][0]['vram_mib'] == 81920 and any(s['id'] == 'web' for s in d['services'])"
    check "list --json (after the command)" 0 C list --json
    jcheck "list --json" "sorted(s['id'] for s in d['services'])[:2] == ['late', 'on1']"
    check "list --ids" 0 C list --ids
    contains "list --ids" "$tmp/out" "^web$"
    check "explain --json" 0 C explain web --json
    jcheck "explain --json" "d['id'] == 'web' and 'prediction' in d"
    check "queue --json" 0 C queue --json
    jcheck "queue --json" "d['queued'] == [] and d['pending'] == [] and d['suspended'] == []"
    check "usage" 0 C usage quick --vram 1GiB
    contains "usage: one line" "$tmp/out" "^quick: running, request 2048 MiB, grant 2048 MiB, used 1024 MiB"
    check "resize --json" 0 C --json resize quick --vram 3GiB
    jcheck "resize --json" "d['vram_mib'] == 3072"
    check "release --json: refused" 1 C --json release nobody
    jcheck "release --json: the error document" "d['error']['code'] == 'unknown_service'"
    contains "release: refused on stderr" "$tmp/err" "refused (404 unknown_service)"
    # suspend: bad flags are usage errors; a service without a method is refused by the daemon
    check "deploy --suspend foo" 2 C deploy s1 --class batch --vram 1GiB --suspend foo
    contains "deploy --suspend foo (says so)" "$tmp/err" "cuda, vllm or sglang, not 'foo'"
    check "deploy --suspend vllm without a URL" 2 C deploy s1 --class batch --vram 1GiB --suspend vllm
    check "deploy --suspend cuda with a URL" 2 C deploy s1 --class batch --vram 1GiB --suspend cuda --suspend-url http://127.0.0.1:9
    check "deploy --suspend-url alone" 2 C deploy s1 --class batch --vram 1GiB --suspend-url http://127.0.0.1:9
    check "suspend: no method" 1 C suspend quick
    contains "suspend: no method (says so)" "$tmp/err" "refused (4[0-9][0-9] "
    check "suspend: two ids" 2 C suspend a b
    check "deploy a suspendable service" 0 C deploy sus --class batch --vram 1GiB --suspend vllm --suspend-url http://127.0.0.1:9
    C ready sus --timeout 1 >/dev/null 2>&1; post /v1/services/sus/ready
    check "suspend on a pool without suspend_host_mib" 1 C suspend sus
    contains "suspend off (says so)" "$tmp/err" "suspend is off on this pool: its suspend_host_mib is 0"
    check "release sus" 0 C release sus
    check "deploy: refused" 1 C deploy huge --class batch --vram 500GiB
    contains "deploy: refused (says why)" "$tmp/err" "too_big"
    check "ratio" 0 C ratio
    contains "ratio: shows it" "$tmp/out" "^ratio 1: logical capacity 163840 MiB"
    check "ratio 1.25" 0 C ratio 1.25
    contains "ratio 1.25: set" "$tmp/out" "^ratio 1.25: logical capacity 204800 MiB"
    check "gpu cordon" 0 C gpu cordon 1
    contains "gpu cordon: one line" "$tmp/out" "^GPU 1: cordoned"
    check "gpu uncordon --json" 0 C gpu uncordon 1 --json
    jcheck "gpu uncordon --json: the pool" "not d['gpus'][1]['cordoned']"

    # bash completion: commands, flags per command, values, service ids from the daemon
    comp=$(dirname "$0")/../../deploy/completion/oversub.bash
    cat >"$tmp/comp.sh" <<'B'
source "$1"
bin=$2 U=$3
complete -p oversub || exit 1
t() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=(); _oversub; echo "${COMPREPLY[*]}"; }
echo "commands: $(t oversub de)"
echo "flags: $(t oversub deploy web --cl)"
echo "class: $(t oversub deploy web --class '')"
echo "wait: $(t oversub deploy web --class batch --vram 1GiB --wa)"
echo "gpu: $(t oversub gpu '')"
echo "ids: $(t "$bin" --url "$U" release '')"
echo "no ids when unreachable: [$(t "$bin" --url http://127.0.0.1:1 release '')]"
for c in $(t oversub ''); do echo "$c: $(t oversub "$c" -)"; done
B
    check "completion" 0 bash "$tmp/comp.sh" "$comp" "$bin" "$U"
    cp "$tmp/out" "$tmp/comp.out"
    contains "completion: complete -p" "$tmp/comp.out" "complete -F _oversub oversub"
    contains "completion: commands" "$tmp/comp.out" "^commands: deploy demo$"
    contains "completion: a flag" "$tmp/comp.out" "^flags: --class$"
    contains "completion: classes" "$tmp/comp.out" "^class: online batch experiment$"
    contains "completion: --wait" "$tmp/comp.out" "^wait: --wait$"
    contains "completion: gpu actions" "$tmp/comp.out" "^gpu: cordon uncordon drain$"
    contains "completion: service ids" "$tmp/comp.out" "^ids: .*web"
    contains "completion: quiet when unreachable" "$tmp/comp.out" "^no ids when unreachable: \[\]$"
    # every flag a command's --help shows is completed for it
    for c in $cmds; do
        "$bin" "$c" --help | grep -oE "^  (-[a-z], )?--[a-z-]+" | grep -oE -- "--[a-z-]+" |
            grep -vx -- "--help" >"$tmp/flags"
        missing=""
        while read -r f; do
            grep -q -- "^$c: .*$f\( \|$\)" "$tmp/comp.out" || missing="$missing $f"
        done <"$tmp/flags"
        if [ -z "$missing" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: completion of $c lacks:$missing"; fi
    done
fi

# the README's managed deploy, run as written against oversubd started as make run starts it
# (issue 23: as root it was refused, "give 'user'"): in a folder laid out as the repository is
repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ -n "$daemon" ] && [ -x "$daemon" ]; then
    R=$tmp/readme
    mkdir -p "$R/var"
    ln -s "$(dirname "$bin")" "$R/build"
    run_line=$(awk '/^run:/,/^$/' "$repo/Makefile" | grep 'oversubd --config oversub.yaml')
    extra=""
    if [ "$(id -u)" = 0 ]; then
        if grep -q -- "--allow-root-services" <<<"$run_line"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: make run as root lets managed services run: $run_line"; fi
        extra=--allow-root-services
    fi
    (cd "$R" && exec "$daemon" --config "$repo/oversub.yaml" $extra --listen 127.0.0.1:0 --gateway 127.0.0.1:0 \
        --gpus sim:8x81920 --tick-ms 100 >"$R/out" 2>"$R/err") &
    RPID=$!
    wait_for 20 test -S "$R/var/oversub.sock" || echo "make run's oversubd did not start: $(cat "$R/err")"
    # the README's block, its result moved into this test's folder
    cmdline=$(awk '/build\/oversub deploy nightly/,/^ *```/' "$repo/README.md" | grep -v '```' |
        sed 's/\\$//' | tr '\n' ' ' | sed "s|/tmp/nightly.out|$tmp/nightly.out|")
    case "$cmdline" in *"deploy nightly"*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: the README's deploy example was not found" ;; esac
    (cd "$R" && unset OVERSUB_URL && eval "$cmdline") >"$tmp/readme.out" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: the README's deploy as written: exit $rc: $(cat "$tmp/readme.out")"; fi
    up() { (cd "$R" && "$bin" list 2>/dev/null) | grep -q "nightly.*\(loading\|running\)"; }
    if wait_for 20 up; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: the README's nightly runs: $(cd "$R" && "$bin" list 2>&1 | head -5)"; fi
    (cd "$R" && "$bin" release nightly) >/dev/null 2>&1
    kill "$RPID" 2>/dev/null
    wait "$RPID" 2>/dev/null
fi

echo "cli: $pass passed, $fail failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
