"""Speed of the UVM simulator: one GPT-2 (batch 8) run of 10 iterations at factor 4, PCA off and on.

Goal (issue 24): to_cuda + placement + simulation <= 3 s after the trace, PCA off and on. Prints wall and CPU
seconds of each stage (the machine may be shared: CPU time is the simulator's own cost). The trace capture is
cached (first run captures, later runs read the cache).

    python benchmarks/uvm_speed.py [--workload gpt2] [--iterations 10] [--oversub 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from rich.console import Console
from rich.table import Table


def timed(fn, *a, **kw):  # type: ignore[no-untyped-def]
    t, c = time.perf_counter(), time.process_time()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="gpt2")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--oversub", type=float, default=4.0)
    args = ap.parse_args()

    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.sim.allocator.placement import place
    from uvmlab.sim.uvm.replay import peak_managed_bytes
    from uvmlab.trace.cache import get_trace
    from uvmlab.trace.orchestrate import to_cuda
    from uvmlab.uvm.simulate import Prepared, run_gpu_spec, simulate_prepared

    table = Table(title=f"uvm_speed: {args.workload}, {args.iterations} iterations, factor {args.oversub:g}")
    for col in ("stage", "PCA", "wall s", "CPU s", "detail"):
        table.add_column(col, justify="right" if col.endswith(" s") else "left")
    wl = WorkloadConfig(args.workload, iterations=args.iterations)
    trace, w, c = timed(get_trace, wl)
    table.add_row("trace (cache or capture)", "", f"{w:.2f}", f"{c:.2f}", f"{len(trace.kernels):,} kernels")
    for pca in (False, True):
        cfg = RunConfig(wl, oversub=args.oversub, pca=pca, mode="sim")
        gpu = run_gpu_spec(cfg)
        cuda, w1, c1 = timed(to_cuda, trace, gpu)
        placement, w2, c2 = timed(place, cuda, "pca" if pca else "nocache")
        fp = peak_managed_bytes(placement.ranges)
        prep = Prepared(gpu, cuda, placement, fp, min(int(fp / args.oversub), gpu.usable_bytes))
        (_res, r), w3, c3 = timed(simulate_prepared, cfg, dataclasses.replace(prep))
        tag = "on" if pca else "off"
        table.add_row("to_cuda", tag, f"{w1:.2f}", f"{c1:.2f}", "")
        table.add_row("place", tag, f"{w2:.2f}", f"{c2:.2f}", f"{len(placement.ranges):,} managed ranges")
        table.add_row(
            "UVM simulation",
            tag,
            f"{w3:.2f}",
            f"{c3:.2f}",
            f"{r['fault_count']:,} faults, {r['fault_batch_count']:,} batches, {r['eviction_count']:,} evictions",
        )
        table.add_row(
            "total (after trace)", tag, f"{w1 + w2 + w3:.2f}", f"{c1 + c2 + c3:.2f}", "goal: <= 3 s after the trace"
        )
    Console().print(table)


if __name__ == "__main__":
    main()
