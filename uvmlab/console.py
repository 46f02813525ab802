"""Console output: tables on stdout, progress and notes on stderr (so ``--format json`` stdout stays clean)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a rich table to stdout; numbers right-aligned, None shown as n/a.

    Text that is not valid rich markup (a path like ``a[/]b``) is printed as it is instead of failing.
    """
    rows = [list(r) for r in rows]
    try:
        out.print(_table(title, columns, rows, plain=False))
    except MarkupError:
        out.print(_table(title, columns, rows, plain=True))


def _table(title: str, columns: Sequence[str], rows: list[list[Any]], plain: bool) -> Table:
    wrap = Text if plain else str
    table = Table(title=wrap(title), title_justify="left")
    for i, col in enumerate(columns):
        numeric = bool(rows) and all(_is_number(r[i]) or r[i] is None for r in rows)
        table.add_column(wrap(col), justify="right" if numeric else "left")
    for r in rows:
        table.add_row(*(wrap(_cell(v)) for v in r))
    return table


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _cell(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v)


def note(message: str) -> None:
    """A one-line note to stderr (e.g. 'no GPU found: running the simulator'); invalid markup is printed as is."""
    try:
        err.print(message)
    except MarkupError:
        err.print(message, markup=False)
