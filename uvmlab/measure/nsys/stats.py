"""Summaries of an nsys export: UM fault and migration totals, NVIDIA's um_sum/um_total_sum figures, memory use.

Counting rules (reference/nsys.md §0, §2.3, §4):

* GPU faults = Σ ``numberOfPageFaults`` (what NVIDIA's reports count), not rows; ``fault_records`` is the row count.
* CPU faults = ``count(*)`` (one row is one fault).
* Migrations = MEMCPY rows with copyKind 11 (htod), 12 (dtoh), 13 (dtod); bytes from ``bytes``.
* A figure whose source was not collected (or cannot be known) is ``None`` and prints "n/a", never 0
  (status rules in ``uvmlab.measure.nsys.schema``).

Totals by copy kind and cause are aggregated in SQLite; fault totals and per-address sums come from the attribution
pass of ``uvmlab.measure.nsys.kernel_stats`` (per-kernel and per-iteration figures, iteration and phase rules), which
``summarize`` runs once and reuses here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.kernel_stats import (
    CHUNK_ROWS,
    DEFAULT_ITERATION_PATTERN,
    TOP_N,
    attribute,
    reserved_at_kernel_start,
    top_kernels,
)
from uvmlab.measure.nsys.read import Export
from uvmlab.measure.nsys.scan import FaultScan
from uvmlab.stats.schema import cell_value


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
            return [{k: cell_value(v) for k, v in r.items()} for r in df.to_dict("records")]

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


# -- totals (SQL) --------------------------------------------------------------------------------------------------
def fault_totals(ex: Export, scan: FaultScan) -> dict[str, Any]:
    """GPU fault totals by access type (from ``scan``, the attribution pass) and CPU fault count (None where not
    collected)."""
    gst, _ = ex.status(S.GPU_FAULTS)
    cst, _ = ex.status(S.CPU_FAULTS)
    by_access = scan.by_access
    records = scan.records
    addresses = len(scan.by_address()) if scan.has_address else None
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


def um_total_sum(ex: Export, scan: FaultScan, migrations: dict[str, Any]) -> dict[str, Any]:
    """The figures of NVIDIA's ``um_total_sum`` report (reference/nsys.md §2.3), and whether that report would run.

    NVIDIA's script refuses unless MEMCPY, CPU-fault and GPU-fault tables all exist; uvmlab computes the figures
    anyway and gives None for a source that was not collected.
    """
    missing = [t for t in (S.MEMCPY, S.CPU_FAULTS, S.GPU_FAULTS) if not ex.has(t)]
    f = fault_totals(ex, scan)
    m = migrations
    return {
        "nvidia_report_runs": not missing,
        "nvidia_report_refuses_because_missing": missing,
        "total_htod_migration_bytes": None if m["by_direction"] is None else m["by_direction"]["htod"]["bytes"],
        "total_dtoh_migration_bytes": None if m["by_direction"] is None else m["by_direction"]["dtoh"]["bytes"],
        "total_cpu_page_faults": f["cpu_fault_count"],
        "total_gpu_page_faults": f["gpu_fault_count"],
    }


def um_sum(
    ex: Export,
    gpu_by_address: pd.Series | None,
    copy_frames: list[pd.DataFrame],
    rows: int = TOP_N,
) -> list[dict[str, Any]]:
    """NVIDIA ``um_sum``'s per-address rows: CPU faults, GPU faults, HtoD/DtoH bytes and throughput, top ``rows``.

    Throughput reproduces the report's SQLite integer arithmetic
    ``(dtoh + htod) * (1000000000 / (dur_dtoh + dur_htod))`` (truncated; 0 once the summed duration exceeds 1 s),
    ordered by it descending (nulls last), then by address, as the report does. GPU faults per address
    (``gpu_by_address``, None without an address column) and the per-address copy sums (``copy_frames``) come from
    the attribution pass, so neither table is scanned again.
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
    parts += copy_frames
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
        dict(zip(keys, (cell_value(v) for v in r), strict=True))
        for r in df[["a", "cpu", "gpu", "d2h", "h2d", "thr"]].itertuples(index=False)
    ]


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
