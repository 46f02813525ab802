"""Console output: tables on stdout, progress and notes on stderr (so ``--format json`` stdout stays clean)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a rich table to stdout; numbers right-aligned, None shown as n/a."""
    table = Table(title=title, title_justify="left")
    rows = [list(r) for r in rows]
    for i, col in enumerate(columns):
        numeric = bool(rows) and all(_is_number(r[i]) or r[i] is None for r in rows)
        table.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        table.add_row(*(_cell(v) for v in r))
    out.print(table)


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
    """A one-line note to stderr (e.g. 'no GPU found: running the simulator')."""
    err.print(message)
