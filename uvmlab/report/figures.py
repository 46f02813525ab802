"""The seed study's figures (Lin & Jeon, EuroMLSys '25, figures 3-9) drawn from a sweep's tables.

Each function takes the table of :func:`uvmlab.report.data.load_results` and returns a matplotlib ``Figure``
(object-oriented API, Agg canvas: no pyplot state) or ``None`` when the sweep has nothing to draw for it.
Bars are grouped by workload (the study's order), one bar per oversubscription factor, like the paper's figures.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from uvmlab.report.data import ok_runs, paired_sim_measured, read_kernels, workload_order
from uvmlab.report.ticks import log_axis
from uvmlab.stats.schema import RESULT_LABELS
from uvmlab.units import GiB, MiB

PCA_PANELS = ((True, "(a) with PCA"), (False, "(b) without PCA"))


def _factor_colors(factors: list[float]) -> dict[float, tuple[float, ...]]:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    n = max(1, len(factors) - 1)
    return {f: cmap(i / n) for i, f in enumerate(factors)}


def _log_y(ax: object) -> None:
    """Log y axis ticked 1, 2, 5, 10, 20, 50 ... in plain numbers (uvmlab.report.ticks)."""
    log_axis(ax, "y")


def _grouped_bars(
    ax: object,
    table: pd.DataFrame,
    value: str,
    factors: list[float],
    workloads: list[str],
    colors: dict[float, tuple[float, ...]],
) -> None:
    """Bars of ``value`` per (workload, factor); missing combinations leave a gap (not a zero)."""
    width = 0.8 / max(1, len(factors))
    x = np.arange(len(workloads))
    for i, f in enumerate(factors):
        sub = table[table["oversub"] == f].set_index("workload")[value]
        heights = [float(sub.get(w, np.nan)) for w in workloads]
        ax.bar(x - 0.4 + width * (i + 0.5), heights, width, color=colors[f], label=f"{f:g}")  # type: ignore[attr-defined]
    ax.set_xticks(x, workloads, rotation=20, ha="right")  # type: ignore[attr-defined]


def _factor_legend(ax: object) -> None:
    """The legend of the grouped-bar figures (one entry per oversubscription factor), right of the axes."""
    ax.legend(  # type: ignore[attr-defined]
        title="oversubscription factor",
        fontsize=7,
        title_fontsize=8,
        ncol=2,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )


def _mean_by(df: pd.DataFrame, value: str) -> pd.DataFrame:
    return df.groupby(["workload", "oversub", "pca"], dropna=False)[value].mean().reset_index()


def _two_panels(
    df: pd.DataFrame,
    value: str,
    ylabel: str,
    title: str,
    log: bool,
    factor_filter: Callable[[float], bool] = lambda f: True,
    scale: float = 1.0,
) -> Figure | None:
    runs = ok_runs(df).dropna(subset=[value])
    runs = runs[runs["oversub"].map(factor_filter)]
    if runs.empty:
        return None
    table = _mean_by(runs, value)
    table[value] = table[value] / scale
    factors = sorted(table["oversub"].unique())
    workloads = workload_order(table["workload"])
    colors = _factor_colors(factors)
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (pca, label) in zip(axes, PCA_PANELS, strict=True):
        sub = table[table["pca"] == pca]
        if sub.empty:
            ax.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax.transAxes)
        _grouped_bars(ax, sub, value, factors, workloads, colors)
        ax.set_title(label)
        ax.set_xlabel("workload")
        if log:
            _log_y(ax)
        ax.grid(axis="y", alpha=0.3, which="both")
    axes[0].set_ylabel(ylabel)
    _factor_legend(axes[1])
    fig.suptitle(title)
    return fig


def fig3_slowdown(df: pd.DataFrame) -> Figure | None:
    """Figure 3: slowdown per workload and factor > 1, (a) with and (b) without PCA.

    Slowdown is the study's: iteration time / iteration time at factor 1.0 with the same PCA setting
    (``slowdown_vs_oversub1`` in uvmlab.report.data).
    """
    fig = _two_panels(
        df,
        "slowdown_vs_oversub1",
        "slowdown (x, vs factor 1.0 with the same PCA setting)",
        "Performance under oversubscription factors (study Fig. 3)",
        log=True,
        factor_filter=lambda f: f > 1.0,
    )
    if fig is not None:
        for ax in fig.axes[:2]:
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
    return fig


def pca_ratio_table(df: pd.DataFrame) -> pd.DataFrame:
    """Iteration time without PCA / with PCA at the same factor, per workload (> 1: PCA is faster)."""
    runs = ok_runs(df).dropna(subset=["iteration_time_ns"])
    t = runs.groupby(["workload", "oversub", "pca"])["iteration_time_ns"].mean().unstack("pca")
    if True not in t.columns or False not in t.columns:
        return pd.DataFrame(columns=["workload", "oversub", "ratio"])
    ratio = (t[False] / t[True]).rename("ratio").dropna().reset_index()
    return ratio


def fig4_pca_ratio(df: pd.DataFrame) -> Figure | None:
    """Figure 4: iteration time without PCA relative to with PCA, per workload and factor (> 1: PCA wins)."""
    ratio = pca_ratio_table(df)
    if ratio.empty:
        return None
    factors = sorted(ratio["oversub"].unique())
    workloads = workload_order(ratio["workload"])
    mean = ratio.groupby("oversub")["ratio"].mean().reset_index().assign(workload="average")
    table = pd.concat([ratio, mean], ignore_index=True)
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    ax = fig.subplots()
    _grouped_bars(ax, table, "ratio", factors, [*workloads, "average"], _factor_colors(factors))
    ax.axhline(1.0, color="red", lw=1, ls="--")
    _log_y(ax)
    ax.set_xlabel("workload")
    ax.set_ylabel("iteration time without PCA / with PCA (x)")
    ax.grid(axis="y", alpha=0.3, which="both")
    _factor_legend(ax)
    fig.suptitle("Without PCA, relative to with PCA at the same factor (study Fig. 4; > 1: PCA is faster)")
    return fig


def fig5_kernel_memory(runs: dict[str, pd.Series], max_iterations: int = 5) -> Figure | None:
    """Figure 5: memory per kernel (kernel_bytes) over kernel launches, iteration boundaries in red."""
    if not runs:
        return None
    n = len(runs)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (workload, row) in zip(axes, runs.items(), strict=False):
        kernels = read_kernels(row["run_dir"], max_iterations)
        ax.plot(kernels["kernel_id"], kernels["kernel_bytes"] / MiB, lw=0.6, color="tab:blue")
        if "iteration" in kernels.columns:
            starts = kernels.groupby("iteration")["kernel_id"].min().sort_index()
            for kid in starts.iloc[1:]:
                ax.axvline(kid, color="red", ls=":", lw=1)
        peak = kernels["kernel_bytes"].max() / MiB if len(kernels) else np.nan
        footprint = row.get("footprint_bytes", np.nan)
        note = f"largest kernel {peak:,.0f} MiB"
        if footprint == footprint and footprint:
            note += f"\nfootprint {footprint / GiB:,.1f} GiB"
        ax.text(
            0.98,
            0.95,
            note,
            ha="right",
            va="top",
            fontsize=7,
            transform=ax.transAxes,
            bbox={"facecolor": "white", "alpha": 0.8, "lw": 0},
        )
        bs = row.get("cfg_batch_size")
        ax.set_title(f"{workload}" + (f" (batch {int(bs)})" if bs == bs and bs is not None else ""), fontsize=9)
        ax.set_xlabel("kernel invocation id")
        ax.set_ylabel("memory per kernel (MiB)")
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(f"Memory per kernel over time, up to the first {max_iterations} iterations (study Fig. 5)")
    return fig


def fig6_faults(df: pd.DataFrame) -> Figure | None:
    """Figure 6: GPU page faults per workload and factor, (a) with and (b) without PCA."""
    return _two_panels(df, "fault_count", "page faults (count)", "Number of page faults (study Fig. 6)", log=True)


def fig7_read_write(df: pd.DataFrame) -> Figure | None:
    """Figure 7: share of read and write faults per factor; rows: PCA on/off, columns: workloads."""
    runs = ok_runs(df).dropna(subset=["read_fault_count", "write_fault_count"])
    if runs.empty:
        return None
    table = runs.groupby(["workload", "oversub", "pca"])[["read_fault_count", "write_fault_count"]].mean()
    table = table.reset_index()
    total = (table["read_fault_count"] + table["write_fault_count"]).where(lambda t: t > 0)  # no faults: no share
    table["read_share"] = table["read_fault_count"] / total
    table["write_share"] = table["write_fault_count"] / total
    workloads = workload_order(table["workload"])
    fig = Figure(figsize=(2.3 * len(workloads) + 1, 5.2), layout="constrained")
    axes = fig.subplots(2, len(workloads), sharey=True, squeeze=False)
    for r, (pca, label) in enumerate(PCA_PANELS):
        for c, workload in enumerate(workloads):
            ax = axes[r][c]
            sub = table[(table["pca"] == pca) & (table["workload"] == workload)].sort_values("oversub")
            x = np.arange(len(sub))
            ax.bar(x, sub["write_share"], color="tab:orange", label="write")
            ax.bar(x, sub["read_share"], bottom=sub["write_share"], color="tab:blue", label="read")
            ax.set_xticks(x, [f"{f:g}" for f in sub["oversub"]], rotation=90, fontsize=7)
            ax.set_ylim(0, 1)
            if r == 0:
                ax.set_title(workload, fontsize=9)
            if r == 1:
                ax.set_xlabel("oversubscription factor", fontsize=8)
            if c == 0:
                ax.set_ylabel(f"{label}\nshare of page faults")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Page faults by read / write access (study Fig. 7)")
    return fig


def _pca_pairs(df: pd.DataFrame, value: str, ylabel: str, title: str, scale: float) -> Figure | None:
    runs = ok_runs(df).dropna(subset=[value])
    if runs.empty:
        return None
    table = _mean_by(runs, value)
    table[value] = table[value] / scale
    workloads = workload_order(table["workload"])
    cols = min(3, len(workloads))
    rows = (len(workloads) + cols - 1) // cols
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, workload in zip(axes, workloads, strict=False):
        sub = table[table["workload"] == workload]
        factors = sorted(sub["oversub"].unique())
        x = np.arange(len(factors))
        for offset, (pca, label, color) in (
            (-0.2, (True, "with PCA", "tab:blue")),
            (0.2, (False, "without PCA", "tab:gray")),
        ):
            s = sub[sub["pca"] == pca].set_index("oversub")[value]
            ax.bar(x + offset, [float(s.get(f, np.nan)) for f in factors], 0.4, label=label, color=color)
        ax.set_xticks(x, [f"{f:g}" for f in factors], fontsize=7)
        ax.set_title(workload, fontsize=9)
        ax.set_xlabel("oversubscription factor")
        ax.set_ylabel(ylabel)
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.10g}"))  # 15,000 not 15000
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[len(workloads) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return fig


def fig8_migration_count(df: pd.DataFrame) -> Figure | None:
    """Figure 8: migration transactions (host-to-device + device-to-host), with vs without PCA."""
    return _pca_pairs(
        df, "migration_count", "migrations (count)", "Count of migration transactions (study Fig. 8)", scale=1.0
    )


def fig9_migration_bytes(df: pd.DataFrame) -> Figure | None:
    """Figure 9: migrated bytes (both directions), with vs without PCA."""
    return _pca_pairs(df, "migration_bytes", "migrated data (GiB)", "Size of migrations (study Fig. 9)", scale=GiB)


SIM_VS_MEASURED_METRICS = (
    ("slowdown_vs_native", f"{RESULT_LABELS['slowdown_vs_native']} (x)"),
    ("iteration_time_ns", "iteration time (ms)"),
    ("fault_count", "page faults"),
    ("migration_bytes", "migrated bytes (GiB)"),
)


def fig_sim_vs_measured(df: pd.DataFrame) -> Figure | None:
    """Simulated vs measured values of the same configurations (y = x is a perfect simulator)."""
    pairs = paired_sim_measured(df)
    if pairs.empty:
        return None
    fig = Figure(figsize=(13, 3.6), layout="constrained")
    axes = fig.subplots(1, len(SIM_VS_MEASURED_METRICS))
    scale = {"iteration_time_ns": 1e6, "migration_bytes": GiB}
    for ax, (metric, label) in zip(axes, SIM_VS_MEASURED_METRICS, strict=True):
        m = pairs[f"{metric}_measured"] / scale.get(metric, 1)
        s = pairs[f"{metric}_sim"] / scale.get(metric, 1)
        ok = m.notna() & s.notna()
        if not ok.any():
            ax.text(0.5, 0.5, "not collected", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(label, fontsize=9)
            continue
        for pca, marker in ((True, "o"), (False, "x")):
            sel = ok & (pairs["pca"] == pca)
            ax.scatter(m[sel], s[sel], marker=marker, label="PCA on" if pca else "PCA off")
        lo = float(min(m[ok].min(), s[ok].min()))
        hi = float(max(m[ok].max(), s[ok].max()))
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--")
        if lo > 0:  # values span decades: log-log, readable ticks
            log_axis(ax, "both")
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"simulated {label}")
        rel = ((s[ok] - m[ok]).abs() / m[ok].abs().where(m[ok] != 0)).dropna()
        if len(rel):
            ax.set_title(f"{label}: median error {100 * rel.median():.0f}%", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle("Simulated vs measured, same configurations")
    return fig


REGIME_COLORS = {"fits": "#b7e1a1", "paging": "#f6d55c"}
"""Cell colours of the regime figure; thrashing runs take the ``Reds`` colormap by their time share."""


def fig_regime(df: pd.DataFrame) -> Figure | None:
    """Each run's regime (result.json ``regime``, docs/uvm-sim.md "The regime"): a cell per (workload, factor),
    (a) with and (b) without PCA, the worst of the cell's runs where the sweep has several (batch sizes, GPUs);
    thrashing cells are darker the larger the share of the time in kernels that refetch chunks they evicted
    themselves."""
    if "regime.verdict" not in df.columns:
        return None
    runs = ok_runs(df).dropna(subset=["regime.verdict"])
    if runs.empty:
        return None
    from matplotlib import colormaps
    from matplotlib.patches import Patch, Rectangle

    reds = colormaps["Reds"]
    share = runs.get("regime.thrashing_time_share", pd.Series(np.nan, index=runs.index))
    severity = runs["regime.verdict"].map({"fits": 0, "paging": 1, "thrashing": 2})
    runs = runs.assign(_share=pd.to_numeric(share, errors="coerce"), _severity=severity)
    # one cell per (workload, factor, PCA): the worst of its runs (batch sizes, GPUs, measured and simulated)
    runs = runs.sort_values(["_severity", "_share"], kind="stable", na_position="first")
    factors = sorted(runs["oversub"].dropna().unique())
    workloads = workload_order(runs["workload"])
    fig = Figure(figsize=(max(8.0, 1.0 + 1.1 * len(factors)), 1.2 + 0.5 * len(workloads) * 2), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (pca, label) in zip(axes, PCA_PANELS, strict=True):
        sub = runs[runs["pca"] == pca].drop_duplicates(["workload", "oversub"], keep="last")
        for _, r in sub.iterrows():
            x, y = factors.index(r["oversub"]), workloads.index(r["workload"])
            verdict, s = r["regime.verdict"], r["_share"]
            thrash = verdict == "thrashing"
            color = reds(0.35 + 0.65 * min(1.0, float(s) if s == s else 1.0)) if thrash else REGIME_COLORS[verdict]
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=color, edgecolor="white"))
            text = f"{s:.0%}" if thrash and s == s else verdict
            ax.text(x, y, text, ha="center", va="center", fontsize=7, color="white" if thrash and s > 0.5 else "black")
        ax.set_xlim(-0.5, len(factors) - 0.5)
        ax.set_ylim(len(workloads) - 0.5, -0.5)
        ax.set_yticks(range(len(workloads)), workloads)
        ax.set_ylabel("workload")
        ax.set_title(label if len(sub) else f"{label}: no runs", fontsize=9)
    axes[1].set_xticks(range(len(factors)), [f"x{f:g}" for f in factors])
    axes[1].set_xlabel("oversubscription factor (footprint / GPU memory for UVM)")
    handles = [Patch(color=REGIME_COLORS["fits"], label="fits"), Patch(color=REGIME_COLORS["paging"], label="paging")]
    handles.append(Patch(color=reds(0.7), label="thrashing: % of the time in kernels refetching their own chunks"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8)
    fig.suptitle("Regime of each run: fits, pages, or thrashes")
    return fig
