"""Run the registered checks on a real-data folder and tabulate measured vs predicted (`uvmlab validate`).

``validate(data_dir, fast=..., out=...)`` imports :data:`uvmlab.validate.points.CHECK_MODULES` (which fills the
registry), runs every check whose folder exists (the others are skipped with the reason), and returns a
:class:`Scorecard`. With ``out``, it writes a run directory (atomically, result.json last):
``tables/scorecard.parquet`` (one row per point), ``figures/scorecard.png`` (predicted vs measured, log-log) and
``result.json`` (summary: counts within 1.5x and 2x over the validation points, overall and per dataset).

A check that raises is a bug in uvmlab: it is recorded in ``errors`` (the other checks still run) and the CLI exits
with code 3 after writing what it has.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError
from uvmlab.validate.points import (
    BANDS,
    CHECK_MODULES,
    CHECKS,
    FAMILIES,
    Check,
    Plan,
    Point,
    Task,
    family_of,
    run_options,
)

COLUMNS = ["dataset", "case", "quantity", "unit", "measured", "predicted", "ratio",
           "within_1.5x", "within_2x", "fitted", "band", "keeps_band", "check", "note", "family"]  # fmt: skip
"""Columns of ``scorecard.parquet`` (``ratio`` = predicted / measured; ``band`` the factor a point promises)."""


def default_data_dir() -> Path:
    """$UVMLAB_REAL_DATA, else ../shared/real-data next to the checkout."""
    env = os.environ.get("UVMLAB_REAL_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "real-data"


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path:
    """``data_dir`` (or the default) as a Path; InputError when it is not a folder."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    if not root.is_dir():
        raise InputError(
            f"real-data folder {root} not found: give DATA_DIR, set UVMLAB_REAL_DATA, or put shared/real-data "
            "beside the checkout"
        )
    return root


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def load_checks() -> dict[str, Check]:
    """Import every module in CHECK_MODULES (registering its checks) and return the registry."""
    for name in CHECK_MODULES:
        importlib.import_module(name)
    return CHECKS


