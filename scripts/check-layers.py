#!/usr/bin/env python3
"""check-layers.py - oversubd's layers (docs/architecture.md), checked on what was built.

From the object files' symbol tables (nm): which module calls which. A module may call only
modules of its own layer or lower, and no two modules may call each other (no circle of any
length). From the sources: a file includes only headers of its own layer or lower, and a module's own
header (act.h, gw.h, dp.h, api_int.h) only from the module's files. Every
module of oversubd must have a layer here: a new file is placed on purpose. Fails naming each
pair.

usage: check-layers.py LIBOSUBD.a MAIN.o SRC_DAEMON_DIR
"""
import collections
import os
import re
import subprocess
import sys

# lowest first; a module's layer is its index
LAYERS = [
    ("leaves", ["log", "jsonmem", "sha256", "idmap", "pbwire", "netpolicy", "selfaddr", "conns",
                "notify", "nvml", "httpc", "command", "store", "writer", "config", "gpus", "segment"]),
    ("state", ["state"]),
    ("core", ["core"]),
    ("tables", ["routes"]),
    ("runners", ["actuator", "monitor", "pods", "deviceplugin", "gateway", "suspender"]),
    ("api", ["api", "dashboard_html", "openapi_json"]),
    ("main", ["main"]),
]
LAYER = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}
# a module may be several files: act_spawn.c is a part of the actuators (they share act.h)
PARTS = {"act": "actuator", "gw": "gateway", "api": "api", "dp": "deviceplugin",
         "sus": "suspender"}


def module_of(path):
    """The module a file (or object, or header) belongs to: act_spawn.c, act.h -> actuator."""
    name = os.path.basename(path).split(".")[0]
    return PARTS.get(name.split("_")[0], name)


def internal(header):
    """Whether a header is a module's own (act.h, api_int.h): its parts share it, no one else."""
    name = os.path.basename(header).split(".")[0]
    return name in PARTS and PARTS[name] != name or name.endswith("_int")


def symbols(paths):
    defs, uses = {}, collections.defaultdict(set)
    for p in paths:
        out = subprocess.run(["nm", "-A", p], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            # "lib.a:file.c.o:0000 T name" or "file.c.o:         U name"
            head, _, rest = line.rpartition(":")
            obj = head.split(":")[-1] if ":" in head else head
            parts = rest.split()
            mod = module_of(obj)
            if len(parts) == 3 and parts[1] in "TDBRC":
                defs[parts[2]] = mod
            elif len(parts) == 2 and parts[0] == "U":
                uses[mod].add(parts[1])
    return defs, uses


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    lib, main_o, srcdir = sys.argv[1:]
    defs, uses = symbols([lib, main_o])
    bad = []
    edges = collections.defaultdict(set)
    why = {}
    for mod, syms in uses.items():
        for s in syms:
            to = defs.get(s)
            if to is None or to == mod:
                continue
            edges[mod].add(to)
            why.setdefault((mod, to), s)
    for mod in sorted(set(edges) | set(defs.values())):
        if mod not in LAYER:
            bad.append(f"{mod}: no layer (add it to LAYERS in scripts/check-layers.py)")
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if a in LAYER and b in LAYER and LAYER[b] > LAYER[a]:
                bad.append(f"{a} ({LAYERS[LAYER[a]][0]}) calls {b} ({LAYERS[LAYER[b]][0]}), "
                           f"a layer above it: {why[(a, b)]}")
    for comp in cycles(edges):
        pairs = [f"{a} -> {b} ({why[(a, b)]})" for a in comp for b in sorted(edges[a]) if b in comp]
        bad.append("modules call each other: " + ", ".join(pairs))
    # includes: a file's own layer or lower
    for name in sorted(os.listdir(srcdir)):
        if not name.endswith((".c", ".h")):
            continue
        mod = module_of(name)
        if mod not in LAYER:
            if name.endswith(".c"):
                bad.append(f"{name}: no layer (add it to LAYERS in scripts/check-layers.py)")
            continue
        with open(os.path.join(srcdir, name), encoding="utf-8") as f:
            for ln, line in enumerate(f, 1):
                m = re.match(r'\s*#\s*include\s*["<]([^">]+)\.h[">]', line)
                inc = module_of(m.group(1)) if m else None
                if m and internal(m.group(1)) and inc != mod:
                    bad.append(f"{name}:{ln} includes {m.group(1)}.h, the {inc} module's own "
                               "header")
                elif inc in LAYER and LAYER[inc] > LAYER[mod]:
                    bad.append(f"{name}:{ln} includes {m.group(1)}.h "
                               f"({LAYERS[LAYER[inc]][0]}), a layer above "
                               f"{LAYERS[LAYER[mod]][0]}")
    for b in bad:
        print("check-layers: " + b)
    if not bad:
        n = sum(len(v) for v in edges.values())
        print(f"check-layers: {len(LAYER)} modules in {len(LAYERS)} layers, {n} calls between "
              "modules, none upward, no circle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
