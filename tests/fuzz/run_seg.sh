#!/usr/bin/env bash
# run_seg.sh - the grant segment's reader under libFuzzer for a bounded time (make test: 10 s),
# from seeds made here: a clean header, the issue-23 rewrites (n_slots 0x7fffffff, n_devices
# 2^32-1 with a LIVE slot), a huge reserved figure.
# Usage: run_seg.sh FUZZ_SEG SECONDS
set -u
fuzz=$1
secs=${2:-10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
python3 - "$tmp/corpus" <<'PY'
import struct, sys, os
d = sys.argv[1]
def hdr(ndev=4, nslots=256, slot_off=None, slot_size=208):
    return struct.pack("<8I", 0x31475355, 1, 0, ndev, nslots, 0, slot_size, 0)
open(os.path.join(d, "clean"), "wb").write(bytes([3]) + hdr()[1:])
open(os.path.join(d, "nslots"), "wb").write(bytes([3]) + hdr(nslots=0x7fffffff)[1:])
live = bytearray(4096)
live[0:32] = hdr(ndev=0xffffffff)
live[0] = 1
open(os.path.join(d, "ndev"), "wb").write(bytes(live))
PY
"$fuzz" -max_total_time="$secs" -runs=2000000 -max_len=70000 -print_final_stats=1 \
    "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$tmp/log"
if [ $rc -ne 0 ]; then
    tail -40 "$tmp/log"
    echo "run_seg.sh: the fuzzer found a failure (above)"
    exit 1
fi
echo "corpus: $(ls "$tmp/corpus" | wc -l) inputs"
