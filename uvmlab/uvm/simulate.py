"""Simulation mode of ``uvmlab run``: the workload's trace, placed by the allocator model, replayed under UVM.

Pipeline (each step another module's public function):

1. ``uvmlab.trace.cache.get_trace(cfg.workload)``: the captured trace (cached on disk);
2. ``uvmlab.trace.orchestrate.to_cuda(trace, gpu)``: CUDA's allocation sequence (workspaces, lifetimes);
3. ``uvmlab.sim.allocator.placement.place(trace, "pca" | "nocache")``: managed ranges (PCA segments, or one per tensor);
4. footprint = peak chunk-rounded bytes of live managed ranges (PCA on: peak reserved; off: peak live tensors,
   each rounded to the 64 KiB / 2 MiB GPU chunks UVM gives it); available = footprint / oversub (at most the GPU's
   usable memory);
5. ``uvmlab.sim.uvm.replay.replay``: the UVM driver model (uvmlab.sim.uvm.driver) over every kernel of every iteration.

Two native (no UVM, every page resident) references, mean over the iterations after the first:

- ``native_pca_time_ns``: the same kernels with the caching allocator on (no allocator API calls in steady
  iterations: PCA serves them from its cache): the reference of the seed study. ``slowdown_vs_native_pca``.
- ``native_time_ns``: the same job with the same PCA setting. PCA on: equal to the above. PCA off: plus one
  ``cudaMalloc`` and one ``cudaFree`` per tensor range of the iteration, priced as the managed calls
  (CostParams.managed_alloc_ns / cudafree_sync_ns, both unverified; cudaFree synchronizes the device either
  way, pytorch#106200). ``slowdown_vs_native = iteration_time_ns / native_time_ns``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab import SCHEMA_VERSION
from uvmlab.config import RunConfig, WorkloadConfig, compute_dtype
from uvmlab.errors import InputError, InvariantError
from uvmlab.files.env import env_info
from uvmlab.files.inputs import short
from uvmlab.files.rundir import RunDir
from uvmlab.gpus import GpuSpec, get_gpu, spec_dict
from uvmlab.sim.uvm.breakdown import ITERATION_BREAKDOWN_COLUMNS
from uvmlab.sim.uvm.knobs import UvmKnobs
from uvmlab.sim.uvm.profile import cap_link, pick_profile
from uvmlab.sim.uvm.replay import ReplayResult, peak_managed_bytes, replay
from uvmlab.sim.uvm.timing import CostParams, read_params_file
from uvmlab.stats.schema import FAULT_COLUMNS, RESULT_KEYS, check_table, steady_mean
from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.uvm.regime import regime


@dataclass
class Prepared:
    """A run's inputs after steps 1-4 of the pipeline."""

    gpu: GpuSpec
    trace: Trace
    placement: Any
    footprint_bytes: int
    available_bytes: int
    device_bytes: int = 0
    """Peak plain device memory (``uvm.device_empty``, not managed): taken from the GPU memory UVM may use."""
    device_accesses: int = 0
    """Accesses to plain device memory (outside every managed range: the replay counts them as unplaced)."""


def run_gpu_spec(cfg: RunConfig) -> GpuSpec:
    """The GpuSpec of a run (``--gpu`` plus ``--gpu-memory``, and a GPU file's or ``--gpu-set``'s fields)."""
    return get_gpu(cfg.gpu, cfg.gpu_memory_bytes, cfg.gpu_spec)


def _pipeline() -> tuple[Any, Any, Any]:
    """The three upstream functions, imported lazily (capture needs torch)."""
    from uvmlab.sim.allocator.placement import place
    from uvmlab.trace.cache import get_trace
    from uvmlab.trace.orchestrate import to_cuda

    return get_trace, to_cuda, place


