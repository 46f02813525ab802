"""Calibrate the fixed costs of one software stack from measured peaks (``uvmlab calibrate --memory``).

A cluster runs one stack (driver, CUDA, PyTorch, cuDNN, cuBLAS, module loading), and its fixed device memory is the
same for every job: the CUDA context, the library kernel images it loads, the per-handle workspaces, and what its
``nvidia-smi`` counts beyond the process. uvmlab models each of those from sources (``uvmlab.memory.devicemem``);
what a given stack differs by is one constant, which one measured job reveals. :func:`fit_stack` estimates each
measured row as ``uvmlab estimate`` would (whole-device peak, ``device_peak_bytes``), and fits

- ``fixed_bytes``: the median of measured - predicted over the rows (one row is enough);
- ``cudnn_bytes``: only when the rows include runs with and without cuDNN convolutions, the difference of the two
  groups' medians (what the stack's cuDNN costs beyond the model), else 0.

Nothing model-specific is fitted: no per-layer, per-batch or per-sample term. ``uvmlab estimate --stack FILE``
adds them to the context model (``ContextModel.stack_bytes``) and uses the stack's module loading and GPU.

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


@dataclass(frozen=True)
class MeasuredRow:
    """One measured job: what to estimate and its whole-device peak."""

    line: int
    config: WorkloadConfig
    measured_bytes: int


@dataclass
class StackFit:
    """The fitted fixed costs of a stack (module docstring), written as JSON by :meth:`write`."""

    gpu: str
    module_loading: str
    fixed_bytes: int
    cudnn_bytes: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def extra_bytes(self, convolutions: bool) -> int:
        """What the stack adds to a run's context (``cudnn_bytes`` only for runs with cuDNN convolutions)."""
        return self.fixed_bytes + (self.cudnn_bytes if convolutions else 0)

    def to_json(self) -> dict[str, Any]:
        return {"schema": STACK_SCHEMA, **asdict(self)}

    def write(self, path: str | Path) -> None:
        from uvmlab.files.atomic import atomic_write_text, to_json

        atomic_write_text(Path(path), to_json(self.to_json()))


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
            dtype=(raw.get("dtype") or "fp32").strip(),
            iterations=_int(raw["iterations"], "iterations", n) if raw.get("iterations") else DEFAULT_ITERATIONS,
            options=options,
        )
        rows.append(MeasuredRow(n, cfg, measured))
    if not rows:
        raise InputError(f"measured CSV {src} has no rows; one measured job is enough")
    return rows


EstimateFn = Callable[[WorkloadConfig], Any]
"""``cfg -> Estimate`` without a stack (``uvmlab.memory.estimate.estimate`` bound to a GPU and module loading)."""


def fit_stack(rows: list[MeasuredRow], estimate_fn: EstimateFn, gpu: str, module_loading: str) -> StackFit:
    """Fit the stack's fixed costs to ``rows`` (module docstring); ``estimate_fn`` estimates one row without a stack."""
    from uvmlab.memory.estimate import has_cudnn_convolutions

    table = []
    for row in rows:
        est = estimate_fn(row.config)
        table.append(
            {
                "line": row.line,
                "workload": row.config.workload,
                "batch": row.config.batch_size,
                "measured_bytes": row.measured_bytes,
                "predicted_bytes": int(est.device_peak_bytes),
                "residual_bytes": int(row.measured_bytes - est.device_peak_bytes),
                "convolutions": has_cudnn_convolutions(est),
            }
        )
    conv = [r["residual_bytes"] for r in table if r["convolutions"]]
    plain = [r["residual_bytes"] for r in table if not r["convolutions"]]
    notes = [f"fitted on {len(table)} row(s): {len(conv)} with cuDNN convolutions, {len(plain)} without"]
    if conv and plain:
        fixed = int(statistics.median(plain))
        cudnn = int(statistics.median(conv)) - fixed
    else:
        fixed, cudnn = int(statistics.median(conv or plain)), 0
        notes.append("one kind of run only: cuDNN's share is not separated (cudnn_bytes = 0)")
    return StackFit(gpu, module_loading, fixed, cudnn, table, notes)


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
