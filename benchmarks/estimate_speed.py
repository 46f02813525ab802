"""How long ``uvmlab estimate`` takes, and what it says, for the six built-in workloads at the seed batch sizes.

For each workload: the trace is captured once (or found in the trace cache), then for each allocator:

- ``cli_s``: wall time of ``python -m uvmlab estimate WORKLOAD --allocator A --format json`` in a fresh process
  with a warm trace cache (includes Python start-up and imports);
- ``warm_s``: in this process, reading the cached trace (``read_trace``) plus ``uvmlab.memory.estimate.estimate``
  (orchestrate + simulate): what the CLI costs after start-up and imports;
- ``import torch`` (printed once): a fresh ``python -c "import torch"``; the CLI pays it because the trace
  cache key (``uvmlab.trace.cache.cache_key``) imports torch for its version string.

Usage: ``python benchmarks/estimate_speed.py [--gpu A100-80GB] [--workloads gpt2,bert]``. Prints a table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import click


@click.command()
@click.option("--gpu", default="A100-80GB", show_default=True)
@click.option("--workloads", default="alexnet,resnet50,resnet101,gpt2,bert,whisper-small", show_default=True)
@click.option("--allocators", default="pca,nocache", show_default=True)
def main(gpu: str, workloads: str, allocators: str) -> None:
    """Run the benchmark and print one row per (workload, allocator)."""
    from uvmlab.config import WorkloadConfig
    from uvmlab.console import print_table
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.estimate import estimate
    from uvmlab.trace.cache import cache_key, cache_root, get_trace
    from uvmlab.trace.schema import read_trace
    from workloads.registry import WORKLOADS

    spec = get_gpu(gpu)
    rows = []
    for name in workloads.split(","):
        batch = WORKLOADS[name].default_batch_size
        cfg = WorkloadConfig(name, batch_size=batch)
        t = time.perf_counter()
        trace = get_trace(cfg)
        trace_s = time.perf_counter() - t
        entry = cache_root() / cache_key(cfg)
        for alloc in allocators.split(","):
            t = time.perf_counter()
            est = estimate(cfg, spec, allocator=alloc, trace=read_trace(entry))
            warm = time.perf_counter() - t
            t = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "uvmlab", "estimate", name, "-b", str(batch), "--gpu", gpu,
                 "--allocator", alloc, "--format", "json"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            cli = time.perf_counter() - t
            ok = proc.returncode == 0 and json.loads(proc.stdout)["peak_reserved_bytes"] == est.peak_reserved_bytes
            rows.append(
                [
                    name,
                    batch,
                    alloc,
                    round(est.peak_reserved_bytes / 2**30, 3),
                    round(est.peak_allocated_bytes / 2**30, 3),
                    est.required_mb,
                    "OOM" if est.oom else "fits",
                    len(trace.allocations),
                    round(trace_s, 2),
                    round(warm, 2),
                    round(cli, 2),
                    "yes" if ok else f"NO (exit {proc.returncode})",
                ]
            )
    print_table(
        f"uvmlab estimate on {gpu} (seed batch sizes)",
        ["workload", "batch", "allocator", "peak reserved GiB", "peak allocated GiB", "required MB", "verdict",
         "allocations", "trace s", "warm s", "cli s", "cli agrees"],
        rows,
    )  # fmt: skip
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    print(f"python -c 'import torch': {time.perf_counter() - t:.2f} s (paid by every CLI call, see docstring)")


if __name__ == "__main__":
    main()
