"""Output folders uvmlab owns: an ownership marker, a writer's lock, a manifest of the files it wrote, and a
completeness file written last (docs/safety.md).

Bookkeeping files in every owned folder::

    DIR/.uvmlab-run         ownership marker (JSON: uvmlab version, the folder's kind, pid, time)
    DIR/.uvmlab.lock        the writer's lock (filelock): one process writes the folder at a time
    DIR/.uvmlab-files.json  the manifest: every file uvmlab wrote there, by relative name, with the size and SHA-256
                            of what it wrote (recorded BEFORE the name is listed with content: the name first, then
                            the hash of the finished temporary, then the rename; so a listed name never holds
                            content uvmlab did not record, and a writer killed mid-write leaves a listed name,
                            never an unlisted file of its own)

:class:`OwnedFolder` is the one mechanism behind run directories (:class:`uvmlab.files.rundir.RunDir`), trace folders
(``trace -o``), comparison folders (``compare -o``), report figure folders and sweep folders. Its rules:

- :meth:`~OwnedFolder.prepare` refuses a symbolic link or a file; a folder holding any of :attr:`names` without the
  marker (the user's own files, even with ``--force``); a folder whose marker names another kind (a trace folder
  is not a run directory); and a folder another process is writing (the lock is taken without waiting).
- **The manifest is input** (anyone can write it): every entry must be a plain relative name inside the folder
  (no absolute path, no ``..``, no empty or ``.`` part) that matches :attr:`patterns` (the names uvmlab writes in
  a folder of this kind); one entry that is not is a refusal of the whole list, and nothing is removed.
- A listed file is removed (``--force``, or a take-over) or replaced only if it is still what uvmlab wrote: a
  regular file (not a link), reached without passing through a link, whose size and SHA-256 match a recorded
  write. A listed file whose content changed is the user's now: the folder is refused with one sentence before
  anything is removed. Entries without a recorded hash (a log appended by uvmlab's processes, a manifest of an
  older uvmlab, a writer killed before the hash) are removed by name (inside the folder, a regular file, a name
  of :attr:`patterns`).
- A write refuses a name that holds a file uvmlab did not write (not listed, or listed with other content):
  ``--force --figure-format svg`` never replaces the user's ``figures/memory_per_kernel.svg``.
- A complete folder (its :attr:`complete_name` exists) is replaced only with ``--force``, the completeness file
  removed first; every other file stays, in every subfolder.
- An incomplete folder (a writer was killed) is taken over: the files its manifest lists are removed, except
  :attr:`keep_incomplete` (e.g. a sweep's ``config.json`` and ``logs/``), together with the atomic writer's
  temporaries of those names (``.NAME.*.tmp``), so nothing of a dead writer is counted in the new result.
- Nothing is removed through a symbolic link; a link planted at one of :attr:`link_folders` is removed itself.
- A folder with a marker but no manifest (written by an uvmlab before the manifest) adopts its top-level files
  among :attr:`names`; if a subfolder among them holds anything, it is refused with one sentence (uvmlab cannot
  tell its files there from the user's).
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from uvmlab.errors import InputError
from uvmlab.files.atomic import atomic_write_json, atomic_write_with
from uvmlab.files.inputs import read_json_file, short

MARKER_NAME = ".uvmlab-run"
"""Ownership marker: its presence says uvmlab created the folder, so ``--force`` may replace uvmlab's files."""
LOCK_NAME = ".uvmlab.lock"
"""The writer's lock file (never removed: removing a held lock file would let a second writer in)."""
MANIFEST_NAME = ".uvmlab-files.json"
"""The manifest: the relative names of every file uvmlab wrote in the folder, with their recorded content."""
BOOKKEEPING = (MARKER_NAME, LOCK_NAME, MANIFEST_NAME)
MANIFEST_VERSION = 2
"""2: ``files`` maps each name to the writes recorded for it ({size, sha256}; empty: name only); 1 (a list of
names) is read as names without content."""
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
"""Largest manifest read (16 MiB; a run directory's is about 2 KB, a GPU run's with its logs about 5 KB)."""
MAX_MARKER_BYTES = 64 * 1024
"""Largest ownership marker read (a marker is about 100 bytes)."""
KEPT_WRITES = 2
"""Writes remembered per name: the last two, so a writer killed between recording a rewrite and its rename leaves a
file the manifest still knows (the previous content)."""

