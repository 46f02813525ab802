"""Calibrate a software stack's fixed costs from measured peaks (``uvmlab calibrate --memory``) without learning one
model's error.

A cluster runs one stack (driver, CUDA, PyTorch, cuDNN, cuBLAS, module loading), and its fixed device memory is the
same for every job. uvmlab models that memory from sources (``uvmlab.memory.devicemem``); a stack can differ from the
model only by what a stack holds, each part bounded by its sources (:func:`stack_bounds`):

- the CUDA context: +-``CONTEXT_SPREAD_BYTES`` (the lazily loaded contexts measured: 287,047,680 B with a 20 MiB
  segment in pytorch/pytorch PR #86509, 426 MiB in unslothai/unsloth-zoo PR #1053);
- kernel images: lazy loading loads between none and all of the libraries' images for the GPU's SM
  (``devicemem.MODULE_IMAGES_MIB``, measured from the wheels' binaries), eager loading at least PR #86509's
  eager-minus-lazy ``EAGER_IMAGES_MIN_BYTES`` and at most all of them; the bound is that range minus what the context
  model already counts for the run;
- library handles' workspaces: +-``WORKSPACE_SPREAD_BYTES`` (cuBLAS 8.125 MiB per handle by default or 32 MiB,
  cuBLASLt 1 MiB or 32 MiB, across PyTorch releases).

What a measured job says beyond the estimate (its residual, measured - predicted) is that stack term plus the job's
own, model-specific error. :func:`fit_rows` separates them with what the user gives:

- each measured row brings an interval for the stack term: its residual +- its **band**, the error uvmlab's estimate
  of a job like it can have on its own: ``NOISE_FLOOR_BYTES`` + ``MODEL_PART_SPREAD[family]`` x the row's model part
  (predicted - context);
- a row whose band is wider than half the stack's whole range cannot tell a stack from its own error: it is listed,
  not used (unless its residual is beyond both: then it is refused, below);
- the stack term is the value nearest 0 (uvmlab's model as it is) inside the bounds and every used row's interval:
  only what the rows require is fitted, never more; more rows (other jobs, other batch sizes of one job) narrow the
  interval. Every row's residual after the fit is reported as its job's own;
- a job measured at two or more batch sizes is also split into a residual at batch 0 and one per sample (a line
  through its residuals), reported as the job's own; the intercept is not taken as the stack's: uvmlab's per-sample
  error is not linear in the batch where cuDNN changes engines (CARMA's ResNet-50: +648 MiB at batch 64, +26 MiB at
  128, a line whose intercept, +1,270 MiB, no stack holds);
- no value satisfies them all: with one row, its residual is more than a stack can hold (refused in one sentence);
  with several, one job's own error dominates (refused naming it, when leaving it out reconciles the others).

The output says how far the fit can be trusted: its rows and jobs, the interval the stack term is pinned to, each
job's residual after the fit and their spread. ``uvmlab estimate --stack`` adds the term to the context model
(``ContextModel.stack_bytes``) and uses the stack's module loading and GPU.

The measurement CSV (header required): ``workload`` (a name ``uvmlab estimate`` takes), ``batch``, and the measured
whole-device peak as ``measured_mib`` (nvidia-smi's MiB) or ``measured_bytes``; optional ``optimizer``, ``dtype``,
``image_size``, ``num_classes``, ``seq_len``, ``iterations``. This module never imports torch itself.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.files.inputs import read_csv_rows, read_json_file
from uvmlab.numbers import parse_float, parse_int, prefix
from uvmlab.units import MAX_BYTES, MiB

STACK_SCHEMA = "uvmlab.memory.stack/1"
MAX_MEASURED_BYTES = 16 << 20
"""Largest measured-memory CSV read (16 MiB; one row per measurement, a few dozen bytes each)."""
MAX_STACK_BYTES = 16 << 20
"""Largest stack file read (16 MiB; uvmlab writes about 2 KB)."""
OPTION_COLUMNS = ("image_size", "num_classes", "seq_len")
DEFAULT_ITERATIONS = 3

CONTEXT_SPREAD_BYTES = 426 * MiB - (287_047_680 - 20 * MiB)
"""How much two lazily loaded CUDA contexts differ: 426 MiB (PyTorch 2.10 / CUDA 13, RTX 6000 Ada; unslothai/unsloth-zoo
PR #1053) and 287,047,680 B less its 20 MiB allocator segment (PyTorch 1.13; pytorch/pytorch PR #86509): 172 MiB.
A stack's context may sit that far either side of uvmlab's."""
EAGER_IMAGES_MIN_BYTES = 666_632_192 - 287_047_680
"""The least that eager loading has been measured to add over lazy: 362 MiB (pytorch/pytorch PR #86509, an older and
smaller stack than any uvmlab models)."""
WORKSPACE_SPREAD_BYTES = int((32 - 8.125) * MiB + (32 - 1) * MiB)
"""How much the per-handle workspaces of one stream differ across PyTorch releases: cuBLAS 8.125 MiB (the default
``:4096:2:16:8``) or 32 MiB (sm90; pytorch/pytorch PR #89027, NVIDIA/TensorRT-LLM PR #3600), cuBLASLt 1 MiB
(PR #101145) or 32 MiB (PR #120925, reverted and re-landed since): 55 MiB."""
NOISE_FLOOR_BYTES = 66 * MiB
"""What one stack's small jobs scatter by without any model error: CARMA's 15 CIFAR-100 rows, the declared source of
``LAZY_CONV_MODULES_BYTES``, sit 93-159 MiB above the lazy context (66 MiB apart; allocator segments and the
1-second nvidia-smi sampling); GPUMemNet's 600 calibration rows of ``EAGER_MODULES_A100_BYTES`` spread 48 MiB (5-95 %).
Part of every job's band."""
MODEL_PART_SPREAD = {"cnn": 0.36, "mlp": 0.64}
"""The largest error of uvmlab's model part (predicted - context) seen on a validation job of the family, beyond
``NOISE_FLOOR_BYTES``, as a share of that part (measured 2026-11-29 on the rows of ``tools/memory_residuals.py``):
``cnn`` CARMA's VGG16 at batch 64 ((3,008 - 66) / 8,230 MiB = 0.357; cuDNN's engine choice, docs/estimate.md);
``mlp`` GPUMemNet's row 177 ((336 - 66) / 426 MiB = 0.634; a peak the 1-second sampling missed); rounded up. One
job's band is what uvmlab's estimate of a job like it has been off by on its own."""
MODEL_PART_SPREAD_WIDEST = max(MODEL_PART_SPREAD.values())
"""The band's share for a family without validation data (``transformer``): the widest of the others."""


@dataclass(frozen=True)
class MeasuredRow:
    """One measured job: what to estimate and its whole-device peak."""

    line: int
    config: WorkloadConfig
    measured_bytes: int


@dataclass(frozen=True)
class FitRow:
    """What the fit needs of one measured row (bytes): the measurement, uvmlab's prediction and its context part."""

    line: int
    workload: str
    job: str
    """The job's identity without its batch size (rows of one job at several batch sizes are fitted together)."""
    batch: int
    measured_bytes: float
    predicted_bytes: float
    context_bytes: float
    family: str
    convolutions: bool = False

    @property
    def residual_bytes(self) -> float:
        return self.measured_bytes - self.predicted_bytes

    @property
    def model_bytes(self) -> float:
        """The model-dependent part of the prediction: everything but the context."""
        return max(0.0, self.predicted_bytes - self.context_bytes)


@dataclass(frozen=True)
class StackBounds:
    """How far a stack's fixed costs can sit from uvmlab's context model (bytes, :func:`stack_bounds`)."""

    low: int
    high: int
    parts: dict[str, tuple[int, int]]

    @property
    def half_range(self) -> float:
        return (self.high - self.low) / 2


def stack_bounds(gpu_name: str, module_loading: str, convolutions: bool) -> StackBounds:
    """The bounds of a stack term on ``gpu_name`` with ``module_loading``, for runs with or without cuDNN convolutions
    (module docstring: context, kernel images, per-handle workspaces)."""
    from uvmlab.memory.devicemem import MODULE_IMAGES_MIB, context_model, image_bytes, sm_version

    ctx = context_model(gpu_name, module_loading, convolutions=convolutions)
    counted = ctx.eager_modules_bytes + ctx.eager_cudnn_bytes + ctx.lazy_conv_modules_bytes
    every = image_bytes(tuple(MODULE_IMAGES_MIB), sm_version(gpu_name))
    least = EAGER_IMAGES_MIN_BYTES if module_loading == "eager" else 0
    images = (min(0, least - counted), max(0, every - counted))
    parts = {
        "cuda_context": (-CONTEXT_SPREAD_BYTES, CONTEXT_SPREAD_BYTES),
        "kernel_images": images,
        "handle_workspaces": (-WORKSPACE_SPREAD_BYTES, WORKSPACE_SPREAD_BYTES),
    }
    return StackBounds(sum(lo for lo, _ in parts.values()), sum(hi for _, hi in parts.values()), parts)


def band_bytes(family: str, model_bytes: float) -> float:
    """A job's own error band: ``NOISE_FLOOR_BYTES`` + its family's ``MODEL_PART_SPREAD`` x its model part."""
    return NOISE_FLOOR_BYTES + MODEL_PART_SPREAD.get(family, MODEL_PART_SPREAD_WIDEST) * model_bytes


@dataclass(frozen=True)
class Evidence:
    """What one measured row says about the stack term: ``residual`` +- ``band`` (its job's own error)."""

    job: str
    line: int
    batch: int
    residual: float
    band: float
    usable: bool

    @property
    def interval(self) -> tuple[float, float]:
        return self.residual - self.band, self.residual + self.band


def evidence(rows: list[FitRow], bounds: StackBounds) -> list[Evidence]:
    """One :class:`Evidence` per row (module docstring)."""
    out = []
    for r in rows:
        band = band_bytes(r.family, r.model_bytes)
        out.append(Evidence(r.job, r.line, r.batch, r.residual_bytes, band, usable=band <= bounds.half_range))
    return out


def per_sample(rows: list[FitRow]) -> dict[str, tuple[float, float]]:
    """For each job measured at two or more batch sizes: (residual at batch 0, residual per sample) of the
    least-squares line through its residuals: the fixed and per-sample parts of what uvmlab's estimate misses."""
    jobs: dict[str, list[FitRow]] = {}
    for r in rows:
        jobs.setdefault(r.job, []).append(r)
    out = {}
    for job, members in jobs.items():
        if len({r.batch for r in members}) < 2:
            continue
        xs = [float(r.batch) for r in members]
        ys = [r.residual_bytes for r in members]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        out[job] = (my - slope * mx, slope)
    return out


@dataclass
class StackFit:
    """The fitted fixed costs of a stack (module docstring), written as JSON by :meth:`write`."""

    gpu: str
    module_loading: str
    fixed_bytes: int
    cudnn_bytes: int = 0
    """Fitted by an older uvmlab (a separate term for runs with cuDNN convolutions); 0 for new fits, whose bounds
    count cuDNN's kernel images instead. Still applied when a file has it."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    interval_bytes: list[int] = field(default_factory=list)
    """[low, high]: the stack terms every used job and the bounds allow (the fit is the value nearest 0)."""
    bounds_bytes: dict[str, list[int]] = field(default_factory=dict)
    """The bounds by part (``stack_bounds``) and their sum (``total``)."""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    """Jobs measured at two or more batch sizes: their residual at batch 0 and per sample (reported, not fitted)."""

    def extra_bytes(self, convolutions: bool) -> int:
        """What the stack adds to a run's context (``cudnn_bytes`` only for runs with cuDNN convolutions)."""
        return self.fixed_bytes + (self.cudnn_bytes if convolutions else 0)

    def to_json(self) -> dict[str, Any]:
        return {"schema": STACK_SCHEMA, **asdict(self)}

    def write(self, path: str | Path) -> None:
        from uvmlab.files.atomic import atomic_write_text, to_json

        atomic_write_text(Path(path), to_json(self.to_json()))


def _mib(x: float) -> str:
    return f"{x / MiB:+,.0f} MiB"


def _where(ev: Evidence) -> str:
    return f"line {ev.line}, batch {ev.batch}"


def _intersect(intervals: list[tuple[float, float]], bounds: StackBounds) -> tuple[float, float]:
    low = max([float(bounds.low), *(lo for lo, _ in intervals)])
    high = min([float(bounds.high), *(hi for _, hi in intervals)])
    return low, high


def _refuse(used: list[Evidence], bounds: StackBounds) -> InputError:
    """The one-sentence refusal of evidence that no stack term satisfies (module docstring)."""
    if len(used) == 1:
        ev = used[0]
        return InputError(
            f"the residual of {ev.job} ({_where(ev)}: {_mib(ev.residual)}) is more than a stack can hold "
            f"({_mib(bounds.low)} to {_mib(bounds.high)} beyond uvmlab's context model, by sources) even allowing "
            f"this job's own error of +-{ev.band / MiB:,.0f} MiB: it is the job's error, not the stack's; calibrate on "
            "a smaller job or on two batch sizes of one"
        )
    for ev in used:
        rest = [e.interval for e in used if e is not ev]
        low, high = _intersect(rest, bounds)
        if low <= high:
            return InputError(
                f"{ev.job} ({_where(ev)}) asks for a stack term of {_mib(ev.interval[0])} to {_mib(ev.interval[1])}, "
                f"the other rows for {_mib(low)} to {_mib(high)}: this job's own error dominates the fit; leave it "
                "out or measure it again"
            )
    return InputError(
        "the measured jobs ask for stack terms that no single stack satisfies (each job's interval: "
        + "; ".join(f"{e.job} {_mib(e.interval[0])} to {_mib(e.interval[1])}" for e in used)
        + "): their own errors dominate; measure smaller jobs or two batch sizes of one"
    )


def fit_rows(rows: list[FitRow], gpu: str, module_loading: str) -> StackFit:
    """Fit the stack term to ``rows`` (module docstring); InputError when no stack term satisfies them."""
    if not rows:
        raise InputError("no measured rows to fit a stack on; one measured job is enough")
    bounds = stack_bounds(gpu, module_loading, any(r.convolutions for r in rows))
    found = evidence(rows, bounds)
    # used: the rows small enough to tell, and any whose residual neither a stack nor its own error can explain
    used = [e for e in found if e.usable or _intersect([e.interval], bounds)[0] > _intersect([e.interval], bounds)[1]]
    low, high = _intersect([e.interval for e in used], bounds)
    if low > high:
        raise _refuse(used, bounds)
    fixed = int(min(max(0.0, low), high))
    by_line = {r.line: r for r in rows}
    table = [
        {
            "line": r.line,
            "workload": r.workload,
            "batch": r.batch,
            "measured_bytes": int(r.measured_bytes),
            "predicted_bytes": int(r.predicted_bytes),
            "context_bytes": int(r.context_bytes),
            "residual_bytes": int(r.residual_bytes),
            "residual_after_fit_bytes": int(r.residual_bytes - fixed),
            "band_bytes": int(band_bytes(r.family, r.model_bytes)),
            "used": any(e.line == r.line for e in used),
            "family": r.family,
            "convolutions": r.convolutions,
        }
        for r in (by_line[n] for n in sorted(by_line))
    ]
    after = [t["residual_after_fit_bytes"] for t in table]
    lines = per_sample(rows)
    notes = [
        f"{len(rows)} row(s) of {len({r.job for r in rows})} job(s) ({len(lines)} at two or more batch sizes); "
        f"{len(used)} row(s) used",
        f"a stack on {gpu} with {module_loading} loading can differ from uvmlab's context model by {_mib(bounds.low)} "
        f"to {_mib(bounds.high)} (context, kernel images, handle workspaces; uvmlab.memory.stack)",
    ]
    if used:
        notes.append(
            f"the used rows pin the stack term to {_mib(low)} .. {_mib(high)}; fitted {_mib(fixed)} (the value nearest "
            "uvmlab's model): trust it to +-" + f"{(high - low) / 2 / MiB:,.0f} MiB"
        )
    else:
        notes.append("no job is small enough to tell a stack from its own error: nothing fitted (stack term 0)")
    notes += [
        f"{e.job} ({_where(e)}) not used: its own error band (+-{e.band / MiB:,.0f} MiB) is wider than half of what a "
        "stack can hold"
        for e in found
        if e not in used
    ]
    notes += [
        f"{job}: its residual is {fixed_part / MiB:+,.0f} MiB at batch 0 and {slope / MiB:+,.2f} MiB per sample (a "
        "line through its batch sizes; the fit does not take the intercept as the stack's: uvmlab's per-sample error "
        "is not linear in the batch where cuDNN changes engines)"
        for job, (fixed_part, slope) in lines.items()
    ]
    notes.append(
        f"each row's residual after the fit is its job's own error: {min(after) / MiB:+,.0f} to "
        f"{max(after) / MiB:+,.0f} MiB"
    )
    return StackFit(
        gpu=gpu,
        module_loading=module_loading,
        fixed_bytes=fixed,
        rows=table,
        notes=notes,
        interval_bytes=[int(low), int(high)] if used else [],
        bounds_bytes={
            **{k: [int(a), int(b)] for k, (a, b) in bounds.parts.items()},
            "total": [bounds.low, bounds.high],
        },
        jobs=[
            {"job": job, "residual_at_batch_0_bytes": int(c), "residual_per_sample_bytes": int(g)}
            for job, (c, g) in lines.items()
        ],
    )


def _int(text: str, what: str, line: int) -> int:
    """A positive whole number of a measured CSV cell, at most 2**63 - 1 (uvmlab.numbers: inf, nan and a
    5,000-digit value are one sentence)."""
    value = parse_float(text, f"measured CSV line {line}: {what}")
    if not value > 0:
        raise InputError(f"measured CSV line {line}: {what} {prefix(text)} is not positive")
    if value > MAX_BYTES:
        raise InputError(f"measured CSV line {line}: {what} {prefix(text)} does not fit 64 bits")
    return int(value)


def read_measured(path: str | Path) -> list[MeasuredRow]:
    """The rows of a measurement CSV (module docstring); InputError names the line and column at fault."""
    src = Path(path)
    fields, raws = read_csv_rows(src, MAX_MEASURED_BYTES, "a measured-memory CSV (workload, batch, measured_mib)")
    cols = set(fields)
    if not {"workload", "batch"} <= cols or not cols & {"measured_mib", "measured_bytes"}:
        raise InputError(f"measured CSV {src} needs the columns workload, batch and measured_mib (or measured_bytes)")
    rows = []
    for n, raw in enumerate(raws, start=2):
        workload = (raw.get("workload") or "").strip()
        if not workload:
            raise InputError(f"measured CSV line {n}: empty workload")
        if raw.get("measured_mib"):
            measured = _int(raw["measured_mib"], "measured_mib", n) * MiB
            if measured > MAX_BYTES:
                raise InputError(
                    f"measured CSV line {n}: measured_mib {prefix(raw['measured_mib'])} is over 2**63 bytes"
                )
        else:
            measured = _int(raw.get("measured_bytes") or "", "measured_bytes", n)
        options = {k: _int(raw[k], k, n) for k in OPTION_COLUMNS if raw.get(k)}
        cfg = WorkloadConfig(
            workload=workload,
            batch_size=_int(raw["batch"], "batch", n),
            optimizer=(raw.get("optimizer") or "adam").strip(),
            dtype=(raw.get("dtype") or "auto").strip(),
            iterations=_int(raw["iterations"], "iterations", n) if raw.get("iterations") else DEFAULT_ITERATIONS,
            options=options,
        )
        rows.append(MeasuredRow(n, cfg, measured))
    if not rows:
        raise InputError(f"measured CSV {src} has no rows; one measured job is enough")
    return rows


EstimateFn = Callable[[WorkloadConfig], Any]
"""``cfg -> Estimate`` without a stack (``uvmlab.memory.estimate.estimate`` bound to a GPU and module loading)."""


def job_key(cfg: WorkloadConfig) -> str:
    """A job's identity without its batch size: its workload, optimizer, dtype, iterations and options."""
    options = ",".join(f"{k}={v}" for k, v in sorted(cfg.options.items()))
    return f"{cfg.workload} ({cfg.optimizer}, {cfg.dtype}, {cfg.iterations} it" + (f", {options})" if options else ")")


def fit_stack(rows: list[MeasuredRow], estimate_fn: EstimateFn, gpu: str, module_loading: str) -> StackFit:
    """Estimate each measured row as ``uvmlab estimate`` would (whole-device peak) and fit the stack (:func:`fit_rows`);
    ``estimate_fn`` estimates one row without a stack."""
    from uvmlab.memory.estimate import has_cudnn_convolutions
    from uvmlab.memory.intervals import family_of

    fit = []
    for row in rows:
        est = estimate_fn(row.config)
        trace = getattr(est, "trace", None)
        fit.append(
            FitRow(
                line=row.line,
                workload=row.config.workload,
                job=job_key(row.config),
                batch=int(row.config.batch_size or 0),
                measured_bytes=float(row.measured_bytes),
                predicted_bytes=float(est.device_peak_bytes),
                context_bytes=float(est.context_bytes),
                family=family_of(trace) if trace is not None else "cnn",
                convolutions=has_cudnn_convolutions(est),
            )
        )
    return fit_rows(fit, gpu, module_loading)


def _stack_bytes(value: Any, what: str) -> int:
    """A byte count of a stack file: a finite number within int64 (a fit may be negative: cuDNN's share)."""
    return parse_int(int(parse_float(value, what)), what)


def load_stack(path: str | Path) -> StackFit:
    """A stack file written by :func:`fit_stack` / ``uvmlab calibrate --memory``."""
    src = Path(path)
    doc = read_json_file(src, MAX_STACK_BYTES, "a stack file (uvmlab calibrate --memory)")
    if not isinstance(doc, dict) or doc.get("schema") != STACK_SCHEMA:
        raise InputError(f"stack file {src} is not a {STACK_SCHEMA} file (write one with uvmlab calibrate --memory)")
    try:
        return StackFit(
            gpu=str(doc["gpu"]),
            module_loading=str(doc["module_loading"]),
            fixed_bytes=_stack_bytes(doc["fixed_bytes"], f"stack file {src}: fixed_bytes"),
            cudnn_bytes=_stack_bytes(doc.get("cudnn_bytes", 0), f"stack file {src}: cudnn_bytes"),
            rows=list(doc.get("rows", [])),
            notes=list(doc.get("notes", [])),
            interval_bytes=list(doc.get("interval_bytes", [])),
            bounds_bytes=dict(doc.get("bounds_bytes", {})),
            jobs=list(doc.get("jobs", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"stack file {src} lacks or garbles {exc}") from None


def calibrate_memory(path: str | Path, gpu_name: str, module_loading: str = "lazy", progress: Any = None) -> StackFit:
    """Read the measurement CSV at ``path`` and fit the stack on ``gpu_name`` (``uvmlab calibrate --memory``)."""
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.estimate import estimate

    rows = read_measured(path)
    gpu = get_gpu(gpu_name)

    def one(cfg: WorkloadConfig) -> Any:
        if progress is not None:
            progress(f"estimating {cfg.workload} at batch {cfg.batch_size}")
        return estimate(cfg, gpu, module_loading=module_loading)

    return fit_stack(rows, one, gpu.name, module_loading)
