"""The report page: a static HTML file (Jinja2 template, autoescaped) with a table of the runs linking to their
directories, the figures (relative links), one caption each, and tables.

Jinja2 (already installed with torch; now a declared dependency) replaces the hand-written ``html.escape`` calls:
autoescaping covers every value, and the page's structure reads as HTML.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    links: dict[str, str] = field(default_factory=dict)
    """Column -> column of hrefs (relative to the page): cells of the first become links."""


_STYLE = """
body { font-family: sans-serif; max-width: 1150px; margin: 2em auto; color: #222; line-height: 1.45; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; text-align: center; } td.text { text-align: left; }
td.long { text-align: left; max-width: 34em; }
.caption { color: #444; font-size: 0.92em; }
nav a { margin-right: 0.8em; font-size: 0.9em; }
"""

_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{{ title }}</title><style>{{ style|safe }}</style></head>
<body>
<h1>{{ title }}</h1>
<p>{{ intro }}</p>
<nav>{% for s in sections %}<a href="#s{{ loop.index }}">{{ s.title }}</a>{% endfor %}</nav>
{% for s in sections %}
<h2 id="s{{ loop.index }}">{{ s.title }}</h2>
{% if s.image %}{% if s.image.endswith(".pdf") %}
<object data="{{ s.image }}" type="application/pdf" width="100%" height="560">
<a href="{{ s.image }}">{{ s.title }} (PDF)</a></object>
{% else %}<img src="{{ s.image }}" alt="{{ s.title }}">{% endif %}{% endif %}
{% if s.text %}<p class="caption">{{ s.text }}</p>{% endif %}
{% if s.table %}<table>
<tr>{% for c in s.table.columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in s.table.rows %}<tr>{% for cell in row %}<td{% if cell.cls %} class="{{ cell.cls }}"{% endif %}>
{%- if cell.href %}<a href="{{ cell.href }}">{{ cell.text }}</a>{% else %}{{ cell.text }}{% endif %}</td>
{%- endfor %}</tr>
{% endfor %}</table>{% endif %}
{% endfor %}
</body></html>
"""

LONG_TEXT = 60
"""Cells longer than this many characters are left-aligned and wrap (explanations, error sentences)."""


def _cell(v: Any) -> dict[str, Any]:
    v = cell_value(v)  # numpy scalars to Python; None, NaN and pd.NA (not collected) to None
    if v is None:
        return {"text": "n/a", "cls": ""}
    if isinstance(v, bool | np.bool_):
        return {"text": str(bool(v)), "cls": "text"}
    if isinstance(v, float | int):
        big = abs(v) >= 1000 or float(v).is_integer()  # counts and large values: all digits, with separators
        return {"text": f"{v:,.0f}" if big else f"{v:,.4g}", "cls": ""}
    text = str(v)
    return {"text": text, "cls": "long" if len(text) > LONG_TEXT else "text"}


def _table(df: pd.DataFrame, links: dict[str, str]) -> dict[str, Any]:
    shown = [c for c in df.columns if c not in links.values()]
    rows = []
    for rec in df.to_dict("records"):
        row = []
        for c in shown:
            cell = _cell(rec[c])
            if c in links and isinstance(rec.get(links[c]), str):
                cell["href"] = rec[links[c]]
            row.append(cell)
        rows.append(row)
    return {"columns": [str(c) for c in shown], "rows": rows}


def render(title: str, intro: str, sections: list[Section]) -> str:
    """The whole page as text."""
    import jinja2

    env = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
    page = [
        {
            "title": s.title,
            "text": s.text,
            "image": s.image,
            "table": _table(s.table, s.links) if s.table is not None and not s.table.empty else None,
        }
        for s in sections
    ]
    return env.from_string(_TEMPLATE).render(title=title, intro=intro, sections=page, style=_STYLE)


def relative(path: Path, start: Path) -> str:
    """``path`` relative to folder ``start`` with forward slashes (for <img src> and <a href>)."""
    return Path(os.path.relpath(path, start)).as_posix()
