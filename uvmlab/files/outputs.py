"""Checks on output paths the user names (``-o``), made before anything is computed or written.

Rules (docs/safety.md): an output that is one of the command's inputs, lies inside an input folder (however deep:
``validate -o DATA/uvm/out``, ``compare A B -o A/tables``), or is a folder holding an input file, is refused even
with ``--force``; an existing output file is replaced only with ``--force``; a folder is never taken for a file (or
a file for a folder). Folder outputs use :class:`uvmlab.files.owned.OwnedFolder` (run directories, trace, comparison and
report figure folders), which adds ownership, a manifest and a lock.

:func:`check_paths` is the one check of a command's paths taken together, run by the CLI for every command before
the command starts (``uvmlab.cli``: each option declares its role, ``uvmlab.cli.options.InputPath`` /
``OutputPath``): every output against every other output and every input, links resolved (``os.path.realpath``,
and the same file by inode where both exist, so a hard link is caught too).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from uvmlab.errors import InputError
from uvmlab.files.atomic import claim_new

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


def _strictly_inside(child: PathLike, parent: PathLike) -> bool:
    """True if ``child`` lies under ``parent`` (links resolved) and is not ``parent`` itself."""
    c, p = os.path.realpath(child), os.path.realpath(parent)
    return c != p and c.startswith(p.rstrip(os.sep) + os.sep)


def _uvmlabs_own(folder: PathLike, path: PathLike) -> bool:
    """True if ``path`` is a file uvmlab wrote in the owned ``folder`` and has not been changed since (its manifest
    lists it with the same content): such a file is uvmlab's, not the user's (``sweep S/spec.yaml -o S``)."""
    from uvmlab.files.owned import OwnedFolder

    owned = OwnedFolder(folder)
    owned.patterns = ("*",)  # any name: only the listed content counts here
    if not owned.is_owned():
        return False
    try:
        return owned.owns(os.path.realpath(path)) if Path(path).is_file() else False
    except InputError:
        return False


def check_paths(outputs: Iterable[tuple[str, PathLike, bool]], inputs: Iterable[tuple[str, PathLike]] = ()) -> None:
    """Refuse (InputError, one sentence) a set of paths a command would read and write that could lose data.

    ``outputs``: (option, path, is_folder); ``inputs``: (option, path) of what the command reads (files or
    folders; a path that does not exist is skipped: the command refuses it in its own words). Refused, whatever
    ``--force`` says: two outputs that are the same path; an output inside an output folder; an output that is an
    input; an output inside an input folder; an output folder that holds an input (unless that input is a file
    uvmlab wrote there itself and nobody changed: ``sweep S/spec.yaml -o S``). Links are resolved first.
    """
    outs = [(opt, Path(path), folder) for opt, path, folder in outputs if path is not None]
    ins = [(opt, Path(path)) for opt, path in inputs if path is not None and (Path(path).exists())]
    for i, (opt, path, folder) in enumerate(outs):
        for opt2, path2, _ in outs[i + 1 :]:
            if same_path(path, path2):
                raise InputError(f"{opt} and {opt2} name the same path {path}; give each output its own path")
        for opt2, path2, folder2 in outs:
            if folder2 and path2 is not path and _strictly_inside(path, path2):
                raise InputError(
                    f"{opt} {path} is inside the output folder {opt2} {path2}; give outputs that do not overlap"
                )
        for opt2, src in ins:
            named = f" ({opt2})" if opt2 else ""
            if same_path(path, src):
                raise InputError(f"{opt} {path} is also an input of this command{named}; choose another output path")
            if src.is_dir() and _strictly_inside(path, src):
                raise InputError(f"{opt} {path} is inside the input folder {src}; choose an output outside it")
            if folder and _strictly_inside(src, path) and not _uvmlabs_own(path, src):
                raise InputError(f"{opt} {path} holds the input {src}; choose another output folder")


def check_output_file(
    out: PathLike, inputs: Iterable[PathLike | None] = (), force: bool = False, option: str = "-o"
) -> Path:
    """Validate an output FILE path: not an input, not a folder, not existing unless ``force``; return it."""
    path = Path(out)
    check_paths([(option, path, False)], [("", src) for src in inputs])
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
    claim_new(path, new=not force)  # without --force, a file that appears meanwhile is not replaced either
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
    check_paths([(option, path, True)], [("", src) for src in inputs])
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
