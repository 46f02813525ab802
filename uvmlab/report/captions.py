"""Figure captions: what was run (simulated or measured, GPU, versions, runs) under each figure, and the
study's headline numbers next to ours."""

from __future__ import annotations

import pandas as pd

from uvmlab.report.data import MEASURED_MODES, ok_runs, workload_order
from uvmlab.uvm import study

STUDY_HEADLINES = study.HEADLINES
"""seeds/003 section 4.2 (uvmlab.uvm.study)."""


VERSION_KEYS = ("uvmlab", "python", "torch", "cuda", "driver", "nsys", "gpu_name")
"""env.json keys named in captions (plus any key containing "version")."""


def _uniq(values: pd.Series) -> list[str]:
    return [str(v) for v in dict.fromkeys(values.dropna().tolist())]


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def describe_runs(df: pd.DataFrame) -> str:
    """One sentence: simulated/measured, GPU(s), workloads, factors, iterations, versions."""
    runs = ok_runs(df)
    if runs.empty:
        return "No successful runs."
    modes = set(runs["mode"].dropna().astype(str))
    kinds = []
    if modes - set(MEASURED_MODES):
        kinds.append("simulated (uvmlab sim: PyTorch caching allocator + UVM driver model, no GPU)")
    if modes & set(MEASURED_MODES):
        kinds.append("measured on a GPU")
    gpus = _uniq(runs["gpu"]) if "gpu" in runs else _uniq(runs.get("cfg_gpu", pd.Series(dtype=str)))
    factors = sorted(runs["oversub"].dropna().unique())
    iters = _uniq(runs["iterations"]) if "iterations" in runs else []
    pca = sorted({("on" if v else "off") for v in runs["pca"].dropna()})
    versions = []
    wanted = {f"env_{k}" for k in VERSION_KEYS}
    for col in sorted(c for c in runs.columns if c in wanted or (c.startswith("env_") and "version" in c)):
        vals = _uniq(runs[col])
        if vals:
            versions.append(f"{col[4:]} {'/'.join(vals)}")
    text = (
        f"{_upper_first(' and '.join(kinds))}; GPU {', '.join(gpus) or 'n/a'}; {len(runs)} runs of "
        f"{', '.join(workload_order(runs['workload']))}; factors {', '.join(f'{f:g}' for f in factors)}; "
        f"PCA {'/'.join(pca)}; iterations per run {', '.join(iters) or 'n/a'}."
    )
    if versions:
        text += f" Versions: {'; '.join(versions)}."
    return text


WHY_SIMULATED = {
    "mean_slowdown_pca": "The simulator's fault-service costs are defaults (uvmlab.sim.uvm.timing.CostParams), not "
    "calibrated on an A100, and a simulated run has 3 iterations where the study ran longer.",
    "max_slowdown_pca": "The study's extremes come from thrashing (AlexNet beyond factor 5) that the UVM model "
    "shows only as a smooth rise with the factor.",
    "mean_slowdown_nopca": "Same default costs; without PCA each tensor is its own managed range, so the model's "
    "per-range costs set the slope.",
    "max_slowdown_nopca": "The study's maximum (Whisper beyond factor 6 without PCA) is thrashing the model does "
    "not reproduce; its no-PCA curves stay flat.",
    "nopca_over_pca_at_1": "In the model, per-tensor cudaMallocManaged/cudaFree and re-fault costs dominate "
    "without PCA; largest for ResNets (many small kernels on many small tensors).",
}
"""Why simulated headline numbers differ from the study's: docs/figures/README.md, "What does not match"."""
WHY_MEASURED = "Measured on this sweep's GPU and software; the study measured an A100 80GB PCIe with its own setup."