Written = list[dict[str, Any]]
"""The recorded writes of one name: [{"size": int, "sha256": str}, ...] (empty: recorded by name only)."""


def os_error_sentence(exc: OSError, what: str = "write") -> str:
    """One sentence for an OSError on a user-given path (read-only file system, name too long, disk full)."""
    name = exc.filename if exc.filename is not None else "the path"
    reason = exc.strerror or type(exc).__name__
    return f"cannot {what} {name}: {reason}"


def file_digest(path: Path) -> dict[str, Any]:
    """{"size", "sha256"} of the regular file ``path`` (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def plain_relative_name(name: object) -> bool:
    """True for a relative POSIX name of plain parts (no absolute path, ``..``, ``.``, empty part, NUL or ``\\``)."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


class OwnedFolder:
    """An output folder uvmlab owns (see the module docstring); subclasses set the class attributes."""

    kind = "run"
    """What the folder holds; written into the marker, and a folder of another kind is refused."""
    complete_name: str | None = "result.json"
    """The file written last; its presence means "complete" (None: the folder has no completeness file)."""
    names: tuple[str, ...] = ()
    """Top-level names uvmlab writes: present without the marker, they are the user's, and the folder is refused."""
    patterns: tuple[str, ...] = ()
    """Every name uvmlab writes in a folder of this kind (``fnmatch`` patterns of relative names; ``*`` also matches
    ``/``); empty: :attr:`names` and everything under those of them that are folders. A manifest listing another
    name is not uvmlab's."""
    keep_incomplete: tuple[str, ...] = ()
    """Listed names kept when an incomplete folder is taken over (a trailing ``/`` keeps a whole subfolder)."""
    link_folders: tuple[str, ...] = ()
    """Subfolders in which uvmlab writes: a symbolic link planted at one of these names is removed (link only)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock: Any = None

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

    def marker_doc(self) -> dict[str, Any]:
        """The marker's JSON object ({} when it cannot be read)."""
        try:
            doc = read_json_file(self.marker, MAX_MARKER_BYTES, "an ownership marker")
        except InputError:
            return {}
        return doc if isinstance(doc, dict) else {}

    def marker_kind(self) -> str:
        """The kind the marker names ("run" for markers written before kinds were recorded)."""
        return str(self.marker_doc().get("kind", "run"))

    def name_patterns(self) -> tuple[str, ...]:
        """:attr:`patterns`, or the default derived from :attr:`names`."""
        if self.patterns:
            return self.patterns
        return tuple(self.names) + tuple(f"{n}/*" for n in self.names if "." not in n)

    def uvmlab_name(self, name: str) -> bool:
        """True if ``name`` (relative) is a plain name inside the folder that uvmlab writes in a folder of this kind."""
        return plain_relative_name(name) and any(fnmatch.fnmatchcase(name, pat) for pat in self.name_patterns())

    # -- the manifest ------------------------------------------------------------------------------------------
    def entries(self) -> dict[str, Written] | None:
        """The manifest: {relative name: recorded writes} (None when the folder has no manifest).

        The manifest is input: one entry that is not a plain name of this kind of folder (an absolute path, ``..``,
        a name uvmlab never writes here) refuses the whole list (InputError), before anything is removed.
        """
        damaged = f"{self.manifest} is damaged; uvmlab cannot tell its files from yours there"
        if not (self.manifest.exists() or self.manifest.is_symlink()):
            return None
        if self.manifest.is_symlink():
            raise InputError(f"{self.manifest} is a symbolic link; uvmlab cannot tell its files from yours there")
        try:
            doc = read_json_file(self.manifest, MAX_MANIFEST_BYTES, "a uvmlab manifest")
        except InputError as exc:
            raise InputError(f"{damaged} ({exc})") from None
        files = doc.get("files") if isinstance(doc, dict) else None
        if isinstance(files, list) and all(isinstance(f, str) for f in files):  # version 1: names only
            files = {name: [] for name in files}
        if not isinstance(files, dict):
            raise InputError(damaged)
        out: dict[str, Written] = {}
        for name, writes in files.items():
            if not self.uvmlab_name(name) or name in BOOKKEEPING:
                raise InputError(
                    f"{self.manifest} lists {short(name)}, which is not a file uvmlab writes inside a {self.kind} "
                    "folder; the list is not uvmlab's, so nothing in that folder is removed or replaced: choose "
                    "another folder"
                )
            if not isinstance(writes, list) or not all(_valid_write(w) for w in writes):
                raise InputError(damaged)
            out[name] = writes
        return out

    def written(self) -> list[str] | None:
        """The manifest's relative names (None when the folder has no manifest)."""
        entries = self.entries()
        return None if entries is None else sorted(entries)

    def owns(self, path: str | os.PathLike[str]) -> bool:
        """True if the manifest lists ``path`` (a path inside the folder) and it still holds what uvmlab wrote."""
        rel = self._relative(Path(path))
        entries = self.entries() or {}
        return rel in entries and self._state(rel, entries[rel]) in ("ours", "absent")

    def _write_manifest(self, entries: dict[str, Written]) -> None:
        from uvmlab import __version__

        doc = {"uvmlab": __version__, "version": MANIFEST_VERSION, "files": dict(sorted(entries.items()))}
        atomic_write_json(self.manifest, doc)

    def record(self, path: str | os.PathLike[str]) -> Path:
        """Add ``path`` (inside the folder; checked with :meth:`check_inside`) to the manifest before it is written.

        Refuses (InputError) a name that holds a file uvmlab did not write: not listed, or listed with content
        other than what uvmlab recorded (the user's file at one of uvmlab's names is never replaced).
        """
        target = self.check_inside(Path(path))
        rel = self._relative(target)
        if not self.uvmlab_name(rel):
            raise RuntimeError(f"uvmlab bug: {rel!r} is not among the names a {self.kind} folder lists")
        entries = self.entries() or {}
        if rel in entries:
            state = self._state(rel, entries[rel])
            if state not in ("ours", "absent"):
                raise InputError(self._refusal(rel, state))
            return target
        if target.exists() or target.is_symlink():
            raise InputError(
                f"{target} is not a file uvmlab wrote (it is not in {MANIFEST_NAME}); uvmlab will not replace "
                "it: move it away or choose another folder"
            )
        entries[rel] = []
        self._write_manifest(entries)
        return target

    def _commit(self, rel: str, tmp: Path) -> None:
        """Record the content of the finished temporary ``tmp`` of ``rel`` (just before it is renamed into place)."""
        entries = self.entries() or {}
        writes = [w for w in entries.get(rel, []) if w.get("sha256")]
        entries[rel] = [*writes, file_digest(tmp)][-KEPT_WRITES:]
        self._write_manifest(entries)

    def adopt(self, path: str | os.PathLike[str]) -> None:
        """List the file already at ``path`` as uvmlab's, with its current content. Only for a file the caller has
        established is uvmlab's (a sweep folder of an uvmlab before markers, a spec.yaml identical to the spec)."""
        target = self.check_inside(Path(path))
        rel = self._relative(target)
        if not self.uvmlab_name(rel) or not target.is_file() or target.is_symlink():
            raise RuntimeError(f"uvmlab bug: {target} cannot be adopted into a {self.kind} folder")
        entries = self.entries() or {}
        entries[rel] = [file_digest(target)]
        self._write_manifest(entries)

    def verify(self, skip: tuple[str, ...] = ()) -> None:
        """Refuse (InputError) a folder whose manifest is not uvmlab's or lists a file (but ``skip``) that is no
        longer what uvmlab wrote (changed, a link, not a file): checked before a sweep resumes, so it refuses at
        once, not run by run."""
        for rel, writes in (self.entries() or {}).items():
            if rel in skip:
                continue
            state = self._state(rel, writes)
            if state not in ("ours", "absent"):
                raise InputError(self._refusal(rel, state))

    def _relative(self, path: Path) -> str:
        return Path(os.path.relpath(path, self.path)).as_posix()

    def _state(self, rel: str, writes: Written) -> str:
        """What is at listed name ``rel``: "absent", "ours" (a regular file reached without a link, whose content
        matches a recorded write, or any content when none was recorded), "link" (a link on the way or at the
        name), "not a file" or "changed"."""
        here = self.path
        for part in rel.split("/")[:-1]:
            here = here / part
            if here.is_symlink():
                return "link"
            if not here.exists():
                return "absent"
            if not here.is_dir():
                return "not a file"
        target = self.path / rel
        try:
            st = target.lstat()
        except FileNotFoundError:
            return "absent"
        if stat.S_ISLNK(st.st_mode):
            return "link"
        if not stat.S_ISREG(st.st_mode):
            return "not a file"
        if not writes:
            return "ours"
        sized = [w for w in writes if w.get("size") == st.st_size]
        if not sized:
            return "changed"
        digest = file_digest(target)["sha256"]
        return "ours" if any(w.get("sha256") == digest for w in sized) else "changed"

    def _refusal(self, rel: str, state: str) -> str:
        what = {
            "link": "is (or lies behind) a symbolic link",
            "not a file": "is no longer a file",
            "changed": "was changed after uvmlab wrote it",
        }[state]
        return (
            f"{self.path / rel} {what}; uvmlab removes and replaces only the files it wrote, as it wrote them: "
            "move it away or choose another folder"
        )

    # -- taking the folder -------------------------------------------------------------------------------------
    def prepare(self, force: bool = False) -> None:
        """Create (or take over) the folder for writing; hold its writer's lock until :meth:`release`.

        Refuses (InputError, one sentence): a symbolic link, a path that is not a folder, a folder another
        process is writing, a folder with uvmlab's names that uvmlab did not write, a folder of another kind, a
        manifest that is not uvmlab's, a listed file changed since uvmlab wrote it, and a complete folder without
        ``force``. With ``force``, only the files in the manifest, as uvmlab wrote them, are removed.
        """
        p = self.path
        self.check(force)  # before the lock file is created: refuse a user's folder without touching it
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

    def check(self, force: bool = False) -> None:
        """Everything :meth:`prepare` would refuse, checked without touching the folder (no lock file, nothing
        created or removed): a command calls it before its slow work (a capture) so a refusal comes first."""
        p = self.path
        if p.is_symlink():
            raise InputError(f"{p} is a symbolic link; give the folder itself (uvmlab does not write through links)")
        if p.exists() and not p.is_dir():
            raise InputError(f"{p} exists and is not a folder; choose another output folder")
        if not p.is_dir():
            return
        self._check_foreign()
        if self.is_complete() and not force:
            raise InputError(f"will not overwrite the complete {self.kind} in {self.path} without --force")
        keep = () if self.is_complete() else self.keep_incomplete
        for rel, writes in (self.entries() or {}).items():
            if any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in keep):
                continue
            state = self._state(rel, writes)
            if state not in ("ours", "absent"):
                raise InputError(self._refusal(rel, state))

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
        self.entries()  # a manifest that is not uvmlab's is refused before anything is touched

    def _take_over(self, force: bool) -> None:
        self._check_foreign()  # again, under the lock
        done = self.path / self.complete_name if self.complete_name else None
        if done is not None and (done.is_symlink() or (done.exists() and not done.is_file())):
            raise InputError(f"{done} exists but is not a file")
        if self.is_complete() and not force:
            raise InputError(f"will not overwrite the complete {self.kind} in {self.path} without --force")
        for name in self.link_folders:  # a link left here would send writes (and removals) elsewhere
            if (self.path / name).is_symlink():
                (self.path / name).unlink()
        self.remove_written(keep=() if self.is_complete() else self.keep_incomplete)
        self.mark_owned()

    def clear_incomplete(self) -> None:
        """Remove what a killed writer left (the manifest's files but :attr:`keep_incomplete`, and temporaries)."""
        self.remove_written(keep=self.keep_incomplete)

    def remove_written(self, keep: tuple[str, ...] = ()) -> None:
        """Remove every file the manifest lists (the completeness file first) but those ``keep`` names, each with
        the atomic writer's temporaries of its name; empty subfolders left behind go too. Nothing else is touched.

        Every listed file is checked first (:meth:`_state`): one that uvmlab did not write as it is (changed, a
        link, not a file) refuses the whole removal (InputError) before anything is removed.
        """
        entries = self.entries()
        if entries is None:
            if not self.is_owned():
                return  # a new folder, or one of the user's that holds none of uvmlab's names: nothing is ours
            entries = {name: [] for name in self._adopt_legacy(keep)}
        kept: dict[str, Written] = {}
        remove = []
        for rel, writes in entries.items():
            if any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in keep):
                kept[rel] = writes
                continue
            state = self._state(rel, writes)
            if state not in ("ours", "absent"):
                raise InputError(self._refusal(rel, state))
            remove.append(rel)
        remove.sort(key=lambda rel: rel != self.complete_name)  # the completeness file first
        for rel in remove:
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
            elif p.is_file() and not p.is_symlink():
                adopted.append(name)
        return adopted

    def _remove_file(self, rel: str) -> None:
        """Remove the listed file ``rel`` (checked by :meth:`_state` just before: a regular file, no link on the
        way), its temporaries, and the subfolders it leaves empty."""
        path = self.path / rel
        if self._state(rel, []) == "ours":
            path.unlink(missing_ok=True)
        if self._state(rel, []) in ("ours", "absent") and path.parent.is_dir():
            self._remove_temporaries(path)
        parent = path.parent
        while parent != self.path and parent.is_dir() and not parent.is_symlink() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    @staticmethod
    def _remove_temporaries(path: Path) -> None:
        """Remove ``.NAME.*.tmp`` beside ``path`` (temporaries of :func:`uvmlab.files.atomic.atomic_path`)."""
        if not path.parent.is_dir() or path.parent.is_symlink():
            return
        for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            if tmp.is_file() and not tmp.is_symlink():
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
        """Record ``path`` in the manifest and write ``obj`` there as JSON, atomically (its hash recorded)."""
        from uvmlab.files.atomic import to_json

        data = to_json(obj).encode("utf-8")
        return self.write_file_with(path, lambda tmp: tmp.write_bytes(data))

    def write_file_with(self, path: Path, writer: Callable[[Path], None]) -> Path:
        """Record ``path`` in the manifest and write it atomically with ``writer(tmp_path)``; the finished file's
        size and SHA-256 are recorded just before it is renamed into place."""
        target = self.record(path)
        rel = self._relative(target)
        atomic_write_with(target, writer, before_replace=lambda tmp: self._commit(rel, tmp))
        return path


def _valid_write(w: object) -> bool:
    return (
        isinstance(w, dict)
        and isinstance(w.get("size"), int)
        and isinstance(w.get("sha256"), str)
        and len(w["sha256"]) == 64
    )
