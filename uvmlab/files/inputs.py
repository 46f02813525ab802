"""Checks on input files and values the user names, made before anything is parsed (docs/safety.md).

- :func:`open_input` (and :func:`read_input_bytes`, :func:`read_input_text` on top of it): THE opener of every file a
  command reads, named by the user or found inside a folder the user named. A file is read only if it is a regular
  file (not a device such as ``/dev/urandom``, a pipe or a socket, also behind a symbolic link; a FIFO never
  blocks: it is opened non-blocking) and no larger than the caller's limit, checked on the opened file (``fstat``)
  and again while reading, so a file that reports size 0 (``/proc``) cannot grow past the limit.
- One reader per format on top of it, each with limits: :func:`read_json_file` (size; nesting, as Python's decoder
  refuses it; numbers through :func:`uvmlab.numbers.json_loads`: integers within int64, reals finite, no
  NaN/Infinity), :func:`read_csv_rows` and :func:`read_csv_frame` (size; one field at most
  :data:`MAX_CSV_FIELD_CHARS`), :func:`read_parquet_file` (size; rows and uncompressed bytes from the footer, before
  any column is decoded). Foreign SQLite has its own opener (:mod:`uvmlab.files.foreign_sqlite`).
- :func:`loads_json`: JSON text from the command line or a CSV cell, nested at most :data:`MAX_JSON_DEPTH` levels
  (checked on the text before decoding: Python's decoder recurses, and deep input would be a RecursionError).
- :func:`short`: a bounded ``repr`` for error sentences (a value may be huge, and a sentence quoting it must stay
  one short line).

The one mechanism for the OUTPUT side is :mod:`uvmlab.files.outputs` and :mod:`uvmlab.files.owned`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import reprlib
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from uvmlab.errors import InputError
from uvmlab.numbers import INT64_MAX, json_loads

MAX_JSON_DEPTH = 32
"""Nesting of a JSON value given on the command line (``--option``, ``--sim-option``) or in a CSV cell (evaluate's
``config`` column). Workload options and simulator knobs are flat numbers and strings; 32 levels leave room for
any structured option while staying far from Python's recursion limit (1000)."""
MAX_JSON_CHARS = 1 << 20
"""Characters of one such JSON value (1 MiB; real option values are a few characters)."""

MAX_DATA_FILE_BYTES = 1 << 26
"""Largest data file read from a data folder the user names (``validate DATA``, ``calibrate --uvm-timings DIR``,
``collect``'s layout): 64 MiB; the largest file in ../shared/real-data is 4 MB."""
MAX_CSV_BYTES = 64 * 1024 * 1024
"""Largest CSV data file read (64 MiB; a row is ~100 bytes, the real-data sets have at most a few thousand)."""
MAX_CSV_FIELD_CHARS = 1 << 20
"""Characters of one CSV field (1 MiB; the longest real field, a JSON config cell, is under 200)."""
MAX_PARQUET_ROWS = 200_000_000
"""Rows of one Parquet table read from a folder the user names (a GPT-2 x4 run's kernels table: about 60,000)."""
MAX_PARQUET_EXPANDED = 1 << 34
"""Uncompressed bytes of one Parquet table (16 GiB, from its footer): a small file whose columns decompress to
far more (a run-length encoded column of 10**10 equal values) is refused before any column is decoded."""

_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6
_SHORT.maxlevel = 3