def prepare(
    cfg: RunConfig, progress: Any = None, available_bytes: int | None = None, cuda_trace: Trace | None = None
) -> Prepared:
    """Steps 1-4: trace, CUDA orchestration, placement, footprint and available memory.

    ``available_bytes`` fixes the GPU memory UVM may use (``uvmlab advise`` compares policies on one GPU);
    by default it is footprint / ``cfg.oversub``. ``cfg.policy`` adds its allocator settings and releases.
    ``cuda_trace``: the workload's orchestrated trace when the caller already holds it (:func:`cuda_trace_of`).
    """
    _, _, place = _pipeline()
    gpu = run_gpu_spec(cfg)
    trace = cuda_trace if cuda_trace is not None else cuda_trace_of(cfg, progress)
    trace = shaped_trace(cfg, trace)
    conf, releases = _policy_allocator(cfg, trace)
    managed, device_peak = managed_part(trace)
    placement = place(managed, "pca" if cfg.pca else "nocache", settings=conf, release_at_seqs=releases)
    footprint = peak_managed_bytes(placement.ranges)
    if footprint <= 0:
        raise InputError(f"workload {cfg.workload.workload!r} allocates no managed memory: nothing to simulate")
    if available_bytes is None:
        available_bytes = int(footprint / cfg.oversub)
    if device_peak >= gpu.usable_bytes:
        raise InputError(
            f"workload {cfg.workload.workload!r} holds {device_peak:,} B of plain device memory (uvm.device_empty) at "
            f"its peak, more than the {gpu.usable_bytes:,} B the GPU has: it would not run"
        )
    available = min(available_bytes, gpu.usable_bytes - device_peak)
    acc = trace.accesses
    on_device = acc["alloc_id"].isin(trace.header.get("device_allocations") or [])
    device_accesses = int((on_device & (acc["size_bytes"] > 0)).sum())
    return Prepared(gpu, trace, placement, footprint, available, device_peak, device_accesses)


def managed_part(trace: Trace) -> tuple[Trace, int]:
    """(the trace without its plain device allocations, their peak live bytes).

    A workload program's ``uvm.device_empty`` tensors (trace header ``device_allocations``) are ``cudaMalloc``
    memory: never managed, so the placement and the footprint leave them out; they stay on the GPU for their whole
    life, so the memory UVM may use is the GPU's usable memory less their peak (taken for the whole run: an
    approximation for a program that frees them early). Kernels still touch them: their bytes count in the native
    times, they never fault (the replay finds them outside every managed range)."""
    ids = trace.header.get("device_allocations") or []
    if not ids:
        return trace, 0
    a = trace.allocations
    dev = a["alloc_id"].isin(ids)
    d = a[dev]
    seqs = np.concatenate([d["alloc_seq"].to_numpy(), d["free_seq"].to_numpy()])
    delta = np.concatenate([d["size_bytes"].to_numpy(), -d["size_bytes"].to_numpy()])
    keep = seqs != NEVER_FREED
    keep[: len(d)] = True
    order = np.lexsort((delta[keep], seqs[keep]))
    peak = int(np.cumsum(delta[keep][order]).max(initial=0))
    managed = Trace(
        allocations=a[~dev].reset_index(drop=True),
        kernels=trace.kernels,
        accesses=trace.accesses[~trace.accesses["alloc_id"].isin(ids)].reset_index(drop=True),
        header=trace.header,
    )
    return managed, peak


def cuda_trace_of(cfg: RunConfig, progress: Any = None) -> Trace:
    """Steps 1-2: the workload's trace (cached on disk) orchestrated for the run's GPU."""
    get_trace, to_cuda, _ = _pipeline()
    return to_cuda(get_trace(cfg.workload, progress=progress), run_gpu_spec(cfg))


def shaped_trace(cfg: RunConfig, trace: Trace) -> Trace:
    """The orchestrated trace with the job-shape transformations of ``cfg.applied`` (none without a policy):
    saved tensors on the host (``uvmlab.trace.offload_activations``), then 8-bit optimizer state
    (``uvmlab.trace.optim8bit``) or the optimizer on the host (``uvmlab.trace.offload``)."""
    pol = cfg.applied
    if pol is None:
        return trace
    if pol.offload_activations:
        from uvmlab.trace.offload_activations import offload_activations

        trace = offload_activations(trace)
    if pol.optimizer_8bit:
        from uvmlab.trace.optim8bit import optimizer_8bit

        trace = optimizer_8bit(trace)
    if pol.offload_optimizer:
        from uvmlab.trace.offload import offload_optimizer_of

        trace = offload_optimizer_of(trace, cfg.workload.optimizer, overlap=pol.overlap_step)
    return trace


