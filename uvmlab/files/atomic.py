"""Atomic file writes: write to a temporary file in the same folder, fsync, then ``os.replace``.

A process killed at any moment leaves either the old file or the new one, never half of one. A write that fails
(a full disk, a read-only file system, an I/O error: any OSError while the temporary is created, written, synced
or renamed) removes the temporary and raises :class:`~uvmlab.errors.OutputError`, one sentence naming the file
(``cannot write PATH: No space left on device``), so every writer of uvmlab fails the same way (exit 2).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from uvmlab.errors import OutputError


def _default_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _default_file_mode()


def write_failure(target: Path, exc: OSError) -> OutputError:
    """The one sentence for an OSError while writing ``target``."""
    reason = os.strerror(exc.errno) if exc.errno else (str(exc).splitlines() or [type(exc).__name__])[0]
    return OutputError(f"cannot write {target}: {reason}")


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it is renamed onto ``path``.

    Any OSError (in the caller's writer too) becomes an OutputError naming ``path``; the temporary is removed.
    """
    target = Path(path)
    tmp_path: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, _FILE_MODE)  # mkstemp makes 0600; results are shared like any other file
        os.replace(tmp_path, target)
    except OSError as exc:
        raise write_failure(target, exc) from None
    finally:
        if tmp_path is not None and (tmp_path.exists() or tmp_path.is_symlink()):
            tmp_path.unlink()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    # numpy scalars and paths appear in results; anything else is a bug in the caller
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def to_json(obj: Any) -> str:
    """Serialize ``obj`` to indented JSON (NaN becomes null: 'not collected' is never a fake number)."""
    return json.dumps(_nan_to_none(obj), indent=2, sort_keys=False, default=_json_default, allow_nan=False) + "\n"


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_nan_to_none(v) for v in obj]
    return obj


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically."""
    atomic_write_text(path, to_json(obj))


def atomic_write_with(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` (e.g. a Parquet or PNG writer) and rename the result onto ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)
