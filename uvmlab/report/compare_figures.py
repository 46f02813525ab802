"""What `uvmlab compare` writes: its tables, comparison.json and figures (matplotlib, Agg backend): totals with
relative errors, per-iteration series, per-kernel scatter, footprint bars. Every axis is labelled with its unit.
The comparison itself (``uvmlab.measure.compare``) returns data and draws nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.files.rundir import RunDir
from uvmlab.measure.compare import Comparison
from uvmlab.report.ticks import log_axis

GIB = float(1 << 30)


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f


def plot_comparison(cmp: Comparison, folder: Path | RunDir, figure_format: str = "png") -> list[Path]:
    """Write the comparison figures into ``folder/figures`` (as a run directory names them; ``folder`` may be the
    prepared output folder itself, whose manifest then lists them); return their paths.

    The per-kernel scatter is log-log (kernel times and fault counts span decades).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rd = folder if isinstance(folder, RunDir) else RunDir(folder, figure_format=figure_format)
    out: list[Path] = []
    la, lb = cmp.a.label, cmp.b.label

    # 1. relative error of every total both runs have
    t = cmp.totals[cmp.totals["rel_error"].notna()]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.35 * len(t) + 1)))
    if len(t):
        vals = np.array([_num(v) * 100 for v in t["rel_error"]])
        ax.barh(t["figure"], vals, color=np.where(vals >= 0, "tab:red", "tab:blue"))
        ax.axvline(0, color="black", lw=0.8)
    else:
        ax.text(0.5, 0.5, "no figure present in both runs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("relative error (B - A) / |A|  [%]")
    ax.set_ylabel("figure")
    ax.set_title(f"A = {la}\nB = {lb}", fontsize=9)
    out.append(rd.write_figure("totals_rel_error", fig))
    plt.close(fig)

    # 2. footprint: simulated peak managed footprint vs measured footprint
    fp = cmp.footprint
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(fp))
    a = np.array([_num(v) / GIB for v in fp["a"]])
    b = np.array([_num(v) / GIB for v in fp["b"]])
    ax.bar(x - 0.2, np.nan_to_num(a), 0.4, label=f"A: {la}")
    ax.bar(x + 0.2, np.nan_to_num(b), 0.4, label=f"B: {lb}")
    for i, (va, vb) in enumerate(zip(a, b, strict=True)):
        for dx, v in ((-0.2, va), (0.2, vb)):
            if np.isnan(v):
                ax.text(i + dx, 0, "n/a", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [str(f) for f in fp["figure"]], fontsize=8, rotation=10)
    ax.set_ylabel("footprint [GiB]")
    ax.set_title("Peak managed footprint (simulated and/or measured)")
    ax.legend(fontsize=8)
    out.append(rd.write_figure("footprint", fig))
    plt.close(fig)

    # 3. per iteration
    it = cmp.iterations
    if it is not None and len(it):
        cols = [c for c in ("duration_ns", "fault_count", "htod_bytes", "dtoh_bytes") if f"{c}_a" in it.columns]
        units = {
            "duration_ns": ("time [ms]", 1e6),
            "fault_count": ("GPU page faults [count]", 1.0),
            "htod_bytes": ("HtoD migrated [GiB]", GIB),
            "dtoh_bytes": ("DtoH migrated [GiB]", GIB),
        }
        fig, axes = plt.subplots(len(cols), 1, figsize=(7, 2.3 * len(cols)), sharex=True, squeeze=False)
        for ax, c in zip(axes[:, 0], cols, strict=True):
            label, scale = units[c]
            ax.plot(it["iteration"], [_num(v) / scale for v in it[f"{c}_a"]], "o-", label="A")
            ax.plot(it["iteration"], [_num(v) / scale for v in it[f"{c}_b"]], "s--", label="B")
            ax.set_ylabel(label, fontsize=8)
        axes[-1, 0].set_xlabel("iteration")
        axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[0, 0].legend(fontsize=8)
        axes[0, 0].set_title(f"Per iteration: A = {la}, B = {lb}", fontsize=9)
        out.append(rd.write_figure("per_iteration", fig))
        plt.close(fig)

    # 4. per kernel scatter
    k = cmp.kernels
    if k is not None and len(k):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
        for ax, c, (label, scale) in zip(
            axes,
            ("duration_ns", "fault_count"),
            (("kernel time [µs]", 1e3), ("GPU page faults [count]", 1.0)),
            strict=True,
        ):
            xa = np.array([_num(v) / scale for v in k[f"{c}_a"]]) if f"{c}_a" in k else np.array([])
            yb = np.array([_num(v) / scale for v in k[f"{c}_b"]]) if f"{c}_b" in k else np.array([])
            ok = ~(np.isnan(xa) | np.isnan(yb)) if len(xa) else np.array([], bool)
            pos = ok & (xa > 0) & (yb > 0) if len(xa) else ok  # log-log: zero values cannot be drawn
            if pos.any():
                ax.scatter(xa[pos], yb[pos], s=8, alpha=0.6, label="kernel")
                lo = min(xa[pos].min(), yb[pos].min())
                hi = max(xa[pos].max(), yb[pos].max())
                ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8, ls="--", label="y = x")
                log_axis(ax, "both")
                ax.legend(fontsize=7, loc="upper left")
                dropped = int(ok.sum() - pos.sum())
                if dropped:
                    ax.set_title(f"{dropped:,} kernels with 0 in a run not shown (log axes)", fontsize=8)
            else:
                ax.text(0.5, 0.5, "n/a in a run (or all zero)", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel(f"A: {label}")
            ax.set_ylabel(f"B: {label}")
        fig.suptitle(f"Per kernel ({cmp.kernel_match})", fontsize=9)
        fig.tight_layout()
        out.append(rd.write_figure("per_kernel", fig))
        plt.close(fig)
    return out


class ComparisonDir(RunDir):
    """The folder ``compare -o`` writes (uvmlab.files.owned rules): tables/, figures/, comparison.json last."""

    kind = "comparison"
    complete_name = "comparison.json"
    names = ("comparison.json", "tables", "figures")
    patterns = ("comparison.json", "tables/*.parquet", "figures/*.png", "figures/*.svg", "figures/*.pdf")
    keep_incomplete = ()
    link_folders = ("tables", "figures")


def write_comparison(
    cmp: Comparison, out: str | os.PathLike[str] | ComparisonDir, figure_format: str = "png", force: bool = False
) -> list[Path]:
    """Write comparison.json (last), tables/*.parquet and figures/*.png into ``out`` (a prepared ComparisonDir, or
    a folder taken with its writer's lock: an earlier comparison there is replaced only with ``force``)."""
    folder = out if isinstance(out, ComparisonDir) else ComparisonDir(out, figure_format=figure_format)
    with ComparisonDir.for_writing(folder, force) as folder:
        return _write_comparison(cmp, folder)


def _write_comparison(cmp: Comparison, folder: ComparisonDir) -> list[Path]:
    written = []
    for name, df in (
        ("totals", cmp.totals),
        ("footprint", cmp.footprint),
        ("iterations", cmp.iterations),
        ("kernels", cmp.kernels),
    ):
        if df is None:
            continue
        frame = df.copy()
        for c in frame.columns:
            if frame[c].dtype == object:
                num = pd.to_numeric(frame[c], errors="coerce")
                if num.notna().sum() == frame[c].notna().sum():
                    frame[c] = num.astype(float)
                else:
                    frame[c] = frame[c].map(lambda v: None if v is None else str(v))
        written.append(folder.write_table(name, frame))
    written += plot_comparison(cmp, folder, folder.figure_format)
    written.append(folder.write_json_file(folder.path / "comparison.json", cmp.to_dict()))
    return written
