"""Per-kernel and per-iteration attribution of an nsys export's UM faults and migrations, and the top kernels.

Iterations come from NVTX ranges whose text matches ``iteration_pattern`` (default ``iteration N``, as uvmlab's
GPU runner emits). NVTX ranges are CPU-side, so a kernel belongs to the iteration whose range contains the CPU
call that launched it (RUNTIME row with the same correlationId and pid; any thread, since PyTorch launches backward
kernels from the autograd thread); without a correlation, the kernel's own start time is used. An event inside a
kernel takes that kernel's iteration; an event outside kernels takes the iteration whose GPU window (first kernel
start to last kernel end, or the CPU range if it has no kernels) it overlaps. Phases ("forward", "backward",
"optimizer", ...) are attributed to kernels the same way (innermost range).

The attribution pass reads the fault table in chunks of ``chunk_rows`` rows (bounded memory, optionally in worker
processes: ``uvmlab.measure.nsys.scan``) and assigns each chunk with ``uvmlab.measure.nsys.attribute.assign``. Columns
whose source
was not collected are null, never 0 (status rules in ``uvmlab.measure.nsys.schema``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.attribute import assign, group_key
from uvmlab.measure.nsys.read import Export
from uvmlab.measure.nsys.scan import EVENT_COLS, Partial, Router, scan_faults_all, scan_migrations

DEFAULT_ITERATION_PATTERN = r"^\s*iteration[\s_#:-]*(\d+)\s*$"
PHASE_NAMES = ("data", "forward", "loss", "backward", "optimizer", "zero_grad")
TOP_N = 10
CHUNK_ROWS = 250_000  # rows per fetch (and per worker task): bounds the Python row objects alive at once


def _iteration_ranges(nvtx: pd.DataFrame, pattern: str) -> pd.DataFrame:
    try:
        rx = re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise InputError(f"iteration pattern {pattern!r} is not a valid regular expression ({exc})") from None
    if nvtx.empty:
        return pd.DataFrame(columns=["iteration", "start_ns", "end_ns", "pid"])
    text = nvtx["text"].fillna("").astype(str)
    m = text.str.extract(rx) if rx.groups else None
    hit = text.map(lambda t: rx.search(t) is not None).astype(bool)
    its = nvtx[hit].copy()
    if m is not None:
        its["iteration"] = pd.to_numeric(m[0][hit], errors="coerce")
    else:
        its["iteration"] = np.arange(len(its))
    its = its.dropna(subset=["iteration"]).sort_values("start_ns")
    its["iteration"] = its["iteration"].astype(np.int64)
    return its[["iteration", "start_ns", "end_ns", "pid"]].reset_index(drop=True)


def _kernel_cpu_time(kernels: pd.DataFrame, api: pd.DataFrame) -> np.ndarray:
    """CPU time of each kernel's launch call (by correlationId and pid), else the kernel start."""
    t = kernels["start_ns"].to_numpy(dtype=np.int64).copy()
    if api.empty or kernels.empty or kernels["correlation_id"].isna().all():
        return t
    launches = api.dropna(subset=["correlation_id"])[["pid", "correlation_id", "start_ns"]]
    launches = launches.drop_duplicates(["pid", "correlation_id"])
    k = kernels[["pid", "correlation_id"]].reset_index()
    j = k.merge(launches, on=["pid", "correlation_id"], how="left")
    found = j["start_ns"].notna().to_numpy()
    t[j.loc[found, "index"].to_numpy()] = j.loc[found, "start_ns"].to_numpy(dtype=np.int64)
    return t


def pid_array(s: pd.Series) -> np.ndarray:
    """A nullable pid column as int64 group keys (null -> -1, its own group in ``attribute.group_key``)."""
    return pd.to_numeric(s, errors="coerce").fillna(-1).to_numpy(dtype=np.int64)


