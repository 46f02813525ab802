"""Two run directories side by side: totals, per iteration, per kernel, footprint, with relative errors.

RUN_A is the reference (e.g. the measured run, or PCA on); the relative error of a figure is (B - A) / |A|,
null where either side is null or A is 0 (and B is not). Works for any pair of run directories with the tables
of ``uvmlab.stats.schema`` (simulated, GPU, or measured via ``uvmlab nsys import``).

Kernel matching: simulated kernels are aten ops while measured kernels are CUDA kernels, so names rarely agree.
If at least half of the smaller run's kernel names occur in the other, kernels are matched by (name, occurrence
number of that name); else, if both runs have the same number of kernels, by launch order; else not at all (with a
note saying why).

Like with like: a simulated run's ``fault_count`` is unique faulted pages, Nsight Systems counts raw fault-buffer
entries (docs/uvm-sim.md). When one run is measured (mode gpu or measured) and the other simulated, the fault
rows compare the measured count with the simulator's ``raw_fault_entries`` estimate (totals, per iteration, per
kernel), named so in the table. Different workloads or GPUs give a warning note (the comparison still runs).
Relative errors are fractions in comparison.json and percentages in the printed tables.

Footprint: for each run, the simulated/declared peak managed footprint (result.json ``footprint_bytes``), the peak
of ``memory.reserved_bytes``, and, where the run has a shim allocation log in ``RUN/logs`` (uvmlab.measure.gpu.shim
format, recognised by its header), the log's peak live managed bytes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.inputs import open_input, read_parquet_file
from uvmlab.files.rundir import MAX_TABLE_BYTES, RunDir
from uvmlab.stats.schema import FAULT_COLUMNS, RESULT_KEYS, cell_value
from uvmlab.uvm.regime import label_of as regime_label

NUMERIC_RESULT_KEYS = tuple(
    k for k in RESULT_KEYS if k not in ("schema_version", "mode", "outcome", "error", "workload", "pca", "gpu")
)
PER_ITERATION_COLUMNS = ("duration_ns", *FAULT_COLUMNS)
PER_KERNEL_COLUMNS = ("duration_ns", "fault_count", "htod_bytes", "dtoh_bytes")
NAME_MATCH_SHARE = 0.5


def rel_error(a: Any, b: Any) -> float | None:
    """(b - a) / |a|; None where either is missing, or a is 0 and b is not (0 where both are 0)."""
    if a is None or b is None:
        return None
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return None
    if math.isnan(fa) or math.isnan(fb):
        return None
    if fa == 0:
        return 0.0 if fb == 0 else None
    return (fb - fa) / abs(fa)


@dataclass
class Run:
    """One run directory as read for a comparison."""

    path: Path
    result: dict[str, Any]
    tables: dict[str, pd.DataFrame]

    @property
    def label(self) -> str:
        r = self.result
        parts = [str(r.get("mode") or "?")]
        if r.get("pca") is not None:
            parts.append("pca on" if r["pca"] else "pca off")
        if r.get("oversub") is not None:
            parts.append(f"x{r['oversub']}")
        return f"{self.path.name} ({', '.join(parts)})"


def load_run(path: str | os.PathLike[str]) -> Run:
    """Read result.json and whichever run tables exist."""
    rd = RunDir(path)
    if not rd.path.is_dir():
        raise InputError(f"{rd.path} is not a directory: give a run directory written by uvmlab run or nsys import")
    if not rd.is_complete():
        raise InputError(f"{rd.path} has no result.json: it is not a complete uvmlab run directory")
    result = rd.read_result()
    tables = {}
    for name in ("iterations", "kernels", "migrations", "memory"):
        if rd.table(name).is_file():
            try:
                tables[name] = rd.read_table(name)
            except (OSError, ValueError) as exc:
                raise InputError(f"{rd.table(name)} cannot be read as Parquet ({exc})") from None
    return Run(rd.path, result, tables)


def shim_log_footprint(run_path: Path) -> int | None:
    """Peak live managed bytes from the shim allocation logs in RUN/logs (max over the logs), else from the GPU
    runner's ``shim_allocations`` table, or None if the run has neither."""
    from uvmlab.measure.gpu.shim import (  # numpy/pandas only, no torch
        LOG_MAGIC,
        managed_footprint_bytes,
        read_alloc_log,
    )

    logs = run_path / "logs"
    peaks: list[int] = []
    for p in sorted(logs.rglob("*")) if logs.is_dir() else []:
        if p.is_dir():
            continue
        with open_input(p, MAX_TABLE_BYTES, "a log of a uvmlab GPU run") as fh:
            if fh.read(len(LOG_MAGIC)) != LOG_MAGIC:
                continue
        peaks.append(int(managed_footprint_bytes(read_alloc_log(p))))
    if not peaks:
        peaks = _shim_table_peaks(run_path)
    return max(peaks) if peaks else None


