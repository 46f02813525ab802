"""Speed of `uvmlab advise` (issue 28 goal: every built-in workload advised in <= 30 s CPU warm, <= 90 s cold).

Usage: python benchmarks/advise_speed.py [--workload NAME ...] [--oversub 4] [--iterations 3] [--cold]
For each workload: with --cold, a first call into an empty trace cache (a fresh temporary UVMLAB_CACHE: every trace
the advisor needs is captured); then a warm call (traces cached). Prints a table of wall and CPU seconds (this
process; captures run in it) and the number of rows. Run it on an idle machine: CPU seconds are the figure.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from uvmlab.advise.advisor import advise
from uvmlab.config import RunConfig, WorkloadConfig

BUILT_IN = ("alexnet", "resnet50", "resnet101", "gpt2", "bert", "whisper-small")


def _timed(cfg: RunConfig) -> tuple[float, float, int]:
    w0, c0 = time.perf_counter(), time.process_time()
    adv = advise(cfg)
    return time.perf_counter() - w0, time.process_time() - c0, len(adv.rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append", help=f"repeatable [all built-in: {', '.join(BUILT_IN)}]")
    ap.add_argument("--oversub", type=float, default=4.0)
    ap.add_argument("--iterations", type=int, default=3, help="iterations of the advised job [3, advise's default]")
    ap.add_argument("--cold", action="store_true", help="also time a first call into an empty trace cache")
    args = ap.parse_args()
    rows = []
    for wl in args.workload or BUILT_IN:
        cfg = RunConfig(workload=WorkloadConfig(wl, iterations=args.iterations), oversub=args.oversub, mode="sim")
        if args.cold:
            with tempfile.TemporaryDirectory() as cache:
                old = os.environ.get("UVMLAB_CACHE")
                os.environ["UVMLAB_CACHE"] = cache
                try:
                    rows.append((wl, "cold", *_timed(cfg)))
                    rows.append((wl, "warm", *_timed(cfg)))
                finally:
                    if old is None:
                        os.environ.pop("UVMLAB_CACHE", None)
                    else:
                        os.environ["UVMLAB_CACHE"] = old
        else:
            _timed(cfg)  # fills the cache (the user's) if needed
            rows.append((wl, "warm", *_timed(cfg)))
        print(f"{wl}: done", flush=True)
    print(f"| {'workload':<14} | run  | wall s | CPU s | rows |")
    print(f"|{'-' * 16}|------|--------|-------|------|")
    for wl, label, wall, cpu, n in rows:
        print(f"| {wl:<14} | {label} | {wall:6.1f} | {cpu:5.1f} | {n:4d} |")


if __name__ == "__main__":
    main()
