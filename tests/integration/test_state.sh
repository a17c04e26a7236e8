#!/usr/bin/env bash
# test_state.sh - one discipline for state, through the real oversubd: a refused command
# changes nothing anywhere (the engine, the gateway's routes, the PIDs), what a service leaves
# is forgotten with it, a dry run answers what the submit does, a pool of 1,024 GPUs, and engine
# time that does not jump with the wall clock (libfaketime moves the wall clock a day on).
# Usage: test_state.sh PATH/TO/oversubd
set -u
bin=$(realpath "$1")
. "$(dirname "$0")/lib.sh"

start() { # dir, extra args... ; sets PORT and PID (env FAKE=1: under libfaketime)
    local dir=$1
    shift
    mkdir -p "$dir"
    rm -f "$dir/out" "$dir/err" # the last daemon's lines are not this one's
    (
        cd "$dir" || exit 1
        if [ "${FAKE:-0}" = 1 ]; then
            # (a sanitizer build wants its runtime first: libfaketime goes before it)
            export LD_PRELOAD=$FAKETIME_LIB FAKETIME_TIMESTAMP_FILE=$tmp/faketime \
                FAKETIME_NO_CACHE=1 FAKETIME_DONT_FAKE_MONOTONIC=1 \
                ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
        fi
        exec "$bin" --listen 127.0.0.1:0 --state "$dir/state.db" --socket "$dir/d.sock" \
            --ratio 1.5 --tick-ms 200 "$@" >"$dir/out" 2>"$dir/err"
    ) &
    PID=$!
    pids+=("$PID")
    PORT=""
    for _ in $(seq 1 1200); do
        PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$dir/out" 2>/dev/null | head -1 | sed 's/.*://')
        [ -n "$PORT" ] && break
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.05
    done
    [ -n "$PORT" ] || { bad "daemon did not start: $(cat "$dir/err")"; return 1; }
}
stop() { kill -TERM "$PID" && wait "$PID" 2>/dev/null; }
U() { echo "http://127.0.0.1:$PORT$1"; }
code() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }
post() { code -X POST "$(U "$1")" -d "$2"; }
put() { code -X PUT "$(U "$1")" -d "$2"; }

# ---- a refused submit changes no route --------------------------------------------------
start "$tmp/a" --gpus sim:2x81920 || exit 1
expect "chat" 201 "$(post /v1/services '{"id":"chat","class":"online","vram":"20GiB","backends":["http://127.0.0.1:9001"]}')"
expect "other spec, other backend" 409 "$(post /v1/services '{"id":"chat","class":"online","vram":"30GiB","backends":["http://127.0.0.1:9999"]}')"
expect "same spec, other backend" 409 "$(post /v1/services '{"id":"chat","class":"online","vram":"20GiB","backends":["http://127.0.0.1:9999"]}')"
expect "  says how to change backends" True "$(json '"backends" in d["error"]["message"]' <"$tmp/body")"
expect "dry run of other backends: the same 409" 409 "$(code -X POST "$(U '/v1/services?dry_run=1')" -d '{"id":"chat","class":"online","vram":"20GiB","backends":["http://127.0.0.1:9999"]}')"
expect "a retry without the gateway settings: 409 too" 409 "$(post /v1/services '{"id":"chat","class":"online","vram":"20GiB"}')"
expect "?dry_run=yes refused, not run" 400 "$(code -X POST "$(U '/v1/services?dry_run=yes')" -d '{"id":"dry1","class":"batch","vram":"1GiB"}')"
expect "?dryrun=1 refused, not run" 400 "$(code -X POST "$(U '/v1/services?dryrun=1')" -d '{"id":"dry1","class":"batch","vram":"1GiB"}')"
expect "  neither submitted" 404 "$(code "$(U /v1/services/dry1)")"
expect "same spec, same backend: a retry" 200 "$(post /v1/services '{"id":"chat","class":"online","vram":"20GiB","backends":["http://127.0.0.1:9001"]}')"
code "$(U /v1/services/chat)" >/dev/null
expect "chat keeps its backend" "['http://127.0.0.1:9001']" "$(json 'd["backends"]' <"$tmp/body")"
expect "unknown class with a backend" 422 "$(post /v1/services '{"id":"ghost","class":"gold","vram":"1GiB","backends":["http://127.0.0.1:9002"]}')"
expect "too big with a backend" 409 "$(post /v1/services '{"id":"ghost","class":"online","vram":"900GiB","backends":["http://127.0.0.1:9002"]}')"
expect "ghost submitted plainly" 201 "$(post /v1/services '{"id":"ghost","class":"online","vram":"1GiB"}')"
expect "ghost has no route of the refused ones" False "$(code "$(U /v1/services/ghost)" >/dev/null; json '"backends" in d' <"$tmp/body")"
# a refused ready keeps no PID
expect "ready for a queued-less unknown" 404 "$(post /v1/services/nobody/ready '{"pid":1}')"

