"""Host-initialised managed arrays read by a GPU kernel, by driver branch (issue 41 section 3, CPU chunks): the
``vec_add`` of parallelArchitect/pascal-um-benchmark (three 1 GiB managed arrays, two written by the host, ``c = a +
b`` in one kernel; measured 382.6 ms of kernel time on a GTX 1080 with driver 535.274.02, docs/uvm-sim.md "Cost
profiles"), simulated on the closed generation, a R515-R529 driver (one CPU chunk per host page) and R530+ ones
(one per block: uvmlab.sim.uvm.cpu_chunks). Prints the kernel's time, its fault stall and its transfers. Usage::

    python benchmarks/host_init_table.py [--gpu GTX1080] [--mb 1024]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from program_run import program_file, table_arguments, uvmlab_run

PROGRAM = """
OPTIONS = {"mb": 1024}


def program(uvm, cfg, options):
    import torch  # noqa: TID251

    n = (options["mb"] << 20) // 4
    a = torch.empty(n, device=uvm.device)
    b = torch.empty(n, device=uvm.device)
    c = torch.empty(n, device=uvm.device)
    uvm.host_write(a)  # the host initialises a and b: CPU-resident, CPU-mapped
    uvm.host_write(b)
    for _ in uvm.iterations():
        torch.add(a, b, out=c)  # one kernel: a and b fault over, c is zero-filled on the GPU
"""
DRIVERS = ("410", "525.105.17", "535.274.02", "575.57.08")
MEASURED_MS = {("GTX1080", "535.274.02"): 382.6}
"""parallelArchitect/pascal-um-benchmark README: naive UM vec_add kernel time (docs/uvm-sim.md)."""


def run(program: Path, gpu: str, mb: int) -> dict[str, float]:
    tables = uvmlab_run(
        program, program.parent / gpu.replace("@", "_"), "--gpu", gpu, "-n", "1", "--option", f"mb={mb}"
    )
    k = pd.read_parquet(tables / "kernels.parquet")
    add = k[k["name"] == "aten::add"].iloc[-1]
    return {k: float(add[f"{k}_ns"]) / 1e6 for k in ("duration", "fault_stall", "migration")}


def main() -> None:
    a = table_arguments(__doc__, "GTX1080").parse_args()
    with program_file("vec_add.py", PROGRAM) as program:
        rows = {d: run(program, f"{a.gpu}@{d}", a.mb) for d in DRIVERS}
    print(f"vec_add over 3 x {a.mb} MiB managed arrays (two host-written) on {a.gpu}\n")
    print("| driver | kernel (ms) | its fault stall (ms) | its transfers (ms) | measured (ms) |")
    print("|---|---|---|---|---|")
    for d, r in rows.items():
        meas = MEASURED_MS.get((a.gpu, d), "") if a.mb == 1024 else ""
        print(f"| {d} | {r['duration']:.1f} | {r['fault_stall']:.1f} | {r['migration']:.1f} | {meas} |")


if __name__ == "__main__":
    main()
