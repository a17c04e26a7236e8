#!/usr/bin/env bash
# run_pbwire.sh - the device plugin's protobuf wire reader and writer under libFuzzer for a
# bounded time (make test: 10 s), from the committed seed corpus (the kubelet's message shapes,
# every wire type, non-canonical varints, and bad messages: a group, field 0, a short length).
# Usage: run_pbwire.sh FUZZ_PBWIRE SECONDS
set -u
fuzz=$1
secs=${2:-10}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
cp "$here"/corpus/pbwire/* "$tmp/corpus/"
"$fuzz" -max_total_time="$secs" -runs=5000000 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="$tmp/" "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$tmp/log"
if [ $rc -ne 0 ]; then
    tail -40 "$tmp/log"
    for a in "$tmp"/crash-* "$tmp"/leak-* "$tmp"/timeout-*; do
        [ -e "$a" ] && echo "input: $(basename "$a"): $(od -An -tx1 "$a" | head -c 600)"
    done
    echo "run_pbwire.sh: the fuzzer found a failure (above)"
    exit 1
fi
echo "corpus: $(ls "$tmp/corpus" | wc -l) inputs"
