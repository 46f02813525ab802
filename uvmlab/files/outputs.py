"""Checks on output paths the user names (``-o``), made before anything is computed or written.

Rules (docs/safety.md): an output that is one of the command's inputs, lies inside an input folder (however deep:
``validate -o DATA/uvm/out``, ``compare A B -o A/tables``), or is a folder holding an input file, is refused even
with ``--force``; an existing output file is replaced only with ``--force``; a folder is never taken for a file (or
a file for a folder). Folder outputs use :class:`uvmlab.files.owned.OwnedFolder` (run directories, trace, comparison and
report figure folders), which adds ownership, a manifest and a lock.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from uvmlab.errors import InputError

PathLike = str | os.PathLike[str]


def same_path(a: PathLike, b: PathLike) -> bool:
    """True if ``a`` and ``b`` name the same file or folder (links resolved; a missing path compares by name)."""
    pa, pb = Path(a), Path(b)
    try:
        if pa.exists() and pb.exists():
            return os.path.samefile(pa, pb)
    except OSError:
        pass
    return pa.resolve() == pb.resolve()


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def refuse_input_as_output(out: PathLike, inputs: Iterable[PathLike | None], option: str = "-o") -> None:
    """Refuse an output equal to one of ``inputs``, inside an input folder, or a folder holding an input file,
    whatever ``--force`` says (links resolved)."""
    for src in inputs:
        if src is None:
            continue
        if same_path(out, src):
            raise InputError(f"{option} {out} is also an input of this command; choose another output path")
        if Path(src).is_dir() and _inside(Path(out), Path(src)):
            raise InputError(f"{option} {out} is inside the input folder {src}; choose an output outside it")
        if Path(src).is_file() and _inside(Path(src), Path(out)) and Path(out).is_dir():
            raise InputError(f"{option} {out} holds the input {src}; choose another output folder")


def check_output_file(
    out: PathLike, inputs: Iterable[PathLike | None] = (), force: bool = False, option: str = "-o"
) -> Path:
    """Validate an output FILE path: not an input, not a folder, not existing unless ``force``; return it."""
    path = Path(out)
    refuse_input_as_output(path, inputs, option)
    if path.is_dir():
        raise InputError(f"{option} {path} is a folder; give a file name")
    if path.exists() or path.is_symlink():
        if not force:
            raise InputError(f"{option} {path} exists; pass --force to replace it")
        if path.is_symlink():
            raise InputError(f"{option} {path} is a symbolic link; give the file itself")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise InputError(f"{option} {path}: {parent} is not a folder")
    return path


def check_output_folder(
    out: PathLike,
    names: Iterable[str],
    inputs: Iterable[PathLike | None] = (),
    force: bool = False,
    option: str = "-o",
) -> Path:
    """Validate an output FOLDER that will receive ``names``: not an input, not a file, and none of ``names``
    present unless ``force`` (other files in the folder are left alone)."""
    path = Path(out)
    refuse_input_as_output(path, inputs, option)
    if path.is_symlink():
        raise InputError(f"{option} {path} is a symbolic link; give the folder itself")
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path} exists and is not a folder; choose another output folder")
    present = [n for n in names if (path / n).exists() or (path / n).is_symlink()]
    if present and not force:
        raise InputError(f"{option} {path} already holds {', '.join(present[:4])}; pass --force to replace them")
    for n in present:
        if (path / n).is_symlink():
            raise InputError(f"{path / n} is a symbolic link; uvmlab writes only inside {path}")
    return path
