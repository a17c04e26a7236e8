# lib.sh - what the integration tests share: a temporary folder, processes killed at exit,
# pass/fail counting. Source it after setting nothing; it sets tmp, pids, pass, fail.
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null && wait "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
expect() { if [ "$2" = "$3" ]; then ok; else bad "$1: got '$3', want '$2'"; fi; }
# curl as the API's clients call it: JSON declared (oversubd refuses changes without
# Content-Type: application/json, a browser form's CSRF), unless the test gives its own
curl() {
    local a
    for a in "$@"; do
        case "$a" in [Cc]ontent-[Tt]ype:*) command curl "$@"; return ;; esac
    done
    command curl -H 'Content-Type: application/json' "$@"
}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
waitline() { # file, pattern -> the number that follows the pattern there (a port), once it appears
    for _ in $(seq 1 1200); do
        l=$(grep -o "$2[0-9]*" "$1" 2>/dev/null | head -1)
        [ -n "$l" ] && { echo "${l##*[!0-9]}"; return 0; }
        sleep 0.05
    done
    return 1
}
