"""Output folders uvmlab owns: an ownership marker, a writer's lock, a manifest of the files it wrote, and a
completeness file written last (docs/safety.md).

Bookkeeping files in every owned folder::

    DIR/.uvmlab-run         ownership marker (JSON: uvmlab version, the folder's kind, pid, time)
    DIR/.uvmlab.lock        the writer's lock (filelock): one process writes the folder at a time
    DIR/.uvmlab-files.json  the manifest: every file uvmlab wrote there, by relative name, recorded BEFORE the
                            file is written (so a writer killed mid-write leaves a listed name, never an unlisted
                            file of its own)

:class:`OwnedFolder` is the one mechanism behind run directories (:class:`uvmlab.files.rundir.RunDir`), trace folders
(``trace -o``), comparison folders (``compare -o``) and report figure folders. Its rules:

- :meth:`~OwnedFolder.prepare` refuses a symbolic link or a file; a folder holding any of :attr:`names` without the
  marker (the user's own files, even with ``--force``); a folder whose marker names another kind (a trace folder
  is not a run directory); and a folder another process is writing (the lock is taken without waiting).
- A complete folder (its :attr:`complete_name` exists) is replaced only with ``--force``, and then only the files
  in the manifest are removed, by name, the completeness file first; every other file stays, in every subfolder.
- An incomplete folder (a writer was killed) is taken over: the files its manifest lists are removed, except
  :attr:`keep_incomplete` (e.g. a sweep's ``config.json`` and ``logs/``), together with the atomic writer's
  temporaries of those names (``.NAME.*.tmp``), so nothing of a dead writer is counted in the new result.
- Nothing is removed through a symbolic link; a link planted at one of :attr:`link_folders` is removed itself.
- A folder with a marker but no manifest (written by an uvmlab before the manifest) adopts its top-level files
  among :attr:`names`; if a subfolder among them holds anything, it is refused with one sentence (uvmlab cannot
  tell its files there from the user's).
"""

from __future__ import annotations

import glob
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json, atomic_write_with

MARKER_NAME = ".uvmlab-run"
"""Ownership marker: its presence says uvmlab created the folder, so ``--force`` may replace uvmlab's files."""
LOCK_NAME = ".uvmlab.lock"
"""The writer's lock file (never removed: removing a held lock file would let a second writer in)."""
MANIFEST_NAME = ".uvmlab-files.json"
"""The manifest: the relative names of every file uvmlab wrote in the folder."""
BOOKKEEPING = (MARKER_NAME, LOCK_NAME, MANIFEST_NAME)


def os_error_sentence(exc: OSError, what: str = "write") -> str:
    """One sentence for an OSError on a user-given path (read-only file system, name too long, disk full)."""
    name = exc.filename if exc.filename is not None else "the path"
    reason = exc.strerror or type(exc).__name__
    return f"cannot {what} {name}: {reason}"


