"""Peak-memory estimators behind one interface, ``estimate(case) -> bytes``, for the evaluation harness.

- ``uvmlab-pca``: uvmlab's PyTorch caching-allocator simulator (``uvmlab.sim.allocator.placement.place(trace, "pca")``;
  for a workload case ``uvmlab.memory.estimate.estimate(cfg, gpu, "pca")``): peak reserved bytes.
- ``uvmlab-nocache``: the same with caching off (one cudaMalloc per tensor, ``PYTORCH_NO_CUDA_MEMORY_CACHING``).
- ``shape-inference``: the peak of the sum of live tensor bytes (what Horus-style formulas and FakeTensor memory
  counters report): no rounding, no allocator, no framework memory.
- ``dnnmem``: DNNMem-style analytic liveness (the trace's alloc/free order) with a plain BFC arena
  (``uvmlab.evaluate.bfc``) and none of PyTorch's allocator rules. Like DNNMem it sees the cuDNN/cuBLAS
  workspaces (a workload's trace is orchestrated with ``uvmlab.trace.orchestrate.to_cuda``); shape inference
  does not.

A workload case is estimated for an A100 with the case's ``gpu_memory`` (the GPU model only changes the
orchestrator's workspace rules).

The uvmlab estimators are imported lazily, so this module imports without torch. A workload case captures its
trace with ``uvmlab.trace.cache.get_trace`` (torch) the first time a baseline needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError, UnavailableError
from uvmlab.evaluate.bfc import BfcArena
from uvmlab.trace.schema import Trace
from uvmlab.trace.summary import peak_live


@dataclass
class EvalCase:
    """One ground-truth run: what the estimators see (a trace, or a workload to trace) and what was measured."""

    case_id: str
    gpu_memory_bytes: int
    oom: bool
    measured_peak_bytes: float
    """Peak reserved bytes of the real run (NaN when it went out of memory)."""
    trace: Trace | None = None
    workload: WorkloadConfig | None = None
    alloc_conf: str = ""
    group: str = ""
    source: str = ""
    round2_oom: bool | None = None
    round2_peak_bytes: float | None = None
    notes: list[str] = field(default_factory=list)
    target: str = "reserved"
    """What was measured: ``reserved`` (PyTorch's ``max_memory_reserved()``), ``device`` (nvidia-smi / NVML
    whole-process memory: uvmlab then reports ``device_peak_bytes``) or ``after_context`` (NVML peak minus a
    first sample taken once the CUDA context existed: uvmlab reports :func:`after_context_bytes`)."""
    gpu_name: str | None = None
    """The GPU of the run (a ``uvmlab.gpus`` name, or a name ``uvmlab.memory.devicemem`` knows); None: an A100."""
    module_loading: str = "lazy"
    """CUDA module loading of the run (``uvmlab.memory.devicemem``), for ``target`` ``device`` or ``after_context``."""
    recorded: dict[str, float] = field(default_factory=dict)
    """Estimates other tools published for this run, by estimator name (``RECORDED_PEERS``)."""
    fitted: bool = False
    """True when the run was used to calibrate anything (it is then not a validation point)."""

    def get_trace(self) -> Trace:
        """The trace estimators see; a workload case is captured (meta device, cached) on first use."""
        if self.trace is None:
            if self.workload is None:
                raise InputError(f"case {self.case_id}: neither a trace nor a workload to estimate")
            from uvmlab.trace.cache import get_trace

            self.trace = get_trace(self.workload)
        return self.trace

    def get_cuda_trace(self) -> Trace:
        """The CUDA-level trace: a workload's trace orchestrated (workspaces) for an A100 of the case's memory;
        a snapshot or trace-directory case is already CUDA-level."""
        trace = self.get_trace()
        if self.workload is None:
            return trace
        from uvmlab.trace.orchestrate import to_cuda

        return to_cuda(trace, case_gpu(self))


def case_gpu(case: EvalCase) -> Any:
    """The GpuSpec a case is estimated on (its GPU name and memory)."""
    from dataclasses import replace

    from uvmlab.gpus import GPUS, get_gpu

    if case.gpu_name is not None and case.gpu_name not in GPUS:
        # a GPU uvmlab.gpus does not list (e.g. xMem's RTX 3060): only its name (SM count, uvmlab.memory.devicemem) and
        # memory matter to the estimate; the cuBLAS workspace default is the same for every non-sm90 GPU
        return replace(get_gpu("RTX4060"), name=case.gpu_name, memory_bytes=case.gpu_memory_bytes)
    base = get_gpu(case.gpu_name or "A100-80GB")
    if case.gpu_memory_bytes == base.memory_bytes:
        return base
    return base.with_memory(case.gpu_memory_bytes) if case.gpu_memory_bytes > base.context_bytes else base


class Estimator(Protocol):
    """A peak-memory estimator: ``estimate(case)`` returns predicted peak bytes."""

    name: str

    def estimate(self, case: EvalCase) -> int: ...


def shape_inference_peak(trace: Trace) -> int:
    """Peak of the sum of live requested tensor bytes over the trace."""
    return peak_live(trace)[0]


def bfc_peak(trace: Trace) -> int:
    """Replay the trace's alloc/free order through :class:`BfcArena`; return the arena's high-water mark."""
    arena = BfcArena()
    addr: dict[int, int] = {}
    for ev in trace.events().itertuples(index=False):
        if ev.is_alloc:
            addr[int(ev.alloc_id)] = arena.malloc(int(ev.size_bytes))
        else:
            arena.free(addr.pop(int(ev.alloc_id)))
    return int(arena.peak_bytes)


class ShapeInferenceEstimator:
    """Peak of live tensor bytes (Horus / FakeTensor counters)."""

    name = "shape-inference"

    def estimate(self, case: EvalCase) -> int:
        return shape_inference_peak(case.get_trace())


class DnnMemEstimator:
    """DNNMem-style: liveness from the (CUDA-level) trace and a plain BFC arena, no caching-allocator rules."""

    name = "dnnmem"

    def estimate(self, case: EvalCase) -> int:
        return bfc_peak(case.get_cuda_trace())


class UvmlabEstimator:
    """uvmlab's allocator simulator (``pca`` or ``nocache``): peak reserved bytes."""

    def __init__(self, allocator: str = "pca", rules: Any = None) -> None:
        """``rules``: ``uvmlab.trace.orchestrate.OrchestrationRules`` for workload cases (None: the defaults)."""
        if allocator not in ("pca", "nocache"):
            raise InputError(f"uvmlab estimator allocator must be pca or nocache, not {allocator!r}")
        self.allocator = allocator
        self.rules = rules
        self.name = f"uvmlab-{allocator}"

    def estimate(self, case: EvalCase) -> int:
        if case.workload is not None:
            from uvmlab.memory.estimate import estimate

            est = estimate(
                case.workload,
                case_gpu(case),
                allocator=self.allocator,
                alloc_conf=case.alloc_conf,
                trace=case.trace,
                rules=self.rules,
                module_loading=case.module_loading,  # the context model, as `uvmlab estimate` builds it
            )
            if case.target == "device":
                return int(est.device_peak_bytes)
            return int(after_context_bytes(est) if case.target == "after_context" else est.peak_reserved_bytes)
        if case.target in DEVICE_TARGETS:
            raise UnavailableError(f"case {case.case_id}: a device-level measurement needs a workload, not a trace")
        return placement_peak(case.get_trace(), self.allocator, case.alloc_conf)


