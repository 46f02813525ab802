"""Validation rows of every whole-device memory data set, stack calibration on one declared row, and residuals.

The data sets (measured with nvidia-smi / NVML; docs/evaluation.md):

- ``carma``: CARMA's A100-40GB CNN runs (``uvmlab.evaluate.carma_runs``; lazy loading); its CIFAR-100 rows are the
  declared calibration subset of ``LAZY_CONV_MODULES_BYTES``, its ImageNet rows validation only.
- ``gpumemnet``: the GPUMemNet A100 MLP set (``uvmlab.evaluate.gpumemnet``; eager loading); every
  ``CALIBRATION_STRIDE``-th row calibrated ``EAGER_MODULES_A100_BYTES``.
- ``xmem``: xMem's RTX 3060/4060 sample (``uvmlab.evaluate.xmem_sample``; NVML growth after the context).

A :class:`Row` is one measured run with uvmlab's prediction, its context part and its model family (``family``).
:func:`stack_rows` redoes a data set as ``uvmlab calibrate --memory`` + ``uvmlab estimate --stack`` would with
declared rows (``STACK_FIT_ROWS``): the stack term ``uvmlab.memory.stack.fit_rows`` fits on them (0 when it refuses)
is added to every other row's prediction (the stack file only adds to the context, so this equals re-estimating with
it; checked in tests/test_memory_stack.py). :func:`stack_choices` does it for every choice of the one calibration job
(each row, and each pair of batch sizes of one job) and scores the other rows, as a user who measured that job would
see them (docs/evaluation.md). :func:`residuals` are the relative residuals ``measured / predicted - 1`` that
``uvmlab.memory.intervals`` turns into intervals and ``required_mb``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from uvmlab.errors import InputError
from uvmlab.memory.intervals import family_of
from uvmlab.memory.stack import FitRow, fit_rows

__all__ = [
    "DATASET_STACKS",
    "STACK_FIT_ROWS",
    "Row",
    "family_of",
    "fit_row",
    "residuals",
    "stack_choices",
    "stack_offset",
    "stack_rows",
    "summary",
    "validation",
]

STACK_FIT_ROWS = {
    "carma": "resnet18_cifar100.py_bs32",
    "gpumemnet": "row 0",
    "xmem": "ConvNeXtTiny_SGD_200",
}
"""The one row of each data set a stack calibration is fitted on (declared; CARMA: a CIFAR row, never ImageNet)."""
DATASET_STACKS = {"carma": ("A100-40GB", "lazy"), "gpumemnet": ("A100-40GB", "eager"), "xmem": ("RTX3060", "lazy")}
"""The GPU and module loading of each data set's stack (a stack calibration's bounds depend on them)."""


@dataclass(frozen=True)
class Row:
    """One measured run of a data set and uvmlab's prediction of the same quantity, in bytes."""

    dataset: str
    case: str
    family: str
    measured: float
    predicted: float
    calibration: bool = False
    """The row calibrated one of uvmlab's constants (CARMA CIFAR, GPUMemNet stride rows): not a validation row."""
    stack_fit: bool = False
    """The row a stack calibration was fitted on (:func:`stack_rows`)."""
    context: float = 0.0
    """The context part of ``predicted`` (what a stack term can differ from; for ``after_context`` targets: the
    modules loaded after the first sample)."""
    job: str = ""
    """The job without its batch size (rows of one job at several batch sizes); empty: the case itself."""
    batch: int = 0
    convolutions: bool = False

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured

    @property
    def residual(self) -> float:
        """measured / predicted - 1: the factor a prediction needs to reach the measurement."""
        return self.measured / self.predicted - 1.0


def fit_row(row: Row, line: int = 0) -> FitRow:
    """The stack fit's view of ``row``."""
    return FitRow(line, row.case, row.job or row.case, row.batch, row.measured, row.predicted, row.context,
                  row.family, row.convolutions)  # fmt: skip


def stack_offset(rows: list[Row], fit_cases: list[str]) -> float | None:
    """The stack term ``uvmlab calibrate --memory`` fits on the rows ``fit_cases`` (None: it refuses)."""
    chosen = [r for r in rows if r.case in fit_cases]
    if len(chosen) != len(set(fit_cases)):
        raise ValueError(f"rows {fit_cases!r} are not all in the data set")
    gpu, loading = DATASET_STACKS[chosen[0].dataset]
    try:
        return float(fit_rows([fit_row(r, i) for i, r in enumerate(chosen)], gpu, loading).fixed_bytes)
    except InputError:
        return None


def stack_rows(rows: list[Row], fit_case: str | list[str]) -> list[Row]:
    """The data set's rows after a stack calibration on ``fit_case`` (module docstring; a refused fit adds 0)."""
    cases = [fit_case] if isinstance(fit_case, str) else list(fit_case)
    offset = stack_offset(rows, cases) or 0.0
    return [replace(r, predicted=r.predicted + offset, stack_fit=r.case in cases) for r in rows]


def _others(rows: list[Row], chosen: set[str], offset: float) -> tuple[float, float, float, float]:
    """Median and worst |error| of the rows not chosen, without and with ``offset``."""
    others = [r for r in rows if r.case not in chosen]
    before = [abs(r.error) for r in others]
    after = [abs(r.predicted + offset - r.measured) / r.measured for r in others]
    return statistics.median(before), max(before), statistics.median(after), max(after)


def stack_choices(rows: list[Row]) -> list[dict[str, Any]]:
    """Every choice a user could calibrate on (each row; each pair of batch sizes of one job), with the other rows'
    median and worst |error| without a calibration, with the whole-residual fit of uvmlab before issue 44 (``old``),
    and with :func:`stack_offset` (``new``; a refusal leaves the estimates as they are)."""
    choices = [[r.case] for r in rows]
    jobs: dict[str, list[Row]] = {}
    for r in rows:
        if r.job:
            jobs.setdefault(r.job, []).append(r)
    for members in jobs.values():
        members = sorted(members, key=lambda r: r.batch)
        choices += [[a.case, b.case] for i, a in enumerate(members) for b in members[i + 1 :] if a.batch != b.batch]
    out = []
    for cases in choices:
        chosen = [r for r in rows if r.case in cases]
        old = statistics.fmean(r.measured - r.predicted for r in chosen)  # the median of one or two: their mean
        new = stack_offset(rows, cases)
        med0, worst0, med_old, worst_old = _others(rows, set(cases), old)
        _, _, med_new, worst_new = _others(rows, set(cases), new or 0.0)
        out.append({"cases": cases, "old_offset": old, "new_offset": new, "median_before": med0,
                    "worst_before": worst0, "median_old": med_old, "worst_old": worst_old, "median_new": med_new,
                    "worst_new": worst_new})  # fmt: skip
    return out


def validation(rows: list[Row]) -> list[Row]:
    """Rows that calibrated nothing (neither a uvmlab constant nor the stack)."""
    return [r for r in rows if not r.calibration and not r.stack_fit]


def summary(rows: list[Row]) -> dict[str, Any]:
    """MRE (median |error|), worst |error|, share under-predicted, over the validation rows."""
    val = validation(rows)
    if not val:
        return {"rows": 0}
    errs = [abs(r.error) for r in val]
    return {
        "rows": len(val),
        "mre": statistics.median(errs),
        "worst": max(errs),
        "under": sum(r.predicted < r.measured for r in val) / len(val),
    }


def residuals(rows: list[Row]) -> list[float]:
    """Relative residuals (``Row.residual``) of the validation rows."""
    return [r.residual for r in validation(rows)]
