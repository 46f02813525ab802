"""How much the per-call cuDNN workspace model moves uvmlab's CARMA A100-40GB predictions (docs/estimate.md).

For every CARMA CNN row uvmlab rebuilds (``uvmlab.evaluate.carma_runs``) and every model of
``uvmlab.trace.cudnn_conv.WORKSPACE_MODELS``, prints ``device_peak_bytes`` against the measured maximum
``memory.used``: the signed error per row and model, then per model the median |error| over the validation
(ImageNet) rows and over the calibration (CIFAR) rows. Nothing is fitted: this shows the sensitivity of the
prediction to an assumption cuDNN alone could settle.

Usage: python tools/cudnn_workspace_sensitivity.py PATH/ehsan-summary.csv [--models envelope,fft] [--only vgg]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from uvmlab.estimate import estimate
from uvmlab.evaluate.carma_runs import GPU_NAME, read_carma_summary
from uvmlab.gpus import get_gpu
from uvmlab.trace.cudnn_conv import WORKSPACE_MODELS
from uvmlab.trace.orchestrate import OrchestrationRules
from uvmlab.units import MiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary", type=Path, help="CARMA's workloads/ehsan-summary.csv (or its folder)")
    ap.add_argument("--models", default=",".join(WORKSPACE_MODELS), help="comma-separated workspace models")
    ap.add_argument("--only", default="", help="keep rows whose id contains this text")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    cases, _skipped = read_carma_summary(args.summary)
    cases = [c for c in cases if args.only in c.case_id]
    gpu = get_gpu(GPU_NAME)
    errors: dict[str, dict[str, float]] = {m: {} for m in models}
    print("| run | measured MiB | " + " | ".join(f"{m} MiB (err)" for m in models) + " |")
    print("|---|---|" + "---|" * len(models))
    for case in cases:
        assert case.workload is not None
        cells = []
        for m in models:
            est = estimate(case.workload, gpu, rules=OrchestrationRules(cudnn_workspace_model=m))
            err = (est.device_peak_bytes - case.measured_peak_bytes) / case.measured_peak_bytes
            errors[m][case.case_id] = err
            cells.append(f"{est.device_peak_bytes / MiB:,.0f} ({100 * err:+.1f} %)")
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
