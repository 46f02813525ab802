"""Open an Nsight Systems SQLite export read-only and read its tables as DataFrames.

The input is never modified: it is opened with the URI ``file:...?mode=ro&immutable=1`` (an export is a finished
file; immutable also stops SQLite from creating journal or lock files next to it). Reading is by column name, so
column order and extra columns of newer schemas do not matter; extra columns of the UM tables are reported in
``Export.warnings`` and ignored.

Output columns use uvmlab names with units (``start_ns``, ``bytes``); enum ids are mapped with the built-in maps of
``uvmlab.measure.nsys.schema`` (never with the export's labels). Large tables can be read in chunks
(``iter_chunks``); the summaries in ``uvmlab.measure.nsys.stats`` aggregate in SQLite where they can.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files import foreign_sqlite
from uvmlab.files.inputs import open_input, short
from uvmlab.gpus import check_driver
from uvmlab.measure.nsys import schema as S
from uvmlab.measure.nsys.jsonexport import json_to_sqlite, looks_like_json_export
from uvmlab.measure.nsys.plausible import check_measurements

SQLITE_MAGIC = b"SQLite format 3\x00"
MAX_TABLE_ROWS = 1_000_000_000
"""Rows uvmlab reads from one table of an export (10**9: reading is in chunks, so this bounds time, not memory; the
largest real export in ../shared/real-data/nsys has about 30,000 rows in its largest table)."""
_API_SUFFIX = re.compile(r"_v\d+$")
# Tables whose presence marks a file as an nsys export (any one of them).
_NSYS_MARKERS = (
    S.STRING_IDS,
    S.META_EXPORT,
    S.META_EXPORT_LEGACY,
    "TARGET_INFO_SESSION_START_TIME",
    "ANALYSIS_DETAILS",
)
READ_TABLES = frozenset(
    (*_NSYS_MARKERS, *S.KNOWN_COLUMNS, S.GPU_FAULTS, S.CPU_FAULTS, S.MEMCPY, S.MEMSET, S.KERNEL, S.RUNTIME, S.NVTX,
     S.MEMORY_USAGE, S.META_CAPTURE)
)  # fmt: skip
"""The tables whose rows uvmlab reads from an export: each is capped at :data:`MAX_TABLE_ROWS` rows."""


def _check_file(path: Path) -> bool:
    """Raise InputError for an unusable file; True if it is a JSON export (else an SQLite file)."""
    if not path.exists():
        raise InputError(f"{path} not found: give the .sqlite file written by `nsys export --type sqlite`")
    if not path.is_file():
        raise InputError(f"{path} is not a file: give the .sqlite file written by `nsys export --type sqlite`")
    what = "the .sqlite file written by `nsys export --type sqlite`"
    with open_input(path, foreign_sqlite.MAX_FILE_BYTES, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        header = fh.read(100)
    if looks_like_json_export(header):
        return True
    if path.suffix == ".nsys-rep" or (header[:4] != b"SQLi" and path.suffix in (".qdrep", ".nsys-rep")):
        raise InputError(
            f"{path} is an Nsight Systems report, not its SQLite export: run `nsys export --type sqlite {path}` first"
        )
    if not header.startswith(SQLITE_MAGIC):
        raise InputError(
            f"{path} is not an SQLite file (wrong header): give the .sqlite file written by `nsys export --type sqlite`"
        )
    if len(header) < 100:
        raise InputError(f"{path} is truncated ({size} bytes, shorter than an SQLite header): export it again")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    change_counter = int.from_bytes(header[24:28], "big")
    version_valid_for = int.from_bytes(header[92:96], "big")
    # the in-header page count is valid when version-valid-for equals the change counter (SQLite file format §1.3.7)
    if page_count and change_counter == version_valid_for and size < page_count * page_size:
        raise InputError(
            f"{path} is truncated ({size} of {page_count * page_size} bytes): copy or export the report again"
        )
    return False


class Export:
    """One nsys SQLite export opened read-only (or a JSON export's GPU faults, converted in memory: see
    uvmlab.measure.nsys.jsonexport); use as a context manager or call ``close()``."""

    def __init__(self, path: str | os.PathLike[str], exclude_allocations: Iterable[tuple[int, int]] = ()) -> None:
        self.path = Path(path)
        self.exclude_allocations = tuple((int(a), int(b)) for a, b in exclude_allocations)
        """(address, bytes) of device allocations that are not the job's memory (the uvmlab shim's balloon, from
        its allocation log): dropped from :meth:`memory_usage` with their frees."""
        self.excluded_memory_rows = 0
        self.in_memory = _check_file(self.path)  # a JSON export, converted into an in-memory database
        try:
            if self.in_memory:
                self.conn = json_to_sqlite(self.path)
                self.conn.execute("PRAGMA query_only = 1")
            else:
                self.conn = foreign_sqlite.connect(self.path, "the .sqlite file written by `nsys export`")
            self.tables: set[str] = foreign_sqlite.real_tables(self.conn)
            foreign_sqlite.refuse_views(self.conn, self.path)
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{self.path} cannot be read as SQLite ({exc}): export the report again") from None
        if not any(t in self.tables for t in _NSYS_MARKERS):
            self.conn.close()
            raise InputError(
                f"{self.path} is an SQLite file but not an Nsight Systems export (no StringIds or export metadata "
                "table): give the file written by `nsys export --type sqlite`"
            )
        self._columns: dict[str, list[str]] = {}
        self._counts: dict[str, int | None] = {}
        self._memory_usage: pd.DataFrame | None = None
        self.warnings: list[str] = []
        try:
            self.version = (
                S.VersionInfo(None, None, "JSON export (no version recorded)")
                if self.in_memory
                else S.detect_version(self.conn, self.tables)
            )
            self.flags = S.read_capture_flags(self.conn, self.tables)
        except sqlite3.DatabaseError as exc:
            raise InputError(foreign_sqlite.sqlite_failure(exc, self.path, self.conn)) from None
        for table, known in S.KNOWN_COLUMNS.items():
            if table in self.tables:
                extra = sorted(set(self.columns(table)) - known)
                if extra:
                    self.warnings.append(
                        f"{table} has columns this uvmlab does not know ({', '.join(extra)}): a newer nsys schema? "
                        "They are ignored; the figures use the known columns."
                    )
        for table, required in S.REQUIRED_COLUMNS.items():
            if table in self.tables:
                missing = [c for c in required if c not in self.columns(table)]
                if missing:
                    raise InputError(
                        f"{self.path}: table {table} lacks columns {missing} that every nsys version since 2021 "
                        "writes: is this an nsys export?"
                    )
        for table in S.KNOWN_COLUMNS:
            if table in self.tables:
                self._check_types(table)
        for table in sorted(READ_TABLES & self.tables):
            rows = self.row_count(table) or 0
            if rows > MAX_TABLE_ROWS:
                raise InputError(
                    f"{self.path}: table {table} has {rows:,} rows, more than the {MAX_TABLE_ROWS:,} uvmlab reads "
                    "from one table of an export"
                )
        check_measurements(self)  # impossible rows (uvmlab.measure.nsys.plausible)

    def _check_types(self, table: str) -> None:
        """Refuse a value whose type contradicts its column's declared type among the columns uvmlab reads: text
        or a blob in a number column, a fraction or a value beyond int64 (stored as REAL) in an INTEGER column.
        SQLite keeps what it is given (type affinity), so a damaged or hand-edited export can hold them; one scan
        of the table, stopping at the first such row."""
        declared = {str(r[1]): str(r[2]).upper() for r in self.query(f'PRAGMA table_info("{table}")')}
        allowed = {"INTEGER": "('integer', 'null')", "REAL": "('integer', 'real', 'null')"}
        checks = [(c, allowed[declared[c]]) for c in sorted(S.KNOWN_COLUMNS[table]) if declared.get(c) in allowed]
        if not checks:
            return
        cond = " OR ".join(f'typeof("{c}") NOT IN {ok}' for c, ok in checks)
        cols = ", ".join(f'"{c}"' for c, _ in checks)
        row = self.query(f'SELECT {cols} FROM "{table}" WHERE {cond} LIMIT 1')
        if row:
            for (col, _), value in zip(checks, row[0], strict=True):
                number = isinstance(value, int) or (isinstance(value, float) and declared[col] == "REAL")
                if value is not None and not number:
                    raise InputError(
                        f"{self.path}: table {table} has {short(value)} ({type(value).__name__}) in its "
                        f"{declared[col]} column {col}; the export is damaged: export the report again"
                    )

    # -- basics ----------------------------------------------------------------------------------------------------
    def __enter__(self) -> Export:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` (empty if absent)."""
        if table not in self.tables:
            return []
        if table not in self._columns:
            self._columns[table] = [str(r[1]) for r in self.query(f'PRAGMA table_info("{table}")')]
        return self._columns[table]

    def row_count(self, table: str) -> int | None:
        """Rows of ``table``; ``None`` if the table is absent."""
        if table not in self.tables:
            return None
        if table not in self._counts:
            self._counts[table] = int(self.query(f'SELECT count(*) FROM "{table}"')[0][0])
        return self._counts[table]

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only query; a damaged file becomes an InputError."""
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            _reraise_bug(exc)
            raise InputError(foreign_sqlite.sqlite_failure(exc, self.path, self.conn)) from None

    def iter_rows(self, sql: str, chunk_rows: int = 1_000_000) -> Iterator[list[tuple[Any, ...]]]:
        """Yield the rows of ``sql`` in chunks of at most ``chunk_rows`` (bounded memory)."""
        try:
            cur = self.conn.execute(sql)
            while True:
                rows = cur.fetchmany(chunk_rows)
                if not rows:
                    return
                yield rows
        except sqlite3.DatabaseError as exc:
            _reraise_bug(exc)
            raise InputError(foreign_sqlite.sqlite_failure(exc, self.path, self.conn)) from None

    def col(self, table: str, column: str, default_sql: str = "NULL") -> str:
        """``"column"`` if ``table`` has it, else ``default_sql`` (for columns added in later schemas)."""
        return f'"{column}"' if column in self.columns(table) else default_sql

    def status(self, table: str) -> tuple[str, str]:
        """(status, reason): collected / zero / not_collected / unknown (see uvmlab.measure.nsys.schema)."""
        has_gpu_work = any(self.row_count(t) for t in S.GPU_WORK_TABLES)
        return S.collection_status(table, self.row_count(table), self.flags, has_gpu_work)

    def strings(self, ids: Sequence[int] | None = None) -> dict[int, str]:
        """StringIds as {id: text} (only ``ids`` if given)."""
        if S.STRING_IDS not in self.tables:
            return {}
        if ids is None:
            rows = self.query(f"SELECT id, value FROM {S.STRING_IDS}")
        else:
            wanted = sorted({int(i) for i in ids if i is not None and not pd.isna(i)})
            rows = []
            for k in range(0, len(wanted), 500):
                part = wanted[k : k + 500]
                rows += self.query(
                    f"SELECT id, value FROM {S.STRING_IDS} WHERE id IN ({','.join('?' * len(part))})", part
                )
        return {int(i): str(v) for i, v in rows}

    def driver_version(self) -> str | None:
        """The NVIDIA driver the capture ran on (``TARGET_INFO_SYSTEM_ENV`` ``NvDriverVersion``), as uvmlab writes
        versions: ``'555.42.02'`` as recorded; the undotted form of older nsys (``'52510517'`` for 525.105.17) as its
        branch only (``'525'``: its minor and patch digits cannot be told apart); None when absent or ``'0'``."""
        if S.SYSTEM_ENV not in self.tables:
            return None
        rows = self.query(f"SELECT value FROM {S.SYSTEM_ENV} WHERE name = 'NvDriverVersion'")
        return parse_driver_version(str(rows[0][0])) if rows else None

    def describe(self) -> dict[str, Any]:
        """Version, source tables and their row counts (None = absent)."""
        wanted = (S.GPU_FAULTS, S.CPU_FAULTS, S.MEMCPY, S.KERNEL, S.RUNTIME, S.NVTX, S.MEMORY_USAGE, S.MEMSET)
        return {
            "path": str(self.path),
            "nsys_version": self.version.nsys_version,
            "schema_version": self.version.schema_version,
            "version_source": self.version.source,
            "capture_metadata": self.flags.present,
            "tables": {t: self.row_count(t) for t in wanted},
        }

    # -- tables ----------------------------------------------------------------------------------------------------
    def _df(self, sql: str, columns: Sequence[str]) -> pd.DataFrame:
        return pd.DataFrame(self.query(sql), columns=list(columns))

    def gpu_faults(self) -> pd.DataFrame:
        """GPU page fault records: start_ns, end_ns, pid, device_id, address, fault_count, access."""
        cols = ["start_ns", "end_ns", "pid", "device_id", "address", "fault_count", "access_id"]
        if not self.has(S.GPU_FAULTS):
            return _empty([*cols[:-1], "access"])
        t = S.GPU_FAULTS
        df = self._df(
            f"SELECT start, {self.col(t, 'end', 'start')}, globalPid, deviceId, {self.col(t, 'address')}, "
            f'numberOfPageFaults, {self.col(t, "faultAccessType")} FROM "{t}" ORDER BY start',
            cols,
        )
        df["pid"] = _pid(df["pid"])
        df["access"] = df.pop("access_id").map(S.ACCESS_TYPE).fillna("unknown")
        return df

    def cpu_faults(self) -> pd.DataFrame:
        """CPU page faults (one row = one fault): start_ns, pid, address."""
        cols = ["start_ns", "pid", "address"]
        if not self.has(S.CPU_FAULTS):
            return _empty(cols)
        t = S.CPU_FAULTS
        df = self._df(f'SELECT start, globalPid, {self.col(t, "address")} FROM "{t}" ORDER BY start', cols)
        df["pid"] = _pid(df["pid"])
        return df

    def migrations(self) -> pd.DataFrame:
        """UM migrations (MEMCPY copyKind 11/12/13): start_ns, end_ns, pid, device_id, bytes, direction, cause,
        address."""
        cols = ["start_ns", "end_ns", "pid", "device_id", "bytes", "kind", "cause_id", "address"]
        if not self.has(S.MEMCPY):
            return _empty(["start_ns", "end_ns", "pid", "device_id", "bytes", "direction", "cause", "address"])
        t = S.MEMCPY
        kinds = ",".join(str(k) for k in S.UM_COPY_KINDS)
        df = self._df(
            f'SELECT start, "end", {self.col(t, "globalPid")}, deviceId, bytes, copyKind, '
            f'{self.col(t, "migrationCause")}, {self.col(t, "virtualAddress")} FROM "{t}" '
            f"WHERE copyKind IN ({kinds}) ORDER BY start",
            cols,
        )
        df["pid"] = _pid(df["pid"])
        df["direction"] = df.pop("kind").map(S.UM_DIRECTION)
        df["cause"] = df.pop("cause_id").map(S.MIGRATION_CAUSE).fillna("unknown")
        return df[["start_ns", "end_ns", "pid", "device_id", "bytes", "direction", "cause", "address"]]

    def kernels(self) -> pd.DataFrame:
        """Kernels in start order: kernel_id, name, start_ns, end_ns, pid, device_id, stream_id, correlation_id."""
        cols = ["start_ns", "end_ns", "pid", "device_id", "stream_id", "correlation_id", "short_id", "demangled_id"]
        if not self.has(S.KERNEL):
            return _empty(["kernel_id", "name", *cols[:6]])
        t = S.KERNEL
        df = self._df(
            f'SELECT start, "end", {self.col(t, "globalPid")}, deviceId, {self.col(t, "streamId")}, '
            f"{self.col(t, 'correlationId')}, {self.col(t, 'shortName')}, {self.col(t, 'demangledName')} "
            f'FROM "{t}" ORDER BY start, "end"',
            cols,
        )
        names = self.strings(pd.concat([df["short_id"], df["demangled_id"]]).dropna().tolist())
        short = df.pop("short_id").map(names)
        demangled = df.pop("demangled_id").map(names)
        df.insert(0, "name", short.fillna(demangled).fillna("?"))
        df.insert(0, "kernel_id", np.arange(len(df), dtype=np.int64))
        df["pid"] = _pid(df["pid"])
        return df

    def api_calls(self) -> pd.DataFrame:
        """CUDA runtime/driver API calls: start_ns, end_ns, pid, tid, name (no _vNNNN suffix), correlation_id,
        event_class."""
        cols = ["start_ns", "end_ns", "tid_global", "correlation_id", "name_id", "event_class"]
        if not self.has(S.RUNTIME):
            return _empty(["start_ns", "end_ns", "pid", "tid", "name", "correlation_id", "event_class"])
        t = S.RUNTIME
        df = self._df(
            f'SELECT start, "end", globalTid, {self.col(t, "correlationId")}, nameId, {self.col(t, "eventClass")} '
            f'FROM "{t}" ORDER BY start',
            cols,
        )
        names = self.strings(df["name_id"].dropna().unique().tolist())
        df["name"] = df.pop("name_id").map(names).fillna("?").str.replace(_API_SUFFIX, "", regex=True)
        g = df.pop("tid_global")
        df["pid"] = _pid(g)
        df["tid"] = g.astype("int64") & S.PID_MASK if len(g) else g
        return df[["start_ns", "end_ns", "pid", "tid", "name", "correlation_id", "event_class"]]

    def nvtx_ranges(self) -> pd.DataFrame:
        """NVTX push/pop and start/end ranges: start_ns, end_ns, text (from ``text`` or ``textId``), pid, tid."""
        out_cols = ["start_ns", "end_ns", "text", "pid", "tid"]
        if not self.has(S.NVTX):
            return _empty(out_cols)
        t = S.NVTX
        where = '"end" IS NOT NULL'
        if "eventType" in self.columns(t):
            where += f" AND eventType IN ({','.join(str(i) for i in S.NVTX_RANGE_TYPES)})"
        df = self._df(
            f'SELECT start, "end", {self.col(t, "text")}, {self.col(t, "textId")}, {self.col(t, "globalTid")} '
            f'FROM "{t}" WHERE {where} ORDER BY start',
            ["start_ns", "end_ns", "text", "text_id", "tid_global"],
        )
        names = self.strings(df["text_id"].dropna().unique().tolist())
        df["text"] = df["text"].where(df["text"].notna(), df.pop("text_id").map(names))
        g = df.pop("tid_global")
        df["pid"] = _pid(g)
        df["tid"] = (g.fillna(0).astype("int64") & S.PID_MASK) if len(g) else g
        return df[out_cols]

    def memory_usage(self) -> pd.DataFrame:
        """CUDA_GPU_MEMORY_USAGE_EVENTS as an alloc/free log with live bytes per device.

        Columns: time_ns, pid, device_id, address, bytes, mem_kind, op ("alloc"/"free"), delta_bytes, live_bytes
        (running sum of +bytes per alloc, -bytes per free of device-side kinds, per device; pinned and pageable host
        memory are excluded; rows with start=0 are pre-capture state). The allocations named in
        ``exclude_allocations`` (address and size, e.g. the GPU path's balloon: a real cudaMalloc inside the profiled
        process) are dropped with their first free after them; ``excluded_memory_rows`` counts them. Read once per
        export (summary, tables and result.json all use it): treat the frame as read-only.
        """
        if self._memory_usage is None:
            self._memory_usage = self._read_memory_usage()
        return self._memory_usage

    def _read_memory_usage(self) -> pd.DataFrame:
        cols = ["time_ns", "pid", "device_id", "address", "bytes", "mem_kind_id", "op_id"]
        if not self.has(S.MEMORY_USAGE):
            return _empty(["time_ns", "pid", "device_id", "address", "bytes", "mem_kind", "op", "delta_bytes"])
        t = S.MEMORY_USAGE
        df = self._df(
            f"SELECT start, {self.col(t, 'globalPid')}, {self.col(t, 'deviceId')}, {self.col(t, 'address')}, bytes, "
            f'{self.col(t, "memKind")}, memoryOperationType FROM "{t}" ORDER BY start, rowid',
            cols,
        )
        df["pid"] = _pid(df["pid"])
        df["mem_kind"] = df.pop("mem_kind_id").map(S.MEM_KIND).fillna("unknown")
        if self.exclude_allocations:
            drop = _excluded_rows(df, self.exclude_allocations)
            self.excluded_memory_rows = len(drop)
            df = df.drop(index=drop).reset_index(drop=True)
        op = df.pop("op_id")
        df["op"] = np.where(op == S.MEM_OPER_FREE, "free", np.where(op == S.MEM_OPER_ALLOC, "alloc", "unknown"))
        sign = np.where(df["op"] == "alloc", 1, np.where(df["op"] == "free", -1, 0))
        df["delta_bytes"] = sign * df["bytes"].astype("int64")
        device_side = ~df["mem_kind"].isin(S.HOST_MEM_KINDS)
        df["live_bytes"] = df["delta_bytes"].where(device_side, 0).groupby(df["device_id"], dropna=False).cumsum()
        return df


def parse_driver_version(text: str) -> str | None:
    """A driver version as nsys records it, in uvmlab's form (:meth:`Export.driver_version`); None if unreadable or
    not a driver uvmlab can describe (``uvmlab.gpus.check_driver``: R375 or later)."""
    text = text.strip()
    version = text[:3] if re.fullmatch(r"\d{6,}", text) else text
    try:
        return check_driver(version)
    except InputError:
        return None


def _excluded_rows(df: pd.DataFrame, allocations: Sequence[tuple[int, int]]) -> list[int]:
    """Index labels of the alloc rows matching (address, bytes) in ``allocations`` and of each one's first later
    free of the same address (nsys records the freed size too, not needed for the match)."""
    drop: list[int] = []
    addr = pd.to_numeric(df["address"], errors="coerce")
    for address, size in allocations:
        allocs = df.index[(addr == address) & (df["bytes"] == size) & (df["op_id"] == S.MEM_OPER_ALLOC)]
        for i in allocs:
            drop.append(int(i))
            later = df.index[(df.index > i) & (addr == address) & (df["op_id"] == S.MEM_OPER_FREE)]
            if len(later):
                drop.append(int(later[0]))
    return sorted(set(drop))


def _reraise_bug(exc: sqlite3.DatabaseError) -> None:
    """A query that names a missing column or table is a uvmlab bug, not a damaged file: let it show."""
    if isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(("no such", "near ", "ambiguous")):
        raise exc


def _pid(global_pid: pd.Series) -> pd.Series:
    """Decode pids from GlobalIds (nullable)."""
    if not len(global_pid):
        return global_pid.astype("Int64")
    s = pd.to_numeric(global_pid, errors="coerce").astype("Int64")
    return (s // (1 << S.PID_SHIFT)) % (S.PID_MASK + 1)


def _empty(columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype="object") for c in columns})


def open_export(path: str | os.PathLike[str], exclude_allocations: Iterable[tuple[int, int]] = ()) -> Export:
    """Open an nsys SQLite export read-only (raises InputError for a missing, non-SQLite, truncated or foreign
    file). ``exclude_allocations``: (address, bytes) of device allocations that are not the job's (Export)."""
    return Export(path, exclude_allocations)
