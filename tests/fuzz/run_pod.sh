#!/usr/bin/env bash
# run_pod.sh - oversub-scheduler's Pod reader under libFuzzer for a bounded time (make test:
# 10 s), from the committed seed corpus (tests/k8s/fixtures' shapes, quantities).
# Usage: run_pod.sh FUZZ_POD SECONDS
set -u
fuzz=$1
secs=${2:-10}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
cp "$here"/corpus/pod/* "$tmp/corpus/"
"$fuzz" -max_total_time="$secs" -runs=1000000 -max_len=8192 -print_final_stats=1 \
    "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$tmp/log"
if [ $rc -ne 0 ]; then
    tail -40 "$tmp/log"
    echo "run_pod.sh: the fuzzer found a failure (above)"
    exit 1
fi
echo "corpus: $(ls "$tmp/corpus" | wc -l) inputs"
