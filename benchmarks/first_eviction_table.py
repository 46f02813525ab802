"""A block's first eviction against later ones, by driver branch (issue 41 section 3, CPU chunks): a GPU kernel
writes every page of one managed array at an oversubscription factor, three passes, so the first pass evicts what
the GPU cannot hold and every later pass evicts every block. A block's first eviction allocates its CPU chunks and
maps each for the GPU (``cpu_chunk_map_ns``: 512 page chunks on R515-R529, one block chunk from R530;
``UvmSim._cpu_alloc_ns``); later evictions find them. Prints each pass's kernel time, fault stall and evictions.
Usage::

    python benchmarks/first_eviction_table.py [--gpu A100-80GB] [--mb 1024] [--oversub 1.5]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from program_run import program_file, table_arguments, uvmlab_run

PROGRAM = """
OPTIONS = {"mb": 1024}


def program(uvm, cfg, options):
    import torch  # noqa: TID251

    x = torch.empty((options["mb"] << 20) // 4, device=uvm.device)
    for _ in uvm.iterations():
        x.fill_(1.0)  # a GPU write of every page
"""
DRIVERS = ("525.105.17", "575.57.08")


def run(program: Path, gpu: str, mb: int, oversub: float) -> pd.DataFrame:
    options = ("--gpu", gpu, "-n", "3", "--oversub", str(oversub), "--option", f"mb={mb}")
    return pd.read_parquet(uvmlab_run(program, program.parent / gpu.replace("@", "_"), *options) / "kernels.parquet")


def main() -> None:
    ap = table_arguments(__doc__, "A100-80GB")
    ap.add_argument("--oversub", type=float, default=1.5)
    a = ap.parse_args()
    with program_file("fill.py", PROGRAM) as program:
        rows = {d: run(program, f"{a.gpu}@{d}", a.mb, a.oversub) for d in DRIVERS}
    print(f"fill_ of one {a.mb} MiB managed array at x{a.oversub} on {a.gpu}, three passes\n")
    print("| driver | pass | kernel (ms) | its fault stall (ms) | its evictions |")
    print("|---|---|---|---|---|")
    for d, k in rows.items():
        for it, r in k[k["name"] == "aten::fill_"].groupby("iteration"):
            dur, stall = r["duration_ns"].sum() / 1e6, r["fault_stall_ns"].sum() / 1e6
            print(f"| {d} | {it + 1} | {dur:.1f} | {stall:.1f} | {int(r['eviction_count'].sum())} |")


if __name__ == "__main__":
    main()
