"""Capture time and peak live bytes of the six built-in workloads (meta device, seed batch sizes).

    python benchmarks/trace_capture.py [--iterations 3] [--compare] [WORKLOAD ...]

Prints one row per workload: batch, capture wall and process-CPU seconds (build + iterations; CPU seconds are
the stable number on a shared machine), allocations, kernels, FLOPs, parameter
bytes and peak live tensor bytes (requested bytes; no allocator rounding, no CUDA workspaces). ``--compare``
also runs the meta-vs-CPU agreement check on small configurations (uvmlab.trace.compare).
"""

from __future__ import annotations

import argparse
import time

from uvmlab.config import WorkloadConfig
from uvmlab.console import print_table
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.compare import compare_allocations
from uvmlab.trace.summary import summarize
from uvmlab.units import format_bytes
from workloads.registry import WORKLOADS

COMPARE = {
    "alexnet b4 64px": WorkloadConfig("alexnet", batch_size=4, iterations=2, options={"image_size": 64}),
    "resnet50 b2 64px": WorkloadConfig("resnet50", batch_size=2, iterations=2, options={"image_size": 64}),
    "gpt2 2-layer b2 T128 eager": WorkloadConfig(
        "gpt2", batch_size=2, iterations=2, attention="eager", options={"n_layer": 2, "seq_len": 128}
    ),
    "gpt2 2-layer b2 T128 sdpa": WorkloadConfig(
        "gpt2", batch_size=2, iterations=2, attention="sdpa", options={"n_layer": 2, "seq_len": 128}
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--compare", action="store_true")
    args = ap.parse_args()
    rows = []
    for name in args.workloads:
        t0, c0 = time.perf_counter(), time.process_time()
        trace = capture_trace(WorkloadConfig(name, iterations=args.iterations))
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        s = summarize(trace)
        rows.append(
            [
                name,
                s["batch_size"],
                round(seconds, 2),
                round(cpu_seconds, 2),
                s["allocations"],
                s["kernels"],
                f"{s['total_flops']:.3g}",
                format_bytes(s["parameter_bytes"]),
                format_bytes(s["peak_live_bytes"]),
                s["peak_live_bytes"],
                f"{s['peak_phase']} it{s['peak_iteration']}",
            ]
        )
    print_table(
        f"Meta capture, {args.iterations} iterations, seed batch sizes",
        ["workload", "batch", "wall s", "CPU s", "allocs", "kernels", "FLOP", "params", "peak live", "bytes", "at"],
        rows,
    )
    if args.compare:
        crow = []
        for label, cfg in COMPARE.items():
            t0 = time.perf_counter()
            meta = capture_trace(cfg, "meta", emulate_cuda=False)
            t1 = time.perf_counter()
            cpu = capture_trace(cfg, "cpu", emulate_cuda=False)
            t2 = time.perf_counter()
            emu = capture_trace(cfg, "meta", emulate_cuda=True)
            r = compare_allocations(meta, cpu)
            r_emu = compare_allocations(emu, cpu)
            crow.append(
                [
                    label,
                    round(t1 - t0, 2),
                    round(t2 - t1, 2),
                    f"{r['agreement']:.6f}",
                    r["unmatched_bytes_a"],
                    r["unmatched_bytes_b"],
                    f"{r_emu['agreement']:.6f}",
                ]
            )
        print_table(
            "Meta vs CPU allocation sequences (Dice on bytes after alignment)",
            ["config", "meta s", "cpu s", "agreement", "meta-only B", "cpu-only B", "agreement w/ CUDA emulation"],
            crow,
        )


if __name__ == "__main__":
    main()
