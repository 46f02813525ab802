"""Nsight Systems JSON exports (`nsys export --type json`): the UM GPU fault events, as an in-memory SQLite
database in the SQLite export's schema, so every reader and summary works on them unchanged.

Format (reference/nsys.md §3.1, CMB JSON): one JSON object per line; line 1 is the string table ``{"data": [...]}``
(StringIds by position); GPU faults are ``{"Type": 120, "CudaUvmGpuPageFaultEvent": {"startNs", "endNs",
"deviceId", "globalPid", "address", "numberOfPageFaults", "faultAccessType"}}`` with 64-bit integers written as
strings. Only GPU fault events are converted (no kernel, copy or API events were found in a real JSON export to
check field names against); the JSON carries no version or capture metadata, so every other figure is "unknown".
The file is read line by line; the converted rows are held in memory.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from uvmlab.errors import InputError
from uvmlab.files.inputs import decode_json, open_input
from uvmlab.measure.nsys import schema as S

FAULT_KEY = "CudaUvmGpuPageFaultEvent"
FAULT_FIELDS = ("startNs", "endNs", "globalPid", "deviceId", "address", "numberOfPageFaults", "faultAccessType")
BATCH = 100_000
MAX_EXPORT_BYTES = 1 << 40
"""Largest JSON export read (1 TiB: it is streamed line by line)."""
MAX_LINE_BYTES = 64 << 20
"""Longest line of a JSON export (64 MiB: the first line holds the whole string table; 1.6 MB in the largest real
export, ../shared/real-data/nsys)."""


def looks_like_json_export(header: bytes) -> bool:
    """True if the file's first bytes open the JSON export's string table."""
    return header.lstrip().startswith(b'{"data"')


def json_to_sqlite(path: Path) -> sqlite3.Connection:
    """Convert a JSON export into an in-memory SQLite database (StringIds + CUDA_UM_GPU_PAGE_FAULT_EVENTS)."""
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.execute(f"CREATE TABLE {S.STRING_IDS} (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    rows: list[tuple[int, ...]] = []
    try:
        for lineno, line in export_lines(path):
            if not line.strip():
                continue
            obj = decode_json(line, f"{path} line {lineno}", "an nsys JSON export")
            if lineno == 1 and isinstance(obj, dict) and isinstance(obj.get("data"), list):
                conn.executemany(
                    f"INSERT INTO {S.STRING_IDS} VALUES (?, ?)", [(i, str(v)) for i, v in enumerate(obj["data"])]
                )
                continue
            ev = obj.get(FAULT_KEY) if isinstance(obj, dict) else None
            if ev is None:
                continue
            try:
                rows.append(tuple(int(ev[k]) for k in FAULT_FIELDS))
            except (KeyError, TypeError, ValueError):
                raise InputError(
                    f"{path} line {lineno}: a {FAULT_KEY} lacks one of {list(FAULT_FIELDS)} or has a non-integer"
                ) from None
            if len(rows) >= BATCH:
                _flush(conn, rows)
    except UnicodeDecodeError:
        raise InputError(f"{path} is not a text JSON export (not UTF-8)") from None
    _flush(conn, rows)
    return conn


def export_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of the JSON export ``path``, read through the one input opener; a line longer than
    :data:`MAX_LINE_BYTES` is refused before it is held in memory."""
    with open_input(path, MAX_EXPORT_BYTES, "an nsys JSON export") as fh:
        for lineno in itertools.count(1):
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(
                    f"{path} line {lineno} is longer than {MAX_LINE_BYTES:,} bytes, more than a line of an nsys "
                    "JSON export holds"
                )
            yield lineno, raw.decode("utf-8")


def _flush(conn: sqlite3.Connection, rows: list[tuple[int, ...]]) -> None:
    """Insert ``rows`` into the fault table (created on the first batch) and empty the list."""
    if not rows:
        return
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {S.GPU_FAULTS} (start INTEGER NOT NULL, end INTEGER NOT NULL, globalPid INTEGER "
        "NOT NULL, deviceId INTEGER NOT NULL, address INTEGER NOT NULL, numberOfPageFaults INTEGER NOT NULL, "
        "faultAccessType INTEGER NOT NULL)"
    )
    conn.executemany(f"INSERT INTO {S.GPU_FAULTS} VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    rows.clear()
