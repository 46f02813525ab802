"""The Trace: what a training workload allocates and which storages each kernel touches.

A Trace is three tables plus a JSON header, stored in a folder::

    DIR/trace.json            header: schema_version, workload, config, torch_version, capture_device, ...
    DIR/allocations.parquet   one row per storage allocation
    DIR/kernels.parquet       one row per kernel (one per leaf aten op: an approximation, see capture.py)
    DIR/accesses.parquet      one row per (kernel, storage) byte range read or written

Events share one global sequence number ``seq``: every allocation, free and kernel has a distinct one, so
sorting by it gives the order in which PyTorch did them. This module needs no torch.

A folder is one write: the header records a ``write_id`` (also stored in each table's Parquet metadata) and each
table's row count, so :func:`read_trace` refuses tables from another write (a mixed folder) or emptied ones.
``uvmlab trace -o`` writes through a :class:`TraceFolder` (uvmlab.files.owned: writer's lock, ownership marker,
manifest, ``trace.json`` last; ``--force`` rules as for run directories).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from uvmlab import SCHEMA_VERSION
from uvmlab.errors import InputError
from uvmlab.files.atomic import to_json
from uvmlab.files.inputs import read_json_file, read_parquet_table
from uvmlab.files.owned import OwnedFolder

CATEGORIES = (
    "parameter",
    "gradient",
    "optimizer_state",
    "activation",
    "input",
    "temporary",
    "workspace",
    "other",
    "communication",
)
"""Allocation categories. ``workspace`` is added by the orchestrator (cuBLAS/cuDNN workspaces), ``communication`` by
a data-parallel layout (uvmlab.trace.shard: all-gather / reduce-scatter buffers, DDP and ZeRO buckets)."""
PHASES = ("setup", "data", "forward", "backward", "optimizer", "zero_grad", "compute")
"""Phases; ``setup`` (iteration -1) is model and optimizer creation before the first iteration; ``compute`` is an
iteration of a workload program (workloads.program), which has no forward/backward/optimizer."""
NEVER_FREED = -1
"""``free_seq`` of an allocation still live at the end of the trace."""

ALLOCATIONS_SCHEMA = pa.schema(
    [
        pa.field("alloc_id", pa.int64(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False, metadata={"unit": "bytes", "doc": "requested bytes"}),
        pa.field("alloc_seq", pa.int64(), nullable=False),
        pa.field("free_seq", pa.int64(), nullable=False, metadata={"doc": "-1: live at the end of the trace"}),
        pa.field("category", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False, metadata={"doc": "-1: setup"}),
        pa.field("op", pa.string(), nullable=False, metadata={"doc": "aten op that allocated it"}),
        pa.field("stream", pa.int32(), nullable=False),
    ]
)
KERNELS_SCHEMA = pa.schema(
    [
        pa.field("kernel_id", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("flops", pa.float64(), nullable=False, metadata={"unit": "FLOP"}),
        pa.field("stream", pa.int32(), nullable=False),
    ]
)
ACCESSES_SCHEMA = pa.schema(
    [
        pa.field("kernel_id", pa.int64(), nullable=False),
        pa.field("alloc_id", pa.int64(), nullable=False),
        pa.field("offset_bytes", pa.int64(), nullable=False, metadata={"unit": "bytes"}),
        pa.field("size_bytes", pa.int64(), nullable=False, metadata={"unit": "bytes"}),
        pa.field("is_write", pa.bool_(), nullable=False),
    ]
)
KERNEL_OPTIONAL: dict[str, tuple[pa.DataType, Any]] = {
    "api": (pa.string(), ""),
    "api_arg": (pa.string(), ""),
    "touched_bytes": (pa.float64(), float("nan")),
    "host_ns": (pa.float64(), float("nan")),
    "order": (pa.string(), ""),
    "threads": (pa.int64(), 0),
    "warp_size": (pa.int32(), 0),
    "stride_bytes": (pa.int64(), 0),
    "seed": (pa.int64(), 0),
    "dtype": (pa.string(), ""),
    "native_ns": (pa.float64(), float("nan")),
    "efficiency": (pa.float64(), float("nan")),
    "index": (pa.string(), ""),
    "temporaries": (pa.string(), ""),
    "layout": (pa.string(), ""),
}
"""Optional kernel columns, (Arrow type, default): every write stores them (defaults filled), a read of an older
trace fills the defaults. ``api``: "" for a kernel, else a CUDA API call or host access between kernels
("prefetch", "advise", "host_write", "host_read": a workload program's calls, workloads/program.py; "memcpy_htod",
"memcpy_dtoh", "host", "host_async": uvmlab.trace.offload); ``api_arg``: "gpu"/"cpu" for a prefetch, one of
``uvmlab.sim.uvm.advice.ADVICE`` for an advise; ``touched_bytes``: DRAM bytes the kernel really moves (NaN: the sum
of its access sizes); ``host_ns``: host time of ``host``/``host_async`` rows; ``order`` and the launch shape
(``threads``, ``warp_size``, ``stride_bytes``, ``seed``; 0: derived) say in which order the kernel's threads touch
its ranges (ACCESS_ORDERS; "" derives it from the op, docs/uvm-sim.md); ``dtype``: the element type of the op's
first floating-point operand ("fp32", "bf16", "fp16", "fp64"; "" unknown: the run's dtype), which picks a GEMM's
math unit (uvmlab.sim.uvm.kernel_class); ``native_ns`` / ``efficiency``: a program kernel's declared native time or
share of peak (NaN: none, the class rules); ``index``: a gather / scatter's index order (``uniform``,
``zipf:A``, ``sorted``, ``rows:KEY`` for index rows kept in the trace header; "": the replay's default;
uvmlab.sim.uvm.index_order). The ``stream`` column of the kernels table is the CUDA stream a row runs on (0: the
default stream; a program's ``uvm.stream()``); ``temporaries``: what the CUDA kernel
allocates inside itself and frees before it returns, which the capture device's kernel does not (a JSON list,
``uvmlab.trace.internal_allocs``; "" none), turned into allocations by the orchestrator; ``layout``: the BLAS
layouts of a GEMM's two matrices (``n`` row-major, ``t`` transposed, e.g. ``"nt"`` for ``x @ w.t()``; a ``bmm``'s
batches of matrices stored one after another by the layout of each; "" unknown or not a GEMM), which give the
order its tiles fault in (uvmlab.sim.uvm.tile_order)."""
ACCESS_ORDERS = ("", "address", "sequential", "strided", "random", "lcg", "gather", "scatter", "tiled")
"""Values of the ``order`` column: "" derived from the op by the replay; "address" every range in address order;
"sequential" / "strided" each thread its own contiguous chunk of every range, ascending, one access every
``stride_bytes`` (warps in lockstep); "random" a seeded permutation of each chunk's pages; "lcg" uvmbench-style
linear congruential page order (gpu_ext ``rand_chunk_kernel``); "gather" / "scatter" the indexed operand in index
order (the index is data: on meta, a seeded uniform random order); "tiled" a GEMM or convolution's operands tile by
tile (uvmlab.sim.uvm.streams, uvmlab.sim.uvm.replay)."""
SCHEMAS: dict[str, pa.Schema] = {
    "allocations": ALLOCATIONS_SCHEMA,
    "kernels": KERNELS_SCHEMA,
    "accesses": ACCESSES_SCHEMA,
}


WRITE_ID_KEY = b"uvmlab.write_id"
"""Parquet schema-metadata key holding the write id of the header the table was written with."""
MAX_TABLE_BYTES = 16 << 30
"""Largest table of a trace folder read (16 GiB; GPT-2's accesses table is a few MB)."""
MAX_HEADER_BYTES = 64 * 1024 * 1024
"""Largest trace.json read (64 MiB; a header is a few KB)."""
UNIQUE_COLUMNS = {"allocations": ("alloc_id", "alloc_seq"), "kernels": ("kernel_id", "seq")}
"""Columns whose values identify a row: a repeated value is a duplicated row (or a damaged table)."""


class TraceFolder(OwnedFolder):
    """A trace folder uvmlab writes (``uvmlab trace -o``): one writer, ``trace.json`` last (uvmlab.files.owned)."""

    kind = "trace"
    complete_name = "trace.json"
    names = ("trace.json", "allocations.parquet", "kernels.parquet", "accesses.parquet")


def empty_table(name: str) -> pd.DataFrame:
    """An empty DataFrame with the columns and dtypes of table ``name``."""
    return SCHEMAS[name].empty_table().to_pandas()


_TEXT = pd.Series([], dtype=str).dtype
"""What ``astype(str)`` gives (pandas' default string dtype)."""


def with_optional_columns(kernels: pd.DataFrame) -> pd.DataFrame:
    """``kernels`` with every KERNEL_OPTIONAL column present (absent ones, and missing values, get the default).

    Integer columns take their schema's width (``warp_size`` is int32), so a trace read back has the dtypes of a
    fresh capture (``Recorder.tables``). A column already of the target dtype with no missing value is left as it
    is (the fill and cast would return it unchanged, at about 0.2 ms a column on every trace read and write)."""
    out = kernels.copy()
    for col, (arrow_type, default) in KERNEL_OPTIONAL.items():
        if isinstance(default, str):
            target = _TEXT
        else:
            target = np.dtype(arrow_type.to_pandas_dtype())
        if col not in out.columns:
            out[col] = pd.Series(default, index=out.index, dtype=target)
            continue
        values = out[col]
        if values.dtype == target and not values.hasnans:
            continue
        if isinstance(default, str):
            out[col] = values.fillna(default).astype(str)
        elif isinstance(default, int):
            out[col] = values.fillna(default).astype(target)
        else:
            out[col] = values.astype(target)
    return out


def kernel_schema() -> pa.Schema:
    """The kernels table's full schema: KERNELS_SCHEMA plus the KERNEL_OPTIONAL columns."""
    extra = [pa.field(c, t, nullable=pa.types.is_floating(t)) for c, (t, _) in KERNEL_OPTIONAL.items()]
    return pa.schema([*KERNELS_SCHEMA, *extra])  # NaN (a float default) is stored as null


@dataclass
class Trace:
    """A captured (or orchestrated, or synthetic) trace. Tables follow ``SCHEMAS``; ``header`` is free-form JSON."""

    allocations: pd.DataFrame
    kernels: pd.DataFrame = field(default_factory=lambda: empty_table("kernels"))
    accesses: pd.DataFrame = field(default_factory=lambda: empty_table("accesses"))
    header: dict[str, Any] = field(default_factory=dict)

    @property
    def n_iterations(self) -> int:
        """Number of training iterations in the trace."""
        it = self.allocations["iteration"]
        return int(it.max()) + 1 if len(it) else 0

    def validate(self, source: str = "trace") -> None:
        """Check columns and the event-order invariants; raise InputError naming the first problem."""
        for name, schema in SCHEMAS.items():
            df = getattr(self, name)
            missing = [c for c in schema.names if c not in df.columns]
            if missing:
                raise InputError(f"{source}: table {name} lacks columns {missing}")
        a = self.allocations
        alloc_seq, free_seq = a["alloc_seq"].to_numpy(), a["free_seq"].to_numpy()
        early = (free_seq != NEVER_FREED) & (free_seq <= alloc_seq)
        if early.any():
            i = int(np.flatnonzero(early)[0])
            raise InputError(
                f"{source}: allocation {a['alloc_id'].iat[i]} is freed (seq {free_seq[i]}) before it is made"
            )
        if (a["size_bytes"].to_numpy() < 0).any():
            raise InputError(f"{source}: negative allocation size")
        unknown = set(a["category"].unique()) - set(CATEGORIES)
        if unknown:
            raise InputError(f"{source}: unknown categories {sorted(unknown)}; known: {CATEGORIES}")
        if "order" in self.kernels.columns:
            bad_orders = set(self.kernels["order"].fillna("").unique()) - set(ACCESS_ORDERS)
            if bad_orders:
                raise InputError(f"{source}: unknown access orders {sorted(bad_orders)}; known: {ACCESS_ORDERS[1:]}")

    def events(self) -> pd.DataFrame:
        """Allocation and free events in sequence order: columns seq, alloc_id, size_bytes, is_alloc, stream.

        Built from the columns' arrays (the frame operations cost milliseconds on a trace of a few hundred rows,
        and every estimate reads the events)."""
        a = self.allocations
        free_seq = a["free_seq"].to_numpy()
        freed = free_seq != NEVER_FREED
        seq = np.concatenate([a["alloc_seq"].to_numpy(), free_seq[freed]])
        order = np.argsort(seq, kind="stable")

        def both(col: str) -> np.ndarray:
            values = a[col].to_numpy()
            return np.concatenate([values, values[freed]])[order]

        is_alloc = np.zeros(len(seq), dtype=bool)
        is_alloc[: len(a)] = True
        return pd.DataFrame(
            {
                "seq": seq[order],
                "alloc_id": both("alloc_id"),
                "size_bytes": both("size_bytes"),
                "is_alloc": is_alloc[order],
                "stream": both("stream"),
            }
        )

    def live_bytes(self) -> pd.Series:
        """Live requested bytes after each allocation/free event (indexed by seq)."""
        ev = self.events()
        delta = ev["size_bytes"].where(ev["is_alloc"], -ev["size_bytes"])
        return pd.Series(delta.cumsum().to_numpy(), index=ev["seq"].to_numpy(), name="live_bytes")


def _has_missing(values: pd.Series) -> bool:
    """``values.isna().any()``, without building the mask for a numpy integer, bool or float column (an integer or
    bool column holds no missing value; a float one's missing values are its NaNs)."""
    dtype = values.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "iub":
        return False
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        return bool(np.isnan(values.to_numpy()).any())
    return bool(values.hasnans)


def _to_arrow(df: pd.DataFrame, schema: pa.Schema, name: str) -> pa.Table:
    try:  # column by column: Table.from_pandas of the frame cost about 5 ms a GPUMemNet MLP trace (3 tables)
        arrays = [pa.Array.from_pandas(df[f.name], type=f.type) for f in schema]
        return pa.Table.from_arrays(arrays, schema=schema)
    except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputError(f"cannot write trace table {name}: {exc}") from None


def write_trace(trace: Trace, directory: str | Path | TraceFolder, durable: bool = True, force: bool = False) -> Path:
    """Write ``trace`` into ``directory`` (tables first, header last: the header marks it complete).

    ``durable``: the folder is a :class:`TraceFolder` (taken with its writer's lock unless ``directory`` is one
    already prepared; a complete trace there is replaced only with ``force``) and each file is written atomically
    (temporary file, fsync, rename). Without it the files are written in place, for a caller that writes into a
    private temporary folder and renames the folder into place itself (the trace cache:
    ``uvmlab.trace.cache._store``); the fsyncs cost about 30 ms per trace on a loaded machine, and a cache entry
    damaged by a crash is detected and captured again.
    """
    write_id = uuid.uuid4().hex
    tables = {}
    for name, schema in SCHEMAS.items():
        df = getattr(trace, name)
        if name == "kernels":
            df, schema = with_optional_columns(df), kernel_schema()
        table = _to_arrow(df, schema, name)
        tables[name] = table.replace_schema_metadata({**(table.schema.metadata or {}), WRITE_ID_KEY: write_id})
    rows = {name: t.num_rows for name, t in tables.items()}
    header = {**trace.header, "schema_version": SCHEMA_VERSION, "write_id": write_id, "rows": rows}
    if not durable:
        out = Path(directory.path if isinstance(directory, TraceFolder) else directory)
        out.mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            pq.write_table(table, out / f"{name}.parquet")
        (out / "trace.json").write_text(to_json(header), encoding="utf-8")
        return out
    folder = TraceFolder.for_writing(directory, force)
    try:
        for name, table in tables.items():
            folder.write_file_with(folder.path / f"{name}.parquet", lambda tmp, t=table: pq.write_table(t, tmp))
        folder.write_json_file(folder.path / "trace.json", header)
    finally:
        if folder is not directory:
            folder.release()
    return folder.path


def read_trace(directory: str | Path) -> Trace:
    """Read a trace folder written by :func:`write_trace`; refuse clearly if it is not one."""
    src = Path(directory)
    head_path = src / "trace.json"
    if not head_path.is_file():
        raise InputError(f"{src} is not a uvmlab trace (no trace.json); write one with: uvmlab trace WORKLOAD -o DIR")
    try:
        header = read_json_file(head_path, MAX_HEADER_BYTES, "a uvmlab trace header")
    except json.JSONDecodeError as exc:
        raise InputError(f"{head_path} is not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{head_path} nests too deeply to be a uvmlab trace header") from None
    except InputError as exc:
        if "UTF-8" in str(exc):
            raise InputError(f"{head_path} is not text (it is not a uvmlab trace header)") from None
        raise
    if not isinstance(header, dict):
        raise InputError(f"{head_path} holds a JSON {type(header).__name__}, not a uvmlab trace header (an object)")
    version = header.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(f"{src}: trace schema version {version!r}; this uvmlab reads version {SCHEMA_VERSION}")
    tables: dict[str, pd.DataFrame] = {}
    for name, schema in SCHEMAS.items():
        path = src / f"{name}.parquet"
        table = read_parquet_table(path, MAX_TABLE_BYTES, "a table of a uvmlab trace folder")
        missing = [c for c in schema.names if c not in table.column_names]
        if missing:
            raise InputError(
                f"{path}: missing columns {missing} (written by another uvmlab schema; this one reads {SCHEMA_VERSION})"
            )
        _check_same_write(header, name, table, path)
        tables[name] = table.to_pandas()
    tables["kernels"] = with_optional_columns(tables["kernels"])
    _check_rows(tables, src)
    trace = Trace(header=header, **tables)
    trace.validate(str(src))
    return trace


def _check_same_write(header: dict[str, Any], name: str, table: pa.Table, path: Path) -> None:
    """Refuse a table that is not the one the header was written with (another write's, or emptied)."""
    write_id = header.get("write_id")
    if write_id is None:  # written before write ids: nothing to compare
        return
    mine = (table.schema.metadata or {}).get(WRITE_ID_KEY, b"").decode(errors="replace")
    if mine != write_id:
        raise InputError(
            f"{path} comes from another write than {path.parent / 'trace.json'} (a mixed or copied trace folder); "
            "write the trace again"
        )
    rows = header.get("rows") or {}
    if isinstance(rows, dict) and rows.get(name) != table.num_rows:
        raise InputError(f"{path} has {table.num_rows:,} rows where its header records {rows.get(name)}")


def _check_rows(tables: dict[str, pd.DataFrame], src: Path) -> None:
    """Refuse empty allocations, missing values and repeated row ids: a damaged or edited trace."""
    if tables["allocations"].empty:
        raise InputError(f"{src}: the allocations table is empty (a training step always allocates)")
    for name, df in tables.items():
        for col in SCHEMAS[name].names:
            if _has_missing(df[col]):
                raise InputError(f"{src}: table {name} has missing values in column {col}")
        for col in UNIQUE_COLUMNS.get(name, ()):
            if df[col].is_unique:
                continue
            dup = df[col].duplicated()
            if dup.any():
                raise InputError(f"{src}: table {name} repeats {col} {df.loc[dup, col].iloc[0]} (a duplicated row)")
