"""Scorecard checks of the data ``uvmlab collect`` records (uvmlab.measure.gpu.kit.layout), on whatever GPU it ran.

The snapshots the kit records land in ``snapshots/`` with a ``MANIFEST.tsv``, where the ``snapshots-replay`` check
(snapshot_checks.py) replays them with no change. The other sets get these checks (each skipped where its folder is
absent). None promises a band yet: they are first measurements, tabulated so that bands can be set from them.

* ``collect-memory`` (``memory/uvmlab_collect/runs.csv``): per training case, ``torch.cuda.max_memory_reserved`` /
  ``max_memory_allocated`` against uvmlab's ``peak_reserved_bytes`` / ``peak_allocated_bytes``, and the NVML
  whole-process peak against ``device_peak_bytes`` (:func:`uvmlab.memory.estimate.estimate` on the recorded GPU).
  ``cudnn.benchmark`` on is marked: the estimate does not model benchmark mode's trial workspaces.
* ``collect-cudnn`` (``cudnn/uvmlab_collect``): per case, the largest allocation a cuDNN call made in the logged
  iteration (``workspaces.csv``; else the largest ``workSpaceSizeInBytes`` of ``calls.csv``) against the largest
  cuDNN workspace of uvmlab's trace under the default workspace model (docs/estimate.md).
* ``collect-uvm`` (``uvm/uvmlab_collect``): each stream row against the shipped ``workloads/files/uvmbench.py`` with the
  recorded total memory, the recorded GPU's spec and its cost profile (uvmlab.sim.uvm.profile.pick_profile); each GCN
  run's epoch time (UVM and native) and peak managed bytes against ``workloads/files/gcn.py``; both run as
  ``uvmlab run FILE`` runs them (``uvmlab.measure.profile_fit.bench_ms`` / ``gcn_epoch_s``).
* ``collect-link`` (``link/uvmlab_collect/timings.csv``): each prefetch row's time against ``bytes /
  transfer_bandwidth(bytes, link)`` with the profile's (or the spec's) link bandwidth.

The GPU: the recorded name matched to a known spec (``uvmlab.gpus.known_gpu``) with the recorded total memory; an
unknown name uses the default spec with that memory, and the points say so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.inputs import MAX_DATA_FILE_BYTES, read_csv_frame, read_json_file
from uvmlab.measure.gpu.kit import layout as L
from uvmlab.validate.points import Point, check


def collected_gpu(meta: dict[str, Any], total: int | None = None) -> tuple[Any, str]:
    """(GpuSpec, note) of the GPU a data set was recorded on (module docstring)."""
    from uvmlab.gpus import DEFAULT_GPU, GPUS, known_gpu

    name = known_gpu(meta.get("gpu"))
    memory = total or meta.get("gpu_total_bytes")
    spec = GPUS[name or DEFAULT_GPU]
    if memory:
        spec = spec.with_memory(int(memory))
    note = f"recorded on {meta.get('gpu')}" + ("" if name else f"; not a known GPU: the {DEFAULT_GPU} spec is used")
    return spec, note


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f  # NaN: not recorded


def _workload_config(row: pd.Series) -> Any:
    from uvmlab.config import WorkloadConfig

    options = json.loads(row["options"]) if isinstance(row.get("options"), str) and row["options"] else {}
    return WorkloadConfig(
        str(row["workload"]),
        batch_size=int(row["batch_size"]),
        optimizer=str(row["optimizer"]),
        iterations=int(row["iterations"]),
        options=options,
    )


@check("collect-memory", needs=L.MEMORY_DIR)
def check_memory(data_dir: Path) -> list[Point]:
    """PyTorch's and NVML's peaks of each recorded case against uvmlab's estimate."""
    from uvmlab.memory.estimate import estimate

    folder = data_dir / L.MEMORY_DIR
    runs = L.read_csv(folder / "runs.csv", L.RUN_COLUMNS)
    meta = L.read_meta(folder)
    ds = L.MEMORY_DIR
    points: list[Point] = []
    for _, row in runs.iterrows():
        case = str(row["case"])
        if row["outcome"] != "ok":
            points.append(
                Point(ds, case, "peak_reserved", "bytes", float("nan"), None, note=f"outcome {row['outcome']}")
            )
            continue
        spec, note = collected_gpu(
            {**meta, "gpu": row.get("gpu_name") or meta.get("gpu")}, _num(row["gpu_total_bytes"])
        )
        if str(row["cudnn_benchmark"]).lower() == "true":
            note += "; cudnn.benchmark on: trial workspaces not modelled"
        try:
            est = estimate(_workload_config(row), spec)
        except InputError as exc:  # e.g. a workload this uvmlab cannot rebuild: a point without prediction
            points.append(Point(ds, case, "peak_reserved", "bytes", float("nan"), None, note=str(exc)))
            continue
        nvml = _num(row["nvml_process_peak_bytes"])
        if (
            nvml is None
            and _num(row["nvml_used_peak_bytes"]) is not None
            and _num(row["nvml_used_before_bytes"]) is not None
        ):
            nvml = float(row["nvml_used_peak_bytes"]) - float(row["nvml_used_before_bytes"])
        pairs = [
            ("peak_reserved", _num(row["max_memory_reserved_bytes"]), est.peak_reserved_bytes),
            ("peak_allocated", _num(row["max_memory_allocated_bytes"]), est.peak_allocated_bytes),
            ("device_peak", nvml, est.device_peak_bytes),
        ]
        for quantity, measured, predicted in pairs:
            if measured is not None:
                points.append(Point(ds, case, quantity, "bytes", measured, float(predicted), note=note))
    return points


