#!/usr/bin/env python3
"""efficacy.py - the GPUs oversub saves, on a part of the pods it was not tuned on.

Runs `oversub simulate --gpus min` for static, oversub (a ratio sweep; its best feasible
ratio counts) and hindsight over a grid of settings (pod halves, time halves, class mixes,
GPU sizes, buffers, synthetic traces, with and without suspend) and prints one Markdown table
per grid with the tuning half and the held-back half side by side. docs/results.md holds its
output.

usage: scripts/efficacy.py [--oversub BUILD/oversub] [--traces DIR] [--jobs N] [--quick]
       [--extra "ARGS"] [--only GRID]
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cli, args):
    cmd = [cli, "simulate", "--gpus", args.pop("gpus", "min"), "--json", "--quiet"]
    for k, v in args.items():
        cmd += [k] if v is None else [k, v]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(cmd), p.stderr))
    d = json.loads(p.stdout)
    out = {}
    for r in d["results"]:
        pol = r["policy"]
        if pol == "oversub":
            if not r["feasible"]:
                continue
            best = out.get("oversub")
            if best is None or r["gpus"] < best["gpus"] or (
                    r["gpus"] == best["gpus"] and r["mean_used_util"] > best["mean_used_util"]):
                out["oversub"] = r
        else:
            out[pol] = r
    return out, " ".join(cmd[1:])


def cell(res):
    s, o, h = res.get("static"), res.get("oversub"), res.get("hindsight")
    if s is None or not s["feasible"]:
        return "static infeasible (%s) | | |" % (s or {}).get("infeasible_because", "?")
    if o is None:
        return "%d / none / %s | | |" % (s["gpus"], h["gpus"] if h and h["feasible"] else "-")
    fewer = 1 - o["gpus"] / s["gpus"]
    util = o["mean_used_util"] / s["mean_used_util"] if s["mean_used_util"] else 0
    hs = "%d" % h["gpus"] if h and h["feasible"] else "-"
    vs = "%+.0f%%" % (100.0 * (o["gpus"] / h["gpus"] - 1)) if h and h["feasible"] else "-"
    return "%d / %s / %d (%.1fx) | %.0f%% fewer, %.2fx used, %s vs hindsight" % (
        s["gpus"], o["gpus"], hs and int(hs) if hs != "-" else 0, o["ratio"], 100 * fewer, util, vs) \
        if False else "%d / %d / %s @%.1f | %.0f%% | %.2fx | %s" % (
            s["gpus"], o["gpus"], hs, o["ratio"], 100 * fewer, util, vs)


def suspend_cell(res):
    """oversub's GPUs / hindsight's @ratio, lost minutes, what evictions / suspends cost, and
    evictions, suspends, degrades a week (batch + experiment)."""
    o, h = res.get("oversub"), res.get("hindsight")
    if o is None:
        return "none / %s | | | | | " % (h["gpus"] if h and h["feasible"] else "-")
    def wk(k):
        return o[k]["batch"] + o[k]["experiment"]
    return "%d / %s @%.1f | %.0f | %.0f / %.0f | %.1f | %.1f | %.1f" % (
        o["gpus"], h["gpus"] if h and h["feasible"] else "-", o["ratio"],
        o["lost_service_minutes"], o["evict_lost_minutes"], o["suspend_lost_minutes"],
        wk("evictions_per_week"), wk("suspends_per_week"), wk("degrades_per_week"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oversub", default=os.path.join(ROOT, "build", "oversub"))
    ap.add_argument("--traces", default=os.path.join(ROOT, "..", "shared", "traces"))
    ap.add_argument("--gentrace", default=os.path.join(ROOT, "build", "oversub-gentrace"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ratios", default="1.3:2.0:0.1")
    ap.add_argument("--extra", default="", help="more simulate options, e.g. '--floor-start never'")
    ap.add_argument("--tune-only", action="store_true", help="the tuning halves only (for tuning)")
    ap.add_argument("--only", default="",
                    help="comma-separated grids: pods,time,mix,size,buffer,suspend,synthetic")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.traces, "genai_pod_vram.csv")):
        sys.exit("efficacy: %s has no genai_pod_vram.csv" % args.traces)
    extra = args.extra.split()
    base = {"--genai": args.traces, "--ratio": args.ratios}
    for i in range(0, len(extra), 2):
        base[extra[i]] = extra[i + 1]
    halves = [("tuning half (pods 0/2)", {"--pods": "0/2"}), ("held-back half (pods 1/2)", {"--pods": "1/2"})]
    grids = {
        "pods": [("default (20:40:40, 81920 MiB, buffer 0.3)", {})],
        "mix": [("classes %s" % m, {"--classes": m}) for m in ("20:40:40", "40:30:30", "10:45:45")],
        "size": [("GPU %s MiB" % g, {"gpus": "min:%s" % g}) for g in ("81920", "98304", "143360")],
        "buffer": [("buffer %s" % b, {"--buffer": b}) for b in ("0", "0.1", "0.3")],
        "suspend": [("evictions only", {}), ("--suspend all", {"--suspend": "all"}),
                    ("--suspend all --relocate", {"--suspend": "all", "--relocate": None})],
    }
    if args.tune_only:
        halves = halves[:1]
    only = set(x for x in args.only.split(",") if x)
    jobs = []
    with cf.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        for g, rows in grids.items():
            if only and g not in only:
                continue
            for label, opts in rows:
                for hl, hopts in halves:
                    a = dict(base)
                    a.update(opts)
                    a.update(hopts)
                    jobs.append((g, label, hl, ex.submit(run, args.oversub, a)))
        if not only or "time" in only:
            for hl, w in (("tuning half (hours 0-11.4)", "0:11.4"), ("held-back half (hours 11.4-22.8)", "11.4:22.9"))[:1 if args.tune_only else 2]:
                a = dict(base)
                a["--window"] = w
                jobs.append(("time", "whole day split in time", hl, ex.submit(run, args.oversub, a)))
        if (not only or "synthetic" in only) and os.path.exists(args.gentrace):
            for kind in ("diurnal", "bursty", "heavytail", "step", "grow", "mix"):
                for hl, seed in (("seed 1", "1"), ("seed 2", "2"))[:1 if args.tune_only else 2]:
                    d = "/tmp/oversub-efficacy-%s-%s" % (kind, seed)
                    if not os.path.exists(os.path.join(d, "genai_pod_vram.csv")):
                        subprocess.run([args.gentrace, "--out", d, "--kind", kind, "--pods", "60",
                                        "--seed", seed], check=True, capture_output=True)
                    for size in ("81920", "143360"):
                        a = dict(base)
                        a["--genai"] = d
                        a["gpus"] = "min:" + size
                        jobs.append(("synthetic", "synthetic %s (60 pods, 24 h), %s MiB" % (kind, size),
                                     hl, ex.submit(run, args.oversub, a)))
        table = {}
        for g, label, hl, fut in jobs:
            res, cmd = fut.result()
            table.setdefault(g, {}).setdefault(label, []).append((hl, res, cmd))
    print("For each part: GPUs static / oversub / hindsight @ oversub's best ratio, oversub's GPUs "
          "fewer than static, its mean used utilisation over static's, its GPUs over "
          "hindsight's.\n")
    for g, rows in table.items():
        heads = [hl for hl, _, _ in next(iter(rows.values()))]
        if g == "suspend":
            print("Suspend: GPUs oversub / hindsight @ oversub's best ratio, lost service-minutes, "
                  "minutes lost to evictions / suspends, and evictions, suspends, degrades a week "
                  "(batch + experiment).\n")
            print("| %s | %s |" % (g, " | ".join(
                "%s: GPUs | lost-min | evict / susp min | evictions/wk | suspends/wk | degrades/wk"
                % h for h in heads)))
            print("|---|" + "---|---|---|---|---|---|" * len(heads))
        else:
            print("| %s | %s |" % (g, " | ".join("%s: GPUs | fewer | used | vs hindsight" % h
                                                   for h in heads)))
            print("|---|" + "---|---|---|---|" * len(heads))
        for label, cols in rows.items():
            fmt = suspend_cell if g == "suspend" else cell
            print("| %s | %s |" % (label, " | ".join(fmt(r) for _, r, _ in cols)))
        print()
        print("```sh")
        for label, cols in rows.items():
            for _, _, cmd in cols:
                print("oversub " + cmd)
        print("```\n")


if __name__ == "__main__":
    main()
