"""Speed and memory of `uvmlab nsys summarize` on a large synthetic export in the real schema.

Goal (issue 5): 10 million GPU fault rows and 1 million UM migrations summarized in under 30 s with peak RSS under
2 GB. Usage::

    python benchmarks/nsys_speed.py [--faults 10000000] [--migrations 1000000] [--workers N] [--keep DIR]

The export is generated once (uvmlab.measure.nsys.synthetic), then summarized in a fresh subprocess (`python -m uvmlab
nsys summarize --format json`, which may start worker processes for the fault table; ``--workers`` sets
UVMLAB_NSYS_WORKERS). Reported: wall time, CPU time (getrusage of all waited-for descendants), peak summed RSS of
the process tree (sampled from /proc every 0.1 s), peak RSS of the largest single process, and the load average.
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

from uvmlab.measure.nsys.synthetic import write_synthetic_export

GOAL_S = 30.0
GOAL_RSS_BYTES = 2 * 10**9


def tree_rss_bytes(root: int) -> int:
    """Sum of VmRSS over ``root`` and its descendants (Linux /proc)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                parent[int(d)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in tree and p not in tree}
        tree |= new
        grew = bool(new)
    total = 0
    for p in tree:
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=10_000_000)
    ap.add_argument("--migrations", type=int, default=1_000_000)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--kernels-per-iteration", type=int, default=500)
    ap.add_argument("--workers", type=int, default=None, help="UVMLAB_NSYS_WORKERS for the run (default: automatic).")
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
    env = dict(os.environ)
    if args.workers is not None:
        env["UVMLAB_NSYS_WORKERS"] = str(args.workers)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        cmd = [sys.executable, "-m", "uvmlab", "nsys", "summarize", str(db), "--format", "json"]
        child = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        tree_peak = 0
        while child.poll() is None:
            tree_peak = max(tree_peak, tree_rss_bytes(child.pid))
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        if child.returncode != 0:
            err.seek(0)
            sys.exit(f"summarize failed: {err.read().decode()}")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = ru.ru_maxrss * 1024  # KiB on Linux
    cpu = ru.ru_utime + ru.ru_stime
    t = Table(title="uvmlab nsys summarize on a synthetic export")
    for c in ("figure", "value", "goal"):
        t.add_column(c)
    t.add_row("GPU fault rows", f"{args.faults:,}", "")
    t.add_row("UM migration rows", f"{args.migrations:,}", "")
    t.add_row("kernels", f"{args.iterations * args.kernels_per_iteration:,}", "")
    t.add_row("export size", f"{db.stat().st_size / 1e9:.2f} GB", "")
    t.add_row("generation time (not counted)", f"{gen_s:.1f} s", "")
    t.add_row("workers (UVMLAB_NSYS_WORKERS)", str(args.workers if args.workers is not None else "auto"), "")
    t.add_row("summarize wall time", f"{wall:.1f} s", f"< {GOAL_S:.0f} s {'OK' if wall < GOAL_S else 'MISSED'}")
    t.add_row("summarize CPU time (user + sys)", f"{cpu:.1f} s", "")
    t.add_row(
        "1-min load average (before / after)",
        f"{load_before:.1f} / {os.getloadavg()[0]:.1f}",
        f"on {os.cpu_count()} CPUs",
    )
    t.add_row(
        "peak RSS, process tree (sum)",
        f"{tree_peak / 1e9:.2f} GB",
        f"< {GOAL_RSS_BYTES / 1e9:.0f} GB {'OK' if tree_peak < GOAL_RSS_BYTES else 'MISSED'}",
    )
    t.add_row("peak RSS, largest single process", f"{rss / 1e9:.2f} GB", "")
    Console().print(t)
    if args.keep is None:
        db.unlink()


if __name__ == "__main__":
    main()