def _policy_allocator(cfg: RunConfig, trace: Trace) -> tuple[str | None, list[int]]:
    """The allocator settings and empty_cache points of the run's policy (none without a policy)."""
    pol = cfg.applied
    if pol is None:
        return None, []
    return pol.alloc_conf or None, (iteration_ends(trace) if pol.release_each_iteration else [])


def iteration_ends(trace: Trace) -> list[int]:
    """Seqs just after each optimizer step but the last (where ``torch.cuda.empty_cache()`` after the step runs).

    For iteration i >= 1 that is the first event of iteration i: its first kernel or allocation, or, when
    ``zero_grad(set_to_none=True)`` opens the iteration, the first gradient freed after iteration i-1's last kernel
    (empty_cache runs before zero_grad, so those gradients are still alive then). The step's own temporaries are
    freed before that point, as they are when ``step()`` returns.
    """
    k, a = trace.kernels, trace.allocations
    last_kernel = k.groupby("iteration")["seq"].max()
    first_kernel = k.groupby("iteration")["seq"].min()
    first_alloc = a.groupby("iteration")["alloc_seq"].min()
    grads = a.loc[(a["category"] == "gradient") & (a["free_seq"] >= 0), "free_seq"].sort_values().to_numpy()
    ends: list[int] = []
    for it in sorted(i for i in first_kernel.index if i >= 1):
        cands = [int(first_kernel[it])]
        if it in first_alloc.index:
            cands.append(int(first_alloc[it]))
        if it - 1 in last_kernel.index:
            after = grads[grads > last_kernel[it - 1]]
            if len(after):
                cands.append(int(after[0]))
        ends.append(min(cands))
    return ends


def footprint_bytes(cfg: RunConfig) -> int:
    """The simulated peak managed bytes of ``cfg``'s workload in its PCA mode (``--footprint estimate``)."""
    return prepare(cfg).footprint_bytes


def load_costs(cfg: RunConfig) -> CostParams:
    """Cost parameters: ``--params FILE``, else the GPU's cost profile (uvmlab.sim.uvm.profile.pick_profile)."""
    return costs_and_source(cfg)[0]


RUN_TABLES = ("iterations", "kernels", "memory")
"""The tables a simulated run writes; a run shown again must hold them as written (:func:`stored_tables_problem`)."""
_COUNTED = {"iterations": "iterations", "kernels": "kernels"}
"""Tables whose row count result.json records (table -> key)."""


def stored_tables_problem(rundir: RunDir, result: dict[str, Any]) -> str | None:
    """Why the tables of a stored simulated run are not what the run wrote, or None: a table that is missing or
    cannot be read as Parquet, lacks a column of its contract (uvmlab.stats.schema), or whose rows differ from the
    count result.json records. ``uvmlab run`` checks this before it shows a stored run again."""
    import pyarrow as pa

    for name in RUN_TABLES:
        try:
            table = check_table(name, rundir.read_table(name), str(rundir.table(name)))
        except (InputError, OSError, ValueError, pa.ArrowException) as exc:
            return f"its table {name} cannot be read ({short(str(exc))})"
        key = _COUNTED.get(name)
        if key is not None and result.get(key) != len(table):
            return f"its table {name} holds {len(table):,} rows where result.json counts {short(result.get(key))}"
    return None


def check_simulator_inputs(cfg: RunConfig) -> None:
    """Refuse (one InputError) ``cfg``'s simulator knobs (``--sim-option``) and cost parameter file (``--params``)
    if the simulation would refuse them, before a trace is captured or an output folder touched."""
    UvmKnobs.from_options(cfg.sim_options, cfg.prefetch)
    if cfg.params_file:
        costs_and_source(cfg)


