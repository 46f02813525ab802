"""The scorecard figure: predicted vs measured on log-log axes, y = x with the 1.5x and 2x bands."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

MARKERS = "osD^v<>pPX*h"


def scorecard_figure(df: pd.DataFrame) -> Any:
    """One marker per dataset; fitted points hollow, validation points filled; points without a positive
    prediction are left out (counted in the title)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[(df["measured"] > 0) & (df["predicted"].fillna(0) > 0)]
    fig, ax = plt.subplots(figsize=(7, 6))
    if len(ok):
        lo = float(min(ok["measured"].min(), ok["predicted"].min())) / 3
        hi = float(max(ok["measured"].max(), ok["predicted"].max())) * 3
    else:
        lo, hi = 0.1, 10.0
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, color="black", lw=1, label="y = x")
    for f, alpha in ((2.0, 0.08), (1.5, 0.12)):
        ax.fill_between(xs, xs / f, xs * f, color="tab:green", alpha=alpha, lw=0, label=f"within {f:g}x")
    cmap = plt.get_cmap("tab10")
    for i, (ds, g) in enumerate(ok.groupby("dataset", sort=True)):
        color, marker = cmap(i % 10), MARKERS[i % len(MARKERS)]
        for fitted, sub in g.groupby("fitted"):
            ax.scatter(
                sub["measured"],
                sub["predicted"],
                marker=marker,
                s=28,
                facecolors="none" if fitted else color,
                edgecolors=color,
                label=f"{ds} ({'fitted' if fitted else 'validation'}, {len(sub)})",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured (each quantity in its own unit: bytes, count, s, B/s)")
    ax.set_ylabel("predicted by uvmlab (same unit as measured)")
    left_out = len(df) - len(ok)
    ax.set_title(
        f"uvmlab fidelity scorecard: {len(ok)} points" + (f" ({left_out} without a prediction)" if left_out else "")
    )
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    return fig