def _shim_table_peaks(run_path: Path) -> list[int]:
    """Per-role peaks from ``tables/shim_allocations.parquet`` (the GPU runner's copy of its shim logs)."""
    table = RunDir(run_path).table("shim_allocations")
    if not (table.exists() or table.is_symlink()):
        return []
    from uvmlab.measure.gpu.shim import managed_footprint_bytes

    df = read_parquet_file(table, MAX_TABLE_BYTES, "a table written by uvmlab")
    groups = df.groupby("role") if "role" in df.columns else [("", df)]
    return [int(managed_footprint_bytes(g)) for _, g in groups]


def footprints(run: Run) -> dict[str, int | None]:
    """The footprint figures of one run (see module docstring)."""
    mem = run.tables.get("memory")
    peak_mem = None
    if mem is not None and len(mem) and "reserved_bytes" in mem and mem["reserved_bytes"].notna().any():
        peak_mem = int(mem["reserved_bytes"].max())
    fp = run.result.get("footprint_bytes")
    return {
        "footprint_bytes (result.json)": None if fp is None else int(fp),
        "peak reserved_bytes (memory table)": peak_mem,
        "peak managed bytes (shim log)": shim_log_footprint(run.path),
    }


def _side_by_side(a: pd.DataFrame, b: pd.DataFrame, key: list[str], cols: tuple[str, ...]) -> pd.DataFrame:
    cols = tuple(c for c in cols if c in a.columns or c in b.columns)
    left = a.reindex(columns=[*key, *cols])
    right = b.reindex(columns=[*key, *cols])
    left = left.assign(_order_a=np.arange(len(left)))
    right = right.assign(_order_b=np.arange(len(right)))
    m = left.merge(right, on=key, how="outer", suffixes=("_a", "_b"))
    m = m.sort_values(["_order_a", "_order_b"], na_position="last").drop(columns=["_order_a", "_order_b"])
    m = m.reset_index(drop=True)
    for c in cols:
        m[f"{c}_rel_error"] = [
            rel_error(cell_value(x), cell_value(y)) for x, y in zip(m[f"{c}_a"], m[f"{c}_b"], strict=True)
        ]
    return m


def match_kernels(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame | None, str]:
    """Per-kernel side-by-side table, and how kernels were matched ("name", "order" or why not)."""
    if a is None or b is None or a.empty or b.empty:
        return None, "per-kernel comparison skipped: a run has no kernels table or no kernels"
    na, nb = set(a["name"].astype(str)), set(b["name"].astype(str))
    share = len(na & nb) / max(1, min(len(na), len(nb)))
    if share >= NAME_MATCH_SHARE:
        a2 = a.assign(occurrence=a.groupby("name").cumcount())
        b2 = b.assign(occurrence=b.groupby("name").cumcount())
        return _side_by_side(a2, b2, ["name", "occurrence"], PER_KERNEL_COLUMNS), "matched by (name, occurrence)"
    if len(a) == len(b):
        a2 = a.assign(position=np.arange(len(a)))
        b2 = b.assign(position=np.arange(len(b)))
        m = _side_by_side(a2.drop(columns=["name"]), b2.drop(columns=["name"]), ["position"], PER_KERNEL_COLUMNS)
        m.insert(1, "name_a", a["name"].to_numpy())
        m.insert(2, "name_b", b["name"].to_numpy())
        return m, "matched by launch order (names differ, counts agree)"
    return None, (
        f"per-kernel comparison skipped: names share {share:.0%} (< {NAME_MATCH_SHARE:.0%}) and kernel counts differ "
        f"({len(a)} vs {len(b)})"
    )


