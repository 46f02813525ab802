"""Replay a placed Trace through :class:`~uvmlab.sim.uvm.driver.UvmSim` and produce the run tables. Torch-free.

Input: a Trace (allocations, kernels, accesses; uvmlab.trace.schema) and its Placement by the allocator model
(``uvmlab.sim.allocator.placement.place``): ``ranges`` are the managed ranges (PCA on: the segments; PCA off: one per
tensor), ``blocks`` say where each allocation lives. Events are replayed in ``seq`` order:

* a range's ``alloc_seq``: ``cudaMallocManaged`` (``map_range``, cost ``managed_alloc_ns``);
* its ``free_seq``: ``cudaFree`` (``unmap_range``, no DtoH; cost ``cudafree_sync_ns`` + per block);
* a kernel: its accesses, translated to (range, offset) through the placement, go to ``UvmSim.access``;
  a *retained copy* kernel (below) goes to ``UvmSim.memcpy_htod`` instead.

Retained ``cudaMemcpyAsync`` (the seed study kept them, section 3.1): a kernel in phase ``setup`` or ``data``
whose every written allocation is of category ``input`` or ``parameter`` is the host-to-device copy that fills
that tensor on a real run (the capture creates batches and weights directly on the device instead). Its reads are
ignored (the source is host memory).

Time: one serial stream. A kernel lasts its native roofline time (uvmlab.sim.uvm.timing) plus ``(1 - fault_overlap)``
times its fault stall; a retained copy lasts its transfer time; allocator API costs sit between kernels.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.gpus import DEFAULT_DRIVER, GpuSpec, driver_major
from uvmlab.sim.uvm.advice import ADVICE, remote_ns
from uvmlab.sim.uvm.breakdown import BREAKDOWN_COLUMNS, iteration_breakdown, kernel_breakdown
from uvmlab.sim.uvm.concurrent import Launch
from uvmlab.sim.uvm.cuda_streams import BARRIER_API, STREAM_API, TRANSFER_API, StreamClocks
from uvmlab.sim.uvm.driver import UvmCounters, UvmSim
from uvmlab.sim.uvm.hints import DISCARD_CALL_NS, HintPlan, plan_hints, prefetch_rows, split_rows
from uvmlab.sim.uvm.kernel_class import GEMM_NATIVE_OPS, native_times, work_of
from uvmlab.sim.uvm.knobs import VA_BLOCK_BYTES, UvmKnobs, rounded_range_bytes
from uvmlab.sim.uvm.l2_reuse import l2_relaunches
from uvmlab.sim.uvm.occupancy import ELEM_BYTES, is_foreach, op_launches, sm_count, windows_fit
from uvmlab.sim.uvm.order import (
    SECTOR_BYTES,
    STREAM_ORDERS,
    STREAM_PLAN_ORDERS,
    OrderPlan,
    auto_scale,
    index_touched_bytes,
    plan_orders,
    scale_rows,
    scaled_bytes,
    stream_kernel,
    strided_sector_bytes,
)
from uvmlab.sim.uvm.reread import BATCHED_GEMM_OPS, CTAS_PER_SM, GEMM_OPS, gemm_passes, mm_operands, occupancy
from uvmlab.sim.uvm.tile_order import TileOrders
from uvmlab.sim.uvm.timing import CostParams, transfer_time_ns
from uvmlab.stats.schema import FAULT_COLUMNS, ITERATION_COLUMNS, KERNEL_COLUMNS, MEMORY_COLUMNS, steady_mean
from uvmlab.trace.orchestrate import op_base
from uvmlab.trace.schema import NEVER_FREED, Trace

COPY_PHASES = ("setup", "data")
HOST_API = ("prefetch", "advise", "host_write", "host_read")
"""``api`` values that are CUDA API calls or host accesses between kernels, not kernels (IFACE24.md)."""
API_NAMES = {
    "prefetch": "cudaMemPrefetchAsync",
    "advise": "cudaMemAdvise",
    "host_write": "host_write",
    "host_read": "host_read",
}
"""The ``api_calls`` counter each HOST_API row adds to (result.json)."""
PREFETCH_ARGS = ("", "gpu", "cpu")
COPY_CATEGORIES = ("input", "parameter")


class PlacementLike(Protocol):
    """What the replay needs from ``uvmlab.sim.allocator.placement.Placement``."""

    blocks: pd.DataFrame  # alloc_id, address, block_bytes, range_id
    ranges: pd.DataFrame  # range_id, address, size_bytes, alloc_seq, free_seq


def managed_chunk_bytes(size_bytes: np.ndarray | int) -> np.ndarray:
    """GPU capacity a managed range of ``size_bytes`` takes when fully resident (uvmlab.sim.uvm.driver's chunk rule:
    full 2 MiB blocks plus the last block rounded up as the driver rounds it, ``knobs.rounded_tail_bytes``)."""
    return rounded_range_bytes(size_bytes)


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
    sim_scale: int = 1
    """The scale the replay ran at (uvmlab.sim.uvm.order, ``UvmKnobs.sim_scale``; 1 = exact)."""
    stream_kernels: int = 0
    """Kernels replayed through the stream path (a given or derived access order, not all pages resident)."""
    concurrent_kernels: int = 0
    """Traced ops replayed through the concurrent engine (foreach launches whose window exceeds the GPU)."""
    tiled_kernels: int = 0
    """GEMMs (2-D and batched) faulted in tile order (uvmlab.sim.uvm.tile_order: operands not all resident, layouts
    known)."""
    thrashing: dict[str, int] = field(default_factory=dict)
    """Thrashing detection (uvmlab.sim.uvm.thrashing): pages detected, faults throttled, pages pinned."""
    events: list[tuple] | None = None
    """With ``replay(record_events=True)``: the driver's events (``UvmSim.events``: ``("batch", kind, faults,
    blocks)``, ``("service", ...)``, ``("evict", ...)``, ``("destroy", ...)``), each prefixed by the ``kernel_id``
    of the trace row it happened in (a ``cudaMalloc``/``cudaFree`` between two rows: the next row's); else None.
    In a scaled replay (``sim_scale`` > 1) the events are those of the scaled-down run."""


def copy_kernels(trace: Trace) -> np.ndarray:
    """kernel_ids (int64, ascending) of the trace's retained host-to-device copy kernels.

    A kernel in phase ``setup`` or ``data`` (COPY_PHASES) whose every written allocation is of category ``input``
    or ``parameter`` (COPY_CATEGORIES) stands for the ``cudaMemcpyAsync`` that fills that tensor on a real run
    (see the module docstring). The replay (and ``uvmlab.memory.colocate``) simulate these as copies, not kernels.
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


@dataclass
class _Accesses:
    """Step 1: every kernel's accesses as (range, offset in range, size, is_write), grouped by kernel."""

    rows: list[tuple[int, int, int, bool]]
    lo: list[int]  # rows[lo[i]:hi[i]] belong to kernel i (in seq order)
    hi: list[int]
    skipped: int  # accesses to tensors the placement did not place
    alloc_ids: list[int] = field(default_factory=list)  # the allocation of each row (per-tensor hints)


def translate_accesses(trace: Trace, placement: PlacementLike, kid: np.ndarray) -> _Accesses:
    """Step 1: map each access (alloc, offset) to (managed range, offset in range) through the placement."""
    ranges = placement.ranges
    missing_cols = {"range_id", "address", "size_bytes", "alloc_seq", "free_seq"} - set(ranges.columns)
    if missing_cols:
        raise InputError(f"placement ranges lack columns {sorted(missing_cols)}")
    blocks = placement.blocks[["alloc_id", "range_id", "address"]]
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
    rows = list(
        zip(
            acc["range_id"].tolist(),
            acc["roff"].tolist(),
            acc["size_bytes"].tolist(),
            acc["is_write"].tolist(),
            strict=True,
        )
    )
    lo = np.searchsorted(acc_kid, kid, side="left").tolist()
    hi = np.searchsorted(acc_kid, kid, side="right").tolist()
    return _Accesses(rows, lo, hi, skipped, acc["alloc_id"].astype(np.int64).tolist())


@dataclass
class _KernelStatics:
    """Step 2: per-kernel columns that do not depend on the UVM state."""

    kernel_bytes: np.ndarray  # distinct allocation bytes each kernel touches
    native_ns: np.ndarray  # all-resident roofline time (replaced by the transfer time for retained copies)
    allocated_bytes: np.ndarray  # live requested bytes when the kernel runs
    is_copy: np.ndarray  # retained cudaMemcpyAsync (copy_kernels)
    api: list[str]  # "" | "prefetch" | "host_write" | "host_read" | "advise" | ... (optional trace column ``api``)
    api_arg: list[str] = field(default_factory=list)  # optional column ``api_arg`` (IFACE24.md), "" when absent
    names: list[str] = field(default_factory=list)  # op names (uvm_reread picks the GEMM-like ones)
    flops: np.ndarray = field(default_factory=lambda: np.empty(0))
    remote_scale: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Per kernel: ``touched_bytes`` / accessed bytes when the trace gives ``touched_bytes`` (a strided or gathering
    kernel moves only part of the ranges it accesses), else 1: scales the bytes of its remote accesses."""
    plans: list[OrderPlan | None] = field(default_factory=list)  # access order of each kernel (uvm_order)
    classes: list[str] = field(default_factory=list)  # native-time class of each kernel (uvm_kernel_class)
    streams: list[int] = field(default_factory=list)  # CUDA stream of each row (uvm_cuda_streams); [] = all 0
    device_copy_ns: np.ndarray = field(default_factory=lambda: np.empty(0))  # memcpy_htod into device memory
    layouts: list[str] = field(default_factory=list)  # a GEMM's operand layouts (tile_order); [] = none known
    l2_relaunch: frozenset[int] = frozenset()
    """The kernels timed as relaunches from the L2 (uvmlab.sim.uvm.l2_reuse); the replay takes ``dram_ns`` instead when
    a page it touches is no longer where the GPU maps it (``UvmSim.in_place``)."""
    dram_ns: np.ndarray = field(default_factory=lambda: np.empty(0))  # native times with every byte from DRAM
    dram_classes: list[str] = field(default_factory=list)  # ... and their classes
    is_gemm: list[bool] = field(init=False)  # names[i] is a uvm_reread GEMM op (derived once, not per kernel)
    is_batched: list[bool] = field(init=False)  # names[i] is a batched GEMM (reread.BATCHED_GEMM_OPS)
    is_concurrent: list[bool] = field(init=False)  # names[i] has a launch geometry (uvmlab.sim.uvm.occupancy)

    def __post_init__(self) -> None:
        bases = [op_base(n) for n in self.names]
        self.is_gemm = [b in GEMM_OPS for b in bases]
        self.is_batched = [b in BATCHED_GEMM_OPS for b in bases]
        self.is_concurrent = [is_foreach(b) for b in bases]


def kernel_statics(
    trace: Trace,
    kern: pd.DataFrame,
    gpu: GpuSpec,
    costs: CostParams,
    dtype: str,
    knobs: UvmKnobs | None = None,
    acc: _Accesses | None = None,
) -> _KernelStatics:
    """Step 2: native times, touched bytes, live bytes, copy and API flags of the kernels (in seq order).

    Access orders (uvmlab.sim.uvm.order, given by the optional columns ``order`` ... ``seed`` or derived from the
    op): a gather / scatter without ``touched_bytes`` moves the rows (``order.index_touched_bytes``); a strided
    stream kernel moves lone 32 B sectors (``order.strided_sector_bytes``) at the sector efficiency. ``acc``
    (step 1's rows) is needed for both; without it no order rule changes the native times.

    A GEMM-like kernel too small to fill the GPU computes at its occupancy (``uvmlab.sim.uvm.reread.occupancy``).

    Optional kernels columns: ``touched_bytes`` (DRAM bytes a kernel really moves, for the roofline; e.g. a
    program's declared kernel, workloads.program) and ``api``: "prefetch" (cudaMemPrefetchAsync of the accessed
    ranges to the GPU) or "host_write" (the CPU writes them) - what a workload can say besides kernels.
    """
    kid = kern["kernel_id"].to_numpy()
    sizes = trace.allocations.set_index("alloc_id")["size_bytes"]
    distinct = trace.accesses.drop_duplicates(["kernel_id", "alloc_id"])
    kbytes = (
        distinct.assign(b=distinct["alloc_id"].map(sizes).fillna(0).astype(np.int64)).groupby("kernel_id")["b"].sum()
    )
    touched = trace.accesses.groupby("kernel_id")["size_bytes"].sum()
    touched_b = touched.reindex(kid, fill_value=0).to_numpy(dtype=float)
    remote_scale = np.ones(len(kern))
    if "touched_bytes" in kern.columns:
        given = kern["touched_bytes"].to_numpy(dtype=float)
        ok = np.isfinite(given) & (touched_b > 0)
        remote_scale = np.where(ok, given / np.where(touched_b > 0, touched_b, 1.0), 1.0)
        touched_b = np.where(np.isfinite(given), given, touched_b)
    written = trace.accesses[trace.accesses["is_write"]].groupby("kernel_id")["size_bytes"].sum()
    names = kern["name"].astype(str).tolist()
    flops = kern["flops"].to_numpy(dtype=float)
    gemm = np.array([op_base(n) in GEMM_NATIVE_OPS for n in names], dtype=bool)
    occ = occupancy(flops, written.reindex(kid, fill_value=0).to_numpy(dtype=float), gemm, dtype, gpu)
    plans = plan_orders(kern, gpu, knobs or UvmKnobs(), trace.header.get("kernel_indices"))
    sector = _order_bytes(plans, acc, touched_b, remote_scale, kern)
    api = kern["api"].fillna("").tolist() if "api" in kern.columns else [""] * len(kern)
    api_arg = kern["api_arg"].fillna("").astype(str).tolist() if "api_arg" in kern.columns else [""] * len(kern)
    _check_api_rows(api, api_arg)
    is_copy = np.isin(kid, copy_kernels(trace))
    work = work_of(kern, flops, touched_b, occ, sector, plans)
    native_ns, classes = native_times(work, gpu, costs, dtype)
    dram_ns, dram_classes = native_ns.copy(), list(classes)
    relaunch: frozenset[int] = frozenset()
    if acc is not None:
        plain = np.array([not a for a in api], dtype=bool) & ~is_copy
        relaunch = l2_relaunches(
            names, lambda i: acc.rows[acc.lo[i] : acc.hi[i]], touched_b, plain, work.sector | work.index, gpu
        )
        if relaunch:
            l2 = np.zeros(len(kern), dtype=bool)
            l2[list(relaunch)] = True
            native_ns, classes = native_times(replace(work, l2=l2), gpu, costs, dtype)
    live = trace.live_bytes()
    live_seq, live_val = live.index.to_numpy(), live.to_numpy()
    pos = np.searchsorted(live_seq, kern["seq"].to_numpy(), side="right") - 1
    allocated = np.where(pos >= 0, live_val[np.clip(pos, 0, None)], 0).astype(np.int64)
    _transfer_and_host_times(trace, kern, api, native_ns, costs)
    device_copy = np.zeros(len(kern))  # uvm.memcpy_htod into plain device memory: the rows no range holds
    if acc is not None and "memcpy_htod" in api:
        raw = touched.reindex(kid, fill_value=0).to_numpy(dtype=float)
        for i in (j for j, a in enumerate(api) if a == "memcpy_htod"):
            rest = raw[i] - sum(r[2] for r in acc.rows[acc.lo[i] : acc.hi[i]])
            if rest > 0:
                device_copy[i] = transfer_time_ns(np.array([rest]), costs.link_bytes_per_s)
    return _KernelStatics(
        kernel_bytes=kbytes.reindex(kid, fill_value=0).to_numpy(dtype=np.int64),
        native_ns=native_ns,
        allocated_bytes=allocated,
        is_copy=is_copy,
        api=api,
        api_arg=api_arg,
        names=names,
        flops=flops,
        remote_scale=remote_scale,
        plans=plans,
        classes=classes,
        streams=kern["stream"].astype(int).tolist() if "stream" in kern.columns else [],
        device_copy_ns=device_copy,
        layouts=kern["layout"].astype(str).tolist() if "layout" in kern.columns else [],
        l2_relaunch=relaunch,
        dram_ns=dram_ns,
        dram_classes=dram_classes,
    )


def _order_bytes(
    plans: list[OrderPlan | None],
    acc: _Accesses | None,
    touched_b: np.ndarray,
    remote_scale: np.ndarray,
    kern: pd.DataFrame,
) -> np.ndarray:
    """The access-order rules of the native bytes (uvmlab.sim.uvm.order module docstring), in place on
    ``touched_b`` and ``remote_scale``; return the kernels costed at the lone-sector efficiency."""
    sector = np.zeros(len(plans), dtype=bool)
    if acc is None:
        return sector
    given = (
        np.isfinite(kern["touched_bytes"].to_numpy(dtype=float))
        if "touched_bytes" in kern.columns
        else np.zeros(len(plans), dtype=bool)
    )
    for i, p in enumerate(plans):
        if p is None:
            continue
        rows = acc.rows[acc.lo[i] : acc.hi[i]]
        accessed = float(sum(r[2] for r in rows))
        if p.order in ("gather", "scatter"):
            b = None if given[i] else index_touched_bytes(p, rows)
        elif p.stride_bytes >= 2 * SECTOR_BYTES and p.order in STREAM_ORDERS.values():
            sector[i] = True
            b = None if given[i] else strided_sector_bytes(rows, p.stride_bytes)
        else:
            b = None
        if b is not None:
            touched_b[i] = b
            remote_scale[i] = b / accessed if accessed > 0 else 1.0
    return sector


def _check_api_rows(api: list[str], api_arg: list[str]) -> None:
    """Refuse an ``api_arg`` the row's ``api`` cannot take (IFACE24.md), with one sentence."""
    for a, arg in zip(api, api_arg, strict=True):
        if a == "advise" and arg not in ADVICE:
            raise InputError(f"trace kernel with api 'advise' has api_arg {arg!r}; known: {', '.join(ADVICE)}")
        if a == "prefetch" and arg not in PREFETCH_ARGS:
            raise InputError(f"trace kernel with api 'prefetch' has api_arg {arg!r}; it takes 'gpu' or 'cpu'")


def _transfer_and_host_times(
    trace: Trace, kern: pd.DataFrame, api: list[str], native_ns: np.ndarray, costs: CostParams
) -> None:
    """Native times of explicit copies and host work (uvmlab.trace.offload, CPU offload of the optimizer):
    ``memcpy_dtoh`` / ``memcpy_htod`` take the link transfer time of their bytes (one transfer per tensor),
    ``host`` and ``host_async`` its ``host_ns`` column (``host``: the GPU waits for the CPU; ``host_async``: the CPU
    works while the stream goes on, and the next ``memcpy_htod`` waits for it); ``prefetch`` / ``host_write`` API
    calls have none."""
    for i, a in enumerate(api):
        if a in HOST_API:
            native_ns[i] = 0.0
    idx = [i for i, a in enumerate(api) if a in ("memcpy_dtoh", "memcpy_htod", "host", "host_async")]
    if not idx:
        return
    kid = kern["kernel_id"].to_numpy()
    host = kern["host_ns"].to_numpy(dtype=float) if "host_ns" in kern.columns else np.full(len(kern), np.nan)
    acc = trace.accesses
    acc = acc[acc["kernel_id"].isin(kid[idx])]
    sizes = {k: g.to_numpy() for k, g in acc.groupby("kernel_id")["size_bytes"]}
    for i in idx:
        if api[i] in ("host", "host_async"):
            native_ns[i] = host[i] if np.isfinite(host[i]) else 0.0
        else:
            native_ns[i] = transfer_time_ns(sizes.get(kid[i], np.zeros(0)), costs.link_bytes_per_s)


def range_events(ranges: pd.DataFrame) -> list[tuple[int, bool, int, int]]:
    """Step 3: (seq, is_map, range_id, size_bytes) of every cudaMallocManaged / cudaFree, frees first at a seq."""
    r_id = ranges["range_id"].to_numpy(dtype=np.int64)
    r_size = ranges["size_bytes"].to_numpy(dtype=np.int64)
    ev_seq = np.concatenate([ranges["alloc_seq"].to_numpy(), ranges["free_seq"].to_numpy()])
    ev_kind = np.concatenate([np.ones(len(ranges), dtype=np.int8), np.zeros(len(ranges), dtype=np.int8)])
    ev_idx = np.concatenate([np.arange(len(ranges)), np.arange(len(ranges))])
    keep = ev_seq != NEVER_FREED
    ev_seq, ev_kind, ev_idx = ev_seq[keep], ev_kind[keep], ev_idx[keep]
    order = np.lexsort((ev_kind, ev_seq))
    return [
        (int(q), bool(k), int(r_id[j]), int(r_size[j]))
        for q, k, j in zip(ev_seq[order].tolist(), ev_kind[order].tolist(), ev_idx[order].tolist(), strict=True)
    ]


_EXTRA = (
    "zero_fill_bytes",
    "fault_htod_bytes",
    "prefetch_htod_bytes",
    "memcpy_htod_bytes",
    "raw_fault_entries",
    "htod_records",
    "remote_read_bytes",
    "remote_write_bytes",
    "cpu_fault_count",
    "collapse_count",
    "read_only_write_faults",
    "refetched_chunks",
)
_FLOAT_COLUMNS = (*_EXTRA, "stall_ns")
_INTS_OF = operator.attrgetter(*FAULT_COLUMNS)
_FLOATS_OF = operator.attrgetter(*_FLOAT_COLUMNS)


class _Replayer:
    """Step 4: the serial stream. Owns the UvmSim, the clock, the per-kernel output columns and the API counts."""

    def __init__(
        self,
        sim: UvmSim,
        costs: CostParams,
        n: int,
        dtype: str = "fp32",
        gpu_name: str | GpuSpec = "",
        driver: str = "",
    ) -> None:
        self.sim, self.costs = sim, costs
        self.dtype, self.gpu_name = dtype, gpu_name
        self.driver_major = driver_major(driver or DEFAULT_DRIVER)
        self.concurrent_kernels = 0  # traced ops replayed through the concurrent engine (uvmlab.sim.uvm.occupancy)
        self.windows_fit: dict[tuple, bool] = {}  # (op, sizes, writes) -> its launches' windows surely fit
        self.reread_kernels = 0  # kernels replayed as several GEMM passes (uvm_reread)
        self.tiled_kernels = 0  # GEMMs faulted in tile order (uvmlab.sim.uvm.tile_order)
        self.tile_orders = TileOrders(sm_count(gpu_name) * CTAS_PER_SM) if gpu_name else None
        self.t = 0.0
        self.mapped: set[int] = set()
        self.api = {"cudaMallocManaged": 0, "cudaFree": 0}
        self.starts, self.ends = np.zeros(n), np.zeros(n)
        # each kernel's counters as two tuples (FAULT_COLUMNS, _FLOAT_COLUMNS): columns once at the end (``columns``)
        self.ints: list[tuple[int, ...]] = [(0,) * len(FAULT_COLUMNS)] * n
        self.floats: list[tuple[float, ...]] = [(0.0,) * len(_FLOAT_COLUMNS)] * n
        self.reserved = np.zeros(n, dtype=np.int64)
        self.resident = np.zeros(n, dtype=np.int64)
        self.pending = UvmCounters()  # prefetch-on-alloc counters, attributed to the next kernel
        self.hints: HintPlan | None = None  # per-tensor hints (uvmlab.sim.uvm.hints), None when off
        self.host_until = 0.0  # when the CPU work of the last ``host_async`` event ends
        self.hint_pos = 0  # next of ``hints.events``
        self.read_mostly_advised: set[int] = set()  # allocations advised read-mostly so far (``hints``)
        self.scale = sim.scale  # a scaled replay (uvmlab.sim.uvm.order): rows and ranges are already divided
        self.stream_kernels = 0
        self.clocks = StreamClocks()  # per-stream clocks and events (uvm_cuda_streams)
        self.cur = 0  # the stream ``self.t`` belongs to

    def _access(self, i: int, rows: list[tuple[int, int, int, bool]], st: _KernelStatics) -> UvmCounters:
        """A compute kernel's faults: one pass, or the passes of a tiled GEMM whose operands may not stay resident.

        The passes (``uvmlab.sim.uvm.reread``) are used only when the kernel's chunk-rounded bytes exceed the GPU
        memory available to UVM; otherwise none of its pages can be evicted during it and one pass is the same.
        """
        sim = self.sim
        plan = st.plans[i] if st.plans else None
        # fast path: all resident, nothing to order; advised ranges: the per-block path, which models the
        # cudaMemAdvise policies (remote mappings, read duplicates) that the stream path does not
        if plan is not None and plan.streams and rows and not sim.resident(rows) and not sim.advised(rows):
            self.stream_kernels += 1
            native = float(st.native_ns[i]) if sim.knobs.walker_time else 0.0
            return sim.access_streams(stream_kernel(plan, rows, self.gpu_name, self.scale, native))
        if sim.knobs.concurrent_ops and self.scale == 1 and st.is_concurrent[i]:
            c = self._concurrent(i, rows, st)
            if c is not None:
                return c
        if sim.knobs.gemm_rereads and st.is_gemm[i] and sum(r[2] + VA_BLOCK_BYTES for r in rows) > sim.capacity_bytes:
            passes = gemm_passes(st.names[i], rows, float(st.flops[i]), self.dtype, self.gpu_name)
            if passes is not None:
                self.reread_kernels += 1
                c = UvmCounters()
                for p in passes:
                    c.add(sim.access(p))
                return c
        if sim.knobs.gemm_tile_order and st.layouts and st.layouts[i] and self.scale == 1:
            c = self._tiled(i, rows, st)
            if c is not None:
                return c
        return sim.access(rows)

    def _tiled(self, i: int, rows: list[tuple[int, int, int, bool]], st: _KernelStatics) -> UvmCounters | None:
        """A GEMM whose operands are not all resident, faulted in tile order (uvmlab.sim.uvm.tile_order);
        None when it is resident, advised, or its shapes or layouts are not known (address order then)."""
        sim, e = self.sim, ELEM_BYTES.get(self.dtype)
        if self.tile_orders is None or e is None:
            return None
        if sim.resident(rows) or sim.advised(rows):
            return None
        mm, layouts = mm_operands(rows, float(st.flops[i]), e, st.is_batched[i]), st.layouts[i]
        if mm is None or not self.tile_orders.known(mm, layouts, e):
            return None
        self.tiled_kernels += 1
        key = self.tile_orders.schedule_key(mm, layouts, e)
        stages = partial(self.tile_orders.stages, mm, layouts, e, sim.page_gids)  # built only when needed
        return sim.access_in_order(stages, sim.kernel_slots(rows), key)

    def _concurrent(self, i: int, rows: list[tuple[int, int, int, bool]], st: _KernelStatics) -> UvmCounters | None:
        """A traced op with a launch geometry (uvmlab.sim.uvm.occupancy: foreach launches) through the concurrent
        engine when a launch's window exceeds the GPU; None when every window fits (address order then)."""
        sim = self.sim
        op, cap = op_base(st.names[i]), sim.capacity_bytes // VA_BLOCK_BYTES
        key = (op, tuple(r[2] for r in rows), tuple(r[3] for r in rows))
        fits = self.windows_fit.get(key)
        if fits is None:  # the same op over the same tensor sizes comes back every iteration
            fits = self.windows_fit[key] = windows_fit(op, rows, self.dtype, self.gpu_name, self.driver_major, cap)
        if fits or sim.resident(rows) or sim.advised(rows):
            return None
        native = float(st.native_ns[i])
        plans = op_launches(op, rows, self.dtype, self.gpu_name, self.driver_major, sim.range_gids, native, cap)
        if plans is None:
            return None
        self.concurrent_kernels += 1
        launches = []
        for p in plans:
            waves = -(-p.pages.n // p.resident)
            access_ns = p.native_ns / (waves * p.pages.steps) if sim.knobs.walker_time else 0.0
            launches.append((p.pages, Launch(p.resident, p.sms, access_ns)))
        return sim.access_launches(launches, native)

    def range_event(self, is_map: bool, range_id: int, size: int) -> None:
        """cudaMallocManaged (map) or cudaFree (unmap, no DtoH) with their API costs."""
        self._enter(self.cur, barrier=True)  # both calls wait for every stream (uvm_cuda_streams)
        self.sim.now_ns = self.t
        if is_map:
            self.sim.map_range(range_id, size)
            self.mapped.add(range_id)
            self.t += self.costs.managed_alloc_ns
            self.api["cudaMallocManaged"] += 1
            if self.sim.knobs.prefetch_on_alloc:
                c = self.sim.prefetch(range_id, 0, size)
                self.t += c.stall_ns  # the prefetch is synchronous to the stream before the next kernel
                c.stall_ns = 0.0
                self.pending.add(c)
        else:
            nb = self.sim.unmap_range(range_id)
            self.mapped.discard(range_id)
            self.t += self.costs.cudafree_sync_ns + nb * self.costs.range_destroy_block_ns
            self.api["cudaFree"] += 1
        self.clocks.finish(self.cur, self.t, barrier=True)

    def kernel(
        self, i: int, rows: list[tuple[int, int, int, bool]], st: _KernelStatics, ids: list[int] | None = None
    ) -> float:
        """Run kernel ``i`` (or its API call / retained copy), record its columns; return its duration.

        ``ids``: the allocation of each row (needed when per-tensor hints are on, ``self.hints``).
        """
        sim = self.sim
        kind = st.api[i]
        barrier, transfer = kind in BARRIER_API, kind in TRANSFER_API
        self._enter(st.streams[i] if st.streams else 0, barrier)
        if transfer:
            self.t = self.clocks.transfer_start(self.t)
        sim.now_ns = self.t  # the thrashing detector's clock (uvmlab.sim.uvm.thrashing), on the row's own stream
        with sim.one_kernel():  # one kernel however many driver calls it takes (UvmCounters.refetched_chunks)
            c, dur = self._row(i, kind, rows, st, ids)
        if sim.knobs.prefetch_on_alloc or self.hints is not None:
            c.add(self.pending)  # counts only: the prefetch's time is already on the clock
            self.pending = UvmCounters()
        self.starts[i] = self.t
        self.t += dur
        self.ends[i] = self.t
        self.clocks.finish(self.cur, self.t, barrier)
        if transfer:
            self.clocks.transfer_end(self.t)
        self.ints[i] = _INTS_OF(c)
        self.floats[i] = _FLOATS_OF(c)
        self.reserved[i] = sim.mapped_bytes * self.scale
        self.resident[i] = sim.used_bytes * self.scale
        return dur

    def _row(
        self, i: int, kind: str, rows: list[tuple[int, int, int, bool]], st: _KernelStatics, ids: list[int] | None
    ) -> tuple[UvmCounters, float]:
        """Row ``i``'s driver calls by its kind: (its counters, its duration on the stream)."""
        sim = self.sim
        if i in st.l2_relaunch and not sim.in_place(rows):
            st.native_ns[i], st.classes[i] = st.dram_ns[i], st.dram_classes[i]  # pages moved: not in the L2
        if kind in STREAM_API:  # stream calls: no memory, no time of their own
            c, dur = UvmCounters(), 0.0
            if kind == "event_record":
                self.clocks.record(st.api_arg[i], self.t)
            elif kind == "event_wait":
                self.t = self.clocks.wait(st.api_arg[i], self.t)
        elif kind in HOST_API:  # API calls and host accesses between kernels: the stream waits for them
            c = self._api_call(kind, st.api_arg[i], rows)
            dur = c.stall_ns
        elif kind == "host":  # CPU work the GPU waits for (no device memory touched)
            c, dur = UvmCounters(), float(st.native_ns[i])
        elif kind == "host_async":  # CPU work beside the stream: only a later host-to-device copy waits for it
            c, dur = UvmCounters(), 0.0
            self.host_until = max(self.host_until, self.t) + float(st.native_ns[i])
        elif kind == "memcpy_htod":  # explicit HtoD copies into managed memory: pages resident, no faults
            c = UvmCounters()
            for r in rows:
                c.add(sim.memcpy_htod(r[0], r[1], r[2]))
            dur = max(0.0, self.host_until - self.t) + c.stall_ns  # the host buffer must be ready, then transfers
            dur += float(st.device_copy_ns[i]) if len(st.device_copy_ns) else 0.0  # into plain device memory
        elif kind == "memcpy_dtoh":  # explicit DtoH copies: non-resident pages fault in first (approximation)
            c = sim.access(rows)
            dur = float(st.native_ns[i]) + c.stall_ns
        elif st.is_copy[i]:
            c = UvmCounters()
            for r in rows:
                if r[3]:
                    c.add(sim.memcpy_htod(r[0], r[1], r[2]))
            if c.memcpy_htod_count:
                sizes = np.array([r[2] * self.scale for r in rows if r[3]])  # the real sizes in a scaled replay
                st.native_ns[i] = transfer_time_ns(sizes, self.costs.link_bytes_per_s)
                dur = c.stall_ns
            else:
                dur = float(st.native_ns[i])
        elif self.hints is not None:
            c, dur = self._hinted_kernel(i, st, rows, ids or [])
        else:
            c = self._access(i, rows, st)
            lone = bool(st.classes) and st.classes[i] == "sector"
            link = remote_ns(c, self.costs, float(st.remote_scale[i]), lone) if c.remote_bytes else 0.0
            native = max(float(st.native_ns[i]), link)  # remote mappings: the link's time
            dur = native + (1.0 - self.costs.fault_overlap) * c.stall_ns
        return c, dur

    def _enter(self, stream: int, barrier: bool = False) -> None:
        """Make ``self.t`` the start of the next row on ``stream`` (uvm_cuda_streams): what was added to the clock
        since the last row (hints, prefetches ahead) stays on that row's stream."""
        self.clocks.finish(self.cur, self.t)
        self.t = self.clocks.start(stream, barrier)
        self.cur = stream

    def columns(self) -> dict[str, np.ndarray]:
        """The per-kernel counter columns: FAULT_COLUMNS (int64), then the extra ones (float64)."""
        n = len(self.ints)
        ints = np.array(self.ints, dtype=np.int64).reshape(n, len(FAULT_COLUMNS))
        floats = np.array(self.floats, dtype=np.float64).reshape(n, len(_FLOAT_COLUMNS))
        out = {c: np.ascontiguousarray(ints[:, j]) for j, c in enumerate(FAULT_COLUMNS)}
        out.update({c: np.ascontiguousarray(floats[:, j]) for j, c in enumerate(_FLOAT_COLUMNS)})
        return out

    def _api_call(self, kind: str, arg: str, rows: list[tuple[int, int, int, bool]]) -> UvmCounters:
        """One ``api`` row (IFACE24.md): ``prefetch`` (``api_arg`` "gpu" or "" / "cpu"), ``advise`` (``api_arg`` one
        of ``uvmlab.sim.uvm.advice.ADVICE``), ``host_write`` / ``host_read``, on each accessed byte range."""
        sim = self.sim
        c = UvmCounters()
        for r in rows:
            if kind == "prefetch":
                c.add(sim.prefetch(r[0], r[1], r[2], to_cpu=arg == "cpu"))
            elif kind == "advise":
                c.add(sim.advise(r[0], r[1], r[2], arg))
            else:
                c.add(sim.cpu_access(r[0], r[1], r[2], kind == "host_write"))
        name = API_NAMES[kind]
        self.api[name] = self.api.get(name, 0) + len(rows)
        return c

    def _hinted_kernel(
        self, i: int, st: _KernelStatics, rows: list[tuple[int, int, int, bool]], ids: list[int]
    ) -> tuple[UvmCounters, float]:
        """A kernel under per-tensor hints: remote tensors over the link, read-mostly duplicates (uvm_hints); the
        other rows fault as in an unhinted kernel (``_access``: GEMM re-reads included)."""
        native = float(st.native_ns[i])
        sim, h = self.sim, self.hints
        assert h is not None
        rows, ids, remote = split_rows(rows, ids, h.remote_ids)
        link_ns = 0.0
        rc = None
        if remote:
            rc, link_ns = sim.remote_access(remote)
        c = UvmCounters()
        spans = h.read_mostly_spans
        for a in ids if spans else ():  # cudaMemAdvise(SetReadMostly) on each advised tensor before its first kernel
            span = spans.get(a)
            if span is not None and a not in self.read_mostly_advised and span[0] in self.mapped:
                self.read_mostly_advised.add(a)
                c.add(sim.advise(*span, "set_read_mostly"))
                self.api["cudaMemAdvise"] = self.api.get("cudaMemAdvise", 0) + 1
        c.add(self._access(i, rows, st))
        if rc is not None:
            c.add(rc)
        return c, max(native, link_ns) + (1.0 - self.costs.fault_overlap) * c.stall_ns

    def hint_events(self, upto_seq: int) -> None:
        """Apply the discard / undiscard events of the allocator's blocks before ``upto_seq`` (uvm_hints)."""
        h = self.hints
        assert h is not None
        ev = h.events
        while self.hint_pos < len(ev) and ev[self.hint_pos][0] < upto_seq:
            _, kind, rid, off, size = ev[self.hint_pos]
            self.hint_pos += 1
            if rid not in self.mapped:
                continue
            if kind == 1:
                if self.sim.discard(rid, off, size):
                    self.t += DISCARD_CALL_NS
                    self.api["cudaMemDiscardBatchAsync"] = self.api.get("cudaMemDiscardBatchAsync", 0) + 1
            else:  # the new tensor's first touch of still-resident discarded pages: remap faults
                c = self.sim.undiscard(rid, off, size)
                if c.fault_count:
                    self.t += c.stall_ns
                    c.stall_ns = 0.0
                    self.pending.add(c)

    def prefetch_ahead(self, rows: list[tuple[int, int, int, bool]], native: float) -> None:
        """cudaMemPrefetchAsync of a later kernel's rows, issued while the current kernel ran: only the part of
        its time beyond the kernel's native time delays the stream."""
        c = UvmCounters()
        for r in rows:
            c.add(self.sim.prefetch(r[0], r[1], r[2]))
        self.t += max(0.0, c.stall_ns - native)
        c.stall_ns = 0.0
        self.pending.add(c)
        self.api["cudaMemPrefetchAsync"] = self.api.get("cudaMemPrefetchAsync", 0) + len(rows)


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
    record_events: bool = False,
) -> ReplayResult:
    """Simulate the trace under UVM with ``capacity_bytes`` of GPU memory; return the run tables.

    Steps: translate accesses (1), per-kernel statics (2), range events (3), the serial replay (4), tables (5).
    A scaled replay (``knobs.sim_scale``, uvmlab.sim.uvm.order) divides capacity, ranges and rows by the scale.
    ``record_events``: keep the driver's events, each tagged with its kernel (``ReplayResult.events``).
    """
    costs = (costs or CostParams()).for_gpu(gpu)
    knobs = knobs or UvmKnobs()
    tagged: list[tuple] | None = [] if record_events else None
    kern = trace.kernels.sort_values("seq", kind="stable").reset_index(drop=True)
    kid = kern["kernel_id"].to_numpy()
    acc = translate_accesses(trace, placement, kid)
    st = kernel_statics(trace, kern, gpu, costs, dtype, knobs, acc)
    streams = any(p is not None and p.order in STREAM_PLAN_ORDERS for p in st.plans)
    scale = auto_scale(placement.ranges, capacity_bytes, knobs, streams)
    sim = UvmSim(capacity_bytes // scale, knobs, costs, gpu, record_events=record_events)
    sim.scale = scale
    events = range_events(placement.ranges)
    if scale > 1:
        events = [(q, m, r, scaled_bytes(size, scale)) for q, m, r, size in events]
        acc.rows = scale_rows(acc.rows, scale)
    n = len(kern)
    rp = _Replayer(sim, costs, n, dtype, gpu, gpu.driver)
    skipped = acc.skipped
    kseq = kern["seq"].to_numpy().tolist()
    hints = rp.hints = plan_hints(trace, placement.blocks, placement.ranges, sim.knobs) if sim.knobs.any_hint else None
    e = 0
    for i in range(n):
        while e < len(events) and events[e][0] < kseq[i]:
            rp.range_event(*events[e][1:])
            e += 1
        if hints is None:
            rows = [r for r in acc.rows[acc.lo[i] : acc.hi[i]] if r[0] in rp.mapped]
            skipped += (acc.hi[i] - acc.lo[i]) - len(rows)
            rp.kernel(i, rows, st)
        else:
            rp.hint_events(kseq[i])
            seg = range(acc.lo[i], acc.hi[i])
            keep = [j for j in seg if acc.rows[j][0] in rp.mapped]
            skipped += len(seg) - len(keep)
            rp.kernel(i, [acc.rows[j] for j in keep], st, [acc.alloc_ids[j] for j in keep])
            j = i + hints.lookahead
            if hints.lookahead and j < n and not st.is_copy[j] and not st.api[j]:
                if hints.protect_next:  # eviction takes what kernels i+1..i+k do not touch (DeepUM-style)
                    near = [r for m in range(i + 1, j + 1) for r in acc.rows[acc.lo[m] : acc.hi[m]]]
                    sim.protect([r for r in near if r[0] in rp.mapped])
                sl = slice(acc.lo[j], acc.hi[j])
                ahead = prefetch_rows(hints, acc.rows[sl], acc.alloc_ids[sl], kseq[i], rp.mapped)
                if ahead:
                    rp.prefetch_ahead(ahead, float(st.native_ns[i]))
        if tagged is not None and sim.events:
            kid_i = int(kid[i])
            tagged += [(kid_i, *ev) for ev in sim.events]
            sim.events.clear()
        if check_every and i % check_every == 0:
            sim.check_invariants()
        if progress is not None and (i % 256 == 0 or i == n - 1):
            progress(i + 1, n)
    sim.check_invariants()
    rp.clocks.finish(rp.cur, rp.t)
    rp.t = rp.clocks.now()
    res = _result(kern, st, rp, skipped)
    if tagged is not None:
        res.events = tagged
    return res


def _result(kern: pd.DataFrame, st: _KernelStatics, rp: _Replayer, skipped: int) -> ReplayResult:
    """Step 5: the kernels, memory and iterations tables."""
    kid = kern["kernel_id"].to_numpy()
    kernels = pd.DataFrame(
        {
            "kernel_id": kid,
            "name": kern["name"].to_numpy(),
            "iteration": kern["iteration"].to_numpy(),
            "phase": kern["phase"].to_numpy(),
            "start_ns": rp.starts,
            "end_ns": rp.ends,
            "duration_ns": rp.ends - rp.starts,
            "kernel_bytes": st.kernel_bytes,
            "allocated_bytes": st.allocated_bytes,
            **rp.columns(),
            "native_ns": st.native_ns,
            "is_copy": st.is_copy,
            "resident_bytes": rp.resident,
            "kernel_class": st.classes or [""] * len(kid),
        }
    )[[*KERNEL_COLUMNS, *_FLOAT_COLUMNS, "native_ns", "is_copy", "resident_bytes", "kernel_class"]]
    memory = pd.DataFrame(
        {
            "time_ns": rp.starts,
            "allocated_bytes": st.allocated_bytes,
            "reserved_bytes": rp.reserved,
            "resident_bytes": rp.resident,
            "kernel_id": kid,
            "iteration": kern["iteration"].to_numpy(),
        }
    )[[*MEMORY_COLUMNS, "kernel_id", "iteration"]]
    kernels[list(BREAKDOWN_COLUMNS)] = kernel_breakdown(kernels, st.api, rp.costs)
    iterations, baseline = _iterations(kernels, st.native_ns)
    iterations = pd.concat([iterations, iteration_breakdown(kernels, iterations)], axis=1)
    return ReplayResult(
        kernels=kernels,
        iterations=iterations,
        memory=memory,
        totals=rp.sim.totals,
        baseline_iteration_ns=baseline,
        total_time_ns=rp.t,
        peak_resident_bytes=rp.sim.peak_used_bytes * rp.scale,
        skipped_accesses=skipped,
        api_calls=rp.api,
        sim_scale=rp.scale,
        stream_kernels=rp.stream_kernels,
        concurrent_kernels=rp.concurrent_kernels,
        tiled_kernels=rp.tiled_kernels,
        thrashing={
            "thrashing_pages": rp.sim.thrashing_pages_detected,
            "throttled_faults": rp.sim.throttled_faults,
            "pinned_pages": rp.sim.pinned_pages,
        },
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
    return df, steady_mean(base)
