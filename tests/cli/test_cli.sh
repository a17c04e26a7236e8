#!/usr/bin/env bash
# test_cli.sh - the oversub CLI as a user runs it: exit codes, messages, JSON, the plot.
# Usage: test_cli.sh PATH/TO/oversub
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
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

echo "cli: $pass passed, $fail failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
