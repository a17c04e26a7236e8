#!/usr/bin/env bash
# valgrind-wrap.sh - stands in for oversubd in an integration test (make test-valgrind): exec's
# memcheck on the real binary with the same arguments, so the test's PID is valgrind's (its
# SIGTERM and kill -9 reach the daemon) and a run that exits reports errors by exit code 99.
# A service's child between fork and exec is silent (it is not oversubd).
# A daemon killed with -9 never prints its summary: every error is logged as it happens,
# between VGERR-BEGIN and VGERR-END, to OSUB_VG_LOGDIR/vg.PID.log; make test-valgrind greps them.
# Env: OSUB_VG_BIN (the real oversubd, default build-valgrind/oversubd),
#      OSUB_VG_LOGDIR (default build-valgrind/vg).
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${OSUB_VG_BIN:-$root/build-valgrind/oversubd}
logdir=${OSUB_VG_LOGDIR:-$root/build-valgrind/vg}
mkdir -p "$logdir"
exec valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
    --errors-for-leak-kinds=definite --track-fds=no --error-markers=VGERR-BEGIN,VGERR-END \
    --num-callers=30 --child-silent-after-fork=yes --log-file="$logdir/vg.%p.log" "$bin" "$@"
