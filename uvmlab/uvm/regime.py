"""The run's regime: does the job fit, page, or thrash? (result.json ``regime``; docs/uvm-sim.md "The regime").

Read from the simulated kernels of the steady iterations (those after the first, as every steady figure is; the
only one if there is one), with no threshold of its own:

* ``fits``: no chunk is evicted. After the first iteration everything the job touches stays on the GPU.
* ``paging``: chunks are evicted, but no kernel allocates again a chunk it evicted itself. What one kernel evicts,
  only later kernels need: the cost follows the bytes each iteration moves.
* ``thrashing``: some kernel allocates again chunks it evicted itself in the same launch (``refetched_chunks``,
  ``UvmSim.one_kernel``). LRM eviction took blocks the kernel's in-flight warps still needed (issue 41's
  mechanism): the kernel's own data does not fit, or it fits but its blocks are old on the LRM list (GPU accesses
  do not refresh the order, only migrations do) while other data fills the GPU. The cost then grows with the
  chunks lost, not with the kernel's bytes; ``thrashing_time_share`` says how much of the iteration it holds.

Measured runs (``uvmlab nsys import``) get the same verdict from their UM migration records
(:func:`measured_counts`): a 2 MiB block migrated to the host with cause eviction during a kernel is an evicted
chunk, and one migrated back to the GPU later in the same kernel a refetched chunk. Without iteration ranges in the
export, its kernels are read as one steady period.

Whatever the verdict, kernels can also crawl without evicting anything: ``read_only_write_faults_per_iteration``
counts the steady writes that fault on resident pages the GPU maps read-only (read-mostly memory the GPU writes:
every written page faults at every launch, uvmlab.sim.uvm.advice), and ``read_only_fault_time_share`` the share of
the iteration in kernels that take them; the sentence says so where there are any (a run that "fits" can be 10,000x
slower than native this way: docs/uvm-sim.md "cudaMemAdvise").

A GEMM replayed as several passes is one kernel. ``largest_kernel``: the launch with the most own data
(``kernel_bytes``, the distinct storages it touches: the study's "memory per kernel"), to set against the memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from uvmlab.sim.uvm.knobs import VA_BLOCK_BYTES
from uvmlab.units import format_bytes

VERDICTS = ("fits", "paging", "thrashing")


def steady_kernels(kernels: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The kernels of the steady iterations (after the first; the only one if there is one) and how many."""
    its = sorted(int(i) for i in kernels["iteration"].unique() if i >= 0)
    if not its:
        return kernels.iloc[0:0], 0
    steady = its[1:] or its
    return kernels[kernels["iteration"].isin(steady)], len(steady)


def measured_counts(kernels: pd.DataFrame, migrations: pd.DataFrame) -> pd.DataFrame:
    """``kernels`` (a measured run's table) with ``eviction_count`` and ``refetched_chunks`` counted from its UM
    ``migrations`` (columns ``kernel_id``, ``start_ns``, ``direction``, ``cause``, ``address``). Per kernel and 2 MiB
    block, in time order: a DtoH record of cause ``eviction`` evicts the block unless the record before it already
    did (a chunk's several runs are one eviction), and an HtoD record right after an eviction is a refetch.
    Records without an address or outside kernels are left out. APPROXIMATION: the kernel of a record is the one its
    time overlaps (uvmlab.measure.nsys attribution), and the block is its address's 2 MiB-aligned one (managed VA
    blocks are 2 MiB-aligned)."""
    m = migrations[(migrations["kernel_id"] >= 0) & migrations["address"].notna()]
    m = m[(m["direction"] == "htod") | (m["cause"] == "eviction")]
    if m.empty:
        return kernels.assign(eviction_count=0, refetched_chunks=0)
    m = m.assign(block=m["address"].astype("int64") // VA_BLOCK_BYTES).sort_values(
        ["kernel_id", "block", "start_ns"], kind="stable"
    )
    out = (m["direction"] != "htod").to_numpy()
    same = (m[["kernel_id", "block"]].to_numpy()[1:] == m[["kernel_id", "block"]].to_numpy()[:-1]).all(axis=1)
    prev_out = np.concatenate(([False], same & out[:-1]))  # the record before, of the same kernel and block, evicted
    kid = m["kernel_id"].to_numpy()
    ids = kernels["kernel_id"].to_numpy()
    counts = {
        name: pd.Series(kid[hit]).value_counts().reindex(ids, fill_value=0).to_numpy(np.int64)
        for name, hit in (("eviction_count", out & ~prev_out), ("refetched_chunks", ~out & prev_out))
    }
    return kernels.assign(**counts)


