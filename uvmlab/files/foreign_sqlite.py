"""SQLite files from other people (nsys exports, the SQLite files of a validate data folder), opened with limits.

A foreign SQLite file is hostile input: its schema can turn any table name into a VIEW whose query never ends (an
endless recursive CTE) or generates 40 million rows from a 4 KB file, and any value can be hundreds of MB. So:

- the file is a regular file, checked on the path before SQLite opens it (:func:`uvmlab.files.inputs.check_input_file`:
  not a FIFO, a device, a folder), and it is opened read-only and immutable (``?mode=ro&immutable=1``: no journal,
  no lock file, nothing written beside it), ``PRAGMA query_only`` and ``trusted_schema = OFF``;
- only real tables are read (:func:`real_tables`: ``sqlite_master.type = 'table'``), and a file that defines a view
  at all is refused in one sentence (:func:`refuse_views`), never read as if the view's table were absent;
- no value longer than :data:`MAX_VALUE_BYTES` is ever materialized: SQLite's own length limit
  (``SQLITE_LIMIT_LENGTH``) refuses it while reading, before Python sees it (a 300 MB kernel name);
- a progress handler stops any statement once the connection has run :data:`TIME_LIMIT_S` seconds;
- the callers cap the rows they read (``uvmlab.measure.nsys.read.MAX_TABLE_ROWS``).

:func:`sqlite_failure` turns SQLite's errors under these limits into one sentence each.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from uvmlab.errors import InputError
from uvmlab.files.inputs import check_input_file, short

MAX_FILE_BYTES = 1 << 40
"""Largest SQLite file opened (1 TiB: nsys exports of long profiles reach tens of GB; reading is by query, so the
file's size is not what limits memory)."""
MAX_VALUE_BYTES = 1 << 20
"""Longest text or blob read from a foreign SQLite file (1 MiB): the longest kernel name among the real exports in
../shared/real-data/nsys is under 2 KB, C++ template names reach tens of KB."""
TIME_LIMIT_S = 1800.0
"""Seconds one connection may spend in SQLite statements (30 min: an nsys import of the largest real export takes
seconds; the limit only stops a statement that would never end)."""
PROGRESS_STEPS = 100_000
"""SQLite virtual-machine steps between two looks at the clock (about a millisecond of work)."""


class LimitedConnection(sqlite3.Connection):
    """A connection that knows its time limit (for the sentence when it stops a statement)."""

    time_limit_s: float = TIME_LIMIT_S


def connect(path: str | os.PathLike[str], what: str, time_limit_s: float | None = None) -> LimitedConnection:
    """Open the foreign SQLite file ``path`` read-only with the limits of the module docstring (InputError when it
    is not a regular file or cannot be opened as SQLite)."""
    p = Path(path)
    check_input_file(p, MAX_FILE_BYTES, what)
    limit = TIME_LIMIT_S if time_limit_s is None else time_limit_s
    try:
        conn = sqlite3.connect(
            p.resolve().as_uri() + "?mode=ro&immutable=1", uri=True, check_same_thread=False, factory=LimitedConnection
        )
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{p} cannot be opened as SQLite ({short(str(exc))[1:-1]}); give {what}") from None
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    deadline = time.monotonic() + limit
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_STEPS)
    try:
        conn.execute("PRAGMA query_only = 1")
        conn.execute("PRAGMA trusted_schema = OFF")
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise InputError(f"{p} cannot be read as SQLite ({short(str(exc))[1:-1]}); give {what}") from None
    conn.time_limit_s = limit
    return conn


def real_tables(conn: sqlite3.Connection) -> set[str]:
    """The names of the real tables (``sqlite_master.type = 'table'``; views, indexes and triggers are not)."""
    return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def refuse_views(conn: sqlite3.Connection, path: str | os.PathLike[str]) -> None:
    """Refuse (InputError) a file that defines any view: a view's rows are computed by a query of the file's choosing
    (endless, or millions of rows from a few bytes), and under a table's name it would be read as that table. No
    real nsys export defines one (none of the 8 in ../shared/real-data/nsys, schemas 2021.2 to 2026.1)."""
    row = conn.execute("SELECT name FROM sqlite_master WHERE type = 'view' LIMIT 1").fetchone()
    if row is not None:
        raise InputError(
            f"{path} defines a view ({short(str(row[0]))[1:-1]}); uvmlab reads only real tables from a foreign "
            "SQLite file (a view's rows are computed by a query the file chose)"
        )


def sqlite_failure(exc: sqlite3.Error, path: str | os.PathLike[str], conn: sqlite3.Connection | None = None) -> str:
    """One sentence for an SQLite error met while reading ``path`` under the limits."""
    text = str(exc)
    if "string or blob too big" in text:
        return f"{path} holds a value longer than {MAX_VALUE_BYTES:,} bytes, more than uvmlab reads from one field"
    if "interrupted" in text:
        limit = getattr(conn, "time_limit_s", TIME_LIMIT_S)
        return f"{path} took more than {limit:,.0f} s to read; uvmlab stopped (a query that does not end?)"
    return f"{path} is damaged or truncated ({short(text)[1:-1]}): export the report again"
