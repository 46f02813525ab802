"""The run directory: one class names every file a run writes.

Layout (every write atomic; ``result.json`` is written last and marks the run complete)::

    RUN/config.json        the RunConfig (and anything else that defines the run)
    RUN/env.json           versions and settings of the machine (torch, CUDA, driver, GPU, PYTORCH_CUDA_ALLOC_CONF)
    RUN/result.json        scalars (keys documented in docs/result-json.md); its presence means "complete"
    RUN/tables/NAME.parquet  tables (schemas in uvmlab.stats.schema)
    RUN/figures/NAME.png   figures (or .svg / .pdf: ``RunDir(path, figure_format=...)``, ``--figure-format``)
    RUN/logs/              anything a run wants to keep that is not a result (stdout, shim logs, nsys files)
    RUN/.uvmlab-run        ownership marker: uvmlab created this folder (JSON: uvmlab version, kind, pid, time)
    RUN/.uvmlab.lock       the writer's lock (filelock): one process writes a run directory at a time
    RUN/.uvmlab-files.json the manifest: every file uvmlab wrote here, recorded before it is written

Safety rules (docs/safety.md, :mod:`uvmlab.files.owned`): :meth:`RunDir.prepare` refuses a path that is a symbolic link
or not a folder, refuses a folder holding run files (config.json, result.json, tables/, ...) that uvmlab did not
write (no marker), and takes the writer's lock without waiting (a second writer is refused with one sentence).
``--force`` removes only the files the manifest lists, by name, in every subfolder; taking over an incomplete
run (a killed writer) removes its listed results and their temporaries but keeps ``config.json`` and ``logs/``.
Writes refuse to go through a symbolic link inside the run directory (e.g. a ``tables`` link pointing elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.errors import InputError
from uvmlab.files.inputs import read_json_file, read_parquet_file
from uvmlab.files.owned import LOCK_NAME, MANIFEST_NAME, MARKER_NAME, OwnedFolder, os_error_sentence

__all__ = [
    "FIGURE_FORMATS",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "OWNED_NAMES",
    "RunDir",
    "check_figure_format",
    "os_error_sentence",
]

FIGURE_FORMATS = ("png", "svg", "pdf")
"""Figure file formats (matplotlib backends on the Agg canvas; ``--figure-format``)."""
MAX_JSON_BYTES = 64 * 1024 * 1024
"""Largest JSON file of a run directory read (64 MiB; result.json and config.json are a few KB, a validate
run's result.json a few MB)."""
MAX_TABLE_BYTES = 16 << 30
"""Largest table of a run directory read (16 GiB; a GPT-2 x4 run's kernels table is about 3 MB, a large nsys
import's migrations table a few hundred MB)."""
OWNED_NAMES = ("result.json", "config.json", "env.json", "tables", "figures", "logs")
"""uvmlab's names in a run directory: a folder holding one of them without the marker is the user's."""


def check_figure_format(fmt: str) -> str:
    """``fmt`` if it is one of FIGURE_FORMATS, else an InputError."""
    if fmt not in FIGURE_FORMATS:
        raise InputError(f"figure format must be one of {', '.join(FIGURE_FORMATS)}, not {fmt!r}")
    return fmt


class RunDir(OwnedFolder):
    """Names and writes the files of one run directory."""

    kind = "run"
    complete_name = "result.json"
    names = OWNED_NAMES
    patterns = (
        "config.json",
        "env.json",
        "result.json",
        "tables/*.parquet",
        *(f"figures/*.{fmt}" for fmt in FIGURE_FORMATS),
        "logs/*",
    )
    keep_incomplete = ("config.json", "logs/")
    link_folders = ("tables", "figures", "logs")

    def __init__(self, path: str | os.PathLike[str], figure_format: str = "png") -> None:
        super().__init__(path)
        self.figure_format = check_figure_format(figure_format)

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

    # -- writes ------------------------------------------------------------------------------
    def write_json(self, which: Path, obj: Any) -> None:
        """Write one of the JSON files atomically (recorded in the manifest first)."""
        self.write_json_file(which, obj)

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        """Write ``df`` as ``tables/NAME.parquet`` atomically."""
        return self.write_file_with(self.table(name), lambda tmp: df.to_parquet(tmp, index=False))

    def write_figure(self, name: str, fig: Any, dpi: int = 120) -> Path:
        """Save a matplotlib figure as ``figures/NAME.<figure_format>`` atomically."""
        fmt = self.figure_format
        return self.write_file_with(
            self.figure(name), lambda tmp: fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight")
        )

    # -- reads -------------------------------------------------------------------------------
    def read_json(self, which: Path) -> Any:
        """Read one of the JSON files; a missing or corrupt file is an InputError."""
        if not which.exists():
            raise InputError(f"{which} not found: is {self.path} a uvmlab run directory?")
        return read_json_file(which, MAX_JSON_BYTES, "a JSON file written by uvmlab")

    def read_result(self) -> dict[str, Any]:
        """The run's result.json as a dict."""
        return dict(self.read_json(self.result_json))

    def read_table(self, name: str) -> pd.DataFrame:
        """Read ``tables/NAME.parquet``."""
        path = self.table(name)
        if not (path.exists() or path.is_symlink()):
            raise InputError(f"{path} not found: the run in {self.path} has no table {name!r}")
        return read_parquet_file(path, MAX_TABLE_BYTES, "a table written by uvmlab")

    def summary_line(self) -> str:
        """'Wrote DIR (result.json, N tables, M figures)': the files of this run (in the manifest) that exist."""
        listed = self.written()
        if listed is None:
            listed = [p.relative_to(self.path).as_posix() for p in self.path.glob("*/*")]
        here = [n for n in listed if (self.path / n).is_file()]
        tables = [n for n in here if n.startswith("tables/") and n.endswith(".parquet")]
        figures = [n for n in here if n.startswith("figures/") and n.rsplit(".", 1)[-1] in FIGURE_FORMATS]
        return f"Wrote {self.path} (result.json, {len(tables)} tables, {len(figures)} figures)"
