"""Speed of `uvmlab validate`: the CI subset (--fast) and every check, each in a fresh subprocess.

Goals (issue 11 item 6): the CI subset under 2 minutes, the whole scorecard under 5 minutes on a fresh clone (no
trace cache: the run uses an empty UVMLAB_CACHE). Usage::

    python benchmarks/validate_speed.py [DATA_DIR]

Reported per run: wall time, CPU time of the subprocess (getrusage of waited-for children), points, and the
load average (the machine may be shared: prefer the CPU column); then the CPU seconds of each check of the whole
run (from its result summary; a planned check's CPU is the sum of its tasks' in the workers).
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


def _run(args: list[str], env: dict[str, str]) -> tuple[float, float, dict, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "uvmlab", "validate", *args, "--format", "json"], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    payload = json.loads(proc.stdout) if proc.stdout.strip() else {"points": [], "summary": {}}
    return wall, cpu, payload, proc.returncode


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
            wall, cpu, payload, rc = _run(base + extra, env)
            points = len(payload["points"])
            table.add_row(name, f"{wall:.1f}", f"{cpu:.1f}", f"{GOALS_S[name]:.0f}", str(points), str(rc))
    Console().print(table)
    checks = Table(title="all: per check")
    for col in ("check", "CPU s", "busy wall s"):
        checks.add_column(col, justify="left" if col == "check" else "right")
    for check, t in sorted(payload["summary"].get("check_seconds", {}).items(), key=lambda kv: -kv[1]["cpu"]):
        checks.add_row(check, f"{t['cpu']:.1f}", f"{t['wall']:.1f}")
    Console().print(checks)
    Console().print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
