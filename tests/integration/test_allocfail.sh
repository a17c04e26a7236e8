#!/usr/bin/env bash
# test_allocfail.sh - the real oversubd with tests/fakes/fail_malloc.c preloaded: first with no
# failures (services submitted), then with allocations failing (1 in 20 by default) while
# clients drive every kind of API request, then with none again. Asserts: no crash (a signal
# is a failure; an exit with a status and a message is reported), every answer an HTTP status
# (5xx allowed; dropped connections counted and reported, a hung request is a failure), every
# 2xx JSON answer's body parses (error answers without their JSON body are reported), after
# the failures stop /healthz is ok and a submit is acknowledged, and after kill -9 and a restart
# without the preload every acknowledged service is there, and the restart shows the services
# the daemon showed before it (what it served was durable).
# Usage: test_allocfail.sh PATH/TO/oversubd PATH/TO/libfail_malloc.so
# Settings (environment): ALLOCFAIL_REQUESTS (400, all clients together), ALLOCFAIL_CLIENTS (2),
# ALLOCFAIL_PERMILLE (50), ALLOCFAIL_SEED (1), ALLOCFAIL_MODE (a control line instead, e.g.
# "every 13"), ALLOCFAIL_LOG=1 (every failed allocation's backtrace to a log, shown with a crash),
# ALLOCFAIL_KEEP=DIR (copy the temporary folder there at the end), ALLOCFAIL_SPARE (functions
# whose allocations never fail, FAIL_MALLOC_SPARE; by default libevent 2.1.12's functions whose
# own handling of a failure crashes (evhttp_request_new -> evhttp_request_free ->
# evhttp_clear_headers(NULL); evhttp_connection_base_bufferevent_new -> evhttp_connection_free ->
# event_callback_cancel_) or sends an answer without its status line (evhttp_send_reply and
# evhttp_send_page_ -> evhttp_make_header ignores a failed evbuffer_add_printf): they would hide
# what this test is for, oversubd's own handling; ALLOCFAIL_SPARE= spares nothing).
# Skipped (77) for a sanitizer build: ASan/TSan own malloc and refuse a preloaded one.
set -u
bin=$(realpath "$1")
lib=$(realpath "$2")
here=$(dirname "$(realpath "$0")")
. "$here/lib.sh"
keep() { [ -n "${ALLOCFAIL_KEEP:-}" ] && mkdir -p "$ALLOCFAIL_KEEP" && cp -r "$tmp"/. "$ALLOCFAIL_KEEP"/; }
trap 'keep; cleanup' EXIT

if ldd "$bin" 2>/dev/null | grep -Eq 'lib(asan|tsan|ubsan)'; then
    echo "SKIP: $bin is a sanitizer build; fail_malloc needs a plain one (build/oversubd)"
    exit 77
fi

REQUESTS=${ALLOCFAIL_REQUESTS:-400}
CLIENTS=${ALLOCFAIL_CLIENTS:-2}
PERMILLE=${ALLOCFAIL_PERMILLE:-50}
SEED=${ALLOCFAIL_SEED:-1}
MODE=${ALLOCFAIL_MODE:-"0 $PERMILLE $SEED"}
SPARE=${ALLOCFAIL_SPARE-evhttp_request_new,evhttp_connection_base_bufferevent_new,evhttp_send_reply,evhttp_send_reply_start,evhttp_send_reply_end,evhttp_send_page_}
ROUND=25 # requests per client between two checks that the daemon is alive
MAX_RESTARTS=${ALLOCFAIL_MAX_RESTARTS:-60}
ctl=$tmp/fm.ctl
flog=$tmp/failures.log
dir=$tmp/d
mkdir -p "$dir"
echo "allocfail: mode '$MODE', $REQUESTS requests from $CLIENTS clients, spared: ${SPARE:-nothing}"

# the control line, renamed into place. "off" with a preloaded daemon running (what follows
# asserts on a daemon without failures) waits for two of its allocator's looks (PATH.stats is
# rewritten at each, fail_malloc.c): the first may have begun before the rename, the second began
# after the first ended, so it read the line. Failures that start need no wait (the clients'
# requests make the allocations that read the line, and nothing counts when they begin: an idle
# wait would only let the ticks fail first), and a daemon started later reads the line at its
# first allocation.
setctl() {
    printf '%s\n' "$1" >"$ctl.new" && mv "$ctl.new" "$ctl"
    [ "$1" = off ] && [ -n "${PID:-}" ] && kill -0 "$PID" 2>/dev/null || return 0
    local look
    for look in 1 2; do
        rm -f "$ctl.stats"
        for _ in $(seq 1 1000); do
            [ -e "$ctl.stats" ] && break
            kill -0 "$PID" 2>/dev/null || return 0 # gone: its restart reads the line
            sleep 0.01
        done
        [ -e "$ctl.stats" ] || { bad "oversubd's allocator did not read its control line '$1' in 10 s"; return 1; }
    done
}
setctl off

