"""Summaries of an nsys export: UM fault and migration totals, per-kernel and per-iteration attribution.

Counting rules (reference/nsys.md §0, §2.3, §4):

* GPU faults = Σ ``numberOfPageFaults`` (what NVIDIA's reports count), not rows; ``fault_records`` is the row count.
* CPU faults = ``count(*)`` (one row is one fault).
* Migrations = MEMCPY rows with copyKind 11 (htod), 12 (dtoh), 13 (dtod); bytes from ``bytes``.
* A figure whose source was not collected (or cannot be known) is ``None`` and prints "n/a", never 0
  (status rules in ``uvmlab.nsys.schema``).

Totals by copy kind and cause are aggregated in SQLite; fault totals and per-address sums come from the attribution
pass, which reads the fault table in chunks of ``chunk_rows`` rows (bounded
memory, optionally in worker processes: ``uvmlab.nsys.scan``) and assigns each chunk with
``uvmlab.nsys.attribute.assign``.

Iterations come from NVTX ranges whose text matches ``iteration_pattern`` (default ``iteration N``, as uvmlab's
GPU runner emits). NVTX ranges are CPU-side, so a kernel belongs to the iteration whose range contains the CPU
call that launched it (RUNTIME row with the same correlationId and pid; any thread, since PyTorch launches backward
kernels from the autograd thread); without a correlation, the kernel's own start time is used. An event inside a
kernel takes that kernel's iteration; an event outside kernels takes the iteration whose GPU window (first kernel
start to last kernel end, or the CPU range if it has no kernels) it overlaps. Phases ("forward", "backward",
"optimizer", ...) are attributed to kernels the same way (innermost range).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.nsys import schema as S
from uvmlab.nsys.attribute import assign, group_key
from uvmlab.nsys.read import Export
from uvmlab.nsys.scan import EVENT_COLS, FaultScan, Partial, Router, scan_faults_all, scan_migrations

DEFAULT_ITERATION_PATTERN = r"^\s*iteration[\s_#:-]*(\d+)\s*$"
PHASE_NAMES = ("data", "forward", "loss", "backward", "optimizer", "zero_grad")
TOP_N = 10
CHUNK_ROWS = 250_000  # rows per fetch (and per worker task): bounds the Python row objects alive at once
OUTSIDE = "(outside any kernel)"


def _none_if(status: str, value: Any) -> Any:
    return value if status in ("collected", "zero") else None


@dataclass
class Summary:
    """Everything `uvmlab nsys summarize` prints; ``to_dict()`` is its JSON form."""

    export: dict[str, Any]
    collection: dict[str, dict[str, str]]
    faults: dict[str, Any]
    migrations: dict[str, Any]
    um_total_sum: dict[str, Any]
    um_sum: list[dict[str, Any]]
    attribution: dict[str, Any]
    memory: dict[str, Any]
    iterations: pd.DataFrame
    kernels: pd.DataFrame  # per kernel launch (uvmlab.stats.schema KERNEL_COLUMNS + device/stream/pid)
    top_kernels: pd.DataFrame  # per kernel name, by faults
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def records(df: pd.DataFrame) -> list[dict[str, Any]]:
            return [{k: _py(v) for k, v in r.items()} for r in df.to_dict("records")]

        return {
            "export": self.export,
            "collection": self.collection,
            "faults": self.faults,
            "migrations": self.migrations,
            "um_total_sum": self.um_total_sum,
            "um_sum": self.um_sum,
            "attribution": self.attribution,
            "memory": self.memory,
            "iterations": records(self.iterations),
            "top_kernels": records(self.top_kernels),
            "warnings": self.warnings,
        }


def _py(v: Any) -> Any:
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return None if np.isnan(v) else float(v)
    return v


# -- totals (SQL) --------------------------------------------------------------------------------------------------
def fault_totals(ex: Export, scan: FaultScan | None = None) -> dict[str, Any]:
    """GPU fault totals by access type and CPU fault count (None where not collected).

    Aggregated in SQLite, or taken from ``scan`` (the attribution pass) when given.
    """
    gst, _ = ex.status(S.GPU_FAULTS)
    cst, _ = ex.status(S.CPU_FAULTS)
    by_access = {name: 0 for name in S.ACCESS_TYPE.values()}
    records = addresses = 0
    if scan is not None:
        by_access = dict(scan.by_access)
        records = scan.records
        addresses = len(scan.by_address()) if scan.has_address else None
    elif ex.has(S.GPU_FAULTS):
        acc = ex.col(S.GPU_FAULTS, "faultAccessType", "0")
        for a, n, rows in ex.query(f"SELECT {acc}, sum(numberOfPageFaults), count(*) FROM {S.GPU_FAULTS} GROUP BY 1"):
            by_access[S.ACCESS_TYPE.get(a, "unknown")] += int(n or 0)
            records += int(rows)
        if "address" in ex.columns(S.GPU_FAULTS):
            addresses = int(ex.query(f"SELECT count(DISTINCT address) FROM {S.GPU_FAULTS}")[0][0])
    total = sum(by_access.values())
    cpu = ex.row_count(S.CPU_FAULTS) or 0
    return {
        "gpu_fault_count": _none_if(gst, total),
        "gpu_fault_records": _none_if(gst, records),
        "gpu_fault_distinct_pages": _none_if(gst, addresses),
        "read_fault_count": _none_if(gst, by_access["read"]),
        "write_fault_count": _none_if(gst, by_access["write"]),
        "atomic_fault_count": _none_if(gst, by_access["atomic"]),
        "prefetch_fault_count": _none_if(gst, by_access["prefetch"]),
        "unknown_access_fault_count": _none_if(gst, by_access["unknown"]),
        "cpu_fault_count": _none_if(cst, cpu),
    }


def migration_totals(ex: Export) -> dict[str, Any]:
    """UM migration count and bytes, by direction and by cause (None where unknown)."""
    st, _ = ex.status(S.MEMCPY)
    directions = {d: {"count": 0, "bytes": 0} for d in S.UM_DIRECTION.values()}
    causes = {c: {"count": 0, "bytes": 0} for c in S.MIGRATION_CAUSE.values()}
    by_both: list[dict[str, Any]] = []
    if ex.has(S.MEMCPY):
        cause_col = ex.col(S.MEMCPY, "migrationCause")
        kinds = ",".join(str(k) for k in S.UM_COPY_KINDS)
        for kind, cause, n, b in ex.query(
            f"SELECT copyKind, {cause_col}, count(*), sum(bytes) FROM {S.MEMCPY} "
            f"WHERE copyKind IN ({kinds}) GROUP BY 1, 2 ORDER BY 1, 2"
        ):
            d = S.UM_DIRECTION[int(kind)]
            c = S.MIGRATION_CAUSE.get(cause, "unknown") if cause is not None else "unknown"
            for bucket in (directions[d], causes[c]):
                bucket["count"] += int(n)
                bucket["bytes"] += int(b or 0)
            by_both.append({"direction": d, "cause": c, "count": int(n), "bytes": int(b or 0)})
    total_n = sum(v["count"] for v in directions.values())
    total_b = sum(v["bytes"] for v in directions.values())
    known = st in ("collected", "zero")
    return {
        "count": total_n if known else None,
        "bytes": total_b if known else None,
        "by_direction": directions if known else None,
        "by_cause": causes if known else None,
        "by_direction_and_cause": by_both if known else None,
    }


def um_total_sum(ex: Export, scan: FaultScan | None = None, migrations: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures of NVIDIA's ``um_total_sum`` report (reference/nsys.md §2.3), and whether that report would run.

    NVIDIA's script refuses unless MEMCPY, CPU-fault and GPU-fault tables all exist; uvmlab computes the figures
    anyway and gives None for a source that was not collected.
    """
    missing = [t for t in (S.MEMCPY, S.CPU_FAULTS, S.GPU_FAULTS) if not ex.has(t)]
    f = fault_totals(ex, scan)
    m = migrations if migrations is not None else migration_totals(ex)
    return {
        "nvidia_report_runs": not missing,
        "nvidia_report_refuses_because_missing": missing,
        "total_htod_migration_bytes": None if m["by_direction"] is None else m["by_direction"]["htod"]["bytes"],
        "total_dtoh_migration_bytes": None if m["by_direction"] is None else m["by_direction"]["dtoh"]["bytes"],
        "total_cpu_page_faults": f["cpu_fault_count"],
        "total_gpu_page_faults": f["gpu_fault_count"],
    }


