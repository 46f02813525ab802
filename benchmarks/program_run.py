"""Run a workload program file through ``uvmlab run``, the path users take, for the benchmark tables
(``host_init_table.py``, ``cpu_refault_table.py``, ``first_eviction_table.py``); imported by those scripts, which
run from this folder."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def table_arguments(doc: str, gpu: str) -> argparse.ArgumentParser:
    """The options every program table takes: ``--gpu`` (default ``gpu``) and ``--mb`` (the array, MiB)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--gpu", default=gpu)
    ap.add_argument("--mb", type=int, default=1024)
    return ap


@contextmanager
def program_file(name: str, text: str) -> Iterator[Path]:
    """The program ``text`` written as ``name`` in a temporary folder (removed afterwards) that holds the runs too."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text)
        yield path


def uvmlab_run(program: Path, out: Path, *options: str) -> Path:
    """``uvmlab run PROGRAM OPTIONS -o OUT --force`` in a child process (a failure raises); returns OUT's tables."""
    argv = [
        sys.executable,
        "-m",
        "uvmlab",
        "run",
        str(program),
        *options,
        "-o",
        str(out),
        "--force",
        "--format",
        "json",
    ]
    subprocess.run(argv, check=True, capture_output=True)
    return out / "tables"