def headlines(df: pd.DataFrame, pca_ratio: pd.DataFrame, simulated: bool = True) -> pd.DataFrame:
    """Our headline numbers beside the study's (section 4.2); NaN where the sweep lacks the runs.

    ``simulated``: the "why they differ" column explains the simulator's known gaps (WHY_SIMULATED), else
    that the setups differ (WHY_MEASURED).
    """
    runs = ok_runs(df)
    over = runs[runs["oversub"] > 1.0]
    ours = {
        "mean_slowdown_pca": over.loc[over["pca"] == True, "slowdown_vs_oversub1"].mean(),  # noqa: E712 (nullable boolean)
        "max_slowdown_pca": over.loc[over["pca"] == True, "slowdown_vs_oversub1"].max(),  # noqa: E712
        "mean_slowdown_nopca": over.loc[over["pca"] == False, "slowdown_vs_oversub1"].mean(),  # noqa: E712
        "max_slowdown_nopca": over.loc[over["pca"] == False, "slowdown_vs_oversub1"].max(),  # noqa: E712
        "nopca_over_pca_at_1": pca_ratio.loc[pca_ratio["oversub"] <= 1.0, "ratio"].mean()
        if not pca_ratio.empty
        else float("nan"),
    }
    labels = {
        "mean_slowdown_pca": "mean slowdown vs factor 1 with PCA, factors > 1",
        "max_slowdown_pca": "max slowdown vs factor 1 with PCA",
        "mean_slowdown_nopca": "mean slowdown vs factor 1 without PCA, factors > 1",
        "max_slowdown_nopca": "max slowdown vs factor 1 without PCA",
        "nopca_over_pca_at_1": "iteration time without / with PCA at factor 1",
    }
    return pd.DataFrame(
        [
            {
                "quantity": labels[k],
                "this sweep": ours[k],
                "study (measured, A100)": STUDY_HEADLINES[k],
                "why they differ": WHY_SIMULATED[k] if simulated else WHY_MEASURED,
            }
            for k in labels
        ]
    )


FIGURE_TEXT = {
    "fig3_slowdown": "Slowdown as in the study: iteration time at the factor / iteration time of the same job "
    "with the same PCA setting at factor 1.0 (UVM, no oversubscription), with (a) and without (b) the PyTorch "
    "caching allocator (results.parquet column slowdown_vs_oversub1). A job without a factor-1.0 run in the sweep "
    "has no bar: result.json's slowdown_vs_native / slowdown_vs_native_pca divide by a run without UVM instead "
    "and are not comparable.",
    "fig4_pca_ratio": "Iteration time without PCA divided by iteration time with PCA at the same factor; "
    "bars above the red line mean PCA is faster.",
    "fig5_kernel_memory": "Bytes of the distinct storages each kernel reads or writes (kernels table, column "
    "kernel_bytes), in launch order; red dotted lines are iteration boundaries. One run per workload: "
    "PCA on, the smallest factor of the sweep.",
    "fig6_faults": "GPU page faults over all iterations (result.json fault_count).",
    "fig7_read_write": "Share of page faults caused by reads and by writes (read_fault_count, write_fault_count).",
    "fig8_migration_count": "Migration transactions in both directions (htod_count + dtoh_count). The study "
    "plots Nsight Systems' migration records (units of 10^7); a simulated run counts one transfer per "
    "contiguous run of migrated pages (uvmlab.sim.uvm.driver), so absolute counts differ while trends (factor, PCA on "
    "vs off) are comparable.",
    "fig9_migration_bytes": "Migrated bytes in both directions (htod_bytes + dtoh_bytes).",
    "fig_regime": "The regime of each run (result.json regime; docs/uvm-sim.md, section The regime): fits (nothing "
    "evicted after the first iteration), paging (chunks evicted, none needed again by the kernel that evicted it) or "
    "thrashing (some kernel evicts chunks it still needs and faults them back within one launch: the crawl), the "
    "percentage being the share of the iteration's time in such kernels. Simulated runs, and measured runs whose "
    "export has UM migrations. Where several runs share a cell (batch sizes, GPUs), it shows the worst of them; "
    "a run the sweep lacks leaves its cell empty.",
    "fig_sim_vs_measured": "Each point is one configuration run both ways; the dashed line is y = x; titles "
    "give the median relative error |sim - measured| / measured.",
}