nstart=0
# the daemon runs under a watcher subshell that writes its exit status to status.N (so that
# its death by a signal is told here, not by bash's job messages); PID is the daemon's own
start() { # preload (1/0); sets PORT, PID, ERR, STATUS
    nstart=$((nstart + 1))
    ERR=$dir/err.$nstart
    STATUS=$dir/status.$nstart
    local out=$dir/out.$nstart pidf=$dir/pid.$nstart
    (
        cd "$dir" || exit 1
        ulimit -c unlimited 2>/dev/null
        if [ "$1" = 1 ]; then
            export LD_PRELOAD=$lib FAIL_MALLOC_CTL=$ctl FAIL_MALLOC_SPARE=$SPARE
            [ "${ALLOCFAIL_LOG:-0}" = 1 ] && export FAIL_MALLOC_LOG=$flog
        fi
        "$bin" --listen 127.0.0.1:0 --state "$dir/state.db" --socket "$dir/d.sock" \
            --gpus sim:8x81920 --ratio 1.5 --tick-ms 200 >"$out" 2>"$ERR" &
        echo $! >"$pidf"
        wait $!
        echo $? >"$STATUS"
    ) 2>/dev/null &
    pids+=($!)
    for _ in $(seq 1 1000); do [ -s "$pidf" ] && break; sleep 0.01; done
    PID=$(cat "$pidf")
    pids+=("$PID")
    PORT=$(waitline "$out" 'http://127.0.0.1:') || {
        bad "daemon did not start (start $nstart, preload $1): $(tail -5 "$ERR")"
        return 1
    }
}

# waits for the daemon to be gone; its exit status (128+N: killed by signal N)
reap() {
    for _ in $(seq 1 500); do [ -s "$STATUS" ] && break; sleep 0.02; done
    cat "$STATUS" 2>/dev/null || echo unknown
}

crashes=0
exits=0
# FAIL_MALLOC_LOG's lines: oversubd(+0xOFFSET) as function at file:line
symbolize() {
    local line a
    while IFS= read -r line; do
        case $line in
        *"$(basename "$bin")(+0x"*)
            a=${line##*(+0x}
            a=${a%%)*}
            echo "  $(addr2line -f -i -p -e "$bin" "$(printf '0x%x' $((0x$a - 1)))" 2>/dev/null | sed "s|$(dirname "$(dirname "$here")")/||g" | tr '\n' ' ')"
            ;;
        *) echo "$line" ;;
        esac
    done
}

# the daemon is gone: how it went (a signal is a failure), with its stderr and a backtrace
gone() {
    local st
    st=$(reap)
    cat "$ctl.stats" >>"$tmp/stats" 2>/dev/null
    if [ "$st" = unknown ]; then
        bad "oversubd is gone and its exit status is unknown: $(tail -3 "$ERR" | tr '\n' ' ')"
    elif [ "$st" -gt 128 ]; then
        crashes=$((crashes + 1))
        bad "oversubd killed by signal $((st - 128)) ($(kill -l $((st - 128)) 2>/dev/null)) under allocation failures"
        echo "--- stderr tail (start $nstart):"
        tail -15 "$ERR"
        local core
        core=$(ls -t "$dir"/core* 2>/dev/null | head -1)
        if [ -n "$core" ] && command -v gdb >/dev/null; then
            echo "--- backtrace ($core):"
            gdb -q -batch -ex 'bt 40' -ex 'info threads' "$bin" "$core" 2>/dev/null |
                grep -E '^#|^\*|^  [0-9]' | sed "s|$(dirname "$(dirname "$here")")/||g" | head -60 | tee "$tmp/bt"
            # the crash site: the innermost function, and the innermost frame in oversubd's sources
            local f0 fs
            f0=$(grep -m1 '^#0' "$tmp/bt" | sed -E 's/^#0 +(0x[0-9a-f]+ in )?([^ ]+).*/\2/')
            fs=$(grep -m1 -E ' at src/' "$tmp/bt" | sed -E 's/^#[0-9]+ +(0x[0-9a-f]+ in )?([^ ]+) .* at (src\/[^ ]+).*/\2 at \3/')
            echo "$f0 <- $fs" >>"$tmp/sites"
            mv "$core" "$core.seen.$nstart"
        elif [ -n "$core" ]; then
            echo "--- core file $core (gdb is not installed)"
        fi
        if [ -s "$flog" ]; then
            echo "--- the latest failed allocations (FAIL_MALLOC_LOG; oversubd's frames as file:line):"
            awk '/^fail #/ {n++} {print n "\t" $0}' "$flog" | awk -F'\t' -v last="$(grep -c '^fail #' "$flog")" '$1 > last - 3 {print $2}' |
                symbolize | head -60
            : >"$flog"
        fi
    else
        exits=$((exits + 1))
        echo "NOTE: oversubd exited with status $st under allocation failures: $(tail -3 "$ERR" | tr '\n' ' ')"
        [ -s "$ERR" ] || bad "oversubd exited with status $st and no message"
    fi
}

