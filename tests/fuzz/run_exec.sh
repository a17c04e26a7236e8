#!/usr/bin/env bash
# run_exec.sh - the actuation fields of a submitted spec under libFuzzer for a bounded time (make
# test: 10 s): any JSON object through osubd_exec_take, as a spec, as a pod's "kubernetes"
# record and with a program added, from the committed seed corpus (good and bad specs, pods).
# Usage: run_exec.sh FUZZ_EXEC SECONDS
set -u
fuzz=$1
secs=${2:-10}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
cp "$here"/corpus/exec/* "$tmp/corpus/"
"$fuzz" -max_total_time="$secs" -runs=5000000 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="$tmp/" "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$tmp/log"
if [ $rc -ne 0 ]; then
    tail -40 "$tmp/log"
    for a in "$tmp"/crash-* "$tmp"/leak-* "$tmp"/timeout-*; do
        [ -e "$a" ] && echo "input: $(basename "$a"): $(head -c 600 "$a")"
    done
    echo "run_exec.sh: the fuzzer found a failure (above)"
    exit 1
fi
echo "corpus: $(ls "$tmp/corpus" | wc -l) inputs"
