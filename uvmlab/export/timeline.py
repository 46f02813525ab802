"""A run as a Chrome trace-event / Perfetto JSON timeline (opens in ui.perfetto.dev and chrome://tracing).

Format: the JSON Object Format of the Trace Event Format spec (Google, "Trace Event Format", docs.google.com/
document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU): ``{"traceEvents": [...], "displayTimeUnit": "ms",
"otherData": {...}}``; ``ts``/``dur`` in microseconds; complete events (``ph: "X"``) for spans, counter events
(``"C"``) for memory, metadata events (``"M"``: process_name, thread_name, thread_sort_index) naming the tracks.

One process (the GPU), one thread per track:

===================  =========================================================================================
track                simulated run (``uvmlab run``)            / measured run (``nsys import``)
===================  =========================================================================================
iterations           one span per iteration (iterations table)
phases               contiguous kernels of one phase (forward, backward, ...); measured: the export's NVTX
                     ranges (a training script's own annotations), since measured kernels carry no phase
kernels              one span per kernel (kernels table; measured: each CUDA kernel)
UVM faults           sim: per kernel that faulted, a span of its fault-service stall (``stall_ns``) from the
                     kernel's start, args = faults and driver batches (the simulator does not time single
                     batches: an approximation); measured: each GPU page-fault record of the export
HtoD migrations      sim: per kernel, a span over the kernel carrying its HtoD count/bytes; measured: each UM
                     HtoD migration
DtoH migrations      as HtoD, device to host
evictions            sim: per kernel, its evicted 2 MiB chunks; measured: migrations whose cause is eviction
===================  =========================================================================================

Overlapping spans of one track go to extra lanes ("kernels (2)", ...) so no two spans of a thread partially
overlap (Perfetto and chrome://tracing need spans of one thread to nest). Counter tracks ``allocated``,
``reserved``, ``resident`` (MiB) come from the memory table; values that were not collected are left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab import __version__
from uvmlab.files.atomic import atomic_write_text
from uvmlab.files.rundir import RunDir
from uvmlab.units import MiB

PID = 1
TRACKS = ("iterations", "phases", "kernels", "UVM faults", "HtoD migrations", "DtoH migrations", "evictions")
"""Span tracks, top to bottom."""
COUNTERS = {"allocated_bytes": "allocated", "reserved_bytes": "reserved", "resident_bytes": "resident"}
"""Memory-table column -> counter track name (values in MiB)."""
LANE_STRIDE = 100
"""tid = (track index + 1) * LANE_STRIDE + lane."""


def _us(ns: Any) -> np.ndarray:
    return np.asarray(ns, dtype=np.float64) / 1000.0


def _lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Greedy lane per span (spans sorted by start) so that spans of one lane never overlap."""
    lanes = np.zeros(len(start), dtype=np.int64)
    lane_end: list[float] = []
    for i in np.argsort(start, kind="stable"):
        for j, e in enumerate(lane_end):
            if e <= start[i]:
                lanes[i], lane_end[j] = j, end[i]
                break
        else:
            lanes[i] = len(lane_end)
            lane_end.append(end[i])
    return lanes


class _Builder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.threads: dict[int, str] = {}

    def spans(self, track: str, start_ns: Any, end_ns: Any, names: list[str], args: list[dict[str, Any]]) -> None:
        s, e = _us(start_ns), _us(end_ns)
        if not len(s):
            return
        e = np.maximum(e, s)
        lanes = _lanes(s, e)
        base = (TRACKS.index(track) + 1) * LANE_STRIDE
        for i in range(len(s)):
            tid = base + int(lanes[i])
            self.threads.setdefault(tid, track if lanes[i] == 0 else f"{track} ({int(lanes[i]) + 1})")
            ev = {"name": names[i], "cat": track, "ph": "X", "ts": float(s[i]), "dur": float(e[i] - s[i])}
            self.events.append({**ev, "pid": PID, "tid": tid, "args": args[i]})

    def counter(self, name: str, time_ns: Any, values: Any) -> None:
        t, v = _us(time_ns), np.asarray(values, dtype=np.float64)
        ok = ~np.isnan(v) & ~np.isnan(t)
        for ts, val in zip(t[ok].tolist(), (v[ok] / MiB).tolist(), strict=True):
            self.events.append({"name": name, "ph": "C", "ts": ts, "pid": PID, "tid": 0, "args": {"MiB": val}})

    def metadata(self, label: str) -> list[dict[str, Any]]:
        meta = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": label}}]
        for tid, name in sorted(self.threads.items()):
            meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
        return meta


