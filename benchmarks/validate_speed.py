"""Speed of `uvmlab validate`: every check on an empty trace cache (cold), again on the cache it filled (warm), and
the CI subset (--fast) cold, each in a fresh subprocess.

Goals (issue 11 item 6, issue 41 section 5): the CI subset under 2 minutes, the whole scorecard under 5 minutes on a
fresh clone (no trace cache: the run uses an empty UVMLAB_CACHE). Usage::

    python benchmarks/validate_speed.py [DATA_DIR] [--runs cold,warm,fast] [--out DIR]

``--out DIR`` keeps the cold run's run directory (``DIR/cold``, ``uvmlab validate -o``: the scorecard table to compare
two versions' points with). Reported per run: wall time, CPU time of the subprocess (getrusage of waited-for
children), points, and the load average before and after (the machine may be shared: prefer the CPU column); then
the CPU seconds of each check of the cold run (from its result summary; a planned check's CPU is the sum of its
tasks' in the workers).
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
from pathlib import Path

from rich.console import Console
from rich.table import Table

GOALS_S = {"cold": 300.0, "warm": 300.0, "fast": 120.0}
RUNS = ("cold", "warm", "fast")


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
    ap.add_argument("--runs", default=",".join(RUNS), help="which runs, in this order (cold, warm, fast)")
    ap.add_argument("--out", default=None, help="keep the cold run's run directory as OUT/cold")
    args = ap.parse_args()
    runs = [r for r in args.runs.split(",") if r]
    if set(runs) - set(RUNS):
        ap.error(f"--runs takes {', '.join(RUNS)}")
    table = Table(title="uvmlab validate")
    for col in ("run", "wall s", "CPU s", "goal s", "points", "exit", "load before", "load after"):
        table.add_column(col, justify="left" if col == "run" else "right")
    base = [args.data_dir] if args.data_dir else []
    cold_payload: dict = {"summary": {}}
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as fast_cache:
        for name in runs:  # warm reuses the cache the cold run filled (an empty one if cold did not run first)
            env = {**os.environ, "UVMLAB_CACHE": fast_cache if name == "fast" else cache}
            extra = ["--fast"] if name == "fast" else []
            if name == "cold" and args.out:
                extra += ["-o", str(Path(args.out) / "cold"), "--force"]
            load = os.getloadavg()[0]
            wall, cpu, payload, rc = _run(base + extra, env)
            cold_payload = payload if name == "cold" else cold_payload
            table.add_row(name, f"{wall:.1f}", f"{cpu:.1f}", f"{GOALS_S[name]:.0f}", str(len(payload["points"])),
                          str(rc), f"{load:.2f}", f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    Console().print(table)
    if "cold" not in runs:
        return 0
    checks = Table(title="cold: per check")
    for col in ("check", "CPU s", "busy wall s"):
        checks.add_column(col, justify="left" if col == "check" else "right")
    for check, t in sorted(cold_payload["summary"].get("check_seconds", {}).items(), key=lambda kv: -kv[1]["cpu"]):
        checks.add_row(check, f"{t['cpu']:.1f}", f"{t['wall']:.1f}")
    Console().print(checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
