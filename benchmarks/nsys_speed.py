"""Speed and memory of `uvmlab nsys summarize` on a large synthetic export in the real schema.

Goal (issue 5): 10 million GPU fault rows and 1 million UM migrations summarized in under 30 s with peak RSS under
2 GB. Usage::

    python benchmarks/nsys_speed.py [--faults 10000000] [--migrations 1000000] [--keep DIR]

The export is generated once (uvmlab.nsys.synthetic), then summarized in a fresh subprocess (`python -m uvmlab
nsys summarize --format json`) whose wall time and peak RSS (getrusage of the child) are reported.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from uvmlab.nsys.synthetic import write_synthetic_export

GOAL_S = 30.0
GOAL_RSS_BYTES = 2 * 10**9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=10_000_000)
    ap.add_argument("--migrations", type=int, default=1_000_000)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--kernels-per-iteration", type=int, default=500)
    ap.add_argument("--keep", type=Path, default=None, help="Folder to keep the export in (default: a temp folder).")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="uvmlab-nsys-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / f"synthetic_{args.faults}_{args.migrations}.sqlite"
    t0 = time.perf_counter()
    if not db.exists():
        write_synthetic_export(
            db,
            faults=args.faults,
            migrations=args.migrations,
            iterations=args.iterations,
            kernels_per_iteration=args.kernels_per_iteration,
        )
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "uvmlab", "nsys", "summarize", str(db), "--format", "json"],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"summarize failed: {proc.stderr}")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = ru.ru_maxrss * 1024  # KiB on Linux
    cpu = ru.ru_utime + ru.ru_stime
    load = os.getloadavg()[0]
    t = Table(title="uvmlab nsys summarize on a synthetic export")
    for c in ("figure", "value", "goal"):
        t.add_column(c)
    t.add_row("GPU fault rows", f"{args.faults:,}", "")
    t.add_row("UM migration rows", f"{args.migrations:,}", "")
    t.add_row("kernels", f"{args.iterations * args.kernels_per_iteration:,}", "")
    t.add_row("export size", f"{db.stat().st_size / 1e9:.2f} GB", "")
    t.add_row("generation time (not counted)", f"{gen_s:.1f} s", "")
    t.add_row("summarize wall time", f"{wall:.1f} s", f"< {GOAL_S:.0f} s {'OK' if wall < GOAL_S else 'MISSED'}")
    t.add_row(
        "summarize CPU time (user + sys)", f"{cpu:.1f} s", f"(1-min load average {load:.1f} on {os.cpu_count()} CPUs)"
    )
    t.add_row(
        "summarize peak RSS",
        f"{rss / 1e9:.2f} GB",
        f"< {GOAL_RSS_BYTES / 1e9:.0f} GB {'OK' if rss < GOAL_RSS_BYTES else 'MISSED'}",
    )
    Console().print(t)
    if args.keep is None:
        db.unlink()


if __name__ == "__main__":
    main()
