"""The run directory: one class names every file a run writes.

Layout (every write atomic; ``result.json`` is written last and marks the run complete)::

    RUN/config.json        the RunConfig (and anything else that defines the run)
    RUN/env.json           versions and settings of the machine (torch, CUDA, driver, GPU, PYTORCH_CUDA_ALLOC_CONF)
    RUN/result.json        scalars (keys documented in docs/result-json.md); its presence means "complete"
    RUN/tables/NAME.parquet  tables (schemas in uvmlab.stats.schema)
    RUN/figures/NAME.png   figures (or .svg / .pdf: ``RunDir(path, figure_format=...)``, ``--figure-format``)
    RUN/logs/              anything a run wants to keep that is not a result (stdout, shim logs, nsys files)
    RUN/.uvmlab-run        ownership marker: uvmlab created this folder (JSON: uvmlab version, pid, time)
    RUN/.uvmlab.lock       the writer's lock (filelock): one process writes a run directory at a time

Safety rules (docs/safety.md): :meth:`RunDir.prepare` refuses a path that is a symbolic link or not a folder,
refuses a folder holding run files (config.json, result.json, tables/, ...) that uvmlab did not write (no
marker), and takes the writer's lock without waiting (a second writer is refused with one sentence). ``--force``
removes only the names in :data:`OWNED_NAMES` of a folder uvmlab owns, never anything else, and removes a
symbolic link itself rather than what it points to. Writes refuse to go through a symbolic link inside the run
directory (e.g. a ``tables`` link pointing elsewhere).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json, atomic_write_with

FIGURE_FORMATS = ("png", "svg", "pdf")
"""Figure file formats (matplotlib backends on the Agg canvas; ``--figure-format``)."""
MARKER_NAME = ".uvmlab-run"
"""Ownership marker: its presence says uvmlab created the folder, so ``--force`` may replace uvmlab's files."""
LOCK_NAME = ".uvmlab.lock"
"""The writer's lock file (never removed: removing a held lock file would let a second writer in)."""
OWNED_NAMES = ("result.json", "config.json", "env.json", "tables", "figures", "logs")
"""What ``--force`` removes from a folder uvmlab owns (result.json first, so a half-cleared folder is never
"complete"); anything else in the folder is left alone."""


def check_figure_format(fmt: str) -> str:
    """``fmt`` if it is one of FIGURE_FORMATS, else an InputError."""
    if fmt not in FIGURE_FORMATS:
        raise InputError(f"figure format must be one of {', '.join(FIGURE_FORMATS)}, not {fmt!r}")
    return fmt


def os_error_sentence(exc: OSError, what: str = "write") -> str:
    """One sentence for an OSError on a user-given path (read-only file system, name too long, not a folder)."""
    name = exc.filename if exc.filename is not None else "the path"
    reason = exc.strerror or type(exc).__name__
    return f"cannot {what} {name}: {reason}"


