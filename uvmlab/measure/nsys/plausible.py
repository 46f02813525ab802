"""Measurements no hardware produces, refused when an nsys export is opened (docs/safety.md "Impossible
measurements").

A damaged or hand-edited export can hold intervals that end before they start, UM migrations faster than any host
link, or fault counts whose sum overflows 64 bits. Read as they are, they fit a 656,249 GB/s link (``uvmlab
calibrate``), or overflow a sum into a traceback (``nsys summarize``). :func:`check_measurements` runs once per
export (``uvmlab.measure.nsys.read.Export``), so every command that reads one (summarize, import, calibrate,
compare, validate) refuses the same rows in one sentence that names them. One scan per table, stopping at the first
rows found; none of the real exports in ../shared/real-data/nsys has such a row (the fastest UM migration there:
25.6 GB/s, A100; the largest fault count of one record: 1).
"""

from __future__ import annotations

from typing import Any

from uvmlab.errors import InputError
from uvmlab.gpus import LINKS
from uvmlab.measure.nsys import schema as S

MAX_LINK_BYTES_PER_S = max(lk.peak_bytes_per_s for lk in LINKS.values())
"""The fastest host link uvmlab knows (uvmlab.gpus.LINKS: NVLink-C2C, 450 GB/s per direction): no UM migration moves
its bytes faster."""
MAX_FAULTS_PER_RECORD = 2**32
"""Most GPU page faults one record may count (real exports: 1 per record). 2**32 keeps the sum over 2**31 records
within int64, so no total of uvmlab's overflows."""
ROWIDS_NAMED = 5
"""Row ids named in the sentence (the first ones found)."""

_INTERVAL_TABLES = (S.MEMCPY, S.MEMSET, S.KERNEL, S.RUNTIME, S.GPU_FAULTS, S.NVTX)


def _conditions(ex: Any, table: str) -> list[tuple[str, str]]:
    """(SQL condition, what a matching row does) for ``table``'s impossible rows."""
    cols = set(ex.columns(table))
    out = []
    if {"start", "end"} <= cols and table in _INTERVAL_TABLES:
        out.append(('"end" < start', "end before they start"))
    if table == S.MEMCPY and {"start", "end", "bytes", "copyKind"} <= cols:
        kinds = f"{S.COPY_KIND_UVM_HTOD}, {S.COPY_KIND_UVM_DTOH}"
        out.append(
            (
                f'copyKind IN ({kinds}) AND bytes > 0 AND "end" >= start AND '
                f'bytes * 1e9 > ("end" - start) * {MAX_LINK_BYTES_PER_S:.0f}',
                f"are UM migrations faster than any host link ({MAX_LINK_BYTES_PER_S / 1e9:g} GB/s, NVLink-C2C)",
            )
        )
    if table in (S.MEMCPY, S.MEMSET) and "bytes" in cols:
        out.append(("bytes < 0", "move a negative number of bytes"))
    if table == S.GPU_FAULTS and "numberOfPageFaults" in cols:
        out.append(
            (
                f"numberOfPageFaults < 0 OR numberOfPageFaults > {MAX_FAULTS_PER_RECORD}",
                f"count fewer than 0 or more than {MAX_FAULTS_PER_RECORD:,} page faults",
            )
        )
    return out


def check_measurements(ex: Any) -> None:
    """Refuse (InputError naming the table, the rows and what is impossible) an export holding a row of
    :func:`_conditions`; ``ex`` is the opened ``uvmlab.measure.nsys.read.Export`` (which calls this)."""
    for table in _INTERVAL_TABLES:
        if not ex.has(table):
            continue
        for cond, what in _conditions(ex, table):
            rows = ex.query(f'SELECT rowid FROM "{table}" WHERE {cond} LIMIT {ROWIDS_NAMED + 1}')
            if rows:
                ids = ", ".join(str(r[0]) for r in rows[:ROWIDS_NAMED]) + (", ..." if len(rows) > ROWIDS_NAMED else "")
                raise InputError(
                    f"{ex.path}: rows of {table} {what} (rowid {ids}): no hardware measures that; the export is "
                    "damaged or edited: export the report again"
                )
