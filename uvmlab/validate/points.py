"""The scorecard's unit: one measured quantity next to uvmlab's prediction of it, and the registry of checks.

A *check* turns one real data set into points. Checks register themselves with :func:`check`; the scorecard
(`uvmlab validate`) runs every registered check (or the ``fast`` subset in CI) and tabulates the points.
Modules holding checks are listed in :data:`CHECK_MODULES` so that the registry is filled on import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

BANDS = (1.5, 2.0)
"""The scorecard's bands: a point is *within F x* when ``1/F <= predicted / measured <= F``."""


@dataclass(frozen=True)
class Point:
    """One measured quantity and uvmlab's prediction of it.

    ``fitted`` is true when the point was used to calibrate a constant (calibration set), false when it is a
    held-out validation point. ``predicted`` is None when uvmlab could not predict it (``note`` says why).
    ``band`` is the factor this validation point promises to stay within (CI fails when it does not; 1.0 means
    exact); None when the point is tabulated but promises nothing (a known miss, documented in its note).
    """

    dataset: str  # e.g. "uvm/noob512-uvm_rtx5090_pytorch_gcn"
    case: str  # e.g. "5M nodes, without user prefetch"
    quantity: str  # e.g. "uvm_epoch_time"
    unit: str  # e.g. "s", "bytes", "count"
    measured: float
    predicted: float | None
    fitted: bool = False
    note: str = ""
    band: float | None = None

    @property
    def ratio(self) -> float | None:
        """predicted / measured (None when either is missing or measured is 0)."""
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured

    def within(self, factor: float) -> bool | None:
        """True when predicted is within ``factor`` x of measured (both ways); None when there is no ratio.

        A factor of 1.0 means equal (up to float rounding: relative 1e-9). A negative ratio (opposite signs) is
        never within.
        """
        if factor < 1.0:
            raise ValueError(f"a band factor is >= 1, not {factor}")
        r = self.ratio
        if r is None:
            return None
        tol = 1e-9
        return r > 0 and 1.0 / factor - tol <= r <= factor + tol

    @property
    def keeps_band(self) -> bool | None:
        """Whether the point stays within its declared ``band`` (None when it declares none or has no ratio)."""
        return None if self.band is None else self.within(self.band)


CheckFn = Callable[[Path], list[Point]]


@dataclass(frozen=True)
class Check:
    """A registered check: ``fn(data_dir)`` returns the points of one data set."""

    name: str
    fn: CheckFn
    fast: bool  # part of the CI subset
    needs: str  # sub-folder of the real-data directory it reads (skipped with a reason where absent)


CHECKS: dict[str, Check] = {}

#: Modules whose import registers checks (each owner adds its module here).
CHECK_MODULES: list[str] = [
    "uvmlab.validate.snapshot_checks",
    "uvmlab.validate.nsys_checks",
    "uvmlab.validate.titanv_checks",
    "uvmlab.validate.microbench_checks",
    "uvmlab.validate.memory_checks",
    "uvmlab.validate.uvm_checks",
    "uvmlab.validate.record_checks",
]


def check(name: str, *, needs: str, fast: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check ``name`` reading ``<data_dir>/<needs>``."""

    def deco(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"check {name!r} registered twice")
        CHECKS[name] = Check(name=name, fn=fn, fast=fast, needs=needs)
        return fn

    return deco


Advance = Callable[[int, int], None]
"""``advance(done, total)``: a long check reports its progress through its own items (rows, runs)."""

_JOBS: ContextVar[int] = ContextVar("uvmlab_validate_jobs", default=1)
_ADVANCE: ContextVar[Advance | None] = ContextVar("uvmlab_validate_advance", default=None)


@contextmanager
def run_options(jobs: int = 1, advance: Advance | None = None) -> Iterator[None]:
    """While the scorecard runs its checks: the worker processes a check may use (``jobs``) and where it reports
    its progress through its items (``advance``)."""
    if jobs < 1:
        raise ValueError(f"jobs is >= 1, not {jobs}")
    tokens = _JOBS.set(jobs), _ADVANCE.set(advance)
    try:
        yield
    finally:
        _JOBS.reset(tokens[0])
        _ADVANCE.reset(tokens[1])


def jobs() -> int:
    """How many worker processes a check may use (1: run in this process)."""
    return _JOBS.get()


def item_progress(total: int) -> Callable[[int], None]:
    """A callback ``done(n)`` for a check working through ``total`` items: forwards the running count to the
    scorecard's progress (a no-op outside it)."""
    advance = _ADVANCE.get()
    count = [0]

    def done(n: int = 1) -> None:
        count[0] += n
        if advance is not None:
            advance(count[0], total)

    return done
