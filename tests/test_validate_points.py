"""Unit tests of the scorecard's Point (ratio, bands), the check registry and the scorecard runner (fake checks)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from uvmlab.errors import InputError
from uvmlab.validate import points as P
from uvmlab.validate.points import CHECK_MODULES, CHECKS, Check, Point
from uvmlab.validate.scorecard import Scorecard, load_checks, select_checks, validate


def pt(measured: float, predicted: float | None, **kw: object) -> Point:
    return Point("ds", "case", "q", "count", measured, predicted, **kw)  # type: ignore[arg-type]


def test_ratio_is_predicted_over_measured_and_none_without_either() -> None:
    assert pt(4, 6).ratio == 1.5
    assert pt(0, 6).ratio is None
    assert pt(4, None).ratio is None


@pytest.mark.parametrize(
    ("measured", "predicted", "factor", "inside"),
    [
        (100, 150, 1.5, True),  # on the edge counts as within
        (150, 100, 1.5, True),  # both directions
        (100, 151, 1.5, False),
        (100, 65, 1.5, False),
        (100, 199, 2.0, True),
        (100, 49, 2.0, False),
        (100, 100, 1.0, True),  # band 1.0: exact
        (100, 101, 1.0, False),
        (100, -100, 2.0, False),  # opposite signs are never within
    ],
)
def test_within_band(measured: float, predicted: float, factor: float, inside: bool) -> None:
    assert pt(measured, predicted).within(factor) is inside


def test_within_without_ratio_is_none_and_bad_factor_raises() -> None:
    assert pt(10, None).within(2.0) is None
    with pytest.raises(ValueError, match=">= 1"):
        pt(1, 1).within(0.5)


def test_keeps_band_only_when_declared() -> None:
    assert pt(10, 30).keeps_band is None
    assert pt(10, 30, band=2.0).keeps_band is False
    assert pt(10, 12, band=1.5).keeps_band is True
    assert pt(10, None, band=1.5).keeps_band is None


def test_check_registers_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(P, "CHECKS", {})

    @P.check("x", needs="uvm")
    def fn(data_dir: Path) -> list[Point]:
        return []

    assert P.CHECKS["x"] == Check(name="x", fn=fn, fast=False, needs="uvm")
    with pytest.raises(ValueError, match="registered twice"):
        P.check("x", needs="uvm")(fn)


def test_every_check_module_imports_and_registers() -> None:
    before = {n: c.fn.__module__ for n, c in load_checks().items()}
    for name in CHECK_MODULES:
        importlib.import_module(name)
        assert name in before.values(), f"{name} registers no check"
    assert all(c.needs for c in CHECKS.values())


def _fake(monkeypatch: pytest.MonkeyPatch, name: str, needs: str, points: list[Point], fast: bool = True) -> None:
    def fn(data_dir: Path) -> list[Point]:
        if not points:
            raise RuntimeError("boom")
        return points

    monkeypatch.setitem(CHECKS, name, Check(name=name, fn=fn, fast=fast, needs=needs))


def test_summary_counts_validation_points_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    pts = [
        pt(10, 10, band=1.0),
        pt(10, 14),  # within 1.5x
        pt(10, 18),  # within 2x only
        pt(10, 50),  # outside both
        pt(10, None),  # no prediction
        pt(10, 100, fitted=True),  # fitted: not counted among validation points
    ]
    _fake(monkeypatch, "fake-a", "a", pts)
    _fake(monkeypatch, "fake-absent", "absent", [pt(1, 1)])
    card = validate(tmp_path, only=["fake-a", "fake-absent"])
    s = card.summary()
    assert s["points"] == 6 and s["fitted_points"] == 1 and s["validation_points"] == 5
    assert s["validation_within_1.5x"] == 2 and s["validation_within_2x"] == 3
    assert s["validation_predicted"] == 4
    assert card.skipped == {"fake-absent": f"{tmp_path / 'absent'} is absent"}
    assert card.ran == ["fake-a"] and not card.broken_bands()
    df = card.frame()
    assert len(df) == 6 and df["ratio"].isna().sum() == 1 and df["fitted"].sum() == 1


def test_broken_band_and_crashing_check_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    _fake(monkeypatch, "fake-off", "a", [pt(10, 20, band=1.5), pt(10, 20, band=1.5, fitted=True)])
    _fake(monkeypatch, "fake-crash", "a", [])
    card = validate(tmp_path, only=["fake-off", "fake-crash"])
    assert [p.predicted for p in card.broken_bands()] == [20]  # fitted points promise nothing
    assert card.errors == {"fake-crash": "RuntimeError: boom"}


def test_select_checks_fast_and_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, "fake-slow", "a", [pt(1, 1)], fast=False)
    _fake(monkeypatch, "fake-fast", "a", [pt(1, 1)], fast=True)
    assert [c.name for c in select_checks(CHECKS, True, ["fake-slow", "fake-fast"])] == ["fake-fast"]
    assert len(select_checks(CHECKS, False, ["fake-slow", "fake-fast"])) == 2
    with pytest.raises(InputError, match="unknown check"):
        select_checks(CHECKS, False, ["nope"])


def test_missing_or_empty_data_dir_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        validate(tmp_path / "missing")
    with pytest.raises(InputError, match="holds none"):
        validate(tmp_path)


def test_write_is_a_complete_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    _fake(monkeypatch, "fake-w", "a", [pt(10, 12), pt(3, 3, fitted=True)])
    with pytest.raises(InputError, match="inside the input folder"):  # never written among the data (issue 29)
        validate(data, only=["fake-w"], out=data / "a" / "run")
    card = validate(data, only=["fake-w"], out=tmp_path / "run")
    assert isinstance(card, Scorecard)
    assert (tmp_path / "run" / "tables" / "scorecard.parquet").is_file()
    assert (tmp_path / "run" / "figures" / "scorecard.png").stat().st_size > 1000
    with pytest.raises(InputError, match="without --force"):
        card.write(tmp_path / "run")


def test_checks_see_jobs_and_report_items_and_each_is_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """validate(jobs=, advance=) reaches the running check (points.jobs, points.item_progress); each check that
    ran has its wall and CPU time in the summary; outside a run, a check sees 1 job and reports to nobody."""
    (tmp_path / "a").mkdir()
    seen: dict[str, int] = {}

    def fn(root: Path) -> list[Point]:
        seen["jobs"] = P.jobs()
        done = P.item_progress(3)
        done(2)
        done(1)
        return [pt(1, 1)]

    monkeypatch.setitem(CHECKS, "fake-j", Check(name="fake-j", fn=fn, fast=False, needs="a"))
    _fake(monkeypatch, "fake-absent", "absent", [pt(1, 1)])
    steps: list[tuple[str, int, int]] = []
    card = validate(tmp_path, only=["fake-j", "fake-absent"], jobs=3, advance=lambda *a: steps.append(a))
    assert seen["jobs"] == 3 and steps == [("fake-j", 2, 3), ("fake-j", 3, 3)]
    timing = card.summary()["check_seconds"]
    assert list(timing) == ["fake-j"] and timing["fake-j"]["wall"] >= 0 and timing["fake-j"]["cpu"] >= 0
    assert card.wall_seconds >= card.timings["fake-j"][0]
    assert P.jobs() == 1
    P.item_progress(5)(5)  # no scorecard run: a no-op, not an error
    with pytest.raises(InputError, match="--jobs"):
        validate(tmp_path, only=["fake-j"], jobs=0)


def _fake_planned(monkeypatch: pytest.MonkeyPatch, name: str, bases: list[int], cost: float = 1.0) -> None:
    """A planned check: one task ``pow(b, 2)`` per base (a builtin: importable in a spawned worker); base 0 is a
    task that crashes (``divmod(1, 0)``)."""

    def plan(data_dir: Path) -> P.Plan:
        tasks = [P.Task(pow, (b, 2), cost=cost * b) if b else P.Task(divmod, (1, 0)) for b in bases]
        return P.Plan(tasks, lambda results: [pt(b * b, r) for b, r in zip(bases, results, strict=True)])

    def fn(data_dir: Path) -> list[Point]:
        return plan(data_dir).run()

    monkeypatch.setitem(CHECKS, name, Check(name=name, fn=fn, fast=True, needs="a", plan=plan))


def test_planned_checks_in_the_pool_give_the_serial_points_in_check_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--jobs 2 (tasks of planned checks in spawned workers, longest first, serial checks here meanwhile) gives the
    same points, in the same order, as --jobs 1; each check is timed and advances through all its items."""
    (tmp_path / "a").mkdir()
    _fake_planned(monkeypatch, "plan-a", [3, 1, 2])
    _fake(monkeypatch, "serial-b", "a", [pt(7, 7)])
    _fake_planned(monkeypatch, "plan-c", [5, 4], cost=10.0)  # submitted first, finishes before plan-a maybe
    only = ["plan-a", "serial-b", "plan-c"]
    cards, steps = {}, {}
    for jobs in (1, 2):
        seen: list[tuple[str, int, int]] = []
        cards[jobs] = validate(tmp_path, only=only, jobs=jobs, advance=lambda *a, seen=seen: seen.append(a))
        steps[jobs] = seen
    assert cards[1].points == cards[2].points
    assert [(n, p.measured, p.predicted) for n, p in cards[2].points] == [
        ("plan-a", 9, 9), ("plan-a", 1, 1), ("plan-a", 4, 4), ("serial-b", 7, 7), ("plan-c", 25, 25), ("plan-c", 16, 16)
    ]  # fmt: skip
    assert cards[2].ran == only and list(cards[2].timings) == only and not cards[2].errors
    for jobs in (1, 2):
        assert {s for s in steps[jobs] if s[1] == s[2]} == {("plan-a", 3, 3), ("plan-c", 2, 2)}


def test_a_crashing_task_fails_only_its_planned_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    _fake_planned(monkeypatch, "plan-ok", [2, 3])
    _fake_planned(monkeypatch, "plan-crash", [2, 0])
    for jobs in (1, 2):
        card = validate(tmp_path, only=["plan-ok", "plan-crash"], jobs=jobs)
        assert card.ran == ["plan-ok"] and [p.predicted for _, p in card.points] == [4, 9]
        assert list(card.errors) == ["plan-crash"] and "ZeroDivisionError" in card.errors["plan-crash"]


def test_a_point_of_numpy_values_keeps_its_band_as_a_python_bool() -> None:
    """``keeps_band`` is compared with ``is True`` by the scorecard: NumPy values must not make it a NumPy bool (a
    kept band was counted as left)."""
    import numpy as np

    from uvmlab.validate.points import Point

    p = Point("d", "c", "q", "s", np.float64(13.9e-6), np.float64(9.4e-6), band=1.5)
    assert p.keeps_band is True and p.within(1.2) is False
