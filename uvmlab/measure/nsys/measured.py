"""An nsys export as a measured run directory: the tables of ``uvmlab.stats.schema`` and a result.json.

``to_run_tables(export)`` gives ``iterations``, ``kernels``, ``migrations`` and ``memory`` with the columns the
simulator writes, so ``uvmlab compare`` can line them up, and ``faults`` (one row per fault record: GPU records
by access type, CPU page faults; measured runs only). What an export cannot give is null, never 0:

* ``fault_batch_count`` and ``eviction_count`` (driver batches, 2 MiB root chunks): sim only.
* ``kernel_bytes`` and ``allocated_bytes`` (tensor-level): not in an export. ``reserved_bytes`` is added to the
  kernels table from CUDA_GPU_MEMORY_USAGE_EVENTS where collected (device-side bytes live at kernel start on its
  device; under PyTorch's caching allocator these are the allocator's segments, i.e. "reserved").
* ``memory``: one row per alloc/free event; ``reserved_bytes`` = live device-side bytes, ``allocated_bytes`` and
  ``resident_bytes`` null.
* result.json: ``footprint_bytes`` = peak live managed bytes (memKind 4/6) from the memory-usage table;
  ``peak_reserved_bytes`` = peak live device-side bytes; ``total_time_ns`` = the iterations' span (or, without
  NVTX iterations, first to last GPU activity); ``iteration_time_ns`` = mean duration of iterations after the first
  (the only one if there is one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.rundir import RunDir
from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.attribute import assign, group_key
from uvmlab.measure.nsys.kernel_stats import DEFAULT_ITERATION_PATTERN, pid_array
from uvmlab.measure.nsys.read import Export, open_export
from uvmlab.measure.nsys.stats import Summary, summarize
from uvmlab.stats.schema import RESULT_KEYS, check_table, steady_mean
from uvmlab.uvm.regime import measured_counts, regime

RESULT_SCHEMA_VERSION = 1
MANAGED_KINDS = ("managed", "managed_static")


def _attribute(
    s: np.ndarray, e: np.ndarray, pid: np.ndarray | None, dev: np.ndarray | None, summary: Summary
) -> tuple[np.ndarray, np.ndarray]:
    """(kernel_id, iteration) of each event [s, e]: the kernel it overlaps on its process and device (events
    without a device, CPU faults, go to no kernel), else the iteration window it falls in; -1 where none."""
    k = summary.kernels
    kid = np.full(len(s), -1, dtype=np.int64)
    it = np.full(len(s), -1, dtype=np.int64)
    if len(k) and pid is not None and dev is not None:
        kp = pid_array(k["pid"])
        idx = assign(
            s,
            e,
            group_key(pid, dev),
            k["start_ns"].to_numpy(np.int64),
            k["end_ns"].to_numpy(np.int64),
            group_key(kp, k["device_id"].to_numpy(np.int64)),
        )
        kid = np.where(idx >= 0, k["kernel_id"].to_numpy(np.int64)[np.maximum(idx, 0)], -1)
        it = np.where(idx >= 0, k["iteration"].to_numpy(np.int64)[np.maximum(idx, 0)], -1)
    its = summary.iterations
    o = np.flatnonzero(kid < 0)
    if len(its) and len(o):
        # iteration windows are per process; an export of one training job has one process
        widx = assign(
            s[o],
            e[o],
            np.zeros(len(o), np.int64),
            its["start_ns"].to_numpy(np.int64),
            its["end_ns"].to_numpy(np.int64),
            np.zeros(len(its), np.int64),
        )
        it[o] = np.where(widx >= 0, its["iteration"].to_numpy(np.int64)[np.maximum(widx, 0)], -1)
    return kid, it


def _migrations_table(ex: Export, summary: Summary) -> pd.DataFrame:
    mig = ex.migrations()
    if mig.empty:
        out = pd.DataFrame({c: pd.Series([], dtype="int64") for c in ("start_ns", "end_ns", "bytes", "address")})
        out["direction"] = pd.Series([], dtype=object)
        out["cause"] = pd.Series([], dtype=object)
        out["kernel_id"] = pd.Series([], dtype="int64")
        out["iteration"] = pd.Series([], dtype="int64")
        return check_table("migrations", out)
    s = mig["start_ns"].to_numpy(np.int64)
    e = mig["end_ns"].to_numpy(np.int64)
    kid, it = _attribute(s, e, pid_array(mig["pid"]), mig["device_id"].to_numpy(np.int64), summary)
    out = pd.DataFrame(
        {
            "start_ns": s,
            "end_ns": e,
            "bytes": mig["bytes"].to_numpy(np.int64),
            "direction": mig["direction"].to_numpy(object),
            "cause": mig["cause"].to_numpy(object),
            "address": pd.array(mig["address"], dtype="Int64"),
            "kernel_id": kid,
            "iteration": it,
        }
    )
    return check_table("migrations", out)


def _faults_table(ex: Export, summary: Summary) -> pd.DataFrame:
    """One row per fault record of the export: GPU fault records (``fault_count`` faults each, by access type)
    and CPU page faults (one each; nsys records no access type for them)."""
    gpu = ex.gpu_faults()
    cpu = ex.cpu_faults()
    parts = []
    if len(gpu):
        s = gpu["start_ns"].to_numpy(np.int64)
        e = gpu["end_ns"].to_numpy(np.int64)
        kid, it = _attribute(s, e, pid_array(gpu["pid"]), gpu["device_id"].to_numpy(np.int64), summary)
        parts.append(
            pd.DataFrame(
                {
                    "start_ns": s,
                    "end_ns": e,
                    "processor": "gpu",
                    "access": gpu["access"].to_numpy(object),
                    "fault_count": gpu["fault_count"].to_numpy(np.int64),
                    "address": pd.array(gpu["address"], dtype="Int64"),
                    "kernel_id": kid,
                    "iteration": it,
                }
            )
        )
    if len(cpu):
        s = cpu["start_ns"].to_numpy(np.int64)
        kid, it = _attribute(s, s, None, None, summary)
        parts.append(
            pd.DataFrame(
                {
                    "start_ns": s,
                    "end_ns": s,
                    "processor": "cpu",
                    "access": "unknown",
                    "fault_count": np.ones(len(cpu), np.int64),
                    "address": pd.array(cpu["address"], dtype="Int64"),
                    "kernel_id": kid,
                    "iteration": it,
                }
            )
        )
    if not parts:
        empty = {c: pd.Series([], dtype="int64") for c in ("start_ns", "end_ns", "fault_count", "kernel_id")}
        out = pd.DataFrame({**empty, "iteration": pd.Series([], dtype="int64")})
        out["processor"] = pd.Series([], dtype=object)
        out["access"] = pd.Series([], dtype=object)
        out["address"] = pd.array([], dtype="Int64")
        return check_table("faults", out)
    out = pd.concat(parts, ignore_index=True).sort_values("start_ns", kind="stable").reset_index(drop=True)
    return check_table("faults", out)


def _memory_table(ex: Export) -> pd.DataFrame:
    mem = ex.memory_usage()
    out = pd.DataFrame(
        {
            "time_ns": mem["time_ns"].to_numpy(np.int64) if len(mem) else np.zeros(0, np.int64),
            "allocated_bytes": np.full(len(mem), np.nan),
            "reserved_bytes": mem["live_bytes"].to_numpy(np.int64) if len(mem) else np.zeros(0, np.int64),
            "resident_bytes": np.full(len(mem), np.nan),
        }
    )
    if len(mem):
        out["device_id"] = mem["device_id"].to_numpy()
        out["op"] = mem["op"].to_numpy(object)
        out["mem_kind"] = mem["mem_kind"].to_numpy(object)
        out["bytes"] = mem["bytes"].to_numpy(np.int64)
    return check_table("memory", out)


def to_run_tables(
    ex: Export, iteration_pattern: str = DEFAULT_ITERATION_PATTERN, summary: Summary | None = None
) -> dict[str, pd.DataFrame]:
    """The run-directory tables (uvmlab.stats.schema) of one export."""
    summary = summary or summarize(ex, iteration_pattern)
    memory = _memory_table(ex)
    kernels = summary.kernels  # reserved_bytes: live device-side bytes at kernel start (stats.summarize)
    return {
        "iterations": check_table("iterations", summary.iterations.copy()),
        "kernels": check_table("kernels", kernels),
        "migrations": _migrations_table(ex, summary),
        "faults": _faults_table(ex, summary),
        "memory": memory,
    }


def _gpu_names(ex: Export) -> list[str]:
    if not ex.has("TARGET_INFO_GPU") or "name" not in ex.columns("TARGET_INFO_GPU"):
        return []
    return [str(r[0]) for r in ex.query("SELECT DISTINCT name FROM TARGET_INFO_GPU ORDER BY 1")]


def _gpu_activity_span(ex: Export) -> int | None:
    lo, hi = None, None
    for t in S.GPU_WORK_TABLES:
        if ex.row_count(t):
            a, b = ex.query(f'SELECT min(start), max("end") FROM {t}')[0]
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return None if lo is None else int(hi - lo)


def result_of(ex: Export, summary: Summary, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """result.json of a measured run: the RESULT_KEYS an export can give, the others null."""
    res: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    its = tables["iterations"]
    f, m = summary.faults, summary.migrations
    mem = ex.memory_usage()
    managed = mem[mem["mem_kind"].isin(MANAGED_KINDS)] if len(mem) else mem
    mem_known = summary.memory.get("status") in ("collected", "zero")
    gpus = _gpu_names(ex)
    res.update(
        schema_version=RESULT_SCHEMA_VERSION,
        mode="measured",
        outcome="ok",
        gpu=", ".join(gpus) if gpus else None,
        footprint_bytes=(int(managed["delta_bytes"].cumsum().max()) if len(managed) else 0) if mem_known else None,
        peak_reserved_bytes=summary.memory.get("peak_live_bytes") if mem_known else None,
        iterations=len(its) if len(its) else None,
        iteration_time_ns=steady_mean(its["duration_ns"]) if len(its) else None,
        total_time_ns=int(its["end_ns"].max() - its["start_ns"].min()) if len(its) else _gpu_activity_span(ex),
        fault_count=f["gpu_fault_count"],
        read_fault_count=f["read_fault_count"],
        write_fault_count=f["write_fault_count"],
        fault_batch_count=None,
        htod_count=None if m["by_direction"] is None else m["by_direction"]["htod"]["count"],
        htod_bytes=None if m["by_direction"] is None else m["by_direction"]["htod"]["bytes"],
        dtoh_count=None if m["by_direction"] is None else m["by_direction"]["dtoh"]["count"],
        dtoh_bytes=None if m["by_direction"] is None else m["by_direction"]["dtoh"]["bytes"],
        eviction_count=None,
    )
    collected = m["by_direction"] is not None and len(tables["kernels"])
    res["regime"] = (
        regime(measured_counts(tables["kernels"], tables["migrations"]), None, whole_run=True) if collected else None
    )
    res["nsys"] = {
        "source": str(ex.path),
        "nsys_version": ex.version.nsys_version,
        "schema_version": ex.version.schema_version,
        "collection": summary.collection,
        "cpu_fault_count": f["cpu_fault_count"],
        "migrations_by_cause": m["by_cause"],
        "warnings": list(ex.warnings),
    }
    return res


def import_export(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    force: bool = False,
    iteration_pattern: str = DEFAULT_ITERATION_PATTERN,
    timeline: str | os.PathLike[str] | None = None,
    figure_format: str = "png",
) -> tuple[RunDir, dict[str, Any]]:
    """Write a measured run directory from an nsys export; return it and its result.

    ``timeline``: also write a Chrome trace-event / Perfetto JSON (uvmlab.export.timeline), with the export's
    GPU page-fault records on the faults track. Figures: those of a simulated run (uvmlab.stats.figures),
    in ``figure_format``, where the export has the data.
    """
    rd = RunDir(out, figure_format=figure_format)
    if rd.path.exists() and not rd.path.is_dir():
        raise InputError(f"{rd.path} exists and is not a directory: give a new folder for the run directory")
    if timeline is not None:  # before the export is read: an existing file needs --force (uvmlab.files.outputs)
        from uvmlab.files.outputs import check_output_file

        check_output_file(timeline, [path], force, "--timeline")
    with open_export(path) as ex:
        summary = summarize(ex, iteration_pattern)
        tables = to_run_tables(ex, iteration_pattern, summary)
        result = result_of(ex, summary, tables)
        faults = ex.gpu_faults() if timeline is not None else None
        ranges = ex.nvtx_ranges() if timeline is not None else None
        rd.prepare(force=force)
        rd.write_json(
            rd.config_json,
            {
                "mode": "measured",
                "source": str(Path(path).resolve()),
                "iteration_pattern": iteration_pattern,
            },
        )
        rd.write_json(
            rd.env_json,
            {
                "nsys_version": ex.version.nsys_version,
                "nsys_schema_version": ex.version.schema_version,
                "version_source": ex.version.source,
                "gpus": _gpu_names(ex),
            },
        )
    with rd:  # releases the writer's lock
        for name, df in tables.items():
            rd.write_table(name, df)
        from uvmlab.stats.figures import write_run_figures

        title = f"{Path(path).name} (measured, nsys)"
        missing = {k: v["reason"] for k, v in summary.collection.items() if v["status"] not in ("collected", "zero")}
        write_run_figures(
            rd,
            tables["kernels"],
            tables["iterations"],
            tables["memory"],
            title=title,
            faults=tables["faults"],
            migrations=tables["migrations"],
            missing=missing,
        )
        rd.write_json(rd.result_json, result)
        if timeline is not None:
            from uvmlab.export.timeline import run_timeline

            run_timeline(rd, timeline, faults=faults, ranges=ranges)
    return rd, result
