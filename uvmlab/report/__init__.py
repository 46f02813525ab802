"""uvmlab.report: figures and HTML pages from run and sweep tables (torch-free).

``build_report(sweep_dir, out_html)`` draws the seed study's figures for a sweep (uvmlab/report/build.py).
"""

from __future__ import annotations

import os
from typing import Any


def build_report(
    sweep_dir: str | os.PathLike[str], out_html: str | os.PathLike[str] | None = None, figure_format: str = "png"
) -> Any:
    """Write the sweep report (figures + HTML); see :func:`uvmlab.report.build.build_report`."""
    from uvmlab.report.build import build_report as _build

    return _build(sweep_dir, out_html, figure_format=figure_format)