class OwnedFolder:
    """An output folder uvmlab owns (see the module docstring); subclasses set the class attributes."""

    kind = "run"
    """What the folder holds; written into the marker, and a folder of another kind is refused."""
    complete_name: str | None = "result.json"
    """The file written last; its presence means "complete" (None: the folder has no completeness file)."""
    names: tuple[str, ...] = ()
    """Top-level names uvmlab writes: present without the marker, they are the user's, and the folder is refused."""
    keep_incomplete: tuple[str, ...] = ()
    """Listed names kept when an incomplete folder is taken over (a trailing ``/`` keeps a whole subfolder)."""
    link_folders: tuple[str, ...] = ()
    """Subfolders in which uvmlab writes: a symbolic link planted at one of these names is removed (link only)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock: Any = None
        self._listed: set[str] | None = None

    # -- names -------------------------------------------------------------------------------------------------
    @property
    def marker(self) -> Path:
        return self.path / MARKER_NAME

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST_NAME

    def is_complete(self) -> bool:
        """True when the completeness file exists (it is written last, atomically)."""
        return self.complete_name is not None and (self.path / self.complete_name).is_file()

    def is_owned(self) -> bool:
        """True if uvmlab created this folder (its ownership marker is a regular file)."""
        return self.marker.is_file() and not self.marker.is_symlink()

    def marker_kind(self) -> str:
        """The kind the marker names ("run" for markers written before kinds were recorded)."""
        try:
            doc = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return "run"
        return str(doc.get("kind", "run")) if isinstance(doc, dict) else "run"

    # -- the manifest ------------------------------------------------------------------------------------------
    def written(self) -> list[str] | None:
        """The manifest's relative names (None when the folder has no manifest)."""
        try:
            doc = json.loads(self.manifest.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            raise InputError(f"{self.manifest} is damaged; uvmlab cannot tell its files from yours there") from None
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise InputError(f"{self.manifest} is damaged; uvmlab cannot tell its files from yours there")
        return files

    def owns(self, path: str | os.PathLike[str]) -> bool:
        """True if the manifest lists ``path`` (a path inside the folder)."""
        return self._relative(Path(path)) in set(self.written() or [])

    def _write_manifest(self, names: Iterable[str]) -> None:
        from uvmlab import __version__

        self._listed = set(names)
        atomic_write_json(self.manifest, {"uvmlab": __version__, "files": sorted(self._listed)})

    def record(self, path: str | os.PathLike[str]) -> Path:
        """Add ``path`` (inside the folder; checked with :meth:`check_inside`) to the manifest before it is written."""
        target = self.check_inside(Path(path))
        rel = self._relative(target)
        if self._listed is None or rel not in self._listed:
            listed = set(self.written() or [])
            if rel not in listed:
                self._write_manifest(listed | {rel})
            else:
                self._listed = listed
        return target

    def _relative(self, path: Path) -> str:
        return Path(os.path.relpath(path, self.path)).as_posix()

    # -- taking the folder -------------------------------------------------------------------------------------
    def prepare(self, force: bool = False) -> None:
        """Create (or take over) the folder for writing; hold its writer's lock until :meth:`release`.

        Refuses (InputError, one sentence): a symbolic link, a path that is not a folder, a folder another
        process is writing, a folder with uvmlab's names that uvmlab did not write, a folder of another kind, and
        a complete folder without ``force``. With ``force``, only the files in the manifest are removed.
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
        present = [n for n in self.names if (self.path / n).exists() or (self.path / n).is_symlink()]
        if present and not self.is_owned():
            shown = ", ".join(present[:4]) + (", ..." if len(present) > 4 else "")
            raise InputError(
                f"{self.path} holds {shown} that uvmlab did not write (no {MARKER_NAME} marker); "
                "choose an empty or new folder (even --force never replaces files uvmlab did not write)"
            )
        if self.is_owned() and self.marker_kind() != self.kind:
            raise InputError(
                f"{self.path} holds a uvmlab {self.marker_kind()}, not a {self.kind}; choose another folder"
            )

    def _take_over(self, force: bool) -> None:
        self._check_foreign()  # again, under the lock
        done = self.path / self.complete_name if self.complete_name else None
        if done is not None and (done.is_symlink() or (done.exists() and not done.is_file())):
            raise InputError(f"{done} exists but is not a file")
        for name in self.link_folders:  # a link left here would send writes (and removals) elsewhere
            if (self.path / name).is_symlink():
                (self.path / name).unlink()
        if self.is_complete():
            if not force:
                raise InputError(f"will not overwrite the complete {self.kind} in {self.path} without --force")
            self.remove_written(keep=())
        else:
            self.remove_written(keep=self.keep_incomplete)
        self.mark_owned()

    def clear_incomplete(self) -> None:
        """Remove what a killed writer left (the manifest's files but :attr:`keep_incomplete`, and temporaries)."""
        self.remove_written(keep=self.keep_incomplete)

    def remove_written(self, keep: tuple[str, ...] = ()) -> None:
        """Remove every file the manifest lists (the completeness file first) but those ``keep`` names, each with
        the atomic writer's temporaries of its name; empty subfolders left behind go too. Nothing else is touched.
        """
        listed = self.written()
        if listed is None:
            if not self.is_owned():
                return  # a new folder, or one of the user's that holds none of uvmlab's names: nothing is ours
            listed = self._adopt_legacy(keep)
        first = [self.complete_name] if self.complete_name in listed else []
        kept = []
        for rel in first + [n for n in listed if n != self.complete_name]:
            if rel == MANIFEST_NAME or any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in keep):
                kept.append(rel)
                continue
            self._remove_file(rel)
        for name in (*BOOKKEEPING, self.complete_name):  # temporaries of a killed marker, manifest or last write
            if name is not None:
                self._remove_temporaries(self.path / name)
        self._write_manifest(kept)

    def _adopt_legacy(self, keep: tuple[str, ...]) -> list[str]:
        """The files an uvmlab without manifests wrote: its top-level names; refuse if a subfolder holds any."""
        adopted = []
        for name in self.names:
            p = self.path / name
            if p.is_dir() and not p.is_symlink():
                if name + "/" not in keep and any(p.iterdir()):
                    raise InputError(
                        f"{self.path} was written by an uvmlab that kept no list of its files, so it cannot tell "
                        f"its files in {name}/ from yours; move them away or choose a new folder"
                    )
            elif p.is_file() or p.is_symlink():
                adopted.append(name)
        return adopted

    def _remove_file(self, rel: str) -> None:
        path = self.path / rel
        here = self.path
        for part in Path(rel).parts[:-1]:  # never through a link (or into a folder that is no longer one)
            here = here / part
            if here.is_symlink() or not here.is_dir():
                return
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        self._remove_temporaries(path)
        parent = path.parent
        while parent != self.path and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    @staticmethod
    def _remove_temporaries(path: Path) -> None:
        """Remove ``.NAME.*.tmp`` beside ``path`` (temporaries of :func:`uvmlab.files.atomic.atomic_path`)."""
        if not path.parent.is_dir() or path.parent.is_symlink():
            return
        for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            if tmp.is_file() or tmp.is_symlink():
                tmp.unlink(missing_ok=True)

    def mark_owned(self) -> None:
        """Write the ownership marker (uvmlab created this folder and may replace its own files with --force)."""
        if self.marker.is_symlink():
            self.marker.unlink()
        from uvmlab import __version__

        doc = {"uvmlab": __version__, "kind": self.kind, "pid": os.getpid(), "created": time.time()}
        atomic_write_json(self.marker, doc)

    # -- the lock ----------------------------------------------------------------------------------------------
    @classmethod
    def for_writing(cls, out: Any, force: bool = False) -> Self:
        """A prepared folder holding its lock: ``out`` itself if it is one already prepared, else a new one."""
        folder = out if isinstance(out, cls) else cls(out)
        if not folder.locked:
            folder.prepare(force=force)
        return folder

    @property
    def locked(self) -> bool:
        """True while this object holds the writer's lock."""
        return self._lock is not None and bool(self._lock.is_locked)

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- writes ------------------------------------------------------------------------------------------------
    def check_inside(self, path: Path) -> Path:
        """Refuse (InputError) a write to ``path`` outside the folder or through a symbolic link inside it."""
        rel = Path(os.path.relpath(path, self.path))
        if rel.parts and rel.parts[0] == "..":
            raise InputError(f"{path} is outside the output folder {self.path}")
        here = self.path
        for part in rel.parts[:-1]:
            here = here / part
            if here.is_symlink():
                raise InputError(f"{here} is a symbolic link; uvmlab writes only inside {self.path}")
        return path

    def write_json_file(self, path: Path, obj: Any) -> Path:
        """Record ``path`` in the manifest and write ``obj`` there as JSON, atomically."""
        atomic_write_json(self.record(path), obj)
        return path

    def write_file_with(self, path: Path, writer: Callable[[Path], None]) -> Path:
        """Record ``path`` in the manifest and write it atomically with ``writer(tmp_path)``."""
        atomic_write_with(self.record(path), writer)
        return path
