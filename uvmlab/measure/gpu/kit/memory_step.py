"""Child step of ``uvmlab collect``: one training case, what PyTorch and NVML say about its memory.

``python -m uvmlab.measure.gpu.kit.memory_step OUT --case JSON [--snapshot python|all|none] [--device cuda]``

The case (``uvmlab.measure.gpu.kit.plan.MemoryCase`` as JSON) names the workload, batch size, optimizer, options and
whether ``torch.backends.cudnn.benchmark`` is on. In a fresh process (so every peak is this case's alone):

1. NVML's used memory of the device before CUDA starts (``nvml_peak.device_used_bytes``);
2. CUDA starts; the NVML sampler thread follows this process's memory (``nvml_peak.PeakSampler``, found by the
   CUDA device's UUID, so a MIG device's own);
3. ``torch.cuda.memory._record_memory_history(context="all", stacks=...)`` (``python`` frames for the memory cases;
   ``all`` adds C++ frames, which the cuDNN cases need to see which allocations cuDNN calls made);
4. the workload is built and trained ``iterations`` times with ``workloads.train.train_step`` (the loop trace
   capture and the GPU worker use);
5. ``torch.cuda.memory._snapshot()`` is pickled to ``OUT/snapshot.pickle`` (PyTorch's own format; uvmlab reads it
   back with its safe reader, never ``pickle.load``), ``max_memory_reserved`` / ``max_memory_allocated`` and the
   NVML peaks are read, and with C++ frames the allocations made under cuDNN calls are listed in
   ``OUT/workspaces.csv`` (a frame named like ``cudnn``/``run_conv_plan``/``Conv_v7``/``Conv_v8``: the per-call
   workspaces of aten/src/ATen/native/cudnn [approximation: a name match on the stack]);
6. ``OUT/case.json``: the row of runs.csv (uvmlab.measure.gpu.kit.layout.RUN_COLUMNS) plus the versions.

A cuDNN case runs with the cuDNN API log on (the plan sets ``CUDNN_LOGINFO_DBG``/``CUDNN_LOGLEVEL_DBG`` and
``CUDNN_LOGDEST_DBG=OUT/cudnn.log``; uvmlab.measure.gpu.kit.cudnn_log) for one iteration. An out-of-memory error is a
result
(``outcome: oom``, exit 0). ``--device cpu`` runs the same loop on the CPU (tests): the CUDA-only values are null.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pickle
import re
import sys
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError, UvmlabError
from uvmlab.files.atomic import atomic_write_json, atomic_write_with

WORKSPACE_FRAME = re.compile(r"cudnn|run_conv_plan|Conv_v[78]", re.IGNORECASE)
"""A stack frame of an allocation made for a cuDNN call (aten/src/ATen/native/cudnn/Conv_v7.cpp, Conv_v8.cpp)."""
SNAPSHOT_STACKS = ("python", "all", "none")


def cublas_version() -> str | None:
    """``cublasGetProperty`` major.minor.patch of the libcublas this process loaded (None: none loaded)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    path = next((ln.split()[-1] for ln in maps.splitlines() if "libcublas.so" in ln.split()[-1]), None)
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).cublasGetProperty
    except (OSError, AttributeError):
        return None
    parts = []
    for prop in (0, 1, 2):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL (library_types.h)
        v = ctypes.c_int(0)
        if fn(prop, ctypes.byref(v)) != 0:
            return None
        parts.append(str(v.value))
    return ".".join(parts)


def workspace_rows(snapshot: dict[str, Any], case: str) -> list[dict[str, Any]]:
    """The allocations of a snapshot's trace whose stack names a cuDNN call (see the module docstring)."""
    rows = []
    for trace in snapshot.get("device_traces") or []:
        for i, e in enumerate(trace):
            if e.get("action") != "alloc":
                continue
            hit = next((f for f in e.get("frames") or [] if WORKSPACE_FRAME.search(str(f.get("name", "")))), None)
            if hit is not None:
                rows.append({"case": case, "index": i, "size_bytes": int(e.get("size", 0)), "frame": hit.get("name")})
    return rows


