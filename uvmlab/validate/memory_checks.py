"""Scorecard checks of whole-device peak memory (``device_peak_bytes``) against real nvidia-smi/NVML data.

- ``memory/gpumemnet_mlp_a100``: the 3,000 GPUMemNet MLPs on an A100-40GB (``uvmlab.evaluate.gpumemnet``);
  the calibration rows (every ``CALIBRATION_STRIDE``-th) are ``fitted=True``: they set the eager module size.
- ``memory/gpumemnet_mlp_a100_sample``: 30 validation rows of it (index % 100 == 1), fast.
- ``memory/xmem_rtx3060_sample``: xMem's 13-row sample (``uvmlab.evaluate.xmem_sample``); rows uvmlab cannot
  rebuild are points with ``predicted=None`` and the reason. Nothing is fitted on it.
- ``memory/carma_a100``: CARMA's A100-40GB CNN runs (``uvmlab.evaluate.carma_runs``), read from
  ``memory/carma_a100/ehsan-summary.csv`` under the data folder or from ``$UVMLAB_CARMA_SUMMARY`` (the file is not
  in ../shared/real-data); its CIFAR-100 rows are ``fitted`` (they set ``LAZY_CONV_MODULES_BYTES``).

Every data set is also scored after a stack calibration on one declared row (``uvmlab calibrate --memory``;
``uvmlab.evaluate.memory_validation.STACK_FIT_ROWS``): the same points with quantity ``... (stack-calibrated)``,
the fit row ``fitted`` (issue 25).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uvmlab.evaluate.memory_validation import STACK_FIT_ROWS
from uvmlab.validate.points import Plan, Point, Task, check, planned_check

MLP_DIR = "memory/gpumemnet_mlp_a100"
XMEM_DIR = "memory/xmem_rtx3060_sample"
CARMA_DIR = "memory/carma_a100"
CARMA_ENV = "UVMLAB_CARMA_SUMMARY"


def with_stack(points: list[Point], fit_case: str, dataset: str, context: float, family: str) -> list[Point]:
    """``points`` again after a stack calibration on the point ``fit_case`` (a row of ``dataset`` whose prediction
    holds ``context`` bytes of context, model family ``family``): the stack term ``uvmlab calibrate --memory`` fits on
    it (uvmlab.memory.stack; 0 when it refuses) is added to every prediction (what ``uvmlab estimate --stack`` adds to
    the context). Each keeps its point's band: a calibration must not make a row worse than the band it promised
    without one."""
    from uvmlab.evaluate.memory_validation import Row, stack_offset

    fit = next((p for p in points if p.case == fit_case and p.predicted is not None), None)
    if fit is None or fit.predicted is None:
        return []
    row = Row(dataset, fit.case, family, fit.measured, fit.predicted, context=context)
    offset = stack_offset([row], [fit.case]) or 0.0
    return [
        Point(p.dataset, p.case, f"{p.quantity} (stack-calibrated)", p.unit, p.measured, p.predicted + offset,
              fitted=p.fitted or p.case == fit_case, note=f"stack fitted on {fit_case}",
              band=None if p.fitted or p.case == fit_case else p.band)
        for p in points
        if p.predicted is not None
    ]  # fmt: skip


SAMPLE_BAND = 1.1
"""The band each fast-sample row promises (CI fails outside it): issue 12 asks an MRE of at most 5 % over the set;
one row may miss by more (95th percentile of the 2,400 validation rows: 1.8 %, maximum 22 %), so single rows
promise 10 %, and the fast sample's rows (index % 100 == 1) all sit within 3 %."""


ROW_TASK_S = 0.15
"""Rough CPU seconds per MLP row (trace + estimate); only orders the tasks against the other checks'."""


def _mlp_plan(data_dir: Path, keep: object = None, band: float | None = None) -> Plan:
    """One task per ``ROWS_PER_TASK`` rows (a worker imports torch once for all its tasks)."""
    from uvmlab.evaluate.gpumemnet import GPU_NAME, ROWS_PER_TASK, estimate_chunk, read_mlp_set
    from uvmlab.memory.devicemem import context_model

    rows, skipped = read_mlp_set(data_dir / MLP_DIR)
    if callable(keep):
        rows = [r for r in rows if keep(r)]
    chunks = [rows[i : i + ROWS_PER_TASK] for i in range(0, len(rows), ROWS_PER_TASK)]
    tasks = [Task(estimate_chunk, (c,), cost=ROW_TASK_S * len(c), items=len(c)) for c in chunks]

    def assemble(results: list[list[dict[str, Any]]]) -> list[Point]:
        flat = [r for chunk in results for r in chunk]
        points = [
            Point(
                dataset=MLP_DIR,
                case=f"row {r.index}",
                quantity="device_peak_bytes",
                unit="bytes",
                measured=float(r.measured_bytes),
                predicted=float(res["device_peak_bytes"]),
                fitted=r.fitted,
                note="eager module loading (the stack's floor rules out lazy)",
                band=None if r.fitted else band,
            )
            for r, res in zip(rows, flat, strict=True)
        ]
        points += [Point(MLP_DIR, f"row {i}", "device_peak_bytes", "bytes", float("nan"), None, note=why)
                   for i, why in skipped]  # fmt: skip
        fit = STACK_FIT_ROWS["gpumemnet"] if any(p.case == STACK_FIT_ROWS["gpumemnet"] for p in points) else None
        ctx = context_model(GPU_NAME, "eager").total_bytes
        return points + with_stack(points, fit or points[0].case, "gpumemnet", ctx, "mlp") if points else points

    return Plan(tasks, assemble)


