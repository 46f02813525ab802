"""The scorecard's unit: one measured quantity next to uvmlab's prediction of it, and the registry of checks.

A *check* turns one real data set into points. Checks register themselves with :func:`check`; the scorecard
(`uvmlab validate`) runs every registered check (or the ``fast`` subset in CI) and tabulates the points.
Modules holding checks are listed in :data:`CHECK_MODULES` so that the registry is filled on import.

A long check registers with :func:`planned_check` instead: its function returns a :class:`Plan`, independent
:class:`Task` s (one simulation, one shard of rows) and how to turn their results into points. With ``--jobs`` > 1
the scorecard runs the tasks of every planned check in one worker pool, longest first, while the short checks
run in the parent, so that both cores stay busy until the end; with one job the tasks run here, in order. The
points are the same either way (each task is a pure function of its arguments; the assembly sees the results in
task order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        never within. A Python bool whatever the values' type (the scorecard tests ``is True``: a NumPy bool from
        NumPy values failed that test and counted a kept band as left).
        """
        if factor < 1.0:
            raise ValueError(f"a band factor is >= 1, not {factor}")
        r = self.ratio
        if r is None:
            return None
        tol = 1e-9
        return bool(r > 0 and 1.0 / factor - tol <= r <= factor + tol)

    @property
    def keeps_band(self) -> bool | None:
        """Whether the point stays within its declared ``band`` (None when it declares none or has no ratio)."""
        return None if self.band is None else self.within(self.band)


FAMILIES = ("memory", "allocator", "UVM timing", "UVM structure", "nsys")
"""What a point checks (``uvmlab validate`` gives its verdict per family, weakest first): ``memory`` a device's
peak memory (estimate, stack, context), ``allocator`` the caching-allocator replay of real snapshots, ``UVM timing``
times, rates and time ratios of UVM runs (the cost model), ``UVM structure`` counts of UVM events (faults, fault
batches, VA blocks: the driver model), ``nsys`` what uvmlab reads from nsys exports (the parser, and the link rates
the exports measure)."""
TIME_UNITS = frozenset({"s", "ms", "us", "ns", "x", "B/s"})
"""Units of the timing family: times, time ratios and transfer rates."""


def family_of(point: Point) -> str:
    """The family (:data:`FAMILIES`) of ``point``: from its data set, then its unit (one rule for every check)."""
    if point.dataset == "nsys" or point.dataset.startswith("nsys/"):
        return "nsys"
    if point.dataset == "snapshots" or point.dataset.startswith("snapshots/"):
        return "allocator"
    if point.dataset.startswith("memory") or point.dataset.startswith("cudnn") or point.unit == "bytes":
        return "memory"
    return "UVM timing" if point.unit in TIME_UNITS else "UVM structure"


CheckFn = Callable[[Path], list[Point]]


@dataclass(frozen=True)
class Check:
    """A registered check: ``fn(data_dir)`` returns the points of one data set."""

    name: str
    fn: CheckFn
    fast: bool  # part of the CI subset
    needs: str  # sub-folder of the real-data directory it reads (skipped with a reason where absent)
    plan: Callable[[Path], Plan] | None = None  # a planned check's tasks (``fn`` runs them in this process)


@dataclass(frozen=True)
class Task:
    """One independent unit of a planned check: ``fn(*args, **kwargs)``, run here or in a spawned worker.

    ``fn`` must be importable at module level (workers unpickle it by name) and its arguments picklable.
    ``cost`` is a rough CPU-second estimate used only to start the longest tasks first; ``items`` is how many of
    the check's progress items (rows, runs) the task covers."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    cost: float = 1.0
    items: int = 1

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


@dataclass(frozen=True)
class Plan:
    """A planned check: its tasks and ``assemble(results)`` (results in task order) giving its points."""

    tasks: list[Task]
    assemble: Callable[[list[Any]], list[Point]]

    def run(self) -> list[Point]:
        """Every task in this process, in order (reporting progress through the items), then the points."""
        done = item_progress(sum(t.items for t in self.tasks))
        results = []
        for t in self.tasks:
            results.append(t())
            done(t.items)
        return self.assemble(results)


CHECKS: dict[str, Check] = {}

#: Modules whose import registers checks (each owner adds its module here).
CHECK_MODULES: list[str] = [
    "uvmlab.validate.snapshot_checks",
    "uvmlab.validate.nsys_checks",
    "uvmlab.validate.kernel_checks",
    "uvmlab.validate.titanv_checks",
    "uvmlab.validate.microbench_checks",
    "uvmlab.validate.memory_checks",
    "uvmlab.validate.uvm_checks",
    "uvmlab.validate.record_checks",
    "uvmlab.validate.collect_checks",
]


def check(name: str, *, needs: str, fast: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check ``name`` reading ``<data_dir>/<needs>``."""

    def deco(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"check {name!r} registered twice")
        CHECKS[name] = Check(name=name, fn=fn, fast=fast, needs=needs)
        return fn

    return deco


def planned_check(name: str, *, needs: str, fast: bool = False) -> Callable[[Callable[[Path], Plan]], CheckFn]:
    """Register ``plan_fn`` (``data_dir -> Plan``) as the planned check ``name``; the decorated name becomes the
    serial check function (``data_dir -> list[Point]``, the tasks run in this process)."""

    def deco(plan_fn: Callable[[Path], Plan]) -> CheckFn:
        def run(data_dir: Path) -> list[Point]:
            return plan_fn(data_dir).run()

        run.__name__, run.__qualname__, run.__doc__ = plan_fn.__name__, plan_fn.__qualname__, plan_fn.__doc__
        run.__module__ = plan_fn.__module__
        if name in CHECKS:
            raise ValueError(f"check {name!r} registered twice")
        CHECKS[name] = Check(name=name, fn=run, fast=fast, needs=needs, plan=plan_fn)
        return run

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
