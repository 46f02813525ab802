"""How much the per-call cuDNN workspace model moves uvmlab's predictions on real CNN measurements.

Ground truth: CARMA's A100-40GB summary (``workloads/ehsan-summary.csv``, ``uvmlab.evaluate.carma_runs``: whole-device
``memory.used``, compared with ``device_peak_bytes``) or xMem's RTX 3060/4060 sample
(``uvmlab.evaluate.xmem_sample``: net of the context, compared with ``peak_reserved_bytes``). For every row uvmlab
rebuilds and every model of ``uvmlab.trace.cudnn_conv.WORKSPACE_MODELS``, prints the estimate and its signed error,
then per model the median |error| over the validation rows and over the calibration rows (CARMA's CIFAR rows).
Nothing is fitted: this shows the sensitivity of the prediction to an assumption only cuDNN could settle.

Usage: python tools/cudnn_workspace_sensitivity.py GROUND_TRUTH [--models envelope,fft] [--only vgg]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from uvmlab.evaluate.carma_runs import is_carma_summary, read_carma_summary
from uvmlab.evaluate.estimators import UvmlabEstimator
from uvmlab.evaluate.xmem_sample import is_xmem_sample, read_xmem_sample
from uvmlab.trace.cudnn_conv import WORKSPACE_MODELS
from uvmlab.trace.orchestrate import OrchestrationRules
from uvmlab.units import MiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("truth", type=Path, help="CARMA's ehsan-summary.csv or xMem's sample (file or folder)")
    ap.add_argument("--models", default=",".join(WORKSPACE_MODELS), help="comma-separated workspace models")
    ap.add_argument("--only", default="", help="keep rows whose id contains this text")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if is_carma_summary(args.truth):
        cases, _skipped = read_carma_summary(args.truth)
    elif is_xmem_sample(args.truth):
        cases, _skipped = read_xmem_sample(args.truth)
    else:
        raise SystemExit(f"{args.truth}: neither CARMA's summary nor xMem's sample")
    cases = [c for c in cases if args.only in c.case_id]
    estimators = {m: UvmlabEstimator("pca", OrchestrationRules(cudnn_workspace_model=m)) for m in models}
    errors: dict[str, dict[str, float]] = {m: {} for m in models}
    print("| run | measured MiB | " + " | ".join(f"{m} MiB (err)" for m in models) + " |")
    print("|---|---|" + "---|" * len(models))
    for case in cases:
        cells = []
        for m in models:
            predicted = estimators[m].estimate(case)
            err = (predicted - case.measured_peak_bytes) / case.measured_peak_bytes
            errors[m][case.case_id] = err
            cells.append(f"{predicted / MiB:,.0f} ({100 * err:+.1f} %)")
        print(f"| {case.case_id} | {case.measured_peak_bytes / MiB:,.0f} | " + " | ".join(cells) + " |", flush=True)
    fitted = {c.case_id for c in cases if c.fitted}
    print()
    print("| model | validation rows: median abs err | max abs err | calibration rows: median abs err |")
    print("|---|---|---|---|")
    for m in models:
        val = [abs(e) for cid, e in errors[m].items() if cid not in fitted]
        cal = [abs(e) for cid, e in errors[m].items() if cid in fitted]

        def med(xs: list[float]) -> str:
            return f"{100 * statistics.median(xs):.1f} %" if xs else "n/a"

        top = f"{100 * max(val):.1f} %" if val else "n/a"
        print(f"| {m} | {med(val)} | {top} | {med(cal)} |")


if __name__ == "__main__":
    main()
