"""Validation rows of every whole-device memory data set, stack calibration on one declared row, and residuals.

The data sets (measured with nvidia-smi / NVML; docs/evaluation.md):

- ``carma``: CARMA's A100-40GB CNN runs (``uvmlab.evaluate.carma_runs``; lazy loading); its CIFAR-100 rows are the
  declared calibration subset of ``LAZY_CONV_MODULES_BYTES``, its ImageNet rows validation only.
- ``gpumemnet``: the GPUMemNet A100 MLP set (``uvmlab.evaluate.gpumemnet``; eager loading); every
  ``CALIBRATION_STRIDE``-th row calibrated ``EAGER_MODULES_A100_BYTES``.
- ``xmem``: xMem's RTX 3060/4060 sample (``uvmlab.evaluate.xmem_sample``; NVML growth after the context).

A :class:`Row` is one measured run with uvmlab's prediction and its model family (``family``). :func:`stack_rows`
redoes a data set as ``uvmlab calibrate --memory`` + ``uvmlab estimate --stack`` would with one declared row
(``STACK_FIT_ROWS``): the stack's fixed cost is measured - predicted on that row, added to every other row's
prediction (the stack file only adds to the context, so this equals re-estimating with it; checked in
tests/test_memory_stack.py). :func:`residuals` are the relative residuals ``measured / predicted - 1`` that
``uvmlab.memory.intervals`` turns into intervals and ``required_mb``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from uvmlab.memory.intervals import family_of

__all__ = ["STACK_FIT_ROWS", "Row", "family_of", "residuals", "stack_rows", "summary", "validation"]

STACK_FIT_ROWS = {
    "carma": "resnet18_cifar100.py_bs32",
    "gpumemnet": "row 0",
    "xmem": "ConvNeXtTiny_SGD_200",
}
"""The one row of each data set a stack calibration is fitted on (declared; CARMA: a CIFAR row, never ImageNet)."""


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

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured

    @property
    def residual(self) -> float:
        """measured / predicted - 1: the factor a prediction needs to reach the measurement."""
        return self.measured / self.predicted - 1.0


def stack_rows(rows: list[Row], fit_case: str) -> list[Row]:
    """The data set's rows after a stack calibration on ``fit_case`` (module docstring)."""
    fit = [r for r in rows if r.case == fit_case]
    if not fit:
        raise ValueError(f"no row {fit_case!r} to fit the stack on")
    offset = fit[0].measured - fit[0].predicted
    return [replace(r, predicted=r.predicted + offset, stack_fit=r.case == fit_case) for r in rows]


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