def um_sum_copy_frames(ex: Export) -> list[pd.DataFrame]:
    """um_sum's per-virtualAddress DtoH and HtoD sums (bytes, summed durations) from the copy table."""
    if not (ex.has(S.MEMCPY) and "virtualAddress" in ex.columns(S.MEMCPY)):
        return []
    cols = ["a", "cpu", "gpu", "d2h", "h2d", "dd", "hd"]
    return [
        pd.DataFrame(
            ex.query(
                f'SELECT virtualAddress, 0, 0, sum(bytes), 0, sum("end" - start), 0 FROM {S.MEMCPY} '
                f"WHERE copyKind = {S.COPY_KIND_UVM_DTOH} GROUP BY virtualAddress"
            ),
            columns=cols,
        ),
        pd.DataFrame(
            ex.query(
                f'SELECT virtualAddress, 0, 0, 0, sum(bytes), 0, sum("end" - start) FROM {S.MEMCPY} '
                f"WHERE copyKind = {S.COPY_KIND_UVM_HTOD} GROUP BY virtualAddress"
            ),
            columns=cols,
        ),
    ]


def um_sum(
    ex: Export,
    rows: int = TOP_N,
    gpu_by_address: pd.Series | None = None,
    copy_frames: list[pd.DataFrame] | None = None,
) -> list[dict[str, Any]]:
    """NVIDIA ``um_sum``'s per-address rows: CPU faults, GPU faults, HtoD/DtoH bytes and throughput, top ``rows``.

    Throughput reproduces the report's SQLite integer arithmetic
    ``(dtoh + htod) * (1000000000 / (dur_dtoh + dur_htod))`` (truncated; 0 once the summed duration exceeds 1 s),
    ordered by it descending (nulls last), then by address, as the report does. With ``gpu_by_address`` (from the
    attribution pass) the GPU fault table is not scanned again; ``copy_frames`` are ``um_sum_copy_frames(ex)``.
    """
    parts: list[pd.DataFrame] = []
    cols = ["a", "cpu", "gpu", "d2h", "h2d", "dd", "hd"]

    def frame(sql: str) -> pd.DataFrame:
        return pd.DataFrame(ex.query(sql), columns=cols)

    if ex.has(S.CPU_FAULTS) and "address" in ex.columns(S.CPU_FAULTS):
        parts.append(frame(f"SELECT address, count(*), 0, 0, 0, 0, 0 FROM {S.CPU_FAULTS} GROUP BY address"))
    if gpu_by_address is not None:
        g = gpu_by_address
        parts.append(
            pd.DataFrame({"a": g.index.to_numpy(), "cpu": 0, "gpu": g.to_numpy(), "d2h": 0, "h2d": 0, "dd": 0, "hd": 0})
        )
    elif ex.has(S.GPU_FAULTS) and "address" in ex.columns(S.GPU_FAULTS):
        parts.append(
            frame(f"SELECT address, 0, sum(numberOfPageFaults), 0, 0, 0, 0 FROM {S.GPU_FAULTS} GROUP BY address")
        )
    parts += copy_frames if copy_frames is not None else um_sum_copy_frames(ex)
    parts = [p for p in parts if len(p)]
    if not parts:
        return []
    df = pd.concat(parts, ignore_index=True)
    df = df[df["a"].notna()].astype({c: "int64" for c in cols[1:]}).groupby("a", sort=True).sum()
    dur = df["dd"] + df["hd"]
    thr = pd.Series(pd.NA, index=df.index, dtype="Int64")
    ok = dur > 0
    thr[ok] = (df.loc[ok, "d2h"] + df.loc[ok, "h2d"]) * (1_000_000_000 // dur[ok])
    df["thr"] = thr
    df = df.reset_index().sort_values(["thr", "a"], ascending=[False, True], na_position="last").head(int(rows))
    keys = ("address", "cpu_faults", "gpu_faults", "dtoh_bytes", "htod_bytes", "throughput_bytes_per_s")
    return [
        dict(zip(keys, (_py(v) for v in r), strict=True))
        for r in df[["a", "cpu", "gpu", "d2h", "h2d", "thr"]].itertuples(index=False)
    ]


# -- attribution -----------------------------------------------------------------------------------------------------
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


def _pid_arr(s: pd.Series) -> np.ndarray:
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
    k_pid = _pid_arr(kernels["pid"]) if n_k else np.zeros(0, np.int64)
    k_dev = kernels["device_id"].to_numpy(dtype=np.int64) if n_k else np.zeros(0, np.int64)
    k_grp = group_key(k_pid, k_dev)

    # kernels -> iteration and phase through the CPU time of their launch
    k_iter = np.full(n_k, -1, dtype=np.int64)
    phase = np.array([""] * n_k, dtype=object)
    if n_k and not nvtx.empty:
        cpu_t = _kernel_cpu_time(kernels, api)
        if n_i:
            idx = assign(
                cpu_t,
                cpu_t,
                k_pid,
                its["start_ns"].to_numpy(np.int64),
                its["end_ns"].to_numpy(np.int64),
                _pid_arr(its["pid"]),
            )
            k_iter = np.where(idx >= 0, its["iteration"].to_numpy(np.int64)[np.maximum(idx, 0)], -1)
        ph = nvtx[nvtx["text"].isin(PHASE_NAMES)].reset_index(drop=True)
        if len(ph):
            idx = assign(
                cpu_t,
                cpu_t,
                k_pid,
                ph["start_ns"].to_numpy(np.int64),
                ph["end_ns"].to_numpy(np.int64),
                _pid_arr(ph["pid"]),
            )
            phase = np.where(idx >= 0, ph["text"].to_numpy(object)[np.maximum(idx, 0)], "")

    # iteration windows on the GPU timeline (or the CPU range where an iteration launched no kernel)
    it_s = its["start_ns"].to_numpy(np.int64).copy() if n_i else np.zeros(0, np.int64)
    it_e = its["end_ns"].to_numpy(np.int64).copy() if n_i else np.zeros(0, np.int64)
    it_pid = _pid_arr(its["pid"]) if n_i else np.zeros(0, np.int64)
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
                        _pid_arr(d["pid"]),
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


def memory_summary(ex: Export) -> dict[str, Any]:
    """From CUDA_GPU_MEMORY_USAGE_EVENTS: alloc/free counts, peak live bytes (per device and by memory kind)."""
    st, reason = ex.status(S.MEMORY_USAGE)
    if st not in ("collected", "zero"):
        return {"status": st, "reason": reason, "peak_live_bytes": None}
    mem = ex.memory_usage()
    if mem.empty:
        return {"status": st, "reason": reason, "peak_live_bytes": 0, "allocs": 0, "frees": 0}
    by_kind = {}
    for kind, grp in mem.groupby("mem_kind"):
        live = grp["delta_bytes"].cumsum()
        by_kind[str(kind)] = int(live.max()) if len(live) else 0
    return {
        "status": st,
        "reason": reason,
        "allocs": int((mem["op"] == "alloc").sum()),
        "frees": int((mem["op"] == "free").sum()),
        "pre_capture_allocs": int(((mem["op"] == "alloc") & (mem["time_ns"] == 0)).sum()),
        "peak_live_bytes": int(mem.groupby("device_id")["live_bytes"].max().max()),
        "peak_live_bytes_by_kind": by_kind,
    }


def summarize(
    ex: Export,
    iteration_pattern: str = DEFAULT_ITERATION_PATTERN,
    chunk_rows: int = CHUNK_ROWS,
    progress: Callable[[int], None] | None = None,
) -> Summary:
    """All figures of `uvmlab nsys summarize` for one export; ``progress(rows)`` is called per chunk read."""
    collection = {}
    for key, table in (
        ("gpu_faults", S.GPU_FAULTS),
        ("cpu_faults", S.CPU_FAULTS),
        ("migrations", S.MEMCPY),
        ("memory_usage", S.MEMORY_USAGE),
        ("nvtx", S.NVTX),
    ):
        st, why = ex.status(table)
        collection[key] = {"status": st, "reason": why}
    pre: dict[str, Any] = {}

    def copy_queries() -> None:  # SQL over the copy table, overlapped with the fault scan
        pre["migrations"] = migration_totals(ex)

    kernels, iterations, buckets = attribute(ex, iteration_pattern, chunk_rows, progress, meanwhile=copy_queries)
    mem_known = collection["memory_usage"]["status"] in ("collected", "zero")
    kernels["reserved_bytes"] = reserved_at_kernel_start(kernels, ex.memory_usage()) if mem_known else np.nan
    scan: FaultScan = buckets["fault_scan"]
    return Summary(
        export=ex.describe(),
        collection=collection,
        faults=fault_totals(ex, scan),
        migrations=pre["migrations"],
        um_total_sum=um_total_sum(ex, scan, pre["migrations"]),
        um_sum=um_sum(
            ex,
            gpu_by_address=scan.by_address() if scan.has_address else None,
            copy_frames=[buckets["copy_frame"]] if "virtualAddress" in ex.columns(S.MEMCPY) else [],
        ),
        attribution={
            "kernels": len(kernels),
            "inside_kernels": buckets["inside_kernels"],
            "outside_kernels": buckets["outside"],
        },
        memory=memory_summary(ex),
        iterations=iterations,
        kernels=kernels,
        top_kernels=top_kernels(kernels),
        warnings=list(ex.warnings),
    )
