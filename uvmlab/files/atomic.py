"""Atomic file writes: write to a temporary file in the same folder, fsync, then ``os.replace``.

A process killed at any moment leaves either the old file or the new one, never half of one. A write that fails
(a full disk, a read-only file system, an I/O error: any OSError while the temporary is created, written, synced
or renamed) removes the temporary and raises :class:`~uvmlab.errors.OutputError`, one sentence naming the file
(``cannot write PATH: No space left on device``), so every writer of uvmlab fails the same way (exit 2).

An output checked to be new (:func:`claim_new`: ``uvmlab.files.outputs.check_output_file`` without ``--force``) is
put in place with a hard link, which fails if a file appeared there meanwhile (another process writing the same
output): two ``calibrate -o p.json`` at once leave one file and one refusal, never a silent replacement.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from uvmlab.errors import OutputError

_CLAIMED: set[str] = set()
"""Outputs this process checked to be absent (no ``--force``): they are linked into place, never replaced."""


def claim_new(path: str | os.PathLike[str], new: bool = True) -> None:
    """Say that ``path`` must not exist when it is written (``new``), or may be replaced (``new=False``)."""
    key = os.path.abspath(path)
    if new:
        _CLAIMED.add(key)
    else:
        _CLAIMED.discard(key)


def _default_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _default_file_mode()


def write_failure(target: Path, exc: OSError) -> OutputError:
    """The one sentence for an OSError while writing ``target``."""
    reason = os.strerror(exc.errno) if exc.errno else (str(exc).splitlines() or [type(exc).__name__])[0]
    return OutputError(f"cannot write {target}: {reason}")


def _link_into_place(tmp: Path, target: Path) -> None:
    """Put ``tmp`` at ``target`` only if nothing is there (atomic: a hard link fails on an existing name)."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise OutputError(
            f"{target} appeared while uvmlab was writing it (another process writing the same output?); it was "
            "not replaced: pass --force to replace it"
        ) from None
    except OSError as exc:  # a file system without hard links: create the name exclusively, then rename onto it
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        try:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE))
        except FileExistsError:
            raise OutputError(f"{target} appeared while uvmlab was writing it; it was not replaced") from None
        os.replace(tmp, target)


@contextmanager
def atomic_path(path: str | os.PathLike[str], before_replace: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it is renamed onto ``path`` (linked, if the path was
    claimed new: :func:`claim_new`). ``before_replace(tmp)`` runs on the finished temporary just before (the
    owned folders record its hash there, so a listed name never holds content the manifest does not know).

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
        if before_replace is not None:
            before_replace(tmp_path)
        key = os.path.abspath(target)
        if key in _CLAIMED:
            _link_into_place(tmp_path, target)
            _CLAIMED.discard(key)
        else:
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


def atomic_write_with(
    path: str | os.PathLike[str],
    writer: Callable[[Path], None],
    before_replace: Callable[[Path], None] | None = None,
) -> None:
    """Call ``writer(tmp_path)`` (e.g. a Parquet or PNG writer) and rename the result onto ``path``
    (``before_replace``: see :func:`atomic_path`)."""
    with atomic_path(path, before_replace) as tmp:
        writer(tmp)