@dataclass
class Scorecard:
    """The points of one `uvmlab validate` run, and what did not run."""

    data_dir: str
    fast: bool
    points: list[tuple[str, Point]] = field(default_factory=list)  # (check name, point)
    ran: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> reason
    errors: dict[str, str] = field(default_factory=dict)  # check -> exception (a uvmlab bug)
    cpu_seconds: float = 0.0  # this process and its worker processes
    wall_seconds: float = 0.0
    timings: dict[str, tuple[float, float]] = field(default_factory=dict)  # check -> (wall s, CPU s incl. workers)

    def frame(self) -> pd.DataFrame:
        """One row per point (columns :data:`COLUMNS`)."""
        rows = []
        for name, p in self.points:
            d = asdict(p)
            d.update(
                ratio=p.ratio,
                **{"within_1.5x": p.within(1.5), "within_2x": p.within(2.0)},
                keeps_band=p.keeps_band,
                check=name,
                family=family_of(p),
            )
            rows.append(d)
        df = pd.DataFrame(rows, columns=COLUMNS)
        for col in ("within_1.5x", "within_2x", "keeps_band"):
            df[col] = df[col].astype("boolean")
        for col in ("measured", "predicted", "ratio", "band"):
            df[col] = df[col].astype("float64")
        return df

    def broken_bands(self) -> list[Point]:
        """Validation points that promise a band and are outside it (or have no prediction)."""
        return [p for _, p in self.points if not p.fitted and p.band is not None and p.keeps_band is not True]

    def summary(self) -> dict[str, Any]:
        """Counts within the bands over validation points (fitted points counted apart), overall and per dataset."""

        def counts(points: Iterable[Point]) -> dict[str, Any]:
            pts = list(points)
            val = [p for p in pts if not p.fitted]
            out: dict[str, Any] = {
                "points": len(pts),
                "fitted_points": len(pts) - len(val),
                "validation_points": len(val),
                "validation_predicted": sum(p.ratio is not None for p in val),
            }
            for f in BANDS:
                out[f"validation_within_{f:g}x"] = sum(bool(p.within(f)) for p in val)
            out["validation_with_band"] = sum(p.band is not None for p in val)
            out["validation_band_kept"] = sum(p.keeps_band is True for p in val)
            return out

        datasets = sorted({p.dataset for _, p in self.points})
        families = {f: counts(p for _, p in self.points if family_of(p) == f) for f in FAMILIES}
        return {
            "data_dir": self.data_dir,
            "fast": self.fast,
            "checks_run": self.ran,
            "checks_skipped": self.skipped,
            "check_errors": self.errors,
            **counts(p for _, p in self.points),
            "by_family": {f: families[f] for f in weakest_first(families)},
            "by_dataset": {ds: counts(p for _, p in self.points if p.dataset == ds) for ds in datasets},
            "cpu_seconds": round(self.cpu_seconds, 2),
            "wall_seconds": round(self.wall_seconds, 2),
            "check_seconds": {n: {"wall": round(w, 2), "cpu": round(c, 2)} for n, (w, c) in self.timings.items()},
        }

    @classmethod
    def read(cls, run_dir: str | os.PathLike[str]) -> Scorecard:
        """The scorecard a ``uvmlab validate -o RUN_DIR`` wrote (its points from tables/scorecard.parquet, what ran,
        was skipped and the times from result.json), e.g. to render docs/fidelity.md without running it again."""
        import math

        from uvmlab.files.rundir import RunDir

        rd = RunDir(run_dir)
        s = rd.read_result()
        df = rd.read_table("scorecard")

        def value(v: Any) -> Any:
            return None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else v

        card = cls(data_dir=str(s["data_dir"]), fast=bool(s["fast"]))
        for r in df.to_dict("records"):
            point = Point(
                dataset=r["dataset"], case=r["case"], quantity=r["quantity"], unit=r["unit"],
                measured=float(r["measured"]), predicted=value(r["predicted"]), fitted=bool(r["fitted"]),
                note=r["note"] or "", band=value(r["band"]),
            )  # fmt: skip
            card.points.append((str(r["check"]), point))
        card.ran, card.skipped, card.errors = list(s["checks_run"]), dict(s["checks_skipped"]), dict(s["check_errors"])
        card.cpu_seconds, card.wall_seconds = float(s["cpu_seconds"]), float(s["wall_seconds"])
        card.timings = {n: (float(t["wall"]), float(t["cpu"])) for n, t in s["check_seconds"].items()}
        return card

    def write(self, out: str | os.PathLike[str] | Any, force: bool = False) -> Path:
        """Write tables/scorecard.parquet, figures/scorecard.png and result.json (last) to run directory ``out``
        (a path, or a RunDir already prepared by :func:`validate`); the writer's lock is released after."""
        from uvmlab.files.rundir import RunDir
        from uvmlab.validate.figure import scorecard_figure

        rd = RunDir.for_writing(out, force)  # refuses a foreign folder or a complete one without force; locks it
        with rd:
            df = self.frame()
            rd.write_table("scorecard", df)
            fig = scorecard_figure(df)
            try:
                rd.write_figure("scorecard", fig)
            finally:
                import matplotlib.pyplot as plt

                plt.close(fig)
            rd.write_json(rd.result_json, self.summary())
        return rd.path


def weakest_first(counts: dict[str, dict[str, Any]]) -> list[str]:
    """Names of ``counts`` (per family or data set, as in :meth:`Scorecard.summary`) with validation points, the
    lowest share within 1.5x first (ties: the lower share within 2x, then more points first); those without
    validation points last."""

    def share(name: str, key: str) -> float:
        c = counts[name]
        return c[key] / c["validation_points"] if c["validation_points"] else 2.0

    return sorted(
        counts,
        key=lambda n: (share(n, "validation_within_1.5x"), share(n, "validation_within_2x"), -counts[n]["points"]),
    )