# ---- released: forgotten by every module -----------------------------------------------
expect "old" 201 "$(post /v1/services '{"id":"old","class":"batch","vram":"10GiB","backends":["http://127.0.0.1:9003"],"max_inflight":3}')"
expect "old ready with a pid" 200 "$(post /v1/services/old/ready "{\"pid\":$$}")"
expect "old shows its pid" "$$" "$(code "$(U /v1/services/old)" >/dev/null; json 'd["pid"]' <"$tmp/body")"
expect "release old" 200 "$(code -X DELETE "$(U /v1/services/old)")"
expect "old again, plainly" 201 "$(post /v1/services '{"id":"old","class":"batch","vram":"10GiB"}')"
code "$(U /v1/services/old)" >/dev/null
expect "no inherited backends" False "$(json '"backends" in d or "max_inflight" in d' <"$tmp/body")"
expect "no inherited pid" False "$(json '"pid" in d' <"$tmp/body")"

# ---- a dry run answers what the submit does, GPUs included --------------------------------
expect "dry run" 200 "$(code -X POST "$(U '/v1/services?dry_run=1')" -d '{"id":"probe","class":"batch","vram":"40GiB"}')"
dry=$(json 'd["decision"]["outcome"], d["decision"].get("gpus")' <"$tmp/body")
expect "dry run changed nothing" 404 "$(code "$(U /v1/services/probe)")"
expect "real submit" 201 "$(post /v1/services '{"id":"probe","class":"batch","vram":"40GiB"}')"
expect "dry run = submit" "$dry" "$(json 'd["decision"]["outcome"], d["decision"].get("gpus")' <"$tmp/body")"
expect "  and the GPUs are there" True "$(json 'len(d["decision"]["gpus"]) == 1' <"$tmp/body")"

# ---- what survives a restart: routes and PIDs as accepted ---------------------------------
expect "chat ready with a pid" 200 "$(post /v1/services/chat/ready "{\"pid\":$$}")"
stop
start "$tmp/a" --gpus sim:2x81920 || exit 1
code "$(U /v1/services/chat)" >/dev/null
expect "restart: chat's backend" "['http://127.0.0.1:9001']" "$(json 'd["backends"]' <"$tmp/body")"
expect "restart: chat's pid" "$$" "$(json 'd["pid"]' <"$tmp/body")"
expect "restart: old has still no backends" False "$(code "$(U /v1/services/old)" >/dev/null; json '"backends" in d' <"$tmp/body")"
stop

