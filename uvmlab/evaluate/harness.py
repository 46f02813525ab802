"""Run estimators over ground-truth cases, score them with xMem's metrics, write tables and the quadrant figure."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError, UvmlabError
from uvmlab.evaluate.estimators import ESTIMATORS, EvalCase, get_estimators
from uvmlab.evaluate.metrics import QUADRANT_THRESHOLD, evaluate_runs, quadrant, summarize
from uvmlab.trace.heap import frozen_heap


@dataclass
class Evaluation:
    """The result: estimates (one row per case and estimator), per-run scores, summaries, and what failed."""

    estimates: pd.DataFrame
    per_run: pd.DataFrame
    summary: pd.DataFrame
    by_group: pd.DataFrame
    failures: list[tuple[str, str, str]]
    """(case_id, estimator, reason) for estimates that could not be made (they are left out of the metrics)."""


def run_estimators(
    cases: Sequence[EvalCase],
    estimator_names: Sequence[str] = ESTIMATORS,
    progress: Callable[[str], None] | None = None,
) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
    """Estimate every case with every estimator; an unavailable estimator or a failed estimate is recorded."""
    estimators = get_estimators(list(estimator_names))
    rows: list[dict[str, Any]] = []
    failures: list[tuple[str, str, str]] = []
    with frozen_heap():  # unfrozen at the end: what the loop froze is collectable again for the caller
        for case in cases:
            # a capture gc.collect()s at each iteration end, which scans the whole heap: freezing what is alive now
            # (modules, earlier cases' results) keeps each collection to the capture's own objects (7x faster on
            # the 3,000 GPUMemNet MLPs; uvmlab.trace.heap); objects created later are collected as usual
            gc.freeze()
            for est in estimators:
                if progress:
                    progress(f"{case.case_id} / {est.name}")
                t0 = time.perf_counter()
                try:
                    value = est.estimate(case)
                except InputError as exc:  # a bad row (unknown workload, bad option): the user must fix the input
                    raise InputError(f"ground-truth run {case.case_id!r}: {exc}") from None
                except UvmlabError as exc:  # e.g. UnavailableError: this estimator cannot do this case; record, go on
                    failures.append((case.case_id, est.name, str(exc)))
                    continue
                rows.append(
                    {
                        "case_id": case.case_id,
                        "estimator": est.name,
                        "group": case.group or case.case_id,
                        "estimate_bytes": float(value),
                        "gpu_memory_bytes": float(case.gpu_memory_bytes),
                        "oom": bool(case.oom),
                        "measured_peak_bytes": float(case.measured_peak_bytes),
                        "round2_oom": case.round2_oom,
                        "round2_peak_bytes": math.nan if case.round2_peak_bytes is None else case.round2_peak_bytes,
                        "runtime_s": time.perf_counter() - t0,
                        "fitted": bool(case.fitted),
                    }
                )
    return pd.DataFrame(rows), failures


def evaluate(
    cases: Sequence[EvalCase],
    estimator_names: Sequence[str] = ESTIMATORS,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """Estimate, score (two-round rule) and summarize per estimator and per (estimator, group)."""
    estimates, failures = run_estimators(cases, estimator_names, progress)
    if estimates.empty:
        empty = pd.DataFrame()
        return Evaluation(estimates, empty, empty, empty, failures)
    per_run = evaluate_runs(estimates)
    summary = summarize(per_run)
    runtime = estimates.groupby("estimator")["runtime_s"].mean().rename("mean_runtime_s")
    summary = summary.merge(runtime, left_on="estimator", right_index=True, how="left")
    by_group = summarize(per_run, by=("estimator", "group"))
    fitted = set(estimates.loc[estimates["fitted"].astype(bool), "case_id"])
    per_run["fitted"] = per_run["case_id"].isin(fitted)
    if per_run["fitted"].any() and not per_run["fitted"].all():  # scores on the validation runs alone
        held = summarize(per_run[~per_run["fitted"].astype(bool)])
        held["estimator"] = held["estimator"] + " (validation runs)"
        summary = pd.concat([summary, held], ignore_index=True)
    summary["quadrant"] = [quadrant(p, m) for p, m in zip(summary["pef"], summary["mre"], strict=True)]
    return Evaluation(estimates, per_run, summary, by_group, failures)


def quadrant_figure(ev: Evaluation, title: str = "Estimators: PEF vs MRE (xMem Fig. 8)") -> Any:
    """Scatter of PEF (x) against MRE (y) per (estimator, group) and per estimator, split at 20 % (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    markers = "osD^v<>p*h"
    for i, (name, g) in enumerate(ev.by_group.groupby("estimator", sort=True)):
        color, marker = f"C{i % 10}", markers[i % len(markers)]
        g = g.dropna(subset=["mre"])
        ax.scatter(100 * g["pef"], 100 * g["mre"], marker=marker, color=color, alpha=0.45, label=f"{name}")
        s = ev.summary[ev.summary["estimator"] == name]
        if len(s) and not math.isnan(s["mre"].iloc[0]):
            ax.scatter(100 * s["pef"], 100 * s["mre"], marker=marker, color=color, s=160, edgecolors="black", zorder=3)
    t = 100 * QUADRANT_THRESHOLD
    ax.axvline(t, color="grey", lw=0.8, ls="--")
    ax.axhline(t, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("PEF: probability of estimation failure (%)")
    ax.set_ylabel("MRE: median relative error (%)")
    ax.set_title(title)
    ax.set_xlim(left=-2)
    ax.set_ylim(bottom=-2)
    ax.text(0.02, 0.02, "optimal", transform=ax.transAxes, fontsize=8, color="grey")
    ax.text(0.98, 0.02, "underestimation", transform=ax.transAxes, fontsize=8, color="grey", ha="right")
    ax.text(0.02, 0.97, "overestimation", transform=ax.transAxes, fontsize=8, color="grey", va="top")
    ax.text(0.98, 0.97, "worst", transform=ax.transAxes, fontsize=8, color="grey", ha="right", va="top")
    ax.legend(
        fontsize=8,
        title="small: per model; large: all runs",
        title_fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    fig.tight_layout()
    return fig


def write_evaluation(ev: Evaluation, out: Any, config: dict[str, Any], force: bool = False) -> Path:
    """Write tables (estimates, per_run, summary, by_group), the quadrant figure and result.json into ``out``."""
    from uvmlab.files.rundir import RunDir

    rd = RunDir.for_writing(out, force)  # refuses a foreign folder or a complete one without force; locks it
    rd.write_json(rd.config_json, config)
    per_run = ev.per_run.copy()
    if "round2_oom" in per_run:
        per_run["round2_oom"] = per_run["round2_oom"].astype("boolean")
    for name, df in (("estimates", ev.estimates), ("per_run", per_run), ("summary", ev.summary)):
        rd.write_table(name, df.drop(columns=["round2_oom"], errors="ignore") if name == "estimates" else df)
    rd.write_table("by_group", ev.by_group)
    if not ev.by_group.empty:
        import matplotlib.pyplot as plt

        fig = quadrant_figure(ev)
        rd.write_figure("quadrant", fig)
        plt.close(fig)
    result = {
        "n_cases": int(ev.estimates["case_id"].nunique()) if not ev.estimates.empty else 0,
        "estimators": {
            r["estimator"]: {k: r[k] for k in ("n", "n_mre", "mre", "pef", "pef_round1", "mcp_bytes", "quadrant")}
            for r in ev.summary.to_dict("records")
        },
        "failures": [{"case_id": c, "estimator": e, "reason": r} for c, e, r in ev.failures],
    }
    rd.write_json(rd.result_json, result)
    rd.release()
    return rd.path
