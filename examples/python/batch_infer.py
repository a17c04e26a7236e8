#!/usr/bin/env python3
"""batch_infer.py - a checkpointed batch inference job for oversub, in Python.

    batch_infer.py --units N [--output FILE] [--trace FILE] [--unit-ms MS] [--torch ...]

It works through N units (unit i: one input, one result), a batch at a time, and does each
unit exactly once however often it is degraded, evicted and resumed:

- **degrade**: the next batch is ``d.batch_size`` units; the memory of the bigger batch is given
  back (with ``--torch``: its workspace dropped, the allocator capped at the new grant and
  ``torch.cuda.empty_cache()``), the usage reported, then the degrade acknowledged;
- **restore**: back to the full batch;
- **evict** (the directive, or SIGTERM, which oversubd sends at the same time): the batch under
  way is finished and committed, the checkpoint reported (``ack`` with ``checkpoint``) and the
  job exits 0 within its grace period; a resumable service is queued and started again later
  with ``OVERSUB_RESUME_FROM``;
- **resume**: it continues after the last committed batch.

Each batch is committed as one file in the checkpoint folder (``parts/part-FIRST-LAST.jsonl``,
written to a temporary name, synced, then renamed), so a unit's result is either in exactly
one part or in none; ``state.json`` says where the next batch starts and is what the job
reports as its checkpoint. When every unit is done it writes the results in order to
``--output`` (one JSON line per unit) and exits 0: oversubd releases it.

Without oversub (no ``OVERSUB_SERVICE``) it runs the same way with ``--batch`` and
``--checkpoint-dir``. With ``--torch`` each batch goes through a randomly initialised MLP on
the GPU (nothing downloaded) and keeps a workspace of ``--mib-per-item`` MiB per unit of the
batch, so that its memory follows its batch size as a real job's activations do.

Deploy it (the Unix socket may run programs; see docs/serving.md):

    python3 -m oversub submit job.json      # {"id": "nightly", "class": "batch", "resumable": true,
                                            #  "vram": "24GiB", "min_vram": "8GiB", "batch_size": 32,
                                            #  "min_batch_size": 8,
                                            #  "command": ["/usr/bin/python3", "/path/batch_infer.py", "--units", "100000",
                                            #              "--output", "/data/nightly.jsonl"]}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

try:
    import oversub
except ImportError:  # run from a checkout, oversub not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "clients", "python"))
    import oversub


def log(msg: str) -> None:
    t = time.time()
    print(f"{time.strftime('%H:%M:%S', time.gmtime(t))}.{int(t * 1000) % 1000:03d} "
          f"[{os.getpid()}] batch_infer: {msg}", file=sys.stderr, flush=True)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """data to path through a temporary file, synced, then renamed: a reader sees all or
    nothing, and so does a restart after a crash."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


class Checkpoint:
    """The committed batches of one job in a folder: ``parts/part-FIRST-LAST.jsonl`` and
    ``state.json``."""

    def __init__(self, folder: str, job: str, units: int) -> None:
        self.folder = folder
        self.parts = os.path.join(folder, "parts")
        self.state_path = os.path.join(folder, "state.json")
        self.job = job
        self.units = units
        os.makedirs(self.parts, exist_ok=True)

    def ranges(self) -> List[Tuple[int, int, str]]:
        out = []
        for name in os.listdir(self.parts):
            if name.startswith("part-") and name.endswith(".jsonl"):
                a, b = name[5:-6].split("-")
                out.append((int(a), int(b), os.path.join(self.parts, name)))
        return sorted(out)

    def next_unit(self) -> int:
        """The first unit not committed: the end of the parts that run on from unit 1."""
        nxt = 1
        for a, b, _ in self.ranges():
            if a != nxt:
                raise SystemExit(f"batch_infer: {self.parts}: units {nxt}..{a - 1} missing "
                                 f"before part {a}-{b}: not a checkpoint of this job")
            nxt = b + 1
        return nxt

    def check_job(self) -> None:
        if not os.path.exists(self.state_path):
            return
        with open(self.state_path, encoding="utf-8") as f:
            st = json.load(f)
        if st.get("job") != self.job or st.get("units") != self.units:
            raise SystemExit(f"batch_infer: {self.state_path} belongs to job {st.get('job')!r} of "
                             f"{st.get('units')} units, not {self.job!r} of {self.units}; give "
                             "--fresh to start over")

    def clear(self) -> None:
        for _, _, p in self.ranges():
            os.unlink(p)
        if os.path.exists(self.state_path):
            os.unlink(self.state_path)

    def commit(self, first: int, results: List[Dict[str, Any]]) -> None:
        last = first + len(results) - 1
        body = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in results).encode()
        write_atomic(os.path.join(self.parts, f"part-{first:09d}-{last:09d}.jsonl"), body)
        state = {"job": self.job, "units": self.units, "next": last + 1,
                 "time_unix_ms": int(time.time() * 1000)}
        write_atomic(self.state_path, (json.dumps(state) + "\n").encode())

    def assemble(self, output: str) -> int:
        """Every result in unit order into output; the number of units."""
        n = 0
        chunks = []
        for a, b, p in self.ranges():
            with open(p, "rb") as f:
                chunks.append(f.read())
            n += b - a + 1
        write_atomic(output, b"".join(chunks))
        return n