def family_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(family, verdict) per family, weakest first: ``23/34 within 1.5x (68 %), 29/34 within 2x; band kept
    27/27; 2 fitted points`` (the one wording of ``uvmlab validate`` and tools/gen_fidelity_doc.py)."""
    out = []
    for family, c in summary["by_family"].items():
        v = c["validation_points"]
        if not c["points"]:
            out.append((family, "no points (its data sets are absent or not checked)"))
        elif not v:
            out.append((family, f"no validation points; {c['fitted_points']} fitted points"))
        else:
            share = 100 * c["validation_within_1.5x"] / v
            kept = f"band kept {c['validation_band_kept']}/{c['validation_with_band']}"
            out.append(
                (
                    family,
                    f"{c['validation_within_1.5x']}/{v} within 1.5x ({share:.0f} %), "
                    f"{c['validation_within_2x']}/{v} within 2x; {kept}; {c['fitted_points']} fitted points",
                )
            )
    return out


def overall_line(summary: dict[str, Any]) -> str:
    """Every validation point counted together, saying how much of it is the largest data set (a headline over
    all points hides the small families: read :func:`family_lines` first)."""
    val = summary["validation_points"]
    line = (
        f"all {summary['points']} points ({summary['fitted_points']} fitted, {val} validation): "
        f"{summary['validation_within_1.5x']}/{val} within 1.5x, {summary['validation_within_2x']}/{val} within 2x"
    )
    by_ds = summary["by_dataset"]
    if val and by_ds:
        big = max(by_ds, key=lambda d: by_ds[d]["validation_points"])
        n = by_ds[big]["validation_points"]
        if n > val / 2:
            line += f"; {n} of the {val} validation points are {big}'s"
    return line


def select_checks(registry: dict[str, Check], fast: bool, only: Iterable[str] = ()) -> list[Check]:
    """The checks to run: those named in ``only`` (all when empty), restricted to the fast subset with ``fast``."""
    only = list(only)
    unknown = [n for n in only if n not in registry]
    if unknown:
        raise InputError(f"unknown check {unknown[0]!r}: known checks are {', '.join(sorted(registry))}")
    chosen = [registry[n] for n in only] if only else list(registry.values())
    return [c for c in chosen if c.fast or not fast]


def validate(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    fast: bool = False,
    only: Iterable[str] = (),
    out: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
    advance: Callable[[str, int, int], None] | None = None,
) -> Scorecard:
    """Run the checks on ``data_dir`` (default :func:`default_data_dir`) and return (and with ``out``, write)
    the scorecard. ``progress(name)`` is called after each check, ``advance(name, done, total)`` as a long check
    works through its items; a check may use ``jobs`` worker processes (the points do not depend on it)."""
    if jobs < 1:
        raise InputError(f"--jobs must be >= 1, not {jobs}")
    root = resolve_data_dir(data_dir)
    checks = select_checks(load_checks(), fast, only)
    if checks and not any((root / c.needs).is_dir() for c in checks):
        needs = sorted({c.needs.split("/")[0] for c in checks})
        raise InputError(f"{root} holds none of the real-data folders the checks read ({', '.join(needs)})")
    rd = _output_rundir(out, root, force)  # before any check runs: a refused -o costs nothing
    try:
        card = _run_checks(root, checks, fast, progress, jobs, advance)
        if rd is not None:
            card.write(rd)
    finally:
        if rd is not None:
            rd.release()
    return card


def _output_rundir(out: str | os.PathLike[str] | None, root: Path, force: bool) -> Any:
    """The prepared (owned, locked) run directory ``out``, before any check runs; None without ``out``.

    ``out`` may not be the data folder (or a file in it) whatever ``--force`` says (uvmlab.files.outputs)."""
    if out is None:
        return None
    from uvmlab.files.outputs import check_paths
    from uvmlab.files.rundir import RunDir

    check_paths([("-o", out, True)], [("the data folder", root)])
    return RunDir.for_writing(out, force)


def _run_checks(
    root: Path,
    checks: list[Check],
    fast: bool,
    progress: Callable[[str], None] | None,
    jobs: int = 1,
    advance: Callable[[str, int, int], None] | None = None,
) -> Scorecard:
    """Run ``checks``; with ``jobs`` > 1 the planned checks' tasks go to one pool of ``jobs`` spawned workers
    (longest first) while the other checks run here. The points come out in check order either way."""
    card = Scorecard(data_dir=str(root), fast=fast)
    start = _clocks()
    present = [c for c in checks if (root / c.needs).is_dir()]
    pooled = [c for c in present if c.plan is not None] if jobs > 1 else []
    points: dict[str, list[Point]] = {}
    pool = _PlannedPool(root, pooled, jobs, card, advance) if pooled else None
    try:
        for c in checks:
            if c not in present:
                card.skipped[c.name] = f"{root / c.needs} is absent"
            elif c not in pooled:
                t0 = _clocks()
                step = None if advance is None else (lambda done, total, name=c.name: advance(name, done, total))
                got = _guarded(card, c.name, lambda c=c, step=step: _serial(c, root, jobs, step))
                if got is not None:
                    points[c.name] = got
                t1 = _clocks()
                card.timings[c.name] = (t1[0] - t0[0], t1[1] - t0[1])
            else:
                continue  # reported when its tasks finish
            if progress is not None:
                progress(c.name)
        if pool is not None:
            for name, got in pool.finished():
                if got is not None:
                    points[name] = got
                if progress is not None:
                    progress(name)
    finally:
        if pool is not None:
            pool.close()
    card.ran = [c.name for c in checks if c.name in points]
    card.points = [(c.name, p) for c in checks if c.name in points for p in points[c.name]]
    card.timings = {c.name: card.timings[c.name] for c in checks if c.name in card.timings}
    end = _clocks()
    card.wall_seconds, card.cpu_seconds = end[0] - start[0], end[1] - start[1]
    return card


def _serial(c: Check, root: Path, jobs: int, step: Callable[[int, int], None] | None) -> list[Point]:
    with run_options(jobs, step):
        return c.fn(root)


def _guarded(card: Scorecard, name: str, fn: Callable[[], Any]) -> Any:
    """``fn()``; an exception other than InputError is recorded as the check's error (a uvmlab bug) -> None."""
    try:
        return fn()
    except InputError:
        raise
    except Exception as exc:  # a check's bug must not hide the other checks' results
        card.errors[name] = f"{type(exc).__name__}: {exc}"
        return None