def costs_and_source(cfg: RunConfig) -> tuple[CostParams, str]:
    """(cost parameters, where they come from) for ``cfg``: the run GPU's profile
    (uvmlab.sim.uvm.profile.pick_profile), with the costs a ``--params`` file sets in place of the profile's (every
    cost the file does not set, e.g. all but the link of a ``uvmlab calibrate`` fit, keeps the profile's value) and
    every link rate capped at the GPU's link peak, as the profile's are. The one place a run's costs are decided."""
    gpu = run_gpu_spec(cfg)
    costs, why = pick_profile(gpu)
    if not cfg.params_file:
        return costs, why
    given = read_params_file(cfg.params_file)
    return cap_link(replace(costs, **given.values), gpu), given.describe(why)


def result_dict(
    cfg: RunConfig, prep: Prepared, res: ReplayResult, knobs: UvmKnobs, costs: CostParams, costs_source: str
) -> dict:
    """result.json content (docs/result-json.md documents every key); ``costs_source`` says where ``costs`` come
    from (:func:`costs_and_source`)."""
    its = res.iterations
    iteration_ns = steady_mean(its["duration_ns"])
    native = steady_mean(its["native_time_ns"]) if "native_time_ns" in its else res.baseline_iteration_ns
    native_pca = res.baseline_iteration_ns
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
        "native_time_ns": native,
        "slowdown_vs_native": _ratio(iteration_ns, native),
        "native_pca_time_ns": native_pca,
        "slowdown_vs_native_pca": _ratio(iteration_ns, native_pca),
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
            "nsys_migration_records": int(totals.htod_records + totals.dtoh_count),
            "read_fault_share": (d["read_fault_count"] / d["fault_count"]) if d["fault_count"] else None,
            "migration_bytes_over_footprint": migrated / prep.footprint_bytes,
            "peak_resident_bytes": res.peak_resident_bytes,
            "max_kernel_bytes": int(res.kernels["kernel_bytes"].max()) if len(res.kernels) else 0,
            "kernels": len(res.kernels),
            "cudaMallocManaged_calls": res.api_calls.get("cudaMallocManaged", 0),
            "cudaFree_calls": res.api_calls.get("cudaFree", 0),
            "remote_bytes": int(totals.remote_bytes),
            "writeback_saved_bytes": int(totals.writeback_saved_bytes),
            "hint_api_calls": {k: v for k, v in res.api_calls.items() if k not in ("cudaMallocManaged", "cudaFree")},
            "skipped_accesses": res.skipped_accesses - prep.device_accesses,
            "device_bytes": prep.device_bytes,
            "knobs": knobs.to_dict(),
            "sim_scale": res.sim_scale,
            "stream_kernels": res.stream_kernels,
            "concurrent_kernels": res.concurrent_kernels,
            "tiled_kernels": res.tiled_kernels,
            "thrashing": res.thrashing,
            "cost_params": costs.for_gpu(prep.gpu).to_dict(),
            "cost_params_source": costs_source,
        }
    )
    d["gpu_spec"] = spec_dict(prep.gpu)
    d["time_breakdown_ns"] = {c: steady_mean(its[c]) if c in its else None for c in ITERATION_BREAKDOWN_COLUMNS}
    d["native_by_class_ns"] = native_by_class(res.kernels)
    d["regime"] = regime(res.kernels, prep.available_bytes)
    d["batch_size"] = prep.trace.header.get("batch_size")
    missing = [k for k in RESULT_KEYS if k not in d]
    if missing:
        raise InvariantError(f"result.json lacks shared keys {missing}")
    return d


def native_by_class(kernels: pd.DataFrame) -> dict[str, float]:
    """Mean native (all-resident) ns per iteration after the first, by kernel class (uvmlab.sim.uvm.kernel_class):
    which rule times the job's native time."""
    k = kernels[kernels["iteration"] >= 0]
    if k.empty or "kernel_class" not in k.columns:
        return {}
    per = k.groupby(["iteration", "kernel_class"])["native_ns"].sum().unstack(fill_value=0.0)
    return {str(c): steady_mean(per[c]) for c in per.columns}


def _ratio(a: float, b: float | None) -> float | None:
    return a / b if b and b > 0 else None