class SimulatedModel:
    """No GPU: a deterministic result per unit and memory that follows the batch size."""

    def __init__(self, base_mib: int, mib_per_item: int) -> None:
        self.base_mib = base_mib
        self.mib_per_item = mib_per_item
        self.batch = 0

    def resize(self, batch: int) -> None:
        self.batch = batch

    def usage_mib(self) -> int:
        return self.base_mib + self.mib_per_item * self.batch

    def run(self, units: List[int]) -> List[float]:
        return [float((u * u) % 1000003) for u in units]


class TorchModel:
    """A randomly initialised MLP on the GPU; a workspace of mib_per_item MiB per unit of the
    batch stands for activations and caches, so memory follows the batch size."""

    def __init__(self, torch: Any, dim: int, layers: int, mib_per_item: int, device: str) -> None:
        self.torch = torch
        self.device = device
        self.mib_per_item = mib_per_item
        torch.manual_seed(0)
        mods: List[Any] = []
        for _ in range(layers):
            mods += [torch.nn.Linear(dim, dim), torch.nn.GELU()]
        self.model = torch.nn.Sequential(*mods).to(device).eval()
        self.dim = dim
        self.workspace = None
        self.batch = 0

    def resize(self, batch: int) -> None:
        # the old batch's memory goes back first: a smaller tensor allocated while the big one
        # is cached would be carved out of its block, which empty_cache() then cannot return
        self.workspace = None
        self.torch.cuda.empty_cache()
        self.batch = batch
        n = batch * self.mib_per_item * (1 << 20) // 4
        if n > 0:
            self.workspace = self.torch.empty(n, dtype=self.torch.float32, device=self.device)

    def run(self, units: List[int]) -> List[float]:
        torch = self.torch
        with torch.no_grad():
            g = torch.Generator(device="cpu")
            xs = []
            for u in units:
                g.manual_seed(u)
                xs.append(torch.randn(self.dim, generator=g))
            x = torch.stack(xs).to(self.device)
            if self.workspace is not None:
                self.workspace.fill_(float(len(units)))  # touch it: the memory is really used
            y = self.model(x).sum(dim=1)
            return [float(v) for v in y.cpu()]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--units", type=int, required=True, help="how many units (1..N)")
    p.add_argument("--output", help="where the results go, in unit order, once all are done")
    p.add_argument("--trace", help="append 'unit pid batch' for each unit processed (tests)")
    p.add_argument("--unit-ms", type=float, default=0.0, help="extra time per unit (a slow "
                   "model); default 0")
    p.add_argument("--throttle-file", help="a file holding the per-unit milliseconds, read "
                   "again before each batch (to change the pace of a running job)")
    p.add_argument("--batch", type=int, default=8, help="batch size without oversub "
                   "(OVERSUB_BATCH_SIZE otherwise)")
    p.add_argument("--checkpoint-dir", help="without oversub (OVERSUB_CHECKPOINT_DIR otherwise)")
    p.add_argument("--fresh", action="store_true", help="drop any checkpoint and start over")
    p.add_argument("--base-mib", type=int, default=2048, help="simulated: memory of the model")
    p.add_argument("--mib-per-item", type=int, default=512,
                   help="memory per unit of the batch (simulated, or --torch's workspace)")
    p.add_argument("--torch", action="store_true", help="run a random MLP with PyTorch")
    p.add_argument("--device", default="cuda", help="--torch: the device (cuda)")
    p.add_argument("--dim", type=int, default=1024, help="--torch: the MLP's width")
    p.add_argument("--layers", type=int, default=4, help="--torch: the MLP's depth")
    p.add_argument("--headroom-mib", type=int, default=1024,
                   help="--torch: memory outside the caching allocator (CUDA context)")
    args = p.parse_args(argv)
    if args.units < 1:
        p.error("--units must be at least 1")

    try:
        svc: Optional[oversub.Service] = oversub.Service.from_env()
    except oversub.MissingEnvironment:
        svc = None
    job = svc.id if svc else "standalone"
    folder = (svc.checkpoint_dir if svc else None) or args.checkpoint_dir or "batch_infer.ckpt"
    ck = Checkpoint(folder, job, args.units)
    if args.fresh:
        ck.clear()
    ck.check_job()
    nxt = ck.next_unit()
    if svc and svc.resume_from:
        log(f"resuming from {svc.resume_from}: next unit {nxt} of {args.units}")
    elif nxt > 1:
        log(f"continuing from the checkpoint in {folder}: next unit {nxt} of {args.units}")
    else:
        log(f"starting: {args.units} units, checkpoints in {folder}")

    full_batch = (svc.batch_size if svc and svc.batch_size else None) or args.batch
    batch = full_batch
    mem = None
    if args.torch:
        import oversub.torch as otorch
        torch = otorch.load_torch()
        model: Any = TorchModel(torch, args.dim, args.layers, args.mib_per_item, args.device)
        if svc is not None:
            mem = otorch.TorchMemory(svc, headroom_mib=args.headroom_mib)
            mem.cap()
    else:
        model = SimulatedModel(args.base_mib, args.mib_per_item)
    model.resize(batch)

    def report() -> None:
        if svc is None:
            return
        try:
            if mem is not None:
                mem.report_usage()
            else:
                svc.report_usage(vram_mib=model.usage_mib())
        except oversub.OversubError as e:
            log(f"usage not reported: {e}")

    stop = threading.Event()
    evict: List[oversub.Directive] = []

    signalled: List[int] = []

    def on_term(signum: int, frame: Any) -> None:
        # nothing printed here: a print from a signal handler while the main thread prints to
        # the same stream raises RuntimeError (reentrant call), and the checkpoint would be lost
        signalled.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    inbox = None
    if svc is not None:
        report()
        svc.ready()
        log(f"ready: batch {batch}, grant {svc.vram_mib} MiB")
        inbox = svc.listen()

    trace = open(args.trace, "a", encoding="utf-8") if args.trace else None
    done_here = 0
    while nxt <= args.units and not stop.is_set():
        for d in inbox.drain() if inbox is not None else []:
            if d.kind == oversub.DEGRADE:
                batch = max(1, d.batch_size or batch // 2)
                model.resize(batch)  # the bigger workspace is dropped here
                if mem is not None:
                    ok = mem.degrade(d, settle_s=min(2.0, (d.time_left() or 2.0) / 2))
                    log(f"degraded to batch {batch}, {d.vram_mib} MiB: "
                        f"{'acknowledged' if ok else 'memory still above the grant'}")
                else:
                    report()
                    svc.ack(d)  # type: ignore[union-attr]
                    log(f"degraded to batch {batch}, {d.vram_mib} MiB: acknowledged")
            elif d.kind == oversub.RESTORE:
                batch = d.batch_size or full_batch
                if mem is not None:
                    mem.restore(d)
                model.resize(batch)
                report()
                log(f"restored: batch {batch}, {d.vram_mib} MiB")
            elif d.kind == oversub.EVICT:
                log(f"evicted ({d.reason}): {d.time_left() or 0:.1f} s to leave")
                evict.append(d)
                stop.set()
        if stop.is_set():
            break
        if args.throttle_file and os.path.exists(args.throttle_file):
            try:
                with open(args.throttle_file, encoding="utf-8") as f:
                    args.unit_ms = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
        units = list(range(nxt, min(args.units, nxt + batch - 1) + 1))
        try:
            values = model.run(units)
        except Exception as e:  # noqa: BLE001 - torch.cuda.OutOfMemoryError, without torch here
            if not args.torch or "out of memory" not in str(e).lower() or inbox is None:
                raise
            # under the CUDA shim a degrade lowers the grant at once, perhaps before this loop
            # saw the directive: take it now and run the batch again at the new size
            log(f"out of memory at batch {batch}: looking for a degrade")
            d = inbox.get(timeout=2.0)
            if d is not None and d.kind == oversub.EVICT:
                evict.append(d)
                stop.set()
                break
            if d is None or d.kind != oversub.DEGRADE:
                raise
            batch = max(1, d.batch_size or batch // 2)
            model.resize(batch)
            if mem is not None:
                mem.degrade(d, settle_s=1.0)
            continue
        if args.unit_ms > 0:
            time.sleep(args.unit_ms * len(units) / 1000.0)
        if trace is not None:
            trace.write("".join(f"{u} {os.getpid()} {batch}\n" for u in units))
            trace.flush()
        ck.commit(nxt, [{"unit": u, "result": v} for u, v in zip(units, values)])
        nxt = units[-1] + 1
        done_here += len(units)
        if done_here == len(units):
            report()  # the first batch shows what the job really uses

    if signalled:
        log(f"signal {signalled[0]}: finished the batch under way")
    if nxt <= args.units:
        log(f"stopped after {done_here} unit(s) in this run; next unit {nxt}; checkpoint "
            f"{ck.state_path}")
        if svc is not None:
            try:
                svc.ack(evict[0] if evict else None, checkpoint=ck.state_path)
                log("checkpoint reported")
            except oversub.OversubError as e:
                log(f"checkpoint not reported: {e}")
        if inbox is not None:
            inbox.stop(timeout=1.0)
        return 0

    if inbox is not None:
        inbox.stop(timeout=1.0)
    n = ck.assemble(args.output) if args.output else args.units
    log(f"done: {n} unit(s), {done_here} in this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