@planned_check("memory/gpumemnet_mlp_a100", needs=MLP_DIR)
def gpumemnet_mlp(data_dir: Path) -> Plan:
    """Every row of the GPUMemNet A100 MLP set but the fast sample's (its own check: no point counted twice)."""
    return _mlp_plan(data_dir, keep=lambda r: not _in_sample(r))


@planned_check("memory/gpumemnet_mlp_a100_sample", needs=MLP_DIR, fast=True)
def gpumemnet_mlp_sample(data_dir: Path) -> Plan:
    """30 validation rows (index % 100 == 1) of the GPUMemNet A100 MLP set."""
    return _mlp_plan(data_dir, keep=_in_sample, band=SAMPLE_BAND)


def _in_sample(row: object) -> bool:
    return row.index % 100 == 1  # type: ignore[attr-defined]


@check("memory/xmem_rtx3060_sample", needs=XMEM_DIR)
def xmem_sample(data_dir: Path) -> list[Point]:
    """xMem's sample: uvmlab's reserved peak + modules loaded after the context (``after_context_bytes``) per row.

    Peers' estimates are in ``uvmlab evaluate``."""
    from uvmlab.evaluate.estimators import UvmlabEstimator
    from uvmlab.evaluate.xmem_sample import read_xmem_sample

    cases, skipped = read_xmem_sample(data_dir / XMEM_DIR)
    est = UvmlabEstimator("pca")
    points = [
        Point(
            XMEM_DIR,
            c.case_id,
            "after_context_bytes",
            "bytes",
            c.measured_peak_bytes,
            float(est.estimate(c)),
            note=f"{c.gpu_name}; NVML peak minus a first sample taken after the CUDA context existed",
        )
        for c in cases
    ]
    points += [Point(XMEM_DIR, cid, "after_context_bytes", "bytes", float("nan"), None, note=why)
               for cid, why in skipped]  # fmt: skip
    from uvmlab.memory.devicemem import LAZY_CONV_MODULES_BYTES  # after_context: what the prediction holds beyond

    return points + with_stack(points, STACK_FIT_ROWS["xmem"], "xmem", LAZY_CONV_MODULES_BYTES, "cnn")


def carma_file(data_dir: Path) -> Path | None:
    """CARMA's summary: under the data folder, else ``$UVMLAB_CARMA_SUMMARY``; None when neither exists."""
    import os

    for cand in (data_dir / CARMA_DIR / "ehsan-summary.csv", Path(os.environ.get(CARMA_ENV, "/nonexistent"))):
        if cand.exists() and not cand.is_dir():  # a FIFO or device is refused by the reader, not skipped
            return cand
    return None


@check("memory/carma_a100", needs="memory")
def carma_a100(data_dir: Path) -> list[Point]:
    """CARMA's A100-40GB CNN runs (whole-device peaks, lazy loading), and the same after a stack calibration on one
    CIFAR row."""
    from uvmlab.evaluate.carma_runs import read_carma_summary
    from uvmlab.evaluate.estimators import UvmlabEstimator

    src = carma_file(data_dir)
    if src is None:
        why = f"CARMA's ehsan-summary.csv is not in {data_dir / CARMA_DIR} and ${CARMA_ENV} is not set"
        return [Point(CARMA_DIR, "all rows", "device_peak_bytes", "bytes", float("nan"), None, note=why)]
    cases, skipped = read_carma_summary(src)
    est = UvmlabEstimator("pca")
    points = [
        Point(CARMA_DIR, c.case_id, "device_peak_bytes", "bytes", c.measured_peak_bytes, float(est.estimate(c)),
              fitted=c.fitted, note="CIFAR-100: calibration rows" if c.fitted else "ImageNet: validation")
        for c in cases
    ]  # fmt: skip
    points += [Point(CARMA_DIR, cid, "device_peak_bytes", "bytes", float("nan"), None, note=why)
               for cid, why in skipped]  # fmt: skip
    from uvmlab.evaluate.carma_runs import GPU_NAME
    from uvmlab.memory.devicemem import context_model

    ctx = context_model(GPU_NAME, "lazy", convolutions=True).total_bytes
    return points + with_stack(points, STACK_FIT_ROWS["carma"], "carma", ctx, "cnn")
