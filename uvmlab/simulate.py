"""Simulation mode of ``uvmlab run``: the workload's trace, placed by the allocator model, replayed under UVM.

Pipeline (each step another module's public function):

1. ``uvmlab.trace.cache.get_trace(cfg.workload)``: the captured trace (cached on disk);
2. ``uvmlab.trace.orchestrate.to_cuda(trace, gpu)``: CUDA's allocation sequence (workspaces, lifetimes);
3. ``uvmlab.sim.placement.place(trace, "pca" | "nocache")``: managed ranges (PCA segments, or one per tensor);
4. footprint = peak chunk-rounded bytes of live managed ranges (PCA on: peak reserved; off: peak live tensors,
   each rounded to the 64 KiB / 2 MiB GPU chunks UVM gives it); available = footprint / oversub (at most the GPU's
   usable memory);
5. ``uvmlab.sim.uvm_replay.replay``: the UVM driver model (uvmlab.sim.uvm) over every kernel of every iteration.

The baseline is the same kernels with every page resident and no allocator API costs (PCA on, no UVM: the
reference the seed study compares against), so ``slowdown = iteration_time_ns / baseline_time_ns``.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from uvmlab import SCHEMA_VERSION, __version__
from uvmlab.config import RunConfig
from uvmlab.errors import InputError, InvariantError
from uvmlab.gpus import GpuSpec, get_gpu
from uvmlab.rundir import RunDir
from uvmlab.sim.timing import CostParams
from uvmlab.sim.uvm_knobs import UvmKnobs
from uvmlab.sim.uvm_replay import ReplayResult, peak_managed_bytes, replay
from uvmlab.stats.schema import FAULT_COLUMNS, RESULT_KEYS, check_table
from uvmlab.trace.schema import Trace


@dataclass
class Prepared:
    """A run's inputs after steps 1-4 of the pipeline."""

    gpu: GpuSpec
    trace: Trace
    placement: Any
    footprint_bytes: int
    available_bytes: int


def run_gpu_spec(cfg: RunConfig) -> GpuSpec:
    """The GpuSpec of a run (``--gpu`` plus ``--gpu-memory``)."""
    return get_gpu(cfg.gpu, cfg.gpu_memory_bytes)


def _pipeline() -> tuple[Any, Any, Any]:
    """The three upstream functions, imported lazily (capture needs torch)."""
    from uvmlab.sim.placement import place
    from uvmlab.trace.cache import get_trace
    from uvmlab.trace.orchestrate import to_cuda

    return get_trace, to_cuda, place


def prepare(cfg: RunConfig, progress: Any = None) -> Prepared:
    """Steps 1-4: trace, CUDA orchestration, placement, footprint and available memory."""
    get_trace, to_cuda, place = _pipeline()
    gpu = run_gpu_spec(cfg)
    trace = get_trace(cfg.workload, progress=progress)
    trace = to_cuda(trace, gpu)
    placement = place(trace, "pca" if cfg.pca else "nocache")
    footprint = peak_managed_bytes(placement.ranges)
    if footprint <= 0:
        raise InputError(f"workload {cfg.workload.workload!r} allocates no device memory: nothing to simulate")
    available = min(int(footprint / cfg.oversub), gpu.usable_bytes)
    return Prepared(gpu, trace, placement, footprint, available)


def footprint_bytes(cfg: RunConfig) -> int:
    """The simulated peak managed bytes of ``cfg``'s workload in its PCA mode (``--footprint estimate``)."""
    return prepare(cfg).footprint_bytes


def load_costs(cfg: RunConfig) -> CostParams:
    """Cost parameters: ``--params FILE``, else the GPU's cost profile (uvmlab.sim.profile.pick_profile)."""
    return costs_and_source(cfg)[0]


def costs_and_source(cfg: RunConfig) -> tuple[CostParams, str]:
    """(cost parameters, where they come from) for ``cfg``."""
    if cfg.params_file:
        return CostParams.from_file(cfg.params_file), str(cfg.params_file)
    from uvmlab.sim.profile import pick_profile

    return pick_profile(run_gpu_spec(cfg))


def env_info(trace_header: dict[str, Any] | None = None) -> dict[str, Any]:
    """env.json for a simulated run: versions of this machine, and what the trace was captured with."""
    import pandas as pd

    head = trace_header or {}
    return {
        "mode": "sim",
        "uvmlab": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "trace_torch_version": head.get("torch_version"),
        "trace_capture_device": head.get("capture_device"),
        "trace_notes": head.get("notes"),
        "PYTORCH_CUDA_ALLOC_CONF": None,
    }


