"""The run's regime: does the job fit, page, or thrash? (result.json ``regime``; docs/uvm-sim.md "The regime").

Read from the simulated kernels of the steady iterations (those after the first, as every steady figure is; the
only one if there is one), against the GPU memory UVM has, with no threshold of its own:

* ``fits``: no chunk is evicted. After the first iteration everything the job touches stays on the GPU.
* ``paging``: chunks are evicted, and every kernel's own data (``kernel_bytes``: the distinct storages it reads and
  writes, the study's "memory per kernel") fits in what UVM has. The iteration as a whole does not fit; the cost
  follows the bytes each iteration moves.
* ``thrashing``: some kernel's own data exceeds what UVM has, and it evicts chunks in the steady iterations. It
  cannot run without evicting data of its own: every launch moves at least the excess, and when its threads need
  their data concurrently (issue 41's mechanism) LRM eviction takes blocks in-flight warps still need. This is
  where real GPUs crawl.

Besides the verdict, ``refetched_chunks``: chunks a kernel allocated again after evicting them itself in the same
launch (``UvmSim.one_kernel``), the dynamic trace of data lost while in use. Kernels whose data fits can refetch
too: GPU accesses do not refresh the LRM order, so a kernel's faults can evict an old block it is still reading.
A GEMM replayed as several passes is one kernel.

Approximation: ``kernel_bytes`` counts whole storages, so a gather touching a few rows of a large table counts the
table; the eviction condition keeps such a kernel out unless it really moves data in the steady iterations.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

VERDICTS = ("fits", "paging", "thrashing")


def steady_kernels(kernels: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The kernels of the steady iterations (after the first; the only one if there is one) and how many."""
    its = sorted(int(i) for i in kernels["iteration"].unique() if i >= 0)
    if not its:
        return kernels.iloc[0:0], 0
    steady = its[1:] or its
    return kernels[kernels["iteration"].isin(steady)], len(steady)


def regime(kernels: pd.DataFrame, available_bytes: int) -> dict[str, Any]:
    """result.json ``regime`` from the kernels table (columns ``iteration``, ``name``, ``duration_ns``,
    ``native_ns``, ``kernel_bytes``, ``eviction_count``, ``refetched_chunks``) and the bytes UVM had."""
    k, n = steady_kernels(kernels)
    if n == 0:
        return {"verdict": None, "why": "no iteration was run", "steady_iterations": 0}
    evicted = float(k["eviction_count"].sum()) / n
    oversized = k[(k["kernel_bytes"] > available_bytes) & (k["eviction_count"] > 0)]
    total_ns = float(k["duration_ns"].sum())
    out: dict[str, Any] = {
        "verdict": "thrashing" if len(oversized) else "paging" if evicted else "fits",
        "steady_iterations": n,
        "evicted_chunks_per_iteration": evicted,
        "refetched_chunks_per_iteration": float(k["refetched_chunks"].sum()) / n,
        "thrashing_kernels_per_iteration": len(oversized) / n,
        "thrashing_time_share": float(oversized["duration_ns"].sum()) / total_ns if total_ns > 0 else None,
        "worst_kernel": _worst(oversized),
    }
    out["why"] = _why(out, available_bytes)
    return out


def _worst(oversized: pd.DataFrame) -> dict[str, Any] | None:
    """The launch with the most own data among those that exceed the memory (the longest of equals)."""
    if oversized.empty:
        return None
    row = oversized.sort_values(["kernel_bytes", "duration_ns"], kind="stable").iloc[-1]
    native = float(row["native_ns"]) if "native_ns" in row else None
    return {
        "name": str(row["name"]),
        "kernel_bytes": int(row["kernel_bytes"]),
        "refetched_chunks": int(row["refetched_chunks"]),
        "evicted_chunks": int(row["eviction_count"]),
        "duration_ns": float(row["duration_ns"]),
        "native_ns": native,
    }


def _why(r: dict[str, Any], available_bytes: int) -> str:
    """One sentence for the run's table."""
    from uvmlab.units import format_bytes

    refetched = r["refetched_chunks_per_iteration"]
    lost = (
        f"; {refetched:,.0f} chunks per iteration were evicted while their kernel still used them" if refetched else ""
    )
    if r["verdict"] == "fits":
        return "nothing is evicted after the first iteration"
    if r["verdict"] == "paging":
        return (
            f"{r['evicted_chunks_per_iteration']:,.0f} chunks evicted per iteration, and every kernel's own data "
            f"fits in the {format_bytes(available_bytes)} UVM has: the cost follows the bytes moved{lost}"
        )
    w = r["worst_kernel"]
    share = r["thrashing_time_share"]
    return (
        f"{r['thrashing_kernels_per_iteration']:,.3g} kernel(s) per iteration need more than the "
        f"{format_bytes(available_bytes)} UVM has (largest: {w['name']}, {format_bytes(w['kernel_bytes'])})"
        + (f", {share:.0%} of the iteration's time" if share is not None else "")
        + f"{lost}. Real GPUs crawl here, and the model's time for such kernels is likely a lower bound "
        "(docs/uvm-sim.md, 'The regime')"
    )


__all__ = ["VERDICTS", "regime", "steady_kernels"]
