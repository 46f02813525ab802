"""Peak GPU memory of a training workload, estimated on the CPU: trace -> orchestrate -> allocator simulation.

``estimate(cfg, gpu, allocator="pca", alloc_conf="")``:

1. the workload's trace, captured on ``meta`` (cached on disk: ``uvmlab.trace.cache.get_trace``);
2. ``uvmlab.trace.orchestrate.to_cuda``: the CUDA allocation sequence (cuBLAS/cuDNN workspaces, lifetimes);
3. ``uvmlab.sim.allocator.placement.place`` replays it through the simulated caching allocator (``pca``) or one
cudaMalloc
   per tensor (``nocache``, ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``), first with unlimited memory (what the job
   reserves when it has room: ``peak_reserved_bytes``) and, when that does not fit, again with the GPU's
   capacity minus the CUDA context, so the allocator's own OOM path (free the cache, retry) decides the verdict.

``device_peak_bytes`` is what nvidia-smi would show at the peak: the CUDA context and loaded modules
(``uvmlab.memory.devicemem.context_model``: by GPU, module loading lazy/eager) + the allocator's reserved peak + buffers
outside the caching allocator (none modelled yet: cuBLAS/cuDNN workspaces go through the allocator).
``required_mb`` is what a scheduler should reserve for the job: ``device_peak_bytes`` + a margin, in MiB
(nvidia-smi's and CARMA's "MB"). The default margin is ``max(5 % of peak reserved, 256 MiB)``: our choice, to
cover what the simulation does not model (cuDNN's real algorithm choice, allocator version differences, NCCL);
unverified, overridable with ``margin_bytes``. Every JSON key is documented in docs/estimate.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.config import ALLOCATORS, WorkloadConfig
from uvmlab.errors import InputError, InvariantError
from uvmlab.gpus import DEFAULT_CONTEXT_BYTES, GpuSpec
from uvmlab.memory.devicemem import MODULE_LOADING, ContextModel, context_model
from uvmlab.memory.intervals import family_of, interval
from uvmlab.sim.allocator.recorded import cudnn_workspace_ids, recorded_run
from uvmlab.trace.orchestrate import CONV_OPS, OrchestrationRules, op_base, to_cuda
from uvmlab.trace.schema import NEVER_FREED, Trace
from uvmlab.trace.summary import live_by_category, peak_live
from uvmlab.units import MiB

MARGIN_FRACTION = 0.05
"""The margin before issue 25: this fraction of peak reserved ... (our choice, unverified; ``default_margin``)."""
MARGIN_MIN_BYTES = 256 * MiB
"""... but at least this many bytes (our choice, unverified). The default margin is now the coverage rule of
``uvmlab.memory.intervals`` (95 % of every data set's validation rows)."""
MB_BYTES = MiB
"""The "MB" of ``required_mb``: MiB, as nvidia-smi reports memory and CARMA compares it."""
CARMA_PLACEMENT_MARGIN_MB = 2048
"""CARMA adds its own 2048 MB at placement (``GPU_mem_available >= estimate + 2048``, reference/ecosystem.md 1.14)."""
RESULT_SCHEMA = "uvmlab.memory.estimate/1"

ProgressFn = Callable[[str], None]


@dataclass
class Estimate:
    """The result of :func:`estimate` (``to_json()`` is the documented JSON object)."""

    workload: str
    config: dict[str, Any]
    gpu: str
    gpu_memory_bytes: int
    context_bytes: int
    allocator: str
    alloc_conf: str
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    peak_live_bytes: int
    peak_reserved_on_gpu_bytes: int
    oom: bool
    oom_seq: int | None
    oom_phase: str | None
    oom_iteration: int | None
    peak_reserved_seq: int | None
    peak_reserved_phase: str | None
    peak_reserved_iteration: int | None
    live_at_allocated_peak: dict[str, int]
    alloc_retries_on_gpu: int | None
    margin_bytes: int
    margin_rule: str
    orchestration: dict[str, Any]
    seconds: dict[str, float]
    trace_allocations: int
    trace_events: int
    timeline: pd.DataFrame = field(repr=False)
    trace: Trace | None = field(default=None, repr=False)
    """The orchestrated (CUDA) trace that was simulated."""
    settings: Any = field(default=None, repr=False)
    gpu_spec: GpuSpec | None = field(default=None, repr=False)
    constrained: bool = False
    """True when the verdict came from a second run with the GPU's capacity (the unlimited run did not fit)."""
    context: ContextModel | None = None
    """How ``context_bytes`` was modelled (None: given by the GpuSpec)."""
    outside_allocator_bytes: int = 0
    """Device buffers outside the caching allocator at the peak (none modelled: always 0 for now)."""
    cudnn_workspaces_skipped_on_gpu: int = 0
    """cuDNN workspaces that did not fit in the capacity run: PyTorch ran another engine (``cudnn_workspace_ids``)."""
    cudnn_workspace_range: dict[str, int] | None = None
    """``device_peak_bytes`` per cuDNN workspace model (:func:`workspace_range`), or None when not asked for."""
    interval: dict[str, Any] | None = None
    """The validation-residual interval of ``device_peak_bytes`` (``uvmlab.memory.intervals.interval``)."""

    @property
    def device_peak_bytes(self) -> int:
        """What nvidia-smi shows at the peak: context + modules + peak reserved + buffers outside the allocator."""
        return self.context_bytes + self.peak_reserved_bytes + self.outside_allocator_bytes

    @property
    def usable_bytes(self) -> int:
        """GPU memory the allocator may use: capacity minus the CUDA context."""
        return self.gpu_memory_bytes - self.context_bytes

    @property
    def required_bytes(self) -> int:
        """``device_peak_bytes`` + margin."""
        return self.device_peak_bytes + self.margin_bytes

    @property
    def required_mb(self) -> int:
        """``required_bytes`` in MiB, rounded up."""
        return -(-self.required_bytes // MB_BYTES)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``uvmlab estimate --format json`` and result.json (keys in docs/estimate.md)."""
        ws = self.orchestration
        return {
            "schema": RESULT_SCHEMA,
            "workload": self.workload,
            "config": self.config,
            "gpu": self.gpu,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "context_bytes": self.context_bytes,
            "context_model": None if self.context is None else self.context.to_json(),
            "usable_bytes": self.usable_bytes,
            "allocator": self.allocator,
            "alloc_conf": self.alloc_conf,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_live_bytes": self.peak_live_bytes,
            "peak_reserved_on_gpu_bytes": self.peak_reserved_on_gpu_bytes,
            "peak_reserved_seq": self.peak_reserved_seq,
            "peak_reserved_phase": self.peak_reserved_phase,
            "peak_reserved_iteration": self.peak_reserved_iteration,
            "live_at_allocated_peak_bytes": self.live_at_allocated_peak,
            "fits": not self.oom,
            "oom": self.oom,
            "oom_seq": self.oom_seq,
            "oom_phase": self.oom_phase,
            "oom_iteration": self.oom_iteration,
            "alloc_retries_on_gpu": self.alloc_retries_on_gpu,
            "cudnn_workspaces_skipped_on_gpu": self.cudnn_workspaces_skipped_on_gpu,
            "outside_allocator_bytes": self.outside_allocator_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "device_peak_mb": -(-self.device_peak_bytes // MB_BYTES),
            "margin_bytes": self.margin_bytes,
            "margin_rule": self.margin_rule,
            "required_bytes": self.required_bytes,
            "required_mb": self.required_mb,
            "interval": self.interval,
            "workspace_bytes": {
                "cublas": ws.get("cublas_workspace_bytes"),
                "cublaslt": ws.get("cublaslt_workspace_bytes"),
                "cudnn_peak": ws.get("cudnn_workspace_peak_bytes"),
                "cudnn_benchmark_trial_peak": ws.get("cudnn_benchmark_trial_peak_bytes"),
            },
            "cudnn_workspace_model": (ws.get("rules") or {}).get("cudnn_workspace_model", "envelope"),
            "cudnn_workspace_range": None
            if self.cudnn_workspace_range is None
            else {
                "device_peak_bytes": self.cudnn_workspace_range,
                "min_bytes": min(self.cudnn_workspace_range.values()),
                "max_bytes": max(self.cudnn_workspace_range.values()),
            },
            "orchestration_changes": ws.get("changes", {}),
            "trace_allocations": self.trace_allocations,
            "trace_events": self.trace_events,
            "seconds": self.seconds,
        }

    def carma_text(self) -> str:
        """What CARMA's task file takes: one integer line in MB (CARMA reads ``int(float(line))``)."""
        return f"{self.required_mb}\n"


def required_margin(
    device_peak_bytes: int, trace: Trace, stack: bool = False, margin_bytes: int | None = None
) -> tuple[int, str]:
    """(margin, its rule) that ``required_mb`` adds to a job's device peak: ``margin_bytes`` when given, else the
    coverage rule of uvmlab.memory.intervals for the trace's family. The one rule of ``estimate`` (required_mb,
    ``--format carma``) and ``colocate`` (each job's need); CARMA's own placement margin
    (:data:`CARMA_PLACEMENT_MARGIN_MB`) comes on top, once, where jobs are placed."""
    if margin_bytes is not None:
        return int(margin_bytes), "given"
    iv = interval(device_peak_bytes, family_of(trace), stack)
    rule = (
        f"device peak x {iv['cover']:+.2%}: covers 95 % of every data set's validation rows of the "
        f"{iv['family']} family{' with a stack calibration' if stack else ''} (uvmlab.memory.intervals)"
    )
    return iv["required_bytes"] - device_peak_bytes, rule


def job_context(gpu: GpuSpec, trace: Trace, module_loading: str = "lazy", stack: Any = None) -> ContextModel | None:
    """The CUDA context (and loaded modules) of one training job on ``gpu``: the one rule of ``estimate`` and
    ``colocate``. None when the GpuSpec's ``context_bytes`` was set explicitly (the caller keeps it); else
    :func:`uvmlab.memory.devicemem.context_model` by GPU, module loading and whether ``trace`` launches convolutions
    (a CNN's lazily loaded cuDNN modules: 522 MiB on an A100 against 429 MiB without convolutions). ``stack``, a
    :class:`uvmlab.memory.stack.StackFit`, sets the module loading and adds its fitted fixed costs (and applies even
    where ``context_bytes`` was set)."""
    if gpu.context_bytes != DEFAULT_CONTEXT_BYTES and stack is None:
        return None
    names = trace.kernels["name"] if "name" in trace.kernels.columns else pd.Series([], dtype=object)
    convs = bool(names.map(op_base).isin(CONV_OPS).any())
    if stack is not None:
        module_loading = stack.module_loading
    extra = 0 if stack is None else stack.extra_bytes(convs)
    return context_model(gpu.name, module_loading, convolutions=convs, stack_bytes=extra)


def has_cudnn_convolutions(est: Estimate) -> bool:
    """Whether the orchestrated trace of ``est`` runs cuDNN convolutions (with or without a workspace)."""
    orch = est.orchestration
    return bool(
        (orch.get("changes") or {}).get("cudnn_workspace") or orch.get("cudnn_depthwise_calls_without_workspace")
    )


def workspace_range(est: Estimate, cfg: WorkloadConfig, gpu: GpuSpec, **kwargs: Any) -> dict[str, int]:
    """``device_peak_bytes`` of ``cfg`` under every cuDNN workspace model (``uvmlab.trace.cudnn_conv``).

    Which engine cuDNN's heuristics pick per call, and so its workspace, is unknown without cuDNN; each model sizes
    the buffers of one documented algorithm family (docs/estimate.md "Workspace models"), so their spread shows how
    much of the estimate hangs on that choice (not a bound: a real run may use other sizes). ``est`` is the
    estimate already made (its model is reused, not recomputed); ``kwargs`` are :func:`estimate`'s (the trace
    comes from the cache). A trace without cuDNN convolutions gives every model the same figure, so only
    ``est``'s is returned."""
    from uvmlab.trace.cudnn_conv import WORKSPACE_MODELS

    rules = kwargs.pop("rules", None) or OrchestrationRules()
    done = rules.cudnn_workspace_model
    out = {done: est.device_peak_bytes}
    if not has_cudnn_convolutions(est):
        return out
    for model in WORKSPACE_MODELS:
        if model != done:
            other = estimate(cfg, gpu, rules=replace(rules, cudnn_workspace_model=model), **kwargs)
            out[model] = other.device_peak_bytes
    return out


def default_margin(peak_reserved_bytes: int) -> int:
    """``max(MARGIN_FRACTION * peak reserved, MARGIN_MIN_BYTES)``."""
    return max(int(MARGIN_FRACTION * peak_reserved_bytes), MARGIN_MIN_BYTES)


def _place(trace: Trace, allocator: str, settings: Any, gpu: GpuSpec | None) -> Any:
    """The one integration point with the allocator simulators (``uvmlab.sim.allocator.placement.place``).

    ``gpu=None``: unlimited memory; otherwise the GPU's capacity with its CUDA context taken off the top.
    """
    from uvmlab.sim.allocator.placement import place

    if gpu is None:
        return place(trace, allocator=allocator, settings=settings)
    return place(
        trace,
        allocator=allocator,
        settings=settings,
        capacity_bytes=gpu.memory_bytes,
        context_bytes=gpu.context_bytes,
        skip_on_oom=cudnn_workspace_ids(trace),
    )


def _where(trace: Trace, seq: int | None) -> tuple[str | None, int | None]:
    """Phase and iteration of the allocation made at ``seq``."""
    if seq is None:
        return None, None
    a = trace.allocations
    rows = np.flatnonzero(a["alloc_seq"].to_numpy() == seq)
    if not len(rows):
        return None, None
    return str(a["phase"].iat[rows[0]]), int(a["iteration"].iat[rows[0]])


def _peak_seq(timeline: pd.DataFrame, column: str) -> int | None:
    """First seq at which ``column`` reaches its maximum."""
    if timeline.empty:
        return None
    return int(timeline["seq"].iloc[int(timeline[column].to_numpy().argmax())])


def estimate(
    cfg: WorkloadConfig,
    gpu: GpuSpec,
    allocator: str = "pca",
    alloc_conf: str = "",
    *,
    margin_bytes: int | None = None,
    rules: OrchestrationRules | None = None,
    trace: Trace | None = None,
    progress: ProgressFn | None = None,
    capture_progress: Callable[[int, int], None] | None = None,
    module_loading: str = "lazy",
    context: ContextModel | None = None,
    stack: Any = None,
) -> Estimate:
    """Estimate peak reserved/allocated memory, the OOM verdict, ``device_peak_bytes`` and ``required_mb``.

    ``trace`` skips the capture (tests, callers that already hold one). ``progress(message)`` is told each step;
    ``capture_progress(done_iterations, total)`` follows a capture when the trace is not cached yet.
    The CUDA context: ``context`` if given; else a ``gpu`` whose ``context_bytes`` was set explicitly (not the
    512 MiB placeholder of uvmlab.gpus) keeps it; else ``uvmlab.memory.devicemem.context_model(gpu.name,
    module_loading)``. The modelled context is also taken off the capacity for the OOM verdict.
    ``stack``: a :class:`uvmlab.memory.stack.StackFit` (``uvmlab calibrate --memory``): its module loading replaces
    ``module_loading`` and its fitted fixed costs are added to the context model.
    """
    from uvmlab.sim.allocator.allocconf import AllocatorSettings

    if allocator not in ALLOCATORS:
        raise InputError(f"allocator must be one of {', '.join(ALLOCATORS)}, not {allocator!r}")
    if margin_bytes is not None and margin_bytes < 0:
        raise InputError(f"the margin cannot be negative ({margin_bytes} B); pass 0 or more")
    settings = AllocatorSettings.parse(alloc_conf or "")
    if module_loading not in MODULE_LOADING:
        raise InputError(f"module loading must be one of {', '.join(MODULE_LOADING)}, not {module_loading!r}")
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    if trace is None:
        from uvmlab.trace.cache import get_trace

        say(f"trace of {cfg.workload} (cached after the first capture)")
        trace = get_trace(cfg, progress=capture_progress)
    t1 = time.perf_counter()
    if context is None:
        context = job_context(gpu, trace, module_loading, stack)
    if context is not None:
        if context.total_bytes >= gpu.memory_bytes:
            raise InputError(
                f"the modelled CUDA context ({context.total_bytes} B) does not fit {gpu.name}; give a larger GPU"
            )
        gpu = replace(gpu, context_bytes=context.total_bytes)
    say(f"orchestrating for {gpu.name}")
    cuda = to_cuda(trace, gpu, rules)
    t2 = time.perf_counter()
    say(f"simulating the {allocator} allocator")
    free_run = _place(cuda, allocator, settings, None)
    usable = gpu.memory_bytes - gpu.context_bytes
    on_gpu = free_run  # cudnn.benchmark trials that do not fit are halved, then dropped (cudnn_workspace_ids)
    if free_run.peak_reserved_bytes > usable:
        on_gpu = _place(cuda, allocator, settings, gpu)
    t3 = time.perf_counter()
    oom_seq = on_gpu.oom_seq
    phase, iteration = _where(cuda, oom_seq)
    peak_seq = _peak_seq(free_run.timeline, "reserved_bytes")
    peak_phase, peak_iteration = _where(cuda, peak_seq)
    alloc_peak_seq = _peak_seq(free_run.timeline, "allocated_bytes")
    peak_reserved = int(free_run.peak_reserved_bytes)
    device_peak = gpu.context_bytes + peak_reserved
    iv = interval(device_peak, family_of(trace), stack is not None)
    margin, rule = required_margin(device_peak, trace, stack is not None, margin_bytes)
    return Estimate(
        workload=cfg.workload,
        config=cfg.to_dict(),
        gpu=gpu.name,
        gpu_memory_bytes=gpu.memory_bytes,
        context_bytes=gpu.context_bytes,
        allocator=allocator,
        alloc_conf=alloc_conf or "",
        peak_reserved_bytes=peak_reserved,
        peak_allocated_bytes=int(free_run.peak_allocated_bytes),
        peak_live_bytes=peak_live(cuda)[0],
        peak_reserved_on_gpu_bytes=int(on_gpu.peak_reserved_bytes),
        oom=oom_seq is not None,
        oom_seq=None if oom_seq is None else int(oom_seq),
        oom_phase=phase,
        oom_iteration=iteration,
        peak_reserved_seq=peak_seq,
        peak_reserved_phase=peak_phase,
        peak_reserved_iteration=peak_iteration,
        live_at_allocated_peak=live_by_category(cuda, alloc_peak_seq),
        alloc_retries_on_gpu=(on_gpu.stats or {}).get("num_alloc_retries"),
        cudnn_workspaces_skipped_on_gpu=int(getattr(on_gpu, "skipped_on_oom", 0)),
        margin_bytes=margin,
        margin_rule=rule,
        orchestration=cuda.header.get("orchestration", {}),
        seconds={
            "trace": round(t1 - t0, 3),
            "orchestrate": round(t2 - t1, 3),
            "simulate": round(t3 - t2, 3),
            "total": round(t3 - t0, 3),
        },
        trace_allocations=len(cuda.allocations),
        trace_events=len(cuda.allocations) + int((cuda.allocations["free_seq"] != NEVER_FREED).sum()),
        timeline=on_gpu.timeline,
        trace=cuda,
        settings=settings,
        gpu_spec=gpu,
        constrained=on_gpu is not free_run,
        context=context,
        interval=iv,
    )


def snapshot_dicts(est: Estimate) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(segments, device_traces) of the simulated run (as judged on the GPU), for ``write_snapshot``."""

    if est.trace is None:
        raise InputError("this estimate carries no trace to export; run estimate() again")
    from uvmlab.export.snapshot import annotate

    seqs: list[int] = []
    sim = recorded_run(est.trace, est.allocator, est.settings, est.gpu_spec if est.constrained else None, seqs)
    if sim.peak_reserved_bytes != est.peak_reserved_on_gpu_bytes:
        raise InvariantError(
            f"snapshot replay peak reserved {sim.peak_reserved_bytes} B != "
            f"the estimate's {est.peak_reserved_on_gpu_bytes} B"
        )
    segments, traces = sim.to_snapshot_dicts()
    annotate(est.trace, segments, traces, seqs)  # op/category/phase/iteration frames; time_us: event index
    return segments, traces


def plot_curve(est: Estimate, path: str | Path | None = None) -> Any:
    """The memory curve: allocated and reserved GiB vs event sequence number; a matplotlib Figure (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = float(1 << 30)
    tl = est.timeline
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(tl["seq"], tl["reserved_bytes"] / gib, label="reserved (segments)", drawstyle="steps-post")
    ax.plot(tl["seq"], tl["allocated_bytes"] / gib, label="allocated (blocks)", drawstyle="steps-post")
    with_margin = (est.required_bytes - est.context_bytes) / gib
    ax.axhline(with_margin, color="gray", linestyle=":", label="peak reserved + margin")
    usable = est.usable_bytes / gib
    top = max(with_margin, float(tl["reserved_bytes"].max()) / gib if len(tl) else 0.0) * 1.15
    if usable <= 3 * top:
        ax.axhline(usable, color="red", linestyle="--", label=f"{est.gpu} usable (capacity - context)")
    else:  # far above the curve: keep the curve readable and say where the capacity is
        ax.set_ylim(0, top)
        ax.text(0.99, 0.97, f"{est.gpu} usable: {usable:.1f} GiB (off scale)", transform=ax.transAxes,
                ha="right", va="top", fontsize=8, color="red")  # fmt: skip
    if est.oom_seq is not None:
        ax.axvline(est.oom_seq, color="black", label="simulated OOM")
    if est.trace is not None and len(est.trace.allocations):
        starts = est.trace.allocations.groupby("iteration")["alloc_seq"].min()
        for it, seq in starts.items():
            if it >= 1:
                ax.axvline(seq, color="gray", linewidth=0.6, alpha=0.6)
                ax.annotate(f"it {it}", (seq, 0), fontsize=7, color="gray", xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("event (allocation/free sequence number)")
    ax.set_ylabel("GPU memory (GiB)")
    ax.set_title(f"{est.workload}: {est.allocator} allocator on {est.gpu}")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def write_estimate(est: Estimate, rundir: Any, config: dict[str, Any]) -> None:
    """Write config.json, env.json, the memory_timeline table, the memory_curve figure and result.json (last).

    ``rundir`` is a :class:`uvmlab.files.rundir.RunDir` the caller has already prepared.
    """
    import matplotlib.pyplot as plt

    from uvmlab.files.env import env_info

    rundir.write_json(rundir.config_json, config)
    rundir.write_json(rundir.env_json, env_info())
    rundir.write_table("memory_timeline", est.timeline)
    fig = plot_curve(est)
    rundir.write_figure("memory_curve", fig)
    plt.close(fig)
    rundir.write_json(rundir.result_json, est.to_json())