def percent(v: Any) -> str | None:
    """A relative error (fraction) as a percentage with sign, "+12.3 %"; None where it is null."""
    v = cell_value(v)
    return None if v is None else f"{100 * float(v):+,.1f} %"


def _row(cols: list[str], values: Any) -> list[Any]:
    return [percent(v) if c.endswith("_rel_error") else cell_value(v) for c, v in zip(cols, values, strict=True)]


@dataclass
class Comparison:
    """The result of comparing two runs."""

    a: Run
    b: Run
    totals: pd.DataFrame  # figure, a, b, rel_error
    iterations: pd.DataFrame | None
    kernels: pd.DataFrame | None
    kernel_match: str
    footprint: pd.DataFrame  # figure, a, b, rel_error
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def recs(df: pd.DataFrame | None) -> list[dict[str, Any]] | None:
            if df is None:
                return None
            return [{k: cell_value(v) for k, v in r.items()} for r in df.to_dict("records")]

        return {
            "run_a": str(self.a.path),
            "run_b": str(self.b.path),
            "label_a": self.a.label,
            "label_b": self.b.label,
            "totals": recs(self.totals),
            "iterations": recs(self.iterations),
            "kernel_match": self.kernel_match,
            "kernels": recs(self.kernels),
            "footprint": recs(self.footprint),
            "notes": self.notes,
        }

    def tables(self) -> list[tuple[str, list[str], list[list[Any]]]]:
        """Printable tables, complete: totals, footprint, per iteration, per kernel; relative errors in %."""
        out = []
        cols = ["figure", "A", "B", "error (B - A) / |A|"]
        rows = [[r.figure, cell_value(r.a), cell_value(r.b), percent(r.rel_error)] for r in self.totals.itertuples()]
        out.append((f"Totals: A = {self.a.label}, B = {self.b.label}", cols, rows))
        rows = [[r.figure, cell_value(r.a), cell_value(r.b), percent(r.rel_error)] for r in self.footprint.itertuples()]
        out.append(("Footprint (bytes)", cols, rows))
        if self.iterations is not None and len(self.iterations):
            c = ["iteration"]
            for k in ("duration_ns", "fault_count", "htod_bytes", "dtoh_bytes"):
                c += [f"{k}_a", f"{k}_b", f"{k}_rel_error"]
            c = [x for x in c if x in self.iterations.columns]
            body = [_row(c, r) for r in self.iterations[c].itertuples(index=False)]
            out.append(("Per iteration (errors in %)", c, body))
        if self.kernels is not None and len(self.kernels):
            key = [x for x in ("name", "occurrence", "position", "name_a", "name_b") if x in self.kernels.columns]
            c = key + [f"{k}{s}" for k in ("duration_ns", "fault_count") for s in ("_a", "_b", "_rel_error")]
            c = [x for x in c if x in self.kernels.columns]
            body = [_row(c, r) for r in self.kernels[c].itertuples(index=False)]
            out.append((f"Per kernel ({self.kernel_match}; errors in %)", c, body))
        return out


MEASURED_MODES = ("gpu", "measured")
RAW_FAULTS = "raw_fault_entries"
RAW_FAULTS_FIGURE = "fault_count (raw fault entries: measured count vs simulated raw_fault_entries)"


def _gpu_tokens(name: Any) -> set[str]:
    """Words of a GPU name without the vendor: "NVIDIA A100-SXM4-80GB" -> {"a100", "sxm4", "80gb"}."""
    import re

    return {t for t in re.split(r"[^a-z0-9]+", str(name).lower()) if t and t != "nvidia"}


