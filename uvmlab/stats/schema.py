"""Column contracts of the run-directory tables, shared by simulation (uvmlab.sim) and measurement
(uvmlab.measure.nsys).

Every count is a number of events, every ``*_bytes`` a byte count, every ``*_ns`` nanoseconds.
A figure that was not collected is null (NaN / pd.NA), never 0.

Tables of a run directory (``RunDir.table(name)``):

``iterations``  one row per training iteration
``kernels``     one row per kernel (simulated: one per aten op, see uvmlab.trace.capture; measured: nsys kernels)
``migrations``  optional, one row per migration (measured: nsys; simulated: when requested)
``faults``      optional, one row per fault record (measured: nsys GPU fault records and CPU page faults)
``memory``      optional, memory over time (allocated / reserved / resident bytes at each event)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError

# Fault / migration statistics, used as columns of both `iterations` and `kernels`.
FAULT_COLUMNS: tuple[str, ...] = (
    "fault_count",  # GPU page faults (nsys: sum(numberOfPageFaults); sim: faulted 4 KiB pages, after uTLB merge)
    "read_fault_count",
    "write_fault_count",
    "fault_batch_count",  # driver fault batches serviced (sim only; measured: null)
    "htod_count",  # host-to-device UM migrations (transfers)
    "htod_bytes",
    "dtoh_count",  # device-to-host UM migrations (evictions write back here)
    "dtoh_bytes",
    "eviction_count",  # 2 MiB root chunks evicted (sim only; measured: null)
)

ITERATION_COLUMNS: tuple[str, ...] = (
    "iteration",  # 0-based
    "start_ns",
    "end_ns",
    "duration_ns",
    *FAULT_COLUMNS,
)

KERNEL_COLUMNS: tuple[str, ...] = (
    "kernel_id",  # 0-based in launch order
    "name",
    "iteration",  # -1: outside any iteration
    "phase",  # data, forward, backward, optimizer, zero_grad, or "" when unknown
    "start_ns",
    "end_ns",
    "duration_ns",
    "kernel_bytes",  # bytes of the distinct storages the kernel reads and writes (the study's "memory per kernel")
    "allocated_bytes",  # bytes allocated by the program (live tensors) when the kernel runs
    *FAULT_COLUMNS,
)

MIGRATION_COLUMNS: tuple[str, ...] = (
    "start_ns",
    "end_ns",
    "bytes",
    "direction",  # "htod" | "dtoh"
    "cause",  # "fault" | "prefetch" (speculative) | "eviction" | "user_prefetch" | "unknown"
    "address",
    "kernel_id",  # the kernel it is attributed to, or -1 for "outside any kernel"
    "iteration",
)

FAULT_RECORD_COLUMNS: tuple[str, ...] = (
    "start_ns",
    "end_ns",
    "processor",  # "gpu" | "cpu" (the processor that faulted)
    "access",  # GPU: "read" | "write" | "atomic" | "prefetch" | "unknown"; CPU: "unknown" (nsys records none)
    "fault_count",  # faults in the record (nsys numberOfPageFaults; a CPU fault row is one)
    "address",
    "kernel_id",  # the kernel it is attributed to, or -1
    "iteration",
)

MEMORY_COLUMNS: tuple[str, ...] = (
    "time_ns",
    "allocated_bytes",  # live tensor bytes (program view)
    "reserved_bytes",  # bytes held by the allocator (managed ranges under UVM)
    "resident_bytes",  # bytes resident on the GPU (UVM view; null where unknown)
)

TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "iterations": ITERATION_COLUMNS,
    "kernels": KERNEL_COLUMNS,
    "migrations": MIGRATION_COLUMNS,
    "faults": FAULT_RECORD_COLUMNS,
    "memory": MEMORY_COLUMNS,
}


TIME_COLUMNS = ("start_ns", "end_ns", "duration_ns", "time_ns")
"""float64 on both sides (the simulator's clock is fractional ns; measured int64 ns are exact as float64)."""
NULLABLE_INT_COLUMNS = ("fault_batch_count", "eviction_count", "kernel_bytes", "allocated_bytes", "resident_bytes")
"""Counts and bytes one side cannot give (null in measured runs): nullable Int64 on both sides."""
ID_COLUMNS = ("iteration", "kernel_id")
"""int64 on both sides (-1: outside any iteration / kernel)."""


def conform_dtypes(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the shared dtypes: time columns float64, ids int64, sim-only counts/bytes Int64, phase text."""
    out = df.copy()
    for c in out.columns:
        if c in TIME_COLUMNS:
            out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
        elif c in ID_COLUMNS and out[c].notna().all():
            out[c] = out[c].astype("int64")
        elif c in NULLABLE_INT_COLUMNS:
            num = pd.to_numeric(out[c], errors="coerce")
            out[c] = num.round().astype("Int64") if num.notna().any() else pd.array([pd.NA] * len(num), "Int64")
        elif c == "phase":
            out[c] = out[c].fillna("").astype(str)
    return out


def check_table(name: str, df: pd.DataFrame, source: str = "") -> pd.DataFrame:
    """Raise InputError if ``df`` lacks a column of table ``name``; return it with the contract's columns first
    and the shared dtypes (:func:`conform_dtypes`), so simulated and measured tables line up."""
    want = TABLE_COLUMNS[name]
    missing = [c for c in want if c not in df.columns]
    if missing:
        where = f" in {source}" if source else ""
        raise InputError(f"table {name!r}{where} lacks columns {missing} (uvmlab.stats.schema)")
    extra = [c for c in df.columns if c not in want]
    return conform_dtypes(df[list(want) + extra])


# Scalar keys of result.json shared by simulated and measured runs (docs/result-json.md documents each).
def cell_value(v: Any) -> Any:
    """A table cell as a plain Python value for JSON: numpy integers and floats become int and float, and a figure
    that was not collected (None, NaN, pd.NA) becomes None; anything else is returned unchanged."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float | np.floating) and np.isnan(v):
        return None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


RESULT_KEYS: tuple[str, ...] = (
    "schema_version",
    "mode",  # "sim" | "gpu" | "measured" (imported from an nsys export)
    "outcome",  # "ok" | "oom" | "error"
    "error",  # one sentence, or null
    "workload",
    "pca",  # true: PyTorch caching allocator on; false: PYTORCH_NO_CUDA_MEMORY_CACHING=1
    "oversub",  # requested oversubscription factor (footprint / available)
    "gpu",
    "footprint_bytes",  # peak managed (UVM) bytes the job allocates
    "available_bytes",  # GPU memory UVM may use (footprint / oversub)
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "iterations",
    "iteration_time_ns",  # steady_mean of the iteration durations: after the first (warm-up)
    "total_time_ns",
    "native_time_ns",  # the same job, same PCA setting, without UVM (everything resident); gpu: --baseline
    "slowdown_vs_native",  # iteration_time_ns / native_time_ns
    "native_pca_time_ns",  # the same job all-resident with PCA on (the seed study's reference)
    "slowdown_vs_native_pca",  # iteration_time_ns / native_pca_time_ns
    *FAULT_COLUMNS,  # totals over all iterations
)


RESULT_LABELS: dict[str, str] = {
    "native_time_ns": "native iteration (no UVM, same PCA setting)",
    "slowdown_vs_native": "slowdown vs native (no UVM, same PCA setting)",
    "native_pca_time_ns": "native iteration (no UVM, PCA on)",
    "slowdown_vs_native_pca": "slowdown vs native PCA on (no UVM)",
}
"""What every command and figure calls these result.json keys (run, advise, colocate, report): one name each."""


def steady_mean(values: Any) -> float:
    """The steady-state mean of per-iteration values: the mean over the iterations after the first (warm-up),
    or the one value when there is only one; NaN when there is none. ``iteration_time_ns`` and the native
    references are this mean of their iterations, on the simulated, GPU and measured sides alike."""
    v = np.asarray(values, dtype=float)
    if len(v) > 1:
        v = v[1:]
    return float(np.mean(v)) if len(v) else float("nan")