def short(value: Any) -> str:
    """``repr(value)`` cut to about 80 characters (containers show their first items and ``...``)."""
    text = _SHORT.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_input_file(path: str | os.PathLike[str], max_bytes: int, what: str) -> int:
    """Refuse (InputError) a ``path`` that is missing, not a regular file, or larger than ``max_bytes``, for readers
    that stream the file themselves (CSV); return its size."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{p} does not exist; give {what}") from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or type(exc).__name__}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{p} is a folder; give {what}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{p} is not a regular file (a device, pipe or socket); give {what}")
    if st.st_size > max_bytes:
        raise InputError(f"{p} is {st.st_size:,} bytes, more than the {max_bytes:,} accepted for {what}")
    return st.st_size


def _open_checked(p: Path, max_bytes: int, what: str) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO must not block us
    except FileNotFoundError:
        raise InputError(f"{p} does not exist; give {what}") from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or type(exc).__name__}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{p} is a folder; give {what}")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{p} is not a regular file (a device, pipe or socket); give {what}")
        raise InputError(f"{p} is {st.st_size:,} bytes, more than the {max_bytes:,} accepted for {what}")
    os.set_blocking(fd, True)
    return fd, st


class _Bounded(io.RawIOBase):
    """A raw reader over an opened regular file that refuses (InputError) to read past ``max_bytes``."""

    def __init__(self, fd: int, path: Path, max_bytes: int, what: str) -> None:
        self._fh = os.fdopen(fd, "rb", buffering=0)
        self._path, self._max, self._what, self._read = path, max_bytes, what, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fh.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def readinto(self, buffer: Any) -> int:
        try:
            n = self._fh.readinto(buffer)
        except OSError as exc:
            raise InputError(f"cannot read {self._path}: {exc.strerror or type(exc).__name__}") from None
        self._read += n or 0
        if self._read > self._max:
            raise InputError(f"{self._path} holds more than the {self._max:,} bytes accepted for {self._what}")
        return n or 0

    def close(self) -> None:
        self._fh.close()
        super().close()


@contextmanager
def open_input(path: str | os.PathLike[str], max_bytes: int, what: str) -> Iterator[IO[bytes]]:
    """Open ``path`` for reading as a binary file: only a regular file (links followed) of at most ``max_bytes``,
    and reading past ``max_bytes`` (a file that grows, or reports size 0) is an InputError. ``what`` names the
    expected file in the sentences ("a snapshot pickle")."""
    p = Path(path)
    fd, _ = _open_checked(p, max_bytes, what)
    with io.BufferedReader(_Bounded(fd, p, max_bytes, what), buffer_size=1 << 20) as fh:
        yield fh


def refuse_special(path: str | os.PathLike[str], option: str) -> None:
    """Refuse (InputError) an input ``path`` given as ``option`` that exists but is neither a regular file nor a
    folder (a FIFO, a device such as ``/dev/urandom``, a socket; links followed): checked for every input path of
    every command before it starts (``uvmlab.cli.options.check_command_paths``), the readers check again."""
    try:
        st = os.stat(path)
    except OSError:
        return  # missing (or unreadable): the command says so in its own words
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise InputError(f"{option} {path} is not a regular file (a device, pipe or socket); give a file or folder")


def read_input_bytes(path: str | os.PathLike[str], max_bytes: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (links followed), refused (InputError) if it is anything else or
    larger than ``max_bytes``. ``what`` names the expected file in the sentences ("a snapshot pickle")."""
    p = Path(path)
    fd, st = _open_checked(p, max_bytes, what)
    with os.fdopen(fd, "rb") as fh:
        chunks: list[bytes] = []
        total, want = 0, st.st_size + 1  # a /proc file reports size 0: read on in 1 MiB steps up to the limit
        try:
            while total <= max_bytes:
                chunk = fh.read(min(max(want, 1 << 20), max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        except OSError as exc:
            raise InputError(f"cannot read {p}: {exc.strerror or type(exc).__name__}") from None
    if total > max_bytes:
        raise InputError(f"{p} holds more than the {max_bytes:,} bytes accepted for {what}")
    return b"".join(chunks)


def read_input_text(path: str | os.PathLike[str], max_bytes: int, what: str) -> str:
    """:func:`read_input_bytes` decoded as UTF-8 (a file that is not text is an InputError)."""
    data = read_input_bytes(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start}); give {what}") from None


def text_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in JSON ``text`` (brackets inside strings are skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads_json(raw: str, what: str) -> Any:
    """Decode JSON ``raw`` (``what`` names it in the sentence); too long or too deep is an InputError, and text that
    is not JSON raises ``json.JSONDecodeError`` for the caller to treat (e.g. as a plain string)."""
    if len(raw) > MAX_JSON_CHARS:
        raise InputError(f"{what} is {len(raw):,} characters long; at most {MAX_JSON_CHARS:,} are accepted")
    if text_depth(raw) > MAX_JSON_DEPTH:
        raise InputError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return json_loads(raw, what)  # numbers checked while decoding (uvmlab.numbers)


def parse_options(pairs: tuple[str, ...], flag: str = "--option") -> dict[str, Any]:
    """Turn ('seq_len=512', 'name=x') into {'seq_len': 512, 'name': 'x'} (values parsed as JSON where they can be;
    a value nested deeper than ``uvmlab.files.inputs.MAX_JSON_DEPTH`` is refused)."""
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InputError(f"{flag} takes KEY=VALUE, not {short(pair)}")
        try:
            result[key] = loads_json(raw, f"{flag} {short(key)}")
        except json.JSONDecodeError:
            result[key] = raw
    return result


def read_parquet_table(
    path: str | os.PathLike[str], max_bytes: int, what: str, max_rows: int = MAX_PARQUET_ROWS
) -> Any:
    """The Parquet file ``path`` as a pyarrow Table: a regular file of at most ``max_bytes``, whose footer declares at
    most ``max_rows`` rows and :data:`MAX_PARQUET_EXPANDED` uncompressed bytes (checked before any column is
    decoded); a file that is not Parquet is one sentence.

    Read with ``pyarrow.parquet.ParquetFile(fh).read``, not ``read_table(fh)``: given a Python file object,
    ``read_table``'s dataset scanner drops its last reference to that object on one of pyarrow's threads after the
    call returns, and a process that exits meanwhile aborts ("terminate called without an active exception": the
    thread asks for the GIL during finalization). Seen in 63 of 100 runs of a script that reads a table and exits
    (pyarrow 26.0.1, 2026-11-29); ``ParquetFile.read`` holds the file only in the caller's thread."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_input(path, max_bytes, what) as fh:
        try:
            parquet = pq.ParquetFile(fh)
            meta = parquet.metadata
            expanded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            if meta.num_rows > max_rows or expanded > MAX_PARQUET_EXPANDED:
                raise InputError(
                    f"{path} declares {meta.num_rows:,} rows and {expanded:,} bytes uncompressed, more than the "
                    f"{max_rows:,} rows and {MAX_PARQUET_EXPANDED:,} bytes accepted for {what}"
                )
            return parquet.read(use_pandas_metadata=True)
        except (pa.ArrowException, OSError, ValueError) as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise InputError(f"{path} is not a readable Parquet file ({short(first)[1:-1]}); give {what}") from None


def read_parquet_file(path: str | os.PathLike[str], max_bytes: int, what: str, max_rows: int = MAX_PARQUET_ROWS) -> Any:
    """The Parquet file ``path`` as a DataFrame (its index and dtypes from the pandas metadata, as
    ``pandas.read_parquet`` gives them), with the limits of :func:`read_parquet_table`."""
    return read_parquet_table(path, max_bytes, what, max_rows).to_pandas()


def decode_json(text: str, source: str, what: str, int_max: int = INT64_MAX) -> Any:
    """Decode JSON ``text`` read from ``source``: any failure is one sentence (InputError): not JSON, nested too
    deeply (Python's decoder stops at its recursion limit), or a number :func:`uvmlab.numbers.json_loads` refuses
    while decoding (an integer beyond int64, a 5,000-digit literal before Python converts it, a real beyond a
    float, NaN/Infinity); ``int_max``: :data:`uvmlab.numbers.UINT64_MAX` for a foreign tool's data file."""
    try:
        return json_loads(text, source, int_max)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno}); give {what}") from None
    except RecursionError:
        raise InputError(f"{source} nests too deeply to be {what}") from None


def read_json_file(path: str | os.PathLike[str], max_bytes: int, what: str, int_max: int = INT64_MAX) -> Any:
    """The JSON value in the regular file ``path`` (:func:`read_input_text`, :func:`decode_json`)."""
    return decode_json(read_input_text(path, max_bytes, what), str(path), what, int_max)


def read_csv_rows(
    path: str | os.PathLike[str], max_bytes: int, what: str, delimiter: str = ","
) -> tuple[list[str], list[dict[str, str]]]:
    """(header, rows as dicts) of the CSV (or TSV) file ``path``: size-limited, one field at most
    :data:`MAX_CSV_FIELD_CHARS` characters, a file that is not UTF-8 text or not CSV is one sentence."""
    header, numbered = csv_text_rows(read_input_text(path, max_bytes, what), str(path), what, delimiter)
    return header, [row for _line, row in numbered]


def csv_text_rows(
    text: str, source: str, what: str, delimiter: str = ",", comment: str | None = None
) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """(header, (line number, row) pairs) of CSV ``text`` read from ``source`` (:func:`read_csv_rows`' limits);
    lines starting with ``comment`` are skipped but keep their place in the numbering."""
    lead = 0
    if comment is not None:
        lines = text.splitlines()
        while lead < len(lines) and lines[lead].startswith(comment):
            lead += 1  # before the header: dropped (a blank line there would be read as the header)
        text = "\n".join("" if line.startswith(comment) else line for line in lines[lead:])
    previous = csv.field_size_limit(MAX_CSV_FIELD_CHARS)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
        rows = [(lead + reader.line_num, row) for row in reader]
        header = list(reader.fieldnames or [])
    except csv.Error as exc:
        raise InputError(f"{source} is not a readable CSV file ({short(str(exc))[1:-1]}); give {what}") from None
    finally:
        csv.field_size_limit(previous)
    return header, rows


def read_csv_frame(path: str | os.PathLike[str], max_bytes: int, what: str, **kw: Any) -> Any:
    """The CSV file ``path`` as a DataFrame (``pandas.read_csv(**kw)``), size-limited; a file that is not UTF-8
    CSV, or a field over :data:`MAX_CSV_FIELD_CHARS`, is one sentence."""
    import pandas as pd

    text = read_input_text(path, max_bytes, what)
    longest = max((len(line) for line in text.splitlines()), default=0)
    if longest > 64 * MAX_CSV_FIELD_CHARS:
        raise InputError(f"{path} has a line of {longest:,} characters; give {what}")
    try:
        return pd.read_csv(io.StringIO(text), **kw)
    except pd.errors.EmptyDataError:
        raise InputError(f"{path} is empty; give {what}") from None
    except (pd.errors.ParserError, ValueError, csv.Error) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise InputError(f"{path} is not a readable CSV file ({short(first)[1:-1]}); give {what}") from None
