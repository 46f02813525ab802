"""Nsight Systems SQLite export schema: table names, built-in enum ids, version detection, collection status.

Everything here keys on enum *ids*, never on labels: the ids are stable 2021.2 → 2026.1 while labels and enum
symbol names changed (reference/nsys.md §0.5, §1.5). Exports before 2023.2 have no ``ENUM_*`` tables at all, so
the maps below are built in and used for every version.

Version detection order (reference/nsys.md §1.1):
``META_DATA_EXPORT`` (schema ≥ 3.4) → ``EXPORT_META_DATA`` (2.x, 3.1) → an ``/opt/nvidia/nsight-systems/<ver>/``
path in ``StringIds`` (2021.x, no metadata) → "unknown".

Collection status of a figure (reference/nsys.md §0.2, §1.1 "lazy export"):

``collected``      the table exists and has rows;
``zero``           the table is absent but the capture flag says it was collected and the export holds GPU work
                   (kernels, copies or memsets), so none occurred (lazy export omits empty tables);
``not_collected``  the capture flag is off;
``unknown``        no capture metadata (schema < 3.4), or the flag is on but no GPU work was recorded at all
                   (a truncated or failed run: the missing table says nothing).

Only ``collected`` and ``zero`` yield numbers; the others are null ("n/a"), never 0.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field

# -- table names (exactly as exported; there are no _V2/_V3 suffixes, reference/nsys.md §1.1) -------------------
GPU_FAULTS = "CUDA_UM_GPU_PAGE_FAULT_EVENTS"
CPU_FAULTS = "CUDA_UM_CPU_PAGE_FAULT_EVENTS"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
MEMORY_USAGE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
STRING_IDS = "StringIds"
META_EXPORT = "META_DATA_EXPORT"  # schema >= 3.4.0
META_EXPORT_LEGACY = "EXPORT_META_DATA"  # schema 2.x .. 3.1
META_CAPTURE = "META_DATA_CAPTURE"  # schema >= 3.4.0
SYSTEM_ENV = "TARGET_INFO_SYSTEM_ENV"  # name/value rows: CPU, OS, NvDriverVersion, ...

GPU_WORK_TABLES = (KERNEL, MEMCPY, MEMSET)

# Columns uvmlab reads, per table. Extra columns in a newer export are ignored (with a warning); a missing one
# is an error only if it is required (the others are read as null). Sources: reference/nsys.md §1.2-§1.8.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    GPU_FAULTS: ("start", "globalPid", "deviceId", "numberOfPageFaults"),
    CPU_FAULTS: ("start", "globalPid"),
    MEMCPY: ("start", "end", "deviceId", "bytes", "copyKind"),
    KERNEL: ("start", "end", "deviceId"),
    RUNTIME: ("start", "end", "globalTid", "nameId"),
    NVTX: ("start",),
    MEMORY_USAGE: ("start", "bytes", "memoryOperationType"),
    STRING_IDS: ("id", "value"),
}
KNOWN_COLUMNS: dict[str, frozenset[str]] = {
    GPU_FAULTS: frozenset(
        ("start", "end", "globalPid", "deviceId", "address", "numberOfPageFaults", "faultAccessType")
    ),
    CPU_FAULTS: frozenset(
        (
            "start",
            "globalPid",
            "address",
            "originalFaultPc",
            "CpuInstruction",
            "module",
            "unresolvedFaultPc",
            "sourceFile",
            "sourceLine",
        )
    ),
    MEMCPY: frozenset(
        (
            "start",
            "end",
            "deviceId",
            "contextId",
            "greenContextId",
            "streamId",
            "correlationId",
            "globalPid",
            "bytes",
            "copyKind",
            "deprecatedSrcId",
            "srcKind",
            "dstKind",
            "srcDeviceId",
            "srcContextId",
            "dstDeviceId",
            "dstContextId",
            "migrationCause",
            "graphNodeId",
            "virtualAddress",
            "copyCount",
        )
    ),
}

# -- enum ids (ENUM_* tables of 2023.2+; identical ids in every real export 2021-2026) ----------------------------
# ENUM_CUDA_MEMCPY_OPER
COPY_KIND_UVM_HTOD = 11
COPY_KIND_UVM_DTOH = 12
COPY_KIND_UVM_DTOD = 13
UM_COPY_KINDS = (COPY_KIND_UVM_HTOD, COPY_KIND_UVM_DTOH, COPY_KIND_UVM_DTOD)
COPY_KIND_LABELS: dict[int, str] = {
    0: "unknown",
    1: "htod",
    2: "dtoh",
    3: "htoa",
    4: "atoh",
    5: "atoa",
    6: "atod",
    7: "dtoa",
    8: "dtod",
    9: "htoh",
    10: "ptop",
    11: "uvm_htod",
    12: "uvm_dtoh",
    13: "uvm_dtod",
}
# direction names of the run tables (uvmlab.stats.schema.MIGRATION_COLUMNS)
UM_DIRECTION: dict[int, str] = {11: "htod", 12: "dtoh", 13: "dtod"}

# ENUM_CUDA_UNIF_MEM_MIGRATION -> the cause names of uvmlab.stats.schema.MIGRATION_COLUMNS.
# id 2 is CUDA_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE, labelled "Page fault" since 2023.2 (reference §1.5).
MIGRATION_CAUSE: dict[int, str] = {
    0: "unknown",
    1: "user_prefetch",
    2: "fault",
    3: "prefetch",  # speculative prefetch (the driver's, not the user's)
    4: "eviction",
    5: "access_counters",
}

MIGRATION_CAUSE_FAULT = 2
"""The ``migrationCause`` of the migration of the faulted page itself (the prefetched rest is ``3``)."""

# ENUM_CUDA_UNIF_MEM_ACCESS_TYPE
ACCESS_TYPE: dict[int, str] = {0: "unknown", 1: "read", 2: "write", 3: "atomic", 4: "prefetch"}
ACCESS_READ, ACCESS_WRITE = 1, 2

# ENUM_CUDA_MEM_KIND (nsys numbering, not CUPTI's)
MEM_KIND: dict[int, str] = {
    0: "pageable",
    1: "pinned",
    2: "device",
    3: "array",
    4: "managed",
    5: "device_static",
    6: "managed_static",
    7: "unknown",
}
HOST_MEM_KINDS = ("pageable", "pinned")  # host memory: not part of the device footprint
# ENUM_CUDA_DEV_MEM_EVENT_OPER
MEM_OPER_ALLOC, MEM_OPER_FREE = 0, 1

# ENUM_NSYS_EVENT_TYPE ids of NVTX ranges (reference/nsys.md §1.8)
NVTX_PUSHPOP_RANGE = 59
NVTX_STARTEND_RANGE = 60
NVTX_RANGE_TYPES = (NVTX_PUSHPOP_RANGE, NVTX_STARTEND_RANGE)

# ENUM_NSYS_EVENT_CLASS: RUNTIME.eventClass 0 = CUDA runtime, 1 = CUDA driver
EVENT_CLASS_RUNTIME = 0

# GlobalId encoding (reference/nsys.md §1.9): pid = (globalPid >> 24) & 0xFFFFFF
PID_SHIFT = 24
PID_MASK = 0xFFFFFF

_VERSION_PATH = re.compile(r"nsight-systems[-/](\d{4}\.\d+\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class VersionInfo:
    """nsys product and export schema version, and where they were read from."""

    nsys_version: str | None
    schema_version: str | None
    source: str  # "META_DATA_EXPORT" | "EXPORT_META_DATA" | "StringIds path" | "unknown"


@dataclass(frozen=True)
class CaptureFlags:
    """Capture settings from META_DATA_CAPTURE (schema ≥ 3.4); ``None`` where the key is absent."""

    present: bool
    values: dict[str, bool] = field(default_factory=dict)

    def flag(self, key: str) -> bool | None:
        """Value of ``key`` (unprefixed or ``PROCESS_n:`` prefixed; true if any process has it on)."""
        if not self.present:
            return None
        found = [v for k, v in self.values.items() if k == key or k.endswith(":" + key)]
        if not found:
            return None
        return any(found)


def detect_version(conn: sqlite3.Connection, tables: set[str]) -> VersionInfo:
    """Detect nsys and schema version from the metadata tables, else from StringIds paths."""
    for table, src in ((META_EXPORT, "META_DATA_EXPORT"), (META_EXPORT_LEGACY, "EXPORT_META_DATA")):
        if table in tables:
            rows = dict(conn.execute(f'SELECT name, value FROM "{table}"').fetchall())
            return VersionInfo(
                nsys_version=rows.get("EXPORT_PRODUCT_VERSION"),
                schema_version=rows.get("EXPORT_SCHEMA_VERSION"),
                source=src,
            )
    if STRING_IDS in tables:
        row = conn.execute(
            f"SELECT value FROM {STRING_IDS} WHERE value LIKE '%nsight-systems%' ORDER BY id LIMIT 50"
        ).fetchall()
        for (value,) in row:
            m = _VERSION_PATH.search(str(value))
            if m:
                return VersionInfo(nsys_version=m.group(1), schema_version=None, source="StringIds path")
    return VersionInfo(nsys_version=None, schema_version=None, source="unknown")


def read_capture_flags(conn: sqlite3.Connection, tables: set[str]) -> CaptureFlags:
    """The COLLECT_* booleans of META_DATA_CAPTURE (absent before schema 3.4.0)."""
    if META_CAPTURE not in tables:
        return CaptureFlags(present=False)
    values: dict[str, bool] = {}
    for name, value in conn.execute(f"SELECT name, value FROM {META_CAPTURE} WHERE name LIKE '%COLLECT%'"):
        values[str(name)] = str(value).strip().lower() == "true"
    return CaptureFlags(present=True, values=values)


# Which capture flag governs which figure.
FLAG_FOR_TABLE: dict[str, str] = {
    GPU_FAULTS: "COLLECT_UVM_GPU_PAGE_FAULTS",
    CPU_FAULTS: "COLLECT_UVM_CPU_PAGE_FAULTS",
    MEMORY_USAGE: "COLLECT_GPU_MEMORY_USAGE",
    NVTX: "COLLECT_NVTX_TRACE",
}

STATUSES = ("collected", "zero", "not_collected", "unknown")


def collection_status(table: str, row_count: int | None, flags: CaptureFlags, has_gpu_work: bool) -> tuple[str, str]:
    """(status, reason) of one source table; see the module docstring for the four statuses."""
    if row_count:
        return "collected", f"{row_count} rows"
    exists = row_count is not None
    if table == MEMCPY:
        # UM migrations are recorded with plain CUDA tracing (reference/nsys.md §1.4, EZ), no separate flag.
        if exists:
            return "zero", "the copy table is empty"
        if has_gpu_work:
            return "zero", "GPU work was traced but no copies were recorded"
        return "unknown", "no GPU work was recorded, so the missing copy table says nothing"
    flag = flags.flag(FLAG_FOR_TABLE.get(table, ""))
    if flag is False:
        return "not_collected", f"{FLAG_FOR_TABLE[table]}=false in META_DATA_CAPTURE"
    if flag is None:
        if exists:
            return "zero", "the table exists and is empty"
        why = (
            "no META_DATA_CAPTURE (schema < 3.4, or a JSON export)"
            if not flags.present
            else f"no {FLAG_FOR_TABLE.get(table)} key"
        )
        return "unknown", f"table absent and {why}: cannot tell 'not collected' from 'none occurred'"
    if has_gpu_work or exists:
        return "zero", f"{FLAG_FOR_TABLE[table]}=true and no rows (lazy export omits empty tables)"
    return "unknown", f"{FLAG_FOR_TABLE[table]}=true but no GPU work was recorded (truncated or failed capture?)"
