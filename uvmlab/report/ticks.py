"""Readable axes for published figures: log scales ticked 1, 2, 5, 10, 20, 50 ... in plain numbers."""

from __future__ import annotations

import math
from typing import Any

DECADES_FOR_125 = 3.0
"""Up to this many decades a y axis is ticked at 1, 2 and 5 of each decade; wider axes at 1, 10, 100 only."""
X_LABEL_CHARS = 30
"""An x axis gets 1, 2, 5 ticks only if their labels fit in about this many characters (else they overlap)."""


def _plain(v: float, _pos: int | None = None) -> str:
    """1, 2, 5, 10, 1,000, 0.5 (no 10^k notation); thousands separators."""
    if v == 0:
        return "0"
    return f"{v:,.0f}" if v >= 1 else f"{v:.3g}"


def log_axis(ax: Any, which: str = "y") -> None:
    """Make ``which`` ("x", "y" or "both") of ``ax`` logarithmic with readable ticks; call after plotting."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for name in ("x", "y") if which == "both" else (which,):
        axis = ax.xaxis if name == "x" else ax.yaxis
        (ax.set_xscale if name == "x" else ax.set_yscale)("log")
        lo, hi = ax.get_xlim() if name == "x" else ax.get_ylim()
        decades = math.log10(hi / lo) if lo > 0 and hi > 0 else 99.0
        fits = decades <= DECADES_FOR_125
        if name == "x" and fits:
            fits = 3 * decades * (len(_plain(hi)) + 1) <= X_LABEL_CHARS
        subs = (1.0, 2.0, 5.0) if fits else (1.0,)
        axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=30))
        axis.set_major_formatter(FuncFormatter(_plain))
        axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(1, 10)), numticks=30))
        axis.set_minor_formatter(NullFormatter())
