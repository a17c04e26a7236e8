"""``python3 -m oversub``: a few things from a shell.

    python3 -m oversub env                      what Service.from_env() sees here
    python3 -m oversub submit SPEC [--dry-run]  submit a spec (JSON, or YAML with PyYAML)
    python3 -m oversub watch ID                 print a service's directives as they come
    python3 -m oversub exec [--health URL] -- PROGRAM ARG...
                                                run a server that does not speak oversub
                                                (vLLM, SGLang) and report it ready, with its
                                                PID, once URL answers 200

``--url`` (default: $OVERSUB_CONTROL_URL, else unix:$OVERSUB_SOCKET, else
http://127.0.0.1:7070) and ``--token`` (default: $OVERSUB_TOKEN) pick the daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

from . import Client, OversubError, Service, __version__
from ._core import DEFAULT_URL, ENVIRONMENT


def load_spec(path: str) -> Dict[str, Any]:
    """A service spec from a file: JSON, or YAML (needs PyYAML) for .yaml/.yml."""
    with (sys.stdin if path == "-" else open(path, encoding="utf-8")) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore  # noqa: PLC0415
        except ImportError:
            raise SystemExit("oversub: reading YAML needs PyYAML (python3-yaml); or give JSON")
        spec = yaml.safe_load(text)
    else:
        spec = json.loads(text)
    if not isinstance(spec, dict):
        raise SystemExit(f"oversub: {path}: a spec is a mapping of the API's fields")
    return spec


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - the operator's URL
            return 200 <= int(r.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run_exec(args: argparse.Namespace) -> int:
    """Runs the program as a child in this process group (oversubd's SIGTERM and SIGKILL go to
    the group and the service's cgroup, so they reach it directly; this wrapper waits for it
    rather than passing signals on, which would deliver each twice), reports ready with the
    child's PID once --health answers 2xx, logs the directives it is sent, and exits with the
    child's status."""
    argv = list(args.program)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise SystemExit("oversub exec: no program given (exec [--health URL] -- PROGRAM ARG...)")
    try:
        svc: Optional[Service] = Service.from_env()
    except OversubError:
        svc = None
    child = subprocess.Popen(argv)
    # caught, not ignored: the child (already started) keeps the default dispositions
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, lambda signum, frame: None)

    def watch_health() -> None:
        if svc is None:
            return
        end = time.monotonic() + args.health_timeout
        while child.poll() is None:
            if args.health is None or _healthy(args.health):
                try:
                    svc.ready(pid=child.pid)
                    print(f"oversub exec: {svc.id} is ready (process {child.pid})",
                          file=sys.stderr, flush=True)
                except OversubError as e:
                    print(f"oversub exec: ready not reported: {e}", file=sys.stderr, flush=True)
                break
            if time.monotonic() > end:
                print(f"oversub exec: {args.health} not healthy after {args.health_timeout} s; "
                      "oversubd counts it ready after its restart_cost_ms", file=sys.stderr,
                      flush=True)
                break
            time.sleep(0.5)
        # what the program cannot hear, said in its log (evictions reach it as SIGTERM)
        try:
            for d in svc.directives(stop_on_evict=False):
                print(f"oversub exec: directive {d.kind} for {svc.id}: {d.message}",
                      file=sys.stderr, flush=True)
        except OversubError as e:
            print(f"oversub exec: directives: {e}", file=sys.stderr, flush=True)

    threading.Thread(target=watch_health, daemon=True).start()
    while True:
        try:
            rc = child.wait()
            break
        except InterruptedError:
            continue
    if svc is not None:
        svc.stop()
    return rc if rc >= 0 else 128 - rc


def _url(args: argparse.Namespace) -> str:
    if args.url:
        return str(args.url)
    sock = os.environ.get("OVERSUB_SOCKET")
    return os.environ.get("OVERSUB_CONTROL_URL") or (f"unix:{sock}" if sock else DEFAULT_URL)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m oversub", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="the daemon: http://HOST:PORT or unix:PATH")
    p.add_argument("--token", default=os.environ.get("OVERSUB_TOKEN"),
                   help="a token (the admin's, or the service's own)")
    p.add_argument("--version", action="version", version=f"oversub-python {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env", help="what Service.from_env() reads here")
    s = sub.add_parser("submit", help="submit a service spec (JSON or YAML)")
    s.add_argument("spec", help="a file, or - for stdin")
    s.add_argument("--dry-run", action="store_true", help="what would happen; nothing changes")
    w = sub.add_parser("watch", help="print a service's directives as they come")
    w.add_argument("id")
    x = sub.add_parser("exec", help="run a server that does not speak oversub; report it ready")
    x.add_argument("--health", help="report ready once this URL answers 2xx (default: at once)")
    x.add_argument("--health-timeout", type=float, default=3600.0,
                   help="give up waiting for --health after this many seconds")
    x.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARG...")
    args = p.parse_args(argv)
    if args.cmd == "exec":
        return run_exec(args)
    try:
        if args.cmd == "env":
            for k in ENVIRONMENT:
                print(f"{k}={os.environ.get(k, '')}" if k in os.environ else f"# {k} unset")
            try:
                print(repr(Service.from_env()))
            except OversubError as e:
                print(f"# {e.message}")
            return 0
        if args.cmd == "submit":
            r = Client(_url(args), token=args.token).submit(load_spec(args.spec),
                                                            dry_run=args.dry_run)
            json.dump(r, sys.stdout, indent=2)
            print()
            return 0
        svc = Service(args.id, _url(args), token=args.token)
        for d in svc.directives(stop_on_evict=False):
            print(json.dumps(d.to_json()), flush=True)
        return 0
    except OversubError as e:
        print(f"oversub: {e}", file=sys.stderr)
        if e.body.get("decision"):
            json.dump(e.body["decision"], sys.stderr, indent=2)
            print(file=sys.stderr)
        return 3 if e.code in ("unreachable", "cancelled") else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