def run_case(out: Path, case: dict[str, Any], snapshot: str = "python", device: str = "cuda") -> dict[str, Any]:
    """Run one case (module docstring); write OUT/case.json (and the snapshot) and return the record."""
    from uvmlab.measure.gpu.kit.nvml_peak import device_used_bytes, open_sampler

    if snapshot not in SNAPSHOT_STACKS:
        raise InputError(f"--snapshot must be one of {', '.join(SNAPSHOT_STACKS)}, not {snapshot!r}")
    is_cuda = device.startswith("cuda")
    used_before = device_used_bytes(os.environ) if is_cuda else None
    import torch

    from uvmlab.config import WorkloadConfig
    from workloads.registry import load_workload
    from workloads.train import make_optimizer, train_step

    if is_cuda and not torch.cuda.is_available():
        raise UvmlabError("the memory step found no CUDA device (torch.cuda.is_available() is False)")
    torch.backends.cudnn.benchmark = bool(case["cudnn_benchmark"])
    cfg = WorkloadConfig(
        case["workload"],
        batch_size=int(case["batch_size"]),
        optimizer=case["optimizer"],
        iterations=int(case["iterations"]),
        options=dict(case.get("options") or {}),
    )
    sampler = None
    gpu_name = gpu_total = None
    if is_cuda:
        torch.cuda.init()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu_name, gpu_total = props.name, int(props.total_memory)
        sampler = open_sampler(str(getattr(props, "uuid", "")) or None, os.getpid(), used_before)
        if snapshot != "none":
            torch.cuda.memory._record_memory_history(context="all", stacks=snapshot)
    outcome, error = "ok", None
    workload = optimizer = None
    try:
        workload = load_workload(cfg.workload).build(cfg, device)
        optimizer = make_optimizer(workload.model, cfg)
        for it in range(cfg.iterations):
            train_step(workload, optimizer, cfg, None, it)
        if is_cuda:
            torch.cuda.synchronize()
    except torch.OutOfMemoryError as exc:
        outcome, error = "oom", str(exc).splitlines()[0]
    out.mkdir(parents=True, exist_ok=True)
    snap_file = None
    workspaces: list[dict[str, Any]] = []
    if is_cuda and snapshot != "none":
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        atomic_write_with(out / "snapshot.pickle", lambda tmp: tmp.write_bytes(pickle.dumps(snap)))
        snap_file = "snapshot.pickle"
        if snapshot == "all":
            workspaces = workspace_rows(snap, case["name"])
    if workspaces or snapshot == "all":
        import pandas as pd

        from uvmlab.measure.gpu.kit.layout import WORKSPACE_COLUMNS

        df = pd.DataFrame(workspaces, columns=list(WORKSPACE_COLUMNS))
        atomic_write_with(out / "workspaces.csv", lambda tmp: df.to_csv(tmp, index=False))
    nvml = sampler.stop() if sampler is not None else {}
    record = {
        "case": case["name"],
        "workload": cfg.workload,
        "batch_size": cfg.batch_size,
        "optimizer": cfg.optimizer,
        "cudnn_benchmark": bool(case["cudnn_benchmark"]),
        "options": json.dumps(cfg.options, sort_keys=True),
        "iterations": cfg.iterations,
        "outcome": outcome,
        "max_memory_reserved_bytes": int(torch.cuda.max_memory_reserved()) if is_cuda else None,
        "max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated()) if is_cuda else None,
        "nvml_process_peak_bytes": nvml.get("nvml_process_peak_bytes"),
        "nvml_used_peak_bytes": nvml.get("nvml_used_peak_bytes"),
        "nvml_used_before_bytes": nvml.get("nvml_used_before_bytes", used_before),
        "nvml_source": nvml.get("nvml_source", "none"),
        "snapshot": snap_file,
        "gpu_name": gpu_name,
        "gpu_total_bytes": gpu_total,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cublas": cublas_version() if is_cuda else None,
        "driver": None,
        "error": error,
        "device": device,
        "nvml": nvml,
        "cudnn_log": os.environ.get("CUDNN_LOGDEST_DBG"),
    }
    atomic_write_json(out / "case.json", record)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m uvmlab.measure.gpu.kit.memory_step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--case", required=True, help="the MemoryCase as JSON")
    parser.add_argument("--snapshot", default="python", choices=SNAPSHOT_STACKS)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    try:
        run_case(args.out, json.loads(args.case), args.snapshot, args.device)
    except UvmlabError as exc:
        print(f"uvmlab memory step: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
