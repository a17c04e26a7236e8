#!/usr/bin/env bash
# gpu-check-shim.sh [BUILD] - the shim's checks against a real NVIDIA driver (a machine with a
# GPU; nothing here is needed by the test suite, which uses tests/fakes/fake_cuda.c):
#  1. a driver-API program allocating past its grant gets CUDA_ERROR_OUT_OF_MEMORY (2), and
#     sees its grant as the card (cuMemGetInfo, cuDeviceTotalMem), reached all three ways;
#  2. a "P0" process granted 40% of the card gets all of it while a "batch" process granted
#     30% pushes for the whole card;
#  3. NVML's per-process memory (nvidia-smi) against the shim's figure for the same process.
# Prints PASS/FAIL per check; exit 0 when all pass. Needs: cc, nvidia-smi, a built tree.
set -u
b=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
shim=$b/liboversub-cuda.so segtool=$b/tests/segtool
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
check() { if [ "$2" = "$3" ]; then echo "PASS $1"; else echo "FAIL $1: got '$3', want '$2'"; fails=$((fails + 1)); fi; }
[ -e "$shim" ] && [ -x "$segtool" ] || { echo "build first: make build"; exit 2; }
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: not a GPU machine"; exit 2; }
cc -O2 -DCLIENT_NO_LINK -I"$here/src/shim" "$here/tests/shim/cuda_client.c" -o "$tmp/client" -ldl -lpthread || exit 2
c=$tmp/client
total=$("$c" --via dlsym info | grep -o 'total_mib=[0-9]*' | cut -d= -f2)
echo "device 0: $total MiB"
[ -n "$total" ] || { echo "the driver did not answer"; exit 2; }

# 1. past the grant, three ways
g=$((total / 4))
for way in dlsym procaddr; do
    out=$(OVERSUB_VRAM_MIB=$g LD_PRELOAD=$shim "$c" --via $way info totalmem alloc:$((g / 2)) expect:0 alloc:$((g / 2 + 64)) expect:2 freeall 2>&1)
    check "$way: refused past the grant" 0 $?
    check "$way: cuMemGetInfo's total is the grant" "$g" "$(grep -o 'total_mib=[0-9]*' <<<"$out" | cut -d= -f2)"
    check "$way: cuDeviceTotalMem is the grant" "$g" "$(grep -o '^totalmem mib=[0-9]*' <<<"$out" | cut -d= -f2)"
done
# linked: a program that calls the exported names directly
cc -O2 -I"$here/src/shim" "$here/tests/shim/cuda_client.c" -o "$tmp/client_link" -ldl -lpthread -l:libcuda.so.1 2>/dev/null &&
    { OVERSUB_VRAM_MIB=$g LD_PRELOAD=$shim "$tmp/client_link" --via link alloc:$((g / 2)) expect:0 alloc:$((g / 2 + 64)) expect:2 >/dev/null 2>&1
      check "link: refused past the grant" 0 $?; }

# 2. the P0 neighbour keeps its memory
"$segtool" create "$tmp/p0.seg" 1 $((total * 4 / 10))
"$segtool" create "$tmp/batch.seg" 1 $((total * 3 / 10))
OVERSUB_SHIM_SEGMENT=$tmp/batch.seg LD_PRELOAD=$shim "$c" --via dlsym touch:$tmp/go fill:256 touch:$tmp/full wait:$tmp/done >"$tmp/batch.out" 2>/dev/null &
OVERSUB_SHIM_SEGMENT=$tmp/p0.seg LD_PRELOAD=$shim "$c" --via dlsym wait:$tmp/go fill:256 wait:$tmp/full >"$tmp/p0.out" 2>/dev/null
touch "$tmp/done"
wait
check "P0 got its whole grant while the batch pushed" $((total * 4 / 10 / 256)) "$(grep -o 'chunks=[0-9]*' "$tmp/p0.out" | cut -d= -f2)"
check "the batch stopped at its grant" $((total * 3 / 10 / 256)) "$(grep -o 'chunks=[0-9]*' "$tmp/batch.out" | cut -d= -f2)"

# 3. NVML's figure for a process against the shim's
"$segtool" create "$tmp/n.seg" 1 $((total / 2))
OVERSUB_SHIM_SEGMENT=$tmp/n.seg LD_PRELOAD=$shim "$c" --via dlsym alloc:4096 touch:$tmp/held hold >/dev/null 2>&1 &
p=$!
while [ ! -e "$tmp/held" ] && kill -0 $p 2>/dev/null; do sleep 0.1; done
sleep 1 # NVML's process list refreshes on its own
nvml=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p=$p '$1 == p {print $2}')
shim_mib=$("$segtool" show "$tmp/n.seg" | grep -o 'reserved_mib=[0-9]*' | cut -d= -f2)
echo "NVML: process $p uses ${nvml:-?} MiB; the shim counts $shim_mib MiB (NVML adds the CUDA context)"
ctx=$(( ${nvml:-0} - shim_mib ))
if [ -n "$nvml" ] && [ "$ctx" -ge 0 ] && [ "$ctx" -le 1024 ]; then echo "PASS NVML - shim = $ctx MiB (the context)"; else echo "FAIL NVML and the shim disagree by $ctx MiB"; fails=$((fails + 1)); fi
kill $p
echo "gpu-check-shim: $fails failed"
[ "$fails" -eq 0 ]
