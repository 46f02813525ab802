"""Run a workload program file through ``uvmlab run``, the path users take, for the benchmark tables
(``host_init_table.py``, ``cpu_refault_table.py``, ``first_eviction_table.py``); imported by those scripts, which
run from this folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


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
