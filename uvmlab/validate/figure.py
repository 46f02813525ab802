"""The scorecard figure: predicted vs measured on log-log axes (y = x, 1.5x and 2x bands), and the ratio per point."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

MARKERS = "osD^v<>pPX*h"
BAND_SHADES = ((2.0, 0.10), (1.5, 0.18))  # (factor, alpha) of the shaded bands


def scorecard_figure(df: pd.DataFrame) -> Any:
    """Left: predicted vs measured, one marker per dataset, fitted points hollow. Right: predicted / measured per
    point, grouped by dataset (the bands are readable there). Points without a positive prediction are left out
    (counted in the title)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[(df["measured"] > 0) & (df["predicted"].fillna(0) > 0)]
    fig, (ax, rx) = plt.subplots(1, 2, figsize=(13, 6), gridspec_kw={"width_ratios": [1.1, 1]})
    if len(ok):
        lo = float(min(ok["measured"].min(), ok["predicted"].min())) / 3
        hi = float(max(ok["measured"].max(), ok["predicted"].max())) * 3
    else:
        lo, hi = 0.1, 10.0
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, color="black", lw=1, label="y = x")
    for f, alpha in BAND_SHADES:
        ax.fill_between(xs, xs / f, xs * f, color="tab:green", alpha=alpha, lw=0, label=f"within {f:g}x")
        rx.axhspan(1 / f, f, color="tab:green", alpha=alpha, lw=0)
    rx.axhline(1.0, color="black", lw=1)
    cmap = plt.get_cmap("tab10")
    datasets = sorted(ok["dataset"].unique())
    rng = np.random.default_rng(0)  # horizontal jitter only, for legibility
    for i, ds in enumerate(datasets):
        g = ok[ok["dataset"] == ds]
        color, marker = cmap(i % 10), MARKERS[i % len(MARKERS)]
        for fitted, sub in g.groupby("fitted"):
            style = {"marker": marker, "facecolors": "none" if fitted else color, "edgecolors": color}
            ax.scatter(sub["measured"], sub["predicted"], s=28, **style,
                       label=f"{ds} ({'fitted' if fitted else 'validation'}, {len(sub)})")  # fmt: skip
            x = i + (0.2 if fitted else -0.2) + rng.uniform(-0.12, 0.12, len(sub))
            rx.scatter(x, sub["predicted"] / sub["measured"], s=22, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured (each quantity in its own unit: bytes, count, s, B/s)")
    ax.set_ylabel("predicted by uvmlab (same unit as measured)")
    left_out = len(df) - len(ok)
    extra = f" ({left_out} without a prediction)" if left_out else ""
    ax.set_title(f"uvmlab fidelity scorecard: {len(ok)} points{extra}")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    rx.set_yscale("log")
    ratios = (ok["predicted"] / ok["measured"]).to_numpy(float)
    worst = float(np.max(np.abs(np.log(ratios)))) if len(ratios) else 0.0
    lim = max(3.0, float(np.exp(1.2 * worst)))  # symmetric in log, at least 1/3 .. 3
    rx.set_ylim(1 / lim, lim)
    rx.set_xticks(range(len(datasets)), [d.replace("/", "/\n") for d in datasets], fontsize=7)
    rx.set_xlim(-0.6, max(len(datasets) - 0.4, 0.6))
    rx.set_ylabel("predicted / measured (log; 1 = exact)")
    rx.set_xlabel("data set (left of each tick: validation, right: fitted, hollow)")
    rx.set_title("ratio per point, with the 1.5x and 2x bands")
    rx.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    return fig
