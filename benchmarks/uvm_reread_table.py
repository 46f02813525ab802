"""Where the GEMM re-read model (uvmlab.sim.uvm.reread) can act in the seed grid's workloads: prints a table.

For each workload (one steady iteration of its cached trace): how many GEMM-like kernels the model splits into
sweeps, the largest of them (bytes, passes) and the oversubscription factor beyond which that kernel no longer
fits in the GPU memory (footprint / kernel bytes; footprints from the grid CSV). Under LRM a swept operand's chunks
reach the head of the eviction list once the kernel has migrated more than the memory holds, whether or not they
are in use, so that factor is where the sweeps start to fault again. Usage::

    python benchmarks/uvm_reread_table.py [--grid docs/uvm-grid/grid.csv] [--gpu A100-80GB]
"""

from __future__ import annotations

import argparse

import pandas as pd

from uvmlab.config import WorkloadConfig
from uvmlab.sim.uvm.reread import gemm_passes
from uvmlab.trace.cache import get_trace

WORKLOADS = ("alexnet", "resnet50", "resnet101", "gpt2", "bert", "whisper-small")


def workload_row(name: str, footprints: dict[str, float], gpu: str) -> dict:
    t = get_trace(WorkloadConfig(name, iterations=10))
    k = t.kernels[t.kernels["iteration"] == 2]
    acc = t.accesses[t.accesses["kernel_id"].isin(k["kernel_id"])]
    by_kernel = {kid: g for kid, g in acc.groupby("kernel_id")}
    n_split, top, top_name, top_passes = 0, 0, "", 0
    for kid, op, flops in zip(k["kernel_id"], k["name"], k["flops"], strict=True):
        g = by_kernel.get(kid)
        if g is None:
            continue
        rows = list(
            zip(
                g["alloc_id"].tolist(),
                g["offset_bytes"].tolist(),
                g["size_bytes"].tolist(),
                g["is_write"].tolist(),
                strict=True,
            )
        )
        passes = gemm_passes(op, rows, float(flops), "fp32", gpu)
        if passes is None:
            continue
        n_split += 1
        size = sum(r[2] for r in rows)
        if size > top:
            top, top_name, top_passes = size, op, len(passes)
    mib = top / 2**20
    row = {"workload": name, "split_kernels_per_iter": n_split, "largest_mib": round(mib, 1), "op": top_name}
    row["passes"] = top_passes
    for pca, fp in footprints.items():
        row[f"fires_beyond_factor_pca_{pca}"] = round(fp / mib, 1) if mib else float("inf")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--grid", default="docs/uvm-grid/grid.csv")
    ap.add_argument("--gpu", default="A100-80GB")
    a = ap.parse_args()
    grid = pd.read_csv(a.grid)
    rows = []
    for w in WORKLOADS:
        sel = grid[grid["workload"] == w]
        fps = {p: float(sel.loc[sel["pca"] == p, "footprint_mb"].iloc[0]) for p in ("on", "off")}
        rows.append(workload_row(w, fps, a.gpu))
    df = pd.DataFrame(rows)
    print("| " + " | ".join(df.columns) + " |")
    print("|" + "---|" * len(df.columns))
    for r in df.itertuples(index=False):
        print("| " + " | ".join(str(v) for v in r) + " |")


if __name__ == "__main__":
    main()