def attribute(
    ex: Export,
    iteration_pattern: str = DEFAULT_ITERATION_PATTERN,
    chunk_rows: int = CHUNK_ROWS,
    progress: Callable[[int], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Per-kernel and per-iteration fault/migration statistics, and the outside-any-kernel buckets.

    Returns (kernels, iterations, buckets): ``kernels`` has one row per kernel launch with the columns of
    ``uvmlab.stats.schema.KERNEL_COLUMNS`` (plus pid, device_id, stream_id); ``iterations`` one row per NVTX
    iteration; ``buckets`` = {"inside_kernels": {...}, "outside": {api name or "none": {...}},
    "fault_scan": FaultScan}.
    """
    kernels = ex.kernels()
    api = ex.api_calls()
    nvtx = ex.nvtx_ranges()
    its = _iteration_ranges(nvtx, iteration_pattern)
    n_k, n_i = len(kernels), len(its)

    k_s = kernels["start_ns"].to_numpy(dtype=np.int64) if n_k else np.zeros(0, np.int64)
    k_e = kernels["end_ns"].to_numpy(dtype=np.int64) if n_k else np.zeros(0, np.int64)
    k_pid = pid_array(kernels["pid"]) if n_k else np.zeros(0, np.int64)
    k_dev = kernels["device_id"].to_numpy(dtype=np.int64) if n_k else np.zeros(0, np.int64)
    k_grp = group_key(k_pid, k_dev)

    # kernels -> iteration and phase through the CPU time of their launch
    k_iter = np.full(n_k, -1, dtype=np.int64)
    phase = np.array([""] * n_k, dtype=object)
    if n_k and not nvtx.empty:
        cpu_t = _kernel_cpu_time(kernels, api)

        def launch_range(ranges: pd.DataFrame) -> np.ndarray:  # innermost range holding each launch, or -1
            s, e = ranges["start_ns"].to_numpy(np.int64), ranges["end_ns"].to_numpy(np.int64)
            return assign(cpu_t, cpu_t, k_pid, s, e, pid_array(ranges["pid"]))

        if n_i:
            idx = launch_range(its)
            k_iter = np.where(idx >= 0, its["iteration"].to_numpy(np.int64)[np.maximum(idx, 0)], -1)
        ph = nvtx[nvtx["text"].isin(PHASE_NAMES)].reset_index(drop=True)
        if len(ph):
            idx = launch_range(ph)
            phase = np.where(idx >= 0, ph["text"].to_numpy(object)[np.maximum(idx, 0)], "")

    # iteration windows on the GPU timeline (or the CPU range where an iteration launched no kernel)
    it_s = its["start_ns"].to_numpy(np.int64).copy() if n_i else np.zeros(0, np.int64)
    it_e = its["end_ns"].to_numpy(np.int64).copy() if n_i else np.zeros(0, np.int64)
    it_pid = pid_array(its["pid"]) if n_i else np.zeros(0, np.int64)
    it_pos = {int(v): p for p, v in enumerate(its["iteration"])} if n_i else {}
    if n_i and n_k:
        kdf = pd.DataFrame({"it": k_iter, "s": k_s, "e": k_e})
        win = kdf[kdf["it"] >= 0].groupby("it").agg(s=("s", "min"), e=("e", "max"))
        for it, row in win.iterrows():
            p = it_pos.get(int(it))
            if p is not None:
                it_s[p], it_e[p] = int(row["s"]), int(row["e"])
    # kernel index -> iteration position
    k_itpos = np.array([it_pos.get(int(v), -1) for v in k_iter], dtype=np.int64)

    # API calls for the outside bucket: runtime calls first, then driver calls
    api_sets = []
    if not api.empty:
        ec = pd.to_numeric(api["event_class"], errors="coerce")
        for d in (api[ec == S.EVENT_CLASS_RUNTIME], api[ec != S.EVENT_CLASS_RUNTIME]):
            if len(d):
                api_sets.append(
                    (
                        d["start_ns"].to_numpy(np.int64),
                        d["end_ns"].to_numpy(np.int64),
                        pid_array(d["pid"]),
                        d["name"].to_numpy(object),
                    )
                )
    router = Router(k_s, k_e, k_grp, k_itpos, it_s, it_e, it_pid, api_sets)
    acc = Partial.empty(router, has_address="address" in ex.columns(S.GPU_FAULTS))
    migrations = Partial.empty(router)

    def scan_copies() -> None:  # in this process, while worker processes read the fault table
        if ex.has(S.MEMCPY):
            scan_migrations(ex, router, migrations, chunk_rows, progress)
        if meanwhile is not None:
            meanwhile()

    scan_faults_all(ex, router, acc, chunk_rows, progress, meanwhile=scan_copies)
    acc.merge(migrations)
    outside = acc.outside
    scan = acc.scan

    kdf = _kernel_table(kernels, k_iter, phase, acc, ex)
    idf = _iteration_table(its, it_s, it_e, acc, ex)
    inside = {c: int(acc.k[c][1:].sum()) for c in EVENT_COLS}
    buckets = {
        "inside_kernels": inside,
        "outside": dict(sorted(outside.items(), key=lambda kv: -kv[1]["fault_records"])),
        "fault_scan": scan,
        "copy_frame": acc.copy_frame(),
    }
    return kdf, idf, buckets


def _statused(ex: Export, df: pd.DataFrame) -> pd.DataFrame:
    """Null the columns whose source was not collected."""
    gst, _ = ex.status(S.GPU_FAULTS)
    mst, _ = ex.status(S.MEMCPY)
    for c in ("fault_count", "read_fault_count", "write_fault_count", "fault_records"):
        if gst not in ("collected", "zero"):
            df[c] = pd.array([pd.NA] * len(df), dtype="Int64")
    for c in ("htod_count", "htod_bytes", "dtoh_count", "dtoh_bytes"):
        if mst not in ("collected", "zero"):
            df[c] = pd.array([pd.NA] * len(df), dtype="Int64")
    for c in ("fault_batch_count", "eviction_count"):  # not observable in an export (sim only)
        df[c] = pd.array([pd.NA] * len(df), dtype="Int64")
    return df


def _kernel_table(
    kernels: pd.DataFrame, k_iter: np.ndarray, phase: np.ndarray, acc: Partial, ex: Export
) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "kernel_id": kernels["kernel_id"].to_numpy(np.int64) if len(kernels) else np.zeros(0, np.int64),
            "name": kernels["name"].astype(str).to_numpy() if len(kernels) else np.zeros(0, dtype=object),
            "iteration": k_iter,
            "phase": phase.astype(str) if len(phase) else np.zeros(0, dtype=object),
            "start_ns": kernels["start_ns"].to_numpy(np.int64) if len(kernels) else np.zeros(0, np.int64),
            "end_ns": kernels["end_ns"].to_numpy(np.int64) if len(kernels) else np.zeros(0, np.int64),
        }
    )
    df["duration_ns"] = df["end_ns"] - df["start_ns"]
    df["kernel_bytes"] = np.nan  # not observable in an nsys export
    df["allocated_bytes"] = np.nan  # tensor-level bytes are not in an export; see reserved_bytes
    for c in EVENT_COLS:
        df[c] = acc.k[c][1:]
    df = _statused(ex, df)
    if len(kernels):
        df["pid"] = kernels["pid"].to_numpy()
        df["device_id"] = kernels["device_id"].to_numpy()
        df["stream_id"] = kernels["stream_id"].to_numpy()
    else:
        df["pid"] = df["device_id"] = df["stream_id"] = np.zeros(0, np.int64)
    return df


def _iteration_table(its: pd.DataFrame, it_s: np.ndarray, it_e: np.ndarray, acc: Partial, ex: Export) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "iteration": its["iteration"].to_numpy(np.int64) if len(its) else np.zeros(0, np.int64),
            "start_ns": it_s,
            "end_ns": it_e,
        }
    )
    df["duration_ns"] = df["end_ns"] - df["start_ns"]
    for c in EVENT_COLS:
        df[c] = acc.i[c][1:]
    return _statused(ex, df)


def reserved_at_kernel_start(kernels: pd.DataFrame, memory: pd.DataFrame) -> np.ndarray:
    """Live device-side bytes (CUDA_GPU_MEMORY_USAGE_EVENTS) on each kernel's device when it starts; NaN where the
    device has no memory events."""
    out = np.full(len(kernels), np.nan)
    if memory.empty or kernels.empty:
        return out
    k_dev = kernels["device_id"].to_numpy()
    k_s = kernels["start_ns"].to_numpy(np.int64)
    for dev, grp in memory.groupby("device_id", sort=False):
        m = k_dev == dev
        t = grp["time_ns"].to_numpy(np.int64)
        live = grp["live_bytes"].to_numpy(np.int64)
        pos = np.searchsorted(t, k_s[m], side="right") - 1
        out[m] = np.where(pos >= 0, live[np.maximum(pos, 0)], 0)
    return out


def top_kernels(kernels: pd.DataFrame, n: int = TOP_N) -> pd.DataFrame:
    """Per kernel name: launches, total time and fault/migration sums, the ``n`` with most faults first."""
    if kernels.empty:
        return pd.DataFrame(
            columns=["name", "launches", "duration_ns", "fault_count", "htod_bytes", "dtoh_bytes", "max_reserved_bytes"]
        )
    g = (
        kernels.groupby("name", sort=False)
        .agg(
            launches=("kernel_id", "size"),
            duration_ns=("duration_ns", "sum"),
            fault_count=("fault_count", lambda s: s.sum(min_count=1)),
            read_fault_count=("read_fault_count", lambda s: s.sum(min_count=1)),
            write_fault_count=("write_fault_count", lambda s: s.sum(min_count=1)),
            htod_bytes=("htod_bytes", lambda s: s.sum(min_count=1)),
            dtoh_bytes=("dtoh_bytes", lambda s: s.sum(min_count=1)),
            max_reserved_bytes=("reserved_bytes", "max"),
        )
        .reset_index()
    )
    key = g["fault_count"].fillna(-1).astype(float) * 1.0
    g = g.assign(_k=key).sort_values(["_k", "htod_bytes", "name"], ascending=[False, False, True])
    return g.drop(columns="_k").head(n).reset_index(drop=True)
