# lib.sh - what the integration tests share: a temporary folder, processes killed at exit,
# pass/fail counting. Source it after setting nothing; it sets tmp, pids, pass, fail.
tmp=$(mktemp -d)
pids=()
# every process the test started, then any other that still holds a file of its folder (a
# managed service a daemon left running): a test leaves nothing behind, and says so if it had to
leftovers() {
    local p pid
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [ "$pid" = $$ ] || [ "$pid" = "$BASHPID" ] && continue
        if ls -l "$p/fd" "$p/cwd" 2>/dev/null | grep -q -- "$tmp"; then
            echo "lib.sh: a process was left running: $pid $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | head -c 200)" >&2
            kill -9 "$pid" 2>/dev/null
        fi
    done
}
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    leftovers
    rm -rf "$tmp"
}
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