def _native_columns(its: Any, prep: Prepared, pca: bool, costs: CostParams) -> Any:
    """The iterations table with ``native_pca_time_ns`` (the replay's all-resident ``baseline_ns``) and
    ``native_time_ns`` (plus, PCA off, the iteration's cudaMalloc/cudaFree calls; see the module docstring)."""
    its = its.rename(columns={"baseline_ns": "native_pca_time_ns"})
    api_ns = np.zeros(len(its))
    if not pca and len(its):
        k = prep.trace.kernels
        first = k[k["iteration"] >= 0].groupby("iteration")["seq"].min()
        bounds = np.append(first.to_numpy(), k["seq"].max() + 1)
        rng = prep.placement.ranges
        n_alloc = np.histogram(rng["alloc_seq"].to_numpy(), bins=bounds)[0]
        n_free = np.histogram(rng["free_seq"].to_numpy(), bins=bounds)[0]
        per_it = pd.Series(n_alloc * costs.managed_alloc_ns + n_free * costs.cudafree_sync_ns, index=first.index)
        api_ns = its["iteration"].map(per_it).fillna(0.0).to_numpy()
    its["native_time_ns"] = its["native_pca_time_ns"] + api_ns
    return its


def simulate_prepared(
    cfg: RunConfig,
    prep: Prepared,
    progress: Any = None,
    costs: CostParams | None = None,
    record_events: bool = False,
) -> tuple[ReplayResult, dict]:
    """Step 5 on prepared inputs: replay and build result.json (no files written).

    ``costs``: cost parameters to use instead of ``cfg``'s (``--params`` or the GPU's profile), e.g. a profile
    being fitted (uvmlab.measure.profile_fit); ``record_events``: keep the driver's per-kernel events
    (``ReplayResult.events``: fault batches, services, evictions)."""
    knobs = UvmKnobs.from_options(cfg.sim_options, cfg.prefetch)
    if costs is None:
        costs, costs_source = costs_and_source(cfg)  # once: a profile is a file read and a pick
    else:
        costs_source = "given by the caller"
    t0 = time.perf_counter()
    res = replay(
        prep.trace,
        prep.placement,
        prep.available_bytes,
        prep.gpu,
        knobs,
        costs,
        dtype=compute_dtype(cfg.workload.dtype, prep.trace.header),
        progress=progress,
        record_events=record_events,
    )
    res.iterations = _native_columns(res.iterations, prep, cfg.pca, costs)
    result = result_dict(cfg, prep, res, knobs, costs, costs_source)
    result["sim_wall_s"] = time.perf_counter() - t0
    return res, result


def simulate(
    cfg: RunConfig,
    costs: CostParams | None = None,
    record_events: bool = False,
    available_bytes: int | None = None,
) -> tuple[Prepared, ReplayResult, dict]:
    """What ``uvmlab run --mode sim`` computes for ``cfg`` (workload name or file, options, GPU, oversubscription,
    PCA, ``--sim-option`` knobs), without a run directory: (prepared inputs, replay, result.json content).
    ``costs`` / ``record_events``: as :func:`simulate_prepared`; ``available_bytes``: the GPU memory UVM may use
    instead of footprint / oversubscription (as :func:`prepare`; ``uvmlab advise`` fixes it so, the scorecard gives
    the whole card of a real run: :func:`card_bytes`). A policy must arrive resolved (``cfg.applied``)."""
    if cfg.policy and cfg.applied is None:
        raise InvariantError(f"policy {cfg.policy!r} reached the simulator unresolved (resolve_policy)")
    if available_bytes is None and cfg.applied is not None:
        available_bytes = cfg.applied.available_bytes
    prep = prepare(cfg, available_bytes=available_bytes)
    res, result = simulate_prepared(cfg, prep, costs=costs, record_events=record_events)
    return prep, res, result


def shipped_config(
    name: str,
    options: dict[str, Any],
    gpu: str,
    gpu_memory_bytes: int | None = None,
    *,
    iterations: int = 3,
    pca: bool = False,
    prefetch: bool = True,
    sim_options: dict[str, Any] | None = None,
) -> RunConfig:
    """The RunConfig of ``uvmlab run workloads/files/NAME.py --option K=V ... --gpu GPU --gpu-memory BYTES --pca off
    --iterations N --sim-option K=V``. The scorecard runs the shipped program files with it (uvmlab/validate),
    on the whole card (``simulate(cfg, available_bytes=card_bytes(cfg))``)."""
    wl = WorkloadConfig(str(shipped_workload(name)), iterations=iterations, options=dict(options))
    return RunConfig(
        wl,
        pca=pca,
        mode="sim",
        gpu=gpu,
        gpu_memory_bytes=gpu_memory_bytes,
        prefetch=prefetch,
        sim_options=dict(sim_options or {}),
    )


