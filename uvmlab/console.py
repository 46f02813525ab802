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
from collections.abc import Iterable, Mapping, Sequence
from time import monotonic
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

TableSpec = tuple[str, Sequence[str], Sequence[Sequence[Any]]]
"""(title, columns, rows) of one printable table."""


def progress_bar(*columns: Any, disable: bool = False, transient: bool = True) -> Any:
    """Progress on stderr: a rich bar on a terminal (``transient``: erased when done); when stderr is not a
    terminal (a pipe, a file, a CI or Slurm log), a :class:`LogProgress` printing a plain line now and then;
    nothing with ``disable``."""
    from rich.progress import Progress

    if disable:
        return Progress(*columns, console=err, disable=True)
    if not err.is_terminal:
        return LogProgress()
    return Progress(*columns, console=err, transient=transient)


LOG_EVERY_S = 30.0
"""A log gets a progress line at least this often (seconds) while the work goes on ..."""
LOG_EVERY_FRACTION = 0.1
"""... and one each time another tenth of the work is done."""
LOG_QUIET_S = 5.0
"""Work that ends sooner prints no progress line at all (a short command's log stays one line long)."""


class LogProgress:
    """The part of rich's ``Progress`` uvmlab uses (``add_task``, ``update``, ``advance``, ``start``, ``stop``,
    a context manager), for a stderr that is not a terminal: rich draws nothing there until the end, so a
    13-minute sweep logged nothing until its last line. This prints one plain line per task, ``sweep: 12/120
    (10 %), ok 12  oom 0  error 0, 0:01:23 elapsed``, each :data:`LOG_EVERY_FRACTION` of the work and at least
    every :data:`LOG_EVERY_S` seconds, none in the first :data:`LOG_QUIET_S` seconds, and a last one at
    ``stop`` when it printed any."""

    def __init__(self, clock: Any = None) -> None:
        self._clock = clock or monotonic
        self._tasks: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> LogProgress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Nothing to draw until the first interval has passed."""

    def stop(self) -> None:
        """A last line for each task that printed any (its final count)."""
        for task in self._tasks.values():
            if task["logged"] and task["logged_done"] != task["completed"]:
                self._write(task)

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **fields: Any) -> int:
        now = self._clock()
        tid = len(self._tasks)
        self._tasks[tid] = {
            **{"description": description, "total": total, "completed": completed, "fields": fields},
            **{"start": now, "last_time": now, "last_step": 0, "logged": False, "logged_done": None},
        }
        return tid

    def update(
        self,
        task_id: int,
        *,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        **fields: Any,
    ) -> None:
        task = self._tasks[task_id]
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        if advance is not None:
            task["completed"] += advance
        if description is not None:
            task["description"] = description
        fields.pop("visible", None)
        fields.pop("refresh", None)
        task["fields"].update(fields)
        self._maybe_log(task)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def _maybe_log(self, task: dict[str, Any]) -> None:
        now = self._clock()
        if now - task["start"] < LOG_QUIET_S:
            return
        total = task["total"]
        step = int(task["completed"] / total / LOG_EVERY_FRACTION) if total else 0
        if step > task["last_step"] or now - task["last_time"] >= LOG_EVERY_S:
            task["last_step"] = max(step, task["last_step"])
            self._write(task)

    def _line(self, task: dict[str, Any]) -> str:
        done, total = task["completed"], task["total"]
        text = Text.from_markup(str(task["description"])).plain  # descriptions are escaped for rich: undo it
        count = f"{done:,.0f}/{total:,.0f} ({100 * done / total:.0f} %)" if total else f"{done:,.0f}"
        extra = [str(v) for v in task["fields"].values() if v not in (None, "")]
        seconds = int(self._clock() - task["start"])
        elapsed = f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return ", ".join([f"{text}: {count}", *extra, f"{elapsed} elapsed"])

    def _write(self, task: dict[str, Any]) -> None:
        err.print(self._line(task))
        task.update(logged=True, logged_done=task["completed"], last_time=self._clock())


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


def scalar_rows(doc: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every scalar of the JSON document ``doc`` as ``(key, value)`` rows, nested ones under dotted keys
    (``knobs.prefetch_threshold``, ``hint_api_calls.cudaMemPrefetchAsync``; a list's items as ``name.0``): the CSV
    form of a result (``--format csv``) holds every scalar its ``--format json`` holds."""
    rows: list[tuple[str, Any]] = []
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows += scalar_rows(value, f"{name}.")
        elif isinstance(value, list | tuple):
            rows += scalar_rows({str(i): v for i, v in enumerate(value)}, f"{name}.")
        else:
            rows.append((name, value))
    return rows


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
    (``34.84``, ``0.5``). A float beyond 10**18 (no byte count or time is that large): ``1.235e+20``."""
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"  # exact, however large
    v = float(v)
    if v != v:
        return "n/a"
    if abs(v) >= 1e18:  # and infinities
        return f"{v:.4g}"
    if v.is_integer() or abs(v) >= 1000:
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
