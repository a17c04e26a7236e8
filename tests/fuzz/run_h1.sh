#!/usr/bin/env bash
# run_h1.sh - the HTTP/1.1 codec's libFuzzer target for a bounded time (make test: 20 s; make
# fuzz: FUZZ_SECONDS), from the committed seed corpus, then the differential test against
# python3-h11 on everything the fuzzer kept.
# Usage: run_h1.sh FUZZ_H1 H1DUMP SECONDS
set -u
fuzz=$1
dump=$2
secs=${3:-20}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
cp "$here"/corpus/h1/* "$tmp/corpus/"
# -runs bounds the work on a slow machine as -max_total_time bounds the time
"$fuzz" -max_total_time="$secs" -runs=2000000 -max_len=4096 -print_final_stats=1 \
    "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$tmp/log"
if [ $rc -ne 0 ]; then
    tail -40 "$tmp/log"
    echo "run_h1.sh: the fuzzer found a failure (above)"
    exit 1
fi
n=$(ls "$tmp/corpus" | wc -l)
echo "corpus: $n inputs"
/usr/bin/python3 "$here/diff_h11.py" "$dump" "$tmp/corpus"