def remove_owned(path: Path) -> None:
    """Remove a file, a folder tree, or a symbolic link itself (never what the link points to)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


class RunDir:
    """Names and writes the files of one run directory."""

    def __init__(self, path: str | os.PathLike[str], figure_format: str = "png") -> None:
        self.path = Path(path)
        self.figure_format = check_figure_format(figure_format)
        self._lock: Any = None

    @property
    def marker(self) -> Path:
        return self.path / MARKER_NAME

    # -- names -------------------------------------------------------------------------------
    @property
    def config_json(self) -> Path:
        return self.path / "config.json"

    @property
    def env_json(self) -> Path:
        return self.path / "env.json"

    @property
    def result_json(self) -> Path:
        return self.path / "result.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def table(self, name: str) -> Path:
        """Path of table ``name`` (Parquet)."""
        return self.path / "tables" / f"{name}.parquet"

    def figure(self, name: str) -> Path:
        """Path of figure ``name`` (in ``self.figure_format``)."""
        return self.path / "figures" / f"{name}.{self.figure_format}"

    # -- state -------------------------------------------------------------------------------
    def is_complete(self) -> bool:
        """A run is complete when its ``result.json`` exists (it is written last, atomically)."""
        return self.result_json.is_file()

    def is_owned(self) -> bool:
        """True if uvmlab created this folder (its ownership marker is a regular file)."""
        return self.marker.is_file() and not self.marker.is_symlink()

    def prepare(self, force: bool = False) -> None:
        """Create (or take over) the folder for writing; hold its writer's lock until :meth:`release`.

        Refuses (InputError, one sentence): a symbolic link, a path that is not a folder, a folder another
        process is writing, a folder with run files uvmlab did not write, and a complete run without ``force``.
        With ``force``, only :data:`OWNED_NAMES` are removed.
        """
        p = self.path
        if p.is_symlink():
            raise InputError(f"{p} is a symbolic link; give the folder itself (uvmlab does not write through links)")
        if p.exists() and not p.is_dir():
            raise InputError(f"{p} exists and is not a folder; choose another output folder")
        if p.is_dir():
            self._check_foreign()  # before the lock file is created: refuse a user's folder without touching it
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(os_error_sentence(exc, "create")) from None
        self.acquire()
        try:
            self._take_over(force)
        except BaseException:
            self.release()
            raise

    def _check_foreign(self) -> None:
        present = [n for n in OWNED_NAMES if (self.path / n).exists() or (self.path / n).is_symlink()]
        if present and not self.is_owned():
            raise InputError(
                f"{self.path} holds {', '.join(present)} that uvmlab did not write (no {MARKER_NAME} marker); "
                "choose an empty or new folder (even --force never replaces files uvmlab did not write)"
            )

    def _take_over(self, force: bool) -> None:
        self._check_foreign()  # again, under the lock
        if self.result_json.is_symlink() or (self.result_json.exists() and not self.result_json.is_file()):
            raise InputError(f"{self.result_json} exists but is not a file")
        if self.is_complete():
            if not force:
                raise InputError(f"will not overwrite the complete run in {self.path} without --force")
            for name in OWNED_NAMES:  # result.json first: a half-cleared folder never looks complete
                remove_owned(self.path / name)
        else:
            for name in ("tables", "figures", "logs"):  # a link left here would send writes elsewhere
                if (self.path / name).is_symlink():
                    (self.path / name).unlink()
        self.mark_owned()

    @classmethod
    def for_writing(cls, out: str | os.PathLike[str] | RunDir, force: bool = False) -> RunDir:
        """A prepared RunDir holding its lock: ``out`` itself if it is one already prepared, else a new one."""
        rd = out if isinstance(out, RunDir) else cls(out)
        if not rd.locked:
            rd.prepare(force=force)
        return rd

    @property
    def locked(self) -> bool:
        """True while this object holds the writer's lock."""
        return self._lock is not None and bool(self._lock.is_locked)

    def mark_owned(self) -> None:
        """Write the ownership marker (uvmlab created this folder and may replace its own files with --force)."""
        if self.marker.is_symlink():
            self.marker.unlink()
        from uvmlab import __version__

        atomic_write_json(self.marker, {"uvmlab": __version__, "pid": os.getpid(), "created": time.time()})

    def acquire(self) -> None:
        """Take the writer's lock without waiting; a second writer gets one sentence (InputError)."""
        if self._lock is not None and self._lock.is_locked:
            return
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.path / LOCK_NAME), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise InputError(
                f"another uvmlab process is writing {self.path}; wait for it to finish or choose another folder"
            ) from None
        except OSError as exc:
            raise InputError(os_error_sentence(exc, "lock")) from None
        self._lock = lock

    def release(self) -> None:
        """Release the writer's lock (also released when the process exits, even on kill -9)."""
        if self._lock is not None:
            self._lock.release(force=True)
            self._lock = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- writes ------------------------------------------------------------------------------
    def check_inside(self, path: Path) -> Path:
        """Refuse (InputError) a write to ``path`` if a folder between the run directory and it is a symbolic link."""
        rel = Path(os.path.relpath(path, self.path))
        if rel.parts and rel.parts[0] == "..":
            raise InputError(f"{path} is outside the run directory {self.path}")
        here = self.path
        for part in rel.parts[:-1]:
            here = here / part
            if here.is_symlink():
                raise InputError(f"{here} is a symbolic link; uvmlab writes only inside {self.path}")
        return path

    def write_json(self, which: Path, obj: Any) -> None:
        """Write one of the JSON files atomically."""
        atomic_write_json(self.check_inside(which), obj)

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        """Write ``df`` as ``tables/NAME.parquet`` atomically."""
        path = self.check_inside(self.table(name))
        atomic_write_with(path, lambda tmp: df.to_parquet(tmp, index=False))
        return path

    def write_figure(self, name: str, fig: Any, dpi: int = 120) -> Path:
        """Save a matplotlib figure as ``figures/NAME.<figure_format>`` atomically."""
        path = self.check_inside(self.figure(name))
        fmt = self.figure_format
        atomic_write_with(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight"))
        return path

    # -- reads -------------------------------------------------------------------------------
    def read_json(self, which: Path) -> Any:
        """Read one of the JSON files; a missing or corrupt file is an InputError."""
        try:
            return json.loads(which.read_text())
        except FileNotFoundError:
            raise InputError(f"{which} not found: is {self.path} a uvmlab run directory?") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"{which} is not valid JSON ({exc.msg} at line {exc.lineno})") from None

    def read_result(self) -> dict[str, Any]:
        """The run's result.json as a dict."""
        return dict(self.read_json(self.result_json))

    def read_table(self, name: str) -> pd.DataFrame:
        """Read ``tables/NAME.parquet``."""
        path = self.table(name)
        if not path.is_file():
            raise InputError(f"{path} not found: the run in {self.path} has no table {name!r}")
        return pd.read_parquet(path)

    def summary_line(self) -> str:
        """'Wrote DIR (result.json, N tables, M figures)'."""
        tables = sorted((self.path / "tables").glob("*.parquet")) if (self.path / "tables").is_dir() else []
        fig_dir = self.path / "figures"
        figures = [p for p in fig_dir.iterdir() if p.suffix[1:] in FIGURE_FORMATS] if fig_dir.is_dir() else []
        return f"Wrote {self.path} (result.json, {len(tables)} tables, {len(figures)} figures)"