# one request; appends "kind code curl-rc id type" to the client's log (type: the answer's
# Content-Type, json or html: oversubd answers JSON, libevent's own errors are HTML); RC is
# curl's status. An answer without a status line (HTTP/0.9 to curl) is kept in weird.*
req() { # log, kind, id, curl args...
    local log=$1 kind=$2 id=$3
    shift 3
    local c t body=$tmp/body.$BASHPID
    c=$(curl -s --http0.9 -o "$body" -w '%{http_code} %{content_type}' --max-time 10 "$@")
    RC=$?
    read -r c t <<<"$c"
    case $t in *json*) t=json ;; *html*) t=html ;; '') t=none ;; *) t=other ;; esac
    [ "${c:-000}" = 000 ] && [ "$RC" = 0 ] && cp "$body" "$tmp/weird.$kind.$BASHPID.$RANDOM"
    # a JSON answer's body, on one line, to be parsed at the end
    [ "$t" = json ] && [ "$RC" = 0 ] && printf '%s %s\t%s\n' "$kind" "$c" "$(tr '\n' ' ' <"$body")" >>"$tmp/bodies.${log##*.}"
    echo "$kind ${c:-000} $RC $id $t" >>"$log"
}

# a client's round of requests, logged to round.N; it stops early when the daemon refuses
# connections (it is gone: the round's end restarts it)
client() { # number, round, count
    local c=$1 r=$2 n=$3 log=$tmp/round.$1 U="http://127.0.0.1:$PORT"
    local ids=() i k id pick
    : >"$log"
    [ -s "$tmp/ids.$c" ] && mapfile -t ids <"$tmp/ids.$c"
    RANDOM=$((SEED * 7919 + c * 131 + r))
    RC=0
    for i in $(seq 1 "$n"); do
        [ "$RC" = 7 ] && break
        pick=""
        [ "${#ids[@]}" -gt 0 ] && pick=${ids[RANDOM % ${#ids[@]}]}
        k=$((RANDOM % 24))
        [ -z "$pick" ] && k=0
        case $k in
        0 | 1 | 2 | 3)
            id="c$c-r$r-n$i"
            local cls=(online batch experiment) v=$((100 + RANDOM % 4000)) q=""
            [ $((RANDOM % 8)) = 0 ] && v=$((20000 + RANDOM % 30000))
            local cl=${cls[RANDOM % 3]}
            [ "$cl" != online ] && q=",\"queue\":true,\"min_vram_mib\":$((v / 2))"
            local body="{\"id\":\"$id\",\"class\":\"$cl\",\"vram_mib\":$v$q}"
            req "$log" submit "$id" -X POST "$U/v1/services" -d "$body"
            echo "$body" >"$tmp/spec.$id"
            ids+=("$id")
            ;;
        4) req "$log" resubmit "$pick" -X POST "$U/v1/services" --data-binary @"$tmp/spec.$pick" ;;
        5) req "$log" list - "$U/v1/services" ;;
        6) req "$log" get "$pick" "$U/v1/services/$pick" ;;
        7) req "$log" pool - "$U/v1/pool" ;;
        8)
            req "$log" delete "$pick" -X DELETE "$U/v1/services/$pick"
            local keep=()
            for id in "${ids[@]}"; do [ "$id" != "$pick" ] && keep+=("$id"); done
            ids=("${keep[@]}")
            ;;
        9) req "$log" ratio - -X PUT "$U/v1/pool" -d "{\"ratio\":\"1.$((3 + RANDOM % 4))\"}" ;;
        10) req "$log" metrics - "$U/metrics" ;;
        11) req "$log" metrics - "$U/metrics?per_service=1" ;;
        12) req "$log" events - "$U/v1/events?since=$((RANDOM % 50))" ;;
        13) req "$log" usage "$pick" -X PUT "$U/v1/services/$pick/usage" -d "{\"vram_mib\":$((RANDOM % 3000))}" ;;
        14) req "$log" usage "$pick" -X PUT "$U/v1/services/$pick/usage" -d "{\"gpus\":[{\"gpu\":0,\"vram_mib\":$((RANDOM % 2000))}],\"compute_pct\":40}" ;;
        15) req "$log" ready "$pick" -X POST "$U/v1/services/$pick/ready" ;;
        16) req "$log" ack "$pick" -X POST "$U/v1/services/$pick/ack" -d '{"checkpoint":"step-1"}' ;;
        17) req "$log" badjson - -X POST "$U/v1/services" -d '{"id": "x", "vram_mib": ' ;;
        18) req "$log" badfield - -X POST "$U/v1/services" -d '{"id":"x","vram_mib":5,"colour":"red"}' ;;
        19) req "$log" dryrun - -X POST "$U/v1/services?dry_run=1" -d '{"id":"probe","class":"online","vram":"40GiB"}' ;;
        20) req "$log" resize "$pick" -X PATCH "$U/v1/services/$pick" -d "{\"vram_mib\":$((200 + RANDOM % 3000))}" ;;
        21)
            local op=(cordon uncordon uncordon drain)
            req "$log" gpu - -X POST "$U/v1/gpus/$((RANDOM % 8))/${op[RANDOM % 4]}"
            ;;
        22) req "$log" socket - --unix-socket "$dir/d.sock" "http://x/v1/pool" ;;
        23)
            case $((RANDOM % 4)) in
            0) req "$log" directives "$pick" "$U/v1/services/$pick/directives?wait=0" ;;
            1) req "$log" backends "$pick" -X PUT "$U/v1/services/$pick/backends" -d '{"backends":["http://127.0.0.1:9"]}' ;;
            2) req "$log" healthz - "$U/healthz" ;;
            3) req "$log" notfound - "$U/v2/things" ;;
            esac
            ;;
        esac
    done
    printf '%s\n' "${ids[@]}" >"$tmp/ids.$c"
}

