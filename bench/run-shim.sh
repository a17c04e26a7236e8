#!/usr/bin/env bash
# run-shim.sh BUILD - what liboversub-cuda.so adds to a cuMemAlloc_v2 + cuMemFree_v2 pair on the
# fake driver: the same program without and with the shim (enforcing a grant), interleaved, 7
# rounds each, 1 and 2 threads; medians. Target (issue 14): under 1 us added per pair.
set -eu
b=${1:-build}
prog=$b/bench/bench_shim
shim=$b/liboversub-cuda.so
export LD_LIBRARY_PATH=$b/tests/fakecuda
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for threads in 1 2; do
    plain=() shimmed=()
    for round in 1 2 3 4 5 6 7; do
        plain+=("$("$prog" 500000 "$threads" | cut -d= -f2)")
        shimmed+=("$(OVERSUB_VRAM_MIB=81920 LD_PRELOAD=$shim "$prog" 500000 "$threads" | cut -d= -f2)")
    done
    p=$(printf '%s\n' "${plain[@]}" | median)
    s=$(printf '%s\n' "${shimmed[@]}" | median)
    awk -v t="$threads" -v p="$p" -v s="$s" 'BEGIN {
        printf "threads=%d  fake driver alone: %.0f ns/pair  with the shim: %.0f ns/pair  added: %.0f ns/pair (%.2fx)\n",
            t, p, s, s - p, s / p }'
done