def _records(df: pd.DataFrame, cols: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per-row args of the columns of ``cols`` that ``df`` has, as plain JSON values (NA left out)."""
    have = [c for c in cols if c in df.columns]
    rows = []
    for vals in zip(*(df[c].tolist() for c in have), strict=True) if have else [()] * len(df):
        rows.append({c: _plain(v) for c, v in zip(have, vals, strict=True) if not _missing(v)})
    return rows


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and v != v)


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def _phases(kernels: pd.DataFrame) -> pd.DataFrame:
    """Contiguous runs of kernels with one (iteration, phase): start, end, phase, iteration, kernels."""
    k = kernels[kernels["phase"].fillna("").astype(str) != ""].sort_values("start_ns", kind="stable")
    if k.empty:
        return pd.DataFrame(columns=["start_ns", "end_ns", "phase", "iteration", "kernels"])
    key = k["phase"].astype(str) + "|" + k["iteration"].astype(str)
    run = (key != key.shift()).cumsum()
    g = k.groupby(run, sort=False)
    return pd.DataFrame(
        {
            "start_ns": g["start_ns"].min(),
            "end_ns": g["end_ns"].max(),
            "phase": g["phase"].first(),
            "iteration": g["iteration"].first(),
            "kernels": g.size(),
        }
    )


FAULT_ARGS = ("fault_count", "read_fault_count", "write_fault_count", "fault_batch_count", "kernel_id", "name")


def _sim_uvm(b: _Builder, k: pd.DataFrame) -> None:
    """UVM tracks of a simulated run: per-kernel aggregates (see the module docstring)."""
    f = k[k["fault_count"].fillna(0) > 0]
    stall = f["stall_ns"] if "stall_ns" in f.columns else f["duration_ns"]
    stall = np.minimum(stall.fillna(0).to_numpy(np.float64), f["duration_ns"].to_numpy(np.float64))
    names = [
        f"{int(n):,} faults, {int(bt):,} batches"
        for n, bt in zip(f["fault_count"], f["fault_batch_count"], strict=True)
    ]
    b.spans("UVM faults", f["start_ns"], f["start_ns"].to_numpy(np.float64) + stall, names, _records(f, FAULT_ARGS))
    for track, count, nbytes in (
        ("HtoD migrations", "htod_count", "htod_bytes"),
        ("DtoH migrations", "dtoh_count", "dtoh_bytes"),
    ):
        m = k[k[count].fillna(0) > 0]
        names = [f"{int(c):,} x, {v / MiB:,.1f} MiB" for c, v in zip(m[count], m[nbytes], strict=True)]
        b.spans(track, m["start_ns"], m["end_ns"], names, _records(m, (count, nbytes, "kernel_id", "name")))
    ev = k[k["eviction_count"].fillna(0) > 0]
    names = [f"{int(c):,} chunks evicted" for c in ev["eviction_count"]]
    b.spans("evictions", ev["start_ns"], ev["end_ns"], names, _records(ev, ("eviction_count", "kernel_id", "name")))


def _measured_uvm(b: _Builder, migrations: pd.DataFrame | None, faults: pd.DataFrame | None) -> None:
    """UVM tracks of a measured run: each fault record and migration of the export."""
    if faults is not None and len(faults):
        access = faults["access"] if "access" in faults.columns else ["?"] * len(faults)
        names = [f"{int(n):,} faults ({a})" for n, a in zip(faults["fault_count"], access, strict=True)]
        args = _records(faults, ("fault_count", "access", "address"))
        b.spans("UVM faults", faults["start_ns"], faults["end_ns"], names, args)
    if migrations is None or migrations.empty:
        return
    m = migrations
    args = ("bytes", "direction", "cause", "address", "kernel_id", "iteration")
    for track, mask in (
        ("HtoD migrations", m["direction"] == "htod"),
        ("DtoH migrations", m["direction"] == "dtoh"),
        ("evictions", m["cause"] == "eviction"),
    ):
        sel = m[mask.fillna(False).astype(bool)]
        names = [
            f"{d} {v / MiB:,.2f} MiB ({c})"
            for d, v, c in zip(sel["direction"], sel["bytes"], sel["cause"], strict=True)
        ]
        b.spans(track, sel["start_ns"], sel["end_ns"], names, _records(sel, args))


def build_timeline(
    tables: dict[str, pd.DataFrame],
    label: str,
    measured: bool = False,
    faults: pd.DataFrame | None = None,
    other: dict[str, Any] | None = None,
    ranges: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """The trace-event document of a run from its tables (iterations, kernels, memory, measured: migrations).

    ``faults``: a measured run's GPU page-fault records (``Export.gpu_faults()``: start_ns, end_ns,
    fault_count, access), which the run directory does not keep; ``ranges``: its NVTX ranges
    (``Export.nvtx_ranges()``: start_ns, end_ns, text), drawn on the phases track.
    """
    b = _Builder()
    its = tables.get("iterations")
    if its is not None and len(its):
        names = [f"iteration {int(i)}" for i in its["iteration"]]
        args = _records(its, ("iteration", "duration_ns", "fault_count"))
        b.spans("iterations", its["start_ns"], its["end_ns"], names, args)
    k = tables.get("kernels")
    if k is not None and len(k):
        ph = _phases(k)
        names = [f"{p} (iteration {int(i)})" for p, i in zip(ph["phase"], ph["iteration"], strict=True)]
        b.spans("phases", ph["start_ns"], ph["end_ns"], names, _records(ph, ("phase", "iteration", "kernels")))
        kargs = ("kernel_id", "iteration", "phase", "kernel_bytes", "fault_count", "htod_bytes", "dtoh_bytes")
        b.spans("kernels", k["start_ns"], k["end_ns"], k["name"].astype(str).tolist(), _records(k, kargs))
        if not measured:
            _sim_uvm(b, k)
    if ranges is not None and len(ranges):
        r = ranges.dropna(subset=["start_ns", "end_ns"])
        b.spans(
            "phases", r["start_ns"], r["end_ns"], r["text"].fillna("?").astype(str).tolist(), _records(r, ("text",))
        )
    if measured:
        _measured_uvm(b, tables.get("migrations"), faults)
    mem = tables.get("memory")
    if mem is not None and len(mem):
        for col, name in COUNTERS.items():
            if col in mem.columns:
                b.counter(name, mem["time_ns"], pd.to_numeric(mem[col], errors="coerce"))
    spans = sorted(b.events, key=lambda e: e["ts"])
    return {
        "traceEvents": b.metadata(label) + spans,
        "displayTimeUnit": "ms",
        "otherData": {"producer": f"uvmlab {__version__}", **(other or {})},
    }


def write_timeline(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write a trace-event document atomically (compact JSON)."""
    out = Path(path)
    atomic_write_text(out, json.dumps(doc, separators=(",", ":"), allow_nan=False))
    return out


def run_timeline(
    rundir: RunDir | str | Path,
    path: str | Path,
    faults: pd.DataFrame | None = None,
    ranges: pd.DataFrame | None = None,
) -> Path:
    """Write the timeline of the run in ``rundir`` (simulated, GPU or measured) to ``path``."""
    rd = rundir if isinstance(rundir, RunDir) else RunDir(rundir)
    res = rd.read_result()
    tables = {n: rd.read_table(n) for n in ("iterations", "kernels", "memory", "migrations") if rd.table(n).is_file()}
    measured = res.get("mode") in ("measured", "gpu")
    mode = {"sim": "simulated", "measured": "measured"}.get(str(res.get("mode")), str(res.get("mode")))
    label = f"{Path(str(res.get('workload') or 'run')).name} ({mode})"
    if res.get("oversub") is not None:
        label += f", x{float(res['oversub']):g}, PCA {'on' if res.get('pca') else 'off'}"
    other = {k: res.get(k) for k in ("mode", "workload", "gpu", "oversub", "pca")}
    other["run"] = str(rd.path)
    doc = build_timeline(tables, label, measured=measured, faults=faults, other=other, ranges=ranges)
    return write_timeline(path, doc)