# the round's answers into log.N, each marked with whether the daemon went away in the round
endround() { # gone-flag (alive/gone)
    local c
    for c in $(seq 1 "$CLIENTS"); do
        awk -v f="$1" '{print $0, f}' "$tmp/round.$c" >>"$tmp/log.$c"
    done
}

# ---- no failures: start, some services ----
start 1 || exit 1
expect "healthz before" 200 "$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$PORT/healthz")"
for c in $(seq 1 "$CLIENTS"); do client "$c" 0 10; done
endround alive
warm=$(cat "$tmp"/log.* | awk '$1 == "submit" && ($2 == 201 || $2 == 202)' | wc -l)
warmsub=$(cat "$tmp"/log.* | awk '$1 == "submit"' | wc -l)
expect "every submit without failures acknowledged" "$warmsub" "$warm"

# ---- allocations failing: every kind of request, the daemon watched between rounds ----
setctl "$MODE"
r=1
done_=0
restarts=0
while [ "$done_" -lt "$REQUESTS" ]; do
    n=$(((REQUESTS - done_ + CLIENTS - 1) / CLIENTS))
    [ "$n" -gt "$ROUND" ] && n=$ROUND
    cp=()
    for c in $(seq 1 "$CLIENTS"); do
        client "$c" "$r" "$n" &
        cp+=($!)
    done
    wait "${cp[@]}"
    done_=$((done_ + $(cat "$tmp"/round.* | awk '$3 != 7' | wc -l)))
    r=$((r + 1))
    if kill -0 "$PID" 2>/dev/null; then
        endround alive
    else
        endround gone
        echo "round $((r - 1)): the daemon is gone; the clients' last requests:"
        for c in $(seq 1 "$CLIENTS"); do grep -v ' 7 [^ ]*$' "$tmp/round.$c" | tail -2; done
        gone
        restarts=$((restarts + 1))
        [ "$restarts" -gt "$MAX_RESTARTS" ] && { echo "NOTE: more than $MAX_RESTARTS restarts: the failure phase ends early"; break; }
        setctl off
        start 1 || exit 1
        setctl "$MODE"
    fi