# ---- one daemon per state; an outside reader never costs an acknowledged command ----------
start "$tmp/one" --gpus sim:2x81920 || exit 1
"$bin" --listen 127.0.0.1:0 --state "$tmp/one/state.db" --socket "" --gpus sim:2x81920 >/dev/null 2>"$tmp/one/second.err"
expect "a second oversubd on the same state: refused" 1 "$?"
expect "  saying another one runs" True "$(grep -q "another oversubd runs on this state" "$tmp/one/second.err" && echo True || echo False)"
expect "before" 201 "$(post /v1/services '{"id":"before","class":"batch","vram":"5GiB"}')"
sqlite3 "$tmp/one/state.db" "SELECT count(*) FROM log" >/dev/null
expect "the WAL is still there after an outside reader" True "$([ -e "$tmp/one/state.db-wal" ] && echo True || echo False)"
expect "after" 201 "$(post /v1/services '{"id":"after","class":"batch","vram":"5GiB"}')"
kill -9 "$PID"; wait "$PID" 2>/dev/null
start "$tmp/one" --gpus sim:2x81920 || exit 1
expect "kill -9: both acknowledged services back" "after before" "$(code "$(U /v1/services)" >/dev/null; json '" ".join(sorted(s["id"] for s in d["services"]))' <"$tmp/body")"
stop

# ---- a damaged saved route stops the start with a sentence, never a silent loss -------------
cp "$tmp/a/state.db" "$tmp/damaged.db"
sqlite3 "$tmp/damaged.db" "UPDATE meta SET value = '{\"chat\":{\"backends\":\"nope\"}}' WHERE key = 'gateway_routes'"
mkdir -p "$tmp/d"
cp "$tmp/damaged.db" "$tmp/d/state.db"
"$bin" --listen 127.0.0.1:0 --state "$tmp/d/state.db" --socket "$tmp/d/d.sock" >/dev/null 2>"$tmp/d/err"
expect "damaged route: refused" 1 "$?"
expect "  and says which" True "$(grep -q "route of chat" "$tmp/d/err" && echo True || echo False)"

# ---- a damaged state is refused with a sentence, never started with a silent loss ----------
start "$tmp/dm" --gpus sim:2x81920 || exit 1
post /v1/services '{"id":"r1","class":"batch","vram":"5GiB"}' >/dev/null
post /v1/services '{"id":"r2","class":"batch","vram":"5GiB"}' >/dev/null
post /v1/services '{"id":"r3","class":"batch","vram":"5GiB"}' >/dev/null
kill -9 "$PID"; wait "$PID" 2>/dev/null
sqlite3 "$tmp/dm/state.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
rm -f "$tmp/dm/state.db.lock"
damaged() { # name, SQL, what the refusal says
    mkdir -p "$tmp/dmg"
    rm -f "$tmp/dmg/"*
    cp "$tmp/dm/state.db" "$tmp/dmg/state.db"
    sqlite3 "$tmp/dmg/state.db" "$2"
    "$bin" --listen 127.0.0.1:0 --state "$tmp/dmg/state.db" --socket "" --gpus sim:2x81920 \
        >"$tmp/dmg/out" 2>"$tmp/dmg/err" &
    local p=$!
    local rc=0
    # the event either way: it exits (refused), or it says where it listens (it started)
    for _ in $(seq 1 1200); do
        kill -0 "$p" 2>/dev/null || break
        grep -q "listening on" "$tmp/dmg/out" 2>/dev/null && break
        sleep 0.05
    done
    if kill -0 "$p" 2>/dev/null; then
        kill -9 "$p"; wait "$p" 2>/dev/null
        bad "$1: started anyway"
        return
    fi
    wait "$p"; rc=$?
    expect "$1: refused" 1 "$rc"
    grep -q "$3" "$tmp/dmg/err" || bad "$1: says '$3': $(cat "$tmp/dmg/err")"
}
damaged "engine settings garbage" "UPDATE meta SET value = 'garbage' WHERE key = 'engine_config'" "engine settings are damaged"
damaged "base time garbage" "UPDATE meta SET value = '1796102395901xyz' WHERE key = 'base_unix_ms'" "base time is damaged"
damaged "pool row gone" "DELETE FROM meta WHERE key = 'pool'" "no pool recorded"
damaged "service key gone" "DELETE FROM meta WHERE key = 'service_key'" "no service key"
damaged "a log row gone" "DELETE FROM log WHERE seq = (SELECT min(seq) FROM log)" "the log misses commands"
damaged "a command that is not one" "UPDATE log SET cmd = '{\"op\":\"frob\"}' WHERE seq = (SELECT max(seq) FROM log)" "is not one"
# PIDs saved for a service the state does not know are forgotten: a new service inherits none
mkdir -p "$tmp/pid"
cp "$tmp/dm/state.db" "$tmp/pid/state.db"
sqlite3 "$tmp/pid/state.db" "INSERT OR REPLACE INTO meta (key, value) VALUES ('service_pids', '{\"zz\":5}')"
start "$tmp/pid" --gpus sim:2x81920 || exit 1
expect "zz" 201 "$(post /v1/services '{"id":"zz","class":"batch","vram":"1GiB"}')"
expect "  inherits no pid" False "$(json '"pid" in d' <"$tmp/body")"
stop

