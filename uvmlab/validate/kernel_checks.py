"""Scorecard check ``nsys-kernels``: native kernel times by class against the real nsys kernel tables.

``uvmlab calibrate --kernels`` (uvmlab.measure.kernel_fit) on every export of ../shared/real-data/nsys with the
shipped kernel work file (uvmlab/measure/nsys_kernel_work.csv: each kernel's FLOPs and bytes from its program's
source). Protocol: the fit rows (declared in the work file) set ``warp_trip_ns`` (csc746: one A100 thread),
``cta_dispatch_ns`` (cudamicrobench: a GH200 grid of idle threads) and ``kernel_min_ns`` (Mordred's 5-CTA launches on
a Quadro RTX 6000); everything else is validation: the A100 cuBLAS DGEMMs against ``gemm_efficiency`` (whose
source is the H200 reading, not these), the A100's memsets against the HBM stream efficiency, Mordred's 40-CTA
launches against the floor, the RTX 4060 Laptop 256-thread loop against the serial rule (no band: the A100's
single-thread trip time overestimates it 1.9x, docs/fidelity.md). Rows the work file excludes (data-dependent work)
or the fit refuses (faster than the GPU's peak for the declared work) are tabulated without a prediction.
"""

from __future__ import annotations

from pathlib import Path

from uvmlab.validate.points import Point, check

DATASET = "nsys"
BAND = 1.5
NO_BAND = {"easycuda_rtx4060_um_migrations_nsys2023.4.4.sqlite"}
"""Validation rows with a known, explained miss (the module docstring): tabulated without a band."""


@check("nsys-kernels", needs=DATASET, fast=True)
def check_nsys_kernels(data_dir: Path) -> list[Point]:
    """Every fit and validation row of the kernel work file, measured vs predicted native time."""
    from uvmlab.measure.kernel_fit import fit_kernels

    exports = sorted((data_dir / DATASET).glob("*.sqlite"))
    res = fit_kernels(exports)
    points = []
    for r in res["rows"]:
        if r["split"] == "exclude":
            continue
        pred = r["predicted_us"]
        fitted = r["split"] == "fit"
        band = None if fitted or r["split"] == "refused" or r["export"] in NO_BAND else BAND
        points.append(
            Point(
                f"{DATASET}/{r['export']}",
                f"{r['kernel'].strip('^')} {r['grid']} ({r['class']}, {r['gpu']})".replace("\\", ""),
                "native kernel time (median)",
                "us",
                float(r["measured_us"]),
                None if pred is None or pred != pred else float(pred),
                fitted=fitted,
                note=r["note"][:200],
                band=band,
            )
        )
    return points