def regime(kernels: pd.DataFrame, available_bytes: int | None, whole_run: bool = False) -> dict[str, Any]:
    """result.json ``regime`` from the kernels table (columns ``iteration``, ``name``, ``duration_ns``,
    ``eviction_count``, ``refetched_chunks``; ``native_ns``, ``kernel_bytes`` where known) and the bytes UVM had
    (None: unknown). ``whole_run``: without iterations, every kernel is one steady period (a measured export)."""
    k, n = steady_kernels(kernels)
    last = int(kernels["iteration"].max()) if len(kernels) else -1
    period = "after the first iteration" if last >= 1 else "in its one iteration"
    if n == 0 and whole_run and len(kernels):
        k, n, period = kernels, 1, "in the whole run (no iteration ranges)"
    if n == 0:
        return {"verdict": None, "why": "no iteration was run", "steady_iterations": 0}
    evicted = float(k["eviction_count"].sum()) / n
    thrashing = k[k["refetched_chunks"] > 0]
    total_ns = float(k["duration_ns"].sum())
    ro = k["read_only_write_faults"] if "read_only_write_faults" in k.columns else pd.Series(0, index=k.index)
    read_only = k[ro > 0]
    out: dict[str, Any] = {
        "verdict": "thrashing" if len(thrashing) else "paging" if evicted else "fits",
        "steady_iterations": n,
        "period": period,
        "evicted_chunks_per_iteration": evicted,
        "refetched_chunks_per_iteration": float(k["refetched_chunks"].sum()) / n,
        "thrashing_kernels_per_iteration": len(thrashing) / n,
        "thrashing_time_share": float(thrashing["duration_ns"].sum()) / total_ns if total_ns > 0 else None,
        "worst_kernel": _launch(thrashing, "refetched_chunks"),
        "largest_kernel": _launch(k, "kernel_bytes"),
        "read_only_write_faults_per_iteration": float(ro.sum()) / n,
        "read_only_fault_time_share": float(read_only["duration_ns"].sum()) / total_ns if total_ns > 0 else None,
    }
    out["why"] = _why(out, available_bytes)
    return out


def label(verdict: Any, share: Any = None) -> str | None:
    """The verdict as tables show it: ``thrashing (24%)`` (with the time share), ``paging``, ``fits``; None for a
    run without a regime (measured, or written before it existed)."""
    if not isinstance(verdict, str):
        return None
    if verdict == "thrashing" and isinstance(share, float) and share == share:
        return f"{verdict} ({share:.0%})"
    return verdict


def label_of(reg: dict[str, Any] | None) -> str | None:
    """:func:`label` of a result.json ``regime`` (None for a run without one)."""
    reg = reg or {}
    return label(reg.get("verdict"), reg.get("thrashing_time_share"))


def _launch(rows: pd.DataFrame, most: str) -> dict[str, Any] | None:
    """The launch of ``rows`` with the most ``most`` (the longest of equals), None when there is none."""
    if rows.empty:
        return None
    if most not in rows.columns or rows[most].isna().all():
        return None
    row = rows.sort_values([most, "duration_ns"], kind="stable").iloc[-1]
    return {
        "name": str(row["name"]),
        "kernel_bytes": _known(row.get("kernel_bytes"), int),
        "refetched_chunks": int(row["refetched_chunks"]),
        "evicted_chunks": int(row["eviction_count"]),
        "duration_ns": float(row["duration_ns"]),
        "native_ns": _known(row.get("native_ns"), float),
    }


def _known(value: Any, kind: type) -> Any:
    """``kind(value)``, or None for a value the table does not have (a measured run's)."""
    return None if value is None or pd.isna(value) else kind(value)


def _why(r: dict[str, Any], available_bytes: int | None) -> str:
    """One sentence for the run's table: the verdict's, and the read-only write faults where there are any."""
    ro, share = r["read_only_write_faults_per_iteration"], r["read_only_fault_time_share"]
    if not ro:
        return _verdict_why(r, available_bytes)
    return (
        f"{_verdict_why(r, available_bytes)}; and {ro:,.0f} writes per iteration fault on pages the GPU maps "
        f"read-only (read-mostly memory the GPU writes), in kernels holding {share:.0%} of its time: they run at "
        "fault speed, not native (docs/uvm-sim.md, 'cudaMemAdvise')"
    )


def _verdict_why(r: dict[str, Any], available_bytes: int | None) -> str:
    """The verdict's part of :func:`_why`."""
    big = r["largest_kernel"]
    has = f"the {format_bytes(available_bytes)} UVM has" if available_bytes else "the memory UVM has"
    largest = (
        f"; the largest kernel, {big['name']}, touches {format_bytes(big['kernel_bytes'])} against {has}" if big else ""
    )
    if r["verdict"] == "fits":
        return f"nothing is evicted {r['period']}{largest}"
    if r["verdict"] == "paging":
        return (
            f"{r['evicted_chunks_per_iteration']:,.0f} chunks evicted per iteration, none needed again by the kernel "
            f"that evicted it: the cost follows the bytes moved{largest}"
        )
    w, share = r["worst_kernel"], r["thrashing_time_share"]
    return (
        f"{r['thrashing_kernels_per_iteration']:,.3g} kernel(s) per iteration"
        + (f", {share:.0%} of its time," if share is not None else "")
        + f" evict chunks they still need and fault them back ({r['refetched_chunks_per_iteration']:,.0f} of "
        f"{r['evicted_chunks_per_iteration']:,.0f} evicted chunks per iteration; most: {w['name']}, "
        f"{w['refetched_chunks']:,} in one launch{largest}). Real GPUs crawl where this dominates, and the "
        "model's time is least certain here (docs/uvm-sim.md, 'The regime')"
    )


__all__ = ["VERDICTS", "label", "label_of", "measured_counts", "regime", "steady_kernels"]
