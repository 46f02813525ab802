"""Speed of `uvmlab validate`: the CI subset (--fast) and every check, each in a fresh subprocess.

Goals (issue 11 item 6): the CI subset under 2 minutes, the whole scorecard under 5 minutes on a fresh clone (no
trace cache: the run uses an empty UVMLAB_CACHE). Usage::

    python benchmarks/validate_speed.py [DATA_DIR]

Reported per run: wall time, CPU time of the subprocess (getrusage of waited-for children), points, and the
load average (the machine may be shared: prefer the CPU column).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

GOALS_S = {"--fast": 120.0, "all": 300.0}


def _run(args: list[str], env: dict[str, str]) -> tuple[float, float, int, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "uvmlab", "validate", *args, "--format", "json"], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    points = len(json.loads(proc.stdout)["points"]) if proc.stdout.strip() else 0
    return wall, cpu, points, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", nargs="?", default=None)
    args = ap.parse_args()
    table = Table(title="uvmlab validate")
    for col in ("run", "wall s", "CPU s", "goal s", "points", "exit"):
        table.add_column(col, justify="left" if col == "run" else "right")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "UVMLAB_CACHE": cache}
        base = [args.data_dir] if args.data_dir else []
        for name, extra in (("--fast", ["--fast"]), ("all", [])):
            wall, cpu, points, rc = _run(base + extra, env)
            table.add_row(name, f"{wall:.1f}", f"{cpu:.1f}", f"{GOALS_S[name]:.0f}", str(points), str(rc))
    Console().print(table)
    Console().print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
