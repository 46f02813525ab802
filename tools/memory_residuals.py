"""Estimate every whole-device memory data set, fit a stack on one declared row each, and write the residual table.

For each data set of ``uvmlab.evaluate.memory_validation`` (CARMA's summary is not in ../shared/real-data: give
``--carma PATH``, itu-rad/CARMA ``workloads/ehsan-summary.csv`` at commit e044017), estimates every row (GPUMemNet:
``--mlp-stride`` subsample, every N-th row from offset 3, plus its row 0 for the stack fit), caches the predictions
in ``--cache`` (JSON), and prints the Markdown tables of docs/evaluation.md: per data set the MRE of the validation
rows without and with a stack calibration on one row, then per data set the coverage and median overshoot of
``required_mb`` under the rule of ``uvmlab.memory.intervals``; then the stack calibration as a user meets it: for every
choice of the one calibration job (each row; each pair of batch sizes of one job), the other rows' median and worst
|error| without a calibration, with the whole-residual fit of uvmlab before issue 44, and with
``uvmlab.memory.stack.fit_rows`` (``uvmlab.evaluate.memory_validation.stack_choices``), and the same for a stack that
differs from the data set's by a constant (``--shift`` MiB added to every measurement: what the fit recovers). With
``--write`` it writes the residual quantiles per model family to ``uvmlab/memory/residuals.json`` (read by every
estimate).

Usage: python tools/memory_residuals.py --carma /tmp/carma/ehsan-summary.csv [--write]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from pathlib import Path

from uvmlab.evaluate.memory_validation import STACK_FIT_ROWS, Row, residuals, stack_choices, stack_rows, summary
from uvmlab.units import MiB

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "real-data"


def carma_rows(path: Path) -> list[Row]:
    from uvmlab.evaluate.carma_runs import read_carma_summary
    from uvmlab.evaluate.estimators import case_gpu
    from uvmlab.evaluate.memory_validation import family_of
    from uvmlab.memory.estimate import estimate, has_cudnn_convolutions

    cases, _ = read_carma_summary(path)
    out = []
    for c in cases:
        est = estimate(c.workload, case_gpu(c), module_loading="lazy")
        out.append(Row("carma", c.case_id, family_of(est.trace), c.measured_peak_bytes, est.device_peak_bytes,
                       calibration=c.fitted, context=est.context_bytes, job=c.group, batch=c.workload.batch_size,
                       convolutions=has_cudnn_convolutions(est)))  # fmt: skip
        print(out[-1].case, f"{out[-1].error:+.1%}", flush=True)
    return out


def mlp_rows(stride: int) -> list[Row]:
    from uvmlab.evaluate.gpumemnet import GPU_NAME, read_mlp_set
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.devicemem import context_model
    from uvmlab.memory.estimate import estimate

    rows, _ = read_mlp_set(REAL / "memory" / "gpumemnet_mlp_a100")
    keep = [r for r in rows if r.index == 0 or r.index % stride == 3 % stride]  # stride 1: every row
    out = []
    for r in keep:
        est = estimate(r.config(), get_gpu(GPU_NAME), context=context_model(GPU_NAME, "eager"))
        out.append(Row("gpumemnet", f"row {r.index}", "mlp", r.measured_bytes, est.device_peak_bytes,
                       calibration=r.fitted, context=est.context_bytes))  # fmt: skip
    return out


def xmem_rows() -> list[Row]:
    from uvmlab.evaluate.estimators import after_context_bytes, case_gpu
    from uvmlab.evaluate.memory_validation import family_of
    from uvmlab.evaluate.xmem_sample import read_xmem_sample
    from uvmlab.memory.estimate import estimate, has_cudnn_convolutions

    cases, _ = read_xmem_sample(REAL / "memory" / "xmem_rtx3060_sample")
    out = []
    for c in cases:
        if c.workload is None:
            continue
        est = estimate(c.workload, case_gpu(c), alloc_conf=c.alloc_conf, module_loading=c.module_loading)
        ctx = est.context
        out.append(Row("xmem", c.case_id, family_of(est.trace), c.measured_peak_bytes, after_context_bytes(est),
                       context=(ctx.lazy_conv_modules_bytes + ctx.eager_cudnn_bytes) if ctx else 0.0,
                       job=f"{c.workload.workload}/{c.workload.optimizer}", batch=c.workload.batch_size,
                       convolutions=has_cudnn_convolutions(est)))  # fmt: skip
        print(out[-1].case, f"{out[-1].error:+.1%}", flush=True)
    return out


def print_choices(sets: dict[str, list[Row]], shift_mib: float) -> None:
    """The stack-calibration table of docs/evaluation.md (module docstring)."""
    from dataclasses import replace

    print("| data set | stack | calibrated on | choices | others' median without | with the old fit: median "
          "(worst choice) | worst row | choices no worse | with uvmlab.memory.stack: median (worst choice) | worst row "
          "| choices no worse | fitted / refused |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rows in sets.items():
        for stack, group in (("as measured", rows), (f"{shift_mib:+.0f} MiB", None)):
            if group is None:
                group = [replace(r, measured=r.measured + shift_mib * MiB) for r in rows]
            choices = stack_choices(group)
            for kind, pick in (("one row", 1), ("two batch sizes of one job", 2)):
                cs = [c for c in choices if len(c["cases"]) == pick]
                if not cs:
                    continue

                def ok(c: dict, key: str) -> bool:
                    return (
                        c[f"median_{key}"] <= c["median_before"] + 1e-12 and c[f"worst_{key}"] <= 2 * c["worst_before"]
                    )

                med = {k: statistics.median(c[f"median_{k}"] for c in cs) for k in ("before", "old", "new")}
                worst_med = {k: max(c[f"median_{k}"] for c in cs) for k in ("old", "new")}
                worst_row = {k: max(c[f"worst_{k}"] for c in cs) for k in ("old", "new")}
                fitted = sum(bool(c["new_offset"]) for c in cs)
                refused = sum(c["new_offset"] is None for c in cs)
                print(
                    f"| {name} | {stack} | {kind} | {len(cs)} | {med['before']:.2%} | {med['old']:.2%} "
                    f"({worst_med['old']:.1%}) | {worst_row['old']:.1%} | {sum(ok(c, 'old') for c in cs)} | "
                    f"{med['new']:.2%} ({worst_med['new']:.1%}) | {worst_row['new']:.1%} | "
                    f"{sum(ok(c, 'new') for c in cs)} | {fitted} / {refused} |"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--carma", type=Path, default=None, help="CARMA's ehsan-summary.csv")
    ap.add_argument("--mlp-stride", type=int, default=10)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/uvmlab-memory-rows-2.json"))
    ap.add_argument("--shift", type=float, default=300.0, help="MiB added to every measurement for the shifted stack")
    ap.add_argument("--only", default="", help="comma-separated data sets to (re)estimate")
    ap.add_argument("--write", action="store_true", help="write uvmlab/memory/residuals.json")
    args = ap.parse_args()
    cached = json.loads(args.cache.read_text()) if args.cache.is_file() else {}
    makers = {
        "carma": lambda: carma_rows(args.carma) if args.carma else [],
        "gpumemnet": lambda: mlp_rows(args.mlp_stride),
        "xmem": xmem_rows,
    }
    for name, make in makers.items():
        if name not in cached or name in args.only.split(","):
            cached[name] = [asdict(r) for r in make()]
            args.cache.write_text(json.dumps(cached))
    sets = {name: [Row(**r) for r in rows] for name, rows in cached.items() if rows}
    from uvmlab.memory.intervals import build_table, coverage

    print("| data set | validation rows | MRE | worst | under | stack fit on | MRE with stack | worst | under |")
    print("|---|---|---|---|---|---|---|---|---|")
    with_stack = {}
    for name, rows in sets.items():
        s = summary(rows)
        st_rows = stack_rows(rows, STACK_FIT_ROWS[name])
        with_stack[name] = st_rows
        t = summary(st_rows)
        print(f"| {name} | {s['rows']} | {s['mre']:.1%} | {s['worst']:.1%} | {s['under']:.0%} | {STACK_FIT_ROWS[name]} "
              f"| {t['mre']:.1%} | {t['worst']:.1%} | {t['under']:.0%} |")  # fmt: skip
    if "carma" in sets:
        imagenet = [r for r in sets["carma"] if "cifar" not in r.case]
        s = summary(imagenet)
        t = summary([r for r in with_stack["carma"] if "cifar" not in r.case])
        print(
            f"| carma ImageNet | {s['rows']} | {s['mre']:.1%} | {s['worst']:.1%} | {s['under']:.0%} | "
            f"{STACK_FIT_ROWS['carma']} | {t['mre']:.1%} | {t['worst']:.1%} | {t['under']:.0%} |"
        )
    table = build_table({n: residuals(r) for n, r in sets.items()}, {n: residuals(r) for n, r in with_stack.items()},
                        {n: sorted({r.family for r in rows}) for n, rows in sets.items()})  # fmt: skip
    print()
    print("| data set | stack | rows | coverage of required | median overshoot | median overshoot MiB |")
    print("|---|---|---|---|---|---|")
    for label, group in (("no", sets), ("yes", with_stack)):
        for name, rows in group.items():
            cov = coverage(rows, table, stack=label == "yes")
            print(
                f"| {name} | {label} | {cov['rows']} | {cov['coverage']:.1%} | {cov['median_overshoot']:.1%} | "
                f"{cov['median_overshoot_bytes'] / MiB:.0f} |"
            )
    print()
    print_choices(sets, args.shift)
    print()
    print(json.dumps(table, indent=1))
    if args.write:
        out = Path(__file__).resolve().parents[1] / "uvmlab" / "memory" / "residuals.json"
        out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {out}")
    _ = statistics  # the median is in summary()


if __name__ == "__main__":
    main()
