#!/usr/bin/env bash
# test_openapi.sh - GET /v1/openapi.json against the live oversubd that serves it: the
# description is a valid OpenAPI 3.0 document, and every documented operation is exercised with
# real requests whose statuses, content types and bodies must match it (openapi_check.py).
# Two daemons on loopback (port 0) in a temporary folder: A without a token (with its Unix
# socket, for a managed service) and B with --token-file (401s, a service's own token).
# Usage: test_openapi.sh PATH/TO/oversubd
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=$(realpath "$1")
. "$here/lib.sh"
# managed processes that the test started through daemon A: killed at exit too
trap 'while read -r p; do kill -9 "$p" 2>/dev/null; done <"$tmp/managed.pids" 2>/dev/null; cleanup' EXIT
: >"$tmp/managed.pids"

python3 -c 'import jsonschema' 2>/dev/null || {
    echo "FAIL: python3 has no jsonschema (scripts/install-deps.sh test: python3-jsonschema)"
    exit 1
}

start() { # name, extra args... -> sets port
    local n=$1
    shift
    mkdir -p "$tmp/$n"
    "$bin" --listen 127.0.0.1:0 --socket "$tmp/$n/s.sock" --state "$tmp/$n/st.db" \
        --gpus sim:4x81920 --tick-ms 100 "$@" >"$tmp/$n/out" 2>"$tmp/$n/err" &
    pids+=("$!")
    port=$(waitline "$tmp/$n/out" 'listening on http://127.0.0.1:') || {
        echo "FAIL: oversubd ($n) did not start: $(cat "$tmp/$n/err")"
        return 1
    }
}

# A: managed services allowed (as root too), no cgroup or CUDA shim to set up
printf 'allow_root_services: true\ncgroup: none\ncuda_shim: none\n' >"$tmp/a.yaml"
start a --config "$tmp/a.yaml" || exit 1
port_a=$port
# B: an admin token
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/token"
chmod 600 "$tmp/token"
start b --token-file "$tmp/token" || exit 1
port_b=$port
# the socket is bound just before the line is printed; wait for it to be there all the same
for _ in $(seq 1 1200); do [ -S "$tmp/a/s.sock" ] && break; sleep 0.05; done

python3 "$here/openapi_check.py" --a "http://127.0.0.1:$port_a" --a-socket "$tmp/a/s.sock" \
    --b "http://127.0.0.1:$port_b" --b-token "$(cat "$tmp/token")" \
    --source "$here/../../src/daemon/web/openapi.json" --pids "$tmp/managed.pids"
rc=$?
# the daemons are still up and their logs say nothing went wrong
i=0
for n in a b; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then ok; else
        bad "oversubd ($n) died: $(tail -5 "$tmp/$n/err")"
    fi
    i=$((i + 1))
done
if [ $rc -ne 0 ]; then
    bad "openapi_check.py failed (exit $rc)"
fi
echo "test_openapi: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
