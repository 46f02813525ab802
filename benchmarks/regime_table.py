"""The regime (result.json ``regime``: fits / paging / thrashing) against real runs that fit, page and crawl.

Prints Markdown tables (docs/uvm-sim.md "The regime"):

* gpu_ext's uvmbench t0rq3 runs (RTX 5090, ../shared/real-data/uvm): the measured time per accessed byte against
  the same kernel's at 0.5x, and the predicted verdict of ``workloads/files/uvmbench.py``;
* noob512's GCN epochs (RTX 5090, PCA off): the measured time per node against the 5M-node run's, and the
  predicted verdict of ``workloads/files/gcn.py``;
* the row-per-thread example (docs/examples/programs/row_per_thread.py, A100-80GB, no measurement).

Usage::

    python benchmarks/regime_table.py [--real-data ../shared/real-data] [--skip-gcn]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
GCN_SIZES = (5, 7, 8, 10, 12, 15)
"""Millions of nodes with a measured plain-UVM epoch (real-data/uvm/noob512-uvm_rtx5090_pytorch_gcn)."""


def _cells(r: dict) -> str:
    g = r["regime"]
    share = g.get("thrashing_time_share")
    return (
        f"{g['verdict']} | {g['evicted_chunks_per_iteration']:,.0f} | {g['refetched_chunks_per_iteration']:,.0f} | "
        f"{'-' if not share else f'{share:.1%}'} | {(g.get('worst_kernel') or {}).get('name', '-')}"
    )


HEAD = "| verdict | evicted chunks / iteration | refetched | time share | most refetched |"


def uvmbench_table(uvm: Path) -> list[str]:
    from uvmlab.measure.profile_fit import BENCH_CSV, bench_result

    df = pd.read_csv(uvm / BENCH_CSV)
    lines = [
        "| kernel | factor | measured ms | per byte vs 0.5x | predicted ms |" + HEAD[1:],
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kernel in ("seq_stream", "rand_stream", "pointer_chase"):
        rows = df[(df["kernel"] == kernel) & (df["mode"] == "uvm")].set_index("size_factor")
        per_byte = rows["median_ms"] / rows["bytes_accessed"]
        for f in rows.index:
            r = bench_result(kernel, float(f))
            lines.append(
                f"| {kernel} | {f:g} | {rows.loc[f, 'median_ms']:,.3f} | {per_byte[f] / per_byte[0.5]:,.2f}x | "
                f"{r['iteration_time_ns'] / 1e6:,.3f} | {_cells(r)} |"
            )
            print(f"  uvmbench {kernel} {f}: {r['regime']['verdict']}", file=sys.stderr, flush=True)
    return lines


def gcn_table(uvm: Path) -> list[str]:
    from uvmlab.measure.profile_fit import GCN_CHUNK_EDGES, RTX5090_TOTAL_BYTES, gcn_measured
    from uvmlab.uvm.simulate import card_bytes, shipped_config, simulate

    lines = [
        "| nodes | footprint / GPU memory | measured s | per node vs 5M | predicted s |" + HEAD[1:],
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = gcn_measured(uvm, 5_000_000) / 5
    for n in GCN_SIZES:
        opts = {"nodes": n * 10**6, "prefetch": False, "chunk_edges": GCN_CHUNK_EDGES}
        cfg = shipped_config("gcn", opts, "RTX5090", RTX5090_TOTAL_BYTES)
        _, _, r = simulate(cfg, available_bytes=card_bytes(cfg))
        m = gcn_measured(uvm, n * 10**6)
        lines.append(
            f"| {n}M | {r['footprint_bytes'] / RTX5090_TOTAL_BYTES:.2f} | {m:,.1f} | {m / n / base:.2f}x | "
            f"{r['iteration_time_ns'] / 1e9:,.1f} | {_cells(r)} |"
        )
        print(f"  gcn {n}M: {r['regime']['verdict']}", file=sys.stderr, flush=True)
    return lines


def row_per_thread_table() -> list[str]:
    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.uvm.simulate import simulate

    prog = str(REPO / "docs" / "examples" / "programs" / "row_per_thread.py")
    lines = ["| factor | slowdown vs native |" + HEAD[1:], "|---|---|---|---|---|---|---|"]
    for f in (0.9, 1.25, 1.5):
        cfg = RunConfig(WorkloadConfig(prog, iterations=3), oversub=f, pca=True, mode="sim", gpu="A100-80GB")
        _, _, r = simulate(cfg)
        lines.append(f"| {f:g} | {r['slowdown_vs_native']:,.2f}x | {_cells(r)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real-data", type=Path, default=REPO.parent / "shared" / "real-data")
    ap.add_argument("--skip-gcn", action="store_true", help="leave out the GCN runs (about 50 s of CPU)")
    args = ap.parse_args(argv)
    uvm = args.real_data / "uvm"
    t0 = time.process_time()
    out = ["## uvmbench t0rq3 (RTX 5090)", *uvmbench_table(uvm)]
    if not args.skip_gcn:
        out += ["", "## GCN epochs (RTX 5090, PCA off)", *gcn_table(uvm)]
    out += ["", "## row_per_thread.py (A100-80GB, no measurement)", *row_per_thread_table()]
    print("\n".join(out))
    print(f"\n{time.process_time() - t0:.1f} s CPU", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