done
cat "$ctl.stats" >>"$tmp/stats" 2>/dev/null
setctl off
stats=$(awk '{c += $2; f += $4; s += $6} END {printf "%d allocations, %d failed, %d spared", c, f, s}' "$tmp/stats")

# ---- failures off: alive, healthy, still taking mutations ----
if ! kill -0 "$PID" 2>/dev/null; then
    gone
    start 1 || exit 1
fi
hz=""
for _ in $(seq 1 30); do
    hz=$(curl -s --max-time 10 -w ' %{http_code}' "http://127.0.0.1:$PORT/healthz")
    case $hz in *' 200') break ;; esac
    sleep 0.1
done
case $hz in
*'"ok"'*' 200') ok ;;
*) bad "healthz after the failures stopped: '$hz'" ;;
esac
req "$tmp/log.after" submit after-1 -X POST "http://127.0.0.1:$PORT/v1/services" -d '{"id":"after-1","class":"batch","vram_mib":100,"queue":true}'
read -r _ acode arc _ <"$tmp/log.after"
case $acode in 201 | 202) ok ;; *) bad "a submit after the failures stopped: HTTP $acode (curl $arc)" ;; esac
expect "a GET after the failures stopped" 200 "$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$PORT/v1/services/after-1")"

# ---- what was answered ----
cat "$tmp"/log.[0-9]* >"$tmp/all"
total=$(wc -l <"$tmp/all")
echo "answers: $(awk '{print $2}' "$tmp/all" | sort | uniq -c | awk '{printf "%s x%s  ", $2, $1}')"
# "kind code curl-rc id type round-flag": curl 7 refused (the daemon was gone), 28 no answer in
# 10 s, 52/56 closed without an answer, 55 closed while the request was still being sent, 18 an
# answer cut short; a code of 000 otherwise is not HTTP
hung=$(awk '$3 == 28' "$tmp/all" | wc -l)
dropped=$(awk '($3 == 52 || $3 == 55 || $3 == 56 || $3 == 18) && $6 == "alive"' "$tmp/all" | wc -l)
cut=$(awk '($3 == 52 || $3 == 55 || $3 == 56 || $3 == 18) && $6 == "gone"' "$tmp/all" | wc -l)
refused=$(awk '$3 == 7' "$tmp/all" | wc -l)
other=$(awk '$2 == "000" && $3 != 7 && $3 != 28 && $3 != 52 && $3 != 55 && $3 != 56 && $3 != 18' "$tmp/all" | wc -l)
echo "requests: $total; dropped connections: $dropped (daemon alive) + $cut (daemon exiting); refused (daemon gone): $refused; timed out: $hung; crashes: $crashes; clean exits: $exits; restarts: $restarts; allocator: ${stats:-no stats}"
[ "$dropped" -gt 0 ] && echo "NOTE: $dropped connections closed without an answer by a daemon that lived on: $(awk '($3 == 52 || $3 == 55 || $3 == 56 || $3 == 18) && $6 == "alive" {print $1}' "$tmp/all" | sort | uniq -c | tr '\n' ' ')"
[ "$hung" -eq 0 ] && ok || bad "$hung requests got no answer in 10 s: $(awk '$3 == 28 {print $1}' "$tmp/all" | sort | uniq -c | tr '\n' ' ')"
[ "$other" -eq 0 ] && ok || bad "$other answers were not HTTP: $(awk '$2 == "000" && $3 != 7 && $3 != 28 && $3 != 52 && $3 != 55 && $3 != 56 && $3 != 18' "$tmp/all" | head -5 | tr '\n' ';')"
for w in $(ls "$tmp"/weird.* 2>/dev/null | head -3); do echo "--- an answer without a status line ($w): $(head -c 300 "$w" | tr -c '[:print:]' '.')"; done
w400=$(awk '$2 == 400 && $5 == "json" && $1 != "badjson" && $1 != "badfield"' "$tmp/all")
[ -n "$w400" ] && echo "NOTE: $(echo "$w400" | wc -l) well-formed requests answered 400 by oversubd (an allocation failure reported as the client's error?): $(echo "$w400" | awk '{print $1}' | sort | uniq -c | tr '\n' ' ')"
# every JSON answer parses: a 2xx with an empty or damaged body is a failure (worse than a 500),
# an error status without its JSON body is reported
cat "$tmp"/bodies.* >"$tmp/bodies" 2>/dev/null
python3 - "$tmp/bodies" >"$tmp/badbodies" <<'PY'
import json, sys
for line in open(sys.argv[1], errors="replace"):
    what, _, body = line.rstrip("\n").partition("\t")
    try:
        json.loads(body)
    except ValueError as e:
        print("%s\t%s: %s" % (what, e, body[:160] if body.strip() else "(empty body)"))