@check("collect-cudnn", needs=L.CUDNN_DIR)
def check_cudnn(data_dir: Path) -> list[Point]:
    """The largest cuDNN workspace of each logged iteration against uvmlab's trace (default workspace model)."""
    from uvmlab.memory.estimate import estimate

    folder = data_dir / L.CUDNN_DIR
    runs = L.read_csv(folder / "runs.csv", L.RUN_COLUMNS)
    meta = L.read_meta(folder)
    spaces = L.read_csv(folder / "workspaces.csv", L.WORKSPACE_COLUMNS)
    calls_csv = folder / "calls.csv"
    calls = (
        read_csv_frame(calls_csv, MAX_DATA_FILE_BYTES, "calls.csv of uvmlab collect")
        if calls_csv.exists()
        else pd.DataFrame()
    )
    points: list[Point] = []
    for _, row in runs.iterrows():
        case = str(row["case"])
        mine = spaces[spaces["case"] == case]["size_bytes"]
        source = "allocations under cuDNN calls (snapshot frames)"
        if mine.empty and not calls.empty:
            mine = calls[calls["case"] == case]["workspace_bytes"].dropna()
            source = "workSpaceSizeInBytes of the logged calls"
        if mine.empty or row["outcome"] != "ok":
            points.append(
                Point(
                    L.CUDNN_DIR, case, "max_cudnn_workspace", "bytes", float("nan"), None, note="no workspace recorded"
                )
            )
            continue
        spec, note = collected_gpu(
            {**meta, "gpu": row.get("gpu_name") or meta.get("gpu")}, _num(row["gpu_total_bytes"])
        )
        try:
            est = estimate(_workload_config(row), spec)
        except InputError as exc:
            points.append(
                Point(L.CUDNN_DIR, case, "max_cudnn_workspace", "bytes", float(mine.max()), None, note=str(exc))
            )
            continue
        a = est.trace.allocations if est.trace is not None else pd.DataFrame()
        ws = a.loc[a["op"] == "cudnn_workspace", "size_bytes"] if "op" in a.columns else pd.Series([], dtype="int64")
        predicted = float(ws.max()) if len(ws) else None
        why = f"{note}; measured: {source}" + ("" if predicted is not None else "; the trace has no cuDNN workspace")
        points.append(Point(L.CUDNN_DIR, case, "max_cudnn_workspace", "bytes", float(mine.max()), predicted, note=why))
    return points


