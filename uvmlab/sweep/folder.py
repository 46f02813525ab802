"""The sweep folder as an owned folder (``sweep SPEC -o DIR``): marker, manifest, lock (uvmlab.files.owned).

A sweep folder belongs to one spec (``spec_hash`` in ``sweep.json``, uvmlab.sweep.runner); its own files are
``sweep.json``, ``spec.yaml`` (the copy of the spec) and ``results.parquet``; each run is a run directory under
``runs/`` with its own marker and manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uvmlab.errors import InputError
from uvmlab.files.inputs import read_json_file
from uvmlab.files.owned import OwnedFolder

MAX_SWEEP_JSON_BYTES = 64 * 1024 * 1024
"""Largest sweep.json read (64 MiB; it lists one run id per configuration, about 40 bytes each)."""


class SweepFolder(OwnedFolder):
    """A sweep folder (``sweep SPEC -o DIR``): one spec's runs, identified by :func:`spec_hash` in ``sweep.json``.

    Never cleared: a sweep resumes. :meth:`claim` (under the folder's lock) writes ``sweep.json`` with the spec's
    hash FIRST, then the copy of the spec, then each run's ``config.json``: a sweep killed anywhere while preparing
    resumes with the same command, and a folder holding another spec's sweep is refused.
    """

    kind = "sweep"
    complete_name = None
    names = ("spec.yaml", "sweep.json", "results.parquet")
    patterns = names

    def _take_over(self, force: bool) -> None:
        self._check_foreign()  # under the lock; nothing is removed: a sweep folder resumes
        self.mark_owned()

    def adopt_legacy(self, source_bytes: bytes | None) -> None:
        """Mark as uvmlab's a sweep folder written before sweep folders had a marker: its sweep.json is one uvmlab
        wrote (a mapping with run ids), or, with no sweep.json (killed while preparing), its spec.yaml holds
        exactly the spec being run. Their current files are listed as uvmlab's."""
        if self.is_owned() or not self.path.is_dir():
            return
        copy = self.path / "spec.yaml"
        legacy = legacy_sweep_json(self.path) is not None
        killed = (
            not (self.path / "sweep.json").exists()
            and not (self.path / "results.parquet").exists()
            and source_bytes is not None
            and copy.is_file()
            and not copy.is_symlink()
            and copy.stat().st_size == len(source_bytes)
            and copy.read_bytes() == source_bytes
        )
        if not (legacy or killed):
            return
        self.mark_owned()
        for name in self.names:
            target = self.path / name
            if target.is_file() and not target.is_symlink() and not self.owns(target):
                self.adopt(target)


def legacy_sweep_json(out: Path) -> dict[str, Any] | None:
    """``out/sweep.json`` when it is one uvmlab wrote (a mapping with ``run_ids``), else None."""
    path = out / "sweep.json"
    if not path.is_file():
        return None
    try:
        doc = read_json_file(path, MAX_SWEEP_JSON_BYTES, "a sweep.json written by uvmlab")
    except InputError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("run_ids"), list) else None
