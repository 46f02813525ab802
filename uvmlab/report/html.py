"""The report page: a static HTML file with the figures (relative PNG links), captions and tables."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from uvmlab.stats.schema import cell_value


@dataclass(frozen=True)
class Section:
    """One figure (or table) of the page."""

    title: str
    text: str
    image: str | None = None  # path relative to the page
    table: pd.DataFrame | None = None


_STYLE = """
body { font-family: sans-serif; max-width: 1150px; margin: 2em auto; color: #222; line-height: 1.45; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.text { text-align: left; }
.caption { color: #444; font-size: 0.92em; }
"""


def _table_html(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for _, row in df.iterrows():
        cells = []
        for v in map(cell_value, row):  # numpy scalars to Python; None, NaN and pd.NA (not collected) to None
            if v is None:
                text, cls = "n/a", ""
            elif isinstance(v, bool | np.bool_):
                text, cls = str(bool(v)), ' class="text"'
            elif isinstance(v, float | int):
                text, cls = f"{v:,.4g}", ""
            else:
                text, cls = str(v), ' class="text"'
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def render(title: str, intro: str, sections: list[Section]) -> str:
    """The whole page as text."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p>{html.escape(intro)}</p>",
    ]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        if s.image:
            parts.append(f"<img src='{html.escape(s.image)}' alt='{html.escape(s.title)}'>")
        parts.append(f"<p class='caption'>{html.escape(s.text)}</p>")
        if s.table is not None and not s.table.empty:
            parts.append(_table_html(s.table))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def relative(path: Path, start: Path) -> str:
    """``path`` relative to folder ``start`` with forward slashes (for <img src>)."""
    return Path(os.path.relpath(path, start)).as_posix()