# ---- 1,024 GPUs ------------------------------------------------------------------------------
start "$tmp/big" --gpus sim:1024x81920 || exit 1
code "$(U /v1/pool)" >/dev/null
expect "1024 GPUs" 1024 "$(json 'd["gpus"]["count"] if isinstance(d["gpus"], dict) else len(d["gpus"])' <"$tmp/body")"
expect "a 64-GPU service" 201 "$(post /v1/services '{"id":"wide","class":"online","vram":"5000GiB","gpus":64}')"
expect "  on 64 GPUs" 64 "$(json 'len(d["placement"])' <"$tmp/body")"
stop
"$bin" --listen 127.0.0.1:0 --state "$tmp/huge.db" --socket "$tmp/huge.sock" --gpus sim:4097x81920 >/dev/null 2>"$tmp/huge.err"
expect "4097 GPUs refused (a bad flag: exit 2, nothing touched)" "2 no" "$? $([ -e "$tmp/huge.db" ] && echo yes || echo no)"
expect "  naming the limit" True "$(grep -q "at most 4096 GPUs" "$tmp/huge.err" && echo True || echo False)"

# ---- the wall clock jumps a day: no deadline fires -----------------------------------------
FAKETIME_LIB=$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -1)
if [ -z "$FAKETIME_LIB" ]; then
    bad "libfaketime is missing (scripts/install-deps.sh test installs faketime)"
else
    echo "+0" >"$tmp/faketime"
    FAKE=1 start "$tmp/clock" --gpus sim:1x81920 || exit 1
    expect "batch" 201 "$(post /v1/services '{"id":"bat","class":"batch","vram":"60GiB","min_vram":"20GiB"}')"
    expect "batch ready" 200 "$(post /v1/services/bat/ready '{}')"
    expect "batch usage" 200 "$(put /v1/services/bat/usage '{"vram_mib":50000}')"
    expect "online degrades it" 202 "$(post /v1/services '{"id":"web","class":"online","vram":"50GiB"}')"
    expect "bat degraded, ack pending" degraded "$(code "$(U /v1/services/bat)" >/dev/null; json 'd["state"]' <"$tmp/body")"
    dl=$(json 'd["deadline_unix_ms"]' <"$tmp/body")
    echo "+1d" >"$tmp/faketime"
    wall=$(FAKETIME_TIMESTAMP_FILE=$tmp/faketime FAKETIME_NO_CACHE=1 LD_PRELOAD=$FAKETIME_LIB date +%s)
    expect "the wall clock moved a day" True "$([ $((wall - $(date +%s))) -ge 86000 ] && echo True || echo False)"
    # a command now runs every timer due at its time first: none may be
    expect "a command after the jump" 200 "$(put /v1/services/bat/usage '{"vram_mib":50000}')"
    expect "bat still degraded (not escalated)" degraded "$(json 'd["state"]' <"$tmp/body")"
    expect "  with the same deadline" "$dl" "$(json 'd["deadline_unix_ms"]' <"$tmp/body")"
    expect "no escalation in the events" 0 "$(code "$(U '/v1/events?since=0')" >/dev/null; json 'sum(1 for e in d["events"] if e["kind"] in ("escalate", "evict"))' <"$tmp/body")"
    stop
fi

echo "test_state: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