def card_bytes(cfg: RunConfig) -> int:
    """The memory UVM may use on the whole card of ``cfg`` (``--gpu`` / ``--gpu-memory`` less the context): what a
    real run of a program that sizes its own arrays had, whatever its footprint."""
    return run_gpu_spec(cfg).usable_bytes


def shipped_workload(name: str) -> Path:
    """The program file ``workloads/files/NAME.py`` that ships with uvmlab (package data; docs/workloads.md)."""
    import importlib.util

    spec = importlib.util.find_spec("workloads")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / "files" / f"{name}.py"
        if path.is_file():
            return path
    raise InputError(f"no shipped workload file {name!r} (workloads/files/{name}.py) in this installation")


def simulate_run(
    cfg: RunConfig,
    rundir: RunDir,
    progress: Any = None,
    figures: bool = True,
    capture_progress: Any = None,
    snapshot: str | Path | None = None,
    timeline: str | Path | None = None,
    given: RunConfig | None = None,
) -> dict:
    """Simulate ``cfg`` and write the run directory (tables, figures, env.json; result.json last).

    A run with a policy arrives resolved (``cfg.applied``, ``uvmlab.advise.advisor.resolve_policy``); ``given`` is
    then the job as the user named it (recorded in config.json beside the applied settings).

    ``progress(done, total)`` follows the simulated kernels, ``capture_progress`` a trace capture (cache miss).
    ``snapshot``: also write a PyTorch memory snapshot (uvmlab.export.snapshot); ``timeline``: a Chrome
    trace-event / Perfetto JSON (uvmlab.export.timeline).
    """
    if cfg.policy and cfg.applied is None:
        raise InvariantError(
            f"policy {cfg.policy!r} reached the simulator unresolved (resolve it where the user names it: "
            "uvmlab.advise.advisor.resolve_policy, as uvmlab.run.run does)"
        )
    record = {"run": (given if given is not None else cfg).to_dict(), "mode": "sim"}
    if cfg.applied is not None:
        record["applied"] = cfg.to_dict()  # the policy's settings, on the given job's GPU memory
        prep = prepare(cfg, progress=capture_progress, available_bytes=cfg.applied.available_bytes)
    else:
        prep = prepare(cfg, progress=capture_progress)
    res, result = simulate_prepared(cfg, prep, progress)
    result["policy"] = cfg.policy
    record["used"] = {"batch_size": prep.trace.header.get("batch_size")}  # the batch the trace was captured with
    rundir.write_json(rundir.config_json, record)
    rundir.write_json(rundir.env_json, env_info(prep.trace.header))
    for name, table in zip(RUN_TABLES, (res.iterations, res.kernels, res.memory), strict=True):
        rundir.write_table(name, check_table(name, table))
    if figures:
        from uvmlab.stats.figures import write_run_figures

        write_run_figures(rundir, res.kernels, res.iterations, res.memory, title=_title(cfg))
    if snapshot is not None:
        from uvmlab.export.snapshot import write_run_snapshot

        conf = cfg.applied.alloc_conf if cfg.applied is not None else ""
        write_run_snapshot(
            snapshot, prep.trace, cfg.pca, res.kernels, int(prep.placement.peak_reserved_bytes), alloc_conf=conf
        )
    rundir.write_json(rundir.result_json, result)
    if timeline is not None:
        from uvmlab.export.timeline import run_timeline

        run_timeline(rundir, timeline)
    return result


def _title(cfg: RunConfig) -> str:
    name = Path(cfg.workload.workload).name
    return f"{name}, oversubscription x{cfg.oversub:g}, PCA {'on' if cfg.pca else 'off'} (simulated)"