PY
nbodies=$(wc -l <"$tmp/bodies")
bad2=$(awk -F'\t' '$1 ~ / 2[0-9][0-9]$/' "$tmp/badbodies")
[ -z "$bad2" ] && ok || bad "$(echo "$bad2" | wc -l) of $nbodies JSON answers are a 2xx whose body does not parse: $(echo "$bad2" | awk -F'\t' '{print $1}' | sort | uniq -c | tr '\n' ' ')e.g. $(echo "$bad2" | head -2 | tr '\t\n' ' ;')"
badx=$(awk -F'\t' '$1 !~ / 2[0-9][0-9]$/' "$tmp/badbodies")
[ -n "$badx" ] && echo "NOTE: $(echo "$badx" | wc -l) error answers whose JSON body does not parse: $(echo "$badx" | awk -F'\t' '{print $1}' | sort | uniq -c | tr '\n' ' ')"
h400=$(awk '$2 == 400 && $5 != "json"' "$tmp/all" | wc -l)
[ "$h400" -gt 0 ] && echo "NOTE: $h400 answers 400 by libevent's parser (not JSON: an allocation failed reading the request)"
[ -s "$tmp/sites" ] && echo "crash sites: $(sort "$tmp/sites" | uniq -c | sed 's/^ *//' | tr '\n' ';')"
echo "5xx: $(awk '$2 >= 500 {print $1 "=" $2}' "$tmp/all" | sort | uniq -c | tr '\n' ' ')"

# ---- kill -9, restart without the preload: what was acknowledged is there ----
curl -s --max-time 10 "http://127.0.0.1:$PORT/v1/services" | json '"\n".join(s["id"] for s in d["services"])' | sort >"$tmp/shown"
kill -9 "$PID"
reap >/dev/null
start 0 || exit 1
curl -s --max-time 10 "http://127.0.0.1:$PORT/v1/services" | json '"\n".join(s["id"] for s in d["services"])' | sort >"$tmp/present"
cat "$tmp"/log.* | awk '$1 == "submit" || $1 == "resubmit"' | awk '$2 == 200 || $2 == 201 || $2 == 202 {print $4}' | sort -u >"$tmp/acked"
# a DELETE answered 200, 5xx (the answer failed: the outcome is unknown) or not answered at
# all may have removed it
cat "$tmp"/log.* | awk '$1 == "delete" && ($2 == 200 || $2 == "000" || $2 >= 500) {print $4}' | sort -u >"$tmp/deleted"
comm -23 "$tmp/acked" "$tmp/deleted" >"$tmp/must"
missing=$(comm -23 "$tmp/must" "$tmp/present")
expect "acknowledged services after kill -9 and a restart ($(wc -l <"$tmp/must") expected)" "" "$(echo $missing)"
expect "the restart shows what the daemon showed before kill -9" "" "$(diff "$tmp/shown" "$tmp/present" | grep '^[<>]' | tr '\n' ' ')"
d5=$(cat "$tmp"/log.* | awk '$1 == "delete" && $2 >= 500 {print $4}' | sort -u | comm -12 - "$tmp/must" | comm -23 - "$tmp/present")
[ -n "$d5" ] && echo "NOTE: DELETEs answered 5xx that were applied nonetheless: $(echo $d5)"
s5=$(cat "$tmp"/log.* | awk '$1 == "submit" && $2 >= 500 {print $4}' | sort -u | comm -12 - "$tmp/present")
[ -n "$s5" ] && echo "NOTE: submits answered 5xx that were applied nonetheless: $(echo $s5)"
hz=$(curl -s --max-time 10 "http://127.0.0.1:$PORT/healthz")
expect "invariants after the restart" ok "$(echo "$hz" | json 'd["invariants"]' 2>/dev/null)"
kill -TERM "$PID"
reap >/dev/null

echo "allocfail: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
