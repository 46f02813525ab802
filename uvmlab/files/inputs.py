"""Checks on input files and values the user names, made before anything is parsed (docs/safety.md).

- :func:`read_input_bytes`: a file is read only if it is a regular file (not a device such as ``/dev/urandom``, a
  pipe or a socket, also behind a symbolic link) and no larger than the caller's limit, checked on the opened file
  (``fstat``) and again while reading, so a file that reports size 0 (``/proc``) cannot grow past the limit.
- :func:`loads_json`: JSON text from the command line or a CSV cell, nested at most :data:`MAX_JSON_DEPTH` levels
  (checked on the text before decoding: Python's decoder recurses, and deep input would be a RecursionError).
- :func:`short`: a bounded ``repr`` for error sentences (a value may be huge, and a sentence quoting it must stay
  one short line).

The one mechanism for the OUTPUT side is :mod:`uvmlab.files.outputs` and :mod:`uvmlab.files.owned`.
"""

from __future__ import annotations

import json
import os
import reprlib
import stat
from pathlib import Path
from typing import Any

from uvmlab.errors import InputError
from uvmlab.numbers import json_loads

MAX_JSON_DEPTH = 32
"""Nesting of a JSON value given on the command line (``--option``, ``--sim-option``) or in a CSV cell (evaluate's
``config`` column). Workload options and simulator knobs are flat numbers and strings; 32 levels leave room for
any structured option while staying far from Python's recursion limit (1000)."""
MAX_JSON_CHARS = 1 << 20
"""Characters of one such JSON value (1 MiB; real option values are a few characters)."""

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


def read_input_bytes(path: str | os.PathLike[str], max_bytes: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (links followed), refused (InputError) if it is anything else or
    larger than ``max_bytes``. ``what`` names the expected file in the sentences ("a snapshot pickle")."""
    p = Path(path)
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
