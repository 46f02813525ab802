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

import json
import sqlite3
from pathlib import Path

from uvmlab.errors import InputError
from uvmlab.measure.nsys import schema as S

FAULT_KEY = "CudaUvmGpuPageFaultEvent"
FAULT_FIELDS = ("startNs", "endNs", "globalPid", "deviceId", "address", "numberOfPageFaults", "faultAccessType")
BATCH = 100_000


def looks_like_json_export(header: bytes) -> bool:
    """True if the file's first bytes open the JSON export's string table."""
    return header.lstrip().startswith(b'{"data"')


def json_to_sqlite(path: Path) -> sqlite3.Connection:
    """Convert a JSON export into an in-memory SQLite database (StringIds + CUDA_UM_GPU_PAGE_FAULT_EVENTS)."""
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.execute(f"CREATE TABLE {S.STRING_IDS} (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    rows: list[tuple[int, ...]] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(
                        f"{path} line {lineno} is not valid JSON ({exc.msg}): is the JSON export complete?"
                    ) from None
                except RecursionError:
                    raise InputError(f"{path} line {lineno} nests too deeply to be an nsys JSON export") from None
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
