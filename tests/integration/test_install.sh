#!/usr/bin/env bash
# test_install.sh - cmake --install into a staging root: every file in its FHS place, a program
# built against the installed engine through pkg-config, the installed oversubd finding the
# installed shim, and the systemd unit's ExecStart line run as systemd would (Type=notify: a
# stand-in for systemd's notify socket receives READY=1, RELOADING=1 then READY=1 on SIGHUP,
# STOPPING=1 on SIGTERM).
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -u
build=$(realpath "$1")
src=$(realpath "$2")
. "$(dirname "$0")/lib.sh"

root=$tmp/root
DESTDIR=$root cmake --install "$build" >"$tmp/install.log" 2>&1 || { bad "cmake --install: $(tail -5 "$tmp/install.log")"; }
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
P=$root$prefix
for f in sbin/oversubd bin/oversub lib/oversub/liboversub-cuda.so include/oversub/engine.h \
    share/man/man1/oversub.1 share/man/man5/oversub.yaml.5 share/man/man8/oversubd.8 \
    bin/oversub-scheduler share/man/man8/oversub-scheduler.8 \
    etc/oversub/oversub.yaml share/doc/oversub/oversub.yaml.example lib/systemd/system/oversubd.service \
    lib/sysusers.d/oversub.conf share/bash-completion/completions/oversub \
    share/oversub/alerts.yml share/oversub/oversub.json share/doc/oversub/operations.md; do
    [ -e "$P/$f" ] && ok || bad "installed: $prefix/$f"
done
lib=$(find "$P" -name liboversub.a | head -1)
pc=$(find "$P" -name oversub.pc | head -1)
[ -n "$lib" ] && ok || bad "installed: liboversub.a"
[ -n "$pc" ] && ok || bad "installed: oversub.pc"
[ -x "$P/sbin/oversubd" ] && ok || bad "oversubd is executable"
"$P/sbin/oversubd" --version | grep -q '^oversubd [0-9]' && ok || bad "the installed oversubd runs"
"$P/bin/oversub" --version | grep -q '^oversub [0-9]' && ok || bad "the installed oversub runs"
"$P/bin/oversub-scheduler" --version | grep -q "^oversub-scheduler [0-9]" && ok || bad "the installed oversub-scheduler runs"

# a program against the installed engine, found by pkg-config
cat >"$tmp/prog.c" <<'C'
#include <oversub/engine.h>
#include <stdio.h>
int main(void)
{
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    int64_t vram[2] = {81920, 81920};
    osub_engine_t *e = NULL;
    if (osub_engine_new(&cfg, vram, NULL, 2, NULL, 0, &e) != 0)
        return 1;
    printf("%zu GPUs\n", osub_engine_gpu_count(e));
    osub_engine_free(e);
    return 0;
}
C
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$root pkg-config --cflags --libs oversub 2>"$tmp/pc.err")
[ -n "$flags" ] && ok || bad "pkg-config oversub: $(cat "$tmp/pc.err")"
# a sanitizer build's library needs its runtime in the program too
san=""
nm "$lib" 2>/dev/null | grep -q __asan_ && san="-fsanitize=address,undefined"
if cc $san -o "$tmp/prog" "$tmp/prog.c" $flags -lm 2>"$tmp/cc.err"; then ok; else bad "a program builds against the installed engine: $(head -5 "$tmp/cc.err")"; fi
expect "and runs" "2 GPUs" "$("$tmp/prog" 2>&1)"

# the installed unit's ExecStart, run as systemd would, with a notify socket of our own
unit=$P/lib/systemd/system/oversubd.service
grep -q '^Type=notify$' "$unit" && ok || bad "the unit is Type=notify"
grep -q "^ExecStart=$prefix/sbin/oversubd " "$unit" && ok || bad "ExecStart names the installed oversubd: $(grep ^ExecStart "$unit")"
if command -v systemd-analyze >/dev/null 2>&1; then
    systemd-analyze verify "$unit" >"$tmp/verify" 2>&1 && ok || echo "NOTE: systemd-analyze verify: $(head -3 "$tmp/verify")"
fi
line=$(sed -n 's/^ExecStart=//p' "$unit")
# the same line, pointed at the staging root and a temporary state; a port of the OS's choosing
# and a simulated pool (test machines have neither free well-known ports nor GPUs)
line=${line//\/var\/lib\/oversub/$tmp/state}
line=${line//\/run\/oversub/$tmp/run}
line=${line//$prefix\/sbin\/oversubd/$P/sbin/oversubd}
line=${line//$prefix\/etc/$P/etc}
line="$line --listen 127.0.0.1:0 --gateway 127.0.0.1:0 --gpus sim:2x81920"
mkdir -p "$tmp/state" "$tmp/run"
python3 - "$tmp/notify.sock" >"$tmp/notify.log" 2>&1 <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print("bound", flush=True)
while True:
    msg = s.recv(4096).decode()
    print(msg.replace("\n", " | "), flush=True)
    if "STOPPING=1" in msg:
        break
PY
pids+=($!)
waitline "$tmp/notify.log" "bound" >/dev/null || grep -q bound "$tmp/notify.log" || bad "the notify stand-in started"
NOTIFY_SOCKET=$tmp/notify.sock $line >"$tmp/d.out" 2>"$tmp/d.err" &
D=$!
pids+=($D)
notified() { grep -q "$1" "$tmp/notify.log"; }
wait_for() { local t=$1; shift; for _ in $(seq 1 $((t * 20))); do "$@" && return 0; sleep 0.05; done; return 1; }
wait_for 20 notified "READY=1" && ok || bad "READY=1 from ExecStart: $(cat "$tmp/notify.log") $(tail -3 "$tmp/d.err")"
grep -q "MAINPID=$D" "$tmp/notify.log" && ok || bad "MAINPID is oversubd's: $(cat "$tmp/notify.log")"
[ -S "$tmp/run/oversub.sock" ] && ok || bad "the socket under the runtime folder"
[ -f "$tmp/state/oversub.db" ] && ok || bad "the state under the state folder"
kill -0 "$D" 2>/dev/null && grep -q "liboversub-cuda.so not found" "$tmp/d.err" && bad "the installed oversubd finds the installed shim" || ok
kill -HUP "$D" # ExecReload
wait_for 10 notified "RELOADING=1" && ok || bad "RELOADING=1 on SIGHUP"
wait_for 10 sh -c "grep -c 'READY=1' '$tmp/notify.log' | grep -q '^2$'" && ok || bad "READY=1 again after the reload: $(cat "$tmp/notify.log")"
kill -0 "$D" && ok || bad "SIGHUP does not stop oversubd"
kill -TERM "$D"
wait "$D"
expect "stops cleanly on SIGTERM" 0 "$?"
wait_for 10 notified "STOPPING=1" && ok || bad "STOPPING=1 on SIGTERM"

echo "install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