def result_dict(cfg: RunConfig, prep: Prepared, res: ReplayResult, knobs: UvmKnobs, costs: CostParams) -> dict:
    """result.json content (docs/result-json.md documents every key)."""
    its = res.iterations
    steady = its["duration_ns"].to_numpy()[1:] if len(its) > 1 else its["duration_ns"].to_numpy()
    iteration_ns = float(np.mean(steady)) if len(steady) else float("nan")
    baseline = res.baseline_iteration_ns
    totals = res.totals
    migrated = totals.htod_bytes + totals.dtoh_bytes
    place = prep.placement
    d: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "mode": "sim",
        "outcome": "ok",
        "error": None,
        "workload": cfg.workload.workload,
        "pca": cfg.pca,
        "oversub": cfg.oversub,
        "gpu": prep.gpu.name,
        "footprint_bytes": prep.footprint_bytes,
        "available_bytes": prep.available_bytes,
        "peak_allocated_bytes": int(place.peak_allocated_bytes),
        "peak_reserved_bytes": int(place.peak_reserved_bytes),
        "iterations": len(its),
        "iteration_time_ns": iteration_ns,
        "total_time_ns": res.total_time_ns,
        "baseline_time_ns": baseline,
        "slowdown": iteration_ns / baseline if baseline and baseline > 0 else None,
    }
    for col in FAULT_COLUMNS:
        d[col] = int(its[col].sum()) if len(its) else 0
    d.update(
        {
            "effective_oversub": prep.footprint_bytes / prep.available_bytes,
            "setup_fault_count": int(res.kernels.loc[res.kernels["iteration"] < 0, "fault_count"].sum()),
            "zero_fill_bytes": int(totals.zero_fill_bytes),
            "fault_htod_bytes": int(totals.fault_htod_bytes),
            "prefetch_htod_bytes": int(totals.prefetch_htod_bytes),
            "memcpy_htod_count": int(totals.memcpy_htod_count),
            "memcpy_htod_bytes": int(totals.memcpy_htod_bytes),
            "raw_fault_entries": float(totals.raw_fault_entries),
            "read_fault_share": (d["read_fault_count"] / d["fault_count"]) if d["fault_count"] else None,
            "migration_bytes_over_footprint": migrated / prep.footprint_bytes,
            "peak_resident_bytes": res.peak_resident_bytes,
            "max_kernel_bytes": int(res.kernels["kernel_bytes"].max()) if len(res.kernels) else 0,
            "kernels": len(res.kernels),
            "cudaMallocManaged_calls": res.api_calls.get("cudaMallocManaged", 0),
            "cudaFree_calls": res.api_calls.get("cudaFree", 0),
            "skipped_accesses": res.skipped_accesses,
            "knobs": knobs.to_dict(),
            "cost_params": costs.for_gpu(prep.gpu).to_dict(),
            "cost_params_source": costs_and_source(cfg)[1],
        }
    )
    missing = [k for k in RESULT_KEYS if k not in d]
    if missing:
        raise InvariantError(f"result.json lacks shared keys {missing}")
    return d


def simulate_prepared(cfg: RunConfig, prep: Prepared, progress: Any = None) -> tuple[ReplayResult, dict]:
    """Step 5 on prepared inputs: replay and build result.json (no files written)."""
    knobs = UvmKnobs.from_options(cfg.sim_options, cfg.prefetch)
    costs = load_costs(cfg)
    t0 = time.perf_counter()
    res = replay(
        prep.trace,
        prep.placement,
        prep.available_bytes,
        prep.gpu,
        knobs,
        costs,
        dtype=cfg.workload.dtype,
        progress=progress,
    )
    result = result_dict(cfg, prep, res, knobs, costs)
    result["sim_wall_s"] = time.perf_counter() - t0
    return res, result


def simulate_run(
    cfg: RunConfig, rundir: RunDir, progress: Any = None, figures: bool = True, capture_progress: Any = None
) -> dict:
    """Simulate ``cfg`` and write the run directory (tables, figures, env.json; result.json last).

    ``progress(done, total)`` follows the simulated kernels, ``capture_progress`` a trace capture (cache miss).
    """
    prep = prepare(cfg, progress=capture_progress)
    res, result = simulate_prepared(cfg, prep, progress)
    rundir.write_json(rundir.config_json, {"run": cfg.to_dict(), "mode": "sim"})
    rundir.write_json(rundir.env_json, env_info(prep.trace.header))
    rundir.write_table("iterations", check_table("iterations", res.iterations))
    rundir.write_table("kernels", check_table("kernels", res.kernels))
    rundir.write_table("memory", check_table("memory", res.memory))
    if figures:
        from uvmlab.report.run_figures import write_run_figures

        write_run_figures(rundir, res.kernels, res.iterations, res.memory, title=_title(cfg))
    rundir.write_json(rundir.result_json, result)
    return result


def _title(cfg: RunConfig) -> str:
    return f"{cfg.workload.workload}, oversubscription x{cfg.oversub:g}, PCA {'on' if cfg.pca else 'off'} (simulated)"
