#!/usr/bin/env bash
# run_fuzz.sh - one libFuzzer target for a bounded time (make test: 10 s), from its committed
# seed corpus (tests/fuzz/corpus/NAME: good and bad inputs of its parser); a failure prints the
# fuzzer's log and the input that failed. The targets: exec (osubd_exec_take on specs, pods'
# "kubernetes" records), route (osubd_route_take and saved tables through osubd_routes_load),
# pbwire (the device plugin's protobuf wire; inputs shown in hex), pod (oversub-scheduler's Pod
# reader).
# Usage: run_fuzz.sh NAME FUZZER SECONDS
set -u
name=$1
fuzz=$2
secs=${3:-10}
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/corpus/$name" ] || { echo "run_fuzz.sh: no corpus $here/corpus/$name"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
cp "$here/corpus/$name"/* "$tmp/corpus/"
# -runs bounds the work on a slow machine as -max_total_time bounds the time
"$fuzz" -max_total_time="$secs" -runs=5000000 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="$tmp/" "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$tmp/log"
if [ $rc -ne 0 ]; then
    tail -40 "$tmp/log"
    for a in "$tmp"/crash-* "$tmp"/leak-* "$tmp"/timeout-*; do
        [ -e "$a" ] || continue
        if [ "$name" = pbwire ]; then
            echo "input: $(basename "$a"): $(od -An -tx1 "$a" | head -c 600)"
        else
            echo "input: $(basename "$a"): $(head -c 600 "$a")"
        fi
    done
    echo "run_fuzz.sh: fuzz_$name found a failure (above)"
    exit 1
fi
echo "corpus: $(ls "$tmp/corpus" | wc -l) inputs"
