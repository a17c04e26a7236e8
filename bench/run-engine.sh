#!/usr/bin/env bash
# run-engine.sh - the engine benchmark: throughput and latency (wall clock, medians of runs),
# then instructions per command under callgrind (repeatable on a noisy machine), for the
# engine and, side by side, the brief's pool-level algorithm on the same command stream.
# Usage: bench/run-engine.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
bin="$build/bench/bench_engine"
[ -x "$bin" ] || { echo "run-engine.sh: $bin not built (make bench)" >&2; exit 2; }

echo "== wall clock: 45,000-command stream, median of 5 runs (one core) =="
taskset -c 0 "$bin" --commands 45000 --runs 5 2>/dev/null || "$bin" --commands 45000 --runs 5

echo
echo "== instructions per command (valgrind --tool=callgrind, 10,000-command stream) =="
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in engine brief; do
    fn=bench_run_$mode
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$mode" --toggle-collect="$fn" \
        "$bin" --commands 10000 --runs 1 --mode "$mode" --no-latency >"$tmp/out.$mode" 2>/dev/null
    ir=$(callgrind_annotate "$tmp/cg.$mode" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    if [ "$mode" = engine ]; then
        cmds=$(awk '/^stream:/ {print $2 + $5}' "$tmp/out.$mode")
    else
        cmds=10000
    fi
    # the measured function ran once per run (1) plus never for latency (--no-latency)
    echo "$mode instructions per command: $(( ir / cmds )) ($ir instructions over $cmds commands)"
done