def _timed_task(task: Task) -> tuple[Any, float, float]:
    """Run ``task`` (in a worker) and return (result, wall s, CPU s of this process)."""
    w0, c0 = time.perf_counter(), time.process_time()
    result = task()
    return result, time.perf_counter() - w0, time.process_time() - c0


class _PlannedPool:
    """The tasks of the planned checks in a pool of spawned workers (not forked: the parent may hold threads,
    e.g. a progress bar), submitted longest first; :meth:`finished` yields each check's points as it completes.

    A check's timing is the sum of its tasks' wall and CPU seconds in the workers (its busy time)."""

    def __init__(
        self,
        root: Path,
        checks: list[Check],
        jobs: int,
        card: Scorecard,
        advance: Callable[[str, int, int], None] | None,
    ) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.card, self.advance = card, advance
        self.plans: dict[str, Plan] = {}
        self.unplanned: list[str] = []  # crashed while planning
        for c in checks:
            assert c.plan is not None
            plan = _guarded(card, c.name, lambda c=c: c.plan(root))  # type: ignore[misc]
            if plan is None:
                self.unplanned.append(c.name)
            else:
                self.plans[c.name] = plan
        order = sorted(
            ((name, i, t) for name, plan in self.plans.items() for i, t in enumerate(plan.tasks)),
            key=lambda x: -x[2].cost,
        )
        workers = max(1, min(jobs, len(order)))
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        self.futures = {self.pool.submit(_timed_task, t): (name, i) for name, i, t in order}

    def finished(self) -> Iterator[tuple[str, list[Point] | None]]:
        """(check name, its points or None when it crashed) as each planned check's last task completes."""
        from concurrent.futures import as_completed

        results: dict[str, dict[int, Any]] = {name: {} for name in self.plans}
        done_items = dict.fromkeys(self.plans, 0)
        for name in self.plans:
            self.card.timings[name] = (0.0, 0.0)
        for name in self.unplanned:
            yield name, None
        for name, plan in self.plans.items():
            if not plan.tasks:
                yield name, _guarded(self.card, name, lambda p=plan: p.assemble([]))
        for fut in as_completed(self.futures):
            name, i = self.futures[fut]
            plan = self.plans[name]
            if name in self.card.errors:
                continue
            try:
                result, wall, cpu = fut.result()
            except Exception as exc:  # a task's bug: the check crashed, the others go on
                self.card.errors[name] = f"{type(exc).__name__}: {exc}"
                yield name, None
                continue
            w, c = self.card.timings[name]
            self.card.timings[name] = (w + wall, c + cpu)
            results[name][i] = result
            done_items[name] += plan.tasks[i].items
            if self.advance is not None:
                self.advance(name, done_items[name], sum(t.items for t in plan.tasks))
            if len(results[name]) == len(plan.tasks):
                ordered = [results[name][k] for k in range(len(plan.tasks))]
                yield name, _guarded(self.card, name, lambda p=plan, r=ordered: p.assemble(r))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _clocks() -> tuple[float, float]:
    """(wall, CPU) seconds now; the CPU of this process plus its finished worker processes (``os.times``)."""
    t = os.times()
    return time.perf_counter(), t.user + t.system + t.children_user + t.children_system
