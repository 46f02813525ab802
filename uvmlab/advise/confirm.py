"""``uvmlab advise --confirm-on-gpu N``: run the job as given and the top N policies for real, predicted vs measured.

The advisor's ranking is a prediction; this runs it on this machine's GPU: the job as given first (the reference
of every measured speedup), then the N best-ranked policies that uvmlab's GPU path applies
(``Applicability.uvmlab_gpu``: driver settings, the C++ discard hook and the simulated-only job shapes are
skipped with the reason). Each run is ``uvmlab run --policy NAME --mode gpu`` (with ``--nsys`` when
Nsight Systems is on PATH) into its own run directory; the table compares predicted and measured iteration times
and speedups over the job as given (``speedup ratio`` = predicted / measured speedup: the figure that does not
depend on which GPU the prediction was made for).

The runs are done by a ``runner(cfg, out_dir) -> result.json dict`` the caller passes (the CLI passes
``uvmlab.run.run`` in GPU mode, a dry run prints the plans); this module only picks, orders and compares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from uvmlab.advise.advisor import Advice
from uvmlab.config import RunConfig
from uvmlab.errors import InputError

Runner = Callable[[RunConfig, Path], dict[str, Any]]
GIVEN = "job as given"


@dataclass
class Confirmation:
    """Predicted against measured, one row per run (the job as given first)."""

    rows: list[dict[str, Any]]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(policy, why it was not run) for better-ranked policies uvmlab cannot apply on a GPU."""

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.rows, "skipped": [{"policy": p, "reason": r} for p, r in self.skipped]}


def pick(advice: Advice, n: int) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The ``n`` best-ranked ok rows uvmlab's GPU path applies, and the better-ranked ones it skipped (with why)."""
    if n < 1:
        raise InputError(f"--confirm-on-gpu takes a number of policies >= 1, not {n}")
    chosen: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    for row in advice.records():
        if len(chosen) == n:
            break
        if row["outcome"] != "ok" or row["policy"] == advice.given_policy:
            continue
        if not row["uvmlab_gpu"]:  # driver settings, the C++ discard hook, the simulated-only job shapes
            skipped.append((row["policy"], f"uvmlab cannot apply it on a GPU: {row['how_else']}"))
            continue
        chosen.append(row)
    return chosen, skipped


def confirm(advice: Advice, cfg: RunConfig, n: int, runner: Runner, out: Path) -> Confirmation:
    """Run the job as given and the top ``n`` applicable policies with ``runner`` into ``out/<name>``; compare."""
    chosen, skipped = pick(advice, n)
    given_row = next(r for r in advice.records() if r["policy"] == advice.given_policy)
    base = replace(cfg, mode="gpu", policy=None, applied=None)
    given = runner(base, out / "given")
    rows = [_compare(GIVEN, given_row, given, given_row, given)]
    for row in chosen:
        measured = runner(replace(base, policy=row["policy"]), out / row["policy"].replace("+", "_"))
        rows.append(_compare(row["policy"], row, measured, given_row, given))
    return Confirmation(rows, skipped)


def _compare(
    name: str, row: dict[str, Any], measured: dict[str, Any], given_row: dict[str, Any], given: dict[str, Any]
) -> dict[str, Any]:
    """One line: predicted and measured iteration time and speedup over the job as given, and their ratios."""
    pred = float(row["iteration_time_ns"])
    meas = measured.get("iteration_time_ns")
    meas_given = given.get("iteration_time_ns")
    pred_speedup = float(given_row["iteration_time_ns"]) / pred
    meas_speedup = meas_given / meas if meas and meas_given else None
    return {
        "policy": name,
        "predicted_ns": pred,
        "measured_ns": meas,
        "time_ratio": pred / meas if meas else None,
        "predicted_speedup": pred_speedup,
        "measured_speedup": meas_speedup,
        "speedup_ratio": pred_speedup / meas_speedup if meas_speedup else None,
        "evidence": row["evidence"],
        "nsys": bool(measured.get("nsys")),
        "plan": measured.get("plan"),
    }


__all__ = ["GIVEN", "Confirmation", "Runner", "confirm", "pick"]
