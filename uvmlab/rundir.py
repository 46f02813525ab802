"""The run directory: one class names every file a run writes.

Layout (every write atomic; ``result.json`` is written last and marks the run complete)::

    RUN/config.json        the RunConfig (and anything else that defines the run)
    RUN/env.json           versions and settings of the machine (torch, CUDA, driver, GPU, PYTORCH_CUDA_ALLOC_CONF)
    RUN/result.json        scalars (keys documented in docs/result-json.md); its presence means "complete"
    RUN/tables/NAME.parquet  tables (schemas in uvmlab.stats.schema)
    RUN/figures/NAME.png   figures (or .svg / .pdf: ``RunDir(path, figure_format=...)``, ``--figure-format``)
    RUN/logs/              anything a run wants to keep that is not a result (stdout, shim logs, nsys files)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from uvmlab.atomic import atomic_write_json, atomic_write_with
from uvmlab.errors import InputError

FIGURE_FORMATS = ("png", "svg", "pdf")
"""Figure file formats (matplotlib backends on the Agg canvas; ``--figure-format``)."""


def check_figure_format(fmt: str) -> str:
    """``fmt`` if it is one of FIGURE_FORMATS, else an InputError."""
    if fmt not in FIGURE_FORMATS:
        raise InputError(f"figure format must be one of {', '.join(FIGURE_FORMATS)}, not {fmt!r}")
    return fmt


class RunDir:
    """Names and writes the files of one run directory."""

    def __init__(self, path: str | os.PathLike[str], figure_format: str = "png") -> None:
        self.path = Path(path)
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

    # -- state -------------------------------------------------------------------------------
    def is_complete(self) -> bool:
        """A run is complete when its ``result.json`` exists (it is written last, atomically)."""
        return self.result_json.is_file()

    def prepare(self, force: bool = False) -> None:
        """Create the folder; refuse to overwrite a complete run unless ``force``."""
        if self.is_complete():
            if not force:
                raise InputError(f"will not overwrite the complete run in {self.path} without --force")
            shutil.rmtree(self.path)
        elif self.result_json.exists():
            raise InputError(f"{self.result_json} exists but is not a file")
        self.path.mkdir(parents=True, exist_ok=True)

    # -- writes ------------------------------------------------------------------------------
    def write_json(self, which: Path, obj: Any) -> None:
        """Write one of the JSON files atomically."""
        atomic_write_json(which, obj)

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        """Write ``df`` as ``tables/NAME.parquet`` atomically."""
        path = self.table(name)
        atomic_write_with(path, lambda tmp: df.to_parquet(tmp, index=False))
        return path

    def write_figure(self, name: str, fig: Any, dpi: int = 120) -> Path:
        """Save a matplotlib figure as ``figures/NAME.<figure_format>`` atomically."""
        path = self.figure(name)
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
