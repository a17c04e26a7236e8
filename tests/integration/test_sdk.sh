#!/usr/bin/env bash
# test_sdk.sh - the official OpenAI Node SDK (tests/sdk, installed by scripts/install-deps.sh)
# against the real oversubd's gateway and a backend on loopback.
# Usage: test_sdk.sh PATH/TO/oversubd
set -u
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
sdk=$here/../sdk
. "$here/lib.sh"
[ -d "$sdk/node_modules/openai" ] || { echo "test_sdk: the SDK is not installed (scripts/install-deps.sh test runs npm ci in tests/sdk)"; exit 1; }
python3 "$here/backend.py" >"$tmp/backend.out" 2>&1 &
pids+=($!)
BPORT=$(waitline "$tmp/backend.out" "port ") || { echo "backend did not start"; exit 1; }
B="http://127.0.0.1:$BPORT"
"$bin" --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --socket "" --state "$tmp/state.db" \
    --gpus sim:2x81920 --ratio 1.5 --tick-ms 100 >"$tmp/out" 2>"$tmp/err" &
pids+=($!)
PORT=$(waitline "$tmp/out" "listening on http://127.0.0.1:") || { echo "oversubd did not start: $(cat "$tmp/err")"; exit 1; }
GW=$(waitline "$tmp/out" "gateway on http://127.0.0.1:") || { echo "no gateway line"; exit 1; }
A="http://127.0.0.1:$PORT"
for s in "chat 64 100" "one 1 0"; do
    set -- $s
    curl -s -o /dev/null -X POST "$A/v1/services" -d "{\"id\":\"$1\",\"class\":\"online\",\"vram\":\"1GiB\",\"backends\":[\"$B\"],\"max_inflight\":$2,\"max_queue\":$3}"
    curl -s -o /dev/null -X POST "$A/v1/services/$1/ready"
done
node "$sdk/gateway.test.mjs" "http://127.0.0.1:$GW" "$A" "$B"