def mismatch_warnings(a: Run, b: Run) -> list[str]:
    """Warnings when A and B are of different workloads or GPUs (where both runs name them).

    GPUs match when the words of one name are all in the other ("A100-80GB" and "NVIDIA A100-SXM4-80GB").
    """
    out = []
    wa, wb = a.result.get("workload"), b.result.get("workload")
    if wa and wb and Path(str(wa)).name != Path(str(wb)).name:
        out.append(f"warning: the runs are of different workloads (A: {wa}, B: {wb}); the errors compare unlike jobs")
    ga, gb = a.result.get("gpu"), b.result.get("gpu")
    if ga and gb:
        ta, tb = _gpu_tokens(ga), _gpu_tokens(gb)
        if not (ta <= tb or tb <= ta):
            out.append(f"warning: the runs are on different GPUs (A: {ga}, B: {gb})")
    return out


def _sim_side(run: Run) -> bool:
    return str(run.result.get("mode")) not in MEASURED_MODES


def _raw_fault_tables(run: Run) -> None:
    """On a simulated run compared with a measured one: fault_count := raw fault entries (kernels, iterations)."""
    k = run.tables.get("kernels")
    if k is None or RAW_FAULTS not in k.columns:
        return
    run.tables["kernels"] = k.assign(fault_count=k[RAW_FAULTS].astype(float))
    its = run.tables.get("iterations")
    if its is not None and "iteration" in k.columns:
        per_it = k.groupby("iteration")[RAW_FAULTS].sum()
        run.tables["iterations"] = its.assign(fault_count=its["iteration"].map(per_it).astype(float))


def _regime_note(ra: Any, rb: Any) -> str | None:
    """One sentence setting the two runs' regimes side by side (docs/uvm-sim.md "The regime"), when both have one."""
    la, lb = regime_label(ra), regime_label(rb)
    if la is None or lb is None:
        return None
    same = "the same regime" if ra["verdict"] == rb["verdict"] else "different regimes"
    return f"regime: A {la}, B {lb} ({same})"


def compare_runs(run_a: str | os.PathLike[str], run_b: str | os.PathLike[str]) -> Comparison:
    """Compare two run directories (A is the reference)."""
    a, b = load_run(run_a), load_run(run_b)
    notes: list[str] = mismatch_warnings(a, b)
    raw = _sim_side(a) != _sim_side(b)  # measured vs simulated: compare raw fault entries on both sides
    if raw:
        sim = a if _sim_side(a) else b
        _raw_fault_tables(sim)
        notes.append(
            "fault_count: the measured side counts raw fault-buffer entries, so the simulated side uses its "
            "raw_fault_entries estimate (not unique pages) in totals, per iteration and per kernel"
        )
    regimes = _regime_note(a.result.get("regime"), b.result.get("regime"))
    if regimes:
        notes.append(regimes)
    rows = []
    for k in NUMERIC_RESULT_KEYS:
        va, vb = a.result.get(k), b.result.get(k)
        if va is None and vb is None:
            continue
        figure = k
        if raw and k == "fault_count":
            # no fallback to unique pages: a run without the estimate shows n/a, never unlike counts
            va = a.result.get(RAW_FAULTS) if _sim_side(a) else va
            vb = b.result.get(RAW_FAULTS) if _sim_side(b) else vb
            figure = RAW_FAULTS_FIGURE
        rows.append({"figure": figure, "a": va, "b": vb, "rel_error": rel_error(va, vb)})
    totals = pd.DataFrame(rows, columns=["figure", "a", "b", "rel_error"])
    ia, ib = a.tables.get("iterations"), b.tables.get("iterations")
    iterations = None
    if ia is not None and ib is not None and len(ia) and len(ib):
        iterations = _side_by_side(ia, ib, ["iteration"], PER_ITERATION_COLUMNS)
    else:
        notes.append("per-iteration comparison skipped: a run has no iterations")
    kernels, how = match_kernels(a.tables.get("kernels"), b.tables.get("kernels"))
    if kernels is None:
        notes.append(how)
    fa, fb = footprints(a), footprints(b)
    fp = pd.DataFrame(
        [{"figure": k, "a": fa[k], "b": fb[k], "rel_error": rel_error(fa[k], fb[k])} for k in fa],
        columns=["figure", "a", "b", "rel_error"],
    )
    return Comparison(a, b, totals, iterations, kernels, how, fp, notes)
