"""Where a simulated run's time goes: the time breakdown per kernel and per iteration (issue 41 section 4).
Torch-free.

Every row of the kernels table gets seven columns that add up to its ``duration_ns``:

``compute_ns``
    the kernel's native (all-resident) time (uvmlab.sim.uvm.kernel_class);
``remote_ns``
    the part of a kernel's time its remote accesses add beyond its native time (a remote mapping's reads and writes
    cross the link: ``max(native, link) - native``);
``migration_ns``
    host-to-device transfers of the row (faulted and prefetched pages, and the per-page migration cost), estimated
    from its counters: ``htod_bytes`` in ``htod_count`` transfers of their mean size on the link's transfer curve
    (uvmlab.sim.uvm.timing.transfer_time_ns), plus ``migrate_page_ns`` per migrated page;
``eviction_ns``
    evictions: ``evict_fixed_ns`` per evicted chunk plus the ``dtoh_bytes`` in ``dtoh_count`` transfers, estimated
    the same way;
``fault_stall_ns``
    the rest of the driver's time the row waits for: fault batches (turnaround, fault entries), per-block service,
    first chunks of fresh blocks, zero-fill, the CPU chunks a block's first eviction allocates (on a
    ``cudaMemPrefetchAsync`` row: the API path's block services);
``copy_ns``
    explicit copies (retained ``cudaMemcpy``, ``uvm.memcpy``, the optimizer offload's copies);
``host_ns``
    the host's work and its reads and writes of managed memory (CPU faults, their transfers, zeroing) and API calls
    (``cudaMemAdvise``, stream calls).

The split of a row's driver time (``stall_ns`` times ``1 - fault_overlap``) into migration, eviction and fault stall
is an estimate from the counters (the driver model charges them together): when the estimated transfers exceed the
stall, both are scaled down to it and the fault stall is 0. Per iteration the columns are summed, and ``other_ns``
is the iteration's duration minus their sum: the allocator's ``cudaMallocManaged`` / ``cudaFree`` calls between
kernels, less the time streams overlapped (negative when overlap hides more than the calls take).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from uvmlab.sim.uvm.knobs import PAGE_BYTES
from uvmlab.sim.uvm.timing import CostParams, transfer_bandwidth

BREAKDOWN_COLUMNS = (
    "compute_ns",
    "fault_stall_ns",
    "migration_ns",
    "eviction_ns",
    "remote_ns",
    "copy_ns",
    "host_ns",
)
"""Per-kernel time columns that add up to ``duration_ns`` (module docstring)."""
ITERATION_BREAKDOWN_COLUMNS = (*BREAKDOWN_COLUMNS, "other_ns")
"""Per-iteration time columns: the kernels' sums plus ``other_ns`` (module docstring)."""
HOST_ROWS = ("host_write", "host_read", "host", "host_async", "advise", "event_record", "event_wait", "synchronize")


def _transfers_ns(nbytes: np.ndarray, count: np.ndarray, link: float) -> np.ndarray:
    """Time of ``count`` transfers of ``nbytes / count`` bytes each on the link's transfer curve."""
    mean = np.where(count > 0, nbytes / np.maximum(count, 1), 0.0)
    bw = transfer_bandwidth(np.maximum(mean, 1.0), link)
    return np.where(count > 0, nbytes / bw * 1e9, 0.0)


def kernel_breakdown(kernels: pd.DataFrame, api: Sequence[str], costs: CostParams) -> pd.DataFrame:
    """The :data:`BREAKDOWN_COLUMNS` of every row of a simulated kernels table (``api``: each row's ``api`` value,
    "" for a kernel); ``costs``: the run's, filled for its GPU (``CostParams.for_gpu``)."""
    n = len(kernels)
    api_a = np.array(list(api), dtype=object) if n else np.empty(0, dtype=object)
    dur = kernels["duration_ns"].to_numpy(dtype=float)
    native = kernels["native_ns"].to_numpy(dtype=float)
    stall = kernels["stall_ns"].to_numpy(dtype=float) * (1.0 - costs.fault_overlap)
    is_copy = kernels["is_copy"].to_numpy(dtype=bool)
    link = float(costs.link_bytes_per_s or 1.0)
    htod_b = kernels["htod_bytes"].to_numpy(dtype=float)
    migration = _transfers_ns(htod_b, kernels["htod_count"].to_numpy(dtype=float), link)
    migration += htod_b / PAGE_BYTES * costs.migrate_page_ns
    eviction = _transfers_ns(kernels["dtoh_bytes"].to_numpy(dtype=float), kernels["dtoh_count"].to_numpy(dtype=float),
                             link)  # fmt: skip
    eviction += kernels["eviction_count"].to_numpy(dtype=float) * costs.evict_fixed_ns
    out = {c: np.zeros(n) for c in BREAKDOWN_COLUMNS}
    kernel_rows = (api_a == "") & ~is_copy
    copy_rows = is_copy | (api_a == "memcpy_htod")
    host_rows = np.isin(api_a, HOST_ROWS)
    driver_rows = kernel_rows | (api_a == "prefetch") | (api_a == "memcpy_dtoh")
    # kernels: native, then remote beyond it, then the driver's time
    out["compute_ns"][kernel_rows] = native[kernel_rows]
    out["remote_ns"][kernel_rows] = np.maximum(0.0, dur - native - stall)[kernel_rows]
    out["copy_ns"][api_a == "memcpy_dtoh"] = native[api_a == "memcpy_dtoh"]
    out["copy_ns"][copy_rows] = dur[copy_rows]
    out["host_ns"][host_rows] = dur[host_rows]
    est = migration + eviction
    share = np.where(est > stall, stall / np.where(est > 0, est, 1.0), 1.0)
    mig, ev = migration * share, eviction * share
    out["migration_ns"][driver_rows] = mig[driver_rows]
    out["eviction_ns"][driver_rows] = ev[driver_rows]
    out["fault_stall_ns"][driver_rows] = np.maximum(0.0, stall - mig - ev)[driver_rows]
    frame = pd.DataFrame(out, index=kernels.index)
    rest = dur - frame.sum(axis=1).to_numpy()  # rounding, or a row kind the rules above do not split
    frame["fault_stall_ns"] += np.where(driver_rows, rest, 0.0)
    frame["host_ns"] += np.where(~driver_rows & ~copy_rows & ~host_rows, rest, 0.0)
    return frame


def iteration_breakdown(kernels: pd.DataFrame, iterations: pd.DataFrame) -> pd.DataFrame:
    """Per iteration: the kernels' :data:`BREAKDOWN_COLUMNS` summed, and ``other_ns`` (module docstring)."""
    k = kernels[kernels["iteration"] >= 0]
    sums = k.groupby("iteration")[list(BREAKDOWN_COLUMNS)].sum()
    out = sums.reindex(iterations["iteration"].to_numpy(), fill_value=0.0).reset_index(drop=True)
    out["other_ns"] = iterations["duration_ns"].to_numpy(dtype=float) - out.sum(axis=1).to_numpy()
    return out


__all__ = ["BREAKDOWN_COLUMNS", "ITERATION_BREAKDOWN_COLUMNS", "iteration_breakdown", "kernel_breakdown"]