@check("collect-uvm", needs=L.UVM_DIR)
def check_uvm(data_dir: Path) -> list[Point]:
    """Streams and GCN runs against the UVM simulator on the recorded GPU."""
    from uvmlab.measure.profile_fit import bench_ms, gcn_epoch_s
    from uvmlab.sim.uvm.profile import pick_profile

    folder = data_dir / L.UVM_DIR
    meta = L.read_meta(folder)
    ds = L.UVM_DIR
    points: list[Point] = []
    if (folder / "streams.csv").exists():
        for _, r in L.read_csv(folder / "streams.csv", L.STREAM_COLUMNS).iterrows():
            total = int(r["total_bytes"])
            spec, note = collected_gpu(meta, total)
            costs, how = pick_profile(spec)
            factors = f"{float(r['free_factor']):g}x of free ({float(r['size_factor']):.3f}x of total)"
            case = f"{r['kernel']} {r['mode']} {factors}"
            try:
                predicted: float | None = bench_ms(
                    str(r["kernel"]), float(r["size_factor"]), costs, mode=str(r["mode"]), gpu=spec.catalog_name,
                    total_bytes=total,
                )  # fmt: skip
            except InputError as exc:  # a row the simulator does not model (it says which)
                predicted, how = None, str(exc)
            points.append(Point(ds, case, "kernel_time", "ms", float(r["median_ms"]), predicted, note=f"{note}; {how}"))
    for js in sorted((folder / "gcn" / "uvm").glob("*.json")):
        doc = read_json_file(js, MAX_DATA_FILE_BYTES, "a GCN result of uvmlab collect (JSON)")
        if not isinstance(doc, dict) or doc.get("outcome") != "ok":
            continue
        nodes, chunk = int(doc["nodes"]), int(doc.get("chunk_size", 2_000_000))
        total = int(meta.get("gpu_total_bytes") or 0)
        spec, note = collected_gpu(meta, total or None)
        costs, how = pick_profile(spec)
        t_uvm, t_native, peak = gcn_epoch_s(
            nodes, costs, gpu=spec.catalog_name, total_bytes=total or spec.memory_bytes, chunk_edges=chunk
        )
        case = f"{nodes:,} nodes"
        points.append(
            Point(ds, case, "uvm_epoch_time", "s", float(doc["avg_epoch_time_s"]), t_uvm, note=f"{note}; {how}")
        )
        peak_gb = (doc.get("uvm_stats") or {}).get("peak_allocated_GB")
        if peak_gb is not None:
            points.append(Point(ds, case, "peak_allocated", "bytes", float(peak_gb) * 1e9, float(peak), note=note))
        native = folder / "gcn" / "native" / js.name
        if native.exists():
            nd = read_json_file(native, MAX_DATA_FILE_BYTES, "a GCN result of uvmlab collect (JSON)")
            if isinstance(nd, dict) and nd.get("outcome") == "ok":
                points.append(
                    Point(ds, case, "native_epoch_time", "s", float(nd["avg_epoch_time_s"]), t_native, note=note)
                )
    return points


@check("collect-link", needs=L.LINK_DIR)
def check_link(data_dir: Path) -> list[Point]:
    """Prefetch times by size and direction against the link model (uvmlab.sim.uvm.timing.transfer_bandwidth)."""
    import numpy as np

    from uvmlab.measure.gpu.microbench import check_timings
    from uvmlab.sim.uvm.profile import pick_profile
    from uvmlab.sim.uvm.timing import transfer_bandwidth

    folder = data_dir / L.LINK_DIR
    spec, note = collected_gpu(L.read_meta(folder))
    costs, how = pick_profile(spec)
    link = costs.link_bytes_per_s or spec.link_bytes_per_s
    t = check_timings(read_csv_frame(folder / "timings.csv", MAX_DATA_FILE_BYTES, "timings.csv of uvmlab collect"))
    points: list[Point] = []
    for _, r in t[t["kind"].isin(("prefetch_htod", "prefetch_dtoh"))].iterrows():
        size = float(r["size_bytes"])
        predicted_ms = size / float(transfer_bandwidth(np.array([size]), link)[0]) * 1e3
        case = f"{r['kind']} {int(size) >> 20} MiB"
        points.append(Point(L.LINK_DIR, case, "prefetch_time", "ms", float(r["time_ns"]) / 1e6, predicted_ms,
                            note=f"{note}; link {link / 1e9:.1f} GB/s at 2 MiB ({how})"))  # fmt: skip
    return points