DEVICE_TARGETS = ("device", "after_context")
"""Targets measured by NVML, which include memory outside the caching allocator (they need a workload)."""


def after_context_bytes(est: Any) -> int:
    """NVML growth over a first sample taken after the CUDA context was created: ``device_peak_bytes`` minus the
    context as created (LMEM and the rest of a lazy context, ``uvmlab.memory.devicemem``); what stays is the reserved
    peak, buffers outside the allocator and the modules the run loads after that sample (lazy loading: the
    conv-run kernels and library handles; eager: none, they load with the context). Without a context model
    (a GpuSpec's fixed ``context_bytes``) nothing can be split off: the reserved peak plus outside buffers."""
    ctx = est.context
    if ctx is None:
        return int(est.peak_reserved_bytes + est.outside_allocator_bytes)
    loaded_later = ctx.lazy_conv_modules_bytes + ctx.eager_cudnn_bytes  # cuDNN opens its sub-libraries on first use
    return int(est.peak_reserved_bytes + est.outside_allocator_bytes + loaded_later)


class RecordedEstimator:
    """A peer's own published estimate for the run (e.g. xMem's evaluation_result.json), read from the case."""

    def __init__(self, name: str) -> None:
        self.name = name

    def estimate(self, case: EvalCase) -> int:
        value = case.recorded.get(self.name)
        if value is None or value != value:  # absent or NaN
            raise UnavailableError(f"case {case.case_id}: no recorded {self.name} estimate")
        return int(value)


def placement_peak(trace: Trace, allocator: str, alloc_conf: str = "") -> int:
    """Peak reserved bytes of ``uvmlab.sim.allocator.placement.place(trace, allocator)`` (settings from
    ``alloc_conf``)."""
    from uvmlab.sim.allocator.allocconf import AllocatorSettings
    from uvmlab.sim.allocator.placement import place

    settings = AllocatorSettings.parse(alloc_conf) if alloc_conf else None
    result = place(trace, allocator, settings=settings)
    return int(result.peak_reserved_bytes)


ESTIMATORS = ("uvmlab-pca", "uvmlab-nocache", "shape-inference", "dnnmem")
RECORDED_PEERS = ("xmem", "dnnmem-reported", "schedtune")
"""Peers whose own estimates a ground truth can carry (xMem's sample: xMem, DNNMem and SchedTune as xMem ran them)."""


def get_estimators(names: tuple[str, ...] | list[str] = ESTIMATORS) -> list[Estimator]:
    """Estimator objects by name (``ESTIMATORS``)."""
    table: dict[str, Any] = {
        "uvmlab-pca": lambda: UvmlabEstimator("pca"),
        "uvmlab-nocache": lambda: UvmlabEstimator("nocache"),
        "shape-inference": ShapeInferenceEstimator,
        "dnnmem": DnnMemEstimator,
        **{p: (lambda p=p: RecordedEstimator(p)) for p in RECORDED_PEERS},
    }
    out = []
    for n in names:
        if n not in table:
            raise InputError(f"unknown estimator {n!r}; known: {', '.join((*ESTIMATORS, *RECORDED_PEERS))}")
        out.append(table[n]())
    return out
