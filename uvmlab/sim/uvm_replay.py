"""Replay a placed Trace through :class:`~uvmlab.sim.uvm.UvmSim` and produce the run tables. Torch-free.

Input: a Trace (allocations, kernels, accesses; uvmlab.trace.schema) and its Placement by the allocator model
(``uvmlab.sim.placement.place``): ``ranges`` are the managed ranges (PCA on: the segments; PCA off: one per
tensor), ``blocks`` say where each allocation lives. Events are replayed in ``seq`` order:

* a range's ``alloc_seq``: ``cudaMallocManaged`` (``map_range``, cost ``managed_alloc_ns``);
* its ``free_seq``: ``cudaFree`` (``unmap_range``, no DtoH; cost ``cudafree_sync_ns`` + per block);
* a kernel: its accesses, translated to (range, offset) through the placement, go to ``UvmSim.access``;
  a *retained copy* kernel (below) goes to ``UvmSim.memcpy_htod`` instead.

Retained ``cudaMemcpyAsync`` (the seed study kept them, section 3.1): a kernel in phase ``setup`` or ``data``
whose every written allocation is of category ``input`` or ``parameter`` is the host-to-device copy that fills
that tensor on a real run (the capture creates batches and weights directly on the device instead). Its reads are
ignored (the source is host memory).

Time: one serial stream. A kernel lasts its native roofline time (uvmlab.sim.timing) plus ``(1 - fault_overlap)``
times its fault stall; a retained copy lasts its transfer time; allocator API costs sit between kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.gpus import GpuSpec
from uvmlab.sim.timing import CostParams, kernel_time_ns, transfer_time_ns
from uvmlab.sim.uvm import UvmCounters, UvmSim
from uvmlab.sim.uvm_knobs import BIG_PAGE_BYTES, VA_BLOCK_BYTES, UvmKnobs
from uvmlab.stats.schema import FAULT_COLUMNS, ITERATION_COLUMNS, KERNEL_COLUMNS, MEMORY_COLUMNS
from uvmlab.trace.schema import NEVER_FREED, Trace

COPY_PHASES = ("setup", "data")
COPY_CATEGORIES = ("input", "parameter")


class PlacementLike(Protocol):
    """What the replay needs from ``uvmlab.sim.placement.Placement``."""

    blocks: pd.DataFrame  # alloc_id, address, block_bytes, range_id
    ranges: pd.DataFrame  # range_id, address, size_bytes, alloc_seq, free_seq


def managed_chunk_bytes(size_bytes: np.ndarray | int) -> np.ndarray:
    """GPU capacity a managed range of ``size_bytes`` takes when fully resident (uvmlab.sim.uvm's chunk rule)."""
    size = np.asarray(size_bytes, dtype=np.int64)
    full = size // VA_BLOCK_BYTES
    tail = size - full * VA_BLOCK_BYTES
    return full * VA_BLOCK_BYTES + -(-tail // BIG_PAGE_BYTES) * BIG_PAGE_BYTES


def peak_managed_bytes(ranges: pd.DataFrame) -> int:
    """Peak over time of the chunk-rounded bytes of live managed ranges: the footprint UVM must hold."""
    if ranges.empty:
        return 0
    chunk = managed_chunk_bytes(ranges["size_bytes"].to_numpy())
    seqs = np.concatenate([ranges["alloc_seq"].to_numpy(), ranges["free_seq"].to_numpy()])
    delta = np.concatenate([chunk, -chunk])
    keep = seqs != NEVER_FREED
    keep[: len(chunk)] = True
    seqs, delta = seqs[keep], delta[keep]
    order = np.lexsort((delta, seqs))  # at equal seq, frees (negative) first
    return int(np.cumsum(delta[order]).max(initial=0))


@dataclass
class ReplayResult:
    """Tables and totals of one simulated run."""

    kernels: pd.DataFrame
    iterations: pd.DataFrame
    memory: pd.DataFrame
    totals: UvmCounters
    baseline_iteration_ns: float
    total_time_ns: float
    peak_resident_bytes: int
    skipped_accesses: int = 0
    api_calls: dict[str, int] = field(default_factory=dict)


def copy_kernels(trace: Trace) -> np.ndarray:
    """kernel_ids (int64, ascending) of the trace's retained host-to-device copy kernels.

    A kernel in phase ``setup`` or ``data`` (COPY_PHASES) whose every written allocation is of category ``input``
    or ``parameter`` (COPY_CATEGORIES) stands for the ``cudaMemcpyAsync`` that fills that tensor on a real run
    (see the module docstring). The replay (and ``uvmlab.colocate``) simulate these as copies, not kernels.
    """
    k, acc, al = trace.kernels, trace.accesses, trace.allocations
    cand = k.loc[k["phase"].isin(COPY_PHASES), "kernel_id"]
    if cand.empty:
        return np.empty(0, dtype=np.int64)
    w = acc[acc["is_write"] & acc["kernel_id"].isin(cand)].merge(al[["alloc_id", "category"]], on="alloc_id")
    if w.empty:
        return np.empty(0, dtype=np.int64)
    ok = w.assign(c=w["category"].isin(COPY_CATEGORIES)).groupby("kernel_id")["c"].all()
    return ok[ok].index.to_numpy(dtype=np.int64)


def replay(
    trace: Trace,
    placement: PlacementLike,
    capacity_bytes: int,
    gpu: GpuSpec,
    knobs: UvmKnobs | None = None,
    costs: CostParams | None = None,
    dtype: str = "fp32",
    progress: Callable[[int, int], None] | None = None,
    check_every: int = 0,
) -> ReplayResult:
    """Simulate the trace under UVM with ``capacity_bytes`` of GPU memory; return the run tables."""
    costs = (costs or CostParams()).for_gpu(gpu)
    sim = UvmSim(capacity_bytes, knobs, costs, gpu)
    kern = trace.kernels.sort_values("seq", kind="stable").reset_index(drop=True)
    ranges = placement.ranges
    blocks = placement.blocks[["alloc_id", "range_id", "address"]]
    missing_cols = {"range_id", "address", "size_bytes", "alloc_seq", "free_seq"} - set(ranges.columns)
    if missing_cols:
        raise InputError(f"placement ranges lack columns {sorted(missing_cols)}")

    # accesses -> (kernel, range, offset in range, size, is_write)
    acc = trace.accesses[trace.accesses["size_bytes"] > 0]
    acc = acc.merge(blocks, on="alloc_id", how="left")
    skipped = int(acc["range_id"].isna().sum())
    acc = acc.dropna(subset=["range_id"])
    acc = acc.merge(ranges[["range_id", "address"]].rename(columns={"address": "range_address"}), on="range_id")
    acc = acc.assign(
        range_id=acc["range_id"].astype(np.int64),
        roff=(acc["address"] - acc["range_address"] + acc["offset_bytes"]).astype(np.int64),
    ).sort_values(["kernel_id"], kind="stable")
    acc_kid = acc["kernel_id"].to_numpy()
    acc_rows = list(
        zip(
            acc["range_id"].tolist(),
            acc["roff"].tolist(),
            acc["size_bytes"].tolist(),
            acc["is_write"].tolist(),
            strict=True,
        )
    )

    # per-kernel static columns
    sizes = trace.allocations.set_index("alloc_id")["size_bytes"]
    distinct = trace.accesses.drop_duplicates(["kernel_id", "alloc_id"])
    kbytes = (
        distinct.assign(b=distinct["alloc_id"].map(sizes).fillna(0).astype(np.int64)).groupby("kernel_id")["b"].sum()
    )
    touched = trace.accesses.groupby("kernel_id")["size_bytes"].sum()
    kid = kern["kernel_id"].to_numpy()
    kernel_bytes = kbytes.reindex(kid, fill_value=0).to_numpy(dtype=np.int64)
    touched_b = touched.reindex(kid, fill_value=0).to_numpy(dtype=float)
    if "touched_bytes" in kern.columns:  # optional: DRAM bytes a gather/scatter really moves (uvm_gcn)
        given = kern["touched_bytes"].to_numpy(dtype=float)
        touched_b = np.where(np.isfinite(given), given, touched_b)
    native_ns = kernel_time_ns(kern["flops"].to_numpy(dtype=float), touched_b, gpu, costs, dtype)
    live = trace.live_bytes()
    live_seq = live.index.to_numpy()
    live_val = live.to_numpy()
    pos = np.searchsorted(live_seq, kern["seq"].to_numpy(), side="right") - 1
    allocated_bytes = np.where(pos >= 0, live_val[np.clip(pos, 0, None)], 0).astype(np.int64)
    is_copy = np.isin(kid, copy_kernels(trace))
    kapi = kern["api"].fillna("").tolist() if "api" in kern.columns else [""] * len(kern)
    """Optional kernels column ``api``: "" (a kernel), "prefetch" (cudaMemPrefetchAsync of the accessed ranges
    to the GPU) or "host_write" (the CPU writes them): what a workload can say besides kernels (issue 11 item 4)."""

    # allocator events (map/unmap), in seq order
    r_id = ranges["range_id"].to_numpy(dtype=np.int64)
    r_size = ranges["size_bytes"].to_numpy(dtype=np.int64)
    ev_seq = np.concatenate([ranges["alloc_seq"].to_numpy(), ranges["free_seq"].to_numpy()])
    ev_kind = np.concatenate([np.ones(len(ranges), dtype=np.int8), np.zeros(len(ranges), dtype=np.int8)])
    ev_idx = np.concatenate([np.arange(len(ranges)), np.arange(len(ranges))])
    keep = ev_seq != NEVER_FREED
    ev_seq, ev_kind, ev_idx = ev_seq[keep], ev_kind[keep], ev_idx[keep]
    order = np.lexsort((ev_kind, ev_seq))  # frees before maps at the same seq
    ev_seq, ev_kind, ev_idx = ev_seq[order].tolist(), ev_kind[order].tolist(), ev_idx[order].tolist()

    n = len(kern)
    starts = np.zeros(n)
    ends = np.zeros(n)
    cols = {c: np.zeros(n, dtype=np.int64) for c in FAULT_COLUMNS}
    extra = {
        c: np.zeros(n, dtype=np.float64)
        for c in (
            "zero_fill_bytes",
            "fault_htod_bytes",
            "prefetch_htod_bytes",
            "memcpy_htod_bytes",
            "raw_fault_entries",
            "stall_ns",
        )
    }
    reserved = np.zeros(n, dtype=np.int64)
    resident = np.zeros(n, dtype=np.int64)
    kseq = kern["seq"].to_numpy().tolist()
    bounds = np.searchsorted(acc_kid, kid, side="left"), np.searchsorted(acc_kid, kid, side="right")
    lo_b, hi_b = bounds[0].tolist(), bounds[1].tolist()
    overlap = 1.0 - costs.fault_overlap
    link = float(costs.link_bytes_per_s)  # filled from the GPU by for_gpu above
    t = 0.0
    e = 0
    n_ev = len(ev_seq)
    mapped: set[int] = set()
    api = {"cudaMallocManaged": 0, "cudaFree": 0}
    for i in range(n):
        while e < n_ev and ev_seq[e] < kseq[i]:
            j = ev_idx[e]
            if ev_kind[e]:
                sim.map_range(int(r_id[j]), int(r_size[j]))
                mapped.add(int(r_id[j]))
                t += costs.managed_alloc_ns
                api["cudaMallocManaged"] += 1
            else:
                nb = sim.unmap_range(int(r_id[j]))
                mapped.discard(int(r_id[j]))
                t += costs.cudafree_sync_ns + nb * costs.range_destroy_block_ns
                api["cudaFree"] += 1
            e += 1
        rows = [r for r in acc_rows[lo_b[i] : hi_b[i]] if r[0] in mapped]
        skipped += (hi_b[i] - lo_b[i]) - len(rows)
        if kapi[i] == "prefetch":  # cudaMemPrefetchAsync issued by the workload (e.g. uvmlab.sim.uvm_gcn)
            c = UvmCounters()
            for r in rows:
                c.add(sim.prefetch(r[0], r[1], r[2]))
            dur = c.stall_ns
            native_ns[i] = 0.0
        elif kapi[i] == "host_write":  # the CPU writes the range before kernels use it
            for r in rows:
                sim.host_write(r[0], r[1], r[2])
            c = UvmCounters()
            dur = 0.0
            native_ns[i] = 0.0
        elif is_copy[i]:
            c = UvmCounters()
            for r in rows:
                if r[3]:
                    c.add(sim.memcpy_htod(r[0], r[1], r[2]))
            copy_native = transfer_time_ns(np.array([r[2] for r in rows if r[3]]), link)
            native_ns[i] = copy_native if c.memcpy_htod_count else native_ns[i]
            dur = c.stall_ns if c.memcpy_htod_count else float(native_ns[i])
        else:
            c = sim.access(rows)
            dur = float(native_ns[i]) + overlap * c.stall_ns
        starts[i] = t
        t += dur
        ends[i] = t
        for col in FAULT_COLUMNS:
            cols[col][i] = getattr(c, col)
        for col in extra:
            extra[col][i] = getattr(c, col)
        reserved[i] = sim.mapped_bytes
        resident[i] = sim.used_bytes
        if check_every and i % check_every == 0:
            sim.check_invariants()
        if progress is not None and (i % 256 == 0 or i == n - 1):
            progress(i + 1, n)
    sim.check_invariants()

    kernels = pd.DataFrame(
        {
            "kernel_id": kid,
            "name": kern["name"].to_numpy(),
            "iteration": kern["iteration"].to_numpy(),
            "phase": kern["phase"].to_numpy(),
            "start_ns": starts,
            "end_ns": ends,
            "duration_ns": ends - starts,
            "kernel_bytes": kernel_bytes,
            "allocated_bytes": allocated_bytes,
            **cols,
            **extra,
            "native_ns": native_ns,
            "is_copy": is_copy,
            "resident_bytes": resident,
        }
    )[[*KERNEL_COLUMNS, *extra, "native_ns", "is_copy", "resident_bytes"]]
    memory = pd.DataFrame(
        {
            "time_ns": starts,
            "allocated_bytes": allocated_bytes,
            "reserved_bytes": reserved,
            "resident_bytes": resident,
            "kernel_id": kid,
            "iteration": kern["iteration"].to_numpy(),
        }
    )[[*MEMORY_COLUMNS, "kernel_id", "iteration"]]
    iterations, baseline = _iterations(kernels, native_ns)
    return ReplayResult(
        kernels=kernels,
        iterations=iterations,
        memory=memory,
        totals=sim.totals,
        baseline_iteration_ns=baseline,
        total_time_ns=t,
        peak_resident_bytes=sim.peak_used_bytes,
        skipped_accesses=skipped,
        api_calls=api,
    )


def _iterations(kernels: pd.DataFrame, native_ns: np.ndarray) -> tuple[pd.DataFrame, float]:
    """Per-iteration rows; iteration i ends with its last kernel and starts where iteration i-1 (or setup) ended."""
    k = kernels
    its = sorted(int(x) for x in k["iteration"].unique() if x >= 0)
    rows: list[dict[str, Any]] = []
    base: list[float] = []
    prev_end = float(k.loc[k["iteration"] < 0, "end_ns"].max()) if (k["iteration"] < 0).any() else 0.0
    base_ns = native_ns  # copies: their transfer time; kernels: their roofline time
    for it in its:
        sel = (k["iteration"] == it).to_numpy()
        end = float(k.loc[sel, "end_ns"].max())
        row: dict[str, Any] = {"iteration": it, "start_ns": prev_end, "end_ns": end, "duration_ns": end - prev_end}
        for col in FAULT_COLUMNS:
            row[col] = int(k.loc[sel, col].sum())
        for col in ("zero_fill_bytes", "memcpy_htod_bytes", "stall_ns"):
            row[col] = float(k.loc[sel, col].sum())
        row["baseline_ns"] = float(base_ns[sel].sum())
        base.append(row["baseline_ns"])
        rows.append(row)
        prev_end = end
    cols = [*ITERATION_COLUMNS, "zero_fill_bytes", "memcpy_htod_bytes", "stall_ns", "baseline_ns"]
    df = pd.DataFrame(rows, columns=cols)
    steady = base[1:] if len(base) > 1 else base
    return df, float(np.mean(steady)) if steady else float("nan")
