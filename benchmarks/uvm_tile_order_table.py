"""GEMM faults in tile order (uvmlab.sim.uvm.tile_order) against address order: prints a table.

One ``mm`` (``--batch B``: a ``bmm`` of B such products) whose two input matrices start on the host (every page
CPU-resident) and whose output is new, alone on the GPU, through the driver model with a shipped cost profile:
nsys-style HtoD records, their mean size, faults, batches and the fault stall, for address order and for each
operand layout. Usage::

    python benchmarks/uvm_tile_order_table.py [--gpu A100-80GB] [--shape 4096x4096x4096] [--dtype fp32] [--batch 1]
"""

from __future__ import annotations

import argparse

from uvmlab.gpus import GPUS
from uvmlab.sim.uvm.driver import UvmSim
from uvmlab.sim.uvm.knobs import UvmKnobs
from uvmlab.sim.uvm.occupancy import ELEM_BYTES, sm_count
from uvmlab.sim.uvm.profile import load_profile
from uvmlab.sim.uvm.reread import CTAS_PER_SM, mm_operands
from uvmlab.sim.uvm.tile_order import TileOrders


def run(gpu_name: str, m: int, n: int, k: int, e: int, layouts: str, batch: int = 1) -> dict[str, float]:
    """One mm, or a bmm of ``batch`` products (``layouts`` "" = address order): its counters."""
    gpu = GPUS[gpu_name]
    rows = [(0, 0, batch * m * k * e, False), (1, 0, batch * k * n * e, False), (2, 0, batch * m * n * e, True)]
    sim = UvmSim(gpu.memory_bytes, UvmKnobs(), load_profile(gpu_name), gpu)
    for rid, _, size, _ in rows:
        sim.map_range(rid, size)
        if rid < 2:
            sim.host_write(rid, 0, size)
    if not layouts:
        return sim.access(rows).as_dict()
    mm = mm_operands(rows, 2.0 * batch * m * n * k, e, batched=batch > 1)
    stages = TileOrders(sm_count(gpu) * CTAS_PER_SM).stages(mm, layouts, e, sim.page_gids) if mm else None
    if stages is None:
        raise SystemExit(f"no tile order for {m}x{n}x{k} {layouts}")
    return sim.access_in_order(stages).as_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="A100-80GB")
    ap.add_argument("--shape", default="4096x4096x4096", help="M x N x K")
    ap.add_argument("--dtype", default="fp32", choices=sorted(ELEM_BYTES))
    ap.add_argument("--batch", type=int, default=1, help="a bmm of this many products (1: an mm)")
    a = ap.parse_args()
    m, n, k = (int(x) for x in a.shape.lower().split("x"))
    e = ELEM_BYTES[a.dtype]
    op = "mm" if a.batch == 1 else f"bmm of {a.batch}"
    print(f"{op} {m}x{n}x{k} {a.dtype} on {a.gpu}, a and b on the host\n")
    print("| order | HtoD records | mean record (KiB) | faults | batches | fault stall (ms) |")
    print("|---|---|---|---|---|---|")
    for layouts in ("", "nn", "nt", "tn", "tt"):
        d = run(a.gpu, m, n, k, e, layouts, a.batch)
        rec = max(1, d["htod_records"])
        name = "address" if not layouts else f"tile, `{layouts}`"
        print(
            f"| {name} | {d['htod_records']:,.0f} | {d['htod_bytes'] / rec / 1024:.0f} | {d['fault_count']:,.0f} "
            f"| {d['fault_batch_count']:,.0f} | {d['stall_ns'] / 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()
