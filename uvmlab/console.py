"""Console output, the one place uvmlab prints: tables and lines on stdout, progress and notes on stderr (so
``--format json`` / ``csv`` stdout stays clean).

Both consoles have rich markup off: a message such as ``pip install 'uvmlab[gpu]'`` prints as written (rich would
read ``[gpu]`` as a style tag and drop it); colour goes through ``style=``. Tables are rich tables on a terminal
(cells wrap or fold, never cut to "…") and plain Markdown pipe tables when stdout is not a terminal (a pipe, a
file, a CI or Slurm log), so every cell arrives complete whatever the width. ``--format csv`` goes through
:func:`print_csv`.

Machine-readable output never drops rows: the commands build complete tables, :func:`print_csv` (and every
command's JSON) writes all of them, and only :func:`print_table` may show the first ``max_rows`` of a long table,
saying so in its title. Numbers in tables go through one formatter (:func:`format_number`), so a column of
counts or bytes never mixes ``9.292e+09`` with ``2,271,870,976``.
"""

from __future__ import annotations

import csv
import numbers
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

TableSpec = tuple[str, Sequence[str], Sequence[Sequence[Any]]]


def progress_bar(*columns: Any, disable: bool = False) -> Any:
    """A transient rich progress bar on stderr, off when stderr is not a terminal (a pipe, a file, a CI log): rich
    would only leave a stray blank line there."""
    from rich.progress import Progress

    return Progress(*columns, console=err, transient=True, disable=disable or not err.is_terminal)


"""(title, columns, rows) of one printable table."""


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], max_rows: int | None = None) -> None:
    """Print a table to stdout: numbers right-aligned (:func:`format_number`), None shown as n/a, no cell ever cut.

    On a terminal: a rich table (long cells wrap). Otherwise: a Markdown pipe table at full width. ``max_rows``:
    show only the first rows of a longer table, and say so in the title (``--format csv`` / ``json`` give all).
    """
    rows = [list(r) for r in rows]
    if max_rows is not None and len(rows) > max_rows:
        title = f"{title} [first {max_rows:,} of {len(rows):,} rows; all of them: --format csv or --format json]"
        rows = rows[:max_rows]
    numeric = [bool(rows) and all(_is_number(r[i]) or r[i] is None for r in rows) for i in range(len(columns))]
    cells = [[_cell(v) for v in r] for r in rows]
    if out.is_terminal:
        table = Table(title=Text(title), title_justify="left")
        for col, num in zip(columns, numeric, strict=True):
            table.add_column(Text(str(col)), justify="right" if num else "left", overflow="fold")
        for r in cells:
            table.add_row(*(Text(c) for c in r))
        out.print(table)
    else:
        out.file.write(markdown_table(title, columns, cells, numeric))
        out.file.flush()


def markdown_table(title: str, columns: Sequence[str], cells: Sequence[Sequence[str]], numeric: Sequence[bool]) -> str:
    """A Markdown pipe table (blank line, title line, header, alignment row, rows, blank line), columns padded to
    their widest cell."""

    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    head = [esc(str(c)) for c in columns]
    body = [[esc(c) for c in r] for r in cells]
    widths = [max([len(head[i]), 3, *(len(r[i]) for r in body)]) for i in range(len(head))]

    def line(vals: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, numeric, strict=True))
            + " |"
        )

    align = "|" + "|".join(
        ("-" * (w + 1) + ":") if n else (":" + "-" * (w + 1)) for w, n in zip(widths, numeric, strict=True)
    )
    text = ["", title, "", line(head), align + "|", *(line(r) for r in body), ""]
    return "\n".join(text) + "\n"


def table_key(title: str) -> str:
    """A short machine name for a table title: 'Per kernel (name; first 20)' -> 'per_kernel'."""
    head = re.split(r"[:(;,]| on | of | over | -> ", title, maxsplit=1)[0]
    key = re.sub(r"[^0-9a-zA-Z]+", "_", head).strip("_").lower()
    return key or "table"


def print_csv(tables: Sequence[TableSpec] | TableSpec, file: Any = None) -> None:
    """Write tables as CSV to stdout, one row per entity, null as an empty cell.

    One table: its own columns. Several: a first column ``table`` (:func:`table_key` of the title) and the union
    of their columns, in order of first appearance (cells a table lacks are empty).
    """
    if isinstance(tables, tuple) and len(tables) == 3 and isinstance(tables[0], str):
        tables = [tables]  # one (title, columns, rows)
    tables = list(tables)
    w = csv.writer(file or sys.stdout, lineterminator="\n")
    if len(tables) == 1:
        _, cols, rows = tables[0]
        w.writerow(cols)
        w.writerows([_csv(v) for v in r] for r in rows)
        return
    union: list[str] = []
    for _, cols, _ in tables:
        union += [c for c in cols if c not in union]
    w.writerow(["table", *union])
    for title, cols, rows in tables:
        key = table_key(title)
        for r in rows:
            by_col = dict(zip(cols, r, strict=True))
            w.writerow([key, *(_csv(by_col.get(c)) for c in union)])


def _csv(v: Any) -> Any:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    return v


def _is_number(v: Any) -> bool:
    """An int or float (numpy's too), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and type(v).__name__ != "bool_"


def format_number(v: float) -> str:
    """The one way tables print a number: whole numbers, and any number from 1,000 up, with thousands separators
    and no exponent (counts, bytes, nanoseconds: ``9,291,834,567``); smaller fractions with 4 significant digits
    (``34.84``, ``0.5``). Beyond 10**18 (no byte count or time is that large): ``1.235e+20``."""
    if v != v:
        return "n/a"
    if abs(v) >= 1e18:
        return f"{v:.4g}"
    if isinstance(v, int) or float(v).is_integer() or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _cell(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v)
    if _is_number(v):
        return format_number(v)
    return str(v)


def say(message: str, style: str | None = None) -> None:
    """A line on stdout, printed as written (no markup)."""
    out.print(message, style=style)


def note(message: str, style: str | None = None) -> None:
    """A one-line note to stderr (e.g. 'no GPU found: running the simulator'), printed as written (no markup)."""
    err.print(message, style=style)


def plain(text: str) -> str:
    """``text`` escaped for rich widgets that always read markup (progress descriptions, status spinners)."""
    return escape(text)
